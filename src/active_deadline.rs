//! `activeDeadlineSeconds`: a pod active on the node longer than its deadline is ended
//! (kubelet counterpart: `pkg/kubelet/active_deadline.go`, registered as a pod sync loop
//! handler and a pod sync handler, run by the sync loop's 1 s tick).
//!
//! Invariants, the kubelet's:
//! * a pod is past its deadline when `now - status.startTime >= activeDeadlineSeconds`; a pod
//!   without a deadline or a start time never is;
//! * it ends with its own grace (no override, no `DisruptionTarget`), its terminal status
//!   `Failed`, reason `DeadlineExceeded`, message [`MESSAGE`], whatever its exit codes; a
//!   Normal `DeadlineExceeded` event; the object is kept;
//! * static pods too: reaplet's own manifests' pods have no API status, their start is the
//!   first sandbox's creation in the runtime (when the kubelet's status manager would have set
//!   `startTime`);
//! * checked every second, and only while reaplet is the node's agent (a passive standby
//!   evaluates nothing and keeps nothing).
//!
//! The wall clock is read here, at the API edge (`status.startTime` is a wall-clock time);
//! the one kill per pod goes through the seam.

use crate::authority::Authority;
use crate::cri::Runtime;
use crate::events::{EventReason, EventSink, PodEvent};
use crate::lifecycle::{KillReason, Requester};
use crate::pod::{PodInfo, PodUid};
use crate::workers::{KillRequest, PodWorkers};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The status reason and the event's.
pub const REASON: &str = "DeadlineExceeded";
/// The status message and the event's.
pub const MESSAGE: &str = "Pod was active on the node longer than the specified deadline";
/// How often deadlines are checked (the kubelet's sync loop tick).
pub const CHECK_EVERY: Duration = Duration::from_secs(1);

/// The kill request's reason for a pod past its deadline.
pub fn kill_reason() -> KillReason {
    KillReason::Requested {
        by: Requester::ActiveDeadline,
        disruption: None,
        reason: Some(REASON.into()),
        message: MESSAGE.into(),
    }
}

/// Whether a pod that started at `start` (Unix seconds) with a deadline of `deadline`
/// seconds is past it at `now_ns` (Unix nanoseconds).
pub fn past(start: i64, deadline: i64, now_ns: i128) -> bool {
    now_ns >= (i128::from(start) + i128::from(deadline)) * 1_000_000_000
}

/// What the checker needs.
pub struct Context<R: Runtime> {
    pub workers: PodWorkers<R>,
    pub runtime: Arc<R>,
    pub events: EventSink,
    pub authority: Arc<Authority>,
}

/// Checks every second, while reaplet is the node's agent, and ends the pods past their
/// deadline.
pub async fn run<R: Runtime>(cx: Context<R>, cancel: CancellationToken) {
    let mut authority = cx.authority.changes();
    let mut ended: HashSet<PodUid> = HashSet::new();
    // static pods' starts, from the runtime (Unix seconds)
    let mut starts: HashMap<PodUid, i64> = HashMap::new();
    loop {
        if !cx.authority.is_active() {
            ended.clear();
            starts.clear();
            tokio::select! {
                _ = cancel.cancelled() => return,
                r = authority.changed() => if r.is_err() { return },
            }
            continue;
        }
        let pods = cx.workers.active_with_deadline();
        ended.retain(|uid| pods.iter().any(|p| &p.uid == uid));
        starts.retain(|uid, _| pods.iter().any(|p| &p.uid == uid));
        for pod in pods {
            if ended.contains(&pod.uid) {
                continue;
            }
            let Some(deadline) = pod.active_deadline_seconds else {
                continue;
            };
            let Some(start) = start_of(&cx, &pod, &mut starts).await else {
                continue;
            };
            if past(start, deadline, crate::wall_ns() as i128) {
                end(&cx, &pod, start, deadline);
                ended.insert(pod.uid.clone());
            }
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(CHECK_EVERY) => {}
        }
    }
}

/// The pod's start: `status.startTime`, else (a static pod of reaplet's manifests) its first
/// sandbox's creation in the runtime, looked up once.
async fn start_of<R: Runtime>(
    cx: &Context<R>,
    pod: &PodInfo,
    starts: &mut HashMap<PodUid, i64>,
) -> Option<i64> {
    if let Some(s) = pod.start_time {
        return Some(s);
    }
    if !pod.static_pod {
        return None;
    }
    if let Some(s) = starts.get(&pod.uid) {
        return Some(*s);
    }
    let sandboxes = cx
        .runtime
        .list_sandboxes(Some(pod.uid.as_str()))
        .await
        .ok()?;
    let first = sandboxes.iter().map(|s| s.created_at).min()?;
    let secs = first.div_euclid(1_000_000_000);
    starts.insert(pod.uid.clone(), secs);
    Some(secs)
}

fn end<R: Runtime>(cx: &Context<R>, pod: &PodInfo, start: i64, deadline: i64) {
    tracing::info!(
        pod = %pod.key(),
        podUID = %pod.uid,
        activeDeadlineSeconds = deadline,
        startTime = start,
        "pod past its active deadline; ending it with its own grace"
    );
    cx.events.record(PodEvent {
        uid: pod.uid.clone(),
        namespace: pod.namespace.clone(),
        name: pod.name.clone(),
        reason: EventReason::DeadlineExceeded,
        message: MESSAGE.into(),
        annotations: Default::default(),
    });
    if let Err(e) = cx.workers.kill(&pod.uid, KillRequest::new(kill_reason())) {
        tracing::warn!(pod = %pod.key(), podUID = %pod.uid, err = %e, "active deadline: the kill was refused");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i128 = 1_000_000_000;

    #[test]
    fn a_pod_is_past_its_deadline_from_start_plus_deadline_on() {
        assert!(!past(100, 25, 124 * S + S - 1));
        assert!(past(100, 25, 125 * S));
        assert!(past(100, 0, 100 * S));
        assert!(!past(100, 25, 0));
    }

    #[test]
    fn the_status_is_failed_deadline_exceeded_without_disruption_target() {
        let r = kill_reason();
        assert_eq!(r.disruption_target(), None);
        assert_eq!(r.as_str(), "active_deadline");
        match r {
            KillReason::Requested {
                by,
                reason,
                message,
                ..
            } => {
                assert_eq!(by.phase_rule(), crate::lifecycle::PhaseRule::Failed);
                assert_eq!(reason.as_deref(), Some("DeadlineExceeded"));
                assert_eq!(
                    message,
                    "Pod was active on the node longer than the specified deadline"
                );
            }
            other => panic!("{other:?}"),
        }
    }
}
