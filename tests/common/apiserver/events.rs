//! Events: core/v1 `events` and `events.k8s.io/v1` (the kubelet's recorder writes core/v1).
//! Both are views of one stored object, kept here in its core/v1 form (as
//! [`super::ApiServer::events`] returns them); an `events.k8s.io` request is converted on the
//! way in and out (`pkg/apis/events/v1` conversion). Validation is
//! `pkg/apis/core/validation/events.go`: legacy rules for core/v1, strict ones for
//! `events.k8s.io/v1`.
//!
//! Facts implemented here:
//! * 10.1: a node creates core/v1 events about any object (also another node's pod), without
//!   `firstTimestamp`/`lastTimestamp`/`count`, with any `type` (no NodeRestriction for events);
//! * 10.2: a core Event in another namespace than its `involvedObject` is 422 `Event "<name>"
//!   is invalid: involvedObject.namespace: Invalid value: "default": does not match ...`;
//! * 10.3: a node may PATCH events (strategic, merge, JSON patch) and PUT them; GET and DELETE
//!   are the authorizer's 403s;
//! * 10.4: `events.k8s.io/v1` create `201` (`eventTime` kept to the microsecond, any
//!   `reportingInstance`); no `eventTime` 422 `eventTime: Required value`; merge PATCH of
//!   `series` `200`; read through core/v1: `message` = `note`, `source: {}`,
//!   `firstTimestamp`/`lastTimestamp` null, no `count`;
//! * 11.1: resourceVersion +1 per write; a no-op write keeps it.
//!
//! Inferred from upstream, not measured: the rest of the strict `events.k8s.io` create rules
//! (`type` Normal/Warning, `reportingController`/`reportingInstance`/`action`/`reason`
//! required, no deprecated fields), `series` validation on update, core/v1 events with an
//! `eventTime` needing `reportingComponent` etc. Left out: the update immutability rules of
//! `events.k8s.io` (not measured, nothing here changes those fields), events' TTL, LIST (no
//! caller; this handler answers 404 for it) and WATCH of events (no watch events are emitted).

use super::http::Req;
use super::patch::{PatchType, apply};
use super::pods::{manager, touch_managed_fields};
use super::reply::{Reply, bad_request, invalid, not_found, respond, success};
use super::store::{State, Store, now_rfc3339, same_but_rv, str_at};
use serde_json::{Value, json};
use std::sync::Arc;

/// (events.k8s.io/v1 field, core/v1 field) pairs that are renamed between the two.
const RENAMED: [(&str, &str); 8] = [
    ("regarding", "involvedObject"),
    ("note", "message"),
    ("reportingController", "reportingComponent"),
    ("reportingInstance", "reportingInstance"),
    ("deprecatedSource", "source"),
    ("deprecatedFirstTimestamp", "firstTimestamp"),
    ("deprecatedLastTimestamp", "lastTimestamp"),
    ("deprecatedCount", "count"),
];

/// Fields both versions share.
const SHARED: [&str; 7] = [
    "eventTime",
    "series",
    "related",
    "action",
    "reason",
    "type",
    "metadata",
];

fn is_events_group(req: &Req) -> bool {
    req.attrs.group == "events.k8s.io"
}

/// An events.k8s.io/v1 Event as the stored core/v1 one, serialized as the server does.
fn to_core(ev: &Value) -> Value {
    let mut out = json!({"apiVersion": "v1", "kind": "Event"});
    for (new, old) in RENAMED {
        out[old] = ev[new].clone();
    }
    for k in SHARED {
        out[k] = ev[k].clone();
    }
    render_core(out)
}

/// A core/v1 Event with Go's serialization of its zero values: structs always present
/// (`involvedObject`, `source`), zero times `null`, `omitempty` strings and `count` dropped,
/// `reportingComponent`/`reportingInstance` always present.
fn render_core(mut ev: Value) -> Value {
    ev["apiVersion"] = "v1".into();
    ev["kind"] = "Event".into();
    for k in ["involvedObject", "source"] {
        if !ev[k].is_object() {
            ev[k] = json!({});
        }
    }
    for k in ["firstTimestamp", "lastTimestamp", "eventTime"] {
        if ev[k].as_str().is_none_or(str::is_empty) {
            ev[k] = Value::Null;
        }
    }
    for k in ["reportingComponent", "reportingInstance"] {
        if !ev[k].is_string() {
            ev[k] = "".into();
        }
    }
    if let Some(m) = ev.as_object_mut() {
        m.retain(|k, v| match k.as_str() {
            "reason" | "message" | "type" | "action" => v.as_str().is_some_and(|s| !s.is_empty()),
            "count" => v.as_i64().is_some_and(|c| c != 0),
            "series" | "related" => !v.is_null(),
            _ => true,
        });
    }
    ev
}

/// The stored core/v1 Event as events.k8s.io/v1 serializes it.
fn to_events_v1(ev: &Value) -> Value {
    let mut out = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event"});
    for (new, old) in RENAMED {
        out[new] = ev[old].clone();
    }
    for k in SHARED {
        out[k] = ev[k].clone();
    }
    for k in ["regarding", "deprecatedSource"] {
        if !out[k].is_object() {
            out[k] = json!({});
        }
    }
    if let Some(m) = out.as_object_mut() {
        m.retain(|k, v| match k.as_str() {
            "eventTime" | "deprecatedFirstTimestamp" | "deprecatedLastTimestamp" => true,
            "deprecatedCount" => v.as_i64().is_some_and(|c| c != 0),
            _ => !v.is_null() && v.as_str() != Some(""),
        });
    }
    out
}

/// The stored event as the request's group shows it.
fn view(req: &Req, stored: &Value) -> Value {
    if is_events_group(req) {
        to_events_v1(stored)
    } else {
        stored.clone()
    }
}

type FieldError = (&'static str, &'static str, String);

fn required(field: &'static str) -> FieldError {
    (field, "FieldValueRequired", "Required value".to_owned())
}

fn invalid_value(field: &'static str, value: &str, detail: &str) -> FieldError {
    (
        field,
        "FieldValueInvalid",
        format!("Invalid value: \"{value}\": {detail}"),
    )
}

/// `legacyValidateEvent`, for every event (`ev` in its core/v1 form).
fn legacy_errors(ev: &Value, strict: bool) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let ns = str_at(ev, "/metadata/namespace");
    let involved_ns = str_at(ev, "/involvedObject/namespace");
    let mismatch = invalid_value(
        "involvedObject.namespace",
        involved_ns,
        "does not match event.namespace",
    );
    let s = |k: &str| ev[k].as_str().unwrap_or("").to_owned();
    if ev["eventTime"].is_null() {
        let ok = if involved_ns.is_empty() {
            ns.is_empty() || ns == "default"
        } else {
            ns == involved_ns
        };
        if !ok {
            errs.push(mismatch);
        }
    } else {
        if involved_ns.is_empty() && ns != "default" && ns != "kube-system" {
            errs.push(mismatch);
        }
        let controller = if strict {
            "reportingController"
        } else {
            "reportingComponent"
        };
        for (field, value) in [
            (controller, s("reportingComponent")),
            ("reportingInstance", s("reportingInstance")),
            ("action", s("action")),
            ("reason", s("reason")),
        ] {
            if value.is_empty() {
                errs.push(required(field));
            }
        }
    }
    errs
}

/// The strict rules of an `events.k8s.io/v1` create.
fn strict_create_errors(ev: &Value) -> Vec<FieldError> {
    let mut errs = series_errors(ev);
    if ev["eventTime"].is_null() {
        errs.push(required("eventTime"));
    }
    let t = ev["type"].as_str().unwrap_or("");
    if t != "Normal" && t != "Warning" {
        errs.push(invalid_value(
            "type",
            "",
            &format!("has invalid value: {t}"),
        ));
    }
    for k in ["firstTimestamp", "lastTimestamp", "count"] {
        if !ev[k].is_null() {
            errs.push(invalid_value(k, "", "needs to be unset"));
        }
    }
    if ev["source"].as_object().is_some_and(|s| !s.is_empty()) {
        errs.push(invalid_value("source", "", "needs to be unset"));
    }
    errs
}

fn series_errors(ev: &Value) -> Vec<FieldError> {
    let series = &ev["series"];
    let mut errs = Vec::new();
    if series.is_object() {
        if series["count"].as_i64().unwrap_or(0) < 2 {
            errs.push(invalid_value("series.count", "", "should be at least 2"));
        }
        if series["lastObservedTime"].is_null() {
            errs.push(required("series.lastObservedTime"));
        }
    }
    errs
}

pub fn handle(state: &Arc<State>, req: &Req) -> Reply {
    let a = &req.attrs;
    match a.verb.as_str() {
        "create" => create(state, req),
        "get" => match state
            .lock()
            .events
            .get(&(a.namespace.clone(), a.name.clone()))
        {
            Some(e) => respond(200, &view(req, e)),
            None => not_found(&a.group, "events", &a.name),
        },
        "update" | "patch" => update(state, req),
        "delete" => {
            let mut s = state.lock();
            let Some(ev) = s.events.remove(&(a.namespace.clone(), a.name.clone())) else {
                return not_found(&a.group, "events", &a.name);
            };
            s.bump();
            let mut d = json!({"name": a.name, "kind": "events",
                               "uid": str_at(&ev, "/metadata/uid")});
            if !a.group.is_empty() {
                d["group"] = a.group.clone().into();
            }
            success(200, Some(d))
        }
        _ => super::reply::no_route(&req.method, &req.path),
    }
}

fn store(s: &mut Store, mut ev: Value) -> Value {
    let rv = s.bump();
    ev["metadata"]["resourceVersion"] = rv.to_string().into();
    let key = (
        str_at(&ev, "/metadata/namespace").to_owned(),
        str_at(&ev, "/metadata/name").to_owned(),
    );
    s.events.insert(key, ev.clone());
    ev
}

fn create(state: &Arc<State>, req: &Req) -> Reply {
    let ns = req.attrs.namespace.clone();
    if !req.body.is_object() {
        return bad_request("the body of the request is not an Event");
    }
    let body_ns = str_at(&req.body, "/metadata/namespace");
    if !body_ns.is_empty() && body_ns != ns {
        return bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        );
    }
    let strict = is_events_group(req);
    let mut ev = if strict {
        to_core(&req.body)
    } else {
        render_core(req.body.clone())
    };
    let mut s = state.lock();
    if !s.has_namespace(&ns) {
        return not_found("", "namespaces", &ns);
    }
    ev["metadata"]["namespace"] = ns.clone().into();
    if str_at(&ev, "/metadata/name").is_empty()
        && let Some(prefix) = ev["metadata"]["generateName"]
            .as_str()
            .filter(|p| !p.is_empty())
    {
        let prefix = prefix.to_owned();
        let uid = s.new_uid();
        ev["metadata"]["name"] = format!("{prefix}{}", &uid[uid.len() - 5..]).into();
    }
    let name = str_at(&ev, "/metadata/name").to_owned();
    let mut errs = legacy_errors(&ev, strict);
    if strict {
        errs.extend(strict_create_errors(&ev));
    }
    if name.is_empty() {
        errs.insert(
            0,
            (
                "metadata.name",
                "FieldValueRequired",
                "Required value: name or generateName is required".into(),
            ),
        );
    }
    if !errs.is_empty() {
        return invalid("Event", "", &name, &errs);
    }
    if s.events.contains_key(&(ns, name.clone())) {
        return super::reply::already_exists(&req.attrs.group, "events", &name);
    }
    let m = &mut ev["metadata"];
    m["uid"] = s.new_uid().into();
    m["creationTimestamp"] = now_rfc3339().into();
    if let Some(m) = m.as_object_mut() {
        m.remove("resourceVersion");
    }
    touch_managed_fields(&mut ev, &manager(&req.user_agent), "Update", "");
    let stored = store(&mut s, ev);
    respond(201, &view(req, &stored))
}

fn update(state: &Arc<State>, req: &Req) -> Reply {
    let a = &req.attrs;
    let mut s = state.lock();
    let key = (a.namespace.clone(), a.name.clone());
    let Some(before) = s.events.get(&key).cloned() else {
        return not_found(&a.group, "events", &a.name);
    };
    let strict = is_events_group(req);
    let put = req.method == "PUT";
    let sent = if put {
        if !req.body.is_object() {
            return bad_request("the body of the request is not an Event");
        }
        let body_name = str_at(&req.body, "/metadata/name");
        if body_name != a.name {
            return bad_request(&format!(
                "the name of the object ({body_name}) does not match the name on the URL ({})",
                a.name
            ));
        }
        req.body.clone()
    } else {
        let Some(t) = PatchType::from_content_type(&req.content_type) else {
            return super::reply::unsupported_media_type(true);
        };
        let mut current = view(req, &before);
        if let Err(e) = apply(t, &mut current, &req.body) {
            return bad_request(&e);
        }
        current
    };
    let sent_rv = if put {
        str_at(&sent, "/metadata/resourceVersion").to_owned()
    } else {
        str_at(&req.body, "/metadata/resourceVersion").to_owned()
    };
    if !sent_rv.is_empty() && sent_rv != str_at(&before, "/metadata/resourceVersion") {
        return super::reply::conflict_modified(&a.group, "events", &a.name);
    }
    let mut next = if strict {
        to_core(&sent)
    } else {
        render_core(sent)
    };
    for k in ["namespace", "uid", "creationTimestamp", "managedFields"] {
        next["metadata"][k] = before["metadata"][k].clone();
    }
    let mut errs = legacy_errors(&next, strict);
    if strict && next["series"] != before["series"] {
        errs.extend(series_errors(&next));
    }
    if !errs.is_empty() {
        return invalid("Event", "", &a.name, &errs);
    }
    if same_but_rv(&before, &next) {
        return respond(200, &view(req, &before));
    }
    touch_managed_fields(&mut next, &manager(&req.user_agent), "Update", "");
    let stored = store(&mut s, next);
    respond(200, &view(req, &stored))
}
