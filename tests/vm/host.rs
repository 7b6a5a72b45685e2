//! Host side: image, inputs, two qemu boots of the one image (KVM when `/dev/kvm` is usable,
//! TCG otherwise: [`reaplet_testbed::Accel`]), the report. The agent boot runs reaplet beside
//! containerd with no kubelet; the node boot adds the real kubelet and the real kube-apiserver +
//! etcd, which run here on the host ([`crate::k8s::Cluster`]) and which the guest reaches only
//! through qemu's user-mode network (`restrict=on`): a `guestfwd` of 10.0.2.100:6443 to this
//! binary's `--relay` (stdin/stdout to the API server's loopback port) and one of 10.0.2.101:80
//! to its `--audit` (the API server's audit log, served once per connection).

use crate::{AGENT_SCENARIOS, Boot, NODE, NODE_SCENARIOS, Outcome};
use reaplet_testbed::{ACCEL_ENV, Accel, KVM_DEVICE};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const QEMU: &str = "qemu-system-x86_64";
/// The guest's memory: containerd, the kubelet, reaplet and the pods of the node boot.
const MEMORY_MB: &str = "1536";

fn loud(msg: &str) -> i32 {
    eprintln!("\n*** reaplet VM test FAILED: {msg} ***\n");
    1
}

/// Runs a repository script and returns its last stdout line (a directory).
fn script_dir(repo: &Path, script: &str, args: &[&str]) -> Result<PathBuf, String> {
    let out = Command::new("bash")
        .arg(repo.join(script))
        .args(args)
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("running {script}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{script} failed ({})", out.status));
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let dir = stdout.lines().last().unwrap_or_default().trim();
    if dir.is_empty() || !Path::new(dir).is_dir() {
        return Err(format!("{script} printed no directory: {stdout:?}"));
    }
    Ok(PathBuf::from(dir))
}

/// reaplet's Debian packages, as scripts/test.sh's "package" step leaves them in the target
/// directory this test was built in ($CARGO_TARGET_DIR, else target/): the first install and the
/// same package at Debian revision 2, for the upgrade.
fn packages() -> Result<[PathBuf; 2], String> {
    let target = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .ok_or("CARGO_TARGET_TMPDIR has no parent")?;
    let v = env!("CARGO_PKG_VERSION");
    let debs = [
        target.join(format!("debian/reaplet_{v}-1_amd64.deb")),
        target.join(format!("debian/upgrade/reaplet_{v}-2_amd64.deb")),
    ];
    for d in &debs {
        if !d.is_file() {
            return Err(format!(
                "no Debian package {}: run scripts/test.sh (it builds the package)",
                d.display()
            ));
        }
    }
    Ok(debs)
}

/// The files one boot uses.
struct Disks<'a> {
    /// The cached image directory (vmlinuz, initrd.gz, rootfs.img).
    image: &'a Path,
    in_tar: &'a Path,
    out_img: &'a Path,
    console: &'a Path,
    /// The node boot's qemu network (`-netdev` argument); the agent boot has none.
    netdev: Option<String>,
    boot: Boot,
}

/// How one boot ended.
enum Booted {
    /// qemu exited (the guest powers off when its runner is done).
    Exited(std::process::ExitStatus, Duration),
    /// Killed at the overall limit.
    TimedOut(Duration),
    /// Killed at [`Accel::start_limit`]: the guest's runner had not started.
    NotStarted(Duration),
}

/// What the guest's runner prints first on the console (testbed/vm/guest/runner.sh).
const GUEST_STARTED: &str = "runner: guest driver starting";

/// Boots the VM once with `accel`, on a fresh results disk and console log.
fn boot_once(accel: &Accel, d: &Disks<'_>, limit: Duration) -> Result<Booted, String> {
    std::fs::File::create(d.out_img)
        .and_then(|f| f.set_len(256 << 20))
        .map_err(|e| format!("creating {}: {e}", d.out_img.display()))?;
    let console_file = std::fs::File::create(d.console)
        .map_err(|e| format!("creating {}: {e}", d.console.display()))?;
    let console_err = console_file
        .try_clone()
        .map_err(|e| format!("creating {}: {e}", d.console.display()))?;
    let drive = |file: &Path, id: &str, extra: &str| {
        [
            "-drive".to_string(),
            format!("file={},format=raw,if=none,id={id}{extra}", file.display()),
            "-device".to_string(),
            format!("virtio-blk-pci,drive={id},serial=reaplet-{id}"),
        ]
    };
    let mut qemu = Command::new(QEMU);
    qemu.args(accel.qemu_args())
        .args(["-machine", "pc", "-smp", "2", "-m", MEMORY_MB])
        .args(["-nographic", "-no-reboot"]);
    match &d.netdev {
        Some(n) => qemu
            .arg("-netdev")
            .arg(n)
            .args(["-device", "virtio-net-pci,netdev=net0"]),
        None => qemu.args(["-nic", "none"]),
    };
    qemu.arg("-kernel")
        .arg(d.image.join("vmlinuz"))
        .arg("-initrd")
        .arg(d.image.join("initrd.gz"))
        .arg("-append")
        .arg(format!(
            "console=ttyS0 quiet panic=-1 reaplet.vmtest reaplet.boot={} systemd.show_status=0",
            d.boot.name()
        ))
        .args(drive(&d.image.join("rootfs.img"), "root", ",snapshot=on"))
        .args(drive(d.in_tar, "in", ",readonly=on"))
        .args(drive(d.out_img, "out", ""))
        .stdin(Stdio::null())
        .stdout(console_file)
        .stderr(console_err);
    let start = Instant::now();
    let mut child = qemu
        .spawn()
        .map_err(|e| format!("qemu cannot run here: {e}"))?;
    let mut started = false;
    loop {
        match child.try_wait() {
            Ok(Some(s)) => return Ok(Booted::Exited(s, start.elapsed())),
            Ok(None) => {}
            Err(e) => return Err(format!("waiting for qemu: {e}")),
        }
        let stuck = match accel.start_limit() {
            Some(l) if !started && start.elapsed() > l => {
                started =
                    std::fs::read_to_string(d.console).is_ok_and(|c| c.contains(GUEST_STARTED));
                !started
            }
            _ => false,
        };
        if stuck || start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return Ok(if stuck {
                Booted::NotStarted(start.elapsed())
            } else {
                Booted::TimedOut(start.elapsed())
            });
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn tail(path: &Path, n: usize) -> String {
    let s = std::fs::read_to_string(path).unwrap_or_else(|e| format!("({}: {e})", path.display()));
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The boots whose scenarios match the filter `cargo test FILTER` passes to every test binary:
/// a boot runs only when one of its scenarios matches (all of them without a filter).
fn selected(args: &[String]) -> Vec<Boot> {
    let filters: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
    [Boot::Agent, Boot::Node]
        .into_iter()
        .filter(|b| {
            filters.is_empty()
                || b.scenarios().iter().any(|s| {
                    filters
                        .iter()
                        .any(|f| format!("vm::{s}").contains(f.as_str()))
                })
        })
        .collect()
}

/// What the report needs of one boot.
struct Report {
    boot: Boot,
    passed: usize,
    failed: usize,
    ran: Duration,
}

/// The host's part of the node boot: the API server and etcd, and what the guest gets of them.
struct NodeSide {
    rt: tokio::runtime::Runtime,
    cluster: crate::k8s::Cluster,
}

/// The API server's address as the guest sees it (qemu's guestfwd to this binary's relay).
pub const GUEST_API: &str = "10.0.2.100:6443";
/// Where the guest reads the API server's audit log (qemu's guestfwd to `--audit`).
pub const GUEST_AUDIT: &str = "10.0.2.101:80";
/// Where the guest keeps the PKI files the host gives it (kubeadm's directory).
pub const GUEST_PKI: &str = "/etc/kubernetes/pki";

/// A kubeconfig naming the guest's paths (the files are copied to [`GUEST_PKI`] there).
fn guest_kubeconfig(user: &str, file: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: vm\n  cluster:\n    server: https://{GUEST_API}\n    certificate-authority: {GUEST_PKI}/ca.crt\nusers:\n- name: {user}\n  user:\n    client-certificate: {GUEST_PKI}/{file}.crt\n    client-key: {GUEST_PKI}/{file}.key\ncontexts:\n- name: vm\n  context:\n    cluster: vm\n    user: {user}\ncurrent-context: vm\n"
    )
}

impl NodeSide {
    /// etcd and the API server with the guest's Node, and the guest's files in `inputs/kube`:
    /// the CA, the node's and an admin's client certificates, their kubeconfigs.
    fn start(inputs: &Path) -> Result<NodeSide, String> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| format!("tokio: {e}"))?;
        let cluster = rt.block_on(crate::k8s::Cluster::start(crate::k8s::Options {
            nodes: vec![NODE.into()],
        }));
        let dir = inputs.join("kube");
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let node = cluster.node_identity(NODE);
        let admin = cluster.pki.client("admin", &["system:masters"]);
        let copies = [
            (cluster.pki.ca.clone(), "ca.crt"),
            (node.cert, "node.crt"),
            (node.key, "node.key"),
            (admin.cert, "admin.crt"),
            (admin.key, "admin.key"),
        ];
        for (from, to) in copies {
            std::fs::copy(&from, dir.join(to))
                .map_err(|e| format!("copying {}: {e}", from.display()))?;
        }
        for (user, file) in [
            (format!("system:node:{NODE}"), "node"),
            ("admin".into(), "admin"),
        ] {
            std::fs::write(
                dir.join(format!("{file}.kubeconfig")),
                guest_kubeconfig(&user, file),
            )
            .map_err(|e| e.to_string())?;
        }
        Ok(NodeSide { rt, cluster })
    }

    /// qemu's user-mode network for the guest: isolated (`restrict=on`), with the two forwards
    /// to this binary (qemu spawns the command for each connection the guest opens).
    fn netdev(&self, me: &Path) -> String {
        format!(
            "user,id=net0,restrict=on,guestfwd=tcp:{GUEST_API}-cmd:{me} --relay 127.0.0.1:{port},\
             guestfwd=tcp:{GUEST_AUDIT}-cmd:{me} --audit {audit}",
            me = me.display(),
            port = self.cluster.port,
            audit = self.cluster.audit_log.display()
        )
    }
}

/// This process's standard input or output as a plain file: qemu gives both ends of the
/// guest's connection as descriptors 0 and 1 (and 2: nothing may be written to stderr), and
/// std's buffered `Stdout` would hold binary data back until a newline.
/// This process's stdin and stdout as files (qemu's guestfwd connection), for blocking copies.
fn stdio() -> Option<(std::fs::File, std::fs::File)> {
    use std::os::fd::AsFd;
    let file =
        |fd: std::os::fd::BorrowedFd<'_>| fd.try_clone_to_owned().ok().map(std::fs::File::from);
    Some((
        file(std::io::stdin().as_fd())?,
        file(std::io::stdout().as_fd())?,
    ))
}

/// `--relay ADDR`: qemu's guestfwd connects the guest's connection to this process's stdin and
/// stdout; they are copied to and from a TCP connection to ADDR (the API server on loopback)
/// until either side closes.
pub fn relay(addr: &str) -> i32 {
    let Some((mut input, mut output)) = stdio() else {
        return 1;
    };
    let Ok(up) = std::net::TcpStream::connect(addr) else {
        return 1;
    };
    let Ok(mut down) = up.try_clone() else {
        return 1;
    };
    std::thread::spawn(move || {
        let mut up = up;
        let _ = std::io::copy(&mut input, &mut up);
        let _ = up.shutdown(std::net::Shutdown::Write);
    });
    // until the server closes; the guest's side ends with this process
    let _ = std::io::copy(&mut down, &mut output);
    0
}

/// `--audit PATH`: answers one HTTP request on stdin/stdout with the file at PATH (the API
/// server's audit log as it is now).
pub fn audit(path: &str) -> i32 {
    use std::io::Read;
    let Some((mut input, mut output)) = stdio() else {
        return 1;
    };
    let mut req = Vec::new();
    let mut buf = [0u8; 1024];
    while !req.windows(4).any(|w| w == b"\r\n\r\n") && req.len() < 16 * 1024 {
        match input.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => req.extend_from_slice(&buf[..n]),
        }
    }
    let body = std::fs::read(path).unwrap_or_default();
    let head = format!(
        "HTTP/1.0 200 OK\r\nContent-Type: application/jsonl\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = output.write_all(head.as_bytes());
    let _ = output.write_all(&body);
    0
}

pub fn main(args: &[String]) -> i32 {
    if args.iter().any(|a| a == "--list") {
        for s in AGENT_SCENARIOS.iter().chain(NODE_SCENARIOS) {
            println!("vm::{s}: test");
        }
        return 0;
    }
    let boots = selected(args);
    if boots.is_empty() {
        println!("vm: no scenario matches the filter; the VM was not booted");
        return 0;
    }
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    if !status.lines().any(|l| {
        l.strip_prefix("Uid:")
            .and_then(|v| v.split_whitespace().nth(1))
            == Some("0")
    }) {
        return loud("the VM test needs root (it builds a root filesystem); run it as root");
    }
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let [deb, upgrade_deb] = match packages() {
        Ok(d) => d,
        Err(e) => return loud(&e),
    };
    println!(
        "vm: packages {} and {}",
        deb.display(),
        upgrade_deb.display()
    );
    let t0 = Instant::now();
    println!("vm: preparing the image (testbed/vm/image.sh)");
    let image = match script_dir(repo, "testbed/vm/image.sh", &[]) {
        Ok(d) => d,
        Err(e) => return loud(&format!("no VM image: {e}")),
    };
    let images = match script_dir(repo, "testbed/testbed.sh", &["images"]) {
        Ok(d) => d,
        Err(e) => return loud(&format!("no container images: {e}")),
    };
    let prepared = t0.elapsed();
    println!("vm: image {}", image.display());
    match Command::new(QEMU).arg("--version").output() {
        Ok(o) if o.status.success() => {}
        Ok(o) => {
            return loud(&format!(
                "qemu cannot run here: {}",
                String::from_utf8_lossy(&o.stderr)
            ));
        }
        Err(e) => return loud(&format!("qemu cannot run here ({QEMU}: {e})")),
    }
    let me = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => return loud(&format!("own path: {e}")),
    };
    // the guest installs reaplet from the packages; the test-hooks build is for the watchdog
    // scenario alone (the package never has the hooks)
    let copies: [(PathBuf, &str); 7] = [
        (me.clone(), "vm-guest"),
        (deb, "reaplet.deb"),
        (upgrade_deb, "reaplet-upgrade.deb"),
        (
            PathBuf::from(env!("CARGO_BIN_EXE_reaplet")),
            "reaplet-test-hooks",
        ),
        (repo.join("testbed/vm/config.yaml"), "config.yaml"),
        (images.join("busybox.tar"), "busybox.tar"),
        (images.join("pause.tar"), "pause.tar"),
    ];
    let limit = Duration::from_secs(
        std::env::var("REAPLET_VM_TIMEOUT")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(900),
    );
    let forced = std::env::var(ACCEL_ENV).ok();
    let mut accel = match Accel::detect(Path::new(KVM_DEVICE), forced.as_deref()) {
        Ok(a) => a,
        Err(e) => return loud(&e),
    };
    let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("vm");
    let _ = std::fs::remove_dir_all(&root);
    let mut reports = Vec::new();
    let mut failed = 0;
    for boot in boots {
        match run_boot(boot, &root, &copies, &image, &me, limit, &mut accel) {
            Ok(r) => {
                failed += r.failed;
                reports.push(r);
            }
            Err(e) => {
                failed += 1;
                eprintln!(
                    "\n*** reaplet VM test: the {} boot FAILED: {e} ***\n",
                    boot.name()
                );
            }
        }
    }
    let total: Duration = reports.iter().map(|r| r.ran).sum();
    let times: Vec<String> = reports
        .iter()
        .map(|r| {
            format!(
                "{} boot {} passed, {} failed in {:.1} s",
                r.boot.name(),
                r.passed,
                r.failed,
                r.ran.as_secs_f64()
            )
        })
        .collect();
    println!(
        "\nvm: {}; image ready in {:.1} s, boots + scenarios + power-offs {:.1} s under {}; \
         results and journals in {}",
        times.join("; "),
        prepared.as_secs_f64(),
        total.as_secs_f64(),
        match accel {
            Accel::Kvm => "KVM",
            Accel::Tcg(_) => "TCG",
        },
        root.display()
    );
    if failed > 0 {
        if reports.is_empty() {
            return loud("no boot ran");
        }
        1
    } else {
        0
    }
}

/// One boot: its inputs, qemu (again with TCG when KVM does not work: `accel` keeps the
/// choice for the next boot), the results.
fn run_boot(
    boot: Boot,
    root: &Path,
    copies: &[(PathBuf, &str)],
    image: &Path,
    me: &Path,
    limit: Duration,
    accel: &mut Accel,
) -> Result<Report, String> {
    let work = root.join(boot.name());
    let inputs = work.join("in");
    let results = work.join("out");
    std::fs::create_dir_all(&inputs)
        .and_then(|()| std::fs::create_dir_all(&results))
        .map_err(|e| format!("creating {}: {e}", work.display()))?;
    for (from, to) in copies {
        std::fs::copy(from, inputs.join(to))
            .map_err(|e| format!("copying {}: {e}", from.display()))?;
    }
    let node = match boot {
        Boot::Agent => None,
        Boot::Node => {
            println!("vm: starting etcd and kube-apiserver for the node boot (tests/common/kube)");
            Some(NodeSide::start(&inputs)?)
        }
    };
    let in_tar = work.join("in.tar");
    let out_img = work.join("out.img");
    let tar = Command::new("tar")
        .arg("-cf")
        .arg(&in_tar)
        .arg("-C")
        .arg(&inputs)
        .arg(".")
        .status();
    if !matches!(tar, Ok(s) if s.success()) {
        return Err("packing the inputs with tar failed".into());
    }
    let console = work.join("console.log");
    let disks = Disks {
        image,
        in_tar: &in_tar,
        out_img: &out_img,
        console: &console,
        netdev: node.as_ref().map(|n| n.netdev(me)),
        boot,
    };
    let (exit, ran) = loop {
        println!(
            "vm: {} boot (qemu with {}, 2 vCPUs, {MEMORY_MB} MiB; limit {limit:?}); console in {}",
            boot.name(),
            accel.describe(),
            console.display()
        );
        let next = match boot_once(accel, &disks, limit)? {
            Booted::Exited(s, ran) if s.success() => break (Some(s), ran),
            Booted::TimedOut(ran) => break (None, ran),
            Booted::Exited(s, ran) => match accel.fallback(&format!("qemu failed ({s})")) {
                None => break (Some(s), ran),
                Some(next) => next,
            },
            Booted::NotStarted(ran) => {
                match accel.fallback(&format!(
                    "the guest did not start within {:.0} s",
                    ran.as_secs_f64()
                )) {
                    None => break (None, ran),
                    Some(next) => next,
                }
            }
        };
        eprintln!("console (last 10 lines):\n{}", tail(&console, 10));
        println!("vm: KVM does not work here; booting again with TCG");
        *accel = next;
    };
    // the API server's log and audit log beside the guest's results (the cluster's directory
    // goes with it)
    if let Some(n) = &node {
        let _ = std::fs::copy(&n.cluster.audit_log, work.join("audit.log"));
        let _ = std::fs::copy(&n.cluster.apiserver.log, work.join("kube-apiserver.log"));
    }
    if let Some(NodeSide { rt, cluster }) = node {
        // its processes are stopped by PID, its client closed on the runtime it was made on
        rt.block_on(async move { drop(cluster) });
    }
    let Some(exit) = exit else {
        eprintln!("console (last 40 lines):\n{}", tail(&console, 40));
        return Err(format!("the VM did not power off within {limit:?}"));
    };
    if !exit.success() {
        eprintln!("console (last 40 lines):\n{}", tail(&console, 40));
        return Err(format!("qemu failed ({exit}): it cannot run here"));
    }
    let untar = Command::new("tar")
        .arg("-xf")
        .arg(&out_img)
        .arg("-C")
        .arg(&results)
        .stderr(Stdio::null())
        .status();
    if !matches!(untar, Ok(s) if s.success()) {
        eprintln!("console (last 60 lines):\n{}", tail(&console, 60));
        return Err("the guest wrote no results (it did not reach the runner)".into());
    }
    let outcomes: Vec<Outcome> = std::fs::read_to_string(results.join("results.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();

    let scenarios = boot.scenarios();
    let mut failed = 0;
    let stdout = std::io::stdout();
    let mut o = stdout.lock();
    let _ = writeln!(
        o,
        "\nrunning {} VM scenarios ({} boot)",
        scenarios.len(),
        boot.name()
    );
    for name in scenarios {
        match outcomes.iter().find(|r| r.scenario == *name) {
            Some(r) if r.ok => {
                let _ = writeln!(
                    o,
                    "test vm::{name} ... ok ({:.1} s)\n    {}",
                    r.secs, r.detail
                );
            }
            Some(r) => {
                failed += 1;
                let _ = writeln!(
                    o,
                    "test vm::{name} ... FAILED ({:.1} s)\n    {}",
                    r.secs, r.detail
                );
            }
            None => {
                failed += 1;
                let _ = writeln!(o, "test vm::{name} ... FAILED (not reported by the guest)");
            }
        }
    }
    for r in outcomes
        .iter()
        .filter(|r| !r.ok && !scenarios.contains(&r.scenario.as_str()))
    {
        failed += 1;
        let _ = writeln!(o, "guest step {} ... FAILED\n    {}", r.scenario, r.detail);
    }
    let _ = writeln!(
        o,
        "vm: {} boot: boot + scenarios + power-off {:.1} s",
        boot.name(),
        ran.as_secs_f64()
    );
    drop(o);
    if failed > 0 {
        eprintln!(
            "--- guest driver (last 40 lines)\n{}",
            tail(&results.join("driver.log"), 40)
        );
        eprintln!(
            "--- reaplet journal (last 80 lines)\n{}",
            tail(&results.join("reaplet.journal"), 80)
        );
        eprintln!(
            "--- containerd journal (last 30 lines)\n{}",
            tail(&results.join("containerd.journal"), 30)
        );
        if boot == Boot::Node {
            eprintln!(
                "--- kubelet journal (last 40 lines)\n{}",
                tail(&results.join("kubelet.journal"), 40)
            );
        }
    }
    Ok(Report {
        boot,
        passed: scenarios
            .iter()
            .filter(|n| outcomes.iter().any(|r| r.scenario == **n && r.ok))
            .count(),
        failed,
        ran,
    })
}
