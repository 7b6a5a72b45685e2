//! drain's ranking against the real ReplicaSet controller's scale-down: each ReplicaSet is
//! scaled down by one, and the pod the controller deleted must be the one reaplet's ranking
//! puts first at the instant of the controller's DELETE (from the audit log) and, before each
//! rule's step, the one `drain --dry-run -o json` put first. The boundary steps land just past
//! 2^35 ns of a pod's time since ready and 2^36 ns of its age; each has three pairs, so a step
//! whose DELETE misses its window on a loaded machine is tried again on the next pair.

use super::common::k8s::{Cluster, Options};
use super::{NODE, NS, SERIAL, deleted, pods, reaplet, running, sleep_until};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

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
    // the controller sorted a few milliseconds before its DELETE arrived: reaplet's first pod
    // at both ends of the 50 ms before it must be the deleted one (when a bucket boundary lies
    // in between, the two ends differ and the controller's instant decides: either is right)
    let first_at = |back: i64| {
        let when = at - jiff::SignedDuration::from_millis(back);
        let ours = reaplet::drain::plan::plan(
            reaplet::drain::pods::drain_pods_at(&listed, std::slice::from_ref(&rs_obj), when),
            reaplet::drain::plan::Options {
                force: true,
                delete_emptydir_data: true,
            },
        );
        ours.waves
            .iter()
            .flatten()
            .find(|d| d.owner.as_deref() == Some(&format!("ReplicaSet/{rs}")) && !d.terminating)
            .map(|d| d.key.trim_start_matches("default/").to_owned())
    };
    let (late, early) = (first_at(0), first_at(50));
    assert!(
        late.as_deref() == Some(gone.as_str()) && early.as_deref() == Some(gone.as_str())
            || late != early
                && [&late, &early]
                    .iter()
                    .any(|f| f.as_deref() == Some(gone.as_str())),
        "{rs}: the controller deleted {gone}; reaplet at {at} put {late:?} first, 50 ms before \
         {early:?}"
    );
    (gone, at)
}

/// How many pairs are set up for each boundary: a step whose DELETE misses the window (a
/// loaded machine) is tried again on the next pair.
const ATTEMPTS: usize = 3;

/// The instant of `name`'s creation (the server's second).
async fn created(c: &Cluster, name: &str) -> jiff::Timestamp {
    let p = c
        .must("GET", &format!("/api/v1/namespaces/{NS}/pods/{name}"), None)
        .await;
    p["metadata"]["creationTimestamp"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap()
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
    for i in 0..ATTEMPTS {
        let edge = replicaset(&c, &format!("edge-{i}"), 2).await;
        replica(&c, &edge, &format!("x-{i}"), json!({})).await;
        replica(&c, &edge, &format!("y-{i}"), json!({})).await;
    }
    // born's pairs differ only in when they were created (the server's second)
    for i in 0..ATTEMPTS {
        let born = replicaset(&c, &format!("born-{i}"), 2).await;
        replica(&c, &born, &format!("elder-{i}"), json!({})).await;
        tokio::time::sleep(Duration::from_millis(1200)).await;
        replica(&c, &born, &format!("younger-{i}"), json!({})).await;
    }
    let now = jiff::Timestamp::now();
    let ago = |s: i64| now - jiff::SignedDuration::from_secs(s);
    running(&c, "notready", ago(900), ago(900), false, 0).await;
    running(&c, "cheap", ago(900), ago(900), true, 0).await;
    running(&c, "recent", ago(900), ago(20), true, 0).await;
    running(&c, "flaky", ago(900), ago(600), true, 4).await;
    running(&c, "steady", ago(900), ago(600), true, 0).await;
    for i in 0..ATTEMPTS {
        for n in ["x", "y", "elder", "younger"] {
            running(&c, &format!("{n}-{i}"), ago(900), ago(600), true, 0).await;
        }
    }
    c.grant_controller_role("replicaset-controller").await;
    c.start_controller_manager(&["replicaset-controller"]);
    // the controller has synced each when its status says so
    let t0 = Instant::now();
    let names: Vec<String> = std::iter::once("rules".to_string())
        .chain((0..ATTEMPTS).flat_map(|i| [format!("edge-{i}"), format!("born-{i}")]))
        .collect();
    for rs in &names {
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

    // the boundary of the time since ready: x became ready at R, y at R+1 s. From R+34.36 s
    // (2^35 ns) to R+35.36 s, x is in bucket 35 and y in 34: y (the more recently ready) goes
    // first. Up to R+35 s a clock truncated to the second puts both in bucket 34 (and the UID
    // decides). The plan is checked at the controller's own instant (a dry run first would
    // spend the window); the scale comes 150 ms past the boundary, so the check 50 ms before
    // the DELETE is past it too.
    let mut hit = None;
    for i in 0..ATTEMPTS {
        let r = jiff::Timestamp::from_second(jiff::Timestamp::now().as_second() - 30).unwrap();
        let plus = |ms: i64| r + jiff::SignedDuration::from_millis(ms);
        running(&c, &format!("x-{i}"), ago(900), r, true, 0).await;
        running(&c, &format!("y-{i}"), ago(900), plus(1000), true, 0).await;
        sleep_until(plus(34_360 + 150)).await;
        let (gone, at) = scale_down_one(&c, &format!("edge-{i}"), 2).await;
        let since = at.duration_since(r).as_secs_f64();
        println!(
            "edge-{i}: the controller deleted {gone} at R+{since:.3} s, as reaplet ranked them then"
        );
        if (34.36..35.36).contains(&since) {
            assert_eq!(gone, format!("y-{i}"));
            hit = Some(since);
            break;
        }
    }
    let since = hit.expect("every edge step's DELETE came outside its boundary window");
    if since < 35.0 {
        println!("edge: R+{since:.3} s is where a clock truncated to the second would tie x and y");
    }

    // the same at a creation-time boundary: 2^36 ns (68.72 s) after elder was created it is in
    // bucket 36 and younger (created a second or more later) in 35, so younger goes first; up
    // to 69 s a clock truncated to the second puts both in 35
    let mut hit = None;
    for i in 0..ATTEMPTS {
        let (ce, cy) = (
            created(&c, &format!("elder-{i}")).await,
            created(&c, &format!("younger-{i}")).await,
        );
        assert!(cy.as_second() > ce.as_second(), "{ce} {cy}");
        let wake = ce + jiff::SignedDuration::from_millis(68_720 + 150);
        if jiff::Timestamp::now() > wake {
            println!("born-{i}: its boundary passed during the set-up");
            continue;
        }
        sleep_until(wake).await;
        let (gone, at) = scale_down_one(&c, &format!("born-{i}"), 2).await;
        let since = at.duration_since(ce).as_secs_f64();
        println!("born-{i}: the controller deleted {gone} {since:.3} s after elder was created");
        if (68.72..69.72).contains(&since) {
            assert_eq!(gone, format!("younger-{i}"));
            hit = Some(since);
            break;
        }
    }
    hit.expect("every born step's DELETE came outside its boundary window");
}
