#!/usr/bin/env bash
# reaplet's whole test suite. Installs what it needs (containerd, runc, busybox-static from
# Debian's packages; busybox and pause images built locally), then: format check, clippy with
# warnings as errors, unit tests, and the integration tests against real containerd instances
# (each integration test starts its own private containerd through testbed/testbed.sh), and the
# VM test (tests/vm: reaplet as a systemd service next to containerd with the systemd cgroup
# driver, in a Debian guest under qemu; its image is built once and cached in
# ~/.cache/reaplet/vm). Needs root: the tests run containers, remove cgroups, mount a tmpfs
# and build the VM's root filesystem.
#
# The feature test-hooks compiles in the VM test's way to wedge reaplet's main loop (the
# watchdog scenario), and testbed the test bed and demo machinery; release builds have neither.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
    echo "scripts/test.sh: the integration tests need root (containerd, cgroups, mounts)." >&2
    echo "scripts/test.sh: run as root; they are never skipped." >&2
    exit 1
fi

testbed/testbed.sh install
testbed/testbed.sh images >/dev/null
testbed/vm/image.sh >/dev/null

cargo fmt --all -- --check
cargo clippy --all-targets --locked --features test-hooks,testbed -- -D warnings
# the production build (no test machinery) must be clean too
cargo clippy --bin reaplet --lib --locked -- -D warnings
# the integration tests mostly wait on grace periods: run several at once
RUST_TEST_THREADS=${RUST_TEST_THREADS:-8} cargo test --all-targets --locked --features test-hooks,testbed -- --show-output
