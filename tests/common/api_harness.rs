//! reaplet in this process as node [`NODE`], against the in-process API server and a private
//! containerd: the harness of the API tests (`tests/api.rs`, `tests/statuses.rs`,
//! `tests/api_sick.rs`).

use super::apiserver::ApiServer;
use super::{repo, wait_pods_gone, wait_watches, watches};
use reaplet::agent::AgentConfig;
use reaplet_testbed::Testbed;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

pub const NODE: &str = "testnode";
/// How long a pod may take to go, unless a test says otherwise.
pub const LIMIT: Duration = Duration::from_secs(40);

pub struct ApiHarness {
    pub api: ApiServer,
    pub root: tempfile::TempDir,
    pub cancel: CancellationToken,
    pub agent: Option<tokio::task::JoinHandle<()>>,
    // dropped last: stops containerd after the agent
    pub tb: Testbed,
}

impl ApiHarness {
    pub async fn new(name: &str) -> ApiHarness {
        let tb = Testbed::start(repo(), name);
        let api = ApiServer::start().await;
        ApiHarness {
            api,
            root: tempfile::tempdir().unwrap(),
            cancel: CancellationToken::new(),
            agent: None,
            tb,
        }
    }

    pub fn config(&self, kube: Option<kube::Config>) -> AgentConfig {
        let mut cfg = AgentConfig::new(
            NODE,
            &self.tb.endpoint(),
            &self.tb.cgroup_root,
            self.root.path().join("kubelet"),
        );
        cfg.kube = kube;
        cfg.pipeline.volume_poll = Duration::from_millis(100);
        cfg
    }

    /// The agent's configuration in standby (auto) as `user`: the kubelet's health endpoint
    /// `healthz` (`None`: `healthzPort: 0`), the takeover threshold and the poll period.
    pub async fn standby_config(
        &self,
        user: &super::apiserver::User,
        healthz: Option<String>,
        takeover_after: Duration,
        poll: Duration,
    ) -> AgentConfig {
        let kc = self.api.write_kubeconfig_as(self.root.path(), user);
        let mut cfg = self.config(Some(reaplet::api::client_config(Some(&kc)).await.unwrap()));
        cfg.authority = reaplet::standby::AuthoritySetting::Auto;
        cfg.kubelet_healthz_url = healthz;
        cfg.takeover_after = takeover_after;
        cfg.standby_poll = poll;
        cfg
    }

    /// Starts the agent in this process, connected as its node; does not wait for it.
    pub async fn spawn_agent(&mut self) {
        self.spawn_agent_as(reaplet::standby::AuthoritySetting::Auto)
            .await;
    }

    /// [`Self::spawn_agent`] with `--authority`.
    pub async fn spawn_agent_as(&mut self, authority: reaplet::standby::AuthoritySetting) {
        let kc = self.api.write_kubeconfig(self.root.path(), NODE);
        let kube = reaplet::api::client_config(Some(&kc)).await.unwrap();
        let mut cfg = self.config(Some(kube));
        cfg.authority = authority;
        let cancel = self.cancel.clone();
        self.agent = Some(tokio::spawn(async move {
            reaplet::agent::run(cfg, cancel).await.unwrap();
        }));
    }

    /// Runs the agent in this process, and waits until it watches pods.
    pub async fn start_agent(&mut self) {
        self.spawn_agent().await;
        self.wait_watching(0).await;
    }

    /// Runs the agent in this process as the node's only agent (`--authority=primary`: a bed
    /// with a Node object and no Lease is, in auto mode, a kubelet registered under another
    /// name, and reaplet stands by), and waits until it watches pods.
    pub async fn start_primary_agent(&mut self) {
        self.spawn_agent_as(reaplet::standby::AuthoritySetting::Primary)
            .await;
        self.wait_watching(0).await;
    }

    /// Stops the in-process agent (as a restart would) and starts it again.
    pub async fn restart_agent(&mut self) {
        self.stop_agent().await;
        self.cancel = CancellationToken::new();
        let seen = watches(&self.api.requests());
        self.spawn_agent().await;
        self.wait_watching(seen).await;
    }

    /// Waits until reaplet has more than `seen` pod watch requests open.
    pub async fn wait_watching(&self, seen: usize) {
        wait_watches(&self.api, seen).await;
    }

    /// Waits until the pod object is gone (fails after [`LIMIT`]).
    pub async fn wait_gone(&self, name: &str) {
        self.wait_gone_within(name, LIMIT).await;
    }

    /// Waits until the pod object is gone; returns how long that took. Fails after `limit`.
    pub async fn wait_gone_within(&self, name: &str, limit: Duration) -> Duration {
        wait_pods_gone(&self.api, &[name], limit, || {
            format!("writes: {:#?}", self.api.writes())
        })
        .await
    }

    pub async fn stop_agent(&mut self) {
        self.cancel.cancel();
        if let Some(a) = self.agent.take() {
            let _ = tokio::time::timeout(Duration::from_secs(10), a).await;
        }
    }

    pub async fn stop(mut self) {
        self.stop_agent().await;
    }
}
