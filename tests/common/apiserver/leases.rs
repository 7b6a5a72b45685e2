//! Node leases (`coordination.k8s.io/v1`, namespace `kube-node-lease`).
//!
//! Facts implemented here: (to be completed: section 8).

use super::http::Req;
use super::reply::{Reply, not_found, respond};
use super::store::{Kind, State};
use serde_json::Value;
use std::sync::Arc;

/// An admin's create or replace, straight into the store.
pub fn create_trusted(state: &Arc<State>, lease: Value) -> Value {
    let mut s = state.lock();
    let key = (
        lease["metadata"]["namespace"].as_str().unwrap_or("").to_owned(),
        lease["metadata"]["name"].as_str().unwrap_or("").to_owned(),
    );
    let before = s.leases.get(&key).cloned();
    s.commit(&state.events_tx, Kind::Lease, before.as_ref(), lease)
}

pub fn handle(state: &Arc<State>, req: &Req) -> Reply {
    let a = &req.attrs;
    match a.verb.as_str() {
        "get" => match state.lock().leases.get(&(a.namespace.clone(), a.name.clone())) {
            Some(l) => respond(200, l),
            None => not_found("coordination.k8s.io", "leases", &a.name),
        },
        _ => super::reply::no_route(&req.method, &req.path),
    }
}
