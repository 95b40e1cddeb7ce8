//! The recorder: exchange rows to rolling, zstd-compressed Parquet part files, and
//! everything that reads them back.
//!
//! Drivers hand finished [`ExchangeRecord`]s to [`Recorder::submit`] after the exchange
//! has ended, so recording never stalls a response in flight. Rows cross a bounded queue
//! to a dedicated OS thread ([`writer`]), which owns all Arrow conversion, redaction,
//! compression and fsync; nothing here runs on the async runtime. The columns are
//! declared once in [`columns`]; [`encode`] encodes a part a column at a time, in steps
//! the writer can pause between (serve); [`ledger`] counts what each part holds so [`recover`] can
//! say what a crash lost; [`read`] reads closed parts back for the reports; [`rundir`]
//! creates the run directory and writes its JSON files atomically.
//!
//! Part files are written as `.part-NNNNN.parquet.inprogress` (a name no reader globs),
//! then finished, fsynced, renamed to `part-NNNNN.parquet`, and the directory fsynced.
//! A crash loses at most the open part; a clean stop loses nothing. Secrets are replaced
//! by `<redacted>` while the row is converted, so they exist only in memory.
//!
//! Never imports a driver, the engine or the reports: a row is plain data.

pub(crate) mod columns;
mod encode;
pub(crate) mod ledger;
pub(crate) mod read;
pub(crate) mod recover;
pub(crate) mod rundir;
pub(crate) mod writer;

use std::sync::Arc;

use bytes::Bytes;
use http::HeaderMap;

use crate::budget::BudgetHold;
use crate::model::{Outcome, Phase, StreamColumns, Timings};

pub use ledger::LEDGER;
pub(crate) use writer::RecordError;
pub use writer::{Recorder, RecorderOptions};
pub(crate) use writer::{SERVE_SLICE, WriterStats, default_hold_bytes};

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
    /// Recorded bytes held in serve's memory budget, released once the row is encoded.
    pub memory: Option<BudgetHold>,
}

impl ExchangeRecord {
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
    }
}

#[cfg(test)]
pub(crate) mod tests_support {
    use super::*;
    use crate::model::{Outcome, Phase, Timings};
    use bytes::Bytes;
    use http::HeaderMap;
    use std::sync::Arc;

    /// A temporary run directory with its `exchanges/` made: (the run, `exchanges/`).
    pub(crate) fn run_dir() -> (tempfile::TempDir, std::path::PathBuf) {
        let run = tempfile::tempdir().unwrap();
        let ex = run.path().join(rundir::EXCHANGES);
        std::fs::create_dir(&ex).unwrap();
        (run, ex)
    }

    pub(crate) fn row(i: i64, body: &'static [u8]) -> ExchangeRecord {
        ExchangeRecord {
            run_id: Arc::from("r"),
            exchange_id: i,
            phase: Phase::Live,
            arm: None,
            case_name: None,
            variant: None,
            concurrency: None,
            target_rate_per_second: None,
            repetition: None,
            dispatch_index: i,
            worker: 0,
            connection_id: None,
            connection_reused: false,
            connection_retried: false,
            started_at_us: 0,
            start_offset_us: 0,
            scheduled_offset_us: None,
            method: http::Method::GET,
            url: "http://h/x?token=abc&keep=1".into(),
            request_headers: Arc::new(HeaderMap::new()),
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
            decisions: None,
            memory: None,
        }
    }
}
