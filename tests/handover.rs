//! Handover with the real kubelet v1.36 (privileged: root, a private containerd, a real
//! kube-apiserver and etcd; the components are built by `testbed/kube.sh`). The kubelet
//! creates and runs the pods, so their sandboxes and containers carry its own labels and
//! annotations, its volumes are mounted by it and its static pods have mirror pods; then it is
//! stopped and reaplet (`--authority primary`) ends what must end. Each test checks the API
//! writes in the audit log, exit codes and timings derived from the grace periods, and that
//! nothing is left (containers, sandboxes, pod cgroups, mounts).

mod common;

use common::kube_node::{KubeNode, pod, uid};
use std::time::{Duration, Instant};

/// How long the kubelet may take to start a pod on a loaded 2-core machine.
const START: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_term_trapping_pod_deleted_after_the_kubelet_stopped_is_ended_by_reaplet() {
    let mut n = KubeNode::start("ho-trap").await;
    let p = n
        .create(&pod("trap", 30, reaplet::testbed::TRAPS_TERM))
        .await;
    n.wait_running("trap", START).await;
    n.kubelet.stop();
    n.start_reaplet(&["--authority", "primary"]);
    n.wait_log("pod list from the API server", Duration::from_secs(30))
        .await;

    let t0 = Instant::now();
    n.delete("trap", None).await;
    let took = n.wait_gone("trap", t0, Duration::from_secs(20)).await;
    println!("trap: gone {took:?} after the delete");
    let writes: Vec<String> = n
        .pod_writes("reaplet/", "trap")
        .iter()
        .map(|a| a.line())
        .collect();
    assert_eq!(
        writes,
        ["patch pods/status trap 200", "delete pods trap 200"],
        "{:#?}",
        n.reaplet_writes()
    );
    n.assert_nothing_left(&uid(&p)).await;
}
