//! An in-process Kubernetes API server for tests: real HTTP/1.1 on loopback, so reaplet's real
//! client code (kube-rs) is exercised. It implements what reaplet uses with the real server's
//! semantics (pkg/registry/core/pod strategy and eviction storage, apiserver watch):
//!
//! * pods: list and watch (resourceVersion, `fieldSelector` on `spec.nodeName` and
//!   `metadata.name`, 410 Gone for a compacted resourceVersion, synthetic ADDED for a watch
//!   without one), get, create;
//! * graceful DELETE: grace from DeleteOptions, else the spec (default 30); 0 for unscheduled
//!   and terminal pods; negative → 1; a repeat delete may only shorten; 0 removes at once (no
//!   finalizers); `preconditions.uid` mismatch → 409 Conflict;
//! * `pods/status` PATCH, strategic merge (conditions by type, container statuses by name) and
//!   JSON merge patch; a `metadata.uid` in the body that differs from the object's → 409;
//! * events create (core/v1 and events.k8s.io/v1); nodes get/list/watch/patch; leases get;
//! * policy/v1 eviction with PodDisruptionBudgets: 201; 429 with a `DisruptionBudget` cause;
//!   500 when more than one PDB matches; pending, terminal and deleting pods bypass PDBs;
//! * every request is recorded with its body, answer and time; faults: refuse connections
//!   (the listener is closed and open connections cut) or answer 500/429 for a while.
#![allow(dead_code)]

use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Bytes, Frame, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{Notify, broadcast, mpsc, watch};

type Body = BoxBody<Bytes, Infallible>;

/// One request as the server saw it.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub at: Instant,
    pub method: String,
    pub path: String,
    pub query: HashMap<String, String>,
    pub content_type: String,
    pub body: Value,
    pub status: u16,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Pod,
    Node,
}

#[derive(Debug, Clone)]
struct WatchEvent {
    rv: u64,
    kind: Kind,
    etype: &'static str,
    obj: Value,
}

#[derive(Default)]
struct Store {
    rv: u64,
    compacted: u64,
    pods: BTreeMap<(String, String), Value>,
    nodes: BTreeMap<String, Value>,
    leases: BTreeMap<(String, String), Value>,
    pdbs: BTreeMap<(String, String), Value>,
    events: Vec<Value>,
    history: VecDeque<WatchEvent>,
    uid_counter: u64,
    /// (verb, resource[/subresource]) that SelfSubjectAccessReviews deny.
    denied: Vec<(String, String)>,
    /// When each pod object left the store, by UID (benchmarks measure to this instant).
    removed: HashMap<String, Instant>,
}

#[derive(Default)]
struct Faults {
    refuse_until: Option<Instant>,
    fail_until: Option<(Instant, u16)>,
    /// A misbehaving server: lists and watches ignore `fieldSelector` (every node's pods).
    ignore_field_selectors: bool,
}

struct State {
    store: Mutex<Store>,
    events_tx: broadcast::Sender<WatchEvent>,
    log: Mutex<Vec<Recorded>>,
    faults: Mutex<Faults>,
    refuse: Notify,
    /// Bumped to cut every open connection.
    generation: watch::Sender<u64>,
}

pub struct ApiServer {
    pub addr: SocketAddr,
    state: Arc<State>,
}

fn now_rfc3339_plus(secs: i64) -> String {
    let t = jiff::Timestamp::now() + jiff::SignedDuration::from_secs(secs);
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

fn status_body(code: u16, reason: &str, message: &str, details: Value) -> Value {
    json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason,
        "details": details, "code": code,
    })
}

fn respond(code: u16, v: &Value) -> Response<Body> {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(v.to_string())).boxed())
        .expect("valid response")
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16)
        {
            out.push(v);
            i += 3;
            continue;
        }
        out.push(if b[i] == b'+' { b' ' } else { b[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn parse_query(q: &str) -> HashMap<String, String> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

fn field(obj: &Value, path: &str) -> String {
    let mut v = obj;
    for p in path.split('.') {
        v = &v[p];
    }
    v.as_str().unwrap_or("").to_owned()
}

/// `spec.nodeName=x,metadata.name=y` (only `=`/`==`).
fn matches_fields(obj: &Value, selector: Option<&String>) -> bool {
    let Some(sel) = selector else { return true };
    sel.split(',').filter(|t| !t.is_empty()).all(|term| {
        let (k, v) = term
            .split_once("==")
            .or_else(|| term.split_once('='))
            .unwrap_or((term, ""));
        field(obj, k) == v
    })
}

fn is_terminal(pod: &Value) -> bool {
    matches!(
        pod["status"]["phase"].as_str(),
        Some("Failed" | "Succeeded")
    )
}

/// RFC 7386 JSON merge patch.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = json!({});
            }
            let t = target.as_object_mut().expect("object");
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        other => *target = other.clone(),
    }
}

fn merge_key(field: &str) -> Option<&'static str> {
    match field {
        "conditions" => Some("type"),
        "containerStatuses" | "initContainerStatuses" | "ephemeralContainerStatuses" => {
            Some("name")
        }
        "podIPs" | "hostIPs" => Some("ip"),
        "addresses" => Some("type"),
        "taints" => Some("key"),
        _ => None,
    }
}

/// Strategic merge patch with the pod/node status merge keys.
pub fn strategic_merge(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let t = target.as_object_mut().expect("object");
    for (k, v) in p {
        if v.is_null() {
            t.remove(k);
            continue;
        }
        match (merge_key(k), v, t.get_mut(k)) {
            (Some(key), Value::Array(items), Some(Value::Array(existing))) => {
                for item in items {
                    let id = &item[key];
                    match existing.iter_mut().find(|e| &e[key] == id) {
                        Some(e) => strategic_merge(e, item),
                        None => existing.push(item.clone()),
                    }
                }
            }
            (_, Value::Object(_), Some(existing @ Value::Object(_))) => {
                strategic_merge(existing, v)
            }
            _ => {
                t.insert(k.clone(), v.clone());
            }
        }
    }
}

impl Store {
    fn bump(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    fn emit(
        &mut self,
        tx: &broadcast::Sender<WatchEvent>,
        kind: Kind,
        etype: &'static str,
        obj: Value,
    ) {
        let ev = WatchEvent {
            rv: self.rv,
            kind,
            etype,
            obj,
        };
        self.history.push_back(ev.clone());
        while self.history.len() > 10_000 {
            let old = self.history.pop_front().expect("non-empty");
            self.compacted = self.compacted.max(old.rv);
        }
        let _ = tx.send(ev);
    }
}

impl ApiServer {
    /// Starts on a free loopback port.
    pub async fn start() -> ApiServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let addr = listener.local_addr().expect("local addr");
        let (events_tx, _) = broadcast::channel(65_536);
        let state = Arc::new(State {
            store: Mutex::new(Store {
                rv: 100,
                ..Store::default()
            }),
            events_tx,
            log: Mutex::default(),
            faults: Mutex::default(),
            refuse: Notify::new(),
            generation: watch::channel(0).0,
        });
        tokio::spawn(accept_loop(listener, addr, state.clone()));
        ApiServer { addr, state }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Writes a kubeconfig for this server and returns its path.
    pub fn write_kubeconfig(&self, dir: &std::path::Path) -> std::path::PathBuf {
        let path = dir.join("kubeconfig");
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {}\nusers:\n- name: node\n  user:\n    token: test-token\ncontexts:\n- name: test\n  context:\n    cluster: test\n    user: node\ncurrent-context: test\n",
            self.url()
        );
        std::fs::write(&path, text).expect("write kubeconfig");
        path
    }

    fn store(&self) -> std::sync::MutexGuard<'_, Store> {
        self.state.store.lock().unwrap()
    }

    /// Creates a pod (as a controller and the scheduler would have): uid, resourceVersion,
    /// creationTimestamp, default grace and phase filled in when missing.
    pub fn create_pod(&self, mut pod: Value) -> Value {
        create_pod(&self.state, &mut pod).expect("create pod");
        pod
    }

    pub fn get_pod(&self, ns: &str, name: &str) -> Option<Value> {
        self.store().pods.get(&(ns.into(), name.into())).cloned()
    }

    /// When the pod with `uid` left the store, if it has.
    pub fn removed_at(&self, uid: &str) -> Option<Instant> {
        self.store().removed.get(uid).copied()
    }

    /// A client's DELETE (not recorded as reaplet's).
    pub fn delete_pod(&self, ns: &str, name: &str, grace: Option<i64>) -> (u16, Value) {
        let opts = match grace {
            Some(g) => json!({"gracePeriodSeconds": g}),
            None => json!({}),
        };
        delete_pod(&self.state, ns, name, &opts)
    }

    /// Sets a pod's phase as another writer would.
    pub fn set_phase(&self, ns: &str, name: &str, phase: &str) {
        let st = &self.state;
        let mut s = st.store.lock().unwrap();
        let rv = s.bump();
        let Some(p) = s.pods.get_mut(&(ns.into(), name.into())) else {
            return;
        };
        p["status"]["phase"] = phase.into();
        p["metadata"]["resourceVersion"] = rv.to_string().into();
        let obj = p.clone();
        s.emit(&st.events_tx, Kind::Pod, "MODIFIED", obj);
    }

    pub fn add_node(&self, node: Value) {
        let mut s = self.store();
        let rv = s.bump();
        let mut node = node;
        node["metadata"]["resourceVersion"] = rv.to_string().into();
        let name = field(&node, "metadata.name");
        s.nodes.insert(name, node.clone());
        s.emit(&self.state.events_tx, Kind::Node, "ADDED", node);
    }

    pub fn get_node(&self, name: &str) -> Option<Value> {
        self.store().nodes.get(name).cloned()
    }

    pub fn add_lease(&self, lease: Value) {
        let key = (
            field(&lease, "metadata.namespace"),
            field(&lease, "metadata.name"),
        );
        self.store().leases.insert(key, lease);
    }

    pub fn add_pdb(&self, pdb: Value) {
        let key = (
            field(&pdb, "metadata.namespace"),
            field(&pdb, "metadata.name"),
        );
        self.store().pdbs.insert(key, pdb);
    }

    pub fn events(&self) -> Vec<Value> {
        self.store().events.clone()
    }

    /// Makes SelfSubjectAccessReviews deny `verb` on `resource` (`pods/status` for a subresource).
    pub fn deny(&self, verb: &str, resource: &str) {
        self.store().denied.push((verb.into(), resource.into()));
    }

    /// Every request received so far.
    pub fn requests(&self) -> Vec<Recorded> {
        self.state.log.lock().unwrap().clone()
    }

    /// Requests that changed something (everything but GET).
    pub fn writes(&self) -> Vec<Recorded> {
        self.requests()
            .into_iter()
            .filter(|r| r.method != "GET")
            .collect()
    }

    /// Forgets history up to now: a watch from an older resourceVersion gets 410 Gone.
    pub fn compact(&self) {
        let mut s = self.store();
        s.compacted = s.rv;
        s.history.clear();
    }

    /// Closes the listener and cuts open connections for `d`: connections are refused.
    pub fn refuse_connections_for(&self, d: Duration) {
        self.state.faults.lock().unwrap().refuse_until = Some(Instant::now() + d);
        self.state.generation.send_modify(|g| *g += 1);
        self.state.refuse.notify_one();
    }

    /// Answers every request with `code` (500, 429 with Retry-After) for `d`.
    /// From now on, lists and watches send every node's pods whatever the field selector.
    pub fn ignore_field_selectors(&self) {
        self.state.faults.lock().unwrap().ignore_field_selectors = true;
    }

    pub fn fail_for(&self, d: Duration, code: u16) {
        self.state.faults.lock().unwrap().fail_until = Some((Instant::now() + d, code));
    }
}

async fn accept_loop(first: tokio::net::TcpListener, addr: SocketAddr, state: Arc<State>) {
    let mut listener = Some(first);
    loop {
        let l = match listener.take() {
            Some(l) => l,
            None => {
                let until = state.faults.lock().unwrap().refuse_until;
                if let Some(t) = until {
                    tokio::time::sleep_until(t.into()).await;
                }
                match tokio::net::TcpListener::bind(addr).await {
                    Ok(l) => l,
                    Err(_) => {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                }
            }
        };
        loop {
            tokio::select! {
                _ = state.refuse.notified() => break,
                acc = l.accept() => {
                    let Ok((stream, _)) = acc else { continue };
                    // a connection that raced with refuse_connections_for is refused too
                    let refusing = state.faults.lock().unwrap().refuse_until.is_some_and(|t| Instant::now() < t);
                    if refusing {
                        drop(stream);
                        continue;
                    }
                    let state = state.clone();
                    let mut generation = state.generation.subscribe();
                    tokio::spawn(async move {
                        let svc_state = state.clone();
                        let svc = hyper::service::service_fn(move |req| {
                            let st = svc_state.clone();
                            async move { Ok::<_, Infallible>(handle(st, req).await) }
                        });
                        let conn = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), svc);
                        tokio::select! {
                            _ = conn => {}
                            _ = generation.changed() => {}
                        }
                    });
                }
            }
        }
        drop(l);
    }
}

async fn handle(state: Arc<State>, req: Request<Incoming>) -> Response<Body> {
    let method = req.method().as_str().to_owned();
    let path = req.uri().path().to_owned();
    let query = parse_query(req.uri().query().unwrap_or(""));
    let content_type = req
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let bytes = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let fail = {
        let mut f = state.faults.lock().unwrap();
        match f.fail_until {
            Some((t, code)) if Instant::now() < t => Some(code),
            Some(_) => {
                f.fail_until = None;
                None
            }
            None => None,
        }
    };
    let resp = match fail {
        Some(code) => {
            let mut r = respond(
                code,
                &status_body(code, "InternalError", "injected fault", json!({})),
            );
            if code == 429 {
                r.headers_mut()
                    .insert("retry-after", "1".parse().expect("header"));
            }
            r
        }
        None => route(&state, &method, &path, &query, &content_type, &body),
    };
    state.log.lock().unwrap().push(Recorded {
        at: Instant::now(),
        method,
        path,
        query,
        content_type,
        body,
        status: resp.status().as_u16(),
    });
    resp
}

fn not_found(kind: &str, name: &str) -> Response<Body> {
    respond(
        404,
        &status_body(
            404,
            "NotFound",
            &format!("{kind} \"{name}\" not found"),
            json!({"name": name, "kind": kind}),
        ),
    )
}

fn route(
    state: &Arc<State>,
    method: &str,
    path: &str,
    query: &HashMap<String, String>,
    ct: &str,
    body: &Value,
) -> Response<Body> {
    let seg: Vec<&str> = path.trim_matches('/').split('/').collect();
    match (method, seg.as_slice()) {
        ("GET", ["api", "v1", "pods"]) => list_or_watch(state, Kind::Pod, None, query),
        ("GET", ["api", "v1", "namespaces", ns, "pods"]) => {
            list_or_watch(state, Kind::Pod, Some(ns), query)
        }
        ("POST", ["api", "v1", "namespaces", ns, "pods"]) => {
            let mut pod = body.clone();
            pod["metadata"]["namespace"] = (*ns).into();
            match create_pod(state, &mut pod) {
                Ok(()) => respond(201, &pod),
                Err(r) => *r,
            }
        }
        (
            "GET",
            ["api", "v1", "namespaces", ns, "pods", name]
            | ["api", "v1", "namespaces", ns, "pods", name, "status"],
        ) => {
            match state
                .store
                .lock()
                .unwrap()
                .pods
                .get(&((*ns).into(), (*name).into()))
            {
                Some(p) => respond(200, p),
                None => not_found("pods", name),
            }
        }
        ("DELETE", ["api", "v1", "namespaces", ns, "pods", name]) => {
            let mut opts = body.clone();
            if !opts.is_object() {
                opts = json!({});
            }
            if let Some(g) = query
                .get("gracePeriodSeconds")
                .and_then(|g| g.parse::<i64>().ok())
            {
                opts["gracePeriodSeconds"] = g.into();
            }
            let (code, v) = delete_pod(state, ns, name, &opts);
            respond(code, &v)
        }
        ("PATCH", ["api", "v1", "namespaces", ns, "pods", name, "status"]) => {
            patch_pod_status(state, ns, name, ct, body)
        }
        ("POST", ["api", "v1", "namespaces", ns, "pods", name, "eviction"]) => {
            evict(state, ns, name, body)
        }
        (
            "POST",
            ["api", "v1", "namespaces", _, "events"]
            | ["apis", "events.k8s.io", "v1", "namespaces", _, "events"],
        ) => {
            state.store.lock().unwrap().events.push(body.clone());
            respond(201, body)
        }
        (
            "POST",
            [
                "apis",
                "authorization.k8s.io",
                "v1",
                "selfsubjectaccessreviews",
            ],
        ) => {
            let a = &body["spec"]["resourceAttributes"];
            let verb = a["verb"].as_str().unwrap_or("").to_owned();
            let mut resource = a["resource"].as_str().unwrap_or("").to_owned();
            if let Some(sub) = a["subresource"].as_str().filter(|s| !s.is_empty()) {
                resource = format!("{resource}/{sub}");
            }
            let denied = state
                .store
                .lock()
                .unwrap()
                .denied
                .iter()
                .any(|(v, r)| *v == verb && *r == resource);
            let mut out = body.clone();
            out["status"] = if denied {
                json!({"allowed": false, "reason": "denied by the test server"})
            } else {
                json!({"allowed": true})
            };
            respond(201, &out)
        }
        ("GET", ["api", "v1", "nodes"]) => list_or_watch(state, Kind::Node, None, query),
        ("GET", ["api", "v1", "nodes", name]) => match state.store.lock().unwrap().nodes.get(*name)
        {
            Some(n) => respond(200, n),
            None => not_found("nodes", name),
        },
        ("PATCH", ["api", "v1", "nodes", name] | ["api", "v1", "nodes", name, "status"]) => {
            let mut s = state.store.lock().unwrap();
            let rv = s.bump();
            let Some(n) = s.nodes.get_mut(*name) else {
                return not_found("nodes", name);
            };
            if ct.contains("strategic") {
                strategic_merge(n, body);
            } else {
                merge_patch(n, body);
            }
            n["metadata"]["resourceVersion"] = rv.to_string().into();
            let obj = n.clone();
            s.emit(&state.events_tx, Kind::Node, "MODIFIED", obj.clone());
            respond(200, &obj)
        }
        (
            "GET",
            [
                "apis",
                "coordination.k8s.io",
                "v1",
                "namespaces",
                ns,
                "leases",
                name,
            ],
        ) => {
            match state
                .store
                .lock()
                .unwrap()
                .leases
                .get(&((*ns).into(), (*name).into()))
            {
                Some(l) => respond(200, l),
                None => not_found("leases", name),
            }
        }
        (
            "GET",
            [
                "apis",
                "policy",
                "v1",
                "namespaces",
                ns,
                "poddisruptionbudgets",
            ],
        ) => {
            let s = state.store.lock().unwrap();
            let items: Vec<Value> = s
                .pdbs
                .iter()
                .filter(|((n, _), _)| n == ns)
                .map(|(_, v)| v.clone())
                .collect();
            respond(
                200,
                &json!({"kind": "PodDisruptionBudgetList", "apiVersion": "policy/v1", "metadata": {"resourceVersion": s.rv.to_string()}, "items": items}),
            )
        }
        _ => respond(
            404,
            &status_body(
                404,
                "NotFound",
                &format!("the server could not find the requested resource ({method} {path})"),
                json!({}),
            ),
        ),
    }
}

fn create_pod(state: &Arc<State>, pod: &mut Value) -> Result<(), Box<Response<Body>>> {
    let mut s = state.store.lock().unwrap();
    let ns = pod["metadata"]["namespace"]
        .as_str()
        .unwrap_or("default")
        .to_owned();
    let name = field(pod, "metadata.name");
    if s.pods.contains_key(&(ns.clone(), name.clone())) {
        return Err(Box::new(respond(
            409,
            &status_body(
                409,
                "AlreadyExists",
                &format!("pods \"{name}\" already exists"),
                json!({"name": name, "kind": "pods"}),
            ),
        )));
    }
    let rv = s.bump();
    s.uid_counter += 1;
    let m = &mut pod["metadata"];
    m["namespace"] = ns.clone().into();
    if m["uid"].as_str().is_none_or(str::is_empty) {
        m["uid"] = format!("00000000-0000-4000-8000-{:012x}", s.uid_counter).into();
    }
    m["resourceVersion"] = rv.to_string().into();
    m["creationTimestamp"] = now_rfc3339_plus(0).into();
    if pod["spec"]["terminationGracePeriodSeconds"].is_null() {
        pod["spec"]["terminationGracePeriodSeconds"] = 30.into();
    }
    if pod["status"]["phase"].is_null() {
        pod["status"]["phase"] = "Pending".into();
    }
    s.pods.insert((ns, name), pod.clone());
    s.emit(&state.events_tx, Kind::Pod, "ADDED", pod.clone());
    Ok(())
}

/// The pod registry's graceful deletion (`BeforeDelete` + `CheckGracefulDelete`).
fn delete_pod(state: &Arc<State>, ns: &str, name: &str, opts: &Value) -> (u16, Value) {
    let mut s = state.store.lock().unwrap();
    let key = (ns.to_owned(), name.to_owned());
    let Some(pod) = s.pods.get(&key).cloned() else {
        return (
            404,
            status_body(
                404,
                "NotFound",
                &format!("pods \"{name}\" not found"),
                json!({"name": name, "kind": "pods"}),
            ),
        );
    };
    let uid = field(&pod, "metadata.uid");
    if let Some(want) = opts["preconditions"]["uid"].as_str()
        && want != uid
    {
        return (
            409,
            status_body(
                409,
                "Conflict",
                &format!(
                    "Operation cannot be fulfilled on pods \"{name}\": Precondition failed: UID in precondition: {want}, UID in object meta: {uid}"
                ),
                json!({"name": name, "kind": "pods"}),
            ),
        );
    }
    let mut grace = opts["gracePeriodSeconds"]
        .as_i64()
        .or_else(|| pod["spec"]["terminationGracePeriodSeconds"].as_i64())
        .unwrap_or(30);
    if field(&pod, "spec.nodeName").is_empty() || is_terminal(&pod) {
        grace = 0;
    }
    if grace < 0 {
        grace = 1;
    }
    let has_finalizers = pod["metadata"]["finalizers"]
        .as_array()
        .is_some_and(|f| !f.is_empty());
    if let Some(existing) = pod["metadata"]["deletionGracePeriodSeconds"].as_i64()
        && !pod["metadata"]["deletionTimestamp"].is_null()
        && grace >= existing
    {
        // already being deleted: only a shorter grace changes anything
        return (200, pod);
    }
    let rv = s.bump();
    let mut pod = pod;
    pod["metadata"]["resourceVersion"] = rv.to_string().into();
    pod["metadata"]["deletionTimestamp"] = now_rfc3339_plus(grace).into();
    pod["metadata"]["deletionGracePeriodSeconds"] = grace.into();
    if grace == 0 && !has_finalizers {
        s.pods.remove(&key);
        let uid = field(&pod, "metadata.uid");
        s.removed.insert(uid, Instant::now());
        s.emit(&state.events_tx, Kind::Pod, "DELETED", pod.clone());
    } else {
        s.pods.insert(key, pod.clone());
        s.emit(&state.events_tx, Kind::Pod, "MODIFIED", pod.clone());
    }
    (200, pod)
}

fn patch_pod_status(
    state: &Arc<State>,
    ns: &str,
    name: &str,
    ct: &str,
    body: &Value,
) -> Response<Body> {
    let mut s = state.store.lock().unwrap();
    let key = (ns.to_owned(), name.to_owned());
    let Some(current) = s.pods.get(&key).cloned() else {
        return not_found("pods", name);
    };
    let uid = field(&current, "metadata.uid");
    if let Some(want) = body["metadata"]["uid"].as_str()
        && want != uid
    {
        return respond(
            409,
            &status_body(
                409,
                "Conflict",
                &format!(
                    "Operation cannot be fulfilled on pods \"{name}\": the UID in the precondition ({want}) does not match the UID in record ({uid}). The object might have been deleted and then recreated"
                ),
                json!({"name": name, "kind": "pods"}),
            ),
        );
    }
    let mut pod = current;
    let patch = body.get("status").cloned().unwrap_or(json!({}));
    let status = pod.get_mut("status").expect("pods have a status");
    if ct.starts_with("application/strategic-merge-patch+json") {
        strategic_merge(status, &patch);
    } else if ct.starts_with("application/merge-patch+json") {
        merge_patch(status, &patch);
    } else {
        return respond(
            415,
            &status_body(
                415,
                "UnsupportedMediaType",
                &format!("the body of the request was in an unknown format: {ct}"),
                json!({}),
            ),
        );
    }
    let rv = s.bump();
    pod["metadata"]["resourceVersion"] = rv.to_string().into();
    s.pods.insert(key, pod.clone());
    s.emit(&state.events_tx, Kind::Pod, "MODIFIED", pod.clone());
    respond(200, &pod)
}

fn evict(state: &Arc<State>, ns: &str, name: &str, body: &Value) -> Response<Body> {
    let opts = body.get("deleteOptions").cloned().unwrap_or(json!({}));
    let (pod, pdbs) = {
        let s = state.store.lock().unwrap();
        let Some(pod) = s.pods.get(&(ns.into(), name.into())).cloned() else {
            return not_found("pods", name);
        };
        let labels = pod["metadata"]["labels"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        let pdbs: Vec<((String, String), Value)> = s
            .pdbs
            .iter()
            .filter(|((pns, _), pdb)| {
                pns == ns
                    && pdb["spec"]["selector"]["matchLabels"]
                        .as_object()
                        .map(|m| m.iter().all(|(k, v)| labels.get(k) == Some(v)))
                        .unwrap_or(true)
            })
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        (pod, pdbs)
    };
    let bypass = matches!(
        pod["status"]["phase"].as_str(),
        Some("Pending" | "Succeeded" | "Failed")
    ) || !pod["metadata"]["deletionTimestamp"].is_null();
    if !bypass {
        if pdbs.len() > 1 {
            return respond(
                500,
                &status_body(
                    500,
                    "InternalError",
                    "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
                    json!({}),
                ),
            );
        }
        if let Some((key, pdb)) = pdbs.first() {
            let allowed = pdb["status"]["disruptionsAllowed"].as_i64().unwrap_or(0);
            if allowed <= 0 {
                let msg = format!(
                    "The disruption budget {} needs {} healthy pods and has {} currently",
                    key.1,
                    pdb["status"]["desiredHealthy"].as_i64().unwrap_or(0),
                    pdb["status"]["currentHealthy"].as_i64().unwrap_or(0)
                );
                return respond(
                    429,
                    &status_body(
                        429,
                        "TooManyRequests",
                        "Cannot evict pod as it would violate the pod's disruption budget.",
                        json!({"causes": [{"reason": "DisruptionBudget", "message": msg}]}),
                    ),
                );
            }
            let mut s = state.store.lock().unwrap();
            if let Some(p) = s.pdbs.get_mut(key) {
                p["status"]["disruptionsAllowed"] = (allowed - 1).into();
                p["status"]["disruptedPods"][name] = now_rfc3339_plus(0).into();
            }
        }
        // DisruptionTarget before the graceful delete, as the eviction storage does
        let mut s = state.store.lock().unwrap();
        let rv = s.bump();
        if let Some(p) = s.pods.get_mut(&(ns.into(), name.into())) {
            let cond = json!({"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI",
                              "message": "Eviction API: evicting", "lastTransitionTime": now_rfc3339_plus(0)});
            strategic_merge(&mut p["status"], &json!({"conditions": [cond]}));
            p["metadata"]["resourceVersion"] = rv.to_string().into();
            let obj = p.clone();
            s.emit(&state.events_tx, Kind::Pod, "MODIFIED", obj);
        }
    }
    let (code, v) = delete_pod(state, ns, name, &opts);
    if code != 200 {
        return respond(code, &v);
    }
    respond(
        201,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
    )
}

fn list_or_watch(
    state: &Arc<State>,
    kind: Kind,
    ns: Option<&&str>,
    query: &HashMap<String, String>,
) -> Response<Body> {
    let selector = query
        .get("fieldSelector")
        .filter(|_| !state.faults.lock().unwrap().ignore_field_selectors);
    let in_scope = |o: &Value| {
        ns.is_none_or(|n| o["metadata"]["namespace"].as_str() == Some(*n))
            && matches_fields(o, selector)
    };
    let s = state.store.lock().unwrap();
    let current: Vec<Value> = match kind {
        Kind::Pod => s.pods.values().filter(|o| in_scope(o)).cloned().collect(),
        Kind::Node => s.nodes.values().filter(|o| in_scope(o)).cloned().collect(),
    };
    if query.get("watch").map(String::as_str) != Some("true")
        && query.get("watch").map(String::as_str) != Some("1")
    {
        let list_kind = if kind == Kind::Pod {
            "PodList"
        } else {
            "NodeList"
        };
        return respond(
            200,
            &json!({"kind": list_kind, "apiVersion": "v1", "metadata": {"resourceVersion": s.rv.to_string()}, "items": current}),
        );
    }
    let from: Option<u64> = query
        .get("resourceVersion")
        .and_then(|v| v.parse().ok())
        .filter(|v| *v != 0);
    let (tx, rx) = mpsc::channel::<Bytes>(1024);
    let line = |etype: &str, obj: &Value| {
        Bytes::from(format!("{}\n", json!({"type": etype, "object": obj})))
    };
    if let Some(rv) = from
        && rv < s.compacted
    {
        let gone = status_body(
            410,
            "Expired",
            &format!("too old resource version: {rv} ({})", s.compacted),
            json!({}),
        );
        let _ = tx.try_send(line("ERROR", &gone));
        drop(tx);
        return stream_response(rx);
    }
    let mut live = state.events_tx.subscribe();
    let mut last = s.rv;
    match from {
        Some(rv) => {
            for ev in s
                .history
                .iter()
                .filter(|e| e.rv > rv && e.kind == kind && in_scope(&e.obj))
            {
                let _ = tx.try_send(line(ev.etype, &ev.obj));
            }
        }
        None => {
            for o in &current {
                let _ = tx.try_send(line("ADDED", o));
            }
        }
    }
    drop(s);
    let timeout = query
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .unwrap_or(1800);
    let ns = ns.map(|n| (*n).to_owned());
    let selector = selector.cloned();
    tokio::spawn(async move {
        let deadline = tokio::time::sleep(Duration::from_secs(timeout));
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                _ = &mut deadline => return,
                ev = live.recv() => match ev {
                    Ok(ev) => {
                        if ev.rv <= last || ev.kind != kind {
                            continue;
                        }
                        last = ev.rv;
                        let scope = ns.as_deref().is_none_or(|n| ev.obj["metadata"]["namespace"].as_str() == Some(n))
                            && matches_fields(&ev.obj, selector.as_ref());
                        if scope && tx.send(line(ev.etype, &ev.obj)).await.is_err() {
                            return;
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => return,
                    Err(broadcast::error::RecvError::Closed) => return,
                },
            }
        }
    });
    stream_response(rx)
}

fn stream_response(rx: mpsc::Receiver<Bytes>) -> Response<Body> {
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
    });
    Response::builder()
        .status(200)
        .header("content-type", "application/json")
        .body(StreamBody::new(stream).boxed())
        .expect("valid response")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strategic_merge_keys() {
        let mut st = json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}, {"type": "PodScheduled", "status": "True"}],
                            "containerStatuses": [{"name": "a", "image": "busybox", "ready": true}]});
        strategic_merge(
            &mut st,
            &json!({"phase": "Failed", "conditions": [{"type": "Ready", "status": "False"}, {"type": "DisruptionTarget", "status": "True"}],
                                         "containerStatuses": [{"name": "a", "ready": false}]}),
        );
        assert_eq!(st["phase"], "Failed");
        assert_eq!(st["conditions"].as_array().unwrap().len(), 3);
        assert_eq!(st["conditions"][0]["status"], "False");
        assert_eq!(st["containerStatuses"][0]["image"], "busybox");
        assert_eq!(st["containerStatuses"][0]["ready"], false);
    }
}
