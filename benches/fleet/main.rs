//! `fleet`: what standby reaplet costs the control plane of a fleet, measured against what the
//! kubelets of that fleet cost it, in one run. One real etcd and kube-apiserver v1.36 (the test
//! bed's, `tests/common/kube/`), N nodes (default 50) whose kubelets are kubemark's hollow
//! kubelets (`k8s.io/kubernetes/cmd/kubemark --morph=kubelet`, the real kubelet code on a fake
//! runtime, built by `testbed/kube.sh build kubemark` at the same version as the other
//! components), and beside each a standby reaplet (`reaplet run`, `--authority=auto`) with the
//! node's own identity (`system:node:<node>` in `system:nodes`, signed by the test bed's CA),
//! all of them on one private containerd of the test bed that runs no pods.
//!
//! ```sh
//! sudo cargo bench --features testbed --bench fleet              # 50 nodes, windows of 120 s
//! sudo cargo bench --features testbed --bench fleet -- 100 --window=60
//! ```
//!
//! Three windows of the same length, in this order: the control plane alone (W0), with the N
//! hollow kubelets registered and renewing their Leases (W1), and with the N reaplets beside them
//! (W2); each starts after its newcomers settled (`--settle`, default 30 s). Per window: API
//! requests per second by sender (User-Agent) and by verb and resource, quorum reads per second
//! (the rule is in `audit.rs`), watches held at its end (open in the audit log; the API server's
//! `apiserver_longrunning_requests` gauge as the total), and kube-apiserver and etcd CPU
//! (`/proc/<pid>/stat` utime + stime over the window) per node. Then what reaplet adds against
//! what the hollow kubelets cost: requests, quorum reads and watches are counted by sender
//! (reaplets in W2 / hollow kubelets in W1), CPU by difference ((W2 - W1) / (W1 - W0)). The
//! target, reaplet adds at most 10 %, is printed, never asserted.
//!
//! Under `cargo test` (no `--bench` argument) only the quorum-read rule's cases run: the
//! smallest fleet run (3 nodes, 10 s windows) costs more than a minute and needs kubemark,
//! which the test suite's set-up does not build (BENCHMARKS.md, section 9).

#[path = "../../tests/common/kube/mod.rs"]
#[allow(dead_code, unused_imports)]
mod k8s;
#[path = "../../tests/common/port.rs"]
mod port;

mod audit;
mod procs;

use audit::{AuditLog, Who};
use k8s::{Cluster, Options};
use procs::{Fleet, Member, cpu_secs, rss_mib};
use reaplet::testbed::Testbed;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

type R<T> = Result<T, String>;

/// What one run does (from the command line).
struct Plan {
    nodes: usize,
    window: Duration,
    settle: Duration,
}

impl Plan {
    fn parse(args: &[String]) -> R<Plan> {
        let mut plan = Plan {
            nodes: 50,
            window: Duration::from_secs(120),
            settle: Duration::from_secs(30),
        };
        let secs = |v: &str, what: &str| {
            v.parse::<u64>()
                .map(Duration::from_secs)
                .map_err(|_| format!("{what}: {v:?} is no number of seconds"))
        };
        for a in args {
            if let Some(v) = a.strip_prefix("--window=") {
                plan.window = secs(v, "--window")?;
            } else if let Some(v) = a.strip_prefix("--settle=") {
                plan.settle = secs(v, "--settle")?;
            } else if a == "smoke" {
                // the smallest run that exercises every part: 3 nodes, 10 s windows
                plan = Plan {
                    nodes: 3,
                    window: Duration::from_secs(10),
                    settle: Duration::from_secs(10),
                };
            } else if let Ok(n) = a.parse::<usize>() {
                plan.nodes = n;
            } else if a != "--bench" {
                return Err(format!(
                    "unknown argument {a:?}: the arguments are N (nodes), --window=SECS, --settle=SECS, smoke"
                ));
            }
        }
        if plan.nodes == 0 || plan.window.is_zero() {
            return Err("N and --window must be above 0".into());
        }
        Ok(plan)
    }
}

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64)
}

/// kubemark from the test bed's cache, built there first when missing.
fn kubemark() -> R<PathBuf> {
    let t = Instant::now();
    let st = Command::new(repo().join("testbed/kube.sh"))
        .args(["build", "kubemark"])
        .status()
        .map_err(|e| format!("running testbed/kube.sh build kubemark: {e}"))?;
    if !st.success() {
        return Err(format!("testbed/kube.sh build kubemark failed ({st})"));
    }
    let bin = k8s::bin("kubemark");
    println!(
        "kubemark: {} ({:.0} s to make sure it is built)",
        bin.display(),
        t.elapsed().as_secs_f64()
    );
    Ok(bin)
}

/// The node names of the fleet.
fn node_name(i: usize) -> String {
    format!("hollow-{i:03}")
}

/// A hollow kubelet per node: the lightest kubemark settings (no read-only port, the fake
/// image service, no host runtime), its server on its own port (plain HTTP; kubemark binds
/// 0.0.0.0 and has no flag for it), its log below `dir` (kubemark makes its root directory in
/// `/tmp`, whatever `TMPDIR` says: [`procs::TmpLeftovers`] removes it).
fn start_hollow(cluster: &Cluster, kubemark: &Path, dir: &Path, node: &str) -> R<(Member, u16)> {
    let d = dir.join(node);
    std::fs::create_dir_all(&d).map_err(|e| e.to_string())?;
    let kubeconfig = cluster.node_kubeconfig(node);
    let port = port::free_port();
    let mut c = Command::new(kubemark);
    c.arg("--morph=kubelet")
        .arg(format!("--name={node}"))
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg(format!("--kubelet-port={port}"))
        .arg("--kubelet-read-only-port=0")
        .arg("--use-host-image-service=false")
        .arg("--v=1");
    Ok((Member::spawn(node, c, d.join("kubemark.log"))?, port))
}

/// The hollow kubelet's health endpoint: its server's `/healthz` (kubemark runs the kubelet
/// without the separate healthz server of port 10248).
fn healthz_url(port: u16) -> String {
    format!("http://127.0.0.1:{port}/healthz")
}

/// A standby reaplet beside node `node`'s hollow kubelet: the node's kubeconfig, the hollow
/// kubelet's health endpoint, the shared containerd, its own root directory and status port.
fn start_reaplet(
    cluster: &Cluster,
    tb: &Testbed,
    dir: &Path,
    node: &str,
    kubelet_port: u16,
) -> R<(Member, std::net::SocketAddr)> {
    let d = dir.join(node);
    let root = d.join("root");
    std::fs::create_dir_all(&root).map_err(|e| e.to_string())?;
    let status: std::net::SocketAddr = ([127, 0, 0, 1], port::free_port()).into();
    let mut c = Command::new(reaplet_bin());
    for (k, _) in std::env::vars() {
        if k.starts_with("REAPLET_") || k.starts_with("KUBERNETES_SERVICE") || k == "NOTIFY_SOCKET"
        {
            c.env_remove(k);
        }
    }
    c.arg("run")
        .arg("--kubeconfig")
        .arg(cluster.node_kubeconfig(node))
        .args(["--hostname-override", node])
        .args(["--container-runtime-endpoint", &tb.endpoint()])
        .args(["--cgroup-root", &tb.cgroup_root])
        .arg("--root-dir")
        .arg(&root)
        .args(["--metrics-bind-address", &status.to_string()])
        .args(["--kubelet-healthz-url", &healthz_url(kubelet_port)])
        .args(["--log-format", "text"]);
    Ok((Member::spawn(node, c, d.join("reaplet.log"))?, status))
}

/// The reaplet binary: this build's (`cargo bench` builds the release profile), or
/// `$FLEET_REAPLET_BIN` (another build of reaplet, for a before/after comparison).
fn reaplet_bin() -> PathBuf {
    std::env::var_os("FLEET_REAPLET_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_reaplet")))
}

/// Does `url` (plain HTTP on loopback) answer 200 within 2 s?
async fn answers_200(addr: std::net::SocketAddr, path: &str) -> bool {
    matches!(
        tokio::time::timeout(Duration::from_secs(2), reaplet::server::fetch(addr, path)).await,
        Ok(Ok((200, _)))
    )
}

/// Waits until every Node of the fleet is Ready and has its Lease, every hollow kubelet
/// answers healthz; fails when one exits or after `limit`.
async fn wait_registered(
    cluster: &Cluster,
    fleet: &mut Fleet,
    ports: &[u16],
    limit: Duration,
) -> R<()> {
    let n = ports.len();
    let t0 = Instant::now();
    let (mut ready, mut leases, mut healthy) = (0, 0, 0);
    while t0.elapsed() < limit {
        if let Some(e) = fleet.first_exited() {
            return Err(format!("a hollow kubelet exited while registering: {e}"));
        }
        let (_, nodes) = cluster.raw("GET", "/api/v1/nodes", None, None).await;
        ready = nodes["items"].as_array().map_or(0, |items| {
            items
                .iter()
                .filter(|node| {
                    node["status"]["conditions"].as_array().is_some_and(|cs| {
                        cs.iter()
                            .any(|c| c["type"] == "Ready" && c["status"] == "True")
                    })
                })
                .count()
        });
        let (_, ls) = cluster
            .raw(
                "GET",
                "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
                None,
                None,
            )
            .await;
        leases = ls["items"].as_array().map_or(0, Vec::len);
        if ready == n && leases == n {
            healthy = 0;
            for p in ports {
                if answers_200(([127, 0, 0, 1], *p).into(), "/healthz").await {
                    healthy += 1;
                }
            }
            if healthy == n {
                return Ok(());
            }
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    Err(format!(
        "after {limit:?}: {ready} of {n} Nodes Ready, {leases} Leases, {healthy} answering healthz"
    ))
}

/// One measured window.
struct Window {
    name: &'static str,
    secs: f64,
    apiserver_cpu: f64,
    etcd_cpu: f64,
    /// CPU seconds of the hollow kubelets, of the reaplets
    kubelets_cpu: f64,
    reaplets_cpu: f64,
    /// requests received in the window, by sender: (all, quorum reads)
    reqs: BTreeMap<Who, (usize, usize)>,
    /// by sender, verb and resource: (requests, quorum reads)
    by_kind: BTreeMap<(Who, String, String), (usize, usize)>,
    /// watches open at its end, by sender (audit log) and in all (the API server's gauge)
    watches: BTreeMap<Who, usize>,
    watches_gauge: f64,
}

impl Window {
    fn rate(&self, who: Who) -> (f64, f64) {
        let (a, q) = self.reqs.get(&who).copied().unwrap_or_default();
        (a as f64 / self.secs, q as f64 / self.secs)
    }

    fn rate_all(&self) -> (f64, f64) {
        let (a, q) = self
            .reqs
            .values()
            .fold((0, 0), |(a, q), (x, y)| (a + x, q + y));
        (a as f64 / self.secs, q as f64 / self.secs)
    }

    fn watches(&self, who: Who) -> usize {
        self.watches.get(&who).copied().unwrap_or(0)
    }
}

/// The API server's `apiserver_longrunning_requests` for WATCH, summed (NaN if unreadable).
async fn watch_gauge(cluster: &Cluster) -> f64 {
    let req = http::Request::get("/metrics")
        .body(Vec::new())
        .expect("a request");
    let Ok(Ok(text)) =
        tokio::time::timeout(Duration::from_secs(30), cluster.admin.request_text(req)).await
    else {
        return f64::NAN;
    };
    text.lines()
        .filter(|l| {
            l.starts_with("apiserver_longrunning_requests{") && l.contains("verb=\"WATCH\"")
        })
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// The processes a window watches.
struct Watched<'a> {
    cluster: &'a Cluster,
    kubelets: &'a mut Fleet,
    reaplets: &'a mut Fleet,
    audit: &'a mut AuditLog,
}

/// Measures one window of `len`: sleeps through it (no API request of the benchmark's own),
/// checking every 5 s that no member of the fleet exited.
async fn measure(name: &'static str, w: &mut Watched<'_>, len: Duration) -> R<Window> {
    let (api, etcd) = (
        w.cluster.apiserver.pid().unwrap_or(0),
        w.cluster.etcd.pid().unwrap_or(0),
    );
    let sum = |pids: &[u32]| pids.iter().map(|p| cpu_secs(*p)).sum::<f64>();
    let (kp, rp) = (w.kubelets.pids(), w.reaplets.pids());
    println!("[{name}] measuring {} s ...", len.as_secs());
    let (c_api, c_etcd, c_k, c_r) = (cpu_secs(api), cpu_secs(etcd), sum(&kp), sum(&rp));
    let (t0, from) = (Instant::now(), now_ns());
    while t0.elapsed() < len {
        tokio::time::sleep((len - t0.elapsed()).min(Duration::from_secs(5))).await;
        for f in [&mut *w.kubelets, &mut *w.reaplets] {
            if let Some(e) = f.first_exited() {
                return Err(format!("during {name}: {e}"));
            }
        }
    }
    let (secs, to) = (t0.elapsed().as_secs_f64(), now_ns());
    let mut win = Window {
        name,
        secs,
        apiserver_cpu: cpu_secs(api) - c_api,
        etcd_cpu: cpu_secs(etcd) - c_etcd,
        kubelets_cpu: sum(&kp) - c_k,
        reaplets_cpu: sum(&rp) - c_r,
        reqs: BTreeMap::new(),
        by_kind: BTreeMap::new(),
        watches: BTreeMap::new(),
        watches_gauge: 0.0,
    };
    // the log backend writes a record before the answer goes out: give the last ones a moment
    tokio::time::sleep(Duration::from_millis(500)).await;
    w.audit.refresh(&w.cluster.audit_log);
    for r in w.audit.window(from, to) {
        let e = win.reqs.entry(r.who).or_default();
        e.0 += 1;
        e.1 += usize::from(r.quorum);
        let k = win
            .by_kind
            .entry((r.who, r.verb.clone(), r.resource.clone()))
            .or_default();
        k.0 += 1;
        k.1 += usize::from(r.quorum);
    }
    win.watches = w.audit.watches_open();
    win.watches_gauge = watch_gauge(w.cluster).await;
    Ok(win)
}

/// reaplet's role by node, from its `/pods` (`authority.role` and `.why`), counted.
async fn roles(status: &[std::net::SocketAddr]) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for a in status {
        let role = match reaplet::server::fetch(*a, "/pods").await {
            Ok((200, body)) => serde_json::from_str::<serde_json::Value>(&body)
                .map(|v| {
                    format!(
                        "{} ({})",
                        v["authority"]["role"].as_str().unwrap_or("?"),
                        v["authority"]["why"].as_str().unwrap_or("?")
                    )
                })
                .unwrap_or_else(|_| "unreadable /pods".into()),
            _ => "no answer".into(),
        };
        *m.entry(role).or_default() += 1;
    }
    m
}

fn pct(part: f64, whole: f64) -> String {
    if whole > 0.0 {
        format!("{:.1} %", 100.0 * part / whole)
    } else if part > 0.0 {
        "inf".into()
    } else {
        "0".into()
    }
}

fn verdict(part: f64, whole: f64) -> &'static str {
    if part <= 0.1 * whole {
        "met"
    } else {
        "NOT met"
    }
}

/// The closing tables.
fn report(plan: &Plan, w: [&Window; 3], footprint: &str) {
    let [w0, w1, w2] = w;
    let n = plan.nodes as f64;
    println!(
        "\nfleet: {} nodes, windows of {:.0} s (W0 control plane alone, W1 + hollow kubelets, \
         W2 + standby reaplets)",
        plan.nodes, w1.secs
    );
    println!(
        "{:<40} {:>10} {:>10} {:>10} {:>13} {:>13} {:>10}  target <= 10 %",
        "figure", "W0", "W1", "W2", "reaplet adds", "kubelets cost", "adds/cost"
    );
    let row = |name: &str, v: [f64; 3], adds: f64, cost: f64| {
        println!(
            "{name:<40} {:>10.2} {:>10.2} {:>10.2} {adds:>13.2} {cost:>13.2} {:>10}  {}",
            v[0],
            v[1],
            v[2],
            pct(adds, cost),
            verdict(adds, cost)
        );
    };
    let all = |x: &Window| x.rate_all();
    row(
        "API requests/s (all senders)",
        [all(w0).0, all(w1).0, all(w2).0],
        w2.rate(Who::Reaplet).0,
        w1.rate(Who::Kubelet).0,
    );
    row(
        "quorum reads/s (all senders)",
        [all(w0).1, all(w1).1, all(w2).1],
        w2.rate(Who::Reaplet).1,
        w1.rate(Who::Kubelet).1,
    );
    let held = |x: &Window| x.watches.values().sum::<usize>() as f64;
    row(
        "watches held at the window's end",
        [held(w0), held(w1), held(w2)],
        w2.watches(Who::Reaplet) as f64,
        w1.watches(Who::Kubelet) as f64,
    );
    let mc = |cpu: f64, x: &Window| 1000.0 * cpu / x.secs / n;
    let api = [w0, w1, w2].map(|x| mc(x.apiserver_cpu, x));
    row(
        "kube-apiserver CPU per node (millicores)",
        api,
        api[2] - api[1],
        api[1] - api[0],
    );
    let etcd = [w0, w1, w2].map(|x| mc(x.etcd_cpu, x));
    row(
        "etcd CPU per node (millicores)",
        etcd,
        etcd[2] - etcd[1],
        etcd[1] - etcd[0],
    );
    println!(
        "(requests, quorum reads, watches: \"reaplet adds\" counts the reaplets' own in W2 and \
         \"kubelets cost\" the hollow kubelets' own in W1, by User-Agent; CPU: W2 - W1 and \
         W1 - W0. The API server's watch gauge: W0 {:.0}, W1 {:.0}, W2 {:.0}.)",
        w0.watches_gauge, w1.watches_gauge, w2.watches_gauge
    );
    println!("\nper node and second, by sender:");
    for (who, x) in [(Who::Kubelet, w1), (Who::Kubelet, w2), (Who::Reaplet, w2)] {
        let (a, q) = x.rate(who);
        println!(
            "  {who:?} in {}: {:.3} requests, {:.3} quorum reads; {} watches held ({:.2} per node)",
            x.name,
            a / n,
            q / n,
            x.watches(who),
            x.watches(who) as f64 / n
        );
    }
    for x in [w0, w1, w2] {
        let (a, q) = x.rate(Who::Other);
        println!(
            "  others (the API server's own clients, the benchmark) in {}: {a:.2} requests/s, \
             {q:.2} quorum reads/s",
            x.name
        );
    }
    println!("\nby verb and resource (requests/s in the window; quorum reads/s after the slash):");
    for (label, who, x) in [
        ("hollow kubelets, W1", Who::Kubelet, w1),
        ("hollow kubelets, W2", Who::Kubelet, w2),
        ("reaplets, W2", Who::Reaplet, w2),
        ("others, W2", Who::Other, w2),
    ] {
        println!("  {label}:");
        for ((_, verb, res), (a, q)) in x.by_kind.iter().filter(|((w, _, _), _)| *w == who) {
            println!(
                "    {:<8} {:<36} {:>8.3} / {:.3}",
                verb,
                res,
                *a as f64 / x.secs,
                *q as f64 / x.secs
            );
        }
    }
    println!("\n{footprint}");
}

async fn run(plan: Plan) -> R<()> {
    let started = Instant::now();
    let kubemark = kubemark()?;
    let t = Instant::now();
    let tb = Testbed::start(repo(), "fleet");
    let cluster = Cluster::start(Options::default()).await;
    println!(
        "containerd, etcd and kube-apiserver up in {:.1} s ({})",
        t.elapsed().as_secs_f64(),
        cluster.dir.path().display()
    );
    let (hollow_dir, reaplet_dir) = (
        cluster.dir.path().join("hollow"),
        cluster.dir.path().join("reaplets"),
    );
    let mut audit = AuditLog::default();
    let _leftovers = procs::TmpLeftovers::now();
    let mut kubelets = Fleet::default();
    let mut reaplets = Fleet::default();
    tokio::time::sleep(plan.settle).await;
    let w0 = measure(
        "W0",
        &mut Watched {
            cluster: &cluster,
            kubelets: &mut kubelets,
            reaplets: &mut reaplets,
            audit: &mut audit,
        },
        plan.window,
    )
    .await?;

    // the hollow kubelets, a fifth of a second apart
    let t = Instant::now();
    let mut ports = Vec::with_capacity(plan.nodes);
    for i in 0..plan.nodes {
        let (m, p) = start_hollow(&cluster, &kubemark, &hollow_dir, &node_name(i))?;
        kubelets.members.push(m);
        ports.push(p);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let limit = Duration::from_secs(120 + 4 * plan.nodes as u64);
    wait_registered(&cluster, &mut kubelets, &ports, limit).await?;
    println!(
        "{} hollow kubelets registered, Ready, renewing and answering healthz {:.1} s after the \
         first started",
        plan.nodes,
        t.elapsed().as_secs_f64()
    );
    tokio::time::sleep(plan.settle).await;
    let kubelets_rss: f64 = kubelets.pids().iter().map(|p| rss_mib(*p)).sum();
    let w1 = measure(
        "W1",
        &mut Watched {
            cluster: &cluster,
            kubelets: &mut kubelets,
            reaplets: &mut reaplets,
            audit: &mut audit,
        },
        plan.window,
    )
    .await?;

    // a standby reaplet per node
    let t = Instant::now();
    let mut status = Vec::with_capacity(plan.nodes);
    for (i, p) in ports.iter().enumerate() {
        let (m, a) = start_reaplet(&cluster, &tb, &reaplet_dir, &node_name(i), *p)?;
        reaplets.members.push(m);
        status.push(a);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let limit = Duration::from_secs(60 + plan.nodes as u64);
    for (m, a) in reaplets.members.iter_mut().zip(&status) {
        while !answers_200(*a, "/readyz").await {
            if let Some(st) = m.exited() {
                return Err(format!(
                    "reaplet of {} exited ({st}):\n{}",
                    m.node,
                    m.tail(30)
                ));
            }
            if t.elapsed() > limit {
                return Err(format!(
                    "reaplet of {} not ready after {limit:?}; log {}",
                    m.node,
                    m.log.display()
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    println!(
        "{} reaplets ready {:.1} s after the first started; roles {:?}",
        plan.nodes,
        t.elapsed().as_secs_f64(),
        roles(&status).await
    );
    tokio::time::sleep(plan.settle).await;
    let reaplets_rss: f64 = reaplets.pids().iter().map(|p| rss_mib(*p)).sum();
    let w2 = measure(
        "W2",
        &mut Watched {
            cluster: &cluster,
            kubelets: &mut kubelets,
            reaplets: &mut reaplets,
            audit: &mut audit,
        },
        plan.window,
    )
    .await?;
    let roles_after = roles(&status).await;
    let n = plan.nodes as f64;
    let footprint = format!(
        "the fleet's own footprint on this machine: hollow kubelets {:.0} MiB RSS in all ({:.1} \
         per node), {:.1} % of a core in all in W1 ({:.2} per node); reaplets {:.0} MiB RSS in \
         all ({:.1} per node), {:.1} % of a core in all in W2 ({:.2} per node); reaplets' roles \
         at the end: {roles_after:?}",
        kubelets_rss,
        kubelets_rss / n,
        100.0 * w1.kubelets_cpu / w1.secs,
        100.0 * w1.kubelets_cpu / w1.secs / n,
        reaplets_rss,
        reaplets_rss / n,
        100.0 * w2.reaplets_cpu / w2.secs,
        100.0 * w2.reaplets_cpu / w2.secs / n,
    );
    report(&plan, [&w0, &w1, &w2], &footprint);
    // keep the logs of the run: the cluster's directory goes with it
    let keep = repo().join("target/tmp/bench-fleet");
    let _ = std::fs::remove_dir_all(&keep);
    let _ = std::fs::create_dir_all(&keep);
    let _ = std::fs::copy(&cluster.audit_log, keep.join("audit.log"));
    for m in kubelets
        .members
        .iter()
        .take(3)
        .chain(reaplets.members.iter().take(3))
    {
        let name = m
            .log
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        let _ = std::fs::copy(&m.log, keep.join(format!("{}-{name}", m.node)));
    }
    println!(
        "logs (audit, the first nodes' kubemark and reaplet): {}",
        keep.display()
    );
    println!(
        "the run took {:.0} s (from kubemark's check to the table)",
        started.elapsed().as_secs_f64()
    );
    drop(reaplets);
    drop(kubelets);
    drop(cluster);
    drop(tb);
    Ok(())
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let bench = args.iter().any(|a| a == "--bench");
    audit::check_rule();
    if !bench {
        println!(
            "fleet: the quorum-read rule's cases pass; the fleet itself runs only under \
             `sudo cargo bench --features testbed --bench fleet` (it needs kubemark and minutes)"
        );
        return;
    }
    let plan = match Plan::parse(&args) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("fleet: {e}");
            std::process::exit(64);
        }
    };
    let bin = reaplet_bin();
    let version = Command::new(&bin)
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    println!(
        "fleet benchmark: {} nodes, windows of {} s, settle {} s; {} cores; reaplet {} ({version})",
        plan.nodes,
        plan.window.as_secs(),
        plan.settle.as_secs(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        bin.display()
    );
    if let Err(e) = run(plan).await {
        eprintln!("\n*** fleet benchmark failed: {e} ***");
        std::process::exit(1);
    }
}
