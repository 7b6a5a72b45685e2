//! A TCP proxy in front of the real API server, for outages the real server cannot be made to
//! show on demand. While it resets ([`Proxy::start_resetting`]) every connection, new and open,
//! is answered with a TCP RST, as a restarting API server or a broken load balancer does; while
//! it closes ([`Proxy::start_closing`]) every connection is accepted and closed unanswered (a
//! FIN, nothing read, nothing sent), as a load balancer with no healthy backend does. It counts
//! the connection attempts, so a test can say how hard a client hammered during an outage.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
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
    attempts: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
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
        let (m, a, c) = (mode.clone(), attempts.clone(), cut.clone());
        let task = tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                a.fetch_add(1, Ordering::SeqCst);
                let now = m.load(Ordering::SeqCst);
                if now != FORWARD {
                    tokio::spawn(end(conn, now));
                    continue;
                }
                let mut cut_rx = c.subscribe();
                let m = m.clone();
                tokio::spawn(async move {
                    let Ok(mut up) = TcpStream::connect(upstream).await else {
                        let _ = conn.set_zero_linger();
                        return;
                    };
                    let mut conn = conn;
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut conn, &mut up) => {}
                        _ = cut_rx.changed() => {
                            drop(up);
                            end(conn, m.load(Ordering::SeqCst)).await;
                        }
                    }
                });
            }
        });
        Proxy {
            addr,
            mode,
            cut,
            attempts,
            task,
        }
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
