//! Configuration: kubelet's flags and `KubeletConfiguration` file for the settings reaplet
//! shares with it (same names: flags in kebab-case, file keys in camelCase), plus reaplet's own.
//!
//! Invariants:
//! * precedence is flags > environment (`REAPLET_*`) > file > defaults; the caller (the binary)
//!   merges flags and environment into one [`RawSettings`] layer, since only it reads argv and
//!   the environment;
//! * everything is parsed and validated here, before anything starts; an invalid value is a
//!   [`ConfigError`] naming the field (file key) and why; the binary exits with code 64;
//! * unknown keys in the file are errors, not silently ignored.

use crate::cgroups::{CgroupDriver, CgroupNaming};
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// An invalid setting: `field` is the file key (the flag is its kebab-case form).
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

/// One layer of unparsed settings (flags+environment, or the file).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RawSettings {
    pub kubeconfig: Option<String>,
    pub hostname_override: Option<String>,
    pub container_runtime_endpoint: Option<String>,
    pub runtime_request_timeout: Option<String>,
    pub root_dir: Option<String>,
    pub cgroup_driver: Option<String>,
    pub cgroup_root: Option<String>,
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
}

impl RawSettings {
    /// Reads a YAML config file. Numbers and booleans are accepted as YAML scalars.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| err("config", format!("{}: {e}", path.display())))?;
        if text.trim().is_empty() {
            return Ok(Self::default());
        }
        // scalars of any YAML type become strings, then parse like flags
        let value: serde_json::Value =
            serde_saphyr::from_str_with_options(&text, yaml_options())
                .map_err(|e| err("config", format!("{}: {e}", path.display())))?;
        let mapping = match value {
            serde_json::Value::Object(m) => m,
            serde_json::Value::Null => return Ok(Self::default()),
            _ => return Err(err("config", format!("{}: not a mapping", path.display()))),
        };
        let mut strings = serde_json::Map::new();
        for (key, v) in mapping {
            // KubeletConfiguration's apiVersion/kind are allowed and ignored
            if key == "apiVersion" || key == "kind" {
                continue;
            }
            let s = match v {
                serde_json::Value::String(s) => s,
                serde_json::Value::Number(n) => n.to_string(),
                serde_json::Value::Bool(b) => b.to_string(),
                serde_json::Value::Null => continue,
                _ => {
                    return Err(err(leak_field(&key), "must be a single value"));
                }
            };
            strings.insert(key, serde_json::Value::String(s));
        }
        serde_json::from_value(serde_json::Value::Object(strings))
            .map_err(|e| err("config", format!("{}: {e}", path.display())))
    }

    /// `self` over `lower`: each field set here wins.
    pub fn over(self, lower: RawSettings) -> RawSettings {
        macro_rules! pick {
            ($($f:ident),*) => { RawSettings { $($f: self.$f.or(lower.$f)),* } };
        }
        pick!(
            kubeconfig,
            hostname_override,
            container_runtime_endpoint,
            runtime_request_timeout,
            root_dir,
            cgroup_driver,
            cgroup_root,
            pod_manifest_path,
            file_check_frequency,
            kube_api_qps,
            kube_api_burst,
            event_qps,
            event_burst,
            metrics_bind_address,
            log_format,
            volume_unmount_timeout
        )
    }
}

/// How reaplet reads YAML (the config file and static pod manifests) with `serde-saphyr`:
/// scalars are inferred as `serde_yaml` 0.9 did (YAML 1.2 core: `yes`, `012`, `1_000` stay
/// strings; `.inf`/`.nan` stay strings, so they fail as numbers naming their field), duplicate
/// keys are errors, and messages are one line (no source snippet) for logs and exit messages.
pub(crate) fn yaml_options() -> serde_saphyr::Options {
    serde_saphyr::options! {
        strict_booleans: true,
        leading_zero_numbers_as_strings: true,
        underscored_numbers_as_strings: true,
        non_finite_float_policy: serde_saphyr::options::NonFiniteFloatPolicy::AsString,
        duplicate_keys: serde_saphyr::options::DuplicateKeyPolicy::Error,
        with_snippet: false,
    }
}

/// Known field names, for errors about a key that is not a field.
fn leak_field(key: &str) -> &'static str {
    const FIELDS: &[&str] = &[
        "kubeconfig",
        "hostnameOverride",
        "containerRuntimeEndpoint",
        "runtimeRequestTimeout",
        "rootDir",
        "cgroupDriver",
        "cgroupRoot",
        "podManifestPath",
        "fileCheckFrequency",
        "kubeAPIQPS",
        "kubeAPIBurst",
        "eventRecordQPS",
        "eventBurst",
        "metricsBindAddress",
        "logFormat",
        "volumeUnmountTimeout",
    ];
    FIELDS
        .iter()
        .find(|f| **f == key)
        .copied()
        .unwrap_or("config")
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
    /// The node name (already lower-cased); `None`: the caller uses the host name.
    pub hostname_override: Option<String>,
    pub container_runtime_endpoint: String,
    pub runtime_request_timeout: Duration,
    pub root_dir: PathBuf,
    /// `None`: detect from the runtime, then the host.
    pub cgroup_driver: Option<CgroupDriver>,
    pub cgroup_root: String,
    pub pod_manifest_path: Option<PathBuf>,
    pub file_check_frequency: Duration,
    pub kube_api_qps: f64,
    pub kube_api_burst: u32,
    pub event_qps: f64,
    pub event_burst: u32,
    pub metrics_bind_address: SocketAddr,
    pub log_format: LogFormat,
    pub volume_unmount_timeout: Duration,
}

/// Parses `500ms`, `10s`, `2m`, `1h`, `1m30s` (Go's `time.Duration` forms reaplet needs).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if t.is_empty() {
        return Err("empty duration".into());
    }
    let mut total = 0f64;
    let mut rest = t;
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(rest.len());
        if num_end == 0 {
            return Err(format!("{s:?} is not a duration like 500ms, 10s, 2m"));
        }
        let v: f64 = rest[..num_end]
            .parse()
            .map_err(|_| format!("{s:?}: bad number"))?;
        rest = &rest[num_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let mult = match &rest[..unit_end] {
            "ms" => 0.001,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            "" if num_end == t.len() => 1.0,
            u => return Err(format!("{s:?}: unknown unit {u:?} (ms, s, m, h)")),
        };
        rest = &rest[unit_end..];
        total += v * mult;
    }
    if !total.is_finite() || !(0.0..=1e9).contains(&total) {
        return Err(format!("{s:?} is out of range"));
    }
    Ok(Duration::from_secs_f64(total))
}

fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

fn abs_path(field: &'static str, v: &str) -> Result<PathBuf, ConfigError> {
    if v.is_empty() {
        return Err(err(field, "must not be empty"));
    }
    let p = PathBuf::from(v);
    if !p.is_absolute() {
        return Err(err(field, format!("{v:?} must be an absolute path")));
    }
    Ok(p)
}

fn duration(
    field: &'static str,
    v: Option<String>,
    default: Duration,
    min: Duration,
) -> Result<Duration, ConfigError> {
    let d = match v {
        Some(v) => parse_duration(&v).map_err(|e| err(field, e))?,
        None => default,
    };
    if d < min {
        return Err(err(field, format!("must be at least {min:?}")));
    }
    Ok(d)
}

fn positive_f64(field: &'static str, v: Option<String>, default: f64) -> Result<f64, ConfigError> {
    let Some(v) = v else { return Ok(default) };
    let x: f64 = v
        .trim()
        .parse()
        .map_err(|_| err(field, format!("{v:?} is not a number")))?;
    if !x.is_finite() || x <= 0.0 {
        return Err(err(field, format!("{v:?} must be a positive number")));
    }
    Ok(x)
}

fn positive_u32(field: &'static str, v: Option<String>, default: u32) -> Result<u32, ConfigError> {
    let Some(v) = v else { return Ok(default) };
    let x: u32 = v
        .trim()
        .parse()
        .map_err(|_| err(field, format!("{v:?} is not a whole number")))?;
    if x == 0 {
        return Err(err(field, "must be at least 1"));
    }
    Ok(x)
}

/// The default metrics and status address (loopback only).
pub const DEFAULT_METRICS_ADDRESS: &str = "127.0.0.1:10258";

/// Resolves one merged layer (flags > environment > file, see [`RawSettings::over`]) into
/// validated settings.
pub fn resolve(raw: RawSettings) -> Result<Settings, ConfigError> {
    let kubeconfig = raw
        .kubeconfig
        .map(|v| abs_path("kubeconfig", &v))
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
            format!("{metrics:?} is not an address like 127.0.0.1:10258"),
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
    Ok(Settings {
        kubeconfig,
        hostname_override,
        container_runtime_endpoint: endpoint,
        runtime_request_timeout,
        root_dir,
        cgroup_driver,
        cgroup_root,
        pod_manifest_path,
        file_check_frequency,
        kube_api_qps: positive_f64("kubeAPIQPS", raw.kube_api_qps, 100.0)?,
        kube_api_burst: positive_u32("kubeAPIBurst", raw.kube_api_burst, 200)?,
        event_qps: positive_f64("eventRecordQPS", raw.event_qps, 10.0)?,
        event_burst: positive_u32("eventBurst", raw.event_burst, 50)?,
        metrics_bind_address,
        log_format,
        volume_unmount_timeout: duration(
            "volumeUnmountTimeout",
            raw.volume_unmount_timeout,
            Duration::from_secs(123),
            Duration::from_secs(1),
        )?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw() -> RawSettings {
        RawSettings::default()
    }

    #[test]
    fn defaults_are_valid() {
        let s = resolve(raw()).unwrap();
        assert_eq!(s.root_dir, PathBuf::from("/var/lib/kubelet"));
        assert_eq!(
            s.container_runtime_endpoint,
            "unix:///run/containerd/containerd.sock"
        );
        assert_eq!(s.metrics_bind_address.to_string(), DEFAULT_METRICS_ADDRESS);
        assert!(s.metrics_bind_address.ip().is_loopback());
        assert_eq!(s.cgroup_driver, None);
        assert_eq!(s.kube_api_qps, 100.0);
    }

    /// Every field, with an invalid value, fails naming that field.
    pub const INVALID: &[(&str, &str)] = &[
        ("kubeconfig", "relative/kubeconfig"),
        ("hostnameOverride", "Not_A_Node!"),
        ("containerRuntimeEndpoint", "tcp://10.0.0.1:1234"),
        ("runtimeRequestTimeout", "soon"),
        ("rootDir", "var/lib/kubelet"),
        ("cgroupDriver", "openrc"),
        ("cgroupRoot", "../escape"),
        ("podManifestPath", "manifests"),
        ("fileCheckFrequency", "1ns"),
        ("kubeAPIQPS", "-3"),
        ("kubeAPIBurst", "0"),
        ("eventRecordQPS", "many"),
        ("eventBurst", "-1"),
        ("metricsBindAddress", "localhost"),
        ("logFormat", "xml"),
        ("volumeUnmountTimeout", "0s"),
    ];

    fn set(field: &str, v: &str) -> RawSettings {
        let mut r = raw();
        let v = Some(v.to_string());
        match field {
            "kubeconfig" => r.kubeconfig = v,
            "hostnameOverride" => r.hostname_override = v,
            "containerRuntimeEndpoint" => r.container_runtime_endpoint = v,
            "runtimeRequestTimeout" => r.runtime_request_timeout = v,
            "rootDir" => r.root_dir = v,
            "cgroupDriver" => r.cgroup_driver = v,
            "cgroupRoot" => r.cgroup_root = v,
            "podManifestPath" => r.pod_manifest_path = v,
            "fileCheckFrequency" => r.file_check_frequency = v,
            "kubeAPIQPS" => r.kube_api_qps = v,
            "kubeAPIBurst" => r.kube_api_burst = v,
            "eventRecordQPS" => r.event_qps = v,
            "eventBurst" => r.event_burst = v,
            "metricsBindAddress" => r.metrics_bind_address = v,
            "logFormat" => r.log_format = v,
            "volumeUnmountTimeout" => r.volume_unmount_timeout = v,
            _ => panic!("unknown field {field}"),
        }
        r
    }

    #[test]
    fn every_invalid_field_is_named() {
        for (field, value) in INVALID {
            let e = resolve(set(field, value)).unwrap_err();
            assert_eq!(e.field, *field, "{value:?}: {e}");
            assert!(e.to_string().contains(field));
        }
    }

    #[test]
    fn precedence_flags_over_env_over_file_over_defaults() {
        let file = RawSettings {
            root_dir: Some("/file".into()),
            cgroup_root: Some("/f".into()),
            log_format: Some("json".into()),
            ..raw()
        };
        let env = RawSettings {
            root_dir: Some("/env".into()),
            cgroup_root: Some("/e".into()),
            ..raw()
        };
        let flags = RawSettings {
            root_dir: Some("/flag".into()),
            ..raw()
        };
        let s = resolve(flags.over(env.over(file))).unwrap();
        assert_eq!(s.root_dir, PathBuf::from("/flag"));
        assert_eq!(s.cgroup_root, "/e");
        assert_eq!(s.log_format, LogFormat::Json);
        assert_eq!(s.file_check_frequency, Duration::from_secs(1), "default");
    }

    #[test]
    fn config_file_in_camel_case() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("c.yaml");
        std::fs::write(&f, "apiVersion: reaplet.io/v1\nkind: ReapletConfiguration\nrootDir: /srv/kubelet\nkubeAPIQPS: 50\nkubeAPIBurst: 100\ncgroupDriver: systemd\nruntimeRequestTimeout: 1m30s\n").unwrap();
        let s = resolve(RawSettings::from_file(&f).unwrap()).unwrap();
        assert_eq!(s.root_dir, PathBuf::from("/srv/kubelet"));
        assert_eq!(s.kube_api_qps, 50.0);
        assert_eq!(s.kube_api_burst, 100);
        assert_eq!(s.cgroup_driver, Some(CgroupDriver::Systemd));
        assert_eq!(s.runtime_request_timeout, Duration::from_secs(90));
        std::fs::write(&f, "rootDirr: /x\n").unwrap();
        let e = RawSettings::from_file(&f).unwrap_err();
        assert!(e.why.contains("rootDirr"), "{e}");
        std::fs::write(&f, "rootDir: [a, b]\n").unwrap();
        assert_eq!(RawSettings::from_file(&f).unwrap_err().field, "rootDir");
        assert_eq!(
            RawSettings::from_file(&dir.path().join("missing"))
                .unwrap_err()
                .field,
            "config"
        );
    }

    #[test]
    fn config_scalars_are_read_as_written() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("c.yaml");
        let read = |text: &str| {
            std::fs::write(&f, text).unwrap();
            RawSettings::from_file(&f)
        };
        // YAML 1.1 booleans, leading zeros and underscores are strings, as written
        let r = read("hostnameOverride: yes\nkubeAPIBurst: 012\neventBurst: 1_000\n").unwrap();
        assert_eq!(r.hostname_override.as_deref(), Some("yes"));
        assert_eq!(r.kube_api_burst.as_deref(), Some("012"));
        assert_eq!(r.event_burst.as_deref(), Some("1_000"));
        let r = read("kubeAPIQPS: 2.5\nkubeAPIBurst: 7\nlogFormat: ~\n").unwrap();
        assert_eq!(r.kube_api_qps.as_deref(), Some("2.5"));
        assert_eq!(r.kube_api_burst.as_deref(), Some("7"));
        assert_eq!(r.log_format, None);
        // a non-finite float is a string that fails as a number, naming its field
        let e = resolve(read("kubeAPIQPS: .inf\n").unwrap()).unwrap_err();
        assert_eq!(e.field, "kubeAPIQPS", "{e}");
        // duplicate keys, a non-mapping and broken YAML: one-line errors about the file
        for text in ["rootDir: /a\nrootDir: /b\n", "- a\n", "rootDir: [a\n"] {
            let e = read(text).unwrap_err();
            assert_eq!(e.field, "config", "{text:?}: {e}");
            assert!(!e.to_string().contains('\n'), "{text:?}: {e}");
        }
        assert_eq!(read("# nothing\n").unwrap(), RawSettings::default());
        assert_eq!(read("rootDir: {a: b}\n").unwrap_err().field, "rootDir");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("7").unwrap(), Duration::from_secs(7));
        for bad in ["", "s", "1x", "-1s", "1e999s", "abc"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}
