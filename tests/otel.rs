//! OpenTelemetry trace export (src/otel/) to a real OTLP/gRPC receiver (tests/common/otlp.rs)
//! over loopback: the layer in a subscriber of its own, no agent. A pod termination's spans
//! arrive as one trace with their nesting and attributes; sampling 0 exports nothing; with the
//! receiver down the spans are dropped and counted, and ending them never waits.

#[path = "common/otlp.rs"]
mod otlp;

use otlp::{OtlpReceiver, ReceivedSpan};
use reaplet::otel::{self, ExportOptions, SpanDrops, TracingConfig};
use std::time::{Duration, Instant};
use tracing_subscriber::layer::SubscriberExt;

/// Generous bound on a span reaching the receiver over loopback (the batch delay is 5 s).
const ARRIVAL: Duration = Duration::from_secs(30);

fn config(endpoint: &str, rate: u32) -> TracingConfig {
    TracingConfig {
        endpoint: endpoint.to_owned(),
        sampling_rate_per_million: rate,
    }
}

/// One pod termination as the pipeline's spans have it: the root, a stage with a CRI call in
/// it, and a second stage. All of reaplet's targets.
fn pod_termination(name: &str, uid: &str) {
    let root = tracing::info_span!(
        target: "reaplet::workers",
        "pod_termination",
        k8s.pod.namespace = "default",
        k8s.pod.name = name,
        k8s.pod.uid = uid,
    );
    let _root = root.enter();
    {
        let stage =
            tracing::info_span!(target: "reaplet::terminating::kill", "kill", stage = "kill");
        let _stage = stage.enter();
        let cri = tracing::info_span!(
            target: "reaplet::cri",
            "cri",
            rpc.method = "StopContainer",
            container.id = "c0ffee",
            timeout_s = 30,
        );
        let _cri = cri.enter();
    }
    let status = tracing::info_span!(target: "reaplet::status", "status", stage = "status");
    let _status = status.enter();
}

fn by_name<'a>(spans: &'a [ReceivedSpan], name: &str) -> &'a ReceivedSpan {
    spans
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no span {name:?} in {spans:#?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_termination_is_one_trace_with_nested_spans_and_pod_attributes() {
    let receiver = OtlpReceiver::start().await;
    let drops = SpanDrops::default();
    let (layer, handle) = otel::layer(
        &config(&receiver.endpoint(), otel::MAX_SAMPLING_RATE_PER_MILLION),
        drops.clone(),
        ExportOptions {
            host_name: Some("testnode".into()),
            ..ExportOptions::default()
        },
    )
    .unwrap();
    let subscriber = tracing_subscriber::registry().with(layer);
    tracing::subscriber::with_default(subscriber, || {
        pod_termination("web-0", "8d3c-uid");
        // another crate's span (the transport's, say) is never exported
        let _h2 = tracing::info_span!(target: "h2::proto", "Connection").entered();
    });
    assert!(handle.flush(ARRIVAL).await, "flush");
    let spans = receiver.wait_for(|s| s.len() >= 4, ARRIVAL).await;
    assert_eq!(spans.len(), 4, "{spans:#?}");

    let root = by_name(&spans, "pod_termination");
    let kill = by_name(&spans, "kill");
    let cri = by_name(&spans, "cri");
    let status = by_name(&spans, "status");
    // one trace, nested as entered
    assert!(
        spans.iter().all(|s| s.trace_id == root.trace_id),
        "{spans:#?}"
    );
    assert_eq!(root.trace_id.len(), 32);
    assert_ne!(root.trace_id, "0".repeat(32));
    assert_eq!(root.parent_span_id, None);
    assert_eq!(kill.parent_span_id.as_ref(), Some(&root.span_id));
    assert_eq!(cri.parent_span_id.as_ref(), Some(&kill.span_id));
    assert_eq!(status.parent_span_id.as_ref(), Some(&root.span_id));
    let mut ids: Vec<&str> = spans.iter().map(|s| s.span_id.as_str()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 4, "distinct span ids");
    // the pod's attributes, the call's
    assert_eq!(root.attr("k8s.pod.namespace"), Some("default"));
    assert_eq!(root.attr("k8s.pod.name"), Some("web-0"));
    assert_eq!(root.attr("k8s.pod.uid"), Some("8d3c-uid"));
    assert_eq!(cri.attr("rpc.method"), Some("StopContainer"));
    assert_eq!(cri.attr("container.id"), Some("c0ffee"));
    assert_eq!(cri.attr("timeout_s"), Some("30"));
    assert_eq!(kill.attr("stage"), Some("kill"));
    // a child within its parent's time
    for (child, parent) in [(kill, root), (cri, kill), (status, root)] {
        assert!(
            parent.start_ns <= child.start_ns && child.end_ns <= parent.end_ns,
            "{} [{}, {}] not within {} [{}, {}]",
            child.name,
            child.start_ns,
            child.end_ns,
            parent.name,
            parent.start_ns,
            parent.end_ns
        );
        assert!(child.start_ns <= child.end_ns);
    }
    // the kubelet's resource, with reaplet's name
    assert_eq!(
        root.resource.get("service.name").map(String::as_str),
        Some("reaplet")
    );
    assert_eq!(
        root.resource.get("host.name").map(String::as_str),
        Some("testnode")
    );
    assert_eq!(drops.total(), 0);
    assert!(handle.shutdown().await);
}

/// `samplingRatePerMillion: 0` (the kubelet's default) samples no trace: nothing is sent. The
/// same receiver then gets a sampling layer's spans, so the silence is the sampler's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampling_zero_exports_nothing() {
    let receiver = OtlpReceiver::start().await;
    let drops = SpanDrops::default();
    let (layer, handle) = otel::layer(
        &config(&receiver.endpoint(), 0),
        drops.clone(),
        ExportOptions::default(),
    )
    .unwrap();
    tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), || {
        for i in 0..50 {
            pod_termination(&format!("p{i}"), &format!("u{i}"));
        }
    });
    // every span that ended has been handed over and exported by now, if any had been sampled
    assert!(handle.flush(ARRIVAL).await);
    assert!(handle.shutdown().await);
    assert_eq!(receiver.spans(), Vec::new());
    assert_eq!(receiver.requests(), 0, "not even an empty export");
    assert_eq!(drops.total(), 0);

    let (layer, handle) = otel::layer(
        &config(&receiver.endpoint(), otel::MAX_SAMPLING_RATE_PER_MILLION),
        SpanDrops::default(),
        ExportOptions::default(),
    )
    .unwrap();
    tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), || {
        pod_termination("sampled", "u-sampled");
    });
    assert!(handle.flush(ARRIVAL).await);
    let spans = receiver.wait_for(|s| s.len() >= 4, ARRIVAL).await;
    assert_eq!(
        by_name(&spans, "pod_termination").attr("k8s.pod.name"),
        Some("sampled")
    );
    assert!(handle.shutdown().await);
}

/// The receiver is down (its port refuses): ending spans never waits for the export, the ones
/// past the queue are dropped and counted at once, the ones taken are counted when their export
/// fails: every span exactly once. The stop stays within its bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_receiver_down_spans_are_dropped_and_counted_without_blocking() {
    let mut receiver = OtlpReceiver::start().await;
    let endpoint = receiver.endpoint();
    receiver.stop().await;
    let options = ExportOptions {
        queue_size: 16,
        max_batch_size: 8,
        batch_delay: Duration::from_millis(50),
        export_timeout: Duration::from_secs(5),
        shutdown_timeout: Duration::from_secs(2),
        host_name: None,
    };
    let drops = SpanDrops::default();
    let (layer, handle) = otel::layer(
        &config(&endpoint, otel::MAX_SAMPLING_RATE_PER_MILLION),
        drops.clone(),
        options.clone(),
    )
    .unwrap();
    const TERMINATIONS: usize = 200;
    const SPANS: u64 = 4 * TERMINATIONS as u64;
    let dispatch = tracing::Dispatch::new(tracing_subscriber::registry().with(layer));
    let terminations = |wave: &str| {
        tracing::dispatcher::with_default(&dispatch, || {
            for i in 0..TERMINATIONS {
                pod_termination(&format!("{wave}{i}"), &format!("u-{wave}{i}"));
            }
        })
    };
    let started = Instant::now();
    terminations("a");
    let took = started.elapsed();
    // an `on_end` that waited for its export would wait at least one export per batch: each
    // of SPANS / max_batch_size exports fails only after a refused connection and the
    // exporter's retries; the spans all ended within less than one export timeout
    assert!(
        took < options.export_timeout,
        "ending {SPANS} spans took {took:?}"
    );
    // more ended than the queue and one batch in flight hold: the rest was dropped at once
    let held = (options.queue_size + 2 * options.max_batch_size) as u64;
    assert!(
        drops.queue_full() >= SPANS - held,
        "queue_full {} of {SPANS}",
        drops.queue_full()
    );
    // the spans taken fail to export (refused, after the exporter's retries): every span
    // counted once
    let deadline = Instant::now() + ARRIVAL;
    while drops.queue_full() + drops.export_failed() < SPANS {
        assert!(
            Instant::now() < deadline,
            "queue_full {} + export_failed {} != {SPANS}",
            drops.queue_full(),
            drops.export_failed()
        );
        assert!(handle.flush(ARRIVAL).await);
    }
    assert_eq!(drops.queue_full() + drops.export_failed(), SPANS);
    assert!(drops.export_failed() > 0);
    assert_eq!(drops.shutdown(), 0);
    // a second wave, and the stop right after, with the queue full for a dead receiver: the
    // stop keeps its bound, and every span is still counted once
    terminations("b");
    let started = Instant::now();
    assert!(handle.shutdown().await);
    let took = started.elapsed();
    assert!(
        took < options.shutdown_timeout * 2,
        "the stop took {took:?}"
    );
    assert_eq!(drops.total(), 2 * SPANS, "{drops:?}");
    assert!(receiver.spans().is_empty());
}
