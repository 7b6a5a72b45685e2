//! The registry: UID → worker handle, each worker's coalescing mailbox, and the seam every
//! pod source feeds (kubelet's `podWorkers.UpdatePod` and `podWorkers.podUpdates`).
//!
//! Invariants:
//! * at most one worker per UID; a worker is spawned only for a pod that must end (a deleted
//!   or terminal object, a kill request, an orphan) and only while this agent acts: in
//!   standby the kubelet ends it and nothing is kept ([`PodWorkers::take_over`] starts what is
//!   still to do at a takeover); a worker is forgotten by housekeeping once it has finished
//!   and the pod is gone from the sources and the runtime (in standby, once its pod is gone,
//!   whatever its phase: a held one ends);
//! * the mailbox keeps only the newest object (coalescing) but every kill request and its
//!   completion notice; a resumed kill deadline survives the coalescing;
//! * a deleted or terminal object becomes a [`KillRequest`] here, once: the worker never
//!   decides to end a pod on its own;
//! * the lock is never held across an await;
//! * a worker that ends by panic is logged with its pod's UID and restarted, and the kill it
//!   was carrying out is sent again ([`supervise`]).

use super::worker::worker_loop;
use super::{KillRequest, PodSource, PodView, PodWorkers, SeamError, Step};
use crate::cri::Runtime;
use crate::deadline::Deadline;
use crate::lifecycle::{KillReason, PodPhase};
use crate::pod::{PodInfo, PodUid};
use futures_util::FutureExt;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::Notify;
use tracing::Instrument;

#[derive(Default)]
pub(super) struct Pending {
    pub(super) update: Option<PodInfo>,
    pub(super) kills: Vec<KillRequest>,
    /// The worker has finished: kills complete at once, updates are ignored.
    closed: bool,
    /// Released in standby (its pod ended by another agent): a worker whose kill is held
    /// ends without acting ([`PodWorkers::release`]).
    pub(super) released: bool,
}

/// A coalescing channel to one worker.
#[derive(Default)]
pub(super) struct Mailbox {
    pending: Mutex<Pending>,
    pub(super) notify: Notify,
}

impl Mailbox {
    pub(super) fn lock(&self) -> MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn send_update(&self, mut pod: PodInfo) {
        let mut p = self.lock();
        // coalescing keeps only the newest object, but never loses a resumed kill deadline
        let old = p.update.as_ref().and_then(|u| u.kill_deadline);
        pod.kill_deadline = Deadline::earliest(pod.kill_deadline, old);
        p.update = Some(pod);
        drop(p);
        self.notify.notify_one();
    }

    fn send_kill(&self, kill: KillRequest) {
        let mut p = self.lock();
        if p.closed {
            if let Some(done) = kill.done {
                let _ = done.send(());
            }
            return;
        }
        p.kills.push(kill);
        drop(p);
        self.notify.notify_one();
    }

    /// Standby: the worker's pod was ended by another agent; a held worker ends.
    fn release(&self) {
        self.lock().released = true;
        self.notify.notify_one();
    }

    /// Called by a finishing worker: completes every pending kill notice, and all later ones.
    pub(super) fn close(&self) {
        let mut p = self.lock();
        p.closed = true;
        for k in p.kills.drain(..) {
            if let Some(done) = k.done {
                let _ = done.send(());
            }
        }
    }
}

/// The registry's handle on one worker.
pub(super) struct WorkerHandle {
    mailbox: Arc<Mailbox>,
    view: Arc<Mutex<PodView>>,
}

impl WorkerHandle {
    pub(super) fn view(&self) -> PodView {
        self.view.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub(super) fn phase(&self) -> PodPhase {
        self.view.lock().unwrap_or_else(|e| e.into_inner()).phase
    }

    pub(super) fn send_kill(&self, kill: KillRequest) {
        self.mailbox.send_kill(kill);
    }
}

#[derive(Default)]
pub(super) struct Registry {
    pub(super) desired: HashMap<PodUid, PodInfo>,
    /// Wall-clock time (ns) as of which every source's view is complete: runtime pods created
    /// before it and unknown to every source are orphans; newer ones may simply not have
    /// reached reaplet yet and are left alone. `None` until every source listed once.
    pub(super) synced_at: Option<i64>,
    /// Sources to wait for, and when each last delivered a complete list.
    pub(super) sources: HashSet<&'static str>,
    pub(super) last_list: HashMap<&'static str, i64>,
    pub(super) workers: HashMap<PodUid, WorkerHandle>,
    /// Static runtime pods of the kubelet's sources, already reported as left alone.
    pub(super) left_alone: HashSet<PodUid>,
    /// reaplet's own pod's deletion ([`super::own_pod`]).
    pub(super) own_end: super::own_pod::OwnEnd,
}

impl Registry {
    /// Standby: `uid`'s pod is gone from every source and from the runtime (another agent
    /// ended it): its worker is forgotten, and ends at once if its kill is held.
    pub(super) fn release(&mut self, uid: &PodUid) {
        if let Some(w) = self.workers.remove(uid) {
            w.mailbox.release();
        }
    }
}

/// How a source came by the object it hands to [`PodWorkers::upsert`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Listing {
    /// A watch event, or a list taken while this agent acted.
    Live,
    /// The first list after a takeover ([`PodWorkers::upsert_at_takeover`]).
    AtTakeover,
}

/// The kill a changed object implies, the first time it implies one.
fn implied_kill(before: Option<&PodInfo>, pod: &PodInfo) -> Option<KillRequest> {
    let was = |f: fn(&PodInfo) -> bool| before.is_some_and(f);
    if pod.deletion_requested && !was(|p| p.deletion_requested) {
        Some(KillRequest::new(KillReason::Deleted))
    } else if pod.terminal_phase && !pod.deletion_requested && !was(|p| p.terminal_phase) {
        Some(KillRequest::new(KillReason::TerminalPhase))
    } else {
        None
    }
}

impl<R: Runtime> PodWorkers<R> {
    /// A pod was added or changed. A deleted or terminal object is ended: the update, then the
    /// [`KillRequest`] it implies (API deletion, terminal phase).
    pub fn upsert(&self, pod: PodInfo) {
        self.upsert_as(pod, Listing::Live)
    }

    /// [`Self::upsert`] for the first list a source takes after a takeover: a terminal pod
    /// seen there for the first time is only known, not ended (the kubelet may have finished
    /// it long ago: the next relist ends it if something of it still runs), while a deleted
    /// one is ended at once, as [`Self::take_over`] does.
    pub fn upsert_at_takeover(&self, pod: PodInfo) {
        self.upsert_as(pod, Listing::AtTakeover)
    }

    fn upsert_as(&self, pod: PodInfo, listing: Listing) {
        let mut reg = self.registry();
        let before = reg.desired.insert(pod.uid.clone(), pod.clone());
        let kill = implied_kill(before.as_ref(), &pod);
        if self.is_own(&pod.uid) {
            match kill {
                Some(k) if k.reason == KillReason::Deleted => {
                    self.own_pod_ending(&mut reg, Some(pod));
                }
                Some(k) => own_pod_left_alone(&mut reg, &pod, &k),
                // the newest deleted object is the one whose status is written
                None if reg.own_end.deleted.is_some() && pod.deletion_requested => {
                    reg.own_end.deleted = Some(pod);
                }
                None => {}
            }
            return;
        }
        if let Some(w) = reg.workers.get(&pod.uid) {
            w.mailbox.send_update(pod);
            if let Some(k) = kill {
                w.send_kill(k);
            }
        } else if let Some(k) = kill {
            // standby: another agent ends it; a takeover starts what is still to do
            // ([`Self::take_over`]), so nothing is kept for it meanwhile
            if !self.may_spawn() {
                tracing::debug!(pod = %pod.key(), podUID = %pod.uid, reason = k.reason.as_str(),
                    "pod to end left to the node's active agent (standby)");
                return;
            }
            if listing == Listing::AtTakeover && k.reason == KillReason::TerminalPhase {
                return;
            }
            let w = self.spawn_worker(pod.clone(), PodSource::of(&pod));
            w.mailbox.send_update(pod.clone());
            w.send_kill(k);
            reg.workers.insert(pod.uid, w);
        }
    }

    /// Source `name` stopped watching (standby handed the node back, or never had it): the pods
    /// it delivered (`uids`) are forgotten without a kill (another agent ends them; workers
    /// already running carry on), and orphans are not judged again until every source has
    /// listed anew: a runtime pod the paused source no longer vouches for is no orphan.
    pub fn source_paused(&self, name: &'static str, uids: impl IntoIterator<Item = PodUid>) {
        let mut reg = self.registry();
        for uid in uids {
            reg.desired.remove(&uid);
        }
        reg.last_list.remove(name);
        reg.synced_at = None;
    }

    /// A pod left its source: the API object is gone (`grace_override` `Some(1)`: a force
    /// delete) or a static pod's manifest was removed (`None`: its own grace applies).
    pub fn remove(&self, uid: &PodUid, grace_override: Option<i64>) {
        let Some(pod) = self.registry().desired.remove(uid) else {
            return;
        };
        let reason = if pod.static_pod {
            KillReason::ManifestRemoved
        } else {
            KillReason::ObjectGone
        };
        self.deliver(pod, KillRequest::new(reason).grace(grace_override));
    }

    /// Ends a known pod for `req.reason` (eviction, shutdown, preemption, completion, ...).
    /// The request's `done` completes when its containers and sandboxes are stopped.
    pub fn kill(&self, uid: &PodUid, req: KillRequest) -> Result<(), SeamError> {
        let reg = self.registry();
        if let Some(w) = reg.workers.get(uid) {
            w.send_kill(req);
            return Ok(());
        }
        let pod = reg
            .desired
            .get(uid)
            .cloned()
            .ok_or_else(|| SeamError::UnknownPod(uid.to_string()))?;
        drop(reg);
        self.deliver(pod, req);
        Ok(())
    }

    /// Sends `req` to `pod`'s worker, spawning one if needed.
    pub(super) fn deliver(&self, pod: PodInfo, req: KillRequest) {
        self.deliver_from(pod, PodSource::Api, req)
    }

    /// [`Self::deliver`], with `source` for a pod no source knows (an orphan: `Runtime`).
    pub(super) fn deliver_from(&self, pod: PodInfo, source: PodSource, req: KillRequest) {
        let mut reg = self.registry();
        if self.is_own(&pod.uid) {
            if req.reason == KillReason::ObjectGone {
                self.own_pod_ending(&mut reg, None);
            } else {
                own_pod_left_alone(&mut reg, &pod, &req);
            }
            return;
        }
        if let Some(w) = reg.workers.get(&pod.uid) {
            w.send_kill(req);
            return;
        }
        if !self.may_spawn() {
            // standby: nothing is kept for a pod another agent ends; the request's notice
            // completes (its receiver sees the pod as done with this agent)
            tracing::debug!(pod = %pod.key(), podUID = %pod.uid, reason = req.reason.as_str(),
                "pod to end left to the node's active agent (standby)");
            if let Some(done) = req.done {
                let _ = done.send(());
            }
            return;
        }
        let source = match source {
            PodSource::Runtime => PodSource::Runtime,
            _ => PodSource::of(&pod),
        };
        let uid = pod.uid.clone();
        let w = self.spawn_worker(pod, source);
        w.send_kill(req);
        reg.workers.insert(uid, w);
    }

    /// Whether a new worker may start: only while this agent acts (a standby one holds every
    /// kill, and a worker parked on a held kill would outlive a pod the kubelet ends).
    fn may_spawn(&self) -> bool {
        self.inner.authority.is_active()
    }

    /// The agent became active (a takeover): every deleted pod whose object is still there
    /// and has no worker is ended now (the kubelet may have died anywhere in its
    /// termination). Terminal pods and orphans are judged by the next relist, which this asks
    /// for: only those with something still running are ended. Pods already gone cost
    /// nothing.
    pub fn take_over(&self) {
        let mut reg = self.registry();
        let due: Vec<PodInfo> = reg
            .desired
            .values()
            .filter(|p| p.deletion_requested && !reg.workers.contains_key(&p.uid))
            .filter(|p| !self.is_own(&p.uid))
            .cloned()
            .collect();
        if !due.is_empty() {
            tracing::info!(
                pods = due.len(),
                "took over: ending the deleted pods still present"
            );
        }
        for pod in due {
            let w = self.spawn_worker(pod.clone(), PodSource::of(&pod));
            w.mailbox.send_update(pod.clone());
            w.send_kill(KillRequest::new(KillReason::Deleted));
            reg.workers.insert(pod.uid, w);
        }
        drop(reg);
        self.inner.relist_now.notify_one();
    }

    /// Every pod this agent knows, desired or not.
    pub fn snapshot(&self) -> Vec<PodView> {
        let reg = self.registry();
        let mut out: Vec<PodView> = reg.workers.values().map(WorkerHandle::view).collect();
        out.extend(
            reg.desired
                .values()
                .filter(|p| !reg.workers.contains_key(&p.uid))
                .map(desired_view),
        );
        out.sort_by(|a, b| a.key.cmp(&b.key).then(a.uid.cmp(&b.uid)));
        out
    }

    /// The pods of the sources not yet stopped: no worker, or one still syncing or terminating
    /// (the kubelet's `GetActivePods`, which its shutdown manager ends).
    pub fn active_pods(&self) -> Vec<PodInfo> {
        let reg = self.registry();
        let mut out: Vec<PodInfo> = reg
            .desired
            .values()
            .filter(|p| {
                reg.workers
                    .get(&p.uid)
                    .is_none_or(|w| matches!(w.phase(), PodPhase::Sync | PodPhase::Terminating))
            })
            .cloned()
            .collect();
        out.sort_by(|a, b| a.uid.cmp(&b.uid));
        out
    }

    /// The pods not yet stopped (as [`Self::active_pods`]) that have an
    /// `activeDeadlineSeconds`: only those are copied out.
    pub fn active_with_deadline(&self) -> Vec<PodInfo> {
        let reg = self.registry();
        reg.desired
            .values()
            .filter(|p| {
                p.active_deadline_seconds.is_some()
                    && reg
                        .workers
                        .get(&p.uid)
                        .is_none_or(|w| matches!(w.phase(), PodPhase::Sync | PodPhase::Terminating))
            })
            .cloned()
            .collect()
    }

    /// The view of one pod.
    pub fn view(&self, uid: &PodUid) -> Option<PodView> {
        let reg = self.registry();
        match reg.workers.get(uid) {
            Some(w) => Some(w.view()),
            None => reg.desired.get(uid).map(desired_view),
        }
    }

    /// Whether `uid` is reaplet's own pod.
    pub(super) fn is_own(&self, uid: &PodUid) -> bool {
        self.inner.config.own_pod.as_ref() == Some(uid)
    }

    fn spawn_worker(&self, pod: PodInfo, source: PodSource) -> WorkerHandle {
        let mailbox = Arc::new(Mailbox::default());
        let view = Arc::new(Mutex::new(PodView {
            uid: pod.uid.clone(),
            key: pod.key(),
            phase: PodPhase::Sync,
            grace: None,
            deadline: None,
            step: Step::Starting,
            reason: None,
            reasons: Vec::new(),
            source,
        }));
        let span = tracing::info_span!("pod_worker", pod = %pod.key(), podUID = %pod.uid);
        let task = supervise(self.inner.clone(), mailbox.clone(), view.clone(), pod);
        self.inner.tracker.spawn(task.instrument(span));
        WorkerHandle { mailbox, view }
    }
}

/// A reason to end reaplet's own pod other than its API object's deletion ([`super::own_pod`]):
/// not acted on (stopping its containers would kill the process doing the stopping). Logged
/// once per pod; the request's completion notice is dropped (its receiver sees the pod as done
/// with).
fn own_pod_left_alone(reg: &mut Registry, pod: &PodInfo, req: &KillRequest) {
    if reg.left_alone.insert(pod.uid.clone()) {
        tracing::warn!(pod = %pod.key(), podUID = %pod.uid, reason = ?req.reason,
            "reaplet's own pod: only its API deletion ends it; request dropped");
    }
}

/// Runs a pod's worker, and restarts it if it ends by panic: logged with the pod's UID, then
/// after a short backoff a new worker takes the mailbox, and the kill the dead one was
/// carrying out is sent again (its reason and the grace it held). Completion notices the dead
/// worker held are dropped (their receivers see the sender gone).
async fn supervise<R: Runtime>(
    inner: Arc<super::Inner<R>>,
    mailbox: Arc<Mailbox>,
    view: Arc<Mutex<PodView>>,
    pod: PodInfo,
) {
    let mut restarts: u32 = 0;
    loop {
        let run = worker_loop(inner.clone(), mailbox.clone(), view.clone(), pod.clone());
        let Err(panic) = std::panic::AssertUnwindSafe(run).catch_unwind().await else {
            return;
        };
        restarts += 1;
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        tracing::error!(podUID = %pod.uid, panic = %what, restarts, "pod worker panicked; restarting it");
        let (reason, grace) = {
            let v = view.lock().unwrap_or_else(|e| e.into_inner());
            (v.reason.clone(), v.grace)
        };
        tokio::select! {
            _ = inner.cancel.cancelled() => return,
            _ = tokio::time::sleep(crate::lifecycle::backoff(restarts)) => {}
        }
        if let Some(reason) = reason {
            mailbox.send_kill(KillRequest::new(reason).grace(grace));
        }
    }
}

/// A desired pod with no worker: running, nothing to do.
fn desired_view(p: &PodInfo) -> PodView {
    PodView {
        uid: p.uid.clone(),
        key: p.key(),
        phase: PodPhase::Sync,
        grace: None,
        deadline: None,
        step: Step::Running,
        reason: None,
        reasons: Vec::new(),
        source: PodSource::of(p),
    }
}
