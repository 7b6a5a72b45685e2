//! Conformance of the in-process API server (`tests/common/apiserver`) with a real
//! kube-apiserver v1.36, fact by fact: one test per fact of
//! `../shared/reference/apiserver-facts.md`, named `fact_<section>_<n>_…`, each checking the
//! status code, reason, message where anything reads it, the watch sequence and the object
//! afterwards. Requests go over real HTTP with the identities the facts used: an admin and the
//! nodes `node-a` and `node-b`.
//!
//! Every fact runs twice, with the same assertions: `<fact>::imitation` against the imitation
//! (bearer tokens standing for the client certificates) and `<fact>::real` against a real
//! kube-apiserver v1.36 with etcd (`tests/common/kube`, client certificates, TLS), so
//! `cargo test --test apiserver_conformance real` (or `imitation`) selects one side. Where they
//! disagree the imitation is wrong: the real server is the truth. The few facts the real server
//! cannot show on demand are `imitation` only, with the reason beside them; `faults.rs` (5xx and
//! 429 storms, stalls, trickled bodies) is the imitation's own layer and has no real side.
//!
//! The real servers come from a small pool (`real.rs`): started once per binary, one test at a
//! time each, reset to the facts' set-up (no pods, PDBs, events, leases; Nodes `node-a` and
//! `node-b` created afresh) before every test.
//!
//! Facts listed as out of scope in `tests/common/apiserver/mod.rs` have no test here.

#[path = "../common/apiserver/mod.rs"]
mod apiserver;
#[path = "../common/kube/mod.rs"]
#[allow(dead_code)]
mod kube;
#[path = "../common/port.rs"]
mod port;

mod eviction;
mod faults;
mod force_delete;
mod mirror;
mod nodes;
mod other;
mod pods;
mod real;
mod status;
mod watch;

use apiserver::{ApiServer, User};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use std::time::Duration;

/// Which API server a test talks to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// The in-process imitation (`tests/common/apiserver`).
    Imitation,
    /// A real kube-apiserver v1.36 and etcd (`tests/common/kube`).
    Real,
}

/// `both!(fact_x);` before `async fn fact_x(b: Backend)`: the module `fact_x` with the tests
/// `imitation` and `real`, each running the fact against its backend.
macro_rules! both {
    ($fact:ident) => {
        mod $fact {
            #[tokio::test]
            async fn imitation() {
                super::$fact($crate::Backend::Imitation).await
            }
            #[tokio::test]
            async fn real() {
                super::$fact($crate::Backend::Real).await
            }
        }
    };
}

/// `imitation_only!(fact_x);`: only the `imitation` test (say beside it why the real server
/// cannot show the fact on demand).
macro_rules! imitation_only {
    ($fact:ident) => {
        mod $fact {
            #[tokio::test]
            async fn imitation() {
                super::$fact($crate::Backend::Imitation).await
            }
        }
    };
}
pub(crate) use {both, imitation_only};

/// An answer: code, headers and the body as JSON (`Null` if it was not JSON).
#[derive(Debug)]
pub struct Resp {
    pub code: u16,
    pub headers: http::HeaderMap,
    pub body: Value,
}

impl Resp {
    pub fn reason(&self) -> &str {
        self.body["reason"].as_str().unwrap_or("")
    }

    pub fn message(&self) -> &str {
        self.body["message"].as_str().unwrap_or("")
    }

    pub fn rv(&self) -> u64 {
        rv(&self.body)
    }

    /// Asserts the code, and the message when one is given.
    #[track_caller]
    pub fn expect(&self, code: u16, message: Option<&str>) -> &Self {
        assert_eq!(self.code, code, "answer: {:#}", self.body);
        if let Some(m) = message {
            assert_eq!(self.message(), m, "answer: {:#}", self.body);
        }
        self
    }
}

/// An object's resourceVersion as a number.
pub fn rv(obj: &Value) -> u64 {
    obj["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|r| r.parse().ok())
        .unwrap_or(0)
}

pub const JSON: &str = "application/json";
pub const MERGE: &str = "application/merge-patch+json";
pub const STRATEGIC: &str = "application/strategic-merge-patch+json";
pub const JSON_PATCH: &str = "application/json-patch+json";

/// A client with one identity.
#[derive(Clone)]
pub enum Client {
    /// The imitation: plain HTTP/1.1, a fresh connection per request, a bearer token.
    Imitation {
        addr: std::net::SocketAddr,
        user: User,
    },
    /// The real server: kube-rs over TLS with the identity's client certificate (no retries).
    Real(::kube::Client),
}

pub(crate) async fn connect(
    addr: std::net::SocketAddr,
) -> hyper::client::conn::http1::SendRequest<Full<Bytes>> {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect to the API server");
    let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("HTTP handshake");
    tokio::spawn(conn);
    send
}

/// The User-Agent of every request (fact 11.7: the field manager is taken from it).
pub const USER_AGENT: &str = "conformance/v0";

impl Client {
    pub fn admin(api: &ApiServer) -> Client {
        Client::Imitation {
            addr: api.addr,
            user: User::Admin,
        }
    }

    pub fn node(api: &ApiServer, node: &str) -> Client {
        Client::Imitation {
            addr: api.addr,
            user: User::Node(node.to_owned()),
        }
    }

    /// The imitation's address (its fault tests speak raw HTTP to it).
    pub fn addr(&self) -> std::net::SocketAddr {
        match self {
            Client::Imitation { addr, .. } => *addr,
            Client::Real(_) => panic!("a raw connection to the real server"),
        }
    }

    /// A request to the imitation, with its bearer token.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        ct: &str,
        body: Option<&Value>,
    ) -> hyper::Request<Full<Bytes>> {
        let Client::Imitation { user, .. } = self else {
            panic!("a raw request to the real server");
        };
        let bytes = body.map(|b| b.to_string()).unwrap_or_default();
        let mut b = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", "apiserver")
            .header("authorization", format!("Bearer {}", user.token()))
            .header("user-agent", USER_AGENT);
        if body.is_some() {
            b = b.header("content-type", ct);
        }
        b.body(Full::new(Bytes::from(bytes))).expect("request")
    }

    /// A request to the real server (kube-rs adds the client certificate).
    fn real_request(
        method: &str,
        path: &str,
        ct: &str,
        body: Option<&Value>,
        user_agent: Option<&str>,
    ) -> http::Request<::kube::client::Body> {
        let mut b = http::Request::builder().method(method).uri(path);
        if let Some(ua) = user_agent {
            b = b.header("user-agent", ua);
        }
        if body.is_some() {
            b = b.header("content-type", ct);
        }
        let bytes = body.map(|b| b.to_string()).unwrap_or_default();
        b.body(::kube::client::Body::from(bytes.into_bytes()))
            .expect("request")
    }

    /// One request (at most 30 s): on a fresh connection to the imitation, on kube-rs's
    /// connection pool to the real server.
    pub async fn send(&self, method: &str, path: &str, ct: &str, body: Option<&Value>) -> Resp {
        self.send_as(method, path, ct, body, Some(USER_AGENT)).await
    }

    /// [`Self::send`] with another User-Agent, or none (the real server only).
    pub async fn send_as(
        &self,
        method: &str,
        path: &str,
        ct: &str,
        body: Option<&Value>,
        user_agent: Option<&str>,
    ) -> Resp {
        let fut = async {
            let (code, headers, bytes) = match self {
                Client::Imitation { addr, .. } => {
                    assert_eq!(user_agent, Some(USER_AGENT), "raw HTTP for another agent");
                    let req = self.request(method, path, ct, body);
                    let mut send = connect(*addr).await;
                    let resp = send.send_request(req).await.expect("an answer");
                    let code = resp.status().as_u16();
                    let headers = resp.headers().clone();
                    let bytes = resp.into_body().collect().await.expect("a body").to_bytes();
                    (code, headers, bytes)
                }
                Client::Real(k) => {
                    let req = Self::real_request(method, path, ct, body, user_agent);
                    let resp = k
                        .send(req)
                        .await
                        .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
                    let code = resp.status().as_u16();
                    let headers = resp.headers().clone();
                    let bytes = resp.into_body().collect().await.expect("a body").to_bytes();
                    (code, headers, bytes)
                }
            };
            let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            Resp {
                code,
                headers,
                body,
            }
        };
        tokio::time::timeout(Duration::from_secs(30), fut)
            .await
            .unwrap_or_else(|_| panic!("{method} {path}: no answer within 30 s"))
    }

    pub async fn get(&self, path: &str) -> Resp {
        self.send("GET", path, JSON, None).await
    }

    pub async fn post(&self, path: &str, body: &Value) -> Resp {
        self.send("POST", path, JSON, Some(body)).await
    }

    pub async fn put(&self, path: &str, body: &Value) -> Resp {
        self.send("PUT", path, JSON, Some(body)).await
    }

    pub async fn patch(&self, path: &str, ct: &str, body: &Value) -> Resp {
        self.send("PATCH", path, ct, Some(body)).await
    }

    /// DELETE with `DeleteOptions` as the body (none: no body).
    pub async fn delete(&self, path: &str, opts: Option<&Value>) -> Resp {
        self.send("DELETE", path, JSON, opts).await
    }

    /// Opens a watch (`path` carries the query); a non-200 answer comes back as `Err`.
    pub async fn watch(&self, path: &str) -> Result<Watch, Resp> {
        let limit = Duration::from_secs(30);
        let (code, headers, body, keep) = match self {
            Client::Imitation { addr, .. } => {
                let req = self.request("GET", path, JSON, None);
                let mut send = connect(*addr).await;
                let resp = tokio::time::timeout(limit, send.send_request(req))
                    .await
                    .expect("watch answered within 30 s")
                    .expect("an answer");
                let (parts, body) = resp.into_parts();
                let body = body.map_err(Into::into).boxed_unsync();
                (parts.status.as_u16(), parts.headers, body, Some(send))
            }
            Client::Real(k) => {
                let req = Self::real_request("GET", path, JSON, None, Some(USER_AGENT));
                let resp = tokio::time::timeout(limit, k.send(req))
                    .await
                    .expect("watch answered within 30 s")
                    .unwrap_or_else(|e| panic!("watch {path}: {e}"));
                let (parts, body) = resp.into_parts();
                let body = body.map_err(Into::into).boxed_unsync();
                (parts.status.as_u16(), parts.headers, body, None)
            }
        };
        let mut body: AnyBody = body;
        if code != 200 {
            let bytes = tokio::time::timeout(limit, body.collect())
                .await
                .expect("a body within 30 s")
                .expect("a body")
                .to_bytes();
            return Err(Resp {
                code,
                headers,
                body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            });
        }
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            let mut buf = Vec::new();
            while let Some(data) = next_data(&mut body).await {
                buf.extend_from_slice(&data);
                while let Some(i) = buf.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = buf.drain(..=i).collect();
                    if let Ok(v) = serde_json::from_slice::<Value>(&line)
                        && tx.send(v).is_err()
                    {
                        return;
                    }
                }
            }
        });
        Ok(Watch {
            rx,
            task,
            _send: keep,
        })
    }
}

/// A response body of either client.
type AnyBody =
    http_body_util::combinators::UnsyncBoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

/// The next data frame; `None` at the end or on an error.
async fn next_data(body: &mut AnyBody) -> Option<Bytes> {
    loop {
        let frame = body.frame().await?.ok()?;
        if let Ok(data) = frame.into_data() {
            return Some(data);
        }
    }
}

/// An open watch: its events, in order.
pub struct Watch {
    rx: tokio::sync::mpsc::UnboundedReceiver<Value>,
    /// reads the stream; aborted (the stream closed) when the watch is dropped
    task: tokio::task::JoinHandle<()>,
    /// the imitation's connection
    _send: Option<hyper::client::conn::http1::SendRequest<Full<Bytes>>>,
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Watch {
    /// The next event within `limit`; `None` if none came or the stream ended.
    pub async fn next(&mut self, limit: Duration) -> Option<Value> {
        tokio::time::timeout(limit, self.rx.recv())
            .await
            .ok()
            .flatten()
    }

    /// The next event's type and object; panics if none comes within 5 s.
    #[track_caller]
    pub fn expect_next(&mut self) -> impl std::future::Future<Output = (String, Value)> + '_ {
        let caller = std::panic::Location::caller();
        async move {
            let ev = self
                .next(Duration::from_secs(5))
                .await
                .unwrap_or_else(|| panic!("{caller}: no watch event within 5 s"));
            (
                ev["type"].as_str().unwrap_or("").to_owned(),
                ev["object"].clone(),
            )
        }
    }

    /// Asserts nothing arrives for the whole of `window`.
    pub async fn expect_quiet(&mut self, window: Duration) {
        if let Some(ev) = self.next(window).await {
            panic!("unexpected watch event: {ev:#}");
        }
    }

    /// The stream has ended (within `limit`), after any events still buffered.
    pub async fn ended(&mut self, limit: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            match tokio::time::timeout_at(deadline, self.rx.recv()).await {
                Ok(None) => return true,
                Ok(Some(_)) => continue,
                Err(_) => return false,
            }
        }
    }
}

/// The facts' set-up: a fresh server, Nodes `node-a` and `node-b` created by an admin.
pub struct Bed {
    pub backend: Backend,
    /// the imitation (`Backend::Imitation`)
    imitation: Option<ApiServer>,
    /// the real server borrowed from the pool (`Backend::Real`)
    real: Option<real::Borrowed>,
    pub admin: Client,
    pub node_a: Client,
    pub node_b: Client,
}

/// Where a test started counting writes ([`Bed::write_mark`]).
pub struct WriteMark {
    index: usize,
    at: jiff::Timestamp,
}

/// A write request as the server recorded it: the imitation's request log, the real server's
/// audit log.
#[derive(Debug)]
pub struct Write {
    pub method: String,
    /// without the query
    pub path: String,
    pub code: u16,
}

pub const PODS: &str = "/api/v1/namespaces/default/pods";

pub fn pod_path(name: &str) -> String {
    format!("{PODS}/{name}")
}

/// A pod as the facts created them: one container, grace 30, bound to `node` (if any).
pub fn pod_body(name: &str, node: Option<&str>) -> Value {
    let mut p = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": name}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    });
    if let Some(n) = node {
        p["spec"]["nodeName"] = n.into();
    }
    p
}

impl Bed {
    pub async fn new(backend: Backend) -> Bed {
        let bed = match backend {
            Backend::Imitation => {
                let api = ApiServer::start().await;
                Bed {
                    backend,
                    admin: Client::admin(&api),
                    node_a: Client::node(&api, "node-a"),
                    node_b: Client::node(&api, "node-b"),
                    imitation: Some(api),
                    real: None,
                }
            }
            Backend::Real => {
                let real = real::Borrowed::get().await;
                Bed {
                    backend,
                    admin: Client::Real(real.client("admin").await),
                    node_a: Client::Real(real.client("node-a").await),
                    node_b: Client::Real(real.client("node-b").await),
                    imitation: None,
                    real: Some(real),
                }
            }
        };
        for n in ["node-a", "node-b"] {
            let r = bed
                .admin
                .post(
                    "/api/v1/nodes",
                    &json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": n}}),
                )
                .await;
            assert_eq!(r.code, 201, "creating Node {n}: {:#}", r.body);
        }
        bed
    }

    /// The imitation's hooks; panics for the real server (a fact using them is imitation-only).
    pub fn api(&self) -> &ApiServer {
        self.imitation
            .as_ref()
            .expect("an imitation hook on the real server")
    }

    pub fn is_real(&self) -> bool {
        self.backend == Backend::Real
    }

    /// Makes the server forget its history up to now, as compaction and a watch cache that
    /// lost its window do; returns the resourceVersion it now remembers from (a watch from an
    /// older one is answered `410 Expired` with this number, fact 7.1). The imitation forgets
    /// on demand; the real server's etcd is compacted through etcd's own API and the API
    /// server restarted, so that its watch cache starts afresh at the current revision.
    pub async fn compact(&mut self) -> u64 {
        match &mut self.real {
            None => {
                let api = self.api();
                api.compact();
                let r = self.admin.get(PODS).await;
                r.expect(200, None);
                r.rv()
            }
            Some(real) => real.compact(&self.admin).await,
        }
    }

    /// Where [`Self::writes_since`] starts counting.
    pub fn write_mark(&self) -> WriteMark {
        WriteMark {
            index: self.imitation.as_ref().map_or(0, |a| a.writes().len()),
            at: jiff::Timestamp::now(),
        }
    }

    /// The writes received since `mark`, once `until` holds for them (at most 5 s: the real
    /// server's audit log is written as each request completes).
    pub async fn writes_since(
        &self,
        mark: &WriteMark,
        until: impl Fn(&[Write]) -> bool,
    ) -> Vec<Write> {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            let writes: Vec<Write> = match &self.real {
                None => self
                    .api()
                    .writes()
                    .into_iter()
                    .skip(mark.index)
                    .map(|r| Write {
                        method: r.method,
                        path: r.path,
                        code: r.status,
                    })
                    .collect(),
                Some(real) => real.writes_since(mark.at),
            };
            if until(&writes) || std::time::Instant::now() > deadline {
                return writes;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Every core/v1 Event stored, in order of creation (the imitation's store; the real
    /// server's, listed by the admin).
    pub async fn events(&self) -> Vec<Value> {
        if self.real.is_none() {
            return self.api().events();
        }
        let r = self.admin.get("/api/v1/events").await;
        r.expect(200, None);
        let mut evs = r.body["items"].as_array().cloned().unwrap_or_default();
        evs.sort_by_key(rv);
        evs
    }

    /// Namespace `ns` exists (created by the admin if missing).
    pub async fn add_namespace(&self, ns: &str) {
        if self.real.is_none() {
            return self.api().add_namespace(ns);
        }
        let body = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
        let r = self.admin.post("/api/v1/namespaces", &body).await;
        assert!(
            r.code == 201 || r.code == 409,
            "namespace {ns}: {:#}",
            r.body
        );
    }

    /// Admin creates `body`; returns the stored object.
    pub async fn create(&self, body: Value) -> Value {
        let ns = body["metadata"]["namespace"].as_str().unwrap_or("default");
        let r = self
            .admin
            .post(&format!("/api/v1/namespaces/{ns}/pods"), &body)
            .await;
        assert_eq!(r.code, 201, "creating a pod: {:#}", r.body);
        r.body
    }

    /// Admin creates pod `name` bound to `node`.
    pub async fn pod(&self, name: &str, node: Option<&str>) -> Value {
        self.create(pod_body(name, node)).await
    }

    /// Pod `name` bound to node-a, then its phase set to `Running` and `Ready` by node-a.
    pub async fn running(&self, name: &str) -> Value {
        self.pod(name, Some("node-a")).await;
        let r = self
            .node_a
            .patch(
                &format!("{}/status", pod_path(name)),
                STRATEGIC,
                &json!({"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}),
            )
            .await;
        assert_eq!(r.code, 200, "{:#}", r.body);
        r.body
    }

    /// The stored pod, read by the admin (None when 404).
    pub async fn stored(&self, name: &str) -> Option<Value> {
        let r = self.admin.get(&pod_path(name)).await;
        match r.code {
            200 => Some(r.body),
            404 => None,
            c => panic!("GET {name}: {c} {:#}", r.body),
        }
    }

    /// An admin watch of pods in `default` from now.
    pub async fn watch_pods(&self) -> Watch {
        let list = self.admin.get(PODS).await;
        let rv = list.rv();
        self.admin
            .watch(&format!("{PODS}?watch=1&resourceVersion={rv}"))
            .await
            .expect("watch")
    }
}

/// Whole-second RFC 3339 time as Unix seconds.
pub fn secs(t: &Value) -> i64 {
    t.as_str()
        .and_then(|s| s.parse::<jiff::Timestamp>().ok())
        .map(|t| t.as_second())
        .unwrap_or_else(|| panic!("not a time: {t}"))
}

pub fn now() -> i64 {
    jiff::Timestamp::now().as_second()
}
