//! The VM test: reaplet as a systemd service next to containerd, in a Debian 12 guest under
//! qemu (KVM when `/dev/kvm` is usable, TCG otherwise; the output says which, and
//! `REAPLET_VM_ACCEL=tcg` forces software emulation), with containerd on the **systemd cgroup
//! driver**. The development machines' PID 1 is not systemd, so READY/WATCHDOG, ordering,
//! "stop never kills pods" and systemd-driver cgroup naming can only be proven here.
//!
//! One binary, two roles:
//! * **host** (what `cargo test` runs, `harness = false`): builds or finds the cached image
//!   (`testbed/vm/image.sh`) and the test images (`testbed/testbed.sh images`), packs the inputs
//!   (this binary, reaplet's two Debian packages that scripts/test.sh builds, the test-hooks
//!   `reaplet` this test was built with, `testbed/vm/config.yaml`, the images) onto a raw disk,
//!   boots one VM, reads the results disk and reports every scenario individually, with the
//!   guest's journals on failure;
//! * **guest** (`vm-guest --guest IN OUT`, started by the guest's runner unit): installs reaplet
//!   from its package (first scenario: install, upgrade, purge; then installed again), runs the
//!   scenarios in order and writes `results.jsonl` into OUT. Every scenario runs the packaged
//!   `/usr/bin/reaplet` but the watchdog's, which needs the test-hooks build.
//!
//! Needs root on the host (image build). When qemu cannot run, the test fails loudly.

// the in-process API server of the integration tests, for the standby scenario in the guest
#[allow(unused_imports)]
#[path = "../common/apiserver/mod.rs"]
mod apiserver;
mod guest;
mod host;
#[path = "../common/port.rs"]
mod port;
#[path = "../common/standin.rs"]
mod standin;

use serde::{Deserialize, Serialize};

/// Every scenario the guest must report; the host fails on any that is missing.
pub const SCENARIOS: &[&str] = &[
    "package_install_upgrade_purge",
    "check_passes",
    "ready_only_after_cri",
    "shutdown_off_takes_no_inhibitor",
    "orphan_stopped_with_grace_1",
    "manifest_removal_terminates",
    "pod_slices_removed",
    "upgrade_during_api_outage",
    "stop_leaves_pods_running",
    "watchdog_restarts_hung_loop",
    "standby_rescues_a_terminating_pod",
    "poweroff_ends_pods_by_priority",
];

/// One line of `results.jsonl`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Outcome {
    pub scenario: String,
    pub ok: bool,
    pub secs: f64,
    pub detail: String,
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let code = if args.first().map(String::as_str) == Some("--guest") {
        guest::main(&args[1..])
    } else {
        host::main(&args)
    };
    std::process::exit(code);
}
