//! reaplet against the Kubernetes API (the in-process API server in tests/common/apiserver.rs)
//! and a real containerd (privileged: needs root). Request sequences are asserted from the
//! server's request log.

mod common;

use common::api_harness::{ApiHarness, LIMIT, NODE};
use common::apiserver::{ApiServer, Recorded};
use common::exits::Exits;
use common::*;
use reaplet::cri::Runtime;
use reaplet::pod::PodUid;
use reaplet_testbed::{ContainerTemplate, IGNORES_TERM, PodTemplate, TRAPS_TERM, launch};
use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

/// reaplet's writes about one pod, without events.
fn pod_writes(api: &ApiServer, name: &str) -> Vec<Recorded> {
    api.writes()
        .into_iter()
        .filter(|r| {
            r.path
                .starts_with(&format!("/api/v1/namespaces/default/pods/{name}"))
        })
        .collect()
}

fn event_writes(api: &ApiServer) -> Vec<Recorded> {
    api.writes()
        .into_iter()
        .filter(|r| r.path.ends_with("/events"))
        .collect()
}

fn assert_status_then_delete(api: &ApiServer, name: &str, uid: &str, phase: &str, exit: i64) {
    let w = pod_writes(api, name);
    assert_eq!(
        w.len(),
        2,
        "expected exactly a status PATCH then a DELETE: {w:#?}"
    );
    let (patch, delete) = (&w[0], &w[1]);
    assert_eq!(patch.method, "PATCH");
    assert!(patch.path.ends_with("/status"), "{}", patch.path);
    assert!(
        patch
            .content_type
            .starts_with("application/strategic-merge-patch+json")
    );
    assert_eq!(patch.status, 200);
    assert_eq!(patch.body["metadata"]["uid"], uid);
    assert_eq!(patch.body["status"]["phase"], phase);
    assert_eq!(
        patch.body["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"],
        exit
    );
    let conds = patch.body["status"]["conditions"].as_array().unwrap();
    assert!(
        conds
            .iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "False")
    );
    assert!(
        conds
            .iter()
            .any(|c| c["type"] == "ContainersReady" && c["status"] == "False")
    );
    assert_eq!(delete.method, "DELETE");
    assert_eq!(delete.body["gracePeriodSeconds"], 0);
    assert_eq!(delete.body["preconditions"]["uid"], uid);
    assert_eq!(delete.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_trapping_pod_gets_succeeded_then_a_uid_guarded_delete() {
    let mut h = ApiHarness::new("api-trap").await;
    let t = PodTemplate::new("web", 30).container(ContainerTemplate::new("app", TRAPS_TERM));
    let p = launch(&h.tb, &t).await.unwrap();
    h.api.create_pod(t.api_object());
    let exits = Exits::watch(&h.tb.client()).await;
    h.start_agent().await;
    let t0 = now_ns();
    h.api.delete_pod("default", "web", None);
    h.wait_gone("web").await;
    let gone = now_ns();
    assert_status_then_delete(&h.api, "web", &t.uid, "Succeeded", 0);
    let st = exits.of(p.container_id("app"), LIMIT, String::new).await;
    assert_eq!(st.exit_code, 0);
    let events = event_writes(&h.api);
    let total = pod_writes(&h.api, "web").len() + events.len();
    println!(
        "API requests for one deleted pod: {total} (status 1, delete 1, events {}); delete → gone {:.0} ms",
        events.len(),
        (gone - t0) as f64 / 1e6
    );
    assert!(events.iter().any(|e| e.body["reason"] == "Killing"));
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_term_ignoring_pod_is_failed_137_after_its_grace() {
    let mut h = ApiHarness::new("api-ignore").await;
    let t = PodTemplate::new("stubborn", 3).container(ContainerTemplate::new("app", IGNORES_TERM));
    let p = launch(&h.tb, &t).await.unwrap();
    h.api.create_pod(t.api_object());
    let exits = Exits::watch(&h.tb.client()).await;
    h.start_agent().await;
    let t0 = now_ns();
    h.api.delete_pod("default", "stubborn", None);
    h.wait_gone("stubborn").await;
    assert_status_then_delete(&h.api, "stubborn", &t.uid, "Failed", 137);
    let st = exits.of(p.container_id("app"), LIMIT, String::new).await;
    assert_stopped(&st, t0, 137, 3.0..4.5);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_deleted_pod_is_an_orphan_killed_with_grace_one_and_nothing_is_sent() {
    let mut h = ApiHarness::new("api-force").await;
    let t = PodTemplate::new("forced", 600).container(ContainerTemplate::new("app", IGNORES_TERM));
    let p = launch(&h.tb, &t).await.unwrap();
    h.api.create_pod(t.api_object());
    let client = h.tb.client();
    let exits = Exits::watch(&client).await;
    h.start_agent().await;
    let t0 = now_ns();
    let (code, _) = h.api.delete_pod("default", "forced", Some(0));
    assert_eq!(code, 200);
    assert!(
        h.api.get_pod("default", "forced").is_none(),
        "grace 0 removes at once"
    );
    let st = exits
        .of(p.container_id("app"), LIMIT, || {
            "force-deleted pod still running".into()
        })
        .await;
    assert_stopped(&st, t0, 137, 2.0..4.5);
    // the whole window in which a status could be sent: until the worker has stopped the
    // sandbox (it reports the pod stopped then), and a status manager round after it
    let uid = t.uid.to_string();
    let start = Instant::now();
    while client
        .list_sandboxes(Some(&uid))
        .await
        .unwrap()
        .iter()
        .any(|s| s.ready)
    {
        assert!(
            start.elapsed() < LIMIT,
            "force-deleted pod's sandbox still ready"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        pod_writes(&h.api, "forced").is_empty(),
        "{:#?}",
        pod_writes(&h.api, "forced")
    );
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_completing_on_its_own_is_patched_succeeded_and_left_in_the_api() {
    let mut h = ApiHarness::new("api-job").await;
    let mut t =
        PodTemplate::new("job", 30).container(ContainerTemplate::new("main", "sleep 1; exit 0"));
    t.restart_policy = "Never";
    launch(&h.tb, &t).await.unwrap();
    h.api.create_pod(t.api_object());
    h.start_agent().await;
    let start = Instant::now();
    loop {
        let pod = h
            .api
            .get_pod("default", "job")
            .expect("a completed pod stays");
        if pod["status"]["phase"] == "Succeeded" {
            break;
        }
        assert!(start.elapsed() < LIMIT, "never patched Succeeded: {pod}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let w = pod_writes(&h.api, "job");
    assert_eq!(w.len(), 1, "one status patch, no delete: {w:#?}");
    assert_eq!(
        w[0].body["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"],
        0
    );
    assert!(h.api.get_pod("default", "job").is_some());
    h.stop().await;
}

fn spawn_h(h: &ApiHarness, extra: &[&str], log: &Path) -> Child {
    spawn_reaplet(&h.tb, &h.root.path().join("kubelet"), extra, log)
}

/// A container that notes SIGTERM in its log and then ignores it (SIGKILLed at its deadline).
const NOTES_TERM: &str = "trap 'echo got-term' TERM; while true; do sleep 0.2; done";

/// A preStop hook that writes `word` to the container's log.
fn hook_writing(word: &str) -> serde_json::Value {
    serde_json::json!({"exec": {"command": ["/bin/sh", "-c", format!("echo {word} > /proc/1/fd/1")]}})
}

/// How long a line a container wrote may take to reach its CRI log file (containerd copies
/// the output as it comes; slack for a loaded machine).
const LOGGED: Duration = Duration::from_secs(5);

/// The container's log (the CRI log file the test bed's runtime writes) once it holds `what`:
/// the copy lags the container's write, so a line is waited for, never read once (issue 44).
async fn container_log(h: &ApiHarness, t: &PodTemplate, container: &str, what: &str) -> String {
    let path =
        h.tb.dir
            .join("logs")
            .join(&t.uid)
            .join(container)
            .join("0.log");
    wait_logged(&path, what, LOGGED, String::new).await
}

/// The container's exit as the runtime announced it (within `LIMIT`).
async fn wait_exited(exits: &Exits, id: &str, log: &Path) -> reaplet::cri::ContainerDetail {
    exits
        .of(id, LIMIT, || {
            format!("container still running\n{}", tail(&read_log(log), 40))
        })
        .await
}

/// reaplet SIGKILLed 2 s into a 6 s grace and started again: the kill lands on the original
/// deadline (the first StopContainer's, from its durable record), within half a second, and
/// the preStop hook ran once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reaplet_killed_mid_termination_resumes_within_the_original_deadline() {
    let h = ApiHarness::new("api-restart").await;
    let t = PodTemplate::new("resumed", 6)
        .container(ContainerTemplate::new("app", NOTES_TERM).pre_stop(hook_writing("hook-ran")));
    let p = launch(&h.tb, &t).await.unwrap();
    h.api.create_pod(t.api_object());
    let kc = h.api.write_kubeconfig(h.root.path(), NODE);
    let log = h.root.path().join("reaplet.log");
    let kc_s = kc.display().to_string();
    let exits = Exits::watch(&h.tb.client()).await;
    let mut first = spawn_h(&h, &["--kubeconfig", &kc_s], &log);
    let _g1 = KillOnDrop(first.id());
    h.wait_watching(0).await;
    let t0 = now_ns();
    h.api.delete_pod("default", "resumed", None);
    tokio::time::sleep(Duration::from_secs(2)).await;
    first.kill().unwrap(); // SIGKILL
    first.wait().unwrap();
    let seen = watches(&h.api.requests());
    let mut second = spawn_h(&h, &["--kubeconfig", &kc_s], &log);
    let _g2 = KillOnDrop(second.id());
    h.wait_watching(seen).await;
    let st = wait_exited(&exits, p.container_id("app"), &log).await;
    let took = secs(st.finished_at - t0);
    assert_eq!(st.exit_code, 137);
    assert!(
        (6.0..6.5).contains(&took),
        "killed after {took:.3}s: not on the original deadline (6 s after the first SIGTERM)\n{}",
        tail(&read_log(&log), 40)
    );
    container_log(&h, &t, "app", "hook-ran").await;
    let out = container_log(&h, &t, "app", "got-term").await;
    assert_eq!(
        out.matches("hook-ran").count(),
        1,
        "the hook ran more than once: {out}"
    );
    assert!(out.contains("got-term"), "no SIGTERM: {out}");
    h.wait_gone("resumed").await;
    let w = pod_writes(&h.api, "resumed");
    assert_eq!(w.last().map(|r| r.method.as_str()), Some("DELETE"));
    second.kill().unwrap();
    second.wait().unwrap();
}

/// A pod deleted while reaplet was stopped, for longer than its grace: nothing was signalled,
/// so it gets a whole termination when reaplet starts (its preStop hook, SIGTERM, and the grace
/// with the 2 s floor from then), never an immediate SIGKILL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_deleted_while_reaplet_was_down_still_gets_its_prestop_and_sigterm() {
    let h = ApiHarness::new("api-down").await;
    let t = PodTemplate::new("missed", 3)
        .container(ContainerTemplate::new("app", NOTES_TERM).pre_stop(hook_writing("hook-ran")));
    let p = launch(&h.tb, &t).await.unwrap();
    h.api.create_pod(t.api_object());
    let kc = h.api.write_kubeconfig(h.root.path(), NODE);
    let log = h.root.path().join("reaplet.log");
    let kc_s = kc.display().to_string();
    h.api.delete_pod("default", "missed", None);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let exits = Exits::watch(&h.tb.client()).await;
    let started = now_ns();
    let mut agent = spawn_h(&h, &["--kubeconfig", &kc_s], &log);
    let _g = KillOnDrop(agent.id());
    let st = wait_exited(&exits, p.container_id("app"), &log).await;
    assert_eq!(st.exit_code, 137);
    let took = secs(st.finished_at - started);
    assert!(
        took >= 2.0,
        "SIGKILLed {took:.3}s after start: sooner than the 2 s floor"
    );
    let out = container_log(&h, &t, "app", "hook-ran").await;
    assert!(out.contains("hook-ran"), "no preStop hook: {out}");
    let out = container_log(&h, &t, "app", "got-term").await;
    assert!(out.contains("got-term"), "no SIGTERM: {out}");
    agent.kill().unwrap();
    agent.wait().unwrap();
}

/// The API's deletionTimestamp is another machine's clock: with this node's clock 60 s ahead
/// of it, the deadline it implies has long passed, yet the pod gets its whole grace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deletion_timestamp_60s_behind_this_clock_still_gets_the_whole_grace() {
    let h = ApiHarness::new("api-skew").await;
    let t = PodTemplate::new("skewed", 4).container(ContainerTemplate::new("app", NOTES_TERM));
    let p = launch(&h.tb, &t).await.unwrap();
    h.api.create_pod(t.api_object());
    // deleted by an API server whose clock is 60 s behind this node's
    let dt = jiff::Timestamp::now() - jiff::SignedDuration::from_secs(60);
    h.api.rewrite_pod("default", "skewed", |p| {
        p["metadata"]["deletionTimestamp"] = dt.strftime("%Y-%m-%dT%H:%M:%SZ").to_string().into();
        p["metadata"]["deletionGracePeriodSeconds"] = 4.into();
    });
    let kc = h.api.write_kubeconfig(h.root.path(), NODE);
    let log = h.root.path().join("reaplet.log");
    let kc_s = kc.display().to_string();
    let exits = Exits::watch(&h.tb.client()).await;
    let started = now_ns();
    let mut agent = spawn_h(&h, &["--kubeconfig", &kc_s], &log);
    let _g = KillOnDrop(agent.id());
    let st = wait_exited(&exits, p.container_id("app"), &log).await;
    assert_eq!(st.exit_code, 137);
    let took = secs(st.finished_at - started);
    assert!(
        took >= 4.0,
        "SIGKILLed {took:.3}s after start: the 4 s grace was cut"
    );
    let out = container_log(&h, &t, "app", "got-term").await;
    assert!(out.contains("got-term"), "no SIGTERM: {out}");
    agent.kill().unwrap();
    agent.wait().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn static_manifest_source_runs_without_any_api_and_removal_terminates() {
    let h = ApiHarness::new("api-static").await;
    let dir = h.root.path().join("manifests");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("web.yaml");
    std::fs::write(
        &file,
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  terminationGracePeriodSeconds: 3\n  hostNetwork: true\n  containers:\n  - name: app\n    image: {}\n    command: [/bin/sh, -c, \"{IGNORES_TERM}\"]\n",
            reaplet_testbed::BUSYBOX_IMAGE
        ),
    )
    .unwrap();
    let info = reaplet::file_source::load(&file, NODE).unwrap();
    let mut t =
        PodTemplate::new(&info.name, 3).container(ContainerTemplate::new("app", IGNORES_TERM));
    t.uid = info.uid.to_string();
    let p = launch(&h.tb, &t).await.unwrap();
    let log = h.root.path().join("reaplet.log");
    let dir_s = dir.display().to_string();
    let mut child = spawn_h(&h, &["--pod-manifest-path", &dir_s], &log);
    let _g = KillOnDrop(child.id());
    // the static pod is desired: nothing happens to it, for the whole window
    let client = h.tb.client();
    let log_text = || read_log(&log);
    let (id, window) = (p.container_id("app"), Duration::from_secs(3));
    assert_runs_for(
        &client,
        id,
        window,
        "a desired static pod was stopped",
        log_text,
    )
    .await;
    let exits = Exits::watch(&client).await;
    let t0 = now_ns();
    std::fs::remove_file(&file).unwrap();
    let uid = PodUid::parse(&t.uid).unwrap();
    let cgroups = reaplet::cgroups::CgroupManager::from_mountinfo(
        Path::new("/proc/self/mountinfo"),
        h.tb.naming(),
    )
    .unwrap();
    let st = exits
        .of(p.container_id("app"), LIMIT, || {
            format!("static pod not terminated\n{}", read_log(&log))
        })
        .await;
    let took = secs(st.finished_at - t0);
    assert_eq!(st.exit_code, 137);
    assert!(
        took >= 3.0,
        "static pod killed after {took:.3}s, before its own grace of 3 s"
    );
    let start = Instant::now();
    while !cgroups.existing(&uid).unwrap().is_empty() {
        assert!(
            start.elapsed() < LIMIT,
            "static pod's cgroup left\n{}",
            read_log(&log)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        h.api.requests().is_empty(),
        "no API was configured, yet it was called"
    );
}

/// Stays on the imitation: the server must forget its watch history on demand (`compact`), so
/// that the resumed watch is answered 410 and reaplet must re-list to find the pod gone. The
/// real server forgets only through an etcd compaction followed by a restart of the API server
/// (its watch cache keeps its own window), and that restart is an outage of its own. The
/// real-server variant, a pod deleted for good while reaplet is cut off by a proxy (where the
/// watch may resume), is in `tests/api_outage.rs`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_deleted_while_not_watching_is_found_gone_on_relist_and_stopped_as_an_orphan() {
    let mut h = ApiHarness::new("api-relist").await;
    let t =
        PodTemplate::new("vanished", 600).container(ContainerTemplate::new("app", IGNORES_TERM));
    let p = launch(&h.tb, &t).await.unwrap();
    h.api.create_pod(t.api_object());
    let exits = Exits::watch(&h.tb.client()).await;
    h.start_agent().await;
    let lists_before = h
        .api
        .requests()
        .iter()
        .filter(|r| r.path == "/api/v1/pods" && !r.query.contains_key("watch"))
        .count();
    // blind reaplet, delete the pod for good, and forget the history: the watch must re-list
    h.api.refuse_connections_for(Duration::from_secs(3));
    // the open watch is cut asynchronously: let it go before the deletion, or its events can
    // still slip out on it (and no re-list is needed)
    tokio::time::sleep(Duration::from_millis(300)).await;
    h.api.delete_pod("default", "vanished", Some(0));
    h.api.compact();
    let st = exits
        .of(p.container_id("app"), LIMIT, || {
            "the vanished pod was never stopped".into()
        })
        .await;
    assert_eq!(st.exit_code, 137);
    let reqs = h.api.requests();
    let gone = reqs
        .iter()
        .filter(|r| r.status == 200 && r.query.get("watch").is_some_and(|w| w == "true"))
        .count();
    let lists_after = reqs
        .iter()
        .filter(|r| r.path == "/api/v1/pods" && !r.query.contains_key("watch"))
        .count();
    assert!(
        lists_after > lists_before,
        "no re-list after 410 Gone ({gone} watches)"
    );
    assert!(pod_writes(&h.api, "vanished").is_empty());
    h.stop().await;
}

/// The real server answers a status patch whose `metadata.uid` is not the stored pod's with 422
/// (`metadata.uid: field is immutable`), not 409: a pod recreated under the same name while
/// reaplet did not see it. The old pod's status is dropped at the first answer, never retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_for_a_pod_recreated_under_its_name_is_dropped_at_the_first_uid_conflict() {
    use reaplet::workers::StatusSink;
    let api = ApiServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let old = PodTemplate::new("same", 30).container(ContainerTemplate::new("app", TRAPS_TERM));
    let new = PodTemplate::new("same", 30).container(ContainerTemplate::new("app", TRAPS_TERM));
    api.create_pod(new.api_object());
    let (sm, cancel) = status_manager(&api, dir.path(), NODE).await;
    let finals = exited_app(0, "Completed");
    let mut info = old.pod_info();
    info.deletion_requested = true;
    sm.pod_terminated(
        &info,
        Some(&reaplet::lifecycle::KillReason::Deleted),
        &finals,
    );
    // the whole window in which backoff retries would come (1 s, then 2 s later)
    tokio::time::sleep(Duration::from_secs(4)).await;
    cancel.cancel();
    let patches: Vec<Recorded> = pod_writes(&api, "same");
    assert_eq!(patches.len(), 1, "{patches:#?}");
    assert_eq!(patches[0].status, 422);
    assert_eq!(sm.pending(), 0, "the old pod's status is still pending");
    let cur = api.get_pod("default", "same").unwrap();
    assert_eq!(cur["metadata"]["uid"], new.uid.as_str());
    assert!(cur["metadata"]["deletionTimestamp"].is_null());
}

/// On a kubeadm node the kubelet runs the control plane from its manifest directory: runtime
/// pods whose sandboxes say `kubernetes.io/config.source: file`, with mirror pods in the API
/// under another UID. reaplet (no manifest directory of its own) must never take them for
/// orphans, across a restart, nor stop one when its mirror pod is deleted; a real orphan (no
/// API pod, no static annotations) is still stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_static_pods_and_their_mirror_pods_are_never_touched() {
    let mut h = ApiHarness::new("api-static-kubelet").await;
    let etcd = PodTemplate::kubelet_static("etcd", NODE, 30)
        .container(ContainerTemplate::new("etcd", IGNORES_TERM));
    let ps = launch(&h.tb, &etcd).await.unwrap();
    let mirror = h.api.create_pod(etcd.mirror_object());
    let orphan =
        PodTemplate::new("orphan", 30).container(ContainerTemplate::new("app", IGNORES_TERM));
    let po = launch(&h.tb, &orphan).await.unwrap();
    h.start_agent().await;
    let client = h.tb.client();
    let running = |id: String| {
        let client = client.clone();
        async move { client.container_status(&id).await.unwrap().state.may_run() }
    };
    // the real orphan is stopped (with grace 1: within the 2 s floor and a relist or two)
    let start = Instant::now();
    while running(po.container_id("app").to_owned()).await {
        assert!(start.elapsed() < LIMIT, "the real orphan was never stopped");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // a restart, then the mirror pod deleted through the API; the static pod runs on through
    // the whole window (several relists and the mirror pod's deletion handled)
    h.restart_agent().await;
    let (code, _) = h.api.delete_pod("kube-system", &etcd.name, None);
    assert_eq!(code, 200);
    let (id, window) = (ps.container_id("etcd"), Duration::from_secs(5));
    let what = "the kubelet's static pod was stopped";
    assert_runs_for(&client, id, window, what, String::new).await;
    // nothing was written about the mirror pod either (the kubelet owns it)
    let writes: Vec<Recorded> = h
        .api
        .writes()
        .into_iter()
        .filter(|r| {
            r.path.contains(&format!("/pods/{}", etcd.name)) && r.user.starts_with("system:node")
        })
        .collect();
    assert!(
        writes.is_empty(),
        "reaplet wrote about a mirror pod: {writes:#?}"
    );
    assert_eq!(
        h.api.get_pod("kube-system", &etcd.name).unwrap()["metadata"]["uid"],
        mirror["metadata"]["uid"]
    );
    h.stop().await;
}

/// With a manifest directory of its own, reaplet matches each manifest to the runtime pod that
/// really carries it (namespace, `<name>-<node>`, `kubernetes.io/config.source: file`), not to
/// a hash only reaplet computes: a static pod the kubelet started (its UID the kubelet's hash)
/// is desired, not an orphan, and removing its manifest ends it with its own grace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manifest_is_matched_to_the_static_pod_the_runtime_really_runs() {
    let h = ApiHarness::new("api-static-match").await;
    let dir = h.root.path().join("manifests");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("web.yaml");
    std::fs::write(
        &file,
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  terminationGracePeriodSeconds: 3\n  hostNetwork: true\n  containers:\n  - name: app\n    image: {}\n    command: [/bin/sh, -c, \"{IGNORES_TERM}\"]\n",
            reaplet_testbed::BUSYBOX_IMAGE
        ),
    )
    .unwrap();
    // started by the kubelet: its own config hash as the UID, not reaplet's
    let mut t = PodTemplate::kubelet_static("web", NODE, 3)
        .container(ContainerTemplate::new("app", IGNORES_TERM));
    t.namespace = "default".into();
    let ours = reaplet::file_source::load(&file, NODE).unwrap();
    assert_ne!(
        ours.uid.as_str(),
        t.uid,
        "the test needs a UID reaplet would not compute"
    );
    let p = launch(&h.tb, &t).await.unwrap();
    let log = h.root.path().join("reaplet.log");
    let dir_s = dir.display().to_string();
    let mut child = spawn_h(&h, &["--pod-manifest-path", &dir_s], &log);
    let _g = KillOnDrop(child.id());
    let client = h.tb.client();
    // desired: it runs on for the whole window (several scans and relists)
    let log_text = || read_log(&log);
    let (id, window) = (p.container_id("app"), Duration::from_secs(4));
    assert_runs_for(&client, id, window, "the static pod was stopped", log_text).await;
    let exits = Exits::watch(&client).await;
    let t0 = now_ns();
    std::fs::remove_file(&file).unwrap();
    let st = exits
        .of(p.container_id("app"), LIMIT, || {
            format!("static pod not terminated\n{}", read_log(&log))
        })
        .await;
    assert_stopped(&st, t0, 137, 3.0..8.0);
    child.kill().unwrap();
    child.wait().unwrap();
}

/// Only a failed precondition (409 naming the Kind, as the server answers a UID precondition
/// that no longer holds) means the pod was recreated; any other 409 is a conflict to retry. A
/// DELETE answered with a plain 409 once is sent again, and the object goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflict_that_is_not_a_failed_precondition_is_retried() {
    use common::apiserver::faults::{FaultRule, Match};
    let mut h = ApiHarness::new("api-conflict").await;
    let t = PodTemplate::new("contested", 30).container(ContainerTemplate::new("app", TRAPS_TERM));
    launch(&h.tb, &t).await.unwrap();
    h.api.create_pod(t.api_object());
    h.start_agent().await;
    h.api.inject(
        FaultRule::answer(409)
            .matching(
                Match::any()
                    .verb("delete")
                    .resource("pods")
                    .name("contested"),
            )
            .times(1),
    );
    h.api.delete_pod("default", "contested", None);
    h.wait_gone("contested").await;
    let deletes: Vec<u16> = pod_writes(&h.api, "contested")
        .iter()
        .filter(|r| r.method == "DELETE")
        .map(|r| r.status)
        .collect();
    assert_eq!(deletes, vec![409, 200], "{deletes:?}");
    h.stop().await;
}

/// Issue 45 §2: a pod past its `activeDeadlineSeconds` (counted from `status.startTime`) is
/// ended with its own grace, its status `Failed`/`DeadlineExceeded` with the kubelet's message
/// and no `DisruptionTarget`, a Normal `DeadlineExceeded` event, and its object is kept; a pod
/// beside it without a deadline runs on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_past_its_active_deadline_ends_failed_deadline_exceeded_and_is_kept() {
    const DEADLINE: i64 = 3;
    let mut h = ApiHarness::new("api-deadline").await;
    let t = PodTemplate::new("dl", 30).container(ContainerTemplate::new("app", TRAPS_TERM));
    let by = PodTemplate::new("by", 30).container(ContainerTemplate::new("app", TRAPS_TERM));
    let p = launch(&h.tb, &t).await.unwrap();
    let b = launch(&h.tb, &by).await.unwrap();
    let mut obj = t.api_object();
    obj["spec"]["activeDeadlineSeconds"] = DEADLINE.into();
    h.api.create_pod(obj);
    h.api.create_pod(by.api_object());
    // the kubelet's startTime: whole seconds
    let start = jiff::Timestamp::now().as_second();
    let started = jiff::Timestamp::from_second(start).unwrap().to_string();
    for name in ["dl", "by"] {
        h.api.rewrite_pod("default", name, |p| {
            p["status"]["startTime"] = started.clone().into();
            p["status"]["phase"] = "Running".into();
        });
    }
    let generation = h.api.get_pod("default", "dl").unwrap()["metadata"]["generation"].clone();
    let client = h.tb.client();
    let exits = Exits::watch(&client).await;
    h.start_agent().await;
    let st = exits
        .of(
            p.container_id("app"),
            Duration::from_secs(DEADLINE as u64) + LIMIT,
            || format!("not ended at its deadline; writes {:#?}", h.api.writes()),
        )
        .await;
    // SIGTERM at the deadline (checked every second), the trap exits 0 at once
    assert_stopped(
        &st,
        start * 1_000_000_000,
        0,
        DEADLINE as f64..DEADLINE as f64 + 4.0,
    );
    let t = Instant::now();
    let status = loop {
        let w = pod_writes(&h.api, "dl");
        if let Some(patch) = w
            .iter()
            .find(|r| r.method == "PATCH" && r.path.ends_with("/status"))
        {
            break patch.body.clone();
        }
        assert!(t.elapsed() < LIMIT, "no status written: {w:#?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(status["status"]["phase"], "Failed", "{status}");
    assert_eq!(status["status"]["reason"], "DeadlineExceeded", "{status}");
    assert_eq!(
        status["status"]["message"],
        "Pod was active on the node longer than the specified deadline"
    );
    assert_eq!(
        status["status"]["observedGeneration"], generation,
        "{status}"
    );
    let conds = status["status"]["conditions"].as_array().unwrap();
    assert!(
        conds.iter().all(|c| c["type"] != "DisruptionTarget"),
        "{status}"
    );
    assert!(conds.iter().all(|c| c["observedGeneration"] == generation));
    // the object is kept: no DELETE in the window in which one would follow the status (the
    // pipeline deletes right after the status of a pod it deletes) and more
    tokio::time::sleep(Duration::from_secs(3)).await;
    let w = pod_writes(&h.api, "dl");
    assert!(w.iter().all(|r| r.method != "DELETE"), "{w:#?}");
    assert!(h.api.get_pod("default", "dl").is_some());
    let events = h.api.events();
    assert!(
        events.iter().any(|e| e["reason"] == "DeadlineExceeded"
            && e["type"] == "Normal"
            && e["involvedObject"]["name"] == "dl"
            && e["message"] == "Pod was active on the node longer than the specified deadline"),
        "{events:#?}"
    );
    // the bystander runs on, nothing written about it
    let bst = client
        .container_status(b.container_id("app"))
        .await
        .unwrap();
    assert_eq!(bst.state, reaplet::cri::ContainerRunState::Running);
    assert!(pod_writes(&h.api, "by").is_empty());
    h.stop().await;
}
