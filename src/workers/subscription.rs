//! The container event subscription: the kubelet's evented PLEG (`pleg/evented.go`: a watch
//! on `GetContainerEvents` with the generic relist behind it), for containerd 1.6 through its
//! own events service when CRI has none ([`crate::cri::EventSource`]).
//!
//! Invariants:
//! * an event only ever triggers a relist: the relist reads the runtime and decides, so a
//!   duplicate, late or out-of-order event changes nothing;
//! * an exit the runtime's CRI view has not applied yet is relisted again soon
//!   ([`RECHECK_FIRST`] doubling) until the container shows exited or [`RECHECK_FOR`] has
//!   passed, never at the relist period. containerd's CRI plugin applies a task exit only
//!   after deleting the task (measured: the exit event comes ~12 ms before the shim is gone,
//!   and the CRI view changes ~40 ms after it), so the task's deletion event starts the
//!   rechecks over from the first step;
//! * a stream that ends is resubscribed with backoff (1 s doubling to 30 s, reset by a
//!   successful subscription), each (re)subscription followed at once by a relist, which
//!   covers the events lost in between, and by 10 s of the fast relist period (an exit just
//!   before the runtime registered the stream may reach its view only later); a runtime with no events at all (neither CRI nor
//!   containerd) is polled, and so is one while a subscription is missing;
//! * subscribing never blocks the loop: it runs in the relist pass, under its deadline;
//! * one line when events start or stop flowing, never one per event or retry.

use crate::cri::{ContainerEvent, ContainerEventKind, CriError, EventSource, EventSubscription};
use crate::lifecycle::backoff;
use std::collections::{HashMap, HashSet};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// The first quick relist after an exit the runtime's CRI view did not show yet.
pub const RECHECK_FIRST: Duration = Duration::from_millis(5);
/// A stream that stayed up this long starts the resubscription backoff over when it ends
/// (one that ends at once keeps growing it: a runtime that accepts and drops the stream is not
/// asked again every second).
pub const STABLE: Duration = Duration::from_secs(120);
/// How long an exit is rechecked for.
pub const RECHECK_FOR: Duration = Duration::from_secs(5);

/// What the loop waits on next from the subscription.
pub(super) enum Next {
    /// Events arrived (coalesced): relist now.
    Events,
    /// The stream ended: relist now, and resubscribe in the pass after the backoff.
    Ended,
    /// Time to subscribe (again), in the next pass.
    Due,
}

pub(super) enum Subscription {
    /// Container events are switched off (`containerEvents: false`).
    Disabled,
    /// The runtime has no container events: polled.
    Unsupported,
    Active {
        events: mpsc::Receiver<ContainerEvent>,
        source: EventSource,
        /// When it opened, and the failures before it (kept unless it stays up [`STABLE`]).
        since: Instant,
        failures: u32,
    },
    Waiting {
        at: Instant,
        failures: u32,
    },
}

/// A container whose exit event arrived, still to be seen exited by a relist.
#[derive(Default)]
pub(super) struct Exits {
    pending: HashMap<String, Instant>,
    /// The next quick relist's delay while some exit is pending.
    step: Option<Duration>,
    /// The containers of the events taken since the loop last asked ([`Self::take_batch`]).
    batch: HashSet<String>,
}

impl Exits {
    /// Remembers an exit; whether the event calls for a relist (an exit or a deletion: a
    /// creation or a start changes nothing a relist acts on, as a pod that appears after the
    /// sources' last complete list is never an orphan).
    fn saw(&mut self, ev: &ContainerEvent, now: Instant) -> bool {
        match ev.kind {
            ContainerEventKind::Exited => {
                self.pending.entry(ev.container_id.clone()).or_insert(now);
                self.batch.insert(ev.container_id.clone());
                true
            }
            ContainerEventKind::Deleted => {
                // the CRI view follows the task's deletion closely: recheck from the start
                if self.pending.contains_key(&ev.container_id) {
                    self.step = None;
                }
                self.batch.insert(ev.container_id.clone());
                true
            }
            ContainerEventKind::Created
            | ContainerEventKind::Started
            | ContainerEventKind::Other => false,
        }
    }

    /// The containers of the events since the last call.
    pub(super) fn take_batch(&mut self) -> HashSet<String> {
        std::mem::take(&mut self.batch)
    }

    /// Forgets an exit nothing needs to recheck (its pod's kill is under way and waits for
    /// its containers itself).
    pub(super) fn forget(&mut self, id: &str) {
        self.pending.remove(id);
    }

    /// The containers whose exits are still to be seen applied.
    pub(super) fn pending(&self) -> impl Iterator<Item = &String> {
        self.pending.keys()
    }

    /// After a relist that found `running` (IDs the runtime says may run): how long until the
    /// next quick relist, if an exit is still not applied.
    pub(super) fn after_relist(
        &mut self,
        running: &HashSet<String>,
        now: Instant,
    ) -> Option<Duration> {
        self.after_relist_of(running, None, now)
    }

    /// [`Self::after_relist`] for a relist of some pods only: `listed` says which containers
    /// it covered (an exit of a container it did not list is kept as it was).
    pub(super) fn after_relist_of(
        &mut self,
        running: &HashSet<String>,
        listed: Option<&dyn Fn(&str) -> bool>,
        now: Instant,
    ) -> Option<Duration> {
        self.pending.retain(|id, at| {
            let covered = listed.is_none_or(|l| l(id));
            (!covered || running.contains(id)) && now.duration_since(*at) < RECHECK_FOR
        });
        if self.pending.is_empty() {
            self.step = None;
            return None;
        }
        let d = self
            .step
            .map_or(RECHECK_FIRST, |d| (d * 2).min(Duration::from_secs(1)));
        self.step = Some(d);
        Some(d)
    }
}

impl Subscription {
    pub(super) fn new(enabled: bool, now: Instant) -> Self {
        if enabled {
            Subscription::Waiting {
                at: now,
                failures: 0,
            }
        } else {
            Subscription::Disabled
        }
    }

    /// Events are flowing: the relist is only the safety net.
    pub(super) fn flowing(&self) -> bool {
        matches!(self, Subscription::Active { .. })
    }

    /// A (re)subscription is due in this pass.
    pub(super) fn due(&self, now: Instant) -> bool {
        matches!(self, Subscription::Waiting { at, .. } if *at <= now)
    }

    /// The next thing to act on; events that arrived together count once, exits among them
    /// are remembered in `exits`.
    pub(super) async fn next(&mut self, exits: &mut Exits) -> Next {
        match self {
            // no await between taking an exit and returning: cancelling this loses none
            Subscription::Active { events, .. } => loop {
                let Some(ev) = events.recv().await else {
                    return Next::Ended;
                };
                let now = Instant::now();
                let mut relist = exits.saw(&ev, now);
                while let Ok(ev) = events.try_recv() {
                    relist |= exits.saw(&ev, now);
                }
                if relist {
                    return Next::Events;
                }
            },
            Subscription::Waiting { at, .. } => {
                tokio::time::sleep_until(*at).await;
                Next::Due
            }
            Subscription::Disabled | Subscription::Unsupported => std::future::pending().await,
        }
    }

    /// The stream ended at `now`.
    pub(super) fn ended(&mut self, now: Instant) {
        let failures = match self {
            Subscription::Active {
                source,
                since,
                failures,
                ..
            } => {
                let stable = now.saturating_duration_since(*since) >= STABLE;
                if stable || *failures == 0 {
                    tracing::warn!(
                        source = source.as_str(),
                        "container event stream ended; polling until resubscribed"
                    );
                }
                if stable {
                    1
                } else {
                    failures.saturating_add(1)
                }
            }
            _ => 1,
        };
        *self = Subscription::Waiting {
            at: now + backoff(failures),
            failures,
        };
    }

    /// The outcome of a (re)subscription at `now`.
    pub(super) fn subscribed(&mut self, r: Result<EventSubscription, CriError>, now: Instant) {
        let failures = match self {
            Subscription::Waiting { failures, .. } => *failures,
            _ => 0,
        };
        *self = match r {
            Ok(sub) => {
                tracing::info!(source = sub.source.as_str(), "container events subscribed");
                Subscription::Active {
                    events: sub.events,
                    source: sub.source,
                    since: now,
                    failures,
                }
            }
            Err(CriError::Unimplemented { .. }) => {
                tracing::info!("the runtime has no container events; polling");
                Subscription::Unsupported
            }
            Err(e) => {
                if failures <= 1 {
                    tracing::warn!(err = %e, "subscribing to container events failed; polling, retrying with backoff");
                }
                let failures = failures + 1;
                Subscription::Waiting {
                    at: now + backoff(failures),
                    failures,
                }
            }
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exit(id: &str) -> ContainerEvent {
        ContainerEvent {
            container_id: id.into(),
            kind: ContainerEventKind::Exited,
            exit_code: Some(0),
            exited_at: None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn events_coalesce_and_an_exit_not_yet_applied_is_rechecked_quickly_then_given_up() {
        let (tx, rx) = mpsc::channel(8);
        let mut sub = Subscription::Active {
            events: rx,
            source: EventSource::ContainerdEvents,
            since: Instant::now(),
            failures: 0,
        };
        let mut exits = Exits::default();
        for id in ["a", "a", "b"] {
            tx.send(exit(id)).await.unwrap();
        }
        assert!(matches!(sub.next(&mut exits).await, Next::Events));
        assert!(
            tx.try_send(exit("c")).is_ok(),
            "the three were taken at once"
        );
        let t0 = Instant::now();
        let running: HashSet<String> = ["a".to_string()].into();
        // b is applied, a is not: quick rechecks, doubling, capped at 1 s
        let steps: Vec<Duration> = (0..10)
            .map(|_| exits.after_relist(&running, t0).unwrap())
            .collect();
        assert_eq!(steps[0], RECHECK_FIRST);
        assert_eq!(steps[1], RECHECK_FIRST * 2);
        assert_eq!(steps[9], Duration::from_secs(1));
        // a's task deleted: the rechecks start over
        let mut deleted = exit("a");
        deleted.kind = ContainerEventKind::Deleted;
        exits.saw(&deleted, t0);
        assert_eq!(exits.after_relist(&running, t0), Some(RECHECK_FIRST));
        // given up after RECHECK_FOR; once applied, no more rechecks
        assert_eq!(exits.after_relist(&running, t0 + RECHECK_FOR), None);
        exits.saw(&exit("d"), t0);
        assert_eq!(exits.after_relist(&HashSet::new(), t0), None);
        assert!(matches!(sub.next(&mut exits).await, Next::Events));
        // creations and starts call for no relist (before: each one was a full relist)
        for kind in [ContainerEventKind::Created, ContainerEventKind::Started] {
            let mut ev = exit("n");
            ev.kind = kind;
            tx.send(ev).await.unwrap();
        }
        assert!(
            tokio::time::timeout(Duration::from_secs(60), sub.next(&mut exits))
                .await
                .is_err()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_ended_stream_is_resubscribed_with_backoff_and_unsupported_is_polled() {
        let t0 = Instant::now();
        let mut sub = Subscription::new(true, t0);
        assert!(sub.due(t0));
        let (tx, rx) = mpsc::channel(1);
        sub.subscribed(
            Ok(EventSubscription {
                source: EventSource::Cri,
                events: rx,
            }),
            t0,
        );
        assert!(sub.flowing());
        drop(tx);
        let mut exits = Exits::default();
        assert!(matches!(sub.next(&mut exits).await, Next::Ended));
        sub.ended(t0);
        assert!(!sub.flowing() && !sub.due(t0) && sub.due(t0 + backoff(1)));
        // a stream that ends at once again: the backoff grows (before: back to 1 s each time)
        let (tx2, rx2) = mpsc::channel(1);
        sub.subscribed(
            Ok(EventSubscription {
                source: EventSource::Cri,
                events: rx2,
            }),
            t0,
        );
        drop(tx2);
        sub.ended(t0);
        assert!(!sub.due(t0 + backoff(1)) && sub.due(t0 + backoff(2)));
        // one that stayed up STABLE starts over
        let (tx3, rx3) = mpsc::channel(1);
        sub.subscribed(
            Ok(EventSubscription {
                source: EventSource::Cri,
                events: rx3,
            }),
            t0,
        );
        drop(tx3);
        sub.ended(t0 + STABLE);
        assert!(sub.due(t0 + STABLE + backoff(1)));
        let unavailable = CriError::Unavailable {
            op: "x",
            id: String::new(),
            message: String::new(),
        };
        sub.subscribed(Err(unavailable), t0);
        assert!(!sub.due(t0 + backoff(1)) && sub.due(t0 + backoff(2)));
        sub.subscribed(Err(CriError::Unimplemented { op: "x" }), t0);
        assert!(matches!(sub, Subscription::Unsupported));
        assert!(!Subscription::new(false, t0).due(t0));
    }
}
