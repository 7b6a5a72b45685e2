//! reaplet's binary: parses argv (clap reads the `REAPLET_*` environment variables with it)
//! and runs the command the library implements: [`reaplet::config::flags`] (`run`, `check`),
//! [`reaplet::agent::start`], [`reaplet::check`], [`reaplet::pods_view`],
//! [`reaplet::drain::cli`]. The only place that
//! reads argv or exits, and the only user of anyhow.
//!
//! Invariants (the kubelet's `cmd/kubelet/app` counterpart):
//! * every configuration problem (a bad flag, a bad value, an unreadable or invalid config file
//!   or kubeconfig) is found before anything starts and exits [`EXIT_CONFIG`] with one line
//!   naming the field and why; `--help` and `--version` exit 0;
//! * credentials the API server keeps refusing exit [`EXIT_CREDENTIALS`]; any other failure
//!   exits 1 (the operator commands: [`reaplet::drain::cli::CliError::exit_code`]);
//! * a closed or broken stdout or stderr (EPIPE) never panics: command output ends quietly
//!   ([`emit`]), messages and logs to stderr are dropped, so SIGTERM is always honoured.

use anyhow::{Context, Result};
use reaplet::agent::start::{self, RunError};
use reaplet::cli::{Cli, Command};
use reaplet::config::ConfigError;
use reaplet::drain::cli::{self, CliError};
use reaplet::logs::log_config;
use reaplet::pods_view;
use std::io::Write as _;
use tokio_util::sync::CancellationToken;

/// Exit code for an invalid configuration (BSD `EX_USAGE`); the unit's
/// `RestartPreventExitStatus=64` keeps systemd from restarting a broken configuration.
const EXIT_CONFIG: i32 = 64;
/// Exit code when the API server no longer accepts reaplet's credentials (BSD `EX_TEMPFAIL`):
/// systemd restarts it, and the restart reads the (rotated) credentials again.
const EXIT_CREDENTIALS: i32 = 75;
// the operator commands' usage errors are configuration errors too
const _: () = assert!(EXIT_CONFIG == cli::EXIT_USAGE);

/// One line to stderr; a closed or broken stderr is ignored, never a panic (`eprintln!`
/// panics on EPIPE).
fn say(msg: impl std::fmt::Display) {
    let _ = writeln!(std::io::stderr().lock(), "reaplet: {msg}");
}

/// Exits 64 with one line (a multi-line cause, such as a YAML parser's source snippet, is cut
/// to its first line).
fn exit_config(e: ConfigError) -> ! {
    let text = e.to_string();
    say(text.lines().next().unwrap_or_default().trim_end());
    std::process::exit(EXIT_CONFIG)
}

/// Writes a command's output to stdout; a reader that went away (EPIPE, as under
/// `reaplet pods | head -1`) ends the output quietly.
fn emit(text: &str) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => r,
    }
}

/// argv parsed; a usage error exits 64 with one line (clap's own exit code is 2).
fn parse_args() -> Cli {
    use clap::error::ErrorKind;
    let e = match reaplet::cli::parse_from(std::env::args_os()) {
        Ok(cli) => return cli,
        Err(e) => e,
    };
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            let _ = e.print();
            std::process::exit(0)
        }
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            // the commands as the definition has them
            let names: Vec<String> = reaplet::cli::command()
                .get_subcommands()
                .filter(|c| !c.is_hide_set())
                .map(|c| c.get_name().to_owned())
                .collect();
            exit_config(ConfigError {
                field: "command",
                why: format!("missing: one of {} (reaplet --help)", names.join(", ")),
            })
        }
        _ => {
            // clap's message up to its usage block, on one line
            let text = e.to_string();
            let why: Vec<&str> = text
                .lines()
                .take_while(|l| !l.starts_with("Usage:"))
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with("For more information"))
                .collect();
            let why = why.join("; ");
            say(format!(
                "invalid configuration: {} (reaplet --help)",
                why.strip_prefix("error: ").unwrap_or(&why)
            ));
            std::process::exit(EXIT_CONFIG)
        }
    }
}

fn main() {
    cap_malloc_arenas();
    let cli = parse_args();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            say(format!("starting the async runtime: {e}"));
            std::process::exit(1);
        }
    };
    match rt.block_on(dispatch(cli.command)) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            say(format!("{e:#}"));
            let rejected = e
                .downcast_ref::<RunError>()
                .is_some_and(RunError::credentials_rejected);
            std::process::exit(if rejected { EXIT_CREDENTIALS } else { 1 });
        }
    }
}

/// glibc's malloc gives each thread that allocates under contention an arena of its own, up
/// to eight per core, and keeps what each arena once held: a burst of terminations, spread over
/// the async runtime's workers and the blocking pool's threads, leaves memory resident in a dozen
/// arenas (measured side by side with the kubelet, BENCHMARKS.md runs B and E: heap + anonymous
/// at a 110-pod burst's end 8.2-9.4 MiB with two arenas, 10.1-11.5 MiB without). Two arenas
/// serve reaplet's two workers (the limit an operator sets with
/// `MALLOC_ARENA_MAX` or `GLIBC_TUNABLES` is kept: glibc has read it already).
fn cap_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none()
        && std::env::var_os("GLIBC_TUNABLES").is_none()
    {
        // SAFETY: `mallopt` sets one of malloc's parameters and touches no memory of ours; it
        // is called first thing in `main`, before the async runtime or any other thread exists,
        // so no allocation runs beside it; `M_ARENA_MAX` with a positive value is documented
        // (mallopt(3)). Its answer (1 on success) changes nothing: without the cap reaplet
        // works as before.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 2);
        }
    }
}

/// Runs the command; `Ok` is the exit code, `Err` is said and exits 1 (or
/// [`EXIT_CREDENTIALS`]).
async fn dispatch(command: Command) -> Result<i32> {
    match command {
        Command::Version => {
            let hooks = cfg!(feature = "test-hooks").then_some(" (test-hooks: not for production)");
            let v = format!(
                "reaplet {}{}\n",
                env!("CARGO_PKG_VERSION"),
                hooks.unwrap_or("")
            );
            emit(&v).context("writing the output")?;
            Ok(0)
        }
        Command::Run(flags) => {
            // the stop signals first: SIGTERM during start-up is a clean stop, never the
            // signal's default action
            let cancel = CancellationToken::new();
            let stop = stop_on_signals(cancel.clone());
            let (loaded, kube) = flags.load().await.unwrap_or_else(|e| exit_config(e));
            // the metrics first: the trace export counts its dropped spans in them
            let metrics = std::sync::Arc::new(reaplet::metrics::Metrics::new());
            let s = &loaded.settings;
            let export = s.tracing.as_ref().map(|t| {
                let drops = reaplet::otel::SpanDrops::from_metrics(&metrics);
                (t, drops, start::node_name(s).ok())
            });
            let traces = reaplet::logs::init(s.log_format, export);
            log_config(&loaded);
            match stop {
                Ok(task) => drop(tokio::spawn(task)),
                Err(e) => tracing::error!(err = %e, "cannot listen for SIGTERM"),
            }
            let r = start::run(loaded.settings, kube, metrics, cancel).await;
            // what is queued goes out (bounded: a stop is never held more than 2 s by it)
            if let Some(t) = traces {
                t.shutdown().await;
            }
            r?;
            Ok(0)
        }
        Command::Check(flags) => {
            let (loaded, kube) = flags.load().await.unwrap_or_else(|e| exit_config(e));
            let (text, code) = reaplet::check::command(&loaded, kube).await?;
            emit(&text).context("writing the output")?;
            Ok(code)
        }
        Command::Pods(args) => {
            let address = pods_view::agent_address(&args).unwrap_or_else(|e| exit_config(e));
            let text = if args.timeline.is_some() {
                pods_view::timeline(address, &args).await?
            } else {
                pods_view::render(&pods_view::fetch(address).await?)
            };
            emit(&text).context("writing the output")?;
            Ok(0)
        }
        Command::Drain(args) => Ok(operator_exit(
            cli::drain_cmd(args, &mut std::io::stdout()).await,
        )),
        Command::MakeRoom(args) => Ok(operator_exit(
            cli::make_room_cmd(args, &mut std::io::stdout()).await,
        )),
    }
}

/// An operator command's exit code, after saying why it failed.
fn operator_exit(r: Result<(), CliError>) -> i32 {
    match r {
        Ok(()) => 0,
        Err(e) => {
            say(&e);
            e.exit_code()
        }
    }
}

/// Registers SIGTERM and SIGINT at once; the returned task cancels `cancel` on the first.
fn stop_on_signals(
    cancel: CancellationToken,
) -> std::io::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!(signal = "SIGTERM", "stop requested"),
            _ = int.recv() => tracing::info!(signal = "SIGINT", "stop requested"),
        }
        cancel.cancel();
    })
}
