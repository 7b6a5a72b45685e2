//! `fleet`: what standby reaplet costs the control plane of a fleet, measured against what the
//! kubelets of that fleet cost it, in one run. One real etcd and kube-apiserver v1.36 (the test
//! bed's, `tests/common/kube/`), N nodes (default 50) whose kubelets are kubemark's hollow
//! kubelets (`k8s.io/kubernetes/cmd/kubemark --morph=kubelet`, the real kubelet code on a fake
//! runtime, built by `testbed/kube.sh build kubemark` at the same version as the other
//! components), and beside each a standby reaplet (`reaplet run`, `--authority=auto`) with the
//! node's own identity (`system:node:<node>` in `system:nodes`, signed by the test bed's CA),
//! all of them on one private containerd of the test bed that runs no pods. With
//! `--identity=service-account` the reaplets use `deploy/rbac.yaml`'s service account instead,
//! which may watch the node Leases (`identity.rs`): the watch path, one Lease watch per node.
//!
//! ```sh
//! sudo cargo bench --features testbed --bench fleet              # 50 nodes, windows of 120 s
//! sudo cargo bench --features testbed --bench fleet -- 100 --window=60
//! sudo cargo bench --features testbed --bench fleet -- --identity=service-account --restart
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
//! target, reaplet adds at most 10 %, is printed, never asserted. With `--restart[=SECS]` the
//! API server is then restarted under the fleet and the SECS (default 60) from the signal are
//! measured (`restart.rs`): requests, quorum reads and writes by sender, the reaplets' against
//! the hollow kubelets', in the same window, and the reaplets' roles after it.
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
mod identity;
#[path = "../common/json_tail.rs"]
mod json_tail;
mod procs;
mod report;
mod restart;
mod window;

use audit::AuditLog;
use identity::Identity;
use k8s::{Cluster, Options};
use procs::{Fleet, Member, rss_mib};
use reaplet_testbed::Testbed;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use window::{Watched, measure};

type R<T> = Result<T, String>;

/// What one run does (from the command line).
struct Plan {
    nodes: usize,
    window: Duration,
    settle: Duration,
    identity: Identity,
    /// the window after an API server restart (`None`: no restart)
    restart: Option<Duration>,
}

impl Plan {
    fn parse(args: &[String]) -> R<Plan> {
        let mut plan = Plan {
            nodes: 50,
            window: Duration::from_secs(120),
            settle: Duration::from_secs(30),
            identity: Identity::Node,
            restart: None,
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
            } else if let Some(v) = a.strip_prefix("--identity=") {
                plan.identity = Identity::parse(v)?;
            } else if a == "--restart" {
                plan.restart = Some(Duration::from_secs(60));
            } else if let Some(v) = a.strip_prefix("--restart=") {
                plan.restart = Some(secs(v, "--restart")?);
            } else if a == "smoke" {
                // the smallest run that exercises every part: 3 nodes, 10 s windows
                (plan.nodes, plan.window, plan.settle) =
                    (3, Duration::from_secs(10), Duration::from_secs(10));
            } else if let Ok(n) = a.parse::<usize>() {
                plan.nodes = n;
            } else if a != "--bench" {
                return Err(format!(
                    "unknown argument {a:?}: the arguments are N (nodes), --window=SECS, \
                     --settle=SECS, --identity=node|service-account, --restart[=SECS], smoke"
                ));
            }
        }
        if plan.nodes == 0 || plan.window.is_zero() || plan.restart == Some(Duration::ZERO) {
            return Err("N, --window and --restart must be above 0".into());
        }
        Ok(plan)
    }
}

/// `/proc/loadavg`'s three averages.
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
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

/// A standby reaplet beside node `node`'s hollow kubelet: the node's kubeconfig (or
/// `kubeconfig`, the service account's), the hollow kubelet's health endpoint, the shared
/// containerd, its own root directory and status port.
fn start_reaplet(
    cluster: &Cluster,
    tb: &Testbed,
    dir: &Path,
    node: &str,
    kubelet_port: u16,
    kubeconfig: Option<&Path>,
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
    let kubeconfig = kubeconfig.map_or_else(|| cluster.node_kubeconfig(node), Path::to_path_buf);
    c.arg("run")
        .arg("--kubeconfig")
        .arg(kubeconfig)
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

async fn run(plan: Plan) -> R<()> {
    let started = Instant::now();
    let kubemark = kubemark()?;
    let t = Instant::now();
    let tb = Testbed::start(repo(), "fleet");
    let mut cluster = Cluster::start(Options::default()).await;
    println!(
        "containerd, etcd and kube-apiserver up in {:.1} s ({})",
        t.elapsed().as_secs_f64(),
        cluster.dir.path().display()
    );
    let (hollow_dir, reaplet_dir) = (
        cluster.dir.path().join("hollow"),
        cluster.dir.path().join("reaplets"),
    );
    // the service account's objects and token, made before W0 (the admin's requests then
    // fall outside every window); valid for the whole run with room to spare
    let sa_kubeconfig = match plan.identity {
        Identity::Node => None,
        Identity::ServiceAccount => {
            Some(identity::service_account_kubeconfig(&cluster, 6 * 3600).await?)
        }
    };
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
        let (m, a) = start_reaplet(
            &cluster,
            &tb,
            &reaplet_dir,
            &node_name(i),
            *p,
            sa_kubeconfig.as_deref(),
        )?;
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
    report::report(&plan, [&w0, &w1, &w2], &footprint);
    if let Some(len) = plan.restart {
        let r =
            restart::restart(&mut cluster, &mut kubelets, &mut reaplets, &mut audit, len).await?;
        let roles_after = roles(&status).await;
        report::restart(&plan, &w2, &r, &roles_after);
    }
    // keep the logs of the run: the cluster's directory goes with it
    let keep = repo().join(match plan.identity {
        Identity::Node => "target/tmp/bench-fleet".to_owned(),
        i => format!("target/tmp/bench-fleet-{}", i.name()),
    });
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
        "the run took {:.0} s (from kubemark's check to the table); load average at its end {}",
        started.elapsed().as_secs_f64(),
        loadavg()
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
        "fleet benchmark: {} nodes, windows of {} s, settle {} s, reaplets' identity {}, API \
         server restart {}; {} cores; reaplet {} ({version}); load average {}",
        plan.nodes,
        plan.window.as_secs(),
        plan.settle.as_secs(),
        plan.identity.name(),
        plan.restart.map_or("none".into(), |d| format!(
            "then, {} s measured",
            d.as_secs()
        )),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        bin.display(),
        loadavg()
    );
    if let Err(e) = run(plan).await {
        eprintln!("\n*** fleet benchmark failed: {e} ***");
        std::process::exit(1);
    }
}
