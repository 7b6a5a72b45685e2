//! Container exits as events. From a real containerd: the test bed's containerd 2.x answers CRI
//! `GetContainerEvents` (from containerd 1.7 on), Debian's containerd 1.6 (the compatibility
//! job) does not, and `CriClient::container_events` then subscribes to containerd's own events
//! service on the same socket; each runtime must give the source it offers. A container that
//! exits by itself is reported with its exit status and time, and the exit -> event latency is printed; a containerd restart ends the
//! receiver, and a new subscription works. Then the whole agent (`reaplet run`) against the
//! in-process API server: an exit becomes the terminal status PATCH through the event path,
//! also after a broken stream and for a burst of exits; and, on a fake CRI runtime that serves
//! `GetContainerEvents`, the CRI source is preferred and drives the relist (privileged: the
//! test bed needs root).
//!
//! Timing: an exit's time is the runtime's own (`finished_at`, wall clock), a status's arrival
//! the API server's answer (`Recorded::at`, an `Instant`, converted to wall clock by
//! [`gate::wall_of`]). Bounds derive from the relist periods the agent is given: with
//! `--relist-period-with-events` at [`RELIST_WITH_EVENTS`], a status within [`EVENT_PATH`] of
//! the exit (the polling period, 1 s) can only come from an event.

mod common;

#[path = "../benches/termination/fake_cri.rs"]
#[allow(dead_code)]
mod fake_cri;

use common::apiserver::{ApiServer, Recorded};
use common::gate::{self, Gate};
use common::*;
use futures_util::StreamExt;
use reaplet::cri::{
    ContainerDetail, ContainerEventKind, ContainerRunState, CriClient, CriConfig, EventSource,
    EventSubscription, Runtime,
};
use reaplet_testbed::{ContainerTemplate, PodTemplate, Testbed, launch};
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// Bound on an event's arrival after the container's planned exit (generous: a loaded CI).
const EVENT_BOUND: Duration = Duration::from_secs(10);

fn ms(ns: i64) -> f64 {
    ns as f64 / 1e6
}

async fn subscribe(tb: &Testbed, client: &CriClient) -> EventSubscription {
    let sub = client.container_events().await.expect("events subscribed");
    let (offered, version) = tb.offered_event_source().await;
    assert_eq!(
        sub.source, offered,
        "the source containerd {version} offers"
    );
    sub
}

/// Waits for the exit event of each of `ids`; returns (id, exit code, exited_at, received at).
async fn exits(sub: &mut EventSubscription, ids: &[String]) -> Vec<(String, i32, i64, i64)> {
    let mut got = Vec::new();
    let limit = tokio::time::Instant::now() + EVENT_BOUND;
    while got.len() < ids.len() {
        let ev = tokio::time::timeout_at(limit, sub.events.recv())
            .await
            .unwrap_or_else(|_| panic!("exits of {ids:?} within {EVENT_BOUND:?}; got {got:?}"))
            .expect("the event stream stays open");
        let received = now_ns();
        if ev.kind != ContainerEventKind::Exited || !ids.contains(&ev.container_id) {
            continue;
        }
        let code = ev.exit_code.expect("an exit carries its status");
        let at = ev.exited_at.expect("an exit carries its time");
        got.push((ev.container_id, code, at, received));
    }
    got
}

#[tokio::test(flavor = "multi_thread")]
async fn a_container_exit_arrives_as_a_task_exit() {
    let tb = Testbed::start(repo(), "events-exit");
    let client = tb.client();
    let mut sub = subscribe(&tb, &client).await;
    let mut t = PodTemplate::new("events-exit", 30);
    for i in 0..5 {
        t = t.container(ContainerTemplate::new(
            &format!("app{i}"),
            &format!("sleep 0.{}; exit 3", 5 + i),
        ));
    }
    let pod = launch(&tb, &t).await.expect("pod launched");
    let ids: Vec<String> = pod.containers.iter().map(|(_, id)| id.clone()).collect();
    let got = exits(&mut sub, &ids).await;
    let mut latencies = Vec::new();
    for (id, code, at, received) in &got {
        assert_eq!(*code, 3, "exit status of {id}");
        latencies.push(received - at);
        // the runtime's own record of the exit says the same
        let limit = Instant::now() + EVENT_BOUND;
        let status = loop {
            let s = client.container_status(id).await.expect("container status");
            if s.state == ContainerRunState::Exited {
                break s;
            }
            assert!(Instant::now() < limit, "{id} exited in CRI: {s:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert_eq!(status.exit_code, 3, "{id}");
        assert_eq!(
            status.finished_at, *at,
            "{id}: CRI finishedAt is the event's exit time"
        );
    }
    latencies.sort_unstable();
    println!(
        "exit -> event latency over {} exits: median {:.2} ms, max {:.2} ms ({:?})",
        latencies.len(),
        ms(latencies[latencies.len() / 2]),
        ms(*latencies.last().unwrap()),
        latencies
            .iter()
            .map(|l| format!("{:.2}", ms(*l)))
            .collect::<Vec<_>>()
    );
    for l in &latencies {
        assert!(*l >= 0, "an event before its exit: {latencies:?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_containerd_restart_ends_the_stream_and_a_new_subscription_works() {
    let tb = Testbed::start(repo(), "events-restart");
    let client = tb.client();
    let mut sub = subscribe(&tb, &client).await;
    tokio::task::block_in_place(|| tb.restart_containerd()).expect("containerd restarts");
    let ended = tokio::time::timeout(Duration::from_secs(30), async {
        while sub.events.recv().await.is_some() {}
    })
    .await;
    assert!(ended.is_ok(), "the receiver ends when containerd goes away");
    // the caller subscribes again
    let limit = Instant::now() + Duration::from_secs(30);
    let mut sub = loop {
        match client.container_events().await {
            Ok(sub) => break sub,
            Err(e) => {
                assert!(
                    Instant::now() < limit,
                    "resubscribed after the restart: {e}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    assert_eq!(sub.source, tb.offered_event_source().await.0);
    let t = PodTemplate::new("events-restart", 30)
        .container(ContainerTemplate::new("app", "sleep 0.5; exit 3"));
    let pod = launch(&tb, &t).await.expect("pod launched");
    let got = exits(&mut sub, &[pod.container_id("app").to_owned()]).await;
    assert_eq!(got[0].1, 3);
}

// ---------------------------------------------------------------------------------------------
// The whole agent: exit -> terminal status PATCH.

/// The relist period the agent is given while events flow: far above every bound below, so a
/// periodic relist explains a status within [`EVENT_PATH`] at most once in 30 runs (and then
/// the test passes for the wrong reason, it never fails for it).
const RELIST_WITH_EVENTS: &str = "30s";
/// The polling relist period (reaplet's default `relistPeriod`, the kubelet's PLEG period):
/// used while no subscription is up.
const RELIST: Duration = Duration::from_secs(1);
/// Exit -> terminal status through the event path: under the polling period itself, so only
/// an event can make it (measured: well under 100 ms on a loaded 2-core machine, debug build).
const EVENT_PATH: Duration = RELIST;
/// How long the agent keeps polling every [`RELIST`] after a (re)subscription
/// (`housekeeping::AFTER_SUBSCRIBE`).
const AFTER_SUBSCRIBE: Duration = Duration::from_secs(10);
/// A hang guard: how long the agent may take to start, subscribe and list.
const START_LIMIT: Duration = Duration::from_secs(30);
/// A hang guard on a terminal status: past the with-events relist period, which would have
/// reported it even without events.
const STATUS_LIMIT: Duration = Duration::from_secs(40);
const SUBSCRIBED: &str = "container events subscribed";

/// `reaplet run` in its own process, killed and reaped when dropped.
struct Agent {
    child: Child,
    log: std::path::PathBuf,
}

impl Agent {
    /// Waits until `SUBSCRIBED` is logged `n` times (fails after `limit`); returns how long
    /// that took and the last such line.
    async fn wait_subscribed(&self, n: usize, limit: Duration) -> (Duration, String) {
        let start = Instant::now();
        loop {
            let log = read_log(&self.log);
            let lines: Vec<&str> = log.lines().filter(|l| l.contains(SUBSCRIBED)).collect();
            if lines.len() >= n {
                return (start.elapsed(), lines[n - 1].to_owned());
            }
            assert!(
                start.elapsed() < limit,
                "{SUBSCRIBED:?} logged {} of {n} times within {limit:?}\n{}",
                lines.len(),
                tail(&log, 30)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn log_tail(&self) -> String {
        tail(&read_log(&self.log), 40)
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The agent on the test bed, relisting every [`RELIST_WITH_EVENTS`] while events flow; returns
/// once it is subscribed (containerd's events service) and in sync with the API.
async fn start_agent(tb: &Testbed, api: &ApiServer, root: &Path, kc: &Path) -> Agent {
    start_agent_with(tb, api, root, kc, &[]).await
}

/// [`start_agent`] with more flags.
async fn start_agent_with(
    tb: &Testbed,
    api: &ApiServer,
    root: &Path,
    kc: &Path,
    more: &[&str],
) -> Agent {
    let log = root.join("reaplet.log");
    let kc = kc.display().to_string();
    let mut extra = vec![
        "--kubeconfig",
        &kc,
        "--relist-period-with-events",
        RELIST_WITH_EVENTS,
    ];
    extra.extend_from_slice(more);
    let child = spawn_reaplet(tb, &root.join("kubelet"), &extra, &log);
    let agent = Agent { child, log };
    let (_, line) = agent.wait_subscribed(1, START_LIMIT).await;
    let (offered, _) = tb.offered_event_source().await;
    assert!(line.contains(offered.as_str()), "{line}");
    wait_in_sync(api).await;
    agent
}

/// A `restartPolicy: Never` pod whose container `app` waits at the gate, then exits `code`.
fn gated_pod(gate: &Gate, name: &str, code: i32) -> PodTemplate {
    let mut t = PodTemplate::new(name, 30)
        .container(ContainerTemplate::new("app", &gate.script(name, code)));
    t.restart_policy = "Never";
    t
}

/// Waits for pod `name`'s terminal status PATCH (fails after [`STATUS_LIMIT`]).
async fn wait_terminal(api: &ApiServer, name: &str, agent: &Agent) -> Recorded {
    let start = Instant::now();
    loop {
        if let Some(r) = gate::terminal_patch(api, name) {
            return r;
        }
        assert!(
            start.elapsed() < STATUS_LIMIT,
            "no terminal status for {name} within {STATUS_LIMIT:?}\n{}",
            agent.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The container's final state in the runtime (it has exited by the time its status is out).
async fn exited(client: &CriClient, id: &str) -> ContainerDetail {
    let st = client.container_status(id).await.expect("container status");
    assert_eq!(st.state, ContainerRunState::Exited, "{id}: {st:?}");
    st
}

/// Pod `name`'s terminal status and the time from its container's exit to the PATCH's answer.
async fn exit_to_status(
    tb: &Testbed,
    api: &ApiServer,
    agent: &Agent,
    name: &str,
    container_id: &str,
) -> (Duration, Recorded, ContainerDetail) {
    let patch = wait_terminal(api, name, agent).await;
    let answered = gate::wall_of(patch.at);
    let st = exited(&tb.client(), container_id).await;
    let took = answered - st.finished_at;
    assert!(
        took > 0,
        "{name}: status at {answered} before the exit at {}",
        st.finished_at
    );
    (Duration::from_nanos(took as u64), patch, st)
}

/// Asserts the PATCH carries what the runtime says: phase Failed, the exit code, `finishedAt`
/// (second precision, as the API stores it).
#[track_caller]
fn assert_failed_with(patch: &Recorded, st: &ContainerDetail, code: i32) {
    let status = &patch.body["status"];
    assert_eq!(status["phase"], "Failed", "{status:#}");
    let app = status["containerStatuses"]
        .as_array()
        .and_then(|l| l.iter().find(|c| c["name"] == "app"))
        .unwrap_or_else(|| panic!("no status of app: {status:#}"));
    let term = &app["state"]["terminated"];
    assert_eq!(term["exitCode"], code, "{term}");
    assert_eq!(st.exit_code, code);
    let at: jiff::Timestamp = term["finishedAt"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("finishedAt: {term}"));
    assert_eq!(
        at.as_second(),
        st.finished_at.div_euclid(1_000_000_000),
        "finishedAt {term} vs the runtime's {}",
        st.finished_at
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_exit_is_reported_through_the_event_path_with_the_runtimes_status() {
    let (tb, api, root, kc) = api_bed("events-status").await;
    let gate = Gate::start().await;
    let t = gated_pod(&gate, "ev-status", 3);
    let p = launch_in_api(&api, &tb, &t).await;
    let agent = start_agent(&tb, &api, root.path(), &kc).await;
    // Past the fast polling after the subscription, only an event finds the exit before the
    // 30 s relist. The bound is a third of that relist, not the polling period: containerd 2.x
    // sends CRI's stopped event only once it has deleted the task (the runtime's status is
    // final then), which took 30 ms to 1.6 s here with nine other tests running (its events
    // service, 1.6's source, publishes the exit at once).
    tokio::time::sleep(AFTER_SUBSCRIBE + Duration::from_secs(1)).await;
    gate.open(&t.name);
    let (took, patch, st) = exit_to_status(&tb, &api, &agent, &t.name, p.container_id("app")).await;
    println!(
        "exit -> terminal status answered: {:.1} ms (event path; relist every {RELIST_WITH_EVENTS})",
        took.as_secs_f64() * 1e3
    );
    let bound = Duration::from_secs(10);
    assert!(
        took < bound,
        "exit -> status {took:?}, not under {bound:?} (the relist is every \
         {RELIST_WITH_EVENTS})\n{}",
        agent.log_tail()
    );
    assert_failed_with(&patch, &st, 3);
}

/// containerd restarted under the agent: its event stream breaks. An exit while the agent is
/// resubscribing is found by the polling relist (every [`RELIST`] meanwhile) or the relist that
/// follows the resubscription; an exit after it goes through the event path again.
#[tokio::test(flavor = "multi_thread")]
async fn after_a_broken_event_stream_exits_are_still_reported() {
    let (tb, api, root, kc) = api_bed("events-broken").await;
    let gate = Gate::start().await;
    let during = gated_pod(&gate, "ev-during", 3);
    let after = gated_pod(&gate, "ev-after", 4);
    let p_during = launch_in_api(&api, &tb, &during).await;
    let p_after = launch_in_api(&api, &tb, &after).await;
    let agent = start_agent(&tb, &api, root.path(), &kc).await;
    let restart = Instant::now();
    tokio::task::block_in_place(|| tb.restart_containerd()).expect("containerd restarts");
    let restart_took = restart.elapsed();
    // at once: usually before the resubscription (its first try is 1 s after the break)
    gate.open(&during.name);
    let (took, patch, st) = exit_to_status(
        &tb,
        &api,
        &agent,
        &during.name,
        p_during.container_id("app"),
    )
    .await;
    assert_failed_with(&patch, &st, 3);
    // The stream ends when containerd stops; resubscription tries follow 1 s, 2 s, 4 s, ...
    // later (the backoff), so the one after containerd is back comes within twice the restart
    // plus the first step; meanwhile the relist polls every RELIST.
    let resub_limit = restart_took * 2 + Duration::from_secs(1) + START_LIMIT;
    let (_, line) = agent.wait_subscribed(2, resub_limit).await;
    let resubscribed = restart.elapsed();
    let (offered, _) = tb.offered_event_source().await;
    assert!(line.contains(offered.as_str()), "{line}");
    println!(
        "containerd restart took {:.2} s; resubscribed {:.2} s after it began; \
         an exit just after the restart reported in {:.1} ms",
        restart_took.as_secs_f64(),
        resubscribed.as_secs_f64(),
        took.as_secs_f64() * 1e3
    );
    // found by the next polling relist (within RELIST: containerd is back, and the agent
    // polls while unsubscribed), or by an event if resubscribed already; then the path from
    // the relist to the PATCH, as the event path's. A list made while containerd was still
    // coming up fails and waits the runtime backoff's first step (1 s) before the next, and
    // a loaded 2-core machine adds up to a second more (measured here: 0.42 to 2.56 s)
    let bound = RELIST + Duration::from_secs(1) + EVENT_PATH + Duration::from_secs(1);
    assert!(
        took < bound,
        "an exit during the resubscription reported after {took:?}, not under {bound:?}\n{}",
        agent.log_tail()
    );
    // for AFTER_SUBSCRIBE after a resubscription the agent still polls every RELIST, so an
    // exit then could be found either way; past it only an event finds an exit before the
    // 30 s relist. The bound is a third of that relist: a slow event on a loaded machine
    // passes, a missed one cannot.
    tokio::time::sleep(AFTER_SUBSCRIBE + Duration::from_secs(1)).await;
    gate.open(&after.name);
    let (took, patch, st) =
        exit_to_status(&tb, &api, &agent, &after.name, p_after.container_id("app")).await;
    println!(
        "an exit after the resubscription (and its fast polling) reported in {:.1} ms",
        took.as_secs_f64() * 1e3
    );
    let bound = Duration::from_secs(10);
    assert!(
        took < bound,
        "exit -> status {took:?} after the resubscription, not under {bound:?} (the relist is \
         every {RELIST_WITH_EVENTS})\n{}",
        agent.log_tail()
    );
    assert_failed_with(&patch, &st, 4);
}

/// 110 pods (the kubelet's default maxPods) launched, then their containers exit at once: every
/// pod gets its terminal status, the last one soon after the last exit.
#[tokio::test(flavor = "multi_thread")]
async fn a_burst_of_110_exits_is_reported() {
    const PODS: usize = 110;
    /// Pods launched at once: the 2-core test machine's containerd gains little beyond that.
    const LAUNCH_PAR: usize = 8;
    /// Last exit -> last status: a third of the with-events relist period, so a periodic relist
    /// alone would miss it (measured: about 1-3 s on a loaded 2-core machine, debug build: the
    /// 110 kills share containerd, which stops the sandboxes meanwhile).
    const BURST_BOUND: Duration = Duration::from_secs(10);
    let (tb, api, root, kc) = api_bed("events-burst").await;
    let gate = Gate::start().await;
    let launch_start = Instant::now();
    let templates: Vec<PodTemplate> = (0..PODS)
        .map(|i| gated_pod(&gate, &format!("ev-burst-{i}"), 0))
        .collect();
    let pods: Vec<(String, String)> = futures_util::stream::iter(&templates)
        .map(|t| {
            let (api, tb) = (&api, &tb);
            async move {
                let p = launch_in_api(api, tb, t).await;
                (t.name.clone(), p.container_id("app").to_owned())
            }
        })
        .buffer_unordered(LAUNCH_PAR)
        .collect()
        .await;
    let launched = launch_start.elapsed();
    let metrics = common::process::free_addr();
    let addr = metrics.to_string();
    let agent = start_agent_with(
        &tb,
        &api,
        root.path(),
        &kc,
        &["--metrics-bind-address", &addr],
    )
    .await;
    let relists_before = relists(metrics).await;
    gate.open_all();
    let client = tb.client();
    let mut last_exit = 0;
    let mut last_status = 0;
    let mut per_pod = Vec::with_capacity(PODS);
    for (name, cid) in &pods {
        let patch = wait_terminal(&api, name, &agent).await;
        let st = exited(&client, cid).await;
        assert_eq!(
            patch.body["status"]["phase"], "Succeeded",
            "{name}: {patch:?}"
        );
        let answered = gate::wall_of(patch.at);
        last_exit = last_exit.max(st.finished_at);
        last_status = last_status.max(answered);
        per_pod.push(ms(answered - st.finished_at));
    }
    per_pod.sort_by(f64::total_cmp);
    let tail_took = Duration::from_nanos((last_status - last_exit).max(0) as u64);
    println!(
        "{PODS} pods launched in {:.1} s ({LAUNCH_PAR} at a time); their exits reported: \
         last exit -> last status {:.0} ms; per pod median {:.0} ms, max {:.0} ms",
        launched.as_secs_f64(),
        tail_took.as_secs_f64() * 1e3,
        per_pod[PODS / 2],
        per_pod[PODS - 1]
    );
    assert!(
        tail_took < BURST_BOUND,
        "last exit -> last status {tail_took:?}, not under {BURST_BOUND:?}\n{}",
        agent.log_tail()
    );
    // the exits were relisted pod by pod (or a few pods at a time as full relists), never a
    // full relist per event (before: one per exit and per deletion event, about 4 a pod)
    let (full0, pod0) = relists_before;
    let (full, pod) = relists(metrics).await;
    let (full, pod) = (full - full0, pod - pod0);
    println!(
        "relists during the burst: {full} full, {pod} of one pod ({:.2} list calls per pod)",
        (2.0 * (full + pod) as f64) / PODS as f64
    );
    assert!(
        full <= FULL_RELISTS_MAX,
        "{full} full relists for {PODS} exits (bound {FULL_RELISTS_MAX})"
    );
    assert!(
        full + pod <= 3 * PODS as u64,
        "{} relists for {PODS} exits",
        full + pod
    );
}

/// Full relists a burst of 110 exits may cost: one per `reaplet::workers::FULL_DEBOUNCE`
/// over the burst's reporting window (10 s: 40) would be the worst case; a
/// full relist per event was several hundred.
const FULL_RELISTS_MAX: u64 = 40;

/// reaplet's relists so far: (full, one pod), from its metrics.
async fn relists(addr: std::net::SocketAddr) -> (u64, u64) {
    let (code, text) = reaplet::server::fetch(addr, "/metrics").await.unwrap();
    assert_eq!(code, 200, "{text}");
    let read = |scope: &str| {
        text.lines()
            .find_map(|l| {
                l.strip_prefix(&format!(
                    "reaplet_runtime_relists_total{{scope=\"{scope}\"}} "
                ))
            })
            .map_or(0, |v| v.trim().parse::<f64>().unwrap_or(0.0) as u64)
    };
    (read("full"), read("pod"))
}

// ---------------------------------------------------------------------------------------------
// The CRI source: a fake runtime that serves GetContainerEvents.

/// A runtime with CRI `GetContainerEvents` is subscribed through it (containerd's events
/// service is not asked), and an exit event it sends drives the agent's relist: the terminal
/// status follows within [`EVENT_PATH`], with the relist period at [`RELIST_WITH_EVENTS`].
#[tokio::test(flavor = "multi_thread")]
async fn the_cri_event_source_is_preferred_and_drives_the_relist() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("cri.sock");
    let cri = fake_cri::FakeCri::new(fake_cri::Latency {
        call: Duration::ZERO,
        stop: Duration::ZERO,
    })
    .with_events();
    let api = ApiServer::start().await;
    let mut pods = Vec::new();
    for name in ["ev-cri-direct", "ev-cri-agent"] {
        let mut t = PodTemplate::new(name, 30).container(ContainerTemplate::new("app", ""));
        t.restart_policy = "Never";
        api.create_pod(t.api_object());
        cri.add_pod(&t.uid, &t.name, &t.namespace, 30);
        pods.push(t);
    }
    cri.clone().serve(&sock).await.unwrap();
    let endpoint = format!("unix://{}", sock.display());
    // the client on its own: CRI first, and the event as sent
    let client = CriClient::new(&CriConfig {
        endpoint: endpoint.clone(),
        request_timeout: Duration::from_secs(10),
    })
    .unwrap();
    let mut sub = client.container_events().await.expect("subscribed");
    assert_eq!(sub.source, EventSource::Cri);
    let exited_at = cri.exit(&pods[0].uid, 2);
    let ev = tokio::time::timeout(STATUS_LIMIT, sub.events.recv())
        .await
        .expect("the exit event within the limit")
        .expect("the stream stays open");
    assert_eq!(ev.container_id, format!("c-{}", pods[0].uid));
    assert_eq!(ev.kind, ContainerEventKind::Exited);
    assert_eq!((ev.exit_code, ev.exited_at), (Some(2), Some(exited_at)));
    drop(sub);
    // the whole agent on it
    let kc = api.write_kubeconfig(dir.path(), "testnode");
    let log = dir.path().join("reaplet.log");
    let child = reaplet()
        .arg("run")
        .arg("--kubeconfig")
        .arg(&kc)
        .args(["--hostname-override", "testnode"])
        .args(["--container-runtime-endpoint", &endpoint])
        .args(["--cgroup-root", "/reaplet-test-none"])
        .arg("--root-dir")
        .arg(dir.path().join("kubelet"))
        .args(["--metrics-bind-address", "127.0.0.1:0"])
        .args(["--relist-period-with-events", RELIST_WITH_EVENTS])
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("spawning reaplet");
    let agent = Agent { child, log };
    let (_, line) = agent.wait_subscribed(1, START_LIMIT).await;
    assert!(line.contains("CRI GetContainerEvents"), "{line}");
    wait_in_sync(&api).await;
    // the pod that exited before the agent started is found by its first relist
    wait_terminal(&api, &pods[0].name, &agent).await;
    let exited_at = cri.exit(&pods[1].uid, 3);
    let patch = wait_terminal(&api, &pods[1].name, &agent).await;
    let took = Duration::from_nanos((gate::wall_of(patch.at) - exited_at).max(0) as u64);
    println!(
        "fake CRI with GetContainerEvents: exit -> terminal status answered {:.1} ms",
        took.as_secs_f64() * 1e3
    );
    assert!(
        took < EVENT_PATH,
        "exit -> status {took:?}, not under {EVENT_PATH:?}\n{}",
        agent.log_tail()
    );
    let status = &patch.body["status"];
    assert_eq!(status["phase"], "Failed", "{status:#}");
    assert_eq!(
        status["containerStatuses"][0]["state"]["terminated"]["exitCode"], 3,
        "{status:#}"
    );
}
