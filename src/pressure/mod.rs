//! Node-pressure eviction: the kubelet's own reason to end pods when the node runs short of
//! memory or process IDs (kubelet counterpart: `pkg/kubelet/eviction`, v1.36).
//!
//! * [`thresholds`]: the eviction settings as the kubelet parses and validates them
//!   (`ParseThresholdConfig`, the Linux `evictionHard` defaults, `mergeDefaultEvictionSettings`,
//!   the `allocatableMemory.available` copy when `enforceNodeAllocatable` has `pods`);
//! * [`signals`]: the signals' observations from the kernel (`memory.available`,
//!   `allocatableMemory.available`, `pid.available`) and each pod's usage, read from a
//!   cgroup and proc root given by the caller (fixtures in tests);
//! * [`rank`]: the order in which pods are evicted per signal (`rankMemoryPressure`,
//!   `rankPIDPressure`), the critical pods never evicted, and the eviction message and
//!   annotations (`evictionMessage`);
//! * [`quantity_text`]: how a quantity prints itself in the message (`Quantity.String()`);
//! * [`manager`]: one decision pass as a pure step (`synchronize`);
//! * [`runner`]: the task that runs the passes while reaplet acts, evicts through the seam
//!   and waits for the cleanup.
//!
//! Invariants: the kubelet's decisions exactly (strictly-below thresholds, minimum reclaim,
//! memory before other signals, one pod per pass); only memory and PID signals are evaluated
//! (the disk signals are parsed, so any kubelet file loads, and reported as not evaluated);
//! nothing runs while reaplet is not the node's agent.

mod goparse;
pub mod manager;
pub mod quantity_text;
pub mod rank;
pub mod runner;
pub mod signals;
pub mod thresholds;
