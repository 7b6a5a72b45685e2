//! The one backoff of the agent: client-go's `wait.Backoff` / `flowcontrol.Backoff` (the
//! reflector's 800 ms doubling to 30 s, the kubelet's pod-worker and runtime retries), built on
//! the `backon` crate's exponential sequence (the one kube-runtime itself uses).
//!
//! Every retry loop of reaplet draws its delays from a [`Backoff`] (or, for a pure state
//! machine that keeps its own failure count, from [`Policy::step`]); none computes its own.
//!
//! Invariants:
//! * the n-th consecutive failure waits `min * 2^(n-1)`, never more than `max`, drawn from the
//!   upper quarter below that step (jitter, so many callers failing together do not retry in
//!   lock step);
//! * a failure the server answered never waits less than its `Retry-After` (capped at
//!   [`MAX_RETRY_AFTER`]: a wrong one must not blind reaplet for hours);
//! * a failure without a connection (refused, reset, not connected in time) does not grow the
//!   delay: the server is down or unreachable, not overloaded, and the agent-wide health
//!   ([`crate::api::health`]) paces those retries at about one a second;
//! * a request sent on a connection and not answered in time ([`Failure::Slow`]) grows the
//!   delay as an answered failure does: slow is overloaded, not down;
//! * a request's success resets the sequence to `min` ([`Backoff::succeeded`]); a list and
//!   watch loop resets it only after [`STABLE_RESET`] without a failure
//!   ([`Backoff::resetting_after`], client-go's reflector: a list that works followed by a
//!   watch that fails at once is a failure that repeats, not a recovery).

use backon::{BackoffBuilder, ExponentialBuilder};
use std::time::Duration;

/// A `Retry-After` longer than this is taken as this.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

/// The retry delay after a failure without an answer, before jitter (see the module doc).
pub const NO_ANSWER: Duration = Duration::from_secs(1);

/// How long a list and watch loop must run without a failure before its backoff starts from
/// `min` again (client-go's reflector: `backoffReset`, two minutes).
pub const STABLE_RESET: Duration = Duration::from_secs(120);

/// A backoff's shape: the first delay and the cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    pub min: Duration,
    pub max: Duration,
}

impl Policy {
    /// API requests answered with an error (429, 5xx, ...): client-go's reflector and its
    /// default rate limiter, 800 ms doubling to 30 s.
    pub const API: Policy = Policy {
        min: Duration::from_millis(800),
        max: Duration::from_secs(30),
    };

    /// Runtime (CRI) steps of a pod worker, subscriptions, restarts: 1 s doubling to 30 s
    /// (the kubelet waits 10 s between pod sync attempts; reaplet retries sooner, then backs
    /// off).
    pub const RUNTIME: Policy = Policy {
        min: Duration::from_secs(1),
        max: Duration::from_secs(30),
    };

    /// The delay before the retry after `failures` consecutive failures (1 = the first
    /// failure), without jitter; zero for none. Pure: for state machines that keep their own
    /// count.
    pub fn step(&self, failures: u32) -> Duration {
        if failures == 0 {
            return Duration::ZERO;
        }
        // the sequence is min, 2min, 4min, ... capped at max: past 16 doublings it is max
        let n = failures.min(17) as usize;
        let d = ExponentialBuilder::new()
            .with_min_delay(self.min)
            .with_max_delay(self.max)
            .with_factor(2.0)
            .without_max_times()
            .build()
            .nth(n - 1)
            .unwrap_or(self.max)
            .min(self.max);
        // backon multiplies in f32: 1.600000024 s is 1.6 s
        let ms = (d.as_nanos() + 500_000) / 1_000_000;
        Duration::from_millis(u64::try_from(ms).unwrap_or(u64::MAX))
    }

    /// [`Self::step`] drawn from the upper quarter below it; `jitter` in `[0, 1)`.
    pub fn jittered(&self, failures: u32, jitter: f64) -> Duration {
        self.step(failures)
            .mul_f64(0.75 + 0.25 * jitter.clamp(0.0, 1.0))
    }
}

/// What a failed attempt tells the backoff.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// No connection: refused, reset, TLS broken, or not connected within the connect timeout.
    NoAnswer,
    /// The server answered with an error code, maybe asking for a delay.
    Answered { retry_after: Option<Duration> },
    /// Connected (the TLS handshake answered), but no answer within the request's timeout: an
    /// overloaded or queueing server (priority and fairness), not a gone one. Paced like an
    /// answered failure, by the caller alone.
    Slow,
}

/// Consecutive failures of one caller and the delays they earn (see the module doc).
#[derive(Debug, Clone)]
pub struct Backoff {
    policy: Policy,
    failures: u32,
    /// Failures this far apart start from `min` again (none: only [`Self::succeeded`] resets).
    reset_after: Option<Duration>,
    /// When the last failure came (monotonic).
    last_failure: Option<tokio::time::Instant>,
}

impl Backoff {
    pub const fn new(policy: Policy) -> Self {
        Self {
            policy,
            failures: 0,
            reset_after: None,
            last_failure: None,
        }
    }

    /// A backoff for a list and watch loop: it starts from `min` again only when a failure
    /// comes more than `stable` after the one before (see [`STABLE_RESET`]); its caller never
    /// calls [`Self::succeeded`] for an event.
    pub const fn resetting_after(policy: Policy, stable: Duration) -> Self {
        Self {
            policy,
            failures: 0,
            reset_after: Some(stable),
            last_failure: None,
        }
    }

    /// Consecutive answered failures since the last success.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// An attempt failed: how long to wait before the next. `jitter` in `[0, 1)`.
    pub fn failed(&mut self, failure: Failure, jitter: f64) -> Duration {
        let jitter = jitter.clamp(0.0, 1.0);
        let now = tokio::time::Instant::now();
        if let (Some(stable), Some(last)) = (self.reset_after, self.last_failure)
            && now.duration_since(last) > stable
        {
            self.failures = 0;
        }
        self.last_failure = Some(now);
        let retry_after = match failure {
            Failure::NoAnswer => return NO_ANSWER.mul_f64(0.75 + 0.5 * jitter),
            Failure::Answered { retry_after } => retry_after,
            Failure::Slow => None,
        };
        self.failures = self.failures.saturating_add(1);
        let delay = self.policy.jittered(self.failures, jitter);
        delay.max(retry_after.unwrap_or_default().min(MAX_RETRY_AFTER))
    }

    /// An attempt succeeded: the next failure starts from `min` again.
    pub fn succeeded(&mut self) {
        self.failures = 0;
        self.last_failure = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_double_from_min_to_the_cap() {
        let p = Policy::API;
        let steps: Vec<u128> = (0..9).map(|n| p.step(n).as_millis()).collect();
        assert_eq!(
            steps,
            [0, 800, 1600, 3200, 6400, 12800, 25600, 30000, 30000]
        );
        assert_eq!(p.step(u32::MAX), Duration::from_secs(30));
        assert_eq!(Policy::RUNTIME.step(1), Duration::from_secs(1));
        assert_eq!(Policy::RUNTIME.step(3), Duration::from_secs(4));
    }

    #[test]
    fn answered_failures_grow_with_jitter_and_reset_on_success() {
        let mut b = Backoff::new(Policy::API);
        let answered = Failure::Answered { retry_after: None };
        assert_eq!(b.failed(answered, 0.0), Duration::from_millis(600));
        assert_eq!(b.failed(answered, 1.0), Duration::from_millis(1600));
        let third = b.failed(answered, 0.5);
        assert!(third > Duration::from_millis(2400) && third < Duration::from_millis(3200));
        for _ in 0..20 {
            assert!(b.failed(answered, 1.0) <= Duration::from_secs(30));
        }
        b.succeeded();
        assert_eq!(b.failed(answered, 1.0), Duration::from_millis(800));
    }

    /// Issue 38, item 5: a list and watch loop's backoff, like the reflector's, keeps growing
    /// through failures less than two minutes apart and starts over only after two quiet
    /// minutes.
    #[tokio::test(start_paused = true)]
    async fn a_loop_backoff_resets_only_after_two_quiet_minutes() {
        let mut b = Backoff::resetting_after(Policy::API, STABLE_RESET);
        let answered = Failure::Answered { retry_after: None };
        let mut last = Duration::ZERO;
        for _ in 0..10 {
            last = b.failed(answered, 1.0);
            tokio::time::sleep(Duration::from_secs(5)).await;
        }
        assert_eq!(last, Duration::from_secs(30));
        tokio::time::sleep(Duration::from_secs(114)).await; // 119 s after the last failure
        assert_eq!(b.failed(answered, 1.0), Duration::from_secs(30));
        tokio::time::sleep(Duration::from_secs(121)).await;
        assert_eq!(b.failed(answered, 1.0), Duration::from_millis(800));
        // no-answer failures count as failures for the quiet period too
        tokio::time::sleep(Duration::from_secs(60)).await;
        b.failed(Failure::NoAnswer, 0.5);
        tokio::time::sleep(Duration::from_secs(61)).await;
        assert_eq!(b.failed(answered, 1.0), Duration::from_millis(1600));
    }

    /// Issue 38, item 1: a slow answer backs off like an answered failure, not at the
    /// no-answer second.
    #[test]
    fn a_slow_failure_grows_like_an_answered_one() {
        let mut b = Backoff::new(Policy::API);
        assert_eq!(b.failed(Failure::Slow, 1.0), Duration::from_millis(800));
        assert_eq!(b.failed(Failure::Slow, 1.0), Duration::from_millis(1600));
        assert_eq!(b.failures(), 2);
    }

    #[test]
    fn retry_after_is_honoured_within_a_bound() {
        let mut b = Backoff::new(Policy::API);
        let asked = |s| Failure::Answered {
            retry_after: Some(Duration::from_secs(s)),
        };
        assert_eq!(b.failed(asked(5), 1.0), Duration::from_secs(5));
        assert_eq!(b.failed(asked(3600), 1.0), MAX_RETRY_AFTER);
    }

    #[test]
    fn no_answer_stays_near_a_second_and_does_not_grow() {
        let mut b = Backoff::new(Policy::API);
        for i in 0..100 {
            let d = b.failed(Failure::NoAnswer, f64::from(i) / 100.0);
            assert!(
                d >= Duration::from_millis(750) && d <= Duration::from_millis(1250),
                "{d:?}"
            );
        }
        assert_eq!(b.failures(), 0);
        // and an answered failure after an outage starts from the bottom
        assert_eq!(
            b.failed(Failure::Answered { retry_after: None }, 1.0),
            Duration::from_millis(800)
        );
    }
}
