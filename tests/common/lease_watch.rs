//! reaplet under the service-account identity (`deploy/rbac.yaml`) on the real API server, and
//! its watch on the node Lease as the audit log shows it. Included by path
//! (`#[path = "common/lease_watch.rs"]`) by the tests that need it: `standby_cost.rs`,
//! `helm.rs`.
//!
//! The test bed's audit policy logs a watch twice, with one `auditID`: at `ResponseStarted`
//! when it begins and at `ResponseComplete` when it ends; a watch is *held* from its start
//! until its end record (or until now when there is none). reaplet's Lease watch is a watch on
//! `leases` in `kube-node-lease` with `fieldSelector=metadata.name=<node>`; the server ends it
//! after its timeout (290 s) and reaplet opens the next one at once, so a window is *covered*
//! when the union of those watches leaves no gap longer than [`REWATCH_GAP`] in it.
//!
//! Also here, to keep `helm.rs` one file: the chart's service-account standby watched over a
//! window beside the live kubelet ([`sa_standby_holds_its_lease_watch_and_takes_nothing_over`]).

#![allow(dead_code)]

use crate::common::k8s::Cluster;
use crate::common::kube_node::{KubeNode, NODE, uid};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The service account's user name.
pub const SA_USER: &str = "system:serviceaccount:kube-system:reaplet";

/// The longest gap between one Lease watch's end and the next one's start that still counts
/// as one continuous watch: reaplet re-watches at once after the server's timeout.
pub const REWATCH_GAP: Duration = Duration::from_secs(2);

/// How long a ready reaplet may take to open its Lease watch on a loaded 2-core machine.
pub const STARTED: Duration = Duration::from_secs(30);

/// `deploy/rbac.yaml`'s objects, created as an admin.
pub async fn apply_rbac(cluster: &Cluster) {
    let text = std::fs::read_to_string(crate::common::repo().join("deploy/rbac.yaml")).unwrap();
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).expect("deploy/rbac.yaml parses");
    for v in docs.into_iter().filter(|v| !v.is_null()) {
        let ns = v["metadata"]["namespace"].as_str();
        let path = match (v["kind"].as_str().unwrap(), ns) {
            ("ServiceAccount", Some(ns)) => format!("/api/v1/namespaces/{ns}/serviceaccounts"),
            ("ClusterRole", None) => "/apis/rbac.authorization.k8s.io/v1/clusterroles".into(),
            ("ClusterRoleBinding", None) => {
                "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings".into()
            }
            ("Role", Some(ns)) => {
                format!("/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles")
            }
            ("RoleBinding", Some(ns)) => {
                format!("/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings")
            }
            (k, _) => panic!("deploy/rbac.yaml: unexpected {k}"),
        };
        cluster.must("POST", &path, Some(&v)).await;
    }
}

/// A kubeconfig (`file` in the cluster's directory) with a token of the `reaplet` service
/// account as `kubectl create token reaplet -n kube-system` makes it (no node in it: the test
/// names the node with `--hostname-override`).
pub async fn sa_kubeconfig(cluster: &Cluster, file: &str) -> PathBuf {
    let req = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"expirationSeconds": 3600}});
    let token = cluster
        .must(
            "POST",
            "/api/v1/namespaces/kube-system/serviceaccounts/reaplet/token",
            Some(&req),
        )
        .await["status"]["token"]
        .as_str()
        .expect("a token")
        .to_owned();
    let path = cluster.dir.path().join(file);
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {}\n    certificate-authority: {}\nusers:\n- name: reaplet\n  user:\n    token: {token}\ncontexts:\n- name: test\n  context: {{cluster: test, user: reaplet}}\ncurrent-context: test\n",
            cluster.url(),
            cluster.pki.ca.display()
        ),
    )
    .unwrap();
    path
}

/// One watch of reaplet's on its node Lease.
#[derive(Clone, Debug)]
pub struct LeaseWatch {
    pub uri: String,
    /// received, ended (the `ResponseComplete` record's `stageTimestamp`), ns since the epoch
    pub started: i64,
    pub ended: Option<i64>,
    pub code: u16,
}

fn ts_ns(v: &Value) -> i64 {
    v.as_str()
        .and_then(|s| s.parse::<jiff::Timestamp>().ok())
        .map_or(0, |t| t.as_nanosecond() as i64)
}

/// Is `uri` a watch of node `node`'s Lease alone (`fieldSelector=metadata.name=<node>`, the
/// `=` escaped or not)?
pub fn is_lease_watch_of(uri: &str, node: &str) -> bool {
    let want = [
        format!("fieldSelector=metadata.name%3D{node}"),
        format!("fieldSelector=metadata.name={node}"),
    ];
    uri.starts_with("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases?")
        && uri.contains("watch=true")
        && uri
            .split_once('?')
            .is_some_and(|(_, q)| q.split('&').any(|kv| want.iter().any(|w| kv == w)))
}

/// reaplet's watches on node `node`'s Lease as `user`, from the audit log, in start order.
pub fn lease_watches(audit_log: &Path, user: &str, node: &str) -> Vec<LeaseWatch> {
    let text = std::fs::read_to_string(audit_log).unwrap_or_default();
    let mut by_id: HashMap<String, LeaseWatch> = HashMap::new();
    let mut order = Vec::new();
    for v in text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
    {
        let uri = v["requestURI"].as_str().unwrap_or("");
        if v["verb"] != "watch"
            || v["user"]["username"] != user
            || !v["userAgent"]
                .as_str()
                .unwrap_or("")
                .starts_with("reaplet/")
            || !is_lease_watch_of(uri, node)
        {
            continue;
        }
        let id = v["auditID"].as_str().unwrap_or("").to_owned();
        let w = by_id.entry(id.clone()).or_insert_with(|| {
            order.push(id);
            LeaseWatch {
                uri: uri.to_owned(),
                started: ts_ns(&v["requestReceivedTimestamp"]),
                ended: None,
                code: 0,
            }
        });
        if v["stage"] == "ResponseComplete" {
            w.ended = Some(ts_ns(&v["stageTimestamp"]));
            w.code = v["responseStatus"]["code"].as_u64().unwrap_or(0) as u16;
        }
    }
    order
        .into_iter()
        .filter_map(|id| by_id.remove(&id))
        .collect()
}

/// The gaps longer than [`REWATCH_GAP`] in `[from, to]` (ns) that no watch of `ws` covers, as
/// (start, length) with the start relative to `from`: empty when the Lease was watched
/// throughout.
pub fn uncovered(ws: &[LeaseWatch], from: i64, to: i64) -> Vec<(Duration, Duration)> {
    let gap = REWATCH_GAP.as_nanos() as i64;
    let mut spans: Vec<(i64, i64)> = ws
        .iter()
        .map(|w| (w.started, w.ended.unwrap_or(i64::MAX)))
        .collect();
    spans.sort();
    let mut gaps = Vec::new();
    let mut covered_to = from;
    for (s, e) in spans {
        if s > covered_to + gap && s < to {
            gaps.push((covered_to, s));
        }
        covered_to = covered_to.max(e);
    }
    if covered_to < to - gap {
        gaps.push((covered_to, to));
    }
    let d = |ns: i64| Duration::from_nanos(ns.max(0) as u64);
    gaps.into_iter()
        .map(|(a, b)| (d(a - from), d(b - a)))
        .collect()
}

/// `ws` as lines for a failure message.
pub fn describe(ws: &[LeaseWatch], from: i64) -> String {
    ws.iter()
        .map(|w| {
            format!(
                "  from {:+.1} s to {} ({}) {}",
                (w.started - from) as f64 / 1e9,
                w.ended.map_or("open".into(), |e| format!(
                    "{:+.1} s",
                    (e - from) as f64 / 1e9
                )),
                w.code,
                w.uri
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// How long the service-account reaplet is watched beside the live kubelet: three times the
/// test's `--takeover-after` (20 s). A takeover needs the Lease unrenewed for that long with the
/// kubelet's health endpoint failing; the kubelet renews every 10 s, so the window also holds
/// several renewals and several times the watch's freshness (a quarter plus an eighth of the
/// threshold) running out between two of them.
pub const SA_WINDOW: Duration = Duration::from_secs(60);

/// `tests/helm.rs`, issue 44: the chart's service-account identity (the DaemonSet's pod runs as its
/// ServiceAccount, `kube-system/reaplet`) beside the live kubelet. Over [`SA_WINDOW`]: the
/// node Lease is followed by a watch on that one object (`fieldSelector=metadata.name=<node>`
/// in the audit log) held throughout; no takeover (no `ReapletTookOver` event, no "took over"
/// line in the pod's log, `/pods` says passive at the end); no write of reaplet's at all.
pub async fn sa_standby_holds_its_lease_watch_and_takes_nothing_over(
    n: &KubeNode,
    port: u16,
    pod: &Value,
) {
    let user = SA_USER;
    // the watch begins once the Lease is listed (the pod is ready: it has)
    let t0 = Instant::now();
    while lease_watches(&n.cluster.audit_log, user, NODE).is_empty() {
        assert!(
            t0.elapsed() < STARTED,
            "no Lease watch of reaplet's as {user} within {STARTED:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let from = reaplet::wall_ns();
    tokio::time::sleep(SA_WINDOW).await;
    let to = reaplet::wall_ns();
    let ws = lease_watches(&n.cluster.audit_log, user, NODE);
    println!(
        "reaplet's Lease watches as {user} (from the window's start):\n{}",
        describe(&ws, from)
    );
    let gaps = uncovered(&ws, from, to);
    assert!(
        gaps.is_empty(),
        "the Lease was not watched throughout {SA_WINDOW:?}; gaps (start, length): {gaps:?}"
    );
    // no takeover: the event, the log, the role
    let (_, events) = n
        .cluster
        .raw(
            "GET",
            "/api/v1/events?fieldSelector=reason%3DReapletTookOver",
            None,
            None,
        )
        .await;
    let took: Vec<String> = events["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| format!("{} {}", e["involvedObject"]["name"], e["message"]))
        .collect();
    assert!(took.is_empty(), "ReapletTookOver events: {took:?}");
    let log = pod_log(n, pod);
    assert!(!log.is_empty(), "the reaplet pod's log is empty or missing");
    assert!(
        !log.contains("took over"),
        "reaplet took over beside the live kubelet:\n{log}"
    );
    let (code, body) = reaplet::server::fetch(([127, 0, 0, 1], port).into(), "/pods")
        .await
        .unwrap_or_default();
    let v: Value = serde_json::from_str(&body).unwrap_or_default();
    assert_eq!(
        (code, v["authority"]["role"].as_str()),
        (200, Some("passive")),
        "reaplet's /pods: {body}"
    );
    // nothing written (the whole life of the pod, and in the window)
    let writes = sa_writes(n, user);
    assert!(writes.is_empty(), "reaplet wrote as {user}: {writes:#?}");
    println!(
        "service-account standby beside the live kubelet for {SA_WINDOW:?}: the Lease watched \
         throughout ({} watches), no takeover, no write; role {}",
        ws.len(),
        v["authority"]["why"]
    );
}

/// reaplet's writes as `user` (by its User-Agent), as lines.
pub fn sa_writes(n: &KubeNode, user: &str) -> Vec<String> {
    n.cluster
        .writes_by(user)
        .into_iter()
        .filter(|a| a.user_agent.starts_with("reaplet/"))
        .map(|a| a.line())
        .collect()
}

/// The log of `pod`'s containers as the kubelet keeps it (`podLogsDir/<ns>_<name>_<uid>/`).
fn pod_log(n: &KubeNode, pod: &Value) -> String {
    let dir = n.kubelet.dir.join("pod-logs").join(format!(
        "kube-system_{}_{}",
        pod["metadata"]["name"].as_str().unwrap_or(""),
        uid(pod)
    ));
    let mut text = String::new();
    for c in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
        for f in std::fs::read_dir(c.path()).into_iter().flatten().flatten() {
            text.push_str(&std::fs::read_to_string(f.path()).unwrap_or_default());
        }
    }
    text
}
