//! Housekeeping: the runtime relist (the PLEG's relist) and the parts of the kubelet's
//! `HandlePodCleanups` (`kubelet_pods.go`) that act on what it finds: orphaned runtime pods,
//! pods whose containers all exited (natural completion), the sandboxes of finished orphans,
//! and workers that are done.
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
    /// Housekeeping: relists the runtime (on container events when the runtime has them,
    /// else every `relist_period`), finds orphans and naturally completed pods, and forgets
    /// finished workers. Runs until cancelled.
    pub async fn run_housekeeping(self) {
        let cancel = self.inner.cancel.clone();
        let mut relist_failing = false;
        let mut sweeps = Sweeps::default();
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
            #[cfg(feature = "test-hooks")]
            let frozen = self.inner.frozen.notified();
            #[cfg(not(feature = "test-hooks"))]
            let frozen = std::future::pending::<()>();
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = frozen => {
                    tracing::warn!("test hook: housekeeping frozen");
                    cancel.cancelled().await;
                    return;
                }
                _ = tokio::time::sleep(period) => {}
                _ = self.inner.relist_now.notified() => {}
                ev = recv_opt(&mut events) => {
                    if ev.is_none() {
                        tracing::warn!("runtime container event stream ended; polling");
                        events = None;
                    }
                }
            }
            match self.relist_sweeping(&mut sweeps).await {
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
            let beat = self.inner.started.elapsed().as_millis() as u64;
            self.inner
                .heartbeat
                .store(beat, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// One housekeeping pass. Public so callers can force one. A forced pass does not remove
    /// node leftovers (orphaned pod cgroups and dirs): that takes the housekeeping loop's
    /// confirmation over two passes.
    pub async fn relist(&self) -> Result<(), CriError> {
        self.relist_sweeping(&mut Sweeps::default()).await
    }

    async fn relist_sweeping(&self, sweeps: &mut Sweeps) -> Result<(), CriError> {
        let rt = &self.inner.runtime;
        let sandboxes = rt.list_sandboxes(None).await?;
        let containers = rt.list_containers(None).await?;
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
        let rt = &self.inner.runtime;
        let fresh = match (
            rt.list_sandboxes(None).await,
            rt.list_containers(None).await,
        ) {
            (Ok(sbs), Ok(cs)) => pod::group_runtime(&sbs, &cs)
                .pods
                .keys()
                .cloned()
                .collect::<HashSet<PodUid>>(),
            (Err(e), _) | (_, Err(e)) => {
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
