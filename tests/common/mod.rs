//! Shared harness for the integration tests: a private containerd (the test bed) per test,
//! and the real pipeline wired to it.
#![allow(dead_code)]

use reaplet::authority::Authority;
use reaplet::cgroups::CgroupManager;
use reaplet::cri::{ContainerDetail, CriClient, Runtime};
use reaplet::events::{EventSink, PodEvent};
use reaplet::pod::PodUid;
use reaplet::testbed::Testbed;
use reaplet::workers::{PipelineConfig, PodView, PodWorkers};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub mod apiserver;

pub struct Harness {
    pub workers: PodWorkers<CriClient>,
    pub events: mpsc::Receiver<PodEvent>,
    pub cancel: CancellationToken,
    pub tracker: TaskTracker,
    pub root_dir: tempfile::TempDir,
    pub client: CriClient,
    pub cgroups: CgroupManager,
    // dropped last: stops containerd after the pipeline
    pub tb: Testbed,
}

pub fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

impl Harness {
    pub async fn new(name: &str) -> Harness {
        let tb = Testbed::start(repo(), name);
        let client = tb.client();
        let cgroups =
            CgroupManager::from_mountinfo(Path::new("/proc/self/mountinfo"), tb.naming()).unwrap();
        let root_dir = tempfile::tempdir().unwrap();
        let (events, rx) = EventSink::channel(1024);
        let cancel = CancellationToken::new();
        let tracker = TaskTracker::new();
        let config = PipelineConfig {
            root_dir: root_dir.path().to_owned(),
            volume_poll: Duration::from_millis(100),
            ..PipelineConfig::default()
        };
        let workers = PodWorkers::new(
            Arc::new(client.clone()),
            cgroups.clone(),
            config,
            events,
            Arc::new(Authority::default()),
            cancel.clone(),
            tracker.clone(),
        );
        tracker.spawn(workers.clone().run_housekeeping());
        Harness {
            workers,
            events: rx,
            cancel,
            tracker,
            root_dir,
            client,
            cgroups,
            tb,
        }
    }

    /// Waits until the pod reaches `state` (panics after `limit`).
    pub async fn wait_state(&self, uid: &PodUid, state: &str, limit: Duration) -> PodView {
        let start = tokio::time::Instant::now();
        loop {
            if let Some(v) = self.workers.view(uid)
                && v.state == state
            {
                return v;
            }
            if start.elapsed() > limit {
                panic!(
                    "pod {uid} did not reach {state} within {limit:?}: {:?}\ncontainerd log tail:\n{}",
                    self.workers.view(uid),
                    tail(&self.tb.containerd_log(), 30)
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn status(&self, container_id: &str) -> ContainerDetail {
        self.client.container_status(container_id).await.unwrap()
    }

    pub fn drain_events(&mut self) -> Vec<PodEvent> {
        let mut out = Vec::new();
        while let Ok(e) = self.events.try_recv() {
            out.push(e);
        }
        out
    }

    /// Every pod cgroup directory of `uid` still present, in any hierarchy.
    pub fn pod_cgroups(&self, uid: &PodUid) -> Vec<PathBuf> {
        self.cgroups
            .existing(uid)
            .unwrap()
            .into_iter()
            .map(|(_, p)| p)
            .collect()
    }

    /// Asserts nothing of the pod runs and no pod cgroup is left.
    pub async fn assert_gone(&self, uid: &PodUid) {
        let cs = self
            .client
            .list_containers(Some(uid.as_str()))
            .await
            .unwrap();
        assert!(
            cs.iter().all(|c| !c.state.may_run()),
            "containers still running: {cs:?}"
        );
        let sbs = self
            .client
            .list_sandboxes(Some(uid.as_str()))
            .await
            .unwrap();
        assert!(
            sbs.iter().all(|s| !s.ready),
            "sandboxes still ready: {sbs:?}"
        );
        assert_eq!(
            self.pod_cgroups(uid),
            Vec::<PathBuf>::new(),
            "pod cgroups left"
        );
    }

    pub async fn shutdown(self) {
        self.cancel.cancel();
        self.tracker.close();
        let _ = tokio::time::timeout(Duration::from_secs(5), self.tracker.wait()).await;
    }
}

pub fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Wall-clock nanoseconds, comparable with CRI timestamps.
pub fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64
}

pub fn secs(ns: i64) -> f64 {
    ns as f64 / 1e9
}

/// Kills a spawned reaplet if the test fails before stopping it (a kill after the child was
/// waited for is harmless: pids are not reused that fast).
pub struct KillOnDrop(pub u32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill")
            .args(["-KILL", &self.0.to_string()])
            .status();
    }
}
