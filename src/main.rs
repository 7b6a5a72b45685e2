//! reaplet's binary: parses the command line and runs the library. The only place that reads
//! argv or the environment, and the only user of anyhow.

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use reaplet::authority::Authority;
use reaplet::cgroups::{CgroupDriver, CgroupManager, CgroupNaming};
use reaplet::cri::{CriClient, CriConfig, Runtime};
use reaplet::events::EventSink;
use reaplet::testbed::{self, ContainerTemplate, IGNORES_TERM, PodTemplate, TRAPS_TERM};
use reaplet::workers::{PipelineConfig, PodWorkers};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

#[derive(Parser)]
#[command(
    name = "reaplet",
    version,
    about = "Ends pods on a Kubernetes node the way the kubelet does"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the version.
    Version,
    /// Run the agent: watch this node's pods and end those that must stop.
    Run(RunArgs),
    /// Demonstrate the termination pipeline on a private containerd (see scripts/demo.sh):
    /// launches pods through CRI as the kubelet does, deletes them, and prints what happened.
    Demo(DemoArgs),
}

#[derive(clap::Args)]
struct RunArgs {
    /// kubeconfig for the API server; without it, the in-cluster service account is tried, and
    /// without either reaplet runs from --pod-manifest-path alone.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// The node name (default: the host name).
    #[arg(long)]
    hostname_override: Option<String>,
    #[arg(long, default_value = "unix:///run/containerd/containerd.sock")]
    container_runtime_endpoint: String,
    /// Deadline of every CRI call (StopContainer: this plus the grace).
    #[arg(long, default_value = "2m", value_parser = parse_duration)]
    runtime_request_timeout: Duration,
    #[arg(long, default_value = "/var/lib/kubelet")]
    root_dir: PathBuf,
    #[arg(long, value_enum, default_value = "cgroupfs")]
    cgroup_driver: Driver,
    #[arg(long, default_value = "/")]
    cgroup_root: String,
    /// Directory of static pod manifests (YAML or JSON).
    #[arg(long)]
    pod_manifest_path: Option<PathBuf>,
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    file_check_frequency: Duration,
    /// API write requests per second (status, delete).
    #[arg(long, default_value_t = 100.0)]
    kube_api_qps: f64,
    #[arg(long, default_value_t = 200)]
    kube_api_burst: u32,
    #[arg(long, default_value_t = 10.0)]
    event_qps: f64,
    #[arg(long, default_value_t = 50)]
    event_burst: u32,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum Driver {
    Cgroupfs,
    Systemd,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let (num, unit) = s.trim().split_at(
        s.trim()
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(s.trim().len()),
    );
    let v: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration like 500ms, 10s, 2m"))?;
    let secs = match unit {
        "ms" => v / 1000.0,
        "" | "s" => v,
        "m" => v * 60.0,
        "h" => v * 3600.0,
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (ms, s, m, h)")),
    };
    if !secs.is_finite() || !(0.0..=1e9).contains(&secs) {
        return Err(format!("{s:?} is out of range"));
    }
    Ok(Duration::from_secs_f64(secs))
}

#[derive(clap::Args)]
struct DemoArgs {
    /// The test bed directory (holds containerd.sock and pod logs).
    #[arg(long, default_value = "/tmp/reaplet-tb-demo")]
    testbed_dir: PathBuf,
    /// The cgroup root the test bed's pods live below.
    #[arg(long, default_value = "/reaplet-tb-demo")]
    cgroup_root: String,
}

#[tokio::main]
async fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Version => {
            println!("reaplet {}", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
        Command::Run(args) => {
            init_logs();
            run(args).await
        }
        Command::Demo(args) => {
            tracing_subscriber::fmt()
                .with_env_filter(
                    tracing_subscriber::EnvFilter::try_from_default_env()
                        .unwrap_or_else(|_| "reaplet=info".into()),
                )
                .with_writer(std::io::stderr)
                .init();
            demo(args).await
        }
    }
}

fn init_logs() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
}

fn host_name() -> Result<String> {
    let h =
        std::fs::read_to_string("/proc/sys/kernel/hostname").context("reading the host name")?;
    Ok(h.trim().to_lowercase())
}

async fn run(args: RunArgs) -> Result<()> {
    let positive = |v: f64| v.is_finite() && v > 0.0;
    if !positive(args.kube_api_qps) || !positive(args.event_qps) {
        bail!("--kube-api-qps and --event-qps must be positive");
    }
    let node_name = match args.hostname_override {
        Some(n) if !n.trim().is_empty() => n.trim().to_lowercase(),
        Some(_) => bail!("--hostname-override must not be empty"),
        None => host_name()?,
    };
    let kube = match reaplet::api::client_config(args.kubeconfig.as_deref()).await {
        Ok(c) => Some(c),
        Err(reaplet::api::ApiError::NoCredentials(e)) if args.pod_manifest_path.is_some() => {
            tracing::info!(reason = %e, "no API credentials: running from the manifest directory alone");
            None
        }
        Err(e) => return Err(e.into()),
    };
    let cfg = reaplet::agent::AgentConfig {
        node_name,
        runtime: CriConfig {
            endpoint: args.container_runtime_endpoint,
            request_timeout: args.runtime_request_timeout,
        },
        cgroup_driver: match args.cgroup_driver {
            Driver::Cgroupfs => CgroupDriver::Cgroupfs,
            Driver::Systemd => CgroupDriver::Systemd,
        },
        cgroup_root: args.cgroup_root,
        pod_manifest_path: args.pod_manifest_path,
        file_check_frequency: args.file_check_frequency,
        kube,
        api_qps: args.kube_api_qps,
        api_burst: args.kube_api_burst,
        event_qps: args.event_qps,
        event_burst: args.event_burst,
        status_resync: Duration::from_secs(10),
        pipeline: PipelineConfig {
            root_dir: args.root_dir,
            ..PipelineConfig::default()
        },
        shutdown_timeout: Duration::from_secs(5),
    };
    let cancel = CancellationToken::new();
    let stopper = cancel.clone();
    tokio::spawn(async move {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(e) => {
                    tracing::error!(err = %e, "cannot listen for SIGTERM");
                    return;
                }
            };
        tokio::select! {
            _ = term.recv() => tracing::info!(signal = "SIGTERM", "stop requested"),
            _ = tokio::signal::ctrl_c() => tracing::info!(signal = "SIGINT", "stop requested"),
        }
        stopper.cancel();
    });
    reaplet::agent::run(cfg, cancel).await?;
    Ok(())
}

async fn demo(args: DemoArgs) -> Result<()> {
    let tb = testbed::Testbed::attach(args.testbed_dir.clone(), args.cgroup_root.clone());
    let client = CriClient::new(&CriConfig {
        endpoint: tb.endpoint(),
        ..CriConfig::default()
    })?;
    let v = client
        .version()
        .await
        .context("the test bed's containerd is not answering")?;
    println!(
        "runtime: {} {} (CRI {})",
        v.runtime_name, v.runtime_version, v.runtime_api_version
    );

    let naming = CgroupNaming::new(CgroupDriver::Cgroupfs, &args.cgroup_root)?;
    let cgroups = CgroupManager::from_mountinfo("/proc/self/mountinfo".as_ref(), naming)?;
    let root_dir = args.testbed_dir.join("kubelet");
    std::fs::create_dir_all(&root_dir)?;
    let cancel = CancellationToken::new();
    let tracker = TaskTracker::new();
    let workers = PodWorkers::new(
        Arc::new(client.clone()),
        cgroups,
        PipelineConfig {
            root_dir,
            ..PipelineConfig::default()
        },
        EventSink::log_only(),
        Arc::new(Authority::default()),
        cancel.clone(),
        tracker.clone(),
    );

    let hook = serde_json::json!({"exec": {"command": ["/bin/sh", "-c", "sleep 1"]}});
    let pods = vec![
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
    let orphan =
        PodTemplate::new("forgotten", 600).container(ContainerTemplate::new("app", IGNORES_TERM));
    let mut launched = Vec::new();
    for t in pods.iter().chain([&orphan]) {
        let p = testbed::launch(&tb, t)
            .await
            .map_err(|e| anyhow::anyhow!("launching {}: {e}", t.name))?;
        launched.push((t.name.clone(), p));
    }
    println!(
        "launched {} pods (the last one is an orphan: no pod object knows it)",
        launched.len()
    );

    workers.set_desired(pods.iter().map(PodTemplate::pod_info).collect(), Some(1));
    tracker.spawn(workers.clone().run_housekeeping());
    let t0 = std::time::SystemTime::now();
    let t0_ns = t0.duration_since(std::time::UNIX_EPOCH)?.as_nanos() as i64;
    for t in &pods {
        workers.upsert(t.deleted(t.grace));
    }
    println!("deleted 4 pods through the seam (deletionGracePeriodSeconds = their spec grace)");

    // record each pod's containers as soon as they are stopped (a finished orphan's sandbox
    // is garbage-collected right after, with its containers)
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut rows: Vec<Option<Vec<String>>> = vec![None; launched.len()];
    let mut done = vec![false; launched.len()];
    while done.iter().any(|d| !d) {
        for (i, (name, p)) in launched.iter().enumerate() {
            let view = workers.view(&p.uid);
            let state = view.as_ref().map(|v| v.state);
            if rows[i].is_none() && matches!(state, Some("terminated" | "finished")) {
                let v = view.as_ref().context("pod view")?;
                let mut lines = Vec::new();
                for (cname, cid) in &p.containers {
                    let (stopped, exit) = match client.container_status(cid).await {
                        Ok(st) => (
                            format!("{:>8.3}s", (st.finished_at - t0_ns) as f64 / 1e9),
                            st.exit_code.to_string(),
                        ),
                        Err(_) => ("removed".into(), "-".into()),
                    };
                    lines.push(format!(
                        "{:<10} {:<8} {:>5}s {:<10} {:>9} {:>5}",
                        name,
                        v.reason.unwrap_or("-"),
                        v.grace.unwrap_or(0),
                        cname,
                        stopped,
                        exit
                    ));
                }
                rows[i] = Some(lines);
            }
            // finished, or finished and already forgotten by housekeeping
            done[i] = rows[i].is_some() && matches!(state, Some("finished") | None);
        }
        if tokio::time::Instant::now() > deadline {
            bail!("pods did not finish within 60 s: {:?}", workers.snapshot());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!();
    println!(
        "{:<10} {:<8} {:>6} {:<10} {:>9} {:>5}",
        "POD", "REASON", "GRACE", "CONTAINER", "STOPPED", "EXIT"
    );
    for line in rows.into_iter().flatten().flatten() {
        println!("{line}");
    }
    println!("\nall pods terminated: containers and sandboxes stopped, pod cgroups removed");
    cancel.cancel();
    tracker.close();
    tracker.wait().await;
    Ok(())
}
