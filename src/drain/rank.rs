//! The ReplicaSet controller's scale-down ranking (`ActivePodsWithRanks.Less`,
//! `pkg/controller/controller_utils.go`), with `LogarithmicScaleDown` and `PodDeletionCost` on
//! (their defaults): which pod of an owner goes first. A pure order over [`RankedPod`].
//!
//! The rules, each deciding only when all before it tie:
//! 1. unassigned (no `spec.nodeName`) before assigned;
//! 2. `Pending` < `Unknown` < `Running` (any other phase counts as `Pending`);
//! 3. not ready before ready;
//! 4. lower `controller.kubernetes.io/pod-deletion-cost` first (missing or invalid: 0);
//! 5. more replicas of the same owner on the pod's node first (the "doubled up" rank);
//! 6. both ready: more recently ready first, on a log2 scale of the time since (same bucket:
//!    the smaller UID first); a missing ready time counts as most recent;
//! 7. more container restarts first (the highest count of any container);
//! 8. newer first, on the same log2 scale of the age (same bucket: the smaller UID first); a
//!    missing creation time counts as newest;
//! 9. otherwise equal (the sort is stable; callers break the tie by UID).

use std::cmp::Ordering;

/// What the ranking reads of a pod.
#[derive(Debug, Clone, PartialEq)]
pub struct RankedPod {
    pub uid: String,
    pub assigned: bool,
    /// `Pending`, `Unknown`, `Running`, ...
    pub phase: String,
    pub ready: bool,
    /// Seconds since the pod became ready (its Ready condition's `lastTransitionTime`).
    pub ready_for: Option<f64>,
    /// `controller.kubernetes.io/pod-deletion-cost`.
    pub deletion_cost: i32,
    /// Replicas of the same owner on this pod's node (the controller's rank).
    pub colocated: u32,
    pub restarts: i32,
    /// Seconds since `metadata.creationTimestamp`.
    pub age: Option<f64>,
}

fn phase_ordinal(p: &str) -> u8 {
    match p {
        "Unknown" => 1,
        "Running" => 2,
        _ => 0,
    }
}

/// `floor(log2(nanoseconds))`, -1 for nothing elapsed (the controller's `logarithmicRankDiff`).
fn log_rank(secs: f64) -> i64 {
    let ns = secs * 1e9;
    if ns > 0.0 {
        ns.log2().floor() as i64
    } else {
        -1
    }
}

/// Time-based rule: `a` and `b` are "seconds since"; a missing one sorts first; else the
/// more recent (smaller) log bucket first; the same bucket: the smaller UID first.
fn recent_first(a: Option<f64>, b: Option<f64>, ua: &str, ub: &str) -> Option<Ordering> {
    match (a, b) {
        (None, None) => None,
        (None, Some(_)) => Some(Ordering::Less),
        (Some(_), None) => Some(Ordering::Greater),
        (Some(x), Some(y)) if x == y => None,
        (Some(x), Some(y)) => match log_rank(x).cmp(&log_rank(y)) {
            Ordering::Equal => Some(ua.cmp(ub)),
            o => Some(o),
        },
    }
}

/// `Less` as an ordering: `Less` means `a` is removed before `b`.
pub fn compare(a: &RankedPod, b: &RankedPod) -> Ordering {
    if a.assigned != b.assigned {
        return if a.assigned {
            Ordering::Greater
        } else {
            Ordering::Less
        };
    }
    let (pa, pb) = (phase_ordinal(&a.phase), phase_ordinal(&b.phase));
    if pa != pb {
        return pa.cmp(&pb);
    }
    if a.ready != b.ready {
        return if a.ready {
            Ordering::Greater
        } else {
            Ordering::Less
        };
    }
    if a.deletion_cost != b.deletion_cost {
        return a.deletion_cost.cmp(&b.deletion_cost);
    }
    if a.colocated != b.colocated {
        return b.colocated.cmp(&a.colocated);
    }
    if a.ready
        && b.ready
        && let Some(o) = recent_first(a.ready_for, b.ready_for, &a.uid, &b.uid)
    {
        return o;
    }
    if a.restarts != b.restarts {
        return b.restarts.cmp(&a.restarts);
    }
    if let Some(o) = recent_first(a.age, b.age, &a.uid, &b.uid) {
        return o;
    }
    Ordering::Equal
}

/// Sorts pods into removal order (stable; exact ties keep their order).
pub fn sort(pods: &mut [RankedPod]) {
    pods.sort_by(compare);
}
