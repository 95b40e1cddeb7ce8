//! The recorder: exchange rows to rolling, zstd-compressed Parquet part files.
//!
//! Drivers hand finished [`ExchangeRecord`]s to [`Recorder::submit`] after the exchange
//! has ended, so recording never stalls a response in flight. Rows cross a bounded queue
//! (a semaphore of free slots in front of a channel) to a dedicated OS thread, which owns
//! all Arrow conversion, redaction, compression and fsync; nothing here runs on the async
//! runtime. The thread polls its queue on a short tick instead of blocking in it, so a
//! submit never pays for waking it. A full queue applies back-pressure (`submit`, the one
//! policy replay uses) or drops and counts the row (`try_submit`, serve's opt-in).
//!
//! Part files are written as `.part-NNNNN.parquet.inprogress` (a name no reader globs),
//! then finished, fsynced, renamed to `part-NNNNN.parquet`, and the directory fsynced.
//! A crash loses at most the open part; a clean stop loses nothing. Secrets are replaced
//! by `<redacted>` while the row is converted, so they exist only in memory.

use std::fs::{self, File};
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use arrow_array::builder::{
    BinaryBuilder, BooleanBuilder, Int32Builder, Int64Builder, StringBuilder,
    TimestampMicrosecondBuilder,
};
use arrow_array::{ArrayRef, BinaryArray, ListArray, RecordBatch, StringArray, StructArray};
use arrow_schema::{DataType, Field, Fields, Schema, SchemaRef, TimeUnit};
use bytes::Bytes;
use http::{HeaderMap, HeaderName};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::schema::types::ColumnPath;
use tokio::sync::Semaphore;

use crate::clock;

/// Version of the exchange schema, stored in each file's key-value metadata.
pub const SCHEMA_VERSION: &str = "1";
pub const REDACTED: &[u8] = b"<redacted>";

/// Headers whose values never reach disk (and that a plan may not carry, since the plan
/// is copied into every run directory).
pub const DEFAULT_REDACT_HEADERS: &[&str] = &[
    "authorization",
    "proxy-authorization",
    "cookie",
    "set-cookie",
    "x-api-key",
    "api-key",
];
/// Query parameters whose values never reach disk.
pub const DEFAULT_REDACT_QUERY: &[&str] = &["api_key", "apikey", "key", "token", "access_token"];

/// The only values of the `phase` column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Phase {
    Health,
    Readiness,
    Warmup,
    Feasibility,
    Measured,
    Live,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Health => "health",
            Phase::Readiness => "readiness",
            Phase::Warmup => "warmup",
            Phase::Feasibility => "feasibility",
            Phase::Measured => "measured",
            Phase::Live => "live",
        }
    }
}

/// The only values of the `outcome` column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum Outcome {
    #[default]
    Ok,
    /// Status other than the expected one.
    Http,
    /// Oracle mismatch.
    Correctness,
    /// The plan's deadline cancelled the exchange.
    Timeout,
    /// Connect, reset, malformed or cut response.
    Transport,
    /// serve: the client went away.
    ClientAborted,
    /// serve: cut at the end of the shutdown grace period.
    ShutdownCut,
}

impl Outcome {
    pub const ALL: [Outcome; 7] = [
        Outcome::Ok,
        Outcome::Http,
        Outcome::Correctness,
        Outcome::Timeout,
        Outcome::Transport,
        Outcome::ClientAborted,
        Outcome::ShutdownCut,
    ];
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Http => "http",
            Outcome::Correctness => "correctness",
            Outcome::Timeout => "timeout",
            Outcome::Transport => "transport",
            Outcome::ClientAborted => "client_aborted",
            Outcome::ShutdownCut => "shutdown_cut",
        }
    }
}

/// A global byte budget for recorded bodies held in memory (serve's `--record-memory`).
#[derive(Debug)]
pub struct MemoryBudget {
    remaining: AtomicI64,
}

impl MemoryBudget {
    pub fn new(bytes: usize) -> Arc<MemoryBudget> {
        Arc::new(MemoryBudget {
            remaining: AtomicI64::new(i64::try_from(bytes).unwrap_or(i64::MAX)),
        })
    }

    /// Take up to `want` bytes; returns what was granted (0 when the budget is spent).
    pub fn take(&self, want: usize) -> usize {
        let want = i64::try_from(want).unwrap_or(i64::MAX);
        let mut cur = self.remaining.load(Ordering::Relaxed);
        loop {
            let grant = want.min(cur.max(0));
            if grant == 0 {
                return 0;
            }
            match self.remaining.compare_exchange_weak(
                cur,
                cur - grant,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return grant as usize,
                Err(actual) => cur = actual,
            }
        }
    }

    pub fn give_back(&self, bytes: usize) {
        self.remaining
            .fetch_add(i64::try_from(bytes).unwrap_or(0), Ordering::Relaxed);
    }

    pub fn remaining(&self) -> i64 {
        self.remaining.load(Ordering::Relaxed)
    }
}

/// Bytes of a [`MemoryBudget`] held by one row until the writer has encoded it.
#[derive(Debug)]
pub struct BudgetHold {
    budget: Arc<MemoryBudget>,
    bytes: usize,
}

impl BudgetHold {
    pub fn new(budget: Arc<MemoryBudget>, bytes: usize) -> BudgetHold {
        BudgetHold { budget, bytes }
    }

    pub fn add(&mut self, bytes: usize) {
        self.bytes += bytes;
    }
}

impl Drop for BudgetHold {
    fn drop(&mut self) {
        self.budget.give_back(self.bytes);
    }
}

/// The timing columns: microseconds from the exchange's t0 on the monotonic clock.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Timings {
    pub connect_us: Option<i64>,
    pub tls_us: Option<i64>,
    pub tls_resumed: Option<bool>,
    pub request_sent_us: Option<i64>,
    pub first_byte_us: Option<i64>,
    pub first_body_us: Option<i64>,
    pub total_us: Option<i64>,
    /// serve only: last response byte handed to the client.
    pub downstream_done_us: Option<i64>,
}

/// Event-stream columns of a row (SSE responses only).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamColumns {
    pub event_count: i64,
    pub event_offsets_us: Vec<i64>,
    pub content_offsets_us: Vec<i64>,
    pub ttft_us: Option<i64>,
    pub tpot_us: Option<i64>,
    pub output_tokens: Option<i64>,
    pub output_tokens_source: &'static str,
    pub prompt_tokens: Option<i64>,
}

/// One exchange, as a row of `exchanges/*.parquet`.
#[derive(Debug)]
pub struct ExchangeRecord {
    pub run_id: Arc<str>,
    pub exchange_id: i64,
    pub phase: Phase,
    pub case_name: Option<Arc<str>>,
    pub variant: Option<Arc<str>>,
    pub concurrency: Option<i32>,
    pub repetition: Option<i32>,
    pub dispatch_index: i64,
    pub worker: i32,
    pub connection_id: Option<i64>,
    pub connection_reused: bool,
    pub connection_retried: bool,
    /// Wall clock, microseconds since the Unix epoch (UTC).
    pub started_at_us: i64,
    pub start_offset_us: i64,
    pub method: http::Method,
    /// Full URL; secret query parameters are redacted when the row is written.
    pub url: Arc<str>,
    /// Secret values are redacted when the row is written.
    pub request_headers: HeaderMap,
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
    /// Recorded bytes held in serve's memory budget, released once the row is encoded.
    pub memory: Option<BudgetHold>,
}

impl ExchangeRecord {
    fn approx_bytes(&self) -> usize {
        512 + self.request_body.len() + self.response_body.len() + self.url.len()
    }
}

/// The Arrow schema of `exchanges/*.parquet` (documented in docs/output.md).
pub fn exchange_schema() -> SchemaRef {
    let header = header_list_type();
    let int_list = DataType::List(Arc::new(Field::new("item", DataType::Int64, false)));
    let ts = DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
    let f = |n: &str, t: DataType, null: bool| Field::new(n, t, null);
    Arc::new(Schema::new(vec![
        f("run_id", DataType::Utf8, false),
        f("exchange_id", DataType::Int64, false),
        f("phase", DataType::Utf8, false),
        f("case_name", DataType::Utf8, true),
        f("variant", DataType::Utf8, true),
        f("concurrency", DataType::Int32, true),
        f("repetition", DataType::Int32, true),
        f("dispatch_index", DataType::Int64, false),
        f("worker", DataType::Int32, false),
        f("connection_id", DataType::Int64, true),
        f("connection_reused", DataType::Boolean, false),
        f("connection_retried", DataType::Boolean, false),
        f("started_at", ts, false),
        f("start_offset_us", DataType::Int64, false),
        f("method", DataType::Utf8, false),
        f("url", DataType::Utf8, false),
        f("request_headers", header.clone(), false),
        f("request_body", DataType::Binary, false),
        f("request_body_len", DataType::Int64, false),
        f("request_body_truncated", DataType::Boolean, false),
        f("status", DataType::Int32, true),
        f("response_headers", header, false),
        f("response_body", DataType::Binary, false),
        f("response_body_len", DataType::Int64, false),
        f("response_body_truncated", DataType::Boolean, false),
        f("connect_us", DataType::Int64, true),
        f("tls_us", DataType::Int64, true),
        f("tls_resumed", DataType::Boolean, true),
        f("request_sent_us", DataType::Int64, true),
        f("first_byte_us", DataType::Int64, true),
        f("first_body_us", DataType::Int64, true),
        f("total_us", DataType::Int64, true),
        f("downstream_done_us", DataType::Int64, true),
        f("is_stream", DataType::Boolean, false),
        f("event_count", DataType::Int64, true),
        f("event_offsets_us", int_list.clone(), true),
        f("content_offsets_us", int_list, true),
        f("ttft_us", DataType::Int64, true),
        f("tpot_us", DataType::Int64, true),
        f("output_tokens", DataType::Int64, true),
        f("output_tokens_source", DataType::Utf8, true),
        f("prompt_tokens", DataType::Int64, true),
        f("outcome", DataType::Utf8, false),
        f("error_message", DataType::Utf8, true),
        f("oracle_mismatch_pointer", DataType::Utf8, true),
    ]))
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

/// Which secrets are redacted, and how.
#[derive(Debug, Clone)]
pub struct Redaction {
    pub headers: Vec<HeaderName>,
    /// Lower-case query parameter names.
    pub query: Vec<String>,
}

impl Default for Redaction {
    fn default() -> Self {
        Redaction {
            headers: DEFAULT_REDACT_HEADERS
                .iter()
                .map(|h| HeaderName::from_static(h))
                .collect(),
            query: DEFAULT_REDACT_QUERY.iter().map(|s| s.to_string()).collect(),
        }
    }
}

impl Redaction {
    /// The URL with the values of secret query parameters replaced by `<redacted>`.
    pub fn url<'a>(&self, url: &'a str) -> std::borrow::Cow<'a, str> {
        let Some((head, query)) = url.split_once('?') else {
            return std::borrow::Cow::Borrowed(url);
        };
        let mut out = String::with_capacity(url.len());
        out.push_str(head);
        out.push('?');
        for (i, pair) in query.split('&').enumerate() {
            if i > 0 {
                out.push('&');
            }
            let name = pair.split_once('=').map_or(pair, |(n, _)| n);
            if pair.contains('=') && self.query.iter().any(|q| q.eq_ignore_ascii_case(name)) {
                out.push_str(name);
                out.push_str("=<redacted>");
            } else {
                out.push_str(pair);
            }
        }
        std::borrow::Cow::Owned(out)
    }

    fn header_value<'a>(&self, name: &HeaderName, value: &'a [u8]) -> &'a [u8] {
        if self.headers.contains(name) {
            REDACTED
        } else {
            value
        }
    }
}

fn headers_array(rows: &[ExchangeRecord], redact: &Redaction, response: bool) -> ArrayRef {
    let mut names = StringBuilder::new();
    let mut values = BinaryBuilder::new();
    let mut offsets: Vec<i32> = Vec::with_capacity(rows.len() + 1);
    offsets.push(0);
    let mut n: i32 = 0;
    for r in rows {
        let map = if response {
            &r.response_headers
        } else {
            &r.request_headers
        };
        for (name, value) in map {
            names.append_value(name.as_str());
            values.append_value(redact.header_value(name, value.as_bytes()));
            n += 1;
        }
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

/// A nullable `List<Int64>` column from each row's stream columns.
fn int_list_array(rows: &[ExchangeRecord], pick: fn(&StreamColumns) -> &Vec<i64>) -> ArrayRef {
    let mut b = arrow_array::builder::ListBuilder::new(Int64Builder::new())
        .with_field(Arc::new(Field::new("item", DataType::Int64, false)));
    for r in rows {
        match &r.stream {
            Some(s) => {
                b.values().append_slice(pick(s));
                b.append(true);
            }
            None => b.append(false),
        }
    }
    Arc::new(b.finish())
}

/// Convert rows to one Arrow batch of [`exchange_schema`], redacting secrets.
pub fn to_batch(
    rows: &[ExchangeRecord],
    redact: &Redaction,
) -> Result<RecordBatch, arrow_schema::ArrowError> {
    macro_rules! col {
        ($b:expr, $f:expr) => {{
            let mut b = $b;
            for r in rows {
                b.append_option($f(r));
            }
            Arc::new(b.finish()) as ArrayRef
        }};
    }
    let run_id: ArrayRef = Arc::new(StringArray::from_iter_values(
        rows.iter().map(|r| &*r.run_id),
    ));
    let phase: ArrayRef = Arc::new(StringArray::from_iter_values(
        rows.iter().map(|r| r.phase.as_str()),
    ));
    let case_name: ArrayRef = Arc::new(StringArray::from_iter(
        rows.iter().map(|r| r.case_name.as_deref()),
    ));
    let variant: ArrayRef = Arc::new(StringArray::from_iter(
        rows.iter().map(|r| r.variant.as_deref()),
    ));
    let method: ArrayRef = Arc::new(StringArray::from_iter_values(
        rows.iter().map(|r| r.method.as_str()),
    ));
    let url: ArrayRef = Arc::new(StringArray::from_iter_values(
        rows.iter().map(|r| redact.url(&r.url)),
    ));
    let request_body: ArrayRef = Arc::new(BinaryArray::from_iter_values(
        rows.iter().map(|r| &r.request_body[..]),
    ));
    let response_body: ArrayRef = Arc::new(BinaryArray::from_iter_values(
        rows.iter().map(|r| &r.response_body[..]),
    ));
    let outcome: ArrayRef = Arc::new(StringArray::from_iter_values(
        rows.iter().map(|r| r.outcome.as_str()),
    ));
    let error_message: ArrayRef = Arc::new(StringArray::from_iter(
        rows.iter().map(|r| r.error_message.as_deref()),
    ));
    let mismatch: ArrayRef = Arc::new(StringArray::from_iter(
        rows.iter().map(|r| r.oracle_mismatch_pointer.as_deref()),
    ));
    let columns: Vec<ArrayRef> = vec![
        run_id,
        col!(Int64Builder::new(), |r: &ExchangeRecord| Some(
            r.exchange_id
        )),
        phase,
        case_name,
        variant,
        col!(Int32Builder::new(), |r: &ExchangeRecord| r.concurrency),
        col!(Int32Builder::new(), |r: &ExchangeRecord| r.repetition),
        col!(Int64Builder::new(), |r: &ExchangeRecord| Some(
            r.dispatch_index
        )),
        col!(Int32Builder::new(), |r: &ExchangeRecord| Some(r.worker)),
        col!(Int64Builder::new(), |r: &ExchangeRecord| r.connection_id),
        col!(BooleanBuilder::new(), |r: &ExchangeRecord| Some(
            r.connection_reused
        )),
        col!(BooleanBuilder::new(), |r: &ExchangeRecord| Some(
            r.connection_retried
        )),
        col!(
            TimestampMicrosecondBuilder::new().with_timezone("UTC"),
            |r: &ExchangeRecord| Some(r.started_at_us)
        ),
        col!(Int64Builder::new(), |r: &ExchangeRecord| Some(
            r.start_offset_us
        )),
        method,
        url,
        headers_array(rows, redact, false),
        request_body,
        col!(Int64Builder::new(), |r: &ExchangeRecord| Some(
            r.request_body_len
        )),
        col!(BooleanBuilder::new(), |r: &ExchangeRecord| Some(
            r.request_body_truncated
        )),
        col!(Int32Builder::new(), |r: &ExchangeRecord| r.status),
        headers_array(rows, redact, true),
        response_body,
        col!(Int64Builder::new(), |r: &ExchangeRecord| Some(
            r.response_body_len
        )),
        col!(BooleanBuilder::new(), |r: &ExchangeRecord| Some(
            r.response_body_truncated
        )),
        col!(Int64Builder::new(), |r: &ExchangeRecord| r
            .timings
            .connect_us),
        col!(Int64Builder::new(), |r: &ExchangeRecord| r.timings.tls_us),
        col!(BooleanBuilder::new(), |r: &ExchangeRecord| r
            .timings
            .tls_resumed),
        col!(Int64Builder::new(), |r: &ExchangeRecord| r
            .timings
            .request_sent_us),
        col!(Int64Builder::new(), |r: &ExchangeRecord| r
            .timings
            .first_byte_us),
        col!(Int64Builder::new(), |r: &ExchangeRecord| r
            .timings
            .first_body_us),
        col!(Int64Builder::new(), |r: &ExchangeRecord| r.timings.total_us),
        col!(Int64Builder::new(), |r: &ExchangeRecord| r
            .timings
            .downstream_done_us),
        col!(BooleanBuilder::new(), |r: &ExchangeRecord| Some(
            r.stream.is_some()
        )),
        col!(Int64Builder::new(), |r: &ExchangeRecord| r
            .stream
            .as_ref()
            .map(|s| s.event_count)),
        int_list_array(rows, |s| &s.event_offsets_us),
        int_list_array(rows, |s| &s.content_offsets_us),
        col!(Int64Builder::new(), |r: &ExchangeRecord| r
            .stream
            .as_ref()
            .and_then(|s| s.ttft_us)),
        col!(Int64Builder::new(), |r: &ExchangeRecord| r
            .stream
            .as_ref()
            .and_then(|s| s.tpot_us)),
        col!(Int64Builder::new(), |r: &ExchangeRecord| r
            .stream
            .as_ref()
            .and_then(|s| s.output_tokens)),
        Arc::new(StringArray::from_iter(
            rows.iter()
                .map(|r| r.stream.as_ref().map(|s| s.output_tokens_source)),
        )),
        col!(Int64Builder::new(), |r: &ExchangeRecord| r
            .stream
            .as_ref()
            .and_then(|s| s.prompt_tokens)),
        outcome,
        error_message,
        mismatch,
    ];
    RecordBatch::try_new(exchange_schema(), columns)
}

/// Where and how parts are written.
#[derive(Debug, Clone)]
pub struct RecorderOptions {
    /// The `exchanges/` directory (must exist).
    pub dir: PathBuf,
    /// Roll to a new part after this many rows.
    pub part_rows: usize,
    /// Roll to a new part when the open one is this old (and has rows).
    pub part_seconds: f64,
    /// Rows queued between the drivers and the writer thread.
    pub queue_rows: usize,
    pub redaction: Redaction,
    /// Extra key-value metadata for every part (run id, ...).
    pub metadata: Vec<(String, String)>,
}

impl RecorderOptions {
    pub fn new(dir: PathBuf) -> RecorderOptions {
        RecorderOptions {
            dir,
            part_rows: 100_000,
            part_seconds: 60.0,
            queue_rows: 4096,
            redaction: Redaction::default(),
            metadata: Vec::new(),
        }
    }
}

/// What the writer did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WriterStats {
    pub rows: u64,
    pub parts: u32,
}

#[derive(Debug, Clone, thiserror::Error)]
#[error("recorder: {0}")]
pub struct RecordError(pub String);

enum Msg {
    Row(Box<ExchangeRecord>),
    /// Finish every part and stop (sent by [`Recorder::finish`]).
    Close,
}

/// Handle to the writer thread. Shared by reference (`&self`) between all tasks.
pub struct Recorder {
    tx: mpsc::Sender<Msg>,
    slots: Arc<Semaphore>,
    dropped: AtomicU64,
    handle: std::sync::Mutex<Option<JoinHandle<Result<WriterStats, RecordError>>>>,
}

/// How long the writer sleeps when its queue is empty.
const POLL_TICK: Duration = Duration::from_millis(2);

/// Rows are converted and handed to Parquet in batches of this many rows or bytes.
const BATCH_ROWS: usize = 1024;
const BATCH_BYTES: usize = 32 << 20;

impl Recorder {
    pub fn start(opts: RecorderOptions) -> io::Result<Recorder> {
        let (tx, rx) = mpsc::channel();
        let slots = Arc::new(Semaphore::new(opts.queue_rows.max(1)));
        let thread_slots = slots.clone();
        let handle = std::thread::Builder::new()
            .name("matrix-recorder".into())
            .spawn(move || {
                let r = writer_loop(opts, rx, &thread_slots);
                // Wake and fail every submitter still waiting for a slot.
                thread_slots.close();
                r
            })?;
        Ok(Recorder {
            tx,
            slots,
            dropped: AtomicU64::new(0),
            handle: std::sync::Mutex::new(Some(handle)),
        })
    }

    /// Queue a finished exchange, waiting for a free slot (back-pressure). Fails only when
    /// the writer has stopped on an error (see [`Recorder::finish`] for the reason).
    pub async fn submit(&self, rec: ExchangeRecord) -> Result<(), RecordError> {
        let permit = self
            .slots
            .acquire()
            .await
            .map_err(|_| RecordError("the writer stopped".into()))?;
        permit.forget();
        self.tx
            .send(Msg::Row(Box::new(rec)))
            .map_err(|_| RecordError("the writer stopped".into()))?;
        Ok(())
    }

    /// Queue a finished exchange if a slot is free, without waiting; a full queue hands
    /// the row back (`Ok(Some(row))`) for the caller to [`Recorder::submit`] later.
    pub fn submit_now(&self, rec: ExchangeRecord) -> Result<Option<ExchangeRecord>, RecordError> {
        match self.slots.try_acquire() {
            Ok(permit) => {
                permit.forget();
                self.tx
                    .send(Msg::Row(Box::new(rec)))
                    .map_err(|_| RecordError("the writer stopped".into()))?;
                Ok(None)
            }
            Err(tokio::sync::TryAcquireError::NoPermits) => Ok(Some(rec)),
            Err(tokio::sync::TryAcquireError::Closed) => {
                Err(RecordError("the writer stopped".into()))
            }
        }
    }

    /// Queue a finished exchange only if a slot is free (`--on-record-full drop`).
    /// `Ok(false)`: the queue was full and the row was dropped (and counted).
    pub fn try_submit(&self, rec: ExchangeRecord) -> Result<bool, RecordError> {
        match self.submit_now(rec)? {
            None => Ok(true),
            Some(_dropped) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                Ok(false)
            }
        }
    }

    /// Rows dropped by [`Recorder::try_submit`] because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Close the queue (later submits fail), let the writer write every row already
    /// queued and finish every part, and wait for it. Blocking; call it once.
    pub fn finish(&self) -> Result<WriterStats, RecordError> {
        self.slots.close();
        let _ = self.tx.send(Msg::Close);
        let handle = self.handle.lock().ok().and_then(|mut h| h.take());
        match handle.map(|h| h.join()) {
            Some(Ok(r)) => r,
            Some(Err(_)) => Err(RecordError("the writer thread panicked".into())),
            None => Err(RecordError("recorder already finished".into())),
        }
    }
}

struct OpenPart {
    index: u32,
    writer: ArrowWriter<File>,
    tmp: PathBuf,
    final_path: PathBuf,
    rows: usize,
    opened_ns: u64,
}

/// zstd level of the parts: level 1 compresses recorded JSON nearly as well as the default
/// (3) at a fraction of the CPU, and the writer shares a core with the run.
const ZSTD_LEVEL: i32 = 1;

/// Columns whose values come from a small set, dictionary-encoded (Parquet paths).
const DICTIONARY_COLUMNS: [&[&str]; 10] = [
    &["run_id"],
    &["phase"],
    &["case_name"],
    &["variant"],
    &["method"],
    &["url"],
    &["request_headers", "list", "item", "name"],
    &["response_headers", "list", "item", "name"],
    &["outcome"],
    &["output_tokens_source"],
];

/// Columns written without min/max statistics (Parquet paths).
const NO_STATISTICS_COLUMNS: [&[&str]; 5] = [
    &["request_body"],
    &["response_body"],
    &["request_headers", "list", "item", "value"],
    &["response_headers", "list", "item", "value"],
    &["error_message"],
];

fn writer_props(opts: &RecorderOptions) -> WriterProperties {
    let mut kv = vec![KeyValue::new(
        "matrix_proxy.schema_version".to_string(),
        SCHEMA_VERSION.to_string(),
    )];
    for (k, v) in &opts.metadata {
        kv.push(KeyValue::new(k.clone(), v.clone()));
    }
    // Dictionary encoding costs a hash and a compare per value; it pays only where values
    // repeat from a small set. Everything else (bodies, header values, timings) is left to
    // zstd, which finds the repetition anyway (measured with `cargo bench --bench writer`).
    let mut b = WriterProperties::builder()
        .set_compression(Compression::ZSTD(
            ZstdLevel::try_new(ZSTD_LEVEL).unwrap_or_default(),
        ))
        .set_max_row_group_row_count(Some(64 * 1024))
        .set_max_row_group_bytes(Some(128 << 20))
        .set_dictionary_enabled(false)
        .set_key_value_metadata(Some(kv));
    // Min/max statistics of a body or a header value are of no use to a query and cost a
    // byte comparison per value (measured: the largest single cost of encoding a row).
    for col in NO_STATISTICS_COLUMNS {
        b = b.set_column_statistics_enabled(column_path(col), EnabledStatistics::None);
    }
    for col in DICTIONARY_COLUMNS {
        b = b.set_column_dictionary_enabled(column_path(col), true);
    }
    b.build()
}

fn column_path(parts: &[&str]) -> ColumnPath {
    ColumnPath::new(parts.iter().map(|p| p.to_string()).collect())
}

fn open_part(
    opts: &RecorderOptions,
    index: u32,
    schema: &SchemaRef,
) -> Result<OpenPart, RecordError> {
    let tmp = opts
        .dir
        .join(format!(".part-{index:05}.parquet.inprogress"));
    let final_path = opts.dir.join(format!("part-{index:05}.parquet"));
    let file = File::create(&tmp)
        .map_err(|e| RecordError(format!("{}: cannot create: {e}", tmp.display())))?;
    let writer = ArrowWriter::try_new(file, schema.clone(), Some(writer_props(opts)))
        .map_err(|e| RecordError(format!("{}: {e}", tmp.display())))?;
    Ok(OpenPart {
        index,
        writer,
        tmp,
        final_path,
        rows: 0,
        opened_ns: clock::now_ns(),
    })
}

fn close_part(part: OpenPart, dir: &Path) -> Result<(), RecordError> {
    let ctx = |e: &dyn std::fmt::Display| RecordError(format!("{}: {e}", part.tmp.display()));
    let file = part.writer.into_inner().map_err(|e| ctx(&e))?;
    file.sync_all().map_err(|e| ctx(&e))?;
    drop(file);
    fs::rename(&part.tmp, &part.final_path).map_err(|e| ctx(&e))?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| RecordError(format!("{}: fsync: {e}", dir.display())))?;
    Ok(())
}

fn writer_loop(
    opts: RecorderOptions,
    rx: mpsc::Receiver<Msg>,
    slots: &Semaphore,
) -> Result<WriterStats, RecordError> {
    let schema = exchange_schema();
    let mut stats = WriterStats::default();
    let mut pending: Vec<ExchangeRecord> = Vec::with_capacity(BATCH_ROWS);
    let mut pending_bytes = 0usize;
    let mut part: Option<OpenPart> = None;
    let part_ns = (opts.part_seconds.max(0.001) * 1e9) as u64;
    let mut ledger = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(opts.dir.join(LEDGER))
        .ok();

    let mut flush = |pending: &mut Vec<ExchangeRecord>,
                     pending_bytes: &mut usize,
                     part: &mut Option<OpenPart>,
                     stats: &mut WriterStats|
     -> Result<(), RecordError> {
        if pending.is_empty() {
            return Ok(());
        }
        if part.is_none() {
            *part = Some(open_part(&opts, stats.parts, &schema)?);
            stats.parts += 1;
        }
        let p = part
            .as_mut()
            .ok_or_else(|| RecordError("no open part".into()))?;
        // Never let one part overshoot part_rows: split the batch at the boundary.
        let take = pending.len().min(opts.part_rows.max(1) - p.rows);
        let batch = to_batch(&pending[..take], &opts.redaction)
            .map_err(|e| RecordError(format!("arrow conversion: {e}")))?;
        p.writer
            .write(&batch)
            .map_err(|e| RecordError(format!("{}: {e}", p.tmp.display())))?;
        p.rows += take;
        stats.rows += take as u64;
        // The ledger survives a crash of this process (the page cache outlives it), so
        // `recover` can count what an unfinished part held.
        if let Some(l) = ledger.as_mut() {
            let _ = writeln!(l, "{} {}", p.index, p.rows);
        }
        pending.drain(..take);
        *pending_bytes = pending.iter().map(ExchangeRecord::approx_bytes).sum();
        if p.rows >= opts.part_rows.max(1)
            && let Some(full) = part.take()
        {
            close_part(full, &opts.dir)?;
        }
        Ok(())
    };

    let mut idle = Duration::ZERO;
    let result = (|| -> Result<(), RecordError> {
        loop {
            let wait = match &part {
                Some(p) => {
                    let age = clock::now_ns().saturating_sub(p.opened_ns);
                    Duration::from_nanos(part_ns.saturating_sub(age))
                        .min(Duration::from_millis(500))
                }
                None => Duration::from_millis(500),
            };
            // Poll rather than block: a receiver blocked in the channel turns every send
            // into a futex wake-up and a context switch on the submitting core (measured:
            // over a quarter of serve's CPU time). Rows wait at most one tick here.
            let msg = match rx.try_recv() {
                Ok(m) => {
                    idle = Duration::ZERO;
                    Ok(m)
                }
                Err(mpsc::TryRecvError::Disconnected) => Err(mpsc::RecvTimeoutError::Disconnected),
                Err(mpsc::TryRecvError::Empty) => {
                    std::thread::sleep(POLL_TICK);
                    idle += POLL_TICK;
                    if idle < wait {
                        continue;
                    }
                    idle = Duration::ZERO;
                    Err(mpsc::RecvTimeoutError::Timeout)
                }
            };
            match msg {
                Ok(Msg::Row(rec)) => {
                    slots.add_permits(1);
                    pending_bytes += rec.approx_bytes();
                    pending.push(*rec);
                    // Never hold more rows than would complete the open part, so that
                    // a crash loses at most that part (plus rows still in the queue).
                    let open_rows = part.as_ref().map_or(0, |p| p.rows);
                    let batch_limit = BATCH_ROWS.min(opts.part_rows.max(1) - open_rows).max(1);
                    while pending.len() >= batch_limit || pending_bytes >= BATCH_BYTES {
                        flush(&mut pending, &mut pending_bytes, &mut part, &mut stats)?;
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    // Idle: hand pending rows to the part so the age check sees them.
                    while !pending.is_empty() {
                        flush(&mut pending, &mut pending_bytes, &mut part, &mut stats)?;
                    }
                }
                Ok(Msg::Close) | Err(mpsc::RecvTimeoutError::Disconnected) => {
                    while !pending.is_empty() {
                        flush(&mut pending, &mut pending_bytes, &mut part, &mut stats)?;
                    }
                    if let Some(p) = part.take() {
                        close_part(p, &opts.dir)?;
                    }
                    return Ok(());
                }
            }
            if let Some(p) = &part
                && p.rows > 0
                && clock::now_ns().saturating_sub(p.opened_ns) >= part_ns
            {
                while !pending.is_empty() {
                    flush(&mut pending, &mut pending_bytes, &mut part, &mut stats)?;
                }
                if let Some(p) = part.take() {
                    close_part(p, &opts.dir)?;
                }
            }
        }
    })();
    match result {
        Ok(()) => Ok(stats),
        Err(e) => {
            // Keep what was written: try to close the open part so its rows survive.
            if let Some(p) = part.take() {
                let _ = close_part(p, &opts.dir);
            }
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests_support {
    use super::*;

    pub fn row(i: i64, body: &'static [u8]) -> ExchangeRecord {
        ExchangeRecord {
            run_id: Arc::from("r"),
            exchange_id: i,
            phase: Phase::Live,
            case_name: None,
            variant: None,
            concurrency: None,
            repetition: None,
            dispatch_index: i,
            worker: 0,
            connection_id: None,
            connection_reused: false,
            connection_retried: false,
            started_at_us: 0,
            start_offset_us: 0,
            method: http::Method::GET,
            url: "http://h/x?token=abc&keep=1".into(),
            request_headers: HeaderMap::new(),
            request_body: Bytes::from_static(body),
            request_body_len: body.len() as i64,
            request_body_truncated: false,
            status: Some(200),
            response_headers: HeaderMap::new(),
            response_body: Bytes::new(),
            response_body_len: 0,
            response_body_truncated: false,
            timings: Timings::default(),
            stream: None,
            outcome: Outcome::Ok,
            error_message: None,
            oracle_mismatch_pointer: None,
            memory: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::tests_support::row;
    use super::*;

    #[test]
    fn drop_policy_counts_every_row_it_does_not_keep() {
        let dir = tempfile::tempdir().unwrap();
        let mut opts = RecorderOptions::new(dir.path().to_path_buf());
        opts.queue_rows = 1;
        opts.part_rows = 7_000;
        let rec = Recorder::start(opts).unwrap();
        let n = 50_000;
        let mut kept = 0u64;
        for i in 0..n {
            if rec.try_submit(row(i, b"x")).unwrap() {
                kept += 1;
            }
        }
        let stats = rec.finish().unwrap();
        assert_eq!(stats.rows, kept, "every accepted row is written");
        assert_eq!(
            rec.dropped(),
            n as u64 - kept,
            "every other row is counted as dropped"
        );
        assert!(
            rec.dropped() > 0,
            "a one-row queue under a tight loop must overflow"
        );
        assert_eq!(stats.parts as u64, kept.div_ceil(7_000));
        // After finish, submitting is an error, not a silent loss.
        assert!(rec.try_submit(row(0, b"x")).is_err());
    }

    #[test]
    fn memory_budget_grants_what_is_left_and_holds_release_it() {
        let b = MemoryBudget::new(10);
        assert_eq!(b.take(4), 4);
        assert_eq!(b.take(10), 6);
        assert_eq!(b.take(1), 0);
        let hold = BudgetHold::new(b.clone(), 10);
        drop(hold);
        assert_eq!(b.remaining(), 10);
    }

    #[test]
    fn url_redaction_keeps_other_parameters() {
        let r = Redaction::default();
        assert_eq!(
            r.url("http://h/x?token=abc&keep=1&API_KEY=z"),
            "http://h/x?token=<redacted>&keep=1&API_KEY=<redacted>"
        );
        assert_eq!(r.url("http://h/x"), "http://h/x");
        assert_eq!(r.url("http://h/x?key"), "http://h/x?key");
    }
}

#[cfg(test)]
mod disk_full {
    use super::tests_support::row;
    use super::*;

    #[test]
    fn a_full_disk_is_a_clear_error_not_a_panic_and_submitters_are_told() {
        let dir = tempfile::tempdir().unwrap();
        // /dev/full answers every write with ENOSPC.
        std::os::unix::fs::symlink(
            "/dev/full",
            dir.path().join(".part-00000.parquet.inprogress"),
        )
        .unwrap();
        let mut opts = RecorderOptions::new(dir.path().to_path_buf());
        opts.part_rows = 1_000;
        let rec = Recorder::start(opts).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        // The first part closes at 1,000 rows: its write fails, the writer stops, and
        // submitters are refused from then on instead of queueing forever.
        let refused = rt.block_on(async {
            for i in 0..100_000 {
                if let Err(e) = rec.submit(row(i, b"x")).await {
                    return Some((i, e));
                }
            }
            None
        });
        let (at, _) = refused.expect("submitters learn that the writer stopped");
        assert!(at < 1_000 + 4_096 + 1_024 + 1, "refused only at row {at}");
        let err = rec.finish().unwrap_err();
        assert!(err.0.contains(".part-00000.parquet.inprogress"), "{err}");
        assert!(err.0.contains("No space left on device"), "{err}");
    }
}

/// What the metrics need of one recorded row (read back by `summarize`).
#[derive(Debug, Clone)]
pub struct RowFacts {
    pub phase: String,
    pub case_name: Option<String>,
    pub concurrency: Option<i32>,
    pub repetition: Option<i32>,
    pub exchange_id: i64,
    pub sample: crate::metrics::Sample,
}

/// Read every closed part (`part-*.parquet`) of an `exchanges/` directory, in file order.
/// Left-over `.inprogress` parts are not read (see `recover`).
pub fn read_row_facts(exchanges: &Path) -> Result<Vec<RowFacts>, String> {
    use arrow_array::{Array, BooleanArray, Int32Array, Int64Array};
    let parts = closed_parts(exchanges)?;
    const WANT: [&str; 16] = [
        "phase",
        "case_name",
        "concurrency",
        "repetition",
        "exchange_id",
        "outcome",
        "start_offset_us",
        "total_us",
        "first_byte_us",
        "connect_us",
        "is_stream",
        "ttft_us",
        "tpot_us",
        "output_tokens",
        "prompt_tokens",
        "content_offsets_us",
    ];
    let mut out = Vec::new();
    for part in parts {
        let ctx = |e: &dyn std::fmt::Display| format!("{}: {e}", part.display());
        for batch in read_columns(&part, &WANT)? {
            let b = batch.map_err(|e| ctx(&e))?;
            let col = |n: &str| {
                b.column_by_name(n)
                    .ok_or_else(|| ctx(&format!("no column {n}")))
            };
            macro_rules! typed {
                ($n:expr, $t:ty) => {
                    col($n)?
                        .as_any()
                        .downcast_ref::<$t>()
                        .ok_or_else(|| ctx(&format!("column {} has an unexpected type", $n)))?
                };
            }
            let phase = typed!("phase", StringArray);
            let case = typed!("case_name", StringArray);
            let conc = typed!("concurrency", Int32Array);
            let rep = typed!("repetition", Int32Array);
            let id = typed!("exchange_id", Int64Array);
            let outcome = typed!("outcome", StringArray);
            let start = typed!("start_offset_us", Int64Array);
            let total = typed!("total_us", Int64Array);
            let fb = typed!("first_byte_us", Int64Array);
            let connect = typed!("connect_us", Int64Array);
            let is_stream = typed!("is_stream", BooleanArray);
            let ttft = typed!("ttft_us", Int64Array);
            let tpot = typed!("tpot_us", Int64Array);
            let out_tok = typed!("output_tokens", Int64Array);
            let prompt = typed!("prompt_tokens", Int64Array);
            let content = typed!("content_offsets_us", ListArray);
            let opt = |a: &Int64Array, i: usize| a.is_valid(i).then(|| a.value(i));
            for i in 0..b.num_rows() {
                let outcome = Outcome::ALL
                    .into_iter()
                    .find(|o| o.as_str() == outcome.value(i))
                    .ok_or_else(|| ctx(&format!("unknown outcome {:?}", outcome.value(i))))?;
                let stream = (is_stream.value(i)).then(|| {
                    let offsets: Vec<i64> = if content.is_valid(i) {
                        let v = content.value(i);
                        v.as_any()
                            .downcast_ref::<Int64Array>()
                            .map(|a| a.values().to_vec())
                            .unwrap_or_default()
                    } else {
                        Vec::new()
                    };
                    crate::metrics::StreamSample {
                        ttft_us: opt(ttft, i),
                        tpot_us: opt(tpot, i),
                        output_tokens: opt(out_tok, i),
                        prompt_tokens: opt(prompt, i),
                        gaps_us: offsets.windows(2).map(|w| w[1] - w[0]).collect(),
                    }
                });
                out.push(RowFacts {
                    phase: phase.value(i).to_string(),
                    case_name: case.is_valid(i).then(|| case.value(i).to_string()),
                    concurrency: conc.is_valid(i).then(|| conc.value(i)),
                    repetition: rep.is_valid(i).then(|| rep.value(i)),
                    exchange_id: id.value(i),
                    sample: crate::metrics::Sample {
                        outcome,
                        start_offset_us: start.value(i),
                        total_us: opt(total, i),
                        first_byte_us: opt(fb, i),
                        connect_us: opt(connect, i),
                        stream,
                    },
                });
            }
        }
    }
    Ok(out)
}

/// `total_us` of every successful row in the closed parts of `exchanges/` (serve's
/// end-of-run latency percentiles are computed from what was recorded, so that the
/// proxy holds no per-request state in memory while it runs).
pub fn read_ok_totals(exchanges: &Path) -> Result<Vec<i64>, String> {
    use arrow_array::{Array, Int64Array};
    let mut out = Vec::new();
    for part in closed_parts(exchanges)? {
        let ctx = |e: &dyn std::fmt::Display| format!("{}: {e}", part.display());
        for batch in read_columns(&part, &["outcome", "total_us"])? {
            let b = batch.map_err(|e| ctx(&e))?;
            let outcome = b
                .column_by_name("outcome")
                .and_then(|c| c.as_any().downcast_ref::<StringArray>())
                .ok_or_else(|| ctx(&"column outcome is missing or not a string"))?;
            let total = b
                .column_by_name("total_us")
                .and_then(|c| c.as_any().downcast_ref::<Int64Array>())
                .ok_or_else(|| ctx(&"column total_us is missing or not an int64"))?;
            for i in 0..b.num_rows() {
                if outcome.value(i) == Outcome::Ok.as_str() && total.is_valid(i) {
                    out.push(total.value(i));
                }
            }
        }
    }
    Ok(out)
}

/// The batches of one part, read with only the columns named in `want`.
fn read_columns(
    part: &Path,
    want: &[&str],
) -> Result<parquet::arrow::arrow_reader::ParquetRecordBatchReader, String> {
    use parquet::arrow::ProjectionMask;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    let ctx = |e: &dyn std::fmt::Display| format!("{}: {e}", part.display());
    let f = File::open(part).map_err(|e| ctx(&e))?;
    let builder = ParquetRecordBatchReaderBuilder::try_new(f).map_err(|e| ctx(&e))?;
    let roots = want
        .iter()
        .map(|n| builder.schema().index_of(n).map_err(|e| ctx(&e)))
        .collect::<Result<Vec<usize>, _>>()?;
    let mask = ProjectionMask::roots(builder.parquet_schema(), roots);
    builder.with_projection(mask).build().map_err(|e| ctx(&e))
}

/// The closed parts (`part-*.parquet`) of an `exchanges/` directory, in file order.
fn closed_parts(exchanges: &Path) -> Result<Vec<PathBuf>, String> {
    let mut parts: Vec<PathBuf> = fs::read_dir(exchanges)
        .map_err(|e| format!("{}: {e}", exchanges.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let n = p
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            n.starts_with("part-") && n.ends_with(".parquet")
        })
        .collect();
    parts.sort();
    Ok(parts)
}

/// What `recover` found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recovery {
    /// Left-over `.inprogress` parts moved to `quarantine/`.
    pub quarantined: Vec<PathBuf>,
    /// Rows the ledger says were written into those parts: lost.
    pub rows_lost: u64,
    /// Rows in the closed parts.
    pub rows_kept: u64,
}

/// Quarantine left-over `.inprogress` parts of `run/exchanges` (a Parquet file without
/// its footer cannot be read) and count, from the writer's ledger, the rows they held.
pub fn recover(run: &Path) -> Result<Recovery, String> {
    let ex = run.join("exchanges");
    let mut rec = Recovery::default();
    let ledger = read_ledger(&ex);
    let entries: Vec<PathBuf> = fs::read_dir(&ex)
        .map_err(|e| format!("{}: {e}", ex.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    for p in entries {
        let name = p
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if let Some(idx) = name
            .strip_prefix(".part-")
            .and_then(|s| s.strip_suffix(".parquet.inprogress"))
            .and_then(|s| s.parse::<u32>().ok())
        {
            let q = run.join("quarantine");
            fs::create_dir_all(&q).map_err(|e| format!("{}: {e}", q.display()))?;
            let dest = q.join(&name);
            fs::rename(&p, &dest).map_err(|e| format!("{}: {e}", p.display()))?;
            rec.rows_lost += ledger.get(&idx).copied().unwrap_or(0);
            rec.quarantined.push(dest);
        } else if name.starts_with("part-") && name.ends_with(".parquet") {
            let f = File::open(&p).map_err(|e| format!("{}: {e}", p.display()))?;
            let reader = parquet::file::serialized_reader::SerializedFileReader::new(f)
                .map_err(|e| format!("{}: {e}", p.display()))?;
            rec.rows_kept += parquet::file::reader::FileReader::metadata(&reader)
                .file_metadata()
                .num_rows() as u64;
        }
    }
    Ok(rec)
}

/// The writer's ledger: rows handed to each part so far (last line per part wins).
fn read_ledger(ex: &Path) -> std::collections::BTreeMap<u32, u64> {
    let mut m = std::collections::BTreeMap::new();
    if let Ok(text) = fs::read_to_string(ex.join(LEDGER)) {
        for line in text.lines() {
            let mut it = line.split_whitespace();
            if let (Some(p), Some(r)) = (it.next(), it.next())
                && let (Ok(p), Ok(r)) = (p.parse(), r.parse())
            {
                m.insert(p, r);
            }
        }
    }
    m
}

/// Name of the writer's ledger in `exchanges/` (a dot-file: no reader globs it).
pub const LEDGER: &str = ".ledger";
