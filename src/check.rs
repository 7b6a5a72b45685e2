//! `reaplet check`: a preflight of everything reaplet needs on this node (no kubelet
//! counterpart; the kubelet fails at start-up instead). Each line passes, warns or fails; any
//! failure makes the command exit non-zero.
//!
//! Invariants:
//! * it reads and asks, never changes anything (no cgroup, pod, lock or file is touched);
//! * the output is one table ([`render`]): a `CHECK` column, `PASS`/`WARN`/`FAIL`, a detail;
//!   the exit code is 1 when a line fails, else 0 (warnings included);
//! * the API permissions reviewed are exactly those the configured modes use (`check/access.rs`);
//! * the node's name is shown with where it came from, and fails when no kubelet is
//!   registered under it: no Node, or a Node with no Lease (`check/node.rs`).

use crate::agent::detect_cgroup_driver;
use crate::agent::start::{HostNameError, node_identity};
use crate::cgroups::{self, CgroupMode};
use crate::config::identity::NameFrom;
use crate::config::{KubeletSummary, Loaded, Settings};
use crate::cri::{CriClient, CriConfig, CriError, EventSource, Runtime};
use std::path::Path;

mod access;
mod node;
pub use access::{Need, Target, needed};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Pass,
    Warn,
    Fail,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Pass => "PASS",
            Outcome::Warn => "WARN",
            Outcome::Fail => "FAIL",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Line {
    pub check: &'static str,
    pub outcome: Outcome,
    pub detail: String,
}

fn line(check: &'static str, outcome: Outcome, detail: impl Into<String>) -> Line {
    Line {
        check,
        outcome,
        detail: detail.into(),
    }
}

/// Where the host's facts are read (production: the real paths; tests: fixtures).
pub struct HostPaths<'a> {
    pub mountinfo: &'a Path,
    /// procfs (`/proc`): this process's mount namespace and capabilities.
    pub proc: &'a Path,
    /// `/run/systemd/system`: present when systemd is init.
    pub systemd_run: &'a Path,
    /// The system D-Bus socket logind is reached through.
    pub dbus_socket: &'a Path,
}

impl Default for HostPaths<'static> {
    fn default() -> Self {
        HostPaths {
            mountinfo: Path::new("/proc/self/mountinfo"),
            proc: Path::new("/proc"),
            systemd_run: Path::new("/run/systemd/system"),
            dbus_socket: Path::new("/run/dbus/system_bus_socket"),
        }
    }
}

/// `reaplet check` for this host: the table and the exit code. `kube`: the API client
/// configuration `reaplet run` would use.
pub async fn command(
    loaded: &Loaded,
    kube: Option<kube::Config>,
) -> Result<(String, i32), HostNameError> {
    let s = &loaded.settings;
    let (node, from) = node_identity(s)?;
    let lines = run(s, (&node, from), Ok(kube), &HostPaths::default()).await;
    Ok(render(loaded.kubelet.as_ref(), &lines))
}

/// The table (a line for the kubelet's file first, when one was read) and the exit code: 1
/// when a line fails, else 0.
pub fn render(kubelet: Option<&KubeletSummary>, lines: &[Line]) -> (String, i32) {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(out, "{:<17} {:<5} DETAIL", "CHECK", "");
    if let Some(k) = kubelet {
        let (path, used, n) = (k.path.display(), k.used.join(", "), k.ignored.len());
        let detail = format!("{path}: uses [{used}]; ignores {n} other fields");
        let _ = writeln!(out, "{:<17} {:<5} {detail}", "kubelet config", "PASS");
    }
    let mut failed = false;
    for l in lines {
        failed |= l.outcome == Outcome::Fail;
        let _ = writeln!(
            out,
            "{:<17} {:<5} {}",
            l.check,
            l.outcome.as_str(),
            l.detail
        );
    }
    (out, if failed { 1 } else { 0 })
}

/// Runs every check. `node`: the node's name and where it came from; `kube`: the API client
/// configuration, if any could be built (its error otherwise).
pub async fn run(
    settings: &Settings,
    (node, from): (&str, NameFrom),
    kube: Result<Option<kube::Config>, String>,
    host: &HostPaths<'_>,
) -> Vec<Line> {
    let mut out = Vec::new();
    // runtime
    let client = CriClient::new(&CriConfig {
        endpoint: settings.container_runtime_endpoint.clone(),
        request_timeout: std::time::Duration::from_secs(5),
    });
    let runtime_up = match &client {
        Err(e) => {
            out.push(line("runtime", Outcome::Fail, e.to_string()));
            None
        }
        Ok(c) => match c.version().await {
            Ok(v) => {
                out.push(line(
                    "runtime",
                    Outcome::Pass,
                    format!(
                        "{} reachable: {} {} (CRI {})",
                        settings.container_runtime_endpoint,
                        v.runtime_name,
                        v.runtime_version,
                        v.runtime_api_version
                    ),
                ));
                Some(c.clone())
            }
            Err(e) => {
                out.push(line(
                    "runtime",
                    Outcome::Fail,
                    format!("{}: {e}", settings.container_runtime_endpoint),
                ));
                None
            }
        },
    };
    if let Some(c) = &runtime_up {
        match c.container_events().await {
            Ok(sub) => out.push(line(
                "container events",
                Outcome::Pass,
                match sub.source {
                    EventSource::Cri => "from CRI GetContainerEvents",
                    EventSource::ContainerdEvents => {
                        "from containerd's events service (CRI GetContainerEvents not supported)"
                    }
                },
            )),
            Err(CriError::Unimplemented { .. }) => out.push(line(
                "container events",
                Outcome::Pass,
                format!(
                    "not supported (neither CRI GetContainerEvents nor containerd's events \
                     service): runtime state is polled every {:?}",
                    settings.relist_period
                ),
            )),
            Err(e) => out.push(line("container events", Outcome::Fail, e.to_string())),
        }
    }
    out.push(
        match crate::volumes::teardown::can_tear_down(
            host.proc,
            host.systemd_run.is_dir(),
            &settings.root_dir,
            crate::self_pod::detect().is_some(),
        ) {
            Ok(()) => line(
                "volume teardown",
                Outcome::Pass,
                "unmounts reach the host's mounts (its namespace, or the root dir shared with it) \
                 and CAP_SYS_ADMIN: node-local volumes of terminated pods are unmounted while \
                 active",
            ),
            Err(why) => line(
                "volume teardown",
                Outcome::Warn,
                format!("{why}; node-local volumes of terminated pods are only waited for"),
            ),
        },
    );
    // cgroups
    let hierarchies = std::fs::read_to_string(host.mountinfo)
        .map(|t| cgroups::hierarchies(&crate::volumes::parse_mountinfo(&t)))
        .unwrap_or_default();
    let mode = cgroups::mode(&hierarchies);
    let mode_text = match mode {
        CgroupMode::V1 => "v1",
        CgroupMode::V2 => "v2",
        CgroupMode::Hybrid => "hybrid (v1 and v2)",
        CgroupMode::None => "none mounted",
    };
    let (driver, how) = match (settings.cgroup_driver, &runtime_up) {
        (Some(d), _) => (d, "configured"),
        (None, Some(c)) => detect_cgroup_driver(c, &hierarchies, host.systemd_run.is_dir()).await,
        (None, None) => (
            crate::cgroups::CgroupDriver::Cgroupfs,
            "default (runtime unreachable)",
        ),
    };
    out.push(line(
        "cgroups",
        if mode == CgroupMode::None {
            Outcome::Fail
        } else {
            Outcome::Pass
        },
        format!(
            "{mode_text}, {} hierarchies; driver {driver:?} ({how})",
            hierarchies.len()
        )
        .to_lowercase(),
    ));
    // root dir
    let probe = settings
        .root_dir
        .join(format!(".reaplet-check-{}", std::process::id()));
    match std::fs::metadata(&settings.root_dir) {
        Ok(m) if m.is_dir() => match std::fs::write(&probe, b"") {
            Ok(()) => {
                let _ = std::fs::remove_file(&probe);
                out.push(line(
                    "root dir",
                    Outcome::Pass,
                    format!("{} present and writable", settings.root_dir.display()),
                ));
            }
            Err(e) => out.push(line(
                "root dir",
                Outcome::Fail,
                format!("{} not writable: {e}", settings.root_dir.display()),
            )),
        },
        Ok(_) => out.push(line(
            "root dir",
            Outcome::Fail,
            format!("{} is not a directory", settings.root_dir.display()),
        )),
        Err(e) => out.push(line(
            "root dir",
            Outcome::Fail,
            format!("{}: {e}", settings.root_dir.display()),
        )),
    }
    if let Some(dir) = &settings.pod_manifest_path {
        if dir.is_dir() {
            out.push(line(
                "manifests",
                Outcome::Pass,
                format!("{} present", dir.display()),
            ));
        } else {
            out.push(line(
                "manifests",
                Outcome::Fail,
                format!("{} is not a directory", dir.display()),
            ));
        }
    }
    // API
    match kube {
        Err(e) => out.push(line("kubeconfig", Outcome::Fail, e)),
        Ok(None) if settings.pod_manifest_path.is_some() => {
            out.push(line(
                "kubeconfig",
                Outcome::Pass,
                "none: static manifests only",
            ));
            out.push(node::judge(settings, node, from, None));
            out.push(authority_check(settings, node, None).await);
        }
        Ok(None) => out.push(line(
            "kubeconfig",
            Outcome::Fail,
            "no kubeconfig, no in-cluster config, no --pod-manifest-path",
        )),
        Ok(Some(cfg)) => {
            let client = crate::api::client::client(cfg.clone()).ok();
            out.push(access::check(cfg, node, &needed(settings)).await);
            let registration = match &client {
                Some(c) => Some(node::registration(c, node).await),
                None => None,
            };
            out.push(node::judge(settings, node, from, registration.as_ref()));
            out.push(authority_check(settings, node, client).await);
        }
    }
    // logind and graceful node shutdown
    out.push(shutdown_check(settings, host).await);
    out
}

/// Graceful node shutdown: off, or what logind allows against what the groups need.
async fn shutdown_check(settings: &Settings, host: &HostPaths<'_>) -> Line {
    use crate::shutdown::{self, ShutdownConfig, logind::Logind};
    const NAME: &str = "node shutdown";
    let cfg = ShutdownConfig::new(settings.shutdown.clone());
    let groups = shutdown::groups(&cfg.settings);
    if groups.is_empty() {
        return line(
            NAME,
            Outcome::Pass,
            "off (no shutdownGracePeriod or shutdownGracePeriodByPodPriority): no logind inhibitor is taken",
        );
    }
    let plan: Vec<String> = groups
        .iter()
        .map(|g| format!("{}+: {}s", g.priority, g.grace.as_secs()))
        .collect();
    let plan = format!("groups [{}]", plan.join(", "));
    if !host.systemd_run.is_dir() {
        return line(
            NAME,
            Outcome::Warn,
            format!(
                "{plan}; systemd is not init here: no logind, pods will not be ended on a shutdown"
            ),
        );
    }
    let logind = match Logind::connect(host.dbus_socket).await {
        Ok(l) => l,
        Err(e) => {
            return line(
                NAME,
                Outcome::Warn,
                format!("{plan}; logind unreachable: {e}"),
            );
        }
    };
    let needed = cfg.delay_needed();
    let current = match logind.inhibit_delay_max().await {
        Ok(d) => d,
        Err(e) => return line(NAME, Outcome::Warn, format!("{plan}; logind: {e}")),
    };
    // a refusal shows only when asked: one lock, released at once
    if let Err(e) = logind.inhibit().await {
        return line(
            NAME,
            Outcome::Warn,
            format!("{plan}; logind refuses a delay inhibitor: {e}"),
        );
    }
    let others: Vec<String> = logind
        .inhibitors()
        .await
        .unwrap_or_default()
        .into_iter()
        .filter(|i| i.mode == "delay" && i.what.split(':').any(|w| w == "shutdown"))
        .map(|i| format!("{} (pid {})", i.who, i.pid))
        .collect();
    let holders = if others.is_empty() {
        "no delay inhibitor held now".to_string()
    } else {
        format!("delay inhibitors held by {}", others.join(", "))
    };
    if current >= needed {
        line(
            NAME,
            Outcome::Pass,
            format!(
                "{plan}; logind waits up to {}s, {}s needed; {holders}",
                current.as_secs(),
                needed.as_secs()
            ),
        )
    } else {
        line(
            NAME,
            Outcome::Warn,
            format!(
                "{plan}; logind waits up to {}s, {}s needed: reaplet writes {} and reloads logind before it first holds the lock (while active); {holders}",
                current.as_secs(),
                needed.as_secs(),
                cfg.drop_in_dir
                    .join(shutdown::logind::DROP_IN_FILE)
                    .display()
            ),
        )
    }
}

/// The mode `reaplet run` would start in, and why; in standby, what the kubelet's two signals
/// say now (see [`crate::standby`]).
async fn authority_check(settings: &Settings, node: &str, client: Option<kube::Client>) -> Line {
    use crate::standby::{self, Health, Mode, StandbyConfig};
    let cfg = StandbyConfig {
        setting: settings.authority,
        healthz_url: settings.kubelet_healthz_url.clone(),
        takeover_after: settings.takeover_after,
        // read, never written here: what `run` would resume as
        marker: Some(standby::marker::path_in(&settings.root_dir)),
        ..StandbyConfig::new(node)
    };
    let d = standby::start(
        &cfg,
        client.as_ref(),
        &crate::authority::Authority::default(),
    )
    .await;
    let mode = d.mode.as_str();
    let detail = format!(
        "--authority={}: {mode}, {} ({})",
        settings.authority.as_str(),
        d.role.as_str(),
        d.reason.as_str()
    );
    if d.mode == Mode::Primary {
        return line("authority", Outcome::Pass, detail);
    }
    // the kubelet serves no health endpoint (healthzPort 0): nothing to fail
    let Some(url) = &cfg.healthz_url else {
        let why = "kubelet healthz disabled (healthzPort 0): the Lease alone decides";
        return line("authority", Outcome::Pass, format!("{detail}; {why}"));
    };
    let health = standby::probe(url, cfg.probe_timeout).await;
    let outcome = if health == Health::Ok {
        Outcome::Pass
    } else {
        Outcome::Warn
    };
    line(
        "authority",
        outcome,
        format!("{detail}; kubelet healthz {url}: {}", health.as_str()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_lines_up_the_table_and_fails_on_a_fail() {
        let k = KubeletSummary {
            path: "/var/lib/kubelet/config.yaml".into(),
            used: vec!["cgroupDriver", "staticPodPath"],
            ignored: vec!["a".into(), "b".into()],
            static_pod_path: None,
        };
        let lines = [
            line("runtime", Outcome::Pass, "containerd 2.0"),
            line("logind", Outcome::Warn, "absent"),
        ];
        let (text, code) = render(Some(&k), &lines);
        assert_eq!(
            text,
            "CHECK                   DETAIL\n\
             kubelet config    PASS  /var/lib/kubelet/config.yaml: uses [cgroupDriver, \
             staticPodPath]; ignores 2 other fields\n\
             runtime           PASS  containerd 2.0\n\
             logind            WARN  absent\n"
        );
        assert_eq!(code, 0, "a warning is not a failure");
        let (_, code) = render(None, &[line("cgroups", Outcome::Fail, "no")]);
        assert_eq!(code, 1);
    }
}
