//! The lean client, the one way both drivers reach the worker: replay's frozen requests,
//! serialised once ([`LeanRequest`], its head by `http1::write`) and written with one
//! call, and responses read through one reused buffer per connection and framed by
//! `http1::codec`. serve writes its requests with [`Engine::lean_send`] on the same
//! connections (TCP, rustls), socket stamps, capture hooks and keep-alive rule, and reads
//! the rest through `engine::upstream`. No task per connection, no request or response
//! objects, no copy of body bytes besides the capture's own.
//!
//! Keep-alive rule: before a reused connection carries a request it is polled once; if
//! the worker closed it (or sent something unasked) while it was idle, a new one is
//! opened. If writing the request into a reused connection fails, the worker closed it
//! before it took the request: the request is sent once more on a new connection
//! (`connection_retried`). There are no other retries.

use std::pin::Pin;
use std::task::Poll;

use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderMap, Method};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, ReadBuf};

use super::http1::codec::{self, Chunked, Framing};
use super::{Capture, Engine, ExchangeError, http1};
use crate::clock;
use crate::model::{ConnectionPolicy, Endpoint};
use crate::net::timed_io::TimedIo;

/// Bytes read per call when the buffer needs room.
pub(super) const READ_CHUNK: usize = 16 * 1024;

/// One open connection of the lean client.
pub(crate) struct LeanConn {
    pub(super) id: i64,
    pub(super) io: TimedIo,
    /// Bytes read and not yet consumed.
    pub(super) buf: BytesMut,
}

/// A request serialised once: the head and the body, ready to write.
#[derive(Debug, Clone)]
pub(crate) struct LeanRequest {
    pub(crate) method: Method,
    pub(crate) bytes: Bytes,
}

impl LeanRequest {
    /// The head as [`http1::write::request_head`] writes it (`METHOD target HTTP/1.1`, the
    /// headers as given, lower-case names, in order), then the body, in one allocation.
    pub(crate) fn new(method: Method, target: &str, headers: &HeaderMap, body: &[u8]) -> Self {
        let mut b = http1::write::request_head(&method, target, headers, false, body.len());
        b.extend_from_slice(body);
        LeanRequest {
            method,
            bytes: Bytes::from(b),
        }
    }
}

/// One poll of a read on an idle connection: ready (end of stream, an error, or bytes
/// nobody asked for) means it cannot carry another request. Unconstrained, so tokio's
/// task budget cannot turn a closed connection into a "pending" one.
async fn closed_while_idle(conn: &mut LeanConn) -> bool {
    if !conn.buf.is_empty() {
        return true;
    }
    let mut one = [0u8; 1];
    let io = &mut conn.io;
    tokio::task::coop::unconstrained(std::future::poll_fn(|cx| {
        let mut rb = ReadBuf::new(&mut one);
        Poll::Ready(Pin::new(&mut *io).poll_read(cx, &mut rb).is_ready())
    }))
    .await
}

/// Read more bytes into `buf`: how many (0 at the end of the stream) and when the read
/// returned. An error names `step`.
async fn read_more<R: AsyncRead + Unpin>(
    io: &mut R,
    buf: &mut BytesMut,
    step: &str,
) -> Result<(usize, u64), ExchangeError> {
    if buf.capacity() - buf.len() < READ_CHUNK / 4 {
        buf.reserve(READ_CHUNK);
    }
    let n = io
        .read_buf(buf)
        .await
        .map_err(|e| ExchangeError::upstream(step, &e))?;
    Ok((n, clock::now_ns()))
}

/// Read at least one more byte into `buf` (the end of the stream is an error now: the
/// message is not complete); when the read returned.
async fn read_some<R: AsyncRead + Unpin>(
    io: &mut R,
    buf: &mut BytesMut,
    step: &str,
) -> Result<u64, ExchangeError> {
    match read_more(io, buf, step).await? {
        (0, _) => Err(closed_early(step)),
        (_, at) => Ok(at),
    }
}

/// The step named in errors up to the response head (as hyper's client named it, kept for
/// the records: a head that never comes fails the request's send).
pub(super) const SEND: &str = "send request";
pub(super) const BODY: &str = "read response body";

/// "connection closed before message completed" (hyper's words, kept for the records).
pub(super) fn closed_early(step: &str) -> ExchangeError {
    ExchangeError::upstream_message(format!(
        "{step}: connection closed before message completed"
    ))
}

impl Engine {
    async fn lean_connect(
        &self,
        ep: &Endpoint,
        policy: ConnectionPolicy,
        cap: &mut Capture,
    ) -> Result<LeanConn, ExchangeError> {
        let io = self.open_stream(ep, policy, cap).await?;
        Ok(LeanConn {
            id: cap.connection_id.unwrap_or(-1),
            io,
            buf: BytesMut::with_capacity(READ_CHUNK),
        })
    }

    /// Write `bytes` (a request head, and its body or the start of it) on the slot's
    /// connection (or a new one), under the keep-alive rule.
    pub(crate) async fn lean_send(
        &self,
        slot: &mut Option<LeanConn>,
        ep: &Endpoint,
        policy: ConnectionPolicy,
        bytes: &[u8],
        cap: &mut Capture,
    ) -> Result<LeanConn, ExchangeError> {
        let idle = match slot.take() {
            Some(mut c) if policy == ConnectionPolicy::KeepAlive => {
                (!closed_while_idle(&mut c).await).then_some(c)
            }
            _ => None,
        };
        let mut conn = match idle {
            Some(c) => {
                cap.on_reuse(c.id);
                c
            }
            None => self.lean_connect(ep, policy, cap).await?,
        };
        cap.attach(&conn.io.stamps);
        let sent = async |c: &mut LeanConn| {
            c.io.write_all(bytes).await?;
            c.io.flush().await
        };
        if let Err(e) = sent(&mut conn).await {
            // Only a request of which no byte was taken is sent again: a worker that read
            // part of it may have acted on it.
            if !cap.connection_reused || conn.io.stamps.last_write_ns().is_some() {
                return Err(ExchangeError::upstream(SEND, &e));
            }
            // The worker closed the reused connection before it took the request.
            cap.on_retry();
            conn = self.lean_connect(ep, policy, cap).await?;
            cap.attach(&conn.io.stamps);
            sent(&mut conn)
                .await
                .map_err(|e| ExchangeError::upstream(SEND, &e))?;
        }
        Ok(conn)
    }

    /// Run one exchange of a frozen request: send it, read the head and the body into
    /// `cap` (each read stamped as it returns), and put the connection back in `slot`
    /// when the exchange ended cleanly and the connection may carry another.
    pub(crate) async fn exchange_lean(
        &self,
        slot: &mut Option<LeanConn>,
        ep: &Endpoint,
        policy: ConnectionPolicy,
        req: &LeanRequest,
        cap: &mut Capture,
    ) -> Result<(), ExchangeError> {
        let mut conn = self.lean_send(slot, ep, policy, &req.bytes, cap).await?;
        let reusable = read_response(&mut conn.io, &mut conn.buf, &req.method, cap).await?;
        if reusable && policy == ConnectionPolicy::KeepAlive {
            *slot = Some(conn);
        }
        Ok(())
    }
}

/// Read one response to a `method` request from `io` (bytes already in `buf` first) into
/// `cap`: the head, then the body as its framing says, each read's bytes stamped when the
/// read returned. `Ok(true)`: the exchange ended cleanly, nothing followed the body, and
/// the head lets the connection carry another request.
pub(crate) async fn read_response<R: AsyncRead + Unpin>(
    io: &mut R,
    buf: &mut BytesMut,
    method: &Method,
    cap: &mut Capture,
) -> Result<bool, ExchangeError> {
    let (head, wire, head_ns) = read_head(io, buf, method).await?;
    cap.status = Some(head.status);
    if http1::is_event_stream(&head.headers) {
        cap.on_event_stream(head.framing == Framing::Close);
    }
    cap.keep_response_head(wire);
    let clean = match head.framing {
        Framing::Empty => {
            cap.on_body_end(head_ns);
            buf.is_empty()
        }
        Framing::Length(n) => read_length(io, buf, n, head_ns, cap).await?,
        Framing::Chunked => read_chunked(io, buf, head_ns, cap).await?,
        Framing::Close => {
            read_to_close(io, buf, head_ns, cap).await?;
            false
        }
    };
    Ok(clean && head.keep_alive)
}

/// Read until a final response head (informational ones other than 101 are skipped, as
/// hyper does); returns it, a copy of its bytes as read (for the record: one allocation
/// the size of the head) and when the read that completed it returned.
pub(super) async fn read_head<R: AsyncRead + Unpin>(
    io: &mut R,
    buf: &mut BytesMut,
    method: &Method,
) -> Result<(codec::Head, Bytes, u64), ExchangeError> {
    // When the read that completed the head returned (the buffer starts empty: a
    // connection with bytes left over is never reused).
    let mut at = None;
    loop {
        if !buf.is_empty() {
            let parsed = codec::parse_head(buf, method)
                .map_err(|m| ExchangeError::upstream_message(format!("{SEND}: {m}")))?;
            if let Some((head, n)) = parsed {
                if matches!(head.status.as_u16(), 100 | 102..=199) {
                    buf.advance(n);
                    continue;
                }
                let wire = Bytes::copy_from_slice(&buf[..n]);
                buf.advance(n);
                return Ok((head, wire, at.unwrap_or_else(clock::now_ns)));
            }
        }
        at = Some(read_some(io, buf, SEND).await?);
    }
}

/// A Content-Length body. `Ok(true)`: nothing followed it.
async fn read_length<R: AsyncRead + Unpin>(
    io: &mut R,
    buf: &mut BytesMut,
    mut left: u64,
    at: u64,
    cap: &mut Capture,
) -> Result<bool, ExchangeError> {
    read_framed(io, buf, at, cap, |buf, cap, at| {
        let take = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        if take > 0 {
            cap.on_body_frame(&buf[..take], at);
            buf.advance(take);
            left -= take as u64;
        }
        Ok(left == 0)
    })
    .await
}

/// A chunked body. `Ok(true)`: nothing followed its end.
async fn read_chunked<R: AsyncRead + Unpin>(
    io: &mut R,
    buf: &mut BytesMut,
    at: u64,
    cap: &mut Capture,
) -> Result<bool, ExchangeError> {
    let mut dec = Chunked::default();
    read_framed(io, buf, at, cap, |buf, cap, at| {
        let used = dec
            .decode(buf, |data| cap.on_body_frame(data, at))
            .map_err(|m| ExchangeError::upstream_message(format!("{BODY}: {m}")))?;
        buf.advance(used);
        Ok(dec.done())
    })
    .await
}

/// A body its framing ends: `feed` takes what it can of the buffered bytes (read at the
/// given time) into the capture and says whether the body is complete; reads go on until
/// it is. `Ok(true)`: nothing followed the body.
async fn read_framed<R: AsyncRead + Unpin>(
    io: &mut R,
    buf: &mut BytesMut,
    mut at: u64,
    cap: &mut Capture,
    mut feed: impl FnMut(&mut BytesMut, &mut Capture, u64) -> Result<bool, ExchangeError>,
) -> Result<bool, ExchangeError> {
    loop {
        if feed(buf, cap, at)? {
            cap.on_body_end(at);
            return Ok(buf.is_empty());
        }
        at = read_some(io, buf, BODY).await?;
    }
}

/// A body that the connection's close ends.
async fn read_to_close<R: AsyncRead + Unpin>(
    io: &mut R,
    buf: &mut BytesMut,
    mut at: u64,
    cap: &mut Capture,
) -> Result<(), ExchangeError> {
    loop {
        if !buf.is_empty() {
            cap.on_body_frame(buf, at);
            buf.clear();
        }
        let n;
        (n, at) = read_more(io, buf, BODY).await?;
        if n == 0 {
            cap.on_body_end(at);
            return Ok(());
        }
    }
}
