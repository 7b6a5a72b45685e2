//! Node leases (`coordination.k8s.io/v1`, namespace `kube-node-lease`): create, get, update,
//! patch and delete, with NodeRestriction's `admitLease` (the Node authorizer's part is in
//! [`super::authorization`]).
//!
//! Facts implemented here:
//! * 8.1: no lease exists until one is created: 404 `leases.coordination.k8s.io "node-a" not
//!   found` (the `kube-node-lease` namespace exists on a fresh server, [`super::store`]);
//! * 8.2: a node creates its own lease (an owner reference or not) `201`; GET, PUT with the
//!   current resourceVersion, merge PATCH `200`; DELETE `200` with a `Success` Status carrying
//!   `details.uid`, not the object;
//! * 8.3: PUT with a stale resourceVersion 409 "the object has been modified"; PUT without one
//!   422 `metadata.resourceVersion: Invalid value: 0: must be specified for an update` (leases do
//!   not allow unconditional updates);
//! * 8.4: creating another node's lease 403 `can only access node lease with the same name as
//!   the requesting node` (admission; GET/PUT of it are the authorizer's 403);
//! * 8.5: LIST, WATCH and other namespaces are the authorizer's 403s;
//! * 11.1: resourceVersion +1 per write, a no-op write keeps it ([`super::store::Store::commit`]).
//!
//! Left out: lease spec validation (`leaseDurationSeconds > 0`, ...), delete preconditions and
//! `dryRun` (not measured, nothing sends them). An admin's LIST/WATCH of leases needs routing to
//! [`super::watch`] in `http.rs` (this handler is synchronous; it answers 404 for them).

use super::authorization::User;
use super::http::Req;
use super::patch::{PatchType, apply};
use super::pods::{manager, touch_managed_fields};
use super::reply::{
    Reply, admission_forbidden, already_exists, bad_request, conflict_modified, invalid, not_found,
    respond, success,
};
use super::store::{EventType, Kind, State, now_rfc3339, str_at};
use serde_json::{Value, json};
use std::sync::Arc;

const GROUP: &str = "coordination.k8s.io";
const RESOURCE: &str = "leases";

/// An admin's create or replace, straight into the store.
pub fn create_trusted(state: &Arc<State>, lease: Value) -> Value {
    let mut s = state.lock();
    let key = (
        str_at(&lease, "/metadata/namespace").to_owned(),
        str_at(&lease, "/metadata/name").to_owned(),
    );
    let before = s.leases.get(&key).cloned();
    let mut lease = lease;
    lease["apiVersion"] = "coordination.k8s.io/v1".into();
    lease["kind"] = "Lease".into();
    match &before {
        Some(b) => {
            lease["metadata"]["uid"] = b["metadata"]["uid"].clone();
            lease["metadata"]["creationTimestamp"] = b["metadata"]["creationTimestamp"].clone();
        }
        None => {
            if str_at(&lease, "/metadata/uid").is_empty() {
                lease["metadata"]["uid"] = s.new_uid().into();
            }
            lease["metadata"]["creationTimestamp"] = now_rfc3339().into();
        }
    }
    s.commit(&state.events_tx, Kind::Lease, before.as_ref(), lease)
}

pub fn handle(state: &Arc<State>, req: &Req) -> Reply {
    let a = &req.attrs;
    match a.verb.as_str() {
        "get" => match state
            .lock()
            .leases
            .get(&(a.namespace.clone(), a.name.clone()))
        {
            Some(l) => respond(200, l),
            None => not_found(GROUP, RESOURCE, &a.name),
        },
        "create" => create(state, req),
        "update" | "patch" => update(state, req),
        "delete" => delete(state, req),
        _ => super::reply::no_route(&req.method, &req.path),
    }
}

/// NodeRestriction's `admitLease`: the message of its 403 (the namespace rule is also the
/// authorizer's, which answers first).
fn admit(user: &User, namespace: &str, name: &str) -> Result<(), &'static str> {
    let Some(node) = user.node() else {
        return Ok(());
    };
    if namespace != "kube-node-lease" {
        return Err("can only access leases in the \"kube-node-lease\" system namespace");
    }
    if name != node {
        return Err("can only access node lease with the same name as the requesting node");
    }
    Ok(())
}

fn create(state: &Arc<State>, req: &Req) -> Reply {
    let ns = req.attrs.namespace.clone();
    let mut lease = req.body.clone();
    if !lease.is_object() {
        return bad_request("the body of the request is not a Lease");
    }
    let name = str_at(&lease, "/metadata/name").to_owned();
    let body_ns = str_at(&lease, "/metadata/namespace");
    if !body_ns.is_empty() && body_ns != ns {
        return bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        );
    }
    let mut s = state.lock();
    // NamespaceLifecycle runs before NodeRestriction
    if !s.has_namespace(&ns) {
        return not_found("", "namespaces", &ns);
    }
    if let Err(msg) = admit(&req.user, &ns, &name) {
        return admission_forbidden(GROUP, RESOURCE, &name, msg);
    }
    if name.is_empty() {
        let e = (
            "metadata.name",
            "FieldValueRequired",
            "Required value: name or generateName is required".to_owned(),
        );
        return invalid("Lease", GROUP, "", &[e]);
    }
    if s.leases.contains_key(&(ns.clone(), name.clone())) {
        return already_exists(GROUP, RESOURCE, &name);
    }
    lease["apiVersion"] = "coordination.k8s.io/v1".into();
    lease["kind"] = "Lease".into();
    let m = &mut lease["metadata"];
    m["namespace"] = ns.into();
    m["uid"] = s.new_uid().into();
    m["creationTimestamp"] = now_rfc3339().into();
    if let Some(m) = m.as_object_mut() {
        m.remove("resourceVersion");
        m.remove("generation");
        m.remove("deletionTimestamp");
        m.remove("deletionGracePeriodSeconds");
    }
    touch_managed_fields(&mut lease, &manager(&req.user_agent), "Update", "");
    respond(201, &s.commit(&state.events_tx, Kind::Lease, None, lease))
}

fn update(state: &Arc<State>, req: &Req) -> Reply {
    let a = &req.attrs;
    let name = a.name.as_str();
    let mut s = state.lock();
    let Some(before) = s
        .leases
        .get(&(a.namespace.clone(), a.name.clone()))
        .cloned()
    else {
        return not_found(GROUP, RESOURCE, name);
    };
    let put = req.method == "PUT";
    let mut next = if put {
        if !req.body.is_object() {
            return bad_request("the body of the request is not a Lease");
        }
        let sent = str_at(&req.body, "/metadata/name");
        if sent != name {
            return bad_request(&format!(
                "the name of the object ({sent}) does not match the name on the URL ({name})"
            ));
        }
        req.body.clone()
    } else {
        let Some(t) = PatchType::from_content_type(&req.content_type) else {
            return super::reply::unsupported_media_type(true);
        };
        let mut l = before.clone();
        if let Err(e) = apply(t, &mut l, &req.body) {
            return bad_request(&e);
        }
        l
    };
    if let Err(msg) = admit(&req.user, &a.namespace, name) {
        return admission_forbidden(GROUP, RESOURCE, name, msg);
    }
    // the resourceVersion a PUT carries, or one a patch sets
    let sent_rv = if put {
        str_at(&next, "/metadata/resourceVersion").to_owned()
    } else {
        str_at(&req.body, "/metadata/resourceVersion").to_owned()
    };
    if put && sent_rv.is_empty() {
        let e = (
            "metadata.resourceVersion",
            "FieldValueInvalid",
            "Invalid value: 0: must be specified for an update".to_owned(),
        );
        return invalid(RESOURCE, GROUP, name, &[e]);
    }
    if !sent_rv.is_empty() && sent_rv != str_at(&before, "/metadata/resourceVersion") {
        return conflict_modified(GROUP, RESOURCE, name);
    }
    let uid = str_at(&before, "/metadata/uid").to_owned();
    let sent_uid = str_at(&next, "/metadata/uid").to_owned();
    if !sent_uid.is_empty() && sent_uid != uid {
        let e = (
            "metadata.uid",
            "FieldValueInvalid",
            format!("Invalid value: \"{sent_uid}\": field is immutable"),
        );
        return invalid("Lease", GROUP, name, &[e]);
    }
    next["apiVersion"] = "coordination.k8s.io/v1".into();
    next["kind"] = "Lease".into();
    for k in ["uid", "namespace", "creationTimestamp", "managedFields"] {
        next["metadata"][k] = before["metadata"][k].clone();
    }
    let op = if req.content_type.starts_with("application/apply-patch") {
        "Apply"
    } else {
        "Update"
    };
    touch_managed_fields(&mut next, &manager(&req.user_agent), op, "");
    respond(
        200,
        &s.commit(&state.events_tx, Kind::Lease, Some(&before), next),
    )
}

fn delete(state: &Arc<State>, req: &Req) -> Reply {
    let a = &req.attrs;
    let mut s = state.lock();
    let key = (a.namespace.clone(), a.name.clone());
    let Some(mut lease) = s.leases.get(&key).cloned() else {
        return not_found(GROUP, RESOURCE, &a.name);
    };
    if let Err(msg) = admit(&req.user, &a.namespace, &a.name) {
        return admission_forbidden(GROUP, RESOURCE, &a.name, msg);
    }
    s.leases.remove(&key);
    let rv = s.bump();
    lease["metadata"]["resourceVersion"] = rv.to_string().into();
    let uid = str_at(&lease, "/metadata/uid").to_owned();
    s.emit(&state.events_tx, Kind::Lease, EventType::Deleted, lease);
    success(
        200,
        Some(json!({"name": a.name, "group": GROUP, "kind": RESOURCE, "uid": uid})),
    )
}
