//! The row: one exchange as it becomes a line of `exchanges/*.parquet`, plain data that
//! the drivers build and the writer thread encodes. Imports nothing else from `record/`.

use std::sync::Arc;

use bytes::Bytes;
use http::HeaderMap;

use crate::budget::BudgetHold;
use crate::model::{Outcome, Phase, StreamColumns, Timings};

/// Version of the exchange schema, stored in each file's key-value metadata.
pub(crate) const SCHEMA_VERSION: &str = "1";

/// One exchange, as a row of `exchanges/*.parquet`.
#[derive(Debug)]
pub struct ExchangeRecord {
    pub run_id: Arc<str>,
    pub exchange_id: i64,
    pub phase: Phase,
    /// The campaign arm that answered (`None` outside campaigns).
    pub arm: Option<Arc<str>>,
    pub case_name: Option<Arc<str>>,
    pub variant: Option<Arc<str>>,
    pub concurrency: Option<i32>,
    /// Open loop: the round's arrival rate.
    pub target_rate_per_second: Option<f64>,
    pub repetition: Option<i32>,
    pub dispatch_index: i64,
    pub worker: i32,
    pub connection_id: Option<i64>,
    pub connection_reused: bool,
    pub connection_retried: bool,
    /// Wall clock, microseconds since the Unix epoch (UTC).
    pub started_at_us: i64,
    pub start_offset_us: i64,
    /// Open loop: the intended send time on the run's clock.
    pub scheduled_offset_us: Option<i64>,
    pub method: http::Method,
    /// Full URL; secret query parameters are redacted when the row is written.
    pub url: Arc<str>,
    /// Secret values are redacted when the row is written.
    /// Shared: replay's rows of one request point at one map.
    pub request_headers: Arc<HeaderMap>,
    pub request_body: Bytes,
    pub request_body_len: i64,
    pub request_body_truncated: bool,
    pub status: Option<i32>,
    pub response_headers: HeaderMap,
    pub response_body: Bytes,
    pub response_body_len: i64,
    pub response_body_truncated: bool,
    pub timings: Timings,
    /// `None`: the response was not an event stream.
    pub stream: Option<StreamColumns>,
    pub outcome: Outcome,
    pub error_message: Option<String>,
    pub oracle_mismatch_pointer: Option<String>,
    /// Entries of the answer's decisions container (replay, `ok`, JSON oracle only).
    pub decisions: Option<i64>,
    /// The input tokens the plan expected (its variant's `prompt_tokens`); `None` in serve.
    pub prompt_tokens_planned: Option<i64>,
    /// A JSON answer's `usage`: (prompt tokens if reported, completion tokens), written to
    /// `output_tokens` / `prompt_tokens` with source `usage`; `None` for streams (their
    /// counts are in `stream`) and where the answer reported none (serve: filled on the
    /// writer thread, see `usage_from_body`).
    pub answer_usage: Option<(Option<i64>, i64)>,
    /// The oracle's judgment whatever the lane made of it (`None`: nothing was judged).
    pub oracle_passed: Option<bool>,
    /// The session this exchange is a turn of (`None` outside sessions).
    pub session_id: Option<Arc<str>>,
    /// The turn's index in its session, from 1 (`None` outside sessions).
    pub turn: Option<i32>,
    /// The answer's `usage.prompt_tokens_details.cached_tokens` (a JSON answer's, or a
    /// stream's usage chunk's): prompt tokens the server's prefix cache served; `None`
    /// when the answer did not report it (never 0 for unknown).
    pub cached_prompt_tokens: Option<i64>,
    /// A trace's session turn: how much later than its own entry's offset it was due
    /// (the turn before it and its think time ended later), µs; 0 for a run's first turn;
    /// `None` elsewhere.
    pub session_lag_us: Option<i64>,
    /// Why the oracle judged the answer wrong (`KIND: at POINTER: reason`), in every
    /// lane; `None` when it passed or nothing was judged.
    pub oracle_detail: Option<String>,
    /// serve: a whole JSON answer whose `usage` (token counts and cached prompt tokens)
    /// the writer thread reads from `response_body` before encoding the row
    /// ([`Self::read_usage_from_body`]), which keeps JSON parsing off serve's path.
    pub usage_from_body: bool,
    /// Recorded bytes held in serve's memory budget, released once the row is encoded.
    pub memory: Option<BudgetHold>,
}

impl ExchangeRecord {
    /// Fill `answer_usage` and `cached_prompt_tokens` from the recorded answer's `usage`
    /// (one parse that builds nothing else), for a row marked `usage_from_body`; an
    /// answer that reports none leaves them `None`.
    pub(crate) fn read_usage_from_body(&mut self) {
        if !std::mem::take(&mut self.usage_from_body) {
            return;
        }
        if let Some(u) = crate::model::answer_usage(&self.response_body) {
            self.answer_usage = Some(u.tokens);
            self.cached_prompt_tokens = u.cached_prompt;
        }
    }

    /// What the row holds in memory, roughly (measured against the resident memory of
    /// replay holding 250,000 rows of 1 KiB bodies: within 25 %). The request's header map
    /// and URL are shared between rows in replay and counted anyway: an upper bound.
    pub(crate) fn approx_bytes(&self) -> usize {
        // The row itself, and per header entry its bucket and index slot.
        const ROW: usize = std::mem::size_of::<ExchangeRecord>() + 64;
        const PER_HEADER: usize = 96;
        let headers = |h: &HeaderMap| {
            h.iter()
                .map(|(k, v)| PER_HEADER + k.as_str().len() + v.len())
                .sum::<usize>()
        };
        let stream = self.stream.as_ref().map_or(0, |s| {
            8 * (s.event_offsets_us.capacity() + s.content_offsets_us.capacity())
        });
        ROW + headers(&self.request_headers)
            + headers(&self.response_headers)
            + self.request_body.len()
            + self.response_body.len()
            + self.url.len()
            + stream
            + self.error_message.as_ref().map_or(0, String::len)
            + self.session_id.as_ref().map_or(0, |s| s.len())
    }
}
