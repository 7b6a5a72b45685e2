//! API objects read into what the drain plan needs: owners, priorities, and the ReplicaSet
//! controller's ranking inputs (`ActivePodsWithRanks`, `getPodsRankedByRelatedPodsOnSameNode`,
//! `podReadyTime`, `maxContainerRestarts`, `GetDeletionCostFromPodAnnotations`).
//!
//! Invariants: every time is measured from the plan's one "now" at full precision (the
//! controller's `metav1.Now()`), never truncated; only active pods (not terminal, not being
//! deleted) count as related; a malformed annotation reads as the controller reads it (0).

use super::plan::DrainPod;
use super::rank::{Phase, RankedPod};
use super::requests::selector;
use crate::pod::{is_mirror, is_terminal};
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::collections::{BTreeMap, BTreeSet};

/// Nanoseconds from `t` to `now` (Go's `now.Sub(t)`: full precision, saturating).
fn since(t: &Time, now: jiff::Timestamp) -> i64 {
    let d = now.as_nanosecond() - t.0.as_nanosecond();
    d.clamp(i64::MIN as i128, i64::MAX as i128) as i64
}

/// `IsPodReady` (the first Ready condition is True) and, when ready, since when.
fn ready(pod: &Pod, now: jiff::Timestamp) -> (bool, Option<i64>) {
    let c = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"));
    match c {
        Some(c) if c.status == "True" => {
            (true, c.last_transition_time.as_ref().map(|t| since(t, now)))
        }
        _ => (false, None),
    }
}

/// `GetDeletionCostFromPodAnnotations`, its error read as 0: an optional `-`, then `0` alone
/// or a number not starting with 0, within int32.
pub fn deletion_cost(v: &str) -> i32 {
    let first_ok = match v.as_bytes().first() {
        Some(b'-') => true,
        Some(b'0') => v == "0",
        Some(c) => (b'1'..=b'9').contains(c),
        None => false,
    };
    if !first_ok {
        return 0;
    }
    v.parse::<i32>().unwrap_or(0)
}

/// The highest restart count of the containers, then of the sidecars (`maxContainerRestarts`).
fn restarts(pod: &Pod) -> (i32, i32) {
    let status = pod.status.as_ref();
    let regular = status
        .and_then(|s| s.container_statuses.as_ref())
        .map_or(0, |cs| {
            cs.iter().map(|c| c.restart_count).max().unwrap_or(0)
        });
    let sidecars: BTreeSet<&str> = pod
        .spec
        .as_ref()
        .and_then(|s| s.init_containers.as_ref())
        .into_iter()
        .flatten()
        .filter(|c| c.restart_policy.as_deref() == Some("Always"))
        .map(|c| c.name.as_str())
        .collect();
    let sidecar = status
        .and_then(|s| s.init_container_statuses.as_ref())
        .map_or(0, |cs| {
            cs.iter()
                .filter(|c| sidecars.contains(c.name.as_str()))
                .map(|c| c.restart_count)
                .max()
                .unwrap_or(0)
        });
    (regular, sidecar)
}

/// The controller owner as `Kind/name`.
pub fn owner(pod: &Pod) -> Option<String> {
    controller(pod).map(|o| format!("{}/{}", o.kind, o.name))
}

pub fn controller(
    pod: &Pod,
) -> Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference> {
    pod.metadata
        .owner_references
        .as_ref()?
        .iter()
        .find(|o| o.controller == Some(true))
}

pub fn key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

/// `IsPodActive`: not terminal, not being deleted.
fn active(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none() && !is_terminal(pod)
}

/// The ranking's view; `colocated` is filled by [`drain_pods_at`].
fn ranked(pod: &Pod, now: jiff::Timestamp) -> RankedPod {
    let (is_ready, ready_for) = ready(pod, now);
    let (restarts, sidecar_restarts) = restarts(pod);
    RankedPod {
        uid: pod.metadata.uid.clone().unwrap_or_default(),
        assigned: pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .is_some_and(|n| !n.is_empty()),
        phase: Phase::from_api(pod.status.as_ref().and_then(|s| s.phase.as_deref())),
        ready: is_ready,
        ready_for,
        deletion_cost: pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("controller.kubernetes.io/pod-deletion-cost"))
            .map_or(0, |v| deletion_cost(v)),
        colocated: 0,
        restarts,
        sidecar_restarts,
        age: pod
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| since(t, now)),
    }
}

/// The controller's rank of each pod (`getPodsRankedByRelatedPodsOnSameNode`): for a pod of a
/// ReplicaSet that has a controller (a Deployment), how many active pods on its node match the
/// selector of any ReplicaSet of that controller; a ReplicaSet without one ranks its pods 0.
/// A pod of another controller counts its owner's active pods on the node (drain's own rule;
/// the ReplicaSet controller never ranks those).
fn colocated(pods: &[Pod], replicasets: &[ReplicaSet]) -> Vec<u32> {
    let rs_key = |ns: &str, name: &str| (ns.to_string(), name.to_string());
    let by_name: BTreeMap<(String, String), &ReplicaSet> = replicasets
        .iter()
        .map(|r| {
            (
                rs_key(
                    r.metadata.namespace.as_deref().unwrap_or_default(),
                    r.metadata.name.as_deref().unwrap_or_default(),
                ),
                r,
            )
        })
        .collect();
    let rs_controller = |r: &ReplicaSet| {
        r.metadata
            .owner_references
            .as_ref()
            .and_then(|o| o.iter().find(|o| o.controller == Some(true)))
            .map(|o| o.uid.clone())
    };
    let mut per_owner: BTreeMap<String, u32> = BTreeMap::new();
    for p in pods.iter().filter(|p| active(p)) {
        if let Some(o) = owner(p) {
            *per_owner.entry(o).or_default() += 1;
        }
    }
    // the count depends only on (namespace, Deployment, node): each is counted once
    let mut counted: BTreeMap<(String, String, Option<String>), u32> = BTreeMap::new();
    let no_labels = BTreeMap::new();
    pods.iter()
        .map(|p| {
            let ns = p.metadata.namespace.as_deref().unwrap_or_default();
            let Some(c) = controller(p) else { return 1 };
            if c.kind != "ReplicaSet" {
                return per_owner
                    .get(&format!("{}/{}", c.kind, c.name))
                    .copied()
                    .unwrap_or(0);
            }
            let Some(rs) = by_name.get(&rs_key(ns, &c.name)) else {
                return 0;
            };
            let Some(top) = rs_controller(rs) else {
                return 0;
            };
            let node = p.spec.as_ref().and_then(|s| s.node_name.clone());
            *counted
                .entry((ns.to_string(), top.clone(), node.clone()))
                .or_insert_with(|| {
                    let related: Vec<Vec<super::preempt::Req>> = replicasets
                        .iter()
                        .filter(|r| r.metadata.namespace.as_deref() == Some(ns))
                        .filter(|r| rs_controller(r).as_ref() == Some(&top))
                        .filter_map(|r| r.spec.as_ref().and_then(|s| selector(&s.selector)))
                        .collect();
                    pods.iter()
                        .filter(|q| active(q) && q.metadata.namespace.as_deref() == Some(ns))
                        .filter(|q| q.spec.as_ref().and_then(|s| s.node_name.clone()) == node)
                        .filter(|q| {
                            let labels = q.metadata.labels.as_ref().unwrap_or(&no_labels);
                            related
                                .iter()
                                .any(|sel| sel.iter().all(|r| r.matches(labels)))
                        })
                        .count() as u32
                })
        })
        .collect()
}

/// The node's pods as drain sees them, ranked against `replicasets` at `now` (one "now" for
/// every pod: their times compare as the controller's do).
pub fn drain_pods_at(
    pods: &[Pod],
    replicasets: &[ReplicaSet],
    now: jiff::Timestamp,
) -> Vec<DrainPod> {
    let ranks = colocated(pods, replicasets);
    pods.iter()
        .zip(ranks)
        .map(|(p, colocated)| {
            let o = owner(p);
            let mut rank = ranked(p, now);
            rank.colocated = colocated;
            DrainPod {
                key: key(p),
                uid: p.metadata.uid.clone().unwrap_or_default(),
                priority: p.spec.as_ref().and_then(|s| s.priority).unwrap_or(0),
                daemonset: controller(p).is_some_and(|c| c.kind == "DaemonSet"),
                owner: o,
                mirror: is_mirror(p),
                has_empty_dir: p
                    .spec
                    .as_ref()
                    .and_then(|s| s.volumes.as_ref())
                    .is_some_and(|v| v.iter().any(|v| v.empty_dir.is_some())),
                terminating: p.metadata.deletion_timestamp.is_some(),
                terminal: is_terminal(p),
                rank,
            }
        })
        .collect()
}
