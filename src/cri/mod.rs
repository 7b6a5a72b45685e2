//! The container runtime seam: kubelet's `pkg/kubelet/cri/remote` (remote runtime service)
//! and the slice of `kubecontainer.Runtime` that termination needs.
//!
//! Invariants:
//! * the gRPC code is generated at build time from the vendored `proto/api.proto` (see
//!   `build.rs`) and never edited; everything else talks to the runtime through [`Runtime`], so
//!   tests can swap in a fake;
//! * every call has a deadline: [`CriConfig::request_timeout`] (kubelet: 2 min), and for
//!   `StopContainer` the request timeout plus the grace;
//! * errors are classified by gRPC status code, never by message text: `NotFound` on a stop is
//!   "already stopped" for the caller, `Unimplemented` on `GetContainerEvents` means "ask
//!   containerd's events service" ([`containerd_events`]), and if that is refused, "poll".

pub mod pb {
    #![allow(clippy::all, clippy::pedantic, missing_docs)]
    tonic::include_proto!("runtime.v1");
}

mod client;
pub mod containerd_events;
#[cfg(test)]
pub mod fake;
mod stream;

pub use client::CriClient;

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

/// Label the kubelet puts on sandboxes and containers: the pod's UID.
pub const LABEL_POD_UID: &str = "io.kubernetes.pod.uid";
/// Label: the pod's name.
pub const LABEL_POD_NAME: &str = "io.kubernetes.pod.name";
/// Label: the pod's namespace.
pub const LABEL_POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
/// Label on containers: the container's name in the pod spec.
pub const LABEL_CONTAINER_NAME: &str = "io.kubernetes.container.name";
/// Container annotation: the pod's `terminationGracePeriodSeconds`.
pub const ANNOTATION_GRACE: &str = "io.kubernetes.pod.terminationGracePeriod";
/// Container annotation: the container's preStop handler as JSON (`v1.LifecycleHandler`).
pub const ANNOTATION_PRESTOP: &str = "io.kubernetes.container.preStopHandler";
/// Container annotation: the container's restart count.
pub const ANNOTATION_RESTART_COUNT: &str = "io.kubernetes.container.restartCount";

/// Errors of a runtime call. `op` is the CRI method, `id` the object it was about (if any).
/// `" <id>"`, or nothing for calls about no particular object (`Version`, `List*`).
fn spaced(id: &str) -> String {
    if id.is_empty() {
        String::new()
    } else {
        format!(" {id}")
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CriError {
    #[error("invalid runtime endpoint {endpoint:?}: {reason}")]
    Endpoint { endpoint: String, reason: String },
    #[error("{op}{}: not found", spaced(.id))]
    NotFound { op: &'static str, id: String },
    #[error("{op}: not implemented by the runtime")]
    Unimplemented { op: &'static str },
    #[error("{op}{}: deadline of {timeout:?} exceeded", spaced(.id))]
    DeadlineExceeded {
        op: &'static str,
        id: String,
        timeout: Duration,
    },
    #[error("{op}{}: runtime unavailable: {message}", spaced(.id))]
    Unavailable {
        op: &'static str,
        id: String,
        message: String,
    },
    #[error("{op}{}: {code:?}: {message}", spaced(.id))]
    Rpc {
        op: &'static str,
        id: String,
        code: tonic::Code,
        message: String,
    },
}

impl CriError {
    /// The object does not exist (any more): for stops this means "done".
    pub fn is_not_found(&self) -> bool {
        matches!(self, CriError::NotFound { .. })
    }

    /// The runtime itself answered the call (with an error status): it received the request.
    /// Refused or unanswered calls (unavailable, our deadline) may never have reached it.
    pub fn runtime_answered(&self) -> bool {
        match self {
            CriError::NotFound { .. } | CriError::Unimplemented { .. } | CriError::Rpc { .. } => {
                true
            }
            CriError::Endpoint { .. }
            | CriError::DeadlineExceeded { .. }
            | CriError::Unavailable { .. } => false,
        }
    }

    pub(crate) fn from_status(op: &'static str, id: &str, s: tonic::Status) -> Self {
        let id = id.to_owned();
        let message = s.message().to_owned();
        match s.code() {
            tonic::Code::NotFound => CriError::NotFound { op, id },
            tonic::Code::Unimplemented => CriError::Unimplemented { op },
            tonic::Code::Unavailable => CriError::Unavailable { op, id, message },
            code => CriError::Rpc {
                op,
                id,
                code,
                message,
            },
        }
    }
}

/// State of a container as the runtime reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContainerRunState {
    Created,
    Running,
    Exited,
    Unknown,
}

impl ContainerRunState {
    fn from_pb(v: i32) -> Self {
        match pb::ContainerState::try_from(v) {
            Ok(pb::ContainerState::ContainerCreated) => Self::Created,
            Ok(pb::ContainerState::ContainerRunning) => Self::Running,
            Ok(pb::ContainerState::ContainerExited) => Self::Exited,
            _ => Self::Unknown,
        }
    }

    /// Whether a process of this container may still be alive. `Unknown` counts as running:
    /// reaplet never assumes a container stopped that it cannot prove stopped.
    pub fn may_run(self) -> bool {
        matches!(self, Self::Running | Self::Unknown)
    }
}

/// A pod sandbox as listed by the runtime.
#[derive(Debug, Clone, PartialEq)]
pub struct RuntimeSandbox {
    pub id: String,
    /// `metadata.uid` (what the runtime was told), or the `io.kubernetes.pod.uid` label.
    pub pod_uid: String,
    pub pod_name: String,
    pub pod_namespace: String,
    pub ready: bool,
    pub created_at: i64,
    pub labels: HashMap<String, String>,
    pub annotations: HashMap<String, String>,
}

/// A container as listed by the runtime.
#[derive(Debug, Clone, PartialEq)]
pub struct RuntimeContainer {
    pub id: String,
    pub sandbox_id: String,
    /// The container's name in the pod spec (`metadata.name`, else the label).
    pub name: String,
    pub attempt: u32,
    pub pod_uid: String,
    pub state: ContainerRunState,
    pub created_at: i64,
    pub labels: HashMap<String, String>,
    pub annotations: HashMap<String, String>,
}

/// Detailed status of one container.
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerDetail {
    pub id: String,
    pub state: ContainerRunState,
    pub exit_code: i32,
    pub started_at: i64,
    pub finished_at: i64,
    pub reason: String,
}

/// Result of an `ExecSync`. The output is kept only to be dropped: preStop output may hold
/// secrets and never reaches logs or events.
#[derive(Debug, Clone)]
pub struct ExecResult {
    pub exit_code: i32,
}

/// What the runtime says about itself.
#[derive(Debug, Clone, PartialEq)]
pub struct RuntimeVersion {
    pub runtime_name: String,
    pub runtime_version: String,
    pub runtime_api_version: String,
}

/// What a [`ContainerEvent`] says happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContainerEventKind {
    Created,
    Started,
    /// The container's process exited.
    Exited,
    Deleted,
    /// An event type this version does not know.
    Other,
}

/// A change notice about one container, from CRI `GetContainerEvents` or containerd's events
/// service ([`EventSource`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerEvent {
    /// The CRI container ID (for containerd's events, sandbox IDs appear here too).
    pub container_id: String,
    pub kind: ContainerEventKind,
    /// The exit code, when the event carries it (an exit).
    pub exit_code: Option<i32>,
    /// When the container exited, in nanoseconds since the epoch (CRI's `finished_at` form),
    /// when the event carries it.
    pub exited_at: Option<i64>,
}

/// Where a runtime's container events come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventSource {
    /// CRI `GetContainerEvents`.
    Cri,
    /// containerd's events service on the same socket (`/tasks/exit`, `/tasks/delete` in
    /// namespace `k8s.io`), for containerd without `GetContainerEvents` (1.6).
    ContainerdEvents,
}

impl EventSource {
    pub fn as_str(self) -> &'static str {
        match self {
            EventSource::Cri => "CRI GetContainerEvents",
            EventSource::ContainerdEvents => "containerd events service",
        }
    }
}

impl std::fmt::Display for EventSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An open container event subscription. `events` ends when the stream does (runtime
/// restarted, connection lost): the caller subscribes again.
#[derive(Debug)]
pub struct EventSubscription {
    pub source: EventSource,
    pub events: tokio::sync::mpsc::Receiver<ContainerEvent>,
}

/// The operations the termination pipeline needs from a CRI runtime.
///
/// Implemented by [`CriClient`] over a real socket; tests implement it with fakes.
pub trait Runtime: Send + Sync + 'static {
    fn version(&self) -> impl Future<Output = Result<RuntimeVersion, CriError>> + Send;
    /// Lists sandboxes; with `pod_uid`, only that pod's (label selector on the runtime side).
    fn list_sandboxes(
        &self,
        pod_uid: Option<&str>,
    ) -> impl Future<Output = Result<Vec<RuntimeSandbox>, CriError>> + Send;
    /// Lists containers; with `pod_uid`, only that pod's.
    fn list_containers(
        &self,
        pod_uid: Option<&str>,
    ) -> impl Future<Output = Result<Vec<RuntimeContainer>, CriError>> + Send;
    fn container_status(
        &self,
        id: &str,
    ) -> impl Future<Output = Result<ContainerDetail, CriError>> + Send;
    /// `StopContainer(id, timeout)`: the runtime sends the stop signal and SIGKILL after
    /// `timeout_secs`. The call's own deadline is the request timeout plus the grace.
    fn stop_container(
        &self,
        id: &str,
        timeout_secs: i64,
    ) -> impl Future<Output = Result<(), CriError>> + Send;
    /// `StopContainer` as [`Runtime::stop_container`], telling `sent` when the call leaves
    /// reaplet for the runtime (after any wait for one of the client's own call slots): what
    /// the call's time in flight may be counted from.
    fn stop_container_sent(
        &self,
        id: &str,
        timeout_secs: i64,
        sent: tokio::sync::oneshot::Sender<()>,
    ) -> impl Future<Output = Result<(), CriError>> + Send {
        async move {
            let _ = sent.send(());
            self.stop_container(id, timeout_secs).await
        }
    }
    fn stop_pod_sandbox(&self, id: &str) -> impl Future<Output = Result<(), CriError>> + Send;
    fn remove_pod_sandbox(&self, id: &str) -> impl Future<Output = Result<(), CriError>> + Send;
    /// `ExecSync(id, cmd, timeout)`, bounded by `timeout` on both sides.
    fn exec_sync(
        &self,
        id: &str,
        cmd: Vec<String>,
        timeout: Duration,
    ) -> impl Future<Output = Result<ExecResult, CriError>> + Send;
    /// Subscribe to container events: CRI `GetContainerEvents`, else (containerd 1.6)
    /// containerd's events service. `Err(Unimplemented)` on runtimes with neither: the caller
    /// polls instead. The stream ends when the connection drops.
    fn container_events(&self) -> impl Future<Output = Result<EventSubscription, CriError>> + Send;
}

/// Connection settings for [`CriClient`].
#[derive(Debug, Clone)]
pub struct CriConfig {
    /// `unix:///run/containerd/containerd.sock` (kubelet's endpoint form) or a bare path.
    pub endpoint: String,
    /// Deadline of every call (kubelet: `--runtime-request-timeout`, 2 min).
    pub request_timeout: Duration,
}

impl Default for CriConfig {
    fn default() -> Self {
        Self {
            endpoint: "unix:///run/containerd/containerd.sock".into(),
            request_timeout: Duration::from_secs(120),
        }
    }
}

/// Turns the kubelet's endpoint form into a socket path.
pub fn socket_path(endpoint: &str) -> Result<std::path::PathBuf, CriError> {
    let bad = |reason: &str| CriError::Endpoint {
        endpoint: endpoint.to_owned(),
        reason: reason.to_owned(),
    };
    let path = if let Some(rest) = endpoint.strip_prefix("unix://") {
        rest
    } else if endpoint.contains("://") {
        return Err(bad("only unix:// endpoints are supported"));
    } else {
        endpoint
    };
    if !path.starts_with('/') {
        return Err(bad("the socket path must be absolute"));
    }
    Ok(path.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_forms() {
        assert_eq!(
            socket_path("unix:///run/containerd/containerd.sock").unwrap(),
            std::path::PathBuf::from("/run/containerd/containerd.sock")
        );
        assert_eq!(
            socket_path("/tmp/x.sock").unwrap(),
            std::path::PathBuf::from("/tmp/x.sock")
        );
        assert!(matches!(
            socket_path("tcp://1.2.3.4:5"),
            Err(CriError::Endpoint { .. })
        ));
        assert!(matches!(
            socket_path("unix://rel.sock"),
            Err(CriError::Endpoint { .. })
        ));
    }

    #[test]
    fn classify_by_code() {
        let e = CriError::from_status("StopContainer", "abc", tonic::Status::not_found("x"));
        assert!(e.is_not_found());
        let e = CriError::from_status("GetContainerEvents", "", tonic::Status::unimplemented(""));
        assert!(matches!(e, CriError::Unimplemented { .. }));
        let e = CriError::from_status("StopContainer", "abc", tonic::Status::internal("not found"));
        assert!(!e.is_not_found(), "message text must not classify");
    }
}
