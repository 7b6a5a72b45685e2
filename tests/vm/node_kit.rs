//! The node boot's pieces (`node.rs` has the scenarios): the kubelet's configuration, the
//! pods and their bodies, the API server's audit log as the guest reads it, and [`Node`], the
//! handle the scenarios act through (the admin's API client, the kubelet's pods, containerd's
//! exit events, the check that nothing of a pod is left).

use super::exits::Exits;
use super::{Guest, R, ensure, sh, wait_for};
use crate::host::{GUEST_AUDIT, GUEST_PKI};
use crate::k8s::{self, Audit};
use reaplet::cri::Runtime;
use reaplet::pod::PodUid;
use reaplet::wall_ns;
use reaplet_testbed::{IGNORES_TERM, TRAPS_TERM};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub(super) const KUBELET: &str = "kubelet";
pub(super) const KUBELET_CONFIG: &str = "/var/lib/kubelet/config.yaml";
pub(super) const KUBELET_KUBECONFIG: &str = "/etc/kubernetes/kubelet.conf";
pub(super) const ADMIN_KUBECONFIG: &str = "/etc/kubernetes/admin.conf";
pub(super) const STATIC_PODS: &str = "/etc/kubernetes/manifests";
pub(super) const DROP_IN: &str = "/etc/systemd/system/reaplet.service.d/node.conf";
pub(super) const KUBELET_LOGIND: &str = "/etc/systemd/logind.conf.d/99-kubelet.conf";
/// reaplet's takeover threshold (its minimum).
pub(super) const TAKEOVER_AFTER: u64 = 20;
/// The kubelet's graceful node shutdown.
pub(super) const SHUTDOWN_GRACE: u64 = 30;
pub(super) const SHUTDOWN_CRITICAL: u64 = 5;
/// How long the hand-back window is watched before the power-off (which it runs through).
pub(super) const WINDOW: Duration = Duration::from_secs(8);

/// The kubelet's configuration: the systemd driver on cgroup v2, its own static pod directory,
/// graceful node shutdown; healthz on loopback (reaplet probes it); image GC off (the test
/// images are imported, never pulled); the pods' limit and the memory threshold of the pressure
/// scenario (`pressure.rs`).
pub(super) fn kubelet_config() -> String {
    format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: systemd
containerRuntimeEndpoint: unix://{socket}
staticPodPath: {STATIC_PODS}
failSwapOn: false
address: 127.0.0.1
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: false}}
  x509: {{clientCAFile: {GUEST_PKI}/ca.crt}}
authorization: {{mode: AlwaysAllow}}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
syncFrequency: 10s
resolvConf: ""
shutdownGracePeriod: {SHUTDOWN_GRACE}s
shutdownGracePeriodCriticalPods: {SHUTDOWN_CRITICAL}s
{pressure}"#,
        socket = super::SOCKET,
        pressure = super::pressure::kubelet_lines()
    )
}

/// A pod of one container `app` running `script`, bound to the node, on the host network.
pub(super) fn pod(node: &str, name: &str, grace: i64, script: &str) -> Value {
    reaplet_testbed::host_network_pod(node, name, grace, script)
}

/// What the kubelet made of a pod.
#[derive(Clone, Debug)]
pub(super) struct Running {
    pub(super) uid: String,
    /// (container name, container ID)
    pub(super) containers: Vec<(String, String)>,
}

pub(super) struct Node {
    pub(super) g: Guest,
    pub(super) api: kube::Client,
    pub(super) exits: Exits,
    pub(super) pods: BTreeMap<String, Running>,
}

/// The pods, by scenario.
pub(super) const LIVE: [&str; 2] = ["live-term", "live-kill"];
pub(super) const TAKEN: [&str; 2] = ["hooked", "stubborn"];
pub(super) const SLOW: &str = "slow";
pub(super) const SLOW_GRACE: i64 = 45;
pub(super) const BYSTANDER: &str = "bystander";
pub(super) const PW_KILL: &str = "pw-kill";
pub(super) const PW_GRACE: i64 = 4;

pub(super) fn pods(node: &str) -> Vec<Value> {
    let mut hooked = pod(node, "hooked", 30, TRAPS_TERM);
    hooked["spec"]["containers"][0]["lifecycle"] = json!({"preStop": {"exec": {"command":
        ["/bin/sh", "-c", "echo prestop-ran > /proc/1/fd/1; sleep 1"]}}});
    // a tmpfs the kubelet mounts and, with the kubelet gone, reaplet tears down
    hooked["spec"]["containers"][0]["volumeMounts"] =
        json!([{"name": "scratch", "mountPath": "/scratch"}]);
    hooked["spec"]["volumes"] = json!([{"name": "scratch", "emptyDir": {"medium": "Memory"}}]);
    vec![
        pod(node, LIVE[0], 30, TRAPS_TERM),
        pod(node, LIVE[1], 3, IGNORES_TERM),
        hooked,
        pod(node, TAKEN[1], 5, IGNORES_TERM),
        pod(node, SLOW, SLOW_GRACE, IGNORES_TERM),
        pod(node, BYSTANDER, 30, TRAPS_TERM),
        pod(node, PW_KILL, PW_GRACE, IGNORES_TERM),
        super::pressure::hungry(node),
    ]
}

pub(super) fn is_reaplet(a: &Audit) -> bool {
    a.user_agent.starts_with("reaplet")
}

pub(super) fn is_kubelet(a: &Audit) -> bool {
    a.user_agent.starts_with("kubelet")
}

pub(super) fn lines(v: &[&Audit]) -> Vec<String> {
    v.iter()
        .map(|a| format!("{} ({})", a.line(), a.user_agent))
        .collect()
}

/// The API server's audit log as it is now, through 10.0.2.101:80.
pub(super) async fn audit() -> R<Vec<Audit>> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let fetch = async {
        let mut s = tokio::net::TcpStream::connect(GUEST_AUDIT)
            .await
            .map_err(|e| format!("connecting to the audit log at {GUEST_AUDIT}: {e}"))?;
        s.write_all(b"GET /audit.log HTTP/1.0\r\n\r\n")
            .await
            .map_err(|e| e.to_string())?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.map_err(|e| e.to_string())?;
        Ok::<_, String>(buf)
    };
    let buf = tokio::time::timeout(Duration::from_secs(60), fetch)
        .await
        .map_err(|_| "the audit log did not arrive within 60 s".to_string())??;
    let text = String::from_utf8_lossy(&buf);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b)
        .ok_or("no HTTP answer from the audit relay")?;
    Ok(body
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .map(|v| Audit::parse(&v))
        .collect())
}

pub(super) fn journal(unit: &str) -> String {
    sh("journalctl", &["-u", unit, "--no-pager", "-o", "cat"]).unwrap_or_default()
}

impl Node {
    pub(super) async fn api(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        let ct = (method == "PATCH").then_some("application/merge-patch+json");
        k8s::send(&self.api, method, path, ct, body).await
    }

    pub(super) async fn get_pod(&self, name: &str) -> R<Option<Value>> {
        match self
            .api(
                "GET",
                &format!("/api/v1/namespaces/default/pods/{name}"),
                None,
            )
            .await
        {
            (200, v) => Ok(Some(v)),
            (404, _) => Ok(None),
            (c, v) => Err(format!("GET pod {name}: {c} {v}")),
        }
    }

    /// Deletes `name` (its own grace); the wall time just before the request.
    pub(super) async fn delete(&self, name: &str) -> R<i64> {
        let at = wall_ns();
        let (c, v) = self
            .api(
                "DELETE",
                &format!("/api/v1/namespaces/default/pods/{name}"),
                None,
            )
            .await;
        ensure(c == 200, || format!("DELETE {name}: {c} {v}"))?;
        Ok(at)
    }

    pub(super) async fn wait_gone(&self, name: &str, limit: Duration) -> R<()> {
        wait_for(
            limit,
            &format!("pod {name} to be gone from the API"),
            || async { matches!(self.get_pod(name).await, Ok(None)).then_some(()) },
        )
        .await
    }

    pub(super) fn running(&self, name: &str) -> R<&Running> {
        self.pods
            .get(name)
            .ok_or_else(|| format!("pod {name} never ran"))
    }

    /// The runtime's state of pod `name`'s first container (the one the kubelet ran).
    pub(super) async fn container_state(&self, name: &str) -> R<reaplet::cri::ContainerDetail> {
        let (_, id) = &self.running(name)?.containers[0];
        self.g
            .cri
            .container_status(id)
            .await
            .map_err(|e| e.to_string())
    }

    pub(super) fn uid(&self, name: &str) -> R<PodUid> {
        PodUid::parse(&self.running(name)?.uid).map_err(|e| format!("{name}'s uid: {e}"))
    }

    /// The exits of `name`'s containers, read from containerd's events.
    pub(super) async fn exits_of(&self, name: &str, limit: Duration) -> R<Vec<(String, i32, i64)>> {
        let r = self.running(name)?;
        self.exits
            .wait(&r.containers, limit)
            .await
            .map_err(|e| format!("{name}: {e}"))
    }

    /// Nothing of `name` is left on the node: no running container, no ready sandbox, its
    /// slice (directory and systemd unit) gone, nothing mounted below its pod directory.
    pub(super) async fn nothing_left(&self, name: &str) -> R<String> {
        let uid = self.uid(name)?;
        let slice = self.g.wait_slice_gone(&uid).await?;
        let cs = self
            .g
            .cri
            .list_containers(Some(uid.as_str()))
            .await
            .map_err(|e| e.to_string())?;
        ensure(cs.iter().all(|c| !c.state.may_run()), || {
            format!("{name}: containers still running: {cs:?}")
        })?;
        let sbs = self
            .g
            .cri
            .list_sandboxes(Some(uid.as_str()))
            .await
            .map_err(|e| e.to_string())?;
        ensure(sbs.iter().all(|s| !s.ready), || {
            format!("{name}: sandboxes still ready: {sbs:?}")
        })?;
        let dir = Path::new("/var/lib/kubelet/pods").join(uid.as_str());
        let mounts: Vec<PathBuf> =
            reaplet::volumes::read_mountinfo(Path::new("/proc/self/mountinfo"))
                .map_err(|e| e.to_string())?
                .into_iter()
                .map(|m| m.mount_point)
                .filter(|p| p.starts_with(&dir))
                .collect();
        ensure(mounts.is_empty(), || {
            format!("{name}: still mounted: {mounts:?}")
        })?;
        Ok(format!(
            "{name}: {slice}; {} containers none running, {} sandboxes none ready, no mount",
            cs.len(),
            sbs.len()
        ))
    }
}

/// Waits until the kubelet runs every container of pod `name`; its UID and container IDs.
pub(super) async fn wait_running(n: &Node, name: &str, limit: Duration) -> R<Running> {
    wait_for(limit, &format!("the kubelet to run {name}"), || async {
        let p = n.get_pod(name).await.ok()??;
        let st = &p["status"];
        let cs = st["containerStatuses"].as_array()?;
        let all = !cs.is_empty() && cs.iter().all(|c| c["state"]["running"].is_object());
        if st["phase"] != "Running" || !all {
            return None;
        }
        Some(Running {
            uid: p["metadata"]["uid"].as_str()?.to_owned(),
            containers: cs
                .iter()
                .filter_map(|c| {
                    Some((
                        c["name"].as_str()?.to_owned(),
                        c["containerID"]
                            .as_str()?
                            .trim_start_matches("containerd://")
                            .to_owned(),
                    ))
                })
                .collect(),
        })
    })
    .await
}
