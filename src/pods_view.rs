//! `reaplet pods`: what a running agent sees, from its local status endpoint's `/pods` (no
//! kubelet counterpart; the nearest are the kubelet's read-only `/pods` and `kubectl get pods
//! --field-selector spec.nodeName=...`, which show the API's view, not the agent's).
//!
//! Invariants:
//! * it reads the agent's endpoint only: no API server, no runtime, nothing changed;
//! * the endpoint is found as `reaplet run` binds it (`--address`, else the config file's
//!   `metricsBindAddress`, else the default), so the same `--config` finds the same agent;
//! * [`render`] is pure: any JSON gives a table, missing fields show as `-` or empty;
//! * `--timeline POD` shows one termination instead (`/pods/timeline`), as text or JSON, and
//!   `--svg FILE` writes its chart ([`crate::timeline`]); a pod the agent keeps no timeline
//!   for is the agent's own message and exit 1.

use crate::config::{self, ConfigError, RawSettings};
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct PodsArgs {
    /// The config file `reaplet run` uses: its metricsBindAddress is the agent's endpoint.
    #[arg(long, env = "REAPLET_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,
    /// The kubelet's config file, as for `reaplet run`.
    #[arg(long, env = "REAPLET_KUBELET_CONFIG", value_name = "FILE")]
    kubelet_config: Option<String>,
    /// The agent's status endpoint (default: from the config, else 127.0.0.1:10266).
    #[arg(
        long,
        alias = "metrics-bind-address",
        env = "REAPLET_METRICS_BIND_ADDRESS",
        value_name = "ADDR"
    )]
    address: Option<String>,
    /// Show one pod's termination timeline instead: NAMESPACE/NAME or the pod's UID (a pod
    /// still terminating, or one of the last finished ones the agent keeps).
    #[arg(long, value_name = "NAMESPACE/NAME|UID")]
    pub timeline: Option<String>,
    /// How to print the timeline: text (aligned, with durations) or json (the same data).
    #[arg(
        long,
        short = 'o',
        value_enum,
        default_value = "text",
        requires = "timeline",
        value_name = "FORMAT"
    )]
    pub output: TimelineOutput,
    /// Also write the timeline as a self-contained SVG chart to FILE (opens in a browser).
    #[arg(long, value_name = "FILE", requires = "timeline")]
    pub svg: Option<PathBuf>,
}

/// How `reaplet pods --timeline` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum TimelineOutput {
    #[default]
    Text,
    Json,
}

/// Why the agent's view could not be shown.
#[derive(Debug, thiserror::Error)]
pub enum PodsError {
    #[error("no agent answering on {address} (is reaplet running?)")]
    NoAgent {
        address: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("{address}: HTTP {code}")]
    Http { address: SocketAddr, code: u16 },
    #[error("reading the agent's answer")]
    Answer(#[source] serde_json::Error),
    #[error("{0}")]
    NoTimeline(String),
    #[error("writing the chart to {path}")]
    Svg {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The agent's status endpoint: `--address`, else the config's metricsBindAddress (an
/// unspecified address, as in 0.0.0.0:10266, is reached on loopback).
pub fn agent_address(args: &PodsArgs) -> Result<SocketAddr, ConfigError> {
    let raw = RawSettings {
        metrics_bind_address: args.address.clone(),
        kubelet_config: args.kubelet_config.clone(),
        ..RawSettings::default()
    };
    let loaded = config::load(raw, args.config.as_deref())?;
    let mut addr = loaded.settings.metrics_bind_address;
    if addr.ip().is_unspecified() {
        addr.set_ip(match addr {
            SocketAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
            SocketAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
        });
    }
    Ok(addr)
}

/// Asks the agent at `address` for its pods: the answer, as JSON.
pub async fn fetch(address: SocketAddr) -> Result<serde_json::Value, PodsError> {
    let (code, body) = crate::server::fetch(address, "/pods")
        .await
        .map_err(|source| PodsError::NoAgent { address, source })?;
    if code != 200 {
        return Err(PodsError::Http { address, code });
    }
    serde_json::from_str(&body).map_err(PodsError::Answer)
}

/// `s` as a URL query value: everything but unreserved characters percent-encoded.
fn query_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// `reaplet pods --timeline POD`: the timeline the agent at `address` keeps for `pod`, as
/// text or JSON; with `--svg`, the chart written to its file first.
pub async fn timeline(address: SocketAddr, args: &PodsArgs) -> Result<String, PodsError> {
    let pod = args.timeline.as_deref().unwrap_or_default();
    let path = format!("/pods/timeline?pod={}", query_escape(pod));
    let (code, body) = crate::server::fetch(address, &path)
        .await
        .map_err(|source| PodsError::NoAgent { address, source })?;
    if code != 200 {
        // the agent's reason when it gives one (an older agent answers 404 in plain text)
        let why = serde_json::from_str::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["error"].as_str().map(str::to_owned));
        return match why {
            Some(why) => Err(PodsError::NoTimeline(why)),
            None => Err(PodsError::Http { address, code }),
        };
    }
    let v: serde_json::Value = serde_json::from_str(&body).map_err(PodsError::Answer)?;
    let t = crate::timeline::Timeline::from_json(v.clone()).map_err(PodsError::Answer)?;
    if let Some(path) = &args.svg {
        std::fs::write(path, crate::timeline::svg::render(&t)).map_err(|source| {
            PodsError::Svg {
                path: path.clone(),
                source,
            }
        })?;
    }
    Ok(match args.output {
        TimelineOutput::Json => format!("{v:#}\n"),
        TimelineOutput::Text => {
            let mut text = crate::timeline::text::render(&t);
            if let Some(path) = &args.svg {
                let _ = writeln!(text, "\nchart written to {}", path.display());
            }
            text
        }
    })
}

/// The table of the agent's pods, then its authority and its pending evictions (if any).
pub fn render(v: &serde_json::Value) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<40} {:<12} {:>6} {:>9} {:<8} {:<24} STEP",
        "POD", "STATE", "GRACE", "DEADLINE", "SOURCE", "REASONS"
    );
    for p in v["pods"].as_array().into_iter().flatten() {
        let deadline = p["deadlineInSeconds"]
            .as_f64()
            .map_or("-".to_string(), |d| format!("{d:.1}s"));
        let grace = p["gracePeriod"]
            .as_i64()
            .map_or("-".to_string(), |g| format!("{g}s"));
        let reasons: Vec<&str> = p["reasons"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| r.as_str())
            .collect();
        let reasons = if reasons.is_empty() {
            "-".to_string()
        } else {
            reasons.join(",")
        };
        let _ = writeln!(
            out,
            "{:<40} {:<12} {:>6} {:>9} {:<8} {:<24} {}",
            p["pod"].as_str().unwrap_or(""),
            p["state"].as_str().unwrap_or(""),
            grace,
            deadline,
            p["source"].as_str().unwrap_or(""),
            reasons,
            p["step"].as_str().unwrap_or("")
        );
    }
    let a = &v["authority"];
    if let (Some(mode), Some(role), Some(why)) =
        (a["mode"].as_str(), a["role"].as_str(), a["why"].as_str())
    {
        let _ = writeln!(out, "\nauthority: {mode}, {role}: {why}");
    }
    let evictions = v["evictions"].as_array().cloned().unwrap_or_default();
    if !evictions.is_empty() {
        let _ = writeln!(
            out,
            "\n{:<40} {:<14} {:<9} {:>8} DETAIL",
            "PENDING EVICTION", "SOURCE", "STATE", "IN"
        );
        for e in &evictions {
            let _ = writeln!(
                out,
                "{:<40} {:<14} {:<9} {:>8} {}",
                e["pod"].as_str().unwrap_or(""),
                e["source"].as_str().unwrap_or(""),
                e["state"].as_str().unwrap_or(""),
                e["inSeconds"]
                    .as_f64()
                    .map_or("-".to_string(), |d| format!("{d:.1}s")),
                e["detail"].as_str().unwrap_or("")
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{query_escape, render};

    #[test]
    fn a_pod_is_escaped_for_the_query() {
        assert_eq!(query_escape("default/web-0"), "default%2Fweb-0");
        assert_eq!(query_escape("a b&c=é"), "a%20b%26c%3D%C3%A9");
    }
    use serde_json::json;

    #[test]
    fn render_shows_pods_authority_and_pending_evictions() {
        let v = json!({
            "pods": [
                {"pod": "default/web", "state": "terminating", "gracePeriod": 30,
                 "deadlineInSeconds": 12.34, "source": "api", "reasons": ["deleted", "evicted"],
                 "step": "stop containers"},
                {"pod": "default/idle", "state": "running", "source": "file"}
            ],
            "authority": {"mode": "auto", "role": "primary", "why": "no kubelet"},
            "evictions": [
                {"pod": "default/db", "source": "taint", "state": "waiting", "inSeconds": 5.0,
                 "detail": "NoExecute"}
            ]
        });
        let text = render(&v);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("POD "), "{text}");
        assert!(lines[0].ends_with(" STEP"), "{text}");
        let words = |l: &str| l.split_whitespace().collect::<Vec<_>>().join(" ");
        assert_eq!(
            words(lines[1]),
            "default/web terminating 30s 12.3s api deleted,evicted stop containers"
        );
        assert_eq!(words(lines[2]), "default/idle running - - file -");
        let authority = "\nauthority: auto, primary: no kubelet\n";
        assert!(text.contains(authority), "{text}");
        assert!(text.contains("\nPENDING EVICTION"), "{text}");
        assert!(text.ends_with("NoExecute\n"), "{text}");
        // an empty answer is the header alone
        assert_eq!(render(&json!({})).lines().count(), 1);
    }
}
