//! Reading one config file into a [`RawSettings`] layer: reaplet's own kind (its keys, the
//! `tracing` mapping, YAML scalars taken as flag text) or the kubelet's (handed to
//! [`super::kubelet`]), and how layers combine ([`RawSettings::over`]). Counterpart of the
//! kubelet's `pkg/kubelet/apis/config` loading (`loadConfigFile`); defaulting and validation
//! are [`super::resolve`]'s.
//!
//! Invariants: a file's unknown keys are errors naming the key; every field of
//! [`RawSettings`] is listed once (`every_field!`), so merging cannot forget one.

use super::*;

/// A config file: reaplet's own kind, or the kubelet's.
#[derive(Debug, Clone, PartialEq)]
pub enum ConfigFile {
    Reaplet(RawSettings),
    Kubelet(KubeletFile),
}

/// A file's top-level mapping (empty for an empty file). Scalars keep their YAML types.
/// The file at `path` as a mapping; an unreadable or unparsable file is an error naming
/// `field`, the setting that named the file.
fn read_mapping(
    path: &Path,
    field: &'static str,
) -> Result<serde_json::Map<String, serde_json::Value>, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| err(field, format!("{}: {e}", path.display())))?;
    if text.trim().is_empty() {
        return Ok(serde_json::Map::new());
    }
    let value: serde_json::Value = serde_saphyr::from_str_with_options(&text, yaml_options())
        .map_err(|e| err(field, format!("{}: {e}", path.display())))?;
    match value {
        serde_json::Value::Object(m) => Ok(m),
        serde_json::Value::Null => Ok(serde_json::Map::new()),
        _ => Err(err(field, format!("{}: not a mapping", path.display()))),
    }
}

impl ConfigFile {
    /// Reads a YAML config file of either kind.
    pub fn read(path: &Path) -> Result<Self, ConfigError> {
        Self::read_named(path, "config")
    }

    /// [`ConfigFile::read`] of a file the setting `field` named: a file that cannot be read or
    /// parsed is an error naming `field` (`kubeletConfig` for the kubelet's file).
    pub fn read_named(path: &Path, field: &'static str) -> Result<Self, ConfigError> {
        let mut mapping = read_mapping(path, field)?;
        let mut header = |key: &'static str| match mapping.remove(key) {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(serde_json::Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(err(key, format!("{}: must be a string", path.display()))),
        };
        let api_version = header("apiVersion")?;
        let kind = header("kind")?;
        let want = |want: &str, kind: &str| match api_version.as_deref() {
            Some(v) if v == want => Ok(()),
            Some(v) => Err(err(
                "apiVersion",
                format!("{}: {v:?}: {kind} is {want}", path.display()),
            )),
            None => Err(err(
                "apiVersion",
                format!("{}: missing (a {kind} is {want})", path.display()),
            )),
        };
        match kind.as_deref() {
            // a file from before kinds existed is reaplet's own
            None if api_version.is_none() => {
                Ok(Self::Reaplet(RawSettings::from_mapping(mapping, path)?))
            }
            Some(REAPLET_KIND) => {
                want(REAPLET_API_VERSION, REAPLET_KIND)?;
                Ok(Self::Reaplet(RawSettings::from_mapping(mapping, path)?))
            }
            Some(KUBELET_KIND) => {
                want(KUBELET_API_VERSION, KUBELET_KIND)?;
                Ok(Self::Kubelet(KubeletFile::from_mapping(mapping, path)?))
            }
            None => Err(err(
                "kind",
                format!(
                    "{}: missing ({REAPLET_KIND} or {KUBELET_KIND})",
                    path.display()
                ),
            )),
            Some(o) => Err(err(
                "kind",
                format!(
                    "{}: {o:?} is neither {REAPLET_KIND} nor {KUBELET_KIND}",
                    path.display()
                ),
            )),
        }
    }
}

impl RawSettings {
    /// Reads reaplet's own config file (a `KubeletConfiguration` is an error naming `kind`:
    /// see [`ConfigFile::read`] and [`load`] for both kinds).
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        match ConfigFile::read(path)? {
            ConfigFile::Reaplet(r) => Ok(r),
            ConfigFile::Kubelet(_) => Err(err(
                "kind",
                format!("{}: a {KUBELET_KIND}, not a {REAPLET_KIND}", path.display()),
            )),
        }
    }

    /// Numbers and booleans are accepted as YAML scalars and parsed like flags.
    fn from_mapping(
        mapping: serde_json::Map<String, serde_json::Value>,
        path: &Path,
    ) -> Result<Self, ConfigError> {
        let mut strings = serde_json::Map::new();
        let mut tracing = (None, None);
        // the eviction maps and list, kept apart from the strings
        let mut structured = RawSettings::default();
        for (key, v) in mapping {
            if key == "tracing" {
                tracing = tracing_mapping(v)?;
                continue;
            }
            if eviction::from_own_file(&key, &v, &mut structured)? {
                continue;
            }
            let s = match v {
                serde_json::Value::String(s) => s,
                serde_json::Value::Number(n) => n.to_string(),
                serde_json::Value::Bool(b) => b.to_string(),
                serde_json::Value::Null => continue,
                // the one list setting, parsed with the rest in `resolve`
                v @ serde_json::Value::Array(_) if key == kubelet::BY_POD_PRIORITY => v.to_string(),
                _ => {
                    return Err(err(known_field(&key), "must be a single value"));
                }
            };
            strings.insert(key, serde_json::Value::String(s));
        }
        let mut raw: RawSettings = serde_json::from_value(serde_json::Value::Object(strings))
            .map_err(|e| err("config", format!("{}: {e}", path.display())))?;
        (raw.tracing_endpoint, raw.tracing_sampling_rate_per_million) = tracing;
        Ok(structured.over(raw))
    }

    /// `self` over `lower`: each field set here wins.
    pub fn over(self, lower: RawSettings) -> RawSettings {
        macro_rules! pick {
            ($($f:ident),*) => { RawSettings { $($f: self.$f.or(lower.$f)),* } };
        }
        every_field!(pick)
    }

    /// The fields of `self` that `upper` does not set.
    pub(super) fn unless_set_in(self, upper: &RawSettings) -> RawSettings {
        macro_rules! keep {
            ($($f:ident),*) => { RawSettings { $($f: self.$f.filter(|_| upper.$f.is_none())),* } };
        }
        every_field!(keep)
    }
}

/// Applies macro `$m` to the list of every [`RawSettings`] field.
macro_rules! every_field {
    ($m:ident) => {
        $m!(
            kubeconfig,
            kubelet_config,
            hostname_override,
            container_runtime_endpoint,
            runtime_request_timeout,
            root_dir,
            cgroup_driver,
            cgroup_root,
            cgroups_per_qos,
            pod_manifest_path,
            file_check_frequency,
            kube_api_qps,
            kube_api_burst,
            event_qps,
            event_burst,
            metrics_bind_address,
            log_format,
            volume_unmount_timeout,
            relist_period,
            relist_period_with_events,
            container_events,
            authority,
            kubelet_healthz_url,
            healthz_port,
            healthz_bind_address,
            takeover_after,
            enable_taint_manager,
            enforce_node_affinity,
            node_affinity_namespaces,
            node_affinity_selector,
            node_affinity_settle,
            eviction_dry_run,
            shutdown_grace_period,
            shutdown_grace_period_critical_pods,
            shutdown_grace_period_by_pod_priority,
            tracing_endpoint,
            tracing_sampling_rate_per_million,
            termination_timelines,
            eviction_hard,
            eviction_soft,
            eviction_soft_grace_period,
            eviction_minimum_reclaim,
            eviction_max_pod_grace_period,
            eviction_pressure_transition_period,
            merge_default_eviction_settings,
            enforce_node_allocatable
        )
    };
}
use every_field;

/// `tracing`'s two fields.
pub const TRACING_ENDPOINT: &str = "tracing.endpoint";
pub const TRACING_SAMPLING_RATE: &str = "tracing.samplingRatePerMillion";

/// The `tracing` mapping of reaplet's own file: its endpoint and rate, as settings' text.
fn tracing_mapping(v: serde_json::Value) -> Result<(Option<String>, Option<String>), ConfigError> {
    use serde_json::Value;
    let fields = match v {
        Value::Null => return Ok((None, None)),
        Value::Object(m) => m,
        _ => {
            return Err(err(
                "tracing",
                "must be a mapping (endpoint, samplingRatePerMillion)",
            ));
        }
    };
    let (mut endpoint, mut rate) = (None, None);
    for (key, v) in fields {
        let (field, slot) = match key.as_str() {
            "endpoint" => (TRACING_ENDPOINT, &mut endpoint),
            "samplingRatePerMillion" => (TRACING_SAMPLING_RATE, &mut rate),
            o => {
                return Err(err(
                    "tracing",
                    format!("unknown field {o:?} (endpoint, samplingRatePerMillion)"),
                ));
            }
        };
        *slot = match v {
            Value::Null => None,
            Value::String(s) => Some(s),
            Value::Number(n) if field == TRACING_SAMPLING_RATE => Some(n.to_string()),
            o if field == TRACING_ENDPOINT => {
                return Err(err(
                    field,
                    format!("{o} must be a string like localhost:4317"),
                ));
            }
            o => return Err(err(field, format!("{o} must be a whole number"))),
        };
    }
    Ok((endpoint, rate))
}

/// The tracing settings: `None` when neither field is set; else the endpoint (the kubelet's
/// default `localhost:4317`) as its `http://` URL and the rate (default 0), validated as the
/// kubelet validates them.
pub(super) fn tracing_settings(
    endpoint: Option<String>,
    rate: Option<String>,
) -> Result<Option<crate::otel::TracingConfig>, ConfigError> {
    let rate = rate
        .map(|v| {
            v.trim().parse::<u64>().map_err(|_| {
                err(
                    TRACING_SAMPLING_RATE,
                    format!("{v:?} is not a whole number from 0 to 1000000"),
                )
            })
        })
        .transpose()?;
    crate::otel::TracingConfig::from_parts(endpoint.as_deref(), rate).map_err(|e| match e {
        crate::otel::OtelError::SamplingRate(_) => err(TRACING_SAMPLING_RATE, e.to_string()),
        e => err(TRACING_ENDPOINT, e.to_string()),
    })
}

/// A typed object (a static pod manifest, `make-room --for-pod`) from YAML the way the kubelet
/// decodes one: the YAML becomes JSON (`yaml.YAMLToJSON`: scalars keep their YAML types), the
/// JSON is decoded. Decoding through the JSON text reuses the JSON decoder the API client
/// already has for the type: decoded from YAML directly, a `Pod` took a second copy of its
/// whole deserializer in the binary (about 3.8 MiB of code, issue 46). A YAML error names its
/// line; a type error names the field (`spec.containers`), as the kubelet's does, not a
/// position in the JSON text.
pub(crate) fn from_yaml<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, String> {
    let value: serde_json::Value =
        serde_saphyr::from_str_with_options(text, yaml_options()).map_err(|e| e.to_string())?;
    let json = value.to_string();
    serde_json::from_str(&json).map_err(|e| {
        let full = e.to_string();
        let at = format!(" at line {} column {}", e.line(), e.column());
        let what = full.strip_suffix(&at).unwrap_or(&full);
        // compact JSON is one line: the column is the byte just past the offending value
        match json_path_at(&json, e.column()) {
            p if p.is_empty() => what.to_owned(),
            p => format!("{what} at {p}"),
        }
    })
}

/// The field path (`spec.containers[0].name`) of the value that ends at byte `at` of `json`,
/// compact JSON as `serde_json` writes it.
fn json_path_at(json: &str, at: usize) -> String {
    enum Level {
        Object(Option<String>),
        Array(usize),
    }
    let b = json.as_bytes();
    let mut stack: Vec<Level> = Vec::new();
    let mut key_next = false;
    let mut i = 0;
    while i < b.len().min(at) {
        match b[i] {
            b'"' => {
                let mut j = i + 1;
                while j < b.len() && b[j] != b'"' {
                    j += if b[j] == b'\\' { 2 } else { 1 };
                }
                if key_next {
                    if let Some(Level::Object(k)) = stack.last_mut() {
                        *k = json.get(i..=j).and_then(|s| serde_json::from_str(s).ok());
                    }
                    key_next = false;
                }
                i = j + 1;
                continue;
            }
            b'{' => {
                stack.push(Level::Object(None));
                key_next = true;
            }
            b'[' => stack.push(Level::Array(0)),
            b'}' | b']' => {
                stack.pop();
            }
            b',' => match stack.last_mut() {
                Some(Level::Array(n)) => *n += 1,
                Some(Level::Object(_)) => key_next = true,
                None => {}
            },
            _ => {}
        }
        i += 1;
    }
    let mut path = String::new();
    for l in &stack {
        match l {
            Level::Object(Some(k)) if path.is_empty() => path.push_str(k),
            Level::Object(Some(k)) => {
                path.push('.');
                path.push_str(k);
            }
            Level::Object(None) => {}
            Level::Array(n) => path.push_str(&format!("[{n}]")),
        }
    }
    path
}

/// How reaplet reads YAML (the config file and static pod manifests) with `serde-saphyr`:
/// scalars are inferred as `serde_yaml` 0.9 did (YAML 1.2 core: `yes`, `012`, `1_000` stay
/// strings; `.inf`/`.nan` stay strings, so they fail as numbers naming their field), duplicate
/// keys are errors, and messages are one line (no source snippet) for logs and exit messages.
fn yaml_options() -> serde_saphyr::Options {
    serde_saphyr::options! {
        strict_booleans: true,
        leading_zero_numbers_as_strings: true,
        underscored_numbers_as_strings: true,
        non_finite_float_policy: serde_saphyr::options::NonFiniteFloatPolicy::AsString,
        duplicate_keys: serde_saphyr::options::DuplicateKeyPolicy::Error,
        with_snippet: false,
    }
}

/// The keys of reaplet's own file (`tracing`'s as `tracing.endpoint` and
/// `tracing.samplingRatePerMillion`, the field paths its errors name).
pub const FIELDS: &[&str] = &[
    "kubeconfig",
    "kubeletConfig",
    "hostnameOverride",
    "containerRuntimeEndpoint",
    "runtimeRequestTimeout",
    "rootDir",
    "cgroupDriver",
    "cgroupRoot",
    "cgroupsPerQOS",
    "podManifestPath",
    "fileCheckFrequency",
    "kubeAPIQPS",
    "kubeAPIBurst",
    "eventRecordQPS",
    "eventBurst",
    "metricsBindAddress",
    "logFormat",
    "volumeUnmountTimeout",
    "relistPeriod",
    "relistPeriodWithEvents",
    "containerEvents",
    "authority",
    "kubeletHealthzURL",
    "healthzPort",
    "healthzBindAddress",
    "takeoverAfter",
    "enableTaintManager",
    "enforceNodeAffinity",
    "nodeAffinityNamespaces",
    "nodeAffinitySelector",
    "nodeAffinitySettle",
    "evictionDryRun",
    "shutdownGracePeriod",
    "shutdownGracePeriodCriticalPods",
    "shutdownGracePeriodByPodPriority",
    TRACING_ENDPOINT,
    TRACING_SAMPLING_RATE,
    "terminationTimelines",
    eviction::EVICTION_HARD,
    eviction::EVICTION_SOFT,
    eviction::EVICTION_SOFT_GRACE_PERIOD,
    eviction::EVICTION_MINIMUM_RECLAIM,
    eviction::EVICTION_MAX_POD_GRACE_PERIOD,
    eviction::EVICTION_PRESSURE_TRANSITION_PERIOD,
    eviction::MERGE_DEFAULT_EVICTION_SETTINGS,
    eviction::ENFORCE_NODE_ALLOCATABLE,
];

/// Known field names, for errors about a key that is not a field.
fn known_field(key: &str) -> &'static str {
    FIELDS
        .iter()
        .find(|f| **f == key)
        .copied()
        .unwrap_or("config")
}
