//! The flags of `reaplet run` and `reaplet check`, and loading the settings they point to: the
//! kubelet's `KubeletFlags` and its flag parsing (`cmd/kubelet/app/options`), plus the client
//! configuration check of `cmd/kubelet/app/server.go` (`buildKubeletClientConfig`).
//!
//! Invariants:
//! * every flag has its environment variable (`REAPLET_` and the flag in upper snake case); a
//!   setting the kubelet also has keeps the kubelet's flag name; precedence is flags >
//!   environment > `--config` > the kubelet's file > defaults ([`config::load`]);
//! * flags are kept as text here: parsing and validation are [`config`]'s, so a value means the
//!   same whether it comes from a flag, the environment or a file;
//! * nothing here exits or prints: every problem (a bad value, an unreadable or invalid file or
//!   kubeconfig, no credentials and no manifest directory, a `--hostname-override` that is not
//!   the node the credentials name) is a [`ConfigError`] naming the field, found before
//!   anything starts.

use crate::config::{self, ConfigError, Loaded, RawSettings, Settings};
use std::path::PathBuf;

/// Settings: flags > environment (REAPLET_*) > --config file > the kubelet's file > defaults.
#[derive(clap::Args, Default)]
pub struct Flags {
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
    /// The node name (default: the one the credentials name, CN=system:node:<name> or a
    /// pod-bound token's node, else the host name); must agree with the credentials'.
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
    /// Status endpoint: /metrics, /healthz, /readyz, /pods (default 127.0.0.1:10266).
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
    /// The kubelet's health endpoint, watched in standby (default: from --healthz-port and
    /// --healthz-bind-address, http://127.0.0.1:10248/healthz); wins over those two.
    #[arg(long, env = "REAPLET_KUBELET_HEALTHZ_URL")]
    kubelet_healthz_url: Option<String>,
    /// The kubelet's --healthz-port, where standby probes its /healthz (default: the kubelet's
    /// config file, else 10248; 0: the kubelet serves none, the Lease alone decides).
    #[arg(long, env = "REAPLET_HEALTHZ_PORT")]
    healthz_port: Option<String>,
    /// The kubelet's --healthz-bind-address (default: the kubelet's config file, else
    /// 127.0.0.1; 0.0.0.0 or :: is probed on loopback).
    #[arg(long, env = "REAPLET_HEALTHZ_BIND_ADDRESS")]
    healthz_bind_address: Option<String>,
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
    /// OpenTelemetry traces over OTLP/gRPC to this collector (host:port or URL; the kubelet's
    /// tracing.endpoint; default off, localhost:4317 when only the sampling rate is set).
    #[arg(long, env = "REAPLET_TRACING_ENDPOINT")]
    tracing_endpoint: Option<String>,
    /// Terminations traced per million (the kubelet's tracing.samplingRatePerMillion; 0..1000000).
    #[arg(long, env = "REAPLET_TRACING_SAMPLING_RATE_PER_MILLION")]
    tracing_sampling_rate_per_million: Option<String>,
    /// Finished terminations whose timelines the agent keeps for `reaplet pods --timeline`
    /// (default 100, at most 100000; every pod still terminating has one too).
    #[arg(long, env = "REAPLET_TERMINATION_TIMELINES")]
    termination_timelines: Option<String>,
    /// Hard eviction thresholds, the kubelet's (e.g. memory.available<100Mi,pid.available<10%;
    /// default the kubelet's Linux defaults; repeated flags add up).
    #[arg(long, env = "REAPLET_EVICTION_HARD")]
    eviction_hard: Vec<String>,
    /// Soft eviction thresholds (e.g. memory.available<1.5Gi), each with its grace period.
    #[arg(long, env = "REAPLET_EVICTION_SOFT")]
    eviction_soft: Vec<String>,
    /// How long a soft threshold must hold before an eviction (e.g. memory.available=1m30s).
    #[arg(long, env = "REAPLET_EVICTION_SOFT_GRACE_PERIOD")]
    eviction_soft_grace_period: Vec<String>,
    /// The least reclaimed once a threshold is met (e.g. memory.available=500Mi).
    #[arg(long, env = "REAPLET_EVICTION_MINIMUM_RECLAIM")]
    eviction_minimum_reclaim: Vec<String>,
    /// The longest grace (seconds) of a pod evicted for a soft threshold (default 0; negative:
    /// the pod's own).
    #[arg(
        long,
        env = "REAPLET_EVICTION_MAX_POD_GRACE_PERIOD",
        allow_hyphen_values = true
    )]
    eviction_max_pod_grace_period: Option<String>,
    /// How long a pressure condition outlasts its threshold (default 5m).
    #[arg(
        long,
        env = "REAPLET_EVICTION_PRESSURE_TRANSITION_PERIOD",
        allow_hyphen_values = true
    )]
    eviction_pressure_transition_period: Option<String>,
    /// A set evictionHard gains the default thresholds it lacks (default false).
    #[arg(long, env = "REAPLET_MERGE_DEFAULT_EVICTION_SETTINGS", num_args = 0..=1, default_missing_value = "true")]
    merge_default_eviction_settings: Option<String>,
    /// The kubelet's node allocatable enforcement (default pods: an
    /// allocatableMemory.available threshold beside each hard memory.available one; none).
    #[arg(long, env = "REAPLET_ENFORCE_NODE_ALLOCATABLE")]
    enforce_node_allocatable: Vec<String>,
}

impl Flags {
    /// The flags (with their environment variables) as one settings layer, unparsed.
    pub fn raw(&self) -> RawSettings {
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
            healthz_port: self.healthz_port.clone(),
            healthz_bind_address: self.healthz_bind_address.clone(),
            takeover_after: self.takeover_after.clone(),
            enable_taint_manager: self.enable_taint_manager.clone(),
            enforce_node_affinity: self.enforce_node_affinity.clone(),
            node_affinity_namespaces: self.node_affinity_namespaces.clone(),
            node_affinity_selector: self.node_affinity_selector.clone(),
            node_affinity_settle: self.node_affinity_settle.clone(),
            eviction_dry_run: self.eviction_dry_run.clone(),
            shutdown_grace_period: self.shutdown_grace_period.clone(),
            shutdown_grace_period_critical_pods: self.shutdown_grace_period_critical_pods.clone(),
            tracing_endpoint: self.tracing_endpoint.clone(),
            tracing_sampling_rate_per_million: self.tracing_sampling_rate_per_million.clone(),
            termination_timelines: self.termination_timelines.clone(),
            shutdown_grace_period_by_pod_priority: None,
            eviction_hard: joined(&self.eviction_hard),
            eviction_soft: joined(&self.eviction_soft),
            eviction_soft_grace_period: joined(&self.eviction_soft_grace_period),
            eviction_minimum_reclaim: joined(&self.eviction_minimum_reclaim),
            eviction_max_pod_grace_period: self.eviction_max_pod_grace_period.clone(),
            eviction_pressure_transition_period: self.eviction_pressure_transition_period.clone(),
            merge_default_eviction_settings: self.merge_default_eviction_settings.clone(),
            // the kubelet's `StringSlice`: an empty occurrence adds nothing
            enforce_node_allocatable: (!self.enforce_node_allocatable.is_empty()).then(|| {
                let items: Vec<&str> = self
                    .enforce_node_allocatable
                    .iter()
                    .map(String::as_str)
                    .filter(|v| !v.is_empty())
                    .collect();
                config::Given::Text(items.join(","))
            }),
        }
    }

    /// Reads the files, resolves and validates, and checks the API credentials: the settings,
    /// where they came from, and the API client configuration (`None`: static manifests only).
    /// Any problem is a [`ConfigError`] naming the field (the binary exits 64 with it).
    pub async fn load(&self) -> Result<(Loaded, Option<kube::Config>), ConfigError> {
        let mut loaded = config::load(self.raw(), self.config.as_deref())?;
        let kube = api_config(&loaded.settings).await?;
        if let Some(k) = &kube {
            let found = config::identity::from_credentials(&k.auth_info);
            config::node_name_check(loaded.settings.hostname_override.as_deref(), &found)?;
            loaded.settings.node_from_credentials = found;
        }
        Ok((loaded, kube))
    }
}

/// A map flag given `values` times, as the kubelet's map flags add each occurrence's pairs to
/// the first's: one text (the kubelet splits on `,` too).
fn joined(values: &[String]) -> Option<config::Given<config::SignalMap>> {
    (!values.is_empty()).then(|| config::Given::Text(values.join(",")))
}

/// The API client configuration, or `None` for static manifests only; read before anything
/// starts: an unreadable or invalid kubeconfig, or no credentials at all without a manifest
/// directory, is a configuration error naming `kubeconfig`.
pub async fn api_config(s: &Settings) -> Result<Option<kube::Config>, ConfigError> {
    use crate::api::ApiError;
    let why = match crate::api::client_config(s.kubeconfig.as_deref()).await {
        Ok(c) => return Ok(Some(c)),
        Err(ApiError::NoCredentials(_))
            if s.authority == crate::standby::AuthoritySetting::Standby =>
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
