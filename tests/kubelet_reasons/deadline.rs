//! `activeDeadlineSeconds` side by side.

use super::*;

/// `activeDeadlineSeconds` on a TERM-trapping pod beside one without a deadline: the kubelet
/// ends its pod (5 s); then reaplet ends the other (60 s, past the kubelet's round and the
/// takeover). The same final status (Failed, `DeadlineExceeded`, no `DisruptionTarget`), the
/// same Normal event, the pod's own grace, the object kept, the bystander untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn active_deadline_ends_pods_as_the_kubelet_does() {
    let _one = ONE_NODE.lock().await;
    let mut n = KubeNode::start("deadline-kubelet").await;
    let mut k = pod("dl-k", 30, reaplet_testbed::TRAPS_TERM);
    k["spec"]["activeDeadlineSeconds"] = json!(5);
    let mut r = pod("dl-r", 30, reaplet_testbed::TRAPS_TERM);
    r["spec"]["activeDeadlineSeconds"] = json!(60);
    let steady = pod("steady", 30, reaplet_testbed::TRAPS_TERM);
    // reaplet removes a finished pod's sandbox at its next relist: exits from the events
    let exits = Exits::watch(&n.client).await;
    for p in [&k, &r, &steady] {
        n.create(p).await;
    }
    let mut ids = Vec::new();
    for name in ["dl-k", "dl-r", "steady"] {
        let p = n.wait_running(name, Duration::from_secs(90)).await;
        ids.push(container_id(&p));
    }
    let quiet_since = reaplet::wall_ns();
    let k_end = deadline_end(
        &n,
        &exits,
        "dl-k",
        &ids[0],
        5,
        "kubelet/",
        Duration::from_secs(60),
    )
    .await;
    n.kubelet.stop();
    n.start_reaplet(&["--authority", "primary"]);
    let r_end = deadline_end(
        &n,
        &exits,
        "dl-r",
        &ids[1],
        60,
        "reaplet/",
        Duration::from_secs(90),
    )
    .await;
    compare("deadline (startTime has whole seconds)", &k_end, &r_end);
    // never before the deadline (startTime is cut to the second), and within a few passes
    assert!(
        r_end.after_crossing > -1.0 && r_end.after_crossing < 10.0,
        "reaplet ended it {:.2} s after the deadline",
        r_end.after_crossing
    );
    let st = n.client.container_status(&ids[2]).await.unwrap();
    assert!(st.state.may_run(), "the bystander was ended: {st:?}");
    for who in ["kubelet/", "reaplet/"] {
        let w: Vec<_> = n
            .pod_writes(who, "steady")
            .into_iter()
            .filter(|a| common::kube_node::received_ns(a) >= quiet_since)
            .collect();
        assert!(w.is_empty(), "{who} wrote to the bystander: {w:#?}");
        for name in ["dl-k", "dl-r"] {
            assert!(
                n.pod_writes(who, name).iter().all(|a| a.verb != "delete"),
                "{who} deleted {name}"
            );
        }
    }
    n.stop_reaplet();
}

/// Waits for `who` to end `name` (container `id`) for its deadline of `deadline` s; the
/// figures as an [`Eviction`]'s (`after_crossing`: from `startTime + deadline` to the exit).
async fn deadline_end(
    n: &KubeNode,
    exits: &Exits,
    name: &str,
    id: &str,
    deadline: i64,
    who: &str,
    window: Duration,
) -> Eviction {
    let st = exits.of(id, window, || n.reaplet_tail(30)).await;
    let (status, event) = terminal(n, name, who, "DeadlineExceeded").await;
    let start: jiff::Timestamp = status["status"]["startTime"]
        .as_str()
        .expect("a startTime")
        .parse()
        .unwrap();
    let due = start.as_nanosecond() as i64 + deadline * 1_000_000_000;
    let status_writes = n
        .pod_writes(who, name)
        .iter()
        .filter(|a| {
            a.subresource == "status" && common::kube_node::received_ns(a) >= due - 1_000_000_000
        })
        .count();
    Eviction {
        after_crossing: (st.finished_at - due) as f64 / 1e9,
        grace: None,
        exit_code: st.exit_code,
        status: digest(&status),
        status_writes,
        event: event_digest(&event),
    }
}
