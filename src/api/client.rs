//! The API client's connection stack: client-go's `rest.Config` transport as the kubelet builds
//! it (`k8s.io/client-go/transport`, its dialer in `k8s.io/apimachinery/pkg/util/net`), on
//! kube-rs's layers.
//!
//! kube-rs's own `Client::try_from(Config)` builds the same stack (TLS, the configured
//! timeouts, base URI, credentials, extra headers) on a connector with Nagle's algorithm on:
//! a request written after a TLS handshake's last flight, or a second request on a
//! connection, waits for the server's (delayed) ACK, about 40 ms on Linux. Go's net package
//! sets TCP_NODELAY on every connection, so the kubelet and the controller manager never
//! wait: here every connection sets it too ([`client`]).
//!
//! A path that dies silently (a server gone without a FIN, a load balancer that dropped the
//! flow) is found by the kernel, not by the 320 s read timeout: every connection has TCP
//! keepalive ([`KEEPALIVE_IDLE`], [`KEEPALIVE_INTERVAL`], [`KEEPALIVE_PROBES`]) and
//! `TCP_USER_TIMEOUT` ([`USER_TIMEOUT`]): an idle connection whose probes go unanswered, or
//! one whose sent data stays unacknowledged, is closed with an error in 20 s, before a
//! request's own 30 s timeout ([`super::REQUEST_TIMEOUT`]), so such a request fails as
//! unanswered ([`crate::backoff::Failure::NoAnswer`]), never as slow. client-go dials with a
//! 30 s keepalive (30 s idle, 30 s between probes, the kernel's 9 probes: about 5 minutes) and
//! finds a dead HTTP/2 connection by its pings (30 s read-idle, then 15 s for the answer:
//! about 45 s); reaplet speaks HTTP/1.1, so the kernel does it, sooner.
//!
//! Invariants: the stack is kube-rs's but for the connector (no retry layer: callers retry
//! with their own backoff; no proxy: a kubeconfig naming one is refused as kube-rs refuses
//! it without its proxy features); every connection has TCP_NODELAY, keepalive and the user
//! timeout; a connection idle in the pool longer than [`POOL_IDLE`] is not used again.

use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kube::client::ConfigExt;
use std::time::Duration;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// An idle connection is probed after this long without traffic (client-go: 30 s).
pub const KEEPALIVE_IDLE: Duration = Duration::from_secs(10);
/// Then a probe this often while none is answered (client-go: 30 s).
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
/// Unanswered probes before the kernel gives up (client-go: the kernel's 9); with
/// [`USER_TIMEOUT`] set, the user timeout decides (Linux's tcp(7)): the connection is closed at
/// the first unanswered probe [`USER_TIMEOUT`] after the last thing the peer sent.
pub const KEEPALIVE_PROBES: u32 = 3;
/// Data sent, or keepalive probes, unacknowledged this long close the connection: an idle
/// dead path is found in 20 s (idle 10 s, probes at 15 and 20 s), a request on one fails in
/// 20 s, before [`super::REQUEST_TIMEOUT`]. A server that is only slow still acknowledges
/// what it receives (its kernel does): this never ends a slow request.
pub const USER_TIMEOUT: Duration = Duration::from_secs(20);
const _: () = assert!(USER_TIMEOUT.as_nanos() < super::REQUEST_TIMEOUT.as_nanos());

/// A connection idle in the pool this long is closed rather than used again: client-go's
/// `IdleConnTimeout` (and hyper's default), so requests seconds apart share one connection.
/// A path can also go silent above TCP (a proxy or a load balancer that keeps the connection
/// and stops forwarding on it), which keepalive cannot see: the pod watch has a client of its
/// own ([`watch_client`]), whose only connection is the watch's, so the new watch its idle
/// check starts ([`super::source::WATCH_TIMEOUT`]) opens a new connection instead of landing on
/// a pooled one that went silent with the old.
pub const POOL_IDLE: Duration = Duration::from_secs(90);

/// How a client keeps its connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pool {
    /// Kept for [`POOL_IDLE`] and used again (each client its own pool).
    Shared,
    /// Closed after each answer: every request opens a new connection.
    None,
}

/// The API client for `config`: kube-rs's stack on a connector with TCP_NODELAY, keepalive
/// and the user timeout.
pub fn client(config: kube::Config) -> Result<kube::Client, kube::Error> {
    build(config, Pool::Shared)
}

/// The pod watch's client: the same stack with a pool of its own (see [`POOL_IDLE`]).
pub fn watch_client(config: kube::Config) -> Result<kube::Client, kube::Error> {
    build(config, Pool::Shared)
}

/// The same client, but every request on a new connection: the health prober's
/// ([`super::health::probe`]), so that what it finds says whether the server can be reached
/// now, not whether a pooled connection still answers.
pub fn fresh_connections(config: kube::Config) -> Result<kube::Client, kube::Error> {
    build(config, Pool::None)
}

fn build(config: kube::Config, pool: Pool) -> Result<kube::Client, kube::Error> {
    if config.proxy_url.is_some() {
        // kube-rs's answer (its proxy support is not compiled in)
        return kube::Client::try_from(config);
    }
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_keepalive(Some(KEEPALIVE_IDLE));
    http.set_keepalive_interval(Some(KEEPALIVE_INTERVAL));
    http.set_keepalive_retries(Some(KEEPALIVE_PROBES));
    http.set_tcp_user_timeout(Some(USER_TIMEOUT));
    let https = config.rustls_https_connector_with_connector(http)?;
    let mut timed = hyper_timeout::TimeoutConnector::new(https);
    timed.set_connect_timeout(config.connect_timeout);
    timed.set_read_timeout(config.read_timeout);
    timed.set_write_timeout(config.write_timeout);
    timed.set_reset_reader_on_write(config.reset_reader_on_write);
    let mut builder = hyper_util::client::legacy::Builder::new(TokioExecutor::new());
    match pool {
        Pool::Shared => builder.pool_idle_timeout(POOL_IDLE),
        Pool::None => builder.pool_max_idle_per_host(0),
    };
    let hyper: hyper_util::client::legacy::Client<_, kube::client::Body> = builder.build(timed);
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

    /// What the keepalive and user-timeout options of one socket are.
    #[derive(Debug, PartialEq, Eq)]
    struct Liveness {
        keepalive: bool,
        idle: Duration,
        interval: Duration,
        probes: u32,
        user_timeout: Duration,
    }

    fn liveness(fd: BorrowedFd<'_>) -> Liveness {
        use rustix::net::sockopt;
        Liveness {
            keepalive: sockopt::socket_keepalive(fd).unwrap(),
            idle: sockopt::tcp_keepidle(fd).unwrap(),
            interval: sockopt::tcp_keepintvl(fd).unwrap(),
            probes: sockopt::tcp_keepcnt(fd).unwrap(),
            user_timeout: Duration::from_millis(u64::from(sockopt::tcp_user_timeout(fd).unwrap())),
        }
    }

    /// `read` of this process's TCP socket bound to local `port`.
    fn of_local_port<T>(port: u16, read: impl Fn(BorrowedFd<'_>) -> T) -> T {
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
                return read(fd);
            }
        }
        panic!("no socket of this process has local port {port}");
    }

    /// `read` of the one connection `build`'s client made for a request.
    async fn of_connection<T>(
        build: fn(kube::Config) -> kube::Client,
        read: impl Fn(BorrowedFd<'_>) -> T,
    ) -> T {
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
        let out = of_local_port(port, read);
        drop(client);
        out
    }

    async fn connection_nodelay(build: fn(kube::Config) -> kube::Client) -> bool {
        of_connection(build, |fd| rustix::net::sockopt::tcp_nodelay(fd).unwrap()).await
    }

    #[tokio::test]
    async fn every_connection_has_tcp_nodelay_unlike_kube_rs_own_stack() {
        assert!(connection_nodelay(|c| client(c).unwrap()).await);
        // the check can fail: kube-rs's own stack leaves Nagle's algorithm on
        assert!(!connection_nodelay(|c| kube::Client::try_from(c).unwrap()).await);
    }

    /// Issue 44 item 4: every connection probes a silent peer (keepalive) and gives up on
    /// data or probes unacknowledged for [`USER_TIMEOUT`]; kube-rs's own stack sets neither,
    /// so a dead path was found only by the 320 s read timeout.
    #[tokio::test]
    async fn every_connection_has_keepalive_and_a_user_timeout_unlike_kube_rs_own_stack() {
        let ours = of_connection(|c| client(c).unwrap(), liveness).await;
        assert_eq!(
            ours,
            Liveness {
                keepalive: true,
                idle: KEEPALIVE_IDLE,
                interval: KEEPALIVE_INTERVAL,
                probes: KEEPALIVE_PROBES,
                user_timeout: USER_TIMEOUT,
            }
        );
        let theirs = of_connection(|c| kube::Client::try_from(c).unwrap(), liveness).await;
        assert!(!theirs.keepalive, "{theirs:?}");
        assert_eq!(theirs.user_timeout, Duration::ZERO, "{theirs:?}");
    }

    /// A server answering `/version` on every connection it accepts, any number of requests
    /// each; sends the client's port of each connection accepted.
    async fn keep_alive_server() -> (
        std::net::SocketAddr,
        tokio::sync::mpsc::UnboundedReceiver<u16>,
    ) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            loop {
                let (mut conn, peer) = listener.accept().await.unwrap();
                let _ = tx.send(peer.port());
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    loop {
                        let mut chunk = [0u8; 1024];
                        let Ok(n) = conn.read(&mut chunk).await else {
                            return;
                        };
                        if n == 0 {
                            return;
                        }
                        buf.extend_from_slice(&chunk[..n]);
                        while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            buf.drain(..end + 4);
                            let body = r#"{"major":"1","minor":"36"}"#;
                            let answer = format!(
                                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                                body.len()
                            );
                            if conn.write_all(answer.as_bytes()).await.is_err() {
                                return;
                            }
                        }
                    }
                });
            }
        });
        (addr, rx)
    }

    /// Requests a few seconds apart share one connection, as client-go's (idle connections kept
    /// 90 s): a sparse request is no new TCP and TLS handshake. Before: idle connections were
    /// dropped after 4 s (for the pod watch's sake, which now has a client of its own), so a
    /// standby reading its Lease every 10 s (`healthzPort: 0`) made a handshake each time.
    #[tokio::test]
    async fn requests_seconds_apart_share_one_connection() {
        let (addr, mut ports) = keep_alive_server().await;
        let client = client(kube::Config::new(format!("http://{addr}").parse().unwrap())).unwrap();
        for _ in 0..2 {
            client.apiserver_version().await.unwrap();
            tokio::time::sleep(Duration::from_secs(5)).await;
        }
        let first = ports.recv().await.unwrap();
        assert!(
            ports.try_recv().is_err(),
            "a second connection for a request 5 s after the first (the first from port {first})"
        );
    }
}
