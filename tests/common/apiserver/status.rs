//! `pods/status`: PATCH (merge, strategic, JSON patch) and PUT, the pod status strategy and
//! `ValidatePodStatusUpdate`, with NodeRestriction's rules for a node. The order is the real
//! server's: the pod is read (404), the patch applied and decoded (unknown fields), admission
//! (NodeRestriction's 403s), the resourceVersion precondition (409), then the strategy and
//! validation (422s), and a write that changes nothing is not written.
//!
//! Facts implemented here:
//! * 3.4, 4.6: a status write to a pod that is gone is 404 (only GET is 403 for a node);
//! * 4.1: merge, strategic and JSON patches and PUT are accepted, the Pod is returned;
//! * 4.2: a stale resourceVersion (PUT, or a patch carrying one) is 409 "the object has been
//!   modified"; a PUT without one applies;
//! * 4.3: a write that changes nothing keeps the resourceVersion and emits no event;
//! * 4.4: a node may write only the status of pods bound to it (403);
//! * 4.5: a `metadata.uid` that differs is 422 `field is immutable`, the cause listed twice
//!   (the generic and the pod's metadata validation each find it), not 409;
//! * 4.7, 4.8: phases are not validated; conditions are stored as sent (no
//!   `lastTransitionTime` filled in: times not sent are `null`, [`super::store::render`]);
//! * 4.9: strategic patches merge conditions by `type` (a new one first), merge patches
//!   replace the list;
//! * 4.10: a node may not change labels or `resourceClaimStatuses` (403); a newly set
//!   `nominatedNodeName` on a bound pod, a changed `qosClass` (an empty one is filled in from
//!   the stored pod) and an invalid pod IP are 422; spec changes are ignored; unknown status
//!   fields are dropped with a `Warning` header (422 with `fieldValidation=Strict`);
//! * 2.4: a node still writes the status of a pod a finalizer holds;
//! * 11.7: status writes get their own `managedFields` entry (`subresource: status`).
//!
//! From upstream, where the facts are silent: a status write takes labels (not from a node),
//! annotations and finalizers from the object sent, and one that removes the last finalizer of
//! a pod with `deletionGracePeriodSeconds: 0` deletes it (as fact 2.5 shows for the object);
//! the mirror annotation may not come or go (422); `podIP`/`podIPs` and `hostIP`/`hostIPs` are
//! kept in step as the v1 conversion does (the single field wins when they differ); more than
//! one IP must be one of each family; with `restartPolicy` `Never` (or `OnFailure` after exit
//! 0) a terminated container may not go back to another state.
//! Left out: the validation of custom condition types and of container status users and
//! allocated resources (nothing here sends them malformed).

use super::authorization::User;
use super::http::Req;
use super::patch::{PatchType, apply};
use super::pods::{manager, mirror_annotation_errors, remove, touch_managed_fields};
use super::reply::{
    Reply, admission_forbidden, conflict_modified, invalid, not_found, respond, respond_with,
};
use super::store::{Kind, State, str_at};
use serde_json::{Map, Value, json};
use std::net::IpAddr;
use std::sync::Arc;

/// The fields of `PodStatus` in v1.36.
const STATUS_FIELDS: [&str; 19] = [
    "observedGeneration",
    "phase",
    "conditions",
    "message",
    "reason",
    "nominatedNodeName",
    "hostIP",
    "hostIPs",
    "podIP",
    "podIPs",
    "startTime",
    "initContainerStatuses",
    "containerStatuses",
    "qosClass",
    "ephemeralContainerStatuses",
    "resize",
    "resourceClaimStatuses",
    "extendedResourceClaimStatus",
    "allocatedResources",
];

const IP_EXAMPLE: &str = "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)";

use super::pods::FieldError;

pub fn handle(state: &Arc<State>, req: &Req) -> Reply {
    let a = &req.attrs;
    match a.verb.as_str() {
        "get" => super::pods::get(state, req),
        "patch" | "update" => write(state, req),
        _ => super::reply::no_route(&req.method, &req.path),
    }
}

/// Labels as `labels.Equals` compares them: absent and empty are the same.
fn labels_equal(a: &Value, b: &Value) -> bool {
    let map = |v: &Value| v.as_object().cloned().unwrap_or_default();
    map(a) == map(b)
}

/// The single field and its list (`podIP`/`podIPs`) as the v1 conversion leaves them.
fn sync_ips(status: &mut Map<String, Value>, single: &str, list: &str) {
    let one = status
        .get(single)
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    let first = status
        .get(list)
        .and_then(|l| l[0]["ip"].as_str())
        .map(str::to_owned);
    if !one.is_empty() && first.as_deref() != Some(one.as_str()) {
        status.insert(list.into(), json!([{"ip": one}]));
    } else if one.is_empty()
        && let Some(f) = first
    {
        status.insert(single.into(), f.into());
    }
}

/// `validatePodIPs` / `validateHostIPs`.
fn validate_ips(status: &Map<String, Value>, list: &str, errors: &mut Vec<FieldError>) {
    let ips: Vec<String> = status
        .get(list)
        .and_then(Value::as_array)
        .map(|l| {
            l.iter()
                .map(|i| i["ip"].as_str().unwrap_or("").to_owned())
                .collect()
        })
        .unwrap_or_default();
    let mut parsed = Vec::new();
    for (i, ip) in ips.iter().enumerate() {
        match ip.parse::<IpAddr>() {
            Ok(a) => parsed.push(a),
            Err(_) => errors.push((
                format!("status.{list}[{i}]"),
                "FieldValueInvalid",
                format!("Invalid value: \"{ip}\": {IP_EXAMPLE}"),
            )),
        }
    }
    let dual = parsed.len() == 2 && parsed[0].is_ipv4() != parsed[1].is_ipv4();
    if ips.len() > 1 && parsed.len() == ips.len() && !dual {
        errors.push((
            format!("status.{list}"),
            "FieldValueInvalid",
            "Invalid value: may specify no more than one IP for each IP family".into(),
        ));
    }
}

/// `ValidateContainerStateTransition`: what a pod that does not restart may not do.
fn validate_transitions(old: &Value, status: &Map<String, Value>, errors: &mut Vec<FieldError>) {
    let policy = str_at(old, "/spec/restartPolicy");
    if policy == "Always" || policy.is_empty() {
        return;
    }
    for list in ["containerStatuses", "initContainerStatuses"] {
        let olds = old["status"][list].as_array().cloned().unwrap_or_default();
        let news = status
            .get(list)
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for (i, o) in olds.iter().enumerate() {
            let term = &o["state"]["terminated"];
            if term.is_null() || (policy == "OnFailure" && term["exitCode"].as_i64() != Some(0)) {
                continue;
            }
            if news
                .iter()
                .any(|n| n["name"] == o["name"] && n["state"]["terminated"].is_null())
            {
                errors.push((
                    format!("status.{list}[{i}].state"),
                    "FieldValueForbidden",
                    "Forbidden: may not be transitioned to non-terminated state".into(),
                ));
            }
        }
    }
}

fn write(state: &Arc<State>, req: &Req) -> Reply {
    let a = &req.attrs;
    let name = a.name.as_str();
    let mut s = state.lock();
    let key = (a.namespace.clone(), a.name.clone());
    let Some(before) = s.pods.get(&key).cloned() else {
        return not_found("", "pods", name);
    };
    // the object the client asks for
    let sent = if req.method == "PUT" {
        req.body.clone()
    } else {
        let mut p = before.clone();
        let t = PatchType::from_content_type(&req.content_type).unwrap_or(PatchType::Merge);
        if let Err(e) = apply(t, &mut p, &req.body) {
            return super::reply::bad_request(&e);
        }
        p
    };
    // decoding: unknown status fields are dropped with a warning, or refused under strict
    let mut status = sent["status"].as_object().cloned().unwrap_or_default();
    let unknown: Vec<String> = status
        .keys()
        .filter(|k| !STATUS_FIELDS.contains(&k.as_str()))
        .cloned()
        .collect();
    if !unknown.is_empty() && req.q("fieldValidation") == Some("Strict") {
        let list: Vec<String> = unknown
            .iter()
            .map(|k| format!("unknown field \"status.{k}\""))
            .collect();
        return super::reply::bad_request_strict(&list);
    }
    for k in &unknown {
        status.remove(k);
    }
    // NodeRestriction (admitPodStatus)
    if let User::Node(node) = &req.user {
        let forbid =
            |why: &str| admission_forbidden("", "pods", name, &format!("node \"{node}\" {why}"));
        if str_at(&before, "/spec/nodeName") != node {
            return forbid("can only update pod status for pods with spec.nodeName set to itself");
        }
        if !labels_equal(&sent["metadata"]["labels"], &before["metadata"]["labels"]) {
            return forbid("cannot update labels through pod status");
        }
        let claims = |v: Option<&Value>| {
            v.cloned()
                .filter(|c| c.as_array().is_some_and(|l| !l.is_empty()))
        };
        if claims(status.get("resourceClaimStatuses"))
            != claims(before["status"].get("resourceClaimStatuses"))
        {
            return forbid("cannot update resource claim statues");
        }
    }
    // the resourceVersion precondition: the one sent, or the one a patch leaves
    let sent_rv = str_at(&sent, "/metadata/resourceVersion");
    if !sent_rv.is_empty() && sent_rv != str_at(&before, "/metadata/resourceVersion") {
        return conflict_modified("", "pods", name);
    }
    // podStatusStrategy.PrepareForUpdate: spec, deletion and owners stay; an empty qosClass is
    // the stored one
    if status
        .get("qosClass")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
        && let Some(q) = before["status"].get("qosClass")
    {
        status.insert("qosClass".into(), q.clone());
    }
    sync_ips(&mut status, "podIP", "podIPs");
    sync_ips(&mut status, "hostIP", "hostIPs");
    // ValidateObjectMetaUpdate (run twice: generic and the pod's) and ValidatePodStatusUpdate
    let mut errors: Vec<FieldError> = Vec::new();
    errors.extend(super::pods::uid_errors(&before, &sent));
    errors.extend(mirror_annotation_errors(&before, &sent));
    let nominated = status
        .get("nominatedNodeName")
        .and_then(Value::as_str)
        .unwrap_or("");
    if !nominated.is_empty()
        && nominated != str_at(&before, "/status/nominatedNodeName")
        && !str_at(&before, "/spec/nodeName").is_empty()
    {
        errors.push((
            "status.nominatedNodeName".into(),
            "FieldValueForbidden",
            "Forbidden: may not be set on pods that are already bound to a node".into(),
        ));
    }
    let old_qos = str_at(&before, "/status/qosClass");
    let new_qos = status.get("qosClass").and_then(Value::as_str).unwrap_or("");
    if new_qos != old_qos {
        errors.push((
            "status.qosClass".into(),
            "FieldValueInvalid",
            format!("Invalid value: \"{new_qos}\": field is immutable"),
        ));
    }
    validate_transitions(&before, &status, &mut errors);
    validate_ips(&status, "podIPs", &mut errors);
    validate_ips(&status, "hostIPs", &mut errors);
    if !errors.is_empty() {
        let refs: Vec<(&str, &str, String)> = errors
            .iter()
            .map(|(f, r, d)| (f.as_str(), *r, d.clone()))
            .collect();
        return invalid("Pod", "", name, &refs);
    }
    let mut next = before.clone();
    next["status"] = Value::Object(status);
    for k in ["labels", "annotations", "finalizers"] {
        next["metadata"][k] = sent["metadata"][k].clone();
    }
    if let Some(m) = next["metadata"].as_object_mut() {
        m.retain(|_, v| !v.is_null());
    }
    touch_managed_fields(&mut next, &manager(&req.user_agent), "Update", "status");
    let emptied = next["metadata"]["finalizers"].is_null()
        && before["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| !f.is_empty())
        && before["metadata"]["deletionGracePeriodSeconds"] == 0;
    let stored = if emptied {
        // the last finalizer of a due pod went: deleted instead (the answer keeps the old rv)
        remove(state, &mut s, next.clone());
        next
    } else {
        s.commit(&state.events_tx, Kind::Pod, Some(&before), next)
    };
    if unknown.is_empty() {
        return respond(200, &stored);
    }
    let warning = unknown
        .iter()
        .map(|k| format!("299 - \"unknown field \\\"status.{k}\\\"\""))
        .collect::<Vec<_>>()
        .join(", ");
    respond_with(200, &stored, &[("warning", warning)])
}
