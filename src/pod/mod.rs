//! What the pipeline knows about a pod: kubelet's `v1.Pod` as seen by the pod workers, plus
//! `restoreSpecsFromContainerLabels` (`kuberuntime/labels.go`) for orphans.
//!
//! Invariants:
//! * a [`PodUid`] is checked once, here, before it is ever joined into a path: 1–64 characters
//!   of `[A-Za-z0-9_-]` (UUIDs and the kubelet's static-pod hashes), so no `/`, `.` or NUL;
//! * grace values from any source (API object, labels) are parsed without overflow and
//!   negative values are clamped as the API server does (negative → 1 second);
//! * a malformed object becomes a [`PodError`], never a panic.

use crate::cri::{self, RuntimeContainer, RuntimeSandbox};
use k8s_openapi::api::core::v1 as api;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;

/// Errors turning an API object or runtime labels into a [`PodInfo`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PodError {
    #[error("pod {pod}: invalid uid {uid:?}: {why}")]
    InvalidUid {
        pod: String,
        uid: String,
        why: &'static str,
    },
    #[error("pod {pod}: missing {field}")]
    Missing { pod: String, field: &'static str },
    #[error("pod {pod}: container {container}: invalid preStop handler: {why}")]
    InvalidHandler {
        pod: String,
        container: String,
        why: String,
    },
}

/// A validated pod UID, safe to join into a path.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodUid(String);

impl PodUid {
    /// Longest accepted UID. Real ones are 36 (UUID) or 32 (static pod hash) characters.
    pub const MAX_LEN: usize = 64;

    pub fn parse(uid: &str) -> Result<Self, &'static str> {
        if uid.is_empty() {
            return Err("empty");
        }
        if uid.len() > Self::MAX_LEN {
            return Err("longer than 64 characters");
        }
        if !uid
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err("only letters, digits, '-' and '_' are allowed");
        }
        Ok(Self(uid.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for PodUid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Pod QoS class: decides the pod cgroup's parent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QosClass {
    Guaranteed,
    Burstable,
    BestEffort,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestartPolicy {
    Always,
    OnFailure,
    Never,
}

/// A preStop handler (`v1.LifecycleHandler`), reduced to what runs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handler {
    Exec { command: Vec<String> },
    HttpGet(HttpGet),
    Sleep { seconds: i64 },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpGet {
    /// Empty: the pod's IP (the node's for host-network pods).
    pub host: String,
    pub port: HookPort,
    pub path: String,
    pub https: bool,
    pub headers: Vec<(String, String)>,
}

/// A hook port: a number, or a name resolved against the container's ports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HookPort {
    Number(u16),
    Name(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerSpec {
    pub name: String,
    pub pre_stop: Option<Handler>,
    /// Named container ports, for httpGet hooks with a named port.
    pub ports: Vec<(String, u16)>,
    /// The container's own `restartPolicy` and `restartPolicyRules` (regular containers,
    /// `ContainerRestartRules`, beta and on since v1.35); `None`: the pod's policy decides.
    pub restart: Option<ContainerRestart>,
}

/// A container's own restart policy and its rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerRestart {
    pub policy: RestartPolicy,
    /// In order: the first whose exit codes match decides.
    pub rules: Vec<RestartRule>,
}

/// One `restartPolicyRules` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestartRule {
    pub action: RestartAction,
    /// `In` (true) or `NotIn` (false) the values.
    pub exit_code_in: bool,
    pub values: Vec<i32>,
}

/// A rule's action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestartAction {
    /// `Restart`: this container restarts.
    Restart,
    /// `RestartAllContainers` (`RestartAllContainersOnContainerExits`, beta and on in v1.36):
    /// the pod's containers restart, so this one does.
    RestartAllContainers,
    /// An action this version does not know: the rule falls through.
    Other,
}

impl RestartPolicy {
    /// Whether a container that exited with `exit_code` restarts under this policy.
    fn restarts(self, exit_code: i32) -> bool {
        match self {
            RestartPolicy::Always => true,
            RestartPolicy::OnFailure => exit_code != 0,
            RestartPolicy::Never => false,
        }
    }

    fn parse(s: Option<&str>) -> RestartPolicy {
        match s {
            Some("Never") => RestartPolicy::Never,
            Some("OnFailure") => RestartPolicy::OnFailure,
            // the API's default, and the kubelet's for a value it does not know
            _ => RestartPolicy::Always,
        }
    }
}

impl ContainerSpec {
    /// `ContainerShouldRestart`: the first rule whose exit codes match decides (`Restart`,
    /// `RestartAllContainers`: restarts; another action falls through), then the container's
    /// own policy, then the pod's.
    pub fn should_restart(&self, pod_policy: RestartPolicy, exit_code: i32) -> bool {
        let Some(own) = &self.restart else {
            return pod_policy.restarts(exit_code);
        };
        for rule in &own.rules {
            if rule.values.contains(&exit_code) != rule.exit_code_in {
                continue;
            }
            match rule.action {
                RestartAction::Restart | RestartAction::RestartAllContainers => return true,
                RestartAction::Other => {}
            }
        }
        own.policy.restarts(exit_code)
    }

    /// Whether the container restarts for no exit code (its effective policy is `Never` and
    /// it has no rule that could restart it): its exit code need not be read.
    pub fn never_restarts(&self, pod_policy: RestartPolicy) -> bool {
        match &self.restart {
            None => pod_policy == RestartPolicy::Never,
            Some(r) => r.policy == RestartPolicy::Never && r.rules.is_empty(),
        }
    }

    /// Whether the container restarts whatever its exit code (its effective policy is
    /// `Always`: no rule can stop that).
    pub fn always_restarts(&self, pod_policy: RestartPolicy) -> bool {
        self.restart.as_ref().map_or(pod_policy, |r| r.policy) == RestartPolicy::Always
    }
}

/// Everything the termination pipeline needs to know about a pod.
#[derive(Debug, Clone, PartialEq)]
pub struct PodInfo {
    pub uid: PodUid,
    pub namespace: String,
    pub name: String,
    /// `spec.terminationGracePeriodSeconds` (None: not set, the API default 30 applies).
    pub spec_grace: Option<i64>,
    /// `metadata.deletionTimestamp` is set.
    pub deletion_requested: bool,
    /// `metadata.deletionGracePeriodSeconds`.
    pub deletion_grace: Option<i64>,
    /// `metadata.deletionTimestamp` in Unix seconds (the deadline the API server computed).
    pub deletion_timestamp: Option<i64>,
    /// When every container must have been killed. Set only when a kill is retried after a
    /// failed attempt: a stop's grace then counts down to the first attempt's deadline, with
    /// no new 2 s floor. `None`: the ordinary grace rules (and the durable records of stops
    /// already sent, `crate::terminating::records`).
    pub kill_deadline: Option<crate::deadline::Deadline>,
    /// API phase is `Failed` or `Succeeded`.
    pub terminal_phase: bool,
    pub restart_policy: RestartPolicy,
    pub containers: Vec<ContainerSpec>,
    /// Restartable init containers (`restartPolicy: Always`), in declaration order.
    pub sidecars: Vec<ContainerSpec>,
    pub host_network: bool,
    pub pod_ip: Option<IpAddr>,
    pub qos: QosClass,
    /// `spec.priority` (0 when unset, as the kubelet's shutdown manager reads it): the graceful
    /// node shutdown group ([`crate::shutdown`]).
    pub priority: i32,
    /// A static (file) pod or its mirror: no terminal phase, no API delete.
    pub static_pod: bool,
    /// `metadata.generation` of the object last seen: every status write carries it as its
    /// `observedGeneration` (the kubelet's `PodObservedGenerationTracking`, GA in v1.35).
    pub generation: Option<i64>,
    /// `spec.activeDeadlineSeconds`.
    pub active_deadline_seconds: Option<i64>,
    /// `status.startTime` in Unix seconds (when the kubelet first ran the pod).
    pub start_time: Option<i64>,
}

impl PodInfo {
    /// "namespace/name", the kubelet's `klog.KObj` form, for logs.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// The spec of a regular container or sidecar by name.
    pub fn container(&self, name: &str) -> Option<&ContainerSpec> {
        self.containers
            .iter()
            .chain(&self.sidecars)
            .find(|c| c.name == name)
    }

    pub fn is_sidecar(&self, name: &str) -> bool {
        self.sidecars.iter().any(|c| c.name == name)
    }

    /// Reads an API pod object. Fields the pipeline does not need are ignored; a missing UID
    /// or an invalid one is an error (the object is logged and skipped by the caller).
    pub fn from_api(pod: &api::Pod) -> Result<Self, PodError> {
        let meta = &pod.metadata;
        let namespace = meta.namespace.clone().unwrap_or_else(|| "default".into());
        let name = meta.name.clone().unwrap_or_default();
        let key = format!("{namespace}/{name}");
        let raw_uid = meta.uid.as_deref().ok_or(PodError::Missing {
            pod: key.clone(),
            field: "metadata.uid",
        })?;
        let uid = PodUid::parse(raw_uid).map_err(|why| PodError::InvalidUid {
            pod: key.clone(),
            uid: truncate(raw_uid),
            why,
        })?;
        let spec = pod.spec.as_ref().ok_or(PodError::Missing {
            pod: key.clone(),
            field: "spec",
        })?;
        let status = pod.status.as_ref();
        let conv = |c: &api::Container| -> Result<ContainerSpec, PodError> {
            let pre_stop = c
                .lifecycle
                .as_ref()
                .and_then(|l| l.pre_stop.as_ref())
                .map(handler_from_api)
                .transpose()
                .map_err(|why| PodError::InvalidHandler {
                    pod: key.clone(),
                    container: c.name.clone(),
                    why,
                })?
                .flatten();
            let ports = c
                .ports
                .iter()
                .flatten()
                .filter_map(|p| {
                    let n = p.name.clone()?;
                    Some((n, u16::try_from(p.container_port).ok()?))
                })
                .collect();
            Ok(ContainerSpec {
                name: c.name.clone(),
                pre_stop,
                ports,
                restart: container_restart(c),
            })
        };
        let containers = spec
            .containers
            .iter()
            .map(conv)
            .collect::<Result<Vec<_>, _>>()?;
        let sidecars = spec
            .init_containers
            .iter()
            .flatten()
            .filter(|c| c.restart_policy.as_deref() == Some("Always"))
            .map(conv)
            .collect::<Result<Vec<_>, _>>()?;
        let phase = status.and_then(|s| s.phase.as_deref());
        let static_pod = is_mirror_or_static(pod);
        Ok(PodInfo {
            uid,
            namespace,
            name,
            spec_grace: spec.termination_grace_period_seconds,
            deletion_requested: meta.deletion_timestamp.is_some(),
            deletion_timestamp: meta.deletion_timestamp.as_ref().map(|t| t.0.as_second()),
            kill_deadline: None,
            deletion_grace: meta.deletion_grace_period_seconds,
            terminal_phase: matches!(phase, Some("Failed" | "Succeeded")),
            restart_policy: RestartPolicy::parse(spec.restart_policy.as_deref()),
            containers,
            sidecars,
            host_network: spec.host_network.unwrap_or(false),
            pod_ip: status
                .and_then(|s| s.pod_ip.as_deref())
                .and_then(|ip| ip.parse().ok()),
            qos: match status.and_then(|s| s.qos_class.as_deref()) {
                Some("Guaranteed") => QosClass::Guaranteed,
                Some("Burstable") => QosClass::Burstable,
                Some("BestEffort") => QosClass::BestEffort,
                _ => qos_from_spec(spec),
            },
            priority: spec.priority.unwrap_or(0),
            static_pod,
            generation: meta.generation,
            active_deadline_seconds: spec.active_deadline_seconds,
            start_time: status
                .and_then(|s| s.start_time.as_ref())
                .map(|t| t.0.as_second()),
        })
    }

    /// Rebuilds an orphan's spec from what the kubelet wrote on its runtime objects (labels and
    /// annotations): the kubelet's `restoreSpecsFromContainerLabels`. Unparseable annotations
    /// are dropped (the container still gets stopped, without a hook).
    pub fn from_runtime(
        uid: &PodUid,
        sandboxes: &[&RuntimeSandbox],
        containers: &[&RuntimeContainer],
    ) -> PodInfo {
        let sb = sandboxes.iter().max_by_key(|s| s.created_at);
        let pick = |k: &str| -> String {
            sb.and_then(|s| s.labels.get(k).cloned())
                .or_else(|| containers.iter().find_map(|c| c.labels.get(k).cloned()))
                .unwrap_or_default()
        };
        let mut specs: Vec<ContainerSpec> = Vec::new();
        let mut spec_grace = None;
        // newest first, so each name takes its latest attempt's annotations
        let mut sorted: Vec<&&RuntimeContainer> = containers.iter().collect();
        sorted.sort_by_key(|c| std::cmp::Reverse(c.created_at));
        for c in sorted {
            if spec_grace.is_none() {
                spec_grace = c
                    .annotations
                    .get(cri::ANNOTATION_GRACE)
                    .and_then(|g| parse_grace(g));
            }
            if specs.iter().any(|s| s.name == c.name) {
                continue;
            }
            let pre_stop = c
                .annotations
                .get(cri::ANNOTATION_PRESTOP)
                .and_then(|j| serde_json::from_str::<api::LifecycleHandler>(j).ok())
                .and_then(|h| handler_from_api(&h).ok().flatten());
            specs.push(ContainerSpec {
                name: c.name.clone(),
                pre_stop,
                ports: Vec::new(),
                restart: None,
            });
        }
        PodInfo {
            uid: uid.clone(),
            namespace: pick(cri::LABEL_POD_NAMESPACE),
            name: pick(cri::LABEL_POD_NAME),
            spec_grace,
            deletion_requested: false,
            deletion_grace: None,
            deletion_timestamp: None,
            kill_deadline: None,
            terminal_phase: false,
            restart_policy: RestartPolicy::Never,
            containers: specs,
            sidecars: Vec::new(),
            host_network: false,
            pod_ip: None,
            qos: QosClass::BestEffort,
            priority: 0,
            static_pod: false,
            generation: None,
            active_deadline_seconds: None,
            start_time: None,
        }
    }
}

/// A regular container's own restart policy and rules (`None` without a policy: rules need
/// one, and the API server refuses rules without it).
fn container_restart(c: &api::Container) -> Option<ContainerRestart> {
    let policy = c.restart_policy.as_deref()?;
    let rules = c
        .restart_policy_rules
        .iter()
        .flatten()
        .filter_map(|r| {
            let codes = r.exit_codes.as_ref()?;
            Some(RestartRule {
                action: match r.action.as_str() {
                    "Restart" => RestartAction::Restart,
                    "RestartAllContainers" => RestartAction::RestartAllContainers,
                    _ => RestartAction::Other,
                },
                exit_code_in: match codes.operator.as_str() {
                    "In" => true,
                    "NotIn" => false,
                    // an operator this version does not know matches nothing
                    _ => return None,
                },
                values: codes.values.clone().unwrap_or_default(),
            })
        })
        .collect();
    Some(ContainerRestart {
        policy: RestartPolicy::parse(Some(policy)),
        rules,
    })
}

fn truncate(s: &str) -> String {
    s.chars().take(80).collect()
}

/// A mirror pod: the API's copy of one of the kubelet's static pods (another UID; the kubelet
/// recreates it when it is deleted). The one place that reads `kubernetes.io/config.mirror`.
pub fn is_mirror(pod: &api::Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key("kubernetes.io/config.mirror"))
}

/// A mirror pod, or a pod whose config source is not the API (a static pod as the kubelet
/// reports it).
pub fn is_mirror_or_static(pod: &api::Pod) -> bool {
    is_mirror(pod)
        || pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("kubernetes.io/config.source"))
            .is_some_and(|s| s != "api")
}

/// `Succeeded` or `Failed`: the pod's containers will not run again.
pub fn is_terminal(pod: &api::Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// Parses a grace value written as text (an annotation): integers only, saturating, negative
/// → 1 as the API server does. Garbage → None.
pub fn parse_grace(s: &str) -> Option<i64> {
    let t = s.trim();
    let v: i128 = t.parse().ok().or_else(|| {
        // beyond i128: only a sign and digits are still a number
        let digits = t.strip_prefix('-').unwrap_or(t);
        (!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())).then(|| {
            if t.starts_with('-') {
                i128::MIN
            } else {
                i128::MAX
            }
        })
    })?;
    Some(if v < 0 {
        1
    } else {
        v.min(i64::MAX as i128) as i64
    })
}

fn handler_from_api(h: &api::LifecycleHandler) -> Result<Option<Handler>, String> {
    if let Some(e) = &h.exec {
        let command = e.command.clone().unwrap_or_default();
        if command.is_empty() {
            return Err("exec handler without a command".into());
        }
        return Ok(Some(Handler::Exec { command }));
    }
    if let Some(g) = &h.http_get {
        let port = match &g.port {
            IntOrString::Int(p) => HookPort::Number(
                u16::try_from(*p)
                    .ok()
                    .filter(|p| *p > 0)
                    .ok_or_else(|| format!("port {p} out of range"))?,
            ),
            IntOrString::String(s) => match s.parse::<u16>() {
                Ok(p) if p > 0 => HookPort::Number(p),
                _ => HookPort::Name(s.clone()),
            },
        };
        return Ok(Some(Handler::HttpGet(HttpGet {
            host: g.host.clone().unwrap_or_default(),
            port,
            path: g.path.clone().unwrap_or_default(),
            https: g
                .scheme
                .as_deref()
                .is_some_and(|s| s.eq_ignore_ascii_case("https")),
            headers: g
                .http_headers
                .iter()
                .flatten()
                .map(|h| (h.name.clone(), h.value.clone()))
                .collect(),
        })));
    }
    if let Some(s) = &h.sleep {
        return Ok(Some(Handler::Sleep {
            seconds: s.seconds.max(0),
        }));
    }
    // tcpSocket is deprecated and never run as a hook by the kubelet
    Ok(None)
}

/// The API server's QoS rule when `status.qosClass` is absent: no requests or limits anywhere
/// → BestEffort; cpu and memory limits on every container with requests (if any) equal →
/// Guaranteed; otherwise Burstable.
fn qos_from_spec(spec: &api::PodSpec) -> QosClass {
    let all: Vec<&api::Container> = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .collect();
    let res = |c: &api::Container| c.resources.clone().unwrap_or_default();
    let relevant = |m: &Option<std::collections::BTreeMap<String, _>>| {
        m.as_ref()
            .is_some_and(|m| m.keys().any(|k| k == "cpu" || k == "memory"))
    };
    if all.iter().all(|c| {
        let r = res(c);
        !relevant(&r.requests) && !relevant(&r.limits)
    }) {
        return QosClass::BestEffort;
    }
    let guaranteed = all.iter().all(|c| {
        let r = res(c);
        let limits = r.limits.unwrap_or_default();
        let requests = r.requests.unwrap_or_default();
        ["cpu", "memory"]
            .iter()
            .all(|k| match (limits.get(*k), requests.get(*k)) {
                (Some(l), Some(q)) => l == q,
                (Some(_), None) => true,
                _ => false,
            })
    });
    if guaranteed {
        QosClass::Guaranteed
    } else {
        QosClass::Burstable
    }
}

/// Groups runtime objects by pod UID. Objects whose UID label is not a valid [`PodUid`] are
/// returned separately so the caller can log and skip them.
pub struct RuntimePods<'a> {
    pub pods: HashMap<PodUid, (Vec<&'a RuntimeSandbox>, Vec<&'a RuntimeContainer>)>,
    pub invalid: Vec<String>,
}

pub fn group_runtime<'a>(
    sandboxes: &'a [RuntimeSandbox],
    containers: &'a [RuntimeContainer],
) -> RuntimePods<'a> {
    let mut out = RuntimePods {
        pods: HashMap::new(),
        invalid: Vec::new(),
    };
    let mut sandbox_uid: HashMap<&str, PodUid> = HashMap::new();
    for s in sandboxes {
        match PodUid::parse(&s.pod_uid) {
            Ok(uid) => {
                sandbox_uid.insert(&s.id, uid.clone());
                out.pods.entry(uid).or_default().0.push(s);
            }
            Err(_) => out.invalid.push(s.id.clone()),
        }
    }
    for c in containers {
        // the sandbox's UID wins; a container's own label is the fallback
        let uid = sandbox_uid
            .get(c.sandbox_id.as_str())
            .cloned()
            .or_else(|| PodUid::parse(&c.pod_uid).ok());
        match uid {
            Some(uid) => out.pods.entry(uid).or_default().1.push(c),
            None => out.invalid.push(c.id.clone()),
        }
    }
    out
}

#[cfg(test)]
mod tests;
