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

use crate::api::{self, RateLimiter, status_manager::StatusManager};
use crate::authority::Authority;
use crate::cgroups::{CgroupDriver, CgroupError, CgroupManager, CgroupNaming};
use crate::cri::{CriClient, CriConfig, CriError, Runtime};
use crate::events::EventSink;
use crate::file_source;
use crate::workers::{PipelineConfig, PodWorkers};
use std::path::PathBuf;
use std::sync::Arc;
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
}

/// Runs the agent until `cancel` fires.
pub async fn run(cfg: AgentConfig, cancel: CancellationToken) -> Result<(), AgentError> {
    if cfg.kube.is_none() && cfg.pod_manifest_path.is_none() {
        return Err(AgentError::NoSource);
    }
    let runtime = CriClient::new(&cfg.runtime)?;
    match runtime.version().await {
        Ok(v) => tracing::info!(
            runtime = %v.runtime_name,
            version = %v.runtime_version,
            api = %v.runtime_api_version,
            "container runtime connected"
        ),
        // not fatal: calls are retried, and pods are only touched through successful calls
        Err(e) => tracing::warn!(err = %e, "container runtime not answering yet"),
    }
    let naming = CgroupNaming::new(cfg.cgroup_driver, &cfg.cgroup_root)?;
    let cgroups =
        CgroupManager::from_mountinfo(&cfg.pipeline.mountinfo, naming).map_err(|source| {
            AgentError::Mountinfo {
                path: cfg.pipeline.mountinfo.clone(),
                source,
            }
        })?;
    let (events, events_rx) = EventSink::channel(256);
    let tracker = TaskTracker::new();
    let workers = PodWorkers::new(
        Arc::new(runtime),
        cgroups,
        cfg.pipeline.clone(),
        events,
        Arc::new(Authority::default()),
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

    if let Some(kc) = cfg.kube.clone() {
        let client = kube::Client::try_from(kc).map_err(AgentError::Api)?;
        let status = StatusManager::new(
            client.clone(),
            Arc::new(RateLimiter::new(cfg.api_qps, cfg.api_burst)),
            cfg.status_resync,
        );
        workers.set_status_sink(Arc::new(status.clone()));
        tracker.spawn(status.clone().run(cancel.clone()));
        tracker.spawn(api::events::run(
            client.clone(),
            cfg.node_name.clone(),
            events_rx,
            RateLimiter::new(cfg.event_qps, cfg.event_burst),
            cancel.clone(),
        ));
        tracker.spawn(api::source::run(
            client,
            cfg.node_name.clone(),
            workers.clone(),
            Some(status),
            cancel.clone(),
        ));
    } else {
        // no API: events are logged only (EventSink logs each one); drain the channel
        let mut rx = events_rx;
        let cancel = cancel.clone();
        tracker.spawn(async move {
            loop {
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    ev = rx.recv() => if ev.is_none() { return },
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
    tracker.spawn(workers.clone().run_housekeeping());
    tracing::info!(node = %cfg.node_name, sources = ?sources, "reaplet running");

    cancel.cancelled().await;
    tracing::info!("stopping: pods are left running; the next start resumes");
    tracker.close();
    if tokio::time::timeout(cfg.shutdown_timeout, tracker.wait())
        .await
        .is_err()
    {
        tracing::warn!(timeout = ?cfg.shutdown_timeout, "tasks did not stop in time; abandoning them");
    }
    Ok(())
}
