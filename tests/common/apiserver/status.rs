//! `pods/status`: PATCH (merge, strategic, JSON patch) and PUT, the pod status strategy and
//! `ValidatePodStatusUpdate`, with NodeRestriction's rules for a node.
//!
//! Facts implemented here:
//! * 3.4, 4.6: a status write to a pod that is gone is 404 (only GET is 403 for a node);
//! * 4.1: merge, strategic and JSON patches and PUT are accepted, the Pod is returned;
//! * 4.2: a stale resourceVersion (PUT, or a patch carrying one) is 409 "the object has been
//!   modified"; a PUT without one applies;
//! * 4.3: a write that changes nothing keeps the resourceVersion and emits no event;
//! * 4.4: a node may write only the status of pods bound to it (403);
//! * 4.5: a `metadata.uid` that differs is 422 `field is immutable` (not 409);
//! * 4.7, 4.8: phases are not validated; conditions are stored as sent (no
//!   `lastTransitionTime` filled in);
//! * 4.9: strategic patches merge conditions by `type`, merge patches replace the list;
//! * 4.10: a node may not change labels or `resourceClaimStatuses` (403); `nominatedNodeName`
//!   on a bound pod, a changed `qosClass` and an invalid `podIP` are 422; spec changes are
//!   ignored; unknown status fields are dropped with a `Warning` header (422 with
//!   `fieldValidation=Strict`);
//! * 11.7: status writes get their own `managedFields` entry (`subresource: status`).

use super::authorization::User;
use super::http::Req;
use super::patch::{PatchType, apply};
use super::pods::{manager, touch_managed_fields};
use super::reply::{
    Reply, admission_forbidden, conflict_modified, invalid, not_found, respond, respond_with,
};
use super::store::{Kind, State, str_at};
use serde_json::Value;
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

fn valid_ip(s: &str) -> bool {
    s.parse::<std::net::IpAddr>().is_ok()
}

pub fn handle(state: &Arc<State>, req: &Req) -> Reply {
    let a = &req.attrs;
    match a.verb.as_str() {
        "get" => match state.lock().pods.get(&(a.namespace.clone(), a.name.clone())) {
            Some(p) => respond(200, p),
            None => not_found("", "pods", &a.name),
        },
        "patch" | "update" => write(state, req),
        _ => super::reply::no_route(&req.method, &req.path),
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
    if let User::Node(node) = &req.user
        && str_at(&before, "/spec/nodeName") != node
    {
        return admission_forbidden(
            "",
            "pods",
            name,
            &format!(
                "node \"{node}\" can only update pod status for pods with spec.nodeName set to itself"
            ),
        );
    }
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
    let sent_rv = if req.method == "PUT" {
        str_at(&sent, "/metadata/resourceVersion").to_owned()
    } else {
        str_at(&req.body, "/metadata/resourceVersion").to_owned()
    };
    if !sent_rv.is_empty() && sent_rv != str_at(&before, "/metadata/resourceVersion") {
        return conflict_modified("", "pods", name);
    }
    let uid = str_at(&before, "/metadata/uid");
    let sent_uid = str_at(&sent, "/metadata/uid");
    if !sent_uid.is_empty() && sent_uid != uid {
        let e = (
            "metadata.uid",
            "FieldValueInvalid",
            format!("Invalid value: \"{sent_uid}\": field is immutable"),
        );
        // the real server lists this cause twice
        return invalid("Pod", "", name, &[e.clone(), e]);
    }
    // unknown status fields: dropped with a warning, or refused under strict validation
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
        let labels_changed = sent["metadata"]["labels"] != before["metadata"]["labels"]
            && !(sent["metadata"]["labels"].is_null() && req.method != "PUT");
        if labels_changed {
            return admission_forbidden(
                "",
                "pods",
                name,
                &format!("node \"{node}\" cannot update labels through pod status"),
            );
        }
        if status.get("resourceClaimStatuses") != before["status"].get("resourceClaimStatuses")
        {
            return admission_forbidden(
                "",
                "pods",
                name,
                &format!("node \"{node}\" cannot update resource claim statues"),
            );
        }
    }
    // ValidatePodStatusUpdate
    let mut errors = Vec::new();
    let bound = !str_at(&before, "/spec/nodeName").is_empty();
    if bound
        && status
            .get("nominatedNodeName")
            .and_then(Value::as_str)
            .is_some_and(|n| !n.is_empty())
    {
        errors.push((
            "status.nominatedNodeName",
            "FieldValueForbidden",
            "Forbidden: may not be set on pods that are already bound to a node".to_owned(),
        ));
    }
    let old_qos = str_at(&before, "/status/qosClass");
    let new_qos = status.get("qosClass").and_then(Value::as_str).unwrap_or("");
    if !old_qos.is_empty() && new_qos != old_qos {
        errors.push((
            "status.qosClass",
            "FieldValueInvalid",
            format!("Invalid value: \"{new_qos}\": field is immutable"),
        ));
    }
    // podIP is mirrored into podIPs[0], which is what is validated
    let pod_ip = status.get("podIP").and_then(Value::as_str).map(str::to_owned);
    if let Some(ip) = &pod_ip {
        let mut ips = status
            .get("podIPs")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        if ips.first().and_then(|i| i["ip"].as_str()) != Some(ip.as_str()) {
            ips.retain(|i| i["ip"].as_str() != Some(ip.as_str()));
            ips.insert(0, serde_json::json!({"ip": ip}));
            status.insert("podIPs".into(), Value::Array(ips));
        }
    }
    let pod_ips: Vec<String> = status
        .get("podIPs")
        .and_then(Value::as_array)
        .map(|l| {
            l.iter()
                .map(|i| i["ip"].as_str().unwrap_or("").to_owned())
                .collect()
        })
        .unwrap_or_default();
    let ip_fields: Vec<String> = (0..pod_ips.len()).map(|i| format!("status.podIPs[{i}]")).collect();
    for (i, ip) in pod_ips.iter().enumerate() {
        if !valid_ip(ip) {
            errors.push((
                ip_fields[i].as_str(),
                "FieldValueInvalid",
                format!(
                    "Invalid value: \"{ip}\": must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)"
                ),
            ));
        }
    }
    if !errors.is_empty() {
        return invalid("Pod", "", name, &errors);
    }
    // podStatusStrategy.PrepareForUpdate: spec, deletion and owners are the stored ones; labels
    // and annotations may change
    let mut next = before.clone();
    next["status"] = Value::Object(status);
    for k in ["labels", "annotations"] {
        if !sent["metadata"][k].is_null() || req.method == "PUT" {
            next["metadata"][k] = sent["metadata"][k].clone();
        }
    }
    if let Some(m) = next["metadata"].as_object_mut() {
        m.retain(|_, v| !v.is_null());
    }
    touch_managed_fields(&mut next, &manager(&req.user_agent), "Update", "status");
    let stored = s.commit(&state.events_tx, Kind::Pod, Some(&before), next);
    if unknown.is_empty() {
        respond(200, &stored)
    } else {
        let warning = unknown
            .iter()
            .map(|k| format!("299 - \"unknown field \\\"status.{k}\\\"\""))
            .collect::<Vec<_>>()
            .join(", ");
        respond_with(200, &stored, &[("warning", warning)])
    }
}
