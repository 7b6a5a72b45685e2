//! The kubelet's own reasons to end a pod, side by side with the real kubelet v1.36 on the
//! same node and the same pods (privileged: root, a private containerd 2.x, a real
//! kube-apiserver and etcd, the real kubelet): node-pressure eviction and
//! `activeDeadlineSeconds`. In each test the kubelet ends its pods first; then it is stopped
//! and reaplet (`--authority primary`) ends the others, pods of the same kinds.
//!
//! Node pressure: the kubelet's configuration leaves the pods 1 GiB (`kubeReserved` takes the
//! rest of the machine, so the pressure stays inside the pods' cgroup whatever else the
//! machine does) and sets `evictionHard: memory.available: 200Mi`, which the kubelet copies to
//! `allocatableMemory.available`; reaplet reads the same file.
//!
//! Four BestEffort pods take memory when the test says (a gate on loopback), a Burstable and a
//! Guaranteed pod stand by. The kubelet evicts the first two (one exits 0 on SIGTERM, one
//! ignores it); then the kubelet is stopped and reaplet (`--authority primary`) evicts the
//! other two, the same kinds. Compared pair by pair: the pod's final status (phase, reason,
//! message, conditions, container states; numbers aside), the Warning `Evicted` event and its
//! annotations, the node's `EvictionThresholdMet` event, the grace the TERM-ignoring pod got,
//! the object kept, nothing else evicted.

mod common;

use common::exits::Exits;
use common::gate::Gate;
use common::kube_node::{KubeNode, NODE, container_id, pod};
use reaplet::cri::Runtime;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// What the kubelet leaves the pods (its `kubepods` cgroup limit).
const PODS_BYTES: u64 = 1 << 30;
/// Each hog's allocation: working set above 824 MiB (1 GiB less the 200 MiB threshold), well
/// below the cgroup limit (the kernel's OOM killer stays out of it).
const HOG_BYTES: u64 = 900_000_000;
/// The kubelet decides every 10 s from cadvisor figures up to 10-15 s old; then it waits for
/// the pod's cleanup. Generous for a loaded 2-core machine.
const KUBELET_WINDOW: Duration = Duration::from_secs(90);
/// reaplet's pass is every second; slack for a loaded machine.
const REAPLET_WINDOW: Duration = Duration::from_secs(20);

fn mem_total() -> u64 {
    let m = std::fs::read_to_string("/proc/meminfo").unwrap();
    let kib: u64 = m
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("MemTotal");
    kib * 1024
}

/// A BestEffort pod that, once its gate opens, allocates [`HOG_BYTES`] and sleeps. On SIGTERM
/// it asks the gate for `<name>-term` (when it got the signal), then exits 0 (`trap`) or goes
/// on sleeping (`ignore`: only SIGKILL ends it).
fn hog(gate: &Gate, name: &str, exits_on_term: bool) -> Value {
    let term = format!("wget -q -O /dev/null http://{}/{name}-term", gate.addr);
    let on_term = if exits_on_term {
        format!("{term}; exit 0")
    } else {
        term
    };
    // tail keeps what it reads until its input ends; the sleep holds the input open, so the
    // memory stays taken until the pod is ended (without it, tail's exit frees it)
    let script = format!(
        "trap '{on_term}' TERM; until wget -q -O /dev/null http://{addr}/{name}; do sleep 0.1; done; \
         (head -c {HOG_BYTES} /dev/zero; sleep 3600) | tail >/dev/null & \
         while true; do sleep 3600 & wait $!; done",
        addr = gate.addr
    );
    let mut p = pod(name, 30, &script);
    p["spec"]["terminationGracePeriodSeconds"] = json!(30);
    p
}

fn bystander(name: &str, guaranteed: bool) -> Value {
    let mut p = pod(name, 30, reaplet::testbed::TRAPS_TERM);
    let r = json!({"cpu": "10m", "memory": "64Mi"});
    p["spec"]["containers"][0]["resources"] = if guaranteed {
        json!({"requests": r, "limits": r})
    } else {
        json!({"requests": r})
    };
    p
}

/// Every run of digits as `#`: the figures differ between two evictions, the words must not.
fn norm(v: &Value) -> Value {
    let Some(s) = v.as_str() else {
        return v.clone();
    };
    let mut out = String::with_capacity(s.len());
    let mut in_digits = false;
    for c in s.chars() {
        if c.is_ascii_digit() {
            if !in_digits {
                out.push('#');
            }
            in_digits = true;
        } else {
            out.push(c);
            in_digits = false;
        }
    }
    Value::String(out)
}

/// What of a pod's final status both agents must agree on.
fn digest(p: &Value) -> Value {
    let st = &p["status"];
    let mut conditions: Vec<Value> = st["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|c| {
            json!({"type": c["type"], "status": c["status"], "reason": c["reason"],
                   "message": norm(&c["message"])})
        })
        .collect();
    conditions.sort_by_key(|c| c["type"].as_str().unwrap_or("").to_owned());
    let containers: Vec<Value> = st["containerStatuses"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|c| {
            json!({"name": c["name"], "ready": c["ready"], "started": c["started"],
                   "exitCode": c["state"]["terminated"]["exitCode"],
                   "reason": c["state"]["terminated"]["reason"]})
        })
        .collect();
    json!({"phase": st["phase"], "reason": st["reason"], "message": norm(&st["message"]),
           "conditions": conditions, "containers": containers})
}

fn event_digest(e: &Value) -> Value {
    let ann = &e["metadata"]["annotations"];
    json!({"type": e["type"], "reason": e["reason"], "message": norm(&e["message"]),
    "kind": e["involvedObject"]["kind"],
    "annotations": {
        "offending_containers": ann["offending_containers"],
        "offending_containers_usage": norm(&ann["offending_containers_usage"]),
        "starved_resource": ann["starved_resource"],
    }})
}

async fn events(n: &KubeNode) -> Vec<Value> {
    let v = n
        .cluster
        .must("GET", "/api/v1/namespaces/default/events", None)
        .await;
    v["items"].as_array().cloned().unwrap_or_default()
}

/// What one agent did to one hog.
struct Eviction {
    /// From the crossing (the pods' cgroup below the threshold, read here every 50 ms) to the
    /// container's exit.
    after_crossing: f64,
    /// From SIGTERM (the gate's record of the trap's request) to the container's exit, where
    /// the pod reports its SIGTERM.
    grace: Option<f64>,
    exit_code: i32,
    status: Value,
    status_writes: usize,
    event: Value,
}

/// Prints both agents' figures for `case` and asserts what must be equal: the final status,
/// the event, the exit code.
fn compare(case: &str, k: &Eviction, r: &Eviction) {
    let grace = |e: &Eviction| e.grace.map_or("-".to_owned(), |g| format!("{g:.2} s"));
    println!(
        "{case}: -> exit: kubelet {:.2} s, reaplet {:.2} s ({:.2}x); SIGTERM -> exit: kubelet {}, \
         reaplet {}; exit code {} / {}; status writes {} / {}\n  kubelet status {}\n  reaplet \
         status {}\n  event {}",
        k.after_crossing,
        r.after_crossing,
        r.after_crossing / k.after_crossing,
        grace(k),
        grace(r),
        k.exit_code,
        r.exit_code,
        k.status_writes,
        r.status_writes,
        k.status,
        r.status,
        k.event
    );
    assert_eq!(r.status, k.status, "{case}: the final status");
    assert_eq!(r.event, k.event, "{case}: the event");
    assert_eq!(r.exit_code, k.exit_code, "{case}: exit code");
}

/// `name`'s terminal status as `who` left it (every container terminated) and its event of
/// `reason`.
async fn terminal(n: &KubeNode, name: &str, who: &str, reason: &str) -> (Value, Value) {
    let t0 = Instant::now();
    let status = loop {
        let p = n.get(name).await.expect("the pod's object is kept");
        let phase = p["status"]["phase"].as_str().unwrap_or("").to_owned();
        let done = p["status"]["containerStatuses"]
            .as_array()
            .is_some_and(|cs| cs.iter().all(|c| c["state"]["terminated"].is_object()));
        if (phase == "Succeeded" || phase == "Failed") && done {
            break p;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "{name}: no terminal status from {who} within 60 s: {:#}",
            p["status"]
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let t0 = Instant::now();
    let event = loop {
        let found = events(n)
            .await
            .into_iter()
            .find(|e| e["reason"] == reason && e["involvedObject"]["name"] == name);
        if let Some(e) = found {
            break e;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "{name}: no {reason} event from {who}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    (status, event)
}

/// The pods whose memory working set the kubelet's `/stats/summary` reports, read as an admin.
/// A pod missing there is ranked first by the kubelet (`exceedMemoryRequests` puts pods without
/// stats ahead), so a comparison of victims waits until every pod is there: on a node, pods
/// older than cAdvisor's housekeeping always are.
fn kubelet_stats_pods(n: &KubeNode) -> Result<Vec<String>, String> {
    let id = n.cluster.pki.client("stats-reader", &["system:masters"]);
    let out = std::process::Command::new("curl")
        // the kubelet serves a self-signed certificate
        .args(["-sS", "--max-time", "5", "-k", "--cert"])
        .arg(&id.cert)
        .arg("--key")
        .arg(&id.key)
        .arg(format!(
            "https://127.0.0.1:{}/stats/summary",
            n.kubelet.port
        ))
        .output()
        .map_err(|e| format!("curl: {e}"))?;
    let v: Value = serde_json::from_slice(&out.stdout).map_err(|e| {
        format!(
            "summary: {e}: {} {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    Ok(v["pods"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["memory"]["workingSetBytes"].is_u64())
        .filter_map(|p| p["podRef"]["name"].as_str().map(str::to_owned))
        .collect())
}

async fn wait_kubelet_stats(n: &KubeNode, names: &[&str]) {
    let t0 = Instant::now();
    loop {
        let got = kubelet_stats_pods(n);
        if got
            .as_ref()
            .is_ok_and(|g| names.iter().all(|w| g.iter().any(|x| x == w)))
        {
            eprintln!(
                "the kubelet's summary has every pod's stats after {:.1} s",
                t0.elapsed().as_secs_f64()
            );
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(90),
            "the kubelet's summary lacks pods' stats after 90 s: {got:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Opens `name`'s gate and waits for `who` ("kubelet/" or "reaplet/") to evict it.
async fn evict(
    n: &KubeNode,
    gate: &Gate,
    reader: &reaplet::pressure::signals::SignalReader,
    exits: &Exits,
    name: &str,
    who: &str,
    window: Duration,
) -> Eviction {
    let p = n.get(name).await.expect("the hog exists");
    let id = container_id(&p);
    // the kubelet's pass right after a cleanup can act on stale stats and take the next
    // ranked pod: a hog ended before its gate opened is named as such, not as a late crossing
    let before = n.client.container_status(&id).await;
    assert!(
        before.as_ref().is_ok_and(|st| st.state.may_run()),
        "{name} ended before its gate opened: {before:?}\nkubelet:\n{}",
        n.kubelet.log_grep(&["eviction_manager"], 20)
    );
    let crossing = common::crossing::allocatable_below(reader.clone(), 200 << 20);
    gate.open(name);
    // the kubelet removes an evicted pod's containers once it synced
    // (`ShouldPodContentBeRemoved`): read the exit from the runtime's event
    let st = exits
        .of(&id, window, || {
            format!(
                "{who} did not evict {name} within {window:?}; gate asked at {:?}, observed now {:?}; \
             pods' cgroup {:?}\nkubelet:\n{}\nreaplet:\n{}",
            gate.arrived(name),
            reader.observe(),
            [
                "memory.max_usage_in_bytes",
                "memory.failcnt",
                "memory.oom_control"
            ]
            .map(|f| {
                std::fs::read_to_string(
                    reader
                        .hierarchy()
                        .mount_point
                        .join(
                            reader
                                .pods_cgroup()
                                .strip_prefix("/")
                                .unwrap_or(reader.pods_cgroup()),
                        )
                        .join(f),
                )
                .unwrap_or_default()
                .replace('\n', " ")
            }),
            n.kubelet
                .log_grep(&["eviction", "Eviction", "E1", "W1"], 40),
            n.reaplet_tail(30)
        )
        })
        .await;
    let crossed = tokio::time::timeout(Duration::from_secs(1), crossing)
        .await
        .unwrap_or_else(|_| {
            panic!(
                "{name}: the test never saw the crossing; its exit {st:?} at +{:.2} s after the \
                 gate; observed now {:?}\nreaplet:\n{}\nkubelet:\n{}",
                gate.arrived(name)
                    .map_or(f64::NAN, |g| (st.finished_at - g) as f64 / 1e9),
                reader.observe(),
                n.reaplet_tail(40),
                n.kubelet
                    .log_grep(&["eviction", "Eviction", "E1", "W1"], 20),
            )
        })
        .unwrap();
    let term = gate
        .arrived(&format!("{name}-term"))
        .unwrap_or_else(|| panic!("{name}: no SIGTERM before its exit"));
    let (status, event) = terminal(n, name, who, "Evicted").await;
    let status_writes = n
        .pod_writes(who, name)
        .iter()
        .filter(|a| a.subresource == "status" && common::kube_node::received_ns(a) >= term)
        .count();
    Eviction {
        after_crossing: (st.finished_at - crossed) as f64 / 1e9,
        grace: Some((st.finished_at - term) as f64 / 1e9),
        exit_code: st.exit_code,
        status: digest(&status),
        status_writes,
        event: event_digest(&event),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "3 of 6 runs on 2026-12-05 failed: twice the bystanders were terminal (kubelet status \
            patches, containers removed) before reaplet started, once a reaplet hog ended before \
            its gate; cause not yet found; run with --ignored"]
async fn memory_pressure_evicts_the_same_pods_with_the_same_status_as_the_kubelet() {
    let reserved = mem_total() - PODS_BYTES;
    let eviction = format!(
        "evictionHard: {{memory.available: \"200Mi\", nodefs.available: \"1%\", imagefs.available: \"1%\"}}\n\
         kubeReserved: {{memory: \"{reserved}\"}}\n\
         enforceNodeAllocatable: [pods]"
    );
    let mut n = KubeNode::start_with("pressure-kubelet", &eviction).await;
    // the kubelet limits its pods' cgroup to capacity minus the reservations
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let hierarchies = reaplet::cgroups::hierarchies(&reaplet::volumes::parse_mountinfo(&mounts));
    let naming = reaplet::cgroups::CgroupNaming::new(
        reaplet::cgroups::CgroupDriver::Cgroupfs,
        &n.tb.cgroup_root,
    )
    .unwrap();
    let reader = reaplet::pressure::signals::SignalReader::host(&hierarchies, &naming).unwrap();
    let observed = reader.observe().allocatable_memory.expect("a pods' limit");
    assert_eq!(
        observed.capacity, PODS_BYTES as i64,
        "the kubelet's pods cgroup limit"
    );

    let gate = Gate::start().await;
    let exits = Exits::watch(&n.client).await;
    let hogs = [
        ("hog-k-trap", true),
        ("hog-k-ignore", false),
        ("hog-r-trap", true),
        ("hog-r-ignore", false),
    ];
    for (name, _) in hogs {
        // SIGTERM's record answers at once
        gate.open(&format!("{name}-term"));
    }
    // Priorities order the victims the same for both agents whatever the kubelet's stats say
    // at its decision (cAdvisor's figures of a hog may be seconds old, and the idle hogs also
    // exceed their request of 0): each agent's first victim is its trapping hog.
    for (i, (name, trap)) in hogs.into_iter().enumerate() {
        n.cluster
            .must(
                "POST",
                "/apis/scheduling.k8s.io/v1/priorityclasses",
                Some(&json!({
                    "apiVersion": "scheduling.k8s.io/v1",
                    "kind": "PriorityClass",
                    "metadata": {"name": name},
                    "value": 10 * (i + 1),
                })),
            )
            .await;
        let mut p = hog(&gate, name, trap);
        p["spec"]["priorityClassName"] = json!(name);
        n.create(&p).await;
    }
    n.create(&bystander("burstable", false)).await;
    n.create(&bystander("guaranteed", true)).await;
    let mut ids = Vec::new();
    for name in ["burstable", "guaranteed"]
        .into_iter()
        .chain(hogs.iter().map(|h| h.0))
    {
        let p = n.wait_running(name, Duration::from_secs(90)).await;
        ids.push((name, container_id(&p)));
    }
    let names: Vec<&str> = ids.iter().map(|(n, _)| *n).collect();
    wait_kubelet_stats(&n, &names).await;
    let quiet_since = reaplet::wall_ns();

    // the kubelet's two
    let k_trap = evict(
        &n,
        &gate,
        &reader,
        &exits,
        "hog-k-trap",
        "kubelet/",
        KUBELET_WINDOW,
    )
    .await;
    let k_ignore = evict(
        &n,
        &gate,
        &reader,
        &exits,
        "hog-k-ignore",
        "kubelet/",
        KUBELET_WINDOW,
    )
    .await;

    // reaplet's two, the kubelet stopped
    n.kubelet.stop();
    n.start_reaplet(&["--authority", "primary"]);
    n.wait_log("node-pressure eviction on", Duration::from_secs(30))
        .await;
    n.wait_log("pod list from the API server", Duration::from_secs(30))
        .await;
    let r_trap = evict(
        &n,
        &gate,
        &reader,
        &exits,
        "hog-r-trap",
        "reaplet/",
        REAPLET_WINDOW,
    )
    .await;
    let r_ignore = evict(
        &n,
        &gate,
        &reader,
        &exits,
        "hog-r-ignore",
        "reaplet/",
        REAPLET_WINDOW,
    )
    .await;

    for (case, k, r) in [
        ("exits 0 on SIGTERM", &k_trap, &r_trap),
        ("ignores SIGTERM", &k_ignore, &r_ignore),
    ] {
        compare(&format!("{case}, from the crossing"), k, r);
    }
    // the hard threshold's grace: 1 s, raised to the runtime's 2 s floor for both
    let (r_grace, k_grace) = (r_ignore.grace.unwrap(), k_ignore.grace.unwrap());
    assert!(
        r_grace >= 1.8 && r_grace < k_grace + 1.5,
        "reaplet's grace {r_grace:.2} s, the kubelet's {k_grace:.2} s"
    );
    // the node's event, from each agent
    let evs = events(&n).await;
    for who in ["kubelet", "reaplet"] {
        let node_events: Vec<&Value> = evs
            .iter()
            .filter(|e| {
                e["involvedObject"]["kind"] == "Node"
                    && e["involvedObject"]["name"] == NODE
                    && e["reason"] == "EvictionThresholdMet"
                    && e["source"]["component"]
                        .as_str()
                        .is_some_and(|c| c.contains(who))
            })
            .collect();
        assert!(
            node_events
                .iter()
                .any(|e| e["type"] == "Warning" && e["message"] == "Attempting to reclaim memory"),
            "no EvictionThresholdMet from the {who}: {:#?}",
            evs.iter()
                .filter(|e| e["involvedObject"]["kind"] == "Node")
                .collect::<Vec<_>>()
        );
    }
    // nothing else evicted, by either: the bystanders run, reaplet never wrote to them, and
    // what the kubelet (their owner until it stopped) wrote ended nothing
    for (name, id) in &ids[..2] {
        let st = n.client.container_status(id).await.unwrap_or_else(|e| {
            panic!(
                "{name}: {e:?}; writes to it: {:#?}\nreaplet:\n{}\nkubelet:\n{}",
                n.pod_writes("", name)
                    .iter()
                    .map(|a| a.line())
                    .collect::<Vec<_>>(),
                n.reaplet_tail(60),
                n.kubelet.log_grep(&["eviction_manager"], 30)
            )
        });
        assert!(st.state.may_run(), "{name} was ended: {st:?}");
        let obj = n.get(name).await.expect("the bystander is kept");
        assert_eq!(obj["status"]["phase"], "Running", "{name}: {obj:#}");
        let since = |a: &common::k8s::Audit| common::kube_node::received_ns(a) >= quiet_since;
        let r: Vec<_> = n
            .pod_writes("reaplet/", name)
            .into_iter()
            .filter(since)
            .collect();
        assert!(r.is_empty(), "reaplet wrote to {name}: {r:#?}");
        for a in n.pod_writes("kubelet/", name).into_iter().filter(since) {
            let st = &a.request["status"];
            let disrupted = st["conditions"]
                .as_array()
                .is_some_and(|cs| cs.iter().any(|c| c["type"] == "DisruptionTarget"));
            assert!(
                a.verb != "delete"
                    && !disrupted
                    && st["phase"] != "Failed"
                    && st["phase"] != "Succeeded",
                "the kubelet ended {name}: {a:#?}"
            );
        }
    }
    // the objects are kept
    for (name, _) in hogs {
        assert!(n.get(name).await.is_some(), "{name} deleted");
        for who in ["kubelet/", "reaplet/"] {
            assert!(
                n.pod_writes(who, name).iter().all(|a| a.verb != "delete"),
                "{who} deleted {name}"
            );
        }
    }
    n.stop_reaplet();
}

/// `activeDeadlineSeconds` on a TERM-trapping pod beside one without a deadline: the kubelet
/// ends its pod (5 s); then reaplet ends the other (60 s, past the kubelet's round and the
/// takeover). The same final status (Failed, `DeadlineExceeded`, no `DisruptionTarget`), the
/// same Normal event, the pod's own grace, the object kept, the bystander untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn active_deadline_ends_pods_as_the_kubelet_does() {
    let mut n = KubeNode::start("deadline-kubelet").await;
    let mut k = pod("dl-k", 30, reaplet::testbed::TRAPS_TERM);
    k["spec"]["activeDeadlineSeconds"] = json!(5);
    let mut r = pod("dl-r", 30, reaplet::testbed::TRAPS_TERM);
    r["spec"]["activeDeadlineSeconds"] = json!(60);
    let steady = pod("steady", 30, reaplet::testbed::TRAPS_TERM);
    // reaplet removes a finished pod's sandbox at its next relist: exits from the events
    let exits = Exits::watch(&n.client).await;
    for p in [&k, &r, &steady] {
        n.create(p).await;
    }
    let mut ids = Vec::new();
    for name in ["dl-k", "dl-r", "steady"] {
        let p = n.wait_running(name, Duration::from_secs(90)).await;
        ids.push(container_id(&p));
    }
    let quiet_since = reaplet::wall_ns();
    let k_end = deadline_end(
        &n,
        &exits,
        "dl-k",
        &ids[0],
        5,
        "kubelet/",
        Duration::from_secs(60),
    )
    .await;
    n.kubelet.stop();
    n.start_reaplet(&["--authority", "primary"]);
    let r_end = deadline_end(
        &n,
        &exits,
        "dl-r",
        &ids[1],
        60,
        "reaplet/",
        Duration::from_secs(90),
    )
    .await;
    compare("deadline (startTime has whole seconds)", &k_end, &r_end);
    // never before the deadline (startTime is cut to the second), and within a few passes
    assert!(
        r_end.after_crossing > -1.0 && r_end.after_crossing < 10.0,
        "reaplet ended it {:.2} s after the deadline",
        r_end.after_crossing
    );
    let st = n.client.container_status(&ids[2]).await.unwrap();
    assert!(st.state.may_run(), "the bystander was ended: {st:?}");
    for who in ["kubelet/", "reaplet/"] {
        let w: Vec<_> = n
            .pod_writes(who, "steady")
            .into_iter()
            .filter(|a| common::kube_node::received_ns(a) >= quiet_since)
            .collect();
        assert!(w.is_empty(), "{who} wrote to the bystander: {w:#?}");
        for name in ["dl-k", "dl-r"] {
            assert!(
                n.pod_writes(who, name).iter().all(|a| a.verb != "delete"),
                "{who} deleted {name}"
            );
        }
    }
    n.stop_reaplet();
}

/// Waits for `who` to end `name` (container `id`) for its deadline of `deadline` s; the
/// figures as an [`Eviction`]'s (`after_crossing`: from `startTime + deadline` to the exit).
async fn deadline_end(
    n: &KubeNode,
    exits: &Exits,
    name: &str,
    id: &str,
    deadline: i64,
    who: &str,
    window: Duration,
) -> Eviction {
    let st = exits.of(id, window, || n.reaplet_tail(30)).await;
    let (status, event) = terminal(n, name, who, "DeadlineExceeded").await;
    let start: jiff::Timestamp = status["status"]["startTime"]
        .as_str()
        .expect("a startTime")
        .parse()
        .unwrap();
    let due = start.as_nanosecond() as i64 + deadline * 1_000_000_000;
    let status_writes = n
        .pod_writes(who, name)
        .iter()
        .filter(|a| {
            a.subresource == "status" && common::kube_node::received_ns(a) >= due - 1_000_000_000
        })
        .count();
    Eviction {
        after_crossing: (st.finished_at - due) as f64 / 1e9,
        grace: None,
        exit_code: st.exit_code,
        status: digest(&status),
        status_writes,
        event: event_digest(&event),
    }
}
