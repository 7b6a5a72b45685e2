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
//! * only the kubelet's own mount points are unmounted: a node-local volume's directory itself,
//!   and `volume-subpaths/<volume>/<container>/<index>` (subPath bind mounts, whatever the
//!   plugin: they are the kubelet's bind mounts of a path inside the volume). Anything mounted
//!   below one of them is never unmounted and holds the pod ([`Why::Nested`]): a subPath of a
//!   shared source (a hostPath, a CSI volume with submounts) is in the source's peer group, and
//!   unmounting a mount that propagated into it would unmount it in the source too;
//! * a volume with a subPath still mounted is not torn down (as the kubelet's `CleanSubPaths`
//!   failing stops the volume's teardown);
//! * every path is the root dir joined with the validated UID and directory entry names; every
//!   component below the root dir is checked with `lstat` to be a real directory (a subPath's
//!   last one may be a file) before it is unmounted, a symlink anywhere stops it
//!   ([`Why::Unsafe`]), and the unmount itself never follows a symlink (`UMOUNT_NOFOLLOW`, on the
//!   path itself: never with a trailing slash, which makes the kernel follow one). Mount points
//!   are matched to those paths by components only ([`super::RootDir`]): nothing is stat'ed
//!   inside a mount (a dead NFS server would hang it);
//! * a directory is removed only after mountinfo shows nothing mounted below it, read again
//!   when this pass unmounted anything since it was last read (an unmount may uncover a mount
//!   stacked below; a pass that unmounts nothing reads mountinfo once, not once per volume:
//!   it grows with every pod on the node), and only on its own mount: every entry's `statx` mount ID is compared with the
//!   directory's, so a bind mount no snapshot showed is never entered ([`super::remove_tree`]);
//!   below `volume-subpaths` only directories and empty files go (the kubelet's placeholders);
//! * the authority is asked again before every unmount and removal: a hand-back mid-pass stops
//!   it there;
//! * idempotent: EINVAL (no longer a mount point) and ENOENT mean done, so a kubelet that comes
//!   back and tears down the same volume meets no error, nor does reaplet after it. A failed
//!   unmount or removal is retried with backoff (1 s doubling to 30 s) and reported once per
//!   path.
//!
//! Left out: the kubelet's `.deleting~` rename before removing an emptyDir, and block volumes
//! (`volumeDevices/`), which are never node-local.

use super::orphan::{self, Removal};
use super::{MountInfo, RootDir, list_volume_dirs, pod_dir, read_mountinfo};
use crate::pod::PodUid;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
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
    /// Something is mounted below one of the kubelet's mount points: never unmounted.
    Nested { path: PathBuf },
    /// A subPath of this volume is still mounted: the volume waits for it.
    SubPathMounted,
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
            Why::Nested { path } => write!(
                f,
                "{}{plugin}: {} is mounted below the kubelet's mount point; never unmounted",
                self.volume,
                path.display()
            ),
            Why::SubPathMounted => write!(
                f,
                "{}{plugin}: a subPath of it is still mounted",
                self.volume
            ),
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

/// A failed unmount is retried on the agent's one backoff: 1 s doubling to 30 s.
const RETRY: crate::backoff::Policy = crate::backoff::Policy::RUNTIME;

#[derive(Debug)]
struct Failure {
    count: u32,
    next: Instant,
    why: Why,
}

/// What a pod's teardown remembers between passes: failed unmounts and removals (their backoff;
/// each is reported once), and the set last logged.
#[derive(Debug, Default)]
pub struct TeardownState {
    failures: HashMap<PathBuf, Failure>,
    /// What the last check found still there (logged when it changes, not per check).
    pub last: Vec<Held>,
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

/// One pass over a pod's volumes: unmounts and removes what may be, returns what is left.
/// `active` is asked before every unmount and removal (a hand-back stops the pass there);
/// `report` is called once per path whose unmount or removal failed (the first failure).
#[allow(clippy::too_many_arguments)]
pub fn pass(
    root_dir: &Path,
    uid: &PodUid,
    mountinfo: &Path,
    unmounter: &dyn Unmount,
    state: &mut TeardownState,
    now: Instant,
    active: &dyn Fn() -> bool,
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
    let subpaths = dir.join("volume-subpaths");
    let subpaths_meta = match std::fs::symlink_metadata(&subpaths) {
        Ok(m) => Some(m),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return vec![io_held("volume-subpaths", "", &subpaths, &e)],
    };
    let dirs = match list_volume_dirs(root_dir, uid) {
        Ok(d) => d,
        Err(e) => return vec![io_held("", "", &dir.join("volumes"), &e)],
    };
    if dirs.is_empty() && subpaths_meta.is_none() {
        return Vec::new();
    }
    let mounts = match read_mountinfo(mountinfo) {
        Ok(m) => m,
        Err(e) => return vec![io_held("", "", mountinfo, &e)],
    };
    let mut t = Pass {
        root: RootDir::new(root_dir),
        mountinfo,
        mounts,
        stale: false,
        unmounter,
        state,
        now,
        active,
        report,
    };
    let mut held = Vec::new();
    // subPaths first, as the kubelet's CleanSubPaths: they hold their volume
    let mut busy_volumes = BTreeSet::new();
    match subpaths_meta {
        None => {}
        Some(m) if !m.file_type().is_dir() => held.push(Held {
            volume: "volume-subpaths".into(),
            plugin: String::new(),
            why: Why::Unsafe {
                path: subpaths.clone(),
            },
        }),
        Some(_) => {
            for h in t.clear_subpaths(&subpaths) {
                busy_volumes.insert(h.volume.clone());
                held.push(h);
            }
        }
    }
    for v in dirs {
        let (plugin_dir, volume) = v.name.split_once('/').unwrap_or((&v.name, ""));
        let plugin = Plugin::from_dir(plugin_dir);
        let hold = |why| Held {
            volume: v.name.clone(),
            plugin: plugin.name().to_owned(),
            why,
        };
        if !plugin.node_local() {
            if !t.root.mounts_under(&v.path, &t.mounts).is_empty() {
                held.push(hold(Why::NotNodeLocal));
            }
            continue;
        }
        if busy_volumes.contains(&format!("volume-subpaths/{volume}")) {
            held.push(hold(Why::SubPathMounted));
            continue;
        }
        if let Some(why) = t.clear_volume(&v.path) {
            held.push(hold(why));
        }
    }
    held
}

struct Pass<'a> {
    root: RootDir,
    mountinfo: &'a Path,
    mounts: Vec<MountInfo>,
    /// `mounts` predates an unmount of this pass.
    stale: bool,
    unmounter: &'a dyn Unmount,
    state: &'a mut TeardownState,
    now: Instant,
    active: &'a dyn Fn() -> bool,
    report: &'a mut dyn FnMut(&Held),
}

impl Pass<'_> {
    /// Still backing off from a failure at `key`: why.
    fn backing_off(&self, key: &Path) -> Option<Why> {
        self.state
            .failures
            .get(key)
            .filter(|f| f.next > self.now)
            .map(|f| f.why.clone())
    }

    /// Records a failure at `key` (backoff; reported the first time).
    fn failed(&mut self, key: &Path, held: Held) -> Why {
        let f = self
            .state
            .failures
            .entry(key.to_owned())
            .or_insert(Failure {
                count: 0,
                next: self.now,
                why: held.why.clone(),
            });
        f.count += 1;
        f.why = held.why.clone();
        f.next = self.now + RETRY.step(f.count);
        if f.count == 1 {
            (self.report)(&held);
        }
        held.why
    }

    /// Reads mountinfo again if this pass unmounted anything since it was read.
    fn reread(&mut self) -> Result<(), std::io::Error> {
        if self.stale {
            self.mounts = read_mountinfo(self.mountinfo)?;
            self.stale = false;
        }
        Ok(())
    }

    /// Unmounts `target` as many times as mountinfo lists it (a path mounted twice is two
    /// lines). `None` when done; else why not.
    fn unmount(
        &mut self,
        volume: &str,
        target: &Path,
        times: usize,
        file_leaf: bool,
    ) -> Option<Why> {
        if let Some(why) = self.backing_off(target) {
            return Some(why);
        }
        if !(self.active)() {
            return Some(Why::Mounted);
        }
        if let Some(path) = first_unsafe(target, file_leaf) {
            return Some(Why::Unsafe { path });
        }
        for _ in 0..times {
            self.stale = true;
            match self.unmounter.unmount(target) {
                Ok(()) => {}
                // no longer a mount point, or gone: done
                Err(e) if e == rustix::io::Errno::INVAL || e == rustix::io::Errno::NOENT => break,
                Err(e) => {
                    let why = Why::UnmountFailed {
                        path: target.to_owned(),
                        errno: e.raw_os_error(),
                    };
                    let held = Held {
                        volume: volume.to_owned(),
                        plugin: String::new(),
                        why,
                    };
                    return Some(self.failed(target, held));
                }
            }
        }
        self.state.failures.remove(target);
        None
    }

    /// Removes `dir` once mountinfo (read again) shows nothing below it. `None` when done.
    fn remove(&mut self, volume: &str, dir: &Path, policy: Removal<'_>) -> Option<Why> {
        if let Some(why) = self.backing_off(dir) {
            return Some(why);
        }
        if let Err(e) = self.reread() {
            return Some(io_held(volume, "", self.mountinfo, &e).why);
        }
        if let Some(rel) = self.root.mounts_under(dir, &self.mounts).first() {
            // mounted again since (or stacked deeper than listed): the next pass
            return Some(Why::Nested {
                path: dir.join(rel),
            });
        }
        if !(self.active)() {
            return Some(Why::Mounted);
        }
        let held = |why| Held {
            volume: volume.to_owned(),
            plugin: String::new(),
            why,
        };
        match orphan::remove_tree(dir, policy) {
            Ok(orphan::Tree::Removed) | Ok(orphan::Tree::NotADirectory) => {
                self.state.failures.remove(dir);
                None
            }
            Ok(orphan::Tree::OtherDevice(rel)) => Some(self.failed(
                dir,
                held(Why::Nested {
                    path: dir.join(rel),
                }),
            )),
            Ok(orphan::Tree::Data(rel)) => Some(self.failed(
                dir,
                held(Why::Unsafe {
                    path: dir.join(rel),
                }),
            )),
            Err(e) => Some(self.failed(dir, io_held(volume, "", dir, &e))),
        }
    }

    /// A node-local volume: unmounts its directory (only that mount point), then removes it.
    fn clear_volume(&mut self, dir: &Path) -> Option<Why> {
        let under = self.root.mounts_under(dir, &self.mounts);
        let at = under.iter().filter(|r| r.as_os_str().is_empty()).count();
        if let Some(nested) = under.iter().find(|r| !r.as_os_str().is_empty()) {
            // mounted below the volume's own mount point: never ours to unmount
            return Some(Why::Nested {
                path: dir.join(nested),
            });
        }
        let volume = dir.display().to_string();
        if at > 0
            && let Some(why) = self.unmount(&volume, dir, at, false)
        {
            return Some(why);
        }
        self.remove(&volume, dir, Removal::Everything)
    }

    /// The subPath bind mounts (`<volume>/<container>/<index>`, and only those), then the
    /// tree. Returns what is held, each named `volume-subpaths/<volume>`.
    fn clear_subpaths(&mut self, base: &Path) -> Vec<Held> {
        let mut targets: BTreeMap<PathBuf, usize> = BTreeMap::new();
        let mut held: BTreeMap<String, Why> = BTreeMap::new();
        let name = |rel: &Path| {
            let v = rel
                .components()
                .next()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .unwrap_or_default();
            format!("volume-subpaths/{v}")
        };
        for rel in self.root.mounts_under(base, &self.mounts) {
            if rel.components().count() == 3
                && rel
                    .components()
                    .all(|c| matches!(c, std::path::Component::Normal(_)))
            {
                *targets.entry(rel.to_owned()).or_default() += 1;
            } else {
                held.entry(name(rel)).or_insert(Why::Nested {
                    path: base.join(rel),
                });
            }
        }
        for (rel, times) in targets {
            let volume = name(&rel);
            if held.contains_key(&volume) {
                continue;
            }
            if let Some(why) = self.unmount(&volume, &base.join(&rel), times, true) {
                held.insert(volume, why);
            }
        }
        if held.is_empty()
            && let Some(why) = self.remove("volume-subpaths", base, Removal::EmptyFilesOnly)
        {
            held.insert("volume-subpaths".into(), why);
        }
        held.into_iter()
            .map(|(volume, why)| Held {
                volume,
                plugin: String::new(),
                why,
            })
            .collect()
    }
}

/// The first path from the pod's directory down to `target` that is not a real directory (a
/// symlink, or a file where a directory must be; with `file_leaf` the target itself may be a
/// regular file), if any. A component that is gone is no danger: the unmount answers ENOENT.
/// Only the directories the kubelet made are looked at, never anything inside a mount but the
/// mount point itself.
fn first_unsafe(target: &Path, file_leaf: bool) -> Option<PathBuf> {
    // `pods/<uid>/volumes/<plugin>/<volume>` or `pods/<uid>/volume-subpaths/<v>/<c>/<i>`: the
    // components from `<uid>` down (the pod dir and above were checked by the pass)
    let depth = if file_leaf { 4 } else { 3 };
    let mut chain: Vec<&Path> = target.ancestors().take(depth).collect();
    chain.reverse();
    let n = chain.len();
    for (i, p) in chain.into_iter().enumerate() {
        let leaf = i + 1 == n;
        match std::fs::symlink_metadata(p) {
            Ok(m) if m.file_type().is_dir() => {}
            Ok(m) if leaf && file_leaf && m.file_type().is_file() => {}
            Ok(_) => return Some(p.to_owned()),
            Err(_) => {}
        }
    }
    None
}

/// Whether this process can tear volumes down for the host: an unmount it makes below `root_dir`
/// must reach the host's mount table (an unmount in a namespace of its own that does not
/// propagate never reaches it, and a later rmdir there detaches the host's mount for good), and
/// it must hold `CAP_SYS_ADMIN`. Read from `proc` (`/proc`; a fixture in tests):
/// * where `self/ns/mnt` and `1/ns/mnt` are both readable (root may not read init's: ptrace
///   rules) and the same, this is the host's namespace, unless this process runs in a pod
///   (`in_pod`): a container always has a mount namespace of its own, so there PID 1 is the
///   pod's own (no `hostPID`) and nothing about the host can be told;
/// * where they differ (a container: the DaemonSet in `deploy/`, with `hostPID`), the mount
///   holding `root_dir` here must be in the same shared peer group (`shared:N`) as the host's
///   mount holding it (`1/mountinfo`): what `mountPropagation: Bidirectional` makes, so an
///   unmount below it propagates to the host; anything else is a namespace of its own;
/// * else the root mount of `self/mountinfo` decides: never a slave (`master:N`: a namespace a
///   service manager linked back to the host, as systemd's `ProtectSystem=`, `PrivateTmp=`, ...
///   do), and, when systemd is init (`init_is_systemd`: it makes the host's root mount
///   shared), `shared` (a private one is a namespace of its own, as `unshare -m` makes; without
///   systemd the host's root may be private too, so that is not told apart).
///
/// And `CapEff` of `self/status` must have bit 21. `Err` says why not.
pub fn can_tear_down(
    proc: &Path,
    init_is_systemd: bool,
    root_dir: &Path,
    in_pod: bool,
) -> Result<(), String> {
    use procfs::process::MountOptFields;
    let ns = |pid: &str| std::fs::read_link(proc.join(pid).join("ns/mnt")).ok();
    match (ns("self"), ns("1")) {
        (Some(me), Some(init)) if me != init => {
            if let Err(why) = peer_of_host(proc, root_dir) {
                return Err(format!(
                    "in a mount namespace of its own ({}, the host's is {}) and {why}: an \
                     unmount here would not reach the host",
                    me.display(),
                    init.display()
                ));
            }
        }
        (Some(_), Some(_)) if in_pod => {
            return Err(
                "in a pod whose PID 1 shares its mount namespace (no hostPID): the host's mounts \
                 cannot be told apart from the pod's"
                    .into(),
            );
        }
        (Some(_), Some(_)) => {}
        _ => {
            let mi = proc.join("self/mountinfo");
            let mounts = read_mountinfo(&mi).map_err(|e| format!("{}: {e}", mi.display()))?;
            let root = mounts
                .iter()
                .rev()
                .find(|m| m.mount_point == Path::new("/"))
                .ok_or_else(|| format!("{}: no root mount", mi.display()))?;
            let shared = root
                .opt_fields
                .iter()
                .any(|f| matches!(f, MountOptFields::Shared(_)));
            let slave = root
                .opt_fields
                .iter()
                .any(|f| matches!(f, MountOptFields::Master(_)));
            if slave || (init_is_systemd && !shared) {
                return Err(format!(
                    "in a mount namespace of its own (the root mount is {}): an unmount here \
                     would not reach the host",
                    if slave {
                        "a slave of another"
                    } else {
                        "private"
                    }
                ));
            }
        }
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

/// Whether the mount holding `root_dir` in this namespace and the host's (`1/mountinfo`) mount
/// holding it are one shared peer group (peer group IDs are the kernel's, the same in every
/// namespace). `Err` says what was found instead.
fn peer_of_host(proc: &Path, root_dir: &Path) -> Result<(), String> {
    use procfs::process::MountOptFields;
    let group = |pid: &str| -> Result<Option<u32>, String> {
        let mi = proc.join(pid).join("mountinfo");
        let mounts = read_mountinfo(&mi).map_err(|e| format!("{}: {e}", mi.display()))?;
        // the last mount at the longest mount point that holds root_dir: the one on top
        let holder = mounts
            .iter()
            .filter(|m| root_dir.starts_with(&m.mount_point))
            .max_by_key(|m| m.mount_point.components().count())
            .ok_or_else(|| format!("{}: nothing holds {}", mi.display(), root_dir.display()))?;
        let holder = mounts
            .iter()
            .rev()
            .find(|m| m.mount_point == holder.mount_point)
            .unwrap_or(holder);
        Ok(holder.opt_fields.iter().find_map(|f| match f {
            MountOptFields::Shared(n) => Some(*n),
            _ => None,
        }))
    };
    match (group("self")?, group("1")?) {
        (Some(a), Some(b)) if a == b => Ok(()),
        (Some(a), Some(b)) => Err(format!(
            "{} is in shared peer group {a} here and {b} on the host",
            root_dir.display()
        )),
        (None, _) => Err(format!(
            "{} is not a shared mount here (mountPropagation Bidirectional makes it one)",
            root_dir.display()
        )),
        (Some(_), None) => Err(format!(
            "{} is not a shared mount on the host",
            root_dir.display()
        )),
    }
}
