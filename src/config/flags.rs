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
///
/// Each field's doc comment is its help: the first line is what `--help` shows (one line, for
/// a screen), the rest is added in the man page and `docs/configure.md`, with the topic, file
/// key and default [`FLAG_DOCS`] gives (no default is written here).
#[derive(clap::Args, Default)]
pub struct Flags {
    /// reaplet's config file, or the kubelet's.
    ///
    /// A YAML file: reaplet's own (kind ReapletConfiguration), or the kubelet's (kind
    /// KubeletConfiguration), read for the settings that mean the same.
    #[arg(long, env = "REAPLET_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,
    /// The kubelet's config file, below reaplet's own.
    ///
    /// For example /var/lib/kubelet/config.yaml: read for the settings that mean the same,
    /// never written.
    #[arg(long, env = "REAPLET_KUBELET_CONFIG", value_name = "FILE")]
    kubelet_config: Option<String>,
    /// kubeconfig for the API server.
    ///
    /// Without one, the in-cluster service account; with neither, reaplet runs the static pods
    /// of --pod-manifest-path alone (no API server).
    #[arg(long, env = "REAPLET_KUBECONFIG", value_name = "FILE")]
    kubeconfig: Option<String>,
    /// The node's name.
    ///
    /// Must agree with the node the credentials name (CN=system:node:<name>, or a pod-bound
    /// token's node).
    #[arg(long, env = "REAPLET_HOSTNAME_OVERRIDE", value_name = "NAME")]
    hostname_override: Option<String>,
    /// CRI endpoint of the container runtime.
    #[arg(long, env = "REAPLET_CONTAINER_RUNTIME_ENDPOINT", value_name = "URL")]
    container_runtime_endpoint: Option<String>,
    /// Deadline of every CRI call.
    ///
    /// StopContainer gets this plus the container's grace period.
    #[arg(long, env = "REAPLET_RUNTIME_REQUEST_TIMEOUT", value_name = "DURATION")]
    runtime_request_timeout: Option<String>,
    /// The kubelet's root directory.
    ///
    /// Where the pods' volume directories live, and reaplet's termination records.
    #[arg(long, env = "REAPLET_ROOT_DIR", value_name = "DIR")]
    root_dir: Option<String>,
    /// cgroupfs or systemd.
    ///
    /// Detected from the runtime's RuntimeConfig, then the existing pod cgroups, then the host.
    #[arg(long, env = "REAPLET_CGROUP_DRIVER", value_name = "DRIVER")]
    cgroup_driver: Option<String>,
    /// The kubelet's cgroup root.
    #[arg(long, env = "REAPLET_CGROUP_ROOT", value_name = "PATH")]
    cgroup_root: Option<String>,
    /// Pod cgroups below kubepods and its QoS classes, as the kubelet makes them.
    #[arg(long, env = "REAPLET_CGROUPS_PER_QOS", num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    cgroups_per_qos: Option<String>,
    /// Directory of static pod manifests reaplet runs.
    ///
    /// Never the kubelet's staticPodPath: see docs/behaviour.md, "Pod sources".
    #[arg(long, env = "REAPLET_POD_MANIFEST_PATH", value_name = "DIR")]
    pod_manifest_path: Option<String>,
    /// How often the manifest directory is read (at least 100ms).
    #[arg(long, env = "REAPLET_FILE_CHECK_FREQUENCY", value_name = "DURATION")]
    file_check_frequency: Option<String>,
    /// API status and delete requests per second.
    #[arg(long, env = "REAPLET_KUBE_API_QPS", value_name = "QPS")]
    kube_api_qps: Option<String>,
    /// API status and delete requests in a burst.
    #[arg(long, env = "REAPLET_KUBE_API_BURST", value_name = "N")]
    kube_api_burst: Option<String>,
    /// Events per second.
    #[arg(long, env = "REAPLET_EVENT_QPS", value_name = "QPS")]
    event_qps: Option<String>,
    /// Events in a burst.
    #[arg(long, env = "REAPLET_EVENT_BURST", value_name = "N")]
    event_burst: Option<String>,
    /// Status endpoint: /metrics, /healthz, /readyz, /pods.
    #[arg(long, env = "REAPLET_METRICS_BIND_ADDRESS", value_name = "ADDR")]
    metrics_bind_address: Option<String>,
    /// auto, text, json or journald.
    ///
    /// auto: journald under systemd, else text.
    #[arg(long, env = "REAPLET_LOG_FORMAT", value_name = "FORMAT")]
    log_format: Option<String>,
    /// How long a terminated pod waits for its volumes to be unmounted.
    ///
    /// Then it is reported (VolumesStillMounted) and skipped: never deleted while a volume is
    /// mounted, checked again on the retry backoff.
    #[arg(long, env = "REAPLET_VOLUME_UNMOUNT_TIMEOUT", value_name = "DURATION")]
    volume_unmount_timeout: Option<String>,
    /// Runtime relist period without container events (at least 100ms).
    ///
    /// Also the period while the runtime is stalled.
    #[arg(long, env = "REAPLET_RELIST_PERIOD", value_name = "DURATION")]
    relist_period: Option<String>,
    /// Runtime relist period while container events flow.
    ///
    /// The safety net beside the events; at least relistPeriod.
    #[arg(
        long,
        env = "REAPLET_RELIST_PERIOD_WITH_EVENTS",
        value_name = "DURATION"
    )]
    relist_period_with_events: Option<String>,
    /// Subscribe to container exits.
    ///
    /// CRI GetContainerEvents, else containerd's events service.
    #[arg(long, env = "REAPLET_CONTAINER_EVENTS", num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    container_events: Option<String>,
    /// primary, standby or auto.
    ///
    /// standby: a kubelet is the node's agent and reaplet takes over only when it is dead;
    /// auto: standby when a kubelet holds this node's Lease at start, else primary.
    #[arg(long, env = "REAPLET_AUTHORITY", value_name = "MODE")]
    authority: Option<String>,
    /// The kubelet's health endpoint, watched in standby (http:// only).
    ///
    /// The second signal of a takeover; wins over --healthz-port and --healthz-bind-address.
    #[arg(long, env = "REAPLET_KUBELET_HEALTHZ_URL", value_name = "URL")]
    kubelet_healthz_url: Option<String>,
    /// The kubelet's --healthz-port.
    ///
    /// Where standby probes the kubelet's /healthz; 0: the kubelet serves none, and the Lease
    /// alone decides.
    #[arg(long, env = "REAPLET_HEALTHZ_PORT", value_name = "PORT")]
    healthz_port: Option<String>,
    /// The kubelet's --healthz-bind-address.
    ///
    /// 0.0.0.0 or :: is probed on loopback.
    #[arg(long, env = "REAPLET_HEALTHZ_BIND_ADDRESS", value_name = "IP")]
    healthz_bind_address: Option<String>,
    /// Standby takes over after the Lease is unrenewed this long.
    ///
    /// And the kubelet's health endpoint fails; at least 20s (two of the kubelet's renewals).
    #[arg(long, env = "REAPLET_TAKEOVER_AFTER", value_name = "DURATION")]
    takeover_after: Option<String>,
    /// The NoExecute taint manager for this node.
    ///
    /// The controller manager's flag. On by default for a standalone node (primary with its
    /// own static pods), else off.
    #[arg(long, env = "REAPLET_ENABLE_TAINT_MANAGER", num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    enable_taint_manager: Option<String>,
    /// Evict pods whose required node affinity no longer matches.
    ///
    /// Through the Eviction API: pods whose nodeSelector or required node affinity no longer
    /// matches the node's labels.
    #[arg(long, env = "REAPLET_ENFORCE_NODE_AFFINITY", num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    enforce_node_affinity: Option<String>,
    /// Node affinity only in these namespaces (comma-separated).
    #[arg(long, env = "REAPLET_NODE_AFFINITY_NAMESPACES", value_name = "LIST")]
    node_affinity_namespaces: Option<String>,
    /// Node affinity only for pods matching this label selector.
    ///
    /// k=v, k!=v, k or !k, comma-separated.
    #[arg(long, env = "REAPLET_NODE_AFFINITY_SELECTOR", value_name = "SELECTOR")]
    node_affinity_selector: Option<String>,
    /// How long a node affinity mismatch lasts before the eviction.
    ///
    /// A label flapping back cancels it.
    #[arg(long, env = "REAPLET_NODE_AFFINITY_SETTLE", value_name = "DURATION")]
    node_affinity_settle: Option<String>,
    /// Eviction sources only log what they would evict.
    ///
    /// They count it in the metrics too, and change nothing.
    #[arg(long, env = "REAPLET_EVICTION_DRY_RUN", num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    eviction_dry_run: Option<String>,
    /// How long a node shutdown waits for its pods.
    ///
    /// Graceful node shutdown, the kubelet's shutdownGracePeriod; 0: off. Per-priority groups
    /// (shutdownGracePeriodByPodPriority) are set in the config file.
    #[arg(long, env = "REAPLET_SHUTDOWN_GRACE_PERIOD", value_name = "DURATION")]
    shutdown_grace_period: Option<String>,
    /// The part of the shutdown grace period kept for critical pods.
    ///
    /// Critical pods (priority at least 2000000000) end last.
    #[arg(
        long,
        env = "REAPLET_SHUTDOWN_GRACE_PERIOD_CRITICAL_PODS",
        value_name = "DURATION"
    )]
    shutdown_grace_period_critical_pods: Option<String>,
    /// OpenTelemetry traces over OTLP/gRPC to this collector.
    ///
    /// host:port or a URL; localhost:4317 when only the sampling rate is set.
    #[arg(long, env = "REAPLET_TRACING_ENDPOINT", value_name = "ENDPOINT")]
    tracing_endpoint: Option<String>,
    /// Terminations traced per million (0 to 1000000).
    ///
    /// 0 when only the endpoint is set.
    #[arg(
        long,
        env = "REAPLET_TRACING_SAMPLING_RATE_PER_MILLION",
        value_name = "N"
    )]
    tracing_sampling_rate_per_million: Option<String>,
    /// Finished terminations whose timelines are kept (at most 100000).
    ///
    /// For `reaplet pods --timeline`; every pod still terminating has one too.
    #[arg(long, env = "REAPLET_TERMINATION_TIMELINES", value_name = "N")]
    termination_timelines: Option<String>,
    /// Hard eviction thresholds, e.g. memory.available<100Mi.
    ///
    /// Comma-separated, the kubelet's syntax (e.g. memory.available<100Mi,pid.available<10%);
    /// repeated flags add up.
    #[arg(long, env = "REAPLET_EVICTION_HARD", value_name = "THRESHOLDS")]
    eviction_hard: Vec<String>,
    /// Soft eviction thresholds, e.g. memory.available<1.5Gi.
    ///
    /// Each with its grace period (--eviction-soft-grace-period).
    #[arg(long, env = "REAPLET_EVICTION_SOFT", value_name = "THRESHOLDS")]
    eviction_soft: Vec<String>,
    /// How long a soft threshold holds before an eviction.
    ///
    /// For example memory.available=1m30s.
    #[arg(
        long,
        env = "REAPLET_EVICTION_SOFT_GRACE_PERIOD",
        value_name = "PERIODS"
    )]
    eviction_soft_grace_period: Vec<String>,
    /// The least reclaimed once a threshold is met.
    ///
    /// For example memory.available=500Mi.
    #[arg(long, env = "REAPLET_EVICTION_MINIMUM_RECLAIM", value_name = "AMOUNTS")]
    eviction_minimum_reclaim: Vec<String>,
    /// The longest grace (seconds) of a pod evicted for a soft threshold.
    ///
    /// Negative: the pod's own.
    #[arg(
        long,
        env = "REAPLET_EVICTION_MAX_POD_GRACE_PERIOD",
        allow_hyphen_values = true,
        value_name = "SECONDS"
    )]
    eviction_max_pod_grace_period: Option<String>,
    /// How long a pressure condition outlasts its threshold.
    #[arg(
        long,
        env = "REAPLET_EVICTION_PRESSURE_TRANSITION_PERIOD",
        allow_hyphen_values = true,
        value_name = "DURATION"
    )]
    eviction_pressure_transition_period: Option<String>,
    /// A set evictionHard gains the default thresholds it lacks.
    #[arg(long, env = "REAPLET_MERGE_DEFAULT_EVICTION_SETTINGS", num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    merge_default_eviction_settings: Option<String>,
    /// The kubelet's node allocatable enforcement: pods, none, or a list.
    ///
    /// The kubelet's values: none, pods, system-reserved, kube-reserved and their
    /// -compressible forms. pods adds an allocatableMemory.available threshold beside each hard
    /// memory.available one; the others are the kubelet's to enforce and change nothing here.
    #[arg(long, env = "REAPLET_ENFORCE_NODE_ALLOCATABLE", value_name = "LIST")]
    enforce_node_allocatable: Vec<String>,
}

/// The topics the flags are listed under, in `--help`, the man page and `docs/configure.md`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Topic {
    Files,
    Runtime,
    Api,
    Standby,
    EvictionSources,
    NodePressure,
    Shutdown,
    Observability,
}

impl Topic {
    /// Every topic, in the order they are listed.
    pub const ALL: [Topic; 8] = [
        Topic::Files,
        Topic::Runtime,
        Topic::Api,
        Topic::Standby,
        Topic::EvictionSources,
        Topic::NodePressure,
        Topic::Shutdown,
        Topic::Observability,
    ];

    pub fn heading(self) -> &'static str {
        match self {
            Topic::Files => "Files, identity and the node",
            Topic::Runtime => "Runtime, cgroups and pods",
            Topic::Api => "The API server",
            Topic::Standby => "Standby beside the kubelet",
            Topic::EvictionSources => "Eviction sources",
            Topic::NodePressure => "Node-pressure eviction",
            Topic::Shutdown => "Graceful node shutdown",
            Topic::Observability => "Status endpoint, logs, timelines and traces",
        }
    }
}

/// What the reference says of one flag besides its help: the topic, the config file key, the
/// default, and whether `--help` lists it (the others are in the man page and the guide).
#[derive(Clone, Copy, Debug)]
pub struct FlagDoc {
    /// The long flag, without `--`.
    pub flag: &'static str,
    pub topic: Topic,
    /// The key in reaplet's config file (`""`: none); `tracing.endpoint` is `endpoint` below
    /// `tracing:`.
    pub key: &'static str,
    /// The default, in words where it is worked out (`""`: none).
    pub default: &'static str,
    pub on_screen: bool,
}

const fn doc(
    flag: &'static str,
    topic: Topic,
    key: &'static str,
    default: &'static str,
    on_screen: bool,
) -> FlagDoc {
    FlagDoc {
        flag,
        topic,
        key,
        default,
        on_screen,
    }
}

/// Every flag of `reaplet run` and `reaplet check`, once, in the order the reference lists them
/// (a test checks it against [`Flags`] and the config file's keys).
#[rustfmt::skip] // a table: one flag a line
pub const FLAG_DOCS: &[FlagDoc] = {
    use Topic::*;
    &[
        doc("config", Files, "", "", true),
        doc("kubelet-config", Files, "kubeletConfig", "", true),
        doc("kubeconfig", Files, "kubeconfig", "the in-cluster service account", true),
        doc("hostname-override", Files, "hostnameOverride", "the name the credentials carry, else the host name", true),
        doc("container-runtime-endpoint", Runtime, "containerRuntimeEndpoint", "unix:///run/containerd/containerd.sock", true),
        doc("runtime-request-timeout", Runtime, "runtimeRequestTimeout", "2m (at least 1s)", false),
        doc("root-dir", Runtime, "rootDir", "/var/lib/kubelet", true),
        doc("cgroup-driver", Runtime, "cgroupDriver", "detected from the runtime", true),
        doc("cgroup-root", Runtime, "cgroupRoot", "/", false),
        doc("cgroups-per-qos", Runtime, "cgroupsPerQOS", "true", false),
        doc("pod-manifest-path", Runtime, "podManifestPath", "", true),
        doc("file-check-frequency", Runtime, "fileCheckFrequency", "1s", false),
        doc("volume-unmount-timeout", Runtime, "volumeUnmountTimeout", "2m3s", false),
        doc("container-events", Runtime, "containerEvents", "true", false),
        doc("relist-period", Runtime, "relistPeriod", "1s", false),
        doc("relist-period-with-events", Runtime, "relistPeriodWithEvents", "10s", false),
        doc("kube-api-qps", Api, "kubeAPIQPS", "100", false),
        doc("kube-api-burst", Api, "kubeAPIBurst", "200", false),
        doc("event-qps", Api, "eventRecordQPS", "10", false),
        doc("event-burst", Api, "eventBurst", "50", false),
        doc("authority", Standby, "authority", "auto", true),
        doc("kubelet-healthz-url", Standby, "kubeletHealthzURL", "from --healthz-port and --healthz-bind-address", false),
        doc("healthz-port", Standby, "healthzPort", "the kubelet's config file, else 10248", false),
        doc("healthz-bind-address", Standby, "healthzBindAddress", "the kubelet's config file, else 127.0.0.1", false),
        doc("takeover-after", Standby, "takeoverAfter", "40s", true),
        doc("enable-taint-manager", EvictionSources, "enableTaintManager", "on for a standalone node, else off", true),
        doc("enforce-node-affinity", EvictionSources, "enforceNodeAffinity", "false", true),
        doc("node-affinity-namespaces", EvictionSources, "nodeAffinityNamespaces", "all namespaces", false),
        doc("node-affinity-selector", EvictionSources, "nodeAffinitySelector", "every pod", false),
        doc("node-affinity-settle", EvictionSources, "nodeAffinitySettle", "30s", false),
        doc("eviction-dry-run", EvictionSources, "evictionDryRun", "false", true),
        doc("eviction-hard", NodePressure, "evictionHard", "the kubelet's Linux defaults (memory.available<100Mi and the disk signals)", true),
        doc("eviction-soft", NodePressure, "evictionSoft", "no thresholds", false),
        doc("eviction-soft-grace-period", NodePressure, "evictionSoftGracePeriod", "no periods", false),
        doc("eviction-minimum-reclaim", NodePressure, "evictionMinimumReclaim", "nothing more", false),
        doc("eviction-max-pod-grace-period", NodePressure, "evictionMaxPodGracePeriod", "0", false),
        doc("eviction-pressure-transition-period", NodePressure, "evictionPressureTransitionPeriod", "5m", false),
        doc("merge-default-eviction-settings", NodePressure, "mergeDefaultEvictionSettings", "false", false),
        doc("enforce-node-allocatable", NodePressure, "enforceNodeAllocatable", "pods", false),
        doc("shutdown-grace-period", Shutdown, "shutdownGracePeriod", "0s (off)", true),
        doc("shutdown-grace-period-critical-pods", Shutdown, "shutdownGracePeriodCriticalPods", "0s", false),
        doc("metrics-bind-address", Observability, "metricsBindAddress", "127.0.0.1:10266", true),
        doc("log-format", Observability, "logFormat", "auto", true),
        doc("termination-timelines", Observability, "terminationTimelines", "100", false),
        doc("tracing-endpoint", Observability, "tracing.endpoint", "no traces", false),
        doc("tracing-sampling-rate-per-million", Observability, "tracing.samplingRatePerMillion", "0", false),
    ]
};

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
