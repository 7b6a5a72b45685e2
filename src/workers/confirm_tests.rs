//! Orphan confirmation (issue 44, part 1; [`super::confirm`]), against a fake runtime in paused
//! time and a lookup that answers as the API server's watch cache would for each pod name: an
//! orphan is ended only once its object is read gone; an object bound to another node ends
//! nothing, is said once and fails readiness until it is over; a passive agent reads nothing.

use super::confirm::{
    Candidate, Confirmer, LookupError, ObjectLookup, Pass, READ_BUDGET, RECHECK, Stored, Verdict,
    verdict,
};
use super::judge_tests::relists_over;
use super::tests::{Rig, rig};
use crate::backoff::Failure;
use crate::cri::fake::Behaviour;
use crate::events::EventReason;
use crate::pod::PodUid;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the watch cache holds under each name (`ns/name-<uid>` in the fake runtime), and every
/// read asked of it.
#[derive(Default)]
struct Cache {
    objects: Mutex<HashMap<String, Result<Option<Stored>, LookupError>>>,
    reads: Mutex<Vec<String>>,
    /// How long each read takes to answer.
    delay: Mutex<Duration>,
    /// The API server is known unreachable (no read may be asked).
    unreachable: AtomicBool,
}

impl Cache {
    fn set(&self, uid: &str, answer: Result<Option<Stored>, LookupError>) {
        self.objects
            .lock()
            .unwrap()
            .insert(format!("ns/name-{uid}"), answer);
    }
    fn reads_of(&self, uid: &str) -> usize {
        let key = format!("ns/name-{uid}");
        self.reads
            .lock()
            .unwrap()
            .iter()
            .filter(|k| **k == key)
            .count()
    }
}

/// The lookup the workers own, sharing the test's [`Cache`].
struct Shared(Arc<Cache>);

impl ObjectLookup for Shared {
    fn get<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> Pin<Box<dyn Future<Output = Result<Option<Stored>, LookupError>> + Send + 'a>> {
        let key = format!("{namespace}/{name}");
        self.0.reads.lock().unwrap().push(key.clone());
        let answer = self
            .0
            .objects
            .lock()
            .unwrap()
            .get(&key)
            .cloned()
            .unwrap_or(Ok(None));
        let delay = *self.0.delay.lock().unwrap();
        Box::pin(async move {
            tokio::time::sleep(delay).await;
            answer
        })
    }

    fn reachable(&self) -> bool {
        !self.0.unreachable.load(Ordering::SeqCst)
    }
}

const NODE: &str = "node-a";
const SOURCE: &str = "api";

fn bound(uid: &str, node: &str) -> Result<Option<Stored>, LookupError> {
    Ok(Some(Stored {
        uid: uid.into(),
        node: node.into(),
    }))
}

/// A read the API server answered with `code` (and `Retry-After`, in seconds).
fn answered(code: u16, retry_after: Option<u32>) -> Result<Option<Stored>, LookupError> {
    let status = kube::core::Status {
        code,
        reason: "InternalError".into(),
        message: format!("the server answered {code}"),
        details: retry_after.map(|s| kube::core::response::StatusDetails {
            name: String::new(),
            group: String::new(),
            kind: String::new(),
            uid: String::new(),
            causes: Vec::new(),
            retry_after_seconds: s,
        }),
        ..kube::core::Status::default()
    };
    Err(LookupError::Failed(Arc::new(
        crate::api::RequestError::Api(kube::Error::Api(Box::new(status))),
    )))
}

/// An active agent for `NODE` whose one source has listed nothing, with runtime pods `uids`
/// (each one TERM-ignoring container `app`), the metrics connected.
fn confirming(uids: &[&str]) -> (Rig, Arc<Cache>, Arc<crate::metrics::Metrics>) {
    let r = rig();
    let cache = Arc::new(Cache::default());
    r.workers
        .set_orphan_lookup(Box::new(Shared(cache.clone())), NODE);
    let metrics = Arc::new(crate::metrics::Metrics::new());
    r.workers.set_metrics(metrics.clone());
    for uid in uids {
        r.rt.add_pod(uid, &[("app", Behaviour::IgnoreTerm)]);
    }
    r.workers.expect_sources(&[SOURCE]);
    r.workers.mark_source_synced(SOURCE, crate::wall_ns());
    (r, cache, metrics)
}

fn stops(r: &Rig, uid: &str) -> usize {
    r.rt.stops_of(&format!("{uid}-app")).len()
}

fn problem_gauge(m: &crate::metrics::Metrics) -> bool {
    m.encode(crate::metrics::Exposition::Prometheus)
        .contains("reaplet_node_identity_problem{problem=\"pod_bound_elsewhere\"} 1")
}

fn mismatch_events(r: &mut Rig) -> usize {
    let mut n = 0;
    while let Ok(e) = r.events.try_recv() {
        if e.reason == EventReason::NodeNameMismatch {
            n += 1;
        }
    }
    n
}

/// Gone (no object), deleted and made again (another UID): orphans, ended. Bound to this
/// node (the source has not delivered it yet): not an orphan. A failed read: nothing decided
/// until a later read, no sooner than [`RECHECK`], finds it gone.
#[tokio::test(start_paused = true)]
async fn only_an_object_read_gone_makes_an_orphan() {
    let (r, cache, _) = confirming(&["gone", "remade", "here", "flaky"]);
    cache.set("remade", bound("another-uid", NODE));
    cache.set("here", bound("here", NODE));
    cache.set("flaky", answered(500, None));
    relists_over(&r, Duration::from_secs(5)).await;
    assert_eq!(stops(&r, "gone"), 1);
    assert_eq!(stops(&r, "remade"), 1);
    assert_eq!(stops(&r, "here"), 0, "its object is bound to this node");
    assert_eq!(stops(&r, "flaky"), 0, "nothing decided by a failed read");
    assert_eq!(cache.reads_of("gone"), 1, "read once, then ended");
    assert_eq!(
        cache.reads_of("flaky"),
        1,
        "read again no sooner than RECHECK"
    );
    cache.set("flaky", Ok(None));
    relists_over(&r, RECHECK).await;
    assert_eq!(stops(&r, "flaky"), 1);
    assert_eq!(stops(&r, "here"), 0);
    // 15 s of 1 s relists: a candidate still there is read every RECHECK, not every pass
    assert!(cache.reads_of("here") <= 2, "{}", cache.reads_of("here"));
    assert!(r.workers.identity_problem().is_none());
}

/// The scenario: reaplet acts as a name the kubelet is not registered under, so its
/// sources list none of the kubelet's pods. One of them is read bound to `kube-node`: no orphan
/// is ended at all (not even `gone`, whose object is read gone) over the whole window, said
/// once (one event, the gauge, readiness failing with both names); read again every RECHECK.
/// When the pod's object is gone (the name fixed, the pod deleted), it clears and the orphans
/// are ended.
#[tokio::test(start_paused = true)]
async fn an_object_bound_to_another_node_ends_nothing_and_says_so_until_it_is_over() {
    let (mut r, cache, metrics) = confirming(&["web", "gone"]);
    cache.set("web", bound("web", "kube-node"));
    relists_over(&r, Duration::from_secs(30)).await;
    assert_eq!(stops(&r, "web"), 0);
    assert_eq!(
        stops(&r, "gone"),
        0,
        "no orphan ended while the name is wrong"
    );
    let why = r.workers.identity_problem().expect("the problem");
    assert!(
        why.contains("\"node-a\"") && why.contains("\"kube-node\"") && why.contains("ns/name-web"),
        "{why}"
    );
    assert!(problem_gauge(&metrics));
    assert_eq!(mismatch_events(&mut r), 1, "said once, not per pass");
    let reads = cache.reads_of("web");
    assert!(
        (3..=4).contains(&reads),
        "30 s, a read every {RECHECK:?}: {reads}"
    );
    // the pod's object goes (deleted by its kubelet's controller, or the name fixed)
    cache.set("web", Ok(None));
    relists_over(&r, RECHECK + Duration::from_secs(2)).await;
    assert!(r.workers.identity_problem().is_none());
    assert!(!problem_gauge(&metrics));
    assert_eq!(stops(&r, "web"), 1);
    assert_eq!(stops(&r, "gone"), 1);
    assert_eq!(mismatch_events(&mut r), 0);
}

/// A passive standby judges no orphan: nothing is read (fleet cost), nothing ended.
#[tokio::test(start_paused = true)]
async fn a_passive_agent_reads_nothing() {
    let (r, cache, _) = confirming(&["web"]);
    r.authority.set_active(false);
    // and a dead one (sandbox garbage, removed only while acting)
    r.rt.add_pod("dead", &[]);
    relists_over(&r, Duration::from_secs(10)).await;
    assert!(cache.reads.lock().unwrap().is_empty());
    assert_eq!(stops(&r, "web"), 0);
}

/// The sandbox IDs the runtime still has.
async fn sandboxes(r: &Rig) -> Vec<String> {
    use crate::cri::Runtime;
    r.rt.list_sandboxes(None)
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.id)
        .collect()
}

/// A dead runtime pod's sandboxes are removed only once its object is read gone; while one is
/// bound to another node, none is.
#[tokio::test(start_paused = true)]
async fn a_dead_pods_sandbox_is_removed_only_once_its_object_is_gone() {
    use crate::cri::Runtime;
    let (r, cache, _) = confirming(&[]);
    for uid in ["dead-here", "dead-gone"] {
        r.rt.add_pod(uid, &[]);
        r.rt.stop_pod_sandbox(&format!("sb-{uid}")).await.unwrap();
    }
    cache.set("dead-here", bound("dead-here", "kube-node"));
    relists_over(&r, Duration::from_secs(5)).await;
    let left = sandboxes(&r).await;
    assert!(left.contains(&"sb-dead-here".to_string()), "{left:?}");
    assert!(
        left.contains(&"sb-dead-gone".to_string()),
        "held while the name is wrong"
    );
    assert!(r.workers.identity_problem().is_some());
    cache.set("dead-here", Ok(None));
    relists_over(&r, RECHECK + Duration::from_secs(2)).await;
    assert_eq!(sandboxes(&r).await, Vec::<String>::new());
    assert!(r.workers.identity_problem().is_none());
}

/// The review's scenario (issue 44): after a takeover 20 pods the API deleted are left in the
/// runtime, and the API server is in a brownout (every read waits its whole request timeout).
/// The housekeeping loop keeps relisting: no gap between relists longer than a period plus the
/// read budget, so the runtime is never taken for stalled (over twice its threshold); no pod is
/// ended on a read that did not answer.
#[tokio::test(start_paused = true)]
async fn a_slow_api_neither_holds_the_relists_nor_stalls_the_runtime() {
    let uids: Vec<String> = (0..20).map(|i| format!("p{i}")).collect();
    let uids: Vec<&str> = uids.iter().map(String::as_str).collect();
    let (r, cache, _) = confirming(&uids);
    *cache.delay.lock().unwrap() = crate::api::REQUEST_TIMEOUT;
    let cfg = r.workers.inner.config.clone();
    let window = cfg.runtime_unhealthy_after * 2;
    let t0 = tokio::time::Instant::now();
    let task = tokio::spawn(r.workers.clone().run_housekeeping());
    let mut stalled = None;
    while t0.elapsed() < window {
        tokio::time::sleep(Duration::from_millis(500)).await;
        if let Some(s) = r.workers.runtime_stall() {
            stalled.get_or_insert((t0.elapsed(), s));
        }
    }
    r.cancel.cancel();
    let _ = task.await;
    assert!(stalled.is_none(), "runtime taken for stalled: {stalled:?}");
    let at: Vec<Duration> = r.rt.relists().iter().map(|t| *t - t0).collect();
    let gap = at
        .windows(2)
        .map(|w| w[1] - w[0])
        .chain(at.last().map(|l| window - *l))
        .max()
        .unwrap();
    assert!(
        gap <= cfg.relist_period + READ_BUDGET + Duration::from_secs(1),
        "{gap:?} without a relist: {at:?}"
    );
    for uid in &uids {
        assert_eq!(stops(&r, uid), 0, "{uid}: ended on no answer");
    }
    assert!(!cache.reads.lock().unwrap().is_empty());
}

/// The targeted relists the metrics counted (one pod's relist after its container's event).
fn targeted_relists(r: &Rig) -> u64 {
    r.workers
        .inner
        .metrics
        .get()
        .expect("metrics")
        .runtime_relists
        .get_or_create(&crate::metrics::RelistLabel { scope: "pod" })
        .get()
}

/// Review of issue 44, item 1: while the node name is known wrong, a container of another pod
/// (one its source lists) exits, and that pod alone is relisted. That pass reads none of the
/// candidates and must not take the problem for over: readiness and the gauge hold over the
/// whole window (each observed every 50 ms), and the problem is said once (no second event,
/// which a clear and a new finding by the next full pass would bring).
#[tokio::test(start_paused = true)]
async fn another_pods_exit_leaves_the_problem_standing() {
    use super::tests::with_fake_runtime::api_pod;
    let (mut r, cache, metrics) = confirming(&["web"]);
    cache.set("web", bound("web", "kube-node"));
    r.rt.serve_events();
    r.rt.add_pod("other", &[("app", Behaviour::IgnoreTerm)]);
    r.workers.upsert(api_pod("other", 30));
    let task = tokio::spawn(r.workers.clone().run_housekeeping());
    let cfg = r.workers.inner.config.clone();
    let found = tokio::time::Instant::now() + cfg.relist_period * 3;
    while r.workers.identity_problem().is_none() && tokio::time::Instant::now() < found {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(r.workers.identity_problem().is_some(), "never found");
    assert_eq!(mismatch_events(&mut r), 1);
    r.rt.exit_with_event("other-app", 0);
    // the targeted pass at once, and full passes after it (the fast period, then the slow one)
    let window = cfg.relist_period_with_events + RECHECK;
    let end = tokio::time::Instant::now() + window;
    while tokio::time::Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            r.workers.identity_problem().is_some(),
            "cleared by another pod's relist"
        );
        assert!(problem_gauge(&metrics), "the gauge fell");
    }
    r.cancel.cancel();
    let _ = task.await;
    assert!(targeted_relists(&r) >= 1, "no targeted relist ran");
    assert_eq!(mismatch_events(&mut r), 0, "said again");
    assert_eq!(stops(&r, "web"), 0);
}

/// Review of issue 44, item 2: when reaplet's node name is wrong every kubelet pod is a
/// candidate, and while that is known no read can end anything: only the pod that showed it is
/// read, once per [`RECHECK`], not every candidate (a fleet's API cost). Once it is over the
/// others are read at once and the orphans ended.
#[tokio::test(start_paused = true)]
async fn while_the_name_is_wrong_only_the_pod_that_showed_it_is_read() {
    let uids: Vec<String> = (0..10).map(|i| format!("p{i}")).collect();
    let uids: Vec<&str> = uids.iter().map(String::as_str).collect();
    let (r, cache, _) = confirming(&uids);
    for uid in &uids {
        cache.set(uid, bound(uid, "kube-node"));
    }
    relists_over(&r, Duration::from_secs(1)).await;
    let why = r.workers.identity_problem().expect("the problem");
    let shown = uids
        .iter()
        .find(|u| why.contains(&format!("ns/name-{u} ")))
        .copied()
        .expect("the pod that showed it");
    let before: Vec<usize> = uids.iter().map(|u| cache.reads_of(u)).collect();
    let window = RECHECK * 6;
    relists_over(&r, window).await;
    let reads: Vec<usize> = uids
        .iter()
        .zip(&before)
        .map(|(u, b)| cache.reads_of(u) - b)
        .collect();
    let total: usize = reads.iter().sum();
    let of_shown = cache.reads_of(shown) - before[uids.iter().position(|u| *u == shown).unwrap()];
    assert!(
        total <= 7 && of_shown == total,
        "{total} reads in {window:?} while the problem stood (of {shown}: {of_shown}): {reads:?}"
    );
    assert!(of_shown >= 5, "{shown} read {of_shown} times in {window:?}");
    // every pod's object is gone (the kubelet's node deleted): it clears, all are ended
    for uid in &uids {
        cache.set(uid, Ok(None));
    }
    relists_over(&r, RECHECK + Duration::from_secs(2)).await;
    assert!(r.workers.identity_problem().is_none());
    for uid in &uids {
        assert_eq!(stops(&r, uid), 1, "{uid}");
    }
}

/// Candidates `uids` as the fake runtime names them (`ns/name-<uid>`).
fn candidates(uids: &[&str]) -> Vec<Candidate> {
    uids.iter()
        .map(|u| Candidate {
            uid: PodUid::parse(u).unwrap(),
            namespace: "ns".into(),
            name: format!("name-{u}"),
        })
        .collect()
}

/// A confirmer for `NODE` reading `cache`.
fn confirmer(cache: &Arc<Cache>) -> Confirmer {
    Confirmer::new(Box::new(Shared(cache.clone())), NODE)
}

/// The default runtime stall threshold (`runtime_unhealthy_after`): a pass's reads must stay
/// well under it.
fn stall_threshold() -> Duration {
    super::PipelineConfig::default().runtime_unhealthy_after
}

#[test]
fn the_verdict_compares_the_uid_and_the_node() {
    let uid = PodUid::parse("u1").unwrap();
    assert_eq!(verdict("a", &uid, Ok(None)), Verdict::Gone);
    assert_eq!(
        verdict("a", &uid, Err(LookupError::NoRelationship)),
        Verdict::Gone
    );
    assert_eq!(
        verdict("a", &uid, bound("u2", "b")),
        Verdict::Gone,
        "made again"
    );
    assert_eq!(verdict("a", &uid, bound("u1", "a")), Verdict::Here);
    assert_eq!(
        verdict("a", &uid, bound("u1", "b")),
        Verdict::Elsewhere("b".into())
    );
    assert!(matches!(
        verdict("a", &uid, bound("u1", "")),
        Verdict::Undecided(_)
    ));
    assert!(matches!(
        verdict("a", &uid, answered(500, None)),
        Verdict::Failed { failure: Failure::Answered { retry_after: None }, why }
            if why.contains("the server answered 500")
    ));
}

/// A takeover with 20 force-deleted pods left in the runtime, during an API brownout (every
/// read waits its whole request timeout): one pass's reads take the budget at most, a small
/// part of the stall threshold, not 20 request timeouts; nothing is ended on a read that did
/// not answer. Once the API answers again, later passes decide every one of them.
#[tokio::test(start_paused = true)]
async fn a_slow_api_holds_a_pass_for_the_read_budget_at_most() {
    assert!(READ_BUDGET * 5 <= stall_threshold());
    let names: Vec<String> = (0..20).map(|i| format!("p{i}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let cache = Arc::new(Cache::default());
    *cache.delay.lock().unwrap() = crate::api::REQUEST_TIMEOUT;
    let c = confirmer(&cache);
    let t0 = tokio::time::Instant::now();
    let out = c.confirm(candidates(&names), Pass::Full).await;
    let took = t0.elapsed();
    assert!(
        took <= READ_BUDGET,
        "one pass's reads took {took:?} (budget {READ_BUDGET:?}, stall threshold {:?})",
        stall_threshold()
    );
    assert!(out.gone.is_empty(), "ended on no answer: {:?}", out.gone);
    // the API answers again: those not read yet are read in the next pass, those whose read
    // was cut off once their RECHECK is over; every one is decided gone by then
    *cache.delay.lock().unwrap() = Duration::ZERO;
    let read_first = cache.reads.lock().unwrap().len();
    let mut gone = std::collections::HashSet::new();
    let end = tokio::time::Instant::now() + RECHECK + Duration::from_secs(2);
    let mut passes = 0;
    while tokio::time::Instant::now() < end && gone.len() < names.len() {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let left = candidates(&names)
            .into_iter()
            .filter(|c| !gone.contains(&c.uid))
            .collect();
        let out = c.confirm(left, Pass::Full).await;
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

/// While the API server is known unreachable nothing is read (each read would only wait its
/// timeout) and nothing ended; once the same confirmer sees it reachable the candidates are
/// read at once, in the next pass.
#[tokio::test(start_paused = true)]
async fn nothing_is_read_while_the_api_is_unreachable() {
    let cache = Arc::new(Cache::default());
    *cache.delay.lock().unwrap() = crate::api::REQUEST_TIMEOUT;
    cache.unreachable.store(true, Ordering::SeqCst);
    let c = confirmer(&cache);
    let t0 = tokio::time::Instant::now();
    let out = c.confirm(candidates(&["a", "b"]), Pass::Full).await;
    assert_eq!(t0.elapsed(), Duration::ZERO);
    assert!(out.gone.is_empty());
    assert!(
        cache.reads.lock().unwrap().is_empty(),
        "read while unreachable"
    );
    // reachable again, and answering at once: both read in the very next pass, not after a
    // RECHECK
    cache.unreachable.store(false, Ordering::SeqCst);
    *cache.delay.lock().unwrap() = Duration::ZERO;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let out = c.confirm(candidates(&["a", "b"]), Pass::Full).await;
    assert_eq!(out.gone.len(), 2);
    assert_eq!((cache.reads_of("a"), cache.reads_of("b")), (1, 1));
}

/// The pod that showed the node name wrong is read again and the read fails (a 500, a
/// timeout): that decides nothing, so the problem lasts (no "fixed" line, no orphan ended in
/// that pass). Only a decisive read (gone, or here) or the pod leaving the runtime clears it.
#[tokio::test(start_paused = true)]
async fn a_failed_read_does_not_clear_the_problem() {
    let cache = Arc::new(Cache::default());
    cache.set("web", bound("web", "kube-node"));
    let c = confirmer(&cache);
    let out = c.confirm(candidates(&["web", "gone"]), Pass::Full).await;
    assert!(out.found.is_some() && out.gone.is_empty());
    cache.set("web", answered(500, None));
    tokio::time::sleep(RECHECK).await;
    let out = c.confirm(candidates(&["web", "gone"]), Pass::Full).await;
    // while it stands only the pod that showed it is read again (item 2 of the review)
    assert_eq!(cache.reads.lock().unwrap().len(), 3, "only web read again");
    assert_eq!((cache.reads_of("web"), cache.reads_of("gone")), (2, 1));
    assert!(out.cleared.is_none(), "cleared by a failed read");
    assert!(c.mismatch().is_some());
    assert!(
        out.gone.is_empty(),
        "ended while the name is wrong: {:?}",
        out.gone
    );
    // a decisive read: its object is gone. Cleared, and the orphans are ended
    cache.set("web", Ok(None));
    tokio::time::sleep(RECHECK).await;
    let out = c.confirm(candidates(&["web", "gone"]), Pass::Full).await;
    assert!(out.cleared.is_some());
    assert_eq!(out.gone.len(), 2);
    assert!(c.mismatch().is_none());
}

/// Review of issue 44, item 3: a read the API server refuses with 429 and `Retry-After: 60`
/// is not asked again before those 60 s (a pass every second meanwhile), and is asked soon
/// after them.
#[tokio::test(start_paused = true)]
async fn a_429_is_not_read_again_before_its_retry_after() {
    let cache = Arc::new(Cache::default());
    cache.set("busy", answered(429, Some(60)));
    let c = confirmer(&cache);
    let t0 = tokio::time::Instant::now();
    let retry_after = Duration::from_secs(60);
    let mut reads_at = Vec::new();
    while t0.elapsed() < retry_after + Duration::from_secs(3) {
        let before = cache.reads_of("busy");
        let out = c.confirm(candidates(&["busy"]), Pass::Full).await;
        assert!(out.gone.is_empty(), "ended on a 429");
        if cache.reads_of("busy") > before {
            reads_at.push(t0.elapsed());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert_eq!(reads_at.first(), Some(&Duration::ZERO));
    assert!(
        reads_at.len() == 2 && reads_at[1] >= retry_after,
        "read at {reads_at:?}, Retry-After {retry_after:?}"
    );
}

/// Review of issue 44, item 3: a read that keeps failing (500s without `Retry-After`) is read
/// again no sooner than [`RECHECK`], and later ever further apart (the API backoff), not every
/// [`RECHECK`] for ever.
#[tokio::test(start_paused = true)]
async fn a_read_that_keeps_failing_backs_off() {
    let cache = Arc::new(Cache::default());
    cache.set("sick", answered(500, None));
    let c = confirmer(&cache);
    let t0 = tokio::time::Instant::now();
    let window = Duration::from_secs(120);
    let mut reads_at = Vec::new();
    while t0.elapsed() < window {
        let before = cache.reads_of("sick");
        c.confirm(candidates(&["sick"]), Pass::Full).await;
        if cache.reads_of("sick") > before {
            reads_at.push(t0.elapsed());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let gaps: Vec<Duration> = reads_at.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(gaps.iter().all(|g| *g >= RECHECK), "read at {reads_at:?}");
    // a fixed RECHECK would read 12 times; the backoff's steps (at their lowest jitter) 9
    assert!(reads_at.len() <= 9, "read at {reads_at:?}");
    assert!(
        gaps.last().is_some_and(|g| *g >= RECHECK * 2),
        "never backed off: read at {reads_at:?}"
    );
}
