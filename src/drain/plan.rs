//! What `reaplet drain` does with each pod of the node, and in what order: `kubectl drain`'s
//! filters (`k8s.io/kubectl/pkg/drain/filters.go`), then lower priority first, within a
//! priority the ReplicaSet controller's ranking ([`super::rank`]), in waves that take at most
//! one pod of each owner at a time, so every owner keeps as many ready replicas as long as
//! possible. Pure.

use super::rank::{self, RankedPod};
use std::collections::BTreeMap;

/// What drain reads of a pod.
#[derive(Debug, Clone, PartialEq)]
pub struct DrainPod {
    pub key: String,
    pub uid: String,
    pub priority: i32,
    /// The controller owner (`Kind/name`), if any.
    pub owner: Option<String>,
    pub daemonset: bool,
    pub mirror: bool,
    pub has_empty_dir: bool,
    /// Succeeded or Failed: deleted without an eviction matter (kubectl still evicts them).
    pub terminal: bool,
    /// Already being deleted (`deletionTimestamp`): waited for, never evicted again.
    pub terminating: bool,
    pub rank: RankedPod,
}

/// Why a pod is left out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// Its DaemonSet would put it back: ignored (kubectl's `--ignore-daemonsets`).
    DaemonSet,
    /// A static pod's mirror: the kubelet's manifest decides it.
    Mirror,
}

impl Skip {
    pub fn name(self) -> &'static str {
        match self {
            Self::DaemonSet => "DaemonSet",
            Self::Mirror => "Mirror",
        }
    }
}

/// Why drain refuses to go on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Local storage (an `emptyDir`): `--delete-emptydir-data`.
    EmptyDir,
    /// No controller would recreate it: `--force`.
    Unmanaged,
}

impl Refusal {
    pub fn message(self) -> &'static str {
        match self {
            Self::EmptyDir => {
                "has local storage (emptyDir); its data is deleted with it (use --delete-emptydir-data)"
            }
            Self::Unmanaged => {
                "is not managed by a controller; it will not be recreated (use --force)"
            }
        }
    }
}

#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    pub delete_emptydir_data: bool,
    pub force: bool,
}

/// The drain plan.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Plan {
    pub skipped: Vec<(DrainPod, Skip)>,
    pub refused: Vec<(DrainPod, Refusal)>,
    /// Evicted wave by wave; a wave's pods together.
    pub waves: Vec<Vec<DrainPod>>,
}

pub fn plan(pods: Vec<DrainPod>, opts: Options) -> Plan {
    let mut p = Plan::default();
    let mut evict: Vec<DrainPod> = Vec::new();
    // already leaving, or finished: all at once, first (they hold no replica up)
    let mut first: Vec<DrainPod> = Vec::new();
    for pod in pods {
        if pod.mirror {
            p.skipped.push((pod, Skip::Mirror));
        } else if pod.daemonset && !pod.terminal {
            p.skipped.push((pod, Skip::DaemonSet));
        } else if pod.owner.is_none() && !pod.terminal && !opts.force {
            p.refused.push((pod, Refusal::Unmanaged));
        } else if pod.has_empty_dir && !pod.terminal && !opts.delete_emptydir_data {
            p.refused.push((pod, Refusal::EmptyDir));
        } else if pod.terminating || pod.terminal {
            first.push(pod);
        } else {
            evict.push(pod);
        }
    }
    if !first.is_empty() {
        p.waves.push(first);
    }
    // priority groups, lowest first
    let mut by_priority: BTreeMap<i32, Vec<DrainPod>> = BTreeMap::new();
    for pod in evict {
        by_priority.entry(pod.priority).or_default().push(pod);
    }
    for (_, mut group) in by_priority {
        rank::merge_sort_by(&mut group, &|a: &DrainPod, b: &DrainPod| {
            rank::compare(&a.rank, &b.rank).then(a.uid.cmp(&b.uid))
        });
        // wave k takes each owner's k-th pod (an unowned pod is its own owner)
        let mut taken: BTreeMap<String, usize> = BTreeMap::new();
        let mut waves: Vec<Vec<DrainPod>> = Vec::new();
        for pod in group {
            let owner = pod
                .owner
                .clone()
                .unwrap_or_else(|| format!("pod/{}", pod.uid));
            let k = taken.entry(owner).or_default();
            if waves.len() <= *k {
                waves.push(Vec::new());
            }
            waves[*k].push(pod);
            *k += 1;
        }
        p.waves.extend(waves);
    }
    p
}
