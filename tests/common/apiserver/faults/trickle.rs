//! A slow body: an answer's bytes let out at a fixed rate after a first-byte delay.

use super::super::Body;
use hyper::body::{Bytes, Frame, SizeHint};
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

/// A body let out in chunks of a tenth of a second's worth, each after its time.
pub struct Trickle {
    inner: Body,
    buf: Bytes,
    chunk: usize,
    gap: Duration,
    next: Pin<Box<tokio::time::Sleep>>,
}

impl Trickle {
    pub fn new(inner: Body, rate: Option<u64>, first_byte: Duration) -> Trickle {
        let (chunk, gap) = match rate {
            Some(r) => {
                let chunk = (r / 10).max(1);
                (
                    chunk as usize,
                    Duration::from_secs_f64(chunk as f64 / r as f64),
                )
            }
            None => (usize::MAX, Duration::ZERO),
        };
        let first = tokio::time::Instant::now() + first_byte + gap;
        Trickle {
            inner,
            buf: Bytes::new(),
            chunk,
            gap,
            next: Box::pin(tokio::time::sleep_until(first)),
        }
    }
}

impl hyper::body::Body for Trickle {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        while this.buf.is_empty() {
            match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                None => return Poll::Ready(None),
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => this.buf = data,
                    Err(other) => return Poll::Ready(Some(Ok(other))),
                },
                Some(Err(never)) => match never {},
            }
        }
        ready!(this.next.as_mut().poll(cx));
        let out = this.buf.split_to(this.chunk.min(this.buf.len()));
        let at = tokio::time::Instant::now() + this.gap;
        this.next.as_mut().reset(at);
        Poll::Ready(Some(Ok(Frame::data(out))))
    }

    fn is_end_stream(&self) -> bool {
        self.buf.is_empty() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let mut h = self.inner.size_hint();
        let n = self.buf.len() as u64;
        if let Some(u) = h.upper() {
            h.set_upper(u + n);
        }
        h.set_lower(h.lower() + n);
        h
    }
}
