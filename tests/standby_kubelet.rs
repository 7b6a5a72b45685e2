//! Standby beside the real kubelet v1.36 through an outage of reaplet's own API connections
//! (privileged: root, a private containerd, a real kube-apiserver and etcd; a TCP proxy in
//! front of the API server resets reaplet's connections). reaplet runs in its default mode
//! (auto: standby, passive while a kubelet holds the node Lease). A Lease that cannot be read
//! is not a stale Lease: whatever the kubelet's health endpoint says meanwhile, reaplet never
//! takes over without a Lease read that shows it unrenewed for `takeoverAfter`; with the
//! kubelet really gone it does, and hands back when the kubelet returns.

mod common;

use common::k8s::proxy::Proxy;
use common::kube_node::{KubeNode, NODE};
use std::time::{Duration, Instant};

/// How long reaplet may take to list the pods once started, on a loaded 2-core machine.
const LISTED: Duration = Duration::from_secs(30);
/// The shortest threshold reaplet accepts (two of the kubelet's 10 s renewals).
const TAKEOVER_AFTER: &str = "20s";
const THRESHOLD: Duration = Duration::from_secs(20);
/// The kubelet's Lease renewal period.
const RENEWAL: Duration = Duration::from_secs(10);
/// Slack for reaplet's 2 s polls and a loaded machine.
const SLACK: Duration = Duration::from_secs(10);

/// Issue 28, item 2: reaplet's API connections are reset for 45 s; 25 s in (past the
/// threshold since the last Lease read) the kubelet crashes, and is started again about 8 s
/// later (its health endpoint refused over several of reaplet's 2 s probes in a row). The
/// kubelet's Lease is never older than the crash plus its restart; reaplet read none of it.
/// It stays passive through the outage and the window after it: no takeover, no write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_lease_and_a_kubelet_restart_in_it_never_make_a_takeover() {
    let mut n = KubeNode::start("sb-outage").await;
    let proxy = Proxy::start(n.cluster.addr()).await;
    let kc = n.cluster.node_kubeconfig_for(NODE, &proxy.url());
    n.start_reaplet_via(&kc, &["--takeover-after", TAKEOVER_AFTER]);
    // passive from the start: no pod is listed or watched
    n.wait_log("no pod watch while another agent holds the node", LISTED)
        .await;
    n.wait_log("a kubelet held the node Lease at start", LISTED)
        .await;
    // a few Lease reads seen renewed
    tokio::time::sleep(Duration::from_secs(5)).await;
    proxy.start_resetting();
    let outage = Instant::now();
    tokio::time::sleep_until((outage + Duration::from_secs(25)).into()).await;
    n.kubelet.crash();
    tokio::time::sleep(Duration::from_secs(8)).await;
    n.kubelet.restart().await;
    let back = outage.elapsed();
    tokio::time::sleep_until((outage + Duration::from_secs(45)).into()).await;
    proxy.stop_resetting();
    // the window after the outage: the first reads see the Lease the kubelet renewed
    tokio::time::sleep(Duration::from_secs(15)).await;
    // the whole log: the negative check covers every line since reaplet started
    let log = std::fs::read_to_string(&n.reaplet_log).unwrap_or_default();
    println!("the kubelet was back {back:?} into the outage");
    assert!(
        !log.contains("ReapletTookOver"),
        "reaplet took over beside a live kubelet:\n{log}"
    );
    let w = n.reaplet_writes();
    assert!(
        w.is_empty(),
        "reaplet wrote beside a live kubelet: {:#?}",
        w.iter().map(|a| a.line()).collect::<Vec<_>>()
    );
    // and the rule still takes over from a kubelet that is really gone, and hands back
    let stopped = Instant::now();
    n.kubelet.stop();
    n.wait_log("ReapletTookOver", THRESHOLD + RENEWAL + SLACK)
        .await;
    let took = stopped.elapsed();
    println!("took over {took:?} after the kubelet stopped");
    // its last renewal was at most one renewal period before the stop
    assert!(
        took >= THRESHOLD - RENEWAL,
        "took over {took:?} after the kubelet stopped"
    );
    let started = Instant::now();
    n.kubelet.restart().await;
    n.wait_log(
        "ReapletHandedBack",
        RENEWAL + SLACK + Duration::from_secs(30),
    )
    .await;
    println!(
        "handed back {:?} after the kubelet was started",
        started.elapsed()
    );
}
