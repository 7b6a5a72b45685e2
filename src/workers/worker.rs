//! The owner task of one pod UID: kubelet's `podWorkerLoop` with `SyncTerminatingPod` and
//! `SyncTerminatedPod` (`pod_workers.go`). It feeds what happens (mail, a kill or cleanup
//! ending, a timer) to [`lifecycle::step`] and carries out the effects.
//!
//! Invariants:
//! * all of a pod's state is in one [`Worker`]; only this task changes it;
//! * a kill or cleanup runs as a future owned by the worker: a shorter grace drops the
//!   in-flight kill (and its CRI calls) and starts a new one at once;
//! * a kill retried after a failed attempt counts down to the first attempt's deadline
//!   ([`DeadlineOrigin::FirstAttempt`]), never granting the whole grace again; a container
//!   the failed attempts never sent a stop still gets its hook and SIGTERM (`kill`);
//! * `ExceededGracePeriod` is armed when the kill first starts (earlier for a shorter grace),
//!   survives failed attempts and their retries, and is reported once;
//! * cancellation of reaplet abandons the work where it is: the pod is left as it is.

use super::registry::Mailbox;
use super::{CleanupError, Inner, PodView, Step};
use crate::cri::Runtime;
use crate::deadline::{Deadline, DeadlineOrigin, saturating_add};
use crate::events::{EventReason, PodEvent};
use crate::lifecycle::{self, CleanupStage, Effect, Input, KillReason, PodMachine, PodPhase};
use crate::metrics::{Metrics, OpLabel};
use crate::pod::PodInfo;
use crate::status::ContainerFinal;
use crate::terminating::grace;
use crate::terminating::kill::{self, KillMemory};
use crate::terminating::records::RecordFile;
use crate::timeline::{Recorder, Step as TlStep};
use crate::volumes;
use futures_util::future::BoxFuture;
use rand::Rng;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::time::{Instant, Sleep};
use tracing::Instrument;

type KillFuture = BoxFuture<'static, (u64, Result<kill::KillReport, kill::KillError>)>;
type CleanupFuture = BoxFuture<'static, (CleanupStage, Result<(), CleanupError>)>;

async fn poll_opt<F: Future + Unpin>(f: &mut Option<F>) -> F::Output {
    match f {
        Some(f) => f.await,
        None => std::future::pending().await,
    }
}

/// Waits for the alarm, if one is set.
async fn ring(alarm: &mut Option<(Pin<Box<Sleep>>, Deadline)>) {
    match alarm {
        Some((sleep, _)) => sleep.as_mut().await,
        None => std::future::pending().await,
    }
}

/// Everything one pod's worker knows and owns.
struct Worker<R> {
    inner: Arc<Inner<R>>,
    view: Arc<Mutex<PodView>>,
    pod: PodInfo,
    m: PodMachine,
    memory: Arc<KillMemory>,
    kill: Option<KillFuture>,
    cleanup: Option<CleanupFuture>,
    retry: Option<Pin<Box<Sleep>>>,
    /// The last kill was held by the authority check (standby): no retry timer, the worker
    /// waits for the agent to become active.
    held: bool,
    /// The ExceededGracePeriod alarm and when it rings.
    overdue: Option<(Pin<Box<Sleep>>, Deadline)>,
    overdue_reported: bool,
    /// When the current kill began, and with what grace (cleared when a kill succeeds).
    first_attempt: Option<(Instant, i64)>,
    notices: Vec<oneshot::Sender<()>>,
    step: Step,
    finals: Vec<ContainerFinal>,
    metrics: Option<Arc<Metrics>>,
    phase_started: Instant,
    finished: bool,
    /// The volume teardown's memory (failed unmounts and their backoff), shared with the
    /// cleanup future (locked only inside a synchronous pass).
    volumes: Arc<Mutex<volumes::TeardownState>>,
    /// The volumes outlived `volumeUnmountTimeout` and were reported: the pod is skipped
    /// (not deleted, its cgroup kept) and only rechecked once per retry.
    volumes_skipped: bool,
    /// The termination's timeline (none until a reason to end the pod arrives).
    tl: Recorder,
    /// The termination's root trace span (`pod_termination`; disabled until then), the
    /// parent of its stages' spans.
    trace: tracing::Span,
}

/// The owner task of one pod UID.
pub(super) async fn worker_loop<R: Runtime>(
    inner: Arc<Inner<R>>,
    mailbox: Arc<Mailbox>,
    view: Arc<Mutex<PodView>>,
    pod: PodInfo,
) {
    let record = RecordFile::for_pod(&inner.config.root_dir, &pod.uid);
    let memory = Arc::new(KillMemory::load(record).await);
    let mut w = Worker {
        metrics: inner.metrics.get().cloned(),
        m: PodMachine::new(pod.spec_grace),
        inner,
        view,
        pod,
        memory,
        kill: None,
        cleanup: None,
        retry: None,
        held: false,
        overdue: None,
        overdue_reported: false,
        first_attempt: None,
        notices: Vec::new(),
        step: Step::Starting,
        finals: Vec::new(),
        phase_started: Instant::now(),
        finished: false,
        volumes: Arc::default(),
        volumes_skipped: false,
        tl: Recorder::none(),
        trace: tracing::Span::none(),
    };
    let cancel = w.inner.cancel.clone();
    // a kill held by the authority check retries at once when the agent becomes active
    let mut authority = w.inner.authority.changes();
    authority.mark_unchanged();
    let mut authority_open = true;
    loop {
        let inputs = tokio::select! {
            biased;
            _ = cancel.cancelled() => {
                tracing::debug!("pod worker stopping with the agent; the pod is left as it is");
                return;
            }
            _ = mailbox.notify.notified() => w.take_mail(&mailbox),
            (generation, r) = poll_opt(&mut w.kill) => w.kill_done(generation, r),
            (stage, r) = poll_opt(&mut w.cleanup) => w.cleanup_done(stage, r),
            _ = poll_opt(&mut w.retry) => {
                w.retry = None;
                vec![Input::RetryDue]
            }
            r = authority.changed(), if authority_open && (w.held || w.retry.is_some()) => match r {
                Ok(()) if *authority.borrow_and_update() => {
                    w.retry = None;
                    w.held = false;
                    vec![Input::RetryDue]
                }
                Ok(()) => Vec::new(),
                Err(_) => {
                    authority_open = false;
                    Vec::new()
                }
            },
            _ = ring(&mut w.overdue) => w.report_overdue(),
        };
        for input in inputs {
            w.apply(input);
        }
        // standby released it (another agent ended its pod): a held kill ends here, unacted
        if w.held && mailbox.lock().released {
            w.release();
            mailbox.close();
            tracing::info!("pod worker released: its pod was ended by the node's active agent");
            return;
        }
        w.publish();
        if w.finished {
            // before the mailbox closes: a new worker for the UID never reads a record half gone
            w.memory.forget().await;
            mailbox.close();
            tracing::info!("pod worker finished");
            return;
        }
    }
}

impl<R: Runtime> Worker<R> {
    /// Nothing of this termination was this agent's: its timeline and trace are dropped and
    /// its notices complete.
    fn release(&mut self) {
        self.inner.timelines.discard(&self.pod.uid);
        self.trace = tracing::Span::none();
        for n in self.notices.drain(..) {
            let _ = n.send(());
        }
    }

    fn take_mail(&mut self, mailbox: &Mailbox) -> Vec<Input> {
        let mut inputs = Vec::new();
        let mut p = mailbox.lock();
        if let Some(mut newer) = p.update.take() {
            inputs.push(Input::Update {
                deletion_requested: newer.deletion_requested,
                deletion_grace: newer.deletion_grace,
                terminal_phase: newer.terminal_phase,
                spec_grace: newer.spec_grace,
            });
            // a resumed termination's deadline outlives later updates of the object
            newer.kill_deadline = Deadline::earliest(newer.kill_deadline, self.pod.kill_deadline);
            self.pod = newer;
        }
        for k in p.kills.drain(..) {
            if let Some(done) = k.done {
                self.notices.push(done);
            }
            inputs.push(Input::Kill {
                grace_override: k.grace_override,
                reason: k.reason,
            });
        }
        inputs
    }

    fn event(&self, reason: EventReason, message: String) {
        self.inner.events.record(PodEvent {
            uid: self.pod.uid.clone(),
            namespace: self.pod.namespace.clone(),
            name: self.pod.name.clone(),
            reason,
            message,
            annotations: Default::default(),
        });
    }

    fn kill_done(
        &mut self,
        generation: u64,
        r: Result<kill::KillReport, kill::KillError>,
    ) -> Vec<Input> {
        self.kill = None;
        match &r {
            Ok(rep) => {
                self.overdue = None;
                self.first_attempt = None;
                tracing::info!(
                    containers = rep.containers_stopped,
                    sandboxes = rep.sandboxes_stopped,
                    "pod containers and sandboxes stopped"
                );
                self.tl.record(None, TlStep::ContainersStopped);
                self.finals = rep.finals.clone();
            }
            // a standby refusal is not a failure worth an event, nor a retry timer: the worker
            // parks until the agent becomes active (the authority branch of its loop)
            Err(e @ kill::KillError::Refused(_)) => {
                tracing::debug!(err = %e, "kill held by the authority check");
                self.held = true;
            }
            Err(e) => {
                tracing::warn!(err = %e, "killing pod failed; will retry");
                self.tl.record(
                    None,
                    TlStep::KillFailed {
                        error: e.to_string(),
                    },
                );
                self.event(
                    EventReason::FailedKillPod,
                    format!("error killing pod: {e}"),
                );
            }
        }
        vec![Input::KillDone {
            generation,
            ok: r.is_ok(),
        }]
    }

    fn cleanup_done(&mut self, stage: CleanupStage, r: Result<(), CleanupError>) -> Vec<Input> {
        self.cleanup = None;
        match &r {
            // past the bound: reported once, then the pod is skipped (rechecked quietly)
            Err(CleanupError::Volumes(volumes::VolumeError::StillMounted {
                waited,
                volumes: held,
                ..
            })) => {
                if !self.volumes_skipped {
                    self.volumes_skipped = true;
                    self.tl.record(None, TlStep::VolumesDone { ok: false });
                    tracing::warn!(waitedMs = waited.as_millis() as u64,
                        volumes = %volumes::list(held),
                        "pod volumes still there past the unmount timeout; the pod is skipped and not deleted");
                    self.event(
                        EventReason::VolumesStillMounted,
                        format!(
                            "Volumes still mounted after {}s; the pod is not deleted while they are: {}",
                            waited.as_secs(),
                            volumes::list(held)
                        ),
                    );
                }
            }
            Err(e) => tracing::warn!(stage = ?stage, err = %e, "pod cleanup failed; will retry"),
            Ok(()) if stage == CleanupStage::Volumes && !self.volumes_skipped => {
                self.tl.record(None, TlStep::VolumesDone { ok: true })
            }
            Ok(()) => {}
        }
        vec![Input::CleanupDone {
            stage,
            ok: r.is_ok(),
        }]
    }

    fn report_overdue(&mut self) -> Vec<Input> {
        self.overdue = None;
        self.overdue_reported = true;
        tracing::warn!(
            gracePeriod = self.m.grace,
            "runtime did not stop the pod within its grace period"
        );
        if let Some(mx) = &self.metrics {
            mx.exceeded_grace_period.inc();
        }
        self.event(
            EventReason::ExceededGracePeriod,
            "Container runtime did not kill the pod within specified grace period.".into(),
        );
        Vec::new()
    }

    /// One input through the step function, then its effects.
    fn apply(&mut self, input: Input) {
        let before = self.m.lifecycle.phase();
        let known = self.m.reasons.len();
        let held = self.m.grace;
        let grace_override = match &input {
            Input::Kill { grace_override, .. } => *grace_override,
            _ => None,
        };
        let effects = lifecycle::step(&mut self.m, input, Instant::now());
        let after = self.m.lifecycle.phase();
        if known > 0 && self.m.reasons.len() > known {
            let all: Vec<&str> = self.m.reasons.iter().map(KillReason::as_str).collect();
            tracing::info!(reasons = ?all, gracePeriod = self.m.grace, "another reason to end the pod");
        }
        if self.m.reasons.len() > known {
            self.reasons_to_timeline(known, held, grace_override);
        }
        if after != before {
            self.transition(before, after);
        }
        for effect in effects {
            match effect {
                Effect::StartKill { generation, grace } => self.start_kill(generation, grace),
                Effect::StartCleanup(stage) => self.start_cleanup(stage),
                Effect::RetryAfter(_) if self.held => {
                    self.retry = None;
                    self.step = Step::BackingOff;
                }
                Effect::RetryAfter(d) => {
                    let jitter = rand::rng().random_range(0..=d.as_millis() as u64 / 5);
                    let at = d + Duration::from_millis(jitter);
                    self.retry = Some(Box::pin(tokio::time::sleep(at)));
                    self.step = Step::BackingOff;
                }
                Effect::KillComplete => {
                    if let Some(sink) = self.inner.status.get() {
                        sink.pod_terminated(&self.pod, self.m.reason.as_ref(), &self.finals);
                    }
                    for n in self.notices.drain(..) {
                        let _ = n.send(());
                    }
                }
                Effect::Finished => {
                    // the record goes as the loop ends (`worker_loop`: off the async runtime)
                    self.inner.timelines.finish(&self.pod.uid);
                    // the trace stays open for the status manager's delete, if it has one
                    if self.inner.status.get().is_none() {
                        self.inner.timelines.end_trace(&self.pod.uid);
                    }
                    self.trace = tracing::Span::none();
                    if let Some(sink) = self.inner.status.get() {
                        sink.pod_finished(&self.pod);
                    }
                    self.step = Step::Done;
                    self.finished = true;
                }
            }
        }
    }

    /// Records the reasons from `known` on in the timeline (starting it with the first), with
    /// the grace they left and where it came from.
    fn reasons_to_timeline(
        &mut self,
        known: usize,
        held: Option<i64>,
        grace_override: Option<i64>,
    ) {
        if !self.tl.is_on() {
            let (uid, ns, name) = (&self.pod.uid, &self.pod.namespace, &self.pod.name);
            self.tl = self.inner.timelines.start(uid, ns, name);
            // a worker restarted after a panic continues its termination's trace
            self.trace = match self.inner.timelines.trace(uid) {
                Some(open) => open,
                None => {
                    let span = tracing::info_span!(
                        target: crate::timeline::TRACE_TARGET,
                        "pod_termination",
                        k8s.pod.namespace = %ns,
                        k8s.pod.name = %name,
                        k8s.pod.uid = %uid,
                        reason = self.m.reasons.get(known).map(KillReason::as_str),
                    );
                    self.inner.timelines.open_trace(uid, span.clone());
                    span
                }
            };
        }
        let (g, from) = grace::effective_grace_from(
            held,
            self.m.deletion_grace,
            grace_override,
            self.m.spec_grace,
        );
        // a reason the lifecycle took no grace from (it came after the containers stopped)
        // leaves the grace it held
        let from = if self.m.grace == Some(g) {
            from
        } else {
            grace::GraceSource::Held
        };
        for r in &self.m.reasons[known..] {
            let detail = match r {
                KillReason::Requested { message, .. } => Some(message.clone()),
                _ => None,
            };
            self.tl.record(
                None,
                TlStep::Reason {
                    reason: r.as_str().into(),
                    source: r.source().into(),
                    grace: self.m.grace.unwrap_or(g),
                    grace_from: from,
                    detail,
                },
            );
        }
    }

    /// Logs and measures a phase change.
    fn transition(&mut self, from: PodPhase, to: PodPhase) {
        let now = Instant::now();
        if let Some(mx) = &self.metrics {
            let took = now - self.phase_started;
            let observe = |op: &'static str| {
                mx.pod_worker_duration
                    .get_or_create(&OpLabel { operation_type: op })
                    .observe(took.as_secs_f64())
            };
            match (from, to) {
                (PodPhase::Sync, PodPhase::Terminating)
                    if self.m.reason == Some(KillReason::Deleted) =>
                {
                    mx.termination_started(self.pod.uid.as_str())
                }
                (PodPhase::Terminating, PodPhase::Terminated) => {
                    mx.stage("kill", took);
                    observe("terminating");
                }
                (PodPhase::Terminated, PodPhase::Finished) => observe("terminated"),
                _ => {}
            }
        }
        self.phase_started = now;
        tracing::info!(
            from = from.as_str(),
            to = to.as_str(),
            gracePeriod = self.m.grace,
            reason = self.m.reason.as_ref().map(KillReason::as_str),
            "pod lifecycle transition"
        );
    }

    fn start_kill(&mut self, generation: u64, grace: i64) {
        let now = Instant::now();
        // held in standby: nothing of the kill starts, not even its clock (a takeover later
        // gives the pod its whole termination: preStop, SIGTERM, the grace)
        let reason = self.m.reason.as_ref().map_or("unknown", KillReason::as_str);
        if let Err(e) = self.inner.authority.check(&self.pod.uid, reason) {
            if !self.held {
                tracing::info!(err = %e, "kill held: this agent is in standby");
                self.tl.record(None, TlStep::KillHeld);
            }
            self.retry = None;
            self.kill = Some(Box::pin(async move {
                (generation, Err(kill::KillError::Refused(e)))
            }));
            self.step = Step::StoppingContainers;
            return;
        }
        let restarting = self.kill.is_some();
        if restarting {
            tracing::info!(
                gracePeriod = grace,
                "shorter grace period: restarting the kill"
            );
        }
        // a retry after a failed attempt counts down to the first attempt's deadline
        let retry_deadline = match (restarting, self.first_attempt) {
            (false, Some((started, g))) => Some(Deadline::after(
                started,
                grace::container_stop_timeout(g.min(grace)),
                DeadlineOrigin::FirstAttempt,
            )),
            _ => {
                self.first_attempt = Some((now, grace));
                None
            }
        };
        self.retry = None;
        let alarm = Deadline::new(
            saturating_add(
                now,
                grace::as_duration(grace::container_stop_timeout(grace))
                    .saturating_add(self.inner.config.exceeded_grace_slack),
            ),
            DeadlineOrigin::Grace,
        );
        if !self.overdue_reported && self.overdue.as_ref().is_none_or(|(_, o)| alarm.at < o.at) {
            self.overdue = Some((Box::pin(tokio::time::sleep_until(alarm.at)), alarm));
        }
        let inner = self.inner.clone();
        let mut pod = self.pod.clone();
        pod.kill_deadline = Deadline::earliest(pod.kill_deadline, retry_deadline);
        let memory = self.memory.clone();
        self.tl.record(
            None,
            TlStep::KillStarted {
                attempt: generation,
                grace,
            },
        );
        if let Some(d) = Deadline::earliest(pod.kill_deadline, self.m.kill_deadline()) {
            self.tl.deadline(d.at);
        }
        let tl = self.tl.clone();
        // a naturally completed pod's terminal status goes out as soon as its
        // containers are known stopped, before the sandbox teardown (the status
        // manager never sends a terminal phase twice: the report at KillComplete
        // finds it already terminal)
        let completed = matches!(self.m.reason, Some(KillReason::Completed));
        let span = tracing::info_span!(
            target: crate::timeline::TRACE_TARGET,
            parent: &self.trace,
            "kill",
            attempt = generation,
            grace,
        );
        self.kill = Some(Box::pin(
            async move {
                let report = |finals: &[crate::status::ContainerFinal]| {
                    if let Some(sink) = inner.status.get() {
                        sink.pod_terminated(&pod, Some(&KillReason::Completed), finals);
                    }
                };
                let early: Option<kill::OnContainersStopped<'_>> = completed.then_some(&report);
                let r = kill::kill_pod_reporting(
                    &*inner.runtime,
                    &inner.events,
                    &pod,
                    grace,
                    &memory,
                    early,
                    &tl,
                )
                .await;
                (generation, r)
            }
            .instrument(span),
        ));
        self.step = Step::StoppingContainers;
    }

    fn start_cleanup(&mut self, stage: CleanupStage) {
        let inner = self.inner.clone();
        let uid = self.pod.uid.clone();
        let skipped = self.volumes_skipped;
        self.step = match stage {
            CleanupStage::Volumes if skipped => Step::VolumesSkipped,
            CleanupStage::Volumes => Step::WaitingForVolumes,
            CleanupStage::Cgroup => Step::RemovingCgroup,
        };
        let state = self.volumes.clone();
        let (namespace, name) = (self.pod.namespace.clone(), self.pod.name.clone());
        if stage == CleanupStage::Volumes && !skipped {
            self.tl.record(None, TlStep::VolumesStarted);
        }
        let tl = self.tl.clone();
        let span = match stage {
            CleanupStage::Volumes => tracing::info_span!(
                target: crate::timeline::TRACE_TARGET,
                parent: &self.trace,
                "volumes"
            ),
            CleanupStage::Cgroup => tracing::info_span!(
                target: crate::timeline::TRACE_TARGET,
                parent: &self.trace,
                "cgroup"
            ),
        };
        self.cleanup = Some(Box::pin(
            async move {
                let t = Instant::now();
                let r = match stage {
                    CleanupStage::Volumes => {
                        let events = inner.events.clone();
                        let pod_uid = uid.clone();
                        let span = tracing::Span::current();
                        let report = move |h: &volumes::Held| {
                            let _in = span.enter();
                            tracing::warn!(volume = %h.volume, plugin = %h.plugin, detail = %h,
                            "unmounting a pod volume failed; retrying with backoff");
                            events.record(PodEvent {
                                uid: pod_uid.clone(),
                                namespace: namespace.clone(),
                                name: name.clone(),
                                reason: EventReason::FailedUnMount,
                                message: format!("UnmountVolume.TearDown failed: {h}"),
                                annotations: Default::default(),
                            });
                        };
                        let authority = inner.authority.clone();
                        let teardown = inner.config.volume_teardown;
                        let active = move || teardown && authority.is_active();
                        volumes::settle(volumes::Settle {
                            root_dir: inner.config.root_dir.clone(),
                            uid: uid.clone(),
                            mountinfo: inner.config.mountinfo.clone(),
                            poll: inner.config.volume_poll,
                            // once skipped, each retry checks once (the retry backoff paces it)
                            bound: if skipped {
                                Duration::ZERO
                            } else {
                                inner.config.volume_wait
                            },
                            active: Arc::new(active),
                            unmounter: Arc::new(volumes::SystemUnmount),
                            state,
                            report: Arc::new(report),
                        })
                        .await
                        .map_err(CleanupError::from)
                    }
                    CleanupStage::Cgroup => inner
                        .cgroups
                        .destroy(&uid)
                        .await
                        .map(|rep| {
                            tracing::info!(
                                removedDirs = rep.removed_dirs,
                                killedPids = rep.killed_pids,
                                "pod cgroup removed"
                            );
                            tl.record(
                                None,
                                TlStep::CgroupRemoved {
                                    removed_dirs: rep.removed_dirs,
                                    killed_pids: rep.killed_pids,
                                },
                            );
                        })
                        .map_err(CleanupError::from),
                };
                if r.is_ok()
                    && let Some(mx) = inner.metrics.get()
                {
                    let took = t.elapsed();
                    match stage {
                        CleanupStage::Volumes => mx.stage("volumes", took),
                        CleanupStage::Cgroup => {
                            mx.stage("cgroup", took);
                            mx.cgroup_manager_duration
                                .get_or_create(&OpLabel {
                                    operation_type: "destroy",
                                })
                                .observe(took.as_secs_f64());
                        }
                    }
                }
                (stage, r)
            }
            .instrument(span),
        ));
    }

    /// Completes notices of kills that arrived after termination, and publishes the view.
    fn publish(&mut self) {
        if !matches!(
            self.m.lifecycle.phase(),
            PodPhase::Sync | PodPhase::Terminating
        ) {
            for n in self.notices.drain(..) {
                let _ = n.send(());
            }
        }
        let mut v = self.view.lock().unwrap_or_else(|e| e.into_inner());
        v.phase = self.m.lifecycle.phase();
        v.grace = self.m.grace;
        v.deadline = self.m.kill_deadline();
        v.step = self.step;
        v.reason = self.m.reason.clone();
        v.reasons = self.m.reasons.clone();
        v.key = self.pod.key();
    }
}
