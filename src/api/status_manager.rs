//! The status manager: kubelet's `status_manager.go` (`syncPod`, `canBeDeleted`,
//! `PodResourcesAreReclaimed` gate) for terminating pods.
//!
//! Invariants (reference §5):
//! * the terminal status is sent at once when a pod's containers have stopped, as a
//!   strategic-merge patch on `pods/<name>/status` carrying `metadata.uid`; failures are retried
//!   by a periodic resync with backoff; 404, a failed precondition (409 naming the Kind) and a
//!   422 on `metadata.uid` (gone, or recreated under the same name: the real server's answer to
//!   a status with another pod's UID) drop the pod; any other 409 is retried: a recreated pod is never patched or deleted;
//! * nothing is ever sent for a pod whose object is gone (a force delete is `MODIFIED` with
//!   grace 0, then `DELETED`: the worker reports the pod stopped after the object went, and the
//!   kubelet sends nothing then either); the last [`GONE_REMEMBERED`] gone UIDs are remembered;
//! * a phase already terminal in the API is never changed;
//! * a `DisruptionTarget` condition the pod already has (the Eviction API's, say) is never
//!   overwritten: a patch that would carry reaplet's own is built from a fresh GET of the
//!   object (left out if the object has one) and carries that read's resourceVersion, so a
//!   condition added in between makes it a 409 and a new read, not an overwrite; other patches
//!   need no read (`status.rs` has the rules);
//! * DELETE (`gracePeriodSeconds: 0`, `preconditions.uid`) only when the object has a
//!   deletionTimestamp, is not a static/mirror pod, its stored phase is terminal and the
//!   node-side cleanup (volumes, cgroup) finished; 404 and 409 mean someone else did it;
//! * no lock is held across an API call; every pod is synced by a task of its own (at most
//!   one per pod at a time, so one pod's requests stay in order: status, then delete; up to
//!   [`SYNC_CONCURRENCY`] at once), so a slow or hung request holds back only its own pod;
//!   every request is bounded by [`super::REQUEST_TIMEOUT`];
//! * a failed sync is retried with the agent's one backoff ([`crate::backoff`]): an answered
//!   failure exponentially, never sooner than the server's `Retry-After`; one without an
//!   answer as soon as the API server is reachable again ([`super::health`]), and no sync
//!   starts while it is not (every waiting pod starts at once when it is back).

use super::health::ApiHealth;
use super::{RateLimiter, RequestError, bounded, precondition_failed, uid_mismatch};
use crate::backoff::{Backoff, Failure, Policy};
use crate::lifecycle::KillReason;
use crate::pod::{PodInfo, PodUid};
use crate::status::{self, ContainerFinal, TerminalStatus};
use crate::workers::StatusSink;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::{Notify, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// How many UIDs of pods whose objects are gone are remembered (a bound, not a window: a
/// worker reports its pod stopped within its grace of the object going).
const GONE_REMEMBERED: usize = 4096;

/// UIDs of pods whose API objects are gone, oldest first.
#[derive(Default)]
struct Gone {
    order: std::collections::VecDeque<PodUid>,
    set: std::collections::HashSet<PodUid>,
}

impl Gone {
    fn insert(&mut self, uid: &PodUid) {
        if self.set.insert(uid.clone()) {
            self.order.push_back(uid.clone());
            if self.order.len() > GONE_REMEMBERED
                && let Some(old) = self.order.pop_front()
            {
                self.set.remove(&old);
            }
        }
    }
}

/// Pods whose status and delete requests are in flight at once (more wait for a slot).
const SYNC_CONCURRENCY: usize = 32;

#[derive(Debug, Clone)]
struct Entry {
    namespace: String,
    name: String,
    static_pod: bool,
    deletion_requested: bool,
    /// The phase stored in the API is terminal (only ever goes from false to true).
    api_terminal: bool,
    /// The terminal status still to send.
    pending: Option<TerminalStatus>,
    /// Node-side cleanup finished.
    finished: bool,
    /// Delete sent and accepted (or found done).
    deleted: bool,
    backoff: Backoff,
    retry_at: Option<Instant>,
    /// A sync task is working on this pod.
    syncing: bool,
}

impl Entry {
    fn from_pod(pod: &PodInfo) -> Self {
        Entry {
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            static_pod: pod.static_pod,
            deletion_requested: pod.deletion_requested,
            api_terminal: pod.terminal_phase,
            pending: None,
            finished: false,
            deleted: false,
            backoff: Backoff::new(Policy::API),
            retry_at: None,
            syncing: false,
        }
    }

    fn wants_delete(&self) -> bool {
        self.finished
            && self.pending.is_none()
            && self.api_terminal
            && self.deletion_requested
            && !self.static_pod
            && !self.deleted
    }
}

struct Inner {
    metrics: Option<Arc<crate::metrics::Metrics>>,
    client: kube::Client,
    limiter: Arc<RateLimiter>,
    resync: Duration,
    health: ApiHealth,
    entries: Mutex<HashMap<PodUid, Entry>>,
    gone: Mutex<Gone>,
    notify: Notify,
    /// Where the status and delete answers go in each pod's termination timeline.
    timelines: std::sync::OnceLock<Arc<crate::timeline::Timelines>>,
}

/// Sends terminal statuses and final deletes. Cheap to clone.
#[derive(Clone)]
pub struct StatusManager {
    inner: Arc<Inner>,
}

/// A status patch to send (and whether it carries a resourceVersion precondition), or what
/// the sync ends with instead.
enum Body {
    Send(serde_json::Value, bool),
    Stop(Outcome),
}

/// What one sync did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Nothing,
    Done,
    /// Try again: after the backoff (and not before the server's `Retry-After`) when the
    /// server answered, once it is reachable when it did not.
    Retry(Failure),
}

impl Outcome {
    fn retry(e: &RequestError) -> Outcome {
        Outcome::Retry(e.failure())
    }
}

impl StatusManager {
    /// `resync`: the kubelet's 10 s status resync.
    pub fn new(
        client: kube::Client,
        limiter: Arc<RateLimiter>,
        resync: Duration,
        health: ApiHealth,
        metrics: Option<Arc<crate::metrics::Metrics>>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                metrics,
                client,
                limiter,
                resync,
                health,
                entries: Mutex::default(),
                gone: Mutex::default(),
                notify: Notify::new(),
                timelines: std::sync::OnceLock::new(),
            }),
        }
    }

    /// Connects the terminations' timelines; a second call is ignored.
    pub fn set_timelines(&self, timelines: Arc<crate::timeline::Timelines>) {
        let _ = self.inner.timelines.set(timelines);
    }

    /// The span of one API write of `uid`'s, in its termination's trace (disabled when there
    /// is none open).
    fn api_span(&self, uid: &PodUid, op: &'static str) -> tracing::Span {
        match self.inner.timelines.get().and_then(|t| t.trace(uid)) {
            Some(root) => tracing::info_span!(
                target: crate::timeline::TRACE_TARGET,
                parent: &root,
                "api",
                otel.name = op,
                k8s.pod.uid = %uid,
            ),
            None => tracing::Span::none(),
        }
    }

    /// Nothing more is written for `uid`: its termination's trace may end.
    fn end_trace(&self, uid: &PodUid) {
        if let Some(t) = self.inner.timelines.get() {
            t.end_trace(uid);
        }
    }

    /// Records the API server's answer to a write in `uid`'s timeline (an answer with no
    /// HTTP status, a timeout, is not one).
    fn to_timeline<T>(
        &self,
        uid: &PodUid,
        r: &Result<T, RequestError>,
        step: impl FnOnce(u16) -> crate::timeline::Step,
    ) {
        let code = match r {
            Ok(_) => Some(200),
            Err(e) => e.code(),
        };
        if let (Some(t), Some(code)) = (self.inner.timelines.get(), code) {
            t.record(uid, step(code));
        }
    }

    /// Reports a request's result to the agent's view of the API server.
    fn seen<T>(&self, r: Result<T, RequestError>) -> Result<T, RequestError> {
        match &r {
            Ok(_) => self.inner.health.answered(),
            Err(e) => self.inner.health.failed(e.failure()),
        }
        r
    }

    fn entries(&self) -> MutexGuard<'_, HashMap<PodUid, Entry>> {
        self.inner.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The newest API object of a pod this manager may be working on.
    pub fn observe(&self, pod: &PodInfo, api_terminal: bool) {
        let mut entries = self.entries();
        if let Some(e) = entries.get_mut(&pod.uid) {
            e.deletion_requested |= pod.deletion_requested;
            e.api_terminal |= api_terminal;
            if e.wants_delete() {
                self.inner.notify.notify_one();
            }
        }
    }

    /// The pod object is gone: nothing more to send for it (and the SLI ends, whoever removed it).
    pub fn forget(&self, uid: &PodUid) {
        self.inner
            .gone
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(uid);
        self.entries().remove(uid);
        if let Some(m) = &self.inner.metrics {
            m.termination_finished(uid.as_str());
        }
        self.end_trace(uid);
    }

    /// Pods still being worked on.
    pub fn pending(&self) -> usize {
        self.entries()
            .values()
            .filter(|e| e.pending.is_some() || e.wants_delete())
            .count()
    }

    /// Runs until cancelled: starts a sync for each due pod at once on every change, and
    /// every `resync`. Cancelling abandons the syncs in flight (the next start resends).
    pub async fn run(self, cancel: CancellationToken) {
        let mut tasks = tokio::task::JoinSet::new();
        let slots = Arc::new(Semaphore::new(SYNC_CONCURRENCY));
        let mut reach = self.inner.health.subscribe();
        loop {
            let wake = self.start_due(&mut tasks, &slots);
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = self.inner.notify.notified() => {}
                // back: every pod waiting for it starts now
                Ok(()) = reach.changed() => {}
                Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
                _ = tokio::time::sleep_until(wake) => {}
            }
        }
    }

    /// Starts a sync task for every pod with something to send, due, and not being synced.
    /// Returns when to look again: the next retry due, or the periodic resync.
    fn start_due(&self, tasks: &mut tokio::task::JoinSet<()>, slots: &Arc<Semaphore>) -> Instant {
        let now = Instant::now();
        let mut wake = now + self.inner.resync;
        if !self.inner.health.is_reachable() {
            // the prober tries for everyone; a change of reachability wakes the loop
            return wake;
        }
        let mut due = Vec::new();
        for (uid, e) in self.entries().iter_mut() {
            if e.syncing || (e.pending.is_none() && !e.wants_delete()) {
                continue;
            }
            match e.retry_at {
                Some(t) if t > now => wake = wake.min(t),
                _ => {
                    e.syncing = true;
                    due.push(uid.clone());
                }
            }
        }
        for uid in due {
            let (me, slots) = (self.clone(), slots.clone());
            tasks.spawn(async move {
                let Ok(_slot) = slots.acquire_owned().await else {
                    return;
                };
                let outcome = me.sync_one(&uid).await;
                me.synced(&uid, outcome);
            });
        }
        wake
    }

    /// Records a finished sync: its backoff, and that the pod may be synced again.
    fn synced(&self, uid: &PodUid, outcome: Outcome) {
        let mut entries = self.entries();
        if let Some(e) = entries.get_mut(uid) {
            e.syncing = false;
            match outcome {
                Outcome::Retry(f) => {
                    let wait = e.backoff.failed(f, rand::random());
                    e.retry_at = match f {
                        // due as soon as the server is reachable (start_due waits for that)
                        Failure::NoAnswer => None,
                        Failure::Answered { .. } | Failure::Slow => Some(Instant::now() + wait),
                    };
                }
                Outcome::Done | Outcome::Nothing => {
                    e.backoff.succeeded();
                    e.retry_at = None;
                }
            }
        }
    }

    async fn sync_one(&self, uid: &PodUid) -> Outcome {
        let Some(entry) = self.entries().get(uid).cloned() else {
            return Outcome::Nothing;
        };
        let span = tracing::info_span!("pod_status", pod = %format_args!("{}/{}", entry.namespace, entry.name), podUID = %uid);
        self.sync_entry(uid, entry).instrument(span).await
    }

    /// The status patch for `st`. A patch that would carry reaplet's own `DisruptionTarget`
    /// is built from a fresh read of the object: the condition is left out when the object
    /// already has one (the Eviction API's, say), and the patch carries the read's
    /// resourceVersion, so that a condition added meanwhile makes it a 409, not an overwrite.
    /// Every other patch is sent blind (no read: the common path stays one request).
    async fn patch_body(
        &self,
        api: &kube::Api<Pod>,
        uid: &PodUid,
        name: &str,
        st: &TerminalStatus,
    ) -> Body {
        let now = status::now_rfc3339();
        if st.disruption.is_none() {
            return Body::Send(status::status_patch(uid.as_str(), st, &now), false);
        }
        self.inner.limiter.acquire().await;
        let pod = match self.seen(bounded(api.get(name)).await) {
            Ok(pod) if pod.metadata.uid.as_deref() == Some(uid.as_str()) => pod,
            Ok(_) => {
                tracing::info!("pod recreated under its name; dropping its status");
                self.forget(uid);
                return Body::Stop(Outcome::Done);
            }
            // a node's GET of a pod that is gone, or no longer bound to it, is 403 (the Node
            // authorizer finds no relationship), never 404: either way it is not ours to write.
            // Any other 403 is a permission problem: reported and retried, never a silent drop
            Err(err) if err.code() == Some(404) || err.forbidden_no_relationship() => {
                tracing::info!(err = %err, "pod gone or not bound to this node; dropping its status");
                self.forget(uid);
                return Body::Stop(Outcome::Done);
            }
            Err(err) => {
                tracing::warn!(err = %err, "reading the pod before its status failed; will retry");
                return Body::Stop(Outcome::retry(&err));
            }
        };
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        if matches!(phase, Some("Failed" | "Succeeded")) {
            // never change a phase the API already holds as terminal; the delete may follow
            if let Some(e) = self.entries().get_mut(uid) {
                e.pending = None;
                e.api_terminal = true;
            }
            self.inner.notify.notify_one();
            return Body::Stop(Outcome::Done);
        }
        let mut st = st.clone();
        if status::has_disruption_target(&pod) {
            tracing::info!("the pod already has a DisruptionTarget condition; keeping it");
            st.disruption = None;
        }
        let mut body = status::status_patch(uid.as_str(), &st, &now);
        let guarded = match pod.metadata.resource_version {
            Some(rv) => {
                body["metadata"]["resourceVersion"] = rv.into();
                true
            }
            None => false,
        };
        Body::Send(body, guarded)
    }

    async fn sync_entry(&self, uid: &PodUid, entry: Entry) -> Outcome {
        let api: kube::Api<Pod> =
            kube::Api::namespaced(self.inner.client.clone(), &entry.namespace);
        if let Some(st) = &entry.pending {
            if entry.api_terminal {
                // never change a phase the API already holds as terminal
                if let Some(e) = self.entries().get_mut(uid) {
                    e.pending = None;
                }
            } else {
                let t = Instant::now();
                let mut conflicts = 0;
                let r = loop {
                    let (body, guarded) = match self.patch_body(&api, uid, &entry.name, st).await {
                        Body::Send(body, guarded) => (body, guarded),
                        Body::Stop(outcome) => return outcome,
                    };
                    self.inner.limiter.acquire().await;
                    let r = self.seen(
                        bounded(api.patch_status(
                            &entry.name,
                            &PatchParams::default(),
                            &Patch::Strategic(body),
                        ))
                        .instrument(self.api_span(uid, "PATCH pods/status"))
                        .await,
                    );
                    self.to_timeline(uid, &r, |code| crate::timeline::Step::StatusWritten {
                        code,
                    });
                    match r {
                        // the object changed since it was read: read it again
                        Err(err) if guarded && err.code() == Some(409) && conflicts < 3 => {
                            tracing::info!(err = %err, "pod changed since it was read; reading it again");
                            conflicts += 1;
                        }
                        Err(err) if guarded && err.code() == Some(409) => {
                            tracing::warn!(err = %err, "pod keeps changing; will retry");
                            return Outcome::retry(&err);
                        }
                        r => break r,
                    }
                };
                if let Some(m) = &self.inner.metrics {
                    m.pod_status_sync_duration
                        .observe(t.elapsed().as_secs_f64());
                }
                match r {
                    Ok(pod) => {
                        if let Some(m) = &self.inner.metrics {
                            m.stage("status", t.elapsed());
                        }
                        let phase = pod
                            .status
                            .as_ref()
                            .and_then(|s| s.phase.clone())
                            .unwrap_or_default();
                        tracing::info!(phase = %phase, "terminal pod status sent");
                        if let Some(e) = self.entries().get_mut(uid) {
                            e.pending = None;
                            e.api_terminal |= matches!(phase.as_str(), "Failed" | "Succeeded");
                        }
                    }
                    Err(err)
                        if err.code() == Some(404)
                            || err
                                .api()
                                .is_some_and(|e| precondition_failed(e) || uid_mismatch(e)) =>
                    {
                        tracing::info!(err = %err, "pod gone or recreated; dropping its status");
                        self.forget(uid);
                        return Outcome::Done;
                    }
                    Err(err) => {
                        tracing::warn!(err = %err, "sending the pod status failed; will retry");
                        return Outcome::retry(&err);
                    }
                }
            }
        }
        let (wants_delete, finished) = self
            .entries()
            .get(uid)
            .map_or((false, true), |e| (e.wants_delete(), e.finished));
        if !wants_delete {
            if finished {
                // nothing more to write for it (a static pod's object is the kubelet's)
                self.end_trace(uid);
            }
            return Outcome::Done;
        }
        self.inner.limiter.acquire().await;
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(uid.to_string()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        let t = Instant::now();
        let r = self.seen(
            bounded(api.delete(&entry.name, &dp))
                .instrument(self.api_span(uid, "DELETE pods"))
                .await,
        );
        self.to_timeline(uid, &r, |code| crate::timeline::Step::ObjectDeleted {
            code,
        });
        if r.is_ok()
            && let Some(m) = &self.inner.metrics
        {
            m.stage("delete", t.elapsed());
            m.termination_finished(uid.as_str());
        }
        match r {
            Ok(_) => tracing::info!("pod object deleted"),
            Err(err) if err.code() == Some(404) || err.api().is_some_and(precondition_failed) => {
                tracing::info!(err = %err, "pod object already gone or replaced")
            }
            Err(err) => {
                tracing::warn!(err = %err, "deleting the pod object failed; will retry");
                return Outcome::retry(&err);
            }
        }
        if let Some(e) = self.entries().get_mut(uid) {
            e.deleted = true;
        }
        self.end_trace(uid);
        Outcome::Done
    }
}

impl StatusSink for StatusManager {
    fn pod_terminated(
        &self,
        pod: &PodInfo,
        reason: Option<&KillReason>,
        finals: &[ContainerFinal],
    ) {
        let st = match status::terminal_status(pod, finals, reason) {
            Ok(st) => st,
            Err(e) => {
                tracing::error!(err = %e, "no terminal status for a pod reported stopped");
                None
            }
        };
        if self
            .inner
            .gone
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .set
            .contains(&pod.uid)
        {
            tracing::info!(podUID = %pod.uid, "pod object gone; no status to send");
            return;
        }
        if st.is_none()
            && (pod.static_pod
                || matches!(reason, Some(KillReason::Orphan | KillReason::ObjectGone)))
        {
            return; // nothing will ever be sent for it
        }
        let mut entries = self.entries();
        let e = entries
            .entry(pod.uid.clone())
            .or_insert_with(|| Entry::from_pod(pod));
        e.deletion_requested |= pod.deletion_requested;
        e.api_terminal |= pod.terminal_phase;
        e.pending = st;
        drop(entries);
        self.inner.notify.notify_one();
    }

    fn pod_finished(&self, pod: &PodInfo) {
        let more = match self.entries().get_mut(&pod.uid) {
            Some(e) => {
                e.finished = true;
                // a status still to send, or the delete to come
                e.pending.is_some() || e.wants_delete()
            }
            None => false,
        };
        if !more {
            // nothing (more) to write for it: its trace ends with its worker
            self.end_trace(&pod.uid);
        }
        self.inner.notify.notify_one();
    }

    fn withdraw(&self, uid: &PodUid) {
        self.end_trace(uid);
        if self.entries().remove(uid).is_some() {
            tracing::info!(podUID = %uid, "status and delete withdrawn: no longer reaplet's to send");
        }
    }
}
