//! LIST and WATCH of every resource (the apiserver's watch cache and `etcd3` watcher).
//!
//! Facts implemented here (`../shared/reference/apiserver-facts.md`):
//! * 7.1: a watch from before the compaction point: 200, one `ERROR` (410 `Expired`), the end;
//! * 7.2: LIST `resourceVersionMatch=Exact` before the compaction point → 410; `rv=1` → now;
//! * 7.3: LIST from a future version: 504 `Timeout` after 3 s; a watch from it stays silent;
//! * 7.4: a watch without rv or with `0`: `ADDED`s, then (bookmarks) the initial-events-end one;
//! * 7.5: `sendInitialEvents=true`: the same, bookmark at the current rv; no rvMatch → 422;
//! * 7.6: bookmarks every [`State::bookmark_every`] and 1.7 s before `timeoutSeconds` ends,
//!   a bare Pod/Node with only `metadata.resourceVersion` (the last event of its resource);
//! * 7.7: the node's 403s come from the authorizer ([`super::authorization`]), not from here;
//! * field selectors (`=`, `==`, `!=`, the fields each resource indexes): an object leaving the
//!   selection is sent as `DELETED` (its prior content), one entering it as `ADDED`.
//!
//! Inferred from upstream, not measured: 400 `field label not supported: X`; the other 422s of
//! watch options; Exact LISTs within history; an initial-events watch from a future version
//! ends with an `ERROR` (the 504 body); `rv=0` is treated as no rv (`SetListOptionsDefaults`:
//! same `ADDED`s and bookmark). (`…/pods/NAME?watch=1` is a GET, not a watch: see
//! [`super::http::request_info`].) Approximation: after
//! [`super::ApiServer::compact`], an object changed since is assumed selected (or not) by its
//! new content when a watch replays from the compaction point (history keeps no prior object).
//! Left out: `labelSelector` (ignored: no caller uses
//! one); the 422s of list options; `limit`/`continue` (one page, as the watch cache served
//! them before v1.34; reaplet's lists are far below kube-rs's page size); a watch without
//! `timeoutSeconds` lasts 1800 s (the real server picks 1800–3600 s at random).

use super::http::Req;
use super::reply::{Reply, bad_request, respond, respond_with, status_body};
use super::store::{EventType, Kind, State, Store, WatchEvent, str_at};
use http_body_util::{BodyExt, StreamBody};
use hyper::Response;
use hyper::body::{Bytes, Frame};
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{broadcast, mpsc};
use tokio::time::Instant;

/// How long a read from a future resourceVersion waits for it (the watch cache's 3 s).
const FRESH_WAIT: Duration = Duration::from_secs(3);
/// The last bookmark comes this long before `timeoutSeconds` ends (measured 1.7 s).
const PRE_TIMEOUT: Duration = Duration::from_millis(1700);
const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

mod selection;
use selection::{Selection, parse_fields};

type Key = (String, String);

fn key(o: &Value) -> Key {
    let m = |f: &str| str_at(o, &format!("/metadata/{f}")).to_owned();
    (m("namespace"), m("name"))
}

fn objects(s: &Store, kind: Kind) -> BTreeMap<Key, Value> {
    match kind {
        Kind::Pod => s.pods.clone(),
        Kind::Node => s.nodes.values().map(|o| (key(o), o.clone())).collect(),
        Kind::Lease => s.leases.clone(),
        Kind::Pdb => s.pdbs.clone(),
    }
}

/// Every object of `kind` as it was at resourceVersion `at` (>= the compaction point): the
/// current objects with the later history undone. An object last written before the compaction
/// and changed after `at` is unknown; its first later version stands in for it.
fn snapshot(s: &Store, kind: Kind, at: u64) -> BTreeMap<Key, Value> {
    let mut objs = objects(s, kind);
    let evs = s.history.iter().filter(|e| e.kind == kind);
    let mut before: HashMap<Key, &WatchEvent> = HashMap::new();
    let mut undone: HashMap<Key, ()> = HashMap::new();
    for e in evs {
        let k = key(&e.obj);
        if e.rv <= at {
            before.insert(k, e);
        } else if undone.insert(k.clone(), ()).is_none() {
            match before.get(&k) {
                Some(p) if p.etype != EventType::Deleted => objs.insert(k, p.obj.clone()),
                Some(_) => objs.remove(&k),
                None if e.etype == EventType::Added => objs.remove(&k),
                None => objs.insert(k, e.obj.clone()),
            };
        }
    }
    objs
}

/// (list kind, kind, apiVersion).
fn kinds(kind: Kind) -> (&'static str, &'static str, &'static str) {
    match kind {
        Kind::Pod => ("PodList", "Pod", "v1"),
        Kind::Node => ("NodeList", "Node", "v1"),
        Kind::Lease => ("LeaseList", "Lease", "coordination.k8s.io/v1"),
        Kind::Pdb => (
            "PodDisruptionBudgetList",
            "PodDisruptionBudget",
            "policy/v1",
        ),
    }
}

/// A query flag as the API decodes a bool: anything but `false`/`0` is true.
fn flag(v: &str) -> bool {
    !matches!(v.to_ascii_lowercase().as_str(), "false" | "0")
}

/// `validateWatchOptions` (after `SetListOptionsDefaults`): the 422 body.
fn validate_watch(send_initial: Option<bool>, matching: &str) -> Result<(), Value> {
    let mut errs: Vec<(&str, String)> = Vec::new();
    if send_initial.is_some() && matching != "NotOlderThan" {
        let d = "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan";
        errs.push(("FieldValueForbidden", format!("Forbidden: {d}")));
    }
    if !matching.is_empty() && send_initial.is_none() {
        let d = "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided";
        errs.push(("FieldValueForbidden", format!("Forbidden: {d}")));
    }
    if !matching.is_empty() && matching != "NotOlderThan" {
        let d = format!("Unsupported value: \"{matching}\": supported values: \"NotOlderThan\"");
        errs.push(("FieldValueNotSupported", d));
    }
    if errs.is_empty() {
        return Ok(());
    }
    let text: Vec<String> = errs
        .iter()
        .map(|(_, d)| format!("resourceVersionMatch: {d}"))
        .collect();
    let text = match text.as_slice() {
        [one] => one.clone(),
        many => format!("[{}]", many.join(", ")),
    };
    let causes: Vec<Value> = errs
        .iter()
        .map(|(r, d)| json!({"reason": r, "message": d, "field": "resourceVersionMatch"}))
        .collect();
    let details = json!({"group": "meta.k8s.io", "kind": "ListOptions", "causes": causes});
    let msg = format!("ListOptions.meta.k8s.io \"\" is invalid: {text}");
    Err(status_body(422, "Invalid", &msg, details))
}

/// 504 for a resourceVersion the store has not reached (fact 7.3).
fn too_large(want: u64, current: u64) -> Value {
    let msg = format!("Timeout: Too large resource version: {want}, current: {current}");
    let causes =
        [json!({"reason": "ResourceVersionTooLarge", "message": "Too large resource version"})];
    let details = json!({"causes": causes, "retryAfterSeconds": 1});
    status_body(504, "Timeout", &msg, details)
}

/// Waits up to 3 s for the store to reach `want`; `Err(current)` if it does not.
async fn wait_fresh(state: &State, want: u64) -> Result<(), u64> {
    let deadline = Instant::now() + FRESH_WAIT;
    let mut rx = state.events_tx.subscribe();
    loop {
        let current = state.lock().rv;
        if current >= want {
            return Ok(());
        }
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Err(_) | Ok(Err(broadcast::error::RecvError::Closed)) => return Err(current),
            Ok(_) => {}
        }
    }
}

pub async fn list_or_watch(state: &Arc<State>, req: &Req, kind: Kind) -> Reply {
    let mut fields = match req.attrs.field_selector.as_deref() {
        Some(sel) => match parse_fields(kind, sel) {
            Ok(f) => f,
            Err(msg) => return bad_request(&msg),
        },
        None => vec![],
    };
    if state.faults.lock().unwrap().ignore_field_selectors {
        fields.clear();
    }
    let sel = Selection {
        kind,
        ns: (!req.attrs.namespace.is_empty()).then(|| req.attrs.namespace.clone()),
        fields,
    };
    let rv_text = req.q("resourceVersion").unwrap_or("");
    let mut matching = req.q("resourceVersionMatch").unwrap_or("");
    let mut send_initial = req.q("sendInitialEvents").map(flag);
    let legacy = rv_text.is_empty() || rv_text == "0";
    if req.is_watch() && legacy && send_initial.is_none() && matching.is_empty() {
        // SetListOptionsDefaults with WatchList on
        send_initial = Some(true);
        matching = "NotOlderThan";
    }
    if req.is_watch()
        && let Err(body) = validate_watch(send_initial, matching)
    {
        return respond(422, &body);
    }
    let parsed = (!rv_text.is_empty()).then(|| rv_text.parse::<u64>());
    let Ok(rv) = parsed.transpose() else {
        return bad_request(&format!("invalid resource version: {rv_text}"));
    };
    if req.is_watch() {
        return watch(state, req, sel, rv, send_initial == Some(true)).await;
    }
    if let Some(want) = rv.filter(|v| *v > state.lock().rv)
        && let Err(current) = wait_fresh(state, want).await
    {
        let retry = [("retry-after", "1".to_owned())];
        return respond_with(504, &too_large(want, current), &retry);
    }
    let s = state.lock();
    let (at, objs) = match rv {
        Some(at) if matching == "Exact" && at < s.compacted => {
            let msg = "The resourceVersion for the provided list is too old.";
            return respond(410, &status_body(410, "Expired", msg, json!({})));
        }
        Some(at) if matching == "Exact" && at < s.rv => (at, snapshot(&s, kind, at)),
        _ => (s.rv, objects(&s, kind)),
    };
    drop(s);
    let items: Vec<Value> = objs
        .into_values()
        .filter(|o| sel.matches(o))
        .map(|mut o| {
            if let Some(m) = o.as_object_mut() {
                m.remove("kind");
                m.remove("apiVersion");
            }
            o
        })
        .collect();
    let (list, _, api_version) = kinds(kind);
    let meta = json!({"resourceVersion": at.to_string()});
    respond(
        200,
        &json!({"kind": list, "apiVersion": api_version, "metadata": meta, "items": items}),
    )
}

fn line(etype: &str, obj: &Value) -> Bytes {
    Bytes::from(format!("{}\n", json!({"type": etype, "object": obj})))
}

fn bookmark(kind: Kind, rv: u64, initial_end: bool) -> Bytes {
    let (_, k, v) = kinds(kind);
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if initial_end {
        meta["annotations"] = json!({INITIAL_EVENTS_END: "true"});
    }
    line(
        "BOOKMARK",
        &json!({"kind": k, "apiVersion": v, "metadata": meta}),
    )
}

/// The event one watcher sees for a store event, given the objects it has (`view`).
fn transition(sel: &Selection, view: &mut HashMap<Key, Value>, ev: &WatchEvent) -> Option<Bytes> {
    let k = key(&ev.obj);
    let was = match ev.etype {
        EventType::Added => None,
        _ => view.remove(&k),
    };
    let now = ev.etype != EventType::Deleted && sel.matches(&ev.obj);
    if now {
        view.insert(k, ev.obj.clone());
    }
    match (was, now) {
        (None, true) => Some(line("ADDED", &ev.obj)),
        (Some(_), true) => Some(line("MODIFIED", &ev.obj)),
        (Some(mut prev), false) => {
            // gone, or out of the selection: its last selected content at this resourceVersion
            prev["metadata"]["resourceVersion"] = ev.rv.to_string().into();
            Some(line("DELETED", &prev))
        }
        (None, false) => None,
    }
}

async fn watch(
    state: &Arc<State>,
    req: &Req,
    sel: Selection,
    rv: Option<u64>,
    initial: bool,
) -> Reply {
    let kind = sel.kind;
    let bookmarks = req.q("allowWatchBookmarks").is_some_and(flag);
    let timeout = req.q("timeoutSeconds").and_then(|t| t.parse::<u64>().ok());
    let deadline = Instant::now() + Duration::from_secs(timeout.filter(|t| *t > 0).unwrap_or(1800));
    let (tx, rx) = mpsc::channel::<Bytes>(1024);
    let mut fresh = Ok(());
    if initial && let Some(want) = rv.filter(|v| *v > state.lock().rv) {
        fresh = wait_fresh(state, want).await;
    }
    let s = state.lock();
    let too_old = rv.filter(|v| !initial && *v != 0 && *v < s.compacted);
    let error = match (fresh, too_old) {
        (Err(current), _) => Some(too_large(rv.unwrap_or(0), current)),
        (_, Some(v)) => {
            let msg = format!("too old resource version: {v} ({})", s.compacted);
            Some(status_body(410, "Expired", &msg, json!({})))
        }
        _ => None,
    };
    if let Some(e) = error {
        let _ = tx.try_send(line("ERROR", &e));
        return stream_response(rx);
    }
    let mut live = state.events_tx.subscribe();
    let mut out = Vec::new();
    let mut view: HashMap<Key, Value>;
    let start = match rv.filter(|v| !initial && *v != 0) {
        Some(from) if from < s.rv => {
            view = snapshot(&s, kind, from)
                .into_iter()
                .filter(|(_, o)| sel.matches(o))
                .collect();
            let later = s.history.iter().filter(|e| e.kind == kind && e.rv > from);
            out.extend(later.filter_map(|e| transition(&sel, &mut view, e)));
            from
        }
        from => {
            let objs: Vec<(Key, Value)> = objects(&s, kind)
                .into_iter()
                .filter(|(_, o)| sel.matches(o))
                .collect();
            if initial {
                // the synthetic ADDEDs, in key order as the watch cache sends them
                out.extend(objs.iter().map(|(_, o)| line("ADDED", o)));
                if bookmarks {
                    out.push(bookmark(kind, s.rv, true));
                }
            }
            view = objs.into_iter().collect();
            from.unwrap_or(s.rv).max(s.rv)
        }
    };
    let mut last = s.rv;
    drop(s);
    let state = state.clone();
    // When the next bookmark is due: a period from now, or 1.7 s before the deadline.
    let next_bookmark = move || {
        let period = *state.bookmark_every.lock().unwrap();
        let now = Instant::now();
        let at = (now + period).min(deadline.checked_sub(PRE_TIMEOUT)?);
        (bookmarks && at > now).then_some(at)
    };
    tokio::spawn(async move {
        for b in out {
            if tx.send(b).await.is_err() {
                return;
            }
        }
        let mut next = next_bookmark();
        loop {
            let due = async {
                match next {
                    Some(t) => tokio::time::sleep_until(t).await,
                    None => std::future::pending().await,
                }
            };
            // bookmarks carry the last event of this resource seen, and only one above the
            // watch's own version is sent (the real cacher's `process`: a plain watch at that
            // version, or from a future one, gets none)
            let send = tokio::select! {
                _ = tokio::time::sleep_until(deadline) => return,
                _ = tx.closed() => return,
                _ = due => {
                    next = next_bookmark();
                    (last > start).then(|| bookmark(kind, last, false))
                }
                ev = live.recv() => match ev {
                    Ok(ev) if ev.kind == kind && ev.rv > last => {
                        last = ev.rv;
                        transition(&sel, &mut view, &ev).filter(|_| ev.rv > start)
                    }
                    Ok(_) => None,
                    // a watcher too slow for the broadcast is ended, as the cacher ends it
                    Err(_) => return,
                },
            };
            if let Some(b) = send
                && tx.send(b).await.is_err()
            {
                return;
            }
        }
    });
    stream_response(rx)
}

pub fn stream_response(rx: mpsc::Receiver<Bytes>) -> Reply {
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
    });
    Response::builder()
        .status(200)
        .header("content-type", "application/json")
        .body(StreamBody::new(stream).boxed())
        .expect("valid response")
}
