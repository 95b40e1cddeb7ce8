//! The upstream response delivered to the client by the client connection's own task
//! ([`deliver`]): one poll loop writes what is queued to the client, reads the upstream
//! body into the queue (through `engine::upstream::ResponseBody`, each read stamped by
//! the engine when it returns, up to 64 frames ahead of the client, so a slow client
//! neither stalls the worker's reads nor makes serve hold unbounded data), watches the
//! client's side for its close, and bounds the worker's silences by
//! `--upstream-idle-timeout`. Pieces are the `Bytes` split off the upstream connection's
//! buffer: no copy between the two sockets.

use std::collections::VecDeque;
use std::future::Future;
use std::io::IoSlice;
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes};
use tokio::io::AsyncReadExt;

use super::down::Down;
use super::state::Shared;
use crate::clock;
use crate::engine::http1::reframe::LAST_CHUNK;
use crate::engine::lean::LeanConn;
use crate::engine::upstream::ResponseBody;
use crate::engine::{Capture, ExchangeError};

/// How a delivered response ended.
pub(super) struct Delivered {
    /// How the upstream side failed (or serve's deadline or cut).
    pub(super) failure: Option<ExchangeError>,
    /// The client got the whole response.
    pub(super) complete: bool,
    pub(super) at_ns: u64,
}

/// Most bytes queued for one client before serve stops reading its worker (besides the
/// 64-piece limit): with `--relay-memory`, what a slow client can make serve hold.
pub(crate) const CONN_BYTES: usize = 1 << 20;
/// Bytes a connection may queue before they count against `--relay-memory`: a small
/// answer is queued and written at once and touches no shared counter (so `--relay-memory`
/// bounds what is queued past 16 KiB per connection).
const FREE_BYTES: usize = 16 << 10;

/// Most pieces written in one vectored write.
const IOV: usize = 32;

/// The worker's side of a response: its connection, the body read from it, and the
/// exchange's capture that each read is stamped into.
pub(super) struct Upstream<'a> {
    pub(super) conn: &'a mut LeanConn,
    pub(super) body: &'a mut ResponseBody,
    pub(super) cap: &'a mut Capture,
}

/// Deliver the response whose `head` is ready and whose body `from.body` reads from
/// `from.conn`; what the client sends meanwhile is kept up to `limit` bytes.
pub(super) async fn deliver(
    sh: &Shared,
    down: &mut Down,
    from: Upstream<'_>,
    head: Bytes,
    limit: usize,
) -> Delivered {
    let Upstream { conn, body, cap } = from;
    let idle = sh.opts.upstream_idle_timeout;
    let idle_ns = u64::try_from(idle.as_nanos()).unwrap_or(u64::MAX);
    let last = body.last_read_ns();
    let mut r = Delivery {
        down,
        conn,
        body,
        cap,
        queued: 0,
        counted: 0,
        out: VecDeque::new(),
        all: &sh.relay_bytes,
        all_cap: sh.opts.relay_memory,
        frames: sh.opts.buffer_frames.max(1),
        limit,
        failure: None,
        gone: false,
        finished: false,
        last,
    };
    r.queue(head);
    let mut cut = sh.cut.clone();
    let mut cut_wait = pin!(cut.wait_for(|c| *c));
    let mut sleep = pin!(tokio::time::sleep(idle));
    std::future::poll_fn(|cx| {
        loop {
            if let Some(done) = r.step(cx) {
                return done;
            }
            // Nothing moved: a worker silent past the idle timeout (or, after a failure,
            // a client that takes nothing more for as long) ends it, and so does the cut.
            let reading = r.failure.is_none() && !r.finished && r.may_read();
            if (reading || r.failure.is_some()) && sleep.as_mut().poll(cx).is_ready() {
                // The timer is set once and moved on only when it fires early (a read
                // since it was set): no timer work per read.
                let now = clock::now_ns();
                let due = r.last.saturating_add(idle_ns);
                if now < due {
                    let at = sleep.deadline() + Duration::from_nanos(due - now);
                    sleep.as_mut().reset(at);
                    continue;
                }
                if r.failure.is_some() {
                    r.gone = true;
                    return Poll::Ready(());
                }
                r.failure = Some(ExchangeError::deadline(format!(
                    "upstream sent no body bytes for --upstream-idle-timeout ({} s)",
                    idle.as_secs_f64()
                )));
                continue;
            }
            if cut_wait.as_mut().poll(cx).is_ready() {
                r.failure.get_or_insert_with(ExchangeError::shutdown_cut);
                r.gone = true;
                return Poll::Ready(());
            }
            return Poll::Pending;
        }
    })
    .await;
    // What never reached the client leaves the count with the delivery.
    r.account(0);
    Delivered {
        complete: r.finished && !r.gone && r.failure.is_none(),
        failure: r.failure,
        at_ns: clock::now_ns(),
    }
}

/// A response on its way: the two sides, the pieces queued for the client, and how far
/// it got.
struct Delivery<'a> {
    down: &'a mut Down,
    conn: &'a mut LeanConn,
    body: &'a mut ResponseBody,
    cap: &'a mut Capture,
    out: VecDeque<Bytes>,
    /// Bytes queued here; of them, those past [`FREE_BYTES`] counted in all of serve's
    /// deliveries (`--relay-memory` bounds that count).
    queued: usize,
    counted: usize,
    all: &'a AtomicUsize,
    all_cap: usize,
    frames: usize,
    limit: usize,
    failure: Option<ExchangeError>,
    /// The client went away (or can no longer be written to).
    gone: bool,
    /// The body's last bytes are queued.
    finished: bool,
    /// Since when the worker's silence counts (the monotonic clock): its last read, or
    /// the moment a full queue freed.
    last: u64,
}

impl Delivery<'_> {
    /// The worker may be read on: fewer than `frames` pieces and [`CONN_BYTES`] bytes are
    /// queued here and the deliveries of every connection hold less than `--relay-memory`,
    /// or nothing is queued here at all (so every delivery moves, one read at a time).
    fn may_read(&self) -> bool {
        self.queued == 0
            || (self.out.len() < self.frames
                && self.queued < CONN_BYTES
                && (self.queued < FREE_BYTES || self.all.load(Ordering::Relaxed) < self.all_cap))
    }

    /// Queue a piece for the client.
    fn queue(&mut self, b: Bytes) {
        self.account(self.queued + b.len());
        self.out.push_back(b);
    }

    /// Set this delivery's queued bytes to `queued`, and the shared count by what changed past
    /// [`FREE_BYTES`] (a small answer, queued and written at once, never touches it).
    fn account(&mut self, queued: usize) {
        self.queued = queued;
        let counted = queued.saturating_sub(FREE_BYTES);
        if counted > self.counted {
            self.all
                .fetch_add(counted - self.counted, Ordering::Relaxed);
        } else if counted < self.counted {
            self.all
                .fetch_sub(self.counted - counted, Ordering::Relaxed);
        }
        self.counted = counted;
    }

    /// Move what can move without waiting. `Some`: the delivery is over; `None`: nothing
    /// can move now.
    fn step(&mut self, cx: &mut Context<'_>) -> Option<Poll<()>> {
        loop {
            // Read before writing: the body's first bytes that came with the head (often
            // the whole body) then go out in the head's write, one syscall instead of two.
            let mut moved = self.read(cx);
            moved |= match self.write(cx) {
                Ok(moved) => moved,
                Err(()) => return Some(Poll::Ready(())),
            };
            if self.out.is_empty() && (self.finished || self.failure.is_some()) {
                // A flush that waits leaves the cut to end it.
                return match Pin::new(&mut *self.down.io).poll_flush(cx) {
                    Poll::Ready(r) => {
                        self.gone = r.is_err();
                        Some(Poll::Ready(()))
                    }
                    Poll::Pending => None,
                };
            }
            if moved {
                continue;
            }
            // The client's side: its close ends the exchange; what it sends meanwhile (a
            // pipelined request) is kept, up to the head limit.
            if self.down.buf.len() < self.limit {
                if self.down.buf.capacity() - self.down.buf.len() < 1024 {
                    self.down.buf.reserve(4096);
                }
                match pin!(self.down.io.read_buf(&mut self.down.buf)).poll(cx) {
                    Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => {
                        self.gone = true;
                        return Some(Poll::Ready(()));
                    }
                    Poll::Ready(Ok(_)) => continue,
                    Poll::Pending => {}
                }
            }
            return None;
        }
    }

    /// Write what is queued to the client: whether anything was written; `Err` when the
    /// client is gone.
    fn write(&mut self, cx: &mut Context<'_>) -> Result<bool, ()> {
        let mut moved = false;
        while !self.out.is_empty() {
            let mut iov = [IoSlice::new(&[]); IOV];
            let n = self.out.len().min(IOV);
            for (slot, piece) in iov.iter_mut().zip(self.out.iter()) {
                *slot = IoSlice::new(piece);
            }
            match Pin::new(&mut *self.down.io).poll_write_vectored(cx, &iov[..n]) {
                Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => {
                    self.gone = true;
                    return Err(());
                }
                Poll::Ready(Ok(mut w)) => {
                    // The worker's silence counts only while serve could read it: a write
                    // that frees a full queue restarts the count (one clock read then,
                    // none per piece).
                    if !self.may_read() {
                        self.last = clock::now_ns();
                    }
                    self.account(self.queued - w);
                    while w > 0 {
                        let front = &mut self.out[0];
                        let k = w.min(front.len());
                        front.advance(k);
                        w -= k;
                        if front.is_empty() {
                            self.out.pop_front();
                        }
                    }
                    moved = true;
                }
                Poll::Pending => break,
            }
        }
        Ok(moved)
    }

    /// Read the worker's body on while the client is at most `frames` pieces behind:
    /// whether anything happened.
    fn read(&mut self, cx: &mut Context<'_>) -> bool {
        if self.failure.is_some() || self.finished || !self.may_read() {
            return false;
        }
        match self.body.poll_next(self.conn, cx, self.cap) {
            Poll::Ready(Ok(Some(b))) => {
                if !b.is_empty() {
                    self.queue(b);
                }
                self.last = self.last.max(self.body.last_read_ns());
            }
            // A close-delimited event stream cut mid-event: the body ended cleanly, but
            // the client's response must not look complete.
            Poll::Ready(Ok(None)) => match self.cap.stream_incomplete() {
                Some(m) => self.failure = Some(ExchangeError::upstream_message(m)),
                None => {
                    if self.body.last_chunk_pending() {
                        self.queue(Bytes::from_static(LAST_CHUNK));
                    }
                    self.finished = true;
                }
            },
            Poll::Ready(Err(e)) => self.failure = Some(e),
            Poll::Pending => return false,
        }
        true
    }
}
