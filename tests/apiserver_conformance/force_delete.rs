//! Facts of section 3: force delete, and what a node sees afterwards.

use super::pods::*;
use super::*;

/// A node's GET of a pod once the Node authorizer has caught up: on the real server its graph
/// of which pod is bound to which node follows the store through an informer, so for a few
/// milliseconds after a create (or a delete) a node's GET still answers as before: `transient`
/// (403 `no relationship found` for a new pod, 404 for a deleted one). Asked again for at most
/// 5 s while it does; the imitation's graph is the store, its first answer the last.
async fn settled_get(c: &Client, path: &str, transient: u16) -> Resp {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let r = c.get(path).await;
        if r.code != transient || std::time::Instant::now() > deadline {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Running pod `name` force-deleted by an admin.
async fn force_deleted(bed: &Bed, name: &str) -> Value {
    let p = bed.running(name).await;
    delete(
        &bed.admin,
        name,
        json!({"gracePeriodSeconds": 0, "propagationPolicy": "Background"}),
    )
    .await
    .expect(200, None);
    p
}

both!(fact_3_1_force_delete_is_modified_then_deleted_for_every_watcher);
async fn fact_3_1_force_delete_is_modified_then_deleted_for_every_watcher(b: Backend) {
    let bed = Bed::new(b).await;
    bed.running("r0").await;
    let mut watches = [
        bed.watch_pods().await,
        node_watch(&bed.node_a, "node-a").await,
    ];
    let t0 = now();
    let r = delete(
        &bed.admin,
        "r0",
        json!({"gracePeriodSeconds": 0, "propagationPolicy": "Background"}),
    )
    .await;
    let t1 = now();
    r.expect(200, None);
    for w in &mut watches {
        let (t, _, m) = next(w).await;
        assert_eq!(
            (t.as_str(), dgps(&m), &m["status"]["phase"]),
            ("MODIFIED", &json!(0), &json!("Running"))
        );
        assert!((t0..=t1).contains(&dt(&m)));
        let (t, _, d) = next(w).await;
        assert_eq!((t.as_str(), rv(&d)), ("DELETED", rv(&m) + 1));
    }
}

both!(fact_3_2_a_node_gets_403_for_a_deleted_pod);
async fn fact_3_2_a_node_gets_403_for_a_deleted_pod(b: Backend) {
    let bed = Bed::new(b).await;
    force_deleted(&bed, "r0").await;
    let r = settled_get(&bed.node_a, &pod_path("r0"), 404).await;
    expect_status(
        &r,
        403,
        "Forbidden",
        "pods \"r0\" is forbidden: User \"system:node:node-a\" cannot get resource \"pods\" in API group \"\" in the namespace \"default\": no relationship found between node 'node-a' and this object",
    );
    let r = bed.admin.get(&pod_path("r0")).await;
    expect_status(&r, 404, "NotFound", "pods \"r0\" not found");
}

both!(fact_3_3_gone_and_not_mine_look_the_same);
async fn fact_3_3_gone_and_not_mine_look_the_same(b: Backend) {
    let bed = Bed::new(b).await;
    bed.pod("x-b", Some("node-b")).await;
    for (ns, name) in [
        ("default", "never"),
        ("default", "x-b"),
        ("nonexistent-ns", "x"),
    ] {
        let r = bed
            .node_a
            .get(&format!("/api/v1/namespaces/{ns}/pods/{name}"))
            .await;
        let msg = format!(
            "pods \"{name}\" is forbidden: User \"system:node:node-a\" cannot get resource \"pods\" in API group \"\" in the namespace \"{ns}\": no relationship found between node 'node-a' and this object"
        );
        expect_status(&r, 403, "Forbidden", &msg);
    }
}

both!(fact_3_4_writes_to_a_deleted_pod_are_404);
async fn fact_3_4_writes_to_a_deleted_pod_are_404(b: Backend) {
    let bed = Bed::new(b).await;
    let p = force_deleted(&bed, "r0").await;
    let msg = "pods \"r0\" not found";
    let patch = bed
        .node_a
        .patch(
            &status_path("r0"),
            MERGE,
            &json!({"status": {"phase": "Failed"}}),
        )
        .await;
    expect_status(&patch, 404, "NotFound", msg);
    expect_status(
        &bed.node_a.put(&status_path("r0"), &p).await,
        404,
        "NotFound",
        msg,
    );
    expect_status(
        &delete(&bed.node_a, "r0", json!({"gracePeriodSeconds": 0})).await,
        404,
        "NotFound",
        msg,
    );
}

both!(fact_3_5_a_node_reads_its_new_and_terminating_pods);
async fn fact_3_5_a_node_reads_its_new_and_terminating_pods(b: Backend) {
    let bed = Bed::new(b).await;
    for name in ["n1", "n2", "n3"] {
        bed.pod(name, Some("node-a")).await;
        let r = settled_get(&bed.node_a, &pod_path(name), 403).await;
        r.expect(200, None);
    }
    bed.admin
        .delete(&pod_path("n1"), None)
        .await
        .expect(200, None);
    let r = bed.node_a.get(&pod_path("n1")).await;
    r.expect(200, None);
    assert_eq!(dgps(&r.body), 30);
}

both!(fact_3_6_the_kubelet_sequence_is_four_events);
async fn fact_3_6_the_kubelet_sequence_is_four_events(b: Backend) {
    let bed = Bed::new(b).await;
    let p = bed.pod("k0", Some("node-a")).await;
    let mut w = node_watch(&bed.node_a, "node-a").await;
    bed.admin
        .delete(&pod_path("k0"), None)
        .await
        .expect(200, None);
    set_phase(&bed, "k0", "Succeeded").await;
    // "first delete's start" would come out at least a second before now
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let t0 = now();
    delete(
        &bed.node_a,
        "k0",
        json!({"gracePeriodSeconds": 0, "preconditions": {"uid": uid(&p)}}),
    )
    .await
    .expect(200, None);
    let t1 = now();
    let (t, _, o) = next(&mut w).await;
    assert_eq!((t.as_str(), dgps(&o)), ("MODIFIED", &json!(30)));
    let (t, _, o) = next(&mut w).await;
    assert_eq!(
        (t.as_str(), &o["status"]["phase"]),
        ("MODIFIED", &json!("Succeeded"))
    );
    let (t, _, o) = next(&mut w).await;
    assert_eq!((t.as_str(), dgps(&o)), ("MODIFIED", &json!(0)));
    assert!((t0..=t1).contains(&dt(&o)));
    let (t, _, _) = next(&mut w).await;
    assert_eq!(t, "DELETED");
    w.expect_quiet(QUIET).await;
}
