//! reaplet's binary: parses the command line and runs the library. The only place that reads
//! argv or the environment, and the only user of anyhow.

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use reaplet::cgroups::CgroupDriver;
use reaplet::cri::CriConfig;
use reaplet::workers::PipelineConfig;
use std::path::PathBuf;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

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
    let (version, rows) = reaplet::demo::run(reaplet::demo::DemoConfig {
        testbed_dir: args.testbed_dir,
        cgroup_root: args.cgroup_root,
        mountinfo: "/proc/self/mountinfo".into(),
    })
    .await?;
    println!("runtime: {version}");
    println!("pods came from a static manifest directory; the orphan had no manifest at all\n");
    println!(
        "{:<22} {:<17} {:>6} {:<10} {:>9} {:>5}",
        "POD", "WHY", "GRACE", "CONTAINER", "STOPPED", "EXIT"
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
        println!(
            "{:<22} {:<17} {:>5}s {:<10} {:>9} {:>5}",
            r.pod, r.why, r.grace, r.container, stopped, exit
        );
    }
    println!("\nall pods terminated: containers and sandboxes stopped, pod cgroups removed");
    Ok(())
}
