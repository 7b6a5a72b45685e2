//! This node's eviction sources (`src/eviction/`) against the in-process API server and a real
//! containerd (privileged: needs root): a NoExecute taint ends the pods that do not tolerate it
//! at once and the others at their `tolerationSeconds` from the taint's `timeAdded`, and
//! removing it spares the rest; relabelling the node evicts a pod whose required node affinity
//! no longer matches through the Eviction API, a PodDisruptionBudget holds another until it
//! allows, a DaemonSet pod is never evicted, and a label flapping back cancels.

mod common;

use common::api_harness::{ApiHarness, NODE};
use common::apiserver::{ApiServer, Recorded};
use common::*;
use reaplet::eviction::{AffinityConfig, EvictionConfig, selector::LabelSelector};
use reaplet_testbed::{ContainerTemplate, PodTemplate, TRAPS_TERM};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// How far a deletion may be from its due time (the bound).
const TOLERANCE: f64 = 0.5;

fn requests_for(api: &ApiServer, name: &str, method: &str, suffix: &str) -> Vec<Recorded> {
    api.requests()
        .into_iter()
        .filter(|r| {
            r.method == method
                && r.path == format!("/api/v1/namespaces/default/pods/{name}{suffix}")
        })
        .collect()
}

fn node(labels: Value, taints: Value) -> Value {
    json!({"metadata": {"name": NODE, "labels": labels}, "spec": {"taints": taints}})
}

/// Starts the agent; returns its status address (`/pods`).
async fn start(h: &mut ApiHarness, eviction: EvictionConfig) -> std::net::SocketAddr {
    let kc = h.api.write_kubeconfig(h.root.path(), NODE);
    let mut cfg = h.config(Some(reaplet::api::client_config(Some(&kc)).await.unwrap()));
    cfg.authority = reaplet::standby::AuthoritySetting::Primary;
    cfg.eviction = eviction;
    let addr = free_addr();
    cfg.metrics_bind_address = Some(addr);
    let cancel = h.cancel.clone();
    h.agent = Some(tokio::spawn(async move {
        reaplet::agent::run(cfg, cancel).await.unwrap();
    }));
    wait_watches(&h.api, 0).await;
    addr
}

async fn launch_with(
    api: &ApiServer,
    h: &ApiHarness,
    t: &PodTemplate,
    f: impl FnOnce(&mut Value),
) -> reaplet_testbed::LaunchedPod {
    let mut obj = t.api_object();
    f(&mut obj);
    api.create_pod(obj);
    // running and ready, as the kubelet would have reported it (PDBs count ready pods)
    api.rewrite_pod("default", &t.name, |p| {
        p["status"]["phase"] = "Running".into();
        p["status"]["conditions"] = json!([{"type": "Ready", "status": "True"}]);
    });
    reaplet_testbed::launch(&h.tb, t).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_noexecute_taint_ends_pods_in_order_at_their_times_and_its_removal_spares_the_rest() {
    let mut h = ApiHarness::new("taints").await;
    let api = h.api.handle();
    api.add_node(node(json!({}), json!([])));
    let tolerating = |secs: Option<i64>| {
        move |p: &mut Value| {
            let mut t = json!({"key": "maintenance", "operator": "Exists", "effect": "NoExecute"});
            if let Some(s) = secs {
                t["tolerationSeconds"] = s.into();
            }
            p["spec"]["tolerations"] = json!([t]);
        }
    };
    let names = ["intolerant", "two", "four", "forever", "spared"];
    // "spared" is due 10 s after timeAdded's whole second, 8 to 9 s after t0: at least 2 s
    // after the taint's removal at 6 s, for the removal's watch event to reach reaplet under load
    let secs = [None, Some(2), Some(4), None, Some(10)];
    let mut uids = Vec::new();
    for (i, n) in names.iter().enumerate() {
        let t = PodTemplate::new(n, 30).container(ContainerTemplate::new("app", TRAPS_TERM));
        uids.push(t.uid.clone());
        if i == 0 {
            launch_with(&api, &h, &t, |_| {}).await;
        } else {
            launch_with(&api, &h, &t, tolerating(secs[i])).await;
        }
    }
    start(
        &mut h,
        EvictionConfig {
            taint_manager: true,
            ..EvictionConfig::default()
        },
    )
    .await;
    wait_in_sync(&api).await;

    // the pods exist for a while; the taint was added a second before reaplet sees it
    // (timeAdded counts, not when reaplet saw it)
    tokio::time::sleep(Duration::from_secs(2)).await;
    let added = jiff::Timestamp::now()
        .checked_sub(jiff::SignedDuration::from_secs(1))
        .unwrap();
    let t0 = Instant::now();
    api.add_node(node(
        json!({}),
        json!([{"key": "maintenance", "effect": "NoExecute",
                "timeAdded": added.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()}]),
    ));
    // timeAdded has whole seconds: the due times count from the truncated second, a second
    // before t0
    let truncation = added.subsec_nanosecond() as f64 / 1e9 + 1.0;
    let due = [0.0, 2.0, 4.0];
    let mut seen = Vec::new();
    let start_wait = Instant::now();
    while seen.len() < 3 {
        assert!(
            start_wait.elapsed() < Duration::from_secs(15),
            "deletions seen: {seen:?}; requests: {:#?}",
            api.writes()
        );
        for (i, n) in names[..3].iter().enumerate() {
            if seen.iter().any(|(m, _)| m == n) {
                continue;
            }
            if let Some(d) = requests_for(&api, n, "DELETE", "").first() {
                // not tolerated: at once (from when the taint was seen); tolerated: counted
                // from timeAdded
                let at =
                    d.at.duration_since(t0).as_secs_f64() + if i == 0 { 0.0 } else { truncation };
                seen.push((n.to_string(), at));
                assert!(
                    (at - due[i]).abs() <= TOLERANCE,
                    "{n} deleted at {at:.3} s, due at {} s",
                    due[i]
                );
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!("taint deletions (s after timeAdded): {seen:?}");
    // in order, each after its condition
    for (i, n) in names[..3].iter().enumerate() {
        let patch = requests_for(&api, n, "PATCH", "/status");
        let cond = patch.iter().find(|p| {
            p.body["status"]["conditions"]
                .as_array()
                .is_some_and(|c| c.iter().any(|c| c["reason"] == "DeletionByTaintManager"))
        });
        let del = &requests_for(&api, n, "DELETE", "")[0];
        assert!(cond.is_some_and(|c| c.at <= del.at), "{n}: {patch:#?}");
        assert_eq!(
            del.body["preconditions"]["uid"],
            uids[i].as_str(),
            "{del:?}"
        );
    }
    // the taint goes at 6 s: "spared" (due 8 to 9 s) and "forever" stay for the whole window,
    // which ends past spared's due time
    let wait = Duration::from_secs(6).saturating_sub(t0.elapsed());
    tokio::time::sleep(wait).await;
    api.add_node(node(json!({}), json!([])));
    let removed = Instant::now();
    while removed.elapsed() < Duration::from_secs(5) {
        for n in ["forever", "spared"] {
            assert!(
                requests_for(&api, n, "DELETE", "").is_empty(),
                "{n} deleted {:?} after the taint's removal",
                removed.elapsed()
            );
            assert!(api.get_pod("default", n).is_some(), "{n} gone");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let events = api.events();
    let has = |reason: &str, msg: &str| {
        events.iter().any(|e| {
            e["reason"] == reason && e["message"].as_str().is_some_and(|m| m.contains(msg))
        })
    };
    assert!(
        has(
            "TaintManagerEviction",
            "Marking for deletion Pod default/two"
        ),
        "{events:#?}"
    );
    assert!(
        has(
            "TaintManagerEviction",
            "Cancelling deletion of Pod default/spared"
        ),
        "{events:#?}"
    );
    // the evicted pods end through the pipeline and their objects go
    wait_pods_gone(
        &api,
        &["intolerant", "two", "four"],
        Duration::from_secs(30),
        || format!("{:#?}", api.writes()),
    )
    .await;
    h.cancel.cancel();
    if let Some(a) = h.agent.take() {
        let _ = tokio::time::timeout(Duration::from_secs(10), a).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relabelling_evicts_through_the_eviction_api_and_a_pdb_holds_until_it_allows() {
    let mut h = ApiHarness::new("affinity").await;
    let api = h.api.handle();
    api.add_node(node(json!({"zone": "a"}), json!([])));
    let select_zone_a = |labels: Value| {
        move |p: &mut Value| {
            p["metadata"]["labels"] = labels;
            p["spec"]["nodeSelector"] = json!({"zone": "a"});
        }
    };
    let mk = |n: &str| PodTemplate::new(n, 30).container(ContainerTemplate::new("app", TRAPS_TERM));
    launch_with(&api, &h, &mk("web"), select_zone_a(json!({"app": "web"}))).await;
    launch_with(&api, &h, &mk("db"), select_zone_a(json!({"app": "db"}))).await;
    launch_with(&api, &h, &mk("agent"), |p| {
        select_zone_a(json!({"app": "agent"}))(p);
        p["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "DaemonSet",
            "name": "agent", "uid": "6b1c9f0e-0000-4000-8000-000000000001", "controller": true}]);
    })
    .await;
    api.add_pdb(json!({
        "metadata": {"name": "db", "namespace": "default"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "db"}}},
        "status": {"disruptionsAllowed": 0, "currentHealthy": 1, "desiredHealthy": 1, "expectedPods": 1},
    }));
    let settle = Duration::from_secs(2);
    let status = start(
        &mut h,
        EvictionConfig {
            node_affinity: Some(AffinityConfig {
                namespaces: vec![],
                selector: LabelSelector::default(),
                settle,
            }),
            ..EvictionConfig::default()
        },
    )
    .await;
    wait_in_sync(&api).await;
    let evictions = |n: &str| requests_for(&api, n, "POST", "/eviction");

    // a label flapping back within the settle delay cancels: no eviction for the whole window
    api.add_node(node(json!({"zone": "b"}), json!([])));
    tokio::time::sleep(settle / 4).await;
    api.add_node(node(json!({"zone": "a"}), json!([])));
    let flap = Instant::now();
    while flap.elapsed() < settle * 2 {
        for n in ["web", "db", "agent"] {
            assert!(
                evictions(n).is_empty(),
                "{n} evicted after the label flapped back"
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // relabelled for good: web is evicted after the settle delay, db is refused by its budget
    let t0 = Instant::now();
    api.add_node(node(json!({"zone": "b"}), json!([])));
    let deadline = Instant::now() + settle + Duration::from_secs(10);
    while evictions("web").is_empty() || evictions("db").is_empty() {
        assert!(Instant::now() < deadline, "{:#?}", api.requests());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let web = &evictions("web")[0];
    let after = web.at.duration_since(t0).as_secs_f64();
    assert!(
        after >= settle.as_secs_f64() - 0.1 && after <= settle.as_secs_f64() + TOLERANCE,
        "web evicted {after:.2} s after the relabel, settle {settle:?}"
    );
    assert_eq!(web.status, 201, "{web:?}");
    assert_eq!(evictions("db")[0].status, 429);
    wait_pods_gone(&api, &["web"], Duration::from_secs(30), || {
        format!("{:#?}", api.writes())
    })
    .await;
    // held while the budget allows nothing: retried with backoff, one event, no storm
    tokio::time::sleep(Duration::from_secs(8)).await;
    let tries = evictions("db");
    assert!(tries.iter().all(|r| r.status == 429), "{tries:#?}");
    assert!(
        tries.len() <= 3,
        "a retry storm: {} attempts in 8 s",
        tries.len()
    );
    let blocked: Vec<Value> = api
        .events()
        .into_iter()
        .filter(|e| e["reason"] == "EvictionBlocked")
        .collect();
    assert_eq!(blocked.len(), 1, "{blocked:#?}");
    assert!(
        blocked[0]["message"]
            .as_str()
            .is_some_and(|m| m.contains("disruption budget db")),
        "{blocked:#?}"
    );
    // `reaplet pods` shows it waiting on the budget
    let (code, body) = reaplet::server::fetch(status, "/pods").await.unwrap();
    assert_eq!(code, 200);
    let v: Value = serde_json::from_str(&body).unwrap();
    let pending = v["evictions"].as_array().cloned().unwrap_or_default();
    assert!(
        pending.iter().any(|e| e["pod"] == "default/db"
            && e["source"] == "node_affinity"
            && e["state"] == "blocked"
            && e["detail"]
                .as_str()
                .is_some_and(|d| d.contains("disruption budget db"))),
        "{pending:#?}"
    );
    // the budget allows one: evicted at the next retry
    api.add_pdb(json!({
        "metadata": {"name": "db", "namespace": "default"},
        "spec": {"minAvailable": 0, "selector": {"matchLabels": {"app": "db"}}},
        "status": {"disruptionsAllowed": 1, "currentHealthy": 1, "desiredHealthy": 0, "expectedPods": 1},
    }));
    wait_pods_gone(&api, &["db"], Duration::from_secs(60), || {
        format!("{:#?}", api.requests())
    })
    .await;
    assert!(evictions("db").iter().any(|r| r.status == 201));
    // the DaemonSet's pod is never evicted
    assert!(evictions("agent").is_empty());
    assert!(api.get_pod("default", "agent").is_some());
    h.cancel.cancel();
    if let Some(a) = h.agent.take() {
        let _ = tokio::time::timeout(Duration::from_secs(10), a).await;
    }
}

/// Issue 45 §1, node-pressure eviction as the kubelet's: the pods' cgroup limited to 512 MiB,
/// `evictionHard: memory.available 200Mi` (copied to `allocatableMemory.available`, the
/// default `enforceNodeAllocatable: [pods]`); a BestEffort pod takes 400 MB when the gate opens,
/// a Burstable pod holding less than its 64Mi request stands by. reaplet (primary) notices the
/// crossing within its one-second pass, evicts the BestEffort pod (over its request) with the
/// hard grace, writes what the real kubelet v1.36.5 wrote for a container that exits 0 on
/// SIGTERM (phase `Succeeded`, no reason, `DisruptionTarget`/`TerminationByKubelet` with the
/// message), records the Warning `Evicted` event with its annotations, keeps the object, and
/// evicts nothing else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_pressure_evicts_the_pod_over_its_request_as_the_kubelet_does() {
    use reaplet::cri::Runtime;
    use reaplet::pressure::manager::PressureSettings;
    use reaplet::pressure::thresholds::parse_threshold_config;
    use std::collections::BTreeMap;
    const LIMIT_BYTES: u64 = 512 << 20;
    let mut h = ApiHarness::new("pressure").await;
    let api = h.api.handle();
    let gate = common::gate::Gate::start().await;
    // tail keeps what it reads until its input ends; the sleep holds the input open, so the
    // memory stays taken until the pod is ended (without it, tail's exit frees it)
    let hog_script = format!(
        "trap 'exit 0' TERM; until wget -q -O /dev/null http://{}/hog; do sleep 0.1; done; \
         (head -c 400000000 /dev/zero; sleep 3600) | tail >/dev/null & sleep 3600 & wait $!",
        gate.addr
    );
    let hog = PodTemplate::new("hog", 30).container(ContainerTemplate::new("app", &hog_script));
    let mut calm =
        PodTemplate::new("calm", 30).container(ContainerTemplate::new("app", TRAPS_TERM));
    calm.qos = reaplet::pod::QosClass::Burstable;
    let hog_pod = launch_with(&api, &h, &hog, |_| {}).await;
    let calm_pod = launch_with(&api, &h, &calm, |p| {
        p["spec"]["containers"][0]["resources"] =
            json!({"requests": {"cpu": "10m", "memory": "64Mi"}});
    })
    .await;
    // the pods' cgroup (`kubepods` below the test bed's cgroup root) as reaplet reads it,
    // limited as the kubelet limits it to node allocatable
    let reader = common::crossing::host_reader(&h.tb.cgroup_root);
    let kubepods = reader.hierarchy().mount_point.join(
        reader
            .pods_cgroup()
            .strip_prefix("/")
            .unwrap_or(reader.pods_cgroup()),
    );
    let v1 = reader.hierarchy().version == reaplet::cgroups::CgroupVersion::V1;
    let limit_file = kubepods.join(if v1 {
        "memory.limit_in_bytes"
    } else {
        "memory.max"
    });
    std::fs::write(&limit_file, LIMIT_BYTES.to_string())
        .unwrap_or_else(|e| panic!("{}: {e}", limit_file.display()));
    // what a failure shows: both readings and the kernel's own figures for the pods' cgroup
    let diagnose = {
        let reader = reader.clone();
        let kubepods = kubepods.clone();
        move || {
            let files = if v1 {
                &[
                    "memory.usage_in_bytes",
                    "memory.limit_in_bytes",
                    "memory.failcnt",
                    "memory.oom_control",
                ][..]
            } else {
                &["memory.current", "memory.max", "memory.events"][..]
            };
            let kernel: Vec<String> = files
                .iter()
                .map(|f| {
                    let v =
                        std::fs::read_to_string(kubepods.join(f)).unwrap_or_else(|e| e.to_string());
                    format!(
                        "{f}: {}",
                        v.split_whitespace().collect::<Vec<_>>().join(" ")
                    )
                })
                .collect();
            format!(
                "{} ({:?}): {kernel:?}; observed now {:?}",
                kubepods.display(),
                reader.hierarchy().version,
                reader.observe()
            )
        }
    };
    let kc = h.api.write_kubeconfig(h.root.path(), NODE);
    let mut cfg = h.config(Some(reaplet::api::client_config(Some(&kc)).await.unwrap()));
    cfg.authority = reaplet::standby::AuthoritySetting::Primary;
    let hard: BTreeMap<String, String> =
        [("memory.available".to_string(), "200Mi".to_string())].into();
    cfg.pressure = Some(PressureSettings {
        thresholds: parse_threshold_config(
            &["pods".to_string()],
            &hard,
            &BTreeMap::new(),
            &BTreeMap::new(),
            &BTreeMap::new(),
        )
        .unwrap(),
        max_pod_grace_period: 0,
        pressure_transition_period: Duration::from_secs(300),
    });
    let cancel = h.cancel.clone();
    h.agent = Some(tokio::spawn(async move {
        reaplet::agent::run(cfg, cancel).await.unwrap();
    }));
    wait_watches(&h.api, 0).await;
    wait_in_sync(&api).await;
    // a few quiet passes: nothing is evicted without pressure
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        api.writes().iter().all(|r| !r.path.contains("/pods/")),
        "written without pressure: {:#?}",
        api.writes()
    );
    let client = h.tb.client();
    let exits = common::exits::Exits::watch(&client).await;
    // when the pods' cgroup crosses the threshold, watched here every 50 ms with the same
    // reading (allocatableMemory.available below 200Mi)
    let crossing = common::crossing::below(
        reader,
        common::crossing::Signal::AllocatableMemory,
        200 << 20,
    );
    let opened = reaplet::wall_ns();
    gate.open("hog");
    let st = exits
        .of(hog_pod.container_id("app"), Duration::from_secs(60), || {
            format!(
                "the hog was not evicted; writes {:#?}; events {:?}; {}",
                api.writes(),
                api.events()
                    .iter()
                    .map(|e| format!(
                        "{} {}: {}",
                        e["reason"], e["involvedObject"]["name"], e["message"]
                    ))
                    .collect::<Vec<_>>(),
                diagnose()
            )
        })
        .await;
    let crossed = tokio::time::timeout(Duration::from_secs(1), crossing)
        .await
        .expect("the test never saw the crossing")
        .unwrap();
    let after = (st.finished_at - crossed) as f64 / 1e9;
    println!(
        "the allocation crossed the threshold {:.2} s after the gate opened; the hog exited (0 on \
         SIGTERM) {after:.2} s after the crossing (reaplet's pass: every 1 s; the kubelet's: 10 s)",
        (crossed - opened) as f64 / 1e9
    );
    println!("after the eviction: {}", diagnose());
    assert_eq!(st.exit_code, 0);
    // one pass (1 s) and the kill (the trap exits at once); the rest is slack for a loaded
    // 2-core machine, and the 50 ms of this watch
    assert!(after < 3.0, "evicted {after:.2} s after the crossing");
    let t = Instant::now();
    let status = loop {
        if let Some(p) = requests_for(&api, "hog", "PATCH", "/status").first() {
            break p.body.clone();
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "no status: {:#?}",
            api.writes()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let st = &status["status"];
    assert_eq!(st["phase"], "Succeeded", "{status}");
    assert!(
        st.get("reason").is_none() && st.get("message").is_none(),
        "{status}"
    );
    let dt = st["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "DisruptionTarget")
        .unwrap_or_else(|| panic!("no DisruptionTarget: {status}"))
        .clone();
    assert_eq!(dt["reason"], "TerminationByKubelet");
    let message = dt["message"].as_str().unwrap().to_owned();
    assert!(
        message.starts_with(
            "The node was low on resource: memory. Threshold quantity: 200Mi, available: "
        ) && message.contains(". Container app was using ")
            && message.ends_with(", request is 0, has larger consumption of memory. "),
        "{message:?}"
    );
    let events = api.events();
    let evicted = events
        .iter()
        .find(|e| e["reason"] == "Evicted" && e["involvedObject"]["name"] == "hog")
        .unwrap_or_else(|| panic!("no Evicted event: {events:#?}"));
    assert_eq!(evicted["type"], "Warning");
    assert_eq!(evicted["message"], message.as_str());
    let ann = &evicted["metadata"]["annotations"];
    assert_eq!(ann["offending_containers"], "app", "{evicted}");
    assert_eq!(ann["starved_resource"], "memory", "{evicted}");
    assert!(
        ann["offending_containers_usage"]
            .as_str()
            .is_some_and(|u| u.ends_with("Ki") || u.ends_with("Mi"))
    );
    // the object kept, the bystander untouched, for a window past a next pass and cleanup
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(requests_for(&api, "hog", "DELETE", "").is_empty());
    assert!(api.get_pod("default", "hog").is_some());
    let calm_st = client
        .container_status(calm_pod.container_id("app"))
        .await
        .unwrap();
    assert_eq!(calm_st.state, reaplet::cri::ContainerRunState::Running);
    assert!(
        api.writes().iter().all(|r| !r.path.contains("/pods/calm")),
        "{:#?}",
        api.writes()
    );
    h.stop().await;
}
