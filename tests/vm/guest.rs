//! Guest side: the scenarios in order, the first installing reaplet from its Debian package
//! (and upgrading and purging it), then the package installed for the rest. Every scenario
//! writes one line to `results.jsonl`; a failed scenario does not stop the next.

use crate::Outcome;
use reaplet::cgroups::CgroupDriver;
use reaplet::cri::{ContainerRunState, CriClient, CriConfig, Runtime};
use reaplet::pod::{PodUid, QosClass};
use reaplet::wall_ns;
use reaplet_testbed::{
    self, ContainerTemplate, IGNORES_TERM, LaunchedPod, PodTemplate, TRAPS_TERM, Testbed,
};
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

#[path = "exits.rs"]
mod exits;
#[path = "node.rs"]
mod node;
#[path = "node_kit.rs"]
mod node_kit;
#[path = "outage.rs"]
mod outage;
#[path = "package.rs"]
mod package;
#[path = "poweroff.rs"]
mod poweroff;
#[path = "pressure.rs"]
mod pressure;
#[path = "rescue.rs"]
mod rescue;

type R<T> = Result<T, String>;

const SOCKET: &str = "/run/containerd/containerd.sock";
const MANIFESTS: &str = "/etc/kubernetes/manifests";
const UNIT: &str = "reaplet";
/// The packaged binary (the production build: no test hooks).
const REAPLET: &str = "/usr/bin/reaplet";
/// The test-hooks build among the inputs (tests/vm/host.rs), for the watchdog scenario alone.
const TEST_HOOKS: &str = "reaplet-test-hooks";
/// The watchdog scenario's drop-in that runs [`TEST_HOOKS`] instead of the packaged binary.
const TEST_HOOKS_DROP_IN: &str = "/etc/systemd/system/reaplet.service.d/test-hooks.conf";
const STATUS_ADDR: &str = "127.0.0.1:10266";
/// Slack for a debug build under software emulation, on top of every timing bound.
const SLACK: f64 = 4.0;

pub fn main(args: &[String]) -> i32 {
    let (Some(inp), Some(out)) = (args.first(), args.get(1)) else {
        eprintln!("usage: vm-guest --guest IN OUT [agent|node]");
        return 2;
    };
    let node_boot = args.get(2).map(String::as_str) == Some("node");
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("tokio: {e}");
            return 1;
        }
    };
    if node_boot {
        rt.block_on(node::run(PathBuf::from(inp), PathBuf::from(out)))
    } else {
        rt.block_on(run(PathBuf::from(inp), PathBuf::from(out)))
    }
}

struct Guest {
    out: PathBuf,
    tb: Testbed,
    cri: CriClient,
    node: String,
    failed: usize,
}

fn secs(ns: i64) -> f64 {
    ns as f64 / 1e9
}

/// Runs a command; its stdout, or an error with its stderr.
fn sh(cmd: &str, args: &[&str]) -> R<String> {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .map_err(|e| format!("{cmd}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{cmd} {} failed ({}): {}{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn show(unit: &str, prop: &str) -> String {
    sh("systemctl", &["show", "-P", prop, unit]).unwrap_or_default()
}

/// Writes a systemd drop-in (or any file) at `path`, its directory made first.
fn drop_in(path: &str, text: impl AsRef<[u8]>) -> R<()> {
    std::fs::create_dir_all(Path::new(path).parent().unwrap_or(Path::new("/")))
        .and_then(|()| std::fs::write(path, text))
        .map_err(|e| format!("writing {path}: {e}"))
}

fn ensure(cond: bool, msg: impl FnOnce() -> String) -> R<()> {
    if cond { Ok(()) } else { Err(msg()) }
}

/// Polls `f` every 50 ms until it yields `Some` or `limit` passes.
/// The container log at `log` once the preStop hook's line (`prestop-ran`) is in it: the
/// runtime copies a container's output to its log asynchronously, so the line is waited for
/// (up to [`SLACK`]), not read once; what the log holds is returned when it never comes.
async fn prestop_line(log: &Path) -> String {
    wait_for(
        Duration::from_secs_f64(SLACK),
        "the preStop hook's line",
        || async {
            std::fs::read_to_string(log)
                .ok()
                .filter(|t| t.contains("prestop-ran"))
        },
    )
    .await
    .unwrap_or_else(|_| std::fs::read_to_string(log).unwrap_or_default())
}

async fn wait_for<T, F, Fut>(limit: Duration, what: &str, mut f: F) -> R<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = f().await {
            return Ok(v);
        }
        if start.elapsed() > limit {
            return Err(format!("timed out after {limit:?} waiting for {what}"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

impl Guest {
    fn record(&mut self, scenario: &str, started: Instant, r: R<String>) {
        let secs = started.elapsed().as_secs_f64();
        let (ok, detail) = match r {
            Ok(d) => (true, d),
            Err(e) => (false, e),
        };
        if !ok {
            self.failed += 1;
        }
        println!(
            "scenario {scenario}: {} ({secs:.1} s): {detail}",
            if ok { "ok" } else { "FAILED" }
        );
        let line = serde_json::to_string(&Outcome {
            scenario: scenario.into(),
            ok,
            secs,
            detail,
        })
        .unwrap_or_default();
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.out.join("results.jsonl"))
        {
            let _ = writeln!(f, "{line}");
        }
    }

    /// Writes the manifest for `t` (as the kubelet's file source reads it) and gives `t` the
    /// UID and name the file source derives from it.
    fn write_manifest(&self, t: &mut PodTemplate) -> R<PathBuf> {
        let path = Path::new(MANIFESTS).join(format!("{}.json", t.name));
        let mut obj = t.api_object();
        if let Some(m) = obj["metadata"].as_object_mut() {
            m.remove("uid");
        }
        if let Some(o) = obj.as_object_mut() {
            o.remove("status");
        }
        let bytes = serde_json::to_vec_pretty(&obj).map_err(|e| e.to_string())?;
        // written under a dot name (skipped by the file source), then renamed: reaplet never
        // reads half a file; the UID covers the final path, so load it from there
        let tmp = Path::new(MANIFESTS).join(format!(".{}.json", t.name));
        std::fs::write(&tmp, &bytes).map_err(|e| format!("writing {}: {e}", tmp.display()))?;
        std::fs::rename(&tmp, &path).map_err(|e| format!("moving {}: {e}", path.display()))?;
        let info = reaplet::file_source::load(&path, &self.node).map_err(|e| e.to_string())?;
        t.uid = info.uid.to_string();
        t.name = info.name.clone();
        Ok(path)
    }

    async fn launch(&self, t: &PodTemplate) -> R<LaunchedPod> {
        reaplet_testbed::launch(&self.tb, t)
            .await
            .map_err(|e| format!("launching {}: {e}", t.name))
    }

    /// A TERM-trapping pod (grace 30) from a manifest, launched and known to reaplet.
    async fn manifest_pod(&self, name: &str) -> R<(PathBuf, LaunchedPod)> {
        let mut t = PodTemplate::new(name, 30).container(ContainerTemplate::new("app", TRAPS_TERM));
        let path = self.write_manifest(&mut t)?;
        let p = self.launch(&t).await?;
        self.wait_known(&p.uid).await?;
        Ok((path, p))
    }

    /// reaplet's `/pods` lists `uid`.
    async fn reaplet_knows(&self, uid: &PodUid) -> bool {
        let Ok(addr) = STATUS_ADDR.parse::<SocketAddr>() else {
            return false;
        };
        matches!(reaplet::server::fetch(addr, "/pods").await,
            Ok((200, body)) if body.contains(uid.as_str()))
    }

    async fn wait_known(&self, uid: &PodUid) -> R<()> {
        wait_for(
            Duration::from_secs(60),
            "reaplet to list the pod",
            || async { self.reaplet_knows(uid).await.then_some(()) },
        )
        .await
    }

    async fn running(&self, p: &LaunchedPod) -> R<bool> {
        let cs = self
            .cri
            .list_containers(Some(p.uid.as_str()))
            .await
            .map_err(|e| e.to_string())?;
        Ok(cs.iter().any(|c| c.state.may_run()))
    }

    /// Waits until every container of `p` has exited and returns (name, exit code,
    /// finished_at ns) for each, read as soon as it exits: a finished pod's sandbox and
    /// containers are garbage-collected right after its termination.
    async fn wait_stopped(&self, p: &LaunchedPod, limit: Duration) -> R<Vec<(String, i32, i64)>> {
        let mut got: Vec<Option<(String, i32, i64)>> = vec![None; p.containers.len()];
        let start = Instant::now();
        loop {
            for (slot, (name, id)) in got.iter_mut().zip(&p.containers) {
                if slot.is_some() {
                    continue;
                }
                let st =
                    self.cri.container_status(id).await.map_err(|e| {
                        format!("status of {name} gone before it was seen exited: {e}")
                    })?;
                if st.state == ContainerRunState::Exited {
                    *slot = Some((name.clone(), st.exit_code, st.finished_at));
                }
            }
            if got.iter().all(Option::is_some) {
                return Ok(got.into_iter().flatten().collect());
            }
            if start.elapsed() > limit {
                return Err(format!("{} still running after {limit:?}", p.uid));
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// The pod's cgroup (a systemd slice) and its unit name.
    fn slice(&self, uid: &PodUid) -> (PathBuf, String) {
        let rel = self.tb.naming().pod_cgroup(uid, QosClass::BestEffort);
        let unit = rel
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        (Path::new("/sys/fs/cgroup").join(rel), unit)
    }

    /// Waits until the pod's slice directory is gone and systemd no longer has the slice active.
    async fn wait_slice_gone(&self, uid: &PodUid) -> R<String> {
        let (path, unit) = self.slice(uid);
        wait_for(Duration::from_secs(30), "the pod slice to go", || async {
            (!path.exists() && show(&unit, "ActiveState") != "active").then_some(())
        })
        .await
        .map_err(|e| {
            format!(
                "{e}: {} exists={} unit {unit} ActiveState={}",
                path.display(),
                path.exists(),
                show(&unit, "ActiveState")
            )
        })?;
        Ok(format!(
            "{unit}: directory gone, unit {}",
            show(&unit, "ActiveState")
        ))
    }
}

impl Guest {
    /// The driver's view of the node: containerd's CRI, the test bed's pods (the systemd
    /// driver, below the root cgroup), the results in `out`.
    fn new(out: PathBuf) -> R<Guest> {
        let node = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_lowercase())
            .unwrap_or_default();
        let tb = Testbed::attach(PathBuf::from("/var/lib/reaplet-vm"), "/".into())
            .with_runtime(PathBuf::from(SOCKET), CgroupDriver::Systemd);
        let cri = CriClient::new(&CriConfig {
            endpoint: format!("unix://{SOCKET}"),
            request_timeout: Duration::from_secs(60),
        })
        .map_err(|e| format!("CRI client: {e}"))?;
        Ok(Guest {
            out,
            tb,
            cri,
            node,
            failed: 0,
        })
    }

    /// [`Guest::new`], or `None` with the error said.
    fn start(out: PathBuf) -> Option<Guest> {
        Guest::new(out).map_err(|e| eprintln!("{e}")).ok()
    }
}

async fn run(inp: PathBuf, out: PathBuf) -> i32 {
    let Some(mut g) = Guest::start(out) else {
        return 1;
    };
    let t = Instant::now();
    let r = setup(&g, &inp).await;
    let ok = r.is_ok();
    g.record("setup", t, r);
    if !ok {
        return 1;
    }

    let t = Instant::now();
    let r = package::install_upgrade_purge(&g, &inp).await;
    g.record("package_install_upgrade_purge", t, r);

    // the rest runs on the upgrade package, installed again after the purge
    let t = Instant::now();
    let r = package::install(&inp).await;
    let ok = r.is_ok();
    g.record("install", t, r);
    if !ok {
        return 1;
    }

    let t = Instant::now();
    let r = check_passes();
    g.record("check_passes", t, r);

    // an orphan: a pod in the runtime that no source will ever want, launched while reaplet
    // is not running (grace 600 in its annotations: only the orphan rule gives grace 1)
    let orphan_t =
        PodTemplate::new("forgotten", 600).container(ContainerTemplate::new("app", IGNORES_TERM));
    let orphan = g.launch(&orphan_t).await;

    let t = Instant::now();
    let r = ready_only_after_cri(&g).await;
    let active_ns = r.as_ref().map(|(_, ns)| *ns).unwrap_or(0);
    g.record("ready_only_after_cri", t, r.map(|(d, _)| d));

    let t = Instant::now();
    let r = poweroff::shutdown_off_takes_no_inhibitor().await;
    g.record("shutdown_off_takes_no_inhibitor", t, r);

    let t = Instant::now();
    let r = match orphan {
        Ok(p) => orphan_stopped(&g, &p, active_ns).await,
        Err(e) => Err(e),
    };
    g.record("orphan_stopped_with_grace_1", t, r);

    let t = Instant::now();
    let r = manifest_removal(&g).await;
    let uids = r.as_ref().map(|(_, u)| u.clone()).unwrap_or_default();
    g.record("manifest_removal_terminates", t, r.map(|(d, _)| d));

    let t = Instant::now();
    let r = slices_removed(&g, &uids).await;
    g.record("pod_slices_removed", t, r);

    let t = Instant::now();
    let r = outage::upgrade_during_api_outage(&g, &inp).await;
    g.record("upgrade_during_api_outage", t, r);

    let t = Instant::now();
    let r = stop_leaves_pods_running(&g).await;
    g.record("stop_leaves_pods_running", t, r);

    let t = Instant::now();
    let r = watchdog(&g, &inp).await;
    g.record("watchdog_restarts_hung_loop", t, r);

    let t = Instant::now();
    let r = rescue::standby_rescue(&g).await;
    g.record("standby_rescues_a_terminating_pod", t, r);

    // the last scenario: it powers the guest off (the runner collects the results after it)
    let t = Instant::now();
    let r = poweroff::poweroff(&g).await;
    g.record("poweroff_ends_pods_by_priority", t, r);
    if g.failed > 0 { 1 } else { 0 }
}

/// The node's directories and the test images; reaplet itself comes from its package (the
/// first scenario).
async fn setup(g: &Guest, inp: &Path) -> R<String> {
    std::fs::create_dir_all(MANIFESTS).map_err(|e| e.to_string())?;
    std::fs::create_dir_all("/var/lib/kubelet").map_err(|e| e.to_string())?;
    let v = wait_for(Duration::from_secs(60), "containerd's CRI", || async {
        g.cri.version().await.ok()
    })
    .await?;
    for img in ["busybox.tar", "pause.tar"] {
        sh(
            "ctr",
            &[
                "-n",
                "k8s.io",
                "images",
                "import",
                "--snapshotter",
                "overlayfs",
                &inp.join(img).to_string_lossy(),
            ],
        )?;
    }
    let driver = sh(
        "sh",
        &[
            "-c",
            "grep -c 'SystemdCgroup = true' /etc/containerd/config.toml",
        ],
    )?;
    Ok(format!(
        "{} {} (CRI {}); containerd SystemdCgroup lines: {driver}; kernel {}",
        v.runtime_name,
        v.runtime_version,
        v.runtime_api_version,
        sh("uname", &["-r"])?
    ))
}

fn check_passes() -> R<String> {
    let out = Command::new(REAPLET)
        .args(["check", "--config", "/etc/reaplet/config.yaml"])
        .output()
        .map_err(|e| e.to_string())?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    ensure(out.status.success(), || {
        format!("reaplet check failed ({}):\n{text}", out.status)
    })?;
    let driver = text
        .lines()
        .find(|l| l.contains("driver"))
        .unwrap_or_default()
        .trim()
        .to_owned();
    ensure(driver.to_lowercase().contains("driver systemd"), || {
        format!("check did not find the systemd cgroup driver:\n{text}")
    })?;
    Ok(format!("exit 0; {driver}"))
}

/// The unit stays `activating` while containerd is down and becomes `active` only after
/// containerd (and so the CRI) is up. Returns the detail and the wall time reaplet went active.
async fn ready_only_after_cri(g: &Guest) -> R<(String, i64)> {
    sh("systemctl", &["stop", "containerd"])?;
    ensure(g.cri.version().await.is_err(), || {
        "the CRI still answers with containerd stopped".into()
    })?;
    sh("systemctl", &["start", "--no-block", UNIT])?;
    let watch = Duration::from_secs(8);
    let start = Instant::now();
    let mut seen = std::collections::BTreeSet::new();
    while start.elapsed() < watch {
        let state = show(UNIT, "ActiveState");
        ensure(state != "active", || {
            format!(
                "{UNIT} became active with containerd stopped (after {:?})",
                start.elapsed()
            )
        })?;
        seen.insert(state);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    ensure(seen.contains("activating"), || {
        format!("{UNIT} never was activating: {seen:?}")
    })?;
    let pid = show(UNIT, "MainPID");
    ensure(pid != "0" && !pid.is_empty(), || {
        "reaplet is not running".into()
    })?;
    sh("systemctl", &["start", "containerd"])?;
    wait_for(
        Duration::from_secs(90),
        "reaplet to become active",
        || async { (show(UNIT, "ActiveState") == "active").then_some(()) },
    )
    .await?;
    let active_ns = wall_ns();
    let r_mono: u64 = show(UNIT, "ActiveEnterTimestampMonotonic")
        .parse()
        .unwrap_or(0);
    let c_mono: u64 = show("containerd", "ActiveEnterTimestampMonotonic")
        .parse()
        .unwrap_or(u64::MAX);
    ensure(r_mono >= c_mono, || {
        format!("reaplet went active at {r_mono} µs, before containerd at {c_mono} µs")
    })?;
    Ok((
        format!(
            "activating for {watch:?} with containerd stopped ({seen:?}); active {:.2} s after \
             containerd became ready",
            (r_mono - c_mono) as f64 / 1e6
        ),
        active_ns,
    ))
}

/// The orphan launched before reaplet started is stopped with grace 1 (its own is 600): its
/// TERM-ignoring container is SIGKILLed a couple of seconds after reaplet became active.
async fn orphan_stopped(g: &Guest, p: &LaunchedPod, active_ns: i64) -> R<String> {
    let st = g.wait_stopped(p, Duration::from_secs(60)).await?;
    let (_, code, finished) = st[0].clone();
    let after = secs(finished - active_ns);
    ensure(code == 137, || {
        format!("exit {code}, expected 137 (SIGKILL at the grace)")
    })?;
    ensure(after < 1.0 + 2.0 + SLACK, || {
        format!("stopped {after:.2} s after reaplet went active: not grace 1")
    })?;
    let sandboxes = g
        .cri
        .list_sandboxes(Some(p.uid.as_str()))
        .await
        .map_err(|e| e.to_string())?;
    wait_for(
        Duration::from_secs(30),
        "the orphan's sandbox to stop",
        || async {
            let sbs = g.cri.list_sandboxes(Some(p.uid.as_str())).await.ok()?;
            sbs.iter().all(|s| !s.ready).then_some(())
        },
    )
    .await?;
    let slice = g.wait_slice_gone(&p.uid).await?;
    Ok(format!(
        "exit 137 {after:.2} s after reaplet went active (own grace 600); sandbox stopped \
         ({} listed); {slice}",
        sandboxes.len()
    ))
}

/// Three pods from manifests: TERM-trapping, TERM-ignoring with grace 3, and a preStop exec
/// hook. Removing the manifests ends each with its own grace.
async fn manifest_removal(g: &Guest) -> R<(String, Vec<PodUid>)> {
    let hook = serde_json::json!({"exec": {"command": ["/bin/sh", "-c",
        "echo prestop-ran > /proc/1/fd/1; sleep 1"]}});
    let mut templates = vec![
        PodTemplate::new("web", 30).container(ContainerTemplate::new("app", TRAPS_TERM)),
        PodTemplate::new("stubborn", 3).container(ContainerTemplate::new("app", IGNORES_TERM)),
        PodTemplate::new("hooked", 10)
            .container(ContainerTemplate::new("app", TRAPS_TERM).pre_stop(hook)),
    ];
    let mut pods = Vec::new();
    for t in &mut templates {
        let path = g.write_manifest(t)?;
        let p = g.launch(t).await?;
        pods.push((path, p));
    }
    for (_, p) in &pods {
        g.wait_known(&p.uid).await?;
    }
    let removed = wall_ns();
    for (path, _) in &pods {
        std::fs::remove_file(path).map_err(|e| e.to_string())?;
    }
    // all at once: each pod's statuses must be read before its garbage collection
    let waits = pods
        .iter()
        .map(|(_, p)| g.wait_stopped(p, Duration::from_secs(60)));
    let results = futures_util::future::join_all(waits)
        .await
        .into_iter()
        .collect::<R<Vec<_>>>()?;
    let after = |i: usize| secs(results[i][0].2 - removed);
    let code = |i: usize| results[i][0].1;
    ensure(code(0) == 0 && after(0) < 1.0 + SLACK, || {
        format!(
            "web: exit {} after {:.2} s; SIGTERM should end it at once",
            code(0),
            after(0)
        )
    })?;
    ensure(
        code(1) == 137 && after(1) >= 3.0 && after(1) < 3.0 + 1.0 + SLACK,
        || {
            format!(
                "stubborn: exit {} after {:.2} s; expected SIGKILL (137) at its 3 s grace",
                code(1),
                after(1)
            )
        },
    )?;
    let log =
        g.tb.dir
            .join("logs")
            .join(pods[2].1.uid.as_str())
            .join("app/0.log");
    let hook_out = prestop_line(&log).await;
    ensure(
        code(2) == 0 && after(2) >= 1.0 && hook_out.contains("prestop-ran"),
        || {
            format!(
                "hooked: exit {} after {:.2} s, hook output seen: {}; expected the 1 s preStop \
                 hook, then exit 0",
                code(2),
                after(2),
                hook_out.contains("prestop-ran")
            )
        },
    )?;
    Ok((
        format!(
            "from manifest removal: web exit 0 at {:.2} s; stubborn (grace 3) exit 137 at {:.2} s; \
             hooked exit 0 at {:.2} s after its preStop ran",
            after(0),
            after(1),
            after(2)
        ),
        pods.iter().map(|(_, p)| p.uid.clone()).collect(),
    ))
}

async fn slices_removed(g: &Guest, uids: &[PodUid]) -> R<String> {
    ensure(!uids.is_empty(), || {
        "no pods from the previous scenario".into()
    })?;
    let mut lines = Vec::new();
    for uid in uids {
        lines.push(g.wait_slice_gone(uid).await?);
    }
    let left = sh(
        "sh",
        &[
            "-c",
            "ls -d /sys/fs/cgroup/kubepods.slice/*/*pod*.slice 2>/dev/null || true",
        ],
    )?;
    Ok(format!(
        "{}; pod slices left anywhere: [{left}]",
        lines.join("; ")
    ))
}

/// `systemctl stop reaplet` leaves a running pod running; a pod whose manifest was removed
/// while reaplet was down is ended by the next start.
async fn stop_leaves_pods_running(g: &Guest) -> R<String> {
    let (path, p) = g.manifest_pod("survivor").await?;
    sh("systemctl", &["stop", UNIT])?;
    let state = show(UNIT, "ActiveState");
    ensure(state == "inactive", || {
        format!("after stop the unit is {state}")
    })?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    ensure(g.running(&p).await?, || {
        "the pod stopped when reaplet stopped".into()
    })?;
    std::fs::remove_file(&path).map_err(|e| e.to_string())?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    ensure(g.running(&p).await?, || {
        "the pod stopped while reaplet was stopped".into()
    })?;
    let (slice, _) = g.slice(&p.uid);
    ensure(slice.exists(), || {
        "the pod slice went while reaplet was stopped".into()
    })?;
    let started = wall_ns();
    sh("systemctl", &["start", UNIT])?;
    let st = g.wait_stopped(&p, Duration::from_secs(60)).await?;
    let (_, code, finished) = st[0].clone();
    ensure(code == 0, || {
        format!("exit {code}, expected 0 (SIGTERM honoured)")
    })?;
    let gone = g.wait_slice_gone(&p.uid).await?;
    Ok(format!(
        "running 6 s with reaplet stopped (manifest removed after 3 s); ended {:.2} s after \
         `systemctl start` with exit 0; {gone}",
        secs(finished - started)
    ))
}

/// Restarts reaplet and waits until its main process runs `exe` (90 s at most).
async fn restart_into(exe: &Path) -> R<()> {
    sh("systemctl", &["daemon-reload"])?;
    sh("systemctl", &["restart", "--no-block", UNIT])?;
    wait_for(
        Duration::from_secs(90),
        "reaplet to run the binary ExecStart names",
        || async {
            let pid = show(UNIT, "MainPID");
            let runs = std::fs::read_link(format!("/proc/{pid}/exe")).ok()?;
            (show(UNIT, "ActiveState") == "active" && runs == exe).then_some(())
        },
    )
    .await
    .map_err(|e| format!("{e} ({})", exe.display()))
}

/// A wedged housekeeping loop (test hook: SIGUSR2) stops the WATCHDOG pings; systemd kills
/// reaplet and restarts it, and a running pod is untouched by both. The hook is compiled only
/// into the test-hooks build, which the package never is: this scenario alone runs that build
/// (the inputs' [`TEST_HOOKS`]) through a drop-in that overrides `ExecStart=`
/// ([`TEST_HOOKS_DROP_IN`]); the drop-in is removed afterwards and the packaged binary runs
/// again for the scenarios after it.
async fn watchdog(g: &Guest, inp: &Path) -> R<String> {
    let bin = inp.join(TEST_HOOKS);
    let version = sh(&bin.to_string_lossy(), &["version"])?;
    ensure(version.contains("test-hooks"), || {
        format!(
            "{TEST_HOOKS} was built without the test-hooks feature ({version}); run the suite through scripts/test.sh"
        )
    })?;
    std::fs::create_dir_all(
        Path::new(TEST_HOOKS_DROP_IN)
            .parent()
            .unwrap_or(Path::new("/")),
    )
    .map_err(|e| e.to_string())?;
    std::fs::write(
        TEST_HOOKS_DROP_IN,
        format!(
            "[Service]\nExecStart=\nExecStart={} run --config /etc/reaplet/config.yaml\n",
            bin.display()
        ),
    )
    .map_err(|e| e.to_string())?;
    let r = match restart_into(&bin).await {
        Ok(()) => frozen_loop(g).await,
        Err(e) => Err(e),
    };
    let _ = std::fs::remove_file(TEST_HOOKS_DROP_IN);
    let back = restart_into(Path::new(REAPLET)).await;
    let detail = r?;
    back.map_err(|e| format!("back to the packaged binary: {e}"))?;
    Ok(format!(
        "{detail}; {version} through {TEST_HOOKS_DROP_IN}, removed"
    ))
}

/// The watchdog scenario proper, with the test-hooks build running.
async fn frozen_loop(g: &Guest) -> R<String> {
    let (path, p) = g.manifest_pod("bystander").await?;
    let restarts0: u32 = show(UNIT, "NRestarts").parse().unwrap_or(0);
    let pid0 = show(UNIT, "MainPID");
    let frozen = Instant::now();
    sh(
        "systemctl",
        &["kill", "--kill-whom=main", "-s", "SIGUSR2", UNIT],
    )?;
    wait_for(Duration::from_secs(180), "the watchdog restart", || async {
        let n: u32 = show(UNIT, "NRestarts").parse().unwrap_or(0);
        (n > restarts0 && show(UNIT, "ActiveState") == "active" && show(UNIT, "MainPID") != pid0)
            .then_some(())
    })
    .await?;
    let took = frozen.elapsed().as_secs_f64();
    let journal = sh("journalctl", &["-u", UNIT, "--no-pager", "-o", "cat"])?;
    ensure(journal.contains("housekeeping frozen"), || {
        "the freeze hook did not fire".into()
    })?;
    ensure(journal.contains("Watchdog timeout"), || {
        "systemd logged no watchdog timeout: something else restarted reaplet".into()
    })?;
    // logFormat auto under systemd writes syslog priority prefixes: journald files the
    // freeze warning as a warning, and info lines are not among the warnings
    let warnings = sh(
        "journalctl",
        &["-u", UNIT, "-p", "warning", "--no-pager", "-o", "cat"],
    )?;
    ensure(
        warnings.contains("housekeeping frozen") && !warnings.contains("reaplet running"),
        || format!("journal priorities are wrong; `journalctl -p warning` shows:\n{warnings}"),
    )?;
    ensure(took >= 30.0, || {
        format!("restarted {took:.1} s after the freeze, before WatchdogSec=30 could pass")
    })?;
    ensure(g.running(&p).await?, || {
        "the bystander pod died with reaplet".into()
    })?;
    std::fs::remove_file(&path).map_err(|e| e.to_string())?;
    let st = g.wait_stopped(&p, Duration::from_secs(60)).await?;
    ensure(st[0].1 == 0, || format!("bystander exit {}", st[0].1))?;
    Ok(format!(
        "frozen main loop killed by the watchdog and restarted {took:.1} s after the freeze \
         (WatchdogSec=30; systemd logged the watchdog timeout, the freeze is filed as a warning); the \
         running pod survived and was ended by the new process (exit 0)"
    ))
}
