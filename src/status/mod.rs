//! The terminal pod status, as the kubelet leaves it in the API for a pod that has stopped, and
//! the status patch the status manager sends.
//!
//! Upstream builds that status in steps: `generateAPIPodStatus` (`kubelet_pods.go`:
//! `convertToAPIContainerStatuses`, `getPhase` with `podIsTerminal`, then the conditions of
//! `status/generate.go`) once the containers have stopped, then `TerminatePod`
//! (`status/status_manager.go`) after cleanup, each merged into the API object by
//! `mergePodStatus`. reaplet computes the end result at once, from the runtime's final view of
//! the pod's containers ([`ContainerFinal`], every attempt). The rules, from the v1.36 code:
//!
//! **Container states** (per container of the spec, regular or sidecar, from its latest attempt):
//! * exited: `terminated` with the runtime's exit code, reason (`Completed`/`Error` when the
//!   runtime gives none), start and finish times and container ID;
//! * created but never started (CRI `CONTAINER_CREATED`): `convertContainerStatus` makes it
//!   `waiting`, and `TerminatePod` replaces every state that is not `terminated` by
//!   `terminated {reason: ContainerStatusUnknown, exitCode: 137, message: "The container could
//!   not be located when the pod was terminated"}` ([`UNKNOWN_REASON`], [`UNKNOWN_MESSAGE`]; no
//!   container ID, no times);
//! * absent from the runtime (removed, or lost): upstream keeps a `terminated` state the API
//!   already had, and a container the API had as `running` gets the same 137 state (after a
//!   `lastState` ContainerStatusUnknown "...when the pod was deleted. The container used to be
//!   Running"). reaplet does not see the API's container statuses ([`PodInfo`] carries none) and
//!   takes an absent container to have been running: ContainerStatusUnknown, 137, the message;
//! * `TerminatePod` changes regular containers only once the pod has initialized
//!   (`hasPodInitialized`: no init containers, or a regular container that ever left `waiting`),
//!   and init containers only up to the last one that ever started (`initializedContainers`; at
//!   least the first). The others keep the `waiting` state the API holds: they are left out of
//!   the patch (a strategic merge by name keeps them).
//!
//! **Phase** (`getPhase` with `podIsTerminal`, then `TerminatePod`), never for static pods:
//! * a container, regular or sidecar, that never started and has no earlier attempt counts as
//!   `waiting`: `getPhase` says `Pending`, and `TerminatePod` turns `Pending` into `Failed`;
//! * otherwise the restart policy no longer matters: `Succeeded` if every regular container's
//!   latest attempt exited 0, else `Failed` (an absent container, or a restart that never
//!   started, counts as stopped and not succeeded); sidecars never decide the phase.
//!
//! So a pod with a never-started or vanished container ends `Failed`, never `Succeeded`.
//!
//! A kill of the kubelet's own ([`KillReason::Requested`]) sets the phase by who asked
//! ([`crate::lifecycle::PhaseRule`]): graceful node shutdown and an active deadline end
//! `Failed` with their reason and message whatever the exit codes; a node-pressure eviction's
//! `Failed`/`Evicted` is the kubelet's cached status only until the kill ends, when the exit
//! codes' phase replaces it (`Succeeded` if every regular container exited 0), and its reason
//! and message are kept only when that phase is `Failed` (`generateAPIPodStatus` copies them
//! only from a status of the same phase); the `DisruptionTarget` condition, with the message,
//! is kept either way (measured on the real kubelet v1.36.5).
//!
//! **Ready and ContainersReady** (`GenerateContainersReadyCondition`; `GeneratePodReadyCondition`
//! copies status, reason and message when it is not True), both False ([`NotReady`]):
//! * phase `Succeeded` from `getPhase`: reason `PodCompleted`; `Failed`: reason `PodFailed`;
//! * phase `Failed` only from `TerminatePod` (the `Pending` case above): the conditions stay as
//!   generated for `Pending` (`TerminatePod` does not regenerate them, `mergePodStatus` only
//!   rewrites True ones): reason `ContainersNotReady`, message `containers with unready status:
//!   [<sidecars> <containers>]` (every container is unready by then; spec order, space-separated).
//!
//! **PodReadyToStartContainers** False, no reason (`generatePodReadyToStartContainersCondition`:
//! the sandbox is stopped before the terminal status is built; measured on the kubelet v1.36.5).
//!
//! **Initialized** (`GeneratePodInitializedCondition`): True with the reason `PodCompleted` when
//! the phase is `Succeeded`; otherwise not written (it stays as it was: True once a container
//! started).
//!
//! **DisruptionTarget** (status True; reasons from `core/v1/types.go`): says who ended the pod:
//! `EvictionByEvictionAPI` (the API server), `DeletionByTaintManager`, `PreemptionByScheduler`,
//! `DeletionByPodGC` (the control plane), `TerminationByKubelet` (the kubelet itself:
//! node-pressure eviction, graceful node shutdown, admission preemption).
//! * it is sent only in the patch that carries the terminal phase (`mergePodStatus`);
//! * reaplet writes one only for the ends it decides itself: [`KillReason::Requested`], with the
//!   reason its producer gives for that cause ([`TERMINATION_BY_KUBELET`] for every cause the
//!   kubelet has) and the kill's message. `Deleted` and `TerminalPhase` were decided by others
//!   (their condition, if any, is already in the API); `Completed` is no disruption. `Orphan`
//!   and `ObjectGone` (the pod's object is gone: a status write for it would be wrong) and
//!   static pods get no status at all;
//! * a `DisruptionTarget` the API object already has (the Eviction API's, say) is kept, never
//!   overwritten: the status manager reads the object before a patch that would carry ours and
//!   leaves ours out ([`has_disruption_target`]). Upstream's `mergePodStatus` would replace it.
//!
//! Left out (reaplet has no source for them): `lastState` (the previous attempt's state),
//! the restart-count bump for a vanished container of a pod not deleted, the API's own view of
//! absent containers (see above), regular (non-restartable) init containers, which [`PodInfo`]
//! does not carry (a pod with only those counts as initialized; with sidecars, the rules run
//! over the sidecars alone), and the last init container's exit 0 as proof of initialization.
//!
//! Invariants (reference §5):
//! * a terminal phase is computed only once every container has stopped (one exception:
//!   reaplet's own pod, whose status is written before it stops itself: `workers::own_pod`);
//! * static pods, orphans and pods whose object is gone get no terminal status; the patch
//!   always carries `metadata.uid`.

use crate::cri::ContainerRunState;
use crate::lifecycle::{KillReason, PhaseRule};
use crate::pod::PodInfo;
use serde_json::{Value, json};

/// What the runtime says about a container once the pod has stopped.
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerFinal {
    pub name: String,
    pub id: String,
    pub state: ContainerRunState,
    pub exit_code: i32,
    /// The runtime's reason ("Completed", "Error", "OOMKilled"), may be empty.
    pub reason: String,
    pub started_at: i64,
    pub finished_at: i64,
    pub attempt: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Succeeded,
    Failed,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Succeeded => "Succeeded",
            Phase::Failed => "Failed",
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum StatusError {
    #[error("pod {uid}: container {container} may still run: no terminal status")]
    StillRunning { uid: String, container: String },
}

/// The reason and message of the False `Ready` and `ContainersReady` conditions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotReady {
    pub reason: &'static str,
    pub message: Option<String>,
}

/// The terminal status of a stopped pod.
#[derive(Debug, Clone, PartialEq)]
pub struct TerminalStatus {
    pub phase: Phase,
    /// Pod-level reason/message (set by kills through the seam, e.g. evictions).
    pub reason: Option<String>,
    pub message: Option<String>,
    /// `DisruptionTarget` reason, if whoever ended the pod gave one.
    pub disruption: Option<String>,
    /// The `DisruptionTarget` condition's message (the request's, kept even when the phase
    /// drops the pod-level reason and message).
    pub disruption_message: Option<String>,
    /// `Ready` and `ContainersReady`.
    pub not_ready: NotReady,
    pub container_statuses: Vec<Value>,
    pub init_container_statuses: Vec<Value>,
    /// `status.observedGeneration` and each written condition's: the pod's
    /// `metadata.generation` as last seen (the kubelet sets both on every status write).
    pub observed_generation: Option<i64>,
}

pub const UNKNOWN_REASON: &str = "ContainerStatusUnknown";
pub const UNKNOWN_MESSAGE: &str = "The container could not be located when the pod was terminated";
/// Ready reasons of `status/generate.go`.
pub const POD_COMPLETED: &str = "PodCompleted";
pub const POD_FAILED: &str = "PodFailed";
pub const CONTAINERS_NOT_READY: &str = "ContainersNotReady";
/// The `DisruptionTarget` reason of every end the kubelet decides itself.
pub const TERMINATION_BY_KUBELET: &str = "TerminationByKubelet";
pub const DISRUPTION_TARGET: &str = "DisruptionTarget";
pub const POD_READY_TO_START_CONTAINERS: &str = "PodReadyToStartContainers";
pub const INITIALIZED: &str = "Initialized";

/// RFC 3339 at second precision, as the API server stores `metav1.Time`.
/// Container `name`'s latest attempt among `finals` (the one a terminal status reports, and
/// the one a kill ended).
pub fn latest_attempt<'a>(finals: &'a [ContainerFinal], name: &str) -> Option<&'a ContainerFinal> {
    finals
        .iter()
        .filter(|f| f.name == name)
        .max_by_key(|f| (f.attempt, f.finished_at))
}

pub fn rfc3339(ns: i64) -> String {
    let ts =
        jiff::Timestamp::from_nanosecond(i128::from(ns)).unwrap_or(jiff::Timestamp::UNIX_EPOCH);
    ts.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

pub fn now_rfc3339() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// How a container of the spec ended, from its latest runtime attempt.
#[derive(Debug, Clone, Copy)]
enum End<'a> {
    Exited(&'a ContainerFinal),
    /// Created, never started; `earlier`: an earlier attempt of it exists.
    NeverStarted {
        earlier: bool,
    },
    /// The runtime has no container of that name.
    Absent,
}

impl End<'_> {
    /// `waiting` with no previous termination: what makes `getPhase` say `Pending`.
    fn waiting(self) -> bool {
        matches!(self, End::NeverStarted { earlier: false })
    }

    /// The terminated state and its exit code.
    fn terminated(self) -> (Value, i32) {
        match self {
            End::Exited(f) => {
                let reason = if !f.reason.is_empty() {
                    f.reason.clone()
                } else if f.exit_code == 0 {
                    "Completed".into()
                } else {
                    "Error".into()
                };
                let mut t = json!({
                    "exitCode": f.exit_code,
                    "reason": reason,
                    "containerID": format!("containerd://{}", f.id),
                });
                if f.started_at > 0 {
                    t["startedAt"] = rfc3339(f.started_at).into();
                }
                if f.finished_at > 0 {
                    t["finishedAt"] = rfc3339(f.finished_at).into();
                }
                (t, f.exit_code)
            }
            End::NeverStarted { .. } | End::Absent => (
                json!({"exitCode": 137, "reason": UNKNOWN_REASON, "message": UNKNOWN_MESSAGE}),
                137,
            ),
        }
    }
}

/// Computes the terminal status of `pod` from its containers' final states.
/// `None` for static pods and for pods whose object is gone (nothing to report).
pub fn terminal_status(
    pod: &PodInfo,
    finals: &[ContainerFinal],
    reason: Option<&KillReason>,
) -> Result<Option<TerminalStatus>, StatusError> {
    if pod.static_pod || matches!(reason, Some(KillReason::Orphan | KillReason::ObjectGone)) {
        return Ok(None);
    }
    if let Some(f) = finals.iter().find(|f| f.state.may_run()) {
        return Err(StatusError::StillRunning {
            uid: pod.uid.to_string(),
            container: f.name.clone(),
        });
    }
    let attempts = |name: &str| finals.iter().filter(|f| f.name == name).count();
    let end = |name: &str| match latest_attempt(finals, name) {
        None => End::Absent,
        Some(f) if f.state == ContainerRunState::Created => End::NeverStarted {
            earlier: attempts(name) > 1,
        },
        Some(f) => End::Exited(f),
    };
    let regular: Vec<End> = pod.containers.iter().map(|c| end(&c.name)).collect();
    let sidecars: Vec<End> = pod.sidecars.iter().map(|c| end(&c.name)).collect();
    let status_of = |name: &str, e: End| {
        json!({
            "name": name,
            "ready": false,
            "started": false,
            "restartCount": attempts(name).saturating_sub(1),
            "state": {"terminated": e.terminated().0},
        })
    };
    // hasPodInitialized, with the sidecars as the init containers reaplet knows
    let initialized = pod.sidecars.is_empty() || regular.iter().any(|e| !e.waiting());
    let container_statuses = pod
        .containers
        .iter()
        .zip(&regular)
        .filter(|(_, e)| initialized || matches!(e, End::Exited(_)))
        .map(|(c, e)| status_of(&c.name, *e))
        .collect();
    // initializedContainers: up to the last sidecar that ever started, at least the first
    let attempted = sidecars.iter().rposition(|e| !e.waiting()).unwrap_or(0) + 1;
    let init_container_statuses = pod
        .sidecars
        .iter()
        .zip(&sidecars)
        .take(attempted)
        .map(|(c, e)| status_of(&c.name, *e))
        .collect();
    let pending = regular.iter().chain(&sidecars).any(|e| e.waiting());
    // the kubelet's own kills set `Failed` through their status function when they start
    // (`killPodFunc`'s callers: node shutdown, node-pressure eviction, admission preemption),
    // and a terminal phase is never changed afterwards
    let forced_failed = matches!(
        reason,
        Some(KillReason::Requested { by, .. }) if by.phase_rule() == PhaseRule::Failed
    );
    let succeeded = !forced_failed
        && !regular.is_empty()
        && regular
            .iter()
            .all(|e| matches!(e, End::Exited(f) if f.exit_code == 0));
    let (phase, not_ready) = if pending {
        let names: Vec<&str> = pod
            .sidecars
            .iter()
            .chain(&pod.containers)
            .map(|c| c.name.as_str())
            .collect();
        let message = format!("containers with unready status: [{}]", names.join(" "));
        (Phase::Failed, (CONTAINERS_NOT_READY, Some(message)))
    } else if succeeded {
        (Phase::Succeeded, (POD_COMPLETED, None))
    } else {
        (Phase::Failed, (POD_FAILED, None))
    };
    let (reason, message, disruption) = match reason {
        Some(KillReason::Requested {
            disruption,
            reason,
            message,
            ..
        }) => (
            reason.clone(),
            Some(message.clone()).filter(|m| !m.is_empty()),
            disruption.clone(),
        ),
        _ => (None, None, None),
    };
    let disruption_message = message.clone().filter(|_| disruption.is_some());
    // the exit codes' phase keeps the request's reason and message only when it is `Failed`
    // as well (`generateAPIPodStatus` copies them only from a status of the same phase)
    let (reason, message) = if phase == Phase::Succeeded {
        (None, None)
    } else {
        (reason, message)
    };
    Ok(Some(TerminalStatus {
        phase,
        reason,
        message,
        disruption,
        disruption_message,
        not_ready: NotReady {
            reason: not_ready.0,
            message: not_ready.1,
        },
        container_statuses,
        init_container_statuses,
        observed_generation: pod.generation,
    }))
}

/// Whether the pod object already carries a `DisruptionTarget` condition (whoever set it, with
/// whatever status): then reaplet's own is not written.
pub fn has_disruption_target(pod: &k8s_openapi::api::core::v1::Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == DISRUPTION_TARGET))
}

/// The strategic-merge patch for the `status` subresource: carries `metadata.uid` so it fails
/// on a pod recreated under the same name. Conditions merge by type: the patch carries only
/// `PodReadyToStartContainers` (False: the sandbox is stopped; reaplet's own pod's is stopped
/// right after its status is written), `Ready`, `ContainersReady`, `Initialized` for a
/// `Succeeded` pod and, when `st.disruption` is set, `DisruptionTarget`.
pub fn status_patch(uid: &str, st: &TerminalStatus, now: &str) -> Value {
    let not_ready = |kind: &str| {
        let mut c = json!({"type": kind, "status": "False", "reason": st.not_ready.reason, "lastTransitionTime": now});
        if let Some(m) = &st.not_ready.message {
            c["message"] = m.clone().into();
        }
        c
    };
    // the sandbox is stopped by the time the kill ends: the kubelet's
    // `generatePodReadyToStartContainersCondition` then says False, with no reason
    let sandbox = json!({"type": POD_READY_TO_START_CONTAINERS, "status": "False", "lastTransitionTime": now});
    let mut conditions = vec![sandbox, not_ready("Ready"), not_ready("ContainersReady")];
    if let Some(d) = &st.disruption {
        let mut c = json!({"type": DISRUPTION_TARGET, "status": "True", "reason": d, "lastTransitionTime": now});
        if let Some(m) = &st.disruption_message {
            c["message"] = m.clone().into();
        }
        conditions.push(c);
    }
    if st.phase == Phase::Succeeded {
        conditions.push(json!({"type": INITIALIZED, "status": "True", "reason": POD_COMPLETED, "lastTransitionTime": now}));
    }
    if let Some(g) = st.observed_generation {
        for c in &mut conditions {
            c["observedGeneration"] = g.into();
        }
    }
    let mut status = json!({
        "phase": st.phase.as_str(),
        "conditions": conditions,
        "containerStatuses": st.container_statuses,
    });
    if let Some(g) = st.observed_generation {
        status["observedGeneration"] = g.into();
    }
    if !st.init_container_statuses.is_empty() {
        status["initContainerStatuses"] = st.init_container_statuses.clone().into();
    }
    if let Some(r) = &st.reason {
        status["reason"] = r.clone().into();
    }
    if let Some(m) = &st.message {
        status["message"] = m.clone().into();
    }
    json!({"metadata": {"uid": uid}, "status": status})
}

#[cfg(test)]
mod tests;
