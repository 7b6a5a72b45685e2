//! One deadline type for the whole pipeline: a monotonic instant and where it came from.
//! The kubelet keeps a pod's kill deadline implicitly (`podSyncStatus.gracePeriod` and the
//! start of `killPod`, `pod_workers.go`); reaplet makes it a value, so that the lifecycle, the
//! kill, `reaplet pods` and the ExceededGracePeriod alarm all read the same thing.
//!
//! Invariants:
//! * deadlines live on tokio's monotonic clock (paused in unit tests); the API's wall-clock
//!   `deletionTimestamp` (another machine's clock) never becomes a deadline: what survives a
//!   restart of reaplet is its own durable record of each stop ([`crate::terminating::records`]);
//! * combining two deadlines keeps the earlier one ([`Deadline::earliest`]): a deadline is
//!   never extended;
//! * arithmetic saturates: an absurd grace (up to `i64::MAX` seconds) becomes a deadline a
//!   century away, never an overflow;
//! * time left is rounded up to whole seconds ([`Deadline::remaining_secs`]): reaplet never
//!   kills before a deadline because of rounding;
//! * a moment that must outlive reaplet's process ([`Stamp`], in its durable records) is
//!   `CLOCK_BOOTTIME` with the boot it belongs to (monotonic, counting suspend, never stepped by
//!   NTP or an operator); the wall clock is read from it only in another boot.

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

/// A moment that outlives reaplet's process: `CLOCK_BOOTTIME` (ms) with this boot's ID, and
/// the wall clock (Unix ms), which counts only for a stamp of another boot. A step of the wall
/// clock between writing and reading a stamp never moves it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Stamp {
    /// `/proc/sys/kernel/random/boot_id`; empty when it could not be read.
    pub boot: String,
    pub boottime_ms: i64,
    pub wall_ms: i64,
}

impl Stamp {
    /// Now.
    pub fn now() -> Self {
        let t = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
        Self {
            boot: boot_id().to_owned(),
            boottime_ms: t.tv_sec.saturating_mul(1000) + t.tv_nsec / 1_000_000,
            wall_ms: crate::wall_ns() / 1_000_000,
        }
    }

    /// A stamp known only by its wall-clock time (what records of older versions held).
    pub fn wall_only(wall_ms: i64) -> Self {
        Self {
            boot: String::new(),
            boottime_ms: 0,
            wall_ms,
        }
    }

    /// `ms` later (negative: earlier), saturating.
    pub fn plus_ms(&self, ms: i64) -> Self {
        Self {
            boot: self.boot.clone(),
            boottime_ms: self.boottime_ms.saturating_add(ms),
            wall_ms: self.wall_ms.saturating_add(ms),
        }
    }

    /// Milliseconds from `now` to this stamp (negative once past): on `CLOCK_BOOTTIME` when
    /// both are of the same known boot, else on the wall clock.
    pub fn ms_from(&self, now: &Stamp) -> i64 {
        if !self.boot.is_empty() && self.boot == now.boot {
            self.boottime_ms.saturating_sub(now.boottime_ms)
        } else {
            self.wall_ms.saturating_sub(now.wall_ms)
        }
    }

    /// Whether this stamp is no later than `other`.
    pub fn not_after(&self, other: &Stamp) -> bool {
        self.ms_from(other) <= 0
    }
}

/// This boot's ID, read once; empty if it cannot be read (stamps then compare wall clocks).
pub(crate) fn boot_id() -> &'static str {
    static ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ID.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .map(|s| s.trim().to_owned())
            .unwrap_or_default()
    })
}

#[cfg(test)]
mod tests {
    /// Issue 28, item 4: a stamp written 20 s ahead, then the wall clock stepped 60 s
    /// forward: in the same boot 20 s are still left (CLOCK_BOOTTIME); in another boot only
    /// the wall clock can say, and an older record knows only that.
    #[test]
    fn a_wall_clock_step_never_moves_a_stamp_of_this_boot() {
        use super::Stamp;
        let now = Stamp::now();
        assert!(!now.boot.is_empty(), "this machine has a boot ID");
        let deadline = now.plus_ms(20_000);
        let stepped = Stamp {
            wall_ms: now.wall_ms + 60_000,
            ..now.clone()
        };
        assert_eq!(deadline.ms_from(&stepped), 20_000);
        let other_boot = Stamp {
            boot: "another".into(),
            ..stepped.clone()
        };
        assert_eq!(deadline.ms_from(&other_boot), -40_000);
        assert_eq!(
            Stamp::wall_only(deadline.wall_ms).ms_from(&stepped),
            -40_000
        );
        assert!(now.not_after(&deadline) && !deadline.not_after(&now));
        // the real clock moves on
        std::thread::sleep(std::time::Duration::from_millis(5));
        assert!(deadline.ms_from(&Stamp::now()) < 20_000);
    }

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
