//! LIST and WATCH of every resource (the apiserver's watch cache and `etcd3` watcher).
//!
//! Facts implemented here: (to be completed: section 7).

use super::authorization::selector_terms;
use super::http::Req;
use super::reply::{Reply, respond, status_body};
use super::store::{Kind, State};
use http_body_util::{BodyExt, StreamBody};
use hyper::Response;
use hyper::body::{Bytes, Frame};
use serde_json::{Value, json};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{broadcast, mpsc};

fn field(obj: &Value, path: &str) -> String {
    let mut v = obj;
    for p in path.split('.') {
        v = &v[p];
    }
    v.as_str().unwrap_or("").to_owned()
}

/// `spec.nodeName=x,metadata.name=y` (`=`, `==`).
pub fn matches_fields(obj: &Value, selector: Option<&str>) -> bool {
    let Some(sel) = selector else { return true };
    selector_terms(sel)
        .iter()
        .all(|(k, v)| field(obj, k) == *v)
}

fn list_kind(kind: Kind) -> &'static str {
    match kind {
        Kind::Pod => "PodList",
        Kind::Node => "NodeList",
        Kind::Lease => "LeaseList",
        Kind::Pdb => "PodDisruptionBudgetList",
    }
}

pub async fn list_or_watch(state: &Arc<State>, req: &Req, kind: Kind) -> Reply {
    let ns = (!req.attrs.namespace.is_empty()).then(|| req.attrs.namespace.clone());
    let selector = req
        .attrs
        .field_selector
        .clone()
        .filter(|_| !state.faults.lock().unwrap().ignore_field_selectors);
    let in_scope = |o: &Value| {
        ns.as_deref()
            .is_none_or(|n| o["metadata"]["namespace"].as_str() == Some(n))
            && matches_fields(o, selector.as_deref())
    };
    let s = state.lock();
    let current: Vec<Value> = match kind {
        Kind::Pod => s.pods.values().filter(|o| in_scope(o)).cloned().collect(),
        Kind::Node => s.nodes.values().filter(|o| in_scope(o)).cloned().collect(),
        Kind::Lease => s.leases.values().filter(|o| in_scope(o)).cloned().collect(),
        Kind::Pdb => s.pdbs.values().filter(|o| in_scope(o)).cloned().collect(),
    };
    if !req.is_watch() {
        return respond(
            200,
            &json!({"kind": list_kind(kind), "apiVersion": "v1", "metadata": {"resourceVersion": s.rv.to_string()}, "items": current}),
        );
    }
    let from: Option<u64> = req
        .q("resourceVersion")
        .and_then(|v| v.parse().ok())
        .filter(|v| *v != 0);
    let (tx, rx) = mpsc::channel::<Bytes>(1024);
    let line =
        |etype: &str, obj: &Value| Bytes::from(format!("{}\n", json!({"type": etype, "object": obj})));
    if let Some(rv) = from
        && rv < s.compacted
    {
        let gone = status_body(
            410,
            "Expired",
            &format!("too old resource version: {rv} ({})", s.compacted),
            json!({}),
        );
        let _ = tx.try_send(line("ERROR", &gone));
        drop(tx);
        return stream_response(rx);
    }
    let mut live = state.events_tx.subscribe();
    let mut last = s.rv;
    match from {
        Some(rv) => {
            for ev in s
                .history
                .iter()
                .filter(|e| e.rv > rv && e.kind == kind && in_scope(&e.obj))
            {
                let _ = tx.try_send(line(ev.etype.as_str(), &ev.obj));
            }
        }
        None => {
            for o in &current {
                let _ = tx.try_send(line("ADDED", o));
            }
        }
    }
    drop(s);
    let timeout = req
        .q("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .unwrap_or(1800);
    tokio::spawn(async move {
        let deadline = tokio::time::sleep(Duration::from_secs(timeout));
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                _ = &mut deadline => return,
                ev = live.recv() => match ev {
                    Ok(ev) => {
                        if ev.rv <= last || ev.kind != kind {
                            continue;
                        }
                        last = ev.rv;
                        let scope = ns.as_deref().is_none_or(|n| ev.obj["metadata"]["namespace"].as_str() == Some(n))
                            && matches_fields(&ev.obj, selector.as_deref());
                        if scope && tx.send(line(ev.etype.as_str(), &ev.obj)).await.is_err() {
                            return;
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => return,
                    Err(broadcast::error::RecvError::Closed) => return,
                },
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
