//! The NoExecute taint manager for this node, as data: the controller manager's
//! `tainteviction` controller (`handleNodeUpdate`, `handlePodUpdate`, `processPodOnNode`) with
//! its timed eviction queue, as one state and pure transitions over the monotonic clock. The
//! runner ([`super::runner`]) feeds it the Node's taints and the pods, and carries out what it
//! decides.
//!
//! Invariants:
//! * only NoExecute taints count; a Node update that changes none of them decides nothing;
//! * a pod that does not tolerate every NoExecute taint is evicted at once; one that tolerates
//!   them all is evicted at the start of the taint situation plus the shortest
//!   `tolerationSeconds` among the tolerations used (none set: never, and a scheduled eviction
//!   is cancelled). The start is the newest NoExecute taint's `timeAdded` (when reaplet first
//!   saw it, when absent), and a pod already scheduled keeps its earliest start;
//! * a timer is cancelled when the taints go, when the pod's tolerations change so that it
//!   tolerates them for good, or when the pod leaves; one timer per pod UID;
//! * mirror and static pods are never scheduled: reported once instead.

use super::tolerations::{self, Verdict};
use crate::pod::PodUid;
use k8s_openapi::api::core::v1::{Taint, Toleration};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;
use tokio::time::Instant;

/// What the taint manager knows of a pod.
#[derive(Debug, Clone, PartialEq)]
pub struct PodFacts {
    pub uid: PodUid,
    /// `namespace/name`.
    pub key: String,
    pub tolerations: Vec<Toleration>,
    /// A mirror or static pod: never evicted by a taint (reported).
    pub exempt: bool,
}

/// A NoExecute taint and when it was added, on the monotonic clock (the runner converts
/// `timeAdded` at the API edge; `None`: not set).
#[derive(Debug, Clone, PartialEq)]
pub struct TaintAt {
    pub taint: Taint,
    pub added: Option<Instant>,
}

/// What the runner must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Evict the pod at `at` (now or later); replaces any earlier schedule of it.
    Schedule { uid: PodUid, at: Instant },
    /// A scheduled eviction is off.
    Cancel { uid: PodUid },
    /// A mirror or static pod that the taints would evict: reported, never evicted.
    Exempt { uid: PodUid },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Timer {
    start: Instant,
    fire: Instant,
}

/// The taint manager's state for this node.
#[derive(Debug, Default)]
pub struct TaintManager {
    /// The node's NoExecute taints.
    taints: Vec<Taint>,
    /// When each taint (key, value) was first seen, for those without `timeAdded`.
    first_seen: BTreeMap<(String, String), Instant>,
    /// When the current set of taints was complete.
    since: Option<Instant>,
    pods: HashMap<PodUid, PodFacts>,
    timers: HashMap<PodUid, Timer>,
    exempt_reported: HashSet<PodUid>,
}

impl TaintManager {
    pub fn new() -> Self {
        Self::default()
    }

    /// The node's taints changed (all of them, any effect). Decides only when the NoExecute
    /// ones did.
    pub fn node(&mut self, taints: &[TaintAt], now: Instant) -> Vec<Action> {
        let mine: Vec<&TaintAt> = taints
            .iter()
            .filter(|t| t.taint.effect == tolerations::NO_EXECUTE)
            .collect();
        let new: Vec<&Taint> = mine.iter().map(|t| &t.taint).collect();
        let old: Vec<&Taint> = self.taints.iter().collect();
        if tolerations::same_taints(&new, &old) && self.since.is_some() != new.is_empty() {
            return Vec::new();
        }
        let id = |t: &Taint| (t.key.clone(), t.value.clone().unwrap_or_default());
        self.first_seen
            .retain(|k, _| mine.iter().any(|t| id(&t.taint) == *k));
        let mut since: Option<Instant> = None;
        for t in &mine {
            let seen = *self.first_seen.entry(id(&t.taint)).or_insert(now);
            let added = t.added.map_or(seen, |a| a.min(now));
            since = Some(since.map_or(added, |s| s.max(added)));
        }
        self.taints = mine.iter().map(|t| t.taint.clone()).collect();
        self.since = since;
        let uids: Vec<PodUid> = self.pods.keys().cloned().collect();
        let mut out = Vec::new();
        for uid in uids {
            out.extend(self.process(&uid, now));
        }
        out
    }

    /// A pod of this node appeared or changed.
    pub fn pod(&mut self, pod: PodFacts, now: Instant) -> Vec<Action> {
        let uid = pod.uid.clone();
        if self.pods.get(&uid) == Some(&pod) {
            return Vec::new();
        }
        self.pods.insert(uid.clone(), pod);
        self.process(&uid, now)
    }

    /// A pod left the node (deleted, or terminal).
    pub fn pod_gone(&mut self, uid: &PodUid) -> Vec<Action> {
        self.pods.remove(uid);
        self.exempt_reported.remove(uid);
        match self.timers.remove(uid) {
            Some(_) => vec![Action::Cancel { uid: uid.clone() }],
            None => Vec::new(),
        }
    }

    /// The eviction of `uid` was carried out (its timer is spent).
    pub fn fired(&mut self, uid: &PodUid) {
        self.timers.remove(uid);
    }

    /// Pending evictions, soonest first: (uid, when).
    pub fn pending(&self) -> Vec<(PodUid, Instant)> {
        let mut v: Vec<(PodUid, Instant)> = self
            .timers
            .iter()
            .map(|(u, t)| (u.clone(), t.fire))
            .collect();
        v.sort_by_key(|(u, at)| (*at, u.clone()));
        v
    }

    pub fn facts(&self, uid: &PodUid) -> Option<&PodFacts> {
        self.pods.get(uid)
    }

    fn process(&mut self, uid: &PodUid, now: Instant) -> Vec<Action> {
        let Some(pod) = self.pods.get(uid) else {
            return Vec::new();
        };
        let taints: Vec<&Taint> = self.taints.iter().collect();
        let verdict = tolerations::verdict(&pod.tolerations, &taints);
        let cancel = |timers: &mut HashMap<PodUid, Timer>| match timers.remove(uid) {
            Some(_) => vec![Action::Cancel { uid: uid.clone() }],
            None => Vec::new(),
        };
        let after = match verdict {
            Verdict::Untainted | Verdict::Forever => return cancel(&mut self.timers),
            Verdict::EvictNow => Duration::ZERO,
            Verdict::EvictAfter(d) => d,
        };
        if pod.exempt {
            let mut out = cancel(&mut self.timers);
            if self.exempt_reported.insert(uid.clone()) {
                out.push(Action::Exempt { uid: uid.clone() });
            }
            return out;
        }
        let situation = self.since.unwrap_or(now);
        let timer = if verdict == Verdict::EvictNow {
            Timer {
                start: now,
                fire: now,
            }
        } else {
            let start = self
                .timers
                .get(uid)
                .map_or(situation, |t| t.start.min(situation));
            Timer {
                start,
                fire: start + after,
            }
        };
        if self.timers.get(uid).is_some_and(|t| t.fire == timer.fire) {
            return Vec::new();
        }
        self.timers.insert(uid.clone(), timer);
        vec![Action::Schedule {
            uid: uid.clone(),
            at: timer.fire,
        }]
    }
}
