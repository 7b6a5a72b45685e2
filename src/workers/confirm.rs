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
//! * a pass's reads never hold the housekeeping loop long: [`READS_AT_ONCE`] in flight, all
//!   within [`READ_BUDGET`] (a small part of the runtime's stall threshold, so a slow API
//!   server never stops the relists nor gets the runtime taken for stalled); none while the
//!   API server is known unreachable. A candidate left unread, or whose read was cut off,
//!   is undecided: read in a later pass, never ended on it;
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
//!   read again, and it is cleared (one line) only once the pod that showed it is read gone
//!   or bound here, or has left the runtime; a read that decided nothing leaves it standing.

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

/// All of one pass's reads get this long together: a pass must never hold the housekeeping
/// loop (and so its relists) anywhere near the runtime's stall threshold (30 s without a
/// relist answer), whatever the API server does. What is not decided by then is read in a
/// later pass.
pub const READ_BUDGET: Duration = Duration::from_secs(3);

/// How many reads of one pass are in flight at once.
pub const READS_AT_ONCE: usize = 4;

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
                Err(e) => Err(LookupError::Failed(e.to_string())),
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

    /// Confirms one pass's `candidates` (reading those due, [`READS_AT_ONCE`] at a time within
    /// [`READ_BUDGET`]; none while the API server is known unreachable), and updates the
    /// problem. A candidate left unread is read in a later pass; nothing is ended on it.
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
        // a runtime pod with no name has no object to read
        let (nameless, to_read): (Vec<Candidate>, Vec<Candidate>) =
            due.into_iter().partition(|c| c.name.is_empty());
        out.gone.extend(nameless.into_iter().map(|c| c.uid));
        let reads = match self.lookup.reachable() {
            true => self.read(&to_read, now + READ_BUDGET).await,
            // every read would wait its timeout: all stay due, read once it is reachable
            false => Vec::new(),
        };
        let mut elsewhere: Option<Mismatch> = None;
        // candidates whose read decided where their object is (gone, or here)
        let mut decided: Vec<PodUid> = Vec::new();
        for (c, read) in to_read.iter().zip(reads) {
            let key = format!("{}/{}", c.namespace, c.name);
            let verdict = match read {
                Read::Answered(read) => verdict(&self.node, &c.uid, read),
                Read::CutOff => {
                    Verdict::Undecided("no answer within the pass's read budget".into())
                }
                // not started: due in the next pass
                Read::NotStarted => continue,
            };
            match verdict {
                Verdict::Gone => {
                    decided.push(c.uid.clone());
                    out.gone.push(c.uid.clone());
                }
                Verdict::Here => {
                    decided.push(c.uid.clone());
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
            if !out.gone.contains(&c.uid) {
                self.state().next_read.insert(c.uid.clone(), now + RECHECK);
            }
        }
        let mut st = self.state();
        match (elsewhere, st.mismatch.clone()) {
            (Some(m), None) => {
                st.mismatch = Some(m.clone());
                out.found = Some(m);
            }
            (Some(m), Some(_)) => st.mismatch = Some(m),
            // fixed only once the pod that showed it is read where it belongs (gone, or here:
            // rebound, deleted) or is no longer in the runtime (ended by its kubelet); a read
            // that decided nothing (an error, a timeout, not read at all) leaves it standing
            (None, Some(p)) => {
                if !all.contains(&p.uid) || decided.contains(&p.uid) {
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
    /// Started, with no answer by the pass's deadline: decides nothing, read again after
    /// [`RECHECK`].
    CutOff,
    /// Not started by the deadline: due in the next pass.
    NotStarted,
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

    /// A watch cache whose reads each take `delay` (an API brownout: a read that times out),
    /// answering `answers` by name (else gone), and recording every read asked of it.
    #[derive(Default)]
    struct Slow {
        delay: Mutex<Duration>,
        unreachable: bool,
        answers: Mutex<HashMap<String, Result<Option<Stored>, LookupError>>>,
        reads: Mutex<Vec<String>>,
    }

    impl ObjectLookup for std::sync::Arc<Slow> {
        fn get<'a>(
            &'a self,
            _namespace: &'a str,
            name: &'a str,
        ) -> Pin<Box<dyn Future<Output = Result<Option<Stored>, LookupError>> + Send + 'a>>
        {
            self.reads.lock().unwrap().push(name.to_owned());
            Box::pin(async move {
                let delay = *self.delay.lock().unwrap();
                tokio::time::sleep(delay).await;
                let answers = self.answers.lock().unwrap();
                answers.get(name).cloned().unwrap_or(Ok(None))
            })
        }

        fn reachable(&self) -> bool {
            !self.unreachable
        }
    }

    fn candidates(names: &[&str]) -> Vec<Candidate> {
        names
            .iter()
            .map(|n| Candidate {
                uid: PodUid::parse(n).unwrap(),
                namespace: "ns".into(),
                name: (*n).to_owned(),
            })
            .collect()
    }

    fn confirmer(slow: &std::sync::Arc<Slow>) -> Confirmer {
        Confirmer::new(Box::new(slow.clone()), "node-a")
    }

    /// The default runtime stall threshold (`runtime_unhealthy_after`): a pass's reads must
    /// stay well under it.
    fn stall_threshold() -> Duration {
        super::super::PipelineConfig::default().runtime_unhealthy_after
    }

    /// A takeover with 20 force-deleted pods left in the runtime, during an API brownout
    /// (every read waits its whole request timeout): one pass's reads take the budget at most,
    /// a small part of the stall threshold, not 20 request timeouts; nothing is ended on a read
    /// that did not answer. Once the API answers again, later passes decide every one of them.
    #[tokio::test(start_paused = true)]
    async fn a_slow_api_holds_a_pass_for_the_read_budget_at_most() {
        assert!(READ_BUDGET * 5 <= stall_threshold());
        let names: Vec<String> = (0..20).map(|i| format!("p{i}")).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let slow = std::sync::Arc::new(Slow {
            delay: Mutex::new(crate::api::REQUEST_TIMEOUT),
            ..Slow::default()
        });
        let c = confirmer(&slow);
        let t0 = Instant::now();
        let out = c.confirm(candidates(&names)).await;
        let took = t0.elapsed();
        assert!(
            took <= READ_BUDGET,
            "one pass's reads took {took:?} (budget {READ_BUDGET:?}, stall threshold {:?})",
            stall_threshold()
        );
        assert!(out.gone.is_empty(), "ended on no answer: {:?}", out.gone);
        // the API answers again: those not read yet are read in the next pass, those whose
        // read was cut off once their RECHECK is over; every one is decided gone by then
        *slow.delay.lock().unwrap() = Duration::ZERO;
        let read_first = slow.reads.lock().unwrap().len();
        let mut gone = std::collections::HashSet::new();
        let end = Instant::now() + RECHECK + Duration::from_secs(2);
        let mut passes = 0;
        while Instant::now() < end && gone.len() < names.len() {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let left = candidates(&names)
                .into_iter()
                .filter(|c| !gone.contains(&c.uid))
                .collect();
            let out = c.confirm(left).await;
            gone.extend(out.gone);
            passes += 1;
            if passes == 1 {
                assert_eq!(
                    gone.len(),
                    names.len() - read_first,
                    "not read yet: read now"
                );
            }
        }
        assert_eq!(gone.len(), names.len(), "after {passes} passes");
    }

    /// While the API server is known unreachable nothing is read (each read would only wait
    /// its timeout) and nothing ended; once it is reachable the candidates are read at once.
    #[tokio::test(start_paused = true)]
    async fn nothing_is_read_while_the_api_is_unreachable() {
        let slow = std::sync::Arc::new(Slow {
            delay: Mutex::new(crate::api::REQUEST_TIMEOUT),
            unreachable: true,
            ..Slow::default()
        });
        let c = confirmer(&slow);
        let t0 = Instant::now();
        let out = c.confirm(candidates(&["a", "b"])).await;
        assert_eq!(t0.elapsed(), Duration::ZERO);
        assert!(out.gone.is_empty());
        assert!(
            slow.reads.lock().unwrap().is_empty(),
            "read while unreachable"
        );
        let up = std::sync::Arc::new(Slow::default());
        let c = confirmer(&up);
        let out = c.confirm(candidates(&["a", "b"])).await;
        assert_eq!(out.gone.len(), 2);
    }

    /// The pod that showed the node name wrong is read again and the read fails (a 500, a
    /// timeout): that decides nothing, so the problem lasts (no "fixed" line, no orphan ended
    /// in that pass). Only a decisive read (gone, or here) or the pod leaving the runtime
    /// clears it.
    #[tokio::test(start_paused = true)]
    async fn a_failed_read_does_not_clear_the_problem() {
        let slow = std::sync::Arc::new(Slow::default());
        slow.answers.lock().unwrap().insert(
            "web".into(),
            Ok(Some(Stored {
                uid: "web".into(),
                node: "kube-node".into(),
            })),
        );
        let c = confirmer(&slow);
        let out = c.confirm(candidates(&["web", "gone"])).await;
        assert!(out.found.is_some() && out.gone.is_empty());
        slow.answers.lock().unwrap().insert(
            "web".into(),
            Err(LookupError::Failed("500 etcdserver: leader changed".into())),
        );
        tokio::time::sleep(RECHECK).await;
        let out = c.confirm(candidates(&["web", "gone"])).await;
        assert_eq!(slow.reads.lock().unwrap().len(), 4, "both read again");
        assert!(out.cleared.is_none(), "cleared by a failed read");
        assert!(c.mismatch().is_some());
        assert!(
            out.gone.is_empty(),
            "ended while the name is wrong: {:?}",
            out.gone
        );
        // a decisive read: its object is gone. Cleared, and the orphans are ended
        slow.answers.lock().unwrap().remove("web");
        tokio::time::sleep(RECHECK).await;
        let out = c.confirm(candidates(&["web", "gone"])).await;
        assert!(out.cleared.is_some());
        assert_eq!(out.gone.len(), 2);
        assert!(c.mismatch().is_none());
    }
}
