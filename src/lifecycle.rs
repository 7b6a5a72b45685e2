//! The pod lifecycle as data: kubelet's `podSyncStatus` and the state transitions of
//! `podWorkers.UpdatePod` / `podWorkerLoop` (`pod_workers.go`), as one enum and one pure step
//! function (no I/O, no clock: `now` is an argument), in the style of kube-runtime's watcher.
//!
//! Invariants:
//! * transitions only go forward: Sync → Terminating → Terminated → Finished;
//! * the effective grace only decreases; a shorter one arriving while terminating restarts the
//!   kill at once ([`Effect::StartKill`] with a new generation: the worker drops the old kill);
//! * completion of a superseded kill (older generation) is ignored;
//! * failures retry with capped exponential backoff; phase transitions act at once;
//! * once Finished, every input is ignored.

use crate::grace;
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
    /// A runtime pod no desired pod has.
    Orphan,
    /// A kill through the library API (eviction, node shutdown, preemption): the
    /// `DisruptionTarget` reason and a message for the status.
    Requested {
        disruption: Option<String>,
        reason: Option<String>,
        message: String,
    },
}

impl KillReason {
    /// A bounded label for logs and metrics.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Deleted => "deleted",
            Self::TerminalPhase => "terminal_phase",
            Self::Completed => "completed",
            Self::ObjectGone => "object_gone",
            Self::Orphan => "orphan",
            Self::Requested { .. } => "requested",
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
    pub fn name(&self) -> &'static str {
        match self {
            Self::Sync => "sync",
            Self::Terminating { .. } => "terminating",
            Self::Terminated { .. } => "terminated",
            Self::Finished { .. } => "finished",
        }
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
    /// Who ended the pod (the first reason wins).
    pub reason: Option<KillReason>,
    pub spec_grace: Option<i64>,
    pub deletion_grace: Option<i64>,
    /// Consecutive failures of the current phase.
    pub failures: u32,
    /// Generation of the current kill attempt.
    pub generation: u64,
}

/// First retry delay, and the cap (the kubelet waits 10 s between attempts; reaplet retries
/// sooner, then backs off).
pub const RETRY_BASE: Duration = Duration::from_secs(1);
pub const RETRY_MAX: Duration = Duration::from_secs(30);

pub fn backoff(failures: u32) -> Duration {
    let exp = failures.saturating_sub(1).min(16);
    RETRY_BASE.saturating_mul(1 << exp).min(RETRY_MAX)
}

impl PodMachine {
    pub fn new(spec_grace: Option<i64>) -> Self {
        Self {
            lifecycle: Lifecycle::Sync,
            grace: None,
            reason: None,
            spec_grace,
            deletion_grace: None,
            failures: 0,
            generation: 0,
        }
    }

    /// When the current kill sends SIGKILL at the latest (attempt start + grace, 2 s floor).
    pub fn kill_deadline(&self) -> Option<Instant> {
        match (&self.lifecycle, self.grace) {
            (
                Lifecycle::Terminating {
                    attempt_started, ..
                },
                Some(g),
            ) => Some(*attempt_started + grace::as_duration(grace::container_stop_timeout(g))),
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
            if deletion_requested {
                terminate(m, None, KillReason::Deleted, now)
            } else if terminal_phase {
                terminate(m, None, KillReason::TerminalPhase, now)
            } else {
                Vec::new()
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
mod tests {
    use super::*;

    fn upd(del: bool, dg: Option<i64>, terminal: bool, spec: Option<i64>) -> Input {
        Input::Update {
            deletion_requested: del,
            deletion_grace: dg,
            terminal_phase: terminal,
            spec_grace: spec,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn plain_update_stays_in_sync() {
        let mut m = PodMachine::new(Some(30));
        let now = Instant::now();
        assert!(step(&mut m, upd(false, None, false, Some(30)), now).is_empty());
        assert_eq!(m.lifecycle, Lifecycle::Sync);
    }

    #[tokio::test(start_paused = true)]
    async fn full_happy_path() {
        let mut m = PodMachine::new(Some(30));
        let t0 = Instant::now();
        let e = step(&mut m, upd(true, Some(10), false, Some(30)), t0);
        assert_eq!(
            e,
            vec![Effect::StartKill {
                generation: 1,
                grace: 10
            }]
        );
        assert_eq!(m.reason, Some(KillReason::Deleted));
        assert_eq!(m.kill_deadline(), Some(t0 + Duration::from_secs(10)));
        tokio::time::advance(Duration::from_secs(1)).await;
        let e = step(
            &mut m,
            Input::KillDone {
                generation: 1,
                ok: true,
            },
            Instant::now(),
        );
        assert_eq!(
            e,
            vec![
                Effect::KillComplete,
                Effect::StartCleanup(CleanupStage::Volumes)
            ]
        );
        let e = step(
            &mut m,
            Input::CleanupDone {
                stage: CleanupStage::Volumes,
                ok: true,
            },
            Instant::now(),
        );
        assert_eq!(e, vec![Effect::StartCleanup(CleanupStage::Cgroup)]);
        let e = step(
            &mut m,
            Input::CleanupDone {
                stage: CleanupStage::Cgroup,
                ok: true,
            },
            Instant::now(),
        );
        assert_eq!(e, vec![Effect::Finished]);
        assert_eq!(m.lifecycle.name(), "finished");
        // finished: everything is ignored
        assert!(
            step(
                &mut m,
                Input::Kill {
                    grace_override: Some(0),
                    reason: KillReason::Orphan
                },
                Instant::now()
            )
            .is_empty()
        );
        assert!(step(&mut m, upd(true, Some(0), true, None), Instant::now()).is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn shorter_grace_restarts_kill_longer_does_not() {
        let mut m = PodMachine::new(Some(30));
        let t0 = Instant::now();
        step(&mut m, upd(true, Some(30), false, Some(30)), t0);
        tokio::time::advance(Duration::from_secs(5)).await;
        let t1 = Instant::now();
        let e = step(&mut m, upd(true, Some(3), false, Some(30)), t1);
        assert_eq!(
            e,
            vec![Effect::StartKill {
                generation: 2,
                grace: 3
            }]
        );
        assert_eq!(m.kill_deadline(), Some(t1 + Duration::from_secs(3)));
        // a longer one later is ignored, and so is an equal one
        assert!(
            step(
                &mut m,
                Input::Kill {
                    grace_override: Some(20),
                    reason: KillReason::Orphan
                },
                t1
            )
            .is_empty()
        );
        assert!(step(&mut m, upd(true, Some(3), false, Some(30)), t1).is_empty());
        assert_eq!(m.grace, Some(3));
        // the superseded attempt's completion is ignored
        assert!(
            step(
                &mut m,
                Input::KillDone {
                    generation: 1,
                    ok: true
                },
                t1
            )
            .is_empty()
        );
        assert_eq!(m.lifecycle.name(), "terminating");
        let e = step(
            &mut m,
            Input::KillDone {
                generation: 2,
                ok: true,
            },
            t1,
        );
        assert_eq!(e[0], Effect::KillComplete);
    }

    #[tokio::test(start_paused = true)]
    async fn first_reason_wins_and_override_zero_is_one() {
        let mut m = PodMachine::new(Some(600));
        let now = Instant::now();
        step(
            &mut m,
            Input::Kill {
                grace_override: Some(0),
                reason: KillReason::Orphan,
            },
            now,
        );
        assert_eq!(m.grace, Some(1));
        step(&mut m, upd(true, Some(0), false, Some(600)), now);
        assert_eq!(m.reason, Some(KillReason::Orphan));
    }

    #[tokio::test(start_paused = true)]
    async fn terminal_phase_terminates_with_spec_grace() {
        let mut m = PodMachine::new(Some(45));
        let e = step(&mut m, upd(false, None, true, Some(45)), Instant::now());
        assert_eq!(
            e,
            vec![Effect::StartKill {
                generation: 1,
                grace: 45
            }]
        );
        assert_eq!(m.reason, Some(KillReason::TerminalPhase));
    }

    #[tokio::test(start_paused = true)]
    async fn failures_back_off_and_retry() {
        let mut m = PodMachine::new(Some(30));
        let now = Instant::now();
        step(
            &mut m,
            Input::Kill {
                grace_override: Some(5),
                reason: KillReason::Completed,
            },
            now,
        );
        let e = step(
            &mut m,
            Input::KillDone {
                generation: 1,
                ok: false,
            },
            now,
        );
        assert_eq!(e, vec![Effect::RetryAfter(Duration::from_secs(1))]);
        let e = step(&mut m, Input::RetryDue, now);
        assert_eq!(
            e,
            vec![Effect::StartKill {
                generation: 2,
                grace: 5
            }]
        );
        let e = step(
            &mut m,
            Input::KillDone {
                generation: 2,
                ok: false,
            },
            now,
        );
        assert_eq!(e, vec![Effect::RetryAfter(Duration::from_secs(2))]);
        // a shorter grace while waiting to retry starts at once
        let e = step(
            &mut m,
            Input::Kill {
                grace_override: Some(1),
                reason: KillReason::Orphan,
            },
            now,
        );
        assert_eq!(
            e,
            vec![Effect::StartKill {
                generation: 3,
                grace: 1
            }]
        );
        // the stale retry timer is then a no-op
        assert!(step(&mut m, Input::RetryDue, now).is_empty());
        step(
            &mut m,
            Input::KillDone {
                generation: 3,
                ok: true,
            },
            now,
        );
        let e = step(
            &mut m,
            Input::CleanupDone {
                stage: CleanupStage::Volumes,
                ok: false,
            },
            now,
        );
        assert_eq!(e, vec![Effect::RetryAfter(Duration::from_secs(1))]);
        // a stage result while waiting is ignored; the retry restarts the same stage
        assert!(
            step(
                &mut m,
                Input::CleanupDone {
                    stage: CleanupStage::Volumes,
                    ok: true
                },
                now
            )
            .is_empty()
        );
        assert_eq!(
            step(&mut m, Input::RetryDue, now),
            vec![Effect::StartCleanup(CleanupStage::Volumes)]
        );
    }

    #[test]
    fn backoff_is_capped() {
        assert_eq!(backoff(1), Duration::from_secs(1));
        assert_eq!(backoff(3), Duration::from_secs(4));
        assert_eq!(backoff(100), RETRY_MAX);
        assert_eq!(backoff(u32::MAX), RETRY_MAX);
    }
}
