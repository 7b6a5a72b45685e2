//! Shared harness for the integration tests: a private containerd (the test bed) per test,
//! and the real pipeline wired to it.
#![allow(dead_code)]

use reaplet::authority::Authority;
use reaplet::cgroups::CgroupManager;
use reaplet::cri::{ContainerDetail, CriClient, Runtime};
use reaplet::events::{EventSink, PodEvent};
#[allow(unused_imports)]
pub use reaplet::lifecycle::{KillReason, PodPhase};
use reaplet::pod::PodUid;
use reaplet::workers::{PipelineConfig, PodView, PodWorkers};
use reaplet_testbed::Testbed;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub mod api_harness;
pub mod apiserver;
pub mod exits;
pub mod mounts;
pub mod otlp;
pub mod process;
pub mod standin;
pub use process::*;

pub struct Harness {
    pub workers: PodWorkers<CriClient>,
    /// The one check every kill (and every sweep) passes: `set_active(false)` is standby.
    pub authority: Arc<Authority>,
    pub events: mpsc::Receiver<PodEvent>,
    pub cancel: CancellationToken,
    pub tracker: TaskTracker,
    pub root_dir: tempfile::TempDir,
    pub client: CriClient,
    pub cgroups: CgroupManager,
    // dropped last: stops containerd after the pipeline
    pub tb: Testbed,
}

impl Harness {
    pub async fn new(name: &str) -> Harness {
        Self::with(name, |_| {}).await
    }

    /// With pipeline settings changed by `f`.
    pub async fn with(name: &str, f: impl FnOnce(&mut PipelineConfig)) -> Harness {
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
            // the leak tests make their leftovers on the spot
            orphan_min_age: Duration::ZERO,
            ..PipelineConfig::default()
        };
        let mut config = config;
        f(&mut config);
        let authority = Arc::new(Authority::default());
        let workers = PodWorkers::new(
            Arc::new(client.clone()),
            cgroups.clone(),
            config,
            events,
            authority.clone(),
            cancel.clone(),
            tracker.clone(),
        );
        tracker.spawn(workers.clone().run_housekeeping());
        Harness {
            workers,
            authority,
            events: rx,
            cancel,
            tracker,
            root_dir,
            client,
            cgroups,
            tb,
        }
    }

    /// The pods as a source's complete list, through the seam the sources use.
    pub fn desire(&self, pods: Vec<reaplet::pod::PodInfo>) {
        for p in pods {
            self.workers.upsert(p);
        }
        self.workers.mark_source_synced("test", reaplet::wall_ns());
    }

    /// Waits until the pod reaches `phase` (panics after `limit`).
    pub async fn wait_state(&self, uid: &PodUid, phase: PodPhase, limit: Duration) -> PodView {
        let start = tokio::time::Instant::now();
        loop {
            if let Some(v) = self.workers.view(uid)
                && v.phase == phase
            {
                return v;
            }
            if start.elapsed() > limit {
                panic!(
                    "pod {uid} did not reach {phase:?} within {limit:?}: {:?}\ncontainerd log tail:\n{}",
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

    /// Each container's status as soon as it has exited (polled every 20 ms, at most `limit`):
    /// a finished orphan's containers are garbage-collected right after, so a read after the
    /// pod finished may find them gone.
    pub async fn exited(&self, ids: &[&str], limit: Duration) -> Vec<ContainerDetail> {
        let start = tokio::time::Instant::now();
        let mut got: Vec<Option<ContainerDetail>> = vec![None; ids.len()];
        while got.iter().any(Option::is_none) {
            for (slot, id) in got.iter_mut().zip(ids) {
                if slot.is_none() {
                    let st = self
                        .client
                        .container_status(id)
                        .await
                        .unwrap_or_else(|e| panic!("{id} gone before it was seen exited: {e}"));
                    if st.state == reaplet::cri::ContainerRunState::Exited {
                        *slot = Some(st);
                    }
                }
            }
            assert!(
                start.elapsed() < limit,
                "not exited within {limit:?}: {ids:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        got.into_iter().flatten().collect()
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

/// Wall-clock nanoseconds, comparable with CRI timestamps.
pub fn now_ns() -> i64 {
    reaplet::wall_ns()
}

pub fn secs(ns: i64) -> f64 {
    ns as f64 / 1e9
}

/// Asserts a container exited with `exit` within `range` seconds (start inclusive, end
/// exclusive) of `t0` (wall-clock ns): never before its grace, never long after it.
#[track_caller]
pub fn assert_stopped(st: &ContainerDetail, t0: i64, exit: i32, range: std::ops::Range<f64>) {
    let took = secs(st.finished_at - t0);
    assert_eq!(st.exit_code, exit, "exit code after {took:.3}s");
    assert!(
        took >= range.start,
        "stopped after {took:.3}s: earlier than {:.1}s",
        range.start
    );
    assert!(
        took < range.end,
        "stopped after {took:.3}s: later than {:.1}s",
        range.end
    );
}

/// `reaplet run` as node `testnode` against a test bed, with `root_dir` as its root dir.
pub fn reaplet_run(tb: &Testbed, root_dir: &Path) -> std::process::Command {
    let mut c = reaplet();
    c.arg("run")
        .args(["--hostname-override", "testnode"])
        .args(["--container-runtime-endpoint", &tb.endpoint()])
        .args(["--cgroup-root", &tb.cgroup_root])
        .arg("--root-dir")
        .arg(root_dir);
    c
}

impl Harness {
    /// Launches `t` in the runtime and makes it the whole desired set.
    pub async fn launch_desired(
        &self,
        t: &reaplet_testbed::PodTemplate,
    ) -> reaplet_testbed::LaunchedPod {
        let p = reaplet_testbed::launch(&self.tb, t).await.unwrap();
        self.desire(vec![t.pod_info()]);
        p
    }
}

/// `reaplet run` (see [`reaplet_run`]) in the background with `extra` arguments, an ephemeral
/// status port and its log appended to `log`.
pub fn spawn_reaplet(
    tb: &Testbed,
    root_dir: &Path,
    extra: &[&str],
    log: &Path,
) -> std::process::Child {
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .expect("reaplet log");
    let mut c = reaplet_run(tb, root_dir);
    // a free port unless the caller names one (it reads the metrics)
    if !extra.contains(&"--metrics-bind-address") {
        c.args(["--metrics-bind-address", "127.0.0.1:0"]);
    }
    c.args(extra)
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(out)
        .spawn()
        .expect("spawning reaplet")
}

/// reaplet's pod watch requests so far.
pub fn watches(reqs: &[apiserver::Recorded]) -> usize {
    reqs.iter()
        .filter(|r| {
            r.path == "/api/v1/pods"
                && r.query
                    .get("watch")
                    .is_some_and(|w| w == "true" || w == "1")
        })
        .count()
}

/// Waits (up to 40 s) until reaplet has opened more than `seen` pod watches.
pub async fn wait_watches(api: &apiserver::ApiServer, seen: usize) {
    let start = std::time::Instant::now();
    while watches(&api.requests()) <= seen {
        assert!(
            start.elapsed() < Duration::from_secs(40),
            "reaplet never started watching pods"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits (polling every 20 ms) until `path` exists; fails after `limit` naming `what`.
pub async fn wait_exists(path: &Path, limit: Duration, what: &str) {
    let start = std::time::Instant::now();
    while !path.exists() {
        assert!(start.elapsed() < limit, "no {what} after {limit:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits (polling every 20 ms) until none of `names` is in the API; returns how long that took.
/// Fails after `limit`, with the pods left and `context()` (a log tail, say).
pub async fn wait_pods_gone(
    api: &apiserver::ApiServer,
    names: &[&str],
    limit: Duration,
    context: impl Fn() -> String,
) -> Duration {
    let start = std::time::Instant::now();
    loop {
        let left: Vec<&&str> = names
            .iter()
            .filter(|n| api.get_pod("default", n).is_some())
            .collect();
        if left.is_empty() {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < limit,
            "pods {left:?} still in the API after {limit:?}\n{}",
            context()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until reaplet watches pods, then a moment more for every pod to be in sync.
pub async fn wait_in_sync(api: &apiserver::ApiServer) {
    wait_watches(api, 0).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
}

/// Pods of one container `app` running its script, each with `grace`, in the API server and
/// the runtime (see [`launch_in_api`]).
pub async fn launch_app_pods<N: AsRef<str>>(
    api: &apiserver::ApiServer,
    tb: &Testbed,
    grace: i64,
    pods: impl IntoIterator<Item = (N, &'static str)>,
) -> Vec<(reaplet_testbed::PodTemplate, reaplet_testbed::LaunchedPod)> {
    let mut out = Vec::new();
    for (name, script) in pods {
        let t = reaplet_testbed::PodTemplate::new(name.as_ref(), grace)
            .container(reaplet_testbed::ContainerTemplate::new("app", script));
        let p = launch_in_api(api, tb, &t).await;
        out.push((t, p));
    }
    out
}

/// A private containerd, the API server, a root directory and in it a kubeconfig for node
/// `testnode`.
pub async fn api_bed(name: &str) -> (Testbed, apiserver::ApiServer, tempfile::TempDir, PathBuf) {
    let tb = Testbed::start(repo(), name);
    let api = apiserver::ApiServer::start().await;
    let root = tempfile::tempdir().unwrap();
    let kc = api.write_kubeconfig(root.path(), "testnode");
    (tb, api, root, kc)
}

/// `t` as an object in the API server and as a pod in the runtime (same UID), as a node has it
/// after the scheduler bound it and the kubelet started it.
pub async fn launch_in_api(
    api: &apiserver::ApiServer,
    tb: &Testbed,
    t: &reaplet_testbed::PodTemplate,
) -> reaplet_testbed::LaunchedPod {
    api.create_pod(t.api_object());
    reaplet_testbed::launch(tb, t)
        .await
        .expect("launching a pod")
}

/// A status manager of its own, as node `node`, against `api`: resyncs every 200 ms (so that
/// a retry after 1 s, 2 s, ... shows within a test's window), stopped by the returned token.
pub async fn status_manager(
    api: &apiserver::ApiServer,
    dir: &Path,
    node: &str,
) -> (
    reaplet::api::status_manager::StatusManager,
    CancellationToken,
) {
    let kc = api.write_kubeconfig(dir, node);
    let client =
        reaplet::api::client::client(reaplet::api::client_config(Some(&kc)).await.unwrap())
            .expect("a client");
    // the agent's view of the API server, and its prober (which alone tries a server that
    // stopped answering)
    let health = reaplet::api::health::ApiHealth::new();
    let sm = reaplet::api::status_manager::StatusManager::new(
        client.clone(),
        Arc::new(reaplet::api::RateLimiter::new(50.0, 100)),
        Duration::from_millis(200),
        health.clone(),
        None,
    );
    let cancel = CancellationToken::new();
    tokio::spawn(reaplet::api::health::probe(health, client, cancel.clone()));
    tokio::spawn(sm.clone().run(cancel.clone()));
    (sm, cancel)
}

/// What the runtime reports of container `app` that ran 5 s and exited with `exit_code`.
pub fn exited_app(exit_code: i32, reason: &str) -> [reaplet::status::ContainerFinal; 1] {
    let now = now_ns();
    [reaplet::status::ContainerFinal {
        name: "app".into(),
        id: "c0".into(),
        state: reaplet::cri::ContainerRunState::Exited,
        exit_code,
        reason: reason.into(),
        started_at: now - 5_000_000_000,
        finished_at: now,
        attempt: 0,
    }]
}

/// Asserts container `id` runs through the whole of `window` (looked at every 50 ms): the
/// negative checks' shape. On failure: `what`, when, and `context()` (a log tail, say).
pub async fn assert_runs_for(
    client: &CriClient,
    id: &str,
    window: Duration,
    what: &str,
    context: impl Fn() -> String,
) {
    let start = std::time::Instant::now();
    while start.elapsed() < window {
        let st = client.container_status(id).await.unwrap();
        assert!(
            st.state.may_run(),
            "{what} after {:?}\n{}",
            start.elapsed(),
            context()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
pub mod crossing;
pub mod gate;
pub mod helm;
#[path = "kube/mod.rs"]
pub mod k8s;
pub mod kube_node;
pub mod port;
