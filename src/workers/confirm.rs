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
//!   the pod's sandbox labels, bounded by [`crate::api::REQUEST_TIMEOUT`]; a candidate still
//!   there is read again after [`RECHECK`]; one whose read failed after the delay the crate's
//!   [`Backoff`] draws for it ([`Policy::API`], honoring the server's `Retry-After`), never
//!   sooner than [`RECHECK`];
//! * a pass's reads never hold the housekeeping loop long: [`READS_AT_ONCE`] in flight, all
//!   within [`READ_BUDGET`] (a small part of the runtime's stall threshold, so a slow API
//!   server never stops the relists nor gets the runtime taken for stalled); none while the
//!   API server is known unreachable. A candidate left unread is due in the next pass; one
//!   whose read was cut off failed as a slow answer: neither is ended on it;
//! * gone: no object under the name, one with another UID (deleted and made again), or the
//!   Node authorizer's "no relationship" to a node identity (gone, or not this node's: a node
//!   cannot tell, and the node identity's name is the credentials', never wrong); any other
//!   failure decides nothing (read again later);
//! * an object with the pod's UID bound to this node: the source has not delivered it yet, no
//!   orphan; bound to another node: reaplet's node name is wrong. Then nothing is ended as an
//!   orphan and no sandbox or leftover is removed while it lasts; it is said once when found
//!   (an error line, a `NodeNameMismatch` event on the pod, the
//!   `reaplet_node_identity_problem{problem="pod_bound_elsewhere"}` gauge) and while it lasts
//!   `/readyz` fails with the reason ([`super::PodWorkers::identity_problem`]);
//! * while it lasts no read can end anything: only the pod that showed it is read (every
//!   [`RECHECK`]); the other candidates stay due and are read in the pass that finds it over;
//!   it is over (one line, the gauge back to 0) only once that pod is read gone or bound here,
//!   or a full relist finds it no longer in the runtime; a read that decided nothing leaves it
//!   standing;
//! * only a full relist ([`Pass::Full`]) sees every candidate: only it forgets the timers of
//!   candidates it did not see, or takes the problem's pod's absence for its leaving; a
//!   targeted one (one pod's relist after its container's event) updates only what it read.

use super::{KillRequest, PodSource, PodWorkers};
use crate::backoff::{Backoff, Failure, Policy};
use crate::cri::Runtime;
use crate::lifecycle::KillReason;
use crate::metrics::IdentityProblem;
use crate::pod::{PodInfo, PodUid};
use crate::terminating::grace;
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// A candidate still there (its object bound here, elsewhere or to no node yet) is read again
/// no sooner than this, and so is one whose read failed (a handful of GETs a minute at most,
/// only while reaplet acts and such pods exist).
pub const RECHECK: Duration = Duration::from_secs(10);

/// All of one pass's reads get this long together: a pass must never hold the housekeeping
/// loop (and so its relists) anywhere near the runtime's stall threshold (30 s without a
/// relist answer), whatever the API server does. What is not decided by then is read in a
/// later pass.
pub const READ_BUDGET: Duration = Duration::from_secs(3);

/// How many reads of one pass are in flight at once.
pub const READS_AT_ONCE: usize = 4;

/// What a read of the pod object by name found: its UID and the node it is bound to (empty:
/// none yet).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    pub uid: String,
    pub node: String,
}

/// A read that decided nothing: why.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LookupError {
    /// The Node authorizer has no relationship between this node and the object: gone, or
    /// bound to another node (a node identity cannot tell).
    #[error("no relationship between this node and the object")]
    NoRelationship,
    /// Any other failure: what it tells the backoff is [`crate::api::RequestError::failure`].
    #[error(transparent)]
    Failed(Arc<crate::api::RequestError>),
}

/// Reads a pod object by namespace and name (the API server in production).
pub trait ObjectLookup: Send + Sync + 'static {
    fn get<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> Pin<Box<dyn Future<Output = Result<Option<Stored>, LookupError>> + Send + 'a>>;

    /// Whether a read can be answered now (false: the API server is known unreachable, and
    /// reads would only wait their timeout).
    fn reachable(&self) -> bool {
        true
    }
}

/// The API server's watch cache. Each read's outcome is told to the agent's view of the API
/// server's reachability, and no read is asked while that view says it is unreachable.
pub struct ApiLookup {
    client: kube::Client,
    health: crate::api::health::ApiHealth,
}

impl ApiLookup {
    pub fn new(client: kube::Client, health: crate::api::health::ApiHealth) -> Self {
        Self { client, health }
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
            let read = crate::api::bounded(api.get_with(name, &kube::api::GetParams::any())).await;
            match &read {
                Ok(_) => self.health.answered(),
                Err(e) => self.health.failed(e.failure()),
            }
            match read {
                Ok(p) => Ok(Some(Stored {
                    uid: p.metadata.uid.unwrap_or_default(),
                    node: p.spec.and_then(|s| s.node_name).unwrap_or_default(),
                })),
                Err(e) if e.code() == Some(404) => Ok(None),
                Err(e) if e.forbidden_no_relationship() => Err(LookupError::NoRelationship),
                Err(e) => Err(LookupError::Failed(Arc::new(e))),
            }
        })
    }

    fn reachable(&self) -> bool {
        self.health.is_reachable()
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
    /// Its object is there, bound to no node: nothing decided, read again after [`RECHECK`].
    Undecided(String),
    /// The read failed: nothing decided, read again after the candidate's backoff.
    Failed { failure: Failure, why: String },
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
        Err(LookupError::Failed(e)) => Verdict::Failed {
            failure: e.failure(),
            why: e.to_string(),
        },
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

/// What a pass's relist saw: its candidates are all of the runtime's ([`Pass::Full`]) or
/// those of the pods it relisted ([`Pass::Targeted`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pass {
    Full,
    Targeted,
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
    /// When each candidate may be read again (absent: due).
    next_read: HashMap<PodUid, Instant>,
    /// The backoff of each candidate whose last read failed.
    failing: HashMap<PodUid, Backoff>,
    mismatch: Option<Mismatch>,
}

/// What a pass's confirmation decided.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Candidates whose object is gone: orphans (empty while the node name is wrong).
    pub gone: Vec<PodUid>,
    /// The problem was found in this pass, having not been there before.
    pub found: Option<Mismatch>,
    /// The problem was there before and is over.
    pub cleared: Option<Mismatch>,
}

/// What one round of reads decided.
#[derive(Default)]
struct Judged {
    gone: Vec<PodUid>,
    /// Read gone or bound here.
    decided: HashSet<PodUid>,
    /// The first read bound to another node.
    elsewhere: Option<Mismatch>,
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

    /// Whether the problem stands.
    pub fn has_mismatch(&self) -> bool {
        self.state().mismatch.is_some()
    }

    /// Confirms one pass's `candidates` (reading those due, [`READS_AT_ONCE`] at a time within
    /// [`READ_BUDGET`]; none while the API server is known unreachable; only the problem's
    /// pod while it stands), and updates the problem. A candidate left unread is read in a
    /// later pass; nothing is ended on it.
    pub async fn confirm(&self, candidates: Vec<Candidate>, pass: Pass) -> Outcome {
        let now = Instant::now();
        let deadline = now + READ_BUDGET;
        let seen: HashSet<PodUid> = candidates.iter().map(|c| c.uid.clone()).collect();
        let standing = {
            let mut st = self.state();
            if pass == Pass::Full {
                // forget candidates no longer in the runtime (ended, or gone)
                st.next_read.retain(|uid, _| seen.contains(uid));
                st.failing.retain(|uid, _| seen.contains(uid));
            }
            st.mismatch.clone()
        };
        // while the name is known wrong only the pod that showed it is read: no other read
        // could end anything
        let (first, rest): (Vec<Candidate>, Vec<Candidate>) = candidates
            .into_iter()
            .partition(|c| standing.as_ref().is_none_or(|m| m.uid == c.uid));
        let mut judged = self.judge(first, now, deadline).await;
        // over once its pod is read where it belongs (gone, or here: rebound, deleted) or a
        // full relist no longer finds it (ended by its kubelet); a read that decided nothing
        // (an error, a timeout, not read at all) leaves it standing
        let over = standing.as_ref().is_some_and(|m| {
            judged.elsewhere.is_none()
                && (judged.decided.contains(&m.uid)
                    || (pass == Pass::Full && !seen.contains(&m.uid)))
        });
        if over {
            // the others, held while it stood, are read now
            let more = self.judge(rest, now, deadline).await;
            judged.gone.extend(more.gone);
            judged.elsewhere = more.elsewhere;
        }
        let mut out = Outcome {
            gone: judged.gone,
            ..Outcome::default()
        };
        let mut st = self.state();
        match (judged.elsewhere, standing) {
            (Some(m), None) => {
                st.mismatch = Some(m.clone());
                out.found = Some(m);
            }
            // the same problem, maybe shown by another pod now
            (Some(m), Some(_)) => st.mismatch = Some(m),
            (None, Some(_)) if over => out.cleared = st.mismatch.take(),
            (None, _) => {}
        }
        if st.mismatch.is_some() {
            // nothing is an orphan while the name is wrong: what was found gone is due again,
            // read once it is over
            for uid in out.gone.drain(..) {
                st.next_read.remove(&uid);
            }
        }
        out
    }

    /// Reads those of `candidates` that are due (a nameless one has no object to read: gone)
    /// until `deadline`, and what their reads say; sets when each is read again.
    async fn judge(&self, candidates: Vec<Candidate>, now: Instant, deadline: Instant) -> Judged {
        let mut judged = Judged::default();
        let due: Vec<Candidate> = {
            let st = self.state();
            candidates
                .into_iter()
                .filter(|c| st.next_read.get(&c.uid).is_none_or(|t| *t <= now))
                .collect()
        };
        let (nameless, to_read): (Vec<Candidate>, Vec<Candidate>) =
            due.into_iter().partition(|c| c.name.is_empty());
        judged.gone.extend(nameless.into_iter().map(|c| c.uid));
        if to_read.is_empty() || !self.lookup.reachable() {
            // every read would wait its timeout: all stay due, read once it is reachable
            return judged;
        }
        let reads = self.read(&to_read, deadline).await;
        for (c, read) in to_read.into_iter().zip(reads) {
            let key = format!("{}/{}", c.namespace, c.name);
            let verdict = match read {
                Read::Answered(read) => verdict(&self.node, &c.uid, read),
                Read::CutOff => Verdict::Failed {
                    failure: Failure::Slow,
                    why: "no answer within the pass's read budget".into(),
                },
                // not started: due in the next pass
                Read::NotStarted => continue,
            };
            let mut st = self.state();
            let next = match verdict {
                Verdict::Failed { failure, why } => {
                    let wait = st
                        .failing
                        .entry(c.uid.clone())
                        .or_insert_with(|| Backoff::new(Policy::API))
                        .failed(failure, rand::random())
                        .max(RECHECK);
                    tracing::debug!(pod = %key, podUID = %c.uid, why = %why, retryIn = ?wait, "orphan not confirmed: read again later");
                    st.next_read.insert(c.uid, now + wait);
                    continue;
                }
                Verdict::Gone => {
                    judged.decided.insert(c.uid.clone());
                    judged.gone.push(c.uid.clone());
                    None
                }
                Verdict::Here => {
                    judged.decided.insert(c.uid.clone());
                    tracing::debug!(pod = %key, podUID = %c.uid, "runtime pod's object is bound to this node: not an orphan (not delivered yet)");
                    Some(now + RECHECK)
                }
                Verdict::Elsewhere(node) => {
                    judged.elsewhere.get_or_insert(Mismatch {
                        pod: key,
                        uid: c.uid.clone(),
                        bound_to: node,
                    });
                    Some(now + RECHECK)
                }
                Verdict::Undecided(why) => {
                    tracing::debug!(pod = %key, podUID = %c.uid, why = %why, "orphan not confirmed: read again later");
                    Some(now + RECHECK)
                }
            };
            // answered: the failures are over
            st.failing.remove(&c.uid);
            match next {
                Some(at) => st.next_read.insert(c.uid, at),
                None => st.next_read.remove(&c.uid),
            };
        }
        judged
    }

    /// Reads `candidates` [`READS_AT_ONCE`] at a time until `deadline`: one [`Read`] for each,
    /// in order. Reads still waiting at the deadline are dropped (cancelled).
    async fn read(&self, candidates: &[Candidate], deadline: Instant) -> Vec<Read> {
        use futures_util::StreamExt;
        let mut reads: Vec<Read> = candidates.iter().map(|_| Read::NotStarted).collect();
        let mut waiting = candidates.iter().enumerate();
        let mut in_flight = futures_util::stream::FuturesUnordered::new();
        in_flight.extend(
            waiting
                .by_ref()
                .take(READS_AT_ONCE)
                .map(|(i, c)| self.read_one(i, c)),
        );
        loop {
            match tokio::time::timeout_at(deadline, in_flight.next()).await {
                Ok(Some((i, read))) => {
                    reads[i] = Read::Answered(read);
                    in_flight.extend(waiting.next().map(|(i, c)| self.read_one(i, c)));
                }
                Ok(None) => break,
                Err(_) => {
                    let started = waiting.next().map_or(candidates.len(), |(i, _)| i);
                    for r in reads.iter_mut().take(started) {
                        if matches!(r, Read::NotStarted) {
                            *r = Read::CutOff;
                        }
                    }
                    tracing::debug!(
                        read = started,
                        candidates = candidates.len(),
                        budget = ?READ_BUDGET,
                        "orphan confirmation out of time: the rest is read in a later pass"
                    );
                    break;
                }
            }
        }
        reads
    }

    /// Reads candidate `i`, `c`.
    async fn read_one(
        &self,
        i: usize,
        c: &Candidate,
    ) -> (usize, Result<Option<Stored>, LookupError>) {
        (i, self.lookup.get(&c.namespace, &c.name).await)
    }
}

/// One candidate's read in a pass.
enum Read {
    Answered(Result<Option<Stored>, LookupError>),
    /// Started, with no answer by the pass's deadline: a slow answer (the candidate's backoff
    /// grows).
    CutOff,
    /// Not started by the deadline: due in the next pass.
    NotStarted,
}

impl<R: Runtime> PodWorkers<R> {
    /// Ends the `orphans` (and removes the finished orphans' sandboxes, `gc`) whose pods a read
    /// confirms gone; all of them when there is no API to read. Says so when the reads show
    /// the node's name wrong, and when that is over. Returns the sandboxes to remove.
    pub(super) async fn end_confirmed_orphans(
        &self,
        orphans: Vec<(PodInfo, Candidate)>,
        gc: Vec<(Candidate, Vec<String>)>,
        pass: Pass,
    ) -> Vec<String> {
        let (orphans, gc) = self.confirm_orphans(orphans, gc, pass).await;
        for info in orphans {
            tracing::info!(pod = %info.key(), podUID = %info.uid, "orphaned runtime pod found");
            if let Some(m) = self.inner.metrics.get() {
                m.orphaned_runtime_pods.inc();
            }
            let kill = KillRequest::new(KillReason::Orphan).grace(Some(grace::ORPHAN_GRACE));
            self.deliver_from(info, PodSource::Runtime, kill);
        }
        gc
    }

    /// The orphans and the finished orphans' sandboxes whose pods a read confirms gone
    /// ([`Confirmer::confirm`]).
    async fn confirm_orphans(
        &self,
        orphans: Vec<(PodInfo, Candidate)>,
        gc: Vec<(Candidate, Vec<String>)>,
        pass: Pass,
    ) -> (Vec<PodInfo>, Vec<String>) {
        let Some(confirmer) = self.inner.confirm.get() else {
            let ids = gc.into_iter().flat_map(|(_, ids)| ids).collect();
            return (orphans.into_iter().map(|(p, _)| p).collect(), ids);
        };
        // a full pass with no candidate still reads nothing, but may find the problem over
        // (its pod left the runtime)
        if orphans.is_empty()
            && gc.is_empty()
            && (pass == Pass::Targeted || !confirmer.has_mismatch())
        {
            return (Vec::new(), Vec::new());
        }
        let candidates = orphans
            .iter()
            .map(|(_, c)| c.clone())
            .chain(gc.iter().map(|(c, _)| c.clone()))
            .collect();
        let out = confirmer.confirm(candidates, pass).await;
        if let Some(m) = &out.found {
            self.mismatch_found(confirmer.node(), m);
        }
        if let Some(m) = &out.cleared {
            tracing::info!(node = %confirmer.node(), pod = %m.pod, "no runtime pod's object is bound to another node any more: orphans are confirmed and ended again");
            if let Some(metrics) = self.inner.metrics.get() {
                metrics.set_identity_problem(IdentityProblem::PodBoundElsewhere, false);
            }
        }
        let gone: HashSet<&PodUid> = out.gone.iter().collect();
        (
            orphans
                .into_iter()
                .filter(|(p, _)| gone.contains(&p.uid))
                .map(|(p, _)| p)
                .collect(),
            gc.into_iter()
                .filter(|(c, _)| gone.contains(&c.uid))
                .flat_map(|(_, ids)| ids)
                .collect(),
        )
    }

    /// Says, once, that reaplet acting as `node` is wrong: an error line, an event on the pod
    /// that showed it, the gauge.
    fn mismatch_found(&self, node: &str, m: &Mismatch) {
        tracing::error!(
            node = %node,
            boundTo = %m.bound_to,
            pod = %m.pod,
            podUID = %m.uid,
            "reaplet's node name is wrong: a runtime pod in no list of this node's has its object bound to another node; no orphan is ended until the name is fixed"
        );
        let (namespace, name) = m.pod.split_once('/').unwrap_or(("", &m.pod));
        self.inner.events.record(crate::events::PodEvent {
            uid: m.uid.clone(),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            reason: crate::events::EventReason::NodeNameMismatch,
            message: format!(
                "Not ended as an orphan: this pod is bound to node {}, reaplet on its host acts as node {node} (its node name is wrong)",
                m.bound_to
            ),
            annotations: Default::default(),
        });
        if let Some(metrics) = self.inner.metrics.get() {
            metrics.set_identity_problem(IdentityProblem::PodBoundElsewhere, true);
        }
    }
}
