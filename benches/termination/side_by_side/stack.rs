//! The node under test: the test bed's containerd, etcd and kube-apiserver, the real kubelet,
//! and reaplet once it took over (`--authority primary`); the admin's pod requests, the waits
//! on the API and on the audit log, the logs kept after a scenario.

use super::audit::{AuditTail, Rec};
use super::k8s::kubelet::Kubelet;
use super::k8s::proxy::Proxy;
use super::k8s::{Cluster, Options};
use super::*;
use std::collections::HashSet;

/// A node: the test bed's containerd, the cluster, the kubelet, and reaplet once it took over.
/// Fields drop in order: reaplet, the proxy, the kubelet, the cluster, containerd.
pub(super) struct Stack {
    pub(super) reaplet: Option<Agent>,
    pub(super) proxy: Option<Proxy>,
    pub(super) kubelet: Kubelet,
    pub(super) cluster: Cluster,
    pub(super) scenario: String,
    audit: std::sync::Mutex<AuditTail>,
    pub(super) tb: Testbed,
}

impl Stack {
    pub(super) async fn start(scenario: &str) -> Stack {
        Self::start_with(scenario, k8s::kubelet::DEFAULT_EVICTION).await
    }

    /// [`Self::start`] with the kubelet's eviction settings `eviction` (KubeletConfiguration
    /// lines; reaplet reads the same file after the takeover).
    pub(super) async fn start_with(scenario: &str, eviction: &str) -> Stack {
        let t = Instant::now();
        let tb = Testbed::start(repo(), &format!("kb-{scenario}"));
        let cluster = Cluster::start(Options {
            nodes: vec![NODE.into()],
        })
        .await;
        let kubelet =
            Kubelet::start_with(&cluster, &tb.endpoint(), &tb.cgroup_root, eviction).await;
        println!(
            "[{scenario}] containerd, etcd, kube-apiserver and the kubelet up in {:.1} s",
            t.elapsed().as_secs_f64()
        );
        Stack {
            reaplet: None,
            proxy: None,
            kubelet,
            cluster,
            scenario: scenario.to_owned(),
            audit: Default::default(),
            tb,
        }
    }

    /// `f` of every audit record so far.
    fn audit<T>(&self, f: impl FnOnce(&[Rec]) -> T) -> T {
        let mut t = self.audit.lock().unwrap_or_else(|e| e.into_inner());
        t.refresh(&self.cluster.audit_log);
        f(&t.recs)
    }

    /// Creates `body` as the admin; returns its UID.
    pub(super) async fn create(&self, body: &Value) -> R<String> {
        let (code, v) = self
            .cluster
            .raw("POST", "/api/v1/namespaces/default/pods", None, Some(body))
            .await;
        if code != 201 {
            return Err(format!("create {}: {code} {v}", body["metadata"]["name"]));
        }
        Ok(v["metadata"]["uid"].as_str().unwrap_or_default().to_owned())
    }

    /// Creates every body, 16 at a time; returns their UIDs.
    pub(super) async fn create_all(&self, bodies: &[Value]) -> R<Vec<String>> {
        let mut uids = Vec::with_capacity(bodies.len());
        for chunk in bodies.chunks(16) {
            for r in futures_util::future::join_all(chunk.iter().map(|b| self.create(b))).await {
                uids.push(r?);
            }
        }
        Ok(uids)
    }

    pub(super) async fn delete(&self, name: &str) -> R<()> {
        let (code, v) = self
            .cluster
            .raw(
                "DELETE",
                &format!("/api/v1/namespaces/default/pods/{name}"),
                None,
                None,
            )
            .await;
        if code == 200 || code == 202 {
            Ok(())
        } else {
            Err(format!("delete {name}: {code} {v}"))
        }
    }

    async fn pods(&self) -> R<Vec<Value>> {
        let (code, v) = self
            .cluster
            .raw("GET", "/api/v1/namespaces/default/pods", None, None)
            .await;
        if code != 200 {
            return Err(format!("list pods: {code} {v}"));
        }
        Ok(v["items"].as_array().cloned().unwrap_or_default())
    }

    /// Waits until the kubelet reports every pod of `names` running and ready.
    pub(super) async fn wait_running(&self, names: &[String], limit: Duration) -> R<()> {
        let want: HashSet<&str> = names.iter().map(String::as_str).collect();
        let t0 = Instant::now();
        loop {
            let running = self
                .pods()
                .await?
                .iter()
                .filter(|p| {
                    want.contains(p["metadata"]["name"].as_str().unwrap_or(""))
                        && p["status"]["phase"] == "Running"
                        && p["status"]["containerStatuses"]
                            .as_array()
                            .is_some_and(|cs| cs.iter().all(|c| c["ready"] == true))
                })
                .count();
            if running == want.len() {
                return Ok(());
            }
            if t0.elapsed() > limit {
                return Err(format!(
                    "[{}] {running} of {} pods running after {limit:?}; kubelet:\n{}",
                    self.scenario,
                    want.len(),
                    self.kubelet.log_tail(20)
                ));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Waits until no pod of `names` is in the API any more.
    pub(super) async fn wait_gone(
        &self,
        names: &[String],
        poll: Duration,
        limit: Duration,
    ) -> R<()> {
        let want: HashSet<&str> = names.iter().map(String::as_str).collect();
        let t0 = Instant::now();
        loop {
            let left = self
                .pods()
                .await?
                .iter()
                .filter(|p| want.contains(p["metadata"]["name"].as_str().unwrap_or("")))
                .count();
            if left == 0 {
                return Ok(());
            }
            if t0.elapsed() > limit {
                return Err(format!(
                    "[{}] {left} of {} pods still in the API after {limit:?}",
                    self.scenario,
                    want.len()
                ));
            }
            tokio::time::sleep(poll).await;
        }
    }

    /// `f` of the audit records once it answers (a request's record may be written just after
    /// its effect was seen): 2 s at most.
    pub(super) async fn audit_find<T>(&self, f: impl Fn(&[Rec]) -> Option<T>) -> Option<T> {
        for _ in 0..40 {
            if let Some(v) = self.audit(&f) {
                return Some(v);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        None
    }

    /// Waits until the first audit record matching `f` appears (polling every 10 ms).
    pub(super) async fn wait_audit(
        &self,
        what: &str,
        limit: Duration,
        f: impl Fn(&Rec) -> bool,
    ) -> R<Rec> {
        let t0 = Instant::now();
        let mut from = 0;
        loop {
            let found = self.audit(|a| {
                let r = a[from..].iter().find(|r| f(r)).cloned();
                from = a.len();
                r
            });
            if let Some(r) = found {
                return Ok(r);
            }
            if t0.elapsed() > limit {
                return Err(format!(
                    "[{}] no {what} in the audit log after {limit:?}",
                    self.scenario
                ));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The running agent's PID.
    pub(super) fn pid(&self, who: Who) -> R<u32> {
        match who {
            Who::Kubelet => self
                .kubelet
                .pid()
                .ok_or("the kubelet is not running".into()),
            Who::Reaplet => self
                .reaplet
                .as_ref()
                .map(Agent::pid)
                .ok_or("reaplet is not running".into()),
        }
    }

    /// The takeover: the kubelet stopped (SIGTERM; its pods keep running), reaplet started
    /// with `--authority primary` on the kubelet's config file and root dir, ready and listing
    /// every pod of `uids`. `kubeconfig`: the node's unless given.
    pub(super) async fn takeover(
        &mut self,
        uids: &[String],
        kubeconfig: Option<PathBuf>,
        extra: &[&str],
    ) -> R<()> {
        self.kubelet.stop();
        let kc = kubeconfig.unwrap_or_else(|| self.cluster.node_kubeconfig(NODE));
        let mut args = vec!["--authority", "primary"];
        args.extend_from_slice(extra);
        let agent = self.run_reaplet(&kc, &args)?;
        let t = Instant::now();
        agent.wait_ready().await?;
        let start = Instant::now();
        loop {
            if let Some((200, body)) = agent.get("/pods").await
                && uids.iter().all(|u| body.contains(u.as_str()))
            {
                break;
            }
            if start.elapsed() > Duration::from_secs(60) {
                return Err(format!(
                    "[{}] reaplet does not list all {} pods after 60 s",
                    self.scenario,
                    uids.len()
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        println!(
            "[{}] kubelet stopped; reaplet --authority primary ready with {} pods in {:.2} s",
            self.scenario,
            uids.len(),
            t.elapsed().as_secs_f64()
        );
        self.reaplet = Some(agent);
        Ok(())
    }

    /// reaplet on the kubelet's config file, root dir and `/healthz`, the node's name and
    /// `kubeconfig`, with `extra`; its log in the cluster's directory (`reaplet.log`).
    pub(super) fn run_reaplet(&self, kubeconfig: &Path, extra: &[&str]) -> R<Agent> {
        Agent::run(self.cluster.dir.path().join("reaplet.log"), |c| {
            c.args(self.kubelet.reaplet_args(kubeconfig, NODE))
                .args(extra);
        })
    }

    /// Keeps the logs behind the figures in `target/tmp`.
    pub(super) fn keep_logs(&self) {
        let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
        let keep = |from: &Path, what: &str| {
            let _ = std::fs::copy(
                from,
                tmp.join(format!("bench-kubelet-{}-{what}.log", self.scenario)),
            );
        };
        keep(&self.cluster.audit_log, "audit");
        keep(&self.kubelet.dir.join("kubelet.log"), "kubelet");
        keep(&self.cluster.dir.path().join("reaplet.log"), "reaplet");
        if let Some(cm) = &self.cluster.controller_manager {
            keep(&cm.log, "controller-manager");
        }
    }
}
