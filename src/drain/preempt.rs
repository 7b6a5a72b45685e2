//! The scheduler's preemption victim selection on one node (`selectVictimsOnNode`,
//! `pkg/scheduler/framework/preemption` and `defaultpreemption`), for `reaplet make-room`: the
//! smallest damage that frees what a pod of priority P needs. Pure.
//!
//! 1. only pods of lower priority than P are candidates; all of them are removed, and if the
//!    request does not fit even then, there is no plan. Fitting is `NodeResourcesFit`'s
//!    `fitsRequest`: the pod count always; CPU, memory, ephemeral storage and each scalar
//!    resource only when the pod requests more than 0 of it, against allocatable minus the
//!    requests of the pods left (exact integers: millicores and whole units, as the scheduler
//!    reads quantities);
//! 2. the candidates are ordered most important first (higher priority; equal priority: the
//!    earlier started, a pod not started yet counting as started now), and split into those
//!    whose eviction would violate a PodDisruptionBudget (`filterPodsWithPDBViolation`: each
//!    budget's `disruptionsAllowed` decremented per pod it selects, in that order, pods already
//!    in its `disruptedPods` not counted, a pod without labels selected by none; below zero
//!    violates) and the rest;
//! 3. each is reprieved in turn, the violating ones first: added back, and kept when the request
//!    still fits; otherwise it is a victim.
//!
//! Pods already terminating still hold their requests (the scheduler's cache keeps them until
//! they are gone) and may be victims (nothing more is sent for them). One deliberate difference:
//! a mirror pod is never a victim (deleting it frees nothing; the kubelet makes it again).

use super::quantity::Resources;
use std::collections::BTreeMap;

/// A pod on the node, as preemption reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    pub uid: String,
    /// The pod's name (a budget's `disruptedPods` is keyed by it).
    pub name: String,
    pub namespace: String,
    pub labels: BTreeMap<String, String>,
    pub priority: i32,
    /// `status.startTime` in ns since the epoch; a pod not started yet has the plan's "now"
    /// (`GetPodStartTime`).
    pub started: i128,
    /// Whether it has a `status.startTime` at all.
    pub has_started: bool,
    /// Its requests as the scheduler counts them.
    pub requests: Resources,
    /// May be a victim (a mirror pod may not).
    pub evictable: bool,
    /// Already being deleted: a victim needs no request.
    pub terminating: bool,
}

/// One requirement of a budget's label selector.
#[derive(Debug, Clone, PartialEq)]
pub enum Req {
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

impl Req {
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        match self {
            Req::In(k, v) => labels.get(k).is_some_and(|l| v.contains(l)),
            Req::NotIn(k, v) => labels.get(k).is_none_or(|l| !v.contains(l)),
            Req::Exists(k) => labels.contains_key(k),
            Req::DoesNotExist(k) => !labels.contains_key(k),
        }
    }
}

/// A PodDisruptionBudget, as preemption reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct Budget {
    pub name: String,
    pub namespace: String,
    /// `None`: selects nothing (a nil, empty or invalid selector, as preemption reads it).
    pub selector: Option<Vec<Req>>,
    pub disruptions_allowed: i32,
    pub disrupted: Vec<String>,
}

impl Budget {
    fn selects(&self, c: &Candidate) -> bool {
        // a pod without labels matches no budget (preemption does not even look)
        !c.labels.is_empty()
            && c.namespace == self.namespace
            && self
                .selector
                .as_ref()
                .is_some_and(|s| s.iter().all(|r| r.matches(&c.labels)))
    }
}

/// Why a pod is a victim.
#[derive(Debug, Clone, PartialEq)]
pub struct Victim {
    pub pod: Candidate,
    /// The budgets its eviction violates (empty: none).
    pub violates: Vec<String>,
}

/// A resource as `fitsRequest` checks it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resource {
    /// Pod slots (always checked).
    Pods,
    /// In millicores.
    Cpu,
    Memory,
    EphemeralStorage,
    /// An extended resource, hugepages, ... by name.
    Scalar(String),
}

impl Resource {
    pub fn name(&self) -> &str {
        match self {
            Self::Pods => "pods",
            Self::Cpu => "cpu",
            Self::Memory => "memory",
            Self::EphemeralStorage => "ephemeral-storage",
            Self::Scalar(n) => n,
        }
    }
}

/// What a resource lacks: the request is larger than allocatable minus what the pods left
/// request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shortfall {
    pub resource: Resource,
    pub requested: i64,
    /// What the pods that would stay request (for `pods`: how many there are).
    pub used: i64,
    pub allocatable: i64,
}

impl Shortfall {
    /// By how much the request is too large.
    pub fn short(&self) -> i64 {
        self.requested
            .saturating_add(self.used)
            .saturating_sub(self.allocatable)
    }
}

/// The plan, or why there is none.
#[derive(Debug, Clone, PartialEq)]
pub enum Plan {
    /// Evict these (most important first); the request fits after.
    Victims(Vec<Victim>),
    /// The request fits without evicting anything.
    FitsAlready,
    /// It does not fit even with every lower-priority pod gone.
    Impossible { short: Vec<Shortfall> },
}

/// `fitsRequest`: what `request` lacks beside `pods` on a node with `allocatable` (empty: it
/// fits).
pub fn shortfalls(
    request: &Resources,
    pods: &[&Candidate],
    allocatable: &Resources,
) -> Vec<Shortfall> {
    let mut out = Vec::new();
    let n = pods.len() as i64;
    if n + 1 > allocatable.pods {
        out.push(Shortfall {
            resource: Resource::Pods,
            requested: 1,
            used: n,
            allocatable: allocatable.pods,
        });
    }
    if request.is_zero() {
        return out;
    }
    let used = pods
        .iter()
        .fold(Resources::default(), |acc, p| acc.plus(&p.requests));
    let mut check = |resource: Resource, req: i64, used: i64, alloc: i64| {
        if req > 0 && req > alloc.saturating_sub(used) {
            out.push(Shortfall {
                resource,
                requested: req,
                used,
                allocatable: alloc,
            });
        }
    };
    check(
        Resource::Cpu,
        request.milli_cpu,
        used.milli_cpu,
        allocatable.milli_cpu,
    );
    check(
        Resource::Memory,
        request.memory,
        used.memory,
        allocatable.memory,
    );
    check(
        Resource::EphemeralStorage,
        request.ephemeral_storage,
        used.ephemeral_storage,
        allocatable.ephemeral_storage,
    );
    for (name, &req) in &request.scalar {
        check(
            Resource::Scalar(name.clone()),
            req,
            used.scalar.get(name).copied().unwrap_or(0),
            allocatable.scalar.get(name).copied().unwrap_or(0),
        );
    }
    out
}

fn fits(request: &Resources, pods: &[&Candidate], allocatable: &Resources) -> bool {
    shortfalls(request, pods, allocatable).is_empty()
}

/// `MoreImportantPod` as an order (most important first), ties by UID.
fn more_important_first(a: &Candidate, b: &Candidate) -> std::cmp::Ordering {
    b.priority
        .cmp(&a.priority)
        .then(a.started.cmp(&b.started))
        .then(a.uid.cmp(&b.uid))
}

/// Victim selection for a pod of `priority` requesting `request`, on a node with
/// `allocatable` and `pods`, under `budgets`.
pub fn select(
    request: &Resources,
    priority: i32,
    allocatable: &Resources,
    pods: &[Candidate],
    budgets: &[Budget],
) -> Plan {
    let all: Vec<&Candidate> = pods.iter().collect();
    if fits(request, &all, allocatable) {
        return Plan::FitsAlready;
    }
    let (mut candidates, mut remaining): (Vec<&Candidate>, Vec<&Candidate>) = pods
        .iter()
        .partition(|p| p.priority < priority && p.evictable);
    let short = shortfalls(request, &remaining, allocatable);
    if candidates.is_empty() || !short.is_empty() {
        return Plan::Impossible { short };
    }
    candidates.sort_by(|a, b| more_important_first(a, b));
    // which would violate a budget, in that order
    let mut allowed: Vec<i32> = budgets.iter().map(|b| b.disruptions_allowed).collect();
    let mut violating: Vec<(&Candidate, Vec<String>)> = Vec::new();
    let mut others: Vec<&Candidate> = Vec::new();
    for c in candidates {
        let mut violates = Vec::new();
        for (i, b) in budgets.iter().enumerate() {
            if !b.selects(c) || b.disrupted.contains(&c.name) {
                continue;
            }
            allowed[i] = allowed[i].saturating_sub(1);
            if allowed[i] < 0 {
                violates.push(b.name.clone());
            }
        }
        if violates.is_empty() {
            others.push(c);
        } else {
            violating.push((c, violates));
        }
    }
    let mut victims = Vec::new();
    fn reprieve<'a>(
        c: &'a Candidate,
        remaining: &mut Vec<&'a Candidate>,
        request: &Resources,
        allocatable: &Resources,
    ) -> bool {
        remaining.push(c);
        if fits(request, remaining, allocatable) {
            true
        } else {
            remaining.pop();
            false
        }
    }
    for (c, violates) in violating {
        if !reprieve(c, &mut remaining, request, allocatable) {
            victims.push(Victim {
                pod: c.clone(),
                violates,
            });
        }
    }
    for c in others {
        if !reprieve(c, &mut remaining, request, allocatable) {
            victims.push(Victim {
                pod: c.clone(),
                violates: Vec::new(),
            });
        }
    }
    // most important first, as the scheduler reports them
    victims.sort_by(|a, b| more_important_first(&a.pod, &b.pod));
    Plan::Victims(victims)
}
