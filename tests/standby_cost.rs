//! What standby costs beside a live kubelet v1.36 (issue 37, items 1 and 2; privileged: root,
//! a private containerd, a real kube-apiserver with its audit log, etcd, the real kubelet and
//! the controller manager's job controller).
//!
//! One node's story: the kubelet runs some pods; reaplet starts beside it in its default mode
//! (auto: standby, the node's own identity, which may get its Lease but not watch it); both are
//! idle for a window, and the audit log tells what each sent (reaplet: nothing that is a quorum
//! read, and its share of the kubelet's requests is printed); then pods are created and deleted
//! and Jobs complete, all ended by the kubelet: afterwards reaplet keeps nothing of them (its
//! `/pods` lists none, its RSS is printed beside the one before); then the kubelet is stopped,
//! reaplet takes over, and one fresh pod is deleted: the time from the takeover to its
//! SIGTERM is printed (the same with and without the churn before it:
//! `REAPLET_CHURN_PODS=0` runs it without).
//!
//! The same story with the service-account identity (`deploy/rbac.yaml`, a token as `kubectl
//! create token` makes it), which may watch the node Lease: reaplet follows it with one watch
//! (`fieldSelector=metadata.name=<node>`), which the audit log shows held through the whole
//! idle window, and sends nothing else while idle (no read of the Lease, no pod list, no quorum
//! read). The two stories run one after the other (each is a whole node on 2 cores).

mod common;
#[path = "common/lease_watch.rs"]
mod lease_watch;

use common::k8s::Audit;
use common::kube_node::{KubeNode, NODE, container_id, pod, received_ns};
use common::port::free_port;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// How long the kubelet may take to start a pod on a loaded 2-core machine.
const START: Duration = Duration::from_secs(90);
/// How long reaplet may take to list the pods once started.
const LISTED: Duration = Duration::from_secs(30);
/// The idle window.
const IDLE: Duration = Duration::from_secs(60);
/// reaplet's takeover threshold (the shortest it accepts) and the kubelet's renewal period.
const TAKEOVER_AFTER: Duration = Duration::from_secs(20);
const RENEWAL: Duration = Duration::from_secs(10);
const SLACK: Duration = Duration::from_secs(15);
/// A pod that exits 10 on SIGTERM.
const TRAPS_TERM: &str = "trap 'exit 10' TERM; while true; do sleep 0.2; done";

fn churn_pods() -> usize {
    std::env::var("REAPLET_CHURN_PODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60)
}

fn churn_jobs() -> usize {
    std::env::var("REAPLET_CHURN_JOBS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10)
}

/// A GET or LIST not served from the watch cache: no `resourceVersion`, or one other than 0.
fn is_quorum_read(a: &Audit) -> bool {
    if !matches!(a.verb.as_str(), "get" | "list") {
        return false;
    }
    let query = a.uri.split_once('?').map_or("", |(_, q)| q);
    !query
        .split('&')
        .any(|kv| kv == "resourceVersion=0" || kv.starts_with("resourceVersion=0&"))
}

/// Whose credentials reaplet uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Identity {
    /// the node's own client certificate (`system:node:<node>`): may get its Lease, not watch it
    Node,
    /// `deploy/rbac.yaml`'s service account: may list and watch the node Leases
    ServiceAccount,
}

impl Identity {
    fn user(self) -> String {
        match self {
            Identity::Node => format!("system:node:{NODE}"),
            Identity::ServiceAccount => lease_watch::SA_USER.into(),
        }
    }
}

/// The two stories share the machine's 2 cores badly: one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn in_window(a: &Audit, from: i64, to: i64) -> bool {
    let t = received_ns(a);
    t >= from && t < to
}

fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

async fn reaplet_pods(port: u16) -> Value {
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    reaplet::pods_view::fetch(addr)
        .await
        .expect("reaplet's /pods")
}

fn job(name: &str) -> Value {
    json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "backoffLimit": 0,
            "template": {"spec": {
                "nodeName": NODE,
                "hostNetwork": true,
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 1,
                "containers": [{
                    "name": "app", "image": common::kube_node::IMAGE, "imagePullPolicy": "Never",
                    "command": ["sh", "-c", "sleep 1"],
                }],
            }},
        },
    })
}

/// The names of the node's pods in the API that start with `prefix`.
async fn node_pods(n: &KubeNode, prefix: &str) -> Vec<String> {
    let list = n
        .cluster
        .must(
            "GET",
            &format!("/api/v1/namespaces/default/pods?fieldSelector=spec.nodeName%3D{NODE}"),
            None,
        )
        .await;
    list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["metadata"]["name"].as_str())
        .filter(|name| name.starts_with(prefix))
        .map(str::to_owned)
        .collect()
}

/// Waits until no pod of the node is left in the API whose name starts with `prefix`.
async fn wait_no_pods(n: &KubeNode, prefix: &str, limit: Duration) {
    let t0 = Instant::now();
    loop {
        let left = node_pods(n, prefix).await;
        if left.is_empty() {
            return;
        }
        assert!(
            t0.elapsed() < limit,
            "{} pods {prefix}* still in the API after {limit:?}: {left:?}\nkubelet:\n{}",
            left.len(),
            n.kubelet.log_tail(20)
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standby_costs_nearly_nothing_and_keeps_nothing_of_pods_the_kubelet_ends() {
    let _one = ONE_AT_A_TIME.lock().await;
    story(Identity::Node, "sb-cost").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standby_as_the_service_account_holds_one_lease_watch_and_costs_nearly_nothing() {
    let _one = ONE_AT_A_TIME.lock().await;
    story(Identity::ServiceAccount, "sb-cost-sa").await;
}

async fn story(identity: Identity, name: &str) {
    let mut n = KubeNode::start(name).await;
    n.cluster.grant_controller_role("job-controller").await;
    n.cluster.start_controller_manager(&["job-controller"]);
    // ten pods the kubelet runs
    for i in 0..10 {
        n.create(&pod(&format!("idle-{i}"), 5, "sleep 100000"))
            .await;
    }
    for i in 0..10 {
        n.wait_running(&format!("idle-{i}"), START).await;
    }
    let port = free_port();
    let kc = match identity {
        Identity::Node => n.cluster.node_kubeconfig(NODE),
        Identity::ServiceAccount => {
            lease_watch::apply_rbac(&n.cluster).await;
            lease_watch::sa_kubeconfig(&n.cluster, "sa.kubeconfig").await
        }
    };
    let user = identity.user();
    let metrics = format!("127.0.0.1:{port}");
    let cmd = n.reaplet_command_at(&kc, &metrics, &["--takeover-after", "20s"]);
    n.spawn_reaplet(cmd);
    let pid = n.reaplet.as_ref().unwrap().0.id();
    // passive from the start: no pod is listed or watched
    n.wait_log("no pod watch while another agent holds the node", LISTED)
        .await;
    n.wait_log("a kubelet held the node Lease at start", LISTED)
        .await;
    if identity == Identity::ServiceAccount {
        // the Lease watch begins once the Lease is listed
        let t0 = Instant::now();
        while lease_watch::lease_watches(&n.cluster.audit_log, &user, NODE).is_empty() {
            assert!(
                t0.elapsed() < LISTED,
                "no Lease watch of reaplet's within {LISTED:?}; its requests: {:?}\nreaplet:\n{}",
                requests_of(&n, &user),
                n.reaplet_tail(30)
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    // settled: its start-up requests are behind it (the node identity's Lease list is refused,
    // and asked again once, FORBIDDEN_RECHECK later: a restarted server may refuse at first)
    tokio::time::sleep(reaplet::standby::lease::FORBIDDEN_RECHECK + Duration::from_secs(5)).await;

    // 1. the idle window
    let from = reaplet::wall_ns();
    tokio::time::sleep(IDLE).await;
    let to = reaplet::wall_ns();
    let audit = n.cluster.audit();
    let by = |agent: &str| -> Vec<Audit> {
        audit
            .iter()
            .filter(|a| a.user == user && a.user_agent.starts_with(agent))
            .filter(|a| in_window(a, from, to))
            .cloned()
            .collect()
    };
    let ours = by("reaplet/");
    let kubelet: Vec<Audit> = audit
        .iter()
        .filter(|a| a.user == format!("system:node:{NODE}") && a.user_agent.starts_with("kubelet/"))
        .filter(|a| in_window(a, from, to))
        .cloned()
        .collect();
    let quorum: Vec<String> = ours
        .iter()
        .filter(|a| is_quorum_read(a))
        .map(Audit::line)
        .collect();
    println!(
        "idle {IDLE:?} beside the live kubelet, reaplet as {user}: reaplet {} requests, the \
         kubelet {} ({:.3}x); reaplet's quorum reads: {}",
        ours.len(),
        kubelet.len(),
        ours.len() as f64 / kubelet.len().max(1) as f64,
        quorum.len()
    );
    for a in &ours {
        println!("  reaplet: {} {}", a.line(), a.uri);
    }
    assert!(
        quorum.is_empty(),
        "reaplet made quorum reads while idle: {quorum:?}"
    );
    // no read of the Lease (a watch path's re-watch is no read) and no pod list
    assert!(
        !ours
            .iter()
            .any(|a| a.resource == "leases" && a.verb != "watch"),
        "reaplet read the Lease while the kubelet answered healthz: {:?}",
        ours.iter().map(Audit::line).collect::<Vec<_>>()
    );
    assert!(
        !ours.iter().any(|a| a.resource == "pods"),
        "reaplet asked for pods while passive: {:?}",
        ours.iter().map(Audit::line).collect::<Vec<_>>()
    );
    if identity == Identity::ServiceAccount {
        // the watch path: one Lease watch held through the whole window
        let ws = lease_watch::lease_watches(&n.cluster.audit_log, &user, NODE);
        let gaps = lease_watch::uncovered(&ws, from, to);
        println!(
            "reaplet's Lease watches (from the idle window's start):\n{}",
            lease_watch::describe(&ws, from)
        );
        assert!(
            gaps.is_empty(),
            "the Lease was not watched throughout the idle window; gaps (start, length): \
             {gaps:?}\nwatches:\n{}",
            lease_watch::describe(&ws, from)
        );
    }

    // 2. churn: pods created and deleted and Jobs completed, all ended by the kubelet
    let rss_before = rss_kib(pid);
    let (pods, jobs) = (churn_pods(), churn_jobs());
    let t_churn = Instant::now();
    // in batches the kubelet's 110-pod limit allows
    for batch in (0..pods).collect::<Vec<_>>().chunks(50) {
        for i in batch {
            n.create(&pod(&format!("churn-{i}"), 2, "sleep 100000"))
                .await;
        }
        for i in batch {
            n.wait_running(&format!("churn-{i}"), START).await;
        }
        for i in batch {
            n.delete(&format!("churn-{i}"), None).await;
        }
    }
    for j in 0..jobs {
        n.cluster
            .must(
                "POST",
                "/apis/batch/v1/namespaces/default/jobs",
                Some(&job(&format!("job-{j}"))),
            )
            .await;
    }
    wait_no_pods(&n, "churn-", Duration::from_secs(300)).await;
    // the Jobs complete; then they are deleted with their pods (as a TTL would)
    let t0 = Instant::now();
    loop {
        let list = n
            .cluster
            .must("GET", "/apis/batch/v1/namespaces/default/jobs", None)
            .await;
        let done = list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|j| j["status"]["succeeded"].as_i64() == Some(1))
            .count();
        if done == jobs {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(300),
            "{done} of {jobs} Jobs completed"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    for name in node_pods(&n, "job-").await {
        n.delete(&name, None).await;
    }
    wait_no_pods(&n, "job-", Duration::from_secs(120)).await;
    println!(
        "churn: {pods} pods created and deleted, {jobs} Jobs completed, all ended by the kubelet \
         in {:.1?}",
        t_churn.elapsed()
    );
    // a moment for reaplet's relists to see the runtime empty of them
    tokio::time::sleep(Duration::from_secs(15)).await;
    let listed = reaplet_pods(port).await;
    let kept: Vec<String> = listed["pods"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["pod"].as_str())
        .filter(|k| k.contains("/churn-") || k.contains("/job-"))
        .map(str::to_owned)
        .collect();
    let rss_after = rss_kib(pid);
    println!(
        "after the churn reaplet's /pods lists {} of them; RSS {} KiB before, {} KiB after \
         ({:+} KiB)",
        kept.len(),
        rss_before,
        rss_after,
        rss_after as i64 - rss_before as i64
    );
    assert!(
        kept.is_empty(),
        "reaplet keeps pods the kubelet ended: {kept:?}"
    );
    let listed_pods = listed["pods"].as_array().map_or(0, Vec::len);
    assert!(
        listed_pods <= 10,
        "reaplet lists more than the ten idle pods: {listed}"
    );

    // 3. takeover: one fresh pod deleted right after the kubelet stops
    n.create(&pod("fresh", 30, TRAPS_TERM)).await;
    let p = n.wait_running("fresh", START).await;
    let id = container_id(&p);
    n.kubelet.stop();
    let stopped = Instant::now();
    n.delete("fresh", None).await;
    n.wait_log("took over:", TAKEOVER_AFTER + RENEWAL + SLACK)
        .await;
    let took = reaplet::wall_ns();
    let took_after = stopped.elapsed();
    let st = n.wait_exited(&id, Duration::from_secs(30)).await;
    assert_eq!(st.exit_code, 10, "SIGTERM, not SIGKILL: {st:?}");
    let after_takeover = Duration::from_nanos((st.finished_at - took).max(0) as u64);
    println!(
        "takeover {took_after:.1?} after the kubelet stopped; the fresh pod's SIGTERM exit \
         {after_takeover:.3?} after the takeover was logged ({pods} pods and {jobs} Jobs \
         churned before)"
    );
    // the backlog costs at most one read from the watch cache per gone pod (issue 44 item 1:
    // a runtime pod no source lists is ended as an orphan only once a read by name shows its
    // object gone; the kubelet leaves its ended pods' stopped sandboxes in the runtime until
    // its garbage collection): no write, no quorum read, no second read of a pod found gone
    let late: Vec<Audit> = requests_of(&n, &user)
        .into_iter()
        .filter(|a| received_ns(a) >= took)
        .filter(|a| a.name.starts_with("churn-") || a.name.starts_with("job-"))
        .collect();
    let mut per_pod = std::collections::BTreeMap::<&str, usize>::new();
    for a in &late {
        *per_pod.entry(a.name.as_str()).or_default() += 1;
    }
    println!(
        "after the takeover: {} requests for {} gone pods ({:?})",
        late.len(),
        per_pod.len(),
        late.iter()
            .map(|a| format!("{} {}", a.verb, a.code))
            .collect::<std::collections::BTreeSet<_>>()
    );
    let bad: Vec<String> = late
        .iter()
        .filter(|a| a.verb != "get" || is_quorum_read(a))
        .map(|a| format!("{} {}", a.line(), a.uri))
        .collect();
    assert!(
        bad.is_empty(),
        "writes or quorum reads for gone pods after the takeover: {bad:?}"
    );
    let again: Vec<(&str, usize)> = per_pod.into_iter().filter(|(_, k)| *k > 1).collect();
    assert!(
        again.is_empty(),
        "gone pods read more than once after the takeover: {again:?}"
    );

    // 4. acting, idle: what an active reaplet costs the API server with nothing to end, beside
    //    what the live kubelet cost it idle in this run (step 1): the pod watch restarted every
    //    WATCH_TIMEOUT (its idle check, issue 44 item 4), the Lease looked at for the renewal
    //    that hands back (read every poll where the identity may not watch it)
    tokio::time::sleep(Duration::from_secs(10)).await;
    let from = reaplet::wall_ns();
    tokio::time::sleep(IDLE).await;
    let to = reaplet::wall_ns();
    let acting: Vec<Audit> = requests_of(&n, &user)
        .into_iter()
        .filter(|a| in_window(a, from, to))
        .collect();
    let mut by_kind = std::collections::BTreeMap::<String, usize>::new();
    for a in &acting {
        *by_kind
            .entry(format!("{} {}", a.verb, a.resource))
            .or_default() += 1;
    }
    println!(
        "acting, idle {IDLE:?}, reaplet as {user}: {} requests ({:.3}x the live kubelet's {} \
         idle in this run): {by_kind:?}",
        acting.len(),
        acting.len() as f64 / kubelet.len().max(1) as f64,
        kubelet.len()
    );
    let quorum: Vec<String> = acting
        .iter()
        .filter(|a| is_quorum_read(a))
        .map(Audit::line)
        .collect();
    assert!(
        quorum.is_empty(),
        "quorum reads while acting idle: {quorum:?}"
    );
    let watches = by_kind.get("watch pods").copied().unwrap_or(0);
    let restarts = (IDLE.as_secs() / reaplet::api::source::WATCH_TIMEOUT.as_secs()) as usize;
    assert!(
        watches <= restarts + 1,
        "{watches} pod watches in {IDLE:?} (one per {:?} expected)",
        reaplet::api::source::WATCH_TIMEOUT
    );
}

/// Every request of `user`'s with reaplet's User-Agent the server audited.
fn requests_of(n: &KubeNode, user: &str) -> Vec<Audit> {
    n.cluster
        .audit()
        .into_iter()
        .filter(|a| a.user == user && a.user_agent.starts_with("reaplet/"))
        .collect()
}

/// A watch is audited twice (ResponseStarted, then ResponseComplete, one auditID): one
/// request for the counts above. Before, step 4 counted 7 pod watches in a 60 s window where
/// the server had ended one every 15 s (each completed watch counted twice).
#[test]
fn a_watch_audited_at_its_start_and_its_end_is_one_request() {
    let rec = |id: &str, stage: &str, verb: &str, code: u64| {
        json!({"auditID": id, "stage": stage, "verb": verb, "responseStatus": {"code": code},
            "objectRef": {"resource": "pods"}})
    };
    let log = [
        rec("w1", "ResponseStarted", "watch", 200),
        rec("g1", "ResponseComplete", "get", 404),
        rec("w1", "ResponseComplete", "watch", 200),
        rec("w2", "ResponseStarted", "watch", 200),
    ];
    let got: Vec<(String, u16)> = common::k8s::one_per_request(&log)
        .into_iter()
        .map(|a| (a.verb, a.code))
        .collect();
    assert_eq!(
        got,
        [
            ("watch".into(), 200),
            ("get".into(), 404),
            ("watch".into(), 200)
        ]
    );
}
