//! A terminated pod's volumes: the kubelet's `podVolumesExist` /
//! `getMountedVolumePathListFromDisk` (`kubelet_volumes.go`, `kubelet_getters.go`), which the
//! terminated stage waits on, and, when reaplet is the active agent, the volume manager's
//! teardown of node-local volumes ([`teardown`]). Orphaned pod directories: [`orphan`].
//! mountinfo: [`mountinfo`].
//!
//! Invariants:
//! * only `<root-dir>/pods/<uid>/volumes/<plugin>/<volume>` (CSI: `<volume>/mount`) and
//!   `<root-dir>/pods/<uid>/volume-subpaths` are looked at; the UID is a validated [`PodUid`]
//!   and the rest are directory entry names, so every path stays under the root dir;
//! * a volume directory is mounted when it, or anything below it, is a mount point in
//!   mountinfo; an error while checking counts as "still mounted";
//! * passive (standby, the kubelet alive) this module only reads; active, it unmounts and
//!   removes node-local volumes only, never another plugin's ([`teardown`]);
//! * the wait is bounded ([`Settle::bound`]); what is left after it is named, with its plugin
//!   and why, in [`VolumeError::StillMounted`].

pub mod mountinfo;
pub mod orphan;
pub mod teardown;

pub use mountinfo::{MountInfo, parse_mountinfo, read_mountinfo};
pub use orphan::{
    OrphanDir, Tree, mounts_below, pod_dir, pod_dir_uids, remove_orphan_pod_dir, remove_tree,
};
pub use teardown::{Held, Plugin, SystemUnmount, TeardownState, Unmount, Why, can_tear_down};

use crate::pod::PodUid;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    #[error("pod {uid}: volumes still there after {waited:?}: {}", list(volumes))]
    StillMounted {
        uid: String,
        waited: Duration,
        volumes: Vec<Held>,
    },
}

/// The held volumes, one after another.
pub fn list(held: &[Held]) -> String {
    held.iter()
        .map(Held::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// A volume directory of a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeDir {
    /// `<plugin>/<volume>`, for reports.
    pub name: String,
    /// The directory that is mounted when the volume is set up.
    pub path: PathBuf,
}

/// The pod's volumes directory: `<root_dir>/pods/<uid>/volumes`.
pub fn pod_volumes_dir(root_dir: &Path, uid: &PodUid) -> PathBuf {
    root_dir.join("pods").join(uid.as_str()).join("volumes")
}

/// Lists `<plugin>/<volume>` directories (CSI: `<volume>/mount`). A missing directory means
/// no volumes; other read errors are returned (the caller counts them as "still mounted").
pub fn list_volume_dirs(root_dir: &Path, uid: &PodUid) -> std::io::Result<Vec<VolumeDir>> {
    let base = pod_volumes_dir(root_dir, uid);
    let plugins = match std::fs::read_dir(&base) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for p in plugins {
        let p = p?;
        if !p.file_type()?.is_dir() {
            continue;
        }
        let plugin = p.file_name().to_string_lossy().into_owned();
        for v in std::fs::read_dir(p.path())? {
            let v = v?;
            if !v.file_type()?.is_dir() {
                continue;
            }
            let volume = v.file_name().to_string_lossy().into_owned();
            let mut path = v.path();
            if plugin == "kubernetes.io~csi" {
                path.push("mount");
            }
            out.push(VolumeDir {
                name: format!("{plugin}/{volume}"),
                path,
            });
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// The volumes of `dirs` that are (or have something) mounted, per `mounts`.
pub fn mounted<'a>(dirs: &'a [VolumeDir], mounts: &[MountInfo]) -> Vec<&'a VolumeDir> {
    dirs.iter()
        .filter(|d| mounts.iter().any(|m| m.mount_point.starts_with(&d.path)))
        .collect()
}

/// Checks once: the names of the pod's volumes still mounted. Errors count as mounted.
pub fn still_mounted(root_dir: &Path, uid: &PodUid, mountinfo: &Path) -> Vec<String> {
    let dirs = match list_volume_dirs(root_dir, uid) {
        Ok(d) => d,
        Err(e) => return vec![format!("<cannot list volumes: {e}>")],
    };
    if dirs.is_empty() {
        return Vec::new();
    }
    let mounts = match read_mountinfo(mountinfo) {
        Ok(m) => m,
        Err(e) => return vec![format!("<cannot read {}: {e}>", mountinfo.display())],
    };
    mounted(&dirs, &mounts)
        .into_iter()
        .map(|d| d.name.clone())
        .collect()
}

/// How a terminated pod's volumes are settled.
pub struct Settle<'a> {
    pub root_dir: &'a Path,
    pub uid: &'a PodUid,
    pub mountinfo: &'a Path,
    /// Poll period (kubelet: 100–300 ms).
    pub poll: Duration,
    /// Give up (and report) after this long (kubelet: 2 min 3 s); zero checks once.
    pub bound: Duration,
    /// Whether reaplet is the active agent now (asked before every pass): then node-local
    /// volumes are torn down, else only waited for.
    pub active: &'a (dyn Fn() -> bool + Send + Sync),
    pub unmounter: &'a dyn Unmount,
    pub state: &'a Mutex<TeardownState>,
    /// Called once per path whose unmount failed.
    pub report: &'a (dyn Fn(&Held) + Send + Sync),
}

/// Until no volume of the pod is mounted: tears down node-local volumes while active, waits
/// for the rest, polling every `poll`, for at most `bound`. Logs the set still there when it
/// changes (one line per decision, not per poll).
pub async fn settle(s: Settle<'_>) -> Result<(), VolumeError> {
    let start = Instant::now();
    let mut last: Vec<Held> = Vec::new();
    loop {
        let now = if (s.active)() {
            let mut state = s.state.lock().unwrap_or_else(|e| e.into_inner());
            teardown::pass(
                s.root_dir,
                s.uid,
                s.mountinfo,
                s.unmounter,
                &mut state,
                Instant::now(),
                &mut |h| (s.report)(h),
            )
        } else {
            held_passive(s.root_dir, s.uid, s.mountinfo)
        };
        if now.is_empty() {
            if !last.is_empty() {
                tracing::info!(
                    waitedMs = start.elapsed().as_millis() as u64,
                    "pod volumes unmounted"
                );
            }
            return Ok(());
        }
        if now != last {
            let names: Vec<&str> = now.iter().map(|h| h.volume.as_str()).collect();
            tracing::info!(volumes = ?names, detail = %list(&now),
                "waiting for pod volumes to be unmounted");
            last = now;
        }
        if start.elapsed() >= s.bound {
            return Err(VolumeError::StillMounted {
                uid: s.uid.to_string(),
                waited: start.elapsed(),
                volumes: last,
            });
        }
        tokio::time::sleep(s.poll).await;
    }
}

/// The volumes still mounted, each with its plugin ([`Why::Mounted`]); errors count as mounted.
fn held_passive(root_dir: &Path, uid: &PodUid, mountinfo: &Path) -> Vec<Held> {
    still_mounted(root_dir, uid, mountinfo)
        .into_iter()
        .map(|volume| Held {
            plugin: Plugin::from_dir(volume.split('/').next().unwrap_or_default())
                .name()
                .to_owned(),
            volume,
            why: Why::Mounted,
        })
        .collect()
}

#[cfg(test)]
mod tests;
