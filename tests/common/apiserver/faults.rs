//! The fault-injecting layer: sits in front of every handler, over the same real HTTP
//! connection, so fault tests exercise reaplet's real client stack (kube-rs, hyper, its
//! timeouts and retries).
//!
//! Faults: refused connections (the listener closed and open connections cut), and error
//! answers (500, or 429 with `Retry-After`) for a while.

use super::http::Req;
use super::reply::{Reply, respond_with, status_body};
use super::store::State;
use serde_json::json;
use std::time::Instant;

#[derive(Default)]
pub struct Faults {
    pub refuse_until: Option<Instant>,
    pub fail_until: Option<(Instant, u16)>,
    /// A misbehaving server: lists and watches ignore `fieldSelector` (every node's pods).
    pub ignore_field_selectors: bool,
}

/// What the layer does with a request.
pub enum Verdict {
    /// On to the handler.
    Pass,
    /// This answer instead.
    Answer(Reply),
    /// Close the connection without an answer.
    Reset,
}

/// New connections are being refused.
pub fn refusing(state: &State) -> bool {
    state
        .faults
        .lock()
        .unwrap()
        .refuse_until
        .is_some_and(|t| Instant::now() < t)
}

pub async fn before(state: &State, _req: &Req) -> Verdict {
    let fail = {
        let mut f = state.faults.lock().unwrap();
        match f.fail_until {
            Some((t, code)) if Instant::now() < t => Some(code),
            Some(_) => {
                f.fail_until = None;
                None
            }
            None => None,
        }
    };
    match fail {
        Some(code) => {
            let reason = if code == 429 {
                "TooManyRequests"
            } else {
                "InternalError"
            };
            let headers = if code == 429 {
                vec![("retry-after", "1".to_owned())]
            } else {
                vec![]
            };
            Verdict::Answer(respond_with(
                code,
                &status_body(code, reason, "injected fault", json!({})),
                &headers,
            ))
        }
        None => Verdict::Pass,
    }
}

pub fn after(_state: &State, _req: &Req, reply: Reply) -> Reply {
    reply
}
