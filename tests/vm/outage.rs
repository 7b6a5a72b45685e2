//! The package upgraded during an API outage (issue 38 item 6): reaplet runs as the node's
//! agent (primary) against the in-process API server, with a manifest pod; the server then
//! refuses every connection and the package is installed again (postinst's `try-restart`
//! restarts the running service and waits for its READY). READY needs the runtime, not the API
//! (see `notify_loop` in src/agent.rs): dpkg returns within [`PROMPT`], the new process is
//! active while the API still refuses, and the pod's container runs on untouched. Before, READY
//! waited for the first pod list, and dpkg waited for systemd's start timeout.

use super::package::{UPGRADE, dpkg_install, untouched, wait_active};
use super::rescue::api_kubeconfig;
use super::{Guest, R, UNIT, ensure, sh, show};
use crate::apiserver::ApiServer;
use reaplet::cri::Runtime;
use std::path::Path;
use std::time::{Duration, Instant};

const DROP_IN: &str = "/etc/systemd/system/reaplet.service.d/api-outage.conf";
/// How long dpkg may take, the restart included, under TCG on a loaded host: far below the
/// 90 s that systemd waited for a READY that needed the API.
const PROMPT: Duration = Duration::from_secs(30);

pub(super) async fn upgrade_during_api_outage(g: &Guest, inp: &Path) -> R<String> {
    let api = ApiServer::start().await;
    let kc = api_kubeconfig(&api, &g.node)?;
    super::drop_in(
        DROP_IN,
        format!(
            "[Service]\nEnvironment=REAPLET_KUBECONFIG={} REAPLET_AUTHORITY=primary\n",
            kc.display()
        ),
    )?;
    let r = upgrade(g, inp, &api).await;
    let _ = std::fs::remove_file(DROP_IN);
    let _ = sh("systemctl", &["daemon-reload"]);
    let _ = sh("systemctl", &["restart", UNIT]);
    r
}

async fn upgrade(g: &Guest, inp: &Path, api: &ApiServer) -> R<String> {
    sh("systemctl", &["daemon-reload"])?;
    let pid0 = show(UNIT, "MainPID");
    sh("systemctl", &["restart", UNIT])?;
    wait_active(&pid0).await?;
    let (manifest, p) = g.manifest_pod("through-outage").await?;
    let (_, cid) = p.containers[0].clone();
    let before = g
        .cri
        .container_status(&cid)
        .await
        .map_err(|e| e.to_string())?;
    // the API server refuses every new connection from now on
    api.refuse_connections_for(Duration::from_secs(600));
    let pid1 = show(UNIT, "MainPID");
    let t = Instant::now();
    let r = dpkg_install(&inp.join(UPGRADE));
    let took = t.elapsed();
    r?;
    ensure(took < PROMPT, || {
        format!("dpkg took {took:.1?} during the API outage")
    })?;
    let pid2 = wait_active(&pid1).await?;
    let state = show(UNIT, "ActiveState");
    ensure(state == "active", || {
        format!("after the upgrade the unit is {state}")
    })?;
    untouched(g, &cid, &before).await?;
    // the pod ends as before once its manifest goes, the API still refusing
    std::fs::remove_file(&manifest).map_err(|e| e.to_string())?;
    let st = g.wait_stopped(&p, Duration::from_secs(60)).await?;
    ensure(st[0].1 == 0, || {
        format!("the pod's container exit {}", st[0].1)
    })?;
    Ok(format!(
        "dpkg -i (reinstall, try-restart) returned in {took:.1?} with the API server refusing \
         connections; reaplet restarted (pid {pid1} -> {pid2}) and active; the pod's container \
         ran through it untouched, and ended with exit 0 when its manifest was removed"
    ))
}
