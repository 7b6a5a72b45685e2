//! Required node affinity, checked while pods run: the scheduler's `nodeSelector` and
//! `requiredDuringSchedulingIgnoredDuringExecution` matching
//! (`k8s.io/component-helpers/scheduling/corev1/nodeaffinity`), applied after scheduling, when
//! this node's labels change; and the settle timers that turn a mismatch into an eviction.
//! Pure functions and state over the monotonic clock.
//!
//! Invariants:
//! * `nodeSelector` entries must all equal the node's labels; the required terms are ORed, the
//!   expressions and fields within a term ANDed; a term with neither matches nothing, and so
//!   does a term with an invalid requirement (the scheduler's matcher turns it into an error
//!   that fails the term);
//! * `In`/`NotIn` need values, `Exists`/`DoesNotExist` none; `Gt`/`Lt` exactly one integer,
//!   compared with the label's integer value (a label that is no integer does not match);
//!   `matchFields` only on `metadata.name`, with `In`/`NotIn` and exactly one value;
//! * a pod becomes due `settle` after it was first seen not matching; matching again before
//!   that (a label flapping back) cancels.

use crate::pod::PodUid;
use k8s_openapi::api::core::v1::{NodeSelectorRequirement, NodeSelectorTerm, PodSpec};
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;
use tokio::time::Instant;

/// The node as the matcher sees it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeFacts {
    pub name: String,
    pub labels: BTreeMap<String, String>,
}

/// One requirement on labels; `None`: the requirement is invalid.
fn label_requirement(
    r: &NodeSelectorRequirement,
    labels: &BTreeMap<String, String>,
) -> Option<bool> {
    let values = r.values.as_deref().unwrap_or_default();
    let label = labels.get(&r.key);
    let int = |s: &str| s.parse::<i64>().ok();
    match r.operator.as_str() {
        "In" if !values.is_empty() => Some(label.is_some_and(|l| values.contains(l))),
        "NotIn" if !values.is_empty() => Some(label.is_none_or(|l| !values.contains(l))),
        "Exists" if values.is_empty() => Some(label.is_some()),
        "DoesNotExist" if values.is_empty() => Some(label.is_none()),
        op @ ("Gt" | "Lt") if values.len() == 1 => {
            let bound = int(&values[0])?;
            Some(
                label
                    .and_then(|l| int(l))
                    .is_some_and(|v| if op == "Gt" { v > bound } else { v < bound }),
            )
        }
        _ => None,
    }
}

/// One requirement on fields (`metadata.name` only); `None`: invalid.
fn field_requirement(r: &NodeSelectorRequirement, name: &str) -> Option<bool> {
    let values = r.values.as_deref().unwrap_or_default();
    if r.key != "metadata.name" || values.len() != 1 {
        return None;
    }
    match r.operator.as_str() {
        "In" => Some(values[0] == name),
        "NotIn" => Some(values[0] != name),
        _ => None,
    }
}

/// Whether a node selector term matches (every requirement; an empty term never does).
pub fn term_matches(term: &NodeSelectorTerm, node: &NodeFacts) -> bool {
    let exprs = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    if exprs.is_empty() && fields.is_empty() {
        return false;
    }
    exprs
        .iter()
        .all(|r| label_requirement(r, &node.labels) == Some(true))
        && fields
            .iter()
            .all(|r| field_requirement(r, &node.name) == Some(true))
}

/// Whether the pod may run on the node by its `nodeSelector` and required node affinity.
pub fn pod_matches(spec: &PodSpec, node: &NodeFacts) -> bool {
    let selector_ok = spec
        .node_selector
        .as_ref()
        .is_none_or(|sel| sel.iter().all(|(k, v)| node.labels.get(k) == Some(v)));
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|na| {
            na.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    let affinity_ok = required.is_none_or(|sel| {
        sel.node_selector_terms
            .iter()
            .any(|t| term_matches(t, node))
    });
    selector_ok && affinity_ok
}

/// Pods that stopped matching, each due for eviction once the mismatch has lasted `settle`.
#[derive(Debug)]
pub struct Settling {
    settle: Duration,
    since: HashMap<PodUid, Instant>,
}

impl Settling {
    pub fn new(settle: Duration) -> Self {
        Settling {
            settle,
            since: HashMap::new(),
        }
    }

    /// The pod's current match; returns when it is due, if it is not matching.
    pub fn observe(&mut self, uid: &PodUid, matches: bool, now: Instant) -> Option<Instant> {
        if matches {
            self.since.remove(uid);
            return None;
        }
        let since = *self.since.entry(uid.clone()).or_insert(now);
        Some(since + self.settle)
    }

    /// Whether the pod is settling (not matching, not yet evicted).
    pub fn contains(&self, uid: &PodUid) -> bool {
        self.since.contains_key(uid)
    }

    /// When the pod becomes due, if it is settling.
    pub fn due_at(&self, uid: &PodUid) -> Option<Instant> {
        self.since.get(uid).map(|s| *s + self.settle)
    }

    /// Every settling pod.
    pub fn all(&self) -> Vec<PodUid> {
        let mut v: Vec<PodUid> = self.since.keys().cloned().collect();
        v.sort();
        v
    }

    pub fn forget(&mut self, uid: &PodUid) {
        self.since.remove(uid);
    }

    /// Pods due at `now`.
    pub fn due(&self, now: Instant) -> Vec<PodUid> {
        let mut v: Vec<PodUid> = self
            .since
            .iter()
            .filter(|(_, s)| **s + self.settle <= now)
            .map(|(u, _)| u.clone())
            .collect();
        v.sort();
        v
    }

    /// The soonest a pod becomes due.
    pub fn next(&self) -> Option<Instant> {
        self.since.values().map(|s| *s + self.settle).min()
    }
}
