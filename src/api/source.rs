//! The API pod source: kubelet's `NewSourceApiserver` (`pkg/kubelet/config/apiserver.go`), a
//! reflector on pods with `spec.nodeName=<node>`, turned into the pipeline's seam calls.
//!
//! Invariants:
//! * a complete list (the initial one, or a re-list after 410 Gone) replaces the known set:
//!   pods missing from it are gone (force-deleted, or deleted while reaplet was down) and are
//!   stopped as orphans, with grace 1;
//! * a pod found terminating at start is handed over as it is: the kill's records decide
//!   whether its containers get a fresh termination or continue to a recorded deadline
//!   (never the wall-clock `deletionTimestamp`, which another clock wrote);
//! * orphans are judged only after the first complete list ([`PodWorkers::mark_source_synced`]);
//! * a pod of another node, or one that does not convert, is logged and skipped;
//! * a mirror pod (`kubernetes.io/config.mirror`) is the kubelet's: never fed to the workers,
//!   so deleting one never stops its static pod (the kubelet recreates the mirror).

use super::status_manager::StatusManager;
use crate::cri::Runtime;
use crate::eviction::{PodChange, PodFeed};
use crate::grace;
use crate::pod::{PodInfo, PodUid};
use crate::workers::PodWorkers;
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::runtime::{WatchStreamExt, watcher};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The source name for [`PodWorkers::expect_sources`].
pub const SOURCE: &str = "api";

/// A mirror pod: the API's copy of one of the kubelet's static pods (another UID; the kubelet
/// recreates it when it is deleted). Not a pod reaplet ends.
fn is_mirror(pod: &Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key("kubernetes.io/config.mirror"))
}

fn accept(pod: &Pod, node: &str) -> Option<(PodInfo, bool)> {
    if is_mirror(pod) {
        tracing::debug!(
            pod = %format_args!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any()),
            "mirror pod of a kubelet static pod; not reaplet's"
        );
        return None;
    }
    let bound = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
    if bound != Some(node) {
        tracing::warn!(
            pod = %format_args!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any()),
            node = bound.unwrap_or(""),
            "ignoring a pod bound to another node"
        );
        return None;
    }
    match PodInfo::from_api(pod) {
        Ok(info) => {
            let terminal = matches!(
                pod.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Failed" | "Succeeded")
            );
            Some((info, terminal))
        }
        Err(e) => {
            tracing::warn!(err = %e, "skipping a malformed pod object");
            None
        }
    }
}

/// The watch's retry delays, client-go's reflector's: 800 ms doubling to a 30 s cap, each
/// drawn from the upper quarter below its step (jitter), never shorter than the server's
/// `Retry-After`; back to the start only after a complete list and [`Self::STABLE`] without a
/// failure since. Every failed attempt counts, whichever request failed (kube-runtime's own
/// backoff restarts at every fresh list, so a server answering 500 was re-listed ~5 times a
/// second).
#[derive(Debug, Clone, Default)]
pub struct WatchBackoff {
    /// Failures since the last reset.
    failures: u32,
    /// When the last complete list arrived, if no failure came after it.
    listed_at: Option<Instant>,
    /// When the last attempt failed.
    last_failure: Option<Instant>,
}

impl WatchBackoff {
    pub const MIN: Duration = Duration::from_millis(800);
    pub const MAX: Duration = Duration::from_secs(30);
    /// How long a listed, watching source must stay up for the delays to start again from
    /// [`Self::MIN`] (client-go's backoff manager: 2 min).
    pub const STABLE: Duration = Duration::from_secs(120);
    /// A `Retry-After` longer than this is taken as this (a server never asks for more than
    /// seconds; a wrong one must not blind reaplet for hours).
    pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

    /// A complete list arrived at `now`.
    pub fn listed(&mut self, now: Instant) {
        self.listed_at = Some(now);
    }

    /// An attempt failed at `now`: how long to wait before the next one. `jitter` in `[0, 1)`.
    pub fn failed(&mut self, now: Instant, retry_after: Option<Duration>, jitter: f64) -> Duration {
        // up for STABLE since a complete list, or (a watch that failed and resumed from its
        // resourceVersion lists nothing) STABLE since the last failure: a failure alone, days
        // after the one before, starts from MIN again
        let stable = |t: Option<Instant>| {
            t.is_some_and(|t| now.saturating_duration_since(t) >= Self::STABLE)
        };
        if stable(self.listed_at.take()) || stable(self.last_failure) {
            self.failures = 0;
        }
        self.last_failure = Some(now);
        let step = Self::MIN
            .saturating_mul(1 << self.failures.min(16))
            .min(Self::MAX);
        self.failures = self.failures.saturating_add(1);
        let delay = step.mul_f64(0.75 + 0.25 * jitter.clamp(0.0, 1.0));
        delay.max(retry_after.unwrap_or_default().min(Self::MAX_RETRY_AFTER))
    }
}

/// A pod LIST that has not completed in this long is abandoned and retried with backoff (a
/// node's list is at most a few hundred pods: seconds, even on a loaded server).
pub const LIST_TIMEOUT: Duration = Duration::from_secs(60);

/// The server's `Retry-After`, if the failed request got one.
fn watch_retry_after(e: &watcher::Error) -> Option<Duration> {
    match e {
        watcher::Error::InitialListFailed(e)
        | watcher::Error::WatchStartFailed(e)
        | watcher::Error::WatchFailed(e) => super::retry_after(e),
        watcher::Error::WatchError(s) => super::status_retry_after(s),
        watcher::Error::NoResourceVersion => None,
    }
}

/// Sleeps `d` unless cancelled first; false when cancelled.
async fn pause(d: Duration, cancel: &CancellationToken) -> bool {
    tokio::select! {
        _ = cancel.cancelled() => false,
        _ = tokio::time::sleep(d) => true,
    }
}

/// How the source ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceEnd {
    Cancelled,
    /// Every list and watch was refused with 401 for this long: the credentials reaplet loaded
    /// at start are no longer accepted (kube-rs reads a kubeconfig's client certificate once;
    /// the kubelet's own, the default, is rotated on disk). A restart reads them again.
    CredentialsRejected(Duration),
}

/// The HTTP status of a failed list or watch, if the server answered.
fn watch_code(e: &watcher::Error) -> Option<u16> {
    match e {
        watcher::Error::InitialListFailed(e)
        | watcher::Error::WatchStartFailed(e)
        | watcher::Error::WatchFailed(e) => super::status_code(e),
        watcher::Error::WatchError(s) => Some(s.code),
        watcher::Error::NoResourceVersion => None,
    }
}

/// Watches this node's pods until cancelled, feeding `workers` and `status`; gives up when the
/// server has refused reaplet's credentials (401) for `credentials_grace`.
#[allow(clippy::too_many_arguments)]
pub async fn run<R: Runtime>(
    client: kube::Client,
    node: String,
    workers: PodWorkers<R>,
    status: Option<StatusManager>,
    feed: Option<PodFeed>,
    credentials_grace: Duration,
    cancel: CancellationToken,
) -> SourceEnd {
    // since when every attempt has been answered 401
    let mut rejected_since: Option<Instant> = None;
    let api: kube::Api<Pod> = kube::Api::all(client);
    let config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let mut backoff = WatchBackoff::default();
    let mut known: HashSet<PodUid> = HashSet::new();
    let mut batch: Vec<(PodInfo, bool)> = Vec::new();
    let mut raw: Vec<Arc<Pod>> = Vec::new();
    'restart: loop {
        let stream = watcher(api.clone(), config.clone()).modify(|p| {
            p.managed_fields_mut().clear();
        });
        let mut stream = std::pin::pin!(stream);
        // while a list is under way: when it must be complete
        let mut list_deadline: Option<Instant> = None;
        loop {
            let ev = tokio::select! {
                _ = cancel.cancelled() => return SourceEnd::Cancelled,
                _ = sleep_until_some(list_deadline) => {
                    let delay = backoff.failed(Instant::now(), None, rand::random());
                    tracing::warn!(timeout = ?LIST_TIMEOUT, retryIn = ?delay, "pod list got no answer in time; backing off");
                    if !pause(delay, &cancel).await {
                        return SourceEnd::Cancelled;
                    }
                    continue 'restart;
                }
                ev = stream.next() => ev,
            };
            let Some(ev) = ev else {
                return SourceEnd::Cancelled;
            };
            match ev {
                Ok(watcher::Event::Init) => {
                    batch.clear();
                    raw.clear();
                    list_deadline = Some(Instant::now() + LIST_TIMEOUT);
                }
                Ok(watcher::Event::InitApply(p)) => {
                    if let Some(a) = accept(&p, &node) {
                        batch.push(a);
                        raw.push(Arc::new(p));
                    }
                }
                Ok(watcher::Event::InitDone) => {
                    list_deadline = None;
                    rejected_since = None;
                    backoff.listed(Instant::now());
                    let now: HashSet<PodUid> = batch.iter().map(|(p, _)| p.uid.clone()).collect();
                    for uid in known.difference(&now) {
                        tracing::info!(podUID = %uid, "pod object gone while not watching");
                        workers.remove(uid, Some(grace::ORPHAN_GRACE));
                        if let Some(s) = &status {
                            s.forget(uid);
                        }
                    }
                    for (info, terminal) in batch.drain(..) {
                        if let Some(s) = &status {
                            s.observe(&info, terminal);
                        }
                        // a termination already under way when reaplet starts is a fresh one
                        // for containers never signalled, and continues to the recorded deadline
                        // for those that were (`records`): never the wall-clock deletionTimestamp
                        workers.upsert(info);
                    }
                    known = now;
                    if let Some(f) = &feed {
                        f.send(PodChange::Listed(std::mem::take(&mut raw)));
                    }
                    workers.mark_source_synced(SOURCE);
                    tracing::info!(pods = known.len(), "pod list from the API server");
                }
                Ok(watcher::Event::Apply(p)) => {
                    if let Some((info, terminal)) = accept(&p, &node) {
                        known.insert(info.uid.clone());
                        if let Some(s) = &status {
                            s.observe(&info, terminal);
                        }
                        workers.upsert(info);
                        if let Some(f) = &feed {
                            f.send(PodChange::Apply(Arc::new(p)));
                        }
                    }
                }
                Ok(watcher::Event::Delete(p)) => {
                    let Some(uid) = p
                        .metadata
                        .uid
                        .as_deref()
                        .and_then(|u| PodUid::parse(u).ok())
                    else {
                        continue;
                    };
                    known.remove(&uid);
                    if let Some(s) = &status {
                        s.forget(&uid);
                    }
                    if let Some(f) = &feed {
                        f.send(PodChange::Gone(uid.clone()));
                    }
                    // a pod reaplet deleted itself is finished already; otherwise this was a force
                    // delete: stop it as an orphan would be
                    workers.remove(&uid, Some(grace::ORPHAN_GRACE));
                }
                Err(e) => {
                    list_deadline = None;
                    let now = Instant::now();
                    if watch_code(&e) == Some(401) {
                        let since = *rejected_since.get_or_insert(now);
                        if now.duration_since(since) >= credentials_grace {
                            tracing::error!(err = %e, refusedFor = ?now.duration_since(since), "the API server no longer accepts reaplet's credentials; stopping so that a restart reads them again");
                            return SourceEnd::CredentialsRejected(now.duration_since(since));
                        }
                    } else {
                        rejected_since = None;
                    }
                    let delay =
                        backoff.failed(Instant::now(), watch_retry_after(&e), rand::random());
                    tracing::warn!(err = %e, retryIn = ?delay, "pod list or watch failed; backing off");
                    if !pause(delay, &cancel).await {
                        return SourceEnd::Cancelled;
                    }
                }
            }
        }
    }
}

/// Resolves at `at`, or never.
async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watch_backoff_doubles_from_800ms_to_30s_and_resets_only_after_a_stable_list() {
        let t0 = Instant::now();
        let mut b = WatchBackoff::default();
        let full: Vec<Duration> = (0..8).map(|_| b.failed(t0, None, 1.0)).collect();
        let secs: Vec<f64> = full.iter().map(Duration::as_secs_f64).collect();
        assert_eq!(secs, [0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30.0, 30.0]);
        // jitter only shortens, by at most a quarter
        let mut b = WatchBackoff::default();
        assert_eq!(b.failed(t0, None, 0.0), Duration::from_millis(600));
        // a fresh list alone does not reset (kube-runtime's did, at every re-list)
        let mut b = WatchBackoff::default();
        for _ in 0..5 {
            b.failed(t0, None, 1.0);
        }
        b.listed(t0);
        assert_eq!(
            b.failed(t0 + Duration::from_secs(1), None, 1.0),
            Duration::from_secs_f64(25.6)
        );
        // a failure STABLE after the one before does too (a watch resumed without a list)
        let mut c = WatchBackoff::default();
        for _ in 0..5 {
            c.failed(t0, None, 1.0);
        }
        assert_eq!(
            c.failed(t0 + WatchBackoff::STABLE, None, 1.0),
            WatchBackoff::MIN
        );
        // a list followed by STABLE without a failure does
        b.listed(t0);
        assert_eq!(
            b.failed(t0 + WatchBackoff::STABLE, None, 1.0),
            WatchBackoff::MIN
        );
    }

    #[test]
    fn watch_backoff_honours_retry_after_within_a_bound() {
        let t0 = Instant::now();
        let mut b = WatchBackoff::default();
        assert_eq!(
            b.failed(t0, Some(Duration::from_secs(5)), 0.5),
            Duration::from_secs(5)
        );
        assert_eq!(
            b.failed(t0, Some(Duration::from_secs(3600)), 0.5),
            WatchBackoff::MAX_RETRY_AFTER
        );
    }

    /// 60 s of failing lists, each failing at once: how many attempts the backoff allows.
    #[test]
    fn sixty_seconds_of_failures_cost_at_most_ten_lists() {
        for jitter in [0.0, 0.5, 0.999] {
            let t0 = Instant::now();
            let mut b = WatchBackoff::default();
            let (mut at, mut lists) = (Duration::ZERO, 0);
            while at < Duration::from_secs(60) {
                lists += 1;
                at += b.failed(t0 + at, None, jitter);
            }
            assert!(lists <= 10, "{lists} lists with jitter {jitter}");
        }
    }
}
