//! The export behind [`layer`](super::layer): the span processor that hands each sampled span
//! that ends to a bounded queue, and the one task that takes batches off the queue and calls
//! the exporter.
//!
//! Invariants:
//! * a span's end never waits: [`QueueProcessor`] only `try_send`s; a full queue counts the
//!   span as `queue_full`, a closed one (the task stopped) as `shutdown`;
//! * one export at a time, a batch at most [`ExportOptions::max_batch_size`] spans, sent when
//!   full, after [`ExportOptions::batch_delay`], or on a flush; each export bounded by
//!   [`ExportOptions::export_timeout`] and by the stop's deadline;
//! * every span taken off the queue is exported or counted exactly once in [`SpanDrops`]:
//!   `export_failed` (its export failed or timed out) or `shutdown` (unexported at the stop's
//!   deadline);
//! * the first stop deadline asked for stands ([`ask_stop`]); at the stop the queue is closed,
//!   what it holds is exported until the deadline, and the exporter is shut down;
//! * the task logs with `parent: None`: a failing export once (and once more when it works
//!   again), a rise of `queue_full` once per export.

use super::{ExportOptions, SpanDrops, TracingHandle};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

/// The export task's stop: `None` while it runs; the deadline for what is queued once asked
/// to stop (the earliest asked for).
pub(super) type Stop = std::sync::Arc<tokio::sync::watch::Sender<Option<Instant>>>;

/// Asks the export task to stop by `deadline` (an earlier request stands).
pub(super) fn ask_stop(stop: &Stop, deadline: Instant) {
    stop.send_if_modified(|d| match d {
        Some(_) => false,
        None => {
            *d = Some(deadline);
            true
        }
    });
}

/// The span processor: hands each sampled span that ends to the export task's bounded queue,
/// never waiting.
#[derive(Debug)]
pub(super) struct QueueProcessor {
    spans: mpsc::Sender<SpanData>,
    flush: mpsc::UnboundedSender<oneshot::Sender<()>>,
    stop: Stop,
    drops: SpanDrops,
}

impl SpanProcessor for QueueProcessor {
    fn on_start(&self, _span: &mut Span, _cx: &opentelemetry::Context) {}

    fn on_end(&self, span: SpanData) {
        if !span.span_context.is_sampled() {
            return;
        }
        match self.spans.try_send(span) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.drops.queue_full.inc();
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                self.drops.shutdown.inc();
            }
        }
    }

    /// Asks for a flush and returns: the SDK's flush is synchronous, and waiting here could
    /// hold a runtime thread ([`TracingHandle::flush`] waits).
    fn force_flush(&self) -> OTelSdkResult {
        let (tx, _rx) = oneshot::channel();
        let _ = self.flush.send(tx);
        Ok(())
    }

    /// Asks the task to stop within `timeout` and returns ([`TracingHandle::shutdown`] waits).
    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        ask_stop(&self.stop, Instant::now() + timeout);
        Ok(())
    }
}

/// The processor and the export task, spawned on the current runtime.
pub(super) fn spawn<E: SpanExporter + 'static>(
    exporter: E,
    drops: SpanDrops,
    options: &ExportOptions,
) -> (QueueProcessor, TracingHandle) {
    let (spans_tx, spans_rx) = mpsc::channel(options.queue_size.max(1));
    let (flush_tx, flush_rx) = mpsc::unbounded_channel();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(None);
    let stop = std::sync::Arc::new(stop_tx);
    let task = Export {
        exporter,
        spans: spans_rx,
        flush: flush_rx,
        stop: stop_rx,
        drops: drops.clone(),
        max_batch: options.max_batch_size.max(1),
        batch_delay: options.batch_delay,
        export_timeout: options.export_timeout,
        failing: false,
        queue_full_seen: drops.queue_full(),
    };
    let task = tokio::spawn(task.run());
    (
        QueueProcessor {
            spans: spans_tx,
            flush: flush_tx.clone(),
            stop: stop.clone(),
            drops: drops.clone(),
        },
        TracingHandle {
            flush: flush_tx,
            stop,
            task: Some(task),
            provider: None,
            drops,
            shutdown_timeout: options.shutdown_timeout,
        },
    )
}

/// The export task's state.
struct Export<E> {
    exporter: E,
    spans: mpsc::Receiver<SpanData>,
    flush: mpsc::UnboundedReceiver<oneshot::Sender<()>>,
    stop: tokio::sync::watch::Receiver<Option<Instant>>,
    drops: SpanDrops,
    max_batch: usize,
    batch_delay: Duration,
    export_timeout: Duration,
    /// The last export failed (logged once until one succeeds).
    failing: bool,
    /// `queue_full` when last looked at (a rise is logged once per export).
    queue_full_seen: u64,
}

impl<E: SpanExporter> Export<E> {
    async fn run(mut self) {
        let mut batch: Vec<SpanData> = Vec::with_capacity(self.max_batch);
        // when the batch that is not full is exported anyway
        let mut due: Option<Instant> = None;
        loop {
            let stop = *self.stop.borrow_and_update();
            if let Some(deadline) = stop {
                self.stop(batch, deadline).await;
                return;
            }
            let room = self.max_batch - batch.len();
            tokio::select! {
                biased;
                changed = self.stop.changed() => {
                    if changed.is_err() {
                        // every handle and processor gone: nothing more will come
                        let deadline = Instant::now() + self.export_timeout;
                        self.stop(batch, deadline).await;
                        return;
                    }
                }
                f = self.flush.recv() => if let Some(done) = f {
                    self.drain(&mut batch);
                    self.export_all(std::mem::take(&mut batch), None).await;
                    due = None;
                    let _ = done.send(());
                },
                n = self.spans.recv_many(&mut batch, room) => {
                    if n == 0 {
                        let deadline = Instant::now() + self.export_timeout;
                        self.stop(batch, deadline).await;
                        return;
                    }
                    if batch.len() >= self.max_batch {
                        self.export(std::mem::take(&mut batch), None).await;
                        due = None;
                    } else if due.is_none() {
                        due = Some(Instant::now() + self.batch_delay);
                    }
                },
                () = sleep_until(due) => {
                    self.export(std::mem::take(&mut batch), None).await;
                    due = None;
                },
            }
        }
    }

    /// Moves every span queued now into `batch`.
    fn drain(&mut self, batch: &mut Vec<SpanData>) {
        while let Ok(s) = self.spans.try_recv() {
            batch.push(s);
        }
    }

    /// Closes the queue (a span ending from now on is counted as `shutdown`), exports what it
    /// holds until `deadline`, counts what is left, and shuts the exporter down.
    async fn stop(&mut self, mut batch: Vec<SpanData>, deadline: Instant) {
        self.spans.close();
        self.drain(&mut batch);
        self.export_all(batch, Some(deadline)).await;
        let left = deadline.saturating_duration_since(Instant::now());
        let _ = self
            .exporter
            .shutdown_with_timeout(left.max(Duration::from_millis(1)));
    }

    /// Exports `spans` in batches; past `deadline`, the rest is counted as `shutdown`.
    async fn export_all(&mut self, mut spans: Vec<SpanData>, deadline: Option<Instant>) {
        while !spans.is_empty() {
            if deadline.is_some_and(|d| Instant::now() >= d) {
                self.drops.shutdown.inc_by(spans.len() as u64);
                return;
            }
            let rest = spans.split_off(spans.len().min(self.max_batch));
            let batch = std::mem::replace(&mut spans, rest);
            self.export(batch, deadline).await;
        }
    }

    /// Exports one batch, bounded by the export timeout and by the stop's deadline (`deadline`,
    /// or one asked for meanwhile): a failure or the timeout counts it as `export_failed`, the
    /// deadline as `shutdown`.
    async fn export(&mut self, batch: Vec<SpanData>, deadline: Option<Instant>) {
        let n = batch.len() as u64;
        if n == 0 {
            return;
        }
        let limit = Instant::now() + self.export_timeout;
        let mut stop = self.stop.clone();
        let outcome = {
            let export = self.exporter.export(batch);
            tokio::pin!(export);
            loop {
                let stop_at = deadline.or(*stop.borrow_and_update());
                let until = stop_at.map_or(limit, |d| d.min(limit));
                tokio::select! {
                    biased;
                    r = &mut export => break r.map_err(|e| e.to_string()),
                    _ = stop.changed(), if deadline.is_none() => {}
                    () = tokio::time::sleep_until(until) => {
                        if stop_at.is_some_and(|d| d < limit) {
                            self.drops.shutdown.inc_by(n);
                            return;
                        }
                        break Err(format!("no answer within {:?}", self.export_timeout));
                    }
                }
            }
        };
        match outcome {
            Ok(()) if self.failing => {
                self.failing = false;
                tracing::info!(parent: None, "trace export works again");
            }
            Ok(()) => {}
            Err(why) => {
                self.drops.export_failed.inc_by(n);
                if !self.failing {
                    self.failing = true;
                    tracing::warn!(
                        parent: None,
                        error = %why,
                        spans = n,
                        "trace export failed: the spans are dropped (counted in \
                         reaplet_tracing_spans_dropped_total); said again only once it works again"
                    );
                }
            }
        }
        let full = self.drops.queue_full();
        if full > self.queue_full_seen {
            tracing::warn!(
                parent: None,
                dropped = full - self.queue_full_seen,
                "trace export queue full: spans dropped (counted in \
                 reaplet_tracing_spans_dropped_total{{reason=\"queue_full\"}})"
            );
            self.queue_full_seen = full;
        }
    }
}

/// Sleeps until `due`, forever when `None`.
async fn sleep_until(due: Option<Instant>) {
    match due {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::otel::tests::every_trace;
    use crate::otel::{TracingConfig, is_exported_target, layer_with_exporter};
    use std::sync::{Arc, Mutex};
    use tracing_subscriber::layer::SubscriberExt;

    /// An exporter that records each batch's span names, after `delay` (forever: `None`), or
    /// fails.
    #[derive(Debug, Clone)]
    struct Fake {
        batches: Arc<Mutex<Vec<Vec<String>>>>,
        delay: Option<Duration>,
        fail: bool,
    }

    impl Fake {
        fn new(delay: Option<Duration>, fail: bool) -> Self {
            Self {
                batches: Arc::default(),
                delay,
                fail,
            }
        }

        fn exported(&self) -> usize {
            self.batches.lock().unwrap().iter().map(Vec::len).sum()
        }
    }

    impl SpanExporter for Fake {
        async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
            match self.delay {
                Some(d) => tokio::time::sleep(d).await,
                None => std::future::pending().await,
            }
            if self.fail {
                return Err(opentelemetry_sdk::error::OTelSdkError::InternalFailure(
                    "refused".into(),
                ));
            }
            self.batches
                .lock()
                .unwrap()
                .push(batch.into_iter().map(|s| s.name.into_owned()).collect());
            Ok(())
        }
    }

    fn small(queue: usize, batch: usize) -> ExportOptions {
        ExportOptions {
            queue_size: queue,
            max_batch_size: batch,
            batch_delay: Duration::from_secs(5),
            export_timeout: Duration::from_secs(10),
            shutdown_timeout: Duration::from_secs(2),
            host_name: None,
        }
    }

    /// A subscriber with only the export layer on `exporter`.
    fn subscriber(
        config: &TracingConfig,
        exporter: Fake,
        drops: SpanDrops,
        options: ExportOptions,
    ) -> (impl tracing::Subscriber + Send + Sync, TracingHandle) {
        let (layer, handle) = layer_with_exporter(config, exporter, drops, options);
        (tracing_subscriber::registry().with(layer), handle)
    }

    /// `n` root spans of reaplet's, each ended at once.
    fn spans(n: usize) {
        for i in 0..n {
            let _s = tracing::info_span!(target: "reaplet::test", "pod_termination", i).entered();
        }
    }

    /// An exporter that never answers: the queue fills, the spans past it are dropped and
    /// counted at once, and ending them never waits (paused time does not move).
    #[tokio::test(start_paused = true)]
    async fn a_full_queue_drops_and_counts_instead_of_blocking() {
        let fake = Fake::new(None, false);
        let drops = SpanDrops::default();
        let (sub, handle) = subscriber(&every_trace(), fake.clone(), drops.clone(), small(4, 2));
        let _d = tracing::subscriber::set_default(sub);
        let start = Instant::now();
        // the task takes the first batch of 2 off the queue and hangs exporting it
        spans(2);
        tokio::task::yield_now().await;
        spans(20);
        assert_eq!(Instant::now(), start, "ending spans never waited");
        // 2 in the hung export, 4 queued, the rest dropped
        assert_eq!(drops.queue_full(), 16);
        assert_eq!(drops.total(), 16);
        // the stop is bounded although the export never answers: the rest counted
        assert!(handle.shutdown().await);
        assert_eq!(Instant::now() - start, Duration::from_secs(2));
        assert_eq!(drops.shutdown(), 6);
        assert_eq!(fake.exported(), 0);
        // a span that ends after the stop is not exported (the provider is shut down)
        spans(1);
        assert_eq!(drops.total(), 22);
    }

    #[tokio::test(start_paused = true)]
    async fn batches_by_size_and_delay_and_failed_exports_are_counted() {
        let fake = Fake::new(Some(Duration::from_millis(10)), false);
        let drops = SpanDrops::default();
        let (sub, handle) = subscriber(&every_trace(), fake.clone(), drops.clone(), small(64, 4));
        let _d = tracing::subscriber::set_default(sub);
        spans(9);
        // two full batches at once; the ninth waits for the batch delay
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(fake.exported(), 8);
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(fake.exported(), 9);
        let sizes: Vec<usize> = fake.batches.lock().unwrap().iter().map(Vec::len).collect();
        assert_eq!(sizes, [4, 4, 1]);
        assert!(handle.flush(Duration::from_secs(1)).await);
        assert!(handle.shutdown().await);
        assert_eq!(drops.total(), 0);

        // a collector that refuses: every span counted once
        let fake = Fake::new(Some(Duration::from_millis(10)), true);
        let drops = SpanDrops::default();
        let (sub, handle) = subscriber(&every_trace(), fake, drops.clone(), small(64, 4));
        let _d = tracing::subscriber::set_default(sub);
        spans(6);
        assert!(handle.flush(Duration::from_secs(1)).await);
        assert_eq!(drops.export_failed(), 6);
        // an export that never answers is cut at the export timeout
        let fake = Fake::new(Some(Duration::from_secs(3600)), false);
        let drops = SpanDrops::default();
        let (sub, handle) = subscriber(&every_trace(), fake, drops.clone(), small(64, 4));
        let _d = tracing::subscriber::set_default(sub);
        spans(3);
        assert!(handle.flush(Duration::from_secs(11)).await);
        assert_eq!(drops.export_failed(), 3);
        assert!(handle.shutdown().await);
    }

    /// Sampling 0 samples nothing: nothing reaches the queue; spans of other crates are never
    /// exported.
    #[tokio::test(start_paused = true)]
    async fn sampling_and_targets() {
        let fake = Fake::new(Some(Duration::ZERO), false);
        let config = TracingConfig {
            sampling_rate_per_million: 0,
            ..every_trace()
        };
        let (sub, handle) = subscriber(&config, fake.clone(), SpanDrops::default(), small(8, 8));
        let _d = tracing::subscriber::set_default(sub);
        spans(20);
        assert!(handle.flush(Duration::from_secs(1)).await);
        assert_eq!(fake.exported(), 0);
        drop(_d);
        let (sub, handle) = subscriber(
            &every_trace(),
            fake.clone(),
            SpanDrops::default(),
            small(8, 8),
        );
        let _d = tracing::subscriber::set_default(sub);
        {
            let _h2 = tracing::info_span!(target: "h2::proto", "Connection").entered();
            let _ours = tracing::info_span!(target: "reaplet", "kept").entered();
        }
        assert!(handle.flush(Duration::from_secs(1)).await);
        assert_eq!(*fake.batches.lock().unwrap(), [vec!["kept".to_owned()]]);
        assert!(
            is_exported_target("reaplet::terminating::kill") && !is_exported_target("reaplet_x")
        );
    }
}
