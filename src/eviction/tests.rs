use super::affinity::{NodeFacts, Settling, pod_matches, term_matches};
use super::selector::LabelSelector;
use super::taints::{Action, PodFacts, TaintAt, TaintManager};
use super::tolerations::{Verdict, tolerates, verdict};
use crate::pod::PodUid;
use k8s_openapi::api::core::v1::{NodeSelectorTerm, PodSpec, Taint, Toleration};
use serde_json::json;
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::time::Instant;

fn taint(key: &str, value: &str, effect: &str) -> Taint {
    Taint {
        key: key.into(),
        value: (!value.is_empty()).then(|| value.into()),
        effect: effect.into(),
        time_added: None,
    }
}

fn tol(v: serde_json::Value) -> Toleration {
    serde_json::from_value(v).unwrap()
}

#[test]
fn toleration_matching_follows_tolerates_taint() {
    let t = taint("k", "v", "NoExecute");
    for (toleration, expected) in [
        // Equal (explicit or empty operator) compares the value
        (json!({"key": "k", "operator": "Equal", "value": "v"}), true),
        (json!({"key": "k", "value": "v"}), true),
        (json!({"key": "k", "value": "w"}), false),
        (json!({"key": "k"}), false),
        // Exists ignores the value
        (json!({"key": "k", "operator": "Exists"}), true),
        (json!({"key": "other", "operator": "Exists"}), false),
        // an empty key with Exists tolerates everything
        (json!({"operator": "Exists"}), true),
        (json!({"operator": "Exists", "effect": "NoExecute"}), true),
        (json!({"operator": "Exists", "effect": "NoSchedule"}), false),
        // an empty effect matches every effect
        (
            json!({"key": "k", "operator": "Exists", "effect": ""}),
            true,
        ),
        (
            json!({"key": "k", "operator": "Equal", "value": "v", "effect": "NoExecute"}),
            true,
        ),
        (
            json!({"key": "k", "operator": "Equal", "value": "v", "effect": "PreferNoSchedule"}),
            false,
        ),
        // an unknown operator tolerates nothing
        (json!({"key": "k", "operator": "Gt", "value": "v"}), false),
    ] {
        assert_eq!(
            tolerates(&tol(toleration.clone()), &t),
            expected,
            "{toleration}"
        );
    }
    // a taint without a value is tolerated by Equal with no value
    assert!(tolerates(
        &tol(json!({"key": "k"})),
        &taint("k", "", "NoExecute")
    ));
}

#[test]
fn the_shortest_toleration_used_decides_and_none_is_forever() {
    let a = taint("a", "", "NoExecute");
    let b = taint("b", "", "NoExecute");
    let both = [&a, &b];
    assert_eq!(verdict(&[], &[]), Verdict::Untainted);
    assert_eq!(verdict(&[], &both), Verdict::EvictNow);
    let ta = tol(json!({"key": "a", "operator": "Exists", "tolerationSeconds": 300}));
    let tb = tol(json!({"key": "b", "operator": "Exists", "tolerationSeconds": 60}));
    let tb_forever = tol(json!({"key": "b", "operator": "Exists"}));
    // one taint not tolerated: at once
    assert_eq!(verdict(std::slice::from_ref(&ta), &both), Verdict::EvictNow);
    assert_eq!(
        verdict(&[ta.clone(), tb.clone()], &both),
        Verdict::EvictAfter(Duration::from_secs(60))
    );
    assert_eq!(
        verdict(&[ta.clone(), tb_forever.clone()], &both),
        Verdict::EvictAfter(Duration::from_secs(300))
    );
    assert_eq!(
        verdict(std::slice::from_ref(&tb_forever), &[&b]),
        Verdict::Forever
    );
    // for each taint the first toleration that matches is the one used
    let all_forever = tol(json!({"operator": "Exists"}));
    assert_eq!(
        verdict(&[all_forever.clone(), tb.clone()], &both),
        Verdict::Forever
    );
    assert_eq!(
        verdict(&[tb.clone(), all_forever], &both),
        Verdict::EvictAfter(Duration::from_secs(60))
    );
    // zero or negative seconds: at once
    let zero = tol(json!({"key": "a", "operator": "Exists", "tolerationSeconds": 0}));
    let neg = tol(json!({"key": "a", "operator": "Exists", "tolerationSeconds": -5}));
    assert_eq!(verdict(&[zero], &[&a]), Verdict::EvictAfter(Duration::ZERO));
    assert_eq!(verdict(&[neg], &[&a]), Verdict::EvictAfter(Duration::ZERO));
}

fn uid(n: &str) -> PodUid {
    PodUid::parse(n).unwrap()
}

/// A pod created well before the tests' taints.
fn pod(n: &str, tolerations: Vec<Toleration>) -> PodFacts {
    let now = Instant::now();
    PodFacts {
        uid: uid(n),
        key: format!("default/{n}"),
        tolerations,
        exempt: false,
        seen: now.checked_sub(Duration::from_secs(60)).unwrap_or(now),
    }
}

fn at(t: Taint, added: Option<Instant>) -> TaintAt {
    TaintAt { taint: t, added }
}

#[tokio::test(start_paused = true)]
async fn taint_timers_start_at_time_added_keep_the_earliest_start_and_cancel() {
    let t0 = Instant::now();
    let mut m = TaintManager::new();
    let secs = |s: i64| tol(json!({"key": "a", "operator": "Exists", "tolerationSeconds": s}));
    assert!(m.pod(pod("p1", vec![secs(10)]), t0).is_empty(), "untainted");
    assert!(m.pod(pod("p2", vec![]), t0).is_empty());
    assert!(
        m.pod(
            pod("p3", vec![tol(json!({"key": "a", "operator": "Exists"}))]),
            t0
        )
        .is_empty()
    );
    // the taint was added 4 s before reaplet saw it: p1's 10 s count from then
    let a = taint("a", "", "NoExecute");
    let mut actions = m.node(&[at(a.clone(), Some(t0 - Duration::from_secs(4)))], t0);
    actions.sort_by_key(|a| format!("{a:?}"));
    assert_eq!(
        actions,
        vec![
            Action::Schedule {
                uid: uid("p1"),
                at: t0 + Duration::from_secs(6)
            },
            Action::Schedule {
                uid: uid("p2"),
                at: t0
            },
        ]
    );
    // a node update that changes no NoExecute taint does nothing
    let other = taint("x", "", "NoSchedule");
    assert!(
        m.node(
            &[
                at(a.clone(), Some(t0 - Duration::from_secs(4))),
                at(other, None)
            ],
            t0 + Duration::from_secs(1)
        )
        .is_empty()
    );
    // p1's tolerations shorten: the same start, the new minimum (re-queued, earliest start)
    let t1 = t0 + Duration::from_secs(2);
    assert_eq!(
        m.pod(pod("p1", vec![secs(3)]), t1),
        vec![Action::Schedule {
            uid: uid("p1"),
            at: t0 - Duration::from_secs(1)
        }]
    );
    // tolerating for good cancels
    assert_eq!(
        m.pod(pod("p1", vec![tol(json!({"operator": "Exists"}))]), t1),
        vec![Action::Cancel { uid: uid("p1") }]
    );
    // a second taint, added now, tolerated for 5 s: the start is the newest taint's
    let b = taint("b", "", "NoExecute");
    let t2 = t0 + Duration::from_secs(20);
    let p4 = vec![
        tol(json!({"key": "a", "operator": "Exists"})),
        tol(json!({"key": "b", "operator": "Exists", "tolerationSeconds": 5})),
    ];
    assert!(
        m.pod(pod("p4", p4.clone()), t2).is_empty(),
        "a alone is tolerated forever"
    );
    let actions = m.node(
        &[
            at(a.clone(), Some(t0 - Duration::from_secs(4))),
            at(b.clone(), None),
        ],
        t2,
    );
    assert!(
        actions.contains(&Action::Schedule {
            uid: uid("p4"),
            at: t2 + Duration::from_secs(5)
        }),
        "{actions:?}"
    );
    // the taints go: every timer is cancelled
    let mut actions = m.node(&[], t2 + Duration::from_secs(1));
    actions.sort_by_key(|a| format!("{a:?}"));
    assert!(
        actions.contains(&Action::Cancel { uid: uid("p4") }),
        "{actions:?}"
    );
    assert!(m.pending().is_empty(), "{:?}", m.pending());
    // a pod that leaves is cancelled
    m.node(&[at(a, None)], t2 + Duration::from_secs(2));
    assert_eq!(
        m.pod_gone(&uid("p2")),
        vec![Action::Cancel { uid: uid("p2") }]
    );
    assert!(m.pod_gone(&uid("p2")).is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_pod_created_after_the_taint_gets_its_whole_toleration_and_huge_ones_are_forever() {
    let t0 = Instant::now();
    let mut m = TaintManager::new();
    let a = taint("a", "", "NoExecute");
    // the taint was added long ago
    m.node(
        &[at(a.clone(), t0.checked_sub(Duration::from_secs(50)))],
        t0,
    );
    let secs = |s: i64| tol(json!({"key": "a", "operator": "Exists", "tolerationSeconds": s}));
    let mut late = pod("late", vec![secs(30)]);
    late.seen = t0;
    assert_eq!(
        m.pod(late, t0),
        vec![Action::Schedule {
            uid: uid("late"),
            at: t0 + Duration::from_secs(30)
        }]
    );
    // a pod created before the taint counts from the taint
    let early = pod("early", vec![secs(80)]);
    let start = t0.checked_sub(Duration::from_secs(50)).unwrap();
    assert_eq!(
        m.pod(early, t0),
        vec![Action::Schedule {
            uid: uid("early"),
            at: start + Duration::from_secs(80)
        }]
    );
    // tolerationSeconds beyond the clock's range: tolerated for good, never a panic
    assert!(m.pod(pod("huge", vec![secs(i64::MAX)]), t0).is_empty());
    // taint A (300 s) then B (60 s) added 250 s later: A's time stays the earliest
    let mut m = TaintManager::new();
    let p = pod(
        "ab",
        vec![
            tol(json!({"key": "a", "operator": "Exists", "tolerationSeconds": 300})),
            tol(json!({"key": "b", "operator": "Exists", "tolerationSeconds": 60})),
        ],
    );
    m.pod(p, t0);
    m.node(&[at(a.clone(), Some(t0))], t0);
    let t250 = t0 + Duration::from_secs(250);
    let b = taint("b", "", "NoExecute");
    m.node(&[at(a, Some(t0)), at(b, Some(t250))], t250);
    assert_eq!(
        m.pending(),
        vec![(uid("ab"), t0 + Duration::from_secs(300))]
    );
}

#[tokio::test(start_paused = true)]
async fn mirror_and_static_pods_are_reported_never_scheduled() {
    let t0 = Instant::now();
    let mut m = TaintManager::new();
    let mut p = pod("s1", vec![]);
    p.exempt = true;
    m.pod(p.clone(), t0);
    let a = taint("a", "", "NoExecute");
    assert_eq!(
        m.node(&[at(a.clone(), None)], t0),
        vec![Action::Exempt { uid: uid("s1") }]
    );
    // reported once
    p.key = "default/s1-renamed".into();
    assert!(m.pod(p, t0).is_empty());
    assert!(m.pending().is_empty());
}

fn node(labels: &[(&str, &str)]) -> NodeFacts {
    NodeFacts {
        name: "node-a".into(),
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}

fn term(v: serde_json::Value) -> NodeSelectorTerm {
    serde_json::from_value(v).unwrap()
}

#[test]
fn node_affinity_operators_terms_and_fields() {
    let n = node(&[("zone", "a"), ("gen", "5"), ("gpu", "")]);
    let e = |key: &str, op: &str, values: &[&str]| json!({"matchExpressions": [{"key": key, "operator": op, "values": values}]});
    for (t, expected) in [
        (e("zone", "In", &["a", "b"]), true),
        (e("zone", "In", &["b"]), false),
        (e("missing", "In", &["a"]), false),
        (e("zone", "NotIn", &["b"]), true),
        (e("zone", "NotIn", &["a"]), false),
        (e("missing", "NotIn", &["a"]), true),
        (e("gpu", "Exists", &[]), true),
        (e("missing", "Exists", &[]), false),
        (e("missing", "DoesNotExist", &[]), true),
        (e("zone", "DoesNotExist", &[]), false),
        (e("gen", "Gt", &["4"]), true),
        (e("gen", "Gt", &["5"]), false),
        (e("gen", "Lt", &["6"]), true),
        (e("gen", "Lt", &["5"]), false),
        // invalid requirements fail their term
        (e("zone", "Gt", &["1"]), false),
        (e("gen", "Gt", &["x"]), false),
        (e("gen", "Gt", &["1", "2"]), false),
        (e("zone", "In", &[]), false),
        (e("gpu", "Exists", &["x"]), false),
        (e("zone", "Matches", &["a"]), false),
        // an empty term matches nothing
        (json!({}), false),
        (json!({"matchExpressions": []}), false),
        // fields: metadata.name with In/NotIn and exactly one value
        (
            json!({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}),
            true,
        ),
        (
            json!({"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["node-a"]}]}),
            false,
        ),
        (
            json!({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a", "b"]}]}),
            false,
        ),
        (
            json!({"matchFields": [{"key": "metadata.uid", "operator": "In", "values": ["node-a"]}]}),
            false,
        ),
        // expressions and fields in one term are ANDed
        (
            json!({"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}],
                "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-b"]}]}),
            false,
        ),
        (
            json!({"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]},
                                     {"key": "gen", "operator": "Lt", "values": ["3"]}]}),
            false,
        ),
    ] {
        assert_eq!(term_matches(&term(t.clone()), &n), expected, "{t}");
    }
    // terms are ORed; nodeSelector is ANDed with them
    let spec: PodSpec = serde_json::from_value(json!({
        "containers": [],
        "nodeSelector": {"zone": "a"},
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "gen", "operator": "Gt", "values": ["9"]}]},
                {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}
            ]}}}
    }))
    .unwrap();
    assert!(pod_matches(&spec, &n));
    assert!(!pod_matches(&spec, &node(&[("zone", "b"), ("gpu", "")])));
    assert!(!pod_matches(&spec, &node(&[("zone", "a")])));
    let plain: PodSpec = serde_json::from_value(json!({"containers": []})).unwrap();
    assert!(pod_matches(&plain, &node(&[])));
}

#[tokio::test(start_paused = true)]
async fn a_mismatch_settles_and_flapping_back_cancels() {
    let t0 = Instant::now();
    let mut s = Settling::new(Duration::from_secs(30));
    let p = uid("p1");
    assert_eq!(s.observe(&p, false, t0), Some(t0 + Duration::from_secs(30)));
    // still not matching later: the first sighting counts
    assert_eq!(
        s.observe(&p, false, t0 + Duration::from_secs(10)),
        Some(t0 + Duration::from_secs(30))
    );
    assert!(s.due(t0 + Duration::from_secs(29)).is_empty());
    assert_eq!(s.due(t0 + Duration::from_secs(30)), vec![p.clone()]);
    // flapping back cancels; a new mismatch starts over
    assert_eq!(s.observe(&p, true, t0 + Duration::from_secs(31)), None);
    assert!(s.next().is_none());
    assert_eq!(
        s.observe(&p, false, t0 + Duration::from_secs(40)),
        Some(t0 + Duration::from_secs(70))
    );
}

#[test]
fn label_selectors_parse_and_match() {
    let labels: BTreeMap<String, String> = [("app", "web"), ("tier", "front")]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    for (sel, expected) in [
        ("", true),
        ("app=web", true),
        ("app==web", true),
        ("app=db", false),
        ("app!=db", true),
        ("tier", true),
        ("!tier", false),
        ("!missing,app=web", true),
        ("app=web, tier=back", false),
        ("example.com/team!=x", true),
    ] {
        assert_eq!(
            LabelSelector::parse(sel).unwrap().matches(&labels),
            expected,
            "{sel}"
        );
    }
    for bad in ["app=a b", "=x", "a b", "app=x/y"] {
        assert!(LabelSelector::parse(bad).is_err(), "{bad}");
    }
}

/// Issue 30, item 3: reaplet's own pod is exempt from the taint manager (and node affinity),
/// whatever its tolerations; another pod is not.
#[test]
fn reaplets_own_pod_is_exempt() {
    let pod = |uid: &str| -> k8s_openapi::api::core::v1::Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "d", "uid": uid},
            "spec": {"containers": []}}))
        .unwrap()
    };
    let own = PodUid::parse("3f25e7de-8bc9-47a1-b509-d9940894e787").unwrap();
    let now = Instant::now();
    let f = super::runner::facts(&pod(own.as_str()), now, Some(&own)).unwrap();
    assert!(f.exempt);
    let other = super::runner::facts(
        &pod("d1c2b3a4-0000-4000-8000-000000000001"),
        now,
        Some(&own),
    )
    .unwrap();
    assert!(!other.exempt);
}
