//! reaplet's binary: reads argv, the environment and the config files, and runs the library.
//! The only place that reads argv or the environment, and the only user of anyhow.
//!
//! Invariants (the kubelet's `cmd/kubelet/app` counterpart):
//! * every configuration problem (a bad flag, a bad value, an unreadable or invalid config file
//!   or kubeconfig) is found before anything starts and exits [`EXIT_CONFIG`] with one line
//!   naming the field and why; `--help` and `--version` exit 0;
//! * a closed or broken stdout or stderr (EPIPE) never panics: command output ends quietly
//!   ([`emit`]), messages and logs to stderr are dropped, so SIGTERM is always honoured.

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use reaplet::config::{self, ConfigError, Loaded, LogFormat, RawSettings, Settings};
use reaplet::cri::CriConfig;
use reaplet::workers::PipelineConfig;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Exit code for an invalid configuration (BSD `EX_USAGE`); the unit's
/// `RestartPreventExitStatus=64` keeps systemd from restarting a broken configuration.
const EXIT_CONFIG: i32 = 64;
/// Exit code when the API server no longer accepts reaplet's credentials (BSD `EX_TEMPFAIL`):
/// systemd restarts it, and the restart reads the (rotated) credentials again.
const EXIT_CREDENTIALS: i32 = 75;

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
    /// Run the agent: watch this node's pods and end those that must stop.
    Run(Flags),
    /// Preflight: check the runtime, cgroups, root dir, API access and logind; exit 1 on a failure.
    Check(Flags),
    /// Show what a running agent sees (from its local status endpoint).
    Pods(PodsArgs),
    /// Empty this node: cordon it, then evict its pods through the Eviction API, lower priority
    /// first, each owner's pods one at a time (the ReplicaSet scale-down ranking).
    Drain(DrainCmd),
    /// Free what a pod of priority P needs on this node, evicting the fewest lower-priority pods
    /// (the scheduler's preemption victim selection).
    MakeRoom(MakeRoomCmd),
    /// Print the version.
    Version,
    /// Demonstrate the pipeline on a private containerd (see scripts/demo.sh).
    #[cfg(feature = "testbed")]
    Demo(DemoArgs),
}

/// Settings: flags > environment (REAPLET_*) > --config file > the kubelet's file > defaults.
#[derive(clap::Args, Default)]
struct Flags {
    /// YAML config file: reaplet's own (kind ReapletConfiguration) or the kubelet's
    /// (kind KubeletConfiguration, read for the settings that mean the same).
    #[arg(long, env = "REAPLET_CONFIG")]
    config: Option<PathBuf>,
    /// The kubelet's config file (e.g. /var/lib/kubelet/config.yaml), below reaplet's own.
    #[arg(long, env = "REAPLET_KUBELET_CONFIG")]
    kubelet_config: Option<String>,
    /// kubeconfig for the API server (else the in-cluster service account).
    #[arg(long, env = "REAPLET_KUBECONFIG")]
    kubeconfig: Option<String>,
    /// The node name (default: the host name).
    #[arg(long, env = "REAPLET_HOSTNAME_OVERRIDE")]
    hostname_override: Option<String>,
    /// CRI endpoint (default unix:///run/containerd/containerd.sock).
    #[arg(long, env = "REAPLET_CONTAINER_RUNTIME_ENDPOINT")]
    container_runtime_endpoint: Option<String>,
    /// Deadline of every CRI call; StopContainer gets this plus the grace (default 2m).
    #[arg(long, env = "REAPLET_RUNTIME_REQUEST_TIMEOUT")]
    runtime_request_timeout: Option<String>,
    /// Default /var/lib/kubelet.
    #[arg(long, env = "REAPLET_ROOT_DIR")]
    root_dir: Option<String>,
    /// cgroupfs or systemd (default: detected from the runtime, then the host).
    #[arg(long, env = "REAPLET_CGROUP_DRIVER")]
    cgroup_driver: Option<String>,
    /// Default /.
    #[arg(long, env = "REAPLET_CGROUP_ROOT")]
    cgroup_root: Option<String>,
    /// Whether the kubelet makes pod cgroups below kubepods and its QoS classes (default true).
    #[arg(long, env = "REAPLET_CGROUPS_PER_QOS", num_args = 0..=1, default_missing_value = "true")]
    cgroups_per_qos: Option<String>,
    /// Directory of static pod manifests.
    #[arg(long, env = "REAPLET_POD_MANIFEST_PATH")]
    pod_manifest_path: Option<String>,
    /// Default 1s.
    #[arg(long, env = "REAPLET_FILE_CHECK_FREQUENCY")]
    file_check_frequency: Option<String>,
    /// API write requests per second (default 100).
    #[arg(long, env = "REAPLET_KUBE_API_QPS")]
    kube_api_qps: Option<String>,
    /// Default 200.
    #[arg(long, env = "REAPLET_KUBE_API_BURST")]
    kube_api_burst: Option<String>,
    /// Events per second (default 10).
    #[arg(long, env = "REAPLET_EVENT_QPS")]
    event_qps: Option<String>,
    /// Default 50.
    #[arg(long, env = "REAPLET_EVENT_BURST")]
    event_burst: Option<String>,
    /// Status endpoint: /metrics, /healthz, /readyz, /pods (default 127.0.0.1:10258).
    #[arg(long, env = "REAPLET_METRICS_BIND_ADDRESS")]
    metrics_bind_address: Option<String>,
    /// auto, text, json or journald (default auto: journald under systemd, else text).
    #[arg(long, env = "REAPLET_LOG_FORMAT")]
    log_format: Option<String>,
    /// How long the terminated stage waits for volumes to be unmounted (default 2m3s).
    #[arg(long, env = "REAPLET_VOLUME_UNMOUNT_TIMEOUT")]
    volume_unmount_timeout: Option<String>,
    /// Runtime relist period without container events (default 1s).
    #[arg(long, env = "REAPLET_RELIST_PERIOD")]
    relist_period: Option<String>,
    /// Runtime relist period while container events flow (default 10s).
    #[arg(long, env = "REAPLET_RELIST_PERIOD_WITH_EVENTS")]
    relist_period_with_events: Option<String>,
    /// Subscribe to container exits: CRI GetContainerEvents, else containerd's events (default true).
    #[arg(long, env = "REAPLET_CONTAINER_EVENTS", num_args = 0..=1, default_missing_value = "true")]
    container_events: Option<String>,
    /// primary, standby (a kubelet is the primary) or auto: standby when a kubelet holds this
    /// node's Lease at start (default auto).
    #[arg(long, env = "REAPLET_AUTHORITY")]
    authority: Option<String>,
    /// The kubelet's health endpoint, watched in standby (default http://127.0.0.1:10248/healthz).
    #[arg(long, env = "REAPLET_KUBELET_HEALTHZ_URL")]
    kubelet_healthz_url: Option<String>,
    /// Standby takes over when the node Lease is unrenewed this long and healthz fails (default 40s).
    #[arg(long, env = "REAPLET_TAKEOVER_AFTER")]
    takeover_after: Option<String>,
    /// The NoExecute taint manager for this node (the controller manager's flag; default: on
    /// for a standalone node, primary with its own static pods, else off).
    #[arg(long, env = "REAPLET_ENABLE_TAINT_MANAGER", num_args = 0..=1, default_missing_value = "true")]
    enable_taint_manager: Option<String>,
    /// Evict pods (Eviction API) whose required node affinity no longer matches (default false).
    #[arg(long, env = "REAPLET_ENFORCE_NODE_AFFINITY", num_args = 0..=1, default_missing_value = "true")]
    enforce_node_affinity: Option<String>,
    /// Node affinity only in these namespaces (comma-separated; default all).
    #[arg(long, env = "REAPLET_NODE_AFFINITY_NAMESPACES")]
    node_affinity_namespaces: Option<String>,
    /// Node affinity only for pods matching this label selector (k=v,k!=v,k,!k).
    #[arg(long, env = "REAPLET_NODE_AFFINITY_SELECTOR")]
    node_affinity_selector: Option<String>,
    /// How long a node affinity mismatch must last before the eviction (default 30s).
    #[arg(long, env = "REAPLET_NODE_AFFINITY_SETTLE")]
    node_affinity_settle: Option<String>,
    /// The eviction sources only report what they would evict (default false).
    #[arg(long, env = "REAPLET_EVICTION_DRY_RUN", num_args = 0..=1, default_missing_value = "true")]
    eviction_dry_run: Option<String>,
    /// Graceful node shutdown: how long the node waits for its pods (the kubelet's
    /// shutdownGracePeriod; default 0: off). Per-priority groups
    /// (shutdownGracePeriodByPodPriority) are set in the config file.
    #[arg(long, env = "REAPLET_SHUTDOWN_GRACE_PERIOD")]
    shutdown_grace_period: Option<String>,
    /// The part of shutdownGracePeriod kept for critical pods (the kubelet's
    /// shutdownGracePeriodCriticalPods).
    #[arg(long, env = "REAPLET_SHUTDOWN_GRACE_PERIOD_CRITICAL_PODS")]
    shutdown_grace_period_critical_pods: Option<String>,
}

impl Flags {
    fn raw(&self) -> RawSettings {
        RawSettings {
            kubeconfig: self.kubeconfig.clone(),
            kubelet_config: self.kubelet_config.clone(),
            hostname_override: self.hostname_override.clone(),
            container_runtime_endpoint: self.container_runtime_endpoint.clone(),
            runtime_request_timeout: self.runtime_request_timeout.clone(),
            root_dir: self.root_dir.clone(),
            cgroup_driver: self.cgroup_driver.clone(),
            cgroup_root: self.cgroup_root.clone(),
            cgroups_per_qos: self.cgroups_per_qos.clone(),
            pod_manifest_path: self.pod_manifest_path.clone(),
            file_check_frequency: self.file_check_frequency.clone(),
            kube_api_qps: self.kube_api_qps.clone(),
            kube_api_burst: self.kube_api_burst.clone(),
            event_qps: self.event_qps.clone(),
            event_burst: self.event_burst.clone(),
            metrics_bind_address: self.metrics_bind_address.clone(),
            log_format: self.log_format.clone(),
            volume_unmount_timeout: self.volume_unmount_timeout.clone(),
            relist_period: self.relist_period.clone(),
            relist_period_with_events: self.relist_period_with_events.clone(),
            container_events: self.container_events.clone(),
            authority: self.authority.clone(),
            kubelet_healthz_url: self.kubelet_healthz_url.clone(),
            takeover_after: self.takeover_after.clone(),
            enable_taint_manager: self.enable_taint_manager.clone(),
            enforce_node_affinity: self.enforce_node_affinity.clone(),
            node_affinity_namespaces: self.node_affinity_namespaces.clone(),
            node_affinity_selector: self.node_affinity_selector.clone(),
            node_affinity_settle: self.node_affinity_settle.clone(),
            eviction_dry_run: self.eviction_dry_run.clone(),
            shutdown_grace_period: self.shutdown_grace_period.clone(),
            shutdown_grace_period_critical_pods: self.shutdown_grace_period_critical_pods.clone(),
            shutdown_grace_period_by_pod_priority: None,
        }
    }

    /// Reads the files, resolves and validates, and checks the API credentials; any problem
    /// exits 64 naming the field.
    async fn load(&self) -> (Loaded, Option<kube::Config>) {
        let loaded =
            config::load(self.raw(), self.config.as_deref()).unwrap_or_else(|e| exit_config(e));
        let kube = api_config(&loaded.settings)
            .await
            .unwrap_or_else(|e| exit_config(e));
        (loaded, kube)
    }
}

/// The operator's side: kubectl's credentials and output.
#[derive(clap::Args)]
struct OperatorArgs {
    /// The node (default: this host's name).
    #[arg(long)]
    node: Option<String>,
    /// kubeconfig (default: $KUBECONFIG, else ~/.kube/config), as kubectl.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Print the plan only; change nothing (not even the cordon).
    #[arg(long)]
    dry_run: bool,
    /// Give up after this long (e.g. 5m), exit 1 and list the pods still there.
    #[arg(long)]
    timeout: Option<String>,
    /// table (a live table; the default on a terminal), plain (one line per change) or json.
    #[arg(long, short = 'o')]
    output: Option<String>,
}

#[derive(clap::Args)]
struct DrainCmd {
    #[command(flatten)]
    op: OperatorArgs,
    /// The grace period for every eviction (default: each pod's own).
    #[arg(long)]
    grace_period: Option<i64>,
    /// Evict pods with emptyDir volumes (their data is lost).
    #[arg(long)]
    delete_emptydir_data: bool,
    /// Evict pods no controller manages (they are not recreated).
    #[arg(long)]
    force: bool,
}

#[derive(clap::Args)]
struct MakeRoomCmd {
    #[command(flatten)]
    op: OperatorArgs,
    /// A pod manifest (YAML or JSON): its requests, priorityClassName (resolved from the API,
    /// as admission does) and preemptionPolicy.
    #[arg(long)]
    for_pod: Option<PathBuf>,
    /// CPU the pod requests (a quantity: 500m, 2); overrides the manifest's.
    #[arg(long)]
    cpu: Option<String>,
    /// Memory the pod requests (a quantity: 512Mi, 2Gi); overrides the manifest's.
    #[arg(long)]
    memory: Option<String>,
    /// Ephemeral storage the pod requests; overrides the manifest's.
    #[arg(long)]
    ephemeral_storage: Option<String>,
    /// Any other resource the pod requests, as NAME=QUANTITY (e.g. example.com/gpu=1);
    /// repeatable; overrides the manifest's.
    #[arg(long = "request", value_name = "NAME=QUANTITY")]
    extra: Vec<String>,
    /// The pod's priority: only lower priorities are evicted. Overrides the manifest's class
    /// (default: the manifest's class, else the cluster's global default class, else 0).
    #[arg(long, allow_negative_numbers = true)]
    priority: Option<i32>,
}

#[derive(clap::Args)]
struct PodsArgs {
    /// The config file `reaplet run` uses: its metricsBindAddress is the agent's endpoint.
    #[arg(long, env = "REAPLET_CONFIG")]
    config: Option<PathBuf>,
    /// The kubelet's config file, as for `reaplet run`.
    #[arg(long, env = "REAPLET_KUBELET_CONFIG")]
    kubelet_config: Option<String>,
    /// The agent's status endpoint (default: from the config, else 127.0.0.1:10258).
    #[arg(
        long,
        alias = "metrics-bind-address",
        env = "REAPLET_METRICS_BIND_ADDRESS"
    )]
    address: Option<String>,
}

#[cfg(feature = "testbed")]
#[derive(clap::Args)]
struct DemoArgs {
    /// The test bed directory (holds containerd.sock and pod logs).
    #[arg(long, default_value = "/tmp/reaplet-tb-demo")]
    testbed_dir: PathBuf,
    /// The cgroup root the test bed's pods live below.
    #[arg(long, default_value = "/reaplet-tb-demo")]
    cgroup_root: String,
}

/// One line to stderr; a closed or broken stderr is ignored, never a panic (`eprintln!`
/// panics on EPIPE).
fn say(msg: impl std::fmt::Display) {
    let _ = writeln!(std::io::stderr().lock(), "reaplet: {msg}");
}

/// Exits 64 with one line (a multi-line cause, such as a YAML parser's source snippet, is cut
/// to its first line).
fn exit_config(e: ConfigError) -> ! {
    let text = e.to_string();
    say(text.lines().next().unwrap_or_default().trim_end());
    std::process::exit(EXIT_CONFIG)
}

/// Writes a command's output to stdout; a reader that went away (EPIPE, as under
/// `reaplet pods | head -1`) ends the output quietly.
fn emit(text: &str) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => r,
    }
}

/// argv parsed; a usage error exits 64 with one line (clap's own exit code is 2).
fn parse_args() -> Cli {
    use clap::error::ErrorKind;
    let e = match Cli::try_parse() {
        Ok(cli) => return cli,
        Err(e) => e,
    };
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            let _ = e.print();
            std::process::exit(0)
        }
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => exit_config(ConfigError {
            field: "command",
            why: "missing: run, check, pods or version (reaplet --help)".into(),
        }),
        _ => {
            // clap's message up to its usage block, on one line
            let text = e.to_string();
            let why: Vec<&str> = text
                .lines()
                .take_while(|l| !l.starts_with("Usage:"))
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with("For more information"))
                .collect();
            let why = why.join("; ");
            say(format!(
                "invalid configuration: {} (reaplet --help)",
                why.strip_prefix("error: ").unwrap_or(&why)
            ));
            std::process::exit(EXIT_CONFIG)
        }
    }
}

fn main() {
    let cli = parse_args();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            say(format!("starting the async runtime: {e}"));
            std::process::exit(1);
        }
    };
    let r = rt.block_on(async move {
        match cli.command {
            Command::Version => {
                let hooks =
                    cfg!(feature = "test-hooks").then_some(" (test-hooks: not for production)");
                let v = format!(
                    "reaplet {}{}\n",
                    env!("CARGO_PKG_VERSION"),
                    hooks.unwrap_or("")
                );
                emit(&v).context("writing the output")?;
                Ok(0)
            }
            Command::Run(flags) => {
                // the stop signals first: SIGTERM during start-up is a clean stop, never
                // the signal's default action
                let cancel = CancellationToken::new();
                let stop = stop_on_signals(cancel.clone());
                let (loaded, kube) = flags.load().await;
                init_logs(loaded.settings.log_format);
                log_config(&loaded);
                match stop {
                    Ok(task) => drop(tokio::spawn(task)),
                    Err(e) => tracing::error!(err = %e, "cannot listen for SIGTERM"),
                }
                run(loaded.settings, kube, cancel).await.map(|()| 0)
            }
            Command::Check(flags) => {
                let (loaded, kube) = flags.load().await;
                check(&loaded, kube).await
            }
            Command::Pods(args) => pods(args).await.map(|()| 0),
            Command::Drain(args) => Ok(drain_cmd(args).await),
            Command::MakeRoom(args) => Ok(make_room_cmd(args).await),
            #[cfg(feature = "testbed")]
            Command::Demo(args) => {
                init_logs(LogFormat::Auto);
                demo(args).await.map(|()| 0)
            }
        }
    });
    match r {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            say(format!("{e:#}"));
            let rejected = matches!(
                e.downcast_ref::<reaplet::agent::AgentError>(),
                Some(reaplet::agent::AgentError::CredentialsRejected(_))
            );
            std::process::exit(if rejected { EXIT_CREDENTIALS } else { 1 });
        }
    }
}

/// The start-up lines about where the settings came from.
fn log_config(loaded: &Loaded) {
    if let Some(k) = &loaded.kubelet {
        tracing::info!(
            file = %k.path.display(),
            used = %k.used.join(","),
            ignored = %k.ignored.join(","),
            "kubelet configuration read; the fields reaplet does not use are ignored"
        );
        if let Some(dir) = &k.static_pod_path {
            tracing::info!(
                staticPodPath = %dir.display(),
                "the kubelet's static pods are the kubelet's: reaplet runs a manifest directory only when podManifestPath names one"
            );
        }
    }
    if !loaded.settings.cgroups_per_qos {
        tracing::warn!(
            "cgroupsPerQOS is false: read but not yet honoured; reaplet still looks for pod \
             cgroups below kubepods (the kubelet makes none)"
        );
    }
}

/// Writes `<N>` syslog level prefixes (journald reads them from stderr), then the event.
struct JournaldFormat(
    tracing_subscriber::fmt::format::Format<tracing_subscriber::fmt::format::Full, ()>,
);

impl<S, N> tracing_subscriber::fmt::FormatEvent<S, N> for JournaldFormat
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
        mut writer: tracing_subscriber::fmt::format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        let prio = match *event.metadata().level() {
            tracing::Level::ERROR => 3,
            tracing::Level::WARN => 4,
            tracing::Level::INFO => 6,
            _ => 7,
        };
        write!(writer, "<{prio}>")?;
        self.0.format_event(ctx, writer, event)
    }
}

fn init_logs(format: LogFormat) {
    use std::io::IsTerminal;
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let format = match format {
        LogFormat::Auto if std::env::var_os("JOURNAL_STREAM").is_some() => LogFormat::Journald,
        LogFormat::Auto => LogFormat::Text,
        f => f,
    };
    // a write error (EPIPE on a closed stderr) drops the line: the default reports it with
    // eprintln!, which panics on that same stderr, in whichever task logged
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .log_internal_errors(false);
    match format {
        LogFormat::Json => builder.json().flatten_event(true).init(),
        LogFormat::Journald => builder
            .with_ansi(false)
            .event_format(JournaldFormat(
                tracing_subscriber::fmt::format().without_time(),
            ))
            .init(),
        _ => builder.with_ansi(std::io::stderr().is_terminal()).init(),
    }
}

fn host_name() -> Result<String> {
    let h =
        std::fs::read_to_string("/proc/sys/kernel/hostname").context("reading the host name")?;
    Ok(h.trim().to_lowercase())
}

fn node_name(s: &Settings) -> Result<String> {
    match &s.hostname_override {
        Some(n) => Ok(n.clone()),
        None => host_name(),
    }
}

/// The API client configuration, or `None` for static manifests only; read before anything
/// starts: an unreadable or invalid kubeconfig, or no credentials at all without a manifest
/// directory, is a configuration error naming `kubeconfig`.
async fn api_config(s: &Settings) -> Result<Option<kube::Config>, ConfigError> {
    use reaplet::api::ApiError;
    let why = match reaplet::api::client_config(s.kubeconfig.as_deref()).await {
        Ok(c) => return Ok(Some(c)),
        Err(ApiError::NoCredentials(_))
            if s.authority == reaplet::standby::AuthoritySetting::Standby =>
        {
            return Err(ConfigError {
                field: "authority",
                why: "standby needs API credentials: it watches the node's Lease (give a kubeconfig, or authority primary or auto)".into(),
            });
        }
        Err(ApiError::NoCredentials(_)) if s.pod_manifest_path.is_some() => return Ok(None),
        Err(ApiError::Kubeconfig { path, source }) => format!("{path}: {source}"),
        Err(ApiError::NoCredentials(e)) => format!(
            "none given, not running in a cluster ({e}), and no podManifestPath to run from alone"
        ),
        Err(e) => e.to_string(),
    };
    Err(ConfigError {
        field: "kubeconfig",
        why,
    })
}

/// Registers SIGTERM and SIGINT at once; the returned task cancels `cancel` on the first.
fn stop_on_signals(
    cancel: CancellationToken,
) -> std::io::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!(signal = "SIGTERM", "stop requested"),
            _ = int.recv() => tracing::info!(signal = "SIGINT", "stop requested"),
        }
        cancel.cancel();
    })
}

/// Runs the agent until `cancel`; a stop during start-up (a runtime that does not answer,
/// say) ends it at once, with no pod touched.
async fn run(s: Settings, kube: Option<kube::Config>, cancel: CancellationToken) -> Result<()> {
    let cfg = tokio::select! {
        _ = cancel.cancelled() => {
            tracing::info!("stopped during start-up: pods are left running");
            return Ok(());
        }
        cfg = agent_config(s, kube) => cfg?,
    };
    reaplet::agent::run(cfg, cancel).await?;
    Ok(())
}

/// The agent's configuration: the settings, plus what start-up finds out (the node name,
/// the cgroup driver from the runtime, systemd's watchdog).
async fn agent_config(
    s: Settings,
    kube: Option<kube::Config>,
) -> Result<reaplet::agent::AgentConfig> {
    let node_name = node_name(&s)?;
    if kube.is_none() {
        tracing::info!("no API credentials: running from the manifest directory alone");
    }
    let runtime = CriConfig {
        endpoint: s.container_runtime_endpoint.clone(),
        request_timeout: s.runtime_request_timeout,
    };
    let cgroup_driver = match s.cgroup_driver {
        Some(d) => d,
        None => {
            let client = reaplet::cri::CriClient::new(&runtime)?;
            let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
            let h = reaplet::cgroups::hierarchies(&reaplet::volumes::parse_mountinfo(&mounts));
            let systemd = std::path::Path::new("/run/systemd/system").is_dir();
            let (d, how) = reaplet::agent::detect_cgroup_driver(&client, &h, systemd).await;
            tracing::info!(driver = ?d, how, "cgroup driver detected");
            d
        }
    };
    let watchdog = std::env::var("WATCHDOG_USEC")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|_| {
            std::env::var("WATCHDOG_PID").map_or(true, |p| p == std::process::id().to_string())
        })
        .map(Duration::from_micros);
    let standalone = s.pod_manifest_path.is_some();
    let cfg = reaplet::agent::AgentConfig {
        node_name,
        runtime,
        cgroup_driver,
        cgroup_root: s.cgroup_root,
        pod_manifest_path: s.pod_manifest_path,
        kubelet_static_pod_path: s.kubelet_static_pod_path,
        own_pod: reaplet::self_pod::detect().map(|(uid, how)| {
            tracing::info!(podUID = %uid, from = how.as_str(), "found reaplet's own pod");
            uid
        }),
        file_check_frequency: s.file_check_frequency,
        kube,
        api_qps: s.kube_api_qps,
        api_burst: s.kube_api_burst,
        event_qps: s.event_qps,
        event_burst: s.event_burst,
        status_resync: Duration::from_secs(10),
        pipeline: PipelineConfig {
            root_dir: s.root_dir,
            volume_wait: s.volume_unmount_timeout,
            relist_period: s.relist_period,
            relist_period_with_events: s.relist_period_with_events,
            container_events: s.container_events,
            ..PipelineConfig::default()
        },
        shutdown_timeout: Duration::from_secs(5),
        credentials_grace: Duration::from_secs(300),
        metrics_bind_address: Some(s.metrics_bind_address),
        notify_socket: std::env::var("NOTIFY_SOCKET").ok(),
        watchdog,
        // pod slices are systemd units only when systemd runs the host
        systemd_bus: std::path::Path::new("/run/systemd/system")
            .is_dir()
            .then(|| reaplet::systemd::SYSTEM_BUS.into()),
        authority: s.authority,
        kubelet_healthz_url: s.kubelet_healthz_url,
        takeover_after: s.takeover_after,
        standby_poll: Duration::from_secs(2),
        eviction: reaplet::eviction::EvictionConfig {
            // a standalone node (primary, running its own static pods) has no controller
            // manager to do it; on a cluster node the controller manager does
            taint_manager: s.enable_taint_manager.unwrap_or(
                s.authority == reaplet::standby::AuthoritySetting::Primary && standalone,
            ),
            node_affinity: s
                .enforce_node_affinity
                .then(|| reaplet::eviction::AffinityConfig {
                    namespaces: s.node_affinity_namespaces.clone(),
                    selector: s.node_affinity_selector.clone(),
                    settle: s.node_affinity_settle,
                }),
            dry_run: s.eviction_dry_run,
            // set by the agent from its own pod
            own_pod: None,
        },
        shutdown: reaplet::shutdown::ShutdownConfig::new(s.shutdown.clone()),
    };
    Ok(cfg)
}

async fn check(loaded: &Loaded, kube: Option<kube::Config>) -> Result<i32> {
    let s = &loaded.settings;
    let node = node_name(s)?;
    let lines =
        reaplet::check::run(s, &node, Ok(kube), &reaplet::check::HostPaths::default()).await;
    let mut out = String::new();
    let _ = writeln!(out, "{:<17} {:<5} DETAIL", "CHECK", "");
    if let Some(k) = &loaded.kubelet {
        let (path, used, n) = (k.path.display(), k.used.join(", "), k.ignored.len());
        let detail = format!("{path}: uses [{used}]; ignores {n} other fields");
        let _ = writeln!(out, "{:<17} {:<5} {detail}", "kubelet config", "PASS");
    }
    let mut failed = false;
    for l in &lines {
        failed |= l.outcome == reaplet::check::Outcome::Fail;
        let _ = writeln!(
            out,
            "{:<17} {:<5} {}",
            l.check,
            l.outcome.as_str(),
            l.detail
        );
    }
    emit(&out).context("writing the output")?;
    Ok(if failed { 1 } else { 0 })
}

/// The agent's status endpoint: `--address`, else the config's metricsBindAddress (an
/// unspecified address, as in 0.0.0.0:10258, is reached on loopback).
fn agent_address(args: &PodsArgs) -> std::net::SocketAddr {
    let raw = RawSettings {
        metrics_bind_address: args.address.clone(),
        kubelet_config: args.kubelet_config.clone(),
        ..RawSettings::default()
    };
    let loaded = config::load(raw, args.config.as_deref()).unwrap_or_else(|e| exit_config(e));
    let mut addr = loaded.settings.metrics_bind_address;
    if addr.ip().is_unspecified() {
        addr.set_ip(match addr {
            std::net::SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            std::net::SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    addr
}

/// The operator's API client: `--kubeconfig`, else `$KUBECONFIG`, else `~/.kube/config`.
async fn operator_client(op: &OperatorArgs) -> std::result::Result<kube::Client, String> {
    let path = op
        .kubeconfig
        .clone()
        .or_else(|| {
            std::env::var_os("KUBECONFIG")
                .and_then(|v| std::env::split_paths(&v).next())
                .filter(|p| !p.as_os_str().is_empty())
        })
        .or_else(|| {
            std::env::var_os("HOME")
                .map(|h| PathBuf::from(h).join(".kube/config"))
                .filter(|p| p.exists())
        })
        .ok_or("no kubeconfig: give --kubeconfig, set $KUBECONFIG or write ~/.kube/config")?;
    let cfg = reaplet::api::client_config(Some(&path))
        .await
        .map_err(|e| format!("kubeconfig {}: {e}", path.display()))?;
    kube::Client::try_from(cfg).map_err(|e| format!("API client: {e}"))
}

/// Common set-up of the operator commands; `Err` is the exit code, after saying why.
async fn operator_setup(
    op: &OperatorArgs,
) -> std::result::Result<
    (
        kube::Client,
        String,
        Option<Duration>,
        reaplet::drain::run::Output,
        CancellationToken,
    ),
    i32,
> {
    use reaplet::drain::run::Output;
    use std::io::IsTerminal;
    let output = match op.output.as_deref() {
        None if std::io::stdout().is_terminal() => Output::Table,
        None | Some("plain") => Output::Plain,
        Some("table") => Output::Table,
        Some("json") => Output::Json,
        Some(o) => {
            say(format!("--output {o:?}: must be table, plain or json"));
            return Err(EXIT_CONFIG);
        }
    };
    let timeout = match op
        .timeout
        .as_deref()
        .map(config::parse_duration)
        .transpose()
    {
        Ok(t) => t,
        Err(e) => {
            say(format!("--timeout: {e}"));
            return Err(EXIT_CONFIG);
        }
    };
    let node = match op.node.clone() {
        Some(n) => n,
        None => std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_lowercase())
            .unwrap_or_default(),
    };
    let client = match operator_client(op).await {
        Ok(c) => c,
        Err(e) => {
            say(e);
            return Err(EXIT_CONFIG);
        }
    };
    let cancel = CancellationToken::new();
    let c = cancel.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            c.cancel();
        }
    });
    Ok((client, node, timeout, output, cancel))
}

fn drain_exit(r: std::result::Result<(), reaplet::drain::DrainError>) -> i32 {
    match r {
        Ok(()) => 0,
        Err(reaplet::drain::DrainError::Interrupted { left }) => {
            say(format!(
                "interrupted: no further evictions; the node stays cordoned; still on the node: {}",
                left.join(", ")
            ));
            130
        }
        Err(e @ reaplet::drain::DrainError::Room(_)) => {
            say(e.to_string());
            EXIT_CONFIG
        }
        Err(e) => {
            say(e.to_string());
            1
        }
    }
}

async fn drain_cmd(args: DrainCmd) -> i32 {
    let (client, node, timeout, output, cancel) = match operator_setup(&args.op).await {
        Ok(s) => s,
        Err(code) => return code,
    };
    let a = reaplet::drain::run::DrainArgs {
        node,
        dry_run: args.op.dry_run,
        timeout,
        grace_period: args.grace_period,
        options: reaplet::drain::plan::Options {
            delete_emptydir_data: args.delete_emptydir_data,
            force: args.force,
        },
        output,
    };
    let mut out = std::io::stdout();
    drain_exit(reaplet::drain::run::drain(client, a, cancel, &mut out).await)
}

/// What `make-room` is asked for, from its flags; `Err` names the flag.
fn room_spec(args: &MakeRoomCmd) -> std::result::Result<reaplet::drain::room::RoomSpec, String> {
    use reaplet::drain::quantity::Quantity;
    let mut spec = reaplet::drain::room::RoomSpec {
        priority: args.priority,
        ..Default::default()
    };
    if let Some(f) = &args.for_pod {
        let pod = std::fs::read_to_string(f)
            .map_err(anyhow::Error::from)
            .and_then(|t| {
                serde_json::from_str(&t)
                    .or_else(|_| serde_saphyr::from_str(&t).map_err(|e| anyhow::anyhow!("{e}")))
            })
            .map_err(|e| format!("--for-pod {}: {e}", f.display()))?;
        spec.pod = Some(pod);
    }
    let named = [
        ("cpu", &args.cpu),
        ("memory", &args.memory),
        ("ephemeral-storage", &args.ephemeral_storage),
    ];
    let mut given: Vec<(String, String, String)> = named
        .iter()
        .filter_map(|(n, v)| {
            v.as_ref()
                .map(|v| (n.to_string(), v.clone(), format!("--{n}")))
        })
        .collect();
    for e in &args.extra {
        let (n, v) = e
            .split_once('=')
            .ok_or_else(|| format!("--request {e:?}: must be NAME=QUANTITY"))?;
        given.push((n.to_string(), v.to_string(), format!("--request {n}")));
    }
    for (name, value, flag) in given {
        let q = Quantity::parse(&value).map_err(|e| format!("{flag} {value:?}: {e}"))?;
        if q.cmp_value(&Quantity::default()) == std::cmp::Ordering::Less {
            return Err(format!("{flag} {value:?}: must not be negative"));
        }
        spec.requests.insert(name, q);
    }
    Ok(spec)
}

async fn make_room_cmd(args: MakeRoomCmd) -> i32 {
    let spec = match room_spec(&args) {
        Ok(s) => s,
        Err(e) => {
            say(e);
            return EXIT_CONFIG;
        }
    };
    let (client, node, timeout, output, cancel) = match operator_setup(&args.op).await {
        Ok(s) => s,
        Err(code) => return code,
    };
    let a = reaplet::drain::run::RoomArgs {
        node,
        spec,
        dry_run: args.op.dry_run,
        timeout,
        output,
    };
    let mut out = std::io::stdout();
    drain_exit(reaplet::drain::run::make_room(client, a, cancel, &mut out).await)
}

async fn pods(args: PodsArgs) -> Result<()> {
    let address = agent_address(&args);
    let (code, body) = reaplet::server::fetch(address, "/pods")
        .await
        .with_context(|| format!("no agent answering on {address} (is reaplet running?)"))?;
    if code != 200 {
        bail!("{address}: HTTP {code}");
    }
    let v: serde_json::Value = serde_json::from_str(&body).context("reading the agent's answer")?;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<40} {:<12} {:>6} {:>9} {:<8} {:<24} STEP",
        "POD", "STATE", "GRACE", "DEADLINE", "SOURCE", "REASONS"
    );
    for p in v["pods"].as_array().into_iter().flatten() {
        let deadline = p["deadlineInSeconds"]
            .as_f64()
            .map_or("-".to_string(), |d| format!("{d:.1}s"));
        let grace = p["gracePeriod"]
            .as_i64()
            .map_or("-".to_string(), |g| format!("{g}s"));
        let reasons: Vec<&str> = p["reasons"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| r.as_str())
            .collect();
        let reasons = if reasons.is_empty() {
            "-".to_string()
        } else {
            reasons.join(",")
        };
        let _ = writeln!(
            out,
            "{:<40} {:<12} {:>6} {:>9} {:<8} {:<24} {}",
            p["pod"].as_str().unwrap_or(""),
            p["state"].as_str().unwrap_or(""),
            grace,
            deadline,
            p["source"].as_str().unwrap_or(""),
            reasons,
            p["step"].as_str().unwrap_or("")
        );
    }
    let a = &v["authority"];
    if let (Some(mode), Some(role), Some(why)) =
        (a["mode"].as_str(), a["role"].as_str(), a["why"].as_str())
    {
        let _ = writeln!(out, "\nauthority: {mode}, {role}: {why}");
    }
    let evictions = v["evictions"].as_array().cloned().unwrap_or_default();
    if !evictions.is_empty() {
        let _ = writeln!(
            out,
            "\n{:<40} {:<14} {:<9} {:>8} DETAIL",
            "PENDING EVICTION", "SOURCE", "STATE", "IN"
        );
        for e in &evictions {
            let _ = writeln!(
                out,
                "{:<40} {:<14} {:<9} {:>8} {}",
                e["pod"].as_str().unwrap_or(""),
                e["source"].as_str().unwrap_or(""),
                e["state"].as_str().unwrap_or(""),
                e["inSeconds"]
                    .as_f64()
                    .map_or("-".to_string(), |d| format!("{d:.1}s")),
                e["detail"].as_str().unwrap_or("")
            );
        }
    }
    emit(&out).context("writing the output")
}

#[cfg(feature = "testbed")]
async fn demo(args: DemoArgs) -> Result<()> {
    let (version, rows) = reaplet::demo::run(reaplet::demo::DemoConfig {
        testbed_dir: args.testbed_dir,
        cgroup_root: args.cgroup_root,
        mountinfo: "/proc/self/mountinfo".into(),
    })
    .await?;
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
    emit(&out).context("writing the output")
}
