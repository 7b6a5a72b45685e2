//! The standby's memory of its own role across its restarts: a small file saying "reaplet was
//! this node's acting agent, in this boot". No kubelet counterpart (the kubelet is always its
//! node's agent); the durable termination records ([`crate::terminating::records`]) are its sibling.
//!
//! Without it a restart of an active reaplet (a package upgrade's `try-restart`, a crash, the
//! watchdog) starts passive and counts its start as a Lease renewal: with the kubelet still
//! dead, every kill under way is held for one more `takeoverAfter`, past its grace.
//!
//! Invariants:
//! * written (atomically: a temporary file renamed over it) when reaplet becomes active in
//!   standby, removed when it becomes passive; nothing in primary mode;
//! * it counts only in the boot that wrote it (a [`Stamp`] with the boot ID): after a reboot the
//!   kubelet may simply not have renewed yet, and the ordinary start rule applies;
//! * it is evidence, never a decision on its own: a restart resumes as the acting agent only
//!   when the Lease read at start is stale *and* the kubelet's health endpoint fails then
//!   ([`super::start_mode`]); a kubelet that came back meanwhile has renewed (a fresh Lease)
//!   or answers, and reaplet starts passive;
//! * read and written off the async runtime (tokio's blocking pool); a failure is logged and
//!   costs only the faster resumption.

use crate::deadline::Stamp;
use std::path::{Path, PathBuf};

/// The marker's file name in the root directory.
pub const FILE: &str = "reaplet-active.json";

/// The marker of the root directory `root_dir`.
pub fn path_in(root_dir: &Path) -> PathBuf {
    root_dir.join(FILE)
}

/// Whether the marker at `path` says reaplet was the acting agent in this boot.
pub async fn active_this_boot(path: &Path) -> bool {
    let Ok(bytes) = tokio::fs::read(path).await else {
        return false;
    };
    match serde_json::from_slice::<Stamp>(&bytes) {
        Ok(s) => !s.boot.is_empty() && s.boot == crate::deadline::boot_id(),
        Err(e) => {
            tracing::warn!(path = %path.display(), err = %e, "unreadable standby marker ignored");
            false
        }
    }
}

/// Records the role: active writes the marker (now, this boot), passive removes it.
pub async fn record(path: &Path, active: bool) {
    let r = if active {
        let tmp = path.with_extension("json.tmp");
        let body = serde_json::to_vec(&Stamp::now()).unwrap_or_default();
        match tokio::fs::write(&tmp, body).await {
            Ok(()) => tokio::fs::rename(&tmp, path).await,
            Err(e) => Err(e),
        }
    } else {
        match tokio::fs::remove_file(path).await {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            r => r,
        }
    };
    if let Err(e) = r {
        tracing::warn!(path = %path.display(), active, err = %e, "standby marker not recorded");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_marker_counts_in_its_own_boot_only() {
        let dir = tempfile::tempdir().unwrap();
        let p = path_in(dir.path());
        assert!(!active_this_boot(&p).await, "none");
        record(&p, true).await;
        assert!(active_this_boot(&p).await);
        record(&p, false).await;
        assert!(!active_this_boot(&p).await, "removed");
        record(&p, false).await; // removing none is done
        let other_boot = Stamp {
            boot: "another-boot".into(),
            ..Stamp::now()
        };
        std::fs::write(&p, serde_json::to_vec(&other_boot).unwrap()).unwrap();
        assert!(!active_this_boot(&p).await, "another boot's");
        std::fs::write(&p, b"{broken").unwrap();
        assert!(!active_this_boot(&p).await, "unreadable");
    }
}
