//! A fake CRI runtime service on a real unix socket, for synthetic-scale benchmarks: pods live
//! in memory, every call takes a configurable latency, StopContainer ends a container with exit
//! 0 (a TERM-honouring process) after its own latency. What the agent sees is the CRI wire
//! protocol exactly as from containerd; what it costs is only the agent's own work.
//! `GetContainerEvents` answers UNIMPLEMENTED as containerd 1.6 does, unless the fake is made
//! [`FakeCri::with_events`]: then [`FakeCri::exit`] ends a container by itself and streams its
//! stop event to every subscriber (also used by `tests/container_events.rs`).

use reaplet::cri::{self, pb};
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tonic::{Request, Response, Status};

#[derive(Debug, Clone, Copy)]
pub struct Latency {
    /// Every call but the stops.
    pub call: Duration,
    /// StopContainer and StopPodSandbox.
    pub stop: Duration,
}

#[derive(Default)]
struct Pods {
    sandboxes: HashMap<String, pb::PodSandbox>,
    containers: HashMap<String, pb::ContainerStatus>,
    /// container id → sandbox id
    owner: HashMap<String, String>,
    /// pod UID → (sandbox ids, container ids): a UID-filtered list costs no scan, so the fake
    /// costs only its configured latency whatever the number of pods
    by_uid: HashMap<String, UidEntry>,
}

type UidEntry = (Vec<String>, Vec<String>);

impl Pods {
    /// What a list may return: through the UID index when the filter names a pod, else all.
    fn candidates<'a, T>(
        &'a self,
        selector: &HashMap<String, String>,
        objects: &'a HashMap<String, T>,
        ids: fn(&UidEntry) -> &Vec<String>,
    ) -> Vec<&'a T> {
        match selector.get(cri::LABEL_POD_UID) {
            Some(uid) => self
                .by_uid
                .get(uid)
                .map(|e| ids(e).iter().filter_map(|id| objects.get(id)).collect())
                .unwrap_or_default(),
            None => objects.values().collect(),
        }
    }
}

#[derive(Clone)]
pub struct FakeCri {
    pods: Arc<Mutex<Pods>>,
    latency: Latency,
    pub calls: Arc<AtomicU64>,
    /// `Some`: `GetContainerEvents` is served, to these subscribers.
    events: Option<Arc<Mutex<Vec<EventSender>>>>,
}

type EventSender = tokio::sync::mpsc::Sender<Result<pb::ContainerEventResponse, Status>>;

fn labels_match(labels: &HashMap<String, String>, sel: &HashMap<String, String>) -> bool {
    sel.iter().all(|(k, v)| labels.get(k) == Some(v))
}

impl FakeCri {
    pub fn new(latency: Latency) -> Self {
        Self {
            pods: Arc::default(),
            latency,
            calls: Arc::default(),
            events: None,
        }
    }

    /// Serves `GetContainerEvents` (as containerd 2.x does).
    #[allow(dead_code)] // tests/container_events.rs
    pub fn with_events(mut self) -> Self {
        self.events = Some(Arc::default());
        self
    }

    /// Container `c-<uid>` exits by itself with `code` now; its stop event goes to every
    /// subscriber. Returns the exit time (ns).
    #[allow(dead_code)] // tests/container_events.rs
    pub fn exit(&self, uid: &str, code: i32) -> i64 {
        let id = format!("c-{uid}");
        let now = reaplet::wall_ns();
        let status = {
            let mut p = self.pods.lock().unwrap();
            let c = p.containers.get_mut(&id).expect("the container exists");
            c.state = pb::ContainerState::ContainerExited as i32;
            c.finished_at = now;
            c.exit_code = code;
            c.reason = if code == 0 { "Completed" } else { "Error" }.into();
            c.clone()
        };
        let ev = pb::ContainerEventResponse {
            container_id: id,
            container_event_type: pb::ContainerEventType::ContainerStoppedEvent as i32,
            created_at: now,
            pod_sandbox_status: None,
            containers_statuses: vec![status],
        };
        if let Some(subs) = &self.events {
            for tx in subs.lock().unwrap().iter() {
                let _ = tx.try_send(Ok(ev.clone()));
            }
        }
        now
    }

    /// A running pod with one container, labelled and annotated as the kubelet does.
    pub fn add_pod(&self, uid: &str, name: &str, namespace: &str, grace: i64) {
        let sb_id = format!("sb-{uid}");
        let c_id = format!("c-{uid}");
        let labels: HashMap<String, String> = [
            (cri::LABEL_POD_NAME, name),
            (cri::LABEL_POD_NAMESPACE, namespace),
            (cri::LABEL_POD_UID, uid),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let created = reaplet::wall_ns();
        let sandbox = pb::PodSandbox {
            id: sb_id.clone(),
            metadata: Some(pb::PodSandboxMetadata {
                name: name.into(),
                uid: uid.into(),
                namespace: namespace.into(),
                attempt: 0,
            }),
            state: pb::PodSandboxState::SandboxReady as i32,
            created_at: created,
            labels: labels.clone(),
            ..Default::default()
        };
        let mut clabels = labels;
        clabels.insert(cri::LABEL_CONTAINER_NAME.into(), "app".into());
        let container = pb::ContainerStatus {
            id: c_id.clone(),
            metadata: Some(pb::ContainerMetadata {
                name: "app".into(),
                attempt: 0,
            }),
            state: pb::ContainerState::ContainerRunning as i32,
            created_at: created,
            started_at: created,
            labels: clabels,
            annotations: [(cri::ANNOTATION_GRACE.to_owned(), grace.to_string())].into(),
            ..Default::default()
        };
        let mut p = self.pods.lock().unwrap();
        p.sandboxes.insert(sb_id.clone(), sandbox);
        p.containers.insert(c_id.clone(), container);
        p.owner.insert(c_id.clone(), sb_id.clone());
        p.by_uid.insert(uid.to_owned(), (vec![sb_id], vec![c_id]));
    }

    /// Serves on `socket` until the process ends.
    pub async fn serve(self, socket: &Path) -> std::io::Result<()> {
        let _ = std::fs::remove_file(socket);
        let uds = tokio::net::UnixListener::bind(socket)?;
        let incoming = tokio_stream::wrappers::UnixListenerStream::new(uds);
        tokio::spawn(async move {
            let r = tonic::transport::Server::builder()
                .max_concurrent_streams(Some(u32::MAX))
                .add_service(pb::runtime_service_server::RuntimeServiceServer::new(self))
                .serve_with_incoming(incoming)
                .await;
            if let Err(e) = r {
                eprintln!("fake CRI: {e}");
            }
        });
        Ok(())
    }

    async fn delay(&self, d: Duration) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        if !d.is_zero() {
            tokio::time::sleep(d).await;
        }
    }
}

type EventStream = std::pin::Pin<
    Box<dyn tokio_stream::Stream<Item = Result<pb::ContainerEventResponse, Status>> + Send>,
>;

/// The service impl: the listed RPCs answer UNIMPLEMENTED (the agent never calls them), the rest
/// follow. One macro around the whole impl, so `async_trait` sees every method.
macro_rules! runtime_service {
    (unimplemented { $($m:ident: $req:ident => $resp:ident;)* } $($rest:tt)*) => {
        #[tonic::async_trait]
        impl pb::runtime_service_server::RuntimeService for FakeCri {
            $(
                async fn $m(&self, _: Request<pb::$req>) -> Result<Response<pb::$resp>, Status> {
                    Err(Status::unimplemented(stringify!($m)))
                }
            )*
            $($rest)*
        }
    };
}

runtime_service! {
    unimplemented {
        update_container_resources: UpdateContainerResourcesRequest => UpdateContainerResourcesResponse;
        reopen_container_log: ReopenContainerLogRequest => ReopenContainerLogResponse;
        exec: ExecRequest => ExecResponse;
        attach: AttachRequest => AttachResponse;
        port_forward: PortForwardRequest => PortForwardResponse;
        container_stats: ContainerStatsRequest => ContainerStatsResponse;
        list_container_stats: ListContainerStatsRequest => ListContainerStatsResponse;
        pod_sandbox_stats: PodSandboxStatsRequest => PodSandboxStatsResponse;
        list_pod_sandbox_stats: ListPodSandboxStatsRequest => ListPodSandboxStatsResponse;
        update_runtime_config: UpdateRuntimeConfigRequest => UpdateRuntimeConfigResponse;
        checkpoint_container: CheckpointContainerRequest => CheckpointContainerResponse;
        list_metric_descriptors: ListMetricDescriptorsRequest => ListMetricDescriptorsResponse;
        list_pod_sandbox_metrics: ListPodSandboxMetricsRequest => ListPodSandboxMetricsResponse;
        runtime_config: RuntimeConfigRequest => RuntimeConfigResponse;
        run_pod_sandbox: RunPodSandboxRequest => RunPodSandboxResponse;
        pod_sandbox_status: PodSandboxStatusRequest => PodSandboxStatusResponse;
        create_container: CreateContainerRequest => CreateContainerResponse;
        start_container: StartContainerRequest => StartContainerResponse;
    }

    type GetContainerEventsStream = EventStream;

    async fn get_container_events(
        &self,
        _: Request<pb::GetEventsRequest>,
    ) -> Result<Response<EventStream>, Status> {
        let Some(subs) = &self.events else {
            // as containerd 1.6: the agent asks containerd's events service, then polls
            return Err(Status::unimplemented("get_container_events"));
        };
        let (tx, rx) = tokio::sync::mpsc::channel(1024);
        subs.lock().unwrap().push(tx);
        let stream = futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|ev| (ev, rx))
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn version(
        &self,
        _: Request<pb::VersionRequest>,
    ) -> Result<Response<pb::VersionResponse>, Status> {
        self.delay(self.latency.call).await;
        Ok(Response::new(pb::VersionResponse {
            version: "0.1.0".into(),
            runtime_name: "fake-cri".into(),
            runtime_version: "bench".into(),
            runtime_api_version: "v1".into(),
        }))
    }

    async fn status(
        &self,
        _: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusResponse>, Status> {
        self.delay(self.latency.call).await;
        let cond = |t: &str| pb::RuntimeCondition {
            r#type: t.into(),
            status: true,
            ..Default::default()
        };
        Ok(Response::new(pb::StatusResponse {
            status: Some(pb::RuntimeStatus {
                conditions: vec![cond("RuntimeReady"), cond("NetworkReady")],
            }),
            ..Default::default()
        }))
    }

    async fn list_pod_sandbox(
        &self,
        r: Request<pb::ListPodSandboxRequest>,
    ) -> Result<Response<pb::ListPodSandboxResponse>, Status> {
        self.delay(self.latency.call).await;
        let f = r.into_inner().filter.unwrap_or_default();
        let p = self.pods.lock().unwrap();
        let items = p
            .candidates(&f.label_selector, &p.sandboxes, |e| &e.0)
            .into_iter()
            .filter(|s| f.id.is_empty() || s.id == f.id)
            .filter(|s| f.state.is_none_or(|st| st.state == s.state))
            .filter(|s| labels_match(&s.labels, &f.label_selector))
            .map(|s| (*s).clone())
            .collect();
        Ok(Response::new(pb::ListPodSandboxResponse { items }))
    }

    async fn list_containers(
        &self,
        r: Request<pb::ListContainersRequest>,
    ) -> Result<Response<pb::ListContainersResponse>, Status> {
        self.delay(self.latency.call).await;
        let f = r.into_inner().filter.unwrap_or_default();
        let p = self.pods.lock().unwrap();
        let containers = p
            .candidates(&f.label_selector, &p.containers, |e| &e.1)
            .into_iter()
            .filter(|c| f.id.is_empty() || c.id == f.id)
            .filter(|c| f.state.is_none_or(|st| st.state == c.state))
            .filter(|c| {
                f.pod_sandbox_id.is_empty() || p.owner.get(&c.id) == Some(&f.pod_sandbox_id)
            })
            .filter(|c| labels_match(&c.labels, &f.label_selector))
            .map(|c| pb::Container {
                id: c.id.clone(),
                pod_sandbox_id: p.owner.get(&c.id).cloned().unwrap_or_default(),
                metadata: c.metadata.clone(),
                state: c.state,
                created_at: c.created_at,
                labels: c.labels.clone(),
                annotations: c.annotations.clone(),
                ..Default::default()
            })
            .collect();
        Ok(Response::new(pb::ListContainersResponse { containers }))
    }

    async fn container_status(
        &self,
        r: Request<pb::ContainerStatusRequest>,
    ) -> Result<Response<pb::ContainerStatusResponse>, Status> {
        self.delay(self.latency.call).await;
        let id = r.into_inner().container_id;
        let p = self.pods.lock().unwrap();
        let status = p
            .containers
            .get(&id)
            .cloned()
            .ok_or_else(|| Status::not_found(format!("container {id}")))?;
        Ok(Response::new(pb::ContainerStatusResponse {
            status: Some(status),
            ..Default::default()
        }))
    }

    async fn stop_container(
        &self,
        r: Request<pb::StopContainerRequest>,
    ) -> Result<Response<pb::StopContainerResponse>, Status> {
        let id = r.into_inner().container_id;
        if !self.pods.lock().unwrap().containers.contains_key(&id) {
            return Err(Status::not_found(format!("container {id}")));
        }
        self.delay(self.latency.stop).await;
        let mut p = self.pods.lock().unwrap();
        if let Some(c) = p.containers.get_mut(&id)
            && c.state != pb::ContainerState::ContainerExited as i32
        {
            c.state = pb::ContainerState::ContainerExited as i32;
            c.finished_at = reaplet::wall_ns();
            c.exit_code = 0;
            c.reason = "Completed".into();
        }
        Ok(Response::new(pb::StopContainerResponse {}))
    }

    async fn remove_container(
        &self,
        r: Request<pb::RemoveContainerRequest>,
    ) -> Result<Response<pb::RemoveContainerResponse>, Status> {
        self.delay(self.latency.call).await;
        let id = r.into_inner().container_id;
        let mut p = self.pods.lock().unwrap();
        p.containers.remove(&id);
        p.owner.remove(&id);
        Ok(Response::new(pb::RemoveContainerResponse {}))
    }

    async fn stop_pod_sandbox(
        &self,
        r: Request<pb::StopPodSandboxRequest>,
    ) -> Result<Response<pb::StopPodSandboxResponse>, Status> {
        let id = r.into_inner().pod_sandbox_id;
        if !self.pods.lock().unwrap().sandboxes.contains_key(&id) {
            return Err(Status::not_found(format!("sandbox {id}")));
        }
        self.delay(self.latency.stop).await;
        let mut p = self.pods.lock().unwrap();
        let now = reaplet::wall_ns();
        let owned: Vec<String> = p
            .owner
            .iter()
            .filter(|(_, sb)| **sb == id)
            .map(|(c, _)| c.clone())
            .collect();
        for c in owned {
            if let Some(c) = p.containers.get_mut(&c)
                && c.state != pb::ContainerState::ContainerExited as i32
            {
                c.state = pb::ContainerState::ContainerExited as i32;
                c.finished_at = now;
                c.exit_code = 137;
            }
        }
        if let Some(s) = p.sandboxes.get_mut(&id) {
            s.state = pb::PodSandboxState::SandboxNotready as i32;
        }
        Ok(Response::new(pb::StopPodSandboxResponse {}))
    }

    async fn remove_pod_sandbox(
        &self,
        r: Request<pb::RemovePodSandboxRequest>,
    ) -> Result<Response<pb::RemovePodSandboxResponse>, Status> {
        self.delay(self.latency.call).await;
        let id = r.into_inner().pod_sandbox_id;
        let mut p = self.pods.lock().unwrap();
        p.sandboxes.remove(&id);
        let owned: Vec<String> = p
            .owner
            .iter()
            .filter(|(_, sb)| **sb == id)
            .map(|(c, _)| c.clone())
            .collect();
        for c in owned {
            p.containers.remove(&c);
            p.owner.remove(&c);
        }
        Ok(Response::new(pb::RemovePodSandboxResponse {}))
    }

    async fn exec_sync(
        &self,
        _: Request<pb::ExecSyncRequest>,
    ) -> Result<Response<pb::ExecSyncResponse>, Status> {
        self.delay(self.latency.call).await;
        Ok(Response::new(pb::ExecSyncResponse::default()))
    }
}
