//! Graceful node shutdown: the kubelet's node shutdown manager
//! (`pkg/kubelet/nodeshutdown/nodeshutdown_manager_linux.go`). While reaplet is the active
//! agent and shutdown grace periods are configured, it holds a logind `delay` inhibitor lock
//! on `shutdown`; on `PrepareForShutdown(true)` it marks the node not ready, ends the pods in
//! priority groups through the one kill seam (preStop hooks, SIGTERM, SIGKILL as for any kill),
//! gives their terminal statuses time to reach the API server, and releases the lock, so the
//! machine goes down only then (or at logind's `InhibitDelayMaxSec`, whichever comes first).
//!
//! The parts:
//! * [`plan`]: the groups, which pod ends in which, with what grace (pure);
//! * [`stages`]: carrying the plan out, group after group, each bounded by its grace;
//! * [`logind`]: the inhibitor, logind's delay and its drop-in, the `PrepareForShutdown`
//!   signal;
//! * [`node`]: the node's `Ready` condition while shutting down;
//! * this file: the manager task that ties them together.
//!
//! Invariants:
//! * nothing happens without configured grace periods: no bus connection, no inhibitor;
//! * the lock is held only while reaplet is active (primary, or standby after a takeover); in
//!   standby a shutdown is the kubelet's to handle and is only recorded (a log line and the
//!   start-time metric); a hand-back releases the lock, a takeover takes it;
//! * a shutdown is handled once: after it the lock is released and not taken again until logind
//!   says the shutdown was cancelled (`PrepareForShutdown(false)`), as the kubelet does;
//! * logind's configuration is touched only when reaplet is about to hold the lock, never while
//!   passive (the kubelet's drop-in is the kubelet's);
//! * only logind's own `PrepareForShutdown` counts (the sender is checked against the owner of
//!   `org.freedesktop.login1`): another local process cannot make reaplet end every pod;
//! * logind absent or refusing is said once (a warning, and `reaplet check`), then retried
//!   quietly with a growing backoff (1 s to 64 s); nothing else in reaplet depends on it. A bus
//!   connection that ends is made again; a handled shutdown stays handled across it;
//! * stopping reaplet releases the lock (the fd closes with the process) and never kills pods.

pub mod logind;
pub mod node;
pub mod plan;
pub mod stages;

pub use plan::{
    DISRUPTION, Group, MESSAGE, PodFacts, REASON, SYSTEM_CRITICAL_PRIORITY, Stage, group_of,
    groups, kill_reason, total,
};

use crate::authority::Authority;
use crate::config::ShutdownSettings;
use crate::events::{EventSink, NodeEventReason};
use crate::metrics::Metrics;
use futures_util::StreamExt;
use logind::{InhibitLock, Logind, LogindError};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// After the last group: how long the pods still stopping (SIGKILLed at their group's grace)
/// get to finish and the terminal statuses to reach the API server before the lock is released
/// (the network goes down soon after). Part of the delay asked of logind.
pub const STATUS_FLUSH: Duration = Duration::from_secs(5);

/// The manager's settings.
#[derive(Debug, Clone)]
pub struct ShutdownConfig {
    pub settings: ShutdownSettings,
    /// The system bus socket.
    pub bus: PathBuf,
    /// logind's drop-in directory ([`logind::DROP_IN_DIR`]).
    pub drop_in_dir: PathBuf,
    pub status_flush: Duration,
}

impl ShutdownConfig {
    pub fn new(settings: ShutdownSettings) -> Self {
        Self {
            settings,
            bus: crate::systemd::SYSTEM_BUS.into(),
            drop_in_dir: logind::DROP_IN_DIR.into(),
            status_flush: STATUS_FLUSH,
        }
    }

    /// The delay logind must allow: every group's grace plus the status flush; zero when
    /// graceful shutdown is off.
    pub fn delay_needed(&self) -> Duration {
        let g = groups(&self.settings);
        if g.is_empty() {
            Duration::ZERO
        } else {
            total(&g) + self.status_flush
        }
    }
}

/// The pods a shutdown ends, and the way to end them.
pub trait Pods: stages::Killer + Send + Sync + 'static {
    /// Every pod not yet stopped (running or terminating), as the plan reads it.
    fn active(&self) -> Vec<PodFacts>;
}

/// What the manager works with.
pub struct Context<P> {
    pub config: ShutdownConfig,
    pub pods: P,
    /// Terminal statuses not yet accepted by the API server (the status manager).
    pub statuses_pending: Option<Box<dyn Fn() -> usize + Send + Sync>>,
    /// The node's Ready condition (with an API server).
    pub node: Option<Arc<node::NodeReady>>,
    pub events: EventSink,
    pub metrics: Option<Arc<Metrics>>,
    pub authority: Arc<Authority>,
}

/// How a session with logind ended.
enum End {
    Stopped,
    Lost(LogindError),
}

/// What outlives one bus connection.
#[derive(Default)]
struct State {
    /// A shutdown was handled and not cancelled: the lock stays released.
    shut_down: bool,
    /// logind's delay was checked (and raised if it could be) for this process.
    delay_checked: bool,
    /// A lock was held since the last failure was reported.
    held: bool,
}

fn unix_now() -> i64 {
    crate::wall_ns() / 1_000_000_000
}

/// Makes sure logind waits long enough, writing reaplet's drop-in when it would not. Done only
/// when reaplet is about to hold the lock (never while passive: the kubelet's setting is the
/// kubelet's). A failure is logged and the lock is taken all the same: logind then waits what
/// it allows.
/// Returns whether the delay could be read (else it is looked at again next time).
async fn ensure_delay(config: &ShutdownConfig, logind: &Logind, needed: Duration) -> bool {
    let current = match logind.inhibit_delay_max().await {
        Ok(d) if d >= needed => return true,
        Ok(d) => d,
        Err(e) => {
            tracing::warn!(err = %e, "logind's InhibitDelayMaxSec unknown; taking the inhibitor all the same");
            return false;
        }
    };
    let raised = async {
        let path = logind::write_drop_in(&config.drop_in_dir, needed)?;
        logind.reload().await?;
        // logind reads its configuration after the signal: a few looks, as the kubelet does
        let mut got = current;
        for attempt in 0..6u32 {
            tokio::time::sleep(Duration::from_millis(100) * 2u32.pow(attempt)).await;
            got = logind.inhibit_delay_max().await?;
            if got >= needed {
                return Ok((got, path));
            }
        }
        Err(LogindError::DelayTooShort {
            wanted: needed,
            got,
            drop_in: path,
        })
    };
    match raised.await {
        Ok((got, path)) => tracing::info!(from = ?current, to = ?got, dropIn = %path.display(),
            "logind's InhibitDelayMaxSec raised for graceful node shutdown"),
        Err(e) => tracing::warn!(err = %e, current = ?current,
            "logind's InhibitDelayMaxSec not raised: a shutdown will be cut short by logind"),
    }
    true
}

/// Runs until `cancel`: the inhibitor while active, the shutdown when logind announces it.
pub async fn run<P: Pods>(ctx: Context<P>, cancel: CancellationToken) {
    let groups = groups(&ctx.config.settings);
    if groups.is_empty() {
        tracing::info!("graceful node shutdown not configured: no inhibitor taken");
        return;
    }
    tracing::info!(groups = groups.len(), delay = ?ctx.config.delay_needed(),
        "graceful node shutdown configured");
    let mut state = State::default();
    let mut failures: u32 = 0;
    loop {
        let r = tokio::select! {
            _ = cancel.cancelled() => return,
            r = Logind::connect(&ctx.config.bus) => r,
        };
        let err = match r {
            Ok(logind) => {
                let end = session(&ctx, &groups, &logind, &mut state, &cancel).await;
                // the session's lock is gone with it
                set_held(&ctx, false);
                match end {
                    End::Stopped => return,
                    End::Lost(e) => e,
                }
            }
            Err(e) => e,
        };
        // a session that held the lock was a success: the next failure is news again
        if std::mem::take(&mut state.held) {
            failures = 0;
        }
        failures += 1;
        if failures == 1 {
            tracing::warn!(err = %err, "graceful node shutdown unavailable: logind cannot be used; retrying quietly");
        } else {
            tracing::debug!(err = %err, "logind still unavailable");
        }
        let wait = Duration::from_secs(1) * 2u32.pow((failures - 1).min(6));
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// The inhibitor gauge.
fn set_held<P>(ctx: &Context<P>, held: bool) {
    if let Some(m) = &ctx.metrics {
        m.graceful_shutdown_inhibitor.set(i64::from(held));
    }
}

/// `f`, or `None` when reaplet is stopped first.
async fn unless_stopped<T>(
    cancel: &CancellationToken,
    f: impl std::future::Future<Output = T>,
) -> Option<T> {
    tokio::select! {
        biased;
        _ = cancel.cancelled() => None,
        v = f => Some(v),
    }
}

/// Until reaplet is passive.
async fn passive(authority: &Authority) {
    let mut changes = authority.changes();
    while authority.is_active() {
        if changes.changed().await.is_err() {
            return std::future::pending().await;
        }
    }
}

/// One bus connection's life: the lock follows the authority; signals are handled in order.
async fn session<P: Pods>(
    ctx: &Context<P>,
    groups: &[Group],
    logind: &Logind,
    state: &mut State,
    cancel: &CancellationToken,
) -> End {
    let mut signals = match logind.shutdown_signals().await {
        Ok(s) => s,
        Err(e) => return End::Lost(e),
    };
    let mut authority = ctx.authority.changes();
    let mut lock: Option<InhibitLock> = None;
    loop {
        let active = ctx.authority.is_active();
        if active && lock.is_none() {
            // what logind says now: a shutdown announced while reaplet was not listening (a
            // reconnect, a restart) or was passive, or a cancellation it missed
            let preparing = match unless_stopped(cancel, logind.preparing_for_shutdown()).await {
                None => return End::Stopped,
                Some(Err(e)) => return End::Lost(e),
                Some(Ok(p)) => p,
            };
            if !preparing {
                state.shut_down = false;
            }
            if !state.shut_down {
                if !state.delay_checked {
                    let needed = ctx.config.delay_needed();
                    match unless_stopped(cancel, ensure_delay(&ctx.config, logind, needed)).await {
                        None => return End::Stopped,
                        Some(read) => state.delay_checked = read,
                    }
                }
                if !ctx.authority.is_active() {
                    continue;
                }
                match unless_stopped(cancel, logind.inhibit()).await {
                    None => return End::Stopped,
                    Some(Err(e)) => return End::Lost(e),
                    Some(Ok(l)) => {
                        if !state.held {
                            tracing::info!(delay = ?ctx.config.delay_needed(),
                                "logind delay inhibitor taken for graceful node shutdown");
                        }
                        state.held = true;
                        lock = Some(l);
                    }
                }
                if preparing {
                    tracing::info!("node shutdown already announced: ending the pods now");
                    state.shut_down = true;
                    match shut_down(ctx, groups, cancel).await {
                        None => return End::Stopped,
                        Some(()) => lock = None,
                    }
                    continue;
                }
            }
        } else if !active && lock.is_some() {
            lock = None;
            tracing::info!(
                "standby: logind inhibitor released; a shutdown is the kubelet's to handle"
            );
        }
        set_held(ctx, lock.is_some());
        tokio::select! {
            biased;
            _ = cancel.cancelled() => return End::Stopped,
            r = authority.changed() => if r.is_err() { return End::Stopped },
            s = signals.next() => match s {
                None => return End::Lost(LogindError::Call {
                    method: "PrepareForShutdown",
                    source: Box::new(zbus::Error::InputOutput(Arc::new(std::io::Error::from(
                        std::io::ErrorKind::UnexpectedEof)))),
                }),
                Some(true) if lock.is_some() && ctx.authority.is_active() => {
                    state.shut_down = true;
                    match shut_down(ctx, groups, cancel).await {
                        None => return End::Stopped,
                        Some(()) => lock = None,
                    }
                }
                Some(true) if state.shut_down => {
                    tracing::info!("node shutdown announced again; already handled");
                }
                Some(true) => {
                    if let Some(m) = &ctx.metrics {
                        m.graceful_shutdown_start_time.set(unix_now());
                    }
                    tracing::info!("node shutdown announced while in standby: the kubelet ends the pods");
                }
                Some(false) => {
                    let active = ctx.authority.is_active();
                    tracing::info!(active, "node shutdown cancelled");
                    state.shut_down = false;
                    if active {
                        ctx.events.record_node(NodeEventReason::Shutdown,
                            "Shutdown manager detected shutdown cancellation");
                        if let Some(n) = &ctx.node
                            && let Err(e) = n.restore().await
                        {
                            tracing::warn!(err = %e, "node Ready condition not restored");
                        }
                    }
                }
            },
        }
    }
}

/// Ends the pods (unless reaplet turns passive first: the rest is then the kubelet's); the
/// caller releases the lock after. `None`: reaplet was stopped.
async fn shut_down<P: Pods>(
    ctx: &Context<P>,
    groups: &[Group],
    cancel: &CancellationToken,
) -> Option<()> {
    tokio::select! {
        biased;
        _ = cancel.cancelled() => return None,
        _ = passive(&ctx.authority) => {
            tracing::info!("handed back during a node shutdown: the rest is the kubelet's");
        }
        _ = end_pods(ctx, groups) => {
            tracing::info!("node shutdown: logind inhibitor released; the node shuts down now");
        }
    }
    Some(())
}

/// `processShutdownEvent`: every group in order, then the statuses.
async fn end_pods<P: Pods>(ctx: &Context<P>, groups: &[Group]) {
    let start = tokio::time::Instant::now();
    if let Some(m) = &ctx.metrics {
        m.graceful_shutdown_start_time.set(unix_now());
        m.graceful_shutdown_end_time.set(0);
    }
    ctx.events.record_node(
        NodeEventReason::Shutdown,
        "Shutdown manager detected shutdown event",
    );
    // the Ready condition goes out beside the kills (the kubelet's `go syncNodeStatus()`)
    let ready = ctx.node.clone().map(|n| {
        tokio::spawn(async move {
            if let Err(e) = n.mark_shutting_down().await {
                tracing::warn!(err = %e, "node Ready condition not updated for the shutdown");
            }
        })
    });
    let pods = ctx.pods.active();
    let stages = plan::plan(groups, &pods);
    tracing::info!(
        pods = pods.len(),
        groups = stages.len(),
        "node shutdown: ending pods by priority group, lowest first"
    );
    let (reports, still_stopping) = stages::run(&stages, &ctx.pods).await;
    // the flush: pods whose group ran out of time finish stopping (their SIGKILL is due by
    // then), then every terminal status reaches the API server; the Ready condition too
    let flush_end = tokio::time::Instant::now() + ctx.config.status_flush;
    let left = still_stopping.len();
    if left > 0
        && tokio::time::timeout_at(flush_end, futures_util::future::join_all(still_stopping))
            .await
            .is_err()
    {
        tracing::warn!(
            pods = left,
            "node shutdown: pods still stopping when the inhibitor is released"
        );
    }
    if let Some(pending) = &ctx.statuses_pending {
        while pending() > 0 && tokio::time::Instant::now() < flush_end {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let left = pending();
        if left > 0 {
            tracing::warn!(
                pending = left,
                "node shutdown: terminal statuses not yet accepted by the API server"
            );
        }
    }
    if let Some(mut h) = ready
        && tokio::time::timeout_at(flush_end, &mut h).await.is_err()
    {
        // never left to land after a cancellation's restore
        h.abort();
    }
    if let Some(m) = &ctx.metrics {
        m.graceful_shutdown_end_time.set(unix_now());
    }
    tracing::info!(
        tookMs = start.elapsed().as_millis() as u64,
        timedOutGroups = reports.iter().filter(|r| r.timed_out).count(),
        "node shutdown: pods ended"
    );
}

impl<R: crate::cri::Runtime> stages::Killer for crate::workers::PodWorkers<R> {
    fn kill(
        &self,
        uid: &crate::pod::PodUid,
        grace: i64,
    ) -> Option<tokio::sync::oneshot::Receiver<()>> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let req = crate::workers::KillRequest::new(kill_reason())
            .grace(Some(grace))
            .notify(tx);
        crate::workers::PodWorkers::kill(self, uid, req).ok()?;
        Some(rx)
    }
}

impl<R: crate::cri::Runtime> Pods for crate::workers::PodWorkers<R> {
    fn active(&self) -> Vec<PodFacts> {
        self.active_pods()
            .into_iter()
            .map(|p| PodFacts {
                uid: p.uid,
                priority: p.priority,
                spec_grace: p.spec_grace,
            })
            .collect()
    }
}
