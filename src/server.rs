//! The local status endpoint (kubelet: its healthz and metrics servers): `/metrics` (the
//! Prometheus text format 0.0.4, or OpenMetrics when the `Accept` header prefers it),
//! `/healthz` (the main loop is alive), `/readyz` (runtime connected and answering, every pod
//! source listed once, the node's name not known to be wrong), `/pods` (JSON: what the agent sees, for `reaplet pods`) and
//! `/pods/timeline?pod=NAMESPACE/NAME|UID` (one termination's timeline, [`crate::timeline`]).
//!
//! Invariants: loopback by default (the address is a setting); read-only; one small HTTP/1.1
//! server, no request reads more than its head.

use crate::metrics::Exposition;
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

/// What the server reports; implemented by the agent.
pub trait AgentState: Send + Sync + 'static {
    fn metrics_text(&self, format: Exposition) -> String;
    /// `Err(why)` when the main loop is wedged.
    fn live(&self) -> Result<(), String>;
    /// `Err(why)` until the runtime answered and every pod source listed once, while the
    /// runtime is stalled, and while the node's name is known to be wrong (a runtime pod's
    /// object bound to another node: [`crate::workers::PodWorkers::identity_problem`]).
    fn ready(&self) -> Result<(), String>;
    /// `/pods` as JSON.
    fn pods_json(&self) -> serde_json::Value;
    /// `/pods/timeline?pod=NAMESPACE/NAME|UID`: the newest kept termination timeline of that
    /// pod ([`crate::timeline`]), as JSON.
    fn timeline_json(&self, _query: &crate::timeline::Query) -> Option<serde_json::Value> {
        None
    }
}

/// `%XX` escapes and `+` of a query value decoded; a malformed escape is kept as it is.
fn query_value(query: Option<&str>, key: &str) -> Option<String> {
    let raw = query?
        .split('&')
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))?;
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = |b: u8| (b as char).to_digit(16);
                match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                    (Some(h), Some(l)) => {
                        out.push((h * 16 + l) as u8);
                        i += 3;
                        continue;
                    }
                    _ => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).ok()
}

fn reply(code: u16, ctype: &str, body: String) -> Response<Full<Bytes>> {
    Response::builder()
        .status(code)
        .header("content-type", ctype)
        .body(Full::new(Bytes::from(body)))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}

fn route(state: &dyn AgentState, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    let accept = req
        .headers()
        .get(http::header::ACCEPT)
        .and_then(|v| v.to_str().ok());
    respond(
        state,
        req.method().as_str(),
        req.uri().path(),
        req.uri().query(),
        accept,
    )
}

fn respond(
    state: &dyn AgentState,
    method: &str,
    path: &str,
    query: Option<&str>,
    accept: Option<&str>,
) -> Response<Full<Bytes>> {
    let check = |r: Result<(), String>| match r {
        Ok(()) => reply(200, "text/plain", "ok\n".into()),
        Err(why) => reply(503, "text/plain", format!("{why}\n")),
    };
    match (method, path) {
        ("GET", "/metrics") => {
            let format = Exposition::negotiate(accept);
            reply(200, format.content_type(), state.metrics_text(format))
        }
        ("GET", "/healthz") => check(state.live()),
        ("GET", "/readyz") => check(state.ready()),
        ("GET", "/pods") => reply(200, "application/json", state.pods_json().to_string()),
        ("GET", "/pods/timeline") => {
            let Some(pod) = query_value(query, "pod").filter(|p| !p.is_empty()) else {
                let why = serde_json::json!({"error": "give ?pod=NAMESPACE/NAME or ?pod=UID"});
                return reply(400, "application/json", why.to_string());
            };
            match state.timeline_json(&crate::timeline::Query::parse(&pod)) {
                Some(t) => reply(200, "application/json", t.to_string()),
                None => {
                    let why = serde_json::json!({"error": format!(
                        "no termination timeline kept for {pod}: it has not begun to end, or it finished and rolled off"
                    )});
                    reply(404, "application/json", why.to_string())
                }
            }
        }
        _ => reply(404, "text/plain", "not found\n".into()),
    }
}

/// Serves on `listener` until cancelled.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<dyn AgentState>,
    cancel: CancellationToken,
) {
    loop {
        let (stream, _) = tokio::select! {
            _ = cancel.cancelled() => return,
            acc = listener.accept() => match acc {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(err = %e, "status endpoint accept failed");
                    continue;
                }
            },
        };
        let state = state.clone();
        let cancel = cancel.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| {
                let state = state.clone();
                async move { Ok::<_, Infallible>(route(&*state, &req)) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc);
            tokio::select! {
                _ = conn => {}
                _ = cancel.cancelled() => {}
            }
        });
    }
}

/// A minimal HTTP GET for `reaplet pods` and tests: returns (status, body).
pub async fn fetch(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    Ok((code, body.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;
    use http_body_util::BodyExt;

    struct Fixed(Metrics);

    impl AgentState for Fixed {
        fn metrics_text(&self, format: Exposition) -> String {
            self.0.encode(format)
        }
        fn live(&self) -> Result<(), String> {
            Ok(())
        }
        fn ready(&self) -> Result<(), String> {
            Err("container runtime not answering for 45s (relist: deadline of 5s exceeded)".into())
        }
        fn pods_json(&self) -> serde_json::Value {
            serde_json::json!({ "pods": [] })
        }
    }

    async fn get(state: &Fixed, path: &str, accept: Option<&str>) -> (u16, String, String) {
        let r = respond(state, "GET", path, None, accept);
        let code = r.status().as_u16();
        let ctype = r.headers()["content-type"].to_str().unwrap().to_owned();
        let body = r.into_body().collect().await.unwrap().to_bytes();
        (code, ctype, String::from_utf8(body.to_vec()).unwrap())
    }

    /// Prometheus text by default and for a plain-text scraper; OpenMetrics when `Accept`
    /// prefers it (Prometheus's own header, a bare OpenMetrics one).
    #[tokio::test]
    async fn metrics_are_prometheus_text_unless_openmetrics_is_asked_for() {
        let state = Fixed(Metrics::new());
        state
            .0
            .runtime_call("StopContainer", std::time::Duration::from_millis(3), true);
        for accept in [
            None,
            Some("text/plain"),
            Some("*/*"),
            Some("text/plain;version=0.0.4"),
        ] {
            let (code, ctype, body) = get(&state, "/metrics", accept).await;
            assert_eq!(code, 200);
            assert_eq!(
                ctype, "text/plain; version=0.0.4; charset=utf-8",
                "{accept:?}"
            );
            assert!(!body.contains("# EOF"), "{body}");
            assert!(
                body.contains("# TYPE reaplet_runtime_operations_total counter"),
                "{body}"
            );
        }
        let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;\
            version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        for accept in [prometheus, "application/openmetrics-text"] {
            let (code, ctype, body) = get(&state, "/metrics", Some(accept)).await;
            assert_eq!(code, 200);
            assert_eq!(
                ctype,
                "application/openmetrics-text; version=1.0.0; charset=utf-8"
            );
            assert!(body.ends_with("# EOF\n"), "{body}");
            assert!(body.contains("# TYPE reaplet_runtime_operations counter"));
        }
        // a scraper that prefers plain text gets it
        let (_, ctype, _) = get(
            &state,
            "/metrics",
            Some("text/plain;q=1,application/openmetrics-text;q=0.5"),
        )
        .await;
        assert!(ctype.starts_with("text/plain"), "{ctype}");
    }

    #[test]
    fn query_values_are_decoded_and_never_panic() {
        assert_eq!(
            query_value(Some("pod=default%2Fweb-0"), "pod").as_deref(),
            Some("default/web-0")
        );
        assert_eq!(
            query_value(Some("x=1&pod=kube-system/etcd"), "pod").as_deref(),
            Some("kube-system/etcd")
        );
        assert_eq!(query_value(Some("pods=a"), "pod"), None);
        assert_eq!(query_value(None, "pod"), None);
        // a cut or malformed escape, and multi-byte text after a '%', are kept as they are
        assert_eq!(query_value(Some("pod=a%2"), "pod").as_deref(), Some("a%2"));
        assert_eq!(
            query_value(Some("pod=%zzé"), "pod").as_deref(),
            Some("%zzé")
        );
        assert_eq!(query_value(Some("pod=%é"), "pod").as_deref(), Some("%é"));
        assert_eq!(query_value(Some("pod=%ff"), "pod"), None, "not UTF-8");
    }

    #[tokio::test]
    async fn a_timeline_needs_a_pod_and_an_unknown_one_is_404() {
        let state = Fixed(Metrics::new());
        let r = respond(&state, "GET", "/pods/timeline", None, None);
        assert_eq!(r.status().as_u16(), 400);
        let r = respond(&state, "GET", "/pods/timeline", Some("pod=default/x"), None);
        assert_eq!(r.status().as_u16(), 404);
    }

    #[tokio::test]
    async fn readyz_carries_the_reason() {
        let state = Fixed(Metrics::new());
        let (code, _, body) = get(&state, "/readyz", None).await;
        assert_eq!(code, 503);
        assert!(body.contains("container runtime not answering"), "{body}");
        assert_eq!(get(&state, "/healthz", None).await.0, 200);
        assert_eq!(get(&state, "/nope", None).await.0, 404);
    }
}
