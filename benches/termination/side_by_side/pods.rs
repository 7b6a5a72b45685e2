//! The pod scenarios: one pod deleted at a time (DELETE -> gone), a burst of pods deleted at
//! once (last gone; the agent's CPU, peak RSS and requests; then the node's floor: the same
//! DELETEs and CRI stops with no agent, interleaved with reaplet's runs in pairs), and a
//! natural exit (the
//! container's end -> the terminal status stored).

use super::audit::gone_at;
use super::stack::Stack;
use super::*;
use crate::gate::Gate;
use std::collections::HashSet;

/// 1. One pod at a time, `reps` times each: the admin's DELETE (received) -> the agent's final
///    DELETE answered (the object gone).
pub(super) async fn one_pod(reps: usize) -> R<Vec<Row>> {
    header(&format!(
        "kubelet 1: one pod deleted -> gone from the API, {reps} times each"
    ));
    let mut s = Stack::start("one").await;
    let mut out = Vec::new();
    let rn = names("one-r", reps);
    let mut reaplet_uids = Vec::new();
    for who in [Who::Kubelet, Who::Reaplet] {
        let list = match who {
            Who::Kubelet => names("one-k", reps),
            Who::Reaplet => rn.clone(),
        };
        if who == Who::Reaplet {
            s.takeover(&reaplet_uids, None, &[]).await?;
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let mut v = Vec::with_capacity(reps);
        for name in &list {
            if who == Who::Kubelet {
                s.create(&pod(name, TRAPS_TERM)).await?;
                s.wait_running(std::slice::from_ref(name), Duration::from_secs(90))
                    .await?;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            s.delete(name).await?;
            s.wait_gone(
                std::slice::from_ref(name),
                Duration::from_millis(20),
                Duration::from_secs(60),
            )
            .await?;
            let (asked, gone) = s
                .audit_find(|a| {
                    let asked = a
                        .iter()
                        .find(|r| r.user == ADMIN && r.is_pod("delete", name))?
                        .received;
                    Some((asked, gone_at(a, who, name)?))
                })
                .await
                .ok_or(format!(
                    "no admin DELETE or {} final DELETE of {name} in the audit log",
                    who.label()
                ))?;
            v.push(ms_ns(gone - asked));
        }
        let v = sorted(v);
        println!(
            "{}: DELETE -> gone median {:.1} ms, p90 {:.1} ms, min {:.1}, max {:.1} (n={reps})",
            who.label(),
            pct(&v, 50.0),
            pct(&v, 90.0),
            pct(&v, 0.0),
            pct(&v, 100.0)
        );
        out.push(v);
        if who == Who::Kubelet {
            // the pods reaplet will end, started by the kubelet
            let bodies: Vec<Value> = rn.iter().map(|n| pod(n, TRAPS_TERM)).collect();
            reaplet_uids = s.create_all(&bodies).await?;
            s.wait_running(&rn, Duration::from_secs(120)).await?;
        }
    }
    s.keep_logs();
    Ok(vec![
        pct_row(
            format!("1 pod: DELETE -> gone, median (n={reps})"),
            "ms",
            &out,
            50.0,
        ),
        pct_row(
            format!("1 pod: DELETE -> gone, p90 (n={reps})"),
            "ms",
            &out,
            90.0,
        ),
    ])
}

/// Resets the peak RSS (`VmHWM`) of `pid` to its current RSS (`clear_refs` 5, Linux 4.0+).
fn reset_hwm(pid: u32) -> bool {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").is_ok()
}

/// What the agent did while `n` pods were deleted at once.
struct Burst {
    last: f64,
    median: f64,
    cpu: f64,
    rss0: f64,
    hwm: f64,
    hwm_reset: bool,
    requests: usize,
    /// When the admin's first DELETE was received (wall clock, ns).
    t0: i64,
}

async fn burst_run(s: &Stack, who: Who, list: &[String]) -> R<Burst> {
    let pid = s.pid(who)?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let set: HashSet<&str> = list.iter().map(String::as_str).collect();
    let cpu0 = cpu_secs(pid);
    let hwm_reset = reset_hwm(pid);
    let rss0 = status_mib(pid, |s| s.vmrss);
    let perf = super::footprint::Perf::start(pid, &format!("burst-{}", who.label())).await;
    let wall0 = wall_ns();
    let deletes = futures_util::future::join_all(list.iter().map(|n| s.delete(n.as_str()))).await;
    for d in deletes {
        d?;
    }
    s.wait_gone(list, Duration::from_millis(100), Duration::from_secs(300))
        .await?;
    let cpu = cpu_secs(pid) - cpu0;
    let hwm = status_mib(pid, |s| s.vmhwm);
    perf.stop();
    println!(
        "{} at the end of the burst: {}",
        who.label(),
        super::footprint::resident(pid).line()
    );
    let (t0, gone, requests) = s
        .audit_find(|a| {
            let t0 = a
                .iter()
                .filter(|r| {
                    r.user == ADMIN
                        && r.verb == "delete"
                        && set.contains(r.name.as_str())
                        && r.received >= wall0 - 1_000_000_000
                })
                .map(|r| r.received)
                .min()?;
            // each pod's final DELETE (answered: the object gone)
            let gone = set
                .iter()
                .map(|n| gone_at(a, who, n))
                .collect::<Option<Vec<i64>>>()?;
            let end = gone.iter().copied().max()?;
            let requests = a
                .iter()
                .filter(|r| r.by(who) && r.received >= t0 && r.received <= end)
                .count();
            Some((t0, gone, requests))
        })
        .await
        .ok_or(format!(
            "the audit log lacks the admin's DELETEs or a {} final DELETE",
            who.label()
        ))?;
    let gone = sorted(gone.iter().map(|g| (g - t0) as f64 / 1e9).collect());
    let b = Burst {
        last: pct(&gone, 100.0),
        median: pct(&gone, 50.0),
        cpu,
        rss0,
        hwm,
        hwm_reset,
        requests,
        t0,
    };
    println!(
        "{}: {} pods: first gone {:.2} s, median {:.2} s, last {:.2} s; {:.2} CPU-s; RSS {:.1} MiB at the start, peak {:.1} MiB {}; {} API requests ({:.2} per pod)",
        who.label(),
        list.len(),
        pct(&gone, 0.0),
        b.median,
        b.last,
        b.cpu,
        b.rss0,
        b.hwm,
        if b.hwm_reset {
            "during the window (VmHWM reset at its start)"
        } else {
            "(VmHWM over the process's life: clear_refs failed)"
        },
        b.requests,
        b.requests as f64 / list.len() as f64
    );
    Ok(b)
}

/// `n` pods named `prefix-<i>` started by a (re)started kubelet, with no reaplet running and
/// the pods of the round before gone (the restarted kubelet finishes a floor's deleted pods):
/// the pods' names and UIDs.
async fn burst_pods(
    s: &mut Stack,
    prefix: &str,
    n: usize,
    before: &[String],
) -> R<(Vec<String>, Vec<String>)> {
    if let Some(agent) = s.reaplet.take() {
        agent.stop();
    }
    s.kubelet.restart().await;
    s.wait_gone(before, Duration::from_millis(100), Duration::from_secs(300))
        .await?;
    let list = names(prefix, n);
    let bodies: Vec<Value> = list.iter().map(|x| pod(x, TRAPS_TERM)).collect();
    let uids = s.create_all(&bodies).await?;
    s.wait_running(&list, Duration::from_secs(600)).await?;
    Ok((list, uids))
}

/// The floor of a burst on this node: `n` more pods started by the kubelet, which is then
/// stopped; the admin's `n` DELETEs (nobody acts on them) and, at the same moment, what an
/// agent must ask of containerd for each pod (StopContainer with the pod's grace, then
/// StopPodSandbox), all at once and straight to containerd. Returns the pods' names and when
/// the last sandbox stop was answered, in seconds from the first DELETE sent.
async fn burst_floor(
    s: &mut Stack,
    prefix: &str,
    n: usize,
    before: &[String],
) -> R<(Vec<String>, f64)> {
    let (list, uids) = burst_pods(s, prefix, n, before).await?;
    s.kubelet.stop();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let cri = s.tb.client();
    let sandboxes = cri.list_sandboxes(None).await.map_err(|e| e.to_string())?;
    let containers = cri.list_containers(None).await.map_err(|e| e.to_string())?;
    let mut work = Vec::with_capacity(n);
    for uid in &uids {
        let sandbox = sandboxes
            .iter()
            .find(|b| &b.pod_uid == uid && b.ready)
            .ok_or(format!("[burst] no ready sandbox of pod {uid}"))?;
        let app = containers
            .iter()
            .find(|c| c.sandbox_id == sandbox.id && c.name == "app")
            .ok_or(format!("[burst] no container app in pod {uid}"))?;
        work.push((app.id.clone(), sandbox.id.clone()));
    }
    let t0 = Instant::now();
    let deletes = futures_util::future::join_all(list.iter().map(|x| s.delete(x.as_str())));
    let stops = futures_util::future::join_all(work.iter().map(|(c, b)| {
        let cri = cri.clone();
        async move {
            cri.stop_container(c, 30).await.map_err(|e| e.to_string())?;
            cri.stop_pod_sandbox(b).await.map_err(|e| e.to_string())?;
            Ok::<f64, String>(t0.elapsed().as_secs_f64())
        }
    }));
    let (deleted, stopped) = tokio::join!(deletes, stops);
    for d in deleted {
        d?;
    }
    let done = sorted(stopped.into_iter().collect::<R<Vec<f64>>>()?);
    println!(
        "floor: {n} pods, the same DELETEs and the CRI stops straight to containerd, no agent: first stopped {:.2} s, median {:.2} s, last {:.2} s",
        pct(&done, 0.0),
        pct(&done, 50.0),
        pct(&done, 100.0)
    );
    Ok((list, pct(&done, 100.0)))
}

/// The steps of reaplet's terminations in the order they happen, by the label printed
/// ("kill ended": the timeline's `containersStopped`, recorded when the kill returns, after
/// the sandbox stop and the runtime's re-check).
const STAGES: [&str; 9] = [
    "reason seen",
    "stop sent",
    "container exited",
    "sandbox stopped",
    "kill ended",
    "volumes done",
    "cgroup removed",
    "status written",
    "object deleted",
];

/// The index in [`STAGES`] of a timeline step (a write counts only when it was answered 2xx).
fn stage(step: &reaplet::timeline::Step) -> Option<usize> {
    use reaplet::timeline::Step;
    Some(match step {
        Step::StopSent { .. } => 1,
        Step::Exited { .. } => 2,
        Step::SandboxStopped { .. } => 3,
        Step::ContainersStopped => 4,
        Step::VolumesDone { .. } => 5,
        Step::CgroupRemoved { .. } => 6,
        Step::StatusWritten { code } if (200..300).contains(code) => 7,
        Step::ObjectDeleted { code } if (200..300).contains(code) => 8,
        _ => return None,
    })
}

/// Where the time of reaplet's burst went, from its own timelines (`/pods/timeline`): for each
/// step, the seconds from the admin's first DELETE (received, `t0` ns) to its first time in
/// each pod, as the median and the last over the pods.
async fn stages(agent: &Agent, list: &[String], t0: i64) {
    let mut at: Vec<Vec<f64>> = vec![Vec::new(); STAGES.len()];
    let mut missing = 0;
    for name in list {
        let t = match agent
            .get(&format!("/pods/timeline?pod=default/{name}"))
            .await
        {
            Some((200, body)) => serde_json::from_str(&body)
                .ok()
                .and_then(|v| reaplet::timeline::Timeline::from_json(v).ok()),
            _ => None,
        };
        let Some(t) = t else {
            missing += 1;
            continue;
        };
        let base = (t.started_unix_ns - t0) as f64 / 1e9;
        at[0].push(base);
        let mut seen = [false; STAGES.len()];
        for e in &t.entries {
            if let Some(i) = stage(&e.step)
                && !seen[i]
            {
                seen[i] = true;
                at[i].push(base + e.at_ms / 1e3);
            }
        }
    }
    let parts: Vec<String> = STAGES
        .iter()
        .zip(at)
        .filter(|(_, v)| !v.is_empty())
        .map(|(l, v)| {
            let v = sorted(v);
            format!("{l} {:.2}/{:.2}", pct(&v, 50.0), pct(&v, 100.0))
        })
        .collect();
    println!(
        "[burst] reaplet's steps, s after the admin's first DELETE (median/last over the pods{}): {}",
        if missing > 0 {
            format!("; {missing} timelines missing")
        } else {
            String::new()
        },
        parts.join(", ")
    );
}

/// How many (floor, reaplet) pairs the burst interleaves: `REAPLET_BENCH_PAIRS`, 5 unless set
/// (at least 1).
fn pairs() -> usize {
    std::env::var("REAPLET_BENCH_PAIRS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5)
        .max(1)
}

/// The floor and reaplet's run, interleaved (floor, reaplet, floor, reaplet, ...) so that a
/// change of the machine's load falls on both: each pair's last gone / the floor's last,
/// printed, and their median.
async fn burst_pairs(s: &mut Stack, n: usize, mut before: Vec<String>) -> R<()> {
    let mut ratios = Vec::new();
    for i in 1..=pairs() {
        let (floor_pods, floor) = burst_floor(s, &format!("burst-f{i}"), n, &before).await?;
        let (list, uids) = burst_pods(s, &format!("burst-r{i}"), n, &floor_pods).await?;
        s.takeover(&uids, None, &["--termination-timelines", "1000"])
            .await?;
        let r = burst_run(s, Who::Reaplet, &list).await?;
        if let Some(agent) = &s.reaplet {
            stages(agent, &list, r.t0).await;
        }
        println!(
            "[burst] pair {i}: floor last {floor:.2} s, reaplet last gone {:.2} s: ratio {:.3}",
            r.last,
            r.last / floor
        );
        ratios.push(r.last / floor);
        before = list;
    }
    let ratios = sorted(ratios);
    println!(
        "[burst] reaplet last gone / the floor's last, {} interleaved pairs: median {:.3} (min {:.3}, max {:.3})",
        ratios.len(),
        pct(&ratios, 50.0),
        pct(&ratios, 0.0),
        pct(&ratios, 100.0)
    );
    Ok(())
}

/// 2. `n` pods deleted at once (the admin's `n` DELETEs concurrently): last gone, the agent's
///    CPU and peak RSS over the window, its API requests in the window per pod.
pub(super) async fn burst_side(n: usize) -> R<Vec<Row>> {
    header(&format!(
        "kubelet 2: {n} pods deleted at once -> last gone; CPU, peak RSS, requests"
    ));
    let mut s = Stack::start("burst").await;
    let mut res = Vec::new();
    for who in [Who::Kubelet, Who::Reaplet] {
        let list = names(&format!("burst-{}", &who.label()[..1]), n);
        let bodies: Vec<Value> = list.iter().map(|x| pod(x, TRAPS_TERM)).collect();
        let t = Instant::now();
        let uids = s.create_all(&bodies).await?;
        s.wait_running(&list, Duration::from_secs(600)).await?;
        println!(
            "[burst] the kubelet started {n} pods in {:.1} s",
            t.elapsed().as_secs_f64()
        );
        if who == Who::Reaplet {
            s.takeover(&uids, None, &[]).await?;
        }
        res.push(burst_run(&s, who, &list).await?);
    }
    s.keep_logs();
    let before = names("burst-r", n);
    let (_, floor) = burst_floor(&mut s, "burst-f0", n, &before).await?;
    let (k, r) = (&res[0], &res[1]);
    println!(
        "[burst] last gone / the floor's last (sequential): kubelet {:.2}, reaplet {:.2}",
        k.last / floor,
        r.last / floor
    );
    burst_pairs(&mut s, n, names("burst-f0", n)).await?;
    let nf = n as f64;
    Ok(vec![
        row(format!("{n} pods at once: last gone"), "s", k.last, r.last),
        row(
            format!("{n} pods at once: median gone"),
            "s",
            k.median,
            r.median,
        ),
        row(
            format!("{n} pods: agent CPU (utime+stime)"),
            "CPU-s",
            k.cpu,
            r.cpu,
        ),
        row(
            format!(
                "{n} pods: agent peak RSS ({})",
                if k.hwm_reset && r.hwm_reset {
                    "VmHWM in the window"
                } else {
                    "VmHWM, life"
                }
            ),
            "MiB",
            k.hwm,
            r.hwm,
        ),
        row(
            format!("{n} pods: agent RSS growth (peak - start)"),
            "MiB",
            k.hwm - k.rss0,
            r.hwm - r.rss0,
        ),
        row(
            format!("{n} pods: agent API requests per pod"),
            "",
            k.requests as f64 / nf,
            r.requests as f64 / nf,
        ),
    ])
}

/// 3. Natural exit: `n` pods (`restartPolicy: Never`) waiting at a gate, opened one at a time
///    after a random pause (0-1 s); the container's `finished_at` (CRI) -> the agent's status
///    PATCH with phase Succeeded/Failed answered.
pub(super) async fn exit_side(n: usize) -> R<Vec<Row>> {
    header(&format!(
        "kubelet 3: natural exit -> terminal status stored, {n} pods each"
    ));
    let mut s = Stack::start("exit").await;
    let gate = Gate::start().await;
    let client = s.tb.client();
    let mut out = Vec::new();
    for who in [Who::Kubelet, Who::Reaplet] {
        let list = names(&format!("exit-{}", &who.label()[..1]), n);
        let bodies: Vec<Value> = list
            .iter()
            .map(|x| {
                let mut p = pod(x, &gate.script(x, 0));
                p["spec"]["restartPolicy"] = "Never".into();
                p
            })
            .collect();
        let uids = s.create_all(&bodies).await?;
        s.wait_running(&list, Duration::from_secs(120)).await?;
        if who == Who::Reaplet {
            s.takeover(&uids, None, &[]).await?;
            let agent = s.reaplet.as_ref().ok_or("no reaplet")?;
            let t = Instant::now();
            while !std::fs::read_to_string(&agent.log)
                .unwrap_or_default()
                .contains("container events subscribed")
            {
                if t.elapsed() > Duration::from_secs(30) {
                    println!("[exit] reaplet did not log a container events subscription in 30 s");
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let mut v = Vec::with_capacity(n);
        for (name, uid) in list.iter().zip(&uids) {
            tokio::time::sleep(Duration::from_millis(rand::random_range(0..1000))).await;
            gate.open(name);
            let patch = s
                .wait_audit(
                    &format!("terminal status of {name}"),
                    Duration::from_secs(60),
                    |r| {
                        r.by(who)
                            && r.verb == "patch"
                            && r.resource == "pods"
                            && r.sub == "status"
                            && r.name == *name
                            && r.code == 200
                            && matches!(
                                r.request["status"]["phase"].as_str(),
                                Some("Succeeded" | "Failed")
                            )
                    },
                )
                .await?;
            let cs = client
                .list_containers(Some(uid))
                .await
                .map_err(|e| e.to_string())?;
            let c = cs
                .iter()
                .find(|c| c.name == "app")
                .ok_or(format!("no container of {name}"))?;
            let st = client
                .container_status(&c.id)
                .await
                .map_err(|e| e.to_string())?;
            v.push(ms_ns(patch.done - st.finished_at));
        }
        let v = sorted(v);
        println!(
            "{}: exit -> terminal status stored median {:.1} ms, p90 {:.1}, min {:.1}, max {:.1} (n={n})",
            who.label(),
            pct(&v, 50.0),
            pct(&v, 90.0),
            pct(&v, 0.0),
            pct(&v, 100.0)
        );
        out.push(v);
        if who == Who::Kubelet {
            for x in &list {
                s.delete(x).await?;
            }
            s.wait_gone(&list, Duration::from_millis(200), Duration::from_secs(60))
                .await?;
        }
    }
    s.keep_logs();
    Ok(vec![pct_row(
        format!("exit -> terminal status stored, median (n={n})"),
        "ms",
        &out,
        50.0,
    )])
}
