//! Metrics: the kubelet's termination-path metric names (reference §7) with a `reaplet_`
//! prefix, plus reaplet's termination-latency SLI and its stages.
//!
//! Invariants: label sets are bounded (operation types, lifecycle states, sources, stages:
//! never a pod name or UID); recording never blocks (atomic updates, one short lock for the
//! SLI start times).

use crate::pod::PodUid;
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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WorkingLabels {
    pub lifecycle: &'static str,
    pub config: &'static str,
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

pub struct Metrics {
    registry: Registry,
    pub pod_worker_duration: Family<OpLabel, Histogram, fn() -> Histogram>,
    pub working_pods: Family<WorkingLabels, Gauge>,
    pub orphaned_runtime_pods: Counter,
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
    started: Mutex<HashMap<PodUid, Instant>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("reaplet");
        let m = Metrics {
            pod_worker_duration: Family::new_with_constructor(new_hist),
            working_pods: Family::default(),
            orphaned_runtime_pods: Counter::default(),
            runtime_operations: Family::default(),
            runtime_operations_duration: Family::new_with_constructor(new_hist),
            runtime_operations_errors: Family::default(),
            cgroup_manager_duration: Family::new_with_constructor(new_hist),
            pod_status_sync_duration: new_hist(),
            termination_duration: new_hist(),
            termination_stage_duration: Family::new_with_constructor(new_hist),
            events_dropped: Counter::default(),
            exceeded_grace_period: Counter::default(),
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
        Metrics { registry, ..m }
    }

    /// Prometheus text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
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

    /// A deletion was observed for `uid` (the SLI starts).
    pub fn termination_started(&self, uid: &PodUid) {
        self.started
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(uid.clone())
            .or_insert_with(Instant::now);
    }

    /// The pod object is gone (the SLI ends).
    pub fn termination_finished(&self, uid: &PodUid) {
        let start = self
            .started
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(uid);
        if let Some(s) = start {
            self.termination_duration.observe(s.elapsed().as_secs_f64());
        }
    }

    /// Forgets an SLI start that will never finish (pod not deleted through the API).
    pub fn termination_abandoned(&self, uid: &PodUid) {
        self.started
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(uid);
    }

    /// Replaces the working-pods gauges with `counts`.
    pub fn set_working_pods(&self, counts: &HashMap<(&'static str, &'static str), i64>) {
        self.working_pods.clear();
        for ((lifecycle, config), n) in counts {
            self.working_pods
                .get_or_create(&WorkingLabels { lifecycle, config })
                .set(*n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn sli_and_names() {
        let m = Metrics::new();
        let uid = PodUid::parse("u1").unwrap();
        m.termination_started(&uid);
        tokio::time::advance(Duration::from_millis(300)).await;
        m.termination_finished(&uid);
        m.termination_finished(&uid); // once only
        m.runtime_call("StopContainer", Duration::from_millis(3), false);
        let text = m.encode();
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
}
