//! The VM test: reaplet as a systemd service next to containerd, in a Debian 12 guest under
//! qemu (KVM when `/dev/kvm` is usable, TCG otherwise; the output says which, and
//! `REAPLET_VM_ACCEL=tcg` forces software emulation), with containerd on the **systemd cgroup
//! driver**. The development machines' PID 1 is not systemd, so READY/WATCHDOG, ordering,
//! "stop never kills pods" and systemd-driver cgroup naming can only be proven here.
//!
//! One binary, three roles:
//! * **host** (what `cargo test` runs, `harness = false`): builds or finds the cached image
//!   (`testbed/vm/image.sh`: containerd 2.x and the kubelet built from the Go module proxy are in
//!   it) and the test images (`testbed/testbed.sh images`), packs the inputs (this binary,
//!   reaplet's two Debian packages that scripts/test.sh builds, the test-hooks `reaplet` this
//!   test was built with, `testbed/vm/config.yaml`, the images) onto a raw disk, boots the image
//!   twice and reports every scenario individually, with the guest's journals on failure:
//!   - the **agent** boot: reaplet alone beside containerd (no kubelet, the in-process imitation
//!     of the API server where a scenario needs one);
//!   - the **node** boot: a whole node, the real kubelet v1.36 and reaplet in standby beside it,
//!     the real kube-apiserver and etcd on the host reached through qemu's user-mode network
//!     (`node.rs`);
//! * **guest** (`vm-guest --guest IN OUT BOOT`, started by the guest's runner unit): installs
//!   reaplet from its package, runs the boot's scenarios in order and writes `results.jsonl`
//!   into OUT. Every scenario runs the packaged `/usr/bin/reaplet` but the watchdog's, which
//!   needs the test-hooks build;
//! * **relay** (`--relay ADDR`, `--audit PATH`): what qemu runs for each connection the node
//!   boot's guest opens to the API server or to its audit log.
//!
//! Needs root on the host (image build). When qemu cannot run, the test fails loudly.

// the in-process API server of the integration tests, for the standby scenario in the guest
#[allow(unused_imports)]
#[path = "../common/apiserver/mod.rs"]
mod apiserver;
mod guest;
mod host;
// the real control plane of the node boot (host side) and its audit records (guest side)
#[allow(dead_code)]
#[path = "../common/kube/mod.rs"]
mod k8s;
#[path = "../common/port.rs"]
mod port;
#[path = "../common/standin.rs"]
mod standin;

use serde::{Deserialize, Serialize};

/// The guest's host name, and so its Node's name.
pub const NODE: &str = "reaplet-vm";

/// The two boots of the one image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Boot {
    Agent,
    Node,
}

impl Boot {
    pub fn name(self) -> &'static str {
        match self {
            Boot::Agent => "agent",
            Boot::Node => "node",
        }
    }

    pub fn scenarios(self) -> &'static [&'static str] {
        match self {
            Boot::Agent => AGENT_SCENARIOS,
            Boot::Node => NODE_SCENARIOS,
        }
    }
}

/// Every scenario of the agent boot; the host fails on any that is missing.
pub const AGENT_SCENARIOS: &[&str] = &[
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

/// Every scenario of the node boot (`node.rs`), in the order they run.
pub const NODE_SCENARIOS: &[&str] = &[
    "node_beside_live_kubelet_writes_nothing",
    "node_takeover_ends_deleted_pods",
    "node_upgrade_while_active_keeps_terminations",
    "node_pressure_evicts_on_cgroup_v2",
    "node_handback_writes_nothing_more",
    "node_poweroff_kubelet_owns_graceful_shutdown",
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
    let code = match args.first().map(String::as_str) {
        Some("--guest") => guest::main(&args[1..]),
        Some("--relay") => host::relay(args.get(1).map(String::as_str).unwrap_or_default()),
        Some("--audit") => host::audit(args.get(1).map(String::as_str).unwrap_or_default()),
        _ => host::main(&args),
    };
    std::process::exit(code);
}
