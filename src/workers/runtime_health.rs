//! The main loop's liveness and the container runtime's health (readiness): the kubelet's
//! `syncloop` healthz check (`SyncLoopHealthCheck`, which its systemd watchdog also reads) and
//! its `runtimeState` (`runtime.go`: the runtime counts as down after
//! `maxWaitForContainerRuntime` without an answer), with the PLEG's relist threshold
//! (`pleg/generic.go`). The housekeeping loop ([`super::housekeeping`]) beats, bounds each
//! relist with [`relist_deadline`] and tells the outcome here; this module keeps the time and
//! says what it means.
//!
//! The heartbeat and the relist are split, so that a stalled runtime is not a reason for
//! systemd to restart reaplet (kubelet: the PLEG's relist threshold makes the node NotReady,
//! never restarts the kubelet).
//!
//! Invariants:
//! * the heartbeat says "the main loop is alive": the loop beats every [`BEAT`] while it
//!   waits for the next relist *and* while a relist pass is in flight (the pass is a future
//!   the loop polls beside its beat timer, not a call it blocks in). `/healthz` and the
//!   systemd `WATCHDOG=1` ping read the beat, so a CRI call that hangs never stops them; a
//!   loop that is itself wedged (a blocking call on its task, a deadlock, or the test hook's
//!   freeze, which stops the loop where it stands) stops beating, and the watchdog fires;
//! * a relist (`ListPodSandbox` + `ListContainers`) has its own deadline,
//!   [`relist_deadline`]: three relist periods within 5–30 s, far below the runtime request
//!   timeout (2 min), so a hung runtime is retried every few periods. The rest of a pass
//!   (sandbox removal, completion checks, sweeps) is bounded by each call's request timeout;
//!   the loop beats meanwhile;
//! * the runtime's health is when a relist last got an answer: with none for
//!   `runtime_unhealthy_after` (30 s, the kubelet's `maxWaitForContainerRuntime`) the runtime
//!   is stalled ([`RuntimeStall`]): `/readyz` fails with the reason, systemd's `STATUS=` says
//!   so, one warning line, one `ContainerRuntimeUnhealthy` node event and the
//!   `container_runtime_unhealthy` gauge at 1; reaplet keeps running, and the pod workers keep
//!   retrying their kills. The first relist answered after it logs one recovery line and
//!   readiness returns. It is computed from the last answer's time, so it holds while a relist
//!   is still waiting;
//! * each stall is reported once and its end once, never once per beat; the health lock is
//!   short and never held across an await.

use super::PodWorkers;
use crate::cri::{CriError, Runtime};
use std::time::Duration;
use tokio::time::Instant;

/// How often the housekeeping loop beats (`/healthz` and the watchdog read the beat; their
/// bound is 30 s at least, so a beat every second leaves them a wide margin).
pub const BEAT: Duration = Duration::from_secs(1);

/// The relist deadline's bounds: a relist gets three relist periods, at least
/// [`RELIST_DEADLINE_MIN`] (a List answers in < 5 ms on the test bed, in well under a second
/// with thousands of pods) and at most [`RELIST_DEADLINE_MAX`] (the runtime unhealthy
/// threshold: a relist never outlasts the moment the runtime counts as stalled by much).
pub const RELIST_DEADLINE_MIN: Duration = Duration::from_secs(5);
pub const RELIST_DEADLINE_MAX: Duration = Duration::from_secs(30);

/// The deadline of a relist (the runtime's two lists) with relist period `period`: shorter
/// than the runtime request timeout (2 min by default), so that a hung runtime is noticed and
/// retried every few periods instead of once per request timeout.
pub fn relist_deadline(period: Duration) -> Duration {
    period
        .saturating_mul(3)
        .clamp(RELIST_DEADLINE_MIN, RELIST_DEADLINE_MAX)
}

/// A stalled runtime: how long it has answered no relist, and the last error (or that a relist
/// is still waiting).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeStall {
    pub for_: Duration,
    pub why: String,
}

impl std::fmt::Display for RuntimeStall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "container runtime not answering for {}s ({})",
            self.for_.as_secs(),
            self.why
        )
    }
}

/// What the relists have told of the runtime (behind a short lock in the pipeline).
#[derive(Debug)]
pub(super) struct RuntimeHealth {
    /// When a relist last got both lists (or the pipeline started).
    last_answer: Instant,
    /// The last relist error since then.
    last_error: Option<String>,
    /// A reported stall (log line, event): since when the runtime had not answered; cleared
    /// by the recovery line.
    reported: Option<Instant>,
}

/// A change worth one line.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum HealthChange {
    Stalled(RuntimeStall),
    /// Answering again after a reported stall of this long.
    Recovered(Duration),
}

impl RuntimeHealth {
    pub(super) fn new(now: Instant) -> Self {
        Self {
            last_answer: now,
            last_error: None,
            reported: None,
        }
    }

    fn answered(&mut self, now: Instant) {
        self.last_answer = self.last_answer.max(now);
        self.last_error = None;
    }

    fn failed(&mut self, why: String) {
        self.last_error = Some(why);
    }

    fn stall(&self, now: Instant, after: Duration) -> Option<RuntimeStall> {
        let for_ = now.saturating_duration_since(self.last_answer);
        (for_ >= after).then(|| RuntimeStall {
            for_,
            why: self
                .last_error
                .clone()
                .unwrap_or_else(|| "a relist is still waiting for it".into()),
        })
    }

    /// The change since the last call, if any (each stall is reported once).
    fn judge(&mut self, now: Instant, after: Duration) -> Option<HealthChange> {
        match (self.stall(now, after), self.reported) {
            (Some(s), None) => {
                self.reported = Some(self.last_answer);
                Some(HealthChange::Stalled(s))
            }
            (None, Some(since)) => {
                self.reported = None;
                let stalled = self.last_answer.saturating_duration_since(since);
                Some(HealthChange::Recovered(stalled))
            }
            _ => None,
        }
    }
}

impl<R: Runtime> PodWorkers<R> {
    /// The main loop is alive: `/healthz` and the watchdog read this.
    pub(super) fn beat(&self) {
        let beat = self.inner.started.elapsed().as_millis() as u64;
        self.inner
            .heartbeat
            .store(beat, std::sync::atomic::Ordering::Relaxed);
    }

    fn health(&self) -> std::sync::MutexGuard<'_, RuntimeHealth> {
        self.inner
            .runtime_health
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the runtime counts as stalled now: it has answered no relist for
    /// `runtime_unhealthy_after` (computed from the last answer, so it holds while a relist
    /// is still waiting). `/readyz` and systemd's `STATUS=` report it.
    pub fn runtime_stall(&self) -> Option<RuntimeStall> {
        let after = self.inner.config.runtime_unhealthy_after;
        self.health().stall(Instant::now(), after)
    }

    /// Reports a change of the runtime's health: once when it stalls (a warning line, the
    /// `ContainerRuntimeUnhealthy` node event, the gauge) and once when it answers again.
    pub(super) fn judge_runtime_health(&self) {
        let after = self.inner.config.runtime_unhealthy_after;
        let now = Instant::now();
        let mut h = self.health();
        let change = h.judge(now, after);
        drop(h);
        let metrics = self.inner.metrics.get();
        match change {
            Some(HealthChange::Stalled(stall)) => {
                tracing::warn!(
                    forSeconds = stall.for_.as_secs(),
                    err = %stall.why,
                    "container runtime not answering; not ready until it does"
                );
                self.inner.events.record_node(
                    crate::events::NodeEventReason::ContainerRuntimeUnhealthy,
                    &stall.to_string(),
                );
                if let Some(m) = metrics {
                    m.runtime_unhealthy.set(1);
                }
            }
            Some(HealthChange::Recovered(stalled)) => {
                tracing::info!(
                    stalledSeconds = stalled.as_secs(),
                    "container runtime answers again; ready"
                );
                if let Some(m) = metrics {
                    m.runtime_unhealthy.set(0);
                }
            }
            None => {}
        }
    }

    /// A relist's outcome (both lists, or the error): the runtime's health learns it.
    pub(super) fn relist_outcome<T>(&self, r: &Result<T, CriError>) {
        let mut h = self.health();
        match r {
            Ok(_) => h.answered(Instant::now()),
            Err(e) => h.failed(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{Exposition, Metrics};
    use crate::workers::PipelineConfig;
    use crate::workers::tests::Rig;
    use std::sync::Arc;

    /// The workers' test rig with metrics and its housekeeping loop running (polling: relist
    /// period 1 s, relist deadline 5 s, unhealthy after 30 s).
    fn rig() -> (Rig, Arc<Metrics>) {
        let r = crate::workers::tests::rig();
        let metrics = Arc::new(Metrics::new());
        r.workers.set_metrics(metrics.clone());
        tokio::spawn(r.workers.clone().run_housekeeping());
        (r, metrics)
    }

    fn unhealthy_gauge(m: &Metrics) -> bool {
        m.encode(Exposition::Prometheus)
            .lines()
            .any(|l| l == "reaplet_container_runtime_unhealthy 1")
    }

    #[test]
    fn the_relist_deadline_is_a_few_periods_within_bounds() {
        let s = Duration::from_secs;
        assert_eq!(relist_deadline(s(1)), s(5), "polling: the floor");
        assert_eq!(relist_deadline(s(3)), s(9));
        assert_eq!(relist_deadline(s(10)), s(30), "with events: the cap");
        assert_eq!(relist_deadline(Duration::MAX), s(30), "saturates");
        assert!(relist_deadline(s(10)) < crate::cri::CriConfig::default().request_timeout);
    }

    /// A runtime whose lists hang for 3 minutes: the loop keeps beating the whole time
    /// (liveness, the watchdog), the runtime counts as stalled from 30 s on (once, with the
    /// reason), and is healthy again at the first relist it answers.
    #[tokio::test(start_paused = true)]
    async fn a_stalled_runtime_stalls_readiness_never_the_heartbeat() {
        let (r, metrics) = rig();
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(r.workers.runtime_stall().is_none());
        r.rt.stall_lists(true);
        let stalled_at = Instant::now();
        let mut stall_seen = None;
        let mut worst_beat = Duration::ZERO;
        while stalled_at.elapsed() < Duration::from_secs(180) {
            tokio::time::sleep(Duration::from_millis(500)).await;
            worst_beat = worst_beat.max(r.workers.since_heartbeat());
            match r.workers.runtime_stall() {
                Some(s) if stall_seen.is_none() => {
                    assert!(s.why.contains("relist") || s.why.contains("waiting"), "{s}");
                    stall_seen = Some(stalled_at.elapsed());
                }
                Some(_) => {}
                None => assert!(stall_seen.is_none(), "healthy again while stalled"),
            }
        }
        assert!(
            worst_beat <= BEAT * 2,
            "the heartbeat lagged {worst_beat:?}"
        );
        let seen = stall_seen.expect("the stall never showed");
        let after = PipelineConfig::default().runtime_unhealthy_after;
        // the last answer was at most a relist period before the stall began
        assert!(
            seen >= after - Duration::from_secs(1) && seen <= after + Duration::from_secs(1),
            "stalled after {seen:?}"
        );
        let s = r.workers.runtime_stall().unwrap();
        assert!(
            s.to_string()
                .starts_with("container runtime not answering for 18"),
            "{s}"
        );
        assert!(s.why.contains("deadline of 5s exceeded"), "{s}");
        tokio::time::sleep(BEAT * 2).await;
        assert!(unhealthy_gauge(&metrics));
        // the runtime answers again: healthy at the next relist
        r.rt.stall_lists(false);
        let released = Instant::now();
        while r.workers.runtime_stall().is_some() {
            assert!(
                released.elapsed() <= relist_deadline(Duration::from_secs(1)) + BEAT,
                "still stalled"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tokio::time::sleep(BEAT * 2).await;
        assert!(!unhealthy_gauge(&metrics));
        r.cancel.cancel();
    }

    #[test]
    fn a_stall_is_reported_once_and_its_end_once() {
        let t0 = Instant::now();
        let after = Duration::from_secs(30);
        let mut h = RuntimeHealth::new(t0);
        assert_eq!(h.judge(t0 + Duration::from_secs(29), after), None);
        h.failed("relist: deadline of 5s exceeded".into());
        match h.judge(t0 + Duration::from_secs(31), after) {
            Some(HealthChange::Stalled(s)) => {
                assert_eq!(s.for_, Duration::from_secs(31));
                assert_eq!(s.why, "relist: deadline of 5s exceeded");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(h.judge(t0 + Duration::from_secs(60), after), None, "once");
        h.answered(t0 + Duration::from_secs(61));
        assert_eq!(
            h.judge(t0 + Duration::from_secs(61), after),
            Some(HealthChange::Recovered(Duration::from_secs(61)))
        );
        assert_eq!(h.judge(t0 + Duration::from_secs(62), after), None, "once");
    }

    /// The test hook's freeze wedges the loop itself: it stops beating at once (the watchdog
    /// then fires), unlike a runtime that does not answer.
    #[cfg(feature = "test-hooks")]
    #[tokio::test(start_paused = true)]
    async fn a_wedged_loop_stops_beating() {
        let (r, _metrics) = rig();
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(r.workers.since_heartbeat() <= BEAT);
        r.workers.freeze_housekeeping();
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(r.workers.since_heartbeat() >= Duration::from_secs(59));
        r.cancel.cancel();
    }
}
