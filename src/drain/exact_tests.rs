//! Where drain and make-room must decide exactly as the ReplicaSet controller and the
//! scheduler do (issue 29): quantities, time, what the fit checks, what a budget selects.

use super::plan::{self, DrainPod, Options};
use super::pods;
use super::preempt::{self, Budget, Plan, Req};
use super::quantity::Resources;
use super::rank::{RankedPod, sort};
use super::requests::{allocatable, candidate, pod_requests};
use k8s_openapi::api::core::v1::{Node, Pod};
use proptest::prelude::*;
use serde_json::{Value, json};

fn pod(v: serde_json::Value) -> Pod {
    serde_json::from_value(v).unwrap()
}

fn node(cpu: &str, memory: &str) -> Node {
    serde_json::from_value(json!({"metadata": {"name": "n"},
        "status": {"allocatable": {"cpu": cpu, "memory": memory, "pods": "110"}}}))
    .unwrap()
}

/// A running pod on node n requesting `requests`, of `priority`, started at `start`.
fn running(name: &str, priority: i32, requests: serde_json::Value, start: &str) -> Pod {
    pod(json!({
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
        "spec": {"nodeName": "n", "priority": priority,
            "containers": [{"name": "c", "image": "i", "resources": {"requests": requests}}]},
        "status": {"phase": "Running", "startTime": start}
    }))
}

fn now() -> jiff::Timestamp {
    "2026-01-01T01:00:00Z".parse().unwrap()
}

/// The pending pod's requests, as the scheduler reads them.
fn request(p: &Pod) -> Resources {
    Resources::from_list(&pod_requests(p, false).unwrap())
}

fn victims(plan: &Plan) -> Vec<String> {
    match plan {
        Plan::Victims(v) => v.iter().map(|v| v.pod.name.clone()).collect(),
        other => panic!("{other:?}"),
    }
}

/// 350m is 350 millicores, not 351: the reprieved pods fill the node exactly and the
/// scheduler takes no further victim.
#[test]
fn an_exact_fit_takes_no_extra_victim() {
    let pods = [
        running("keep", 10, json!({"cpu": "350m"}), "2026-01-01T00:00:00Z"),
        running("low", 5, json!({"cpu": "350m"}), "2026-01-01T00:00:01Z"),
        running("high", 100, json!({"cpu": "300m"}), "2026-01-01T00:00:02Z"),
    ];
    let cands: Vec<_> = pods.iter().map(|p| candidate(p, now())).collect();
    // 1000m node: high 300m stays, the request 350m; keep (350m) is reprieved and fills the
    // node to its last millicore; only "low" goes
    let req = request(&running(
        "new",
        50,
        json!({"cpu": "350m"}),
        "2026-01-01T00:00:03Z",
    ));
    let plan = preempt::select(&req, 50, &allocatable(&node("1", "1Gi")), &cands, &[]);
    assert_eq!(victims(&plan), vec!["low"]);
}

/// The ReplicaSet controller's "now" has full precision: 34.5 s after a ready time is past
/// the 2^35 ns bucket boundary (34.36 s), 33.5 s is not. Truncated to the second both are in
/// the lower bucket and the smaller UID would go first.
#[test]
fn the_time_since_ready_is_bucketed_at_full_precision() {
    let ready = |name: &str, uid: &str, at: &str| {
        pod(json!({
            "metadata": {"name": name, "namespace": "d", "uid": uid,
                "creationTimestamp": "2026-01-01T00:00:00Z",
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web",
                    "uid": "rs", "controller": true}]},
            "spec": {"nodeName": "n", "containers": [{"name": "c", "image": "i"}]},
            "status": {"phase": "Running", "conditions": [
                {"type": "Ready", "status": "True", "lastTransitionTime": at}]}
        }))
    };
    // "older" became ready 34.5 s before now (bucket 35), "newer" 33.5 s (bucket 34): the
    // more recently ready goes first whatever the UIDs
    let pods = [
        ready("older", "a-uid", "2026-01-01T00:10:00Z"),
        ready("newer", "b-uid", "2026-01-01T00:10:01Z"),
    ];
    let now: jiff::Timestamp = "2026-01-01T00:10:34.5Z".parse().unwrap();
    let p = plan::plan(pods::drain_pods_at(&pods, &[], now), Options::default());
    let order: Vec<&str> = p.waves.iter().flatten().map(|d| d.key.as_str()).collect();
    assert_eq!(order, vec!["d/newer", "d/older"]);
}

/// The scheduler checks a resource only when the pod requests it: a pod asking for CPU alone
/// fits on a node whose memory is over-committed (a static pod the kubelet admitted).
#[test]
fn only_what_is_requested_is_checked() {
    let pods = [running(
        "static",
        2000,
        json!({"cpu": "500m", "memory": "2Gi"}),
        "2026-01-01T00:00:00Z",
    )];
    let cands: Vec<_> = pods.iter().map(|p| candidate(p, now())).collect();
    let req = request(&running(
        "new",
        0,
        json!({"cpu": "1"}),
        "2026-01-01T00:00:03Z",
    ));
    let plan = preempt::select(&req, 0, &allocatable(&node("2", "1Gi")), &cands, &[]);
    assert_eq!(plan, Plan::FitsAlready);
}

/// A pod with no labels matches no budget in preemption, whatever the selector
/// (`filterPodsWithPDBViolation`), so it is not reported as violating one.
#[test]
fn a_pod_without_labels_matches_no_budget() {
    let pods = [running(
        "bare",
        5,
        json!({"cpu": "1"}),
        "2026-01-01T00:00:00Z",
    )];
    let cands: Vec<_> = pods.iter().map(|p| candidate(p, now())).collect();
    let budget = Budget {
        name: "no-app".into(),
        namespace: "default".into(),
        selector: Some(vec![Req::DoesNotExist("app".into())]),
        disruptions_allowed: 0,
        disrupted: vec![],
    };
    let req = request(&running(
        "new",
        50,
        json!({"cpu": "1"}),
        "2026-01-01T00:00:03Z",
    ));
    match preempt::select(&req, 50, &allocatable(&node("1", "1Gi")), &cands, &[budget]) {
        Plan::Victims(v) => assert_eq!(v[0].violates, Vec::<String>::new()),
        other => panic!("{other:?}"),
    }
}

/// `int64(math.Log2(float64(d)))` as Go 1.26 computes it (printed by a Go program on this
/// machine), including the last nanoseconds before 2^49 and 2^52 that it rounds up.
#[test]
fn log2_buckets_are_gos() {
    for (d, want) in [
        (-5, -1),
        (0, -1),
        (1, 0),
        (2, 1),
        (3, 1),
        (1023, 9),
        (1024, 10),
        (1025, 10),
        (1_073_741_823, 29),
        (1_073_741_824, 30),
        (34_359_738_367, 34),
        (34_359_738_368, 35),
        (34_359_738_369, 35),
        (68_719_476_735, 35),
        (68_719_476_736, 36),
        (281_474_976_710_655, 47),
        (562_949_953_421_311, 49),
        (562_949_953_421_310, 48),
        (1_125_899_906_842_623, 50),
        (1_125_899_906_842_616, 49),
        (4_503_599_627_370_495, 52),
        (4_503_599_627_370_494, 52),
        (4_503_599_627_370_480, 51),
        (9_007_199_254_740_991, 53),
        (4_611_686_018_427_387_903, 62),
        (i64::MAX, 63),
    ] {
        assert_eq!(super::rank::log_rank(d), want, "{d}");
    }
}

/// `GetDeletionCostFromPodAnnotations` with its error read as 0.
#[test]
fn deletion_costs_parse_as_the_controller_reads_them() {
    use super::pods::deletion_cost;
    for (v, want) in [
        ("0", 0),
        ("5", 5),
        ("-5", -5),
        ("2147483647", i32::MAX),
        ("-2147483648", i32::MIN),
        ("2147483648", 0),
        ("+10", 0),
        ("008", 0),
        ("", 0),
        ("1.5", 0),
        (" 1", 0),
    ] {
        assert_eq!(deletion_cost(v), want, "{v:?}");
    }
}

/// `PodRequests`: containers summed, a sidecar added to everything after it, an init
/// container's step with the sidecars before it, the larger of the two; pod-level requests
/// replace CPU and memory; overhead on top; a pod on the node counts the larger of its spec and
/// its status resources.
#[test]
fn pod_requests_are_component_helpers() {
    let p = pod(json!({
        "metadata": {"name": "p", "namespace": "d"},
        "spec": {
            "initContainers": [
                {"name": "side", "image": "i", "restartPolicy": "Always",
                    "resources": {"requests": {"cpu": "100m", "memory": "10Mi"}}},
                {"name": "setup", "image": "i",
                    "resources": {"requests": {"cpu": "2", "memory": "1Mi"}}},
            ],
            "containers": [
                {"name": "a", "image": "i", "resources": {"requests": {"cpu": "0.5m", "memory": "100Mi"}}},
                {"name": "b", "image": "i", "resources": {"requests": {"cpu": "0.5m", "example.com/dongle": "1"}}},
            ],
            "overhead": {"cpu": "10m"},
        }
    }));
    let r = Resources::from_list(&pod_requests(&p, false).unwrap());
    // cpu: containers 1m + sidecar 100m = 101m < setup step 2000m + 100m; + 10m overhead
    assert_eq!(r.milli_cpu, 2110);
    // memory: containers 100Mi + sidecar 10Mi > setup step 1Mi + 10Mi
    assert_eq!(r.memory, 110 * 1024 * 1024);
    assert_eq!(r.scalar.get("example.com/dongle"), Some(&1));
    // pod-level requests replace cpu and memory only
    let mut lvl = p.clone();
    lvl.spec.as_mut().unwrap().resources =
        Some(serde_json::from_value(json!({"requests": {"cpu": "3"}})).unwrap());
    let r = Resources::from_list(&pod_requests(&lvl, false).unwrap());
    assert_eq!((r.milli_cpu, r.memory), (3010, 110 * 1024 * 1024));
    // a pod on the node: a container's status counts only when it reports its resources
    // (allocatedResources alone is not read)
    let status = |v: Value| -> Option<k8s_openapi::api::core::v1::PodStatus> {
        Some(serde_json::from_value(v).unwrap())
    };
    let cs = |name: &str, extra: Value| {
        let mut v = json!({"name": name, "image": "i", "imageID": "", "ready": true,
            "restartCount": 0});
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        v
    };
    let on_node = |p: &Pod| Resources::from_list(&pod_requests(p, true).unwrap());
    let mut allocated_only = p.clone();
    allocated_only.status = status(json!({"containerStatuses": [
        cs("a", json!({"allocatedResources": {"cpu": "4"}}))]}));
    assert_eq!(on_node(&allocated_only).milli_cpu, 2110);
    // a resize up in progress: the actuated 4 cores count (4000m + 0.5m + sidecar 100m, more
    // than the setup step's 2100m; + 10m overhead, read once: 4110.5m → 4111m)
    let mut resized = p.clone();
    resized.status = status(json!({"containerStatuses": [
        cs("a", json!({"resources": {"requests": {"cpu": "4"}}}))]}));
    assert_eq!(on_node(&resized).milli_cpu, 4111);
    assert_eq!(
        Resources::from_list(&pod_requests(&resized, false).unwrap()).milli_cpu,
        2110
    );
    // two containers resized in opposite directions: the larger of each, summed
    let two = pod(json!({
        "metadata": {"name": "two", "namespace": "d"},
        "spec": {"containers": [
            {"name": "a", "image": "i", "resources": {"requests": {"cpu": "1"}}},
            {"name": "b", "image": "i", "resources": {"requests": {"cpu": "2"}}}]},
        "status": {"containerStatuses": [
            cs("a", json!({"resources": {"requests": {"cpu": "2"}}})),
            cs("b", json!({"resources": {"requests": {"cpu": "1"}}}))]}
    }));
    assert_eq!(on_node(&two).milli_cpu, 4000);
    // an infeasible resize: a reporting container counts its status only, the others their spec
    let mut infeasible = two.clone();
    let st = infeasible.status.as_mut().unwrap();
    st.container_statuses.as_mut().unwrap().truncate(1);
    st.conditions = Some(vec![
        serde_json::from_value(json!({"type": "PodResizePending", "status": "True",
            "reason": "Infeasible"}))
        .unwrap(),
    ]);
    assert_eq!(on_node(&infeasible).milli_cpu, 2000 + 2000);
    // pod-level resources of a pod on the node: the larger of spec and status
    let mut level = lvl.clone();
    level.status = status(json!({"resources": {"requests": {"cpu": "5"}}}));
    assert_eq!(on_node(&level).milli_cpu, 5010);
    // a bad quantity names its field
    let mut bad = p.clone();
    bad.spec.as_mut().unwrap().containers[0]
        .resources
        .as_mut()
        .unwrap()
        .requests
        .as_mut()
        .unwrap()
        .insert(
            "memory".into(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("1 Gi".into()),
        );
    let e = pod_requests(&bad, false).unwrap_err();
    assert_eq!(e.field, "spec.containers[a].resources.requests.memory");
}

/// The rank of a Deployment's pods counts every ReplicaSet of that Deployment on the node; a
/// ReplicaSet without an owner ranks its pods 0; restarts of sidecars decide after the
/// containers'.
#[test]
fn the_rank_counts_a_deployments_replicasets_and_sidecar_restarts_decide_last() {
    let rs = |name: &str,
              owner: Option<&str>,
              app: &str|
     -> k8s_openapi::api::apps::v1::ReplicaSet {
        let mut v = json!({"metadata": {"name": name, "namespace": "d", "uid": format!("rs-{name}")},
            "spec": {"selector": {"matchLabels": {"app": app}}, "template": {}}});
        if let Some(o) = owner {
            v["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1",
                "kind": "Deployment", "name": o, "uid": format!("dep-{o}"), "controller": true}]);
        }
        serde_json::from_value(v).unwrap()
    };
    let p = |name: &str, rs: &str, app: &str, sidecar_restarts: i32| {
        pod(json!({
            "metadata": {"name": name, "namespace": "d", "uid": format!("u-{name}"),
                "labels": {"app": app},
                "creationTimestamp": "2026-01-01T00:00:00Z",
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": rs,
                    "uid": format!("rs-{rs}"), "controller": true}]},
            "spec": {"nodeName": "n", "containers": [{"name": "c", "image": "i"}],
                "initContainers": [{"name": "s", "image": "i", "restartPolicy": "Always"}]},
            "status": {"phase": "Running",
                "initContainerStatuses": [{"name": "s", "image": "i", "imageID": "", "ready": true,
                    "restartCount": sidecar_restarts}]}
        }))
    };
    let pods = [
        p("web-old-1", "web-old", "web", 0),
        p("web-new-1", "web-new", "web", 0),
        p("web-new-2", "web-new", "web", 3),
        p("solo-1", "solo", "solo", 0),
    ];
    let sets = [
        rs("web-old", Some("web"), "web"),
        rs("web-new", Some("web"), "web"),
        rs("solo", None, "solo"),
    ];
    let d = pods::drain_pods_at(&pods, &sets, now());
    let rank: Vec<(String, u32, i32)> = d
        .iter()
        .map(|d| (d.key.clone(), d.rank.colocated, d.rank.sidecar_restarts))
        .collect();
    assert_eq!(
        rank,
        vec![
            ("d/web-old-1".into(), 3, 0),
            ("d/web-new-1".into(), 3, 0),
            ("d/web-new-2".into(), 3, 3),
            ("d/solo-1".into(), 0, 0),
        ]
    );
    assert_eq!(
        super::rank::compare(&d[2].rank, &d[1].rank),
        std::cmp::Ordering::Less
    );
}

proptest! {
    /// The ranking is not a total order (equal ready times let restarts decide, one log2
    /// bucket lets the UID decide: three pods can form a cycle); sorting 60 pods with heavy
    /// timestamp collisions never panics and keeps every pod.
    #[test]
    fn sorting_an_inconsistent_ranking_never_panics(
        pods in prop::collection::vec((0u8..3, 0u8..4, 0u8..3), 20..60),
    ) {
        let ranked: Vec<RankedPod> = pods
            .iter()
            .enumerate()
            .map(|(i, (ready, restarts, age))| RankedPod {
                ready_for: Some(600_000_000_000 + *ready as i64 * 1_000_000_000),
                restarts: *restarts as i32,
                age: Some(900_000_000_000 + *age as i64 * 1_000_000_000),
                ..super::tests::base(&format!("{:02}", (i * 37) % 100))
            })
            .collect();
        let mut sorted = ranked.clone();
        sort(&mut sorted);
        prop_assert_eq!(sorted.len(), ranked.len());
        let drain: Vec<DrainPod> = ranked
            .iter()
            .map(|r| super::tests::drain_pod(&r.uid, Some("ReplicaSet/web"), 0, r.clone()))
            .collect();
        let p = plan::plan(drain, Options::default());
        prop_assert_eq!(p.waves.iter().map(Vec::len).sum::<usize>(), ranked.len());
    }
}
