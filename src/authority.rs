//! The one authority check every kill passes (no kubelet counterpart: the kubelet always acts).
//!
//! Invariant: no container is stopped and no sandbox is stopped unless [`Authority::check`]
//! allowed it at the moment the kill started. A future standby mode (a second agent watching a
//! primary) holds reaplet passive by switching this off; kills then wait and retry.

use crate::pod::PodUid;
use std::sync::atomic::{AtomicBool, Ordering};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AuthorityError {
    #[error("pod {uid}: kill ({reason}) refused: this agent is in standby")]
    Standby { uid: String, reason: &'static str },
}

/// Whether this agent may kill. Starts active.
#[derive(Debug)]
pub struct Authority {
    active: AtomicBool,
}

impl Default for Authority {
    fn default() -> Self {
        Self {
            active: AtomicBool::new(true),
        }
    }
}

impl Authority {
    pub fn set_active(&self, active: bool) {
        self.active.store(active, Ordering::SeqCst);
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
