//! `apps/v1` ReplicaSets and `scheduling.k8s.io/v1` PriorityClasses, read only (get and list),
//! for the operator commands: drain ranks a ReplicaSet's pods by its Deployment's ReplicaSets,
//! make-room resolves a pod's PriorityClass. The test puts the objects in
//! ([`super::ApiServer::add_replicaset`], [`super::ApiServer::add_priority_class`]); the two
//! classes the real server creates at start are always there (`system-node-critical`,
//! 2000001000, and `system-cluster-critical`, 2000000000).

use super::State;
use super::http::Req;
use super::reply::{Reply, no_route, not_found, respond};
use serde_json::{Value, json};
use std::sync::Arc;

/// The classes kube-apiserver creates at start (`SystemPriorityClasses`).
pub fn system_classes() -> Vec<Value> {
    [
        (
            "system-node-critical",
            2_000_001_000,
            "Used for system critical pods that must not be moved from their current node.",
        ),
        (
            "system-cluster-critical",
            2_000_000_000,
            "Used for system critical pods that must run in the cluster, but can be moved to another node if necessary.",
        ),
    ]
    .into_iter()
    .map(|(name, value, description)| {
        json!({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
            "metadata": {"name": name}, "value": value, "globalDefault": false,
            "preemptionPolicy": "PreemptLowerPriority", "description": description})
    })
    .collect()
}

pub fn handle(state: &Arc<State>, req: &Req) -> Reply {
    let a = &req.attrs;
    let s = state.lock();
    let (group, resource, kind, items): (&str, &str, &str, Vec<Value>) = match a.resource.as_str() {
        "replicasets" => (
            "apps",
            "replicasets",
            "ReplicaSetList",
            s.replicasets
                .iter()
                .filter(|((ns, _), _)| a.namespace.is_empty() || *ns == a.namespace)
                .map(|(_, v)| v.clone())
                .collect(),
        ),
        _ => (
            "scheduling.k8s.io",
            "priorityclasses",
            "PriorityClassList",
            system_classes()
                .into_iter()
                .chain(s.priority_classes.values().cloned())
                .collect(),
        ),
    };
    match a.verb.as_str() {
        "list" => respond(
            200,
            &json!({"kind": kind, "apiVersion": format!("{group}/v1"),
                "metadata": {"resourceVersion": s.rv.to_string()}, "items": items}),
        ),
        "get" => match items
            .into_iter()
            .find(|o| o["metadata"]["name"] == a.name.as_str())
        {
            Some(o) => respond(200, &o),
            None => not_found(group, resource, &a.name),
        },
        _ => no_route(&req.method, &req.path),
    }
}
