//! The API pod source: kubelet's `NewSourceApiserver` (`pkg/kubelet/config/apiserver.go`), a
//! reflector on pods with `spec.nodeName=<node>`, turned into the pipeline's seam calls.
//!
//! Invariants:
//! * a complete list (the initial one, or a re-list after 410 Gone) replaces the known set:
//!   pods missing from it are gone (force-deleted, or deleted while reaplet was down) and are
//!   stopped as orphans, with grace 1;
//! * orphans are judged only after the first complete list ([`PodWorkers::mark_source_synced`]);
//! * a pod of another node, or one that does not convert, is logged and skipped;
//! * a mirror pod (`kubernetes.io/config.mirror`) is the kubelet's: never fed to the workers,
//!   so deleting one never stops its static pod (the kubelet recreates the mirror).

use super::status_manager::StatusManager;
use crate::cri::Runtime;
use crate::deadline::{Deadline, DeadlineOrigin};
use crate::grace;
use crate::lifecycle::KillReason;
use crate::pod::{PodInfo, PodUid};
use crate::workers::{KillRequest, PodWorkers};
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use std::collections::HashSet;
use std::time::Duration;
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

fn now_secs() -> i64 {
    jiff::Timestamp::now().as_second()
}

/// A pod found already terminating at start-up (reaplet restarted mid-termination): the time
/// left until the API server's deadline (`deletionTimestamp`), if shorter than the deletion
/// grace, so that a restart never extends a pod's life beyond its original deadline (plus the
/// 2 s floor). Only used for the first list: later deletions get their full grace, whatever the
/// clocks say.
pub fn resume_grace(pod: &PodInfo, now: i64) -> Option<i64> {
    // deletionTimestamp has whole seconds: the true deadline is within the next second, and
    // reaplet never kills before it
    let deadline = pod.deletion_timestamp?.saturating_add(1);
    let left = deadline.saturating_sub(now).max(1);
    (pod.deletion_requested && pod.deletion_grace.is_none_or(|g| left < g)).then_some(left)
}

/// The watch's retry delays: 250 ms doubling up to 5 s, each drawn from its upper half
/// (jitter), back to the start after any event arrives or 30 s without a retry. client-go's
/// (and kube-rs's default) 800 ms..30 s with full jitter left reaplet blind for up to a minute
/// after a long API outage: pods deleted right after the recovery went unseen (measured in
/// `tests/faults.rs`).
#[derive(Debug, Clone)]
pub struct WatchBackoff {
    next: Duration,
    last: Option<std::time::Instant>,
}

impl WatchBackoff {
    const MIN: Duration = Duration::from_millis(250);
    const MAX: Duration = Duration::from_secs(5);
    const RESET_AFTER: Duration = Duration::from_secs(30);
}

impl Default for WatchBackoff {
    fn default() -> Self {
        Self {
            next: Self::MIN,
            last: None,
        }
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let now = std::time::Instant::now();
        if self
            .last
            .is_some_and(|l| now.duration_since(l) > Self::RESET_AFTER)
        {
            self.next = Self::MIN;
        }
        self.last = Some(now);
        let d = self.next;
        self.next = (self.next * 2).min(Self::MAX);
        let half = d / 2;
        Some(half + half.mul_f64(rand::random::<f64>()))
    }
}

impl kube::runtime::utils::Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.next = Self::MIN;
    }
}

/// The instant (Unix seconds) by which a resumed termination must have killed everything: the
/// true deadline lies within the second after `deletionTimestamp`, and a pod whose grace was
/// below the 2 s floor keeps the floor counted from its deletion.
pub fn resume_deadline(pod: &PodInfo) -> Option<i64> {
    let ts = pod.deletion_timestamp?;
    let grace = pod.deletion_grace.unwrap_or(grace::MIN_CONTAINER_GRACE);
    Some(
        ts.saturating_add(1)
            .saturating_add((grace::MIN_CONTAINER_GRACE - grace).max(0)),
    )
}

/// Watches this node's pods until cancelled, feeding `workers` and `status`.
pub async fn run<R: Runtime>(
    client: kube::Client,
    node: String,
    workers: PodWorkers<R>,
    status: Option<StatusManager>,
    cancel: CancellationToken,
) {
    let api: kube::Api<Pod> = kube::Api::all(client);
    let config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let (_reader, writer) = reflector::store();
    let stream = reflector(
        writer,
        watcher(api, config)
            .backoff(WatchBackoff::default())
            .modify(|p| {
                p.managed_fields_mut().clear();
            }),
    );
    let mut stream = std::pin::pin!(stream);
    let mut known: HashSet<PodUid> = HashSet::new();
    let mut batch: Vec<(PodInfo, bool)> = Vec::new();
    let mut resumed = false;
    loop {
        let ev = tokio::select! {
            _ = cancel.cancelled() => return,
            ev = stream.next() => ev,
        };
        let Some(ev) = ev else { return };
        match ev {
            Ok(watcher::Event::Init) => batch.clear(),
            Ok(watcher::Event::InitApply(p)) => batch.extend(accept(&p, &node)),
            Ok(watcher::Event::InitDone) => {
                let now: HashSet<PodUid> = batch.iter().map(|(p, _)| p.uid.clone()).collect();
                for uid in known.difference(&now) {
                    tracing::info!(podUID = %uid, "pod object gone while not watching");
                    workers.remove(uid, Some(grace::ORPHAN_GRACE));
                    if let Some(s) = &status {
                        s.forget(uid);
                    }
                }
                for (mut info, terminal) in batch.drain(..) {
                    if let Some(s) = &status {
                        s.observe(&info, terminal);
                    }
                    let resume = (!resumed)
                        .then(|| resume_grace(&info, now_secs()))
                        .flatten();
                    // every termination already under way when reaplet starts (whatever its
                    // grace) counts down to the pod's deadline
                    // (the wall-clock deadline becomes a monotonic one here, at the API edge)
                    if !resumed && info.deletion_requested {
                        info.kill_deadline = resume_deadline(&info).map(|ts| {
                            Deadline::from_unix(
                                ts,
                                now_secs(),
                                tokio::time::Instant::now(),
                                DeadlineOrigin::Resumed,
                            )
                        });
                    }
                    let uid = info.uid.clone();
                    workers.upsert(info);
                    if let Some(g) = resume {
                        tracing::info!(podUID = %uid, gracePeriod = g, "resuming a termination begun before this start");
                        let kill = KillRequest::new(KillReason::Deleted).grace(Some(g));
                        let _ = workers.kill(&uid, kill);
                    }
                }
                resumed = true;
                known = now;
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
                // a pod reaplet deleted itself is finished already; otherwise this was a force
                // delete: stop it as an orphan would be
                workers.remove(&uid, Some(grace::ORPHAN_GRACE));
            }
            Err(e) => tracing::warn!(err = %e, "pod watch error; retrying with backoff"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watch_backoff_is_bounded_jittered_and_resets() {
        let mut b = WatchBackoff::default();
        let first: Vec<Duration> = (&mut b).take(8).collect();
        assert!(first[0] >= Duration::from_millis(125) && first[0] <= Duration::from_millis(250));
        assert!(first.iter().all(|d| *d <= WatchBackoff::MAX));
        assert!(
            first[7] >= WatchBackoff::MAX / 2,
            "grows to the cap: {first:?}"
        );
        kube::runtime::utils::Backoff::reset(&mut b);
        assert!(b.next().unwrap() <= Duration::from_millis(250));
    }
    use crate::pod::PodUid;

    #[test]
    fn resume_never_extends_the_original_deadline() {
        let mut p = PodInfo::from_runtime(&PodUid::parse("u").unwrap(), &[], &[]);
        p.deletion_requested = true;
        p.deletion_grace = Some(30);
        p.deletion_timestamp = Some(1_000);
        assert_eq!(resume_grace(&p, 990), Some(11));
        assert_eq!(
            resume_grace(&p, 2_000),
            Some(1),
            "past the deadline: 1 (then the 2 s floor)"
        );
        assert_eq!(
            resume_grace(&p, 969),
            None,
            "the full grace is left: nothing to shorten"
        );
        p.deletion_requested = false;
        assert_eq!(resume_grace(&p, 990), None);
    }
}
