//! The terminal statuses reaplet writes, as the kubelet writes them (`src/status.rs` has the
//! rules): containers that never started or that the runtime lost, the Ready/ContainersReady
//! reasons of terminal pods, and the `DisruptionTarget` condition. reaplet runs in-process
//! against the in-process API server and a real containerd (privileged: needs root).

mod common;

use common::api_harness::{ApiHarness, LIMIT, NODE};
use common::apiserver::{ApiServer, Recorded, User};
use common::*;
use reaplet::cri::{Runtime, pb};
use reaplet::pod::PodUid;
use reaplet_testbed::{
    BUSYBOX_IMAGE, ContainerTemplate, IGNORES_TERM, PodTemplate, TRAPS_TERM, Testbed, launch,
};
use serde_json::Value;
use std::collections::HashMap;
use std::time::{Duration, Instant};

const UNKNOWN_MESSAGE: &str = "The container could not be located when the pod was terminated";

/// Deletes the pod through the API and returns the body of the status PATCH reaplet sent
/// before its final DELETE.
async fn end(h: &ApiHarness, name: &str) -> Value {
    h.api.delete_pod("default", name, None);
    h.wait_gone(name).await;
    let w = pod_writes(&h.api, name);
    assert_eq!(w.len(), 2, "a status PATCH then a DELETE: {w:#?}");
    assert!(
        reads(&h.api, name).is_empty(),
        "a status without DisruptionTarget needs no read of the pod"
    );
    assert!(w[0].method == "PATCH" && w[0].path.ends_with("/status"));
    assert_eq!(w[0].status, 200, "{:#?}", w[0]);
    w[0].body["status"].clone()
}

fn pod_writes(api: &ApiServer, name: &str) -> Vec<Recorded> {
    api.writes()
        .into_iter()
        .filter(|r| r.path == format!("/api/v1/namespaces/default/pods/{name}/status"))
        .chain(api.writes().into_iter().filter(|r| {
            r.method == "DELETE" && r.path == format!("/api/v1/namespaces/default/pods/{name}")
        }))
        .collect()
}

/// GETs of the pod by name.
fn reads(api: &ApiServer, name: &str) -> Vec<Recorded> {
    api.requests()
        .into_iter()
        .filter(|r| {
            r.method == "GET" && r.path == format!("/api/v1/namespaces/default/pods/{name}")
        })
        .collect()
}

fn container<'a>(status: &'a Value, name: &str) -> &'a Value {
    status["containerStatuses"]
        .as_array()
        .and_then(|l| l.iter().find(|c| c["name"] == name))
        .unwrap_or_else(|| panic!("no status for container {name}: {status:#}"))
}

fn condition<'a>(conditions: &'a Value, kind: &str) -> &'a Value {
    conditions
        .as_array()
        .and_then(|l| l.iter().find(|c| c["type"] == kind))
        .unwrap_or_else(|| panic!("no {kind} condition: {conditions:#}"))
}

/// Asserts Ready and ContainersReady are both False with `reason` (and `message`, if any).
#[track_caller]
fn assert_not_ready(status: &Value, reason: &str, message: Option<&str>) {
    for kind in ["Ready", "ContainersReady"] {
        let c = condition(&status["conditions"], kind);
        assert_eq!(c["status"], "False", "{kind}: {c}");
        assert_eq!(c["reason"], reason, "{kind}: {c}");
        assert_eq!(c["message"].as_str(), message, "{kind}: {c}");
    }
}

#[track_caller]
fn assert_unknown_137(status: &Value, name: &str) {
    let t = &container(status, name)["state"]["terminated"];
    assert_eq!(t["reason"], "ContainerStatusUnknown", "{name}: {t}");
    assert_eq!(t["exitCode"], 137, "{name}: {t}");
    assert_eq!(t["message"], UNKNOWN_MESSAGE, "{name}: {t}");
}

/// Creates container `name` of `t` in its sandbox through CRI as `launch` does, but never
/// starts it (the kubelet's CreateContainer without its StartContainer).
async fn create_unstarted(tb: &Testbed, t: &PodTemplate, sandbox_id: &str, name: &str) -> String {
    let mut client = tb.client().raw();
    let labels: HashMap<String, String> = [
        (reaplet::cri::LABEL_POD_NAME, t.name.as_str()),
        (reaplet::cri::LABEL_POD_NAMESPACE, t.namespace.as_str()),
        (reaplet::cri::LABEL_POD_UID, t.uid.as_str()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    let ns = pb::NamespaceOption {
        network: pb::NamespaceMode::Node as i32,
        pid: pb::NamespaceMode::Container as i32,
        ipc: pb::NamespaceMode::Pod as i32,
        ..Default::default()
    };
    let uid = PodUid::parse(&t.uid).unwrap();
    let parent = std::path::Path::new("/").join(tb.naming().pod_cgroup(&uid, t.qos));
    let sandbox_config = pb::PodSandboxConfig {
        metadata: Some(pb::PodSandboxMetadata {
            name: t.name.clone(),
            uid: t.uid.clone(),
            namespace: t.namespace.clone(),
            attempt: 0,
        }),
        log_directory: tb.dir.join("logs").join(&t.uid).display().to_string(),
        labels: labels.clone(),
        linux: Some(pb::LinuxPodSandboxConfig {
            cgroup_parent: parent.display().to_string(),
            security_context: Some(pb::LinuxSandboxSecurityContext {
                namespace_options: Some(ns.clone()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut clabels = labels;
    clabels.insert(reaplet::cri::LABEL_CONTAINER_NAME.into(), name.into());
    let config = pb::ContainerConfig {
        metadata: Some(pb::ContainerMetadata {
            name: name.into(),
            attempt: 0,
        }),
        image: Some(pb::ImageSpec {
            image: BUSYBOX_IMAGE.into(),
            ..Default::default()
        }),
        command: vec!["/bin/sh".into(), "-c".into(), TRAPS_TERM.into()],
        log_path: format!("{name}/0.log"),
        labels: clabels,
        annotations: [(reaplet::cri::ANNOTATION_GRACE.into(), t.grace.to_string())].into(),
        linux: Some(pb::LinuxContainerConfig {
            resources: Some(pb::LinuxContainerResources::default()),
            security_context: Some(pb::LinuxContainerSecurityContext {
                namespace_options: Some(ns),
                ..Default::default()
            }),
        }),
        ..Default::default()
    };
    client
        .create_container(pb::CreateContainerRequest {
            pod_sandbox_id: sandbox_id.into(),
            config: Some(config),
            sandbox_config: Some(sandbox_config),
        })
        .await
        .expect("CreateContainer")
        .into_inner()
        .container_id
}

/// Rule 1 (`status.rs`): a container created but never started, and one the runtime no longer
/// has when the pod ends, are terminated `ContainerStatusUnknown`, 137, with the kubelet's
/// message; their pods end `Failed`, never `Succeeded`, with the kubelet's Ready reasons for
/// each path (the never-started container leaves the kubelet's phase `Pending` until its
/// `TerminatePod` forces `Failed`: `ContainersNotReady`; the vanished one is a stopped
/// container for `getPhase`: `PodFailed`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_started_and_vanished_containers_are_unknown_137_and_their_pods_failed() {
    let mut b = ApiHarness::new("statuses-unknown").await;
    // "late" is in the pod's spec, created in its sandbox, never started
    let unstarted = PodTemplate::new("unstarted", 30)
        .container(ContainerTemplate::new("app", TRAPS_TERM))
        .container(ContainerTemplate::new("late", TRAPS_TERM));
    let mut first = unstarted.clone();
    first.containers.retain(|c| c.name == "app");
    let p = launch(&b.tb, &first).await.unwrap();
    let late = create_unstarted(&b.tb, &unstarted, &p.sandbox_id, "late").await;
    let client = b.tb.client();
    assert_eq!(
        client.container_status(&late).await.unwrap().state,
        reaplet::cri::ContainerRunState::Created
    );
    b.api.create_pod(unstarted.api_object());
    // "gone" ran, then was removed from the runtime before the pod ended
    let vanished = PodTemplate::new("vanished", 30)
        .container(ContainerTemplate::new("app", TRAPS_TERM))
        .container(ContainerTemplate::new("gone", TRAPS_TERM));
    let q = launch(&b.tb, &vanished).await.unwrap();
    b.api.create_pod(vanished.api_object());
    client
        .stop_container(q.container_id("gone"), 0)
        .await
        .unwrap();
    client
        .raw()
        .remove_container(pb::RemoveContainerRequest {
            container_id: q.container_id("gone").into(),
        })
        .await
        .expect("RemoveContainer");
    b.start_agent().await;

    let st = end(&b, "unstarted").await;
    assert_eq!(st["phase"], "Failed", "{st:#}");
    assert_unknown_137(&st, "late");
    assert_eq!(container(&st, "app")["state"]["terminated"]["exitCode"], 0);
    assert_not_ready(
        &st,
        "ContainersNotReady",
        Some("containers with unready status: [app late]"),
    );

    let st = end(&b, "vanished").await;
    assert_eq!(st["phase"], "Failed", "{st:#}");
    assert_unknown_137(&st, "gone");
    assert_eq!(container(&st, "app")["state"]["terminated"]["exitCode"], 0);
    assert_not_ready(&st, "PodFailed", None);
    b.stop().await;
}

/// Rule 2: the Ready and ContainersReady reasons of a terminal pod are the kubelet's:
/// `PodFailed` for a `Failed` pod, `PodCompleted` for a `Succeeded` one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_conditions_say_pod_failed_or_pod_completed_as_the_phase_is() {
    let mut b = ApiHarness::new("statuses-ready").await;
    let stubborn =
        PodTemplate::new("stubborn", 2).container(ContainerTemplate::new("app", IGNORES_TERM));
    let web = PodTemplate::new("web", 30).container(ContainerTemplate::new("app", TRAPS_TERM));
    for t in [&stubborn, &web] {
        launch(&b.tb, t).await.unwrap();
        b.api.create_pod(t.api_object());
    }
    b.start_agent().await;
    let st = end(&b, "stubborn").await;
    assert_eq!(st["phase"], "Failed");
    assert_eq!(
        container(&st, "app")["state"]["terminated"]["exitCode"],
        137
    );
    assert_not_ready(&st, "PodFailed", None);
    let st = end(&b, "web").await;
    assert_eq!(st["phase"], "Succeeded");
    assert_not_ready(&st, "PodCompleted", None);
    b.stop().await;
}

/// Rule 3: a pod reaplet itself ends (a `Requested` kill: node-pressure eviction, shutdown,
/// preemption) gets `DisruptionTarget` with the kubelet's reason, in the patch with the
/// terminal phase; a `DisruptionTarget` someone else set (here the Eviction API's) is kept,
/// never overwritten.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_disruption_target_is_written_only_where_no_one_set_one() {
    use reaplet::lifecycle::KillReason;
    use reaplet::workers::StatusSink;
    let api = ApiServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let evicted =
        PodTemplate::new("evicted", 30).container(ContainerTemplate::new("app", TRAPS_TERM));
    let pressured =
        PodTemplate::new("pressured", 30).container(ContainerTemplate::new("app", TRAPS_TERM));
    api.create_pod(evicted.api_object());
    api.create_pod(pressured.api_object());
    // the Eviction API: DisruptionTarget/EvictionByEvictionAPI, then a graceful delete
    let admin = dir.path().join("admin");
    std::fs::create_dir_all(&admin).unwrap();
    let kc = api.write_kubeconfig_as(&admin, &User::Admin);
    let admin = reaplet::api::client::client(reaplet::api::client_config(Some(&kc)).await.unwrap())
        .unwrap();
    kube::Api::<k8s_openapi::api::core::v1::Pod>::namespaced(admin, "default")
        .evict("evicted", &Default::default())
        .await
        .expect("eviction");
    let before = api.get_pod("default", "evicted").unwrap();
    assert_eq!(
        condition(&before["status"]["conditions"], "DisruptionTarget")["reason"],
        "EvictionByEvictionAPI"
    );
    // reaplet's own decision to end both pods (node-pressure eviction)
    let (sm, cancel) = status_manager(&api, dir.path(), NODE).await;
    let finals = exited_app(137, "Error");
    let message = "The node was low on resource: memory.";
    let reason = KillReason::Requested {
        by: reaplet::lifecycle::Requester::NodePressure,
        disruption: Some("TerminationByKubelet".into()),
        reason: Some("Evicted".into()),
        message: message.into(),
    };
    let mut info = evicted.pod_info();
    info.deletion_requested = true;
    sm.pod_terminated(&info, Some(&reason), &finals);
    sm.pod_terminated(&pressured.pod_info(), Some(&reason), &finals);
    let start = Instant::now();
    let terminal =
        |name: &str| api.get_pod("default", name).unwrap()["status"]["phase"] == "Failed";
    while !(terminal("evicted") && terminal("pressured")) {
        assert!(
            start.elapsed() < LIMIT,
            "no terminal status: {:#?}",
            api.writes()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cancel.cancel();
    // each patch carrying our condition was built from a read, and is conditional on it
    for name in ["evicted", "pressured"] {
        assert_eq!(
            reads(&api, name).len(),
            1,
            "{name}: {:#?}",
            reads(&api, name)
        );
        let w = pod_writes(&api, name);
        assert_eq!(w.len(), 1, "{name}: {w:#?}");
        assert!(w[0].at >= reads(&api, name)[0].at);
        assert!(
            w[0].body["metadata"]["resourceVersion"].is_string(),
            "{name}: {:#}",
            w[0].body
        );
        assert_eq!(w[0].status, 200);
    }
    let pressured = api.get_pod("default", "pressured").unwrap();
    let c = condition(&pressured["status"]["conditions"], "DisruptionTarget");
    assert_eq!(c["status"], "True");
    assert_eq!(c["reason"], "TerminationByKubelet");
    assert_eq!(c["message"], message);
    assert_eq!(pressured["status"]["reason"], "Evicted");
    let evicted = api.get_pod("default", "evicted").unwrap();
    assert_eq!(evicted["status"]["reason"], "Evicted");
    let c = condition(&evicted["status"]["conditions"], "DisruptionTarget");
    let c0 = condition(&before["status"]["conditions"], "DisruptionTarget");
    assert_eq!(c, c0, "the Eviction API's DisruptionTarget was overwritten");
}

/// An API server holding one TERM-trapping pod `name` (grace 30), and a root dir.
async fn one_pod(name: &str) -> (ApiServer, tempfile::TempDir, PodTemplate) {
    let api = ApiServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let t = PodTemplate::new(name, 30).container(ContainerTemplate::new("app", TRAPS_TERM));
    api.create_pod(t.api_object());
    (api, dir, t)
}

/// An eviction's kill reason (a disruption target: the status patch reads the pod first).
fn evicted() -> reaplet::lifecycle::KillReason {
    reaplet::lifecycle::KillReason::Requested {
        by: reaplet::lifecycle::Requester::NodePressure,
        disruption: Some("TerminationByKubelet".into()),
        reason: Some("Evicted".into()),
        message: "The node was low on resource: memory.".into(),
    }
}

/// Issue 28, item 9: a 403 on the read before the status patch that is not the Node
/// authorizer's "no relationship found" (a permission problem: RBAC, a webhook) is not a pod
/// that is gone: the status is kept and retried, and written once the read is allowed again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_403_read_for_another_cause_keeps_the_status_and_retries() {
    use reaplet::workers::StatusSink;
    let (api, dir, t) = one_pod("kept").await;
    api.forbid_pod_gets(true);
    let (sm, cancel) = status_manager(&api, dir.path(), NODE).await;
    let reason = evicted();
    sm.pod_terminated(&t.pod_info(), Some(&reason), &exited_app(137, "Error"));
    // the first read and a retry (1 s later) are refused; the status stays pending
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let reads = || {
        api.requests()
            .into_iter()
            .filter(|r| r.path.ends_with("/pods/kept") && r.method == "GET")
            .map(|r| r.status)
            .collect::<Vec<u16>>()
    };
    assert!(
        reads().len() >= 2 && reads().iter().all(|c| *c == 403),
        "{:?}",
        reads()
    );
    assert_eq!(
        sm.pending(),
        1,
        "the status was dropped on a permission 403"
    );
    api.forbid_pod_gets(false);
    let limit = std::time::Instant::now() + Duration::from_secs(10);
    while !api
        .writes()
        .iter()
        .any(|r| r.path.ends_with("/pods/kept/status") && r.status == 200)
    {
        assert!(
            std::time::Instant::now() < limit,
            "no status written: {:?}",
            reads()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cancel.cancel();
}

/// The read before a guarded status is a node's GET: for a pod that is gone (force-deleted
/// before the watch said so) the real server answers 403, not 404 (facts 3.2, 3.3). That is
/// "gone", not a permission error to retry for ever: the status is dropped after one read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_403_read_of_a_pod_that_is_gone_drops_its_status() {
    use reaplet::workers::StatusSink;
    let (api, dir, gone) = one_pod("gone").await;
    api.delete_pod("default", "gone", Some(0));
    let (sm, cancel) = status_manager(&api, dir.path(), NODE).await;
    let finals = exited_app(137, "Error");
    let reason = evicted();
    sm.pod_terminated(&gone.pod_info(), Some(&reason), &finals);
    // the whole window in which backoff retries would come (1 s, then 2 s later)
    tokio::time::sleep(Duration::from_secs(4)).await;
    cancel.cancel();
    let reads: Vec<u16> = api
        .requests()
        .into_iter()
        .filter(|r| r.path.ends_with("/pods/gone") && r.method == "GET")
        .map(|r| r.status)
        .collect();
    assert_eq!(reads, vec![403], "one read, answered 403");
    assert!(
        api.writes().iter().all(|r| !r.path.contains("/pods/gone")),
        "a write for a pod that is gone: {:#?}",
        api.writes()
    );
    assert_eq!(sm.pending(), 0, "the status of a gone pod is still pending");
}
