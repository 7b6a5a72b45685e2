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
//!   and **status first**. Last: once no worker is stopping another pod, the set of workers has
//!   not changed for [`SETTLE`] (deletions seen in the same batch, a relist's removals or a
//!   Node's pods force-deleted one by one, get their workers first), and the other pods'
//!   cleanups finished or ran for [`super::PipelineConfig::volume_wait`]. Pods nobody asked to
//!   end keep running. Status first: the terminal status is handed to the status manager,
//!   which writes it and deletes the object (with its UID precondition); only once the object
//!   is gone (the watch's `DELETED`) are its sandboxes stopped, not-ready ones first and the
//!   ready one (reaplet's own) last. A force delete (the object gone at once) skips the status;
//!   every condition is read again right before the sandboxes are stopped;
//! * whenever a kubelet holds the node again, nothing is stopped, and a status handed over and
//!   not yet sent is withdrawn ([`super::StatusSink::withdraw`]): the kubelet ends the pod its
//!   own way; the task starts over if reaplet becomes active again.
//!
//! The status is written before the containers stop, so their final states cannot be known:
//! it carries what the kubelet writes for a container it could not observe at the end
//! (`ContainerStatusUnknown`, exit code 137; the phase `Failed`). Stopping the sandbox that
//! holds reaplet kills reaplet within the call: whether the runtime then also stops that
//! sandbox's pause container is the runtime's (containerd may give up when its caller is gone).
//! What is left (the pause container, volumes, the pod cgroup) is swept by whoever runs next
//! (the kubelet, or a new reaplet: an orphan).

use super::PodWorkers;
use crate::cri::Runtime;
use crate::lifecycle::{KillReason, PodPhase};
use crate::pod::PodInfo;
use std::time::Duration;
use tokio::time::Instant;

/// How often the ending task looks again (a new deletion wakes it at once; the other pods'
/// workers do not, so this bounds how late it notices them done).
const RECHECK: Duration = Duration::from_secs(1);

/// How long the set of workers must stay the same, with none of them stopping a pod, before
/// the own pod is ended: deletions the sources deliver together (a relist's removals, a Node's
/// pods force-deleted one by one) all get their workers first.
pub const SETTLE: Duration = Duration::from_secs(5);

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

/// The ending task's own state between looks.
#[derive(Debug, Default)]
struct Progress {
    /// The status was handed to the status manager (and not withdrawn since).
    status_handed: bool,
    /// Since when nothing held the ending back, and how many workers there were then.
    quiet_since: Option<(Instant, usize)>,
}

/// Why the ending task does not act yet (each logged once per change).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Holding {
    Passive,
    OtherPods(usize),
    Settling,
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
                "reaplet's own pod was deleted; it is ended last, after the pods being stopped, if no kubelet holds the node");
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
        let mut progress = Progress::default();
        let mut holding: Option<Holding> = None;
        let mut list_failed = false;
        let mut authority = self.inner.authority.changes();
        loop {
            let hold = self.own_end_hold(&mut progress);
            if hold != holding {
                match hold {
                    Some(Holding::Passive) => tracing::info!(podUID = %uid,
                        "reaplet's own pod: a kubelet holds the node; its deletion is the kubelet's"),
                    Some(Holding::OtherPods(n)) => tracing::info!(podUID = %uid, pods = n,
                        "reaplet's own pod: waiting for the pods being stopped to stop first"),
                    Some(Holding::Settling) => {}
                    Some(Holding::ObjectPresent) => tracing::info!(podUID = %uid,
                        "reaplet's own pod: terminal status handed over; waiting for the object to go"),
                    None => {}
                }
                holding = hold;
            }
            if hold.is_none() {
                match self.inner.runtime.list_sandboxes(Some(uid.as_str())).await {
                    // read again after the await: a deletion or a kubelet may have come meanwhile
                    Ok(sandboxes) if self.own_end_hold(&mut progress).is_none() => {
                        if self.inner.authority.check(&uid, "own pod").is_ok() {
                            self.stop_own_sandboxes(&uid, sandboxes).await;
                            return;
                        }
                    }
                    Ok(_) => {}
                    Err(e) => {
                        if !std::mem::replace(&mut list_failed, true) {
                            tracing::warn!(err = %e, podUID = %uid,
                                "reaplet's own pod: listing its sandboxes failed; will retry");
                        }
                    }
                }
            }
            tokio::select! {
                _ = self.inner.cancel.cancelled() => return,
                _ = self.inner.own_wake.notified() => {}
                _ = authority.changed() => {}
                _ = tokio::time::sleep(RECHECK) => {}
            }
        }
    }

    /// Stops the own pod's sandboxes, the not-ready ones first: the ready one holds this
    /// process, which the call kills.
    async fn stop_own_sandboxes(
        &self,
        uid: &crate::pod::PodUid,
        mut sandboxes: Vec<crate::cri::RuntimeSandbox>,
    ) {
        sandboxes.sort_by_key(|s| s.ready);
        tracing::warn!(podUID = %uid, sandboxes = sandboxes.len(),
            "reaplet's own pod: status written and object gone; stopping its sandboxes (this ends reaplet)");
        for sb in sandboxes {
            if let Err(e) = self.inner.runtime.stop_pod_sandbox(&sb.id).await
                && !e.is_not_found()
            {
                tracing::error!(err = %e, podUID = %uid, sandbox = %sb.id,
                    "reaplet's own pod: stopping a sandbox failed");
            }
        }
    }

    /// What the ending still waits for (`None`: stop the sandboxes now). Hands the status over
    /// when the time has come, and withdraws it when a kubelet holds the node again (under the
    /// registry lock; the status manager never blocks).
    fn own_end_hold(&self, progress: &mut Progress) -> Option<Holding> {
        let reg = self.registry();
        let own = self.inner.config.own_pod.as_ref()?;
        let sink = self.inner.status.get();
        if !self.inner.authority.is_active() {
            progress.quiet_since = None;
            if std::mem::take(&mut progress.status_handed)
                && let Some(sink) = sink
            {
                sink.withdraw(own);
            }
            return Some(Holding::Passive);
        }
        let (mut stopping, mut cleaning) = (0, 0);
        for (_, w) in reg.workers.iter().filter(|(u, _)| *u != own) {
            match w.phase() {
                PodPhase::Sync | PodPhase::Terminating => stopping += 1,
                PodPhase::Terminated => cleaning += 1,
                PodPhase::Finished => {}
            }
        }
        if stopping > 0 {
            progress.quiet_since = None;
            return Some(Holding::OtherPods(stopping));
        }
        let now = Instant::now();
        let since = match progress.quiet_since {
            Some((since, workers)) if workers == reg.workers.len() => since,
            _ => {
                progress.quiet_since = Some((now, reg.workers.len()));
                now
            }
        };
        if now.duration_since(since) < SETTLE {
            return Some(Holding::Settling);
        }
        if cleaning > 0 && now.duration_since(since) < self.inner.config.volume_wait {
            return Some(Holding::OtherPods(cleaning));
        }
        if reg.own_end.gone {
            return None;
        }
        if !progress.status_handed
            && let (Some(pod), Some(sink)) = (&reg.own_end.deleted, sink)
        {
            sink.pod_terminated(pod, Some(&KillReason::Deleted), &[]);
            sink.pod_finished(pod);
            progress.status_handed = true;
        }
        Some(Holding::ObjectPresent)
    }
}
