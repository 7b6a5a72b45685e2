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
//! * a watch that delivers nothing for [`WATCH_TIMEOUT`] and kube-runtime's 5 s margin is
//!   started again from the last version seen (no relist);
//! * a mirror pod (`kubernetes.io/config.mirror`) is the kubelet's: never fed to the workers,
//!   so deleting one never stops its static pod (the kubelet recreates the mirror);
//! * no watch while this agent is passive ([`Authority`]): standby beside a live kubelet holds
//!   no watch, decodes no pod and keeps nothing of the node's pods; going passive forgets what
//!   the source delivered ([`PodWorkers::source_paused`]); becoming active lists again (a
//!   consistent list, without `resourceVersion`: never the watch cache's, which may be behind,
//!   for the list that decides which running pods are orphans; every relist is one too), and
//!   that list ends the deleted pods still present while terminal ones
//!   are left to the relist, which ends only those still running
//!   ([`PodWorkers::upsert_at_takeover`]).

use super::health::ApiHealth;
use super::status_manager::StatusManager;
use crate::authority::Authority;
use crate::backoff::{Backoff, Failure, Policy, STABLE_RESET};
use crate::cri::Runtime;
use crate::eviction::{PodChange, PodFeed};
use crate::pod::{PodInfo, PodUid};
use crate::terminating::grace;
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

/// A mirror pod is not a pod reaplet ends.
use crate::pod::is_mirror;

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

/// The pod watch's `timeoutSeconds`: the server ends each watch after this long (with a
/// bookmark just before, so the next starts from a fresh version), and kube-runtime's idle
/// check starts a new one from the last version seen when nothing at all (no event, no
/// bookmark, not the server's end) arrived for this plus its 5 s margin: 20 s. That is the
/// bound on how long a watch on a path gone silent above TCP (a proxy or a load balancer that
/// keeps the connection open and forwards nothing; keepalive sees only a dead kernel) keeps
/// reaplet blind: a pod deleted just after gets its SIGTERM about 20 s later, where the
/// kubelet's informer notices in about 45 s (HTTP/2 pings) and a watch with the default 290 s
/// after 295 s. The cost is a watch request every 15 s while this agent acts (a passive standby
/// holds no pod watch), each resumed from the watch cache: no list.
pub const WATCH_TIMEOUT: Duration = Duration::from_secs(15);

/// A pod LIST that has not completed in this long is abandoned and retried with backoff (a
/// node's list is at most a few hundred pods: seconds, even on a loaded server).
pub const LIST_TIMEOUT: Duration = Duration::from_secs(60);

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
/// Whether the server, or reaplet's own credential plugin, refused the credentials: a 401, or
/// an exec plugin or token refresh that failed ([`super::auth_failed`]).
fn credentials_refused(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::InitialListFailed(k)
        | watcher::Error::WatchStartFailed(k)
        | watcher::Error::WatchFailed(k) => super::auth_failed(k) || watch_code(e) == Some(401),
        _ => watch_code(e) == Some(401),
    }
}

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
    health: ApiHealth,
    authority: Arc<Authority>,
    cancel: CancellationToken,
) -> SourceEnd {
    let mut acting = authority.changes();
    // the first list after a passive spell is a takeover's
    let mut after_takeover = false;
    // since when every attempt has been answered 401
    let mut rejected_since: Option<Instant> = None;
    let api: kube::Api<Pod> = kube::Api::all(client);
    let config = watcher::Config::default()
        .fields(&format!("spec.nodeName={node}"))
        .timeout(WATCH_TIMEOUT.as_secs() as u32)
        .list_semantic(watcher::ListSemantic::MostRecent);
    // reset only after two quiet minutes (client-go's reflector), never by an event: a list
    // that works and a watch that fails at once is one failure repeating
    let mut backoff = Backoff::resetting_after(Policy::API, STABLE_RESET);
    // the last attempt failed: the next good event is logged as the recovery
    let mut failing = false;
    let mut known: HashSet<PodUid> = HashSet::new();
    let mut batch: Vec<(PodInfo, bool)> = Vec::new();
    let mut raw: Vec<Arc<Pod>> = Vec::new();
    let mut listed_from = crate::wall_ns();
    'restart: loop {
        if !*acting.borrow_and_update() {
            // passive: another agent holds the node; nothing is watched, nothing kept
            tracing::info!(
                pods = known.len(),
                "no pod watch while another agent holds the node"
            );
            for uid in &known {
                if let Some(f) = &feed {
                    f.send(PodChange::Gone(uid.clone()));
                }
            }
            workers.source_paused(SOURCE, known.drain());
            failing = false;
            backoff.succeeded();
            loop {
                tokio::select! {
                    _ = cancel.cancelled() => return SourceEnd::Cancelled,
                    r = acting.changed() => {
                        if r.is_err() {
                            // the authority is the agent's own: gone only as the agent ends
                            return SourceEnd::Cancelled;
                        }
                        if *acting.borrow_and_update() {
                            break;
                        }
                    }
                }
            }
            after_takeover = true;
            tracing::info!("pod watch starting: this agent holds the node");
        }
        let stream = watcher(api.clone(), config.clone()).modify(|p| {
            p.managed_fields_mut().clear();
        });
        let mut stream = std::pin::pin!(stream);
        // while a list is under way: when it must be complete
        let mut list_deadline: Option<Instant> = None;
        loop {
            let ev = tokio::select! {
                _ = cancel.cancelled() => return SourceEnd::Cancelled,
                Ok(()) = acting.changed() => {
                    if *acting.borrow() {
                        continue;
                    }
                    continue 'restart;
                }
                _ = sleep_until_some(list_deadline) => {
                    // connections that fail end the list sooner, as errors: this one is slow
                    let f = Failure::Slow;
                    let delay = backoff.failed(f, rand::random());
                    tracing::warn!(timeout = ?LIST_TIMEOUT, "pod list not complete in time; retrying after the backoff");
                    failing = true;
                    if !health.wait_to_retry(f, delay, &cancel).await {
                        return SourceEnd::Cancelled;
                    }
                    continue 'restart;
                }
                ev = stream.next() => ev,
            };
            let Some(ev) = ev else {
                return SourceEnd::Cancelled;
            };
            // Init comes before its list is even sent: only what the server sent counts
            if ev
                .as_ref()
                .is_ok_and(|e| !matches!(e, watcher::Event::Init))
            {
                health.answered();
                if std::mem::take(&mut failing) {
                    tracing::info!("pod list and watch working again");
                }
            }
            match ev {
                Ok(watcher::Event::Init) => {
                    batch.clear();
                    raw.clear();
                    // before the list is asked for: its snapshot is no older
                    listed_from = crate::wall_ns();
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
                        if after_takeover {
                            workers.upsert_at_takeover(info);
                        } else {
                            workers.upsert(info);
                        }
                    }
                    after_takeover = false;
                    known = now;
                    if let Some(f) = &feed {
                        f.send(PodChange::Listed(std::mem::take(&mut raw)));
                    }
                    workers.mark_source_synced(SOURCE, listed_from);
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
                    if credentials_refused(&e) {
                        let since = *rejected_since.get_or_insert(now);
                        if now.duration_since(since) >= credentials_grace {
                            tracing::error!(err = %e, refusedFor = ?now.duration_since(since), "the API server no longer accepts reaplet's credentials; stopping so that a restart reads them again");
                            return SourceEnd::CredentialsRejected(now.duration_since(since));
                        }
                    } else {
                        rejected_since = None;
                    }
                    let f = super::watch_failure(&e);
                    let delay = backoff.failed(f, rand::random());
                    // one line per outage or storm, not per retry
                    if !std::mem::replace(&mut failing, true) {
                        tracing::warn!(err = %e, retryIn = ?delay, "pod list or watch failed; backing off");
                    } else {
                        tracing::debug!(err = %e, retryIn = ?delay, "pod list or watch failed again");
                    }
                    if !health.wait_to_retry(f, delay, &cancel).await {
                        return SourceEnd::Cancelled;
                    }
                    if !*acting.borrow() {
                        continue 'restart;
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

    /// 60 s of lists answered with 500, each failing at once: how many attempts the backoff
    /// allows (client-go's reflector: 800 ms doubling to 30 s).
    #[test]
    fn sixty_seconds_of_answered_failures_cost_at_most_ten_lists() {
        for jitter in [0.0, 0.5, 0.999] {
            let mut b = Backoff::new(Policy::API);
            let (mut at, mut lists) = (Duration::ZERO, 0);
            while at < Duration::from_secs(60) {
                lists += 1;
                at += b.failed(Failure::Answered { retry_after: None }, jitter);
            }
            assert!(lists <= 10, "{lists} lists with jitter {jitter}");
        }
    }

    #[test]
    fn a_refused_or_reset_list_got_no_answer_and_a_500_did() {
        let refused = kube::Error::Service("connection refused".into());
        assert_eq!(
            super::super::watch_failure(&watcher::Error::InitialListFailed(refused)),
            Failure::NoAnswer
        );
        let st = kube::core::Status::failure("boom", "InternalError").with_code(500);
        assert_eq!(
            super::super::watch_failure(&watcher::Error::WatchStartFailed(kube::Error::Api(
                Box::new(st)
            ))),
            Failure::Answered { retry_after: None }
        );
    }
}
