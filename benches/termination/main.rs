//! reaplet's benchmarks: termination latency, throughput and footprint, against the floor.
//! They print figures and assert nothing about speed (BENCHMARKS.md holds the measured ones).
//!
//! ```sh
//! sudo cargo bench --bench termination -- single      # 1 pod x 20: delete -> gone, stages
//! sudo cargo bench --bench termination -- burst       # 110 pods at once, and the CRI floor
//! sudo cargo bench --bench termination -- synthetic   # fake CRI: 100, 1,000, 5,000 pods,
//!                                                     # and what their timelines cost
//! sudo cargo bench --bench termination -- idle        # 110 running pods for 60 s
//! sudo cargo bench --bench termination -- exits       # exit -> status, events vs relist; idle
//! sudo cargo bench --bench termination -- exits:5     # exit -> status only, 5 pods per path
//! sudo cargo bench --bench termination -- drain         # 30 pods: reaplet drain vs all at once
//! cargo bench --bench termination -- taints           # NoExecute taint on 1,000/10,000 pods
//! sudo cargo bench --bench termination -- kubelet      # the real kubelet v1.36 vs reaplet, side by side
//! sudo cargo bench --bench termination -- kubelet:taint   # one of them: one, burst, exit, taint, taint4, outage, pressure, standby
//! sudo cargo bench --bench termination -- all
//! ```
//!
//! The environment: `REAPLET_BENCH_PAIRS` (the burst's interleaved floor/reaplet pairs, 5),
//! `REAPLET_BENCH_PERF=<dir>` (a `perf record` of each side-by-side window),
//! `REAPLET_BENCH_PERF_HZ` (its rate, 499) and `REAPLET_BENCH_PERF_ONLY` (only the windows whose
//! label holds it, e.g. `reaplet` or `standby-reaplet`).
//!
//! The agent under test is the real `reaplet run` binary in its own process (so its CPU time
//! and peak RSS are its own), against the in-process API server of the integration tests and
//! either a private containerd (the test bed) or a fake CRI server on a real unix socket.
//! Under `cargo test` (no `--bench` argument) a small smoke run checks that the harness works.

#[path = "../../tests/common/apiserver/mod.rs"]
#[allow(unused_imports)]
mod apiserver;
mod drain;
mod exits;
mod fake_cri;
mod side_by_side;
mod taints;
mod timeline;

#[global_allocator]
static ALLOC: taints::Counting = taints::Counting;
#[path = "../../tests/common/gate.rs"]
mod gate;

use apiserver::ApiServer;
use reaplet::cri::Runtime;
use reaplet::wall_ns;
use reaplet_testbed::{ContainerTemplate, LaunchedPod, PodTemplate, TRAPS_TERM, Testbed};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const NODE: &str = "testnode";

type R<T> = Result<T, String>;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Nearest-rank percentile of sorted values.
fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(|a, b| a.total_cmp(b));
    v
}

/// CPU seconds (user + system) of a process (0 if it is gone).
fn cpu_secs(pid: u32) -> f64 {
    procfs::process::Process::new(pid as i32)
        .and_then(|p| p.stat())
        .map_or(0.0, |s| {
            (s.utime + s.stime) as f64 / procfs::ticks_per_second() as f64
        })
}

/// A `/proc/<pid>/status` memory figure in MiB (`|s| s.vmhwm`: peak RSS, `|s| s.vmrss`:
/// current); NaN if the process is gone.
fn status_mib(pid: u32, field: fn(&procfs::process::Status) -> Option<u64>) -> f64 {
    procfs::process::Process::new(pid as i32)
        .and_then(|p| p.status())
        .ok()
        .as_ref()
        .and_then(field)
        .map_or(f64::NAN, |kib| kib as f64 / 1024.0)
}

/// `reaplet run` in its own process.
struct Agent {
    child: Child,
    status: SocketAddr,
    log: PathBuf,
}

impl Agent {
    /// `reaplet run` in its own process, the rest of its command line set by `args`: its status
    /// server on a free loopback port, text logs (stderr) in `log`, and none of the inherited
    /// environment that would configure it (`REAPLET_*`, in-cluster, systemd's notify socket).
    fn run(log: PathBuf, args: impl FnOnce(&mut Command)) -> R<Agent> {
        let port = side_by_side::k8s::proc::free_port();
        let status: SocketAddr = ([127, 0, 0, 1], port).into();
        let logf = std::fs::File::create(&log).map_err(|e| e.to_string())?;
        let mut c = Command::new(env!("CARGO_BIN_EXE_reaplet"));
        for (k, _) in std::env::vars() {
            if k.starts_with("REAPLET_")
                || k.starts_with("KUBERNETES_SERVICE")
                || k == "NOTIFY_SOCKET"
            {
                c.env_remove(k);
            }
        }
        c.arg("run")
            .args(["--metrics-bind-address", &status.to_string()])
            .args(["--log-format", "text"]);
        args(&mut c);
        c.stdout(Stdio::null()).stderr(logf);
        let child = c.spawn().map_err(|e| format!("starting reaplet: {e}"))?;
        Ok(Agent { child, status, log })
    }

    /// `reaplet run` against the in-process API server and `endpoint`, in `dir`.
    fn spawn(
        api: &ApiServer,
        endpoint: &str,
        cgroup_root: &str,
        dir: &Path,
        extra: &[&str],
    ) -> R<Agent> {
        let kc = api.write_kubeconfig(dir, NODE);
        Agent::run(dir.join("reaplet.log"), |c| {
            c.arg("--kubeconfig")
                .arg(&kc)
                .args(["--hostname-override", NODE])
                .args(["--container-runtime-endpoint", endpoint])
                .args(["--cgroup-root", cgroup_root])
                .arg("--root-dir")
                .arg(dir.join("kubelet"))
                .args(extra);
        })
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    async fn get(&self, path: &str) -> Option<(u16, String)> {
        reaplet::server::fetch(self.status, path).await.ok()
    }

    async fn wait_ready(&self) -> R<()> {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(60) {
            if matches!(self.get("/readyz").await, Some((200, _))) {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Err(format!(
            "reaplet not ready after 60 s; log {}",
            self.log.display()
        ))
    }

    /// Waits until reaplet's `/pods` lists `n` pods.
    async fn wait_known(&self, n: usize) -> R<()> {
        let start = Instant::now();
        let mut seen = 0;
        while start.elapsed() < Duration::from_secs(120) {
            if let Some((200, body)) = self.get("/pods").await {
                seen = serde_json::from_str::<serde_json::Value>(&body)
                    .ok()
                    .and_then(|v| v["pods"].as_array().map(Vec::len))
                    .unwrap_or(0);
                if seen >= n {
                    return Ok(());
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Err(format!("reaplet lists {seen} of {n} pods after 120 s"))
    }

    /// Waits until reaplet's `/pods` lists `uid`.
    async fn wait_uid(&self, uid: &str) -> R<()> {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(60) {
            if matches!(self.get("/pods").await, Some((200, body)) if body.contains(uid)) {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Err(format!("reaplet does not list pod {uid} after 60 s"))
    }

    /// Sum of a metric's samples whose line starts with `prefix` (e.g. a histogram `_sum`).
    async fn metric(&self, prefix: &str) -> f64 {
        self.get("/metrics")
            .await
            .map(|(_, body)| {
                body.lines()
                    .filter(|l| l.starts_with(prefix))
                    .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                    .sum()
            })
            .unwrap_or(f64::NAN)
    }

    fn stop(mut self) {
        // SIGTERM: reaplet stops without touching pods
        let _ = Command::new("kill")
            .arg(self.child.id().to_string())
            .status();
        let _ = self.child.wait();
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What a measured run costs the agent: CPU seconds, requests, from `open` to `close`.
struct Window {
    t0: Instant,
    cpu0: f64,
    req0: usize,
}

impl Window {
    /// Lets the agent settle (every pod in sync), then starts counting.
    async fn open(agent: &Agent, api: &ApiServer) -> Window {
        tokio::time::sleep(Duration::from_millis(500)).await;
        Window {
            cpu0: cpu_secs(agent.pid()),
            req0: api.requests().len(),
            t0: Instant::now(),
        }
    }

    /// (CPU seconds, peak RSS MiB over the agent's life, API requests) since `open`.
    fn close(&self, agent: &Agent, api: &ApiServer) -> (f64, f64, usize) {
        (
            cpu_secs(agent.pid()) - self.cpu0,
            status_mib(agent.pid(), |s| s.vmhwm),
            api.requests().len() - self.req0,
        )
    }
}

/// A pod in the API and in the runtime, TERM-honouring, grace 30.
async fn api_pod(api: &ApiServer, tb: &Testbed, name: &str) -> R<(PodTemplate, LaunchedPod)> {
    let t = PodTemplate::new(name, 30).container(ContainerTemplate::new("app", TRAPS_TERM));
    api.create_pod(t.api_object());
    let p = reaplet_testbed::launch(tb, &t)
        .await
        .map_err(|e| e.to_string())?;
    Ok((t, p))
}

/// Launches `n` pods, `par` at a time.
async fn api_pods(
    api: &ApiServer,
    tb: &Testbed,
    prefix: &str,
    n: usize,
    par: usize,
) -> R<Vec<(PodTemplate, LaunchedPod)>> {
    let mut out = Vec::with_capacity(n);
    let names: Vec<String> = (0..n).map(|i| format!("{prefix}-{i}")).collect();
    for chunk in names.chunks(par) {
        let launched =
            futures_util::future::join_all(chunk.iter().map(|n| api_pod(api, tb, n))).await;
        for l in launched {
            out.push(l?);
        }
    }
    Ok(out)
}

/// Polls the API server until every UID is gone; returns each one's removal instant.
async fn wait_gone(api: &ApiServer, uids: &[String], limit: Duration) -> R<Vec<Instant>> {
    let start = Instant::now();
    loop {
        let gone: Vec<Option<Instant>> = uids.iter().map(|u| api.removed_at(u)).collect();
        if gone.iter().all(Option::is_some) {
            return Ok(gone.into_iter().flatten().collect());
        }
        if start.elapsed() > limit {
            let left = gone.iter().filter(|g| g.is_none()).count();
            return Err(format!(
                "{left} of {} pods still present after {limit:?}",
                uids.len()
            ));
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// containerd's log time of the first line containing every needle, in ns since the epoch.
fn containerd_time(log: &str, needles: &[&str]) -> Option<i64> {
    let line = log
        .lines()
        .find(|l| needles.iter().all(|n| l.contains(n)))?;
    let ts = line.split("time=\"").nth(1)?.split('"').next()?;
    ts.parse::<jiff::Timestamp>()
        .ok()
        .map(|t| t.as_nanosecond() as i64)
}

fn header(title: &str) {
    println!("\n=== {title}");
}

// ---------------------------------------------------------------------------------------------

/// 1 pod x `reps`: DELETE -> object gone, and when each stage happened.
async fn single(reps: usize) -> R<()> {
    header(&format!(
        "real stack, 1 pod x {reps}: DELETE -> object gone (containerd {})",
        "test bed"
    ));
    let tb = Testbed::start(repo(), "bench-single");
    let api = ApiServer::start().await;
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let agent = Agent::spawn(&api, &tb.endpoint(), &tb.cgroup_root, dir.path(), &[])?;
    agent.wait_ready().await?;
    let mut rows: Vec<[f64; 8]> = Vec::new();
    for i in 0..reps {
        let (t, p) = api_pod(&api, &tb, &format!("single-{i}")).await?;
        agent.wait_uid(&t.uid).await?;
        // settle: reaplet has the pod in sync
        tokio::time::sleep(Duration::from_millis(200)).await;
        let vol0 = agent
            .metric("reaplet_termination_stage_duration_seconds_sum{stage=\"volumes\"}")
            .await;
        let cg0 = agent
            .metric("reaplet_termination_stage_duration_seconds_sum{stage=\"cgroup\"}")
            .await;
        let req0 = api.requests().len();
        let wall0 = wall_ns();
        let t0 = Instant::now();
        api.delete_pod(&t.namespace, &t.name, None);
        let gone = wait_gone(&api, std::slice::from_ref(&t.uid), Duration::from_secs(60)).await?[0];
        let total = ms(gone - t0);
        // stages from containerd's log (wall clock) and the API server's request log
        tokio::time::sleep(Duration::from_millis(50)).await;
        let log = tb.containerd_log();
        let cid = p.container_id("app");
        let at = |needles: &[&str]| {
            containerd_time(&log, needles).map_or(f64::NAN, |ns| (ns - wall0) as f64 / 1e6)
        };
        let first_stop = at(&["StopContainer for", cid, "with timeout"]);
        let c_stopped = at(&["StopContainer for", cid, "returns successfully"]);
        let sb_stopped = at(&["StopPodSandbox for", &p.sandbox_id, "returns successfully"]);
        let reqs = api.requests();
        let req_at = |m: &str, status: bool| {
            reqs[req0..]
                .iter()
                .find(|r| {
                    r.method == m
                        && r.path.contains(&t.name)
                        && r.path.ends_with("/status") == status
                })
                .map_or(f64::NAN, |r| ms(r.at.saturating_duration_since(t0)))
        };
        let patched = req_at("PATCH", true);
        let deleted = req_at("DELETE", false);
        let vol = (agent
            .metric("reaplet_termination_stage_duration_seconds_sum{stage=\"volumes\"}")
            .await
            - vol0)
            * 1e3;
        let cg = (agent
            .metric("reaplet_termination_stage_duration_seconds_sum{stage=\"cgroup\"}")
            .await
            - cg0)
            * 1e3;
        rows.push([
            first_stop, c_stopped, sb_stopped, vol, cg, patched, deleted, total,
        ]);
    }
    let names = [
        "first StopContainer call",
        "container stopped",
        "sandbox stopped",
        "volumes stage (duration)",
        "cgroup stage (duration)",
        "status PATCH answered",
        "DELETE (grace 0) answered",
        "object gone",
    ];
    println!(
        "{:<28} {:>9} {:>9} {:>9}   (ms from the client's DELETE; n={reps})",
        "stage", "median", "p90", "max"
    );
    for (i, n) in names.iter().enumerate() {
        let v = sorted(
            rows.iter()
                .map(|r| r[i])
                .filter(|x| x.is_finite())
                .collect(),
        );
        println!(
            "{n:<28} {:>9.1} {:>9.1} {:>9.1}",
            pct(&v, 50.0),
            pct(&v, 90.0),
            pct(&v, 100.0)
        );
    }
    let reqs_total = api.requests().iter().filter(|r| r.method != "GET").count();
    println!(
        "API writes in all: {reqs_total} for {reps} pods ({:.1} per pod)",
        reqs_total as f64 / reps as f64
    );
    agent.stop();
    Ok(())
}

/// `n` pods deleted at once on the real stack; then the floor: the same CRI stops with no agent.
async fn burst(n: usize) -> R<()> {
    header(&format!("real stack, {n} pods deleted at once"));
    let tb = Testbed::start(repo(), "bench-burst");
    let api = ApiServer::start().await;
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let agent = Agent::spawn(&api, &tb.endpoint(), &tb.cgroup_root, dir.path(), &[])?;
    agent.wait_ready().await?;
    let t_launch = Instant::now();
    let pods = api_pods(&api, &tb, "burst", n, 8).await?;
    println!(
        "launched {n} pods in {:.1} s",
        t_launch.elapsed().as_secs_f64()
    );
    agent.wait_known(n).await?;
    let w = Window::open(&agent, &api).await;
    let t0 = w.t0;
    for (t, _) in &pods {
        api.delete_pod(&t.namespace, &t.name, None);
    }
    let uids: Vec<String> = pods.iter().map(|(t, _)| t.uid.clone()).collect();
    let gone = wait_gone(&api, &uids, Duration::from_secs(300)).await?;
    let (cpu, hwm, reqs) = w.close(&agent, &api);
    let g = sorted(gone.iter().map(|i| (*i - t0).as_secs_f64()).collect());
    println!(
        "reaplet: first gone {:.2} s, median {:.2} s, p99 {:.2} s, last {:.2} s",
        pct(&g, 0.0),
        pct(&g, 50.0),
        pct(&g, 99.0),
        pct(&g, 100.0)
    );
    println!(
        "reaplet: {cpu:.2} CPU-seconds during the run, peak RSS {hwm:.1} MiB, {reqs} API requests ({:.2} per pod)",
        reqs as f64 / n as f64
    );
    agent.stop();

    // the floor: identical pods, the same StopContainer (grace 30) and StopPodSandbox calls,
    // all at once, no agent
    let floor_pods = api_pods(&api, &tb, "floor", n, 8).await?;
    let client = tb.client();
    let t0 = Instant::now();
    let stops = floor_pods.iter().map(|(_, p)| {
        let client = client.clone();
        async move {
            let cid = p.container_id("app").to_owned();
            client
                .stop_container(&cid, 30)
                .await
                .map_err(|e| e.to_string())?;
            client
                .stop_pod_sandbox(&p.sandbox_id)
                .await
                .map_err(|e| e.to_string())?;
            Ok::<_, String>(t0.elapsed())
        }
    });
    let done = futures_util::future::join_all(stops)
        .await
        .into_iter()
        .collect::<R<Vec<_>>>()?;
    let f = sorted(done.iter().map(Duration::as_secs_f64).collect());
    println!(
        "floor (direct CRI, {n} pods in parallel): first {:.2} s, median {:.2} s, last {:.2} s",
        pct(&f, 0.0),
        pct(&f, 50.0),
        pct(&f, 100.0)
    );
    println!(
        "reaplet last gone / floor last stopped = {:.2}",
        pct(&g, 100.0) / pct(&f, 100.0)
    );
    Ok(())
}

/// Fake CRI (real socket, per-call latency) + API server: `n` pods deleted at once.
/// One synthetic bulk termination: its size, reaplet's CPU seconds, and one pod's termination
/// timeline as the agent recorded it.
struct SyntheticRun {
    pods: usize,
    cpu_s: f64,
    timeline: Option<reaplet::timeline::Timeline>,
}

async fn synthetic(sizes: &[usize], latency: fake_cri::Latency) -> R<Vec<SyntheticRun>> {
    let mut runs = Vec::new();
    header(&format!(
        "synthetic: fake CRI on a unix socket (call latency {:?}, stop latency {:?}), API QPS unthrottled",
        latency.call, latency.stop
    ));
    println!(
        "{:>6} {:>9} {:>9} {:>9} {:>11} {:>11} {:>8} {:>9} {:>9}",
        "pods",
        "makespan",
        "p50 gone",
        "p99 gone",
        "p50 overh.",
        "p99 overh.",
        "CPU-s",
        "peak MiB",
        "req/pod"
    );
    for &n in sizes {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let sock = dir.path().join("cri.sock");
        let cri = fake_cri::FakeCri::new(latency);
        let api = ApiServer::start().await;
        let mut uids = Vec::with_capacity(n);
        let mut keys = Vec::with_capacity(n);
        for i in 0..n {
            let t = PodTemplate::new(&format!("syn-{i}"), 30)
                .container(ContainerTemplate::new("app", TRAPS_TERM));
            api.create_pod(t.api_object());
            cri.add_pod(&t.uid, &t.name, &t.namespace, 30);
            uids.push(t.uid.clone());
            keys.push((t.namespace.clone(), t.name.clone()));
        }
        cri.clone().serve(&sock).await.map_err(|e| e.to_string())?;
        let endpoint = format!("unix://{}", sock.display());
        let agent = Agent::spawn(
            &api,
            &endpoint,
            "/reaplet-bench-none",
            dir.path(),
            &[
                "--kube-api-qps",
                "100000",
                "--kube-api-burst",
                "100000",
                // every pod's timeline kept: the recording at its largest
                "--termination-timelines",
                &n.to_string(),
            ],
        )?;
        agent.wait_ready().await?;
        agent.wait_known(n).await?;
        let w = Window::open(&agent, &api).await;
        let t0 = w.t0;
        let mut deleted = Vec::with_capacity(n);
        for (ns, name) in &keys {
            deleted.push(Instant::now());
            api.delete_pod(ns, name, None);
        }
        let gone = wait_gone(&api, &uids, Duration::from_secs(600)).await?;
        let (cpu, hwm, reqs) = w.close(&agent, &api);
        let makespan = gone.iter().map(|g| *g - t0).max().unwrap_or_default();
        let per: Vec<f64> = gone
            .iter()
            .zip(&deleted)
            .map(|(g, d)| ms(*g - *d))
            .collect();
        // what the runtime itself takes per pod: StopContainer + StopPodSandbox latencies
        let floor = ms(latency.stop * 2);
        let lat = sorted(per.clone());
        let over = sorted(per.iter().map(|p| p - floor).collect());
        println!(
            "{n:>6} {:>8.2}s {:>7.0}ms {:>7.0}ms {:>9.0}ms {:>9.0}ms {cpu:>8.2} {hwm:>9.1} {:>9.2}",
            makespan.as_secs_f64(),
            pct(&lat, 50.0),
            pct(&lat, 99.0),
            pct(&over, 50.0),
            pct(&over, 99.0),
            reqs as f64 / n as f64
        );
        let timeline =
            reaplet::server::fetch(agent.status, &format!("/pods/timeline?pod={}", uids[0]))
                .await
                .ok()
                .filter(|(code, _)| *code == 200)
                .and_then(|(_, body)| serde_json::from_str(&body).ok())
                .and_then(|v| reaplet::timeline::Timeline::from_json(v).ok());
        runs.push(SyntheticRun {
            pods: n,
            cpu_s: cpu,
            timeline,
        });
        agent.stop();
        // the agent's log outlives the run, for the trace behind a figure
        let keep = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("bench-synthetic-{n}.log"));
        let _ = std::fs::copy(dir.path().join("reaplet.log"), &keep);
    }
    Ok(runs)
}

async fn run(modes: &[String], bench: bool) -> R<()> {
    let lat = fake_cri::Latency {
        call: Duration::from_millis(1),
        stop: Duration::from_millis(50),
    };
    if !bench {
        // cargo test: the harness works end to end, small
        single(2).await?;
        timeline::cost(&synthetic(&[50], lat).await?);
        exits::exits(2, 2, 1).await?;
        taints::taints(&[100], 2);
        return Ok(());
    }
    let all = modes.is_empty() || modes.iter().any(|m| m == "all");
    let want = |m: &str| all || modes.iter().any(|x| x == m);
    if want("single") {
        single(20).await?;
    }
    if want("burst") {
        burst(110).await?;
    }
    if want("synthetic") {
        timeline::cost(&synthetic(&[100, 1000, 5000], lat).await?);
    }
    // one size alone: synthetic:N
    for m in modes {
        if let Some(n) = m.strip_prefix("synthetic:").and_then(|n| n.parse().ok()) {
            timeline::cost(&synthetic(&[n], lat).await?);
        }
        if let Some(n) = m.strip_prefix("exits:").and_then(|n| n.parse().ok()) {
            exits::exits(n, 0, 0).await?;
        }
    }
    if want("idle") {
        exits::idle_by_path(110, 60).await?;
    }
    if want("exits") {
        exits::exits(20, 0, 0).await?;
    }
    if want("drain") {
        drain::drain30().await?;
    }
    if want("taints") {
        taints::taints(&[1000, 10_000], 20);
    }
    // the side-by-side scenarios alone: kubelet:one, kubelet:burst, kubelet:exit, ...
    let parts: Vec<&str> = modes
        .iter()
        .filter_map(|m| m.strip_prefix("kubelet:"))
        .filter(|m| side_by_side::SCENARIOS.contains(m))
        .collect();
    if want("kubelet") || !parts.is_empty() {
        side_by_side::kubelet(if want("kubelet") { &[] } else { &parts }).await?;
    }
    Ok(())
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let bench = args.iter().any(|a| a == "--bench");
    let modes: Vec<String> = args.into_iter().filter(|a| !a.starts_with('-')).collect();
    let machine = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("model name\t: ").map(str::to_owned))
        .unwrap_or_default();
    println!(
        "reaplet benchmarks ({}); {} cores, {machine}",
        if bench {
            "cargo bench"
        } else {
            "smoke run under cargo test"
        },
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    if let Err(e) = run(&modes, bench).await {
        eprintln!("\n*** benchmark harness failed: {e} ***");
        std::process::exit(1);
    }
}
