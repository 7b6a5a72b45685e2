//! make-room against the real scheduler's preemption.

use super::common::k8s::{Cluster, Options};
use super::{NODE, NS, SERIAL, deleted, pods, reaplet, running};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

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
    // the last victim of an asynchronous preemption is deleted after the others: the set is
    // read once it has not changed for 2 s
    let mut last = deleted(c).await;
    let mut stable = Instant::now();
    while stable.elapsed() < Duration::from_secs(2) {
        assert!(
            t0.elapsed() < Duration::from_secs(90),
            "victims still changing"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = deleted(c).await;
        if now != last {
            last = now;
            stable = Instant::now();
        }
    }
    (ours, last)
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
