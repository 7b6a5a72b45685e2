//! API objects read into what the drain plan and preemption need: owners, priorities, readiness
//! and restarts, requests (`resource.Quantity`), a node's allocatable.

use super::plan::DrainPod;
use super::preempt::{Budget, Candidate, Req, Resources};
use super::rank::RankedPod;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use std::collections::BTreeMap;

/// A `resource.Quantity` in milli-units (`500m` = 500, `2` = 2000, `1Ki` = 1,024,000); `None`
/// when it is not one.
pub fn milli(q: &str) -> Option<i64> {
    let q = q.trim();
    let split = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(q.len());
    let (num, suffix) = q.split_at(split);
    let n: f64 = num.parse().ok()?;
    let mult: f64 = match suffix {
        "" => 1.0,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0_f64.powi(3),
        "Ti" => 1024.0_f64.powi(4),
        "Pi" => 1024.0_f64.powi(5),
        "Ei" => 1024.0_f64.powi(6),
        s if s.starts_with(['e', 'E']) => 10f64.powi(s[1..].parse().ok()?),
        _ => return None,
    };
    let v = (n * mult * 1000.0).ceil();
    (v.is_finite() && v.abs() < 9.2e18).then_some(v as i64)
}

/// Seconds from `t` to `now`, in the API's whole seconds (two pods with the same timestamp
/// tie exactly, as `metav1.Time.Equal` does).
fn secs_since(
    t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
    now: jiff::Timestamp,
) -> f64 {
    (now.as_second() - t.0.as_second()) as f64
}

fn ready(pod: &Pod, now: jiff::Timestamp) -> (bool, Option<f64>) {
    let c = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"));
    match c {
        Some(c) if c.status == "True" => (
            true,
            c.last_transition_time.as_ref().map(|t| secs_since(t, now)),
        ),
        _ => (false, None),
    }
}

/// The controller owner as `Kind/name`.
pub fn owner(pod: &Pod) -> Option<String> {
    pod.metadata
        .owner_references
        .as_ref()?
        .iter()
        .find(|o| o.controller == Some(true))
        .map(|o| format!("{}/{}", o.kind, o.name))
}

pub fn key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

/// The ranking's view; `colocated` is filled by [`drain_pods`].
fn ranked(pod: &Pod, now: jiff::Timestamp) -> RankedPod {
    let (is_ready, ready_for) = ready(pod, now);
    let status = pod.status.as_ref();
    RankedPod {
        uid: pod.metadata.uid.clone().unwrap_or_default(),
        assigned: pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .is_some_and(|n| !n.is_empty()),
        phase: status
            .and_then(|s| s.phase.clone())
            .unwrap_or_else(|| "Pending".into()),
        ready: is_ready,
        ready_for,
        deletion_cost: pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("controller.kubernetes.io/pod-deletion-cost"))
            .and_then(|v| v.parse::<i32>().ok())
            .unwrap_or(0),
        colocated: 0,
        restarts: status
            .and_then(|s| s.container_statuses.as_ref())
            .map_or(0, |cs| {
                cs.iter().map(|c| c.restart_count).max().unwrap_or(0)
            }),
        age: pod
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| secs_since(t, now)),
    }
}

/// The node's pods as drain sees them (with each owner's count on the node).
pub fn drain_pods(pods: &[Pod]) -> Vec<DrainPod> {
    // one "now" for every pod: their times compare as the controller's do
    let now = jiff::Timestamp::now();
    let mut per_owner: BTreeMap<String, u32> = BTreeMap::new();
    for p in pods {
        let active = p.metadata.deletion_timestamp.is_none()
            && !matches!(
                p.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Succeeded" | "Failed")
            );
        if let Some(o) = owner(p).filter(|_| active) {
            *per_owner.entry(o).or_default() += 1;
        }
    }
    pods.iter()
        .map(|p| {
            let o = owner(p);
            let mut rank = ranked(p, now);
            rank.colocated = o
                .as_ref()
                .map_or(1, |o| per_owner.get(o).copied().unwrap_or(0));
            let annotations = p.metadata.annotations.clone().unwrap_or_default();
            DrainPod {
                key: key(p),
                uid: p.metadata.uid.clone().unwrap_or_default(),
                priority: p.spec.as_ref().and_then(|s| s.priority).unwrap_or(0),
                daemonset: o.as_deref().is_some_and(|o| o.starts_with("DaemonSet/")),
                owner: o,
                mirror: annotations.contains_key("kubernetes.io/config.mirror"),
                has_empty_dir: p
                    .spec
                    .as_ref()
                    .and_then(|s| s.volumes.as_ref())
                    .is_some_and(|v| v.iter().any(|v| v.empty_dir.is_some())),
                terminating: p.metadata.deletion_timestamp.is_some(),
                terminal: matches!(
                    p.status.as_ref().and_then(|s| s.phase.as_deref()),
                    Some("Succeeded" | "Failed")
                ),
                rank,
            }
        })
        .collect()
}

fn requests_of(list: &[k8s_openapi::api::core::v1::Container]) -> (i64, i64) {
    list.iter().fold((0, 0), |(c, m), k| {
        let r = k.resources.as_ref().and_then(|r| r.requests.as_ref());
        let get = |n: &str| {
            r.and_then(|r| r.get(n))
                .and_then(|q| milli(&q.0))
                .unwrap_or(0)
        };
        (c + get("cpu"), m + get("memory") / 1000)
    })
}

/// A pod's requests as the scheduler counts them: the containers' sum, or the largest init
/// container's if larger (sidecars among the init containers count with the containers).
pub fn requests(pod: &Pod) -> Resources {
    let Some(spec) = pod.spec.as_ref() else {
        return Resources {
            pods: 1,
            ..Resources::default()
        };
    };
    let inits = spec.init_containers.clone().unwrap_or_default();
    let (sidecars, plain): (Vec<_>, Vec<_>) = inits
        .into_iter()
        .partition(|c| c.restart_policy.as_deref() == Some("Always"));
    let (mut cpu, mut mem) = requests_of(&spec.containers);
    let (sc, sm) = requests_of(&sidecars);
    cpu += sc;
    mem += sm;
    for c in &plain {
        let (ic, im) = requests_of(std::slice::from_ref(c));
        cpu = cpu.max(ic + sc);
        mem = mem.max(im + sm);
    }
    Resources {
        cpu_milli: cpu,
        memory: mem,
        pods: 1,
    }
}

pub fn allocatable(node: &Node) -> Resources {
    let a = node.status.as_ref().and_then(|s| s.allocatable.as_ref());
    let get = |n: &str| a.and_then(|a| a.get(n)).and_then(|q| milli(&q.0));
    Resources {
        cpu_milli: get("cpu").unwrap_or(0),
        memory: get("memory").unwrap_or(0) / 1000,
        pods: get("pods").unwrap_or(110_000) / 1000,
    }
}

pub fn candidate(pod: &Pod) -> Candidate {
    let now = jiff::Timestamp::now();
    Candidate {
        uid: pod.metadata.uid.clone().unwrap_or_default(),
        key: pod.metadata.name.clone().unwrap_or_default(),
        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        labels: pod.metadata.labels.clone().unwrap_or_default(),
        priority: pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0),
        started_ago: pod
            .status
            .as_ref()
            .and_then(|s| s.start_time.as_ref())
            .map_or(0.0, |t| secs_since(t, now)),
        requests: requests(pod),
        evictable: !pod
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key("kubernetes.io/config.mirror")),
    }
}

pub fn budget(pdb: &PodDisruptionBudget) -> Budget {
    let spec = pdb.spec.as_ref();
    let selector = spec.and_then(|s| s.selector.as_ref()).and_then(|s| {
        let mut reqs: Vec<Req> = s
            .match_labels
            .iter()
            .flatten()
            .map(|(k, v)| Req::In(k.clone(), vec![v.clone()]))
            .collect();
        for e in s.match_expressions.iter().flatten() {
            let values = e.values.clone().unwrap_or_default();
            reqs.push(match e.operator.as_str() {
                "In" if !values.is_empty() => Req::In(e.key.clone(), values),
                "NotIn" if !values.is_empty() => Req::NotIn(e.key.clone(), values),
                "Exists" if values.is_empty() => Req::Exists(e.key.clone()),
                "DoesNotExist" if values.is_empty() => Req::DoesNotExist(e.key.clone()),
                // an invalid selector selects nothing
                _ => return None,
            });
        }
        // an empty selector selects nothing here (preemption's `selector.Empty()`)
        (!reqs.is_empty()).then_some(reqs)
    });
    let status = pdb.status.as_ref();
    Budget {
        name: pdb.metadata.name.clone().unwrap_or_default(),
        namespace: pdb.metadata.namespace.clone().unwrap_or_default(),
        selector,
        disruptions_allowed: status.and_then(|s| s.disruptions_allowed).unwrap_or(0),
        disrupted: status
            .and_then(|s| s.disrupted_pods.as_ref())
            .map(|d| d.keys().cloned().collect())
            .unwrap_or_default(),
    }
}
