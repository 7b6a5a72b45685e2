//! Grace-period math: kubelet's `calculateEffectiveGracePeriod` (`pod_workers.go`) and the
//! per-container part of `killContainer` (`kuberuntime_container.go`).
//!
//! Invariants (reference §3):
//! * a pod's effective grace only ever decreases; an explicit 0 (force delete, hard eviction)
//!   means 1 and never "fall back to the spec" (the v1.31 fix);
//! * the spec value is used only when nothing else was ever set; a missing spec value is the
//!   API server's default, 30 s;
//! * per container: preStop time and sidecar-ordering wait come off in whole seconds
//!   (truncated, as upstream), then the result is floored at 2 s;
//! * all arithmetic saturates: hostile values never overflow or panic.

use std::time::Duration;

/// The API server's default `terminationGracePeriodSeconds`.
pub const DEFAULT_SPEC_GRACE: i64 = 30;
/// "A minimal shutdown window to avoid unnecessary SIGKILLs" (kubelet's
/// `minimumGracePeriodInSeconds`).
pub const MIN_CONTAINER_GRACE: i64 = 2;
/// The grace given to orphans (runtime pods with no API pod).
pub const ORPHAN_GRACE: i64 = 1;

/// `calculateEffectiveGracePeriod`: `held` is the value the worker already holds (`None` =
/// none yet); `deletion` is `metadata.deletionGracePeriodSeconds`; `kill_override` a kill
/// request's override; `spec` is `spec.terminationGracePeriodSeconds`. The result is ≥ 1.
pub fn effective_grace(
    held: Option<i64>,
    deletion: Option<i64>,
    kill_override: Option<i64>,
    spec: Option<i64>,
) -> i64 {
    effective_grace_from(held, deletion, kill_override, spec).0
}

/// [`effective_grace`], and which input it came from (a termination's timeline says).
pub fn effective_grace_from(
    held: Option<i64>,
    deletion: Option<i64>,
    kill_override: Option<i64>,
    spec: Option<i64>,
) -> (i64, GraceSource) {
    let mut grace = held.map(|g| (g, GraceSource::Held));
    for (candidate, from) in [
        (deletion, GraceSource::Deletion),
        (kill_override, GraceSource::Override),
    ] {
        if let Some(c) = candidate
            && grace.is_none_or(|(g, _)| c < g)
        {
            grace = Some((c, from));
        }
    }
    let (g, from) = match (grace, spec) {
        (Some(g), _) => g,
        (None, Some(s)) => (s, GraceSource::Spec),
        (None, None) => (DEFAULT_SPEC_GRACE, GraceSource::Default),
    };
    (g.max(1), from)
}

/// Where a termination's grace came from (the inputs of `calculateEffectiveGracePeriod`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum GraceSource {
    /// `spec.terminationGracePeriodSeconds`.
    Spec,
    /// The API server's default (30 s) for a spec without one.
    Default,
    /// `metadata.deletionGracePeriodSeconds` (a DELETE's or an eviction's grace).
    Deletion,
    /// The kill request's own override (an eviction source, shutdown, an orphan's 1 s).
    Override,
    /// What the worker already held (an only-shorter override that was not shorter).
    Held,
}

impl GraceSource {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Spec => "terminationGracePeriodSeconds",
            Self::Default => "the API default",
            Self::Deletion => "deletionGracePeriodSeconds",
            Self::Override => "the kill request",
            Self::Held => "the grace already held",
        }
    }
}

/// Whole seconds that `elapsed` takes off a grace (truncated, like the kubelet's
/// `int64(time.Since(start).Seconds())`).
pub fn whole_seconds(elapsed: Duration) -> i64 {
    i64::try_from(elapsed.as_secs()).unwrap_or(i64::MAX)
}

/// What is left of `grace` after `elapsed` (may go negative; the floor comes later).
pub fn deduct(grace: i64, elapsed: Duration) -> i64 {
    grace.saturating_sub(whole_seconds(elapsed))
}

/// The value passed to `StopContainer`: never below the 2 s floor.
pub fn container_stop_timeout(remaining: i64) -> i64 {
    remaining.max(MIN_CONTAINER_GRACE)
}

/// A grace in seconds as a timer duration (negative → zero).
pub fn as_duration(grace: i64) -> Duration {
    Duration::from_secs(u64::try_from(grace).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deletion_grace_wins_when_none_held() {
        assert_eq!(effective_grace(None, Some(10), None, Some(30)), 10);
    }

    #[test]
    fn spec_only_when_nothing_set() {
        assert_eq!(effective_grace(None, None, None, Some(45)), 45);
        assert_eq!(effective_grace(None, None, None, None), DEFAULT_SPEC_GRACE);
    }

    #[test]
    fn explicit_zero_means_one_not_spec() {
        assert_eq!(effective_grace(None, Some(0), None, Some(600)), 1);
        assert_eq!(effective_grace(None, None, Some(0), Some(600)), 1);
    }

    #[test]
    fn negative_means_one() {
        assert_eq!(effective_grace(None, Some(-5), None, Some(30)), 1);
        assert_eq!(effective_grace(None, None, Some(i64::MIN), Some(30)), 1);
        assert_eq!(effective_grace(None, None, None, Some(-3)), 1);
    }

    #[test]
    fn only_decreases() {
        assert_eq!(effective_grace(Some(5), Some(30), None, Some(60)), 5);
        assert_eq!(effective_grace(Some(5), None, Some(30), Some(60)), 5);
        assert_eq!(effective_grace(Some(30), Some(3), None, Some(60)), 3);
        assert_eq!(effective_grace(Some(30), None, Some(3), None), 3);
        // the held value wins over the spec even if the spec is smaller
        assert_eq!(effective_grace(Some(30), None, None, Some(1)), 30);
    }

    #[test]
    fn override_vs_deletion_smallest_wins() {
        assert_eq!(effective_grace(None, Some(20), Some(7), Some(30)), 7);
        assert_eq!(effective_grace(None, Some(4), Some(7), Some(30)), 4);
        assert_eq!(effective_grace(None, None, Some(ORPHAN_GRACE), None), 1);
    }

    #[test]
    fn huge_values_saturate() {
        assert_eq!(effective_grace(None, None, None, Some(i64::MAX)), i64::MAX);
        assert_eq!(deduct(i64::MIN, Duration::from_secs(u64::MAX)), i64::MIN);
        assert_eq!(container_stop_timeout(i64::MIN), MIN_CONTAINER_GRACE);
        assert_eq!(as_duration(-1), Duration::ZERO);
    }

    #[test]
    fn prestop_and_sidecar_wait_deducted_in_whole_seconds() {
        // 30 s grace, preStop took 4.9 s → 26 s left; sidecar waited 3.2 s → 23 s
        let g = deduct(30, Duration::from_millis(4900));
        assert_eq!(g, 26);
        let g = deduct(g, Duration::from_millis(3200));
        assert_eq!(container_stop_timeout(g), 23);
    }

    #[test]
    fn two_second_floor() {
        assert_eq!(container_stop_timeout(1), 2);
        assert_eq!(
            container_stop_timeout(deduct(3, Duration::from_secs(10))),
            2
        );
        assert_eq!(
            container_stop_timeout(effective_grace(None, Some(0), None, None)),
            2
        );
        assert_eq!(container_stop_timeout(5), 5);
    }
}
