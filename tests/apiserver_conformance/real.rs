//! The real servers behind the `real` side of the facts: etcd and kube-apiserver v1.36
//! (`tests/common/kube`, with the facts' flags and [`QUIET`]), from a pool shared by the tests
//! of this binary. A server is started when a test needs one and none is idle (at most one per
//! test thread, at most 4), serves one test at a time, and before each test is reset to the
//! facts' set-up: no pods (finalizers cleared, grace 0), PodDisruptionBudgets, events or node
//! leases, no Nodes (the bed then creates `node-a` and `node-b` afresh). Measured on a loaded
//! 2-core machine: starting a server ~8 s (the fixture's ~4.5 s, then the restart with
//! [`QUIET`]), a reset ~0.1 s; one server per test (94 of them) would cost ~6 minutes of CPU.
//!
//! A reset server is not a fresh one in two ways no fact depends on: its resourceVersions
//! continue from the previous test (tests read them, never assume their values), and a
//! namespace a test created (`other`, fact 10.2) stays (a namespace cannot be removed without
//! the namespace controller; the tests create it only as "exists").
//!
//! The processes of every pooled server are killed when the test binary exits (`atexit`: a
//! static is never dropped; a binary killed by a signal leaves them, as any fixture would); a
//! server a test broke (its API server not ready within [`READY`]) is stopped and replaced.
//! Clients are made per test from the kubeconfigs (a kube-rs client lives on the runtime of
//! the test that made it, and each test has its own).

use crate::kube::{self, Cluster, Options, proc::Proc};
use crate::{Client, JSON, MERGE, Resp, Write};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::{Semaphore, SemaphorePermit};

/// How long a test may wait for a server of the pool (the longest test holds one ~2.5 min).
const WAIT_FOR_SERVER: Duration = Duration::from_secs(600);
/// Flags added to the fixture's API server, so that nothing but the test writes: resourceVersion
/// is one counter for every object (fact 11.1), and the facts' "+1" hold only when no other
/// writer interleaves. Left alone, the server writes by itself every few seconds: its identity
/// Lease (`kube-system/apiserver-…`, every 10 s), its peer endpoint lease
/// (`/registry/peerserverleases/…`) and the compaction key etcd's compactor keeps (every
/// minute); compaction is done on demand here ([`Borrowed::compact`]).
const QUIET: [&str; 2] = [
    "--feature-gates=APIServerIdentity=false,UnknownVersionInteroperabilityProxy=false",
    "--etcd-compaction-interval=0",
];
/// How long a (re)started API server may take to be ready.
const READY: Duration = Duration::from_secs(90);

/// One real cluster of the pool.
struct Server {
    cluster: Cluster,
    /// kubeconfigs by identity: `admin`, `node-a`, `node-b`
    kubeconfigs: HashMap<&'static str, PathBuf>,
    /// the API server's command line, to restart it
    args: Vec<String>,
    /// etcd's client address
    etcd: std::net::SocketAddr,
}

static IDLE: Mutex<Vec<Server>> = Mutex::new(Vec::new());

fn idle() -> std::sync::MutexGuard<'static, Vec<Server>> {
    IDLE.lock().unwrap_or_else(|e| e.into_inner())
}

/// One permit per server the pool may hold.
fn slots() -> &'static Semaphore {
    static SLOTS: OnceLock<Semaphore> = OnceLock::new();
    SLOTS.get_or_init(|| {
        let threads = std::env::var("RUST_TEST_THREADS")
            .ok()
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()));
        Semaphore::new(threads.clamp(1, 4))
    })
}

unsafe extern "C" {
    fn atexit(f: extern "C" fn()) -> std::ffi::c_int;
}

/// At exit: kill every pooled server's processes and remove its files.
extern "C" fn stop_all() {
    for mut s in idle().drain(..) {
        s.cluster.apiserver.kill();
        s.cluster.etcd.kill();
    }
}

fn stop_all_at_exit() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: registers a plain function; the handler only kills children and removes files
        let rc = unsafe { atexit(stop_all) };
        assert_eq!(rc, 0, "atexit");
    });
}

/// A kube-rs client for a kubeconfig, without kube-rs's retries (a 429, 503 or 504 is an
/// answer the tests read).
pub async fn client(kubeconfig: &std::path::Path) -> ::kube::Client {
    let kc = ::kube::config::Kubeconfig::read_from(kubeconfig).expect("read kubeconfig");
    let mut cfg = ::kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .expect("kubeconfig");
    cfg.default_retry = false;
    ::kube::Client::try_from(cfg).expect("kube client")
}

/// The value of `--<flag>=` on a command line.
fn flag<'a>(args: &'a [String], name: &str) -> &'a str {
    let prefix = format!("--{name}=");
    args.iter()
        .find_map(|a| a.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no {prefix} in {args:?}"))
}

/// A process's command line, without the program.
fn cmdline(p: &Proc) -> Vec<String> {
    let pid = p.pid().expect("running");
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).expect("read cmdline");
    raw.split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .skip(1)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect()
}

impl Server {
    async fn start() -> Server {
        stop_all_at_exit();
        let t0 = Instant::now();
        let cluster = Cluster::start(Options { nodes: vec![] }).await;
        eprintln!("real API server started in {:.1?}", t0.elapsed());
        let mut args = cmdline(&cluster.apiserver);
        args.extend(QUIET.iter().map(|a| a.to_string()));
        let etcd = flag(&args, "etcd-servers")
            .trim_start_matches("http://")
            .parse()
            .expect("etcd address");
        let mut kubeconfigs = HashMap::new();
        kubeconfigs.insert("admin", cluster.admin_kubeconfig.clone());
        for n in ["node-a", "node-b"] {
            kubeconfigs.insert(n, cluster.node_kubeconfig(n));
        }
        let mut s = Server {
            cluster,
            kubeconfigs,
            args,
            etcd,
        };
        let admin = s.admin().await;
        s.restart(&admin).await.unwrap_or_else(|e| panic!("{e}"));
        // the first process's peer endpoint lease, which would expire (a write) in a test
        let (key, end) = ("/registry/peerserverleases/", "/registry/peerserverleases0");
        s.etcd(
            "/v3/kv/deleterange",
            json!({"key": b64(key), "range_end": b64(end)}),
        )
        .await;
        eprintln!("real API server ready in {:.1?}", t0.elapsed());
        s
    }

    /// Kills the API server (as a crash) and starts it again with [`Self::args`].
    async fn restart(&mut self, admin: &Client) -> Result<(), String> {
        self.cluster.apiserver.kill();
        self.cluster.apiserver = Proc::start(
            "kube-apiserver",
            &kube::bin("kube-apiserver"),
            &self.args,
            self.cluster.dir.path(),
        );
        self.wait_ready(admin).await
    }

    async fn admin(&self) -> Client {
        Client::Real(client(&self.kubeconfigs["admin"]).await)
    }

    /// Waits until the API server answers `/readyz` with 200; `Err` when it exited or took
    /// longer than [`READY`].
    async fn wait_ready(&mut self, admin: &Client) -> Result<(), String> {
        let Client::Real(k) = admin else {
            unreachable!()
        };
        let t0 = Instant::now();
        loop {
            if let Some(st) = self.cluster.apiserver.exited() {
                return Err(format!(
                    "the API server exited ({st}):\n{}",
                    self.cluster.apiserver.tail(30)
                ));
            }
            let req = http::Request::get("/readyz")
                .body(::kube::client::Body::empty())
                .unwrap();
            let ok = tokio::time::timeout(Duration::from_secs(5), k.send(req)).await;
            if matches!(ok, Ok(Ok(r)) if r.status() == 200) {
                return Ok(());
            }
            if t0.elapsed() > READY {
                return Err(format!(
                    "the API server was not ready within {READY:?}:\n{}",
                    self.cluster.apiserver.tail(30)
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Back to the facts' set-up, but for the Nodes, which the bed creates.
    async fn reset(&mut self) -> Result<(), String> {
        let admin = self.admin().await;
        self.wait_ready(&admin).await?;
        let ok = |r: &Resp, what: &str| {
            if (200..300).contains(&r.code) || r.code == 404 {
                Ok(())
            } else {
                Err(format!("reset: {what}: {} {:#}", r.code, r.body))
            }
        };
        // pods: finalizers cleared, then deleted at once
        let pods = admin.get("/api/v1/pods").await;
        ok(&pods, "list pods")?;
        for p in pods.body["items"].as_array().into_iter().flatten() {
            let (ns, name) = (&p["metadata"]["namespace"], &p["metadata"]["name"]);
            let path = format!(
                "/api/v1/namespaces/{}/pods/{}",
                ns.as_str().unwrap(),
                name.as_str().unwrap()
            );
            if p["metadata"]["finalizers"].is_array() {
                let r = admin
                    .patch(&path, MERGE, &json!({"metadata": {"finalizers": null}}))
                    .await;
                ok(&r, &path)?;
            }
            let r = admin
                .delete(&path, Some(&json!({"gracePeriodSeconds": 0})))
                .await;
            ok(&r, &path)?;
        }
        // the rest by collection, in every namespace they can be in
        let namespaces = admin.get("/api/v1/namespaces").await;
        ok(&namespaces, "list namespaces")?;
        let mut collections = vec![
            "/api/v1/nodes".to_owned(),
            "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases".to_owned(),
        ];
        for ns in namespaces.body["items"].as_array().into_iter().flatten() {
            let ns = ns["metadata"]["name"].as_str().unwrap_or("");
            if ns != "kube-system" {
                collections.push(format!("/api/v1/namespaces/{ns}/events"));
                collections.push(format!(
                    "/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets"
                ));
            }
        }
        for c in &collections {
            let r = admin.delete(c, None).await;
            ok(&r, c)?;
        }
        for c in ["/api/v1/pods", "/api/v1/nodes"] {
            let left = admin.get(c).await;
            ok(&left, c)?;
            if left.body["items"].as_array().is_some_and(|l| !l.is_empty()) {
                return Err(format!("reset: {c} left: {:#}", left.body));
            }
        }
        Ok(())
    }

    /// One request to etcd's JSON gateway.
    async fn etcd(&self, path: &str, body: Value) -> Value {
        let req = hyper::Request::post(path)
            .header("host", "etcd")
            .header("content-type", JSON)
            .body(Full::new(Bytes::from(body.to_string())))
            .unwrap();
        let fut = async {
            let mut send = crate::connect(self.etcd).await;
            let resp = send.send_request(req).await.expect("etcd answered");
            let code = resp.status();
            let bytes = resp.into_body().collect().await.expect("body").to_bytes();
            let v: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            assert!(code.is_success(), "etcd {path}: {code} {v}");
            v
        };
        tokio::time::timeout(Duration::from_secs(30), fut)
            .await
            .expect("etcd answered within 30 s")
    }

    /// etcd's current revision (what a resourceVersion counts).
    async fn revision(&self) -> u64 {
        // a range read of a key nobody has: only the header
        let v = self.etcd("/v3/kv/range", json!({"key": "AA=="})).await;
        v["header"]["revision"]
            .as_str()
            .and_then(|r| r.parse().ok())
            .expect("a revision")
    }
}

/// Base64 of `s` (etcd's JSON gateway takes keys so).
fn b64(s: &str) -> String {
    const ABC: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in s.as_bytes().chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (b[0] as u32) << 16 | (b[1] as u32) << 8 | b[2] as u32;
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ABC[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// A server of the pool, lent to one test; back to the pool when dropped.
pub struct Borrowed {
    server: Option<Server>,
    _permit: SemaphorePermit<'static>,
}

impl Borrowed {
    /// An idle server, reset; or a new one.
    pub async fn get() -> Borrowed {
        let permit = tokio::time::timeout(WAIT_FOR_SERVER, slots().acquire())
            .await
            .unwrap_or_else(|_| panic!("no real API server free within {WAIT_FOR_SERVER:?}"))
            .expect("pool open");
        let mut server = None;
        let pooled = idle().pop();
        if let Some(mut s) = pooled {
            match s.reset().await {
                Ok(()) => server = Some(s),
                Err(e) => eprintln!("a pooled real API server is replaced: {e}"),
            }
        }
        let server = match server {
            Some(s) => s,
            None => Server::start().await,
        };
        Borrowed {
            server: Some(server),
            _permit: permit,
        }
    }

    fn server(&self) -> &Server {
        self.server.as_ref().unwrap()
    }

    /// A client for `who`: `admin`, `node-a` or `node-b`.
    pub async fn client(&self, who: &str) -> ::kube::Client {
        client(&self.server().kubeconfigs[who]).await
    }

    /// The writes the audit log recorded as received at or after `since`.
    pub fn writes_since(&self, since: jiff::Timestamp) -> Vec<Write> {
        self.server()
            .cluster
            .audit()
            .into_iter()
            .filter(|a| a.is_write())
            .filter(|a| {
                a.received
                    .parse::<jiff::Timestamp>()
                    .is_ok_and(|t| t >= since)
            })
            .map(|a| Write {
                method: match a.verb.as_str() {
                    "create" => "POST",
                    "update" => "PUT",
                    "patch" => "PATCH",
                    _ => "DELETE",
                }
                .to_owned(),
                path: a.uri.split('?').next().unwrap_or("").to_owned(),
                code: a.code,
            })
            .collect()
    }

    /// etcd compacted at its current revision through its own API, then the API server
    /// restarted (killed, as a crash): its watch cache starts at the current revision.
    /// Returns the revision the server's watches now go back to.
    pub async fn compact(&mut self, admin: &Client) -> u64 {
        let s = self.server.as_mut().unwrap();
        let rev = s.revision().await;
        s.etcd(
            "/v3/kv/compaction",
            json!({"revision": rev.to_string(), "physical": true}),
        )
        .await;
        s.restart(admin).await.unwrap_or_else(|e| panic!("{e}"));
        rev
    }
}

impl Drop for Borrowed {
    fn drop(&mut self) {
        if let Some(s) = self.server.take() {
            idle().push(s);
        }
    }
}
