//! The API server's audit log read as the fleet runs: who sent each request (told apart by its
//! User-Agent), whether it was a quorum read, which watches are open. The test bed's policy
//! (`tests/common/kube/mod.rs`) logs every request once at `ResponseComplete` (reads at
//! Metadata level, writes with their body) and a watch a second time at `ResponseStarted`, when
//! it begins; both records carry the request's `auditID`.
//!
//! # The quorum-read rule (kube-apiserver v1.36, `k8s.io/apiserver/pkg/storage/cacher`)
//!
//! A read is a *quorum read* when it makes etcd do a linearizable read (a raft ReadIndex round
//! through the leader), decided from the request's `requestURI` query alone:
//!
//! * `get` without `resourceVersion` (or with an empty one): read from etcd (`CacheDelegator.Get`
//!   delegates an unset resourceVersion to storage). With any resourceVersion, `"0"` or not,
//!   it is served by the watch cache (a non-zero one waits until the cache is that fresh);
//! * `list` without `resourceVersion`: a consistent list. `ConsistentListFromCache` is GA and
//!   etcd 3.6 supports progress requests, so the items come from the watch cache, but only
//!   after etcd was asked for its current revision (a linearizable range read): counted;
//! * `list` that the cache hands to etcd, or to a snapshot of it at an exact revision:
//!   `resourceVersionMatch=Exact`, a `continue` token, or a `limit` with a resourceVersion other
//!   than `"0"` (`delegator.ShouldDelegateList`): counted (a snapshot may answer instead; the
//!   rule errs on the side of counting);
//! * any other `list` (`resourceVersion=0`, or a non-zero one without a limit, i.e. "not older
//!   than") and every `watch`: the watch cache, not counted.
//!
//! A request the API server refused before reaching storage (401, 403, 429) reads nothing and
//! is not counted as a quorum read (it is still a request); neither is a request for a
//! non-resource URL (`/openapi/v3`, `/healthz`: no `objectRef`), which no storage serves.

use super::json_tail::JsonLinesTail;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

/// Who sent a request (by its User-Agent; the hollow kubelet and reaplet of a node share the
/// node's identity).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
pub enum Who {
    /// kubemark's hollow kubelet (`hollow-kubelet`)
    Kubelet,
    /// `reaplet/…`
    Reaplet,
    /// everyone else: the API server's own loopback clients, the benchmark's admin
    Other,
}

impl Who {
    fn of(user_agent: &str) -> Who {
        if user_agent.starts_with("hollow-kubelet") {
            Who::Kubelet
        } else if user_agent.starts_with("reaplet/") {
            Who::Reaplet
        } else {
            Who::Other
        }
    }
}

/// One request (its first record).
#[derive(Clone, Debug)]
pub struct Req {
    pub who: Who,
    pub verb: String,
    /// `resource[/subresource]`
    pub resource: String,
    pub quorum: bool,
    /// `requestReceivedTimestamp`, ns since the epoch
    pub received: i64,
    /// the response's status code (0: none, e.g. a watch cut by the server's exit)
    pub code: u16,
}

impl Req {
    pub fn is_write(&self) -> bool {
        matches!(
            self.verb.as_str(),
            "create" | "update" | "patch" | "delete" | "deletecollection"
        )
    }
}

/// The audit log read so far.
#[derive(Default)]
pub struct AuditLog {
    tail: JsonLinesTail,
    pub reqs: Vec<Req>,
    /// auditIDs already counted (a watch has two records)
    seen: HashSet<String>,
    /// watches that began (ResponseStarted) and have not ended yet: auditID -> who
    open_watches: HashMap<String, Who>,
}

fn ts_ns(v: &Value) -> i64 {
    v.as_str()
        .and_then(|s| s.parse::<jiff::Timestamp>().ok())
        .map_or(0, |t| t.as_nanosecond() as i64)
}

/// The query parameters of a request URI (values as sent; the ones read here need no decoding).
fn query(uri: &str) -> HashMap<&str, &str> {
    uri.split_once('?')
        .map(|(_, q)| q)
        .unwrap_or("")
        .split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| kv.split_once('=').unwrap_or((kv, "")))
        .collect()
}

/// The rule of the module doc: does this read make etcd do a linearizable read?
pub fn is_quorum_read(verb: &str, uri: &str, code: u16) -> bool {
    if matches!(code, 401 | 403 | 429) {
        return false;
    }
    let q = query(uri);
    let rv = q.get("resourceVersion").copied().unwrap_or("");
    match verb {
        "get" => rv.is_empty(),
        "list" => {
            let exact = q
                .get("resourceVersionMatch")
                .is_some_and(|m| m.eq_ignore_ascii_case("exact"));
            let cont = q.get("continue").is_some_and(|c| !c.is_empty());
            let limit = q
                .get("limit")
                .and_then(|l| l.parse::<i64>().ok())
                .is_some_and(|l| l > 0);
            rv.is_empty() || exact || cont || (limit && rv != "0")
        }
        _ => false,
    }
}

impl AuditLog {
    /// Reads the records written since the last call (complete lines only).
    pub fn refresh(&mut self, path: &Path) {
        let mut tail = std::mem::take(&mut self.tail);
        tail.read_new(path, |v| self.add(v));
        self.tail = tail;
    }

    fn add(&mut self, v: &Value) {
        let s = |x: &Value| x.as_str().unwrap_or("").to_owned();
        let id = s(&v["auditID"]);
        let stage = s(&v["stage"]);
        let verb = s(&v["verb"]);
        let who = Who::of(v["userAgent"].as_str().unwrap_or(""));
        if verb == "watch" {
            match stage.as_str() {
                "ResponseStarted" => {
                    self.open_watches.insert(id.clone(), who);
                }
                _ => {
                    self.open_watches.remove(&id);
                }
            }
        }
        if !self.seen.insert(id) {
            return;
        }
        let o = &v["objectRef"];
        let (res, sub) = (s(&o["resource"]), s(&o["subresource"]));
        let resource = match (res.is_empty(), sub.is_empty()) {
            (true, _) => s(&v["requestURI"])
                .split('?')
                .next()
                .unwrap_or("")
                .to_owned(),
            (false, true) => res,
            (false, false) => format!("{res}/{sub}"),
        };
        let code = v["responseStatus"]["code"].as_u64().unwrap_or(0) as u16;
        let quorum = o["resource"].as_str().is_some_and(|r| !r.is_empty())
            && is_quorum_read(&verb, v["requestURI"].as_str().unwrap_or(""), code);
        self.reqs.push(Req {
            who,
            verb,
            resource,
            quorum,
            received: ts_ns(&v["requestReceivedTimestamp"]),
            code,
        });
    }

    /// Forgets the watches still open: their server is gone (stopped without writing their
    /// `ResponseComplete` record).
    pub fn forget_open_watches(&mut self) -> usize {
        let n = self.open_watches.len();
        self.open_watches.clear();
        n
    }

    /// Watches open now, by sender.
    pub fn watches_open(&self) -> BTreeMap<Who, usize> {
        let mut m = BTreeMap::new();
        for w in self.open_watches.values() {
            *m.entry(*w).or_default() += 1;
        }
        m
    }

    /// The requests received in `[from, to)` (ns since the epoch).
    pub fn window(&self, from: i64, to: i64) -> impl Iterator<Item = &Req> {
        self.reqs
            .iter()
            .filter(move |r| r.received >= from && r.received < to)
    }
}

/// The rule's cases, checked at every start of the benchmark (a harness-less bench has no
/// `#[test]`s): panics on the first case it gets wrong.
pub fn check_rule() {
    let cases: &[(&str, &str, u16, bool)] = &[
        (
            "get",
            "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/n1",
            200,
            true,
        ),
        ("get", "/api/v1/nodes/n1?resourceVersion=", 200, true),
        ("get", "/api/v1/nodes/n1?resourceVersion=0", 200, false),
        ("get", "/api/v1/nodes/n1?resourceVersion=123", 200, false),
        ("get", "/api/v1/nodes/n1", 403, false),
        (
            "list",
            "/api/v1/pods?fieldSelector=spec.nodeName%3Dn1",
            200,
            true,
        ),
        (
            "list",
            "/api/v1/pods?limit=500&resourceVersion=0",
            200,
            false,
        ),
        (
            "list",
            "/api/v1/pods?limit=500&resourceVersion=7",
            200,
            true,
        ),
        ("list", "/api/v1/pods?resourceVersion=7", 200, false),
        (
            "list",
            "/api/v1/pods?resourceVersion=7&resourceVersionMatch=Exact",
            200,
            true,
        ),
        (
            "list",
            "/api/v1/pods?resourceVersion=7&resourceVersionMatch=NotOlderThan",
            200,
            false,
        ),
        ("list", "/api/v1/pods?continue=abc&limit=5", 200, true),
        ("watch", "/api/v1/pods?watch=true", 200, false),
        ("update", "/api/v1/nodes/n1", 200, false),
    ];
    for (verb, uri, code, want) in cases {
        assert_eq!(
            is_quorum_read(verb, uri, *code),
            *want,
            "quorum-read rule: {verb} {uri} ({code})"
        );
    }
}
