use super::mountinfo::unescape;
use super::*;
use std::sync::{Arc, Mutex};

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

/// A settle with no teardown state of interest.
async fn settle_once(
    root: &Path,
    uid: &PodUid,
    mi: &Path,
    active: bool,
    unmounter: Arc<dyn Unmount>,
    bound: Duration,
) -> Result<(), VolumeError> {
    settle(Settle {
        root_dir: root.to_owned(),
        uid: uid.clone(),
        mountinfo: mi.to_owned(),
        poll: Duration::from_millis(200),
        bound,
        active: Arc::new(move || active),
        unmounter,
        state: Arc::default(),
        report: Arc::new(|_| {}),
    })
    .await
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
    // passive: only waits, and names what it waited for
    let never = Arc::new(FakeMounts::new(&mi));
    let passive = || {
        settle_once(
            root.path(),
            &uid,
            &mi,
            false,
            never.clone(),
            Duration::from_secs(2),
        )
    };
    match passive().await {
        Err(VolumeError::StillMounted { volumes, .. }) => assert_eq!(
            volumes,
            vec![Held {
                volume: "kubernetes.io~empty-dir/cache".into(),
                plugin: "kubernetes.io/empty-dir".into(),
                why: Why::Mounted,
            }]
        ),
        Ok(()) => panic!("must not succeed while mounted"),
    }
    assert!(never.calls().is_empty(), "a passive wait unmounted");
    std::fs::write(&mi, "").unwrap();
    passive().await.unwrap();
}

/// An unmounter that removes the mount from a fixture mountinfo (or fails with `errno` for
/// paths listed in `fail`), recording every call.
struct FakeMounts {
    mi: PathBuf,
    calls: Mutex<Vec<PathBuf>>,
    fail: Mutex<Vec<(PathBuf, rustix::io::Errno)>>,
}

impl FakeMounts {
    fn new(mi: &Path) -> Self {
        Self {
            mi: mi.to_owned(),
            calls: Mutex::default(),
            fail: Mutex::default(),
        }
    }
    fn calls(&self) -> Vec<PathBuf> {
        self.calls.lock().unwrap().clone()
    }
}

impl Unmount for FakeMounts {
    fn unmount(&self, path: &Path) -> Result<(), rustix::io::Errno> {
        self.calls.lock().unwrap().push(path.to_owned());
        if let Some((_, e)) = self.fail.lock().unwrap().iter().find(|(p, _)| p == path) {
            return Err(*e);
        }
        let text = std::fs::read_to_string(&self.mi).unwrap();
        let canon = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned());
        let mut lines: Vec<&str> = text.lines().collect();
        // the top mount of that path (the last one listed)
        match lines.iter().rposition(|l| {
            parse_mountinfo(l)
                .first()
                .is_some_and(|m| m.mount_point == canon || m.mount_point == path)
        }) {
            Some(i) => {
                lines.remove(i);
                std::fs::write(&self.mi, lines.join("\n") + "\n").unwrap();
                Ok(())
            }
            None => Err(rustix::io::Errno::INVAL),
        }
    }
}

fn mount_line(id: u32, path: &Path, fs: &str) -> String {
    format!("{id} 22 0:{id} / {} rw - {fs} {fs} rw\n", path.display())
}

/// A pod laid out as the kubelet lays it out: node-local volumes (tmpfs or directories), a
/// subPath bind mount, a CSI volume and an NFS one.
struct Layout {
    root: tempfile::TempDir,
    uid: PodUid,
    mi: PathBuf,
}

impl Layout {
    fn new() -> Self {
        let root = tempfile::tempdir().unwrap();
        let uid = PodUid::parse("0b9e6a43-1c2d-4e5f-8a9b-0c1d2e3f4a5b").unwrap();
        let vols = pod_volumes_dir(root.path(), &uid);
        let mut mi = String::from("22 1 254:0 / / rw - ext4 /dev/vda rw\n");
        for (i, (plugin, name, fs)) in [
            ("kubernetes.io~secret", "creds", Some("tmpfs")),
            ("kubernetes.io~configmap", "conf", Some("tmpfs")),
            (
                "kubernetes.io~projected",
                "kube-api-access-x1",
                Some("tmpfs"),
            ),
            ("kubernetes.io~downward-api", "info", Some("tmpfs")),
            ("kubernetes.io~empty-dir", "mem", Some("tmpfs")),
            ("kubernetes.io~empty-dir", "disk", None),
            ("kubernetes.io~nfs", "share", Some("nfs4")),
        ]
        .into_iter()
        .enumerate()
        {
            let d = vols.join(plugin).join(name);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("data"), "x").unwrap();
            if let Some(fs) = fs {
                mi += &mount_line(100 + i as u32, &d, fs);
            }
        }
        let csi = vols.join("kubernetes.io~csi/pvc-1/mount");
        std::fs::create_dir_all(&csi).unwrap();
        std::fs::write(csi.join("db"), "precious").unwrap();
        mi += &mount_line(200, &csi, "ext4");
        // a subPath of the CSI volume, bind-mounted for container "app" (a directory) and a
        // file subPath of the configMap
        let sub = pod_dir(root.path(), &uid).join("volume-subpaths");
        std::fs::create_dir_all(sub.join("data/app/0")).unwrap();
        std::fs::create_dir_all(sub.join("conf/app")).unwrap();
        std::fs::write(sub.join("conf/app/1"), "").unwrap();
        mi += &mount_line(201, &sub.join("data/app/0"), "ext4");
        mi += &mount_line(202, &sub.join("conf/app/1"), "tmpfs");
        let mi_path = root.path().join("mountinfo");
        std::fs::write(&mi_path, mi).unwrap();
        Self {
            uid,
            mi: mi_path,
            root,
        }
    }
    fn vols(&self) -> PathBuf {
        pod_volumes_dir(self.root.path(), &self.uid)
    }
    fn pass(
        &self,
        um: &dyn Unmount,
        state: &mut TeardownState,
        reports: &mut Vec<Held>,
    ) -> Vec<Held> {
        teardown::pass(
            self.root.path(),
            &self.uid,
            &self.mi,
            um,
            state,
            Instant::now(),
            &|| true,
            &mut |h| reports.push(h.clone()),
        )
    }
}

#[tokio::test(start_paused = true)]
async fn node_local_volumes_are_torn_down_and_others_never_touched() {
    let l = Layout::new();
    let um = FakeMounts::new(&l.mi);
    let mut state = TeardownState::default();
    let mut reports = Vec::new();
    let held = l.pass(&um, &mut state, &mut reports);
    // left: the CSI and NFS volumes, each named with its plugin
    assert_eq!(
        held,
        vec![
            Held {
                volume: "kubernetes.io~csi/pvc-1".into(),
                plugin: "kubernetes.io/csi".into(),
                why: Why::NotNodeLocal
            },
            Held {
                volume: "kubernetes.io~nfs/share".into(),
                plugin: "kubernetes.io/nfs".into(),
                why: Why::NotNodeLocal
            },
        ]
    );
    assert!(reports.is_empty());
    let calls = um.calls();
    // never an unmount of a non-node-local volume, only below the pod's directories
    for c in &calls {
        assert!(c.starts_with(l.root.path()), "{c:?}");
        assert!(
            !c.to_string_lossy().contains("~csi") && !c.to_string_lossy().contains("~nfs"),
            "a network or CSI volume was unmounted: {c:?}"
        );
    }
    // the subPaths (both, including the CSI one's bind mount) and the five tmpfs volumes, each
    // at its own path: never with a trailing slash (which makes the kernel follow a symlink
    // in the last component, UMOUNT_NOFOLLOW or not)
    assert_eq!(calls.len(), 7, "{calls:?}");
    for c in &calls {
        use std::os::unix::ffi::OsStrExt;
        assert!(!c.as_os_str().as_bytes().ends_with(b"/"), "{c:?}");
    }
    assert!(calls[0].to_string_lossy().contains("volume-subpaths"));
    assert!(calls[1].to_string_lossy().contains("volume-subpaths"));
    // node-local directories removed, the others and their data untouched
    for gone in [
        "kubernetes.io~secret/creds",
        "kubernetes.io~configmap/conf",
        "kubernetes.io~projected/kube-api-access-x1",
        "kubernetes.io~downward-api/info",
        "kubernetes.io~empty-dir/mem",
        "kubernetes.io~empty-dir/disk",
    ] {
        assert!(!l.vols().join(gone).exists(), "{gone} left");
    }
    assert!(
        !pod_dir(l.root.path(), &l.uid)
            .join("volume-subpaths")
            .exists()
    );
    assert_eq!(
        std::fs::read_to_string(l.vols().join("kubernetes.io~csi/pvc-1/mount/db")).unwrap(),
        "precious"
    );
    assert!(l.vols().join("kubernetes.io~nfs/share/data").exists());
    // idempotent: a second pass unmounts nothing and says the same
    let again = l.pass(&um, &mut state, &mut reports);
    assert_eq!(again, held);
    assert_eq!(um.calls().len(), 7);
    // once the driver has unmounted them, nothing is held (the dirs stay: not ours)
    std::fs::write(&l.mi, "22 1 254:0 / / rw - ext4 /dev/vda rw\n").unwrap();
    assert!(l.pass(&um, &mut state, &mut reports).is_empty());
    assert!(l.vols().join("kubernetes.io~csi/pvc-1/mount/db").exists());
}

#[tokio::test(start_paused = true)]
async fn a_failed_unmount_backs_off_and_is_reported_once() {
    let l = Layout::new();
    let um = FakeMounts::new(&l.mi);
    let secret = l.vols().join("kubernetes.io~secret/creds");
    um.fail
        .lock()
        .unwrap()
        .push((secret.clone(), rustix::io::Errno::BUSY));
    let mut state = TeardownState::default();
    let mut reports = Vec::new();
    let tries = |um: &FakeMounts| um.calls().iter().filter(|c| **c == secret).count();
    let held = l.pass(&um, &mut state, &mut reports);
    assert!(held.iter().any(|h| h.volume == "kubernetes.io~secret/creds"
        && matches!(h.why, Why::UnmountFailed { errno, .. } if errno == rustix::io::Errno::BUSY.raw_os_error())));
    assert!(secret.join("data").exists(), "removed while mounted");
    assert_eq!(tries(&um), 1);
    // within the backoff: not retried
    tokio::time::advance(Duration::from_millis(500)).await;
    l.pass(&um, &mut state, &mut reports);
    assert_eq!(tries(&um), 1);
    // after it: retried, and failing again is not reported again
    tokio::time::advance(Duration::from_millis(600)).await;
    l.pass(&um, &mut state, &mut reports);
    assert_eq!(tries(&um), 2);
    // doubled: 2 s
    tokio::time::advance(Duration::from_millis(1500)).await;
    l.pass(&um, &mut state, &mut reports);
    assert_eq!(tries(&um), 2);
    assert_eq!(reports.len(), 1, "{reports:?}");
    // the busy mount goes: torn down at the next due pass
    um.fail.lock().unwrap().clear();
    tokio::time::advance(Duration::from_secs(1)).await;
    let held = l.pass(&um, &mut state, &mut reports);
    assert!(held.iter().all(|h| h.why == Why::NotNodeLocal), "{held:?}");
    assert!(!secret.exists());
}

#[tokio::test(start_paused = true)]
async fn symlinks_are_never_followed_or_unmounted_through() {
    let l = Layout::new();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("precious"), "keep").unwrap();
    // a volume directory replaced by a symlink to outside the root dir: not listed (not a
    // directory), never unmounted, its target untouched
    let vol = l.vols().join("kubernetes.io~empty-dir/mem");
    std::fs::remove_dir_all(&vol).unwrap();
    std::os::unix::fs::symlink(outside.path(), &vol).unwrap();
    // a symlink inside a node-local volume, and a mount below it as mountinfo would show it
    // if the link were followed
    let conf = l.vols().join("kubernetes.io~configmap/conf");
    std::os::unix::fs::symlink(outside.path(), conf.join("link")).unwrap();
    let mut mi = std::fs::read_to_string(&l.mi).unwrap();
    mi += &mount_line(300, &conf.join("link"), "tmpfs");
    std::fs::write(&l.mi, mi).unwrap();
    let um = FakeMounts::new(&l.mi);
    let mut state = TeardownState::default();
    let held = l.pass(&um, &mut state, &mut Vec::new());
    assert!(
        held.iter()
            .any(|h| h.volume == "kubernetes.io~configmap/conf"
                && matches!(h.why, Why::Unsafe { .. } | Why::Nested { .. })),
        "{held:?}"
    );
    for c in um.calls() {
        assert!(!c.starts_with(&conf), "unmounted through a symlink: {c:?}");
    }
    assert!(
        std::fs::symlink_metadata(&vol)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert_eq!(
        std::fs::read_to_string(outside.path().join("precious")).unwrap(),
        "keep"
    );
    // a subPath's container directory swapped for a symlink: that mount is never unmounted
    let l3 = Layout::new();
    let ctr = pod_dir(l3.root.path(), &l3.uid).join("volume-subpaths/data/app");
    std::fs::rename(&ctr, l3.root.path().join("moved")).unwrap();
    std::os::unix::fs::symlink(l3.root.path().join("moved"), &ctr).unwrap();
    let um3 = FakeMounts::new(&l3.mi);
    let held = l3.pass(&um3, &mut TeardownState::default(), &mut Vec::new());
    assert!(
        !um3.calls().iter().any(|c| c.starts_with(&ctr)),
        "{:?}",
        um3.calls()
    );
    assert!(
        held.iter()
            .any(|h| h.volume == "volume-subpaths/data" && matches!(h.why, Why::Unsafe { .. })),
        "{held:?}"
    );
    // the whole pod directory a symlink: nothing done at all
    let l2 = Layout::new();
    let real = l2.root.path().join("elsewhere");
    let pod = pod_dir(l2.root.path(), &l2.uid);
    std::fs::rename(&pod, &real).unwrap();
    std::os::unix::fs::symlink(&real, &pod).unwrap();
    let um2 = FakeMounts::new(&l2.mi);
    let held = l2.pass(&um2, &mut TeardownState::default(), &mut Vec::new());
    assert!(
        matches!(
            held.as_slice(),
            [Held {
                why: Why::Unsafe { .. },
                ..
            }]
        ),
        "{held:?}"
    );
    assert!(um2.calls().is_empty());
}

#[tokio::test(start_paused = true)]
async fn active_settle_tears_down_and_waits_out_the_rest_within_its_bound() {
    let l = Layout::new();
    let um = Arc::new(FakeMounts::new(&l.mi));
    let r = settle_once(
        l.root.path(),
        &l.uid,
        &l.mi,
        true,
        um.clone(),
        Duration::from_secs(3),
    )
    .await;
    let Err(VolumeError::StillMounted {
        volumes, waited, ..
    }) = r
    else {
        panic!("settled with CSI and NFS mounted: {r:?}");
    };
    assert!(waited >= Duration::from_secs(3) && waited < Duration::from_secs(4));
    assert_eq!(volumes.len(), 2);
    let msg = list(&volumes);
    assert!(
        msg.contains("kubernetes.io~csi/pvc-1 (kubernetes.io/csi): not a node-local volume"),
        "{msg}"
    );
    assert!(!l.vols().join("kubernetes.io~secret/creds").exists());
    // the unmount timeout passed with nothing left: done at once
    std::fs::write(&l.mi, "").unwrap();
    settle_once(l.root.path(), &l.uid, &l.mi, true, um, Duration::ZERO)
        .await
        .unwrap();
}

#[test]
fn plugins_are_classified_by_their_directory() {
    for (dir, local, name) in [
        ("kubernetes.io~empty-dir", true, "kubernetes.io/empty-dir"),
        ("kubernetes.io~secret", true, "kubernetes.io/secret"),
        ("kubernetes.io~configmap", true, "kubernetes.io/configmap"),
        ("kubernetes.io~projected", true, "kubernetes.io/projected"),
        (
            "kubernetes.io~downward-api",
            true,
            "kubernetes.io/downward-api",
        ),
        ("kubernetes.io~csi", false, "kubernetes.io/csi"),
        ("kubernetes.io~nfs", false, "kubernetes.io/nfs"),
        (
            "kubernetes.io~local-volume",
            false,
            "kubernetes.io/local-volume",
        ),
        ("kubernetes.io~git-repo", false, "kubernetes.io/git-repo"),
        ("empty-dir", false, "empty-dir"),
    ] {
        let p = Plugin::from_dir(dir);
        assert_eq!((p.node_local(), p.name()), (local, name), "{dir}");
    }
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

#[test]
fn teardown_needs_the_hosts_mount_namespace_and_cap_sys_admin() {
    let root = Path::new("/var/lib/kubelet");
    let proc = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(proc.path().join("self")).unwrap();
    let write = |mi: &str, cap: &str| {
        std::fs::write(proc.path().join("self/mountinfo"), mi).unwrap();
        std::fs::write(
            proc.path().join("self/status"),
            format!("Name:\treaplet\nCapInh:\t0000000000000000\nCapEff:\t{cap}\n"),
        )
        .unwrap();
    };
    let host = "22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw\n";
    // systemd's ProtectSystem=: the namespace's root mount is a slave of the host's
    let service = "300 250 254:0 / / ro,relatime shared:170 master:1 - ext4 /dev/vda rw\n";
    write(host, "000001ffffffffff");
    assert_eq!(can_tear_down(proc.path(), true, root, false), Ok(()));
    write(service, "000001ffffffffff");
    let e = can_tear_down(proc.path(), true, root, false).unwrap_err();
    assert!(e.contains("mount namespace of its own"), "{e}");
    // the unit's old bounding set: CAP_KILL CAP_DAC_OVERRIDE CAP_DAC_READ_SEARCH CAP_FOWNER
    write(host, "0000000000000026");
    let e = can_tear_down(proc.path(), true, root, false).unwrap_err();
    assert!(e.contains("CAP_SYS_ADMIN"), "{e}");
    write(host, "0000000000200026");
    assert_eq!(can_tear_down(proc.path(), true, root, false), Ok(()));
    // `unshare -m`: a private root mount (neither shared nor a slave)
    write(
        "400 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n",
        "000001ffffffffff",
    );
    let e = can_tear_down(proc.path(), true, root, false).unwrap_err();
    assert!(e.contains("private"), "{e}");
    // without systemd as init the host's own root may be private: not told apart
    assert_eq!(can_tear_down(proc.path(), false, root, false), Ok(()));
    // where both namespace links read, they decide
    std::fs::create_dir_all(proc.path().join("self/ns")).unwrap();
    std::fs::create_dir_all(proc.path().join("1/ns")).unwrap();
    std::os::unix::fs::symlink("mnt:[4026531841]", proc.path().join("self/ns/mnt")).unwrap();
    std::os::unix::fs::symlink("mnt:[4026531840]", proc.path().join("1/ns/mnt")).unwrap();
    std::fs::write(proc.path().join("1/mountinfo"), host).unwrap();
    // a namespace whose root is one peer group with the host's (`unshare -m --propagation
    // shared`): unmounts propagate
    write(host, "000001ffffffffff");
    assert_eq!(can_tear_down(proc.path(), true, root, false), Ok(()));
    write(
        "400 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n",
        "000001ffffffffff",
    );
    let e = can_tear_down(proc.path(), true, root, false).unwrap_err();
    assert!(e.contains("mnt:[4026531841]"), "{e}");
    assert!(
        e.contains("/var/lib/kubelet is not a shared mount here"),
        "{e}"
    );
    // a container (the DaemonSet): the root dir mounted Bidirectional, a peer of the host's
    let on_host = "22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw\n\
                   90 22 254:0 /var/lib/kubelet /var/lib/kubelet rw shared:40 - ext4 /dev/vda rw\n";
    std::fs::write(proc.path().join("1/mountinfo"), on_host).unwrap();
    let bidirectional = "500 400 0:99 / / rw - overlay overlay rw\n\
                         510 500 254:0 /var/lib/kubelet /var/lib/kubelet rw shared:40 - ext4 /dev/vda rw\n";
    write(bidirectional, "000001ffffffffff");
    assert_eq!(can_tear_down(proc.path(), true, root, false), Ok(()));
    // HostToContainer: a slave of the host's, unmounts never go back
    let slave = "500 400 0:99 / / rw - overlay overlay rw\n\
                 510 500 254:0 /var/lib/kubelet /var/lib/kubelet rw master:40 - ext4 /dev/vda rw\n";
    write(slave, "000001ffffffffff");
    let e = can_tear_down(proc.path(), true, root, false).unwrap_err();
    assert!(e.contains("not a shared mount here"), "{e}");
    // shared, but with another group (a shared mount of the container's own making)
    let other = "500 400 0:99 / / rw - overlay overlay rw\n\
                 510 500 254:0 /var/lib/kubelet /var/lib/kubelet rw shared:77 - ext4 /dev/vda rw\n";
    write(other, "000001ffffffffff");
    let e = can_tear_down(proc.path(), true, root, false).unwrap_err();
    assert!(e.contains("peer group 77 here and 40 on the host"), "{e}");
    // one namespace for this process and PID 1: the host's, unless this runs in a pod (no
    // hostPID: PID 1 is the pod's own)
    std::fs::remove_file(proc.path().join("1/ns/mnt")).unwrap();
    std::os::unix::fs::symlink("mnt:[4026531841]", proc.path().join("1/ns/mnt")).unwrap();
    write(host, "000001ffffffffff");
    assert_eq!(can_tear_down(proc.path(), true, root, false), Ok(()));
    let e = can_tear_down(proc.path(), true, root, true).unwrap_err();
    assert!(e.contains("no hostPID"), "{e}");
    // unreadable: an error, never a panic
    std::fs::remove_file(proc.path().join("self/status")).unwrap();
    assert!(can_tear_down(proc.path(), true, root, false).is_err());
}

#[tokio::test(start_paused = true)]
async fn only_the_kubelets_mount_points_are_unmounted() {
    let l = Layout::new();
    let mut mi = std::fs::read_to_string(&l.mi).unwrap();
    // a mount below the emptyDir's tmpfs (a container's bidirectional propagation): nested
    let mem = l.vols().join("kubernetes.io~empty-dir/mem");
    std::fs::create_dir_all(mem.join("inner")).unwrap();
    mi += &mount_line(400, &mem.join("inner"), "tmpfs");
    // the secret's tmpfs mounted twice on the same path: both go
    let secret = l.vols().join("kubernetes.io~secret/creds");
    mi += &mount_line(401, &secret, "tmpfs");
    // a mount propagated below the CSI volume's subPath bind mount: nested, and it holds the
    // configMap? no: the subPath belongs to volume "data"; the configMap's file subPath is fine
    let sub = pod_dir(l.root.path(), &l.uid).join("volume-subpaths/data/app/0");
    std::fs::create_dir_all(sub.join("x")).unwrap();
    mi += &mount_line(402, &sub.join("x"), "tmpfs");
    std::fs::write(&l.mi, mi).unwrap();
    let um = FakeMounts::new(&l.mi);
    let mut state = TeardownState::default();
    let held = l.pass(&um, &mut state, &mut Vec::new());
    let calls = um.calls();
    assert!(
        !calls.contains(&mem.join("inner")),
        "a nested mount was unmounted"
    );
    assert!(
        !calls.contains(&sub.join("x")),
        "a mount below a subPath was unmounted"
    );
    assert!(
        !calls.contains(&sub),
        "a subPath with a mount below it was unmounted"
    );
    assert_eq!(
        calls.iter().filter(|c| **c == secret).count(),
        2,
        "{calls:?}"
    );
    assert!(!secret.exists());
    let why = |v: &str| held.iter().find(|h| h.volume == v).map(|h| h.why.clone());
    assert!(
        matches!(why("kubernetes.io~empty-dir/mem"), Some(Why::Nested { .. })),
        "{held:?}"
    );
    assert!(
        matches!(why("volume-subpaths/data"), Some(Why::Nested { .. })),
        "{held:?}"
    );
    assert!(
        mem.join("data").exists(),
        "a volume with a nested mount was removed"
    );
    // the subPath tree stays while one of its mounts is held
    assert!(sub.exists());
}

#[tokio::test(start_paused = true)]
async fn a_volume_waits_for_its_subpaths_and_a_hand_back_stops_the_pass() {
    let l = Layout::new();
    let conf = l.vols().join("kubernetes.io~configmap/conf");
    let file_sub = pod_dir(l.root.path(), &l.uid).join("volume-subpaths/conf/app/1");
    let um = FakeMounts::new(&l.mi);
    um.fail
        .lock()
        .unwrap()
        .push((file_sub.clone(), rustix::io::Errno::BUSY));
    let mut state = TeardownState::default();
    let held = l.pass(&um, &mut state, &mut Vec::new());
    assert!(
        held.iter()
            .any(|h| h.volume == "kubernetes.io~configmap/conf" && h.why == Why::SubPathMounted),
        "{held:?}"
    );
    assert!(
        !um.calls().contains(&conf),
        "torn down under a live subPath"
    );
    assert!(conf.join("data").exists());
    // a hand-back: the next pass unmounts nothing at all
    let l2 = Layout::new();
    let um2 = FakeMounts::new(&l2.mi);
    let held = teardown::pass(
        l2.root.path(),
        &l2.uid,
        &l2.mi,
        &um2,
        &mut TeardownState::default(),
        Instant::now(),
        &|| false,
        &mut |_| {},
    );
    assert!(um2.calls().is_empty(), "{:?}", um2.calls());
    assert!(!held.is_empty());
    assert!(l2.vols().join("kubernetes.io~empty-dir/disk/data").exists());
}
