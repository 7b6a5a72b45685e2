//! The ReplicaSet controller's scale-down ranking (`ActivePodsWithRanks.Less`,
//! `pkg/controller/controller_utils.go`), with `LogarithmicScaleDown` and `PodDeletionCost` on
//! (their defaults): which pod of an owner goes first. A pure order over [`RankedPod`].
//!
//! The rules, each deciding only when all before it tie:
//! 1. unassigned (no `spec.nodeName`) before assigned;
//! 2. `Pending` < `Unknown` < `Running` (any other phase counts as `Pending`);
//! 3. not ready before ready;
//! 4. lower `controller.kubernetes.io/pod-deletion-cost` first (missing or invalid: 0);
//! 5. more related active pods on the pod's node first (the "doubled up" rank: for a
//!    ReplicaSet of a Deployment, the pods of all that Deployment's ReplicaSets; a ReplicaSet
//!    without an owner ranks 0);
//! 6. both ready: more recently ready first, on a log2 scale of the time since (same bucket:
//!    the smaller UID first); a missing ready time counts as most recent. Times are measured
//!    at full precision from one "now" per plan to the pods' second-precision timestamps, and
//!    the bucket is Go's `int64(math.Log2(float64(ns)))` ([`log_rank`]);
//! 7. more container restarts first (the highest count of any container; equal: of any sidecar);
//! 8. newer first, on the same log2 scale of the age (same bucket: the smaller UID first); a
//!    missing creation time counts as newest;
//! 9. otherwise equal (the controller's sort is not stable, so such a tie is arbitrary there;
//!    callers break it by UID).

use std::cmp::Ordering;

/// A pod's phase as the ranking orders it (`Pending` < `Unknown` < `Running`; any other
/// phase counts as `Pending`, as the controller's map lookup gives 0 for it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub enum Phase {
    Pending,
    Unknown,
    Running,
}

impl Phase {
    pub fn from_api(phase: Option<&str>) -> Phase {
        match phase {
            Some("Unknown") => Phase::Unknown,
            Some("Running") => Phase::Running,
            _ => Phase::Pending,
        }
    }
}

/// What the ranking reads of a pod. Times are nanoseconds from the plan's one "now" (the
/// controller's `metav1.Now()`, full precision) back to the pod's second-precision timestamp;
/// `None` is a missing (zero) timestamp.
#[derive(Debug, Clone, PartialEq)]
pub struct RankedPod {
    pub uid: String,
    pub assigned: bool,
    pub phase: Phase,
    pub ready: bool,
    /// Since the pod became ready (its Ready condition's `lastTransitionTime`), in ns.
    pub ready_for: Option<i64>,
    /// `controller.kubernetes.io/pod-deletion-cost`.
    pub deletion_cost: i32,
    /// Replicas of the same owner on this pod's node (the controller's rank).
    pub colocated: u32,
    /// The highest restart count of the containers.
    pub restarts: i32,
    /// The highest of the sidecars (restartable init containers): decides after `restarts`.
    pub sidecar_restarts: i32,
    /// Since `metadata.creationTimestamp`, in ns.
    pub age: Option<i64>,
}

impl RankedPod {
    /// The log2 bucket of the time since ready, when the ranking reads it.
    pub fn ready_bucket(&self) -> Option<i64> {
        self.ready_for.filter(|_| self.ready).map(log_rank)
    }

    /// The log2 bucket of the age.
    pub fn creation_bucket(&self) -> Option<i64> {
        self.age.map(log_rank)
    }
}

/// The controller's `logarithmicRankDiff` term for one duration: `int64(math.Log2(float64(d)))`
/// for `d > 0` ns, else -1, computed as Go's `math.Log2` does: the duration converted to a
/// float, split into a fraction in [0.5, 1) and a binary exponent, the exponent plus the
/// fraction's logarithm, truncated. Below 2^49 ns (6.5 days) that is the binary exponent of
/// the duration; above it, in the last nanoseconds before a power of two, the sum rounds up
/// to it, and so does this.
pub fn log_rank(ns: i64) -> i64 {
    if ns <= 0 {
        return -1;
    }
    let x = ns as f64;
    // x is a positive normal double: x = frac * 2^exp with frac in [0.5, 1)
    let exp = ((x.to_bits() >> 52) & 0x7ff) as i64 - 1022;
    let frac = f64::from_bits((x.to_bits() & !(0x7ff << 52)) | (1022 << 52));
    if frac == 0.5 {
        return exp - 1;
    }
    (frac.ln() * (1.0 / std::f64::consts::LN_2) + exp as f64) as i64
}

/// Time-based rule: `a` and `b` are "since"; equal times (same timestamp) do not decide; a
/// missing one sorts first (`afterOrZero`); else the more recent (smaller) log bucket first;
/// the same bucket: the smaller UID first.
fn recent_first(a: Option<i64>, b: Option<i64>, ua: &str, ub: &str) -> Option<Ordering> {
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
    if a.phase != b.phase {
        return a.phase.cmp(&b.phase);
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
    if a.sidecar_restarts != b.sidecar_restarts {
        return b.sidecar_restarts.cmp(&a.sidecar_restarts);
    }
    if let Some(o) = recent_first(a.age, b.age, &a.uid, &b.uid) {
        return o;
    }
    Ordering::Equal
}

/// A stable merge sort that tolerates an inconsistent `less`. The ranking is not a total
/// order: three pods can form a cycle (equal ready times let restarts decide, the same log2
/// bucket lets the UID decide), and `slice::sort_by` may panic on such a comparator where Go's
/// `sort.Sort` does not. Such an order is arbitrary in the controller too (its input order
/// comes from a map); this one is at least deterministic.
pub fn merge_sort_by<T: Clone>(v: &mut [T], cmp: &impl Fn(&T, &T) -> Ordering) {
    if v.len() <= 1 {
        return;
    }
    let mid = v.len() / 2;
    merge_sort_by(&mut v[..mid], cmp);
    merge_sort_by(&mut v[mid..], cmp);
    let (left, right) = (v[..mid].to_vec(), v[mid..].to_vec());
    let (mut i, mut j) = (0, 0);
    for slot in v.iter_mut() {
        let take_right =
            j < right.len() && (i >= left.len() || cmp(&right[j], &left[i]) == Ordering::Less);
        if take_right {
            *slot = right[j].clone();
            j += 1;
        } else {
            *slot = left[i].clone();
            i += 1;
        }
    }
}

/// Sorts pods into removal order (stable; exact ties keep their order).
pub fn sort(pods: &mut [RankedPod]) {
    merge_sort_by(pods, &compare);
}
