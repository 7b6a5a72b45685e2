//! Facts of section 5: a node's deletes and creates, mirror pods.

use super::pods::*;
use super::*;

both!(fact_5_1_a_node_deletes_only_its_own_pods);
async fn fact_5_1_a_node_deletes_only_its_own_pods(b: Backend) {
    let bed = Bed::new(b).await;
    bed.pod("x-b", Some("node-b")).await;
    let r = bed.node_a.delete(&pod_path("x-b"), None).await;
    expect_status(
        &r,
        403,
        "Forbidden",
        "pods \"x-b\" is forbidden: node \"node-a\" can only delete pods with spec.nodeName set to itself",
    );
    assert!(bed.stored("x-b").await.expect("there")["metadata"]["deletionTimestamp"].is_null());
    let r = bed.node_a.delete(&pod_path("nonexistent"), None).await;
    expect_status(&r, 404, "NotFound", "pods \"nonexistent\" not found");
}

both!(fact_5_2_a_node_creates_only_mirror_pods);
async fn fact_5_2_a_node_creates_only_mirror_pods(b: Backend) {
    let bed = Bed::new(b).await;
    let r = bed
        .node_a
        .post(PODS, &pod_body("plain-a", Some("node-a")))
        .await;
    expect_status(
        &r,
        403,
        "Forbidden",
        "pods \"plain-a\" is forbidden: pod does not have \"kubernetes.io/config.mirror\" annotation, node \"node-a\" can only create mirror pods",
    );
    assert!(bed.stored("plain-a").await.is_none());
}

both!(fact_5_3_mirror_pod_owner_reference);
async fn fact_5_3_mirror_pod_owner_reference(b: Backend) {
    let bed = Bed::new(b).await;
    let node_uid = node_uid(&bed, "node-a").await;
    let zero = "00000000-0000-0000-0000-000000000000";
    let mut not_controller = node_owner("node-a", &node_uid);
    not_controller["controller"] = false.into();
    let forbidden = |name: &str, why: String| (403, format!("pods \"{name}\" is forbidden: {why}"));
    let cases = [
        ("static-noowner-node-a", None, forbidden("static-noowner-node-a", "node \"node-a\" can only create pods with an owner reference set to itself".into())),
        ("static-nc-node-a", Some(not_controller), forbidden("static-nc-node-a", "node \"node-a\" can only create pods with a controller owner reference set to itself".into())),
        ("static-baduid-node-a", Some(node_owner("node-a", zero)), forbidden("static-baduid-node-a", format!("node node-a UID mismatch: expected {zero} got {node_uid}"))),
        ("static-ok-node-a", Some(node_owner("node-a", &node_uid)), (201, String::new())),
    ];
    for (name, owner, (code, msg)) in cases {
        let r = bed
            .node_a
            .post(PODS, &mirror(name, Some("node-a"), owner))
            .await;
        if code == 201 {
            r.expect(201, None);
        } else {
            expect_status(&r, code, "Forbidden", &msg);
        }
    }
}

both!(fact_5_4_mirror_pod_refusals);
async fn fact_5_4_mirror_pod_refusals(b: Backend) {
    let bed = Bed::new(b).await;
    let owner = Some(node_owner("node-a", &node_uid(&bed, "node-a").await));
    bed.node_a
        .post(
            PODS,
            &mirror("static-x-node-a", Some("node-a"), owner.clone()),
        )
        .await
        .expect(201, None);
    let mut with_sa = mirror("static-sa-node-a", Some("node-a"), owner.clone());
    with_sa["spec"]["serviceAccountName"] = "default".into();
    let mut with_secret = mirror("static-sec-node-a", Some("node-a"), owner.clone());
    with_secret["spec"]["volumes"] = json!([{"name": "s", "secret": {"secretName": "s"}}]);
    let mut elsewhere = mirror("static-ns-node-a", Some("node-a"), owner.clone());
    elsewhere["metadata"]["namespace"] = "nonexistent-ns".into();
    let node_a = "node \"node-a\"";
    let cases = [
        (
            PODS,
            mirror("static-x-node-b", Some("node-b"), owner.clone()),
            403,
            "Forbidden",
            format!(
                "pods \"static-x-node-b\" is forbidden: {node_a} can only create pods with spec.nodeName set to itself"
            ),
        ),
        (
            PODS,
            mirror("static-unbound", None, owner.clone()),
            403,
            "Forbidden",
            format!(
                "pods \"static-unbound\" is forbidden: {node_a} can only create pods with spec.nodeName set to itself"
            ),
        ),
        (
            PODS,
            with_sa,
            403,
            "Forbidden",
            format!(
                "pods \"static-sa-node-a\" is forbidden: {node_a} can not create pods that reference serviceaccounts"
            ),
        ),
        (
            PODS,
            with_secret,
            403,
            "Forbidden",
            format!(
                "pods \"static-sec-node-a\" is forbidden: {node_a} can not create pods that reference secrets"
            ),
        ),
        (
            "/api/v1/namespaces/nonexistent-ns/pods",
            elsewhere,
            404,
            "NotFound",
            "namespaces \"nonexistent-ns\" not found".into(),
        ),
        (
            PODS,
            mirror("static-x-node-a", Some("node-a"), owner.clone()),
            409,
            "AlreadyExists",
            "pods \"static-x-node-a\" already exists".into(),
        ),
    ];
    for (path, body, code, reason, msg) in cases {
        expect_status(&bed.node_a.post(path, &body).await, code, reason, &msg);
    }
}

both!(fact_5_5_mirror_pod_uid_is_the_servers);
async fn fact_5_5_mirror_pod_uid_is_the_servers(b: Backend) {
    let bed = Bed::new(b).await;
    let owner = node_owner("node-a", &node_uid(&bed, "node-a").await);
    let sent = "11111111-2222-3333-4444-555555555555";
    let mut uids = Vec::new();
    for name in ["static-u1-node-a", "static-u2-node-a"] {
        let mut body = mirror(name, Some("node-a"), Some(owner.clone()));
        body["metadata"]["uid"] = sent.into();
        let r = bed.node_a.post(PODS, &body).await;
        r.expect(201, None);
        let u = uid(&r.body);
        assert!(u != sent && u.len() == 36, "{u}");
        assert_eq!(
            (
                &r.body["metadata"]["generation"],
                &r.body["status"]["phase"]
            ),
            (&json!(1), &json!("Pending"))
        );
        uids.push(u);
    }
    assert_ne!(uids[0], uids[1]);
}

both!(fact_5_6_a_node_may_not_patch_pod_metadata);
async fn fact_5_6_a_node_may_not_patch_pod_metadata(b: Backend) {
    let bed = Bed::new(b).await;
    let owner = node_owner("node-a", &node_uid(&bed, "node-a").await);
    bed.node_a
        .post(
            PODS,
            &mirror("static-x-node-a", Some("node-a"), Some(owner)),
        )
        .await
        .expect(201, None);
    bed.pod("own", Some("node-a")).await;
    for name in ["static-x-node-a", "own"] {
        let r = bed
            .node_a
            .patch(
                &pod_path(name),
                MERGE,
                &json!({"metadata": {"labels": {"x": "y"}}}),
            )
            .await;
        let msg = format!(
            "pods \"{name}\" is forbidden: User \"system:node:node-a\" cannot patch resource \"pods\" in API group \"\" in the namespace \"default\""
        );
        expect_status(&r, 403, "Forbidden", &msg);
    }
}

both!(fact_5_7_mirror_pods_delete_like_any_pod);
async fn fact_5_7_mirror_pods_delete_like_any_pod(b: Backend) {
    let bed = Bed::new(b).await;
    let owner = node_owner("node-a", &node_uid(&bed, "node-a").await);
    for name in ["static-d-node-a", "static-e-node-a", "static-z-node-a"] {
        bed.node_a
            .post(PODS, &mirror(name, Some("node-a"), Some(owner.clone())))
            .await
            .expect(201, None);
    }
    let mut w = bed.watch_pods().await;
    let r = bed.admin.delete(&pod_path("static-d-node-a"), None).await;
    r.expect(200, None);
    assert_eq!(dgps(&r.body), 30);
    let (t, _, _) = next(&mut w).await;
    assert_eq!(t, "MODIFIED");
    w.expect_quiet(QUIET).await;
    let eviction = json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "static-e-node-a", "namespace": "default"}});
    bed.node_a
        .post(
            &format!("{}/eviction", pod_path("static-e-node-a")),
            &eviction,
        )
        .await
        .expect(201, None);
    assert_eq!(
        dgps(&bed.stored("static-e-node-a").await.expect("graceful")),
        30
    );
    delete(
        &bed.node_a,
        "static-z-node-a",
        json!({"gracePeriodSeconds": 0}),
    )
    .await
    .expect(200, None);
    assert!(bed.stored("static-z-node-a").await.is_none());
}

both!(fact_5_8_status_in_a_create_is_ignored_and_nodes_are_not_checked);
async fn fact_5_8_status_in_a_create_is_ignored_and_nodes_are_not_checked(b: Backend) {
    let bed = Bed::new(b).await;
    let mut body = pod_body("st", Some("node-a"));
    body["status"] = json!({"phase": "Running", "qosClass": "Guaranteed", "hostIP": "10.0.0.1"});
    let r = bed.admin.post(PODS, &body).await;
    r.expect(201, None);
    // all but a qosClass sent, which the server keeps (qos.GetPodQOS), even a wrong one
    assert_eq!(
        r.body["status"],
        json!({"phase": "Pending", "qosClass": "Guaranteed"})
    );
    bed.admin
        .post(PODS, &pod_body("zzz", Some("node-zzz")))
        .await
        .expect(201, None);
}
