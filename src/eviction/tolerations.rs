//! Taints and tolerations as the NoExecute taint manager reads them: `ToleratesTaint`
//! (`k8s.io/api/core/v1/toleration.go`), `GetMatchingTolerations` (`v1helper`) and
//! `getMinTolerationTime` (`pkg/controller/tainteviction`). Pure functions.

use k8s_openapi::api::core::v1::{Taint, Toleration};
use std::time::Duration;

/// The effect that evicts running pods.
pub const NO_EXECUTE: &str = "NoExecute";

/// Whether `t` tolerates `taint`: an empty effect matches every effect, an empty key every key
/// (meaningful with `Exists`, which tolerates everything then); `Exists` ignores the value,
/// `Equal` (or no operator) compares it; any other operator tolerates nothing.
pub fn tolerates(t: &Toleration, taint: &Taint) -> bool {
    fn set(s: &Option<String>) -> Option<&str> {
        s.as_deref().filter(|s| !s.is_empty())
    }
    if set(&t.effect).is_some_and(|e| e != taint.effect) {
        return false;
    }
    if set(&t.key).is_some_and(|k| k != taint.key) {
        return false;
    }
    match t.operator.as_deref().unwrap_or("") {
        "" | "Equal" => t.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or(""),
        "Exists" => true,
        _ => false,
    }
}

/// The NoExecute taints among `taints`.
pub fn no_execute(taints: &[Taint]) -> Vec<&Taint> {
    taints.iter().filter(|t| t.effect == NO_EXECUTE).collect()
}

/// What a pod's tolerations say about a set of NoExecute taints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// No taint at all: nothing to do (a scheduled eviction is cancelled).
    Untainted,
    /// A taint is not tolerated: evict at once.
    EvictNow,
    /// Every taint is tolerated, the shortest `tolerationSeconds` among the tolerations used is
    /// this (zero or negative seconds: at once).
    EvictAfter(Duration),
    /// Every taint is tolerated, none of the tolerations used has `tolerationSeconds`.
    Forever,
}

/// For each taint the first toleration that tolerates it is the one used (as
/// `GetMatchingTolerations`); the shortest `tolerationSeconds` among those decides.
pub fn verdict(tolerations: &[Toleration], taints: &[&Taint]) -> Verdict {
    if taints.is_empty() {
        return Verdict::Untainted;
    }
    let mut min: Option<i64> = None;
    for taint in taints {
        let Some(used) = tolerations.iter().find(|t| tolerates(t, taint)) else {
            return Verdict::EvictNow;
        };
        if let Some(s) = used.toleration_seconds {
            min = Some(min.map_or(s, |m| m.min(s)));
        }
    }
    match min {
        None => Verdict::Forever,
        Some(s) if s <= 0 => Verdict::EvictAfter(Duration::ZERO),
        Some(s) => Verdict::EvictAfter(Duration::from_secs(s as u64)),
    }
}

/// Whether two sets of NoExecute taints are the same (order does not matter; `timeAdded` is
/// not part of a taint's identity).
pub fn same_taints(a: &[&Taint], b: &[&Taint]) -> bool {
    let key = |t: &&Taint| {
        (
            t.key.clone(),
            t.value.clone().unwrap_or_default(),
            t.effect.clone(),
        )
    };
    let mut a: Vec<_> = a.iter().map(key).collect();
    let mut b: Vec<_> = b.iter().map(key).collect();
    a.sort();
    b.sort();
    a == b
}
