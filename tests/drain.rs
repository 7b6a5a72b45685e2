//! `reaplet drain` and `reaplet make-room` (the binary, with an admin's kubeconfig) against the
//! in-process API server, with reaplet's agent ending the evicted pods on a real containerd
//! (privileged: needs root). The order of evictions the API server saw must be the plan's; a
//! budget that allows nothing holds its pods and `--timeout` ends the drain non-zero;
//! make-room ends exactly the planned victims; on a terminal the live table renders and ends.

mod common;

use common::api_harness::{ApiHarness, NODE};
use common::apiserver::{ApiServer, User};
use common::*;
use reaplet_testbed::{ContainerTemplate, PodTemplate, TRAPS_TERM};
use serde_json::{Value, json};
use std::process::Command;
use std::time::{Duration, Instant};

struct Spec {
    name: &'static str,
    owner: Option<(&'static str, &'static str)>,
    priority: i32,
    ready: bool,
    restarts: i32,
    cpu: &'static str,
    labels: Value,
    started_ago: i64,
}

fn spec(name: &'static str) -> Spec {
    Spec {
        name,
        owner: None,
        priority: 0,
        ready: true,
        restarts: 0,
        cpu: "0",
        labels: json!({}),
        started_ago: 100,
    }
}

/// `secs` before one fixed instant of the test run: pods given the same age have exactly the
/// same timestamps (the ranking breaks a tie between two different times in one log2 bucket by
/// UID, so equal times are what lets a later rule decide).
fn ago(secs: i64) -> String {
    static BASE: std::sync::OnceLock<jiff::Timestamp> = std::sync::OnceLock::new();
    BASE.get_or_init(jiff::Timestamp::now)
        .checked_sub(jiff::SignedDuration::from_secs(secs))
        .unwrap()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// Launches the pod in the API and the runtime; returns its UID.
async fn launch(api: &ApiServer, h: &ApiHarness, s: &Spec) -> String {
    let t = PodTemplate::new(s.name, 30).container(ContainerTemplate::new("app", TRAPS_TERM));
    let mut obj = t.api_object();
    obj["metadata"]["labels"] = s.labels.clone();
    obj["spec"]["priority"] = s.priority.into();
    obj["spec"]["containers"][0]["resources"] = json!({"requests": {"cpu": s.cpu}});
    if let Some((kind, name)) = s.owner {
        obj["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": kind,
            "name": name, "uid": "7c1d0a1e-0000-4000-8000-000000000002", "controller": true}]);
    }
    api.create_pod(obj);
    let (ready, restarts, started) = (s.ready, s.restarts, ago(s.started_ago));
    api.rewrite_pod("default", s.name, |p| {
        p["status"]["phase"] = "Running".into();
        p["status"]["startTime"] = started.clone().into();
        p["status"]["conditions"] = json!([{"type": "Ready",
            "status": if ready { "True" } else { "False" }, "lastTransitionTime": started}]);
        p["status"]["containerStatuses"] = json!([{"name": "app", "ready": ready,
            "restartCount": restarts, "image": "busybox", "imageID": "", "started": true,
            "state": {"running": {}}}]);
    });
    reaplet_testbed::launch(&h.tb, &t).await.unwrap();
    t.uid.clone()
}

async fn bed(name: &str) -> (ApiHarness, ApiServer, std::path::PathBuf) {
    let mut h = ApiHarness::new(name).await;
    let api = h.api.handle();
    api.add_node(json!({"metadata": {"name": NODE},
        "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"}}}));
    h.start_primary_agent().await;
    let dir = h.root.path().join("admin");
    std::fs::create_dir_all(&dir).unwrap();
    let kc = api.write_kubeconfig_as(&dir, &User::Admin);
    (h, api, kc)
}

fn evictions(api: &ApiServer) -> Vec<(String, u16, Instant)> {
    api.requests()
        .into_iter()
        .filter(|r| r.method == "POST" && r.path.ends_with("/eviction"))
        .map(|r| {
            let name = r.path.rsplit('/').nth(1).unwrap_or_default().to_owned();
            (name, r.status, r.at)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_evicts_in_the_planned_order_and_a_blocking_budget_times_it_out() {
    let (mut h, api, kc) = bed("drain").await;
    let web = Some(("ReplicaSet", "web"));
    let apis = Some(("ReplicaSet", "api"));
    let mut uids: std::collections::HashMap<&str, String> = std::collections::HashMap::new();
    for s in [
        Spec {
            owner: web,
            ..spec("web-1")
        },
        Spec {
            owner: web,
            ready: false,
            ..spec("web-2")
        },
        Spec {
            owner: web,
            restarts: 3,
            ..spec("web-3")
        },
        Spec {
            owner: apis,
            priority: 100,
            labels: json!({"app": "api"}),
            ..spec("api-1")
        },
        Spec {
            owner: Some(("DaemonSet", "logs")),
            ..spec("logs")
        },
    ] {
        uids.insert(s.name, launch(&api, &h, &s).await);
    }
    // a static pod's mirror (API only)
    let mut mirror = PodTemplate::new("etcd-testnode", 30)
        .container(ContainerTemplate::new("app", TRAPS_TERM))
        .api_object();
    mirror["metadata"]["annotations"]["kubernetes.io/config.mirror"] = "abc".into();
    api.create_pod(mirror);
    api.add_pdb(json!({
        "metadata": {"name": "api", "namespace": "default"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "api"}}},
        "status": {"disruptionsAllowed": 0, "currentHealthy": 1, "desiredHealthy": 1, "expectedPods": 1},
    }));
    wait_in_sync(&api).await;

    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_reaplet"))
        .args([
            "drain",
            "--node",
            NODE,
            "--output",
            "plain",
            "--timeout",
            "40s",
        ])
        .arg("--kubeconfig")
        .arg(&kc)
        .output()
        .unwrap();
    let took = started.elapsed();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    );
    println!("{stdout}{stderr}");
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert!(took >= Duration::from_secs(40), "{took:?}");
    assert!(stdout.contains("node testnode cordoned"), "{stdout}");
    assert!(
        stdout.contains("skip     default/logs: DaemonSet"),
        "{stdout}"
    );
    assert!(
        stdout.contains("skip     default/etcd-testnode: mirror"),
        "{stdout}"
    );
    // the plan, printed before anything was evicted
    let plan: Vec<&str> = stdout.lines().filter(|l| l.starts_with("wave")).collect();
    assert_eq!(
        plan,
        vec![
            "wave  1: default/web-2 (priority 0)",
            "wave  2: default/web-3 (priority 0)",
            "wave  3: default/web-1 (priority 0)",
            "wave  4: default/api-1 (priority 100)",
        ],
        "{stdout}"
    );
    assert!(
        stdout
            .contains("blocked      default/api-1: The disruption budget api needs 1 healthy pods"),
        "{stdout}"
    );
    assert!(
        stderr.contains("timed out") && stderr.contains("default/api-1"),
        "{stderr}"
    );
    // the API server saw the plan's order, each wave after the one before was gone
    let ev = evictions(&api);
    let first = |n: &str| {
        ev.iter()
            .find(|(m, _, _)| m == n)
            .map(|(_, s, at)| (*s, *at))
    };
    let order: Vec<&str> = {
        let mut seen: Vec<&str> = Vec::new();
        for (n, _, _) in &ev {
            if !seen.contains(&n.as_str()) {
                seen.push(n);
            }
        }
        seen
    };
    assert_eq!(order, vec!["web-2", "web-3", "web-1", "api-1"], "{ev:?}");
    for (prev, next) in [("web-2", "web-3"), ("web-3", "web-1")] {
        let gone = api
            .removed_at(&uids[prev])
            .unwrap_or_else(|| panic!("{prev} not removed"));
        assert!(
            first(next).unwrap().1 >= gone,
            "{next} evicted before {prev} was gone"
        );
    }
    assert!(
        ev.iter()
            .filter(|(n, _, _)| n == "api-1")
            .all(|(_, s, _)| *s == 429)
    );
    let tries = ev.iter().filter(|(n, _, _)| n == "api-1").count();
    assert!(
        tries <= 40 / 5 + 1,
        "{tries} eviction attempts of api-1 in 40 s"
    );
    assert!(api.get_pod("default", "api-1").is_some());
    assert!(api.get_pod("default", "logs").is_some());
    assert_eq!(api.get_node(NODE).unwrap()["spec"]["unschedulable"], true);
    h.stop_agent().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn make_room_ends_exactly_the_planned_victims() {
    let (mut h, api, kc) = bed("makeroom").await;
    for s in [
        Spec {
            priority: 10,
            cpu: "1",
            ..spec("high")
        },
        Spec {
            priority: 5,
            cpu: "1",
            ..spec("mid")
        },
        Spec {
            priority: 1,
            cpu: "1",
            started_ago: 500,
            ..spec("low-old")
        },
        Spec {
            priority: 1,
            cpu: "1",
            started_ago: 50,
            ..spec("low-new")
        },
    ] {
        launch(&api, &h, &s).await;
    }
    wait_in_sync(&api).await;
    // 4 cores in use; 1500m for priority 8: mid is reprieved, both low ones must go
    let run = |extra: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_reaplet"))
            .args(["make-room", "--node", NODE, "--output", "plain"])
            .args(["--cpu", "1500m", "--memory", "0", "--priority", "8"])
            .args(extra)
            .arg("--kubeconfig")
            .arg(&kc)
            .output()
            .unwrap();
        (
            out.status.code(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    };
    let (code, text) = run(&["--dry-run"]);
    assert_eq!(code, Some(0), "{text}");
    // each victim's line: who, why (then its start time and requests)
    let victims: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("victim"))
        .map(|l| l.split(';').next().unwrap_or_default())
        .collect();
    assert_eq!(
        victims,
        vec![
            "victim   default/low-old: priority 1 < 8",
            "victim   default/low-new: priority 1 < 8"
        ],
        "{text}"
    );
    assert!(evictions(&api).is_empty(), "a dry run evicted");
    let (code, text) = run(&["--timeout", "60s"]);
    println!("{text}");
    assert_eq!(code, Some(0), "{text}");
    let names: Vec<String> = evictions(&api).into_iter().map(|(n, _, _)| n).collect();
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(names.contains(&"low-old".into()) && names.contains(&"low-new".into()));
    for n in ["low-old", "low-new"] {
        assert!(api.get_pod("default", n).is_none(), "{n} still there");
    }
    for n in ["high", "mid"] {
        assert!(api.get_pod("default", n).is_some(), "{n} gone");
    }
    // more than the node has even without every lower-priority pod: nothing is evicted
    let out = Command::new(env!("CARGO_BIN_EXE_reaplet"))
        .args(["make-room", "--node", NODE, "--output", "plain"])
        .args(["--cpu", "3500m", "--memory", "0", "--priority", "8"])
        .arg("--kubeconfig")
        .arg(&kc)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot fit"));
    assert_eq!(evictions(&api).len(), 2);
    h.stop_agent().await;
}

/// On a terminal (util-linux `script` gives it a pty) the live table renders and the command
/// ends cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_terminal_the_live_table_renders_and_ends() {
    let (mut h, api, kc) = bed("drainpty").await;
    launch(
        &api,
        &h,
        &Spec {
            owner: Some(("ReplicaSet", "one")),
            ..spec("one-1")
        },
    )
    .await;
    wait_in_sync(&api).await;
    let cmd = format!(
        "{} drain --node {NODE} --timeout 60s --kubeconfig {}",
        env!("CARGO_BIN_EXE_reaplet"),
        kc.display()
    );
    let out = Command::new("script")
        .args(["-qec", &cmd, "/dev/null"])
        .output()
        .expect("util-linux script");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{text}");
    assert!(text.contains("\x1b[2K"), "no live table drawn: {text:?}");
    assert!(
        text.contains("terminating") || text.contains("evicting"),
        "{text:?}"
    );
    assert!(text.contains("gone 1"), "{text:?}");
    assert!(
        text.trim_end()
            .ends_with(&format!("node {NODE} drained: 1 pods evicted in"))
            || text.contains("node testnode drained: 1 pods evicted"),
        "{text:?}"
    );
    h.stop_agent().await;
}

/// Issue 28, item 7: the only way to fit the request is to evict a pod whose budget allows no
/// disruption (the scheduler picks such a victim when nothing else fits). The plan says so,
/// the Eviction API refuses it (429), and make-room, with no `--timeout`, stops at that refusal
/// with a message naming the budget and exits non-zero, instead of waiting for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn make_room_stops_at_a_victim_whose_budget_refuses_it() {
    let (mut h, api, kc) = bed("makeroompdb").await;
    launch(
        &api,
        &h,
        &Spec {
            priority: 1,
            cpu: "3",
            labels: json!({"app": "db"}),
            ..spec("db")
        },
    )
    .await;
    api.add_pdb(json!({
        "metadata": {"name": "db", "namespace": "default"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "db"}}},
        "status": {"disruptionsAllowed": 0, "currentHealthy": 1, "desiredHealthy": 1, "expectedPods": 1},
    }));
    wait_in_sync(&api).await;
    let mut child = Command::new(env!("CARGO_BIN_EXE_reaplet"))
        .args(["make-room", "--node", NODE, "--output", "plain"])
        .args(["--cpu", "2", "--memory", "0", "--priority", "8"])
        .arg("--kubeconfig")
        .arg(&kc)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let _g = KillOnDrop(child.id());
    // one refusal is all it takes; the bound is a retry's 5 s and the API round trips
    let limit = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < limit,
            "make-room still waits {:?} after a budget refused its victim",
            Duration::from_secs(20)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    assert_eq!(status.code(), Some(1), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("victim   default/db: priority 1 < 8;")
                && l.contains("requests cpu 3000m; violates budget db")),
        "{text}"
    );
    assert!(text.contains("PodDisruptionBudget db"), "{text}");
    let refused: Vec<u16> = evictions(&api).into_iter().map(|(_, c, _)| c).collect();
    assert_eq!(refused, vec![429], "one eviction, refused");
    assert!(api.get_pod("default", "db").is_some());
    h.stop_agent().await;
}

/// The pod `low` (priority 1, 3 cores requested) running, and the agent in sync with it.
async fn launch_low(api: &ApiServer, h: &ApiHarness) {
    launch(
        api,
        h,
        &Spec {
            priority: 1,
            cpu: "3",
            ..spec("low")
        },
    )
    .await;
    wait_in_sync(api).await;
}

/// Issue 29, items 4–6: what the room is for. A manifest's priorityClassName is resolved from
/// the API (named class, else the global default, else 0) and the plan says which; --priority
/// overrides it; a class that does not exist or a spec.priority that disagrees is refused as
/// admission refuses such a pod (exit 64); a resource not given is not requested; every
/// outcome (fits, victims, cannot fit) is one JSON document with the numbers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn make_room_resolves_the_pods_priority_and_answers_every_outcome_in_json() {
    let (mut h, api, kc) = bed("makeroomjson").await;
    launch_low(&api, &h).await;
    api.add_priority_class(
        json!({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
        "metadata": {"name": "urgent"}, "value": 50}),
    );
    let dir = h.root.path().join("manifests");
    std::fs::create_dir_all(&dir).unwrap();
    let manifest = |name: &str, spec: Value| {
        let f = dir.join(format!("{name}.yaml"));
        let mut pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "busybox",
                "resources": {"requests": {"cpu": "2"}}}]}});
        for (k, v) in spec.as_object().unwrap() {
            pod["spec"][k] = v.clone();
        }
        std::fs::write(&f, serde_json::to_string_pretty(&pod).unwrap()).unwrap();
        f.to_str().unwrap().to_owned()
    };
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_reaplet"))
            .args(["make-room", "--node", NODE, "--dry-run"])
            .args(args)
            .arg("--kubeconfig")
            .arg(&kc)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let json_of = |out: &str| -> Value {
        serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out:?}"))
    };

    // the class the pod names
    let urgent = manifest("urgent", json!({"priorityClassName": "urgent"}));
    let (code, out, err) = run(&["--for-pod", &urgent, "-o", "plain"]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(
        out.contains(
            "for a pod of priority 50 (PriorityClass urgent, named by the pod) requesting cpu 2000m"
        ),
        "{out}"
    );
    assert!(
        out.contains("victim   default/low: priority 1 < 50;"),
        "{out}"
    );
    // --priority overrides it: priority 1 is not lower than 1, nothing can go
    let (code, out, err) = run(&["--for-pod", &urgent, "--priority", "1", "-o", "json"]);
    assert_eq!(code, Some(1), "{out}{err}");
    let doc = json_of(&out);
    assert_eq!(doc["outcome"], "cannot fit", "{doc:#}");
    assert_eq!(doc["for"]["priority"], 1);
    assert_eq!(doc["for"]["prioritySource"]["from"], "flag");
    assert_eq!(doc["short"][0]["resource"], "cpu", "{doc:#}");
    assert_eq!(doc["short"][0]["short"], 1000, "{doc:#}");
    assert!(err.contains("cannot fit"), "{err}");
    // no class named and no global default: 0; with a global default: its value
    let plain = manifest("plain", json!({}));
    let (code, out, _) = run(&["--for-pod", &plain, "-o", "json"]);
    assert_eq!(code, Some(1));
    let doc = json_of(&out);
    assert_eq!(
        (
            &doc["for"]["priority"],
            &doc["for"]["prioritySource"]["from"]
        ),
        (&json!(0), &json!("none"))
    );
    api.add_priority_class(
        json!({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
        "metadata": {"name": "everyone"}, "value": 7, "globalDefault": true}),
    );
    let (code, out, err) = run(&["--for-pod", &plain, "-o", "json"]);
    assert_eq!(code, Some(0), "{out}{err}");
    let doc = json_of(&out);
    assert_eq!(doc["for"]["priority"], 7, "{doc:#}");
    assert_eq!(doc["for"]["prioritySource"]["class"], "everyone");
    assert_eq!(doc["outcome"], "victims");
    assert_eq!(doc["victims"][0]["pod"], "default/low");
    assert_eq!(doc["victims"][0]["requests"]["cpu"], "3000m");
    // fits already: a document too, with the numbers
    let (code, out, err) = run(&["--cpu", "500m", "--priority", "0", "-o", "json"]);
    assert_eq!(code, Some(0), "{out}{err}");
    let doc = json_of(&out);
    assert_eq!(doc["outcome"], "fits", "{doc:#}");
    assert_eq!(doc["for"]["requests"]["cpu"], "500m");
    assert_eq!(doc["for"]["requests"]["memory"], 0);
    assert_eq!(doc["allocatable"]["resources"]["cpu"], "4000m");
    assert_eq!(doc["requested"]["resources"]["cpu"], "3000m");
    // refused as admission refuses the pod, or a flag that is not a quantity: exit 64
    let missing = manifest("missing", json!({"priorityClassName": "nope"}));
    let (code, _, err) = run(&["--for-pod", &missing]);
    assert_eq!(code, Some(64), "{err}");
    assert!(
        err.contains("no PriorityClass with name nope was found"),
        "{err}"
    );
    let disagrees = manifest(
        "disagrees",
        json!({"priorityClassName": "urgent", "priority": 9}),
    );
    let (code, _, err) = run(&["--for-pod", &disagrees]);
    assert_eq!(code, Some(64), "{err}");
    assert!(
        err.contains("the integer value of priority (9) must not be provided in pod spec; priority admission controller computed 50"),
        "{err}"
    );
    let (code, _, err) = run(&["--memory", "1 Gi"]);
    assert_eq!(code, Some(64), "{err}");
    assert!(err.contains("--memory \"1 Gi\""), "{err}");
    // with -o json, a refusal before the plan is a document too
    let (code, out, _) = run(&["--for-pod", &missing, "-o", "json"]);
    assert_eq!(code, Some(64));
    assert_eq!(json_of(&out)["outcome"], "error", "{out}");
    // a resource the scheduler does not read is refused, not silently dropped
    let (code, _, err) = run(&["--request", "storage=1Gi"]);
    assert_eq!(code, Some(64), "{err}");
    assert!(err.contains("not a resource the scheduler checks"), "{err}");
    // preemptionPolicy: Never (the class has none): the scheduler would pick no victim
    let never = manifest(
        "never",
        json!({"priorityClassName": "urgent", "preemptionPolicy": "Never"}),
    );
    let (code, out, err) = run(&["--for-pod", &never, "-o", "json"]);
    assert_eq!(code, Some(1), "{out}{err}");
    assert_eq!(json_of(&out)["outcome"], "never preempts", "{out}");
    // ...and one that disagrees with its class's is refused as admission refuses it
    let clash = manifest(
        "clash",
        json!({"priorityClassName": "system-node-critical", "preemptionPolicy": "Never"}),
    );
    let (code, _, err) = run(&["--for-pod", &clash]);
    assert_eq!(code, Some(64), "{err}");
    assert!(
        err.contains("the string value of PreemptionPolicy (Never) must not be provided"),
        "{err}"
    );
    // a cordoned node: the plan says the scheduler would not place the pod there at all
    let mut node = api.get_node(NODE).unwrap();
    node["spec"]["unschedulable"] = true.into();
    api.add_node(node);
    let (code, out, err) = run(&["--for-pod", &urgent, "-o", "plain"]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(
        out.contains("note: the node is cordoned (spec.unschedulable)"),
        "{out}"
    );
    let (_, out, _) = run(&["--for-pod", &urgent, "-o", "json"]);
    assert_eq!(json_of(&out)["cordoned"], true, "{out}");
    // drain, too, answers a failure before its plan with a document
    let out = Command::new(env!("CARGO_BIN_EXE_reaplet"))
        .args(["drain", "--node", "no-such-node", "--dry-run", "-o", "json"])
        .arg("--kubeconfig")
        .arg(&kc)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let doc = json_of(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(doc["error"], "node no-such-node not found", "{doc}");
    assert!(evictions(&api).is_empty(), "a dry run evicted");
    h.stop_agent().await;
}

/// A pod being deleted still holds its requests until it is gone, as in the scheduler's cache
/// (the first make-room counted it as gone already): with 3 cores used by "low" and 1 by
/// "leaving" (Terminating) on a 4-core node, a 1-core pod does not fit without a victim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn make_room_counts_a_terminating_pods_requests_until_it_is_gone() {
    let (mut h, api, kc) = bed("makeroomleaving").await;
    launch_low(&api, &h).await;
    // no agent from here: nothing ends the terminating pod
    h.stop_agent().await;
    let mut leaving = PodTemplate::new("leaving", 30)
        .container(ContainerTemplate::new("app", TRAPS_TERM))
        .api_object();
    leaving["spec"]["priority"] = 5.into();
    leaving["spec"]["containers"][0]["resources"] = json!({"requests": {"cpu": "1"}});
    api.create_pod(leaving);
    let deleting = ago(1);
    api.rewrite_pod("default", "leaving", |p| {
        p["metadata"]["deletionTimestamp"] = deleting.clone().into();
        p["metadata"]["deletionGracePeriodSeconds"] = 30.into();
        p["status"]["phase"] = "Running".into();
    });
    let out = Command::new(env!("CARGO_BIN_EXE_reaplet"))
        .args([
            "make-room",
            "--node",
            NODE,
            "--output",
            "plain",
            "--dry-run",
        ])
        .args(["--cpu", "1", "--memory", "0", "--priority", "3"])
        .arg("--kubeconfig")
        .arg(&kc)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(0), "{text}");
    let victims: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("victim"))
        .map(|l| l.split(';').next().unwrap_or_default())
        .collect();
    assert_eq!(
        victims,
        vec!["victim   default/low: priority 1 < 3"],
        "{text}"
    );
    assert!(evictions(&api).is_empty(), "a dry run evicted");
}
