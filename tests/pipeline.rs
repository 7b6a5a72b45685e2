//! The termination pipeline end to end against a real containerd (privileged: needs root;
//! every test starts its own private containerd through testbed/testbed.sh).

mod common;

use common::*;
use reaplet::cri::pb;
use reaplet::workers::KillRequest;
use reaplet_testbed::{ContainerTemplate, IGNORES_TERM, PodTemplate, TRAPS_TERM, launch};
use serde_json::json;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn term_trapping_container_stops_at_once_with_exit_0() {
    let h = Harness::new("trap").await;
    let t = PodTemplate::new("trap", 30).container(ContainerTemplate::new("app", TRAPS_TERM));
    let p = h.launch_desired(&t).await;
    let t0 = now_ns();
    h.workers.upsert(t.deleted(30));
    h.wait_state(&p.uid, PodPhase::Finished, LIMIT).await;
    let st = h.status(p.container_id("app")).await;
    assert_eq!(st.exit_code, 0);
    let took = secs(st.finished_at - t0);
    assert!(
        took < 1.0,
        "a TERM-trapping container took {took:.3}s to stop"
    );
    h.assert_gone(&p.uid).await;
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_cgroups_of_every_qos_class_are_removed_in_every_hierarchy() {
    use reaplet::pod::QosClass;
    let h = Harness::new("qos").await;
    let mut launched = Vec::new();
    let mut infos = Vec::new();
    for (name, qos) in [
        ("guaranteed", QosClass::Guaranteed),
        ("burstable", QosClass::Burstable),
        ("besteffort", QosClass::BestEffort),
    ] {
        let mut t = PodTemplate::new(name, 30).container(ContainerTemplate::new("app", TRAPS_TERM));
        t.qos = qos;
        let p = launch(&h.tb, &t).await.unwrap();
        let dirs = h.pod_cgroups(&p.uid);
        // runc creates the pod cgroup in every hierarchy (ten on this machine kind)
        assert!(
            dirs.len() >= 2,
            "{name}: pod cgroups not found where expected: {dirs:?}"
        );
        assert!(
            dirs.iter()
                .all(|d| d.to_string_lossy().contains(&format!("pod{}", p.uid)))
        );
        infos.push(t.pod_info());
        launched.push((t, p));
    }
    h.desire(infos);
    for (t, _) in &launched {
        h.workers.upsert(t.deleted(30));
    }
    for (_, p) in &launched {
        h.wait_state(&p.uid, PodPhase::Finished, LIMIT).await;
        h.assert_gone(&p.uid).await;
    }
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn term_ignoring_container_is_killed_at_its_grace_never_before() {
    let h = Harness::new("ignore").await;
    let t = PodTemplate::new("ignore", 30).container(ContainerTemplate::new("app", IGNORES_TERM));
    let p = h.launch_desired(&t).await;
    let t0 = now_ns();
    h.workers.upsert(t.deleted(3));
    h.wait_state(&p.uid, PodPhase::Finished, LIMIT).await;
    let st = h.status(p.container_id("app")).await;
    assert_stopped(&st, t0, 137, 3.0..4.5);
    h.assert_gone(&p.uid).await;
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grace_zero_or_one_still_gives_two_seconds_and_kill_notice_arrives() {
    let h = Harness::new("floor").await;
    let t = PodTemplate::new("floor", 30).container(ContainerTemplate::new("app", IGNORES_TERM));
    let p = h.launch_desired(&t).await;
    let (tx, rx) = tokio::sync::oneshot::channel();
    let t0 = now_ns();
    h.workers
        .kill(
            &p.uid,
            KillRequest {
                grace_override: Some(0),
                reason: KillReason::Requested {
                    by: reaplet::lifecycle::Requester::NodeShutdown,
                    disruption: None,
                    reason: None,
                    message: "test".into(),
                },
                done: Some(tx),
            },
        )
        .unwrap();
    tokio::time::timeout(LIMIT, rx)
        .await
        .expect("kill notice in time")
        .expect("kill notice sent");
    let st = h.status(p.container_id("app")).await;
    assert_stopped(&st, t0, 137, 2.0..3.5);
    let v = h.wait_state(&p.uid, PodPhase::Finished, LIMIT).await;
    assert_eq!(v.grace, Some(1));
    h.assert_gone(&p.uid).await;
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shorter_grace_mid_way_cuts_the_kill_short() {
    let h = Harness::new("shorten").await;
    let t = PodTemplate::new("shorten", 30).container(ContainerTemplate::new("app", IGNORES_TERM));
    let p = h.launch_desired(&t).await;
    let t0 = now_ns();
    h.workers.upsert(t.deleted(30));
    h.wait_state(&p.uid, PodPhase::Terminating, LIMIT).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let t1 = now_ns();
    h.workers.upsert(t.deleted(3));
    h.wait_state(&p.uid, PodPhase::Finished, LIMIT).await;
    let st = h.status(p.container_id("app")).await;
    assert_eq!(st.exit_code, 137);
    let after_shorten = secs(st.finished_at - t1);
    assert!(
        after_shorten >= 3.0,
        "killed {after_shorten:.3}s after the shortening, before 3 s"
    );
    assert!(
        after_shorten < 4.5,
        "killed {after_shorten:.3}s after the shortening (30 s grace kept?)"
    );
    assert!(secs(st.finished_at - t0) < 6.0);
    h.assert_gone(&p.uid).await;
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_prestop_runs_before_sigterm_and_its_time_comes_off_the_grace() {
    let mut h = Harness::new("prestop").await;
    let marker_trap = "trap '[ -f /tmp/prestop ] && exit 0 || exit 3' TERM; sleep 3600 & wait $!";
    let t = PodTemplate::new("prestop", 5)
        .container(ContainerTemplate::new("ordered", marker_trap).pre_stop(
            json!({"exec": {"command": ["/bin/sh", "-c", "touch /tmp/prestop; sleep 2"]}}),
        ))
        .container(
            ContainerTemplate::new("deducted", IGNORES_TERM)
                .pre_stop(json!({"exec": {"command": ["/bin/sh", "-c", "sleep 2"]}})),
        );
    let p = h.launch_desired(&t).await;
    let t0 = now_ns();
    h.workers.upsert(t.deleted(5));
    h.wait_state(&p.uid, PodPhase::Finished, LIMIT).await;
    let ordered = h.status(p.container_id("ordered")).await;
    assert_eq!(
        ordered.exit_code, 0,
        "SIGTERM arrived before the preStop hook had run"
    );
    assert!(secs(ordered.finished_at - t0) >= 2.0);
    let deducted = h.status(p.container_id("deducted")).await;
    // 2 s hook + (5 - 2) s = 5 s; without the deduction it would be 7 s
    assert_stopped(&deducted, t0, 137, 5.0..6.5);
    let ev = h.drain_events();
    assert!(
        ev.iter().all(|e| e.reason.as_str() != "FailedPreStopHook"),
        "{ev:?}"
    );
    h.assert_gone(&p.uid).await;
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prestop_longer_than_grace_is_cut_and_the_container_still_gets_two_seconds() {
    let mut h = Harness::new("longhook").await;
    let t = PodTemplate::new("longhook", 3).container(
        ContainerTemplate::new("app", IGNORES_TERM).pre_stop(
            json!({"exec": {"command": ["/bin/sh", "-c", "echo s3cr3t-token; sleep 100"]}}),
        ),
    );
    let p = h.launch_desired(&t).await;
    let t0 = now_ns();
    h.workers.upsert(t.deleted(3));
    h.wait_state(&p.uid, PodPhase::Finished, LIMIT).await;
    let st = h.status(p.container_id("app")).await;
    // hook cut at 3 s, then the 2 s floor
    assert_stopped(&st, t0, 137, 5.0..6.5);
    let ev = h.drain_events();
    let failed: Vec<_> = ev
        .iter()
        .filter(|e| e.reason.as_str() == "FailedPreStopHook")
        .collect();
    assert_eq!(failed.len(), 1, "{ev:?}");
    assert!(
        ev.iter().all(|e| !e.message.contains("s3cr3t")),
        "hook output leaked into an event"
    );
    h.assert_gone(&p.uid).await;
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_and_sleep_prestop_hooks_run_before_sigterm() {
    let h = Harness::new("hooks").await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (seen_tx, mut seen_rx) = tokio::sync::mpsc::channel::<(i64, String)>(4);
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        while let Ok((mut s, _)) = listener.accept().await {
            let mut buf = vec![0u8; 4096];
            let n = s.read(&mut buf).await.unwrap_or(0);
            let head = String::from_utf8_lossy(&buf[..n]).to_string();
            let _ = seen_tx.send((now_ns(), head)).await;
            let _ = s
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok")
                .await;
        }
    });
    let t = PodTemplate::new("hooks", 30)
        .container(ContainerTemplate::new("web", TRAPS_TERM).pre_stop(json!({
            "httpGet": {"port": port, "path": "/shutdown", "httpHeaders": [{"name": "X-Test", "value": "1"}]}
        })))
        .container(ContainerTemplate::new("sleeper", TRAPS_TERM).pre_stop(json!({"sleep": {"seconds": 1}})));
    let p = h.launch_desired(&t).await;
    let t0 = now_ns();
    h.workers.upsert(t.deleted(30));
    h.wait_state(&p.uid, PodPhase::Finished, LIMIT).await;
    let (at, head) = seen_rx
        .try_recv()
        .expect("the httpGet hook reached the server");
    assert!(head.starts_with("GET /shutdown HTTP/1.1"), "{head}");
    assert!(head.to_ascii_lowercase().contains("x-test: 1"), "{head}");
    let web = h.status(p.container_id("web")).await;
    assert_eq!(web.exit_code, 0);
    assert!(at <= web.finished_at, "SIGTERM before the http hook");
    let sleeper = h.status(p.container_id("sleeper")).await;
    assert_eq!(sleeper.exit_code, 0);
    assert!(
        secs(sleeper.finished_at - t0) >= 1.0,
        "SIGTERM before the sleep hook ended"
    );
    h.assert_gone(&p.uid).await;
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sidecars_stop_after_main_containers_in_reverse_order() {
    let h = Harness::new("sidecar").await;
    let slow = "trap 'sleep 1; exit 0' TERM; sleep 3600 & wait $!";
    let t = PodTemplate::new("sidecar", 30)
        .sidecar(ContainerTemplate::new("first", TRAPS_TERM))
        .sidecar(ContainerTemplate::new("second", TRAPS_TERM))
        .container(ContainerTemplate::new("main", slow));
    let p = h.launch_desired(&t).await;
    h.workers.upsert(t.deleted(30));
    h.wait_state(&p.uid, PodPhase::Finished, LIMIT).await;
    let main = h.status(p.container_id("main")).await;
    let second = h.status(p.container_id("second")).await;
    let first = h.status(p.container_id("first")).await;
    assert_eq!(
        (main.exit_code, second.exit_code, first.exit_code),
        (0, 0, 0)
    );
    assert!(
        second.finished_at > main.finished_at,
        "sidecar stopped before the main container"
    );
    assert!(
        first.finished_at > second.finished_at,
        "sidecars not in reverse declaration order"
    );
    h.assert_gone(&p.uid).await;
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphan_is_stopped_with_grace_one_and_its_prestop_rebuilt_from_annotations() {
    let h = Harness::new("orphan").await;
    let marker_trap = "trap '[ -f /tmp/prestop ] && exit 0 || exit 3' TERM; sleep 3600 & wait $!";
    let t = PodTemplate::new("orphan", 600)
        .container(ContainerTemplate::new("stubborn", IGNORES_TERM))
        .container(
            ContainerTemplate::new("hooked", marker_trap)
                .pre_stop(json!({"exec": {"command": ["/bin/sh", "-c", "touch /tmp/prestop"]}})),
        );
    let p = launch(&h.tb, &t).await.unwrap();
    let t0 = now_ns();
    // the desired set is known and does not have this pod
    h.desire(vec![]);
    // read as each exits: the finished orphan's containers go with its sandbox right after
    let ids = [p.container_id("stubborn"), p.container_id("hooked")];
    let (v, exited) = tokio::join!(
        h.wait_state(&p.uid, PodPhase::Finished, LIMIT),
        h.exited(&ids, LIMIT)
    );
    assert_eq!(v.grace, Some(1));
    assert_eq!(v.reason, Some(KillReason::Orphan));
    let (stubborn, hooked) = (&exited[0], &exited[1]);
    assert_stopped(stubborn, t0, 137, 2.0..4.5);
    assert_eq!(
        hooked.exit_code, 0,
        "the preStop from the annotation did not run first"
    );
    h.assert_gone(&p.uid).await;
    // a finished orphan's sandbox is garbage-collected
    let start = tokio::time::Instant::now();
    loop {
        use reaplet::cri::Runtime;
        let left = h.client.list_sandboxes(Some(p.uid.as_str())).await.unwrap();
        if left.is_empty() {
            break;
        }
        assert!(
            start.elapsed() < LIMIT,
            "orphan sandbox never removed: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_orphans_before_the_desired_set_is_known() {
    let h = Harness::new("unsynced").await;
    let t = PodTemplate::new("unsynced", 30).container(ContainerTemplate::new("app", TRAPS_TERM));
    let p = launch(&h.tb, &t).await.unwrap();
    h.workers.relist().await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        h.workers.view(&p.uid),
        None,
        "acted on an orphan before the first pod list"
    );
    use reaplet::cri::Runtime;
    let cs = h
        .client
        .list_containers(Some(p.uid.as_str()))
        .await
        .unwrap();
    assert!(
        cs.iter()
            .all(|c| c.state == reaplet::cri::ContainerRunState::Running)
    );
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn natural_completion_terminates_on_its_own() {
    let h = Harness::new("complete").await;
    let mut done = PodTemplate::new("done", 30).container(ContainerTemplate::new("job", "exit 0"));
    done.restart_policy = "Never";
    let mut failing =
        PodTemplate::new("failing", 30).container(ContainerTemplate::new("job", "exit 1"));
    failing.restart_policy = "OnFailure";
    let pd = launch(&h.tb, &done).await.unwrap();
    let pf = launch(&h.tb, &failing).await.unwrap();
    h.desire(vec![done.pod_info(), failing.pod_info()]);
    let v = h.wait_state(&pd.uid, PodPhase::Finished, LIMIT).await;
    assert_eq!(v.reason, Some(KillReason::Completed));
    h.assert_gone(&pd.uid).await;
    // OnFailure with a failed container would be restarted: not complete, for the whole
    // window (several relists)
    let window = std::time::Instant::now();
    while window.elapsed() < Duration::from_millis(2500) {
        assert_eq!(h.workers.view(&pf.uid).unwrap().phase, PodPhase::Sync);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_runtime_labels_are_skipped_never_touched() {
    let h = Harness::new("hostile").await;
    let mut client = h.client.raw();
    let cfg = pb::PodSandboxConfig {
        metadata: Some(pb::PodSandboxMetadata {
            name: "evil".into(),
            uid: "../../etc".into(),
            namespace: "default".into(),
            attempt: 0,
        }),
        labels: [("io.kubernetes.pod.uid".to_owned(), "../../etc".to_owned())].into(),
        log_directory: h.tb.dir.join("logs/evil").display().to_string(),
        linux: Some(pb::LinuxPodSandboxConfig {
            cgroup_parent: format!("{}/kubepods/besteffort/podevil", h.tb.cgroup_root),
            security_context: Some(pb::LinuxSandboxSecurityContext {
                namespace_options: Some(pb::NamespaceOption {
                    network: pb::NamespaceMode::Node as i32,
                    pid: pb::NamespaceMode::Container as i32,
                    ipc: pb::NamespaceMode::Pod as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    std::fs::create_dir_all(h.tb.dir.join("logs/evil")).unwrap();
    let id = client
        .run_pod_sandbox(pb::RunPodSandboxRequest {
            config: Some(cfg),
            runtime_handler: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .pod_sandbox_id;
    h.desire(vec![]);
    h.workers.relist().await.unwrap();
    // for the whole window (several relists): no worker, and the sandbox untouched
    use reaplet::cri::Runtime;
    let window = std::time::Instant::now();
    while window.elapsed() < Duration::from_millis(2500) {
        assert!(
            h.workers.snapshot().is_empty(),
            "{:?}",
            h.workers.snapshot()
        );
        let sbs = h.client.list_sandboxes(None).await.unwrap();
        assert!(
            sbs.iter().any(|s| s.id == id && s.ready),
            "the hostile sandbox was touched"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_left_in_the_pod_cgroup_are_killed_and_the_cgroup_removed() {
    use std::os::unix::process::ExitStatusExt;
    let h = Harness::new("leftover").await;
    let t = PodTemplate::new("leftover", 30).container(ContainerTemplate::new("app", TRAPS_TERM));
    let p = launch(&h.tb, &t).await.unwrap();
    // a process the runtime does not know about, left in the pod cgroup (as a reparented
    // child of a container would be)
    let mut child = std::process::Command::new("sleep")
        .arg("1000")
        .spawn()
        .unwrap();
    let pid = child.id();
    for dir in h.pod_cgroups(&p.uid) {
        let d = dir.join("leftover");
        std::fs::create_dir(&d).unwrap();
        // cpuset needs cpus/mems configured first; the other hierarchies take the pid as is
        let _ = std::fs::write(d.join("cgroup.procs"), pid.to_string());
    }
    let membership = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    assert!(membership.contains("leftover"), "{membership}");
    let reaper = std::thread::spawn(move || child.wait().unwrap());
    h.desire(vec![t.pod_info()]);
    h.workers.upsert(t.deleted(30));
    h.wait_state(&p.uid, PodPhase::Finished, LIMIT).await;
    let status = reaper.join().unwrap();
    assert_eq!(
        status.signal(),
        Some(9),
        "the leftover process was not SIGKILLed: {status:?}"
    );
    h.assert_gone(&p.uid).await;
    h.shutdown().await;
}

/// Issue 45 §3: container restart rules (`ContainerRestartRules`, on since v1.35) decide
/// completion as the kubelet's `getPhase` does: a container whose own `restartPolicy: Never`
/// overrides the pod's `Always` makes the pod complete when it exits; a `Restart` rule
/// matching the exit code keeps a `Never` pod from completing (the kubelet restarts that
/// container), for the whole window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn container_restart_rules_decide_whether_a_pod_completes() {
    let h = Harness::new("rules").await;
    let with = |t: &PodTemplate, f: &dyn Fn(&mut serde_json::Value)| {
        let mut obj = t.api_object();
        f(&mut obj);
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(obj).unwrap();
        reaplet::pod::PodInfo::from_api(&pod).unwrap()
    };
    // the pod says Always, the container Never: it completes
    let own = PodTemplate::new("own-never", 30).container(ContainerTemplate::new("job", "exit 1"));
    // the pod says Never, a rule restarts exit 42: it does not complete
    let mut retried =
        PodTemplate::new("retried", 30).container(ContainerTemplate::new("job", "exit 42"));
    retried.restart_policy = "Never";
    let po = launch(&h.tb, &own).await.unwrap();
    let pr = launch(&h.tb, &retried).await.unwrap();
    h.desire(vec![
        with(&own, &|o| {
            o["spec"]["containers"][0]["restartPolicy"] = "Never".into()
        }),
        with(&retried, &|o| {
            o["spec"]["containers"][0]["restartPolicy"] = "Never".into();
            o["spec"]["containers"][0]["restartPolicyRules"] = serde_json::json!([
                {"action": "Restart", "exitCodes": {"operator": "In", "values": [42]}}
            ]);
        }),
    ]);
    let v = h.wait_state(&po.uid, PodPhase::Finished, LIMIT).await;
    assert_eq!(v.reason, Some(KillReason::Completed));
    let window = std::time::Instant::now();
    while window.elapsed() < Duration::from_millis(2500) {
        assert_eq!(h.workers.view(&pr.uid).unwrap().phase, PodPhase::Sync);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    h.shutdown().await;
}
