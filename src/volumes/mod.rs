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
use std::sync::{Arc, Mutex};
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

/// The root dir as mountinfo may show paths below it: as configured and through its canonical
/// path (mountinfo has resolved paths). Resolved once; nothing below the root dir is touched
/// (a stat inside a dead NFS mount would hang).
#[derive(Debug, Clone)]
pub struct RootDir {
    given: PathBuf,
    canonical: Option<PathBuf>,
}

impl RootDir {
    pub fn new(given: &Path) -> Self {
        RootDir {
            given: given.to_owned(),
            canonical: std::fs::canonicalize(given).ok().filter(|c| c != given),
        }
    }

    /// `mount_point` relative to `dir` (a path below the root dir), when at or below it: a
    /// comparison of path components only.
    pub fn rel<'m>(&self, mount_point: &'m Path, dir: &Path) -> Option<&'m Path> {
        if let Ok(r) = mount_point.strip_prefix(dir) {
            return Some(r);
        }
        let tail = dir.strip_prefix(&self.given).ok()?;
        mount_point
            .strip_prefix(self.canonical.as_ref()?.join(tail))
            .ok()
    }

    /// Every mount point at or below `dir`, relative to it, one per mountinfo line (a path
    /// mounted twice is listed twice).
    pub fn mounts_under<'m>(&self, dir: &Path, mounts: &'m [MountInfo]) -> Vec<&'m Path> {
        mounts
            .iter()
            .filter_map(|m| self.rel(&m.mount_point, dir))
            .collect()
    }
}

/// The volumes of `dirs` that are (or have something) mounted, per `mounts`.
pub fn mounted<'a>(
    root: &RootDir,
    dirs: &'a [VolumeDir],
    mounts: &[MountInfo],
) -> Vec<&'a VolumeDir> {
    dirs.iter()
        .filter(|d| !root.mounts_under(&d.path, mounts).is_empty())
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
    mounted(&RootDir::new(root_dir), &dirs, &mounts)
        .into_iter()
        .map(|d| d.name.clone())
        .collect()
}

/// How a terminated pod's volumes are settled. Owned, so each check runs on a blocking
/// thread.
#[derive(Clone)]
pub struct Settle {
    pub root_dir: PathBuf,
    pub uid: PodUid,
    pub mountinfo: PathBuf,
    /// Poll period (kubelet: 100–300 ms).
    pub poll: Duration,
    /// Give up (and report) after this long (kubelet: 2 min 3 s); zero checks once.
    pub bound: Duration,
    /// Whether reaplet is the active agent now (asked before every pass, and within it before
    /// every unmount and removal): then node-local volumes are torn down, else only waited for.
    pub active: Arc<dyn Fn() -> bool + Send + Sync>,
    pub unmounter: Arc<dyn Unmount>,
    /// The pod's teardown memory (backoffs, what was last logged), kept across settles.
    pub state: Arc<Mutex<TeardownState>>,
    /// Called once per path whose unmount or removal failed.
    pub report: Arc<dyn Fn(&Held) + Send + Sync>,
}

impl Settle {
    /// One check on a blocking thread (file system calls may block: a stat inside a dead NFS
    /// mount never returns). A check still running from before is not doubled: the state is
    /// busy, and that is what this one reports.
    fn check(&self) -> tokio::task::JoinHandle<Vec<Held>> {
        let s = self.clone();
        tokio::task::spawn_blocking(move || {
            let Ok(mut state) = s.state.try_lock() else {
                return vec![busy(&s.root_dir, &s.uid)];
            };
            if (s.active)() {
                let active = || (s.active)();
                teardown::pass(
                    &s.root_dir,
                    &s.uid,
                    &s.mountinfo,
                    &*s.unmounter,
                    &mut state,
                    Instant::now(),
                    &active,
                    &mut |h| (s.report)(h),
                )
            } else {
                held_passive(&s.root_dir, &s.uid, &s.mountinfo)
            }
        })
    }
}

/// A check that has not returned (a file system call blocked in the kernel).
fn busy(root_dir: &Path, uid: &PodUid) -> Held {
    Held {
        volume: String::new(),
        plugin: String::new(),
        why: Why::Io {
            path: pod_dir(root_dir, uid),
            error: "a volume check has not returned (a file system call is blocked)".into(),
        },
    }
}

/// Until no volume of the pod is mounted: tears down node-local volumes while active, waits
/// for the rest, polling every `poll`, for at most `bound`. Logs the set still there when it
/// changes, across settles too (one line per decision, not per poll or retry).
pub async fn settle(s: Settle) -> Result<(), VolumeError> {
    let start = Instant::now();
    let deadline = start + s.bound;
    loop {
        let mut job = s.check();
        let now =
            match tokio::time::timeout_at(deadline.max(Instant::now() + s.poll), &mut job).await {
                Ok(Ok(held)) => held,
                Ok(Err(e)) => vec![Held {
                    volume: String::new(),
                    plugin: String::new(),
                    why: Why::Io {
                        path: pod_dir(&s.root_dir, &s.uid),
                        error: format!("volume check failed: {e}"),
                    },
                }],
                // hung: report; the thread finishes (or not) on its own
                Err(_) => vec![busy(&s.root_dir, &s.uid)],
            };
        let changed = {
            let mut st = s.state.lock().unwrap_or_else(|e| e.into_inner());
            let changed = st.last != now;
            if changed {
                st.last = now.clone();
            }
            changed
        };
        if now.is_empty() {
            if changed {
                tracing::info!(
                    waitedMs = start.elapsed().as_millis() as u64,
                    "pod volumes unmounted"
                );
            }
            return Ok(());
        }
        if changed {
            let names: Vec<&str> = now.iter().map(|h| h.volume.as_str()).collect();
            tracing::info!(volumes = ?names, detail = %list(&now),
                "waiting for pod volumes to be unmounted");
        }
        if Instant::now() >= deadline {
            return Err(VolumeError::StillMounted {
                uid: s.uid.to_string(),
                waited: start.elapsed(),
                volumes: now,
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
