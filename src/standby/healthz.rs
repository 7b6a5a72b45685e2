//! The kubelet's health endpoint, the standby's local signal (kubelet: its healthz server,
//! `healthzBindAddress`:`healthzPort`, `GET /healthz`; port 0 disables it).
//!
//! Invariants: one probe is bounded by its timeout; it costs the control plane nothing (a
//! loopback connection); a disabled endpoint is [`Health::Disabled`], never a failure.

use super::Health;
use std::time::Duration;

/// Probes the kubelet's health endpoint once (`None`: the kubelet serves none, so nothing is
/// probed: [`Health::Disabled`]).
pub async fn probe_endpoint(url: Option<&str>, timeout: Duration) -> Health {
    match url {
        Some(u) => probe(u, timeout).await,
        None => Health::Disabled,
    }
}

/// Probes the kubelet's health endpoint once: `2xx` is [`Health::Ok`], connection refused
/// [`Health::Gone`], anything else (other statuses, a timeout, a bad URL) [`Health::Failed`].
pub async fn probe(url: &str, timeout: Duration) -> Health {
    match tokio::time::timeout(timeout, probe_once(url)).await {
        Ok(h) => h,
        Err(_) => Health::Failed,
    }
}

async fn probe_once(url: &str) -> Health {
    use http_body_util::Empty;
    let Ok(uri) = url.parse::<hyper::Uri>() else {
        return Health::Failed;
    };
    let (Some(host), Some("http")) = (uri.host(), uri.scheme_str()) else {
        return Health::Failed;
    };
    let port = uri.port_u16().unwrap_or(80);
    // an IPv6 host comes bracketed in a URI (`[::1]`); the socket address wants it bare
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let stream = match tokio::net::TcpStream::connect((bare, port)).await {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => return Health::Gone,
        Err(_) => return Health::Failed,
    };
    let Ok((mut sender, conn)) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await
    else {
        return Health::Failed;
    };
    let conn = tokio::spawn(conn);
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let req = hyper::Request::get(path)
        .header(hyper::header::HOST, host)
        .body(Empty::<hyper::body::Bytes>::new());
    let health = match req {
        Ok(req) => match sender.send_request(req).await {
            Ok(resp) if resp.status().is_success() => Health::Ok,
            _ => Health::Failed,
        },
        Err(_) => Health::Failed,
    };
    conn.abort();
    health
}
