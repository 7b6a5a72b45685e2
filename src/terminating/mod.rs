//! The terminating stage of a pod worker, its parts in pipeline order: the kubelet's
//! `pod_workers.go` `SyncTerminatingPod` and the runtime manager's `KillPod`
//! (`kuberuntime_container.go`, `kuberuntime_manager.go`).
//!
//! * [`grace`]: which grace period applies (the pod's, a deletion's, an override, only ever
//!   shorter) and the per-container arithmetic (whole seconds, the 2 s floor);
//! * [`hooks`]: preStop hooks (exec, HTTP, sleep), bounded by the grace;
//! * [`kill`]: stopping the containers (sidecars last) and the sandboxes; one container's stop
//!   (its hook, the grace, `StopContainer`) in `kill::container`;
//! * [`records`]: what was sent when, on disk, so that a restart resumes a stop where it was
//!   instead of starting it again.
//!
//! Invariants: the worker ([`crate::workers`]) drives these parts and owns the pod's state;
//! nothing here decides whether a pod ends, only how.

pub mod grace;
pub mod hooks;
pub mod kill;
pub mod records;
