//! The node's `Ready` condition during a shutdown: the kubelet's `ReadyCondition` setter
//! (`pkg/kubelet/nodestatus/setters.go`) fed by its shutdown manager's `ShutdownStatus()`:
//! status `False`, reason `KubeletNotReady`, message `node is shutting down`.
//!
//! Invariants:
//! * only this node's `nodes/status` is written (the Node authorizer allows nothing else), with
//!   a strategic merge patch of the one condition (merge key `type`): other conditions,
//!   written by the kubelet or others, are untouched;
//! * `lastTransitionTime` moves only when the status changes;
//! * a cancelled shutdown puts back the condition reaplet replaced, and only while the
//!   condition is still reaplet's (a kubelet that wrote its own since wins).

use crate::api::{self, RequestError};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};
use std::sync::Mutex;

pub const REASON: &str = "KubeletNotReady";
pub const MESSAGE: &str = "node is shutting down";

/// Writes and restores the Ready condition of one node.
pub struct NodeReady {
    api: Api<Node>,
    node: String,
    /// The condition the shutdown replaced (`Null`: the Node had none).
    replaced: Mutex<Option<Value>>,
}

fn ready_of(node: &Node) -> Option<Value> {
    let c = node
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")?;
    serde_json::to_value(c).ok()
}

fn is_ours(c: &Value) -> bool {
    c["status"] == "False" && c["reason"] == REASON && c["message"] == MESSAGE
}

impl NodeReady {
    pub fn new(client: kube::Client, node: &str) -> Self {
        Self {
            api: Api::all(client),
            node: node.into(),
            replaced: Mutex::new(None),
        }
    }

    async fn patch(&self, condition: Value) -> Result<(), RequestError> {
        let patch = json!({"status": {"conditions": [condition]}});
        api::bounded(self.api.patch_status(
            &self.node,
            &PatchParams::default(),
            &Patch::Strategic(&patch),
        ))
        .await
        .map(|_| ())
    }

    /// Ready False: the node is shutting down.
    pub async fn mark_shutting_down(&self) -> Result<(), RequestError> {
        let node = api::bounded(self.api.get(&self.node)).await?;
        let before = ready_of(&node);
        let now = crate::status::now_rfc3339();
        let since = match &before {
            Some(c) if c["status"] == "False" => c["lastTransitionTime"].clone(),
            _ => now.clone().into(),
        };
        if let Some(b) = &before
            && !is_ours(b)
        {
            *self.replaced.lock().unwrap_or_else(|e| e.into_inner()) = Some(b.clone());
        }
        self.patch(json!({
            "type": "Ready", "status": "False", "reason": REASON, "message": MESSAGE,
            "lastHeartbeatTime": now, "lastTransitionTime": since,
        }))
        .await
    }

    /// The shutdown was cancelled: the replaced condition again, if the one there is ours.
    pub async fn restore(&self) -> Result<(), RequestError> {
        let Some(mut old) = self
            .replaced
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        else {
            return Ok(());
        };
        let node = api::bounded(self.api.get(&self.node)).await?;
        if !ready_of(&node).is_some_and(|c| is_ours(&c)) {
            return Ok(());
        }
        let now = crate::status::now_rfc3339();
        old["lastHeartbeatTime"] = now.clone().into();
        old["lastTransitionTime"] = now.into();
        self.patch(old).await
    }
}
