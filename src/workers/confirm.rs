//! Orphan confirmation: a runtime pod no source lists is ended as an orphan (and a dead one's
//! sandboxes removed) only once a read of its object by name shows it really gone. The
//! kubelet's `HandlePodCleanups` trusts its pod manager alone, which is right for the kubelet:
//! its node name is the one it registered. reaplet's may be wrong (a kubelet registered under
//! another name than the host's), and then every pod the kubelet runs is in no list of
//! reaplet's: only a read by name tells a pod that is gone from one bound to another node.
//!
//! Invariants:
//! * read only for orphan candidates (runtime pods unknown to every source, judged only while
//!   acting), one GET from the watch cache (`resourceVersion=0`) by the namespace and name of
//!   the pod's sandbox labels, bounded by [`crate::api::REQUEST_TIMEOUT`]; a candidate is read
//!   again at most every [`RECHECK`];
//! * gone: no object under the name, one with another UID (deleted and made again), or the
//!   Node authorizer's "no relationship" to a node identity (gone, or not this node's: a node
//!   cannot tell, and the node identity's name is the credentials', never wrong); any other
//!   failure decides nothing (read again later);
//! * an object with the pod's UID bound to this node: the source has not delivered it yet, no
//!   orphan; bound to another node: reaplet's node name is wrong. Then nothing is ended as an
//!   orphan and no sandbox or leftover is removed while it lasts; it is said once when found
//!   (an error line, a `NodeNameMismatch` event on the pod, the
//!   `reaplet_node_identity_problem{problem="pod_bound_elsewhere"}` gauge) and while it lasts
//!   `/readyz` fails with the reason ([`super::PodWorkers::identity_problem`]); later passes
//!   read again, and a pass that finds no such pod clears it (one line).

use crate::pod::PodUid;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

/// A candidate whose read decided nothing, or showed it still there, is read again no sooner
/// than this (a handful of GETs a minute at most, only while reaplet acts and such pods exist).
pub const RECHECK: Duration = Duration::from_secs(10);

/// The metric label of the one problem this module finds.
pub const PROBLEM: &str = "pod_bound_elsewhere";

/// What a read of the pod object by name found: its UID and the node it is bound to (empty:
/// none yet).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    pub uid: String,
    pub node: String,
}

/// A read that decided nothing: why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LookupError {
    /// The Node authorizer has no relationship between this node and the object: gone, or
    /// bound to another node (a node identity cannot tell).
    #[error("no relationship between this node and the object")]
    NoRelationship,
    #[error("{0}")]
    Failed(String),
}

/// Reads a pod object by namespace and name (the API server in production).
pub trait ObjectLookup: Send + Sync + 'static {
    fn get<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> Pin<Box<dyn Future<Output = Result<Option<Stored>, LookupError>> + Send + 'a>>;
}

/// The API server's watch cache.
pub struct ApiLookup {
    client: kube::Client,
}

impl ApiLookup {
    pub fn new(client: kube::Client) -> Self {
        Self { client }
    }
}

impl ObjectLookup for ApiLookup {
    fn get<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> Pin<Box<dyn Future<Output = Result<Option<Stored>, LookupError>> + Send + 'a>> {
        Box::pin(async move {
            let api: kube::Api<k8s_openapi::api::core::v1::Pod> =
                kube::Api::namespaced(self.client.clone(), namespace);
            match crate::api::bounded(api.get_with(name, &kube::api::GetParams::any())).await {
                Ok(p) => Ok(Some(Stored {
                    uid: p.metadata.uid.unwrap_or_default(),
                    node: p.spec.and_then(|s| s.node_name).unwrap_or_default(),
                })),
                Err(e) if e.code() == Some(404) => Ok(None),
                Err(e) if e.forbidden_no_relationship() => Err(LookupError::NoRelationship),
                Err(e) => Err(LookupError::Failed(e.to_string())),
            }
        })
    }
}

/// What the read says of one candidate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// No object with its UID: an orphan.
    Gone,
    /// Its object is bound to this node (the source will deliver it): no orphan.
    Here,
    /// Its object is bound to `0`: reaplet's node name is wrong.
    Elsewhere(String),
    /// Nothing decided (a failed read, an object bound to no node): read again later.
    Undecided(String),
}

/// The verdict of a read of candidate `uid` for node `node`.
pub fn verdict(node: &str, uid: &PodUid, read: Result<Option<Stored>, LookupError>) -> Verdict {
    match read {
        Ok(None) | Err(LookupError::NoRelationship) => Verdict::Gone,
        Ok(Some(s)) if s.uid != uid.as_str() => Verdict::Gone,
        Ok(Some(s)) if s.node == node => Verdict::Here,
        Ok(Some(s)) if s.node.is_empty() => {
            Verdict::Undecided("its object is bound to no node".into())
        }
        Ok(Some(s)) => Verdict::Elsewhere(s.node),
        Err(LookupError::Failed(why)) => Verdict::Undecided(why),
    }
}

/// A runtime pod no source knows: its UID and its object's namespace and name (the sandbox's
/// labels).
#[derive(Debug, Clone)]
pub struct Candidate {
    pub uid: PodUid,
    pub namespace: String,
    pub name: String,
}

/// The problem while it lasts: the pod that showed it, and the node its object is bound to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    pub pod: String,
    pub uid: PodUid,
    pub bound_to: String,
}

/// The confirmation's state: the lookup, this agent's node, when each candidate may be read
/// again, and the problem while it lasts. Short locks only, never across a read.
pub struct Confirmer {
    lookup: Box<dyn ObjectLookup>,
    node: String,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    next_read: HashMap<PodUid, Instant>,
    mismatch: Option<Mismatch>,
}

/// What a pass's confirmation decided.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Candidates whose object is gone: orphans (empty while the node name is wrong).
    pub gone: Vec<PodUid>,
    /// The problem was found in this pass, having not been there before.
    pub found: Option<Mismatch>,
    /// The problem was there before and no pass read shows it any more.
    pub cleared: Option<Mismatch>,
}

impl Confirmer {
    pub fn new(lookup: Box<dyn ObjectLookup>, node: &str) -> Self {
        Self {
            lookup,
            node: node.to_owned(),
            state: Mutex::default(),
        }
    }

    pub fn node(&self) -> &str {
        &self.node
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The problem, while it lasts.
    pub fn mismatch(&self) -> Option<Mismatch> {
        self.state().mismatch.clone()
    }

    /// Confirms one pass's `candidates` (reading those due), and updates the problem.
    pub async fn confirm(&self, candidates: Vec<Candidate>) -> Outcome {
        let now = Instant::now();
        let all: Vec<PodUid> = candidates.iter().map(|c| c.uid.clone()).collect();
        let due: Vec<Candidate> = {
            let mut st = self.state();
            // forget candidates no longer in the runtime's pass (ended, or gone)
            st.next_read.retain(|uid, _| all.contains(uid));
            candidates
                .into_iter()
                .filter(|c| st.next_read.get(&c.uid).is_none_or(|t| *t <= now))
                .collect()
        };
        let mut out = Outcome::default();
        let mut elsewhere: Option<Mismatch> = None;
        for c in &due {
            // a runtime pod with no name has no object to read
            if c.name.is_empty() {
                out.gone.push(c.uid.clone());
                continue;
            }
            let read = self.lookup.get(&c.namespace, &c.name).await;
            let key = format!("{}/{}", c.namespace, c.name);
            match verdict(&self.node, &c.uid, read) {
                Verdict::Gone => out.gone.push(c.uid.clone()),
                Verdict::Here => {
                    tracing::debug!(pod = %key, podUID = %c.uid, "runtime pod's object is bound to this node: not an orphan (not delivered yet)");
                }
                Verdict::Elsewhere(node) => {
                    elsewhere.get_or_insert(Mismatch {
                        pod: key,
                        uid: c.uid.clone(),
                        bound_to: node,
                    });
                }
                Verdict::Undecided(why) => {
                    tracing::debug!(pod = %key, podUID = %c.uid, why = %why, "orphan not confirmed: read again later");
                }
            }
        }
        let mut st = self.state();
        for c in &due {
            if !out.gone.contains(&c.uid) {
                st.next_read.insert(c.uid.clone(), now + RECHECK);
            }
        }
        match (elsewhere, st.mismatch.clone()) {
            (Some(m), None) => {
                st.mismatch = Some(m.clone());
                out.found = Some(m);
            }
            (Some(m), Some(_)) => st.mismatch = Some(m),
            // the pod that showed it was read again and shows it no more, or is no longer in
            // the runtime (rebound, deleted, ended by its kubelet): fixed
            (None, Some(p)) => {
                let waiting = all.contains(&p.uid) && !due.iter().any(|c| c.uid == p.uid);
                if !waiting {
                    out.cleared = st.mismatch.take();
                }
            }
            (None, None) => {}
        }
        if st.mismatch.is_some() {
            // nothing is an orphan while the name is wrong; what was found gone is read again
            for uid in out.gone.drain(..) {
                st.next_read.insert(uid, now + RECHECK);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_verdict_compares_the_uid_and_the_node() {
        let uid = PodUid::parse("u1").unwrap();
        let stored = |uid: &str, node: &str| {
            Ok(Some(Stored {
                uid: uid.into(),
                node: node.into(),
            }))
        };
        assert_eq!(verdict("a", &uid, Ok(None)), Verdict::Gone);
        assert_eq!(
            verdict("a", &uid, Err(LookupError::NoRelationship)),
            Verdict::Gone
        );
        assert_eq!(
            verdict("a", &uid, stored("u2", "b")),
            Verdict::Gone,
            "made again"
        );
        assert_eq!(verdict("a", &uid, stored("u1", "a")), Verdict::Here);
        assert_eq!(
            verdict("a", &uid, stored("u1", "b")),
            Verdict::Elsewhere("b".into())
        );
        assert!(matches!(
            verdict("a", &uid, stored("u1", "")),
            Verdict::Undecided(_)
        ));
        assert_eq!(
            verdict("a", &uid, Err(LookupError::Failed("500".into()))),
            Verdict::Undecided("500".into())
        );
    }
}
