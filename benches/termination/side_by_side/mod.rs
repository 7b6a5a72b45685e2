//! `kubelet`: the same workloads ended once by the real kubelet v1.36 and once by reaplet, in
//! one run, on the real stack: etcd and kube-apiserver v1.36 (`tests/common/kube/`), the test
//! bed's private containerd and the real kubelet, which creates and runs every pod. In the
//! kubelet's run the kubelet is running and reaplet is not; in reaplet's run the kubelet is
//! stopped (SIGTERM, its pods keep running) and reaplet runs with `--authority primary`, the
//! takeover. Every pod: host network, busybox, one container `app`, grace 30, created by the
//! admin with `spec.nodeName`.
//!
//! The times are the API server's own, from its audit log (one record per request:
//! `requestReceivedTimestamp` when it arrived, `stageTimestamp` when it was answered, so
//! stored), and the runtime's (`finished_at` of a container); the agents are told apart by
//! their User-Agent (`kubelet/…`, `reaplet/…`: both authenticate as `system:node:<node>`).
//! Each scenario gets a fresh test bed, cluster and kubelet. The logs (audit, kubelet,
//! reaplet, controller manager) are kept in `target/tmp/bench-kubelet-<scenario>-*.log`.
//!
//! The files: `stack.rs` the node under test (a Stack) and the takeover, `audit.rs` the audit log
//! read as it grows, `pods.rs` the pod scenarios (one pod, a burst, natural exit), `taint.rs` the
//! NoExecute taint, `taint4.rs` the same on a node of four pods, `outage.rs` the API server outage,
//! `pressure.rs` node-pressure eviction against the OOM killer, `footprint.rs` where an agent's
//! memory is, its wakeups, a perf profile of a window, and standby beside the live kubelet;
//! here the entry, the pods they create and the closing table.

#[path = "../../../tests/common/kube/mod.rs"]
#[allow(dead_code, unused_imports)]
pub(crate) mod k8s;
#[path = "../../../tests/common/port.rs"]
mod port;

mod audit;
mod footprint;
#[path = "../../common/json_tail.rs"]
mod json_tail;
mod outage;
mod pods;
mod pressure;
mod stack;
mod taint;
mod taint4;

use super::*;
use serde_json::{Value, json};

/// The admin's user name in the cluster's PKI.
const ADMIN: &str = "admin";

/// The agent of a run, and of an audit record (told apart by its User-Agent).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Who {
    Kubelet,
    Reaplet,
}

impl Who {
    /// Its User-Agent's prefix.
    fn ua(self) -> &'static str {
        match self {
            Who::Kubelet => "kubelet/",
            Who::Reaplet => "reaplet/",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Who::Kubelet => "kubelet",
            Who::Reaplet => "reaplet",
        }
    }
}

/// A pod of one container `app` running `script`, bound to the node, on the host network.
fn pod(name: &str, script: &str) -> Value {
    reaplet_testbed::host_network_pod(NODE, name, 30, script)
}

fn names(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

fn ms_ns(ns: i64) -> f64 {
    ns as f64 / 1e6
}

/// A figure of both agents, for the closing table.
struct Row {
    figure: String,
    unit: &'static str,
    kubelet: f64,
    reaplet: f64,
}

fn row(figure: impl Into<String>, unit: &'static str, kubelet: f64, reaplet: f64) -> Row {
    Row {
        figure: figure.into(),
        unit,
        kubelet,
        reaplet,
    }
}

/// Percentile `p` of both agents' sorted samples, `v`: `[kubelet, reaplet]`.
fn pct_row(figure: impl Into<String>, unit: &'static str, v: &[Vec<f64>], p: f64) -> Row {
    row(figure, unit, pct(&v[0], p), pct(&v[1], p))
}

fn print_rows(rows: &[Row]) {
    println!(
        "{:<58} {:>12} {:>12} {:>9}",
        "figure", "kubelet", "reaplet", "r/k"
    );
    for r in rows {
        let fmt = |v: f64| {
            if r.unit.is_empty() {
                format!("{v:.2}")
            } else if v.abs() >= 100.0 || r.unit == "attempts" {
                format!("{v:.0} {}", r.unit)
            } else {
                format!("{v:.2} {}", r.unit)
            }
        };
        println!(
            "{:<58} {:>12} {:>12} {:>9.2}",
            r.figure,
            fmt(r.kubelet),
            fmt(r.reaplet),
            r.reaplet / r.kubelet
        );
    }
}

/// The scenarios, by the name `kubelet:<name>` runs alone.
pub const SCENARIOS: [&str; 8] = [
    "one", "burst", "exit", "taint", "taint4", "outage", "pressure", "standby",
];

/// Every scenario of `only` (all when empty), then the table; a failed scenario is reported
/// and the others still run.
pub async fn kubelet(only: &[&str]) -> R<()> {
    let want = |s: &str| only.is_empty() || only.contains(&s);
    let t = Instant::now();
    header(
        "kubelet vs reaplet, side by side: kube-apiserver, etcd and kubelet v1.36 on the test bed's containerd",
    );
    let mut rows = Vec::new();
    let mut failed = Vec::new();
    let mut take = |name: &str, r: R<Vec<Row>>| match r {
        Ok(v) => rows.extend(v),
        Err(e) => {
            println!("*** {name} failed: {e}");
            failed.push(name.to_owned());
        }
    };
    if want("one") {
        take("one", pods::one_pod(10).await);
    }
    if want("burst") {
        take("burst", pods::burst_side(110).await);
    }
    if want("exit") {
        take("exit", pods::exit_side(10).await);
    }
    if want("taint") {
        take("taint", taint::taint_side(5).await);
    }
    if want("taint4") {
        take("taint4", taint4::taint4_side(5).await);
    }
    if want("outage") {
        take("outage", outage::outage_side(30).await);
    }
    if want("pressure") {
        take(
            "pressure",
            pressure::pressure_side(&[10, 25, 50, 100]).await,
        );
    }
    if want("standby") {
        take(
            "standby",
            footprint::standby_side(110, Duration::from_secs(60)).await,
        );
    }
    header(&format!(
        "kubelet vs reaplet: the table ({:.0} s in all)",
        t.elapsed().as_secs_f64()
    ));
    print_rows(&rows);
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "side-by-side scenarios failed: {}",
            failed.join(", ")
        ))
    }
}
