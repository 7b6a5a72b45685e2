//! Standby beside the kubelet (`src/standby.rs`) against the in-process API server and a real
//! containerd (privileged: needs root): a kubelet stand-in renews the node Lease and answers
//! `/healthz`; reaplet, started in auto mode, stays passive while it lives, takes over when
//! both signals say it is gone, and hands back when the Lease renews again.

mod common;

use common::api_harness::{ApiHarness, NODE};
use common::standin::{StandIn, node_events, reaplet_requests, wait_node_event};
use common::*;
use reaplet::cri::Runtime;
use reaplet::standby::AuthoritySetting;
use reaplet_testbed::{ContainerTemplate, PodTemplate, TRAPS_TERM};
use std::time::{Duration, Instant};

/// The takeover threshold (the default is 40 s).
const TAKEOVER_AFTER: Duration = Duration::from_secs(3);
/// How often reaplet looks at the Lease and the endpoint.
const POLL: Duration = Duration::from_millis(500);
/// How often the stand-in renews (a kubelet: 10 s; scaled down with the threshold).
const RENEW: Duration = Duration::from_millis(500);
/// How long a negative check watches.
const WINDOW: Duration = Duration::from_secs(5);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standby_holds_while_the_kubelet_lives_takes_over_when_it_is_gone_and_hands_back() {
    let mut h = ApiHarness::new("standby").await;
    let api = h.api.handle();
    let mut kubelet = StandIn::new(api.handle(), NODE, RENEW);
    kubelet.start().await;

    let first = PodTemplate::new("first", 3).container(ContainerTemplate::new("app", TRAPS_TERM));
    let second = PodTemplate::new("second", 3).container(ContainerTemplate::new("app", TRAPS_TERM));
    let p1 = launch_in_api(&api, &h.tb, &first).await;
    let p2 = launch_in_api(&api, &h.tb, &second).await;
    // the kubelet mounted the first pod's volumes (a projected token, a secret, ...)
    let vols = common::mounts::KubeletVolumes::lay_out(
        &h.root.path().join("kubelet"),
        p1.uid.as_str(),
        false,
    );
    let mounted = vols.still_mounted();
    assert_eq!(mounted.len(), 7, "{mounted:?}");

    // reaplet in auto mode finds the Lease held: standby
    let kc = api.write_kubeconfig(h.root.path(), NODE);
    let mut cfg = h.config(Some(reaplet::api::client_config(Some(&kc)).await.unwrap()));
    cfg.authority = AuthoritySetting::Auto;
    cfg.kubelet_healthz_url = Some(kubelet.url());
    cfg.takeover_after = TAKEOVER_AFTER;
    cfg.standby_poll = POLL;
    // the role as an operator's alert sees it
    let metrics = std::sync::Arc::new(reaplet::metrics::Metrics::new());
    cfg.metrics = Some(metrics.clone());
    let role = |name: &str| {
        let text = metrics.encode(reaplet::metrics::Exposition::Prometheus);
        text.lines()
            .find(|l| l.starts_with(name) && !l.starts_with('#'))
            .map(|l| l.rsplit(' ').next().unwrap_or("").to_owned())
            .unwrap_or_else(|| format!("no {name} in:\n{text}"))
    };
    let cancel = h.cancel.clone();
    h.agent = Some(tokio::spawn(async move {
        reaplet::agent::run(cfg, cancel).await.unwrap();
    }));
    // standby's first look: the Lease read at start (no pod is listed or watched while passive)
    let start = Instant::now();
    while !reaplet_requests(&api)
        .iter()
        .any(|r| r.path.contains("/leases/"))
    {
        assert!(
            start.elapsed() < Duration::from_secs(40),
            "reaplet never read the Lease"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let client = h.tb.client();

    // 1. passive: a pod deleted while the kubelet lives keeps running for the whole window
    api.delete_pod("default", "first", None);
    assert_runs_for(
        &client,
        p1.container_id("app"),
        WINDOW,
        "killed in standby",
        String::new,
    )
    .await;
    assert!(api.get_pod("default", "first").is_some());
    assert_eq!(node_events(&api, "ReapletTookOver"), 0);
    // issue 37: beside a live kubelet, standby holds no pod watch and reads no pod
    let pod_reads: Vec<String> = reaplet_requests(&api)
        .iter()
        .filter(|r| r.path.contains("/pods"))
        .map(|r| format!("{} {} {:?}", r.method, r.path, r.query))
        .collect();
    assert!(
        pod_reads.is_empty(),
        "pods asked for in standby: {pod_reads:?}"
    );
    assert_eq!(
        vols.still_mounted(),
        mounted,
        "volumes unmounted in standby"
    );

    // 2. the kubelet dies (no renewals, nothing on healthz): takeover after the threshold,
    //    and the pod is finished
    kubelet.stop().await;
    let stopped = Instant::now();
    // earliest: the last renewal (up to RENEW before the stop) plus the threshold; latest:
    // seen up to one poll late, decided at the next poll after the threshold, one probe
    wait_node_event(
        &api,
        "ReapletTookOver",
        0,
        TAKEOVER_AFTER + 2 * POLL + Duration::from_secs(1) + Duration::from_secs(3),
    )
    .await;
    let takeover = stopped.elapsed();
    // the role in the metrics: acting, one takeover (metric set right after the event's line)
    wait_for_value(|| role("reaplet_standby_active"), "1").await;
    assert_eq!(role("reaplet_standby_takeovers_total"), "1");
    assert!(
        takeover + RENEW >= TAKEOVER_AFTER,
        "took over after {takeover:?}, before the {TAKEOVER_AFTER:?} threshold"
    );
    // the kill held in standby retries at once when reaplet becomes active (before: on its
    // backoff, up to RETRY_MAX + 20 %, measured 7.8-8.5 s after the takeover), then the pod's
    // grace (it exits at once on TERM), status and delete: 10 s of slack on a loaded machine
    let gone = wait_pods_gone(&api, &["first"], Duration::from_secs(10), || {
        format!("writes: {:#?}", api.writes())
    })
    .await;
    // held in standby longer than its grace, it still gets its whole termination after the
    // takeover: SIGTERM (it exits 0), not a SIGKILL at once (before: the refused attempt had
    // started the grace clock, and the retry after the takeover sent StopContainer timeout 0)
    let st =
        h.tb.client()
            .container_status(p1.container_id("app"))
            .await
            .unwrap();
    assert_eq!(st.exit_code, 0, "{st:?}");
    // and the volumes the dead kubelet left mounted were torn down before the delete
    assert!(
        vols.still_mounted().is_empty(),
        "{:?}",
        vols.still_mounted()
    );
    for d in &vols.local {
        assert!(!d.exists(), "{} not removed", d.display());
    }
    let finished = stopped.elapsed();
    println!(
        "takeover delay (stand-in stopped → ReapletTookOver, threshold {TAKEOVER_AFTER:?}, poll {POLL:?}): {:.2} s; pod finished {:.2} s after the stop ({:.2} s after the takeover)",
        takeover.as_secs_f64(),
        finished.as_secs_f64(),
        gone.as_secs_f64()
    );
    assert!(api.get_pod("default", "second").is_some());

    // 3. the kubelet is back: passive again at the first renewal seen
    let back = Instant::now();
    kubelet.start().await;
    // the first renewal after the stand-in's start is seen at the next poll (plus one probe)
    wait_node_event(
        &api,
        "ReapletHandedBack",
        0,
        2 * POLL + Duration::from_secs(1) + Duration::from_secs(3),
    )
    .await;
    let handback = back.elapsed();
    wait_for_value(|| role("reaplet_standby_active"), "0").await;
    assert_eq!(role("reaplet_standby_handbacks_total"), "1");
    println!(
        "hand-back delay (stand-in renewing again → ReapletHandedBack, poll {POLL:?}): {:.2} s",
        handback.as_secs_f64()
    );
    api.delete_pod("default", "second", None);
    assert_runs_for(
        &client,
        p2.container_id("app"),
        WINDOW,
        "killed after the hand-back",
        String::new,
    )
    .await;
    assert!(api.get_pod("default", "second").is_some());
    assert_eq!(node_events(&api, "ReapletTookOver"), 1, "one takeover only");

    kubelet.stop().await;
    h.cancel.cancel();
    if let Some(a) = h.agent.take() {
        let _ = tokio::time::timeout(Duration::from_secs(10), a).await;
    }
}

/// Waits (up to 10 s) until `read` gives `want`.
async fn wait_for_value(read: impl Fn() -> String, want: &str) {
    let start = Instant::now();
    loop {
        let got = read();
        if got == want {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "wanted {want}, got {got}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
