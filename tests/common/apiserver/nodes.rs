//! Node objects: get and update of `nodes` and `nodes/status`, with NodeRestriction.
//!
//! Facts implemented here: (to be completed: section 9).

use super::http::Req;
use super::patch::{PatchType, apply};
use super::reply::{Reply, not_found, respond};
use super::store::{Kind, State};
use serde_json::Value;
use std::sync::Arc;

/// An admin's create or replace, straight into the store.
pub fn create_trusted(state: &Arc<State>, node: Value) -> Value {
    let mut s = state.lock();
    let name = node["metadata"]["name"].as_str().unwrap_or("").to_owned();
    let before = s.nodes.get(&name).cloned();
    let mut node = node;
    if before.is_none() && node["metadata"]["uid"].as_str().is_none_or(str::is_empty) {
        node["metadata"]["uid"] = s.new_uid().into();
    }
    s.commit(&state.events_tx, Kind::Node, before.as_ref(), node)
}

pub fn handle(state: &Arc<State>, req: &Req) -> Reply {
    let a = &req.attrs;
    match a.verb.as_str() {
        "get" => match state.lock().nodes.get(&a.name) {
            Some(n) => respond(200, n),
            None => not_found("", "nodes", &a.name),
        },
        "create" => {
            let name = req.body["metadata"]["name"].as_str().unwrap_or("").to_owned();
            if state.lock().nodes.contains_key(&name) {
                return super::reply::already_exists("", "nodes", &name);
            }
            respond(201, &create_trusted(state, req.body.clone()))
        }
        "patch" => {
            let mut s = state.lock();
            let Some(before) = s.nodes.get(&a.name).cloned() else {
                return not_found("", "nodes", &a.name);
            };
            let mut n = before.clone();
            let t = PatchType::from_content_type(&req.content_type).unwrap_or(PatchType::Merge);
            if let Err(e) = apply(t, &mut n, &req.body) {
                return super::reply::bad_request(&e);
            }
            let out = s.commit(&state.events_tx, Kind::Node, Some(&before), n);
            respond(200, &out)
        }
        _ => super::reply::no_route(&req.method, &req.path),
    }
}
