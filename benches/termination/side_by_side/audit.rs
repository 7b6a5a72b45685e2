//! The API server's audit log as the scenarios read it: one record per request, its arrival and
//! answer times, parsed as the log grows.

use super::json_tail::JsonLinesTail;
use super::*;

/// One audit record (the fields used here; times in ns since the epoch).
#[derive(Clone, Debug)]
pub(super) struct Rec {
    pub(super) verb: String,
    pub(super) user: String,
    ua: String,
    pub(super) resource: String,
    pub(super) sub: String,
    pub(super) name: String,
    pub(super) code: u16,
    /// `requestReceivedTimestamp`
    pub(super) received: i64,
    /// `stageTimestamp` (ResponseComplete: answered; ResponseStarted for a watch)
    pub(super) done: i64,
    pub(super) request: Value,
}

fn ts_ns(v: &Value) -> i64 {
    v.as_str()
        .and_then(|s| s.parse::<jiff::Timestamp>().ok())
        .map_or(0, |t| t.as_nanosecond() as i64)
}

impl Rec {
    fn parse(v: &Value) -> Rec {
        let s = |x: &Value| x.as_str().unwrap_or("").to_owned();
        let o = &v["objectRef"];
        Rec {
            verb: s(&v["verb"]),
            user: s(&v["user"]["username"]),
            ua: s(&v["userAgent"]),
            resource: s(&o["resource"]),
            sub: s(&o["subresource"]),
            name: s(&o["name"]),
            code: v["responseStatus"]["code"].as_u64().unwrap_or(0) as u16,
            received: ts_ns(&v["requestReceivedTimestamp"]),
            done: ts_ns(&v["stageTimestamp"]),
            request: v["requestObject"].clone(),
        }
    }

    pub(super) fn by(&self, who: Who) -> bool {
        self.ua.starts_with(who.ua())
    }

    pub(super) fn is_pod(&self, verb: &str, name: &str) -> bool {
        self.verb == verb && self.resource == "pods" && self.sub.is_empty() && self.name == name
    }

    pub(super) fn line(&self) -> String {
        let r = if self.sub.is_empty() {
            self.resource.clone()
        } else {
            format!("{}/{}", self.resource, self.sub)
        };
        format!("{} {r} {} {}", self.verb, self.name, self.code)
    }
}

/// The audit log read so far: each poll parses only the lines written since the last one
/// (re-reading the whole log every 10 ms would take a core of this 2-core machine).
#[derive(Default)]
pub(super) struct AuditTail {
    tail: JsonLinesTail,
    pub(super) recs: Vec<Rec>,
}

impl AuditTail {
    pub(super) fn refresh(&mut self, path: &Path) {
        self.tail.read_new(path, |v| self.recs.push(Rec::parse(v)));
    }
}

/// When `who`'s final DELETE of pod `name` was answered (the object gone), in ns since the epoch.
pub(super) fn gone_at(recs: &[Rec], who: Who, name: &str) -> Option<i64> {
    recs.iter()
        .filter(|r| r.by(who) && r.is_pod("delete", name) && r.code == 200)
        .map(|r| r.done)
        .max()
}
