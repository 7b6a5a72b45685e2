//! The node boot: the guest is a whole node. containerd 2.x on cgroup v2 with the systemd
//! driver, the real kubelet v1.36 (kubeadm's paths: `/var/lib/kubelet/config.yaml`,
//! `/etc/kubernetes/kubelet.conf`; the systemd cgroup driver, its own `staticPodPath`, graceful
//! node shutdown 30 s / 5 s for critical pods), reaplet installed from its Debian package with
//! the package's own configuration (which reads the kubelet's file and kubeconfig) as the
//! standby service beside it (`takeoverAfter: 20s` through a drop-in), and the real
//! kube-apiserver + etcd on the host, reached at 10.0.2.100:6443 through qemu's user-mode
//! network. The API writes are judged from the API server's audit log (10.0.2.101:80): the
//! kubelet's and reaplet's requests are told apart by their User-Agent (both authenticate as
//! `system:node:reaplet-vm`). Container exits come from containerd's events (`exits.rs`).
//!
//! Every pod is created at the start, by an admin, bound to the node, and run by the kubelet;
//! the scenarios then run in order, each judged on its own:
//! 1. `node_beside_live_kubelet_writes_nothing`: two pods deleted, the kubelet ends them;
//!    reaplet (passive since its start) writes nothing at all;
//! 2. `node_takeover_ends_deleted_pods`: `systemctl stop kubelet`; reaplet takes over; two pods
//!    deleted: the preStop hook and SIGTERM (exit 0), SIGKILL at the 5 s grace and never before
//!    (137); reaplet's status PATCH and DELETE; slices, cgroups, the emptyDir tmpfs, running
//!    containers and ready sandboxes gone;
//! 3. `node_upgrade_while_active_keeps_terminations`: reaplet active, the upgrade package
//!    unpacked (the old process runs on), a TERM-ignoring pod (grace 45) deleted, the package
//!    configured 3 s later (postinst's `try-restart`): the new process resumes on the takeover's
//!    proof within the grace, the pod is SIGKILLed at its grace (no gap: a new takeover would
//!    have added 20 s), and the running pod beside it is untouched;
//! 4. `node_pressure_evicts_on_cgroup_v2` (`pressure.rs`): reaplet, still the node's agent,
//!    evicts a pod that takes memory past `allocatableMemory.available` on cgroup v2 with the
//!    systemd driver, as the kubelet would;
//! 5. `node_handback_writes_nothing_more`: `systemctl start kubelet`: reaplet hands back, and
//!    writes nothing after its `ReapletHandedBack` event (the window runs through the power-off);
//! 6. `node_poweroff_kubelet_owns_graceful_shutdown` (the last: it powers the guest off): the
//!    kubelet alone holds logind's delay inhibitor (its `99-kubelet.conf` gives logind its 30 s)
//!    and ends the pods (SIGTERM honoured: 0; a TERM-ignoring pod SIGKILLed at its own 4 s
//!    grace); reaplet, passive, holds no inhibitor, logs the shutdown and writes nothing.

use super::exits::Exits;
use super::node_kit::*;
use super::{Guest, R, REAPLET, SLACK, UNIT, ensure, secs, sh, show, wait_for};
use crate::host::GUEST_PKI;
use crate::k8s::{self, Audit};
use reaplet::cri::ContainerRunState;
use reaplet::wall_ns;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub(super) async fn run(inp: PathBuf, out: PathBuf) -> i32 {
    let Some(mut g) = Guest::start(out) else {
        return 1;
    };
    let t = Instant::now();
    let r = node_setup(&g, &inp).await;
    let (r, state) = match r {
        Ok((d, api, exits, pods)) => (Ok(d), Some((api, exits, pods))),
        Err(e) => (Err(e), None),
    };
    g.record("node_setup", t, r);
    let Some((api, exits, pods)) = state else {
        return 1;
    };
    let mut n = Node {
        g,
        api,
        exits,
        pods,
    };

    let t = Instant::now();
    let r = beside_live_kubelet(&n).await;
    n.g.record("node_beside_live_kubelet_writes_nothing", t, r);

    let t = Instant::now();
    let r = takeover(&n).await;
    n.g.record("node_takeover_ends_deleted_pods", t, r);

    let t = Instant::now();
    let r = upgrade_while_active(&n, &inp).await;
    n.g.record("node_upgrade_while_active_keeps_terminations", t, r);

    let t = Instant::now();
    let r = super::pressure::evicts_on_cgroup_v2(&n).await;
    n.g.record("node_pressure_evicts_on_cgroup_v2", t, r);

    let t = Instant::now();
    let r = handback(&n).await;
    let since = r.as_ref().map(|(_, i)| *i).ok();
    n.g.record("node_handback_writes_nothing_more", t, r.map(|(d, _)| d));

    // the last scenario: it powers the guest off (the runner collects the results after it)
    let t = Instant::now();
    let r = poweroff(&n, since).await;
    n.g.record("node_poweroff_kubelet_owns_graceful_shutdown", t, r);
    if n.g.failed > 0 { 1 } else { 0 }
}

type Setup = (String, kube::Client, Exits, BTreeMap<String, Running>);

/// containerd and the images (the agent boot's setup), the PKI the host made, the kubelet, the
/// pods, reaplet from its package in standby once the kubelet holds the node's Lease.
async fn node_setup(g: &Guest, inp: &Path) -> R<Setup> {
    let runtime = super::setup(g, inp).await?;
    std::fs::create_dir_all(GUEST_PKI).map_err(|e| e.to_string())?;
    for f in ["ca.crt", "node.crt", "node.key", "admin.crt", "admin.key"] {
        std::fs::copy(inp.join("kube").join(f), Path::new(GUEST_PKI).join(f))
            .map_err(|e| format!("{f}: {e}"))?;
    }
    std::fs::copy(inp.join("kube/node.kubeconfig"), KUBELET_KUBECONFIG)
        .map_err(|e| e.to_string())?;
    std::fs::copy(inp.join("kube/admin.kubeconfig"), ADMIN_KUBECONFIG)
        .map_err(|e| e.to_string())?;
    std::fs::create_dir_all(STATIC_PODS).map_err(|e| e.to_string())?;
    std::fs::write(KUBELET_CONFIG, kubelet_config()).map_err(|e| e.to_string())?;
    super::pressure::make_gate()?;
    let t0 = Instant::now();
    sh("systemctl", &["start", KUBELET])?;
    let api = k8s::client(Path::new(ADMIN_KUBECONFIG)).await;
    let exits = Exits::subscribe().await?;
    let n0 = Node {
        g: Guest::new(g.out.clone())?,
        api,
        exits,
        pods: BTreeMap::new(),
    };
    let node = g.node.clone();
    // pods are admitted against the Node's allocatable: wait until the kubelet wrote it
    wait_for(
        Duration::from_secs(180),
        "the kubelet to report the Node's allocatable",
        || async {
            let (c, v) = n0.api("GET", &format!("/api/v1/nodes/{node}"), None).await;
            (c == 200 && v["status"]["allocatable"]["pods"].is_string()).then_some(())
        },
    )
    .await
    .map_err(|e| {
        format!(
            "{e}; kubelet {}: {}",
            show(KUBELET, "ActiveState"),
            journal(KUBELET)
                .lines()
                .rev()
                .take(15)
                .collect::<Vec<_>>()
                .join(" | ")
        )
    })?;
    let registered = t0.elapsed().as_secs_f64();
    for p in pods(&node) {
        let (c, v) = n0
            .api("POST", "/api/v1/namespaces/default/pods", Some(&p))
            .await;
        ensure(c == 201, || {
            format!("creating {}: {c} {v}", p["metadata"]["name"])
        })?;
    }
    // reaplet once the kubelet holds the node's Lease (a missing Lease would make it active)
    wait_for(Duration::from_secs(60), "the kubelet's Lease", || async {
        let (c, _) = n0
            .api(
                "GET",
                &format!("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{node}"),
                None,
            )
            .await;
        (c == 200).then_some(())
    })
    .await?;
    super::package::dpkg_install(&inp.join("reaplet.deb"))?;
    super::drop_in(
        DROP_IN,
        format!("[Service]\nEnvironment=REAPLET_TAKEOVER_AFTER={TAKEOVER_AFTER}s\n"),
    )?;
    sh("systemctl", &["daemon-reload"])?;
    sh("systemctl", &["start", UNIT])?;
    let mut running = BTreeMap::new();
    for p in pods(&node) {
        let name = p["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let r = wait_running(&n0, &name, Duration::from_secs(240)).await?;
        running.insert(name, r);
    }
    let all_running = t0.elapsed().as_secs_f64();
    wait_for(
        Duration::from_secs(60),
        "reaplet to find the kubelet alive",
        || async {
            journal(UNIT)
                .contains("the kubelet renews its Lease")
                .then_some(())
        },
    )
    .await?;
    let Node { api, exits, .. } = n0;
    let version = sh(REAPLET, &["version"])?;
    Ok((
        format!(
            "{runtime}; the kubelet registered the Node {registered:.1} s after its start, ran all {} \
             pods at {all_running:.1} s; {version} in standby beside it (the package's config, \
             takeoverAfter {TAKEOVER_AFTER}s)",
            running.len()
        ),
        api,
        exits,
        running,
    ))
}

/// Scenario 1: the kubelet ends two deleted pods; reaplet, passive since its start, writes
/// nothing at all.
async fn beside_live_kubelet(n: &Node) -> R<String> {
    let mut deleted = Vec::new();
    for name in LIVE {
        deleted.push(n.delete(name).await?);
    }
    let term = n.exits_of(LIVE[0], Duration::from_secs(60)).await?;
    let kill = n.exits_of(LIVE[1], Duration::from_secs(60)).await?;
    let (t_term, t_kill) = (secs(term[0].2 - deleted[0]), secs(kill[0].2 - deleted[1]));
    ensure(term[0].1 == 0, || {
        format!("{}: exit {}", LIVE[0], term[0].1)
    })?;
    ensure(kill[0].1 == 137 && t_kill >= 3.0 - 0.2, || {
        format!("{}: exit {} at {t_kill:.2} s (grace 3)", LIVE[1], kill[0].1)
    })?;
    for name in LIVE {
        n.wait_gone(name, Duration::from_secs(90)).await?;
    }
    let mut left = Vec::new();
    for name in LIVE {
        left.push(n.nothing_left(name).await?);
    }
    let a = audit().await?;
    let mine: Vec<&Audit> = a.iter().filter(|a| is_reaplet(a) && a.is_write()).collect();
    ensure(mine.is_empty(), || {
        format!("reaplet wrote beside a live kubelet: {:?}", lines(&mine))
    })?;
    for name in LIVE {
        ensure(
            a.iter().any(|a| {
                is_kubelet(a) && a.verb == "delete" && a.resource == "pods" && a.name == name
            }),
            || format!("no DELETE of {name} by the kubelet in the audit log"),
        )?;
    }
    let reads = a.iter().filter(|a| is_reaplet(a)).count();
    let j = journal(UNIT);
    ensure(!j.contains("ReapletTookOver"), || {
        "reaplet took over beside a live kubelet".into()
    })?;
    Ok(format!(
        "the kubelet ended {} (exit 0 at {t_term:.2} s) and {} (exit 137 at {t_kill:.2} s, grace 3) \
         and deleted both; reaplet wrote nothing (its requests since its start: {reads}, no write); \
         {}",
        LIVE[0],
        LIVE[1],
        left.join("; ")
    ))
}

/// Scenario 2: the kubelet stopped, reaplet takes over and ends two deleted pods as the
/// kubelet would have.
async fn takeover(n: &Node) -> R<String> {
    let stopped = Instant::now();
    sh("systemctl", &["stop", KUBELET])?;
    let limit = Duration::from_secs(TAKEOVER_AFTER) + Duration::from_secs_f64(15.0 * SLACK);
    wait_for(limit, "the takeover (ReapletTookOver)", || async {
        journal(UNIT).contains("ReapletTookOver").then_some(())
    })
    .await?;
    let took = stopped.elapsed().as_secs_f64();
    // the kubelet renews every 10 s: its last renewal was at most 10 s before the stop
    ensure(took >= TAKEOVER_AFTER as f64 - 10.0, || {
        format!("took over {took:.1} s after the kubelet stopped")
    })?;
    let a0 = audit().await?.len();
    let mut deleted = Vec::new();
    for name in TAKEN {
        deleted.push(n.delete(name).await?);
    }
    let hooked = n.exits_of(TAKEN[0], Duration::from_secs(90)).await?;
    let stubborn = n.exits_of(TAKEN[1], Duration::from_secs(90)).await?;
    let (t_hook, t_kill) = (
        secs(hooked[0].2 - deleted[0]),
        secs(stubborn[0].2 - deleted[1]),
    );
    let uid = n.uid(TAKEN[0])?;
    let log = PathBuf::from(format!(
        "/var/log/pods/default_{}_{}/app/0.log",
        TAKEN[0],
        uid.as_str()
    ));
    let hook_out = super::prestop_line(&log).await;
    ensure(
        hooked[0].1 == 0 && t_hook >= 1.0 && hook_out.contains("prestop-ran"),
        || {
            format!(
                "hooked: exit {} at {t_hook:.2} s, hook output in {}: {}; expected the 1 s preStop \
                 hook, then SIGTERM honoured",
                hooked[0].1,
                log.display(),
                hook_out.contains("prestop-ran")
            )
        },
    )?;
    ensure(
        stubborn[0].1 == 137 && (5.0 - 0.2..=5.0 + 1.0 + SLACK).contains(&t_kill),
        || {
            format!(
                "stubborn: exit {} at {t_kill:.2} s; expected SIGKILL at its 5 s grace",
                stubborn[0].1
            )
        },
    )?;
    for name in TAKEN {
        n.wait_gone(name, Duration::from_secs(90)).await?;
    }
    let mut left = Vec::new();
    for name in TAKEN {
        left.push(n.nothing_left(name).await?);
    }
    let a = audit().await?;
    let after = &a[a0.min(a.len())..];
    for name in TAKEN {
        let mine: Vec<&Audit> = after
            .iter()
            .filter(|x| is_reaplet(x) && x.is_write() && x.resource == "pods" && x.name == name)
            .collect();
        let status = mine
            .iter()
            .position(|x| x.verb == "patch" && x.subresource == "status" && x.code == 200);
        let delete = mine
            .iter()
            .position(|x| x.verb == "delete" && x.subresource.is_empty() && x.code == 200);
        ensure(
            matches!((status, delete), (Some(s), Some(d)) if s < d),
            || {
                format!(
                    "{name}: reaplet's writes {:?}; expected its status PATCH, then its DELETE",
                    lines(&mine)
                )
            },
        )?;
    }
    let kubelet: Vec<&Audit> = after
        .iter()
        .filter(|x| is_kubelet(x) && x.is_write())
        .collect();
    ensure(kubelet.is_empty(), || {
        format!("the stopped kubelet wrote: {:?}", lines(&kubelet))
    })?;
    Ok(format!(
        "took over {took:.1} s after `systemctl stop kubelet` (threshold {TAKEOVER_AFTER} s); \
         hooked: preStop ran, exit 0 at {t_hook:.2} s; stubborn: exit 137 at {t_kill:.2} s \
         (grace 5); each: reaplet's status PATCH then DELETE, nothing from the kubelet; {}",
        left.join("; ")
    ))
}

/// Scenario 3: the package upgraded while reaplet is the node's agent, a termination under
/// way: the new process resumes it on the takeover's proof (seconds), with its deadline, and a
/// running pod is untouched.
async fn upgrade_while_active(n: &Node, inp: &Path) -> R<String> {
    let before = n.container_state(BYSTANDER).await?;
    ensure(before.state == ContainerRunState::Running, || {
        format!("{BYSTANDER} is not running before the upgrade: {before:?}")
    })?;
    let a0 = audit().await?.len();
    let pid0 = show(UNIT, "MainPID");
    // the upgrade's files first (the old process runs on), so that its restart comes when the
    // scenario says: under TCG a whole `dpkg -i` took 18 s, past the pod's grace
    super::package::dpkg_unpack(&inp.join(super::package::UPGRADE))?;
    let deleted = n.delete(SLOW).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let t = Instant::now();
    super::package::dpkg_configure()?;
    let took = t.elapsed().as_secs_f64();
    let pid = super::package::wait_active(&pid0).await?;
    let upgraded = secs(wall_ns() - deleted);
    // it starts passive and resumes on the takeover's proof (issue 44: three failed probes,
    // the Lease's age carried over in the marker, the consistent read), seconds after its start
    let authority = wait_for(
        Duration::from_secs(SLOW_GRACE as u64),
        "the new process's ReapletTookOver line",
        || async {
            sh(
                "journalctl",
                &[&format!("_PID={pid}"), "--no-pager", "-o", "cat"],
            )
            .ok()?
            .lines()
            .find(|l| l.contains("ReapletTookOver"))
            .map(str::to_owned)
        },
    )
    .await
    .map_err(|e| format!("the new process (pid {pid}) did not resume as the node's agent: {e}"))?;
    let resumed = secs(wall_ns() - deleted);
    ensure(authority.contains("resumed as the node's agent"), || {
        format!("the new process (pid {pid}) did not resume as the node's agent: {authority:?}")
    })?;
    let slow = n
        .exits_of(SLOW, Duration::from_secs(SLOW_GRACE as u64 + 60))
        .await?;
    let t_kill = secs(slow[0].2 - deleted);
    let g = SLOW_GRACE as f64;
    // the scenario shows a termination carried across the restart only if the new process
    // was the agent before the grace ran out
    ensure(resumed < g, || {
        format!(
            "{SLOW}: the new process resumed at {resumed:.1} s (restarted at {upgraded:.1} s), \
             not within the {g} s grace: the upgrade did not fall inside the termination"
        )
    })?;
    ensure(
        slow[0].1 == 137 && t_kill >= g - 0.2 && t_kill <= g + 1.0 + SLACK,
        || {
            format!(
                "{SLOW}: exit {} at {t_kill:.2} s; expected SIGKILL at its {g} s grace, across the \
                 upgrade (restarted at {upgraded:.1} s, resumed at {resumed:.1} s)",
                slow[0].1
            )
        },
    )?;
    let (_, bid) = &n.running(BYSTANDER)?.containers[0];
    super::package::untouched(&n.g, bid, &before).await?;
    n.wait_gone(SLOW, Duration::from_secs(90)).await?;
    let left = n.nothing_left(SLOW).await?;
    let a = audit().await?;
    let after = &a[a0.min(a.len())..];
    let touched: Vec<&Audit> = after
        .iter()
        .filter(|x| x.is_write() && x.resource == "pods" && x.name == BYSTANDER)
        .collect();
    ensure(touched.is_empty(), || {
        format!("writes about {BYSTANDER}: {:?}", lines(&touched))
    })?;
    ensure(
        after
            .iter()
            .any(|x| is_reaplet(x) && x.verb == "delete" && x.name == SLOW && x.code == 200),
        || format!("reaplet did not delete {SLOW}"),
    )?;
    Ok(format!(
        "{SLOW} (grace {SLOW_GRACE}, ignores SIGTERM) deleted after the upgrade's unpack, its \
         configure 3 s later (dpkg --configure {took:.1} s; pid {pid0} -> {pid} at {upgraded:.1} s, \
         resumed active at {resumed:.1} s: {authority:?}); {SLOW} SIGKILLed \
         at {t_kill:.2} s (no gap), deleted by reaplet; {BYSTANDER}'s container ran through it \
         untouched, no write about it; {left}"
    ))
}

/// Scenario 4: the kubelet back, reaplet hands back and writes nothing more. Returns the audit
/// position of the hand-back event (the power-off's window starts there).
async fn handback(n: &Node) -> R<(String, usize)> {
    let started = Instant::now();
    sh("systemctl", &["start", KUBELET])?;
    wait_for(
        Duration::from_secs(120),
        "the hand-back (ReapletHandedBack)",
        || async { journal(UNIT).contains("ReapletHandedBack").then_some(()) },
    )
    .await?;
    let handed = started.elapsed().as_secs_f64();
    tokio::time::sleep(WINDOW).await;
    let a = audit().await?;
    let at = a
        .iter()
        .rposition(|x| {
            is_reaplet(x)
                && x.resource == "events"
                && x.request.to_string().contains("ReapletHandedBack")
        })
        .ok_or("no ReapletHandedBack event in the audit log")?;
    let more: Vec<&Audit> = a[at + 1..]
        .iter()
        .filter(|x| is_reaplet(x) && x.is_write())
        .collect();
    ensure(more.is_empty(), || {
        format!("reaplet wrote after handing back: {:?}", lines(&more))
    })?;
    let st = n.container_state(BYSTANDER).await?;
    ensure(st.state == ContainerRunState::Running, || {
        format!("{BYSTANDER} stopped: {st:?}")
    })?;
    let released = journal(UNIT).contains("standby: logind inhibitor released");
    Ok((
        format!(
            "handed back {handed:.1} s after `systemctl start kubelet`; no write by reaplet after \
             its ReapletHandedBack event ({:.0} s watched); {BYSTANDER} still running; reaplet \
             released its logind inhibitor on the hand-back: {released}",
            WINDOW.as_secs_f64()
        ),
        at,
    ))
}

/// Scenario 5: `systemctl poweroff` with the kubelet's graceful node shutdown: the kubelet
/// alone holds the inhibitor and ends the pods; reaplet in standby records and writes nothing.
async fn poweroff(n: &Node, since: Option<usize>) -> R<String> {
    super::poweroff::delay_lock("kubelet", Duration::from_secs(90)).await?;
    let mine = super::poweroff::inhibitors("reaplet")?;
    ensure(mine.is_empty(), || {
        format!("reaplet holds an inhibitor beside the kubelet: {mine:?}")
    })?;
    let dropin = std::fs::read_to_string(KUBELET_LOGIND).unwrap_or_default();
    let delay = super::poweroff::logind_delay()?;
    ensure(delay == Duration::from_secs(SHUTDOWN_GRACE), || {
        format!(
            "logind's InhibitDelayMaxUSec is {delay:?}, not the kubelet's {SHUTDOWN_GRACE} s \
             ({KUBELET_LOGIND}: {dropin:?})"
        )
    })?;
    let running = [BYSTANDER, PW_KILL];
    let limit = Duration::from_secs_f64(SHUTDOWN_GRACE as f64 + 15.0 * SLACK);
    println!(
        "node poweroff: systemctl poweroff (the kubelet's shutdownGracePeriod {SHUTDOWN_GRACE}s)"
    );
    let watch = futures_util::future::join_all(running.iter().map(|p| n.exits_of(p, limit)));
    let (stops, term_at, t0) = super::poweroff::power_off(limit, watch).await?;
    let mut ends = Vec::new();
    for (name, s) in running.iter().zip(stops) {
        let s = s?;
        ends.push((*name, s[0].1, secs(s[0].2 - t0)));
    }
    let down = term_at.map(|t| secs(t - t0));
    let timeline: Vec<String> = ends
        .iter()
        .map(|(n, c, s)| format!("{n} exited {c} at {s:.2} s"))
        .collect();
    println!(
        "node poweroff: {}; units stopped at {down:?} s",
        timeline.join(", ")
    );
    ensure(ends[0].1 == 0, || {
        format!(
            "{BYSTANDER}: {:?}, expected exit 0 (SIGTERM honoured)",
            ends[0]
        )
    })?;
    let g = PW_GRACE as f64;
    ensure(
        ends[1].1 == 137 && ends[1].2 >= g - 0.2 && ends[1].2 <= g + 2.0 * SLACK,
        || {
            format!(
                "{PW_KILL}: {:?}, expected SIGKILL at its own {g} s grace",
                ends[1]
            )
        },
    )?;
    let down = down.ok_or("no SIGTERM: the machine did not begin to go down in time")?;
    // nobody held logind up to its limit: the kubelet released its inhibitor, reaplet had none
    ensure(!super::poweroff::logind_timed_out(), || {
        format!("logind's {SHUTDOWN_GRACE} s delay ran out (units stopped at {down:.2} s)")
    })?;
    let last = ends.iter().map(|e| e.2).fold(0.0, f64::max);
    ensure(down >= last, || {
        format!("the units were stopped at {down:.2} s, before the last pod ended ({last:.2} s)")
    })?;
    // the kubelet's statuses: give its status manager a moment (the units are stopping)
    let shutdown_status = |a: &Audit, name: &str| {
        is_kubelet(a)
            && a.verb == "patch"
            && a.subresource == "status"
            && a.name == name
            && a.request.to_string().contains("imminent node shutdown")
    };
    let mut a = audit().await?;
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(5)
        && !running
            .iter()
            .all(|name| a.iter().any(|x| shutdown_status(x, name)))
    {
        tokio::time::sleep(Duration::from_millis(500)).await;
        a = audit().await?;
    }
    let statuses: Vec<&str> = running
        .iter()
        .copied()
        .filter(|name| a.iter().any(|x| shutdown_status(x, name)))
        .collect();
    let from = since.map_or(0, |i| i + 1).min(a.len());
    let mine: Vec<&Audit> = a[from..]
        .iter()
        .filter(|x| is_reaplet(x) && x.is_write())
        .collect();
    ensure(mine.is_empty(), || {
        format!(
            "reaplet wrote during the kubelet's shutdown: {:?}",
            lines(&mine)
        )
    })?;
    let j = journal(UNIT);
    ensure(
        j.contains("node shutdown announced while in standby: the kubelet ends the pods"),
        || "reaplet's journal does not record the shutdown it left to the kubelet".into(),
    )?;
    ensure(!j.contains("node shutdown: ending pods"), || {
        "reaplet ended pods for the shutdown beside the kubelet".into()
    })?;
    Ok(format!(
        "the kubelet alone held logind's delay inhibitor ({KUBELET_LOGIND}: logind's delay \
         {delay:?}); after `systemctl poweroff`: {}; the kubelet's shutdown statuses seen for \
         {statuses:?}; the machine went down (driver SIGTERM) at {down:.2} s; reaplet (standby, \
         no inhibitor) logged the shutdown as the kubelet's and wrote nothing",
        timeline.join(", ")
    ))
}
