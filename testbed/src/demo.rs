//! The demo behind `reaplet-demo` (no kubelet counterpart): the real agent with its embedded
//! default pod source, a static manifest directory, on a private containerd (the test bed).
//!
//! Four pods are described by manifests and launched through CRI as the kubelet would (a
//! TERM-trapping one, a TERM-ignoring one with grace 3, one with an exec preStop hook, one
//! with a sidecar); a fifth runs with no manifest at all (an orphan). The agent starts, stops
//! the orphan with grace 1, and when the four manifests are removed ends their pods with their
//! own grace. The report says when and how every container stopped.
//!
//! Invariants: only in the test bed's crate (never in a release package); it
//! touches only the test bed's containerd (`--testbed-dir`) and the pods below its cgroup root
//! (`--cgroup-root`); the report ([`render`]) is printed once, after every pod has ended.

use crate::{ContainerTemplate, IGNORES_TERM, LaunchedPod, PodTemplate, TRAPS_TERM, Testbed};
use reaplet::agent::{self, AgentConfig};
use reaplet::cgroups::CgroupManager;
use reaplet::cri::{CriClient, CriConfig, Runtime};
use reaplet::file_source;
use reaplet::wall_ns;
use std::path::PathBuf;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

#[derive(clap::Args)]
pub struct DemoArgs {
    /// The test bed directory (holds containerd.sock and pod logs).
    #[arg(long, default_value = "/tmp/reaplet-tb-demo")]
    testbed_dir: PathBuf,
    /// The cgroup root the test bed's pods live below.
    #[arg(long, default_value = "/reaplet-tb-demo")]
    cgroup_root: String,
}

#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error("the test bed's containerd is not answering: {0}")]
    Runtime(#[from] reaplet::cri::CriError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("manifest: {0}")]
    Manifest(#[from] file_source::ManifestError),
    #[error("launching pod {pod}: {reason}")]
    Launch { pod: String, reason: String },
    #[error("agent: {0}")]
    Agent(#[from] agent::AgentError),
    #[error("pods still running after {0:?}")]
    Timeout(Duration),
}

/// One row of the report.
#[derive(Debug, Clone)]
pub struct Row {
    pub pod: String,
    pub why: &'static str,
    pub grace: i64,
    pub container: String,
    /// Seconds from the start of the pod's termination to the container's exit.
    pub stopped_after: f64,
    pub exit_code: i32,
    /// Seconds from the start of the pod's termination until its pod cgroup was gone in every
    /// hierarchy (the end of the terminated stage), as the demo's 20 ms polling saw it.
    pub cleaned_after: f64,
}

pub struct DemoConfig {
    pub testbed_dir: PathBuf,
    pub cgroup_root: String,
    pub mountinfo: PathBuf,
}

/// `reaplet-demo`: runs the demo on the test bed at `args`; returns the report to print.
pub async fn command(args: DemoArgs) -> Result<String, DemoError> {
    let (version, rows) = run(DemoConfig {
        testbed_dir: args.testbed_dir,
        cgroup_root: args.cgroup_root,
        mountinfo: "/proc/self/mountinfo".into(),
    })
    .await?;
    Ok(render(&version, &rows))
}

/// The report: the runtime, a table of every container's stop, the conclusion.
pub fn render(version: &str, rows: &[Row]) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "runtime: {version}\n\
         pods came from a static manifest directory; the orphan had no manifest at all\n\
         times count from the start of each pod's termination (manifest removed / agent start)\n"
    );
    let _ = writeln!(
        out,
        "{:<22} {:<17} {:>6} {:<10} {:>9} {:>5} {:>9}",
        "POD", "WHY", "GRACE", "CONTAINER", "STOPPED", "EXIT", "CLEANED"
    );
    for r in rows {
        let stopped = if r.stopped_after.is_nan() {
            "removed".to_string()
        } else {
            format!("{:.3}s", r.stopped_after)
        };
        let exit = if r.exit_code < 0 {
            "-".to_string()
        } else {
            r.exit_code.to_string()
        };
        let cleaned = if r.cleaned_after.is_nan() {
            "-".to_string()
        } else {
            format!("{:.3}s", r.cleaned_after)
        };
        let _ = writeln!(
            out,
            "{:<22} {:<17} {:>5}s {:<10} {:>9} {:>5} {:>9}",
            r.pod, r.why, r.grace, r.container, stopped, exit, cleaned
        );
    }
    let _ = writeln!(
        out,
        "\nall pods terminated: containers and sandboxes stopped, pod cgroups removed"
    );
    out
}

/// Runs the demo; returns the runtime's version line and the report.
pub async fn run(cfg: DemoConfig) -> Result<(String, Vec<Row>), DemoError> {
    const NODE: &str = "demo-node";
    let tb = Testbed::attach(cfg.testbed_dir.clone(), cfg.cgroup_root.clone());
    let client = CriClient::new(&CriConfig {
        endpoint: tb.endpoint(),
        ..CriConfig::default()
    })?;
    let v = client.version().await?;
    let version = format!(
        "{} {} (CRI {})",
        v.runtime_name, v.runtime_version, v.runtime_api_version
    );

    let manifests = cfg.testbed_dir.join("manifests");
    std::fs::create_dir_all(&manifests)?;
    let hook = serde_json::json!({"exec": {"command": ["/bin/sh", "-c", "sleep 1"]}});
    let templates = vec![
        PodTemplate::new("web", 30).container(ContainerTemplate::new("app", TRAPS_TERM)),
        PodTemplate::new("stubborn", 3).container(ContainerTemplate::new("app", IGNORES_TERM)),
        PodTemplate::new("hooked", 10)
            .container(ContainerTemplate::new("app", TRAPS_TERM).pre_stop(hook)),
        PodTemplate::new("mesh", 30)
            .sidecar(ContainerTemplate::new("proxy", TRAPS_TERM))
            .container(ContainerTemplate::new(
                "app",
                "trap 'sleep 1; exit 0' TERM; sleep 3600 & wait $!",
            )),
    ];
    let launch = |t: PodTemplate| {
        let tb = &tb;
        async move {
            let p = crate::launch(tb, &t).await.map_err(|e| DemoError::Launch {
                pod: t.name.clone(),
                reason: e.to_string(),
            })?;
            Ok::<_, DemoError>((t, p))
        }
    };
    let mut pods: Vec<(PodTemplate, LaunchedPod, PathBuf)> = Vec::new();
    for mut t in templates {
        // the manifest the kubelet would read; its UID and name follow from the file
        let path = manifests.join(format!("{}.json", t.name));
        let mut obj = t.api_object();
        obj["metadata"].as_object_mut().map(|m| m.remove("uid"));
        obj.as_object_mut().map(|o| o.remove("status"));
        std::fs::write(&path, serde_json::to_vec_pretty(&obj).unwrap_or_default())?;
        let info = file_source::load(&path, NODE)?;
        t.uid = info.uid.to_string();
        t.name = info.name.clone();
        let (t, p) = launch(t).await?;
        pods.push((t, p, path));
    }
    let (orphan_t, orphan) = launch(
        PodTemplate::new("forgotten", 600).container(ContainerTemplate::new("app", IGNORES_TERM)),
    )
    .await?;

    let cancel = CancellationToken::new();
    let mut agent_cfg = AgentConfig::new(
        NODE,
        &tb.endpoint(),
        &cfg.cgroup_root,
        cfg.testbed_dir.join("kubelet"),
    );
    agent_cfg.pod_manifest_path = Some(manifests.clone());
    agent_cfg.file_check_frequency = Duration::from_millis(200);
    agent_cfg.pipeline.mountinfo = cfg.mountinfo.clone();
    let agent_started = wall_ns();
    let agent = tokio::spawn(agent::run(agent_cfg, cancel.clone()));
    // let the agent read the manifests (and find the orphan), then remove the manifests
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let removed = wall_ns();
    for (_, _, path) in &pods {
        std::fs::remove_file(path)?;
    }

    let cgroups = CgroupManager::from_mountinfo(&cfg.mountinfo, tb.naming())?;
    let mut all: Vec<(&PodTemplate, &LaunchedPod, &'static str, i64, i64)> = pods
        .iter()
        .map(|(t, p, _)| (t, p, "manifest removed", t.grace, removed))
        .collect();
    all.push((&orphan_t, &orphan, "orphan", 1, agent_started));
    // record each pod's containers as soon as they have stopped: a finished pod that no
    // source wants any more has its sandbox (and containers) garbage-collected right after
    let limit = Duration::from_secs(60);
    let start = tokio::time::Instant::now();
    let mut rows: Vec<Option<Vec<Row>>> = vec![None; all.len()];
    let mut cleaned: Vec<Option<i64>> = vec![None; all.len()];
    loop {
        let mut done = true;
        for (i, (t, p, why, grace, since)) in all.iter().enumerate() {
            if rows[i].is_none() {
                let cs = client.list_containers(Some(p.uid.as_str())).await?;
                if cs.iter().any(|c| c.state.may_run()) {
                    done = false;
                    continue;
                }
                let mut mine = Vec::new();
                for (name, id) in &p.containers {
                    let (stopped_after, exit_code) = match client.container_status(id).await {
                        Ok(st) => ((st.finished_at - since) as f64 / 1e9, st.exit_code),
                        Err(_) => (f64::NAN, -1),
                    };
                    mine.push(Row {
                        pod: t.name.clone(),
                        why,
                        grace: *grace,
                        container: name.clone(),
                        stopped_after,
                        exit_code,
                        cleaned_after: f64::NAN,
                    });
                }
                rows[i] = Some(mine);
            }
            let gone = cgroups
                .existing(&p.uid)
                .map(|v| v.is_empty())
                .unwrap_or(false);
            if gone && cleaned[i].is_none() && rows[i].is_some() {
                cleaned[i] = Some(wall_ns() - since);
            }
            done &= gone;
        }
        if done {
            break;
        }
        if start.elapsed() > limit {
            cancel.cancel();
            return Err(DemoError::Timeout(limit));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let rows: Vec<Row> = rows
        .into_iter()
        .zip(cleaned)
        .flat_map(|(r, c)| {
            r.unwrap_or_default().into_iter().map(move |mut row| {
                row.cleaned_after = c.map_or(f64::NAN, |ns| ns as f64 / 1e9);
                row
            })
        })
        .collect();
    cancel.cancel();
    if let Ok(r) = agent.await {
        r?;
    }
    Ok((version, rows))
}
