//! A test OTLP/gRPC trace receiver (an OpenTelemetry collector's trace service) on
//! 127.0.0.1:0: it stores every span it is sent, for the tests to wait for and look at.
#![allow(dead_code)]

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{Notify, oneshot};

/// One span as received.
#[derive(Debug, Clone, PartialEq)]
pub struct ReceivedSpan {
    pub name: String,
    /// Hex, as collectors print them.
    pub trace_id: String,
    pub span_id: String,
    /// `None` for a root span.
    pub parent_span_id: Option<String>,
    /// Every attribute, its value as text (strings as they are, numbers and booleans printed).
    pub attributes: BTreeMap<String, String>,
    pub start_ns: u64,
    pub end_ns: u64,
    /// The resource's attributes (`service.name`, ...), as text.
    pub resource: BTreeMap<String, String>,
}

impl ReceivedSpan {
    pub fn attr(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }
}

#[derive(Default)]
struct Store {
    spans: Mutex<Vec<ReceivedSpan>>,
    requests: Mutex<usize>,
    arrived: Notify,
}

struct Service(Arc<Store>);

#[tonic::async_trait]
impl TraceService for Service {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut got = Vec::new();
        for rs in request.into_inner().resource_spans {
            let resource = rs
                .resource
                .map(|r| attributes(&r.attributes))
                .unwrap_or_default();
            for ss in rs.scope_spans {
                for s in ss.spans {
                    got.push(ReceivedSpan {
                        name: s.name,
                        trace_id: hex(&s.trace_id),
                        span_id: hex(&s.span_id),
                        parent_span_id: (!s.parent_span_id.is_empty())
                            .then(|| hex(&s.parent_span_id)),
                        attributes: attributes(&s.attributes),
                        start_ns: s.start_time_unix_nano,
                        end_ns: s.end_time_unix_nano,
                        resource: resource.clone(),
                    });
                }
            }
        }
        *self.0.requests.lock().unwrap() += 1;
        self.0.spans.lock().unwrap().extend(got);
        self.0.arrived.notify_waiters();
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn attributes(kvs: &[KeyValue]) -> BTreeMap<String, String> {
    kvs.iter()
        .map(|kv| {
            (
                kv.key.clone(),
                kv.value.as_ref().map(text).unwrap_or_default(),
            )
        })
        .collect()
}

fn text(v: &AnyValue) -> String {
    match &v.value {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        Some(any_value::Value::BytesValue(b)) => hex(b),
        Some(any_value::Value::ArrayValue(a)) => {
            let items: Vec<String> = a.values.iter().map(text).collect();
            format!("[{}]", items.join(","))
        }
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

/// The receiver: serves until [`OtlpReceiver::stop`] or until dropped.
pub struct OtlpReceiver {
    addr: SocketAddr,
    store: Arc<Store>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl OtlpReceiver {
    /// Listens on 127.0.0.1 (a port of the kernel's choosing, bound here: no race).
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binding the OTLP receiver");
        let addr = listener.local_addr().unwrap();
        let store = Arc::new(Store::default());
        let (stop, stopped) = oneshot::channel::<()>();
        let service = TraceServiceServer::new(Service(store.clone()));
        let task = tokio::spawn(async move {
            let r = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming_shutdown(
                    tokio_stream::wrappers::TcpListenerStream::new(listener),
                    async {
                        let _ = stopped.await;
                    },
                )
                .await;
            if let Err(e) = r {
                eprintln!("OTLP receiver: {e}");
            }
        });
        Self {
            addr,
            store,
            stop: Some(stop),
            task: Some(task),
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `host:port`, as the kubelet's `tracing.endpoint` is written (no scheme).
    pub fn endpoint(&self) -> String {
        self.addr.to_string()
    }

    /// Every span received so far, in arrival order.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.store.spans.lock().unwrap().clone()
    }

    /// Export requests answered so far.
    pub fn requests(&self) -> usize {
        *self.store.requests.lock().unwrap()
    }

    /// Waits until `pred` holds for the spans received (checked at each arrival); panics after
    /// `timeout` with what did arrive.
    pub async fn wait_for(
        &self,
        pred: impl Fn(&[ReceivedSpan]) -> bool,
        timeout: Duration,
    ) -> Vec<ReceivedSpan> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            // registered before looking, so an arrival in between is not missed
            let mut arrived = std::pin::pin!(self.store.arrived.notified());
            arrived.as_mut().enable();
            let spans = self.spans();
            if pred(&spans) {
                return spans;
            }
            if tokio::time::timeout_at(deadline, arrived).await.is_err() {
                panic!("spans not received within {timeout:?}; got {spans:#?}");
            }
        }
    }

    /// Stops listening (the port refuses connections from then on) and waits for the server.
    pub async fn stop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
        }
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}
