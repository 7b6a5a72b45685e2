//! Kills that resume: after a stop that never reached the runtime, and after a restart of
//! reaplet from its termination record (issue 28, items 4 and 5), on a fake runtime in
//! paused time.

use super::tests::rig;
use super::tests::with_fake_runtime::{api_pod, deleted, desire, until};
use crate::cri::fake::{Behaviour, Call};
use crate::lifecycle::PodPhase;
use crate::pod::{self, PodUid};
use std::time::Duration;
use tokio::time::Instant;

fn hooked(uid: &str, grace: i64) -> crate::pod::PodInfo {
    let mut p = api_pod(uid, grace);
    p.containers[0].pre_stop = Some(pod::Handler::Exec {
        command: vec!["sleep".into(), "1".into()],
    });
    p
}

/// A rig whose runtime runs `p` (one TERM-ignoring container `app`), in sync with its source.
fn running(p: &crate::pod::PodInfo) -> super::tests::Rig {
    let r = rig();
    r.rt.add_pod(p.uid.as_str(), &[("app", Behaviour::IgnoreTerm)]);
    desire(&r.workers, std::slice::from_ref(p));
    r
}

/// Pod `uid`'s termination record holds `stop` for its container `app`: what a reaplet
/// that died mid-termination left.
fn recorded(r: &super::tests::Rig, uid: &str, stop: crate::terminating::records::StopRecord) {
    let record = crate::terminating::records::RecordFile::for_pod(
        &r.workers.inner.config.root_dir,
        &PodUid::parse(uid).unwrap(),
    );
    let mut rec = crate::terminating::records::TerminationRecord::default();
    rec.stops.insert(format!("{uid}-app"), stop);
    record.save(&rec).unwrap();
}

/// `p` deleted with `grace`, found terminating at start with its kill deadline `secs` away
/// (negative: past).
fn resumed(p: &crate::pod::PodInfo, grace: i64, secs: i64) -> crate::pod::PodInfo {
    let mut d = deleted(p, grace);
    d.kill_deadline = Some(crate::deadline::Deadline::after(
        Instant::now(),
        secs,
        crate::deadline::DeadlineOrigin::FirstAttempt,
    ));
    d
}

fn hooks(calls: &[Call]) -> Vec<Instant> {
    calls
        .iter()
        .filter_map(|c| match c {
            Call::ExecSync { at, .. } => Some(*at),
            _ => None,
        })
        .collect()
}

/// Item 5, in one life of reaplet: containerd refuses StopContainer for 5 s (restarting) when
/// a grace-3 pod is deleted. The first stop never reached it, so the container was never sent
/// SIGTERM: the stop that gets through, past the first attempt's deadline, is still a SIGTERM
/// with the 2 s floor, never a bare SIGKILL (timeout 0).
#[tokio::test(start_paused = true)]
async fn a_stop_that_never_reached_the_runtime_is_sent_again_as_sigterm() {
    let p = hooked("p5", 3);
    let r = running(&p);
    let t0 = Instant::now();
    r.rt.fail_stops_until(t0 + Duration::from_secs(5));
    r.workers.upsert(deleted(&p, 3));
    until(&r.workers, "p5", PodPhase::Finished).await;
    let calls = r.rt.calls();
    assert_eq!(hooks(&calls).len(), 1, "the hook runs once: {calls:?}");
    let stops = r.rt.stops_of("p5-app");
    assert!(!stops.is_empty(), "{calls:?}");
    assert!(stops[0].1 >= t0 + Duration::from_secs(5), "{stops:?}");
    assert_eq!(
        stops[0].0,
        crate::terminating::grace::MIN_CONTAINER_GRACE,
        "SIGTERM with the floor, not timeout 0: {stops:?}"
    );
    assert_eq!(r.rt.exit_code("p5-app"), Some(137));
}

/// Item 5, across a restart: the record says a stop was about to be sent (reaplet died
/// before the runtime answered it), its deadline long past, the hook never started. The
/// container still runs, never signalled: it gets its hook, then SIGTERM with the 2 s floor.
#[tokio::test(start_paused = true)]
async fn a_stop_recorded_but_never_answered_is_resumed_with_the_hook_and_sigterm() {
    let p = hooked("p6", 30);
    let r = running(&p);
    let record = crate::terminating::records::RecordFile::for_pod(
        &r.workers.inner.config.root_dir,
        &PodUid::parse("p6").unwrap(),
    );
    // what reaplet writes just before it sends the stop (the format main wrote: a deadline)
    std::fs::create_dir_all(record.path().parent().unwrap()).unwrap();
    let ms = crate::wall_ns() / 1_000_000 - 60_000;
    std::fs::write(record.path(), format!(r#"{{"stops":{{"p6-app":{ms}}}}}"#)).unwrap();
    let t0 = Instant::now();
    r.workers.upsert(resumed(&p, 30, -60));
    until(&r.workers, "p6", PodPhase::Finished).await;
    let calls = r.rt.calls();
    let hooks = hooks(&calls);
    assert_eq!(hooks.len(), 1, "its hook: {calls:?}");
    let stops = r.rt.stops_of("p6-app");
    assert_eq!(
        stops.first().map(|s| s.0),
        Some(crate::terminating::grace::MIN_CONTAINER_GRACE),
        "SIGTERM with the floor: {calls:?}"
    );
    assert!(stops[0].1 >= hooks[0] + Duration::from_secs(1));
    assert!(stops[0].1 - t0 < Duration::from_secs(2), "{stops:?}");
}

/// Item 4: a stop the runtime answered, its deadline 20 s ahead, and the wall clock stepped
/// 60 s forward since it was recorded (NTP, an operator): resumed, it continues to the same
/// deadline on CLOCK_BOOTTIME, not 40 s past it on the wall clock (main, whose records held
/// only the wall-clock deadline, SIGKILLed at once: the same record in its format, a deadline
/// 40 s behind this clock, is the case above and got timeout 0).
#[tokio::test(start_paused = true)]
async fn a_forward_wall_clock_step_never_shortens_a_resumed_stop() {
    let p = api_pod("p4", 30);
    let r = running(&p);
    let deadline = crate::deadline::Stamp::now().plus_ms(20_000);
    let stepped = crate::deadline::Stamp {
        wall_ms: deadline.wall_ms - 60_000,
        ..deadline
    };
    let stop = crate::terminating::records::StopRecord {
        deadline: stepped,
        answered: true,
        grace: Some(30),
    };
    recorded(&r, "p4", stop);
    r.workers.upsert(resumed(&p, 30, 20));
    until(&r.workers, "p4", PodPhase::Finished).await;
    let stops = r.rt.stops_of("p4-app");
    assert!(
        (19..=20).contains(&stops[0].0),
        "continues to the deadline 20 s ahead: {stops:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_resumed_deadline_survives_later_updates_of_the_object() {
    let p = api_pod("p9", 30);
    let r = running(&p);
    // resumed after a restart, its deadline long past and its stop sent before (the
    // record says so); then the object is updated again (a status patch, say) without
    // the deadline
    let stop = crate::terminating::records::StopRecord {
        deadline: crate::deadline::Stamp::now().plus_ms(-60_000),
        answered: true,
        grace: Some(30),
    };
    recorded(&r, "p9", stop);
    r.workers.upsert(resumed(&p, 30, -60));
    r.workers.upsert(deleted(&p, 30));
    until(&r.workers, "p9", PodPhase::Finished).await;
    let stops = r.rt.stops_of("p9-app");
    assert!(
        stops.iter().all(|(t, _)| *t == 0),
        "past the deadline every stop is an immediate SIGKILL: {stops:?}"
    );
}

/// A stop sent again after one restart (recorded `resent`) and never answered either: reaplet
/// was SIGKILLed twice between recording a stop and the runtime taking it (CI's crash test saw
/// a TERM-trapping container exit 137 with no SIGTERM in containerd's log). Past its deadline
/// it is still a SIGTERM with the floor: no answer means no SIGTERM may have gone out yet.
#[tokio::test(start_paused = true)]
async fn a_resent_stop_never_answered_is_still_a_sigterm_past_its_deadline() {
    let p = api_pod("p10", 5);
    let r = running(&p);
    let stop = crate::terminating::records::StopRecord {
        deadline: crate::deadline::Stamp::now().plus_ms(-1_000),
        answered: false,
        grace: Some(5),
    };
    recorded(&r, "p10", stop);
    r.workers.upsert(resumed(&p, 5, -1));
    tokio::time::timeout(
        Duration::from_secs(60),
        until(&r.workers, "p10", PodPhase::Finished),
    )
    .await
    .expect("finished");
    let stops = r.rt.stops_of("p10-app");
    assert_eq!(
        stops.first().map(|s| s.0),
        Some(crate::terminating::grace::MIN_CONTAINER_GRACE),
        "SIGTERM with the floor, not a bare SIGKILL: {stops:?}"
    );
}

/// The other side of the case above: a stop in flight for a second reached the runtime (which
/// signals as it takes it), so the record says answered and a restart from then on continues
/// to its deadline instead of granting another floor.
#[tokio::test(start_paused = true)]
async fn a_stop_in_flight_for_a_second_is_recorded_as_answered() {
    let p = api_pod("p11", 30);
    let r = running(&p);
    r.workers.upsert(deleted(&p, 30));
    let record = crate::terminating::records::RecordFile::for_pod(
        &r.workers.inner.config.root_dir,
        &PodUid::parse("p11").unwrap(),
    );
    let answered = || record.load().stops.get("p11-app").map(|s| s.answered);
    let t0 = Instant::now();
    while answered().is_none() {
        assert!(t0.elapsed() < Duration::from_secs(1), "no stop recorded");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(answered(), Some(false), "recorded before it is sent");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(answered(), Some(true), "in flight for a second: answered");
}

/// Issue 38, item 3: the runtime restarts between the kill's list and the hook's exec
/// (ExecSync and StopContainer refused for 5 s). The hook never reached the runtime, so a later
/// attempt runs it, then SIGTERM; before, the hook was claimed for good on the first attempt
/// and the retry went straight to SIGTERM (no ExecSync at all).
#[tokio::test(start_paused = true)]
async fn a_prestop_hook_that_never_reached_the_runtime_runs_on_the_next_attempt() {
    let p = hooked("p13", 3);
    let r = running(&p);
    let t0 = Instant::now();
    r.rt.fail_execs_until(t0 + Duration::from_secs(5));
    r.rt.fail_stops_until(t0 + Duration::from_secs(5));
    r.workers.upsert(deleted(&p, 3));
    until(&r.workers, "p13", PodPhase::Finished).await;
    let calls = r.rt.calls();
    let hooks = hooks(&calls);
    assert_eq!(hooks.len(), 1, "the hook runs once: {calls:?}");
    assert!(hooks[0] >= t0 + Duration::from_secs(5), "{calls:?}");
    let stops = r.rt.stops_of("p13-app");
    assert!(
        stops[0].0 >= crate::terminating::grace::MIN_CONTAINER_GRACE,
        "a SIGTERM, never a bare SIGKILL: {stops:?}"
    );
    assert!(
        stops[0].1 >= hooks[0] + Duration::from_secs(1),
        "SIGTERM after the hook: {calls:?}"
    );
    assert_eq!(r.rt.exit_code("p13-app"), Some(137));
}

/// Issue 38, item 4: a StopContainer waiting for one of reaplet's own call slots has not
/// reached the runtime, however long it waits: only the time the runtime holds the call makes
/// it answered (before: answered 1 s after the call began, queued or not, so a restart then
/// continued it to its deadline: a bare SIGKILL for a container never sent SIGTERM).
#[tokio::test(start_paused = true)]
async fn a_stop_queued_for_a_call_slot_is_not_answered() {
    let p = api_pod("p12", 30);
    let r = running(&p);
    let t0 = Instant::now();
    r.rt.queue_stops_until(t0 + Duration::from_secs(3));
    r.workers.upsert(deleted(&p, 30));
    let record = crate::terminating::records::RecordFile::for_pod(
        &r.workers.inner.config.root_dir,
        &PodUid::parse("p12").unwrap(),
    );
    let answered = || record.load().stops.get("p12-app").map(|s| s.answered);
    while answered().is_none() {
        assert!(t0.elapsed() < Duration::from_secs(1), "no stop recorded");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep_until(t0 + Duration::from_millis(2500)).await;
    assert_eq!(answered(), Some(false), "queued, never reached the runtime");
    tokio::time::sleep_until(t0 + Duration::from_millis(4500)).await;
    assert_eq!(
        answered(),
        Some(true),
        "held by the runtime for over a second"
    );
    assert_eq!(r.rt.stops_of("p12-app")[0].1, t0 + Duration::from_secs(3));
}
