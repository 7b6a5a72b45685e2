//! `reaplet make-room`: free what one pod needs on this node, evicting exactly the victims the
//! scheduler's preemption would pick for it ([`super::preempt`]), through the Eviction API.
//!
//! What the pod is: a manifest (`--for-pod`), flags, or both (a flag overrides the manifest
//! resource by resource; a resource named nowhere is not requested). Its priority is resolved
//! as the Priority admission plugin would: `--priority` if given, else the pod's
//! `priorityClassName` read from the API (a missing class is an error, as admission refuses
//! such a pod), else the global default class (the lowest value if several), else 0; a
//! `spec.priority` in the manifest that disagrees is refused with admission's message.
//!
//! Every outcome is one plan: the pod's priority (and where it came from) and requests, the
//! node's allocatable and what its pods request, then either "fits already", the victims
//! (each with its priority, start time, requests and any budget its eviction violates), or
//! what the node lacks even with every lower-priority pod gone; with `-o json` the same as one
//! document on stdout, whatever the outcome.

use super::DrainError;
use super::evict::evict_waves;
use super::pods;
use super::preempt::{self, Plan, Resource, Shortfall};
use super::progress::{Output, Progress};
use super::quantity::{Quantity, ResourceList, Resources, is_scalar_resource_name};
use super::requests::{self, BadQuantity};
use super::run::{get_node, node_pods};
use crate::api;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::api::ListParams;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::io::Write;
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The pod the room is for, as the operator described it.
#[derive(Debug, Clone, Default)]
pub struct RoomSpec {
    /// A pod manifest (`--for-pod`).
    pub pod: Option<Pod>,
    /// Requests given as flags; each overrides the manifest's.
    pub requests: ResourceList,
    /// `--priority`: overrides the manifest's class and priority.
    pub priority: Option<i32>,
}

/// What `make-room` asks for.
#[derive(Debug, Clone)]
pub struct RoomArgs {
    pub node: String,
    pub spec: RoomSpec,
    pub dry_run: bool,
    pub timeout: Option<Duration>,
    pub output: Output,
}

/// Where the priority came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PriorityFrom {
    Flag,
    /// The class the pod names.
    Class(String),
    /// The pod names none: the global default class.
    GlobalDefault(String),
    /// No class named and no global default: admission's 0.
    NoDefault,
}

impl PriorityFrom {
    fn describe(&self) -> String {
        match self {
            Self::Flag => "--priority".into(),
            Self::Class(n) => format!("PriorityClass {n}, named by the pod"),
            Self::GlobalDefault(n) => format!("the global default PriorityClass {n}"),
            Self::NoDefault => "no PriorityClass named and no global default: 0".into(),
        }
    }

    fn json(&self) -> Value {
        match self {
            Self::Flag => json!({"from": "flag"}),
            Self::Class(n) => json!({"from": "priorityClassName", "class": n}),
            Self::GlobalDefault(n) => json!({"from": "globalDefault", "class": n}),
            Self::NoDefault => json!({"from": "none"}),
        }
    }
}

/// The pod's priority, requests and preemption policy, resolved.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub priority: i32,
    pub from: PriorityFrom,
    /// `preemptionPolicy: Never`: the scheduler itself would not preempt for this pod.
    pub never_preempts: bool,
    pub request: Resources,
}

/// Why the pod the room is for is refused (exit 64): what admission or validation would
/// refuse, or a request the scheduler would not read.
#[derive(Debug, thiserror::Error)]
pub enum RoomError {
    #[error("--for-pod: {0}")]
    Manifest(#[from] BadQuantity),
    #[error("{field}: {value} is negative; the API server refuses a negative request")]
    Negative { field: String, value: String },
    #[error(
        "{0}: not a resource the scheduler checks (cpu, memory, ephemeral-storage, hugepages-*, \
         an extended resource such as example.com/gpu)"
    )]
    Unchecked(String),
    #[error(
        "no PriorityClass with name {0} was found: the API server would refuse this pod \
         (--priority gives one)"
    )]
    NoClass(String),
    #[error(
        "--for-pod: the integer value of priority ({own}) must not be provided in pod spec; \
         priority admission controller computed {computed} from the given PriorityClass name \
         (--priority overrides both)"
    )]
    PriorityMismatch { own: i32, computed: i32 },
    #[error(
        "--for-pod: the string value of PreemptionPolicy ({own}) must not be provided in pod \
         spec; priority admission controller computed {computed} from the given PriorityClass \
         name"
    )]
    PolicyMismatch { own: String, computed: String },
}

/// Whether `fitsRequest` reads a resource of this name at all.
fn checked(name: &str) -> bool {
    matches!(name, "cpu" | "memory" | "ephemeral-storage") || is_scalar_resource_name(name)
}

/// Resolves what the room is for (the API is read for PriorityClasses only when needed).
pub async fn resolve(client: &kube::Client, spec: &RoomSpec) -> Result<Resolved, DrainError> {
    let pod_spec = spec.pod.as_ref().and_then(|p| p.spec.as_ref());
    let mut list = match &spec.pod {
        Some(p) => requests::pod_requests(p, false).map_err(RoomError::from)?,
        None => ResourceList::new(),
    };
    for (k, q) in &spec.requests {
        if !checked(k) {
            return Err(RoomError::Unchecked(format!("--request {k}")).into());
        }
        list.insert(k.clone(), q.clone());
    }
    for (k, q) in &list {
        if q.cmp_value(&Quantity::default()) == std::cmp::Ordering::Less {
            return Err(RoomError::Negative {
                field: format!("the request for {k}"),
                value: format!("{q:?}"),
            }
            .into());
        }
    }
    let own_policy = pod_spec.and_then(|s| s.preemption_policy.clone());
    let (priority, from, policy) = match spec.priority {
        Some(p) => (p, PriorityFrom::Flag, own_policy),
        None => {
            let classes: kube::Api<PriorityClass> = kube::Api::all(client.clone());
            let named = pod_spec
                .and_then(|s| s.priority_class_name.clone())
                .filter(|n| !n.is_empty());
            let (value, from, class_policy) = match named {
                Some(name) => match api::bounded(classes.get_opt(&name)).await? {
                    Some(c) => (
                        c.value.unwrap_or(0),
                        PriorityFrom::Class(name),
                        c.preemption_policy,
                    ),
                    None => return Err(RoomError::NoClass(name).into()),
                },
                None => {
                    let all = api::bounded(classes.list(&ListParams::default())).await?;
                    // several defaults (a race admission cannot rule out): the lowest value
                    let mut default: Option<PriorityClass> = None;
                    for c in all
                        .items
                        .into_iter()
                        .filter(|c| c.global_default == Some(true))
                    {
                        if default
                            .as_ref()
                            .is_none_or(|d| c.value.unwrap_or(0) < d.value.unwrap_or(0))
                        {
                            default = Some(c);
                        }
                    }
                    match default {
                        Some(c) => (
                            c.value.unwrap_or(0),
                            PriorityFrom::GlobalDefault(c.metadata.name.unwrap_or_default()),
                            c.preemption_policy,
                        ),
                        None => (
                            0,
                            PriorityFrom::NoDefault,
                            Some("PreemptLowerPriority".to_string()),
                        ),
                    }
                }
            };
            if let Some(own) = pod_spec.and_then(|s| s.priority)
                && own != value
            {
                return Err(RoomError::PriorityMismatch {
                    own,
                    computed: value,
                }
                .into());
            }
            // the class's policy, when it has one, is the pod's; the pod may not say otherwise
            let policy = match (class_policy, own_policy) {
                (Some(c), Some(o)) if c != o => {
                    return Err(RoomError::PolicyMismatch {
                        own: o,
                        computed: c,
                    }
                    .into());
                }
                (Some(c), _) => Some(c),
                (None, o) => o,
            };
            (value, from, policy)
        }
    };
    Ok(Resolved {
        priority,
        from,
        never_preempts: policy.as_deref() == Some("Never"),
        request: Resources::from_list(&list),
    })
}

fn amounts(r: &Resources, with_pods: bool) -> String {
    let mut v: Vec<String> = r
        .named()
        .into_iter()
        .map(|(k, x)| format!("{k} {x}"))
        .collect();
    if with_pods {
        v.push(format!("pods {}", r.pods));
    }
    if v.is_empty() {
        "nothing".into()
    } else {
        v.join(", ")
    }
}

fn amounts_json(r: &Resources) -> Value {
    let mut m = serde_json::Map::new();
    m.insert("cpu".into(), format!("{}m", r.milli_cpu).into());
    m.insert("memory".into(), r.memory.into());
    m.insert("ephemeral-storage".into(), r.ephemeral_storage.into());
    for (k, x) in &r.scalar {
        m.insert(k.clone(), (*x).into());
    }
    Value::Object(m)
}

fn shortfall_text(s: &Shortfall) -> String {
    let unit = |n: i64| match s.resource {
        Resource::Cpu => format!("{n}m"),
        _ => n.to_string(),
    };
    if s.resource == Resource::Pods {
        format!(
            "pods: {} already on a node that allows {}",
            s.used, s.allocatable
        )
    } else {
        format!(
            "{}: short by {} (requested {}, {} left of {})",
            s.resource.name(),
            unit(s.short()),
            unit(s.requested),
            unit(s.allocatable.saturating_sub(s.used)),
            unit(s.allocatable)
        )
    }
}

fn started_text(c: &preempt::Candidate) -> String {
    if c.has_started {
        format!("started {}", time_of(c.started))
    } else {
        "not started".into()
    }
}

fn time_of(ns: i128) -> String {
    jiff::Timestamp::from_nanosecond(ns)
        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_default()
}

/// `reaplet make-room`. With `-o json` every outcome is one document, an error before the
/// plan included.
pub async fn make_room(
    client: kube::Client,
    a: RoomArgs,
    cancel: CancellationToken,
    out: &mut dyn Write,
) -> Result<(), DrainError> {
    let mut p = Progress::new(out, a.output);
    let mut emitted = false;
    let r = plan_and_evict(&client, &a, &cancel, &mut p, &mut emitted).await;
    if let Err(e) = &r
        && a.output == Output::Json
        && !emitted
    {
        let doc = json!({"node": a.node, "dryRun": a.dry_run, "outcome": "error",
            "error": e.to_string()});
        let _ = writeln!(p.out, "{doc}");
    }
    r
}

async fn plan_and_evict(
    client: &kube::Client,
    a: &RoomArgs,
    cancel: &CancellationToken,
    p: &mut Progress<'_>,
    emitted: &mut bool,
) -> Result<(), DrainError> {
    let want = resolve(client, &a.spec).await?;
    let node = get_node(client, &a.node).await?;
    let cordoned = node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true);
    // terminal pods hold nothing (the scheduler's cache drops them); pods being deleted still
    // hold their requests until they are gone, as in the scheduler's cache
    let listed: Vec<Pod> = node_pods(client, &a.node)
        .await?
        .into_iter()
        .filter(|p| !crate::pod::is_terminal(p))
        .collect();
    let pdbs: kube::Api<PodDisruptionBudget> = kube::Api::all(client.clone());
    let budgets: Vec<_> = api::bounded(pdbs.list(&ListParams::default()))
        .await?
        .items
        .iter()
        .map(requests::budget)
        .collect();
    // one "now" for the plan: a pod not started yet counts as started now
    let now = jiff::Timestamp::now();
    let candidates: Vec<_> = listed.iter().map(|p| requests::candidate(p, now)).collect();
    let by_uid: BTreeMap<String, &Pod> = listed
        .iter()
        .map(|p| (p.metadata.uid.clone().unwrap_or_default(), p))
        .collect();
    let allocatable = requests::allocatable(&node);
    let used = candidates
        .iter()
        .fold(Resources::default(), |acc, c| acc.plus(&c.requests));
    let plan = preempt::select(
        &want.request,
        want.priority,
        &allocatable,
        &candidates,
        &budgets,
    );

    p.line(&format!(
        "room on node {} for a pod of priority {} ({}) requesting {}",
        a.node,
        want.priority,
        want.from.describe(),
        amounts(&want.request, false)
    ));
    p.line(&format!(
        "node {}: allocatable {}; its {} pods request {}",
        a.node,
        amounts(&allocatable, true),
        candidates.len(),
        amounts(&used, false)
    ));
    if cordoned {
        p.line(
            "note: the node is cordoned (spec.unschedulable): the scheduler would not place the \
             pod here at all, whatever is evicted",
        );
    }
    let mut doc = json!({
        "node": a.node,
        "dryRun": a.dry_run,
        "for": {
            "priority": want.priority,
            "prioritySource": want.from.json(),
            "preemptionPolicy": if want.never_preempts { "Never" } else { "PreemptLowerPriority" },
            "requests": amounts_json(&want.request),
        },
        "allocatable": {"pods": allocatable.pods, "resources": amounts_json(&allocatable)},
        "requested": {"pods": candidates.len(), "resources": amounts_json(&used)},
        "cordoned": cordoned,
    });
    let output = a.output;
    let mut emit = |p: &mut Progress<'_>, doc: &Value| {
        *emitted = true;
        if output == Output::Json {
            let _ = writeln!(p.out, "{doc}");
        }
    };
    let victims = match plan {
        Plan::FitsAlready => {
            p.line("fits already: nothing to evict");
            doc["outcome"] = "fits".into();
            emit(p, &doc);
            return Ok(());
        }
        Plan::Impossible { short } => {
            let why: Vec<String> = short.iter().map(shortfall_text).collect();
            doc["outcome"] = "cannot fit".into();
            doc["short"] = short
                .iter()
                .map(|s| {
                    json!({"resource": s.resource.name(), "requested": s.requested, "used": s.used,
                        "allocatable": s.allocatable, "short": s.short()})
                })
                .collect();
            let e = DrainError::Impossible(why.join("; "));
            doc["error"] = e.to_string().into();
            emit(p, &doc);
            return Err(e);
        }
        Plan::Victims(_) if want.never_preempts => {
            let e = DrainError::Refused(
                "the pod's preemptionPolicy is Never: the scheduler would not preempt for it, \
                 so make-room evicts nothing"
                    .into(),
            );
            doc["outcome"] = "never preempts".into();
            doc["error"] = e.to_string().into();
            emit(p, &doc);
            return Err(e);
        }
        Plan::Victims(v) => v,
    };
    for v in &victims {
        let mut why = format!(
            "priority {} < {}; {}; requests {}",
            v.pod.priority,
            want.priority,
            started_text(&v.pod),
            amounts(&v.pod.requests, false)
        );
        if v.pod.terminating {
            why += "; already terminating: nothing is sent, it is waited for";
        }
        if !v.violates.is_empty() {
            why += &format!(
                "; violates budget {} (the Eviction API will refuse it while the budget allows \
                 no disruption: make-room then stops, exit 1)",
                v.violates.join(", ")
            );
        }
        p.line(&format!(
            "victim   {}/{}: {why}",
            v.pod.namespace, v.pod.name
        ));
    }
    doc["outcome"] = "victims".into();
    doc["victims"] = victims
        .iter()
        .map(|v| {
            json!({"pod": format!("{}/{}", v.pod.namespace, v.pod.name), "uid": v.pod.uid,
                "priority": v.pod.priority,
                "startTime": v.pod.has_started.then(|| time_of(v.pod.started)),
                "requests": amounts_json(&v.pod.requests), "terminating": v.pod.terminating,
                "violates": v.violates})
        })
        .collect();
    if a.dry_run {
        emit(p, &doc);
        return Ok(());
    }
    let wave: Vec<_> = victims
        .iter()
        .filter_map(|v| by_uid.get(&v.pod.uid))
        .map(|pod| pods::drain_pods_at(std::slice::from_ref(*pod), &[], now).remove(0))
        .collect();
    let deadline = a.timeout.map(|t| Instant::now() + t);
    let budget_bound: BTreeMap<String, Vec<String>> = victims
        .iter()
        .filter(|v| !v.violates.is_empty())
        .map(|v| (v.pod.uid.clone(), v.violates.clone()))
        .collect();
    let (rows, err) =
        evict_waves(client, vec![wave], &budget_bound, None, deadline, cancel, p).await;
    doc["pods"] = rows
        .iter()
        .map(|r| json!({"pod": r.pod.key, "state": r.state.label(), "goneAfterSeconds": r.gone_after}))
        .collect();
    doc["error"] = err.as_ref().map(|e| e.to_string()).into();
    emit(p, &doc);
    err.map_or(Ok(()), Err)
}
