//! Fault rules: which requests a fault applies to ([`Match`]), what it does ([`Action`]) and
//! for how long ([`FaultRule`]).

use super::super::Recorded;
use super::super::authorization::{Attrs, User};
use super::super::http::{Req, request_info};
use std::time::Duration;

/// A request matcher: `None` fields match anything.
#[derive(Debug, Clone, Default)]
pub struct Match {
    pub method: Option<String>,
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, `deletecollection`.
    pub verb: Option<String>,
    pub resource: Option<String>,
    /// `Some("")` matches the main resource only.
    pub subresource: Option<String>,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub watch: Option<bool>,
    /// The user name (`system:node:node-a`, `kubernetes-admin`).
    pub user: Option<String>,
    /// `Some(true)`: a read without `resourceVersion` (a consistent read, from etcd);
    /// `Some(false)`: one with it (`0`: served from the watch cache).
    pub consistent: Option<bool>,
}

/// Builder methods setting one field each.
macro_rules! setters {
    ($($field:ident),*) => {$(
        pub fn $field(mut self, v: &str) -> Match { self.$field = Some(v.into()); self }
    )*};
}

impl Match {
    pub fn any() -> Match {
        Match::default()
    }
    setters!(verb, resource, subresource, namespace, name);
    pub fn method(mut self, m: &str) -> Match {
        self.method = Some(m.to_ascii_uppercase());
        self
    }
    pub fn watch(mut self, w: bool) -> Match {
        self.watch = Some(w);
        self
    }
    pub fn user(mut self, u: &User) -> Match {
        self.user = Some(u.name());
        self
    }
    pub fn consistent(mut self, c: bool) -> Match {
        self.consistent = Some(c);
        self
    }

    fn test(
        &self,
        method: &str,
        a: Option<&Attrs>,
        watch: bool,
        user: &str,
        rv: Option<&str>,
    ) -> bool {
        let is = |want: &Option<String>, have: &str| want.as_deref().is_none_or(|w| w == have);
        let attr = |want: &Option<String>, f: fn(&Attrs) -> &str| {
            want.is_none() || a.is_some_and(|a| is(want, f(a)))
        };
        let consistent = rv.is_none_or(str::is_empty);
        is(&self.method, method)
            && is(&self.user, user)
            && self.consistent.is_none_or(|c| c == consistent)
            && self.watch.is_none_or(|w| w == watch)
            && attr(&self.verb, |a| &a.verb)
            && attr(&self.resource, |a| &a.resource)
            && attr(&self.subresource, |a| &a.subresource)
            && attr(&self.namespace, |a| &a.namespace)
            && attr(&self.name, |a| &a.name)
    }

    pub fn matches(&self, req: &Req) -> bool {
        self.test(
            &req.method,
            Some(&req.attrs),
            req.is_watch(),
            &req.user.name(),
            req.q("resourceVersion"),
        )
    }

    /// Whether a logged request matches.
    pub fn matches_recorded(&self, r: &Recorded) -> bool {
        let attrs = request_info(&r.method, &r.path, &r.query);
        let watch = matches!(r.query.get("watch").map(String::as_str), Some("true" | "1"));
        let rv = r.query.get("resourceVersion").map(String::as_str);
        self.test(&r.method, attrs.as_ref(), watch, &r.user, rv)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// This code, a `metav1.Status` body, and `Retry-After: <secs>` if given.
    Answer { code: u16, retry_after: Option<u64> },
    /// On to the handler (with the rule's `delay`, a late answer).
    Pass,
    /// Never answered while the rule lives; then on to the handler (removed, expired) or the
    /// connection closed ([`cut_rule`]).
    Stall,
    /// The connection closed with no answer.
    Reset,
    /// A watch answered 200 with one `ERROR` event, `410 Expired` ("too old resource
    /// version", what the real server's watch cache sends), then ended: a client relists.
    WatchExpired,
    /// A watch answered `200` with an empty body: it ends at once, having sent nothing (a
    /// proxy or load balancer that ends watch streams).
    EmptyWatch,
    /// The handler's answer, its body at `bytes_per_sec` (if any) after `first_byte`.
    SlowBody {
        bytes_per_sec: Option<u64>,
        first_byte: Duration,
    },
}

#[derive(Debug, Clone)]
pub struct FaultRule {
    pub matcher: Match,
    pub action: Action,
    /// Taken before the action (not for `SlowBody`).
    pub delay: Duration,
    /// The rule's life from when it is added (none: until removed).
    pub lasts: Option<Duration>,
    /// The matching requests it acts on (none: every one).
    pub times: Option<u64>,
}

impl FaultRule {
    pub fn new(action: Action) -> FaultRule {
        FaultRule {
            matcher: Match::any(),
            action,
            delay: Duration::ZERO,
            lasts: None,
            times: None,
        }
    }
    pub fn answer(code: u16) -> FaultRule {
        FaultRule::new(Action::Answer {
            code,
            retry_after: None,
        })
    }
    pub fn watch_expired() -> FaultRule {
        FaultRule::new(Action::WatchExpired)
    }
    pub fn empty_watch() -> FaultRule {
        FaultRule::new(Action::EmptyWatch)
    }
    pub fn stall() -> FaultRule {
        FaultRule::new(Action::Stall)
    }
    pub fn reset() -> FaultRule {
        FaultRule::new(Action::Reset)
    }
    /// The normal answer, `d` late.
    pub fn delay(d: Duration) -> FaultRule {
        FaultRule::new(Action::Pass).after(d)
    }
    pub fn slow_body(bytes_per_sec: Option<u64>, first_byte: Duration) -> FaultRule {
        FaultRule::new(Action::SlowBody {
            bytes_per_sec,
            first_byte,
        })
    }
    /// `Retry-After: secs` (and `details.retryAfterSeconds`) on an `Answer`.
    pub fn retry_after(mut self, secs: u64) -> FaultRule {
        match &mut self.action {
            Action::Answer { retry_after, .. } => *retry_after = Some(secs),
            a => panic!("retry_after on {a:?}"),
        }
        self
    }
    pub fn after(mut self, d: Duration) -> FaultRule {
        self.delay = d;
        self
    }
    pub fn matching(mut self, m: Match) -> FaultRule {
        self.matcher = m;
        self
    }
    pub fn for_duration(mut self, d: Duration) -> FaultRule {
        self.lasts = Some(d);
        self
    }
    pub fn times(mut self, n: u64) -> FaultRule {
        self.times = Some(n);
        self
    }
}
