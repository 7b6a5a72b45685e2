//! The fleet's processes: a hollow kubelet (kubemark `--morph=kubelet`) and a standby reaplet
//! per node, each with its own log, directory and ports; their CPU time and memory from
//! `/proc/<pid>`. Invariants: every process is stopped by its PID when its [`Fleet`] is dropped
//! (SIGTERM to all, SIGKILL to whatever is left after 10 s); what kubemark leaves in `/tmp`
//! (it puts a hollow kubelet's root directory and fake runtime socket there, whatever `TMPDIR`
//! says) is removed once the hollow kubelets stopped ([`TmpLeftovers`]).

use std::collections::HashSet;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Member {
    pub node: String,
    child: Child,
    pub log: PathBuf,
}

impl Member {
    /// Starts `cmd` with stdout and stderr in `log`.
    pub fn spawn(node: &str, mut cmd: Command, log: PathBuf) -> Result<Member, String> {
        let out = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        cmd.stdin(Stdio::null()).stdout(out).stderr(err);
        let child = cmd
            .spawn()
            .map_err(|e| format!("starting {:?} for {node}: {e}", cmd.get_program()))?;
        Ok(Member {
            node: node.to_owned(),
            child,
            log,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    pub fn tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

/// Processes stopped together.
#[derive(Default)]
pub struct Fleet {
    pub members: Vec<Member>,
}

impl Fleet {
    pub fn pids(&self) -> Vec<u32> {
        self.members.iter().map(Member::pid).collect()
    }

    /// The first member that exited, with its status and log tail.
    pub fn first_exited(&mut self) -> Option<String> {
        self.members.iter_mut().find_map(|m| {
            let st = m.exited()?;
            Some(format!(
                "{} ({}) exited ({st}); its log {}:\n{}",
                m.node,
                m.pid(),
                m.log.display(),
                m.tail(30)
            ))
        })
    }

    /// SIGTERM to every member, then SIGKILL to those still running after `grace`.
    pub fn stop(&mut self, grace: Duration) {
        for m in &mut self.members {
            if m.exited().is_none() {
                let _ = rustix::process::kill_process(
                    rustix::process::Pid::from_raw(m.pid() as i32).expect("a child's pid"),
                    rustix::process::Signal::TERM,
                );
            }
        }
        let deadline = Instant::now() + grace;
        for m in &mut self.members {
            while m.exited().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            if m.exited().is_none() {
                let _ = m.child.kill();
            }
            let _ = m.child.wait();
        }
        self.members.clear();
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(10));
    }
}

/// kubemark's entries in `/tmp` (`hollow-kubelet.*` root directories, `kubelet_remote_*.sock`
/// fake runtime sockets) that appeared after [`TmpLeftovers::now`]: removed when dropped. Only
/// this benchmark runs kubemark on the machine; declared before the hollow kubelets' [`Fleet`],
/// so it drops after them.
pub struct TmpLeftovers {
    before: HashSet<PathBuf>,
}

fn kubemark_tmp_entries() -> HashSet<PathBuf> {
    std::fs::read_dir("/tmp")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.starts_with("hollow-kubelet.")
                || (n.starts_with("kubelet_remote_") && n.ends_with(".sock"))
        })
        .map(|e| e.path())
        .collect()
}

impl TmpLeftovers {
    pub fn now() -> TmpLeftovers {
        TmpLeftovers {
            before: kubemark_tmp_entries(),
        }
    }
}

impl Drop for TmpLeftovers {
    fn drop(&mut self) {
        for p in kubemark_tmp_entries().difference(&self.before) {
            let _ = if p.is_dir() {
                std::fs::remove_dir_all(p)
            } else {
                std::fs::remove_file(p)
            };
        }
    }
}

/// CPU seconds (user + system) of `pid` so far (0 when it is gone).
pub fn cpu_secs(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // the fields after the command name (which may hold spaces) in parentheses
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
        return 0.0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest[0] is field 3 (state): utime is field 14, stime field 15
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (tick(11) + tick(12)) / ticks_per_second()
}

fn ticks_per_second() -> f64 {
    procfs::ticks_per_second() as f64
}

/// Resident memory of `pid` in MiB (`VmRSS`; 0 when it is gone).
pub fn rss_mib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(0.0, |kib| kib / 1024.0)
}
