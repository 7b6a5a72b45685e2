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
//! * read, written and removed off the async runtime (a blocking thread), one write at a time
//!   per pod, each carrying every change made before it started, and none after the removal
//!   ([`crate::terminating::kill::KillMemory`]);
//! * a record says which containers' preStop hooks were started and, for each container, the
//!   deadline of its StopContainer ([`Stamp`]: `CLOCK_BOOTTIME` with the boot ID, so a step
//!   of the wall clock never shortens it) and whether the runtime answered it. A stop is
//!   recorded before it is sent and marked answered only when the runtime answered it (CRI has
//!   no earlier sign that a stop reached the runtime: it answers when the container stopped).
//!   A termination resumed after a restart never runs a hook twice; a stop the runtime
//!   answered continues to its deadline (never a new grace); a stop never answered may never
//!   have reached the runtime, so it is sent again as a SIGTERM bounded by its deadline but
//!   never under the 2 s floor, as often as it goes unanswered (a resend that counted down
//!   to a passed deadline sent a bare SIGKILL to a container that may never have had its
//!   SIGTERM); a stop the runtime has held for a second is marked answered ([`crate::terminating::kill`]),
//!   so only restarts within a second of a send extend a kill, by the floor each; a
//!   container with no record was never signalled and gets a fresh termination;
//! * a record of an older version (a wall-clock deadline per container) reads as stops never
//!   answered;
//! * a missing or unreadable record is an empty one (logged once): it can only make reaplet
//!   grant more time, never less;
//! * removed when the pod is finished, with the pod directory when the record was all it
//!   held (a first write makes the directory if it is missing); one left behind (a pod gone
//!   while reaplet was down) goes with its pod directory in housekeeping's orphaned-directory
//!   sweep.

use crate::deadline::Stamp;
use crate::pod::PodUid;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

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
    /// Containers (by ID) that StopContainer was sent (or about to be sent) to.
    #[serde(default, deserialize_with = "stops_any_version")]
    pub stops: BTreeMap<String, StopRecord>,
}

/// One container's stop.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StopRecord {
    /// By when it SIGKILLs at the latest.
    pub deadline: Stamp,
    /// The runtime answered the StopContainer, or it was in flight long enough to have
    /// reached the runtime, so its SIGTERM went out. Until then the stop may never have
    /// reached the runtime. (A `resent` key of older versions is ignored.)
    #[serde(default)]
    pub answered: bool,
    /// The pod's grace period the stop was sent under: only a shorter one replaces the stop
    /// (the kubelet's "only shorter" rule); one of the same or a longer grace continues it,
    /// whatever its attempt's own deadline says. `None` in records of older versions: any
    /// earlier deadline replaces it, as those versions did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grace: Option<i64>,
}

/// The stops of this version, or of an older one (a wall-clock deadline in Unix ms: a stop
/// never known to be answered).
fn stops_any_version<'de, D>(d: D) -> Result<BTreeMap<String, StopRecord>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum AnyVersion {
        Now(StopRecord),
        WallMs(i64),
    }
    let raw = BTreeMap::<String, AnyVersion>::deserialize(d)?;
    Ok(raw
        .into_iter()
        .map(|(id, v)| {
            let r = match v {
                AnyVersion::Now(r) => r,
                AnyVersion::WallMs(ms) => StopRecord {
                    deadline: Stamp::wall_only(ms),
                    answered: false,
                    grace: None,
                },
            };
            (id, r)
        })
        .collect())
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

/// What a stop about to be sent is, given the record ([`KillMemory::stop_deadline`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopStart {
    /// None was recorded, or this one comes with a shorter pod grace and SIGKILLs sooner: send
    /// it as proposed.
    Fresh,
    /// The runtime answered an earlier one: continue to its deadline, no new floor.
    Continue(Stamp),
    /// An earlier one was recorded but never answered (it may never have reached the
    /// runtime, however many times it was sent): send a SIGTERM again, bounded by its
    /// deadline, never under the floor.
    Unanswered(Stamp),
}

/// What outlives one kill attempt of a pod: which containers already had their preStop hook
/// and by when each stop already sent SIGKILLs, in memory and, for a pod worker, in the pod's
/// durable [`RecordFile`] (so a restart of reaplet continues, never restarts).
#[derive(Debug, Default)]
pub struct KillMemory {
    record: Mutex<Versioned>,
    file: Option<RecordFile>,
    /// Held while a write runs: one write at a time, so an older snapshot never lands after a
    /// newer one (an async lock: held across the blocking write, never a std lock).
    writer: tokio::sync::Mutex<()>,
}

/// The record and how many changes it has had, and how many of them are written.
#[derive(Debug, Default)]
struct Versioned {
    record: TerminationRecord,
    version: u64,
    written: u64,
    /// The pod is finished and its record removed: nothing is written any more.
    forgotten: bool,
}

impl KillMemory {
    /// Memory backed by `file`, starting from what it already records.
    pub fn durable(file: RecordFile) -> Self {
        Self {
            record: Mutex::new(Versioned {
                record: file.load(),
                ..Versioned::default()
            }),
            file: Some(file),
            writer: tokio::sync::Mutex::new(()),
        }
    }

    /// [`Self::durable`], the record read on a blocking thread (never on the async runtime).
    pub async fn load(file: RecordFile) -> Self {
        let reader = file.clone();
        let record = tokio::task::spawn_blocking(move || reader.load())
            .await
            .unwrap_or_default();
        Self {
            record: Mutex::new(Versioned {
                record,
                ..Versioned::default()
            }),
            file: Some(file),
            writer: tokio::sync::Mutex::new(()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Versioned> {
        self.record.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Applies `f` to the record; when it changed something (`f` says so), persists the
    /// change before returning. What `f` says.
    async fn change(&self, f: impl FnOnce(&mut TerminationRecord) -> bool) -> bool {
        let version = {
            let mut v = self.lock();
            if !f(&mut v.record) {
                return false;
            }
            v.version += 1;
            v.version
        };
        self.persist(version).await;
        true
    }

    /// Persists every change up to `version` (the caller's own) before returning, on a
    /// blocking thread; writes that queued behind another are folded into it (the newest
    /// snapshot is written, and a change already covered is not written again). A failure is
    /// logged and the kill goes on (the record can only ever grant more time if lost).
    async fn persist(&self, version: u64) {
        let Some(file) = &self.file else {
            return;
        };
        let _one_at_a_time = self.writer.lock().await;
        let (snapshot, newest) = {
            let v = self.lock();
            if v.written >= version || v.forgotten {
                return; // a write that started after this change carried it, or the pod is done
            }
            (v.record.clone(), v.version)
        };
        let file = file.clone();
        let r = tokio::task::spawn_blocking(move || file.save(&snapshot)).await;
        match r {
            Ok(Ok(())) => self.lock().written = newest,
            Ok(Err(e)) => tracing::warn!(err = %e, "termination record not written"),
            Err(e) => tracing::warn!(err = %e, "termination record writer failed"),
        }
    }

    /// Marks the hook of `container_id` as started (durably, before it runs); false if it
    /// already was, in this life of reaplet or an earlier one.
    pub(crate) async fn claim_prestop(&self, container_id: &str) -> bool {
        self.change(|r| r.prestop.insert(container_id.to_owned()))
            .await
    }

    /// Records the stop of `container_id` about to be sent under the pod grace `pod_grace`,
    /// SIGKILLing by `proposed`, before it is sent; what an earlier stop of it calls for
    /// instead (see [`StopStart`]). An earlier stop is replaced only by one with a shorter
    /// pod grace that SIGKILLs sooner: a retry of the same termination (its attempt's deadline
    /// counted without the floor or the hook's rounding) never ends a stop before the deadline
    /// it was sent with.
    pub(crate) async fn stop_deadline(
        &self,
        container_id: &str,
        proposed: &Stamp,
        pod_grace: i64,
    ) -> StopStart {
        let version = {
            let mut v = self.lock();
            let replaces = |r: &StopRecord| {
                r.grace.is_none_or(|g| pod_grace < g) && !r.deadline.not_after(proposed)
            };
            match v.record.stops.get(container_id) {
                Some(r) if !replaces(r) && r.answered => {
                    return StopStart::Continue(r.deadline.clone());
                }
                Some(r) if !replaces(r) => {
                    return StopStart::Unanswered(r.deadline.clone());
                }
                _ => {
                    let r = StopRecord {
                        deadline: proposed.clone(),
                        answered: false,
                        grace: Some(pod_grace),
                    };
                    v.record.stops.insert(container_id.to_owned(), r);
                    v.version += 1;
                    v.version
                }
            }
        };
        self.persist(version).await;
        StopStart::Fresh
    }

    /// The unanswered stop of `container_id` is sent again, SIGKILLing by `deadline`.
    pub(crate) async fn stop_resent(&self, container_id: &str, deadline: &Stamp) {
        self.change(|r| {
            let grace = r.stops.get(container_id).and_then(|s| s.grace);
            let resent = StopRecord {
                deadline: deadline.clone(),
                answered: false,
                grace,
            };
            r.stops.insert(container_id.to_owned(), resent);
            true
        })
        .await;
    }

    /// The preStop hook of `container_id` never reached the runtime (refused before the
    /// exec was taken): the claim goes, so the next attempt runs it.
    pub(crate) async fn release_prestop(&self, container_id: &str) {
        self.change(|r| r.prestop.remove(container_id)).await;
    }

    /// The runtime answered the stop of `container_id` (with an error: a stopped container
    /// needs no record), or the stop has been in flight long enough to have reached it: its
    /// SIGTERM went out.
    pub(crate) async fn stop_answered(&self, container_id: &str) {
        self.change(|r| match r.stops.get_mut(container_id) {
            Some(s) if !s.answered => {
                s.answered = true;
                true
            }
            _ => false,
        })
        .await;
    }

    /// The stop of `container_id` failed with no answer from the runtime (refused, timed
    /// out): whatever its time in flight said, it may never have reached the runtime, and the
    /// next one is a SIGTERM again.
    pub(crate) async fn stop_unanswered(&self, container_id: &str) {
        self.change(|r| match r.stops.get_mut(container_id) {
            Some(s) if s.answered => {
                s.answered = false;
                true
            }
            _ => false,
        })
        .await;
    }

    /// Whether the runtime answered a stop of `container_id` (in this life or an earlier
    /// one): its SIGTERM went out.
    pub(crate) fn stop_sent(&self, container_id: &str) -> bool {
        self.lock()
            .record
            .stops
            .get(container_id)
            .is_some_and(|r| r.answered)
    }

    /// The pod is finished: its record goes, on a blocking thread, after any write under way
    /// (which would otherwise bring it back) and before any later one (none is made).
    pub async fn forget(&self) {
        let Some(file) = self.file.clone() else {
            return;
        };
        let _one_at_a_time = self.writer.lock().await;
        self.lock().forgotten = true;
        if let Err(e) = tokio::task::spawn_blocking(move || file.remove()).await {
            tracing::warn!(err = %e, "termination record remover failed");
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
        r.stops.insert(
            "c1".into(),
            StopRecord {
                deadline: Stamp::now(),
                answered: true,
                grace: Some(30),
            },
        );
        f.save(&r).unwrap();
        assert_eq!(f.load(), r);
        // an older version's record: a wall-clock deadline, never known to be answered
        std::fs::write(
            f.path(),
            br#"{"prestop":["c1"],"stops":{"c1":1700000000000}}"#,
        )
        .unwrap();
        let old = f.load();
        assert!(old.prestop.contains("c1"));
        assert_eq!(
            old.stops["c1"],
            StopRecord {
                deadline: Stamp::wall_only(1_700_000_000_000),
                answered: false,
                grace: None,
            }
        );
        assert!(!f.tmp_path().exists());
        std::fs::write(f.path(), b"{not json").unwrap();
        assert_eq!(f.load(), TerminationRecord::default());
        f.remove();
        f.remove();
        assert!(!f.path().exists());
    }

    /// Issue 28, item 6: a record leaves nothing that was not there. The pod directory its
    /// first write made goes with it; one that holds anything else (the kubelet's) stays.
    /// Issue 38, item 7: a worker's record is read on a blocking thread. The record here is a
    /// FIFO, so a read blocks until a writer comes, and the writer comes only when the async
    /// runtime (one thread) runs again. Before (`KillMemory::durable` on the runtime): the
    /// runtime blocked in the read, the writer's go never came, and it wrote after its 5 s.
    #[tokio::test(flavor = "current_thread")]
    async fn a_record_is_read_off_the_async_runtime() {
        let dir = tempfile::tempdir().unwrap();
        let f = RecordFile::for_pod(dir.path(), &PodUid::parse("u1").unwrap());
        std::fs::create_dir_all(f.path().parent().unwrap()).unwrap();
        rustix::fs::mkfifoat(
            rustix::fs::CWD,
            f.path(),
            rustix::fs::Mode::from_raw_mode(0o600),
        )
        .unwrap();
        let (go, went) = std::sync::mpsc::channel::<()>();
        let path = f.path().to_owned();
        let writer = std::thread::spawn(move || {
            let came = went.recv_timeout(std::time::Duration::from_secs(5)).is_ok();
            std::fs::write(&path, br#"{"prestop":["c1"]}"#).unwrap();
            came
        });
        let load = tokio::spawn(KillMemory::load(f.clone()));
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let _ = go.send(());
        let memory = load.await.unwrap();
        assert!(
            writer.join().unwrap(),
            "the async runtime was blocked reading the record"
        );
        assert!(!memory.claim_prestop("c1").await, "read what was written");
    }

    /// Issue 38, item 7: the removal waits for a write under way and no write comes after it
    /// (before, `forget` took no turn: a write still on its blocking thread could bring the
    /// record back after the removal).
    #[tokio::test]
    async fn a_forgotten_record_is_never_written_again() {
        let dir = tempfile::tempdir().unwrap();
        let f = RecordFile::for_pod(dir.path(), &PodUid::parse("u1").unwrap());
        let memory = std::sync::Arc::new(KillMemory::load(f.clone()).await);
        let m = memory.clone();
        let writes = tokio::spawn(async move {
            for i in 0..50 {
                m.stop_deadline(&format!("c{i}"), &Stamp::now(), 30).await;
            }
        });
        tokio::task::yield_now().await;
        memory.forget().await;
        writes.await.unwrap();
        assert!(!f.path().exists(), "a write after the removal");
        assert!(!f.path().parent().unwrap().exists());
    }

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
