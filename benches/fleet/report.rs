//! The closing tables: the three windows side by side, what reaplet adds against what the
//! hollow kubelets cost, per node and by verb and resource.

use super::Plan;
use super::audit::Who;
use super::window::Window;

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
         W2 + standby reaplets)",
        plan.nodes, w1.secs
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
