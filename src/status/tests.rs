//! The terminal status rules, case by case.

use super::*;
use crate::pod::{ContainerSpec, PodUid};

fn pod(regular: &[&str], sidecars: &[&str]) -> PodInfo {
    let mut p = PodInfo::from_runtime(&PodUid::parse("u1").unwrap(), &[], &[]);
    let spec = |n: &&str| ContainerSpec {
        name: (*n).into(),
        pre_stop: None,
        ports: vec![],
        restart: None,
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

fn created(name: &str, attempt: u32) -> ContainerFinal {
    ContainerFinal {
        state: ContainerRunState::Created,
        exit_code: 0,
        started_at: 0,
        finished_at: 0,
        attempt,
        ..fin(name, 0)
    }
}

fn state<'a>(list: &'a [Value], name: &str) -> &'a Value {
    &list.iter().find(|c| c["name"] == name).unwrap()["state"]["terminated"]
}

#[test]
fn created_but_never_started_is_unknown_137_and_the_pod_failed_through_pending() {
    let p = pod(&["a", "late"], &[]);
    let s = terminal_status(&p, &[fin("a", 0), created("late", 0)], None)
        .unwrap()
        .unwrap();
    assert_eq!(s.phase, Phase::Failed);
    let t = state(&s.container_statuses, "late");
    assert_eq!(
        *t,
        json!({"exitCode": 137, "reason": UNKNOWN_REASON, "message": UNKNOWN_MESSAGE})
    );
    // getPhase said Pending: TerminatePod forced Failed, the Pending conditions stay
    assert_eq!(
        s.not_ready,
        NotReady {
            reason: CONTAINERS_NOT_READY,
            message: Some("containers with unready status: [a late]".into()),
        }
    );
    let patch = status_patch("u1", &s, "t");
    for c in patch["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["type"] != POD_READY_TO_START_CONTAINERS)
    {
        assert_eq!(c["reason"], CONTAINERS_NOT_READY);
        assert_eq!(c["message"], "containers with unready status: [a late]");
    }
}

#[test]
fn a_restart_that_never_started_is_stopped_not_pending() {
    let p = pod(&["a"], &[]);
    let s = terminal_status(&p, &[fin("a", 0), created("a", 1)], None)
        .unwrap()
        .unwrap();
    assert_eq!(s.phase, Phase::Failed, "stopped, not succeeded");
    assert_eq!(s.not_ready.reason, POD_FAILED);
    assert_eq!(state(&s.container_statuses, "a")["reason"], UNKNOWN_REASON);
    assert_eq!(s.container_statuses[0]["restartCount"], 1);
}

#[test]
fn ready_reasons_follow_the_phase() {
    let p = pod(&["a"], &[]);
    let ok = terminal_status(&p, &[fin("a", 0)], None).unwrap().unwrap();
    assert_eq!(
        (ok.phase, ok.not_ready.reason),
        (Phase::Succeeded, POD_COMPLETED)
    );
    let bad = terminal_status(&p, &[fin("a", 137)], None)
        .unwrap()
        .unwrap();
    assert_eq!(
        (bad.phase, bad.not_ready.reason),
        (Phase::Failed, POD_FAILED)
    );
    // a vanished container: stopped for getPhase (it was running), so PodFailed
    let gone = terminal_status(&p, &[], None).unwrap().unwrap();
    assert_eq!(
        (gone.phase, gone.not_ready.reason),
        (Phase::Failed, POD_FAILED)
    );
    let patch = status_patch("u1", &bad, "t");
    for c in patch["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["type"] != POD_READY_TO_START_CONTAINERS)
    {
        assert_eq!(c["status"], "False");
        assert_eq!(c["reason"], POD_FAILED);
        assert!(c.get("message").is_none());
    }
}

#[test]
fn sidecars_up_to_the_last_started_one_and_regulars_once_initialized() {
    let p = pod(&["main"], &["s1", "s2", "s3"]);
    let mut s1 = fin("s1", 143);
    s1.attempt = 0;
    // s2 vanished (it ran), s3 never started
    let s = terminal_status(&p, &[fin("main", 0), s1, created("s3", 0)], None)
        .unwrap()
        .unwrap();
    let names: Vec<&str> = s
        .init_container_statuses
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["s1", "s2"], "s3 keeps the API's waiting state");
    assert_eq!(state(&s.init_container_statuses, "s1")["exitCode"], 143);
    assert_eq!(
        state(&s.init_container_statuses, "s2")["reason"],
        UNKNOWN_REASON
    );
    // a waiting sidecar makes getPhase say Pending
    assert_eq!(s.phase, Phase::Failed);
    assert_eq!(
        s.not_ready.message.as_deref(),
        Some("containers with unready status: [s1 s2 s3 main]")
    );
    // never initialized: regular containers keep their waiting state, the first sidecar
    // is always marked
    let never: Vec<ContainerFinal> = ["main", "s1", "s2", "s3"]
        .iter()
        .map(|n| created(n, 0))
        .collect();
    let s = terminal_status(&p, &never, None).unwrap().unwrap();
    assert!(s.container_statuses.is_empty());
    assert_eq!(s.init_container_statuses.len(), 1);
    assert_eq!(
        state(&s.init_container_statuses, "s1")["reason"],
        UNKNOWN_REASON
    );
    assert_eq!(s.phase, Phase::Failed);
    // without sidecars a pod is always initialized
    let p = pod(&["main"], &[]);
    let s = terminal_status(&p, &[created("main", 0)], None)
        .unwrap()
        .unwrap();
    assert_eq!(s.container_statuses.len(), 1);
}

#[test]
fn an_existing_disruption_target_is_seen_whatever_its_reason() {
    let pod = |conds: Value| -> k8s_openapi::api::core::v1::Pod {
        serde_json::from_value(json!({"metadata": {"name": "p"}, "status": {"conditions": conds}}))
            .unwrap()
    };
    assert!(has_disruption_target(&pod(json!([
        {"type": "Ready", "status": "True"},
        {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}
    ]))));
    assert!(!has_disruption_target(&pod(
        json!([{"type": "Ready", "status": "True"}])
    )));
    assert!(!has_disruption_target(&pod(Value::Null)));
}

#[test]
fn patch_carries_uid_conditions_and_disruption_only_with_the_phase() {
    let p = pod(&["a"], &[]);
    let reason = KillReason::Requested {
        by: crate::lifecycle::Requester::NodePressure,
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
    assert_eq!(
        types,
        [
            "PodReadyToStartContainers",
            "Ready",
            "ContainersReady",
            "DisruptionTarget"
        ]
    );
    assert!(conds[..3].iter().all(|c| c["status"] == "False"));
    assert_eq!(conds[3]["reason"], "TerminationByKubelet");
    assert_eq!(conds[3]["message"], "The node was low on resource: memory.");
    assert!(conds[1..3].iter().all(|c| c["reason"] == POD_FAILED));
    // the sandbox is stopped: no reason, no message (measured on the kubelet v1.36.5)
    assert!(conds[0].get("reason").is_none() && conds[0].get("message").is_none());
    // without a disruption reason there is no DisruptionTarget
    let s = terminal_status(&p, &[fin("a", 0)], Some(&KillReason::Deleted))
        .unwrap()
        .unwrap();
    let patch = status_patch("u1", &s, "t");
    let conds = patch["status"]["conditions"].as_array().unwrap();
    assert!(
        conds.iter().all(|c| c["type"] != "DisruptionTarget"),
        "{patch}"
    );
}

/// The kubelet's own kills (graceful node shutdown, node-pressure eviction, admission
/// preemption) set the phase to `Failed` when the kill starts, through their status function:
/// the terminal status stays `Failed` even when every container exits 0 on SIGTERM.
#[test]
fn a_kill_with_the_kubelets_status_is_failed_even_when_containers_exit_0() {
    let p = pod(&["a", "b"], &[]);
    let reason = crate::shutdown::kill_reason();
    let s = terminal_status(&p, &[fin("a", 0), fin("b", 0)], Some(&reason))
        .unwrap()
        .unwrap();
    let patch = status_patch("u1", &s, "t");
    assert_eq!(patch["status"]["phase"], "Failed");
    assert_eq!(patch["status"]["reason"], "Terminated");
    assert_eq!(
        patch["status"]["message"],
        "Pod was terminated in response to imminent node shutdown."
    );
    let conds = patch["status"]["conditions"].as_array().unwrap();
    assert!(conds[1..3].iter().all(|c| c["reason"] == POD_FAILED));
    // a kill without such a status keeps the phase the exits say
    let s = terminal_status(&p, &[fin("a", 0), fin("b", 0)], Some(&KillReason::Deleted))
        .unwrap()
        .unwrap();
    assert_eq!(status_patch("u1", &s, "t")["status"]["phase"], "Succeeded");
}

#[test]
fn an_eviction_takes_its_phase_from_the_exit_codes_and_keeps_the_condition() {
    let p = pod(&["c"], &[]);
    let message = "The node was low on resource: memory. Threshold quantity: 1Gi, available: 679132Ki. Container c was using 2360688Ki, request is 0, has larger consumption of memory. ";
    let evicted = KillReason::Requested {
        by: crate::lifecycle::Requester::NodePressure,
        disruption: Some("TerminationByKubelet".into()),
        reason: Some("Evicted".into()),
        message: message.into(),
    };
    // exit 0 on SIGTERM: Succeeded, no reason or message, the condition with the message
    let s = terminal_status(&p, &[fin("c", 0)], Some(&evicted))
        .unwrap()
        .unwrap();
    let patch = status_patch("u1", &s, "2026-01-01T00:00:00Z");
    assert_eq!(patch["status"]["phase"], "Succeeded");
    assert!(patch["status"].get("reason").is_none(), "{patch}");
    assert!(patch["status"].get("message").is_none(), "{patch}");
    let conds = patch["status"]["conditions"].as_array().unwrap();
    assert_eq!(conds[3]["type"], "DisruptionTarget");
    assert_eq!(conds[3]["reason"], "TerminationByKubelet");
    assert_eq!(conds[3]["message"], message);
    // SIGKILL at the floor: Failed, Evicted and the message kept
    let s = terminal_status(&p, &[fin("c", 137)], Some(&evicted))
        .unwrap()
        .unwrap();
    let patch = status_patch("u1", &s, "2026-01-01T00:00:00Z");
    assert_eq!(patch["status"]["phase"], "Failed");
    assert_eq!(patch["status"]["reason"], "Evicted");
    assert_eq!(patch["status"]["message"], message);
    // a shutdown stays Failed whatever the exit codes
    let s = terminal_status(
        &p,
        &[fin("c", 0)],
        Some(&crate::shutdown::plan::kill_reason()),
    )
    .unwrap()
    .unwrap();
    assert_eq!(s.phase, Phase::Failed);
    assert_eq!(s.reason.as_deref(), Some("Terminated"));
}

/// `PodObservedGenerationTracking` (GA in v1.35): the status and every condition written
/// carry the generation of the object last seen; an object without one (an orphan's rebuilt
/// spec) writes none.
#[test]
fn every_status_write_carries_the_observed_generation() {
    let mut p = pod(&["a"], &[]);
    p.generation = Some(3);
    let evicted = crate::shutdown::plan::kill_reason();
    let s = terminal_status(&p, &[fin("a", 0)], Some(&evicted))
        .unwrap()
        .unwrap();
    let patch = status_patch("u1", &s, "t");
    assert_eq!(patch["status"]["observedGeneration"], 3);
    let conds = patch["status"]["conditions"].as_array().unwrap();
    assert_eq!(conds.len(), 4);
    assert!(
        conds.iter().all(|c| c["observedGeneration"] == 3),
        "{patch}"
    );
    p.generation = None;
    let s = terminal_status(&p, &[fin("a", 0)], None).unwrap().unwrap();
    let patch = status_patch("u1", &s, "t");
    assert!(patch["status"].get("observedGeneration").is_none());
    assert!(
        patch["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c.get("observedGeneration").is_none())
    );
}

/// `GeneratePodInitializedCondition`: a pod whose phase is `Succeeded` is initialized with the
/// reason `PodCompleted` (measured on the kubelet v1.36.5: an evicted pod exiting 0); a
/// `Failed` one keeps the `Initialized` it had (True, no reason, once a container started).
#[test]
fn a_succeeded_pod_is_initialized_with_pod_completed() {
    let p = pod(&["a"], &[]);
    let ok = terminal_status(&p, &[fin("a", 0)], None).unwrap().unwrap();
    let patch = status_patch("u1", &ok, "t");
    let init: Vec<&Value> = patch["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["type"] == "Initialized")
        .collect();
    assert_eq!(init.len(), 1, "{patch}");
    assert_eq!(init[0]["status"], "True");
    assert_eq!(init[0]["reason"], POD_COMPLETED);
    assert!(init[0].get("message").is_none());
    let bad = terminal_status(&p, &[fin("a", 1)], None).unwrap().unwrap();
    let patch = status_patch("u1", &bad, "t");
    assert!(
        patch["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["type"] != "Initialized"),
        "{patch}"
    );
}
