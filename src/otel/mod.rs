//! OpenTelemetry trace export over OTLP/gRPC: the counterpart of the kubelet's `tracing`
//! setting (`KubeletConfiguration.tracing`, a `TracingConfiguration` with `endpoint` and
//! `samplingRatePerMillion`; KEP-2831, kubelet OpenTelemetry tracing, `k8s.io/component-base/
//! tracing`'s `NewProvider`).
//!
//! As the kubelet does it: the spans carry the resource `service.name` = `reaplet` (the kubelet
//! says `kubelet`) and, when given, `host.name`; the sampler is
//! `ParentBased(TraceIdRatioBased(samplingRatePerMillion / 1e6))`, so a rate of 0 (the default)
//! samples no trace of reaplet's own and 1000000 samples every trace; the exporter is OTLP over
//! gRPC without TLS (the kubelet's connection is insecure too) to the endpoint, by default
//! `localhost:4317`. Where the kubelet's `tracing` is unset no tracer provider is made: here,
//! [`crate::config::Settings::tracing`] is `None` and the binary builds no layer, so nothing is
//! exported and nothing (no task, no connection) is started.
//!
//! The spans themselves are plain `tracing` spans (one root span per pod termination, children
//! for its stages, CRI and API calls, with `k8s.pod.namespace`, `k8s.pod.name`,
//! `k8s.pod.uid`); [`layer`] makes the `tracing_subscriber` layer that turns them into
//! OpenTelemetry spans (`tracing-opentelemetry`) and the [`TracingHandle`] that stops the
//! export.
//!
//! Invariants:
//! * export never blocks or slows a termination: a span that ends is handed to a bounded queue
//!   with `try_send` ([`ExportOptions::queue_size`]); one task takes batches off it and calls
//!   the OTLP exporter, one export at a time, each bounded by [`ExportOptions::export_timeout`];
//! * every sampled span that ends before the stop is exported or counted exactly once in
//!   `reaplet_tracing_spans_dropped_total` ([`SpanDrops`]), by reason: `queue_full` (the queue
//!   was full when it ended), `export_failed` (its batch's export failed or timed out),
//!   `shutdown` (it ended after the export stopped, or was still unexported at the shutdown
//!   deadline);
//! * [`TracingHandle::shutdown`] exports what is queued, bounded by
//!   [`ExportOptions::shutdown_timeout`] (2 s): reaplet's stop is never held longer than that;
//! * only spans and events whose target is reaplet's own (`reaplet`, `reaplet::*`) are
//!   exported ([`is_exported_target`]): never the transport's own spans (tonic, hyper, h2,
//!   tower), which the export itself would make, in a loop;
//! * the export task logs a failing export once (and once more when it works again), with
//!   `parent: None`, never from inside a span's end.
//!
//! This module holds the configuration ([`TracingConfig`], [`ExportOptions`]), the drop
//! counters ([`SpanDrops`]), [`layer`] and [`TracingHandle`]; the bounded queue, the span
//! processor and the export task with its batching are in the private `export` submodule.

mod export;

use crate::metrics::SpanDropLabel;
use export::{Stop, ask_stop, spawn};
use opentelemetry::KeyValue;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider, SpanExporter};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tracing_subscriber::Layer;
use tracing_subscriber::registry::LookupSpan;

/// The resource's `service.name` (the kubelet's is `kubelet`) and the tracer's name.
pub const SERVICE_NAME: &str = "reaplet";
/// The collector when only `samplingRatePerMillion` is given: the OTLP gRPC default, as for the
/// kubelet.
pub const DEFAULT_ENDPOINT: &str = "localhost:4317";
/// `samplingRatePerMillion`'s upper bound (every trace), as the kubelet validates it.
pub const MAX_SAMPLING_RATE_PER_MILLION: u32 = 1_000_000;

/// The kubelet's `TracingConfiguration`, resolved: where the spans go and how many traces are
/// sampled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TracingConfig {
    /// The collector's OTLP/gRPC endpoint: `http://host:port` as [`Self::from_parts`] (the
    /// configuration) resolves it; [`layer`] also takes `host:port` ([`endpoint_url`]).
    pub endpoint: String,
    /// Traces sampled per million (0..=1000000).
    pub sampling_rate_per_million: u32,
}

impl TracingConfig {
    /// The kubelet's defaulting: `None` when neither field is set (no tracing at all); else the
    /// endpoint (default [`DEFAULT_ENDPOINT`]) as its URL, and the rate (default 0), checked.
    pub fn from_parts(
        endpoint: Option<&str>,
        sampling_rate_per_million: Option<u64>,
    ) -> Result<Option<Self>, OtelError> {
        if endpoint.is_none() && sampling_rate_per_million.is_none() {
            return Ok(None);
        }
        let rate = sampling_rate_per_million.unwrap_or(0);
        let sampling_rate_per_million = u32::try_from(rate)
            .ok()
            .filter(|r| *r <= MAX_SAMPLING_RATE_PER_MILLION)
            .ok_or(OtelError::SamplingRate(rate))?;
        Ok(Some(Self {
            endpoint: endpoint_url(endpoint.unwrap_or(DEFAULT_ENDPOINT))?,
            sampling_rate_per_million,
        }))
    }

    /// The fraction of traces sampled (0.0..=1.0).
    pub fn sampling_ratio(&self) -> f64 {
        f64::from(
            self.sampling_rate_per_million
                .min(MAX_SAMPLING_RATE_PER_MILLION),
        ) / 1e6
    }

    /// `ParentBased(TraceIdRatioBased(rate / 1e6))`, the kubelet's sampler.
    pub fn sampler(&self) -> Sampler {
        Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(self.sampling_ratio())))
    }
}

/// The exporter's URL for an endpoint: `host:port` gets `http://`; an `http://host:port` URL
/// (a trailing `/` at most) stays; `dns:///host:port`, a gRPC target (a form the kubelet's
/// validation also accepts), is `http://host:port`. The port is required; `https://` is refused (the
/// connection is insecure, as the kubelet's).
pub fn endpoint_url(endpoint: &str) -> Result<String, OtelError> {
    let bad = |why: &str| OtelError::Endpoint {
        endpoint: endpoint.to_owned(),
        why: why.to_owned(),
    };
    let e = endpoint.trim();
    if e.is_empty() {
        return Err(bad("must not be empty"));
    }
    let url = if let Some(rest) = e.strip_prefix("dns:///") {
        format!("http://{rest}")
    } else if e.starts_with("https://") {
        return Err(bad(
            "TLS is not supported: the connection is insecure, as the kubelet's (give host:port or http://host:port)",
        ));
    } else if e.contains("://") {
        e.to_owned()
    } else {
        format!("http://{e}")
    };
    let uri: http::Uri = url
        .parse()
        .map_err(|_| bad("not host:port or an http:// URL"))?;
    if uri.scheme_str() != Some("http") {
        return Err(bad("the scheme must be http:// (or none: host:port)"));
    }
    match uri.host() {
        None | Some("") => return Err(bad("no host")),
        Some(_) => {}
    }
    if uri.port_u16().is_none_or(|p| p == 0) {
        return Err(bad("no port (the OTLP gRPC port is 4317)"));
    }
    if uri.query().is_some() || !matches!(uri.path(), "" | "/") {
        return Err(bad(
            "a gRPC endpoint has no path or query: host:port or http://host:port",
        ));
    }
    if uri.authority().is_some_and(|a| a.as_str().contains('@')) {
        return Err(bad("no user information in the endpoint"));
    }
    Ok(format!(
        "http://{}",
        uri.authority().map_or("", |a| a.as_str())
    ))
}

/// Whether a span or event of `target` is exported: reaplet's own only.
pub fn is_exported_target(target: &str) -> bool {
    target == "reaplet" || target.starts_with("reaplet::")
}

/// One invalid setting or a failure to start the export.
#[derive(Debug, thiserror::Error)]
pub enum OtelError {
    /// `tracing.endpoint` is not an endpoint the exporter can use.
    #[error("{endpoint:?}: {why}")]
    Endpoint { endpoint: String, why: String },
    /// `tracing.samplingRatePerMillion` is out of range.
    #[error("{0}: must be between 0 and 1000000 (one million: every trace)")]
    SamplingRate(u64),
    /// The OTLP exporter could not be built.
    #[error("the OTLP exporter: {0}")]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
    /// [`layer`] was called outside a tokio runtime (it spawns the export task).
    #[error("trace export needs a tokio runtime")]
    NoRuntime,
}

/// Every reason a span is dropped for: the `reason` label of
/// `reaplet_tracing_spans_dropped_total` ([`SpanDropLabel`]), defined by the metrics registry.
pub use crate::metrics::SPAN_DROP_REASONS as DROP_REASONS;

/// The counters of spans dropped, one per reason (clones count into the same counters).
#[derive(Debug, Clone, Default)]
pub struct SpanDrops {
    queue_full: Counter,
    export_failed: Counter,
    shutdown: Counter,
}

impl SpanDrops {
    /// The counters of `family` (`reaplet_tracing_spans_dropped_total`), each reason's created
    /// now, so each reads 0 from the start.
    pub fn from_family(family: &Family<SpanDropLabel, Counter>) -> Self {
        Self::counters(family)
    }

    /// The counters of `metrics`' `reaplet_tracing_spans_dropped_total`.
    pub fn from_metrics(metrics: &crate::metrics::Metrics) -> Self {
        Self::counters(&metrics.tracing_spans_dropped)
    }

    fn counters(family: &Family<SpanDropLabel, Counter>) -> Self {
        // one counter per reason of the one list: a reason added there does not compile here
        // until it has its counter
        let [queue_full, export_failed, shutdown] =
            DROP_REASONS.map(|reason| family.get_or_create(&SpanDropLabel { reason }).clone());
        Self {
            queue_full,
            export_failed,
            shutdown,
        }
    }

    /// Spans dropped because the queue was full.
    pub fn queue_full(&self) -> u64 {
        self.queue_full.get()
    }

    /// Spans dropped because their export failed or timed out.
    pub fn export_failed(&self) -> u64 {
        self.export_failed.get()
    }

    /// Spans that ended after the export stopped, or were unexported at its deadline.
    pub fn shutdown(&self) -> u64 {
        self.shutdown.get()
    }

    /// Every span dropped.
    pub fn total(&self) -> u64 {
        self.queue_full() + self.export_failed() + self.shutdown()
    }
}

/// How the export batches and how long it may take. The defaults are the OpenTelemetry batch
/// processor's (as the kubelet's Go SDK has them), the OTLP exporter's timeout, and a 2 s bound
/// on the stop.
#[derive(Debug, Clone)]
pub struct ExportOptions {
    /// Spans waiting for export at most; a span ending with the queue full is dropped.
    pub queue_size: usize,
    /// Spans per export at most.
    pub max_batch_size: usize,
    /// How long a batch that is not full waits for more spans.
    pub batch_delay: Duration,
    /// One export's bound, retries included.
    pub export_timeout: Duration,
    /// [`TracingHandle::shutdown`]'s bound.
    pub shutdown_timeout: Duration,
    /// The resource's `host.name` (the node's name), as the kubelet sets it.
    pub host_name: Option<String>,
}

impl Default for ExportOptions {
    fn default() -> Self {
        Self {
            queue_size: 2048,
            max_batch_size: 512,
            batch_delay: Duration::from_secs(5),
            export_timeout: Duration::from_secs(10),
            shutdown_timeout: Duration::from_secs(2),
            host_name: None,
        }
    }
}

/// The `tracing_subscriber` layer that exports reaplet's spans to `config`'s collector, and
/// the handle that stops the export. Call it inside the tokio runtime (it spawns the export
/// task; the gRPC connection is made at the first export). The layer filters its spans itself
/// ([`is_exported_target`]); add it beside the log layer, not under the log filter, for spans
/// below the log level to be exported.
pub fn layer<S>(
    config: &TracingConfig,
    drops: SpanDrops,
    options: ExportOptions,
) -> Result<(impl Layer<S> + Send + Sync + 'static, TracingHandle), OtelError>
where
    S: tracing::Subscriber + Send + Sync + for<'a> LookupSpan<'a>,
{
    if config.sampling_rate_per_million > MAX_SAMPLING_RATE_PER_MILLION {
        return Err(OtelError::SamplingRate(
            config.sampling_rate_per_million.into(),
        ));
    }
    let url = endpoint_url(&config.endpoint)?;
    tokio::runtime::Handle::try_current().map_err(|_| OtelError::NoRuntime)?;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(url)
        .with_timeout(options.export_timeout)
        .build()?;
    Ok(layer_with_exporter(config, exporter, drops, options))
}

/// [`layer`] with any exporter (the tests' in-memory ones).
fn layer_with_exporter<S, E>(
    config: &TracingConfig,
    mut exporter: E,
    drops: SpanDrops,
    options: ExportOptions,
) -> (impl Layer<S> + Send + Sync + 'static, TracingHandle)
where
    S: tracing::Subscriber + Send + Sync + for<'a> LookupSpan<'a>,
    E: SpanExporter + 'static,
{
    let mut resource = Resource::builder_empty().with_service_name(SERVICE_NAME);
    if let Some(host) = &options.host_name {
        resource = resource.with_attribute(KeyValue::new("host.name", host.clone()));
    }
    let resource = resource.build();
    exporter.set_resource(&resource);
    let (processor, handle) = spawn(exporter, drops, &options);
    let provider = SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_sampler(config.sampler())
        .with_resource(resource)
        .build();
    let tracer = provider.tracer(SERVICE_NAME);
    let layer = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_location(false)
        .with_threads(false)
        .with_target(false)
        .with_tracked_inactivity(false)
        .with_filter(tracing_subscriber::filter::filter_fn(|meta| {
            is_exported_target(meta.target())
        }));
    let mut handle = handle;
    handle.provider = Some(provider);
    (layer, handle)
}

/// Stops the export ([`TracingHandle::shutdown`]); dropped, it asks the export task to stop
/// within the shutdown bound without waiting for it.
#[derive(Debug)]
pub struct TracingHandle {
    flush: mpsc::UnboundedSender<oneshot::Sender<()>>,
    stop: Stop,
    task: Option<tokio::task::JoinHandle<()>>,
    provider: Option<SdkTracerProvider>,
    drops: SpanDrops,
    shutdown_timeout: Duration,
}

impl TracingHandle {
    /// Exports every span queued now; `false` when that took longer than `limit` (the export
    /// goes on).
    pub async fn flush(&self, limit: Duration) -> bool {
        let (tx, rx) = oneshot::channel();
        if self.flush.send(tx).is_err() {
            return true;
        }
        matches!(tokio::time::timeout(limit, rx).await, Ok(Ok(())))
    }

    /// The drop counters this export counts into.
    pub fn drops(&self) -> &SpanDrops {
        &self.drops
    }

    /// Exports what is queued and stops, within the shutdown bound (2 s by default): spans
    /// still unexported then, an export in flight included, are counted as `shutdown`. `false`
    /// when the task had to be aborted (an exporter that blocked its thread).
    pub async fn shutdown(mut self) -> bool {
        let deadline = Instant::now() + self.shutdown_timeout;
        ask_stop(&self.stop, deadline);
        let mut clean = true;
        if let Some(mut task) = self.task.take() {
            // the task keeps the deadline itself; this margin only covers a task that cannot
            if tokio::time::timeout_at(deadline + Duration::from_millis(200), &mut task)
                .await
                .is_err()
            {
                task.abort();
                clean = false;
            }
        }
        if let Some(p) = self.provider.take() {
            // spans that end from now on are not sampled; the processor's shutdown only asks
            let _ = p.shutdown_with_timeout(Duration::ZERO);
        }
        clean
    }
}

impl Drop for TracingHandle {
    fn drop(&mut self) {
        ask_stop(&self.stop, Instant::now() + self.shutdown_timeout);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every trace sampled, to a collector that is never dialled (the export tests' too).
    pub(super) fn every_trace() -> TracingConfig {
        TracingConfig {
            endpoint: "http://127.0.0.1:4317".into(),
            sampling_rate_per_million: MAX_SAMPLING_RATE_PER_MILLION,
        }
    }

    #[test]
    fn endpoints() {
        for (given, url) in [
            ("localhost:4317", "http://localhost:4317"),
            ("127.0.0.1:4317", "http://127.0.0.1:4317"),
            ("[::1]:4317", "http://[::1]:4317"),
            (
                "http://collector.monitoring:4317",
                "http://collector.monitoring:4317",
            ),
            ("http://collector:4317/", "http://collector:4317"),
            ("dns:///collector:4317", "http://collector:4317"),
            (" collector:55680 ", "http://collector:55680"),
        ] {
            assert_eq!(endpoint_url(given).unwrap(), url, "{given}");
        }
        for bad in [
            "",
            "collector",
            "https://collector:4317",
            "grpc://collector:4317",
            "collector:port",
            "collector:0",
            "http://collector:4317/v1/traces",
            "http://collector:4317?x=1",
            "http://user@collector:4317",
            "http://:4317",
            "a b:4317",
        ] {
            assert!(
                matches!(endpoint_url(bad), Err(OtelError::Endpoint { .. })),
                "{bad:?}: {:?}",
                endpoint_url(bad)
            );
        }
    }

    #[test]
    fn the_kubelets_defaulting_and_sampler() {
        assert_eq!(TracingConfig::from_parts(None, None).unwrap(), None);
        let c = TracingConfig::from_parts(None, Some(100)).unwrap().unwrap();
        assert_eq!(c.endpoint, "http://localhost:4317");
        assert_eq!(c.sampling_ratio(), 0.0001);
        let c = TracingConfig::from_parts(Some("c:4317"), None)
            .unwrap()
            .unwrap();
        assert_eq!(
            (c.endpoint.as_str(), c.sampling_rate_per_million),
            ("http://c:4317", 0)
        );
        assert_eq!(every_trace().sampling_ratio(), 1.0);
        assert!(matches!(
            TracingConfig::from_parts(None, Some(1_000_001)),
            Err(OtelError::SamplingRate(1_000_001))
        ));
        let s = format!("{:?}", every_trace().sampler());
        assert!(
            s.contains("ParentBased") && s.contains("TraceIdRatioBased"),
            "{s}"
        );
    }

    #[test]
    fn drops_count_in_the_metric_family() {
        let family = Family::<SpanDropLabel, Counter>::default();
        let d = SpanDrops::from_family(&family);
        d.queue_full.inc_by(3);
        d.clone().export_failed.inc();
        assert_eq!(
            family
                .get_or_create(&SpanDropLabel {
                    reason: "queue_full"
                })
                .get(),
            3
        );
        assert_eq!(d.total(), 4);
    }

    #[test]
    fn layer_outside_a_runtime_is_an_error() {
        let r = layer::<tracing_subscriber::Registry>(
            &every_trace(),
            SpanDrops::default(),
            ExportOptions::default(),
        );
        assert!(matches!(r, Err(OtelError::NoRuntime)));
    }
}
