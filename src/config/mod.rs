//! Configuration: the kubelet's flags and `KubeletConfiguration` file for the settings reaplet
//! shares with it (same names: flags in kebab-case, file keys in camelCase), plus reaplet's own
//! settings in a file of its own kind (`apiVersion: reaplet.io/v1alpha1`,
//! `kind: ReapletConfiguration`). Counterpart of the kubelet's `cmd/kubelet/app/options` and
//! `pkg/kubelet/apis/config` (loading, defaulting, validation).
//!
//! Invariants:
//! * precedence is flags > environment (`REAPLET_*`) > reaplet's file > the kubelet's file >
//!   defaults; the caller (the binary) merges flags and environment into one [`RawSettings`]
//!   layer, since only it reads argv and the environment; [`load`] reads the files;
//! * a file is reaplet's own kind (also when it has neither `apiVersion` nor `kind`, as before
//!   kinds existed) or an unmodified `KubeletConfiguration` ([`kubelet`]); any other kind is an
//!   error naming `kind`;
//! * everything is parsed and validated here, before anything starts; an invalid value is a
//!   [`ConfigError`] naming the field (file key, or the kubelet's field path such as
//!   `logging.format`) and why; the binary exits with code 64;
//! * unknown keys in reaplet's own file are errors; in the kubelet's file, the fields reaplet
//!   does not use are returned ([`KubeletSummary::ignored`]) for one info line;
//! * the node's name is the credentials' when they carry one ([`identity`]); a
//!   `hostnameOverride` that disagrees with it is an error naming both ([`node_name_check`]);
//! * `tracing` (the kubelet's `TracingConfiguration`: `endpoint`, `samplingRatePerMillion`) is
//!   a mapping in both files, as in the kubelet's; flags and environment give its two fields
//!   flat (`--tracing-endpoint`, `--tracing-sampling-rate-per-million`), and each field is
//!   layered on its own like every other setting. Neither field set anywhere: no tracing
//!   ([`Settings::tracing`] is `None`).
//! * node-pressure eviction's settings have the kubelet's names, flags and defaults, each map
//!   given whole by one layer, and are parsed and validated as the kubelet does at start
//!   ([`eviction`]; [`Settings::pressure`]).

pub mod eviction;
mod file;
pub mod flags;
pub mod healthz;
pub mod identity;
pub mod kubelet;
mod values;

use crate::cgroups::{CgroupDriver, CgroupNaming};
use crate::standby::AuthoritySetting;
pub use eviction::{Given, SignalMap};
pub(crate) use file::from_yaml;
use file::tracing_settings;
pub use file::{ConfigFile, FIELDS, TRACING_ENDPOINT, TRACING_SAMPLING_RATE};
pub use healthz::HealthzFrom;
pub use kubelet::{KubeletFile, PodPriorityGrace, ShutdownSettings};
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;
pub use values::parse_duration;
use values::{abs_path, boolean, duration, is_dns_subdomain, positive_f64, positive_u32};

/// reaplet's own file kind.
pub const REAPLET_API_VERSION: &str = "reaplet.io/v1alpha1";
pub const REAPLET_KIND: &str = "ReapletConfiguration";
/// The kubelet's file kind (`k8s.io/kubelet/config/v1beta1`).
pub const KUBELET_API_VERSION: &str = "kubelet.config.k8s.io/v1beta1";
pub const KUBELET_KIND: &str = "KubeletConfiguration";

/// An invalid setting: `field` is the file key (the flag is its kebab-case form), `config` for
/// a file that cannot be read or parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid configuration: {field}: {why}")]
pub struct ConfigError {
    pub field: &'static str,
    pub why: String,
}

fn err(field: &'static str, why: impl Into<String>) -> ConfigError {
    ConfigError {
        field,
        why: why.into(),
    }
}

/// One layer of unparsed settings (flags+environment, reaplet's file, or what the kubelet's
/// file says about the same settings).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RawSettings {
    pub kubeconfig: Option<String>,
    /// The kubelet's own config file, read for the settings that mean the same.
    pub kubelet_config: Option<String>,
    pub hostname_override: Option<String>,
    pub container_runtime_endpoint: Option<String>,
    pub runtime_request_timeout: Option<String>,
    pub root_dir: Option<String>,
    pub cgroup_driver: Option<String>,
    pub cgroup_root: Option<String>,
    #[serde(rename = "cgroupsPerQOS")]
    pub cgroups_per_qos: Option<String>,
    pub pod_manifest_path: Option<String>,
    pub file_check_frequency: Option<String>,
    #[serde(rename = "kubeAPIQPS")]
    pub kube_api_qps: Option<String>,
    #[serde(rename = "kubeAPIBurst")]
    pub kube_api_burst: Option<String>,
    #[serde(rename = "eventRecordQPS")]
    pub event_qps: Option<String>,
    pub event_burst: Option<String>,
    pub metrics_bind_address: Option<String>,
    pub log_format: Option<String>,
    pub volume_unmount_timeout: Option<String>,
    pub relist_period: Option<String>,
    pub relist_period_with_events: Option<String>,
    pub container_events: Option<String>,
    pub authority: Option<String>,
    #[serde(rename = "kubeletHealthzURL")]
    pub kubelet_healthz_url: Option<String>,
    /// The kubelet's `healthzPort` and `healthzBindAddress`: where its health endpoint is
    /// (`kubeletHealthzURL` wins over them; see [`healthz`]).
    pub healthz_port: Option<String>,
    pub healthz_bind_address: Option<String>,
    pub takeover_after: Option<String>,
    pub enable_taint_manager: Option<String>,
    pub enforce_node_affinity: Option<String>,
    pub node_affinity_namespaces: Option<String>,
    pub node_affinity_selector: Option<String>,
    pub node_affinity_settle: Option<String>,
    pub eviction_dry_run: Option<String>,
    /// Graceful node shutdown, with the kubelet's names and meaning; the list is kept as its
    /// JSON text in this layer of strings.
    pub shutdown_grace_period: Option<String>,
    pub shutdown_grace_period_critical_pods: Option<String>,
    pub shutdown_grace_period_by_pod_priority: Option<String>,
    /// The kubelet's `tracing.endpoint` (in a file: `tracing: {endpoint: ...}`, never a
    /// top-level key).
    #[serde(skip)]
    pub tracing_endpoint: Option<String>,
    /// The kubelet's `tracing.samplingRatePerMillion` (in a file, under `tracing`).
    #[serde(skip)]
    pub tracing_sampling_rate_per_million: Option<String>,
    /// Finished terminations whose timelines are kept (reaplet's own; no kubelet field).
    pub termination_timelines: Option<String>,
    /// Node-pressure eviction, with the kubelet's names ([`eviction`]): the maps and the list
    /// as a flag's text or a file's own mapping (set apart from the strings when a file is
    /// read).
    #[serde(skip)]
    pub eviction_hard: Option<Given<SignalMap>>,
    #[serde(skip)]
    pub eviction_soft: Option<Given<SignalMap>>,
    #[serde(skip)]
    pub eviction_soft_grace_period: Option<Given<SignalMap>>,
    #[serde(skip)]
    pub eviction_minimum_reclaim: Option<Given<SignalMap>>,
    pub eviction_max_pod_grace_period: Option<String>,
    pub eviction_pressure_transition_period: Option<String>,
    pub merge_default_eviction_settings: Option<String>,
    #[serde(skip)]
    pub enforce_node_allocatable: Option<Given<Vec<String>>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable, with colours on a terminal.
    Text,
    Json,
    /// Plain lines with syslog level prefixes, no timestamps (journald adds its own).
    Journald,
    /// journald when started by systemd with the journal on stderr, else text.
    Auto,
}

/// Resolved and validated settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub kubeconfig: Option<PathBuf>,
    /// The kubelet's config file the kubelet-shared settings were read from, if any.
    pub kubelet_config: Option<PathBuf>,
    /// That file's `staticPodPath` (absolute): the kubelet's manifest directory, never
    /// reaplet's own; reaplet compares its `podManifestPath` with it.
    pub kubelet_static_pod_path: Option<PathBuf>,
    /// The node name (already lower-cased); `None`: the credentials' name, else the host name
    /// ([`Settings::node_from_credentials`]).
    pub hostname_override: Option<String>,
    /// What the API credentials say of the node's name ([`identity`]); set by
    /// [`flags::Flags::load`] with the client configuration (empty without one). It wins over
    /// the host name, and an override that disagrees is a [`ConfigError`].
    pub node_from_credentials: identity::Found,
    pub container_runtime_endpoint: String,
    pub runtime_request_timeout: Duration,
    pub root_dir: PathBuf,
    /// `None`: detect from the runtime, then the host.
    pub cgroup_driver: Option<CgroupDriver>,
    pub cgroup_root: String,
    /// The kubelet's `cgroupsPerQOS`: pod cgroups below `kubepods` and its QoS classes (the
    /// default); `false`: the kubelet makes no pod cgroups at all.
    pub cgroups_per_qos: bool,
    pub pod_manifest_path: Option<PathBuf>,
    pub file_check_frequency: Duration,
    pub kube_api_qps: f64,
    pub kube_api_burst: u32,
    pub event_qps: f64,
    pub event_burst: u32,
    pub metrics_bind_address: SocketAddr,
    pub log_format: LogFormat,
    pub volume_unmount_timeout: Duration,
    /// The runtime relist period without container events (the kubelet's PLEG: 1 s).
    pub relist_period: Duration,
    /// The relist period while container events flow: the safety net behind them.
    pub relist_period_with_events: Duration,
    /// Subscribe to container exits (CRI `GetContainerEvents`, else containerd's events).
    pub container_events: bool,
    /// Graceful node shutdown (the kubelet's `shutdownGracePeriod*`, from reaplet's settings
    /// or the kubelet's file).
    pub shutdown: ShutdownSettings,
    /// Primary, standby beside a kubelet, or auto ([`crate::standby`]).
    pub authority: AuthoritySetting,
    /// The kubelet's health endpoint (`http://` only); `None`: the kubelet serves none
    /// (`healthzPort` 0), the Lease alone decides.
    pub kubelet_healthz_url: Option<String>,
    /// Where that came from (for the start-up line).
    pub kubelet_healthz_from: HealthzFrom,
    /// How long the node Lease must go unrenewed, with the endpoint failing, for a takeover.
    pub takeover_after: Duration,
    /// The NoExecute taint manager (the controller manager's flag); `None`: decided by the
    /// node's kind (on for a standalone node: primary, running its own static pods).
    pub enable_taint_manager: Option<bool>,
    /// Evict pods whose required node affinity no longer matches the node's labels.
    pub enforce_node_affinity: bool,
    /// Only in these namespaces (empty: all).
    pub node_affinity_namespaces: Vec<String>,
    /// Only pods matching this label selector.
    pub node_affinity_selector: crate::eviction::selector::LabelSelector,
    /// How long a mismatch must last before the eviction.
    pub node_affinity_settle: Duration,
    /// The eviction sources decide and report only.
    pub eviction_dry_run: bool,
    /// OpenTelemetry trace export (the kubelet's `tracing`); `None`: none, nothing started.
    pub tracing: Option<crate::otel::TracingConfig>,
    /// Finished terminations whose timelines the agent keeps (`reaplet pods --timeline`);
    /// every pod still terminating has one as well.
    pub termination_timelines: usize,
    /// Node-pressure eviction (the kubelet's `evictionHard`, `evictionSoft`, ...): the
    /// thresholds parsed, `evictionMaxPodGracePeriod`, `evictionPressureTransitionPeriod`.
    pub pressure: crate::pressure::manager::PressureSettings,
}
impl Settings {
    /// Whether the NoExecute taint manager runs: as set, else on for a standalone node (primary
    /// with static pods: no controller manager does it); on a cluster node the controller
    /// manager does. `reaplet run` and `reaplet check` both ask this.
    pub fn taint_manager(&self) -> bool {
        self.enable_taint_manager.unwrap_or(
            self.authority == AuthoritySetting::Primary && self.pod_manifest_path.is_some(),
        )
    }
}

/// The default metrics and status address (loopback only).
/// 10266: no Kubernetes component's default (the kubelet's are 10248, 10250 and 10255,
/// kube-proxy's 10249 and 10256, the controller manager's 10257, the cloud controller
/// manager's 10258 and 10260, the scheduler's 10259).
pub const DEFAULT_METRICS_ADDRESS: &str = "127.0.0.1:10266";

/// Resolves one merged layer (flags > environment > file, see [`RawSettings::over`]) into
/// validated settings.
pub fn resolve(raw: RawSettings) -> Result<Settings, ConfigError> {
    resolve_over(raw, ShutdownSettings::default(), None)
}

/// [`resolve`], with each shutdown field over `lower`'s (from the kubelet's file: `kubelet`
/// is its path and `upper`, reaplet's own settings above it), checked once merged; an error
/// names the kubelet's file only when it alone set the fields at fault (shutdown's, and
/// eviction's: `raw` has the kubelet's eviction fields below `upper`'s).
fn resolve_over(
    raw: RawSettings,
    lower: ShutdownSettings,
    kubelet: Option<(&Path, &RawSettings)>,
) -> Result<Settings, ConfigError> {
    let layer = kubelet::ShutdownLayer::from_raw(&raw)?;
    let named = kubelet.map(|(path, _)| path).filter(|_| layer.is_empty());
    let shutdown = layer.over(lower).validated(named)?;
    let pressure = eviction::resolve(&raw, kubelet)?;
    let kubeconfig = raw
        .kubeconfig
        .map(|v| abs_path("kubeconfig", &v))
        .transpose()?;
    let kubelet_config = raw
        .kubelet_config
        .map(|v| abs_path("kubeletConfig", &v))
        .transpose()?;
    let hostname_override = match raw.hostname_override {
        Some(h) => {
            let h = h.trim().to_lowercase();
            if !is_dns_subdomain(&h) {
                return Err(err(
                    "hostnameOverride",
                    format!("{h:?} is not a valid node name (DNS subdomain)"),
                ));
            }
            Some(h)
        }
        None => None,
    };
    let endpoint = raw
        .container_runtime_endpoint
        .unwrap_or_else(|| "unix:///run/containerd/containerd.sock".into());
    crate::cri::socket_path(&endpoint)
        .map_err(|e| err("containerRuntimeEndpoint", e.to_string()))?;
    let runtime_request_timeout = duration(
        "runtimeRequestTimeout",
        raw.runtime_request_timeout,
        Duration::from_secs(120),
        Duration::from_secs(1),
    )?;
    let root_dir = abs_path(
        "rootDir",
        raw.root_dir.as_deref().unwrap_or("/var/lib/kubelet"),
    )?;
    let cgroup_driver = match raw.cgroup_driver.as_deref().map(str::trim) {
        None | Some("") => None,
        Some("cgroupfs") => Some(CgroupDriver::Cgroupfs),
        Some("systemd") => Some(CgroupDriver::Systemd),
        Some(o) => {
            return Err(err(
                "cgroupDriver",
                format!("{o:?}: must be cgroupfs or systemd"),
            ));
        }
    };
    let cgroup_root = raw.cgroup_root.unwrap_or_else(|| "/".into());
    CgroupNaming::new(
        cgroup_driver.unwrap_or(CgroupDriver::Cgroupfs),
        &cgroup_root,
    )
    .map_err(|e| err("cgroupRoot", e.to_string()))?;
    let cgroups_per_qos = boolean("cgroupsPerQOS", raw.cgroups_per_qos, true)?;
    let relist_period = duration(
        "relistPeriod",
        raw.relist_period,
        Duration::from_secs(1),
        Duration::from_millis(100),
    )?;
    let relist_period_with_events = duration(
        "relistPeriodWithEvents",
        raw.relist_period_with_events,
        Duration::from_secs(10).max(relist_period),
        relist_period,
    )?;
    let pod_manifest_path = raw
        .pod_manifest_path
        .map(|v| abs_path("podManifestPath", &v))
        .transpose()?;
    let file_check_frequency = duration(
        "fileCheckFrequency",
        raw.file_check_frequency,
        Duration::from_secs(1),
        Duration::from_millis(100),
    )?;
    let metrics = raw
        .metrics_bind_address
        .unwrap_or_else(|| DEFAULT_METRICS_ADDRESS.into());
    let metrics_bind_address: SocketAddr = metrics.trim().parse().map_err(|_| {
        err(
            "metricsBindAddress",
            format!("{metrics:?} is not an address like {DEFAULT_METRICS_ADDRESS}"),
        )
    })?;
    let log_format = match raw.log_format.as_deref().map(str::trim) {
        None | Some("auto") => LogFormat::Auto,
        Some("text") => LogFormat::Text,
        Some("json") => LogFormat::Json,
        Some("journald") => LogFormat::Journald,
        Some(o) => {
            return Err(err(
                "logFormat",
                format!("{o:?}: must be auto, text, json or journald"),
            ));
        }
    };
    let authority = match raw.authority.as_deref() {
        None => AuthoritySetting::Auto,
        Some(v) => AuthoritySetting::parse(v).ok_or_else(|| {
            err(
                "authority",
                format!("{v:?}: must be primary, standby or auto"),
            )
        })?,
    };
    let (kubelet_healthz_url, kubelet_healthz_from) = healthz::resolve(
        raw.kubelet_healthz_url,
        raw.healthz_port,
        raw.healthz_bind_address,
    )?;
    Ok(Settings {
        kubeconfig,
        kubelet_config,
        kubelet_static_pod_path: None,
        hostname_override,
        node_from_credentials: identity::Found::default(),
        container_runtime_endpoint: endpoint,
        runtime_request_timeout,
        root_dir,
        cgroup_driver,
        cgroup_root,
        cgroups_per_qos,
        pod_manifest_path,
        file_check_frequency,
        kube_api_qps: positive_f64("kubeAPIQPS", raw.kube_api_qps, 100.0)?,
        kube_api_burst: positive_u32("kubeAPIBurst", raw.kube_api_burst, 200)?,
        event_qps: positive_f64("eventRecordQPS", raw.event_qps, 10.0)?,
        event_burst: positive_u32("eventBurst", raw.event_burst, 50)?,
        termination_timelines: values::at_most_u32(
            "terminationTimelines",
            raw.termination_timelines,
            crate::timeline::DEFAULT_KEEP as u32,
            100_000,
        )? as usize,
        metrics_bind_address,
        log_format,
        volume_unmount_timeout: duration(
            "volumeUnmountTimeout",
            raw.volume_unmount_timeout,
            Duration::from_secs(123),
            Duration::from_secs(1),
        )?,
        relist_period,
        relist_period_with_events,
        container_events: boolean("containerEvents", raw.container_events, true)?,
        shutdown,
        authority,
        kubelet_healthz_url,
        kubelet_healthz_from,
        takeover_after: duration(
            "takeoverAfter",
            raw.takeover_after,
            crate::standby::DEFAULT_TAKEOVER_AFTER,
            // two of the kubelet's 10 s renewals: less takes a live kubelet for a dead one
            Duration::from_secs(20),
        )?,
        enable_taint_manager: raw
            .enable_taint_manager
            .clone()
            .map(|v| boolean("enableTaintManager", Some(v), false))
            .transpose()?,
        enforce_node_affinity: boolean("enforceNodeAffinity", raw.enforce_node_affinity, false)?,
        node_affinity_namespaces: raw
            .node_affinity_namespaces
            .as_deref()
            .map(|v| {
                v.split(',')
                    .map(str::trim)
                    .filter(|n| !n.is_empty())
                    .map(|n| {
                        let ok = n.len() <= 63
                            && n.chars()
                                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
                        if ok {
                            Ok(n.to_owned())
                        } else {
                            Err(err(
                                "nodeAffinityNamespaces",
                                format!("{n:?} is not a namespace name"),
                            ))
                        }
                    })
                    .collect::<Result<Vec<_>, _>>()
            })
            .transpose()?
            .unwrap_or_default(),
        node_affinity_selector: crate::eviction::selector::LabelSelector::parse(
            raw.node_affinity_selector.as_deref().unwrap_or(""),
        )
        .map_err(|e| err("nodeAffinitySelector", e.to_string()))?,
        node_affinity_settle: duration(
            "nodeAffinitySettle",
            raw.node_affinity_settle,
            crate::eviction::DEFAULT_SETTLE,
            Duration::ZERO,
        )?,
        eviction_dry_run: boolean("evictionDryRun", raw.eviction_dry_run, false)?,
        tracing: tracing_settings(raw.tracing_endpoint, raw.tracing_sampling_rate_per_million)?,
        pressure,
    })
}

/// The credentials' node name (`found`, from [`identity::from_credentials`]) against
/// `hostnameOverride`: they must agree when both are given (a kubelet registered under one
/// name, reaplet acting for another, would take the kubelet's pods for orphans or look for a
/// Lease nobody renews).
pub fn node_name_check(
    hostname_override: Option<&str>,
    found: &identity::Found,
) -> Result<(), ConfigError> {
    match (hostname_override, &found.name) {
        (Some(o), Some(c)) if o != c.name => Err(err(
            "hostnameOverride",
            format!(
                "{o:?} (from --hostname-override or the config file) is not {:?}, the node's name \
                 in the API credentials ({c}, where the API server takes the node's identity \
                 from): give that name, or leave hostnameOverride out",
                c.name
            ),
        )),
        _ => Ok(()),
    }
}

/// What was read from the kubelet's file, for the start-up log line.
#[derive(Debug, Clone, PartialEq)]
pub struct KubeletSummary {
    pub path: PathBuf,
    /// The kubelet fields reaplet honoured (present in the file with a non-default value).
    pub used: Vec<&'static str>,
    /// The fields present that reaplet does not use (nested ones as `logging.verbosity`).
    pub ignored: Vec<String>,
    /// The kubelet's `staticPodPath`: the kubelet's static pods, never reaplet's to run.
    pub static_pod_path: Option<PathBuf>,
}

/// Validated settings and where the kubelet-shared ones came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Loaded {
    pub settings: Settings,
    pub kubelet: Option<KubeletSummary>,
}

/// Reads the files and resolves every layer: `flags_env` (flags over environment) > the
/// `config` file (reaplet's own kind) > the kubelet's file > defaults.
///
/// The kubelet's file is `config` itself when that is a `KubeletConfiguration`, else the
/// `kubeletConfig` setting (flag `--kubelet-config`, `REAPLET_KUBELET_CONFIG`, or the key in
/// reaplet's file); naming one both ways is an error naming `kubeletConfig`.
pub fn load(flags_env: RawSettings, config: Option<&Path>) -> Result<Loaded, ConfigError> {
    let (own, mut kubelet) = match config {
        None => (RawSettings::default(), None),
        Some(path) => match ConfigFile::read(path)? {
            ConfigFile::Reaplet(r) => (r, None),
            ConfigFile::Kubelet(k) => (RawSettings::default(), Some((path.to_path_buf(), k))),
        },
    };
    let upper = flags_env.over(own);
    if let Some(named) = &upper.kubelet_config {
        if let Some((path, _)) = &kubelet {
            return Err(err(
                "kubeletConfig",
                format!(
                    "{named:?} given, but --config {} is itself a {KUBELET_KIND}: give reaplet's \
                     own file as --config, or leave kubeletConfig out",
                    path.display()
                ),
            ));
        }
        let path = abs_path("kubeletConfig", named)?;
        match ConfigFile::read_named(&path, "kubeletConfig")? {
            ConfigFile::Kubelet(k) => kubelet = Some((path, k)),
            ConfigFile::Reaplet(_) => {
                return Err(err(
                    "kind",
                    format!(
                        "{}: kubeletConfig names a file that is not a {KUBELET_KIND}",
                        path.display()
                    ),
                ));
            }
        }
    }
    let Some((path, file)) = kubelet else {
        return Ok(Loaded {
            settings: resolve(upper)?,
            kubelet: None,
        });
    };
    // the kubelet's values alone first, so an error names the kubelet's field and file
    file.validate(&upper, &path)?;
    let own_healthz = upper.healthz_port.is_some() || upper.healthz_bind_address.is_some();
    let mut settings = resolve_over(
        upper.clone().over(file.raw.clone()),
        file.shutdown.clone(),
        Some((&path, &upper)),
    )?;
    settings.kubelet_config = Some(path.clone());
    settings.kubelet_static_pod_path = file.static_pod_path.clone();
    // the kubelet's fields, neither given by reaplet's settings: from the kubelet's file
    if settings.kubelet_healthz_from == HealthzFrom::Settings && !own_healthz {
        settings.kubelet_healthz_from = HealthzFrom::KubeletConfig;
    }
    Ok(Loaded {
        settings,
        kubelet: Some(KubeletSummary {
            path,
            used: file.used.clone(),
            ignored: file.ignored.clone(),
            static_pod_path: file.static_pod_path.clone(),
        }),
    })
}

#[cfg(test)]
mod tests;
