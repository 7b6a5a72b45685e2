//! The API side of an eviction, as the control plane does it: the taint manager's
//! `DisruptionTarget` condition and DELETE (`pkg/controller/tainteviction`,
//! `addConditionAndDeletePod`), and an Eviction with its answers
//! (`pkg/registry/core/pod/storage/eviction.go`). Each returns what the runner does next.

use super::runner::key;
use crate::api;
use crate::events::EventReason;
use crate::lifecycle::EvictionSource;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, EvictParams, Patch, PatchParams, Preconditions};
use std::time::Duration;

/// After a 500 (several budgets select the pod): when to try again.
const MISCONFIGURED: Duration = Duration::from_secs(300);

/// An attempt's end.
pub enum Outcome {
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

/// An event the runner records for an attempt (`once`: recorded once per pod and key).
#[derive(Debug, Clone)]
pub struct Note {
    pub reason: EventReason,
    pub message: String,
    pub once: Option<String>,
}

/// What an attempt did.
pub struct Attempt {
    pub outcome: Outcome,
    pub note: Option<Note>,
}

fn done(outcome: &'static str) -> Attempt {
    Attempt {
        outcome: Outcome::Done(outcome),
        note: None,
    }
}

/// The taint manager's deletion: the condition, then the DELETE.
pub async fn delete_for_taint(client: &kube::Client, pod: &Pod) -> Attempt {
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let api: kube::Api<Pod> = kube::Api::namespaced(client.clone(), &ns);
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
    let r =
        api::bounded(api.patch_status(&name, &PatchParams::default(), &Patch::Strategic(&patch)))
            .await;
    match r {
        Ok(_) => {}
        Err(e) if e.code() == Some(404) => return done("gone"),
        Err(e) if e.api().is_some_and(api::uid_mismatch) => return done("gone"),
        Err(e) => {
            return Attempt {
                outcome: Outcome::Retry(
                    e.retry_after().unwrap_or_default(),
                    "failed",
                    Some(e.to_string()),
                ),
                note: None,
            };
        }
    }
    match api::bounded(api.delete(&name, &uid_precondition(pod))).await {
        Ok(_) => {
            tracing::info!(pod = %key(pod), "NoExecute taint: pod deleted");
            Attempt {
                outcome: Outcome::Done("deleted"),
                note: Some(Note {
                    reason: EventReason::TaintManagerEviction,
                    message: format!("Marking for deletion Pod {}", key(pod)),
                    once: None,
                }),
            }
        }
        Err(e) if e.code() == Some(404) => done("gone"),
        Err(e) if e.api().is_some_and(api::precondition_failed) => done("gone"),
        Err(e) => Attempt {
            outcome: Outcome::Retry(
                e.retry_after().unwrap_or_default(),
                "failed",
                Some(format!("delete: {e}")),
            ),
            note: None,
        },
    }
}

/// An Eviction for a pod whose required node affinity no longer matches `node`.
pub async fn evict_for_affinity(client: &kube::Client, node: &str, pod: &Pod) -> Attempt {
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let api: kube::Api<Pod> = kube::Api::namespaced(client.clone(), &ns);
    let ep = EvictParams {
        delete_options: Some(uid_precondition(pod)),
        ..EvictParams::default()
    };
    match api::evict(&api, &name, &ep).await {
        Ok(_) => {
            tracing::info!(pod = %key(pod), "required node affinity: pod evicted");
            Attempt {
                outcome: Outcome::Done("evicted"),
                note: Some(Note {
                    reason: EventReason::NodeAffinityEviction,
                    message: format!(
                        "Evicting Pod {}: its required node affinity no longer matches node {node}",
                        key(pod)
                    ),
                    once: None,
                }),
            }
        }
        Err(e) => {
            let detail = e.detail();
            match e.code() {
                Some(404) => done("gone"),
                Some(409) if e.api().is_some_and(api::precondition_failed) => done("gone"),
                Some(429) => Attempt {
                    note: Some(Note {
                        reason: EventReason::EvictionBlocked,
                        message: format!("Cannot evict Pod {} yet: {detail}", key(pod)),
                        once: Some(format!("blocked:{detail}")),
                    }),
                    outcome: Outcome::Retry(
                        e.retry_after().unwrap_or_default(),
                        "blocked",
                        Some(detail),
                    ),
                },
                Some(500) => Attempt {
                    note: Some(Note {
                        reason: EventReason::EvictionBlocked,
                        message: format!("Cannot evict Pod {}: {detail}", key(pod)),
                        once: Some(format!("misconfigured:{detail}")),
                    }),
                    outcome: Outcome::Retry(MISCONFIGURED, "failed", Some(detail)),
                },
                _ => Attempt {
                    outcome: Outcome::Retry(
                        e.retry_after().unwrap_or_default(),
                        "failed",
                        Some(detail),
                    ),
                    note: None,
                },
            }
        }
    }
}
