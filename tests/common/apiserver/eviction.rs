//! The Eviction subresource (`pkg/registry/core/pod/storage/eviction.go`) and
//! PodDisruptionBudgets (`policy/v1`).
//!
//! Facts implemented here: (to be completed: section 6).

use super::http::Req;
use super::pods;
use super::reply::{Reply, not_found, respond, status_body, success};
use super::patch::strategic_merge;
use super::store::{Kind, State, now_rfc3339, str_at};
use serde_json::{Value, json};
use std::sync::Arc;

/// An admin's create of a PodDisruptionBudget with the status given.
pub fn create_pdb_trusted(state: &Arc<State>, pdb: Value) -> Value {
    let mut s = state.lock();
    let key = (
        str_at(&pdb, "/metadata/namespace").to_owned(),
        str_at(&pdb, "/metadata/name").to_owned(),
    );
    let before = s.pdbs.get(&key).cloned();
    s.commit(&state.events_tx, Kind::Pdb, before.as_ref(), pdb)
}

pub fn pdbs(state: &Arc<State>, req: &Req) -> Reply {
    let a = &req.attrs;
    match a.verb.as_str() {
        "list" => {
            let s = state.lock();
            let items: Vec<Value> = s
                .pdbs
                .iter()
                .filter(|((n, _), _)| a.namespace.is_empty() || *n == a.namespace)
                .map(|(_, v)| v.clone())
                .collect();
            respond(
                200,
                &json!({"kind": "PodDisruptionBudgetList", "apiVersion": "policy/v1", "metadata": {"resourceVersion": s.rv.to_string()}, "items": items}),
            )
        }
        "get" => match state.lock().pdbs.get(&(a.namespace.clone(), a.name.clone())) {
            Some(p) => respond(200, p),
            None => not_found("policy", "poddisruptionbudgets", &a.name),
        },
        _ => super::reply::no_route(&req.method, &req.path),
    }
}

pub fn evict(state: &Arc<State>, req: &Req) -> Reply {
    let (ns, name) = (req.attrs.namespace.as_str(), req.attrs.name.as_str());
    let opts = req.body.get("deleteOptions").cloned().unwrap_or(json!({}));
    let (pod, pdbs) = {
        let s = state.lock();
        let Some(pod) = s.pods.get(&(ns.into(), name.into())).cloned() else {
            return not_found("", "pods", name);
        };
        let labels = pod["metadata"]["labels"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        let pdbs: Vec<((String, String), Value)> = s
            .pdbs
            .iter()
            .filter(|((pns, _), pdb)| {
                pns == ns
                    && pdb["spec"]["selector"]["matchLabels"]
                        .as_object()
                        .map(|m| m.iter().all(|(k, v)| labels.get(k) == Some(v)))
                        .unwrap_or(true)
            })
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        (pod, pdbs)
    };
    let bypass = matches!(
        pod["status"]["phase"].as_str(),
        Some("Pending" | "Succeeded" | "Failed")
    ) || !pod["metadata"]["deletionTimestamp"].is_null();
    if !bypass {
        if pdbs.len() > 1 {
            return respond(
                500,
                &status_body(
                    500,
                    "",
                    "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
                    json!({}),
                ),
            );
        }
        if let Some((key, pdb)) = pdbs.first() {
            let allowed = pdb["status"]["disruptionsAllowed"].as_i64().unwrap_or(0);
            if allowed <= 0 {
                let msg = format!(
                    "The disruption budget {} needs {} healthy pods and has {} currently",
                    key.1,
                    pdb["status"]["desiredHealthy"].as_i64().unwrap_or(0),
                    pdb["status"]["currentHealthy"].as_i64().unwrap_or(0)
                );
                return respond(
                    429,
                    &status_body(
                        429,
                        "TooManyRequests",
                        "Cannot evict pod as it would violate the pod's disruption budget.",
                        json!({"causes": [{"reason": "DisruptionBudget", "message": msg}]}),
                    ),
                );
            }
            let mut s = state.lock();
            if let Some(p) = s.pdbs.get_mut(key) {
                p["status"]["disruptionsAllowed"] = (allowed - 1).into();
                p["status"]["disruptedPods"][name] = now_rfc3339().into();
            }
        }
    }
    // DisruptionTarget before the graceful delete, as the eviction storage does
    {
        let mut s = state.lock();
        if let Some(before) = s.pods.get(&(ns.into(), name.into())).cloned() {
            let mut p = before.clone();
            let cond = json!({"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI",
                              "message": "Eviction API: evicting", "lastTransitionTime": now_rfc3339()});
            strategic_merge(&mut p["status"], &json!({"conditions": [cond]}));
            s.commit(&state.events_tx, Kind::Pod, Some(&before), p);
        }
    }
    let (code, v) = pods::delete_admitted(state, ns, name, &opts, false);
    if code != 200 {
        return respond(code, &v);
    }
    success(201, None)
}
