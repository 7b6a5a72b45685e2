//! Signal observations and pod usage against fixture proc and cgroup trees (v1 and v2).

use super::*;
use crate::cgroups::CgroupDriver;
use std::fs;

const GI: u64 = 1 << 30;
const MI: u64 = 1 << 20;

fn put(path: &Path, text: &str) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, text).unwrap();
}

fn cgroupfs() -> CgroupNaming {
    CgroupNaming::new(CgroupDriver::Cgroupfs, "/").unwrap()
}

fn systemd() -> CgroupNaming {
    CgroupNaming::new(CgroupDriver::Systemd, "/").unwrap()
}

fn uid() -> PodUid {
    PodUid::parse("0b2f4c1e-8f0a-4a52-9d61-3f2f0b1c2d3e").unwrap()
}

/// A proc root: 16000 MiB of memory, pid_max 4194304, threads-max 126000, 1234 tasks.
fn proc_tree(root: &Path) -> PathBuf {
    let proc = root.join("proc");
    put(
        &proc.join("meminfo"),
        "MemTotal:       16384000 kB\nMemFree:         1000000 kB\nMemAvailable:    9000000 kB\n",
    );
    put(&proc.join("sys/kernel/pid_max"), "4194304\n");
    put(&proc.join("sys/kernel/threads-max"), "126000\n");
    put(&proc.join("loadavg"), "0.52 0.58 0.59 3/1234 56789\n");
    proc
}

const MEM_TOTAL: i64 = 16384000 * 1024;

fn v1_stat(inactive: u64, total_inactive: u64) -> String {
    format!(
        "cache 10\nrss 20\ninactive_file {inactive}\nactive_file 5\n\
         hierarchical_memory_limit 9223372036854771712\n\
         total_cache 100\ntotal_rss 200\ntotal_inactive_file {total_inactive}\ntotal_active_file 7\n"
    )
}

fn v2_stat(anon: u64, file: u64, inactive: u64) -> String {
    format!(
        "anon {anon}\nfile {file}\nkernel 4096\nfile_mapped 999\nfile_dirty 3\n\
         active_anon 1\ninactive_anon 2\nactive_file 3\ninactive_file {inactive}\n"
    )
}

/// A cgroup v1 host: cpu, memory and pids hierarchies; the root uses 6 GiB with 1 GiB of
/// inactive file pages; kubepods is limited to 3 GiB and uses 2 GiB with 512 MiB inactive.
fn v1_host(root: &Path) -> (PathBuf, Vec<Hierarchy>) {
    let proc = proc_tree(root);
    let cg = root.join("sys/fs/cgroup");
    let mem = cg.join("memory");
    put(&mem.join("memory.usage_in_bytes"), &format!("{}\n", 6 * GI));
    put(&mem.join("memory.stat"), &v1_stat(5, GI));
    let pods = mem.join("kubepods");
    put(
        &pods.join("memory.limit_in_bytes"),
        &format!("{}\n", 3 * GI),
    );
    put(
        &pods.join("memory.usage_in_bytes"),
        &format!("{}\n", 2 * GI),
    );
    put(&pods.join("memory.stat"), &v1_stat(7, 512 * MI));
    let h = |name: &str, version| Hierarchy {
        mount_point: cg.join(name),
        version,
    };
    let hierarchies = vec![
        h("cpu,cpuacct", CgroupVersion::V1),
        h("memory", CgroupVersion::V1),
        h("pids", CgroupVersion::V1),
    ];
    (proc, hierarchies)
}

/// A cgroup v2 host (systemd driver): the root has `memory.stat` only (anon 3 GiB, file 2 GiB,
/// inactive_file 1 GiB); kubepods.slice is limited to 4 GiB and uses 1 GiB, 256 MiB inactive.
fn v2_host(root: &Path) -> (PathBuf, Vec<Hierarchy>) {
    let proc = proc_tree(root);
    let cg = root.join("sys/fs/cgroup");
    put(&cg.join("memory.stat"), &v2_stat(3 * GI, 2 * GI, GI));
    put(&cg.join("cgroup.controllers"), "cpu memory pids\n");
    let pods = cg.join("kubepods.slice");
    put(&pods.join("memory.max"), &format!("{}\n", 4 * GI));
    put(&pods.join("memory.current"), &format!("{}\n", GI));
    put(
        &pods.join("memory.stat"),
        &v2_stat(700 * MI, 300 * MI, 256 * MI),
    );
    let hierarchies = vec![Hierarchy {
        mount_point: cg,
        version: CgroupVersion::V2,
    }];
    (proc, hierarchies)
}

fn v1_reader(root: &Path) -> SignalReader {
    let (proc, h) = v1_host(root);
    SignalReader::new(proc, &h, &cgroupfs()).unwrap()
}

fn v2_reader(root: &Path) -> SignalReader {
    let (proc, h) = v2_host(root);
    SignalReader::new(proc, &h, &systemd()).unwrap()
}

fn obs(available: i64, capacity: i64) -> Option<Observation> {
    Some(Observation {
        available,
        capacity,
    })
}

#[test]
fn v1_observations() {
    let t = tempfile::tempdir().unwrap();
    let r = v1_reader(t.path());
    assert_eq!(
        r.hierarchy().mount_point,
        t.path().join("sys/fs/cgroup/memory")
    );
    assert_eq!(r.pods_cgroup(), Path::new("kubepods"));
    let o = r.observe();
    // root working set: usage minus the hierarchical total_inactive_file, not inactive_file
    assert_eq!(o.memory, obs(MEM_TOTAL - 5 * GI as i64, MEM_TOTAL));
    let ws = 2 * GI - 512 * MI;
    assert_eq!(
        o.allocatable_memory,
        obs((3 * GI - ws) as i64, 3 * GI as i64)
    );
    assert_eq!(o.pid, obs(126000 - 1234, 126000));
}

#[test]
fn v2_root_without_memory_current() {
    let t = tempfile::tempdir().unwrap();
    let r = v2_reader(t.path());
    let mount = &r.hierarchy().mount_point;
    assert!(!mount.join("memory.current").exists());
    assert_eq!(r.pods_cgroup(), Path::new("kubepods.slice"));
    let o = r.observe();
    // anon + file - inactive_file = 3 + 2 - 1 GiB
    assert_eq!(o.memory, obs(MEM_TOTAL - 4 * GI as i64, MEM_TOTAL));
    let ws = GI - 256 * MI;
    assert_eq!(
        o.allocatable_memory,
        obs((4 * GI - ws) as i64, 4 * GI as i64)
    );
    assert_eq!(o.pid, obs(126000 - 1234, 126000));
}

#[test]
fn v2_root_memory_current_is_not_read() {
    // the kernel never has it at the root; a stray one changes nothing
    let t = tempfile::tempdir().unwrap();
    let r = v2_reader(t.path());
    put(
        &r.hierarchy().mount_point.join("memory.current"),
        &format!("{}\n", 15 * GI),
    );
    assert_eq!(
        r.observe().memory,
        obs(MEM_TOTAL - 4 * GI as i64, MEM_TOTAL)
    );
}

#[test]
fn v2_max_limit_is_unobserved() {
    let t = tempfile::tempdir().unwrap();
    let r = v2_reader(t.path());
    let pods = r.hierarchy().mount_point.join("kubepods.slice");
    put(&pods.join("memory.max"), "max\n");
    let o = r.observe();
    assert_eq!(o.allocatable_memory, None);
    assert!(o.memory.is_some() && o.pid.is_some());
    // a numeric limit above 2^62 is unlimited on v2 too
    put(
        &pods.join("memory.max"),
        &format!("{}\n", (1u64 << 62) + 4096),
    );
    assert_eq!(r.observe().allocatable_memory, None);
}

#[test]
fn v1_limit_above_2_pow_62_is_unobserved() {
    let t = tempfile::tempdir().unwrap();
    let r = v1_reader(t.path());
    let limit = r
        .hierarchy()
        .mount_point
        .join("kubepods/memory.limit_in_bytes");
    put(&limit, "9223372036854771712\n");
    assert_eq!(r.observe().allocatable_memory, None);
    // exactly 2^62 is still a limit
    put(&limit, &format!("{}\n", 1u64 << 62));
    let ws = 2 * GI - 512 * MI;
    assert_eq!(
        r.observe().allocatable_memory,
        obs(((1u64 << 62) - ws) as i64, 1i64 << 62)
    );
}

#[test]
fn missing_pods_cgroup_is_unobserved() {
    let t = tempfile::tempdir().unwrap();
    let r = v1_reader(t.path());
    fs::remove_dir_all(r.hierarchy().mount_point.join("kubepods")).unwrap();
    let o = r.observe();
    assert_eq!(o.allocatable_memory, None);
    assert!(o.memory.is_some() && o.pid.is_some());

    let t = tempfile::tempdir().unwrap();
    let r = v2_reader(t.path());
    fs::remove_dir_all(r.hierarchy().mount_point.join("kubepods.slice")).unwrap();
    assert_eq!(r.observe().allocatable_memory, None);
}

#[test]
fn limited_pods_cgroup_without_usage_is_unobserved() {
    let t = tempfile::tempdir().unwrap();
    let r = v2_reader(t.path());
    let pods = r.hierarchy().mount_point.join("kubepods.slice");
    fs::remove_file(pods.join("memory.current")).unwrap();
    assert_eq!(r.observe().allocatable_memory, None);
    put(&pods.join("memory.current"), "1\n");
    fs::remove_file(pods.join("memory.stat")).unwrap();
    assert_eq!(r.observe().allocatable_memory, None);
}

#[test]
fn working_set_clamps_at_zero() {
    let t = tempfile::tempdir().unwrap();
    let r = v1_reader(t.path());
    let mem = r.hierarchy().mount_point.clone();
    put(&mem.join("memory.stat"), &v1_stat(0, 7 * GI));
    put(&mem.join("kubepods/memory.stat"), &v1_stat(0, 5 * GI));
    let o = r.observe();
    assert_eq!(o.memory, obs(MEM_TOTAL, MEM_TOTAL));
    assert_eq!(o.allocatable_memory, obs(3 * GI as i64, 3 * GI as i64));

    let t = tempfile::tempdir().unwrap();
    let r = v2_reader(t.path());
    let cg = r.hierarchy().mount_point.clone();
    put(&cg.join("memory.stat"), &v2_stat(GI, GI, 3 * GI));
    put(
        &cg.join("kubepods.slice/memory.stat"),
        &v2_stat(0, 0, 2 * GI),
    );
    let o = r.observe();
    assert_eq!(o.memory, obs(MEM_TOTAL, MEM_TOTAL));
    assert_eq!(o.allocatable_memory, obs(4 * GI as i64, 4 * GI as i64));
}

#[test]
fn working_set_above_limit_is_negative_available() {
    let t = tempfile::tempdir().unwrap();
    let r = v1_reader(t.path());
    let mem = r.hierarchy().mount_point.clone();
    put(
        &mem.join("kubepods/memory.usage_in_bytes"),
        &format!("{}\n", 4 * GI),
    );
    put(&mem.join("kubepods/memory.stat"), &v1_stat(0, 0));
    assert_eq!(
        r.observe().allocatable_memory,
        obs(-(GI as i64), 3 * GI as i64)
    );
}

#[test]
fn missing_inactive_key_subtracts_nothing() {
    let t = tempfile::tempdir().unwrap();
    let r = v1_reader(t.path());
    let mem = r.hierarchy().mount_point.clone();
    put(&mem.join("memory.stat"), "cache 1\nrss 2\n");
    assert_eq!(
        r.observe().memory,
        obs(MEM_TOTAL - 6 * GI as i64, MEM_TOTAL)
    );
}

#[test]
fn malformed_stat_value_is_unobserved() {
    let t = tempfile::tempdir().unwrap();
    let r = v2_reader(t.path());
    let cg = r.hierarchy().mount_point.clone();
    put(&cg.join("memory.stat"), "anon 1\nfile x\ninactive_file 0\n");
    assert_eq!(r.observe().memory, None);
    // a malformed key nobody reads does not matter
    put(
        &cg.join("memory.stat"),
        "anon 1\nfile 2\nkernel x\ninactive_file 0\n",
    );
    assert_eq!(r.observe().memory, obs(MEM_TOTAL - 3, MEM_TOTAL));
}

#[test]
fn memory_needs_meminfo_and_root_stats() {
    let t = tempfile::tempdir().unwrap();
    let (proc, h) = v1_host(t.path());
    let r = SignalReader::new(proc.clone(), &h, &cgroupfs()).unwrap();
    fs::remove_file(proc.join("meminfo")).unwrap();
    let o = r.observe();
    assert_eq!(o.memory, None);
    assert!(o.allocatable_memory.is_some() && o.pid.is_some());
    put(&proc.join("meminfo"), "MemTotal: 1024 kB\n");
    assert!(r.observe().memory.is_some());
    fs::remove_file(r.hierarchy().mount_point.join("memory.usage_in_bytes")).unwrap();
    assert_eq!(r.observe().memory, None);

    let t = tempfile::tempdir().unwrap();
    let r = v2_reader(t.path());
    fs::remove_file(r.hierarchy().mount_point.join("memory.stat")).unwrap();
    assert_eq!(r.observe().memory, None);
}

#[test]
fn pid_max_is_the_smaller_readable_limit() {
    let t = tempfile::tempdir().unwrap();
    let (proc, h) = v2_host(t.path());
    let r = SignalReader::new(proc.clone(), &h, &systemd()).unwrap();
    let kernel = proc.join("sys/kernel");
    // pid_max smaller this time
    put(&kernel.join("pid_max"), "32768\n");
    assert_eq!(r.observe().pid, obs(32768 - 1234, 32768));
    // a missing file is skipped
    fs::remove_file(kernel.join("pid_max")).unwrap();
    assert_eq!(r.observe().pid, obs(126000 - 1234, 126000));
    // so is a malformed one
    put(&kernel.join("pid_max"), "lots\n");
    assert_eq!(r.observe().pid, obs(126000 - 1234, 126000));
    put(&kernel.join("pid_max"), "1000\n");
    fs::remove_file(kernel.join("threads-max")).unwrap();
    assert_eq!(r.observe().pid, obs(1000 - 1234, 1000));
    // neither: no observation
    fs::remove_file(kernel.join("pid_max")).unwrap();
    assert_eq!(r.observe().pid, None);
}

#[test]
fn pid_needs_loadavg() {
    let t = tempfile::tempdir().unwrap();
    let (proc, h) = v1_host(t.path());
    let r = SignalReader::new(proc.clone(), &h, &cgroupfs()).unwrap();
    for bad in [
        "0.52 0.58 0.59\n",
        "0.52 0.58 0.59 1234 56789\n",
        "0.52 0.58 0.59 3/x 56789\n",
        "0.52 0.58 0.59 3/4/5 56789\n",
        "",
    ] {
        put(&proc.join("loadavg"), bad);
        assert_eq!(r.observe().pid, None, "{bad:?}");
    }
    fs::remove_file(proc.join("loadavg")).unwrap();
    assert_eq!(r.observe().pid, None);
    // no trailing fields needed beyond the fourth
    put(&proc.join("loadavg"), "0 0 0 1/99");
    assert_eq!(r.observe().pid, obs(126000 - 99, 126000));
}

#[test]
fn parsers() {
    assert_eq!(mem_total("MemTotal:  2 kB\n"), Some(2048));
    assert_eq!(mem_total("MemFree: 1 kB\nMemTotal:\t3 kB\n"), Some(3072));
    assert_eq!(mem_total("MemFree: 1 kB\n"), None);
    assert_eq!(mem_total("MemTotal: x kB\n"), None);
    assert_eq!(mem_total(&format!("MemTotal: {} kB\n", u64::MAX)), None);
    assert_eq!(kernel_limit("4194304\n"), Some(4194304));
    assert_eq!(kernel_limit("4194304"), Some(4194304));
    assert_eq!(kernel_limit(" 5\n"), None);
    assert_eq!(loadavg_tasks("1 2 3 4/5 6\n"), Some(5));
    assert_eq!(parse_limit("max\n"), Some(u64::MAX));
    assert_eq!(parse_limit("12\n"), Some(12));
    assert_eq!(parse_limit("-1\n"), None);
    // exact keys: file_mapped is not file
    assert_eq!(
        stat_values("file_mapped 9\nfile 4\n", ["file", "anon"]),
        Some([4, 0])
    );
}

#[test]
fn hierarchy_choice() {
    let h = |p: &str, version| Hierarchy {
        mount_point: PathBuf::from(p),
        version,
    };
    let n = cgroupfs();
    let pick = |hs: &[Hierarchy]| {
        SignalReader::new(PathBuf::from("/p"), hs, &n).map(|r| r.hierarchy().clone())
    };
    // v1: the memory hierarchy, also when its name is combined
    let v1 = [
        h("/sys/fs/cgroup/cpu,cpuacct", CgroupVersion::V1),
        h("/sys/fs/cgroup/memory", CgroupVersion::V1),
        h("/sys/fs/cgroup/pids", CgroupVersion::V1),
    ];
    assert_eq!(pick(&v1), Some(v1[1].clone()));
    let combined = [h("/cg/cpu,memory", CgroupVersion::V1)];
    assert_eq!(pick(&combined), Some(combined[0].clone()));
    // hybrid: the v1 memory hierarchy, not the controller-less unified one
    let hybrid = [
        h("/sys/fs/cgroup/memory", CgroupVersion::V1),
        h("/sys/fs/cgroup/unified", CgroupVersion::V2),
    ];
    assert_eq!(pick(&hybrid), Some(hybrid[0].clone()));
    // hybrid without a v1 memory hierarchy: none
    let no_memory = [
        h("/sys/fs/cgroup/pids", CgroupVersion::V1),
        h("/sys/fs/cgroup/unified", CgroupVersion::V2),
    ];
    assert_eq!(pick(&no_memory), None);
    // v2: the unified mount, the shortest if there are several
    let v2 = [
        h("/run/a/b/cgroup", CgroupVersion::V2),
        h("/sys/fs/cgroup", CgroupVersion::V2),
        h("/sys/fs/cgroup/nested", CgroupVersion::V2),
    ];
    assert_eq!(pick(&v2), Some(v2[1].clone()));
    assert_eq!(pick(&[]), None);
}

#[test]
fn pods_cgroup_from_naming() {
    let hs = [Hierarchy {
        mount_point: PathBuf::from("/sys/fs/cgroup"),
        version: CgroupVersion::V2,
    }];
    let pods = |n: &CgroupNaming| {
        SignalReader::new(PathBuf::from("/proc"), &hs, n)
            .unwrap()
            .pods_cgroup()
            .to_path_buf()
    };
    assert_eq!(pods(&cgroupfs()), PathBuf::from("kubepods"));
    let n = CgroupNaming::new(CgroupDriver::Cgroupfs, "/reaplet-testbed").unwrap();
    assert_eq!(pods(&n), PathBuf::from("reaplet-testbed/kubepods"));
    assert_eq!(pods(&systemd()), PathBuf::from("kubepods.slice"));
    let n = CgroupNaming::new(CgroupDriver::Systemd, "/custom.slice").unwrap();
    assert_eq!(
        pods(&n),
        PathBuf::from("custom.slice/custom-kubepods.slice")
    );
    let r = SignalReader::host(&hs, &cgroupfs()).unwrap();
    assert_eq!(r.files.meminfo, PathBuf::from("/proc/meminfo"));
}

/// A pod cgroup with the given memory files and a tree of `(relative dir, pids)` below it.
fn pod_tree(dir: &Path, memory: &[(&str, String)], procs: &[(&str, &[u32])]) {
    fs::create_dir_all(dir).unwrap();
    for (name, text) in memory {
        put(&dir.join(name), text);
    }
    for (rel, pids) in procs {
        let text: String = pids.iter().map(|p| format!("{p}\n")).collect();
        put(&dir.join(rel).join("cgroup.procs"), &text);
    }
}

#[test]
fn v1_pod_usage_counts_nested_cgroups() {
    let t = tempfile::tempdir().unwrap();
    let r = v1_reader(t.path());
    let n = cgroupfs();
    let rel = n.pod_cgroup(&uid(), QosClass::Burstable);
    let dir = r.hierarchy().mount_point.join(&rel);
    pod_tree(
        &dir,
        &[
            ("memory.usage_in_bytes", format!("{}\n", 300 * MI)),
            ("memory.stat", v1_stat(1, 100 * MI)),
        ],
        &[
            ("", &[]),
            ("pause", &[10]),
            ("app", &[20, 21, 22]),
            ("app/nested", &[23]),
            ("app/nested/deeper", &[24, 25]),
            ("sidecar", &[]),
        ],
    );
    assert_eq!(
        r.pod_usage(&rel),
        Some(PodUsage {
            working_set: Some(200 * MI),
            processes: Some(7),
        })
    );
}

#[test]
fn v2_pod_usage() {
    let t = tempfile::tempdir().unwrap();
    let r = v2_reader(t.path());
    let n = systemd();
    let rel = n.pod_cgroup(&uid(), QosClass::BestEffort);
    let dir = r.hierarchy().mount_point.join(&rel);
    pod_tree(
        &dir,
        &[
            ("memory.current", format!("{}\n", 50 * MI)),
            ("memory.stat", v2_stat(40 * MI, 10 * MI, 80 * MI)),
        ],
        &[
            ("", &[]),
            ("cri-containerd-aaa.scope", &[100]),
            ("cri-containerd-bbb.scope", &[200, 201]),
        ],
    );
    // a stray file among the child cgroups is not a cgroup
    put(&dir.join("memory.pressure"), "some avg10=0.00\n");
    // inactive above usage clamps at 0
    assert_eq!(
        r.pod_usage(&rel),
        Some(PodUsage {
            working_set: Some(0),
            processes: Some(3),
        })
    );
}

#[test]
fn pod_usage_without_memory_files() {
    let t = tempfile::tempdir().unwrap();
    let r = v2_reader(t.path());
    let rel = systemd().pod_cgroup(&uid(), QosClass::Guaranteed);
    let dir = r.hierarchy().mount_point.join(&rel);
    pod_tree(&dir, &[], &[("", &[1, 2])]);
    assert_eq!(
        r.pod_usage(&rel),
        Some(PodUsage {
            working_set: None,
            processes: Some(2),
        })
    );
    // no cgroup.procs in the pod cgroup itself: the count is unknown
    fs::remove_file(dir.join("cgroup.procs")).unwrap();
    put(&dir.join("memory.current"), "8\n");
    put(&dir.join("memory.stat"), "inactive_file 3\n");
    assert_eq!(
        r.pod_usage(&rel),
        Some(PodUsage {
            working_set: Some(5),
            processes: None,
        })
    );
}

#[test]
fn missing_pod_cgroup_is_none() {
    let t = tempfile::tempdir().unwrap();
    let r = v1_reader(t.path());
    let rel = cgroupfs().pod_cgroup(&uid(), QosClass::BestEffort);
    assert_eq!(r.pod_usage(&rel), None);
    // a file where the directory should be
    put(&r.hierarchy().mount_point.join(&rel), "");
    assert_eq!(r.pod_usage(&rel), None);
}

#[test]
fn pod_usage_refuses_escapes() {
    let t = tempfile::tempdir().unwrap();
    let r = v1_reader(t.path());
    let mount = r.hierarchy().mount_point.clone();
    // a readable cgroup outside kubepods, with everything a pod cgroup has
    pod_tree(
        &mount.join("system.slice"),
        &[
            ("memory.usage_in_bytes", "10\n".into()),
            ("memory.stat", v1_stat(0, 0)),
        ],
        &[("", &[1])],
    );
    for rel in [
        "kubepods/../system.slice",
        "../memory/system.slice",
        "system.slice",
        "",
        "./kubepods/pod1",
    ] {
        assert_eq!(r.pod_usage(Path::new(rel)), None, "{rel}");
    }
    assert_eq!(r.pod_usage(&mount.join("system.slice")), None);
}
