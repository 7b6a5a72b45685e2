//! Housekeeping: the main loop. It relists the runtime (the PLEG's relist,
//! `pleg/generic.go`) and does the parts of the kubelet's `HandlePodCleanups`
//! (`kubelet_pods.go`) that act on what the relist finds: orphaned runtime pods, pods whose
//! containers all exited (natural completion), the sandboxes of finished orphans, and
//! workers that are done; after them it runs the sweeps of the node's leftovers
//! ([`super::sweeps`]). Meanwhile it beats (liveness) and has the runtime's health
//! (readiness) judged from the relists: both, and why they are split, are in
//! [`super::runtime_health`].
//!
//! Invariants:
//! * the loop never blocks on the runtime: it waits for the next relist and polls each pass
//!   beside its beat timer, beating every [`BEAT`]; a relist's two lists are bounded by
//!   [`relist_deadline`], the orphan confirmation's API reads together by
//!   [`super::confirm::READ_BUDGET`] (a slow API server must not hold the relists and get the
//!   runtime taken for stalled), the rest of a pass by each call's request timeout, and every
//!   relist's outcome is told to the runtime's health;
//! * a runtime pod unknown to every source is an orphan only if it predates every source's
//!   last complete list, as of when that list was asked for (a newer one may simply not have
//!   reached reaplet), and, with an API, once a read by name confirms its object gone
//!   ([`super::confirm`]); the same for removing a dead one's sandboxes;
//! * natural completion needs every regular container's newest instance exited, and for
//!   `OnFailure` every exit code 0;
//! * every pod it ends goes through the same seam as the sources ([`KillRequest`]);
//! * the registry lock is released before any runtime call; one line when relisting starts
//!   failing and one when it works again, never one per poll;
//! * a container event updates its own pod, not the node: its container is mapped to its pod
//!   from the last lists; an event of a pod whose kill is under way needs nothing (the kill
//!   waits for its containers itself); another known pod is relisted alone (its sandboxes and
//!   containers, filtered by its UID); only an unknown container asks for a full relist, and
//!   those, and events of more than [`TARGETED_MAX`] pods at once, are debounced
//!   ([`FULL_DEBOUNCE`]). The periodic full relist stays the safety net.
//!   (Before, every exit or deletion event was a full relist: about 4 per single-container
//!   pod, O(n^2) work in a bulk deletion while the runtime is busiest.)

use super::confirm::{Candidate, Pass};
use super::runtime_health::{BEAT, relist_deadline};
use super::subscription::{Exits, Next, Subscription};
use super::sweeps::Sweeps;
use super::{KillRequest, PodWorkers, StaticPods};
use crate::cri::{ContainerRunState, CriError, Runtime, RuntimeContainer};
use crate::lifecycle::{KillReason, PodPhase};
use crate::pod::{self, PodInfo, PodUid};
use std::collections::{HashMap, HashSet};
use std::time::Duration;
use tokio::time::Instant;

/// For this long after a (re)subscription the relist keeps the fast period: an exit between the
/// stream's opening and the runtime's registering it is in no event, and right after a runtime
/// restart the runtime's view may apply such an exit only seconds later (one relist 1 s after
/// the resubscription still saw the container running in a loaded suite run; the exit then
/// waited for the next periodic relist, 29 s).
const AFTER_SUBSCRIBE: Duration = Duration::from_secs(10);

/// Full relists asked for by events come at most this often.
pub const FULL_DEBOUNCE: Duration = Duration::from_millis(250);

/// A pass for more pods than this lists the whole node instead (two calls either way).
pub const TARGETED_MAX: usize = 4;

/// What a housekeeping pass relists.
#[derive(Debug)]
enum Scope {
    Full,
    Pods(HashSet<PodUid>),
}

/// What a relist saw: the containers that may run, and the owner of every container and
/// sandbox it listed.
#[derive(Default)]
struct Listing {
    running: HashSet<String>,
    owners: HashMap<String, PodUid>,
}

/// What one relist found to do, decided under the registry lock and done after it.
struct Findings {
    /// Orphan candidates: confirmed gone before they are ended ([`super::confirm`]).
    orphans: Vec<(PodInfo, Candidate)>,
    /// Sandboxes of runtime pods with nothing running and no worker: removed once their pod
    /// is confirmed gone, as an orphan is.
    gc_orphans: Vec<(Candidate, Vec<String>)>,
    /// Terminal pods with something still running and no worker (deferred in standby).
    terminal: Vec<PodInfo>,
    completion_checks: Vec<(PodInfo, Vec<RuntimeContainer>)>,
    /// Sandboxes of pods this agent ended (finished workers).
    gc_sandboxes: Vec<String>,
    /// Whether the relist saw the whole runtime (the confirmation's [`Pass`]).
    pass: Pass,
}

impl<R: Runtime> PodWorkers<R> {
    /// Housekeeping, the main loop: beats every [`BEAT`], relists the runtime (at once on
    /// container events, see [`super::subscription`]; else every `relist_period`, every
    /// `relist_period_with_events` while events flow and the runtime is healthy, but for
    /// `AFTER_SUBSCRIBE` after each (re)subscription) under the
    /// relist deadline, judges the runtime's health, finds orphans and naturally completed
    /// pods, and forgets finished workers. Runs until cancelled. See the `runtime_health`
    /// module's docs for the heartbeat/relist split.
    pub async fn run_housekeeping(self) {
        let cancel = self.inner.cancel.clone();
        let mut relist_failing = false;
        let mut sweeps = Sweeps::default();
        let mut beat = tokio::time::interval(BEAT);
        beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        self.beat();
        let mut sub = Subscription::new(self.inner.config.container_events, Instant::now());
        let mut exits = Exits::default();
        // a quick relist for an exit the runtime's CRI view has not applied yet
        let mut recheck: Option<Duration> = None;
        // periodic passes (the safety net, and the only ones that sweep leftovers) keep their
        // rhythm whatever events trigger in between
        let mut last_periodic = Instant::now();
        // the fast period holds until then after a (re)subscription
        let mut settling_until: Option<Instant> = None;
        // who owns each container and sandbox, from the lists so far (rebuilt by every full one)
        let mut owners: HashMap<String, PodUid> = HashMap::new();
        // a full relist events asked for, and when the last full one ran
        let mut full_due: Option<Instant> = None;
        let mut last_full = Instant::now();
        let mut authority = self.inner.authority.changes();
        authority.mark_unchanged();
        let mut authority_open = true;
        loop {
            // while the runtime is stalled, poll at the fast period to see it come back; the
            // same for a while after each (re)subscription
            let settling = settling_until.is_some_and(|t| Instant::now() < t);
            let period = if sub.flowing() && self.runtime_stall().is_none() && !settling {
                self.inner.config.relist_period_with_events
            } else {
                self.inner.config.relist_period
            };
            // waiting for the next relist, beating meanwhile; periodic passes sweep leftovers
            let periodic_at = last_periodic + period;
            let wake = recheck
                .take()
                .map_or(periodic_at, |d| periodic_at.min(Instant::now() + d));
            let mut periodic = false;
            let mut scope = Scope::Full;
            let next = tokio::time::sleep_until(wake);
            tokio::pin!(next);
            loop {
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = self.frozen() => return self.wedged().await,
                    _ = beat.tick() => {
                        self.beat();
                        self.judge_runtime_health();
                    }
                    _ = &mut next => {
                        periodic = Instant::now() >= periodic_at;
                        if !periodic {
                            // a quick recheck of exits not applied yet: their pods alone
                            let ids: Vec<String> = exits.pending().cloned().collect();
                            scope = self.event_scope(ids, &owners, &mut exits);
                        }
                        break;
                    }
                    _ = sleep_until_some(full_due) => break,
                    _ = self.inner.relist_now.notified() => break,
                    // a takeover: the deleted pods left to the kubelet are ended now
                    r = authority.changed(), if authority_open => match r {
                        Ok(()) if *authority.borrow_and_update() => {
                            self.take_over();
                            break;
                        }
                        Ok(()) => {}
                        Err(_) => authority_open = false,
                    },
                    next = sub.next(&mut exits) => match next {
                        Next::Ended => {
                            sub.ended(Instant::now());
                            break;
                        }
                        Next::Due => break,
                        Next::Events => {
                            let ids = exits.take_batch().into_iter().collect();
                            match self.event_scope(ids, &owners, &mut exits) {
                                Scope::Pods(p) if p.is_empty() => {}
                                Scope::Pods(p) => {
                                    scope = Scope::Pods(p);
                                    break;
                                }
                                Scope::Full => {
                                    let at = (last_full + FULL_DEBOUNCE).max(Instant::now());
                                    full_due = Some(full_due.map_or(at, |d| d.min(at)));
                                }
                            }
                        }
                    },
                }
            }
            if matches!(scope, Scope::Full) {
                full_due = None;
                last_full = Instant::now();
            }
            // the pass, beating meanwhile: a due (re)subscription first, then the relist,
            // which covers any event missed before it; the runtime lists are bounded by the
            // relist deadline, the pass's other calls by the runtime request timeout
            let deadline = relist_deadline(period);
            if periodic {
                last_periodic = Instant::now();
            }
            let subscribe = sub.due(Instant::now());
            let pass = async {
                let subscribed = match subscribe {
                    false => None,
                    true => Some(
                        tokio::time::timeout(deadline, self.inner.runtime.container_events())
                            .await
                            .unwrap_or(Err(CriError::DeadlineExceeded {
                                op: "container events",
                                id: String::new(),
                                timeout: deadline,
                            })),
                    ),
                };
                let sweeps = periodic.then_some(&mut sweeps);
                let listed = match &scope {
                    Scope::Full => self.relist_sweeping(sweeps, deadline).await,
                    Scope::Pods(uids) => self.relist_pods(uids, deadline).await,
                };
                (subscribed, listed)
            };
            tokio::pin!(pass);
            let (subscribed, r) = loop {
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = self.frozen() => return self.wedged().await,
                    r = &mut pass => break r,
                    _ = beat.tick() => {
                        self.beat();
                        self.judge_runtime_health();
                    }
                }
            };
            // a stream is taken as open before the runtime has surely registered it: an exit in
            // between is in no event and may reach the runtime's view only after this pass's
            // relist. The fast period for a while covers it
            if let Some(s) = subscribed {
                sub.subscribed(s, Instant::now());
                if sub.flowing() {
                    settling_until = Some(Instant::now() + AFTER_SUBSCRIBE);
                }
            }
            match r {
                Err(e) if !relist_failing => {
                    tracing::warn!(err = %e, "runtime relist failed; retrying every period");
                    relist_failing = true;
                }
                Err(e) => tracing::debug!(err = %e, "runtime relist failed again"),
                Ok(listing) => {
                    if relist_failing {
                        tracing::info!("runtime relist works again");
                        relist_failing = false;
                    }
                    recheck = match &scope {
                        Scope::Full => {
                            owners = listing.owners;
                            exits.after_relist(&listing.running, Instant::now())
                        }
                        Scope::Pods(uids) => {
                            let covered = |id: &str| {
                                owners.get(id).is_some_and(|u| uids.contains(u))
                                    || listing.owners.contains_key(id)
                            };
                            let r = exits.after_relist_of(
                                &listing.running,
                                Some(&covered),
                                Instant::now(),
                            );
                            owners.extend(listing.owners);
                            r
                        }
                    };
                }
            }
            self.judge_runtime_health();
            self.beat();
        }
    }

    /// The test hook's freeze (feature `test-hooks`); never fires otherwise.
    async fn frozen(&self) {
        #[cfg(feature = "test-hooks")]
        self.inner.frozen.notified().await;
        #[cfg(not(feature = "test-hooks"))]
        std::future::pending::<()>().await;
    }

    /// A wedged main loop (the test hook): no beat, no relist, until reaplet stops.
    async fn wedged(&self) {
        tracing::warn!("test hook: housekeeping frozen");
        self.inner.cancel.cancelled().await;
    }

    /// One housekeeping pass. Public so callers can force one. A forced pass does not remove
    /// node leftovers (orphaned pod cgroups and dirs): that takes the housekeeping loop's
    /// confirmation over two passes.
    pub async fn relist(&self) -> Result<(), CriError> {
        let period = self.inner.config.relist_period;
        self.relist_sweeping(None, relist_deadline(period))
            .await
            .map(drop)
    }

    /// Which pods the events' containers `ids` call for a relist of: none for a pod whose
    /// kill is under way (its exits are forgotten: nothing needs to recheck them), its own
    /// pod for a known container, the whole node for an unknown one.
    fn event_scope(
        &self,
        ids: Vec<String>,
        owners: &HashMap<String, PodUid>,
        exits: &mut super::subscription::Exits,
    ) -> Scope {
        let mut pods = HashSet::new();
        let reg = self.registry();
        for id in ids {
            let Some(uid) = owners.get(&id) else {
                return Scope::Full;
            };
            let under_way = reg
                .workers
                .get(uid)
                .is_some_and(|w| w.phase() != PodPhase::Sync);
            if under_way {
                exits.forget(&id);
            } else {
                pods.insert(uid.clone());
            }
        }
        // two calls per pod: past a few pods, the node's two lists cost less
        if pods.len() > TARGETED_MAX {
            return Scope::Full;
        }
        Scope::Pods(pods)
    }

    /// One relist of the pods `uids` alone (their sandboxes and containers, filtered by UID),
    /// and what it calls for; never a leftover sweep nor forgetting a worker (the full
    /// relist's).
    async fn relist_pods(
        &self,
        uids: &HashSet<PodUid>,
        deadline: Duration,
    ) -> Result<Listing, CriError> {
        let rt = &self.inner.runtime;
        let lists = async {
            let (mut sandboxes, mut containers) = (Vec::new(), Vec::new());
            for uid in uids {
                sandboxes.extend(rt.list_sandboxes(Some(uid.as_str())).await?);
                containers.extend(rt.list_containers(Some(uid.as_str())).await?);
            }
            Ok((sandboxes, containers))
        };
        let (sandboxes, containers) = match tokio::time::timeout(deadline, lists).await {
            Ok(r) => r?,
            Err(_) => {
                return Err(CriError::DeadlineExceeded {
                    op: "relist",
                    id: String::new(),
                    timeout: deadline,
                });
            }
        };
        if let Some(m) = self.inner.metrics.get() {
            m.runtime_relists
                .get_or_create(&crate::metrics::RelistLabel { scope: "pod" })
                .inc_by(uids.len() as u64);
        }
        let grouped = pod::group_runtime(&sandboxes, &containers);
        let found = self.judge(&grouped.pods, false);
        self.act(found).await;
        Ok(listing(&grouped.pods, &containers))
    }

    /// The runtime's sandboxes and containers, within `deadline`; the runtime's health
    /// learns the outcome.
    pub(super) async fn list_runtime(
        &self,
        deadline: Duration,
    ) -> Result<(Vec<crate::cri::RuntimeSandbox>, Vec<RuntimeContainer>), CriError> {
        let rt = &self.inner.runtime;
        let lists = async {
            let sandboxes = rt.list_sandboxes(None).await?;
            let containers = rt.list_containers(None).await?;
            Ok((sandboxes, containers))
        };
        let r = match tokio::time::timeout(deadline, lists).await {
            Ok(r) => r,
            Err(_) => Err(CriError::DeadlineExceeded {
                op: "relist",
                id: String::new(),
                timeout: deadline,
            }),
        };
        self.relist_outcome(&r);
        r
    }

    /// One relist and what it calls for; with `sweeps`, the node's leftovers are swept too.
    /// Returns the IDs of the containers the runtime says may run.
    async fn relist_sweeping(
        &self,
        sweeps: Option<&mut Sweeps>,
        deadline: Duration,
    ) -> Result<Listing, CriError> {
        let (sandboxes, containers) = self.list_runtime(deadline).await?;
        if let Some(m) = self.inner.metrics.get() {
            m.runtime_relists
                .get_or_create(&crate::metrics::RelistLabel { scope: "full" })
                .inc();
        }
        let grouped = pod::group_runtime(&sandboxes, &containers);
        for id in &grouped.invalid {
            tracing::warn!(id = %id, "runtime object with an invalid pod uid label skipped");
        }
        let found = self.judge(&grouped.pods, true);
        self.act(found).await;
        if let Some(sweeps) = sweeps {
            let runtime_uids: HashSet<PodUid> = grouped.pods.keys().cloned().collect();
            self.sweep_leftovers(sweeps, &runtime_uids).await;
        }
        Ok(listing(&grouped.pods, &containers))
    }

    /// Does what a relist found: terminal pods left running after a takeover ended, the
    /// sandboxes of pods this agent ended removed (active only), naturally completed pods
    /// ended; last, since only it may read the API, the orphans confirmed gone to the seam and
    /// their sandboxes removed ([`super::confirm`]).
    async fn act(&self, found: Findings) {
        for pod in found.terminal {
            tracing::info!(pod = %pod.key(), podUID = %pod.uid, "terminal pod still running after a takeover");
            self.deliver(pod, KillRequest::new(KillReason::TerminalPhase));
        }
        self.remove_sandboxes(found.gc_sandboxes).await;
        for (pod, cs) in found.completion_checks {
            if !self.none_restarts(&pod, &cs).await {
                continue;
            }
            tracing::info!(pod = %pod.key(), podUID = %pod.uid, "all containers exited; pod completed");
            let _ = self.kill(&pod.uid, KillRequest::new(KillReason::Completed));
        }
        let gc = self
            .end_confirmed_orphans(found.orphans, found.gc_orphans, found.pass)
            .await;
        self.remove_sandboxes(gc).await;
    }

    /// Removes the sandboxes `ids` of finished pods; never in standby (the kubelet's garbage
    /// collection: removing is acting).
    async fn remove_sandboxes(&self, ids: Vec<String>) {
        if !self.inner.authority.is_active() {
            return;
        }
        for id in ids {
            match self.inner.runtime.remove_pod_sandbox(&id).await {
                Ok(()) => tracing::info!(sandboxID = %id, "removed sandbox of a finished orphan"),
                Err(e) if e.is_not_found() => {}
                Err(e) => {
                    tracing::warn!(sandboxID = %id, err = %e, "removing orphan sandbox failed")
                }
            }
        }
    }

    /// Decides, under the registry lock, what the runtime's pods call for; `full`: they are
    /// all of the node's, so finished workers of pods in none of them can be forgotten.
    fn judge(&self, runtime_pods: &RuntimePods<'_>, full: bool) -> Findings {
        let mut found = Findings {
            orphans: Vec::new(),
            gc_orphans: Vec::new(),
            terminal: Vec::new(),
            completion_checks: Vec::new(),
            gc_sandboxes: Vec::new(),
            pass: if full { Pass::Full } else { Pass::Targeted },
        };
        let active = self.inner.authority.is_active();
        let mut reg = self.registry();
        for (uid, (sbs, cs)) in runtime_pods {
            let alive = sbs.iter().any(|s| s.ready) || cs.iter().any(|c| c.state.may_run());
            if let Some(pod) = reg.desired.get(uid) {
                // a terminal pod left to the kubelet in standby, still running after a
                // takeover: ended now (one the kubelet finished costs nothing)
                if active
                    && alive
                    && pod.terminal_phase
                    && !pod.deletion_requested
                    && !reg.workers.contains_key(uid)
                    && !self.is_own(uid)
                {
                    found.terminal.push(pod.clone());
                    continue;
                }
                let in_sync = reg
                    .workers
                    .get(uid)
                    .is_none_or(|w| w.phase() == PodPhase::Sync);
                if in_sync && may_complete(pod) && all_regular_exited(pod, cs) {
                    let cs = cs.iter().map(|c| (*c).clone()).collect();
                    found.completion_checks.push((pod.clone(), cs));
                }
                continue;
            }
            // reaplet's own pod is never an orphan, whatever the sources say (stopping it would
            // kill the process doing the stopping)
            if self.is_own(uid) {
                if reg.left_alone.insert(uid.clone()) {
                    tracing::info!(podUID = %uid, "reaplet's own pod in the runtime; never an orphan");
                }
                continue;
            }
            // the kubelet's static pods are never orphans (their API objects are mirror pods
            // under other UIDs), unless reaplet reads the kubelet's own manifest directory
            if !reg.workers.contains_key(uid)
                && let Some(source) = static_source(sbs)
                && (self.inner.config.static_pods != StaticPods::AllOfNode
                    || source == StaticSource::Http)
            {
                if reg.left_alone.insert(uid.clone()) {
                    let key = sbs
                        .first()
                        .map(|s| format!("{}/{}", s.pod_namespace, s.pod_name))
                        .unwrap_or_default();
                    tracing::info!(pod = %key, podUID = %uid, source = source.as_str(), "static pod of the kubelet's own sources; left alone");
                }
                continue;
            }
            // unknown to every source: an orphan only if it predates the sources' view
            let Some(synced_at) = reg.synced_at else {
                continue;
            };
            let predates = sbs.iter().all(|s| s.created_at < synced_at)
                && cs.iter().all(|c| c.created_at < synced_at);
            if !predates && !reg.workers.contains_key(uid) {
                continue;
            }
            match reg.workers.get(uid).map(|w| w.phase()) {
                // in standby an orphan is the active agent's (judged again after a takeover)
                None if alive && !active => {}
                None if alive => found
                    .orphans
                    .push((PodInfo::from_runtime(uid, sbs, cs), candidate(uid, sbs, cs))),
                // nothing runs and the pod is gone (once confirmed): its sandboxes are garbage,
                // removed only while acting (the kubelet's garbage collection)
                None if active && !sbs.is_empty() => found.gc_orphans.push((
                    candidate(uid, sbs, cs),
                    sbs.iter().map(|s| s.id.clone()).collect(),
                )),
                None => {}
                Some(PodPhase::Finished) => {
                    found.gc_sandboxes.extend(sbs.iter().map(|s| s.id.clone()))
                }
                Some(PodPhase::Sync | PodPhase::Terminating | PodPhase::Terminated) => {}
            }
        }
        if !full {
            return found;
        }
        // forget finished workers whose pod is neither desired nor in the runtime
        let desired = &reg.desired;
        let forget: Vec<PodUid> = reg
            .workers
            .iter()
            .filter(|(uid, w)| {
                !desired.contains_key(*uid)
                    && !runtime_pods.contains_key(*uid)
                    && w.phase() == PodPhase::Finished
            })
            .map(|(u, _)| u.clone())
            .collect();
        for uid in forget {
            reg.workers.remove(&uid);
        }
        // standby: a worker whose pod is gone from every source and from the runtime was
        // ended by the active agent; a held one is released (nothing outlives the pod)
        if !active {
            let gone: Vec<PodUid> = reg
                .workers
                .keys()
                .filter(|u| !reg.desired.contains_key(*u) && !runtime_pods.contains_key(*u))
                .cloned()
                .collect();
            for uid in gone {
                reg.release(&uid);
            }
        }
        found
    }

    /// `OnFailure` completion: every regular container's newest instance exited with 0.
    /// Whether no regular container's latest attempt restarts for the code it exited with
    /// (`getPhase`: every stopped container not restartable makes the pod terminal; with
    /// `ContainerRestartRules`, each container's own policy and rules decide). An exit code
    /// that cannot be read counts as a restart: a terminal phase is never undone.
    async fn none_restarts(&self, pod: &PodInfo, cs: &[RuntimeContainer]) -> bool {
        for c in latest_regular(pod, cs) {
            let Some(spec) = pod.containers.iter().find(|s| s.name == c.name) else {
                return false;
            };
            // no exit code restarts it: no runtime call
            if spec.never_restarts(pod.restart_policy) {
                continue;
            }
            match self.inner.runtime.container_status(&c.id).await {
                Ok(d) if !spec.should_restart(pod.restart_policy, d.exit_code) => {}
                Ok(_) => return false,
                Err(e) => {
                    tracing::debug!(err = %e, "container status failed");
                    return false;
                }
            }
        }
        true
    }
}

/// The runtime's objects grouped by pod.
type RuntimePods<'a> = HashMap<
    PodUid,
    (
        Vec<&'a crate::cri::RuntimeSandbox>,
        Vec<&'a RuntimeContainer>,
    ),
>;

/// An orphan candidate: its UID and its object's namespace and name, from its newest
/// sandbox's labels (else the sandbox's metadata, else a container's labels).
fn candidate(
    uid: &PodUid,
    sbs: &[&crate::cri::RuntimeSandbox],
    cs: &[&RuntimeContainer],
) -> Candidate {
    let sb = sbs.iter().max_by_key(|s| s.created_at);
    let pick = |label: &str, meta: fn(&crate::cri::RuntimeSandbox) -> &str| {
        sb.and_then(|s| s.labels.get(label).cloned())
            .or_else(|| sb.map(|s| meta(s).to_owned()))
            .filter(|v| !v.is_empty())
            .or_else(|| cs.iter().find_map(|c| c.labels.get(label).cloned()))
            .unwrap_or_default()
    };
    Candidate {
        uid: uid.clone(),
        namespace: pick(crate::cri::LABEL_POD_NAMESPACE, |s| &s.pod_namespace),
        name: pick(crate::cri::LABEL_POD_NAME, |s| &s.pod_name),
    }
}

/// The listing of a relist: what may run, and who owns what.
fn listing(pods: &RuntimePods<'_>, containers: &[RuntimeContainer]) -> Listing {
    let mut owners = HashMap::new();
    for (uid, (sbs, cs)) in pods {
        for s in sbs {
            owners.insert(s.id.clone(), uid.clone());
        }
        for c in cs {
            owners.insert(c.id.clone(), uid.clone());
        }
    }
    Listing {
        running: containers
            .iter()
            .filter(|c| c.state.may_run())
            .map(|c| c.id.clone())
            .collect(),
        owners,
    }
}

/// Resolves at `at`, or never.
async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The kubelet's config source of a static pod (`pkg/kubelet/config/common.go`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StaticSource {
    File,
    Http,
}

impl StaticSource {
    fn as_str(self) -> &'static str {
        match self {
            Self::File => "file",
            Self::Http => "http",
        }
    }
}

/// A static runtime pod's source, from its sandboxes' `kubernetes.io/config.source`
/// annotation.
fn static_source(sbs: &[&crate::cri::RuntimeSandbox]) -> Option<StaticSource> {
    sbs.iter().find_map(|s| {
        match s
            .annotations
            .get("kubernetes.io/config.source")
            .map(String::as_str)
        {
            Some("file") => Some(StaticSource::File),
            Some("http") => Some(StaticSource::Http),
            _ => None,
        }
    })
}

/// The newest runtime container per regular container name of the spec.
fn latest_regular<'a>(pod: &PodInfo, cs: &'a [RuntimeContainer]) -> Vec<&'a RuntimeContainer> {
    pod.containers
        .iter()
        .filter_map(|spec| {
            cs.iter()
                .filter(|c| c.name == spec.name)
                .max_by_key(|c| (c.attempt, c.created_at))
        })
        .collect()
}

/// Every regular container of the spec has a runtime container and its newest one exited.
/// Whether the pod can complete at all: no regular container restarts whatever its exit code
/// (its own policy, else the pod's, is not `Always`).
pub(super) fn may_complete(pod: &PodInfo) -> bool {
    !pod.containers
        .iter()
        .any(|c| c.always_restarts(pod.restart_policy))
}

pub(super) fn all_regular_exited(pod: &PodInfo, cs: &[&RuntimeContainer]) -> bool {
    !pod.containers.is_empty()
        && pod.containers.iter().all(|spec| {
            cs.iter()
                .filter(|c| c.name == spec.name)
                .max_by_key(|c| (c.attempt, c.created_at))
                .is_some_and(|c| c.state == ContainerRunState::Exited)
        })
}
