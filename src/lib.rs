//! reaplet: a node agent that ends pods the way the kubelet does, over CRI.
//!
//! Module map (kubelet counterpart in brackets):
//! * [`cri`]: the runtime seam [`pkg/kubelet/cri/remote`], generated from `proto/api.proto`;
//! * [`pod`]: what the pipeline knows of a pod [`v1.Pod`, `kuberuntime/labels.go`];
//! * [`deadline`]: the one deadline type (monotonic instant and origin);
//! * [`lifecycle`]: the per-pod state machine [`podSyncStatus`, `podWorkerLoop`];
//! * [`workers`]: per-UID owner tasks and housekeeping [`podWorkers`, `HandlePodCleanups`];
//! * [`terminating`]: the terminating stage's parts: grace-period math
//!   [`calculateEffectiveGracePeriod`, `killContainer`], preStop hooks [`lifecycle/handlers.go`],
//!   stopping containers and sandboxes [`killPodWithSyncResult`], and durable termination
//!   records (what was already done to a pod's containers; reaplet's own);
//! * [`volumes`]: waiting for unmounts [`podVolumesExist`], and, active, the volume manager's
//!   teardown of node-local volumes;
//! * [`cgroups`]: pod cgroup removal [`cm/pod_container_manager_linux.go`];
//! * [`status`]: the terminal pod status [`generateAPIPodStatus`, `getPhase`];
//! * [`events`]: pod events [`record.EventRecorder`];
//! * [`active_deadline`]: `activeDeadlineSeconds` [`active_deadline.go`];
//! * [`authority`]: the one check every kill passes (reaplet's own);
//! * [`shutdown`]: graceful node shutdown's plan [`nodeshutdown_manager_linux.go`];
//! * [`drain`]: `reaplet drain` and `reaplet make-room` [`kubectl drain`, the ReplicaSet
//!   scale-down ranking, the scheduler's preemption victims];
//! * [`pressure`]: node-pressure eviction [`pkg/kubelet/eviction`];
//! * [`eviction`]: this node's eviction sources [the controller manager's NoExecute taint
//!   manager; the scheduler's node affinity, enforced through the Eviction API];
//! * [`agent`], [`api`], [`file_source`]: `reaplet run` and its pod sources;
//! * [`cli`]: the command line, its help, man pages and flag reference [`cmd/kubelet/app/options`];
//!
//! The test bed's helpers (pods launched through CRI as the kubelet does) and the demo are the
//! `reaplet-testbed` crate in `testbed/`, outside the agent.

pub mod active_deadline;
pub mod agent;
pub mod api;
pub mod authority;
pub mod backoff;
pub mod cgroups;
pub mod check;
pub mod cli;
pub mod config;
pub mod cri;
pub mod deadline;
pub mod drain;
pub mod events;
pub mod eviction;
pub mod file_source;
pub mod lifecycle;
pub mod logs;
pub mod metrics;
pub mod otel;
pub mod pod;
pub mod pods_view;
pub mod pressure;
pub mod sd_notify;
pub mod self_pod;
pub mod server;
pub mod shutdown;
pub mod standby;
pub mod status;
pub mod systemd;
pub mod terminating;
pub mod timeline;
pub mod volumes;
pub mod workers;

/// Wall-clock nanoseconds since the epoch: the unit of CRI timestamps (`created_at`,
/// `finished_at`). Saturates instead of wrapping; 0 if the clock is before 1970.
pub fn wall_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}
