//! The kubelet's own config file (`apiVersion: kubelet.config.k8s.io/v1beta1`,
//! `kind: KubeletConfiguration`, `k8s.io/kubelet/config/v1beta1` types), read unmodified for
//! the settings that mean the same in reaplet. Counterpart of the kubelet's
//! `kubeletconfig/configfiles` loader, its `SetDefaults_KubeletConfiguration` and
//! `ValidateKubeletConfiguration` for those fields.
//!
//! Invariants:
//! * `staticPodPath` is read as the **kubelet's** manifest directory, never as reaplet's own
//!   `podManifestPath`: reading the kubelet's directory makes reaplet judge every static pod
//!   against it (a static pod with no manifest is an orphan), which beside a live kubelet
//!   would race its static pod updates (an upgraded control-plane manifest runs under a new
//!   UID while the old pod still runs) and could stop the control plane. It is reported as
//!   [`KubeletFile::static_pod_path`] (compared with reaplet's own directory: see
//!   [`crate::workers::StaticPods`]); reaplet runs a manifest directory only when its own file
//!   or flag names one;
//! * only the fields in [`HONOURED`] are read; every other field present is listed in
//!   [`KubeletFile::ignored`] (nested ones as `logging.verbosity`), never an error, so the file
//!   of any kubelet version loads;
//! * a zero value (`0s`, `""`, `0`), as `kubeadm` writes for every field it leaves to the
//!   kubelet's defaults, means "not set": reaplet's own default applies; except `healthzPort`,
//!   a pointer in the kubelet's type (absent is its default 10248, `0` is "no health
//!   endpoint": see [`super::healthz`]);
//! * the honoured fields are type-checked as the kubelet decodes them (durations are Go
//!   duration strings, `cgroupsPerQOS` a boolean, the QPS and burst fields numbers) and
//!   validated as the kubelet validates them; every error names the kubelet's field path and the
//!   file;
//! * node-pressure eviction's fields are read with the kubelet's types ([`super::eviction`]:
//!   maps of strings, `evictionHard: {}` kept as no hard threshold) and checked once merged with
//!   reaplet's settings, naming the file when it alone is at fault; `kubeReserved` and
//!   `systemReserved` stay ignored (reaplet reads the pods cgroup's limit, which the kubelet
//!   set from them, from the kernel).

use super::{ConfigError, RawSettings, err, parse_duration};
use serde_json::{Map, Value};
use std::path::Path;
use std::time::Duration;

/// The kubelet fields reaplet reads (the top-level keys; of `logging` only `format`; both of
/// `tracing`'s).
pub const HONOURED: &[&str] = &[
    "staticPodPath",
    "containerRuntimeEndpoint",
    "runtimeRequestTimeout",
    "cgroupDriver",
    "cgroupRoot",
    "cgroupsPerQOS",
    "fileCheckFrequency",
    "kubeAPIQPS",
    "kubeAPIBurst",
    "eventRecordQPS",
    "eventBurst",
    "logging.format",
    "shutdownGracePeriod",
    "shutdownGracePeriodCriticalPods",
    "shutdownGracePeriodByPodPriority",
    "tracing.endpoint",
    "tracing.samplingRatePerMillion",
    "healthzPort",
    "healthzBindAddress",
    "evictionHard",
    "evictionSoft",
    "evictionSoftGracePeriod",
    "evictionMinimumReclaim",
    "evictionMaxPodGracePeriod",
    "evictionPressureTransitionPeriod",
    "mergeDefaultEvictionSettings",
    "enforceNodeAllocatable",
];

/// One `shutdownGracePeriodByPodPriority` entry: pods of at least `priority` (and below the
/// next entry's) get `grace` to stop on node shutdown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodPriorityGrace {
    pub priority: i32,
    pub grace: Duration,
}

/// Graceful node shutdown as the kubelet's file sets it (all zero: disabled).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShutdownSettings {
    pub grace_period: Duration,
    pub grace_period_critical_pods: Duration,
    /// Sorted by priority, lowest first; exclusive with the two periods above.
    pub by_pod_priority: Vec<PodPriorityGrace>,
}

impl ShutdownSettings {
    /// Checks the fields as a whole (`path`: the kubelet's file they came from, if any).
    pub fn validated(self, path: Option<&Path>) -> Result<Self, ConfigError> {
        let why = |field, msg: String| match path {
            Some(p) => at(field, p, msg),
            None => err(field, msg),
        };
        if self.grace_period_critical_pods > self.grace_period {
            return Err(why(
                "shutdownGracePeriodCriticalPods",
                format!(
                    "{:?} must not be longer than shutdownGracePeriod ({:?})",
                    self.grace_period_critical_pods, self.grace_period
                ),
            ));
        }
        if !self.by_pod_priority.is_empty() && !self.grace_period.is_zero() {
            return Err(why(
                BY_POD_PRIORITY,
                "cannot be given together with shutdownGracePeriod".into(),
            ));
        }
        Ok(self)
    }
}

/// The shutdown fields as reaplet's own settings give them (flags, environment, its file).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShutdownLayer {
    pub grace_period: Option<Duration>,
    pub grace_period_critical_pods: Option<Duration>,
    pub by_pod_priority: Option<Vec<PodPriorityGrace>>,
}

impl ShutdownLayer {
    /// Parses the three fields of a merged layer of reaplet's settings.
    pub fn from_raw(raw: &RawSettings) -> Result<Self, ConfigError> {
        const OURS: &str = "reaplet's settings";
        let period = |field: &'static str, v: &Option<String>| {
            v.as_ref()
                .map(|s| shutdown_period(field, &Value::String(s.clone()), Path::new(OURS)))
                .transpose()
        };
        let by_pod_priority = match &raw.shutdown_grace_period_by_pod_priority {
            None => None,
            Some(text) => {
                let v: Value = serde_json::from_str(text).map_err(|_| {
                    err(
                        BY_POD_PRIORITY,
                        format!("{text:?} must be a list of mappings"),
                    )
                })?;
                Some(by_pod_priority(&v, Path::new(OURS))?)
            }
        };
        Ok(Self {
            grace_period: period("shutdownGracePeriod", &raw.shutdown_grace_period)?,
            grace_period_critical_pods: period(
                "shutdownGracePeriodCriticalPods",
                &raw.shutdown_grace_period_critical_pods,
            )?,
            by_pod_priority,
        })
    }

    /// Whether reaplet's settings give any of the fields.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// Each field from this layer when it sets it, else from `lower` (the kubelet's file), as
    /// the kubelet's own flags override its file field by field; check the result as a whole.
    pub fn over(self, lower: ShutdownSettings) -> ShutdownSettings {
        ShutdownSettings {
            grace_period: self.grace_period.unwrap_or(lower.grace_period),
            grace_period_critical_pods: self
                .grace_period_critical_pods
                .unwrap_or(lower.grace_period_critical_pods),
            by_pod_priority: self.by_pod_priority.unwrap_or(lower.by_pod_priority),
        }
    }
}

/// What a `KubeletConfiguration` file says about reaplet's settings.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KubeletFile {
    /// The shared settings, as one layer below reaplet's own file.
    pub raw: RawSettings,
    pub shutdown: ShutdownSettings,
    /// The kubelet's `staticPodPath` (made absolute): its static pods, never reaplet's.
    pub static_pod_path: Option<std::path::PathBuf>,
    /// The honoured fields that set something (not absent, not a zero value).
    pub used: Vec<&'static str>,
    /// Every other field present, sorted.
    pub ignored: Vec<String>,
}

/// `why`, saying which file.
pub(super) fn at(field: &'static str, path: &Path, why: impl std::fmt::Display) -> ConfigError {
    err(field, format!("{why} (in {})", path.display()))
}

/// A string field; `""` is unset.
fn string(field: &'static str, v: &Value, path: &Path) -> Result<Option<String>, ConfigError> {
    match v {
        Value::Null => Ok(None),
        Value::String(s) if s.is_empty() => Ok(None),
        Value::String(s) => Ok(Some(s.clone())),
        o => Err(at(field, path, format!("{o} must be a string"))),
    }
}

/// A non-negative number; `0` is unset (the kubelet's default applies there too).
fn number(field: &'static str, v: &Value, path: &Path) -> Result<Option<String>, ConfigError> {
    match v {
        Value::Null => Ok(None),
        Value::Number(n) => match n.as_f64() {
            Some(x) if x < 0.0 => Err(at(field, path, format!("{n} must not be negative"))),
            Some(0.0) => Ok(None),
            _ => Ok(Some(n.to_string())),
        },
        o => Err(at(field, path, format!("{o} must be a number"))),
    }
}

/// A whole number kept as it is, `0` included (`healthzPort`: 0 is the kubelet's "off");
/// absent or `null` is unset. Range checks are the setting's ([`super::healthz`]).
fn whole(field: &'static str, v: &Value, path: &Path) -> Result<Option<String>, ConfigError> {
    match v {
        Value::Null => Ok(None),
        Value::Number(n) if n.is_i64() || n.is_u64() => Ok(Some(n.to_string())),
        o => Err(at(field, path, format!("{o} must be a whole number"))),
    }
}

/// A Go duration string (`metav1.Duration`); negative durations are errors.
fn go_duration(field: &'static str, v: &Value, path: &Path) -> Result<Duration, ConfigError> {
    match v {
        Value::Null => Ok(Duration::ZERO),
        Value::String(s) if s.trim_start().starts_with('-') => {
            Err(at(field, path, format!("{s:?} must not be negative")))
        }
        Value::String(s) => parse_duration(s).map_err(|e| at(field, path, e)),
        o => Err(at(
            field,
            path,
            format!("{o} must be a duration string like \"30s\""),
        )),
    }
}

/// A duration reaplet also takes as a flag: `0s` is unset.
fn duration_setting(
    field: &'static str,
    v: &Value,
    path: &Path,
) -> Result<Option<String>, ConfigError> {
    let d = go_duration(field, v, path)?;
    Ok((!d.is_zero()).then(|| format!("{}ms", d.as_millis())))
}

/// A boolean (`cgroupsPerQOS`), kept as its flag's text.
fn boolean(field: &'static str, v: &Value, path: &Path) -> Result<Option<String>, ConfigError> {
    match v {
        Value::Null => Ok(None),
        Value::Bool(b) => Ok(Some(b.to_string())),
        o => Err(at(field, path, format!("{o} must be true or false"))),
    }
}

/// How a kubelet field's value is read into reaplet's setting of the same meaning.
type Read = fn(&'static str, &Value, &Path) -> Result<Option<String>, ConfigError>;

/// Which of reaplet's settings a kubelet field sets.
type Setting = fn(&mut RawSettings) -> &mut Option<String>;

/// The kubelet fields that are one of reaplet's settings as they are: the key, how it is read,
/// and the setting it sets (in use when it sets something).
const SHARED: &[(&str, Read, Setting)] = &[
    ("containerRuntimeEndpoint", string, |r| {
        &mut r.container_runtime_endpoint
    }),
    ("runtimeRequestTimeout", duration_setting, |r| {
        &mut r.runtime_request_timeout
    }),
    ("cgroupDriver", string, |r| &mut r.cgroup_driver),
    ("cgroupRoot", string, |r| &mut r.cgroup_root),
    ("cgroupsPerQOS", boolean, |r| &mut r.cgroups_per_qos),
    ("fileCheckFrequency", duration_setting, |r| {
        &mut r.file_check_frequency
    }),
    ("kubeAPIQPS", number, |r| &mut r.kube_api_qps),
    ("kubeAPIBurst", number, |r| &mut r.kube_api_burst),
    ("eventRecordQPS", number, |r| &mut r.event_qps),
    ("eventBurst", number, |r| &mut r.event_burst),
    ("healthzPort", whole, |r| &mut r.healthz_port),
    ("healthzBindAddress", string, |r| {
        &mut r.healthz_bind_address
    }),
];

/// The kubelet's shutdown periods: zero, or at least a second.
fn shutdown_period(field: &'static str, v: &Value, path: &Path) -> Result<Duration, ConfigError> {
    let d = go_duration(field, v, path)?;
    if !d.is_zero() && d < Duration::from_secs(1) {
        return Err(at(
            field,
            path,
            format!("{d:?}: must be zero or at least 1s"),
        ));
    }
    Ok(d)
}

/// The one list-valued shutdown field.
pub const BY_POD_PRIORITY: &str = "shutdownGracePeriodByPodPriority";

fn by_pod_priority(v: &Value, path: &Path) -> Result<Vec<PodPriorityGrace>, ConfigError> {
    const FIELD: &str = BY_POD_PRIORITY;
    let items = match v {
        Value::Null => return Ok(Vec::new()),
        Value::Array(a) => a,
        o => return Err(at(FIELD, path, format!("{o} must be a list"))),
    };
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let Value::Object(m) = item else {
            return Err(at(FIELD, path, format!("[{i}]: must be a mapping")));
        };
        let mut entry = PodPriorityGrace {
            priority: 0,
            grace: Duration::ZERO,
        };
        for (k, v) in m {
            match k.as_str() {
                "priority" => {
                    entry.priority =
                        v.as_i64()
                            .and_then(|p| i32::try_from(p).ok())
                            .ok_or_else(|| {
                                at(
                                    FIELD,
                                    path,
                                    format!("[{i}].priority: {v} is not a 32-bit integer"),
                                )
                            })?;
                }
                "shutdownGracePeriodSeconds" => {
                    let s = v.as_i64().filter(|s| *s >= 0).ok_or_else(|| {
                        at(
                            FIELD,
                            path,
                            format!("[{i}].shutdownGracePeriodSeconds: {v} is not a whole number of seconds >= 0"),
                        )
                    })?;
                    entry.grace = Duration::from_secs(s.unsigned_abs());
                }
                o => {
                    return Err(at(
                        FIELD,
                        path,
                        format!(
                            "[{i}]: unknown field {o:?} (priority, shutdownGracePeriodSeconds)"
                        ),
                    ));
                }
            }
        }
        out.push(entry);
    }
    out.sort_by_key(|e| e.priority);
    Ok(out)
}

impl KubeletFile {
    /// Reads the fields reaplet honours from a `KubeletConfiguration`'s top-level mapping
    /// (`apiVersion` and `kind` already taken out).
    pub(super) fn from_mapping(
        mapping: Map<String, Value>,
        path: &Path,
    ) -> Result<Self, ConfigError> {
        let mut f = KubeletFile::default();
        let r = &mut f.raw;
        let mut by_priority = None;
        for (key, v) in &mapping {
            if let Some(&(field, read, setting)) = SHARED.iter().find(|(k, ..)| *k == key.as_str())
            {
                let slot = setting(r);
                *slot = read(field, v, path)?;
                f.used.extend(slot.is_some().then_some(field));
                continue;
            }
            // node-pressure eviction's (checked once merged with reaplet's settings)
            if let Some(used) = super::eviction::from_kubelet(key, v, path, r)? {
                f.used.extend(used);
                continue;
            }
            let set = match key.as_str() {
                "staticPodPath" => {
                    // as the kubelet's loader does: relative to the file's directory
                    f.static_pod_path = string("staticPodPath", v, path)?
                        .map(|p| path.parent().unwrap_or(Path::new("/")).join(p));
                    f.static_pod_path.is_some().then_some("staticPodPath")
                }
                "logging" => {
                    let logging = match v {
                        Value::Null => Map::new(),
                        Value::Object(m) => m.clone(),
                        o => return Err(at("logging", path, format!("{o} must be a mapping"))),
                    };
                    for (k, v) in &logging {
                        if k != "format" {
                            f.ignored.push(format!("logging.{k}"));
                            continue;
                        }
                        // the kubelet's text format is reaplet's auto: text, with syslog
                        // prefixes when the journal reads stderr
                        r.log_format = match string("logging.format", v, path)?.as_deref() {
                            None => None,
                            Some("text") => Some("auto".into()),
                            Some("json") => Some("json".into()),
                            Some(o) => {
                                return Err(at(
                                    "logging.format",
                                    path,
                                    format!("{o:?}: must be text or json"),
                                ));
                            }
                        };
                    }
                    r.log_format.is_some().then_some("logging.format")
                }
                "tracing" => {
                    let tracing = match v {
                        Value::Null => Map::new(),
                        Value::Object(m) => m.clone(),
                        o => return Err(at("tracing", path, format!("{o} must be a mapping"))),
                    };
                    for (k, v) in &tracing {
                        // `""` and `0` are unset, as for every field here
                        let (field, slot) = match k.as_str() {
                            "endpoint" => (
                                super::TRACING_ENDPOINT,
                                string(super::TRACING_ENDPOINT, v, path)?,
                            ),
                            "samplingRatePerMillion" => (
                                super::TRACING_SAMPLING_RATE,
                                number(super::TRACING_SAMPLING_RATE, v, path)?,
                            ),
                            _ => {
                                f.ignored.push(format!("tracing.{k}"));
                                continue;
                            }
                        };
                        f.used.extend(slot.is_some().then_some(field));
                        if field == super::TRACING_ENDPOINT {
                            r.tracing_endpoint = slot;
                        } else {
                            r.tracing_sampling_rate_per_million = slot;
                        }
                    }
                    None
                }
                "shutdownGracePeriod" => {
                    f.shutdown.grace_period = shutdown_period("shutdownGracePeriod", v, path)?;
                    (!f.shutdown.grace_period.is_zero()).then_some("shutdownGracePeriod")
                }
                "shutdownGracePeriodCriticalPods" => {
                    f.shutdown.grace_period_critical_pods =
                        shutdown_period("shutdownGracePeriodCriticalPods", v, path)?;
                    (!f.shutdown.grace_period_critical_pods.is_zero())
                        .then_some("shutdownGracePeriodCriticalPods")
                }
                "shutdownGracePeriodByPodPriority" => {
                    let list = by_pod_priority(v, path)?;
                    let set = !list.is_empty();
                    by_priority = Some(list);
                    set.then_some("shutdownGracePeriodByPodPriority")
                }
                other => {
                    f.ignored.push(other.to_owned());
                    None
                }
            };
            f.used.extend(set);
        }
        f.shutdown.by_pod_priority = by_priority.unwrap_or_default();
        f.shutdown = std::mem::take(&mut f.shutdown).validated(Some(path))?;
        f.ignored.sort();
        f.used.sort();
        Ok(f)
    }

    /// Validates the shared settings that `upper` (flags, environment, reaplet's file) does not
    /// override, on their own, so an error names the kubelet's field (its `staticPodPath` is
    /// reaplet's `podManifestPath`) and the file. The eviction fields are checked once merged
    /// (their rules span fields: a soft threshold and its grace period).
    pub(super) fn validate(&self, upper: &RawSettings, path: &Path) -> Result<(), ConfigError> {
        super::resolve(super::eviction::without(
            self.raw.clone().unless_set_in(upper),
        ))
        .map(drop)
        .map_err(|e| {
            let field = match e.field {
                "podManifestPath" => "staticPodPath",
                "logFormat" => "logging.format",
                f => f,
            };
            at(field, path, e.why)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::{ConfigFile, LogFormat, RawSettings, load};
    use super::*;
    use crate::cgroups::CgroupDriver;
    use std::path::PathBuf;

    fn fixture() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/kubeadm-kubelet-config.yaml")
    }

    fn read(text: &str) -> Result<KubeletFile, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("config.yaml");
        std::fs::write(
            &f,
            format!(
                "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n{text}"
            ),
        )
        .unwrap();
        match ConfigFile::read(&f)? {
            ConfigFile::Kubelet(k) => Ok(k),
            ConfigFile::Reaplet(r) => panic!("read as reaplet's own: {r:?}"),
        }
    }

    #[test]
    fn kubeadm_kubelet_config_loads_as_it_is() {
        let l = load(RawSettings::default(), Some(&fixture())).unwrap();
        let s = &l.settings;
        // the kubelet's manifest directory is the kubelet's: reaplet does not run it
        assert_eq!(s.pod_manifest_path, None);
        assert_eq!(
            l.kubelet.as_ref().unwrap().static_pod_path.as_deref(),
            Some(Path::new("/etc/kubernetes/manifests"))
        );
        assert_eq!(s.cgroup_driver, Some(CgroupDriver::Systemd));
        assert_eq!(s.kubelet_config.as_deref(), Some(fixture().as_path()));
        // kubeadm's zero values leave reaplet's defaults
        assert_eq!(
            s.container_runtime_endpoint,
            "unix:///run/containerd/containerd.sock"
        );
        assert_eq!(s.runtime_request_timeout, Duration::from_secs(120));
        assert_eq!(s.file_check_frequency, Duration::from_secs(1));
        assert_eq!(s.kube_api_qps, 100.0);
        assert_eq!(s.log_format, LogFormat::Auto);
        assert!(s.cgroups_per_qos);
        assert_eq!(s.shutdown, ShutdownSettings::default());
        // kubeadm writes the kubelet's healthz defaults out: the probe is where they say
        assert_eq!(
            s.kubelet_healthz_url.as_deref(),
            Some("http://127.0.0.1:10248/healthz")
        );
        assert_eq!(
            s.kubelet_healthz_from,
            super::super::HealthzFrom::KubeletConfig
        );
        let k = l.kubelet.unwrap();
        assert_eq!(
            k.used,
            [
                "cgroupDriver",
                "healthzBindAddress",
                "healthzPort",
                "staticPodPath"
            ]
        );
        for f in [
            "authentication",
            "authorization",
            "clusterDNS",
            "clusterDomain",
            "rotateCertificates",
            "resolvConf",
            "syncFrequency",
            "logging.verbosity",
            "logging.flushFrequency",
            "logging.options",
            "memorySwap",
        ] {
            assert!(
                k.ignored.iter().any(|i| i == f),
                "{f} not in {:?}",
                k.ignored
            );
        }
        for f in HONOURED {
            assert!(
                !k.ignored.iter().any(|i| i == f),
                "{f} both used and ignored"
            );
        }
        assert!(!k.ignored.iter().any(|i| i == "apiVersion" || i == "kind"));
        let mut sorted = k.ignored.clone();
        sorted.sort();
        assert_eq!(sorted, k.ignored);
    }

    #[test]
    fn honoured_fields_are_read_with_the_kubelets_types() {
        let k = read(concat!(
            "staticPodPath: /srv/manifests\n",
            "containerRuntimeEndpoint: unix:///run/crio/crio.sock\n",
            "runtimeRequestTimeout: 4m0s\n",
            "cgroupDriver: cgroupfs\n",
            "cgroupRoot: /custom\n",
            "cgroupsPerQOS: false\n",
            "fileCheckFrequency: 1m0s\n",
            "kubeAPIQPS: 50\n",
            "kubeAPIBurst: 100\n",
            "eventRecordQPS: 5\n",
            "eventBurst: 10\n",
            "logging:\n  format: json\n  verbosity: 2\n",
            "shutdownGracePeriod: 30s\n",
            "shutdownGracePeriodCriticalPods: 10s\n",
            "tracing:\n  endpoint: otel:4317\n  samplingRatePerMillion: 10\n",
            "healthzPort: 10300\n",
            "healthzBindAddress: \"::\"\n",
            "evictionHard:\n  memory.available: 200Mi\n",
            "evictionSoft:\n  memory.available: 300Mi\n",
            "evictionSoftGracePeriod:\n  memory.available: 1m\n",
            "evictionMinimumReclaim:\n  memory.available: 50Mi\n",
            "evictionMaxPodGracePeriod: 30\n",
            "evictionPressureTransitionPeriod: 2m0s\n",
            "mergeDefaultEvictionSettings: true\n",
            "enforceNodeAllocatable: [none]\n",
            "kubeReserved:\n  memory: 1Gi\n",
            "systemReserved:\n  memory: 1Gi\n",
            "maxPods: 110\n",
        ))
        .unwrap();
        // the pods cgroup's limit is read from the kernel, where the kubelet set it from these
        assert_eq!(
            k.ignored,
            [
                "kubeReserved",
                "logging.verbosity",
                "maxPods",
                "systemReserved"
            ]
        );
        assert_eq!(k.used.len(), HONOURED.len() - 1, "{:?}", k.used);
        assert_eq!(
            k.static_pod_path.as_deref(),
            Some(Path::new("/srv/manifests"))
        );
        let s = super::super::resolve(k.raw).unwrap();
        assert_eq!(s.pod_manifest_path, None, "never reaplet's own");
        assert_eq!(s.container_runtime_endpoint, "unix:///run/crio/crio.sock");
        assert_eq!(s.runtime_request_timeout, Duration::from_secs(240));
        assert_eq!(s.cgroup_driver, Some(CgroupDriver::Cgroupfs));
        assert_eq!(s.cgroup_root, "/custom");
        assert!(!s.cgroups_per_qos);
        assert_eq!(s.file_check_frequency, Duration::from_secs(60));
        assert_eq!((s.kube_api_qps, s.kube_api_burst), (50.0, 100));
        assert_eq!((s.event_qps, s.event_burst), (5.0, 10));
        assert_eq!(s.log_format, LogFormat::Json);
        assert_eq!(
            s.kubelet_healthz_url.as_deref(),
            Some("http://[::]:10300/healthz")
        );
        assert_eq!(
            s.tracing,
            Some(crate::otel::TracingConfig {
                endpoint: "http://otel:4317".into(),
                sampling_rate_per_million: 10
            })
        );
        assert_eq!(
            s.pressure.thresholds.len(),
            6,
            "merged defaults, a soft one, no copy"
        );
        assert_eq!(s.pressure.max_pod_grace_period, 30);
        assert_eq!(
            s.pressure.pressure_transition_period,
            Duration::from_secs(120)
        );
        assert_eq!(k.shutdown.grace_period, Duration::from_secs(30));
        assert_eq!(
            k.shutdown.grace_period_critical_pods,
            Duration::from_secs(10)
        );
        let k = read(concat!(
            "shutdownGracePeriodByPodPriority:\n",
            "- priority: 100000\n  shutdownGracePeriodSeconds: 10\n",
            "- priority: 0\n  shutdownGracePeriodSeconds: 120\n",
            "logging:\n  format: text\n",
        ))
        .unwrap();
        assert_eq!(
            k.shutdown.by_pod_priority,
            [
                PodPriorityGrace {
                    priority: 0,
                    grace: Duration::from_secs(120)
                },
                PodPriorityGrace {
                    priority: 100000,
                    grace: Duration::from_secs(10)
                },
            ]
        );
        assert_eq!(k.raw.log_format.as_deref(), Some("auto"));
    }

    #[test]
    fn field_errors_name_the_kubelets_field() {
        let cases: &[(&str, &str)] = &[
            ("logging:\n  format: xml\n", "logging.format"),
            ("logging: text\n", "logging"),
            ("cgroupsPerQOS: \"yes\"\n", "cgroupsPerQOS"),
            ("kubeAPIQPS: \"50\"\n", "kubeAPIQPS"),
            ("kubeAPIQPS: -1\n", "kubeAPIQPS"),
            ("eventBurst: -5\n", "eventBurst"),
            ("runtimeRequestTimeout: 5\n", "runtimeRequestTimeout"),
            ("fileCheckFrequency: soon\n", "fileCheckFrequency"),
            ("shutdownGracePeriod: -1s\n", "shutdownGracePeriod"),
            ("shutdownGracePeriod: 500ms\n", "shutdownGracePeriod"),
            (
                "shutdownGracePeriod: 10s\nshutdownGracePeriodCriticalPods: 20s\n",
                "shutdownGracePeriodCriticalPods",
            ),
            (
                "shutdownGracePeriod: 10s\nshutdownGracePeriodByPodPriority:\n- priority: 1\n  shutdownGracePeriodSeconds: 5\n",
                "shutdownGracePeriodByPodPriority",
            ),
            (
                "shutdownGracePeriodByPodPriority:\n- priority: 1\n  shutdownGracePeriodSeconds: -5\n",
                "shutdownGracePeriodByPodPriority",
            ),
            (
                "shutdownGracePeriodByPodPriority: 3\n",
                "shutdownGracePeriodByPodPriority",
            ),
            ("staticPodPath: [a]\n", "staticPodPath"),
            ("tracing: on\n", "tracing"),
            ("tracing:\n  endpoint: 4317\n", "tracing.endpoint"),
            (
                "tracing:\n  samplingRatePerMillion: \"5\"\n",
                "tracing.samplingRatePerMillion",
            ),
            (
                "tracing:\n  samplingRatePerMillion: -5\n",
                "tracing.samplingRatePerMillion",
            ),
        ];
        for (text, field) in cases {
            let e = read(text).unwrap_err();
            assert_eq!(e.field, *field, "{text:?}: {e}");
            assert!(e.to_string().contains("config.yaml"), "names the file: {e}");
        }
        // values of the right type that reaplet rejects, validated before the layers merge
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("k.yaml");
        for (text, field) in [
            ("cgroupDriver: openrc\n", "cgroupDriver"),
            ("cgroupRoot: ../escape\n", "cgroupRoot"),
            (
                "containerRuntimeEndpoint: tcp://1.2.3.4:5\n",
                "containerRuntimeEndpoint",
            ),
            ("kubeAPIBurst: 2.5\n", "kubeAPIBurst"),
        ] {
            std::fs::write(
                &f,
                format!(
                    "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n{text}"
                ),
            )
            .unwrap();
            let e = load(RawSettings::default(), Some(&f)).unwrap_err();
            assert_eq!(e.field, field, "{text:?}: {e}");
            assert!(e.to_string().contains("k.yaml"), "{e}");
            // a flag or reaplet's file setting the field overrides the kubelet's value
            let flags = RawSettings {
                cgroup_driver: Some("systemd".into()),
                cgroup_root: Some("/".into()),
                container_runtime_endpoint: Some("unix:///run/x.sock".into()),
                kube_api_burst: Some("7".into()),
                ..RawSettings::default()
            };
            load(flags, Some(&f)).unwrap();
        }
        // a relative staticPodPath is relative to the file's directory, as for the kubelet
        std::fs::write(
            &f,
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nstaticPodPath: manifests\n",
        )
        .unwrap();
        let l = load(RawSettings::default(), Some(&f)).unwrap();
        assert_eq!(
            l.kubelet.unwrap().static_pod_path,
            Some(dir.path().join("manifests"))
        );
    }
}
