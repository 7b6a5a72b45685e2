//! The eviction manager's decision pass as a pure step (kubelet counterpart:
//! `eviction_manager.go: synchronize`, with `helpers.go: thresholdsMet`,
//! `thresholdsFirstObservedAt`, `thresholdsMetGracePeriod`, `nodeConditions`,
//! `nodeConditionsObservedSince`, `getReclaimableThreshold`).
//!
//! One [`Manager::synchronize`] is one of the kubelet's passes: the observations in, the
//! threshold to reclaim (if any) and the node's pressure conditions out. No I/O and no clock:
//! `now` is an argument (the monotonic clock).
//!
//! Invariants, the kubelet's:
//! * a threshold is met when the signal's available amount is **strictly** below its quantity;
//! * minimum reclaim is hysteresis: a threshold met (after its grace) in the previous pass stays
//!   met until the available amount reaches the quantity plus its minimum reclaim;
//! * a soft threshold acts only once met continuously for its grace period (a pass that sees it
//!   unmet restarts the count); a hard one at once;
//! * a pressure condition holds from the first pass that sees its threshold met (before the
//!   grace) until `evictionPressureTransitionPeriod` after the last one;
//! * memory signals go before every other; one threshold is acted on per pass.
//!
//! Where the kubelet is random (Go map order picks which of two met memory signals is acted
//! on), reaplet takes the first in configuration order (hard before soft, `memory.available`
//! before its `allocatableMemory.available` copy). Signals reaplet does not evaluate (the disk
//! ones) are never met.

use super::signals::{Observation, Observations};
use super::thresholds::{Resource, Signal, Threshold};
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::time::Instant;

/// The eviction settings a [`Manager`] decides with.
#[derive(Debug, Clone, PartialEq)]
pub struct PressureSettings {
    /// Hard thresholds first, then soft ones, then the `allocatableMemory.available` copies.
    pub thresholds: Vec<Threshold>,
    /// `evictionMaxPodGracePeriod` (seconds): a soft eviction's grace.
    pub max_pod_grace_period: i64,
    /// `evictionPressureTransitionPeriod`.
    pub pressure_transition_period: Duration,
}

impl PressureSettings {
    /// Whether any threshold is of a signal reaplet evaluates.
    pub fn any_evaluated(&self) -> bool {
        self.thresholds.iter().any(|t| t.signal.evaluated())
    }
}

/// The kubelet's kill grace for hard evictions (`immediateEvictionGracePeriodSeconds`).
pub const HARD_EVICTION_GRACE: i64 = 1;

/// A node pressure condition (`v1.NodeConditionType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NodeCondition {
    MemoryPressure,
    DiskPressure,
    PidPressure,
}

impl NodeCondition {
    pub const ALL: [NodeCondition; 3] = [
        NodeCondition::MemoryPressure,
        NodeCondition::DiskPressure,
        NodeCondition::PidPressure,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::MemoryPressure => "MemoryPressure",
            Self::DiskPressure => "DiskPressure",
            Self::PidPressure => "PIDPressure",
        }
    }

    /// The condition a signal's threshold raises (`signalToNodeCondition`).
    pub fn of(signal: Signal) -> NodeCondition {
        match signal.resource() {
            Resource::Memory => Self::MemoryPressure,
            Resource::Pids => Self::PidPressure,
            Resource::EphemeralStorage | Resource::Inodes => Self::DiskPressure,
        }
    }
}

/// The threshold a pass acts on: what to reclaim and the figures for the message.
#[derive(Debug, Clone, PartialEq)]
pub struct Reclaim {
    /// Index into [`PressureSettings::thresholds`].
    pub threshold: usize,
    pub signal: Signal,
    pub resource: Resource,
    pub hard: bool,
    /// The threshold's quantity as the kubelet prints it (`Threshold quantity: 1Gi`).
    pub quantity_text: String,
    pub observed: Observation,
}

/// What one pass decided.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Pass {
    /// The thresholds met in this pass, before their grace periods (indices).
    pub met: Vec<usize>,
    /// The node's pressure conditions (held for the transition period).
    pub conditions: Vec<NodeCondition>,
    /// The threshold to reclaim, if one is met past its grace.
    pub reclaim: Option<Reclaim>,
}

/// The eviction manager's memory between passes.
#[derive(Debug, Clone)]
pub struct Manager {
    settings: PressureSettings,
    /// Thresholds met past their grace in the previous pass (minimum reclaim applies to them).
    met_after_grace: Vec<usize>,
    /// When each currently met threshold was first seen met.
    first_observed: BTreeMap<usize, Instant>,
    /// When each condition was last seen.
    condition_seen: BTreeMap<NodeCondition, Instant>,
}

fn observation(obs: &Observations, signal: Signal) -> Option<Observation> {
    match signal {
        Signal::MemoryAvailable => obs.memory,
        Signal::AllocatableMemoryAvailable => obs.allocatable_memory,
        Signal::PidAvailable => obs.pid,
        _ => None,
    }
}

impl Manager {
    pub fn new(settings: PressureSettings) -> Manager {
        Manager {
            settings,
            met_after_grace: Vec::new(),
            first_observed: BTreeMap::new(),
            condition_seen: BTreeMap::new(),
        }
    }

    pub fn settings(&self) -> &PressureSettings {
        &self.settings
    }

    /// `thresholdsMet`: the thresholds among `which` whose signal is below the quantity (plus
    /// the minimum reclaim with `min_reclaim`).
    fn met(
        &self,
        which: impl Iterator<Item = usize>,
        obs: &Observations,
        min_reclaim: bool,
    ) -> Vec<usize> {
        which
            .filter(|&i| {
                let t = &self.settings.thresholds[i];
                if !t.signal.evaluated() {
                    return false;
                }
                let Some(o) = observation(obs, t.signal) else {
                    return false;
                };
                let mut q = i128::from(t.quantity(o.capacity));
                if min_reclaim {
                    q += i128::from(t.min_reclaim_quantity(o.capacity));
                }
                i128::from(o.available) < q
            })
            .collect()
    }

    /// One pass (`synchronize` up to the choice of the threshold to reclaim).
    pub fn synchronize(&mut self, now: Instant, obs: &Observations) -> Pass {
        let n = self.settings.thresholds.len();
        let mut met = self.met(0..n, obs, false);
        // minimum reclaim: what was met past its grace stays met until the reclaim is done
        let held = self.met(self.met_after_grace.clone().into_iter(), obs, true);
        for i in held {
            if !met.contains(&i) {
                met.push(i);
            }
        }
        met.sort_unstable();
        // first seen: kept for the thresholds still met, now for new ones, the rest dropped
        let first: BTreeMap<usize, Instant> = met
            .iter()
            .map(|&i| (i, self.first_observed.get(&i).copied().unwrap_or(now)))
            .collect();
        self.first_observed = first;
        for &i in &met {
            self.condition_seen
                .insert(NodeCondition::of(self.settings.thresholds[i].signal), now);
        }
        let period = self.settings.pressure_transition_period;
        self.condition_seen
            .retain(|_, seen| now.saturating_duration_since(*seen) < period);
        let conditions = self.condition_seen.keys().copied().collect();
        let after_grace: Vec<usize> = met
            .iter()
            .copied()
            .filter(|i| {
                let since = self.first_observed[i];
                now.saturating_duration_since(since) >= self.settings.thresholds[*i].grace_period
            })
            .collect();
        self.met_after_grace = after_grace.clone();
        // byEvictionPriority: memory first, then the rest, each in configuration order
        let chosen = after_grace
            .iter()
            .copied()
            .find(|&i| self.settings.thresholds[i].signal.is_memory())
            .or_else(|| after_grace.first().copied());
        let reclaim = chosen.and_then(|i| {
            let t = &self.settings.thresholds[i];
            let observed = observation(obs, t.signal)?;
            Some(Reclaim {
                threshold: i,
                signal: t.signal,
                resource: t.signal.resource(),
                hard: t.is_hard(),
                quantity_text: t.threshold_quantity_text(observed.capacity),
                observed,
            })
        });
        Pass {
            met,
            conditions,
            reclaim,
        }
    }

    /// The grace an evicted pod gets: 1 s for a hard threshold; for a soft one
    /// `evictionMaxPodGracePeriod`, or the pod's own grace when shorter.
    pub fn pod_grace(&self, reclaim: &Reclaim, spec_grace: Option<i64>) -> i64 {
        if reclaim.hard {
            return HARD_EVICTION_GRACE;
        }
        let max = self.settings.max_pod_grace_period;
        match spec_grace {
            Some(g) => max.min(g),
            None => max,
        }
    }
}

#[cfg(test)]
#[path = "manager_tests.rs"]
mod tests;
