//! `reaplet drain` and `reaplet make-room`: emptying or relieving a node through the Eviction
//! API, the right pods first (no kubelet counterpart: `kubectl drain`'s rules, the ReplicaSet
//! controller's scale-down ranking and the scheduler's preemption victim selection).
//!
//! * [`rank`]: `ActivePodsWithRanks.Less`; [`plan`]: drain's filters, order and waves;
//!   [`preempt`]: `selectVictimsOnNode`; all pure;
//! * [`quantity`]: `resource.Quantity` exactly; [`pods`], [`requests`]: reading the API objects
//!   into what the ranking and preemption need;
//! * [`run`] (drain) and [`room`] (make-room): the commands: cordon, the plan printed;
//!   [`evict`]: evictions wave by wave (429: after the server's `Retry-After`, else 5 s, with
//!   the budget named), waiting for each pod to go, `--timeout`, Ctrl-C (stops issuing
//!   evictions, the node stays cordoned); [`progress`]: a live table on a terminal, plain
//!   lines otherwise, one JSON document on request;
//! * [`cli`]: the two commands' flags, the operator's credentials and the exit codes.
//!
//! Invariants: nothing is evicted before the plan is printed; `--dry-run` writes nothing (not
//! even the cordon); a pod is evicted with a UID precondition, so a pod recreated under its
//! name is never touched.

pub mod cli;
pub mod evict;
pub mod plan;
pub mod pods;
pub mod preempt;
pub mod progress;
pub mod quantity;
pub mod rank;
pub mod requests;
pub mod resources;
pub mod room;
pub mod run;

#[cfg(test)]
mod exact_tests;
#[cfg(test)]
mod quantity_tests;
#[cfg(test)]
mod tests;

/// Why a drain or make-room ended without doing all it should.
#[derive(Debug, thiserror::Error)]
pub enum DrainError {
    #[error("API: {0}")]
    Api(#[from] crate::api::RequestError),
    #[error("node {0} not found")]
    NoNode(String),
    #[error("{0}")]
    Refused(String),
    #[error("timed out after {:.1}s; still on the node: {left:?}", .waited.as_secs_f64())]
    Timeout {
        waited: std::time::Duration,
        left: Vec<String>,
    },
    #[error("interrupted; the node stays cordoned; still on the node: {left:?}")]
    Interrupted { left: Vec<String> },
    #[error("the pod cannot fit on the node even with every lower-priority pod gone: {0}")]
    Impossible(String),
    /// The pod the room is for is refused (exit 64).
    #[error("{0}")]
    Room(#[from] room::RoomError),
}
