//! `reaplet run`'s start-up: from the resolved settings to the agent's configuration, what the
//! kubelet's `cmd/kubelet/app/server.go` does between its flags and `Kubelet.Run` (the node
//! name from the credentials, `--hostname-override` or the host, the cgroup driver from the runtime, systemd's
//! notify socket and watchdog), and the agent run under the stop signals.
//!
//! Invariants:
//! * a stop (SIGTERM, SIGINT) during start-up, say while the runtime does not answer, ends
//!   `run` at once with no pod touched ([`run`]);
//! * the node name is the one the API credentials carry (`CN=system:node:<name>`, a pod-bound
//!   token's node: [`crate::config::identity`]), else `--hostname-override`, else the host name
//!   lower-cased, as the kubelet's `nodeutil.GetHostname`; one start-up line says which;
//! * `$WATCHDOG_USEC` counts only when `$WATCHDOG_PID` is unset or names this process.

use super::AgentConfig;
use crate::config::Settings;
use crate::config::identity::NameFrom;
use crate::cri::{CriConfig, CriError};
use crate::workers::PipelineConfig;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The target of start-up's log lines: the binary's, as they always had, so the lines read the
/// same and `RUST_LOG` directives naming it keep matching.
const LOG_TARGET: &str = crate::logs::BINARY_TARGET;

/// The host name could not be read (`/proc/sys/kernel/hostname`).
#[derive(Debug, thiserror::Error)]
#[error("reading the host name")]
pub struct HostNameError(#[source] pub std::io::Error);

/// Why the agent's configuration could not be made.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    HostName(#[from] HostNameError),
    /// The runtime client, needed to ask the runtime its cgroup driver.
    #[error(transparent)]
    Runtime(#[from] CriError),
}

/// Why `reaplet run` ended with an error.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Start(#[from] StartError),
    #[error(transparent)]
    Agent(#[from] super::AgentError),
}

impl RunError {
    /// The API server refused the credentials for too long
    /// ([`super::AgentError::CredentialsRejected`]): a restart reads them again.
    pub fn credentials_rejected(&self) -> bool {
        matches!(
            self,
            RunError::Agent(super::AgentError::CredentialsRejected(_))
        )
    }
}

/// This host's name, lower-cased.
pub fn host_name() -> Result<String, HostNameError> {
    let h = std::fs::read_to_string("/proc/sys/kernel/hostname").map_err(HostNameError)?;
    Ok(h.trim().to_lowercase())
}

/// The node: the name the API credentials carry, else `--hostname-override`, else the host
/// name (an override that disagrees with the credentials was refused when the settings were
/// loaded: [`crate::config::node_name_check`]).
pub fn node_name(s: &Settings) -> Result<String, HostNameError> {
    node_identity(s).map(|(name, _)| name)
}

/// The node's name and where it came from (see [`node_name`]).
pub fn node_identity(s: &Settings) -> Result<(String, NameFrom), HostNameError> {
    if let Some(c) = &s.node_from_credentials.name {
        return Ok((c.name.clone(), c.from));
    }
    match &s.hostname_override {
        Some(n) => Ok((n.clone(), NameFrom::HostnameOverride)),
        None => Ok((host_name()?, NameFrom::HostName)),
    }
}

/// The start-up line of the node's name and where it came from, and a line for the part of
/// the credentials that could not be read, if any.
fn log_node_name(s: &Settings, name: &str, from: NameFrom) {
    if let Some(note) = &s.node_from_credentials.problem {
        tracing::warn!(target: LOG_TARGET, why = %note, "no node name read from the API credentials");
    }
    let detail = s
        .node_from_credentials
        .name
        .as_ref()
        .map_or(String::new(), |c| c.detail.clone());
    tracing::info!(
        target: LOG_TARGET,
        node = %name,
        from = from.as_str(),
        detail = %detail,
        "node name"
    );
}

/// Runs the agent until `cancel`; a stop during start-up (a runtime that does not answer,
/// say) ends it at once, with no pod touched.
pub async fn run(
    s: Settings,
    kube: Option<kube::Config>,
    metrics: Arc<crate::metrics::Metrics>,
    cancel: CancellationToken,
) -> Result<(), RunError> {
    let cfg = tokio::select! {
        _ = cancel.cancelled() => {
            tracing::info!(
                target: LOG_TARGET,
                "stopped during start-up: pods are left running"
            );
            return Ok(());
        }
        cfg = agent_config(s, kube) => cfg?,
    };
    let cfg = super::AgentConfig {
        metrics: Some(metrics),
        ..cfg
    };
    super::run(cfg, cancel).await?;
    Ok(())
}

/// The agent's configuration: the settings, plus what start-up finds out (the node name,
/// the cgroup driver from the runtime, systemd's watchdog).
pub async fn agent_config(
    s: Settings,
    kube: Option<kube::Config>,
) -> Result<AgentConfig, StartError> {
    let (node_name, from) = node_identity(&s)?;
    log_node_name(&s, &node_name, from);
    if kube.is_none() {
        tracing::info!(
            target: LOG_TARGET,
            "no API credentials: running from the manifest directory alone"
        );
    }
    let runtime = CriConfig {
        endpoint: s.container_runtime_endpoint.clone(),
        request_timeout: s.runtime_request_timeout,
    };
    let cgroup_driver = match s.cgroup_driver {
        Some(d) => d,
        None => {
            let client = crate::cri::CriClient::new(&runtime)?;
            let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
            let h = crate::cgroups::hierarchies(&crate::volumes::parse_mountinfo(&mounts));
            let systemd = std::path::Path::new("/run/systemd/system").is_dir();
            let (d, how) = super::detect_cgroup_driver(&client, &h, systemd).await;
            tracing::info!(target: LOG_TARGET, driver = ?d, how, "cgroup driver detected");
            d
        }
    };
    let watchdog = std::env::var("WATCHDOG_USEC")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|_| {
            std::env::var("WATCHDOG_PID").map_or(true, |p| p == std::process::id().to_string())
        })
        .map(Duration::from_micros);
    tracing::info!(
        target: LOG_TARGET,
        url = s.kubelet_healthz_url.as_deref().unwrap_or("none (healthzPort 0: the Lease alone decides)"),
        from = s.kubelet_healthz_from.as_str(),
        "kubelet healthz probe"
    );
    let taint_manager = s.taint_manager();
    let cfg = AgentConfig {
        node_name,
        runtime,
        cgroup_driver,
        cgroup_root: s.cgroup_root,
        pod_manifest_path: s.pod_manifest_path,
        kubelet_static_pod_path: s.kubelet_static_pod_path,
        own_pod: crate::self_pod::detect().map(|(uid, how)| {
            tracing::info!(
                target: LOG_TARGET,
                podUID = %uid,
                from = how.as_str(),
                "found reaplet's own pod"
            );
            uid
        }),
        file_check_frequency: s.file_check_frequency,
        kube,
        api_qps: s.kube_api_qps,
        api_burst: s.kube_api_burst,
        event_qps: s.event_qps,
        event_burst: s.event_burst,
        status_resync: Duration::from_secs(10),
        pipeline: PipelineConfig {
            root_dir: s.root_dir,
            volume_wait: s.volume_unmount_timeout,
            relist_period: s.relist_period,
            relist_period_with_events: s.relist_period_with_events,
            container_events: s.container_events,
            termination_timelines: s.termination_timelines,
            ..PipelineConfig::default()
        },
        shutdown_timeout: Duration::from_secs(5),
        metrics: None,
        credentials_grace: Duration::from_secs(300),
        metrics_bind_address: Some(s.metrics_bind_address),
        notify_socket: std::env::var("NOTIFY_SOCKET").ok(),
        watchdog,
        // pod slices are systemd units only when systemd runs the host
        systemd_bus: std::path::Path::new("/run/systemd/system")
            .is_dir()
            .then(|| crate::systemd::SYSTEM_BUS.into()),
        authority: s.authority,
        kubelet_healthz_url: s.kubelet_healthz_url,
        takeover_after: s.takeover_after,
        standby_poll: Duration::from_secs(2),
        eviction: crate::eviction::EvictionConfig {
            taint_manager,
            node_affinity: s
                .enforce_node_affinity
                .then(|| crate::eviction::AffinityConfig {
                    namespaces: s.node_affinity_namespaces.clone(),
                    selector: s.node_affinity_selector.clone(),
                    settle: s.node_affinity_settle,
                }),
            dry_run: s.eviction_dry_run,
            // set by the agent from its own pod
            own_pod: None,
        },
        shutdown: crate::shutdown::ShutdownConfig::new(s.shutdown.clone()),
        // node-pressure eviction: the agent runs it only with a signal it evaluates
        pressure: Some(s.pressure),
    };
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::AgentError;
    use std::error::Error as _;

    #[test]
    fn errors_read_as_their_cause_and_rejected_credentials_are_told_apart() {
        let rejected = RunError::from(AgentError::CredentialsRejected(Duration::from_secs(300)));
        assert!(rejected.credentials_rejected());
        assert_eq!(
            rejected.to_string(),
            AgentError::CredentialsRejected(Duration::from_secs(300)).to_string()
        );
        assert!(!RunError::from(AgentError::NoSource).credentials_rejected());
        // the binary prints the chain (`{:#}`): the cause once, then its source
        let io = std::io::Error::from(std::io::ErrorKind::NotFound);
        let e = RunError::from(StartError::from(HostNameError(io)));
        assert!(!e.credentials_rejected());
        assert_eq!(e.to_string(), "reading the host name");
        assert_eq!(e.source().unwrap().to_string(), "entity not found");
        assert!(e.source().unwrap().source().is_none());
    }
}
