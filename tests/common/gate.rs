//! A gate that test containers wait at, so that their exits happen when the test says: an HTTP
//! server on the host's loopback (the test bed's pods use the node's network namespace) whose
//! answers are held until the gate is opened. A container's script asks for its own path with
//! busybox `wget` (retrying until answered), then exits with its code. Shared by
//! `tests/container_events.rs` and the `exits` benchmark.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

/// What is open: `all`, or each opened path.
#[derive(Default, Clone)]
struct Open {
    all: bool,
    paths: Arc<HashSet<String>>,
}

pub struct Gate {
    pub addr: SocketAddr,
    open: watch::Sender<Open>,
    /// When each path was first asked for (wall-clock ns, [`reaplet::wall_ns`]).
    arrived: Arc<std::sync::Mutex<HashMap<String, i64>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Gate {
    /// Starts the gate, closed, on a free loopback port.
    pub async fn start() -> Gate {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("gate: bind loopback");
        let addr = listener.local_addr().expect("gate: local addr");
        let (open, _) = watch::channel(Open::default());
        let tx = open.clone();
        let arrived: Arc<std::sync::Mutex<HashMap<String, i64>>> = Arc::default();
        let seen = arrived.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let mut rx = tx.subscribe();
                let seen = seen.clone();
                tokio::spawn(async move {
                    // the request line: "GET /<path> HTTP/1.1"
                    let mut buf = vec![0u8; 1024];
                    let mut n = 0;
                    while !buf[..n].windows(4).any(|w| w == b"\r\n\r\n") && n < buf.len() {
                        match conn.read(&mut buf[n..]).await {
                            Ok(0) | Err(_) => return,
                            Ok(k) => n += k,
                        }
                    }
                    let head = String::from_utf8_lossy(&buf[..n]).into_owned();
                    let path = head
                        .split_whitespace()
                        .nth(1)
                        .unwrap_or("/")
                        .trim_start_matches('/')
                        .to_owned();
                    let now = reaplet::wall_ns();
                    seen.lock().unwrap().entry(path.clone()).or_insert(now);
                    if rx
                        .wait_for(|o| o.all || o.paths.contains(&path))
                        .await
                        .is_err()
                    {
                        return;
                    }
                    let _ = conn
                        .write_all(b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n")
                        .await;
                    let _ = conn.shutdown().await;
                });
            }
        });
        Gate {
            addr,
            open,
            arrived,
            task,
        }
    }

    /// A container script: waits at the gate for `path`, then exits with `code`.
    pub fn script(&self, path: &str, code: i32) -> String {
        format!(
            "until wget -q -O /dev/null http://{}/{path}; do sleep 0.1; done; exit {code}",
            self.addr
        )
    }

    /// When `path` was first asked for (wall-clock ns), if it was.
    #[allow(dead_code)] // the tests only
    pub fn arrived(&self, path: &str) -> Option<i64> {
        self.arrived.lock().unwrap().get(path).copied()
    }

    /// Opens the gate for `path`: its waiting containers exit now.
    pub fn open(&self, path: &str) {
        self.open.send_modify(|o| {
            let mut p = (*o.paths).clone();
            p.insert(path.to_owned());
            o.paths = Arc::new(p);
        });
    }

    /// Opens the gate for every path.
    #[allow(dead_code)] // the tests only
    pub fn open_all(&self) {
        self.open.send_modify(|o| o.all = true);
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The wall-clock time (ns since the epoch, comparable with CRI's `finished_at`) of `at`, an
/// `Instant` such as the API server's [`Recorded::at`](super::apiserver::Recorded): one
/// (monotonic, wall) pair read back to back now, and `at`'s distance from it. Sound while the
/// two clocks do not drift apart between `at` and now: NTP slews the wall clock by at most
/// 0.5 ms/s, and these tests convert within seconds of `at`.
pub fn wall_of(at: std::time::Instant) -> i64 {
    let now = std::time::Instant::now();
    let wall = reaplet::wall_ns();
    if at <= now {
        wall - (now - at).as_nanos() as i64
    } else {
        wall + (at - now).as_nanos() as i64
    }
}

/// The first status PATCH of pod `default/<name>` with a terminal phase, answered 200.
pub fn terminal_patch(
    api: &super::apiserver::ApiServer,
    name: &str,
) -> Option<super::apiserver::Recorded> {
    let path = format!("/api/v1/namespaces/default/pods/{name}/status");
    api.requests().into_iter().find(|r| {
        r.method == "PATCH"
            && r.path == path
            && r.status == 200
            && matches!(
                r.body["status"]["phase"].as_str(),
                Some("Failed" | "Succeeded")
            )
    })
}
