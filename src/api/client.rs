//! The API client's connection stack: client-go's `rest.Config` transport as the kubelet builds
//! it (`k8s.io/client-go/transport`), on kube-rs's layers.
//!
//! kube-rs's own `Client::try_from(Config)` builds the same stack (TLS, the configured
//! timeouts, base URI, credentials, extra headers) on a connector with Nagle's algorithm on:
//! a request written after a TLS handshake's last flight, or a second request on a
//! connection, waits for the server's (delayed) ACK, about 40 ms on Linux. Go's net package
//! sets TCP_NODELAY on every connection, so the kubelet and the controller manager never
//! wait: here every connection sets it too ([`client`]).
//!
//! Invariants: the stack is kube-rs's but for the connector (no retry layer: callers retry
//! with their own backoff; no proxy: a kubeconfig naming one is refused as kube-rs refuses
//! it without its proxy features); every connection has TCP_NODELAY.

use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kube::client::ConfigExt;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The API client for `config`: kube-rs's stack on a TCP_NODELAY connector.
pub fn client(config: kube::Config) -> Result<kube::Client, kube::Error> {
    if config.proxy_url.is_some() {
        // kube-rs's answer (its proxy support is not compiled in)
        return kube::Client::try_from(config);
    }
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    let https = config.rustls_https_connector_with_connector(http)?;
    let mut timed = hyper_timeout::TimeoutConnector::new(https);
    timed.set_connect_timeout(config.connect_timeout);
    timed.set_read_timeout(config.read_timeout);
    timed.set_write_timeout(config.write_timeout);
    timed.set_reset_reader_on_write(config.reset_reader_on_write);
    let hyper: hyper_util::client::legacy::Client<_, kube::client::Body> =
        hyper_util::client::legacy::Builder::new(TokioExecutor::new()).build(timed);
    let service = tower::ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(BoxError::from)
        .service(hyper);
    Ok(kube::Client::new(service, config.default_namespace))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::BorrowedFd;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A server that answers one request on one connection and keeps it open; returns its
    /// address and the client's port (once the request came).
    async fn server() -> (std::net::SocketAddr, tokio::sync::oneshot::Receiver<u16>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let (mut conn, peer) = listener.accept().await.unwrap();
            let mut buf = Vec::new();
            while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                let mut chunk = [0u8; 1024];
                let n = conn.read(&mut chunk).await.unwrap();
                assert!(n > 0, "the client closed before its request's end");
                buf.extend_from_slice(&chunk[..n]);
            }
            let body = r#"{"major":"1","minor":"36"}"#;
            let answer = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            conn.write_all(answer.as_bytes()).await.unwrap();
            let _ = tx.send(peer.port());
            // the connection stays open (pooled by the client) while the test looks at it
            tokio::time::sleep(std::time::Duration::from_secs(30)).await;
        });
        (addr, rx)
    }

    /// Whether this process's TCP socket bound to local `port` has TCP_NODELAY.
    fn nodelay_of_local_port(port: u16) -> bool {
        for entry in std::fs::read_dir("/proc/self/fd").unwrap() {
            let Ok(n) = entry.unwrap().file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            // SAFETY: `n` was an open descriptor of this process a moment ago; it is only
            // passed to getsockname and getsockopt, which read nothing but the descriptor
            // table. Were it closed meanwhile, they fail (EBADF) or, were the number reused,
            // ask another descriptor, whose port would not match: no memory is touched.
            let fd = unsafe { BorrowedFd::borrow_raw(n) };
            let Ok(addr) = rustix::net::getsockname(fd) else {
                continue;
            };
            if std::net::SocketAddr::try_from(addr).is_ok_and(|a| a.port() == port) {
                return rustix::net::sockopt::tcp_nodelay(fd).unwrap();
            }
        }
        panic!("no socket of this process has local port {port}");
    }

    async fn connection_nodelay(build: fn(kube::Config) -> kube::Client) -> bool {
        let (addr, port) = server().await;
        let config = kube::Config::new(format!("http://{addr}").parse().unwrap());
        let client = build(config);
        let text = client
            .request_text(http::Request::get("/version").body(vec![]).unwrap())
            .await
            .unwrap();
        assert!(text.contains("\"36\""), "{text}");
        let port = tokio::time::timeout(std::time::Duration::from_secs(10), port)
            .await
            .unwrap()
            .unwrap();
        let nodelay = nodelay_of_local_port(port);
        drop(client);
        nodelay
    }

    #[tokio::test]
    async fn every_connection_has_tcp_nodelay_unlike_kube_rs_own_stack() {
        assert!(connection_nodelay(|c| client(c).unwrap()).await);
        // the check can fail: kube-rs's own stack leaves Nagle's algorithm on
        assert!(!connection_nodelay(|c| kube::Client::try_from(c).unwrap()).await);
    }
}
