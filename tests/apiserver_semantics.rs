//! The in-process API server follows the real server's semantics for what reaplet (and the
//! eviction work to come) relies on, checked through kube-rs, the client reaplet uses.

mod common;

use common::apiserver::ApiServer;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, EvictParams, Patch, PatchParams, Preconditions};
use serde_json::json;

fn pod(name: &str, node: Option<&str>, phase: &str) -> serde_json::Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": "x"}},
        "spec": {"nodeName": node, "terminationGracePeriodSeconds": 30, "containers": [{"name": "c", "image": "i"}]},
        "status": {"phase": phase, "conditions": [{"type": "Ready", "status": "True"}]}
    })
}

async fn client(api: &ApiServer) -> (tempfile::TempDir, kube::Api<Pod>) {
    let dir = tempfile::tempdir().unwrap();
    let kc = api.write_kubeconfig_as(dir.path(), &common::apiserver::User::Admin);
    let cfg = reaplet::api::client_config(Some(&kc)).await.unwrap();
    (
        dir,
        kube::Api::namespaced(kube::Client::try_from(cfg).unwrap(), "default"),
    )
}

fn code(e: kube::Error) -> u16 {
    reaplet::api::status_code(&e).expect("an API status")
}

#[tokio::test]
async fn graceful_delete_rules() {
    let api = ApiServer::start().await;
    let (_d, pods) = client(&api).await;
    api.create_pod(pod("a", Some("n"), "Running"));
    let dp = |g: Option<u32>| DeleteParams {
        grace_period_seconds: g,
        ..DeleteParams::default()
    };
    // the spec's grace
    pods.delete("a", &dp(None)).await.unwrap();
    let a = api.get_pod("default", "a").unwrap();
    assert_eq!(a["metadata"]["deletionGracePeriodSeconds"], 30);
    // longer: no change; shorter: applied
    pods.delete("a", &dp(Some(60))).await.unwrap();
    assert_eq!(
        api.get_pod("default", "a").unwrap()["metadata"]["deletionGracePeriodSeconds"],
        30
    );
    pods.delete("a", &dp(Some(5))).await.unwrap();
    assert_eq!(
        api.get_pod("default", "a").unwrap()["metadata"]["deletionGracePeriodSeconds"],
        5
    );
    // a wrong UID precondition is a conflict
    let wrong = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: Some("nope".into()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    assert_eq!(code(pods.delete("a", &wrong).await.unwrap_err()), 409);
    // grace 0 removes at once
    pods.delete("a", &dp(Some(0))).await.unwrap();
    assert!(api.get_pod("default", "a").is_none());
    assert_eq!(code(pods.delete("a", &dp(Some(0))).await.unwrap_err()), 404);
    // unscheduled and terminal pods go at once
    api.create_pod(pod("unscheduled", None, "Pending"));
    pods.delete("unscheduled", &dp(None)).await.unwrap();
    assert!(api.get_pod("default", "unscheduled").is_none());
    api.create_pod(pod("done", Some("n"), "Succeeded"));
    pods.delete("done", &dp(None)).await.unwrap();
    assert!(api.get_pod("default", "done").is_none());
    // negative becomes 1 (through the query parameter, as kubectl may send it)
    api.create_pod(pod("neg", Some("n"), "Running"));
    let (c, v) = api.delete_pod("default", "neg", Some(-5));
    assert_eq!(
        (c, v["metadata"]["deletionGracePeriodSeconds"].as_i64()),
        (200, Some(1))
    );
}

#[tokio::test]
async fn status_patches_merge_and_check_the_uid() {
    let api = ApiServer::start().await;
    let (_d, pods) = client(&api).await;
    let p = api.create_pod(pod("a", Some("n"), "Running"));
    let uid = p["metadata"]["uid"].as_str().unwrap().to_owned();
    let body = json!({"metadata": {"uid": uid}, "status": {"phase": "Failed",
        "conditions": [{"type": "Ready", "status": "False"}, {"type": "DisruptionTarget", "status": "True"}]}});
    let out = pods
        .patch_status("a", &PatchParams::default(), &Patch::Strategic(body))
        .await
        .unwrap();
    let conds = out.status.unwrap().conditions.unwrap();
    assert_eq!(conds.len(), 2, "merged by type");
    assert!(
        conds
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "False")
    );
    let wrong = json!({"metadata": {"uid": "other"}, "status": {"phase": "Succeeded"}});
    assert_eq!(
        code(
            pods.patch_status("a", &PatchParams::default(), &Patch::Strategic(wrong))
                .await
                .unwrap_err()
        ),
        409
    );
    let merge = json!({"status": {"conditions": [{"type": "X", "status": "True"}]}});
    let out = pods
        .patch_status("a", &PatchParams::default(), &Patch::Merge(merge))
        .await
        .unwrap();
    assert_eq!(
        out.status.unwrap().conditions.unwrap().len(),
        1,
        "a merge patch replaces lists"
    );
}

#[tokio::test]
async fn eviction_honours_disruption_budgets() {
    let api = ApiServer::start().await;
    let (_d, pods) = client(&api).await;
    let ep = EvictParams::default();
    // no PDB: evicted, with DisruptionTarget, gracefully deleted
    api.create_pod(pod("free", Some("n"), "Running"));
    pods.evict("free", &ep).await.unwrap();
    let p = api.get_pod("default", "free").unwrap();
    assert!(!p["metadata"]["deletionTimestamp"].is_null());
    assert!(
        p["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["type"] == "DisruptionTarget" && c["reason"] == "EvictionByEvictionAPI")
    );
    // a PDB with no disruptions allowed: 429 with the DisruptionBudget cause
    api.add_pdb(json!({"metadata": {"name": "pdb", "namespace": "default"},
        "spec": {"selector": {"matchLabels": {"app": "x"}}},
        "status": {"disruptionsAllowed": 0, "desiredHealthy": 1, "currentHealthy": 1}}));
    api.create_pod(pod("guarded", Some("n"), "Running"));
    match pods.evict("guarded", &ep).await.unwrap_err() {
        kube::Error::Api(s) => {
            assert_eq!(s.code, 429);
            let causes = s.details.map(|d| d.causes).unwrap_or_default();
            assert_eq!(causes[0].reason, "DisruptionBudget");
        }
        e => panic!("{e}"),
    }
    // pending pods bypass the budget
    api.create_pod(pod("pending", Some("n"), "Pending"));
    pods.evict("pending", &ep).await.unwrap();
    // two matching budgets: 500
    api.add_pdb(json!({"metadata": {"name": "pdb2", "namespace": "default"},
        "spec": {"selector": {"matchLabels": {"app": "x"}}}, "status": {"disruptionsAllowed": 5}}));
    assert_eq!(code(pods.evict("guarded", &ep).await.unwrap_err()), 500);
}
