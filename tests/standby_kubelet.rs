//! Standby beside the real kubelet v1.36 through an outage of reaplet's own API connections
//! (privileged: root, a private containerd, a real kube-apiserver and etcd; a TCP proxy in
//! front of the API server resets reaplet's connections). reaplet runs in its default mode
//! (auto: standby, passive while a kubelet holds the node Lease). A Lease that cannot be read
//! is not a stale Lease: whatever the kubelet's health endpoint says meanwhile, reaplet never
//! takes over without a Lease read that shows it unrenewed for `takeoverAfter`; with the
//! kubelet really gone it does, and hands back when the kubelet returns.

mod common;

use common::k8s::proxy::Proxy;
use common::kube_node::{KubeNode, NODE, container_id, pod};
use reaplet_testbed::IGNORES_TERM;
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

/// reaplet's default threshold (the node lifecycle controller's grace period).
const DEFAULT_THRESHOLD: Duration = Duration::from_secs(40);

/// Issue 38, item 2: with the kubelet dead, reaplet (auto, the default 40 s threshold) has
/// taken over; a TERM-ignoring pod with grace 30 is deleted, and 5 s later reaplet is
/// restarted (SIGKILL, as a crash or the watchdog would; then started again). The restart
/// resumes as the node's agent (the Lease is still stale, the endpoint still refused, and it
/// was active in this boot), so the container is SIGKILLed at its grace, 30 s after the
/// delete. Before: the restart started passive, counting its start as a renewal, and the kill
/// waited for a takeover 40 s after the restart: SIGKILL at about 45 s. Then the converse:
/// reaplet is killed again while active, the kubelet comes back and renews, and a restart now
/// starts passive and writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_while_acting_resumes_at_once_and_never_beside_a_live_kubelet() {
    let mut n = KubeNode::start("sb-restart").await;
    n.create(&pod("stubborn", 30, IGNORES_TERM)).await;
    let running = n.wait_running("stubborn", Duration::from_secs(60)).await;
    let id = container_id(&running);
    n.kubelet.stop();
    n.start_reaplet(&[]);
    n.wait_log("ReapletTookOver", DEFAULT_THRESHOLD + RENEWAL + LISTED)
        .await;
    // the marker is written before the takeover's line (before any kill): there at once
    let marker = n.kubelet.root_dir.join("reaplet-active.json");
    assert!(marker.exists(), "no marker while active");
    let t0 = reaplet::wall_ns();
    n.delete("stubborn", None).await;
    n.wait_log("stopping container", SLACK).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    // a crash: no goodbye
    drop(n.reaplet.take());
    n.start_reaplet(&[]);
    let st = n
        .wait_exited(&id, Duration::from_secs(30) + DEFAULT_THRESHOLD)
        .await;
    let took = common::secs(st.finished_at - t0);
    println!("SIGKILL {took:.2} s after the delete (grace 30, reaplet restarted 5 s in)");
    common::assert_stopped(&st, t0, 137, 28.0..37.0);
    n.wait_log("resumed as the node's agent", SLACK).await;
    // the converse: killed again while active; the kubelet comes back and renews
    drop(n.reaplet.take());
    assert!(marker.exists(), "the marker outlives a crash");
    n.kubelet.restart().await;
    tokio::time::sleep(RENEWAL).await;
    let writes_before = n.reaplet_writes().len();
    let restarted = std::fs::metadata(&n.reaplet_log).map_or(0, |m| m.len());
    n.start_reaplet(&[]);
    let since_restart = || {
        let log = std::fs::read_to_string(&n.reaplet_log).unwrap_or_default();
        log.get(restarted as usize..).unwrap_or_default().to_owned()
    };
    let t1 = Instant::now();
    while !since_restart().contains("no pod watch while another agent holds the node") {
        assert!(
            t1.elapsed() < LISTED,
            "no start decision:\n{}",
            since_restart()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // the whole window after the restart
    tokio::time::sleep(Duration::from_secs(15)).await;
    let after = since_restart();
    assert!(
        after.contains("a kubelet held the node Lease at start"),
        "not passive at the restart beside a live kubelet:\n{after}"
    );
    assert!(
        !after.contains("ReapletTookOver") && !after.contains("resumed as the node's agent"),
        "acted beside a live kubelet:\n{after}"
    );
    assert_eq!(
        n.reaplet_writes().len(),
        writes_before,
        "wrote beside a live kubelet"
    );
    assert!(!marker.exists(), "the passive start removes the marker");
}
