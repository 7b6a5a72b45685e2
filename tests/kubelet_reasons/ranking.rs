//! The kubelet's memory ranking, side by side: four pods whose order uses each of its keys,
//! under `evictionHard: memory.available: 200Mi` (copied to `allocatableMemory.available`, the
//! pods' cgroup of 1 GiB).
//!
//! * `mid`: BestEffort, priority 0, holding 80 MB from its start;
//! * `low`: BestEffort, priority 0, idle (a few hundred KiB);
//! * `grower`: BestEffort, priority 1000, taking 900 MB when the test says;
//! * `guaranteed`: Guaranteed (64Mi), priority 0, idle.
//!
//! Expected, by the documented order: `mid` (above its request, priority 0, the most above
//! it), then `low` (above its request, priority 0), then `grower` (above its request, but
//! priority 1000), and `guaranteed` kept (under its request: ranked after every pod above
//! theirs whatever its priority; once the grower is gone the pressure is too).
//!
//! The real kubelet v1.36.5 here ranks that way only some of the time: at other times its
//! eviction summary lacks some or every pod's memory figure, such a pod counts as using 0
//! bytes, and with none it ranks by priority, then by request ([`kubelet_may`], pass by pass:
//! it can then evict the Guaranteed pod before the grower, as `kubelet-termination.md` §11
//! measured). The test accepts any of those for the kubelet, says which it saw with the
//! kubelet's own ranking line, and holds reaplet (which reads each pod's cgroup at the pass)
//! to the documented order.
//!
//! The kubelet's round runs on `k-*` pods; then `r-*` pods are created (the kubelet starts
//! them), the kubelet is stopped and reaplet's round runs on them. Compared: the victims in
//! order, the final status and event of each pod both ended, the Guaranteed pods untouched
//! (the kubelet's only when it ranked with usage).

use super::*;

/// The victims in the order both agents must end them.
const ORDER: [&str; 3] = ["mid", "low", "grower"];
/// After the last victim, how long nothing else may be ended: past a kubelet pass (10 s) and
/// its wait for the cleanup.
const SETTLE: Duration = Duration::from_secs(20);

/// The round's pods, prefixed `prefix`.
async fn create_round(n: &KubeNode, gate: &Gate, prefix: &str) {
    let name = |role: &str| format!("{prefix}-{role}");
    n.create(&worker(
        gate,
        &name("mid"),
        Work::Memory(80_000_000),
        false,
        true,
    ))
    .await;
    n.create(&worker(gate, &name("low"), Work::Idle, false, true))
        .await;
    let mut grower = hog(gate, &name("grower"), true);
    grower["spec"]["priorityClassName"] = json!("high");
    n.create(&grower).await;
    n.create(&bystander(&name("guaranteed"), true)).await;
}

/// A victim's role, its container's exit (wall ns) and exit code, its final status and its
/// event.
type Victim = (String, i64, i32, Value, Value);

/// The round's pods as the kubelet ranks them: role, memory request, priority, and the usage
/// its summary shows when it has the pod's figure (bytes; `tail` holding 80 MB, idle shells,
/// the grower's 900 MB).
const PODS: [(&str, i64, i32, i64); 4] = [
    ("mid", 0, 0, 80_000_000),
    ("low", 0, 0, 500_000),
    ("grower", 0, 1000, 900_000_000),
    ("guaranteed", 64 << 20, 0, 500_000),
];

/// Whether `order` is one the kubelet can take, pass by pass. Each pass ranks by the
/// documented keys (above the request first, then the lower priority, then the larger usage
/// above the request), but the kubelet's eviction summary does not always carry a pod's
/// memory figure (intermittent on this test bed, see `steady_bystanders`): a pod without it
/// counts as using 0 bytes. With every figure that is the documented order (`mid`, `low`,
/// `grower`, then `guaranteed`); with none, priority then `0 - request` (`low` and `mid`
/// tied, `guaranteed`, `grower`); with some, anything between (a pass that had the grower's
/// figure and not `mid`'s took the grower before `mid`: measured, `["low", "grower"]`). So
/// each victim must come first for some set of pods with figures. It stops once the grower,
/// which holds the memory, is gone.
fn kubelet_may(order: &[String]) -> bool {
    let mut left: Vec<_> = PODS.to_vec();
    for (i, v) in order.iter().enumerate() {
        let firsts = (0u32..1 << left.len()).any(|seen| {
            let key = |k: usize| {
                let (_, request, priority, usage) = left[k];
                let usage = if seen & (1 << k) != 0 { usage } else { 0 };
                (usage <= request, priority, request - usage)
            };
            let best = (0..left.len()).map(key).min();
            (0..left.len()).any(|k| left[k].0 == v.as_str() && Some(key(k)) == best)
        });
        if !firsts {
            return false;
        }
        left.retain(|p| p.0 != v.as_str());
        if v == "grower" {
            return i + 1 == order.len();
        }
    }
    false
}

/// One agent's round: the gate opened, the grower's end waited for, then [`SETTLE`]; the
/// round's pods that ended, by exit time, each with its final status and event; the round's
/// Guaranteed pod (name, container). The kubelet's round first waits until its stats summary
/// has every pod.
async fn round(
    n: &KubeNode,
    gate: &Gate,
    exits: &Exits,
    prefix: &str,
    who: &str,
    window: Duration,
) -> (Vec<Victim>, (String, String)) {
    let mut ids = Vec::new();
    for role in ["mid", "low", "grower", "guaranteed"] {
        let name = format!("{prefix}-{role}");
        let p = n.wait_running(&name, Duration::from_secs(90)).await;
        ids.push((role, name, container_id(&p)));
    }
    if who == "kubelet/" {
        let names: Vec<&str> = ids.iter().map(|(_, n, _)| n.as_str()).collect();
        wait_kubelet_stats(n, &names).await;
    }
    gate.open(&format!("{prefix}-grower"));
    let opened = reaplet::wall_ns();
    let (_, grower, grower_id) = &ids[2];
    // each victim ended in turn, each within one eviction's window (its pass, grace and the
    // wait for its cleanup)
    let window = window * ORDER.len() as u32;
    let end = exits
        .of(grower_id, window, || {
            let ended: Vec<String> = ids
                .iter()
                .filter_map(|(role, _, id)| {
                    let st = exits.seen(id)?;
                    Some(format!(
                        "{role} exit {} at +{:.2} s",
                        st.exit_code,
                        (st.finished_at - opened) as f64 / 1e9
                    ))
                })
                .collect();
            format!(
                "{who} did not end {grower} within {window:?} of its gate; ended: {ended:?}\n\
                 kubelet:\n{}\nreaplet:\n{}",
                n.kubelet.log_grep(&["eviction_manager"], 30),
                n.reaplet_tail(30)
            )
        })
        .await;
    println!(
        "{who}: {grower} ended {:.2} s after its gate opened",
        (end.finished_at - opened) as f64 / 1e9
    );
    tokio::time::sleep(SETTLE).await;
    let mut victims = Vec::new();
    for (role, name, id) in &ids {
        if let Some(st) = exits.seen(id) {
            let (status, event) = terminal(n, name, who, "Evicted").await;
            victims.push((
                role.to_string(),
                st.finished_at,
                st.exit_code,
                status,
                event,
            ));
        }
    }
    victims.sort_by_key(|v| v.1);
    let (_, g, gid) = &ids[3];
    (victims, (g.clone(), gid.clone()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_ranking_picks_the_same_victims_in_the_same_order_as_the_kubelet() {
    let _one = ONE_NODE.lock().await;
    let (mut n, _reader) = pressure_node(
        "rank-kubelet",
        // the kubelet refuses BestEffort pods while its MemoryPressure condition lasts
        // (`evictionPressureTransitionPeriod`, 5 min by default): the second round's pods
        // are created 20 s after the first round's pressure ended
        "evictionHard: {memory.available: \"200Mi\", nodefs.available: \"1%\", imagefs.available: \"1%\"}\n\
         evictionPressureTransitionPeriod: 1s",
    )
    .await;
    let gate = Gate::start().await;
    let exits = Exits::watch(&n.client).await;
    priority_class(&n, "high", 1000).await;

    create_round(&n, &gate, "k").await;
    let quiet_since = reaplet::wall_ns();
    let (k, k_guaranteed) = round(&n, &gate, &exits, "k", "kubelet/", KUBELET_WINDOW).await;
    let kubelet_ranked = n
        .kubelet
        .log_grep(&["pods ranked for eviction"], 1)
        .to_owned();

    create_round(&n, &gate, "r").await;
    for role in ["mid", "low", "grower", "guaranteed"] {
        n.wait_running(&format!("r-{role}"), Duration::from_secs(90))
            .await;
    }
    hand_to_reaplet(&mut n).await;
    let (r, r_guaranteed) = round(&n, &gate, &exits, "r", "reaplet/", REAPLET_WINDOW).await;

    let order = |v: &[Victim]| -> Vec<String> { v.iter().map(|x| x.0.clone()).collect() };
    let (ko, ro) = (order(&k), order(&r));
    let with_usage = ko == ORDER;
    println!(
        "ranking: kubelet {ko:?} ({}), reaplet {ro:?}; first to last exit: kubelet {:.2} s, \
         reaplet {:.2} s\n  the kubelet's last ranking: {kubelet_ranked}",
        if with_usage {
            "the documented order"
        } else {
            "some passes without pod usage"
        },
        (k[k.len() - 1].1 - k[0].1) as f64 / 1e9,
        (r[r.len() - 1].1 - r[0].1) as f64 / 1e9
    );
    assert_eq!(ro, ORDER, "reaplet's order");
    assert!(
        kubelet_may(&ko),
        "the kubelet's order {ko:?} is neither the documented one nor one of its passes \
         without pod usage\n{}",
        n.kubelet.log_grep(&["eviction_manager"], 30)
    );
    // what both ended, ended the same way
    for (role, _, _, rs, re) in &r {
        if let Some((_, _, code, ks, ke)) = k.iter().find(|v| &v.0 == role) {
            if let Some(ks) = as_if_seen(role, &digest(ks), *code) {
                assert_eq!(digest(rs), ks, "{role}: the final status");
            }
            assert_eq!(event_digest(re), event_digest(ke), "{role}: the event");
        }
    }
    let mut spared = vec![(r_guaranteed.0.as_str(), r_guaranteed.1.clone())];
    if !ko.iter().any(|v| v == "guaranteed") {
        spared.push((k_guaranteed.0.as_str(), k_guaranteed.1.clone()));
    }
    untouched(&n, &spared, quiet_since).await;
    let all: Vec<String> = ["k", "r"]
        .iter()
        .flat_map(|p| ORDER.map(|role| format!("{p}-{role}")))
        .collect();
    kept(&n, &all.iter().map(String::as_str).collect::<Vec<_>>()).await;
    n.stop_reaplet();
}

#[test]
fn the_kubelets_orders_pass_by_pass() {
    let o = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    for good in [
        &["mid", "low", "grower"][..],
        &["low", "mid", "guaranteed", "grower"],
        &["mid", "low", "guaranteed", "grower"],
        &["low", "mid", "grower"],
        // a pass without `mid`'s figure, with the grower's (measured)
        &["low", "grower"],
    ] {
        assert!(kubelet_may(&o(good)), "{good:?}");
    }
    for bad in [
        // the Guaranteed pod (under its request) never ahead of a pod at or above its own
        &["guaranteed", "mid", "low", "grower"][..],
        &["low", "guaranteed", "grower"],
        // nothing after the grower (the pressure is gone with it), and it ends the round
        &["mid", "low", "grower", "guaranteed"],
        &["grower", "mid"],
        &["mid", "low"],
    ] {
        assert!(!kubelet_may(&o(bad)), "{bad:?}");
    }
}
