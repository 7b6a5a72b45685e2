//! What recording termination timelines costs (issue 31): the steps one pod's termination
//! recorded in a synthetic bulk termination, replayed for every pod of that run through the
//! same store and recorder the pod workers use, on one thread; its CPU time against the CPU
//! time reaplet spent on the whole run. A ratio of two figures from the same run.

use super::SyntheticRun;
use reaplet::pod::PodUid;
use reaplet::timeline::Timelines;

/// This thread's CPU time, in seconds.
fn thread_cpu() -> f64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    t.tv_sec as f64 + t.tv_nsec as f64 / 1e9
}

/// Prints, per run, the replayed recording's CPU time and its share of reaplet's.
pub fn cost(runs: &[SyntheticRun]) {
    super::header("timelines: recording every pod's termination steps, against the same run's CPU");
    println!(
        "{:>6} {:>10} {:>14} {:>12} {:>8}",
        "pods", "steps/pod", "recording CPU", "reaplet CPU", "share"
    );
    for run in runs {
        let Some(t) = &run.timeline else {
            println!("{:>6} no timeline was served: not measured", run.pods);
            continue;
        };
        let uids: Vec<PodUid> = (0..run.pods)
            .map(|i| PodUid::parse(&format!("bench-{i}")).unwrap())
            .collect();
        // the best of 5 (the least disturbed by the machine's noise)
        let mut best = f64::INFINITY;
        for _ in 0..5 {
            let store = Timelines::new(reaplet::timeline::DEFAULT_KEEP);
            let start = thread_cpu();
            for uid in &uids {
                let r = store.start(uid, &t.namespace, &t.name);
                for e in &t.entries {
                    r.record(e.container.as_deref(), e.step.clone());
                }
                store.finish(uid);
            }
            best = best.min(thread_cpu() - start);
        }
        println!(
            "{:>6} {:>10} {:>11.2} ms {:>10.2} s {:>7.3}%",
            run.pods,
            t.entries.len(),
            best * 1e3,
            run.cpu_s,
            best / run.cpu_s * 100.0
        );
    }
}
