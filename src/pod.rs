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
    /// Unix seconds by which every container must have been killed. Set only when a
    /// termination begun before this start of reaplet is resumed: a stop's grace then counts
    /// down to this instant, with no new 2 s floor, so restarts (however many) never push a
    /// SIGKILL past the pod's own deadline. `None`: the ordinary grace rules.
    pub kill_deadline: Option<i64>,
    /// API phase is `Failed` or `Succeeded`.
    pub terminal_phase: bool,
    pub restart_policy: RestartPolicy,
    pub containers: Vec<ContainerSpec>,
    /// Restartable init containers (`restartPolicy: Always`), in declaration order.
    pub sidecars: Vec<ContainerSpec>,
    pub host_network: bool,
    pub pod_ip: Option<IpAddr>,
    pub qos: QosClass,
    /// A static (file) pod or its mirror: no terminal phase, no API delete.
    pub static_pod: bool,
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
        let annotations = meta.annotations.as_ref();
        let static_pod = annotations.is_some_and(|a| {
            a.contains_key("kubernetes.io/config.mirror")
                || a.get("kubernetes.io/config.source")
                    .is_some_and(|s| s != "api")
        });
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
            restart_policy: match spec.restart_policy.as_deref() {
                Some("Never") => RestartPolicy::Never,
                Some("OnFailure") => RestartPolicy::OnFailure,
                _ => RestartPolicy::Always,
            },
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
            static_pod,
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
            static_pod: false,
        }
    }
}

fn truncate(s: &str) -> String {
    s.chars().take(80).collect()
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
mod tests {
    use super::*;

    fn pod_json(v: serde_json::Value) -> api::Pod {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn uid_validation() {
        assert!(PodUid::parse("0b2f4c1e-8f0a-4a52-9d61-3f2f0b1c2d3e").is_ok());
        assert!(PodUid::parse("6e2b9c1d5f4a3b2c1d0e9f8a7b6c5d4e").is_ok());
        for bad in [
            "",
            "../../etc",
            "a/b",
            ".",
            "..",
            "x\0y",
            "é",
            &"a".repeat(10_000),
        ] {
            assert!(PodUid::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn grace_text() {
        assert_eq!(parse_grace("30"), Some(30));
        assert_eq!(parse_grace("-5"), Some(1));
        assert_eq!(
            parse_grace("99999999999999999999999999999999999999999999"),
            Some(i64::MAX)
        );
        assert_eq!(
            parse_grace("-99999999999999999999999999999999999999999999"),
            Some(1)
        );
        assert_eq!(parse_grace("abc"), None);
        assert_eq!(parse_grace(""), None);
    }

    #[test]
    fn from_api_reads_what_matters() {
        let p = pod_json(serde_json::json!({
            "metadata": {"name": "web", "namespace": "prod", "uid": "0b2f4c1e-8f0a-4a52-9d61-3f2f0b1c2d3e",
                         "deletionTimestamp": "2026-01-01T00:00:00Z", "deletionGracePeriodSeconds": 5},
            "spec": {
                "terminationGracePeriodSeconds": 60,
                "restartPolicy": "OnFailure",
                "hostNetwork": true,
                "initContainers": [
                    {"name": "init", "image": "x"},
                    {"name": "proxy", "image": "x", "restartPolicy": "Always"}
                ],
                "containers": [{"name": "app", "image": "x",
                    "ports": [{"name": "http", "containerPort": 8080}],
                    "lifecycle": {"preStop": {"httpGet": {"port": "http", "path": "/quit"}}}}]
            },
            "status": {"phase": "Running", "podIP": "10.1.2.3", "qosClass": "Burstable"}
        }));
        let i = PodInfo::from_api(&p).unwrap();
        assert_eq!(i.key(), "prod/web");
        assert_eq!(i.spec_grace, Some(60));
        assert!(i.deletion_requested);
        assert_eq!(i.deletion_grace, Some(5));
        assert_eq!(i.restart_policy, RestartPolicy::OnFailure);
        assert_eq!(i.sidecars.len(), 1);
        assert_eq!(i.sidecars[0].name, "proxy");
        assert!(i.host_network);
        assert_eq!(i.qos, QosClass::Burstable);
        assert!(!i.terminal_phase);
        match &i.containers[0].pre_stop {
            Some(Handler::HttpGet(g)) => assert_eq!(g.port, HookPort::Name("http".into())),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn from_api_rejects_hostile() {
        for uid in ["../../etc", "", &"a".repeat(10_240)] {
            let p = pod_json(serde_json::json!({
                "metadata": {"name": "x", "uid": uid},
                "spec": {"containers": []}
            }));
            assert!(matches!(
                PodInfo::from_api(&p),
                Err(PodError::InvalidUid { .. })
            ));
        }
        let p =
            pod_json(serde_json::json!({"metadata": {"name": "x"}, "spec": {"containers": []}}));
        assert!(matches!(
            PodInfo::from_api(&p),
            Err(PodError::Missing { .. })
        ));
        // negative and huge graces are carried as-is; the grace math clamps them
        let p = pod_json(serde_json::json!({
            "metadata": {"name": "x", "uid": "u1", "deletionGracePeriodSeconds": -7},
            "spec": {"terminationGracePeriodSeconds": i64::MAX, "containers": [
                {"name": "c", "image": "x", "lifecycle": {"preStop": {"httpGet": {"port": 70000}}}}]}
        }));
        assert!(matches!(
            PodInfo::from_api(&p),
            Err(PodError::InvalidHandler { .. })
        ));
    }

    #[test]
    fn hostile_graces_in_the_api_object() {
        let p = pod_json(serde_json::json!({
            "metadata": {"name": "x", "uid": "u1", "deletionTimestamp": "2026-01-01T00:00:00Z",
                         "deletionGracePeriodSeconds": -7},
            "spec": {"terminationGracePeriodSeconds": i64::MAX, "containers": []}
        }));
        let i = PodInfo::from_api(&p).unwrap();
        assert_eq!(
            crate::grace::effective_grace(None, i.deletion_grace, None, i.spec_grace),
            1,
            "a negative deletion grace means 1"
        );
        let p = pod_json(serde_json::json!({
            "metadata": {"name": "x", "uid": "u1"},
            "spec": {"terminationGracePeriodSeconds": i64::MIN, "containers": []}
        }));
        let i = PodInfo::from_api(&p).unwrap();
        assert_eq!(
            crate::grace::effective_grace(None, None, None, i.spec_grace),
            1
        );
        // a value beyond i64 is not a pod: the decoder rejects it (the source logs and skips)
        let r: Result<api::Pod, _> = serde_json::from_str(
            r#"{"metadata":{"uid":"u1"},"spec":{"terminationGracePeriodSeconds":99999999999999999999999,"containers":[]}}"#,
        );
        assert!(r.is_err());
    }

    #[test]
    fn group_runtime_skips_hostile_uids() {
        let sb = |id: &str, uid: &str| RuntimeSandbox {
            id: id.into(),
            pod_uid: uid.into(),
            pod_name: String::new(),
            pod_namespace: String::new(),
            ready: true,
            created_at: 0,
            labels: HashMap::new(),
            annotations: HashMap::new(),
        };
        let long = "a".repeat(10_240);
        let sbs = vec![
            sb("s1", "../../etc"),
            sb("s2", ""),
            sb("s3", &long),
            sb("s4", "good"),
        ];
        let g = group_runtime(&sbs, &[]);
        assert_eq!(g.pods.len(), 1);
        assert_eq!(g.invalid, vec!["s1", "s2", "s3"]);
    }

    proptest::proptest! {
        #[test]
        fn uid_parse_never_panics_and_accepted_uids_are_path_safe(s in "\\PC{0,80}") {
            if let Ok(u) = PodUid::parse(&s) {
                let p = std::path::Path::new("/root").join(u.as_str());
                proptest::prop_assert_eq!(p.parent(), Some(std::path::Path::new("/root")));
                proptest::prop_assert!(p.components().all(|c| !matches!(c, std::path::Component::ParentDir)));
            }
        }

        #[test]
        fn parse_grace_never_panics(s in "\\PC{0,60}") {
            if let Some(g) = parse_grace(&s) {
                proptest::prop_assert!(g >= 0);
            }
        }
    }

    #[test]
    fn qos_fallback() {
        let spec = |res: serde_json::Value| -> api::PodSpec {
            serde_json::from_value(
                serde_json::json!({"containers": [{"name": "c", "resources": res}]}),
            )
            .unwrap()
        };
        assert_eq!(
            qos_from_spec(&spec(serde_json::json!({}))),
            QosClass::BestEffort
        );
        assert_eq!(
            qos_from_spec(&spec(
                serde_json::json!({"limits": {"cpu": "1", "memory": "1Gi"}})
            )),
            QosClass::Guaranteed
        );
        assert_eq!(
            qos_from_spec(&spec(serde_json::json!({"requests": {"cpu": "1"}}))),
            QosClass::Burstable
        );
    }

    #[test]
    fn orphan_spec_from_labels() {
        let mut ann = HashMap::new();
        ann.insert(cri::ANNOTATION_GRACE.to_string(), "45".to_string());
        ann.insert(
            cri::ANNOTATION_PRESTOP.to_string(),
            r#"{"exec":{"command":["/bin/sh","-c","sleep 1"]}}"#.to_string(),
        );
        let mut labels = HashMap::new();
        labels.insert(cri::LABEL_POD_NAME.to_string(), "p".to_string());
        labels.insert(cri::LABEL_POD_NAMESPACE.to_string(), "ns".to_string());
        let c = RuntimeContainer {
            id: "c1".into(),
            sandbox_id: "s1".into(),
            name: "app".into(),
            attempt: 0,
            pod_uid: "u1".into(),
            state: cri::ContainerRunState::Running,
            created_at: 1,
            labels: labels.clone(),
            annotations: ann.clone(),
        };
        let mut bad = c.clone();
        bad.name = "side".into();
        bad.annotations
            .insert(cri::ANNOTATION_PRESTOP.into(), "{not json".into());
        bad.annotations.insert(
            cri::ANNOTATION_GRACE.into(),
            "-99999999999999999999999".into(),
        );
        bad.created_at = 0;
        let uid = PodUid::parse("u1").unwrap();
        let info = PodInfo::from_runtime(&uid, &[], &[&c, &bad]);
        assert_eq!(info.key(), "ns/p");
        assert_eq!(info.spec_grace, Some(45));
        assert!(matches!(
            info.containers[0].pre_stop,
            Some(Handler::Exec { .. })
        ));
        assert_eq!(info.containers[1].pre_stop, None);
    }
}
