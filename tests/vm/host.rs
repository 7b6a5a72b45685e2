//! Host side: image, inputs, one qemu boot (KVM when `/dev/kvm` is usable, TCG otherwise:
//! [`reaplet::testbed::Accel`]), the report.

use crate::{Outcome, SCENARIOS};
use reaplet::testbed::{ACCEL_ENV, Accel, KVM_DEVICE};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const QEMU: &str = "qemu-system-x86_64";

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
fn boot(accel: &Accel, d: &Disks<'_>, limit: Duration) -> Result<Booted, String> {
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
        .args(["-machine", "pc", "-smp", "2", "-m", "1024"])
        .args(["-nographic", "-no-reboot", "-nic", "none"])
        .arg("-kernel")
        .arg(d.image.join("vmlinuz"))
        .arg("-initrd")
        .arg(d.image.join("initrd.gz"))
        .args([
            "-append",
            "console=ttyS0 quiet panic=-1 reaplet.vmtest systemd.show_status=0",
        ])
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

fn selected(args: &[String]) -> bool {
    // `cargo test FILTER` passes the filter to every test binary: boot only when it matches
    let filters: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
    filters.is_empty()
        || SCENARIOS.iter().any(|s| {
            filters
                .iter()
                .any(|f| format!("vm::{s}").contains(f.as_str()))
        })
}

pub fn main(args: &[String]) -> i32 {
    if args.iter().any(|a| a == "--list") {
        for s in SCENARIOS {
            println!("vm::{s}: test");
        }
        return 0;
    }
    if !selected(args) {
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

    let work = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("vm");
    let _ = std::fs::remove_dir_all(&work);
    let inputs = work.join("in");
    let results = work.join("out");
    if let Err(e) =
        std::fs::create_dir_all(&inputs).and_then(|()| std::fs::create_dir_all(&results))
    {
        return loud(&format!("creating {}: {e}", work.display()));
    }
    let me = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => return loud(&format!("own path: {e}")),
    };
    // the guest installs reaplet from the packages; the test-hooks build is for the watchdog
    // scenario alone (the package never has the hooks)
    let copies: [(PathBuf, &str); 7] = [
        (me, "vm-guest"),
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
    for (from, to) in &copies {
        if let Err(e) = std::fs::copy(from, inputs.join(to)) {
            return loud(&format!("copying {}: {e}", from.display()));
        }
    }
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
        return loud("packing the inputs with tar failed");
    }
    let console = work.join("console.log");
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
    let disks = Disks {
        image: &image,
        in_tar: &in_tar,
        out_img: &out_img,
        console: &console,
    };
    let (exit, ran) = loop {
        println!(
            "vm: booting (qemu with {}, 2 vCPUs, 1 GiB; limit {limit:?}); console in {}",
            accel.describe(),
            console.display()
        );
        let next = match boot(&accel, &disks, limit) {
            Err(e) => return loud(&e),
            Ok(Booted::Exited(s, ran)) if s.success() => break (Some(s), ran),
            Ok(Booted::TimedOut(ran)) => break (None, ran),
            Ok(Booted::Exited(s, ran)) => match accel.fallback(&format!("qemu failed ({s})")) {
                None => break (Some(s), ran),
                Some(next) => next,
            },
            Ok(Booted::NotStarted(ran)) => {
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
        accel = next;
    };
    let Some(exit) = exit else {
        eprintln!("console (last 40 lines):\n{}", tail(&console, 40));
        return loud(&format!("the VM did not power off within {limit:?}"));
    };
    if !exit.success() {
        eprintln!("console (last 40 lines):\n{}", tail(&console, 40));
        return loud(&format!("qemu failed ({exit}): it cannot run here"));
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
        return loud("the guest wrote no results (it did not reach the runner)");
    }
    let outcomes: Vec<Outcome> = std::fs::read_to_string(results.join("results.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();

    let mut failed = 0;
    let stdout = std::io::stdout();
    let mut o = stdout.lock();
    let _ = writeln!(o, "\nrunning {} VM scenarios", SCENARIOS.len());
    for name in SCENARIOS {
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
        .filter(|r| !r.ok && !SCENARIOS.contains(&r.scenario.as_str()))
    {
        failed += 1;
        let _ = writeln!(o, "guest step {} ... FAILED\n    {}", r.scenario, r.detail);
    }
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
    }
    println!(
        "\nvm: {} passed, {failed} failed; image ready in {:.1} s, boot + scenarios + power-off {:.1} s \
         under {}; results and journals in {}",
        SCENARIOS
            .iter()
            .filter(|n| outcomes.iter().any(|r| r.scenario == **n && r.ok))
            .count(),
        prepared.as_secs_f64(),
        ran.as_secs_f64(),
        match accel {
            Accel::Kvm => "KVM",
            Accel::Tcg(_) => "TCG",
        },
        results.display()
    );
    if failed > 0 { 1 } else { 0 }
}
