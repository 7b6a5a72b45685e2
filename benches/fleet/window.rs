//! One measured window: the CPU time of kube-apiserver, etcd and the fleet's processes over it,
//! and what the audit log says of the requests received in it and the watches open at its end.

use super::audit::{AuditLog, Who};
use super::k8s::Cluster;
use super::procs::{Fleet, cpu_secs};
use super::{R, now_ns};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// One measured window.
pub struct Window {
    pub name: &'static str,
    pub secs: f64,
    pub apiserver_cpu: f64,
    pub etcd_cpu: f64,
    /// CPU seconds of the hollow kubelets, of the reaplets
    pub kubelets_cpu: f64,
    pub reaplets_cpu: f64,
    /// requests received in the window, by sender: (all, quorum reads)
    pub reqs: BTreeMap<Who, (usize, usize)>,
    /// by sender, verb and resource: (requests, quorum reads)
    pub by_kind: BTreeMap<(Who, String, String), (usize, usize)>,
    /// by sender, verb, resource and response code: requests
    pub by_code: BTreeMap<(Who, String, String, u16), usize>,
    /// writes by sender
    pub writes: BTreeMap<Who, usize>,
    /// watches open at its end, by sender (audit log) and in all (the API server's gauge)
    pub watches: BTreeMap<Who, usize>,
    pub watches_gauge: f64,
}

impl Window {
    pub fn new(name: &'static str, secs: f64) -> Window {
        Window {
            name,
            secs,
            apiserver_cpu: 0.0,
            etcd_cpu: 0.0,
            kubelets_cpu: 0.0,
            reaplets_cpu: 0.0,
            reqs: BTreeMap::new(),
            by_kind: BTreeMap::new(),
            by_code: BTreeMap::new(),
            writes: BTreeMap::new(),
            watches: BTreeMap::new(),
            watches_gauge: 0.0,
        }
    }

    /// Counts what the audit log says of the requests received in `[from, to)` (ns since the
    /// epoch) and the watches open now.
    pub async fn close(&mut self, cluster: &Cluster, audit: &mut AuditLog, from: i64, to: i64) {
        // the log backend writes a record before the answer goes out: give the last ones a
        // moment
        tokio::time::sleep(Duration::from_millis(500)).await;
        audit.refresh(&cluster.audit_log);
        for r in audit.window(from, to) {
            let e = self.reqs.entry(r.who).or_default();
            e.0 += 1;
            e.1 += usize::from(r.quorum);
            let k = self
                .by_kind
                .entry((r.who, r.verb.clone(), r.resource.clone()))
                .or_default();
            k.0 += 1;
            k.1 += usize::from(r.quorum);
            *self
                .by_code
                .entry((r.who, r.verb.clone(), r.resource.clone(), r.code))
                .or_default() += 1;
            if r.is_write() {
                *self.writes.entry(r.who).or_default() += 1;
            }
        }
        self.watches = audit.watches_open();
        self.watches_gauge = watch_gauge(cluster).await;
    }

    /// Writes (create, update, patch, delete) received in the window from `who`.
    pub fn writes(&self, who: Who) -> usize {
        self.writes.get(&who).copied().unwrap_or(0)
    }

    pub fn rate(&self, who: Who) -> (f64, f64) {
        let (a, q) = self.reqs.get(&who).copied().unwrap_or_default();
        (a as f64 / self.secs, q as f64 / self.secs)
    }

    pub fn rate_all(&self) -> (f64, f64) {
        let (a, q) = self
            .reqs
            .values()
            .fold((0, 0), |(a, q), (x, y)| (a + x, q + y));
        (a as f64 / self.secs, q as f64 / self.secs)
    }

    pub fn watches(&self, who: Who) -> usize {
        self.watches.get(&who).copied().unwrap_or(0)
    }
}

/// The API server's `apiserver_longrunning_requests` for WATCH, summed (NaN if unreadable).
async fn watch_gauge(cluster: &Cluster) -> f64 {
    let req = http::Request::get("/metrics")
        .body(Vec::new())
        .expect("a request");
    let Ok(Ok(text)) =
        tokio::time::timeout(Duration::from_secs(30), cluster.admin.request_text(req)).await
    else {
        return f64::NAN;
    };
    text.lines()
        .filter(|l| {
            l.starts_with("apiserver_longrunning_requests{") && l.contains("verb=\"WATCH\"")
        })
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// The processes a window watches.
pub struct Watched<'a> {
    pub cluster: &'a Cluster,
    pub kubelets: &'a mut Fleet,
    pub reaplets: &'a mut Fleet,
    pub audit: &'a mut AuditLog,
}

/// Measures one window of `len`: sleeps through it (no API request of the benchmark's own),
/// checking every 5 s that no member of the fleet exited.
pub async fn measure(name: &'static str, w: &mut Watched<'_>, len: Duration) -> R<Window> {
    let (api, etcd) = (
        w.cluster.apiserver.pid().unwrap_or(0),
        w.cluster.etcd.pid().unwrap_or(0),
    );
    let sum = |pids: &[u32]| pids.iter().map(|p| cpu_secs(*p)).sum::<f64>();
    let (kp, rp) = (w.kubelets.pids(), w.reaplets.pids());
    println!(
        "[{name}] measuring {} s ... (load average {})",
        len.as_secs(),
        super::loadavg()
    );
    let (c_api, c_etcd, c_k, c_r) = (cpu_secs(api), cpu_secs(etcd), sum(&kp), sum(&rp));
    let (t0, from) = (Instant::now(), now_ns());
    while t0.elapsed() < len {
        tokio::time::sleep((len - t0.elapsed()).min(Duration::from_secs(5))).await;
        for f in [&mut *w.kubelets, &mut *w.reaplets] {
            if let Some(e) = f.first_exited() {
                return Err(format!("during {name}: {e}"));
            }
        }
    }
    let (secs, to) = (t0.elapsed().as_secs_f64(), now_ns());
    let mut win = Window::new(name, secs);
    win.apiserver_cpu = cpu_secs(api) - c_api;
    win.etcd_cpu = cpu_secs(etcd) - c_etcd;
    win.kubelets_cpu = sum(&kp) - c_k;
    win.reaplets_cpu = sum(&rp) - c_r;
    win.close(w.cluster, w.audit, from, to).await;
    Ok(win)
}
