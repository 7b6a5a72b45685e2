//! Pod workers and housekeeping: kubelet's `podWorkers` (`pod_workers.go`: one goroutine per
//! pod UID, `UpdatePod`, `SyncTerminatingPod`, `SyncTerminatedPod`) and the parts of
//! `HandlePodCleanups` (`kubelet_pods.go`) that find orphaned runtime pods, plus natural
//! completion and garbage collection of orphans' sandboxes.
//!
//! Invariants:
//! * one owner task per pod UID, fed by a coalescing mailbox: the newest update wins, kill
//!   requests and their completion notices are never lost;
//! * the registry lock is a plain mutex never held across an await;
//! * the lifecycle decisions are [`crate::lifecycle::step`]; this module only runs effects;
//! * a kill is a cancellable future: a shorter grace drops the in-flight kill (and its CRI
//!   calls) and starts a new one at once; cancellation of reaplet itself abandons work and
//!   never kills a pod;
//! * orphans are acted on only once the desired pod set has been delivered at least once;
//! * a transition never waits for a poll: a kill completes when the runtime's stop calls
//!   return, and the runtime is re-read right away.

use crate::authority::Authority;
use crate::cgroups::CgroupManager;
use crate::cri::{ContainerRunState, Runtime, RuntimeContainer};
use crate::events::{EventReason, EventSink, PodEvent};
use crate::grace;
use crate::kill::{self, KillMemory};
use crate::lifecycle::{self, CleanupStage, Effect, Input, KillReason, PodMachine};
use crate::metrics::Metrics;
use crate::pod::{self, PodInfo, PodUid, RestartPolicy};
use crate::status::ContainerFinal;
use crate::volumes;
use crate::wall_ns;
use futures_util::future::BoxFuture;
use rand::Rng;
use std::collections::HashMap;
use std::collections::HashSet;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::OnceLock;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

/// Settings of the pipeline (resolved and validated by the caller).
#[derive(Debug, Clone)]
pub struct PipelineConfig {
    /// kubelet's `--root-dir`: volumes live in `<root_dir>/pods/<uid>/volumes`.
    pub root_dir: PathBuf,
    /// mountinfo to read (`/proc/self/mountinfo`).
    pub mountinfo: PathBuf,
    /// Volume poll period (kubelet: 100–300 ms) and overall bound (kubelet: 2 min 3 s).
    pub volume_poll: Duration,
    pub volume_wait: Duration,
    /// Runtime relist period when the runtime has no container events (containerd 1.6).
    pub relist_period: Duration,
    /// Relist period when container events drive relists.
    pub relist_period_with_events: Duration,
    /// A kill still running this long after its deadline gets an `ExceededGracePeriod` event.
    pub exceeded_grace_slack: Duration,
}

impl Default for PipelineConfig {
    fn default() -> Self {
        Self {
            root_dir: "/var/lib/kubelet".into(),
            mountinfo: "/proc/self/mountinfo".into(),
            volume_poll: Duration::from_millis(200),
            volume_wait: Duration::from_secs(123),
            relist_period: Duration::from_secs(1),
            relist_period_with_events: Duration::from_secs(10),
            exceeded_grace_slack: Duration::from_secs(10),
        }
    }
}

/// A kill through the seam (eviction, shutdown, preemption, orphan).
#[derive(Debug)]
pub struct KillRequest {
    pub grace_override: Option<i64>,
    pub reason: KillReason,
    /// Completed once the pod's containers and sandboxes are stopped.
    pub done: Option<oneshot::Sender<()>>,
}

/// Where the workers report how a pod ended (the status manager).
pub trait StatusSink: Send + Sync + 'static {
    /// Every container and sandbox of the pod is stopped; `finals` is what the runtime says of
    /// its containers. Called once per pod, before cleanup.
    fn pod_terminated(&self, pod: &PodInfo, reason: Option<&KillReason>, finals: &[ContainerFinal]);
    /// Cleanup (volumes, cgroup) finished: nothing of the pod is left on the node.
    fn pod_finished(&self, pod: &PodInfo);
}

/// A failed cleanup stage (retried with backoff by the worker).
#[derive(Debug, thiserror::Error)]
pub enum CleanupError {
    #[error(transparent)]
    Volumes(#[from] volumes::VolumeError),
    #[error(transparent)]
    Cgroup(#[from] crate::cgroups::CgroupError),
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SeamError {
    #[error("pod {0}: unknown to this agent")]
    UnknownPod(String),
}

/// A read-only view of one pod, for `reaplet pods` and tests.
#[derive(Debug, Clone, PartialEq)]
pub struct PodView {
    pub uid: PodUid,
    pub key: String,
    pub state: &'static str,
    pub grace: Option<i64>,
    /// When the current kill SIGKILLs at the latest.
    pub deadline: Option<Instant>,
    pub step: &'static str,
    pub reason: Option<&'static str>,
    /// Where the pod came from: `api`, `file` (static) or `runtime` (orphan).
    pub config: &'static str,
}

#[derive(Default)]
struct Pending {
    update: Option<PodInfo>,
    kills: Vec<KillRequest>,
    /// The worker has finished: kills complete at once, updates are ignored.
    closed: bool,
}

/// A coalescing channel to one worker.
#[derive(Default)]
struct Mailbox {
    pending: Mutex<Pending>,
    notify: Notify,
}

impl Mailbox {
    fn lock(&self) -> MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn send_update(&self, mut pod: PodInfo) {
        let mut p = self.lock();
        // coalescing keeps only the newest object, but never loses a resumed kill deadline
        if let Some(old) = p.update.as_ref().and_then(|u| u.kill_deadline) {
            pod.kill_deadline = Some(pod.kill_deadline.map_or(old, |d| d.min(old)));
        }
        p.update = Some(pod);
        drop(p);
        self.notify.notify_one();
    }

    fn send_kill(&self, kill: KillRequest) {
        let mut p = self.lock();
        if p.closed {
            if let Some(done) = kill.done {
                let _ = done.send(());
            }
            return;
        }
        p.kills.push(kill);
        drop(p);
        self.notify.notify_one();
    }

    /// Called by a finishing worker: completes every pending kill notice, and all later ones.
    fn close(&self) {
        let mut p = self.lock();
        p.closed = true;
        for k in p.kills.drain(..) {
            if let Some(done) = k.done {
                let _ = done.send(());
            }
        }
    }
}

struct Worker {
    mailbox: Arc<Mailbox>,
    view: Arc<Mutex<PodView>>,
}

impl Worker {
    fn view(&self) -> PodView {
        self.view.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

#[derive(Default)]
struct Registry {
    desired: HashMap<PodUid, PodInfo>,
    /// Wall-clock time (ns) as of which every source's view is complete: runtime pods created
    /// before it and unknown to every source are orphans; newer ones may simply not have
    /// reached reaplet yet and are left alone. `None` until every source listed once.
    synced_at: Option<i64>,
    /// Sources to wait for, and when each last delivered a complete list.
    sources: HashSet<&'static str>,
    last_list: HashMap<&'static str, i64>,
    workers: HashMap<PodUid, Worker>,
}

struct Inner<R> {
    runtime: Arc<R>,
    cgroups: CgroupManager,
    config: PipelineConfig,
    events: EventSink,
    authority: Arc<Authority>,
    cancel: CancellationToken,
    tracker: TaskTracker,
    registry: Mutex<Registry>,
    relist_now: Notify,
    status: OnceLock<Arc<dyn StatusSink>>,
    metrics: OnceLock<Arc<Metrics>>,
    /// Housekeeping's last pass (ms since `started`), for the watchdog.
    heartbeat: std::sync::atomic::AtomicU64,
    started: Instant,
    /// Test hook (feature `test-hooks`, never in release packages): a frozen housekeeping
    /// loop stops at its next pass forever, as a wedged main loop would.
    #[cfg(feature = "test-hooks")]
    frozen: Notify,
}

/// The pipeline: pod workers plus housekeeping. Cheap to clone.
pub struct PodWorkers<R> {
    inner: Arc<Inner<R>>,
}

impl<R> Clone for PodWorkers<R> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<R: Runtime> PodWorkers<R> {
    /// Builds the pipeline. Nothing runs until [`PodWorkers::run_housekeeping`] is spawned or a
    /// pod is fed; every task goes on `tracker` and stops on `cancel`.
    pub fn new(
        runtime: Arc<R>,
        cgroups: CgroupManager,
        config: PipelineConfig,
        events: EventSink,
        authority: Arc<Authority>,
        cancel: CancellationToken,
        tracker: TaskTracker,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                runtime,
                cgroups,
                config,
                events,
                authority,
                cancel,
                tracker,
                registry: Mutex::default(),
                relist_now: Notify::new(),
                status: OnceLock::new(),
                metrics: OnceLock::new(),
                heartbeat: std::sync::atomic::AtomicU64::new(0),
                started: Instant::now(),
                #[cfg(feature = "test-hooks")]
                frozen: Notify::new(),
            }),
        }
    }

    /// Test hook (feature `test-hooks`): wedges the housekeeping loop for good, so the
    /// watchdog path can be exercised. Not compiled into release packages.
    #[cfg(feature = "test-hooks")]
    pub fn freeze_housekeeping(&self) {
        self.inner.frozen.notify_one();
    }

    /// Connects the metrics. Call before feeding pods; a second call is ignored.
    pub fn set_metrics(&self, metrics: Arc<Metrics>) {
        let _ = self.inner.metrics.set(metrics);
    }

    /// Every source has delivered a complete list (orphans are being judged).
    pub fn is_synced(&self) -> bool {
        self.registry().synced_at.is_some()
    }

    /// How long ago housekeeping last completed a pass (the main loop's liveness).
    pub fn since_heartbeat(&self) -> Duration {
        let beat = self
            .inner
            .heartbeat
            .load(std::sync::atomic::Ordering::Relaxed);
        self.inner
            .started
            .elapsed()
            .saturating_sub(Duration::from_millis(beat))
    }

    /// Counts pods by (lifecycle, source) into the working-pods gauges.
    pub fn update_gauges(&self) {
        let Some(m) = self.inner.metrics.get() else {
            return;
        };
        let mut counts: HashMap<(&'static str, &'static str), i64> = HashMap::new();
        for v in self.snapshot() {
            *counts.entry((v.state, v.config)).or_default() += 1;
        }
        m.set_working_pods(&counts);
    }

    /// Connects the status manager. Call before feeding pods; a second call is ignored.
    pub fn set_status_sink(&self, sink: Arc<dyn StatusSink>) {
        let _ = self.inner.status.set(sink);
    }

    /// With several pod sources, orphans are judged only once each of `names` has delivered
    /// a complete list ([`PodWorkers::mark_source_synced`]).
    pub fn expect_sources(&self, names: &[&'static str]) {
        self.registry().sources.extend(names.iter().copied());
    }

    /// Source `name` has just delivered a complete list (call it for every one: the initial
    /// list, re-lists, each directory scan).
    pub fn mark_source_synced(&self, name: &'static str) {
        let mut reg = self.registry();
        reg.last_list.insert(name, wall_ns());
        let all = reg.sources.iter().all(|s| reg.last_list.contains_key(s));
        if !all {
            return;
        }
        let at = reg
            .sources
            .iter()
            .filter_map(|s| reg.last_list.get(s))
            .copied()
            .min()
            .unwrap_or_else(wall_ns);
        let first = reg.synced_at.is_none();
        reg.synced_at = Some(at);
        drop(reg);
        if first {
            tracing::info!("all pod sources synced; orphans are judged from now on");
            self.inner.relist_now.notify_one();
        }
    }

    fn registry(&self) -> MutexGuard<'_, Registry> {
        self.inner
            .registry
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Delivers the complete desired pod set (an initial list or a relist). Pods missing from
    /// it that were known are treated as gone with `gone_grace` (the API source passes
    /// [`grace::ORPHAN_GRACE`]: a vanished object is a force delete).
    pub fn set_desired(&self, pods: Vec<PodInfo>, gone_grace: Option<i64>) {
        let new: HashMap<PodUid, PodInfo> = pods.into_iter().map(|p| (p.uid.clone(), p)).collect();
        let gone: Vec<PodUid> = {
            let reg = self.registry();
            reg.desired
                .keys()
                .filter(|u| !new.contains_key(*u))
                .cloned()
                .collect()
        };
        for uid in gone {
            self.remove(&uid, gone_grace);
        }
        for pod in new.into_values() {
            self.upsert(pod);
        }
        self.registry().synced_at = Some(wall_ns());
        self.inner.relist_now.notify_one();
    }

    /// A pod was added or changed.
    pub fn upsert(&self, pod: PodInfo) {
        let mut reg = self.registry();
        reg.desired.insert(pod.uid.clone(), pod.clone());
        let needs_worker = pod.deletion_requested || pod.terminal_phase;
        if let Some(w) = reg.workers.get(&pod.uid) {
            w.mailbox.send_update(pod);
        } else if needs_worker {
            let w = self.spawn_worker(pod.clone());
            w.mailbox.send_update(pod.clone());
            reg.workers.insert(pod.uid, w);
        }
    }

    /// A pod left the desired set. `grace_override`: `Some(1)` for an API object that vanished
    /// (force delete), `None` for a static pod whose file was removed (its own grace applies).
    pub fn remove(&self, uid: &PodUid, grace_override: Option<i64>) {
        let mut reg = self.registry();
        let Some(pod) = reg.desired.remove(uid) else {
            return;
        };
        let kill = KillRequest {
            grace_override,
            reason: KillReason::ObjectGone,
            done: None,
        };
        match reg.workers.get(uid) {
            Some(w) => w.mailbox.send_kill(kill),
            None => {
                let w = self.spawn_worker(pod);
                w.mailbox.send_kill(kill);
                reg.workers.insert(uid.clone(), w);
            }
        }
    }

    /// Stops a known pod (eviction, shutdown, preemption). The request's `done` completes when
    /// its containers and sandboxes are stopped.
    pub fn kill(&self, uid: &PodUid, req: KillRequest) -> Result<(), SeamError> {
        let mut reg = self.registry();
        if let Some(w) = reg.workers.get(uid) {
            w.mailbox.send_kill(req);
            return Ok(());
        }
        let pod = reg
            .desired
            .get(uid)
            .cloned()
            .ok_or_else(|| SeamError::UnknownPod(uid.to_string()))?;
        let w = self.spawn_worker(pod);
        w.mailbox.send_kill(req);
        reg.workers.insert(uid.clone(), w);
        Ok(())
    }

    /// Every pod this agent knows, desired or not.
    pub fn snapshot(&self) -> Vec<PodView> {
        let reg = self.registry();
        let mut out: Vec<PodView> = reg.workers.values().map(Worker::view).collect();
        out.extend(
            reg.desired
                .values()
                .filter(|p| !reg.workers.contains_key(&p.uid))
                .map(desired_view),
        );
        out.sort_by(|a, b| a.key.cmp(&b.key).then(a.uid.cmp(&b.uid)));
        out
    }

    /// The view of one pod.
    pub fn view(&self, uid: &PodUid) -> Option<PodView> {
        let reg = self.registry();
        match reg.workers.get(uid) {
            Some(w) => Some(w.view()),
            None => reg.desired.get(uid).map(desired_view),
        }
    }

    fn spawn_worker(&self, pod: PodInfo) -> Worker {
        let config = source_of(&pod);
        self.spawn_worker_from(pod, config)
    }

    fn spawn_worker_from(&self, pod: PodInfo, config: &'static str) -> Worker {
        let mailbox = Arc::new(Mailbox::default());
        let view = Arc::new(Mutex::new(PodView {
            uid: pod.uid.clone(),
            key: pod.key(),
            state: "sync",
            grace: None,
            deadline: None,
            step: "starting",
            reason: None,
            config,
        }));
        let span = tracing::info_span!("pod_worker", pod = %pod.key(), podUID = %pod.uid);
        let task = worker_loop(self.inner.clone(), mailbox.clone(), view.clone(), pod);
        self.inner.tracker.spawn(task.instrument(span));
        Worker { mailbox, view }
    }

    /// Housekeeping: relists the runtime (on container events when the runtime has them,
    /// else every `relist_period`), finds orphans and naturally completed pods, and forgets
    /// finished workers. Runs until cancelled.
    pub async fn run_housekeeping(self) {
        let cancel = self.inner.cancel.clone();
        let mut relist_failing = false;
        let mut events = match self.inner.runtime.container_events().await {
            Ok(rx) => {
                tracing::info!("runtime container events subscribed");
                Some(rx)
            }
            Err(e) => {
                tracing::info!(err = %e, "runtime has no container events; polling");
                None
            }
        };
        loop {
            let period = if events.is_some() {
                self.inner.config.relist_period_with_events
            } else {
                self.inner.config.relist_period
            };
            #[cfg(feature = "test-hooks")]
            let frozen = self.inner.frozen.notified();
            #[cfg(not(feature = "test-hooks"))]
            let frozen = std::future::pending::<()>();
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = frozen => {
                    tracing::warn!("test hook: housekeeping frozen");
                    cancel.cancelled().await;
                    return;
                }
                _ = tokio::time::sleep(period) => {}
                _ = self.inner.relist_now.notified() => {}
                ev = recv_opt(&mut events) => {
                    if ev.is_none() {
                        tracing::warn!("runtime container event stream ended; polling");
                        events = None;
                    }
                }
            }
            // one line when relisting starts failing and one when it works again, not per poll
            match self.relist().await {
                Err(e) if !relist_failing => {
                    tracing::warn!(err = %e, "runtime relist failed; retrying every period");
                    relist_failing = true;
                }
                Err(e) => tracing::debug!(err = %e, "runtime relist failed again"),
                Ok(()) if relist_failing => {
                    tracing::info!("runtime relist works again");
                    relist_failing = false;
                }
                Ok(()) => {}
            }
            let beat = self.inner.started.elapsed().as_millis() as u64;
            self.inner
                .heartbeat
                .store(beat, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// One housekeeping pass. Public so tests and callers can force one.
    pub async fn relist(&self) -> Result<(), crate::cri::CriError> {
        let rt = &self.inner.runtime;
        let sandboxes = rt.list_sandboxes(None).await?;
        let containers = rt.list_containers(None).await?;
        let grouped = pod::group_runtime(&sandboxes, &containers);
        for id in &grouped.invalid {
            tracing::warn!(id = %id, "runtime object with an invalid pod uid label skipped");
        }
        let mut completion_checks: Vec<(PodInfo, Vec<RuntimeContainer>)> = Vec::new();
        let mut gc_sandboxes: Vec<String> = Vec::new();
        {
            let mut reg = self.registry();
            for (uid, (sbs, cs)) in &grouped.pods {
                let alive = sbs.iter().any(|s| s.ready) || cs.iter().any(|c| c.state.may_run());
                if let Some(pod) = reg.desired.get(uid) {
                    let in_sync = reg
                        .workers
                        .get(uid)
                        .is_none_or(|w| w.view().state == "sync");
                    if in_sync
                        && pod.restart_policy != RestartPolicy::Always
                        && all_regular_exited(pod, cs)
                    {
                        completion_checks
                            .push((pod.clone(), cs.iter().map(|c| (*c).clone()).collect()));
                    }
                    continue;
                }
                // unknown to every source: an orphan only if it predates the sources' view
                let Some(synced_at) = reg.synced_at else {
                    continue;
                };
                let predates = sbs.iter().all(|s| s.created_at < synced_at)
                    && cs.iter().all(|c| c.created_at < synced_at);
                if !predates && !reg.workers.contains_key(uid) {
                    continue;
                }
                match reg.workers.get(uid).map(Worker::view) {
                    None if alive => {
                        let info = PodInfo::from_runtime(uid, sbs, cs);
                        tracing::info!(pod = %info.key(), podUID = %uid, "orphaned runtime pod found");
                        if let Some(m) = self.inner.metrics.get() {
                            m.orphaned_runtime_pods.inc();
                        }
                        let w = self.spawn_worker_from(info, "runtime");
                        w.mailbox.send_kill(KillRequest {
                            grace_override: Some(grace::ORPHAN_GRACE),
                            reason: KillReason::Orphan,
                            done: None,
                        });
                        reg.workers.insert(uid.clone(), w);
                    }
                    // nothing runs and the pod is gone: its sandboxes are garbage
                    None => gc_sandboxes.extend(sbs.iter().map(|s| s.id.clone())),
                    Some(v) if v.state == "finished" => {
                        gc_sandboxes.extend(sbs.iter().map(|s| s.id.clone()))
                    }
                    Some(_) => {}
                }
            }
            // forget finished workers whose pod is neither desired nor in the runtime
            let forget: Vec<PodUid> = reg
                .workers
                .iter()
                .filter(|(uid, w)| {
                    !reg.desired.contains_key(*uid)
                        && !grouped.pods.contains_key(*uid)
                        && w.view().state == "finished"
                })
                .map(|(u, _)| u.clone())
                .collect();
            for uid in forget {
                reg.workers.remove(&uid);
            }
        }
        for id in gc_sandboxes {
            match rt.remove_pod_sandbox(&id).await {
                Ok(()) => tracing::info!(sandboxID = %id, "removed sandbox of a finished orphan"),
                Err(e) if e.is_not_found() => {}
                Err(e) => {
                    tracing::warn!(sandboxID = %id, err = %e, "removing orphan sandbox failed")
                }
            }
        }
        for (pod, cs) in completion_checks {
            if pod.restart_policy == RestartPolicy::OnFailure {
                let mut all_zero = true;
                for c in latest_regular(&pod, &cs) {
                    match rt.container_status(&c.id).await {
                        Ok(d) if d.exit_code == 0 => {}
                        Ok(_) => all_zero = false,
                        Err(e) => {
                            tracing::debug!(err = %e, "container status failed");
                            all_zero = false;
                        }
                    }
                }
                if !all_zero {
                    continue;
                }
            }
            tracing::info!(pod = %pod.key(), podUID = %pod.uid, "all containers exited; pod completed");
            let _ = self.kill(
                &pod.uid,
                KillRequest {
                    grace_override: None,
                    reason: KillReason::Completed,
                    done: None,
                },
            );
        }
        Ok(())
    }
}

/// The newest runtime container per regular container name of the spec.
fn latest_regular<'a>(pod: &PodInfo, cs: &'a [RuntimeContainer]) -> Vec<&'a RuntimeContainer> {
    pod.containers
        .iter()
        .filter_map(|spec| {
            cs.iter()
                .filter(|c| c.name == spec.name)
                .max_by_key(|c| (c.attempt, c.created_at))
        })
        .collect()
}

/// Every regular container of the spec has a runtime container and its newest one exited.
fn all_regular_exited(pod: &PodInfo, cs: &[&RuntimeContainer]) -> bool {
    !pod.containers.is_empty()
        && pod.containers.iter().all(|spec| {
            cs.iter()
                .filter(|c| c.name == spec.name)
                .max_by_key(|c| (c.attempt, c.created_at))
                .is_some_and(|c| c.state == ContainerRunState::Exited)
        })
}

/// A desired pod with no worker: running, nothing to do.
fn desired_view(p: &PodInfo) -> PodView {
    PodView {
        uid: p.uid.clone(),
        key: p.key(),
        state: "sync",
        grace: None,
        deadline: None,
        step: "running",
        reason: None,
        config: source_of(p),
    }
}

fn source_of(pod: &PodInfo) -> &'static str {
    if pod.static_pod { "file" } else { "api" }
}

async fn recv_opt<T>(rx: &mut Option<tokio::sync::mpsc::Receiver<T>>) -> Option<T> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

async fn poll_opt<F: Future + Unpin>(f: &mut Option<F>) -> F::Output {
    match f {
        Some(f) => f.await,
        None => std::future::pending().await,
    }
}

type KillFuture = BoxFuture<'static, (u64, Result<kill::KillReport, kill::KillError>)>;
type CleanupFuture = BoxFuture<'static, (CleanupStage, Result<(), CleanupError>)>;

fn update_input(pod: &PodInfo) -> Input {
    Input::Update {
        deletion_requested: pod.deletion_requested,
        deletion_grace: pod.deletion_grace,
        terminal_phase: pod.terminal_phase,
        spec_grace: pod.spec_grace,
    }
}

/// The owner task of one pod UID.
async fn worker_loop<R: Runtime>(
    inner: Arc<Inner<R>>,
    mailbox: Arc<Mailbox>,
    view: Arc<Mutex<PodView>>,
    mut pod: PodInfo,
) {
    let mut m = PodMachine::new(pod.spec_grace);
    let memory = Arc::new(KillMemory::default());
    let mut kill_fut: Option<KillFuture> = None;
    let mut cleanup_fut: Option<CleanupFuture> = None;
    let mut retry: Option<Pin<Box<tokio::time::Sleep>>> = None;
    // ExceededGracePeriod: armed when the kill first starts (or earlier for a shorter grace),
    // kept across failed attempts and their retries, reported once
    let mut overdue: Option<Pin<Box<tokio::time::Sleep>>> = None;
    let mut overdue_at: Option<Instant> = None;
    let mut overdue_reported = false;
    // when (wall-clock seconds) and with what grace the current kill began: a retry after a
    // failed attempt (the runtime restarted, a call timed out) counts down to that kill's
    // deadline instead of granting the whole grace again
    let mut kill_anchor: Option<(i64, i64)> = None;
    let mut notices: Vec<oneshot::Sender<()>> = Vec::new();
    let mut step_name: &'static str = "waiting";
    let mut finals: Vec<ContainerFinal> = Vec::new();
    let metrics = inner.metrics.get().cloned();
    let mut phase_started = Instant::now();
    loop {
        let mut inputs: Vec<Input> = Vec::new();
        tokio::select! {
            biased;
            _ = inner.cancel.cancelled() => {
                tracing::debug!("pod worker stopping with the agent; the pod is left as it is");
                return;
            }
            _ = mailbox.notify.notified() => {
                let mut p = mailbox.lock();
                if let Some(mut newer) = p.update.take() {
                    inputs.push(update_input(&newer));
                    // a resumed termination's deadline outlives later updates of the object
                    newer.kill_deadline = match (newer.kill_deadline, pod.kill_deadline) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                    pod = newer;
                }
                for k in p.kills.drain(..) {
                    if let Some(done) = k.done {
                        notices.push(done);
                    }
                    inputs.push(Input::Kill { grace_override: k.grace_override, reason: k.reason });
                }
            }
            (generation, r) = poll_opt(&mut kill_fut) => {
                kill_fut = None;
                if r.is_ok() {
                    overdue = None;
                    overdue_at = None;
                    kill_anchor = None;
                }
                match &r {
                    Ok(rep) => {
                        tracing::info!(
                            containers = rep.containers_stopped,
                            sandboxes = rep.sandboxes_stopped,
                            "pod containers and sandboxes stopped"
                        );
                        finals = rep.finals.clone();
                    }
                    // a standby refusal is not a failure worth an event
                    Err(e @ kill::KillError::Refused(_)) => {
                        tracing::debug!(err = %e, "kill held by the authority check");
                    }
                    Err(e) => {
                        tracing::warn!(err = %e, "killing pod failed; will retry");
                        inner.events.record(PodEvent {
                            uid: pod.uid.clone(),
                            namespace: pod.namespace.clone(),
                            name: pod.name.clone(),
                            reason: EventReason::FailedKillPod,
                            message: format!("error killing pod: {e}"),
                        });
                    }
                }
                inputs.push(Input::KillDone { generation, ok: r.is_ok() });
            }
            (stage, r) = poll_opt(&mut cleanup_fut) => {
                cleanup_fut = None;
                if let Err(e) = &r {
                    tracing::warn!(stage = ?stage, err = %e, "pod cleanup failed; will retry");
                }
                inputs.push(Input::CleanupDone { stage, ok: r.is_ok() });
            }
            _ = poll_opt(&mut retry) => {
                retry = None;
                inputs.push(Input::RetryDue);
            }
            _ = poll_opt(&mut overdue) => {
                overdue = None;
                overdue_at = None;
                overdue_reported = true;
                tracing::warn!(gracePeriod = m.grace, "runtime did not stop the pod within its grace period");
                if let Some(mx) = &metrics {
                    mx.exceeded_grace_period.inc();
                }
                inner.events.record(PodEvent {
                    uid: pod.uid.clone(),
                    namespace: pod.namespace.clone(),
                    name: pod.name.clone(),
                    reason: EventReason::ExceededGracePeriod,
                    message: "Container runtime did not kill the pod within specified grace period.".into(),
                });
            }
        }
        let mut finished = false;
        for input in inputs {
            let before = m.lifecycle.name();
            let effects = lifecycle::step(&mut m, input, Instant::now());
            if m.lifecycle.name() != before {
                let now = Instant::now();
                if let Some(mx) = &metrics {
                    match (before, m.lifecycle.name()) {
                        ("sync", "terminating") if m.reason == Some(KillReason::Deleted) => {
                            mx.termination_started(&pod.uid)
                        }
                        ("terminating", "terminated") => {
                            let took = now - phase_started;
                            mx.stage("kill", took);
                            mx.pod_worker_duration
                                .get_or_create(&crate::metrics::OpLabel {
                                    operation_type: "terminating",
                                })
                                .observe(took.as_secs_f64());
                        }
                        ("terminated", "finished") => {
                            mx.pod_worker_duration
                                .get_or_create(&crate::metrics::OpLabel {
                                    operation_type: "terminated",
                                })
                                .observe((now - phase_started).as_secs_f64());
                        }
                        _ => {}
                    }
                }
                phase_started = now;
                tracing::info!(
                    from = before,
                    to = m.lifecycle.name(),
                    gracePeriod = m.grace,
                    reason = m.reason.as_ref().map(KillReason::as_str),
                    "pod lifecycle transition"
                );
            }
            for effect in effects {
                match effect {
                    Effect::StartKill { generation, grace } => {
                        if kill_fut.is_some() {
                            tracing::info!(
                                gracePeriod = grace,
                                "shorter grace period: restarting the kill"
                            );
                        }
                        let retry_deadline = match (kill_fut.is_some(), kill_anchor) {
                            (false, Some((started, g))) => Some(
                                started
                                    .saturating_add(grace::container_stop_timeout(g.min(grace)))
                                    .saturating_add(1),
                            ),
                            _ => {
                                kill_anchor = Some((wall_ns() / 1_000_000_000, grace));
                                None
                            }
                        };
                        retry = None;
                        let reason = m.reason.as_ref().map_or("unknown", KillReason::as_str);
                        let at = Instant::now()
                            + grace::as_duration(grace::container_stop_timeout(grace))
                            + inner.config.exceeded_grace_slack;
                        if !overdue_reported && overdue_at.is_none_or(|o| at < o) {
                            overdue = Some(Box::pin(tokio::time::sleep_until(at)));
                            overdue_at = Some(at);
                        }
                        kill_fut = Some(match inner.authority.check(&pod.uid, reason) {
                            Ok(()) => {
                                let inner = inner.clone();
                                let mut pod = pod.clone();
                                if let Some(d) = retry_deadline {
                                    pod.kill_deadline =
                                        Some(pod.kill_deadline.map_or(d, |k| k.min(d)));
                                }
                                let memory = memory.clone();
                                Box::pin(async move {
                                    let r = kill::kill_pod(
                                        &*inner.runtime,
                                        &inner.events,
                                        &pod,
                                        grace,
                                        &memory,
                                    )
                                    .await;
                                    (generation, r)
                                })
                            }
                            Err(e) => {
                                tracing::warn!(err = %e, "kill refused by the authority check");
                                overdue = None;
                                overdue_at = None;
                                Box::pin(
                                    async move { (generation, Err(kill::KillError::Refused(e))) },
                                )
                            }
                        });
                        step_name = "stopping containers";
                    }
                    Effect::StartCleanup(stage) => {
                        let inner = inner.clone();
                        let uid = pod.uid.clone();
                        step_name = match stage {
                            CleanupStage::Volumes => "waiting for volumes",
                            CleanupStage::Cgroup => "removing pod cgroup",
                        };
                        cleanup_fut = Some(Box::pin(async move {
                            let t = Instant::now();
                            let r = match stage {
                                CleanupStage::Volumes => volumes::wait_unmounted(
                                    &inner.config.root_dir,
                                    &uid,
                                    &inner.config.mountinfo,
                                    inner.config.volume_poll,
                                    inner.config.volume_wait,
                                )
                                .await
                                .map_err(CleanupError::from),
                                CleanupStage::Cgroup => inner
                                    .cgroups
                                    .destroy(&uid)
                                    .await
                                    .map(|rep| {
                                        tracing::info!(
                                            removedDirs = rep.removed_dirs,
                                            killedPids = rep.killed_pids,
                                            "pod cgroup removed"
                                        )
                                    })
                                    .map_err(CleanupError::from),
                            };
                            if r.is_ok()
                                && let Some(mx) = inner.metrics.get()
                            {
                                let took = t.elapsed();
                                match stage {
                                    CleanupStage::Volumes => mx.stage("volumes", took),
                                    CleanupStage::Cgroup => {
                                        mx.stage("cgroup", took);
                                        mx.cgroup_manager_duration
                                            .get_or_create(&crate::metrics::OpLabel {
                                                operation_type: "destroy",
                                            })
                                            .observe(took.as_secs_f64());
                                    }
                                }
                            }
                            (stage, r)
                        }));
                    }
                    Effect::RetryAfter(d) => {
                        let jitter = rand::rng().random_range(0..=d.as_millis() as u64 / 5);
                        retry = Some(Box::pin(tokio::time::sleep(
                            d + Duration::from_millis(jitter),
                        )));
                        step_name = "backing off";
                    }
                    Effect::KillComplete => {
                        if let Some(sink) = inner.status.get() {
                            sink.pod_terminated(&pod, m.reason.as_ref(), &finals);
                        }
                        for n in notices.drain(..) {
                            let _ = n.send(());
                        }
                    }
                    Effect::Finished => {
                        if let Some(sink) = inner.status.get() {
                            sink.pod_finished(&pod);
                        }
                        step_name = "done";
                        finished = true;
                    }
                }
            }
        }
        // a kill that arrives after termination completes is complete at once
        if !matches!(
            m.lifecycle,
            lifecycle::Lifecycle::Sync | lifecycle::Lifecycle::Terminating { .. }
        ) {
            for n in notices.drain(..) {
                let _ = n.send(());
            }
        }
        {
            let mut v = view.lock().unwrap_or_else(|e| e.into_inner());
            v.state = m.lifecycle.name();
            v.grace = m.grace;
            v.deadline = m.kill_deadline();
            v.step = step_name;
            v.reason = m.reason.as_ref().map(KillReason::as_str);
            v.key = pod.key();
        }
        if finished {
            mailbox.close();
            tracing::info!("pod worker finished");
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cri::RuntimeContainer;

    fn rc(name: &str, attempt: u32, state: ContainerRunState) -> RuntimeContainer {
        RuntimeContainer {
            id: format!("{name}-{attempt}"),
            sandbox_id: "s".into(),
            name: name.into(),
            attempt,
            pod_uid: "u".into(),
            state,
            created_at: i64::from(attempt),
            labels: HashMap::new(),
            annotations: HashMap::new(),
        }
    }

    fn pod(names: &[&str]) -> PodInfo {
        let uid = PodUid::parse("u").unwrap();
        let mut p = PodInfo::from_runtime(&uid, &[], &[]);
        p.containers = names
            .iter()
            .map(|n| pod::ContainerSpec {
                name: (*n).into(),
                pre_stop: None,
                ports: vec![],
            })
            .collect();
        p
    }

    #[test]
    fn completion_needs_every_regular_container_exited() {
        let p = pod(&["a", "b"]);
        let a = rc("a", 0, ContainerRunState::Exited);
        let b0 = rc("b", 0, ContainerRunState::Exited);
        let b1 = rc("b", 1, ContainerRunState::Running);
        assert!(!all_regular_exited(&p, &[&a]), "b never started");
        assert!(all_regular_exited(&p, &[&a, &b0]));
        assert!(!all_regular_exited(&p, &[&a, &b0, &b1]), "b restarted");
        assert!(!all_regular_exited(&pod(&[]), &[]));
    }

    mod with_fake_runtime {
        use super::*;
        use crate::cgroups::{CgroupDriver, CgroupNaming, CgroupVersion, Hierarchy};
        use crate::cri::fake::{Behaviour, FakeRuntime};
        use crate::events::PodEvent;
        use tokio::sync::mpsc;

        struct Rig {
            workers: PodWorkers<FakeRuntime>,
            rt: Arc<FakeRuntime>,
            authority: Arc<Authority>,
            events: mpsc::Receiver<PodEvent>,
            _dir: tempfile::TempDir,
        }

        fn rig() -> Rig {
            let dir = tempfile::tempdir().unwrap();
            let mountinfo = dir.path().join("mountinfo");
            std::fs::write(&mountinfo, "").unwrap();
            let cg = dir.path().join("cgroup");
            std::fs::create_dir_all(&cg).unwrap();
            let cgroups = CgroupManager::new(
                vec![Hierarchy {
                    mount_point: cg,
                    version: CgroupVersion::V2,
                }],
                CgroupNaming::new(CgroupDriver::Cgroupfs, "/").unwrap(),
            );
            let rt = Arc::new(FakeRuntime::default());
            let (sink, events) = EventSink::channel(64);
            let authority = Arc::new(Authority::default());
            let workers = PodWorkers::new(
                rt.clone(),
                cgroups,
                PipelineConfig {
                    root_dir: dir.path().join("kubelet"),
                    mountinfo,
                    ..PipelineConfig::default()
                },
                sink,
                authority.clone(),
                CancellationToken::new(),
                TaskTracker::new(),
            );
            Rig {
                workers,
                rt,
                authority,
                events,
                _dir: dir,
            }
        }

        fn api_pod(uid: &str, spec_grace: i64) -> PodInfo {
            let mut p = pod(&["app"]);
            p.uid = PodUid::parse(uid).unwrap();
            p.spec_grace = Some(spec_grace);
            p
        }

        fn deleted(p: &PodInfo, grace: i64) -> PodInfo {
            let mut d = p.clone();
            d.deletion_requested = true;
            d.deletion_grace = Some(grace);
            d
        }

        async fn until(w: &PodWorkers<FakeRuntime>, uid: &str, state: &str) -> Instant {
            let uid = PodUid::parse(uid).unwrap();
            loop {
                if w.view(&uid).is_some_and(|v| v.state == state) {
                    return Instant::now();
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }

        #[tokio::test(start_paused = true)]
        async fn shorter_grace_cuts_the_running_kill_short() {
            let r = rig();
            r.rt.add_pod("p1", &[("app", Behaviour::IgnoreTerm)]);
            let p = api_pod("p1", 30);
            r.workers.set_desired(vec![p.clone()], Some(1));
            let t0 = Instant::now();
            r.workers.upsert(deleted(&p, 30));
            tokio::time::sleep(Duration::from_secs(5)).await;
            r.workers.upsert(deleted(&p, 3));
            let done = until(&r.workers, "p1", "finished").await;
            let stops = r.rt.stops_of("p1-app");
            assert_eq!(stops.len(), 2);
            assert_eq!(stops[0], (30, t0));
            assert_eq!(stops[1], (3, t0 + Duration::from_secs(5)));
            assert!(done - t0 < Duration::from_millis(8100), "{:?}", done - t0);
            assert_eq!(r.rt.exit_code("p1-app"), Some(137));
        }

        #[tokio::test(start_paused = true)]
        async fn a_resumed_deadline_survives_later_updates_of_the_object() {
            let r = rig();
            r.rt.add_pod("p9", &[("app", Behaviour::IgnoreTerm)]);
            let p = api_pod("p9", 30);
            r.workers.set_desired(vec![p.clone()], Some(1));
            // resumed after a restart, its deadline long past; then the object is updated
            // again (a status patch, say) without the deadline
            let mut resumed = deleted(&p, 30);
            resumed.kill_deadline = Some(crate::wall_ns() / 1_000_000_000 - 60);
            r.workers.upsert(resumed);
            r.workers.upsert(deleted(&p, 30));
            until(&r.workers, "p9", "finished").await;
            let stops = r.rt.stops_of("p9-app");
            assert!(
                stops.iter().all(|(t, _)| *t == 0),
                "past the deadline every stop is an immediate SIGKILL: {stops:?}"
            );
        }

        #[tokio::test(start_paused = true)]
        async fn updates_coalesce_and_kill_notices_are_never_lost() {
            let r = rig();
            r.rt.add_pod(
                "p2",
                &[("app", Behaviour::ExitOnTerm(Duration::from_secs(1)))],
            );
            let p = api_pod("p2", 30);
            r.workers.set_desired(vec![p.clone()], Some(1));
            let uid = p.uid.clone();
            let mut notices = Vec::new();
            for g in [20, 10, 15, 5] {
                r.workers.upsert(deleted(&p, g));
                let (tx, rx) = oneshot::channel();
                r.workers
                    .kill(
                        &uid,
                        KillRequest {
                            grace_override: Some(g + 1),
                            reason: KillReason::Orphan,
                            done: Some(tx),
                        },
                    )
                    .unwrap();
                notices.push(rx);
            }
            for n in notices {
                n.await.expect("every kill notice completes");
            }
            until(&r.workers, "p2", "finished").await;
            // the newest, smallest value won
            assert_eq!(r.workers.view(&uid).unwrap().grace, Some(5));
            // a kill after the end completes at once
            let (tx, rx) = oneshot::channel();
            r.workers
                .kill(
                    &uid,
                    KillRequest {
                        grace_override: None,
                        reason: KillReason::Orphan,
                        done: Some(tx),
                    },
                )
                .unwrap();
            tokio::time::timeout(Duration::from_secs(1), rx)
                .await
                .expect("a kill after the end completes at once")
                .expect("and is not dropped");
        }

        #[tokio::test(start_paused = true)]
        async fn hung_stop_raises_exceeded_grace_period() {
            let mut r = rig();
            r.rt.add_pod("p3", &[("app", Behaviour::Hang)]);
            let p = api_pod("p3", 3);
            r.workers.set_desired(vec![p.clone()], Some(1));
            let t0 = Instant::now();
            r.workers.upsert(deleted(&p, 3));
            let ev = loop {
                match r.events.recv().await {
                    Some(e) if e.reason == EventReason::ExceededGracePeriod => break e,
                    Some(_) => continue,
                    None => panic!("event channel closed"),
                }
            };
            assert_eq!(ev.uid.as_str(), "p3");
            // grace 3 + slack 10
            assert_eq!(Instant::now() - t0, Duration::from_secs(13));
            assert_eq!(r.workers.view(&p.uid).unwrap().state, "terminating");
        }

        #[tokio::test(start_paused = true)]
        async fn standby_authority_holds_every_kill() {
            let r = rig();
            r.authority.set_active(false);
            r.rt.add_pod("p4", &[("app", Behaviour::ExitOnTerm(Duration::ZERO))]);
            let p = api_pod("p4", 30);
            r.workers.set_desired(vec![p.clone()], Some(1));
            r.workers.upsert(deleted(&p, 30));
            tokio::time::sleep(Duration::from_secs(20)).await;
            assert!(
                r.rt.calls().is_empty(),
                "a kill went through in standby: {:?}",
                r.rt.calls()
            );
            assert_eq!(r.workers.view(&p.uid).unwrap().state, "terminating");
            r.authority.set_active(true);
            until(&r.workers, "p4", "finished").await;
            assert_eq!(r.rt.exit_code("p4-app"), Some(0));
        }

        #[tokio::test(start_paused = true)]
        async fn cancellation_abandons_work_and_never_kills() {
            let r = rig();
            r.rt.add_pod("p5", &[("app", Behaviour::IgnoreTerm)]);
            let p = api_pod("p5", 30);
            r.workers.set_desired(vec![p.clone()], Some(1));
            r.workers.inner.cancel.cancel();
            r.workers.upsert(deleted(&p, 30));
            tokio::time::sleep(Duration::from_secs(60)).await;
            assert!(r.rt.calls().is_empty());
            r.workers.inner.tracker.close();
            r.workers.inner.tracker.wait().await;
        }
    }
}
