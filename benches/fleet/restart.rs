//! The API server restarted under the fleet (`--restart[=SECS]`): what every client sends to
//! a fresh API server, whose watch cache knows no version older than its start, in the first
//! SECS seconds (default 60) after the old one exited: the re-watch and re-list storm, the
//! hollow kubelets' against the reaplets'.
//!
//! The restart is the one an upgrade makes: SIGTERM to kube-apiserver, whose graceful shutdown
//! closes its listener at once but lets the open connections (the watches) run until its
//! shutdown timeout (60 s) and then cuts them; then the same binary with the same arguments
//! (read from `/proc/<pid>/cmdline`) is started again at once, on the same etcd, certificates
//! and audit log (which it appends to). The window runs from the old server's exit, the moment
//! every client lost its connections, so it holds the time the new one takes to start (no
//! request can arrive then) and its first requests.
//!
//! Invariants: the audit log is read up to the old server's exit before the new one starts, and
//! the watches still open in it then are forgotten (their server is gone), so the watches held
//! at the window's end are the new server's; the fleet's processes are checked every 5 s as
//! in every window (one that exited fails the run).

use super::R;
use super::audit::AuditLog;
use super::k8s::Cluster;
use super::k8s::proc::Proc;
use super::now_ns;
use super::procs::{Fleet, cpu_secs};
use super::window::Window;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// How long the old server may take to stop, the new one to answer `/readyz`.
const STOP_LIMIT: Duration = Duration::from_secs(70);
const READY_LIMIT: Duration = Duration::from_secs(120);

/// One restart and the window after it.
pub struct Restarted {
    pub window: Window,
    /// from the signal to the old server's exit; from that exit to the new one's first
    /// `/readyz` 200
    pub stopped_after: Duration,
    pub ready_after: Duration,
    /// the old server's watches left open in the audit log at its exit (no ResponseComplete)
    pub cut_watches: usize,
}

/// The command line of process `pid`: (program, arguments).
fn cmdline(pid: u32) -> R<(PathBuf, Vec<String>)> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline"))
        .map_err(|e| format!("/proc/{pid}/cmdline: {e}"))?;
    let mut parts = raw
        .split(|b| *b == 0)
        .filter(|p| !p.is_empty())
        .map(|p| String::from_utf8_lossy(p).into_owned());
    let bin = parts
        .next()
        .ok_or_else(|| format!("/proc/{pid}/cmdline is empty"))?;
    Ok((PathBuf::from(bin), parts.collect()))
}

/// Sleeps until `t0 + until`, checking every 5 s that no member of the fleet exited.
async fn hold(t0: Instant, until: Duration, fleets: [&mut Fleet; 2], what: &str) -> R<()> {
    let [kubelets, reaplets] = fleets;
    while t0.elapsed() < until {
        tokio::time::sleep((until - t0.elapsed()).min(Duration::from_secs(5))).await;
        for f in [&mut *kubelets, &mut *reaplets] {
            if let Some(e) = f.first_exited() {
                return Err(format!("{what}: {e}"));
            }
        }
    }
    Ok(())
}

/// Restarts the API server and measures the `len` from the signal.
pub async fn restart(
    cluster: &mut Cluster,
    kubelets: &mut Fleet,
    reaplets: &mut Fleet,
    audit: &mut AuditLog,
    len: Duration,
) -> R<Restarted> {
    let pid = cluster
        .apiserver
        .pid()
        .ok_or("the API server is not running")?;
    let (bin, args) = cmdline(pid)?;
    audit.refresh(&cluster.audit_log);
    let etcd = cluster.etcd.pid().unwrap_or(0);
    let sum = |pids: &[u32]| pids.iter().map(|p| cpu_secs(*p)).sum::<f64>();
    let (kp, rp) = (kubelets.pids(), reaplets.pids());
    let (c_etcd, c_k, c_r) = (cpu_secs(etcd), sum(&kp), sum(&rp));
    println!(
        "[R] restarting the API server (SIGTERM, then started again at once); measuring {} s \
         from the old one's exit ... (load average {})",
        len.as_secs(),
        super::loadavg()
    );
    let signal = Instant::now();
    // the old server's CPU is not counted: the window starts at its exit
    cluster.apiserver.stop_within(STOP_LIMIT);
    let (t0, from) = (Instant::now(), now_ns());
    let stopped_after = signal.elapsed();
    audit.refresh(&cluster.audit_log);
    let cut_watches = audit.forget_open_watches();
    cluster.apiserver = Proc::start("kube-apiserver", &bin, &args, cluster.dir.path());
    let new_pid = cluster.apiserver.pid().unwrap_or(0);
    loop {
        if let Some(st) = cluster.apiserver.exited() {
            return Err(format!(
                "the restarted API server exited ({st}):\n{}",
                cluster.apiserver.tail(30)
            ));
        }
        if cluster.raw("GET", "/readyz", None, None).await.0 == 200 {
            break;
        }
        if t0.elapsed() > READY_LIMIT {
            return Err(format!(
                "the restarted API server not ready within {READY_LIMIT:?}:\n{}",
                cluster.apiserver.tail(30)
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let ready_after = t0.elapsed();
    println!(
        "[R] the old API server exited {:.1} s after the signal, the new one ready {:.1} s after \
         that exit",
        stopped_after.as_secs_f64(),
        ready_after.as_secs_f64()
    );
    hold(t0, len, [kubelets, reaplets], "after the restart").await?;
    let (secs, to) = (t0.elapsed().as_secs_f64(), now_ns());
    let mut w = Window::new("R", secs);
    w.apiserver_cpu = cpu_secs(new_pid);
    w.etcd_cpu = cpu_secs(etcd) - c_etcd;
    w.kubelets_cpu = sum(&kp) - c_k;
    w.reaplets_cpu = sum(&rp) - c_r;
    w.close(cluster, audit, from, to).await;
    Ok(Restarted {
        window: w,
        stopped_after,
        ready_after,
        cut_watches,
    })
}
