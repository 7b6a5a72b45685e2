//! The fault-injecting layer: sits in front of every handler, on the same real HTTP
//! connection, so that fault tests exercise reaplet's real client stack (kube-rs, hyper, their
//! connection pool, timeouts and retries) rather than a mock of it. `http.rs` calls
//! [`refusing`] in the accept loop, [`before`] ahead of routing and [`after`] on the answer.
//!
//! Connection faults: `ApiServer::refuse_connections_for` (listener closed, open connections
//! cut). Request faults are [`FaultRule`]s, tried in the order they were added; the first live
//! one matching a request acts on it and counts it. A rule is:
//! * a [`Match`]: method, verb, resource, subresource, namespace, name, watch or not, user,
//!   consistent read (no `resourceVersion`) or not;
//!   every field optional (`Match::any()` matches every authenticated request);
//! * an [`Action`]: answer a code, with the `metav1.Status` the real server sends (429
//!   `TooManyRequests`, 500 `InternalError`, 503 `ServiceUnavailable`, 504 `Timeout`), and a
//!   `Retry-After` header with `details.retryAfterSeconds`, as the server pairs them; stall
//!   (accepted, never answered until the rule is removed or its time is up, then handled, or
//!   until [`cut_rule`] or a cut connection); reset (connection closed, no answer); an empty
//!   watch (`200`, no body: the stream ends at once); pass (with
//!   `after(d)`: the normal answer, late); slow body (the handler's answer, its body trickled
//!   at N bytes/s and/or after a delay before the first byte; these rules are looked up
//!   after the handler, apart from the others). `after(d)` delays any other action by `d`;
//! * a lifetime: `for_duration(d)` and/or `times(n)` (the next n matching requests), else
//!   until removed.
//!
//! Tests use the `ApiServer` methods defined here (`inject`, `remove_fault`, `cut_fault`,
//! `clear_faults`, `fault_hits`, `stalled_by`, `requests_matching`) or the free functions on a
//! `State`:
//!
//! ```ignore
//! let id = api.inject(FaultRule::answer(429).retry_after(5)
//!     .matching(Match::any().verb("list").resource("pods")).for_duration(secs(60)));
//! let stall = api.inject(FaultRule::stall().matching(Match::any().subresource("status").name("a")));
//! api.remove_fault(stall); // the stalled PATCH goes on to the handler (`cut_fault`: reset)
//! assert!(api.fault_hits(id) <= 10);
//! let lists = api.requests_matching(&Match::any().verb("list")); // from the log, with times
//! ```
//!
//! `ApiServer::fail_for(d, code)` is such a rule: every request answered `code` for `d` (429
//! with `Retry-After: 1`), a new call replacing the previous one (it sets
//! `Faults::fail_until`, which the next request turns into the rule, or see [`fail_for`]).

use super::http::Req;
use super::reply::{Reply, respond_with, status_body};
use super::store::State;
use super::{ApiServer, Recorded};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::watch;

mod rules;
mod trickle;
pub use rules::{Action, FaultRule, Match};
use trickle::Trickle;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RuleId(pub u64);

/// What a stalled request is told when its rule goes.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Gate {
    Stalled,
    Released,
    Cut,
}

#[derive(Default)]
struct Stats {
    hits: AtomicU64,
    stalled: AtomicUsize,
}

struct Entry {
    id: RuleId,
    rule: FaultRule,
    until: Option<Instant>,
    left: Option<u64>,
    gate: watch::Sender<Gate>,
    stats: Arc<Stats>,
}

impl Entry {
    fn live(&self, now: Instant) -> bool {
        self.until.is_none_or(|t| now < t) && self.left != Some(0)
    }
}

#[derive(Default)]
pub struct Faults {
    pub refuse_until: Option<Instant>,
    /// Until then every new connection is accepted and closed at once, unanswered (as a
    /// refusing proxy in front of the server would; unlike a closed listener, countable).
    pub close_until: Option<Instant>,
    /// Connections closed that way.
    pub closed: u64,
    /// Set by `fail_for`: becomes a rule answering every request `code` until then.
    pub fail_until: Option<(Instant, u16)>,
    /// A misbehaving server: lists and watches ignore `fieldSelector` (every node's pods).
    pub ignore_field_selectors: bool,
    rules: Vec<Entry>,
    next_id: u64,
    stats: HashMap<RuleId, Arc<Stats>>,
    /// The rule standing for `fail_until`.
    fail_rule: Option<RuleId>,
}

impl Faults {
    fn add(&mut self, rule: FaultRule) -> RuleId {
        self.next_id += 1;
        let id = RuleId(self.next_id);
        let now = Instant::now();
        let stats = Arc::new(Stats::default());
        self.stats.insert(id, stats.clone());
        self.rules.push(Entry {
            id,
            until: rule.lasts.map(|d| now + d),
            left: rule.times,
            rule,
            gate: watch::channel(Gate::Stalled).0,
            stats,
        });
        id
    }

    fn remove(&mut self, id: RuleId, gate: Gate) -> bool {
        let Some(i) = self.rules.iter().position(|e| e.id == id) else {
            return false;
        };
        self.rules.remove(i).gate.send_replace(gate);
        true
    }

    /// Turns a `fail_until` set directly into its rule, replacing the previous one.
    fn adopt_fail_until(&mut self) {
        if let Some((until, code)) = self.fail_until.take() {
            if let Some(old) = self.fail_rule.take() {
                self.remove(old, Gate::Released);
            }
            let mut rule = FaultRule::answer(code);
            if code == 429 {
                rule = rule.retry_after(1);
            }
            let id = self.add(rule);
            self.rules.last_mut().expect("just added").until = Some(until);
            self.fail_rule = Some(id);
        }
    }

    /// The first live rule matching `req` in its phase; counts the hit.
    fn take(&mut self, req: &Req, slow: bool) -> Option<&Entry> {
        self.adopt_fail_until();
        let now = Instant::now();
        let e = self.rules.iter_mut().find(|e| {
            matches!(e.rule.action, Action::SlowBody { .. }) == slow
                && e.live(now)
                && e.rule.matcher.matches(req)
        })?;
        if let Some(n) = &mut e.left {
            *n -= 1;
        }
        e.stats.hits.fetch_add(1, Ordering::Relaxed);
        Some(e)
    }
}

/// Adds a rule; it acts from the next request on.
pub fn add_rule(state: &State, rule: FaultRule) -> RuleId {
    state.faults.lock().unwrap().add(rule)
}

/// Removes a rule; requests it stalls go on to the handler. False if it was not there.
pub fn remove_rule(state: &State, id: RuleId) -> bool {
    state.faults.lock().unwrap().remove(id, Gate::Released)
}

/// Removes a rule; the connections of requests it stalls are closed with no answer.
pub fn cut_rule(state: &State, id: RuleId) -> bool {
    state.faults.lock().unwrap().remove(id, Gate::Cut)
}

/// Removes every rule (stalled requests go on), `fail_for`'s too.
pub fn clear_rules(state: &State) {
    let mut f = state.faults.lock().unwrap();
    f.fail_until = None;
    f.fail_rule = None;
    for e in std::mem::take(&mut f.rules) {
        e.gate.send_replace(Gate::Released);
    }
}

/// The requests rule `id` has acted on (also after it is gone).
pub fn hits(state: &State, id: RuleId) -> u64 {
    let f = state.faults.lock().unwrap();
    f.stats
        .get(&id)
        .map_or(0, |s| s.hits.load(Ordering::Relaxed))
}

/// The requests rule `id` holds stalled now.
pub fn stalled(state: &State, id: RuleId) -> usize {
    let f = state.faults.lock().unwrap();
    f.stats
        .get(&id)
        .map_or(0, |s| s.stalled.load(Ordering::Relaxed))
}

/// The answered (or reset) requests of the log that match `m`, in order.
pub fn matching(state: &State, m: &Match) -> Vec<Recorded> {
    let log = state.log.snapshot();
    log.iter()
        .filter(|r| m.matches_recorded(r))
        .cloned()
        .collect()
}

/// Every request answered `code` for `d` (429 with `Retry-After: 1`), replacing the previous
/// such failure.
pub fn fail_for(state: &State, d: Duration, code: u16) {
    let mut f = state.faults.lock().unwrap();
    f.fail_until = Some((Instant::now() + d, code));
    f.adopt_fail_until();
}

impl ApiServer {
    /// Adds a fault rule (see [`faults`](self)).
    pub fn inject(&self, rule: FaultRule) -> RuleId {
        add_rule(&self.state, rule)
    }
    /// Removes a rule; the requests it stalls go on to the handler.
    pub fn remove_fault(&self, id: RuleId) -> bool {
        remove_rule(&self.state, id)
    }
    /// Removes a rule; the requests it stalls lose their connection.
    pub fn cut_fault(&self, id: RuleId) -> bool {
        cut_rule(&self.state, id)
    }
    pub fn clear_faults(&self) {
        clear_rules(&self.state)
    }
    /// Requests rule `id` acted on.
    pub fn fault_hits(&self, id: RuleId) -> u64 {
        hits(&self.state, id)
    }
    /// Requests rule `id` holds stalled now.
    pub fn stalled_by(&self, id: RuleId) -> usize {
        stalled(&self.state, id)
    }
    /// Logged requests matching `m`.
    pub fn requests_matching(&self, m: &Match) -> Vec<Recorded> {
        matching(&self.state, m)
    }
}

/// What the layer does with a request.
pub enum Verdict {
    /// On to the handler.
    Pass,
    /// This answer instead.
    Answer(Reply),
    /// Close the connection without an answer.
    Reset,
}

/// A new connection is to be closed at once (counted).
pub fn closing(state: &State) -> bool {
    let mut f = state.faults.lock().unwrap();
    let closing = f.close_until.is_some_and(|t| Instant::now() < t);
    if closing {
        f.closed += 1;
    }
    closing
}

/// New connections are being refused.
pub fn refusing(state: &State) -> bool {
    state
        .faults
        .lock()
        .unwrap()
        .refuse_until
        .is_some_and(|t| Instant::now() < t)
}

/// The answer kube-apiserver gives with `code` (`apierrors.New…`), `Retry-After` included.
pub fn error_answer(code: u16, retry_after: Option<u64>) -> Reply {
    let (reason, message) = match code {
        429 => (
            "TooManyRequests",
            "Too many requests, please try again later.",
        ),
        500 => ("InternalError", "Internal error occurred: injected fault"),
        503 => (
            "ServiceUnavailable",
            "the server is currently unable to handle the request",
        ),
        504 => (
            "Timeout",
            "Timeout: request did not complete within requested timeout - context deadline exceeded",
        ),
        400 => ("BadRequest", "injected fault"),
        401 => ("Unauthorized", "Unauthorized"),
        403 => ("Forbidden", "injected fault"),
        404 => ("NotFound", "injected fault"),
        409 => ("Conflict", "injected fault"),
        410 => ("Expired", "injected fault"),
        _ => ("", "injected fault"),
    };
    let mut details = json!({});
    if code == 500 {
        details["causes"] = json!([{"message": "injected fault"}]);
    }
    let mut headers = vec![];
    if let Some(s) = retry_after {
        details["retryAfterSeconds"] = s.into();
        headers.push(("retry-after", s.to_string()));
    }
    let body: Value = status_body(code, reason, message, details);
    respond_with(code, &body, &headers)
}

/// A watch's `200` with one `ERROR` event, `410 Expired`, and its end (the watch cache's
/// answer to a resourceVersion it no longer holds).
fn watch_expired() -> Reply {
    let status = status_body(410, "Expired", "too old resource version: 1 (2)", json!({}));
    let event = json!({"type": "ERROR", "object": status});
    hyper::Response::builder()
        .status(200)
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(hyper::body::Bytes::from(format!("{event}\n"))).boxed())
        .expect("valid response")
}

/// A watch's `200` with an empty body.
fn empty_watch() -> Reply {
    hyper::Response::builder()
        .status(200)
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(hyper::body::Bytes::new()).boxed())
        .expect("valid response")
}

/// Before the handler: the first live rule matching `req` acts.
pub async fn before(state: &State, req: &Req) -> Verdict {
    let (rule, until, mut gate, stats) = {
        let mut f = state.faults.lock().unwrap();
        let Some(e) = f.take(req, false) else {
            return Verdict::Pass;
        };
        (e.rule.clone(), e.until, e.gate.subscribe(), e.stats.clone())
    };
    if !rule.delay.is_zero() {
        tokio::time::sleep(rule.delay).await;
    }
    match rule.action {
        Action::Answer { code, retry_after } => Verdict::Answer(error_answer(code, retry_after)),
        Action::WatchExpired => Verdict::Answer(watch_expired()),
        Action::EmptyWatch => Verdict::Answer(empty_watch()),
        Action::Pass | Action::SlowBody { .. } => Verdict::Pass,
        Action::Reset => Verdict::Reset,
        Action::Stall => {
            let _held = Held::new(stats);
            let expiry = async {
                match until {
                    Some(t) => tokio::time::sleep_until(t.into()).await,
                    None => std::future::pending().await,
                }
            };
            let outcome = tokio::select! {
                g = gate.wait_for(|g| *g != Gate::Stalled) => g.map_or(Gate::Released, |g| *g),
                _ = expiry => Gate::Released,
            };
            match outcome {
                Gate::Cut => Verdict::Reset,
                _ => Verdict::Pass,
            }
        }
    }
}

/// Counts a stalled request while its future lives (a cut connection drops it).
struct Held(Arc<Stats>);

impl Held {
    fn new(stats: Arc<Stats>) -> Held {
        stats.stalled.fetch_add(1, Ordering::Relaxed);
        Held(stats)
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.0.stalled.fetch_sub(1, Ordering::Relaxed);
    }
}

/// After the handler: a slow-body rule matching `req` slows the answer's body.
pub fn after(state: &State, req: &Req, reply: Reply) -> Reply {
    let (rate, first_byte) = {
        let mut f = state.faults.lock().unwrap();
        match f.take(req, true).map(|e| &e.rule.action) {
            Some(Action::SlowBody {
                bytes_per_sec,
                first_byte,
            }) => (*bytes_per_sec, *first_byte),
            _ => return reply,
        }
    };
    reply.map(|inner| Trickle::new(inner, rate, first_byte).boxed())
}
