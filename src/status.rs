//! The terminal pod status: kubelet's `generateAPIPodStatus` / `getPhase` (with podIsTerminal)
//! / `convertToAPIContainerStatuses` for a pod that has stopped (`kubelet_pods.go`), and the
//! status patch the status manager sends (`status/status_manager.go`).
//!
//! Invariants (reference §5):
//! * a terminal phase is computed only once every container has stopped; then the restart
//!   policy no longer matters: all regular containers exited 0 → `Succeeded`, else `Failed`;
//!   sidecars (restartable init containers) do not decide the phase;
//! * a container with no status left is `ContainerStatusUnknown`, exit 137;
//! * `Ready` and `ContainersReady` are False; `DisruptionTarget` is only ever sent in the same
//!   patch as the terminal phase;
//! * static pods get no terminal status; the patch always carries `metadata.uid`.

use crate::cri::ContainerRunState;
use crate::lifecycle::KillReason;
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

/// The terminal status of a stopped pod.
#[derive(Debug, Clone, PartialEq)]
pub struct TerminalStatus {
    pub phase: Phase,
    /// Pod-level reason/message (set by kills through the seam, e.g. evictions).
    pub reason: Option<String>,
    pub message: Option<String>,
    /// `DisruptionTarget` reason, if whoever ended the pod gave one.
    pub disruption: Option<String>,
    pub container_statuses: Vec<Value>,
    pub init_container_statuses: Vec<Value>,
}

pub const UNKNOWN_REASON: &str = "ContainerStatusUnknown";
pub const UNKNOWN_MESSAGE: &str = "The container could not be located when the pod was terminated";

/// RFC 3339 at second precision, as the API server stores `metav1.Time`.
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

fn terminated_state(f: Option<&ContainerFinal>) -> (Value, i32) {
    match f {
        Some(f) => {
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
        None => (
            json!({"exitCode": 137, "reason": UNKNOWN_REASON, "message": UNKNOWN_MESSAGE}),
            137,
        ),
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
    let latest = |name: &str| {
        finals
            .iter()
            .filter(|f| f.name == name)
            .max_by_key(|f| (f.attempt, f.finished_at))
    };
    let restarts = |name: &str| {
        finals
            .iter()
            .filter(|f| f.name == name)
            .count()
            .saturating_sub(1)
    };
    let status_of = |name: &str| {
        let f = latest(name);
        let (terminated, code) = terminated_state(f);
        let v = json!({
            "name": name,
            "ready": false,
            "started": false,
            "restartCount": restarts(name),
            "state": {"terminated": terminated},
        });
        (v, code)
    };
    let mut all_zero = !pod.containers.is_empty();
    let mut container_statuses = Vec::new();
    for c in &pod.containers {
        let (v, code) = status_of(&c.name);
        all_zero &= code == 0;
        container_statuses.push(v);
    }
    let init_container_statuses = pod.sidecars.iter().map(|c| status_of(&c.name).0).collect();
    let (reason, message, disruption) = match reason {
        Some(KillReason::Requested {
            disruption,
            reason,
            message,
        }) => (
            reason.clone(),
            Some(message.clone()).filter(|m| !m.is_empty()),
            disruption.clone(),
        ),
        _ => (None, None, None),
    };
    Ok(Some(TerminalStatus {
        phase: if all_zero {
            Phase::Succeeded
        } else {
            Phase::Failed
        },
        reason,
        message,
        disruption,
        container_statuses,
        init_container_statuses,
    }))
}

/// The strategic-merge patch for the `status` subresource: carries `metadata.uid` so it fails
/// on a pod recreated under the same name.
pub fn status_patch(uid: &str, st: &TerminalStatus, now: &str) -> Value {
    let mut conditions = vec![
        json!({"type": "Ready", "status": "False", "reason": "PodCompleted", "lastTransitionTime": now}),
        json!({"type": "ContainersReady", "status": "False", "reason": "PodCompleted", "lastTransitionTime": now}),
    ];
    if let Some(d) = &st.disruption {
        let mut c = json!({"type": "DisruptionTarget", "status": "True", "reason": d, "lastTransitionTime": now});
        if let Some(m) = &st.message {
            c["message"] = m.clone().into();
        }
        conditions.push(c);
    }
    let mut status = json!({
        "phase": st.phase.as_str(),
        "conditions": conditions,
        "containerStatuses": st.container_statuses,
    });
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
mod tests {
    use super::*;
    use crate::pod::{ContainerSpec, PodUid};

    fn pod(regular: &[&str], sidecars: &[&str]) -> PodInfo {
        let mut p = PodInfo::from_runtime(&PodUid::parse("u1").unwrap(), &[], &[]);
        let spec = |n: &&str| ContainerSpec {
            name: (*n).into(),
            pre_stop: None,
            ports: vec![],
        };
        p.containers = regular.iter().map(spec).collect();
        p.sidecars = sidecars.iter().map(spec).collect();
        p
    }

    fn fin(name: &str, code: i32) -> ContainerFinal {
        ContainerFinal {
            name: name.into(),
            id: format!("id-{name}"),
            state: ContainerRunState::Exited,
            exit_code: code,
            reason: String::new(),
            started_at: 1_700_000_000_000_000_000,
            finished_at: 1_700_000_001_000_000_000,
            attempt: 0,
        }
    }

    #[test]
    fn all_zero_is_succeeded_whatever_the_restart_policy() {
        let p = pod(&["a", "b"], &[]);
        let s = terminal_status(&p, &[fin("a", 0), fin("b", 0)], Some(&KillReason::Deleted))
            .unwrap()
            .unwrap();
        assert_eq!(s.phase, Phase::Succeeded);
        assert_eq!(
            s.container_statuses[0]["state"]["terminated"]["reason"],
            "Completed"
        );
        assert_eq!(
            s.container_statuses[0]["state"]["terminated"]["startedAt"],
            "2023-11-14T22:13:20Z"
        );
    }

    #[test]
    fn sigterm_or_sigkill_is_failed() {
        let p = pod(&["a"], &[]);
        for code in [143, 137, 1] {
            let s = terminal_status(&p, &[fin("a", code)], None)
                .unwrap()
                .unwrap();
            assert_eq!(s.phase, Phase::Failed);
            assert_eq!(
                s.container_statuses[0]["state"]["terminated"]["exitCode"],
                code
            );
            assert_eq!(
                s.container_statuses[0]["state"]["terminated"]["reason"],
                "Error"
            );
        }
    }

    #[test]
    fn missing_container_is_unknown_137_and_failed() {
        let p = pod(&["a", "gone"], &[]);
        let s = terminal_status(&p, &[fin("a", 0)], None).unwrap().unwrap();
        assert_eq!(s.phase, Phase::Failed);
        let t = &s.container_statuses[1]["state"]["terminated"];
        assert_eq!(t["reason"], UNKNOWN_REASON);
        assert_eq!(t["exitCode"], 137);
        assert_eq!(t["message"], UNKNOWN_MESSAGE);
    }

    #[test]
    fn sidecars_do_not_decide_the_phase() {
        let p = pod(&["main"], &["proxy"]);
        let s = terminal_status(&p, &[fin("main", 0), fin("proxy", 143)], None)
            .unwrap()
            .unwrap();
        assert_eq!(s.phase, Phase::Succeeded);
        assert_eq!(
            s.init_container_statuses[0]["state"]["terminated"]["exitCode"],
            143
        );
    }

    #[test]
    fn latest_attempt_counts_and_restarts_are_reported() {
        let p = pod(&["a"], &[]);
        let mut old = fin("a", 1);
        old.finished_at = 5;
        let mut new = fin("a", 0);
        new.attempt = 1;
        let s = terminal_status(&p, &[old, new], None).unwrap().unwrap();
        assert_eq!(s.phase, Phase::Succeeded);
        assert_eq!(s.container_statuses[0]["restartCount"], 1);
    }

    #[test]
    fn never_terminal_while_a_container_may_run() {
        let p = pod(&["a"], &[]);
        let mut f = fin("a", 0);
        f.state = ContainerRunState::Running;
        assert!(terminal_status(&p, &[f.clone()], None).is_err());
        f.state = ContainerRunState::Unknown;
        assert!(terminal_status(&p, &[f], None).is_err());
    }

    #[test]
    fn static_orphan_and_gone_pods_get_no_status() {
        let mut p = pod(&["a"], &[]);
        assert_eq!(
            terminal_status(&p, &[], Some(&KillReason::Orphan)).unwrap(),
            None
        );
        assert_eq!(
            terminal_status(&p, &[], Some(&KillReason::ObjectGone)).unwrap(),
            None
        );
        p.static_pod = true;
        assert_eq!(terminal_status(&p, &[fin("a", 0)], None).unwrap(), None);
    }

    #[test]
    fn patch_carries_uid_conditions_and_disruption_only_with_the_phase() {
        let p = pod(&["a"], &[]);
        let reason = KillReason::Requested {
            disruption: Some("TerminationByKubelet".into()),
            reason: Some("Evicted".into()),
            message: "The node was low on resource: memory.".into(),
        };
        let s = terminal_status(&p, &[fin("a", 137)], Some(&reason))
            .unwrap()
            .unwrap();
        let patch = status_patch("u1", &s, "2026-01-01T00:00:00Z");
        assert_eq!(patch["metadata"]["uid"], "u1");
        assert_eq!(patch["status"]["phase"], "Failed");
        assert_eq!(patch["status"]["reason"], "Evicted");
        let conds = patch["status"]["conditions"].as_array().unwrap();
        let types: Vec<&str> = conds.iter().map(|c| c["type"].as_str().unwrap()).collect();
        assert_eq!(types, ["Ready", "ContainersReady", "DisruptionTarget"]);
        assert!(conds[..2].iter().all(|c| c["status"] == "False"));
        assert_eq!(conds[2]["reason"], "TerminationByKubelet");
        // without a disruption reason there is no DisruptionTarget
        let s = terminal_status(&p, &[fin("a", 0)], Some(&KillReason::Deleted))
            .unwrap()
            .unwrap();
        let patch = status_patch("u1", &s, "t");
        assert_eq!(patch["status"]["conditions"].as_array().unwrap().len(), 2);
    }
}
