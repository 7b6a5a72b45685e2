//! The NoExecute taint on a node with several pods (issue 39): four pods per round, one
//! without a toleration, one tolerating the taint for 6 s, one for ever, one tolerating
//! another key; the admin's PATCH adds the round's taint. The figures: from the PATCH's
//! arrival to the arrival of the evictor's `DisruptionTarget` status write and of its DELETE,
//! for the two pods evicted at once (two evictions at the same moment), and how late the
//! 6 s pod's DELETE came. The kubelet's run: the controller manager's taint eviction
//! controller; reaplet's: its own taint manager.

use super::audit::Rec;
use super::stack::Stack;
use super::taint::{by_evictor, set_taints, start_pods, start_taint_controllers, taint_patch};
use super::*;

/// The pods of round `r` of agent `c`, and the round's taint key: (no toleration, 6 s, for
/// ever, another key's toleration).
fn round_pods(c: &str, r: usize) -> [String; 4] {
    ["none", "six", "ever", "other"].map(|k| format!("t4-{c}-{r}-{k}"))
}

fn key(c: &str, r: usize) -> String {
    format!("bench-t4-{c}-{r}")
}

/// Round `r`'s four pods; each tolerates every other round's key for ever.
fn bodies(c: &str, r: usize, rounds: usize) -> Vec<Value> {
    let others: Vec<Value> = (0..rounds)
        .filter(|j| *j != r)
        .map(|j| json!({"key": key(c, j), "operator": "Exists", "effect": "NoExecute"}))
        .collect();
    let own = |secs: Option<i64>| {
        let mut t = json!({"key": key(c, r), "operator": "Exists", "effect": "NoExecute"});
        if let Some(s) = secs {
            t["tolerationSeconds"] = s.into();
        }
        t
    };
    let other_key =
        json!({"key": "bench-t4-elsewhere", "operator": "Exists", "effect": "NoExecute"});
    let names = round_pods(c, r);
    let extra = [None, Some(own(Some(6))), Some(own(None)), Some(other_key)];
    names
        .iter()
        .zip(extra)
        .map(|(n, e)| {
            let mut p = pod(n, TRAPS_TERM);
            let mut t = others.clone();
            t.extend(e);
            p["spec"]["tolerations"] = json!(t);
            p
        })
        .collect()
}

/// The `DisruptionTarget` status write of pod `name`.
fn is_condition(r: &Rec, name: &str) -> bool {
    (r.verb == "patch" || r.verb == "update" || r.verb == "apply")
        && r.resource == "pods"
        && r.sub == "status"
        && r.name == name
        && r.request["status"]["conditions"]
            .as_array()
            .is_some_and(|c| c.iter().any(|c| c["type"] == "DisruptionTarget"))
}

pub(super) async fn taint4_side(rounds: usize) -> R<Vec<Row>> {
    header(&format!(
        "kubelet 4b: NoExecute taint on a node with 4 pods per round (none, 6 s, for ever, another key), {rounds} rounds"
    ));
    let mut s = Stack::start("taint4").await;
    start_taint_controllers(&mut s).await?;
    // [agent][figure] samples: status of the first eviction, its DELETE, status of the second,
    // its DELETE (first and second by arrival of the DELETE), the 6 s pod's lateness
    let mut figs: Vec<[Vec<f64>; 5]> = Vec::new();
    let mut firsts: Vec<[f64; 5]> = Vec::new();
    for who in [Who::Kubelet, Who::Reaplet] {
        let c = &who.label()[..1];
        let all: Vec<Value> = (0..rounds).flat_map(|r| bodies(c, r, rounds)).collect();
        let names: Vec<String> = (0..rounds).flat_map(|r| round_pods(c, r)).collect();
        start_pods(&mut s, who, &all, &names, Duration::from_secs(180)).await?;
        let mut f: [Vec<f64>; 5] = Default::default();
        for r in 0..rounds {
            let [none, six, _ever, other] = round_pods(c, r);
            let wall0 = wall_ns();
            set_taints(
                &s,
                json!([{"key": key(c, r), "value": "x", "effect": "NoExecute"}]),
            )
            .await?;
            s.wait_gone(
                &[none.clone(), other.clone(), six.clone()],
                Duration::from_millis(100),
                Duration::from_secs(90),
            )
            .await?;
            let found = s
                .audit_find(|a| {
                    let tainted = taint_patch(a, wall0)?.received;
                    let first = |pred: &dyn Fn(&Rec) -> bool| {
                        a.iter()
                            .filter(|x| x.received >= tainted && by_evictor(x, who) && pred(x))
                            .map(|x| x.received)
                            .min()
                    };
                    let mut pairs = Vec::new();
                    for n in [&none, &other] {
                        let st = first(&|x| is_condition(x, n))?;
                        let del = first(&|x| x.is_pod("delete", n))?;
                        pairs.push((st - tainted, del - tainted));
                    }
                    pairs.sort_by_key(|p| p.1);
                    let six_del = first(&|x| x.is_pod("delete", &six))?;
                    Some((pairs, six_del - tainted))
                })
                .await
                .ok_or(format!(
                    "round {r}: the audit log lacks the taint PATCH or an evictor's status write or DELETE"
                ))?;
            let (pairs, six_del) = found;
            f[0].push(ms_ns(pairs[0].0));
            f[1].push(ms_ns(pairs[0].1));
            f[2].push(ms_ns(pairs[1].0));
            f[3].push(ms_ns(pairs[1].1));
            f[4].push(ms_ns(six_del) - 6000.0);
            println!(
                "[taint4] {} round {r}: status {:.1} / {:.1} ms, DELETE {:.1} / {:.1} ms, 6 s pod's DELETE {:+.1} ms late",
                who.label(),
                ms_ns(pairs[0].0),
                ms_ns(pairs[1].0),
                ms_ns(pairs[0].1),
                ms_ns(pairs[1].1),
                ms_ns(six_del) - 6000.0
            );
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        set_taints(&s, Value::Null).await?;
        if who == Who::Kubelet {
            // the kubelet ends the rounds' pods that stayed: none is left for reaplet's taints
            let ever: Vec<String> = (0..rounds).map(|r| round_pods(c, r)[2].clone()).collect();
            for n in &ever {
                s.delete(n).await?;
            }
            s.wait_gone(&ever, Duration::from_millis(250), Duration::from_secs(90))
                .await?;
        }
        firsts.push(f.clone().map(|v| v[0]));
        figs.push(f.map(sorted));
    }
    s.keep_logs();
    let both = |i: usize| vec![figs[0][i].clone(), figs[1][i].clone()];
    let first = |i: usize| vec![vec![firsts[0][i]], vec![firsts[1][i]]];
    let label = |what: &str| format!("taint, 4 pods: {what}, median (n={rounds})");
    Ok(vec![
        pct_row(label("-> 1st status write"), "ms", &both(0), 50.0),
        pct_row(label("-> 1st DELETE"), "ms", &both(1), 50.0),
        pct_row(label("-> 2nd status write"), "ms", &both(2), 50.0),
        pct_row(label("-> 2nd DELETE"), "ms", &both(3), 50.0),
        pct_row(label("6 s pod's DELETE, late by"), "ms", &both(4), 50.0),
        // the first round's requests are the first evictions after the takeover: reaplet's
        // have no pooled connection yet (as after any quiet spell of 90 s, the pool's idle
        // limit); the controller manager's Go client sends them on its open HTTP/2 connection
        pct_row(
            "taint, 4 pods, first round: -> 1st status write",
            "ms",
            &first(0),
            50.0,
        ),
        pct_row(
            "taint, 4 pods, first round: -> 2nd DELETE",
            "ms",
            &first(3),
            50.0,
        ),
    ])
}
