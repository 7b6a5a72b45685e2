//! The outage scenario: the connections between the agent and the API server reset for a
//! while (a TCP proxy in front of the server): the agent's connection attempts, and its first
//! answered request after recovery.

use super::k8s::proxy::Proxy;
use super::stack::Stack;
use super::*;

/// 5. `secs` of reset connections between the agent and the API server (a TCP proxy in front
///    of the server, for the agent only): connection attempts during the outage, and recovery
///    -> the agent's first request the server answered (its first audit record after it).
pub(super) async fn outage_side(secs: u64) -> R<Vec<Row>> {
    header(&format!(
        "kubelet 5: {secs} s of reset connections -> attempts, recovery -> first answered request"
    ));
    let mut s = Stack::start("outage").await;
    let proxy = Proxy::start(s.cluster.addr()).await;
    // the kubelet behind the proxy: its kubeconfig (the node's) now names the proxy
    let kc = s.cluster.node_kubeconfig(NODE);
    let id = s.cluster.node_identity(NODE);
    s.cluster.pki.kubeconfig(&proxy.url(), &id, &kc);
    let reaplet_kc = s.cluster.dir.path().join("reaplet-proxy.kubeconfig");
    s.cluster.pki.kubeconfig(&proxy.url(), &id, &reaplet_kc);
    s.kubelet.restart().await;
    s.proxy = Some(proxy);
    let uids = s.create_all(&[pod("outage-0", TRAPS_TERM)]).await?;
    s.wait_running(&["outage-0".to_owned()], Duration::from_secs(120))
        .await?;
    let mut res = Vec::new();
    for who in [Who::Kubelet, Who::Reaplet] {
        if who == Who::Reaplet {
            s.takeover(&uids, Some(reaplet_kc.clone()), &[]).await?;
        }
        // every watch and the lease in their steady state
        tokio::time::sleep(Duration::from_secs(10)).await;
        let proxy = s.proxy.as_ref().ok_or("no proxy")?;
        let a0 = proxy.attempts();
        proxy.start_resetting();
        tokio::time::sleep(Duration::from_secs(secs)).await;
        let attempts = proxy.attempts() - a0;
        let back = wall_ns();
        proxy.stop_resetting();
        let first = s
            .wait_audit(
                &format!("{} request after the outage", who.label()),
                Duration::from_secs(180),
                |r| r.by(who) && r.received >= back,
            )
            .await?;
        let after = ms_ns(first.received - back) / 1e3;
        println!(
            "{}: {attempts} connection attempts in {secs} s of resets; first answered request {after:.2} s after recovery ({})",
            who.label(),
            first.line()
        );
        res.push((attempts as f64, after));
    }
    s.keep_logs();
    Ok(vec![
        row(
            format!("{secs} s outage: connection attempts"),
            "attempts",
            res[0].0,
            res[1].0,
        ),
        row(
            format!("{secs} s outage: recovery -> first answered request"),
            "s",
            res[0].1,
            res[1].1,
        ),
    ])
}
