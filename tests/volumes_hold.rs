//! A live mount under the pod's volumes directory holds the terminated stage until it is
//! unmounted, and is named in the log (privileged: mounts a tmpfs; needs root).

mod common;

use common::*;
use reaplet::testbed::{ContainerTemplate, PodTemplate, TRAPS_TERM, launch};
use std::io::Write;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mounted_volume_holds_cleanup_until_unmounted() {
    let cap = Capture::default();
    let writer = cap.clone();
    tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .with_env_filter("info")
        .init();
    let h = Harness::new("volumes").await;
    let t = PodTemplate::new("vol", 30).container(ContainerTemplate::new("app", TRAPS_TERM));
    let p = launch(&h.tb, &t).await.unwrap();
    let vol = h
        .root_dir
        .path()
        .join("pods")
        .join(p.uid.as_str())
        .join("volumes/kubernetes.io~empty-dir/scratch");
    std::fs::create_dir_all(&vol).unwrap();
    let st = Command::new("mount")
        .args(["-t", "tmpfs", "tmpfs"])
        .arg(&vol)
        .status()
        .unwrap();
    assert!(st.success(), "mounting a tmpfs needs root (CAP_SYS_ADMIN)");
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
    let guard = Unmount(vol.clone());

    h.desire(vec![t.pod_info()]);
    h.workers.upsert(t.deleted(30));
    let v = h
        .wait_state(&p.uid, PodPhase::Terminated, Duration::from_secs(20))
        .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let v2 = h.workers.view(&p.uid).unwrap();
    assert_eq!(
        v2.phase,
        PodPhase::Terminated,
        "cleanup went on with a mounted volume: {v:?} {v2:?}"
    );
    assert_eq!(v2.step, reaplet::workers::Step::WaitingForVolumes);
    assert!(
        !h.pod_cgroups(&p.uid).is_empty(),
        "cgroup removed before the volumes were unmounted"
    );
    let log = String::from_utf8_lossy(&cap.0.lock().unwrap()).to_string();
    assert!(
        log.lines().any(|l| l.contains("waiting for pod volumes")
            && l.contains("kubernetes.io~empty-dir/scratch")),
        "the still-mounted volume is not named in the log:\n{log}"
    );
    drop(guard);
    h.wait_state(&p.uid, PodPhase::Finished, Duration::from_secs(20))
        .await;
    h.assert_gone(&p.uid).await;
    h.shutdown().await;
}
