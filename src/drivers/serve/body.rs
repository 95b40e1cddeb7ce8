//! The bodies serve streams: [`TeeBody`] (the request on its way up, copied on the side)
//! and [`ProxyBody`] (the response on its way down, from the upstream reader's bounded
//! channel, or whole when the upstream body was complete before the head went out). A
//! `ProxyBody` reports when and how the client's side ended ([`OnEnd`]) to a listener it
//! does not know, as linkerd2-proxy's tap body does. Imports nothing else from serve.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use tokio::sync::{mpsc, oneshot};

use crate::clock;
use crate::engine::{BodyCopy, CopiedBody};

/// When the client's side of a response ended, and whether completely.
#[derive(Debug)]
pub(super) struct DownstreamEnd {
    pub(super) at_ns: u64,
    pub(super) complete: bool,
}

/// The request body on its way up: passed through untouched, copied (up to the record
/// limits) on the side. The copy is delivered when the body ends or is dropped.
pub(super) struct TeeBody {
    inner: Incoming,
    copy: BodyCopy,
    done: Option<oneshot::Sender<CopiedBody>>,
}

impl TeeBody {
    /// Tee `inner`; the copy arrives on the returned receiver.
    pub(super) fn new(inner: Incoming, copy: BodyCopy) -> (TeeBody, oneshot::Receiver<CopiedBody>) {
        let (tx, rx) = oneshot::channel();
        let tee = TeeBody {
            inner,
            copy,
            done: Some(tx),
        };
        (tee, rx)
    }

    fn deliver(&mut self) {
        if let Some(tx) = self.done.take() {
            // A copy nobody waits for any more is dropped here, and its hold gives its
            // bytes back to the budget.
            let _ = tx.send(self.copy.take());
        }
    }
}

impl Drop for TeeBody {
    fn drop(&mut self) {
        self.deliver();
    }
}

impl Body for TeeBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        let r = Pin::new(&mut this.inner).poll_frame(cx);
        match &r {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.copy.push(data);
                }
                if this.inner.is_end_stream() {
                    this.deliver();
                }
            }
            Poll::Ready(None) => this.deliver(),
            _ => {}
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The response body handed to the client: frames from the upstream reader through a
/// bounded channel, the whole upstream body when it came with the head, or a small
/// generated body (502, 503, 504). Reports when it ended, and whether completely
/// ([`OnEnd`]).
pub(super) struct ProxyBody {
    pub(super) rx: Option<mpsc::Receiver<Chunk>>,
    pub(super) full: Option<Bytes>,
    /// The last frame has been handed to the client connection.
    pub(super) finished: bool,
    pub(super) done: Option<OnEnd>,
}

/// What happens when the client's response ends.
pub(super) enum OnEnd {
    /// Tell the task that records the exchange (the upstream reader, or the task of a
    /// generated error response).
    Notify(oneshot::Sender<DownstreamEnd>),
    /// Call the listener with the end, from the body itself (the upstream body was complete
    /// before the head went out: the exchange ends here, with no task of its own, the
    /// common case of a small response). The body does not know what the listener does.
    Call(Box<dyn FnOnce(DownstreamEnd) + Send>),
}

/// A frame from the upstream reader, and whether it is the body's last.
pub(super) type Chunk = Result<(Frame<Bytes>, bool), io::Error>;

impl ProxyBody {
    fn report(&mut self, complete: bool) {
        match self.done.take() {
            Some(OnEnd::Notify(tx)) => {
                let _ = tx.send(DownstreamEnd {
                    at_ns: clock::now_ns(),
                    complete,
                });
            }
            Some(OnEnd::Call(listener)) => listener(DownstreamEnd {
                at_ns: clock::now_ns(),
                complete,
            }),
            None => {}
        }
    }
}

impl Drop for ProxyBody {
    fn drop(&mut self) {
        // Dropped before its last frame: the client went away. (A response that has no
        // body by definition, HEAD/204/304, starts out finished.)
        let finished = self.finished;
        self.report(finished);
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        if let Some(b) = self.full.take() {
            self.finished = true;
            self.report(true);
            return Poll::Ready(Some(Ok(Frame::data(b))));
        }
        if self.finished {
            self.report(true);
            return Poll::Ready(None);
        }
        let Some(rx) = self.rx.as_mut() else {
            self.report(true);
            return Poll::Ready(None);
        };
        match rx.poll_recv(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(Ok((frame, last)))) => {
                if last {
                    self.finished = true;
                    self.report(true);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                // The upstream failed after the head: abort the client's response so it
                // cannot look complete.
                self.report(false);
                Poll::Ready(Some(Err(e)))
            }
            Poll::Ready(None) => {
                self.report(true);
                Poll::Ready(None)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.finished || (self.rx.is_none() && self.full.is_none())
    }
}
