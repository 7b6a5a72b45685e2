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
use crate::grace;
use crate::pod::{PodInfo, PodUid};
use crate::workers::PodWorkers;
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
}
