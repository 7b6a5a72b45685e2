//! A soft threshold, side by side: `evictionSoft: allocatableMemory.available: 300Mi` with its
//! `evictionSoftGracePeriod` of 5 s and `evictionMaxPodGracePeriod: 3` (no hard memory
//! threshold). A TERM-ignoring BestEffort pod per agent takes 900 MB when the test says; each
//! must be evicted only after the threshold has been met for its grace period, and killed with
//! `min(evictionMaxPodGracePeriod, its own 30 s)` = 3 s, above the runtime's 2 s floor.
//! Compared: the final status and its message (the soft threshold's quantity), the event, the
//! exit code, the grace; the bystanders untouched, the objects kept.

use super::*;

/// The soft threshold's grace period, seconds.
const SOFT_GRACE: f64 = 5.0;
/// `evictionMaxPodGracePeriod`, seconds.
const MAX_POD_GRACE: f64 = 3.0;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soft_threshold_waits_its_grace_period_and_caps_the_pod_grace_as_the_kubelet_does() {
    let _one = ONE_NODE.lock().await;
    let (mut n, reader) = pressure_node(
        "soft-kubelet",
        "evictionHard: {nodefs.available: \"1%\", imagefs.available: \"1%\"}\n\
         evictionSoft: {allocatableMemory.available: \"300Mi\"}\n\
         evictionSoftGracePeriod: {allocatableMemory.available: \"5s\"}\n\
         evictionMaxPodGracePeriod: 3",
    )
    .await;
    let crossing = Crossing {
        reader,
        signal: Signal::AllocatableMemory,
        below: 300 << 20,
    };
    let gate = Gate::start().await;
    let exits = Exits::watch(&n.client).await;
    let hogs = ["soft-k", "soft-r"];
    create_victims(&n, &gate, hogs.map(|name| hog(&gate, name, false)).to_vec()).await;
    steady_bystanders(&n).await;
    let ids = running_with_stats(&n, &["burstable", "guaranteed", "soft-k", "soft-r"]).await;
    let quiet_since = reaplet::wall_ns();

    let (mut k, mut r) = rounds(&mut n, &gate, &crossing, &exits, &["soft-k"], &["soft-r"]).await;
    let (k, r) = (k.remove(0), r.remove(0));
    compare("soft threshold, TERM ignored, from the crossing", &k, &r);
    for (who, e) in [("kubelet", &k), ("reaplet", &r)] {
        let grace = e.grace.unwrap();
        // SIGTERM only once the threshold was met for its whole grace period (the crossing
        // is read here every 50 ms, the agent's own read can only come later)
        let met = e.after_crossing - grace;
        assert!(
            met >= SOFT_GRACE - 0.2,
            "{who}: SIGTERM {met:.2} s after the crossing, before the soft grace period"
        );
        // min(evictionMaxPodGracePeriod 3 s, the pod's 30 s): above the 2 s floor
        assert!(
            (MAX_POD_GRACE - 0.2..MAX_POD_GRACE + 1.5).contains(&grace),
            "{who}'s grace {grace:.2} s, want about {MAX_POD_GRACE} s"
        );
    }
    threshold_met_events(&n, "memory").await;
    untouched(&n, &ids[..2], quiet_since).await;
    kept(&n, &hogs).await;
    n.stop_reaplet();
}
