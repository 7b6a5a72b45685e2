//! Conformance of the in-process API server (`tests/common/apiserver`) with a real
//! kube-apiserver v1.36, fact by fact: one test per fact of
//! `../shared/reference/apiserver-facts.md`, named `fact_<section>_<n>_…`, each checking the
//! status code, reason, message where anything reads it, the watch sequence and the object
//! afterwards. Requests go over real HTTP with the identities the facts used: an admin and the
//! nodes `node-a` and `node-b` (bearer tokens standing for their client certificates).
//!
//! Facts listed as out of scope in `tests/common/apiserver/mod.rs` have no test here.

#[path = "../common/apiserver/mod.rs"]
mod apiserver;

mod eviction;
mod faults;
mod force_delete;
mod mirror;
mod nodes;
mod other;
mod pods;
mod status;
mod watch;

use apiserver::{ApiServer, User};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use std::time::Duration;

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
pub struct Client {
    addr: std::net::SocketAddr,
    user: User,
}

async fn connect(
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

impl Client {
    pub fn admin(api: &ApiServer) -> Client {
        Client {
            addr: api.addr,
            user: User::Admin,
        }
    }

    pub fn node(api: &ApiServer, node: &str) -> Client {
        Client {
            addr: api.addr,
            user: User::Node(node.to_owned()),
        }
    }

    fn request(
        &self,
        method: &str,
        path: &str,
        ct: &str,
        body: Option<&Value>,
    ) -> hyper::Request<Full<Bytes>> {
        let bytes = body.map(|b| b.to_string()).unwrap_or_default();
        let mut b = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", "apiserver")
            .header("authorization", format!("Bearer {}", self.user.token()))
            .header("user-agent", "conformance/v0");
        if body.is_some() {
            b = b.header("content-type", ct);
        }
        b.body(Full::new(Bytes::from(bytes))).expect("request")
    }

    /// One request on a fresh connection (at most 30 s).
    pub async fn send(&self, method: &str, path: &str, ct: &str, body: Option<&Value>) -> Resp {
        let req = self.request(method, path, ct, body);
        let fut = async {
            let mut send = connect(self.addr).await;
            let resp = send.send_request(req).await.expect("an answer");
            let code = resp.status().as_u16();
            let headers = resp.headers().clone();
            let bytes = resp.into_body().collect().await.expect("a body").to_bytes();
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
        let req = self.request("GET", path, JSON, None);
        let mut send = connect(self.addr).await;
        let resp = tokio::time::timeout(Duration::from_secs(30), send.send_request(req))
            .await
            .expect("watch answered within 30 s")
            .expect("an answer");
        let code = resp.status().as_u16();
        if code != 200 {
            let headers = resp.headers().clone();
            let bytes = resp.into_body().collect().await.expect("body").to_bytes();
            return Err(Resp {
                code,
                headers,
                body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            });
        }
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let mut body = resp.into_body();
        tokio::spawn(async move {
            let mut buf = Vec::new();
            while let Some(frame) = body.frame().await {
                let Ok(frame) = frame else { break };
                let Ok(data) = frame.into_data() else {
                    continue;
                };
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
        Ok(Watch { rx, _send: send })
    }
}

/// An open watch: its events, in order.
pub struct Watch {
    rx: tokio::sync::mpsc::UnboundedReceiver<Value>,
    _send: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
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
    pub api: ApiServer,
    pub admin: Client,
    pub node_a: Client,
    pub node_b: Client,
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
    pub async fn new() -> Bed {
        let api = ApiServer::start().await;
        let admin = Client::admin(&api);
        for n in ["node-a", "node-b"] {
            let r = admin
                .post(
                    "/api/v1/nodes",
                    &json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": n}}),
                )
                .await;
            assert_eq!(r.code, 201, "creating Node {n}: {:#}", r.body);
        }
        let node_a = Client::node(&api, "node-a");
        let node_b = Client::node(&api, "node-b");
        Bed {
            api,
            admin,
            node_a,
            node_b,
        }
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
