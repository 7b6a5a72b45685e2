//! What an agent costs the node, beyond CPU seconds and the peak: where its resident memory is
//! (`/proc/<pid>/smaps`: its own code, other files, the heap, anonymous mappings, stacks), how
//! often its threads wake (context switches), and, when `REAPLET_BENCH_PERF` names a directory,
//! a `perf record` of a window (call graphs by DWARF unwinding; the profiled run's own CPU
//! figures are then not clean: perf's sampling costs the process too).
//!
//! And the scenario `standby`: reaplet in standby beside the live kubelet (the DaemonSet's form:
//! the node's kubeconfig, the kubelet's file, the default `--authority auto`), both idle with the
//! kubelet's pods running, measured over the same window.

use super::stack::Stack;
use super::*;

/// Resident memory of a process by kind of mapping, KiB.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Resident {
    /// Mapped from the process's own executable (code and read-only data).
    pub(super) exe: u64,
    /// Mapped from other files (shared libraries, locale data).
    pub(super) files: u64,
    /// `[heap]` (glibc's main arena, brk).
    pub(super) heap: u64,
    /// Anonymous mappings (other malloc arenas, mmapped allocations, Go's heap and stacks).
    pub(super) anon: u64,
    /// `[stack]` (the main thread's).
    pub(super) stack: u64,
    /// Threads (`Threads:` of `/proc/<pid>/status`).
    pub(super) threads: u64,
}

impl Resident {
    pub(super) fn total_mib(&self) -> f64 {
        (self.exe + self.files + self.heap + self.anon + self.stack) as f64 / 1024.0
    }

    pub(super) fn line(&self) -> String {
        let m = |k: u64| k as f64 / 1024.0;
        format!(
            "RSS {:.1} MiB: own code {:.1}, other files {:.1}, [heap] {:.1}, anonymous {:.1}, \
             [stack] {:.1}; {} threads",
            self.total_mib(),
            m(self.exe),
            m(self.files),
            m(self.heap),
            m(self.anon),
            m(self.stack),
            self.threads
        )
    }
}

/// `pid`'s resident memory by kind; zero when it is gone.
pub(super) fn resident(pid: u32) -> Resident {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
    let exe = exe
        .to_string_lossy()
        .trim_end_matches(" (deleted)")
        .to_owned();
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap_or_default();
    let mut r = Resident::default();
    let mut path = String::new();
    for l in text.lines() {
        let mut f = l.split_whitespace();
        let Some(first) = f.next() else { continue };
        if first.contains('-') && first.chars().next().is_some_and(|c| c.is_ascii_hexdigit()) {
            // a mapping's header: range perms offset dev inode [path]
            path = f.nth(4).unwrap_or_default().to_owned();
            continue;
        }
        if first == "Rss:" {
            let kib: u64 = f.next().and_then(|v| v.parse().ok()).unwrap_or(0);
            let slot = match path.as_str() {
                "" => &mut r.anon,
                "[heap]" => &mut r.heap,
                "[stack]" => &mut r.stack,
                p if p == exe => &mut r.exe,
                p if p.starts_with('[') => &mut r.anon,
                _ => &mut r.files,
            };
            *slot += kib;
        }
    }
    r.threads = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Threads:"))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0);
    r
}

/// Context switches of every thread of `pid` so far (voluntary + involuntary): each is a
/// thread going to sleep or being put off the CPU, so their rate is the rate of wakeups.
pub(super) fn switches(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .filter_map(Result::ok)
        .filter_map(|t| std::fs::read_to_string(t.path().join("status")).ok())
        .map(|s| {
            s.lines()
                .filter_map(|l| {
                    l.strip_prefix("voluntary_ctxt_switches:")
                        .or_else(|| l.strip_prefix("nonvoluntary_ctxt_switches:"))
                })
                .filter_map(|v| v.trim().parse::<u64>().ok())
                .sum::<u64>()
        })
        .sum()
}

/// A `perf record` of one process over a window, when `REAPLET_BENCH_PERF` names a directory;
/// stopped (SIGINT, then waited for) by [`Perf::stop`].
pub(super) struct Perf {
    child: Option<Child>,
    out: PathBuf,
}

impl Perf {
    pub(super) async fn start(pid: u32, label: &str) -> Perf {
        // `REAPLET_BENCH_PERF_ONLY`: the windows whose label contains it (`reaplet`)
        let only = std::env::var("REAPLET_BENCH_PERF_ONLY").unwrap_or_default();
        let dir = std::env::var_os("REAPLET_BENCH_PERF").filter(|_| label.contains(&only));
        let Some(dir) = dir else {
            return Perf {
                child: None,
                out: PathBuf::new(),
            };
        };
        let _ = std::fs::create_dir_all(&dir);
        let out = Path::new(&dir).join(format!("{label}.perf.data"));
        // an idle agent needs a high rate to be seen at all (`REAPLET_BENCH_PERF_HZ`)
        let hz = std::env::var("REAPLET_BENCH_PERF_HZ").unwrap_or_else(|_| "499".into());
        let child = Command::new("perf")
            .args([
                "record",
                "-q",
                "-F",
                &hz,
                "--call-graph",
                "dwarf,16384",
                "-p",
            ])
            .arg(pid.to_string())
            .arg("-o")
            .arg(&out)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| println!("perf record: {e}"))
            .ok();
        // perf needs a moment to attach before the window's work starts
        tokio::time::sleep(Duration::from_millis(500)).await;
        Perf { child, out }
    }

    pub(super) fn stop(mut self) {
        let Some(mut c) = self.child.take() else {
            return;
        };
        let _ = Command::new("kill")
            .args(["-INT", &c.id().to_string()])
            .status();
        let _ = c.wait();
        println!("perf profile: {}", self.out.display());
    }
}

/// CPU time of every thread of `pid` so far, seconds, from the scheduler's own accounting
/// (`/proc/<pid>/task/*/schedstat`, nanoseconds: an idle agent's minute is a few milliseconds,
/// under the 10 ms tick of `utime`/`stime`).
pub(super) fn cpu_ns_secs(pid: u32) -> f64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0.0;
    };
    let ns: u64 = tasks
        .filter_map(Result::ok)
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    ns as f64 / 1e9
}

/// One agent idle over the window: its CPU, wakeups and resident memory.
struct Idle {
    cpu: f64,
    switches: u64,
    resident: Resident,
}

fn idle_window_start(pid: u32) -> (f64, u64) {
    (cpu_ns_secs(pid), switches(pid))
}

fn idle_window_end(pid: u32, start: (f64, u64)) -> Idle {
    Idle {
        cpu: cpu_ns_secs(pid) - start.0,
        switches: switches(pid) - start.1,
        resident: resident(pid),
    }
}

/// `standby`: `n` pods run by the kubelet; reaplet in standby beside it (the DaemonSet's form);
/// after it found the kubelet alive and settled, both measured over `window`.
pub(super) async fn standby_side(n: usize, window: Duration) -> R<Vec<Row>> {
    header(&format!(
        "kubelet 8: standby reaplet beside the live kubelet, {n} pods running, idle {:.0} s",
        window.as_secs_f64()
    ));
    let mut s = Stack::start("standby").await;
    let list = names("idle", n);
    let bodies: Vec<Value> = list.iter().map(|x| pod(x, TRAPS_TERM)).collect();
    s.create_all(&bodies).await?;
    s.wait_running(&list, Duration::from_secs(600)).await?;
    let log = s.cluster.dir.path().join("reaplet.log");
    let kc = s.cluster.node_kubeconfig(NODE);
    let agent = s.run_reaplet(&kc, &[])?;
    agent.wait_ready().await?;
    let t = Instant::now();
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("the kubelet renews its Lease")
    {
        if t.elapsed() > Duration::from_secs(120) {
            return Err("reaplet did not find the kubelet alive within 120 s".into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    s.reaplet = Some(agent);
    // past the start's one-off work (the first LIST, the connections, the allocator's warm-up)
    tokio::time::sleep(Duration::from_secs(15)).await;
    let (kp, rp) = (s.pid(Who::Kubelet)?, s.pid(Who::Reaplet)?);
    let perf = Perf::start(rp, "standby-reaplet").await;
    let (k0, r0) = (idle_window_start(kp), idle_window_start(rp));
    tokio::time::sleep(window).await;
    let (k, r) = (idle_window_end(kp, k0), idle_window_end(rp, r0));
    perf.stop();
    let secs = window.as_secs_f64();
    for (who, x) in [(Who::Kubelet, &k), (Who::Reaplet, &r)] {
        println!(
            "{}: {:.3} CPU-s in {secs:.0} s ({:.3} millicores), {} context switches ({:.1}/s); {}",
            who.label(),
            x.cpu,
            1000.0 * x.cpu / secs,
            x.switches,
            x.switches as f64 / secs,
            x.resident.line()
        );
    }
    s.keep_logs();
    Ok(vec![
        row(
            format!("standby beside {n} pods, idle: RSS"),
            "MiB",
            k.resident.total_mib(),
            r.resident.total_mib(),
        ),
        row(
            format!("standby beside {n} pods, idle: CPU"),
            "millicores",
            1000.0 * k.cpu / secs,
            1000.0 * r.cpu / secs,
        ),
        row(
            format!("standby beside {n} pods, idle: wakeups"),
            "/s",
            k.switches as f64 / secs,
            r.switches as f64 / secs,
        ),
    ])
}
