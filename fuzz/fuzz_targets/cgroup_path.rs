//! A pod UID and a cgroup root (first line, second line) -> pod cgroup paths, which never
//! leave `<hierarchy>/<cgroup root>`.
#![no_main]
use libfuzzer_sys::fuzz_target;
use reaplet::cgroups::{CgroupDriver, CgroupNaming, contained};
use reaplet::pod::{PodUid, QosClass};
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut lines = text.lines();
    let Ok(uid) = PodUid::parse(lines.next().unwrap_or_default()) else {
        return;
    };
    let root = lines.next().unwrap_or("/");
    for driver in [CgroupDriver::Cgroupfs, CgroupDriver::Systemd] {
        let Ok(naming) = CgroupNaming::new(driver, root) else {
            continue;
        };
        for qos in [QosClass::Guaranteed, QosClass::Burstable, QosClass::BestEffort] {
            let rel = naming.pod_cgroup(&uid, qos);
            let mount = Path::new("/sys/fs/cgroup/memory");
            let full = contained(mount, &naming.root_path(), &rel).expect("a built path is contained");
            assert!(full.starts_with(mount.join(naming.root_path())));
        }
    }
});
