//! Stopping one container of a pod: the kubelet's `killContainer` (`kuberuntime_container.go`):
//! its preStop hook, the grace arithmetic and `StopContainer`, resumable across restarts.
//!
//! Invariants:
//! * preStop (bounded by the grace) and, for a sidecar, the wait for the containers it outlives
//!   (taken off its grace), whole seconds deducted, 2 s floor, then `StopContainer(id, grace)`;
//!   NotFound counts as stopped; a failed hook is reported and the stop goes on;
//! * a container never signalled gets a fresh termination (preStop, SIGTERM, the grace with
//!   its 2 s floor, counted from now; in a retried kill, what is left of the first attempt's
//!   deadline, never under the floor); one whose StopContainer the runtime answered, in this
//!   life of reaplet or an earlier one, continues to that stop's recorded deadline with no
//!   hook and no new floor; one whose stop was recorded but never answered (refused, or
//!   reaplet died first) is sent SIGTERM again, bounded by that deadline, never under the
//!   floor, each time ([`KillMemory`], durable in [`crate::terminating::records::RecordFile`]); a stop the
//!   runtime has held for a second counts as answered (it reached the runtime, which signals
//!   as it takes it; time queued for one of reaplet's own call slots does not count): SIGTERM
//!   is never skipped while no stop is known to have reached the runtime, and only restarts
//!   within a second of sending extend a kill, by the floor;
//! * a retry of the same termination never ends a stop before the deadline it was sent with;
//!   only a shorter pod grace replaces it, and then with the floor;
//! * a preStop hook refused before it reached the runtime is released: the next attempt
//!   runs it;
//! * a preStop hook runs at most once per container, even across restarts of reaplet or a
//!   shorter grace restarting the kill.

use super::KillError;
use crate::cri::{Runtime, RuntimeContainer};
use crate::deadline::Stamp;
use crate::events::{EventReason, EventSink, PodEvent};
use crate::pod::{ContainerSpec, PodInfo};
use crate::terminating::grace;
use crate::terminating::hooks;
use crate::terminating::records::{KillMemory, StopStart};
use crate::timeline::{Recorder, Step, StopKind};
use tokio::sync::watch;
use tokio::time::Instant;

#[allow(clippy::too_many_arguments)]
pub(super) async fn kill_container<R: Runtime>(
    runtime: &R,
    events: &EventSink,
    pod: &PodInfo,
    spec: &ContainerSpec,
    c: &RuntimeContainer,
    pod_grace: i64,
    deps: Vec<watch::Receiver<bool>>,
    memory: &KillMemory,
    timeline: &Recorder,
) -> Result<(), KillError> {
    let event = |reason, message: String| {
        events.record(PodEvent {
            uid: pod.uid.clone(),
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            reason,
            message,
            annotations: Default::default(),
        })
    };
    // a retried kill counts down to its first attempt's deadline, whatever happened since; a
    // container never sent its stop is still owed a fresh termination (its hook, then
    // SIGTERM): within what is left of that deadline, never under the 2 s floor. One whose
    // stop the runtime answered continues that stop (its record decides, below)
    let cap = pod.kill_deadline.map(|d| d.remaining_secs(Instant::now()));
    let resumed = memory.stop_sent(&c.id);
    let mut g = match cap {
        Some(cap) => pod_grace.min(cap.max(grace::MIN_CONTAINER_GRACE)),
        None => pod_grace,
    };
    if let Some(handler) = &spec.pre_stop
        && g > 0
        && !resumed
        && memory.claim_prestop(&c.id).await
    {
        event(
            EventReason::Killing,
            format!("Stopping container {}", c.name),
        );
        let start = Instant::now();
        timeline.record(Some(&c.name), Step::PreStopStarted);
        let r = hooks::run(runtime, pod, spec, &c.id, handler, grace::as_duration(g)).await;
        let took = start.elapsed();
        timeline.record(
            Some(&c.name),
            Step::PreStopEnded {
                ok: r.is_ok(),
                error: r.as_ref().err().map(ToString::to_string),
            },
        );
        if let Err(e) = &r {
            event(
                EventReason::FailedPreStopHook,
                format!("PreStopHook failed for container {}: {e}", c.name),
            );
            // refused before the runtime took it (a restarting runtime): it never ran, so
            // the next attempt runs it; this one goes on to the stop, as after any failure
            if e.never_reached_runtime() {
                memory.release_prestop(&c.id).await;
            }
        }
        g = grace::deduct(g, took);
        tracing::info!(
            gracePeriod = g,
            tookMs = took.as_millis() as u64,
            "preStop hook done"
        );
    } else if spec.pre_stop.is_none() {
        event(
            EventReason::Killing,
            format!("Stopping container {}", c.name),
        );
    }
    if !deps.is_empty() && g > 0 {
        let start = Instant::now();
        let wait_all = async {
            for mut d in deps {
                // a dependency whose kill task went away counts as done waiting
                let _ = d.wait_for(|stopped| *stopped).await;
            }
        };
        let _ = tokio::time::timeout(grace::as_duration(g), wait_all).await;
        g = grace::deduct(g, start.elapsed());
    }
    // what a first stop would be: the grace left, with the floor
    let timeout = grace::container_stop_timeout(g);
    // a stop the runtime answered before (in an earlier life of reaplet, or a failed attempt)
    // is continued to its recorded deadline, never restarted, unless this one comes with a
    // shorter pod grace and SIGKILLs sooner: wait out the part of a second, then stop with
    // the whole seconds left, so the SIGKILL lands on the deadline (past it: at once; the
    // floor was granted when it was sent). One recorded but never answered may never have
    // reached the runtime: a SIGTERM again, bounded by its deadline, never under the floor
    let now = Stamp::now();
    let proposed = now.plus_ms(timeout.saturating_mul(1000));
    let (timeout, kind) = match memory.stop_deadline(&c.id, &proposed, pod_grace).await {
        StopStart::Fresh => (timeout, StopKind::Fresh),
        StopStart::Continue(deadline) => {
            let t = on_deadline(&deadline, &now).await;
            tracing::info!(gracePeriod = t, "continuing a stop already sent");
            (t, StopKind::Continued)
        }
        StopStart::Unanswered(deadline) => {
            // on the deadline as a continued stop is, or the floor from now
            let t = if deadline.ms_from(&now) >= grace::MIN_CONTAINER_GRACE * 1000 {
                on_deadline(&deadline, &now).await
            } else {
                grace::MIN_CONTAINER_GRACE
            };
            memory
                .stop_resent(&c.id, &Stamp::now().plus_ms(t * 1000))
                .await;
            tracing::info!(
                gracePeriod = t,
                "sending again a stop the runtime never answered"
            );
            (t, StopKind::Resent)
        }
    };
    tracing::info!(gracePeriod = timeout, "stopping container");
    // a stop the runtime has held for REACHED_AFTER reached it (a runtime that is down
    // refuses at once), and the runtime sends SIGTERM as it takes the stop: from then on it
    // counts as answered, so a restart continues to its deadline instead of sending another.
    // Time spent waiting for one of reaplet's own call slots does not count: the clock starts
    // when the call leaves for the runtime
    timeline.record(Some(&c.name), Step::StopSent { timeout, kind });
    let (sent_tx, sent_rx) = tokio::sync::oneshot::channel();
    let stop = runtime.stop_container_sent(&c.id, timeout, sent_tx);
    tokio::pin!(stop);
    let r = if timeout > 0 {
        let reached = async {
            match sent_rx.await {
                Ok(()) => tokio::time::sleep(REACHED_AFTER).await,
                // never sent (refused before it left): only its answer counts
                Err(_) => std::future::pending().await,
            }
        };
        tokio::select! {
            r = &mut stop => r,
            () = reached => {
                memory.stop_answered(&c.id).await;
                stop.await
            }
        }
    } else {
        stop.await
    };
    match r {
        Ok(()) => Ok(()),
        Err(e) if e.is_not_found() => Ok(()),
        Err(source) => {
            timeline.record(
                Some(&c.name),
                Step::StopFailed {
                    error: source.to_string(),
                },
            );
            // the runtime answered: its SIGTERM went out; no answer (refused, timed out)
            // may mean it never got the stop, even one marked answered for its time in flight
            // (it may have waited for a connection or a slot all along)
            if source.runtime_answered() {
                memory.stop_answered(&c.id).await;
            } else {
                memory.stop_unanswered(&c.id).await;
            }
            Err(KillError::StopContainer {
                uid: pod.uid.to_string(),
                container_id: c.id.clone(),
                container_name: c.name.clone(),
                source,
            })
        }
    }
}

/// How long a StopContainer in flight takes to have reached the runtime: a runtime that is
/// down refuses at once, and containerd sends the stop signal before it starts waiting
/// (testbed.md: CRI calls answer in under 15 ms here; ×60 for a loaded machine).
const REACHED_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

/// The stop timeout that SIGKILLs on `deadline`: the part of a second left is waited out
/// first, then the whole seconds left (0 once past).
async fn on_deadline(deadline: &Stamp, now: &Stamp) -> i64 {
    let left = deadline.ms_from(now).max(0);
    tokio::time::sleep(std::time::Duration::from_millis((left % 1000) as u64)).await;
    left / 1000
}

#[cfg(test)]
mod tests {
    use super::super::kill_pod;
    use super::super::tests::{pod, run, sleep_hook};
    use super::*;
    use crate::cri::fake::{Behaviour, Call, FakeRuntime};
    use crate::pod::PodUid;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn prestop_time_comes_off_the_grace() {
        let rt = FakeRuntime::default();
        rt.add_pod("p", &[("app", Behaviour::IgnoreTerm)]);
        let t0 = Instant::now();
        run(&rt, &pod("p", &[("app", sleep_hook(4))], &[]), 10)
            .await
            .unwrap();
        let stops = rt.stops_of("p-app");
        assert_eq!(stops.len(), 1);
        assert_eq!(stops[0].0, 6, "10 s grace - 4 s hook");
        assert_eq!(
            stops[0].1 - t0,
            Duration::from_secs(4),
            "SIGTERM only after the hook"
        );
        assert_eq!(rt.exit_code("p-app"), Some(137));
    }

    #[tokio::test(start_paused = true)]
    async fn a_resumed_kill_counts_down_to_the_pod_deadline_without_a_new_floor() {
        use crate::deadline::{Deadline, DeadlineOrigin::FirstAttempt};
        let now = Instant::now();
        // deadline passed (a reaplet restarted after it) and the stop already sent before:
        // immediate SIGKILL, no hook
        let rt = FakeRuntime::default();
        rt.add_pod("p", &[("app", Behaviour::IgnoreTerm)]);
        let mut p = pod("p", &[("app", sleep_hook(4))], &[]);
        p.kill_deadline = Some(Deadline::after(now, -3, FirstAttempt));
        let memory = KillMemory::default();
        // recorded, then answered by the runtime (with an error): its SIGTERM went out
        let sent = Stamp::now().plus_ms(-3_000);
        memory.stop_deadline("p-app", &sent, 1).await;
        memory.stop_answered("p-app").await;
        kill_pod(&rt, &EventSink::log_only(), &p, 1, &memory)
            .await
            .unwrap();
        assert_eq!(rt.stops_of("p-app")[0].0, 0, "past the deadline: timeout 0");
        assert!(
            !rt.calls()
                .iter()
                .any(|c| matches!(c, Call::ExecSync { .. })),
            "no preStop hook past the deadline"
        );
        // deadline passed, but the container was never sent a stop (issue 28): its hook,
        // then SIGTERM with the floor, never a bare SIGKILL
        let rt = FakeRuntime::default();
        rt.add_pod("n", &[("app", Behaviour::IgnoreTerm)]);
        let mut n = pod("n", &[("app", sleep_hook(1))], &[]);
        n.kill_deadline = Some(Deadline::after(now, -3, FirstAttempt));
        let t0 = Instant::now();
        run(&rt, &n, 3).await.unwrap();
        let execs = rt
            .calls()
            .iter()
            .filter(|c| matches!(c, Call::ExecSync { .. }))
            .count();
        assert_eq!(execs, 1, "the hook runs");
        assert_eq!(
            rt.stops_of("n-app")[0],
            (2, t0 + Duration::from_secs(1)),
            "SIGTERM after the hook, with the 2 s floor"
        );
        // deadline ahead: the grace is capped by it (never extended by the floor)
        let rt = FakeRuntime::default();
        rt.add_pod("q", &[("app", Behaviour::IgnoreTerm)]);
        let mut q = pod("q", &[("app", None)], &[]);
        q.kill_deadline = Some(Deadline::after(now, 1, FirstAttempt));
        run(&rt, &q, 30).await.unwrap();
        let t = rt.stops_of("q-app")[0].0;
        assert!((1..=2).contains(&t), "capped at the deadline, got {t}");
        // no deadline: the ordinary floor
        let rt = FakeRuntime::default();
        rt.add_pod("r", &[("app", Behaviour::IgnoreTerm)]);
        run(&rt, &pod("r", &[("app", None)], &[]), 1).await.unwrap();
        assert_eq!(rt.stops_of("r-app")[0].0, 2);
    }

    /// Memory for pod `p`'s container `app` whose record holds a stop answered by the runtime,
    /// SIGKILLing `ms` from now, sent under the pod grace `grace` (as a reaplet that died
    /// mid-termination left it; written as JSON so that the record's format is the one tested).
    fn answered_stop(dir: &std::path::Path, ms: i64, grace: i64) -> KillMemory {
        let file =
            crate::terminating::records::RecordFile::for_pod(dir, &PodUid::parse("p").unwrap());
        let json = serde_json::json!({"stops": {"p-app": {
            "deadline": Stamp::now().plus_ms(ms), "answered": true, "grace": grace,
        }}});
        std::fs::create_dir_all(file.path().parent().unwrap()).unwrap();
        std::fs::write(file.path(), json.to_string()).unwrap();
        KillMemory::durable(file)
    }

    /// Issue 38, item 4: a retry (its attempt's deadline in `kill_deadline`) of a stop the
    /// runtime answered never ends before the stop's recorded deadline, and never sends a
    /// bare SIGKILL where the pod's grace is not shorter. Before: the retry's cap (the first
    /// attempt's start + grace, without the floor and the hook's whole-second rounding) was
    /// earlier, so the record was overwritten and the stop resent: (5, t0) for a deadline
    /// 6.5 s away, (0, t0) for one 1 s away.
    #[tokio::test(start_paused = true)]
    async fn a_retry_never_ends_a_sent_stop_before_its_recorded_deadline() {
        use crate::deadline::{Deadline, DeadlineOrigin::FirstAttempt};
        for (cap, recorded_ms, grace, least_ms) in [(5, 6_500, 7, 6_450), (-1, 1_000, 3, 950)] {
            let dir = tempfile::tempdir().unwrap();
            let memory = answered_stop(dir.path(), recorded_ms, grace);
            let rt = FakeRuntime::default();
            rt.add_pod("p", &[("app", Behaviour::IgnoreTerm)]);
            let mut p = pod("p", &[("app", None)], &[]);
            p.kill_deadline = Some(Deadline::after(Instant::now(), cap, FirstAttempt));
            let t0 = Instant::now();
            kill_pod(&rt, &EventSink::log_only(), &p, grace, &memory)
                .await
                .unwrap();
            let (timeout, at) = rt.stops_of("p-app")[0];
            let ends = (at - t0) + Duration::from_secs(timeout as u64);
            assert!(
                ends >= Duration::from_millis(least_ms),
                "recorded {recorded_ms} ms away, the retry's stop ends {ends:?} after it started: ({timeout}, +{:?})",
                at - t0
            );
            assert!(
                memory.stop_sent("p-app"),
                "the stop is still the answered one"
            );
        }
    }

    /// Issue 38, item 4: a retry with a shorter grace than the recorded stop's replaces it, but
    /// with the 2 s floor: before, the cap (the retry's deadline already past) gave timeout 0.
    #[tokio::test(start_paused = true)]
    async fn a_shorter_grace_in_a_retry_still_gets_the_floor() {
        use crate::deadline::{Deadline, DeadlineOrigin::FirstAttempt};
        let dir = tempfile::tempdir().unwrap();
        let memory = answered_stop(dir.path(), 20_000, 30);
        let rt = FakeRuntime::default();
        rt.add_pod("p", &[("app", Behaviour::IgnoreTerm)]);
        let mut p = pod("p", &[("app", None)], &[]);
        p.kill_deadline = Some(Deadline::after(Instant::now(), -1, FirstAttempt));
        let t0 = Instant::now();
        kill_pod(&rt, &EventSink::log_only(), &p, 1, &memory)
            .await
            .unwrap();
        assert_eq!(rt.stops_of("p-app")[0], (2, t0), "a SIGTERM with the floor");
    }

    #[tokio::test(start_paused = true)]
    async fn prestop_longer_than_grace_is_cut_and_floor_applies() {
        let rt = FakeRuntime::default();
        rt.add_pod("p", &[("app", Behaviour::IgnoreTerm)]);
        let (events, mut rx) = EventSink::channel(8);
        let t0 = Instant::now();
        kill_pod(
            &rt,
            &events,
            &pod("p", &[("app", sleep_hook(100))], &[]),
            3,
            &KillMemory::default(),
        )
        .await
        .unwrap();
        let stops = rt.stops_of("p-app");
        assert_eq!(
            stops[0],
            (2, t0 + Duration::from_secs(3)),
            "hook cut at 3 s, then the 2 s floor"
        );
        let mut reasons = Vec::new();
        while let Ok(e) = rx.try_recv() {
            reasons.push(e.reason);
        }
        assert!(
            reasons.contains(&EventReason::FailedPreStopHook),
            "{reasons:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn grace_one_gets_two_seconds() {
        let rt = FakeRuntime::default();
        rt.add_pod("p", &[("app", Behaviour::IgnoreTerm)]);
        run(&rt, &pod("p", &[("app", None)], &[]), 1).await.unwrap();
        assert_eq!(rt.stops_of("p-app")[0].0, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn sidecar_prestop_starts_at_once_in_parallel() {
        let rt = FakeRuntime::default();
        rt.add_pod(
            "p",
            &[
                ("main", Behaviour::ExitOnTerm(Duration::from_secs(5))),
                ("proxy", Behaviour::ExitOnTerm(Duration::ZERO)),
            ],
        );
        let mut p = pod("p", &[("main", None)], &["proxy"]);
        p.sidecars[0].pre_stop = sleep_hook(2);
        let t0 = Instant::now();
        run(&rt, &p, 30).await.unwrap();
        let exec_at = rt
            .calls()
            .into_iter()
            .find_map(|c| match c {
                Call::ExecSync { id, at } if id == "p-proxy" => Some(at),
                _ => None,
            })
            .unwrap();
        assert_eq!(
            exec_at, t0,
            "the sidecar's hook starts with the main containers"
        );
        // hook 2 s, then waits for main (until t=5): 30 - 2 - 3 = 25
        assert_eq!(rt.stops_of("p-proxy")[0], (25, t0 + Duration::from_secs(5)));
    }

    #[tokio::test(start_paused = true)]
    async fn prestop_runs_once_across_restarted_kills() {
        let rt = FakeRuntime::default();
        rt.add_pod("p", &[("app", Behaviour::IgnoreTerm)]);
        let p = pod("p", &[("app", sleep_hook(1))], &[]);
        let memory = KillMemory::default();
        let events = EventSink::log_only();
        // first attempt cancelled during the hook, as a shorter grace does
        let _ = tokio::time::timeout(
            Duration::from_millis(500),
            kill_pod(&rt, &events, &p, 30, &memory),
        )
        .await;
        kill_pod(&rt, &events, &p, 3, &memory).await.unwrap();
        let execs = rt
            .calls()
            .iter()
            .filter(|c| matches!(c, Call::ExecSync { .. }))
            .count();
        assert_eq!(execs, 1);
        assert_eq!(rt.stops_of("p-app")[0].0, 3);
    }
}
