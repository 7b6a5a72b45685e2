//! Stopping a pod's containers and sandboxes: kubelet's `killPodWithSyncResult`,
//! `killContainersWithSyncResult` (`kuberuntime_container.go`) and `terminationOrdering`
//! (`kuberuntime_termination_order.go`); one container's stop is `container`
//! (`killContainer`).
//!
//! Invariants:
//! * every running container of the pod is stopped in parallel; sidecars (restartable init
//!   containers) wait until every regular container and every sidecar declared after them has
//!   stopped, and that wait comes off their grace; their preStop hooks start at once;
//! * sandboxes are stopped only after every container stop succeeded (the kubelet stops them
//!   regardless, and a sandbox stop SIGKILLs what still runs: reaplet never cuts a grace
//!   short that way); then the runtime is re-read and anything still running is an error;
//! * the containers' final states are read once: a kill that told them early (a completed
//!   pod's terminal status) ends with those states when every one of them was `Exited` and
//!   the re-read lists exactly the containers they were read from (any order); otherwise they
//!   are read again.

mod container;

use crate::cri::{ContainerRunState, CriError, Runtime, RuntimeContainer};
use crate::events::EventSink;
use crate::pod::{ContainerSpec, PodInfo};
use crate::status::ContainerFinal;
pub use crate::terminating::records::KillMemory;
use crate::timeline::{Recorder, Step};
use container::kill_container;
use futures_util::future::join_all;
use tokio::sync::watch;
use tracing::Instrument;

#[derive(Debug, thiserror::Error)]
pub enum KillError {
    #[error("pod {uid}: listing runtime objects: {source}")]
    List { uid: String, source: CriError },
    #[error("pod {uid}: stopping container {container_name} ({container_id}): {source}")]
    StopContainer {
        uid: String,
        container_id: String,
        container_name: String,
        source: CriError,
    },
    #[error("pod {uid}: stopping sandbox {sandbox_id}: {source}")]
    StopSandbox {
        uid: String,
        sandbox_id: String,
        source: CriError,
    },
    #[error(transparent)]
    Refused(#[from] crate::authority::AuthorityError),
    #[error("pod {uid}: still running after a successful stop (CRI violation): {ids:?}")]
    StillRunning { uid: String, ids: Vec<String> },
}

/// Summary of a finished kill.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KillReport {
    pub containers_stopped: usize,
    pub sandboxes_stopped: usize,
    /// Every container of the pod as the runtime reports it after the stop (all attempts),
    /// for the terminal status.
    pub finals: Vec<ContainerFinal>,
}

/// Stops every container of `pod` with `pod_grace`, then its sandboxes, then checks.
pub async fn kill_pod<R: Runtime>(
    runtime: &R,
    events: &EventSink,
    pod: &PodInfo,
    pod_grace: i64,
    memory: &KillMemory,
) -> Result<KillReport, KillError> {
    kill_pod_reporting(
        runtime,
        events,
        pod,
        pod_grace,
        memory,
        None,
        &Recorder::none(),
    )
    .await
}

/// What [`kill_pod_reporting`] tells as soon as every container has stopped, before the
/// sandboxes: the containers' final states.
pub type OnContainersStopped<'a> = &'a (dyn Fn(&[ContainerFinal]) + Sync);

/// [`kill_pod`], telling `stopped` the containers' final states as soon as they have all
/// stopped, before the sandboxes are (a naturally completed pod's terminal status goes out
/// then, as the kubelet writes it from its sync: the sandbox teardown follows).
pub async fn kill_pod_reporting<R: Runtime>(
    runtime: &R,
    events: &EventSink,
    pod: &PodInfo,
    pod_grace: i64,
    memory: &KillMemory,
    stopped: Option<OnContainersStopped<'_>>,
    timeline: &Recorder,
) -> Result<KillReport, KillError> {
    let uid = pod.uid.as_str();
    let list_err = |source| KillError::List {
        uid: uid.to_owned(),
        source,
    };
    let containers = runtime.list_containers(Some(uid)).await.map_err(list_err)?;
    let running: Vec<&RuntimeContainer> = containers.iter().filter(|c| c.state.may_run()).collect();

    // termination ordering: a done flag per running container
    let flags: Vec<(watch::Sender<bool>, watch::Receiver<bool>)> =
        running.iter().map(|_| watch::channel(false)).collect();
    let sidecar_index = |name: &str| pod.sidecars.iter().position(|s| s.name == name);
    let kills = running.iter().enumerate().map(|(i, c)| {
        let deps: Vec<watch::Receiver<bool>> = match sidecar_index(&c.name) {
            None => Vec::new(),
            Some(mine) => running
                .iter()
                .enumerate()
                .filter(|(j, other)| {
                    *j != i
                        && match sidecar_index(&other.name) {
                            None => true,
                            Some(theirs) => theirs > mine,
                        }
                })
                .map(|(j, _)| flags[j].1.clone())
                .collect(),
        };
        let spec = pod
            .container(&c.name)
            .cloned()
            .unwrap_or_else(|| ContainerSpec {
                name: c.name.clone(),
                pre_stop: None,
                ports: vec![],
                restart: None,
            });
        let done = &flags[i].0;
        let span =
            tracing::info_span!("kill_container", containerName = %c.name, containerID = %c.id);
        async move {
            let r = kill_container(
                runtime, events, pod, &spec, c, pod_grace, deps, memory, timeline,
            )
            .await;
            if r.is_ok() {
                let _ = done.send(true);
            }
            r
        }
        .instrument(span)
    });
    let results = join_all(kills).await;
    let mut containers_stopped = 0;
    for r in results {
        r?;
        containers_stopped += 1;
    }
    // best-effort: a failed read here only leaves the report to the kill's end. What was told
    // is kept: an exited container's state is final, so the end reads no status again while
    // the runtime lists the very containers it was read from
    let mut told: Option<Vec<ContainerFinal>> = None;
    if let Some(tell) = stopped {
        match runtime.list_containers(Some(uid)).await {
            Ok(now) if now.iter().all(|c| !c.state.may_run()) => {
                match final_states(runtime, uid, &now).await {
                    Ok(finals) => {
                        tell(&finals);
                        told = Some(finals);
                    }
                    Err(e) => tracing::debug!(err = %e, "no early terminal status"),
                }
            }
            Ok(_) => {}
            Err(e) => tracing::debug!(err = %e, "no early terminal status"),
        }
    }

    let sandboxes = runtime.list_sandboxes(Some(uid)).await.map_err(list_err)?;
    for s in &sandboxes {
        match runtime.stop_pod_sandbox(&s.id).await {
            Ok(()) => timeline.record(
                None,
                Step::SandboxStopped {
                    sandbox: s.id.clone(),
                },
            ),
            Err(e) if e.is_not_found() => {}
            Err(source) => {
                return Err(KillError::StopSandbox {
                    uid: uid.to_owned(),
                    sandbox_id: s.id.clone(),
                    source,
                });
            }
        }
    }

    // re-check: the runtime must not report anything running any more
    let after = runtime.list_containers(Some(uid)).await.map_err(list_err)?;
    let mut still: Vec<String> = after
        .iter()
        .filter(|c| c.state.may_run())
        .map(|c| c.id.clone())
        .collect();
    let sandboxes_after = runtime.list_sandboxes(Some(uid)).await.map_err(list_err)?;
    still.extend(
        sandboxes_after
            .iter()
            .filter(|s| s.ready)
            .map(|s| s.id.clone()),
    );
    if !still.is_empty() {
        return Err(KillError::StillRunning {
            uid: uid.to_owned(),
            ids: still,
        });
    }
    let finals = match told {
        Some(finals) if still_final(&finals, &after) => finals,
        _ => final_states(runtime, uid, &after).await?,
    };
    // each container's latest attempt is the one this kill ended (record_exit keeps one exit
    // per container)
    for f in &finals {
        if let Some(l) = crate::status::latest_attempt(&finals, &f.name) {
            timeline.record_exit(&l.name, l.finished_at, l.exit_code);
        }
    }
    Ok(KillReport {
        containers_stopped,
        sandboxes_stopped: sandboxes.len(),
        finals,
    })
}

/// Whether `told` (final states read earlier) still holds for the runtime's containers now:
/// every one of them had exited (a `Created` container may still change when its sandbox
/// stops) and `now` lists exactly the containers they were read from, in any order (the
/// runtime's list order is not stable).
fn still_final(told: &[ContainerFinal], now: &[RuntimeContainer]) -> bool {
    let mut then: Vec<&str> = told.iter().map(|f| f.id.as_str()).collect();
    let mut ids: Vec<&str> = now.iter().map(|c| c.id.as_str()).collect();
    then.sort_unstable();
    ids.sort_unstable();
    told.iter().all(|f| f.state == ContainerRunState::Exited) && then == ids
}

/// The final states of stopped containers (one removed meanwhile has none: its status is
/// `ContainerStatusUnknown`).
async fn final_states<R: Runtime>(
    runtime: &R,
    uid: &str,
    containers: &[RuntimeContainer],
) -> Result<Vec<ContainerFinal>, KillError> {
    let mut finals = Vec::with_capacity(containers.len());
    for c in containers {
        match runtime.container_status(&c.id).await {
            Ok(d) => finals.push(ContainerFinal {
                name: c.name.clone(),
                id: c.id.clone(),
                state: d.state,
                exit_code: d.exit_code,
                reason: d.reason,
                started_at: d.started_at,
                finished_at: d.finished_at,
                attempt: c.attempt,
            }),
            Err(e) if e.is_not_found() => {}
            Err(source) => {
                return Err(KillError::List {
                    uid: uid.to_owned(),
                    source,
                });
            }
        }
    }
    Ok(finals)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cri::fake::{Behaviour, Call, FakeRuntime};
    use crate::pod::{Handler, PodUid};
    use std::time::Duration;
    use tokio::time::Instant;

    pub(super) fn pod(
        uid: &str,
        regular: &[(&str, Option<Handler>)],
        sidecars: &[&str],
    ) -> PodInfo {
        let mut p = PodInfo::from_runtime(&PodUid::parse(uid).unwrap(), &[], &[]);
        let spec = |n: &str, h: Option<Handler>| ContainerSpec {
            name: n.into(),
            pre_stop: h,
            ports: vec![],
            restart: None,
        };
        p.containers = regular.iter().map(|(n, h)| spec(n, h.clone())).collect();
        p.sidecars = sidecars.iter().map(|n| spec(n, None)).collect();
        p
    }

    pub(super) fn sleep_hook(secs: u64) -> Option<Handler> {
        Some(Handler::Exec {
            command: vec!["sleep".into(), secs.to_string()],
        })
    }

    pub(super) async fn run(
        rt: &FakeRuntime,
        p: &PodInfo,
        grace: i64,
    ) -> Result<KillReport, KillError> {
        kill_pod(rt, &EventSink::log_only(), p, grace, &KillMemory::default()).await
    }

    /// Issue 46: a kill that tells the containers' final states early reads each container's
    /// status once, not once for the early report and again at the end (the runtime's
    /// containers unchanged in between), and ends with the same states it told.
    #[tokio::test(start_paused = true)]
    async fn an_early_report_reads_each_container_status_once() {
        let rt = FakeRuntime::default();
        rt.add_pod(
            "p",
            &[
                ("app", Behaviour::ExitOnTerm(Duration::from_millis(300))),
                ("log", Behaviour::IgnoreTerm),
            ],
        );
        let told = std::sync::Mutex::new(Vec::new());
        let tell = |f: &[ContainerFinal]| told.lock().unwrap().push(f.to_vec());
        let p = pod("p", &[("app", None), ("log", None)], &[]);
        let memory = KillMemory::default();
        let report = kill_pod_reporting(
            &rt,
            &EventSink::log_only(),
            &p,
            3,
            &memory,
            Some(&tell),
            &Recorder::none(),
        )
        .await
        .unwrap();
        let mut reads = rt.status_reads();
        reads.sort();
        assert_eq!(reads, ["p-app", "p-log"], "one status read per container");
        let told = told.into_inner().unwrap();
        assert_eq!(told.len(), 1, "told once");
        assert_eq!(told[0], report.finals, "the end's states are the ones told");
        assert_eq!(report.finals.len(), 2);
        // without an early report, the end reads them (once each)
        let rt = FakeRuntime::default();
        rt.add_pod("q", &[("app", Behaviour::ExitOnTerm(Duration::ZERO))]);
        let report = run(&rt, &pod("q", &[("app", None)], &[]), 3).await.unwrap();
        assert_eq!(rt.status_reads(), ["q-app"]);
        assert_eq!(report.finals.len(), 1);
    }

    /// The early states are reused only for the very containers they were read from, all
    /// exited; a container added, removed or not yet exited makes the end read them again.
    #[test]
    fn early_states_hold_only_for_the_same_exited_containers() {
        let fin = |id: &str, state| ContainerFinal {
            name: id.into(),
            id: id.into(),
            state,
            exit_code: 0,
            reason: String::new(),
            started_at: 1,
            finished_at: 2,
            attempt: 0,
        };
        let cont = |id: &str| RuntimeContainer {
            id: id.into(),
            sandbox_id: "s".into(),
            name: id.into(),
            attempt: 0,
            pod_uid: "p".into(),
            state: ContainerRunState::Exited,
            created_at: 1,
            labels: Default::default(),
            annotations: Default::default(),
        };
        let exited = [
            fin("a", ContainerRunState::Exited),
            fin("b", ContainerRunState::Exited),
        ];
        assert!(still_final(&exited, &[cont("b"), cont("a")]), "any order");
        assert!(!still_final(&exited, &[cont("a")]), "one removed");
        assert!(
            !still_final(&exited, &[cont("a"), cont("b"), cont("c")]),
            "one added"
        );
        assert!(
            !still_final(&exited[..1], &[cont("a"), cont("b")]),
            "one not read (removed then) listed now"
        );
        let created = [
            fin("a", ContainerRunState::Exited),
            fin("b", ContainerRunState::Created),
        ];
        assert!(
            !still_final(&created, &[cont("a"), cont("b")]),
            "not exited"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn sidecars_wait_for_main_then_reverse_order_and_the_wait_is_deducted() {
        let rt = FakeRuntime::default();
        rt.add_pod(
            "p",
            &[
                ("main", Behaviour::ExitOnTerm(Duration::from_secs(3))),
                ("first", Behaviour::ExitOnTerm(Duration::from_secs(1))),
                ("second", Behaviour::ExitOnTerm(Duration::from_secs(1))),
            ],
        );
        let t0 = Instant::now();
        run(&rt, &pod("p", &[("main", None)], &["first", "second"]), 10)
            .await
            .unwrap();
        let main = rt.stops_of("p-main")[0];
        let second = rt.stops_of("p-second")[0];
        let first = rt.stops_of("p-first")[0];
        assert_eq!(main, (10, t0));
        assert_eq!(
            second,
            (7, t0 + Duration::from_secs(3)),
            "after main; 3 s waited off the grace"
        );
        assert_eq!(
            first,
            (6, t0 + Duration::from_secs(4)),
            "after second (reverse order)"
        );
        // sandbox only after every container
        let calls = rt.calls();
        let sb = calls
            .iter()
            .position(|c| matches!(c, Call::StopPodSandbox { .. }))
            .unwrap();
        assert!(
            calls[..sb]
                .iter()
                .filter(|c| matches!(c, Call::StopContainer { .. }))
                .count()
                == 3
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_container_still_running_after_stop_is_an_error() {
        let rt = FakeRuntime::default();
        rt.add_pod("p", &[("app", Behaviour::Liar)]);
        let r = run(&rt, &pod("p", &[("app", None)], &[]), 5).await;
        assert!(matches!(r, Err(KillError::StillRunning { .. })), "{r:?}");
    }
}
