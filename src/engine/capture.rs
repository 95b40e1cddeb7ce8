//! The capture: everything measured about one exchange, filled by the engine's hooks and
//! owned by the caller *outside* the exchange's future, so a deadline that cancels the
//! exchange leaves what had arrived in place to be recorded. Also the one bounded body
//! copy both drivers use.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use http::StatusCode;

use crate::budget::{BudgetHold, MemoryBudget};
use crate::clock;
use crate::model::{StreamColumns, Timings};
use crate::net::timed_io::IoStamps;
use crate::sse::{Event, LineTooLong, SseParser, StreamTracker};

/// Everything measured about one exchange. Owned by the caller, filled by the engine's
/// lifecycle hooks (connected, TLS done, head received, each body frame, end). Its fields
/// are the engine's: a driver reads what it needs through methods, and turns a finished
/// capture into the row's facts with [`Capture::into_captured`].
#[derive(Debug)]
pub(crate) struct Capture {
    /// The exchange's t0 on the monotonic clock.
    t0_ns: u64,
    pub(super) connection_id: Option<i64>,
    pub(super) connection_reused: bool,
    pub(super) connection_retried: bool,
    pub(super) connect_ns: Option<u64>,
    pub(super) tls_ns: Option<u64>,
    pub(super) tls_resumed: Option<bool>,
    pub(super) request_sent_ns: Option<u64>,
    pub(super) first_byte_ns: Option<u64>,
    first_body_ns: Option<u64>,
    pub(super) end_ns: Option<u64>,
    pub(super) status: Option<StatusCode>,
    /// The response head as read (empty until one came).
    response_head: Bytes,
    /// Response body bytes kept (copied out of the connection's read buffer) within the
    /// limits.
    body: BodyCopy,
    pub(super) stamps: Option<Arc<IoStamps>>,
    sse: Option<Box<SseState>>,
}

/// What a finished exchange leaves for its row: the connection it used, the response,
/// and its timing and stream columns.
#[derive(Debug)]
pub(crate) struct Captured {
    pub(crate) connection_id: Option<i64>,
    pub(crate) connection_reused: bool,
    pub(crate) connection_retried: bool,
    pub(crate) status: Option<i32>,
    /// The final response head's bytes as read (empty when none came).
    pub(crate) response_head: Bytes,
    pub(crate) body: CopiedBody,
    pub(crate) timings: Timings,
    /// `None`: the response was not an event stream.
    pub(crate) stream: Option<StreamColumns>,
}

/// A bounded copy of a body on its way through: at most `limit` bytes, drawn from a
/// global [`MemoryBudget`] when there is one. `len` counts every byte seen; the copy is
/// truncated when any byte was left out. The bytes drawn stay held (a [`BudgetHold`]) by
/// the copy, then by its row, and go back to the budget when whoever holds them last is
/// dropped. The one "copy up to the limit" of both drivers (response bodies in the
/// capture, serve's request tee, replay's request body).
#[derive(Debug)]
pub(crate) struct BodyCopy {
    bytes: BytesMut,
    len: u64,
    truncated: bool,
    limit: usize,
    hold: Option<BudgetHold>,
}

/// A finished [`BodyCopy`].
#[derive(Debug, Default)]
pub(crate) struct CopiedBody {
    pub(crate) bytes: Bytes,
    /// True length of the body.
    pub(crate) len: u64,
    pub(crate) truncated: bool,
    /// The copy's bytes in the global budget (`None` without a budget).
    pub(crate) hold: Option<BudgetHold>,
}

impl BodyCopy {
    pub(crate) fn new(limit: usize, budget: Option<Arc<MemoryBudget>>) -> BodyCopy {
        BodyCopy {
            bytes: BytesMut::new(),
            len: 0,
            truncated: false,
            limit,
            hold: budget.map(BudgetHold::new),
        }
    }

    /// Count `data` and copy what the limits allow.
    pub(crate) fn push(&mut self, data: &[u8]) {
        self.len += data.len() as u64;
        let room = self.limit.saturating_sub(self.bytes.len()).min(data.len());
        let granted = match &mut self.hold {
            Some(h) => h.draw(room),
            None => room,
        };
        if data.len() > granted {
            self.truncated = true;
        }
        self.bytes.extend_from_slice(&data[..granted]);
    }

    /// The copy so far, with its hold on the budget; the copy is left empty.
    pub(crate) fn take(&mut self) -> CopiedBody {
        CopiedBody {
            bytes: std::mem::take(&mut self.bytes).freeze(),
            len: self.len,
            truncated: self.truncated,
            hold: self.hold.take(),
        }
    }

    /// A body already whole in memory (replay's request): the kept bytes share its
    /// buffer, nothing is copied.
    pub(crate) fn of_whole(body: &Bytes, limit: usize) -> CopiedBody {
        let truncated = body.len() > limit;
        CopiedBody {
            bytes: if truncated {
                body.slice(..limit)
            } else {
                body.clone()
            },
            len: body.len() as u64,
            truncated,
            hold: None,
        }
    }
}

/// Event-stream state of one exchange: the parser and what the events said so far.
#[derive(Debug, Default)]
struct SseState {
    parser: SseParser,
    tracker: StreamTracker,
    scratch: Vec<Event>,
    error: Option<LineTooLong>,
    /// The body ends when the connection closes (no HTTP framing).
    close_delimited: bool,
    /// The body has ended cleanly (the parser was finished).
    ended: bool,
    /// It ended by the connection closing in the middle of an event.
    cut_mid_event: bool,
}

impl SseState {
    fn feed(&mut self, data: &[u8], now_ns: u64) {
        if self.error.is_some() {
            return;
        }
        if let Err(e) = self.parser.feed(data, now_ns, &mut self.scratch) {
            self.error = Some(e);
        }
        for ev in self.scratch.drain(..) {
            self.tracker.on_event(&ev);
        }
    }
}

impl SseState {
    /// The body ended cleanly at `now_ns`: a close-delimited body cut in the middle of an
    /// event is marked so; otherwise the parser is finished like the oracle's.
    fn end(&mut self, now_ns: u64) {
        if std::mem::replace(&mut self.ended, true) {
            return;
        }
        if self.close_delimited && self.parser.mid_event() {
            self.cut_mid_event = true;
            return;
        }
        if self.error.is_none()
            && let Err(e) = self.parser.finish(now_ns, &mut self.scratch)
        {
            self.error = Some(e);
        }
        for ev in self.scratch.drain(..) {
            self.tracker.on_event(&ev);
        }
    }
}

impl Capture {
    /// Start an exchange now; keep at most `body_limit` response body bytes, drawn from a
    /// global `budget` when there is one.
    pub(crate) fn start(body_limit: usize, budget: Option<Arc<MemoryBudget>>) -> Capture {
        Capture {
            t0_ns: clock::now_ns(),
            connection_id: None,
            connection_reused: false,
            connection_retried: false,
            connect_ns: None,
            tls_ns: None,
            tls_resumed: None,
            request_sent_ns: None,
            first_byte_ns: None,
            first_body_ns: None,
            end_ns: None,
            status: None,
            response_head: Bytes::new(),
            body: BodyCopy::new(body_limit, budget),
            stamps: None,
            sse: None,
        }
    }

    /// Hook: a response body frame arrived at `now_ns`. Copies what the limits allow.
    pub(super) fn on_body_frame(&mut self, data: &[u8], now_ns: u64) {
        if self.first_body_ns.is_none() && !data.is_empty() {
            self.first_body_ns = Some(now_ns);
        }
        self.body.push(data);
        if let Some(sse) = self.sse.as_mut() {
            sse.feed(data, now_ns);
        }
    }

    /// Hook: the response body ended cleanly (by its framing, or by the close of a
    /// close-delimited body) at `now_ns`. Stamps the end (unless already stamped) and
    /// finishes the event stream.
    pub(super) fn on_body_end(&mut self, now_ns: u64) {
        let end = *self.end_ns.get_or_insert(now_ns);
        if let Some(sse) = self.sse.as_mut() {
            sse.end(end);
        }
    }

    /// Hook: the response head says `text/event-stream` (ended by the connection closing
    /// when `close_delimited`); stamp every event from now on.
    pub(super) fn on_event_stream(&mut self, close_delimited: bool) {
        self.sse = Some(Box::new(SseState {
            close_delimited,
            ..SseState::default()
        }));
    }

    /// Why a stream whose body ended cleanly is still incomplete. A body that HTTP framing
    /// ended (Content-Length reached, or the last chunk) is complete; a close-delimited one
    /// must have ended on an event boundary; no event line may exceed the parser's limit.
    /// `data: [DONE]` is not required here (`transformers serve` never sends it): an
    /// oracle asks for it with `require_done`.
    pub(crate) fn stream_incomplete(&self) -> Option<String> {
        let sse = self.sse.as_ref()?;
        if let Some(e) = &sse.error {
            return Some(format!("event stream: {e}"));
        }
        sse.cut_mid_event.then(|| {
            "event stream ended by the connection closing in the middle of an event (no blank line after its last event)"
                .to_string()
        })
    }

    /// The stream columns of the row (`None` when the response was not an event stream).
    fn stream_columns(&self) -> Option<StreamColumns> {
        let sse = self.sse.as_ref()?;
        let t = &sse.tracker;
        let offs = |v: &[u64]| {
            v.iter()
                .map(|&n| clock::us_between(self.t0_ns, n))
                .collect::<Vec<i64>>()
        };
        let event_offsets_us = offs(&t.event_offsets_ns);
        // Content events: those carrying generated text in an OpenAI-style stream; for any
        // other event stream, every event but `[DONE]`.
        let content_offsets_us = if t.openai {
            offs(&t.content_ns)
        } else {
            offs(&t.event_offsets_ns)
        };
        let ttft_us = content_offsets_us.first().copied();
        let (output_tokens, source) = match t.usage_field("completion_tokens") {
            Some(n) => (Some(n), "usage"),
            None => (Some(content_offsets_us.len() as i64), "events"),
        };
        let total_us = self.us(self.end_ns);
        let tpot_us = match (total_us, ttft_us, output_tokens) {
            (Some(total), Some(ttft), Some(n)) if n > 1 => Some((total - ttft) / (n - 1)),
            _ => None,
        };
        Some(StreamColumns {
            event_count: t.events as i64,
            event_offsets_us,
            content_offsets_us,
            ttft_us,
            tpot_us,
            output_tokens,
            output_tokens_source: source,
            prompt_tokens: t.usage_field("prompt_tokens"),
            cached_prompt_tokens: t.usage_cached_tokens(),
            done_seen: t.done,
        })
    }

    /// The exchange's t0 on the monotonic clock.
    pub(crate) fn t0_ns(&self) -> u64 {
        self.t0_ns
    }

    /// Keep the final response head's bytes as read, for the row.
    pub(crate) fn keep_response_head(&mut self, wire: Bytes) {
        self.response_head = wire;
    }

    /// The exchange goes out on connection `id`, kept alive from an earlier exchange.
    pub(super) fn on_reuse(&mut self, id: i64) {
        self.connection_reused = true;
        self.connection_id = Some(id);
    }

    /// The reused connection was closed before it took the request, which is sent once
    /// more on a new connection (the engine's one retry).
    pub(super) fn on_retry(&mut self) {
        self.connection_reused = false;
        self.connection_retried = true;
    }

    /// Stamp this exchange's reads and writes: the stamps of the connection carrying it,
    /// cleared of an earlier exchange's.
    pub(super) fn attach(&mut self, stamps: &Arc<IoStamps>) {
        stamps.reset();
        self.stamps = Some(stamps.clone());
    }

    /// Close the capture when its body has ended, at the body's end stamp (no clock read),
    /// or now if it has not.
    pub(crate) fn finish_at_end(&mut self) {
        let end = self.end_ns.unwrap_or_else(clock::now_ns);
        self.finish(end);
    }

    /// The facts of a finished exchange, for its row.
    pub(crate) fn into_captured(mut self) -> Captured {
        Captured {
            connection_id: self.connection_id,
            connection_reused: self.connection_reused,
            connection_retried: self.connection_retried,
            status: self.status.map(|s| i32::from(s.as_u16())),
            response_head: std::mem::take(&mut self.response_head),
            body: self.body.take(),
            timings: self.timings(),
            stream: self.stream_columns(),
        }
    }

    /// Timing columns of the row, in microseconds from t0.
    fn timings(&self) -> Timings {
        Timings {
            connect_us: self.us(self.connect_ns),
            tls_us: self.us(self.tls_ns),
            tls_resumed: self.tls_resumed,
            request_sent_us: self.us(self.request_sent_ns),
            first_byte_us: self.us(self.first_byte_ns),
            first_body_us: self.us(self.first_body_ns),
            total_us: self.us(self.end_ns),
            downstream_done_us: None,
        }
    }

    /// Pull the socket stamps of the connection in use (also after a cancel), and close
    /// the exchange's clock at `now_ns` if the body did not already end it.
    pub(crate) fn finish(&mut self, now_ns: u64) {
        if let Some(st) = self.stamps.take() {
            if self.request_sent_ns.is_none() {
                self.request_sent_ns = st.last_write_ns();
            }
            if self.first_byte_ns.is_none() {
                self.first_byte_ns = st.first_read_ns();
            }
        }
        if self.end_ns.is_none() {
            self.end_ns = Some(now_ns);
        }
    }

    /// `stamp - t0` in microseconds.
    fn us(&self, stamp: Option<u64>) -> Option<i64> {
        stamp.map(|t| clock::us_between(self.t0_ns, t))
    }
}
