//! `reaplet make-room` and `reaplet drain` against the components that own their algorithms
//! (issue 29): a real kube-scheduler v1.36 preempting for a pending pod, and a real
//! kube-controller-manager v1.36's ReplicaSet controller scaling ReplicaSets down, on a real
//! kube-apiserver and etcd. The node has no kubelet: the test binds the pods to it and writes
//! their status (start times, Ready transitions, restarts) as a kubelet would, so every time
//! the algorithms read is chosen; a deleted pod stays Terminating, which is how each
//! component's choice is observed.
//!
//! * preemption: for each scenario, `make-room --dry-run -o json --for-pod` (the pod's
//!   PriorityClass resolved from the API) is run first, then the same pod is created and the
//!   scheduler's victims (the pods it deleted) must be exactly make-room's: an exact fit (the
//!   reprieved pods fill the node to the last millicore), budgets (a pod without labels
//!   matches no budget), a pod requesting no memory on a node whose memory is over-committed;
//! * scale-down: each ReplicaSet is scaled down by one, and the pod the controller deleted must
//!   be the one reaplet's ranking puts first at the instant of the controller's DELETE (from
//!   the audit log) and, before each rule's step, the one `drain --dry-run -o json` put first;
//!   one step lands just past the 2^35 ns (34.36 s) boundary of a pod's time since ready and
//!   one just past the 2^36 ns (68.72 s) boundary of a pod's age, where a clock truncated to
//!   the second puts the pod one bucket lower than the controller.

#[path = "../common/mod.rs"]
mod common;
mod preemption;
mod scale_down;

use common::k8s::Cluster;
use serde_json::{Value, json};
use std::process::Command;

const NODE: &str = "n1";

/// One control plane at a time: the boundary step's timing must not compete with another.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
const NS: &str = "default";

fn reaplet(c: &Cluster, args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_reaplet"))
        .args(args)
        .args(["--node", NODE, "--kubeconfig"])
        .arg(&c.admin_kubeconfig)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

fn ts(t: jiff::Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// The node: allocatable as given, and none of the taints a fresh Node gets (nothing here
/// would lift the not-ready one).
async fn running(
    c: &Cluster,
    name: &str,
    start: jiff::Timestamp,
    ready_since: jiff::Timestamp,
    ready: bool,
    restarts: i32,
) {
    let r = if ready { "True" } else { "False" };
    c.must(
        "PATCH",
        &format!("/api/v1/namespaces/{NS}/pods/{name}/status"),
        Some(
            &json!({"status": {"phase": "Running", "startTime": ts(start),
            "conditions": [{"type": "Ready", "status": r, "lastTransitionTime": ts(ready_since)}],
            "containerStatuses": [{"name": "c", "image": "busybox", "imageID": "", "ready": ready,
                "restartCount": restarts, "started": true, "state": {"running": {}}}]}}),
        ),
    )
    .await;
}

async fn pods(c: &Cluster) -> Vec<Value> {
    c.must("GET", &format!("/api/v1/namespaces/{NS}/pods"), None)
        .await["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// The names of the pods being deleted.
async fn deleted(c: &Cluster) -> Vec<String> {
    let mut v: Vec<String> = pods(c)
        .await
        .iter()
        .filter(|p| !p["metadata"]["deletionTimestamp"].is_null())
        .map(|p| p["metadata"]["name"].as_str().unwrap().to_owned())
        .collect();
    v.sort();
    v
}

/// Removes every pod at once (grace 0) and every budget, and waits until they are gone.
/// Sleeps until `t` (at once if it has passed).
async fn sleep_until(t: jiff::Timestamp) {
    let now = jiff::Timestamp::now();
    if t > now {
        tokio::time::sleep(t.duration_since(now).unsigned_abs()).await;
    }
}
