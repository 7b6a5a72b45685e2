//! One component process of the test cluster: started with its output in a log file, stopped
//! by PID (SIGTERM, SIGKILL after 10 s) when dropped, so a failing test leaves nothing running.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Proc {
    pub name: String,
    pub log: PathBuf,
    child: Option<Child>,
}

impl Proc {
    /// Starts `bin` with `args`, stdout and stderr appended to `<dir>/<name>.log`.
    pub fn start(name: &str, bin: &Path, args: &[String], dir: &Path) -> Proc {
        let log = dir.join(format!("{name}.log"));
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        let child = Command::new(bin)
            .args(args)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("start {name} ({}): {e}", bin.display()));
        Proc {
            name: name.to_owned(),
            log,
            child: Some(child),
        }
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Has it exited? (with its status)
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// The last `n` lines of its log, for a failure message.
    pub fn tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// SIGTERM, then SIGKILL if it has not exited within `grace`; waits for it.
    pub fn stop_within(&mut self, grace: Duration) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if child.try_wait().ok().flatten().is_some() {
            return;
        }
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .stderr(Stdio::null())
            .status();
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if child.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    pub fn stop(&mut self) {
        self.stop_within(Duration::from_secs(10));
    }

    /// SIGKILL at once (a crash), and reap it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The test bed's one free-port helper (`tests/common/port.rs`, loaded once per binary beside
/// this module's parent).
pub use super::super::port::free_port;
