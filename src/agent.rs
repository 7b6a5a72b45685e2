//! The agent: kubelet's `Kubelet.Run` reduced to the termination path: one runtime client,
//! the pod workers and housekeeping, the pod sources (API watch, static manifests), the status
//! manager and the event sink, all under one cancellation token and task tracker.
//!
//! Invariants:
//! * stopping the agent (cancelling the token) abandons work and never kills a pod: in-flight
//!   CRI calls are dropped, pods keep running, the next start resumes from the API and the
//!   runtime;
//! * at least one pod source is configured; orphans are judged only after every source has
//!   delivered its first complete list.
//!
//! `reaplet run`'s start-up, from the settings to an [`AgentConfig`], is [`start`].

pub mod start;

use crate::api::{self, RateLimiter, status_manager::StatusManager};
use crate::authority::Authority;
use crate::cgroups::{CgroupDriver, CgroupError, CgroupManager, CgroupNaming};
use crate::cri::{CriClient, CriConfig, CriError, Runtime};
use crate::events::EventSink;
use crate::file_source;
use crate::lifecycle::PodPhase;
use crate::metrics::{Exposition, Metrics};
use crate::sd_notify::Notifier;
use crate::server::{self, AgentState};
use crate::standby::{self, AuthoritySetting, Decision, StandbyConfig};
use crate::workers::{PipelineConfig, PodWorkers};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Everything the agent needs, resolved and validated by the caller.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub node_name: String,
    pub runtime: CriConfig,
    pub cgroup_driver: CgroupDriver,
    pub cgroup_root: String,
    pub pod_manifest_path: Option<PathBuf>,
    /// The kubelet's `staticPodPath`, when its config file was read: with reaplet's
    /// `pod_manifest_path` the same directory, a static pod with no manifest is an orphan
    /// ([`StaticPods::AllOfNode`]).
    pub kubelet_static_pod_path: Option<PathBuf>,
    /// reaplet's own pod, when it runs in one ([`crate::self_pod::detect`]).
    pub own_pod: Option<crate::pod::PodUid>,
    pub file_check_frequency: Duration,
    /// API client configuration; `None` runs from the manifest directory alone.
    pub kube: Option<kube::Config>,
    pub api_qps: f64,
    pub api_burst: u32,
    pub event_qps: f64,
    pub event_burst: u32,
    pub status_resync: Duration,
    pub pipeline: PipelineConfig,
    /// How long a stop waits for tasks to wind down.
    pub shutdown_timeout: Duration,
    /// The metrics registry, when the caller made it first (the trace export counts its
    /// dropped spans in it); else the agent makes its own.
    pub metrics: Option<Arc<Metrics>>,
    /// How long every pod list and watch may be refused with 401 before the agent stops with
    /// [`AgentError::CredentialsRejected`] (a restart reads rotated credentials again).
    pub credentials_grace: Duration,
    /// The status endpoint (`/metrics`, `/healthz`, `/readyz`, `/pods`); `None`: none.
    pub metrics_bind_address: Option<SocketAddr>,
    /// `$NOTIFY_SOCKET` and the watchdog interval (`$WATCHDOG_USEC`) under systemd.
    pub notify_socket: Option<String>,
    pub watchdog: Option<Duration>,
    /// The system bus socket, to stop pod slices as systemd units (systemd driver on a
    /// systemd host); `None`: pod cgroup directories are removed only.
    pub systemd_bus: Option<PathBuf>,
    /// `--authority`: primary, standby beside a kubelet, or auto (see [`crate::standby`]);
    /// without an API reaplet is primary whatever this says.
    pub authority: AuthoritySetting,
    /// The kubelet's health endpoint, one of the two signals of a dead kubelet; `None`: the
    /// kubelet serves none (`healthzPort` 0), the Lease alone decides.
    pub kubelet_healthz_url: Option<String>,
    /// How long the node Lease must go unrenewed (with the endpoint failing) for a takeover.
    pub takeover_after: Duration,
    /// How often standby looks at the Lease and the endpoint.
    pub standby_poll: Duration,
    /// This node's eviction sources (NoExecute taints, required node affinity); they need the
    /// API.
    pub eviction: crate::eviction::EvictionConfig,
    /// Graceful node shutdown (off unless grace periods are configured).
    pub shutdown: crate::shutdown::ShutdownConfig,
    /// Node-pressure eviction's thresholds (the kubelet's `evictionHard`, `evictionSoft`, ...);
    /// off without a threshold of a signal reaplet evaluates; needs the API.
    pub pressure: Option<crate::pressure::manager::PressureSettings>,
}

impl AgentConfig {
    /// The defaults `reaplet run` uses for everything but the node, the runtime endpoint, the
    /// cgroup root and the root dir; no pod source, no status endpoint, no systemd.
    pub fn new(node_name: &str, endpoint: &str, cgroup_root: &str, root_dir: PathBuf) -> Self {
        AgentConfig {
            node_name: node_name.into(),
            runtime: CriConfig {
                endpoint: endpoint.into(),
                ..CriConfig::default()
            },
            cgroup_driver: CgroupDriver::Cgroupfs,
            cgroup_root: cgroup_root.into(),
            pod_manifest_path: None,
            kubelet_static_pod_path: None,
            own_pod: None,
            file_check_frequency: Duration::from_secs(1),
            kube: None,
            api_qps: 100.0,
            api_burst: 200,
            event_qps: 10.0,
            event_burst: 50,
            status_resync: Duration::from_secs(10),
            pipeline: PipelineConfig {
                root_dir,
                ..PipelineConfig::default()
            },
            shutdown_timeout: Duration::from_secs(5),
            metrics: None,
            credentials_grace: Duration::from_secs(300),
            metrics_bind_address: None,
            notify_socket: None,
            watchdog: None,
            systemd_bus: None,
            authority: AuthoritySetting::Auto,
            kubelet_healthz_url: Some(standby::DEFAULT_HEALTHZ_URL.into()),
            takeover_after: standby::DEFAULT_TAKEOVER_AFTER,
            standby_poll: Duration::from_secs(2),
            eviction: crate::eviction::EvictionConfig::default(),
            shutdown: crate::shutdown::ShutdownConfig::new(Default::default()),
            pressure: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("container runtime: {0}")]
    Runtime(#[from] CriError),
    #[error("cgroups: {0}")]
    Cgroups(#[from] CgroupError),
    #[error("reading {path}: {source}")]
    Mountinfo {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("API client: {0}")]
    Api(#[source] kube::Error),
    #[error("no pod source: give a kubeconfig (or run in a cluster) or --pod-manifest-path")]
    NoSource,
    #[error(
        "the API server has refused reaplet's credentials for {0:?}: stopped so that a restart reads them again (a rotated client certificate)"
    )]
    CredentialsRejected(Duration),
    /// Another process listens on the status address (`EADDRINUSE`).
    #[error(
        "status endpoint {0} is in use by another process: give reaplet another address with --metrics-bind-address (metricsBindAddress in its config file)"
    )]
    AddressInUse(SocketAddr),
    #[error("status endpoint {address} (--metrics-bind-address, metricsBindAddress): {source}")]
    Listen {
        address: SocketAddr,
        source: std::io::Error,
    },
}

/// What the status endpoint and systemd see of a running agent.
struct Live<R> {
    workers: PodWorkers<R>,
    metrics: Arc<Metrics>,
    runtime_ok: Arc<AtomicBool>,
    events: EventSink,
    dropped_seen: AtomicU64,
    liveness_bound: Duration,
    /// The authority decision (mode, role, why), from [`standby::run`].
    authority: tokio::sync::watch::Receiver<Decision>,
    /// Pending evictions of this node's eviction sources.
    evictions: Arc<std::sync::Mutex<Vec<crate::eviction::PendingEviction>>>,
}

impl<R: Runtime> Live<R> {
    /// systemd's `STATUS=`: the runtime's stall first when there is one, then whether the
    /// first pod list is still awaited, then pods by state.
    fn summary(&self) -> String {
        let mut pods = self.pods_summary();
        if self.awaits_list() {
            pods = format!("waiting for the first complete pod list; {pods}");
        }
        match self.workers.runtime_stall() {
            Some(stall) => format!("{stall}; {pods}"),
            None => pods,
        }
    }

    /// The runtime answered and is not stalled: what every kill needs.
    fn runtime_ready(&self) -> Result<(), String> {
        if !self.runtime_ok.load(Ordering::Relaxed) {
            return Err("the container runtime has not answered yet".into());
        }
        if let Some(stall) = self.workers.runtime_stall() {
            return Err(stall.to_string());
        }
        Ok(())
    }

    /// Acting, and not every source has listed yet (a passive standby lists no pods: nothing
    /// is watched while the kubelet holds the node).
    fn awaits_list(&self) -> bool {
        !self.workers.is_synced() && self.authority.borrow().role == standby::Role::Active
    }

    fn pods_summary(&self) -> String {
        let mut counts: std::collections::HashMap<PodPhase, usize> = Default::default();
        for v in self.workers.snapshot() {
            *counts.entry(v.phase).or_default() += 1;
        }
        let parts: Vec<String> = PodPhase::ALL
            .iter()
            .map(|p| format!("{} {}", counts.get(p).copied().unwrap_or(0), p.as_str()))
            .collect();
        format!("pods: {}", parts.join(", "))
    }
}

impl<R: Runtime> AgentState for Live<R> {
    fn metrics_text(&self, format: Exposition) -> String {
        self.workers.update_gauges();
        let dropped = self.events.dropped();
        let seen = self.dropped_seen.swap(dropped, Ordering::Relaxed);
        self.metrics
            .events_dropped
            .inc_by(dropped.saturating_sub(seen));
        self.metrics.encode(format)
    }

    /// The main loop beats (it never waits on the runtime for that: a stalled runtime is a
    /// readiness matter).
    fn live(&self) -> Result<(), String> {
        let since = self.workers.since_heartbeat();
        if since > self.liveness_bound {
            return Err(format!("housekeeping has not run for {since:?}"));
        }
        Ok(())
    }

    fn ready(&self) -> Result<(), String> {
        self.runtime_ready()?;
        if let Some(why) = self.workers.identity_problem() {
            return Err(why);
        }
        if self.awaits_list() {
            return Err("waiting for the first complete pod list".into());
        }
        Ok(())
    }

    fn timeline_json(&self, query: &crate::timeline::Query) -> Option<serde_json::Value> {
        let t = self.workers.timelines().find(query)?;
        serde_json::to_value(t).ok()
    }

    fn pods_json(&self) -> serde_json::Value {
        let now = tokio::time::Instant::now();
        let pods: Vec<serde_json::Value> = self
            .workers
            .snapshot()
            .into_iter()
            .map(|v| {
                serde_json::json!({
                    "pod": v.key, "uid": v.uid.as_str(), "state": v.phase.as_str(),
                    "gracePeriod": v.grace,
                    "deadlineInSeconds": v.deadline.map(|d| d.signed_secs(now)),
                    "deadlineOrigin": v.deadline.map(|d| d.origin.as_str()),
                    "step": v.step.as_str(), "reason": v.reason.as_ref().map(|r| r.as_str()),
                    "reasons": v.reasons.iter().map(|r| r.as_str()).collect::<Vec<_>>(),
                    "source": v.source.as_str(),
                })
            })
            .collect();
        let d = *self.authority.borrow();
        serde_json::json!({
            "pods": pods,
            "authority": {
                "mode": d.mode.as_str(),
                "role": d.role.as_str(),
                "reason": format!("{:?}", d.reason),
                "why": d.reason.as_str(),
            },
            "evictions": *self.evictions.lock().unwrap_or_else(|e| e.into_inner()),
        })
    }
}

/// Runs the agent until `cancel` fires.
pub async fn run(cfg: AgentConfig, stop: CancellationToken) -> Result<(), AgentError> {
    if cfg.kube.is_none() && cfg.pod_manifest_path.is_none() {
        return Err(AgentError::NoSource);
    }
    // the agent's own token: the caller's stop, or the agent giving up (credentials refused)
    let cancel = stop.child_token();
    let mut source_end: Option<tokio::task::JoinHandle<api::source::SourceEnd>> = None;
    // the API server's health when there is one: what standby's own requests say of the
    // credentials (the pod source, idle while passive, judges its own), and whether systemd's
    // READY may come before the first pod list (an outage)
    let mut api_health: Option<api::health::ApiHealth> = None;
    let listener =
        match cfg.metrics_bind_address {
            Some(address) => Some(tokio::net::TcpListener::bind(address).await.map_err(
                |source| match source.kind() {
                    std::io::ErrorKind::AddrInUse => AgentError::AddressInUse(address),
                    _ => AgentError::Listen { address, source },
                },
            )?),
            None => None,
        };
    let metrics = cfg
        .metrics
        .clone()
        .unwrap_or_else(|| Arc::new(Metrics::new()));
    let runtime = CriClient::new(&cfg.runtime)?.with_metrics(metrics.clone());
    let runtime_ok = Arc::new(AtomicBool::new(false));
    let naming = CgroupNaming::new(cfg.cgroup_driver, &cfg.cgroup_root)?;
    let mut cgroups =
        CgroupManager::from_mountinfo(&cfg.pipeline.mountinfo, naming).map_err(|source| {
            AgentError::Mountinfo {
                path: cfg.pipeline.mountinfo.clone(),
                source,
            }
        })?;
    if let (CgroupDriver::Systemd, Some(bus)) = (cfg.cgroup_driver, &cfg.systemd_bus) {
        cgroups = cgroups.with_systemd(Arc::new(crate::systemd::Systemd::new(bus)));
    }
    let (events, events_rx) = EventSink::channel(256);
    let (events, node_events_rx) = events.with_node_events(16);
    let events_for_state = events.clone();
    let evictions = Arc::new(std::sync::Mutex::new(Vec::new()));
    let tracker = TaskTracker::new();
    // standby holds every kill from the first moment: passive until the start decision
    let authority = Arc::new(Authority::default());
    let first = standby::start_mode(
        cfg.authority,
        cfg.kube.is_some(),
        standby::LeaseAtStart::Unknown,
        standby::NodeAtStart::NotRead,
        standby::Health::Disabled,
        false,
    );
    authority.set_active(first.role == standby::Role::Active);
    metrics.set_standby_role(first.role == standby::Role::Active, false);
    let (authority_tx, authority_rx) = tokio::sync::watch::channel(first);
    let tracker_runtime = runtime.clone();
    let mut pipeline = cfg.pipeline.clone();
    pipeline.static_pods = file_source::static_pod_ownership(
        cfg.pod_manifest_path.as_deref(),
        cfg.kubelet_static_pod_path.as_deref(),
    );
    tracing::info!(staticPods = ?pipeline.static_pods, "whose the node's static pods are");
    if let Some(uid) = &cfg.own_pod {
        tracing::info!(podUID = %uid, "reaplet runs in a pod of its own: never an orphan, never evicted; its deletion ends it last");
    }
    pipeline.own_pod = cfg.own_pod.clone();
    let mut eviction_config = cfg.eviction.clone();
    eviction_config.own_pod = cfg.own_pod.clone();
    if pipeline.volume_teardown
        && let Err(why) = crate::volumes::teardown::can_tear_down(
            std::path::Path::new("/proc"),
            std::path::Path::new("/run/systemd/system").is_dir(),
            &pipeline.root_dir,
            cfg.own_pod.is_some(),
        )
    {
        tracing::warn!(why = %why,
            "node-local volumes of terminated pods will be waited for, never torn down");
        pipeline.volume_teardown = false;
    }
    // node-pressure eviction reads the kernel's figures: the memory hierarchy and /proc
    let pressure = cfg
        .pressure
        .clone()
        .filter(|p| p.any_evaluated())
        .and_then(|p| {
            let reader = crate::pressure::signals::SignalReader::host(
                cgroups.hierarchies(),
                cgroups.naming(),
            );
            if reader.is_none() {
                tracing::warn!("node-pressure eviction off: no memory cgroup hierarchy");
            }
            Some((p, reader?, cgroups.naming().clone()))
        });
    let runtime = Arc::new(runtime);
    let workers = PodWorkers::new(
        runtime.clone(),
        cgroups,
        pipeline,
        events.clone(),
        authority.clone(),
        cancel.clone(),
        tracker.clone(),
    );
    let mut sources = Vec::new();
    if cfg.kube.is_some() {
        sources.push(api::source::SOURCE);
    }
    if cfg.pod_manifest_path.is_some() {
        sources.push(file_source::SOURCE);
    }
    workers.expect_sources(&sources);
    workers.set_metrics(metrics.clone());
    {
        // readiness needs one answer from the runtime; keep asking until it comes
        let (ok, cancel) = (runtime_ok.clone(), cancel.clone());
        tracker.spawn(async move {
            let mut first = true;
            loop {
                match tracker_runtime.version().await {
                    Ok(v) => {
                        tracing::info!(
                            runtime = %v.runtime_name,
                            version = %v.runtime_version,
                            api = %v.runtime_api_version,
                            "container runtime connected"
                        );
                        ok.store(true, Ordering::Relaxed);
                        return;
                    }
                    // not fatal: pods are only ever touched through successful calls; one
                    // warning, then quiet retries (no line per attempt)
                    Err(e) if first => {
                        tracing::warn!(err = %e, "container runtime not answering yet; retrying every second");
                        first = false;
                    }
                    Err(e) => tracing::debug!(err = %e, "container runtime still not answering"),
                }
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
            }
        });
    }

    let mut shutdown = crate::shutdown::Context {
        config: cfg.shutdown.clone(),
        pods: workers.clone(),
        statuses_pending: None,
        node: None,
        events: events.clone(),
        metrics: Some(metrics.clone()),
        authority: authority.clone(),
    };
    if let Some(kc) = cfg.kube.clone() {
        let client = api::client::client(kc.clone()).map_err(AgentError::Api)?;
        // the prober's: a new connection for each probe (issue 44)
        let fresh = api::client::fresh_connections(kc.clone()).map_err(AgentError::Api)?;
        // one view of the API server's reachability for every caller, and its prober
        let health = api::health::ApiHealth::new();
        api_health = Some(health.clone());
        tracker.spawn(api::health::probe(health.clone(), fresh, cancel.clone()));
        // an orphan is ended only once a read confirms its object gone (issue 44); no read
        // while the API server is unreachable
        workers.set_orphan_lookup(
            Box::new(crate::workers::ApiLookup::new(
                client.clone(),
                health.clone(),
            )),
            &cfg.node_name,
        );
        shutdown.node = Some(Arc::new(crate::shutdown::node::NodeReady::new(
            client.clone(),
            &cfg.node_name,
        )));
        let status = StatusManager::new(
            client.clone(),
            Arc::new(RateLimiter::new(cfg.api_qps, cfg.api_burst)),
            cfg.status_resync,
            health.clone(),
            Some(metrics.clone()),
        );
        status.set_timelines(workers.timelines());
        workers.set_status_sink(Arc::new(status.clone()));
        let pending = status.clone();
        shutdown.statuses_pending = Some(Box::new(move || pending.pending()));
        if first.mode == standby::Mode::Standby {
            let scfg = StandbyConfig {
                setting: cfg.authority,
                node_name: cfg.node_name.clone(),
                healthz_url: cfg.kubelet_healthz_url.clone(),
                takeover_after: cfg.takeover_after,
                poll: cfg.standby_poll,
                probe_timeout: cfg.standby_poll.min(Duration::from_secs(1)),
                marker: Some(standby::marker::path_in(&cfg.pipeline.root_dir)),
            };
            // decided before the pod source starts (at most START_TIMEOUT): a primary start
            // never holds a kill for want of a decision
            let first = standby::begin(&scfg, Some(&client), &authority).await;
            authority_tx.send_replace(first.decision);
            // every decision in the metrics: the role, takeovers and hand-backs, and a name
            // that is not the kubelet's
            let mut decisions = authority_tx.subscribe();
            let mut role = first.decision.role;
            let m = metrics.clone();
            tracker.spawn(async move {
                loop {
                    let d = *decisions.borrow_and_update();
                    m.set_standby_role(d.role == standby::Role::Active, d.role != role);
                    role = d.role;
                    let problem = d.reason.identity_problem();
                    // the decision's problems; pod_bound_elsewhere is the workers' to set
                    let ours = crate::metrics::IdentityProblem::ALL
                        .into_iter()
                        .filter(|p| *p != crate::metrics::IdentityProblem::PodBoundElsewhere);
                    for p in ours {
                        m.set_identity_problem(p, problem == Some(p));
                    }
                    if decisions.changed().await.is_err() {
                        return;
                    }
                }
            });
            tracker.spawn(standby::run(
                scfg,
                client.clone(),
                health.clone(),
                first,
                authority.clone(),
                events.clone(),
                authority_tx,
                cancel.clone(),
            ));
        }
        tracker.spawn(status.clone().run(cancel.clone()));
        tracker.spawn(api::events::run(
            client.clone(),
            cfg.node_name.clone(),
            events_rx,
            node_events_rx,
            RateLimiter::new(cfg.event_qps, cfg.event_burst),
            health.clone(),
            cancel.clone(),
        ));
        let mut feed = crate::eviction::PodFeed::default();
        if let Some((settings, reader, naming)) = pressure {
            tracing::info!(
                thresholds = settings.thresholds.len(),
                "node-pressure eviction on (while reaplet is the node's agent)"
            );
            tracker.spawn(crate::pressure::runner::run(
                crate::pressure::runner::Context {
                    workers: workers.clone(),
                    runtime: runtime.clone(),
                    events: events.clone(),
                    metrics: Some(metrics.clone()),
                    authority: authority.clone(),
                    reader,
                    naming,
                    settings,
                    own_pod: cfg.own_pod.clone(),
                },
                feed.subscribe(),
                cancel.clone(),
            ));
        }
        if cfg.eviction.any() {
            let pods_rx = feed.subscribe();
            tracker.spawn(crate::eviction::runner::run(
                crate::eviction::runner::Context {
                    client: client.clone(),
                    node: cfg.node_name.clone(),
                    workers: workers.clone(),
                    events: events.clone(),
                    metrics: Some(metrics.clone()),
                    authority: authority.clone(),
                    config: eviction_config.clone(),
                    view: evictions.clone(),
                    health: health.clone(),
                },
                pods_rx,
                cancel.clone(),
            ));
        }
        let feed = (!feed.is_empty()).then_some(feed);
        // the pod watch on a pool of its own: a watch restarted after its path went silent
        // never lands on another request's pooled connection (api::client::POOL_IDLE)
        let watch_client = api::client::watch_client(kc.clone()).map_err(AgentError::Api)?;
        source_end = Some(tracker.spawn(api::source::run(
            watch_client,
            cfg.node_name.clone(),
            workers.clone(),
            Some(status),
            feed,
            cfg.credentials_grace,
            health,
            authority.clone(),
            cancel.clone(),
        )));
    } else {
        // no API: events are logged only (EventSink logs each one); drain the channels
        let (mut rx, mut node_rx) = (events_rx, node_events_rx);
        let cancel = cancel.clone();
        tracker.spawn(async move {
            loop {
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    ev = rx.recv() => if ev.is_none() { return },
                    Some(_) = node_rx.recv() => {}
                }
            }
        });
    }
    if let Some(dir) = cfg.pod_manifest_path.clone() {
        tracker.spawn(file_source::run(
            dir,
            cfg.node_name.clone(),
            cfg.file_check_frequency,
            workers.clone(),
            cancel.clone(),
        ));
    }
    tracker.spawn(crate::shutdown::run(shutdown, cancel.clone()));
    tracker.spawn(workers.clone().run_housekeeping());
    // the kubelet's own reason to end a pod: its active deadline (only while acting)
    tracker.spawn(crate::active_deadline::run(
        crate::active_deadline::Context {
            workers: workers.clone(),
            runtime: runtime.clone(),
            events: events.clone(),
            authority: authority.clone(),
        },
        cancel.clone(),
    ));
    #[cfg(feature = "test-hooks")]
    {
        // test hook: SIGUSR2 wedges housekeeping (the VM test's watchdog scenario)
        let w = workers.clone();
        let c = cancel.clone();
        tracker.spawn(async move {
            use tokio::signal::unix::{SignalKind, signal};
            let Ok(mut usr2) = signal(SignalKind::user_defined2()) else {
                return;
            };
            tokio::select! {
                _ = c.cancelled() => {}
                _ = usr2.recv() => w.freeze_housekeeping(),
            }
        });
    }
    let live = Arc::new(Live {
        workers: workers.clone(),
        metrics: metrics.clone(),
        runtime_ok,
        events: events_for_state,
        dropped_seen: AtomicU64::new(0),
        liveness_bound: cfg
            .watchdog
            .unwrap_or(Duration::from_secs(60))
            .max(Duration::from_secs(30)),
        authority: authority_rx,
        evictions: evictions.clone(),
    });
    if let Some(l) = listener {
        tracing::info!(address = ?l.local_addr().ok(), "status endpoint listening");
        tracker.spawn(server::serve(l, live.clone(), cancel.clone()));
    }
    let notifier = Notifier::new(cfg.notify_socket.clone());
    if notifier.enabled() {
        tracker.spawn(notify_loop(
            notifier,
            live.clone(),
            api_health.clone(),
            cfg.watchdog,
            cancel.clone(),
        ));
    }
    tracing::info!(node = %cfg.node_name, sources = ?sources, "reaplet running");

    let mut outcome = Ok(());
    tokio::select! {
        _ = cancel.cancelled() => {}
        Ok(api::source::SourceEnd::CredentialsRejected(d)) = async {
            match source_end.as_mut() {
                Some(h) => h.await,
                None => std::future::pending().await,
            }
        } => outcome = Err(AgentError::CredentialsRejected(d)),
        d = credentials_refused_for(api_health.clone(), cfg.credentials_grace) => {
            tracing::error!(refusedFor = ?d, "the API server no longer accepts reaplet's credentials; stopping so that a restart reads them again");
            outcome = Err(AgentError::CredentialsRejected(d));
        }
    }
    cancel.cancel();
    tracing::info!("stopping: pods are left running; the next start resumes");
    Notifier::new(cfg.notify_socket.clone()).notify("STOPPING=1");
    tracker.close();
    if tokio::time::timeout(cfg.shutdown_timeout, tracker.wait())
        .await
        .is_err()
    {
        tracing::warn!(timeout = ?cfg.shutdown_timeout, "tasks did not stop in time; abandoning them");
    }
    outcome
}

/// How long systemd's READY waits for the first pod list once the runtime has answered, when
/// the API server answers but slowly: the unit's start (a package upgrade's restart) is not
/// held longer than this by the API.
pub const READY_LIST_WAIT: Duration = Duration::from_secs(10);

/// Whether systemd's start-up is done (READY=1): the runtime answered, which with the
/// termination records on disk is all a resumed kill needs, and the pods are listed, or the API
/// server does not answer (an outage: the list comes when it ends), or it has had
/// [`READY_LIST_WAIT`] since the runtime answered. `/readyz` keeps waiting for the list.
fn started(
    runtime_ready: bool,
    awaits_list: bool,
    api_down: bool,
    since_runtime: Duration,
) -> bool {
    runtime_ready && (!awaits_list || api_down || since_runtime >= READY_LIST_WAIT)
}

/// READY as [`started`] says; STATUS with pods by state (and the runtime's stall, and the
/// awaited list, if any); WATCHDOG only while housekeeping (the main loop) keeps beating,
/// which a stalled runtime does not stop (see [`crate::workers`]' housekeeping).
async fn notify_loop<R: Runtime>(
    notifier: Notifier,
    live: Arc<Live<R>>,
    api: Option<api::health::ApiHealth>,
    watchdog: Option<Duration>,
    cancel: CancellationToken,
) {
    let tick = watchdog.map_or(Duration::from_secs(5), |w| {
        (w / 2).min(Duration::from_secs(5))
    });
    let mut ready_sent = false;
    let mut last_status = String::new();
    // when the runtime first answered (monotonic)
    let mut runtime_since: Option<tokio::time::Instant> = None;
    loop {
        let mut msg = Vec::new();
        let runtime_ready = live.runtime_ready().is_ok();
        let since = match runtime_ready {
            true => runtime_since
                .get_or_insert_with(tokio::time::Instant::now)
                .elapsed(),
            false => Duration::ZERO,
        };
        let api_down = api.as_ref().is_some_and(|h| !h.is_reachable());
        if !ready_sent && started(runtime_ready, live.awaits_list(), api_down, since) {
            msg.push("READY=1".to_string());
            ready_sent = true;
        }
        let status = live.summary();
        if status != last_status {
            msg.push(format!("STATUS={status}"));
            last_status = status;
        }
        if watchdog.is_some() && live.live().is_ok() {
            msg.push("WATCHDOG=1".into());
        }
        if !msg.is_empty() {
            notifier.notify(&msg.join("\n"));
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(if ready_sent { tick } else { Duration::from_millis(100) }) => {}
        }
    }
}

/// The cgroup driver when none is configured: the runtime's own (`RuntimeConfig`), else what
/// existing pod cgroups use, else the host's init (systemd → systemd). Returns how it was found.
pub async fn detect_cgroup_driver(
    runtime: &CriClient,
    hierarchies: &[crate::cgroups::Hierarchy],
    host_runs_systemd: bool,
) -> (CgroupDriver, &'static str) {
    match runtime.cgroup_driver().await {
        Ok(Some(d)) => return (d, "from the runtime"),
        Ok(None) => {}
        Err(e) => tracing::debug!(err = %e, "runtime config unavailable"),
    }
    for h in hierarchies {
        if h.mount_point.join("kubepods.slice").is_dir() {
            return (CgroupDriver::Systemd, "from existing pod cgroups");
        }
        if h.mount_point.join("kubepods").is_dir() {
            return (CgroupDriver::Cgroupfs, "from existing pod cgroups");
        }
    }
    if host_runs_systemd {
        (CgroupDriver::Systemd, "from the host (systemd is init)")
    } else {
        (
            CgroupDriver::Cgroupfs,
            "from the host (systemd is not init)",
        )
    }
}

/// Resolves once every request reported to `health` has been refused its credentials for
/// `grace` (checked every second, locally: no request of its own); never without an API.
async fn credentials_refused_for(
    health: Option<api::health::ApiHealth>,
    grace: Duration,
) -> Duration {
    let Some(health) = health else {
        return std::future::pending().await;
    };
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        if let Some(d) = health.refused_for().filter(|d| *d >= grace) {
            return d;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 38 item 6: systemd's start-up needs the runtime, and the API only while it
    /// answers and for at most READY_LIST_WAIT.
    #[test]
    fn ready_needs_the_runtime_and_waits_for_the_list_only_while_the_api_answers() {
        let (zero, late) = (Duration::ZERO, READY_LIST_WAIT);
        // the list arrived (or none is awaited: a passive standby)
        assert!(started(true, false, false, zero));
        // the list awaited: not while the API answers, at once when it does not
        assert!(!started(true, true, false, zero));
        assert!(started(true, true, true, zero));
        // an API answering too slowly holds the start READY_LIST_WAIT at most
        assert!(!started(true, true, false, late - Duration::from_millis(1)));
        assert!(started(true, true, false, late));
        // never without the runtime
        assert!(!started(false, false, false, late * 10));
        assert!(!started(false, true, true, late * 10));
    }
}
