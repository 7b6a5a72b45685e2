//! A terminated pod's volumes with real mounts laid out as the kubelet lays them out
//! (privileged: mounts tmpfs and bind mounts; needs root). Active, reaplet unmounts and removes
//! the node-local volumes and subPath bind mounts, never a CSI-like mount, which holds the pod
//! (reported once past the unmount timeout, never deleted) until its driver unmounts it.
//! Passive (standby), it only waits.

mod common;

use common::mounts::KubeletVolumes;
use common::*;
use reaplet::events::EventReason;
use reaplet::workers::Step;
use reaplet_testbed::{ContainerTemplate, PodTemplate, TRAPS_TERM, launch};
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The unmount timeout in these tests (the kubelet's is 2 min 3 s).
const VOLUME_WAIT: Duration = Duration::from_secs(3);
/// How long a negative check watches.
const WINDOW: Duration = Duration::from_secs(3);

#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

async fn wait_until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    start.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_local_volumes_are_torn_down_and_a_csi_mount_holds_the_pod_until_unmounted() {
    let cap = Capture::default();
    let writer = cap.clone();
    tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .with_env_filter("info")
        .init();
    let mut h = Harness::with("volumes", |c| c.volume_wait = VOLUME_WAIT).await;
    let t = PodTemplate::new("vol", 30).container(ContainerTemplate::new("app", TRAPS_TERM));
    let p = launch(&h.tb, &t).await.unwrap();
    let v = KubeletVolumes::lay_out(h.root_dir.path(), p.uid.as_str(), true);
    let csi = v.csi.clone().unwrap();
    let csi_rel = csi.strip_prefix(&v.pod_dir).unwrap().to_owned();

    h.desire(vec![t.pod_info()]);
    h.workers.upsert(t.deleted(30));
    h.wait_state(&p.uid, PodPhase::Terminated, Duration::from_secs(20))
        .await;
    // the node-local volumes and the subPaths go at the first pass: only the CSI mount is left.
    // Each volume is unmounted and then removed, so the wait covers both (CI once read the last
    // volume's directory between its unmount and its removal)
    let took = wait_until(
        "node-local volumes unmounted and removed",
        Duration::from_secs(5),
        || {
            v.still_mounted() == vec![csi_rel.clone()]
                && v.local.iter().all(|d| !d.exists())
                && !v.pod_dir.join("volume-subpaths").exists()
        },
    )
    .await;
    println!(
        "node-local teardown (5 tmpfs volumes, 2 subPath bind mounts) within {:.0} ms of Terminated",
        took.as_secs_f64() * 1e3
    );
    for d in &v.local {
        assert!(!d.exists(), "{} not removed", d.display());
    }
    assert!(!v.pod_dir.join("volume-subpaths").exists());
    // the CSI volume is never touched, and holds the pod (not deleted, its cgroup kept) for
    // the whole unmount timeout and after it
    let start = Instant::now();
    while start.elapsed() < VOLUME_WAIT + WINDOW {
        let view = h.workers.view(&p.uid).unwrap();
        assert_eq!(view.phase, PodPhase::Terminated, "{view:?}");
        assert!(
            matches!(
                view.step,
                Step::WaitingForVolumes | Step::VolumesSkipped | Step::BackingOff
            ),
            "{view:?}"
        );
        assert_eq!(
            std::fs::read_to_string(csi.join("db")).unwrap(),
            "precious",
            "the CSI-like volume was touched"
        );
        assert!(
            !h.pod_cgroups(&p.uid).is_empty(),
            "cgroup removed while mounted"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(v.still_mounted(), vec![csi_rel.clone()]);
    // reported once past the timeout, with the volume and its plugin
    let events = h.drain_events();
    let reported: Vec<_> = events
        .iter()
        .filter(|e| e.reason == EventReason::VolumesStillMounted)
        .collect();
    assert_eq!(reported.len(), 1, "{events:?}");
    assert!(
        reported[0]
            .message
            .contains("kubernetes.io~csi/pvc-1 (kubernetes.io/csi)"),
        "{}",
        reported[0].message
    );
    assert!(
        !events
            .iter()
            .any(|e| e.reason == EventReason::FailedUnMount),
        "{events:?}"
    );
    let log = String::from_utf8_lossy(&cap.0.lock().unwrap()).to_string();
    assert!(
        log.lines().any(|l| l.contains("waiting for pod volumes")
            && l.contains("kubernetes.io~csi/pvc-1")
            && !l.contains("kubernetes.io~secret")),
        "the volume left is not named in the log:\n{log}"
    );
    assert_eq!(
        log.lines()
            .filter(|l| l.contains("still there past the unmount timeout"))
            .count(),
        1,
        "reported more than once:\n{log}"
    );
    // the driver unmounts it: the pod finishes at the next recheck (skipped pods are rechecked
    // on the retry backoff, at most 30 s + 20 % apart)
    v.unmount_csi();
    h.wait_state(&p.uid, PodPhase::Finished, Duration::from_secs(40))
        .await;
    h.assert_gone(&p.uid).await;
    // the CSI volume's directory is its driver's: left as it was (its data was on the mount)
    assert!(csi.is_dir());
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passive_leaves_the_volumes_to_the_kubelet_and_active_tears_them_down() {
    let h = Harness::with("volpassive", |c| c.volume_wait = Duration::from_secs(60)).await;
    let t = PodTemplate::new("volp", 30).container(ContainerTemplate::new("app", TRAPS_TERM));
    let p = launch(&h.tb, &t).await.unwrap();
    // a CSI-like mount holds the pod in its cleanup; then reaplet turns passive (a kubelet
    // renewed its Lease) and the kubelet's node-local volumes are there
    let hold = KubeletVolumes::lay_out(h.root_dir.path(), p.uid.as_str(), true);
    h.desire(vec![t.pod_info()]);
    h.workers.upsert(t.deleted(30));
    h.wait_state(&p.uid, PodPhase::Terminated, Duration::from_secs(20))
        .await;
    let csi_rel: PathBuf = hold
        .csi
        .as_ref()
        .unwrap()
        .strip_prefix(&hold.pod_dir)
        .unwrap()
        .to_owned();
    wait_until("first teardown", Duration::from_secs(5), || {
        hold.still_mounted() == vec![csi_rel.clone()]
    })
    .await;
    h.authority.set_active(false);
    // laid out again on the same pod (the kubelet's volumes as a passive reaplet finds them)
    let v = KubeletVolumes::lay_out(h.root_dir.path(), p.uid.as_str(), false);
    let all = v.still_mounted();
    assert_eq!(all.len(), 8, "{all:?}");
    let start = Instant::now();
    while start.elapsed() < WINDOW {
        assert_eq!(v.still_mounted(), all, "a passive reaplet unmounted");
        for d in &v.local {
            assert!(d.join("data").exists(), "{} touched", d.display());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // active again: torn down at the next pass, the CSI mount still left
    h.authority.set_active(true);
    wait_until(
        "teardown after turning active",
        Duration::from_secs(5),
        || v.still_mounted() == vec![csi_rel.clone()],
    )
    .await;
    for d in &v.local {
        assert!(!d.exists(), "{} not removed", d.display());
    }
    hold.unmount_csi();
    h.wait_state(&p.uid, PodPhase::Finished, Duration::from_secs(20))
        .await;
    h.shutdown().await;
}

/// The mount points below `dir`, as util-linux's `findmnt` reads them (not reaplet's parser).
fn findmnt_below(dir: &std::path::Path) -> Vec<PathBuf> {
    let out = std::process::Command::new("findmnt")
        .args(["-rn", "-o", "TARGET"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        // findmnt -r escapes spaces as \x20; these paths have none
        .map(PathBuf::from)
        .filter(|p| p.starts_with(dir))
        .collect()
}

fn run(cmd: &str, args: &[&str]) {
    let ok = std::process::Command::new(cmd).args(args).status().unwrap();
    assert!(ok.success(), "{cmd} {args:?} failed (needs root)");
}

/// One teardown pass with the kernel's unmount, as the agent runs it.
fn pass(
    root: &std::path::Path,
    uid: &str,
    mountinfo: &std::path::Path,
) -> Vec<reaplet::volumes::Held> {
    reaplet::volumes::teardown::pass(
        root,
        &reaplet::pod::PodUid::parse(uid).unwrap(),
        mountinfo,
        &reaplet::volumes::SystemUnmount,
        &mut reaplet::volumes::TeardownState::default(),
        tokio::time::Instant::now(),
        &|| true,
        &mut |_| {},
    )
}

/// Unmounts (lazily) what a test mounted, even when it fails.
struct Lazy(Vec<PathBuf>);

impl Drop for Lazy {
    fn drop(&mut self) {
        for p in self.0.iter().rev() {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(p)
                .stderr(std::process::Stdio::null())
                .status();
        }
    }
}

/// A subPath of a shared source (a hostPath such as `/run`, or a CSI volume with submounts)
/// is in the source's peer group: a mount made in the source later shows below the subPath's
/// bind mount, and unmounting it there unmounts it in the source too. Only the kubelet's own
/// mount points are ever unmounted; anything below them holds the pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subpath_of_a_shared_source_never_unmounts_the_sources_own_mounts() {
    let root = tempfile::tempdir().unwrap();
    let host = tempfile::tempdir().unwrap();
    let uid = "5d1f0c2e-9b7a-4e3d-8c6b-1a2b3c4d5e6f";
    let src = host.path().join("shared");
    std::fs::create_dir_all(&src).unwrap();
    let mut guard = Lazy(Vec::new());
    run("mount", &["-t", "tmpfs", "tmpfs", src.to_str().unwrap()]);
    guard.0.push(src.clone());
    run("mount", &["--make-shared", src.to_str().unwrap()]);
    std::fs::create_dir_all(src.join("mnt/x")).unwrap();
    let sub = root
        .path()
        .join("pods")
        .join(uid)
        .join("volume-subpaths/host/app/0");
    std::fs::create_dir_all(&sub).unwrap();
    run(
        "mount",
        &[
            "--bind",
            src.join("mnt").to_str().unwrap(),
            sub.to_str().unwrap(),
        ],
    );
    guard.0.push(sub.clone());
    // mounted in the source after the pod started: propagates below the subPath
    run(
        "mount",
        &["-t", "tmpfs", "tmpfs", src.join("mnt/x").to_str().unwrap()],
    );
    guard.0.push(src.join("mnt/x"));
    std::fs::write(src.join("mnt/x/precious"), "host data").unwrap();
    assert_eq!(findmnt_below(&sub), vec![sub.clone(), sub.join("x")]);

    let held = pass(
        root.path(),
        uid,
        std::path::Path::new("/proc/self/mountinfo"),
    );
    assert_eq!(
        findmnt_below(&src),
        vec![src.clone(), src.join("mnt/x")],
        "the source's own mount was unmounted through the subPath"
    );
    assert_eq!(
        std::fs::read_to_string(src.join("mnt/x/precious")).unwrap(),
        "host data"
    );
    assert!(!held.is_empty(), "the nested mount must hold the pod");
}

/// A directory bind mount of the same filesystem inside an emptyDir, missing from the
/// mountinfo snapshot the pass works from (mounted after it was read): removing the emptyDir
/// must never go into it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removal_never_enters_a_bind_mount_the_snapshot_missed() {
    let base = tempfile::tempdir().unwrap();
    let root = base.path().join("kubelet");
    let outside = base.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("precious"), "keep").unwrap();
    let uid = "6e2a1d3f-0c8b-4f4e-9d7c-2b3c4d5e6f70";
    let cache = root
        .join("pods")
        .join(uid)
        .join("volumes/kubernetes.io~empty-dir/cache");
    std::fs::create_dir_all(cache.join("bound")).unwrap();
    std::fs::write(cache.join("scratch"), "emptyDir data").unwrap();
    let snapshot = base.path().join("mountinfo");
    std::fs::copy("/proc/self/mountinfo", &snapshot).unwrap();
    let mut guard = Lazy(Vec::new());
    run(
        "mount",
        &[
            "--bind",
            outside.to_str().unwrap(),
            cache.join("bound").to_str().unwrap(),
        ],
    );
    guard.0.push(cache.join("bound"));

    let held = pass(&root, uid, &snapshot);
    assert_eq!(
        std::fs::read_to_string(outside.join("precious")).unwrap(),
        "keep",
        "removal went into a bind mount"
    );
    assert!(!held.is_empty(), "{held:?}");
}
