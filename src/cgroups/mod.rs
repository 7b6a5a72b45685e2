//! Pod cgroups: kubelet's `podContainerManagerImpl.Destroy` / `killOnePid`
//! (`cm/pod_container_manager_linux.go`), `cgroupManagerImpl.Name`/`CgroupName.ToSystemd`
//! (`cm/cgroup_manager_linux.go`) and libcontainer's cgroup removal.
//!
//! Invariants:
//! * cgroup v1, v2 and hybrid hosts are handled alike: every `cgroup`/`cgroup2` mount from
//!   mountinfo is a hierarchy, and the pod cgroup is removed from each;
//! * names follow the kubelet for both drivers and all QoS classes; every path is built from a
//!   validated [`PodUid`] and checked components, and is verified to stay below
//!   `<hierarchy>/<cgroup-root>` before anything is touched;
//! * processes left in the tree are SIGKILLed (cgroup v2 `cgroup.kill` when present; per pid
//!   through a pidfd re-checked for membership, so a reused pid is never hit), then the
//!   directories are removed deepest first; ESRCH and ENOENT mean done, so destroy is
//!   idempotent;
//! * with the systemd driver on a systemd host, each pod slice is also stopped as a unit over
//!   D-Bus (as the kubelet's libcontainer manager does), else systemd keeps an active slice
//!   unit per pod forever.

use crate::pod::{PodUid, QosClass};
use crate::systemd::{Systemd, SystemdError};
use crate::volumes::MountInfo;
use rustix::io::Errno;
use rustix::process::{Pid, PidfdFlags, Signal, kill_process, pidfd_open, pidfd_send_signal};
use std::io::ErrorKind;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Every QoS class: a pod's cgroup is under one of their parents.
const QOS_CLASSES: [QosClass; 3] = [
    QosClass::Guaranteed,
    QosClass::Burstable,
    QosClass::BestEffort,
];

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("invalid cgroup root {root:?}: {why}")]
    InvalidRoot { root: String, why: &'static str },
    #[error("pod {uid}: cgroup {path} could not be removed: {source}")]
    Remove {
        uid: String,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("pod {uid}: cgroup {path} still has processes {pids:?} after {passes} kill passes")]
    Busy {
        uid: String,
        path: PathBuf,
        pids: Vec<i32>,
        passes: u32,
    },
    #[error("pod {uid}: {source}")]
    Systemd {
        uid: String,
        #[source]
        source: Box<SystemdError>,
    },
    #[error("path {0} would leave the cgroup root")]
    Escape(PathBuf),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupDriver {
    Cgroupfs,
    Systemd,
}

/// cgroup version of one hierarchy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupVersion {
    V1,
    V2,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hierarchy {
    pub mount_point: PathBuf,
    pub version: CgroupVersion,
}

/// The host's cgroup mode, for reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupMode {
    V1,
    V2,
    Hybrid,
    None,
}

/// Every cgroup hierarchy mounted, from mountinfo entries.
pub fn hierarchies(mounts: &[MountInfo]) -> Vec<Hierarchy> {
    let mut out: Vec<Hierarchy> = mounts
        .iter()
        .filter_map(|m| {
            let version = match m.fs_type.as_str() {
                "cgroup" => CgroupVersion::V1,
                "cgroup2" => CgroupVersion::V2,
                _ => return None,
            };
            Some(Hierarchy {
                mount_point: m.mount_point.clone(),
                version,
            })
        })
        .collect();
    out.sort_by(|a, b| a.mount_point.cmp(&b.mount_point));
    out.dedup_by(|a, b| a.mount_point == b.mount_point);
    out
}

pub fn mode(h: &[Hierarchy]) -> CgroupMode {
    let v1 = h.iter().any(|h| h.version == CgroupVersion::V1);
    let v2 = h.iter().any(|h| h.version == CgroupVersion::V2);
    match (v1, v2) {
        (true, true) => CgroupMode::Hybrid,
        (true, false) => CgroupMode::V1,
        (false, true) => CgroupMode::V2,
        (false, false) => CgroupMode::None,
    }
}

/// How pod cgroups are named: the driver and the kubelet's `--cgroup-root`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupNaming {
    driver: CgroupDriver,
    /// Components of the cgroup root (`/` → none).
    root: Vec<String>,
}

impl CgroupNaming {
    /// `cgroup_root` is absolute (`/`, `/reaplet-testbed`, or with the systemd driver a slice
    /// path such as `/custom.slice`).
    pub fn new(driver: CgroupDriver, cgroup_root: &str) -> Result<Self, CgroupError> {
        let bad = |why| CgroupError::InvalidRoot {
            root: cgroup_root.to_owned(),
            why,
        };
        if !cgroup_root.starts_with('/') {
            return Err(bad("must be absolute"));
        }
        let mut root = Vec::new();
        for part in cgroup_root.split('/').filter(|p| !p.is_empty()) {
            if part == "." || part == ".." {
                return Err(bad("must not contain . or .."));
            }
            if !part
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.@:".contains(&b))
            {
                return Err(bad("only letters, digits and -_.@: are allowed"));
            }
            let comp = match driver {
                CgroupDriver::Cgroupfs => part.to_owned(),
                // a systemd slice path: each level repeats its parent's prefix
                CgroupDriver::Systemd => {
                    let s = part
                        .strip_suffix(".slice")
                        .ok_or(bad("systemd driver needs .slice components"))?;
                    s.rsplit('-').next().unwrap_or(s).to_owned()
                }
            };
            if comp.is_empty() {
                return Err(bad("empty component"));
            }
            root.push(comp);
        }
        Ok(Self { driver, root })
    }

    pub fn driver(&self) -> CgroupDriver {
        self.driver
    }

    /// The pod cgroup's path relative to a hierarchy's mount point.
    pub fn pod_cgroup(&self, uid: &PodUid, qos: QosClass) -> PathBuf {
        let mut comps: Vec<String> = self.root.clone();
        comps.push("kubepods".into());
        match qos {
            QosClass::Guaranteed => {}
            QosClass::Burstable => comps.push("burstable".into()),
            QosClass::BestEffort => comps.push("besteffort".into()),
        }
        comps.push(format!("pod{}", uid.as_str()));
        match self.driver {
            CgroupDriver::Cgroupfs => comps.iter().collect(),
            CgroupDriver::Systemd => {
                let mut path = PathBuf::new();
                let mut prefix = String::new();
                for c in comps {
                    if !prefix.is_empty() {
                        prefix.push('-');
                    }
                    prefix.push_str(&c.replace('-', "_"));
                    path.push(format!("{prefix}.slice"));
                }
                path
            }
        }
    }

    /// The pod UID a pod cgroup's directory (or, with the systemd driver, slice unit) name
    /// belongs to, when `name` is exactly what [`Self::pod_cgroup`] builds for that UID in
    /// `qos` (kubelet's `GetAllPodsFromCgroups` / `ParseSystemdToCgroupName`). Anything else
    /// (a container's cgroup, a foreign directory, a name that is no valid UID) is `None`.
    pub fn uid_of(&self, name: &str, qos: QosClass) -> Option<PodUid> {
        let raw = match self.driver {
            CgroupDriver::Cgroupfs => name.strip_prefix("pod")?.to_owned(),
            // the escaped UID has no '-': it is the last component of the slice name
            CgroupDriver::Systemd => {
                let stem = name.strip_suffix(".slice")?;
                let last = stem.rsplit('-').next()?;
                last.strip_prefix("pod")?.replace('_', "-")
            }
        };
        let uid = PodUid::parse(&raw).ok()?;
        let built = self.pod_cgroup(&uid, qos);
        (built.file_name()?.to_str()? == name).then_some(uid)
    }

    /// The cgroup root relative to a hierarchy's mount point.
    pub fn root_path(&self) -> PathBuf {
        match self.driver {
            CgroupDriver::Cgroupfs => self.root.iter().collect(),
            CgroupDriver::Systemd => {
                let mut path = PathBuf::new();
                let mut prefix = String::new();
                for c in &self.root {
                    if !prefix.is_empty() {
                        prefix.push('-');
                    }
                    prefix.push_str(&c.replace('-', "_"));
                    path.push(format!("{prefix}.slice"));
                }
                path
            }
        }
    }
}

/// Joins `rel` below `mount`, refusing anything that could leave it.
pub fn contained(mount: &Path, root: &Path, rel: &Path) -> Result<PathBuf, CgroupError> {
    if rel.components().any(|c| !matches!(c, Component::Normal(_))) {
        return Err(CgroupError::Escape(rel.to_owned()));
    }
    let full = mount.join(rel);
    if !full.starts_with(mount.join(root)) {
        return Err(CgroupError::Escape(full));
    }
    Ok(full)
}

/// Destroys pod cgroups in every hierarchy.
#[derive(Debug, Clone)]
pub struct CgroupManager {
    hierarchies: Vec<Hierarchy>,
    naming: CgroupNaming,
    /// With the systemd driver on a systemd host: pod slices are stopped as units too.
    units: Option<Arc<Systemd>>,
}

/// What a destroy did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DestroyReport {
    pub removed_dirs: usize,
    pub killed_pids: usize,
    /// Pod slice units systemd was asked to stop (systemd driver).
    pub stopped_units: usize,
}

impl CgroupManager {
    pub fn new(hierarchies: Vec<Hierarchy>, naming: CgroupNaming) -> Self {
        Self {
            hierarchies,
            naming,
            units: None,
        }
    }

    /// Stops pod slices through systemd as well (the systemd driver on a systemd host), as
    /// the kubelet's cgroup manager does; without it only directories are removed.
    pub fn with_systemd(mut self, units: Arc<Systemd>) -> Self {
        self.units = Some(units);
        self
    }

    /// Reads the hierarchies from a mountinfo file (`/proc/self/mountinfo` in production).
    pub fn from_mountinfo(path: &Path, naming: CgroupNaming) -> std::io::Result<Self> {
        Ok(Self::new(
            hierarchies(&crate::volumes::read_mountinfo(path)?),
            naming,
        ))
    }

    pub fn hierarchies(&self) -> &[Hierarchy] {
        &self.hierarchies
    }

    pub fn naming(&self) -> &CgroupNaming {
        &self.naming
    }

    /// Every existing pod cgroup directory of `uid` (all QoS classes, all hierarchies).
    pub fn existing(&self, uid: &PodUid) -> Result<Vec<(Hierarchy, PathBuf)>, CgroupError> {
        let root = self.naming.root_path();
        let mut out = Vec::new();
        for h in &self.hierarchies {
            for qos in QOS_CLASSES {
                let dir = contained(&h.mount_point, &root, &self.naming.pod_cgroup(uid, qos))?;
                if dir.is_dir() {
                    out.push((h.clone(), dir));
                }
            }
        }
        Ok(out)
    }

    /// Every pod UID that has a pod cgroup directory, in any hierarchy and any QoS class
    /// (kubelet's `GetAllPodsFromCgroups`), sorted and without duplicates. Only directories
    /// whose names are exactly a pod cgroup's are counted; a missing QoS parent is none.
    pub fn pod_uids(&self) -> Result<Vec<PodUid>, CgroupError> {
        let root = self.naming.root_path();
        let mut out = Vec::new();
        for h in &self.hierarchies {
            for qos in QOS_CLASSES {
                // the QoS parent is the same for every UID: build it from a placeholder
                let probe = PodUid::parse("probe").expect("a valid uid");
                let rel = self.naming.pod_cgroup(&probe, qos);
                let Some(parent) = rel.parent() else {
                    continue;
                };
                let dir = contained(&h.mount_point, &root, parent)?;
                let Ok(entries) = std::fs::read_dir(&dir) else {
                    continue;
                };
                for e in entries.flatten() {
                    if !e.file_type().is_ok_and(|t| t.is_dir()) {
                        continue;
                    }
                    if let Some(uid) = e
                        .file_name()
                        .to_str()
                        .and_then(|n| self.naming.uid_of(n, qos))
                    {
                        out.push(uid);
                    }
                }
            }
        }
        out.sort();
        out.dedup();
        Ok(out)
    }

    /// Every pod UID with a loaded pod slice unit (systemd driver on a systemd host; else
    /// none): a slice whose directories are gone may still be an active unit.
    pub async fn pod_slice_uids(&self) -> Result<Vec<PodUid>, SystemdError> {
        let (CgroupDriver::Systemd, Some(units)) = (self.naming.driver, &self.units) else {
            return Ok(Vec::new());
        };
        let names = units.list_pod_slices().await?;
        let mut out: Vec<PodUid> = names
            .iter()
            .filter_map(|n| {
                QOS_CLASSES
                    .into_iter()
                    .find_map(|qos| self.naming.uid_of(n, qos))
            })
            .collect();
        out.sort();
        out.dedup();
        Ok(out)
    }

    /// Kills every process left in the pod's cgroups and removes them, deepest first, in
    /// every hierarchy. Idempotent.
    pub async fn destroy(&self, uid: &PodUid) -> Result<DestroyReport, CgroupError> {
        const PASSES: u32 = 10;
        let mut report = DestroyReport::default();
        let dirs = self.existing(uid)?;
        // one walk per hierarchy serves the thaw, the first look for processes and the removal
        // (a cgroup directory lists every control file: reading it is most of the cost)
        let mut trees: Vec<Vec<PathBuf>> = dirs.iter().map(|(_, d)| walk_post_order(d)).collect();
        // kill first, everywhere (v2's cgroup.kill covers the whole subtree at once)
        for ((h, dir), tree) in dirs.iter().zip(&trees) {
            if h.version == CgroupVersion::V2 && dir.join("cgroup.kill").exists() {
                let _ = std::fs::write(dir.join("cgroup.kill"), "1");
            }
            thaw_v1(dir, tree);
        }
        for ((_, dir), tree) in dirs.iter().zip(&mut trees) {
            let mut pass = 0;
            loop {
                let members = pids_in(tree);
                if members.is_empty() {
                    break;
                }
                pass += 1;
                if pass > PASSES {
                    return Err(CgroupError::Busy {
                        uid: uid.to_string(),
                        path: dir.clone(),
                        pids: members.into_iter().map(|(_, p)| p).collect(),
                        passes: PASSES,
                    });
                }
                for (cg, pid) in &members {
                    if kill_member(cg, *pid) {
                        report.killed_pids += 1;
                    }
                }
                tokio::time::sleep(Duration::from_millis(20 * u64::from(pass))).await;
                // a process that was running may have made a child cgroup: look again
                *tree = walk_post_order(dir);
            }
        }
        if let (CgroupDriver::Systemd, Some(units)) = (self.naming.driver, &self.units) {
            // every QoS class: a slice whose directory is gone may still be an active unit
            for qos in QOS_CLASSES {
                let rel = self.naming.pod_cgroup(uid, qos);
                let Some(unit) = rel.file_name().and_then(|n| n.to_str()) else {
                    continue;
                };
                match units.stop_slice(unit).await {
                    Ok(true) => report.stopped_units += 1,
                    Ok(false) => {}
                    Err(source @ SystemdError::StillActive { .. }) => {
                        return Err(CgroupError::Systemd {
                            uid: uid.to_string(),
                            source: Box::new(source),
                        });
                    }
                    // no bus or no systemd answer: the directories still go below; the unit
                    // is stopped on a later pass if this pod is destroyed again
                    Err(e) => tracing::warn!(podUID = %uid, unit, err = %e,
                        "pod slice not stopped through systemd; removing its directories only"),
                }
            }
        }
        for ((_, dir), tree) in dirs.iter().zip(trees) {
            report.removed_dirs += remove_tree(uid, dir, tree).await?;
        }
        Ok(report)
    }
}

/// v1 freezer: a frozen cgroup's processes cannot die until thawed. `tree` is `dir`'s walk;
/// only the freezer hierarchy has `freezer.state`, in every directory below its root.
fn thaw_v1(dir: &Path, tree: &[PathBuf]) {
    if !dir.join("freezer.state").exists() {
        return;
    }
    for d in tree {
        let f = d.join("freezer.state");
        if let Ok(s) = std::fs::read_to_string(&f)
            && s.trim() != "THAWED"
        {
            let _ = std::fs::write(&f, "THAWED");
        }
    }
}

/// Directories below and including `dir`, children before parents.
fn walk_post_order(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![(dir.to_path_buf(), false)];
    while let Some((d, visited)) = stack.pop() {
        if visited {
            out.push(d);
            continue;
        }
        stack.push((d.clone(), true));
        if let Ok(rd) = std::fs::read_dir(&d) {
            for e in rd.flatten() {
                // file_type() does not follow symlinks: cgroupfs has none, a fixture might
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push((e.path(), false));
                }
            }
        }
    }
    out
}

fn read_procs(dir: &Path) -> Vec<i32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .map(|s| {
            s.lines()
                .filter_map(|l| l.trim().parse::<i32>().ok())
                .filter(|p| *p > 0)
                .collect()
        })
        .unwrap_or_default()
}

/// Every process of the walked directories, with its directory.
fn pids_in(tree: &[PathBuf]) -> Vec<(PathBuf, i32)> {
    tree.iter()
        .flat_map(|d| read_procs(d).into_iter().map(move |p| (d.clone(), p)))
        .collect()
}

/// SIGKILLs `pid` if it is (still) a member of `cgroup`. Returns whether a signal was sent.
fn kill_member(cgroup: &Path, pid: i32) -> bool {
    let Some(target) = Pid::from_raw(pid) else {
        return false;
    };
    match pidfd_open(target, PidfdFlags::empty()) {
        // with the pidfd held, the pid cannot be reused: re-check membership, then signal
        // (the fd is closed when dropped)
        Ok(fd) => read_procs(cgroup).contains(&pid) && pidfd_send_signal(&fd, Signal::KILL).is_ok(),
        // gone
        Err(Errno::SRCH) => false,
        // ENOSYS (old kernel) and the like: a plain kill after a membership check
        Err(_) => read_procs(cgroup).contains(&pid) && kill_process(target, Signal::KILL).is_ok(),
    }
}

/// Removes `dir` and its children, deepest first, from `tree` (`dir`'s walk). ENOENT means
/// done; EBUSY is retried a few times (a process may still be exiting, or a child appeared
/// since the walk: the retry walks again).
async fn remove_tree(
    uid: &PodUid,
    dir: &Path,
    mut tree: Vec<PathBuf>,
) -> Result<usize, CgroupError> {
    let mut removed = 0;
    let mut attempt = 0u32;
    'walk: loop {
        for d in &tree {
            match std::fs::remove_dir(d) {
                Ok(()) => removed += 1,
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) if e.raw_os_error() == Some(Errno::BUSY.raw_os_error()) && attempt < 10 => {
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(20 * u64::from(attempt))).await;
                    tree = walk_post_order(dir);
                    continue 'walk;
                }
                Err(source) => {
                    return Err(CgroupError::Remove {
                        uid: uid.to_string(),
                        path: d.clone(),
                        source,
                    });
                }
            }
        }
        return Ok(removed);
    }
}

#[cfg(test)]
mod tests;
