//! Metrics: the kubelet's termination-path metric names (reference §7) with a `reaplet_`
//! prefix, plus reaplet's termination-latency SLI and its stages.
//!
//! Two expositions ([`Exposition`]): the Prometheus text format 0.0.4 (the default, what
//! every scraper reads) and OpenMetrics 1.0 (for a scraper that asks for it in `Accept`).
//! prometheus-client encodes OpenMetrics; the 0.0.4 form is converted from it
//! ([`openmetrics_to_prometheus`]): the samples are the same in both, only the metadata
//! differs (no `# EOF`, no `# UNIT`, `unknown` is `untyped`, and a counter's `# HELP` and
//! `# TYPE` name its sample, `_total` included, which the 0.0.4 parsers require).
//!
//! Invariants: label sets are bounded (operation types, lifecycle states, sources, stages:
//! never a pod name or UID); every gauge is present from the start, at 0 (a gauge family's
//! every label combination is created up front; the working-pods gauges' by their owner, the
//! pod workers, as soon as they have the registry); recording never blocks (atomic updates,
//! one short lock for the SLI start times).
//!
//! A leaf: it knows nothing of the agent. Its label values are `&'static str`s the callers
//! give (each a bounded set where it is defined, e.g. the lifecycle states' `as_str`), and the
//! SLI is keyed by the pod UID's text.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabel {
    pub operation_type: &'static str,
}

/// What a runtime relist covered: `full` (every sandbox and container of the node) or `pod`
/// (one pod's, for a container event).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RelistLabel {
    pub scope: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WorkingLabels {
    pub lifecycle: &'static str,
    pub config: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EvictionLabels {
    /// `taint_manager` or `node_affinity`.
    pub source: &'static str,
    /// `deleted`, `evicted`, `blocked`, `failed`, `cancelled`, `exempt`, `dry_run`.
    pub outcome: &'static str,
}

/// Why the trace export dropped a span (one of [`SPAN_DROP_REASONS`]).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SpanDropLabel {
    pub reason: &'static str,
}

/// The reasons a span is dropped by the trace export, in this order: the queue was full when it
/// ended, its export failed or timed out, or it ended after the export stopped (the trace
/// export takes its three counters by destructuring this array).
pub const SPAN_DROP_REASONS: [&str; 3] = ["queue_full", "export_failed", "shutdown"];

/// The label of `reaplet_node_pressure_evictions`: the kubelet's signal name
/// (`memory.available`, `allocatableMemory.available`, `pid.available`), as
/// `kubelet_evictions{eviction_signal}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SignalLabel {
    pub eviction_signal: &'static str,
}

/// The label of `reaplet_node_pressure`: `MemoryPressure`, `DiskPressure` or `PIDPressure`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConditionLabel {
    pub condition: &'static str,
}

/// The node pressure conditions, every one present from the start.
pub const PRESSURE_CONDITIONS: [&str; 3] = ["MemoryPressure", "DiskPressure", "PIDPressure"];

/// The label of `reaplet_node_identity_problem`: one of [`IdentityProblem::as_str`].
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct IdentityProblemLabel {
    pub problem: &'static str,
}

/// What is wrong with the node's name: the bounded values of `reaplet_node_identity_problem`'s
/// `problem` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IdentityProblem {
    /// `pod_bound_elsewhere`: a runtime pod taken for an orphan has its object, same UID,
    /// bound to another node: reaplet's node name is wrong (the pod workers' orphan
    /// confirmation).
    PodBoundElsewhere,
    /// `node_missing`: no Node object under reaplet's node name while something answers on the
    /// kubelet's health endpoint (the standby decision).
    NodeMissing,
    /// `lease_missing`: the Node exists, its Lease does not (the standby decision).
    LeaseMissing,
}

impl IdentityProblem {
    pub const ALL: [IdentityProblem; 3] = [
        IdentityProblem::PodBoundElsewhere,
        IdentityProblem::NodeMissing,
        IdentityProblem::LeaseMissing,
    ];

    /// The metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            IdentityProblem::PodBoundElsewhere => "pod_bound_elsewhere",
            IdentityProblem::NodeMissing => "node_missing",
            IdentityProblem::LeaseMissing => "lease_missing",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StageLabel {
    pub stage: &'static str,
}

fn latency_buckets() -> impl Iterator<Item = f64> {
    [
        0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
    ]
    .into_iter()
}

fn new_hist() -> Histogram {
    Histogram::new(latency_buckets())
}

/// How `/metrics` is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exposition {
    /// Prometheus text format 0.0.4: the default.
    Prometheus,
    /// OpenMetrics 1.0 text, for a scraper whose `Accept` prefers it.
    OpenMetrics,
}

impl Exposition {
    pub fn content_type(self) -> &'static str {
        match self {
            Self::Prometheus => "text/plain; version=0.0.4; charset=utf-8",
            Self::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }

    /// The exposition an `Accept` header asks for: OpenMetrics when it weighs
    /// `application/openmetrics-text` at least as high as every other type it accepts
    /// (Prometheus sends `application/openmetrics-text;version=1.0.0,...,text/plain;
    /// version=0.0.4;q=0.5,...`), else the Prometheus text format. No header: Prometheus.
    pub fn negotiate(accept: Option<&str>) -> Self {
        let Some(accept) = accept else {
            return Self::Prometheus;
        };
        let mut openmetrics = 0.0f32;
        let mut other = 0.0f32;
        for range in accept.split(',') {
            let mut parts = range.split(';').map(str::trim);
            let media = parts.next().unwrap_or_default().to_ascii_lowercase();
            let q = parts
                .filter_map(|p| p.strip_prefix("q="))
                .find_map(|q| q.trim().parse::<f32>().ok())
                .unwrap_or(1.0)
                .clamp(0.0, 1.0);
            if media == "application/openmetrics-text" {
                openmetrics = openmetrics.max(q);
            } else if !media.is_empty() {
                other = other.max(q);
            }
        }
        if openmetrics > 0.0 && openmetrics >= other {
            Self::OpenMetrics
        } else {
            Self::Prometheus
        }
    }
}

/// The Prometheus text format 0.0.4 of prometheus-client's OpenMetrics text (see the
/// module's docs for what differs).
pub fn openmetrics_to_prometheus(om: &str) -> String {
    let counters: std::collections::HashSet<&str> = om
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(om.len());
    for line in om.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let meta = ["# HELP ", "# TYPE "]
            .into_iter()
            .find_map(|p| line.strip_prefix(p).map(|rest| (p, rest)));
        match meta {
            Some((prefix, rest)) => {
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                let name = if counters.contains(name) && !name.ends_with("_total") {
                    format!("{name}_total")
                } else {
                    name.to_owned()
                };
                let tail = if prefix == "# TYPE " && tail == "unknown" {
                    "untyped"
                } else {
                    tail
                };
                out.push_str(prefix);
                out.push_str(&name);
                if !tail.is_empty() || prefix == "# HELP " {
                    out.push(' ');
                    out.push_str(tail);
                }
            }
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

pub struct Metrics {
    registry: Registry,
    pub pod_worker_duration: Family<OpLabel, Histogram, fn() -> Histogram>,
    pub working_pods: Family<WorkingLabels, Gauge>,
    pub orphaned_runtime_pods: Counter,
    pub runtime_relists: Family<RelistLabel, Counter>,
    pub runtime_operations: Family<OpLabel, Counter>,
    pub runtime_operations_duration: Family<OpLabel, Histogram, fn() -> Histogram>,
    pub runtime_operations_errors: Family<OpLabel, Counter>,
    pub cgroup_manager_duration: Family<OpLabel, Histogram, fn() -> Histogram>,
    pub pod_status_sync_duration: Histogram,
    pub termination_duration: Histogram,
    pub termination_stage_duration: Family<StageLabel, Histogram, fn() -> Histogram>,
    pub events_dropped: Counter,
    /// Kills still running past their grace plus the slack (the `ExceededGracePeriod` event).
    pub exceeded_grace_period: Counter,
    /// 1 while the container runtime has answered no relist for the unhealthy threshold.
    pub runtime_unhealthy: Gauge,
    /// What this node's eviction sources did, by source and outcome.
    pub evictions: Family<EvictionLabels, Counter>,
    /// When the last graceful node shutdown started and ended (Unix seconds; 0: not yet).
    pub graceful_shutdown_start_time: Gauge,
    pub graceful_shutdown_end_time: Gauge,
    /// 1 while reaplet holds its logind delay inhibitor.
    pub graceful_shutdown_inhibitor: Gauge,
    /// Spans the trace export dropped, by reason ([`SPAN_DROP_REASONS`]); every reason
    /// present from the start, at 0.
    pub tracing_spans_dropped: Family<SpanDropLabel, Counter>,
    /// 1 while the node's name is known to be wrong, by problem ([`IdentityProblem`]); every
    /// problem present from the start, at 0.
    pub node_identity_problem: Family<IdentityProblemLabel, Gauge>,
    /// 1 while reaplet is the node's acting agent (primary, or standby after a takeover), 0
    /// while it stands by.
    pub standby_active: Gauge,
    /// Takeovers and hand-backs since the start.
    pub standby_takeovers: Counter,
    pub standby_handbacks: Counter,
    /// Node-pressure evictions, by signal (`kubelet_evictions`).
    pub pressure_evictions: Family<SignalLabel, Counter>,
    /// 1 while a node pressure condition holds (as the kubelet would set it on the Node).
    pub node_pressure: Family<ConditionLabel, Gauge>,
    /// When each pod's SLI started, by the pod UID's text.
    started: Mutex<HashMap<String, Instant>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("reaplet");
        let m = Metrics {
            pod_worker_duration: Family::new_with_constructor(new_hist),
            working_pods: Family::default(),
            orphaned_runtime_pods: Counter::default(),
            runtime_relists: Family::default(),
            runtime_operations: Family::default(),
            runtime_operations_duration: Family::new_with_constructor(new_hist),
            runtime_operations_errors: Family::default(),
            cgroup_manager_duration: Family::new_with_constructor(new_hist),
            pod_status_sync_duration: new_hist(),
            termination_duration: new_hist(),
            termination_stage_duration: Family::new_with_constructor(new_hist),
            events_dropped: Counter::default(),
            exceeded_grace_period: Counter::default(),
            runtime_unhealthy: Gauge::default(),
            evictions: Family::default(),
            graceful_shutdown_start_time: Gauge::default(),
            graceful_shutdown_end_time: Gauge::default(),
            graceful_shutdown_inhibitor: Gauge::default(),
            tracing_spans_dropped: Family::default(),
            node_identity_problem: Family::default(),
            pressure_evictions: Family::default(),
            node_pressure: Family::default(),
            standby_active: Gauge::default(),
            standby_takeovers: Counter::default(),
            standby_handbacks: Counter::default(),
            started: Mutex::default(),
            registry: Registry::default(),
        };
        registry.register(
            "pod_worker_duration_seconds",
            "Duration of pod worker operations (terminating: stopping containers and sandboxes; terminated: cleanup)",
            m.pod_worker_duration.clone(),
        );
        registry.register(
            "working_pods",
            "Pods known to the agent by lifecycle state and source",
            m.working_pods.clone(),
        );
        registry.register(
            "orphaned_runtime_pods",
            "Runtime pods found with no pod object (stopped with grace 1)",
            m.orphaned_runtime_pods.clone(),
        );
        registry.register(
            "runtime_relists",
            "Runtime relists (each a ListPodSandbox and a ListContainers call) by scope: full, or one pod's for a container event",
            m.runtime_relists.clone(),
        );
        registry.register(
            "runtime_operations",
            "CRI calls by operation",
            m.runtime_operations.clone(),
        );
        registry.register(
            "runtime_operations_duration_seconds",
            "CRI call latency by operation",
            m.runtime_operations_duration.clone(),
        );
        registry.register(
            "runtime_operations_errors",
            "Failed CRI calls by operation",
            m.runtime_operations_errors.clone(),
        );
        registry.register(
            "cgroup_manager_duration_seconds",
            "Pod cgroup operations",
            m.cgroup_manager_duration.clone(),
        );
        registry.register(
            "pod_status_sync_duration_seconds",
            "Terminal status patch latency",
            m.pod_status_sync_duration.clone(),
        );
        registry.register(
            "termination_duration_seconds",
            "SLI: from the deletion being observed to the pod object being gone",
            m.termination_duration.clone(),
        );
        registry.register(
            "termination_stage_duration_seconds",
            "Parts of the termination: kill, volumes, cgroup, status, delete",
            m.termination_stage_duration.clone(),
        );
        registry.register(
            "events_dropped",
            "Pod events dropped because the event queue was full",
            m.events_dropped.clone(),
        );
        registry.register(
            "pods_exceeded_grace_period",
            "Pod kills the runtime had not finished 10 s after their grace period (an ExceededGracePeriod event each)",
            m.exceeded_grace_period.clone(),
        );
        registry.register(
            "container_runtime_unhealthy",
            "1 while the container runtime has answered no relist for the unhealthy threshold (readiness fails meanwhile)",
            m.runtime_unhealthy.clone(),
        );
        registry.register(
            "evictions",
            "What this node's eviction sources (NoExecute taints, required node affinity) did, by source and outcome",
            m.evictions.clone(),
        );
        registry.register(
            "graceful_shutdown_start_time_seconds",
            "Last graceful node shutdown start time (Unix seconds; 0: none seen)",
            m.graceful_shutdown_start_time.clone(),
        );
        registry.register(
            "graceful_shutdown_end_time_seconds",
            "Last graceful node shutdown end time (Unix seconds; 0: none finished)",
            m.graceful_shutdown_end_time.clone(),
        );
        registry.register(
            "graceful_shutdown_inhibitor_held",
            "1 while reaplet holds its logind delay inhibitor (graceful node shutdown configured, reaplet active, logind reachable)",
            m.graceful_shutdown_inhibitor.clone(),
        );
        registry.register(
            "tracing_spans_dropped",
            "Spans the OpenTelemetry trace export dropped, by reason: queue_full (the export queue was full when the span ended), export_failed (its export failed or timed out), shutdown (it ended after the export stopped, or was unexported at the stop's deadline)",
            m.tracing_spans_dropped.clone(),
        );
        for reason in SPAN_DROP_REASONS {
            m.tracing_spans_dropped
                .get_or_create(&SpanDropLabel { reason })
                .inc_by(0);
        }
        registry.register(
            "node_identity_problem",
            "1 while reaplet's node name is known to be wrong, by problem: pod_bound_elsewhere (a runtime pod's object is bound to another node: no orphan is ended), node_missing (no Node under the name while the kubelet's health endpoint answers), lease_missing (the Node exists, its Lease does not)",
            m.node_identity_problem.clone(),
        );
        registry.register(
            "standby_active",
            "1 while reaplet is the node's acting agent (primary, or standby after a takeover: it ends pods), 0 while it stands by beside a kubelet",
            m.standby_active.clone(),
        );
        registry.register(
            "standby_takeovers",
            "Takeovers from the kubelet since the start (the Node events ReapletTookOver)",
            m.standby_takeovers.clone(),
        );
        registry.register(
            "standby_handbacks",
            "Hand-backs to the kubelet since the start (the Node events ReapletHandedBack)",
            m.standby_handbacks.clone(),
        );
        registry.register(
            "node_pressure_evictions",
            "Pods evicted for node pressure while reaplet is the node's agent, by the kubelet's eviction signal (kubelet_evictions)",
            m.pressure_evictions.clone(),
        );
        registry.register(
            "node_pressure",
            "1 while a node pressure condition holds (MemoryPressure, DiskPressure, PIDPressure), as the kubelet's eviction manager sets it; evaluated only while reaplet is the node's agent",
            m.node_pressure.clone(),
        );
        for condition in PRESSURE_CONDITIONS {
            m.node_pressure
                .get_or_create(&ConditionLabel { condition })
                .set(0);
        }
        for problem in IdentityProblem::ALL {
            m.node_identity_problem
                .get_or_create(&IdentityProblemLabel {
                    problem: problem.as_str(),
                })
                .set(0);
        }
        Metrics { registry, ..m }
    }

    /// The metrics in `format`.
    pub fn encode(&self, format: Exposition) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        match format {
            Exposition::OpenMetrics => out,
            Exposition::Prometheus => openmetrics_to_prometheus(&out),
        }
    }

    pub fn runtime_call(&self, op: &'static str, took: Duration, ok: bool) {
        let l = OpLabel { operation_type: op };
        self.runtime_operations.get_or_create(&l).inc();
        self.runtime_operations_duration
            .get_or_create(&l)
            .observe(took.as_secs_f64());
        if !ok {
            self.runtime_operations_errors.get_or_create(&l).inc();
        }
    }

    pub fn stage(&self, stage: &'static str, took: Duration) {
        self.termination_stage_duration
            .get_or_create(&StageLabel { stage })
            .observe(took.as_secs_f64());
    }

    /// A deletion was observed for the pod `uid` (the SLI starts).
    pub fn termination_started(&self, uid: &str) {
        self.started
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(uid.to_owned())
            .or_insert_with(Instant::now);
    }

    /// The pod object is gone (the SLI ends).
    pub fn termination_finished(&self, uid: &str) {
        let start = self
            .started
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(uid);
        if let Some(s) = start {
            self.termination_duration.observe(s.elapsed().as_secs_f64());
        }
    }

    /// A standby decision's role (`active`) and whether it changed: the role gauge, and the
    /// takeover or hand-back counted.
    pub fn set_standby_role(&self, active: bool, changed: bool) {
        self.standby_active.set(i64::from(active));
        match (changed, active) {
            (true, true) => self.standby_takeovers.inc(),
            (true, false) => self.standby_handbacks.inc(),
            (false, _) => 0,
        };
    }

    /// Counts one node-pressure eviction for `signal`.
    pub fn pressure_eviction(&self, signal: &'static str) {
        self.pressure_evictions
            .get_or_create(&SignalLabel {
                eviction_signal: signal,
            })
            .inc();
    }

    /// Sets `reaplet_node_pressure{condition}` (one of [`PRESSURE_CONDITIONS`]).
    pub fn set_node_pressure(&self, condition: &'static str, on: bool) {
        self.node_pressure
            .get_or_create(&ConditionLabel { condition })
            .set(i64::from(on));
    }

    /// Sets `reaplet_node_identity_problem{problem}`.
    pub fn set_identity_problem(&self, problem: IdentityProblem, on: bool) {
        self.node_identity_problem
            .get_or_create(&IdentityProblemLabel {
                problem: problem.as_str(),
            })
            .set(i64::from(on));
    }

    /// Sets the working-pods gauges: each `((lifecycle, config), n)` of `counts`. The caller
    /// gives every combination, its zeros included, so none is ever absent.
    pub fn set_working_pods(
        &self,
        counts: impl IntoIterator<Item = ((&'static str, &'static str), i64)>,
    ) {
        for ((lifecycle, config), n) in counts {
            self.working_pods
                .get_or_create(&WorkingLabels { lifecycle, config })
                .set(n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn sli_and_names() {
        let m = Metrics::new();
        m.termination_started("u1");
        tokio::time::advance(Duration::from_millis(300)).await;
        m.termination_finished("u1");
        m.termination_finished("u1"); // once only
        m.runtime_call("StopContainer", Duration::from_millis(3), false);
        let text = m.encode(Exposition::OpenMetrics);
        assert!(
            text.contains("reaplet_termination_duration_seconds_count 1"),
            "{text}"
        );
        assert!(
            text.contains(
                "reaplet_runtime_operations_errors_total{operation_type=\"StopContainer\"} 1"
            ),
            "{text}"
        );
        assert!(!text.contains("u1"), "no pod identity in labels");
    }

    /// What the Prometheus 0.0.4 text parser (`expfmt.TextParser`) insists on: one `# TYPE`
    /// per family, before its samples, naming them (a histogram's samples add `_bucket`,
    /// `_sum`, `_count`); no OpenMetrics-only lines.
    fn assert_prometheus_text(text: &str) {
        let mut typed = HashSet::new();
        let mut current: Option<(String, String)> = None;
        for line in text.lines() {
            assert!(
                !line.starts_with("# EOF") && !line.starts_with("# UNIT"),
                "{line}"
            );
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                assert!(
                    ["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind),
                    "{line}"
                );
                assert!(typed.insert(name.to_owned()), "second TYPE for {name}");
                current = Some((name.to_owned(), kind.to_owned()));
                continue;
            }
            if line.starts_with('#') || line.is_empty() {
                continue;
            }
            let name = line.split(['{', ' ']).next().unwrap();
            let (family, kind) = current.as_ref().expect("a sample before any TYPE");
            let ok = match kind.as_str() {
                "histogram" => ["_bucket", "_sum", "_count"]
                    .iter()
                    .any(|s| name == format!("{family}{s}")),
                _ => name == family,
            };
            assert!(ok, "sample {name} under TYPE {family} {kind}");
        }
    }

    use std::collections::HashSet;

    #[test]
    fn prometheus_text_is_the_openmetrics_samples_with_0_0_4_metadata() {
        let m = Metrics::new();
        m.runtime_call("StopContainer", Duration::from_millis(3), false);
        m.stage("kill", Duration::from_millis(30));
        m.orphaned_runtime_pods.inc();
        let om = m.encode(Exposition::OpenMetrics);
        let text = m.encode(Exposition::Prometheus);
        assert!(om.ends_with("# EOF\n"), "{om}");
        assert_prometheus_text(&text);
        let samples = |t: &str| -> Vec<String> {
            t.lines()
                .filter(|l| !l.starts_with('#'))
                .map(str::to_owned)
                .collect()
        };
        assert_eq!(samples(&om), samples(&text), "the same samples in both");
        assert!(text.contains("# HELP reaplet_orphaned_runtime_pods_total Runtime pods"));
        assert!(text.contains("# TYPE reaplet_orphaned_runtime_pods_total counter"));
        assert!(text.contains("reaplet_orphaned_runtime_pods_total 1"));
        assert!(text.contains("# TYPE reaplet_termination_duration_seconds histogram"));
        // the conversion itself, on the OpenMetrics-only forms
        let converted = openmetrics_to_prometheus(
            "# HELP x_seconds A.\n# TYPE x_seconds unknown\n# UNIT x_seconds seconds\nx_seconds 1\n\
             # HELP c_total Already suffixed.\n# TYPE c_total counter\nc_total 2\n# EOF\n",
        );
        assert_eq!(
            converted,
            "# HELP x_seconds A.\n# TYPE x_seconds untyped\nx_seconds 1\n\
             # HELP c_total Already suffixed.\n# TYPE c_total counter\nc_total 2\n"
        );
    }

    /// Every gauge of the registry's own is there before any pod, at 0 (the runtime's health,
    /// the span drops, the identity problems); the working-pods gauges are set as given
    /// (their owner's test: `workers::tests::working_pods_gauges_are_present_at_zero`).
    #[test]
    fn every_gauge_is_present_at_zero() {
        let m = Metrics::new();
        for format in [Exposition::Prometheus, Exposition::OpenMetrics] {
            let text = m.encode(format);
            assert!(
                text.contains("reaplet_container_runtime_unhealthy 0"),
                "{text}"
            );
            for reason in SPAN_DROP_REASONS {
                let line = format!("reaplet_tracing_spans_dropped_total{{reason=\"{reason}\"}} 0");
                assert!(text.contains(&line), "{line} missing:\n{text}");
            }
            for problem in IdentityProblem::ALL {
                let line = format!(
                    "reaplet_node_identity_problem{{problem=\"{}\"}} 0",
                    problem.as_str()
                );
                assert!(text.contains(&line), "{line} missing:\n{text}");
            }
        }
        m.set_identity_problem(IdentityProblem::PodBoundElsewhere, true);
        let text = m.encode(Exposition::Prometheus);
        assert!(text.contains("reaplet_node_identity_problem{problem=\"pod_bound_elsewhere\"} 1"));
        // the label set stays bounded: exactly one series per problem
        let series = text
            .lines()
            .filter(|l| l.starts_with("reaplet_node_identity_problem{"))
            .count();
        assert_eq!(series, IdentityProblem::ALL.len(), "{text}");
        m.set_working_pods([(("terminating", "api"), 3)]);
        let text = m.encode(Exposition::Prometheus);
        assert!(text.contains("reaplet_working_pods{lifecycle=\"terminating\",config=\"api\"} 3"));
        m.set_working_pods([(("terminating", "api"), 0)]);
        let text = m.encode(Exposition::Prometheus);
        assert!(text.contains("reaplet_working_pods{lifecycle=\"terminating\",config=\"api\"} 0"));
    }
}
