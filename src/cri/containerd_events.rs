//! Container exits from containerd's own events service, for runtimes whose CRI lacks
//! `GetContainerEvents` (containerd 1.6 answers it with UNIMPLEMENTED).
//!
//! containerd serves its native API (`containerd.services.events.v1.Events`) on the same
//! socket as CRI, so this rides on the CRI client's connection. [`subscribe`] asks for the
//! `/tasks/exit` and `/tasks/delete` topics of the CRI plugin's namespace (`k8s.io`), decodes
//! each envelope's `google.protobuf.Any` into `containerd.events.TaskExit` / `TaskDelete` and
//! yields [`TaskEvent`]s (or anything `From<TaskEvent>`, such as [`ContainerEvent`]) on a
//! tokio channel.
//!
//! Invariants:
//! * the code is generated at build time from the vendored containerd v1.6.20 protos
//!   (`proto/containerd/`, see `proto/README.md` and `build.rs`) and never edited;
//! * in containerd's CRI plugin a CRI container ID is the containerd container ID (and the
//!   task's); a sandbox's pause container is a task too, under the sandbox ID;
//! * a `TaskExit` whose `id` is not its `container_id` is an exec'd process (a probe, a
//!   preStop hook), not the container: it is dropped;
//! * errors are classified by type and gRPC code, never by message text;
//! * the channel ends when the stream does (containerd restarted, connection lost): the caller
//!   resubscribes and relists for what it missed; opening the stream, forwarding without
//!   holding containerd back and ending it are [`super::stream`]'s (containerd sends the
//!   headers of `Subscribe` only with its first event).

pub mod pb {
    //! The generated containerd messages and client (packages nested as containerd's are).
    #![allow(clippy::all, clippy::pedantic, missing_docs)]
    pub mod events {
        tonic::include_proto!("containerd.events");
    }
    pub mod types {
        tonic::include_proto!("containerd.types");
    }
    pub mod services {
        pub mod events {
            pub mod v1 {
                tonic::include_proto!("containerd.services.events.v1");
            }
        }
    }
}

use super::{ContainerEvent, ContainerEventKind};
use pb::services::events::v1::{Envelope, SubscribeRequest, events_client::EventsClient};
use prost::Message;
use std::time::Duration;
use tokio::sync::mpsc;
use tonic::transport::Channel;
use tracing::Instrument;

/// The containerd namespace of the CRI plugin's containers.
pub const NAMESPACE: &str = "k8s.io";
/// Topic of a task's process exit.
pub const TOPIC_EXIT: &str = "/tasks/exit";
/// Topic of a task's deletion (after its exit has been collected).
pub const TOPIC_DELETE: &str = "/tasks/delete";
/// Full name of the `TaskExit` message (the Any's type URL, with or without a prefix).
const TYPE_TASK_EXIT: &str = "containerd.events.TaskExit";
/// Full name of the `TaskDelete` message.
const TYPE_TASK_DELETE: &str = "containerd.events.TaskDelete";

/// Errors of a subscription, and of decoding one event.
#[derive(Debug, thiserror::Error)]
pub enum EventsError {
    /// containerd refused the subscription (or the socket is not containerd's:
    /// `Unimplemented`), or the connection failed (`Unavailable`).
    #[error("containerd Events/Subscribe: {code:?}: {message}")]
    Subscribe { code: tonic::Code, message: String },
    /// An envelope without an event.
    #[error("containerd event on {topic:?} without a payload")]
    NoPayload { topic: String },
    /// An event of a type this module does not expect on its topics.
    #[error("containerd event on {topic:?} of unexpected type {type_url:?}")]
    UnexpectedType { topic: String, type_url: String },
    /// The payload does not decode as its type.
    #[error("containerd event of type {type_url:?} does not decode: {source}")]
    Decode {
        type_url: String,
        #[source]
        source: prost::DecodeError,
    },
}

impl EventsError {
    /// The gRPC code of a refused subscription.
    pub fn code(&self) -> Option<tonic::Code> {
        match self {
            EventsError::Subscribe { code, .. } => Some(*code),
            _ => None,
        }
    }

    fn from_status(s: &tonic::Status) -> Self {
        EventsError::Subscribe {
            code: s.code(),
            message: s.message().to_owned(),
        }
    }
}

/// What happened to a container's task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskEventKind {
    /// The container's init process exited (`/tasks/exit`).
    Exit,
    /// The task was deleted (`/tasks/delete`), its exit collected.
    Delete,
}

/// A task event about a container (its init process).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskEvent {
    pub kind: TaskEventKind,
    /// The containerd container ID, which is the CRI container (or sandbox) ID.
    pub container_id: String,
    pub pid: u32,
    pub exit_status: u32,
    /// When the process exited, in nanoseconds since the epoch (CRI's `finished_at` form);
    /// `None` if containerd sent no time.
    pub exited_at: Option<i64>,
}

impl From<TaskEvent> for ContainerEvent {
    fn from(ev: TaskEvent) -> Self {
        ContainerEvent {
            container_id: ev.container_id,
            kind: match ev.kind {
                TaskEventKind::Exit => ContainerEventKind::Exited,
                TaskEventKind::Delete => ContainerEventKind::Deleted,
            },
            // containerd's CRI plugin reports the same uint32 as an int32 (so 255 stays 255
            // and a wrapped -1 is -1 again)
            exit_code: Some(ev.exit_status as i32),
            exited_at: ev.exited_at,
        }
    }
}

/// The subscription's filters: any of them matches (OR); the clauses of one are ANDed.
pub fn filters() -> Vec<String> {
    [TOPIC_EXIT, TOPIC_DELETE]
        .iter()
        .map(|topic| format!("namespace=={NAMESPACE},topic==\"{topic}\""))
        .collect()
}

fn nanos(t: Option<prost_types::Timestamp>) -> Option<i64> {
    let t = t?;
    Some(
        t.seconds
            .saturating_mul(1_000_000_000)
            .saturating_add(i64::from(t.nanos)),
    )
}

/// Decodes one envelope. `Ok(None)`: nothing about a container's init process (an exec'd
/// process's exit, another namespace).
pub fn decode(envelope: &Envelope) -> Result<Option<TaskEvent>, EventsError> {
    if envelope.namespace != NAMESPACE {
        return Ok(None);
    }
    let any = envelope
        .event
        .as_ref()
        .ok_or_else(|| EventsError::NoPayload {
            topic: envelope.topic.clone(),
        })?;
    // containerd 1.6 writes the bare message name; a `type.googleapis.com/` prefix is fine too
    let name = any.type_url.rsplit('/').next().unwrap_or_default();
    let bad = |source| EventsError::Decode {
        type_url: any.type_url.clone(),
        source,
    };
    match name {
        TYPE_TASK_EXIT => {
            let e = pb::events::TaskExit::decode(any.value.as_slice()).map_err(bad)?;
            if e.id != e.container_id {
                return Ok(None);
            }
            Ok(Some(TaskEvent {
                kind: TaskEventKind::Exit,
                container_id: e.container_id,
                pid: e.pid,
                exit_status: e.exit_status,
                exited_at: nanos(e.exited_at),
            }))
        }
        TYPE_TASK_DELETE => {
            let e = pb::events::TaskDelete::decode(any.value.as_slice()).map_err(bad)?;
            // `id` names an exec; empty (or the container's own) is the init process
            if !e.id.is_empty() && e.id != e.container_id {
                return Ok(None);
            }
            Ok(Some(TaskEvent {
                kind: TaskEventKind::Delete,
                container_id: e.container_id,
                pid: e.pid,
                exit_status: e.exit_status,
                exited_at: nanos(e.exited_at),
            }))
        }
        _ => Err(EventsError::UnexpectedType {
            topic: envelope.topic.clone(),
            type_url: any.type_url.clone(),
        }),
    }
}

/// Subscribes to the task exits and deletions of namespace `k8s.io` over `channel` (a
/// connection to containerd's socket). Returns once containerd refused the subscription
/// (`Err`), answered it, or did not refuse it within `settle` (see the module docs). The
/// receiver ends when the stream does; dropping it ends the stream.
pub async fn subscribe<T>(
    channel: Channel,
    settle: Duration,
) -> Result<mpsc::Receiver<T>, EventsError>
where
    T: From<TaskEvent> + Send + 'static,
{
    let span = tracing::debug_span!("containerd_events", op = "Subscribe", namespace = NAMESPACE);
    let mut client = EventsClient::new(channel);
    let request = SubscribeRequest { filters: filters() };
    let call = async move { client.subscribe(request).await };
    let decode_one = |envelope: Envelope| match decode(&envelope) {
        Ok(ev) => ev.map(T::from),
        Err(e) => {
            tracing::warn!(err = %e, "containerd event skipped");
            None
        }
    };
    super::stream::open(call, settle, decode_one)
        .instrument(span)
        .await
        .map_err(|status| {
            tracing::debug!(code = ?status.code(), "containerd event subscription refused");
            EventsError::from_status(&status)
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use pb::events::{TaskDelete, TaskExit};

    fn envelope(topic: &str, type_url: &str, value: Vec<u8>) -> Envelope {
        Envelope {
            timestamp: Some(prost_types::Timestamp {
                seconds: 1_700_000_000,
                nanos: 5,
            }),
            namespace: NAMESPACE.into(),
            topic: topic.into(),
            event: Some(prost_types::Any {
                type_url: type_url.into(),
                value,
            }),
        }
    }

    fn exit(container_id: &str, id: &str) -> TaskExit {
        TaskExit {
            container_id: container_id.into(),
            id: id.into(),
            pid: 4242,
            exit_status: 3,
            exited_at: Some(prost_types::Timestamp {
                seconds: 1_700_000_001,
                nanos: 250_000_000,
            }),
        }
    }

    #[test]
    fn decodes_an_init_exit() {
        // the envelope as containerd 1.6 sends it, through the wire format
        let env = envelope(TOPIC_EXIT, TYPE_TASK_EXIT, exit("c1", "c1").encode_to_vec());
        let env = Envelope::decode(env.encode_to_vec().as_slice()).unwrap();
        let ev = decode(&env).unwrap().unwrap();
        assert_eq!(
            ev,
            TaskEvent {
                kind: TaskEventKind::Exit,
                container_id: "c1".into(),
                pid: 4242,
                exit_status: 3,
                exited_at: Some(1_700_000_001_250_000_000),
            }
        );
        let ce = ContainerEvent::from(ev);
        assert_eq!(ce.kind, ContainerEventKind::Exited);
        assert_eq!(ce.exit_code, Some(3));
        assert_eq!(ce.container_id, "c1");
    }

    #[test]
    fn a_prefixed_type_url_decodes_too() {
        let env = envelope(
            TOPIC_EXIT,
            "type.googleapis.com/containerd.events.TaskExit",
            exit("c1", "c1").encode_to_vec(),
        );
        assert!(decode(&env).unwrap().is_some());
    }

    #[test]
    fn exec_exits_and_other_namespaces_are_dropped() {
        let env = envelope(
            TOPIC_EXIT,
            TYPE_TASK_EXIT,
            exit("c1", "exec-7").encode_to_vec(),
        );
        assert_eq!(decode(&env).unwrap(), None);
        let mut env = envelope(TOPIC_EXIT, TYPE_TASK_EXIT, exit("c1", "c1").encode_to_vec());
        env.namespace = "moby".into();
        assert_eq!(decode(&env).unwrap(), None);
    }

    #[test]
    fn decodes_a_delete() {
        let del = TaskDelete {
            container_id: "c2".into(),
            pid: 7,
            exit_status: 137,
            exited_at: None,
            id: String::new(),
        };
        let env = envelope(TOPIC_DELETE, TYPE_TASK_DELETE, del.encode_to_vec());
        let ev = decode(&env).unwrap().unwrap();
        assert_eq!(ev.kind, TaskEventKind::Delete);
        assert_eq!(ev.exit_status, 137);
        assert_eq!(ev.exited_at, None);
        let exec = TaskDelete {
            id: "exec-1".into(),
            ..del
        };
        let env = envelope(TOPIC_DELETE, TYPE_TASK_DELETE, exec.encode_to_vec());
        assert_eq!(decode(&env).unwrap(), None);
    }

    #[test]
    fn malformed_events_are_errors_by_type() {
        let env = envelope(TOPIC_EXIT, TYPE_TASK_EXIT, vec![0xff, 0xff, 0xff]);
        assert!(matches!(decode(&env), Err(EventsError::Decode { .. })));
        let env = envelope(TOPIC_EXIT, "containerd.events.TaskOOM", vec![]);
        assert!(matches!(
            decode(&env),
            Err(EventsError::UnexpectedType { .. })
        ));
        let mut env = envelope(TOPIC_EXIT, TYPE_TASK_EXIT, vec![]);
        env.event = None;
        assert!(matches!(decode(&env), Err(EventsError::NoPayload { .. })));
    }

    #[test]
    fn filters_select_the_two_topics_in_k8s_io() {
        assert_eq!(
            filters(),
            [
                r#"namespace==k8s.io,topic=="/tasks/exit""#,
                r#"namespace==k8s.io,topic=="/tasks/delete""#,
            ]
        );
    }
}
