//! The NoExecute taint manager for this node, as data: the controller manager's
//! `tainteviction` controller (`handleNodeUpdate`, `handlePodUpdate`, `processPodOnNode`) with
//! its timed eviction queue, as one state and pure transitions over the monotonic clock. The
//! runner ([`super::runner`]) feeds it the Node's taints and the pods, and carries out what it
//! decides.
//!
//! Invariants:
//! * only NoExecute taints count; a Node update that changes none of them decides nothing;
//! * a pod that does not tolerate every NoExecute taint is evicted at once; one that tolerates
//!   them all is evicted at the earliest of, for each taint, its start plus the
//!   `tolerationSeconds` of the toleration used for it (the first that matches; zero or less:
//!   at once; none set on any: never, and a scheduled eviction is cancelled). A taint's start is
//!   its `timeAdded` (when reaplet first saw it, when absent), or when reaplet first saw the pod
//!   if that is later (a pod scheduled onto a node tainted hours ago gets its whole toleration,
//!   as the controller manager gives it); a pod already scheduled keeps its earliest time;
//!   a time past the clock's range is never;
//! * a timer is cancelled when the taints go, when the pod's tolerations change so that it
//!   tolerates them for good, or when the pod leaves; one timer per pod UID;
//! * mirror and static pods are never scheduled: reported once instead.

use super::tolerations;
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
    /// When reaplet first saw the pod.
    pub seen: Instant,
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
    fire: Instant,
}

/// The taint manager's state for this node.
#[derive(Debug, Default)]
pub struct TaintManager {
    /// The node's NoExecute taints, each with its start.
    taints: Vec<(Taint, Instant)>,
    /// When each taint (key, value) was first seen, for those without `timeAdded`.
    first_seen: BTreeMap<(String, String), Instant>,
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
        let old: Vec<&Taint> = self.taints.iter().map(|(t, _)| t).collect();
        if tolerations::same_taints(&new, &old) {
            return Vec::new();
        }
        let id = |t: &Taint| (t.key.clone(), t.value.clone().unwrap_or_default());
        self.first_seen
            .retain(|k, _| mine.iter().any(|t| id(&t.taint) == *k));
        let mut starts = Vec::new();
        for t in &mine {
            let seen = *self.first_seen.entry(id(&t.taint)).or_insert(now);
            starts.push((t.taint.clone(), t.added.map_or(seen, |a| a.min(now))));
        }
        self.taints = starts;
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

    fn process(&mut self, uid: &PodUid, now: Instant) -> Vec<Action> {
        let Some(pod) = self.pods.get(uid) else {
            return Vec::new();
        };
        let cancel = |timers: &mut HashMap<PodUid, Timer>| match timers.remove(uid) {
            Some(_) => vec![Action::Cancel { uid: uid.clone() }],
            None => Vec::new(),
        };
        if self.taints.is_empty() {
            return cancel(&mut self.timers);
        }
        // for each taint, the toleration used for it (the first that matches)
        let mut fire: Option<Instant> = None;
        for (taint, start) in &self.taints {
            let Some(used) = pod
                .tolerations
                .iter()
                .find(|t| tolerations::tolerates(t, taint))
            else {
                fire = Some(now);
                break;
            };
            let Some(secs) = used.toleration_seconds else {
                continue;
            };
            let at = if secs <= 0 {
                Some(now)
            } else {
                (*start)
                    .max(pod.seen)
                    .checked_add(Duration::from_secs(secs as u64))
            };
            if let Some(at) = at {
                fire = Some(fire.map_or(at, |f| f.min(at)));
            }
        }
        let Some(fire) = fire else {
            // tolerated for good (or beyond the clock's range)
            return cancel(&mut self.timers);
        };
        if pod.exempt {
            let mut out = cancel(&mut self.timers);
            if self.exempt_reported.insert(uid.clone()) {
                out.push(Action::Exempt { uid: uid.clone() });
            }
            return out;
        }
        let fire = self.timers.get(uid).map_or(fire, |t| t.fire.min(fire));
        if self.timers.get(uid).is_some_and(|t| t.fire == fire) {
            return Vec::new();
        }
        self.timers.insert(uid.clone(), Timer { fire });
        vec![Action::Schedule {
            uid: uid.clone(),
            at: fire,
        }]
    }
}
