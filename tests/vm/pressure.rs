//! The node boot's pressure scenario: reaplet, the node's agent after the takeover, evicts for
//! `allocatableMemory.available` on **cgroup v2 with the systemd driver** (the host's tests run
//! the side by side with the kubelet on cgroup v1 and the cgroupfs driver): the pods' slice
//! `kubepods.slice` limited by the kubelet's `kubeReserved` to [`PODS_MIB`], the kubelet's
//! `evictionHard: memory.available` of [`THRESHOLD_MIB`] (copied to the pods' signal), read by
//! reaplet from the kubelet's own file.
//!
//! [`HUNGRY`] (BestEffort, ignores SIGTERM) takes [`HUNGRY_BYTES`] once its gate file appears.
//! The crossing is read here independently of reaplet's reader, as the kubelet computes it on
//! cgroup v2: `memory.max` minus (`memory.current` minus `inactive_file`) of `kubepods.slice`.
//! Judged: the crossing to the exit (reaplet's pass every second, then the 1 s hard-threshold
//! grace raised to the 2 s floor); exit 137; the status the kubelet writes for an eviction (phase
//! Failed, reason `Evicted`, the `DisruptionTarget` condition, the container named with its
//! usage: its working set found below the pod's slice in `cri-containerd-<id>.scope`); the
//! Warning `Evicted` event with its annotations and the node's `EvictionThresholdMet`; the
//! object kept; nothing of the pod left; the other pods untouched; nothing from the kubelet.

use super::node_kit::*;
use super::{SLACK, ensure, secs};
use crate::k8s::Audit;
use reaplet::cri::ContainerRunState;
use reaplet::wall_ns;
use serde_json::{Value, json};
use std::time::Duration;

/// The pods' cgroup limit the kubelet sets from `kubeReserved`.
pub(super) const PODS_MIB: u64 = 512;
/// `evictionHard: memory.available`.
pub(super) const THRESHOLD_MIB: u64 = 200;
/// The pod that takes memory when told.
pub(super) const HUNGRY: &str = "hungry";
/// What it takes: about 381 MiB, past the 312 MiB the threshold allows the pods, well within
/// their 512 MiB limit (the cgroup's OOM killer is not what ends it).
const HUNGRY_BYTES: u64 = 400_000_000;
/// The guest's directory the pod watches for `go` (a hostPath volume at `/gate`).
const GATE: &str = "/run/reaplet-vm-gate";
const PODS_SLICE: &str = "/sys/fs/cgroup/kubepods.slice";

/// The kubelet's configuration lines for the scenario: the pods' limit from the guest's
/// memory, the hard threshold.
pub(super) fn kubelet_lines() -> String {
    let total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .unwrap_or(0)
        * 1024;
    let reserved = total.saturating_sub(PODS_MIB << 20);
    format!(
        "evictionHard: {{memory.available: \"{THRESHOLD_MIB}Mi\", nodefs.available: \"1%\", \
         imagefs.available: \"1%\"}}\nkubeReserved: {{memory: \"{reserved}\"}}\n\
         enforceNodeAllocatable: [pods]\n"
    )
}

/// [`HUNGRY`]: ignores SIGTERM, waits for its gate, then holds [`HUNGRY_BYTES`] until killed.
pub(super) fn hungry(node: &str) -> Value {
    let script = format!(
        "trap '' TERM; until [ -e /gate/go ]; do sleep 0.2; done; \
         (head -c {HUNGRY_BYTES} /dev/zero; sleep 3600) | tail >/dev/null & \
         while true; do sleep 3600 & wait $!; done"
    );
    let mut p = pod(node, HUNGRY, 30, &script);
    p["spec"]["containers"][0]["volumeMounts"] = json!([{"name": "gate", "mountPath": "/gate"}]);
    p["spec"]["volumes"] =
        json!([{"name": "gate", "hostPath": {"path": GATE, "type": "DirectoryOrCreate"}}]);
    p
}

/// `allocatableMemory.available` as the kubelet computes it on cgroup v2, bytes.
fn pods_available() -> Option<i64> {
    let read = |f: &str| std::fs::read_to_string(format!("{PODS_SLICE}/{f}")).ok();
    let max: i64 = read("memory.max")?.trim().parse().ok()?;
    let current: i64 = read("memory.current")?.trim().parse().ok()?;
    let inactive: i64 = read("memory.stat")?
        .lines()
        .find_map(|l| l.strip_prefix("inactive_file "))?
        .trim()
        .parse()
        .ok()?;
    Some(max - (current - inactive).max(0))
}

/// Scenario: the eviction, reaplet the node's agent (after the upgrade scenario).
pub(super) async fn evicts_on_cgroup_v2(n: &Node) -> super::R<String> {
    let limit: i64 = std::fs::read_to_string(format!("{PODS_SLICE}/memory.max"))
        .map_err(|e| format!("{PODS_SLICE}/memory.max: {e}"))?
        .trim()
        .parse()
        .map_err(|e| format!("{PODS_SLICE}/memory.max: {e}"))?;
    ensure(limit == (PODS_MIB << 20) as i64, || {
        format!("the kubelet's pods limit is {limit}, not {PODS_MIB} MiB")
    })?;
    let before = n.container_state(BYSTANDER).await?;
    ensure(before.state == ContainerRunState::Running, || {
        format!("{BYSTANDER} is not running before the pressure: {before:?}")
    })?;
    let threshold = (THRESHOLD_MIB << 20) as i64;
    let a0 = audit().await?.len();
    std::fs::write(format!("{GATE}/go"), b"").map_err(|e| format!("{GATE}/go: {e}"))?;
    let opened = wall_ns();
    // the crossing, every 50 ms, until the pod's exit
    let (_, id) = &n.running(HUNGRY)?.containers[0];
    let mut crossed = None;
    let deadline = std::time::Instant::now() + Duration::from_secs_f64(60.0 + 10.0 * SLACK);
    let exit = loop {
        if crossed.is_none() && pods_available().is_some_and(|a| a < threshold) {
            crossed = Some(wall_ns());
        }
        if let Some(e) = n.exits.get(id) {
            break e;
        }
        ensure(std::time::Instant::now() < deadline, || {
            format!(
                "{HUNGRY} did not exit within {:.0} s of its gate (crossed: {}; available now \
                 {:?}); reaplet: {}",
                60.0 + 10.0 * SLACK,
                crossed.is_some(),
                pods_available(),
                journal(super::UNIT)
                    .lines()
                    .filter(|l| l.contains("pressure") || l.contains("evict"))
                    .collect::<Vec<_>>()
                    .join(" | ")
            )
        })?;
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let crossed = crossed.ok_or_else(|| {
        format!(
            "{HUNGRY} exited ({exit:?}) {:.2} s after its gate, before the test saw the crossing",
            secs(exit.1 - opened)
        )
    })?;
    let after = secs(exit.1 - crossed);
    // a pass every second, then the 2 s floor of the 1 s grace
    ensure(
        exit.0 == 137 && (2.0 - 0.2..=1.0 + 2.0 + 1.0 + SLACK).contains(&after),
        || {
            format!(
                "{HUNGRY}: exit {} {after:.2} s after the crossing; expected SIGKILL at the 2 s \
                 floor within a second of the crossing",
                exit.0
            )
        },
    )?;
    let status = wait_terminal(n).await?;
    let message = status["message"].as_str().unwrap_or_default().to_owned();
    let prefix = format!(
        "The node was low on resource: memory. Threshold quantity: {THRESHOLD_MIB}Mi, available: "
    );
    ensure(
        status["phase"] == "Failed"
            && status["reason"] == "Evicted"
            && message.starts_with(&prefix)
            && message.contains("Container app was using ")
            && message.ends_with("request is 0, has larger consumption of memory. "),
        || format!("{HUNGRY}'s status: {status:#}"),
    )?;
    let target = status["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "DisruptionTarget"))
        .cloned()
        .unwrap_or_default();
    ensure(
        target["status"] == "True"
            && target["reason"] == "TerminationByKubelet"
            && target["message"] == message.as_str(),
        || format!("{HUNGRY}'s DisruptionTarget: {target}"),
    )?;
    let events = n
        .api("GET", "/api/v1/namespaces/default/events", None)
        .await
        .1;
    let events = events["items"].as_array().cloned().unwrap_or_default();
    let from_reaplet = |e: &&Value| {
        e["source"]["component"]
            .as_str()
            .is_some_and(|c| c.contains("reaplet"))
    };
    let evicted = events
        .iter()
        .filter(from_reaplet)
        .find(|e| e["involvedObject"]["name"] == HUNGRY && e["reason"] == "Evicted")
        .ok_or_else(|| format!("no Evicted event from reaplet for {HUNGRY}"))?;
    let ann = &evicted["metadata"]["annotations"];
    ensure(
        evicted["type"] == "Warning"
            && evicted["message"] == message.as_str()
            && ann["offending_containers"] == "app"
            && ann["starved_resource"] == "memory",
        || format!("the Evicted event: {evicted:#}"),
    )?;
    ensure(
        events.iter().filter(from_reaplet).any(|e| {
            e["involvedObject"]["kind"] == "Node"
                && e["reason"] == "EvictionThresholdMet"
                && e["message"] == "Attempting to reclaim memory"
        }),
        || "no EvictionThresholdMet node event from reaplet".to_owned(),
    )?;
    let left = n.nothing_left(HUNGRY).await?;
    ensure(n.get_pod(HUNGRY).await?.is_some(), || {
        format!("{HUNGRY}'s object was deleted")
    })?;
    let (_, bid) = &n.running(BYSTANDER)?.containers[0];
    super::package::untouched(&n.g, bid, &before).await?;
    let a = audit().await?;
    let writes: Vec<&Audit> = a[a0.min(a.len())..]
        .iter()
        .filter(|x| x.is_write() && x.resource == "pods")
        .collect();
    let unexpected: Vec<&&Audit> = writes
        .iter()
        .filter(|x| !is_reaplet(x) || x.name != HUNGRY || x.subresource != "status")
        .collect();
    ensure(unexpected.is_empty() && !writes.is_empty(), || {
        format!(
            "pod writes from the gate on: {:?}; expected reaplet's status writes for {HUNGRY} \
                 alone",
            lines(&writes)
        )
    })?;
    let evicting = journal(super::UNIT)
        .lines()
        .rev()
        .find(|l| l.contains("node pressure: evicting a pod"))
        .unwrap_or_default()
        .to_owned();
    Ok(format!(
        "{HUNGRY} taking {HUNGRY_BYTES} B: the pods' available below {THRESHOLD_MIB} MiB (of \
         {PODS_MIB} MiB, cgroup v2) {:.2} s after its gate; SIGKILLed at {after:.2} s \
         after the crossing (exit 137); status Failed/Evicted with DisruptionTarget: {message:?}; \
         the Warning Evicted event (offending_containers app) and EvictionThresholdMet; the \
         object kept, {} status write(s) by reaplet, no other pod write; {BYSTANDER} untouched; \
         {left}; reaplet: {evicting}",
        secs(crossed - opened),
        writes.len()
    ))
}

/// [`HUNGRY`]'s status once it is terminal with its container terminated.
async fn wait_terminal(n: &Node) -> super::R<Value> {
    super::wait_for(
        Duration::from_secs_f64(30.0 + 5.0 * SLACK),
        "hungry's terminal status",
        || async {
            let p = n.get_pod(HUNGRY).await.ok()??;
            let st = &p["status"];
            let done = st["containerStatuses"]
                .as_array()
                .is_some_and(|cs| cs.iter().all(|c| c["state"]["terminated"].is_object()));
            (["Failed", "Succeeded"].contains(&st["phase"].as_str()?) && done).then(|| st.clone())
        },
    )
    .await
}

/// The gate file's directory exists before the pod: the kubelet would create it
/// (`DirectoryOrCreate`), but the scenario writes into it.
pub(super) fn make_gate() -> super::R<()> {
    std::fs::create_dir_all(GATE).map_err(|e| format!("{GATE}: {e}"))?;
    match std::fs::remove_file(format!("{GATE}/go")) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(format!("{GATE}/go: {e}")),
        _ => Ok(()),
    }
}
