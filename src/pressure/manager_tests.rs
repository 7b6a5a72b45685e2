use super::*;
use crate::pressure::thresholds::parse_threshold_config;
use std::collections::BTreeMap;

const GI: i64 = 1 << 30;
const MI: i64 = 1 << 20;

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A manager from the kubelet's four maps (`enforceNodeAllocatable` without `pods` unless
/// `allocatable`), transition period 5 min, `evictionMaxPodGracePeriod` 30.
fn manager(
    hard: &[(&str, &str)],
    soft: &[(&str, &str)],
    grace: &[(&str, &str)],
    reclaim: &[(&str, &str)],
    allocatable: bool,
) -> Manager {
    let enforce: Vec<String> = if allocatable {
        vec!["pods".into()]
    } else {
        vec![]
    };
    let thresholds =
        parse_threshold_config(&enforce, &map(hard), &map(soft), &map(grace), &map(reclaim))
            .expect("valid thresholds");
    Manager::new(PressureSettings {
        thresholds,
        max_pod_grace_period: 30,
        pressure_transition_period: Duration::from_secs(300),
    })
}

fn memory(available: i64, capacity: i64) -> Observations {
    Observations {
        memory: Some(Observation {
            available,
            capacity,
        }),
        allocatable_memory: None,
        pid: None,
    }
}

fn at(t0: Instant, secs: u64) -> Instant {
    t0 + Duration::from_secs(secs)
}

#[test]
fn a_hard_threshold_is_met_only_strictly_below() {
    let mut m = manager(&[("memory.available", "1Gi")], &[], &[], &[], false);
    let t0 = Instant::now();
    let p = m.synchronize(t0, &memory(GI, 8 * GI));
    assert!(p.met.is_empty() && p.reclaim.is_none(), "{p:?}");
    assert!(p.conditions.is_empty());
    let p = m.synchronize(at(t0, 1), &memory(GI - 1, 8 * GI));
    let r = p.reclaim.expect("met one byte below");
    assert_eq!(r.signal, Signal::MemoryAvailable);
    assert!(r.hard);
    assert_eq!(r.resource, Resource::Memory);
    assert_eq!(r.quantity_text, "1Gi");
    assert_eq!(p.conditions, vec![NodeCondition::MemoryPressure]);
    assert_eq!(m.pod_grace(&r, Some(600)), HARD_EVICTION_GRACE);
}

#[test]
fn a_soft_threshold_acts_after_its_grace_met_continuously() {
    let mut m = manager(
        &[],
        &[("memory.available", "2Gi")],
        &[("memory.available", "30s")],
        &[],
        false,
    );
    let t0 = Instant::now();
    let low = memory(GI, 8 * GI);
    let p = m.synchronize(t0, &low);
    // the condition at once, the eviction only after the grace
    assert_eq!(p.conditions, vec![NodeCondition::MemoryPressure]);
    assert!(p.reclaim.is_none());
    assert!(m.synchronize(at(t0, 29), &low).reclaim.is_none());
    // a pass that sees it unmet restarts the count
    assert!(
        m.synchronize(at(t0, 29), &memory(3 * GI, 8 * GI))
            .reclaim
            .is_none()
    );
    assert!(m.synchronize(at(t0, 31), &low).reclaim.is_none());
    assert!(m.synchronize(at(t0, 60), &low).reclaim.is_none());
    let r = m
        .synchronize(at(t0, 61), &low)
        .reclaim
        .expect("met for 30 s");
    assert!(!r.hard);
    // min(evictionMaxPodGracePeriod 30, the pod's own)
    assert_eq!(m.pod_grace(&r, Some(10)), 10);
    assert_eq!(m.pod_grace(&r, Some(600)), 30);
    assert_eq!(m.pod_grace(&r, None), 30);
}

#[test]
fn minimum_reclaim_keeps_a_met_threshold_met_until_reclaimed() {
    let mut m = manager(
        &[("memory.available", "1Gi")],
        &[],
        &[],
        &[("memory.available", "500Mi")],
        false,
    );
    let t0 = Instant::now();
    assert!(
        m.synchronize(t0, &memory(GI - MI, 8 * GI))
            .reclaim
            .is_some()
    );
    // above the threshold, below threshold + reclaim: still met
    let p = m.synchronize(at(t0, 1), &memory(GI + 100 * MI, 8 * GI));
    assert!(p.reclaim.is_some(), "{p:?}");
    // reclaimed: threshold + reclaim reached
    let p = m.synchronize(at(t0, 2), &memory(GI + 500 * MI, 8 * GI));
    assert!(p.reclaim.is_none(), "{p:?}");
    // not met before: minimum reclaim does not apply to a threshold never met
    let mut fresh = manager(
        &[("memory.available", "1Gi")],
        &[],
        &[],
        &[("memory.available", "500Mi")],
        false,
    );
    assert!(
        fresh
            .synchronize(t0, &memory(GI + 100 * MI, 8 * GI))
            .reclaim
            .is_none()
    );
}

#[test]
fn a_condition_holds_for_the_transition_period_after_the_last_pass_that_saw_it() {
    let mut m = manager(&[("memory.available", "1Gi")], &[], &[], &[], false);
    let t0 = Instant::now();
    m.synchronize(t0, &memory(GI / 2, 8 * GI));
    let ok = memory(4 * GI, 8 * GI);
    let p = m.synchronize(at(t0, 299), &ok);
    assert_eq!(p.conditions, vec![NodeCondition::MemoryPressure]);
    assert!(p.reclaim.is_none());
    assert!(m.synchronize(at(t0, 300), &ok).conditions.is_empty());
}

#[test]
fn memory_goes_before_pids_and_percentages_follow_the_capacity() {
    let mut m = manager(
        &[("pid.available", "10%"), ("memory.available", "10%")],
        &[],
        &[],
        &[],
        false,
    );
    let t0 = Instant::now();
    let both = Observations {
        memory: Some(Observation {
            available: 799,
            capacity: 8000,
        }),
        allocatable_memory: None,
        pid: Some(Observation {
            available: 100,
            capacity: 4_194_304,
        }),
    };
    let p = m.synchronize(t0, &both);
    assert_eq!(p.met.len(), 2, "{p:?}");
    assert_eq!(p.reclaim.unwrap().signal, Signal::MemoryAvailable);
    let pids = Observations {
        memory: Some(Observation {
            available: 800,
            capacity: 8000,
        }),
        ..both
    };
    let r = m.synchronize(at(t0, 1), &pids).reclaim.unwrap();
    assert_eq!(r.signal, Signal::PidAvailable);
    assert_eq!(r.resource, Resource::Pids);
    assert_eq!(
        m.synchronize(at(t0, 2), &pids).conditions,
        vec![NodeCondition::MemoryPressure, NodeCondition::PidPressure]
    );
}

#[test]
fn the_allocatable_copy_is_met_from_the_pods_cgroup() {
    let mut m = manager(&[("memory.available", "100Mi")], &[], &[], &[], true);
    let t0 = Instant::now();
    let obs = Observations {
        memory: Some(Observation {
            available: 6 * GI,
            capacity: 8 * GI,
        }),
        allocatable_memory: Some(Observation {
            available: 50 * MI,
            capacity: 3 * GI,
        }),
        pid: None,
    };
    let r = m.synchronize(t0, &obs).reclaim.expect("pods' cgroup short");
    assert_eq!(r.signal, Signal::AllocatableMemoryAvailable);
    assert!(r.hard);
    assert_eq!(r.quantity_text, "100Mi");
    assert_eq!(r.observed.available, 50 * MI);
}

#[test]
fn disk_signals_and_missing_observations_are_never_met() {
    let mut m = manager(
        &[("nodefs.available", "100%"), ("imagefs.available", "99%")],
        &[],
        &[],
        &[],
        false,
    );
    let t0 = Instant::now();
    let p = m.synchronize(t0, &memory(0, 8 * GI));
    assert!(p.met.is_empty() && p.reclaim.is_none(), "{p:?}");
    let mut mem = manager(&[("memory.available", "1Gi")], &[], &[], &[], false);
    let none = Observations {
        memory: None,
        allocatable_memory: None,
        pid: None,
    };
    assert!(mem.synchronize(t0, &none).reclaim.is_none());
}
