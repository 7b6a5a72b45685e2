//! The NoExecute taint scenario: an untolerated taint added to the node -> the pod's DELETE
//! (the controller manager's for the kubelet, reaplet's own taint manager) and the pod gone.

use super::audit::{Rec, gone_at};
use super::stack::Stack;
use super::*;

/// 4. An untolerated NoExecute taint -> the pod's DELETE: `n` pods, pod i tolerating every
///    taint of the run but its own; the admin adds the taints one at a time. The kubelet's
///    run: the controller manager's `taint-eviction-controller` deletes, the kubelet ends the
///    pod. reaplet's: its own taint manager (`--enable-taint-manager=true`).
pub(super) async fn taint_side(n: usize) -> R<Vec<Row>> {
    header(&format!(
        "kubelet 4: untolerated NoExecute taint -> DELETE, {n} taints each"
    ));
    let mut s = Stack::start("taint").await;
    start_taint_controllers(&mut s).await?;
    let mut to_delete = Vec::new();
    let mut to_gone = Vec::new();
    for who in [Who::Kubelet, Who::Reaplet] {
        let c = &who.label()[..1];
        let list = names(&format!("taint-{c}"), n);
        let keys: Vec<String> = (0..n).map(|i| format!("bench-{c}-{i}")).collect();
        let bodies: Vec<Value> = list
            .iter()
            .enumerate()
            .map(|(i, x)| {
                let mut p = pod(x, TRAPS_TERM);
                p["spec"]["tolerations"] = keys
                    .iter()
                    .enumerate()
                    .filter(|(j, _)| *j != i)
                    .map(|(_, k)| json!({"key": k, "operator": "Exists", "effect": "NoExecute"}))
                    .collect();
                p
            })
            .collect();
        start_pods(&mut s, who, &bodies, &list, Duration::from_secs(120)).await?;
        let mut taints = Vec::new();
        let (mut d, mut g) = (Vec::new(), Vec::new());
        for (name, key) in list.iter().zip(&keys) {
            taints.push(json!({"key": key, "value": "x", "effect": "NoExecute"}));
            let wall0 = wall_ns();
            set_taints(&s, json!(taints)).await?;
            s.wait_gone(
                std::slice::from_ref(name),
                Duration::from_millis(50),
                Duration::from_secs(90),
            )
            .await?;
            let (tainted, deleted, gone) = s
                .audit_find(|a| {
                    let tainted = taint_patch(a, wall0)?.done;
                    // the taint's DELETE: the controller manager's, or reaplet's first
                    let deleted = a
                        .iter()
                        .find(|r| r.is_pod("delete", name) && by_evictor(r, who))?
                        .received;
                    Some((tainted, deleted, gone_at(a, who, name)?))
                })
                .await
                .ok_or(format!(
                    "the audit log lacks the taint PATCH, the taint DELETE or the final DELETE of {name}"
                ))?;
            d.push(ms_ns(deleted - tainted));
            g.push(ms_ns(gone - tainted));
        }
        let (d, g) = (sorted(d), sorted(g));
        println!(
            "{}: taint stored -> DELETE received median {:.1} ms, p90 {:.1}, max {:.1}; -> gone median {:.1} ms (n={n})",
            who.label(),
            pct(&d, 50.0),
            pct(&d, 90.0),
            pct(&d, 100.0),
            pct(&g, 50.0)
        );
        to_delete.push(d);
        to_gone.push(g);
        if who == Who::Kubelet {
            set_taints(&s, Value::Null).await?;
            s.keep_logs();
        }
    }
    s.keep_logs();
    Ok(vec![
        pct_row(
            format!("NoExecute taint -> DELETE, median (n={n}; k: controller manager)"),
            "ms",
            &to_delete,
            50.0,
        ),
        pct_row(
            format!("NoExecute taint -> pod gone, median (n={n})"),
            "ms",
            &to_gone,
            50.0,
        ),
    ])
}

/// The controller manager's NoExecute taint eviction, as on a real cluster: its role bound,
/// the node lifecycle and taint eviction controllers started and synced.
pub(super) async fn start_taint_controllers(s: &mut Stack) -> R<()> {
    // the controller's own role (what its service account is bound to in a real cluster)
    s.cluster
        .raw(
            "POST",
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
            None,
            Some(&json!({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": "bench-taint-eviction"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                            "name": "system:controller:node-controller"},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                              "name": "system:kube-controller-manager"}],
            })),
        )
        .await;
    // with the node lifecycle controller, as on a real cluster: it registers the pod informer's
    // `spec.nodeName` index that the taint eviction controller reads on a node update (run
    // alone, v1.36.5's controller logs "Index with name spec.nodeName does not exist" and
    // deletes nothing when a node is tainted)
    s.cluster
        .start_controller_manager(&["node-lifecycle-controller", "taint-eviction-controller"]);
    let cm_log = s
        .cluster
        .controller_manager
        .as_ref()
        .map(|p| p.log.clone())
        .ok_or("no controller manager")?;
    let t = Instant::now();
    loop {
        let log = std::fs::read_to_string(&cm_log).unwrap_or_default();
        // its informers sync within ~0.1 s of its start on this machine: 3 s more
        if log
            .lines()
            .any(|l| l.contains("\"Starting\" controller=\"taint-eviction-controller\""))
        {
            tokio::time::sleep(Duration::from_secs(3)).await;
            break;
        }
        if t.elapsed() > Duration::from_secs(90) {
            let said: Vec<&str> = log
                .lines()
                .filter(|l| {
                    !l.contains("configmap_cafile_content")
                        && !l.contains("FLAG:")
                        && !l.contains("is disabled")
                })
                .take(60)
                .collect();
            return Err(format!(
                "the taint eviction controller did not sync in 90 s:\n{}",
                said.join("\n")
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "[{}] controller manager (node-lifecycle, taint-eviction) started in {:.1} s",
        s.scenario,
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

/// `who`'s pods `bodies` (named `names`) created and running; for reaplet's run, the
/// controller manager stopped and reaplet taken over with its taint manager.
pub(super) async fn start_pods(
    s: &mut Stack,
    who: Who,
    bodies: &[Value],
    names: &[String],
    limit: Duration,
) -> R<()> {
    let uids = s.create_all(bodies).await?;
    s.wait_running(names, limit).await?;
    if who == Who::Reaplet {
        // no controller manager now: reaplet alone acts on the taints
        s.cluster.controller_manager = None;
        s.takeover(&uids, None, &["--enable-taint-manager=true"])
            .await?;
        tokio::time::sleep(Duration::from_secs(2)).await;
    } else {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    Ok(())
}

/// The admin's node PATCH (a taint's) sent at `wall0` (wall-clock ns) or after.
pub(super) fn taint_patch(a: &[Rec], wall0: i64) -> Option<&Rec> {
    a.iter().find(|r| {
        r.user == ADMIN
            && r.verb == "patch"
            && r.resource == "nodes"
            && r.sub.is_empty()
            && r.received >= wall0 - 1_000_000
    })
}

/// A request of the evictor of `who`'s run: the controller manager beside the kubelet,
/// reaplet's own taint manager in its run.
pub(super) fn by_evictor(r: &Rec, who: Who) -> bool {
    match who {
        Who::Kubelet => r.user == "system:kube-controller-manager",
        Who::Reaplet => r.by(Who::Reaplet),
    }
}

/// The admin's merge PATCH of the node's `spec.taints` (`null`: none).
pub(super) async fn set_taints(s: &Stack, taints: Value) -> R<()> {
    let (code, v) = s
        .cluster
        .raw(
            "PATCH",
            &format!("/api/v1/nodes/{NODE}"),
            Some("application/merge-patch+json"),
            Some(&json!({"spec": {"taints": taints}})),
        )
        .await;
    if code != 200 {
        let what = if taints.is_null() { "untaint" } else { "taint" };
        return Err(format!("{what} the node: {code} {v}"));
    }
    Ok(())
}
