//! This node's eviction sources: the systems that decide *which* pods must leave, brought to
//! the node (no kubelet counterpart: the kube-controller-manager's NoExecute taint manager,
//! `pkg/controller/tainteviction`, and the scheduler's node affinity, enforced while pods run
//! through the Eviction API, `pkg/registry/core/pod/storage/eviction.go`).
//!
//! * [`tolerations`], [`taints`]: the taint manager as pure state and transitions;
//! * [`affinity`]: `nodeSelector` and required node affinity matching, and the settle timers;
//! * [`runner`]: the task that watches this node's Node object, is fed the API source's pods
//!   ([`PodFeed`]), and carries out the decisions: the API side first (the taint manager's
//!   `DisruptionTarget` condition and DELETE, or an Eviction), then a kill request with
//!   [`KillReason::Evicted`](crate::lifecycle::KillReason::Evicted) through the one seam every
//!   reason to end a pod goes through.
//!
//! Invariants: decisions are pure functions of (node, pods, monotonic now); wall-clock times
//! (`timeAdded`) are converted at the API edge; mirror, static and (for affinity) DaemonSet
//! pods are never evicted; nothing is evicted while the agent is not active (standby), and
//! with `dry_run` nothing at all (each decision is logged and counted instead).

pub mod actions;
pub mod affinity;
pub mod runner;
pub mod selector;
pub mod taints;
pub mod tolerations;

use crate::pod::PodUid;
use k8s_openapi::api::core::v1::Pod;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// What the eviction sources are set to do.
#[derive(Debug, Clone, Default)]
pub struct EvictionConfig {
    /// The NoExecute taint manager (`--enable-taint-manager`).
    pub taint_manager: bool,
    /// Required node affinity during execution (`--enforce-node-affinity`), when on.
    pub node_affinity: Option<AffinityConfig>,
    /// Decide and report only (`--eviction-dry-run`).
    pub dry_run: bool,
    /// reaplet's own pod ([`crate::self_pod`]): exempt from every eviction source.
    pub own_pod: Option<PodUid>,
}

impl EvictionConfig {
    pub fn any(&self) -> bool {
        self.taint_manager || self.node_affinity.is_some()
    }
}

/// Which pods node affinity is enforced for, and how long a mismatch must last.
#[derive(Debug, Clone)]
pub struct AffinityConfig {
    /// Only these namespaces (empty: all).
    pub namespaces: Vec<String>,
    /// Only pods whose labels match.
    pub selector: selector::LabelSelector,
    /// How long a mismatch must last before the eviction (a label flapping back cancels).
    pub settle: Duration,
}

/// The default settle delay after a label change.
pub const DEFAULT_SETTLE: Duration = Duration::from_secs(30);

/// A change to this node's pods, as the API source sees it.
#[derive(Debug, Clone)]
pub enum PodChange {
    /// A complete list (after a (re)list): every pod not in it is gone.
    Listed(Vec<Arc<Pod>>),
    Apply(Arc<Pod>),
    Gone(PodUid),
}

/// The API source's side of the pod feed, to each of its readers (the eviction sources'
/// runner, node-pressure eviction). Unbounded: it carries what the watch delivers, no more
/// (the pods are shared, never copied), and a reader never waits on the network.
#[derive(Debug, Clone, Default)]
pub struct PodFeed(Vec<mpsc::UnboundedSender<PodChange>>);

impl PodFeed {
    pub fn channel() -> (PodFeed, mpsc::UnboundedReceiver<PodChange>) {
        let mut feed = PodFeed::default();
        let rx = feed.subscribe();
        (feed, rx)
    }

    /// One more reader.
    pub fn subscribe(&mut self) -> mpsc::UnboundedReceiver<PodChange> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.0.push(tx);
        rx
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn send(&self, change: PodChange) {
        if let [only] = self.0.as_slice() {
            let _ = only.send(change);
            return;
        }
        for tx in &self.0 {
            let _ = tx.send(change.clone());
        }
    }
}

/// A pending eviction, for `reaplet pods`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PendingEviction {
    #[serde(rename = "podUID")]
    pub uid: String,
    pub pod: String,
    /// `taint_manager` or `node_affinity`.
    pub source: &'static str,
    /// `scheduled` (a taint timer), `settling` (a label change settling), `blocked` (refused,
    /// waiting to retry), `waiting` (not active).
    pub state: &'static str,
    /// Seconds until the next attempt.
    #[serde(rename = "inSeconds")]
    pub in_seconds: f64,
    /// Why it is blocked (the server's message), if it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

#[cfg(test)]
mod tests;
