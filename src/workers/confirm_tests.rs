//! Orphan confirmation (issue 44, part 1; [`super::confirm`]), against a fake runtime in paused
//! time and a lookup that answers as the API server's watch cache would for each pod name: an
//! orphan is ended only once its object is read gone; an object bound to another node ends
//! nothing, is said once and fails readiness until it is over; a passive agent reads nothing.

use super::confirm::{LookupError, ObjectLookup, READ_BUDGET, RECHECK, Stored};
use super::judge_tests::relists_over;
use super::tests::{Rig, rig};
use crate::cri::fake::Behaviour;
use crate::events::EventReason;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
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
}

const NODE: &str = "node-a";
const SOURCE: &str = "api";

fn bound(uid: &str, node: &str) -> Result<Option<Stored>, LookupError> {
    Ok(Some(Stored {
        uid: uid.into(),
        node: node.into(),
    }))
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
    cache.set(
        "flaky",
        Err(LookupError::Failed("500 etcdserver: leader changed".into())),
    );
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
