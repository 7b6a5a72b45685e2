//! reaplet's own pod (issue 30, item 3; [`super::own_pod`]), against a fake runtime in paused
//! time: never an orphan, never stopped while a kubelet holds the node, and with the kubelet
//! dead ended last, its status handed over before anything of it stops.

use super::judge_tests::relists_over;
use super::tests::rig_with;
use super::tests::with_fake_runtime::{api_pod, deleted, desire, until};
use super::*;
use crate::cri::fake::{Behaviour, Call};
use crate::pod::PodUid;
use std::time::Duration;
use tokio::time::Instant;

/// One call to the status manager: which, for whom, the reason, how many container finals,
/// when (virtual time).
type Told = (String, PodUid, Option<KillReason>, usize, Instant);

/// What the status manager was told.
#[derive(Default)]
struct Recorder {
    told: Mutex<Vec<Told>>,
}

impl StatusSink for Recorder {
    fn pod_terminated(
        &self,
        pod: &PodInfo,
        reason: Option<&KillReason>,
        finals: &[ContainerFinal],
    ) {
        self.told.lock().unwrap().push((
            "terminated".into(),
            pod.uid.clone(),
            reason.cloned(),
            finals.len(),
            Instant::now(),
        ));
    }
    fn pod_finished(&self, pod: &PodInfo) {
        self.told.lock().unwrap().push((
            "finished".into(),
            pod.uid.clone(),
            None,
            0,
            Instant::now(),
        ));
    }
    fn withdraw(&self, uid: &PodUid) {
        self.told
            .lock()
            .unwrap()
            .push(("withdrawn".into(), uid.clone(), None, 0, Instant::now()));
    }
}

impl Recorder {
    fn of(&self, uid: &str) -> Vec<(String, Option<KillReason>, usize, Instant)> {
        self.told
            .lock()
            .unwrap()
            .iter()
            .filter(|t| t.1.as_str() == uid)
            .map(|t| (t.0.clone(), t.2.clone(), t.3, t.4))
            .collect()
    }
}

fn sandbox_stops(calls: &[Call], id: &str) -> Vec<Instant> {
    calls
        .iter()
        .filter_map(|c| match c {
            Call::StopPodSandbox { id: s, at } if s == id => Some(*at),
            _ => None,
        })
        .collect()
}

/// reaplet active, its own pod (`own`, grace 30) and another (`other`, grace 10), both
/// TERM-ignoring, running and desired; the status manager a [`Recorder`].
fn own_and_other() -> (super::tests::Rig, PodUid, Arc<Recorder>, PodInfo, PodInfo) {
    let own = PodUid::parse("own").unwrap();
    let r = rig_with(|c| c.own_pod = Some(own.clone()));
    let rec = Arc::new(Recorder::default());
    r.workers.set_status_sink(rec.clone());
    r.rt.add_pod("own", &[("app", Behaviour::IgnoreTerm)]);
    r.rt.add_pod("other", &[("app", Behaviour::IgnoreTerm)]);
    let me = api_pod("own", 30);
    let other = api_pod("other", 10);
    desire(&r.workers, &[me.clone(), other.clone()]);
    (r, own, rec, me, other)
}

/// Beside a live kubelet (standby, passive): the own pod and a real orphan sit in the
/// runtime, unknown to every source. Over 10 s of relists (active) the orphan is stopped and
/// the own pod is not. Its API deletion and an explicit eviction kill, with the kubelet holding
/// the node, then stop nothing over a further 10 s: the deletion is the kubelet's.
#[tokio::test(start_paused = true)]
async fn reaplets_own_pod_is_never_an_orphan_and_never_stopped_beside_a_kubelet() {
    let own = PodUid::parse("own").unwrap();
    let r = rig_with(|c| c.own_pod = Some(own.clone()));
    r.rt.add_pod("own", &[("app", Behaviour::IgnoreTerm)]);
    r.rt.add_pod("orphan", &[("app", Behaviour::IgnoreTerm)]);
    r.workers.expect_sources(&["file"]);
    r.workers.mark_source_synced("file", crate::wall_ns());
    relists_over(&r, Duration::from_secs(10)).await;
    assert!(
        r.rt.stops_of("own-app").is_empty(),
        "own: stopped as an orphan"
    );
    assert_eq!(r.rt.stops_of("orphan-app").len(), 1, "the orphan");
    r.authority.set_active(false);
    let p = api_pod("own", 30);
    r.workers.upsert(p.clone());
    r.workers.upsert(deleted(&p, 30));
    let evicted = KillRequest::new(KillReason::Evicted(
        crate::lifecycle::EvictionSource::TaintManager,
    ));
    assert!(r.workers.kill(&own, evicted).is_ok());
    relists_over(&r, Duration::from_secs(10)).await;
    let calls = r.rt.calls();
    assert!(
        r.rt.stops_of("own-app").is_empty(),
        "own: stopped: {calls:?}"
    );
    assert!(sandbox_stops(&calls, "sb-own").is_empty(), "{calls:?}");
    // known (desired), but no worker: still in sync
    assert_eq!(r.workers.view(&own).unwrap().phase, PodPhase::Sync);
}

/// With the kubelet dead (reaplet active): the own pod and a TERM-ignoring grace-10 pod are
/// deleted at once. The own pod's status goes to the status manager only once the other pod is
/// stopped (its SIGKILL at t0+10 s) and the workers settled; nothing of the own pod stops while
/// its object is still there (a 10 s window). A kubelet holds the node again: the status is
/// withdrawn, and with the object gone nothing stops for 10 s; once reaplet is active again
/// (and settled), its sandbox is stopped (that stops its containers, reaplet among them), and
/// no container of it is stopped on its own. An eviction kill for it is dropped throughout.
#[tokio::test(start_paused = true)]
async fn reaplets_own_deleted_pod_is_ended_last_and_status_first() {
    let (r, own, rec, me, other) = own_and_other();
    let t0 = Instant::now();
    r.workers.upsert(deleted(&me, 30));
    r.workers.upsert(deleted(&other, 10));
    let evicted = KillRequest::new(KillReason::Evicted(
        crate::lifecycle::EvictionSource::TaintManager,
    ));
    assert!(r.workers.kill(&own, evicted).is_ok());
    until(&r.workers, "other", PodPhase::Finished).await;
    let other_stops = r.rt.stops_of("other-app");
    assert_eq!(other_stops.len(), 1, "{other_stops:?}");
    let other_killed = t0 + Duration::from_secs(10);
    // the object stays: the status is handed over, nothing stops
    tokio::time::sleep(Duration::from_secs(10)).await;
    let told = rec.of("own");
    assert_eq!(told.len(), 2, "terminated, then finished: {told:?}");
    assert_eq!(told[0].0, "terminated");
    assert_eq!(told[0].1, Some(KillReason::Deleted));
    assert_eq!(told[0].2, 0, "no container's final state is known yet");
    assert_eq!(told[1].0, "finished");
    assert!(
        told[0].3 >= other_killed + super::own_pod::SETTLE,
        "the own pod's status came before the other pod stopped and the workers settled: {told:?}"
    );
    // what the status manager writes from that: the kubelet's answer for a container it
    // could not observe at the end
    let st = crate::status::terminal_status(&deleted(&me, 30), &[], Some(&KillReason::Deleted))
        .unwrap()
        .unwrap();
    assert_eq!(st.phase, crate::status::Phase::Failed);
    let calls = r.rt.calls();
    assert!(sandbox_stops(&calls, "sb-own").is_empty(), "{calls:?}");
    assert!(r.rt.stops_of("own-app").is_empty(), "{calls:?}");
    // a kubelet is back: the status is withdrawn, and the object going stops nothing
    r.authority.set_active(false);
    r.workers.remove(&own, None);
    tokio::time::sleep(Duration::from_secs(10)).await;
    let told = rec.of("own");
    assert_eq!(told.len(), 3, "{told:?}");
    assert_eq!(told[2].0, "withdrawn");
    let calls = r.rt.calls();
    assert!(sandbox_stops(&calls, "sb-own").is_empty(), "{calls:?}");
    // and gone again: reaplet ends its own pod, once settled
    let active = Instant::now();
    r.authority.set_active(true);
    tokio::time::sleep(super::own_pod::SETTLE + Duration::from_secs(2)).await;
    let calls = r.rt.calls();
    let stops = sandbox_stops(&calls, "sb-own");
    assert_eq!(stops.len(), 1, "{calls:?}");
    let after = stops[0] - active;
    assert!(
        after >= super::own_pod::SETTLE && after <= super::own_pod::SETTLE + Duration::from_secs(1),
        "{after:?}"
    );
    assert!(
        r.rt.stops_of("own-app").is_empty(),
        "no container of its own is stopped on its own: {calls:?}"
    );
    assert_eq!(r.rt.exit_code("own-app"), Some(137));
    assert_eq!(rec.of("own").len(), 3, "no status after the object went");
}

/// A force delete of the own pod (its object gone at once, no status to write) arrives just
/// before another pod's deletion, as a relist's removals or a Node's pods force-deleted one by
/// one do. The other pod still gets its worker and its whole grace (a TERM-ignoring grace 10):
/// the own sandbox is stopped only after that pod's SIGKILL and the workers settled.
#[tokio::test(start_paused = true)]
async fn a_force_deleted_own_pod_still_waits_for_deletions_of_the_same_batch() {
    let (r, own, rec, _, other) = own_and_other();
    let t0 = Instant::now();
    r.workers.remove(&own, Some(1));
    tokio::time::sleep(Duration::from_secs(2)).await;
    r.workers.upsert(deleted(&other, 10));
    until(&r.workers, "other", PodPhase::Finished).await;
    tokio::time::sleep(super::own_pod::SETTLE + Duration::from_secs(2)).await;
    let calls = r.rt.calls();
    let stops = sandbox_stops(&calls, "sb-own");
    assert_eq!(stops.len(), 1, "{calls:?}");
    let other_killed = t0 + Duration::from_secs(12);
    assert!(
        stops[0] >= other_killed + super::own_pod::SETTLE,
        "the own sandbox was stopped {:?} after t0, before the other pod's end and the settling",
        stops[0] - t0
    );
    assert_eq!(r.rt.exit_code("other-app"), Some(137));
    assert!(rec.of("own").is_empty(), "a status for a force-deleted pod");
}
