//! One deadline type for the whole pipeline: a monotonic instant and where it came from.
//! The kubelet keeps a pod's kill deadline implicitly (`podSyncStatus.gracePeriod` and the
//! start of `killPod`, `pod_workers.go`); reaplet makes it a value, so that the lifecycle, the
//! kill, `reaplet pods` and the ExceededGracePeriod alarm all read the same thing.
//!
//! Invariants:
//! * deadlines live on tokio's monotonic clock (paused in unit tests); the API's wall-clock
//!   `deletionTimestamp` (another machine's clock) never becomes a deadline: what survives a
//!   restart of reaplet is its own durable record of each stop ([`crate::records`]);
//! * combining two deadlines keeps the earlier one ([`Deadline::earliest`]): a deadline is
//!   never extended;
//! * arithmetic saturates: an absurd grace (up to `i64::MAX` seconds) becomes a deadline a
//!   century away, never an overflow;
//! * time left is rounded up to whole seconds ([`Deadline::remaining_secs`]): reaplet never
//!   kills before a deadline because of rounding.

use std::time::Duration;
use tokio::time::Instant;

/// As good as never: where a deadline that would overflow the clock saturates (a century).
const FAR: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// `start + d`, saturating (an absurd grace never overflows the clock or panics).
pub fn saturating_add(start: Instant, d: Duration) -> Instant {
    start
        .checked_add(d)
        .or_else(|| start.checked_add(FAR))
        .unwrap_or(start)
}

/// Why a deadline is where it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadlineOrigin {
    /// The current kill attempt: its start plus the grace (2 s floor).
    Grace,
    /// A kill retried after a failed attempt counts down to the first attempt's deadline.
    FirstAttempt,
}

impl DeadlineOrigin {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Grace => "grace",
            Self::FirstAttempt => "first_attempt",
        }
    }
}

/// A point on the monotonic clock by which something must be done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadline {
    pub at: Instant,
    pub origin: DeadlineOrigin,
}

impl Deadline {
    pub fn new(at: Instant, origin: DeadlineOrigin) -> Self {
        Self { at, origin }
    }

    /// `secs` seconds (negative: already past) after `start`.
    pub fn after(start: Instant, secs: i64, origin: DeadlineOrigin) -> Self {
        let d = Duration::from_secs(secs.unsigned_abs());
        let at = if secs >= 0 {
            saturating_add(start, d)
        } else {
            start.checked_sub(d).unwrap_or(start)
        };
        Self { at, origin }
    }

    /// The earlier of two deadlines (a deadline is never extended).
    pub fn earliest(a: Option<Deadline>, b: Option<Deadline>) -> Option<Deadline> {
        match (a, b) {
            (Some(a), Some(b)) => Some(if b.at < a.at { b } else { a }),
            (a, b) => a.or(b),
        }
    }

    /// Whole seconds left at `now`, rounded up; 0 once past.
    pub fn remaining_secs(&self, now: Instant) -> i64 {
        let left = self.at.saturating_duration_since(now);
        let secs = left.as_secs() + u64::from(left.subsec_nanos() > 0);
        i64::try_from(secs).unwrap_or(i64::MAX)
    }

    /// Seconds left at `now`, negative once past (for display).
    pub fn signed_secs(&self, now: Instant) -> f64 {
        if self.at >= now {
            (self.at - now).as_secs_f64()
        } else {
            -(now - self.at).as_secs_f64()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn rounding_conversion_and_earliest() {
        let now = Instant::now();
        let d = Deadline::after(now, 3, DeadlineOrigin::Grace);
        assert_eq!(d.remaining_secs(now), 3);
        assert_eq!(
            d.remaining_secs(now + Duration::from_millis(2_100)),
            1,
            "rounded up"
        );
        assert_eq!(d.remaining_secs(now + Duration::from_secs(9)), 0);
        let r = Deadline::after(now, 5, DeadlineOrigin::FirstAttempt);
        assert_eq!(r.at, now + Duration::from_secs(5));
        let past = Deadline::after(now, -10, DeadlineOrigin::FirstAttempt);
        assert_eq!(past.remaining_secs(now), 0);
        assert_eq!(Deadline::earliest(Some(d), Some(r)), Some(d));
        assert_eq!(Deadline::earliest(None, Some(r)), Some(r));
        assert!(past.signed_secs(now) < 0.0);
        let far = Deadline::after(now, i64::MAX, DeadlineOrigin::Grace);
        assert!(far.at > now + Duration::from_secs(50 * 365 * 24 * 3600));
    }
}
