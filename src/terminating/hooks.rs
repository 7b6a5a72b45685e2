//! preStop hooks: kubelet's `lifecycle.handlerRunner` (`pkg/kubelet/lifecycle/handlers.go`)
//! and `executePreStopHook`.
//!
//! Invariants:
//! * every hook is bounded by the time it is given (the container's grace); the caller
//!   measures the time it took;
//! * a hook's output is never logged nor put in an event (it may hold secrets): an error says
//!   what failed (exit code, HTTP status, connection), never what the hook printed.

use crate::cri::{CriError, Runtime};
use crate::pod::{ContainerSpec, Handler, HookPort, HttpGet, PodInfo};
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum HookError {
    #[error("exec in container {container_id} failed: {source}")]
    Exec {
        container_id: String,
        source: CriError,
    },
    #[error("exec in container {container_id} exited with code {exit_code}")]
    ExitCode {
        container_id: String,
        exit_code: i32,
    },
    #[error("http hook to {addr}: {what}")]
    Http { addr: String, what: String },
    #[error("http hook to {addr}: status {status}")]
    HttpStatus { addr: String, status: u16 },
    #[error("http hook: no address: the pod has no IP and the hook names no host")]
    NoHost,
    #[error("http hook: container has no port named {0:?}")]
    UnknownPort(String),
    #[error("http hook: https is not supported by this build")]
    HttpsUnsupported,
    #[error("hook did not complete within {0:?}")]
    Timeout(Duration),
}

impl HookError {
    /// The hook was refused before the runtime took it (its socket down or restarting): it
    /// never ran, so it is still owed. A hook that timed out or failed in the container ran.
    pub fn never_reached_runtime(&self) -> bool {
        matches!(self, HookError::Exec { source, .. } if !source.runtime_answered())
    }
}

/// Runs `handler` for a container, bounded by `limit`.
pub async fn run<R: Runtime>(
    runtime: &R,
    pod: &PodInfo,
    spec: &ContainerSpec,
    container_id: &str,
    handler: &Handler,
    limit: Duration,
) -> Result<(), HookError> {
    let fut = async {
        match handler {
            Handler::Exec { command } => {
                let r = runtime
                    .exec_sync(container_id, command.clone(), limit)
                    .await
                    .map_err(|source| match source {
                        CriError::DeadlineExceeded { .. } => HookError::Timeout(limit),
                        source => HookError::Exec {
                            container_id: container_id.into(),
                            source,
                        },
                    })?;
                if r.exit_code != 0 {
                    return Err(HookError::ExitCode {
                        container_id: container_id.into(),
                        exit_code: r.exit_code,
                    });
                }
                Ok(())
            }
            Handler::HttpGet(get) => http_get(pod, spec, get).await,
            Handler::Sleep { seconds } => {
                tokio::time::sleep(crate::terminating::grace::as_duration(*seconds)).await;
                Ok(())
            }
        }
    };
    tokio::time::timeout(limit, fut)
        .await
        .unwrap_or(Err(HookError::Timeout(limit)))
}

fn hook_addr(
    pod: &PodInfo,
    spec: &ContainerSpec,
    get: &HttpGet,
) -> Result<(String, u16), HookError> {
    let port = match &get.port {
        HookPort::Number(p) => *p,
        HookPort::Name(n) => spec
            .ports
            .iter()
            .find(|(name, _)| name == n)
            .map(|(_, p)| *p)
            .ok_or_else(|| HookError::UnknownPort(n.clone()))?,
    };
    let host = if !get.host.is_empty() {
        get.host.clone()
    } else if let Some(ip) = pod.pod_ip {
        ip.to_string()
    } else if pod.host_network {
        // a host-network pod shares the node's addresses
        IpAddr::V4(Ipv4Addr::LOCALHOST).to_string()
    } else {
        return Err(HookError::NoHost);
    };
    Ok((host, port))
}

async fn http_get(pod: &PodInfo, spec: &ContainerSpec, get: &HttpGet) -> Result<(), HookError> {
    if get.https {
        return Err(HookError::HttpsUnsupported);
    }
    let (host, port) = hook_addr(pod, spec, get)?;
    let addr_text = match host.parse::<IpAddr>() {
        Ok(IpAddr::V6(v6)) => SocketAddr::new(IpAddr::V6(v6), port).to_string(),
        _ => format!("{host}:{port}"),
    };
    let err = |what: String| HookError::Http {
        addr: addr_text.clone(),
        what,
    };
    let stream = tokio::net::TcpStream::connect(&addr_text)
        .await
        .map_err(|e| err(e.to_string()))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| err(e.to_string()))?;
    let conn = tokio::spawn(conn);
    let path = if get.path.starts_with('/') {
        get.path.clone()
    } else {
        format!("/{}", get.path)
    };
    let mut req = http::Request::get(path.as_str())
        .header(http::header::HOST, addr_text.as_str())
        .header(http::header::USER_AGENT, "kube-lifecycle/1.36");
    for (k, v) in &get.headers {
        req = req.header(k.as_str(), v.as_str());
    }
    let req = req
        .body(Empty::<Bytes>::new())
        .map_err(|e| err(e.to_string()))?;
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| err(e.to_string()))?;
    let status = resp.status().as_u16();
    // drain (bounded by the caller's timeout) and drop the body: it is never logged
    let _ = resp.into_body().collect().await;
    conn.abort();
    if !(200..400).contains(&status) {
        return Err(HookError::HttpStatus {
            addr: addr_text,
            status,
        });
    }
    Ok(())
}
