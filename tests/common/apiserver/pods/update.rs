//! An admin's PUT or PATCH of a pod object: which spec fields may change (11.3), generation
//! (11.2), and the last finalizer of a due pod going (2.5). Nodes never get here (5.6).

use super::*;

/// The spec fields an update may change, as the 422 lists them (fact 11.3).
const MUTABLE_SPEC: &str = "`spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)";

/// `new`'s spec with what an update may change taken from `old` (`ValidatePodUpdate`'s munging).
fn munged_spec(old: &Value, new: &Value) -> Value {
    let mut m = new.clone();
    for list in ["containers", "initContainers"] {
        if let Some(cs) = m.get_mut(list).and_then(Value::as_array_mut) {
            for (i, c) in cs.iter_mut().enumerate() {
                c["image"] = old[list][i]["image"].clone();
            }
        }
    }
    for k in ["activeDeadlineSeconds", "tolerations", "schedulingGates"] {
        m[k] = old[k].clone();
    }
    if old["terminationGracePeriodSeconds"]
        .as_i64()
        .is_some_and(|g| g < 0)
        && new["terminationGracePeriodSeconds"] == 1
    {
        m["terminationGracePeriodSeconds"] = old["terminationGracePeriodSeconds"].clone();
    }
    if let Some(o) = m.as_object_mut() {
        o.retain(|_, v| !v.is_null());
    }
    m
}

/// A diff of two specs in the spirit of `cmp.Diff`: a line per changed field.
fn spec_diff(old: &Value, new: &Value) -> String {
    let empty = serde_json::Map::new();
    let (o, n) = (
        old.as_object().unwrap_or(&empty),
        new.as_object().unwrap_or(&empty),
    );
    let mut keys: Vec<&String> = o.keys().chain(n.keys()).collect();
    keys.sort();
    keys.dedup();
    let go = |k: &str| k[..1].to_uppercase() + &k[1..];
    let mut out = String::from("  core.PodSpec{\n");
    let same = keys.iter().filter(|k| o.get(**k) == n.get(**k)).count();
    out.push_str(&format!("  \t... // {same} identical fields\n"));
    for k in keys.into_iter().filter(|k| o.get(*k) != n.get(*k)) {
        let show = |v: Option<&Value>| v.map_or("nil".to_owned(), Value::to_string);
        out.push_str(&format!(
            "- \t{}: {},\n+ \t{}: {},\n",
            go(k),
            show(o.get(k)),
            go(k),
            show(n.get(k))
        ));
    }
    out.push_str("  }\n");
    out
}

/// `ValidatePodUpdate`'s rules for the spec (fact 11.3).
fn validate_spec_update(old: &Value, new: &Value) -> Vec<(String, &'static str, String)> {
    let mut errs = Vec::new();
    for list in ["containers", "initContainers"] {
        let len = |v: &Value| v[list].as_array().map_or(0, Vec::len);
        if len(old) != len(new) {
            let msg = "Forbidden: pod updates may not add or remove containers".to_owned();
            return vec![(format!("spec.{list}"), "FieldValueForbidden", msg)];
        }
    }
    let (old_ads, new_ads) = (
        old["activeDeadlineSeconds"].as_i64(),
        new["activeDeadlineSeconds"].as_i64(),
    );
    match (old_ads, new_ads) {
        (_, Some(n)) if !(0..=i64::from(i32::MAX)).contains(&n) => errs.push((
            "spec.activeDeadlineSeconds".into(),
            "FieldValueInvalid",
            format!("Invalid value: {n}: must be between 0 and 2147483647, inclusive"),
        )),
        (Some(o), Some(n)) if o < n => errs.push((
            "spec.activeDeadlineSeconds".into(),
            "FieldValueInvalid",
            format!("Invalid value: {n}: must be less than or equal to previous value"),
        )),
        (Some(_), None) => errs.push((
            "spec.activeDeadlineSeconds".into(),
            "FieldValueInvalid",
            "Invalid value: \"null\": must not update from a positive integer to nil value".into(),
        )),
        _ => {}
    }
    // only additions to tolerations (an existing one may change its tolerationSeconds)
    let news = new["tolerations"].as_array().cloned().unwrap_or_default();
    let kept = old["tolerations"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .all(|t| {
            news.iter().any(|n| {
                let mut t = t.clone();
                t["tolerationSeconds"] = n["tolerationSeconds"].clone();
                if let Some(m) = t.as_object_mut() {
                    m.retain(|_, v| !v.is_null());
                }
                &t == n
            })
        });
    if !kept {
        errs.push((
            "spec.tolerations".into(),
            "FieldValueForbidden",
            "Forbidden: existing toleration can not be modified except its tolerationSeconds"
                .into(),
        ));
    }
    let munged = munged_spec(old, new);
    if &munged != old {
        let detail = format!(
            "Forbidden: pod updates may not change fields other than {MUTABLE_SPEC}\n{}",
            spec_diff(old, &munged)
        );
        errs.push(("spec".into(), "FieldValueForbidden", detail));
    }
    errs
}

/// `ValidatePodSpecificAnnotationUpdates`: the mirror annotation may not come or go.
pub fn mirror_annotation_errors(old: &Value, new: &Value) -> Vec<(String, &'static str, String)> {
    let field = format!("metadata.annotations[{MIRROR_ANNOTATION}]");
    let (o, n) = (
        &old["metadata"]["annotations"][MIRROR_ANNOTATION],
        &new["metadata"]["annotations"][MIRROR_ANNOTATION],
    );
    match (o.is_null(), n.is_null()) {
        (true, false) => vec![(
            field,
            "FieldValueForbidden",
            "Forbidden: may not add mirror pod annotation".into(),
        )],
        (false, _) if o != n => vec![(
            field,
            "FieldValueForbidden",
            "Forbidden: may not remove or update mirror pod annotation".into(),
        )],
        _ => vec![],
    }
}

/// An admin's PUT or PATCH of a pod object (nodes are refused by the authorizer, fact 5.6).
pub(super) fn update(state: &Arc<State>, req: &Req) -> Reply {
    let a = &req.attrs;
    let mut s = state.lock();
    let key = (a.namespace.clone(), a.name.clone());
    let Some(before) = s.pods.get(&key).cloned() else {
        return not_found("", "pods", &a.name);
    };
    let mut next = before.clone();
    if req.method == "PUT" {
        next = req.body.clone();
    } else {
        let t = PatchType::from_content_type(&req.content_type).unwrap_or(PatchType::Merge);
        if let Err(e) = apply(t, &mut next, &req.body) {
            return super::super::reply::bad_request(&e);
        }
    }
    let sent_rv = str_at(&next, "/metadata/resourceVersion");
    if !sent_rv.is_empty() && sent_rv != str_at(&before, "/metadata/resourceVersion") {
        return conflict_modified("", "pods", &a.name);
    }
    // ValidateObjectMetaUpdate (generic and the pod's) and ValidatePodUpdate
    let mut errors = Vec::new();
    errors.extend(uid_errors(&before, &next));
    errors.extend(mirror_annotation_errors(&before, &next));
    errors.extend(validate_spec_update(&before["spec"], &next["spec"]));
    if !errors.is_empty() {
        let refs: Vec<(&str, &str, String)> = errors
            .iter()
            .map(|(f, r, d)| (f.as_str(), *r, d.clone()))
            .collect();
        return invalid("Pod", "", &a.name, &refs);
    }
    // what an update never changes (podStrategy.PrepareForUpdate, rest.BeforeUpdate)
    next["status"] = before["status"].clone();
    for k in [
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "namespace",
        "name",
        "generation",
    ] {
        next["metadata"][k] = before["metadata"][k].clone();
    }
    if let Some(m) = next["metadata"].as_object_mut() {
        m.retain(|_, v| !v.is_null());
    }
    if before["spec"] != next["spec"]
        && let Some(g) = before["metadata"]["generation"].as_i64()
    {
        next["metadata"]["generation"] = (g + 1).into();
    }
    touch_managed_fields(&mut next, &manager(&req.user_agent), "Update", "");
    // shouldDeleteDuringUpdate: the last finalizer of a pod with dgps 0 went: deleted instead of
    // updated (no MODIFIED); the answer shows the update with the old resourceVersion (fact 2.5)
    if finalizers(&next).is_empty()
        && !finalizers(&before).is_empty()
        && before["metadata"]["deletionGracePeriodSeconds"] == 0
    {
        remove(state, &mut s, next.clone());
        return respond(200, &next);
    }
    let stored = s.commit(&state.events_tx, Kind::Pod, Some(&before), next);
    respond(200, &stored)
}
