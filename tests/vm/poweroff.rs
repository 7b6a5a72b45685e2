//! Graceful node shutdown in the guest, with the real systemd-logind:
//! * `shutdown_off_takes_no_inhibitor`: the unit as shipped (no shutdown grace periods) holds no
//!   logind inhibitor and writes no logind drop-in;
//! * `poweroff_ends_pods_by_priority` (the last scenario: it powers the guest off): reaplet as
//!   the node's agent against the in-process API server, three priority groups, pods of three
//!   priorities (one with a preStop hook), then `systemctl poweroff`. The groups must end in
//!   order within their graces, the statuses and the node's Ready condition must reach the API
//!   server, and the machine must go down (systemd stopping the units, this driver's SIGTERM)
//!   only after the last group, within logind's delay.

use super::{Guest, R, REAPLET, SLACK, UNIT, ensure, secs, sh, wait_for};
use crate::apiserver::ApiServer;
use reaplet::wall_ns;
use reaplet_testbed::{ContainerTemplate, IGNORES_TERM, PodTemplate, TRAPS_TERM};
use serde_json::{Value, json};
use std::path::Path;
use std::time::{Duration, Instant};

const DROP_IN: &str = "/etc/systemd/system/reaplet.service.d/poweroff.conf";
const CONFIG: &str = "/etc/reaplet/poweroff.yaml";
const LOGIND_DROP_IN: &str = "/etc/systemd/logind.conf.d/98-reaplet.conf";
/// The groups: (priority, grace seconds).
/// The last group's 6 s leave 3 s after the critical pod's own 3 s: on containerd 2.x under TCG
/// a pod is stopped 2.7 to 5.3 s after its SIGKILL, and every pod still stopping then has the
/// last group's unused time and the flush before logind's delay runs out.
const GROUPS: [(i32, u64); 3] = [(0, 6), (100_000, 8), (2_000_000_000, 6)];
/// The critical pod's exit is bounded as when its group had 4 s (its own grace 3 s + 1): the
/// group's extra time is for the pods still stopping, not for the critical pod's SIGKILL.
const CRITICAL_BOUND: f64 = 4.0;
/// reaplet's status flush after the last group (`shutdown::STATUS_FLUSH`).
const FLUSH: u64 = 5;

/// The delay inhibitors on `shutdown` held by `who`, as `systemd-inhibit --list` shows them.
pub(super) fn inhibitors(who: &str) -> R<Vec<String>> {
    let out = sh("systemd-inhibit", &["--list", "--no-pager", "--no-legend"])?;
    Ok(out
        .lines()
        .filter(|l| l.split_whitespace().next() == Some(who))
        .map(str::to_owned)
        .collect())
}

/// logind's `InhibitDelayMaxUSec`, read with busctl.
pub(super) fn logind_delay() -> R<Duration> {
    let out = sh(
        "busctl",
        &[
            "get-property",
            "org.freedesktop.login1",
            "/org/freedesktop/login1",
            "org.freedesktop.login1.Manager",
            "InhibitDelayMaxUSec",
        ],
    )?;
    // "t 5000000"
    out.split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .map(Duration::from_micros)
        .ok_or_else(|| format!("busctl said {out:?}"))
}

/// Did logind give up waiting for a delay inhibitor in this boot? (systemd-logind logs "Delay
/// lock is active (…) but inhibitor timeout is reached." when its `InhibitDelayMaxSec` runs out.)
pub(super) fn logind_timed_out() -> bool {
    sh(
        "journalctl",
        &["-b", "-u", "systemd-logind", "--no-pager", "-o", "cat"],
    )
    .is_ok_and(|j| j.contains("inhibitor timeout is reached"))
}

/// Waits (up to `limit`) until `who` holds an inhibitor and checks it is a delay lock on
/// `shutdown`; the lines `systemd-inhibit --list` shows for it.
pub(super) async fn delay_lock(who: &str, limit: Duration) -> R<Vec<String>> {
    let held = wait_for(
        limit,
        &format!("{who}'s logind delay inhibitor"),
        || async { inhibitors(who).ok().filter(|h| !h.is_empty()) },
    )
    .await?;
    ensure(
        held.iter()
            .any(|l| l.contains("shutdown") && l.contains("delay")),
        || format!("{who}'s inhibitor is not a shutdown delay lock: {held:?}"),
    )?;
    Ok(held)
}

pub(super) async fn shutdown_off_takes_no_inhibitor() -> R<String> {
    // reaplet runs as shipped (no shutdown grace periods) since the previous scenario
    let held = inhibitors("reaplet")?;
    ensure(held.is_empty(), || {
        format!("reaplet holds inhibitors: {held:?}")
    })?;
    ensure(!Path::new(LOGIND_DROP_IN).exists(), || {
        format!("{LOGIND_DROP_IN} written without a shutdown configured")
    })?;
    let delay = logind_delay()?;
    ensure(delay == Duration::from_secs(5), || {
        format!("logind's delay is {delay:?}, not its default 5 s")
    })?;
    let journal = sh("journalctl", &["-u", UNIT, "--no-pager", "-o", "cat"])?;
    ensure(
        journal.contains("graceful node shutdown not configured"),
        || "reaplet's journal does not say graceful shutdown is off".into(),
    )?;
    let check =
        sh(REAPLET, &["check", "--config", "/etc/reaplet/config.yaml"]).unwrap_or_else(|e| e);
    let row = check
        .lines()
        .find(|l| l.starts_with("node shutdown"))
        .unwrap_or_default()
        .to_owned();
    ensure(row.contains("off"), || {
        format!("reaplet check says {row:?}")
    })?;
    Ok(format!(
        "no reaplet inhibitor (systemd-inhibit --list), no {LOGIND_DROP_IN}, logind's delay \
         {delay:?} untouched; reaplet check: {row:?}"
    ))
}

/// `systemctl poweroff`, then `watch` (which must not start before: futures are lazy) beside
/// this driver's SIGTERM, which is the machine going down (systemd stopping the driver's
/// unit), within `limit`. Returns what `watch` gave, when the SIGTERM came (wall ns) and when
/// the power-off was asked for.
pub(super) async fn power_off<T>(
    limit: Duration,
    watch: impl std::future::Future<Output = T>,
) -> R<(T, Option<i64>, i64)> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| format!("SIGTERM handler: {e}"))?;
    let t0 = wall_ns();
    sh("systemctl", &["poweroff"])?;
    let term_at = async {
        tokio::time::timeout(limit, term.recv())
            .await
            .ok()
            .map(|_| wall_ns())
    };
    let (got, term_at) = tokio::join!(watch, term_at);
    Ok((got, term_at, t0))
}

fn config(kubeconfig: &Path) -> String {
    let groups: String = GROUPS
        .iter()
        .map(|(p, s)| format!("- priority: {p}\n  shutdownGracePeriodSeconds: {s}\n"))
        .collect();
    format!(
        "apiVersion: reaplet.io/v1alpha1\nkind: ReapletConfiguration\n\
         containerRuntimeEndpoint: unix:///run/containerd/containerd.sock\n\
         rootDir: /var/lib/kubelet\ncgroupRoot: /\nmetricsBindAddress: 127.0.0.1:10266\n\
         kubeconfig: {}\nauthority: primary\nshutdownGracePeriodByPodPriority:\n{groups}",
        kubeconfig.display()
    )
}

fn condition<'a>(obj: &'a Value, kind: &str) -> &'a Value {
    obj["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == kind))
        .unwrap_or(&Value::Null)
}

/// Sets up the node, the pods and reaplet, checks the inhibitor, powers off and judges.
pub(super) async fn poweroff(g: &Guest) -> R<String> {
    let api = ApiServer::start().await;
    let kc = super::rescue::api_kubeconfig(&api, &g.node)?;
    api.add_node(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": g.node},
        "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
            "message": "kubelet is posting ready status",
            "lastHeartbeatTime": "2026-11-26T00:00:00Z",
            "lastTransitionTime": "2026-11-26T00:00:00Z"}]}
    }));
    sh("systemctl", &["stop", UNIT])?;
    std::fs::write(CONFIG, config(&kc)).map_err(|e| e.to_string())?;
    super::drop_in(
        DROP_IN,
        format!("[Service]\nExecStart=\nExecStart={REAPLET} run --config {CONFIG}\n"),
    )?;

    // a batch pod that ignores SIGTERM (ends at its group's grace), a web pod whose preStop
    // hook takes 2 s, a critical pod that ignores SIGTERM too and whose own grace (3 s) is
    // shorter than its group's 6 s
    let templates = [
        PodTemplate::new("batch", 30)
            .priority(0)
            .container(ContainerTemplate::new("app", IGNORES_TERM)),
        PodTemplate::new("web", 30).priority(100_000).container(
            ContainerTemplate::new("app", TRAPS_TERM)
                .pre_stop(json!({"exec": {"command": ["/bin/sh", "-c", "sleep 2"]}})),
        ),
        PodTemplate::new("critical", 3)
            .priority(2_000_000_000)
            .container(ContainerTemplate::new("app", IGNORES_TERM)),
    ];
    let mut pods = Vec::new();
    for t in &templates {
        let mut obj = t.api_object();
        obj["spec"]["nodeName"] = Value::String(g.node.clone());
        api.create_pod(obj);
        pods.push(g.launch(t).await?);
    }
    sh("systemctl", &["daemon-reload"])?;
    sh("systemctl", &["start", UNIT])?;
    for p in &pods {
        g.wait_known(&p.uid).await?;
    }
    delay_lock("reaplet", Duration::from_secs(30)).await?;
    let needed: u64 = GROUPS.iter().map(|g| g.1).sum::<u64>() + FLUSH;
    let delay = logind_delay()?;
    ensure(delay == Duration::from_secs(needed), || {
        format!("logind's InhibitDelayMaxUSec is {delay:?}, {needed} s expected")
    })?;
    let drop_in = std::fs::read_to_string(LOGIND_DROP_IN).map_err(|e| e.to_string())?;
    ensure(
        drop_in.contains(&format!("InhibitDelayMaxSec={needed}\n")),
        || format!("{LOGIND_DROP_IN}: {drop_in:?}"),
    )?;

    // the exits as containerd reports them: nothing polls containerd while the pods stop
    let exits = super::exits::Exits::subscribe().await?;
    let limit = Duration::from_secs_f64(needed as f64 + 15.0 * SLACK);
    println!("poweroff: systemctl poweroff (groups {GROUPS:?}, logind delay {needed} s)");
    let i0 = Instant::now();
    let watch =
        futures_util::future::join_all(pods.iter().map(|p| exits.wait(&p.containers, limit)));
    let (stops, term_at, t0) = power_off(limit, watch).await?;
    judge(g, &api, &templates, stops, term_at, t0, i0, needed)
}

#[allow(clippy::too_many_arguments)]
fn judge(
    g: &Guest,
    api: &ApiServer,
    templates: &[PodTemplate],
    stops: Vec<R<Vec<(String, i32, i64)>>>,
    term_at: Option<i64>,
    t0: i64,
    i0: Instant,
    needed: u64,
) -> R<String> {
    let mut ends = Vec::new();
    for (t, s) in templates.iter().zip(stops) {
        let s = s.map_err(|e| format!("{}: {e}", t.name))?;
        let (_, code, finished) = s[0].clone();
        ends.push((t.name.as_str(), code, secs(finished - t0)));
    }
    let at = |i: usize| ends[i].2;
    let timeline: Vec<String> = ends
        .iter()
        .map(|(n, c, s)| format!("{n} exited {c} at {s:.2} s"))
        .collect();
    // the last status write of each pod and of the node, seconds after the poweroff
    let writes = api.writes();
    let last_write = |path: &str| {
        writes
            .iter()
            .filter(|r| r.path == path && r.method == "PATCH" && r.status == 200)
            .map(|r| r.at.saturating_duration_since(i0).as_secs_f64())
            .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))))
    };
    let mut status_at = Vec::new();
    for t in templates {
        let path = format!("/api/v1/namespaces/default/pods/{}/status", t.name);
        status_at
            .push(last_write(&path).ok_or_else(|| format!("no status written for {}", t.name))?);
    }
    let ready_at =
        last_write(&format!("/api/v1/nodes/{}/status", g.node)).ok_or("no node status written")?;
    let down = term_at.map(|t| secs(t - t0));
    println!(
        "poweroff: timeline: {}; statuses at {:?} s; node Ready at {ready_at:.2} s; systemd \
         stopped the units at {down:?} s",
        timeline.join(", "),
        status_at
            .iter()
            .map(|s| format!("{s:.2}"))
            .collect::<Vec<_>>()
    );
    let down = down.ok_or("no SIGTERM: the machine did not begin to go down in time")?;
    let (g1, g2) = (GROUPS[0].1 as f64, GROUPS[1].1 as f64);
    let slack = 2.0 * SLACK;
    // group 1: SIGKILLed at its group's grace (its own 30 s is longer)
    ensure(
        ends[0].1 == 137 && at(0) >= g1 - 0.2 && at(0) <= g1 + slack,
        || format!("batch: {:?}, expected exit 137 at {g1} s", ends[0]),
    )?;
    // group 2 only after group 1; its hook's 2 s, then SIGTERM honoured
    ensure(
        ends[1].1 == 0 && at(1) - at(0) >= 1.5 && at(1) <= g1 + g2 + slack,
        || format!("web: {:?} after batch at {:.2} s", ends[1], at(0)),
    )?;
    // the critical group last, SIGKILLed at its own shorter grace (3 s, not the group's 6)
    ensure(
        ends[2].1 == 137 && at(2) - at(1) >= 3.0 - 0.2 && at(2) <= g1 + g2 + CRITICAL_BOUND + slack,
        || format!("critical: {:?} after web at {:.2} s", ends[2], at(1)),
    )?;
    // each killed with the grace its group gives it, as reaplet's journal says
    let journal = sh("journalctl", &["-u", UNIT, "--no-pager", "-o", "cat"])?;
    for (name, grace) in [("batch", 6), ("web", 8), ("critical", 3)] {
        ensure(
            journal.lines().any(|l| {
                l.contains(&format!("pod=default/{name} "))
                    && l.contains("to=\"terminating\"")
                    && l.contains(&format!("gracePeriod={grace} "))
            }),
            || format!("no transition of {name} to terminating with gracePeriod={grace}"),
        )?;
    }
    ensure(journal.contains("logind inhibitor released"), || {
        "reaplet never said it released the inhibitor".into()
    })?;
    for t in templates {
        let pod = api
            .get_pod("default", &t.name)
            .ok_or_else(|| format!("{} was deleted: a shutdown keeps the object", t.name))?;
        let st = &pod["status"];
        let dt = condition(&pod, "DisruptionTarget");
        ensure(
            st["phase"] == "Failed"
                && st["reason"] == "Terminated"
                && st["message"] == "Pod was terminated in response to imminent node shutdown."
                && dt["status"] == "True"
                && dt["reason"] == "TerminationByKubelet",
            || format!("{}: status {st}", t.name),
        )?;
    }
    let node = api.get_node(&g.node).ok_or("the Node is gone")?;
    let ready = condition(&node, "Ready");
    ensure(
        ready["status"] == "False"
            && ready["reason"] == "KubeletNotReady"
            && ready["message"] == "node is shutting down",
        || format!("node Ready: {ready}"),
    )?;
    let shutdown_event = api.events().iter().any(|e| {
        e["involvedObject"]["kind"] == "Node" && e["reason"] == "Shutdown" && e["type"] == "Normal"
    });
    ensure(shutdown_event, || {
        "no Normal Shutdown event about the Node".into()
    })?;
    // the machine went down only after the last group and the statuses, within logind's delay
    let last_status = status_at.iter().copied().fold(0.0, f64::max);
    ensure(down >= at(2) && down >= last_status, || {
        format!(
            "the units were stopped at {down:.2} s, before the last pod ({:.2} s) or status ({last_status:.2} s)",
            at(2)
        )
    })?;
    // released by reaplet, not at logind's limit: soon after the last status, and logind never
    // found its delay used up (it logs that; its limit counts from its announcement, which
    // comes a moment after the poweroff this test times from)
    let last = at(2).max(last_status);
    ensure(down <= last + slack, || {
        format!(
            "the units were stopped at {down:.2} s, {:.2} s after the last pod or status (logind's limit {needed} s)",
            down - last
        )
    })?;
    ensure(!logind_timed_out(), || {
        format!(
            "logind's {needed} s delay ran out before reaplet released its inhibitor (units stopped at {down:.2} s)"
        )
    })?;
    Ok(format!(
        "{}; statuses written at {:?} s (Failed/Terminated/TerminationByKubelet); node Ready \
         False at {ready_at:.2} s; machine going down (driver SIGTERM) at {down:.2} s; logind \
         delay {needed} s from 98-reaplet.conf",
        timeline.join(", "),
        status_at
            .iter()
            .map(|s| format!("{s:.2}"))
            .collect::<Vec<_>>()
    ))
}
