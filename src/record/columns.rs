//! The columns of `exchanges/*.parquet`, declared once.
//!
//! Each [`Column`] carries its name, nullability, unit, doc line *and* the code that fills
//! it from a row; the Arrow type follows from the filler's kind. The schema
//! ([`exchange_schema`]) and each column's array ([`Column::array`], which the part
//! encoder calls a column at a time) are both generated from [`COLUMNS`],
//! so no column is matched to its values by position, and `docs/output.md` is checked
//! against the same list by a test. Secrets are redacted here, as values are copied into
//! Arrow buffers: the URL's secret query parameters and secret header values never reach
//! an encoder.

use std::sync::Arc;

use arrow_array::builder::{BinaryBuilder, Int64Builder, ListBuilder, StringBuilder};
use arrow_array::{
    ArrayRef, BooleanArray, Float64Array, Int32Array, Int64Array, ListArray, StringArray,
    StructArray, TimestampMicrosecondArray,
};
use arrow_schema::{DataType, Field, Fields, Schema, SchemaRef, TimeUnit};

use super::row::{ExchangeRecord, HeaderFields};
use crate::redact::Redaction;

/// What one header weighs in an encoding step besides its bytes ([`Column::step_end`]).
const HEADER_STEP_BYTES: usize = 512;

/// How a column is filled from a row; the variant fixes the column's Arrow type.
#[derive(Clone, Copy)]
pub(crate) enum Fill {
    Utf8(for<'a> fn(&'a ExchangeRecord) -> Option<&'a str>),
    /// A URL whose secret query parameters are redacted.
    RedactedUrl(for<'a> fn(&'a ExchangeRecord) -> &'a str),
    Int32(fn(&ExchangeRecord) -> Option<i32>),
    Int64(fn(&ExchangeRecord) -> Option<i64>),
    Boolean(fn(&ExchangeRecord) -> Option<bool>),
    Float64(fn(&ExchangeRecord) -> Option<f64>),
    Binary(for<'a> fn(&'a ExchangeRecord) -> &'a [u8]),
    /// Microseconds since the Unix epoch, UTC.
    TimestampUtc(fn(&ExchangeRecord) -> i64),
    /// `List<Struct<name, value>>` in wire order; secret values redacted.
    Headers(for<'a> fn(&'a ExchangeRecord) -> HeaderFields<'a>),
    Int64List(for<'a> fn(&'a ExchangeRecord) -> Option<&'a [i64]>),
}

/// One column of the exchange schema.
#[derive(Clone, Copy)]
pub(crate) struct Column {
    pub(crate) name: &'static str,
    pub(crate) nullable: bool,
    /// `us` (microseconds from t0), `bytes`, `utc` or `""`. Unit and doc line are checked
    /// against docs/output.md by this module's tests.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) unit: &'static str,
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) doc: &'static str,
    pub(crate) fill: Fill,
}

impl Column {
    pub(crate) fn data_type(&self) -> DataType {
        match self.fill {
            Fill::Utf8(_) | Fill::RedactedUrl(_) => DataType::Utf8,
            Fill::Int32(_) => DataType::Int32,
            Fill::Int64(_) => DataType::Int64,
            Fill::Boolean(_) => DataType::Boolean,
            Fill::Float64(_) => DataType::Float64,
            Fill::Binary(_) => DataType::Binary,
            Fill::TimestampUtc(_) => DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            Fill::Headers(_) => header_list_type(),
            Fill::Int64List(_) => DataType::List(Arc::new(int_item())),
        }
    }

    /// The type as docs/output.md writes it (`Int64, null`).
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn doc_type(&self) -> String {
        let t = match self.fill {
            Fill::Utf8(_) | Fill::RedactedUrl(_) => "Utf8",
            Fill::Int32(_) => "Int32",
            Fill::Int64(_) => "Int64",
            Fill::Boolean(_) => "Boolean",
            Fill::Float64(_) => "Float64",
            Fill::Binary(_) => "Binary",
            Fill::TimestampUtc(_) => "Timestamp(µs, UTC)",
            Fill::Headers(_) => "List<Struct<name: Utf8, value: Binary>>",
            Fill::Int64List(_) => "List<Int64>",
        };
        if self.nullable {
            format!("{t}, null")
        } else {
            t.to_string()
        }
    }

    fn field(&self) -> Field {
        Field::new(self.name, self.data_type(), self.nullable)
    }

    /// Where one encoding step over `rows[start..]` ends: at the last row for a column of
    /// fixed-width values, else once the values reach `bytes` (at least one row).
    pub(crate) fn step_end(&self, rows: &[ExchangeRecord], start: usize, bytes: usize) -> usize {
        if bytes == usize::MAX {
            return rows.len();
        }
        let until = |size: &dyn Fn(&ExchangeRecord) -> usize| {
            let mut sum = 0;
            for (i, r) in rows.iter().enumerate().skip(start) {
                sum += size(r);
                if sum >= bytes {
                    return i + 1;
                }
            }
            rows.len()
        };
        match self.fill {
            Fill::Utf8(f) => until(&|r| f(r).map_or(0, str::len)),
            Fill::RedactedUrl(f) => until(&|r| f(r).len()),
            Fill::Binary(f) => until(&|r| f(r).len()),
            // A header costs a list entry, a struct and a redaction check besides its
            // bytes (measured: about as much as 512 bytes of a body). Its bytes count
            // once: a head's length bounds its names and its values alike, and a map's
            // larger side is near enough beside the 512s.
            Fill::Headers(f) => until(&|r| {
                let (fields, names, values) = f(r).sizes();
                fields * HEADER_STEP_BYTES + names.max(values)
            }),
            Fill::Int64List(f) => until(&|r| f(r).map_or(0, |v| v.len() * 8)),
            Fill::Int32(_)
            | Fill::Int64(_)
            | Fill::Boolean(_)
            | Fill::Float64(_)
            | Fill::TimestampUtc(_) => rows.len(),
        }
    }

    /// This column's values of `rows`, secrets redacted.
    pub(crate) fn array(&self, rows: &[ExchangeRecord], redact: &Redaction) -> ArrayRef {
        match self.fill {
            Fill::Utf8(f) => Arc::new(StringArray::from_iter(rows.iter().map(f))),
            Fill::RedactedUrl(f) => Arc::new(StringArray::from_iter_values(
                rows.iter().map(|r| redact.url(f(r))),
            )),
            Fill::Int32(f) => Arc::new(Int32Array::from_iter(rows.iter().map(f))),
            Fill::Int64(f) => Arc::new(Int64Array::from_iter(rows.iter().map(f))),
            Fill::Boolean(f) => Arc::new(BooleanArray::from_iter(rows.iter().map(f))),
            Fill::Float64(f) => Arc::new(Float64Array::from_iter(rows.iter().map(f))),
            Fill::Binary(f) => {
                // Sized up front: bodies are most of a batch's bytes, and a builder grown
                // by doubling copies them again at every step.
                let bytes = rows.iter().map(|r| f(r).len()).sum();
                let mut b = BinaryBuilder::with_capacity(rows.len(), bytes);
                rows.iter().for_each(|r| b.append_value(f(r)));
                Arc::new(b.finish())
            }
            Fill::TimestampUtc(f) => Arc::new(
                TimestampMicrosecondArray::from_iter_values(rows.iter().map(f))
                    .with_timezone("UTC"),
            ),
            Fill::Headers(f) => headers_array(rows, redact, f),
            Fill::Int64List(f) => int_list_array(rows, f),
        }
    }
}

/// Shorthand for one entry of [`COLUMNS`]: name, kind, nullability, unit, filler, doc line
/// (the meaning docs/output.md gives, checked by a test).
macro_rules! column {
    ($name:literal, $kind:ident, $nullable:expr, $unit:literal, $fill:expr, $doc:literal) => {
        Column {
            name: $name,
            nullable: $nullable,
            unit: $unit,
            doc: $doc,
            fill: Fill::$kind($fill),
        }
    };
}

type R = ExchangeRecord;
const NULLABLE: bool = true;
const REQUIRED: bool = false;

/// Every column of `exchanges/*.parquet`, in file order (docs/output.md lists the same).
#[rustfmt::skip]
pub(crate) static COLUMNS: [Column; 59] = [
    column!("run_id", Utf8, REQUIRED, "", |r: &R| Some(&*r.run_id),
        "the run (also in `config.json`)"),
    column!("exchange_id", Int64, REQUIRED, "", |r: &R| Some(r.exchange_id),
        "unique within the run, from 0, in order of completion"),
    column!("phase", Utf8, REQUIRED, "", |r: &R| Some(r.phase.as_str()),
        "`health`, `readiness`, `warmup`, `feasibility`, `measured` (`live` for serve)"),
    column!("arm", Utf8, NULLABLE, "", |r: &R| r.arm.as_deref(),
        "the campaign arm that answered; null outside campaigns"),
    column!("case_name", Utf8, NULLABLE, "", |r: &R| r.case_name.as_deref(),
        "the case (`case` is an SQL keyword); null for `health`"),
    column!("variant", Utf8, NULLABLE, "", |r: &R| r.variant.as_deref(),
        "the variant's name; null for a case without variants and for `health`"),
    column!("concurrency", Int32, NULLABLE, "", |r: &R| r.concurrency,
        "the wave's concurrency; 1 for the sequential phases; null in serve and in open-loop rounds"),
    column!("target_rate_per_second", Float64, NULLABLE, "", |r: &R| r.target_rate_per_second,
        "open loop: the round's arrival rate (requests per second); null in closed loops and serve"),
    column!("repetition", Int32, NULLABLE, "", |r: &R| r.repetition,
        "measured round, from 0; null in other phases"),
    column!("dispatch_index", Int64, REQUIRED, "", |r: &R| Some(r.dispatch_index),
        "from 0 within (case, phase, concurrency, repetition), and within the variant for readiness and warm-up; in an open loop the arrival's index in the round's schedule (a shard's are every Nth); in a trace round (and its readiness) the entry's index in the trace"),
    column!("worker", Int32, REQUIRED, "", |r: &R| Some(r.worker),
        "the closed-loop worker that sent it, from 0 (open loop: the sender's connection slot, below `load.max_in_flight`; serve: the client connection's number)"),
    column!("connection_id", Int64, NULLABLE, "", |r: &R| r.connection_id,
        "the connection used (unique within the run); null if none was opened"),
    column!("connection_reused", Boolean, REQUIRED, "", |r: &R| Some(r.connection_reused),
        "sent on a connection that had already carried an exchange"),
    column!("connection_retried", Boolean, REQUIRED, "", |r: &R| Some(r.connection_retried),
        "the keep-alive rule replaced a closed connection and sent once more"),
    column!("started_at", TimestampUtc, REQUIRED, "utc", |r: &R| r.started_at_us,
        "wall clock at t0: the only wall-clock read per exchange, for joining with other logs"),
    column!("start_offset_us", Int64, REQUIRED, "us", |r: &R| Some(r.start_offset_us),
        "t0 on the run's monotonic clock (from the run's start)"),
    column!("scheduled_offset_us", Int64, NULLABLE, "us", |r: &R| r.scheduled_offset_us,
        "open loop: the intended send time on the same clock as `start_offset_us`; null in closed loops and serve"),
    column!("send_lag_us", Int64, NULLABLE, "us", |r: &R| r.scheduled_offset_us.map(|s| r.start_offset_us - s),
        "open loop: `start_offset_us - scheduled_offset_us`, how late the send was"),
    column!("method", Utf8, REQUIRED, "", |r: &R| Some( r.method.as_str() ),
        "request method"),
    column!("url", RedactedUrl, REQUIRED, "", |r: &R| &*r.url,
        "full URL; values of secret query parameters (`api_key`, `apikey`, `key`, `token`, `access_token`) are `<redacted>`"),
    column!("request_headers", Headers, REQUIRED, "", |r: &R| HeaderFields::Map(&r.request_headers),
        "headers as sent, duplicates kept; secret values are `<redacted>`"),
    column!("request_body", Binary, REQUIRED, "bytes", |r: &R| &r.request_body[..],
        "body bytes as sent (up to `--max-record-body`)"),
    column!("request_body_len", Int64, REQUIRED, "bytes", |r: &R| Some(r.request_body_len),
        "true body length in bytes"),
    column!("request_body_truncated", Boolean, REQUIRED, "", |r: &R| Some(r.request_body_truncated),
        "`request_body` holds fewer bytes than `request_body_len`"),
    column!("status", Int32, NULLABLE, "", |r: &R| r.status,
        "response status; null if no response head arrived"),
    column!("response_headers", Headers, REQUIRED, "", |r: &R| HeaderFields::Wire(&r.response_head),
        "response headers in the order the worker sent them, names in lower case, duplicates kept, secret values `<redacted>`"),
    column!("response_body", Binary, REQUIRED, "bytes", |r: &R| &r.response_body[..],
        "body bytes received (also the partial bytes of a cut or timed-out response)"),
    column!("response_body_len", Int64, REQUIRED, "bytes", |r: &R| Some(r.response_body_len),
        "bytes of body received"),
    column!("response_body_truncated", Boolean, REQUIRED, "", |r: &R| Some(r.response_body_truncated),
        "more arrived than `--max-record-body`; the oracle cannot judge it"),
    column!("connect_us", Int64, NULLABLE, "us", |r: &R| r.timings.connect_us,
        "TCP connected (name resolution included); null on a reused connection"),
    column!("tls_us", Int64, NULLABLE, "us", |r: &R| r.timings.tls_us,
        "TLS handshake done; null for plain HTTP or a reused connection"),
    column!("tls_resumed", Boolean, NULLABLE, "", |r: &R| r.timings.tls_resumed,
        "the TLS session was resumed (never under `fresh`)"),
    column!("request_sent_us", Int64, NULLABLE, "us", |r: &R| r.timings.request_sent_us,
        "last request byte written to the connection"),
    column!("first_byte_us", Int64, NULLABLE, "us", |r: &R| r.timings.first_byte_us,
        "first response byte read from the connection"),
    column!("first_body_us", Int64, NULLABLE, "us", |r: &R| r.timings.first_body_us,
        "first response body byte received; null for an empty body"),
    column!("total_us", Int64, NULLABLE, "us", |r: &R| r.timings.total_us,
        "last response body byte received; for failures, when the failure was detected. Oracle validation is excluded"),
    column!("downstream_done_us", Int64, NULLABLE, "us", |r: &R| r.timings.downstream_done_us,
        "serve only: last response byte handed to the client connection; null in replay and when the client's response did not complete (`client_aborted`, or a body the upstream cut); for `ok` never below `total_us`"),
    column!("is_stream", Boolean, REQUIRED, "", |r: &R| Some(r.stream.is_some()),
        "the response was `text/event-stream` (the stream columns below are null otherwise, but for a JSON answer's `usage` in `output_tokens`, `output_tokens_source` and `prompt_tokens`)"),
    column!("event_count", Int64, NULLABLE, "", |r: &R| r.stream.as_ref().map(|s| s.event_count),
        "events received"),
    column!("event_offsets_us", Int64List, NULLABLE, "us", |r: &R| r.stream.as_ref().map(|s| &s.event_offsets_us[..]),
        "arrival of every event, µs from t0 (stamped when the completing read returned)"),
    column!("content_offsets_us", Int64List, NULLABLE, "us", |r: &R| r.stream.as_ref().map(|s| &s.content_offsets_us[..]),
        "arrival of every content event (generated text; for non-OpenAI streams, every event)"),
    column!("ttft_us", Int64, NULLABLE, "us", |r: &R| r.stream.as_ref().and_then(|s| s.ttft_us),
        "first content event"),
    column!("tpot_us", Int64, NULLABLE, "us", |r: &R| r.stream.as_ref().and_then(|s| s.tpot_us),
        "`(total_us - ttft_us) / (output_tokens - 1)` when output_tokens > 1"),
    column!("output_tokens", Int64, NULLABLE, "", |r: &R| r.stream.as_ref().map_or(r.answer_usage.map(|u| u.1), |s| s.output_tokens),
        "a stream: `usage.completion_tokens` if it reported it, else its content events; a JSON answer: its `usage.completion_tokens` (serve reads it from its whole recorded copy of an answer it delivered, on the recorder's thread; readers of runs recorded before take it from `response_body`); null when neither"),
    column!("output_tokens_source", Utf8, NULLABLE, "", |r: &R| r.stream.as_ref().map(|s| s.output_tokens_source).or(r.answer_usage.map(|_| "usage")),
        "where `output_tokens` came from: `usage` (the answer's or the stream's usage object) or `events` (a stream's content events); null when `output_tokens` is"),
    column!("prompt_tokens", Int64, NULLABLE, "", |r: &R| r.stream.as_ref().map_or(r.answer_usage.and_then(|u| u.0), |s| s.prompt_tokens),
        "`usage.prompt_tokens` of a stream or a JSON answer, when reported"),
    column!("stream_done_seen", Boolean, NULLABLE, "", |r: &R| r.stream.as_ref().map(|s| s.done_seen),
        "an event's data was exactly `[DONE]` (not required for `ok` unless the oracle sets `require_done`)"),
    column!("outcome", Utf8, REQUIRED, "", |r: &R| Some(r.outcome.as_str()),
        "`ok`, `http` (status other than expected), `correctness` (oracle mismatch), `timeout` (the plan's deadline cancelled it), `transport` (connect, reset, malformed or cut response), `shutdown_cut` (still in flight when the stop's grace period ended); serve adds `client_aborted`"),
    column!("error_message", Utf8, NULLABLE, "", |r: &R| r.error_message.as_deref(),
        "what went wrong, naming the side and the step (`connect to 127.0.0.1:8000: Connection refused`)"),
    column!("oracle_mismatch_pointer", Utf8, NULLABLE, "", |r: &R| r.oracle_mismatch_pointer.as_deref(),
        "first differing JSON pointer of a JSON oracle mismatch (`\"\"` = the whole document)"),
    column!("decisions", Int64, NULLABLE, "", |r: &R| r.decisions,
        "entries of the answer's decisions container (`decisions_pointer`, default `/answers`): array elements or object members, 0 when absent or not a container; null unless the exchange was `ok` under a JSON oracle (replay)"),
    column!("prompt_tokens_planned", Int64, NULLABLE, "", |r: &R| r.prompt_tokens_planned,
        "the input tokens the plan expected (the variant's `prompt_tokens`, from the tokenizer that made or counted the prompt); null without one and in serve; compare with the server's `usage.prompt_tokens`"),
    column!("stream_bundled", Boolean, NULLABLE, "", |r: &R| r.stream.as_ref().map(|s| s.bundled()),
        "the stream's tokens after its first arrived bundled: at least two content events after the first, more than half of them in one read (one arrival stamp); its decode time is then how a buffer flushed, not the worker's pace, and v2 decode gates leave it out; null for non-streams"),
    column!("oracle_passed", Boolean, NULLABLE, "", |r: &R| r.oracle_passed,
        "the oracle's judgment of the answer, whatever the lane made of it: false for a `correctness` failure and for a performance-fit arm's mismatch that stays `ok`; null when nothing was judged (no oracle, `unjudged`, a failure before the body was judged, serve); McNemar counts it"),
    column!("session_id", Utf8, NULLABLE, "", |r: &R| r.session_id.as_deref(),
        "the session this exchange is a turn of (the plan's session `id`); null outside sessions"),
    column!("turn", Int32, NULLABLE, "", |r: &R| r.turn,
        "the turn's index in its session, from 1; null outside sessions"),
    column!("cached_prompt_tokens", Int64, NULLABLE, "", |r: &R| r.cached_prompt_tokens,
        "prompt tokens the server's prefix cache served: the answer's `usage.prompt_tokens_details.cached_tokens` (a JSON answer's, or a stream's usage chunk's; vLLM reports it with `--enable-prompt-tokens-details`); null when the answer does not report it (never 0 for unknown)"),
    column!("session_lag_us", Int64, NULLABLE, "us", |r: &R| r.session_lag_us,
        "a trace's session turn: how much later than its own entry's offset the turn was due, because the turn before it and its think time ended later (`scheduled_offset_us` is the due time); 0 for a turn due at its offset (a run's first turn always); null outside a trace's sessions and for a turn no entry gives an offset"),
    column!("oracle_detail", Utf8, NULLABLE, "", |r: &R| r.oracle_detail.as_deref(),
        "why the oracle judged the answer wrong, in every lane (a performance-fit arm's mismatch that stays `ok` too): its kind (`json`, `bytes`, `stream`, `schema`, `tool_calls`, `choice`, `pattern`), where (a JSON pointer) and why, e.g. `tool_calls: at /tool_calls/0/function/arguments/city: does not fit the schema: ...`; null when it passed or nothing was judged"),
];

/// The Arrow schema of `exchanges/*.parquet`, generated from [`COLUMNS`].
pub(crate) fn exchange_schema() -> SchemaRef {
    schema_of(&COLUMNS)
}

fn schema_of(columns: &[Column]) -> SchemaRef {
    Arc::new(Schema::new(
        columns.iter().map(Column::field).collect::<Vec<_>>(),
    ))
}

/// Convert rows to one Arrow batch of [`exchange_schema`], redacting secrets (the writer
/// converts a column at a time instead: `encode.rs`).
#[cfg(test)]
pub(crate) fn to_batch(
    rows: &[ExchangeRecord],
    redact: &Redaction,
    schema: &SchemaRef,
) -> Result<arrow_array::RecordBatch, arrow_schema::ArrowError> {
    batch_of(&COLUMNS, rows, redact, schema.clone())
}

#[cfg(test)]
fn batch_of(
    columns: &[Column],
    rows: &[ExchangeRecord],
    redact: &Redaction,
    schema: SchemaRef,
) -> Result<arrow_array::RecordBatch, arrow_schema::ArrowError> {
    let arrays = columns.iter().map(|c| c.array(rows, redact)).collect();
    arrow_array::RecordBatch::try_new(schema, arrays)
}

fn int_item() -> Field {
    Field::new("item", DataType::Int64, false)
}

fn header_struct_fields() -> Fields {
    Fields::from(vec![
        Field::new("name", DataType::Utf8, false),
        Field::new("value", DataType::Binary, false),
    ])
}

fn header_list_type() -> DataType {
    DataType::List(Arc::new(Field::new(
        "item",
        DataType::Struct(header_struct_fields()),
        false,
    )))
}

fn headers_array(
    rows: &[ExchangeRecord],
    redact: &Redaction,
    pick: for<'a> fn(&'a ExchangeRecord) -> HeaderFields<'a>,
) -> ArrayRef {
    // Sized from each source's bounds (a head as read is not parsed for them, only to fill
    // the builders): exact for a map (before redaction: a short secret value becomes the
    // longer `<redacted>`, and the builder grows); for a head, names and values each get
    // room for the whole head (about 3x what names use and 2x what values use).
    let (mut count, mut name_bytes, mut value_bytes) = (0, 0, 0);
    for r in rows {
        let (fields, names, values) = pick(r).sizes();
        count += fields;
        name_bytes += names;
        value_bytes += values;
    }
    let mut names = StringBuilder::with_capacity(count, name_bytes);
    let mut values = BinaryBuilder::with_capacity(count, value_bytes);
    let mut offsets: Vec<i32> = Vec::with_capacity(rows.len() + 1);
    offsets.push(0);
    let mut n: i32 = 0;
    for r in rows {
        pick(r).for_each(|name, value| {
            names.append_value(name);
            values.append_value(redact.header_value(name, value));
            n += 1;
        });
        offsets.push(n);
    }
    let names: ArrayRef = Arc::new(names.finish());
    let values: ArrayRef = Arc::new(values.finish());
    let structs = StructArray::new(header_struct_fields(), vec![names, values], None);
    let item = Arc::new(Field::new(
        "item",
        DataType::Struct(header_struct_fields()),
        false,
    ));
    Arc::new(ListArray::new(
        item,
        arrow_buffer::OffsetBuffer::new(arrow_buffer::ScalarBuffer::from(offsets)),
        Arc::new(structs),
        None,
    ))
}

/// A nullable `List<Int64>` column.
fn int_list_array(
    rows: &[ExchangeRecord],
    pick: for<'a> fn(&'a ExchangeRecord) -> Option<&'a [i64]>,
) -> ArrayRef {
    let mut b = ListBuilder::new(Int64Builder::new()).with_field(Arc::new(int_item()));
    for r in rows {
        match pick(r) {
            Some(v) => {
                b.values().append_slice(v);
                b.append(true);
            }
            None => b.append(false),
        }
    }
    Arc::new(b.finish())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::tests_support::row;
    use arrow_array::Array;

    /// A row whose every field holds a value no other field of its type holds.
    fn distinct_row() -> ExchangeRecord {
        let mut r = row(7, b"req");
        r.case_name = Some("case".into());
        r.arm = Some("arm".into());
        r.variant = Some("variant".into());
        r.concurrency = Some(3);
        r.repetition = Some(4);
        r.dispatch_index = 11;
        r.worker = 5;
        r.connection_id = Some(12);
        r.connection_reused = true;
        r.connection_retried = false;
        r.started_at_us = 13;
        r.start_offset_us = 14;
        r.scheduled_offset_us = Some(10);
        r.target_rate_per_second = Some(2.5);
        r.request_body_len = 15;
        r.request_body_truncated = true;
        r.status = Some(200);
        r.response_body = bytes::Bytes::from_static(b"resp");
        r.response_body_len = 16;
        r.response_body_truncated = false;
        r.timings = crate::model::Timings {
            connect_us: Some(21),
            tls_us: Some(22),
            tls_resumed: Some(true),
            request_sent_us: Some(23),
            first_byte_us: Some(24),
            first_body_us: Some(25),
            total_us: Some(26),
            downstream_done_us: Some(27),
        };
        r.stream = Some(crate::model::StreamColumns {
            event_count: 31,
            event_offsets_us: vec![32, 33],
            content_offsets_us: vec![34],
            ttft_us: Some(35),
            tpot_us: Some(36),
            output_tokens: Some(37),
            output_tokens_source: "usage",
            prompt_tokens: Some(38),
            cached_prompt_tokens: Some(44),
            done_seen: true,
        });
        r.error_message = Some("message".into());
        r.oracle_mismatch_pointer = Some("/pointer".into());
        r.decisions = Some(39);
        r.prompt_tokens_planned = Some(40);
        r.answer_usage = Some((Some(41), 42));
        r.oracle_passed = Some(true);
        r.session_id = Some("session".into());
        r.turn = Some(6);
        r.cached_prompt_tokens = Some(43);
        r.session_lag_us = Some(45);
        r.oracle_detail = Some("detail".into());
        r
    }

    /// A JSON answer's usage fills the token columns a stream's events fill, with its
    /// source; a stream's own counts win over it, and a row with neither has nulls.
    #[test]
    fn a_json_answers_usage_is_its_token_count() {
        let schema = exchange_schema();
        let mut json = row(1, b"req");
        json.answer_usage = Some((Some(5), 9));
        let mut no_prompt = row(2, b"req");
        no_prompt.answer_usage = Some((None, 4));
        let stream = distinct_row();
        let neither = row(3, b"req");
        let b = to_batch(
            &[json, no_prompt, stream, neither],
            &Redaction::default(),
            &schema,
        )
        .unwrap();
        let ints = |n: &str| {
            let c = b.column_by_name(n).unwrap();
            let a = c.as_any().downcast_ref::<Int64Array>().unwrap();
            (0..4)
                .map(|i| a.is_valid(i).then(|| a.value(i)))
                .collect::<Vec<_>>()
        };
        assert_eq!(ints("output_tokens"), [Some(9), Some(4), Some(37), None]);
        assert_eq!(ints("prompt_tokens"), [Some(5), None, Some(38), None]);
        let c = b.column_by_name("output_tokens_source").unwrap();
        let src = c.as_any().downcast_ref::<StringArray>().unwrap();
        let src: Vec<Option<&str>> = (0..4)
            .map(|i| src.is_valid(i).then(|| src.value(i)))
            .collect();
        assert_eq!(src, [Some("usage"), Some("usage"), Some("usage"), None]);
    }

    /// Every Int64 column by name, as written. The expected values are written out here,
    /// independently of the table, so an entry whose filler reads another field fails.
    #[test]
    fn every_column_holds_its_own_field() {
        let schema = exchange_schema();
        let b = to_batch(&[distinct_row()], &Redaction::default(), &schema).unwrap();
        let int = |n: &str| {
            let c = b.column_by_name(n).unwrap();
            c.as_any().downcast_ref::<Int64Array>().unwrap().value(0)
        };
        let expected: [(&str, i64); 24] = [
            ("exchange_id", 7),
            ("scheduled_offset_us", 10),
            ("send_lag_us", 4),
            ("dispatch_index", 11),
            ("connection_id", 12),
            ("start_offset_us", 14),
            ("request_body_len", 15),
            ("response_body_len", 16),
            ("connect_us", 21),
            ("tls_us", 22),
            ("request_sent_us", 23),
            ("first_byte_us", 24),
            ("first_body_us", 25),
            ("total_us", 26),
            ("downstream_done_us", 27),
            ("event_count", 31),
            ("ttft_us", 35),
            ("tpot_us", 36),
            ("output_tokens", 37),
            ("prompt_tokens", 38),
            ("decisions", 39),
            ("prompt_tokens_planned", 40),
            ("cached_prompt_tokens", 43),
            ("session_lag_us", 45),
        ];
        let got: Vec<(&str, i64)> = expected.iter().map(|(n, _)| (*n, int(n))).collect();
        assert_eq!(got, expected);
        let text = |n: &str| {
            let c = b.column_by_name(n).unwrap();
            c.as_any()
                .downcast_ref::<StringArray>()
                .unwrap()
                .value(0)
                .to_string()
        };
        assert_eq!(
            [
                "arm",
                "case_name",
                "variant",
                "error_message",
                "oracle_mismatch_pointer",
                "output_tokens_source",
                "url",
                "session_id"
            ]
            .map(text),
            [
                "arm",
                "case",
                "variant",
                "message",
                "/pointer",
                "usage",
                "http://h/x?token=<redacted>&keep=1",
                "session"
            ]
        );
        let int32 = |n: &str| {
            let c = b.column_by_name(n).unwrap();
            c.as_any().downcast_ref::<Int32Array>().unwrap().value(0)
        };
        assert_eq!(
            ["concurrency", "repetition", "worker", "status", "turn"].map(int32),
            [3, 4, 5, 200, 6]
        );
        let flag = |n: &str| {
            let c = b.column_by_name(n).unwrap();
            c.as_any().downcast_ref::<BooleanArray>().unwrap().value(0)
        };
        assert_eq!(
            [
                "connection_reused",
                "connection_retried",
                "request_body_truncated",
                "response_body_truncated",
                "tls_resumed",
                "is_stream",
                "stream_done_seen",
                "oracle_passed"
            ]
            .map(flag),
            [true, false, true, false, true, true, true, true]
        );
        let rate = b.column_by_name("target_rate_per_second").unwrap();
        assert_eq!(
            rate.as_any()
                .downcast_ref::<Float64Array>()
                .unwrap()
                .value(0),
            2.5
        );
    }

    /// Swapping two same-typed entries moves the column in the file (the file changes),
    /// while each name still holds its own values: nothing is matched by position.
    #[test]
    fn swapping_two_same_typed_entries_changes_the_file_not_what_a_name_holds() {
        let rows = [distinct_row()];
        let redact = Redaction::default();
        let mut swapped = COLUMNS;
        let i = swapped.iter().position(|c| c.name == "connect_us").unwrap();
        let j = swapped.iter().position(|c| c.name == "tls_us").unwrap();
        swapped.swap(i, j);
        let original = batch_of(&COLUMNS, &rows, &redact, schema_of(&COLUMNS)).unwrap();
        let other = batch_of(&swapped, &rows, &redact, schema_of(&swapped)).unwrap();
        assert_ne!(
            original.schema(),
            other.schema(),
            "the file's layout changed"
        );
        assert_ne!(original.column(i).as_ref(), other.column(i).as_ref());
        for name in ["connect_us", "tls_us"] {
            assert_eq!(
                original.column_by_name(name).unwrap().as_ref(),
                other.column_by_name(name).unwrap().as_ref(),
                "{name} holds the same values after the swap"
            );
        }
    }

    /// docs/output.md's exchange table lists exactly these columns, in this order, with
    /// these types and these doc lines as their meaning.
    #[test]
    fn docs_list_exactly_these_columns() {
        let doc = include_str!("../../docs/output.md");
        let section = doc
            .split("## exchanges/*.parquet")
            .nth(1)
            .and_then(|s| s.split("\n## ").next())
            .expect("docs/output.md has an exchanges/*.parquet section");
        let documented: Vec<(String, String, String)> = section
            .lines()
            .filter(|l| l.starts_with("| `"))
            .map(|l| {
                let cells: Vec<&str> = l.split(" | ").collect();
                (
                    cells[0]
                        .trim_start_matches("| ")
                        .trim_matches('`')
                        .to_string(),
                    cells[1].to_string(),
                    cells[2..].join(" | ").trim_end_matches(" |").to_string(),
                )
            })
            .collect();
        let declared: Vec<(String, String, String)> = COLUMNS
            .iter()
            .map(|c| (c.name.to_string(), c.doc_type(), c.doc.to_string()))
            .collect();
        assert_eq!(documented, declared);
    }

    #[test]
    fn every_column_has_a_doc_line_and_a_known_unit() {
        for c in &COLUMNS {
            assert!(!c.doc.is_empty(), "{} has no doc line", c.name);
            assert!(
                ["", "us", "bytes", "utc"].contains(&c.unit),
                "{}: unit {:?}",
                c.name,
                c.unit
            );
            assert_eq!(
                c.name.ends_with("_us"),
                c.unit == "us",
                "{}: a *_us name and the us unit go together",
                c.name
            );
        }
        assert!(
            COLUMNS
                .iter()
                .all(|c| c.field().is_nullable() == c.nullable)
        );
        let array = COLUMNS[0].array(&[distinct_row()], &Redaction::default());
        assert_eq!(array.len(), 1);
    }
}
