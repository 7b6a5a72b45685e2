//! PodDisruptionBudgets (`policy/v1`): create, get, updates of the object and of `/status`
//! (lists and watches are `watch::list_or_watch`'s). No disruption controller runs, as on the
//! measured server: a PDB's status is what an admin writes and what evictions consume
//! ([`super::eviction`]).
//!
//! Facts implemented here: 6.13 (a new PDB's status is all zeros without `observedGeneration`;
//! negative counts are 422). Inferred from upstream: a spec edit bumps `metadata.generation`.
//! Left out: PDB DELETE, `dryRun`, spec validation.

use super::http::Req;
use super::patch::{PatchType, apply};
use super::pods::{manager, touch_managed_fields};
use super::reply::{
    Reply, already_exists, bad_request, conflict_modified, invalid, no_route, not_found, respond,
    unsupported_media_type,
};
use super::store::{Key, Kind, State, Store, now_rfc3339, str_at};
use serde_json::{Value, json};
use std::sync::Arc;

pub const GROUP: &str = "policy";
pub const PDBS: &str = "poddisruptionbudgets";
pub const COUNTS: [&str; 4] = [
    "disruptionsAllowed",
    "currentHealthy",
    "desiredHealthy",
    "expectedPods",
];

/// The status fields as the API serialises them: the four counts always, `observedGeneration`,
/// `disruptedPods` and `conditions` only when set.
fn normalise_status(status: &mut Value) {
    if !status.is_object() {
        *status = json!({});
    }
    for k in COUNTS {
        if status[k].is_null() {
            status[k] = 0.into();
        }
    }
    if let Some(m) = status.as_object_mut() {
        m.retain(|k, v| match k.as_str() {
            "observedGeneration" => v.as_i64().is_some_and(|g| g != 0),
            "disruptedPods" => v.as_object().is_some_and(|d| !d.is_empty()),
            "conditions" => v.as_array().is_some_and(|c| !c.is_empty()),
            _ => !v.is_null(),
        });
    }
}

/// Fills in what the server sets on a created PDB.
fn fill_new(s: &mut Store, pdb: &mut Value) {
    pdb["apiVersion"] = "policy/v1".into();
    pdb["kind"] = "PodDisruptionBudget".into();
    pdb["metadata"]["uid"] = s.new_uid().into();
    pdb["metadata"]["creationTimestamp"] = now_rfc3339().into();
    if pdb["metadata"]["generation"].is_null() {
        pdb["metadata"]["generation"] = 1.into();
    }
}

/// An admin's create of a PodDisruptionBudget with the status given, as a disruption controller
/// would have written it: unless given, `observedGeneration` is the generation.
pub fn create_pdb_trusted(state: &Arc<State>, mut pdb: Value) -> Value {
    let mut s = state.lock();
    if str_at(&pdb, "/metadata/namespace").is_empty() {
        pdb["metadata"]["namespace"] = "default".into();
    }
    let ns = str_at(&pdb, "/metadata/namespace").to_owned();
    let before = (s.pdbs.get(&(ns, str_at(&pdb, "/metadata/name").to_owned()))).cloned();
    fill_new(&mut s, &mut pdb);
    if pdb["status"]["observedGeneration"].is_null() {
        pdb["status"]["observedGeneration"] = pdb["metadata"]["generation"].clone();
    }
    normalise_status(&mut pdb["status"]);
    s.commit(&state.events_tx, Kind::Pdb, before.as_ref(), pdb)
}

/// `policy/v1` `poddisruptionbudgets` and `poddisruptionbudgets/status`, for an admin.
pub fn pdbs(state: &Arc<State>, req: &Req) -> Reply {
    let a = &req.attrs;
    let key = (a.namespace.clone(), a.name.clone());
    let status = a.subresource == "status";
    match (a.verb.as_str(), status) {
        ("get", _) => match state.lock().pdbs.get(&key) {
            Some(p) => respond(200, p),
            None => not_found(GROUP, PDBS, &a.name),
        },
        ("create", false) => {
            let mut pdb = req.body.clone();
            let name = str_at(&pdb, "/metadata/name").to_owned();
            let mut s = state.lock();
            if !s.has_namespace(&a.namespace) {
                return not_found("", "namespaces", &a.namespace);
            }
            if s.pdbs.contains_key(&(a.namespace.clone(), name.clone())) {
                return already_exists(GROUP, PDBS, &name);
            }
            pdb["metadata"]["namespace"] = a.namespace.clone().into();
            pdb["metadata"]["generation"] = Value::Null;
            fill_new(&mut s, &mut pdb);
            // the status of a create is the server's (fact 6.13)
            pdb["status"] = json!({});
            normalise_status(&mut pdb["status"]);
            touch_managed_fields(&mut pdb, &manager(&req.user_agent), "Update", "");
            respond(201, &s.commit(&state.events_tx, Kind::Pdb, None, pdb))
        }
        ("update" | "patch", _) => update_pdb(state, req, &key, status),
        _ => no_route(&req.method, &req.path),
    }
}

/// PUT or PATCH of a PDB or (`status`) of its `/status`.
fn update_pdb(state: &Arc<State>, req: &Req, key: &Key, status: bool) -> Reply {
    let name = key.1.as_str();
    let mut s = state.lock();
    let Some(before) = s.pdbs.get(key).cloned() else {
        return not_found(GROUP, PDBS, name);
    };
    let mut next = before.clone();
    if req.method == "PUT" {
        next = req.body.clone();
    } else {
        let Some(t) = PatchType::from_content_type(&req.content_type) else {
            return unsupported_media_type(true);
        };
        if let Err(e) = apply(t, &mut next, &req.body) {
            return bad_request(&e);
        }
    }
    let sent_rv = str_at(&next, "/metadata/resourceVersion");
    if !sent_rv.is_empty() && sent_rv != str_at(&before, "/metadata/resourceVersion") {
        return conflict_modified(GROUP, PDBS, name);
    }
    let mut out = before.clone();
    if status {
        out["status"] = next["status"].clone();
        normalise_status(&mut out["status"]);
        // `ValidatePodDisruptionBudgetStatusUpdate`: the counts are not negative (fact 6.13)
        let negative = |k: &&str| out["status"][*k].as_i64().filter(|v| *v < 0);
        let fields: Vec<(String, i64)> = (COUNTS.iter())
            .filter_map(|k| Some((format!("status.{k}"), negative(k)?)))
            .collect();
        let detail = |v: &i64| format!("Invalid value: {v}: must be greater than or equal to 0");
        let errors: Vec<(&str, &str, String)> = (fields.iter())
            .map(|(f, v)| (f.as_str(), "FieldValueInvalid", detail(v)))
            .collect();
        if !errors.is_empty() {
            return invalid("PodDisruptionBudget", GROUP, name, &errors);
        }
    } else {
        for k in ["labels", "annotations", "finalizers", "ownerReferences"] {
            out["metadata"][k] = next["metadata"][k].clone();
        }
        if let Some(m) = out["metadata"].as_object_mut() {
            m.retain(|_, v| !v.is_null());
        }
        out["spec"] = next["spec"].clone();
        if out["spec"] != before["spec"] {
            let g = before["metadata"]["generation"].as_i64().unwrap_or(1);
            out["metadata"]["generation"] = (g + 1).into();
        }
    }
    let sub = if status { "status" } else { "" };
    touch_managed_fields(&mut out, &manager(&req.user_agent), "Update", sub);
    respond(
        200,
        &s.commit(&state.events_tx, Kind::Pdb, Some(&before), out),
    )
}
