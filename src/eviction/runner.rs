//! The eviction sources' task: watches this node's Node object (`metadata.name=<node>`, what a
//! node identity may read), is fed this node's pods by the API source, runs the pure
//! decisions ([`super::taints`], [`super::affinity`]) and carries them out.
//!
//! Invariants:
//! * one task; its timers are one sorted set of monotonic deadlines, woken by the soonest;
//! * a taint eviction is the controller manager's: the `DisruptionTarget` condition
//!   (`DeletionByTaintManager`) by a strategic merge patch of the pod's status, then a DELETE
//!   with the pod's own grace and a UID precondition, and a `TaintManagerEviction` event;
//! * an affinity eviction is an Eviction (`policy/v1`, UID precondition): 200/201 the pod ends,
//!   429 retried after the server's `retryAfterSeconds` or with backoff and jitter (5 s
//!   doubling to 5 min), 500 retried after 5 min, 404 and a failed precondition mean done; an
//!   `EvictionBlocked` event once per pod and cause, never a log line per retry;
//! * after the API side, a kill request with the source goes through the one seam (the pod
//!   ends now, not a watch round trip later); nothing is done while the agent is not active.

use super::actions::{self, Attempt, Outcome};
use super::affinity::{self, NodeFacts, Settling};
use super::taints::{Action, PodFacts, TaintAt, TaintManager};
use super::{EvictionConfig, PendingEviction, PodChange};
use crate::authority::Authority;
use crate::backoff::{Backoff, Failure, Policy, STABLE_RESET};
use crate::cri::Runtime;
use crate::events::{EventReason, EventSink, PodEvent};
use crate::lifecycle::{EvictionSource, KillReason};
use crate::metrics::{EvictionLabels, Metrics};
use crate::pod::PodUid;
use crate::workers::{KillRequest, PodWorkers};
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::runtime::watcher;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// A retry's detail while the agent is not active.
const STANDBY: &str = "not active (standby)";
const BLOCKED: Policy = Policy {
    min: Duration::from_secs(5),
    max: Duration::from_secs(300),
};
const FAILED: Policy = Policy {
    min: Duration::from_secs(1),
    max: Duration::from_secs(30),
};

/// What the runner needs.
pub struct Context<R: Runtime> {
    pub client: kube::Client,
    pub node: String,
    pub workers: PodWorkers<R>,
    pub events: EventSink,
    pub metrics: Option<Arc<Metrics>>,
    pub authority: Arc<Authority>,
    pub config: EvictionConfig,
    /// Published for `reaplet pods`.
    pub view: Arc<Mutex<Vec<PendingEviction>>>,
    /// The agent's view of the API server: the node watch and the attempts wait for it.
    pub health: crate::api::health::ApiHealth,
}

/// A retry after a refusal or a failure.
#[derive(Debug, Clone)]
struct Retry {
    at: Instant,
    failures: u32,
    detail: Option<String>,
}

pub(super) struct Runner<R: Runtime> {
    pub(super) cx: Context<R>,
    taints: TaintManager,
    settling: Settling,
    node: NodeFacts,
    pods: HashMap<PodUid, Arc<Pod>>,
    /// Taint evictions due (from the taint manager's schedules).
    taint_due: HashMap<PodUid, Instant>,
    retries: HashMap<(EvictionSource, PodUid), Retry>,
    /// Events already recorded: (pod, what).
    reported: HashSet<(PodUid, String)>,
    /// Attempts under way (API calls run as tasks: the loop never waits on the API).
    attempts: JoinSet<Done>,
    in_flight: HashSet<(EvictionSource, PodUid)>,
    limit: Arc<Semaphore>,
    /// Whether each pod matched the node's labels when last checked (only a change from
    /// matching to not matching starts an eviction).
    matched: HashMap<PodUid, bool>,
    /// Dry run: decisions reported (once each).
    dry_reported: HashSet<(EvictionSource, PodUid)>,
}

/// An attempt's end, for the loop.
pub(super) struct Done {
    source: EvictionSource,
    uid: PodUid,
    /// The pod as it was when the attempt started (it may have left since: its DELETE's
    /// watch event can come before the answer).
    pod: Arc<Pod>,
    attempt: Attempt,
}

/// Evictions under way at once.
const CONCURRENT: usize = 8;

pub(super) fn facts(pod: &Pod, seen: Instant, own: Option<&PodUid>) -> Option<PodFacts> {
    let uid = pod_uid(pod)?;
    let exempt = mirror_or_static(pod) || own == Some(&uid);
    Some(PodFacts {
        uid,
        key: key(pod),
        tolerations: pod
            .spec
            .as_ref()
            .and_then(|s| s.tolerations.clone())
            .unwrap_or_default(),
        exempt,
        seen,
    })
}

/// The pod's UID, when it has a valid one.
pub(super) fn pod_uid(pod: &Pod) -> Option<PodUid> {
    PodUid::parse(pod.metadata.uid.as_deref()?).ok()
}

pub(super) fn key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

use crate::pod::is_mirror_or_static as mirror_or_static;

fn daemonset_owned(pod: &Pod) -> bool {
    pod.metadata.owner_references.as_ref().is_some_and(|o| {
        o.iter()
            .any(|r| r.kind == "DaemonSet" && r.controller == Some(true))
    })
}

/// A pod that is still running here: not terminal, not being deleted.
fn live(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none() && !crate::pod::is_terminal(pod)
}

/// When the node watch is polled again after a failure.
#[derive(Debug, Clone, Copy)]
enum WatchPause {
    /// The server answered with an error: after the backoff.
    Until(Instant),
    /// No answer: once the server is reachable again.
    Reachable,
}

async fn resume(pause: Option<WatchPause>, health: &crate::api::health::ApiHealth) {
    match pause {
        Some(WatchPause::Until(t)) => tokio::time::sleep_until(t).await,
        Some(WatchPause::Reachable) => health.reachable().await,
        None => std::future::pending().await,
    }
}

/// Runs until cancelled.
pub async fn run<R: Runtime>(
    cx: Context<R>,
    mut pods: mpsc::UnboundedReceiver<PodChange>,
    cancel: CancellationToken,
) {
    let settle = cx
        .config
        .node_affinity
        .as_ref()
        .map_or(super::DEFAULT_SETTLE, |a| a.settle);
    let nodes: kube::Api<Node> = kube::Api::all(cx.client.clone());
    let wc = watcher::Config::default().fields(&format!("metadata.name={}", cx.node));
    // paced here, by the agent's one backoff and its view of the server, not by kube-runtime
    let stream = watcher(nodes, wc);
    // reset only after two quiet minutes, never by an event (client-go's reflector)
    let mut watch_backoff = Backoff::resetting_after(Policy::API, STABLE_RESET);
    let mut pause: Option<WatchPause> = None;
    let mut stream = std::pin::pin!(stream);
    let mut r = Runner {
        cx,
        taints: TaintManager::new(),
        settling: Settling::new(settle),
        node: NodeFacts::default(),
        pods: HashMap::new(),
        taint_due: HashMap::new(),
        retries: HashMap::new(),
        reported: HashSet::new(),
        attempts: JoinSet::new(),
        in_flight: HashSet::new(),
        limit: Arc::new(Semaphore::new(CONCURRENT)),
        matched: HashMap::new(),
        dry_reported: HashSet::new(),
    };
    // a (re)list of the Node that does not include it: the Node is gone
    let mut listed_node = false;
    let mut authority = r.cx.authority.changes();
    let mut watch_failing = false;
    loop {
        r.publish();
        // no attempt while the server is unreachable: they start when it is back
        let down = !r.cx.health.is_reachable();
        let next = if down { None } else { r.next_deadline() };
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = r.cx.health.reachable(), if down => {}
            _ = resume(pause, &r.cx.health), if pause.is_some() => pause = None,
            ev = stream.next(), if pause.is_none() => match ev {
                Some(Ok(watcher::Event::Init)) => listed_node = false,
                Some(Ok(watcher::Event::InitDone)) => {
                    watch_failing = false;
                    r.cx.health.answered();
                    if !listed_node {
                        r.node_gone();
                    }
                }
                Some(Ok(watcher::Event::Apply(n) | watcher::Event::InitApply(n))) => {
                    watch_failing = false;
                    r.cx.health.answered();
                    listed_node = true;
                    r.node_changed(&n);
                }
                Some(Ok(watcher::Event::Delete(_))) => r.node_gone(),
                Some(Err(e)) => {
                    let f = crate::api::watch_failure(&e);
                    r.cx.health.failed(f);
                    let delay = watch_backoff.failed(f, rand::random());
                    pause = Some(match f {
                        Failure::NoAnswer => WatchPause::Reachable,
                        Failure::Answered { .. } | Failure::Slow => {
                            WatchPause::Until(Instant::now() + delay)
                        }
                    });
                    if !watch_failing {
                        tracing::warn!(err = %e, "node watch failed; retrying with backoff");
                        watch_failing = true;
                    }
                }
                None => return,
            },
            ch = pods.recv() => match ch {
                Some(ch) => r.pods_changed(ch),
                None => return,
            },
            _ = authority.changed() => {}
            Some(done) = r.attempts.join_next(), if !r.attempts.is_empty() => {
                if let Ok(done) = done {
                    r.attempt_done(done);
                }
            }
            _ = sleep_until(next) => r.fire_due(),
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

impl<R: Runtime> Runner<R> {
    fn count(&self, source: EvictionSource, outcome: &'static str) {
        if let Some(m) = &self.cx.metrics {
            m.evictions
                .get_or_create(&EvictionLabels {
                    source: source.as_str(),
                    outcome,
                })
                .inc();
        }
    }

    pub(super) fn event(&self, pod: &Pod, reason: EventReason, message: String) {
        let Some(uid) = pod_uid(pod) else {
            return;
        };
        self.cx.events.record(PodEvent {
            uid,
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            name: pod.metadata.name.clone().unwrap_or_default(),
            reason,
            message,
            annotations: Default::default(),
        });
    }

    fn node_changed(&mut self, n: &Node) {
        let now = Instant::now();
        let wall = jiff::Timestamp::now();
        let taints: Vec<TaintAt> = n
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default()
            .into_iter()
            .map(|t| {
                // wall clock only here: how long ago it was added, on the monotonic clock
                let added = t.time_added.as_ref().map(|ta| {
                    let ago = wall.duration_since(ta.0).unsigned_abs();
                    let ago = if wall >= ta.0 { ago } else { Duration::ZERO };
                    now.checked_sub(ago).unwrap_or(now)
                });
                TaintAt { taint: t, added }
            })
            .collect();
        let node = NodeFacts {
            name: n.metadata.name.clone().unwrap_or_default(),
            labels: n.metadata.labels.clone().unwrap_or_default(),
        };
        if self.cx.config.taint_manager {
            let actions = self.taints.node(&taints, now);
            self.apply(actions);
        }
        if node != self.node {
            self.node = node;
            let uids: Vec<PodUid> = self.pods.keys().cloned().collect();
            for uid in uids {
                self.check_affinity(&uid, now);
            }
        }
    }

    fn node_gone(&mut self) {
        let actions = self.taints.node(&[], Instant::now());
        self.apply(actions);
    }

    fn pods_changed(&mut self, ch: PodChange) {
        let now = Instant::now();
        match ch {
            PodChange::Listed(list) => {
                let keep: HashSet<PodUid> = list.iter().filter_map(|p| pod_uid(p)).collect();
                let gone: Vec<PodUid> = self
                    .pods
                    .keys()
                    .filter(|u| !keep.contains(*u))
                    .cloned()
                    .collect();
                for uid in gone {
                    self.pod_gone(&uid);
                }
                for p in list {
                    self.pod_applied(p, now);
                }
            }
            PodChange::Apply(p) => self.pod_applied(p, now),
            PodChange::Gone(uid) => self.pod_gone(&uid),
        }
    }

    fn pod_applied(&mut self, p: Arc<Pod>, now: Instant) {
        // when the pod was created, on the monotonic clock (wall clock only here)
        let seen = p.metadata.creation_timestamp.as_ref().map_or(now, |ct| {
            let ago = jiff::Timestamp::now().duration_since(ct.0);
            let ago = Duration::try_from(ago).unwrap_or(Duration::ZERO);
            now.checked_sub(ago).unwrap_or(now)
        });
        let Some(f) = facts(&p, seen, self.cx.config.own_pod.as_ref()) else {
            return;
        };
        if !live(&p) {
            self.pod_gone(&f.uid);
            return;
        }
        let uid = f.uid.clone();
        self.pods.insert(uid.clone(), p);
        if self.cx.config.taint_manager {
            let actions = self.taints.pod(f, now);
            self.apply(actions);
        }
        self.check_affinity(&uid, now);
    }

    fn pod_gone(&mut self, uid: &PodUid) {
        self.pods.remove(uid);
        let actions = self.taints.pod_gone(uid);
        self.apply(actions);
        self.settling.forget(uid);
        self.taint_due.remove(uid);
        self.retries.retain(|(_, u), _| u != uid);
        self.reported.retain(|(u, _)| u != uid);
        self.matched.remove(uid);
        self.dry_reported.retain(|(_, u)| u != uid);
    }

    /// Whether node affinity is enforced for this pod.
    fn affinity_applies(&self, pod: &Pod) -> bool {
        let Some(cfg) = &self.cx.config.node_affinity else {
            return false;
        };
        let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
        (cfg.namespaces.is_empty() || cfg.namespaces.iter().any(|n| n == ns))
            && cfg
                .selector
                .matches(&pod.metadata.labels.clone().unwrap_or_default())
            && !daemonset_owned(pod)
            && !mirror_or_static(pod)
            && pod_uid(pod).is_none_or(|u| self.cx.config.own_pod.as_ref() != Some(&u))
    }

    fn check_affinity(&mut self, uid: &PodUid, now: Instant) {
        let Some(pod) = self.pods.get(uid).cloned() else {
            return;
        };
        if self.node.name.is_empty() || !self.affinity_applies(&pod) {
            self.settling.forget(uid);
            self.retries
                .remove(&(EvictionSource::NodeAffinity, uid.clone()));
            return;
        }
        let matches = pod
            .spec
            .as_ref()
            .is_none_or(|s| affinity::pod_matches(s, &self.node));
        let before = self.matched.insert(uid.clone(), matches);
        let was = self.settling.contains(uid);
        if !matches && !was && before != Some(true) {
            // not matching since reaplet first saw it: no label change to act on
            if before.is_none() {
                tracing::info!(pod = %key(&pod), podUID = %uid,
                    "required node affinity does not match this node, and no label change was seen; not evicted");
            }
            return;
        }
        let due = self.settling.observe(uid, matches, now);
        match (due, was) {
            (Some(at), false) => tracing::info!(pod = %key(&pod), podUID = %uid,
                inMs = at.saturating_duration_since(now).as_millis() as u64,
                "required node affinity no longer matches this node; evicting after the settle delay"),
            (None, true) => {
                self.retries
                    .remove(&(EvictionSource::NodeAffinity, uid.clone()));
                self.dry_reported
                    .remove(&(EvictionSource::NodeAffinity, uid.clone()));
                tracing::info!(pod = %key(&pod), podUID = %uid,
                    "required node affinity matches again; eviction cancelled")
            }
            _ => {}
        }
    }

    fn apply(&mut self, actions: Vec<Action>) {
        for a in actions {
            match a {
                Action::Schedule { uid, at } => {
                    if let Some(p) = self.pods.get(&uid) {
                        tracing::info!(pod = %key(p), podUID = %uid,
                            inMs = at.saturating_duration_since(Instant::now()).as_millis() as u64,
                            "NoExecute taint: pod scheduled for deletion");
                    }
                    self.taint_due.insert(uid, at);
                }
                Action::Cancel { uid } => {
                    self.taint_due.remove(&uid);
                    self.retries
                        .remove(&(EvictionSource::TaintManager, uid.clone()));
                    self.dry_reported
                        .remove(&(EvictionSource::TaintManager, uid.clone()));
                    if let Some(p) = self.pods.get(&uid).cloned() {
                        tracing::info!(pod = %key(&p), podUID = %uid, "NoExecute taint: deletion cancelled");
                        if self.cx.config.dry_run {
                            continue;
                        }
                        self.event(
                            &p,
                            EventReason::TaintManagerEviction,
                            format!("Cancelling deletion of Pod {}", key(&p)),
                        );
                        self.count(EvictionSource::TaintManager, "cancelled");
                    }
                }
                Action::Exempt { uid } => {
                    if let Some(p) = self.pods.get(&uid) {
                        tracing::warn!(pod = %key(p), podUID = %uid,
                            "NoExecute taint not tolerated by a mirror or static pod; not evicted (its manifest decides)");
                    }
                    self.count(EvictionSource::TaintManager, "exempt");
                }
            }
        }
    }

    /// Every due (or future) attempt, by source and pod: the later of its own time and its
    /// retry time; none for an attempt under way or one already reported in a dry run.
    fn schedule(&self) -> Vec<(Instant, EvictionSource, PodUid)> {
        let mut v = Vec::new();
        let mut push = |at: Instant, source: EvictionSource, uid: &PodUid| {
            let k = (source, uid.clone());
            if self.in_flight.contains(&k) || self.dry_reported.contains(&k) {
                return;
            }
            let at = self.retries.get(&k).map_or(at, |r| r.at.max(at));
            v.push((at, source, uid.clone()));
        };
        for (uid, at) in &self.taint_due {
            push(*at, EvictionSource::TaintManager, uid);
        }
        for uid in self.settling.all() {
            if let Some(at) = self.settling.due_at(&uid) {
                push(at, EvictionSource::NodeAffinity, &uid);
            }
        }
        v.sort();
        v
    }

    fn next_deadline(&self) -> Option<Instant> {
        self.schedule().first().map(|(at, _, _)| *at)
    }

    fn fire_due(&mut self) {
        let now = Instant::now();
        for (at, source, uid) in self.schedule() {
            if at > now {
                break;
            }
            self.start_attempt(source, &uid);
        }
    }

    fn start_attempt(&mut self, source: EvictionSource, uid: &PodUid) {
        let Some(pod) = self.pods.get(uid).cloned() else {
            self.taint_due.remove(uid);
            self.settling.forget(uid);
            return;
        };
        let k = (source, uid.clone());
        if self.cx.config.dry_run {
            tracing::info!(pod = %key(&pod), podUID = %uid, source = source.as_str(),
                "dry run: would evict");
            self.count(source, "dry_run");
            self.dry_reported.insert(k);
            return;
        }
        if !self.cx.authority.is_active() {
            // standby: kept due, tried again when the agent becomes active (or in a second)
            let failures = self.retries.get(&k).map_or(0, |r| r.failures);
            self.retries.insert(
                k,
                Retry {
                    at: Instant::now() + Duration::from_secs(1),
                    failures,
                    detail: Some(STANDBY.into()),
                },
            );
            return;
        }
        self.in_flight.insert(k);
        let (client, node, limit) = (
            self.cx.client.clone(),
            self.cx.node.clone(),
            self.limit.clone(),
        );
        let uid = uid.clone();
        self.attempts.spawn(async move {
            let _permit = limit.acquire_owned().await;
            let attempt = match source {
                EvictionSource::TaintManager => actions::delete_for_taint(&client, &pod).await,
                EvictionSource::NodeAffinity => {
                    actions::evict_for_affinity(&client, &node, &pod).await
                }
            };
            Done {
                source,
                uid,
                pod,
                attempt,
            }
        });
    }

    fn attempt_done(&mut self, d: Done) {
        let k = (d.source, d.uid.clone());
        self.in_flight.remove(&k);
        let pod = d.pod.clone();
        if let Some(n) = d.attempt.note {
            let first = n
                .once
                .as_ref()
                .is_none_or(|o| self.reported.insert((d.uid.clone(), o.clone())));
            if first {
                self.event(&pod, n.reason, n.message);
            }
        }
        match d.attempt.outcome {
            Outcome::Done(outcome) => {
                self.count(d.source, outcome);
                if matches!(outcome, "deleted" | "evicted") {
                    let _ = self
                        .cx
                        .workers
                        .kill(&d.uid, KillRequest::new(KillReason::Evicted(d.source)));
                }
                self.finish(d.source, &d.uid);
            }
            Outcome::Retry(after, outcome, detail) => {
                self.count(d.source, outcome);
                if !self.pods.contains_key(&d.uid) {
                    return; // it left meanwhile: nothing to retry
                }
                let failures = self.retries.get(&k).map_or(0, |r| r.failures) + 1;
                if failures == 1 && outcome == "failed" {
                    tracing::warn!(pod = %key(&pod), podUID = %d.uid, source = d.source.as_str(),
                        detail = detail.as_deref().unwrap_or(""), "eviction failed; retrying with backoff");
                }
                let after = if after.is_zero() {
                    match outcome {
                        "blocked" => BLOCKED.jittered(failures, rand::random()),
                        _ => FAILED.jittered(failures, rand::random()),
                    }
                } else {
                    after
                };
                self.retries.insert(
                    k,
                    Retry {
                        at: Instant::now() + after,
                        failures,
                        detail,
                    },
                );
            }
        }
    }

    fn finish(&mut self, source: EvictionSource, uid: &PodUid) {
        self.retries.remove(&(source, uid.clone()));
        match source {
            EvictionSource::TaintManager => {
                self.taint_due.remove(uid);
                self.taints.fired(uid);
            }
            EvictionSource::NodeAffinity => self.settling.forget(uid),
        }
        // the pod is leaving: no further decision about it
        self.pods.remove(uid);
    }

    fn publish(&self) {
        let now = Instant::now();
        let mut v = Vec::new();
        let mut push = |uid: &PodUid, source: EvictionSource, at: Instant, state| {
            let retry = self.retries.get(&(source, uid.clone()));
            let (state, at) = match retry {
                Some(r) if r.detail.as_deref() == Some(STANDBY) => ("waiting", r.at),
                Some(r) => ("blocked", r.at.max(at)),
                None => (state, at),
            };
            v.push(PendingEviction {
                uid: uid.to_string(),
                pod: self.pods.get(uid).map(|p| key(p)).unwrap_or_default(),
                source: source.as_str(),
                state,
                in_seconds: at.saturating_duration_since(now).as_secs_f64(),
                detail: retry.and_then(|r| r.detail.clone()),
            });
        };
        for (uid, at) in &self.taint_due {
            push(uid, EvictionSource::TaintManager, *at, "scheduled");
        }
        for uid in self.settling.all() {
            let at = self.settling.due_at(&uid).unwrap_or(now);
            push(&uid, EvictionSource::NodeAffinity, at, "settling");
        }
        v.sort_by(|a, b| {
            a.in_seconds
                .total_cmp(&b.in_seconds)
                .then(a.uid.cmp(&b.uid))
        });
        *self.cx.view.lock().unwrap_or_else(|e| e.into_inner()) = v;
    }
}
