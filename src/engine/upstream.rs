//! serve's upstream side, on the lean client's connections: the rest of a request after
//! the head [`Engine::lean_send`](super::Engine::lean_send) wrote ([`LeanConn::send_more`]),
//! the response head ([`LeanConn::read_head`]), and the response body read for forwarding
//! ([`ResponseBody`]): each read stamped into the capture when it returns and handed on in
//! the framing serve writes (`http1::reframe`): a length's bytes split off the
//! connection's buffer without a copy, a chunked body's data chunked again. Writing those
//! pieces to the client is serve's (`drivers::serve::deliver`).

use std::future::Future;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use http::Method;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::http1::codec::{Chunked, CodecError, Framing, Head};
use super::http1::reframe::{self, Reframe};
use super::lean::{self, BODY, LeanConn, READ_CHUNK, SEND};
use super::{Capture, ExchangeError, http1};
use crate::clock;

impl LeanConn {
    /// Write more of a request (its body) after its head, and flush it.
    pub(crate) async fn send_more(&mut self, bytes: &[u8]) -> Result<(), ExchangeError> {
        let sent = async {
            self.io.write_all(bytes).await?;
            self.io.flush().await
        };
        sent.await.map_err(|e| ExchangeError::upstream(SEND, &e))
    }

    /// Read the final response head to a `method` request (informational heads other
    /// than 101 skipped) and when the read that completed it returned; its status, its
    /// bytes as read and whether it is an event stream go into `cap`.
    pub(crate) async fn read_head(
        &mut self,
        method: &Method,
        cap: &mut Capture,
    ) -> Result<(Head, u64), ExchangeError> {
        let (head, wire, at) = lean::read_head(&mut self.io, &mut self.buf, method).await?;
        cap.status = Some(head.status);
        cap.keep_response_head(wire);
        if http1::is_event_stream(&head.headers) {
            cap.on_event_stream(head.framing == Framing::Close);
        }
        Ok((head, at))
    }
}

/// A response body read from the worker for forwarding, framed as its head says, and
/// handed on in serve's framing (the response side of `reframe::RequestBody`).
#[derive(Debug)]
pub(crate) struct ResponseBody {
    framing: Framing,
    left: u64,
    chunked: Chunked,
    /// How the client gets the body.
    out: Reframe,
    /// Trailer bytes of the worker's were not handed on.
    trailers_dropped: bool,
    /// When the bytes in the connection's buffer not yet taken were read.
    unread: Option<u64>,
    /// When the last read returned (the head's, before the body's first).
    last_read_ns: u64,
    done: bool,
}

impl ResponseBody {
    /// The body after `head`, whose read returned at `head_ns` (bytes that came with the
    /// head are the body's first), handed on as `out` says. A body that is empty by its
    /// framing ends at `head_ns`.
    pub(crate) fn new(head: &Head, head_ns: u64, out: Reframe, cap: &mut Capture) -> ResponseBody {
        let left = match head.framing {
            Framing::Length(n) => n,
            _ => 0,
        };
        let done = matches!(head.framing, Framing::Empty | Framing::Length(0));
        if done {
            cap.on_body_end(head_ns);
        }
        ResponseBody {
            framing: head.framing,
            left,
            chunked: Chunked::default(),
            out,
            trailers_dropped: false,
            unread: Some(head_ns),
            last_read_ns: head_ns,
            done,
        }
    }

    /// When the last read of the body (or the head) returned: the stamp the capture got,
    /// for a caller's idle timer without a second clock read.
    pub(crate) fn last_read_ns(&self) -> u64 {
        self.last_read_ns
    }

    /// The body has been read to its end.
    pub(crate) fn done(&self) -> bool {
        self.done
    }

    /// Trailer bytes of the worker's were not handed on (past the trailer section's end,
    /// or all of them to a client that takes no chunks).
    pub(crate) fn trailers_dropped(&self) -> bool {
        self.trailers_dropped
    }

    /// The client still needs the last chunk once the body has ended: a body the close
    /// ended, chunked for the client (a chunked body's last chunk comes with its data).
    pub(crate) fn last_chunk_pending(&self) -> bool {
        self.out == Reframe::Chunks && self.framing == Framing::Close
    }

    /// The body ended by its framing and nothing followed it: the connection may carry
    /// another request if its head allows.
    pub(crate) fn clean(&self, conn: &LeanConn) -> bool {
        self.done && self.framing != Framing::Close && conn.buf.is_empty()
    }

    /// The next bytes to hand on (`Some` may be empty while the body goes on), or `None`
    /// at the end of the body. Stamps each read into `cap`; an error names the step.
    pub(crate) fn poll_next(
        &mut self,
        conn: &mut LeanConn,
        cx: &mut Context<'_>,
        cap: &mut Capture,
    ) -> Poll<Result<Option<Bytes>, ExchangeError>> {
        loop {
            if let Some(at) = self.unread.take()
                && !self.done
            {
                let b = self.take(&mut conn.buf, at, cap)?;
                if !b.is_empty() || self.done {
                    return Poll::Ready(Ok(Some(b)));
                }
            }
            if self.done {
                return Poll::Ready(Ok(None));
            }
            if conn.buf.capacity() - conn.buf.len() < READ_CHUNK / 4 {
                conn.buf.reserve(READ_CHUNK);
            }
            let read = std::pin::pin!(conn.io.read_buf(&mut conn.buf)).poll(cx);
            match read {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(ExchangeError::upstream(BODY, &e))),
                Poll::Ready(Ok(0)) if self.framing == Framing::Close => {
                    self.done = true;
                    self.last_read_ns = clock::now_ns();
                    cap.on_body_end(self.last_read_ns);
                    return Poll::Ready(Ok(None));
                }
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(lean::closed_early(BODY))),
                Poll::Ready(Ok(_)) => {
                    self.last_read_ns = clock::now_ns();
                    self.unread = Some(self.last_read_ns);
                }
            }
        }
    }

    /// Take what `buf` holds of the body (read at `at`) into the capture.
    fn take(
        &mut self,
        buf: &mut BytesMut,
        at: u64,
        cap: &mut Capture,
    ) -> Result<Bytes, ExchangeError> {
        let b = match self.framing {
            Framing::Empty => Bytes::new(),
            Framing::Length(_) => {
                let n = buf
                    .len()
                    .min(usize::try_from(self.left).unwrap_or(usize::MAX));
                let b = buf.split_to(n).freeze();
                cap.on_body_frame(&b, at);
                self.left -= n as u64;
                self.done = self.left == 0;
                b
            }
            Framing::Chunked => {
                let bad = |m: CodecError| ExchangeError::upstream_message(format!("{BODY}: {m}"));
                let mut data = BytesMut::new();
                let out = self.out;
                let used = self
                    .chunked
                    .decode(buf, |d| {
                        cap.on_body_frame(d, at);
                        reframe::chunked_data(&mut data, d, out);
                    })
                    .map_err(bad)?;
                buf.advance(used);
                self.done = self.chunked.done();
                if self.done {
                    self.trailers_dropped = reframe::chunked_end(&mut data, &self.chunked, out);
                }
                data.freeze()
            }
            Framing::Close => {
                let b = buf.split().freeze();
                cap.on_body_frame(&b, at);
                reframe::close_delimited_piece(b, self.out)
            }
        };
        if self.done {
            cap.on_body_end(at);
        }
        Ok(b)
    }
}

/// A whole response body that `rest` holds, then the worker's close, forwarded with no
/// socket: the bytes the client gets after the head (in `out`'s framing) and the body's
/// data as the record keeps it; `Err` where serve would cut the response (a malformed or
/// cut body). The same [`ResponseBody`] serve runs; for `fuzzing::serve_response`.
pub(crate) fn whole_body(
    head: &Head,
    rest: &[u8],
    out: Reframe,
) -> Result<(Vec<u8>, Vec<u8>), ExchangeError> {
    let mut cap = Capture::start(1 << 24, None);
    let mut body = ResponseBody::new(head, 0, out, &mut cap);
    let mut buf = BytesMut::from(rest);
    let mut client = Vec::new();
    if !body.done {
        let b = body.take(&mut buf, 0, &mut cap)?;
        client.extend_from_slice(&b);
    }
    if !body.done {
        if body.framing != Framing::Close {
            return Err(lean::closed_early(BODY));
        }
        if body.last_chunk_pending() {
            client.extend_from_slice(reframe::LAST_CHUNK);
        }
    }
    Ok((client, cap.into_captured().body.bytes.to_vec()))
}
