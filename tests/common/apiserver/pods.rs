//! Pods: create (with the API's defaults and NodeRestriction's mirror-pod rules), get,
//! graceful DELETE (`pkg/registry/core/pod` strategy and `rest.BeforeDelete`), and an admin's
//! updates of the pod object (spec immutability, finalizers).
//!
//! Facts implemented here:
//! * 1.1–1.8: graceful delete: the Pod object back (not a Status); `dt` = now + grace in whole
//!   seconds; a shorter grace moves `dt` to the first delete's start + the new grace; a longer
//!   or equal one changes nothing (same rv, no event); grace 0 puts `dt` at the time of that
//!   request; the server never removes a pod when `dt` passes; -1 means 1; immediate deletion
//!   for unbound, `Succeeded`/`Failed` and `terminationGracePeriodSeconds: 0` pods;
//! * 2.1–2.7: grace 0 is `MODIFIED` (dt, dgps 0) then `DELETED`; UID and resourceVersion
//!   preconditions answer 409 with the Kind in message and details; finalizers hold a pod
//!   (dgps 0, later DELETEs change nothing) until removed, and removing the last one of a pod
//!   with dgps 0 deletes it at once (the response keeps the old rv); `Foreground` and
//!   `Orphan` propagation add their finalizers; `dryRun=All` stores nothing;
//! * 3.1, 3.4, 5.1: a node may delete only pods bound to it (403), a missing pod is 404;
//! * 5.2–5.5, 5.8: a node creates only mirror pods, bound to itself, with a controller owner
//!   reference to its Node (uid checked), referencing no service account or secret; missing
//!   namespace 404, duplicate 409; a server-assigned uid; status sent in a create is ignored;
//! * 11.2–11.5, 11.7: generation (1 on create, +1 per spec change and when a graceful delete
//!   sets `dt`); which spec fields an update may change (422 otherwise); the defaults a
//!   created pod gets (including the two `NoExecute` tolerations of 300 s); the Node's
//!   topology labels copied at creation; `managedFields` per manager.

use super::authorization::User;
use super::http::Req;
use super::patch::{PatchType, apply};
use super::reply::{
    Reply, admission_forbidden, already_exists, conflict_modified, conflict_precondition,
    invalid, not_found, respond,
};
use super::store::{EventType, Kind, State, Store, now_rfc3339, parse_time, rfc3339, str_at};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Instant;

pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";
const TOPOLOGY_LABELS: [&str; 2] = ["topology.kubernetes.io/zone", "topology.kubernetes.io/region"];

pub fn handle(state: &Arc<State>, req: &Req) -> Reply {
    let a = &req.attrs;
    match a.verb.as_str() {
        "get" => match state.lock().pods.get(&(a.namespace.clone(), a.name.clone())) {
            Some(p) => respond(200, p),
            None => not_found("", "pods", &a.name),
        },
        "create" => create(state, req),
        "delete" => {
            let mut opts = if req.body.is_object() {
                req.body.clone()
            } else {
                json!({})
            };
            if let Some(g) = req.q("gracePeriodSeconds").and_then(|g| g.parse::<i64>().ok()) {
                opts["gracePeriodSeconds"] = g.into();
            }
            if let Some(p) = req.q("propagationPolicy") {
                opts["propagationPolicy"] = p.into();
            }
            let dry_run = req.dry_run()
                || opts["dryRun"]
                    .as_array()
                    .is_some_and(|d| d.iter().any(|v| v == "All"));
            let (code, v) = delete(state, &req.user, &a.namespace, &a.name, &opts, dry_run);
            respond(code, &v)
        }
        "update" | "patch" => update(state, req),
        _ => super::reply::no_route(&req.method, &req.path),
    }
}

/// The manager name the server derives from a User-Agent (fact 11.7).
pub fn manager(user_agent: &str) -> String {
    let m = user_agent.split('/').next().unwrap_or("").trim();
    if m.is_empty() { "unknown".into() } else { m.into() }
}

/// Records `manager`'s write in `metadata.managedFields` (one entry per manager, operation and
/// subresource).
pub fn touch_managed_fields(obj: &mut Value, manager: &str, operation: &str, subresource: &str) {
    let api_version = obj["apiVersion"].as_str().unwrap_or("v1").to_owned();
    let mut entry = json!({
        "manager": manager, "operation": operation, "apiVersion": api_version,
        "time": now_rfc3339(), "fieldsType": "FieldsV1", "fieldsV1": {},
    });
    if !subresource.is_empty() {
        entry["subresource"] = subresource.into();
    }
    let list = obj["metadata"]["managedFields"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut list: Vec<Value> = list
        .into_iter()
        .filter(|e| {
            !(e["manager"] == manager
                && e["operation"] == operation
                && str_at(e, "/subresource") == subresource)
        })
        .collect();
    list.push(entry);
    obj["metadata"]["managedFields"] = Value::Array(list);
}

fn qos_class(pod: &Value) -> &'static str {
    let containers = pod["spec"]["containers"].as_array().cloned().unwrap_or_default();
    let res = |c: &Value, k: &str| c["resources"][k].as_object().cloned().unwrap_or_default();
    let any = containers
        .iter()
        .any(|c| !res(c, "requests").is_empty() || !res(c, "limits").is_empty());
    if !any {
        return "BestEffort";
    }
    let guaranteed = containers.iter().all(|c| {
        let limits = res(c, "limits");
        let requests = res(c, "requests");
        ["cpu", "memory"].iter().all(|r| {
            limits.get(*r).is_some() && requests.get(*r).is_none_or(|q| Some(q) == limits.get(*r))
        })
    });
    if guaranteed { "Guaranteed" } else { "Burstable" }
}

/// The defaults and admission plugins a created pod goes through (fact 11.4, 11.5).
fn apply_defaults(s: &Store, pod: &mut Value) {
    let spec = &mut pod["spec"];
    let defaults = [
        ("restartPolicy", json!("Always")),
        ("dnsPolicy", json!("ClusterFirst")),
        ("schedulerName", json!("default-scheduler")),
        ("enableServiceLinks", json!(true)),
        ("priority", json!(0)),
        ("preemptionPolicy", json!("PreemptLowerPriority")),
        ("securityContext", json!({})),
        ("terminationGracePeriodSeconds", json!(30)),
    ];
    for (k, v) in defaults {
        if spec[k].is_null() {
            spec[k] = v;
        }
    }
    for list in ["initContainers", "containers"] {
        if let Some(cs) = spec[list].as_array_mut() {
            for c in cs {
                if c["imagePullPolicy"].is_null() {
                    let image = c["image"].as_str().unwrap_or("");
                    let tag = image.rsplit('/').next().unwrap_or("");
                    let pinned = image.contains('@')
                        || tag.split_once(':').is_some_and(|(_, t)| t != "latest");
                    c["imagePullPolicy"] = if pinned { "IfNotPresent" } else { "Always" }.into();
                }
                if c["terminationMessagePath"].is_null() {
                    c["terminationMessagePath"] = "/dev/termination-log".into();
                }
                if c["terminationMessagePolicy"].is_null() {
                    c["terminationMessagePolicy"] = "File".into();
                }
            }
        }
    }
    // DefaultTolerationSeconds: a NoExecute toleration of 300 s for each, unless one is there
    let mut tolerations = spec["tolerations"].as_array().cloned().unwrap_or_default();
    for key in ["node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"] {
        let tolerated = tolerations.iter().any(|t| {
            let key_ok = t["key"] == key || (t["key"].is_null() && t["operator"] == "Exists");
            let effect_ok = t["effect"].is_null() || t["effect"] == "" || t["effect"] == "NoExecute";
            key_ok && effect_ok
        });
        if !tolerated {
            tolerations.push(json!({"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}));
        }
    }
    spec["tolerations"] = Value::Array(tolerations);
    // PodTopologyLabels: a bound pod gets its Node's zone and region, overwriting its own
    let node = str_at(pod, "/spec/nodeName").to_owned();
    if let Some(n) = s.nodes.get(&node) {
        for l in TOPOLOGY_LABELS {
            if let Some(v) = n["metadata"]["labels"][l].as_str() {
                pod["metadata"]["labels"][l] = v.into();
            }
        }
    }
    if pod["status"]["phase"].is_null() {
        pod["status"]["phase"] = "Pending".into();
    }
    if pod["status"]["qosClass"].is_null() {
        let q = qos_class(pod);
        pod["status"]["qosClass"] = q.into();
    }
}

fn insert_new(state: &State, s: &mut Store, mut pod: Value) -> Value {
    pod["apiVersion"] = "v1".into();
    pod["kind"] = "Pod".into();
    pod["metadata"]["generation"] = 1.into();
    pod["metadata"]["creationTimestamp"] = now_rfc3339().into();
    apply_defaults(s, &mut pod);
    s.commit(&state.events_tx, Kind::Pod, None, pod)
}

/// A test's create as an admin (see [`super::ApiServer::create_pod`]): the uid and status
/// given are kept.
pub fn create_trusted(state: &Arc<State>, mut pod: Value) -> Result<Value, Reply> {
    let mut s = state.lock();
    if pod["metadata"]["namespace"].as_str().is_none_or(str::is_empty) {
        pod["metadata"]["namespace"] = "default".into();
    }
    let ns = str_at(&pod, "/metadata/namespace").to_owned();
    let name = str_at(&pod, "/metadata/name").to_owned();
    if s.pods.contains_key(&(ns, name.clone())) {
        return Err(already_exists("", "pods", &name));
    }
    if pod["metadata"]["uid"].as_str().is_none_or(str::is_empty) {
        pod["metadata"]["uid"] = s.new_uid().into();
    }
    Ok(insert_new(state, &mut s, pod))
}

/// NodeRestriction's `admitPodCreate`.
fn admit_node_create(s: &Store, node: &str, pod: &Value) -> Result<(), String> {
    if pod["metadata"]["annotations"][MIRROR_ANNOTATION].is_null() {
        return Err(format!(
            "pod does not have \"{MIRROR_ANNOTATION}\" annotation, node \"{node}\" can only create mirror pods"
        ));
    }
    if str_at(pod, "/spec/nodeName") != node {
        return Err(format!(
            "node \"{node}\" can only create pods with spec.nodeName set to itself"
        ));
    }
    let owners = pod["metadata"]["ownerReferences"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if owners.len() > 1 {
        return Err(format!(
            "node \"{node}\" can only create pods with a single owner reference set to itself"
        ));
    }
    let Some(owner) = owners.first() else {
        return Err(format!(
            "node \"{node}\" can only create pods with an owner reference set to itself"
        ));
    };
    if owner["apiVersion"] != "v1" || owner["kind"] != "Node" || owner["name"] != node {
        return Err(format!(
            "node \"{node}\" can only create pods with an owner reference set to itself"
        ));
    }
    if owner["controller"] != true {
        return Err(format!(
            "node \"{node}\" can only create pods with a controller owner reference set to itself"
        ));
    }
    if owner["blockOwnerDeletion"] == true {
        return Err(format!(
            "node \"{node}\" must not set blockOwnerDeletion on an owner reference"
        ));
    }
    let node_uid = s
        .nodes
        .get(node)
        .map(|n| str_at(n, "/metadata/uid").to_owned())
        .unwrap_or_default();
    let sent = str_at(owner, "/uid");
    if sent != node_uid {
        return Err(format!(
            "node {node} UID mismatch: expected {sent} got {node_uid}"
        ));
    }
    let spec = &pod["spec"];
    if spec["serviceAccountName"].as_str().is_some_and(|s| !s.is_empty()) {
        return Err(format!(
            "node \"{node}\" can not create pods that reference serviceaccounts"
        ));
    }
    let volumes = spec["volumes"].as_array().cloned().unwrap_or_default();
    let containers: Vec<Value> = ["initContainers", "containers", "ephemeralContainers"]
        .iter()
        .flat_map(|l| spec[*l].as_array().cloned().unwrap_or_default())
        .collect();
    let env_refs = |kind: &str| {
        containers.iter().any(|c| {
            c["env"].as_array().is_some_and(|env| {
                env.iter()
                    .any(|e| !e["valueFrom"][format!("{kind}KeyRef")].is_null())
            }) || c["envFrom"]
                .as_array()
                .is_some_and(|ef| ef.iter().any(|e| !e[format!("{kind}Ref")].is_null()))
        })
    };
    let projected = |kind: &str| {
        volumes.iter().any(|v| {
            v["projected"]["sources"]
                .as_array()
                .is_some_and(|s| s.iter().any(|src| !src[kind].is_null()))
        })
    };
    let secrets = volumes.iter().any(|v| !v["secret"].is_null())
        || projected("secret")
        || env_refs("secret")
        || spec["imagePullSecrets"].as_array().is_some_and(|s| !s.is_empty());
    if secrets {
        return Err(format!(
            "node \"{node}\" can not create pods that reference secrets"
        ));
    }
    if volumes.iter().any(|v| !v["configMap"].is_null()) || projected("configMap") || env_refs("configMap") {
        return Err(format!(
            "node \"{node}\" can not create pods that reference configmaps"
        ));
    }
    if volumes.iter().any(|v| !v["persistentVolumeClaim"].is_null() || !v["ephemeral"].is_null()) {
        return Err(format!(
            "node \"{node}\" can not create pods that reference persistentvolumeclaims"
        ));
    }
    Ok(())
}

fn create(state: &Arc<State>, req: &Req) -> Reply {
    let ns = req.attrs.namespace.clone();
    let mut pod = req.body.clone();
    let name = str_at(&pod, "/metadata/name").to_owned();
    let mut s = state.lock();
    // NamespaceLifecycle runs before NodeRestriction
    if !s.has_namespace(&ns) {
        return not_found("", "namespaces", &ns);
    }
    if let User::Node(node) = &req.user
        && let Err(msg) = admit_node_create(&s, node, &pod)
    {
        return admission_forbidden("", "pods", &name, &msg);
    }
    if s.pods.contains_key(&(ns.clone(), name.clone())) {
        return already_exists("", "pods", &name);
    }
    pod["metadata"]["namespace"] = ns.into();
    pod["metadata"]["uid"] = s.new_uid().into();
    // the status of a create is the server's (fact 5.8)
    pod["status"] = json!({});
    touch_managed_fields(&mut pod, &manager(&req.user_agent), "Update", "");
    if req.dry_run() {
        let mut p = pod;
        apply_defaults(&s, &mut p);
        return respond(201, &p);
    }
    let out = insert_new(state, &mut s, pod);
    respond(201, &out)
}

fn finalizers(pod: &Value) -> Vec<String> {
    pod["metadata"]["finalizers"]
        .as_array()
        .map(|f| {
            f.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Removes a pod from the store with a `DELETED` event at a new resourceVersion; returns the
/// object as last seen.
pub fn remove(state: &State, s: &mut Store, mut pod: Value) -> Value {
    let key = (
        str_at(&pod, "/metadata/namespace").to_owned(),
        str_at(&pod, "/metadata/name").to_owned(),
    );
    s.pods.remove(&key);
    let rv = s.bump();
    pod["metadata"]["resourceVersion"] = rv.to_string().into();
    s.removed
        .insert(str_at(&pod, "/metadata/uid").to_owned(), Instant::now());
    s.emit(&state.events_tx, Kind::Pod, EventType::Deleted, pod.clone());
    pod
}

/// A DELETE of a pod as `user` (NodeRestriction applies to nodes), with `DeleteOptions` `opts`.
pub fn delete(
    state: &Arc<State>,
    user: &User,
    ns: &str,
    name: &str,
    opts: &Value,
    dry_run: bool,
) -> (u16, Value) {
    let pod = state.lock().pods.get(&(ns.to_owned(), name.to_owned())).cloned();
    if let (User::Node(node), Some(p)) = (user, &pod)
        && str_at(p, "/spec/nodeName") != node
    {
        return reply_parts(admission_forbidden(
            "",
            "pods",
            name,
            &format!("node \"{node}\" can only delete pods with spec.nodeName set to itself"),
        ));
    }
    delete_admitted(state, ns, name, opts, dry_run)
}

/// The status code and body of a JSON reply built by [`super::reply`].
fn reply_parts(r: Reply) -> (u16, Value) {
    let code = r.status().as_u16();
    let body = futures_util::FutureExt::now_or_never(http_body_util::BodyExt::collect(r.into_body()))
        .and_then(Result::ok)
        .map(|b| b.to_bytes())
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(Value::Null);
    (code, body)
}

/// The storage side of a pod DELETE (after admission): preconditions, graceful deletion,
/// finalizers.
pub fn delete_admitted(
    state: &Arc<State>,
    ns: &str,
    name: &str,
    opts: &Value,
    dry_run: bool,
) -> (u16, Value) {
    let mut s = state.lock();
    let key = (ns.to_owned(), name.to_owned());
    let Some(pod) = s.pods.get(&key).cloned() else {
        return reply_parts(not_found("", "pods", name));
    };
    let uid = str_at(&pod, "/metadata/uid").to_owned();
    if let Some(want) = opts["preconditions"]["uid"].as_str()
        && want != uid
    {
        return reply_parts(conflict_precondition("Pod", name, "UID", want, &uid));
    }
    let rv = str_at(&pod, "/metadata/resourceVersion").to_owned();
    if let Some(want) = opts["preconditions"]["resourceVersion"].as_str()
        && want != rv
    {
        return reply_parts(conflict_precondition("Pod", name, "ResourceVersion", want, &rv));
    }
    // CheckGracefulDelete
    let mut grace = opts["gracePeriodSeconds"]
        .as_i64()
        .or_else(|| pod["spec"]["terminationGracePeriodSeconds"].as_i64())
        .unwrap_or(0);
    let phase = str_at(&pod, "/status/phase");
    if str_at(&pod, "/spec/nodeName").is_empty() || matches!(phase, "Failed" | "Succeeded") {
        grace = 0;
    }
    if grace < 0 {
        grace = 1;
    }
    let now = jiff::Timestamp::now().as_second();
    let mut next = pod.clone();
    let current_dgps = pod["metadata"]["deletionGracePeriodSeconds"].as_i64();
    let current_dt = pod["metadata"]["deletionTimestamp"]
        .as_str()
        .and_then(parse_time);
    // BeforeDelete
    match (current_dt, current_dgps) {
        (Some(_), None | Some(0)) => {} // already due: only finalizers hold it
        (Some(dt), Some(existing)) => {
            if grace < existing {
                let new_dt = if grace == 0 { now } else { dt - existing + grace };
                next["metadata"]["deletionTimestamp"] = rfc3339(new_dt).into();
                next["metadata"]["deletionGracePeriodSeconds"] = grace.into();
            }
        }
        (None, _) => {
            next["metadata"]["deletionTimestamp"] = rfc3339(now + grace).into();
            next["metadata"]["deletionGracePeriodSeconds"] = grace.into();
            if let Some(g) = next["metadata"]["generation"].as_i64().filter(|g| *g > 0) {
                next["metadata"]["generation"] = (g + 1).into();
            }
        }
    }
    // garbage-collection finalizers of the propagation policy
    let policy = opts["propagationPolicy"].as_str().unwrap_or("");
    let gc_finalizer = match policy {
        "Foreground" => Some("foregroundDeletion"),
        "Orphan" => Some("orphan"),
        _ if opts["orphanDependents"] == true => Some("orphan"),
        _ => None,
    };
    let mut fins = finalizers(&next);
    if let Some(f) = gc_finalizer
        && !fins.iter().any(|x| x == f)
    {
        fins.push(f.to_owned());
        next["metadata"]["finalizers"] = json!(fins);
    }
    let due = next["metadata"]["deletionGracePeriodSeconds"].as_i64() == Some(0);
    if dry_run {
        return (200, next);
    }
    let stored = s.commit(&state.events_tx, Kind::Pod, Some(&pod), next);
    if due && fins.is_empty() {
        return (200, remove(state, &mut s, stored));
    }
    (200, stored)
}

/// The spec fields an update may change, as the 422 lists them (fact 11.3).
const MUTABLE_SPEC: &str = "`spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)";

/// The spec with the fields an update may change blanked out.
fn frozen_spec(spec: &Value) -> Value {
    let mut s = spec.clone();
    for list in ["containers", "initContainers"] {
        if let Some(cs) = s[list].as_array_mut() {
            for c in cs {
                c["image"] = Value::Null;
            }
        }
    }
    if let Some(m) = s.as_object_mut() {
        m.remove("activeDeadlineSeconds");
        m.remove("tolerations");
        m.remove("terminationGracePeriodSeconds");
    }
    s
}

/// An admin's PUT or PATCH of a pod object (nodes are refused by the authorizer, fact 5.6).
fn update(state: &Arc<State>, req: &Req) -> Reply {
    let a = &req.attrs;
    let mut s = state.lock();
    let key = (a.namespace.clone(), a.name.clone());
    let Some(before) = s.pods.get(&key).cloned() else {
        return not_found("", "pods", &a.name);
    };
    let mut next = before.clone();
    if req.method == "PUT" {
        next = req.body.clone();
        let sent_rv = str_at(&next, "/metadata/resourceVersion");
        if !sent_rv.is_empty() && sent_rv != str_at(&before, "/metadata/resourceVersion") {
            return conflict_modified("", "pods", &a.name);
        }
    } else {
        let t = PatchType::from_content_type(&req.content_type).unwrap_or(PatchType::Merge);
        if let Err(e) = apply(t, &mut next, &req.body) {
            return super::reply::bad_request(&e);
        }
        let sent_rv = req.body["metadata"]["resourceVersion"].as_str();
        if sent_rv.is_some_and(|r| r != str_at(&before, "/metadata/resourceVersion")) {
            return conflict_modified("", "pods", &a.name);
        }
    }
    // what an update never changes here
    next["status"] = before["status"].clone();
    for k in ["uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "namespace", "name", "generation"] {
        next["metadata"][k] = before["metadata"][k].clone();
    }
    if let Some(m) = next["metadata"].as_object_mut() {
        m.retain(|_, v| !v.is_null());
    }
    let old_spec = &before["spec"];
    let new_spec = &next["spec"];
    if frozen_spec(old_spec) != frozen_spec(new_spec) {
        let detail = format!(
            "pod updates may not change fields other than {MUTABLE_SPEC}\n  core.PodSpec{{\n-\t{}\n+\t{}\n  }}\n",
            old_spec, new_spec
        );
        return invalid("Pod", "", &a.name, &[("spec", "FieldValueForbidden", format!("Forbidden: {detail}"))]);
    }
    if old_spec != new_spec
        && let Some(g) = before["metadata"]["generation"].as_i64()
    {
        next["metadata"]["generation"] = (g + 1).into();
    }
    touch_managed_fields(&mut next, &manager(&req.user_agent), "Update", "");
    let due = next["metadata"]["deletionGracePeriodSeconds"].as_i64() == Some(0)
        && !next["metadata"]["deletionTimestamp"].is_null();
    if due && finalizers(&next).is_empty() {
        // the last finalizer of a due pod went: deleted instead of updated (no MODIFIED); the
        // answer shows the update with the old resourceVersion (fact 2.5)
        remove(state, &mut s, next.clone());
        return respond(200, &next);
    }
    let stored = s.commit(&state.events_tx, Kind::Pod, Some(&before), next);
    respond(200, &stored)
}
