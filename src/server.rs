//! The local status endpoint (kubelet: its healthz and metrics servers): Prometheus text on
//! `/metrics`, `/healthz` (the main loop is alive), `/readyz` (runtime connected and every pod
//! source listed once), and `/pods` (JSON: what the agent sees, for `reaplet pods`).
//!
//! Invariants: loopback by default (the address is a setting); read-only; one small HTTP/1.1
//! server, no request reads more than its head.

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
    fn metrics_text(&self) -> String;
    /// `Err(why)` when the main loop is wedged.
    fn live(&self) -> Result<(), String>;
    /// `Err(why)` until the runtime answered and every pod source listed once.
    fn ready(&self) -> Result<(), String>;
    /// `/pods` as JSON.
    fn pods_json(&self) -> serde_json::Value;
}

fn reply(code: u16, ctype: &str, body: String) -> Response<Full<Bytes>> {
    Response::builder()
        .status(code)
        .header("content-type", ctype)
        .body(Full::new(Bytes::from(body)))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}

fn route(state: &dyn AgentState, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    let check = |r: Result<(), String>| match r {
        Ok(()) => reply(200, "text/plain", "ok\n".into()),
        Err(why) => reply(503, "text/plain", format!("{why}\n")),
    };
    match (req.method().as_str(), req.uri().path()) {
        ("GET", "/metrics") => reply(
            200,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            state.metrics_text(),
        ),
        ("GET", "/healthz") => check(state.live()),
        ("GET", "/readyz") => check(state.ready()),
        ("GET", "/pods") => reply(200, "application/json", state.pods_json().to_string()),
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
