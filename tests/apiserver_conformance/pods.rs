//! Facts of sections 1 (graceful DELETE) and 2 (grace 0, preconditions, finalizers), and the
//! pod helpers the other pod test files share (`force_delete.rs`: section 3, `mirror.rs`:
//! section 5, `status.rs`: section 4, `other.rs`: section 11).

use super::*;

/// How long a watch must stay silent to count as "no event".
pub const QUIET: Duration = Duration::from_millis(1200);

/// `metadata.deletionTimestamp` as Unix seconds, checked to be in whole seconds.
#[track_caller]
pub fn dt(pod: &Value) -> i64 {
    let t = &pod["metadata"]["deletionTimestamp"];
    let s = t
        .as_str()
        .unwrap_or_else(|| panic!("no deletionTimestamp: {pod:#}"));
    assert!(s.len() == 20 && s.ends_with('Z'), "not whole seconds: {s}");
    secs(t)
}

pub fn dgps(pod: &Value) -> &Value {
    &pod["metadata"]["deletionGracePeriodSeconds"]
}

pub fn uid(pod: &Value) -> String {
    pod["metadata"]["uid"].as_str().expect("a uid").to_owned()
}

pub fn name(obj: &Value) -> &str {
    obj["metadata"]["name"].as_str().unwrap_or("")
}

pub fn status_path(name: &str) -> String {
    format!("{}/status", pod_path(name))
}

/// The code, reason and message, verbatim.
#[track_caller]
pub fn expect_status(r: &Resp, code: u16, reason: &str, message: &str) {
    r.expect(code, Some(message));
    assert_eq!(r.reason(), reason, "answer: {:#}", r.body);
}

/// The next event: (type, pod name, object).
pub async fn next(w: &mut Watch) -> (String, String, Value) {
    let (t, o) = w.expect_next().await;
    (t, name(&o).to_owned(), o)
}

/// A node's pod watch (`spec.nodeName=<node>`) from now.
pub async fn node_watch(c: &Client, node: &str) -> Watch {
    let q = format!("fieldSelector=spec.nodeName%3D{node}");
    let list = c.get(&format!("/api/v1/pods?{q}")).await;
    assert_eq!(list.code, 200, "{:#}", list.body);
    let rv = list.rv();
    c.watch(&format!("/api/v1/pods?watch=1&{q}&resourceVersion={rv}"))
        .await
        .expect("node watch")
}

/// A mirror pod of `node` (bound to `bound`), with `owner` as its owner reference.
pub fn mirror(name: &str, bound: Option<&str>, owner: Option<Value>) -> Value {
    let mut p = pod_body(name, bound);
    p["metadata"]["annotations"] = json!({"kubernetes.io/config.mirror": "0123abcd"});
    if let Some(o) = owner {
        p["metadata"]["ownerReferences"] = json!([o]);
    }
    p
}

/// The controller owner reference to Node `node` with `uid`.
pub fn node_owner(node: &str, uid: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid, "controller": true})
}

pub async fn node_uid(bed: &Bed, node: &str) -> String {
    uid(&bed.admin.get(&format!("/api/v1/nodes/{node}")).await.body)
}

/// node-a sets the phase of its pod `name`.
pub async fn set_phase(bed: &Bed, name: &str, phase: &str) -> Value {
    let r = bed
        .node_a
        .patch(
            &status_path(name),
            MERGE,
            &json!({"status": {"phase": phase}}),
        )
        .await;
    r.expect(200, None);
    r.body
}

pub(crate) async fn delete(c: &Client, name: &str, opts: Value) -> Resp {
    c.delete(&pod_path(name), Some(&opts)).await
}

both!(fact_1_1_graceful_delete_answers_the_pod);
async fn fact_1_1_graceful_delete_answers_the_pod(b: Backend) {
    let bed = Bed::new(b).await;
    bed.pod("g1", Some("node-a")).await;
    let mut w = bed.watch_pods().await;
    let t0 = now();
    let r = bed.admin.delete(&pod_path("g1"), None).await;
    let t1 = now();
    r.expect(200, None);
    assert_eq!(r.body["kind"], "Pod", "{:#}", r.body);
    assert!((t0 + 30..=t1 + 30).contains(&dt(&r.body)), "{:#}", r.body);
    assert_eq!(dgps(&r.body), 30);
    assert_eq!(r.body["status"]["phase"], "Pending");
    let (t, n, o) = next(&mut w).await;
    assert_eq!((t.as_str(), n.as_str(), rv(&o)), ("MODIFIED", "g1", r.rv()));
    assert_eq!(dt(&o), dt(&r.body));
    w.expect_quiet(QUIET).await;
    assert_eq!(
        bed.stored("g1").await.expect("still there")["metadata"],
        r.body["metadata"]
    );
}

both!(fact_1_2_shorter_grace_counts_from_the_first_delete);
async fn fact_1_2_shorter_grace_counts_from_the_first_delete(b: Backend) {
    let bed = Bed::new(b).await;
    bed.pod("g1", Some("node-a")).await;
    let first = bed.admin.delete(&pod_path("g1"), None).await;
    first.expect(200, None);
    // "now + 10" would come out at least a second later than "start + 10"
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let mut w = bed.watch_pods().await;
    let r = delete(&bed.admin, "g1", json!({"gracePeriodSeconds": 10})).await;
    r.expect(200, None);
    assert_eq!(dt(&r.body), dt(&first.body) - 30 + 10, "{:#}", r.body);
    assert_eq!(dgps(&r.body), 10);
    assert!(r.rv() > first.rv());
    let (t, _, o) = next(&mut w).await;
    assert_eq!(
        (t.as_str(), rv(&o), dt(&o)),
        ("MODIFIED", r.rv(), dt(&r.body))
    );
}

both!(fact_1_3_longer_or_equal_grace_changes_nothing);
async fn fact_1_3_longer_or_equal_grace_changes_nothing(b: Backend) {
    let bed = Bed::new(b).await;
    bed.pod("g1", Some("node-a")).await;
    bed.admin
        .delete(&pod_path("g1"), None)
        .await
        .expect(200, None);
    let short = delete(&bed.admin, "g1", json!({"gracePeriodSeconds": 10})).await;
    short.expect(200, None);
    let mut w = bed.watch_pods().await;
    let longer = delete(&bed.admin, "g1", json!({"gracePeriodSeconds": 20})).await;
    let same = bed
        .admin
        .delete(&format!("{}?gracePeriodSeconds=10", pod_path("g1")), None)
        .await;
    for r in [&longer, &same] {
        r.expect(200, None);
        assert_eq!(r.body["metadata"], short.body["metadata"], "unchanged");
    }
    w.expect_quiet(QUIET).await;
    assert_eq!(
        bed.stored("g1").await.expect("there").to_string(),
        short.body.to_string()
    );
}

both!(fact_1_4_grace_as_query_string);
async fn fact_1_4_grace_as_query_string(b: Backend) {
    let bed = Bed::new(b).await;
    bed.pod("g1", Some("node-a")).await;
    let first = bed.admin.delete(&pod_path("g1"), None).await;
    // "now + 5" would come out at least a second later than "start + 5"
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let mut w = bed.watch_pods().await;
    let r = bed
        .admin
        .delete(&format!("{}?gracePeriodSeconds=5", pod_path("g1")), None)
        .await;
    r.expect(200, None);
    assert_eq!(
        (dt(&r.body), dgps(&r.body)),
        (dt(&first.body) - 25, &json!(5))
    );
    let (t, _, o) = next(&mut w).await;
    assert_eq!((t.as_str(), dgps(&o)), ("MODIFIED", &json!(5)));
}

both!(fact_1_5_grace_zero_puts_dt_at_that_request);
async fn fact_1_5_grace_zero_puts_dt_at_that_request(b: Backend) {
    let bed = Bed::new(b).await;
    // (pod, with a finalizer, Succeeded before the grace-0 delete)
    let cases = [
        ("z-plain", false, false),
        ("z-fin", true, false),
        ("z-done", false, true),
    ];
    for (name, fin, done) in cases {
        let mut body = pod_body(name, Some("node-a"));
        if fin {
            body["metadata"]["finalizers"] = json!(["example.com/hold"]);
        }
        bed.create(body).await;
        bed.admin
            .delete(&pod_path(name), None)
            .await
            .expect(200, None);
        if done {
            set_phase(&bed, name, "Succeeded").await;
        }
    }
    // "first delete's start + 0" would be at least two seconds before the grace-0 request
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let mut w = bed.watch_pods().await;
    for (name, fin, _) in cases {
        let t0 = now();
        let r = delete(&bed.node_a, name, json!({"gracePeriodSeconds": 0})).await;
        let t1 = now();
        r.expect(200, None);
        assert!((t0..=t1).contains(&dt(&r.body)), "{name}: {:#}", r.body);
        assert_eq!(dgps(&r.body), 0, "{name}");
        let (t, n, o) = next(&mut w).await;
        assert_eq!(
            (t.as_str(), n.as_str(), dt(&o), dgps(&o)),
            ("MODIFIED", name, dt(&r.body), &json!(0))
        );
        if fin {
            assert_eq!(
                dt(&bed.stored(name).await.expect("held by its finalizer")),
                dt(&o)
            );
        } else {
            let (t, n, d) = next(&mut w).await;
            assert_eq!(
                (t.as_str(), n.as_str(), rv(&d)),
                ("DELETED", name, rv(&o) + 1)
            );
            assert!(bed.stored(name).await.is_none());
        }
    }
    w.expect_quiet(QUIET).await;
}

both!(fact_1_6_the_server_never_removes_a_pod_when_dt_passes);
async fn fact_1_6_the_server_never_removes_a_pod_when_dt_passes(b: Backend) {
    let bed = Bed::new(b).await;
    bed.pod("short", Some("node-a")).await;
    bed.pod("done", Some("node-a")).await;
    delete(&bed.admin, "short", json!({"gracePeriodSeconds": 1}))
        .await
        .expect(200, None);
    bed.admin
        .delete(&pod_path("done"), None)
        .await
        .expect(200, None);
    set_phase(&bed, "done", "Succeeded").await;
    let before = [
        bed.stored("short").await.unwrap(),
        bed.stored("done").await.unwrap(),
    ];
    tokio::time::sleep(Duration::from_millis(2500)).await;
    // only a grace-0 delete removes a terminating pod: one without a grace leaves it
    bed.admin
        .delete(&pod_path("done"), None)
        .await
        .expect(200, None);
    for b in before {
        let now = bed.stored(name(&b)).await.expect("still there");
        assert_eq!(rv(&now), rv(&b), "{now:#}");
    }
}

both!(fact_1_7_negative_grace_is_one_and_an_empty_body_is_none);
async fn fact_1_7_negative_grace_is_one_and_an_empty_body_is_none(b: Backend) {
    let bed = Bed::new(b).await;
    let cases = [
        ("n-neg", json!({"gracePeriodSeconds": -1}), 1),
        ("n-one", json!({"gracePeriodSeconds": 1}), 1),
        ("n-two", json!({"gracePeriodSeconds": 2}), 2),
        ("n-empty", json!({}), 30),
    ];
    for (name, opts, want) in cases {
        bed.pod(name, Some("node-a")).await;
        let t0 = now();
        let r = delete(&bed.admin, name, opts).await;
        let t1 = now();
        r.expect(200, None);
        assert_eq!(dgps(&r.body), want, "{name}");
        assert!(
            (t0 + want..=t1 + want).contains(&dt(&r.body)),
            "{name}: {:#}",
            r.body
        );
    }
}

both!(fact_1_8_immediate_deletion);
async fn fact_1_8_immediate_deletion(b: Backend) {
    let bed = Bed::new(b).await;
    // (pod, bound, phase set by node-a, DeleteOptions, spec grace)
    let cases = [
        ("i-unbound", None, None, None, None),
        ("i-succeeded", Some("node-a"), Some("Succeeded"), None, None),
        (
            "i-failed",
            Some("node-a"),
            Some("Failed"),
            Some(json!({"gracePeriodSeconds": 30})),
            None,
        ),
        ("i-grace0", Some("node-a"), None, None, Some(0)),
    ];
    for (name, node, phase, opts, grace) in cases {
        let mut body = pod_body(name, node);
        if let Some(g) = grace {
            body["spec"]["terminationGracePeriodSeconds"] = g.into();
        }
        bed.create(body).await;
        if let Some(p) = phase {
            set_phase(&bed, name, p).await;
        }
        let mut w = bed.watch_pods().await;
        let r = bed.admin.delete(&pod_path(name), opts.as_ref()).await;
        r.expect(200, None);
        assert_eq!(dgps(&r.body), 0, "{name}: {:#}", r.body);
        let (t, _, o) = next(&mut w).await;
        assert_eq!((t.as_str(), dgps(&o)), ("MODIFIED", &json!(0)), "{name}");
        let (t, _, d) = next(&mut w).await;
        assert_eq!((t.as_str(), rv(&d)), ("DELETED", r.rv()), "{name}");
        assert!(bed.stored(name).await.is_none(), "{name}");
    }
}

both!(fact_2_1_grace_zero_is_modified_then_deleted);
async fn fact_2_1_grace_zero_is_modified_then_deleted(b: Backend) {
    let bed = Bed::new(b).await;
    let p = bed.pod("d0", Some("node-a")).await;
    let mut w = bed.watch_pods().await;
    let t0 = now();
    let r = delete(
        &bed.node_a,
        "d0",
        json!({"gracePeriodSeconds": 0, "preconditions": {"uid": uid(&p)}}),
    )
    .await;
    let t1 = now();
    r.expect(200, None);
    assert_eq!(r.body["kind"], "Pod");
    assert!((t0..=t1).contains(&dt(&r.body)));
    assert_eq!(dgps(&r.body), 0);
    let (t, _, m) = next(&mut w).await;
    let at = std::time::Instant::now();
    assert_eq!(
        (t.as_str(), dt(&m), dgps(&m)),
        ("MODIFIED", dt(&r.body), &json!(0))
    );
    let (t, _, d) = next(&mut w).await;
    assert!(
        at.elapsed() < Duration::from_millis(500),
        "DELETED came {:?} later",
        at.elapsed()
    );
    assert_eq!((t.as_str(), rv(&d)), ("DELETED", rv(&m) + 1));
    assert_eq!(r.rv(), rv(&d));
}

both!(fact_2_2_wrong_uid_precondition);
async fn fact_2_2_wrong_uid_precondition(b: Backend) {
    let bed = Bed::new(b).await;
    let p = bed.pod("d1", Some("node-a")).await;
    let msg = format!(
        "Operation cannot be fulfilled on Pod \"d1\": the UID in the precondition (00000000-0000-0000-0000-000000000000) does not match the UID in record ({}). The object might have been deleted and then recreated",
        uid(&p)
    );
    let opts = json!({"gracePeriodSeconds": 0, "preconditions": {"uid": "00000000-0000-0000-0000-000000000000"}});
    for c in [&bed.node_a, &bed.admin] {
        let r = delete(c, "d1", opts.clone()).await;
        expect_status(&r, 409, "Conflict", &msg);
        assert_eq!(r.body["details"], json!({"name": "d1", "kind": "Pod"}));
    }
    assert_eq!(
        bed.stored("d1").await.expect("untouched").to_string(),
        p.to_string()
    );
}

both!(fact_2_3_wrong_resource_version_precondition);
async fn fact_2_3_wrong_resource_version_precondition(b: Backend) {
    let bed = Bed::new(b).await;
    let p = bed.pod("d1", Some("node-a")).await;
    let r = delete(
        &bed.admin,
        "d1",
        json!({"preconditions": {"resourceVersion": "1"}}),
    )
    .await;
    let msg = format!(
        "Operation cannot be fulfilled on Pod \"d1\": the ResourceVersion in the precondition (1) does not match the ResourceVersion in record ({}). The object might have been modified",
        rv(&p)
    );
    expect_status(&r, 409, "Conflict", &msg);
    assert_eq!(r.body["details"]["kind"], "Pod");
    assert_eq!(
        bed.stored("d1").await.expect("untouched").to_string(),
        p.to_string()
    );
}

/// Pod `name` on node-a held by the finalizer `example.com/hold`.
pub async fn held(bed: &Bed, name: &str) -> Value {
    let mut body = pod_body(name, Some("node-a"));
    body["metadata"]["finalizers"] = json!(["example.com/hold"]);
    bed.create(body).await
}

both!(fact_2_4_a_finalizer_holds_a_grace_zero_delete);
async fn fact_2_4_a_finalizer_holds_a_grace_zero_delete(b: Backend) {
    let bed = Bed::new(b).await;
    held(&bed, "f0").await;
    let mut w = bed.watch_pods().await;
    let t0 = now();
    let r = delete(&bed.admin, "f0", json!({"gracePeriodSeconds": 0})).await;
    let t1 = now();
    r.expect(200, None);
    let s = bed.stored("f0").await.expect("held");
    assert!((t0..=t1).contains(&dt(&s)), "{s:#}");
    assert_eq!(
        (dgps(&s), &s["metadata"]["finalizers"]),
        (&json!(0), &json!(["example.com/hold"]))
    );
    let (t, _, _) = next(&mut w).await;
    assert_eq!(t, "MODIFIED");
    for g in [0, 30] {
        let again = delete(&bed.admin, "f0", json!({"gracePeriodSeconds": g})).await;
        again.expect(200, None);
        assert_eq!(again.rv(), rv(&s), "grace {g}");
    }
    w.expect_quiet(QUIET).await;
    set_phase(&bed, "f0", "Failed").await;
}

both!(fact_2_5_removing_the_last_finalizer);
async fn fact_2_5_removing_the_last_finalizer(b: Backend) {
    let bed = Bed::new(b).await;
    let unhold = json!({"metadata": {"finalizers": null}});
    // dgps 0: deleted at once, the answer shows the update at the old resourceVersion
    held(&bed, "f0").await;
    let d = delete(&bed.admin, "f0", json!({"gracePeriodSeconds": 0})).await;
    let mut w = bed.watch_pods().await;
    let r = bed.admin.patch(&pod_path("f0"), MERGE, &unhold).await;
    r.expect(200, None);
    assert!(r.body["metadata"]["finalizers"].is_null(), "{:#}", r.body);
    assert_eq!(r.rv(), d.rv(), "the old resourceVersion");
    let (t, _, o) = next(&mut w).await;
    assert_eq!((t.as_str(), rv(&o)), ("DELETED", d.rv() + 1));
    assert!(bed.stored("f0").await.is_none());
    // dgps 30: only a MODIFIED, the pod stays
    held(&bed, "f1").await;
    let _ = next(&mut w).await;
    bed.admin
        .delete(&pod_path("f1"), None)
        .await
        .expect(200, None);
    let _ = next(&mut w).await;
    bed.admin
        .patch(&pod_path("f1"), MERGE, &unhold)
        .await
        .expect(200, None);
    let (t, _, o) = next(&mut w).await;
    assert_eq!((t.as_str(), dgps(&o)), ("MODIFIED", &json!(30)));
    w.expect_quiet(QUIET).await;
    assert!(bed.stored("f1").await.is_some());
}

both!(fact_2_6_propagation_policies);
async fn fact_2_6_propagation_policies(b: Backend) {
    let bed = Bed::new(b).await;
    let cases = [
        (
            "p-fg",
            json!({"propagationPolicy": "Foreground"}),
            Some("foregroundDeletion"),
        ),
        (
            "p-orphan",
            json!({"propagationPolicy": "Orphan"}),
            Some("orphan"),
        ),
        (
            "p-orphandeps",
            json!({"orphanDependents": true}),
            Some("orphan"),
        ),
        ("p-bg", json!({"propagationPolicy": "Background"}), None),
        ("p-none", json!({}), None),
    ];
    for (name, mut opts, finalizer) in cases {
        bed.pod(name, Some("node-a")).await;
        opts["gracePeriodSeconds"] = 0.into();
        delete(&bed.admin, name, opts).await.expect(200, None);
        match (finalizer, bed.stored(name).await) {
            (Some(f), Some(s)) => {
                assert_eq!(
                    (&s["metadata"]["finalizers"], dgps(&s)),
                    (&json!([f]), &json!(0)),
                    "{name}"
                );
            }
            (None, None) => {}
            (f, s) => panic!("{name}: finalizer {f:?}, stored {s:#?}"),
        }
    }
}

both!(fact_2_7_dry_run_stores_nothing);
async fn fact_2_7_dry_run_stores_nothing(b: Backend) {
    let bed = Bed::new(b).await;
    let p = bed.pod("dry", Some("node-a")).await;
    let mut w = bed.watch_pods().await;
    let t0 = now();
    let r = bed
        .admin
        .delete(
            &format!("{}?dryRun=All&gracePeriodSeconds=0", pod_path("dry")),
            None,
        )
        .await;
    let t1 = now();
    r.expect(200, None);
    assert!((t0..=t1).contains(&dt(&r.body)));
    assert_eq!(dgps(&r.body), 0);
    w.expect_quiet(QUIET).await;
    assert_eq!(
        bed.stored("dry").await.expect("still there").to_string(),
        p.to_string()
    );
}
