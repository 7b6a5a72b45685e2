//! The standby scenario: the reaplet unit in standby beside a kubelet stand-in (the node Lease
//! renewed in the in-process API server, `/healthz` answered on loopback) does nothing to a
//! terminating pod; when the stand-in stops, reaplet takes over and finishes the pod, tearing
//! down its `projected` service-account token volume (a tmpfs) in the host's mount namespace.

use super::{Guest, R, SLACK, UNIT, ensure, secs, sh, show, wait_for};
use crate::apiserver::ApiServer;
use crate::standin::StandIn;
use reaplet::wall_ns;
use reaplet_testbed::{ContainerTemplate, PodTemplate, TRAPS_TERM};
use std::path::Path;
use std::time::{Duration, Instant};

const DROP_IN: &str = "/etc/systemd/system/reaplet.service.d/standby.conf";
/// reaplet's takeover threshold here (its minimum; the default is 40 s).
const TAKEOVER_AFTER: Duration = Duration::from_secs(20);
/// How often the stand-in renews (a kubelet: every 10 s).
const RENEW: Duration = Duration::from_secs(2);
/// How long the passive check watches.
const WINDOW: Duration = Duration::from_secs(10);

fn mounted(path: &Path) -> bool {
    reaplet::volumes::read_mountinfo(Path::new("/proc/self/mountinfo"))
        .map(|m| m.iter().any(|m| m.mount_point == path))
        .unwrap_or(false)
}

fn took_over(api: &ApiServer) -> bool {
    api.events()
        .iter()
        .any(|e| e["involvedObject"]["kind"] == "Node" && e["reason"] == "ReapletTookOver")
}

/// A kubeconfig for `api` as this node, in /etc/reaplet/vm-api.
pub(super) fn api_kubeconfig(api: &ApiServer, node: &str) -> R<std::path::PathBuf> {
    let dir = Path::new("/etc/reaplet/vm-api");
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let kc = api.write_kubeconfig(dir, node);
    // the API server here speaks plain HTTP; reaplet's client still needs a root certificate
    // to build (with none in the kubeconfig it loads the system's, and this guest image has no
    // ca-certificates package, which every real node has): a throwaway one
    let ca = dir.join("ca.pem");
    std::fs::write(&ca, include_str!("../fixtures/throwaway-ca.pem")).map_err(|e| e.to_string())?;
    let text = std::fs::read_to_string(&kc).map_err(|e| e.to_string())?;
    std::fs::write(
        &kc,
        text.replacen(
            "    server: ",
            &format!("    certificate-authority: {}\n    server: ", ca.display()),
            1,
        ),
    )
    .map_err(|e| e.to_string())?;

    Ok(kc)
}

pub(super) async fn standby_rescue(g: &Guest) -> R<String> {
    let api = ApiServer::start().await;
    let kc = api_kubeconfig(&api, &g.node)?;

    // the kubelet stand-in: the Lease renewed, /healthz answered
    let mut kubelet = StandIn::new(api.handle(), &g.node, RENEW);
    kubelet.start().await;
    let port_url = kubelet.url();

    // the running unit (primary, manifests only) would take the pod launched next for an
    // orphan and end it mid-launch: stopped first
    sh("systemctl", &["stop", UNIT])?;
    // a pod bound to this node, running, with its projected token volume mounted as the
    // kubelet mounts it
    let t = PodTemplate::new("rescued", 30).container(ContainerTemplate::new("app", TRAPS_TERM));
    let mut obj = t.api_object();
    obj["spec"]["nodeName"] = serde_json::Value::String(g.node.clone());
    api.create_pod(obj);
    let p = g.launch(&t).await?;
    let vol = Path::new("/var/lib/kubelet/pods")
        .join(p.uid.as_str())
        .join("volumes/kubernetes.io~projected/kube-api-access-vm01");
    std::fs::create_dir_all(&vol).map_err(|e| e.to_string())?;
    sh("mount", &["-t", "tmpfs", "tmpfs", &vol.to_string_lossy()])?;
    std::fs::write(vol.join("token"), "eyJhbGciOi...").map_err(|e| e.to_string())?;

    // the unit in standby, as an operator would configure it (a drop-in)
    super::drop_in(
        DROP_IN,
        format!(
            "[Service]\nEnvironment=REAPLET_KUBECONFIG={} REAPLET_AUTHORITY=standby \
             REAPLET_KUBELET_HEALTHZ_URL={port_url} \
             REAPLET_TAKEOVER_AFTER={}s\n",
            kc.display(),
            TAKEOVER_AFTER.as_secs()
        ),
    )?;
    sh("systemctl", &["daemon-reload"])?;
    sh("systemctl", &["start", UNIT])?;
    let r = rescue(g, &api, &p, &vol, &mut kubelet).await;
    let _ = sh("systemctl", &["stop", UNIT]);
    let _ = std::fs::remove_file(DROP_IN);
    let _ = sh("systemctl", &["daemon-reload"]);
    let _ = sh("umount", &[&vol.to_string_lossy()]);
    r
}

async fn rescue(
    g: &Guest,
    api: &ApiServer,
    p: &reaplet_testbed::LaunchedPod,
    vol: &Path,
    kubelet: &mut StandIn,
) -> R<String> {
    // passive, reaplet lists no pod while the kubelet holds the node (issue 37): it is ready
    // once it has judged the kubelet's signals alive
    wait_for(
        Duration::from_secs(60),
        "reaplet to find the kubelet alive",
        || async {
            sh("journalctl", &["-u", UNIT, "--no-pager", "-o", "cat"])
                .ok()
                .filter(|j| j.contains("the kubelet renews its Lease"))
                .map(|_| ())
        },
    )
    .await?;
    // the unit keeps the host's mount namespace (its unmounts must reach the host's mounts)
    let pid = show(UNIT, "MainPID");
    let ns = |pid: &str| std::fs::read_link(format!("/proc/{pid}/ns/mnt")).ok();
    ensure(ns(&pid).is_some() && ns(&pid) == ns("1"), || {
        format!(
            "reaplet (pid {pid}) runs in mount namespace {:?}, the host's is {:?}",
            ns(&pid),
            ns("1")
        )
    })?;
    let (code, _) = api.delete_pod("default", "rescued", None);
    ensure(code == 200, || format!("DELETE answered {code}"))?;
    // passive: the terminating pod keeps running, its volume mounted, for the whole window
    let start = Instant::now();
    while start.elapsed() < WINDOW {
        ensure(g.running(p).await?, || {
            format!("killed in standby after {:?}", start.elapsed())
        })?;
        ensure(mounted(vol), || {
            format!(
                "the volume was unmounted in standby after {:?}",
                start.elapsed()
            )
        })?;
        ensure(!took_over(api), || {
            "took over while the kubelet lived".into()
        })?;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    ensure(api.get_pod("default", "rescued").is_some(), || {
        "the pod object went in standby".into()
    })?;

    // the kubelet dies
    kubelet.stop().await;
    let stopped = wall_ns();
    let t0 = Instant::now();
    let limit = TAKEOVER_AFTER + Duration::from_secs_f64(10.0 * SLACK);
    wait_for(
        limit,
        "the takeover (Node event ReapletTookOver)",
        || async { took_over(api).then_some(()) },
    )
    .await?;
    let takeover = t0.elapsed().as_secs_f64();
    ensure(
        takeover + RENEW.as_secs_f64() >= TAKEOVER_AFTER.as_secs_f64(),
        || format!("took over {takeover:.1} s after the stand-in stopped: before the threshold"),
    )?;
    let st = g.wait_stopped(p, Duration::from_secs(60)).await?;
    let (_, exit, finished) = st[0].clone();
    ensure(exit == 0, || {
        format!("exit {exit}, expected 0 (SIGTERM honoured)")
    })?;
    wait_for(
        Duration::from_secs(60),
        "the pod object to be deleted",
        || async { api.get_pod("default", "rescued").is_none().then_some(()) },
    )
    .await?;
    let gone = t0.elapsed().as_secs_f64();
    ensure(!mounted(vol), || {
        "the projected volume is still mounted in the host's namespace".into()
    })?;
    ensure(!vol.exists(), || format!("{} not removed", vol.display()))?;
    let journal = sh("journalctl", &["-u", UNIT, "--no-pager", "-o", "cat"])?;
    ensure(!journal.contains("never torn down"), || {
        "reaplet found it could not tear volumes down".into()
    })?;
    Ok(format!(
        "passive for {WINDOW:?} with the stand-in alive (pod running, volume mounted); took over \
         {takeover:.1} s after the stand-in stopped (threshold {TAKEOVER_AFTER:?}); container \
         exited 0 at {:.1} s; pod deleted at {gone:.1} s; the projected token tmpfs unmounted in \
         the host namespace and removed; journal mentions the takeover: {}",
        secs(finished - stopped),
        journal.contains("took over")
    ))
}
