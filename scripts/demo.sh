#!/usr/bin/env bash
# reaplet's demo: a private containerd (the test bed), a handful of pods launched through CRI as
# the kubelet does, then deleted; reaplet stops them with the kubelet's grace rules and prints
# when each container stopped and how. Needs root. Installs containerd/runc/busybox if missing.
#
# The first run installs packages, builds the images and compiles reaplet (a few minutes); every
# step prints a line when it starts and when it ends, with its duration. Later runs take seconds.
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/.."
export REAPLET_TESTBED_DIR=/tmp/reaplet-tb-demo REAPLET_TESTBED_CGROUP_ROOT=/reaplet-tb-demo
TARGET=${CARGO_TARGET_DIR:-target}
STEPS=5

say() { printf 'demo: %s\n' "$*" >&2; }
# seconds since $1 (an $EPOCHREALTIME), one decimal
since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }

# step N NAME DETAIL COMMAND...: a line before and after; a failure stops the demo, naming the step
step() {
    local n=$1 name=$2 detail=$3 t rc=0
    shift 3
    say "[$n/$STEPS] $name: $detail ..."
    t=$EPOCHREALTIME
    "$@" || rc=$?
    if [ "$rc" != 0 ]; then
        say "[$n/$STEPS] $name: FAILED (status $rc, $(since "$t") s); its messages are above"
        exit "$rc"
    fi
    say "[$n/$STEPS] $name: done ($(since "$t") s)"
}

# cargo's "Compiling" lines become one progress line per 25 crates, and a line every 30 s while
# no crate starts (the last crates, reaplet itself among them, take minutes in a release build);
# anything else (warnings, errors) is shown as it is
build() {
    local t=$EPOCHREALTIME n=0 line last= rc
    # the demo is the test bed's crate (testbed/), never in a release package: it runs the agent
    # from reaplet's library
    cargo build --release --locked -p reaplet-testbed --bin reaplet-demo --color never 2>&1 |
        while true; do
            rc=0
            IFS= read -r -t 30 line || rc=$?
            if [ "$rc" -gt 128 ]; then # no line for 30 s
                if [ "$n" = 0 ]; then
                    say "      cargo has not started compiling yet ($(since "$t") s)"
                else
                    say "      still compiling ($(since "$t") s): $last, crate $n"
                fi
                continue
            fi
            [ "$rc" = 0 ] || break # the end of cargo's output
            case $line in
            *Compiling*)
                n=$((n + 1))
                last=${line#*Compiling }
                last=${last%% (*}
                if [ $((n % 25)) = 0 ]; then say "      $n crates compiled ($(since "$t") s)"; fi
                ;;
            *Finished*) ;;
            *) printf '%s\n' "$line" >&2 ;;
            esac
        done
}
quiet() { "$@" >/dev/null; }

[ "$(id -u)" = 0 ] || { say "the demo needs root (containerd, cgroups, mounts); run it as root"; exit 1; }

step 1 "test bed packages" "containerd, runc, busybox-static, gcc (apt-get, only when missing)" \
    testbed/testbed.sh install
step 2 "container images" "busybox and pause (built once, cached in ~/.cache/reaplet)" \
    quiet testbed/testbed.sh images
step 3 "building reaplet" \
    "cargo build --release --locked -p reaplet-testbed --bin reaplet-demo (the demo, which runs the agent from reaplet's library; the first build takes a few minutes)" \
    build
trap 'testbed/testbed.sh stop' EXIT
step 4 "private containerd" \
    "containerd 2.x, starting it in $REAPLET_TESTBED_DIR (its first build from the Go module proxy takes about 10 min)" \
    testbed/testbed.sh start
say "[5/$STEPS] the demo: five pods, four manifests removed, one orphan"
"$TARGET/release/reaplet-demo" --testbed-dir "$REAPLET_TESTBED_DIR" \
    --cgroup-root "$REAPLET_TESTBED_CGROUP_ROOT"
