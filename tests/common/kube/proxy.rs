//! A TCP proxy in front of the real API server, for outages the real server cannot be made to
//! show on demand. While it resets ([`Proxy::start_resetting`]) every connection, new and open,
//! is answered with a TCP RST, as a restarting API server or a broken load balancer does; while
//! it closes ([`Proxy::start_closing`]) every connection is accepted and closed unanswered (a
//! FIN, nothing read, nothing sent), as a load balancer with no healthy backend does. It counts
//! the connection attempts, so a test can say how hard a client hammered during an outage.
//!
//! A path gone silent above TCP (issue 44 item 4): [`Proxy::stall_open`] stops forwarding on
//! every connection open at that moment without closing it (what the client sends is read and
//! dropped, nothing reaches it, its kernel's keepalive probes are answered by the proxy's), as
//! a load balancer or a proxy that lost its backend without telling does; connections opened
//! after it are forwarded as before.
//!
//! A brownout rather than an outage (issue 38 item 1): while held ([`Proxy::hold`]) the TLS
//! handshakes go through but no HTTP request reaches the server (it is kept, and forwarded on
//! [`Proxy::release`] unless the client gave up and closed first), as a server queueing
//! requests does: connected, no answer however long the client waits; with a latency
//! ([`Proxy::set_latency`]) everything the server sends reaches the client that much later (the
//! TLS handshake's answer included), as from an overloaded server.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What the proxy does with a connection.
const FORWARD: u8 = 0;
const RESET: u8 = 1;
const CLOSE: u8 = 2;

pub struct Proxy {
    pub addr: SocketAddr,
    mode: Arc<AtomicU8>,
    /// bumped to cut the open connections (each ends them as the mode then says)
    cut: watch::Sender<u64>,
    /// bumped to stall the open connections
    stall: watch::Sender<u64>,
    attempts: Arc<AtomicU64>,
    held: watch::Sender<bool>,
    latency: watch::Sender<Duration>,
    task: tokio::task::JoinHandle<()>,
}

/// The TLS record type of application data (RFC 8446 §5.1).
const APPLICATION_DATA: u8 = 0x17;

/// Client to server, record by record (a client of kube-apiserver speaks TLS 1.3, whose
/// records are a 5-byte header and its length): the handshake always passes; the HTTP requests
/// wait while `held` says so (kept in order, and dropped if the client closes first). In TLS
/// 1.3 the client's first application-data record is its handshake's Finished; every later one
/// carries HTTP.
async fn forward_up(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    mut held: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    // bytes not yet a whole record
    let mut partial: Vec<u8> = Vec::new();
    // whole records not yet sent, each with whether it is HTTP (held while held)
    let mut kept: std::collections::VecDeque<(Vec<u8>, bool)> = Default::default();
    let mut app_records = 0u64;
    loop {
        let holding = *held.borrow_and_update();
        while let Some((_, http)) = kept.front() {
            if holding && *http {
                break;
            }
            let (record, _) = kept.pop_front().unwrap_or_default();
            if to.write_all(&record).await.is_err() {
                return;
            }
        }
        tokio::select! {
            r = from.read(&mut buf) => match r {
                Ok(n) if n > 0 => {
                    partial.extend_from_slice(&buf[..n]);
                    while partial.len() >= 5 {
                        let len = 5 + usize::from(u16::from_be_bytes([partial[3], partial[4]]));
                        if partial.len() < len {
                            break;
                        }
                        let record: Vec<u8> = partial.drain(..len).collect();
                        let http = record[0] == APPLICATION_DATA && {
                            app_records += 1;
                            app_records > 1
                        };
                        kept.push_back((record, http));
                    }
                }
                // the client closed: what is held is dropped with the connection
                _ => {
                    let _ = to.shutdown().await;
                    return;
                }
            },
            r = held.changed() => if r.is_err() {
                return;
            },
        }
    }
}

/// Server to client: forwards what `from` sends, each piece the current latency after it came.
async fn forward_down(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    latency: watch::Receiver<Duration>,
) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
    let read = async move {
        let mut buf = vec![0u8; 16 * 1024];
        while let Ok(n) = from.read(&mut buf).await {
            if n == 0 {
                break;
            }
            let due = tokio::time::Instant::now() + *latency.borrow();
            if tx.send((due, buf[..n].to_vec())).is_err() {
                break;
            }
        }
    };
    let write = async move {
        while let Some((due, piece)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&piece).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(read, write);
}

/// A stalled connection: kept open, what its client sends read and dropped, nothing sent,
/// until the client closes it.
async fn swallow(mut conn: TcpStream) {
    let mut buf = [0u8; 4096];
    while matches!(conn.read(&mut buf).await, Ok(n) if n > 0) {}
}

/// Ends `conn` as `mode` says: a RST, or a FIN with nothing answered (what the peer still
/// sends is read and dropped until it closes too, at most 5 s, so that no RST follows).
async fn end(mut conn: TcpStream, mode: u8) {
    if mode == RESET {
        let _ = conn.set_zero_linger();
        return;
    }
    let _ = conn.shutdown().await;
    let mut buf = [0u8; 4096];
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        while matches!(conn.read(&mut buf).await, Ok(n) if n > 0) {}
    })
    .await;
}

impl Proxy {
    /// Listens on a free loopback port and forwards to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mode = Arc::new(AtomicU8::new(FORWARD));
        let attempts = Arc::new(AtomicU64::new(0));
        let (cut, _) = watch::channel(0u64);
        let (stall, _) = watch::channel(0u64);
        let (held, _) = watch::channel(false);
        let (latency, _) = watch::channel(Duration::ZERO);
        let (m, a, c, st) = (mode.clone(), attempts.clone(), cut.clone(), stall.clone());
        let (h, l) = (held.clone(), latency.clone());
        let task = tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                a.fetch_add(1, Ordering::SeqCst);
                let now = m.load(Ordering::SeqCst);
                if now != FORWARD {
                    tokio::spawn(end(conn, now));
                    continue;
                }
                let mut cut_rx = c.subscribe();
                let mut stall_rx = st.subscribe();
                let m = m.clone();
                let (held_rx, latency_rx) = (h.subscribe(), l.subscribe());
                tokio::spawn(async move {
                    let Ok(mut up) = TcpStream::connect(upstream).await else {
                        let _ = conn.set_zero_linger();
                        return;
                    };
                    let mut conn = conn;
                    let forwarded = async {
                        let (client_r, client_w) = conn.split();
                        let (up_r, up_w) = up.split();
                        tokio::join!(
                            forward_up(client_r, up_w, held_rx),
                            forward_down(up_r, client_w, latency_rx)
                        );
                    };
                    enum Then {
                        Done,
                        Cut,
                        Stall,
                    }
                    let then = tokio::select! {
                        _ = forwarded => Then::Done,
                        _ = cut_rx.changed() => Then::Cut,
                        _ = stall_rx.changed() => Then::Stall,
                    };
                    match then {
                        Then::Done => {}
                        Then::Cut => {
                            drop(up);
                            end(conn, m.load(Ordering::SeqCst)).await;
                        }
                        Then::Stall => {
                            drop(up);
                            swallow(conn).await;
                        }
                    }
                });
            }
        });
        Proxy {
            addr,
            mode,
            cut,
            stall,
            attempts,
            held,
            latency,
            task,
        }
    }

    /// From now on no HTTP request reaches the server (handshakes do), until
    /// [`Self::release`].
    pub fn hold(&self) {
        self.held.send_replace(true);
    }

    /// Forwards what was held (of connections still open) and everything after it.
    pub fn release(&self) {
        self.held.send_replace(false);
    }

    /// Everything the server sends from now on reaches its client `d` later.
    pub fn set_latency(&self, d: Duration) {
        self.latency.send_replace(d);
    }

    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// Resets every open connection and, from now on, every new one.
    pub fn start_resetting(&self) {
        self.mode.store(RESET, Ordering::SeqCst);
        self.cut.send_modify(|n| *n += 1);
    }

    /// Forwards again (after [`Self::start_resetting`] or [`Self::start_closing`]).
    pub fn stop_resetting(&self) {
        self.mode.store(FORWARD, Ordering::SeqCst);
    }

    /// Closes every open connection unanswered and, from now on, accepts every new one and
    /// closes it unanswered, until [`Self::stop_closing`].
    pub fn start_closing(&self) {
        self.mode.store(CLOSE, Ordering::SeqCst);
        self.cut.send_modify(|n| *n += 1);
    }

    /// Forwards again (the same as [`Self::stop_resetting`]).
    pub fn stop_closing(&self) {
        self.stop_resetting();
    }

    /// Stops forwarding on every connection open now, without closing it (see the module
    /// doc); new connections are forwarded.
    pub fn stall_open(&self) {
        self.stall.send_modify(|n| *n += 1);
    }

    /// Connection attempts so far.
    pub fn attempts(&self) -> u64 {
        self.attempts.load(Ordering::SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}
