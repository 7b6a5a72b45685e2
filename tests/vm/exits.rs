//! Container exits as containerd reports them on its events service (`/tasks/exit` in namespace
//! `k8s.io`, decoded by reaplet's own decoder): the exit status and time of a container's init
//! process, the moment the shim reports it. The scenarios that time terminations read exits
//! here instead of polling CRI `ContainerStatus`: no load on containerd while the pods stop
//! (under TCG a poll of every container every 25 ms is a good part of a CPU), and nothing is
//! missed when a container's status goes with its removal.

use super::{R, SOCKET};
use hyper_util::rt::TokioIo;
use reaplet::cri::containerd_events::{TaskEvent, TaskEventKind, subscribe};
use reaplet::wall_ns;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tonic::transport::{Endpoint, Uri};

/// An exit: (exit status, exited at in wall-clock ns).
pub type Exit = (i32, i64);

pub struct Exits {
    seen: Arc<Mutex<HashMap<String, Exit>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Exits {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Exits {
    /// Subscribes; every exit from now on is kept. containerd answers a subscription only with
    /// its first event: this returns once it was not refused within 2 s.
    pub async fn subscribe() -> R<Exits> {
        let channel = Endpoint::from_static("http://containerd.invalid")
            .connect_timeout(Duration::from_secs(5))
            .connect_with_connector_lazy(tower::service_fn(|_: Uri| async {
                let s = tokio::net::UnixStream::connect(SOCKET).await?;
                Ok::<_, std::io::Error>(TokioIo::new(s))
            }));
        let mut rx = subscribe::<TaskEvent>(channel, Duration::from_secs(2))
            .await
            .map_err(|e| format!("containerd's events: {e}"))?;
        let seen: Arc<Mutex<HashMap<String, Exit>>> = Arc::default();
        let keep = seen.clone();
        let task = tokio::spawn(async move {
            while let Some(ev) = rx.recv().await {
                if ev.kind == TaskEventKind::Exit {
                    let at = ev.exited_at.unwrap_or_else(wall_ns);
                    keep.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .entry(ev.container_id)
                        .or_insert((ev.exit_status as i32, at));
                }
            }
        });
        Ok(Exits { seen, task })
    }

    pub fn get(&self, id: &str) -> Option<Exit> {
        self.seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .copied()
    }

    /// Waits until every container of `ids` (name, ID) has exited; (name, exit, exited at).
    pub async fn wait(
        &self,
        ids: &[(String, String)],
        limit: Duration,
    ) -> R<Vec<(String, i32, i64)>> {
        let start = Instant::now();
        loop {
            let got: Vec<_> = ids
                .iter()
                .filter_map(|(n, id)| self.get(id).map(|(c, at)| (n.clone(), c, at)))
                .collect();
            if got.len() == ids.len() {
                return Ok(got);
            }
            if start.elapsed() > limit {
                let missing: Vec<&String> = ids
                    .iter()
                    .filter(|(_, id)| self.get(id).is_none())
                    .map(|(n, _)| n)
                    .collect();
                return Err(format!("no exit of {missing:?} within {limit:?}"));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
