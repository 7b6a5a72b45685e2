//! `exits`: container exit -> terminal status answered by the API server, event path vs
//! relist path in the same run; and idle CPU with running pods at the relist period each path
//! uses (10 s while events flow, 1 s without).
//!
//! Each pod is `restartPolicy: Never`, its container waiting at a gate (`tests/common/gate.rs`:
//! a held HTTP answer on the host's loopback) and exiting 0 when the bench opens it; one pod at
//! a time, after a random pause (0-1 s) so that the exits fall anywhere in the relist period.
//! The exit's time is the runtime's own `finished_at` (wall clock), the status's the API
//! server's answer (`Recorded::at`, converted to wall clock by `gate::wall_of`).

use super::*;
use crate::gate::{self, Gate};

/// How reaplet runs in each comparison: a label and its flags.
const PATHS: [(&str, &[&str]); 2] = [
    (
        "event path (--container-events=true)",
        &["--container-events=true"],
    ),
    (
        "relist path (--container-events=false, relist 1 s)",
        &["--container-events=false"],
    ),
];

/// A gated pod in the API and in the runtime: its container exits `code` when the gate opens.
async fn gated_pod(
    api: &ApiServer,
    tb: &Testbed,
    gate: &Gate,
    name: &str,
) -> R<(PodTemplate, LaunchedPod)> {
    let mut t =
        PodTemplate::new(name, 30).container(ContainerTemplate::new("app", &gate.script(name, 0)));
    t.restart_policy = "Never";
    api.create_pod(t.api_object());
    let p = reaplet_testbed::launch(tb, &t)
        .await
        .map_err(|e| e.to_string())?;
    Ok((t, p))
}

/// Waits until reaplet logs that it subscribed to container events.
async fn wait_subscribed(agent: &Agent) -> R<String> {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(60) {
        let log = std::fs::read_to_string(&agent.log).unwrap_or_default();
        if let Some(l) = log
            .lines()
            .find(|l| l.contains("container events subscribed"))
        {
            return Ok(l.to_owned());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Err(format!(
        "reaplet not subscribed after 60 s; log {}",
        agent.log.display()
    ))
}

/// Exit -> terminal status (ms) of `n` pods, one at a time, with reaplet run with `flags`.
async fn latencies(tb: &Testbed, label: &str, flags: &[&str], n: usize) -> R<Vec<f64>> {
    let api = ApiServer::start().await;
    let gate = Gate::start().await;
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let mut pods = Vec::with_capacity(n);
    for i in 0..n {
        pods.push(gated_pod(&api, tb, &gate, &format!("exit-{i}")).await?);
    }
    let agent = Agent::spawn(&api, &tb.endpoint(), &tb.cgroup_root, dir.path(), flags)?;
    agent.wait_ready().await?;
    agent.wait_known(n).await?;
    if flags.contains(&"--container-events=true") {
        wait_subscribed(&agent).await?;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let client = tb.client();
    let mut out = Vec::with_capacity(n);
    for (t, p) in &pods {
        tokio::time::sleep(Duration::from_millis(rand::random_range(0..1000))).await;
        gate.open(&t.name);
        let start = Instant::now();
        let patch = loop {
            if let Some(r) = gate::terminal_patch(&api, &t.name) {
                break r;
            }
            if start.elapsed() > Duration::from_secs(60) {
                return Err(format!(
                    "{label}: no terminal status for {} after 60 s",
                    t.name
                ));
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        };
        let answered = gate::wall_of(patch.at);
        let st = client
            .container_status(p.container_id("app"))
            .await
            .map_err(|e| e.to_string())?;
        out.push((answered - st.finished_at) as f64 / 1e6);
    }
    agent.stop();
    let keep = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "bench-exits-{}.log",
        if flags.contains(&"--container-events=true") {
            "events"
        } else {
            "relist"
        }
    ));
    let _ = std::fs::copy(dir.path().join("reaplet.log"), &keep);
    Ok(out)
}

/// Exit -> terminal status answered, `n` pods each path; then (unless `idle_pods` is 0) idle
/// CPU with `idle_pods` running pods for `idle_secs` each path.
pub async fn exits(n: usize, idle_pods: usize, idle_secs: u64) -> R<()> {
    header(&format!(
        "exits: container exit -> terminal status answered, {n} pods one at a time (test bed)"
    ));
    let tb = Testbed::start(repo(), "bench-exits");
    println!(
        "{:<52} {:>9} {:>9} {:>9} {:>9}   (ms)",
        "", "min", "median", "p99", "max"
    );
    for (label, flags) in PATHS {
        let v = sorted(latencies(&tb, label, flags, n).await?);
        println!(
            "{label:<52} {:>9.1} {:>9.1} {:>9.1} {:>9.1}",
            pct(&v, 0.0),
            pct(&v, 50.0),
            pct(&v, 99.0),
            pct(&v, 100.0)
        );
    }
    // the runtime's log too, for the trace behind a figure
    let keep = Path::new(env!("CARGO_TARGET_TMPDIR")).join("bench-exits-containerd.log");
    let _ = std::fs::write(&keep, tb.containerd_log());
    drop(tb);
    if idle_pods == 0 {
        return Ok(());
    }
    idle_by_path(idle_pods, idle_secs).await
}

/// `n` running pods, reaplet idle for `secs` with each path (container events and a 10 s
/// relist; no events and a 1 s relist): its CPU and RSS, and containerd's extra CPU.
pub async fn idle_by_path(n: usize, secs: u64) -> R<()> {
    header(&format!("exits-idle: {n} running pods, {secs} s per path"));
    let tb = Testbed::start(repo(), "bench-exits-idle");
    let api = ApiServer::start().await;
    api_pods(&api, &tb, "idle", n, 8).await?;
    let cpid: u32 = std::fs::read_to_string(tb.dir.join("containerd.pid"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .ok_or("no containerd pid")?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let c0 = cpu_secs(cpid);
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let base = cpu_secs(cpid) - c0;
    let s = secs as f64;
    println!("containerd alone: {:.3} % of a core", 100.0 * base / s);
    for (label, flags) in PATHS {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let agent = Agent::spawn(&api, &tb.endpoint(), &tb.cgroup_root, dir.path(), flags)?;
        agent.wait_ready().await?;
        agent.wait_known(n).await?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let (r0, c0) = (cpu_secs(agent.pid()), cpu_secs(cpid));
        tokio::time::sleep(Duration::from_secs(secs)).await;
        let (r, c) = (cpu_secs(agent.pid()) - r0, cpu_secs(cpid) - c0);
        println!(
            "{label}: reaplet {:.3} % of a core ({r:.2} CPU-s), RSS {:.1} MiB; containerd +{:.3} % of a core",
            100.0 * r / s,
            status_mib(agent.pid(), |s| s.vmrss),
            100.0 * (c - base) / s
        );
        agent.stop();
    }
    Ok(())
}
