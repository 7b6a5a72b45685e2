//! A timeline as aligned text: one line per step with its offset and, where a step ends
//! something, how long that took (`reaplet pods --timeline`).
//!
//! Invariants: pure (a [`Timeline`] in, a `String` out); what a line says is decided by the
//! step's variant; every line fits the columns of the header whatever the container names.

use super::{Entry, Step, StopKind, Timeline};
use std::fmt::Write as _;

/// Seconds with millisecond precision and a sign: `+1.234s`.
fn secs(ms: f64) -> String {
    format!("+{:.3}s", ms / 1e3)
}

/// What a step says.
pub fn describe(step: &Step) -> String {
    match step {
        Step::Reason {
            reason,
            source,
            grace,
            grace_from,
            detail,
        } => {
            let mut s = format!(
                "reason: {reason} (from {source}); grace {grace}s from {}",
                grace_from.as_str()
            );
            if let Some(d) = detail {
                let _ = write!(s, ": {d}");
            }
            s
        }
        Step::KillStarted { attempt, grace } => format!("kill attempt {attempt}, grace {grace}s"),
        Step::KillFailed { error } => format!("kill attempt failed: {error}"),
        Step::KillHeld => "kill held: this agent is in standby".into(),
        Step::PreStopStarted => "preStop hook started".into(),
        Step::PreStopEnded { ok: true, .. } => "preStop hook ended".into(),
        Step::PreStopEnded { ok: false, error } => format!(
            "preStop hook failed: {}",
            error.as_deref().unwrap_or("unknown error")
        ),
        Step::StopSent { timeout: 0, .. } => "SIGKILL (StopContainer, timeout 0)".into(),
        Step::StopSent {
            timeout,
            kind: StopKind::Fresh,
        } => format!("SIGTERM (StopContainer, timeout {timeout}s)"),
        Step::StopSent {
            timeout,
            kind: StopKind::Resent,
        } => format!("SIGTERM again: an earlier stop went unanswered (timeout {timeout}s)"),
        Step::StopSent {
            timeout,
            kind: StopKind::Continued,
        } => format!("stop continued to its recorded deadline (timeout {timeout}s)"),
        Step::StopFailed { error } => format!("StopContainer failed: {error}"),
        Step::Sigkill => "SIGKILL: the stop's timeout ran out".into(),
        Step::Exited {
            code,
            signal,
            before_kill,
        } => {
            let mut s = format!("exited {code}");
            if let Some(sig) = signal {
                let _ = write!(s, " ({sig})");
            }
            if *before_kill {
                s.push_str(", before the kill");
            }
            s
        }
        Step::SandboxStopped { sandbox } => {
            let short: String = sandbox.chars().take(13).collect();
            format!("sandbox {short} stopped")
        }
        Step::ContainersStopped => "every container and sandbox stopped".into(),
        Step::VolumesStarted => "waiting for the pod's volumes".into(),
        Step::VolumesDone { ok: true } => "volumes gone".into(),
        Step::VolumesDone { ok: false } => {
            "volumes still mounted past volumeUnmountTimeout: skipped".into()
        }
        Step::CgroupRemoved {
            removed_dirs,
            killed_pids,
        } => format!("pod cgroup removed ({removed_dirs} dirs, {killed_pids} processes killed)"),
        Step::Finished => "pod worker finished".into(),
        Step::StatusWritten { code } => format!("terminal status written (HTTP {code})"),
        Step::ObjectDeleted { code } => {
            format!("object deleted, UID precondition (HTTP {code})")
        }
        Step::Truncated => "(later steps not kept)".into(),
    }
}

/// The step before `i` (in recording order) that `entries[i]` ends, if any.
fn started_by(entries: &[Entry], i: usize) -> Option<f64> {
    let e = &entries[i];
    let same = |o: &&Entry| o.container == e.container;
    let before = entries[..i].iter().rev();
    let found = match &e.step {
        Step::PreStopEnded { .. } => before
            .filter(same)
            .find(|o| matches!(o.step, Step::PreStopStarted)),
        Step::Exited {
            before_kill: false, ..
        }
        | Step::Sigkill => before
            .filter(same)
            .find(|o| matches!(o.step, Step::StopSent { .. })),
        Step::VolumesDone { .. } => before
            .clone()
            .find(|o| matches!(o.step, Step::VolumesStarted)),
        Step::CgroupRemoved { .. } => before
            .clone()
            .find(|o| matches!(o.step, Step::VolumesDone { .. })),
        Step::ContainersStopped => before
            .clone()
            .find(|o| matches!(o.step, Step::KillStarted { .. })),
        _ => None,
    };
    found.map(|o| e.at_ms - o.at_ms)
}

/// The whole timeline as text.
pub fn render(t: &Timeline) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}  (uid {})", t.key(), t.uid);
    let _ = write!(out, "started {}", t.started_at);
    if let Some(d) = t.deadline_ms {
        let _ = write!(out, "   grace deadline {}", secs(d));
    }
    match t.finished_ms {
        Some(f) => {
            let _ = writeln!(out, "   finished {}", secs(f));
        }
        None => out.push_str("   still terminating\n"),
    }
    let width = t
        .entries
        .iter()
        .filter_map(|e| e.container.as_deref())
        .map(str::len)
        .max()
        .unwrap_or(0)
        .max("CONTAINER".len());
    let _ = writeln!(
        out,
        "\n{:>10} {:>9}  {:<width$}  STEP",
        "AT", "TOOK", "CONTAINER"
    );
    for (i, e) in t.entries.iter().enumerate() {
        let took = started_by(&t.entries, i).map_or("-".to_string(), |ms| format!("{ms:.0}ms"));
        let _ = writeln!(
            out,
            "{:>10} {:>9}  {:<width$}  {}",
            secs(e.at_ms),
            took,
            e.container.as_deref().unwrap_or("-"),
            describe(&e.step)
        );
    }
    out
}
