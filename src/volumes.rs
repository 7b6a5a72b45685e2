//! Waiting for a pod's volumes to be unmounted: kubelet's `podVolumesExist` /
//! `getMountedVolumePathListFromDisk` (`kubelet_volumes.go`, `kubelet_getters.go`) and the
//! mountinfo parsing of `k8s.io/mount-utils`.
//!
//! Invariants:
//! * only `<root-dir>/pods/<uid>/volumes/<plugin>/<volume>` (CSI: `<volume>/mount`) are
//!   looked at; the UID is a validated [`PodUid`], so the path stays under the root dir; this
//!   module only reads, never writes or unmounts;
//! * a volume directory is mounted when it, or anything below it, is a mount point in
//!   mountinfo; an error while checking counts as "still mounted";
//! * mountinfo is read through a path (procfs in production, a fixture in tests) and parsed
//!   by the `procfs` crate, line by line.

use crate::pod::PodUid;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::time::Instant;

#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    #[error("pod {uid}: volumes still mounted after {waited:?}: {volumes:?}")]
    StillMounted {
        uid: String,
        waited: Duration,
        volumes: Vec<String>,
    },
}

/// One entry of `/proc/self/mountinfo`, as `procfs` parses it; [`parse_mountinfo`] undoes
/// the kernel's escapes in `root` and `mount_point`.
pub use procfs::process::MountInfo;

/// Parses mountinfo text with `procfs`, line by line: a malformed line is skipped (never a
/// panic, and one bad line does not hide the others).
pub fn parse_mountinfo(text: &str) -> Vec<MountInfo> {
    text.lines()
        .filter_map(|line| MountInfo::from_line(line).ok())
        .map(|mut m| {
            m.root = unescape(&m.root);
            m.mount_point = PathBuf::from(unescape(&m.mount_point.to_string_lossy()));
            m
        })
        .collect()
}

/// Reads and parses a mountinfo file (`/proc/self/mountinfo` in production, a fixture in
/// tests).
pub fn read_mountinfo(path: &Path) -> std::io::Result<Vec<MountInfo>> {
    Ok(parse_mountinfo(&std::fs::read_to_string(path)?))
}

/// Undoes the kernel's escapes in mountinfo paths (`seq_file`'s `mangle`: `\040` space,
/// `\011` tab, `\012` newline, `\134` backslash; no other character is escaped).
fn unescape(s: &str) -> String {
    // every backslash the kernel writes starts an escape, so split on the escaped backslash
    s.split("\\134")
        .map(|p| {
            p.replace("\\040", " ")
                .replace("\\011", "\t")
                .replace("\\012", "\n")
        })
        .collect::<Vec<_>>()
        .join("\\")
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

/// Waits until no volume of the pod is mounted, polling every `poll`, for at most `bound`.
/// Logs the still-mounted set when it changes (one line per decision, not per poll).
pub async fn wait_unmounted(
    root_dir: &Path,
    uid: &PodUid,
    mountinfo: &Path,
    poll: Duration,
    bound: Duration,
) -> Result<(), VolumeError> {
    let start = Instant::now();
    let mut last: Vec<String> = Vec::new();
    loop {
        let now = still_mounted(root_dir, uid, mountinfo);
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
            tracing::info!(volumes = ?now, "waiting for pod volumes to be unmounted");
            last = now;
        }
        if start.elapsed() >= bound {
            return Err(VolumeError::StillMounted {
                uid: uid.to_string(),
                waited: start.elapsed(),
                volumes: last,
            });
        }
        tokio::time::sleep(poll).await;
    }
}

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
/// anything but empty directories is below `volumes/`, or anything below it is a mount point: per `mounts` (mountinfo), or a directory on another device found while
/// scanning. The whole tree is scanned before anything is removed; symlinks are never
/// followed (a symlink is unlinked, its target untouched); a pod dir that is itself a symlink
/// is left alone. ENOENT means done, so this is idempotent.
pub fn remove_orphan_pod_dir(
    root_dir: &Path,
    uid: &PodUid,
    mounts: &[MountInfo],
) -> std::io::Result<OrphanDir> {
    use std::os::unix::fs::MetadataExt;
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
    let volumes = dir.join("volumes");
    // scan first (children before parents), refusing any other filesystem
    let dev = meta.dev();
    let mut order: Vec<(PathBuf, bool)> = Vec::new();
    let mut stack = vec![(dir.clone(), false)];
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
            let rel = || e.path().strip_prefix(&dir).unwrap_or(&e.path()).to_owned();
            if m.file_type().is_dir() {
                if m.dev() != dev {
                    return Ok(OrphanDir::Mounted(vec![rel()]));
                }
                stack.push((e.path(), false));
            } else if e.path().starts_with(&volumes) {
                // only empty directories are removed below volumes/: anything else may be a
                // volume's data (a mount this scan did not see, a bind mount on the same
                // filesystem), and is never deleted
                return Ok(OrphanDir::VolumeData(rel()));
            } else {
                order.push((e.path(), false));
            }
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
    Ok(OrphanDir::Removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
35 22 0:30 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
36 22 0:31 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
90 22 0:50 / /var/lib/kubelet/pods/u1/volumes/kubernetes.io~empty-dir/cache rw - tmpfs tmpfs rw
91 22 0:51 / /var/lib/kubelet/pods/u1/volumes/kubernetes.io~csi/pvc-1/mount rw - ext4 /dev/sdb rw
92 22 0:52 / /mnt/with\\040space rw - tmpfs tmpfs rw
garbage line
93 22 0:53 / - tmpfs
";

    #[test]
    fn parses_and_unescapes() {
        let m = parse_mountinfo(SAMPLE);
        assert_eq!(m.len(), 6);
        assert_eq!(m[1].fs_type, "cgroup");
        assert!(m[1].super_options.contains_key("memory"));
        assert_eq!(m[5].mount_point, PathBuf::from("/mnt/with space"));
    }

    #[test]
    fn hostile_mountinfo_never_panics() {
        for s in [
            "",
            " - ",
            "\\",
            "a b c d \\0 f - x",
            "1 2 3 4 \\777 6 - t s o",
            "\\12",
        ] {
            let _ = parse_mountinfo(s);
        }
        assert_eq!(unescape("\\777x"), "\\777x");
        assert_eq!(unescape("a\\134b"), "a\\b");
        // an escaped backslash followed by digits is a backslash and digits
        assert_eq!(unescape("a\\134040b"), "a\\040b");
        assert_eq!(unescape("\\011\\012\\040"), "\t\n ");
    }

    #[test]
    fn finds_mounted_volumes() {
        let root = tempfile::tempdir().unwrap();
        let uid = PodUid::parse("u1").unwrap();
        let vols = pod_volumes_dir(root.path(), &uid);
        std::fs::create_dir_all(vols.join("kubernetes.io~empty-dir/cache")).unwrap();
        std::fs::create_dir_all(vols.join("kubernetes.io~csi/pvc-1/mount")).unwrap();
        std::fs::create_dir_all(vols.join("kubernetes.io~secret/token")).unwrap();
        let dirs = list_volume_dirs(root.path(), &uid).unwrap();
        assert_eq!(dirs.len(), 3);
        let text = SAMPLE.replace("/var/lib/kubelet", &root.path().display().to_string());
        let mi = root.path().join("mountinfo");
        std::fs::write(&mi, &text).unwrap();
        assert_eq!(
            still_mounted(root.path(), &uid, &mi),
            vec![
                "kubernetes.io~csi/pvc-1".to_string(),
                "kubernetes.io~empty-dir/cache".to_string()
            ]
        );
        // no pod dir: nothing mounted
        let other = PodUid::parse("u2").unwrap();
        assert!(still_mounted(root.path(), &other, &mi).is_empty());
        // unreadable mountinfo counts as mounted
        assert_eq!(
            still_mounted(root.path(), &uid, &root.path().join("nope")).len(),
            1
        );
    }

    #[tokio::test(start_paused = true)]
    async fn wait_is_bounded() {
        let root = tempfile::tempdir().unwrap();
        let uid = PodUid::parse("u1").unwrap();
        std::fs::create_dir_all(
            pod_volumes_dir(root.path(), &uid).join("kubernetes.io~empty-dir/cache"),
        )
        .unwrap();
        let mi = root.path().join("mountinfo");
        std::fs::write(
            &mi,
            SAMPLE.replace("/var/lib/kubelet", &root.path().display().to_string()),
        )
        .unwrap();
        let r = wait_unmounted(
            root.path(),
            &uid,
            &mi,
            Duration::from_millis(200),
            Duration::from_secs(2),
        )
        .await;
        match r {
            Err(VolumeError::StillMounted { volumes, .. }) => {
                assert_eq!(volumes, vec!["kubernetes.io~empty-dir/cache".to_string()])
            }
            Ok(()) => panic!("must not succeed while mounted"),
        }
        std::fs::write(&mi, "").unwrap();
        wait_unmounted(
            root.path(),
            &uid,
            &mi,
            Duration::from_millis(200),
            Duration::from_secs(2),
        )
        .await
        .unwrap();
    }

    #[test]
    fn orphan_pod_dirs_are_removed_only_without_mounts_and_never_through_symlinks() {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("precious"), "keep").unwrap();
        let pods = root.path().join("pods");
        let plain = PodUid::parse("plain").unwrap();
        let held = PodUid::parse("held").unwrap();
        let link = PodUid::parse("link").unwrap();
        let dir = pod_dir(root.path(), &plain);
        std::fs::create_dir_all(dir.join("volumes/kubernetes.io~empty-dir/a/b")).unwrap();
        std::fs::create_dir_all(dir.join("containers/app")).unwrap();
        std::fs::write(dir.join("containers/app/f"), "x").unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.join("out")).unwrap();
        let hdir = pod_dir(root.path(), &held);
        std::fs::create_dir_all(hdir.join("volumes/kubernetes.io~csi/pvc/mount")).unwrap();
        std::os::unix::fs::symlink(outside.path(), pods.join("link")).unwrap();
        std::fs::create_dir_all(pods.join("not a uid")).unwrap();
        let mut uids = pod_dir_uids(root.path()).unwrap();
        uids.sort();
        assert_eq!(uids, vec![held.clone(), link.clone(), plain.clone()]);
        let mounts = parse_mountinfo(&format!(
            "91 22 0:51 / {}/volumes/kubernetes.io~csi/pvc/mount rw - ext4 /dev/sdb rw\n",
            hdir.display()
        ));
        assert_eq!(
            remove_orphan_pod_dir(root.path(), &plain, &mounts).unwrap(),
            OrphanDir::Removed
        );
        assert!(!dir.exists());
        assert_eq!(
            remove_orphan_pod_dir(root.path(), &held, &mounts).unwrap(),
            OrphanDir::Mounted(vec![PathBuf::from("volumes/kubernetes.io~csi/pvc/mount")])
        );
        assert!(hdir.join("volumes/kubernetes.io~csi/pvc/mount").exists());
        assert_eq!(
            remove_orphan_pod_dir(root.path(), &link, &mounts).unwrap(),
            OrphanDir::NotADirectory
        );
        assert!(outside.path().join("precious").exists());
        // idempotent
        assert_eq!(
            remove_orphan_pod_dir(root.path(), &plain, &mounts).unwrap(),
            OrphanDir::Removed
        );
        assert!(pods.join("not a uid").exists());
    }

    #[test]
    fn volume_data_is_never_deleted() {
        let root = tempfile::tempdir().unwrap();
        let uid = PodUid::parse("d1").unwrap();
        let data = pod_dir(root.path(), &uid).join("volumes/kubernetes.io~local-volume/pv/mount");
        std::fs::create_dir_all(&data).unwrap();
        std::fs::write(data.join("precious"), b"x").unwrap();
        let r = remove_orphan_pod_dir(root.path(), &uid, &[]).unwrap();
        assert!(matches!(r, OrphanDir::VolumeData(_)), "{r:?}");
        assert!(data.join("precious").exists());
        // volume-subpaths: left alone too
        let uid2 = PodUid::parse("d2").unwrap();
        std::fs::create_dir_all(pod_dir(root.path(), &uid2).join("volume-subpaths/x")).unwrap();
        let r = remove_orphan_pod_dir(root.path(), &uid2, &[]).unwrap();
        assert_eq!(r, OrphanDir::VolumeData("volume-subpaths".into()));
        // empty volume directories and other files go
        let uid3 = PodUid::parse("d3").unwrap();
        let d3 = pod_dir(root.path(), &uid3);
        std::fs::create_dir_all(d3.join("volumes/kubernetes.io~empty-dir/cache")).unwrap();
        std::fs::write(d3.join("etc-hosts"), b"127.0.0.1").unwrap();
        assert_eq!(
            remove_orphan_pod_dir(root.path(), &uid3, &[]).unwrap(),
            OrphanDir::Removed
        );
        assert!(!d3.exists());
    }
}
