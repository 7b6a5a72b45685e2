//! Node pressure on memory, side by side: a hard `evictionHard: memory.available: 200Mi`,
//! which the kubelet copies to `allocatableMemory.available` (the pods' cgroup of 1 GiB).
//!
//! Four BestEffort pods take memory when the test says (a gate on loopback), a Burstable and a
//! Guaranteed pod stand by. The kubelet evicts the first two (one exits 0 on SIGTERM, one
//! ignores it); then the kubelet is stopped and reaplet evicts the other two, the same kinds.
//! Compared pair by pair: the pod's final status, the Warning `Evicted` event and its
//! annotations, the node's `EvictionThresholdMet` event, the grace the TERM-ignoring pod got,
//! the object kept, nothing else evicted.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_pressure_evicts_the_same_pods_with_the_same_status_as_the_kubelet() {
    let _one = ONE_NODE.lock().await;
    let (mut n, reader) = pressure_node(
        "pressure-kubelet",
        "evictionHard: {memory.available: \"200Mi\", nodefs.available: \"1%\", imagefs.available: \"1%\"}",
    )
    .await;
    let crossing = Crossing {
        reader: reader.clone(),
        signal: Signal::AllocatableMemory,
        below: 200 << 20,
    };
    let gate = Gate::start().await;
    let exits = Exits::watch(&n.client).await;
    let hogs = [
        ("hog-k-trap", true),
        ("hog-k-ignore", false),
        ("hog-r-trap", true),
        ("hog-r-ignore", false),
    ];
    // Priorities order the victims the same for both agents whatever the kubelet's stats say
    // at its decision (cAdvisor's figures of a hog may be seconds old, and the idle hogs also
    // exceed their request of 0): each agent's first victim is its trapping hog.
    create_victims(
        &n,
        &gate,
        hogs.iter()
            .map(|&(name, trap)| hog(&gate, name, trap))
            .collect(),
    )
    .await;
    steady_bystanders(&n).await;
    let mut names = vec!["burstable", "guaranteed"];
    names.extend(hogs.iter().map(|h| h.0));
    let ids = running_with_stats(&n, &names).await;
    let quiet_since = reaplet::wall_ns();

    let (k, r) = rounds(
        &mut n,
        &gate,
        &crossing,
        &exits,
        &["hog-k-trap", "hog-k-ignore"],
        &["hog-r-trap", "hog-r-ignore"],
    )
    .await;
    let [k_trap, k_ignore] = <[Eviction; 2]>::try_from(k).ok().unwrap();
    let [r_trap, r_ignore] = <[Eviction; 2]>::try_from(r).ok().unwrap();

    for (case, k, r) in [
        ("exits 0 on SIGTERM", &k_trap, &r_trap),
        ("ignores SIGTERM", &k_ignore, &r_ignore),
    ] {
        compare(&format!("{case}, from the crossing"), k, r);
    }
    // the hard threshold's grace: 1 s, raised to the runtime's 2 s floor for both
    let (r_grace, k_grace) = (r_ignore.grace.unwrap(), k_ignore.grace.unwrap());
    assert!(
        r_grace >= 1.8 && r_grace < k_grace + 1.5,
        "reaplet's grace {r_grace:.2} s, the kubelet's {k_grace:.2} s"
    );
    threshold_met_events(&n, "memory").await;
    untouched(&n, &ids[..2], quiet_since).await;
    kept(&n, &hogs.map(|h| h.0)).await;
    n.stop_reaplet();
}
