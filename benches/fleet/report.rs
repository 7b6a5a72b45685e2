//! The closing tables: the three windows side by side, what reaplet adds against what the
//! hollow kubelets cost, per node and by verb and resource.

use super::Plan;
use super::audit::Who;
use super::restart::Restarted;
use super::window::Window;
use std::collections::BTreeMap;

fn pct(part: f64, whole: f64) -> String {
    if whole > 0.0 {
        format!("{:.1} %", 100.0 * part / whole)
    } else if part > 0.0 {
        "inf".into()
    } else {
        "0".into()
    }
}

fn verdict(part: f64, whole: f64) -> &'static str {
    if part <= 0.1 * whole {
        "met"
    } else {
        "NOT met"
    }
}

/// The closing tables.
pub fn report(plan: &Plan, w: [&Window; 3], footprint: &str) {
    let [w0, w1, w2] = w;
    let n = plan.nodes as f64;
    println!(
        "\nfleet: {} nodes, windows of {:.0} s (W0 control plane alone, W1 + hollow kubelets, \
         W2 + standby reaplets); reaplets' identity: {}",
        plan.nodes,
        w1.secs,
        plan.identity.describe()
    );
    println!(
        "{:<40} {:>10} {:>10} {:>10} {:>13} {:>13} {:>10}  target <= 10 %",
        "figure", "W0", "W1", "W2", "reaplet adds", "kubelets cost", "adds/cost"
    );
    let row = |name: &str, v: [f64; 3], adds: f64, cost: f64| {
        println!(
            "{name:<40} {:>10.2} {:>10.2} {:>10.2} {adds:>13.2} {cost:>13.2} {:>10}  {}",
            v[0],
            v[1],
            v[2],
            pct(adds, cost),
            verdict(adds, cost)
        );
    };
    let all = |x: &Window| x.rate_all();
    row(
        "API requests/s (all senders)",
        [all(w0).0, all(w1).0, all(w2).0],
        w2.rate(Who::Reaplet).0,
        w1.rate(Who::Kubelet).0,
    );
    row(
        "quorum reads/s (all senders)",
        [all(w0).1, all(w1).1, all(w2).1],
        w2.rate(Who::Reaplet).1,
        w1.rate(Who::Kubelet).1,
    );
    let held = |x: &Window| x.watches.values().sum::<usize>() as f64;
    row(
        "watches held at the window's end",
        [held(w0), held(w1), held(w2)],
        w2.watches(Who::Reaplet) as f64,
        w1.watches(Who::Kubelet) as f64,
    );
    let mc = |cpu: f64, x: &Window| 1000.0 * cpu / x.secs / n;
    let api = [w0, w1, w2].map(|x| mc(x.apiserver_cpu, x));
    row(
        "kube-apiserver CPU per node (millicores)",
        api,
        api[2] - api[1],
        api[1] - api[0],
    );
    let etcd = [w0, w1, w2].map(|x| mc(x.etcd_cpu, x));
    row(
        "etcd CPU per node (millicores)",
        etcd,
        etcd[2] - etcd[1],
        etcd[1] - etcd[0],
    );
    println!(
        "(requests, quorum reads, watches: \"reaplet adds\" counts the reaplets' own in W2 and \
         \"kubelets cost\" the hollow kubelets' own in W1, by User-Agent; CPU: W2 - W1 and \
         W1 - W0. The API server's watch gauge: W0 {:.0}, W1 {:.0}, W2 {:.0}.)",
        w0.watches_gauge, w1.watches_gauge, w2.watches_gauge
    );
    println!("\nper node and second, by sender:");
    for (who, x) in [(Who::Kubelet, w1), (Who::Kubelet, w2), (Who::Reaplet, w2)] {
        let (a, q) = x.rate(who);
        println!(
            "  {who:?} in {}: {:.3} requests, {:.3} quorum reads; {} watches held ({:.2} per node)",
            x.name,
            a / n,
            q / n,
            x.watches(who),
            x.watches(who) as f64 / n
        );
    }
    for x in [w0, w1, w2] {
        let (a, q) = x.rate(Who::Other);
        println!(
            "  others (the API server's own clients, the benchmark) in {}: {a:.2} requests/s, \
             {q:.2} quorum reads/s",
            x.name
        );
    }
    println!("\nby verb and resource (requests/s in the window; quorum reads/s after the slash):");
    for (label, who, x) in [
        ("hollow kubelets, W1", Who::Kubelet, w1),
        ("hollow kubelets, W2", Who::Kubelet, w2),
        ("reaplets, W2", Who::Reaplet, w2),
        ("others, W2", Who::Other, w2),
    ] {
        println!("  {label}:");
        for ((_, verb, res), (a, q)) in x.by_kind.iter().filter(|((w, _, _), _)| *w == who) {
            println!(
                "    {:<8} {:<36} {:>8.3} / {:.3}",
                verb,
                res,
                *a as f64 / x.secs,
                *q as f64 / x.secs
            );
        }
    }
    println!("\n{footprint}");
}

/// The restart's table: what each sender sent in the window from the signal, the reaplets'
/// against the hollow kubelets', beside the same senders' steady rate (W2) over as long.
pub fn restart(plan: &Plan, w2: &Window, r: &Restarted, roles: &BTreeMap<String, usize>) {
    let x = &r.window;
    let n = plan.nodes as f64;
    println!(
        "\nAPI server restart under the fleet: {} nodes, reaplets' identity {}; SIGTERM, the old \
         server gone {:.1} s after it (its shutdown timeout), the new one started then and \
         ready {:.1} s later; the window: {:.0} s from the old one's exit ({} of its watches \
         cut without a closing record)",
        plan.nodes,
        plan.identity.name(),
        r.stopped_after.as_secs_f64(),
        r.ready_after.as_secs_f64(),
        x.secs,
        r.cut_watches
    );
    println!(
        "{:<40} {:>13} {:>13} {:>10} {:>16} {:>16}  target <= 10 %",
        "figure (in the window)",
        "reaplets",
        "kubelets",
        "r/k",
        "reaplets steady",
        "kubelets steady"
    );
    let steady = |rate: f64| rate * x.secs;
    let row = |name: &str, reap: f64, kube: f64, rs: f64, ks: f64| {
        println!(
            "{name:<40} {reap:>13.0} {kube:>13.0} {:>10} {rs:>16.1} {ks:>16.1}  {}",
            pct(reap, kube),
            verdict(reap, kube)
        );
    };
    let count = |who: Who| x.reqs.get(&who).copied().unwrap_or_default();
    let (ra, rq) = count(Who::Reaplet);
    let (ka, kq) = count(Who::Kubelet);
    row(
        "API requests",
        ra as f64,
        ka as f64,
        steady(w2.rate(Who::Reaplet).0),
        steady(w2.rate(Who::Kubelet).0),
    );
    row(
        "quorum reads",
        rq as f64,
        kq as f64,
        steady(w2.rate(Who::Reaplet).1),
        steady(w2.rate(Who::Kubelet).1),
    );
    row(
        "writes",
        x.writes(Who::Reaplet) as f64,
        x.writes(Who::Kubelet) as f64,
        steady(w2.writes(Who::Reaplet) as f64 / w2.secs),
        steady(w2.writes(Who::Kubelet) as f64 / w2.secs),
    );
    row(
        "watches held at the window's end",
        x.watches(Who::Reaplet) as f64,
        x.watches(Who::Kubelet) as f64,
        w2.watches(Who::Reaplet) as f64,
        w2.watches(Who::Kubelet) as f64,
    );
    println!(
        "(\"steady\": the same sender's rate in W2 over as long a time; watches: held at W2's \
         end. Per node: reaplets {:.2} requests, {:.2} quorum reads; hollow kubelets {:.2}, \
         {:.2}. Others (the API server's own clients, the benchmark): {} requests, {} quorum \
         reads. The API server's watch gauge at the end: {:.0}. kube-apiserver CPU in the \
         window (the new one's, its start included): {:.1} CPU-s; etcd {:.1} \
         CPU-s; reaplets {:.2} CPU-s, hollow kubelets {:.2} CPU-s.)",
        ra as f64 / n,
        rq as f64 / n,
        ka as f64 / n,
        kq as f64 / n,
        count(Who::Other).0,
        count(Who::Other).1,
        x.watches_gauge,
        x.apiserver_cpu,
        x.etcd_cpu,
        x.reaplets_cpu,
        x.kubelets_cpu,
    );
    println!("reaplets' roles after the restart's window: {roles:?}");
    println!("\nby verb, resource and response code (requests in the window):");
    for (label, who) in [
        ("hollow kubelets", Who::Kubelet),
        ("reaplets", Who::Reaplet),
        ("others", Who::Other),
    ] {
        println!("  {label}:");
        for ((_, verb, res, code), k) in x.by_code.iter().filter(|((w, ..), _)| *w == who) {
            let q = x
                .by_kind
                .get(&(who, verb.clone(), res.clone()))
                .map_or(0, |(_, q)| *q);
            println!(
                "    {verb:<8} {res:<36} {code:>3} {k:>6}   (quorum reads of this verb and resource: {q})"
            );
        }
    }
}
