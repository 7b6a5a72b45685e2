//! A kubelet as reaplet's standby sees one: the node Lease renewed every `renew` in the
//! in-process API server and `/healthz` answering `200 ok` on a fixed loopback port. Stopping it
//! ends both (nothing listens: refused). Shared by `tests/standby.rs` and the VM's standby
//! scenario (which includes this file on its own).
#![allow(dead_code)]

use super::apiserver::ApiServer;
use std::time::Duration;

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
        self.api.renew_node_lease(&self.node);
        let api = self.api.handle();
        let (node, renew) = (self.node.clone(), self.renew);
        self.tasks.push(tokio::spawn(async move {
            loop {
                tokio::time::sleep(renew).await;
                api.renew_node_lease(&node);
            }
        }));
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", self.port))
            .await
            .expect("binding the stand-in's healthz port");
        self.tasks.push(tokio::spawn(async move {
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
        }));
    }

    pub async fn stop(&mut self) {
        for t in self.tasks.drain(..) {
            t.abort();
            let _ = t.await;
        }
    }
}
