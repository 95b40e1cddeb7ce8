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
pub(crate) mod gpu;
pub(crate) mod ledger;
pub(crate) mod parts;
pub(crate) mod read;
pub(crate) mod recover;
mod row;
pub(crate) mod rundir;
pub(crate) mod scrapes;
pub(crate) mod writer;

pub use ledger::LEDGER;
pub(crate) use row::SCHEMA_VERSION;
pub use row::{ExchangeRecord, WireHead};
pub(crate) use writer::RecordError;
pub use writer::{Recorder, RecorderOptions};
pub(crate) use writer::{SERVE_SLICE, WriterStats, default_hold_bytes};

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
            response_head: WireHead::default(),
            response_body: Bytes::new(),
            response_body_len: 0,
            response_body_truncated: false,
            timings: Timings::default(),
            stream: None,
            outcome: Outcome::Ok,
            error_message: None,
            oracle_mismatch_pointer: None,
            decisions: None,
            prompt_tokens_planned: None,
            answer_usage: None,
            oracle_passed: None,
            session_id: None,
            turn: None,
            cached_prompt_tokens: None,
            session_lag_us: None,
            oracle_detail: None,
            usage_from_body: false,
            memory: None,
        }
    }
}
