//! An in-memory [`Runtime`] for unit tests under tokio's paused clock: containers that exit on
//! SIGTERM after a delay, ignore it (SIGKILL at the timeout), or hang the stop call forever;
//! and a stalled runtime ([`FakeRuntime::stall_lists`]: the list calls wait, as they do on a
//! SIGSTOPped containerd). Every call is recorded with the (virtual) time it was made.

use super::*;
use std::sync::Mutex;
use tokio::time::Instant;

/// How a fake container reacts to `StopContainer`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    /// Exits with 0 this long after SIGTERM (capped by the timeout, then 137).
    ExitOnTerm(Duration),
    /// Ignores SIGTERM: exits 137 at the timeout.
    IgnoreTerm,
    /// The stop call never returns.
    Hang,
    /// The stop call "succeeds" but the container keeps running (a CRI violation).
    Liar,
    /// The first stop call panics (a bug in the stop path); later ones act as `IgnoreTerm`.
    PanicOnce,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Call {
    StopContainer {
        id: String,
        timeout: i64,
        at: Instant,
    },
    StopPodSandbox {
        id: String,
        at: Instant,
    },
    ExecSync {
        id: String,
        at: Instant,
    },
}

#[derive(Default)]
struct State {
    sandboxes: Vec<RuntimeSandbox>,
    containers: Vec<(RuntimeContainer, Behaviour, i32)>,
    calls: Vec<Call>,
    /// The containers whose status was read (`ContainerStatus`), in order.
    status_reads: Vec<String>,
    /// When every sandbox was listed (a relist), in virtual time.
    relists: Vec<Instant>,
    /// Container event subscriptions are served (else `GetContainerEvents` is unimplemented);
    /// the sender of the newest one is kept, so its stream stays open.
    events: bool,
    events_tx: Option<tokio::sync::mpsc::Sender<super::ContainerEvent>>,
    /// The list calls answer `Unavailable` until then (a restarting containerd).
    lists_fail_until: Option<Instant>,
    stops_fail_until: Option<Instant>,
    /// ExecSync is refused (`Unavailable`, never reaching the runtime) until then.
    execs_fail_until: Option<Instant>,
    /// StopContainer waits in the caller's own queue (for a call slot, never reaching the
    /// runtime) until then.
    stops_queued_until: Option<Instant>,
}

#[derive(Default)]
pub struct FakeRuntime {
    state: Mutex<State>,
    /// The list calls wait while this is set.
    lists_stalled: std::sync::atomic::AtomicBool,
    /// The wall clock and tokio's clock when first asked: runtime timestamps follow tokio's
    /// (paused) clock from there, as a real runtime's follow time.
    epoch: std::sync::OnceLock<(i64, Instant)>,
}

impl FakeRuntime {
    /// Now, as a runtime timestamp (ns since the epoch) on tokio's clock.
    fn now_ns(&self) -> i64 {
        let (wall, at) = *self
            .epoch
            .get_or_init(|| (crate::wall_ns(), Instant::now()));
        wall.saturating_add(at.elapsed().as_nanos() as i64)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds a ready sandbox with running containers `(name, behaviour)` for pod `uid`.
    pub fn add_pod(&self, uid: &str, containers: &[(&str, Behaviour)]) {
        // the runtime's clock starts with its first pod
        let _ = self.now_ns();
        let mut s = self.lock();
        let sid = format!("sb-{uid}");
        s.sandboxes.push(RuntimeSandbox {
            id: sid.clone(),
            pod_uid: uid.into(),
            pod_name: format!("name-{uid}"),
            pod_namespace: "ns".into(),
            ready: true,
            created_at: 1,
            labels: HashMap::new(),
            annotations: HashMap::new(),
        });
        for (name, b) in containers {
            s.containers.push((
                RuntimeContainer {
                    id: format!("{uid}-{name}"),
                    sandbox_id: sid.clone(),
                    name: (*name).into(),
                    attempt: 0,
                    pod_uid: uid.into(),
                    state: ContainerRunState::Running,
                    created_at: 1,
                    labels: HashMap::new(),
                    annotations: HashMap::new(),
                },
                *b,
                0,
            ));
        }
    }

    /// Pod `uid`'s sandboxes and containers were created at `at_ns` (wall-clock ns).
    pub fn set_created(&self, uid: &str, at_ns: i64) {
        let mut s = self.lock();
        for sb in s.sandboxes.iter_mut().filter(|sb| sb.pod_uid == uid) {
            sb.created_at = at_ns;
        }
        for (c, _, _) in s.containers.iter_mut().filter(|(c, _, _)| c.pod_uid == uid) {
            c.created_at = at_ns;
        }
    }

    /// Pod `uid`'s sandboxes carry the annotation `key: value` (the kubelet's
    /// `kubernetes.io/config.source`, say).
    pub fn annotate_sandboxes(&self, uid: &str, key: &str, value: &str) {
        let mut s = self.lock();
        for sb in s.sandboxes.iter_mut().filter(|sb| sb.pod_uid == uid) {
            sb.annotations.insert(key.into(), value.into());
        }
    }

    /// Stalls (or releases) `ListPodSandbox` and `ListContainers`: while stalled they wait
    /// (their callers' deadlines cut them), and answer once released.
    pub fn stall_lists(&self, stalled: bool) {
        self.lists_stalled
            .store(stalled, std::sync::atomic::Ordering::Relaxed);
    }

    /// `ListPodSandbox` and `ListContainers` answer `Unavailable` until `until` (virtual time),
    /// as they do while containerd restarts.
    pub fn fail_lists_until(&self, until: Instant) {
        self.lock().lists_fail_until = Some(until);
    }

    /// `StopContainer` answers `Unavailable` until `until` (virtual time): the connection is
    /// refused, the request never reaches the runtime and no signal is sent (not a call).
    pub fn fail_stops_until(&self, until: Instant) {
        self.lock().stops_fail_until = Some(until);
    }

    /// ExecSync answers `Unavailable` (refused: it never reached the runtime) until `until`;
    /// a refused exec is not a call.
    pub fn fail_execs_until(&self, until: Instant) {
        self.lock().execs_fail_until = Some(until);
    }

    /// StopContainer waits until `until` before it reaches the runtime, as a call queued for
    /// one of the client's call slots does (not a call until then).
    pub fn queue_stops_until(&self, until: Instant) {
        self.lock().stops_queued_until = Some(until);
    }

    /// A stop queued for a call slot ([`Self::queue_stops_until`]) waits until its time.
    async fn wait_stop_queue(&self) {
        let queued = self.lock().stops_queued_until;
        if let Some(t) = queued {
            tokio::time::sleep_until(t).await;
        }
    }

    /// `StopContainer` as the runtime takes it.
    async fn stop_body(&self, id: &str, timeout_secs: i64) -> Result<(), CriError> {
        let behaviour = {
            let mut s = self.lock();
            if s.stops_fail_until.is_some_and(|t| Instant::now() < t) {
                return Err(CriError::Unavailable {
                    op: "StopContainer",
                    id: id.into(),
                    message: "connection refused".into(),
                });
            }
            s.calls.push(Call::StopContainer {
                id: id.into(),
                timeout: timeout_secs,
                at: Instant::now(),
            });
            let (c, b, _) =
                s.containers
                    .iter()
                    .find(|(c, _, _)| c.id == id)
                    .ok_or(CriError::NotFound {
                        op: "StopContainer",
                        id: id.into(),
                    })?;
            if c.state == ContainerRunState::Exited {
                return Ok(());
            }
            let b = *b;
            if b == Behaviour::PanicOnce {
                if let Some(entry) = s.containers.iter_mut().find(|(c, _, _)| c.id == id) {
                    entry.1 = Behaviour::IgnoreTerm;
                }
                drop(s);
                panic!("fake runtime: injected panic in StopContainer {id}");
            }
            b
        };
        let timeout = Duration::from_secs(timeout_secs.max(0) as u64);
        match behaviour {
            Behaviour::ExitOnTerm(d) if d <= timeout => {
                tokio::time::sleep(d).await;
                self.exit(id, 0);
            }
            Behaviour::ExitOnTerm(_) | Behaviour::IgnoreTerm => {
                tokio::time::sleep(timeout).await;
                self.exit(id, 137);
            }
            Behaviour::Hang => std::future::pending::<()>().await,
            Behaviour::Liar | Behaviour::PanicOnce => {}
        }
        Ok(())
    }

    async fn wait_lists(&self, op: &'static str) -> Result<(), CriError> {
        while self
            .lists_stalled
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        match self.lock().lists_fail_until {
            Some(t) if Instant::now() < t => Err(CriError::Unavailable {
                op,
                id: String::new(),
                message: "connection refused".into(),
            }),
            _ => Ok(()),
        }
    }

    /// Serves container event subscriptions from now on (CRI `GetContainerEvents`); none
    /// arrive, the stream stays open.
    pub fn serve_events(&self) {
        self.lock().events = true;
    }

    /// When each relist (a list of every sandbox) ran, in virtual time.
    pub fn relists(&self) -> Vec<Instant> {
        self.lock().relists.clone()
    }

    pub fn calls(&self) -> Vec<Call> {
        self.lock().calls.clone()
    }

    /// The containers whose status was read (`ContainerStatus`), in order.
    pub fn status_reads(&self) -> Vec<String> {
        self.lock().status_reads.clone()
    }

    /// The stop calls of one container, in order: (timeout, virtual time).
    pub fn stops_of(&self, id: &str) -> Vec<(i64, Instant)> {
        self.calls()
            .into_iter()
            .filter_map(|c| match c {
                Call::StopContainer { id: i, timeout, at } if i == id => Some((timeout, at)),
                _ => None,
            })
            .collect()
    }

    pub fn exit_code(&self, id: &str) -> Option<i32> {
        self.lock()
            .containers
            .iter()
            .find(|(c, _, _)| c.id == id && c.state == ContainerRunState::Exited)
            .map(|(_, _, code)| *code)
    }

    /// Container `id` exits with `code` on its own (its process ended), and the newest event
    /// subscription, if any, is told so (CRI `CONTAINER_STOPPED_EVENT`).
    pub fn exit_with_event(&self, id: &str, code: i32) {
        self.exit(id, code);
        let tx = self.lock().events_tx.clone();
        if let Some(tx) = tx {
            let _ = tx.try_send(super::ContainerEvent {
                container_id: id.into(),
                kind: super::ContainerEventKind::Exited,
                exit_code: Some(code),
                exited_at: Some(self.now_ns()),
            });
        }
    }

    fn exit(&self, id: &str, code: i32) {
        if let Some(e) = self
            .lock()
            .containers
            .iter_mut()
            .find(|(c, _, _)| c.id == id)
            && e.0.state != ContainerRunState::Exited
        {
            e.0.state = ContainerRunState::Exited;
            e.2 = code;
        }
    }
}

impl Runtime for FakeRuntime {
    async fn version(&self) -> Result<RuntimeVersion, CriError> {
        Ok(RuntimeVersion {
            runtime_name: "fake".into(),
            runtime_version: "0".into(),
            runtime_api_version: "v1".into(),
        })
    }

    async fn list_sandboxes(&self, pod_uid: Option<&str>) -> Result<Vec<RuntimeSandbox>, CriError> {
        self.wait_lists("ListPodSandbox").await?;
        let mut s = self.lock();
        if pod_uid.is_none() {
            s.relists.push(Instant::now());
        }
        Ok(s.sandboxes
            .iter()
            .filter(|s| pod_uid.is_none_or(|u| s.pod_uid == u))
            .cloned()
            .collect())
    }

    async fn list_containers(
        &self,
        pod_uid: Option<&str>,
    ) -> Result<Vec<RuntimeContainer>, CriError> {
        self.wait_lists("ListContainers").await?;
        Ok(self
            .lock()
            .containers
            .iter()
            .filter(|(c, _, _)| pod_uid.is_none_or(|u| c.pod_uid == u))
            .map(|(c, _, _)| c.clone())
            .collect())
    }

    async fn container_status(&self, id: &str) -> Result<ContainerDetail, CriError> {
        let mut s = self.lock();
        s.status_reads.push(id.to_owned());
        let (c, _, code) =
            s.containers
                .iter()
                .find(|(c, _, _)| c.id == id)
                .ok_or(CriError::NotFound {
                    op: "ContainerStatus",
                    id: id.into(),
                })?;
        Ok(ContainerDetail {
            id: c.id.clone(),
            state: c.state,
            exit_code: *code,
            started_at: 1,
            // an exit is read as happening now (after any termination that asks)
            finished_at: if c.state == crate::cri::ContainerRunState::Exited {
                self.now_ns()
            } else {
                0
            },
            reason: String::new(),
        })
    }

    async fn stop_container(&self, id: &str, timeout_secs: i64) -> Result<(), CriError> {
        self.wait_stop_queue().await;
        self.stop_body(id, timeout_secs).await
    }

    async fn stop_container_sent(
        &self,
        id: &str,
        timeout_secs: i64,
        sent: tokio::sync::oneshot::Sender<()>,
    ) -> Result<(), CriError> {
        self.wait_stop_queue().await;
        let _ = sent.send(());
        self.stop_body(id, timeout_secs).await
    }

    async fn stop_pod_sandbox(&self, id: &str) -> Result<(), CriError> {
        let ids: Vec<String> = {
            let mut s = self.lock();
            s.calls.push(Call::StopPodSandbox {
                id: id.into(),
                at: Instant::now(),
            });
            let sb = s
                .sandboxes
                .iter_mut()
                .find(|sb| sb.id == id)
                .ok_or(CriError::NotFound {
                    op: "StopPodSandbox",
                    id: id.into(),
                })?;
            sb.ready = false;
            s.containers
                .iter()
                .filter(|(c, b, _)| c.sandbox_id == id && *b != Behaviour::Liar)
                .map(|(c, _, _)| c.id.clone())
                .collect()
        };
        for id in ids {
            self.exit(&id, 137);
        }
        Ok(())
    }

    async fn remove_pod_sandbox(&self, id: &str) -> Result<(), CriError> {
        let mut s = self.lock();
        s.sandboxes.retain(|sb| sb.id != id);
        s.containers.retain(|(c, _, _)| c.sandbox_id != id);
        Ok(())
    }

    /// Understands `["sleep", "<secs>"]`; anything else succeeds at once.
    async fn exec_sync(
        &self,
        id: &str,
        cmd: Vec<String>,
        timeout: Duration,
    ) -> Result<ExecResult, CriError> {
        {
            let mut s = self.lock();
            if s.execs_fail_until.is_some_and(|t| Instant::now() < t) {
                return Err(CriError::Unavailable {
                    op: "ExecSync",
                    id: id.into(),
                    message: "connection refused".into(),
                });
            }
            s.calls.push(Call::ExecSync {
                id: id.into(),
                at: Instant::now(),
            });
        }
        if cmd.first().map(String::as_str) == Some("sleep") {
            let secs: u64 = cmd.get(1).and_then(|s| s.parse().ok()).unwrap_or(0);
            let d = Duration::from_secs(secs);
            if d > timeout {
                tokio::time::sleep(timeout).await;
                return Err(CriError::DeadlineExceeded {
                    op: "ExecSync",
                    id: id.into(),
                    timeout,
                });
            }
            tokio::time::sleep(d).await;
        }
        Ok(ExecResult { exit_code: 0 })
    }

    async fn container_events(&self) -> Result<EventSubscription, CriError> {
        let mut s = self.lock();
        if !s.events {
            return Err(CriError::Unimplemented {
                op: "GetContainerEvents",
            });
        }
        let (tx, events) = tokio::sync::mpsc::channel(16);
        s.events_tx = Some(tx);
        Ok(EventSubscription {
            source: super::EventSource::Cri,
            events,
        })
    }
}
