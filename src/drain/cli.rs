//! `reaplet drain` and `reaplet make-room` as the operator runs them: their flags, the
//! operator's credentials and output, and the exit codes (`kubectl drain`'s `cmd/drain`
//! options and its `--kubeconfig`/`$KUBECONFIG` lookup; no kubelet counterpart).
//!
//! Invariants:
//! * every flag, the kubeconfig and the pod manifest are read and checked before anything is
//!   asked of the API server; a problem is a [`CliError::Usage`] (exit [`EXIT_USAGE`]) naming
//!   the flag;
//! * the credentials are the operator's, as kubectl finds them (`--kubeconfig`, else the first
//!   file in `$KUBECONFIG`, else `~/.kube/config`), never the node's;
//! * Ctrl-C stops issuing evictions (drain leaves the node cordoned, and says so)
//!   ([`EXIT_INTERRUPTED`], the pods still there named); any other failure exits 1, a pod the
//!   room is for that admission would refuse exits [`EXIT_USAGE`];
//! * the output is `table` (live, the default on a terminal), `plain` or `json`, on the writer
//!   given; messages are the caller's to print.

use super::DrainError;
use super::quantity::Quantity;
use super::room::RoomSpec;
use super::run::Output;
use crate::config;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Exit code for a wrong flag, kubeconfig or pod (BSD `EX_USAGE`, as every configuration error).
pub const EXIT_USAGE: i32 = 64;
/// Exit code after Ctrl-C (as a shell reports a command ended by SIGINT).
pub const EXIT_INTERRUPTED: i32 = 130;

/// The operator's side: kubectl's credentials and output.
#[derive(clap::Args)]
pub struct OperatorArgs {
    /// The node (default: this host's name).
    #[arg(long, value_name = "NAME")]
    node: Option<String>,
    /// kubeconfig (default: $KUBECONFIG, else ~/.kube/config), as kubectl.
    #[arg(long, value_name = "FILE")]
    kubeconfig: Option<PathBuf>,
    /// Print the plan only; change nothing (drain: not even the cordon).
    #[arg(long)]
    dry_run: bool,
    /// Give up after this long (e.g. 5m), exit 1 and list the pods still there.
    #[arg(long, value_name = "DURATION")]
    timeout: Option<String>,
    /// table (a live table; the default on a terminal), plain (one line per change) or json.
    #[arg(long, short = 'o', value_name = "FORMAT")]
    output: Option<String>,
}

#[derive(clap::Args)]
pub struct DrainCmd {
    #[command(flatten)]
    op: OperatorArgs,
    /// The grace period for every eviction (default: each pod's own).
    #[arg(long, value_name = "SECONDS")]
    grace_period: Option<i64>,
    /// Evict pods with emptyDir volumes (their data is lost).
    #[arg(long)]
    delete_emptydir_data: bool,
    /// Evict pods no controller manages (they are not recreated).
    #[arg(long)]
    force: bool,
}

#[derive(clap::Args)]
pub struct MakeRoomCmd {
    #[command(flatten)]
    op: OperatorArgs,
    /// A pod manifest (YAML or JSON): its requests, priorityClassName (resolved from the API,
    /// as admission does) and preemptionPolicy.
    #[arg(long, value_name = "FILE")]
    for_pod: Option<PathBuf>,
    /// CPU the pod requests (a quantity: 500m, 2); overrides the manifest's.
    #[arg(long, value_name = "QUANTITY")]
    cpu: Option<String>,
    /// Memory the pod requests (a quantity: 512Mi, 2Gi); overrides the manifest's.
    #[arg(long, value_name = "QUANTITY")]
    memory: Option<String>,
    /// Ephemeral storage the pod requests; overrides the manifest's.
    #[arg(long, value_name = "QUANTITY")]
    ephemeral_storage: Option<String>,
    /// Any other resource the pod requests, as NAME=QUANTITY (e.g. example.com/gpu=1);
    /// repeatable; overrides the manifest's.
    #[arg(long = "request", value_name = "NAME=QUANTITY")]
    extra: Vec<String>,
    /// The pod's priority: only lower priorities are evicted. Overrides the manifest's class
    /// (default: the manifest's class, else the cluster's global default class, else 0).
    #[arg(long, allow_negative_numbers = true, value_name = "P")]
    priority: Option<i32>,
}

/// Why an operator command ended without doing all it should; its message is one line for
/// stderr, [`CliError::exit_code`] the exit code.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// A flag, the kubeconfig or the pod manifest is wrong: nothing was asked or changed.
    #[error("{0}")]
    Usage(String),
    /// Ctrl-C: no further evictions (`cordoned`: drain cordoned the node, which stays so).
    #[error(
        "interrupted: no further evictions{}; still on the node: {}",
        if *.cordoned { "; the node stays cordoned" } else { "" },
        .left.join(", ")
    )]
    Interrupted { left: Vec<String>, cordoned: bool },
    #[error(transparent)]
    Drain(DrainError),
}

impl From<DrainError> for CliError {
    fn from(e: DrainError) -> Self {
        match e {
            // drain's: make-room says otherwise (`make_room_cmd`)
            DrainError::Interrupted { left } => CliError::Interrupted {
                left,
                cordoned: true,
            },
            e => CliError::Drain(e),
        }
    }
}

impl CliError {
    /// [`EXIT_USAGE`] for a wrong flag or a refused pod, [`EXIT_INTERRUPTED`] after Ctrl-C,
    /// else 1.
    pub fn exit_code(&self) -> i32 {
        match self {
            CliError::Usage(_) | CliError::Drain(DrainError::Room(_)) => EXIT_USAGE,
            CliError::Interrupted { .. } => EXIT_INTERRUPTED,
            CliError::Drain(_) => 1,
        }
    }
}

/// What both operator commands start from.
pub struct Operator {
    pub client: kube::Client,
    pub node: String,
    pub timeout: Option<Duration>,
    pub output: Output,
    /// Cancelled on Ctrl-C.
    pub cancel: CancellationToken,
}

/// The operator's API client: `--kubeconfig`, else `$KUBECONFIG`, else `~/.kube/config` (a
/// problem with any is a [`CliError::Usage`]: nothing was asked yet).
pub async fn operator_client(op: &OperatorArgs) -> Result<kube::Client, CliError> {
    let path = op
        .kubeconfig
        .clone()
        .or_else(|| {
            std::env::var_os("KUBECONFIG")
                .and_then(|v| std::env::split_paths(&v).next())
                .filter(|p| !p.as_os_str().is_empty())
        })
        .or_else(|| {
            std::env::var_os("HOME")
                .map(|h| PathBuf::from(h).join(".kube/config"))
                .filter(|p| p.exists())
        })
        .ok_or_else(|| {
            CliError::Usage(
                "no kubeconfig: give --kubeconfig, set $KUBECONFIG or write ~/.kube/config".into(),
            )
        })?;
    let cfg = crate::api::client_config(Some(&path))
        .await
        .map_err(|e| match e {
            // it names the file already
            e @ crate::api::ApiError::Kubeconfig { .. } => CliError::Usage(e.to_string()),
            e => CliError::Usage(format!("kubeconfig {}: {e}", path.display())),
        })?;
    crate::api::client::client(cfg).map_err(|e| CliError::Usage(format!("API client: {e}")))
}

/// Common set-up of the operator commands: the output, `--timeout`, the node, the client, and
/// Ctrl-C (must be called within a Tokio runtime).
pub async fn operator_setup(op: &OperatorArgs) -> Result<Operator, CliError> {
    use std::io::IsTerminal;
    let output = match op.output.as_deref() {
        None if std::io::stdout().is_terminal() => Output::Table,
        None | Some("plain") => Output::Plain,
        Some("table") => Output::Table,
        Some("json") => Output::Json,
        Some(o) => {
            return Err(CliError::Usage(format!(
                "--output {o:?}: must be table, plain or json"
            )));
        }
    };
    let timeout = op
        .timeout
        .as_deref()
        .map(config::parse_duration)
        .transpose()
        .map_err(|e| CliError::Usage(format!("--timeout: {e}")))?;
    let node = match op.node.clone() {
        Some(n) => n,
        None => crate::agent::start::host_name().unwrap_or_default(),
    };
    let client = operator_client(op).await?;
    let cancel = CancellationToken::new();
    let c = cancel.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            c.cancel();
        }
    });
    Ok(Operator {
        client,
        node,
        timeout,
        output,
        cancel,
    })
}

/// `reaplet drain`, its output to `out`.
pub async fn drain_cmd(args: DrainCmd, out: &mut dyn Write) -> Result<(), CliError> {
    let op = operator_setup(&args.op).await?;
    let a = super::run::DrainArgs {
        node: op.node,
        dry_run: args.op.dry_run,
        timeout: op.timeout,
        grace_period: args.grace_period,
        options: super::plan::Options {
            delete_emptydir_data: args.delete_emptydir_data,
            force: args.force,
        },
        output: op.output,
    };
    Ok(super::run::drain(op.client, a, op.cancel, out).await?)
}

/// What `make-room` is asked for, from its flags; `Err` names the flag.
pub fn room_spec(args: &MakeRoomCmd) -> Result<RoomSpec, String> {
    let mut spec = RoomSpec {
        priority: args.priority,
        ..Default::default()
    };
    if let Some(f) = &args.for_pod {
        let pod = std::fs::read_to_string(f)
            .map_err(|e| e.to_string())
            .and_then(|t| serde_json::from_str(&t).or_else(|_| crate::config::from_yaml(&t)))
            .map_err(|e| format!("--for-pod {}: {e}", f.display()))?;
        spec.pod = Some(pod);
    }
    let named = [
        ("cpu", &args.cpu),
        ("memory", &args.memory),
        ("ephemeral-storage", &args.ephemeral_storage),
    ];
    let mut given: Vec<(String, String, String)> = named
        .iter()
        .filter_map(|(n, v)| {
            v.as_ref()
                .map(|v| (n.to_string(), v.clone(), format!("--{n}")))
        })
        .collect();
    for e in &args.extra {
        let (n, v) = e
            .split_once('=')
            .ok_or_else(|| format!("--request {e:?}: must be NAME=QUANTITY"))?;
        given.push((n.to_string(), v.to_string(), format!("--request {n}")));
    }
    for (name, value, flag) in given {
        let q = Quantity::parse(&value).map_err(|e| format!("{flag} {value:?}: {e}"))?;
        if q.cmp_value(&Quantity::default()) == std::cmp::Ordering::Less {
            return Err(format!("{flag} {value:?}: must not be negative"));
        }
        spec.requests.insert(name, q);
    }
    Ok(spec)
}

/// `reaplet make-room`, its output to `out`: the flags are checked before the set-up.
pub async fn make_room_cmd(args: MakeRoomCmd, out: &mut dyn Write) -> Result<(), CliError> {
    let spec = room_spec(&args).map_err(CliError::Usage)?;
    let op = operator_setup(&args.op).await?;
    let a = super::run::RoomArgs {
        node: op.node,
        spec,
        dry_run: args.op.dry_run,
        timeout: op.timeout,
        output: op.output,
    };
    // make-room never cordons the node
    super::run::make_room(op.client, a, op.cancel, out)
        .await
        .map_err(|e| match e {
            DrainError::Interrupted { left } => CliError::Interrupted {
                left,
                cordoned: false,
            },
            e => e.into(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_unreadable_kubeconfig_is_named_once() {
        let op = OperatorArgs {
            node: None,
            kubeconfig: Some(PathBuf::from("/nonexistent/kubeconfig")),
            dry_run: false,
            timeout: None,
            output: None,
        };
        let e = operator_client(&op)
            .await
            .err()
            .expect("no such kubeconfig")
            .to_string();
        // (kube's own message names the file once more, in its words)
        assert_eq!(
            e.matches("kubeconfig /nonexistent/kubeconfig:").count(),
            1,
            "{e}"
        );
        assert!(e.starts_with("kubeconfig /nonexistent/kubeconfig: "), "{e}");
    }

    #[test]
    fn only_drains_interruption_says_the_node_stays_cordoned() {
        let left = vec!["default/a".to_owned()];
        let drain = CliError::Interrupted {
            left: left.clone(),
            cordoned: true,
        };
        let room = CliError::Interrupted {
            left,
            cordoned: false,
        };
        assert_eq!(
            drain.to_string(),
            "interrupted: no further evictions; the node stays cordoned; still on the node: default/a"
        );
        assert_eq!(
            room.to_string(),
            "interrupted: no further evictions; still on the node: default/a"
        );
        assert_eq!(room.exit_code(), EXIT_INTERRUPTED);
    }
}
