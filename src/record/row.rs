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
    /// The response head as the worker sent it; its fields become the `response_headers`
    /// column on the writer thread (secret values redacted there).
    pub response_head: WireHead,
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
        let (fields, names, values) = HeaderFields::Map(&self.request_headers).sizes();
        let stream = self.stream.as_ref().map_or(0, |s| {
            8 * (s.event_offsets_us.capacity() + s.content_offsets_us.capacity())
        });
        ROW + fields * PER_HEADER
            + names
            + values
            + self.response_head.0.len()
            + self.request_body.len()
            + self.response_body.len()
            + self.url.len()
            + stream
            + self.error_message.as_ref().map_or(0, String::len)
            + self.session_id.as_ref().map_or(0, |s| s.len())
    }
}

/// A response head kept as read off the wire: the status line and the header fields
/// through the blank line, one allocation the size of the head. Its fields are parsed
/// (again: the exchange already checked them) only when the row is encoded, on the writer
/// thread, instead of a `HeaderMap` of small allocations built on the exchange's path and
/// held until then. Empty when no head came.
#[derive(Debug, Clone, Default)]
pub struct WireHead(Bytes);

/// Header fields at most in one head: the exchange's parser's limit
/// (`engine::http1::codec::MAX_HEADERS`, with the same default `httparse` settings), so
/// every head it accepted parses here too; a head that did not would record no fields.
const MAX_FIELDS: usize = 100;

impl WireHead {
    /// `raw`: a whole head, as `httparse` accepted it (anything else reads as no fields),
    /// in a buffer of its own (its length is what the row counts in memory).
    pub fn new(raw: Bytes) -> WireHead {
        WireHead(raw)
    }

    /// Upper bounds on its fields and on their names' and their values' bytes, without
    /// parsing it: httparse ends every line of a head it accepts with a line feed, a field
    /// is at least one line between the status line and the blank one, and names and
    /// values are within the head's bytes.
    pub(crate) fn sizes(&self) -> (usize, usize, usize) {
        let lines = memchr::memchr_iter(b'\n', &self.0).count();
        (lines.saturating_sub(2), self.0.len(), self.0.len())
    }

    /// Each field in wire order, the name in lower case (as `HeaderName` spells it).
    pub(crate) fn for_each_field(&self, mut f: impl FnMut(&str, &[u8])) {
        if self.0.is_empty() {
            return;
        }
        // Uninitialised: the parser writes the fields it finds. 100 empty fields written
        // first were 3.2 KB of stores a parse (~28 % of `Column::array`'s samples in the
        // writer bench's profile).
        let mut fields =
            [const { std::mem::MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_FIELDS];
        let mut res = httparse::Response::new(&mut []);
        let parsed = httparse::ParserConfig::default().parse_response_with_uninit_headers(
            &mut res,
            &self.0,
            &mut fields,
        );
        if !matches!(parsed, Ok(httparse::Status::Complete(_))) {
            return;
        }
        let mut name = String::new();
        for h in res.headers.iter() {
            name.clear();
            name.push_str(h.name);
            name.make_ascii_lowercase();
            f(&name, h.value);
        }
    }
}

/// A header list column's source: a map (the request's, built to forward or send it) or
/// a head as read ([`WireHead`]).
#[derive(Clone, Copy)]
pub(crate) enum HeaderFields<'a> {
    Map(&'a HeaderMap),
    Wire(&'a WireHead),
}

impl HeaderFields<'_> {
    /// Each field: its name in lower case, its value.
    pub(crate) fn for_each(self, mut f: impl FnMut(&str, &[u8])) {
        match self {
            HeaderFields::Map(m) => m.iter().for_each(|(k, v)| f(k.as_str(), v.as_bytes())),
            HeaderFields::Wire(w) => w.for_each_field(f),
        }
    }

    /// How many fields, how many bytes of names and how many of values, at most: exact
    /// for a map, upper bounds for a head as read (not parsed for them: encoding sizes
    /// its steps and buffers with these, and parses each head once, as it encodes it).
    pub(crate) fn sizes(self) -> (usize, usize, usize) {
        match self {
            HeaderFields::Map(m) => m.iter().fold((0, 0, 0), |(n, k, v), (name, value)| {
                (n + 1, k + name.as_str().len(), v + value.len())
            }),
            HeaderFields::Wire(w) => w.sizes(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(raw: &'static [u8]) -> Vec<(String, Vec<u8>)> {
        let mut out = Vec::new();
        WireHead::new(Bytes::from_static(raw))
            .for_each_field(|n, v| out.push((n.to_string(), v.to_vec())));
        out
    }

    #[test]
    fn a_wire_head_gives_its_fields_in_wire_order_with_lower_case_names() {
        let got = fields(
            b"HTTP/1.1 200 OK\r\nSet-Cookie: a=1\r\nContent-Type: application/json\r\n\
              set-cookie: b=2\r\nX-Odd:  spaced value \r\n\r\n",
        );
        let want = [
            ("set-cookie", &b"a=1"[..]),
            ("content-type", b"application/json"),
            ("set-cookie", b"b=2"),
            ("x-odd", b"spaced value"),
        ];
        let want: Vec<_> = want
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_vec()))
            .collect();
        assert_eq!(got, want);
        // As the `HeaderMap` the exchange parsed would hold them (the same names and
        // values; only the map groups a repeated name).
        let mut map = HeaderMap::new();
        for (n, v) in &want {
            map.append(
                http::HeaderName::from_bytes(n.as_bytes()).unwrap(),
                http::HeaderValue::from_bytes(v).unwrap(),
            );
        }
        let mut from_map = Vec::new();
        HeaderFields::Map(&map).for_each(|n, v| from_map.push((n.to_string(), v.to_vec())));
        let mut sorted = got.clone();
        sorted.sort();
        from_map.sort();
        assert_eq!(sorted, from_map);
        // The map's sizes are exact.
        let names: usize = got.iter().map(|(n, _)| n.len()).sum();
        let values: usize = got.iter().map(|(_, v)| v.len()).sum();
        assert_eq!(HeaderFields::Map(&map).sizes(), (4, names, values));
        // No head (a failed exchange), or bytes that are not a whole head: no fields.
        assert!(fields(b"").is_empty());
        assert!(fields(b"HTTP/1.1 200 OK\r\nx: 1\r\n").is_empty());
    }

    /// What encoding sizes its steps and buffers with, unparsed, bounds what the parse
    /// yields: CRLF or bare LF lines, no fields, an empty head, a head that does not parse.
    #[test]
    fn a_wire_heads_unparsed_sizes_bound_its_fields() {
        for raw in [
            &b"HTTP/1.1 200 OK\r\nSet-Cookie: a=1\r\nX-Odd:  spaced value \r\n\r\n"[..],
            b"HTTP/1.1 200 OK\nA: 1\nB: two\nC:\n\n",
            b"HTTP/1.1 204 No Content\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nx: 1\r\n",
            b"",
        ] {
            let got = fields(raw);
            let head = WireHead::new(Bytes::from_static(raw));
            let (count, names, values) = HeaderFields::Wire(&head).sizes();
            assert!(count >= got.len(), "{count} < {} in {raw:?}", got.len());
            assert!(names >= got.iter().map(|(n, _)| n.len()).sum::<usize>());
            assert!(values >= got.iter().map(|(_, v)| v.len()).sum::<usize>());
        }
        // Tight where every line is a field: the bare-LF head's three.
        assert_eq!(fields(b"HTTP/1.1 200 OK\nA: 1\nB: two\nC:\n\n").len(), 3);
        let bare = WireHead::new(Bytes::from_static(b"HTTP/1.1 200 OK\nA: 1\nB: two\nC:\n\n"));
        assert_eq!(bare.sizes().0, 3);
        assert_eq!(WireHead::default().sizes(), (0, 0, 0));
    }
}
