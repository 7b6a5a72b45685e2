//! The real kubelet v1.36 on the test bed's containerd: the `cgroupfs` driver under the test
//! bed's own cgroup root, its own root dir, pod log dir and `staticPodPath`, its healthz and API
//! on loopback, authenticating as `system:node:<node>`. It creates and runs pods exactly as on a
//! real node, so their sandboxes and containers carry the kubelet's own labels and
//! annotations, its volumes are mounted by it and its static pods have mirror pods.
//!
//! The kubelet rewrites some host sysctls (its kernel tunables); they are saved before it
//! starts and restored when the [`Kubelet`] is dropped. Image garbage collection and eviction
//! thresholds are off: the test images are imported locally and can never be pulled again.
//!
//! Every kubelet of the host binds one device-plugin socket whatever its root dir: the
//! kubelets of tests running side by side start one at a time, under a host-wide lock
//! ([`START_LOCK`]) held until the one starting has bound it.

use super::Cluster;
use super::proc::{Proc, free_port};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The sysctls the kubelet sets at start (`setupKernelTunables`).
const TUNABLES: &[&str] = &[
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
];

pub struct Kubelet {
    pub node: String,
    pub dir: PathBuf,
    pub root_dir: PathBuf,
    pub static_pod_path: PathBuf,
    pub healthz_port: u16,
    /// the authenticated API port (x509 client certificates of the cluster's CA)
    pub port: u16,
    pub config_file: PathBuf,
    args: Vec<String>,
    proc: Option<Proc>,
}

/// The host's values of [`TUNABLES`] and how many kubelets of this process run: saved when
/// the first starts, restored when the last is dropped (kubelets of concurrent tests would
/// otherwise save each other's values).
static SAVED: std::sync::Mutex<(usize, Vec<(String, String)>)> =
    std::sync::Mutex::new((0, Vec::new()));

fn save_tunables() {
    let mut g = SAVED.lock().unwrap_or_else(|e| e.into_inner());
    if g.0 == 0 {
        g.1 = TUNABLES
            .iter()
            .filter_map(|t| {
                let v = std::fs::read_to_string(Path::new("/proc/sys").join(t)).ok()?;
                Some((t.to_string(), v.trim().to_owned()))
            })
            .collect();
    }
    g.0 += 1;
}

fn restore_tunables() {
    let mut g = SAVED.lock().unwrap_or_else(|e| e.into_inner());
    g.0 = g.0.saturating_sub(1);
    if g.0 == 0 {
        for (t, v) in &g.1 {
            let _ = std::fs::write(Path::new("/proc/sys").join(t), v);
        }
    }
}

/// Held by a test process while its kubelet starts, until that kubelet has bound its
/// device-plugin registration socket: every kubelet of the host binds the same path,
/// `/var/lib/kubelet/device-plugins/kubelet.sock`, whatever its `--root-dir`, and one
/// starting beside another may find it taken ("bind: address already in use", then no
/// ContainerManager and no allocatable).
pub const START_LOCK: &str = "/run/reaplet-test-kubelet-start.lock";
/// The socket [`START_LOCK`] guards.
pub const DEVICE_PLUGIN_SOCKET: &str = "/var/lib/kubelet/device-plugins/kubelet.sock";
/// How long a kubelet waits for the kubelets of other tests to start (each holds
/// [`START_LOCK`] a few seconds).
pub const START_LOCK_WAIT: Duration = Duration::from_secs(300);
/// How long a started kubelet may take to bind [`DEVICE_PLUGIN_SOCKET`] on a loaded machine.
const SOCKET_WAIT: Duration = Duration::from_secs(90);

/// [`START_LOCK`], held until dropped (a `flock` on a file opened close-on-exec: the
/// kubelet does not inherit it).
pub struct StartLock {
    _file: std::fs::File,
}

impl StartLock {
    /// The lock if no other holder has it now.
    pub fn try_take() -> Option<StartLock> {
        use rustix::fs::{FlockOperation, flock};
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(START_LOCK)
            .unwrap_or_else(|e| panic!("open {START_LOCK}: {e}"));
        match flock(&f, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => Some(StartLock { _file: f }),
            Err(rustix::io::Errno::WOULDBLOCK) => None,
            Err(e) => panic!("flock {START_LOCK}: {e}"),
        }
    }

    /// Waits for the lock (a wait over a second is printed: a test's timed window around a
    /// kubelet restart includes it).
    async fn acquire() -> StartLock {
        let t0 = Instant::now();
        loop {
            if let Some(lock) = Self::try_take() {
                if t0.elapsed() > Duration::from_secs(1) {
                    println!(
                        "kubelet: waited {:?} for {START_LOCK} (another kubelet starting)",
                        t0.elapsed()
                    );
                }
                return lock;
            }
            assert!(
                t0.elapsed() < START_LOCK_WAIT,
                "{START_LOCK} was held by another process for {START_LOCK_WAIT:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// The test kubelet's eviction settings: no eviction whatever the machine does.
pub const DEFAULT_EVICTION: &str =
    r#"evictionHard: {memory.available: "1Mi", nodefs.available: "1%", imagefs.available: "1%"}"#;

impl Kubelet {
    /// Starts the kubelet for `cluster`'s first node against the containerd at `endpoint`
    /// (`unix://…`), its pods below `cgroup_root`; waits until it answers healthz and the
    /// Node reports it (90 s at most).
    pub async fn start(cluster: &Cluster, endpoint: &str, cgroup_root: &str) -> Kubelet {
        Self::start_with(cluster, endpoint, cgroup_root, DEFAULT_EVICTION).await
    }

    /// [`Self::start`] with `eviction` (KubeletConfiguration lines: `evictionHard`, reservations,
    /// ...) in place of [`DEFAULT_EVICTION`].
    pub async fn start_with(
        cluster: &Cluster,
        endpoint: &str,
        cgroup_root: &str,
        eviction: &str,
    ) -> Kubelet {
        let node = cluster.nodes.first().expect("a node").clone();
        let dir = cluster.dir.path().join("kubelet");
        let root_dir = dir.join("root");
        let static_pod_path = dir.join("manifests");
        let logs = dir.join("pod-logs");
        for d in [&root_dir, &static_pod_path, &logs] {
            std::fs::create_dir_all(d).unwrap();
        }
        save_tunables();
        make_cgroup_root(cgroup_root);
        let healthz_port = free_port();
        let port = free_port();
        let config_file = dir.join("config.yaml");
        let config = format!(
            r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
cgroupRoot: {cgroup_root}
cgroupsPerQOS: true
failSwapOn: false
failCgroupV1: false
containerRuntimeEndpoint: {endpoint}
staticPodPath: {static_pod_path}
podLogsDir: {logs}
address: 127.0.0.1
port: {port}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: {healthz_port}
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: false}}
  x509: {{clientCAFile: {ca}}}
authorization: {{mode: AlwaysAllow}}
protectKernelDefaults: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
{eviction}
fileCheckFrequency: 1s
syncFrequency: 10s
resolvConf: ""
"#,
            static_pod_path = static_pod_path.display(),
            logs = logs.display(),
            ca = cluster.pki.ca.display(),
        );
        std::fs::write(&config_file, config).unwrap();
        let kubeconfig = cluster.node_kubeconfig(&node);
        let args: Vec<String> = vec![
            format!("--config={}", config_file.display()),
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--root-dir={}", root_dir.display()),
            format!("--cert-dir={}", dir.join("pki").display()),
            format!("--hostname-override={node}"),
            "--v=2".into(),
        ];
        let mut k = Kubelet {
            node,
            dir,
            root_dir,
            static_pod_path,
            healthz_port,
            port,
            config_file,
            args,
            proc: None,
        };
        k.launch().await;
        k.wait_healthy().await;
        // pods are admitted against the Node's allocatable: wait until the kubelet wrote it
        let t0 = Instant::now();
        loop {
            let (_, v) = cluster
                .raw("GET", &format!("/api/v1/nodes/{}", k.node), None, None)
                .await;
            if v["status"]["allocatable"]["pods"].is_string() {
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "the kubelet did not report the Node's allocatable within 60 s:\n{}",
                k.log_tail(40)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        k
    }

    /// Starts the process under [`START_LOCK`], held until it bound the device-plugin socket
    /// (or exited, or [`SOCKET_WAIT`] passed: [`Self::wait_healthy`] tells what went wrong).
    async fn launch(&mut self) {
        let _lock = StartLock::acquire().await;
        // a socket left by another kubelet (which never looks at it again): gone, so the one
        // that appears is this kubelet's
        let _ = std::fs::remove_file(DEVICE_PLUGIN_SOCKET);
        let mut p = Proc::start("kubelet", &super::bin("kubelet"), &self.args, &self.dir);
        let t0 = Instant::now();
        while !Path::new(DEVICE_PLUGIN_SOCKET).exists() && p.exited().is_none() {
            if t0.elapsed() > SOCKET_WAIT {
                println!("the kubelet did not bind {DEVICE_PLUGIN_SOCKET} within {SOCKET_WAIT:?}");
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.proc = Some(p);
    }

    /// The flags that put reaplet on this kubelet's node: its config file, root dir and
    /// `/healthz`, the node's name and `kubeconfig`.
    pub fn reaplet_args(&self, kubeconfig: &Path, node: &str) -> Vec<std::ffi::OsString> {
        [
            "--kubelet-config".as_ref(),
            self.config_file.as_os_str(),
            "--kubeconfig".as_ref(),
            kubeconfig.as_os_str(),
            "--hostname-override".as_ref(),
            node.as_ref(),
            "--root-dir".as_ref(),
            self.root_dir.as_os_str(),
            "--kubelet-healthz-url".as_ref(),
            self.healthz_url().as_ref(),
        ]
        .into_iter()
        .map(std::ffi::OsStr::to_owned)
        .collect()
    }

    pub fn healthz_url(&self) -> String {
        format!("http://127.0.0.1:{}/healthz", self.healthz_port)
    }

    pub fn pid(&self) -> Option<u32> {
        self.proc.as_ref().and_then(|p| p.pid())
    }

    pub fn log_tail(&self, n: usize) -> String {
        self.proc.as_ref().map(|p| p.tail(n)).unwrap_or_default()
    }

    /// The last `n` lines of its log that contain any of `needles`, also once it is stopped
    /// (a test's failure message after the kubelet's round wants what it did).
    pub fn log_grep(&self, needles: &[&str], n: usize) -> String {
        // where `Proc::start` appends it
        let text = std::fs::read_to_string(self.dir.join("kubelet.log")).unwrap_or_default();
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| needles.iter().any(|w| l.contains(w)))
            .collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    async fn wait_healthy(&mut self) {
        let t0 = Instant::now();
        let limit = Duration::from_secs(90);
        loop {
            if let Some(p) = self.proc.as_mut()
                && let Some(st) = p.exited()
            {
                panic!("the kubelet exited ({st}) while starting:\n{}", p.tail(60));
            }
            if healthz(self.healthz_port).await {
                return;
            }
            assert!(
                t0.elapsed() < limit,
                "the kubelet was not healthy within {limit:?}:\n{}",
                self.log_tail(60)
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Stops the kubelet as systemd would (SIGTERM): its pods keep running.
    pub fn stop(&mut self) {
        if let Some(mut p) = self.proc.take() {
            p.stop();
        }
    }

    /// Kills it (SIGKILL), as a crash would.
    pub fn crash(&mut self) {
        if let Some(mut p) = self.proc.take() {
            p.kill();
        }
    }

    /// Starts it again with the same configuration; waits for healthz.
    pub async fn restart(&mut self) {
        self.stop();
        self.launch().await;
        self.wait_healthy().await;
    }

    /// Writes a static pod manifest into its `staticPodPath` (atomically).
    pub fn add_static_pod(&self, file: &str, yaml: &str) -> PathBuf {
        // written aside and renamed: the kubelet reads the directory every second and skips
        // dot files; a half-written manifest would be rejected
        let p = self.static_pod_path.join(file);
        let tmp = self.static_pod_path.join(format!(".{file}.tmp"));
        std::fs::write(&tmp, yaml).unwrap();
        std::fs::rename(&tmp, &p).unwrap();
        p
    }
}

/// The kubelet wants its `cgroupRoot` to exist in every hierarchy (the test bed removes it
/// with everything below when it stops); a new cpuset cgroup gets its parent's CPUs and memory
/// nodes, as cgroup v1 starts it with none.
fn make_cgroup_root(root: &str) {
    let root = root.trim_start_matches('/');
    let Ok(entries) = std::fs::read_dir("/sys/fs/cgroup") else {
        return;
    };
    for e in entries.flatten() {
        let h = e.path();
        if !h.is_dir() {
            continue;
        }
        let dir = h.join(root);
        std::fs::create_dir_all(&dir)
            .unwrap_or_else(|err| panic!("create cgroup {}: {err}", dir.display()));
        for f in ["cpuset.cpus", "cpuset.mems"] {
            if let Ok(v) = std::fs::read_to_string(h.join(f))
                && std::fs::read_to_string(dir.join(f)).is_ok_and(|c| c.trim().is_empty())
            {
                let _ = std::fs::write(dir.join(f), v.trim());
            }
        }
    }
}

/// Does the kubelet's healthz answer 200 (within 1 s)?
pub async fn healthz(port: u16) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let fut = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        s.write_all(b"GET /healthz HTTP/1.0\r\nHost: localhost\r\n\r\n")
            .await
            .ok()?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.ok()?;
        Some(buf.starts_with(b"HTTP/1.0 200") || buf.starts_with(b"HTTP/1.1 200"))
    };
    tokio::time::timeout(Duration::from_secs(1), fut)
        .await
        .ok()
        .flatten()
        .unwrap_or(false)
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.stop();
        // the kubelet makes its root dir a shared bind mount of itself; pods' volumes may be
        // left below it when a test failed: unmount all of it so the directory can go
        let _ = std::process::Command::new("umount")
            .arg("-R")
            .arg("-l")
            .arg(&self.root_dir)
            .stderr(std::process::Stdio::null())
            .status();
        restore_tunables();
    }
}
