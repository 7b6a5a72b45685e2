//! One view of the API server's reachability for the whole agent, and its prober.
//!
//! The kubelet has no counterpart: each of its API callers (informers' reflectors, the status
//! manager, the node status loop, the Lease controller, the event broadcaster) retries alone,
//! which is how it makes about 200 connection attempts in a 30 s outage and is back 0.07 s
//! after it. reaplet keeps the quick return without the hammering: every API caller reports
//! into one [`ApiHealth`]; a failure without a connection (refused, reset, TLS broken, not
//! connected within [`super::CONNECT_TIMEOUT`]) marks the server unreachable, and from then on
//! only the [`probe`] task tries it, about once a second (jittered), while every other caller
//! waits on [`ApiHealth::reachable`]. The first answer, the prober's or anyone's, marks it
//! reachable and wakes every waiter at once.
//!
//! Slow is not down: a request sent on a connection and not answered within its timeout
//! ([`Failure::Slow`]: a server queueing requests under priority and fairness, or overloaded)
//! does not mark the server unreachable by itself. Marking it then would hold every status
//! write, delete, event and Lease read of the agent behind the prober for the whole brownout.
//! But a timeout is also what a connection whose path died silently gives: so a slow failure
//! makes the prober try the server at once on a new connection ([`super::client::
//! fresh_connections`]); only when none can be made (refused, reset, not connected within
//! [`super::CONNECT_TIMEOUT`]) is the server unreachable. A server that connects and is slow
//! stays reachable.
//!
//! Refused credentials (a 401, reaplet's own credential plugin failing) end the agent for a
//! restart once refused for its `credentials_grace` ([`ApiHealth::refused_for`]), counted only
//! while they are still refused when asked again: a spell lasts from its first refusal to the
//! last one seen, so a single refusal never ends the agent, however long no other request
//! clears it; the prober asks again at once after the first refusal and then every
//! [`CREDENTIALS_RECHECK`] while the spell lasts, and a spell with no refusal for
//! [`SPELL_GAP`] is over.
//!
//! Invariants:
//! * any HTTP answer, an error code included, is reachability: 429 and 5xx are paced by each
//!   caller's own [`crate::backoff::Backoff`] (exponential, `Retry-After`), never here;
//! * a slow answer is neither: its caller's backoff paces it, and the state changes only when
//!   the new connection the prober then makes fails;
//! * a probe connected but not answered within [`PROBE_TIMEOUT`] is a slow answer: reachable
//!   (the probe's timeout is longer than the connect timeout, so a connection was made);
//! * while unreachable the agent's attempts are the prober's (one per [`PROBE_PERIOD`] range)
//!   plus at most one per caller that was already in flight or woke on a stale answer; while
//!   reachable the prober asks only after a slow failure (at most one probe per
//!   [`SLOW_PROBE_GAP`]) and while credentials are latched;
//! * waiting here never holds a lock: the state is a `tokio::sync::watch` value, the latch a
//!   mutex held for an assignment.

use crate::backoff::Failure;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The prober's period while the server is unreachable: drawn from this range each time
/// (about once a second, and the first answered request under a second after the server is
/// back).
pub const PROBE_PERIOD: (Duration, Duration) =
    (Duration::from_millis(750), Duration::from_millis(950));

/// How long one probe may take: longer than [`super::CONNECT_TIMEOUT`], so that a probe
/// timing out was connected and is a slow answer, not none.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(15);
const _: () = assert!(PROBE_TIMEOUT.as_nanos() > super::CONNECT_TIMEOUT.as_nanos());

/// While credentials are latched refused, the prober asks again this often (one `GET
/// /version` on a new connection: nothing while none is refused).
pub const CREDENTIALS_RECHECK: Duration = Duration::from_secs(10);

/// After a slow failure's probe, further slow failures within this long ask nothing more: a
/// brownout makes every caller time out, and one new connection per gap tells as much as one
/// per slow request.
pub const SLOW_PROBE_GAP: Duration = Duration::from_secs(15);

/// A refusal this long after the last one starts a new spell (and a spell with none for this
/// long is over): twice the longest retry of a caller that reports refusals (the Lease list's
/// and reads' backoff, at most 30 s), so that refusals seen on every retry make one spell.
pub const SPELL_GAP: Duration = Duration::from_secs(60);

/// Whether the API server answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    Reachable,
    Unreachable,
}

/// Refused credentials: the first refusal of the spell and the last one seen.
#[derive(Debug, Default, Clone, Copy)]
struct Latch {
    first: Option<Instant>,
    last: Option<Instant>,
}

impl Latch {
    /// The spell's first and last refusal, if it is not over at `now`.
    fn spell(&self, now: Instant) -> Option<(Instant, Instant)> {
        self.first
            .zip(self.last)
            .filter(|(_, last)| now.saturating_duration_since(*last) < SPELL_GAP)
    }
}

/// The agent's shared view (cheap to clone).
#[derive(Debug, Clone)]
pub struct ApiHealth {
    state: Arc<watch::Sender<Reach>>,
    latch: Arc<std::sync::Mutex<Latch>>,
    /// Wakes the prober: a request timed out, or a refusal was latched.
    ask: Arc<Notify>,
    /// When a slow failure last woke the prober (see [`SLOW_PROBE_GAP`]).
    slow_asked: Arc<std::sync::Mutex<Option<Instant>>>,
}

impl Default for ApiHealth {
    fn default() -> Self {
        Self::new()
    }
}

impl ApiHealth {
    /// Starts reachable: the first request finds out.
    pub fn new() -> Self {
        Self {
            state: Arc::new(watch::Sender::new(Reach::Reachable)),
            latch: Arc::default(),
            ask: Arc::new(Notify::new()),
            slow_asked: Arc::default(),
        }
    }

    /// Reports whether the server (or reaplet's own credential plugin) refused a request's
    /// credentials: for the callers that are all an idle standby sends (its Lease list and
    /// reads), so that credentials rotated away end the agent for a restart as the pod
    /// source's 401s do (see [`Self::refused_for`]). The first refusal of a spell wakes the
    /// prober to ask again at once.
    pub fn credentials(&self, refused: bool) {
        let now = Instant::now();
        let first = {
            let mut l = self.latch.lock().unwrap_or_else(|e| e.into_inner());
            match refused {
                true => {
                    let first = l.spell(now).is_none();
                    if first {
                        l.first = Some(now);
                    }
                    l.last = Some(now);
                    first
                }
                false => {
                    *l = Latch::default();
                    false
                }
            }
        };
        if first {
            self.ask.notify_one();
        }
    }

    /// How long the credentials have been refused, from the spell's first refusal to the
    /// last one seen (`None`: the last answer accepted them, none was reported, or none for
    /// [`SPELL_GAP`]). A refusal nobody saw again stays at its length: only refusals confirmed
    /// by later requests or by the prober's [`CREDENTIALS_RECHECK`] make it grow.
    pub fn refused_for(&self) -> Option<Duration> {
        let l = *self.latch.lock().unwrap_or_else(|e| e.into_inner());
        l.spell(Instant::now())
            .map(|(first, last)| last.duration_since(first))
    }

    fn latched(&self) -> bool {
        self.refused_for().is_some()
    }

    pub fn is_reachable(&self) -> bool {
        *self.state.borrow() == Reach::Reachable
    }

    /// The server answered (any code).
    pub fn answered(&self) {
        self.state.send_if_modified(|s| {
            let changed = *s == Reach::Unreachable;
            if changed {
                tracing::info!("API server reachable again");
            }
            *s = Reach::Reachable;
            changed
        });
    }

    /// A request got no answer.
    pub fn no_answer(&self) {
        self.unreachable_because("a request got no connection");
    }

    fn unreachable_because(&self, why: &'static str) {
        self.state.send_if_modified(|s| {
            let changed = *s == Reach::Reachable;
            if changed {
                tracing::warn!(
                    why,
                    "API server unreachable; probing it about once a second"
                );
            }
            *s = Reach::Unreachable;
            changed
        });
    }

    /// Reports a request's failure: [`Failure::NoAnswer`] marks the server unreachable, an
    /// answered one reachable, a slow one has the prober try a new connection at once (at most
    /// once per [`SLOW_PROBE_GAP`]).
    pub fn failed(&self, f: Failure) {
        match f {
            Failure::NoAnswer => self.no_answer(),
            Failure::Answered { .. } => self.answered(),
            Failure::Slow => {
                let now = Instant::now();
                let due = {
                    let mut last = self.slow_asked.lock().unwrap_or_else(|e| e.into_inner());
                    let due =
                        last.is_none_or(|t| now.saturating_duration_since(t) >= SLOW_PROBE_GAP);
                    if due {
                        *last = Some(now);
                    }
                    due
                };
                if due {
                    self.ask.notify_one();
                }
            }
        }
    }

    /// Resolves when the server is reachable (at once if it is).
    pub async fn reachable(&self) {
        let mut rx = self.state.subscribe();
        // the sender lives as long as `self`: this cannot fail
        let _ = rx.wait_for(|s| *s == Reach::Reachable).await;
    }

    /// Resolves when the server becomes unreachable (at once if it is).
    pub async fn unreachable(&self) {
        let mut rx = self.state.subscribe();
        let _ = rx.wait_for(|s| *s == Reach::Unreachable).await;
    }

    /// A receiver of the state, for select loops.
    pub fn subscribe(&self) -> watch::Receiver<Reach> {
        self.state.subscribe()
    }

    /// After a failure: reports it, then waits `delay` for an answered one, or until the
    /// server is reachable for one without an answer (the prober paces those). False when
    /// cancelled first.
    pub async fn wait_to_retry(
        &self,
        failure: Failure,
        delay: Duration,
        cancel: &CancellationToken,
    ) -> bool {
        self.failed(failure);
        tokio::select! {
            _ = cancel.cancelled() => false,
            _ = async {
                match failure {
                    Failure::NoAnswer => self.reachable().await,
                    Failure::Answered { .. } | Failure::Slow => tokio::time::sleep(delay).await,
                }
            } => true,
        }
    }
}

/// What one probe found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probed {
    /// An answer that accepted the credentials: `/version` read, or a 403 (authenticated,
    /// not allowed).
    Accepted,
    /// The credentials were refused: a 401, or reaplet's credential plugin failed.
    Refused,
    /// Another answer (a 404 or a 5xx, maybe not the API server's own): reachable, and no word
    /// on the credentials.
    Answered,
    /// Connected, not answered within [`PROBE_TIMEOUT`].
    Slow,
    /// No connection.
    NoAnswer,
}

/// One probe: `GET /version` (every authenticated identity may read it; credentials the
/// server does not accept are refused there too, with 401).
async fn probe_once(client: &kube::Client) -> Probed {
    probed(super::bounded_by(PROBE_TIMEOUT, client.apiserver_version()).await)
}

/// What a probe's outcome shows.
fn probed<T>(outcome: Result<T, super::RequestError>) -> Probed {
    match outcome {
        Ok(_) => Probed::Accepted,
        Err(e) if e.credentials_refused() => Probed::Refused,
        Err(e) if e.code() == Some(403) => Probed::Accepted,
        Err(e) => match e.failure() {
            Failure::NoAnswer => Probed::NoAnswer,
            Failure::Slow => Probed::Slow,
            Failure::Answered { .. } => Probed::Answered,
        },
    }
}

/// Whether a probe's outcome shows a server there.
#[cfg(test)]
fn reached<T>(outcome: Result<T, super::RequestError>) -> bool {
    probed(outcome) != Probed::NoAnswer
}

impl ApiHealth {
    /// Takes in what a probe found; false when it found no server.
    fn probed(&self, p: Probed) -> bool {
        match p {
            Probed::NoAnswer => return false,
            Probed::Accepted => {
                if self.latched() {
                    tracing::info!("API server accepts reaplet's credentials again");
                }
                self.credentials(false);
            }
            Probed::Refused => self.credentials(true),
            Probed::Answered | Probed::Slow => {}
        }
        self.answered();
        true
    }
}

/// Runs until cancelled, with `client` (one that opens a new connection for every request:
/// [`super::client::fresh_connections`]): whenever the server is unreachable, probes it every
/// [`PROBE_PERIOD`] until it answers; after a slow failure, probes it at once and marks it
/// unreachable when no connection can be made; while credentials are latched refused, asks
/// again at once and then every [`CREDENTIALS_RECHECK`].
pub async fn probe(health: ApiHealth, client: kube::Client, cancel: CancellationToken) {
    probe_with(
        health,
        move || {
            let client = client.clone();
            async move { probe_once(&client).await }
        },
        cancel,
    )
    .await;
}

async fn probe_with<F, Fut>(health: ApiHealth, mut ask: F, cancel: CancellationToken)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Probed>,
{
    let period = || {
        let (lo, hi) = PROBE_PERIOD;
        lo + (hi - lo).mul_f64(rand::random::<f64>())
    };
    loop {
        let latched = health.latched();
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = health.unreachable() => {
                // the failure that marked it was an attempt: wait one period before the first
                // probe
                loop {
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        _ = health.reachable() => break,
                        _ = tokio::time::sleep(period()) => {}
                    }
                    if health.probed(ask().await) {
                        break;
                    }
                }
            }
            _ = health.ask.notified() => {
                // a request timed out (or a refusal was latched): a new connection decides
                let p = tokio::select! {
                    _ = cancel.cancelled() => return,
                    p = ask() => p,
                };
                if !health.probed(p) {
                    health.unreachable_because("a request timed out and a new connection fails");
                }
            }
            _ = tokio::time::sleep(CREDENTIALS_RECHECK), if latched => {
                let p = tokio::select! {
                    _ = cancel.cancelled() => return,
                    p = ask() => p,
                };
                if !health.probed(p) {
                    health.unreachable_because("no connection for the credentials' check");
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "health_tests.rs"]
mod tests;
