//! reaplet as the DaemonSet of `deploy/daemonset.yaml` on the real kubelet v1.36 (issue 30,
//! items 2 to 4; privileged: root, a private containerd, a real kube-apiserver, etcd,
//! kube-controller-manager with its daemonset controller and kube-scheduler, all built by
//! `testbed/kube.sh`).
//!
//! The image is built from the release binary by the test bed's image builder
//! (`testbed/testbed.sh reaplet-image target/release/reaplet`; `scripts/test.sh` builds the
//! release binary with the Debian package first) and imported into the node's containerd; no
//! registry. The manifest is the shipped one, with only its host paths re-pointed at this test
//! node's (the CRI socket's directory and the endpoint in it, the kubelet's root dir, the node
//! kubeconfig, reaplet's metrics port and its two probes) and two read-only files added that a
//! kubeadm node keeps inside the mounted directories (the test kubelet's config file and the
//! test PKI the kubeconfig names).
//!
//! One node's story, in order: the daemonset controller creates reaplet's pod, the scheduler
//! binds it, the kubelet runs it; a pod deleted while the kubelet lives is the kubelet's
//! (reaplet writes nothing); the kubelet stops, and a pod deleted right then is ended by
//! reaplet within `takeoverAfter` (plus the kubelet's last renewal period) plus its grace,
//! with its preStop hook and then SIGTERM; the kubelet starts again and reaplet hands back;
//! reaplet's own container ran through all of it. Then the node's containerd restarts under
//! reaplet's pod (issue 37, item 3: containerd creates its socket anew, which a mount of the
//! socket file would never see): reaplet's CRI calls are answered again within seconds and
//! `/readyz` stays 200 past the runtime's 30 s unhealthy threshold, so it was answered after the
//! restart. The kubelet stops again and a TERM-ignoring pod is deleted right then: reaplet takes
//! over and SIGKILLs it at its grace, through the new socket. Then reaplet's own pod is deleted
//! along with another TERM-ignoring one: reaplet ends the other first, writes its own terminal
//! status and deletes its own object, and only then is its own container stopped.

mod common;

use common::k8s::Audit;
use common::kube_node::{KubeNode, NODE, container_id, pod, received_ns, uid};
use common::port::free_port;
use reaplet::cri::Runtime;
use reaplet_testbed::IGNORES_TERM;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long the kubelet may take to start a pod on a loaded 2-core machine.
const START: Duration = Duration::from_secs(90);
/// reaplet's takeover threshold here (the shortest it accepts: two of the kubelet's 10 s
/// renewals), and the kubelet's renewal period (its last renewal was at most that long
/// before it stopped).
const TAKEOVER_AFTER: Duration = Duration::from_secs(20);
const RENEWAL: Duration = Duration::from_secs(10);
/// Slack for reaplet's 2 s probes, the API round trips and a loaded machine.
const SLACK: Duration = Duration::from_secs(15);
/// How long a negative check watches.
const WINDOW: Duration = Duration::from_secs(10);
/// The rescued pod's grace, and its script: the preStop hook's USR1 marks it, SIGTERM then
/// exits 10 + the mark (11: hook first, then SIGTERM; 10: SIGTERM without the hook; 137: a
/// SIGKILL).
const GRACE: i64 = 10;
const HOOKED: &str =
    "h=0; trap 'h=1' USR1; trap 'exit $((10 + h))' TERM; while true; do sleep 0.2; done";
/// The grace of the TERM-ignoring pods (SIGKILL, exit 137, at it).
const SHORT_GRACE: i64 = 5;

/// `deploy/daemonset.yaml` with this node's host paths; the metrics port reaplet and its
/// liveness probe use.
fn daemonset(n: &KubeNode, kubeconfig: &Path) -> (Value, u16) {
    let text = std::fs::read_to_string(common::repo().join("deploy/daemonset.yaml")).unwrap();
    let mut ds: Value = serde_saphyr::from_str(&text).expect("deploy/daemonset.yaml parses");
    let port = free_port();
    let spec = &mut ds["spec"]["template"]["spec"];
    let socket_dir = n.tb.socket.parent().unwrap().display().to_string();
    let root = n.kubelet.root_dir.display().to_string();
    let kc = kubeconfig.display().to_string();
    let kubelet_config = n.kubelet.config_file.display().to_string();
    let pki = n.cluster.pki.dir.display().to_string();
    // the shipped volumes, re-pointed (same path inside as outside, as on a real node)
    let repoint = |name: &str| -> Option<&str> {
        match name {
            "cri" => Some(&socket_dir),
            "kubelet" => Some(&root),
            "kubeconfig" => Some(&kc),
            _ => None,
        }
    };
    let mut seen = Vec::new();
    for v in spec["volumes"].as_array_mut().expect("volumes") {
        let name = v["name"].as_str().unwrap().to_owned();
        if let Some(p) = repoint(&name) {
            v["hostPath"]["path"] = json!(p);
            seen.push(name);
        }
    }
    assert_eq!(seen.len(), 3, "the manifest's volumes changed: {seen:?}");
    // the runtime's socket directory, never the socket file (containerd replaces the file)
    let cri = spec["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "cri")
        .unwrap();
    assert_eq!(cri["hostPath"]["type"], "Directory", "{cri:#}");
    spec["volumes"].as_array_mut().unwrap().extend([
        json!({"name": "test-kubelet-config", "hostPath": {"path": kubelet_config, "type": "File"}}),
        json!({"name": "test-pki", "hostPath": {"path": pki, "type": "Directory"}}),
    ]);
    let c = &mut spec["containers"][0];
    // the endpoint names a socket in the mounted directory, in the shipped manifest too
    let shipped_dir = c["volumeMounts"]
        .as_array()
        .expect("volumeMounts")
        .iter()
        .find(|m| m["name"] == "cri")
        .and_then(|m| m["mountPath"].as_str())
        .expect("the cri mount")
        .to_owned();
    let endpoint = c["args"]
        .as_array()
        .expect("args")
        .iter()
        .filter_map(|a| a.as_str()?.strip_prefix("--container-runtime-endpoint="))
        .next()
        .expect("--container-runtime-endpoint in the args")
        .to_owned();
    assert_eq!(
        Path::new(endpoint.trim_start_matches("unix://")).parent(),
        Some(Path::new(&shipped_dir)),
        "the endpoint {endpoint} is not in the mounted directory {shipped_dir}"
    );
    for m in c["volumeMounts"].as_array_mut().expect("volumeMounts") {
        let name = m["name"].as_str().unwrap().to_owned();
        if let Some(p) = repoint(&name) {
            m["mountPath"] = json!(p);
        }
    }
    c["volumeMounts"].as_array_mut().unwrap().extend([
        json!({"name": "test-kubelet-config", "mountPath": kubelet_config, "readOnly": true}),
        json!({"name": "test-pki", "mountPath": pki, "readOnly": true}),
    ]);
    let mut args: Vec<Value> = c["args"]
        .as_array()
        .expect("args")
        .iter()
        .filter(|a| {
            let a = a.as_str().unwrap_or("");
            !a.starts_with("--kubeconfig=")
                && !a.starts_with("--kubelet-config=")
                && !a.starts_with("--container-runtime-endpoint=")
        })
        .cloned()
        .collect();
    assert_eq!(
        args.len() + 3,
        c["args"].as_array().unwrap().len(),
        "the manifest's args changed: {:#}",
        c["args"]
    );
    args.extend(
        [
            format!("--kubeconfig={kc}"),
            format!("--kubelet-config={kubelet_config}"),
            format!("--container-runtime-endpoint={}", n.tb.endpoint()),
            format!("--root-dir={root}"),
            format!("--kubelet-healthz-url={}", n.kubelet.healthz_url()),
            format!("--metrics-bind-address=127.0.0.1:{port}"),
            format!("--takeover-after={}s", TAKEOVER_AFTER.as_secs()),
        ]
        .map(Value::from),
    );
    c["args"] = Value::Array(args);
    // the probes ask reaplet's default status address (the manifest does not set it)
    let default: std::net::SocketAddr = reaplet::config::DEFAULT_METRICS_ADDRESS.parse().unwrap();
    for probe in ["livenessProbe", "readinessProbe"] {
        let get = &mut c[probe]["httpGet"];
        assert_eq!(get["host"], default.ip().to_string(), "{probe}");
        assert_eq!(get["port"], default.port(), "{probe}");
        get["port"] = json!(port);
    }
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    (ds, port)
}

/// reaplet's pod of the DaemonSet, once the kubelet runs it.
async fn reaplets_pod(n: &KubeNode, limit: Duration) -> Value {
    let t0 = Instant::now();
    loop {
        let (_, list) = n
            .cluster
            .raw(
                "GET",
                "/api/v1/namespaces/kube-system/pods?labelSelector=app.kubernetes.io%2Fname%3Dreaplet",
                None,
                None,
            )
            .await;
        let running = list["items"].as_array().and_then(|ps| {
            ps.iter()
                .find(|p| {
                    p["metadata"]["deletionTimestamp"].is_null()
                        && p["status"]["containerStatuses"][0]["state"]["running"].is_object()
                })
                .cloned()
        });
        if let Some(p) = running {
            return p;
        }
        assert!(
            t0.elapsed() < limit,
            "reaplet's DaemonSet pod not running within {limit:?}: {list:#}\n{}",
            n.controller_diagnostics()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until the kubelet reports reaplet's pod `name` Ready (its readiness probe passed).
async fn wait_pod_ready(n: &KubeNode, name: &str, limit: Duration) -> Duration {
    let t0 = Instant::now();
    loop {
        let p = n
            .cluster
            .must(
                "GET",
                &format!("/api/v1/namespaces/kube-system/pods/{name}"),
                None,
            )
            .await;
        let ready = p["status"]["conditions"].as_array().is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        });
        if ready {
            return t0.elapsed();
        }
        assert!(
            t0.elapsed() < limit,
            "the kubelet did not report reaplet's pod Ready within {limit:?}: {:#}",
            p["status"]
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// One GET on reaplet's status endpoint: (code, body), `None` when nothing answers.
async fn status_get(port: u16, path: &str) -> Option<(u16, String)> {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    tokio::time::timeout(Duration::from_secs(5), reaplet::server::fetch(addr, path))
        .await
        .ok()?
        .ok()
}

/// CRI calls the runtime answered, by reaplet's metrics (calls less errors, every operation).
async fn cri_answers(port: u16) -> u64 {
    let (code, text) = status_get(port, "/metrics")
        .await
        .expect("reaplet's /metrics answers");
    assert_eq!(code, 200, "{text}");
    let sum = |family: &str| -> u64 {
        text.lines()
            .filter(|l| l.starts_with(&format!("{family}{{")))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    };
    sum("reaplet_runtime_operations_total") - sum("reaplet_runtime_operations_errors_total")
}

/// Polls `/readyz` every 250 ms until `stop` fires: how long it watched, and every answer that
/// was not 200.
fn watch_readyz(
    port: u16,
    stop: tokio::sync::oneshot::Receiver<()>,
) -> tokio::task::JoinHandle<(Duration, Vec<String>)> {
    tokio::spawn(async move {
        let t0 = Instant::now();
        let mut bad = Vec::new();
        tokio::pin!(stop);
        loop {
            match status_get(port, "/readyz").await {
                Some((200, _)) => {}
                other => bad.push(format!("{:?} after {:?}", other, t0.elapsed())),
            }
            tokio::select! {
                _ = &mut stop => return (t0.elapsed(), bad),
                _ = tokio::time::sleep(Duration::from_millis(250)) => {}
            }
        }
    })
}

/// The container log the kubelet set up for reaplet's container (containerd keeps writing it
/// while the kubelet is down).
fn container_log(n: &KubeNode, p: &Value) -> PathBuf {
    n.kubelet.dir.join("pod-logs").join(format!(
        "kube-system_{}_{}/reaplet/0.log",
        p["metadata"]["name"].as_str().unwrap(),
        uid(p)
    ))
}

fn occurrences(n: &KubeNode, what: &str) -> usize {
    std::fs::read_to_string(&n.reaplet_log)
        .unwrap_or_default()
        .matches(what)
        .count()
}

/// Waits until reaplet's log says `what` for the `nth` time.
async fn wait_nth(n: &KubeNode, what: &str, nth: usize, limit: Duration) -> Duration {
    let t0 = Instant::now();
    while occurrences(n, what) < nth {
        assert!(
            t0.elapsed() < limit,
            "reaplet did not log {what:?} (#{nth}) within {limit:?}:\n{}",
            n.reaplet_tail(40)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    t0.elapsed()
}

fn exit_code(a: &Audit) -> Option<i64> {
    a.request["status"]["containerStatuses"]
        .as_array()?
        .iter()
        .find_map(|c| c["state"]["terminated"]["exitCode"].as_i64())
}

/// reaplet's writes to pod `name` (in any namespace), as lines.
fn reaplet_lines(n: &KubeNode, name: &str) -> Vec<String> {
    n.reaplet_writes()
        .iter()
        .filter(|a| a.resource == "pods" && a.name == name)
        .map(Audit::line)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemonset_stands_by_on_the_real_kubelet_takes_over_and_ends_itself_last() {
    let mut n = KubeNode::start("ds").await;
    common::helm::import_reaplet_image(&n.tb);
    n.cluster
        .grant_controller_role("daemon-set-controller")
        .await;
    n.cluster
        .start_controller_manager(&["daemonset-controller"]);
    n.cluster.start_scheduler();
    let kubeconfig = n.cluster.node_kubeconfig(NODE);
    let (ds, port) = daemonset(&n, &kubeconfig);
    n.cluster
        .must(
            "POST",
            "/apis/apps/v1/namespaces/kube-system/daemonsets",
            Some(&ds),
        )
        .await;
    let me = reaplets_pod(&n, START).await;
    let my_name = me["metadata"]["name"].as_str().unwrap().to_owned();
    let my_uid = uid(&me);
    let my_container = container_id(&me);
    assert_eq!(me["spec"]["nodeName"], NODE, "{me:#}");
    assert_eq!(me["spec"]["priorityClassName"], "system-node-critical");
    assert!(
        me["spec"]["priority"].as_i64() > Some(1_000_000_000),
        "{me:#}"
    );
    n.reaplet_log = container_log(&n, &me);
    // its readiness probe passes: the runtime answers and the pod sources listed
    let ready = wait_pod_ready(&n, &my_name, START).await;
    println!("reaplet's pod Ready {ready:?} after it ran");
    n.wait_log("a kubelet held the node Lease at start", START)
        .await;
    n.wait_log("reaplet runs in a pod of its own", START).await;
    assert!(
        n.reaplet_tail(400).contains(&my_uid),
        "reaplet did not find its own pod's UID {my_uid}:\n{}",
        n.reaplet_tail(40)
    );
    // its metrics and health on the host's loopback (its liveness probe's port)
    let health = reqwest_get(port, "/healthz").await;
    assert!(health.starts_with("200"), "/healthz: {health}");

    // `reaplet check` inside the pod says what works
    let check =
        n.tb.ctr()
            .args(["tasks", "exec", "--exec-id", "reaplet-check"])
            .arg(&my_container)
            .args(["/usr/bin/reaplet", "check"])
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!(
                "--kubelet-config={}",
                n.kubelet.config_file.display()
            ))
            .arg(format!("--root-dir={}", n.kubelet.root_dir.display()))
            .arg(format!("--hostname-override={NODE}"))
            .arg(format!("--kubelet-healthz-url={}", n.kubelet.healthz_url()))
            .output()
            .expect("ctr tasks exec");
    let check_text = format!(
        "{}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    println!("reaplet check in its pod ({}):\n{check_text}", check.status);
    assert!(
        check.status.success(),
        "reaplet check in the pod failed:\n{check_text}"
    );

    // the pods of the story, run by the kubelet
    let mut alive = pod("alive", GRACE, HOOKED);
    let hook = json!({"preStop": {"exec": {"command": ["sh", "-c", "kill -USR1 1; sleep 1"]}}});
    alive["spec"]["containers"][0]["lifecycle"] = hook.clone();
    let mut rescued = pod("rescued", GRACE, HOOKED);
    rescued["spec"]["containers"][0]["lifecycle"] = hook;
    // a tmpfs the kubelet mounts: reaplet unmounts it from inside its container
    rescued["spec"]["volumes"] = json!([{"name": "scratch", "emptyDir": {"medium": "Memory"}}]);
    rescued["spec"]["containers"][0]["volumeMounts"] =
        json!([{"name": "scratch", "mountPath": "/scratch"}]);
    let last = pod("last", SHORT_GRACE, IGNORES_TERM);
    let stubborn = pod("stubborn", SHORT_GRACE, IGNORES_TERM);
    for b in [&alive, &rescued, &last, &stubborn] {
        n.create(b).await;
    }
    let rescued = n.wait_running("rescued", START).await;
    let last = n.wait_running("last", START).await;
    let stubborn = n.wait_running("stubborn", START).await;
    n.wait_running("alive", START).await;

    // 1. the kubelet lives: a deleted pod is the kubelet's
    let t0 = Instant::now();
    n.delete("alive", None).await;
    let took = n
        .wait_gone("alive", t0, Duration::from_secs(GRACE as u64) + SLACK)
        .await;
    println!("alive: ended by the kubelet {took:?} after the delete");
    tokio::time::sleep(WINDOW).await;
    // (`reaplet check`'s access reviews are creates, and change nothing)
    let w: Vec<String> = n
        .reaplet_writes()
        .iter()
        .filter(|a| a.resource != "selfsubjectaccessreviews")
        .map(Audit::line)
        .collect();
    assert!(w.is_empty(), "reaplet wrote beside a live kubelet: {w:#?}");
    assert!(
        n.pod_writes("kubelet/", "alive")
            .iter()
            .any(|a| a.subresource == "status"),
        "the kubelet did not end `alive`"
    );

    // 2. the kubelet stops; a pod deleted now is reaplet's once it takes over
    n.kubelet.stop();
    let stopped = Instant::now();
    n.delete("rescued", None).await;
    let bound = TAKEOVER_AFTER + RENEWAL + Duration::from_secs(GRACE as u64) + SLACK;
    let took = n.wait_gone("rescued", stopped, bound).await;
    // the takeover's line is read from reaplet's log as it reaches it, which may be after the
    // pod is gone: waited for, not read once (issue 44)
    wait_nth(&n, "ReapletTookOver", 1, SLACK).await;
    let took_over = occurrences(&n, "ReapletTookOver");
    println!("rescued: ended by reaplet {took:?} after the kubelet stopped (bound {bound:?})");
    assert_eq!(took_over, 1, "{}", n.reaplet_tail(40));
    // never before the rule allows: the kubelet's last renewal was at most one period before
    // it stopped, and reaplet waits `takeoverAfter` from the last renewal it saw
    assert!(
        took >= TAKEOVER_AFTER - RENEWAL,
        "ended {took:?} after the stop"
    );
    let w = n.pod_writes("reaplet/", "rescued");
    assert_eq!(
        w.iter().map(Audit::line).collect::<Vec<_>>(),
        ["patch pods/status rescued 200", "delete pods rescued 200"]
    );
    assert_eq!(
        exit_code(&w[0]),
        Some(11),
        "preStop hook, then SIGTERM: {:#}",
        w[0].request
    );
    assert_eq!(w[1].request["preconditions"]["uid"], uid(&rescued));
    // its tmpfs unmounted on the host, its cgroup gone: the Bidirectional mount works
    n.wait_nothing_left(&uid(&rescued), SLACK).await;

    // 3. the kubelet is back: reaplet hands back
    let started = Instant::now();
    n.kubelet.restart().await;
    wait_nth(
        &n,
        "ReapletHandedBack",
        1,
        RENEWAL + SLACK + Duration::from_secs(30),
    )
    .await;
    println!(
        "handed back {:?} after the kubelet started",
        started.elapsed()
    );
    let st = n.client.container_status(&my_container).await.unwrap();
    assert!(
        st.state.may_run(),
        "reaplet's own container stopped: {st:?}"
    );
    let now = n
        .cluster
        .must(
            "GET",
            &format!("/api/v1/namespaces/kube-system/pods/{my_name}"),
            None,
        )
        .await;
    assert_eq!(container_id(&now), my_container, "{now:#}");
    assert_eq!(now["status"]["containerStatuses"][0]["restartCount"], 0);

    // 4. containerd restarts under reaplet's pod: a new socket in the mounted directory
    let (stop_watch, stop_rx) = tokio::sync::oneshot::channel();
    let readiness = watch_readyz(port, stop_rx);
    let restarting = Instant::now();
    tokio::task::block_in_place(|| n.tb.restart_containerd()).expect("containerd restarts");
    let restarted = Instant::now();
    // answers counted from here came from the new containerd (the old one has exited); two
    // of them, so that one surely began after it (reaplet relists every second for a while
    // after its event stream ends)
    let answered = cri_answers(port).await;
    let mut again = answered;
    while again < answered + 2 {
        assert!(
            restarted.elapsed() < SLACK,
            "reaplet's CRI calls not answered within {SLACK:?} of containerd's restart \
             ({} answered before, {again} now); /readyz: {:?}\nreaplet:\n{}",
            answered,
            status_get(port, "/readyz").await,
            n.reaplet_tail(20)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        again = cri_answers(port).await;
    }
    println!(
        "containerd restart took {:?}; reaplet's CRI calls answered again {:?} after it",
        restarted - restarting,
        restarted.elapsed()
    );

    // 5. the kubelet stops; a TERM-ignoring pod deleted now is reaplet's, through the new
    // socket: SIGKILL at its grace
    n.kubelet.stop();
    let stopped = Instant::now();
    let stopped_ns = reaplet::wall_ns();
    n.delete("stubborn", None).await;
    let deleted_ns = reaplet::wall_ns();
    wait_nth(&n, "ReapletTookOver", 2, TAKEOVER_AFTER + RENEWAL + SLACK).await;
    let took_over_ns = reaplet::wall_ns();
    let grace = Duration::from_secs(SHORT_GRACE as u64);
    let bound = TAKEOVER_AFTER + RENEWAL + grace + SLACK;
    let killed = n
        .wait_exited(
            &container_id(&stubborn),
            bound.saturating_sub(stopped.elapsed()),
        )
        .await;
    let secs = |from: i64| (killed.finished_at - from) as f64 / 1e9;
    println!(
        "stubborn: exit {} {:.2}s after its deletion, {:.2}s after reaplet's takeover was seen \
         (grace {grace:?}), {:.2}s after the kubelet stopped (bound {bound:?})",
        killed.exit_code,
        secs(deleted_ns),
        secs(took_over_ns),
        secs(stopped_ns)
    );
    assert_eq!(killed.exit_code, 137, "`stubborn` ignores SIGTERM");
    assert!(killed.finished_at - deleted_ns >= grace.as_nanos() as i64);
    // the whole grace from the kill reaplet began at takeover (seen in its log at most a
    // poll and a log write after it began: a second allowed)
    assert!(
        killed.finished_at - took_over_ns >= (grace - Duration::from_secs(1)).as_nanos() as i64,
        "SIGKILL {:.2}s after the takeover was seen, before the grace",
        secs(took_over_ns)
    );
    n.wait_gone("stubborn", stopped, bound + SLACK).await;
    let w = n.pod_writes("reaplet/", "stubborn");
    assert_eq!(
        w.iter().map(Audit::line).collect::<Vec<_>>(),
        ["patch pods/status stubborn 200", "delete pods stubborn 200"]
    );
    assert_eq!(exit_code(&w[0]), Some(137), "{:#}", w[0].request);
    // readiness held from the restart until the runtime's unhealthy threshold had passed with
    // it: a relist was answered after the restart
    // (reaplet's runtime unhealthy threshold, the kubelet's `maxWaitForContainerRuntime`)
    let unhealthy_after = reaplet::workers::PipelineConfig::default().runtime_unhealthy_after;
    let watch_until = unhealthy_after + Duration::from_secs(5);
    tokio::time::sleep(watch_until.saturating_sub(restarting.elapsed())).await;
    stop_watch.send(()).unwrap();
    let (watched, not_ready) = readiness.await.unwrap();
    println!(
        "/readyz watched for {watched:?} from containerd's restart: {} answers not 200",
        not_ready.len()
    );
    assert!(watched >= watch_until, "{watched:?}");
    assert!(
        not_ready.is_empty(),
        "/readyz not ready after containerd's restart: {not_ready:#?}"
    );

    // 6. reaplet's own pod and another TERM-ignoring one are deleted
    let since = reaplet::wall_ns();
    n.delete("last", None).await;
    n.cluster
        .must(
            "DELETE",
            &format!("/api/v1/namespaces/kube-system/pods/{my_name}"),
            None,
        )
        .await;
    // `last` first: once it is ended and its object gone, reaplet may remove its containers
    // (a finished orphan's sandbox) while it waits for its own workers to settle
    let other = n.wait_exited(&container_id(&last), grace + SLACK).await;
    let mine = n
        .wait_exited(&my_container, grace + SLACK + Duration::from_secs(30))
        .await;
    let own_writes: Vec<Audit> = n
        .reaplet_writes()
        .into_iter()
        .filter(|a| a.resource == "pods" && a.name == my_name && received_ns(a) >= since)
        .collect();
    println!(
        "own pod: {:?}; `last` exited {} at {}, reaplet's container {} at {}",
        own_writes.iter().map(Audit::line).collect::<Vec<_>>(),
        other.exit_code,
        other.finished_at,
        mine.exit_code,
        mine.finished_at
    );
    assert_eq!(
        own_writes.iter().map(Audit::line).collect::<Vec<_>>(),
        [
            format!("patch pods/status {my_name} 200"),
            format!("delete pods {my_name} 200")
        ],
        "{:#?}",
        reaplet_lines(&n, &my_name)
    );
    assert_eq!(own_writes[1].request["preconditions"]["uid"], my_uid);
    assert_eq!(other.exit_code, 137, "`last` ignores SIGTERM");
    assert!(
        received_ns(&own_writes[0]) >= other.finished_at,
        "reaplet's own status was written before `last` stopped"
    );
    assert!(
        mine.finished_at >= received_ns(&own_writes[1]),
        "reaplet's container stopped before its pod's object was deleted"
    );
    assert!(
        n.reaplet_tail(400)
            .contains("stopping its sandboxes (this ends reaplet)"),
        "{}",
        n.reaplet_tail(40)
    );
}

/// A GET on reaplet's metrics listener on the host's loopback: "<code> <body>".
async fn reqwest_get(port: u16, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let t0 = Instant::now();
    loop {
        if let Ok(mut s) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
            let req = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
            if s.write_all(req.as_bytes()).await.is_ok() {
                let mut out = String::new();
                let _ = s.read_to_string(&mut out).await;
                let code = out.split_whitespace().nth(1).unwrap_or("?").to_owned();
                return format!("{code} {}", out.split("\r\n\r\n").nth(1).unwrap_or(""));
            }
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "nothing listens on 127.0.0.1:{port}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
