//! The kubelet's eviction thresholds: its nine signals, a threshold's value (a quantity, or a
//! percentage of the signal's capacity), and the four eviction settings parsed and validated
//! as the kubelet parses them at start (kubelet counterpart: `pkg/kubelet/eviction/api/types.go`,
//! `helpers.go: ParseThresholdConfig`, `defaults_linux.go`, and the defaulting of `evictionHard`
//! in `cmd/kubelet/app/server.go: loadConfigFile`; v1.36).
//!
//! Invariants:
//! * a setting the kubelet accepts is accepted and one it refuses is refused, with the
//!   kubelet's own error text (Go's `strconv.ParseFloat` and `time.ParseDuration` texts
//!   included); each error names the setting it came from ([`Field`]), so the configuration
//!   layer can name the field;
//! * thresholds come out in the kubelet's order: hard, then soft, then one
//!   `allocatableMemory.available` copy per hard `memory.available` threshold when
//!   `enforceNodeAllocatable` has `pods`; where the kubelet walks a Go map (a random order, so a
//!   random one of several bad entries is reported), reaplet walks the keys in sorted order;
//! * a percentage is the `float32` Go parses, divided by 100 in `float32`, and its quantity is
//!   the product in `float64` truncated as amd64 truncates (NaN and overflow give `MinInt64`),
//!   so every threshold is the kubelet's to the byte;
//! * a threshold's quantity prints as the kubelet prints it (`resource.Quantity.String()`):
//!   the text as written when upstream keeps it, else the canonical form in the quantity's own
//!   format; a percentage's quantity in `BinarySI`.

use super::goparse::{FloatError, go_parse_duration, go_parse_f32, go_quote};
use super::quantity_text::quantity_string;
pub use super::quantity_text::{format_as, format_bytes_binary};
use crate::drain::quantity::{Quantity, QuantityError};
use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

/// An eviction signal (`evictionapi.Signal`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Signal {
    MemoryAvailable,
    AllocatableMemoryAvailable,
    NodeFsAvailable,
    NodeFsInodesFree,
    ImageFsAvailable,
    ImageFsInodesFree,
    ContainerFsAvailable,
    ContainerFsInodesFree,
    PidAvailable,
}

impl Signal {
    /// Every signal the kubelet knows (`validSignal`).
    pub const ALL: [Signal; 9] = [
        Signal::MemoryAvailable,
        Signal::AllocatableMemoryAvailable,
        Signal::NodeFsAvailable,
        Signal::NodeFsInodesFree,
        Signal::ImageFsAvailable,
        Signal::ImageFsInodesFree,
        Signal::ContainerFsAvailable,
        Signal::ContainerFsInodesFree,
        Signal::PidAvailable,
    ];

    /// The signal's name in settings and messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Signal::MemoryAvailable => "memory.available",
            Signal::AllocatableMemoryAvailable => "allocatableMemory.available",
            Signal::NodeFsAvailable => "nodefs.available",
            Signal::NodeFsInodesFree => "nodefs.inodesFree",
            Signal::ImageFsAvailable => "imagefs.available",
            Signal::ImageFsInodesFree => "imagefs.inodesFree",
            Signal::ContainerFsAvailable => "containerfs.available",
            Signal::ContainerFsInodesFree => "containerfs.inodesFree",
            Signal::PidAvailable => "pid.available",
        }
    }

    /// The signal of a name (exact, case-sensitive), `None` for a name the kubelet refuses.
    pub fn parse(s: &str) -> Option<Signal> {
        Signal::ALL.into_iter().find(|sig| sig.as_str() == s)
    }

    /// The resource a threshold of this signal reclaims (`signalToResource`).
    pub fn resource(self) -> Resource {
        match self {
            Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable => Resource::Memory,
            Signal::NodeFsAvailable | Signal::ImageFsAvailable | Signal::ContainerFsAvailable => {
                Resource::EphemeralStorage
            }
            Signal::NodeFsInodesFree
            | Signal::ImageFsInodesFree
            | Signal::ContainerFsInodesFree => Resource::Inodes,
            Signal::PidAvailable => Resource::Pids,
        }
    }

    /// Whether reaplet observes this signal (the memory and PID ones; the disk signals are
    /// parsed so any kubelet file loads, but never evaluated).
    pub fn evaluated(self) -> bool {
        matches!(
            self,
            Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable | Signal::PidAvailable
        )
    }

    /// `memory.available` or `allocatableMemory.available` (first in `byEvictionPriority`).
    pub fn is_memory(self) -> bool {
        matches!(
            self,
            Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable
        )
    }
}

impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The resource a signal's pressure is about, with the kubelet's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Resource {
    Memory,
    EphemeralStorage,
    Inodes,
    Pids,
}

impl Resource {
    pub fn as_str(self) -> &'static str {
        match self {
            Resource::Memory => "memory",
            Resource::EphemeralStorage => "ephemeral-storage",
            Resource::Inodes => "inodes",
            Resource::Pids => "pids",
        }
    }
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A threshold's (or a minimum reclaim's) value (`evictionapi.ThresholdValue`).
#[derive(Debug, Clone)]
pub enum ThresholdValue {
    Quantity(Quantity),
    /// A fraction of the capacity (`10%` is 0.1), as Go's `float32`.
    Percentage(f32),
}

impl ThresholdValue {
    /// `GetThresholdQuantity` in whole units: a quantity's `Value()`, or the percentage of
    /// `capacity`.
    pub fn quantity(&self, capacity: i64) -> i64 {
        match self {
            ThresholdValue::Quantity(q) => q.value(),
            ThresholdValue::Percentage(p) => percent_of(capacity, *p),
        }
    }
}

/// `compareThresholdValue`: quantities by exact value, percentages by `float32` equality (so a
/// NaN percentage equals nothing, as in Go).
impl PartialEq for ThresholdValue {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (ThresholdValue::Quantity(a), ThresholdValue::Quantity(b)) => {
                a.cmp_value(b) == Ordering::Equal
            }
            (ThresholdValue::Percentage(a), ThresholdValue::Percentage(b)) => a == b,
            _ => false,
        }
    }
}

/// 2^63 as a float: the first value past `int64`.
const TWO_POW_63: f64 = 9_223_372_036_854_775_808.0;

/// `int64(float64(capacity) * float64(pct))`: truncated; NaN and out-of-range products give
/// `MinInt64`, what the conversion gives on amd64 (Rust's `as` would saturate instead).
fn percent_of(capacity: i64, pct: f32) -> i64 {
    let product = capacity as f64 * f64::from(pct);
    if product.is_nan() || !(-TWO_POW_63..TWO_POW_63).contains(&product) {
        i64::MIN
    } else {
        product as i64
    }
}

/// One eviction threshold (`evictionapi.Threshold`; the operator is always `LessThan`).
#[derive(Debug, Clone)]
pub struct Threshold {
    pub signal: Signal,
    pub value: ThresholdValue,
    /// Zero for a hard threshold (and for a soft one whose grace is `0s`, as in the kubelet).
    pub grace_period: Duration,
    pub min_reclaim: Option<ThresholdValue>,
    /// The value as configured (`100Mi`, `10%`), for the quantity as the kubelet prints it.
    pub value_text: String,
    /// The minimum reclaim as configured.
    pub min_reclaim_text: Option<String>,
}

impl Threshold {
    /// `isHardEvictionThreshold`: no grace period.
    pub fn is_hard(&self) -> bool {
        self.grace_period.is_zero()
    }

    /// The threshold's quantity against the signal's capacity (`GetThresholdQuantity`).
    pub fn quantity(&self, capacity: i64) -> i64 {
        self.value.quantity(capacity)
    }

    /// The minimum reclaim's quantity against the same capacity, 0 when none is set.
    pub fn min_reclaim_quantity(&self, capacity: i64) -> i64 {
        self.min_reclaim
            .as_ref()
            .map_or(0, |value| value.quantity(capacity))
    }

    /// `GetThresholdQuantity(...).String()`, as the eviction message prints it: a quantity as
    /// upstream prints the parsed text (`1Gi`, `1500k`), a percentage's quantity in `BinarySI`.
    pub fn threshold_quantity_text(&self, capacity: i64) -> String {
        match &self.value {
            ThresholdValue::Quantity(_) => quantity_string(&self.value_text),
            ThresholdValue::Percentage(p) => format_bytes_binary(percent_of(capacity, *p)),
        }
    }
}

/// `hasThreshold`'s sameness (used by `mergeThresholds`): signal, operator (always the same),
/// value and grace period; the minimum reclaim and the texts do not count.
impl PartialEq for Threshold {
    fn eq(&self, other: &Self) -> bool {
        self.signal == other.signal
            && self.grace_period == other.grace_period
            && self.value == other.value
    }
}

// ---------------------------------------------------------------------------------------------
// Defaults

/// The kubelet's Linux `evictionHard` defaults (`DefaultEvictionHard`; no `pid.available`).
pub const DEFAULT_EVICTION_HARD: [(&str, &str); 5] = [
    ("memory.available", "100Mi"),
    ("nodefs.available", "10%"),
    ("nodefs.inodesFree", "5%"),
    ("imagefs.available", "15%"),
    ("imagefs.inodesFree", "5%"),
];

/// The `evictionHard` map the kubelet runs with. The defaults apply only when a config file is
/// loaded (`loadConfigFile`): no map there gives the defaults; a map with
/// `mergeDefaultEvictionSettings` gains the default keys it lacks (its own keys win); a map
/// without it is used as is (`{}` is no hard threshold at all). Without a config file (flags
/// only) there are no defaults: the configured map or nothing.
pub fn effective_hard(
    configured: Option<&BTreeMap<String, String>>,
    merge_defaults: bool,
    from_file: bool,
) -> BTreeMap<String, String> {
    let defaults = || {
        DEFAULT_EVICTION_HARD
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
    };
    match (from_file, configured) {
        (false, configured) => configured.cloned().unwrap_or_default(),
        (true, None) => defaults().collect(),
        (true, Some(map)) if merge_defaults => {
            let mut merged = map.clone();
            for (k, v) in defaults() {
                merged.entry(k).or_insert(v);
            }
            merged
        }
        (true, Some(map)) => map.clone(),
    }
}

// ---------------------------------------------------------------------------------------------
// Parsing and validation

/// The setting an error comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Field {
    Hard,
    Soft,
    SoftGracePeriod,
    MinimumReclaim,
}

impl Field {
    /// The `KubeletConfiguration` key.
    pub fn config_name(self) -> &'static str {
        match self {
            Field::Hard => "evictionHard",
            Field::Soft => "evictionSoft",
            Field::SoftGracePeriod => "evictionSoftGracePeriod",
            Field::MinimumReclaim => "evictionMinimumReclaim",
        }
    }
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.config_name())
    }
}

/// Why the eviction settings are refused; the text is the kubelet's.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ThresholdError {
    #[error("unsupported eviction signal {signal}")]
    UnsupportedSignal { field: Field, signal: String },
    /// `strconv.ParseFloat` of a percentage without its `%`s: not a number.
    #[error("strconv.ParseFloat: parsing {}: invalid syntax", go_quote(.text))]
    PercentageSyntax { field: Field, text: String },
    /// `strconv.ParseFloat` of a percentage: beyond `float32`.
    #[error("strconv.ParseFloat: parsing {}: value out of range", go_quote(.text))]
    PercentageRange { field: Field, text: String },
    #[error("eviction percentage threshold {signal} must be >= 0%: {value}")]
    PercentageBelowZero {
        field: Field,
        signal: Signal,
        value: String,
    },
    #[error("eviction percentage threshold {signal} must be <= 100%: {value}")]
    PercentageAbove100 {
        field: Field,
        signal: Signal,
        value: String,
    },
    /// `resource.ParseQuantity`'s error.
    #[error("{error}")]
    Quantity { field: Field, error: QuantityError },
    /// A threshold quantity of zero or less; `quantity` as upstream prints it.
    #[error("eviction threshold {signal} must be positive: {quantity}")]
    NotPositive {
        field: Field,
        signal: Signal,
        quantity: String,
    },
    /// `time.ParseDuration`'s error (`time: invalid duration "x"`).
    #[error("{message}")]
    Duration { field: Field, message: String },
    #[error("invalid eviction grace period specified: {value}, must be a positive value")]
    NegativeGracePeriod { field: Field, value: String },
    #[error("eviction percentage minimum reclaim {signal} must be positive: {value}")]
    MinReclaimPercentageNotPositive {
        field: Field,
        signal: Signal,
        value: String,
    },
    #[error("negative eviction minimum reclaim specified for {signal}")]
    NegativeMinReclaim { field: Field, signal: Signal },
    /// A soft threshold without its `evictionSoftGracePeriod` entry.
    #[error("grace period must be specified for the soft eviction threshold {signal}")]
    GracePeriodMissing { field: Field, signal: Signal },
}

impl ThresholdError {
    /// The setting at fault.
    pub fn field(&self) -> Field {
        match self {
            ThresholdError::UnsupportedSignal { field, .. }
            | ThresholdError::PercentageSyntax { field, .. }
            | ThresholdError::PercentageRange { field, .. }
            | ThresholdError::PercentageBelowZero { field, .. }
            | ThresholdError::PercentageAbove100 { field, .. }
            | ThresholdError::Quantity { field, .. }
            | ThresholdError::NotPositive { field, .. }
            | ThresholdError::Duration { field, .. }
            | ThresholdError::NegativeGracePeriod { field, .. }
            | ThresholdError::MinReclaimPercentageNotPositive { field, .. }
            | ThresholdError::NegativeMinReclaim { field, .. }
            | ThresholdError::GracePeriodMissing { field, .. } => *field,
        }
    }
}

/// `ParseThresholdConfig`: hard thresholds, then soft ones (each with its grace period), every
/// threshold of a signal with that signal's minimum reclaim, then, when
/// `enforce_node_allocatable` has `pods`, an `allocatableMemory.available` copy of each hard
/// `memory.available` threshold. The first error ends the parse. `0%` and `100%` (exactly)
/// drop a threshold. Maps are walked in key order (the kubelet's order is random).
pub fn parse_threshold_config(
    enforce_node_allocatable: &[String],
    hard: &BTreeMap<String, String>,
    soft: &BTreeMap<String, String>,
    soft_grace: &BTreeMap<String, String>,
    min_reclaim: &BTreeMap<String, String>,
) -> Result<Vec<Threshold>, ThresholdError> {
    let mut results = parse_statements(hard, Field::Hard)?;
    let mut soft_thresholds = parse_statements(soft, Field::Soft)?;
    let grace_periods = parse_grace_periods(soft_grace)?;
    let reclaims = parse_minimum_reclaims(min_reclaim)?;
    for t in &mut soft_thresholds {
        t.grace_period =
            *grace_periods
                .get(&t.signal)
                .ok_or(ThresholdError::GracePeriodMissing {
                    field: Field::SoftGracePeriod,
                    signal: t.signal,
                })?;
    }
    results.extend(soft_thresholds);
    for t in &mut results {
        if let Some((value, text)) = reclaims.get(&t.signal) {
            t.min_reclaim = Some(value.clone());
            t.min_reclaim_text = Some(text.clone());
        }
    }
    if enforce_node_allocatable.iter().any(|key| key == "pods") {
        let copies: Vec<Threshold> = results
            .iter()
            .filter(|t| t.signal == Signal::MemoryAvailable && t.is_hard())
            .map(|t| Threshold {
                signal: Signal::AllocatableMemoryAvailable,
                grace_period: Duration::ZERO,
                ..t.clone()
            })
            .collect();
        results.extend(copies);
    }
    Ok(results)
}

fn unsupported(field: Field, signal: &str) -> ThresholdError {
    ThresholdError::UnsupportedSignal {
        field,
        signal: signal.to_string(),
    }
}

/// `parseThresholdStatements`.
fn parse_statements(
    statements: &BTreeMap<String, String>,
    field: Field,
) -> Result<Vec<Threshold>, ThresholdError> {
    let mut out = Vec::new();
    for (key, value) in statements {
        if let Some(t) = parse_statement(key, value, field)? {
            out.push(t);
        }
    }
    Ok(out)
}

/// `parseThresholdStatement`: one threshold, or `None` for `0%` and `100%`.
fn parse_statement(
    key: &str,
    value: &str,
    field: Field,
) -> Result<Option<Threshold>, ThresholdError> {
    let signal = Signal::parse(key).ok_or_else(|| unsupported(field, key))?;
    let parsed = if value.ends_with('%') {
        if value == "0%" || value == "100%" {
            return Ok(None);
        }
        let pct = parse_percentage(value, field)?;
        if pct < 0.0 {
            return Err(ThresholdError::PercentageBelowZero {
                field,
                signal,
                value: value.to_string(),
            });
        }
        if pct > 1.0 {
            return Err(ThresholdError::PercentageAbove100 {
                field,
                signal,
                value: value.to_string(),
            });
        }
        ThresholdValue::Percentage(pct)
    } else {
        let q =
            Quantity::parse(value).map_err(|error| ThresholdError::Quantity { field, error })?;
        if q.cmp_value(&Quantity::default()) != Ordering::Greater {
            return Err(ThresholdError::NotPositive {
                field,
                signal,
                quantity: quantity_string(value),
            });
        }
        ThresholdValue::Quantity(q)
    };
    Ok(Some(Threshold {
        signal,
        value: parsed,
        grace_period: Duration::ZERO,
        min_reclaim: None,
        value_text: value.to_string(),
        min_reclaim_text: None,
    }))
}

/// `parsePercentage`: every trailing `%` removed, `ParseFloat(_, 32)`, then `/ 100` in
/// `float32`.
fn parse_percentage(value: &str, field: Field) -> Result<f32, ThresholdError> {
    let text = value.trim_end_matches('%');
    match go_parse_f32(text) {
        Ok(v) => Ok(v / 100.0),
        Err(FloatError::Syntax) => Err(ThresholdError::PercentageSyntax {
            field,
            text: text.to_string(),
        }),
        Err(FloatError::Range) => Err(ThresholdError::PercentageRange {
            field,
            text: text.to_string(),
        }),
    }
}

/// `parseGracePeriods`: Go durations; zero is accepted, a negative one is not.
fn parse_grace_periods(
    statements: &BTreeMap<String, String>,
) -> Result<BTreeMap<Signal, Duration>, ThresholdError> {
    let field = Field::SoftGracePeriod;
    let mut out = BTreeMap::new();
    for (key, value) in statements {
        let signal = Signal::parse(key).ok_or_else(|| unsupported(field, key))?;
        let nanos = go_parse_duration(value)
            .map_err(|message| ThresholdError::Duration { field, message })?;
        if nanos < 0 {
            return Err(ThresholdError::NegativeGracePeriod {
                field,
                value: value.clone(),
            });
        }
        out.insert(signal, Duration::from_nanos(nanos.unsigned_abs()));
    }
    Ok(out)
}

/// `parseMinimumReclaims`: a percentage must be above zero (no upper bound); a quantity must
/// not be negative (zero is accepted). Each value is kept with its text.
fn parse_minimum_reclaims(
    statements: &BTreeMap<String, String>,
) -> Result<BTreeMap<Signal, (ThresholdValue, String)>, ThresholdError> {
    let field = Field::MinimumReclaim;
    let mut out = BTreeMap::new();
    for (key, value) in statements {
        let signal = Signal::parse(key).ok_or_else(|| unsupported(field, key))?;
        let parsed = if value.ends_with('%') {
            let pct = parse_percentage(value, field)?;
            // `<= 0` is false for NaN: Go accepts "nan%" here too
            if pct <= 0.0 {
                return Err(ThresholdError::MinReclaimPercentageNotPositive {
                    field,
                    signal,
                    value: value.clone(),
                });
            }
            ThresholdValue::Percentage(pct)
        } else {
            let q = Quantity::parse(value)
                .map_err(|error| ThresholdError::Quantity { field, error })?;
            if q.cmp_value(&Quantity::default()) == Ordering::Less {
                return Err(ThresholdError::NegativeMinReclaim { field, signal });
            }
            ThresholdValue::Quantity(q)
        };
        out.insert(signal, (parsed, value.clone()));
    }
    Ok(out)
}

#[cfg(test)]
#[path = "thresholds_tests.rs"]
mod tests;
