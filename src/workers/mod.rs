//! Pod workers: the kubelet's `podWorkers` (`pod_workers.go`) and the housekeeping half of
//! `HandlePodCleanups` (`kubelet_pods.go`).
//!
//! The pieces, as in the kubelet:
//! * [`registry`]: UID → worker handle and each worker's coalescing mailbox, fed by the one
//!   seam every source uses: [`PodWorkers::upsert`] (an object changed),
//!   [`PodWorkers::remove`] (an object went) and [`PodWorkers::kill`] (a [`KillRequest`]:
//!   every reason to end a pod, with its grace override and the `DisruptionTarget` reason it
//!   implies). `UpdatePod`'s role.
//! * [`worker`]: one owner task per pod UID (`podWorkerLoop`): it feeds its inputs to the pure
//!   [`crate::lifecycle::step`] and carries out the effects (kill, cleanup, retries, reports).
//! * [`housekeeping`]: the main loop: the runtime relist (PLEG's relist) under its own
//!   deadline, orphans, natural completion and garbage collection of finished orphans'
//!   sandboxes.
//! * [`runtime_health`]: the main loop's heartbeat (liveness), the relist deadline and the
//!   runtime's health (readiness) judged from the relists.
//! * [`subscription`]: container events (the evented PLEG's watch) that trigger relists.
//! * [`sweeps`]: the node's leftovers (`cleanupOrphanedPodCgroups`, `cleanupOrphanedPodDirs`):
//!   orphaned pod cgroups and pod directories.
//!
//! Invariants:
//! * one owner task per pod UID, fed by a coalescing mailbox: the newest update wins, kill
//!   requests and their completion notices are never lost;
//! * the registry lock is a plain mutex never held across an await;
//! * the lifecycle decisions are [`crate::lifecycle::step`]; this module only runs effects;
//! * a kill is a cancellable future: a shorter grace drops the in-flight kill (and its CRI
//!   calls) and starts a new one at once; cancellation of reaplet itself abandons work and
//!   never kills a pod;
//! * orphans are acted on only once every pod source has delivered a complete list, and, with
//!   an API, only once a read of the object by name confirms it gone ([`confirm`]); an object
//!   bound to another node means reaplet's node name is wrong: no orphan is ended then;
//! * the kubelet's static pods (sandbox annotation `kubernetes.io/config.source` `file` or
//!   `http`) are never orphans unless reaplet's manifest directory is the kubelet's own
//!   ([`StaticPods`]); mirror pods in the API are the kubelet's and are not fed to the workers;
//! * a transition never waits for a poll: a kill completes when the runtime's stop calls
//!   return, and the runtime is re-read right away.

mod confirm;
mod housekeeping;
mod own_pod;
mod registry;
mod runtime_health;
mod subscription;
mod sweeps;
mod worker;

#[cfg(test)]
mod confirm_tests;
#[cfg(test)]
mod judge_tests;
#[cfg(test)]
mod own_pod_tests;
#[cfg(test)]
mod resume_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod timeline_tests;

use crate::authority::Authority;
use crate::cgroups::CgroupManager;
use crate::cri::Runtime;
use crate::deadline::Deadline;
use crate::events::EventSink;
use crate::lifecycle::{KillReason, PodPhase};
use crate::metrics::Metrics;
use crate::pod::{PodInfo, PodUid};
use crate::status::ContainerFinal;
use crate::volumes;
use crate::wall_ns;
pub use confirm::{ApiLookup, LookupError, ObjectLookup, Stored};
pub use housekeeping::{FULL_DEBOUNCE, TARGETED_MAX};
use registry::Registry;
pub use runtime_health::{BEAT, RuntimeStall, relist_deadline};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

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
    /// While active, unmount and remove the node-local volumes of terminated pods
    /// ([`volumes::teardown`]); off when this process cannot reach the host's mounts
    /// ([`volumes::teardown::can_tear_down`]): they are then only waited for.
    pub volume_teardown: bool,
    /// Runtime relist period when the runtime has no container events (containerd 1.6).
    pub relist_period: Duration,
    /// Relist period when container events drive relists.
    pub relist_period_with_events: Duration,
    /// Subscribe to container events (CRI, else containerd's events service).
    pub container_events: bool,
    /// A kill still running this long after its deadline gets an `ExceededGracePeriod` event.
    pub exceeded_grace_slack: Duration,
    /// Whose the node's static runtime pods (`kubernetes.io/config.source: file|http`) are.
    pub static_pods: StaticPods,
    /// A leftover pod cgroup or directory is swept only once untouched this long (a pod the
    /// kubelet is still starting has both before its sandbox).
    pub orphan_min_age: Duration,
    /// With no relist answered for this long the runtime counts as stalled: `/readyz` fails
    /// with the reason and a `ContainerRuntimeUnhealthy` event is recorded once (kubelet:
    /// `maxWaitForContainerRuntime`, 30 s, after which the node's runtime is reported down).
    pub runtime_unhealthy_after: Duration,
    /// reaplet's own pod, when it runs in one ([`crate::self_pod`]): never an orphan, never
    /// stopped for another reason than its API deletion, which is the kubelet's while one holds
    /// the node, and otherwise ends it last and status first ([`own_pod`]).
    pub own_pod: Option<PodUid>,
    /// Finished terminations whose timelines are kept (`terminationTimelines`); every pod
    /// still terminating has one as well ([`crate::timeline`]).
    pub termination_timelines: usize,
}

/// Whose the static pods the runtime runs are: which of them a relist may take for orphans.
/// A static pod one of reaplet's manifests has is desired in every case, and one whose
/// manifest reaplet saw removed is ended by that removal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StaticPods {
    /// reaplet reads no manifest directory: every static pod is the kubelet's, never touched.
    Kubelets,
    /// reaplet reads a manifest directory of its own, not the kubelet's `staticPodPath` (or
    /// that is unknown): a static pod none of its manifests has may be the kubelet's (an etcd
    /// or kube-apiserver of a control-plane node) and is never an orphan.
    OwnManifests,
    /// reaplet's manifest directory is the kubelet's `staticPodPath`: it sees every static
    /// manifest of the node, and a `file` static pod with none is an orphan, as the kubelet
    /// judges it (`http` ones are still the kubelet's).
    AllOfNode,
}

impl Default for PipelineConfig {
    fn default() -> Self {
        Self {
            root_dir: "/var/lib/kubelet".into(),
            mountinfo: "/proc/self/mountinfo".into(),
            volume_poll: Duration::from_millis(200),
            volume_wait: Duration::from_secs(123),
            volume_teardown: true,
            relist_period: Duration::from_secs(1),
            relist_period_with_events: Duration::from_secs(10),
            container_events: true,
            exceeded_grace_slack: Duration::from_secs(10),
            static_pods: StaticPods::Kubelets,
            own_pod: None,
            orphan_min_age: Duration::from_secs(120),
            runtime_unhealthy_after: Duration::from_secs(30),
            termination_timelines: crate::timeline::DEFAULT_KEEP,
        }
    }
}

/// The one way a pod is ended: why, with what grace, and who waits for it. A new reason to end
/// a pod is a [`KillReason`] variant and a producer that sends this.
#[derive(Debug)]
pub struct KillRequest {
    /// Only ever shortens the grace (kubelet's only-shorter overrides).
    pub grace_override: Option<i64>,
    pub reason: KillReason,
    /// Completed once the pod's containers and sandboxes are stopped.
    pub done: Option<oneshot::Sender<()>>,
}

impl KillRequest {
    pub fn new(reason: KillReason) -> Self {
        Self {
            grace_override: None,
            reason,
            done: None,
        }
    }

    /// With a grace override (it only ever shortens the grace).
    pub fn grace(mut self, seconds: Option<i64>) -> Self {
        self.grace_override = seconds;
        self
    }

    /// Completes `done` once the pod's containers and sandboxes are stopped.
    pub fn notify(mut self, done: oneshot::Sender<()>) -> Self {
        self.done = Some(done);
        self
    }

    /// The `DisruptionTarget` reason this kill implies for the terminal status.
    pub fn disruption_target(&self) -> Option<&str> {
        self.reason.disruption_target()
    }
}

/// Where the workers report how a pod ended (the status manager).
pub trait StatusSink: Send + Sync + 'static {
    /// Every container and sandbox of the pod is stopped; `finals` is what the runtime says of
    /// its containers. Called once per pod, before cleanup.
    fn pod_terminated(&self, pod: &PodInfo, reason: Option<&KillReason>, finals: &[ContainerFinal]);
    /// Cleanup (volumes, cgroup) finished: nothing of the pod is left on the node.
    fn pod_finished(&self, pod: &PodInfo);
    /// Whatever is still to be sent for the pod is no longer reaplet's to send (its own pod,
    /// which a kubelet holds again: [`own_pod`]). A request already in flight completes.
    fn withdraw(&self, uid: &PodUid) {
        let _ = uid;
    }
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

/// Where a pod came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PodSource {
    /// The API server.
    Api,
    /// A static manifest (`--pod-manifest-path`).
    File,
    /// Only the runtime has it (an orphan).
    Runtime,
}

impl PodSource {
    /// Every source (the bounded label values of the working-pods gauges).
    pub const ALL: [PodSource; 3] = [Self::Api, Self::File, Self::Runtime];

    pub fn of(pod: &PodInfo) -> Self {
        if pod.static_pod {
            Self::File
        } else {
            Self::Api
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Api => "api",
            Self::File => "file",
            Self::Runtime => "runtime",
        }
    }
}

/// What a worker is doing right now (for `reaplet pods`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// A desired pod with no worker: running, nothing to do.
    Running,
    Starting,
    StoppingContainers,
    WaitingForVolumes,
    /// The volumes outlived the unmount timeout and were reported: not deleted, rechecked.
    VolumesSkipped,
    RemovingCgroup,
    BackingOff,
    Done,
}

impl Step {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Starting => "starting",
            Self::StoppingContainers => "stopping containers",
            Self::WaitingForVolumes => "waiting for volumes",
            Self::VolumesSkipped => "skipped: volumes still mounted",
            Self::RemovingCgroup => "removing pod cgroup",
            Self::BackingOff => "backing off",
            Self::Done => "done",
        }
    }
}

/// A read-only view of one pod, for `reaplet pods` and tests.
#[derive(Debug, Clone, PartialEq)]
pub struct PodView {
    pub uid: PodUid,
    pub key: String,
    pub phase: PodPhase,
    pub grace: Option<i64>,
    /// When the current kill SIGKILLs at the latest.
    pub deadline: Option<Deadline>,
    pub step: Step,
    /// The reason that decides the status (the first).
    pub reason: Option<KillReason>,
    /// Every reason to end the pod that arrived, in order.
    pub reasons: Vec<KillReason>,
    pub source: PodSource,
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
    /// Wakes the own pod's ending task ([`own_pod`]).
    own_wake: Notify,
    status: OnceLock<Arc<dyn StatusSink>>,
    metrics: OnceLock<Arc<Metrics>>,
    /// Reads orphan candidates' objects before they are ended ([`confirm`]); unset without an
    /// API (the runtime and the sources alone decide).
    confirm: OnceLock<confirm::Confirmer>,
    /// Every termination's steps ([`crate::timeline`]).
    timelines: Arc<crate::timeline::Timelines>,
    /// The housekeeping loop's last beat (ms since `started`), for `/healthz` and the
    /// watchdog: it beats every [`runtime_health::BEAT`] while it waits and while a relist runs,
    /// never waiting on the runtime for it.
    heartbeat: std::sync::atomic::AtomicU64,
    started: Instant,
    /// When the runtime last answered a relist, and what went wrong since (short lock).
    runtime_health: Mutex<runtime_health::RuntimeHealth>,
    /// Test hook (feature `test-hooks`, never in release packages): a frozen housekeeping
    /// loop stops beating at once and forever, as a wedged main loop would.
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
        let timelines = crate::timeline::Timelines::new(config.termination_timelines);
        Self {
            inner: Arc::new(Inner {
                timelines,
                runtime,
                cgroups,
                config,
                events,
                authority,
                cancel,
                tracker,
                registry: Mutex::default(),
                relist_now: Notify::new(),
                own_wake: Notify::new(),
                status: OnceLock::new(),
                metrics: OnceLock::new(),
                confirm: OnceLock::new(),
                heartbeat: std::sync::atomic::AtomicU64::new(0),
                started: Instant::now(),
                runtime_health: Mutex::new(runtime_health::RuntimeHealth::new(Instant::now())),
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
        // the working-pods gauges, every combination at 0, from the start
        self.update_gauges();
    }

    /// Connects the status manager. Call before feeding pods; a second call is ignored.
    pub fn set_status_sink(&self, sink: Arc<dyn StatusSink>) {
        let _ = self.inner.status.set(sink);
    }

    /// Orphan candidates are read by name through `lookup` before they are ended, and must be
    /// gone: an object bound to another node than `node` means the node name is wrong
    /// ([`confirm`]). Call before housekeeping runs; a second call is ignored.
    pub fn set_orphan_lookup(&self, lookup: Box<dyn ObjectLookup>, node: &str) {
        let _ = self
            .inner
            .confirm
            .set(confirm::Confirmer::new(lookup, node));
    }

    /// Whether reaplet's node name is known to be wrong ([`Self::identity_problem`]).
    pub fn has_identity_problem(&self) -> bool {
        self.inner.confirm.get().is_some_and(|c| c.has_mismatch())
    }

    /// Why reaplet's node name is known to be wrong, while it is (`/readyz` fails with it).
    pub fn identity_problem(&self) -> Option<String> {
        let c = self.inner.confirm.get()?;
        let m = c.mismatch()?;
        Some(format!(
            "reaplet's node name {:?} is wrong: runtime pod {} ({}) has its object bound to node \
             {:?}; no orphan is ended until the name is fixed (the node's own kubeconfig, or \
             --hostname-override)",
            c.node(),
            m.pod,
            m.uid,
            m.bound_to
        ))
    }

    /// The terminations' timelines (for the status endpoint and the status manager).
    pub fn timelines(&self) -> Arc<crate::timeline::Timelines> {
        self.inner.timelines.clone()
    }

    /// Every source has delivered a complete list (orphans are being judged).
    pub fn is_synced(&self) -> bool {
        self.registry().synced_at.is_some()
    }

    /// How long ago the housekeeping loop last beat (the main loop's liveness). It beats
    /// while a relist waits on the runtime: a stalled runtime is a readiness matter
    /// ([`PodWorkers::runtime_stall`]), not a liveness one.
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

    /// Counts pods by (phase, source) into the working-pods gauges.
    pub fn update_gauges(&self) {
        let Some(m) = self.inner.metrics.get() else {
            return;
        };
        // every (state, source) combination, the empty ones at 0: none is ever absent
        let mut counts: HashMap<(&'static str, &'static str), i64> = PodPhase::ALL
            .iter()
            .flat_map(|p| PodSource::ALL.map(|s| ((p.as_str(), s.as_str()), 0)))
            .collect();
        for v in self.snapshot() {
            *counts
                .entry((v.phase.as_str(), v.source.as_str()))
                .or_default() += 1;
        }
        m.set_working_pods(counts);
    }

    /// With several pod sources, orphans are judged only once each of `names` has delivered
    /// a complete list ([`PodWorkers::mark_source_synced`]).
    pub fn expect_sources(&self, names: &[&'static str]) {
        self.registry().sources.extend(names.iter().copied());
    }

    /// Source `name` has just delivered a complete list (call it for every one: the initial
    /// list, re-lists, each directory scan) whose snapshot is no older than `listed_from`
    /// (wall-clock ns taken before the list was asked for: a runtime pod created after it may
    /// be one the list missed and the watch has not delivered yet, never an orphan). With no
    /// sources expected, the first call syncs.
    pub fn mark_source_synced(&self, name: &'static str, listed_from: i64) {
        let mut reg = self.registry();
        reg.last_list.insert(name, listed_from);
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
        }
        self.inner.relist_now.notify_one();
    }

    /// The static pods the runtime runs (sandbox annotation `kubernetes.io/config.source:
    /// file`), by (namespace, name) — the name is the kubelet's `<name>-<node>` — to their
    /// UIDs (the newest sandbox's). What a manifest is matched to.
    pub async fn static_runtime_pods(
        &self,
    ) -> Result<HashMap<(String, String), PodUid>, crate::cri::CriError> {
        let mut out: HashMap<(String, String), (i64, PodUid)> = HashMap::new();
        for s in self.inner.runtime.list_sandboxes(None).await? {
            let from_file = s
                .annotations
                .get("kubernetes.io/config.source")
                .is_some_and(|v| v == "file");
            let Ok(uid) = PodUid::parse(&s.pod_uid) else {
                continue;
            };
            if !from_file {
                continue;
            }
            let key = (s.pod_namespace.clone(), s.pod_name.clone());
            if out.get(&key).is_none_or(|(at, _)| *at < s.created_at) {
                out.insert(key, (s.created_at, uid));
            }
        }
        Ok(out.into_iter().map(|(k, (_, u))| (k, u)).collect())
    }

    fn registry(&self) -> MutexGuard<'_, Registry> {
        self.inner
            .registry
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }
}
