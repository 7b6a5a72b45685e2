//! `drain`: a 30-pod node emptied by `reaplet drain` (waves, one pod of each owner at a time,
//! lower priority first) and, on a second identical set of pods, by `kubectl drain`'s rules
//! (every pod evicted at once, as kubectl does without a budget). Both against the in-process
//! API server, with `reaplet run` ending the evicted pods on the test bed's containerd.
//! Printed: the total time, and for each owner the most of its replicas being deleted at the
//! same moment (present, `deletionTimestamp` set): the replicas it has down at once while a
//! ReplicaSet controller brings their replacements up elsewhere.

use super::*;
use apiserver::User;
use std::collections::BTreeMap;

/// Owners and their replicas: 12 + 10 + 8 = 30 pods; `api` at priority 100.
const OWNERS: [(&str, usize, i32); 3] = [("web", 12, 0), ("api", 10, 100), ("worker", 8, 0)];

async fn launch_set(api: &ApiServer, tb: &Testbed, set: &str) -> R<Vec<String>> {
    let mut uids = Vec::new();
    for (owner, n, prio) in OWNERS {
        let launches = (0..n).map(|i| {
            let t = PodTemplate::new(&format!("{set}-{owner}-{i}"), 5)
                .container(ContainerTemplate::new("app", TRAPS_TERM));
            let mut obj = t.api_object();
            obj["spec"]["priority"] = prio.into();
            obj["metadata"]["ownerReferences"] = serde_json::json!([{"apiVersion": "apps/v1",
                "kind": "ReplicaSet", "name": format!("{set}-{owner}"),
                "uid": "7c1d0a1e-0000-4000-8000-000000000003", "controller": true}]);
            api.create_pod(obj);
            api.rewrite_pod("default", &t.name, |p| {
                p["status"]["phase"] = "Running".into();
                p["status"]["conditions"] =
                    serde_json::json!([{"type": "Ready", "status": "True"}]);
            });
            async move { reaplet_testbed::launch(tb, &t).await.map(|_| t.uid.clone()) }
        });
        for r in futures_util::future::join_all(launches).await {
            uids.push(r.map_err(|e| e.to_string())?);
        }
    }
    Ok(uids)
}

/// Each owner's pods being deleted right now.
fn down(api: &ApiServer, set: &str) -> BTreeMap<&'static str, usize> {
    OWNERS
        .iter()
        .map(|(owner, n, _)| {
            let leaving = (0..*n)
                .filter(|i| {
                    api.get_pod("default", &format!("{set}-{owner}-{i}"))
                        .is_some_and(|p| !p["metadata"]["deletionTimestamp"].is_null())
                })
                .count();
            (*owner, leaving)
        })
        .collect()
}

/// Runs `evict` while sampling availability every 50 ms until every UID is gone.
async fn measure<F: std::future::Future<Output = R<()>>>(
    api: &ApiServer,
    set: &str,
    uids: &[String],
    evict: F,
) -> R<(f64, BTreeMap<&'static str, usize>)> {
    let t0 = Instant::now();
    let mut most = down(api, set);
    let sampler = async {
        loop {
            for (o, n) in down(api, set) {
                let e = most.entry(o).or_insert(n);
                *e = (*e).max(n);
            }
            if uids.iter().all(|u| api.removed_at(u).is_some()) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let (r, _) = tokio::join!(evict, sampler);
    r?;
    Ok((t0.elapsed().as_secs_f64(), most))
}

pub async fn drain30() -> R<()> {
    header(
        "drain: 30 pods (ReplicaSets web 12, api 10 at priority 100, worker 8; grace 5 s, exit on TERM)",
    );
    let tb = Testbed::start(repo(), "bench-drain");
    let api = ApiServer::start().await;
    api.add_node(serde_json::json!({"metadata": {"name": NODE}}));
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let agent = Agent::spawn(&api, &tb.endpoint(), &tb.cgroup_root, dir.path(), &[])?;
    agent.wait_ready().await?;
    let admin = dir.path().join("admin");
    std::fs::create_dir_all(&admin).map_err(|e| e.to_string())?;
    let kc = api.write_kubeconfig_as(&admin, &User::Admin);

    // reaplet drain
    let uids = launch_set(&api, &tb, "r").await?;
    for u in &uids {
        agent.wait_uid(u).await?;
    }
    let run = async {
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_reaplet"))
            .args([
                "drain",
                "--node",
                NODE,
                "--output",
                "json",
                "--timeout",
                "300s",
            ])
            .arg("--kubeconfig")
            .arg(&kc)
            .output()
            .await
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!(
                "reaplet drain failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(())
    };
    let (took, least) = measure(&api, "r", &uids, run).await?;
    let order: Vec<String> = api
        .requests()
        .into_iter()
        .filter(|r| r.method == "POST" && r.path.ends_with("/eviction"))
        .map(|r| r.path.rsplit('/').nth(1).unwrap_or_default().to_owned())
        .collect();
    println!("reaplet drain: {took:.1} s; most replicas of one owner down at once: {least:?}");
    println!("  eviction order: {}", order.join(" "));

    // kubectl drain's rules: every pod evicted at once
    let uids = launch_set(&api, &tb, "k").await?;
    for u in &uids {
        agent.wait_uid(u).await?;
    }
    let at_once = async {
        for (owner, n, _) in OWNERS {
            for i in 0..n {
                let name = format!("k-{owner}-{i}");
                let body = serde_json::json!({"apiVersion": "policy/v1", "kind": "Eviction",
                    "metadata": {"name": name, "namespace": "default"}});
                let client = kube::Client::try_from(
                    reaplet::api::client_config(Some(&kc))
                        .await
                        .map_err(|e| e.to_string())?,
                )
                .map_err(|e| e.to_string())?;
                let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
                    kube::Api::namespaced(client, "default");
                let _ = body;
                pods.evict(&name, &Default::default())
                    .await
                    .map_err(|e| e.to_string())?;
            }
        }
        Ok(())
    };
    let (took, least) = measure(&api, "k", &uids, at_once).await?;
    println!(
        "kubectl drain's rules (all at once): {took:.1} s; most replicas of one owner down at once: {least:?}"
    );
    drop(agent);
    Ok(())
}
