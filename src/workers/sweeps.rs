//! The node's leftovers: the kubelet's `cleanupOrphanedPodCgroups` (`kubelet_pods.go`) and
//! `cleanupOrphanedPodDirs` (`kubelet_volumes.go`), which the housekeeping loop
//! ([`super::housekeeping`]) runs after each relist, once the runtime's own pods are dealt
//! with. [`Sweeps`] is what they remember from pass to pass.
//!
//! Invariants:
//! * a pod cgroup (every hierarchy, QoS class and driver; with the systemd driver its slice
//!   unit too) or a `<root-dir>/pods/<uid>` directory whose UID is neither desired, nor has an
//!   unfinished worker, nor has anything in the runtime is an orphan; it is a candidate only
//!   once untouched for `orphan_min_age` (a pod the kubelet is still starting has both before
//!   its sandbox);
//! * it is acted on only once every source has synced, only while this agent is active (not
//!   in standby: the sweeps kill and delete), and only when it was an orphan in two passes
//!   at least [`ORPHAN_CONFIRM`] apart, the second judged against a fresh runtime list (a pod
//!   being created has its cgroup before the runtime lists its sandbox); a forced pass
//!   ([`PodWorkers::relist`]) confirms nothing, so it never removes one;
//! * its processes are killed and its cgroup removed, unless a volume of the pod is still
//!   mounted (the kubelet keeps it then, so memory-backed volumes stay charged to it); its
//!   directory is removed unless anything below it is a mount point or may hold volume data,
//!   never following a symlink;
//! * each decision is logged once, never once per pass.

use super::PodWorkers;
use super::runtime_health::relist_deadline;
use crate::cri::Runtime;
use crate::lifecycle::PodPhase;
use crate::pod::{self, PodUid};
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

impl<R: Runtime> PodWorkers<R> {
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
    pub(super) async fn sweep_leftovers(&self, sweeps: &mut Sweeps, runtime: &HashSet<PodUid>) {
        // the sweeps kill and delete: held like every kill by the authority (standby)
        if !self.inner.authority.is_active() {
            return;
        }
        // nor while the node name is known to be wrong: the leftovers may be another node's
        if self.has_identity_problem() {
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
