//! reaplet's own pod (issue 30, item 3). No kubelet counterpart: the kubelet never runs in a
//! pod it manages. reaplet may: as a DaemonSet, its own pod is one of the node's pods, found
//! at start by its UID ([`crate::self_pod`]) and named in [`super::PipelineConfig::own_pod`].
//!
//! Stopping that pod's containers kills the process doing the stopping, so it is never done as
//! for another pod. The rules:
//! * it is never an orphan ([`super::housekeeping`]) and no eviction source picks it
//!   ([`crate::eviction`]);
//! * a kill request for it of any other reason than its API object's deletion (an eviction, a
//!   shutdown, a completion) is logged once and dropped, and so is its completion notice (its
//!   receiver sees the pod as done with);
//! * its API deletion while a kubelet holds the node (standby, passive) is the kubelet's to
//!   carry out: reaplet does nothing;
//! * its API deletion while reaplet is active (the kubelet dead, or primary) ends it **last**
//!   and **status first**: once no other worker is still stopping a pod (and the others'
//!   cleanups finished, or ran for [`super::PipelineConfig::volume_wait`]), the terminal
//!   status is handed to the status manager, which writes it and deletes the object (with its
//!   UID precondition); only once the object is gone (the watch's `DELETED`) are its sandboxes
//!   stopped, which stops every container in them, reaplet among them. A force delete (the
//!   object gone at once) skips the status. Nothing is stopped while the agent is passive, and
//!   the task starts over if a kubelet takes the node back meanwhile.
//!
//! The status is written before the containers stop, so their final states cannot be known:
//! it carries what the kubelet writes for a container it could not observe at the end
//! (`ContainerStatusUnknown`, exit code 137; the phase `Failed`). Volumes and the pod cgroup
//! are left: whoever runs next (the kubelet, or a new reaplet) sweeps them as an orphan's.

use super::PodWorkers;
use crate::cri::Runtime;
use crate::lifecycle::{KillReason, PodPhase};
use crate::pod::PodInfo;
use std::time::Duration;
use tokio::time::Instant;

/// How often the ending task looks again when nothing woke it (the authority, the other
/// pods' workers, the API watch all wake it; this bounds a missed wake).
const RECHECK: Duration = Duration::from_secs(1);

/// What is known of the own pod's end, kept in the registry.
#[derive(Debug, Default)]
pub(super) struct OwnEnd {
    /// The deleted object (the newest seen), once its deletion was seen.
    pub(super) deleted: Option<PodInfo>,
    /// The API object is gone.
    pub(super) gone: bool,
    /// The ending task was started (once).
    pub(super) started: bool,
}

/// Where the ending stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Waiting for the agent to be active and the other pods to be stopped.
    Waiting,
    /// The status was handed to the status manager: waiting for the object to go.
    StatusHanded,
}

/// Why the ending task does not act yet (each logged once per change).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Holding {
    Passive,
    OtherPods(usize),
    ObjectPresent,
}

impl<R: Runtime> PodWorkers<R> {
    /// The own pod's object was deleted (`Some`) or is gone (`None`): starts the ending task
    /// once, and wakes it.
    pub(super) fn own_pod_ending(
        &self,
        reg: &mut super::registry::Registry,
        deleted: Option<PodInfo>,
    ) {
        match deleted {
            Some(pod) => reg.own_end.deleted = Some(pod),
            None => reg.own_end.gone = true,
        }
        if !std::mem::replace(&mut reg.own_end.started, true) {
            let uid = self.inner.config.own_pod.clone();
            tracing::warn!(podUID = ?uid.as_ref().map(|u| u.to_string()),
                "reaplet's own pod was deleted; it is ended last, once every other pod is stopped, if no kubelet holds the node");
            let this = self.clone();
            self.inner
                .tracker
                .spawn(async move { this.end_own_pod().await });
        }
        self.inner.own_wake.notify_one();
    }

    /// The ending task: see the module's rules. Returns when the sandboxes were stopped (by
    /// then this process is usually dead) or reaplet is stopping.
    async fn end_own_pod(self) {
        let Some(uid) = self.inner.config.own_pod.clone() else {
            return;
        };
        let mut stage = Stage::Waiting;
        let mut holding: Option<Holding> = None;
        let mut ready_since: Option<Instant> = None;
        let mut authority = self.inner.authority.changes();
        loop {
            let hold = self.own_end_hold(&mut stage, &mut ready_since);
            if hold != holding {
                match hold {
                    Some(Holding::Passive) => tracing::info!(podUID = %uid,
                        "reaplet's own pod: a kubelet holds the node; its deletion is the kubelet's"),
                    Some(Holding::OtherPods(n)) => tracing::info!(podUID = %uid, pods = n,
                        "reaplet's own pod: waiting for the node's other pods to stop first"),
                    Some(Holding::ObjectPresent) => tracing::info!(podUID = %uid,
                        "reaplet's own pod: terminal status handed over; waiting for the object to go"),
                    None => {}
                }
                holding = hold;
            }
            if hold.is_none() {
                break;
            }
            tokio::select! {
                _ = self.inner.cancel.cancelled() => return,
                _ = self.inner.own_wake.notified() => {}
                _ = authority.changed() => {}
                _ = tokio::time::sleep(RECHECK) => {}
            }
        }
        if let Err(e) = self.inner.authority.check(&uid, "own pod") {
            tracing::info!(err = %e, "reaplet's own pod: not stopped");
            return;
        }
        let sandboxes = match self.inner.runtime.list_sandboxes(Some(uid.as_str())).await {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(err = %e, podUID = %uid,
                    "reaplet's own pod: listing its sandboxes failed; left to whoever runs next");
                return;
            }
        };
        let ids: Vec<String> = sandboxes
            .into_iter()
            .filter(|s| s.pod_uid == uid.as_str())
            .map(|s| s.id)
            .collect();
        tracing::warn!(podUID = %uid, sandboxes = ids.len(),
            "reaplet's own pod: status written and object gone; stopping its sandboxes (this ends reaplet)");
        for id in ids {
            // usually the last thing this process does: the runtime stops every container of
            // the sandbox, this one among them
            if let Err(e) = self.inner.runtime.stop_pod_sandbox(&id).await
                && !e.is_not_found()
            {
                tracing::error!(err = %e, podUID = %uid, sandbox = %id,
                    "reaplet's own pod: stopping a sandbox failed");
            }
        }
    }

    /// What the ending still waits for (`None`: stop the sandboxes now). Hands the status over
    /// when the time has come (under the registry lock; the status manager never blocks).
    fn own_end_hold(
        &self,
        stage: &mut Stage,
        ready_since: &mut Option<Instant>,
    ) -> Option<Holding> {
        let reg = self.registry();
        if !self.inner.authority.is_active() {
            *ready_since = None;
            return Some(Holding::Passive);
        }
        let own = self.inner.config.own_pod.as_ref();
        let phases: Vec<PodPhase> = reg
            .workers
            .iter()
            .filter(|(u, _)| Some(*u) != own)
            .map(|(_, w)| w.phase())
            .collect();
        let stopping = phases
            .iter()
            .filter(|p| matches!(p, PodPhase::Sync | PodPhase::Terminating))
            .count();
        let cleaning = phases
            .iter()
            .filter(|p| matches!(p, PodPhase::Terminated))
            .count();
        if stopping > 0 {
            *ready_since = None;
            return Some(Holding::OtherPods(stopping));
        }
        let since = *ready_since.get_or_insert_with(Instant::now);
        if cleaning > 0 && since.elapsed() < self.inner.config.volume_wait {
            return Some(Holding::OtherPods(cleaning));
        }
        if reg.own_end.gone {
            return None;
        }
        if *stage == Stage::Waiting
            && let (Some(pod), Some(sink)) = (&reg.own_end.deleted, self.inner.status.get())
        {
            sink.pod_terminated(pod, Some(&KillReason::Deleted), &[]);
            sink.pod_finished(pod);
            *stage = Stage::StatusHanded;
        }
        Some(Holding::ObjectPresent)
    }
}
