//! Which pod a node-pressure eviction ends first, and what it tells the pod (kubelet
//! counterpart: `pkg/kubelet/eviction/helpers.go`: `rankMemoryPressure`, `rankPIDPressure`
//! with their comparators `exceedMemoryRequests`, `priority`, `memory`, `process`, and
//! `evictionMessage`; `pkg/kubelet/types/pod_update.go: IsCriticalPod`;
//! `pkg/api/v1/resource/helpers.go: GetResourceRequestQuantity`).
//!
//! * [`candidate`]: what ranking and the message need from an API pod (its memory request as
//!   the kubelet computes it, its priority, whether it is critical); the caller adds the
//!   pod's usage ([`PodStats`]) from the pod's cgroups;
//! * [`rank_memory`], [`rank_pids`]: the kubelet's orderings;
//! * [`eviction_message`]: the status message, event text and event annotations.
//!
//! Invariants, the kubelet's:
//! * memory ranking is, in order of keys: a pod without stats first; then a pod whose
//!   **pod-level** working set (missing: 0) is strictly above its memory request; then the
//!   lower priority; then the larger usage minus request. PID ranking: the lower priority,
//!   then a pod without stats, then more processes;
//! * the memory request is `PodRequests` for memory without overhead (containers summed,
//!   sidecars added, the largest init container step; only the pod-level request when the
//!   pod sets pod-level resources), plus `spec.overhead` memory only when that is not zero;
//!   spec values (the kubelet's allocated pod: a caller that knows an allocation differing
//!   from the spec passes the pod with it);
//! * a critical pod (static, mirror, or priority at least 2,000,000,000) is ranked like any
//!   other; the caller skips it when killing;
//! * the message is upstream's byte for byte: usages in canonical binary form (`679132Ki`,
//!   `1k` for 1000 bytes, plain digits otherwise), requests as the API quantity prints itself;
//!   containers are blamed only for memory, in the order of the stats, each matched by name
//!   to a container or init container (never an ephemeral one); a pod without stats gets no
//!   more than the node's part and no annotations.
//!
//! Where the kubelet is not deterministic (ties keep the order of its pod map, random; Go's
//! `sort.Sort` is stable only up to 12 pods), reaplet keeps tied pods in the caller's order
//! (a stable sort). Where reaplet is coarser: a memory request with a fraction of a byte
//! (legal, the API server warns) counts as its whole bytes below; the test "usage above the
//! request" stays exact, only the order of two pods whose usage minus request tie within
//! that fraction can differ.

use crate::drain::quantity::Quantity;
use crate::drain::requests::{BadQuantity, pod_requests};
use crate::pod::{PodError, PodUid};
use k8s_openapi::api::core::v1::{Pod, PodSpec};
use std::cmp::{Ordering, Reverse};
use std::collections::BTreeMap;

#[cfg(test)]
#[path = "rank_tests.rs"]
mod tests;

/// The event annotation naming the containers blamed (`OffendingContainersKey`).
pub const OFFENDING_CONTAINERS: &str = "offending_containers";
/// Their usages, in the same order (`OffendingContainersUsageKey`).
pub const OFFENDING_CONTAINERS_USAGE: &str = "offending_containers_usage";
/// The pod blamed for its pod-level request (`OffendingPodKey`).
pub const OFFENDING_POD: &str = "offending_pod";
/// Its usage (`OffendingPodUsageKey`).
pub const OFFENDING_POD_USAGE: &str = "offending_pod_usage";
/// The resource the node ran short of (`StarvedResourceKey`).
pub const STARVED_RESOURCE: &str = "starved_resource";

/// A pod's usage as the kubelet's summary reports it for ranking.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodStats {
    /// The pod-level working set (bytes); `None`: the summary has no pod-level memory
    /// figure, which ranking reads as 0.
    pub working_set: Option<u64>,
    /// Processes in the pod's containers; `None` reads as 0.
    pub processes: Option<u64>,
    /// Container name → its working set (bytes), in the summary's order. A container without
    /// a working-set figure is left out (it is never blamed).
    pub containers: Vec<(String, u64)>,
}

/// A pod as ranking and the eviction message read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub uid: PodUid,
    pub namespace: String,
    pub name: String,
    /// `spec.priority`, 0 when unset (`PodPriority`).
    pub priority: i32,
    /// Never evicted (`IsCriticalPod`): see [`is_critical`].
    pub critical: bool,
    /// Bytes (`GetResourceRequestQuantity(pod, memory)`): see the module documentation; a
    /// fractional byte count is rounded down.
    pub memory_request: i64,
    /// Each container, then each init container: its name and its memory request as the
    /// object writes it (for the message).
    pub container_requests: Vec<(String, Option<String>)>,
    /// `spec.resources.requests.memory` as written (the pod then sets pod-level resources).
    pub pod_level_memory_request: Option<String>,
    /// `None`: the summary has no entry for the pod.
    pub stats: Option<PodStats>,
}

/// Why an API pod is not a [`Candidate`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CandidateError {
    #[error(transparent)]
    Pod(#[from] PodError),
    #[error("pod {pod}: {error}")]
    Quantity { pod: String, error: BadQuantity },
}

/// What an eviction tells: the status and event message, and the event's annotations.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EvictionMessage {
    pub message: String,
    pub annotations: BTreeMap<String, String>,
}

/// `scheduling.SystemCriticalPriority`.
const SYSTEM_CRITICAL_PRIORITY: i32 = crate::shutdown::SYSTEM_CRITICAL_PRIORITY;

/// `IsCriticalPod`: a static pod (`kubernetes.io/config.source` present and not `api`), a
/// mirror pod, or one whose `spec.priority` is at least 2,000,000,000.
pub fn is_critical(pod: &Pod) -> bool {
    crate::pod::is_mirror_or_static(pod)
        || pod
            .spec
            .as_ref()
            .and_then(|s| s.priority)
            .is_some_and(|p| p >= SYSTEM_CRITICAL_PRIORITY)
}

/// `IsSupportedPodLevelResource`.
fn pod_level_resource(name: &str) -> bool {
    name == "cpu" || name == "memory" || name.starts_with("hugepages-")
}

/// `IsPodLevelResourcesSet`: pod-level requests or limits name a resource that may be set
/// there.
fn pod_level_resources_set(spec: &PodSpec) -> bool {
    spec.resources.as_ref().is_some_and(|r| {
        r.requests
            .iter()
            .chain(r.limits.iter())
            .flat_map(|l| l.keys())
            .any(|k| pod_level_resource(k))
    })
}

fn parse_at(text: &str, field: &str) -> Result<Quantity, BadQuantity> {
    Quantity::parse(text).map_err(|error| BadQuantity {
        field: field.to_owned(),
        value: text.to_owned(),
        error,
    })
}

/// `GetResourceRequestQuantity(pod, memory)`, exact.
fn memory_request(pod: &Pod) -> Result<Quantity, BadQuantity> {
    let Some(spec) = pod.spec.as_ref() else {
        return Ok(Quantity::default());
    };
    let mut total = if pod_level_resources_set(spec) {
        // container-level requests are skipped; only the pod-level ones count
        match spec
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get("memory"))
        {
            Some(q) => parse_at(&q.0, "spec.resources.requests.memory")?,
            None => Quantity::default(),
        }
    } else {
        // overhead is left out here and added below only to a non-zero request
        let without_overhead = Pod {
            spec: Some(PodSpec {
                overhead: None,
                ..spec.clone()
            }),
            ..Pod::default()
        };
        pod_requests(&without_overhead, false)?
            .remove("memory")
            .unwrap_or_default()
    };
    if !total.is_zero()
        && let Some(o) = spec.overhead.as_ref().and_then(|o| o.get("memory"))
    {
        total.add(&parse_at(&o.0, "spec.overhead.memory")?);
    }
    Ok(total)
}

/// The largest whole number of bytes not above `q`.
fn floor_bytes(q: &Quantity) -> i64 {
    let up = q.value();
    match Quantity::parse(&up.to_string()) {
        Ok(v) if v.cmp_value(q) == Ordering::Greater => up - 1,
        _ => up,
    }
}

/// Everything but the stats of an API pod. A missing or invalid UID, or a quantity that
/// does not parse (the API server validated them, so neither happens), is an error.
pub fn candidate(pod: &Pod) -> Result<Candidate, CandidateError> {
    let meta = &pod.metadata;
    let namespace = meta.namespace.clone().unwrap_or_else(|| "default".into());
    let name = meta.name.clone().unwrap_or_default();
    let key = format!("{namespace}/{name}");
    let raw_uid = meta.uid.as_deref().ok_or_else(|| PodError::Missing {
        pod: key.clone(),
        field: "metadata.uid",
    })?;
    let uid = PodUid::parse(raw_uid).map_err(|why| PodError::InvalidUid {
        pod: key.clone(),
        uid: raw_uid.chars().take(80).collect(),
        why,
    })?;
    let request = memory_request(pod).map_err(|error| CandidateError::Quantity {
        pod: key.clone(),
        error,
    })?;
    let spec = pod.spec.as_ref();
    let memory_of = |r: Option<&k8s_openapi::api::core::v1::ResourceRequirements>| {
        r.and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get("memory"))
            .map(|q| q.0.clone())
    };
    let container_requests = spec
        .into_iter()
        .flat_map(|s| {
            s.containers
                .iter()
                .chain(s.init_containers.iter().flatten())
        })
        .map(|c| (c.name.clone(), memory_of(c.resources.as_ref())))
        .collect();
    Ok(Candidate {
        uid,
        namespace,
        name,
        priority: spec.and_then(|s| s.priority).unwrap_or(0),
        critical: is_critical(pod),
        memory_request: floor_bytes(&request),
        container_requests,
        pod_level_memory_request: memory_of(spec.and_then(|s| s.resources.as_ref())),
        stats: None,
    })
}

/// The sort key of `rankMemoryPressure`: without stats first (those then by priority
/// alone), then exceeding the request, then lower priority, then larger usage minus request.
fn memory_key(c: &Candidate) -> (bool, bool, i32, Reverse<i128>) {
    match &c.stats {
        None => (false, false, c.priority, Reverse(0)),
        Some(s) => {
            // the summary's unsigned figure read as int64, as the kubelet does
            let usage = i128::from(s.working_set.unwrap_or(0) as i64);
            let request = i128::from(c.memory_request);
            (true, usage <= request, c.priority, Reverse(usage - request))
        }
    }
}

/// `rankMemoryPressure`: orders `c` for eviction under memory pressure (both memory
/// signals). Stable: tied pods keep their order.
pub fn rank_memory(c: &mut [Candidate]) {
    c.sort_by_key(memory_key);
}

/// `rankPIDPressure`: lower priority first, then pods without stats, then more processes.
/// Stable: tied pods keep their order. (Upstream subtracts the unsigned counts and reads the
/// difference as signed, which orders the same for any count below 2^63.)
pub fn rank_pids(c: &mut [Candidate]) {
    c.sort_by_key(|c| {
        let processes = c.stats.as_ref().map(|s| s.processes.unwrap_or(0));
        (
            c.priority,
            processes.is_some(),
            Reverse(processes.unwrap_or(0)),
        )
    });
}

/// `evictionMessage` for `resource` (`memory` or `pids`). `threshold`: the acted-on
/// threshold's quantity as text and the signal's available amount (bytes or PIDs), when it
/// has an observation.
pub fn eviction_message(
    resource: &str,
    c: &Candidate,
    threshold: Option<(String, i64)>,
) -> EvictionMessage {
    let mut message = format!("The node was low on resource: {resource}. ");
    if let Some((quantity, available)) = threshold {
        message.push_str(&format!(
            "Threshold quantity: {quantity}, available: {}. ",
            format_binary(available)
        ));
    }
    let Some(stats) = &c.stats else {
        return EvictionMessage {
            message,
            annotations: BTreeMap::new(),
        };
    };
    let mut annotations = BTreeMap::new();
    if resource == "memory"
        && let (Some(request), Some(ws)) = (&c.pod_level_memory_request, stats.working_set)
    {
        let usage = format_binary(ws as i64);
        message.push_str(&format!(
            "Pod {} was using {usage}, request is {}, has larger consumption of memory. ",
            c.name,
            canonical(request)
        ));
        annotations.insert(OFFENDING_POD.to_owned(), c.name.clone());
        annotations.insert(OFFENDING_POD_USAGE.to_owned(), usage);
    }
    let mut blamed: Vec<&str> = Vec::new();
    let mut usages: Vec<String> = Vec::new();
    // only memory has a per-container usage here (upstream also blames for
    // ephemeral-storage, which reaplet does not evaluate)
    if resource == "memory" {
        for (name, ws) in &stats.containers {
            let Some((_, request)) = c.container_requests.iter().find(|(n, _)| n == name) else {
                continue;
            };
            let usage = *ws as i64;
            let (request_value, request_text) = match request {
                Some(t) => (Quantity::parse(t).unwrap_or_default(), canonical(t)),
                None => (Quantity::default(), "0".to_owned()),
            };
            let above = Quantity::parse(&usage.to_string())
                .is_ok_and(|u| u.cmp_value(&request_value) == Ordering::Greater);
            if above {
                let usage = format_binary(usage);
                message.push_str(&format!(
                    "Container {name} was using {usage}, request is {request_text}, has larger consumption of {resource}. "
                ));
                blamed.push(name);
                usages.push(usage);
            }
        }
    }
    annotations.insert(OFFENDING_CONTAINERS.to_owned(), blamed.join(","));
    annotations.insert(OFFENDING_CONTAINERS_USAGE.to_owned(), usages.join(","));
    annotations.insert(STARVED_RESOURCE.to_owned(), resource.to_owned());
    EvictionMessage {
        message,
        annotations,
    }
}

/// `NewQuantity(v, BinarySI).String()`.
fn format_binary(v: i64) -> String {
    super::quantity_text::format_bytes_binary(v)
}

/// `ParseQuantity(text).String()`; text that is not a quantity (never in a validated object)
/// is returned as it is.
fn canonical(text: &str) -> String {
    // the crate's parser decides what is a quantity and bounds the exponent
    if Quantity::parse(text).is_err() {
        return text.to_owned();
    }
    super::quantity_text::quantity_string(text)
}
