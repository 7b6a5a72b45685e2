//! Node objects: create, get, update, patch and delete of `nodes`, get, update and patch of
//! `nodes/status`, with the node strategies (`pkg/registry/core/node`), the
//! `TaintNodesByCondition` admission plugin and NodeRestriction's `admitNode`. LIST and WATCH
//! are [`super::watch`]'s; the Node authorizer's 403s are [`super::authorization`]'s.
//!
//! Facts implemented here (node identity `node-a`, section 9's table row by row):
//! * own `nodes/status` writes (conditions, capacity, allocatable; PUT) `200`, timestamps stored
//!   as sent; a spec change inside a `nodes/status` write is dropped;
//! * writes to another node's Node or status, and creating another Node: 403 `node "node-a" is
//!   not allowed to modify node "node-b"`;
//! * own `spec.unschedulable`, `spec.podCIDR` (`podCIDRs` defaulted), `spec.providerID`,
//!   annotations `200`;
//! * own `spec.taints` changed (also through `/status`) 403 `is not allowed to modify taints`;
//! * own `spec.configSource` 403 `is not allowed to update configSource to a new non-nil
//!   configSource`; own `metadata.ownerReferences` 403 `is not allowed to modify
//!   ownerReferences`;
//! * labels: `kubernetes.io`/`k8s.io` namespaced keys (and subdomains) are restricted except
//!   the kubelet's set and the `kubelet.kubernetes.io`/`node.kubernetes.io` namespaces;
//!   `node-restriction.kubernetes.io` always; adding, changing or removing one is 403 `is not
//!   allowed to modify labels: <sorted keys>` (PATCH, PUT, `/status`), and on create `node
//!   "node-a" is not allowed to set the following labels: ...`;
//! * POST of an existing Node 409 `AlreadyExists` (admission first: 403 with a restricted label);
//! * a created Node gets `node.kubernetes.io/not-ready:NoSchedule` appended to its taints
//!   unless it has that taint (also [`create_trusted`], the sentence after the table);
//! * GET of node-b, LIST, DELETE: the authorizer's 403s;
//! * 4.2, 11.1: PUT without resourceVersion applies (nodes allow unconditional updates); a stale
//!   one, or one a patch carries, is 409; +1 per write, a no-op write keeps it.
//!
//! Inferred from upstream, not measured: a `nodes` write drops status changes (the status
//! strategy's mirror image); `allocatable` defaults to `capacity`; `podCIDR` mirrors
//! `podCIDRs[0]`; an admin's DELETE answers a `Success` Status (nodes do not return the deleted
//! object). Left out: the rest of `ValidateNode`/`ValidateNodeUpdate` (CIDR formats, taint
//! syntax, podCIDR/providerID immutability), preconditions and `dryRun` on nodes.

use super::authorization::User;
use super::http::Req;
use super::patch::{PatchType, apply};
use super::pods::{manager, touch_managed_fields};
use super::reply::{
    Reply, admission_forbidden, already_exists, bad_request, conflict_modified, invalid, not_found,
    respond, success,
};
use super::store::{EventType, Kind, State, now_rfc3339, str_at};
use serde_json::{Map, Value, json};
use std::collections::BTreeSet;
use std::sync::Arc;

const NOT_READY: &str = "node.kubernetes.io/not-ready";

/// The labels a kubelet may set on its own Node (`k8s.io/kubelet/pkg/apis`).
const KUBELET_LABELS: [&str; 11] = [
    "kubernetes.io/hostname",
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
    "beta.kubernetes.io/instance-type",
    "node.kubernetes.io/instance-type",
    "kubernetes.io/os",
    "kubernetes.io/arch",
    "beta.kubernetes.io/os",
    "beta.kubernetes.io/arch",
];

/// An admin's create or replace, straight into the store: a new Node gets a uid and the
/// not-ready taint, a replaced one keeps its uid and creation time.
pub fn create_trusted(state: &Arc<State>, node: Value) -> Value {
    let mut s = state.lock();
    let name = str_at(&node, "/metadata/name").to_owned();
    let before = s.nodes.get(&name).cloned();
    let mut node = node;
    match &before {
        Some(b) => {
            node["metadata"]["uid"] = b["metadata"]["uid"].clone();
            node["metadata"]["creationTimestamp"] = b["metadata"]["creationTimestamp"].clone();
        }
        None => {
            if str_at(&node, "/metadata/uid").is_empty() {
                node["metadata"]["uid"] = s.new_uid().into();
            }
            node["metadata"]["creationTimestamp"] = now_rfc3339().into();
            add_not_ready_taint(&mut node);
        }
    }
    normalize(&mut node);
    s.commit(&state.events_tx, Kind::Node, before.as_ref(), node)
}

pub fn handle(state: &Arc<State>, req: &Req) -> Reply {
    let a = &req.attrs;
    match a.verb.as_str() {
        "get" => match state.lock().nodes.get(&a.name) {
            Some(n) => respond(200, n),
            None => not_found("", "nodes", &a.name),
        },
        "create" if a.subresource.is_empty() => create(state, req),
        "update" | "patch" => update(state, req),
        "delete" if a.subresource.is_empty() => delete(state, req),
        _ => super::reply::no_route(&req.method, &req.path),
    }
}

/// `TaintNodesByCondition`: a created Node is not ready until its controller says otherwise.
fn add_not_ready_taint(node: &mut Value) {
    let mut taints = node["spec"]["taints"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if !taints
        .iter()
        .any(|t| t["key"] == NOT_READY && t["effect"] == "NoSchedule")
    {
        taints.push(json!({"key": NOT_READY, "effect": "NoSchedule"}));
    }
    node["spec"]["taints"] = Value::Array(taints);
}

/// What v1 defaulting and the internal round trip do to a Node: `podCIDRs` from `podCIDR`
/// (and `podCIDR` as `podCIDRs[0]`), `allocatable` from `capacity`, the type meta.
fn normalize(node: &mut Value) {
    node["apiVersion"] = "v1".into();
    node["kind"] = "Node".into();
    let spec = &mut node["spec"];
    if !spec.is_object() {
        *spec = json!({});
    }
    let single = spec["podCIDR"].as_str().unwrap_or("").to_owned();
    let many = spec["podCIDRs"].as_array().cloned().unwrap_or_default();
    if many.is_empty() && !single.is_empty() {
        spec["podCIDRs"] = json!([single]);
    } else if let Some(first) = many.first() {
        spec["podCIDR"] = first.clone();
    }
    let status = &mut node["status"];
    if status["allocatable"].is_null() && !status["capacity"].is_null() {
        status["allocatable"] = status["capacity"].clone();
    }
}

/// A list or map field where absent, `null` and empty are the same (`Semantic.DeepEqual`).
fn semantic(v: &Value) -> Value {
    match v {
        Value::Array(a) if a.is_empty() => Value::Null,
        Value::Object(m) if m.is_empty() => Value::Null,
        other => other.clone(),
    }
}

fn labels(node: &Value) -> Map<String, Value> {
    node["metadata"]["labels"]
        .as_object()
        .cloned()
        .unwrap_or_default()
}

/// A label NodeRestriction keeps a node from adding, changing or removing.
pub fn is_restricted_label(key: &str) -> bool {
    let Some((ns, _)) = key.split_once('/') else {
        return false;
    };
    let within = |domain: &str| ns == domain || ns.ends_with(&format!(".{domain}"));
    if within("node-restriction.kubernetes.io") {
        return true;
    }
    let kubelet_label = KUBELET_LABELS.contains(&key)
        || within("kubelet.kubernetes.io")
        || within("node.kubernetes.io");
    (within("kubernetes.io") || within("k8s.io")) && !kubelet_label
}

/// The restricted label keys that differ between `new` and `old`, sorted.
fn forbidden_labels(new: &Map<String, Value>, old: &Map<String, Value>) -> Vec<String> {
    let keys: BTreeSet<&String> = new.keys().chain(old.keys()).collect();
    keys.into_iter()
        .filter(|k| new.get(*k) != old.get(*k) && is_restricted_label(k))
        .cloned()
        .collect()
}

/// NodeRestriction's `admitNode`; `old` is `None` on create.
fn admit(node: &str, name: &str, new: &Value, old: Option<&Value>) -> Result<(), String> {
    if name != node {
        return Err(format!(
            "node \"{node}\" is not allowed to modify node \"{name}\""
        ));
    }
    let Some(old) = old else {
        if !new["spec"]["configSource"].is_null() {
            return Err(format!(
                "node \"{node}\" is not allowed to create pods with a non-nil configSource"
            ));
        }
        let bad = forbidden_labels(&labels(new), &Map::new());
        if !bad.is_empty() {
            return Err(format!(
                "node \"{node}\" is not allowed to set the following labels: {}",
                bad.join(", ")
            ));
        }
        return Ok(());
    };
    let source = &new["spec"]["configSource"];
    if !source.is_null() && semantic(source) != semantic(&old["spec"]["configSource"]) {
        return Err(format!(
            "node \"{node}\" is not allowed to update configSource to a new non-nil configSource"
        ));
    }
    if semantic(&new["spec"]["taints"]) != semantic(&old["spec"]["taints"]) {
        return Err(format!("node \"{node}\" is not allowed to modify taints"));
    }
    let owners = |n: &Value| semantic(&n["metadata"]["ownerReferences"]);
    if owners(new) != owners(old) {
        return Err(format!(
            "node \"{node}\" is not allowed to modify ownerReferences"
        ));
    }
    let bad = forbidden_labels(&labels(new), &labels(old));
    if !bad.is_empty() {
        return Err(format!(
            "is not allowed to modify labels: {}",
            bad.join(", ")
        ));
    }
    Ok(())
}

fn create(state: &Arc<State>, req: &Req) -> Reply {
    let mut node = req.body.clone();
    if !node.is_object() {
        return bad_request("the body of the request is not a Node");
    }
    let name = str_at(&node, "/metadata/name").to_owned();
    if let User::Node(me) = &req.user
        && let Err(msg) = admit(me, &name, &node, None)
    {
        return admission_forbidden("", "nodes", &name, &msg);
    }
    if name.is_empty() {
        let e = (
            "metadata.name",
            "FieldValueRequired",
            "Required value: name or generateName is required".to_owned(),
        );
        return invalid("Node", "", "", &[e]);
    }
    let mut s = state.lock();
    if s.nodes.contains_key(&name) {
        return already_exists("", "nodes", &name);
    }
    add_not_ready_taint(&mut node);
    normalize(&mut node);
    let m = &mut node["metadata"];
    m["uid"] = s.new_uid().into();
    m["creationTimestamp"] = now_rfc3339().into();
    if let Some(m) = m.as_object_mut() {
        m.remove("resourceVersion");
        m.remove("namespace");
    }
    touch_managed_fields(&mut node, &manager(&req.user_agent), "Update", "");
    respond(201, &s.commit(&state.events_tx, Kind::Node, None, node))
}

fn update(state: &Arc<State>, req: &Req) -> Reply {
    let a = &req.attrs;
    let name = a.name.as_str();
    let status = a.subresource == "status";
    let mut s = state.lock();
    let Some(before) = s.nodes.get(name).cloned() else {
        return not_found("", "nodes", name);
    };
    let put = req.method == "PUT";
    let mut sent = if put {
        if !req.body.is_object() {
            return bad_request("the body of the request is not a Node");
        }
        let body_name = str_at(&req.body, "/metadata/name");
        if body_name != name {
            return bad_request(&format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            ));
        }
        req.body.clone()
    } else {
        let Some(t) = PatchType::from_content_type(&req.content_type) else {
            return super::reply::unsupported_media_type(true);
        };
        let mut n = before.clone();
        if let Err(e) = apply(t, &mut n, &req.body) {
            return bad_request(&e);
        }
        n
    };
    normalize(&mut sent);
    // NodeRestriction sees the object as sent, before the strategy drops anything
    if let User::Node(me) = &req.user
        && let Err(msg) = admit(me, name, &sent, Some(&before))
    {
        return admission_forbidden("", "nodes", name, &msg);
    }
    let sent_rv = if put {
        str_at(&sent, "/metadata/resourceVersion").to_owned()
    } else {
        str_at(&req.body, "/metadata/resourceVersion").to_owned()
    };
    if !sent_rv.is_empty() && sent_rv != str_at(&before, "/metadata/resourceVersion") {
        return conflict_modified("", "nodes", name);
    }
    let uid = str_at(&before, "/metadata/uid");
    let sent_uid = str_at(&sent, "/metadata/uid").to_owned();
    if !sent_uid.is_empty() && sent_uid != uid {
        let e = (
            "metadata.uid",
            "FieldValueInvalid",
            format!("Invalid value: \"{sent_uid}\": field is immutable"),
        );
        return invalid("Node", "", name, &[e]);
    }
    // the strategies: a status write keeps the spec, a `nodes` write keeps the status
    let mut next = sent;
    let kept = if status { "spec" } else { "status" };
    next[kept] = before[kept].clone();
    for k in ["uid", "creationTimestamp", "managedFields"] {
        next["metadata"][k] = before["metadata"][k].clone();
    }
    if let Some(m) = next["metadata"].as_object_mut() {
        m.retain(|_, v| !v.is_null());
    }
    let op = if req.content_type.starts_with("application/apply-patch") {
        "Apply"
    } else {
        "Update"
    };
    let sub = if status { "status" } else { "" };
    touch_managed_fields(&mut next, &manager(&req.user_agent), op, sub);
    respond(
        200,
        &s.commit(&state.events_tx, Kind::Node, Some(&before), next),
    )
}

fn delete(state: &Arc<State>, req: &Req) -> Reply {
    let name = req.attrs.name.as_str();
    let mut s = state.lock();
    let Some(mut node) = s.nodes.remove(name) else {
        return not_found("", "nodes", name);
    };
    let rv = s.bump();
    node["metadata"]["resourceVersion"] = rv.to_string().into();
    let uid = str_at(&node, "/metadata/uid").to_owned();
    s.emit(&state.events_tx, Kind::Node, EventType::Deleted, node);
    success(
        200,
        Some(json!({"name": name, "kind": "nodes", "uid": uid})),
    )
}
