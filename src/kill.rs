//! Stopping a pod's containers and sandboxes: kubelet's `killPodWithSyncResult`,
//! `killContainersWithSyncResult`, `killContainer` (`kuberuntime_container.go`) and
//! `terminationOrdering` (`kuberuntime_termination_order.go`).
//!
//! Invariants:
//! * every running container of the pod is stopped in parallel; sidecars (restartable init
//!   containers) wait until every regular container and every sidecar declared after them has
//!   stopped, and that wait comes off their grace; their preStop hooks start at once;
//! * per container: preStop (bounded by the grace), whole seconds deducted, 2 s floor, then
//!   `StopContainer(id, grace)`; NotFound counts as stopped; a failed hook is reported and the
//!   stop goes on;
//! * a preStop hook runs at most once per container, even when a shorter grace restarts the
//!   kill ([`KillMemory`]);
//! * sandboxes are stopped only after every container stop succeeded (the kubelet stops them
//!   regardless, and a sandbox stop SIGKILLs what still runs: reaplet never cuts a grace
//!   short that way); then the runtime is re-read and anything still running is an error.

use crate::cri::{CriError, Runtime, RuntimeContainer};
use crate::events::{EventReason, EventSink, PodEvent};
use crate::grace;
use crate::hooks;
use crate::pod::{ContainerSpec, PodInfo};
use futures_util::future::join_all;
use std::collections::HashSet;
use std::sync::Mutex;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::Instrument;

#[derive(Debug, thiserror::Error)]
pub enum KillError {
    #[error("pod {uid}: listing runtime objects: {source}")]
    List { uid: String, source: CriError },
    #[error("pod {uid}: stopping container {container_name} ({container_id}): {source}")]
    StopContainer {
        uid: String,
        container_id: String,
        container_name: String,
        source: CriError,
    },
    #[error("pod {uid}: stopping sandbox {sandbox_id}: {source}")]
    StopSandbox {
        uid: String,
        sandbox_id: String,
        source: CriError,
    },
    #[error(transparent)]
    Refused(#[from] crate::authority::AuthorityError),
    #[error("pod {uid}: still running after a successful stop (CRI violation): {ids:?}")]
    StillRunning { uid: String, ids: Vec<String> },
}

/// What outlives one kill attempt of a pod: which containers already had their preStop hook.
#[derive(Debug, Default)]
pub struct KillMemory {
    prestop_started: Mutex<HashSet<String>>,
}

impl KillMemory {
    /// Marks the hook of `container_id` as started; false if it already was.
    fn claim_prestop(&self, container_id: &str) -> bool {
        let mut set = self
            .prestop_started
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        set.insert(container_id.to_owned())
    }
}

/// Summary of a finished kill.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KillReport {
    pub containers_stopped: usize,
    pub sandboxes_stopped: usize,
}

/// Stops every container of `pod` with `pod_grace`, then its sandboxes, then checks.
pub async fn kill_pod<R: Runtime>(
    runtime: &R,
    events: &EventSink,
    pod: &PodInfo,
    pod_grace: i64,
    memory: &KillMemory,
) -> Result<KillReport, KillError> {
    let uid = pod.uid.as_str();
    let list_err = |source| KillError::List {
        uid: uid.to_owned(),
        source,
    };
    let containers = runtime.list_containers(Some(uid)).await.map_err(list_err)?;
    let running: Vec<&RuntimeContainer> = containers.iter().filter(|c| c.state.may_run()).collect();

    // termination ordering: a done flag per running container
    let flags: Vec<(watch::Sender<bool>, watch::Receiver<bool>)> =
        running.iter().map(|_| watch::channel(false)).collect();
    let sidecar_index = |name: &str| pod.sidecars.iter().position(|s| s.name == name);
    let kills = running.iter().enumerate().map(|(i, c)| {
        let deps: Vec<watch::Receiver<bool>> = match sidecar_index(&c.name) {
            None => Vec::new(),
            Some(mine) => running
                .iter()
                .enumerate()
                .filter(|(j, other)| {
                    *j != i
                        && match sidecar_index(&other.name) {
                            None => true,
                            Some(theirs) => theirs > mine,
                        }
                })
                .map(|(j, _)| flags[j].1.clone())
                .collect(),
        };
        let spec = pod
            .container(&c.name)
            .cloned()
            .unwrap_or_else(|| ContainerSpec {
                name: c.name.clone(),
                pre_stop: None,
                ports: vec![],
            });
        let done = &flags[i].0;
        let span =
            tracing::info_span!("kill_container", containerName = %c.name, containerID = %c.id);
        async move {
            let r = kill_container(runtime, events, pod, &spec, c, pod_grace, deps, memory).await;
            if r.is_ok() {
                let _ = done.send(true);
            }
            r
        }
        .instrument(span)
    });
    let results = join_all(kills).await;
    let mut stopped = 0;
    for r in results {
        r?;
        stopped += 1;
    }

    let sandboxes = runtime.list_sandboxes(Some(uid)).await.map_err(list_err)?;
    for s in &sandboxes {
        match runtime.stop_pod_sandbox(&s.id).await {
            Ok(()) => {}
            Err(e) if e.is_not_found() => {}
            Err(source) => {
                return Err(KillError::StopSandbox {
                    uid: uid.to_owned(),
                    sandbox_id: s.id.clone(),
                    source,
                });
            }
        }
    }

    // re-check: the runtime must not report anything running any more
    let after = runtime.list_containers(Some(uid)).await.map_err(list_err)?;
    let mut still: Vec<String> = after
        .iter()
        .filter(|c| c.state.may_run())
        .map(|c| c.id.clone())
        .collect();
    let sandboxes_after = runtime.list_sandboxes(Some(uid)).await.map_err(list_err)?;
    still.extend(
        sandboxes_after
            .iter()
            .filter(|s| s.ready)
            .map(|s| s.id.clone()),
    );
    if !still.is_empty() {
        return Err(KillError::StillRunning {
            uid: uid.to_owned(),
            ids: still,
        });
    }
    Ok(KillReport {
        containers_stopped: stopped,
        sandboxes_stopped: sandboxes.len(),
    })
}

#[allow(clippy::too_many_arguments)]
async fn kill_container<R: Runtime>(
    runtime: &R,
    events: &EventSink,
    pod: &PodInfo,
    spec: &ContainerSpec,
    c: &RuntimeContainer,
    pod_grace: i64,
    deps: Vec<watch::Receiver<bool>>,
    memory: &KillMemory,
) -> Result<(), KillError> {
    let event = |reason, message: String| {
        events.record(PodEvent {
            uid: pod.uid.clone(),
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            reason,
            message,
        })
    };
    let mut g = pod_grace;
    if let Some(handler) = &spec.pre_stop
        && g > 0
        && memory.claim_prestop(&c.id)
    {
        event(
            EventReason::Killing,
            format!("Stopping container {}", c.name),
        );
        let start = Instant::now();
        let r = hooks::run(runtime, pod, spec, &c.id, handler, grace::as_duration(g)).await;
        let took = start.elapsed();
        if let Err(e) = r {
            event(
                EventReason::FailedPreStopHook,
                format!("PreStopHook failed for container {}: {e}", c.name),
            );
        }
        g = grace::deduct(g, took);
        tracing::info!(
            gracePeriod = g,
            tookMs = took.as_millis() as u64,
            "preStop hook done"
        );
    } else if spec.pre_stop.is_none() {
        event(
            EventReason::Killing,
            format!("Stopping container {}", c.name),
        );
    }
    if !deps.is_empty() && g > 0 {
        let start = Instant::now();
        let wait_all = async {
            for mut d in deps {
                // a dependency whose kill task went away counts as done waiting
                let _ = d.wait_for(|stopped| *stopped).await;
            }
        };
        let _ = tokio::time::timeout(grace::as_duration(g), wait_all).await;
        g = grace::deduct(g, start.elapsed());
    }
    let timeout = grace::container_stop_timeout(g);
    tracing::info!(gracePeriod = timeout, "stopping container");
    match runtime.stop_container(&c.id, timeout).await {
        Ok(()) => Ok(()),
        Err(e) if e.is_not_found() => Ok(()),
        Err(source) => Err(KillError::StopContainer {
            uid: pod.uid.to_string(),
            container_id: c.id.clone(),
            container_name: c.name.clone(),
            source,
        }),
    }
}
