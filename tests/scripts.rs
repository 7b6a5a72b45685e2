//! The set-up and test scripts, driven hermetically: each test works in a temporary directory
//! with fake commands first on `PATH` (`cargo`, `apt-get`, `id`, ...) and, where a tool must look
//! missing, a `PATH` of links to the real tools without it. Nothing here installs packages,
//! starts containerd or boots a VM; every test takes a few seconds at most.
//!
//! * `scripts/test.sh` runs every test binary even after one fails, keeps going after a fmt or
//!   clippy failure, stops with a message on a failed set-up step, and ends with a summary that
//!   names the failed steps, test binaries and tests (run from a copy of the script in a fake
//!   repository, against a fake `cargo`);
//! * `scripts/demo.sh` shows its steps with their durations (fake `cargo` and test bed);
//! * `testbed/testbed.sh install` passes apt a lock timeout and retries, retries a failing
//!   `apt-get update`, and stops with a message naming the step when `apt-get install` fails;
//! * `testbed/testbed.sh images` rebuilds cached images that do not match their digests (real
//!   build: `/bin/busybox` and `gcc`, which the test suite's set-up installs, in a temporary
//!   cache directory);
//! * `testbed/vm/image.sh` rebuilds a cached VM image that does not match its digests (its
//!   `main` driven with a stub build: the script is sourced).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A temporary directory with `bin/` (fake commands, first on `PATH`) and `tools/` (links to the
/// real commands, minus the hidden ones), a `calls` file the fakes append to, and a cache.
struct Sandbox {
    tmp: tempfile::TempDir,
}

/// What a script did.
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Run {
    fn all(&self) -> String {
        format!("{}\n{}", self.stdout, self.stderr)
    }
}

impl std::fmt::Debug for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {:?}\n--- stdout\n{}\n--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

impl Sandbox {
    /// `hide`: real commands that must look missing.
    fn new(hide: &[&str]) -> Sandbox {
        let tmp = tempfile::tempdir().expect("temporary directory");
        let sb = Sandbox { tmp };
        for d in ["bin", "tools", "cache", "repo"] {
            std::fs::create_dir_all(sb.path(d)).unwrap();
        }
        std::fs::write(sb.path("calls"), "").unwrap();
        let real_path = std::env::var("PATH").unwrap_or_default();
        for dir in real_path.split(':').chain(["/usr/sbin", "/sbin"]) {
            let Ok(entries) = std::fs::read_dir(dir) else {
                continue;
            };
            for e in entries.flatten() {
                let name = e.file_name();
                let link = sb.path("tools").join(&name);
                if hide.iter().any(|h| name == **h) || link.symlink_metadata().is_ok() {
                    continue;
                }
                let _ = std::os::unix::fs::symlink(e.path(), link);
            }
        }
        // root without being root: the scripts only ask `id -u`
        sb.fake(
            "id",
            r#"if [ "${1:-}" = -u ]; then echo 0; else exec /usr/bin/id "$@"; fi"#,
        );
        sb
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.tmp.path().join(rel)
    }

    /// Writes an executable `bash` script into `bin/` (or anywhere below the sandbox).
    fn write_exe(&self, rel: &str, body: &str) {
        let p = self.path(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, format!("#!/bin/bash\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    fn fake(&self, name: &str, body: &str) {
        self.write_exe(&format!("bin/{name}"), body);
    }

    /// Copies a script of the repository into the sandbox's fake repository.
    fn copy_script(&self, rel: &str) {
        let to = self.path("repo").join(rel);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(repo().join(rel), &to).unwrap();
    }

    fn calls(&self) -> String {
        std::fs::read_to_string(self.path("calls")).unwrap_or_default()
    }

    /// `bash SCRIPT ARGS...` with the sandbox's `PATH`, cache and calls file.
    fn command(&self, script: &Path, args: &[&str]) -> Command {
        let mut c = Command::new("/bin/bash");
        c.arg(script)
            .args(args)
            .env(
                "PATH",
                format!(
                    "{}:{}",
                    self.path("bin").display(),
                    self.path("tools").display()
                ),
            )
            .env("CALLS", self.path("calls"))
            .env("HOME", self.tmp.path())
            .env("REAPLET_CACHE_DIR", self.path("cache"))
            .env_remove("CARGO_TARGET_DIR")
            .env_remove("RUST_TEST_THREADS")
            .current_dir(self.tmp.path());
        c
    }
}

fn run(mut c: Command) -> Run {
    let out = c.output().expect("running bash");
    Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

// ---------------------------------------------------------------------------------------------
// scripts/test.sh

/// A fake `cargo` for test.sh: `install` (cargo-deb) and `run` (the xtask) do nothing, `deb` prints a package's
/// path; `fmt` fails when FAKE_FMT_FAIL is set; `metadata` lists six targets (the library,
/// tests api, pipeline, vm and handover, the termination benchmark); `test` runs the selected
/// ones (`--lib`, `--test NAME`, `--bench NAME`, or all), builds nothing with `--no-run`, and
/// under REAPLET_TESTBED_RUNTIME=debian (the compatibility job) prints which runtime ran; with
/// FAKE_TEST_FAIL, `tests/api.rs` has a failing test and `tests/vm/main.rs` (a harness-less
/// binary) exits 1 without one. Like cargo, it stops at the first failed binary unless given
/// `--no-fail-fast`. Its output is cargo's, shortened.
const FAKE_CARGO_FOR_TEST_SH: &str = r##"
echo "cargo $*${REAPLET_TESTBED_RUNTIME:+ (runtime $REAPLET_TESTBED_RUNTIME)}" >>"$CALLS"
ok_bin() {
    echo "     Running $1 (target/debug/deps/$2-0123456789abcdef)" >&2
    printf '\nrunning 1 test\ntest %s ... ok\n\ntest result: ok. 1 passed; 0 failed\n\n' "$3"
}
case $1 in
fmt)
    if [ -n "${FAKE_FMT_FAIL:-}" ]; then echo "Diff in /repo/src/lib.rs at line 1:"; exit 1; fi ;;
clippy) ;;
install) ;;
run) ;;
deb) echo "$CARGO_TARGET_DIR/debian/reaplet_0.1.0-1_amd64.deb" ;;
metadata)
    t() { printf '{"kind":["%s"],"name":"%s"}' "$1" "$2"; }
    echo "{\"packages\":[{\"name\":\"reaplet\",\"targets\":[$(t lib reaplet),$(t test api),$(t test pipeline),$(t test vm),$(t test handover),$(t bench termination)]}]}" ;;
test)
    nff= sel=() all=1 next=
    for a in "$@"; do
        [ "$a" = -- ] && break
        if [ -n "$next" ]; then sel+=("$next:$a"); next=; continue; fi
        case $a in
        --no-fail-fast) nff=1 ;;
        --no-run) echo "    Finished \`test\` profile" >&2; exit 0 ;;
        --lib) sel+=(lib:reaplet); all= ;;
        --test|--bench) next=${a#--}; all= ;;
        esac
    done
    [ -n "$all" ] && sel=(lib:reaplet test:api test:pipeline test:vm test:handover bench:termination)
    failed=()
    for s in "${sel[@]}"; do
        case $s in
        lib:reaplet) ok_bin "unittests src/lib.rs" reaplet grace::tests::floor ;;
        test:api)
            if [ -n "${FAKE_TEST_FAIL:-}" ]; then
                echo "     Running tests/api.rs (target/debug/deps/api-0123456789abcdef)" >&2
                printf '\nrunning 2 tests\ntest watch::lists_once ... ok\ntest watch::backs_off ... FAILED\n\n'
                printf 'failures:\n\n---- watch::backs_off stdout ----\n42 LISTs in 60 s\n\n'
                printf "thread 'watch::backs_off' (77) panicked at tests/api.rs:9:5:\n42 LISTs, want at most 10\ngaps: 0.7 0.7\nthe API server log: 3 lines\nnote: run with RUST_BACKTRACE=1\nnot in the summary\n"
                printf 'failures:\n    watch::backs_off\n\ntest result: FAILED. 1 passed; 1 failed\n\n'
                echo 'error: test failed, to rerun pass `--test api`' >&2
                failed+=("--test api")
                if [ -z "$nff" ]; then exit 101; fi
            else
                ok_bin tests/api.rs api watch::lists_once
            fi ;;
        test:pipeline) ok_bin tests/pipeline.rs pipeline pipeline_runs ;;
        test:vm)
            if [ -n "${FAKE_TEST_FAIL:-}" ]; then
                echo "     Running tests/vm/main.rs (target/debug/deps/vm-0123456789abcdef)" >&2
                echo "vm: qemu cannot run here"
                echo 'error: test failed, to rerun pass `--test vm`' >&2
                printf '\nCaused by:\n  process didn'"'"'t exit successfully: `target/debug/deps/vm-0123456789abcdef` (exit status: 1)\n' >&2
                failed+=("--test vm")
            else
                ok_bin tests/vm/main.rs vm vm::check_passes
            fi ;;
        test:handover) ok_bin tests/handover.rs handover a_term_ignoring_pod_is_killed_at_its_grace_never_before ;;
        bench:termination)
            echo "     Running benches/termination/main.rs (target/debug/deps/termination-0123456789abcdef)" >&2
            echo "single: DELETE -> gone median 180 ms" ;;
        esac
    done
    if [ ${#failed[@]} -gt 0 ]; then
        echo "error: ${#failed[@]} targets failed:" >&2
        for f in "${failed[@]}"; do echo "    \`$f\`" >&2; done
        exit 101
    fi ;;
*) echo "fake cargo: unexpected $*" >&2; exit 2 ;;
esac
"##;

/// A fake repository with scripts/test.sh and stub set-up scripts; FAKE_SETUP_FAIL=install
/// makes `testbed/testbed.sh install` fail.
fn test_sh_sandbox() -> Sandbox {
    let sb = Sandbox::new(&[]);
    sb.copy_script("scripts/test.sh");
    sb.write_exe(
        "repo/testbed/testbed.sh",
        r#"echo "testbed.sh $*" >>"$CALLS"
if [ "$1" = "${FAKE_SETUP_FAIL:-}" ]; then echo "E: Unable to locate package containerd" >&2; exit 100; fi
[ "$1" = images ] && echo /nonexistent/images
exit 0"#,
    );
    sb.write_exe(
        "repo/testbed/containerd.sh",
        r#"echo "containerd.sh $*" >>"$CALLS"; echo /nonexistent/containerd"#,
    );
    sb.write_exe(
        "repo/testbed/vm/image.sh",
        r#"echo "image.sh $*" >>"$CALLS"; echo /nonexistent/vm"#,
    );
    sb.write_exe(
        "repo/testbed/kube.sh",
        r#"echo "kube.sh $*" >>"$CALLS"; echo /nonexistent/kube"#,
    );
    sb.write_exe(
        "repo/testbed/helm.sh",
        r#"echo "helm.sh $*" >>"$CALLS"; echo /nonexistent/helm"#,
    );
    sb.fake("cargo", FAKE_CARGO_FOR_TEST_SH);
    sb
}

fn run_test_sh(sb: &Sandbox, env: &[(&str, &str)]) -> Run {
    let mut c = sb.command(&sb.path("repo/scripts/test.sh"), &[]);
    c.env("CARGO_TARGET_DIR", sb.path("target"));
    // cargo-deb is looked for (and installed) below it: never the machine's own cache
    c.env("REAPLET_CACHE_DIR", sb.path("cache"));
    for (k, v) in env {
        c.env(k, v);
    }
    run(c)
}

/// The script's summary: everything from its summary line on.
fn summary(r: &Run) -> &str {
    match r.stderr.find("---- summary") {
        Some(i) => &r.stderr[i..],
        None => panic!("test.sh printed no summary:\n{r:?}"),
    }
}

#[test]
fn test_sh_runs_every_test_binary_and_names_the_failures() {
    let sb = test_sh_sandbox();
    let r = run_test_sh(&sb, &[("FAKE_TEST_FAIL", "1")]);
    // the binaries after the failing one ran
    assert!(
        r.all().contains("test pipeline_runs ... ok"),
        "the binaries after the failed one did not run:\n{r:?}"
    );
    assert!(r.all().contains("vm: qemu cannot run here"), "{r:?}");
    assert!(
        sb.calls().contains("--no-fail-fast"),
        "cargo test without --no-fail-fast:\n{}",
        sb.calls()
    );
    assert_eq!(r.code, Some(1), "{r:?}");
    let s = summary(&r);
    for want in [
        "FAILED test binary tests/api.rs",
        "--test api",
        "watch::backs_off",
        "panicked at tests/api.rs:9:5:",
        "42 LISTs, want at most 10",
        "gaps: 0.7 0.7",
        "the API server log: 3 lines",
        "FAILED test binary tests/vm/main.rs",
        "exit status: 1",
        "2 of 8 test binaries failed",
    ] {
        assert!(s.contains(want), "the summary lacks {want:?}:\n{s}");
    }
    assert!(
        !s.contains("not in the summary"),
        "a line after the panic message's end (its note) in the summary:\n{s}"
    );
    assert!(
        !s.contains("watch::lists_once"),
        "a passed test in the summary:\n{s}"
    );
    assert!(
        !s.contains("pipeline"),
        "a passed binary in the summary:\n{s}"
    );
    // each failed test in one line near the end, where CI's short tail still shows it
    let lines: Vec<&str> = s.lines().collect();
    let short = "in short: watch::backs_off (tests/api.rs:9:5): 42 LISTs, want at most 10";
    let at = lines.iter().position(|l| l.ends_with(short));
    assert!(
        at.is_some_and(|i| i + 4 >= lines.len()),
        "no {short:?} among the summary's last lines:\n{s}"
    );
    // and the whole output is kept
    let log = std::fs::read_to_string(sb.path("target/test.log")).expect("target/test.log");
    assert!(log.contains("42 LISTs in 60 s"), "{log}");
}

#[test]
fn test_sh_keeps_going_after_a_format_failure_and_fails_at_the_end() {
    let sb = test_sh_sandbox();
    let r = run_test_sh(&sb, &[("FAKE_FMT_FAIL", "1")]);
    assert_eq!(r.code, Some(1), "{r:?}");
    let calls = sb.calls();
    assert_eq!(calls.matches("cargo clippy").count(), 2, "{calls}");
    assert!(calls.contains("cargo test"), "{calls}");
    let s = summary(&r);
    assert!(s.contains("FAILED step: format check"), "{s}");
    assert!(s.contains("0 of 8 test binaries failed"), "{s}");
}

#[test]
fn test_sh_all_green_exits_0_with_a_summary() {
    let sb = test_sh_sandbox();
    let r = run_test_sh(&sb, &[]);
    assert_eq!(r.code, Some(0), "{r:?}");
    let s = summary(&r);
    assert!(s.contains("all passed"), "{s}");
    assert!(s.contains("0 of 8 test binaries failed"), "{s}");
    // every step announced itself and said how long it took
    for n in 1..=13 {
        assert!(r.stderr.contains(&format!("[{n}/13] ")), "step {n}:\n{r:?}");
    }
    assert_eq!(r.stderr.matches(": ok (").count(), 13, "{r:?}");
    let calls = sb.calls();
    assert!(
        calls.contains("cargo install --locked cargo-deb"),
        "{calls}"
    );
    assert!(calls.contains("testbed.sh reaplet-image"), "{calls}");
    assert!(sb.calls().contains("kube.sh build"), "{}", sb.calls());
    assert!(sb.calls().contains("helm.sh build"), "{}", sb.calls());
    assert!(sb.calls().contains("containerd.sh build"), "{}", sb.calls());
    // the compatibility job: Debian's containerd, the handover smoke test and one benchmark
    assert!(
        calls.contains("--test handover") && calls.contains("(runtime debian)"),
        "{calls}"
    );
    // the benchmark binary the tests built, never a `cargo bench` (a second, release build)
    assert!(
        calls.contains("--bench termination -- --bench single (runtime debian)"),
        "{calls}"
    );
    assert!(!calls.contains("cargo bench"), "{calls}");
    // the test binaries in lanes side by side, then the ones run alone
    assert!(
        calls.contains("cargo test --no-run --all-targets"),
        "{calls}"
    );
    assert!(calls.contains("--test vm -- --show-output"), "{calls}");
    // the short binaries with half-second bounds run alone, one after another, before it
    assert!(
        calls.contains("--test api --test pipeline --test vm -- --show-output"),
        "{calls}"
    );
}

#[test]
fn test_sh_stops_at_a_failed_set_up_step_naming_it() {
    let sb = test_sh_sandbox();
    let r = run_test_sh(&sb, &[("FAKE_SETUP_FAIL", "install")]);
    assert_ne!(r.code, Some(0), "{r:?}");
    assert!(
        r.stderr
            .contains("set-up step \"test bed packages\" failed"),
        "{r:?}"
    );
    assert!(
        r.stderr.contains("E: Unable to locate package containerd"),
        "{r:?}"
    );
    assert!(!sb.calls().contains("cargo"), "{}", sb.calls());
}

// ---------------------------------------------------------------------------------------------
// scripts/demo.sh

/// A fake repository with scripts/demo.sh, a stub test bed and a fake `cargo build` that prints
/// 60 "Compiling" lines (or fails, with FAKE_BUILD_FAIL) and writes a fake `reaplet-demo`.
fn demo_sandbox() -> Sandbox {
    let sb = Sandbox::new(&[]);
    sb.copy_script("scripts/demo.sh");
    sb.write_exe(
        "repo/testbed/testbed.sh",
        r#"echo "testbed.sh $*" >>"$CALLS"; [ "$1" = images ] && echo /nonexistent/images; exit 0"#,
    );
    sb.fake(
        "cargo",
        r#"echo "cargo $*" >>"$CALLS"
if [ -n "${FAKE_BUILD_FAIL:-}" ]; then
    echo "error[E0425]: cannot find value \`x\` in this scope" >&2; exit 101
fi
for i in $(seq 1 60); do echo "   Compiling crate$i v1.0.0" >&2; done
echo "    Finished \`release\` profile [optimized] target(s) in 1.00s" >&2
out=${CARGO_TARGET_DIR:-target}/release
mkdir -p "$out"
printf '#!/bin/bash\necho "POD WHY GRACE (fake reaplet-demo $*)"\n' >"$out/reaplet-demo"
chmod +x "$out/reaplet-demo""#,
    );
    sb
}

#[test]
fn demo_sh_shows_each_step_with_its_duration() {
    let sb = demo_sandbox();
    let r = run(sb.command(&sb.path("repo/scripts/demo.sh"), &[]));
    assert_eq!(r.code, Some(0), "{r:?}");
    assert!(
        r.stdout
            .contains("POD WHY GRACE (fake reaplet-demo --testbed-dir"),
        "{r:?}"
    );
    for want in [
        "demo: [1/5] test bed packages",
        "(apt-get",
        "demo: [2/5] container images",
        "demo: [3/5] building reaplet",
        "50 crates compiled",
        "demo: [4/5] private containerd: containerd 2.x, starting it",
        "demo: [5/5] the demo: five pods",
    ] {
        assert!(r.stderr.contains(want), "no {want:?}:\n{r:?}");
    }
    assert_eq!(r.stderr.matches(": done (").count(), 4, "{r:?}");
    assert!(
        !r.stderr.contains("Compiling"),
        "cargo's lines are summarised:\n{r:?}"
    );
    assert!(sb.calls().contains("testbed.sh stop"), "{}", sb.calls());
}

#[test]
fn demo_sh_stops_at_a_failed_build_naming_the_step() {
    let sb = demo_sandbox();
    let mut c = sb.command(&sb.path("repo/scripts/demo.sh"), &[]);
    c.env("FAKE_BUILD_FAIL", "1");
    let r = run(c);
    assert_ne!(r.code, Some(0), "{r:?}");
    assert!(r.stderr.contains("error[E0425]"), "{r:?}");
    assert!(
        r.stderr.contains("[3/5] building reaplet") && r.stderr.contains(": FAILED (status"),
        "{r:?}"
    );
    assert!(!r.stdout.contains("POD"), "{r:?}");
}

// ---------------------------------------------------------------------------------------------
// testbed/testbed.sh install: apt

/// What `install` must look for: these are hidden so that it installs them.
const TESTBED_PACKAGES: &[&str] = &["containerd", "runc", "gcc", "ctr", "dbus-daemon"];

fn apt_sandbox(apt_get: &str) -> Sandbox {
    let mut hide = TESTBED_PACKAGES.to_vec();
    hide.extend(["apt-get", "apt-cache", "sleep"]);
    let sb = Sandbox::new(&hide);
    sb.fake("apt-get", apt_get);
    sb.fake("sleep", r#"echo "sleep $*" >>"$CALLS""#);
    sb
}

#[test]
fn install_stops_with_a_message_naming_the_failed_apt_step() {
    let sb = apt_sandbox(
        r#"echo "apt-get $*" >>"$CALLS"
case " $* " in
*" install "*) echo "E: Unable to locate package containerd" >&2; exit 100 ;;
esac"#,
    );
    let r = run(sb.command(&repo().join("testbed/testbed.sh"), &["install"]));
    assert_eq!(r.code, Some(1), "{r:?}");
    assert!(
        r.stderr
            .contains("testbed: ERROR: install step \"apt-get install containerd runc gcc"),
        "{r:?}"
    );
    assert!(r.stderr.contains("status 100"), "{r:?}");
    assert!(
        r.stderr.contains("E: Unable to locate package containerd"),
        "apt's own message is shown:\n{r:?}"
    );
    let calls = sb.calls();
    for line in calls.lines().filter(|l| l.starts_with("apt-get")) {
        assert!(
            line.contains("-o DPkg::Lock::Timeout=") && line.contains("-o Acquire::Retries="),
            "apt-get without a lock timeout and retries: {line}"
        );
    }
}

#[test]
fn install_retries_a_failing_apt_update() {
    // update fails twice (another apt holds the lists lock), then works; install "installs" by
    // putting the commands on PATH
    let sb = apt_sandbox(
        r#"echo "apt-get $*" >>"$CALLS"
case " $* " in
*" update "*)
    n=$(grep -c ' update' "$CALLS")
    if [ "$n" -le 2 ]; then echo "E: Could not get lock /var/lib/apt/lists/lock" >&2; exit 100; fi ;;
*" install "*)
    for p in "$@"; do
        case $p in -*|install|*=*) ;; *) printf '#!/bin/bash\n' >"$(dirname "$0")/$p"; chmod +x "$(dirname "$0")/$p" ;; esac
    done ;;
esac"#,
    );
    let r = run(sb.command(&repo().join("testbed/testbed.sh"), &["install"]));
    assert_eq!(r.code, Some(0), "{r:?}");
    let calls = sb.calls();
    assert_eq!(calls.matches(" update").count(), 3, "{calls}");
    assert_eq!(calls.matches(" install ").count(), 1, "{calls}");
    assert!(
        calls.contains("sleep 5") && calls.contains("sleep 10"),
        "{calls}"
    );
    assert!(
        r.stderr.contains("apt-get update failed (attempt 1 of 4")
            && r.stderr.contains("Could not get lock"),
        "{r:?}"
    );
    for line in calls.lines().filter(|l| l.starts_with("apt-get")) {
        assert!(
            line.contains("-o DPkg::Lock::Timeout=") && line.contains("-o Acquire::Retries="),
            "apt-get without a lock timeout and retries: {line}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// testbed/testbed.sh images: digests

/// `testbed.sh images` in the sandbox (a real build with /bin/busybox and gcc; apt-get must not
/// be needed); returns the run and the image directory it printed.
fn images(sb: &Sandbox) -> (Run, PathBuf) {
    let r = run(sb.command(&repo().join("testbed/testbed.sh"), &["images"]));
    assert_eq!(
        r.code,
        Some(0),
        "testbed.sh images failed (the test suite's set-up installs busybox-static and gcc: \
         run `testbed/testbed.sh install` first):\n{r:?}"
    );
    let dir = PathBuf::from(r.stdout.lines().last().unwrap_or_default().trim());
    assert!(
        dir.starts_with(sb.path("cache")),
        "{} is not in the sandbox's cache:\n{r:?}",
        dir.display()
    );
    (r, dir)
}

fn images_sandbox() -> Sandbox {
    let sb = Sandbox::new(&["apt-get"]);
    sb.fake(
        "apt-get",
        r#"echo "apt-get must not run in this test: $*" >&2; exit 1"#,
    );
    sb
}

#[test]
fn cached_images_that_fail_their_digest_are_rebuilt() {
    let sb = images_sandbox();
    let (_, dir) = images(&sb);
    let busybox = dir.join("busybox.tar");
    let pause = dir.join("pause.tar");
    let busybox_good = std::fs::read(&busybox).unwrap();
    let pause_good = std::fs::read(&pause).unwrap();

    // intact: reused as it is
    let (r, again) = images(&sb);
    assert_eq!(again, dir);
    assert!(
        !r.stderr.contains("building"),
        "rebuilt an intact cache:\n{r:?}"
    );

    // truncated (an interrupted copy, a full disk)
    std::fs::OpenOptions::new()
        .write(true)
        .open(&busybox)
        .unwrap()
        .set_len(busybox_good.len() as u64 / 2)
        .unwrap();
    let (r, again) = images(&sb);
    assert_eq!(again, dir);
    assert!(r.stderr.contains("rebuilding"), "{r:?}");
    assert!(
        std::fs::read(&busybox).unwrap() == busybox_good,
        "busybox.tar was not rebuilt:\n{r:?}"
    );

    // one byte changed, same size
    let mut bad = pause_good.clone();
    let mid = bad.len() / 2;
    bad[mid] ^= 0xff;
    std::fs::write(&pause, &bad).unwrap();
    let (r, _) = images(&sb);
    assert!(r.stderr.contains("rebuilding"), "{r:?}");
    assert!(
        std::fs::read(&pause).unwrap() == pause_good,
        "pause.tar was not rebuilt:\n{r:?}"
    );
}

#[test]
fn concurrent_image_builds_share_one_cache_entry() {
    let sb = images_sandbox();
    let children: Vec<_> = (0..4)
        .map(|_| {
            sb.command(&repo().join("testbed/testbed.sh"), &["images"])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut dirs = Vec::new();
    for c in children {
        let out = c.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        dirs.push(String::from_utf8_lossy(&out.stdout).trim().to_string());
    }
    dirs.dedup();
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    // one build happened; the entry is whole and verifies
    let (r, _) = images(&sb);
    assert!(!r.stderr.contains("building"), "{r:?}");
}

// ---------------------------------------------------------------------------------------------
// testbed/vm/image.sh: digests

/// Sources image.sh and drives its `main` with a stub build (a 1 MiB rootfs.img), counting the
/// builds in $CALLS. `steps` is bash run after the sourcing.
fn vm_image(sb: &Sandbox, steps: &str) -> Run {
    let script = format!(
        r#"set -euo pipefail
source "{image_sh}"
preflight() {{ :; }}
install_host_tools() {{ :; }}
cache_key() {{ echo testkey; }}
build() {{
    echo build >>"$CALLS"
    mkdir -p "$1.new"
    for f in vmlinuz initrd.gz kernel; do echo "$f" >"$1.new/$f"; done
    head -c 1048576 /dev/urandom >"$1.new/rootfs.img"
    rm -rf "$1"
    mv "$1.new" "$1"
}}
{steps}"#,
        image_sh = repo().join("testbed/vm/image.sh").display()
    );
    let driver = sb.path("drive-image.sh");
    std::fs::write(&driver, script).unwrap();
    run(sb.command(&driver, &[]))
}

#[test]
fn a_cached_vm_image_that_fails_its_digest_is_rebuilt() {
    // nothing real may run: no apt, no mmdebstrap (the old script ran main when sourced)
    let sb = Sandbox::new(&["apt-get", "apt-cache", "mmdebstrap"]);
    for c in ["apt-get", "apt-cache", "mmdebstrap"] {
        sb.fake(
            c,
            &format!(r#"echo "{c} must not run in this test" >&2; exit 1"#),
        );
    }
    let r = vm_image(
        &sb,
        r#"dir=$(main); echo "built $dir"
again=$(main); echo "reused $again"
truncate -s 1000 "$dir/rootfs.img"
again=$(main); echo "after truncation $again $(stat -c %s "$again/rootfs.img")"
rm "$dir/SHA256SUMS"
again=$(main); echo "after an unfinished build $again"
printf x >>"$dir/initrd.gz"
again=$(main); echo "after a changed initrd $again""#,
    );
    assert_eq!(r.code, Some(0), "{r:?}");
    let builds = sb.calls().matches("build").count();
    assert_eq!(builds, 4, "first, truncated, unfinished, changed:\n{r:?}");
    assert!(r.stdout.contains("after truncation "), "{r:?}");
    assert!(
        r.stdout.contains(" 1048576\n"),
        "rootfs.img not rebuilt:\n{r:?}"
    );
    assert_eq!(r.stderr.matches("rebuilding").count(), 3, "{r:?}");
}
