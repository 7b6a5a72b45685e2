//! Facts of section 4: pod status writes by a node.

use super::pods::{QUIET, expect_status, set_phase, status_path};
use super::*;

both!(fact_4_1_status_patch_types_and_put);
async fn fact_4_1_status_patch_types_and_put(b: Backend) {
    let bed = Bed::new(b).await;
    bed.pod("s0", Some("node-a")).await;
    let cases = [
        (MERGE, json!({"status": {"message": "merge"}}), "merge"),
        (
            STRATEGIC,
            json!({"status": {"message": "strategic"}}),
            "strategic",
        ),
        (
            JSON_PATCH,
            json!([{"op": "add", "path": "/status/message", "value": "json"}]),
            "json",
        ),
    ];
    for (ct, body, want) in cases {
        let r = bed.node_a.patch(&status_path("s0"), ct, &body).await;
        r.expect(200, None);
        assert_eq!(
            (&r.body["kind"], &r.body["status"]["message"]),
            (&json!("Pod"), &json!(want))
        );
    }
    let mut p = bed.stored("s0").await.unwrap();
    p["status"]["message"] = "put".into();
    let r = bed.node_a.put(&status_path("s0"), &p).await;
    r.expect(200, None);
    assert_eq!(
        (&r.body["kind"], &r.body["status"]["message"]),
        (&json!("Pod"), &json!("put"))
    );
}

both!(fact_4_2_stale_resource_version_conflicts);
async fn fact_4_2_stale_resource_version_conflicts(b: Backend) {
    let bed = Bed::new(b).await;
    let old = bed.pod("s0", Some("node-a")).await;
    set_phase(&bed, "s0", "Running").await;
    let msg = "Operation cannot be fulfilled on pods \"s0\": the object has been modified; please apply your changes to the latest version and try again";
    let mut stale = old.clone();
    stale["status"]["message"] = "stale".into();
    let put = bed.node_a.put(&status_path("s0"), &stale).await;
    let rv_patch = json!({"metadata": {"resourceVersion": "1"}, "status": {"message": "x"}});
    let patch = bed.node_a.patch(&status_path("s0"), MERGE, &rv_patch).await;
    for r in [put, patch] {
        expect_status(&r, 409, "Conflict", msg);
        assert_eq!(r.body["details"]["kind"], "pods");
    }
    let mut fresh = bed.stored("s0").await.unwrap();
    fresh["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("resourceVersion");
    fresh["status"]["message"] = "no rv".into();
    let r = bed.node_a.put(&status_path("s0"), &fresh).await;
    r.expect(200, None);
    assert_eq!(
        bed.stored("s0").await.unwrap()["status"]["message"],
        "no rv"
    );
}

both!(fact_4_2_put_without_resource_version_on_nodes);
async fn fact_4_2_put_without_resource_version_on_nodes(b: Backend) {
    let bed = Bed::new(b).await;
    let cases = [
        (
            "/api/v1/nodes/node-a/status",
            "/status/capacity",
            json!({"pods": "110"}),
        ),
        (
            "/api/v1/nodes/node-a",
            "/metadata/annotations",
            json!({"example.com/x": "y"}),
        ),
    ];
    for (path, at, value) in cases {
        let mut n = bed.node_a.get("/api/v1/nodes/node-a").await.body;
        n["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("resourceVersion");
        let (parent, key) = at.rsplit_once('/').unwrap();
        n.pointer_mut(parent).unwrap()[key] = value.clone();
        let r = bed.node_a.put(path, &n).await;
        r.expect(200, None);
        assert_eq!(r.body.pointer(at), Some(&value), "{path}");
    }
}

both!(fact_4_3_a_write_that_changes_nothing);
async fn fact_4_3_a_write_that_changes_nothing(b: Backend) {
    let bed = Bed::new(b).await;
    bed.pod("s0", Some("node-a")).await;
    let p = set_phase(&bed, "s0", "Running").await;
    let mut w = bed.watch_pods().await;
    let same = json!({"status": {"phase": "Running"}});
    for r in [
        bed.node_a.patch(&status_path("s0"), MERGE, &same).await,
        bed.node_a
            .patch(&status_path("s0"), STRATEGIC, &json!({}))
            .await,
        bed.node_a.put(&status_path("s0"), &p).await,
    ] {
        r.expect(200, None);
        assert_eq!(r.rv(), rv(&p));
    }
    w.expect_quiet(QUIET).await;
}

both!(fact_4_4_only_status_of_own_pods);
async fn fact_4_4_only_status_of_own_pods(b: Backend) {
    let bed = Bed::new(b).await;
    let p = bed.pod("s1", Some("node-b")).await;
    let msg = "pods \"s1\" is forbidden: node \"node-a\" can only update pod status for pods with spec.nodeName set to itself";
    let body = json!({"status": {"phase": "Running"}});
    for ct in [MERGE, STRATEGIC] {
        expect_status(
            &bed.node_a.patch(&status_path("s1"), ct, &body).await,
            403,
            "Forbidden",
            msg,
        );
    }
    let ops = json!([{"op": "add", "path": "/status/phase", "value": "Running"}]);
    expect_status(
        &bed.node_a.patch(&status_path("s1"), JSON_PATCH, &ops).await,
        403,
        "Forbidden",
        msg,
    );
    expect_status(
        &bed.node_a.put(&status_path("s1"), &p).await,
        403,
        "Forbidden",
        msg,
    );
    assert_eq!(rv(&bed.stored("s1").await.unwrap()), rv(&p));
}

both!(fact_4_5_a_wrong_uid_is_invalid);
async fn fact_4_5_a_wrong_uid_is_invalid(b: Backend) {
    let bed = Bed::new(b).await;
    let p = bed.pod("s0", Some("node-a")).await;
    let zero = "00000000-0000-0000-0000-000000000000";
    let msg = format!(
        "Pod \"s0\" is invalid: metadata.uid: Invalid value: \"{zero}\": field is immutable"
    );
    for ct in [MERGE, STRATEGIC] {
        let body = json!({"metadata": {"uid": zero}, "status": {"phase": "Running"}});
        let r = bed.node_a.patch(&status_path("s0"), ct, &body).await;
        expect_status(&r, 422, "Invalid", &msg);
        assert_eq!(r.body["details"]["kind"], "Pod");
        assert_eq!(
            r.body["details"]["causes"].as_array().map(Vec::len),
            Some(2),
            "{:#}",
            r.body
        );
    }
    let body = json!({"metadata": {"uid": p["metadata"]["uid"]}, "status": {"phase": "Running"}});
    bed.node_a
        .patch(&status_path("s0"), MERGE, &body)
        .await
        .expect(200, None);
}

both!(fact_4_6_status_of_a_missing_pod);
async fn fact_4_6_status_of_a_missing_pod(b: Backend) {
    let bed = Bed::new(b).await;
    let r = bed
        .node_a
        .patch(
            &status_path("nonexistent"),
            MERGE,
            &json!({"status": {"phase": "Running"}}),
        )
        .await;
    expect_status(&r, 404, "NotFound", "pods \"nonexistent\" not found");
}

both!(fact_4_7_phase_transitions_are_not_validated);
async fn fact_4_7_phase_transitions_are_not_validated(b: Backend) {
    let bed = Bed::new(b).await;
    bed.pod("s0", Some("node-a")).await;
    let steps = [
        "Succeeded",
        "Running",
        "Succeeded",
        "Failed",
        "Pending",
        "Succeeded",
        "Bogus",
    ];
    for (i, phase) in steps.iter().enumerate() {
        let c = if i % 2 == 0 { &bed.node_a } else { &bed.admin };
        let r = c
            .patch(
                &status_path("s0"),
                MERGE,
                &json!({"status": {"phase": phase}}),
            )
            .await;
        r.expect(200, None);
        assert_eq!(bed.stored("s0").await.unwrap()["status"]["phase"], *phase);
    }
}

both!(fact_4_8_conditions_are_stored_as_sent);
async fn fact_4_8_conditions_are_stored_as_sent(b: Backend) {
    let bed = Bed::new(b).await;
    bed.running("s0").await;
    let cond = json!({"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet", "message": "m"});
    let r = bed
        .node_a
        .patch(
            &status_path("s0"),
            STRATEGIC,
            &json!({"status": {"conditions": [cond]}}),
        )
        .await;
    r.expect(200, None);
    let stored = bed.stored("s0").await.unwrap();
    let got = stored["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "DisruptionTarget")
        .cloned();
    // the times are rendered as Go's zero metav1.Time: null
    let mut want = cond;
    want["lastProbeTime"] = Value::Null;
    want["lastTransitionTime"] = Value::Null;
    assert_eq!(got, Some(want), "no lastTransitionTime filled in");
}

fn condition_types(pod: &Value) -> Vec<&str> {
    pod["status"]["conditions"]
        .as_array()
        .map(|l| l.iter().filter_map(|c| c["type"].as_str()).collect())
        .unwrap_or_default()
}

both!(fact_4_9_strategic_merges_conditions_merge_replaces);
async fn fact_4_9_strategic_merges_conditions_merge_replaces(b: Backend) {
    let bed = Bed::new(b).await;
    bed.running("s0").await;
    let body = |t: &str| json!({"status": {"conditions": [{"type": t, "status": "False"}]}});
    let r = bed
        .node_a
        .patch(&status_path("s0"), STRATEGIC, &body("Ready"))
        .await;
    assert_eq!(condition_types(&r.body), ["Ready"]);
    assert_eq!(
        r.body["status"]["conditions"][0]["status"], "False",
        "merged by type"
    );
    let r = bed
        .node_a
        .patch(&status_path("s0"), STRATEGIC, &body("example.com/x"))
        .await;
    // a new item comes before the server's own (the patch's order first: normalizeElementOrder)
    assert_eq!(condition_types(&r.body), ["example.com/x", "Ready"]);
    let r = bed
        .node_a
        .patch(&status_path("s0"), MERGE, &body("example.com/y"))
        .await;
    assert_eq!(
        condition_types(&r.body),
        ["example.com/y"],
        "replaced whole"
    );
}

both!(fact_4_10_fields_in_a_nodes_status_write);
async fn fact_4_10_fields_in_a_nodes_status_write(b: Backend) {
    let bed = Bed::new(b).await;
    bed.pod("s2", Some("node-a")).await;
    let refused = [
        (
            json!({"status": {"nominatedNodeName": "node-b"}}),
            422,
            "Invalid",
            "Pod \"s2\" is invalid: status.nominatedNodeName: Forbidden: may not be set on pods that are already bound to a node",
        ),
        (
            json!({"status": {"qosClass": "Guaranteed"}}),
            422,
            "Invalid",
            "Pod \"s2\" is invalid: status.qosClass: Invalid value: \"Guaranteed\": field is immutable",
        ),
        (
            json!({"status": {"resourceClaimStatuses": [{"name": "c", "resourceClaimName": "c"}]}}),
            403,
            "Forbidden",
            "pods \"s2\" is forbidden: node \"node-a\" cannot update resource claim statues",
        ),
        (
            json!({"metadata": {"labels": {"x": "y"}}}),
            403,
            "Forbidden",
            "pods \"s2\" is forbidden: node \"node-a\" cannot update labels through pod status",
        ),
        (
            json!({"status": {"podIP": "notanip"}}),
            422,
            "Invalid",
            "Pod \"s2\" is invalid: status.podIPs[0]: Invalid value: \"notanip\": must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)",
        ),
    ];
    let before = bed.stored("s2").await.unwrap();
    for (body, code, reason, msg) in refused {
        expect_status(
            &bed.node_a.patch(&status_path("s2"), MERGE, &body).await,
            code,
            reason,
            msg,
        );
    }
    assert_eq!(rv(&bed.stored("s2").await.unwrap()), rv(&before));
    let r = bed
        .node_a
        .patch(
            &status_path("s2"),
            MERGE,
            &json!({"spec": {"nodeName": "node-b"}}),
        )
        .await;
    r.expect(200, None);
    assert_eq!(r.body["spec"]["nodeName"], "node-a", "spec ignored");
    let statuses = json!([{"name": "c", "image": "busybox", "imageID": "", "ready": false, "restartCount": 0, "state": {"waiting": {"reason": "ContainerCreating"}}, "allocatedResources": {"cpu": "100m"}},
        {"name": "unknown", "image": "x", "imageID": "", "ready": true, "restartCount": 3, "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]);
    let sent = json!({"hostIP": "10.0.0.7", "startTime": "2026-01-01T00:00:00Z", "observedGeneration": 99, "containerStatuses": statuses});
    let r = bed
        .node_a
        .patch(&status_path("s2"), MERGE, &json!({"status": sent}))
        .await;
    r.expect(200, None);
    for k in ["hostIP", "startTime", "observedGeneration"] {
        assert_eq!(r.body["status"][k], sent[k], "{k}");
    }
    // as sent, with the empty `lastState` Go renders for a zero ContainerState
    let mut statuses = statuses;
    for s in statuses.as_array_mut().unwrap() {
        s["lastState"] = json!({});
    }
    assert_eq!(r.body["status"]["containerStatuses"], statuses);
    let bogus = json!({"status": {"bogusField": "x", "message": "b"}});
    let r = bed.node_a.patch(&status_path("s2"), MERGE, &bogus).await;
    r.expect(200, None);
    assert!(r.body["status"]["bogusField"].is_null() && r.body["status"]["message"] == "b");
    let warning = r.headers.get("warning").and_then(|w| w.to_str().ok());
    assert_eq!(
        warning,
        Some("299 - \"unknown field \\\"status.bogusField\\\"\"")
    );
    let r = bed
        .node_a
        .patch(
            &format!("{}?fieldValidation=Strict", status_path("s2")),
            MERGE,
            &bogus,
        )
        .await;
    r.expect(422, None);
    assert!(
        r.message()
            .ends_with("strict decoding error: unknown field \"status.bogusField\""),
        "{:#}",
        r.body
    );
}
