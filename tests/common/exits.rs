//! Container exits as the runtime announced them, recorded from a subscription opened before
//! the action. A test that reads an exit after its pod is gone cannot ask `ContainerStatus`:
//! the agent removes a finished pod's sandbox (and its containers) at its next relist, so the
//! read races that garbage collection (CI once got NotFound in `tests/api.rs`). The exit event
//! carries the same exit code and time as `ContainerStatus` (`tests/container_events.rs`).

use reaplet::cri::{ContainerDetail, ContainerEventKind, ContainerRunState, CriClient, Runtime};
use std::collections::HashMap;
use std::time::Duration;
use tokio::sync::watch;

pub struct Exits {
    seen: watch::Receiver<HashMap<String, ContainerDetail>>,
    task: tokio::task::JoinHandle<()>,
}

impl Exits {
    /// Subscribes to `client`'s container events; every exit from now on is kept.
    pub async fn watch(client: &CriClient) -> Self {
        let mut sub = client
            .container_events()
            .await
            .expect("container events subscribed");
        let (tx, seen) = watch::channel(HashMap::new());
        let task = tokio::spawn(async move {
            while let Some(ev) = sub.events.recv().await {
                let (ContainerEventKind::Exited, Some(code), Some(at)) =
                    (ev.kind, ev.exit_code, ev.exited_at)
                else {
                    continue;
                };
                let detail = ContainerDetail {
                    id: ev.container_id.clone(),
                    state: ContainerRunState::Exited,
                    exit_code: code,
                    started_at: 0,
                    finished_at: at,
                    reason: String::new(),
                };
                tx.send_modify(|m| {
                    m.entry(ev.container_id).or_insert(detail);
                });
            }
        });
        Exits { seen, task }
    }

    /// The first exit of container `id`, waited for within `limit`; `context` says what else
    /// to show if it never comes.
    pub async fn of(
        &self,
        id: &str,
        limit: Duration,
        context: impl FnOnce() -> String,
    ) -> ContainerDetail {
        let mut seen = self.seen.clone();
        match tokio::time::timeout(limit, seen.wait_for(|m| m.contains_key(id))).await {
            Ok(Ok(m)) => m[id].clone(),
            Ok(Err(_)) => panic!("the container event stream ended before {id} exited"),
            Err(_) => panic!(
                "container {id} did not exit within {limit:?}\n{}",
                context()
            ),
        }
    }
}

impl Exits {
    /// Container `id`'s exit if one was seen by now.
    pub fn seen(&self, id: &str) -> Option<ContainerDetail> {
        self.seen.borrow().get(id).cloned()
    }
}

impl Drop for Exits {
    fn drop(&mut self) {
        self.task.abort();
    }
}
