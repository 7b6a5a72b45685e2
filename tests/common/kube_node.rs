//! A whole node for the handover tests: the test bed's private containerd, the real control
//! plane ([`Cluster`]), the real kubelet running the pods, and reaplet as a process beside it,
//! authenticating with the same node certificate (the audit log tells them apart by their
//! User-Agent: `kubelet/v1.36…` and `reaplet/…`).

use super::k8s::kubelet::Kubelet;
use super::k8s::{Audit, Cluster, Options};
use crate::common::{KillOnDrop, reaplet, repo};
use reaplet::cri::{CriClient, Runtime};
use reaplet_testbed::Testbed;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub const NODE: &str = "kube-node";
pub const IMAGE: &str = reaplet_testbed::BUSYBOX_IMAGE;

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
    reaplet_testbed::host_network_pod(NODE, name, grace, script)
}

/// When the server received `a`, in wall-clock ns (comparable with [`reaplet::wall_ns`] and
/// the runtime's timestamps).
pub fn received_ns(a: &Audit) -> i64 {
    let t: jiff::Timestamp = a
        .received
        .parse()
        .unwrap_or_else(|e| panic!("requestReceivedTimestamp {:?}: {e}", a.received));
    t.as_nanosecond() as i64
}

/// The runtime's ID of the pod's first container as the kubelet reported it.
pub fn container_id(p: &Value) -> String {
    p["status"]["containerStatuses"][0]["containerID"]
        .as_str()
        .expect("a containerID")
        .trim_start_matches("containerd://")
        .to_owned()
}

pub fn uid(pod: &Value) -> String {
    pod["metadata"]["uid"].as_str().expect("a uid").to_owned()
}

impl KubeNode {
    /// containerd, etcd, the API server and the kubelet, all ready.
    pub async fn start(name: &str) -> KubeNode {
        Self::start_with(name, super::k8s::kubelet::DEFAULT_EVICTION).await
    }

    /// [`Self::start`] with the kubelet's eviction settings `eviction` (KubeletConfiguration
    /// lines, which reaplet reads from the same file).
    pub async fn start_with(name: &str, eviction: &str) -> KubeNode {
        let tb = Testbed::start(repo(), name);
        let cluster = Cluster::start(Options {
            nodes: vec![NODE.into()],
        })
        .await;
        let kubelet =
            Kubelet::start_with(&cluster, &tb.endpoint(), &tb.cgroup_root, eviction).await;
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
        let kc = self.cluster.node_kubeconfig(NODE);
        self.start_reaplet_via(&kc, extra);
    }

    /// [`Self::start_reaplet`] with `kubeconfig` instead of the node's own, e.g. one naming a
    /// proxy in front of the API server (`cluster.node_kubeconfig_for(NODE, &proxy.url())`).
    pub fn start_reaplet_via(&mut self, kubeconfig: &Path, extra: &[&str]) {
        let cmd = self.reaplet_command(kubeconfig, extra);
        self.spawn_reaplet(cmd);
    }

    /// The command [`Self::start_reaplet_via`] runs (its log appended to `reaplet_log`), for a
    /// test to add to (an environment variable, say) before [`Self::spawn_reaplet`].
    pub fn reaplet_command(&self, kubeconfig: &Path, extra: &[&str]) -> std::process::Command {
        self.reaplet_command_at(kubeconfig, "127.0.0.1:0", extra)
    }

    /// [`Self::reaplet_command`] with its status endpoint on `metrics` (a test that reads
    /// `/pods` or `/metrics` names a free port).
    pub fn reaplet_command_at(
        &self,
        kubeconfig: &Path,
        metrics: &str,
        extra: &[&str],
    ) -> std::process::Command {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.reaplet_log)
            .unwrap();
        let mut c = reaplet();
        c.arg("run")
            .args(self.kubelet.reaplet_args(kubeconfig, NODE))
            .args(["--metrics-bind-address", metrics])
            .args(extra)
            .env("RUST_LOG", "info")
            .stdout(std::process::Stdio::null())
            .stderr(out);
        c
    }

    /// Spawns `cmd` (from [`Self::reaplet_command`]) as this node's reaplet.
    pub fn spawn_reaplet(&mut self, mut cmd: std::process::Command) {
        let child = cmd.spawn().expect("spawn reaplet");
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

    /// What a failed wait for a controller's pod prints: the kubelet's errors and warnings
    /// (and its lines about reaplet), then the controller manager's last lines.
    pub fn controller_diagnostics(&self) -> String {
        let cm = self
            .cluster
            .controller_manager
            .as_ref()
            .map(|p| p.tail(30))
            .unwrap_or_default();
        format!(
            "kubelet:\n{}\ncontroller manager:\n{cm}",
            self.kubelet.log_grep(&["E1", "W1", "reaplet"], 40)
        )
    }

    pub fn reaplet_tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(&self.reaplet_log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// Container `id`'s status as soon as it has exited (polled every 20 ms: an orphan's
    /// containers may be removed right after), within `limit`.
    pub async fn wait_exited(&self, id: &str, limit: Duration) -> reaplet::cri::ContainerDetail {
        let t0 = Instant::now();
        loop {
            let st =
                self.client.container_status(id).await.unwrap_or_else(|e| {
                    panic!("container {id} gone before it was seen exited: {e}")
                });
            if !st.state.may_run() {
                return st;
            }
            assert!(
                t0.elapsed() < limit,
                "container {id} still runs after {limit:?}\nreaplet:\n{}",
                self.reaplet_tail(40)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
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

    /// Every request of reaplet's the server audited (reads too: a watch as it starts and
    /// again as it ends), in the order they completed.
    pub fn reaplet_requests(&self) -> Vec<Audit> {
        let user = format!("system:node:{NODE}");
        self.cluster
            .audit()
            .into_iter()
            .filter(|a| a.user == user && a.user_agent.starts_with("reaplet/"))
            .collect()
    }

    /// Waits until the server received a request of reaplet's matching `what` at or after
    /// `since` (wall-clock ns, [`reaplet::wall_ns`]), within `limit`; returns the first such
    /// request and how long after `since` it arrived.
    pub async fn wait_reaplet_request(
        &self,
        since: i64,
        what: impl Fn(&Audit) -> bool,
        limit: Duration,
    ) -> (Audit, Duration) {
        let t0 = Instant::now();
        loop {
            let first = self
                .reaplet_requests()
                .into_iter()
                .filter(|a| received_ns(a) >= since && what(a))
                .min_by_key(received_ns);
            if let Some(a) = first {
                let after = Duration::from_nanos((received_ns(&a) - since) as u64);
                return (a, after);
            }
            assert!(
                t0.elapsed() < limit,
                "no request of reaplet's as asked within {limit:?}\nreaplet:\n{}",
                self.reaplet_tail(40)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
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
