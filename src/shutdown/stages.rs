//! Carrying out the plan: the kubelet's `killPods` of its node shutdown manager. Each stage's
//! pods are killed at once, each with its own grace; the stage ends when every one of them is
//! stopped or when the group's grace has passed, whichever comes first; then the next stage.
//!
//! Invariants:
//! * stages run strictly in order (lowest priority first); a stage never starts before the one
//!   before it ended;
//! * a stage waits at most its group's grace on the monotonic clock (the kubelet's timer of
//!   `ShutdownGracePeriodSeconds`); a pod still stopping then keeps stopping, and its
//!   completion is handed back to the caller (which gives it the status flush's time);
//! * a pod the killer cannot reach (already gone) counts as stopped;
//! * one log line per stage start and per stage end, none per pod.

use super::plan::{Group, Stage};
use crate::pod::PodUid;
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::time::Instant;

/// Where the stages' kills go: the pod workers in the agent, a stand-in in unit tests.
pub trait Killer {
    /// Ends `uid` with `grace` seconds through the pipeline. The receiver completes when the
    /// pod's containers and sandboxes are stopped; `None`: nothing to wait for (the pod is
    /// unknown or already gone).
    fn kill(&self, uid: &PodUid, grace: i64) -> Option<oneshot::Receiver<()>>;
}

/// How one stage went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StageReport {
    pub group: Group,
    pub pods: usize,
    /// Pods known stopped when the stage ended.
    pub stopped: usize,
    /// From the stage's start to its end.
    pub took: Duration,
    /// The group's grace passed with pods still stopping.
    pub timed_out: bool,
}

/// Runs `stages` in order; returns a report per stage, and the completions of the pods still
/// stopping when their stage's grace ran out.
pub async fn run(
    stages: &[Stage],
    killer: &impl Killer,
) -> (Vec<StageReport>, Vec<oneshot::Receiver<()>>) {
    let mut reports = Vec::with_capacity(stages.len());
    let mut still_stopping = Vec::new();
    for stage in stages {
        let start = Instant::now();
        tracing::info!(
            priority = stage.group.priority,
            gracePeriod = stage.group.grace.as_secs(),
            pods = stage.pods.len(),
            "node shutdown: ending a priority group"
        );
        let mut waiting: FuturesUnordered<oneshot::Receiver<()>> = stage
            .pods
            .iter()
            .filter_map(|(uid, grace)| killer.kill(uid, *grace))
            .collect();
        let mut stopped = stage.pods.len() - waiting.len();
        let deadline = tokio::time::sleep_until(start + stage.group.grace);
        tokio::pin!(deadline);
        // each receiver completes (or its sender is dropped: the worker is gone) once
        while !waiting.is_empty() {
            tokio::select! {
                _ = waiting.next() => stopped += 1,
                _ = &mut deadline => break,
            }
        }
        let report = StageReport {
            group: stage.group,
            pods: stage.pods.len(),
            stopped,
            took: start.elapsed(),
            timed_out: !waiting.is_empty(),
        };
        if report.timed_out {
            tracing::warn!(
                priority = stage.group.priority,
                gracePeriod = stage.group.grace.as_secs(),
                stillStopping = waiting.len(),
                "node shutdown: the group's grace period passed with pods still stopping; going on"
            );
        } else {
            tracing::info!(
                priority = stage.group.priority,
                tookMs = report.took.as_millis() as u64,
                "node shutdown: priority group ended"
            );
        }
        reports.push(report);
        still_stopping.extend(waiting);
    }
    (reports, still_stopping)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shutdown::plan::{self, PodFacts};
    use std::collections::HashMap;
    use std::sync::Mutex;

    /// Stops each pod `stops_after` after its kill, or never (`None`), and records when each
    /// kill arrived (ms since the test's start) with its grace.
    struct Stand {
        t0: Instant,
        stops_after: HashMap<&'static str, Option<u64>>,
        kills: Mutex<Vec<(String, u128, i64)>>,
    }

    impl Killer for Stand {
        fn kill(&self, uid: &PodUid, grace: i64) -> Option<oneshot::Receiver<()>> {
            let at = self.t0.elapsed().as_millis();
            self.kills
                .lock()
                .unwrap()
                .push((uid.as_str().into(), at, grace));
            let after = *self.stops_after.get(uid.as_str())?;
            let (tx, rx) = oneshot::channel();
            tokio::spawn(async move {
                match after {
                    Some(ms) => {
                        tokio::time::sleep(Duration::from_millis(ms)).await;
                        let _ = tx.send(());
                    }
                    // never stops: keep the sender alive past every stage
                    None => {
                        tokio::time::sleep(Duration::from_secs(3600)).await;
                        drop(tx);
                    }
                }
            });
            Some(rx)
        }
    }

    fn facts(uid: &str, priority: i32, grace: Option<i64>) -> PodFacts {
        PodFacts {
            uid: PodUid::parse(uid).unwrap(),
            priority,
            spec_grace: grace,
        }
    }

    fn groups() -> Vec<Group> {
        [(0, 10), (100_000, 5), (plan::SYSTEM_CRITICAL_PRIORITY, 3)]
            .into_iter()
            .map(|(priority, s)| Group {
                priority,
                grace: Duration::from_secs(s),
            })
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn groups_end_in_order_each_within_its_grace() {
        let stand = Stand {
            t0: Instant::now(),
            stops_after: HashMap::from([
                ("low-quick", Some(1_000)),
                ("low-slow", Some(4_000)),
                ("mid-hook", Some(2_500)), // a preStop hook of 2.5 s
                ("etcd", Some(100)),
            ]),
            kills: Mutex::default(),
        };
        let stages = plan::plan(
            &groups(),
            &[
                facts("etcd", plan::SYSTEM_CRITICAL_PRIORITY, Some(30)),
                facts("low-quick", 0, Some(2)),
                facts("mid-hook", 200_000, None),
                facts("low-slow", 5, None),
            ],
        );
        let (reports, left) = run(&stages, &stand).await;
        assert!(left.is_empty());
        let kills = stand.kills.lock().unwrap().clone();
        // the low group at 0 with their own shorter grace or the group's; the next group
        // once both stopped (4 s, not the group's 10 s); the critical group after the hook
        assert_eq!(
            kills,
            vec![
                ("low-quick".into(), 0, 2),
                ("low-slow".into(), 0, 10),
                ("mid-hook".into(), 4_000, 5),
                ("etcd".into(), 6_500, 3),
            ]
        );
        let took: Vec<u128> = reports.iter().map(|r| r.took.as_millis()).collect();
        assert_eq!(took, vec![4_000, 2_500, 100]);
        assert!(reports.iter().all(|r| !r.timed_out && r.stopped == r.pods));
    }

    #[tokio::test(start_paused = true)]
    async fn a_group_waits_at_most_its_grace_and_unknown_pods_count_as_stopped() {
        let stand = Stand {
            t0: Instant::now(),
            stops_after: HashMap::from([("stuck", None), ("critical", Some(500))]),
            kills: Mutex::default(),
        };
        let stages = plan::plan(
            &groups(),
            &[
                facts("stuck", 0, None),
                facts("gone", 0, None), // the killer knows nothing of it
                facts("critical", plan::SYSTEM_CRITICAL_PRIORITY, None),
            ],
        );
        let (reports, left) = run(&stages, &stand).await;
        assert_eq!(left.len(), 1, "the stuck pod's completion is handed back");
        assert_eq!(reports.len(), 2, "the empty middle group takes no time");
        assert_eq!(reports[0].took, Duration::from_secs(10));
        assert!(reports[0].timed_out);
        assert_eq!((reports[0].pods, reports[0].stopped), (2, 1));
        let kills = stand.kills.lock().unwrap().clone();
        assert_eq!(kills.last().unwrap(), &("critical".to_string(), 10_000, 3));
        assert!(!reports[1].timed_out);
        // the whole shutdown: the timed-out group's grace plus the critical pod's stop
        assert_eq!(stand.t0.elapsed(), Duration::from_millis(10_500));
    }

    #[tokio::test(start_paused = true)]
    async fn no_pods_no_wait() {
        let stand = Stand {
            t0: Instant::now(),
            stops_after: HashMap::new(),
            kills: Mutex::default(),
        };
        let (reports, _) = run(&plan::plan(&groups(), &[]), &stand).await;
        assert!(reports.is_empty());
        assert_eq!(stand.t0.elapsed(), Duration::ZERO);
    }
}
