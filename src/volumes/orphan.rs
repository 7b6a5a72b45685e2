//! Orphaned pod directories: the kubelet's `cleanupOrphanedPodDirs` (`kubelet_volumes.go`)
//! with `RemoveAllOneFilesystem`.
//!
//! Invariants: a pod directory is removed only when nothing below it is a mount point (per
//! mountinfo, or a directory on another device met while scanning) and nothing but empty
//! directories is below `volumes/`; the whole tree is scanned before anything is removed;
//! symlinks are unlinked, never followed; ENOENT means done.

use super::MountInfo;
use crate::pod::PodUid;
use std::path::{Path, PathBuf};

/// A pod's directory: `<root_dir>/pods/<uid>`.
pub fn pod_dir(root_dir: &Path, uid: &PodUid) -> PathBuf {
    root_dir.join("pods").join(uid.as_str())
}

/// Every pod UID with a directory under `<root_dir>/pods` (names that are no valid
/// [`PodUid`] are not pods and are left out). A missing `pods` directory means none.
pub fn pod_dir_uids(root_dir: &Path) -> std::io::Result<Vec<PodUid>> {
    let rd = match std::fs::read_dir(root_dir.join("pods")) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out: Vec<PodUid> = rd
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| PodUid::parse(n).ok()))
        .collect();
    out.sort();
    Ok(out)
}

/// The mount points at or below `dir` (compared both as given and through its canonical
/// path, since mountinfo has resolved paths), relative to `dir`.
pub fn mounts_below(dir: &Path, mounts: &[MountInfo]) -> Vec<PathBuf> {
    let canonical = std::fs::canonicalize(dir).ok();
    let mut out: Vec<PathBuf> = mounts
        .iter()
        .filter_map(|m| {
            std::iter::once(dir)
                .chain(canonical.as_deref())
                .find_map(|d| m.mount_point.strip_prefix(d).ok())
                .map(Path::to_path_buf)
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// What became of an orphaned pod directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OrphanDir {
    /// Removed, or already gone.
    Removed,
    /// Something is mounted below it (paths relative to the pod dir): left alone.
    Mounted(Vec<PathBuf>),
    /// Not a plain directory (a symlink, a file): left alone, never followed.
    NotADirectory,
    /// Something other than empty directories is under `volumes/`, or `volume-subpaths/`
    /// exists (path relative to the pod dir): a volume's data may be there, so it is left
    /// alone, as the kubelet leaves it ("could lead to data loss").
    VolumeData(PathBuf),
}

/// Removes an orphaned pod directory `<root_dir>/pods/<uid>` (kubelet's
/// `cleanupOrphanedPodDirs` with `RemoveAllOneFilesystem`), unless `volume-subpaths/` exists,
/// anything but empty directories is below `volumes/`, or anything below it is a mount point:
/// per `mounts` (mountinfo), or a directory on another device found while scanning. The whole
/// tree is scanned before anything is removed; symlinks are never followed (a symlink is
/// unlinked, its target untouched); a pod dir that is itself a symlink is left alone. ENOENT
/// means done, so this is idempotent.
pub fn remove_orphan_pod_dir(
    root_dir: &Path,
    uid: &PodUid,
    mounts: &[MountInfo],
) -> std::io::Result<OrphanDir> {
    let dir = pod_dir(root_dir, uid);
    let meta = match std::fs::symlink_metadata(&dir) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(OrphanDir::Removed),
        Err(e) => return Err(e),
    };
    if !meta.file_type().is_dir() {
        return Ok(OrphanDir::NotADirectory);
    }
    let below = mounts_below(&dir, mounts);
    if !below.is_empty() {
        return Ok(OrphanDir::Mounted(below));
    }
    if std::fs::symlink_metadata(dir.join("volume-subpaths")).is_ok() {
        return Ok(OrphanDir::VolumeData("volume-subpaths".into()));
    }
    // only empty directories are removed below volumes/: anything else may be a volume's
    // data (a mount this scan did not see, a bind mount on the same filesystem), and is never
    // deleted
    Ok(
        match remove_tree(&dir, Removal::NoFilesBelow(&dir.join("volumes")))? {
            Tree::Removed => OrphanDir::Removed,
            Tree::OtherDevice(p) => OrphanDir::Mounted(vec![p]),
            Tree::Data(p) => OrphanDir::VolumeData(p),
            Tree::NotADirectory => OrphanDir::NotADirectory,
        },
    )
}

/// What [`remove_tree`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tree {
    /// Removed, or already gone.
    Removed,
    /// A mount at this path, relative to the tree (another mount ID, or another device): nothing
    /// was removed.
    OtherDevice(PathBuf),
    /// Something the policy keeps at this path (relative): nothing was removed.
    Data(PathBuf),
    /// The tree's root is not a plain directory (a symlink, a file): left alone.
    NotADirectory,
}

/// What [`remove_tree`] may remove besides directories and symlinks.
#[derive(Debug, Clone, Copy)]
pub enum Removal<'a> {
    /// Every file (an emptyDir's data goes with its pod).
    Everything,
    /// Only empty regular files (the kubelet's own placeholders: subPath bind mount targets).
    EmptyFilesOnly,
    /// No file below this path (a volume's data is never deleted); any file elsewhere.
    NoFilesBelow(&'a Path),
}

/// The mount an entry is on, by `statx` mount ID (Linux 5.8+); `None` where the kernel does not
/// say (then only the device number tells mounts apart).
fn mount_id(path: &Path) -> Option<u64> {
    use rustix::fs::{AtFlags, CWD, StatxFlags, statx};
    let st = statx(CWD, path, AtFlags::SYMLINK_NOFOLLOW, StatxFlags::MNT_ID).ok()?;
    (st.stx_mask & StatxFlags::MNT_ID.bits() != 0).then_some(st.stx_mnt_id)
}

/// Removes the directory `dir` and everything below it on its own mount
/// (`RemoveAllOneFilesystem`), as `policy` allows: the whole tree is scanned first, and nothing
/// is removed when any entry is on another mount (its `statx` mount ID differs from the root's,
/// which catches a bind mount of the same filesystem that no mountinfo snapshot showed, or its
/// device differs) or is a file the policy keeps. Symlinks are unlinked, never followed; ENOENT
/// means done.
pub fn remove_tree(dir: &Path, policy: Removal<'_>) -> std::io::Result<Tree> {
    use std::os::unix::fs::MetadataExt;
    let meta = match std::fs::symlink_metadata(dir) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Tree::Removed),
        Err(e) => return Err(e),
    };
    if !meta.file_type().is_dir() {
        return Ok(Tree::NotADirectory);
    }
    // scan first (children before parents), refusing any other mount
    let dev = meta.dev();
    let mnt = mount_id(dir);
    let mut order: Vec<(PathBuf, bool)> = Vec::new();
    let mut stack = vec![(dir.to_path_buf(), false)];
    while let Some((d, visited)) = stack.pop() {
        if visited {
            order.push((d, true));
            continue;
        }
        stack.push((d.clone(), true));
        let rd = match std::fs::read_dir(&d) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        for e in rd {
            let e = e?;
            // DirEntry::metadata does not follow symlinks
            let m = match e.metadata() {
                Ok(m) => m,
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => continue,
                Err(err) => return Err(err),
            };
            let path = e.path();
            let rel = || path.strip_prefix(dir).unwrap_or(&path).to_owned();
            let symlink = m.file_type().is_symlink();
            // a symlink is never a mount point; anything else may be (a file bind mount too)
            if !symlink && (m.dev() != dev || (mnt.is_some() && mount_id(&path) != mnt)) {
                return Ok(Tree::OtherDevice(rel()));
            }
            if m.file_type().is_dir() {
                stack.push((path, false));
                continue;
            }
            let keep = match policy {
                Removal::Everything => false,
                Removal::EmptyFilesOnly => !(symlink || m.file_type().is_file() && m.len() == 0),
                Removal::NoFilesBelow(k) => path.starts_with(k),
            };
            if keep {
                return Ok(Tree::Data(rel()));
            }
            order.push((path, false));
        }
    }
    for (p, is_dir) in order {
        let r = if is_dir {
            std::fs::remove_dir(&p)
        } else {
            std::fs::remove_file(&p)
        };
        match r {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(Tree::Removed)
}
