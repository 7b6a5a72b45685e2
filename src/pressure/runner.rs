//! The eviction manager's task (kubelet counterpart: `eviction_manager.go: Start`, its
//! monitoring loop, `evictPod` and `waitForPodsCleanup`).
//!
//! Invariants:
//! * nothing runs while reaplet is not the node's agent: a passive standby reads no signal,
//!   keeps no pod and no pass state (a takeover starts the kubelet's fresh manager);
//! * a pass every second ([`SAMPLE`]: the kubelet's is every 10 s, its memcg notifier off on
//!   cgroup v2), each reading a handful of small files ([`super::signals`]), so a crossing is
//!   noticed within a second; the decisions are the kubelet's ([`super::manager`]), so no more
//!   is evicted than it would: one pod per pass, and after an eviction the next pass only once
//!   that pod is cleaned up (polled every second, at most 30 s, as the kubelet);
//! * a pod's usage is read only when a pass must rank (each pod's cgroup), its containers'
//!   only for the pod evicted (one container listing);
//! * the kill is the kubelet's: through the one seam, grace 1 s for a hard threshold (the
//!   runtime still gets its 2 s floor per container), `min(evictionMaxPodGracePeriod, the
//!   pod's own)` for a soft one, only-shorter for a pod already terminating; the status is
//!   [`Requester::NodePressure`]'s; the Warning `Evicted` event with the kubelet's
//!   annotations; the node's Warning `EvictionThresholdMet` ("Attempting to reclaim <resource>")
//!   at most once per [`NODE_EVENT_EVERY`] (the kubelet's once per 10 s pass);
//! * critical pods (static, mirror, priority ≥ 2,000,000,000) and reaplet's own pod are
//!   ranked but never evicted; one log line per decision, never per pass.

use super::manager::{Manager, NodeCondition, PressureSettings, Reclaim};
use super::rank::{self, Candidate, PodStats};
use super::signals::SignalReader;
use super::thresholds::Resource;
use crate::authority::Authority;
use crate::cgroups::CgroupNaming;
use crate::cri::Runtime;
use crate::events::{EventReason, EventSink, NodeEventReason, PodEvent};
use crate::eviction::PodChange;
use crate::lifecycle::{KillReason, PodPhase, Requester};
use crate::metrics::Metrics;
use crate::pod::{PodInfo, PodUid};
use crate::workers::{KillRequest, PodWorkers};
use k8s_openapi::api::core::v1::Pod;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;

/// How often a pass runs while acting.
pub const SAMPLE: Duration = Duration::from_secs(1);
/// The kubelet's `podCleanupTimeout` and `podCleanupPollFreq`.
pub const CLEANUP_TIMEOUT: Duration = Duration::from_secs(30);
pub const CLEANUP_POLL: Duration = Duration::from_secs(1);
/// The node's `EvictionThresholdMet` event at most this often.
pub const NODE_EVENT_EVERY: Duration = Duration::from_secs(10);
/// The `DisruptionTarget` reason of the kubelet's own ends.
pub const DISRUPTION: &str = "TerminationByKubelet";
/// The status reason.
pub const REASON: &str = "Evicted";

/// What the task needs.
pub struct Context<R: Runtime> {
    pub workers: PodWorkers<R>,
    pub runtime: Arc<R>,
    pub events: EventSink,
    pub metrics: Option<Arc<Metrics>>,
    pub authority: Arc<Authority>,
    pub reader: SignalReader,
    pub naming: CgroupNaming,
    pub settings: PressureSettings,
    /// reaplet's own pod: never evicted.
    pub own_pod: Option<PodUid>,
}

struct Runner<R: Runtime> {
    cx: Context<R>,
    /// This node's API pods, as the API source last delivered them (acting only).
    pods: HashMap<PodUid, Arc<Pod>>,
    manager: Option<Manager>,
    last_node_event: Option<Instant>,
    /// The last "nothing to evict" reason logged, so that it is logged once.
    stuck: Option<&'static str>,
    conditions: Vec<NodeCondition>,
}

/// Runs until cancelled: a pass every [`SAMPLE`] while acting.
pub async fn run<R: Runtime>(
    cx: Context<R>,
    mut pods_rx: mpsc::UnboundedReceiver<PodChange>,
    cancel: CancellationToken,
) {
    let mut authority = cx.authority.changes();
    let mut r = Runner {
        cx,
        pods: HashMap::new(),
        manager: None,
        last_node_event: None,
        stuck: None,
        conditions: Vec::new(),
    };
    let mut next = Instant::now();
    let mut feed_open = true;
    loop {
        let active = r.cx.authority.is_active();
        if !active && r.manager.is_some() {
            r.standby();
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            ch = pods_rx.recv(), if feed_open => match ch {
                Some(ch) => r.pods_changed(ch),
                None => feed_open = false,
            },
            c = authority.changed() => {
                if c.is_err() {
                    return;
                }
                next = Instant::now();
            }
            _ = sleep_until(next), if active => {
                if let Some(uid) = r.pass().await {
                    r.wait_cleanup(&uid, &cancel, &mut pods_rx).await;
                    // after a cleanup, the next pass at once (the kubelet's loop)
                    next = Instant::now();
                } else {
                    next = Instant::now() + SAMPLE;
                }
            }
        }
    }
}

impl<R: Runtime> Runner<R> {
    /// Back to standby: nothing kept.
    fn standby(&mut self) {
        self.manager = None;
        self.pods.clear();
        self.pods.shrink_to_fit();
        self.stuck = None;
        self.set_conditions(Vec::new());
    }

    fn pods_changed(&mut self, ch: PodChange) {
        if !self.cx.authority.is_active() {
            return;
        }
        match ch {
            PodChange::Listed(pods) => {
                self.pods = pods
                    .into_iter()
                    .filter_map(|p| Some((pod_uid(&p)?, p)))
                    .collect();
            }
            PodChange::Apply(p) => {
                if let Some(uid) = pod_uid(&p) {
                    self.pods.insert(uid, p);
                }
            }
            PodChange::Gone(uid) => {
                self.pods.remove(&uid);
            }
        }
    }

    fn set_conditions(&mut self, conditions: Vec<NodeCondition>) {
        if conditions == self.conditions {
            return;
        }
        for c in NodeCondition::ALL {
            let (was, is) = (self.conditions.contains(&c), conditions.contains(&c));
            if was != is {
                tracing::info!(condition = c.as_str(), on = is, "node pressure condition");
            }
            if let Some(m) = &self.cx.metrics {
                m.set_node_pressure(c.as_str(), is);
            }
        }
        self.conditions = conditions;
    }

    /// One pass; the pod evicted, if one was.
    async fn pass(&mut self) -> Option<PodUid> {
        let manager = self
            .manager
            .get_or_insert_with(|| Manager::new(self.cx.settings.clone()));
        let obs = self.cx.reader.observe();
        let pass = manager.synchronize(Instant::now(), &obs);
        self.set_conditions(pass.conditions);
        let Some(reclaim) = pass.reclaim else {
            self.stuck = None;
            return None;
        };
        let now = Instant::now();
        if self
            .last_node_event
            .is_none_or(|t| now.duration_since(t) >= NODE_EVENT_EVERY)
        {
            self.last_node_event = Some(now);
            self.cx.events.record_node(
                NodeEventReason::EvictionThresholdMet,
                &format!("Attempting to reclaim {}", reclaim.resource.as_str()),
            );
        }
        let (mut candidates, cgroups) = self.candidates();
        if candidates.is_empty() {
            self.stuck_once("no pod to evict: the node has none active");
            return None;
        }
        match reclaim.resource {
            Resource::Pids => rank::rank_pids(&mut candidates),
            _ => rank::rank_memory(&mut candidates),
        }
        let order: Vec<String> = candidates
            .iter()
            .map(|c| format!("{}/{}", c.namespace, c.name))
            .collect();
        let victim = candidates
            .iter()
            .find(|c| !c.critical && self.cx.own_pod.as_ref() != Some(&c.uid));
        let Some(victim) = victim else {
            self.stuck_once("unable to evict any pod: every candidate is critical");
            return None;
        };
        self.stuck = None;
        let mut victim = victim.clone();
        // the message blames containers for memory only: read theirs for the victim alone
        if reclaim.resource == Resource::Memory
            && let (Some(stats), Some(rel)) = (victim.stats.as_mut(), cgroups.get(&victim.uid))
        {
            stats.containers = self.container_usage(&victim.uid, rel).await;
        }
        self.evict(&reclaim, &victim, &order);
        Some(victim.uid)
    }

    fn stuck_once(&mut self, why: &'static str) {
        if self.stuck != Some(why) {
            tracing::warn!(why, "node pressure: threshold met");
            self.stuck = Some(why);
        }
    }

    /// The kubelet's active pods (not stopped, terminating ones included) that have an API
    /// object, with their pod-level usage read now (what ranking reads).
    /// Also each candidate's pod cgroup (relative to the memory hierarchy).
    fn candidates(&self) -> (Vec<Candidate>, HashMap<PodUid, PathBuf>) {
        let active: Vec<PodInfo> = self.cx.workers.active_pods();
        let mut out = Vec::with_capacity(active.len());
        let mut cgroups = HashMap::with_capacity(active.len());
        for info in &active {
            let Some(pod) = self.pods.get(&info.uid) else {
                continue;
            };
            let mut c = match rank::candidate(pod) {
                Ok(c) => c,
                Err(e) => {
                    tracing::debug!(err = %e, "pod not ranked");
                    continue;
                }
            };
            let rel = self.cx.naming.pod_cgroup(&info.uid, info.qos);
            c.stats = self.cx.reader.pod_usage(&rel).map(|u| PodStats {
                working_set: u.working_set,
                processes: u.processes,
                containers: Vec::new(),
            });
            cgroups.insert(info.uid.clone(), rel);
            out.push(c);
        }
        (out, cgroups)
    }

    /// Each running container's working set, matched to its name through one listing of the
    /// pod's containers.
    async fn container_usage(&self, uid: &PodUid, rel: &Path) -> Vec<(String, u64)> {
        let Ok(cs) = self.cx.runtime.list_containers(Some(uid.as_str())).await else {
            return Vec::new();
        };
        let mut latest: Vec<&crate::cri::RuntimeContainer> = Vec::new();
        for c in cs.iter().filter(|c| c.state.may_run()) {
            if !latest.iter().any(|l| l.name == c.name) {
                latest.push(c);
            }
        }
        latest
            .into_iter()
            .filter_map(|c| {
                let ws = container_working_set(&self.cx.reader, rel, &c.id)?;
                Some((c.name.clone(), ws))
            })
            .collect()
    }

    fn evict(&self, reclaim: &Reclaim, victim: &Candidate, order: &[String]) {
        let resource = reclaim.resource.as_str();
        let msg = rank::eviction_message(
            resource,
            victim,
            Some((reclaim.quantity_text.clone(), reclaim.observed.available)),
        );
        let spec_grace = self.pods.get(&victim.uid).and_then(|p| {
            p.spec
                .as_ref()
                .and_then(|s| s.termination_grace_period_seconds)
        });
        let grace = self
            .manager
            .as_ref()
            .map_or(1, |m| m.pod_grace(reclaim, spec_grace));
        tracing::info!(
            pod = %format_args!("{}/{}", victim.namespace, victim.name),
            podUID = %victim.uid,
            signal = reclaim.signal.as_str(),
            hard = reclaim.hard,
            available = reclaim.observed.available,
            threshold = %reclaim.quantity_text,
            gracePeriod = grace,
            ranked = ?order,
            "node pressure: evicting a pod"
        );
        self.cx.events.record(PodEvent {
            uid: victim.uid.clone(),
            namespace: victim.namespace.clone(),
            name: victim.name.clone(),
            reason: EventReason::Evicted,
            message: msg.message.clone(),
            annotations: msg.annotations,
        });
        let req = KillRequest::new(KillReason::Requested {
            by: Requester::NodePressure,
            disruption: Some(DISRUPTION.into()),
            reason: Some(REASON.into()),
            message: msg.message,
        })
        .grace(Some(grace));
        if let Err(e) = self.cx.workers.kill(&victim.uid, req) {
            tracing::warn!(podUID = %victim.uid, err = %e, "node pressure: the kill was refused");
        }
        if let Some(m) = &self.cx.metrics {
            m.pressure_eviction(reclaim.signal.as_str());
        }
    }

    /// `waitForPodsCleanup`: until the pod's worker has finished (containers, volumes and
    /// cgroup cleaned up) or is gone, polled every second, at most [`CLEANUP_TIMEOUT`]; pod
    /// changes keep being applied meanwhile.
    async fn wait_cleanup(
        &mut self,
        uid: &PodUid,
        cancel: &CancellationToken,
        pods_rx: &mut mpsc::UnboundedReceiver<PodChange>,
    ) {
        let until = Instant::now() + CLEANUP_TIMEOUT;
        let mut poll = Instant::now() + CLEANUP_POLL;
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                Some(ch) = pods_rx.recv() => self.pods_changed(ch),
                _ = sleep_until(poll) => {
                    let done = self
                        .cx
                        .workers
                        .view(uid)
                        .is_none_or(|v| v.phase == PodPhase::Finished);
                    if done || Instant::now() >= until || !self.cx.authority.is_active() {
                        if !done {
                            tracing::info!(podUID = %uid, "node pressure: the evicted pod is not cleaned up after 30s; going on");
                        }
                        return;
                    }
                    poll = Instant::now() + CLEANUP_POLL;
                }
            }
        }
    }
}

fn pod_uid(p: &Pod) -> Option<PodUid> {
    PodUid::parse(p.metadata.uid.as_deref()?).ok()
}

/// A container's working set, from its cgroup below the pod's: `<id>` (cgroupfs) or
/// `cri-containerd-<id>.scope` (systemd).
fn container_working_set(reader: &SignalReader, pod_rel: &Path, id: &str) -> Option<u64> {
    [id.to_owned(), format!("cri-containerd-{id}.scope")]
        .iter()
        .find_map(|name| reader.pod_usage(&pod_rel.join(name))?.working_set)
}
