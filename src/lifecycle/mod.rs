//! The pod lifecycle as data: kubelet's `podSyncStatus` and the state transitions of
//! `podWorkers.UpdatePod` / `podWorkerLoop` (`pod_workers.go`), as one enum and one pure step
//! function (no I/O, no clock: `now` is an argument), in the style of kube-runtime's watcher.
//!
//! Invariants:
//! * transitions only go forward: Sync → Terminating → Terminated → Finished;
//! * a termination starts only with [`Input::Kill`] (every reason to end a pod is a kill
//!   request, `workers::KillRequest`); [`Input::Update`] only records what the object says,
//!   and while terminating a shorter deletion grace restarts the kill (only-shorter);
//! * the effective grace only decreases; a shorter one arriving while terminating restarts the
//!   kill at once ([`Effect::StartKill`] with a new generation: the worker drops the old kill);
//! * completion of a superseded kill (older generation) is ignored;
//! * every reason to end the pod is kept ([`PodMachine::reasons`]); the first decides the
//!   status, and whichever brings the shortest grace sets the deadline;
//! * failures retry with capped exponential backoff; phase transitions act at once;
//! * once Finished, every input is ignored.

use crate::deadline::{Deadline, DeadlineOrigin};
use crate::terminating::grace;
use std::time::Duration;
use tokio::time::Instant;

/// Why a pod is being stopped (who ended it). Carried to status and events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KillReason {
    /// The API object has a deletionTimestamp (graceful delete, eviction, taint manager).
    Deleted,
    /// The API phase is already Failed/Succeeded.
    TerminalPhase,
    /// Every container exited and the restart policy will not restart them.
    Completed,
    /// The API object disappeared (force delete, or deleted while reaplet was down).
    ObjectGone,
    /// A static pod whose manifest file was removed.
    ManifestRemoved,
    /// A runtime pod no desired pod has.
    Orphan,
    /// An eviction source of this node decided it ([`crate::eviction`]): the API side (a
    /// DELETE, or an Eviction) is done; the pod ends at once instead of a watch round trip later.
    Evicted(EvictionSource),
    /// A kill of reaplet's own deciding, as the kubelet's own reasons to end a pod (graceful
    /// node shutdown, node-pressure eviction, an active deadline): who asked, the
    /// `DisruptionTarget` reason and the status's reason and message. Who asked decides how the
    /// terminal phase is set ([`Requester::phase_rule`]).
    Requested {
        by: Requester,
        disruption: Option<String>,
        reason: Option<String>,
        message: String,
    },
}

/// Which of reaplet's own reasons (the kubelet's) asked for a kill.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Requester {
    /// Graceful node shutdown ([`crate::shutdown`]).
    NodeShutdown,
    /// Node-pressure eviction ([`crate::pressure`]).
    NodePressure,
    /// `activeDeadlineSeconds` passed ([`crate::active_deadline`]).
    ActiveDeadline,
}

/// How a requested kill's terminal phase is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PhaseRule {
    /// `Failed`, with the request's reason and message, whatever the exit codes.
    Failed,
    /// From the exit codes, as `generateAPIPodStatus` computes it after the kill: the status
    /// function's `Failed` is cached when the kill starts and replaced by the exit codes'
    /// phase; its reason and message survive only when that phase is `Failed` too (the
    /// `DisruptionTarget` condition always does).
    FromExits,
}

impl Requester {
    /// A bounded label for logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NodeShutdown => "node_shutdown",
            Self::NodePressure => "node_pressure",
            Self::ActiveDeadline => "active_deadline",
        }
    }

    /// The kubelet's: an active deadline's `ShouldEvict` forces `Failed` on every status it
    /// generates; an eviction's status function runs once, when the kill starts. reaplet's
    /// graceful shutdown keeps `Failed` (the VM test's measured statuses).
    pub fn phase_rule(self) -> PhaseRule {
        match self {
            Self::NodeShutdown | Self::ActiveDeadline => PhaseRule::Failed,
            Self::NodePressure => PhaseRule::FromExits,
        }
    }
}

impl KillReason {
    /// A bounded label for logs and metrics.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Deleted => "deleted",
            Self::TerminalPhase => "terminal_phase",
            Self::Completed => "completed",
            Self::ObjectGone => "object_gone",
            Self::ManifestRemoved => "manifest_removed",
            Self::Orphan => "orphan",
            Self::Evicted(source) => source.as_str(),
            Self::Requested { by, .. } => by.as_str(),
        }
    }

    /// Who asked, for a termination's timeline: the API, an eviction source of this node,
    /// the runtime (orphans, completed containers), the manifest directory, or reaplet itself
    /// (a requested kill: shutdown, preemption).
    pub fn source(&self) -> &'static str {
        match self {
            Self::Deleted | Self::TerminalPhase | Self::ObjectGone => "api",
            Self::Completed | Self::Orphan => "runtime",
            Self::ManifestRemoved => "manifest",
            Self::Evicted(source) => source.as_str(),
            Self::Requested { .. } => "node",
        }
    }

    /// The reason of the `DisruptionTarget` condition this kill implies for the terminal
    /// status, if any (the API server writes its own for evictions and deletions).
    pub fn disruption_target(&self) -> Option<&str> {
        match self {
            Self::Requested { disruption, .. } => disruption.as_deref(),
            Self::Evicted(source) => Some(source.disruption_target()),
            Self::Deleted
            | Self::TerminalPhase
            | Self::Completed
            | Self::ObjectGone
            | Self::ManifestRemoved
            | Self::Orphan => None,
        }
    }
}

/// Which of this node's eviction sources ended a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EvictionSource {
    /// The NoExecute taint manager: a DELETE, as the controller manager's.
    TaintManager,
    /// Required node affinity no longer matching: an Eviction.
    NodeAffinity,
}

impl EvictionSource {
    pub const ALL: [EvictionSource; 2] = [Self::TaintManager, Self::NodeAffinity];

    /// A bounded label for logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::TaintManager => "taint_manager",
            Self::NodeAffinity => "node_affinity",
        }
    }

    /// The `DisruptionTarget` reason the API side wrote (the taint manager's own, or the
    /// Eviction API's).
    pub fn disruption_target(self) -> &'static str {
        match self {
            Self::TaintManager => "DeletionByTaintManager",
            Self::NodeAffinity => "EvictionByEvictionAPI",
        }
    }
}

/// The lifecycle's phase without its data: what `reaplet pods`, metrics and housekeeping
/// decide on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PodPhase {
    Sync,
    Terminating,
    Terminated,
    Finished,
}

impl PodPhase {
    pub const ALL: [PodPhase; 4] = [
        PodPhase::Sync,
        PodPhase::Terminating,
        PodPhase::Terminated,
        PodPhase::Finished,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Sync => "sync",
            Self::Terminating => "terminating",
            Self::Terminated => "terminated",
            Self::Finished => "finished",
        }
    }
}

/// Stages of the terminated (cleanup) phase, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CleanupStage {
    /// Wait until no volume of the pod is mounted.
    Volumes,
    /// Kill what is left in the pod cgroup and remove it.
    Cgroup,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Lifecycle {
    /// Running; reaplet only watches.
    Sync,
    /// Containers are being stopped with the machine's grace.
    Terminating {
        since: Instant,
        /// When the current kill attempt started (a shorter grace restarts it).
        attempt_started: Instant,
        /// Set while waiting to retry a failed kill.
        retry_pending: bool,
    },
    /// Containers and sandboxes are stopped; cleaning up.
    Terminated {
        since: Instant,
        stage: CleanupStage,
        retry_pending: bool,
    },
    /// Nothing is left to do for this UID.
    Finished { at: Instant },
}

impl Lifecycle {
    pub fn phase(&self) -> PodPhase {
        match self {
            Self::Sync => PodPhase::Sync,
            Self::Terminating { .. } => PodPhase::Terminating,
            Self::Terminated { .. } => PodPhase::Terminated,
            Self::Finished { .. } => PodPhase::Finished,
        }
    }

    pub fn name(&self) -> &'static str {
        self.phase().as_str()
    }
}

/// What the step function reacts to.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// The newest pod object from the source (only the fields the lifecycle needs).
    Update {
        deletion_requested: bool,
        deletion_grace: Option<i64>,
        terminal_phase: bool,
        spec_grace: Option<i64>,
    },
    /// Stop the pod, optionally with a shorter grace.
    Kill {
        grace_override: Option<i64>,
        reason: KillReason,
    },
    /// A kill attempt ended.
    KillDone { generation: u64, ok: bool },
    /// A cleanup stage ended.
    CleanupDone { stage: CleanupStage, ok: bool },
    /// The backoff timer fired.
    RetryDue,
}

/// What the worker must do after a step.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// Start (or restart, cancelling the in-flight one) the kill with this grace.
    StartKill {
        generation: u64,
        grace: i64,
    },
    StartCleanup(CleanupStage),
    /// Arm the retry timer.
    RetryAfter(Duration),
    /// Containers and sandboxes are stopped: complete the kill notices.
    KillComplete,
    /// Cleanup is done: the worker can end.
    Finished,
}

/// One pod's lifecycle state.
#[derive(Debug, Clone, PartialEq)]
pub struct PodMachine {
    pub lifecycle: Lifecycle,
    /// Effective grace held (None until termination starts). Only decreases.
    pub grace: Option<i64>,
    /// Who ended the pod (the first reason wins: it decides the terminal status).
    pub reason: Option<KillReason>,
    /// Every reason to end the pod that arrived, in order, each once (the log and
    /// `reaplet pods` show them all; the grace each brought only ever shortened the kill).
    pub reasons: Vec<KillReason>,
    pub spec_grace: Option<i64>,
    pub deletion_grace: Option<i64>,
    /// Consecutive failures of the current phase.
    pub failures: u32,
    /// Generation of the current kill attempt.
    pub generation: u64,
}

/// The retry delay after `failures` consecutive failures of a runtime step: the agent's one
/// backoff ([`crate::backoff::Policy::RUNTIME`], 1 s doubling to 30 s; the kubelet waits 10 s
/// between attempts, reaplet retries sooner, then backs off). At least the first step.
pub fn backoff(failures: u32) -> Duration {
    crate::backoff::Policy::RUNTIME.step(failures.max(1))
}

impl PodMachine {
    pub fn new(spec_grace: Option<i64>) -> Self {
        Self {
            lifecycle: Lifecycle::Sync,
            grace: None,
            reason: None,
            reasons: Vec::new(),
            spec_grace,
            deletion_grace: None,
            failures: 0,
            generation: 0,
        }
    }

    /// When the current kill sends SIGKILL at the latest (attempt start + grace, 2 s floor).
    pub fn kill_deadline(&self) -> Option<Deadline> {
        match (&self.lifecycle, self.grace) {
            (
                Lifecycle::Terminating {
                    attempt_started, ..
                },
                Some(g),
            ) => Some(Deadline::after(
                *attempt_started,
                grace::container_stop_timeout(g),
                DeadlineOrigin::Grace,
            )),
            _ => None,
        }
    }
}

/// Starts or shortens the termination. Returns the effects.
fn terminate(
    m: &mut PodMachine,
    grace_override: Option<i64>,
    reason: KillReason,
    now: Instant,
) -> Vec<Effect> {
    let g = grace::effective_grace(m.grace, m.deletion_grace, grace_override, m.spec_grace);
    if !matches!(m.lifecycle, Lifecycle::Finished { .. }) && !m.reasons.contains(&reason) {
        m.reasons.push(reason.clone());
    }
    match &mut m.lifecycle {
        Lifecycle::Sync => {
            m.grace = Some(g);
            m.reason.get_or_insert(reason);
            m.generation += 1;
            m.failures = 0;
            m.lifecycle = Lifecycle::Terminating {
                since: now,
                attempt_started: now,
                retry_pending: false,
            };
            vec![Effect::StartKill {
                generation: m.generation,
                grace: g,
            }]
        }
        Lifecycle::Terminating {
            attempt_started,
            retry_pending,
            ..
        } => {
            if m.grace.is_some_and(|held| g < held) {
                m.grace = Some(g);
                m.generation += 1;
                *attempt_started = now;
                *retry_pending = false;
                vec![Effect::StartKill {
                    generation: m.generation,
                    grace: g,
                }]
            } else {
                Vec::new()
            }
        }
        Lifecycle::Terminated { .. } | Lifecycle::Finished { .. } => Vec::new(),
    }
}

/// The pure step function.
pub fn step(m: &mut PodMachine, input: Input, now: Instant) -> Vec<Effect> {
    if matches!(m.lifecycle, Lifecycle::Finished { .. }) {
        return Vec::new();
    }
    match input {
        Input::Update {
            deletion_requested,
            deletion_grace,
            terminal_phase,
            spec_grace,
        } => {
            m.spec_grace = spec_grace;
            if deletion_grace.is_some() {
                m.deletion_grace = deletion_grace;
            }
            // the termination itself starts with the kill request the registry sends for a
            // deleted or terminal object; a shorter deletion grace arriving while terminating
            // restarts the kill at once
            let _ = terminal_phase;
            match (&m.lifecycle, deletion_requested) {
                (Lifecycle::Terminating { .. }, true) => {
                    let reason = m.reason.clone().unwrap_or(KillReason::Deleted);
                    terminate(m, None, reason, now)
                }
                _ => Vec::new(),
            }
        }
        Input::Kill {
            grace_override,
            reason,
        } => terminate(m, grace_override, reason, now),
        Input::KillDone { generation, ok } => {
            let Lifecycle::Terminating { retry_pending, .. } = &mut m.lifecycle else {
                return Vec::new();
            };
            if generation != m.generation || *retry_pending {
                return Vec::new(); // a superseded attempt
            }
            if ok {
                m.failures = 0;
                m.lifecycle = Lifecycle::Terminated {
                    since: now,
                    stage: CleanupStage::Volumes,
                    retry_pending: false,
                };
                vec![
                    Effect::KillComplete,
                    Effect::StartCleanup(CleanupStage::Volumes),
                ]
            } else {
                m.failures += 1;
                *retry_pending = true;
                vec![Effect::RetryAfter(backoff(m.failures))]
            }
        }
        Input::CleanupDone { stage, ok } => {
            let Lifecycle::Terminated {
                stage: current,
                retry_pending,
                ..
            } = &mut m.lifecycle
            else {
                return Vec::new();
            };
            if stage != *current || *retry_pending {
                return Vec::new();
            }
            if !ok {
                m.failures += 1;
                *retry_pending = true;
                return vec![Effect::RetryAfter(backoff(m.failures))];
            }
            m.failures = 0;
            match stage {
                CleanupStage::Volumes => {
                    *current = CleanupStage::Cgroup;
                    vec![Effect::StartCleanup(CleanupStage::Cgroup)]
                }
                CleanupStage::Cgroup => {
                    m.lifecycle = Lifecycle::Finished { at: now };
                    vec![Effect::Finished]
                }
            }
        }
        Input::RetryDue => match &mut m.lifecycle {
            Lifecycle::Terminating {
                retry_pending: r @ true,
                attempt_started,
                ..
            } => {
                *r = false;
                *attempt_started = now;
                m.generation += 1;
                let grace = m.grace.unwrap_or(1);
                vec![Effect::StartKill {
                    generation: m.generation,
                    grace,
                }]
            }
            Lifecycle::Terminated {
                retry_pending: r @ true,
                stage,
                ..
            } => {
                *r = false;
                vec![Effect::StartCleanup(*stage)]
            }
            _ => Vec::new(),
        },
    }
}

#[cfg(test)]
mod tests;
