//! `taints`: the NoExecute taint manager's decision for a node's pods when a taint is added,
//! as the agent runs it (the pure [`reaplet::eviction::taints::TaintManager`]): how long the
//! decision takes, and how much memory the pods' facts and the timers hold (bytes allocated,
//! counted by this binary's allocator).

use super::*;
use reaplet::eviction::taints::{PodFacts, TaintAt, TaintManager};
use reaplet::pod::PodUid;
use std::sync::atomic::{AtomicIsize, Ordering};

/// Bytes currently allocated by this process (every allocation counted).
pub static LIVE: AtomicIsize = AtomicIsize::new(0);

pub struct Counting;

// SAFETY: every call is forwarded unchanged to the system allocator, which upholds
// GlobalAlloc's contract; the counter is a plain atomic that never affects the allocation.
unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's layout is passed through as received.
        unsafe { std::alloc::System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: ptr was allocated by System.alloc with this layout (alloc above).
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }
}

fn tolerations(i: usize) -> Vec<k8s_openapi::api::core::v1::Toleration> {
    let t = |v: serde_json::Value| serde_json::from_value(v).unwrap();
    match i % 3 {
        // not tolerated: deleted at once
        0 => vec![],
        // tolerated for a while (1 s .. 1 h)
        1 => vec![t(
            serde_json::json!({"key": "maintenance", "operator": "Exists",
            "effect": "NoExecute", "tolerationSeconds": 1 + (i * 37) % 3600}),
        )],
        // tolerated for good
        _ => vec![t(serde_json::json!({"operator": "Exists"}))],
    }
}

fn pods(n: usize) -> Vec<PodFacts> {
    (0..n)
        .map(|i| PodFacts {
            uid: PodUid::parse(&format!("{:08x}-0000-4000-8000-{:012x}", i, i)).unwrap(),
            key: format!("default/pod-{i}"),
            tolerations: tolerations(i),
            exempt: false,
            seen: tokio::time::Instant::now(),
        })
        .collect()
}

pub fn taints(sizes: &[usize], runs: usize) {
    println!(
        "\n=== taints: a NoExecute taint added to a node with N pods (pure decision, {runs} runs each)"
    );
    println!(
        "{:>7} {:>12} {:>12} {:>10} {:>14} {:>14}",
        "pods", "decide p50", "decide max", "timers", "facts (KiB)", "timers (KiB)"
    );
    let taint: k8s_openapi::api::core::v1::Taint =
        serde_json::from_value(serde_json::json!({"key": "maintenance", "effect": "NoExecute"}))
            .unwrap();
    for &n in sizes {
        let mut times = Vec::new();
        let (mut facts_kib, mut timers_kib, mut timers) = (0.0, 0.0, 0);
        for _ in 0..runs {
            let now = tokio::time::Instant::now();
            let list = pods(n);
            let before = LIVE.load(Ordering::Relaxed);
            let mut m = TaintManager::new();
            for p in list {
                m.pod(p, now);
            }
            let with_facts = LIVE.load(Ordering::Relaxed);
            let t = Instant::now();
            let actions = m.node(
                &[TaintAt {
                    taint: taint.clone(),
                    added: Some(now),
                }],
                now,
            );
            times.push(ms(t.elapsed()));
            timers = actions.len();
            drop(actions);
            let with_timers = LIVE.load(Ordering::Relaxed);
            facts_kib = (with_facts - before) as f64 / 1024.0;
            timers_kib = (with_timers - with_facts) as f64 / 1024.0;
            std::hint::black_box(&m);
        }
        let s = sorted(times);
        println!(
            "{n:>7} {:>10.3}ms {:>10.3}ms {timers:>10} {facts_kib:>14.1} {timers_kib:>14.1}",
            pct(&s, 50.0),
            pct(&s, 100.0)
        );
    }
}
