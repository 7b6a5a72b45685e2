//! The scheduler's preemption victim selection on one node (`selectVictimsOnNode`,
//! `pkg/scheduler/framework/preemption` and `defaultpreemption`), for `reaplet make-room`: the
//! smallest damage that frees what a pod of priority P needs. Pure.
//!
//! 1. only pods of lower priority than P are candidates; all of them are removed, and if the
//!    request does not fit even then (allocatable minus the requests of the pods left), there is
//!    no plan;
//! 2. the candidates are ordered most important first (higher priority; equal priority: the
//!    earlier started), and split into those whose eviction would violate a
//!    PodDisruptionBudget (`filterPodsWithPDBViolation`: each budget's `disruptionsAllowed`
//!    decremented per pod it selects, in that order, pods already in its `disruptedPods`
//!    not counted; below zero violates) and the rest;
//! 3. each is reprieved in turn, the violating ones first: added back, and kept when the request
//!    still fits; otherwise it is a victim.

use std::collections::BTreeMap;

/// Resources: CPU in millicores, memory in bytes, pods.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Resources {
    pub cpu_milli: i64,
    pub memory: i64,
    pub pods: i64,
}

impl Resources {
    fn add(self, o: Resources) -> Resources {
        Resources {
            cpu_milli: self.cpu_milli + o.cpu_milli,
            memory: self.memory + o.memory,
            pods: self.pods + o.pods,
        }
    }

    fn fits_in(self, cap: Resources) -> bool {
        self.cpu_milli <= cap.cpu_milli && self.memory <= cap.memory && self.pods <= cap.pods
    }
}

/// A pod on the node, as preemption reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    pub uid: String,
    pub key: String,
    pub namespace: String,
    pub labels: BTreeMap<String, String>,
    pub priority: i32,
    /// Seconds since it started (`status.startTime`); earlier started = larger.
    pub started_ago: f64,
    /// Its requests (`pods` is 1).
    pub requests: Resources,
    /// May be a victim (a mirror pod may not: evicting it frees nothing, the kubelet makes it
    /// again).
    pub evictable: bool,
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
    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
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
        c.namespace == self.namespace
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

/// The plan, or why there is none.
#[derive(Debug, Clone, PartialEq)]
pub enum Plan {
    /// Evict these (most important first); the request fits after.
    Victims(Vec<Victim>),
    /// The request fits without evicting anything.
    FitsAlready,
    /// It does not fit even with every lower-priority pod gone.
    Impossible { short: Resources },
}

/// Whether `request` fits beside `pods` in `allocatable`.
fn fits(request: Resources, pods: &[&Candidate], allocatable: Resources) -> bool {
    pods.iter()
        .fold(request, |acc, p| acc.add(p.requests))
        .fits_in(allocatable)
}

/// Victim selection for a pod of `priority` requesting `request`, on a node with
/// `allocatable` and `pods`, under `budgets`.
pub fn select(
    request: Resources,
    priority: i32,
    allocatable: Resources,
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
    if !fits(request, &remaining, allocatable) {
        let used = remaining.iter().fold(request, |acc, p| acc.add(p.requests));
        return Plan::Impossible {
            short: Resources {
                cpu_milli: (used.cpu_milli - allocatable.cpu_milli).max(0),
                memory: (used.memory - allocatable.memory).max(0),
                pods: (used.pods - allocatable.pods).max(0),
            },
        };
    }
    // most important first: higher priority, then started earlier
    candidates.sort_by(|a, b| {
        b.priority
            .cmp(&a.priority)
            .then(b.started_ago.total_cmp(&a.started_ago))
            .then(a.uid.cmp(&b.uid))
    });
    // which would violate a budget, in that order
    let mut allowed: Vec<i32> = budgets.iter().map(|b| b.disruptions_allowed).collect();
    let mut violating: Vec<(&Candidate, Vec<String>)> = Vec::new();
    let mut others: Vec<&Candidate> = Vec::new();
    for c in candidates {
        let mut violates = Vec::new();
        for (i, b) in budgets.iter().enumerate() {
            if !b.selects(c) || b.disrupted.contains(&c.key) {
                continue;
            }
            allowed[i] -= 1;
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
        request: Resources,
        allocatable: Resources,
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
    victims.sort_by(|a, b| {
        b.pod
            .priority
            .cmp(&a.pod.priority)
            .then(b.pod.started_ago.total_cmp(&a.pod.started_ago))
            .then(a.pod.uid.cmp(&b.pod.uid))
    });
    Plan::Victims(victims)
}
