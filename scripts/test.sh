#!/usr/bin/env bash
# reaplet's whole test suite. Installs what it needs (runc, busybox-static and Debian's
# containerd 1.6 from Debian's packages; containerd 2.x, the runtime Kubernetes 1.36 supports,
# built from the Go module proxy by testbed/containerd.sh and cached in
# ~/.cache/reaplet/containerd; busybox and pause images built locally; the real kube-apiserver, etcd,
# kubelet, controller manager and scheduler v1.36 built from the Go module proxy by
# testbed/kube.sh and cached in ~/.cache/reaplet/kube; helm v4, built the same way by
# testbed/helm.sh and cached in ~/.cache/reaplet/helm; cargo-deb, cached in
# ~/.cache/reaplet/tools), builds the Debian package (and a second one, a higher revision, for
# the VM test's upgrade) and the DaemonSet's image from its release binary, then: format check,
# clippy with warnings as errors, unit tests, and the integration tests against real containerd
# instances (each integration test starts its own private containerd 2.x through
# testbed/testbed.sh), the compatibility job (Debian's containerd 1.6: a handover smoke test
# and the single-pod benchmark), and the VM test (tests/vm: reaplet installed from the Debian package as a
# systemd service next to containerd 2.x with the systemd cgroup driver, in a Debian guest under
# qemu, booted twice: alone, then as a whole node beside the real kubelet with the API server on
# the host; its image carries containerd 2.x and the kubelet built above, is built once and
# cached in ~/.cache/reaplet/vm). Needs root: the tests run
# containers, remove cgroups, mount a tmpfs and build the VM's root filesystem.
#
# Every step says what it does and how long it took. A failed set-up step (packages, images)
# stops the script at once: nothing after it could run. A failed check (fmt, clippy) does not:
# the tests still run, and every test binary runs even when an earlier one fails
# (`cargo test --no-fail-fast`). The script ends with a summary of everything that failed (the
# steps, the test binaries and their failed tests) and exits 1 if anything did. The whole test
# output is also in $CARGO_TARGET_DIR/test.log (default target/test.log).
#
# The feature test-hooks compiles in the VM test's way to wedge reaplet's main loop (the
# watchdog scenario), and testbed the test bed and demo machinery; release builds (the package,
# the DaemonSet's image) have neither.
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/.."

# no incremental compilation: a suite run builds each crate once, and incremental state would
# double the target dir (about 17 GB of it) for nothing
export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}

ME=scripts/test.sh
FEATURES=test-hooks,testbed
TARGET=${CARGO_TARGET_DIR:-target}
LOG=$TARGET/test.log
STEPS=13
# cargo-deb, pinned, installed once outside the repository
CARGO_DEB_VERSION=3.8.0
CARGO_DEB_ROOT=${REAPLET_CACHE_DIR:-${HOME:-/root}/.cache/reaplet}/tools/cargo-deb

say() { printf '%s: %s\n' "$ME" "$*" >&2; }

if [ "$(id -u)" != 0 ]; then
    say "the integration tests need root (containerd, cgroups, mounts)."
    say "run as root; they are never skipped."
    exit 1
fi

T0=$EPOCHREALTIME
# what a failure on another machine needs to be read: the kernel, the cgroup layout, memory
say "machine: $(uname -r), $(nproc) cores, cgroup $(stat -fc %T /sys/fs/cgroup/) at /sys/fs/cgroup$(
    [ -d /sys/fs/cgroup/memory ] && echo ' (memory controller on v1)'), $(awk '/MemTotal/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo) memory, $(awk '/SwapTotal/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo) swap"
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
    "containerd, runc, busybox-static, gcc, dbus-daemon, chromium, jq (testbed/testbed.sh install; apt-get when missing)" \
    testbed/testbed.sh install
setup 2 "containerd 2.x" \
    "containerd, its runc shim and ctr from the Go module proxy (testbed/containerd.sh; cached; a cold build takes about 10 min)" \
    testbed/containerd.sh build
setup 3 "container images" "busybox and pause (testbed/testbed.sh images; cached, digests checked)" \
    quiet testbed/testbed.sh images
setup 4 "Kubernetes components" \
    "kube-apiserver, kubelet, kube-controller-manager, kube-scheduler, etcd from the Go module proxy (testbed/kube.sh; cached; a cold build takes about 12 min)" \
    testbed/kube.sh build
# after containerd 2.x and the Kubernetes components: the image carries their containerd, shim,
# ctr and kubelet
setup 5 "VM image" "testbed/vm/image.sh (cached, digests checked; the first build takes minutes)" \
    quiet testbed/vm/image.sh
setup 6 "helm" \
    "helm v4 from the Go module proxy, for the chart's test on the real cluster (testbed/helm.sh; cached; a cold build takes 4 to 12 min)" \
    testbed/helm.sh build

# The Debian package, built with the production features only (cargo deb builds none), and the
# same package at Debian revision 2 for the VM test's upgrade: $TARGET/debian/reaplet_V-1_amd64.deb
# and $TARGET/debian/upgrade/reaplet_V-2_amd64.deb, the names tests/vm/host.rs looks for. The
# upgrade package is made first: every `cargo deb` deletes the other versions of the package
# lying in $TARGET/debian (not in its subdirectories). --strip: the release profile keeps debug
# info (about 190 MB), the packaged binary is about 30 MB without it. Leaves the release binary
# in $TARGET/release/reaplet (the next step's image is made from it).
package() {
    local main upgrade
    if [ "$("$CARGO_DEB_ROOT/bin/cargo-deb" --version 2>/dev/null)" != "cargo-deb $CARGO_DEB_VERSION" ]; then
        say "installing cargo-deb $CARGO_DEB_VERSION in $CARGO_DEB_ROOT (once; cargo install)"
        cargo install --locked cargo-deb --version "$CARGO_DEB_VERSION" --root "$CARGO_DEB_ROOT" ||
            return
    fi
    mkdir -p "$TARGET/debian/upgrade" || return
    # the man pages and shell completions the package carries, made from the command line's
    # definition (xtask/; release, so it shares the release build of reaplet's library)
    cargo run --locked --release --quiet -p reaplet-xtask -- dist "$TARGET/release" >/dev/null ||
        return
    upgrade=$(PATH=$CARGO_DEB_ROOT/bin:$PATH cargo deb --locked --strip --deb-revision 2 \
        -o "$TARGET/debian/upgrade/") || return
    main=$(PATH=$CARGO_DEB_ROOT/bin:$PATH cargo deb --no-build --locked --strip) || return
    say "package: $main"
    say "package for the VM test's upgrade: $upgrade"
}
setup 7 "package" \
    "the Debian package, production features (cargo deb; installs cargo-deb $CARGO_DEB_VERSION when missing)" \
    package
setup 8 "reaplet image" "the DaemonSet's image from the release binary (testbed/testbed.sh reaplet-image)" \
    quiet testbed/testbed.sh reaplet-image "$TARGET/release/reaplet"

step 9 "format check" "cargo fmt --all -- --check (cargo fmt --all fixes it)" \
    cargo fmt --all -- --check || true
step 10 "clippy" "the workspace's targets, features $FEATURES, warnings as errors" \
    cargo clippy --workspace --all-targets --locked --features "$FEATURES" -- -D warnings || true
# the production build (no test machinery) must be clean too
step 11 "clippy (production)" "the binary and library without features, warnings as errors" \
    cargo clippy --bin reaplet --lib --locked -- -D warnings || true

# The test binaries run in lanes side by side: most of their time is waiting (grace periods,
# the real components' own periods), and one after another they took 35 min of CI's 90 on 2
# cores. Every test bed, port and temporary directory is per test (a test bed's name is locked
# while it runs), so binaries do not meet; the one thing every real kubelet of the host shares,
# its device-plugin socket, is taken under a lock while a kubelet starts
# (tests/common/kube/kubelet.rs). Lanes are filled longest first from the durations
# below (seconds, a cold CI run on 2 cores; a binary not listed counts 60 s). Run alone
# afterwards, one after another: the short binaries whose bounds are half a second on a
# restart or a burst (api, pipeline, shutdown, container_events: in a lane, under the other
# lane's load, they missed them: 7.0 s for a 6.0-6.5 s deadline, 17.6 s for 10 s, a private
# dbus-daemon not yet listening), then the VM test (under TCG its guest keeps both cores busy).
LANES=${REAPLET_TEST_LANES:-2}
DURATIONS="test:standby_cost 465 test:apiserver_conformance 184 test:runtime_stall 134
test:api_outage 129 test:standby_proof 126 test:standby_kubelet 110 test:daemonset 102 test:helm 91
test:drain_real 88 test:node_identity 82 test:handover 79 test:api_sick 78 test:faults 69
bench:termination 60 test:drain 48 test:leaks 44 test:container_events 31 test:evictions 25
test:api 24 test:hostile_input 19 test:pipeline 19 test:standby 17 test:volumes 15 test:cli 13
test:timeline 11 lib:reaplet 10 test:statuses 8 test:shutdown 6 test:otel 5 test:scripts 5
test:config_cli 1 test:docs 1 bench:fleet 1 bin:reaplet 1 test:kubelet_reasons 480
member:reaplet-testbed 1 member:reaplet-xtask 1"
ALONE="test:api test:pipeline test:shutdown test:container_events test:vm"

# every target of the package as kind:name (lib, bin, test, bench), and every other package of
# the workspace (testbed/, xtask/) as member:name, from cargo's metadata
targets() {
    cargo metadata --no-deps --format-version 1 --locked |
        jq -r '.packages[] | if .name == "reaplet" then
                (.targets[] | select(.kind[0] | IN("lib", "bin", "test", "bench")) | "\(.kind[0]):\(.name)")
            else "member:\(.name)" end'
}
# kind:name -> cargo's selection arguments
target_args() {
    case $1 in
    lib:*) echo --lib ;;
    *) echo "--${1%%:*} ${1#*:}" ;;
    esac
}
# kind:name lines -> "lane\tkind:name" lines, longest first into the least loaded lane
assign_lanes() {
    awk -v lanes="$LANES" -v durations="$DURATIONS" '
        BEGIN { n = split(durations, d, /[ \n]+/); for (i = 1; i < n; i += 2) secs[d[i]] = d[i + 1] }
        { t[NR] = $0; s[NR] = ($0 in secs) ? secs[$0] : 60 }
        END {
            for (i = 1; i <= NR; i++) for (j = i + 1; j <= NR; j++)
                if (s[j] > s[i]) { x = s[i]; s[i] = s[j]; s[j] = x; x = t[i]; t[i] = t[j]; t[j] = x }
            for (i = 1; i <= NR; i++) {
                best = 1
                for (l = 2; l <= lanes; l++) if (load[l] < load[best]) best = l
                load[best] += s[i]; print best "\t" t[i]
            }
        }'
}
# one lane: cargo test on its targets, its output in its own log
lane() {
    local name=$1 log=$2 t args=() members=() rc=0
    shift 2
    for t in "$@"; do
        case $t in
        # another package of the workspace: its own tests, without reaplet's features
        member:*) members+=(-p "${t#member:}") ;;
        # shellcheck disable=SC2046 # word splitting wanted: "--test name"
        *) args+=($(target_args "$t")) ;;
        esac
    done
    t=$EPOCHREALTIME
    say "  lane $name: ${*//:/ } ..."
    : >"$log"
    if [ ${#args[@]} -gt 0 ]; then
        RUST_TEST_THREADS=${RUST_TEST_THREADS:-8} cargo test --no-fail-fast --locked \
            --features "$FEATURES" "${args[@]}" -- --show-output >>"$log" 2>&1 || rc=$?
    fi
    if [ ${#members[@]} -gt 0 ]; then
        cargo test --no-fail-fast --locked "${members[@]}" -- --show-output >>"$log" 2>&1 || rc=$?
    fi
    say "  lane $name: $([ "$rc" = 0 ] && echo passed || echo "FAILED (status $rc)") in $(since "$t") s"
    return "$rc"
}
run_tests() {
    local all lanes l rc=0 pids=() logs=() alone=()
    mkdir -p "$TARGET"
    : >"$LOG"
    # build every test binary once, in view: a compile error shows here, not in a lane
    cargo test --no-run --all-targets --locked --features "$FEATURES" 2>&1 | tee -a "$LOG" ||
        return
    all=$(targets) || return
    for l in $ALONE; do
        grep -qx "$l" <<<"$all" && alone+=("$l")
    done
    lanes=$(grep -vxF -f <(printf '%s\n' $ALONE) <<<"$all" | assign_lanes) || return
    for ((l = 1; l <= LANES; l++)); do
        mapfile -t ts < <(awk -F '\t' -v l="$l" '$1 == l { print $2 }' <<<"$lanes")
        [ ${#ts[@]} -gt 0 ] || continue
        logs+=("$TARGET/test-lane-$l.log")
        lane "$l" "$TARGET/test-lane-$l.log" "${ts[@]}" &
        pids+=($!)
    done
    for l in "${pids[@]}"; do
        wait "$l" || rc=1
    done
    if [ ${#alone[@]} -gt 0 ]; then
        logs+=("$TARGET/test-alone.log")
        lane alone "$TARGET/test-alone.log" "${alone[@]}" || rc=1
    fi
    # the whole output, lane after lane, on the console and in the log
    cat "${logs[@]}" | tee -a "$LOG"
    return "$rc"
}
step 12 "tests" "every test binary, even after a failure, $LANES lanes side by side, then the VM test (cargo test --no-fail-fast; output also in $LOG)" \
    run_tests || true

# The compatibility job: Debian's containerd 1.6 (reaplet also stands by on older nodes, whose
# kubelet runs containerd 1.6 or 1.7): the real kubelet's pods handed over to reaplet (a
# TERM-trapping pod ended at once, a TERM-ignoring one killed at its grace, nothing done
# beside a live kubelet), then the single-pod benchmark. Its test output goes to the same log.
COMPAT_TESTS=(
    a_term_trapping_pod_is_ended_at_once_with_its_status_and_a_uid_delete
    a_term_ignoring_pod_is_killed_at_its_grace_never_before
    beside_a_live_kubelet_reaplet_does_nothing_and_the_kubelet_ends_the_pod
)
compat() {
    local rc=0
    # (pipefail: a pipe's status is cargo's)
    REAPLET_TESTBED_RUNTIME=debian cargo test --no-fail-fast --locked --features "$FEATURES" \
        --test handover -- --show-output "${COMPAT_TESTS[@]}" 2>&1 | tee -a "$LOG" || rc=$?
    # the benchmark binary the tests built (a `cargo bench` would build everything again, in
    # the release profile: 10 minutes of CI for one figure), in its benchmark mode
    REAPLET_TESTBED_RUNTIME=debian cargo test --locked --features "$FEATURES" --bench termination \
        -- --bench single 2>&1 | tee -a "$LOG" || rc=$?
    return "$rc"
}
step 13 "compatibility" "Debian's containerd 1.6: handover smoke test and the single-pod benchmark (REAPLET_TESTBED_RUNTIME=debian)" \
    compat || true

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
            if (!((cur, t) in seen)) { seen[cur, t] = 1; tests[cur] = tests[cur] SUBSEP t; names[cur] = 1 }
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
        # a test panic: "thread 'NAME' (TID) panicked at FILE:LINE:COL:" then the message; its
        # first 60 lines are kept for the summary (CI shows only the tail, and the context a
        # failure prints, such as the logs of the agents after a timed-out wait, diagnoses it)
        /^thread .* panicked at / {
            t = $0; sub(/^thread \047/, "", t); sub(/\047.*$/, "", t)
            at = $0; sub(/^.*panicked at /, "", at)
            pkey = cur SUBSEP t; why[pkey] = "panicked at " at; more = 60
            a = at; sub(/:$/, "", a); short[pkey] = t " (" a ")"; headline = 1; next
        }
        more > 0 {
            if (headline && $0 == "") next
            if ($0 ~ /^(note: |stack backtrace:|$)/) { more = 0; next }
            m = $0; if (length(m) > 300) m = substr(m, 1, 300) "..."
            if (headline) {
                h = m; if (length(h) > 160) h = substr(h, 1, 160) "..."
                short[pkey] = short[pkey] ": " h; headline = 0
            }
            why[pkey] = why[pkey] "\n" me ":             " m; more--; next
        }
        END {
            if (compile != "") printf "%s:   the tests did not build:%s\n", me, compile
            else if (nbin == 0) printf "%s:   no test binary ran (see %s)\n", me, ENVIRON["LOG"]
            for (i = 1; i <= nbad; i++) {
                b = order[i]
                printf "%s:   FAILED test binary %s", me, b
                if (b in flag) printf " (rerun: cargo test --features %s %s)", features, flag[b]
                printf "\n"
                if (b in names) {
                    printf "%s:       failed tests:\n", me
                    n = split(substr(tests[b], 2), ts, SUBSEP)
                    for (j = 1; j <= n; j++) {
                        printf "%s:         %s\n", me, ts[j]
                        if ((b SUBSEP ts[j]) in why) printf "%s:           %s\n", me, why[b SUBSEP ts[j]]
                    }
                }
                else printf "%s:       no test reported FAILED: the binary itself failed %s\n", me, \
                    (b in status) ? status[b] : "(crash or timeout; see the log)"
            }
            # in short, last: each failed test with where and why, in the few lines CI shows
            for (i = 1; i <= nbad; i++) {
                b = order[i]; n = (b in names) ? split(substr(tests[b], 2), ts, SUBSEP) : 0
                for (j = 1; j <= n; j++) {
                    k = b SUBSEP ts[j]
                    printf "%s:   in short: %s\n", me, (k in short) ? short[k] : ts[j] " (no panic on the test thread)"
                }
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
    say "all passed: packages, containerd 2.x, images, Kubernetes components, VM image, helm, Debian package, reaplet image, fmt, clippy (twice), every test binary, the compatibility job"
    exit 0
fi
say "full test output: $LOG"
exit 1
