//! The object store behind the imitation: etcd's role in kube-apiserver.
//!
//! Facts implemented here (`../shared/reference/apiserver-facts.md`):
//! * 11.1: one `resourceVersion` counter shared by every object, +1 per write; a write that
//!   changes nothing keeps it and emits no watch event ([`Store::commit`] compares first);
//! * the watch history that watches replay from (`compacted` is the oldest resourceVersion
//!   still replayable: an older one answers `too old resource version`, facts 7.1 and 7.2);
//! * what is stored is what Go's JSON encoding of the decoded object gives ([`render`]): a
//!   condition's times not sent are `null`, a container status's states `{}` (measured on the
//!   real server: facts 4.8, 4.10, 6.2 and 9's conditions).

use serde_json::Value;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Instant;
use tokio::sync::{Notify, broadcast, watch};

/// Resources that watches can follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Pod,
    Node,
    Lease,
    Pdb,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

#[derive(Debug, Clone)]
pub struct WatchEvent {
    pub rv: u64,
    pub kind: Kind,
    pub etype: EventType,
    pub obj: Value,
}

/// (namespace, name); cluster-scoped objects use an empty namespace.
pub type Key = (String, String);

#[derive(Default)]
pub struct Store {
    pub rv: u64,
    /// Watches from a resourceVersion below this one are too old.
    pub compacted: u64,
    pub pods: BTreeMap<Key, Value>,
    pub nodes: BTreeMap<String, Value>,
    pub leases: BTreeMap<Key, Value>,
    pub pdbs: BTreeMap<Key, Value>,
    /// ReplicaSets and PriorityClasses a test put in (read only, `readonly.rs`).
    pub replicasets: BTreeMap<Key, Value>,
    pub priority_classes: BTreeMap<String, Value>,
    pub events: BTreeMap<Key, Value>,
    pub namespaces: Vec<String>,
    pub history: VecDeque<WatchEvent>,
    pub uid_counter: u64,
    /// (verb, resource[/subresource]) that SelfSubjectAccessReviews deny.
    pub denied: Vec<(String, String)>,
    /// Pod GETs refused with a 403 without the Node authorizer's cause (an RBAC or webhook
    /// decision), for a fault test.
    pub pod_gets_forbidden: bool,
    /// When each pod object left the store, by UID (benchmarks measure to this instant).
    pub removed: HashMap<String, Instant>,
}

/// The request log. A request is in flight from when its handler may change the store until
/// it is logged (its answer is known only then). Reading the log waits for the requests that
/// began before the read, so a change a test has seen in the store always has its request in
/// the log; later requests are not waited for (a steady stream cannot starve a reader), and a
/// watch is never in flight (it lasts). The handlers do not await between changing the store
/// and logging, so on a current-thread runtime nothing can be mid-way while the reader runs.
#[derive(Default)]
pub struct Log {
    entries: Mutex<Vec<super::Recorded>>,
    /// The next request's number, and the numbers of the requests in flight.
    in_flight: Mutex<(u64, std::collections::BTreeSet<u64>)>,
    settled: std::sync::Condvar,
}

/// A request in flight; out of flight when dropped (after its record is pushed).
pub struct InFlight<'a>(&'a Log, u64);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let mut f = self.0.in_flight.lock().unwrap_or_else(|e| e.into_inner());
        f.1.remove(&self.1);
        self.0.settled.notify_all();
    }
}

impl Log {
    /// The longest a reader waits for the requests that began before it: longer than any
    /// handler runs (the slowest, a LIST with a future resourceVersion, answers after 3 s).
    pub const SETTLE: std::time::Duration = std::time::Duration::from_secs(10);

    pub fn begin(&self) -> InFlight<'_> {
        let mut f = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
        let n = f.0;
        f.0 += 1;
        f.1.insert(n);
        InFlight(self, n)
    }

    pub fn push(&self, r: super::Recorded) {
        self.entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(r);
    }

    /// Every request logged, after the ones in flight when it was called have been.
    pub fn snapshot(&self) -> Vec<super::Recorded> {
        let multi_thread = tokio::runtime::Handle::try_current()
            .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
        if multi_thread {
            tokio::task::block_in_place(|| self.settle());
        }
        self.entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn settle(&self) {
        let f = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
        let mark = f.0;
        let (_f, timeout) = self
            .settled
            .wait_timeout_while(f, Self::SETTLE, |f| f.1.first().is_some_and(|n| *n < mark))
            .unwrap_or_else(|e| e.into_inner());
        assert!(
            !timeout.timed_out(),
            "a request to the API server stayed in flight for {:?}",
            Self::SETTLE
        );
    }
}

/// Everything the handlers share.
pub struct State {
    pub store: Mutex<Store>,
    pub events_tx: broadcast::Sender<WatchEvent>,
    pub log: Log,
    pub faults: Mutex<super::faults::Faults>,
    pub refuse: Notify,
    /// Bumped to cut every open connection.
    pub generation: watch::Sender<u64>,
    /// Bookmarks on watches with `allowWatchBookmarks`: every this often (fact 7.6: 60 s).
    pub bookmark_every: Mutex<std::time::Duration>,
}

impl State {
    pub fn lock(&self) -> std::sync::MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Store {
    pub fn new() -> Store {
        Store {
            rv: 100,
            namespaces: ["default", "kube-system", "kube-public", "kube-node-lease"]
                .map(String::from)
                .to_vec(),
            ..Store::default()
        }
    }

    pub fn bump(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    /// A server-assigned UID (random in the real server; unique here).
    pub fn new_uid(&mut self) -> String {
        self.uid_counter += 1;
        format!("7e570000-0000-4000-8000-{:012x}", self.uid_counter)
    }

    pub fn has_namespace(&self, ns: &str) -> bool {
        self.namespaces.iter().any(|n| n == ns)
    }

    /// Records a watch event for `obj` (whose resourceVersion the caller has set).
    pub fn emit(
        &mut self,
        tx: &broadcast::Sender<WatchEvent>,
        kind: Kind,
        etype: EventType,
        obj: Value,
    ) {
        let rv = obj["metadata"]["resourceVersion"]
            .as_str()
            .and_then(|r| r.parse().ok())
            .unwrap_or(self.rv);
        let ev = WatchEvent {
            rv,
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

    /// Stores a changed object under a new resourceVersion and emits `etype`; an object equal to
    /// `before` (ignoring resourceVersion) is a no-op: same resourceVersion, no event (fact 4.3).
    /// Returns the object as stored.
    pub fn commit(
        &mut self,
        tx: &broadcast::Sender<WatchEvent>,
        kind: Kind,
        before: Option<&Value>,
        mut obj: Value,
    ) -> Value {
        render(kind, &mut obj);
        if let Some(b) = before
            && same_but_rv(b, &obj)
        {
            return b.clone();
        }
        let rv = self.bump();
        obj["metadata"]["resourceVersion"] = rv.to_string().into();
        let etype = if before.is_some() {
            EventType::Modified
        } else {
            EventType::Added
        };
        self.put(kind, obj.clone());
        self.emit(tx, kind, etype, obj.clone());
        obj
    }

    /// Inserts or replaces an object in its map.
    pub fn put(&mut self, kind: Kind, obj: Value) {
        let ns = str_at(&obj, "/metadata/namespace").to_owned();
        let name = str_at(&obj, "/metadata/name").to_owned();
        match kind {
            Kind::Pod => {
                self.pods.insert((ns, name), obj);
            }
            Kind::Node => {
                self.nodes.insert(name, obj);
            }
            Kind::Lease => {
                self.leases.insert((ns, name), obj);
            }
            Kind::Pdb => {
                self.pdbs.insert((ns, name), obj);
            }
        }
    }
}

/// Sets `key` to `zero` in the object `v` when it is missing (a Go field without `omitempty`, or
/// a struct, which `omitempty` does not omit: `metav1.Time` renders its zero value as `null`).
fn zero(v: &mut Value, key: &str, zero: Value) {
    if let Some(m) = v.as_object_mut() {
        m.entry(key).or_insert(zero);
    }
}

/// Each object of the list at `pointer`.
fn each(v: &mut Value, pointer: &str, mut f: impl FnMut(&mut Value)) {
    if let Some(Value::Array(items)) = v.pointer_mut(pointer) {
        items.iter_mut().filter(|i| i.is_object()).for_each(&mut f);
    }
}

/// A `ContainerState` as Go renders it: `running.startedAt`, `terminated.exitCode`,
/// `startedAt` and `finishedAt` always there.
fn render_state(state: &mut Value) {
    if let Some(r) = state.get_mut("running") {
        zero(r, "startedAt", Value::Null);
    }
    if let Some(t) = state.get_mut("terminated") {
        zero(t, "exitCode", 0.into());
        zero(t, "startedAt", Value::Null);
        zero(t, "finishedAt", Value::Null);
    }
}

/// The object as the real server stores and answers it after decoding into its Go type: the
/// fields Go always encodes are there with their zero values (`PodCondition` and
/// `NodeCondition` times `null`; `ContainerStatus` `state`/`lastState` `{}`, `ready`,
/// `restartCount`, `image`, `imageID`).
pub fn render(kind: Kind, obj: &mut Value) {
    match kind {
        Kind::Pod => {
            each(obj, "/status/conditions", |c| {
                zero(c, "lastProbeTime", Value::Null);
                zero(c, "lastTransitionTime", Value::Null);
            });
            for list in [
                "initContainerStatuses",
                "containerStatuses",
                "ephemeralContainerStatuses",
            ] {
                each(obj, &format!("/status/{list}"), |s| {
                    for state in ["state", "lastState"] {
                        zero(s, state, serde_json::json!({}));
                        render_state(&mut s[state]);
                    }
                    zero(s, "ready", false.into());
                    zero(s, "restartCount", 0.into());
                    zero(s, "image", "".into());
                    zero(s, "imageID", "".into());
                });
            }
        }
        Kind::Node => each(obj, "/status/conditions", |c| {
            zero(c, "lastHeartbeatTime", Value::Null);
            zero(c, "lastTransitionTime", Value::Null);
        }),
        Kind::Lease | Kind::Pdb => {}
    }
}

/// Two objects equal but for `metadata.resourceVersion` and `metadata.managedFields`.
pub fn same_but_rv(a: &Value, b: &Value) -> bool {
    let strip = |v: &Value| {
        let mut v = v.clone();
        if let Some(m) = v["metadata"].as_object_mut() {
            m.remove("resourceVersion");
            m.remove("managedFields");
        }
        v
    };
    strip(a) == strip(b)
}

/// The string at a JSON pointer, or "".
pub fn str_at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

/// Now as the API serialises a `metav1.Time`: whole seconds, UTC.
pub fn now_rfc3339() -> String {
    rfc3339(jiff::Timestamp::now().as_second())
}

/// Unix seconds as a `metav1.Time`.
pub fn rfc3339(secs: i64) -> String {
    jiff::Timestamp::from_second(secs)
        .expect("a valid time")
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// A `metav1.Time` as Unix seconds.
pub fn parse_time(s: &str) -> Option<i64> {
    s.parse::<jiff::Timestamp>().ok().map(|t| t.as_second())
}

/// Now as a `metav1.MicroTime` (events.k8s.io `eventTime`).
pub fn now_micro() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%S%.6fZ")
        .to_string()
}
