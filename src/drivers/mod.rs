//! The two drivers: `replay` (a frozen plan, closed or open loop) and `serve` (live traffic).
//! They differ in where a request comes from, never in how it is sent, timed or recorded:
//! both go through the engine and hand rows to the recorder. They never import each
//! other; what both need lives here or below.

pub(crate) mod gpu;
pub(crate) mod replay;
pub(crate) mod scrape;
pub(crate) mod serve;
pub(crate) mod shutdown;

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, OnceLock};

use http::{HeaderMap, Method};

use crate::budget::BudgetHold;
use crate::engine::{Captured, CopiedBody};
use crate::model::{AnswerUsage, Outcome, Phase, StreamColumns};
use crate::record::{
    ExchangeRecord, RecordError, Recorder, RecorderOptions, WireHead, WriterStats,
};
use crate::telemetry::Telemetry;

/// What both drivers share for one run: its id, its start on the monotonic clock, the
/// exchange counter, and the recorder with the first error it reported.
pub(crate) struct RunContext {
    pub(crate) run_id: Arc<str>,
    /// The run's start (`clock::now_ns`); `start_offset_us` counts from here.
    pub(crate) run_t0_ns: u64,
    next_exchange: AtomicI64,
    pub(crate) recorder: Arc<Recorder>,
    record_failed: OnceLock<RecordError>,
    /// Live metrics (`--metrics-listen`, replay's progress line), when the command set
    /// them.
    telemetry: OnceLock<Arc<Telemetry>>,
    /// The worker's `/metrics` (`--worker-metrics`), when the command set it.
    scraper: OnceLock<Arc<scrape::Scraper>>,
    /// What a campaign's arms' scrapers gathered, each added as its arm shuts down.
    arm_scrapes: std::sync::Mutex<scrape::Gathered>,
}

/// Where a row belongs in the run (the identifying columns).
#[derive(Debug, Clone)]
pub(crate) struct RowIds {
    /// From [`RunContext::next_exchange_id`], taken when the exchange ended.
    pub(crate) exchange_id: i64,
    pub(crate) phase: Phase,
    /// The campaign arm (`None` outside campaigns).
    pub(crate) arm: Option<Arc<str>>,
    pub(crate) case_name: Option<Arc<str>>,
    pub(crate) variant: Option<Arc<str>>,
    pub(crate) concurrency: Option<i32>,
    /// Open loop: the round's arrival rate.
    pub(crate) target_rate_per_second: Option<f64>,
    pub(crate) repetition: Option<i32>,
    pub(crate) dispatch_index: i64,
    pub(crate) worker: i32,
    /// The plan's `prompt_tokens` for this request (replay).
    pub(crate) prompt_tokens_planned: Option<i64>,
    /// The session this exchange is a turn of (`None` outside sessions and in serve).
    pub(crate) session_id: Option<Arc<str>>,
    /// The turn's index in its session, from 1 (`None` outside sessions and in serve).
    pub(crate) turn: Option<i32>,
    /// A trace's session turn: its session lag (the row's `session_lag_us`).
    pub(crate) session_lag_us: Option<i64>,
}

/// The request as it was sent, and when.
#[derive(Debug)]
pub(crate) struct SentRequest {
    /// Wall clock at t0 (the one wall-clock read per exchange).
    pub(crate) started_at_us: i64,
    pub(crate) start_offset_us: i64,
    /// Open loop: the intended send time on the run's clock.
    pub(crate) scheduled_offset_us: Option<i64>,
    pub(crate) method: Method,
    pub(crate) url: Arc<str>,
    pub(crate) headers: Arc<HeaderMap>,
    pub(crate) body: CopiedBody,
}

/// How the exchange was judged.
#[derive(Debug, Default)]
pub(crate) struct Verdict {
    pub(crate) outcome: Outcome,
    pub(crate) error_message: Option<String>,
    pub(crate) oracle_mismatch_pointer: Option<String>,
    /// Entries of the answer's decisions container, for an exchange judged `ok` by a JSON
    /// oracle; `None` otherwise.
    pub(crate) decisions: Option<u64>,
    /// A JSON answer's `usage` (prompt, completion tokens; cached prompt tokens), where it
    /// was read (replay: every JSON answer with the expected status; serve's rows read it
    /// on the writer thread, `usage_from_body`; a stream's comes from its events): the
    /// row's `output_tokens`, `prompt_tokens` and `cached_prompt_tokens`.
    pub(crate) usage_tokens: Option<AnswerUsage>,
    /// The oracle's judgment, whatever the lane made of it: `Some(false)` for a
    /// performance-fit arm's mismatch that stays `ok`; `None` when nothing was judged.
    pub(crate) oracle_passed: Option<bool>,
    /// Why the oracle judged the answer wrong, `KIND: at POINTER: reason` (every lane);
    /// `None` when it passed or nothing was judged.
    pub(crate) oracle_detail: Option<String>,
}

/// An exchange's cached prompt tokens (its row's `cached_prompt_tokens`): a stream's
/// usage chunk's, else a JSON answer's `usage` as the verdict read it; `None` when the
/// answer reported none.
pub(crate) fn cached_prompt_tokens(
    stream: Option<&StreamColumns>,
    verdict: &Verdict,
) -> Option<i64> {
    match stream {
        Some(s) => s.cached_prompt_tokens,
        None => verdict.usage_tokens.and_then(|u| u.cached_prompt),
    }
}

/// How a run's recording ended: rows written, and every problem (the writer's error, then
/// the first one a submit saw), for the caller to report.
pub(crate) struct RecordingEnd {
    /// What the writer did (all zero when it failed).
    pub(crate) stats: WriterStats,
    pub(crate) problems: Vec<RecordError>,
}

impl RunContext {
    /// Start the recorder for a run.
    pub(crate) fn start(
        run_id: &str,
        run_t0_ns: u64,
        mut opts: RecorderOptions,
    ) -> Result<RunContext, RecordError> {
        opts.metadata = vec![("matrix_proxy.run_id".into(), run_id.to_string())];
        let recorder = Recorder::start(opts)
            .map_err(|e| RecordError(format!("cannot start the writer thread: {e}")))?;
        Ok(RunContext {
            run_id: Arc::from(run_id),
            run_t0_ns,
            next_exchange: AtomicI64::new(0),
            recorder: Arc::new(recorder),
            record_failed: OnceLock::new(),
            telemetry: OnceLock::new(),
            scraper: OnceLock::new(),
            arm_scrapes: std::sync::Mutex::default(),
        })
    }

    /// Count every exchange of this run in `t` from now on (set once, before the drivers
    /// start).
    pub(crate) fn set_telemetry(&self, t: Arc<Telemetry>) {
        let _ = self.telemetry.set(t);
    }

    pub(crate) fn telemetry(&self) -> Option<&Arc<Telemetry>> {
        self.telemetry.get()
    }

    /// Scrape the worker's metrics at the edges of every measured round from now on (set
    /// once, before the drivers start).
    pub(crate) fn set_scraper(&self, s: Arc<scrape::Scraper>) {
        let _ = self.scraper.set(s);
    }

    /// One scrape of the worker's metrics, awaited (bounded by `--scrape-timeout`), when
    /// the run scrapes.
    pub(crate) async fn scrape(&self, cause: scrape::Cause) {
        if let Some(s) = self.scraper.get() {
            s.scrape(cause).await;
        }
    }

    /// Keep what an arm's scraper gathered (its arm shut down).
    pub(crate) fn add_arm_scrapes(&self, g: scrape::Gathered) {
        if let Ok(mut all) = self.arm_scrapes.lock() {
            all.merge(g);
        }
    }

    /// Every arm's scrapes, taken out.
    pub(crate) fn take_arm_scrapes(&self) -> scrape::Gathered {
        self.arm_scrapes
            .lock()
            .map(|mut g| std::mem::take(&mut *g))
            .unwrap_or_default()
    }

    /// Count an ended exchange in the live metrics, when the run has them: both drivers'
    /// one place (`route` from [`Telemetry::route_id`], looked up once per request).
    pub(crate) fn observe(
        &self,
        route: impl FnOnce(&Telemetry) -> usize,
        got: &Captured,
        outcome: Outcome,
    ) {
        let Some(t) = self.telemetry() else {
            return;
        };
        t.observe(&crate::telemetry::Observed {
            route: route(t),
            status: got.status,
            outcome,
            total_us: got.timings.total_us,
            ttft_us: got.stream.as_ref().and_then(|s| s.ttft_us),
            content_offsets_us: got.stream.as_ref().map_or(&[], |s| &s.content_offsets_us),
        });
    }

    /// Keep the first recording error a driver saw (a submit refused by a stopped writer).
    pub(crate) fn record_failed(&self, e: RecordError) {
        let _ = self.record_failed.set(e);
    }

    pub(crate) fn record_error(&self) -> Option<RecordError> {
        self.record_failed.get().cloned()
    }

    /// The next exchange id: unique within the run, from 0, taken by each driver when an
    /// exchange has ended (so ids follow the order of completion).
    pub(crate) fn next_exchange_id(&self) -> i64 {
        self.next_exchange.fetch_add(1, Ordering::Relaxed)
    }

    /// The one row constructor of both drivers: the ids, the request as sent, what the
    /// engine captured, and the verdict. The two bodies' holds on serve's memory budget
    /// become the row's.
    pub(crate) fn row(
        &self,
        ids: RowIds,
        request: SentRequest,
        got: Captured,
        verdict: Verdict,
    ) -> ExchangeRecord {
        let got_stream_is_none = got.stream.is_none();
        let cached_prompt_tokens = cached_prompt_tokens(got.stream.as_ref(), &verdict);
        ExchangeRecord {
            run_id: self.run_id.clone(),
            exchange_id: ids.exchange_id,
            phase: ids.phase,
            arm: ids.arm,
            case_name: ids.case_name,
            variant: ids.variant,
            concurrency: ids.concurrency,
            target_rate_per_second: ids.target_rate_per_second,
            repetition: ids.repetition,
            dispatch_index: ids.dispatch_index,
            worker: ids.worker,
            connection_id: got.connection_id,
            connection_reused: got.connection_reused,
            connection_retried: got.connection_retried,
            started_at_us: request.started_at_us,
            start_offset_us: request.start_offset_us,
            scheduled_offset_us: request.scheduled_offset_us,
            method: request.method,
            url: request.url,
            request_headers: request.headers,
            request_body_len: request.body.len as i64,
            request_body_truncated: request.body.truncated,
            request_body: request.body.bytes,
            status: got.status,
            response_head: WireHead::new(got.response_head),
            response_body_len: got.body.len as i64,
            response_body_truncated: got.body.truncated,
            response_body: got.body.bytes,
            timings: got.timings,
            stream: got.stream,
            outcome: verdict.outcome,
            error_message: verdict.error_message,
            oracle_mismatch_pointer: verdict.oracle_mismatch_pointer,
            decisions: verdict.decisions.map(|d| d as i64),
            prompt_tokens_planned: ids.prompt_tokens_planned,
            answer_usage: verdict
                .usage_tokens
                .map(|u| u.tokens)
                .filter(|_| got_stream_is_none),
            session_id: ids.session_id,
            turn: ids.turn,
            session_lag_us: ids.session_lag_us,
            oracle_detail: verdict.oracle_detail,
            cached_prompt_tokens,
            usage_from_body: false,
            oracle_passed: verdict.oracle_passed,
            memory: BudgetHold::merge(request.body.hold, got.body.hold),
        }
    }

    /// Close the recorder's queue, let the writer finish every part (off the runtime's
    /// threads), and gather what went wrong.
    pub(crate) async fn finish_recording(&self) -> RecordingEnd {
        let recorder = self.recorder.clone();
        let writer = tokio::task::spawn_blocking(move || recorder.finish()).await;
        let mut problems = Vec::new();
        let stats = match writer {
            Ok(Ok(stats)) => stats,
            Ok(Err(e)) => {
                problems.push(e);
                WriterStats::default()
            }
            Err(e) => {
                problems.push(RecordError(format!("writer join: {e}")));
                WriterStats::default()
            }
        };
        problems.extend(self.record_error());
        RecordingEnd { stats, problems }
    }
}
