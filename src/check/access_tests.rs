//! Unit tests of the per-mode permission list and the shape of each review.
use super::*;
use crate::config::{RawSettings, resolve};

fn settings(f: impl FnOnce(&mut RawSettings)) -> Settings {
    let mut raw = RawSettings::default();
    f(&mut raw);
    resolve(raw).expect("valid settings")
}

fn names(s: &Settings) -> Vec<String> {
    needed(s).iter().map(Need::name).collect()
}

const PODS_ONLY: &[&str] = &[
    "list pods",
    "watch pods",
    "get pods",
    "delete pods",
    "patch pods/status",
    "create events",
];

fn with(extra: &[&str]) -> Vec<String> {
    PODS_ONLY
        .iter()
        .chain(extra)
        .map(|s| s.to_string())
        .collect()
}

const LEASE: &[&str] = &[
    "get nodes",
    "get leases.coordination.k8s.io",
    "list leases.coordination.k8s.io",
    "watch leases.coordination.k8s.io",
];

#[test]
fn primary_needs_the_pods_verbs_alone() {
    let s = settings(|r| r.authority = Some("primary".into()));
    assert_eq!(names(&s), with(&[]));
}

#[test]
fn standby_and_auto_add_the_lease_read_and_its_optional_watch() {
    for mode in ["standby", "auto"] {
        let s = settings(|r| r.authority = Some(mode.into()));
        assert_eq!(names(&s), with(LEASE), "{mode}");
        let lease: Vec<Need> = needed(&s)
            .into_iter()
            .filter(|n| n.resource == "leases")
            .collect();
        // the Node's read before acting, required
        let node = needed(&s).into_iter().find(|n| n.name() == "get nodes");
        assert!(node.is_some_and(|n| n.fallback.is_none() && n.used_by == "standby"));
        // the read is required; the watch has a fallback (a node identity may not watch)
        assert_eq!(lease[0].fallback, None);
        assert!(lease[1..].iter().all(|n| n.fallback.is_some()));
        assert!(lease.iter().all(|n| n.used_by == "standby"));
    }
    // auto is the default
    assert_eq!(names(&settings(|_| {})), with(LEASE));
}

#[test]
fn the_taint_manager_adds_the_node_watch_and_follows_the_runs_default() {
    let node_watch = ["list nodes", "watch nodes"];
    let s = settings(|r| {
        r.authority = Some("primary".into());
        r.enable_taint_manager = Some("true".into());
    });
    assert!(s.taint_manager());
    assert_eq!(names(&s), with(&node_watch));
    // off by default on a cluster node, on for a standalone one (primary, static pods)
    let cluster = settings(|r| r.authority = Some("primary".into()));
    assert!(!cluster.taint_manager());
    let dir = tempfile::tempdir().unwrap();
    let standalone = settings(|r| {
        r.authority = Some("primary".into());
        r.pod_manifest_path = Some(dir.path().display().to_string());
    });
    assert!(standalone.taint_manager());
    assert_eq!(names(&standalone), with(&node_watch));
    // not in standby, whatever the manifests
    let standby = settings(|r| {
        r.authority = Some("standby".into());
        r.pod_manifest_path = Some(dir.path().display().to_string());
    });
    assert!(!standby.taint_manager());
    assert!(
        !names(&standby)
            .iter()
            .any(|n| n.ends_with(" nodes") && n != "get nodes")
    );
}

#[test]
fn node_affinity_adds_the_eviction_unless_it_only_reports() {
    let s = settings(|r| {
        r.authority = Some("primary".into());
        r.enforce_node_affinity = Some("true".into());
    });
    assert_eq!(
        names(&s),
        with(&["list nodes", "watch nodes", "create pods/eviction"])
    );
    let dry = settings(|r| {
        r.authority = Some("primary".into());
        r.enforce_node_affinity = Some("true".into());
        r.eviction_dry_run = Some("true".into());
    });
    assert_eq!(names(&dry), with(&["list nodes", "watch nodes"]));
}

#[test]
fn graceful_shutdown_adds_the_nodes_ready_condition() {
    let s = settings(|r| {
        r.authority = Some("primary".into());
        r.shutdown_grace_period = Some("30s".into());
        r.shutdown_grace_period_critical_pods = Some("10s".into());
    });
    assert_eq!(names(&s), with(&["get nodes", "patch nodes/status"]));
    let by_priority = settings(|r| {
        r.authority = Some("primary".into());
        r.shutdown_grace_period_by_pod_priority =
            Some(r#"[{"priority": 0, "shutdownGracePeriodSeconds": 20}]"#.into());
    });
    assert_eq!(
        names(&by_priority),
        with(&["get nodes", "patch nodes/status"])
    );
}

#[test]
fn everything_on_lists_each_verb_once() {
    let s = settings(|r| {
        r.authority = Some("auto".into());
        r.enable_taint_manager = Some("true".into());
        r.enforce_node_affinity = Some("true".into());
        r.shutdown_grace_period = Some("30s".into());
    });
    let n = names(&s);
    let mut unique = n.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), n.len(), "{n:?}");
    assert_eq!(n.len(), 6 + 3 + 2 + 1 + 2, "{n:?}");
}

#[test]
fn each_review_is_asked_as_the_request_is_sent() {
    let sample = ("web".to_string(), "pod-1".to_string());
    let s = settings(|r| {
        r.enforce_node_affinity = Some("true".into());
        r.shutdown_grace_period = Some("30s".into());
    });
    let field = |a: &ResourceAttributes| {
        a.field_selector
            .as_ref()
            .and_then(|f| f.raw_selector.clone())
    };
    for n in needed(&s) {
        let a = review(&n, "node-a", Some(&sample)).unwrap();
        assert_eq!(a.verb.as_deref(), Some(n.verb));
        let what = (
            n.resource,
            n.verb,
            a.namespace.as_deref(),
            a.name.as_deref(),
            field(&a),
        );
        match (n.resource, n.subresource, n.verb) {
            ("pods", "", "list" | "watch") => assert_eq!(
                (what.2, what.3, what.4.as_deref()),
                (None, None, Some("spec.nodeName=node-a"))
            ),
            ("pods", "", "get") => {
                assert_eq!((what.2, what.3), (Some("web"), Some("pod-1")))
            }
            ("leases", "", "get") => {
                assert_eq!(a.group.as_deref(), Some("coordination.k8s.io"));
                assert_eq!((what.2, what.3), (Some("kube-node-lease"), Some("node-a")));
            }
            ("leases", "", _) => assert_eq!(
                (what.2, what.3, what.4.as_deref()),
                (
                    Some("kube-node-lease"),
                    Some("node-a"),
                    Some("metadata.name=node-a")
                )
            ),
            ("nodes", "", "list" | "watch") => assert_eq!(
                (what.2, what.3, what.4.as_deref()),
                (None, Some("node-a"), Some("metadata.name=node-a"))
            ),
            ("nodes", _, "get" | "patch") => {
                assert_eq!((what.2, what.3), (None, Some("node-a")))
            }
            _ => assert_eq!((what.2, what.3, what.4), (None, None, None), "{n:?}"),
        }
        assert_eq!(a.subresource.is_some(), !n.subresource.is_empty());
    }
    // a pod GET with no pod on the node to name is not asked
    let get = needed(&s)
        .into_iter()
        .find(|n| n.name() == "get pods")
        .unwrap();
    assert!(review(&get, "node-a", None).is_none());
}
