//! The Eviction subresource (`pkg/registry/core/pod/storage/eviction.go`, with NodeRestriction's
//! `admitPodEviction`) and the budgets it consumes (the PDB resource itself is [`super::pdbs`]'s).
//!
//! Facts implemented here:
//! * 6.1: an eviction answers 201 with a `Success` Status and deletes the pod with its spec grace;
//! * 6.2: the `DisruptionTarget` condition is written first (its own `MODIFIED`), then the delete;
//!   the inner writes are not requests (one record);
//! * 6.3, 6.10: PDBs are not consulted for `Pending`, `Succeeded`, `Failed` or terminating pods;
//! * 6.4: no disruption allowed: 429 with a `DisruptionBudget` cause, no `Retry-After` (dry run too);
//! * 6.5: an allowed eviction decrements `disruptionsAllowed`, records `disruptedPods` and, at 0,
//!   the `DisruptionAllowed=False`/`InsufficientPods` condition, in one PDB write;
//! * 6.6: more than one PDB selecting the pod: 500 without a `reason`;
//! * 6.7: `deleteOptions` are the delete's (grace);
//! * 6.8: preconditions are checked after the budget is consumed (409, budget gone, pod untouched);
//! * 6.9: a node evicts only pods bound to it (403); a missing pod is `pod "x" not found` (`pod`);
//! * 6.11: a PDB not observed at its generation: 429 `still being processed`, `Retry-After: 10`;
//! * 6.12: a not-ready pod is evicted without consuming the budget when currentHealthy is at
//!   least desiredHealthy (and desiredHealthy > 0), or (inferred) the PDB's
//!   `unhealthyPodEvictionPolicy` is `AlwaysAllow`;
//! * 6.14: URL and body names must match (400); a `policy/v1beta1` body or one without a
//!   namespace is accepted.
//!
//! Inferred from upstream, not measured: an admin's eviction of a missing pod is
//! `pods "x" not found`; a body namespace other than the URL's is 400; the `DisruptionAllowed`
//! condition carries a `lastTransitionTime` (its validation requires one); a not-ready pod's delete whose precondition fails is 429 `still being
//! processed`; a negative budget or more than 2000 `disruptedPods` is 403; no selector or an
//! invalid one selects nothing. Measured on the real server beyond the facts: an empty
//! selector (`{}`) selects every pod of the namespace (the policy/v1 rule).
//!
//! Left out (no fact, nothing here needs them): the eviction's retries on conflicts (its inner
//! writes do not conflict here).

use super::authorization::User;
use super::http::Req;
use super::pdbs::{GROUP, PDBS};
use super::pods;
use super::reply::{
    Reply, admission_forbidden, bad_request, conflict_precondition, not_found, respond,
    respond_with, status_body, success,
};
use super::store::{Key, Kind, State, Store, now_rfc3339, str_at};
use serde_json::{Value, json};
use std::sync::Arc;

const VIOLATION: &str = "Cannot evict pod as it would violate the pod's disruption budget.";
/// `metav1.LabelSelectorAsSelector` matching, as the eviction storage treats a PDB's selector:
/// no selector selects nothing, an empty one (`{}`) every pod (policy/v1), an invalid one
/// nothing.
fn selects(selector: &Value, labels: &Value) -> bool {
    if !selector.is_object() {
        return false;
    }
    let match_labels = selector["matchLabels"].as_object().into_iter().flatten();
    let mut exprs = selector["matchExpressions"]
        .as_array()
        .into_iter()
        .flatten();
    let label = |k: &str| labels[k].as_str();
    let labels_ok = match_labels
        .clone()
        .all(|(k, v)| v.as_str().is_some_and(|v| label(k) == Some(v)));
    labels_ok
        && exprs.all(|e| {
            let key = str_at(e, "/key");
            let values: Vec<&str> = e["values"]
                .as_array()
                .map(|v| v.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            match (str_at(e, "/operator"), values.is_empty()) {
                ("In", false) => label(key).is_some_and(|l| values.contains(&l)),
                ("NotIn", false) => label(key).is_none_or(|l| !values.contains(&l)),
                ("Exists", true) => label(key).is_some(),
                ("DoesNotExist", true) => label(key).is_none(),
                _ => false,
            }
        })
}

fn is_ready(pod: &Value) -> bool {
    let mut conds = pod["status"]["conditions"].as_array().into_iter().flatten();
    conds.any(|c| c["type"] == "Ready" && c["status"] == "True")
}

/// 429 with a `DisruptionBudget` cause; `Retry-After` only when `retry` > 0 (facts 6.4, 6.11).
fn too_many_requests(cause: String, retry: u32) -> Reply {
    let mut details = json!({"causes": [{"reason": "DisruptionBudget", "message": cause}]});
    let mut headers = Vec::new();
    if retry > 0 {
        details["retryAfterSeconds"] = retry.into();
        headers.push(("Retry-After", retry.to_string()));
    }
    respond_with(
        429,
        &status_body(429, "TooManyRequests", VIOLATION, details),
        &headers,
    )
}

fn still_processing(pdb: &str) -> Reply {
    let cause = format!("The disruption budget {pdb} is still being processed by the server.");
    too_many_requests(cause, 10)
}

/// Sets `cond` in the condition list at `list` by type; the old `lastTransitionTime` stays
/// when the status does not change (`UpdatePodCondition`, `SetStatusCondition`).
fn set_condition(list: &mut Value, mut cond: Value) {
    let mut conds = list.as_array().cloned().unwrap_or_default();
    match conds.iter_mut().find(|c| c["type"] == cond["type"]) {
        Some(c) => {
            if c["status"] == cond["status"] {
                cond["lastTransitionTime"] = c["lastTransitionTime"].clone();
            }
            *c = cond;
        }
        None => conds.push(cond),
    }
    *list = Value::Array(conds);
}

/// `checkAndDecrement`: consumes one disruption of the PDB at `key` for pod `pod` (facts 6.4,
/// 6.5, 6.11); a dry run writes nothing. `Some`: the answer that refuses it.
fn check_and_decrement(
    state: &State,
    s: &mut Store,
    key: &Key,
    pod: &str,
    dry_run: bool,
) -> Option<Reply> {
    let Some(before) = s.pdbs.get(key).cloned() else {
        return Some(not_found(GROUP, PDBS, &key.1));
    };
    let (st, name) = (&before["status"], key.1.as_str());
    let count = |k: &str| st[k].as_i64().unwrap_or(0);
    if count("observedGeneration") < before["metadata"]["generation"].as_i64().unwrap_or(0) {
        return Some(still_processing(name));
    }
    let allowed = count("disruptionsAllowed");
    let forbidden = |msg: &str| Some(admission_forbidden(GROUP, "poddisruptionbudget", name, msg));
    if allowed < 0 {
        return forbidden("pdb disruptions allowed is negative");
    }
    if st["disruptedPods"]
        .as_object()
        .is_some_and(|d| d.len() > 2000)
    {
        let msg = "DisruptedPods map too big - too many evictions not confirmed by PDB controller";
        return forbidden(msg);
    }
    if allowed == 0 {
        let (desired, current) = (count("desiredHealthy"), count("currentHealthy"));
        let cause = format!(
            "The disruption budget {name} needs {desired} healthy pods and has {current} currently"
        );
        return Some(too_many_requests(cause, 0));
    }
    if dry_run {
        return None;
    }
    let mut next = before.clone();
    next["status"]["disruptionsAllowed"] = (allowed - 1).into();
    if allowed == 1 {
        // `UpdateDisruptionAllowedCondition`
        let cond = json!({"type": "DisruptionAllowed", "status": "False",
            "observedGeneration": st["observedGeneration"].clone(), "reason": "InsufficientPods",
            "message": "", "lastTransitionTime": now_rfc3339()});
        set_condition(&mut next["status"]["conditions"], cond);
    }
    next["status"]["disruptedPods"][pod] = now_rfc3339().into();
    s.commit(&state.events_tx, Kind::Pdb, Some(&before), next);
    None
}

/// `addConditionAndDeletePod`: the preconditions against the latest pod, `DisruptionTarget`
/// (fact 6.2), then the delete. `Some`: the failure's answer.
fn condition_and_delete(
    state: &Arc<State>,
    key: &Key,
    mut opts: Value,
    dry_run: bool,
) -> Option<Reply> {
    let (ns, name) = (key.0.as_str(), key.1.as_str());
    if !dry_run {
        let mut s = state.lock();
        let Some(before) = s.pods.get(key).cloned() else {
            return Some(not_found("", "pods", name));
        };
        let rv = str_at(&before, "/metadata/resourceVersion");
        for (what, field, have) in [
            ("UID", "uid", str_at(&before, "/metadata/uid")),
            ("ResourceVersion", "resourceVersion", rv),
        ] {
            let want = opts["preconditions"][field].as_str().unwrap_or("");
            if !want.is_empty() && want != have {
                return Some(conflict_precondition("Pod", name, what, want, have));
            }
        }
        let mut pod = before.clone();
        let cond = json!({"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI",
            "message": "Eviction API: evicting", "lastTransitionTime": now_rfc3339()});
        set_condition(&mut pod["status"]["conditions"], cond);
        let stored = s.commit(&state.events_tx, Kind::Pod, Some(&before), pod);
        // the condition's write moved the resourceVersion a precondition names
        if opts["preconditions"]["resourceVersion"].is_string() {
            opts["preconditions"]["resourceVersion"] =
                stored["metadata"]["resourceVersion"].clone();
        }
    }
    match pods::delete_admitted(state, ns, name, &opts, dry_run) {
        (200, _) => None,
        (code, v) => Some(respond(code, &v)),
    }
}

/// `POST …/pods/NAME/eviction`.
pub fn evict(state: &Arc<State>, req: &Req) -> Reply {
    let key: Key = (req.attrs.namespace.clone(), req.attrs.name.clone());
    let (name, body) = (key.1.as_str(), &req.body);
    // the create handler: the object's namespace must be the request's (empty: filled in)
    let body_ns = str_at(body, "/metadata/namespace");
    if !body_ns.is_empty() && body_ns != key.0 {
        return bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        );
    }
    // NodeRestriction (`admitPodEviction`), by the URL's name (fact 6.9)
    if let User::Node(node) = &req.user {
        let bound = state
            .lock()
            .pods
            .get(&key)
            .map(|p| str_at(p, "/spec/nodeName").to_owned());
        match bound {
            // the pod lister's NotFound: resource `pod`
            None => return not_found("", "pod", name),
            Some(n) if n != *node => {
                let msg =
                    format!("node {node} can only evict pods with spec.nodeName set to itself");
                return admission_forbidden("", "pods", name, &msg);
            }
            Some(_) => {}
        }
    }
    if str_at(body, "/metadata/name") != name {
        return bad_request("name in URL does not match name in Eviction object");
    }
    let mut opts = body
        .get("deleteOptions")
        .filter(|o| o.is_object())
        .cloned()
        .unwrap_or(json!({}));
    let dry_run = req.dry_run()
        || opts["dryRun"]
            .as_array()
            .is_some_and(|d| d.iter().any(|v| v == "All"));
    // the PDB whose budget a not-ready pod's delete must not race (fact 6.12)
    let mut guarded = None;
    {
        let mut s = state.lock();
        let Some(pod) = s.pods.get(&key).cloned() else {
            return not_found("", "pods", name);
        };
        let phase = str_at(&pod, "/status/phase");
        // canIgnorePDB (facts 6.3, 6.10): no budget for these
        let ignore = matches!(phase, "Pending" | "Succeeded" | "Failed");
        if !ignore && pod["metadata"]["deletionTimestamp"].is_null() {
            let labels = &pod["metadata"]["labels"];
            let matching: Vec<Key> = (s.pdbs.iter())
                .filter(|((pns, _), pdb)| {
                    *pns == key.0 && selects(&pdb["spec"]["selector"], labels)
                })
                .map(|(k, _)| k.clone())
                .collect();
            if matching.len() > 1 {
                let msg = "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.";
                return respond(500, &status_body(500, "", msg, json!({})));
            }
            if let Some(pdb_key) = matching.first() {
                let pdb = &s.pdbs[pdb_key];
                let count = |k: &str| pdb["status"][k].as_i64().unwrap_or(0);
                let desired = count("desiredHealthy");
                let always = pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow";
                let healthy_enough = count("currentHealthy") >= desired && desired > 0;
                if !is_ready(&pod) && (always || healthy_enough) {
                    if !opts["preconditions"]["resourceVersion"].is_string() {
                        opts["preconditions"]["resourceVersion"] =
                            pod["metadata"]["resourceVersion"].clone();
                        guarded = Some(pdb_key.1.clone());
                    }
                } else if let Some(r) = check_and_decrement(state, &mut s, pdb_key, name, dry_run) {
                    return r;
                }
            }
        }
    }
    match condition_and_delete(state, &key, opts, dry_run) {
        None => success(201, None),
        Some(r) => match guarded {
            Some(pdb) if r.status() == 409 => still_processing(&pdb),
            _ => r,
        },
    }
}
