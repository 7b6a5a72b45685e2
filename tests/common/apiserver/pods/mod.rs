//! Pods: create (with the API's defaults and NodeRestriction's mirror-pod rules), get,
//! graceful DELETE (`pkg/registry/core/pod` strategy, `rest.BeforeDelete` and the generic
//! store's finalizer handling), and an admin's updates of the pod object (spec immutability,
//! finalizers).
//!
//! Facts implemented here:
//! * 1.1–1.8: graceful delete: the Pod object back (not a Status); `dt` = now + grace in whole
//!   seconds; a shorter grace moves `dt` to the first delete's start + the new grace; a longer
//!   or equal one, or none, changes nothing (same rv, no event) and answers the pod as it is;
//!   grace 0 puts `dt` at the time of that request; the server never removes a pod when `dt`
//!   passes (a terminating pod set to `Succeeded` stays until a grace-0 delete); -1 means 1;
//!   immediate deletion for unbound, `Succeeded`/`Failed` and
//!   `terminationGracePeriodSeconds: 0` pods;
//! * 2.1–2.7: grace 0 is `MODIFIED` (dt, dgps 0) then `DELETED`; UID and resourceVersion
//!   preconditions answer 409 with the Kind in message and details; finalizers hold a pod
//!   (dgps 0, later DELETEs change nothing) until removed, and removing the last one of a pod
//!   with dgps 0 deletes it at once (the response keeps the old rv); `Foreground`, `Orphan`
//!   and `orphanDependents: true` add their finalizers (`Background` removes them, upstream);
//!   `dryRun=All` stores nothing;
//! * 3.1, 3.4, 5.1: a node may delete only pods bound to it (403), a missing pod is 404;
//! * 5.2–5.5, 5.8: a node creates only mirror pods, bound to itself, with a controller owner
//!   reference to its Node (uid checked), referencing no service account or secret (nor, from
//!   upstream, configmaps, PVCs, generic ephemeral volumes, resource claims); missing
//!   namespace 404, duplicate 409; a server-assigned uid; status sent in a create is ignored
//!   (but for a `qosClass`, kept as the real server keeps it);
//! * 11.2–11.5, 11.7: generation (1 on create, +1 per spec change and when a graceful delete
//!   sets `dt`, not when it is shortened); which spec fields an update may change (422 with
//!   a diff otherwise); the defaults a created pod gets (including the two `NoExecute`
//!   tolerations of 300 s); the Node's topology labels copied at creation; `managedFields`
//!   per manager (the User-Agent up to its first `/`, `unknown` without one).
//!
//! From upstream `ValidatePodUpdate`, where the facts are silent: `activeDeadlineSeconds` may
//! only be set or lowered; existing tolerations may change only their `tolerationSeconds`;
//! `terminationGracePeriodSeconds` may only go from negative to 1 (the 422's own wording); a
//! changed `metadata.uid` and the mirror annotation coming or going are 422. The diff in the
//! spec 422 lists the changed fields in `cmp.Diff`'s shape, not byte for byte.
//! Left out: the validation of a created pod (`ValidatePod`: names, containers, volumes),
//! `generateName`, and the `binding` subresource (see `mod.rs`).

use super::authorization::User;
use super::http::Req;
use super::patch::{PatchType, apply};
use super::reply::{
    Reply, admission_forbidden, already_exists, conflict_modified, conflict_precondition, invalid,
    not_found, respond,
};
use super::store::{EventType, Kind, State, Store, now_rfc3339, parse_time, rfc3339, str_at};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Instant;

mod create;
mod update;
pub use create::create_trusted;
pub use update::mirror_annotation_errors;

pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";
const TOPOLOGY_LABELS: [&str; 2] = [
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
];

/// GET of a pod (or of its `/status`, the same object).
pub fn get(state: &State, req: &Req) -> Reply {
    let a = &req.attrs;
    match state
        .lock()
        .pods
        .get(&(a.namespace.clone(), a.name.clone()))
    {
        Some(p) => respond(200, p),
        None => not_found("", "pods", &a.name),
    }
}

/// A field error of a 422: (field, cause reason, detail).
pub type FieldError = (String, &'static str, String);

/// `metadata.uid` sent and not the stored one: immutable (listed twice, as the real server
/// lists the cause, fact 4.5).
pub fn uid_errors(before: &Value, sent: &Value) -> Vec<FieldError> {
    let (uid, sent_uid) = (
        str_at(before, "/metadata/uid"),
        str_at(sent, "/metadata/uid"),
    );
    if sent_uid.is_empty() || sent_uid == uid {
        return Vec::new();
    }
    let e = (
        "metadata.uid".to_owned(),
        "FieldValueInvalid",
        format!("Invalid value: \"{sent_uid}\": field is immutable"),
    );
    vec![e.clone(), e]
}

pub fn handle(state: &Arc<State>, req: &Req) -> Reply {
    let a = &req.attrs;
    match a.verb.as_str() {
        "get" => get(state, req),
        "create" => create::create(state, req),
        "delete" => {
            let mut opts = if req.body.is_object() {
                req.body.clone()
            } else {
                json!({})
            };
            if let Some(g) = req
                .q("gracePeriodSeconds")
                .and_then(|g| g.parse::<i64>().ok())
            {
                opts["gracePeriodSeconds"] = g.into();
            }
            if let Some(p) = req.q("propagationPolicy") {
                opts["propagationPolicy"] = p.into();
            }
            if let Some(o) = req.q("orphanDependents") {
                opts["orphanDependents"] = (o == "true").into();
            }
            let dry_run = req.dry_run()
                || opts["dryRun"]
                    .as_array()
                    .is_some_and(|d| d.iter().any(|v| v == "All"));
            let (code, v) = delete(state, &req.user, &a.namespace, &a.name, &opts, dry_run);
            respond(code, &v)
        }
        "update" | "patch" => update::update(state, req),
        _ => super::reply::no_route(&req.method, &req.path),
    }
}

/// The manager name the server derives from a User-Agent (fact 11.7).
pub fn manager(user_agent: &str) -> String {
    let m = user_agent.split('/').next().unwrap_or("").trim();
    if m.is_empty() {
        "unknown".into()
    } else {
        m.into()
    }
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
    let pod = state
        .lock()
        .pods
        .get(&(ns.to_owned(), name.to_owned()))
        .cloned();
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
    let body =
        futures_util::FutureExt::now_or_never(http_body_util::BodyExt::collect(r.into_body()))
            .and_then(Result::ok)
            .map(|b| b.to_bytes())
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or(Value::Null);
    (code, body)
}

/// `deletionFinalizersForGarbageCollection`: the finalizers a DELETE leaves. Pods have no
/// default policy, so only an explicit `orphanDependents`/`propagationPolicy`, or a finalizer
/// already there, decides (fact 2.6: `Foreground` adds `foregroundDeletion`, `Orphan` and
/// `orphanDependents: true` add `orphan`, `Background` removes both).
fn gc_finalizers(current: Vec<String>, opts: &Value) -> Vec<String> {
    const ORPHAN: &str = "orphan";
    const FOREGROUND: &str = "foregroundDeletion";
    let first = current
        .iter()
        .find(|f| *f == ORPHAN || *f == FOREGROUND)
        .cloned();
    let (orphan, foreground) = match (
        opts["orphanDependents"].as_bool(),
        opts["propagationPolicy"].as_str(),
    ) {
        (Some(o), _) => (o, false),
        (None, Some("Orphan")) => (true, false),
        (None, Some("Foreground")) => (false, true),
        (None, Some("Background")) => (false, false),
        _ => (
            first.as_deref() == Some(ORPHAN),
            first.as_deref() == Some(FOREGROUND),
        ),
    };
    let mut next: Vec<String> = current
        .iter()
        .filter(|f| *f != ORPHAN && *f != FOREGROUND)
        .cloned()
        .collect();
    if orphan {
        next.push(ORPHAN.into());
    }
    if foreground {
        next.push(FOREGROUND.into());
    }
    let same = next.len() == current.len() && next.iter().all(|f| current.contains(f));
    if same { current } else { next }
}

/// The storage side of a pod DELETE (after admission): `rest.BeforeDelete` with the pod
/// strategy's `CheckGracefulDelete`, then the generic store's finalizer handling.
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
        return reply_parts(conflict_precondition(
            "Pod",
            name,
            "ResourceVersion",
            want,
            &rv,
        ));
    }
    // a negative grace is 1 (fact 1.7)
    let requested = opts["gracePeriodSeconds"]
        .as_i64()
        .map(|g| if g < 0 { 1 } else { g });
    let now = jiff::Timestamp::now().as_second();
    let mut next = pod.clone();
    let meta = &pod["metadata"];
    let graceful = match (
        meta["deletionTimestamp"].as_str().and_then(parse_time),
        meta["deletionGracePeriodSeconds"].as_i64(),
    ) {
        // already due: only finalizers hold it
        (Some(_), None | Some(0)) => false,
        // terminating: only a shorter grace changes anything, counted from the first
        // delete's start (fact 1.2), except 0, which is now (fact 1.5)
        (Some(dt), Some(existing)) => match requested {
            Some(g) if g < existing => {
                let new_dt = if g == 0 { now } else { dt - existing + g };
                next["metadata"]["deletionTimestamp"] = rfc3339(new_dt).into();
                next["metadata"]["deletionGracePeriodSeconds"] = g.into();
                true
            }
            // pending: nothing changes, the pod is answered as it is (facts 1.3, 1.6)
            _ => return (200, pod),
        },
        (None, _) => {
            // CheckGracefulDelete: unbound and finished pods go at once (fact 1.8)
            let mut g = requested
                .or_else(|| pod["spec"]["terminationGracePeriodSeconds"].as_i64())
                .unwrap_or(0);
            let phase = str_at(&pod, "/status/phase");
            if str_at(&pod, "/spec/nodeName").is_empty() || matches!(phase, "Failed" | "Succeeded")
            {
                g = 0;
            }
            let g = if g < 0 { 1 } else { g };
            next["metadata"]["deletionTimestamp"] = rfc3339(now + g).into();
            next["metadata"]["deletionGracePeriodSeconds"] = g.into();
            if let Some(generation) = next["metadata"]["generation"].as_i64().filter(|g| *g > 0) {
                next["metadata"]["generation"] = (generation + 1).into(); // fact 11.2
            }
            true
        }
    };
    let fins = gc_finalizers(finalizers(&next), opts);
    if fins != finalizers(&next) {
        next["metadata"]["finalizers"] = json!(fins);
    }
    if !graceful {
        if fins.is_empty() {
            // due and nothing holds it: deleted now
            return (
                200,
                if dry_run {
                    next
                } else {
                    remove(state, &mut s, pod)
                },
            );
        }
        // markAsDeleting
        if meta["deletionTimestamp"]
            .as_str()
            .and_then(parse_time)
            .is_none_or(|t| t > now)
        {
            next["metadata"]["deletionTimestamp"] = rfc3339(now).into();
        }
        next["metadata"]["deletionGracePeriodSeconds"] = 0.into();
    }
    if dry_run {
        return (200, next);
    }
    let stored = s.commit(&state.events_tx, Kind::Pod, Some(&pod), next);
    if stored["metadata"]["deletionGracePeriodSeconds"] == 0 && fins.is_empty() {
        // MODIFIED (dt, dgps 0), then DELETED (fact 2.1)
        return (200, remove(state, &mut s, stored));
    }
    (200, stored)
}
