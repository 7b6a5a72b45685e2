//! A real Kubernetes control plane for the tests and benchmarks: etcd and kube-apiserver v1.36
//! on loopback, built from the Go module proxy by `testbed/kube.sh` (cached outside the repo),
//! with its own PKI, `--authorization-mode=Node,RBAC`, `--enable-admission-plugins=
//! NodeRestriction` and an audit log the tests read ([`Cluster::audit`]). The test's Node is
//! created by an admin. Optional parts a test asks for: the real kubelet (`kubelet.rs`), the
//! controller manager with chosen controllers and the scheduler (`Cluster::start_*`), a TCP
//! proxy for outages (`proxy.rs`). Self-contained (no reaplet code): the conformance tests and
//! the benchmarks include it by path.
//!
//! Invariants: every process is stopped by PID and the cluster's directory removed when the
//! [`Cluster`] is dropped, also when the test panics; nothing listens beyond 127.0.0.1.

pub mod kubelet;
pub mod pki;
pub mod proc;
pub mod proxy;

use http_body_util::BodyExt;
use pki::{Identity, Pki};
use proc::{Proc, free_port};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Where `testbed/kube.sh` put the binaries (built on first use in this process).
pub fn bin_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        if let Ok(d) = std::env::var("REAPLET_KUBE_BIN_DIR") {
            return PathBuf::from(d);
        }
        let out = std::process::Command::new(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("testbed/kube.sh"),
        )
        .arg("dir")
        .output()
        .expect("run testbed/kube.sh dir");
        assert!(
            out.status.success(),
            "testbed/kube.sh could not provide the Kubernetes components:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
    })
}

pub fn bin(name: &str) -> PathBuf {
    bin_dir().join(name)
}

/// The audit policy: every write with its request body, reads as metadata only; no
/// RequestReceived stage: one record per request, but two for a long-running one (a watch:
/// `ResponseStarted` when it begins, `ResponseComplete` when it ends, one `auditID`), which
/// [`Cluster::audit`] folds into one.
const AUDIT_POLICY: &str = r#"apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
  verbs: ["get", "list", "watch"]
- level: Request
"#;

/// The audit records `records` (in log order) as one per request: a watch's two records (its
/// `ResponseStarted` and its `ResponseComplete`, one `auditID`) are one request, at the place
/// of the first, with the last one's fields (its final status).
pub fn one_per_request(records: &[Value]) -> Vec<Audit> {
    let mut at = std::collections::HashMap::<String, usize>::new();
    let mut out: Vec<Audit> = Vec::new();
    for v in records {
        let id = v["auditID"].as_str().unwrap_or("").to_owned();
        match at.get(&id) {
            Some(&i) if !id.is_empty() => out[i] = Audit::parse(v),
            _ => {
                at.insert(id, out.len());
                out.push(Audit::parse(v));
            }
        }
    }
    out
}

/// One audit record, the fields the tests check.
#[derive(Clone, Debug)]
pub struct Audit {
    pub verb: String,
    pub user: String,
    pub user_agent: String,
    pub resource: String,
    pub subresource: String,
    pub namespace: String,
    pub name: String,
    pub code: u16,
    pub uri: String,
    pub request: Value,
    /// when the server received it (RFC 3339 with microseconds)
    pub received: String,
}

impl Audit {
    /// One line of the audit log, decoded.
    pub fn parse(v: &Value) -> Audit {
        let s = |x: &Value| x.as_str().unwrap_or("").to_owned();
        let o = &v["objectRef"];
        Audit {
            verb: s(&v["verb"]),
            user: s(&v["user"]["username"]),
            user_agent: s(&v["userAgent"]),
            resource: s(&o["resource"]),
            subresource: s(&o["subresource"]),
            namespace: s(&o["namespace"]),
            name: s(&o["name"]),
            code: v["responseStatus"]["code"].as_u64().unwrap_or(0) as u16,
            uri: s(&v["requestURI"]),
            request: v["requestObject"].clone(),
            received: s(&v["requestReceivedTimestamp"]),
        }
    }

    pub fn is_write(&self) -> bool {
        matches!(
            self.verb.as_str(),
            "create" | "update" | "patch" | "delete" | "deletecollection"
        )
    }

    /// `verb resource[/subresource] name code`, for assertions and messages.
    pub fn line(&self) -> String {
        let r = if self.subresource.is_empty() {
            self.resource.clone()
        } else {
            format!("{}/{}", self.resource, self.subresource)
        };
        format!("{} {r} {} {}", self.verb, self.name, self.code)
    }
}

/// What a test wants besides etcd and the API server.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Nodes to create (as admin) and give a client certificate; the first is "the" node.
    pub nodes: Vec<String>,
}

pub struct Cluster {
    // dropped first: the optional components, then the API server, then etcd
    pub controller_manager: Option<Proc>,
    pub scheduler: Option<Proc>,
    pub apiserver: Proc,
    pub etcd: Proc,
    pub pki: Pki,
    pub port: u16,
    pub admin_kubeconfig: PathBuf,
    pub admin: kube::Client,
    pub audit_log: PathBuf,
    pub nodes: Vec<String>,
    // dropped last: every file of the cluster
    pub dir: tempfile::TempDir,
}

impl Cluster {
    /// etcd and the API server, ready, with `nodes` created. Panics with the component's log
    /// when it does not come up within 90 s (a loaded 2-core machine starts it in 5–15 s).
    pub async fn start(opts: Options) -> Cluster {
        let dir = tempfile::Builder::new()
            .prefix("reaplet-kube-")
            .tempdir()
            .unwrap();
        let d = dir.path();
        let pki = Pki::new(&d.join("pki"));
        let (client_port, peer_port, port) = (free_port(), free_port(), free_port());
        let etcd_args: Vec<String> = vec![
            "--name=etcd".into(),
            format!("--data-dir={}", d.join("etcd").display()),
            format!("--listen-client-urls=http://127.0.0.1:{client_port}"),
            format!("--advertise-client-urls=http://127.0.0.1:{client_port}"),
            format!("--listen-peer-urls=http://127.0.0.1:{peer_port}"),
            format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}"),
            format!("--initial-cluster=etcd=http://127.0.0.1:{peer_port}"),
            "--unsafe-no-fsync=true".into(),
            "--log-level=warn".into(),
        ];
        let etcd = Proc::start("etcd", &bin("etcd"), &etcd_args, d);
        let policy = d.join("audit-policy.yaml");
        std::fs::write(&policy, AUDIT_POLICY).unwrap();
        let audit_log = d.join("audit.log");
        let args: Vec<String> = vec![
            format!("--etcd-servers=http://127.0.0.1:{client_port}"),
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            format!("--secure-port={port}"),
            format!("--tls-cert-file={}", pki.serving_cert.display()),
            format!("--tls-private-key-file={}", pki.serving_key.display()),
            format!("--client-ca-file={}", pki.ca.display()),
            "--authorization-mode=Node,RBAC".into(),
            "--enable-admission-plugins=NodeRestriction".into(),
            // as kubeadm sets it: the DaemonSet of deploy/ runs privileged
            "--allow-privileged=true".into(),
            "--disable-admission-plugins=ServiceAccount".into(),
            "--service-account-issuer=https://kubernetes.default.svc".into(),
            format!("--service-account-key-file={}", pki.sa_pub.display()),
            format!(
                "--service-account-signing-key-file={}",
                pki.sa_key.display()
            ),
            "--service-cluster-ip-range=10.96.0.0/24".into(),
            "--endpoint-reconciler-type=none".into(),
            format!("--audit-log-path={}", audit_log.display()),
            format!("--audit-policy-file={}", policy.display()),
            "--audit-log-format=json".into(),
            "--etcd-compaction-interval=1m".into(),
            "--profiling=false".into(),
            "--v=1".into(),
        ];
        let apiserver = Proc::start("kube-apiserver", &bin("kube-apiserver"), &args, d);
        let admin_id = pki.client("admin", &["system:masters"]);
        let url = format!("https://127.0.0.1:{port}");
        let admin_kubeconfig = pki.kubeconfig(&url, &admin_id, &d.join("admin.kubeconfig"));
        let admin = client(&admin_kubeconfig).await;
        let mut cluster = Cluster {
            controller_manager: None,
            scheduler: None,
            apiserver,
            etcd,
            pki,
            port,
            admin_kubeconfig,
            admin,
            audit_log,
            nodes: opts.nodes.clone(),
            dir,
        };
        cluster.wait_ready().await;
        for n in &opts.nodes {
            cluster.create_node(n).await;
        }
        cluster
    }

    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    pub fn addr(&self) -> std::net::SocketAddr {
        format!("127.0.0.1:{}", self.port).parse().unwrap()
    }

    async fn wait_ready(&mut self) {
        let t0 = Instant::now();
        let limit = Duration::from_secs(90);
        loop {
            for p in [&mut self.etcd, &mut self.apiserver] {
                if let Some(st) = p.exited() {
                    panic!("{} exited ({st}) while starting:\n{}", p.name, p.tail(40));
                }
            }
            let ready = self.raw("GET", "/readyz", None, None).await.0 == 200
                && self
                    .raw("GET", "/api/v1/namespaces/kube-node-lease", None, None)
                    .await
                    .0
                    == 200
                && self
                    .raw("GET", "/api/v1/namespaces/default", None, None)
                    .await
                    .0
                    == 200;
            if ready {
                return;
            }
            assert!(
                t0.elapsed() < limit,
                "the API server was not ready within {limit:?}:\n{}",
                self.apiserver.tail(40)
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// An admin request: (code, body as JSON or Null). Connection errors are code 0.
    pub async fn raw(
        &self,
        method: &str,
        path: &str,
        content_type: Option<&str>,
        body: Option<&Value>,
    ) -> (u16, Value) {
        send(&self.admin, method, path, content_type, body).await
    }

    /// An admin request that must succeed (2xx); returns the body.
    pub async fn must(&self, method: &str, path: &str, body: Option<&Value>) -> Value {
        let ct = if method == "PATCH" {
            Some("application/merge-patch+json")
        } else {
            None
        };
        let (code, v) = self.raw(method, path, ct, body).await;
        assert!((200..300).contains(&code), "{method} {path}: {code} {v:#}");
        v
    }

    /// Creates Node `name` as an admin (labels as a kubelet would set them).
    pub async fn create_node(&self, name: &str) -> Value {
        self.must(
            "POST",
            "/api/v1/nodes",
            Some(&json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": {
                    "kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}},
            })),
        )
        .await
    }

    /// A client identity for node `node` (`system:node:<node>` in `system:nodes`).
    pub fn node_identity(&self, node: &str) -> Identity {
        self.pki
            .client(&format!("system:node:{node}"), &["system:nodes"])
    }

    /// A kubeconfig with node `node`'s client certificate, for `server` (the API server's
    /// URL unless a proxy is put in front).
    pub fn node_kubeconfig_for(&self, node: &str, server: &str) -> PathBuf {
        let id = self.node_identity(node);
        // one file per (node, server): the server's host:port names it
        let tag: String = server
            .trim_start_matches("https://")
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        let path = self.dir.path().join(format!("{node}-{tag}.kubeconfig"));
        self.pki.kubeconfig(server, &id, &path)
    }

    pub fn node_kubeconfig(&self, node: &str) -> PathBuf {
        self.node_kubeconfig_for(node, &self.url())
    }

    /// Every audit record so far (the log backend writes each before the answer is sent).
    pub fn audit(&self) -> Vec<Audit> {
        let text = std::fs::read_to_string(&self.audit_log).unwrap_or_default();
        let records: Vec<Value> = text
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .collect();
        one_per_request(&records)
    }

    /// The writes `user` made (in order).
    pub fn writes_by(&self, user: &str) -> Vec<Audit> {
        self.audit()
            .into_iter()
            .filter(|a| a.user == user && a.is_write())
            .collect()
    }

    /// Binds the controller manager's own user to a controller's bootstrap ClusterRole
    /// (`system:controller:<role>`): it acts as itself here, with no service-account credentials.
    pub async fn grant_controller_role(&self, role: &str) {
        self.must(
            "POST",
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
            Some(&serde_json::json!({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": format!("kcm-{role}")},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": format!("system:controller:{role}")},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                    "name": "system:kube-controller-manager"}]})),
        )
        .await;
    }

    /// The controller manager running only `controllers` (e.g. `["taint-eviction-controller"]`).
    pub fn start_controller_manager(&mut self, controllers: &[&str]) {
        let id = self.pki.client("system:kube-controller-manager", &[]);
        let kc = self
            .pki
            .kubeconfig(&self.url(), &id, &self.dir.path().join("kcm.kubeconfig"));
        let args: Vec<String> = vec![
            format!("--kubeconfig={}", kc.display()),
            format!("--authentication-kubeconfig={}", kc.display()),
            format!("--authorization-kubeconfig={}", kc.display()),
            format!("--controllers={}", controllers.join(",")),
            "--leader-elect=false".into(),
            "--use-service-account-credentials=false".into(),
            format!(
                "--service-account-private-key-file={}",
                self.pki.sa_key.display()
            ),
            format!("--root-ca-file={}", self.pki.ca.display()),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={}", free_port()),
            "--v=2".into(),
        ];
        self.controller_manager = Some(Proc::start(
            "kube-controller-manager",
            &bin("kube-controller-manager"),
            &args,
            self.dir.path(),
        ));
    }

    /// The scheduler (default profile).
    pub fn start_scheduler(&mut self) {
        let id = self.pki.client("system:kube-scheduler", &[]);
        let kc = self.pki.kubeconfig(
            &self.url(),
            &id,
            &self.dir.path().join("scheduler.kubeconfig"),
        );
        let args: Vec<String> = vec![
            format!("--kubeconfig={}", kc.display()),
            format!("--authentication-kubeconfig={}", kc.display()),
            format!("--authorization-kubeconfig={}", kc.display()),
            "--leader-elect=false".into(),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={}", free_port()),
            "--v=2".into(),
        ];
        self.scheduler = Some(Proc::start(
            "kube-scheduler",
            &bin("kube-scheduler"),
            &args,
            self.dir.path(),
        ));
    }
}

/// A kube client from a kubeconfig file.
pub async fn client(kubeconfig: &Path) -> kube::Client {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    kube::Client::try_from(cfg).unwrap()
}

/// One request with `client`: (code, body as JSON or Null); 0 when it got no answer in 30 s.
pub async fn send(
    client: &kube::Client,
    method: &str,
    path: &str,
    content_type: Option<&str>,
    body: Option<&Value>,
) -> (u16, Value) {
    let mut b = http::Request::builder().method(method).uri(path);
    let bytes = match body {
        Some(v) => {
            b = b.header("content-type", content_type.unwrap_or("application/json"));
            v.to_string().into_bytes()
        }
        None => Vec::new(),
    };
    let req = b.body(kube::client::Body::from(bytes)).unwrap();
    let fut = async {
        let resp = client.send(req).await.ok()?;
        let code = resp.status().as_u16();
        let bytes = resp.into_body().collect().await.ok()?.to_bytes();
        Some((code, serde_json::from_slice(&bytes).unwrap_or(Value::Null)))
    };
    tokio::time::timeout(Duration::from_secs(30), fut)
        .await
        .ok()
        .flatten()
        .unwrap_or((0, Value::Null))
}
