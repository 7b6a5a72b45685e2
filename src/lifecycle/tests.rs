//! The step function, input by input (paused time).

use super::*;

fn upd(del: bool, dg: Option<i64>, terminal: bool, spec: Option<i64>) -> Input {
    Input::Update {
        deletion_requested: del,
        deletion_grace: dg,
        terminal_phase: terminal,
        spec_grace: spec,
    }
}

/// What the registry sends for an object with a deletionTimestamp: the update, then the
/// kill request (the effects of both).
fn delete(m: &mut PodMachine, dg: Option<i64>, spec: Option<i64>, now: Instant) -> Vec<Effect> {
    let mut e = step(m, upd(true, dg, false, spec), now);
    e.extend(step(
        m,
        Input::Kill {
            grace_override: None,
            reason: KillReason::Deleted,
        },
        now,
    ));
    e
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
    let e = delete(&mut m, Some(10), Some(30), t0);
    assert_eq!(
        e,
        vec![Effect::StartKill {
            generation: 1,
            grace: 10
        }]
    );
    assert_eq!(m.reason, Some(KillReason::Deleted));
    assert_eq!(
        m.kill_deadline().map(|d| d.at),
        Some(t0 + Duration::from_secs(10))
    );
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
    delete(&mut m, Some(30), Some(30), t0);
    tokio::time::advance(Duration::from_secs(5)).await;
    let t1 = Instant::now();
    let e = delete(&mut m, Some(3), Some(30), t1);
    assert_eq!(
        e,
        vec![Effect::StartKill {
            generation: 2,
            grace: 3
        }]
    );
    assert_eq!(
        m.kill_deadline().map(|d| d.at),
        Some(t1 + Duration::from_secs(3))
    );
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
    assert!(delete(&mut m, Some(3), Some(30), t1).is_empty());
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
    delete(&mut m, Some(0), Some(600), now);
    assert_eq!(m.reason, Some(KillReason::Orphan));
}

#[tokio::test(start_paused = true)]
async fn terminal_phase_terminates_with_spec_grace() {
    let mut m = PodMachine::new(Some(45));
    let now = Instant::now();
    // an update alone starts nothing: the registry's kill request does
    assert!(step(&mut m, upd(false, None, true, Some(45)), now).is_empty());
    assert_eq!(m.lifecycle, Lifecycle::Sync);
    let e = step(
        &mut m,
        Input::Kill {
            grace_override: None,
            reason: KillReason::TerminalPhase,
        },
        now,
    );
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
    assert_eq!(backoff(100), crate::backoff::Policy::RUNTIME.max);
    assert_eq!(backoff(u32::MAX), crate::backoff::Policy::RUNTIME.max);
}

#[tokio::test(start_paused = true)]
async fn every_reason_is_kept_the_first_decides_and_the_shortest_grace_wins() {
    let mut m = PodMachine::new(Some(30));
    let now = Instant::now();
    delete(&mut m, Some(30), Some(30), now);
    let e = step(
        &mut m,
        Input::Kill {
            grace_override: Some(5),
            reason: KillReason::Orphan,
        },
        now,
    );
    assert_eq!(
        e,
        vec![Effect::StartKill {
            generation: 2,
            grace: 5
        }]
    );
    // the same reason again adds nothing; a longer grace changes nothing
    step(
        &mut m,
        Input::Kill {
            grace_override: Some(20),
            reason: KillReason::Orphan,
        },
        now,
    );
    assert_eq!(m.reason, Some(KillReason::Deleted));
    assert_eq!(m.reasons, vec![KillReason::Deleted, KillReason::Orphan]);
    assert_eq!(m.grace, Some(5));
}
