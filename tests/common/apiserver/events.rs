//! Events: core/v1 `events` and `events.k8s.io/v1` (the kubelet's recorder writes core/v1).
//!
//! Facts implemented here: (to be completed: section 10).

use super::http::Req;
use super::reply::{Reply, respond};
use super::store::{State, now_rfc3339};
use std::sync::Arc;

pub fn handle(state: &Arc<State>, req: &Req) -> Reply {
    let mut s = state.lock();
    let rv = s.bump();
    let mut ev = req.body.clone();
    ev["metadata"]["namespace"] = req.attrs.namespace.clone().into();
    ev["metadata"]["resourceVersion"] = rv.to_string().into();
    if ev["metadata"]["creationTimestamp"].is_null() {
        ev["metadata"]["creationTimestamp"] = now_rfc3339().into();
    }
    let name = ev["metadata"]["name"].as_str().unwrap_or("").to_owned();
    s.events
        .insert((req.attrs.namespace.clone(), name), ev.clone());
    respond(201, &ev)
}
