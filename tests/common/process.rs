//! The reaplet binary and other processes, and its status endpoint, for the integration tests.
//! Nothing here needs the test bed: `tests/config_cli.rs` (built without it) includes this file
//! on its own (`#[path = "common/process.rs"]`).
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The reaplet binary with a clean environment (no `REAPLET_*`, no in-cluster variables).
pub fn reaplet() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_reaplet"));
    for (k, _) in std::env::vars() {
        if k.starts_with("REAPLET_") || k.starts_with("KUBERNETES_SERVICE") {
            c.env_remove(k);
        }
    }
    c
}

/// Kills a spawned reaplet if the test fails before stopping it (a kill after the child was
/// waited for is harmless: pids are not reused that fast).
pub struct KillOnDrop(pub u32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        // usually already gone (the test killed and reaped it): say nothing then
        let _ = Command::new("kill")
            .args(["-KILL", &self.0.to_string()])
            .stderr(Stdio::null())
            .status();
    }
}

/// Sends `sig` (`-TERM`, `-STOP`, ...) to `pid` through `kill(1)` (keeps the tests free of
/// unsafe code); asserts it was delivered.
pub fn signal(pid: u32, sig: &str) {
    assert!(
        Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .unwrap()
            .success(),
        "kill {sig} {pid}"
    );
}

pub fn sigterm(pid: u32) {
    signal(pid, "-TERM");
}

/// SIGCONTs a stopped process when dropped, so a failed test never leaves it stopped.
pub struct Thaw(pub u32);

impl Drop for Thaw {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-CONT", &self.0.to_string()])
            .status();
    }
}

/// The containerd shim serving `sandbox_id` (containerd 1.6 runs one per pod).
pub fn shim_pid(sandbox_id: &str) -> u32 {
    let out = Command::new("pgrep")
        .args(["-f", &format!("containerd-shim-runc-v2 .*-id {sandbox_id}")])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .and_then(|l| l.trim().parse().ok())
        .expect("the pod's shim is running")
}

/// A pipe whose reading end is already closed: every write to it fails with EPIPE.
pub fn closed_pipe() -> Stdio {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    writer.into()
}

/// The line of `reaplet check`'s output for `check`.
pub fn row<'a>(out: &'a str, check: &str) -> &'a str {
    out.lines()
        .find(|l| l.starts_with(check))
        .unwrap_or_else(|| panic!("no {check} line in\n{out}"))
}

/// The last `n` lines of `s`.
pub fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The whole of a log file so far (empty if there is none yet).
pub fn read_log(log: &Path) -> String {
    std::fs::read_to_string(log).unwrap_or_default()
}

/// The part of a log written in full: up to its last newline (a last line without one is
/// still being written: a read can land in the middle of a write).
pub fn complete(text: &str) -> &str {
    &text[..text.rfind('\n').map_or(0, |i| i + 1)]
}

/// Whether `line` is a JSON log line (`--log-format json`) whose `message` `wanted` accepts.
pub fn message_is(line: &str, wanted: impl Fn(&str) -> bool) -> bool {
    serde_json::from_str::<serde_json::Value>(line)
        .is_ok_and(|v| v["message"].as_str().is_some_and(wanted))
}

/// The log's complete JSON lines whose `message` `wanted` accepts.
pub fn json_lines(text: &str, wanted: impl Fn(&str) -> bool) -> Vec<serde_json::Value> {
    complete(text)
        .lines()
        .filter(|l| message_is(l, &wanted))
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Waits until the log at `log`, written by `child`, has a complete line that `wanted`
/// accepts; returns the log's complete lines so far. Every log assertion reads what it waited
/// for: a line written after the one waited for may not be there yet (the process may be
/// descheduled between the two writes). Fails naming `what` when `child` exits first, or after
/// `limit`.
pub fn wait_line(
    child: &mut Child,
    log: &Path,
    what: &str,
    limit: Duration,
    wanted: impl Fn(&str) -> bool,
) -> String {
    let start = Instant::now();
    loop {
        let text = read_log(log);
        if complete(&text).lines().any(&wanted) {
            return complete(&text).to_owned();
        }
        if let Some(st) = child.try_wait().unwrap() {
            panic!("exited {st:?} before logging {what}:\n{text}");
        }
        assert!(
            start.elapsed() < limit,
            "no {what} line within {limit:?}:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until the file at `path` (a log another process writes: reaplet's, a container's)
/// has a complete line containing `what`, within `limit`; returns its complete lines so far.
/// Fails with `context()` (reaplet's log, say).
pub async fn wait_logged(
    path: &Path,
    what: &str,
    limit: Duration,
    context: impl Fn() -> String,
) -> String {
    let start = Instant::now();
    loop {
        let text = read_log(path);
        if complete(&text).lines().any(|l| l.contains(what)) {
            return complete(&text).to_owned();
        }
        assert!(
            start.elapsed() < limit,
            "{} has no {what:?} within {limit:?}:\n{text}\n{}",
            path.display(),
            context()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A loopback address with a free port for a status endpoint (`port::free_port`: below
/// the ephemeral range, so no outgoing connection takes it before reaplet binds it).
pub fn free_addr() -> SocketAddr {
    ([127, 0, 0, 1], super::port::free_port()).into()
}

/// A status endpoint answer, bounded (a hung endpoint is an answer of its own: code 0).
pub async fn probe(addr: SocketAddr, path: &str) -> (u16, String) {
    match tokio::time::timeout(Duration::from_secs(2), reaplet::server::fetch(addr, path)).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => (0, e.to_string()),
        Err(_) => (0, "no answer within 2 s".into()),
    }
}

/// The value of metric `name` (the first sample line starting with it), NaN if there is none
/// or `/metrics` does not answer 200.
pub async fn metric(addr: SocketAddr, name: &str) -> f64 {
    let Ok((200, body)) = reaplet::server::fetch(addr, "/metrics").await else {
        return f64::NAN;
    };
    body.lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

/// Waits until `/readyz` at `addr` answers 200; fails if `child` exits first, or after
/// `limit` (with `context()`, a log, say).
pub async fn wait_ready(
    child: &mut Child,
    addr: SocketAddr,
    limit: Duration,
    context: impl Fn() -> String,
) {
    let start = Instant::now();
    loop {
        if let Ok((200, _)) = reaplet::server::fetch(addr, "/readyz").await {
            return;
        }
        if let Some(st) = child.try_wait().unwrap() {
            panic!("reaplet exited before it was ready: {st:?}\n{}", context());
        }
        assert!(
            start.elapsed() < limit,
            "reaplet never ready\n{}",
            context()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
