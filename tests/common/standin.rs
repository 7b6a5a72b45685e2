//! A kubelet as reaplet's standby sees one: its Node registered, the node Lease renewed every
//! `renew` in the in-process API server and `/healthz` answering `200 ok` on a fixed loopback
//! port. Stopping it ends the last two (nothing listens: refused); the Node stays, as a dead
//! kubelet's does. Shared by `tests/standby.rs` and the VM's standby
//! scenario (which includes this file on its own).
#![allow(dead_code)]

use super::apiserver::{ApiServer, Recorded};
use std::time::{Duration, Instant};

/// What reaplet asked the API server (the stand-in kubelet's requests left out).
pub fn reaplet_requests(api: &ApiServer) -> Vec<Recorded> {
    api.requests()
        .into_iter()
        .filter(|r| r.user_agent.starts_with("reaplet"))
        .collect()
}

/// Node events with `reason`, as reaplet posted them.
pub fn node_events(api: &ApiServer, reason: &str) -> usize {
    api.events()
        .iter()
        .filter(|e| e["involvedObject"]["kind"] == "Node" && e["reason"] == reason)
        .count()
}

/// Waits until a Node event `reason` is posted (after `seen` of them); returns the time taken.
pub async fn wait_node_event(
    api: &ApiServer,
    reason: &str,
    seen: usize,
    limit: Duration,
) -> Duration {
    let start = Instant::now();
    while node_events(api, reason) <= seen {
        assert!(
            start.elapsed() < limit,
            "no Node event {reason} within {limit:?}: {:#?}",
            api.events()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    start.elapsed()
}

/// `/healthz` answering `200 ok` on loopback `port` until the task is aborted (its listener
/// then closes: nothing listens).
pub async fn serve_healthz(port: u16) -> tokio::task::JoinHandle<()> {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .expect("binding the stand-in's healthz port");
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                let _ = s.read(&mut buf).await;
                let _ = s
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                    .await;
            });
        }
    })
}

pub struct StandIn {
    api: ApiServer,
    node: String,
    renew: Duration,
    port: u16,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl StandIn {
    pub fn new(api: ApiServer, node: &str, renew: Duration) -> Self {
        let port = super::port::free_port();
        StandIn {
            api,
            node: node.to_owned(),
            renew,
            port,
            tasks: Vec::new(),
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/healthz", self.port)
    }

    pub async fn start(&mut self) {
        if self.api.get_node(&self.node).is_none() {
            self.api
                .add_node(serde_json::json!({ "metadata": { "name": self.node } }));
        }
        self.api.renew_node_lease(&self.node);
        let api = self.api.handle();
        let (node, renew) = (self.node.clone(), self.renew);
        self.tasks.push(tokio::spawn(async move {
            loop {
                tokio::time::sleep(renew).await;
                api.renew_node_lease(&node);
            }
        }));
        self.tasks.push(serve_healthz(self.port).await);
    }

    pub async fn stop(&mut self) {
        for t in self.tasks.drain(..) {
            t.abort();
            let _ = t.await;
        }
    }
}
