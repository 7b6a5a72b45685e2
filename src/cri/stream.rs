//! Opening a runtime's event stream: containerd sends a server stream's response headers only
//! with its first message (its events service's `Subscribe`, and CRI `GetContainerEvents` on
//! containerd 1.7 and 2.x), so an accepted subscription cannot be told from one on its way.
//!
//! Invariants:
//! * [`open`] returns once the call was refused (the caller falls back or polls), answered, or
//!   not refused within `settle`; the call itself lives on in a task of its own;
//! * the stream's items are forwarded without waiting: a receiver that is full drops the item
//!   (the runtime's stream is never held back; every item only triggers a relist, and the
//!   items queued ahead of it trigger one); a receiver that is dropped ends the stream;
//! * the receiver ends when the stream does: the caller resubscribes.

use std::future::Future;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// The events a subscriber may have queued before new ones are dropped.
pub const CAPACITY: usize = 256;

/// Calls `call` in a task and forwards what `map` makes of each message to the receiver.
pub async fn open<M, T, F, C>(
    call: C,
    settle: Duration,
    mut map: F,
) -> Result<mpsc::Receiver<T>, tonic::Status>
where
    C: Future<Output = Result<tonic::Response<tonic::Streaming<M>>, tonic::Status>>
        + Send
        + 'static,
    M: Send + 'static,
    T: Send + 'static,
    F: FnMut(M) -> Option<T> + Send + 'static,
{
    let (tx, rx) = mpsc::channel(CAPACITY);
    let (answered_tx, answered) = oneshot::channel();
    tokio::spawn(async move {
        let opened = tokio::select! {
            r = call => r,
            () = tx.closed() => return,
        };
        let mut stream = match opened {
            Ok(resp) => {
                let _ = answered_tx.send(Ok(()));
                resp.into_inner()
            }
            Err(status) => {
                let _ = answered_tx.send(Err(status));
                return;
            }
        };
        loop {
            let next = tokio::select! {
                m = stream.message() => m,
                () = tx.closed() => return,
            };
            let msg = match next {
                Ok(Some(msg)) => msg,
                Ok(None) => return,
                Err(status) => {
                    tracing::debug!(code = ?status.code(), "runtime event stream broke");
                    return;
                }
            };
            if let Some(item) = map(msg) {
                match tx.try_send(item) {
                    Ok(()) => {}
                    Err(mpsc::error::TrySendError::Full(_)) => {
                        tracing::debug!("runtime event dropped: the subscriber is busy");
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => return,
                }
            }
        }
    });
    match tokio::time::timeout(settle, answered).await {
        Ok(Ok(Err(status))) => Err(status),
        // answered; or still waiting for the first message; or the task is gone, and with it
        // the sender: the receiver is closed and the caller resubscribes
        Ok(Ok(Ok(()))) | Err(_) | Ok(Err(_)) => Ok(rx),
    }
}
