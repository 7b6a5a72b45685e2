//! reaplet's test bed, the Rust side (no kubelet counterpart; they do what the kubelet's
//! `SyncPod` does when it starts a pod, so tests, benchmarks and the demo can create pods the
//! way a real node has them).
//!
//! * [`Testbed`] runs a private containerd through `testbed/testbed.sh` (own socket, state,
//!   and cgroup root) and tears it down on drop: pods first, then containerd, then cgroups.
//! * [`launch`] creates a pod through CRI like the kubelet: sandbox metadata and labels, log
//!   directory, cgroup parent by QoS class (in the test bed's driver naming), namespace options
//!   on the sandbox and the same options on every container, the kubelet's container labels and
//!   annotations (grace, preStop handler JSON, restart count), sidecars started first.
//!
//! * [`demo`]: the demo `scripts/demo.sh` runs (the `reaplet-demo` binary).
//! * [`Accel`] ([`accel`]): how the VM test's qemu runs its guest, KVM or TCG.
//!
//! Invariant: nothing here is used by the agent itself: it is a crate of its own, beside
//! reaplet's (`reaplet` depends on it only for its tests and benchmarks), so `src/` holds the
//! agent alone and no release build compiles it.

pub mod accel;
pub mod demo;

pub use accel::{ACCEL_ENV, Accel, KVM_DEVICE, probe_kvm};

use reaplet::cgroups::{CgroupDriver, CgroupNaming};
use reaplet::cri::{self, CriClient, CriConfig, pb};
use reaplet::pod::{PodInfo, PodUid, QosClass};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

pub const BUSYBOX_IMAGE: &str = "reaplet.test/busybox:latest";

/// A private containerd. Dropping it stops it and cleans everything up.
#[derive(Debug)]
pub struct Testbed {
    pub dir: PathBuf,
    pub socket: PathBuf,
    /// The cgroup root test pods go below (`/reaplet-tb-<name>`), in every hierarchy.
    pub cgroup_root: String,
    /// How pod cgroups are named (cgroupfs for the private containerd here; the VM test's
    /// containerd uses the systemd driver).
    pub driver: CgroupDriver,
    /// The script that started it; `None` for an attached instance (left running on drop).
    script: Option<PathBuf>,
    /// An exclusive lock on `/tmp/reaplet-tb-<name>.lock`, held while this instance lives and
    /// released after its stop: test binaries run side by side (scripts/test.sh), and one that
    /// used the same name must not stop or share another's containerd.
    _lock: Option<std::fs::File>,
}

impl Testbed {
    /// Starts a private containerd named `name` using the script in `repo/testbed/`.
    /// Panics with a clear message when it cannot (not root, packages missing).
    pub fn start(repo: &Path, name: &str) -> Testbed {
        // SAFETY-free check of the effective uid through /proc (no libc call needed)
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let euid = status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .unwrap_or("?");
        assert!(
            euid == "0",
            "\n\n*** reaplet integration tests need root (containerd, cgroups, mounts); \
             euid is {euid}. Run them as root (CI does). ***\n"
        );
        let dir = PathBuf::from(format!("/tmp/reaplet-tb-{name}"));
        let cgroup_root = format!("/reaplet-tb-{name}");
        let script = repo.join("testbed/testbed.sh");
        let lock_path = format!("/tmp/reaplet-tb-{name}.lock");
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .and_then(|f| f.lock().map(|()| f))
            .unwrap_or_else(|e| panic!("test bed {name}: locking {lock_path}: {e}"));
        let tb = Testbed {
            socket: dir.join("containerd.sock"),
            dir,
            cgroup_root,
            driver: CgroupDriver::Cgroupfs,
            script: Some(script),
            _lock: Some(lock),
        };
        // a previous run that was killed may have left this instance behind (the lock says no
        // live process has it)
        let _ = tb.run("stop");
        let out = tb.run("start").expect("running testbed/testbed.sh");
        assert!(
            out.status.success(),
            "\n\n*** the containerd test bed did not start: {}\n{} ***\n",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        // which runtime the test ran on (containerd 2.x, or Debian's 1.6 for the compatibility
        // job), in the test's output
        let said = String::from_utf8_lossy(&out.stderr);
        if let Some(line) = said.lines().find(|l| l.contains("starting containerd")) {
            println!("{name}: {line}");
        }
        tb
    }

    /// Uses an instance started elsewhere (`testbed.sh start`); dropping it leaves it running.
    pub fn attach(dir: PathBuf, cgroup_root: String) -> Testbed {
        Testbed {
            socket: dir.join("containerd.sock"),
            dir,
            cgroup_root,
            driver: CgroupDriver::Cgroupfs,
            script: None,
            _lock: None,
        }
    }

    /// Another socket (a system containerd's) and cgroup driver for an attached instance;
    /// `dir` still holds the pod logs.
    pub fn with_runtime(mut self, socket: PathBuf, driver: CgroupDriver) -> Testbed {
        self.socket = socket;
        self.driver = driver;
        self
    }

    fn run(&self, cmd: &str) -> std::io::Result<std::process::Output> {
        let Some(script) = &self.script else {
            return Err(std::io::Error::other("attached test bed: not managed here"));
        };
        Command::new("bash")
            .arg(script)
            .arg(cmd)
            .env("REAPLET_TESTBED_DIR", &self.dir)
            .env("REAPLET_TESTBED_CGROUP_ROOT", &self.cgroup_root)
            .output()
    }

    /// Stops containerd alone (its pods' shims keep running) and starts it again, as a node's
    /// containerd upgrade or crash does.
    pub fn restart_containerd(&self) -> Result<(), String> {
        let out = self.run("restart").map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    /// The kubelet's endpoint form for this instance.
    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    pub fn client(&self) -> CriClient {
        CriClient::new(&CriConfig {
            endpoint: self.endpoint(),
            request_timeout: Duration::from_secs(120),
        })
        .expect("test bed endpoint is valid")
    }

    pub fn naming(&self) -> CgroupNaming {
        CgroupNaming::new(self.driver, &self.cgroup_root).expect("valid cgroup root")
    }

    /// The instance's own `ctr` (the runtime's version: `testbed.sh` links its directory as
    /// `bin` in the test bed's directory; the `ctr` on PATH for an attached instance), on its
    /// socket, in the Kubernetes namespace `k8s.io`.
    pub fn ctr(&self) -> Command {
        let own = self.dir.join("bin/ctr");
        let mut c = Command::new(if own.exists() {
            own
        } else {
            PathBuf::from("ctr")
        });
        c.arg("--address").arg(&self.socket).args(["-n", "k8s.io"]);
        c
    }

    /// The container event source the runtime offers, and its version: CRI
    /// `GetContainerEvents` from containerd 1.7 on (the test bed's 2.x), containerd's own
    /// events service on 1.6 (the compatibility job's; its CRI answers UNIMPLEMENTED).
    pub async fn offered_event_source(&self) -> (cri::EventSource, String) {
        use cri::Runtime;
        let v = self.client().version().await.expect("runtime version");
        let v = v.runtime_version;
        let source = if v.trim_start_matches('v').starts_with("1.6.") {
            cri::EventSource::ContainerdEvents
        } else {
            cri::EventSource::Cri
        };
        (source, v)
    }

    /// containerd's log, for failure messages.
    pub fn containerd_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("containerd.log")).unwrap_or_default()
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        if self.script.is_none() {
            return;
        }
        match self.run("stop") {
            Ok(o) if o.status.success() => {}
            Ok(o) => eprintln!(
                "testbed stop failed: {}",
                String::from_utf8_lossy(&o.stderr)
            ),
            Err(e) => eprintln!("testbed stop failed: {e}"),
        }
    }
}

/// One container of a test pod.
#[derive(Debug, Clone)]
pub struct ContainerTemplate {
    pub name: String,
    /// Run with `/bin/sh -c`.
    pub script: String,
    /// The preStop handler as the API has it (`v1.LifecycleHandler` JSON).
    pub pre_stop: Option<serde_json::Value>,
}

impl ContainerTemplate {
    pub fn new(name: &str, script: &str) -> Self {
        Self {
            name: name.into(),
            script: script.into(),
            pre_stop: None,
        }
    }

    pub fn pre_stop(mut self, handler: serde_json::Value) -> Self {
        self.pre_stop = Some(handler);
        self
    }
}

/// A container script that stops at once, with exit 0, on SIGTERM.
pub const TRAPS_TERM: &str = "trap 'exit 0' TERM; sleep 3600 & wait $!";
/// A container script that ignores SIGTERM (as PID 1 with no handler).
pub const IGNORES_TERM: &str = "exec sleep 3600";

/// The real-stack tests' pod object: one container `app` of the test bed's busybox running
/// `script`, bound to `node`, on the host network, with its own grace (what the admin creates
/// for the real kubelet to run).
pub fn host_network_pod(node: &str, name: &str, grace: i64, script: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": node,
            "hostNetwork": true,
            "terminationGracePeriodSeconds": grace,
            "containers": [{
                "name": "app", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                "command": ["sh", "-c", script],
            }],
        },
    })
}

/// A test pod.
#[derive(Debug, Clone)]
pub struct PodTemplate {
    pub name: String,
    pub namespace: String,
    pub uid: String,
    /// `spec.terminationGracePeriodSeconds`.
    pub grace: i64,
    pub restart_policy: &'static str,
    /// Decides the cgroup parent (and the resources in the API object).
    pub qos: QosClass,
    pub containers: Vec<ContainerTemplate>,
    /// Restartable init containers, in declaration order.
    pub sidecars: Vec<ContainerTemplate>,
    /// The sandbox's annotations (the kubelet passes the pod's annotations on).
    pub sandbox_annotations: Vec<(String, String)>,
    /// `spec.priority` (`None`: left out, as for a pod created without a priority class).
    pub priority: Option<i32>,
}

static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A fresh UUID-shaped pod UID.
pub fn new_uid() -> String {
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos() as u64;
    let r: u64 = rand::random();
    format!(
        "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
        (t >> 32) as u32,
        (t >> 16) as u16,
        (n & 0xfff) as u16,
        (r & 0xfff) as u16,
        (r >> 16) & 0xffff_ffff_ffff
    )
}

impl PodTemplate {
    pub fn new(name: &str, grace: i64) -> Self {
        Self {
            name: name.into(),
            namespace: "default".into(),
            uid: new_uid(),
            grace,
            restart_policy: "Always",
            qos: QosClass::BestEffort,
            containers: Vec::new(),
            sidecars: Vec::new(),
            sandbox_annotations: vec![("kubernetes.io/config.source".into(), "api".into())],
            priority: None,
        }
    }

    /// With `spec.priority`.
    pub fn priority(mut self, p: i32) -> Self {
        self.priority = Some(p);
        self
    }

    /// A static pod as the kubelet runs it from its manifest directory
    /// (`pkg/kubelet/config/common.go`): named `<name>-<node>`, its UID the config hash, and
    /// the `kubernetes.io/config.source: file`, `config.hash` and `config.seen` annotations.
    pub fn kubelet_static(name: &str, node: &str, grace: i64) -> Self {
        let hash = new_uid().replace('-', "");
        let mut t = Self::new(&format!("{name}-{node}"), grace);
        t.namespace = "kube-system".into();
        t.uid = hash.clone();
        t.sandbox_annotations = vec![
            ("kubernetes.io/config.source".into(), "file".into()),
            ("kubernetes.io/config.hash".into(), hash),
            (
                "kubernetes.io/config.seen".into(),
                "2026-11-23T12:00:00.000000000Z".into(),
            ),
        ];
        t
    }

    /// The mirror pod the kubelet creates in the API for a static pod: another UID (the
    /// server's), the `kubernetes.io/config.mirror` annotation carrying the config hash, and
    /// the static pod's own annotations.
    pub fn mirror_object(&self) -> serde_json::Value {
        let mut v = self.api_object();
        v["metadata"]["uid"] = new_uid().into();
        let mut ann: serde_json::Map<String, serde_json::Value> = self
            .sandbox_annotations
            .iter()
            .map(|(k, val)| (k.clone(), val.clone().into()))
            .collect();
        ann.insert(
            "kubernetes.io/config.mirror".into(),
            self.uid.clone().into(),
        );
        v["metadata"]["annotations"] = ann.into();
        v
    }

    pub fn container(mut self, c: ContainerTemplate) -> Self {
        self.containers.push(c);
        self
    }

    pub fn sidecar(mut self, c: ContainerTemplate) -> Self {
        self.sidecars.push(c);
        self
    }

    /// The API object this pod would have (host network, resources for its QoS class).
    pub fn api_object(&self) -> serde_json::Value {
        let c = |t: &ContainerTemplate, sidecar: bool| {
            let mut v = serde_json::json!({
                "name": t.name, "image": BUSYBOX_IMAGE,
                "command": ["/bin/sh", "-c", t.script],
            });
            if let Some(h) = &t.pre_stop {
                v["lifecycle"] = serde_json::json!({ "preStop": h });
            }
            if sidecar {
                v["restartPolicy"] = "Always".into();
            }
            match self.qos {
                QosClass::Guaranteed => {
                    v["resources"] =
                        serde_json::json!({"limits": {"cpu": "100m", "memory": "64Mi"}})
                }
                QosClass::Burstable => {
                    v["resources"] = serde_json::json!({"requests": {"cpu": "10m"}})
                }
                QosClass::BestEffort => {}
            }
            v
        };
        let qos = match self.qos {
            QosClass::Guaranteed => "Guaranteed",
            QosClass::Burstable => "Burstable",
            QosClass::BestEffort => "BestEffort",
        };
        let mut pod = serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": self.name, "namespace": self.namespace, "uid": self.uid},
            "spec": {
                "nodeName": "testnode",
                "hostNetwork": true,
                "restartPolicy": self.restart_policy,
                "terminationGracePeriodSeconds": self.grace,
                "initContainers": self.sidecars.iter().map(|t| c(t, true)).collect::<Vec<_>>(),
                "containers": self.containers.iter().map(|t| c(t, false)).collect::<Vec<_>>(),
            },
            "status": {"phase": "Running", "qosClass": qos}
        });
        if let Some(p) = self.priority {
            pod["spec"]["priority"] = p.into();
        }
        pod
    }

    /// What the pipeline is fed for this pod (through the real API-object conversion).
    pub fn pod_info(&self) -> PodInfo {
        let pod: k8s_openapi::api::core::v1::Pod =
            serde_json::from_value(self.api_object()).expect("template is a valid pod");
        PodInfo::from_api(&pod).expect("template converts")
    }

    /// The same pod with `metadata.deletionTimestamp` set and `deletionGracePeriodSeconds`.
    pub fn deleted(&self, deletion_grace: i64) -> PodInfo {
        let mut p = self.pod_info();
        p.deletion_requested = true;
        p.deletion_grace = Some(deletion_grace);
        p
    }
}

/// A pod created in the runtime.
#[derive(Debug, Clone)]
pub struct LaunchedPod {
    pub uid: PodUid,
    pub sandbox_id: String,
    /// (container name, container id)
    pub containers: Vec<(String, String)>,
}

impl LaunchedPod {
    pub fn container_id(&self, name: &str) -> &str {
        &self
            .containers
            .iter()
            .find(|(n, _)| n == name)
            .expect("container exists")
            .1
    }
}

fn ns_options() -> pb::NamespaceOption {
    pb::NamespaceOption {
        network: pb::NamespaceMode::Node as i32,
        pid: pb::NamespaceMode::Container as i32,
        ipc: pb::NamespaceMode::Pod as i32,
        ..Default::default()
    }
}

/// Creates and starts `t` through CRI as the kubelet would.
pub async fn launch(
    tb: &Testbed,
    t: &PodTemplate,
) -> Result<LaunchedPod, Box<dyn std::error::Error + Send + Sync>> {
    let mut client = tb.client().raw();
    let uid = PodUid::parse(&t.uid)?;
    let labels: HashMap<String, String> = [
        (cri::LABEL_POD_NAME, t.name.as_str()),
        (cri::LABEL_POD_NAMESPACE, t.namespace.as_str()),
        (cri::LABEL_POD_UID, t.uid.as_str()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    let log_dir = tb.dir.join("logs").join(&t.uid);
    std::fs::create_dir_all(&log_dir)?;
    let parent = Path::new("/").join(tb.naming().pod_cgroup(&uid, t.qos));
    let sandbox_config = pb::PodSandboxConfig {
        metadata: Some(pb::PodSandboxMetadata {
            name: t.name.clone(),
            uid: t.uid.clone(),
            namespace: t.namespace.clone(),
            attempt: 0,
        }),
        // host network: the UTS namespace is the node's, so no hostname is set
        log_directory: log_dir.display().to_string(),
        labels: labels.clone(),
        annotations: t.sandbox_annotations.iter().cloned().collect(),
        linux: Some(pb::LinuxPodSandboxConfig {
            cgroup_parent: parent.display().to_string(),
            security_context: Some(pb::LinuxSandboxSecurityContext {
                namespace_options: Some(ns_options()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let sandbox_id = client
        .run_pod_sandbox(pb::RunPodSandboxRequest {
            config: Some(sandbox_config.clone()),
            runtime_handler: String::new(),
        })
        .await?
        .into_inner()
        .pod_sandbox_id;
    let mut containers = Vec::new();
    for ct in t.sidecars.iter().chain(&t.containers) {
        let mut clabels = labels.clone();
        clabels.insert(cri::LABEL_CONTAINER_NAME.into(), ct.name.clone());
        let mut ann: HashMap<String, String> = HashMap::new();
        ann.insert(cri::ANNOTATION_GRACE.into(), t.grace.to_string());
        ann.insert(cri::ANNOTATION_RESTART_COUNT.into(), "0".into());
        if let Some(h) = &ct.pre_stop {
            ann.insert(cri::ANNOTATION_PRESTOP.into(), h.to_string());
        }
        let config = pb::ContainerConfig {
            metadata: Some(pb::ContainerMetadata {
                name: ct.name.clone(),
                attempt: 0,
            }),
            image: Some(pb::ImageSpec {
                image: BUSYBOX_IMAGE.into(),
                ..Default::default()
            }),
            command: vec!["/bin/sh".into(), "-c".into(), ct.script.clone()],
            log_path: format!("{}/0.log", ct.name),
            labels: clabels,
            annotations: ann,
            linux: Some(pb::LinuxContainerConfig {
                resources: Some(pb::LinuxContainerResources::default()),
                security_context: Some(pb::LinuxContainerSecurityContext {
                    namespace_options: Some(ns_options()),
                    ..Default::default()
                }),
            }),
            ..Default::default()
        };
        let id = client
            .create_container(pb::CreateContainerRequest {
                pod_sandbox_id: sandbox_id.clone(),
                config: Some(config),
                sandbox_config: Some(sandbox_config.clone()),
            })
            .await?
            .into_inner()
            .container_id;
        client
            .start_container(pb::StartContainerRequest {
                container_id: id.clone(),
            })
            .await?;
        containers.push((ct.name.clone(), id));
    }
    Ok(LaunchedPod {
        uid,
        sandbox_id,
        containers,
    })
}
