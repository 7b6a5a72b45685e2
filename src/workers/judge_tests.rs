//! Which runtime pods a relist takes for orphans (issue 28, items 3 and 8), against a fake
//! runtime in paused time.

use super::tests::{Rig, rig_with};
use super::*;
use crate::cri::fake::Behaviour;
use crate::pod::PodUid;
use std::time::Duration;

const SOURCE: &str = "file";

/// A relist every second over `window` (paused time): what the housekeeping loop does.
pub(super) async fn relists_over(r: &Rig, window: Duration) {
    let end = tokio::time::Instant::now() + window;
    while tokio::time::Instant::now() < end {
        r.workers.relist().await.unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Static pods `f` (`config.source: file`) and `h` (`http`) in the runtime, in none of the
/// sources' lists, judged by relists over 10 s with `static_pods`.
async fn static_pods_of_both_sources(static_pods: StaticPods) -> Rig {
    let r = rig_with(|c| c.static_pods = static_pods);
    for (uid, source) in [("f", "file"), ("h", "http")] {
        r.rt.add_pod(uid, &[("app", Behaviour::IgnoreTerm)]);
        r.rt.annotate_sandboxes(uid, "kubernetes.io/config.source", source);
    }
    r.workers.expect_sources(&[SOURCE]);
    r.workers.mark_source_synced(SOURCE, crate::wall_ns());
    relists_over(&r, Duration::from_secs(10)).await;
    r
}

fn untouched(r: &Rig, uid: &str) {
    assert!(
        r.rt.stops_of(&format!("{uid}-app")).is_empty(),
        "{uid}: stopped"
    );
    assert!(
        r.workers.view(&PodUid::parse(uid).unwrap()).is_none(),
        "{uid}: a worker was started"
    );
}

/// A control-plane pod the kubelet runs from its own `staticPodPath` (sandbox annotation
/// `kubernetes.io/config.source: file`), on a node where reaplet reads a manifest directory
/// of its own that has no manifest for it: after a takeover it is the kubelet's, never an
/// orphan, over a whole 10 s window of relists.
#[tokio::test(start_paused = true)]
async fn a_static_pod_of_no_manifest_of_reaplets_is_the_kubelets() {
    let r = rig_with(|c| c.static_pods = StaticPods::OwnManifests);
    r.rt.add_pod("etcd", &[("app", Behaviour::IgnoreTerm)]);
    r.rt.annotate_sandboxes("etcd", "kubernetes.io/config.source", "file");
    r.workers.expect_sources(&[SOURCE]);
    r.workers.mark_source_synced(SOURCE, crate::wall_ns());
    relists_over(&r, Duration::from_secs(10)).await;
    untouched(&r, "etcd");
}

/// Without a manifest directory every static pod is the kubelet's (`file` and `http`).
#[tokio::test(start_paused = true)]
async fn without_a_manifest_directory_no_static_pod_is_an_orphan() {
    let r = static_pods_of_both_sources(StaticPods::Kubelets).await;
    untouched(&r, "f");
    untouched(&r, "h");
}

/// reaplet's manifest directory is the kubelet's `staticPodPath`: it sees every manifest of
/// the node, and a `file` static pod with none is an orphan, as the kubelet judges it (its
/// manifest was removed while no agent ran). An `http` one is still the kubelet's.
#[tokio::test(start_paused = true)]
async fn with_the_kubelets_own_directory_a_static_pod_with_no_manifest_is_an_orphan() {
    let r = static_pods_of_both_sources(StaticPods::AllOfNode).await;
    let stops = r.rt.stops_of("f-app");
    assert_eq!(stops.len(), 1, "{stops:?}");
    // the orphan grace, 1 s, raised to the container floor
    assert_eq!(stops[0].0, crate::terminating::grace::MIN_CONTAINER_GRACE);
    untouched(&r, "h");
}

/// Issue 28, item 8: a pod created in the API while the source's LIST was under way, and
/// started by the kubelet before that list arrived, is in no list and not yet watched; its
/// sandbox is younger than the list's snapshot, so it is not an orphan, over the window in
/// which the watch would deliver it. A pod that predates the list and is in none is one.
#[tokio::test(start_paused = true)]
async fn a_pod_started_while_the_list_was_under_way_is_no_orphan() {
    let r = rig_with(|_| {});
    r.rt.add_pod("old", &[("app", Behaviour::IgnoreTerm)]);
    r.rt.add_pod("new", &[("app", Behaviour::IgnoreTerm)]);
    r.workers.expect_sources(&["api"]);
    let listed_from = crate::wall_ns();
    // the kubelet starts the new pod's sandbox while the list is in flight
    std::thread::sleep(Duration::from_millis(2));
    r.rt.set_created("new", crate::wall_ns());
    std::thread::sleep(Duration::from_millis(2));
    r.workers.mark_source_synced("api", listed_from);
    relists_over(&r, Duration::from_secs(10)).await;
    untouched(&r, "new");
    assert_eq!(r.rt.stops_of("old-app").len(), 1, "the orphan");
}
