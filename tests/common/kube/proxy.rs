//! A TCP proxy in front of the real API server, for outages the real server cannot be made to
//! show on demand: while `reset` is on, every connection (new and open) is answered with a TCP
//! RST, as a restarting API server or a broken load balancer does. It counts the connection
//! attempts, so a test can say how hard a client hammered during an outage.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct Proxy {
    pub addr: SocketAddr,
    reset: Arc<AtomicBool>,
    /// bumped to cut the open connections
    cut: watch::Sender<u64>,
    attempts: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let reset = Arc::new(AtomicBool::new(false));
        let attempts = Arc::new(AtomicU64::new(0));
        let (cut, _) = watch::channel(0u64);
        let (r, a, c) = (reset.clone(), attempts.clone(), cut.clone());
        let task = tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                a.fetch_add(1, Ordering::SeqCst);
                if r.load(Ordering::SeqCst) {
                    let _ = conn.set_zero_linger();
                    drop(conn);
                    continue;
                }
                let mut cut_rx = c.subscribe();
                tokio::spawn(async move {
                    let Ok(mut up) = TcpStream::connect(upstream).await else {
                        let _ = conn.set_zero_linger();
                        return;
                    };
                    let mut conn = conn;
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut conn, &mut up) => {}
                        _ = cut_rx.changed() => {
                            let _ = conn.set_zero_linger();
                        }
                    }
                });
            }
        });
        Proxy {
            addr,
            reset,
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
        self.reset.store(true, Ordering::SeqCst);
        self.cut.send_modify(|n| *n += 1);
    }

    pub fn stop_resetting(&self) {
        self.reset.store(false, Ordering::SeqCst);
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
