//! Pod events: kubelet's `record.EventRecorder` use in the termination path
//! (`events.KillingContainer`, `FailedPreStopHook`, `FailedKillPod`, `ExceededGracePeriod`),
//! reaplet's own `NodeNameMismatch` (its node name is wrong: no orphan is ended),
//! and node events ([`NodeEventReason`]: `ContainerRuntimeUnhealthy`, `ReapletTookOver`,
//! `ReapletHandedBack`).
//!
//! Node events go on a channel of their own ([`EventSink::with_node_events`]); the API side
//! ([`crate::api::events`]) posts them about this node's Node object, as the kubelet does.
//!
//! Invariants:
//! * recording never blocks the pipeline: the sink is a bounded channel and a full channel
//!   drops the event (counted), so a slow API cannot stall a kill;
//! * messages never carry a hook's output (it may hold secrets), only what the kubelet says.

use crate::pod::PodUid;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::sync::mpsc;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventReason {
    /// Normal: "Stopping container <name>".
    Killing,
    /// Warning: a preStop hook failed or timed out.
    FailedPreStopHook,
    /// Warning: "error killing pod: ...".
    FailedKillPod,
    /// Warning: the runtime did not stop the pod within its grace.
    ExceededGracePeriod,
    /// Warning: unmounting one of the pod's node-local volumes failed (the kubelet's reason;
    /// recorded once per path, retried with backoff).
    FailedUnMount,
    /// Warning: the pod's volumes are still there past `volumeUnmountTimeout` (each named with
    /// its plugin and why): the pod is not deleted while they are (recorded once).
    VolumesStillMounted,
    /// Normal: the NoExecute taint manager deletes the pod ("Marking for deletion Pod ...") or
    /// cancels a scheduled deletion ("Cancelling deletion of Pod ..."), the controller
    /// manager's reason and messages.
    TaintManagerEviction,
    /// Normal: the pod is evicted because its required node affinity no longer matches.
    NodeAffinityEviction,
    /// Warning: an eviction is refused (a PodDisruptionBudget, a misconfiguration); recorded once
    /// per pod and cause, retried.
    EvictionBlocked,
    /// Warning: a runtime pod reaplet found with no object under its node's name has its object
    /// bound to another node: reaplet's node name is wrong, and it ends no orphan (recorded
    /// once each time the problem is found).
    NodeNameMismatch,
    /// Warning: node-pressure eviction ends the pod (the kubelet's message, and its annotations
    /// `offending_containers`, `offending_containers_usage`, `starved_resource`).
    Evicted,
    /// Normal: the pod's `activeDeadlineSeconds` passed ("Pod was active on the node longer
    /// than the specified deadline").
    DeadlineExceeded,
}

impl EventReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Killing => "Killing",
            Self::FailedPreStopHook => "FailedPreStopHook",
            Self::FailedKillPod => "FailedKillPod",
            Self::ExceededGracePeriod => "ExceededGracePeriod",
            Self::FailedUnMount => "FailedUnMount",
            Self::VolumesStillMounted => "VolumesStillMounted",
            Self::TaintManagerEviction => "TaintManagerEviction",
            Self::NodeAffinityEviction => "NodeAffinityEviction",
            Self::EvictionBlocked => "EvictionBlocked",
            Self::NodeNameMismatch => "NodeNameMismatch",
            Self::Evicted => "Evicted",
            Self::DeadlineExceeded => "DeadlineExceeded",
        }
    }

    pub fn is_warning(self) -> bool {
        !matches!(
            self,
            Self::Killing
                | Self::TaintManagerEviction
                | Self::NodeAffinityEviction
                | Self::DeadlineExceeded
        )
    }
}

/// Why an event about the node itself is recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NodeEventReason {
    /// Warning: the container runtime has answered no relist for a while (recorded once per
    /// stall).
    ContainerRuntimeUnhealthy,
    /// Warning: reaplet in standby took over termination (the kubelet's Lease is stale and its
    /// health endpoint fails; [`crate::standby`]).
    ReapletTookOver,
    /// The kubelet's Lease renews again; reaplet is back in standby (posted as a warning).
    ReapletHandedBack,
    /// Normal: logind announced a node shutdown, or its cancellation (the kubelet's
    /// `Shutdown` event of its node shutdown manager; [`crate::shutdown`]).
    Shutdown,
    /// Warning: a node-pressure threshold is met ("Attempting to reclaim memory"; the kubelet's
    /// eviction manager).
    EvictionThresholdMet,
}

impl NodeEventReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ContainerRuntimeUnhealthy => "ContainerRuntimeUnhealthy",
            Self::ReapletTookOver => "ReapletTookOver",
            Self::ReapletHandedBack => "ReapletHandedBack",
            Self::Shutdown => "Shutdown",
            Self::EvictionThresholdMet => "EvictionThresholdMet",
        }
    }

    pub fn is_warning(self) -> bool {
        !matches!(self, Self::Shutdown)
    }
}

/// One event about this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeEvent {
    pub reason: NodeEventReason,
    pub message: String,
}

/// One event about a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodEvent {
    pub uid: PodUid,
    pub namespace: String,
    pub name: String,
    pub reason: EventReason,
    pub message: String,
    /// The event's annotations (the kubelet's `AnnotatedEventf`: an eviction's offending
    /// containers); empty for most.
    pub annotations: BTreeMap<String, String>,
}

/// Where the pipeline records events. Cheap to clone.
#[derive(Clone, Debug)]
pub struct EventSink {
    tx: Option<mpsc::Sender<PodEvent>>,
    node_tx: Option<mpsc::Sender<NodeEvent>>,
    dropped: Arc<AtomicU64>,
}

impl EventSink {
    /// A sink with room for `capacity` events and its receiving end.
    pub fn channel(capacity: usize) -> (Self, mpsc::Receiver<PodEvent>) {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        (
            Self {
                tx: Some(tx),
                node_tx: None,
                dropped: Arc::default(),
            },
            rx,
        )
    }

    /// This sink, with node events sent (room for `capacity`) to the returned receiver too.
    pub fn with_node_events(mut self, capacity: usize) -> (Self, mpsc::Receiver<NodeEvent>) {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        self.node_tx = Some(tx);
        (self, rx)
    }

    /// A sink that only logs.
    pub fn log_only() -> Self {
        Self {
            tx: None,
            node_tx: None,
            dropped: Arc::default(),
        }
    }

    pub fn record(&self, event: PodEvent) {
        if event.reason.is_warning() {
            tracing::warn!(
                pod = %format_args!("{}/{}", event.namespace, event.name),
                podUID = %event.uid,
                reason = event.reason.as_str(),
                message = %event.message,
                "pod event"
            );
        } else {
            tracing::info!(
                pod = %format_args!("{}/{}", event.namespace, event.name),
                podUID = %event.uid,
                reason = event.reason.as_str(),
                message = %event.message,
                "pod event"
            );
        }
        if let Some(tx) = &self.tx
            && tx.try_send(event).is_err()
        {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Records an event about the node (a warning line, and posted when a node channel is
    /// set). Never blocks.
    pub fn record_node(&self, reason: NodeEventReason, message: &str) {
        if reason.is_warning() {
            tracing::warn!(object = "Node", reason = reason.as_str(), message = %message, "node event");
        } else {
            tracing::info!(object = "Node", reason = reason.as_str(), message = %message, "node event");
        }
        let event = NodeEvent {
            reason,
            message: message.to_string(),
        };
        if let Some(tx) = &self.node_tx
            && tx.try_send(event).is_err()
        {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Events dropped because the channel was full or closed.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}
