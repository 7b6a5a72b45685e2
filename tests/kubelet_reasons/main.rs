//! The kubelet's own reasons to end a pod, side by side with the real kubelet v1.36 on the
//! same node and the same pods (privileged: root, a private containerd 2.x, a real
//! kube-apiserver and etcd, the real kubelet): node-pressure eviction and
//! `activeDeadlineSeconds`. In each test the kubelet ends its pods first; then it is stopped
//! and reaplet (`--authority primary`, reading the kubelet's own configuration file) ends the
//! others, pods of the same kinds, and the two are compared: the victims and their order, the
//! final status (phase, reason, message, conditions, container states; figures aside), the
//! events and their annotations, the exit codes, the grace, the objects kept, nothing else
//! ended.
//!
//! * [`memory`]: a hard `memory.available` threshold, copied to `allocatableMemory.available`,
//!   pods that take memory when the test says, a Burstable and a Guaranteed bystander;
//! * [`ranking`]: four pods whose order exercises each key of the kubelet's memory ranking
//!   (usage above the request, priority, usage minus the request);
//! * [`soft`]: a soft threshold with its grace period and `evictionMaxPodGracePeriod`;
//! * [`pids`]: `pid.available` with a pod that forks;
//! * [`deadline`]: `activeDeadlineSeconds` with a TERM-trapping pod and a bystander.
//!
//! The memory tests give the pods 1 GiB (`kubeReserved` takes the rest of the machine, so the
//! pressure stays inside the pods' cgroup whatever else the machine does). The tests take one
//! lock, one stack at a time: each is a whole node (API server, etcd, containerd, the kubelet)
//! and their figures are compared on a 2-core machine.

#[path = "../common/mod.rs"]
mod common;
mod deadline;
mod memory;
mod pids;
mod pods;
mod ranking;
mod soft;

use common::crossing::Signal;
use common::exits::Exits;
use common::gate::Gate;
use common::kube_node::{KubeNode, NODE, container_id, pod};
use pods::*;
use reaplet::cri::Runtime;
use reaplet::pressure::signals::SignalReader;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// What the memory tests' kubelet leaves the pods (its `kubepods` cgroup limit).
const PODS_BYTES: u64 = 1 << 30;
/// Each hog's allocation: working set above 824 MiB (1 GiB less a 200 MiB threshold), well
/// below the cgroup limit (the kernel's OOM killer stays out of it).
const HOG_BYTES: u64 = 900_000_000;
/// The kubelet decides every 10 s from cadvisor figures up to 10-15 s old; then it waits for
/// the pod's cleanup. Generous for a loaded 2-core machine.
const KUBELET_WINDOW: Duration = Duration::from_secs(90);
/// reaplet's pass is every second; slack for a loaded machine.
const REAPLET_WINDOW: Duration = Duration::from_secs(20);

/// One whole node at a time (see the module's doc); a failed test's guard is dropped too
/// (tokio's mutex is not poisoned).
static ONE_NODE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The kubelet started with the memory tests' configuration plus `eviction` (YAML lines of a
/// KubeletConfiguration), its pods' cgroup checked to be [`PODS_BYTES`], and a reader of the
/// node's signals as reaplet reads them.
async fn pressure_node(name: &str, eviction: &str) -> (KubeNode, SignalReader) {
    let reserved = mem_total() - PODS_BYTES;
    let config = format!(
        "{eviction}\nkubeReserved: {{memory: \"{reserved}\"}}\nenforceNodeAllocatable: [pods]"
    );
    let n = KubeNode::start_with(name, &config).await;
    let reader = common::crossing::host_reader(&n.tb.cgroup_root);
    let observed = reader.observe().allocatable_memory.expect("a pods' limit");
    assert_eq!(
        observed.capacity, PODS_BYTES as i64,
        "the kubelet's pods cgroup limit"
    );
    (n, reader)
}

/// The kubelet stopped, reaplet started as the node's agent and ready to evict.
async fn hand_to_reaplet(n: &mut KubeNode) {
    n.kubelet.stop();
    n.start_reaplet(&["--authority", "primary"]);
    n.wait_log("node-pressure eviction on", Duration::from_secs(30))
        .await;
    n.wait_log("pod list from the API server", Duration::from_secs(30))
        .await;
}

fn mem_total() -> u64 {
    let m = std::fs::read_to_string("/proc/meminfo").unwrap();
    let kib: u64 = m
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("MemTotal");
    kib * 1024
}

/// Waits until `names` run and the kubelet's stats summary has each; their container IDs.
async fn running_with_stats<'a>(n: &KubeNode, names: &[&'a str]) -> Vec<(&'a str, String)> {
    let mut ids = Vec::new();
    for name in names {
        let p = n.wait_running(name, Duration::from_secs(90)).await;
        ids.push((*name, container_id(&p)));
    }
    wait_kubelet_stats(n, names).await;
    ids
}

/// Every figure as `#`, a quantity's suffix with it (binary, or decimal but for `m`): the
/// figures differ between two evictions, the words must not (a usage that is a whole number of
/// MiB prints as `858Mi`, from either agent, where another prints `878600Ki`; 26000 PIDs as
/// `26k`).
fn norm(v: &Value) -> Value {
    let Some(s) = v.as_str() else {
        return v.clone();
    };
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(c) = rest.chars().next() {
        if c.is_ascii_digit() {
            rest = rest.trim_start_matches(|c: char| c.is_ascii_digit());
            let b = rest.as_bytes();
            if b.len() >= 2 && b"KMGTPE".contains(&b[0]) && b[1] == b'i' {
                rest = &rest[2..];
            } else if !b.is_empty() && b"kMGTPE".contains(&b[0]) {
                rest = &rest[1..];
            }
            out.push('#');
        } else {
            out.push(c);
            rest = &rest[c.len_utf8()..];
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

/// The kubelet's final status `k` (a [`digest`]) as it reads when the kubelet saw its
/// container's exit; `None` when that cannot be known. The kubelet removes an evicted pod's
/// containers once the pod synced, and a status built after its runtime cache dropped the
/// container reports it `ContainerStatusUnknown` with a made-up exit code 137
/// (`convertToAPIContainerStatuses`: "The container could not be located when the pod was
/// terminated"; measured here under load, for the grower of `ranking`), where reaplet reports
/// the runtime's. For a container whose real exit (`exit_code`, from the runtime's event) was
/// 137 too, only the reason differs (`Error`); for another exit the phase differs too and the
/// status is not compared. Said when it happens.
fn as_if_seen(case: &str, k: &Value, exit_code: i32) -> Option<Value> {
    let mut k = k.clone();
    let lost = |c: &Value| c["reason"] == "ContainerStatusUnknown";
    if !k["containers"].as_array()?.iter().any(lost) {
        return Some(k);
    }
    println!(
        "{case}: the kubelet lost the container before its final status (ContainerStatusUnknown); \
         the runtime's exit code was {exit_code}"
    );
    if exit_code != 137 {
        println!("{case}: the kubelet's final status is not compared");
        return None;
    }
    for c in k["containers"].as_array_mut()?.iter_mut() {
        if lost(c) {
            c["reason"] = json!("Error");
        }
    }
    Some(k)
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
    if let Some(ks) = as_if_seen(case, &k.status, k.exit_code) {
        assert_eq!(r.status, ks, "{case}: the final status");
    }
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

/// Where a test sees the pressure begin: `signal` below `below`, read by `reader`.
#[derive(Clone)]
struct Crossing {
    reader: SignalReader,
    signal: Signal,
    below: i64,
}

/// Opens `name`'s gate and waits for `who` ("kubelet/" or "reaplet/") to evict it.
async fn evict(
    n: &KubeNode,
    gate: &Gate,
    crossing: &Crossing,
    exits: &Exits,
    name: &str,
    who: &str,
    window: Duration,
) -> Eviction {
    let reader = &crossing.reader;
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
    let crossing = common::crossing::below(reader.clone(), crossing.signal, crossing.below);
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

/// Both rounds: the kubelet evicts `kubelet`'s pods one after another, then it is stopped and
/// reaplet evicts `reaplet`'s; each agent's evictions in order.
async fn rounds(
    n: &mut KubeNode,
    gate: &Gate,
    crossing: &Crossing,
    exits: &Exits,
    kubelet: &[&str],
    reaplet: &[&str],
) -> (Vec<Eviction>, Vec<Eviction>) {
    let mut k = Vec::new();
    for name in kubelet {
        k.push(evict(n, gate, crossing, exits, name, "kubelet/", KUBELET_WINDOW).await);
    }
    hand_to_reaplet(n).await;
    let mut r = Vec::new();
    for name in reaplet {
        r.push(evict(n, gate, crossing, exits, name, "reaplet/", REAPLET_WINDOW).await);
    }
    (k, r)
}

/// Both agents' Warning `EvictionThresholdMet` on the node ("Attempting to reclaim
/// `resource`").
async fn threshold_met_events(n: &KubeNode, resource: &str) {
    let evs = events(n).await;
    let want = format!("Attempting to reclaim {resource}");
    for who in ["kubelet", "reaplet"] {
        let found = evs.iter().any(|e| {
            e["involvedObject"]["kind"] == "Node"
                && e["involvedObject"]["name"] == NODE
                && e["reason"] == "EvictionThresholdMet"
                && e["type"] == "Warning"
                && e["message"] == want.as_str()
                && e["source"]["component"]
                    .as_str()
                    .is_some_and(|c| c.contains(who))
        });
        assert!(
            found,
            "no EvictionThresholdMet ({want}) from the {who}: {:#?}",
            evs.iter()
                .filter(|e| e["involvedObject"]["kind"] == "Node")
                .collect::<Vec<_>>()
        );
    }
}

/// Nothing ended `pods` (name, container ID), by either agent: they run, reaplet never wrote
/// to them, and what the kubelet (their owner until it stopped) wrote since `since` (wall ns)
/// ended nothing.
async fn untouched(n: &KubeNode, pods: &[(&str, String)], since: i64) {
    for (name, id) in pods {
        let st = n.client.container_status(id).await.unwrap_or_else(|e| {
            panic!(
                "{name}: {e:?}; writes to it: {:#?}\nreaplet:\n{}\nkubelet:\n{}\nkubelet on {name}:\n{}",
                n.pod_writes("", name)
                    .iter()
                    .map(|a| a.line())
                    .collect::<Vec<_>>(),
                n.reaplet_tail(60),
                n.kubelet.log_grep(&["eviction_manager"], 30),
                n.kubelet.log_grep(&[&format!("pod=\"default/{name}\"")], 30)
            )
        });
        assert!(st.state.may_run(), "{name} was ended: {st:?}");
        let obj = n.get(name).await.expect("the bystander is kept");
        assert_eq!(obj["status"]["phase"], "Running", "{name}: {obj:#}");
        let after = |a: &common::k8s::Audit| common::kube_node::received_ns(a) >= since;
        let r: Vec<_> = n
            .pod_writes("reaplet/", name)
            .into_iter()
            .filter(after)
            .collect();
        assert!(r.is_empty(), "reaplet wrote to {name}: {r:#?}");
        for a in n.pod_writes("kubelet/", name).into_iter().filter(after) {
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
}

/// The objects of `names` are kept: neither agent deleted them.
async fn kept(n: &KubeNode, names: &[&str]) {
    for name in names {
        assert!(n.get(name).await.is_some(), "{name} deleted");
        for who in ["kubelet/", "reaplet/"] {
            assert!(
                n.pod_writes(who, name).iter().all(|a| a.verb != "delete"),
                "{who} deleted {name}"
            );
        }
    }
}

#[test]
fn figures_and_their_units_are_hidden_words_kept() {
    assert_eq!(
        norm(&json!(
            "Threshold quantity: 200Mi, available: 858Mi. Container app was using 878600Ki, request is 0, 5m, 26k, 25123."
        )),
        json!(
            "Threshold quantity: #, available: #. Container app was using #, request is #, #m, #, #."
        )
    );
}
