//! The node-pressure scenario: the race with the kernel's OOM killer. The kubelet's
//! configuration leaves the pods 1 GiB (`kubeReserved` takes the rest of the machine) with
//! `evictionHard: memory.available: 200Mi` (copied to `allocatableMemory.available`): an
//! eviction is due once the pods' working set passes 824 MiB, and the kernel kills at
//! 1024 MiB. A BestEffort pod (`restartPolicy: Never`) takes 700 MB at once, then grows at a
//! fixed rate until something ends it: exit 0 is the agent's SIGTERM (a clean eviction, its
//! status written), exit 99 is its allocation killed by the kernel first. One pod per rate per
//! agent, all created before the first round (a node under memory pressure admits no new
//! BestEffort pod); the kubelet's rounds, then the takeover and reaplet's.
//!
//! Also: the time from the crossing (the pods' cgroup below the threshold, read here every
//! 20 ms) to the pod's exit; each agent's CPU over an idle minute after its rounds (reaplet
//! acting, its pressure pass every second; the kubelet doing all it does); and the cost of
//! one pressure pass (`SignalReader::observe` on this host, timed in this process).

use super::stack::Stack;
use super::*;
use crate::gate::Gate;
use reaplet::pressure::signals::SignalReader;

const PODS_BYTES: u64 = 1 << 30;
const THRESHOLD: i64 = 200 << 20;
const START_BYTES: u64 = 700_000_000;

fn mem_total() -> R<u64> {
    let m = std::fs::read_to_string("/proc/meminfo").map_err(|e| e.to_string())?;
    m.lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|k| k * 1024)
        .ok_or("no MemTotal".into())
}

/// Waits at the gate, then takes [`START_BYTES`] and grows by `mib_s` MiB a second. The
/// writer stops when its reader is gone (an OOM-killed `tail`), so the pod exits 99.
fn grower(gate: &Gate, name: &str, mib_s: u64) -> Value {
    let chunk = mib_s * (1 << 20) / 10;
    let script = format!(
        "trap 'exit 0' TERM; until wget -q -O /dev/null http://{addr}/{name}; do sleep 0.1; done; \
         (head -c {START_BYTES} /dev/zero; while head -c {chunk} /dev/zero; do sleep 0.1; done) \
         | tail >/dev/null & wait $!; exit 99",
        addr = gate.addr
    );
    let mut p = pod(name, &script);
    p["spec"]["restartPolicy"] = json!("Never");
    p
}

struct Round {
    rate: u64,
    /// MiB/s as measured between the start allocation and the crossing.
    measured: f64,
    evicted: bool,
    /// crossing -> exit, s
    after: f64,
}

async fn container_of(s: &Stack, name: &str) -> R<String> {
    let (_, p) = s
        .cluster
        .raw(
            "GET",
            &format!("/api/v1/namespaces/default/pods/{name}"),
            None,
            None,
        )
        .await;
    p["status"]["containerStatuses"][0]["containerID"]
        .as_str()
        .map(|c| c.trim_start_matches("containerd://").to_owned())
        .ok_or(format!("{name}: no container ID"))
}

/// Container exits from the runtime's events (the kubelet removes an evicted pod's containers
/// once it synced, so a `ContainerStatus` read after the exit can find nothing).
struct ExitFeed {
    sub: reaplet::cri::EventSubscription,
    seen: std::collections::HashMap<String, (i32, i64)>,
}

impl ExitFeed {
    fn exit_of(&mut self, id: &str) -> R<Option<(i32, i64)>> {
        loop {
            match self.sub.events.try_recv() {
                Ok(ev) => {
                    if let (reaplet::cri::ContainerEventKind::Exited, Some(c), Some(at)) =
                        (ev.kind, ev.exit_code, ev.exited_at)
                    {
                        self.seen.entry(ev.container_id).or_insert((c, at));
                    }
                }
                Err(tokio::sync::mpsc::error::TryRecvError::Empty) => break,
                Err(e) => return Err(format!("container events: {e}")),
            }
        }
        Ok(self.seen.get(id).copied())
    }
}

async fn round(
    s: &Stack,
    gate: &Gate,
    reader: &SignalReader,
    exits: &mut ExitFeed,
    name: &str,
    rate: u64,
) -> R<Round> {
    let id = container_of(s, name).await?;
    gate.open(name);
    let t0 = Instant::now();
    let mut start: Option<(Instant, i64)> = None;
    let mut crossed: Option<(Instant, i64, i64)> = None;
    loop {
        if let Some(o) = reader.observe().allocatable_memory {
            let ws = o.capacity - o.available;
            if start.is_none() && ws >= START_BYTES as i64 {
                start = Some((Instant::now(), ws));
            }
            if crossed.is_none() && o.available < THRESHOLD {
                crossed = Some((Instant::now(), ws, wall_ns()));
            }
        }
        if let Some((exit_code, finished_at)) = exits.exit_of(&id)? {
            let crossed =
                crossed.ok_or(format!("{name} exited {exit_code} before the crossing"))?;
            let measured = match start {
                Some((t, ws)) if crossed.0 > t => {
                    (crossed.1 - ws) as f64 / (1 << 20) as f64 / (crossed.0 - t).as_secs_f64()
                }
                _ => f64::NAN,
            };
            return Ok(Round {
                rate,
                measured,
                evicted: match exit_code {
                    0 => true,
                    99 | 137 => false,
                    c => return Err(format!("{name}: unexpected exit {c}")),
                },
                after: (finished_at - crossed.2) as f64 / 1e9,
            });
        }
        if t0.elapsed() > Duration::from_secs(240) {
            return Err(format!("{name}: still running after 240 s"));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// CPU seconds `pid` spends over `d`.
async fn idle_cpu(pid: u32, d: Duration) -> f64 {
    let c0 = cpu_secs(pid);
    tokio::time::sleep(d).await;
    cpu_secs(pid) - c0
}

/// 7. The race with the OOM killer at each of `rates` (MiB/s).
pub(super) async fn pressure_side(rates: &[u64]) -> R<Vec<Row>> {
    header(
        "kubelet 7: node pressure: a pod growing toward the pods' 1 GiB limit, evicted or OOM-killed",
    );
    let reserved = mem_total()? - PODS_BYTES;
    let eviction = format!(
        "evictionHard: {{memory.available: \"200Mi\", nodefs.available: \"1%\", imagefs.available: \"1%\"}}\n\
         kubeReserved: {{memory: \"{reserved}\"}}\n\
         enforceNodeAllocatable: [pods]"
    );
    let mut s = Stack::start_with("pressure", &eviction).await;
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").map_err(|e| e.to_string())?;
    let hierarchies = reaplet::cgroups::hierarchies(&reaplet::volumes::parse_mountinfo(&mounts));
    let naming = reaplet::cgroups::CgroupNaming::new(
        reaplet::cgroups::CgroupDriver::Cgroupfs,
        &s.tb.cgroup_root,
    )
    .map_err(|e| e.to_string())?;
    let reader = SignalReader::host(&hierarchies, &naming).ok_or("no memory hierarchy")?;
    // one pass's cost on this host
    let n = 2000;
    let t = Instant::now();
    for _ in 0..n {
        std::hint::black_box(reader.observe());
    }
    let pass_us = t.elapsed().as_secs_f64() * 1e6 / n as f64;
    println!(
        "one pressure pass (SignalReader::observe, this host): {pass_us:.1} us, so {:.3} millicores at one a second",
        pass_us / 1000.0
    );
    let gate = Gate::start().await;
    let mut bodies = Vec::new();
    let mut names_all = Vec::new();
    // Priorities in round order: each agent's victim is the pod growing in that round whatever
    // the kubelet's stats say (a pod missing from its summary ranks first, and the idle growers
    // also exceed their request of 0).
    for who in [Who::Kubelet, Who::Reaplet] {
        for r in rates {
            let name = format!("grow-{}-{r}", &who.label()[..1]);
            let (code, v) = s
                .cluster
                .raw(
                    "POST",
                    "/apis/scheduling.k8s.io/v1/priorityclasses",
                    None,
                    Some(&json!({
                        "apiVersion": "scheduling.k8s.io/v1",
                        "kind": "PriorityClass",
                        "metadata": {"name": name},
                        "value": 10 * (names_all.len() + 1),
                    })),
                )
                .await;
            if code != 201 {
                return Err(format!("PriorityClass {name}: {code} {v}"));
            }
            let mut b = grower(&gate, &name, *r);
            b["spec"]["priorityClassName"] = json!(name);
            bodies.push(b);
            names_all.push(name);
        }
    }
    let mut exits = ExitFeed {
        sub: s
            .tb
            .client()
            .container_events()
            .await
            .map_err(|e| e.to_string())?,
        seen: Default::default(),
    };
    let uids = s.create_all(&bodies).await?;
    s.wait_running(&names_all, Duration::from_secs(120)).await?;
    let mut results: Vec<Vec<Round>> = Vec::new();
    let mut idle = Vec::new();
    for who in [Who::Kubelet, Who::Reaplet] {
        if who == Who::Reaplet {
            s.takeover(&uids, None, &[]).await?;
        }
        let mut rounds = Vec::new();
        for r in rates {
            let name = format!("grow-{}-{r}", &who.label()[..1]);
            let x = round(&s, &gate, &reader, &mut exits, &name, *r).await?;
            println!(
                "{}: {r} MiB/s (measured {:.0}): {} {:.2} s after the crossing",
                who.label(),
                x.measured,
                if x.evicted { "evicted" } else { "OOM-killed" },
                x.after
            );
            rounds.push(x);
            // the memory back before the next round
            let t = Instant::now();
            while reader
                .observe()
                .allocatable_memory
                .is_some_and(|o| o.available < 600 << 20)
            {
                if t.elapsed() > Duration::from_secs(60) {
                    return Err("the pods' memory not freed within 60 s".into());
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        let pid = s.pid(who)?;
        idle.push(idle_cpu(pid, Duration::from_secs(60)).await);
        results.push(rounds);
        s.keep_logs();
    }
    println!("{:>10} {:>22} {:>22}", "MiB/s", "kubelet", "reaplet");
    let show = |x: &Round| {
        format!(
            "{} {:.1} s",
            if x.evicted { "evicted" } else { "OOM-killed" },
            x.after
        )
    };
    for (k, r) in results[0].iter().zip(&results[1]) {
        println!("{:>10} {:>22} {:>22}", k.rate, show(k), show(r));
    }
    let evicted = |v: &[Round]| v.iter().filter(|x| x.evicted).count() as f64;
    let median_after = |v: &[Round]| pct(&sorted(v.iter().map(|x| x.after).collect()), 50.0);
    Ok(vec![
        row(
            format!(
                "pressure: growing pods evicted before the OOM killer (of {})",
                rates.len()
            ),
            "",
            evicted(&results[0]),
            evicted(&results[1]),
        ),
        row(
            "pressure: crossing -> pod ended (evicted or killed), median",
            "s",
            median_after(&results[0]),
            median_after(&results[1]),
        ),
        row(
            "idle agent after the rounds: CPU over 60 s (utime+stime)",
            "s",
            idle[0],
            idle[1],
        ),
    ])
}
