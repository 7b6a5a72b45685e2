#!/usr/bin/env bash
# reaplet's demo: a private containerd (the test bed), a handful of pods launched through CRI as
# the kubelet does, then deleted; reaplet stops them with the kubelet's grace rules and prints
# when each container stopped and how. Needs root. Installs containerd/runc/busybox if missing.
set -euo pipefail
cd "$(dirname "$0")/.."
export REAPLET_TESTBED_DIR=/tmp/reaplet-tb-demo REAPLET_TESTBED_CGROUP_ROOT=/reaplet-tb-demo
trap 'testbed/testbed.sh stop' EXIT
testbed/testbed.sh start
# the demo machinery is the `testbed` feature (never in a release package)
cargo build --release --quiet --features testbed --bin reaplet
./target/release/reaplet demo --testbed-dir "$REAPLET_TESTBED_DIR" --cgroup-root "$REAPLET_TESTBED_CGROUP_ROOT"
