//! `reaplet run`'s logs: the kubelet's `logs.InitLogs` and `--logging-format` (component-base
//! `logs`), on `tracing`. Formats: text (colours only on a terminal), json (one object per line,
//! the event's fields at the top level) and journald (`<N>` syslog level prefixes, no timestamp:
//! journald adds its own); `auto` is journald when systemd gives the journal as stderr
//! (`$JOURNAL_STREAM`), else text. The filter is `$RUST_LOG`, else `info`.
//!
//! Invariants:
//! * logs go to stderr only; stdout is the commands' output;
//! * a write error (EPIPE on a closed stderr) drops the line, never panics: the default reports
//!   it with `eprintln!`, which panics on that same stderr, in whichever task logged;
//! * the subscriber is a registry with per-layer filters ([`init`]): the logs ([`fmt_layer`]
//!   with [`filter`]) never show the termination trace spans ([`crate::timeline::TRACE_TARGET`]),
//!   and with `tracing` set the OTLP export layer ([`crate::otel`]) sees reaplet's own spans
//!   down to debug (the CRI calls) whatever `$RUST_LOG` says, but not the long-lived
//!   `pod_worker` and `pod_status` spans: a termination's `pod_termination` is its trace's root.

use crate::config::{Loaded, LogFormat};
use tracing::Subscriber;
use tracing_subscriber::Layer;
use tracing_subscriber::fmt::format::{Format, Full, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;

/// The log target of the lines `reaplet run` writes about its own start (the binary crate's
/// name, where they were first written): text and journald lines show it, json has it as
/// `target`, and `RUST_LOG` directives select by it.
pub const BINARY_TARGET: &str = "reaplet";

/// Writes `<N>` syslog level prefixes (journald reads them from stderr), then the event.
pub struct JournaldFormat(pub Format<Full, ()>);

impl<S, N> FormatEvent<S, N> for JournaldFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        let prio = match *event.metadata().level() {
            tracing::Level::ERROR => 3,
            tracing::Level::WARN => 4,
            tracing::Level::INFO => 6,
            _ => 7,
        };
        write!(writer, "<{prio}>")?;
        self.0.format_event(ctx, writer, event)
    }
}

/// `auto` resolved: journald when systemd gives the journal as stderr, else text.
pub fn resolve(format: LogFormat) -> LogFormat {
    match format {
        LogFormat::Auto if std::env::var_os("JOURNAL_STREAM").is_some() => LogFormat::Journald,
        LogFormat::Auto => LogFormat::Text,
        f => f,
    }
}

/// The filter: `$RUST_LOG`, else `info`.
pub fn filter() -> tracing_subscriber::EnvFilter {
    tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into())
}

/// The formatting layer, writing to stderr in `format` (`auto` is resolved here).
pub fn fmt_layer<S>(format: LogFormat) -> Box<dyn Layer<S> + Send + Sync + 'static>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    use std::io::IsTerminal;
    // a write error drops the line (see the module's invariants)
    let layer = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .log_internal_errors(false);
    match resolve(format) {
        LogFormat::Json => layer.json().flatten_event(true).boxed(),
        LogFormat::Journald => layer
            .with_ansi(false)
            .event_format(JournaldFormat(
                tracing_subscriber::fmt::format().without_time(),
            ))
            .boxed(),
        _ => layer.with_ansi(std::io::stderr().is_terminal()).boxed(),
    }
}

/// Installs the global subscriber with the logs only. Panics if one is already installed.
pub fn init_logs(format: LogFormat) {
    init(format, None);
}

/// What the trace export layer sees: reaplet's own spans and events down to debug, except the
/// pod worker's and the status manager's (which outlive a termination) and runtime calls made
/// outside any exported span (relists, the event stream: they would each be a trace of their
/// own, competing with the terminations' for the queue).
fn exported(m: &tracing::Metadata<'_>, in_span: bool) -> bool {
    crate::otel::is_exported_target(m.target())
        && *m.level() <= tracing::Level::DEBUG
        && !(m.is_span() && matches!(m.name(), "pod_worker" | "pod_status"))
        && !(m.is_span() && m.target().starts_with("reaplet::cri") && !in_span)
}

/// Installs the global subscriber: the logs and, given the kubelet's `tracing` settings, the
/// OTLP export (the handle stops it; `None` when not configured or it could not start, which
/// is logged). Panics if a subscriber is already installed (called once, at start).
pub fn init(
    format: LogFormat,
    tracing: Option<(
        &crate::otel::TracingConfig,
        crate::otel::SpanDrops,
        Option<String>,
    )>,
) -> Option<crate::otel::TracingHandle> {
    use tracing_subscriber::filter::{dynamic_filter_fn, filter_fn};
    let logs = fmt_layer(format)
        .with_filter(filter())
        .with_filter(filter_fn(|m| m.target() != crate::timeline::TRACE_TARGET));
    let built = tracing.map(|(config, drops, host_name)| {
        let options = crate::otel::ExportOptions {
            host_name,
            ..Default::default()
        };
        crate::otel::layer(config, drops, options)
    });
    let (export, handle, failed) = match built {
        Some(Ok((layer, handle))) => {
            let filter = dynamic_filter_fn(|m, cx| exported(m, cx.lookup_current().is_some()));
            (Some(layer.with_filter(filter)), Some(handle), None)
        }
        Some(Err(e)) => (None, None, Some(e)),
        None => (None, None, None),
    };
    tracing_subscriber::registry()
        .with(logs)
        .with(export)
        .init();
    if let Some(e) = failed {
        tracing::warn!(target: BINARY_TARGET, err = %e, "OpenTelemetry trace export not started");
    }
    handle
}

/// The start-up lines about where the settings came from.
pub fn log_config(loaded: &Loaded) {
    if let Some(k) = &loaded.kubelet {
        tracing::info!(
            target: BINARY_TARGET,
            file = %k.path.display(),
            used = %k.used.join(","),
            ignored = %k.ignored.join(","),
            "kubelet configuration read; the fields reaplet does not use are ignored"
        );
        if let Some(dir) = &k.static_pod_path {
            tracing::info!(
                target: BINARY_TARGET,
                staticPodPath = %dir.display(),
                "the kubelet's static pods are the kubelet's: reaplet runs a manifest directory only when podManifestPath names one"
            );
        }
    }
    if !loaded.settings.cgroups_per_qos {
        tracing::warn!(
            target: BINARY_TARGET,
            "cgroupsPerQOS is false: read but not yet honoured; reaplet still looks for pod \
             cgroups below kubepods (the kubelet makes none)"
        );
    }
}
