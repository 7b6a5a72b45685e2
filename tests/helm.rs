//! The Helm chart `deploy/helm/reaplet` (issue 37, item 5), with helm v4 built from the Go
//! module proxy by `testbed/helm.sh`:
//! * its defaults render `deploy/daemonset.yaml` and, for the service-account identity, the
//!   rules of `deploy/rbac.yaml` (one source of truth each: they cannot drift);
//! * on the test bed's real cluster (kube-apiserver, etcd, the controller manager's daemonset,
//!   garbage-collector and root-CA publisher controllers, the scheduler, the real kubelet v1.36
//!   on a private containerd), `helm install` runs reaplet's pod and it answers `/readyz`;
//!   `helm upgrade` to the service-account identity and other resources rolls the pod (the new
//!   one ready through the chart's RBAC); `helm uninstall` removes all it made;
//! * the rolling update replaces a tenth of the nodes' pods at a time (`maxUnavailable: 10%`,
//!   no surge), in the shipped manifest, the chart's values and its rendering, and the real API
//!   server takes it (issue 44);
//! * `reaplet check` against the real API server passes with the chart's RBAC for every mode,
//!   and fails, naming the verb, when the identity lacks what the configured mode uses.
//!
//! Privileged (root, containerd, the kubelet).

mod common;
#[path = "common/lease_watch.rs"]
mod lease_watch;

use common::helm::{HelmOn, chart, find, import_reaplet_image, template};
use common::k8s::Cluster;
use common::kube_node::{KubeNode, NODE, pod, uid};
use common::port::free_port;
use common::{reaplet, row};
use reaplet_testbed::Testbed;
use serde_json::{Value, json};
use std::path::Path;
use std::time::{Duration, Instant};

/// How long the kubelet may take to start a pod on a loaded 2-core machine.
const START: Duration = Duration::from_secs(90);
/// The DaemonSet's terminationGracePeriodSeconds: the old pod's end in a rolling update.
const GRACE: Duration = Duration::from_secs(30);
/// Slack for the controllers' and the API server's round trips on a loaded machine.
const SLACK: Duration = Duration::from_secs(30);

/// The labels helm adds beside the manifest's own.
const HELM_LABELS: &[&str] = &[
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/managed-by",
    "helm.sh/chart",
];

fn strip_helm_labels(mut v: Value) -> Value {
    for at in [
        "/metadata/labels",
        "/spec/selector/matchLabels",
        "/spec/template/metadata/labels",
    ] {
        if let Some(Value::Object(m)) = v.pointer_mut(at) {
            for l in HELM_LABELS {
                m.remove(*l);
            }
        }
    }
    v
}

fn repo_yaml(path: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(common::repo().join(path)).unwrap();
    serde_saphyr::from_multiple::<Value>(&text)
        .unwrap_or_else(|e| panic!("{path} does not parse: {e}"))
        .into_iter()
        .filter(|v| !v.is_null())
        .collect()
}

fn home() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("reaplet-helm-")
        .tempdir()
        .unwrap()
}

#[test]
fn the_charts_defaults_render_the_shipped_daemonset_and_rbac() {
    let h = home();
    let lint = common::helm::must(h.path(), &["lint", chart().to_str().unwrap()]);
    println!("{lint}");
    // node identity (the default): the DaemonSet alone, the manifest's own
    let objects = template(h.path(), &[], &[]);
    assert_eq!(
        objects.iter().map(|o| &o["kind"]).collect::<Vec<_>>(),
        ["DaemonSet"]
    );
    let shipped = repo_yaml("deploy/daemonset.yaml").remove(0);
    let rendered = strip_helm_labels(objects[0].clone());
    assert_eq!(
        rendered, shipped,
        "helm template with the chart's defaults differs from deploy/daemonset.yaml:\n\
         rendered {rendered:#}\nshipped {shipped:#}"
    );
    // the selector keeps helm's instance label (two releases never select each other's pods)
    assert_eq!(
        objects[0]["spec"]["selector"]["matchLabels"]["app.kubernetes.io/instance"],
        "reaplet"
    );
    // the rolling update as rendered: a tenth of the fleet at a time (issue 44)
    assert_rolls_a_tenth_at_a_time(&objects[0], "helm template");

    // the service-account identity: deploy/rbac.yaml's objects and rules
    let sa = template(h.path(), &["identity=serviceAccount"], &[]);
    let rbac = repo_yaml("deploy/rbac.yaml");
    for want in &rbac {
        let (kind, name) = (
            want["kind"].as_str().unwrap(),
            want["metadata"]["name"].as_str().unwrap(),
        );
        let got = find(&sa, kind, name).unwrap_or_else(|| panic!("no {kind} {name} rendered"));
        assert_eq!(
            got["metadata"]["namespace"], want["metadata"]["namespace"],
            "{kind}"
        );
        for field in ["rules", "roleRef", "subjects"] {
            assert_eq!(got[field], want[field], "{kind} {name}: {field}");
        }
    }
    assert_eq!(sa.len(), rbac.len() + 1, "{sa:#?}");
    let ds = find(&sa, "DaemonSet", "reaplet").unwrap();
    let spec = &ds["spec"]["template"]["spec"];
    assert_eq!(spec["serviceAccountName"], "reaplet");
    let args = spec["containers"][0]["args"].to_string();
    assert!(!args.contains("--kubeconfig"), "{args}");
    assert!(
        spec["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["name"] == "api-access"
                && v["projected"]["sources"][0]["serviceAccountToken"]["path"] == "token"),
        "{spec:#}"
    );

    // non-default values reach the flags, the mounts and the probes
    let other = template(
        h.path(),
        &[
            "kubelet.config=/etc/kubernetes/kubelet-config.yaml",
            "kubelet.rootDir=/data/kubelet",
            "runtime.socketDir=/run/crio",
            "runtime.socket=crio.sock",
            "status.port=10999",
            "authority=standby",
            "extraArgs={--takeover-after=60s}",
        ],
        &[],
    );
    let c = &other[0]["spec"]["template"]["spec"]["containers"][0];
    let args: Vec<&str> = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(
        args,
        [
            "run",
            "--kubeconfig=/etc/kubernetes/kubelet.conf",
            "--kubelet-config=/etc/kubernetes/kubelet-config.yaml",
            "--container-runtime-endpoint=unix:///run/crio/crio.sock",
            "--root-dir=/data/kubelet",
            "--authority=standby",
            "--metrics-bind-address=127.0.0.1:10999",
            "--takeover-after=60s",
        ]
    );
    assert_eq!(c["livenessProbe"]["httpGet"]["port"], 10999);
    assert_eq!(c["readinessProbe"]["httpGet"]["port"], 10999);
    let mounts: Vec<(&str, &str)> = c["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["name"].as_str().unwrap(),
                m["mountPath"].as_str().unwrap(),
            )
        })
        .collect();
    assert!(mounts.contains(&("cri", "/run/crio")), "{mounts:?}");
    assert!(mounts.contains(&("kubelet", "/data/kubelet")), "{mounts:?}");
    // a kubelet config outside the root dir is mounted on its own
    assert!(
        mounts.contains(&("kubelet-config", "/etc/kubernetes/kubelet-config.yaml")),
        "{mounts:?}"
    );

    // a value that is not one fails the render, naming it
    for (set, field) in [
        ("identity=both", "identity"),
        ("authority=boss", "authority"),
    ] {
        let chart = chart();
        let (ok, _, err) = common::helm::helm(
            h.path(),
            &["template", "reaplet", chart.to_str().unwrap(), "--set", set],
        );
        assert!(!ok && err.contains(field), "{set}: {err}");
    }
}

/// A DaemonSet's rolling update (issue 44, item 5): `maxUnavailable: 10%` (the API server
/// takes the percentage of the nodes that should run the pod, rounded up: one node of a small
/// cluster, 500 of 5,000), no surge (two pods of one node would share its status port).
/// `maxUnavailable: 1` took 5,000 steps on 5,000 nodes, about a day; 10% takes ten.
fn assert_rolls_a_tenth_at_a_time(ds: &Value, what: &str) {
    let strategy = &ds["spec"]["updateStrategy"];
    assert_eq!(strategy["type"], "RollingUpdate", "{what}: {strategy}");
    let rolling = &strategy["rollingUpdate"];
    let percent: u64 = rolling["maxUnavailable"]
        .as_str()
        .and_then(|v| v.strip_suffix('%'))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{what}: maxUnavailable is no percentage: {strategy}"));
    assert_eq!(percent, 10, "{what}: {strategy}");
    assert_eq!(rolling["maxSurge"], 0, "{what}: {strategy}");
    // the steps of a rollout, the API server's rounding
    let steps = |nodes: u64| nodes.div_ceil((nodes * percent).div_ceil(100));
    assert_eq!(
        [steps(1), steps(3), steps(100), steps(5000)],
        [1, 3, 10, 10],
        "{what}"
    );
}

/// The shipped manifest and the chart's values, as files (no helm needed): the rolling update
/// a fleet can wait for (before: `maxUnavailable: 1`, one node at a time).
#[test]
fn the_shipped_daemonset_and_the_charts_values_roll_a_tenth_at_a_time() {
    let shipped = repo_yaml("deploy/daemonset.yaml").remove(0);
    assert_rolls_a_tenth_at_a_time(&shipped, "deploy/daemonset.yaml");
    let values = repo_yaml("deploy/helm/reaplet/values.yaml").remove(0);
    let ds = json!({"spec": {"updateStrategy": values["updateStrategy"]}});
    assert_rolls_a_tenth_at_a_time(&ds, "the chart's values.yaml");
}

/// The real API server takes the rolling update as shipped and as the chart renders it (a
/// server-side dry run of each DaemonSet), and refuses one that could never progress (0% and
/// no surge): the percentage is validated where it is used.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_server_accepts_the_rolling_update_as_shipped_and_rendered() {
    let cluster = Cluster::start(common::k8s::Options::default()).await;
    let h = home();
    let path = "/apis/apps/v1/namespaces/kube-system/daemonsets?dryRun=All";
    let shipped = repo_yaml("deploy/daemonset.yaml").remove(0);
    let rendered = template(h.path(), &[], &[]).remove(0);
    for (what, ds) in [("shipped", shipped), ("rendered", rendered)] {
        let got = cluster.must("POST", path, Some(&ds)).await;
        assert_rolls_a_tenth_at_a_time(&got, what);
    }
    let mut stuck = repo_yaml("deploy/daemonset.yaml").remove(0);
    stuck["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"] = "0%".into();
    let (code, body) = cluster.raw("POST", path, None, Some(&stuck)).await;
    assert_eq!(code, 422, "{body:#}");
}

/// The DaemonSet's pods of release `reaplet` (not being deleted).
async fn release_pods(n: &KubeNode) -> Vec<Value> {
    let (_, list) = n
        .cluster
        .raw(
            "GET",
            "/api/v1/namespaces/kube-system/pods?labelSelector=app.kubernetes.io%2Finstance%3Dreaplet",
            None,
            None,
        )
        .await;
    list["items"].as_array().cloned().unwrap_or_default()
}

fn is_ready(p: &Value) -> bool {
    p["metadata"]["deletionTimestamp"].is_null()
        && p["status"]["conditions"].as_array().is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
}

/// The release's one pod once it is Ready (its readiness probe, `/readyz`, passed), other than
/// any of `not` (UIDs), within `limit`; every other pod of the release gone.
async fn ready_pod(n: &KubeNode, not: &[String], limit: Duration) -> Value {
    let t0 = Instant::now();
    loop {
        let pods = release_pods(n).await;
        if let [p] = pods.as_slice()
            && is_ready(p)
            && !not.contains(&uid(p))
        {
            return p.clone();
        }
        assert!(
            t0.elapsed() < limit,
            "no single ready pod of the release within {limit:?}: {pods:#?}\n{}",
            n.controller_diagnostics()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A GET on 127.0.0.1:`port`: (status code, body); code 0 while nothing answers.
async fn get(port: u16, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut s) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
        return (0, String::new());
    };
    let req = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
    if s.write_all(req.as_bytes()).await.is_err() {
        return (0, String::new());
    }
    let mut out = String::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_string(&mut out)).await;
    let code = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, out.split("\r\n\r\n").nth(1).unwrap_or("").to_owned())
}

/// Waits until `GET path` on the host's loopback answers 200, within `limit`.
async fn wait_200(port: u16, path: &str, limit: Duration) -> String {
    let t0 = Instant::now();
    loop {
        let (code, body) = get(port, path).await;
        if code == 200 {
            return body;
        }
        assert!(
            t0.elapsed() < limit,
            "127.0.0.1:{port}{path} answered {code} within {limit:?}: {body}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until `path` (an admin GET) answers 404, within `limit`.
async fn wait_404(cluster: &Cluster, path: &str, limit: Duration) {
    let t0 = Instant::now();
    loop {
        let (code, v) = cluster.raw("GET", path, None, None).await;
        if code == 404 {
            return;
        }
        assert!(
            t0.elapsed() < limit,
            "{path} still there after {limit:?}: {code} {v:#}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What the chart makes with the service-account identity (`deploy/rbac.yaml`'s objects).
const RBAC_OBJECTS: &[&str] = &[
    "/api/v1/namespaces/kube-system/serviceaccounts/reaplet",
    "/apis/rbac.authorization.k8s.io/v1/clusterroles/reaplet",
    "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/reaplet",
    "/apis/rbac.authorization.k8s.io/v1/namespaces/kube-node-lease/roles/reaplet",
    "/apis/rbac.authorization.k8s.io/v1/namespaces/kube-node-lease/rolebindings/reaplet",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_installs_upgrades_and_uninstalls_reaplet_on_the_real_kubelet() {
    let mut n = KubeNode::start("helm").await;
    import_reaplet_image(&n.tb);
    for role in [
        "daemon-set-controller",
        "generic-garbage-collector",
        "root-ca-cert-publisher",
    ] {
        n.cluster.grant_controller_role(role).await;
    }
    n.cluster.start_controller_manager(&[
        "daemonset-controller",
        "garbage-collector-controller",
        "root-ca-certificate-publisher-controller",
    ]);
    n.cluster.start_scheduler();
    let h = home();
    let helm = HelmOn {
        cluster: &n.cluster,
        home: h.path().to_owned(),
    };

    // this node's paths (as on a real node, the same inside the pod as outside)
    let port = free_port();
    let kubeconfig = n.cluster.node_kubeconfig(NODE);
    let socket_dir = n.tb.socket.parent().unwrap().to_owned();
    let pki = n.cluster.pki.dir.clone();
    let values = json!({
        "runtime": {
            "socketDir": socket_dir,
            "socket": n.tb.socket.file_name().unwrap().to_str().unwrap(),
        },
        "kubelet": {"rootDir": n.kubelet.root_dir, "config": n.kubelet.config_file},
        "kubeconfig": kubeconfig,
        "status": {"port": port},
        "extraArgs": ["--takeover-after=20s"],
        // the test PKI the node kubeconfig names (a kubeadm node keeps it in the kubelet's dir)
        "extraVolumes": [{"name": "test-pki", "hostPath": {"path": pki, "type": "Directory"}}],
        "extraVolumeMounts": [{"name": "test-pki", "mountPath": pki, "readOnly": true}],
    });
    let file = h.path().join("values.json");
    std::fs::write(&file, values.to_string()).unwrap();
    let chart = chart();
    let (chart, file) = (chart.to_str().unwrap(), file.to_str().unwrap());

    // install: the daemonset controller makes the pod, the kubelet runs it, reaplet is ready
    let t0 = Instant::now();
    let out = helm.must(&["install", "reaplet", chart, "-n", "kube-system", "-f", file]);
    println!("helm install:\n{out}");
    let first = ready_pod(&n, &[], START).await;
    println!(
        "installed: pod {} ready {:?} after helm install",
        first["metadata"]["name"],
        t0.elapsed()
    );
    assert_eq!(first["spec"]["nodeName"], NODE);
    assert_eq!(first["spec"]["priorityClassName"], "system-node-critical");
    let readyz = wait_200(port, "/readyz", SLACK).await;
    println!("/readyz on 127.0.0.1:{port}: 200 {readyz}");
    for p in RBAC_OBJECTS {
        let (code, _) = n.cluster.raw("GET", p, None, None).await;
        assert_eq!(code, 404, "{p}: the node identity installs no RBAC");
    }

    // upgrade: the service-account identity and more CPU; the pod rolls, the new one is
    // ready and follows the Lease through the chart's RBAC (a ServiceAccount may watch it)
    let t0 = Instant::now();
    let host = n.cluster.addr().ip().to_string();
    let api_port = n.cluster.port.to_string();
    let out = helm.must(&[
        "upgrade",
        "reaplet",
        chart,
        "-n",
        "kube-system",
        "-f",
        file,
        "--set",
        "identity=serviceAccount",
        "--set",
        &format!("serviceAccount.apiServer.host={host}"),
        "--set-string",
        &format!("serviceAccount.apiServer.port={api_port}"),
        "--set",
        "resources.requests.cpu=20m",
    ]);
    println!("helm upgrade:\n{out}");
    let second = ready_pod(&n, &[uid(&first)], GRACE + START + SLACK).await;
    println!(
        "upgraded: pod {} ready {:?} after helm upgrade (the old one gone)",
        second["metadata"]["name"],
        t0.elapsed()
    );
    let spec = &second["spec"];
    assert_eq!(spec["serviceAccountName"], "reaplet", "{spec:#}");
    assert_eq!(spec["containers"][0]["resources"]["requests"]["cpu"], "20m");
    for p in RBAC_OBJECTS {
        n.cluster.must("GET", p, None).await;
    }
    wait_200(port, "/readyz", SLACK).await;
    // reaplet spoke as the ServiceAccount: the Lease watch it may hold (standby beside a live
    // kubelet lists no pods)
    let sa_user = "system:serviceaccount:kube-system:reaplet";
    let by_sa: Vec<String> = n
        .cluster
        .audit()
        .into_iter()
        .filter(|a| a.user == sa_user && a.user_agent.starts_with("reaplet/"))
        .map(|a| format!("{} {} {}", a.verb, a.resource, a.code))
        .collect();
    println!("reaplet's requests as {sa_user}: {by_sa:?}");
    assert!(by_sa.iter().any(|l| l == "list leases 200"), "{by_sa:?}");
    assert!(!by_sa.iter().any(|l| l.contains(" pods ")), "{by_sa:?}");

    lease_watch::sa_standby_holds_its_lease_watch_and_takes_nothing_over(&n, port, &second).await;

    // uninstall: the DaemonSet, its pod and the RBAC objects go
    let t0 = Instant::now();
    let out = helm.must(&["uninstall", "reaplet", "-n", "kube-system"]);
    println!("helm uninstall:\n{out}");
    wait_404(
        &n.cluster,
        "/apis/apps/v1/namespaces/kube-system/daemonsets/reaplet",
        SLACK,
    )
    .await;
    for p in RBAC_OBJECTS {
        wait_404(&n.cluster, p, SLACK).await;
    }
    let limit = GRACE + SLACK;
    loop {
        let left = release_pods(&n).await;
        if left.is_empty() {
            break;
        }
        assert!(
            t0.elapsed() < limit,
            "pods left {limit:?} after helm uninstall: {left:#?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!(
        "uninstalled: DaemonSet, pod and RBAC gone {:?} after helm uninstall",
        t0.elapsed()
    );
    let list = helm.must(&["list", "-n", "kube-system", "-q"]);
    assert!(list.trim().is_empty(), "releases left: {list}");
    // nothing answers on the status port any more
    let (code, _) = get(port, "/healthz").await;
    assert_eq!(code, 0, "something still answers on 127.0.0.1:{port}");
}

/// `reaplet check` for node `NODE` against the test bed's containerd, with `kubeconfig` and
/// `flags`: (exit code, stdout).
fn check(tb: &Testbed, root: &Path, kubeconfig: &Path, flags: &[&str]) -> (i32, String) {
    let out = reaplet()
        .arg("check")
        .args(["--hostname-override", NODE])
        .args(["--container-runtime-endpoint", &tb.endpoint()])
        .args(["--cgroup-root", &tb.cgroup_root])
        .arg("--root-dir")
        .arg(root)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        // no kubelet here: nothing to probe (the Lease alone decides)
        .args(["--healthz-port", "0"])
        .args(flags)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// Runs [`check`] until its exit code is `code` (RBAC changes reach the authorizer through
/// its informer, a moment after the write), within `limit`; returns the output.
async fn check_until(code: i32, limit: Duration, f: impl Fn() -> (i32, String)) -> String {
    let t0 = Instant::now();
    loop {
        let (c, out) = f();
        if c == code {
            return out;
        }
        assert!(
            t0.elapsed() < limit,
            "reaplet check exited {c}, not {code}, for {limit:?}:\n{out}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Every mode that adds to the list: standby (auto, the default), both eviction sources, and
/// graceful node shutdown.
const ALL_MODES: &[&str] = &[
    "--enable-taint-manager=true",
    "--enforce-node-affinity=true",
    "--shutdown-grace-period=30s",
    "--shutdown-grace-period-critical-pods=10s",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_fails_naming_what_the_identity_lacks_for_the_configured_mode() {
    let tb = Testbed::start(common::repo(), "helm-check");
    let cluster = Cluster::start(common::k8s::Options {
        nodes: vec![NODE.into()],
    })
    .await;
    let root = tempfile::tempdir().unwrap();
    // a pod bound to the node, so that the pod GET is asked naming it (no kubelet: it stays)
    cluster
        .must(
            "POST",
            "/api/v1/namespaces/default/pods",
            Some(&pod("bound", 1, "sleep 1000")),
        )
        .await;
    // a kubelet registered as the node: its Lease beside its Node (issue 44: `reaplet check`
    // fails on a Node without its Lease, the sign of a kubelet under another name)
    let now = jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%S%.6fZ")
        .to_string();
    cluster
        .must(
            "POST",
            "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
            Some(
                &json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": NODE, "namespace": "kube-node-lease"},
                "spec": {"holderIdentity": NODE, "leaseDurationSeconds": 40, "renewTime": now}}),
            ),
        )
        .await;

    // the chart's RBAC, installed by helm (the DaemonSet it also makes never runs here: no
    // daemonset controller), and a token of its ServiceAccount
    let h = home();
    let helm = HelmOn {
        cluster: &cluster,
        home: h.path().to_owned(),
    };
    let chart = chart();
    helm.must(&[
        "install",
        "reaplet",
        chart.to_str().unwrap(),
        "-n",
        "kube-system",
        "--set",
        "identity=serviceAccount",
    ]);
    let token = cluster
        .must(
            "POST",
            "/api/v1/namespaces/kube-system/serviceaccounts/reaplet/token",
            Some(
                &json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                "spec": {"expirationSeconds": 3600}}),
            ),
        )
        .await["status"]["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let sa_kc = root.path().join("sa.kubeconfig");
    std::fs::write(
        &sa_kc,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {}\n    certificate-authority: {}\nusers:\n- name: reaplet\n  user:\n    token: {token}\ncontexts:\n- name: test\n  context: {{cluster: test, user: reaplet}}\ncurrent-context: test\n",
            cluster.url(),
            cluster.pki.ca.display()
        ),
    )
    .unwrap();
    let sa = |flags: &[&str]| check(&tb, root.path(), &sa_kc, flags);

    // the chart's RBAC: every mode passes, the Lease watched
    let (code, out) = sa(ALL_MODES);
    println!("service account, every mode:\n{out}");
    assert_eq!(code, 0, "{out}");
    let k = row(&out, "kubeconfig");
    assert!(
        k.contains("PASS") && k.contains("permitted to 12 needed verbs"),
        "{out}"
    );
    assert!(!k.contains("not permitted"), "{out}");

    // without the Lease: standby (the default) fails naming it; primary needs none
    cluster
        .must(
            "DELETE",
            "/apis/rbac.authorization.k8s.io/v1/namespaces/kube-node-lease/rolebindings/reaplet",
            None,
        )
        .await;
    let out = check_until(1, SLACK, || sa(&[])).await;
    println!("service account without the Lease, default mode:\n{out}");
    let k = row(&out, "kubeconfig");
    assert!(
        k.contains("FAIL") && k.contains("get leases.coordination.k8s.io (for standby)"),
        "{out}"
    );
    let (code, out) = sa(&["--authority=primary"]);
    assert_eq!(code, 0, "primary reads no Lease:\n{out}");
    assert!(row(&out, "kubeconfig").contains("PASS"), "{out}");

    // without the Eviction API: node affinity fails naming it, unless it only reports
    let mut role = cluster
        .must(
            "GET",
            "/apis/rbac.authorization.k8s.io/v1/clusterroles/reaplet",
            None,
        )
        .await;
    role["rules"]
        .as_array_mut()
        .unwrap()
        .retain(|r| r["resources"] != json!(["pods/eviction"]));
    cluster
        .must(
            "PUT",
            "/apis/rbac.authorization.k8s.io/v1/clusterroles/reaplet",
            Some(&role),
        )
        .await;
    let affinity = ["--authority=primary", "--enforce-node-affinity=true"];
    let out = check_until(1, SLACK, || sa(&affinity)).await;
    println!("service account without pods/eviction, node affinity:\n{out}");
    let k = row(&out, "kubeconfig");
    assert!(
        k.contains("FAIL") && k.contains("create pods/eviction (for node affinity)"),
        "{out}"
    );
    assert!(!k.contains("leases"), "primary asks for no Lease: {out}");
    let (code, out) = sa(&[&affinity[..], &["--eviction-dry-run=true"]].concat());
    assert_eq!(code, 0, "a dry run evicts nothing:\n{out}");

    // the node's own identity: everything every mode uses, the Lease read (not watched)
    let node_kc = cluster.node_kubeconfig(NODE);
    let (code, out) = check(&tb, root.path(), &node_kc, ALL_MODES);
    println!("node identity, every mode:\n{out}");
    assert_eq!(code, 0, "{out}");
    let k = row(&out, "kubeconfig");
    assert!(k.contains("permitted to 12 needed verbs"), "{out}");
    assert!(
        k.contains("not permitted to list leases.coordination.k8s.io, watch leases.coordination.k8s.io: the Lease is read on demand"),
        "{out}"
    );
}
