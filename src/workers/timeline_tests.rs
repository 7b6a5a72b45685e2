//! The termination timeline as a pod worker records it (issue 31, item 1), on a fake runtime
//! in paused time.

use super::tests::rig;
use super::tests::with_fake_runtime::{api_pod, deleted, desire, until};
use crate::cri::fake::Behaviour;
use crate::lifecycle::PodPhase;
use crate::pod;
use crate::terminating::grace::GraceSource;
use crate::timeline::{Query, Step, StopKind};
use std::time::Duration;

#[tokio::test(start_paused = true)]
async fn a_deleted_pod_with_a_hook_killed_at_its_grace_has_every_step_in_order() {
    let mut p = api_pod("t1", 30);
    p.containers[0].pre_stop = Some(pod::Handler::Exec {
        command: vec!["sleep".into(), "1".into()],
    });
    let r = rig();
    r.rt.add_pod("t1", &[("app", Behaviour::IgnoreTerm)]);
    desire(&r.workers, std::slice::from_ref(&p));
    r.workers.upsert(deleted(&p, 5));
    tokio::time::timeout(
        Duration::from_secs(60),
        until(&r.workers, "t1", PodPhase::Finished),
    )
    .await
    .expect("finished within the grace and its cleanup");
    let t = r.workers.timelines().find(&Query::parse("t1")).unwrap();
    let steps: Vec<&Step> = t.entries.iter().map(|e| &e.step).collect();
    assert!(
        matches!(
            steps[0],
            Step::Reason { reason, source, grace: 5, grace_from: GraceSource::Deletion, .. }
                if reason == "deleted" && source == "api"
        ),
        "{steps:#?}"
    );
    assert_eq!(
        steps[1],
        &Step::KillStarted {
            attempt: 1,
            grace: 5
        }
    );
    let at = |f: &dyn Fn(&Step) -> bool| {
        t.entries
            .iter()
            .find(|e| f(&e.step))
            .map(|e| e.at_ms)
            .unwrap_or_else(|| panic!("missing step: {steps:#?}"))
    };
    let hook = at(&|s| matches!(s, Step::PreStopStarted));
    let hook_end = at(&|s| matches!(s, Step::PreStopEnded { ok: true, .. }));
    let term = at(&|s| {
        matches!(
            s,
            Step::StopSent {
                kind: StopKind::Fresh,
                ..
            }
        )
    });
    let kill = at(&|s| matches!(s, Step::Sigkill));
    let stopped = at(&|s| matches!(s, Step::ContainersStopped));
    let volumes = at(&|s| matches!(s, Step::VolumesDone { ok: true }));
    let cgroup = at(&|s| matches!(s, Step::CgroupRemoved { .. }));
    assert!(hook <= hook_end && hook_end <= term && term < kill && kill <= stopped);
    assert!(stopped <= volumes && volumes <= cgroup);
    // the SIGKILL lands on the grace deadline, which the timeline carries
    assert_eq!(t.deadline_ms, Some(5000.0));
    assert!((4999.0..=5100.0).contains(&kill), "{kill}");
    assert!(steps.iter().any(|s| matches!(
        s,
        Step::Exited { code: 137, signal: Some(sig), before_kill: false } if sig == "SIGKILL"
    )));
    assert!(
        steps
            .iter()
            .any(|s| matches!(s, Step::SandboxStopped { .. }))
    );
    assert_eq!(steps.last(), Some(&&Step::Finished));
    assert!(t.finished_ms.is_some());
    // every container step names its container
    for e in &t.entries {
        let container_step = matches!(
            e.step,
            Step::PreStopStarted
                | Step::PreStopEnded { .. }
                | Step::StopSent { .. }
                | Step::Sigkill
                | Step::Exited { .. }
        );
        assert_eq!(e.container.is_some(), container_step, "{e:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_shorter_grace_is_a_second_reason_and_attempt_with_an_earlier_deadline() {
    let p = api_pod("t2", 30);
    let r = rig();
    r.rt.add_pod("t2", &[("app", Behaviour::IgnoreTerm)]);
    desire(&r.workers, std::slice::from_ref(&p));
    r.workers.upsert(deleted(&p, 20));
    tokio::time::sleep(Duration::from_secs(1)).await;
    r.workers
        .kill(
            &p.uid,
            super::KillRequest::new(crate::lifecycle::KillReason::Orphan).grace(Some(3)),
        )
        .unwrap();
    tokio::time::timeout(
        Duration::from_secs(60),
        until(&r.workers, "t2", PodPhase::Finished),
    )
    .await
    .unwrap();
    let t = r.workers.timelines().find(&Query::parse("t2")).unwrap();
    let reasons: Vec<(String, i64, GraceSource)> = t
        .entries
        .iter()
        .filter_map(|e| match &e.step {
            Step::Reason {
                reason,
                grace,
                grace_from,
                ..
            } => Some((reason.to_string(), *grace, *grace_from)),
            _ => None,
        })
        .collect();
    assert_eq!(
        reasons,
        vec![
            ("deleted".into(), 20, GraceSource::Deletion),
            ("orphan".into(), 3, GraceSource::Override)
        ]
    );
    let attempts = t
        .entries
        .iter()
        .filter(|e| matches!(e.step, Step::KillStarted { .. }))
        .count();
    assert_eq!(attempts, 2);
    assert_eq!(t.deadline_ms, Some(4000.0), "1 s in, then 3 s");
}
