//! `pid.available`, side by side: a hard threshold [`MARGIN`] tasks below what the machine had
//! free when the test began, and a BestEffort pod per agent that starts [`FORKS`] processes
//! when the test says (each TERM-ignoring, so SIGKILL at the runtime's 2 s floor). The
//! bystanders have a higher priority (PID ranking is priority first, then the process count).
//! Compared: the final status (`The node was low on resource: pids. Threshold quantity: …`),
//! the event and its annotations, the exit code, the grace, the node's `EvictionThresholdMet`
//! ("Attempting to reclaim pids"), the bystanders untouched, the objects kept.
//!
//! The signal is the whole machine's (`min(pid_max, threads-max)` less every task), so the
//! margins are wide: the stack's own tasks (an API server, etcd, containerd, the kubelet, the
//! shims: a few hundred) and another test's in a lane beside stay far inside [`MARGIN`], and
//! [`FORKS`] crosses it by as much again.

use super::*;

/// How far below the machine's free tasks at the start the threshold is.
const MARGIN: i64 = 2000;
/// Processes each forking pod starts.
const FORKS: u32 = 4000;

/// `min(pid_max, threads-max)` less the tasks now, as the kubelet and reaplet read it.
fn free_tasks() -> i64 {
    let num = |p: &str| -> i64 { std::fs::read_to_string(p).unwrap().trim().parse().unwrap() };
    let cap = num("/proc/sys/kernel/pid_max").min(num("/proc/sys/kernel/threads-max"));
    let loadavg = std::fs::read_to_string("/proc/loadavg").unwrap();
    let tasks: i64 = loadavg
        .split_whitespace()
        .nth(3)
        .and_then(|f| f.split('/').nth(1))
        .and_then(|t| t.parse().ok())
        .expect("loadavg's task count");
    cap - tasks
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pid_pressure_evicts_the_forking_pod_as_the_kubelet_does() {
    let _one = ONE_NODE.lock().await;
    // a multiple of 1000, as an operator writes it (both print it as `Nk`)
    let threshold = (free_tasks() - MARGIN) / 1000 * 1000;
    assert!(
        threshold > 2 * i64::from(FORKS),
        "this machine has too few free PIDs for the test: threshold {threshold}"
    );
    let mut n = KubeNode::start_with(
        "pids-kubelet",
        &format!(
            "evictionHard: {{pid.available: \"{threshold}\", nodefs.available: \"1%\", \
             imagefs.available: \"1%\"}}"
        ),
    )
    .await;
    let reader = common::crossing::host_reader(&n.tb.cgroup_root);
    let crossing = Crossing {
        reader: reader.clone(),
        signal: Signal::Pid,
        below: threshold,
    };
    let gate = Gate::start().await;
    let exits = Exits::watch(&n.client).await;
    let forkers = ["fork-k", "fork-r"];
    let pods = forkers.map(|name| worker(&gate, name, Work::Fork(FORKS), true, false));
    create_victims(&n, &gate, pods.to_vec()).await;
    steady_bystanders(&n).await;
    let ids = running_with_stats(&n, &["burstable", "guaranteed", "fork-k", "fork-r"]).await;
    let before = Signal::Pid
        .available(&reader.observe())
        .expect("pid.available");
    assert!(
        before > threshold + 500,
        "pid.available {before} is already near the threshold {threshold} before any fork"
    );
    let quiet_since = reaplet::wall_ns();

    let (mut k, mut r) = rounds(&mut n, &gate, &crossing, &exits, &["fork-k"], &["fork-r"]).await;
    let (k, r) = (k.remove(0), r.remove(0));
    compare("pid.available, TERM ignored, from the crossing", &k, &r);
    for e in [&k, &r] {
        assert_eq!(
            e.status["message"],
            "The node was low on resource: pids. Threshold quantity: #, available: #. ",
            "no container is blamed for PIDs"
        );
    }
    // the hard threshold's grace: 1 s, raised to the runtime's 2 s floor for both (exit 137
    // for both, compared above). Not bounded below here: a pod busy forking asks the gate
    // for its SIGTERM late (measured 1.52 s from that ask to the exit for a 2 s kill)
    let (r_grace, k_grace) = (r.grace.unwrap(), k.grace.unwrap());
    assert!(
        r_grace < k_grace + 1.5,
        "reaplet's grace {r_grace:.2} s, the kubelet's {k_grace:.2} s"
    );
    threshold_met_events(&n, "pids").await;
    untouched(&n, &ids[..2], quiet_since).await;
    kept(&n, &forkers).await;
    n.stop_reaplet();
}
