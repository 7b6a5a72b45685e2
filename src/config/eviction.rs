//! Node-pressure eviction's settings, with the kubelet's names, syntax and meaning
//! (`evictionHard`, `evictionSoft`, `evictionSoftGracePeriod`, `evictionMinimumReclaim`,
//! `evictionMaxPodGracePeriod`, `evictionPressureTransitionPeriod`,
//! `mergeDefaultEvictionSettings`, `enforceNodeAllocatable`). Counterpart of the kubelet's
//! eviction flags (`cmd/kubelet/app/options`, `component-base/cli/flag`), their v1beta1
//! defaulting, the `evictionHard` defaulting of `loadConfigFile`, the `enforceNodeAllocatable`
//! rules of `ValidateKubeletConfiguration`, and `ParseThresholdConfig` run at start (v1.36).
//!
//! Invariants:
//! * a map is given whole by one layer (flags > environment > reaplet's file > the kubelet's
//!   file), as the kubelet's flags replace its file's map; the flags' syntax is the kubelet's
//!   (`sig<val,...` for `--eviction-hard` and `--eviction-soft`, `sig=val,...` for the other
//!   two, `a,b` for `--enforce-node-allocatable`), and so is the environment's;
//! * reaplet always behaves as the kubelet run from a config file (kubeadm's case): no layer
//!   setting `evictionHard` gives the kubelet's Linux defaults, and with
//!   `mergeDefaultEvictionSettings` a set map gains the default keys it lacks (the map of
//!   whichever layer gives it: the kubelet merges its file's map only, which its own
//!   `--eviction-hard` then replaces);
//! * every error is the kubelet's own text, named by the field at fault; the kubelet's file is
//!   named when reaplet's own settings set none of the fields at fault.

use super::kubelet::at;
use super::{ConfigError, RawSettings, err, parse_duration};
use crate::pressure::manager::PressureSettings;
use crate::pressure::thresholds::{self, ThresholdError};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

pub const EVICTION_HARD: &str = "evictionHard";
pub const EVICTION_SOFT: &str = "evictionSoft";
pub const EVICTION_SOFT_GRACE_PERIOD: &str = "evictionSoftGracePeriod";
pub const EVICTION_MINIMUM_RECLAIM: &str = "evictionMinimumReclaim";
pub const EVICTION_MAX_POD_GRACE_PERIOD: &str = "evictionMaxPodGracePeriod";
pub const EVICTION_PRESSURE_TRANSITION_PERIOD: &str = "evictionPressureTransitionPeriod";
pub const MERGE_DEFAULT_EVICTION_SETTINGS: &str = "mergeDefaultEvictionSettings";
pub const ENFORCE_NODE_ALLOCATABLE: &str = "enforceNodeAllocatable";

/// The kubelet's `evictionPressureTransitionPeriod` default (also for a zero value).
pub const DEFAULT_PRESSURE_TRANSITION_PERIOD: Duration = Duration::from_secs(300);

/// A map or list setting as one layer gives it.
#[derive(Debug, Clone, PartialEq)]
pub enum Given<T> {
    /// The flag's text (also the environment variable's, or a string in reaplet's own file),
    /// parsed with the flag's syntax when the settings are resolved.
    Text(String),
    /// A file's mapping or list.
    Value(T),
}

/// Signal to value (a threshold, a grace period or a minimum reclaim).
pub type SignalMap = BTreeMap<String, String>;

/// The four map fields.
const MAPS: [&str; 4] = [
    EVICTION_HARD,
    EVICTION_SOFT,
    EVICTION_SOFT_GRACE_PERIOD,
    EVICTION_MINIMUM_RECLAIM,
];

fn map_slot<'a>(raw: &'a mut RawSettings, field: &str) -> Option<&'a mut Option<Given<SignalMap>>> {
    match field {
        EVICTION_HARD => Some(&mut raw.eviction_hard),
        EVICTION_SOFT => Some(&mut raw.eviction_soft),
        EVICTION_SOFT_GRACE_PERIOD => Some(&mut raw.eviction_soft_grace_period),
        EVICTION_MINIMUM_RECLAIM => Some(&mut raw.eviction_minimum_reclaim),
        _ => None,
    }
}

/// Whether `raw` sets `field` (one of the eviction fields).
fn sets(raw: &RawSettings, field: &str) -> bool {
    match field {
        EVICTION_HARD => raw.eviction_hard.is_some(),
        EVICTION_SOFT => raw.eviction_soft.is_some(),
        EVICTION_SOFT_GRACE_PERIOD => raw.eviction_soft_grace_period.is_some(),
        EVICTION_MINIMUM_RECLAIM => raw.eviction_minimum_reclaim.is_some(),
        EVICTION_MAX_POD_GRACE_PERIOD => raw.eviction_max_pod_grace_period.is_some(),
        EVICTION_PRESSURE_TRANSITION_PERIOD => raw.eviction_pressure_transition_period.is_some(),
        MERGE_DEFAULT_EVICTION_SETTINGS => raw.merge_default_eviction_settings.is_some(),
        ENFORCE_NODE_ALLOCATABLE => raw.enforce_node_allocatable.is_some(),
        _ => false,
    }
}

/// `raw` without the eviction fields (the kubelet's file's other fields are checked alone
/// first; these only once merged, since their rules span fields).
pub(super) fn without(mut raw: RawSettings) -> RawSettings {
    raw.eviction_hard = None;
    raw.eviction_soft = None;
    raw.eviction_soft_grace_period = None;
    raw.eviction_minimum_reclaim = None;
    raw.eviction_max_pod_grace_period = None;
    raw.eviction_pressure_transition_period = None;
    raw.merge_default_eviction_settings = None;
    raw.enforce_node_allocatable = None;
    raw
}

// ---------------------------------------------------------------------------------------------
// Flag syntax

/// `LangleSeparatedMapStringString` (`sep` `<`) and `MapStringString` (`sep` `=`): pairs split
/// on `,` (empty ones skipped), each on its first `sep`, key and value trimmed; a later key
/// wins.
fn flag_map(text: &str, sep: char) -> Result<SignalMap, String> {
    let mut map = SignalMap::new();
    for pair in text.split(',').filter(|p| !p.is_empty()) {
        let (k, v) = pair
            .split_once(sep)
            .ok_or_else(|| format!("{text:?}: malformed pair, expect string{sep}string"))?;
        map.insert(k.trim().to_owned(), v.trim().to_owned());
    }
    Ok(map)
}

/// `StringSlice`: `""` is the empty list, else the items between commas as written.
fn flag_list(text: &str) -> Vec<String> {
    if text.is_empty() {
        return Vec::new();
    }
    text.split(',').map(str::to_owned).collect()
}

/// `strconv.ParseInt(s, 0, 32)`, as the kubelet's `Int32` flag: a sign, a base prefix (`0x`,
/// `0o`, `0b`, or a leading `0` for octal), `_` between digits.
fn go_parse_int32(s: &str) -> Option<i32> {
    let (negative, body) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let lower = body.to_ascii_lowercase();
    let (radix, digits) = if let Some(d) = lower.strip_prefix("0x") {
        (16, d)
    } else if let Some(d) = lower.strip_prefix("0o") {
        (8, d)
    } else if let Some(d) = lower.strip_prefix("0b") {
        (2, d)
    } else if lower.len() > 1 && lower.starts_with('0') {
        (8, &lower[1..])
    } else {
        (10, lower.as_str())
    };
    if lower.contains('_') && !underscores_ok(&lower) {
        return None;
    }
    let digits: String = digits.chars().filter(|c| *c != '_').collect();
    if digits.is_empty() {
        return None;
    }
    let magnitude = u64::from_str_radix(&digits, radix).ok()?;
    let value = if negative {
        -i64::try_from(magnitude).ok()?
    } else {
        i64::try_from(magnitude).ok()?
    };
    i32::try_from(value).ok()
}

/// Go's `underscoreOK` (sign already taken off, lower-cased): each `_` between digits, or
/// between a base prefix and a digit.
fn underscores_ok(s: &str) -> bool {
    let b = s.as_bytes();
    // '^' start, '0' a digit or base prefix, '_' an underscore, '!' anything else
    let mut saw = b'^';
    let mut i = 0;
    let mut hex = false;
    if b.len() >= 2 && b[0] == b'0' && matches!(b[1], b'b' | b'o' | b'x') {
        i = 2;
        saw = b'0';
        hex = b[1] == b'x';
    }
    for &c in &b[i..] {
        if c.is_ascii_digit() || (hex && (b'a'..=b'f').contains(&c)) {
            saw = b'0';
        } else if c == b'_' {
            if saw != b'0' {
                return false;
            }
            saw = b'_';
        } else if saw == b'_' {
            return false;
        } else {
            saw = b'!';
        }
    }
    saw != b'_'
}

/// A Go duration's sign and size (reaplet's duration syntax after an optional sign).
fn signed_duration(v: &str) -> Result<(bool, Duration), String> {
    let t = v.trim();
    let (negative, rest) = match t.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, t.strip_prefix('+').unwrap_or(t)),
    };
    parse_duration(rest).map(|d| (negative, d))
}

// ---------------------------------------------------------------------------------------------
// Resolving

/// The eviction settings of one merged layer, parsed and validated as the kubelet does at
/// start. `kubelet`: the kubelet's file and reaplet's own settings over it; an error names
/// that file when reaplet's settings set none of the fields at fault.
pub(super) fn resolve(
    raw: &RawSettings,
    kubelet: Option<(&Path, &RawSettings)>,
) -> Result<PressureSettings, ConfigError> {
    resolve_fields(raw).map_err(|(e, at_fault)| match kubelet {
        Some((path, upper)) if !at_fault.iter().any(|f| sets(upper, f)) => at(e.field, path, e.why),
        _ => e,
    })
}

/// An error and the fields at fault.
type Blamed = (ConfigError, Vec<&'static str>);

fn resolve_fields(raw: &RawSettings) -> Result<PressureSettings, Blamed> {
    let alone = |e: ConfigError| {
        let field = e.field;
        (e, vec![field])
    };
    let map = |field: &'static str, given: &Option<Given<SignalMap>>| match given {
        None => Ok(None),
        Some(Given::Value(m)) => Ok(Some(m.clone())),
        Some(Given::Text(t)) => {
            let sep = if matches!(field, EVICTION_HARD | EVICTION_SOFT) {
                '<'
            } else {
                '='
            };
            flag_map(t, sep)
                .map(Some)
                .map_err(|why| alone(err(field, why)))
        }
    };
    let hard = map(EVICTION_HARD, &raw.eviction_hard)?;
    let soft = map(EVICTION_SOFT, &raw.eviction_soft)?;
    let grace = map(EVICTION_SOFT_GRACE_PERIOD, &raw.eviction_soft_grace_period)?;
    let reclaim = map(EVICTION_MINIMUM_RECLAIM, &raw.eviction_minimum_reclaim)?;
    let merge = super::values::boolean(
        MERGE_DEFAULT_EVICTION_SETTINGS,
        raw.merge_default_eviction_settings.clone(),
        false,
    )
    .map_err(alone)?;
    let enforce = match &raw.enforce_node_allocatable {
        None => vec![PODS.to_owned()],
        Some(Given::Text(t)) => flag_list(t),
        Some(Given::Value(list)) => list.clone(),
    };
    check_enforce_node_allocatable(&enforce)
        .map_err(|why| alone(err(ENFORCE_NODE_ALLOCATABLE, why)))?;
    let max_pod_grace_period = match &raw.eviction_max_pod_grace_period {
        None => 0,
        Some(v) => go_parse_int32(v.trim()).ok_or_else(|| {
            alone(err(
                EVICTION_MAX_POD_GRACE_PERIOD,
                format!("{v:?} is not a whole number of seconds (a 32-bit integer)"),
            ))
        })?,
    };
    let pressure_transition_period = match &raw.eviction_pressure_transition_period {
        None => DEFAULT_PRESSURE_TRANSITION_PERIOD,
        Some(v) => match signed_duration(v) {
            Err(why) => return Err(alone(err(EVICTION_PRESSURE_TRANSITION_PERIOD, why))),
            // the kubelet's defaulting: a zero value is 5m
            Ok((_, d)) if d.is_zero() => DEFAULT_PRESSURE_TRANSITION_PERIOD,
            // kept by the kubelet, and then holds no condition at all
            Ok((true, _)) => Duration::ZERO,
            Ok((false, d)) => d,
        },
    };
    let hard = thresholds::effective_hard(hard.as_ref(), merge, true);
    let thresholds = thresholds::parse_threshold_config(
        &enforce,
        &hard,
        &soft.unwrap_or_default(),
        &grace.unwrap_or_default(),
        &reclaim.unwrap_or_default(),
    )
    .map_err(|e| {
        let field = e.field().config_name();
        let at_fault = match e {
            // the soft threshold and the grace periods together
            ThresholdError::GracePeriodMissing { .. } => {
                vec![EVICTION_SOFT, EVICTION_SOFT_GRACE_PERIOD]
            }
            _ => vec![field],
        };
        (err(field, e.to_string()), at_fault)
    })?;
    Ok(PressureSettings {
        thresholds,
        max_pod_grace_period: i64::from(max_pod_grace_period),
        pressure_transition_period,
    })
}

/// `enforceNodeAllocatable`'s values (`kubetypes`' enforcement keys).
const PODS: &str = "pods";
const SYSTEM_RESERVED: &str = "system-reserved";
const SYSTEM_RESERVED_COMPRESSIBLE: &str = "system-reserved-compressible";
const KUBE_RESERVED: &str = "kube-reserved";
const KUBE_RESERVED_COMPRESSIBLE: &str = "kube-reserved-compressible";
const NONE: &str = "none";

/// `ValidateKubeletConfiguration`'s rules for `enforceNodeAllocatable`, with its texts (the
/// first error; the kubelet reports them all). Not checked here: the `*ReservedCgroup` a
/// reserved enforcement needs, and `cgroupsPerQOS` being on (reaplet reads neither reserved
/// cgroup, and enforces nothing: the value only decides the `allocatableMemory.available`
/// threshold).
fn check_enforce_node_allocatable(list: &[String]) -> Result<(), String> {
    const NAME: &str = "enforceNodeAllocatable (--enforce-node-allocatable)";
    let has = |key: &str| list.iter().any(|v| v == key);
    for (a, b) in [
        (SYSTEM_RESERVED, SYSTEM_RESERVED_COMPRESSIBLE),
        (KUBE_RESERVED, KUBE_RESERVED_COMPRESSIBLE),
    ] {
        if has(a) && has(b) {
            return Err(format!(
                "both {a:?} and {b:?} cannot be specified together in {NAME}"
            ));
        }
    }
    let mut seen = std::collections::BTreeSet::new();
    for v in list {
        if !seen.insert(v.as_str()) {
            return Err(format!("duplicated enforcements {v:?} in {NAME}"));
        }
        match v.as_str() {
            PODS
            | SYSTEM_RESERVED
            | SYSTEM_RESERVED_COMPRESSIBLE
            | KUBE_RESERVED
            | KUBE_RESERVED_COMPRESSIBLE => {}
            NONE if list.len() > 1 => {
                return Err(format!(
                    "{NAME} may not contain additional enforcements when {NONE:?} is specified"
                ));
            }
            NONE => {}
            other => {
                return Err(format!(
                    "option {other:?} specified for {NAME}. Valid options are {PODS:?}, \
                     {SYSTEM_RESERVED:?}, {SYSTEM_RESERVED_COMPRESSIBLE:?}, {KUBE_RESERVED:?}, \
                     {KUBE_RESERVED_COMPRESSIBLE:?} or {NONE:?}"
                ));
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Files

/// One of the map or list fields in reaplet's own file, into `raw`: a mapping (a list for
/// `enforceNodeAllocatable`) with scalars taken as text, or a string in the flag's syntax.
/// `false`: `key` is not one of them.
pub(super) fn from_own_file(
    key: &str,
    v: &Value,
    raw: &mut RawSettings,
) -> Result<bool, ConfigError> {
    let scalar = |v: &Value| match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    };
    if key == ENFORCE_NODE_ALLOCATABLE {
        raw.enforce_node_allocatable = match v {
            Value::Null => None,
            Value::String(s) => Some(Given::Text(s.clone())),
            Value::Array(items) => Some(Given::Value(
                items
                    .iter()
                    .enumerate()
                    .map(|(i, item)| {
                        scalar(item).ok_or_else(|| {
                            err(
                                ENFORCE_NODE_ALLOCATABLE,
                                format!("[{i}]: {item} must be a string"),
                            )
                        })
                    })
                    .collect::<Result<_, _>>()?,
            )),
            o => {
                return Err(err(
                    ENFORCE_NODE_ALLOCATABLE,
                    format!("{o} must be a list of strings"),
                ));
            }
        };
        return Ok(true);
    }
    let Some(&field) = MAPS.iter().find(|f| **f == key) else {
        return Ok(false);
    };
    let given = match v {
        Value::Null => None,
        Value::String(s) => Some(Given::Text(s.clone())),
        Value::Object(m) => Some(Given::Value(
            m.iter()
                .map(|(k, v)| {
                    scalar(v)
                        .map(|s| (k.clone(), s))
                        .ok_or_else(|| err(field, format!("{k}: {v} must be a string")))
                })
                .collect::<Result<_, _>>()?,
        )),
        o => {
            return Err(err(
                field,
                format!("{o} must be a mapping of signal to value"),
            ));
        }
    };
    if let Some(slot) = map_slot(raw, field) {
        *slot = given;
    }
    Ok(true)
}

/// One of the eviction fields of the kubelet's file, type-checked as the kubelet decodes it
/// (maps of strings, a list of strings, an `int32`, a duration string, a boolean), into `raw`.
/// `None`: `key` is not one of them; else the field when it sets something (absent, `0`, `0s`,
/// `false` and an empty map but `evictionHard`'s are the kubelet's defaults).
pub(super) fn from_kubelet(
    key: &str,
    v: &Value,
    path: &Path,
    raw: &mut RawSettings,
) -> Result<Option<Option<&'static str>>, ConfigError> {
    if let Some(&field) = MAPS.iter().find(|f| **f == key) {
        let map = match v {
            Value::Null => None,
            Value::Object(m) => Some(
                m.iter()
                    .map(|(k, v)| match v {
                        Value::String(s) => Ok((k.clone(), s.clone())),
                        o => Err(at(field, path, format!("{k}: {o} must be a string"))),
                    })
                    .collect::<Result<SignalMap, _>>()?,
            ),
            o => return Err(at(field, path, format!("{o} must be a mapping"))),
        };
        // `evictionHard: {}` is no hard threshold at all; the other maps' `{}` is their default
        let map = map.filter(|m| field == EVICTION_HARD || !m.is_empty());
        let set = map.is_some();
        if let Some(slot) = map_slot(raw, field) {
            *slot = map.map(Given::Value);
        }
        return Ok(Some(set.then_some(field)));
    }
    let used = match key {
        EVICTION_MAX_POD_GRACE_PERIOD => {
            const FIELD: &str = EVICTION_MAX_POD_GRACE_PERIOD;
            raw.eviction_max_pod_grace_period = match v {
                Value::Null => None,
                Value::Number(n) => match n.as_i64().and_then(|x| i32::try_from(x).ok()) {
                    Some(0) => None,
                    Some(x) => Some(x.to_string()),
                    None => return Err(at(FIELD, path, format!("{n} is not a 32-bit integer"))),
                },
                o => return Err(at(FIELD, path, format!("{o} must be a whole number"))),
            };
            raw.eviction_max_pod_grace_period.is_some().then_some(FIELD)
        }
        EVICTION_PRESSURE_TRANSITION_PERIOD => {
            const FIELD: &str = EVICTION_PRESSURE_TRANSITION_PERIOD;
            raw.eviction_pressure_transition_period = match v {
                Value::Null => None,
                Value::String(s) => match signed_duration(s) {
                    Err(why) => return Err(at(FIELD, path, why)),
                    Ok((_, d)) if d.is_zero() => None,
                    Ok(_) => Some(s.clone()),
                },
                o => {
                    return Err(at(
                        FIELD,
                        path,
                        format!("{o} must be a duration string like \"5m0s\""),
                    ));
                }
            };
            raw.eviction_pressure_transition_period
                .is_some()
                .then_some(FIELD)
        }
        MERGE_DEFAULT_EVICTION_SETTINGS => {
            const FIELD: &str = MERGE_DEFAULT_EVICTION_SETTINGS;
            raw.merge_default_eviction_settings = match v {
                Value::Null | Value::Bool(false) => None,
                Value::Bool(true) => Some("true".into()),
                o => return Err(at(FIELD, path, format!("{o} must be true or false"))),
            };
            raw.merge_default_eviction_settings
                .is_some()
                .then_some(FIELD)
        }
        ENFORCE_NODE_ALLOCATABLE => {
            const FIELD: &str = ENFORCE_NODE_ALLOCATABLE;
            let list: Option<Vec<String>> = match v {
                Value::Null => None,
                Value::Array(items) => Some(
                    items
                        .iter()
                        .enumerate()
                        .map(|(i, item)| match item {
                            Value::String(s) => Ok(s.clone()),
                            o => Err(at(FIELD, path, format!("[{i}]: {o} must be a string"))),
                        })
                        .collect::<Result<_, _>>()?,
                ),
                o => return Err(at(FIELD, path, format!("{o} must be a list"))),
            };
            // the kubelet's default, `[pods]`, sets nothing new; `[]` does (no enforcement)
            let used = list.as_ref().is_some_and(|l| l != &[PODS]);
            raw.enforce_node_allocatable = list.map(Given::Value);
            used.then_some(FIELD)
        }
        _ => return Ok(None),
    };
    Ok(Some(used))
}

#[cfg(test)]
#[path = "eviction_tests.rs"]
mod tests;
