//! reaplet as the DaemonSet of `deploy/daemonset.yaml` on the real kubelet v1.36 (issue 30,
//! items 2 to 4; privileged: root, a private containerd, a real kube-apiserver, etcd,
//! kube-controller-manager with its daemonset controller and kube-scheduler, all built by
//! `testbed/kube.sh`).
//!
//! The image is built from the release binary by the test bed's image builder
//! (`testbed/testbed.sh reaplet-image target/release/reaplet`; `scripts/test.sh` builds the
//! release binary with the Debian package first) and imported into the node's containerd; no
//! registry. The manifest is the shipped one, with only its host paths re-pointed at this test
//! node's (the CRI socket, the kubelet's root dir, the node kubeconfig, reaplet's metrics port
//! and its liveness probe) and two read-only files added that a kubeadm node keeps inside the
//! mounted directories (the test kubelet's config file and the test PKI the kubeconfig names).
//!
//! One node's story, in order: the daemonset controller creates reaplet's pod, the scheduler
//! binds it, the kubelet runs it; a pod deleted while the kubelet lives is the kubelet's
//! (reaplet writes nothing); the kubelet stops, and a pod deleted right then is ended by
//! reaplet within `takeoverAfter` (plus the kubelet's last renewal period) plus its grace,
//! with its preStop hook and then SIGTERM; the kubelet starts again and reaplet hands back;
//! reaplet's own container ran through all of it. Then the kubelet stops again and reaplet's
//! own pod is deleted along with a TERM-ignoring one: reaplet ends the other first, writes its
//! own terminal status and deletes its own object, and only then is its own container stopped.

mod common;

use common::k8s::Audit;
use common::kube_node::{KubeNode, NODE, container_id, pod, received_ns, uid};
use common::port::free_port;
use reaplet::cri::Runtime;
use reaplet::testbed::IGNORES_TERM;
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

/// The release binary this test puts in the image.
fn release_binary() -> PathBuf {
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let bin = tmp
        .parent()
        .expect("the target dir")
        .join("release/reaplet");
    assert!(
        bin.exists(),
        "\n\n*** {} is missing: this test runs reaplet's release binary in its image. \
         scripts/test.sh builds it (with the Debian package); by hand: \
         cargo build --release --locked ***\n",
        bin.display()
    );
    bin
}

/// Builds (or finds up to date) the image and imports it into the node's containerd.
fn import_image(n: &KubeNode) {
    let repo = common::repo();
    let out = std::process::Command::new("bash")
        .arg(repo.join("testbed/testbed.sh"))
        .arg("reaplet-image")
        .arg(release_binary())
        .output()
        .expect("running testbed/testbed.sh reaplet-image");
    assert!(
        out.status.success(),
        "building the image failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tar = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let out = std::process::Command::new("ctr")
        .arg("--address")
        .arg(&n.tb.socket)
        .args([
            "-n",
            "k8s.io",
            "images",
            "import",
            "--snapshotter",
            "overlayfs",
        ])
        .arg(&tar)
        .output()
        .expect("running ctr");
    assert!(
        out.status.success(),
        "importing {tar}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `deploy/daemonset.yaml` with this node's host paths; the metrics port reaplet and its
/// liveness probe use.
fn daemonset(n: &KubeNode, kubeconfig: &Path) -> (Value, u16) {
    let text = std::fs::read_to_string(common::repo().join("deploy/daemonset.yaml")).unwrap();
    let mut ds: Value = serde_saphyr::from_str(&text).expect("deploy/daemonset.yaml parses");
    let port = free_port();
    let spec = &mut ds["spec"]["template"]["spec"];
    let socket = n.tb.socket.display().to_string();
    let root = n.kubelet.root_dir.display().to_string();
    let kc = kubeconfig.display().to_string();
    let kubelet_config = n.kubelet.config_file.display().to_string();
    let pki = n.cluster.pki.dir.display().to_string();
    // the shipped volumes, re-pointed (same path inside as outside, as on a real node)
    let repoint = |name: &str| -> Option<&str> {
        match name {
            "cri" => Some(&socket),
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
    spec["volumes"].as_array_mut().unwrap().extend([
        json!({"name": "test-kubelet-config", "hostPath": {"path": kubelet_config, "type": "File"}}),
        json!({"name": "test-pki", "hostPath": {"path": pki, "type": "Directory"}}),
    ]);
    let c = &mut spec["containers"][0];
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
            !a.starts_with("--kubeconfig=") && !a.starts_with("--kubelet-config=")
        })
        .cloned()
        .collect();
    assert_eq!(
        args.len() + 2,
        c["args"].as_array().unwrap().len(),
        "the manifest's args changed: {:#}",
        c["args"]
    );
    args.extend(
        [
            format!("--kubeconfig={kc}"),
            format!("--kubelet-config={kubelet_config}"),
            format!("--root-dir={root}"),
            format!("--kubelet-healthz-url={}", n.kubelet.healthz_url()),
            format!("--metrics-bind-address=127.0.0.1:{port}"),
            format!("--takeover-after={}s", TAKEOVER_AFTER.as_secs()),
        ]
        .map(Value::from),
    );
    c["args"] = Value::Array(args);
    c["livenessProbe"]["httpGet"]["port"] = json!(port);
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
            "reaplet's DaemonSet pod not running within {limit:?}: {list:#}\nkubelet:\n{}\ncontroller manager:\n{}",
            n.kubelet.log_grep(&["E1", "W1", "reaplet"], 40),
            n.cluster
                .controller_manager
                .as_ref()
                .map(|p| p.tail(30))
                .unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
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
    import_image(&n);
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
    let check = std::process::Command::new("ctr")
        .arg("--address")
        .arg(&n.tb.socket)
        .args([
            "-n",
            "k8s.io",
            "tasks",
            "exec",
            "--exec-id",
            "reaplet-check",
        ])
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
    let last = pod("last", 5, IGNORES_TERM);
    for b in [&alive, &rescued, &last] {
        n.create(b).await;
    }
    let rescued = n.wait_running("rescued", START).await;
    let last = n.wait_running("last", START).await;
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

    // 4. the kubelet stops again; reaplet's own pod and a TERM-ignoring one are deleted
    n.kubelet.stop();
    wait_nth(&n, "ReapletTookOver", 2, TAKEOVER_AFTER + RENEWAL + SLACK).await;
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
    let other = n
        .wait_exited(&container_id(&last), Duration::from_secs(5) + SLACK)
        .await;
    let mine = n
        .wait_exited(
            &my_container,
            Duration::from_secs(5) + SLACK + Duration::from_secs(30),
        )
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
