//! Section 6 of the facts: the Eviction subresource and PodDisruptionBudgets (6.1–6.14). PDBs
//! are created by the admin over HTTP and their status written through `/status`, as on the
//! measured server (no disruption controller).

use super::*;

const PDBS: &str = "/apis/policy/v1/namespaces/default/poddisruptionbudgets";
const VIOLATION: &str = "Cannot evict pod as it would violate the pod's disruption budget.";
const ZERO_UID: &str = "00000000-0000-0000-0000-000000000000";

/// `POST …/pods/NAME/eviction` with the facts' body, and `deleteOptions` if given.
async fn evict(c: &Client, name: &str, delete_options: Option<Value>) -> Resp {
    let mut body = json!({"apiVersion": "policy/v1", "kind": "Eviction",
        "metadata": {"name": name, "namespace": "default"}});
    if let Some(o) = delete_options {
        body["deleteOptions"] = o;
    }
    c.post(&format!("{}/eviction", pod_path(name)), &body).await
}

/// A PDB's status as a disruption controller would have written it (`observedGeneration: 1`).
fn budget(allowed: i64, current: i64, desired: i64) -> Value {
    json!({"disruptionsAllowed": allowed, "currentHealthy": current, "desiredHealthy": desired,
        "expectedPods": 1, "observedGeneration": 1})
}

/// Admin creates PDB `name` with `selector`, then (if given) merge-patches its `/status`.
async fn pdb(bed: &Bed, name: &str, selector: Value, status: Option<Value>) -> Value {
    let body = json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": name}, "spec": {"minAvailable": 1, "selector": selector}});
    let r = bed.admin.post(PDBS, &body).await;
    r.expect(201, None);
    let Some(st) = status else { return r.body };
    let path = format!("{PDBS}/{name}/status");
    let r = bed.admin.patch(&path, MERGE, &json!({"status": st})).await;
    r.expect(200, None);
    r.body
}

async fn stored_pdb(bed: &Bed, name: &str) -> Value {
    let r = bed.admin.get(&format!("{PDBS}/{name}")).await;
    r.expect(200, None);
    r.body
}

/// The PDB is still `want` (not consulted, or its budget not consumed).
async fn expect_pdb(bed: &Bed, name: &str, want: &Value) {
    assert_eq!(&stored_pdb(bed, name).await, want, "PDB {name} changed");
}

/// A PDB selecting `app: <app>` with `status`.
async fn pdb_app(bed: &Bed, name: &str, app: &str, status: Value) -> Value {
    pdb(
        bed,
        name,
        json!({"matchLabels": {"app": app}}),
        Some(status),
    )
    .await
}

/// The cause of fact 6.4's 429.
fn needs(pdb: &str, desired: i64, current: i64) -> String {
    format!("The disruption budget {pdb} needs {desired} healthy pods and has {current} currently")
}

/// Pod `name` bound to node-a with `labels`, then set `phase` by node-a (Ready as given).
async fn pod_in(bed: &Bed, name: &str, labels: Value, phase: &str, ready: bool) -> Value {
    let mut body = pod_body(name, Some("node-a"));
    body["metadata"]["labels"] = labels;
    let created = bed.create(body).await;
    if phase == "Pending" {
        return created;
    }
    let ready = if ready { "True" } else { "False" };
    let st =
        json!({"status": {"phase": phase, "conditions": [{"type": "Ready", "status": ready}]}});
    let r = bed
        .node_a
        .patch(&format!("{}/status", pod_path(name)), STRATEGIC, &st)
        .await;
    r.expect(200, None);
    r.body
}

#[track_caller]
fn expect_success(r: &Resp) {
    let want = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201});
    assert_eq!((r.code, &r.body), (201, &want));
}

/// A 429 with one `DisruptionBudget` cause; `Retry-After` (header and details) only if `retry`.
#[track_caller]
fn expect_429(r: &Resp, cause: &str, retry: Option<u64>) {
    r.expect(429, Some(VIOLATION));
    assert_eq!(r.reason(), "TooManyRequests");
    let causes = json!([{"reason": "DisruptionBudget", "message": cause}]);
    assert_eq!(r.body["details"]["causes"], causes, "{:#}", r.body);
    let header = r
        .headers
        .get("retry-after")
        .map(|h| h.to_str().unwrap().to_owned());
    assert_eq!(header, retry.map(|s| s.to_string()));
    assert_eq!(r.body["details"]["retryAfterSeconds"].as_u64(), retry);
}

fn disruption_target(pod: &Value) -> Option<&Value> {
    pod["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "DisruptionTarget")
}

/// The condition of fact 6.2, exactly, with `lastTransitionTime` = now (and, as every pod
/// condition the server renders, `lastProbeTime: null`).
#[track_caller]
fn expect_disruption_target(pod: &Value) {
    let c = disruption_target(pod).unwrap_or_else(|| panic!("no DisruptionTarget: {pod:#}"));
    let mut want = json!({"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI",
        "message": "Eviction API: evicting", "lastProbeTime": null});
    want["lastTransitionTime"] = c["lastTransitionTime"].clone();
    assert_eq!(c, &want);
    assert!((secs(&c["lastTransitionTime"]) - now()).abs() <= 2, "{c}");
}

/// A graceful delete with `grace` seconds, `dt` = now + grace.
#[track_caller]
fn expect_graceful(pod: &Value, grace: i64) {
    assert_eq!(
        pod["metadata"]["deletionGracePeriodSeconds"], grace,
        "{pod:#}"
    );
    let dt = secs(&pod["metadata"]["deletionTimestamp"]);
    assert!((dt - (now() + grace)).abs() <= 2, "dt {dt}, now {}", now());
}

/// The pod was evicted: `DisruptionTarget` and a graceful delete of `grace` s.
async fn expect_evicted(bed: &Bed, name: &str, grace: i64) {
    let pod = bed
        .stored(name)
        .await
        .expect("a graceful delete keeps the pod");
    expect_disruption_target(&pod);
    expect_graceful(&pod, grace);
}

/// The pod is as it was: same resourceVersion, no condition, no `dt`.
async fn expect_untouched(bed: &Bed, before: &Value) {
    let name = before["metadata"]["name"].as_str().unwrap();
    let after = bed.stored(name).await.expect("the pod is still there");
    assert_eq!(rv(&after), rv(before), "{after:#}");
    assert!(
        disruption_target(&after).is_none() && after["metadata"]["deletionTimestamp"].is_null()
    );
}

both!(fact_6_1_eviction_without_pdb_is_a_graceful_delete);
async fn fact_6_1_eviction_without_pdb_is_a_graceful_delete(b: Backend) {
    for phase in ["Pending", "Running"] {
        let bed = Bed::new(b).await;
        pod_in(&bed, "e1", json!({"app": "e1"}), phase, true).await;
        expect_success(&evict(&bed.node_a, "e1", None).await);
        expect_evicted(&bed, "e1", 30).await;
        tokio::time::sleep(Duration::from_millis(1100)).await;
        assert!(bed.stored("e1").await.is_some(), "{phase}: still there");
        let r = bed
            .node_a
            .delete(&pod_path("e1"), Some(&json!({"gracePeriodSeconds": 0})))
            .await;
        r.expect(200, None);
        assert!(
            bed.stored("e1").await.is_none(),
            "{phase}: gone after grace 0"
        );
    }
}

both!(fact_6_2_disruption_target_then_delete_two_modified);
async fn fact_6_2_disruption_target_then_delete_two_modified(b: Backend) {
    let bed = Bed::new(b).await;
    bed.running("e2").await;
    let mut w = bed.watch_pods().await;
    let mark = bed.write_mark();
    expect_success(&evict(&bed.node_a, "e2", None).await);
    let (t1, first) = w.expect_next().await;
    assert_eq!(t1, "MODIFIED");
    expect_disruption_target(&first);
    assert!(
        first["metadata"]["deletionTimestamp"].is_null(),
        "{first:#}"
    );
    assert!(first["metadata"]["deletionGracePeriodSeconds"].is_null());
    let (t2, second) = w.expect_next().await;
    assert_eq!(t2, "MODIFIED");
    assert_eq!(rv(&second), rv(&first) + 1);
    expect_graceful(&second, 30);
    assert_eq!(disruption_target(&second), disruption_target(&first));
    w.expect_quiet(Duration::from_millis(500)).await;
    // one request recorded: the eviction; the inner writes are not requests
    let new = bed.writes_since(&mark, |w| !w.is_empty()).await;
    assert_eq!(new.len(), 1, "{new:#?}");
    assert!(
        new[0].method == "POST" && new[0].path.ends_with("/e2/eviction") && new[0].code == 201,
        "{new:#?}"
    );
}

both!(fact_6_3_pdb_not_consulted_for_pending_succeeded_failed);
async fn fact_6_3_pdb_not_consulted_for_pending_succeeded_failed(b: Backend) {
    let bed = Bed::new(b).await;
    // no disruption allowed, and none healthy: no way through the budget (6.4, 6.12)
    let sel = json!({"matchLabels": {"group": "e3"}});
    let guard = pdb(&bed, "pdb-e3", sel, Some(budget(0, 0, 1))).await;
    for (name, phase, deleted) in [
        ("e3p", "Pending", false),
        ("e3s", "Succeeded", true),
        ("e3f", "Failed", true),
    ] {
        pod_in(&bed, name, json!({"group": "e3"}), phase, false).await;
        expect_success(&evict(&bed.node_a, name, None).await);
        match bed.stored(name).await {
            None => assert!(deleted, "{phase}: deleted"),
            Some(p) => {
                assert!(!deleted, "{phase} should be deleted at once: {p:#}");
                expect_evicted(&bed, name, 30).await;
            }
        }
    }
    expect_pdb(&bed, "pdb-e3", &guard).await;
}

both!(fact_6_4_no_disruption_allowed_is_429_without_retry_after);
async fn fact_6_4_no_disruption_allowed_is_429_without_retry_after(b: Backend) {
    let bed = Bed::new(b).await;
    let pod = bed.running("r1").await;
    let guard = pdb_app(&bed, "pdb-r1", "r1", budget(0, 1, 1)).await;
    let mut w = bed.watch_pods().await;
    let dry_run = Some(json!({"dryRun": ["All"]}));
    for (who, opts) in [
        (&bed.node_a, None),
        (&bed.admin, None),
        (&bed.node_a, dry_run),
    ] {
        let r = evict(who, "r1", opts).await;
        expect_429(&r, &needs("pdb-r1", 1, 1), None);
    }
    w.expect_quiet(Duration::from_millis(300)).await;
    expect_untouched(&bed, &pod).await;
    expect_pdb(&bed, "pdb-r1", &guard).await;
}

both!(fact_6_5_allowed_eviction_consumes_the_budget);
async fn fact_6_5_allowed_eviction_consumes_the_budget(b: Backend) {
    let bed = Bed::new(b).await;
    bed.running("r2").await;
    bed.running("r2b").await;
    let sel =
        json!({"matchExpressions": [{"key": "app", "operator": "In", "values": ["r2", "r2b"]}]});
    let before = pdb(&bed, "pdb-r2", sel, Some(budget(1, 1, 1))).await;
    let path = format!("{PDBS}?watch=1&resourceVersion={}", rv(&before));
    let mut pdb_watch = bed.admin.watch(&path).await.expect("a PDB watch");
    expect_success(&evict(&bed.node_a, "r2", None).await);
    expect_evicted(&bed, "r2", 30).await;
    let (t, after) = pdb_watch.expect_next().await;
    assert_eq!(t, "MODIFIED");
    pdb_watch.expect_quiet(Duration::from_millis(300)).await;
    expect_pdb(&bed, "pdb-r2", &after).await;
    let st = &after["status"];
    assert_eq!(st["disruptionsAllowed"], 0);
    let unchanged = [
        "currentHealthy",
        "desiredHealthy",
        "expectedPods",
        "observedGeneration",
    ];
    for k in unchanged {
        assert_eq!(st[k], before["status"][k], "{k} unchanged");
    }
    let disrupted = st["disruptedPods"].as_object().expect("disruptedPods");
    assert_eq!(disrupted.keys().collect::<Vec<_>>(), ["r2"]);
    // a metav1.Time: whole seconds, now
    assert_eq!(
        disrupted["r2"].as_str().map(str::len),
        Some(20),
        "{disrupted:?}"
    );
    assert!((secs(&disrupted["r2"]) - now()).abs() <= 2);
    let conds = st["conditions"].as_array().expect("conditions");
    assert_eq!(conds.len(), 1, "{conds:#?}");
    let want = json!({"type": "DisruptionAllowed", "status": "False", "observedGeneration": 1,
        "reason": "InsufficientPods", "message": ""});
    for (k, v) in want.as_object().unwrap() {
        assert_eq!(&conds[0][k], v, "condition {k}");
    }
    let r = evict(&bed.node_a, "r2b", None).await;
    expect_429(&r, &needs("pdb-r2", 1, 1), None);
}

both!(fact_6_6_two_pdbs_is_500_without_reason);
async fn fact_6_6_two_pdbs_is_500_without_reason(b: Backend) {
    let msg = "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.";
    let expr = |op: &str, key: &str, values: &[&str]| json!({"matchExpressions": [{"key": key, "operator": op, "values": values}]});
    // the second PDB's selector, and whether it selects the pod (labels `app: r6`)
    let cases = [
        (
            json!({"matchExpressions": [{"key": "app", "operator": "Exists"}]}),
            true,
        ),
        (expr("In", "app", &["r6", "x"]), true),
        (expr("NotIn", "app", &["x"]), true),
        (
            json!({"matchExpressions": [{"key": "zone", "operator": "DoesNotExist"}]}),
            true,
        ),
        (expr("NotIn", "app", &["r6"]), false),
        (json!({"matchLabels": {"app": "x"}}), false),
        // policy/v1: an empty selector selects every pod of the namespace
        (json!({}), true),
    ];
    for (selector, selects) in cases {
        let bed = Bed::new(b).await;
        let pod = bed.running("r6").await;
        let a = pdb_app(&bed, "pdb-r6a", "r6", budget(1, 1, 1)).await;
        let second = pdb(&bed, "pdb-r6b", selector.clone(), Some(budget(1, 1, 1))).await;
        let r = evict(&bed.node_a, "r6", None).await;
        let want = if selects { 500 } else { 201 };
        assert_eq!(
            r.code, want,
            "second PDB selecting {selector}: {:#}",
            r.body
        );
        if !selects {
            expect_success(&r);
            expect_pdb(&bed, "pdb-r6b", &second).await;
            continue;
        }
        r.expect(500, Some(msg));
        assert!(r.body.get("reason").is_none(), "{:#}", r.body);
        assert_eq!(
            (&r.body["status"], &r.body["code"]),
            (&json!("Failure"), &json!(500))
        );
        expect_untouched(&bed, &pod).await;
        expect_pdb(&bed, "pdb-r6a", &a).await;
        expect_pdb(&bed, "pdb-r6b", &second).await;
    }
}

both!(fact_6_7_delete_options_grace_period);
async fn fact_6_7_delete_options_grace_period(b: Backend) {
    let bed = Bed::new(b).await;
    bed.running("r7").await;
    expect_success(&evict(&bed.node_a, "r7", Some(json!({"gracePeriodSeconds": 7}))).await);
    expect_evicted(&bed, "r7", 7).await;
}

both!(fact_6_8_preconditions_checked_after_the_budget_is_consumed);
async fn fact_6_8_preconditions_checked_after_the_budget_is_consumed(b: Backend) {
    let bed = Bed::new(b).await;
    let conflict = |name: &str, uid: &str| {
        format!(
            "Operation cannot be fulfilled on Pod \"{name}\": the UID in the precondition ({ZERO_UID}) does not match the UID in record ({uid}). The object might have been deleted and then recreated"
        )
    };
    let wrong = Some(json!({"preconditions": {"uid": ZERO_UID}}));
    // with a PDB allowing one disruption: 409, and the budget is gone
    let pod = bed.running("r5").await;
    let uid = pod["metadata"]["uid"].as_str().unwrap().to_owned();
    pdb_app(&bed, "pdb-r5", "r5", budget(1, 1, 1)).await;
    let r = evict(&bed.node_a, "r5", wrong.clone()).await;
    r.expect(409, Some(&conflict("r5", &uid)));
    assert_eq!(r.reason(), "Conflict");
    assert_eq!(r.body["details"], json!({"name": "r5", "kind": "Pod"}));
    expect_untouched(&bed, &pod).await;
    let st = stored_pdb(&bed, "pdb-r5").await["status"].clone();
    assert_eq!(st["disruptionsAllowed"], 0, "{st:#}");
    assert!(st["disruptedPods"]["r5"].is_string(), "{st:#}");
    // no PDB: the same 409, then the right uid with grace 0 evicts at once
    let pod = bed.running("r5x").await;
    let uid = pod["metadata"]["uid"].as_str().unwrap().to_owned();
    evict(&bed.node_a, "r5x", wrong)
        .await
        .expect(409, Some(&conflict("r5x", &uid)));
    expect_untouched(&bed, &pod).await;
    let right = json!({"gracePeriodSeconds": 0, "preconditions": {"uid": uid}});
    expect_success(&evict(&bed.node_a, "r5x", Some(right)).await);
    assert!(bed.stored("r5x").await.is_none());
}

both!(fact_6_9_node_evicts_only_its_own_pods);
async fn fact_6_9_node_evicts_only_its_own_pods(b: Backend) {
    let bed = Bed::new(b).await;
    let pod = bed.pod("e6", Some("node-b")).await;
    let r = evict(&bed.node_a, "e6", None).await;
    let msg = "pods \"e6\" is forbidden: node node-a can only evict pods with spec.nodeName set to itself";
    r.expect(403, Some(msg));
    assert_eq!(r.reason(), "Forbidden");
    assert_eq!(r.body["details"], json!({"name": "e6", "kind": "pods"}));
    expect_untouched(&bed, &pod).await;
    let r = evict(&bed.node_a, "nonexist", None).await;
    r.expect(404, Some("pod \"nonexist\" not found"));
    assert_eq!(r.reason(), "NotFound");
    assert_eq!(
        r.body["details"],
        json!({"name": "nonexist", "kind": "pod"})
    );
}

both!(fact_6_10_terminating_pod_ignores_the_pdb);
async fn fact_6_10_terminating_pod_ignores_the_pdb(b: Backend) {
    let bed = Bed::new(b).await;
    bed.running("r10").await;
    let guard = pdb_app(&bed, "pdb-r10", "r10", budget(0, 1, 1)).await;
    let deleted = bed.admin.delete(&pod_path("r10"), None).await;
    deleted.expect(200, None);
    let mut w = bed.watch_pods().await;
    expect_success(&evict(&bed.node_a, "r10", None).await);
    let (t, pod) = w.expect_next().await;
    assert_eq!(t, "MODIFIED");
    expect_disruption_target(&pod);
    for k in ["deletionTimestamp", "deletionGracePeriodSeconds"] {
        assert_eq!(
            pod["metadata"][k], deleted.body["metadata"][k],
            "{k} unchanged"
        );
    }
    w.expect_quiet(Duration::from_millis(300)).await;
    expect_success(&evict(&bed.node_a, "r10", Some(json!({"gracePeriodSeconds": 0}))).await);
    let (t, last) = w.expect_next().await;
    assert_eq!(
        (t.as_str(), &last["metadata"]["deletionGracePeriodSeconds"]),
        ("MODIFIED", &json!(0))
    );
    assert_eq!(w.expect_next().await.0, "DELETED");
    assert!(bed.stored("r10").await.is_none());
    expect_pdb(&bed, "pdb-r10", &guard).await;
}

both!(fact_6_11_pdb_not_yet_observed_is_429_retry_after_10);
async fn fact_6_11_pdb_not_yet_observed_is_429_retry_after_10(b: Backend) {
    let mut unobserved = budget(1, 1, 1);
    unobserved["observedGeneration"] = 0.into();
    for case in [
        "observedGeneration 0 < 1",
        "1 < 2 after a spec edit",
        "fresh",
    ] {
        let bed = Bed::new(b).await;
        let pod = bed.running("r8").await;
        let sel = json!({"matchLabels": {"app": "r8"}});
        let status = match case {
            "fresh" => None,
            "observedGeneration 0 < 1" => Some(unobserved.clone()),
            _ => Some(budget(1, 1, 1)),
        };
        let mut guard = pdb(&bed, "pdb-r8", sel, status).await;
        if case.contains("spec edit") {
            let edit = json!({"spec": {"minAvailable": 2}});
            let r = bed
                .admin
                .patch(&format!("{PDBS}/pdb-r8"), MERGE, &edit)
                .await;
            r.expect(200, None);
            assert_eq!(r.body["metadata"]["generation"], 2, "{case}");
            guard = r.body;
        }
        let r = evict(&bed.node_a, "r8", None).await;
        expect_429(
            &r,
            "The disruption budget pdb-r8 is still being processed by the server.",
            Some(10),
        );
        expect_untouched(&bed, &pod).await;
        expect_pdb(&bed, "pdb-r8", &guard).await;
    }
}

both!(fact_6_12_not_ready_pod_counts_current_healthy);
async fn fact_6_12_not_ready_pod_counts_current_healthy(b: Backend) {
    for (current, evicted) in [(1, true), (0, false)] {
        let bed = Bed::new(b).await;
        let pod = pod_in(&bed, "r12", json!({"app": "r12"}), "Running", false).await;
        let guard = pdb_app(&bed, "pdb-r12", "r12", budget(0, current, 1)).await;
        let r = evict(&bed.node_a, "r12", None).await;
        if evicted {
            expect_success(&r);
            expect_evicted(&bed, "r12", 30).await;
        } else {
            expect_429(&r, &needs("pdb-r12", 1, 0), None);
            expect_untouched(&bed, &pod).await;
        }
        expect_pdb(&bed, "pdb-r12", &guard).await;
    }
}

both!(fact_6_13_new_pdb_status_and_negative_budget);
async fn fact_6_13_new_pdb_status_and_negative_budget(b: Backend) {
    let bed = Bed::new(b).await;
    let sel = json!({"matchLabels": {"app": "e11"}});
    let created = pdb(&bed, "pdb-e11", sel, None).await;
    let zeros = json!({"disruptionsAllowed": 0, "currentHealthy": 0, "desiredHealthy": 0, "expectedPods": 0});
    assert_eq!(created["status"], zeros);
    assert_eq!(created["metadata"]["generation"], 1);
    expect_pdb(&bed, "pdb-e11", &created).await;
    let list = bed.admin.get(PDBS).await;
    list.expect(200, None);
    assert_eq!(
        list.body["items"][0]["metadata"]["name"], "pdb-e11",
        "{:#}",
        list.body
    );
    let msg = "PodDisruptionBudget.policy \"pdb-e11\" is invalid: status.disruptionsAllowed: Invalid value: -1: must be greater than or equal to 0";
    let path = format!("{PDBS}/pdb-e11/status");
    let mut put = created.clone();
    put["status"]["disruptionsAllowed"] = (-1).into();
    let by_patch = json!({"status": {"disruptionsAllowed": -1}});
    for r in [
        bed.admin.put(&path, &put).await,
        bed.admin.patch(&path, MERGE, &by_patch).await,
    ] {
        r.expect(422, Some(msg));
        assert_eq!(r.reason(), "Invalid");
        let cause = &r.body["details"]["causes"][0];
        assert_eq!(cause["field"], "status.disruptionsAllowed", "{:#}", r.body);
    }
    expect_pdb(&bed, "pdb-e11", &created).await;
}

both!(fact_6_14_eviction_body_name_version_namespace);
async fn fact_6_14_eviction_body_name_version_namespace(b: Backend) {
    let bed = Bed::new(b).await;
    let mismatch = json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "other", "namespace": "default"}});
    let beta = json!({"apiVersion": "policy/v1beta1", "kind": "Eviction", "metadata": {"name": "e14b", "namespace": "default"}});
    let no_ns =
        json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "e14c"}});
    for (name, body, ok) in [
        ("e14a", mismatch, false),
        ("e14b", beta, true),
        ("e14c", no_ns, true),
    ] {
        let pod = bed.running(name).await;
        let r = bed
            .node_a
            .post(&format!("{}/eviction", pod_path(name)), &body)
            .await;
        if ok {
            expect_success(&r);
            expect_evicted(&bed, name, 30).await;
        } else {
            r.expect(
                400,
                Some("name in URL does not match name in Eviction object"),
            );
            assert_eq!(r.reason(), "BadRequest");
            expect_untouched(&bed, &pod).await;
        }
    }
}
