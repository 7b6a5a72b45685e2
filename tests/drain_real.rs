//! `reaplet make-room` and `reaplet drain` against the components that own their algorithms
//! (issue 29): a real kube-scheduler v1.36 preempting for a pending pod, and a real
//! kube-controller-manager v1.36's ReplicaSet controller scaling ReplicaSets down, on a real
//! kube-apiserver and etcd. The node has no kubelet: the test binds the pods to it and writes
//! their status (start times, Ready transitions, restarts) as a kubelet would, so every time
//! the algorithms read is chosen; a deleted pod stays Terminating, which is how each
//! component's choice is observed.
//!
//! * preemption: for each scenario, `make-room --dry-run -o json --for-pod` (the pod's
//!   PriorityClass resolved from the API) is run first, then the same pod is created and the
//!   scheduler's victims (the pods it deleted) must be exactly make-room's: an exact fit (the
//!   reprieved pods fill the node to the last millicore), budgets (a pod without labels
//!   matches no budget), a pod requesting no memory on a node whose memory is over-committed;
//! * scale-down: each ReplicaSet is scaled down by one, and the pod the controller deleted must
//!   be the one reaplet's ranking puts first at the instant of the controller's DELETE (from
//!   the audit log) and, before each rule's step, the one `drain --dry-run -o json` put first;
//!   one step lands just past the 2^35 ns (34.36 s) boundary of a pod's time since ready and
//!   one just past the 2^36 ns (68.72 s) boundary of a pod's age, where a clock truncated to
//!   the second puts the pod one bucket lower than the controller.

mod common;

use common::k8s::{Cluster, Options};
use serde_json::{Value, json};
use std::process::Command;
use std::time::{Duration, Instant};

const NODE: &str = "n1";

/// One control plane at a time: the boundary step's timing must not compete with another.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
const NS: &str = "default";

fn reaplet(c: &Cluster, args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_reaplet"))
        .args(args)
        .args(["--node", NODE, "--kubeconfig"])
        .arg(&c.admin_kubeconfig)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

fn ts(t: jiff::Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// The node: allocatable as given, and none of the taints a fresh Node gets (nothing here
/// would lift the not-ready one).
async fn set_node(c: &Cluster, cpu: &str, memory: &str) {
    let res = json!({"cpu": cpu, "memory": memory, "pods": "110"});
    c.must(
        "PATCH",
        &format!("/api/v1/nodes/{NODE}/status"),
        Some(&json!({"status": {"capacity": res, "allocatable": res}})),
    )
    .await;
    c.must(
        "PATCH",
        &format!("/api/v1/nodes/{NODE}"),
        Some(&json!({"spec": {"taints": null}})),
    )
    .await;
}

async fn priority_class(c: &Cluster, name: &str, value: i32) {
    c.must(
        "POST",
        "/apis/scheduling.k8s.io/v1/priorityclasses",
        Some(
            &json!({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
            "metadata": {"name": name}, "value": value}),
        ),
    )
    .await;
}

/// A pod bound to the node, of PriorityClass `class`, with `requests` and `labels`, running
/// since `start` (and ready since then); returns the created object.
async fn bound_pod(
    c: &Cluster,
    name: &str,
    class: &str,
    requests: Value,
    labels: Value,
    start: jiff::Timestamp,
) -> Value {
    let pod = c
        .must(
            "POST",
            &format!("/api/v1/namespaces/{NS}/pods"),
            Some(&json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "labels": labels},
                "spec": {"nodeName": NODE, "priorityClassName": class,
                    "containers": [{"name": "c", "image": "busybox",
                        "resources": {"requests": requests}}]}})),
        )
        .await;
    running(c, name, start, start, true, 0).await;
    pod
}

/// Writes a running pod's status as a kubelet would: started at `start`, Ready (or not) since
/// `ready_since`, its container restarted `restarts` times.
async fn running(
    c: &Cluster,
    name: &str,
    start: jiff::Timestamp,
    ready_since: jiff::Timestamp,
    ready: bool,
    restarts: i32,
) {
    let r = if ready { "True" } else { "False" };
    c.must(
        "PATCH",
        &format!("/api/v1/namespaces/{NS}/pods/{name}/status"),
        Some(
            &json!({"status": {"phase": "Running", "startTime": ts(start),
            "conditions": [{"type": "Ready", "status": r, "lastTransitionTime": ts(ready_since)}],
            "containerStatuses": [{"name": "c", "image": "busybox", "imageID": "", "ready": ready,
                "restartCount": restarts, "started": true, "state": {"running": {}}}]}}),
        ),
    )
    .await;
}

async fn pods(c: &Cluster) -> Vec<Value> {
    c.must("GET", &format!("/api/v1/namespaces/{NS}/pods"), None)
        .await["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// The names of the pods being deleted.
async fn deleted(c: &Cluster) -> Vec<String> {
    let mut v: Vec<String> = pods(c)
        .await
        .iter()
        .filter(|p| !p["metadata"]["deletionTimestamp"].is_null())
        .map(|p| p["metadata"]["name"].as_str().unwrap().to_owned())
        .collect();
    v.sort();
    v
}

/// Removes every pod at once (grace 0) and every budget, and waits until they are gone.
async fn clean(c: &Cluster) {
    for p in pods(c).await {
        let name = p["metadata"]["name"].as_str().unwrap().to_owned();
        c.raw(
            "DELETE",
            &format!("/api/v1/namespaces/{NS}/pods/{name}"),
            None,
            Some(&json!({"gracePeriodSeconds": 0})),
        )
        .await;
    }
    c.raw(
        "DELETE",
        &format!("/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets"),
        None,
        None,
    )
    .await;
    let t0 = Instant::now();
    while !pods(c).await.is_empty() {
        assert!(t0.elapsed() < Duration::from_secs(30), "pods not removed");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A budget whose status allows `allowed` disruptions (written as the disruption controller
/// would; none runs here).
async fn budget(c: &Cluster, name: &str, selector: Value, allowed: i32) {
    let created = c
        .must(
            "POST",
            &format!("/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets"),
            Some(
                &json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                "metadata": {"name": name}, "spec": {"maxUnavailable": 0, "selector": selector}}),
            ),
        )
        .await;
    let generation = created["metadata"]["generation"].clone();
    c.must(
        "PATCH",
        &format!("/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets/{name}/status"),
        Some(
            &json!({"status": {"disruptionsAllowed": allowed, "currentHealthy": 1,
            "desiredHealthy": 1, "expectedPods": 1, "observedGeneration": generation}}),
        ),
    )
    .await;
}

/// make-room's victims for the pod in `manifest` (a dry run), then the scheduler's for the same
/// pod created: both, sorted.
async fn victims_both(
    c: &Cluster,
    dir: &std::path::Path,
    manifest: Value,
) -> (Vec<String>, Vec<String>) {
    let file = dir.join("pod.json");
    std::fs::write(&file, manifest.to_string()).unwrap();
    let (code, out, err) = reaplet(
        c,
        &[
            "make-room",
            "--dry-run",
            "-o",
            "json",
            "--for-pod",
            file.to_str().unwrap(),
        ],
    );
    assert_eq!(code, Some(0), "{out}{err}");
    let doc: Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    println!("make-room: {doc}");
    assert_eq!(doc["outcome"], "victims", "{doc:#}");
    let mut ours: Vec<String> = doc["victims"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            v["pod"]
                .as_str()
                .unwrap()
                .trim_start_matches("default/")
                .to_owned()
        })
        .collect();
    ours.sort();
    let name = manifest["metadata"]["name"].as_str().unwrap().to_owned();
    c.must(
        "POST",
        &format!("/api/v1/namespaces/{NS}/pods"),
        Some(&manifest),
    )
    .await;
    // the scheduler nominates the node once it has deleted the victims; then nothing more
    // happens (the victims stay Terminating: no kubelet confirms them)
    let t0 = Instant::now();
    loop {
        let p = c
            .must("GET", &format!("/api/v1/namespaces/{NS}/pods/{name}"), None)
            .await;
        if p["status"]["nominatedNodeName"] == NODE && !deleted(c).await.is_empty() {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the scheduler did not preempt within 60 s: {p:#}\n{}",
            c.scheduler.as_ref().unwrap().tail(30)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // the last victim of an asynchronous preemption is deleted after the others
    tokio::time::sleep(Duration::from_secs(2)).await;
    (ours, deleted(c).await)
}

fn preemptor(name: &str, requests: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"priorityClassName": "urgent",
            "containers": [{"name": "c", "image": "busybox", "resources": {"requests": requests}}]}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn make_room_picks_the_schedulers_victims() {
    let _one = SERIAL.lock().await;
    let mut c = Cluster::start(Options {
        nodes: vec![NODE.into()],
    })
    .await;
    for (n, v) in [
        ("p1", 1),
        ("p5", 5),
        ("p10", 10),
        ("p100", 100),
        ("urgent", 50),
    ] {
        priority_class(&c, n, v).await;
    }
    c.start_scheduler();
    let dir = tempfile::tempdir().unwrap();
    let t = jiff::Timestamp::now() - jiff::SignedDuration::from_secs(600);
    let at = |s: i64| t + jiff::SignedDuration::from_secs(s);

    // an exact fit: high 300m stays, keep (0.35 cores) is reprieved and with the pod's 350m
    // fills the node to its last millicore; only low goes
    set_node(&c, "1", "1Gi").await;
    bound_pod(&c, "high", "p100", json!({"cpu": "300m"}), json!({}), at(0)).await;
    bound_pod(&c, "keep", "p10", json!({"cpu": "0.35"}), json!({}), at(1)).await;
    bound_pod(&c, "low", "p5", json!({"cpu": "350m"}), json!({}), at(2)).await;
    let (ours, theirs) =
        victims_both(&c, dir.path(), preemptor("fit", json!({"cpu": "350m"}))).await;
    assert_eq!(ours, theirs, "exact fit");
    assert_eq!(theirs, vec!["low"]);
    clean(&c).await;

    // budgets: db allows nothing on "a", so a is reprieved first; "no-app" (app DoesNotExist)
    // allows nothing either, but "b" has no labels and matches no budget: c (earlier started)
    // is reprieved before it and b is the victim
    set_node(&c, "2", "1Gi").await;
    bound_pod(
        &c,
        "a",
        "p10",
        json!({"cpu": "1"}),
        json!({"app": "db"}),
        at(0),
    )
    .await;
    bound_pod(
        &c,
        "c",
        "p5",
        json!({"cpu": "500m"}),
        json!({"app": "web"}),
        at(1),
    )
    .await;
    bound_pod(&c, "b", "p5", json!({"cpu": "500m"}), json!({}), at(2)).await;
    budget(&c, "db", json!({"matchLabels": {"app": "db"}}), 0).await;
    budget(
        &c,
        "no-app",
        json!({"matchExpressions": [{"key": "app", "operator": "DoesNotExist"}]}),
        0,
    )
    .await;
    let (ours, theirs) =
        victims_both(&c, dir.path(), preemptor("budgets", json!({"cpu": "500m"}))).await;
    assert_eq!(ours, theirs, "budgets");
    assert_eq!(theirs, vec!["b"]);
    clean(&c).await;

    // a pod requesting no memory on a node whose memory is over-committed (a pod bound past
    // the scheduler): memory is not checked, one victim frees the CPU
    set_node(&c, "2", "1Gi").await;
    bound_pod(
        &c,
        "hog",
        "p100",
        json!({"cpu": "500m", "memory": "2Gi"}),
        json!({}),
        at(0),
    )
    .await;
    bound_pod(&c, "low", "p1", json!({"cpu": "1"}), json!({}), at(1)).await;
    let (ours, theirs) =
        victims_both(&c, dir.path(), preemptor("cpu-only", json!({"cpu": "1"}))).await;
    assert_eq!(ours, theirs, "memory not requested");
    assert_eq!(theirs, vec!["low"]);
    clean(&c).await;
}

/// A pod of ReplicaSet `rs` (its controller), bound to the node.
async fn replica(c: &Cluster, rs: &Value, name: &str, annotations: Value) {
    let rs_name = rs["metadata"]["name"].as_str().unwrap();
    c.must(
        "POST",
        &format!("/api/v1/namespaces/{NS}/pods"),
        Some(&json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"rs": rs_name}, "annotations": annotations,
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                    "name": rs_name, "uid": rs["metadata"]["uid"], "controller": true,
                    "blockOwnerDeletion": true}]},
            "spec": {"nodeName": NODE,
                "containers": [{"name": "c", "image": "busybox"}]}})),
    )
    .await;
}

async fn replicaset(c: &Cluster, name: &str, replicas: i32) -> Value {
    c.must(
        "POST",
        &format!("/apis/apps/v1/namespaces/{NS}/replicasets"),
        Some(&json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": name},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"rs": name}},
                "template": {"metadata": {"labels": {"rs": name}},
                    "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}})),
    )
    .await
}

async fn scale(c: &Cluster, name: &str, replicas: i32) {
    c.must(
        "PATCH",
        &format!("/apis/apps/v1/namespaces/{NS}/replicasets/{name}"),
        Some(&json!({"spec": {"replicas": replicas}})),
    )
    .await;
}

/// The first pod of ReplicaSet `rs` in `drain --dry-run -o json`'s plan, and the plan's instant.
fn drain_first(c: &Cluster, rs: &str) -> (String, jiff::Timestamp) {
    let (code, out, err) = reaplet(c, &["drain", "--dry-run", "-o", "json", "--force"]);
    assert_eq!(code, Some(0), "{out}{err}");
    let doc: Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    let first = doc["waves"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|w| w.as_array().unwrap().iter())
        .find(|p| p["owner"] == format!("ReplicaSet/{rs}") && p["terminating"] == false)
        .unwrap_or_else(|| panic!("no pod of {rs}: {doc:#}"));
    println!("drain put first: {first}");
    // the keys that placed it
    let rank = &first["rank"];
    assert_eq!(rank["phase"], "Running", "{first:#}");
    assert!(
        rank["creationBucket"].is_i64() && rank["restarts"].is_i64(),
        "{first:#}"
    );
    assert!(
        rank["deletionCost"].is_i64() && rank["colocated"].is_u64(),
        "{first:#}"
    );
    (
        first["pod"]
            .as_str()
            .unwrap()
            .trim_start_matches("default/")
            .to_owned(),
        doc["plannedAt"].as_str().unwrap().parse().unwrap(),
    )
}

/// Scales `rs` down by one from `from` and returns the pod the controller deleted and when the
/// API server received that DELETE; checks reaplet's ranking at that instant agrees.
async fn scale_down_one(c: &Cluster, rs: &str, from: i32) -> (String, jiff::Timestamp) {
    let before: Vec<String> = deleted(c).await;
    let listed: Vec<k8s_openapi::api::core::v1::Pod> = pods(c)
        .await
        .into_iter()
        .map(|p| serde_json::from_value(p).unwrap())
        .collect();
    scale(c, rs, from - 1).await;
    let t0 = Instant::now();
    let gone = loop {
        let now: Vec<String> = deleted(c).await;
        let new: Vec<String> = now.into_iter().filter(|n| !before.contains(n)).collect();
        if !new.is_empty() {
            assert_eq!(new.len(), 1, "{new:?}");
            break new[0].clone();
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the controller deleted nothing in 30 s:\n{}",
            c.controller_manager.as_ref().unwrap().tail(30)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let audit = c
        .audit()
        .into_iter()
        .find(|a| a.verb == "delete" && a.resource == "pods" && a.name == gone)
        .expect("the controller's DELETE in the audit log");
    let at: jiff::Timestamp = audit.received.parse().unwrap();
    // reaplet's ranking of that ReplicaSet's pods at the controller's instant (its sort runs a
    // few milliseconds before the request arrives: both ends of 50 ms must agree)
    let rs_obj: k8s_openapi::api::apps::v1::ReplicaSet = serde_json::from_value(
        c.must(
            "GET",
            &format!("/apis/apps/v1/namespaces/{NS}/replicasets/{rs}"),
            None,
        )
        .await,
    )
    .unwrap();
    for back in [0, 50] {
        let when = at - jiff::SignedDuration::from_millis(back);
        let ours = reaplet::drain::plan::plan(
            reaplet::drain::pods::drain_pods_at(&listed, std::slice::from_ref(&rs_obj), when),
            reaplet::drain::plan::Options {
                force: true,
                delete_emptydir_data: true,
            },
        );
        let first = ours
            .waves
            .iter()
            .flatten()
            .find(|d| d.owner.as_deref() == Some(&format!("ReplicaSet/{rs}")) && !d.terminating)
            .map(|d| d.key.trim_start_matches("default/").to_owned());
        assert_eq!(first.as_deref(), Some(gone.as_str()), "{rs} at {when}");
    }
    (gone, at)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_ranks_as_the_replicaset_controller_scales_down() {
    let _one = SERIAL.lock().await;
    let mut c = Cluster::start(Options {
        nodes: vec![NODE.into()],
    })
    .await;
    // the ReplicaSets and their pods first, the controller after: it finds them at their size
    let rules = replicaset(&c, "rules", 5).await;
    let edge = replicaset(&c, "edge", 2).await;
    let born = replicaset(&c, "born", 2).await;
    replica(&c, &rules, "notready", json!({})).await;
    replica(
        &c,
        &rules,
        "cheap",
        json!({"controller.kubernetes.io/pod-deletion-cost": "-10"}),
    )
    .await;
    replica(&c, &rules, "recent", json!({})).await;
    replica(&c, &rules, "flaky", json!({})).await;
    replica(&c, &rules, "steady", json!({})).await;
    replica(&c, &edge, "x", json!({})).await;
    replica(&c, &edge, "y", json!({})).await;
    // born's two pods differ only in when they were created (the server's second)
    replica(&c, &born, "elder", json!({})).await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    replica(&c, &born, "younger", json!({})).await;
    let now = jiff::Timestamp::now();
    let ago = |s: i64| now - jiff::SignedDuration::from_secs(s);
    running(&c, "notready", ago(900), ago(900), false, 0).await;
    running(&c, "cheap", ago(900), ago(900), true, 0).await;
    running(&c, "recent", ago(900), ago(20), true, 0).await;
    running(&c, "flaky", ago(900), ago(600), true, 4).await;
    running(&c, "steady", ago(900), ago(600), true, 0).await;
    running(&c, "elder", ago(900), ago(600), true, 0).await;
    running(&c, "younger", ago(900), ago(600), true, 0).await;
    // the controller manager acts as itself (no service-account credentials here): give it the
    // ReplicaSet controller's own bootstrap role
    c.must(
        "POST",
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        Some(
            &json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "kcm-replicaset-controller"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                "name": "system:controller:replicaset-controller"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                "name": "system:kube-controller-manager"}]}),
        ),
    )
    .await;
    c.start_controller_manager(&["replicaset-controller"]);
    // the controller has synced both when their status says so
    let t0 = Instant::now();
    for rs in ["rules", "edge", "born"] {
        loop {
            let r = c
                .must(
                    "GET",
                    &format!("/apis/apps/v1/namespaces/{NS}/replicasets/{rs}"),
                    None,
                )
                .await;
            if r["status"]["observedGeneration"] == r["metadata"]["generation"]
                && r["status"]["replicas"].as_i64() == r["spec"]["replicas"].as_i64()
            {
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(90),
                "the ReplicaSet controller did not sync {rs}: {r:#}\n{}",
                c.controller_manager.as_ref().unwrap().tail(30)
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    assert!(
        deleted(&c).await.is_empty(),
        "the controller deleted a pod at sync"
    );

    // one rule per step: not ready first; then the lower deletion cost; then the more recently
    // ready; then, ready at the same time, the one with more restarts
    let mut order = Vec::new();
    for (i, want) in ["notready", "cheap", "recent", "flaky"].iter().enumerate() {
        let (cli, _) = drain_first(&c, "rules");
        let (gone, _) = scale_down_one(&c, "rules", 5 - i as i32).await;
        assert_eq!(cli, gone, "drain's plan before step {i}");
        assert_eq!(&gone, want);
        order.push(gone);
    }
    println!("rules: the controller deleted {order:?}, as reaplet ranked them");

    // the boundary: x became ready at R, y at R+1 s. From R+34.36 s (2^35 ns) to R+35.36 s, x
    // is in bucket 35 and y in 34: y (the more recently ready) goes first. Up to R+35 s a
    // clock truncated to the second puts both in bucket 34 (and the UID decides).
    let r = jiff::Timestamp::from_second(jiff::Timestamp::now().as_second() - 30).unwrap();
    let plus = |ms: i64| r + jiff::SignedDuration::from_millis(ms);
    running(&c, "x", ago(900), r, true, 0).await;
    running(&c, "y", ago(900), plus(1000), true, 0).await;
    // scale just past the boundary (the plan is checked at the controller's own instant: a
    // dry run first would spend the window)
    let wake = plus(34_360 + 60);
    let wait = wake.duration_since(jiff::Timestamp::now()).unsigned_abs();
    tokio::time::sleep(wait).await;
    let (gone, at) = scale_down_one(&c, "edge", 2).await;
    let since = at.duration_since(r).as_secs_f64();
    println!(
        "edge: the controller deleted {gone} at R+{since:.3} s ({}), as reaplet ranked them \
         at that instant",
        if since < 35.0 {
            "where a clock truncated to the second would tie x and y"
        } else {
            "past the second where truncation alone would differ"
        }
    );
    assert_eq!(gone, "y");
    assert!(
        (34.36..35.36).contains(&since),
        "the DELETE came at R+{since:.3} s, outside the boundary window"
    );

    // the same at a creation-time boundary: 2^36 ns (68.72 s) after elder was created it is in
    // bucket 36 and younger (created a second or more later) in 35, so younger goes first; up
    // to 69 s a clock truncated to the second puts both in 35
    let created = |name: &str| {
        let c = &c;
        let name = name.to_owned();
        async move {
            let p = c
                .must("GET", &format!("/api/v1/namespaces/{NS}/pods/{name}"), None)
                .await;
            p["metadata"]["creationTimestamp"]
                .as_str()
                .unwrap()
                .parse::<jiff::Timestamp>()
                .unwrap()
        }
    };
    let (ce, cy) = (created("elder").await, created("younger").await);
    assert!(cy.as_second() > ce.as_second(), "{ce} {cy}");
    let wake = ce + jiff::SignedDuration::from_millis(68_720 + 60);
    assert!(
        jiff::Timestamp::now() < wake,
        "the set-up took longer than 68 s; the creation boundary has passed"
    );
    tokio::time::sleep(wake.duration_since(jiff::Timestamp::now()).unsigned_abs()).await;
    let (gone, at) = scale_down_one(&c, "born", 2).await;
    let since = at.duration_since(ce).as_secs_f64();
    println!("born: the controller deleted {gone} {since:.3} s after elder was created");
    assert_eq!(gone, "younger");
    assert!(
        (68.72..69.72).contains(&since),
        "the DELETE came {since:.3} s after elder's creation, outside the boundary window"
    );
}
