//! The `drain` command against the API, with the operator's credentials (`kubectl drain`'s
//! `RunCordonOrUncordon` and `RunNodeDrain`, with the ReplicaSet controller's order).
//!
//! Invariants: the plan is printed (or, with `-o json`, is one document) before anything is
//! evicted; `--dry-run` writes nothing; the plan's times are measured from one instant,
//! `plannedAt`; the ReplicaSets the ranking reads are listed only in the namespaces of the
//! node's ReplicaSet pods, and a list the credentials may not make leaves those pods ranked 0
//! (as for a ReplicaSet without an owner) with a note in the plan.

use super::DrainError;
use super::evict::evict_waves;
use super::plan::{self, Options, Plan};
use super::pods;
use super::progress::{Progress, Row, State};
use crate::api;
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{ListParams, Patch, PatchParams};
use std::collections::BTreeMap;
use std::io::Write;
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub use super::evict::{BLOCKED_RETRY, eviction_grace};
pub use super::progress::Output;
pub use super::room::{RoomArgs, make_room};

#[derive(Debug, Clone)]
pub struct DrainArgs {
    pub node: String,
    pub dry_run: bool,
    pub timeout: Option<Duration>,
    pub grace_period: Option<i64>,
    pub options: Options,
    pub output: Output,
}

fn print_plan(p: &mut Progress<'_>, plan: &Plan) {
    for (pod, skip) in &plan.skipped {
        let why = match skip {
            plan::Skip::DaemonSet => "DaemonSet-managed: ignored",
            plan::Skip::Mirror => "mirror of a static pod: left to the kubelet's manifest",
        };
        p.line(&format!("skip     {}: {why}", pod.key));
    }
    for (pod, r) in &plan.refused {
        p.line(&format!("refuse   {}: {}", pod.key, r.message()));
    }
    for (i, wave) in plan.waves.iter().enumerate() {
        let names: Vec<String> = wave
            .iter()
            .map(|d| format!("{} (priority {})", d.key, d.priority))
            .collect();
        p.line(&format!("wave {:>2}: {}", i + 1, names.join(", ")));
    }
}

pub(super) async fn node_pods(client: &kube::Client, node: &str) -> Result<Vec<Pod>, DrainError> {
    let api: kube::Api<Pod> = kube::Api::all(client.clone());
    let lp = ListParams::default().fields(&format!("spec.nodeName={node}"));
    Ok(api::bounded(api.list(&lp)).await?.items)
}

pub(super) async fn get_node(client: &kube::Client, node: &str) -> Result<Node, DrainError> {
    let nodes: kube::Api<Node> = kube::Api::all(client.clone());
    match api::bounded(nodes.get(node)).await {
        Ok(n) => Ok(n),
        Err(e) if e.code() == Some(404) => Err(DrainError::NoNode(node.into())),
        Err(e) => Err(e.into()),
    }
}

async fn cordon(client: &kube::Client, node: &str) -> Result<(), DrainError> {
    let nodes: kube::Api<Node> = kube::Api::all(client.clone());
    api::bounded(nodes.patch(
        node,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"unschedulable": true}})),
    ))
    .await?;
    Ok(())
}

/// The ReplicaSets the ranking reads: those of the namespaces of the node's ReplicaSet pods.
/// `Err` is a namespace whose list was forbidden (the ranking then counts 0 there).
async fn replicasets(
    client: &kube::Client,
    pods: &[Pod],
) -> Result<(Vec<ReplicaSet>, Vec<String>), DrainError> {
    let namespaces: std::collections::BTreeSet<String> = pods
        .iter()
        .filter(|p| pods::controller(p).is_some_and(|c| c.kind == "ReplicaSet"))
        .filter_map(|p| p.metadata.namespace.clone())
        .collect();
    let mut out = Vec::new();
    let mut forbidden = Vec::new();
    for ns in namespaces {
        let api: kube::Api<ReplicaSet> = kube::Api::namespaced(client.clone(), &ns);
        match api::bounded(api.list(&ListParams::default())).await {
            Ok(l) => out.extend(l.items),
            Err(e) if e.code() == Some(403) => forbidden.push(ns),
            Err(e) => return Err(e.into()),
        }
    }
    Ok((out, forbidden))
}

/// A planned pod with the ranking keys that placed it.
fn planned_json(d: &super::plan::DrainPod) -> serde_json::Value {
    let r = &d.rank;
    let secs = |ns: Option<i64>| ns.map(|n| n as f64 / 1e9);
    serde_json::json!({
        "pod": d.key, "uid": d.uid, "owner": d.owner, "priority": d.priority,
        "terminating": d.terminating, "terminal": d.terminal,
        "rank": {
            "assigned": r.assigned, "phase": r.phase, "ready": r.ready,
            "deletionCost": r.deletion_cost, "colocated": r.colocated,
            "readyForSeconds": secs(r.ready_for).filter(|_| r.ready),
            "readyBucket": r.ready_bucket(),
            "restarts": r.restarts, "sidecarRestarts": r.sidecar_restarts,
            "ageSeconds": secs(r.age), "creationBucket": r.creation_bucket(),
        },
    })
}

fn summary_json(
    node: &str,
    now: jiff::Timestamp,
    plan: &Plan,
    rows: &[Row],
    err: Option<&DrainError>,
) -> serde_json::Value {
    serde_json::json!({
        "node": node,
        // the one instant the plan's times are measured from
        "plannedAt": now.to_string(),
        "skipped": plan.skipped.iter().map(|(p, s)| serde_json::json!({"pod": p.key, "why": s.name()})).collect::<Vec<_>>(),
        "refused": plan.refused.iter().map(|(p, r)| serde_json::json!({"pod": p.key, "why": r.message()})).collect::<Vec<_>>(),
        "waves": plan.waves.iter().map(|w| w.iter().map(planned_json).collect::<Vec<_>>()).collect::<Vec<_>>(),
        "pods": rows.iter().map(|r| serde_json::json!({
            "pod": r.pod.key, "state": r.state.label(), "goneAfterSeconds": r.gone_after,
            "detail": match &r.state { State::Blocked(m) | State::Failed(m) => Some(m.clone()), _ => None },
        })).collect::<Vec<_>>(),
        "error": err.map(|e| e.to_string()),
    })
}

/// `reaplet drain`.
pub async fn drain(
    client: kube::Client,
    a: DrainArgs,
    cancel: CancellationToken,
    out: &mut dyn Write,
) -> Result<(), DrainError> {
    let mut p = Progress::new(out, a.output);
    let read = async {
        get_node(&client, &a.node).await?;
        if !a.dry_run {
            cordon(&client, &a.node).await?;
        }
        let listed = node_pods(&client, &a.node).await?;
        let (rs, forbidden) = replicasets(&client, &listed).await?;
        Ok::<_, DrainError>((listed, rs, forbidden))
    };
    let (listed, rs, forbidden) = match read.await {
        Ok(r) => r,
        Err(e) => {
            // with -o json, a failure before the plan is a document too
            if a.output == Output::Json {
                let doc = serde_json::json!({"node": a.node, "dryRun": a.dry_run,
                    "error": e.to_string()});
                let _ = writeln!(p.out, "{doc}");
            }
            return Err(e);
        }
    };
    if a.dry_run {
        p.line(&format!("node {} (dry run: not cordoned)", a.node));
    } else {
        p.line(&format!("node {} cordoned", a.node));
    }
    if !forbidden.is_empty() {
        p.line(&format!(
            "note: ReplicaSets may not be listed in {}: their pods rank 0 on related pods",
            forbidden.join(", ")
        ));
    }
    // one "now" for the whole plan, at full precision, as the controller's sort takes it
    let now = jiff::Timestamp::now();
    let plan = plan::plan(pods::drain_pods_at(&listed, &rs, now), a.options);
    print_plan(&mut p, &plan);
    if !plan.refused.is_empty() {
        let why: Vec<String> = plan
            .refused
            .iter()
            .map(|(d, r)| format!("{} {}", d.key, r.message()))
            .collect();
        let e = DrainError::Refused(format!(
            "cannot drain: {}; nothing was evicted{}",
            why.join("; "),
            if a.dry_run {
                ""
            } else {
                " (the node stays cordoned)"
            }
        ));
        if a.output == Output::Json {
            let _ = writeln!(
                p.out,
                "{}",
                summary_json(&a.node, now, &plan, &[], Some(&e))
            );
        }
        return Err(e);
    }
    if a.dry_run {
        if a.output == Output::Json {
            let _ = writeln!(p.out, "{}", summary_json(&a.node, now, &plan, &[], None));
        }
        return Ok(());
    }
    let deadline = a.timeout.map(|t| Instant::now() + t);
    let (rows, err) = evict_waves(
        &client,
        plan.waves.clone(),
        &BTreeMap::new(),
        a.grace_period,
        deadline,
        &cancel,
        &mut p,
    )
    .await;
    if a.output == Output::Json {
        let _ = writeln!(
            p.out,
            "{}",
            summary_json(&a.node, now, &plan, &rows, err.as_ref())
        );
    } else if err.is_none() {
        p.line(&format!(
            "node {} drained: {} pods evicted in {:.1} s",
            a.node,
            rows.len(),
            p.start.elapsed().as_secs_f64()
        ));
    }
    err.map_or(Ok(()), Err)
}
