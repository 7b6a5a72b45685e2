//! Housekeeping: the main loop. It beats (liveness), relists the runtime (the PLEG's relist)
//! and judges the runtime's health from it (readiness), and does the parts of the kubelet's
//! `HandlePodCleanups` (`kubelet_pods.go`) that act on what the relist finds: orphaned
//! runtime pods, pods whose containers all exited (natural completion), the sandboxes of
//! finished orphans, and workers that are done.
//!
//! The heartbeat and the relist are split, so that a stalled runtime is not a reason for
//! systemd to restart reaplet (kubelet: the PLEG's relist threshold makes the node NotReady,
//! never restarts the kubelet):
//! * the heartbeat says "the main loop is alive": the loop beats every [`BEAT`] while it
//!   waits for the next relist *and* while a relist pass is in flight (the pass is a future
//!   the loop polls beside its beat timer, not a call it blocks in). `/healthz` and the
//!   systemd `WATCHDOG=1` ping read the beat, so a CRI call that hangs never stops them; a
//!   loop that is itself wedged (a blocking call on its task, a deadlock, or the test hook's
//!   freeze, which stops the loop where it stands) stops beating, and the watchdog fires;
//! * a relist (`ListPodSandbox` + `ListContainers`) has its own deadline,
//!   [`relist_deadline`]: three relist periods within 5–30 s, far below the runtime request
//!   timeout (2 min), so a hung runtime is retried every few periods. The rest of a pass
//!   (sandbox removal, completion checks, sweeps) is bounded by each call's request timeout;
//!   the loop beats meanwhile;
//! * the runtime's health is when a relist last got an answer: with none for
//!   `runtime_unhealthy_after` (30 s, the kubelet's `maxWaitForContainerRuntime`) the runtime
//!   is stalled ([`RuntimeStall`]): `/readyz` fails with the reason, systemd's `STATUS=` says
//!   so, one warning line, one `ContainerRuntimeUnhealthy` node event and the
//!   `container_runtime_unhealthy` gauge at 1; reaplet keeps running, and the pod workers keep
//!   retrying their kills. The first relist answered after it logs one recovery line and
//!   readiness returns. It is computed from the last answer's time, so it holds while a relist
//!   is still waiting.
//!
//! Invariants:
//! * a runtime pod unknown to every source is an orphan only if it predates the moment every
//!   source had delivered a complete list (a newer one may simply not have reached reaplet);
//! * natural completion needs every regular container's newest instance exited, and for
//!   `OnFailure` every exit code 0;
//! * every pod it ends goes through the same seam as the sources ([`KillRequest`]);
//! * the registry lock is released before any runtime call; one line when relisting starts
//!   failing and one when it works again, never one per poll;
//! * after the runtime's pods, the node's leftovers (kubelet's `cleanupOrphanedPodCgroups`
//!   and `cleanupOrphanedPodDirs`): a pod cgroup (every hierarchy, QoS class and driver; with
//!   the systemd driver its slice unit too) or a `<root-dir>/pods/<uid>` directory whose UID
//!   is neither desired, nor has an unfinished worker, nor has anything in the runtime is an
//!   orphan. It is acted on only once every source has synced, and only when it was an
//!   orphan in two passes at least [`ORPHAN_CONFIRM`] apart, the second judged against a
//!   fresh runtime list (a pod being created has its cgroup before the runtime lists its
//!   sandbox). Its processes are killed and its cgroup removed, unless a volume of the pod
//!   is still mounted (the kubelet keeps it then, so memory-backed volumes stay charged to
//!   it); its directory is removed unless anything below it is a mount point, never
//!   following a symlink. Each decision is logged once, never once per pass.

use super::{KillRequest, PodSource, PodWorkers};
use crate::cri::{ContainerRunState, CriError, Runtime, RuntimeContainer};
use crate::grace;
use crate::lifecycle::{KillReason, PodPhase};
use crate::pod::{self, PodInfo, PodUid, RestartPolicy};
use crate::volumes::{self, OrphanDir};
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::time::Duration;
use tokio::time::Instant;

/// How long a pod cgroup or pod directory must stay an orphan (seen in two passes this far
/// apart) before it is removed.
pub const ORPHAN_CONFIRM: Duration = Duration::from_secs(5);

/// How often the housekeeping loop beats (`/healthz` and the watchdog read the beat; their
/// bound is 30 s at least, so a beat every second leaves them a wide margin).
pub const BEAT: Duration = Duration::from_secs(1);

/// The relist deadline's bounds: a relist gets three relist periods, at least
/// [`RELIST_DEADLINE_MIN`] (a List answers in < 5 ms on the test bed, in well under a second
/// with thousands of pods) and at most [`RELIST_DEADLINE_MAX`] (the runtime unhealthy
/// threshold: a relist never outlasts the moment the runtime counts as stalled by much).
pub const RELIST_DEADLINE_MIN: Duration = Duration::from_secs(5);
pub const RELIST_DEADLINE_MAX: Duration = Duration::from_secs(30);

/// The deadline of a relist (the runtime's two lists) with relist period `period`: shorter
/// than the runtime request timeout (2 min by default), so that a hung runtime is noticed and
/// retried every few periods instead of once per request timeout.
pub fn relist_deadline(period: Duration) -> Duration {
    period
        .saturating_mul(3)
        .clamp(RELIST_DEADLINE_MIN, RELIST_DEADLINE_MAX)
}

/// A stalled runtime: how long it has answered no relist, and the last error (or that a relist
/// is still waiting).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeStall {
    pub for_: Duration,
    pub why: String,
}

impl std::fmt::Display for RuntimeStall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "container runtime not answering for {}s ({})",
            self.for_.as_secs(),
            self.why
        )
    }
}

/// What the relists have told of the runtime (behind a short lock in the pipeline).
#[derive(Debug)]
pub(super) struct RuntimeHealth {
    /// When a relist last got both lists (or the pipeline started).
    last_answer: Instant,
    /// The last relist error since then.
    last_error: Option<String>,
    /// A reported stall (log line, event): since when the runtime had not answered; cleared
    /// by the recovery line.
    reported: Option<Instant>,
}

/// A change worth one line.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum HealthChange {
    Stalled(RuntimeStall),
    /// Answering again after a reported stall of this long.
    Recovered(Duration),
}

impl RuntimeHealth {
    pub(super) fn new(now: Instant) -> Self {
        Self {
            last_answer: now,
            last_error: None,
            reported: None,
        }
    }

    fn answered(&mut self, now: Instant) {
        self.last_answer = self.last_answer.max(now);
        self.last_error = None;
    }

    fn failed(&mut self, why: String) {
        self.last_error = Some(why);
    }

    fn stall(&self, now: Instant, after: Duration) -> Option<RuntimeStall> {
        let for_ = now.saturating_duration_since(self.last_answer);
        (for_ >= after).then(|| RuntimeStall {
            for_,
            why: self
                .last_error
                .clone()
                .unwrap_or_else(|| "a relist is still waiting for it".into()),
        })
    }

    /// The change since the last call, if any (each stall is reported once).
    fn judge(&mut self, now: Instant, after: Duration) -> Option<HealthChange> {
        match (self.stall(now, after), self.reported) {
            (Some(s), None) => {
                self.reported = Some(self.last_answer);
                Some(HealthChange::Stalled(s))
            }
            (None, Some(since)) => {
                self.reported = None;
                let stalled = self.last_answer.saturating_duration_since(since);
                Some(HealthChange::Recovered(stalled))
            }
            _ => None,
        }
    }
}

/// What the node-leftover sweeps remember from pass to pass (owned by the housekeeping loop).
#[derive(Default)]
pub(super) struct Sweeps {
    /// Orphaned pod cgroups and pod dirs, since when they have been seen as such.
    cgroup_suspects: HashMap<PodUid, Instant>,
    dir_suspects: HashMap<PodUid, Instant>,
    /// Already reported: cgroups kept for mounted volumes, dirs left alone (and why), and
    /// failures; reported again only when what is reported changes.
    reported: HashMap<(PodUid, &'static str), String>,
}

impl Sweeps {
    /// Whether `what` about `uid` is news (and remembers it).
    fn news(&mut self, uid: &PodUid, kind: &'static str, what: String) -> bool {
        self.reported.insert((uid.clone(), kind), what.clone()) != Some(what)
    }

    /// Marks the candidates of this pass; returns those confirmed as orphans.
    fn confirm(
        suspects: &mut HashMap<PodUid, Instant>,
        candidates: Vec<PodUid>,
        now: Instant,
    ) -> Vec<PodUid> {
        let current: HashSet<&PodUid> = candidates.iter().collect();
        suspects.retain(|u, _| current.contains(u));
        let mut ready = Vec::new();
        for uid in candidates {
            let since = *suspects.entry(uid.clone()).or_insert(now);
            if now.duration_since(since) >= ORPHAN_CONFIRM {
                ready.push(uid);
            }
        }
        ready
    }
}

async fn recv_opt<T>(rx: &mut Option<tokio::sync::mpsc::Receiver<T>>) -> Option<T> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// What one relist found to do, decided under the registry lock and done after it.
#[derive(Default)]
struct Findings {
    orphans: Vec<PodInfo>,
    completion_checks: Vec<(PodInfo, Vec<RuntimeContainer>)>,
    gc_sandboxes: Vec<String>,
}

impl<R: Runtime> PodWorkers<R> {
    /// Housekeeping, the main loop: beats every [`BEAT`], relists the runtime (on container
    /// events when the runtime has them, else every `relist_period`) under the relist
    /// deadline, judges the runtime's health, finds orphans and naturally completed pods,
    /// and forgets finished workers. Runs until cancelled. See the module's docs for the
    /// heartbeat/relist split.
    pub async fn run_housekeeping(self) {
        let cancel = self.inner.cancel.clone();
        let mut relist_failing = false;
        let mut sweeps = Sweeps::default();
        let mut beat = tokio::time::interval(BEAT);
        beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        self.beat();
        let mut events = match self.inner.runtime.container_events().await {
            Ok(rx) => {
                tracing::info!("runtime container events subscribed");
                Some(rx)
            }
            Err(e) => {
                tracing::info!(err = %e, "runtime has no container events; polling");
                None
            }
        };
        loop {
            let period = if events.is_some() {
                self.inner.config.relist_period_with_events
            } else {
                self.inner.config.relist_period
            };
            // waiting for the next relist, beating meanwhile
            let next = tokio::time::sleep(period);
            tokio::pin!(next);
            loop {
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = self.frozen() => return self.wedged().await,
                    _ = beat.tick() => {
                        self.beat();
                        self.judge_runtime_health();
                    }
                    _ = &mut next => break,
                    _ = self.inner.relist_now.notified() => break,
                    ev = recv_opt(&mut events) => {
                        if ev.is_none() {
                            tracing::warn!("runtime container event stream ended; polling");
                            events = None;
                        }
                        break;
                    }
                }
            }
            // the pass, beating meanwhile: its runtime lists are bounded by the relist
            // deadline, its other calls by the runtime request timeout
            let pass = self.relist_sweeping(&mut sweeps, relist_deadline(period));
            tokio::pin!(pass);
            let r = loop {
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
            match r {
                Err(e) if !relist_failing => {
                    tracing::warn!(err = %e, "runtime relist failed; retrying every period");
                    relist_failing = true;
                }
                Err(e) => tracing::debug!(err = %e, "runtime relist failed again"),
                Ok(()) if relist_failing => {
                    tracing::info!("runtime relist works again");
                    relist_failing = false;
                }
                Ok(()) => {}
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

    /// The main loop is alive: `/healthz` and the watchdog read this.
    fn beat(&self) {
        let beat = self.inner.started.elapsed().as_millis() as u64;
        self.inner
            .heartbeat
            .store(beat, std::sync::atomic::Ordering::Relaxed);
    }

    fn health(&self) -> std::sync::MutexGuard<'_, RuntimeHealth> {
        self.inner
            .runtime_health
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the runtime counts as stalled now: it has answered no relist for
    /// `runtime_unhealthy_after` (computed from the last answer, so it holds while a relist
    /// is still waiting). `/readyz` and systemd's `STATUS=` report it.
    pub fn runtime_stall(&self) -> Option<RuntimeStall> {
        let after = self.inner.config.runtime_unhealthy_after;
        self.health().stall(Instant::now(), after)
    }

    /// Reports a change of the runtime's health: once when it stalls (a warning line, the
    /// `ContainerRuntimeUnhealthy` node event, the gauge) and once when it answers again.
    fn judge_runtime_health(&self) {
        let after = self.inner.config.runtime_unhealthy_after;
        let now = Instant::now();
        let mut h = self.health();
        let change = h.judge(now, after);
        drop(h);
        let metrics = self.inner.metrics.get();
        match change {
            Some(HealthChange::Stalled(stall)) => {
                tracing::warn!(
                    forSeconds = stall.for_.as_secs(),
                    err = %stall.why,
                    "container runtime not answering; not ready until it does"
                );
                self.inner.events.record_node(
                    crate::events::NodeEventReason::ContainerRuntimeUnhealthy,
                    &stall.to_string(),
                );
                if let Some(m) = metrics {
                    m.runtime_unhealthy.set(1);
                }
            }
            Some(HealthChange::Recovered(stalled)) => {
                tracing::info!(
                    stalledSeconds = stalled.as_secs(),
                    "container runtime answers again; ready"
                );
                if let Some(m) = metrics {
                    m.runtime_unhealthy.set(0);
                }
            }
            None => {}
        }
    }

    /// One housekeeping pass. Public so callers can force one. A forced pass does not remove
    /// node leftovers (orphaned pod cgroups and dirs): that takes the housekeeping loop's
    /// confirmation over two passes.
    pub async fn relist(&self) -> Result<(), CriError> {
        let period = self.inner.config.relist_period;
        self.relist_sweeping(&mut Sweeps::default(), relist_deadline(period))
            .await
    }

    /// The runtime's sandboxes and containers, within `deadline`; the runtime's health
    /// learns the outcome.
    async fn list_runtime(
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
        let mut h = self.health();
        match &r {
            Ok(_) => h.answered(Instant::now()),
            Err(e) => h.failed(e.to_string()),
        }
        r
    }

    async fn relist_sweeping(
        &self,
        sweeps: &mut Sweeps,
        deadline: Duration,
    ) -> Result<(), CriError> {
        let rt = &self.inner.runtime;
        let (sandboxes, containers) = self.list_runtime(deadline).await?;
        let grouped = pod::group_runtime(&sandboxes, &containers);
        for id in &grouped.invalid {
            tracing::warn!(id = %id, "runtime object with an invalid pod uid label skipped");
        }
        let found = self.judge(&grouped.pods);
        for info in found.orphans {
            tracing::info!(pod = %info.key(), podUID = %info.uid, "orphaned runtime pod found");
            if let Some(m) = self.inner.metrics.get() {
                m.orphaned_runtime_pods.inc();
            }
            let kill = KillRequest::new(KillReason::Orphan).grace(Some(grace::ORPHAN_GRACE));
            self.deliver_from(info, PodSource::Runtime, kill);
        }
        for id in found.gc_sandboxes {
            match rt.remove_pod_sandbox(&id).await {
                Ok(()) => tracing::info!(sandboxID = %id, "removed sandbox of a finished orphan"),
                Err(e) if e.is_not_found() => {}
                Err(e) => {
                    tracing::warn!(sandboxID = %id, err = %e, "removing orphan sandbox failed")
                }
            }
        }
        for (pod, cs) in found.completion_checks {
            if pod.restart_policy == RestartPolicy::OnFailure
                && !self.all_exited_zero(&pod, &cs).await
            {
                continue;
            }
            tracing::info!(pod = %pod.key(), podUID = %pod.uid, "all containers exited; pod completed");
            let _ = self.kill(&pod.uid, KillRequest::new(KillReason::Completed));
        }
        let runtime_uids: HashSet<PodUid> = grouped.pods.keys().cloned().collect();
        self.sweep_leftovers(sweeps, &runtime_uids).await;
        Ok(())
    }

    /// The UIDs whose node state must not be touched: desired, with an unfinished worker, or
    /// in `runtime`. `None` until every source has synced (the desired set is incomplete).
    fn protected(&self, runtime: &HashSet<PodUid>) -> Option<HashSet<PodUid>> {
        let reg = self.registry();
        reg.synced_at?;
        let mut out: HashSet<PodUid> = runtime.clone();
        out.extend(reg.desired.keys().cloned());
        out.extend(
            reg.workers
                .iter()
                .filter(|(_, w)| w.phase() != PodPhase::Finished)
                .map(|(u, _)| u.clone()),
        );
        Some(out)
    }

    /// The orphaned pod cgroup and pod directory sweeps (see the module's invariants).
    async fn sweep_leftovers(&self, sweeps: &mut Sweeps, runtime: &HashSet<PodUid>) {
        // the sweeps kill and delete: held like every kill by the authority (standby)
        if !self.inner.authority.is_active() {
            return;
        }
        let Some(protected) = self.protected(runtime) else {
            return;
        };
        let cgroups = &self.inner.cgroups;
        let naming = cgroups.naming();
        // with the systemd driver `-` and `_` in a UID name the same slice: compare cgroups
        let key = |u: &PodUid| naming.pod_cgroup(u, crate::pod::QosClass::Guaranteed);
        let protected_keys: HashSet<PathBuf> = protected.iter().map(key).collect();
        let mut cgroup_uids = match cgroups.pod_uids() {
            Ok(u) => u,
            Err(e) => {
                tracing::debug!(err = %e, "listing pod cgroups failed");
                Vec::new()
            }
        };
        match cgroups.pod_slice_uids().await {
            Ok(u) => cgroup_uids.extend(u),
            Err(e) => tracing::debug!(err = %e, "listing pod slice units failed"),
        }
        cgroup_uids.sort();
        cgroup_uids.dedup();
        cgroup_uids.retain(|u| !protected_keys.contains(&key(u)));
        let root_dir = &self.inner.config.root_dir;
        let mut dir_uids = volumes::pod_dir_uids(root_dir).unwrap_or_else(|e| {
            tracing::debug!(err = %e, "listing pod directories failed");
            Vec::new()
        });
        dir_uids.retain(|u| !protected.contains(u));
        // a pod another agent (the kubelet) is still starting has its directory and cgroup
        // before its sandbox, possibly for minutes (image pulls, volumes): only leftovers
        // untouched for `orphan_min_age` are candidates
        let min_age = self.inner.config.orphan_min_age;
        cgroup_uids.retain(|u| {
            let paths: Vec<PathBuf> = cgroups
                .existing(u)
                .map(|v| v.into_iter().map(|(_, p)| p).collect())
                .unwrap_or_default();
            paths.iter().all(|p| untouched_for(p, min_age))
        });
        dir_uids.retain(|u| untouched_for(&volumes::pod_dir(root_dir, u), min_age));
        let now = Instant::now();
        let cg_ready = Sweeps::confirm(&mut sweeps.cgroup_suspects, cgroup_uids, now);
        let dir_ready = Sweeps::confirm(&mut sweeps.dir_suspects, dir_uids, now);
        let live: HashSet<PodUid> = sweeps
            .cgroup_suspects
            .keys()
            .chain(sweeps.dir_suspects.keys())
            .cloned()
            .collect();
        sweeps.reported.retain(|(u, _), _| live.contains(u));
        if cg_ready.is_empty() && dir_ready.is_empty() {
            return;
        }
        // judged again against a fresh runtime list: a pod created since the last pass has
        // its sandbox listed by now
        let deadline = relist_deadline(self.inner.config.relist_period);
        let fresh = match self.list_runtime(deadline).await {
            Ok((sbs, cs)) => pod::group_runtime(&sbs, &cs)
                .pods
                .keys()
                .cloned()
                .collect::<HashSet<PodUid>>(),
            Err(e) => {
                tracing::debug!(err = %e, "runtime list for the orphan sweeps failed");
                return;
            }
        };
        let Some(protected) = self.protected(&fresh) else {
            return;
        };
        let protected_keys: HashSet<PathBuf> = protected.iter().map(key).collect();
        for uid in cg_ready {
            if protected_keys.contains(&key(&uid)) {
                sweeps.cgroup_suspects.remove(&uid);
                continue;
            }
            self.remove_orphan_cgroup(sweeps, &uid).await;
        }
        if dir_ready.is_empty() {
            return;
        }
        for uid in dir_ready {
            if protected.contains(&uid) {
                sweeps.dir_suspects.remove(&uid);
                continue;
            }
            if !self.inner.authority.is_active() {
                return;
            }
            // mountinfo read afresh for each directory, just before it is judged
            let mounts = match volumes::read_mountinfo(&self.inner.config.mountinfo) {
                Ok(m) => m,
                Err(e) => {
                    tracing::debug!(err = %e, "mountinfo unreadable; pod directories left alone");
                    return;
                }
            };
            let dir = volumes::pod_dir(root_dir, &uid);
            match volumes::remove_orphan_pod_dir(root_dir, &uid, &mounts) {
                Ok(OrphanDir::Removed) => {
                    sweeps.dir_suspects.remove(&uid);
                    tracing::info!(podUID = %uid, dir = %dir.display(), "orphaned pod directory removed");
                }
                Ok(OrphanDir::Mounted(below)) => {
                    let what = format!("{below:?}");
                    if sweeps.news(&uid, "dir", what) {
                        tracing::warn!(podUID = %uid, dir = %dir.display(), mounted = ?below,
                            "orphaned pod directory has mounts below it; left alone");
                    }
                }
                Ok(OrphanDir::VolumeData(what)) => {
                    if sweeps.news(&uid, "dir", format!("{what:?}")) {
                        tracing::warn!(podUID = %uid, dir = %dir.display(), data = %what.display(),
                            "orphaned pod directory may hold volume data; left alone");
                    }
                }
                Ok(OrphanDir::NotADirectory) => {
                    if sweeps.news(&uid, "dir", "not a directory".into()) {
                        tracing::warn!(podUID = %uid, dir = %dir.display(),
                            "orphaned pod directory is not a plain directory; left alone");
                    }
                }
                Err(e) => {
                    if sweeps.news(&uid, "dir", e.to_string()) {
                        tracing::warn!(podUID = %uid, dir = %dir.display(), err = %e,
                            "removing an orphaned pod directory failed; retrying every pass");
                    }
                }
            }
        }
    }

    /// Kills and removes the pod cgroups of a confirmed orphan, unless a volume of the pod is
    /// still mounted (kubelet: "Orphaned pod found, but volumes not yet removed").
    async fn remove_orphan_cgroup(&self, sweeps: &mut Sweeps, uid: &PodUid) {
        if !self.inner.authority.is_active() {
            return;
        }
        let cfg = &self.inner.config;
        let mounted = volumes::still_mounted(&cfg.root_dir, uid, &cfg.mountinfo);
        if !mounted.is_empty() {
            if sweeps.news(uid, "cgroup", format!("{mounted:?}")) {
                tracing::info!(podUID = %uid, volumes = ?mounted,
                    "orphaned pod cgroup kept while the pod's volumes are mounted");
            }
            return;
        }
        match self.inner.cgroups.destroy(uid).await {
            Ok(r) => {
                sweeps.cgroup_suspects.remove(uid);
                tracing::info!(podUID = %uid, removedDirs = r.removed_dirs,
                    killedPids = r.killed_pids, stoppedUnits = r.stopped_units,
                    "orphaned pod cgroup removed");
            }
            Err(e) => {
                if sweeps.news(uid, "cgroup", e.to_string()) {
                    tracing::warn!(podUID = %uid, err = %e,
                        "removing an orphaned pod cgroup failed; retrying every pass");
                }
            }
        }
    }

    /// Decides, under the registry lock, what the runtime's pods call for.
    fn judge(
        &self,
        runtime_pods: &std::collections::HashMap<
            PodUid,
            (Vec<&crate::cri::RuntimeSandbox>, Vec<&RuntimeContainer>),
        >,
    ) -> Findings {
        let mut found = Findings::default();
        let mut reg = self.registry();
        for (uid, (sbs, cs)) in runtime_pods {
            let alive = sbs.iter().any(|s| s.ready) || cs.iter().any(|c| c.state.may_run());
            if let Some(pod) = reg.desired.get(uid) {
                let in_sync = reg
                    .workers
                    .get(uid)
                    .is_none_or(|w| w.phase() == PodPhase::Sync);
                if in_sync
                    && pod.restart_policy != RestartPolicy::Always
                    && all_regular_exited(pod, cs)
                {
                    let cs = cs.iter().map(|c| (*c).clone()).collect();
                    found.completion_checks.push((pod.clone(), cs));
                }
                continue;
            }
            // the kubelet's static pods are never orphans (their API objects are mirror pods
            // under other UIDs), unless reaplet runs this node's manifest directory itself
            if !self.inner.config.owns_static_pods
                && !reg.workers.contains_key(uid)
                && let Some(source) = static_source(sbs)
            {
                if reg.left_alone.insert(uid.clone()) {
                    let key = sbs
                        .first()
                        .map(|s| format!("{}/{}", s.pod_namespace, s.pod_name))
                        .unwrap_or_default();
                    tracing::info!(pod = %key, podUID = %uid, source, "static pod of the kubelet's own sources; left alone");
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
                None if alive => found.orphans.push(PodInfo::from_runtime(uid, sbs, cs)),
                // nothing runs and the pod is gone: its sandboxes are garbage
                None | Some(PodPhase::Finished) => {
                    found.gc_sandboxes.extend(sbs.iter().map(|s| s.id.clone()))
                }
                Some(PodPhase::Sync | PodPhase::Terminating | PodPhase::Terminated) => {}
            }
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
        found
    }

    /// `OnFailure` completion: every regular container's newest instance exited with 0.
    async fn all_exited_zero(&self, pod: &PodInfo, cs: &[RuntimeContainer]) -> bool {
        for c in latest_regular(pod, cs) {
            match self.inner.runtime.container_status(&c.id).await {
                Ok(d) if d.exit_code == 0 => {}
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

/// The kubelet's config source of a static runtime pod (`file`, `http`), from its sandboxes'
/// `kubernetes.io/config.source` annotation (`pkg/kubelet/config/common.go`).
pub(super) fn static_source(sbs: &[&crate::cri::RuntimeSandbox]) -> Option<&'static str> {
    sbs.iter().find_map(|s| {
        match s
            .annotations
            .get("kubernetes.io/config.source")
            .map(String::as_str)
        {
            Some("file") => Some("file"),
            Some("http") => Some("http"),
            _ => None,
        }
    })
}

/// `path` was last modified at least `min` ago (an unreadable one counts as recent: left
/// alone).
pub(super) fn untouched_for(path: &std::path::Path, min: std::time::Duration) -> bool {
    if min.is_zero() {
        return true;
    }
    std::fs::symlink_metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok())
        .is_some_and(|age| age >= min)
}

/// The newest runtime container per regular container name of the spec.
pub(super) fn latest_regular<'a>(
    pod: &PodInfo,
    cs: &'a [RuntimeContainer],
) -> Vec<&'a RuntimeContainer> {
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
pub(super) fn all_regular_exited(pod: &PodInfo, cs: &[&RuntimeContainer]) -> bool {
    !pod.containers.is_empty()
        && pod.containers.iter().all(|spec| {
            cs.iter()
                .filter(|c| c.name == spec.name)
                .max_by_key(|c| (c.attempt, c.created_at))
                .is_some_and(|c| c.state == ContainerRunState::Exited)
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::authority::Authority;
    use crate::cgroups::{CgroupDriver, CgroupManager, CgroupNaming, CgroupVersion, Hierarchy};
    use crate::cri::fake::FakeRuntime;
    use crate::events::EventSink;
    use crate::metrics::{Exposition, Metrics};
    use crate::workers::PipelineConfig;
    use std::sync::Arc;
    use tokio_util::sync::CancellationToken;
    use tokio_util::task::TaskTracker;

    struct Rig {
        workers: PodWorkers<FakeRuntime>,
        rt: Arc<FakeRuntime>,
        metrics: Arc<Metrics>,
        cancel: CancellationToken,
        _dir: tempfile::TempDir,
    }

    /// The pipeline on a fake runtime with its housekeeping loop running (polling: relist
    /// period 1 s, relist deadline 5 s, unhealthy after 30 s).
    fn rig() -> Rig {
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
        let cancel = CancellationToken::new();
        let workers = PodWorkers::new(
            rt.clone(),
            cgroups,
            PipelineConfig {
                root_dir: dir.path().join("kubelet"),
                mountinfo,
                ..PipelineConfig::default()
            },
            EventSink::log_only(),
            Arc::new(Authority::default()),
            cancel.clone(),
            TaskTracker::new(),
        );
        let metrics = Arc::new(Metrics::new());
        workers.set_metrics(metrics.clone());
        tokio::spawn(workers.clone().run_housekeeping());
        Rig {
            workers,
            rt,
            metrics,
            cancel,
            _dir: dir,
        }
    }

    fn unhealthy_gauge(m: &Metrics) -> bool {
        m.encode(Exposition::Prometheus)
            .lines()
            .any(|l| l == "reaplet_container_runtime_unhealthy 1")
    }

    #[test]
    fn the_relist_deadline_is_a_few_periods_within_bounds() {
        let s = Duration::from_secs;
        assert_eq!(relist_deadline(s(1)), s(5), "polling: the floor");
        assert_eq!(relist_deadline(s(3)), s(9));
        assert_eq!(relist_deadline(s(10)), s(30), "with events: the cap");
        assert_eq!(relist_deadline(Duration::MAX), s(30), "saturates");
        assert!(relist_deadline(s(10)) < crate::cri::CriConfig::default().request_timeout);
    }

    /// A runtime whose lists hang for 3 minutes: the loop keeps beating the whole time
    /// (liveness, the watchdog), the runtime counts as stalled from 30 s on (once, with the
    /// reason), and is healthy again at the first relist it answers.
    #[tokio::test(start_paused = true)]
    async fn a_stalled_runtime_stalls_readiness_never_the_heartbeat() {
        let r = rig();
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(r.workers.runtime_stall().is_none());
        r.rt.stall_lists(true);
        let stalled_at = Instant::now();
        let mut stall_seen = None;
        let mut worst_beat = Duration::ZERO;
        while stalled_at.elapsed() < Duration::from_secs(180) {
            tokio::time::sleep(Duration::from_millis(500)).await;
            worst_beat = worst_beat.max(r.workers.since_heartbeat());
            match r.workers.runtime_stall() {
                Some(s) if stall_seen.is_none() => {
                    assert!(s.why.contains("relist") || s.why.contains("waiting"), "{s}");
                    stall_seen = Some(stalled_at.elapsed());
                }
                Some(_) => {}
                None => assert!(stall_seen.is_none(), "healthy again while stalled"),
            }
        }
        assert!(
            worst_beat <= BEAT * 2,
            "the heartbeat lagged {worst_beat:?}"
        );
        let seen = stall_seen.expect("the stall never showed");
        let after = PipelineConfig::default().runtime_unhealthy_after;
        // the last answer was at most a relist period before the stall began
        assert!(
            seen >= after - Duration::from_secs(1) && seen <= after + Duration::from_secs(1),
            "stalled after {seen:?}"
        );
        let s = r.workers.runtime_stall().unwrap();
        assert!(
            s.to_string()
                .starts_with("container runtime not answering for 18"),
            "{s}"
        );
        assert!(s.why.contains("deadline of 5s exceeded"), "{s}");
        tokio::time::sleep(BEAT * 2).await;
        assert!(unhealthy_gauge(&r.metrics));
        // the runtime answers again: healthy at the next relist
        r.rt.stall_lists(false);
        let released = Instant::now();
        while r.workers.runtime_stall().is_some() {
            assert!(
                released.elapsed() <= relist_deadline(Duration::from_secs(1)) + BEAT,
                "still stalled"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tokio::time::sleep(BEAT * 2).await;
        assert!(!unhealthy_gauge(&r.metrics));
        r.cancel.cancel();
    }

    #[test]
    fn a_stall_is_reported_once_and_its_end_once() {
        let t0 = Instant::now();
        let after = Duration::from_secs(30);
        let mut h = RuntimeHealth::new(t0);
        assert_eq!(h.judge(t0 + Duration::from_secs(29), after), None);
        h.failed("relist: deadline of 5s exceeded".into());
        match h.judge(t0 + Duration::from_secs(31), after) {
            Some(HealthChange::Stalled(s)) => {
                assert_eq!(s.for_, Duration::from_secs(31));
                assert_eq!(s.why, "relist: deadline of 5s exceeded");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(h.judge(t0 + Duration::from_secs(60), after), None, "once");
        h.answered(t0 + Duration::from_secs(61));
        assert_eq!(
            h.judge(t0 + Duration::from_secs(61), after),
            Some(HealthChange::Recovered(Duration::from_secs(61)))
        );
        assert_eq!(h.judge(t0 + Duration::from_secs(62), after), None, "once");
    }

    /// The test hook's freeze wedges the loop itself: it stops beating at once (the watchdog
    /// then fires), unlike a runtime that does not answer.
    #[cfg(feature = "test-hooks")]
    #[tokio::test(start_paused = true)]
    async fn a_wedged_loop_stops_beating() {
        let r = rig();
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(r.workers.since_heartbeat() <= BEAT);
        r.workers.freeze_housekeeping();
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(r.workers.since_heartbeat() >= Duration::from_secs(59));
        r.cancel.cancel();
    }
}
