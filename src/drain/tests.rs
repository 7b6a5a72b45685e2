use super::plan::{self, DrainPod, Options, Refusal, Skip};
use super::preempt::{self, Budget, Candidate, Plan, Req};
use super::quantity::Resources;
use super::rank::{Phase, RankedPod, compare, sort};
use proptest::prelude::*;
use std::cmp::Ordering;

pub(super) fn base(uid: &str) -> RankedPod {
    RankedPod {
        uid: uid.into(),
        assigned: true,
        phase: Phase::Running,
        ready: true,
        ready_for: Some(1000000000000),
        deletion_cost: 0,
        colocated: 1,
        restarts: 0,
        sidecar_restarts: 0,
        age: Some(5000000000000),
    }
}

/// Every rule, with a case where it decides: `first` is removed before `second`.
#[test]
fn each_ranking_rule_decides_in_its_turn() {
    let cases: Vec<(&str, RankedPod, RankedPod)> = vec![
        (
            "unassigned first",
            RankedPod {
                assigned: false,
                ..base("b")
            },
            base("a"),
        ),
        (
            "pending before running",
            RankedPod {
                phase: Phase::Pending,
                ready: false,
                ..base("b")
            },
            base("a"),
        ),
        (
            "pending before unknown",
            RankedPod {
                phase: Phase::Pending,
                ..base("b")
            },
            RankedPod {
                phase: Phase::Unknown,
                ..base("a")
            },
        ),
        (
            "unknown before running",
            RankedPod {
                phase: Phase::Unknown,
                ..base("b")
            },
            base("a"),
        ),
        (
            "not ready first",
            RankedPod {
                ready: false,
                ..base("b")
            },
            base("a"),
        ),
        (
            "lower deletion cost first",
            RankedPod {
                deletion_cost: -5,
                ..base("b")
            },
            base("a"),
        ),
        (
            "higher deletion cost last",
            base("b"),
            RankedPod {
                deletion_cost: 10,
                ..base("a")
            },
        ),
        (
            "doubled up first",
            RankedPod {
                colocated: 3,
                ..base("b")
            },
            base("a"),
        ),
        (
            "more recently ready first (another log bucket)",
            RankedPod {
                ready_for: Some(10000000000),
                ..base("b")
            },
            base("a"),
        ),
        (
            "no ready time first",
            RankedPod {
                ready_for: None,
                ..base("b")
            },
            base("a"),
        ),
        (
            "same ready bucket: the smaller uid",
            RankedPod {
                ready_for: Some(1001000000000),
                ..base("a")
            },
            base("b"),
        ),
        (
            "more restarts first",
            RankedPod {
                restarts: 4,
                ..base("b")
            },
            base("a"),
        ),
        (
            "newer first",
            RankedPod {
                age: Some(10000000000),
                ..base("b")
            },
            base("a"),
        ),
        (
            "no creation time first",
            RankedPod {
                age: None,
                ..base("b")
            },
            base("a"),
        ),
        (
            "same age bucket: the smaller uid",
            RankedPod {
                age: Some(5001000000000),
                ..base("a")
            },
            base("b"),
        ),
    ];
    for (rule, first, second) in cases {
        assert_eq!(compare(&first, &second), Ordering::Less, "{rule}");
        assert_eq!(
            compare(&second, &first),
            Ordering::Greater,
            "{rule} (reversed)"
        );
    }
    // readiness times count only when both are ready
    let a = RankedPod {
        ready: false,
        phase: Phase::Running,
        ready_for: Some(1000000000),
        ..base("a")
    };
    let b = RankedPod {
        ready: false,
        ready_for: Some(9999000000000),
        ..base("b")
    };
    assert_eq!(compare(&a, &b), Ordering::Equal);
    // an earlier rule wins over a later one
    let cheap_old = RankedPod {
        deletion_cost: -1,
        age: Some(1_000_000_000_000_000_000),
        ..base("a")
    };
    let dear_new = RankedPod {
        deletion_cost: 5,
        age: Some(1000000000),
        ..base("b")
    };
    assert_eq!(compare(&cheap_old, &dear_new), Ordering::Less);
    let mut v = vec![dear_new.clone(), cheap_old.clone()];
    sort(&mut v);
    assert_eq!(v[0].uid, "a");
}

pub(super) fn drain_pod(
    key: &str,
    owner: Option<&str>,
    priority: i32,
    rank: RankedPod,
) -> DrainPod {
    DrainPod {
        key: key.into(),
        uid: rank.uid.clone(),
        priority,
        owner: owner.map(str::to_owned),
        daemonset: owner.is_some_and(|o| o.starts_with("DaemonSet/")),
        mirror: false,
        has_empty_dir: false,
        terminal: false,
        terminating: false,
        rank,
    }
}

#[test]
fn drain_skips_refuses_orders_by_priority_and_waves_one_pod_per_owner() {
    let mut pods = vec![
        drain_pod("d/web-1", Some("ReplicaSet/web"), 0, base("w1")),
        drain_pod(
            "d/web-2",
            Some("ReplicaSet/web"),
            0,
            RankedPod {
                ready: false,
                ..base("w2")
            },
        ),
        drain_pod(
            "d/web-3",
            Some("ReplicaSet/web"),
            0,
            RankedPod {
                restarts: 2,
                ..base("w3")
            },
        ),
        drain_pod("d/api-1", Some("ReplicaSet/api"), 100, base("a1")),
        drain_pod(
            "d/api-2",
            Some("ReplicaSet/api"),
            100,
            RankedPod {
                deletion_cost: -1,
                ..base("a2")
            },
        ),
        drain_pod("d/logs", Some("DaemonSet/logs"), 0, base("l1")),
    ];
    let mut mirror = drain_pod("d/etcd", None, 2000, base("m1"));
    mirror.mirror = true;
    pods.push(mirror);
    let bare = drain_pod("d/bare", None, 0, base("b1"));
    let mut cache = drain_pod("d/cache", Some("ReplicaSet/cache"), 0, base("c1"));
    cache.has_empty_dir = true;
    // refused without the flags
    let p = plan::plan(
        [pods.clone(), vec![bare.clone(), cache.clone()]].concat(),
        Options::default(),
    );
    let refused: Vec<(&str, Refusal)> = p
        .refused
        .iter()
        .map(|(d, r)| (d.key.as_str(), *r))
        .collect();
    assert_eq!(
        refused,
        vec![
            ("d/bare", Refusal::Unmanaged),
            ("d/cache", Refusal::EmptyDir)
        ]
    );
    let skipped: Vec<(&str, Skip)> = p
        .skipped
        .iter()
        .map(|(d, s)| (d.key.as_str(), *s))
        .collect();
    assert_eq!(
        skipped,
        vec![("d/logs", Skip::DaemonSet), ("d/etcd", Skip::Mirror)]
    );
    // with them: lower priority first; each owner one pod per wave, in ranking order
    let p = plan::plan(
        [pods, vec![bare, cache]].concat(),
        Options {
            delete_emptydir_data: true,
            force: true,
        },
    );
    assert!(p.refused.is_empty());
    let waves: Vec<Vec<&str>> = p
        .waves
        .iter()
        .map(|w| w.iter().map(|d| d.key.as_str()).collect())
        .collect();
    assert_eq!(
        waves,
        vec![
            // priority 0: web's not-ready pod first, then the one with restarts, then web-1
            vec!["d/web-2", "d/bare", "d/cache"],
            vec!["d/web-3"],
            vec!["d/web-1"],
            // priority 100: api-2 (lower deletion cost) before api-1
            vec!["d/api-2"],
            vec!["d/api-1"],
        ]
    );
}

fn cand(
    uid: &str,
    priority: i32,
    cpu: i64,
    labels: &[(&str, &str)],
    started_ago: f64,
) -> Candidate {
    let t0: i128 = 1_800_000_000_000_000_000;
    Candidate {
        uid: uid.into(),
        name: uid.into(),
        namespace: "default".into(),
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        priority,
        started: t0 - (started_ago * 1e9) as i128,
        has_started: true,
        requests: Resources {
            milli_cpu: cpu,
            ..Resources::default()
        },
        evictable: true,
        terminating: false,
    }
}

fn cpu(m: i64) -> Resources {
    Resources {
        milli_cpu: m,
        ..Resources::default()
    }
}

fn node_of(milli_cpu: i64) -> Resources {
    Resources {
        milli_cpu,
        memory: 1 << 40,
        pods: 110,
        ..Resources::default()
    }
}

fn victims(plan: &Plan) -> Vec<String> {
    match plan {
        Plan::Victims(v) => v.iter().map(|v| v.pod.uid.clone()).collect(),
        other => panic!("{other:?}"),
    }
}

#[test]
fn preemption_removes_lower_priorities_then_reprieves_budgeted_ones_first() {
    // 4 cores, all used: high (1000m, prio 100), a/b/c (1000m each, prio 10, 5, 5)
    let pods = vec![
        cand("high", 100, 1000, &[], 50.0),
        cand("a", 10, 1000, &[("app", "db")], 40.0),
        cand("b", 5, 1000, &[], 30.0),
        cand("c", 5, 1000, &[], 20.0),
    ];
    // 1000m for priority 50: one victim; a (prio 10) is reprieved first, b started earlier
    // than c so b is more important: c is the victim
    assert_eq!(
        victims(&preempt::select(&cpu(1000), 50, &node_of(4000), &pods, &[])),
        vec!["c"]
    );
    // a budget that allows nothing protects "a": it is reprieved first anyway (violating
    // first), and the victims are the cheaper ones
    let budget = Budget {
        name: "db".into(),
        namespace: "default".into(),
        selector: Some(vec![Req::In("app".into(), vec!["db".into()])]),
        disruptions_allowed: 0,
        disrupted: vec![],
    };
    assert_eq!(
        victims(&preempt::select(
            &cpu(2000),
            50,
            &node_of(4000),
            &pods,
            std::slice::from_ref(&budget)
        )),
        vec!["b", "c"]
    );
    // 3000m: a must go too, and it is reported as violating its budget
    match preempt::select(
        &cpu(3000),
        50,
        &node_of(4000),
        &pods,
        std::slice::from_ref(&budget),
    ) {
        Plan::Victims(v) => {
            let a = v.iter().find(|v| v.pod.uid == "a").unwrap();
            assert_eq!(a.violates, vec!["db".to_string()]);
        }
        other => panic!("{other:?}"),
    }
    // fits already
    let half = vec![cand("x", 1, 1000, &[], 1.0)];
    assert_eq!(
        preempt::select(&cpu(1000), 50, &node_of(4000), &half, &[]),
        Plan::FitsAlready
    );
    // impossible: only lower priorities count, and the higher one keeps its share
    assert!(matches!(
        preempt::select(&cpu(3500), 50, &node_of(4000), &pods, &[]),
        Plan::Impossible { short } if short.len() == 1 && short[0].short() == 500
    ));
    // equal priority is never a victim
    assert!(matches!(
        preempt::select(&cpu(4000), 5, &node_of(4000), &pods, &[]),
        Plan::Impossible { .. }
    ));
}

fn arb_pods() -> impl Strategy<Value = Vec<Candidate>> {
    prop::collection::vec((0i32..5, 1i64..8, 0u8..3, 0.0f64..100.0), 1..9).prop_map(|v| {
        v.into_iter()
            .enumerate()
            .map(|(i, (prio, cpu100, label, started))| {
                let app = ["a", "b", "c"][label as usize];
                cand(
                    &format!("p{i}"),
                    prio,
                    cpu100 * 100,
                    &[("app", app)],
                    started,
                )
            })
            .collect()
    })
}

proptest! {
    /// The plan always fits, only lower priorities are victims, and no victim could be
    /// reprieved alone (adding it back never fits): reprieve is maximal.
    #[test]
    fn a_plan_fits_and_no_victim_could_stay(
        pods in arb_pods(),
        request in 1i64..30,
        priority in 0i32..6,
        allowed in 0i32..2,
    ) {
        let node = node_of(2000);
        let budgets = vec![Budget {
            name: "a".into(), namespace: "default".into(),
            selector: Some(vec![Req::In("app".into(), vec!["a".into()])]),
            disruptions_allowed: allowed, disrupted: vec![],
        }];
        let request = cpu(request * 100);
        let plan = preempt::select(&request, priority, &node, &pods, &budgets);
        let used = |keep: &dyn Fn(&Candidate) -> bool| pods.iter().filter(|p| keep(p))
            .fold(request.milli_cpu, |acc, p| acc + p.requests.milli_cpu);
        match plan {
            Plan::FitsAlready => prop_assert!(used(&|_| true) <= node.milli_cpu),
            Plan::Impossible { .. } => prop_assert!(used(&|p| p.priority >= priority) > node.milli_cpu),
            Plan::Victims(v) => {
                let gone: Vec<&str> = v.iter().map(|v| v.pod.uid.as_str()).collect();
                prop_assert!(v.iter().all(|v| v.pod.priority < priority));
                prop_assert!(used(&|p| !gone.contains(&p.uid.as_str())) <= node.milli_cpu);
                for g in &gone {
                    let without = |p: &Candidate| !gone.contains(&p.uid.as_str()) || p.uid == *g;
                    prop_assert!(used(&without) > node.milli_cpu, "{g} could have stayed");
                }
            }
        }
    }
}

#[test]
fn a_budget_decides_which_pod_is_reprieved_and_selectors_follow_preemption() {
    // c is the least important: without a budget it is the victim; with a budget that allows
    // nothing on it, it is reprieved first and b goes instead
    let pods = vec![
        cand("high", 100, 1000, &[], 50.0),
        cand("a", 10, 1000, &[], 40.0),
        cand("b", 5, 1000, &[], 30.0),
        cand("c", 5, 1000, &[("app", "db"), ("tier", "data")], 20.0),
    ];
    assert_eq!(
        victims(&preempt::select(&cpu(1000), 50, &node_of(4000), &pods, &[])),
        vec!["c"]
    );
    let budget = |selector: Option<Vec<Req>>| Budget {
        name: "db".into(),
        namespace: "default".into(),
        selector,
        disruptions_allowed: 0,
        disrupted: vec![],
    };
    for sel in [
        vec![Req::In("app".into(), vec!["db".into(), "cache".into()])],
        vec![
            Req::Exists("tier".into()),
            Req::NotIn("app".into(), vec!["web".into()]),
        ],
    ] {
        let b = budget(Some(sel.clone()));
        assert_eq!(
            victims(&preempt::select(
                &cpu(1000),
                50,
                &node_of(4000),
                &pods,
                std::slice::from_ref(&b)
            )),
            vec!["b"],
            "{sel:?}"
        );
    }
    // a nil, empty or invalid selector selects nothing: c is the victim again
    let none = budget(None);
    assert_eq!(
        victims(&preempt::select(
            &cpu(1000),
            50,
            &node_of(4000),
            &pods,
            std::slice::from_ref(&none)
        )),
        vec!["c"]
    );
    // a budget that already counted the pod does not count it twice
    let mut counted = budget(Some(vec![Req::In("app".into(), vec!["db".into()])]));
    counted.disrupted = vec!["c".into()];
    assert_eq!(
        victims(&preempt::select(
            &cpu(1000),
            50,
            &node_of(4000),
            &pods,
            std::slice::from_ref(&counted)
        )),
        vec!["c"]
    );
    // a mirror pod is never a victim
    let mut with_mirror = pods.clone();
    with_mirror[3].evictable = false;
    assert_eq!(
        victims(&preempt::select(
            &cpu(1000),
            50,
            &node_of(4000),
            &with_mirror,
            &[]
        )),
        vec!["b"]
    );
}

#[test]
fn pods_already_leaving_or_finished_are_waited_for_first_all_at_once() {
    let web = Some("ReplicaSet/web");
    let mut leaving = drain_pod("d/web-0", web, 0, base("w0"));
    leaving.terminating = true;
    let mut done1 = drain_pod("d/job-1", Some("Job/j"), 0, base("j1"));
    done1.terminal = true;
    let mut done2 = drain_pod("d/job-2", Some("Job/j"), 0, base("j2"));
    done2.terminal = true;
    let p = plan::plan(
        vec![
            drain_pod("d/web-1", web, 0, base("w1")),
            leaving,
            done1,
            done2,
        ],
        Options::default(),
    );
    let waves: Vec<Vec<&str>> = p
        .waves
        .iter()
        .map(|w| w.iter().map(|d| d.key.as_str()).collect())
        .collect();
    assert_eq!(
        waves,
        vec![vec!["d/web-0", "d/job-1", "d/job-2"], vec!["d/web-1"]]
    );
}

/// kubectl's `--grace-period=-1` is each pod's own grace, never 0 (the first version killed
/// every pod at once with it).
#[test]
fn a_negative_grace_period_is_each_pods_own() {
    use super::run::eviction_grace;
    assert_eq!(eviction_grace(None), None);
    assert_eq!(eviction_grace(Some(-1)), None);
    assert_eq!(eviction_grace(Some(0)), Some(0));
    assert_eq!(eviction_grace(Some(45)), Some(45));
}
