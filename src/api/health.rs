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
//! changes nothing here. Marking the server unreachable then would hold every status write,
//! delete, event and Lease read of the agent behind the prober for the whole brownout.
//!
//! Invariants:
//! * any HTTP answer, an error code included, is reachability: 429 and 5xx are paced by each
//!   caller's own [`crate::backoff::Backoff`] (exponential, `Retry-After`), never here;
//! * a slow answer is neither: its caller's backoff paces it, and the state stays as it was;
//! * a probe connected but not answered within [`PROBE_TIMEOUT`] is a slow answer: reachable
//!   (the probe's timeout is longer than the connect timeout, so a connection was made);
//! * while unreachable the agent's attempts are the prober's (one per [`PROBE_PERIOD`] range)
//!   plus at most one per caller that was already in flight or woke on a stale answer;
//! * waiting here never holds a lock: the state is a `tokio::sync::watch` value.

use crate::backoff::Failure;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
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

/// Whether the API server answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    Reachable,
    Unreachable,
}

/// The agent's shared view (cheap to clone).
#[derive(Debug, Clone)]
pub struct ApiHealth {
    state: Arc<watch::Sender<Reach>>,
    /// Since when every request reported through [`Self::credentials`] was refused (401, or a
    /// credential plugin that failed); `None` once one was accepted.
    refused_since: Arc<std::sync::Mutex<Option<tokio::time::Instant>>>,
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
            refused_since: Arc::default(),
        }
    }

    /// Reports whether the server (or reaplet's own credential plugin) refused a request's
    /// credentials: for the callers that are all an idle standby sends (its Lease list and
    /// reads), so that credentials rotated away end the agent for a restart as the pod
    /// source's 401s do (see [`Self::refused_for`]).
    pub fn credentials(&self, refused: bool) {
        let mut since = self.refused_since.lock().unwrap_or_else(|e| e.into_inner());
        match refused {
            true => {
                since.get_or_insert_with(tokio::time::Instant::now);
            }
            false => *since = None,
        }
    }

    /// How long every reported request has been refused its credentials (`None`: the last
    /// one was accepted, or none was reported).
    pub fn refused_for(&self) -> Option<Duration> {
        let since = *self.refused_since.lock().unwrap_or_else(|e| e.into_inner());
        since.map(|t| t.elapsed())
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
        self.state.send_if_modified(|s| {
            let changed = *s == Reach::Reachable;
            if changed {
                tracing::warn!("API server unreachable; probing it about once a second");
            }
            *s = Reach::Unreachable;
            changed
        });
    }

    /// Reports a request's failure: [`Failure::NoAnswer`] marks the server unreachable, an
    /// answered one reachable, a slow one changes nothing.
    pub fn failed(&self, f: Failure) {
        match f {
            Failure::NoAnswer => self.no_answer(),
            Failure::Answered { .. } => self.answered(),
            Failure::Slow => {}
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

/// One probe: any HTTP answer to `GET /version` (every authenticated identity may read it),
/// or a connection that answers slowly, means reachable.
async fn probe_once(client: &kube::Client) -> bool {
    reached(super::bounded_by(PROBE_TIMEOUT, client.apiserver_version()).await)
}

/// Whether a probe's outcome shows a server there.
fn reached<T>(outcome: Result<T, super::RequestError>) -> bool {
    match outcome {
        Ok(_) => true,
        Err(e) => e.failure() != Failure::NoAnswer,
    }
}

/// Runs until cancelled: whenever the server is unreachable, probes it every
/// [`PROBE_PERIOD`] until it answers.
pub async fn probe(health: ApiHealth, client: kube::Client, cancel: CancellationToken) {
    let period = || {
        let (lo, hi) = PROBE_PERIOD;
        lo + (hi - lo).mul_f64(rand::random::<f64>())
    };
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = health.unreachable() => {}
        }
        // the failure that marked it was an attempt: wait one period before the first probe
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = health.reachable() => break,
                _ = tokio::time::sleep(period()) => {}
            }
            if probe_once(&client).await {
                health.answered();
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::Instant;

    /// Issue 38, item 1: a request that timed out on a connection leaves the server reachable
    /// (before, any timeout marked it unreachable and held every caller behind the prober),
    /// and a probe that timed out that way brings it back.
    #[tokio::test(start_paused = true)]
    async fn a_slow_answer_is_not_an_outage() {
        let h = ApiHealth::new();
        let slow = super::super::RequestError::Timeout(super::super::REQUEST_TIMEOUT);
        assert_eq!(slow.failure(), Failure::Slow);
        h.failed(slow.failure());
        assert!(h.is_reachable());
        let cancel = CancellationToken::new();
        let t0 = Instant::now();
        assert!(
            h.wait_to_retry(Failure::Slow, Duration::from_secs(2), &cancel)
                .await
        );
        assert_eq!(Instant::now() - t0, Duration::from_secs(2));
        h.no_answer();
        h.failed(Failure::Slow);
        assert!(!h.is_reachable(), "a slow answer says nothing of an outage");
        assert!(reached::<()>(Err(super::super::RequestError::Timeout(
            PROBE_TIMEOUT
        ))));
        let refused = kube::Error::Service("connection refused".into());
        assert!(!reached::<()>(Err(super::super::RequestError::Api(
            refused
        ))));
    }

    #[tokio::test(start_paused = true)]
    async fn waiters_wake_at_once_on_the_first_answer() {
        let h = ApiHealth::new();
        h.no_answer();
        assert!(!h.is_reachable());
        let t0 = Instant::now();
        let waiters: Vec<_> = (0..5)
            .map(|_| {
                let h = h.clone();
                tokio::spawn(async move {
                    h.reachable().await;
                    Instant::now()
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_secs(7)).await;
        h.failed(Failure::Answered { retry_after: None });
        for w in waiters {
            assert_eq!(w.await.unwrap() - t0, Duration::from_secs(7));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_answered_failure_waits_its_delay_and_no_answer_waits_for_reachability() {
        let h = ApiHealth::new();
        let cancel = CancellationToken::new();
        let t0 = Instant::now();
        let answered = Failure::Answered { retry_after: None };
        assert!(
            h.wait_to_retry(answered, Duration::from_secs(3), &cancel)
                .await
        );
        assert_eq!(Instant::now() - t0, Duration::from_secs(3));
        let h2 = h.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(10)).await;
            h2.answered();
        });
        let t1 = Instant::now();
        assert!(
            h.wait_to_retry(Failure::NoAnswer, Duration::from_secs(1), &cancel)
                .await
        );
        assert_eq!(Instant::now() - t1, Duration::from_secs(10));
        cancel.cancel();
        assert!(
            !h.wait_to_retry(Failure::NoAnswer, Duration::ZERO, &cancel)
                .await
        );
    }
}
