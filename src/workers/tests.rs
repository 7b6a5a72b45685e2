//! The workers against a fake runtime (paused time).

use super::housekeeping::all_regular_exited;
use super::*;
use crate::cgroups::{CgroupDriver, CgroupNaming, CgroupVersion, Hierarchy};
use crate::cri::fake::FakeRuntime;
use crate::cri::{ContainerRunState, RuntimeContainer};
use crate::events::EventReason;
use crate::events::PodEvent;
use crate::lifecycle::{KillReason, PodPhase};
use crate::pod::{self, PodUid};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

fn rc(name: &str, attempt: u32, state: ContainerRunState) -> RuntimeContainer {
    RuntimeContainer {
        id: format!("{name}-{attempt}"),
        sandbox_id: "s".into(),
        name: name.into(),
        attempt,
        pod_uid: "u".into(),
        state,
        created_at: i64::from(attempt),
        labels: HashMap::new(),
        annotations: HashMap::new(),
    }
}

fn pod(names: &[&str]) -> PodInfo {
    let uid = PodUid::parse("u").unwrap();
    let mut p = PodInfo::from_runtime(&uid, &[], &[]);
    p.containers = names
        .iter()
        .map(|n| pod::ContainerSpec {
            name: (*n).into(),
            pre_stop: None,
            ports: vec![],
            restart: None,
        })
        .collect();
    p
}

/// The pipeline on a fake runtime (its housekeeping loop not started), shared by the workers'
/// unit tests.
pub(super) struct Rig {
    pub(super) workers: PodWorkers<FakeRuntime>,
    pub(super) rt: Arc<FakeRuntime>,
    pub(super) authority: Arc<Authority>,
    pub(super) events: mpsc::Receiver<PodEvent>,
    pub(super) cancel: CancellationToken,
    _dir: tempfile::TempDir,
}

pub(super) fn rig() -> Rig {
    rig_with(|_| {})
}

/// [`rig`] with its pipeline configuration changed by `change`.
pub(super) fn rig_with(change: impl FnOnce(&mut PipelineConfig)) -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let mountinfo = dir.path().join("mountinfo");
    std::fs::write(&mountinfo, "").unwrap();
    let cg = dir.path().join("cgroup");
    std::fs::create_dir_all(&cg).unwrap();
    let cgroups = CgroupManager::new(
        vec![Hierarchy {
            mount_point: cg,
            version: CgroupVersion::V2,
        }],
        CgroupNaming::new(CgroupDriver::Cgroupfs, "/").unwrap(),
    );
    let rt = Arc::new(FakeRuntime::default());
    let (sink, events) = EventSink::channel(64);
    let authority = Arc::new(Authority::default());
    let cancel = CancellationToken::new();
    let mut config = PipelineConfig {
        root_dir: dir.path().join("kubelet"),
        mountinfo,
        ..PipelineConfig::default()
    };
    change(&mut config);
    let workers = PodWorkers::new(
        rt.clone(),
        cgroups,
        config,
        sink,
        authority.clone(),
        cancel.clone(),
        TaskTracker::new(),
    );
    Rig {
        workers,
        rt,
        authority,
        events,
        cancel,
        _dir: dir,
    }
}

#[test]
fn leftovers_are_swept_only_once_untouched_long_enough() {
    use super::sweeps::untouched_for;
    let dir = tempfile::tempdir().unwrap();
    assert!(
        !untouched_for(dir.path(), Duration::from_secs(60)),
        "just made"
    );
    assert!(untouched_for(dir.path(), Duration::ZERO));
    assert!(!untouched_for(
        &dir.path().join("missing"),
        Duration::from_secs(1)
    ));
}

#[test]
fn completion_needs_every_regular_container_exited() {
    let p = pod(&["a", "b"]);
    let a = rc("a", 0, ContainerRunState::Exited);
    let b0 = rc("b", 0, ContainerRunState::Exited);
    let b1 = rc("b", 1, ContainerRunState::Running);
    assert!(!all_regular_exited(&p, &[&a]), "b never started");
    assert!(all_regular_exited(&p, &[&a, &b0]));
    assert!(!all_regular_exited(&p, &[&a, &b0, &b1]), "b restarted");
    assert!(!all_regular_exited(&pod(&[]), &[]));
}

pub(super) mod with_fake_runtime {
    use super::*;
    use crate::cri::fake::Behaviour;

    pub(in crate::workers) fn api_pod(uid: &str, spec_grace: i64) -> PodInfo {
        let mut p = pod(&["app"]);
        p.uid = PodUid::parse(uid).unwrap();
        p.spec_grace = Some(spec_grace);
        p
    }

    pub(in crate::workers) fn deleted(p: &PodInfo, grace: i64) -> PodInfo {
        let mut d = p.clone();
        d.deletion_requested = true;
        d.deletion_grace = Some(grace);
        d
    }

    /// The pods as a source's complete list, through the seam sources use.
    pub(in crate::workers) fn desire(w: &PodWorkers<FakeRuntime>, pods: &[PodInfo]) {
        for p in pods {
            w.upsert(p.clone());
        }
        w.mark_source_synced("test", crate::wall_ns());
    }

    pub(in crate::workers) async fn until(
        w: &PodWorkers<FakeRuntime>,
        uid: &str,
        phase: PodPhase,
    ) -> Instant {
        let uid = PodUid::parse(uid).unwrap();
        loop {
            if w.view(&uid).is_some_and(|v| v.phase == phase) {
                return Instant::now();
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn shorter_grace_cuts_the_running_kill_short() {
        let r = rig();
        r.rt.add_pod("p1", &[("app", Behaviour::IgnoreTerm)]);
        let p = api_pod("p1", 30);
        desire(&r.workers, std::slice::from_ref(&p));
        let t0 = Instant::now();
        r.workers.upsert(deleted(&p, 30));
        tokio::time::sleep(Duration::from_secs(5)).await;
        r.workers.upsert(deleted(&p, 3));
        let done = until(&r.workers, "p1", PodPhase::Finished).await;
        let stops = r.rt.stops_of("p1-app");
        assert_eq!(stops.len(), 2);
        assert_eq!(stops[0], (30, t0));
        assert_eq!(stops[1], (3, t0 + Duration::from_secs(5)));
        assert!(done - t0 < Duration::from_millis(8100), "{:?}", done - t0);
        assert_eq!(r.rt.exit_code("p1-app"), Some(137));
    }

    /// Issue 28, item 1: containerd answers its lists `Unavailable` for 5 s when a grace-3
    /// pod (a TERM-ignoring container with an exec preStop hook) is deleted. The retry that
    /// gets through is past the first attempt's deadline, but the container was never sent a
    /// stop: it still gets its hook and a SIGTERM with the 2 s floor, never a bare SIGKILL.
    #[tokio::test(start_paused = true)]
    async fn a_kill_whose_first_attempts_failed_still_runs_the_hook_then_sigterm() {
        use crate::cri::fake::Call;
        let r = rig();
        r.rt.add_pod("p28", &[("app", Behaviour::IgnoreTerm)]);
        let mut p = api_pod("p28", 3);
        p.containers[0].pre_stop = Some(pod::Handler::Exec {
            command: vec!["sleep".into(), "1".into()],
        });
        desire(&r.workers, std::slice::from_ref(&p));
        let t0 = Instant::now();
        r.rt.fail_lists_until(t0 + Duration::from_secs(5));
        r.workers.upsert(deleted(&p, 3));
        until(&r.workers, "p28", PodPhase::Finished).await;
        let calls = r.rt.calls();
        let hooks: Vec<Instant> = calls
            .iter()
            .filter_map(|c| match c {
                Call::ExecSync { at, .. } => Some(*at),
                _ => None,
            })
            .collect();
        let stops = r.rt.stops_of("p28-app");
        assert_eq!(hooks.len(), 1, "the preStop hook runs once: {calls:?}");
        assert!(hooks[0] >= t0 + Duration::from_secs(5), "{calls:?}");
        assert_eq!(
            stops.first().map(|s| s.0),
            Some(2),
            "SIGTERM with the 2 s floor after the hook, not timeout 0: {stops:?}"
        );
        assert!(stops[0].1 >= hooks[0] + Duration::from_secs(1), "{calls:?}");
        assert_eq!(r.rt.exit_code("p28-app"), Some(137));
    }

    #[tokio::test(start_paused = true)]
    async fn updates_coalesce_and_kill_notices_are_never_lost() {
        let r = rig();
        r.rt.add_pod(
            "p2",
            &[("app", Behaviour::ExitOnTerm(Duration::from_secs(1)))],
        );
        let p = api_pod("p2", 30);
        desire(&r.workers, std::slice::from_ref(&p));
        let uid = p.uid.clone();
        let mut notices = Vec::new();
        for g in [20, 10, 15, 5] {
            r.workers.upsert(deleted(&p, g));
            let (tx, rx) = oneshot::channel();
            r.workers
                .kill(
                    &uid,
                    KillRequest {
                        grace_override: Some(g + 1),
                        reason: KillReason::Orphan,
                        done: Some(tx),
                    },
                )
                .unwrap();
            notices.push(rx);
        }
        for n in notices {
            n.await.expect("every kill notice completes");
        }
        until(&r.workers, "p2", PodPhase::Finished).await;
        // the newest, smallest value won
        assert_eq!(r.workers.view(&uid).unwrap().grace, Some(5));
        // a kill after the end completes at once
        let (tx, rx) = oneshot::channel();
        r.workers
            .kill(
                &uid,
                KillRequest {
                    grace_override: None,
                    reason: KillReason::Orphan,
                    done: Some(tx),
                },
            )
            .unwrap();
        tokio::time::timeout(Duration::from_secs(1), rx)
            .await
            .expect("a kill after the end completes at once")
            .expect("and is not dropped");
    }

    #[tokio::test(start_paused = true)]
    async fn hung_stop_raises_exceeded_grace_period() {
        let mut r = rig();
        r.rt.add_pod("p3", &[("app", Behaviour::Hang)]);
        let p = api_pod("p3", 3);
        desire(&r.workers, std::slice::from_ref(&p));
        let t0 = Instant::now();
        r.workers.upsert(deleted(&p, 3));
        let ev = loop {
            match r.events.recv().await {
                Some(e) if e.reason == EventReason::ExceededGracePeriod => break e,
                Some(_) => continue,
                None => panic!("event channel closed"),
            }
        };
        assert_eq!(ev.uid.as_str(), "p3");
        // grace 3 + slack 10
        assert_eq!(Instant::now() - t0, Duration::from_secs(13));
        assert_eq!(r.workers.view(&p.uid).unwrap().phase, PodPhase::Terminating);
    }

    #[tokio::test(start_paused = true)]
    async fn standby_authority_holds_every_kill() {
        let r = rig();
        r.authority.set_active(false);
        r.rt.add_pod("p4", &[("app", Behaviour::ExitOnTerm(Duration::ZERO))]);
        let p = api_pod("p4", 30);
        desire(&r.workers, std::slice::from_ref(&p));
        r.workers.upsert(deleted(&p, 30));
        tokio::time::sleep(Duration::from_secs(20)).await;
        assert!(
            r.rt.calls().is_empty(),
            "a kill went through in standby: {:?}",
            r.rt.calls()
        );
        // nothing is kept for it while another agent may end it: no worker, no timeline
        assert_eq!(r.workers.view(&p.uid).unwrap().phase, PodPhase::Sync);
        assert!(r.workers.timelines().all().is_empty());
        // the takeover (housekeeping calls this when the authority turns on) ends it
        r.authority.set_active(true);
        r.workers.take_over();
        until(&r.workers, "p4", PodPhase::Finished).await;
        assert_eq!(r.rt.exit_code("p4-app"), Some(0));
    }

    /// Issue 37, item 2: a pod the kubelet ends while reaplet stands by costs reaplet nothing
    /// that outlives it (before: a worker parked on its held kill for ever, listed as
    /// terminating, its timeline open); a takeover afterwards has nothing to do for it.
    #[tokio::test(start_paused = true)]
    async fn a_pod_ended_by_the_kubelet_in_standby_leaves_nothing_behind() {
        let r = rig();
        r.authority.set_active(false);
        let p = api_pod("p4b", 30);
        desire(&r.workers, std::slice::from_ref(&p));
        r.workers.upsert(deleted(&p, 30));
        // the kubelet ended it: the object is gone (DELETED)
        r.workers.remove(&p.uid, Some(1));
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(
            r.workers.view(&p.uid).is_none(),
            "{:?}",
            r.workers.snapshot()
        );
        assert!(r.workers.snapshot().is_empty());
        assert!(r.workers.timelines().all().is_empty());
        r.authority.set_active(true);
        r.workers.take_over();
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(r.workers.snapshot().is_empty());
        assert!(r.rt.calls().is_empty(), "{:?}", r.rt.calls());
    }

    /// A worker parked on a held kill (the agent went passive before its kill started: a
    /// hand-back) is released once its pod is gone (the registry step housekeeping takes):
    /// it ends without a CRI call, its timeline is dropped, and nothing lists it.
    #[tokio::test(start_paused = true)]
    async fn a_held_worker_is_released_when_its_pod_is_gone_in_standby() {
        let r = rig();
        r.rt.add_pod("p4c", &[("app", Behaviour::IgnoreTerm)]);
        let p = api_pod("p4c", 30);
        desire(&r.workers, std::slice::from_ref(&p));
        // spawned while active; the hand-back comes before its kill starts
        r.workers.upsert(deleted(&p, 30));
        r.authority.set_active(false);
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(r.workers.view(&p.uid).unwrap().phase, PodPhase::Terminating);
        assert_eq!(
            r.workers.timelines().all().len(),
            1,
            "the held kill's timeline"
        );
        r.workers.remove(&p.uid, Some(1));
        r.workers.registry().release(&p.uid);
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(
            r.workers.snapshot().is_empty(),
            "{:?}",
            r.workers.snapshot()
        );
        assert!(r.workers.timelines().all().is_empty());
        // the worker task ended: the tracker empties once closed
        r.workers.inner.tracker.close();
        tokio::time::timeout(Duration::from_secs(5), r.workers.inner.tracker.wait())
            .await
            .expect("the released worker ended");
        // a takeover afterwards: nothing to do for it
        r.authority.set_active(true);
        r.workers.take_over();
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(r.rt.calls().is_empty(), "{:?}", r.rt.calls());
    }

    /// Issue 37: standby watches no pods; a source that goes passive forgets what it delivered
    /// (no kill, no orphan judged on what it no longer vouches for), and its first list after
    /// a takeover ends the deleted pod still present but leaves the terminal ones, finished by
    /// the kubelet long ago or not, to the relist (which ends only one still running).
    #[tokio::test(start_paused = true)]
    async fn a_takeover_list_ends_the_deleted_and_leaves_the_terminal_to_the_relist() {
        let r = rig();
        r.rt.add_pod("p4d", &[("app", Behaviour::ExitOnTerm(Duration::ZERO))]);
        let running = api_pod("p4d", 30);
        let mut done_long_ago = api_pod("p4e", 30);
        desire(&r.workers, &[running.clone(), done_long_ago.clone()]);
        // hand-back: the source forgets what it delivered; nothing is stopped
        r.authority.set_active(false);
        r.workers
            .source_paused("test", [running.uid.clone(), done_long_ago.uid.clone()]);
        assert!(!r.workers.is_synced());
        assert!(
            r.workers.snapshot().is_empty(),
            "{:?}",
            r.workers.snapshot()
        );
        // the kubelet dies; meanwhile one pod was deleted and one completed, its sandbox and
        // containers removed by the kubelet
        done_long_ago.terminal_phase = true;
        r.authority.set_active(true);
        r.workers.upsert_at_takeover(deleted(&running, 30));
        r.workers.upsert_at_takeover(done_long_ago.clone());
        until(&r.workers, "p4d", PodPhase::Finished).await;
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(r.rt.exit_code("p4d-app"), Some(0));
        assert_eq!(
            r.workers.view(&done_long_ago.uid).map(|v| v.step),
            Some(Step::Running),
            "a terminal pod listed at the takeover got a worker"
        );
        assert!(
            !format!("{:?}", r.rt.calls()).contains("p4e"),
            "{:?}",
            r.rt.calls()
        );
        // a later list while acting is a live one again: a terminal pod first seen there ends
        let mut fresh = api_pod("p4f", 30);
        fresh.terminal_phase = true;
        r.workers.upsert(fresh.clone());
        assert_ne!(
            r.workers.view(&fresh.uid).map(|v| v.step),
            Some(Step::Running)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn cancellation_abandons_work_and_never_kills() {
        let r = rig();
        r.rt.add_pod("p5", &[("app", Behaviour::IgnoreTerm)]);
        let p = api_pod("p5", 30);
        desire(&r.workers, std::slice::from_ref(&p));
        r.workers.inner.cancel.cancel();
        r.workers.upsert(deleted(&p, 30));
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(r.rt.calls().is_empty());
        r.workers.inner.tracker.close();
        r.workers.inner.tracker.wait().await;
    }

    /// A grace of i64::MAX seconds (a hostile or absurd object) never kills the worker: its
    /// deadline saturates, and a later shorter kill still ends the pod.
    #[tokio::test(start_paused = true)]
    async fn an_absurd_grace_never_kills_the_worker() {
        let r = rig();
        r.rt.add_pod("p6", &[("app", Behaviour::IgnoreTerm)]);
        let mut p = api_pod("p6", 30);
        p.spec_grace = Some(i64::MAX);
        desire(&r.workers, std::slice::from_ref(&p));
        r.workers.upsert(deleted(&p, i64::MAX));
        tokio::time::sleep(Duration::from_secs(5)).await;
        let v = r.workers.view(&p.uid).unwrap();
        assert_eq!(v.phase, PodPhase::Terminating);
        assert_eq!(v.grace, Some(i64::MAX));
        r.workers
            .kill(&p.uid, KillRequest::new(KillReason::Orphan).grace(Some(1)))
            .unwrap();
        let done = tokio::time::timeout(
            Duration::from_secs(60),
            until(&r.workers, "p6", PodPhase::Finished),
        )
        .await;
        assert!(
            done.is_ok(),
            "the worker never finished: {:?}",
            r.workers.view(&p.uid)
        );
        assert_eq!(r.rt.exit_code("p6-app"), Some(137));
    }

    /// A worker task that ends by panic is detected, logged with the pod UID and restarted: the
    /// pod still ends (its kill is sent again).
    #[tokio::test(start_paused = true)]
    async fn a_panicking_worker_is_restarted_and_the_pod_still_ends() {
        let r = rig();
        r.rt.add_pod("p7", &[("app", Behaviour::PanicOnce)]);
        let p = api_pod("p7", 30);
        desire(&r.workers, std::slice::from_ref(&p));
        r.workers.upsert(deleted(&p, 3));
        let done = tokio::time::timeout(
            Duration::from_secs(120),
            until(&r.workers, "p7", PodPhase::Finished),
        )
        .await;
        assert!(
            done.is_ok(),
            "the pod never ended: {:?}",
            r.workers.view(&p.uid)
        );
        assert_eq!(r.rt.exit_code("p7-app"), Some(137));
    }

    /// After a (re)subscription to container events the relist keeps the fast period for a
    /// while (an exit just before the runtime registered the stream may reach its view only
    /// later), then slows to the period with events.
    #[tokio::test(start_paused = true)]
    async fn after_a_subscription_the_relist_keeps_the_fast_period_for_a_while() {
        let r = rig();
        r.rt.serve_events();
        let t0 = Instant::now();
        let task = tokio::spawn(r.workers.clone().run_housekeeping());
        tokio::time::sleep(Duration::from_secs(40)).await;
        r.cancel.cancel();
        let _ = task.await;
        let at: Vec<u64> =
            r.rt.relists()
                .iter()
                .map(|t| (*t - t0).as_millis() as u64)
                .collect();
        let cfg = PipelineConfig::default();
        let (fast, slow) = (cfg.relist_period, cfg.relist_period_with_events);
        // the window: a relist every fast period (the one at once, then ~9 more)
        let window = at.iter().filter(|ms| **ms < 10_000).count() as u64;
        assert!(
            window + 1 >= 10_000 / fast.as_millis() as u64,
            "{window} relists in the 10 s after the subscription: {at:?}"
        );
        // then the period with events
        let later = at
            .iter()
            .filter(|ms| (11_000..40_000).contains(*ms))
            .count() as u64;
        assert!(
            later <= 29_000 / slow.as_millis() as u64 + 1,
            "{later} relists in the 29 s after the window: {at:?}"
        );
    }

    /// One step a hostile source may take against a running pod.
    #[derive(Debug, Clone)]
    enum Op {
        Deleted(i64),
        Kill(Option<i64>, KillReason),
        Removed(Option<i64>),
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        let grace = prop_oneof![
            any::<i64>(),
            Just(i64::MAX),
            Just(i64::MIN),
            Just(0i64),
            -3i64..40
        ];
        let reason = prop_oneof![
            Just(KillReason::Orphan),
            Just(KillReason::Completed),
            Just(KillReason::ObjectGone),
        ];
        prop_oneof![
            grace.clone().prop_map(Op::Deleted),
            (proptest::option::of(grace.clone()), reason).prop_map(|(g, r)| Op::Kill(g, r)),
            proptest::option::of(grace).prop_map(Op::Removed),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]

        /// Any sequence of hostile graces and reasons through the seam, against the worker
        /// itself: it never dies (a final 1 s kill always ends the pod, SIGKILLed), and what
        /// it shows keeps the invariants (grace >= 1, never growing).
        #[test]
        fn the_worker_survives_any_sequence_of_graces(ops in proptest::collection::vec(op(), 1..6)) {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .unwrap();
            let result: Result<(), String> = rt.block_on(async {
                let r = rig();
                r.rt.add_pod("px", &[("app", Behaviour::IgnoreTerm)]);
                let p = api_pod("px", 30);
                desire(&r.workers, std::slice::from_ref(&p));
                let mut held: Option<i64> = None;
                for op in ops {
                    match op {
                        Op::Deleted(g) => r.workers.upsert(deleted(&p, g)),
                        Op::Kill(g, reason) => {
                            let _ = r.workers.kill(&p.uid, KillRequest::new(reason).grace(g));
                        }
                        Op::Removed(g) => r.workers.remove(&p.uid, g),
                    }
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    if let Some(g) = r.workers.view(&p.uid).and_then(|v| v.grace) {
                        if g < 1 || held.is_some_and(|h| g > h) {
                            return Err(format!("grace {held:?} -> {g}"));
                        }
                        held = Some(g);
                    }
                }
                let _ = r
                    .workers
                    .kill(&p.uid, KillRequest::new(KillReason::Orphan).grace(Some(1)));
                let done = tokio::time::timeout(
                    Duration::from_secs(120),
                    until(&r.workers, "px", PodPhase::Finished),
                )
                .await;
                if done.is_err() {
                    return Err(format!("the worker never finished: {:?}", r.workers.view(&p.uid)));
                }
                Ok(())
            });
            proptest::prop_assert!(result.is_ok(), "{:?}", result);
        }
    }
}

/// Every working-pods combination (lifecycle state x source) is exposed, at 0, as soon as the
/// workers have the metrics, before any pod (the registry itself knows neither set).
#[tokio::test]
async fn working_pods_gauges_are_present_at_zero() {
    use crate::metrics::{Exposition, Metrics};
    let r = rig();
    let m = Arc::new(Metrics::new());
    r.workers.set_metrics(m.clone());
    let text = m.encode(Exposition::Prometheus);
    let mut series = 0;
    for phase in PodPhase::ALL {
        for source in PodSource::ALL {
            let line = format!(
                "reaplet_working_pods{{lifecycle=\"{}\",config=\"{}\"}} 0",
                phase.as_str(),
                source.as_str()
            );
            assert!(text.contains(&line), "{line} missing:\n{text}");
            series += 1;
        }
    }
    let listed = text
        .lines()
        .filter(|l| l.starts_with("reaplet_working_pods{"))
        .count();
    assert_eq!(listed, series, "exactly one series per combination");
    // a combination whose pods are all gone reads 0 again at the next count, not its old value
    m.set_working_pods([(("terminating", "api"), 5)]);
    r.workers.update_gauges();
    let text = m.encode(Exposition::Prometheus);
    assert!(
        text.contains("reaplet_working_pods{lifecycle=\"terminating\",config=\"api\"} 0"),
        "{text}"
    );
}
