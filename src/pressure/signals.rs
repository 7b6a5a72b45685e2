//! The eviction signals' observations and each pod's usage, read from the kernel: the
//! kubelet's `makeSignalObservations` (`eviction/helpers.go`) over the summary figures that
//! cadvisor (`container/libcontainer/handler.go: setMemoryStats`, the raw handler's root spec),
//! runc's cgroup stats (`fs2/memory.go: rootStatsFromMeminfo`) and `stats/pidlimit` compute.
//!
//! * `memory.available`: capacity is `MemTotal` of `<proc>/meminfo`, available is capacity
//!   minus the working set of the memory hierarchy's root cgroup;
//! * `allocatableMemory.available`: capacity is the memory limit of the pods cgroup (the
//!   kubelet's `kubepods` / `kubepods.slice` below `--cgroup-root`), available is that limit
//!   minus its working set; no limit (`max`, or above 2^62 as cadvisor counts it) is no
//!   observation;
//! * `pid.available`: capacity is `min(kernel.pid_max, kernel.threads-max)`, available is
//!   capacity minus the task count of `<proc>/loadavg`;
//! * [`SignalReader::pod_usage`]: a pod's working set and process count, for ranking.
//!
//! Invariants:
//! * every file is read below roots the caller gives (a proc root and the cgroup
//!   hierarchies): only [`SignalReader::host`] names `/proc`, so tests run on fixture trees;
//! * the working set is usage minus inactive file pages, clamped at 0 (cgroup v1: the
//!   hierarchical `total_inactive_file`; v2: `inactive_file`); the v2 root has no
//!   `memory.current`, so its usage is `anon + file` of its `memory.stat`, as runc computes it;
//! * available is `capacity - working set` with the kubelet's arithmetic (an unsigned
//!   difference read back as signed), so a working set above the capacity gives a negative
//!   available, never a panic;
//! * a signal that cannot be read is `None`: the kubelet skips a threshold without
//!   observation, it never counts it as 0;
//! * a pod cgroup path is checked to stay below the pods cgroup before it is joined
//!   ([`contained`]);
//! * cost per [`SignalReader::observe`]: cgroup v1 reads 9 files (meminfo, the root's
//!   `memory.usage_in_bytes` and `memory.stat`, the pods cgroup's `memory.limit_in_bytes`,
//!   `memory.usage_in_bytes` and `memory.stat`, `pid_max`, `threads-max`, `loadavg`), cgroup
//!   v2 reads 8 (the root has `memory.stat` only); an unlimited pods cgroup saves its usage
//!   and stat reads. Every path is built once, in [`SignalReader::new`]; a pass allocates a
//!   single buffer, and each file is one `open`, one `read_to_string` into that buffer
//!   (through `Take`, which skips std's size-hint `statx`/`lseek`, useless on proc and
//!   cgroup files) and one `close`; parsing only slices the buffer.
//!
//! Differences from the kubelet, on purpose:
//! * the kubelet falls back to `sysinfo(2)`'s process count when `loadavg` cannot be read;
//!   here `pid.available` is then not observed (no syscall outside the given roots);
//! * the kubelet's pod process count is the sum of cadvisor's per-container counts (the
//!   `cgroup.procs` of each CRI container's own cgroup); here it is every PID in
//!   `cgroup.procs` of the pod cgroup and all its descendants, so the sandbox's pause process
//!   counts too (one more per pod, alike for every pod, so the order barely moves).

use crate::cgroups::{CgroupNaming, CgroupVersion, Hierarchy, contained};
use crate::pod::{PodUid, QosClass};
use rustix::io::Errno;
use std::fs::File;
use std::io::{self, ErrorKind, Read};
use std::path::{Path, PathBuf};

/// cadvisor's `maxMemorySize`: a limit above it counts as no limit.
const UNLIMITED_ABOVE: u64 = 1 << 62;

/// Largest file read; a bigger one is an error rather than a silently cut count. Only
/// `cgroup.procs` of a pod with very many processes comes anywhere near it.
const MAX_FILE: u64 = 16 << 20;

/// Capacity of the per-pass buffer: `/proc/meminfo` and a v1 `memory.stat` fit with room to
/// spare.
const BUF_CAPACITY: usize = 8 << 10;

/// One signal's observation, in the kubelet's units (bytes for memory, PIDs for pid).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observation {
    pub available: i64,
    pub capacity: i64,
}

/// The observations of one pass; a signal that could not be read is `None`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Observations {
    pub memory: Option<Observation>,
    pub allocatable_memory: Option<Observation>,
    pub pid: Option<Observation>,
}

/// A pod's usage for ranking; a figure that could not be read is `None` (the kubelet ranks a
/// pod without memory stats as using 0 bytes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PodUsage {
    /// The pod cgroup's working set in bytes.
    pub working_set: Option<u64>,
    /// PIDs in the pod cgroup and all its descendants.
    pub processes: Option<u64>,
}

/// Every file a pass reads, joined once.
#[derive(Debug, Clone)]
struct Files {
    meminfo: PathBuf,
    pid_max: PathBuf,
    threads_max: PathBuf,
    loadavg: PathBuf,
    /// cgroup v1 only: the v2 root has no usage file.
    root_usage: Option<PathBuf>,
    root_stat: PathBuf,
    pods_limit: PathBuf,
    pods_usage: PathBuf,
    pods_stat: PathBuf,
}

/// Reads the eviction signals and pod usage from a proc root and the memory cgroup hierarchy.
#[derive(Debug, Clone)]
pub struct SignalReader {
    hierarchy: Hierarchy,
    /// The pods cgroup, relative to the hierarchy's mount point.
    pods: PathBuf,
    files: Files,
}

impl SignalReader {
    /// A reader over `proc_root` (normally `/proc`) and the memory hierarchy among
    /// `hierarchies`: a cgroup v1 hierarchy whose mount point's name contains `memory`, else,
    /// when every hierarchy is cgroup v2, the unified one (the shortest mount point if there
    /// are several). A hybrid host whose memory controller is not on a v1 hierarchy has none,
    /// as for the kubelet, which reads v1 stats there.
    ///
    /// The pods cgroup is derived from `naming`: the parent of the Guaranteed pod cgroup
    /// (`<cgroup-root>/kubepods`, or `kubepods.slice` and its prefixed parents with the systemd
    /// driver), the cgroup the kubelet limits to node allocatable.
    ///
    /// `None` when there is no memory hierarchy.
    pub fn new(
        proc_root: PathBuf,
        hierarchies: &[Hierarchy],
        naming: &CgroupNaming,
    ) -> Option<SignalReader> {
        let hierarchy = memory_hierarchy(hierarchies)?.clone();
        // the Guaranteed pod cgroup sits directly in the pods cgroup, whatever the UID
        let probe = PodUid::parse("probe").ok()?;
        let guaranteed = naming.pod_cgroup(&probe, QosClass::Guaranteed);
        let pods = guaranteed.parent()?.to_path_buf();
        let mount = &hierarchy.mount_point;
        let pods_dir = contained(mount, &naming.root_path(), &pods).ok()?;
        let kernel = proc_root.join("sys/kernel");
        let files = match hierarchy.version {
            CgroupVersion::V1 => Files {
                root_usage: Some(mount.join("memory.usage_in_bytes")),
                root_stat: mount.join("memory.stat"),
                pods_limit: pods_dir.join("memory.limit_in_bytes"),
                pods_usage: pods_dir.join("memory.usage_in_bytes"),
                pods_stat: pods_dir.join("memory.stat"),
                meminfo: proc_root.join("meminfo"),
                pid_max: kernel.join("pid_max"),
                threads_max: kernel.join("threads-max"),
                loadavg: proc_root.join("loadavg"),
            },
            CgroupVersion::V2 => Files {
                root_usage: None,
                root_stat: mount.join("memory.stat"),
                pods_limit: pods_dir.join("memory.max"),
                pods_usage: pods_dir.join("memory.current"),
                pods_stat: pods_dir.join("memory.stat"),
                meminfo: proc_root.join("meminfo"),
                pid_max: kernel.join("pid_max"),
                threads_max: kernel.join("threads-max"),
                loadavg: proc_root.join("loadavg"),
            },
        };
        Some(SignalReader {
            hierarchy,
            pods,
            files,
        })
    }

    /// [`Self::new`] on the host's `/proc`.
    pub fn host(hierarchies: &[Hierarchy], naming: &CgroupNaming) -> Option<SignalReader> {
        Self::new(PathBuf::from("/proc"), hierarchies, naming)
    }

    /// The memory hierarchy read.
    pub fn hierarchy(&self) -> &Hierarchy {
        &self.hierarchy
    }

    /// The pods cgroup, relative to the hierarchy's mount point.
    pub fn pods_cgroup(&self) -> &Path {
        &self.pods
    }

    /// One pass over the three signals.
    pub fn observe(&self) -> Observations {
        let mut buf = String::with_capacity(BUF_CAPACITY);
        Observations {
            memory: self.memory(&mut buf),
            allocatable_memory: self.allocatable_memory(&mut buf),
            pid: self.pid(&mut buf),
        }
    }

    /// `memory.available`: `MemTotal` against the root cgroup's working set.
    fn memory(&self, buf: &mut String) -> Option<Observation> {
        let working_set = match &self.files.root_usage {
            Some(usage) => {
                let usage = read_u64(usage, buf)?;
                let [inactive] =
                    stat_values(read(&self.files.root_stat, buf).ok()?, [V1_INACTIVE])?;
                usage.saturating_sub(inactive)
            }
            None => {
                let [anon, file, inactive] = stat_values(
                    read(&self.files.root_stat, buf).ok()?,
                    ["anon", "file", V2_INACTIVE],
                )?;
                anon.saturating_add(file).saturating_sub(inactive)
            }
        };
        let total = mem_total(read(&self.files.meminfo, buf).ok()?)?;
        observation(total, working_set)
    }

    /// `allocatableMemory.available`: the pods cgroup's limit against its working set.
    fn allocatable_memory(&self, buf: &mut String) -> Option<Observation> {
        let limit = parse_limit(read(&self.files.pods_limit, buf).ok()?)?;
        if limit > UNLIMITED_ABOVE {
            return None;
        }
        let working_set = working_set(
            self.hierarchy.version,
            &self.files.pods_usage,
            &self.files.pods_stat,
            buf,
        )?;
        observation(limit, working_set)
    }

    /// `pid.available`: the smaller of the two kernel task limits against the task count.
    fn pid(&self, buf: &mut String) -> Option<Observation> {
        let max = [&self.files.pid_max, &self.files.threads_max]
            .into_iter()
            .filter_map(|p| kernel_limit(read(p, buf).ok()?))
            .min()?;
        let running = loadavg_tasks(read(&self.files.loadavg, buf).ok()?)?;
        Some(Observation {
            available: max.wrapping_sub(running),
            capacity: max,
        })
    }

    /// The usage of the pod cgroup at `cgroup_rel` (relative to the hierarchy's mount point,
    /// as [`CgroupNaming::pod_cgroup`] builds it). `None` when the path is not below the pods
    /// cgroup (`..`, absolute or foreign components) or the pod cgroup does not exist.
    ///
    /// Reads the pod cgroup's two memory files, then lists it and its descendants and reads
    /// each one's `cgroup.procs`. A descendant removed meanwhile is skipped.
    pub fn pod_usage(&self, cgroup_rel: &Path) -> Option<PodUsage> {
        let dir = contained(&self.hierarchy.mount_point, &self.pods, cgroup_rel).ok()?;
        let top = match std::fs::read_dir(&dir) {
            Ok(entries) => Some(entries),
            Err(e) if gone(&e) => return None,
            Err(_) => None,
        };
        let mut buf = String::with_capacity(BUF_CAPACITY);
        let (usage, stat) = match self.hierarchy.version {
            CgroupVersion::V1 => ("memory.usage_in_bytes", "memory.stat"),
            CgroupVersion::V2 => ("memory.current", "memory.stat"),
        };
        let working_set = working_set(
            self.hierarchy.version,
            &dir.join(usage),
            &dir.join(stat),
            &mut buf,
        );
        let processes = top.and_then(|entries| count_processes(&dir, entries, &mut buf));
        Some(PodUsage {
            working_set,
            processes,
        })
    }
}

/// cgroup v1's hierarchical inactive file pages (cadvisor's key on v1).
const V1_INACTIVE: &str = "total_inactive_file";
/// cgroup v2's inactive file pages (always hierarchical).
const V2_INACTIVE: &str = "inactive_file";

/// See [`SignalReader::new`].
fn memory_hierarchy(hierarchies: &[Hierarchy]) -> Option<&Hierarchy> {
    let v1_memory = hierarchies.iter().find(|h| {
        h.version == CgroupVersion::V1
            && h.mount_point
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.contains("memory"))
    });
    if v1_memory.is_some() {
        return v1_memory;
    }
    if hierarchies.iter().any(|h| h.version == CgroupVersion::V1) {
        return None;
    }
    hierarchies
        .iter()
        .filter(|h| h.version == CgroupVersion::V2)
        .min_by_key(|h| h.mount_point.components().count())
}

/// A non-root cgroup's working set: usage minus inactive file pages, clamped at 0. A stat
/// file without the inactive key subtracts nothing, as cadvisor does.
fn working_set(version: CgroupVersion, usage: &Path, stat: &Path, buf: &mut String) -> Option<u64> {
    let usage = read_u64(usage, buf)?;
    let key = match version {
        CgroupVersion::V1 => V1_INACTIVE,
        CgroupVersion::V2 => V2_INACTIVE,
    };
    let [inactive] = stat_values(read(stat, buf).ok()?, [key])?;
    Some(usage.saturating_sub(inactive))
}

/// The kubelet's observation from a limit and a working set: cadvisor's `AvailableBytes` is
/// the unsigned `limit - working set`, converted to a signed quantity, and the capacity is
/// `available + working set`, the limit again.
fn observation(limit: u64, working_set: u64) -> Option<Observation> {
    Some(Observation {
        available: limit.wrapping_sub(working_set) as i64,
        capacity: i64::try_from(limit).ok()?,
    })
}

/// Reads `path` into `buf` (cleared first) with one `read_to_string`.
fn read<'b>(path: &Path, buf: &'b mut String) -> io::Result<&'b str> {
    buf.clear();
    let file = File::open(path)?;
    // `Take` has no size hint, so std reads straight into the buffer's spare room
    let n = file.take(MAX_FILE).read_to_string(buf)?;
    if n as u64 >= MAX_FILE {
        return Err(io::Error::new(ErrorKind::InvalidData, "file too large"));
    }
    Ok(buf.as_str())
}

/// A single-number file (`memory.usage_in_bytes`, `memory.current`).
fn read_u64(path: &Path, buf: &mut String) -> Option<u64> {
    read(path, buf).ok()?.trim().parse().ok()
}

/// A limit file: a number, or `max` (cgroup v2) for none.
fn parse_limit(text: &str) -> Option<u64> {
    match text.trim() {
        "max" => Some(u64::MAX),
        n => n.parse().ok(),
    }
}

/// The values of `keys` in a flat-keyed file (`key value` lines). A missing key is 0, as the
/// kubelet's stats maps read it; a wanted key whose value is no number makes the file
/// unusable, as a parse error fails the whole stats read upstream.
fn stat_values<const N: usize>(text: &str, keys: [&str; N]) -> Option<[u64; N]> {
    let mut out = [0u64; N];
    for line in text.lines() {
        let Some((key, value)) = line.split_once(' ') else {
            continue;
        };
        if let Some(i) = keys.iter().position(|k| *k == key) {
            out[i] = value.trim().parse().ok()?;
        }
    }
    Some(out)
}

/// `MemTotal` of a meminfo file, in bytes (the file gives kB).
fn mem_total(text: &str) -> Option<u64> {
    let line = text.lines().find_map(|l| l.strip_prefix("MemTotal:"))?;
    let kb = line.trim().strip_suffix("kB").unwrap_or(line).trim();
    kb.parse::<u64>().ok()?.checked_mul(1024)
}

/// `kernel.pid_max` or `kernel.threads-max`: one number and the newline after it.
fn kernel_limit(text: &str) -> Option<i64> {
    text.strip_suffix('\n').unwrap_or(text).parse().ok()
}

/// The total task count of `loadavg`: the number after `/` in its fourth field (every task,
/// threads included).
fn loadavg_tasks(text: &str) -> Option<i64> {
    let field = text.split_ascii_whitespace().nth(3)?;
    let (_, total) = field.split_once('/')?;
    if total.contains('/') {
        return None;
    }
    total.parse().ok()
}

/// A file or cgroup that no longer exists (or never did): ENOENT, ENOTDIR, or ENODEV for a
/// cgroup file read while its cgroup is removed.
fn gone(e: &io::Error) -> bool {
    matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory)
        || Errno::from_io_error(e) == Some(Errno::NODEV)
}

/// PIDs in `cgroup.procs` of `dir` and every cgroup below it (`entries` lists `dir`). `None`
/// when a file or directory that still exists cannot be read; a descendant removed meanwhile
/// counts as none.
fn count_processes(dir: &Path, entries: std::fs::ReadDir, buf: &mut String) -> Option<u64> {
    let mut total = procs_in(dir, buf).ok()?;
    let mut pending: Vec<PathBuf> = Vec::new();
    push_children(entries, &mut pending)?;
    while let Some(child) = pending.pop() {
        match std::fs::read_dir(&child) {
            Ok(entries) => push_children(entries, &mut pending)?,
            Err(e) if gone(&e) => continue,
            Err(_) => return None,
        }
        match procs_in(&child, buf) {
            Ok(n) => total += n,
            Err(e) if gone(&e) => {}
            Err(_) => return None,
        }
    }
    Some(total)
}

/// The child cgroups (directories) of a listing, onto `pending`.
fn push_children(entries: std::fs::ReadDir, pending: &mut Vec<PathBuf>) -> Option<()> {
    for entry in entries {
        let entry = match entry {
            Ok(entry) => entry,
            Err(e) if gone(&e) => continue,
            Err(_) => return None,
        };
        // the kind comes from the listing itself (no stat); a symlink is not followed
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            pending.push(entry.path());
        }
    }
    Some(())
}

/// The PIDs listed in one cgroup's `cgroup.procs` (one per non-empty line).
fn procs_in(dir: &Path, buf: &mut String) -> io::Result<u64> {
    let text = read(&dir.join("cgroup.procs"), buf)?;
    Ok(text.lines().filter(|l| !l.trim().is_empty()).count() as u64)
}

#[cfg(test)]
#[path = "signals_tests.rs"]
mod tests;
