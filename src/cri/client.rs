//! [`Runtime`] over a real CRI socket (tonic, HTTP/2 over a unix socket).
//!
//! Every request carries the `User-Agent` [`USER_AGENT`] (`reaplet/<version>`; tonic adds its
//! own token after it), so the runtime's logs and traces can tell reaplet's calls apart.
//!
//! At most [`MAX_INFLIGHT`] calls are in flight at once (the rest wait for a slot, inside their
//! deadline): measured with 5,000 pods terminating together, an unbounded number of streams
//! on the one connection ended in transport errors and retries, 2,048 was slower than 1,024
//! (BENCHMARKS.md).

use super::pb::runtime_service_client::RuntimeServiceClient;
use super::*;
use hyper_util::rt::TokioIo;
use std::path::PathBuf;
use tonic::transport::{Channel, Endpoint, Uri};
use tracing::Instrument;

/// A CRI client over a unix socket. Cheap to clone; connects lazily and reconnects on demand,
/// so a runtime restart costs failed calls (retried by the callers), never a dead client.
#[derive(Clone, Debug)]
pub struct CriClient {
    client: RuntimeServiceClient<Channel>,
    /// The connection under `client`, shared by containerd's events client (same socket).
    channel: Channel,
    request_timeout: Duration,
    socket: PathBuf,
    metrics: Option<std::sync::Arc<crate::metrics::Metrics>>,
    /// Calls in flight at once, shared by every clone: thousands of pods terminating together
    /// queue here instead of opening thousands of HTTP/2 streams on one connection.
    inflight: std::sync::Arc<tokio::sync::Semaphore>,
}

/// The `User-Agent` of every CRI request (before tonic's own `tonic/<version>`).
pub const USER_AGENT: &str = concat!("reaplet/", env!("CARGO_PKG_VERSION"));

/// At most this many CRI calls are in flight on the connection.
pub const MAX_INFLIGHT: usize = 1024;

impl CriClient {
    /// Builds the client; no connection is made until the first call.
    pub fn new(config: &CriConfig) -> Result<Self, CriError> {
        let socket = socket_path(&config.endpoint)?;
        let channel = unix_channel(&socket, &config.endpoint)?;
        Ok(Self {
            client: RuntimeServiceClient::new(channel.clone())
                .max_decoding_message_size(64 * 1024 * 1024),
            channel,
            request_timeout: config.request_timeout,
            socket,
            metrics: None,
            inflight: std::sync::Arc::new(tokio::sync::Semaphore::new(MAX_INFLIGHT)),
        })
    }

    /// Records every call in `metrics` (`runtime_operations*`).
    pub fn with_metrics(mut self, metrics: std::sync::Arc<crate::metrics::Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// The socket this client dials.
    pub fn socket(&self) -> &std::path::Path {
        &self.socket
    }

    /// Runs one call with a deadline on both sides (grpc-timeout header and a local timer).
    async fn call<T, F, Fut>(
        &self,
        op: &'static str,
        id: &str,
        timeout: Duration,
        f: F,
    ) -> Result<T, CriError>
    where
        F: FnOnce(RuntimeServiceClient<Channel>, Duration) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        self.call_telling(op, id, timeout, None, f).await
    }

    /// [`Self::call`], telling `sent` (if any) when the call has its slot and leaves for the
    /// runtime.
    async fn call_telling<T, F, Fut>(
        &self,
        op: &'static str,
        id: &str,
        timeout: Duration,
        sent: Option<tokio::sync::oneshot::Sender<()>>,
        f: F,
    ) -> Result<T, CriError>
    where
        F: FnOnce(RuntimeServiceClient<Channel>, Duration) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        // named as the kubelet's gRPC client spans are, in a trace
        let span = tracing::debug_span!(
            "cri",
            op,
            id,
            otel.name = %format_args!("runtime.v1.RuntimeService/{op}")
        );
        let started = tokio::time::Instant::now();
        let r = async move {
            // the deadline covers the wait for a slot too; the semaphore is never closed
            let call = async {
                let _permit = self.inflight.acquire().await;
                if let Some(sent) = sent {
                    let _ = sent.send(());
                }
                let left = timeout.saturating_sub(started.elapsed());
                f(self.client.clone(), left).await
            };
            match tokio::time::timeout(timeout, call).await {
                Ok(Ok(resp)) => Ok(resp.into_inner()),
                Ok(Err(status)) if status.code() == tonic::Code::DeadlineExceeded => {
                    Err(CriError::DeadlineExceeded {
                        op,
                        id: id.to_owned(),
                        timeout,
                    })
                }
                Ok(Err(status)) => Err(CriError::from_status(op, id, status)),
                Err(_) => Err(CriError::DeadlineExceeded {
                    op,
                    id: id.to_owned(),
                    timeout,
                }),
            }
        }
        .instrument(span)
        .await;
        if let Some(m) = &self.metrics {
            // NotFound on a stop or status is an answer, not a runtime failure
            let ok = r.as_ref().map_or_else(CriError::is_not_found, |_| true);
            m.runtime_call(op, started.elapsed(), ok);
        }
        r
    }

    /// `StopContainer`, its deadline the request timeout plus the stop's own.
    async fn stop(
        &self,
        id: &str,
        timeout_secs: i64,
        sent: Option<tokio::sync::oneshot::Sender<()>>,
    ) -> Result<(), CriError> {
        let cid = id.to_owned();
        let deadline = self
            .request_timeout
            .saturating_add(Duration::from_secs(timeout_secs.max(0) as u64));
        self.call_telling("StopContainer", id, deadline, sent, |mut c, t| async move {
            c.stop_container(req(
                pb::StopContainerRequest {
                    container_id: cid,
                    timeout: timeout_secs,
                },
                t,
            ))
            .await
        })
        .await
        .map(|_| ())
    }

    /// The runtime's cgroup driver (`RuntimeConfig`, CRI ≥ v1.28). `Ok(None)` when the runtime
    /// does not implement the call (containerd 1.6).
    pub async fn cgroup_driver(&self) -> Result<Option<crate::cgroups::CgroupDriver>, CriError> {
        let r = self
            .call("RuntimeConfig", "", self.request_timeout, |mut c, t| async move {
                c.runtime_config(req(pb::RuntimeConfigRequest {}, t)).await
            })
            .await;
        match r {
            Ok(resp) => Ok(resp.linux.map(|l| {
                if l.cgroup_driver == pb::CgroupDriver::Systemd as i32 {
                    crate::cgroups::CgroupDriver::Systemd
                } else {
                    crate::cgroups::CgroupDriver::Cgroupfs
                }
            })),
            Err(CriError::Unimplemented { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Raw access to the generated client, for the test bed (creating pods).
    pub fn raw(&self) -> RuntimeServiceClient<Channel> {
        self.client.clone()
    }
}

/// A lazily connecting tonic channel over the unix socket `socket` (`endpoint` is only for
/// the error): every gRPC client of the runtime socket (CRI, containerd's events) uses it.
pub(crate) fn unix_channel(socket: &std::path::Path, endpoint: &str) -> Result<Channel, CriError> {
    let path = socket.to_owned();
    // The URI is required by tonic but unused: the connector below dials the socket.
    let channel = Endpoint::from_static("http://cri.invalid")
        .user_agent(USER_AGENT)
        .map_err(|e| CriError::Endpoint {
            endpoint: endpoint.to_owned(),
            reason: format!("user agent {USER_AGENT:?}: {e}"),
        })?
        .connect_timeout(Duration::from_secs(5))
        .connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(TokioIo::new(stream))
            }
        }));
    Ok(channel)
}

fn req<T>(msg: T, timeout: Duration) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.set_timeout(timeout);
    r
}

fn label(labels: &HashMap<String, String>, key: &str) -> String {
    labels.get(key).cloned().unwrap_or_default()
}

impl Runtime for CriClient {
    async fn version(&self) -> Result<RuntimeVersion, CriError> {
        let r = self
            .call("Version", "", self.request_timeout, |mut c, t| async move {
                c.version(req(
                    pb::VersionRequest {
                        version: "v1".into(),
                    },
                    t,
                ))
                .await
            })
            .await?;
        Ok(RuntimeVersion {
            runtime_name: r.runtime_name,
            runtime_version: r.runtime_version,
            runtime_api_version: r.runtime_api_version,
        })
    }

    async fn list_sandboxes(&self, pod_uid: Option<&str>) -> Result<Vec<RuntimeSandbox>, CriError> {
        let filter = pod_uid.map(|uid| pb::PodSandboxFilter {
            label_selector: [(LABEL_POD_UID.to_owned(), uid.to_owned())].into(),
            ..Default::default()
        });
        let r = self
            .call(
                "ListPodSandbox",
                pod_uid.unwrap_or(""),
                self.request_timeout,
                |mut c, t| async move {
                    c.list_pod_sandbox(req(pb::ListPodSandboxRequest { filter }, t))
                        .await
                },
            )
            .await?;
        Ok(r.items
            .into_iter()
            .map(|s| {
                let meta = s.metadata.unwrap_or_default();
                let pod_uid = if meta.uid.is_empty() {
                    label(&s.labels, LABEL_POD_UID)
                } else {
                    meta.uid
                };
                RuntimeSandbox {
                    id: s.id,
                    pod_uid,
                    pod_name: meta.name,
                    pod_namespace: meta.namespace,
                    ready: s.state == pb::PodSandboxState::SandboxReady as i32,
                    created_at: s.created_at,
                    labels: s.labels,
                    annotations: s.annotations,
                }
            })
            .collect())
    }

    async fn list_containers(
        &self,
        pod_uid: Option<&str>,
    ) -> Result<Vec<RuntimeContainer>, CriError> {
        let filter = pod_uid.map(|uid| pb::ContainerFilter {
            label_selector: [(LABEL_POD_UID.to_owned(), uid.to_owned())].into(),
            ..Default::default()
        });
        let r = self
            .call(
                "ListContainers",
                pod_uid.unwrap_or(""),
                self.request_timeout,
                |mut c, t| async move {
                    c.list_containers(req(pb::ListContainersRequest { filter }, t))
                        .await
                },
            )
            .await?;
        Ok(r.containers
            .into_iter()
            .map(|c| {
                let meta = c.metadata.unwrap_or_default();
                let name = if meta.name.is_empty() {
                    label(&c.labels, LABEL_CONTAINER_NAME)
                } else {
                    meta.name
                };
                RuntimeContainer {
                    id: c.id,
                    sandbox_id: c.pod_sandbox_id,
                    name,
                    attempt: meta.attempt,
                    pod_uid: label(&c.labels, LABEL_POD_UID),
                    state: ContainerRunState::from_pb(c.state),
                    created_at: c.created_at,
                    labels: c.labels,
                    annotations: c.annotations,
                }
            })
            .collect())
    }

    async fn container_status(&self, id: &str) -> Result<ContainerDetail, CriError> {
        let cid = id.to_owned();
        let r = self
            .call(
                "ContainerStatus",
                id,
                self.request_timeout,
                |mut c, t| async move {
                    c.container_status(req(
                        pb::ContainerStatusRequest {
                            container_id: cid,
                            verbose: false,
                        },
                        t,
                    ))
                    .await
                },
            )
            .await?;
        let s = r.status.ok_or_else(|| CriError::Rpc {
            op: "ContainerStatus",
            id: id.to_owned(),
            code: tonic::Code::Internal,
            message: "response without status".into(),
        })?;
        Ok(ContainerDetail {
            id: s.id,
            state: ContainerRunState::from_pb(s.state),
            exit_code: s.exit_code,
            started_at: s.started_at,
            finished_at: s.finished_at,
            reason: s.reason,
        })
    }

    async fn stop_container(&self, id: &str, timeout_secs: i64) -> Result<(), CriError> {
        self.stop(id, timeout_secs, None).await
    }

    async fn stop_container_sent(
        &self,
        id: &str,
        timeout_secs: i64,
        sent: tokio::sync::oneshot::Sender<()>,
    ) -> Result<(), CriError> {
        self.stop(id, timeout_secs, Some(sent)).await
    }

    async fn stop_pod_sandbox(&self, id: &str) -> Result<(), CriError> {
        let sid = id.to_owned();
        self.call(
            "StopPodSandbox",
            id,
            self.request_timeout,
            |mut c, t| async move {
                c.stop_pod_sandbox(req(
                    pb::StopPodSandboxRequest {
                        pod_sandbox_id: sid,
                    },
                    t,
                ))
                .await
            },
        )
        .await
        .map(|_| ())
    }

    async fn remove_pod_sandbox(&self, id: &str) -> Result<(), CriError> {
        let sid = id.to_owned();
        self.call(
            "RemovePodSandbox",
            id,
            self.request_timeout,
            |mut c, t| async move {
                c.remove_pod_sandbox(req(
                    pb::RemovePodSandboxRequest {
                        pod_sandbox_id: sid,
                    },
                    t,
                ))
                .await
            },
        )
        .await
        .map(|_| ())
    }

    async fn exec_sync(
        &self,
        id: &str,
        cmd: Vec<String>,
        timeout: Duration,
    ) -> Result<ExecResult, CriError> {
        let cid = id.to_owned();
        // The runtime's own timeout is whole seconds (0 = none): round up, never down to 0.
        let secs = timeout.as_secs().max(1) + u64::from(timeout.subsec_nanos() > 0);
        let r = self
            .call("ExecSync", id, timeout, |mut c, t| async move {
                c.exec_sync(req(
                    pb::ExecSyncRequest {
                        container_id: cid,
                        cmd,
                        timeout: secs as i64,
                    },
                    t,
                ))
                .await
            })
            .await?;
        Ok(ExecResult {
            exit_code: r.exit_code,
        })
    }

    async fn container_events(&self) -> Result<EventSubscription, CriError> {
        let span = tracing::debug_span!("cri", op = "container_events");
        async move {
            match self.cri_container_events().await {
                Ok(events) => Ok(EventSubscription {
                    source: EventSource::Cri,
                    events,
                }),
                Err(CriError::Unimplemented { .. }) => {
                    let settle = SUBSCRIBE_SETTLE.min(self.request_timeout);
                    let events = containerd_events::subscribe(self.channel.clone(), settle)
                        .await
                        .map_err(|e| events_error(&e))?;
                    Ok(EventSubscription {
                        source: EventSource::ContainerdEvents,
                        events,
                    })
                }
                Err(e) => Err(e),
            }
        }
        .instrument(span)
        .await
    }
}

/// How long a containerd event subscription may take to be refused (see
/// [`containerd_events`]'s docs: an accepted one is not answered until the first event).
const SUBSCRIBE_SETTLE: Duration = Duration::from_millis(200);

/// The op of containerd's events subscription in [`CriError`]s.
const OP_SUBSCRIBE: &str = "containerd Events/Subscribe";

fn events_error(e: &containerd_events::EventsError) -> CriError {
    let code = e.code().unwrap_or(tonic::Code::Internal);
    CriError::from_status(OP_SUBSCRIBE, "", tonic::Status::new(code, e.to_string()))
}

impl CriClient {
    /// CRI `GetContainerEvents`: in use once answered or not refused within the settle time
    /// (containerd 1.7 and 2.x send the stream's headers only with its first event).
    async fn cri_container_events(
        &self,
    ) -> Result<tokio::sync::mpsc::Receiver<ContainerEvent>, CriError> {
        let mut client = self.client.clone();
        let call = async move { client.get_container_events(pb::GetEventsRequest {}).await };
        let settle = SUBSCRIBE_SETTLE.min(self.request_timeout);
        super::stream::open(call, settle, |ev| Some(cri_event(ev)))
            .await
            .map_err(|s| CriError::from_status("GetContainerEvents", "", s))
    }
}

/// A CRI container event; the exit code and time from the container's own status in it.
fn cri_event(ev: pb::ContainerEventResponse) -> ContainerEvent {
    let kind = match pb::ContainerEventType::try_from(ev.container_event_type) {
        Ok(pb::ContainerEventType::ContainerCreatedEvent) => ContainerEventKind::Created,
        Ok(pb::ContainerEventType::ContainerStartedEvent) => ContainerEventKind::Started,
        Ok(pb::ContainerEventType::ContainerStoppedEvent) => ContainerEventKind::Exited,
        Ok(pb::ContainerEventType::ContainerDeletedEvent) => ContainerEventKind::Deleted,
        Err(_) => ContainerEventKind::Other,
    };
    let exited = ev
        .containers_statuses
        .iter()
        .find(|s| s.id == ev.container_id && s.state == pb::ContainerState::ContainerExited as i32);
    ContainerEvent {
        kind,
        exit_code: exited.map(|s| s.exit_code),
        exited_at: exited.map(|s| s.finished_at),
        container_id: ev.container_id,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::Empty;
    use hyper::body::Bytes;
    use std::sync::{Arc, Mutex};

    /// Every CRI request names reaplet and its version: a bare HTTP/2 server on a unix socket
    /// records the request's `User-Agent` and answers UNIMPLEMENTED.
    #[tokio::test]
    async fn requests_carry_reaplets_user_agent() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("cri.sock");
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        let seen: Arc<Mutex<Vec<String>>> = Arc::default();
        let record = seen.clone();
        let server = tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            let svc =
                hyper::service::service_fn(move |r: hyper::Request<hyper::body::Incoming>| {
                    let ua = r.headers().get(http::header::USER_AGENT);
                    record
                        .lock()
                        .unwrap()
                        .push(ua.and_then(|v| v.to_str().ok()).unwrap_or("").to_owned());
                    async {
                        hyper::Response::builder()
                            .header("content-type", "application/grpc")
                            .header("grpc-status", "12")
                            .body(Empty::<Bytes>::new())
                    }
                });
            let _ = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
        let client = CriClient::new(&CriConfig {
            endpoint: format!("unix://{}", socket.display()),
            request_timeout: Duration::from_secs(5),
        })
        .unwrap();
        let r = client.version().await;
        assert!(matches!(r, Err(CriError::Unimplemented { .. })), "{r:?}");
        let _ = client.list_sandboxes(None).await;
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 2, "{seen:?}");
        for ua in &seen {
            assert!(
                ua.starts_with(&format!("reaplet/{} ", env!("CARGO_PKG_VERSION"))),
                "User-Agent {ua:?}"
            );
        }
        server.abort();
    }

    /// A bare HTTP/2 server on a unix socket: records each request's path; answers
    /// UNIMPLEMENTED, except that a request whose path ends with `hold` is held open without
    /// headers (as containerd does with a stream until its first event).
    fn fake_runtime(
        socket: &std::path::Path,
        hold: Option<&'static str>,
    ) -> (Arc<Mutex<Vec<String>>>, tokio::task::JoinHandle<()>) {
        let listener = tokio::net::UnixListener::bind(socket).unwrap();
        let seen: Arc<Mutex<Vec<String>>> = Arc::default();
        let record = seen.clone();
        let server = tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                let record = record.clone();
                let svc =
                    hyper::service::service_fn(move |r: hyper::Request<hyper::body::Incoming>| {
                        let path = r.uri().path().to_owned();
                        record.lock().unwrap().push(path.clone());
                        async move {
                            if hold.is_some_and(|h| path.ends_with(h)) {
                                std::future::pending::<()>().await;
                            }
                            hyper::Response::builder()
                                .header("content-type", "application/grpc")
                                .header("grpc-status", "12")
                                .body(Empty::<Bytes>::new())
                        }
                    });
                tokio::spawn(
                    hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc),
                );
            }
        });
        (seen, server)
    }

    fn client_for(socket: &std::path::Path) -> CriClient {
        CriClient::new(&CriConfig {
            endpoint: format!("unix://{}", socket.display()),
            request_timeout: Duration::from_secs(5),
        })
        .unwrap()
    }

    /// No `GetContainerEvents`: containerd's events service is asked next, on the same socket;
    /// a runtime with neither is `Unimplemented` (the caller polls).
    #[tokio::test]
    async fn events_fall_back_to_containerd_then_to_polling() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("cri.sock");
        let (seen, server) = fake_runtime(&socket, None);
        let r = client_for(&socket).container_events().await;
        assert!(
            matches!(r, Err(CriError::Unimplemented { op: OP_SUBSCRIBE })),
            "{r:?}"
        );
        assert_eq!(
            *seen.lock().unwrap(),
            [
                "/runtime.v1.RuntimeService/GetContainerEvents",
                "/containerd.services.events.v1.Events/Subscribe",
            ]
        );
        server.abort();
    }

    /// containerd answers `Subscribe` with its first event: a subscription not refused within
    /// the settle time is in use, and its receiver stays open.
    #[tokio::test]
    async fn an_unanswered_subscription_is_in_use() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("cri.sock");
        let (_seen, server) = fake_runtime(&socket, Some("Events/Subscribe"));
        let started = tokio::time::Instant::now();
        let mut sub = client_for(&socket).container_events().await.unwrap();
        assert_eq!(sub.source, EventSource::ContainerdEvents);
        assert!(started.elapsed() >= SUBSCRIBE_SETTLE);
        assert!(
            tokio::time::timeout(Duration::from_millis(100), sub.events.recv())
                .await
                .is_err(),
            "the receiver stays open"
        );
        server.abort();
    }

    /// containerd 1.7 and 2.x answer `GetContainerEvents` only with its first event too: a
    /// CRI subscription not refused within the settle time is in use (before, the call waited
    /// for the headers until the request timeout, failed, and never fell back).
    #[tokio::test]
    async fn an_unanswered_cri_subscription_is_in_use() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("cri.sock");
        let (seen, server) = fake_runtime(&socket, Some("GetContainerEvents"));
        let started = tokio::time::Instant::now();
        let sub = tokio::time::timeout(
            Duration::from_secs(3),
            client_for(&socket).container_events(),
        )
        .await
        .expect("answered within the settle time, not the 5 s request timeout");
        let mut sub = sub.unwrap();
        assert_eq!(sub.source, EventSource::Cri);
        assert!(started.elapsed() >= SUBSCRIBE_SETTLE);
        assert_eq!(
            *seen.lock().unwrap(),
            ["/runtime.v1.RuntimeService/GetContainerEvents"]
        );
        assert!(
            tokio::time::timeout(Duration::from_millis(100), sub.events.recv())
                .await
                .is_err(),
            "the receiver stays open"
        );
        server.abort();
    }
}
