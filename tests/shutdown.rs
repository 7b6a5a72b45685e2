//! The graceful node shutdown manager against logind's D-Bus interface, on a private
//! `dbus-daemon` (Debian's, installed by `testbed/testbed.sh install`). The real logind needs
//! systemd as PID 1 and is exercised in the VM test (`poweroff_ends_pods_by_priority`); here a
//! stand-in serves `org.freedesktop.login1.Manager` (Inhibit with a real pipe descriptor,
//! `InhibitDelayMaxUSec`, `PrepareForShutdown`) and systemd's `KillUnit` (which makes the
//! stand-in read the drop-in again), so the manager's own decisions can be watched: the drop-in
//! and the reload, the lock following the authority, a signal from another sender ignored, the
//! groups in order, the lock released after them and taken again on a cancellation. The node's
//! Ready condition is checked against the in-process API server.

mod common;

use reaplet::authority::Authority;
use reaplet::events::{EventSink, NodeEventReason};
use reaplet::pod::PodUid;
use reaplet::shutdown::stages::Killer;
use reaplet::shutdown::{self, Context, PodFacts, Pods, ShutdownConfig};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

/// How long every wait may take at most, and how long a negative check watches.
const LIMIT: Duration = Duration::from_secs(10);
const WINDOW: Duration = Duration::from_millis(1500);

/// What the logind stand-in has seen.
#[derive(Default)]
struct Seen {
    /// Locks taken: (who, what, mode), and whether each is still held (its pipe open).
    locks: Vec<(String, String, String, Arc<Mutex<bool>>)>,
    reloads: usize,
    /// The unique bus name the locks were asked from (reaplet's connection).
    client: Option<String>,
}

struct FakeLogind {
    delay_us: Arc<Mutex<u64>>,
    seen: Arc<Mutex<Seen>>,
    preparing: Arc<Mutex<bool>>,
    /// This many reads of `InhibitDelayMaxUSec` fail first.
    failing_delay_reads: Arc<Mutex<u32>>,
}

#[zbus::interface(name = "org.freedesktop.login1.Manager")]
impl FakeLogind {
    async fn inhibit(
        &self,
        #[zbus(header)] header: zbus::message::Header<'_>,
        what: &str,
        who: &str,
        _why: &str,
        mode: &str,
    ) -> zbus::fdo::Result<zbus::zvariant::OwnedFd> {
        let (mut reader, writer) =
            std::io::pipe().map_err(|e| zbus::fdo::Error::Failed(e.to_string()))?;
        let held = Arc::new(Mutex::new(true));
        let h = held.clone();
        // released when every copy of the write end is closed
        std::thread::spawn(move || {
            let mut b = [0u8; 1];
            while reader.read(&mut b).map(|n| n > 0).unwrap_or(false) {}
            *h.lock().unwrap() = false;
        });
        let mut seen = self.seen.lock().unwrap();
        seen.client = header.sender().map(|s| s.to_string());
        seen.locks
            .push((who.into(), what.into(), mode.into(), held));
        Ok(zbus::zvariant::OwnedFd::from(std::os::fd::OwnedFd::from(
            writer,
        )))
    }

    #[zbus(property(emits_changed_signal = "false"), name = "InhibitDelayMaxUSec")]
    fn inhibit_delay_max_usec(&self) -> zbus::fdo::Result<u64> {
        let mut failing = self.failing_delay_reads.lock().unwrap();
        if *failing > 0 {
            *failing -= 1;
            return Err(zbus::fdo::Error::Failed("logind is busy".into()));
        }
        Ok(*self.delay_us.lock().unwrap())
    }

    #[zbus(
        property(emits_changed_signal = "false"),
        name = "PreparingForShutdown"
    )]
    fn preparing_for_shutdown(&self) -> bool {
        *self.preparing.lock().unwrap()
    }
}

/// systemd's manager, for the reload: SIGHUP to logind makes it read its drop-ins again.
struct FakeSystemd {
    dir: PathBuf,
    delay_us: Arc<Mutex<u64>>,
    seen: Arc<Mutex<Seen>>,
}

#[zbus::interface(name = "org.freedesktop.systemd1.Manager")]
impl FakeSystemd {
    fn kill_unit(&self, unit: &str, who: &str, signal: i32) -> zbus::fdo::Result<()> {
        if (unit, who, signal) != ("systemd-logind.service", "all", 1) {
            return Err(zbus::fdo::Error::InvalidArgs(format!(
                "{unit} {who} {signal}"
            )));
        }
        self.seen.lock().unwrap().reloads += 1;
        // in name order, the last setting wins (as logind reads its drop-ins)
        let mut files: Vec<PathBuf> = std::fs::read_dir(&self.dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .collect();
        files.sort();
        for f in files {
            let text = std::fs::read_to_string(f).unwrap_or_default();
            if let Some(v) = text
                .lines()
                .find_map(|l| l.strip_prefix("InhibitDelayMaxSec="))
                .and_then(|v| v.parse::<u64>().ok())
            {
                *self.delay_us.lock().unwrap() = v * 1_000_000;
            }
        }
        Ok(())
    }
}

/// Pods that stop `stop_after` after their kill, recording each kill.
#[derive(Clone)]
struct FakePods {
    pods: Vec<PodFacts>,
    kills: Arc<Mutex<Vec<(String, i64, Instant)>>>,
    stop_after: Duration,
}

impl Killer for FakePods {
    fn kill(&self, uid: &PodUid, grace: i64) -> Option<oneshot::Receiver<()>> {
        self.kills
            .lock()
            .unwrap()
            .push((uid.as_str().into(), grace, Instant::now()));
        let (tx, rx) = oneshot::channel();
        let after = self.stop_after;
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            let _ = tx.send(());
        });
        Some(rx)
    }
}

impl Pods for FakePods {
    fn active(&self) -> Vec<PodFacts> {
        self.pods.clone()
    }
}

/// A private bus: `dbus-daemon` with a policy that lets anyone own and send anything.
struct Bus {
    child: std::process::Child,
    socket: PathBuf,
}

impl Drop for Bus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_bus(dir: &Path) -> Bus {
    let socket = dir.join("bus");
    let config = dir.join("bus.conf");
    std::fs::write(
        &config,
        format!(
            r#"<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>session</type>
  <listen>unix:path={}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow send_destination="*" eavesdrop="true"/>
    <allow eavesdrop="true"/>
    <allow own="*"/>
  </policy>
</busconfig>
"#,
            socket.display()
        ),
    )
    .unwrap();
    let child = std::process::Command::new("dbus-daemon")
        .arg(format!("--config-file={}", config.display()))
        .arg("--nofork")
        .spawn()
        .expect("dbus-daemon (Debian's dbus-daemon package; scripts/test.sh installs it)");
    let start = Instant::now();
    while !socket.exists() {
        assert!(start.elapsed() < LIMIT, "dbus-daemon never listened");
        std::thread::sleep(Duration::from_millis(20));
    }
    Bus { child, socket }
}

async fn connect(socket: &Path) -> zbus::connection::Builder<'static> {
    zbus::connection::Builder::address(format!("unix:path={}", socket.display()).as_str()).unwrap()
}

/// A connection owning `name` and serving `iface` at `path`.
async fn serve<I: zbus::object_server::Interface>(
    socket: &Path,
    name: &'static str,
    path: &'static str,
    iface: I,
) -> zbus::Connection {
    connect(socket)
        .await
        .name(name)
        .unwrap()
        .serve_at(path, iface)
        .unwrap()
        .build()
        .await
        .unwrap()
}

async fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(
            start.elapsed() < LIMIT,
            "timed out after {LIMIT:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The whole window: `f` must hold at every look.
async fn holds_for(what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while start.elapsed() < WINDOW {
        assert!(f(), "{what} failed after {:?}", start.elapsed());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn held(seen: &Mutex<Seen>) -> usize {
    seen.lock()
        .unwrap()
        .locks
        .iter()
        .filter(|l| *l.3.lock().unwrap())
        .count()
}

/// Groups of (priority, grace seconds).
fn groups(g: &[(i32, u64)]) -> reaplet::config::ShutdownSettings {
    reaplet::config::ShutdownSettings {
        by_pod_priority: g
            .iter()
            .map(|(priority, s)| reaplet::config::PodPriorityGrace {
                priority: *priority,
                grace: Duration::from_secs(*s),
            })
            .collect(),
        ..Default::default()
    }
}

/// Pods of (uid, priority, own grace), each stopping `stop_after` after its kill.
fn pods(list: &[(&str, i32, Option<i64>)], stop_after: Duration) -> FakePods {
    FakePods {
        pods: list
            .iter()
            .map(|(uid, priority, grace)| PodFacts {
                uid: PodUid::parse(uid).unwrap(),
                priority: *priority,
                spec_grace: *grace,
            })
            .collect(),
        kills: Arc::default(),
        stop_after,
    }
}

/// The manager's context on `bus`, drop-ins in `dir`/logind.conf.d, a 1 s status flush.
fn context(
    bus: &Bus,
    dir: &Path,
    settings: reaplet::config::ShutdownSettings,
    pods: &FakePods,
    authority: &Arc<Authority>,
) -> Context<FakePods> {
    Context {
        config: ShutdownConfig {
            settings,
            bus: bus.socket.clone(),
            drop_in_dir: dir.join("logind.conf.d"),
            status_flush: Duration::from_secs(1),
        },
        pods: pods.clone(),
        statuses_pending: None,
        node: None,
        events: EventSink::log_only(),
        metrics: None,
        authority: authority.clone(),
    }
}

/// logind and systemd's manager, served on `bus`.
struct Stand {
    logind: zbus::Connection,
    _systemd: zbus::Connection,
    seen: Arc<Mutex<Seen>>,
    delay_us: Arc<Mutex<u64>>,
    preparing: Arc<Mutex<bool>>,
    failing_delay_reads: Arc<Mutex<u32>>,
}

impl Stand {
    async fn start(bus: &Path, drop_ins: &Path, delay: Duration) -> Stand {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let delay_us = Arc::new(Mutex::new(delay.as_micros() as u64));
        let preparing = Arc::new(Mutex::new(false));
        let failing_delay_reads = Arc::new(Mutex::new(0));
        let logind = serve(
            bus,
            "org.freedesktop.login1",
            "/org/freedesktop/login1",
            FakeLogind {
                delay_us: delay_us.clone(),
                seen: seen.clone(),
                preparing: preparing.clone(),
                failing_delay_reads: failing_delay_reads.clone(),
            },
        )
        .await;
        let _systemd = serve(
            bus,
            "org.freedesktop.systemd1",
            "/org/freedesktop/systemd1",
            FakeSystemd {
                dir: drop_ins.to_path_buf(),
                delay_us: delay_us.clone(),
                seen: seen.clone(),
            },
        )
        .await;
        Stand {
            logind,
            _systemd,
            seen,
            delay_us,
            preparing,
            failing_delay_reads,
        }
    }

    /// logind announces (or cancels) a shutdown, its property first, as logind does.
    async fn announce(&self, start: bool) {
        *self.preparing.lock().unwrap() = start;
        signal(&self.logind, None, start).await;
    }
}

async fn signal(conn: &zbus::Connection, to: Option<&str>, start: bool) {
    conn.emit_signal(
        to,
        "/org/freedesktop/login1",
        "org.freedesktop.login1.Manager",
        "PrepareForShutdown",
        &(start,),
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lock_follows_the_authority_and_a_shutdown_ends_the_groups_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let bus = start_bus(dir.path());
    let drop_ins = dir.path().join("logind.conf.d");
    let stand = Stand::start(&bus.socket, &drop_ins, Duration::from_secs(3)).await;
    let (seen, delay_us) = (stand.seen.clone(), stand.delay_us.clone());
    let stranger = connect(&bus.socket).await.build().await.unwrap();

    let pods = pods(
        &[("high", 5000, Some(30)), ("low", 0, Some(1))],
        Duration::from_millis(300),
    );
    let (events, _pod_events) = EventSink::channel(16);
    let (events, mut node_events) = events.with_node_events(16);
    let authority = Arc::new(Authority::default());
    authority.set_active(true);
    let metrics = Arc::new(reaplet::metrics::Metrics::new());
    let cancel = CancellationToken::new();
    let manager = tokio::spawn(shutdown::run(
        Context {
            events,
            metrics: Some(metrics.clone()),
            ..context(
                &bus,
                dir.path(),
                groups(&[(0, 2), (1000, 3)]),
                &pods,
                &authority,
            )
        },
        cancel.clone(),
    ));

    // logind allowed 3 s of the 2 + 3 + 1 needed: the drop-in, the reload, then the lock
    wait_until("the inhibitor", || held(&seen) == 1).await;
    let gauge = || metrics.graceful_shutdown_inhibitor.get();
    wait_until("the inhibitor gauge", || gauge() == 1).await;
    let text = std::fs::read_to_string(drop_ins.join("98-reaplet.conf")).unwrap();
    assert!(text.contains("[Login]\nInhibitDelayMaxSec=6\n"), "{text}");
    assert_eq!(seen.lock().unwrap().reloads, 1);
    assert_eq!(*delay_us.lock().unwrap(), 6_000_000);
    {
        let s = seen.lock().unwrap();
        let (who, what, mode, _) = &s.locks[0];
        assert_eq!(
            (who.as_str(), what.as_str(), mode.as_str()),
            ("reaplet", "shutdown", "delay")
        );
    }

    // a signal from anyone but logind's owner is nothing: broadcast (the bus routes it by the
    // match rule's sender) or sent to reaplet's connection alone (the bus delivers it whatever
    // the match rules say: only reaplet's own check of the sender stands in the way)
    let client = seen
        .lock()
        .unwrap()
        .client
        .clone()
        .expect("reaplet's unique name");
    signal(&stranger, None, true).await;
    signal(&stranger, Some(&client), true).await;
    // nor after a NameOwnerChanged that did not come from the bus itself, naming the stranger
    // logind's new owner
    let me = stranger.unique_name().unwrap().to_string();
    stranger
        .emit_signal(
            Some(client.as_str()),
            "/org/freedesktop/DBus",
            "org.freedesktop.DBus",
            "NameOwnerChanged",
            &(
                "org.freedesktop.login1",
                stand.logind.unique_name().unwrap().as_str(),
                me.as_str(),
            ),
        )
        .await
        .unwrap();
    signal(&stranger, Some(&client), true).await;
    holds_for("a stranger's PrepareForShutdown ignored", || {
        pods.kills.lock().unwrap().is_empty() && held(&seen) == 1
    })
    .await;

    // logind's: the low group (its own 1 s, shorter than 2 s), then the high one, then the
    // release, only after the second group's pod stopped
    let t0 = Instant::now();
    stand.announce(true).await;
    wait_until("the lock's release", || held(&seen) == 0).await;
    let released = t0.elapsed();
    let kills = pods.kills.lock().unwrap().clone();
    let view: Vec<(&str, i64)> = kills.iter().map(|(u, g, _)| (u.as_str(), *g)).collect();
    assert_eq!(view, vec![("low", 1), ("high", 3)]);
    let gap = kills[1].2 - kills[0].2;
    assert!(
        gap >= Duration::from_millis(300),
        "the high group started {gap:?} after the low one"
    );
    assert!(
        released >= (kills[1].2 - t0) + Duration::from_millis(300),
        "released {released:?}, before the high pod stopped"
    );
    let ev = tokio::time::timeout(LIMIT, node_events.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(ev.reason, NodeEventReason::Shutdown);
    let first_start = metrics.graceful_shutdown_start_time.get();
    assert!(first_start > 0);
    assert!(metrics.graceful_shutdown_end_time.get() >= first_start);
    assert_eq!(ev.message, "Shutdown manager detected shutdown event");
    // handled: not taken again while the shutdown stands (the gauge follows the release: the
    // lock is let go first, the gauge set after it)
    wait_until("the inhibitor gauge at 0", || gauge() == 0).await;
    holds_for("the lock left released", || {
        held(&seen) == 0 && gauge() == 0
    })
    .await;

    // cancelled: taken again, and said so
    stand.announce(false).await;
    wait_until("the lock taken again", || held(&seen) == 1).await;
    let ev = node_events.recv().await.unwrap();
    assert_eq!(
        ev.message,
        "Shutdown manager detected shutdown cancellation"
    );
    assert_eq!(seen.lock().unwrap().reloads, 1, "logind reloaded once");

    // standby: released; a shutdown then is the kubelet's, only recorded
    authority.set_active(false);
    wait_until("the release in standby", || held(&seen) == 0).await;
    assert_eq!(metrics.graceful_shutdown_start_time.get(), first_start);
    stand.announce(true).await;
    wait_until("the standby shutdown recorded", || {
        metrics.graceful_shutdown_start_time.get() > first_start
    })
    .await;
    holds_for("no kill in standby", || {
        pods.kills.lock().unwrap().len() == 2 && held(&seen) == 0
    })
    .await;
    // a takeover while logind still prepares the shutdown: reaplet ends the pods now, under
    // a lock it releases after them
    authority.set_active(true);
    wait_until("the pods ended after the takeover", || {
        pods.kills.lock().unwrap().len() == 4
    })
    .await;
    wait_until("the release after them", || {
        held(&seen) == 0 && seen.lock().unwrap().locks.len() == 3
    })
    .await;
    stand.announce(false).await;
    wait_until("the lock after the cancellation", || held(&seen) == 1).await;

    // stopping reaplet releases it and ends the task
    cancel.cancel();
    tokio::time::timeout(LIMIT, manager).await.unwrap().unwrap();
    wait_until("the release at the stop", || held(&seen) == 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_grace_periods_no_bus_and_a_late_logind_is_used_only_once_active() {
    let dir = tempfile::tempdir().unwrap();
    let bus = start_bus(dir.path());
    let mut settings = reaplet::config::ShutdownSettings::default();
    let authority = Arc::new(Authority::default());
    authority.set_active(true);
    let none = pods(&[], Duration::ZERO);
    let ctx = |settings| context(&bus, dir.path(), settings, &none, &authority);
    // off: returns at once
    let cancel = CancellationToken::new();
    tokio::time::timeout(LIMIT, shutdown::run(ctx(settings.clone()), cancel.clone()))
        .await
        .expect("the manager returns when nothing is configured");
    // configured, passive, and no logind on the bus: it keeps trying, quietly
    settings.grace_period = Duration::from_secs(10);
    authority.set_active(false);
    let task = tokio::spawn(shutdown::run(ctx(settings), cancel.clone()));
    let drop_ins = dir.path().join("logind.conf.d");
    tokio::time::sleep(WINDOW).await;
    assert!(!task.is_finished(), "the manager gave up");
    // logind comes: while passive, nothing of it is touched
    let stand = Stand::start(&bus.socket, &drop_ins, Duration::from_secs(5)).await;
    tokio::time::sleep(Duration::from_secs(3)).await; // the next try (1 s, then 2 s)
    holds_for("no lock and no drop-in while passive", || {
        stand.seen.lock().unwrap().locks.is_empty() && !drop_ins.exists()
    })
    .await;
    // active: the delay raised (10 s + the 1 s flush), then the lock
    authority.set_active(true);
    wait_until("the lock once active", || held(&stand.seen) == 1).await;
    let text = std::fs::read_to_string(drop_ins.join("98-reaplet.conf")).unwrap();
    assert!(text.contains("InhibitDelayMaxSec=11\n"), "{text}");
    assert_eq!(*stand.delay_us.lock().unwrap(), 11_000_000);
    cancel.cancel();
    tokio::time::timeout(LIMIT, task).await.unwrap().unwrap();
}

/// A private bus with logind on it (its delay `delay`) and an active authority, for one
/// manager.
struct Rig {
    dir: tempfile::TempDir,
    bus: Bus,
    stand: Stand,
    authority: Arc<Authority>,
    cancel: CancellationToken,
}

impl Rig {
    async fn new(delay: Duration) -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let bus = start_bus(dir.path());
        let stand = Stand::start(&bus.socket, &dir.path().join("logind.conf.d"), delay).await;
        let authority = Arc::new(Authority::default());
        authority.set_active(true);
        Rig {
            dir,
            bus,
            stand,
            authority,
            cancel: CancellationToken::new(),
        }
    }

    fn drop_ins(&self) -> PathBuf {
        self.dir.path().join("logind.conf.d")
    }

    /// The manager for `g` and `pods`, once it holds the lock.
    async fn manager(&self, g: &[(i32, u64)], pods: &FakePods) -> tokio::task::JoinHandle<()> {
        let ctx = context(&self.bus, self.dir.path(), groups(g), pods, &self.authority);
        let task = tokio::spawn(shutdown::run(ctx, self.cancel.clone()));
        wait_until("the inhibitor", || held(&self.stand.seen) == 1).await;
        task
    }

    /// Stops the manager; it must end.
    async fn stop(self, task: tokio::task::JoinHandle<()>) {
        self.cancel.cancel();
        tokio::time::timeout(LIMIT, task).await.unwrap().unwrap();
    }
}

/// A group waits only its grace; a pod SIGKILLed at it finishes just after. After the last
/// group such pods get the status flush before the lock goes (else the machine powers off
/// before their statuses are written).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_still_stopping_after_the_last_group_are_waited_for_before_the_release() {
    let rig = Rig::new(LIMIT).await;
    // a 1 s group; the pod stops 1.5 s after its kill, inside the 1 s flush
    let slow = pods(&[("slow", 0, None)], Duration::from_millis(1500));
    let manager = rig.manager(&[(0, 1)], &slow).await;
    rig.stand.announce(true).await;
    wait_until("the release", || held(&rig.stand.seen) == 0).await;
    let released = Instant::now();
    let killed = slow.kills.lock().unwrap()[0].2;
    let after = released - killed;
    assert!(
        after >= Duration::from_millis(1500),
        "released {after:?} after the kill, before the pod stopped (1.5 s)"
    );
    rig.stop(manager).await;
}

/// Handed back to the kubelet during the groups: the groups not started yet are the kubelet's,
/// and the lock goes at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_back_during_the_groups_stops_them_and_releases_the_lock() {
    let rig = Rig::new(LIMIT).await;
    // the low pod takes its group's whole 4 s (the hand-back comes well inside them)
    let two = pods(
        &[("low", 0, None), ("high", 1000, None)],
        Duration::from_secs(8),
    );
    let manager = rig.manager(&[(0, 4), (1000, 2)], &two).await;
    rig.stand.announce(true).await;
    wait_until("the first group", || two.kills.lock().unwrap().len() == 1).await;
    rig.authority.set_active(false);
    wait_until("the release at the hand-back", || {
        held(&rig.stand.seen) == 0
    })
    .await;
    // past the first group's grace: the second group never starts
    tokio::time::sleep(Duration::from_secs(4)).await;
    holds_for("no second group after the hand-back", || {
        two.kills.lock().unwrap().len() == 1
    })
    .await;
    rig.stop(manager).await;
}

/// logind's delay that could not be read is looked at again the next time the lock is taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delay_that_could_not_be_read_is_checked_again() {
    let rig = Rig::new(Duration::from_secs(5)).await;
    *rig.stand.failing_delay_reads.lock().unwrap() = 1;
    // the read failed: the lock all the same, no drop-in yet
    let manager = rig.manager(&[(0, 10)], &pods(&[], Duration::ZERO)).await;
    assert!(!rig.drop_ins().exists(), "a drop-in without a delay read");
    // the next time the lock is taken: read, raised (10 s + the 1 s flush)
    rig.authority.set_active(false);
    wait_until("the release in standby", || held(&rig.stand.seen) == 0).await;
    rig.authority.set_active(true);
    wait_until("the lock again", || held(&rig.stand.seen) == 1).await;
    let text = std::fs::read_to_string(rig.drop_ins().join("98-reaplet.conf"))
        .expect("the drop-in once the delay could be read");
    assert!(text.contains("InhibitDelayMaxSec=11\n"), "{text}");
    assert_eq!(*rig.stand.delay_us.lock().unwrap(), 11_000_000);
    rig.stop(manager).await;
}

/// The node's Ready condition during a shutdown, written as this node (`nodes/status`, a
/// strategic merge of the one condition), and put back when the shutdown is cancelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ready_condition_reports_the_shutdown_and_comes_back_on_a_cancellation() {
    use common::apiserver::ApiServer;
    use serde_json::json;
    let api = ApiServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let before = json!({"type": "Ready", "status": "True", "reason": "KubeletReady",
        "message": "kubelet is posting ready status",
        "lastHeartbeatTime": "2026-11-26T00:00:00Z", "lastTransitionTime": "2026-11-25T00:00:00Z"});
    let pressure = json!({"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory",
        "lastHeartbeatTime": "2026-11-26T00:00:00Z", "lastTransitionTime": "2026-11-25T00:00:00Z"});
    api.add_node(
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"},
        "status": {"conditions": [pressure, before]}}),
    );
    let kc = api.write_kubeconfig(dir.path(), "node-a");
    let client =
        reaplet::api::client::client(reaplet::api::client_config(Some(&kc)).await.unwrap())
            .unwrap();
    let ready = shutdown::node::NodeReady::new(client, "node-a");
    let cond = |kind: &str| {
        api.get_node("node-a").unwrap()["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == kind)
            .cloned()
            .unwrap()
    };

    ready.mark_shutting_down().await.unwrap();
    let now = cond("Ready");
    assert_eq!(
        (&now["status"], &now["reason"], &now["message"]),
        (
            &json!("False"),
            &json!("KubeletNotReady"),
            &json!("node is shutting down")
        )
    );
    assert_ne!(
        now["lastTransitionTime"], before["lastTransitionTime"],
        "a transition"
    );
    assert_eq!(
        cond("MemoryPressure"),
        pressure,
        "other conditions untouched"
    );
    let w = api.writes();
    let last = w.last().unwrap();
    assert_eq!(
        (last.method.as_str(), last.path.as_str(), last.status),
        ("PATCH", "/api/v1/nodes/node-a/status", 200)
    );
    assert_eq!(last.content_type, "application/strategic-merge-patch+json");
    assert_eq!(last.user, "system:node:node-a");
    // marked again (a second shutdown): the transition time stays
    ready.mark_shutting_down().await.unwrap();
    assert_eq!(
        cond("Ready")["lastTransitionTime"],
        now["lastTransitionTime"]
    );

    // cancelled: the condition it replaced, as a transition
    ready.restore().await.unwrap();
    let back = cond("Ready");
    assert_eq!(
        (&back["status"], &back["reason"], &back["message"]),
        (
            &json!("True"),
            &json!("KubeletReady"),
            &json!("kubelet is posting ready status")
        )
    );
    // nothing more to put back
    let writes = api.writes().len();
    ready.restore().await.unwrap();
    assert_eq!(api.writes().len(), writes);
}
