//! The one authority check every kill passes (no kubelet counterpart: the kubelet always acts).
//!
//! Invariant: no container is stopped and no sandbox is stopped unless [`Authority::check`]
//! allowed it at the moment the kill started. Standby beside a kubelet ([`crate::standby`])
//! holds reaplet passive by switching this off; kills then wait and retry on their backoff,
//! and switching it on again wakes them at once ([`Authority::changes`]). A kill already
//! started runs to its end (switching off never cuts one: the safe point).

use crate::pod::PodUid;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::sync::watch;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AuthorityError {
    #[error("pod {uid}: kill ({reason}) refused: this agent is in standby")]
    Standby { uid: String, reason: &'static str },
}

/// Whether this agent may kill. Starts active.
#[derive(Debug)]
pub struct Authority {
    active: AtomicBool,
    changes: watch::Sender<bool>,
}

impl Default for Authority {
    fn default() -> Self {
        Self {
            active: AtomicBool::new(true),
            changes: watch::channel(true).0,
        }
    }
}

impl Authority {
    pub fn set_active(&self, active: bool) {
        self.active.store(active, Ordering::SeqCst);
        self.changes
            .send_if_modified(|a| std::mem::replace(a, active) != active);
    }

    /// Whether the agent may kill, as it changes: a held kill retries at once when it turns on.
    pub fn changes(&self) -> watch::Receiver<bool> {
        self.changes.subscribe()
    }

    pub fn is_active(&self) -> bool {
        self.active.load(Ordering::SeqCst)
    }

    /// Called before every kill attempt.
    pub fn check(&self, uid: &PodUid, reason: &'static str) -> Result<(), AuthorityError> {
        if self.is_active() {
            Ok(())
        } else {
            Err(AuthorityError::Standby {
                uid: uid.to_string(),
                reason,
            })
        }
    }
}
