//! The plan of a graceful node shutdown: the kubelet's node shutdown manager
//! (`pkg/kubelet/nodeshutdown/nodeshutdown_manager_linux.go`: `migrateConfig`,
//! `groupByPriority`, `processShutdownEvent`) as pure functions. Which pods end in which group,
//! with what grace, and in what order; the statuses a shutdown writes.
//!
//! Invariants:
//! * the groups come from `shutdownGracePeriodByPodPriority`, or else from
//!   `shutdownGracePeriod` and `shutdownGracePeriodCriticalPods` as the kubelet migrates them:
//!   regular pods (priority 0 and up) get the difference, critical pods (the system-critical
//!   priority, 2,000,000,000, and up) the critical period; none when the periods are zero or
//!   inconsistent;
//! * a pod belongs to the group of the highest priority not above its own; below the lowest
//!   group it is in the lowest, above the highest in the highest;
//! * groups end in order, lowest priority first; each pod is killed with the group's grace, or
//!   its own `terminationGracePeriodSeconds` when that is shorter;
//! * the logind delay the whole shutdown needs is the sum of the groups' graces.

use crate::config::ShutdownSettings;
use crate::lifecycle::KillReason;
use crate::pod::PodUid;
use std::time::Duration;

/// `scheduling.SystemCriticalPriority`.
pub const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;
/// The terminal status a shutdown writes (`nodeShutdownReason`, `nodeShutdownMessage`).
pub const REASON: &str = "Terminated";
pub const MESSAGE: &str = "Pod was terminated in response to imminent node shutdown.";
/// The `DisruptionTarget` reason the kubelet writes for it.
pub const DISRUPTION: &str = "TerminationByKubelet";

/// One priority group: pods from `priority` up (to the next group) end within `grace`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Group {
    pub priority: i32,
    pub grace: Duration,
}

/// The groups, lowest priority first; empty: graceful shutdown is off.
pub fn groups(s: &ShutdownSettings) -> Vec<Group> {
    if !s.by_pod_priority.is_empty() {
        let mut g: Vec<Group> = s
            .by_pod_priority
            .iter()
            .map(|p| Group {
                priority: p.priority,
                grace: p.grace,
            })
            .collect();
        g.sort_by_key(|g| g.priority);
        return g;
    }
    if s.grace_period.is_zero() || s.grace_period_critical_pods > s.grace_period {
        return Vec::new();
    }
    vec![
        Group {
            priority: 0,
            grace: s.grace_period - s.grace_period_critical_pods,
        },
        Group {
            priority: SYSTEM_CRITICAL_PRIORITY,
            grace: s.grace_period_critical_pods,
        },
    ]
}

/// What logind's `InhibitDelayMaxSec` must allow.
pub fn total(groups: &[Group]) -> Duration {
    groups.iter().map(|g| g.grace).sum()
}

/// The index of the group a pod of `priority` belongs to.
pub fn group_of(groups: &[Group], priority: i32) -> usize {
    // below the lowest group: the lowest
    groups
        .iter()
        .rposition(|g| g.priority <= priority)
        .unwrap_or(0)
}

/// A pod as the plan reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodFacts {
    pub uid: PodUid,
    pub priority: i32,
    /// `spec.terminationGracePeriodSeconds`.
    pub spec_grace: Option<i64>,
}

/// One stage of the shutdown: a group's pods, each with the grace it is killed with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stage {
    pub group: Group,
    pub pods: Vec<(PodUid, i64)>,
}

/// The stages in order (lowest priority first); groups without pods are left out (they take
/// no time).
pub fn plan(groups: &[Group], pods: &[PodFacts]) -> Vec<Stage> {
    if groups.is_empty() {
        return Vec::new();
    }
    let mut stages: Vec<Stage> = groups
        .iter()
        .map(|g| Stage {
            group: *g,
            pods: Vec::new(),
        })
        .collect();
    for p in pods {
        let i = group_of(groups, p.priority);
        let group_grace = stages[i].group.grace.as_secs() as i64;
        let grace = match p.spec_grace {
            Some(own) if own <= group_grace => own,
            _ => group_grace,
        };
        stages[i].pods.push((p.uid.clone(), grace));
    }
    stages.retain(|s| !s.pods.is_empty());
    stages
}

/// The kill request's reason for a shutdown: the kubelet's status and `DisruptionTarget`.
pub fn kill_reason() -> KillReason {
    KillReason::Requested {
        by: crate::lifecycle::Requester::NodeShutdown,
        disruption: Some(DISRUPTION.into()),
        reason: Some(REASON.into()),
        message: MESSAGE.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PodPriorityGrace;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn pod(n: &str, priority: i32, grace: Option<i64>) -> PodFacts {
        PodFacts {
            uid: PodUid::parse(n).unwrap(),
            priority,
            spec_grace: grace,
        }
    }

    #[test]
    fn the_two_periods_migrate_to_regular_and_critical_groups() {
        let s = ShutdownSettings {
            grace_period: secs(30),
            grace_period_critical_pods: secs(10),
            by_pod_priority: vec![],
        };
        assert_eq!(
            groups(&s),
            vec![
                Group {
                    priority: 0,
                    grace: secs(20)
                },
                Group {
                    priority: SYSTEM_CRITICAL_PRIORITY,
                    grace: secs(10)
                },
            ]
        );
        assert_eq!(total(&groups(&s)), secs(30));
        // off, or inconsistent: no groups
        assert!(groups(&ShutdownSettings::default()).is_empty());
        let bad = ShutdownSettings {
            grace_period: secs(5),
            grace_period_critical_pods: secs(10),
            by_pod_priority: vec![],
        };
        assert!(groups(&bad).is_empty());
        assert!(plan(&groups(&bad), &[pod("p", 0, None)]).is_empty());
    }

    #[test]
    fn pods_go_to_the_highest_group_not_above_them_and_get_the_shorter_grace() {
        let s = ShutdownSettings {
            by_pod_priority: vec![
                PodPriorityGrace {
                    priority: 100_000,
                    grace: secs(20),
                },
                PodPriorityGrace {
                    priority: 0,
                    grace: secs(10),
                },
                PodPriorityGrace {
                    priority: SYSTEM_CRITICAL_PRIORITY,
                    grace: secs(5),
                },
            ],
            ..ShutdownSettings::default()
        };
        let g = groups(&s);
        assert_eq!(
            g.iter().map(|g| g.priority).collect::<Vec<_>>(),
            vec![0, 100_000, SYSTEM_CRITICAL_PRIORITY]
        );
        for (priority, index) in [
            (-5, 0), // below the lowest: the lowest
            (0, 0),  // on a boundary: that group
            (99_999, 0),
            (100_000, 1),
            (1_999_999_999, 1),
            (SYSTEM_CRITICAL_PRIORITY, 2),
            (i32::MAX, 2), // above the highest: the highest
        ] {
            assert_eq!(group_of(&g, priority), index, "priority {priority}");
        }
        let stages = plan(
            &g,
            &[
                pod("low", 0, Some(30)),       // its own 30 s is longer: the group's 10
                pod("low-quick", 10, Some(3)), // its own 3 s is shorter
                pod("mid", 200_000, None),     // none set: the group's 20
                pod("etcd", SYSTEM_CRITICAL_PRIORITY, Some(30)),
            ],
        );
        let view: Vec<(i32, Vec<(&str, i64)>)> = stages
            .iter()
            .map(|s| {
                (
                    s.group.priority,
                    s.pods.iter().map(|(u, g)| (u.as_str(), *g)).collect(),
                )
            })
            .collect();
        assert_eq!(
            view,
            vec![
                (0, vec![("low", 10), ("low-quick", 3)]),
                (100_000, vec![("mid", 20)]),
                (SYSTEM_CRITICAL_PRIORITY, vec![("etcd", 5)]),
            ]
        );
        // a group without pods takes no time
        let only_low = plan(&g, &[pod("low", 0, None)]);
        assert_eq!(only_low.len(), 1);
        assert_eq!(total(&g), secs(35));
    }

    #[test]
    fn the_status_is_the_kubelets() {
        let r = kill_reason();
        assert_eq!(r.disruption_target(), Some("TerminationByKubelet"));
        match r {
            KillReason::Requested {
                reason, message, ..
            } => {
                assert_eq!(reason.as_deref(), Some("Terminated"));
                assert_eq!(
                    message,
                    "Pod was terminated in response to imminent node shutdown."
                );
            }
            other => panic!("{other:?}"),
        }
    }
}
