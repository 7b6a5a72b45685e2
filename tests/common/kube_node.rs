//! A whole node for the handover tests: the test bed's private containerd, the real control
//! plane ([`Cluster`]), the real kubelet running the pods, and reaplet as a process beside it,
//! authenticating with the same node certificate (the audit log tells them apart by their
//! User-Agent: `kubelet/v1.36…` and `reaplet/…`).

use super::k8s::kubelet::Kubelet;
use super::k8s::{Audit, Cluster, Options};
use crate::common::{KillOnDrop, reaplet, repo};
use reaplet::cri::{CriClient, Runtime};
use reaplet::testbed::Testbed;
use serde_json::{Value, json};
use std::path::PathBuf;
use std::time::{Duration, Instant};

pub const NODE: &str = "kube-node";
pub const IMAGE: &str = reaplet::testbed::BUSYBOX_IMAGE;

pub struct KubeNode {
    pub reaplet: Option<(std::process::Child, KillOnDrop)>,
    pub reaplet_log: PathBuf,
    pub kubelet: Kubelet,
    pub cluster: Cluster,
    pub client: CriClient,
    // dropped last: stops containerd after everything that used it
    pub tb: Testbed,
}

/// A pod of one container `app` running `script`, bound to the node, on the host network.
pub fn pod(name: &str, grace: i64, script: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": NODE,
            "hostNetwork": true,
            "terminationGracePeriodSeconds": grace,
            "containers": [{
                "name": "app", "image": IMAGE, "imagePullPolicy": "Never",
                "command": ["sh", "-c", script],
            }],
        },
    })
}

pub fn uid(pod: &Value) -> String {
    pod["metadata"]["uid"].as_str().expect("a uid").to_owned()
}

impl KubeNode {
    /// containerd, etcd, the API server and the kubelet, all ready.
    pub async fn start(name: &str) -> KubeNode {
        let tb = Testbed::start(repo(), name);
        let cluster = Cluster::start(Options {
            nodes: vec![NODE.into()],
        })
        .await;
        let kubelet = Kubelet::start(&cluster, &tb.endpoint(), &tb.cgroup_root).await;
        let reaplet_log = cluster.dir.path().join("reaplet.log");
        KubeNode {
            reaplet: None,
            reaplet_log,
            kubelet,
            cluster,
            client: tb.client(),
            tb,
        }
    }

    /// Creates `body` as an admin; returns the stored pod.
    pub async fn create(&self, body: &Value) -> Value {
        self.cluster
            .must("POST", "/api/v1/namespaces/default/pods", Some(body))
            .await
    }

    pub async fn get(&self, name: &str) -> Option<Value> {
        let (code, v) = self
            .cluster
            .raw(
                "GET",
                &format!("/api/v1/namespaces/default/pods/{name}"),
                None,
                None,
            )
            .await;
        match code {
            200 => Some(v),
            404 => None,
            c => panic!("GET pod {name}: {c} {v:#}"),
        }
    }

    /// Waits until the kubelet reports every container of `name` running and ready.
    pub async fn wait_running(&self, name: &str, limit: Duration) -> Value {
        let t0 = Instant::now();
        loop {
            if let Some(p) = self.get(name).await {
                let st = &p["status"];
                let ready = st["phase"] == "Running"
                    && st["containerStatuses"]
                        .as_array()
                        .is_some_and(|cs| cs.iter().all(|c| c["ready"] == true));
                if ready {
                    return p;
                }
            }
            assert!(
                t0.elapsed() < limit,
                "pod {name} not running within {limit:?}: {:#}\nkubelet:\n{}",
                self.get(name).await.unwrap_or_default(),
                self.kubelet.log_grep(&["E1", "W1", name], 40)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until `name` is gone from the API; returns when (since `t0`).
    pub async fn wait_gone(&self, name: &str, t0: Instant, limit: Duration) -> Duration {
        loop {
            if self.get(name).await.is_none() {
                return t0.elapsed();
            }
            assert!(
                t0.elapsed() < limit,
                "pod {name} still in the API after {limit:?}\nreaplet:\n{}",
                self.reaplet_tail(40)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// An admin DELETE with `opts` as the body.
    pub async fn delete(&self, name: &str, opts: Option<Value>) -> Value {
        self.cluster
            .must(
                "DELETE",
                &format!("/api/v1/namespaces/default/pods/{name}"),
                opts.as_ref(),
            )
            .await
    }

    /// Starts reaplet as a process for this node, with `extra` flags (e.g. `--authority
    /// primary`), reading the kubelet's config file like a packaged install does.
    pub fn start_reaplet(&mut self, extra: &[&str]) {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.reaplet_log)
            .unwrap();
        let kc = self.cluster.node_kubeconfig(NODE);
        let child = reaplet()
            .arg("run")
            .arg("--kubelet-config")
            .arg(&self.kubelet.config_file)
            .arg("--kubeconfig")
            .arg(&kc)
            .args(["--hostname-override", NODE])
            .arg("--root-dir")
            .arg(&self.kubelet.root_dir)
            .args(["--kubelet-healthz-url", &self.kubelet.healthz_url()])
            .args(["--metrics-bind-address", "127.0.0.1:0"])
            .args(extra)
            .env("RUST_LOG", "info")
            .stdout(std::process::Stdio::null())
            .stderr(out)
            .spawn()
            .expect("spawn reaplet");
        let pid = child.id();
        self.reaplet = Some((child, KillOnDrop(pid)));
    }

    /// Stops reaplet (SIGTERM) and waits for it: its stop never ends a pod.
    pub fn stop_reaplet(&mut self) {
        if let Some((mut child, _k)) = self.reaplet.take() {
            crate::common::sigterm(child.id());
            let _ = child.wait();
        }
    }

    pub fn reaplet_tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(&self.reaplet_log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// Waits until reaplet's log says `what` (a constant message), within `limit`.
    pub async fn wait_log(&self, what: &str, limit: Duration) {
        let t0 = Instant::now();
        while !std::fs::read_to_string(&self.reaplet_log)
            .unwrap_or_default()
            .contains(what)
        {
            assert!(
                t0.elapsed() < limit,
                "reaplet did not log {what:?} within {limit:?}:\n{}",
                self.reaplet_tail(40)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The API writes reaplet made (by its User-Agent), in order.
    pub fn reaplet_writes(&self) -> Vec<Audit> {
        self.writes_with_agent("reaplet/")
    }

    /// The API writes the kubelet made, in order.
    pub fn kubelet_writes(&self) -> Vec<Audit> {
        self.writes_with_agent("kubelet/")
    }

    fn writes_with_agent(&self, prefix: &str) -> Vec<Audit> {
        let user = format!("system:node:{NODE}");
        self.cluster
            .writes_by(&user)
            .into_iter()
            .filter(|a| a.user_agent.starts_with(prefix))
            .collect()
    }

    /// Writes to pod `name` (status, delete, eviction) by `who` ("reaplet/" or "kubelet/").
    pub fn pod_writes(&self, who: &str, name: &str) -> Vec<Audit> {
        self.writes_with_agent(who)
            .into_iter()
            .filter(|a| a.resource == "pods" && a.name == name)
            .collect()
    }

    /// What of pod `uid` is left: running containers, ready sandboxes, pod cgroups in any
    /// hierarchy, mounts below the kubelet's `pods/<uid>`.
    pub async fn leftovers(&self, uid: &str) -> Vec<String> {
        let mut left = Vec::new();
        let cs = self.client.list_containers(Some(uid)).await.unwrap();
        for c in cs.iter().filter(|c| c.state.may_run()) {
            left.push(format!("container {c:?}"));
        }
        let sbs = self.client.list_sandboxes(Some(uid)).await.unwrap();
        for s in sbs.iter().filter(|s| s.ready) {
            left.push(format!("sandbox {s:?}"));
        }
        let cg = reaplet::cgroups::CgroupManager::from_mountinfo(
            std::path::Path::new("/proc/self/mountinfo"),
            self.tb.naming(),
        )
        .unwrap();
        for (_, p) in cg
            .existing(&reaplet::pod::PodUid::parse(uid).unwrap())
            .unwrap()
        {
            left.push(format!("cgroup {}", p.display()));
        }
        let pod_dir = self.kubelet.root_dir.join("pods").join(uid);
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        for l in mounts
            .lines()
            .filter(|l| l.contains(pod_dir.to_str().unwrap()))
        {
            left.push(format!("mount {l}"));
        }
        left
    }

    /// Asserts nothing of pod `uid` is left (see [`Self::leftovers`]).
    pub async fn assert_nothing_left(&self, uid: &str) {
        let left = self.leftovers(uid).await;
        assert!(left.is_empty(), "left of pod {uid}: {left:#?}");
    }

    /// Waits until nothing of pod `uid` is left, within `limit`.
    pub async fn wait_nothing_left(&self, uid: &str, limit: Duration) {
        let t0 = Instant::now();
        loop {
            let left = self.leftovers(uid).await;
            if left.is_empty() {
                return;
            }
            assert!(
                t0.elapsed() < limit,
                "left of pod {uid} after {limit:?}: {left:#?}\nreaplet:\n{}",
                self.reaplet_tail(40)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
