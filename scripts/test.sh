#!/usr/bin/env bash
# reaplet's whole test suite. Installs what it needs (containerd, runc, busybox-static from
# Debian's packages; busybox and pause images built locally; the real kube-apiserver, etcd,
# kubelet, controller manager and scheduler v1.36 built from the Go module proxy by
# testbed/kube.sh and cached in ~/.cache/reaplet/kube), then: format check, clippy with
# warnings as errors, unit tests, and the integration tests against real containerd instances
# (each integration test starts its own private containerd through testbed/testbed.sh), and the
# VM test (tests/vm: reaplet as a systemd service next to containerd with the systemd cgroup
# driver, in a Debian guest under qemu; its image is built once and cached in
# ~/.cache/reaplet/vm). Needs root: the tests run containers, remove cgroups, mount a tmpfs
# and build the VM's root filesystem.
#
# Every step says what it does and how long it took. A failed set-up step (packages, images)
# stops the script at once: nothing after it could run. A failed check (fmt, clippy) does not:
# the tests still run, and every test binary runs even when an earlier one fails
# (`cargo test --no-fail-fast`). The script ends with a summary of everything that failed (the
# steps, the test binaries and their failed tests) and exits 1 if anything did. The whole test
# output is also in $CARGO_TARGET_DIR/test.log (default target/test.log).
#
# The feature test-hooks compiles in the VM test's way to wedge reaplet's main loop (the
# watchdog scenario), and testbed the test bed and demo machinery; release builds have neither.
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/.."

ME=scripts/test.sh
FEATURES=test-hooks,testbed
TARGET=${CARGO_TARGET_DIR:-target}
LOG=$TARGET/test.log
STEPS=8

say() { printf '%s: %s\n' "$ME" "$*" >&2; }

if [ "$(id -u)" != 0 ]; then
    say "the integration tests need root (containerd, cgroups, mounts)."
    say "run as root; they are never skipped."
    exit 1
fi

T0=$EPOCHREALTIME
# seconds since $1 (an $EPOCHREALTIME), one decimal
since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }

failed=()
# step N NAME DETAIL COMMAND...: runs one step with a progress line before and after;
# returns the command's status (and records a failure)
step() {
    local n=$1 name=$2 detail=$3 t rc=0
    shift 3
    say "[$n/$STEPS] $name: $detail ..."
    t=$EPOCHREALTIME
    "$@" || rc=$?
    if [ "$rc" = 0 ]; then
        say "[$n/$STEPS] $name: ok ($(since "$t") s)"
    else
        say "[$n/$STEPS] $name: FAILED (status $rc, $(since "$t") s)"
        failed+=("$name (status $rc)")
    fi
    return "$rc"
}
# a set-up step that fails stops everything: the tests cannot run without it
setup() {
    step "$@" && return
    say "set-up step \"$2\" failed (its messages are above); stopping: no test can run without it."
    exit 1
}
quiet() { "$@" >/dev/null; }

setup 1 "test bed packages" \
    "containerd, runc, busybox-static, gcc, dbus-daemon (testbed/testbed.sh install; apt-get when missing)" \
    testbed/testbed.sh install
setup 2 "container images" "busybox and pause (testbed/testbed.sh images; cached, digests checked)" \
    quiet testbed/testbed.sh images
setup 3 "VM image" "testbed/vm/image.sh (cached, digests checked; the first build takes minutes)" \
    quiet testbed/vm/image.sh
setup 4 "Kubernetes components" \
    "kube-apiserver, kubelet, kube-controller-manager, kube-scheduler, etcd from the Go module proxy (testbed/kube.sh; cached; a cold build takes about 12 min)" \
    testbed/kube.sh build

step 5 "format check" "cargo fmt --all -- --check (cargo fmt --all fixes it)" \
    cargo fmt --all -- --check || true
step 6 "clippy" "all targets, features $FEATURES, warnings as errors" \
    cargo clippy --all-targets --locked --features "$FEATURES" -- -D warnings || true
# the production build (no test machinery) must be clean too
step 7 "clippy (production)" "the binary and library without features, warnings as errors" \
    cargo clippy --bin reaplet --lib --locked -- -D warnings || true

run_tests() {
    mkdir -p "$TARGET"
    # the integration tests mostly wait on grace periods: run several at once
    RUST_TEST_THREADS=${RUST_TEST_THREADS:-8} cargo test --no-fail-fast --all-targets --locked \
        --features "$FEATURES" -- --show-output 2>&1 | tee "$LOG"
}
step 8 "tests" "every test binary, even after a failure (cargo test --no-fail-fast; output also in $LOG)" \
    run_tests || true

# summarise LOG: which test binaries failed and which of their tests, from cargo's output
# ("Running tests/api.rs (...)", "test NAME ... FAILED", "error: test failed, to rerun pass `--test api`")
summarise() {
    awk -v me="$ME" -v features="$FEATURES" '
        function bad(target) { if (!(target in isbad)) { isbad[target] = 1; order[++nbad] = target } }
        /^ +Running / {
            cur = $0; sub(/^ +Running (unittests )?/, "", cur); sub(/ \(.*$/, "", cur); nbin++; next
        }
        /^ +Doc-tests / { cur = "doc-tests " $2; nbin++; next }
        /^test .* \.\.\. FAILED/ {
            t = $0; sub(/^test /, "", t); sub(/ \.\.\. FAILED.*$/, "", t)
            if (cur == "") cur = "(before any test binary)"
            bad(cur)
            if (!((cur, t) in seen)) { seen[cur, t] = 1; names[cur] = names[cur] "\n" me ":         " t }
            next
        }
        /^error: test failed, to rerun pass `/ {
            f = $0; sub(/^.*pass `/, "", f); sub(/`.*$/, "", f)
            if (cur == "") cur = f
            bad(cur); flag[cur] = f; next
        }
        /process didn.t exit successfully: .*\(/ {
            s = $0; sub(/^.*\(/, "(", s); if (cur != "") status[cur] = s; next
        }
        /^error: could not compile/ { compile = compile "\n" me ":     " $0; next }
        END {
            if (compile != "") printf "%s:   the tests did not build:%s\n", me, compile
            else if (nbin == 0) printf "%s:   no test binary ran (see %s)\n", me, ENVIRON["LOG"]
            for (i = 1; i <= nbad; i++) {
                b = order[i]
                printf "%s:   FAILED test binary %s", me, b
                if (b in flag) printf " (rerun: cargo test --features %s %s)", features, flag[b]
                printf "\n"
                if (b in names) printf "%s:       failed tests:%s\n", me, names[b]
                else printf "%s:       no test reported FAILED: the binary itself failed %s\n", me, \
                    (b in status) ? status[b] : "(crash or timeout; see the log)"
            }
            printf "%s:   %d of %d test binaries failed\n", me, nbad, nbin
        }' "$LOG" >&2
}

say "---- summary ($(since "$T0") s) ----"
for f in ${failed[@]+"${failed[@]}"}; do
    say "  FAILED step: $f"
done
LOG=$LOG summarise
if [ ${#failed[@]} = 0 ]; then
    say "all passed: packages, images, VM image, Kubernetes components, fmt, clippy (twice), every test binary"
    exit 0
fi
say "full test output: $LOG"
exit 1
