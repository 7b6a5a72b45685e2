//! Posting pod events to the API: kubelet's `EventBroadcaster` / `record` sink, with its own
//! rate limit (kubelet: `--event-qps`, `--event-burst`).
//!
//! Invariants: events are best-effort: a failure is logged, never retried into a flood; the
//! pipeline never waits for them (the [`crate::events::EventSink`] channel drops when full).

use super::RateLimiter;
use crate::events::{NodeEvent, PodEvent};
use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::PostParams;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// The `source.component` and `reportingComponent` of reaplet's events.
pub const COMPONENT: &str = "reaplet";

/// An event as the kubelet's recorder writes one: `involved` in `namespace`, from this node.
fn event(
    namespace: &str,
    involved: ObjectReference,
    reason: &str,
    message: &str,
    warning: bool,
    node: &str,
) -> Event {
    let now = jiff::Timestamp::now();
    let about = involved.name.clone().unwrap_or_default();
    Event {
        metadata: ObjectMeta {
            name: Some(format!("{about}.{:x}", now.as_nanosecond())),
            namespace: Some(namespace.into()),
            ..ObjectMeta::default()
        },
        involved_object: involved,
        reason: Some(reason.into()),
        message: Some(message.into()),
        type_: Some(if warning { "Warning" } else { "Normal" }.into()),
        source: Some(EventSource {
            component: Some(COMPONENT.into()),
            host: Some(node.into()),
        }),
        first_timestamp: Some(Time(now)),
        last_timestamp: Some(Time(now)),
        count: Some(1),
        reporting_component: Some(COMPONENT.into()),
        reporting_instance: Some(node.into()),
        ..Event::default()
    }
}

fn to_api(ev: &PodEvent, node: &str) -> Event {
    let pod = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: Some(ev.name.clone()),
        namespace: Some(ev.namespace.clone()),
        uid: Some(ev.uid.to_string()),
        ..ObjectReference::default()
    };
    let warning = ev.reason.is_warning();
    let mut e = event(
        &ev.namespace,
        pod,
        ev.reason.as_str(),
        &ev.message,
        warning,
        node,
    );
    if !ev.annotations.is_empty() {
        e.metadata.annotations = Some(ev.annotations.clone());
    }
    e
}

/// An event about this node, as the kubelet records them: in `default`, the involved object
/// the Node with the node's name for its UID (the kubelet's `nodeRef`). Node events are
/// warnings but for `Shutdown`, which the kubelet records as Normal.
fn node_to_api(ev: &NodeEvent, node: &str) -> Event {
    let this = ObjectReference {
        kind: Some("Node".into()),
        name: Some(node.into()),
        uid: Some(node.into()),
        ..ObjectReference::default()
    };
    event(
        "default",
        this,
        ev.reason.as_str(),
        &ev.message,
        ev.reason.is_warning(),
        node,
    )
}

/// Posts events from `rx` (pods) and `node_rx` (this node) until cancelled.
pub async fn run(
    client: kube::Client,
    node: String,
    mut rx: mpsc::Receiver<PodEvent>,
    mut node_rx: mpsc::Receiver<NodeEvent>,
    limiter: RateLimiter,
    health: super::health::ApiHealth,
    cancel: CancellationToken,
) {
    loop {
        let (namespace, event, reason) = tokio::select! {
            _ = cancel.cancelled() => return,
            ev = rx.recv() => match ev {
                Some(ev) => (ev.namespace.clone(), to_api(&ev, &node), ev.reason.as_str()),
                None => return,
            },
            Some(ev) = node_rx.recv() => ("default".to_string(), node_to_api(&ev, &node), ev.reason.as_str()),
        };
        // best effort: a failed post is not retried; while the server is unreachable the
        // event waits for it (the prober tries for everyone; the channel is bounded and its
        // senders drop what does not fit, so a long outage keeps the oldest events)
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = health.reachable() => {}
        }
        limiter.acquire().await;
        let api: kube::Api<Event> = kube::Api::namespaced(client.clone(), &namespace);
        match super::bounded(api.create(&PostParams::default(), &event)).await {
            Ok(_) => health.answered(),
            Err(e) => {
                health.failed(e.failure());
                tracing::debug!(err = %e, reason, "posting an event failed");
            }
        }
    }
}
