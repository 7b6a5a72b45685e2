//! Durable termination records: what reaplet already did to a pod's containers, kept across
//! its own restarts (the kubelet keeps nothing, and restarts a termination's grace from zero
//! after a restart, running preStop hooks again). The counterpart of the kubelet's
//! `checkpointmanager` for this one purpose.
//!
//! Invariants:
//! * one small JSON file per pod, `<root-dir>/pods/<uid>/reaplet-termination.json`, written
//!   to a temporary file and renamed over the old one: a crash of reaplet leaves the old
//!   record or the new one, never half of one;
//! * nothing is fsynced, and that is the whole crash-safety argument: the record protects a
//!   termination against a restart of *reaplet*, and after a reaplet crash the kernel still
//!   holds every write it made (the page cache outlives the process; the rename is atomic in
//!   it). Only a crash of the *node* loses unsynced writes, and a node crash ends the pod's
//!   containers too: there is then nothing left to continue, and a lost or empty record only
//!   ever grants more time (next point). Two fsyncs per StopContainer bought nothing but
//!   latency in a bulk deletion;
//! * written off the async runtime (a blocking thread), one write at a time per pod, each
//!   carrying every change made before it started ([`crate::kill::KillMemory`]);
//! * a record says which containers' preStop hooks were started and, for each container, the
//!   deadline (wall-clock Unix ms, this node's own clock) of the first StopContainer sent: a
//!   termination resumed after a restart continues to it, never restarts the full grace and
//!   never runs a hook twice; a container with no record was never signalled and gets a fresh
//!   termination;
//! * a missing or unreadable record is an empty one (logged once): it can only make reaplet
//!   grant more time, never less;
//! * removed when the pod is finished, with the pod directory when the record was all it
//!   held (a first write makes the directory if it is missing); one left behind (a pod gone
//!   while reaplet was down) goes with its pod directory in housekeeping's orphaned-directory
//!   sweep.

use crate::pod::PodUid;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};

const FILE: &str = "reaplet-termination.json";

#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("writing the termination record {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// What was done to a pod's containers.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TerminationRecord {
    /// Containers (by ID) whose preStop hook was started.
    #[serde(default)]
    pub prestop: BTreeSet<String>,
    /// Containers (by ID) that were sent StopContainer, and by when (Unix ms) that stop
    /// SIGKILLs at the latest.
    #[serde(default)]
    pub stops: BTreeMap<String, i64>,
}

/// The record file of one pod.
#[derive(Debug, Clone)]
pub struct RecordFile {
    path: PathBuf,
}

impl RecordFile {
    pub fn for_pod(root_dir: &Path, uid: &PodUid) -> Self {
        Self {
            path: root_dir.join("pods").join(uid.as_str()).join(FILE),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Where a write is made before it is renamed over the record.
    fn tmp_path(&self) -> PathBuf {
        self.path.with_file_name(format!(".{FILE}.tmp"))
    }

    /// The record, or an empty one if there is none (or it cannot be read).
    pub fn load(&self) -> TerminationRecord {
        match std::fs::read(&self.path) {
            Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|e| {
                tracing::warn!(path = %self.path.display(), err = %e, "unreadable termination record ignored");
                TerminationRecord::default()
            }),
            Err(_) => TerminationRecord::default(),
        }
    }

    /// Writes `r` atomically (see the module doc for why not durably). Blocking: call it off
    /// the async runtime.
    pub fn save(&self, r: &TerminationRecord) -> Result<(), RecordError> {
        let err = |source| RecordError::Write {
            path: self.path.clone(),
            source,
        };
        let dir = self.path.parent().unwrap_or(Path::new("/"));
        std::fs::create_dir_all(dir).map_err(err)?;
        let tmp = self.tmp_path();
        let bytes = serde_json::to_vec(r).unwrap_or_default();
        let mut f = std::fs::File::create(&tmp).map_err(err)?;
        f.write_all(&bytes).map_err(err)?;
        drop(f);
        std::fs::rename(&tmp, &self.path).map_err(err)?;
        Ok(())
    }

    /// Removes the record (gone already is done), and the pod directory if the record was
    /// all it held: a first write makes the directory when it is missing (a pod whose
    /// directory was already cleaned up), and nothing of reaplet's stays behind. An `rmdir`
    /// removes only an empty directory, so a pod directory with anything else in it (the
    /// kubelet's volumes, plugins, containers) is never touched.
    pub fn remove(&self) {
        match std::fs::remove_file(&self.path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(path = %self.path.display(), err = %e, "removing the termination record failed");
                return;
            }
        }
        // a write that failed after its temporary file was made
        let _ = std::fs::remove_file(self.tmp_path());
        // ENOTEMPTY (someone else's), ENOENT (gone): nothing to do
        if let Some(dir) = self.path.parent() {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_atomic_and_missing_or_corrupt_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        let f = RecordFile::for_pod(dir.path(), &PodUid::parse("u1").unwrap());
        assert_eq!(f.load(), TerminationRecord::default());
        let mut r = TerminationRecord::default();
        r.prestop.insert("c1".into());
        r.stops.insert("c1".into(), 1_700_000_000_000);
        f.save(&r).unwrap();
        assert_eq!(f.load(), r);
        assert!(!f.tmp_path().exists());
        std::fs::write(f.path(), b"{not json").unwrap();
        assert_eq!(f.load(), TerminationRecord::default());
        f.remove();
        f.remove();
        assert!(!f.path().exists());
    }

    /// Issue 28, item 6: a record leaves nothing that was not there. The pod directory its
    /// first write made goes with it; one that holds anything else (the kubelet's) stays.
    #[test]
    fn a_removed_record_leaves_no_directory_of_its_own() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("pods")).unwrap();
        let f = RecordFile::for_pod(dir.path(), &PodUid::parse("u1").unwrap());
        f.save(&TerminationRecord::default()).unwrap();
        f.remove();
        assert!(
            !dir.path().join("pods/u1").exists(),
            "the record's own directory"
        );
        assert!(
            dir.path().join("pods").exists(),
            "the kubelet's pods directory stays"
        );
        let kubelets = dir.path().join("pods/u2/volumes");
        std::fs::create_dir_all(&kubelets).unwrap();
        let g = RecordFile::for_pod(dir.path(), &PodUid::parse("u2").unwrap());
        g.save(&TerminationRecord::default()).unwrap();
        g.remove();
        assert!(!g.path().exists());
        assert!(kubelets.exists(), "a pod directory with more in it stays");
    }
}
