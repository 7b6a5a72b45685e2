//! An in-process imitation of kube-apiserver v1.36 for tests: real HTTP/1.1 on loopback, so
//! reaplet's real client code (kube-rs) is exercised, with the semantics a real server was
//! measured to have (`../shared/reference/apiserver-facts.md`, "the facts"; each module's `//!`
//! lists the facts it implements, and `tests/apiserver_conformance` checks each one).
//!
//! Identities are bearer tokens (see [`authorization`]): `admin` (`system:masters`) and
//! `node:<name>` (`system:node:<name>`, group `system:nodes`), authorized by the Node authorizer
//! rules and NodeRestriction admission the facts show. reaplet runs as a node
//! ([`ApiServer::write_kubeconfig`]); the test-side helpers here act as an admin, directly on the
//! store.
//!
//! Modules, by resource: [`pods`] (create, get, graceful delete, spec updates), [`status`]
//! (`pods/status`), [`eviction`] (the Eviction subresource), [`pdbs`] (PodDisruptionBudgets),
//! [`watch`] (list and watch of every resource), [`nodes`], [`leases`], [`events`],
//! [`authorization`], [`faults`] (the fault-injecting layer), with [`store`] (etcd's part),
//! [`patch`] (the patch types), [`reply`] (Status bodies) and [`http`] (the handler chain).
//!
//! Every one of the 98 facts (77 numbered, the 13 rows and closing sentence of section 9's
//! table, and the 8 rows of fact 4.10's) has a conformance test, run against this imitation
//! and against a real kube-apiserver v1.36 with the same assertions. Where the real server
//! showed more than the facts say, the imitation follows it: stored objects are rendered as Go
//! encodes them (condition times `null`, container states `{}`: [`store::render`]); a strategic
//! patch puts the items it adds before the server's own ([`patch`]); a `status.qosClass` sent
//! in a create is kept; `…/NAME?watch=1` is a GET; a PDB's empty selector selects every pod.
//! Facts deliberately not imitated: none. Not imitated either: the real Node authorizer's graph
//! follows the store through an informer, so for some milliseconds after a create or delete a
//! node's GET of that pod answers as before (403, or 404); here it is current at once. Beyond
//! the facts, out of scope (no test relies on them):
//! * what a node's `SelfSubjectAccessReview` answers (not measured): allowed unless a test
//!   denies it ([`ApiServer::deny`]);
//! * protobuf and CBOR bodies, YAML bodies: reaplet and its tests speak JSON;
//! * server-side apply beyond "a strategic merge of the applied fields with a `fieldManager`"
//!   (fact 11.6's 422 without `fieldManager` is implemented; conflict detection is not);
//! * the `binding` subresource of fact 11.5 (pods here are created bound, as in the facts'
//!   own set-up);
//! * garbage collection: `foregroundDeletion` and `orphan` finalizers stay for ever, as they
//!   did on the measured server with no controller manager (fact 2.6), which is the behaviour.
#![allow(dead_code)]
// handlers answer `Result<_, Reply>`: a whole HTTP answer is the error, as in the real server
#![allow(clippy::result_large_err)]

pub mod authorization;
pub mod events;
pub mod eviction;
pub mod faults;
pub mod http;
pub mod leases;
pub mod nodes;
pub mod patch;
pub mod pdbs;
pub mod pods;
pub mod readonly;
pub mod reply;
pub mod status;
pub mod store;
pub mod watch;

pub use authorization::User;

use http_body_util::combinators::BoxBody;
use hyper::body::Bytes;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use store::{Kind, State, Store, str_at};
use tokio::sync::{Notify, broadcast, watch as tokio_watch};

pub type Body = BoxBody<Bytes, Infallible>;

/// One request as the server saw it.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub at: Instant,
    pub method: String,
    pub path: String,
    pub query: HashMap<String, String>,
    pub content_type: String,
    pub user_agent: String,
    pub body: Value,
    /// The authenticated user (empty for a 401).
    pub user: String,
    /// The answer's status code; 0 for a connection reset by the fault layer.
    pub status: u16,
}

pub struct ApiServer {
    pub addr: SocketAddr,
    state: Arc<State>,
}

impl ApiServer {
    /// Starts on a free loopback port, with the namespaces a fresh cluster has.
    pub async fn start() -> ApiServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let addr = listener.local_addr().expect("local addr");
        let (events_tx, _) = broadcast::channel(65_536);
        let state = Arc::new(State {
            store: Mutex::new(Store::new()),
            events_tx,
            log: Default::default(),
            faults: Mutex::default(),
            refuse: Notify::new(),
            generation: tokio_watch::channel(0).0,
            bookmark_every: Mutex::new(Duration::from_secs(60)),
        });
        tokio::spawn(http::accept_loop(listener, addr, state.clone()));
        ApiServer { addr, state }
    }

    /// A second handle on this server (the same store), for a task of the test's own (a
    /// kubelet stand-in renewing its Lease, say).
    pub fn handle(&self) -> ApiServer {
        ApiServer {
            addr: self.addr,
            state: self.state.clone(),
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Writes a kubeconfig that authenticates as node `node` (`system:node:<node>`), as
    /// reaplet runs on a real node, and returns its path.
    pub fn write_kubeconfig(&self, dir: &std::path::Path, node: &str) -> std::path::PathBuf {
        self.write_kubeconfig_as(dir, &User::Node(node.to_owned()))
    }

    /// Writes a kubeconfig for `user` and returns its path.
    pub fn write_kubeconfig_as(&self, dir: &std::path::Path, user: &User) -> std::path::PathBuf {
        let path = dir.join("kubeconfig");
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {}\nusers:\n- name: user\n  user:\n    token: \"{}\"\ncontexts:\n- name: test\n  context:\n    cluster: test\n    user: user\ncurrent-context: test\n",
            self.url(),
            user.token()
        );
        std::fs::write(&path, text).expect("write kubeconfig");
        path
    }

    fn store(&self) -> std::sync::MutexGuard<'_, Store> {
        self.state.lock()
    }

    /// Creates a pod as a controller and the scheduler would have (admin, bound by
    /// `spec.nodeName`): the API's defaults, resourceVersion and creationTimestamp filled in.
    /// Unlike an HTTP create, a `metadata.uid` given is kept, so that a test's runtime pod and
    /// API object can share it.
    pub fn create_pod(&self, pod: Value) -> Value {
        pods::create_trusted(&self.state, pod).expect("create pod")
    }

    pub fn get_pod(&self, ns: &str, name: &str) -> Option<Value> {
        self.store().pods.get(&(ns.into(), name.into())).cloned()
    }

    /// When the pod with `uid` left the store, if it has.
    pub fn removed_at(&self, uid: &str) -> Option<Instant> {
        self.store().removed.get(uid).copied()
    }

    /// An admin's DELETE (not recorded as a request).
    pub fn delete_pod(&self, ns: &str, name: &str, grace: Option<i64>) -> (u16, Value) {
        let opts = match grace {
            Some(g) => json!({"gracePeriodSeconds": g}),
            None => json!({}),
        };
        pods::delete(&self.state, &User::Admin, ns, name, &opts, false)
    }

    /// Rewrites a stored pod as another writer (or another clock) would have: `f` edits the
    /// object, which is stored under a new resourceVersion with a MODIFIED event. For states a
    /// client cannot produce through the API, such as a deletionTimestamp an API server with
    /// a skewed clock wrote.
    pub fn rewrite_pod(&self, ns: &str, name: &str, f: impl FnOnce(&mut Value)) {
        let st = &self.state;
        let mut s = st.lock();
        let Some(before) = s.pods.get(&(ns.into(), name.into())).cloned() else {
            return;
        };
        let mut p = before.clone();
        f(&mut p);
        s.commit(&st.events_tx, Kind::Pod, Some(&before), p);
    }

    /// Sets a pod's phase as another writer would.
    pub fn set_phase(&self, ns: &str, name: &str, phase: &str) {
        let st = &self.state;
        let mut s = st.lock();
        let Some(before) = s.pods.get(&(ns.into(), name.into())).cloned() else {
            return;
        };
        let mut p = before.clone();
        p["status"]["phase"] = phase.into();
        s.commit(&st.events_tx, Kind::Pod, Some(&before), p);
    }

    /// Creates a namespace (a fresh server has `default`, `kube-system`, `kube-public` and
    /// `kube-node-lease`).
    pub fn add_namespace(&self, ns: &str) {
        let mut s = self.store();
        if !s.has_namespace(ns) {
            s.namespaces.push(ns.into());
        }
    }

    /// Creates or replaces a Node as an admin (the server adds the not-ready taint a fresh
    /// Node gets, fact 9).
    pub fn add_node(&self, node: Value) -> Value {
        nodes::create_trusted(&self.state, node)
    }

    pub fn get_node(&self, name: &str) -> Option<Value> {
        self.store().nodes.get(name).cloned()
    }

    pub fn add_lease(&self, lease: Value) -> Value {
        leases::create_trusted(&self.state, lease)
    }

    /// A kubelet's renewal of node `node`'s Lease (`kube-node-lease/<node>`, created when
    /// missing): `renewTime` now, in microseconds as the kubelet writes it. An admin write
    /// straight into the store (the test plays the kubelet; reaplet only reads the Lease).
    pub fn renew_node_lease(&self, node: &str) -> Value {
        let now = jiff::Timestamp::now()
            .strftime("%Y-%m-%dT%H:%M:%S%.6fZ")
            .to_string();
        self.add_lease(json!({
            "metadata": { "name": node, "namespace": "kube-node-lease" },
            "spec": { "holderIdentity": node, "leaseDurationSeconds": 40, "renewTime": now },
        }))
    }

    pub fn get_lease(&self, ns: &str, name: &str) -> Option<Value> {
        self.store().leases.get(&(ns.into(), name.into())).cloned()
    }

    /// Creates a PodDisruptionBudget as an admin, with the status given (a disruption
    /// controller's work; none runs here).
    pub fn add_pdb(&self, pdb: Value) -> Value {
        pdbs::create_pdb_trusted(&self.state, pdb)
    }

    /// Puts a ReplicaSet in (as its controller would have it; read only here).
    pub fn add_replicaset(&self, mut rs: Value) {
        let mut s = self.store();
        if rs["metadata"]["namespace"].is_null() {
            rs["metadata"]["namespace"] = "default".into();
        }
        let key = (
            str_at(&rs, "/metadata/namespace").to_owned(),
            str_at(&rs, "/metadata/name").to_owned(),
        );
        s.replicasets.insert(key, rs);
    }

    /// Puts a PriorityClass in (read only here).
    pub fn add_priority_class(&self, pc: Value) {
        let name = str_at(&pc, "/metadata/name").to_owned();
        self.store().priority_classes.insert(name, pc);
    }

    pub fn get_pdb(&self, ns: &str, name: &str) -> Option<Value> {
        self.store().pdbs.get(&(ns.into(), name.into())).cloned()
    }

    /// Every event object created, in order of creation.
    pub fn events(&self) -> Vec<Value> {
        let s = self.store();
        let mut evs: Vec<Value> = s.events.values().cloned().collect();
        evs.sort_by_key(|e| {
            str_at(e, "/metadata/resourceVersion")
                .parse::<u64>()
                .unwrap_or(0)
        });
        evs
    }

    /// Makes SelfSubjectAccessReviews deny `verb` on `resource` (`pods/status` for a subresource).
    pub fn deny(&self, verb: &str, resource: &str) {
        self.store().denied.push((verb.into(), resource.into()));
    }

    /// Makes every pod GET answer 403 with no Node authorizer cause (what another authorizer,
    /// RBAC or a webhook, answers: a permission problem, not a pod that is gone), or stops it.
    pub fn forbid_pod_gets(&self, on: bool) {
        self.store().pod_gets_forbidden = on;
    }

    /// Every request received so far.
    pub fn requests(&self) -> Vec<Recorded> {
        self.state.log.snapshot()
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

    /// The period of watch bookmarks (60 s, as measured, fact 7.6).
    pub fn set_bookmark_period(&self, d: Duration) {
        *self.state.bookmark_every.lock().unwrap() = d;
    }

    /// Closes the listener and cuts open connections for `d`: connections are refused.
    pub fn refuse_connections_for(&self, d: Duration) {
        self.state.faults.lock().unwrap().refuse_until = Some(Instant::now() + d);
        self.state.generation.send_modify(|g| *g += 1);
        self.state.refuse.notify_one();
    }

    /// Cuts open connections, then for `d` accepts every new connection and closes it at once
    /// without an answer; returns nothing, see [`Self::connections_closed`].
    pub fn close_connections_for(&self, d: Duration) {
        self.state.faults.lock().unwrap().close_until = Some(Instant::now() + d);
        self.state.generation.send_modify(|g| *g += 1);
    }

    /// How many connections [`Self::close_connections_for`] closed.
    pub fn connections_closed(&self) -> u64 {
        self.state.faults.lock().unwrap().closed
    }

    /// From now on, lists and watches send every node's pods whatever the field selector.
    pub fn ignore_field_selectors(&self) {
        self.state.faults.lock().unwrap().ignore_field_selectors = true;
    }

    /// Answers every request with `code` (500, 429 with Retry-After) for `d`.
    pub fn fail_for(&self, d: Duration, code: u16) {
        self.state.faults.lock().unwrap().fail_until = Some((Instant::now() + d, code));
    }
}
