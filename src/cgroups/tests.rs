//! Cgroup paths, hierarchies and teardown against fake roots.

use super::*;

fn uid() -> PodUid {
    PodUid::parse("0b2f4c1e-8f0a-4a52-9d61-3f2f0b1c2d3e").unwrap()
}

#[test]
fn cgroupfs_names() {
    let n = CgroupNaming::new(CgroupDriver::Cgroupfs, "/").unwrap();
    let u = uid();
    assert_eq!(
        n.pod_cgroup(&u, QosClass::Guaranteed),
        PathBuf::from(format!("kubepods/pod{u}"))
    );
    assert_eq!(
        n.pod_cgroup(&u, QosClass::Burstable),
        PathBuf::from(format!("kubepods/burstable/pod{u}"))
    );
    assert_eq!(
        n.pod_cgroup(&u, QosClass::BestEffort),
        PathBuf::from(format!("kubepods/besteffort/pod{u}"))
    );
    let n = CgroupNaming::new(CgroupDriver::Cgroupfs, "/reaplet-testbed").unwrap();
    assert_eq!(
        n.pod_cgroup(&u, QosClass::BestEffort),
        PathBuf::from(format!("reaplet-testbed/kubepods/besteffort/pod{u}"))
    );
}

#[test]
fn systemd_names() {
    let n = CgroupNaming::new(CgroupDriver::Systemd, "/").unwrap();
    let u = uid();
    let us = u.as_str().replace('-', "_");
    assert_eq!(
        n.pod_cgroup(&u, QosClass::Burstable),
        PathBuf::from(format!(
            "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{us}.slice"
        ))
    );
    assert_eq!(
        n.pod_cgroup(&u, QosClass::BestEffort),
        PathBuf::from(format!(
            "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{us}.slice"
        ))
    );
    assert_eq!(
        n.pod_cgroup(&u, QosClass::Guaranteed),
        PathBuf::from(format!("kubepods.slice/kubepods-pod{us}.slice"))
    );
    let n = CgroupNaming::new(CgroupDriver::Systemd, "/custom.slice").unwrap();
    assert_eq!(
        n.pod_cgroup(&u, QosClass::Guaranteed),
        PathBuf::from(format!(
            "custom.slice/custom-kubepods.slice/custom-kubepods-pod{us}.slice"
        ))
    );
}

proptest::proptest! {
    #[test]
    fn pod_cgroup_paths_never_leave_the_root(
        uid in "\\PC{0,70}",
        systemd in proptest::bool::ANY,
        root in "(/[a-z0-9_-]{1,8}){0,3}",
    ) {
        let Ok(uid) = PodUid::parse(&uid) else { return Ok(()) };
        let (driver, root) = if systemd {
            (CgroupDriver::Systemd, root.split('/').filter(|s| !s.is_empty()).map(|s| format!("/{s}.slice")).collect::<String>())
        } else {
            (CgroupDriver::Cgroupfs, root)
        };
        let root = if root.is_empty() { "/".to_string() } else { root };
        // a root that is not a valid name is refused up front (config validation)
        let Ok(naming) = CgroupNaming::new(driver, &root) else { return Ok(()) };
        let mount = Path::new("/sys/fs/cgroup/memory");
        for qos in [QosClass::Guaranteed, QosClass::Burstable, QosClass::BestEffort] {
            let rel = naming.pod_cgroup(&uid, qos);
            let full = contained(mount, &naming.root_path(), &rel).unwrap();
            proptest::prop_assert!(full.starts_with(mount.join(naming.root_path())));
            proptest::prop_assert_eq!(full.components().count(), mount.components().count() + rel.components().count());
        }
    }
}

#[test]
fn bad_roots_rejected() {
    for r in ["relative", "/a/../b", "/a/./b", "/a b"] {
        assert!(CgroupNaming::new(CgroupDriver::Cgroupfs, r).is_err(), "{r}");
    }
    assert!(CgroupNaming::new(CgroupDriver::Systemd, "/notaslice").is_err());
}

#[test]
fn contained_refuses_escape() {
    let m = Path::new("/sys/fs/cgroup/memory");
    assert!(contained(m, Path::new(""), Path::new("kubepods/pod1")).is_ok());
    assert!(contained(m, Path::new(""), Path::new("../x")).is_err());
    assert!(contained(m, Path::new(""), Path::new("/etc")).is_err());
    assert!(contained(m, Path::new("root"), Path::new("other/x")).is_err());
}

#[test]
fn hierarchies_and_mode_from_mountinfo() {
    let text = "\
35 22 0:30 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
36 22 0:31 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw
37 22 0:32 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,name=systemd
38 22 0:33 / /tmp rw - tmpfs tmpfs rw
";
    let h = hierarchies(&crate::volumes::parse_mountinfo(text));
    assert_eq!(h.len(), 3);
    assert_eq!(mode(&h), CgroupMode::Hybrid);
    assert_eq!(mode(&h[..1]), CgroupMode::V1);
    assert_eq!(mode(&[]), CgroupMode::None);
}

#[test]
fn kill_member_signals_only_listed_live_pids() {
    use std::os::unix::process::ExitStatusExt;
    let dir = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    // not a member: left alone
    std::fs::write(dir.path().join("cgroup.procs"), "1\n").unwrap();
    assert!(!kill_member(dir.path(), pid));
    assert!(
        child.try_wait().unwrap().is_none(),
        "a non-member was signalled"
    );
    // a member: SIGKILLed
    std::fs::write(dir.path().join("cgroup.procs"), format!("{pid}\n")).unwrap();
    assert!(kill_member(dir.path(), pid));
    assert_eq!(child.wait().unwrap().signal(), Some(9));
    // no such process (above pid_max, so never reused): ESRCH means done, nothing sent
    std::fs::write(dir.path().join("cgroup.procs"), format!("{}\n", i32::MAX)).unwrap();
    assert!(!kill_member(dir.path(), i32::MAX));
    assert!(!kill_member(dir.path(), 0));
}

#[tokio::test]
async fn destroy_against_fake_root_removes_empty_tree() {
    // a fake hierarchy: plain directories (no processes) behave like emptied cgroups
    let root = tempfile::tempdir().unwrap();
    let naming = CgroupNaming::new(CgroupDriver::Cgroupfs, "/").unwrap();
    let m = CgroupManager::new(
        vec![Hierarchy {
            mount_point: root.path().to_owned(),
            version: CgroupVersion::V1,
        }],
        naming.clone(),
    );
    let u = uid();
    let pod = root.path().join(naming.pod_cgroup(&u, QosClass::Burstable));
    std::fs::create_dir_all(pod.join("container1")).unwrap();
    std::fs::create_dir_all(pod.join("sandbox")).unwrap();
    let sibling = root.path().join("kubepods/burstable/podother");
    std::fs::create_dir_all(&sibling).unwrap();
    let r = m.destroy(&u).await.unwrap();
    assert_eq!(r.removed_dirs, 3);
    assert!(!pod.exists());
    assert!(sibling.exists(), "another pod's cgroup must stay");
    // idempotent
    assert_eq!(m.destroy(&u).await.unwrap(), DestroyReport::default());
}

#[tokio::test]
async fn systemd_driver_without_a_bus_still_removes_the_slice_directories() {
    let root = tempfile::tempdir().unwrap();
    let naming = CgroupNaming::new(CgroupDriver::Systemd, "/").unwrap();
    let bus = root.path().join("no-bus");
    let m = CgroupManager::new(
        vec![Hierarchy {
            mount_point: root.path().join("fs"),
            version: CgroupVersion::V2,
        }],
        naming.clone(),
    )
    .with_systemd(Arc::new(Systemd::new(&bus)));
    let u = uid();
    let pod = root
        .path()
        .join("fs")
        .join(naming.pod_cgroup(&u, QosClass::BestEffort));
    assert!(pod.ends_with(format!(
        "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice",
        u.as_str().replace('-', "_")
    )));
    std::fs::create_dir_all(pod.join("cri-containerd-abc.scope")).unwrap();
    let r = m.destroy(&u).await.unwrap();
    assert_eq!((r.removed_dirs, r.stopped_units), (2, 0));
    assert!(!pod.exists());
    assert!(pod.parent().unwrap().exists(), "the QoS slice stays");
}

#[test]
fn pod_uids_lists_every_pod_cgroup_of_both_drivers_and_all_qos_classes() {
    let u = uid();
    let other = PodUid::parse("1c0ffee0-0000-4000-8000-000000000001").unwrap();
    for (driver, root) in [
        (CgroupDriver::Cgroupfs, "/reaplet-testbed"),
        (CgroupDriver::Systemd, "/custom.slice"),
    ] {
        let fs = tempfile::tempdir().unwrap();
        let naming = CgroupNaming::new(driver, root).unwrap();
        let hs: Vec<Hierarchy> = ["memory", "unified"]
            .iter()
            .map(|h| Hierarchy {
                mount_point: fs.path().join(h),
                version: CgroupVersion::V1,
            })
            .collect();
        let m = CgroupManager::new(hs.clone(), naming.clone());
        assert_eq!(
            m.pod_uids().unwrap(),
            Vec::<PodUid>::new(),
            "no QoS parents yet"
        );
        // u in two hierarchies and two classes, other only as best-effort in one
        for h in &hs {
            std::fs::create_dir_all(
                h.mount_point
                    .join(naming.pod_cgroup(&u, QosClass::Burstable)),
            )
            .unwrap();
        }
        std::fs::create_dir_all(
            hs[0]
                .mount_point
                .join(naming.pod_cgroup(&u, QosClass::Guaranteed)),
        )
        .unwrap();
        let o = hs[1]
            .mount_point
            .join(naming.pod_cgroup(&other, QosClass::BestEffort));
        std::fs::create_dir_all(o.join("container")).unwrap();
        // not pod cgroups: a container's, a foreign name, a file, a name that is no UID
        let qos_parent = o.parent().unwrap();
        std::fs::create_dir_all(qos_parent.join("not-a-pod")).unwrap();
        std::fs::create_dir_all(qos_parent.join("pod")).unwrap();
        std::fs::create_dir_all(qos_parent.join("pod..")).unwrap();
        std::fs::write(qos_parent.join("podfile"), "").unwrap();
        let mut want = vec![u.clone(), other.clone()];
        want.sort();
        assert_eq!(m.pod_uids().unwrap(), want, "{driver:?}");
    }
}

#[test]
fn uid_of_round_trips_pod_cgroup_names_only() {
    let u = uid();
    for driver in [CgroupDriver::Cgroupfs, CgroupDriver::Systemd] {
        let n = CgroupNaming::new(driver, "/").unwrap();
        for qos in [
            QosClass::Guaranteed,
            QosClass::Burstable,
            QosClass::BestEffort,
        ] {
            let rel = n.pod_cgroup(&u, qos);
            let name = rel.file_name().unwrap().to_str().unwrap();
            assert_eq!(n.uid_of(name, qos), Some(u.clone()), "{driver:?} {qos:?}");
        }
        // with the systemd driver the name says the class: a besteffort slice is not a
        // burstable one (with cgroupfs the QoS parent directory says it)
        let be = n.pod_cgroup(&u, QosClass::BestEffort);
        let be = be.file_name().unwrap().to_str().unwrap();
        if driver == CgroupDriver::Systemd {
            assert_eq!(n.uid_of(be, QosClass::Burstable), None);
        }
        assert_eq!(n.uid_of("kubepods.slice", QosClass::Guaranteed), None);
        assert_eq!(
            n.uid_of("cri-containerd-abc.scope", QosClass::Guaranteed),
            None
        );
    }
}

#[tokio::test]
async fn no_systemd_means_no_pod_slice_units() {
    let naming = CgroupNaming::new(CgroupDriver::Cgroupfs, "/").unwrap();
    let m = CgroupManager::new(Vec::new(), naming);
    assert!(m.pod_slice_uids().await.unwrap().is_empty());
}

#[test]
fn thaw_thaws_every_directory_of_the_walk_and_writes_nothing_outside_the_freezer() {
    let root = tempfile::tempdir().unwrap();
    let freezer = root.path().join("freezer/pod");
    std::fs::create_dir_all(freezer.join("c1")).unwrap();
    for d in [&freezer, &freezer.join("c1")] {
        std::fs::write(d.join("freezer.state"), "FROZEN\n").unwrap();
    }
    let tree = walk_post_order(&freezer);
    assert_eq!(tree, [freezer.join("c1"), freezer.clone()]);
    thaw_v1(&freezer, &tree);
    for d in &tree {
        assert_eq!(
            std::fs::read_to_string(d.join("freezer.state")).unwrap(),
            "THAWED"
        );
    }
    // another hierarchy: no freezer.state at its top, nothing is written anywhere below it
    let memory = root.path().join("memory/pod");
    std::fs::create_dir_all(memory.join("c1")).unwrap();
    thaw_v1(&memory, &walk_post_order(&memory));
    assert!(!memory.join("freezer.state").exists());
    assert!(!memory.join("c1/freezer.state").exists());
}
