//! Finishing the kubelet's teardown of a terminated pod's node-local volumes, when reaplet is the
//! active agent (the kubelet is dead, or reaplet is the node's only agent): the volume manager's
//! unmount of `emptyDir` (`empty_dir.go` `TearDownAt`) and of the plugins built on it
//! (`secret`, `configMap`, `projected`, `downwardAPI`: `UnmountViaEmptyDir`), and
//! `CleanSubPaths` (`volume/util/subpath`) for the pod's subPath bind mounts.
//!
//! Invariants:
//! * only those five plugins are unmounted and removed. Every other one (CSI, NFS, local, iSCSI,
//!   Fibre Channel, ...) is never touched, mounted or not: its unmount or detach needs its
//!   driver or the attach/detach controller. A mounted one is reported ([`Why::NotNodeLocal`])
//!   and the pod waits for it;
//! * subPath bind mounts under `pods/<uid>/volume-subpaths` are unmounted whatever the plugin
//!   (they are the kubelet's own bind mounts of a path inside the volume, not the volume);
//! * every path is the root dir joined with the validated UID and directory entry names; every
//!   component below the root dir is checked with `lstat` to be a real directory (the last one
//!   of a subPath may be a file) before anything is unmounted or removed, a symlink anywhere
//!   stops it ([`Why::Unsafe`]), and the unmount itself never follows a symlink
//!   (`UMOUNT_NOFOLLOW`). What is unmounted is what mountinfo lists below that checked path;
//! * a directory is removed only after mountinfo shows nothing mounted below it, on its own
//!   filesystem only, symlinks unlinked and never followed ([`super::remove_tree`]);
//! * idempotent: EINVAL (no longer a mount point) and ENOENT mean done, so a kubelet that comes
//!   back and tears down the same volume meets no error, nor does reaplet after it. A failed
//!   unmount is retried with backoff (1 s doubling to 30 s) and reported once per path.
//!
//! Left out: the kubelet's `.deleting~` rename before removing an emptyDir, and block volumes
//! (`volumeDevices/`), which are never node-local.

use super::{MountInfo, list_volume_dirs, mounts_below, orphan, pod_dir, read_mountinfo};
use crate::pod::PodUid;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::time::Instant;

/// A volume plugin, from its directory name under `volumes/` (`kubernetes.io~secret`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plugin {
    EmptyDir,
    Secret,
    ConfigMap,
    Projected,
    DownwardApi,
    /// Anything else (the plugin's name, `~` turned back into `/`): never touched.
    Other(String),
}

impl Plugin {
    pub fn from_dir(name: &str) -> Self {
        match name {
            "kubernetes.io~empty-dir" => Self::EmptyDir,
            "kubernetes.io~secret" => Self::Secret,
            "kubernetes.io~configmap" => Self::ConfigMap,
            "kubernetes.io~projected" => Self::Projected,
            "kubernetes.io~downward-api" => Self::DownwardApi,
            other => Self::Other(other.replace('~', "/")),
        }
    }

    /// The plugin's name (`kubernetes.io/secret`).
    pub fn name(&self) -> &str {
        match self {
            Self::EmptyDir => "kubernetes.io/empty-dir",
            Self::Secret => "kubernetes.io/secret",
            Self::ConfigMap => "kubernetes.io/configmap",
            Self::Projected => "kubernetes.io/projected",
            Self::DownwardApi => "kubernetes.io/downward-api",
            Self::Other(name) => name,
        }
    }

    /// Whether reaplet may unmount and remove it: its data lives on this node only.
    pub fn node_local(&self) -> bool {
        !matches!(self, Self::Other(_))
    }
}

/// Why a volume is still there after a pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Why {
    /// Mounted, and reaplet is not the active agent: the kubelet tears it down.
    Mounted,
    /// Mounted, and not node-local: left to its driver and the attach/detach controller.
    NotNodeLocal,
    /// An unmount failed (`errno`), retried with backoff.
    UnmountFailed { path: PathBuf, errno: i32 },
    /// A symlink or a non-directory where a directory must be: never followed or unmounted.
    Unsafe { path: PathBuf },
    /// Reading the directory or mountinfo, or removing, failed.
    Io { path: PathBuf, error: String },
}

/// A volume still present after a pass, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// `<plugin dir>/<volume>` (`kubernetes.io~csi/pvc-1`), or `volume-subpaths`.
    pub volume: String,
    /// The plugin's name (`kubernetes.io/csi`); empty for subPaths and whole-pod problems.
    pub plugin: String,
    pub why: Why,
}

impl std::fmt::Display for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let plugin = if self.plugin.is_empty() {
            String::new()
        } else {
            format!(" ({})", self.plugin)
        };
        match &self.why {
            Why::Mounted => write!(f, "{}{plugin}: mounted", self.volume),
            Why::NotNodeLocal => write!(
                f,
                "{}{plugin}: not a node-local volume, left to its driver",
                self.volume
            ),
            Why::UnmountFailed { path, errno } => write!(
                f,
                "{}{plugin}: unmounting {} failed: {}",
                self.volume,
                path.display(),
                std::io::Error::from_raw_os_error(*errno)
            ),
            Why::Unsafe { path } => write!(
                f,
                "{}{plugin}: {} is not a plain directory; not followed",
                self.volume,
                path.display()
            ),
            Why::Io { path, error } => {
                write!(f, "{}{plugin}: {}: {error}", self.volume, path.display())
            }
        }
    }
}

/// Unmounts one path. Production: `umount2(path, UMOUNT_NOFOLLOW)`; tests may fake it.
pub trait Unmount: Send + Sync {
    fn unmount(&self, path: &Path) -> Result<(), rustix::io::Errno>;
}

/// The kernel's unmount, never following a symlink at the target.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemUnmount;

impl Unmount for SystemUnmount {
    fn unmount(&self, path: &Path) -> Result<(), rustix::io::Errno> {
        rustix::mount::unmount(path, rustix::mount::UnmountFlags::NOFOLLOW)
    }
}

const RETRY_BASE: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(30);

#[derive(Debug)]
struct Failure {
    count: u32,
    next: Instant,
    errno: i32,
}

/// What a pod's teardown remembers between passes: failed unmounts (their backoff; each is
/// reported once).
#[derive(Debug, Default)]
pub struct TeardownState {
    failures: HashMap<PathBuf, Failure>,
}

/// One pass over a pod's volumes: unmounts and removes what may be, returns what is left.
/// `report` is called once per path whose unmount failed (the first failure).
pub fn pass(
    root_dir: &Path,
    uid: &PodUid,
    mountinfo: &Path,
    unmounter: &dyn Unmount,
    state: &mut TeardownState,
    now: Instant,
    report: &mut dyn FnMut(&Held),
) -> Vec<Held> {
    let dir = pod_dir(root_dir, uid);
    // the pod's own directories below the root dir: real directories or nothing
    for p in [root_dir.join("pods"), dir.clone(), dir.join("volumes")] {
        match std::fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_dir() => {}
            Ok(_) => {
                return vec![Held {
                    volume: String::new(),
                    plugin: String::new(),
                    why: Why::Unsafe { path: p },
                }];
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
            Err(e) => return vec![io_held("", "", &p, &e)],
        }
    }
    let mut mounts = match read_mountinfo(mountinfo) {
        Ok(m) => m,
        Err(e) => return vec![io_held("", "", mountinfo, &e)],
    };
    let mut t = Pass {
        mountinfo,
        unmounter,
        state,
        now,
        report,
        unmounted: false,
    };
    let mut held = Vec::new();
    // subPaths first, as the kubelet's CleanSubPaths: they hold the volume busy
    let subpaths = dir.join("volume-subpaths");
    match std::fs::symlink_metadata(&subpaths) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => held.push(io_held("volume-subpaths", "", &subpaths, &e)),
        Ok(m) if !m.file_type().is_dir() => held.push(Held {
            volume: "volume-subpaths".into(),
            plugin: String::new(),
            why: Why::Unsafe {
                path: subpaths.clone(),
            },
        }),
        Ok(_) => {
            if let Some(h) = t.clear("volume-subpaths", "", &subpaths, &mut mounts, true) {
                held.push(h);
            }
        }
    }
    let dirs = match list_volume_dirs(root_dir, uid) {
        Ok(d) => d,
        Err(e) => {
            held.push(io_held("", "", &dir.join("volumes"), &e));
            return held;
        }
    };
    for v in dirs {
        let plugin_dir = v.name.split('/').next().unwrap_or_default();
        let plugin = Plugin::from_dir(plugin_dir);
        if !plugin.node_local() {
            if !mounts_below(&v.path, &mounts).is_empty() {
                held.push(Held {
                    volume: v.name.clone(),
                    plugin: plugin.name().to_owned(),
                    why: Why::NotNodeLocal,
                });
            }
            continue;
        }
        if let Some(h) = t.clear(&v.name, plugin.name(), &v.path, &mut mounts, false) {
            held.push(h);
        }
    }
    held
}

fn io_held(volume: &str, plugin: &str, path: &Path, e: &std::io::Error) -> Held {
    Held {
        volume: volume.to_owned(),
        plugin: plugin.to_owned(),
        why: Why::Io {
            path: path.to_owned(),
            error: e.to_string(),
        },
    }
}

struct Pass<'a> {
    mountinfo: &'a Path,
    unmounter: &'a dyn Unmount,
    state: &'a mut TeardownState,
    now: Instant,
    report: &'a mut dyn FnMut(&Held),
    /// An unmount succeeded in this pass: mountinfo must be read again before removing.
    unmounted: bool,
}

impl Pass<'_> {
    /// Unmounts everything mounted below `dir` (deepest first), then removes `dir` once
    /// mountinfo shows nothing below it. `files_at_leaves`: a subPath's mount point may be a
    /// file. Returns why it is still there, if it is.
    fn clear(
        &mut self,
        volume: &str,
        plugin: &str,
        dir: &Path,
        mounts: &mut Vec<MountInfo>,
        files_at_leaves: bool,
    ) -> Option<Held> {
        let held = |why| Held {
            volume: volume.to_owned(),
            plugin: plugin.to_owned(),
            why,
        };
        let mut below = mounts_below(dir, mounts);
        // deepest first; a mount stacked twice on one path is listed (and unmounted) twice
        below.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        let mut waiting = None;
        for rel in &below {
            let target = dir.join(rel);
            if let Some(unsafe_path) = first_unsafe(dir, rel, files_at_leaves) {
                return Some(held(Why::Unsafe { path: unsafe_path }));
            }
            if let Some(f) = self.state.failures.get(&target)
                && f.next > self.now
            {
                waiting.get_or_insert(Why::UnmountFailed {
                    path: target.clone(),
                    errno: f.errno,
                });
                continue;
            }
            match self.unmounter.unmount(&target) {
                Ok(()) => {
                    self.unmounted = true;
                    self.state.failures.remove(&target);
                }
                // no longer a mount point, or gone: done
                Err(e) if e == rustix::io::Errno::INVAL || e == rustix::io::Errno::NOENT => {
                    self.state.failures.remove(&target);
                }
                Err(e) => {
                    let errno = e.raw_os_error();
                    let f = self
                        .state
                        .failures
                        .entry(target.clone())
                        .or_insert(Failure {
                            count: 0,
                            next: self.now,
                            errno,
                        });
                    f.count += 1;
                    f.errno = errno;
                    let exp = f.count.saturating_sub(1).min(16);
                    f.next = self.now + RETRY_BASE.saturating_mul(1 << exp).min(RETRY_MAX);
                    let why = Why::UnmountFailed {
                        path: target.clone(),
                        errno,
                    };
                    if f.count == 1 {
                        (self.report)(&held(why.clone()));
                    }
                    waiting.get_or_insert(why);
                }
            }
        }
        if let Some(why) = waiting {
            return Some(held(why));
        }
        if self.unmounted {
            self.unmounted = false;
            match read_mountinfo(self.mountinfo) {
                Ok(m) => *mounts = m,
                Err(e) => return Some(io_held(volume, plugin, dir, &e)),
            }
        }
        self.remove(volume, plugin, dir, mounts)
    }

    fn remove(&self, volume: &str, plugin: &str, dir: &Path, mounts: &[MountInfo]) -> Option<Held> {
        let held = |why| Held {
            volume: volume.to_owned(),
            plugin: plugin.to_owned(),
            why,
        };
        if let Some(rel) = mounts_below(dir, mounts).into_iter().next() {
            // still mounted after the unmounts (a mount stacked again): the next pass
            return Some(held(Why::UnmountFailed {
                path: dir.join(rel),
                errno: rustix::io::Errno::BUSY.raw_os_error(),
            }));
        }
        match orphan::remove_tree(dir, None) {
            Ok(orphan::Tree::Removed) | Ok(orphan::Tree::NotADirectory) => None,
            Ok(orphan::Tree::OtherDevice(rel)) | Ok(orphan::Tree::Data(rel)) => {
                Some(held(Why::UnmountFailed {
                    path: dir.join(rel),
                    errno: rustix::io::Errno::BUSY.raw_os_error(),
                }))
            }
            Err(e) => Some(io_held(volume, plugin, dir, &e)),
        }
    }
}

/// The first path from `dir` down to `dir/rel` that is not a real directory (a symlink, or a
/// file where a directory must be; with `file_leaf` the last one may be a regular file), if any.
/// A component that is gone is no danger: the unmount then answers ENOENT.
fn first_unsafe(dir: &Path, rel: &Path, file_leaf: bool) -> Option<PathBuf> {
    let mut p = dir.to_path_buf();
    let n = rel.components().count();
    let check = |p: &Path, leaf: bool| match std::fs::symlink_metadata(p) {
        Ok(m) if m.file_type().is_dir() => true,
        Ok(m) => leaf && file_leaf && m.file_type().is_file(),
        Err(_) => true,
    };
    if !check(&p, n == 0) {
        return Some(p);
    }
    for (i, c) in rel.components().enumerate() {
        match c {
            std::path::Component::Normal(c) => p.push(c),
            _ => return Some(dir.join(rel)),
        }
        if !check(&p, i + 1 == n) {
            return Some(p);
        }
    }
    None
}

/// Whether this process can tear volumes down for the host: it must be in the host's mount
/// namespace (an unmount in a namespace of its own never reaches the host's) and hold
/// `CAP_SYS_ADMIN`. Read from `proc` (`/proc`; a fixture in tests): the root mount of
/// `self/mountinfo` is a slave (`master:N`) in a namespace a service manager linked back to the
/// host (systemd's `ProtectSystem=`, `PrivateTmp=`, ...), and `CapEff` of `self/status` has bit
/// 21. `Err` says why not.
pub fn can_tear_down(proc: &Path) -> Result<(), String> {
    use procfs::process::MountOptFields;
    let mi = proc.join("self/mountinfo");
    let mounts = read_mountinfo(&mi).map_err(|e| format!("{}: {e}", mi.display()))?;
    let root = mounts
        .iter()
        .rev()
        .find(|m| m.mount_point == Path::new("/"))
        .ok_or_else(|| format!("{}: no root mount", mi.display()))?;
    if root
        .opt_fields
        .iter()
        .any(|f| matches!(f, MountOptFields::Master(_)))
    {
        return Err(
            "in a mount namespace of its own (the root mount is a slave of the host's): an \
             unmount here would not reach the host"
                .into(),
        );
    }
    let st = proc.join("self/status");
    let text = std::fs::read_to_string(&st).map_err(|e| format!("{}: {e}", st.display()))?;
    let eff = text
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .ok_or_else(|| format!("{}: no CapEff", st.display()))?;
    const CAP_SYS_ADMIN: u32 = 21;
    if eff & (1 << CAP_SYS_ADMIN) == 0 {
        return Err("no CAP_SYS_ADMIN (umount2 needs it)".into());
    }
    Ok(())
}
