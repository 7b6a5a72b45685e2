//! The scheduler's view of a node for `make-room`: each pod's requests as
//! `component-helpers`' `PodRequests` (v0.36) computes them (containers summed, sidecars added,
//! the largest init container step, pod-level requests, overhead; for pods already on the node
//! each container's and sidecar's larger of spec and status resources, as in-place resize
//! does), the node's allocatable as
//! `NodeInfo.SetNode` reads it, candidates and PodDisruptionBudgets as preemption reads them.
//! All sums are exact quantities read once ([`super::quantity`]).
//!
//! Invariants: a quantity that does not parse in an API object is logged and left out (the API
//! server validated it, so it does not happen); in a file given to `--for-pod` it is an error
//! naming the field ([`BadQuantity`]).

use super::preempt::{Budget, Candidate, Req};
use super::quantity::{Quantity, QuantityError, ResourceList, Resources, add_list, max_list};
use k8s_openapi::api::core::v1::{Container, ContainerStatus, Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use std::collections::BTreeMap;

/// A quantity in a pod that is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {value:?} is not a quantity: {error}")]
pub struct BadQuantity {
    /// Where it is, e.g. `spec.containers[app].resources.requests.cpu`.
    pub field: String,
    pub value: String,
    pub error: QuantityError,
}

type QList = BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>;

fn parse_list(list: Option<&QList>, field: &str) -> Result<ResourceList, BadQuantity> {
    let mut out = ResourceList::new();
    for (k, q) in list.into_iter().flatten() {
        let v = Quantity::parse(&q.0).map_err(|error| BadQuantity {
            field: format!("{field}.{k}"),
            value: q.0.clone(),
            error,
        })?;
        out.insert(k.clone(), v);
    }
    Ok(out)
}

/// `IsPodResizeInfeasible`: the first `PodResizePending` condition's reason is `Infeasible`.
fn resize_infeasible(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "PodResizePending"))
        .is_some_and(|c| c.reason.as_deref() == Some("Infeasible"))
}

/// `max(a, b...)`: per resource, the largest (a missing list is empty).
fn max_of(first: ResourceList, rest: &[ResourceList]) -> ResourceList {
    let mut out = first;
    for r in rest {
        max_list(&mut out, r);
    }
    out
}

/// `determineEffectiveRequests`: the larger of spec, actuated and allocated; when the resize is
/// infeasible, of actuated and allocated only.
fn effective(
    infeasible: bool,
    spec: ResourceList,
    actuated: ResourceList,
    allocated: ResourceList,
) -> ResourceList {
    if infeasible {
        max_of(actuated, &[allocated])
    } else {
        max_of(spec, &[actuated, allocated])
    }
}

/// A container's requests: its spec's, or, with status resources and a status that reports
/// them (`cs.Resources != nil`), the effective ones.
fn container_requests(
    pod: &Pod,
    c: &Container,
    status: Option<&ContainerStatus>,
    field: &str,
) -> Result<ResourceList, BadQuantity> {
    let spec = parse_list(
        c.resources.as_ref().and_then(|r| r.requests.as_ref()),
        field,
    )?;
    let Some((cs, res)) = status.and_then(|cs| cs.resources.as_ref().map(|r| (cs, r))) else {
        return Ok(spec);
    };
    let actuated = parse_list(res.requests.as_ref(), &format!("{field}(status.resources)"))?;
    let allocated = parse_list(
        cs.allocated_resources.as_ref(),
        &format!("{field}(status.allocatedResources)"),
    )?;
    Ok(effective(resize_infeasible(pod), spec, actuated, allocated))
}

/// `AggregateContainerRequests`: containers summed; each sidecar (a restartable init
/// container) added to them and to the sidecars' running sum; an init container's step is its
/// own requests plus the sidecars before it; the larger of the sum and the largest step. With
/// `use_status`, containers and sidecars whose status reports resources count their effective
/// requests (ordinary init containers never do).
fn aggregate(pod: &Pod, use_status: bool) -> Result<ResourceList, BadQuantity> {
    let Some(spec) = pod.spec.as_ref() else {
        return Ok(ResourceList::new());
    };
    let statuses: BTreeMap<&str, &ContainerStatus> = if use_status {
        let st = pod.status.as_ref();
        st.and_then(|s| s.container_statuses.as_ref())
            .into_iter()
            .flatten()
            .chain(
                st.and_then(|s| s.init_container_statuses.as_ref())
                    .into_iter()
                    .flatten(),
            )
            .map(|cs| (cs.name.as_str(), cs))
            .collect()
    } else {
        BTreeMap::new()
    };
    let mut result = ResourceList::new();
    for c in &spec.containers {
        let field = format!("spec.containers[{}].resources.requests", c.name);
        let st = statuses.get(c.name.as_str()).copied();
        add_list(&mut result, &container_requests(pod, c, st, &field)?);
    }
    let mut restartable = ResourceList::new();
    let mut init_max = ResourceList::new();
    for c in spec.init_containers.iter().flatten() {
        let field = format!("spec.initContainers[{}].resources.requests", c.name);
        let sidecar = c.restart_policy.as_deref() == Some("Always");
        let st = statuses.get(c.name.as_str()).copied().filter(|_| sidecar);
        let r = container_requests(pod, c, st, &field)?;
        let step = if sidecar {
            add_list(&mut result, &r);
            add_list(&mut restartable, &r);
            restartable.clone()
        } else {
            let mut u = r;
            add_list(&mut u, &restartable);
            u
        };
        max_list(&mut init_max, &step);
    }
    max_list(&mut result, &init_max);
    Ok(result)
}

/// `IsSupportedPodLevelResource`: CPU, memory and hugepages.
fn pod_level_resource(name: &str) -> bool {
    name == "cpu" || name == "memory" || name.starts_with("hugepages-")
}

/// `PodRequests`: what the pod requests. `on_node`: a pod already on the node, read with
/// status resources (`UseStatusResources`, in-place resize, GA in 1.35; for pod-level
/// resources `InPlacePodLevelResourcesVerticalScaling`, on by default in 1.36).
pub fn pod_requests(pod: &Pod, on_node: bool) -> Result<ResourceList, BadQuantity> {
    let mut reqs = aggregate(pod, on_node)?;
    let spec = pod.spec.as_ref();
    // pod-level requests replace the containers' for the resources they may set
    let pod_level = parse_list(
        spec.and_then(|s| s.resources.as_ref())
            .and_then(|r| r.requests.as_ref()),
        "spec.resources.requests",
    )?;
    if pod_level.keys().any(|k| pod_level_resource(k)) {
        let status = pod.status.as_ref().filter(|_| on_node);
        let effective_reqs = match status.and_then(|s| s.resources.as_ref()) {
            Some(res) => Some(effective(
                resize_infeasible(pod),
                pod_level.clone(),
                parse_list(res.requests.as_ref(), "status.resources.requests")?,
                parse_list(
                    status.and_then(|s| s.allocated_resources.as_ref()),
                    "status.allocatedResources",
                )?,
            )),
            None => None,
        };
        for (k, q) in pod_level.into_iter().filter(|(k, _)| pod_level_resource(k)) {
            // a resource the effective list lacks reads as zero there, as a Go map does
            let v = match &effective_reqs {
                Some(e) => e.get(&k).cloned().unwrap_or_default(),
                None => q,
            };
            reqs.insert(k, v);
        }
    }
    add_list(
        &mut reqs,
        &parse_list(spec.and_then(|s| s.overhead.as_ref()), "spec.overhead")?,
    );
    Ok(reqs)
}

/// What the scheduler counts for a pod on the node; a quantity that does not parse is logged
/// and counted as nothing.
pub fn on_node_requests(pod: &Pod) -> Resources {
    match pod_requests(pod, true) {
        Ok(l) => Resources::from_list(&l),
        Err(e) => {
            tracing::warn!(pod = %super::pods::key(pod), error = %e, "malformed quantity; its requests count as 0");
            Resources::default()
        }
    }
}

/// The node's allocatable as the scheduler reads it (a missing `pods` is 0).
pub fn allocatable(node: &Node) -> Resources {
    let list = node.status.as_ref().and_then(|s| s.allocatable.as_ref());
    match parse_list(list, "status.allocatable") {
        Ok(l) => Resources::from_list(&l),
        Err(e) => {
            tracing::warn!(error = %e, "malformed node allocatable; it counts as 0");
            Resources::default()
        }
    }
}

/// A pod on the node as preemption reads it, with the plan's one `now` for a pod not started.
pub fn candidate(pod: &Pod, now: jiff::Timestamp) -> Candidate {
    let start = pod.status.as_ref().and_then(|s| s.start_time.as_ref());
    Candidate {
        uid: pod.metadata.uid.clone().unwrap_or_default(),
        name: pod.metadata.name.clone().unwrap_or_default(),
        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        labels: pod.metadata.labels.clone().unwrap_or_default(),
        priority: pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0),
        started: start.map_or(now, |t| t.0).as_nanosecond(),
        has_started: start.is_some(),
        requests: on_node_requests(pod),
        evictable: !crate::pod::is_mirror(pod),
        terminating: pod.metadata.deletion_timestamp.is_some(),
    }
}

/// A label selector as requirements (`LabelSelectorAsSelector`); `None` when it is invalid.
pub fn selector(s: &LabelSelector) -> Option<Vec<Req>> {
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
            _ => return None,
        });
    }
    Some(reqs)
}

pub fn budget(pdb: &PodDisruptionBudget) -> Budget {
    let spec = pdb.spec.as_ref();
    // a nil, empty or invalid selector selects nothing here (preemption's `selector.Empty()`)
    let selector = spec
        .and_then(|s| s.selector.as_ref())
        .and_then(selector)
        .filter(|r| !r.is_empty());
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
