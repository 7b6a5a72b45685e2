//! The API side of an eviction, as the control plane does it: the taint manager's
//! `DisruptionTarget` condition and DELETE (`pkg/controller/tainteviction`,
//! `addConditionAndDeletePod`), and an Eviction with its answers
//! (`pkg/registry/core/pod/storage/eviction.go`). Each returns what the runner does next.

use super::runner::{Runner, key, pod_uid};
use crate::api;
use crate::cri::Runtime;
use crate::events::EventReason;
use crate::lifecycle::EvictionSource;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, EvictParams, Patch, PatchParams, Preconditions};
use std::time::Duration;

/// After a 500 (several budgets select the pod): when to try again.
const MISCONFIGURED: Duration = Duration::from_secs(300);

/// An attempt's end.
pub(super) enum Outcome {
    Done(&'static str),
    Retry(Duration, &'static str, Option<String>),
}

/// The pod's own grace, and only this pod (not one recreated under its name).
fn uid_precondition(pod: &Pod) -> DeleteParams {
    DeleteParams {
        preconditions: Some(Preconditions {
            uid: pod.metadata.uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    }
}

impl<R: Runtime> Runner<R> {
    /// Reports `what` about `pod` once (an event and a log line).
    pub(super) fn once(&mut self, pod: &Pod, what: &str, reason: EventReason, message: String) {
        let Some(uid) = pod_uid(pod) else {
            return;
        };
        if self.reported.insert((uid, what.to_owned())) {
            self.event(pod, reason, message);
        }
    }

    pub(super) async fn delete_for_taint(&mut self, pod: &Pod) -> Outcome {
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let api: kube::Api<Pod> = kube::Api::namespaced(self.cx.client.clone(), &ns);
        let now = jiff::Timestamp::now()
            .strftime("%Y-%m-%dT%H:%M:%SZ")
            .to_string();
        let patch = serde_json::json!({
            "metadata": {"uid": uid},
            "status": {"conditions": [{
                "type": "DisruptionTarget",
                "status": "True",
                "reason": EvictionSource::TaintManager.disruption_target(),
                "message": "Taint manager: deleting due to NoExecute taint",
                "lastTransitionTime": now,
            }]}
        });
        let r = api::bounded(api.patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Strategic(&patch),
        ))
        .await;
        match r {
            Ok(_) => {}
            Err(e) if e.code() == Some(404) => return Outcome::Done("gone"),
            Err(e) if e.api().is_some_and(api::uid_mismatch) => return Outcome::Done("gone"),
            Err(e) => {
                tracing::warn!(pod = %key(pod), err = %e, "taint eviction: writing the DisruptionTarget condition failed; retrying");
                return Outcome::Retry(
                    e.retry_after().unwrap_or_default(),
                    "failed",
                    Some(e.to_string()),
                );
            }
        }
        match api::bounded(api.delete(&name, &uid_precondition(pod))).await {
            Ok(_) => {
                tracing::info!(pod = %key(pod), "NoExecute taint: pod deleted");
                self.event(
                    pod,
                    EventReason::TaintManagerEviction,
                    format!("Marking for deletion Pod {}", key(pod)),
                );
                Outcome::Done("deleted")
            }
            Err(e) if e.code() == Some(404) => Outcome::Done("gone"),
            Err(e) if e.api().is_some_and(api::precondition_failed) => Outcome::Done("gone"),
            Err(e) => {
                tracing::warn!(pod = %key(pod), err = %e, "taint eviction: delete failed; retrying");
                Outcome::Retry(
                    e.retry_after().unwrap_or_default(),
                    "failed",
                    Some(e.to_string()),
                )
            }
        }
    }

    pub(super) async fn evict_for_affinity(&mut self, pod: &Pod) -> Outcome {
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let api: kube::Api<Pod> = kube::Api::namespaced(self.cx.client.clone(), &ns);
        let ep = EvictParams {
            delete_options: Some(uid_precondition(pod)),
            ..EvictParams::default()
        };
        match api::bounded(api.evict(&name, &ep)).await {
            Ok(_) => {
                tracing::info!(pod = %key(pod), "required node affinity: pod evicted");
                self.event(
                    pod,
                    EventReason::NodeAffinityEviction,
                    format!(
                        "Evicting Pod {}: its required node affinity no longer matches node {}",
                        key(pod),
                        self.cx.node
                    ),
                );
                Outcome::Done("evicted")
            }
            Err(e) => {
                let detail = e
                    .api()
                    .and_then(|a| match a {
                        kube::Error::Api(s) => Some(
                            s.details
                                .as_ref()
                                .and_then(|d| d.causes.first())
                                .map_or_else(|| s.message.clone(), |c| c.message.clone()),
                        ),
                        _ => None,
                    })
                    .unwrap_or_else(|| e.to_string());
                match e.code() {
                    Some(404) => Outcome::Done("gone"),
                    Some(409) if e.api().is_some_and(api::precondition_failed) => {
                        Outcome::Done("gone")
                    }
                    Some(429) => {
                        self.once(
                            pod,
                            &format!("blocked:{detail}"),
                            EventReason::EvictionBlocked,
                            format!("Cannot evict Pod {} yet: {detail}", key(pod)),
                        );
                        Outcome::Retry(e.retry_after().unwrap_or_default(), "blocked", Some(detail))
                    }
                    Some(500) => {
                        self.once(
                            pod,
                            &format!("misconfigured:{detail}"),
                            EventReason::EvictionBlocked,
                            format!("Cannot evict Pod {}: {detail}", key(pod)),
                        );
                        Outcome::Retry(MISCONFIGURED, "failed", Some(detail))
                    }
                    _ => {
                        Outcome::Retry(e.retry_after().unwrap_or_default(), "failed", Some(detail))
                    }
                }
            }
        }
    }
}
