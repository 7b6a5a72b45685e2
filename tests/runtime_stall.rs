//! A stalled runtime (issue 15 §2): a frozen shim and a SIGSTOPped containerd are not a reason
//! for the watchdog to restart reaplet, and no termination is lost when the runtime answers
//! again.
//!
//! reaplet runs as a process with `NOTIFY_SOCKET` on a datagram socket the test reads and
//! `WATCHDOG_USEC` as in the unit (30 s): a `WATCHDOG=1` gap of a whole watchdog interval is
//! what would make systemd restart it. The two tests use a containerd each and run at once.

mod common;

use common::apiserver::ApiServer;
use common::*;
use reaplet::cri::Runtime;
use reaplet_testbed::{IGNORES_TERM, TRAPS_TERM, Testbed};
use std::net::SocketAddr;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The watchdog interval of the unit (`WatchdogSec=30s`).
const WATCHDOG: Duration = Duration::from_secs(30);
/// How long containerd stays SIGSTOPped (the 2 minutes).
const STALL: Duration = Duration::from_secs(120);
/// reaplet's runtime unhealthy threshold (`PipelineConfig::runtime_unhealthy_after`).
const UNHEALTHY_AFTER: Duration = Duration::from_secs(30);
/// The grace of the pods deleted while the runtime stalls.
const GRACE: u64 = 5;
/// The kubelet's minimum stop grace after a preStop hook, and reaplet's floor for any kill.
const FLOOR: u64 = 2;
/// Measured on this machine kind (testbed.md, the pipeline tests): a stopped pod's sandbox
/// stop, cgroup removal, status patch and DELETE take < 0.5 s; ×4 for a loaded 2-core machine.
const TEARDOWN: Duration = Duration::from_secs(2);
/// One failed kill attempt's retry (lifecycle `RETRY_BASE`, 1 s, plus up to 20 % jitter).
const ONE_RETRY: Duration = Duration::from_millis(1200);

/// Every datagram reaplet sent to `NOTIFY_SOCKET`, with when it arrived.
#[derive(Clone, Default)]
struct Notes(Arc<Mutex<Vec<(Instant, String)>>>);

impl Notes {
    /// Binds `path` and records every datagram until the socket is gone.
    fn listen(path: &Path) -> Notes {
        let sock = UnixDatagram::bind(path).expect("binding the notify socket");
        sock.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let notes = Notes::default();
        let out = notes.0.clone();
        let path = path.to_owned();
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 64 * 1024];
            while path.exists() {
                if let Ok(n) = sock.recv(&mut buf) {
                    let text = String::from_utf8_lossy(&buf[..n]).into_owned();
                    out.lock().unwrap().push((Instant::now(), text));
                }
            }
        });
        notes
    }

    fn all(&self) -> Vec<(Instant, String)> {
        self.0.lock().unwrap().clone()
    }

    /// When `line` was first sent (a datagram holds `\n`-separated assignments).
    fn first(&self, line: &str) -> Option<Instant> {
        self.all()
            .into_iter()
            .find(|(_, t)| t.lines().any(|l| l == line))
            .map(|(at, _)| at)
    }

    /// The `WATCHDOG=1` pings since `from`.
    fn pings_since(&self, from: Instant) -> Vec<Instant> {
        self.all()
            .into_iter()
            .filter(|(at, t)| *at >= from && t.lines().any(|l| l == "WATCHDOG=1"))
            .map(|(at, _)| at)
            .collect()
    }

    /// The `STATUS=` values sent since `from`.
    fn statuses_since(&self, from: Instant) -> Vec<String> {
        self.all()
            .into_iter()
            .filter(|(at, _)| *at >= from)
            .flat_map(|(_, t)| {
                t.lines()
                    .filter_map(|l| l.strip_prefix("STATUS="))
                    .map(str::to_owned)
                    .collect::<Vec<_>>()
            })
            .collect()
    }
}

/// The longest wait between `from`, the pings, and `to`.
fn worst_gap(from: Instant, pings: &[Instant], to: Instant) -> Duration {
    let mut last = from;
    let mut worst = Duration::ZERO;
    for p in pings.iter().copied().chain([to]) {
        worst = worst.max(p.saturating_duration_since(last));
        last = last.max(p);
    }
    worst
}

fn containerd_pid(tb: &Testbed) -> u32 {
    std::fs::read_to_string(tb.dir.join("containerd.pid"))
        .expect("the test bed's containerd.pid")
        .trim()
        .parse()
        .unwrap()
}

/// reaplet under a pretend systemd: `NOTIFY_SOCKET`, `WATCHDOG_USEC`, the status endpoint at
/// `status`, pods from the API server.
struct Agent {
    child: Child,
    _guard: KillOnDrop,
    notes: Notes,
    status: SocketAddr,
    log: PathBuf,
}

impl Agent {
    fn start(tb: &Testbed, root: &Path, kubeconfig: &Path, extra: &[&str]) -> Agent {
        let notify = root.join("notify.sock");
        let notes = Notes::listen(&notify);
        let status = free_addr();
        let log = root.join("reaplet.log");
        let child = reaplet_run(tb, &root.join("kubelet"))
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["--metrics-bind-address", &status.to_string()])
            .args(extra)
            .env("NOTIFY_SOCKET", &notify)
            .env("WATCHDOG_USEC", WATCHDOG.as_micros().to_string())
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("spawning reaplet");
        Agent {
            _guard: KillOnDrop(child.id()),
            child,
            notes,
            status,
            log,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits (up to 30 s) for `READY=1` and a ready `/readyz`, then until reaplet watches
    /// `api` and has every pod in sync; returns when `READY=1` came.
    async fn wait_ready(&self, api: &ApiServer) -> Instant {
        let start = Instant::now();
        loop {
            if let Some(at) = self.notes.first("READY=1")
                && probe(self.status, "/readyz").await.0 == 200
            {
                wait_in_sync(api).await;
                return at;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "reaplet never ready\n{}",
                tail(&self.log(), 30)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Still the same process (a restart would be a new one).
    fn assert_running(&mut self) {
        assert!(
            self.child.try_wait().unwrap().is_none(),
            "reaplet exited\n{}",
            tail(&self.log(), 40)
        );
    }

    /// The watchdog's view from `ready_at` until now: how many `WATCHDOG=1` pings came within
    /// `during`, and the longest gap between pings.
    fn watchdog(&self, ready_at: Instant, during: (Instant, Instant)) -> (usize, Duration) {
        let pings = self.notes.pings_since(ready_at);
        let gap = worst_gap(ready_at, &pings, Instant::now());
        let within = pings
            .iter()
            .filter(|p| **p >= during.0 && **p <= during.1)
            .count();
        (within, gap)
    }

    /// Asserts the watchdog never went a whole interval without a ping (`gap`, from
    /// [`Agent::watchdog`]) and `/healthz` never failed.
    fn assert_alive_throughout(&self, gap: Duration, probes: &Probes) {
        assert!(
            gap < WATCHDOG,
            "WATCHDOG=1 not sent for {gap:?}: systemd would have restarted reaplet\n{}",
            tail(&self.log(), 40)
        );
        assert!(
            probes.healthz_failures.is_empty(),
            "/healthz failed: {:?}",
            probes.healthz_failures
        );
    }

    fn stop(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the status endpoint said over a window, probed every 500 ms.
#[derive(Default, Debug)]
struct Probes {
    healthz_failures: Vec<(f64, u16, String)>,
    /// When `/readyz` first failed (s into the window) and why.
    unready: Option<(f64, String)>,
    /// When `/readyz` was ready again after failing.
    ready_again: Option<f64>,
    count: usize,
}

async fn probe_for(status: SocketAddr, window: Duration, probes: &mut Probes, t0: Instant) {
    let end = Instant::now() + window;
    while Instant::now() < end {
        let at = t0.elapsed().as_secs_f64();
        let (code, body) = probe(status, "/healthz").await;
        if code != 200 {
            probes.healthz_failures.push((at, code, body));
        }
        let (code, body) = probe(status, "/readyz").await;
        match (code, &probes.unready) {
            (200, Some(_)) if probes.ready_again.is_none() => probes.ready_again = Some(at),
            (200, _) => {}
            (_, None) => probes.unready = Some((at, body.trim().to_owned())),
            _ => {}
        }
        probes.count += 1;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// containerd SIGSTOPped for 2 minutes, pods deleted meanwhile: the watchdog is pinged
/// throughout, `/healthz` stays 200, `/readyz` fails with the reason and `STATUS=` says so;
/// after SIGCONT readiness returns and the deleted pods end within their grace-derived bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn containerd_sigstopped_for_two_minutes_is_no_restart_and_loses_nothing() {
    let (tb, api, root, kc) = api_bed("stall-ctrd").await;
    let pods = launch_app_pods(
        &api,
        &tb,
        GRACE as i64,
        [
            ("stall-trap", TRAPS_TERM),
            ("stall-ignore", IGNORES_TERM),
            ("stall-control", TRAPS_TERM),
        ],
    )
    .await;
    let mut agent = Agent::start(&tb, root.path(), &kc, &[]);
    let ready_at = agent.wait_ready(&api).await;

    let ctrd = containerd_pid(&tb);
    signal(ctrd, "-STOP");
    let thaw = Thaw(ctrd);
    let stopped = Instant::now();
    let mut probes = Probes::default();
    // 10 s into the stall two pods are deleted: reaplet's calls for them wait on containerd
    probe_for(agent.status, Duration::from_secs(10), &mut probes, stopped).await;
    for (t, _) in &pods[..2] {
        api.delete_pod("default", &t.name, None);
    }
    probe_for(
        agent.status,
        STALL.saturating_sub(stopped.elapsed()),
        &mut probes,
        stopped,
    )
    .await;
    agent.assert_running();
    drop(thaw);
    let resumed = Instant::now();
    let stall_took = (resumed - stopped).as_secs_f64();

    // the deleted pods end: their stop calls were waiting in containerd and carry the grace
    // (one never answered is sent again as SIGTERM with the 2 s floor, once: `records`);
    // readiness returns at the first relist answered: the one waiting answers at once, else
    // the next (relist period 1 s), probed every 100 ms
    let bound = Duration::from_secs(GRACE + FLOOR) + ONE_RETRY + TEARDOWN;
    let ready_bound = Duration::from_secs(1 + 1);
    let names: Vec<&str> = pods[..2].iter().map(|(t, _)| t.name.as_str()).collect();
    let mut gone_after = None;
    let mut ready_after = None;
    while gone_after.is_none() || ready_after.is_none() {
        let waited = resumed.elapsed();
        if gone_after.is_none() && names.iter().all(|n| api.get_pod("default", n).is_none()) {
            gone_after = Some(waited.as_secs_f64());
        }
        if ready_after.is_none() && probe(agent.status, "/readyz").await.0 == 200 {
            ready_after = Some(waited.as_secs_f64());
        }
        assert!(
            gone_after.is_some() || waited < bound,
            "pods {names:?} not gone {bound:?} after SIGCONT\n{}",
            tail(&agent.log(), 60)
        );
        assert!(
            ready_after.is_some() || waited < ready_bound,
            "not ready {ready_bound:?} after SIGCONT: {:?}",
            probe(agent.status, "/readyz").await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (gone_after, ready_after) = (gone_after.unwrap(), ready_after.unwrap());
    // healthy from then on
    probe_for(agent.status, Duration::from_secs(3), &mut probes, stopped).await;
    agent.assert_running();

    let (stall_pings, gap) = agent.watchdog(ready_at, (stopped, resumed));
    let statuses = agent.notes.statuses_since(stopped);
    let runtime_status = statuses
        .iter()
        .find(|s| s.contains("container runtime not answering"));
    // the recovery line is written as the relist that made reaplet ready again ends: waited
    // for, not read once (issue 44); the stall's lines came seconds before it
    wait_logged(
        &agent.log,
        "container runtime answers again",
        Duration::from_secs(5),
        || tail(&agent.log(), 40),
    )
    .await;
    let log = agent.log();
    let writes = api.writes();
    let deletes = |name: &str| {
        writes
            .iter()
            .filter(|r| {
                r.method == "DELETE"
                    && r.path == format!("/api/v1/namespaces/default/pods/{name}")
                    && (200..300).contains(&r.status)
            })
            .count()
    };
    println!(
        "containerd SIGSTOPped {stall_took:.1} s: {} WATCHDOG=1 pings during the stall, worst gap \
         {:.1} s (watchdog {WATCHDOG:?}); /healthz failures {} of {} probes; /readyz unready \
         {:?}, ready again {ready_after:.1} s after SIGCONT; STATUS {runtime_status:?}; the 2 \
         pods deleted during the stall gone {gone_after:.1} s after SIGCONT (bound {bound:?})",
        stall_pings,
        gap.as_secs_f64(),
        probes.healthz_failures.len(),
        probes.count,
        probes.unready,
    );
    agent.assert_alive_throughout(gap, &probes);
    // unready once no relist answered for the threshold: the last answer was at most a relist
    // period (1 s) before the stall began, then one relist deadline (5 s) and a probe (0.5 s)
    let (unready_at, why) = probes.unready.clone().expect("/readyz never failed");
    let unready_by = UNHEALTHY_AFTER.as_secs_f64() + 5.0 + 1.0;
    assert!(
        unready_at <= unready_by,
        "unready only {unready_at:.1} s into the stall (bound {unready_by} s)"
    );
    assert!(
        why.contains("container runtime not answering"),
        "/readyz reason: {why}"
    );
    assert!(
        runtime_status.is_some(),
        "STATUS= never mentioned the runtime: {statuses:?}"
    );
    assert!(
        probes.ready_again.is_none_or(|at| at >= stall_took),
        "ready at {:?} s, while containerd was stopped",
        probes.ready_again
    );
    assert_eq!(
        log.matches("container runtime not answering; not ready")
            .count(),
        1,
        "one stall line"
    );
    assert_eq!(
        log.matches("ContainerRuntimeUnhealthy").count(),
        1,
        "one ContainerRuntimeUnhealthy event"
    );
    // and that event is posted once, about this node's Node object
    let posted: Vec<_> = api
        .events()
        .into_iter()
        .filter(|e| e["reason"] == "ContainerRuntimeUnhealthy")
        .collect();
    assert_eq!(posted.len(), 1, "{posted:#?}");
    assert_eq!(posted[0]["involvedObject"]["kind"], "Node");
    assert_eq!(posted[0]["involvedObject"]["name"], "testnode");
    assert_eq!(posted[0]["type"], "Warning");
    assert_eq!(
        log.matches("container runtime answers again").count(),
        1,
        "one recovery line"
    );
    // nothing lost: one DELETE each, nothing left in the runtime, the control pod untouched
    for name in &names {
        assert_eq!(deletes(name), 1, "{name}: successful deletes");
    }
    let client = tb.client();
    for (t, p) in &pods[..2] {
        let cs = client.list_containers(Some(p.uid.as_str())).await.unwrap();
        assert!(
            cs.iter().all(|c| !c.state.may_run()),
            "{}: still running {cs:?}",
            t.name
        );
    }
    let control = &pods[2];
    assert!(api.get_pod("default", &control.0.name).is_some());
    let st = client
        .container_status(control.1.container_id("app"))
        .await
        .unwrap();
    assert!(st.state.may_run(), "the control pod was stopped");
    assert_eq!(deletes(&control.0.name), 0);
    agent.stop();
}

/// A shim frozen in the middle of a termination: the watchdog keeps being pinged, `/healthz`
/// stays 200 and `/readyz` too (containerd itself answers) for two watchdog intervals; the
/// other pod ends on its grace; the frozen pod ends once thawed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_frozen_shim_mid_termination_keeps_the_watchdog_fed() {
    let (tb, api, root, kc) = api_bed("stall-shim").await;
    let pods = launch_app_pods(
        &api,
        &tb,
        GRACE as i64,
        [("shim-victim", IGNORES_TERM), ("shim-other", IGNORES_TERM)],
    )
    .await;
    // the runtime request timeout of the faults test: the hung StopContainer fails and is
    // retried instead of waiting 2 minutes
    let mut agent = Agent::start(&tb, root.path(), &kc, &["--runtime-request-timeout", "5s"]);
    let ready_at = agent.wait_ready(&api).await;

    for (t, _) in &pods {
        api.delete_pod("default", &t.name, None);
    }
    // mid-termination: the TERM-ignoring victim is inside its grace when its shim freezes
    tokio::time::sleep(Duration::from_secs(1)).await;
    let shim = shim_pid(&pods[0].1.sandbox_id);
    signal(shim, "-STOP");
    let thaw = Thaw(shim);
    let frozen = Instant::now();
    let hold = WATCHDOG * 2;
    let mut probes = Probes::default();
    probe_for(agent.status, hold, &mut probes, frozen).await;
    agent.assert_running();
    let other_gone = api.get_pod("default", &pods[1].0.name).is_none();
    let victim_held = api.get_pod("default", &pods[0].0.name).is_some();
    drop(thaw);
    let thawed = Instant::now();
    // thawed long past its deadline: the retried kill SIGKILLs at once, after the backoff
    // that is pending (capped at lifecycle RETRY_MAX, 30 s, plus 20 % jitter)
    let bound = Duration::from_secs(36) + Duration::from_secs(FLOOR) + TEARDOWN;
    wait_pods_gone(&api, &[pods[0].0.name.as_str()], bound, || {
        tail(&agent.log(), 60)
    })
    .await;
    let victim_after = thawed.elapsed().as_secs_f64();
    let (frozen_pings, gap) = agent.watchdog(ready_at, (frozen, thawed));
    println!(
        "shim frozen {:.0} s mid-termination: {frozen_pings} WATCHDOG=1 pings meanwhile, worst \
         gap {:.1} s; /healthz failures {} of {} probes; /readyz {:?}; the other pod gone \
         meanwhile: {other_gone}; the frozen pod gone {victim_after:.1} s after the thaw",
        hold.as_secs_f64(),
        gap.as_secs_f64(),
        probes.healthz_failures.len(),
        probes.count,
        probes.unready,
    );
    agent.assert_alive_throughout(gap, &probes);
    assert!(other_gone, "the other pod was held back by the frozen shim");
    // one pod's shim is not the runtime: containerd answers the relists meanwhile
    assert!(
        probes.unready.is_none(),
        "a frozen shim made reaplet unready: {:?}",
        probes.unready
    );
    assert!(victim_held, "the frozen pod cannot be gone while frozen");
    agent.stop();
}
