//! One exchange of a replay: the request built from the validated plan, sent through the
//! engine under the plan's deadline, judged (status, stream, oracle), and recorded.
//!
//! # The life of a replayed exchange
//!
//! 1. Before the first exchange, each arm's context freezes every request of the plan once
//!    (`ctx::freeze`): `Host`, body, `Content-Type`,
//!    `Content-Length`, case headers, bearer token, `Connection: close` under `fresh`,
//!    serialised to bytes (`engine::lean::LeanRequest`) beside the header map its rows record.
//!    Per exchange the driver reads the wall clock once (`started_at`).
//! 2. `Capture::start` stamps t0. `Engine::exchange_lean` (the lean client: its connection
//!    slot, keep-alive rule and one retry are `engine/lean.rs`'s `//!`) writes the frozen
//!    bytes with one call and reads the response into the connection's one reused buffer
//!    (`http1::codec` frames it). Every replay request takes this path. Serve's requests go
//!    through the same lean client another way: `Engine::lean_send` writes the head, then
//!    `engine/upstream.rs` streams the rest of the body up and reads the response back
//!    (`drivers/serve`'s `//!`).
//! 3. `TimedIo`, wrapped around the stream above TLS, stores the time of each write and of the
//!    first read into atomics; after the head arrives they become `request_sent_us` and
//!    `first_byte_us`. Each read's bytes go to the capture as they arrive, stamped when the
//!    read returned (`first_body_us`, `total_us`); for `text/event-stream` answers they also
//!    go through the capture's `SseParser`, which stamps every event with that read's time.
//! 4. The whole exchange runs under `tokio::time::timeout(timeout_seconds)`. The `Capture`
//!    lives outside the cancelled future, so a timed-out exchange keeps its partial bytes and
//!    stamps.
//! 5. The driver judges status, stream and body ([`judge`]: a stream is complete by
//!    its framing; the oracle parses the body once and reads the answer's decisions and `usage` from that parse), takes
//!    the exchange id (`RunContext::next_exchange_id`, when the exchange has been judged, so
//!    ids follow completion closely and the metrics can break ties by them even under
//!    `--no-record`), turns the capture into `Captured`, builds
//!    the row with `RunContext::row` (the one row constructor of both
//!    drivers; the response head is its bytes as read; the request's headers are shared (`Arc`): replay's
//!    rows of one frozen request all point at one map, serve's is the one clone made before
//!    sending; bodies are `Bytes`, the request body is shared, not copied) and
//!    submits it after the exchange has ended. A measured wave's worker gathers its rows
//!    ([`Rows`]) and hands them to the recorder 64 at a time
//!    (`Recorder::submit_many`: one wait for queue slots and one message per batch, not per
//!    row); the sequential phases and serve hand each row over at once.
//! 6. The recorder's thread redacts secrets and encodes the rows a column at a time
//!    (`record/encode.rs`); during a measured round it only takes them off the queue and
//!    encodes them after the round (`Recorder::hold`, `record/writer.rs`), so the round's
//!    requests do not share a core with the encoding of their own rows.

use super::ctx::{Ctx, Dispatch, Frozen, Slot};
use crate::clock;
use crate::config::plan::OnFailure;
use crate::drivers::{RowIds, SentRequest, Verdict};
use crate::engine::{BodyCopy, Capture, Captured, ExchangeError};
use crate::metrics::{Sample, StreamSample};
use crate::model::{AnswerUsage, Outcome};
use crate::oracle::Oracle;
use crate::record::ExchangeRecord;

/// Finished rows on their way to the recorder, handed over `batch` at a time: a measured
/// wave's worker gathers [`WAVE_ROW_BATCH`], so the queue is crossed once per batch, not
/// once per exchange; the sequential phases hand each row over at once.
pub(super) struct Rows {
    rows: Vec<ExchangeRecord>,
    batch: usize,
}

/// Rows a wave's worker gathers before handing them to the recorder (and at most what a
/// SIGKILL loses from each worker, besides the recorder's own queue).
pub(super) const WAVE_ROW_BATCH: usize = 64;

impl Rows {
    pub(super) fn new(batch: usize) -> Rows {
        Rows {
            rows: Vec::new(),
            batch: batch.max(1),
        }
    }

    async fn push(&mut self, ctx: &Ctx, row: ExchangeRecord) {
        if self.batch == 1 {
            if let Err(e) = ctx.base.run.recorder.submit(row).await {
                ctx.base.run.record_failed(e);
                ctx.halt();
            }
            return;
        }
        if self.rows.capacity() == 0 {
            self.rows.reserve_exact(self.batch);
        }
        self.rows.push(row);
        if self.rows.len() >= self.batch {
            self.flush(ctx).await;
        }
    }

    /// Hand every gathered row to the recorder (a stopped writer stops every arm).
    pub(super) async fn flush(&mut self, ctx: &Ctx) {
        if self.rows.is_empty() {
            return;
        }
        let rows = std::mem::take(&mut self.rows);
        if let Err(e) = ctx.base.run.recorder.submit_many(rows).await {
            ctx.base.run.record_failed(e);
            ctx.halt();
        }
    }
}

/// How a sent exchange ended, before it is judged: cut by the stop (`None`), past the
/// plan's deadline (`Some(Err(_))`), or the engine's own end.
type Ended = Option<Result<Result<(), ExchangeError>, tokio::time::error::Elapsed>>;

/// Run, judge and record one exchange (its row goes to `rows`). Returns what the
/// metrics need.
pub(super) async fn exchange(ctx: &Ctx, slot: &mut Slot, d: Dispatch, rows: &mut Rows) -> Sample {
    // A trace's synthetic entry: its request is made now, from its case's template.
    let made = d
        .synthetic
        .zip(d.case)
        .and_then(|(e, ci)| ctx.synthetic_request(ci, e));
    exchange_as(ctx, slot, d, made, rows, false).await.0
}

/// [`exchange`] of `made` (a request made at send time, e.g. a session's turn with its
/// history) in place of the plan's frozen request; with `keep_answer`, the assistant
/// message the answer carries (or why it carries none) beside the sample, for a live
/// session's next turn.
pub(super) async fn exchange_as(
    ctx: &Ctx,
    slot: &mut Slot,
    d: Dispatch,
    made: Option<Frozen>,
    rows: &mut Rows,
    keep_answer: bool,
) -> (Sample, Option<Result<serde_json::Value, NoAnswer>>) {
    let frozen = match (&made, d.case) {
        (Some(f), _) => f,
        (None, None) => &ctx.frozen[0][0],
        (None, Some(ci)) => &ctx.frozen[ci + 1][d.variant],
    };
    let ep = match d.case {
        None => &ctx.plan.health_endpoint,
        Some(ci) => &ctx.plan.cases[ci].endpoint,
    };
    // The wall clock is read for the row only.
    let started_at_us = ctx.base.record_exchanges.then(clock::wall_now_us);
    let in_flight = ctx.base.run.telemetry().map(|t| t.begin());
    let mut cap = Capture::start(ctx.base.max_record_body, None);
    let start_offset_us = clock::us_between(ctx.base.run.run_t0_ns, cap.t0_ns());
    let policy = ctx.plan.connection;
    let mut cut = ctx.base.cut.clone();
    let result: Ended = tokio::select! {
        r = tokio::time::timeout(
            ctx.plan.timeout,
            ctx.base.engine.exchange_lean(slot, ep, policy, &frozen.lean, &mut cap),
        ) => Some(r),
        _ = cut.wait_for(|c| *c) => None,
    };
    cap.finish_at_end();
    let incomplete = match result {
        Some(Ok(Ok(()))) => cap.stream_incomplete(),
        _ => None,
    };
    let got = cap.into_captured();
    let verdict = verdict_of(ctx, slot, &d, result, &got, incomplete);
    let outcome = verdict.outcome;
    drop(in_flight);
    ctx.base.run.observe(|_| ctx.route(d.case), &got, outcome);
    let exchange_id = ctx.base.run.next_exchange_id();
    let sample = sample_of(&d, exchange_id, start_offset_us, &got, &verdict);
    let answer = keep_answer.then(|| answer_of(ctx, &got, outcome));
    // A failure stops dispatch before anything else happens (recording may wait); a
    // search's probes go on: a failed request is a sample above every bound.
    if outcome != Outcome::Ok && ctx.plan.on_failure == OnFailure::Stop && !ctx.probing(d.phase) {
        ctx.stop();
    }
    if ctx.base.record_exchanges {
        let ids = row_ids(ctx, &d, exchange_id);
        let started = Started {
            at_us: started_at_us.unwrap_or_default(),
            offset_us: start_offset_us,
        };
        let request = sent_request(ctx, &d, frozen, started);
        rows.push(ctx, ctx.base.run.row(ids, request, got, verdict))
            .await;
    }
    if outcome != Outcome::Ok {
        note_failure(ctx, &d, outcome, sample.failure.as_deref());
    }
    (sample, answer)
}

/// The assistant message of an answer, for a live session's history: `Err` says why
/// there is none (a failed exchange, a body cut at `--max-record-body`, no message).
fn answer_of(ctx: &Ctx, got: &Captured, outcome: Outcome) -> Result<serde_json::Value, NoAnswer> {
    if outcome != Outcome::Ok {
        return Err(NoAnswer::Ended(outcome));
    }
    if got.body.truncated {
        return Err(NoAnswer::Truncated {
            len: got.body.len,
            limit: ctx.base.max_record_body,
        });
    }
    Ok(crate::oracle::answer::of_body(
        &got.body.bytes,
        got.stream.is_some(),
    )?)
}

/// Why an answer gives a live session's history nothing to carry.
#[derive(Debug, thiserror::Error)]
pub(super) enum NoAnswer {
    #[error("the turn ended {}", .0.as_str())]
    Ended(Outcome),
    #[error(
        "its answer of {len} bytes is larger than --max-record-body ({limit} bytes); raise the limit"
    )]
    Truncated { len: u64, limit: usize },
    #[error(transparent)]
    Message(#[from] crate::oracle::answer::NoMessage),
}

/// The verdict on an exchange that ended as `result` says (a cut or timed-out one's
/// connection is not kept).
fn verdict_of(
    ctx: &Ctx,
    slot: &mut Slot,
    d: &Dispatch,
    result: Ended,
    got: &Captured,
    incomplete: Option<String>,
) -> Verdict {
    match result {
        None => {
            *slot = None;
            Verdict {
                outcome: Outcome::ShutdownCut,
                error_message: Some(format!(
                    "cut by Ctrl-C / SIGTERM: the exchange was still in flight {} s after it (--grace-seconds)",
                    ctx.base.grace.as_secs_f64()
                )),
                ..Verdict::default()
            }
        }
        Some(Err(_)) => {
            *slot = None;
            Verdict {
                outcome: Outcome::Timeout,
                error_message: Some(format!(
                    "deadline of {} s (timeout_seconds) passed before the exchange ended",
                    ctx.plan.timeout_seconds
                )),
                ..Verdict::default()
            }
        }
        Some(Ok(Err(e))) => Verdict {
            outcome: e.outcome(),
            error_message: Some(e.message),
            ..Verdict::default()
        },
        Some(Ok(Ok(()))) => judge(ctx, d, got, incomplete),
    }
}

/// What the metrics need of an exchange judged `verdict`.
fn sample_of(
    d: &Dispatch,
    exchange_id: i64,
    start_offset_us: i64,
    got: &Captured,
    verdict: &Verdict,
) -> Sample {
    let outcome = verdict.outcome;
    Sample {
        exchange_id,
        decisions: verdict.decisions,
        usage_tokens: verdict.usage_tokens.map(|u| u.tokens),
        cached_prompt_tokens: crate::drivers::cached_prompt_tokens(got.stream.as_ref(), verdict),
        turn: d.turn.map(|t| t.turn + 1),
        session_lag_us: d.turn.and_then(|t| t.lag_us),
        failure: (outcome != Outcome::Ok)
            .then(|| verdict.error_message.clone())
            .flatten(),
        outcome,
        start_offset_us,
        total_us: got.timings.total_us,
        first_byte_us: got.timings.first_byte_us,
        connect_us: got.timings.connect_us,
        stream: got.stream.as_ref().map(StreamSample::from_columns),
        scheduled_offset_us: d.scheduled_offset_us,
    }
}

/// When an exchange started: the wall clock (for the row) and the run's clock.
struct Started {
    at_us: i64,
    offset_us: i64,
}

/// The frozen request as its row records it.
fn sent_request(ctx: &Ctx, d: &Dispatch, frozen: &Frozen, started: Started) -> SentRequest {
    SentRequest {
        started_at_us: started.at_us,
        start_offset_us: started.offset_us,
        scheduled_offset_us: d.scheduled_offset_us,
        method: frozen.lean.method.clone(),
        url: ctx.urls[d.case.map_or(0, |c| c + 1)].clone(),
        headers: frozen.headers.clone(),
        body: BodyCopy::of_whole(&frozen.body, ctx.base.max_record_body),
    }
}

/// Where a replayed exchange sits in the plan, as its row says.
fn row_ids(ctx: &Ctx, d: &Dispatch, exchange_id: i64) -> RowIds {
    let (case_name, variant) = match d.case {
        None => (None, None),
        Some(ci) => (
            Some(ctx.case_names[ci].clone()),
            ctx.variant_names[ci][d.variant].clone(),
        ),
    };
    RowIds {
        exchange_id,
        phase: d.phase,
        arm: ctx.arm.clone(),
        case_name,
        variant,
        concurrency: d.concurrency,
        target_rate_per_second: d.rate,
        repetition: d.repetition,
        dispatch_index: d.dispatch_index,
        worker: d.worker,
        prompt_tokens_planned: match (d.synthetic, &ctx.synthetic) {
            (Some(e), Some(s)) => s.input_tokens(e),
            _ => d
                .case
                .and_then(|ci| ctx.plan.cases[ci].variants[d.variant].prompt_tokens),
        }
        .map(|n| n as i64),
        session_id: d.turn.zip(d.case).and_then(|(t, ci)| {
            let s = ctx.plan.cases[ci].sessions.as_ref()?;
            Some(s.list.get(t.session as usize)?.id_arc.clone())
        }),
        turn: d.turn.map(|t| i32::from(t.turn) + 1),
        session_lag_us: d.turn.and_then(|t| t.lag_us),
    }
}

/// Count a failure, show it on the progress bar, and keep the first one's line (where,
/// outcome, and its message) for the end of the run.
fn note_failure(ctx: &Ctx, d: &Dispatch, outcome: Outcome, message: Option<&str>) {
    if ctx.base.first_failure.get().is_none() {
        let mut at = d.phase.as_str().to_string();
        if let Some(ci) = d.case {
            at.push_str(&format!(" case '{}'", ctx.case_names[ci]));
            if let Some(v) = &ctx.variant_names[ci][d.variant] {
                at.push_str(&format!(" variant '{v}'"));
            }
        }
        let _ = ctx.base.first_failure.set(format!(
            "{at} -> {}: {}",
            outcome.as_str(),
            message.unwrap_or("(no message)")
        ));
    }
    let f = ctx
        .base
        .failures
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        + 1;
    ctx.base.progress.println(format!(
        "failure {f}: {} {} -> {}",
        d.phase.as_str(),
        d.case
            .map(|c| ctx.plan.cases[c].name.as_str())
            .unwrap_or("health"),
        outcome.as_str()
    ));
}

/// Judge an exchange that ended cleanly: a complete stream (`incomplete` says why not),
/// the expected status, then the oracle over the whole body (a truncated body cannot be
/// judged).
fn judge(ctx: &Ctx, d: &Dispatch, got: &Captured, incomplete: Option<String>) -> Verdict {
    let (expected_status, oracle) = match d.case {
        None => (200, None),
        Some(ci) => {
            let case = &ctx.plan.cases[ci];
            (case.expected_status, Some(&case.variants[d.variant].oracle))
        }
    };
    let failed = |outcome, message: String| Verdict {
        outcome,
        error_message: Some(message),
        ..Verdict::default()
    };
    let status = got.status.unwrap_or(0);
    if let Some(why) = incomplete {
        return failed(Outcome::Transport, why);
    }
    if status != i32::from(expected_status) {
        // The URL as the row records it (secret query values redacted): a 404 or 405 is
        // most often a wrong path.
        let url = crate::redact::Redaction::default()
            .url(&ctx.urls[d.case.map_or(0, |c| c + 1)])
            .into_owned();
        let mut message = format!("status {status} from {url}, expected {expected_status}");
        if let Some(said) = crate::oracle::answer_reason(&got.body.bytes) {
            message.push_str(&format!("; the answer says {said}"));
        }
        return failed(Outcome::Http, message);
    }
    match oracle {
        None | Some(Oracle::Unjudged) => Verdict {
            usage_tokens: usage_here(got),
            ..Verdict::default()
        },
        Some(o) => judged_by(ctx, o, got),
    }
}

/// Every JSON answer's usage becomes its row's output_tokens / prompt_tokens (a stream's
/// comes from its events): a JSON oracle reads it from its own parse, any other answer is
/// read here, once, by a parse that builds nothing but the usage.
fn usage_here(got: &Captured) -> Option<AnswerUsage> {
    got.stream
        .is_none()
        .then(|| crate::model::answer_usage(&got.body.bytes))
        .flatten()
}

/// The oracle's verdict over the whole body of an answer with the expected status.
fn judged_by(ctx: &Ctx, oracle: &Oracle, got: &Captured) -> Verdict {
    let failed = |outcome, message: String| Verdict {
        outcome,
        error_message: Some(message),
        ..Verdict::default()
    };
    if got.body.truncated && !ctx.performance_fit {
        return failed(
            Outcome::Correctness,
            format!(
                "response body of {} bytes is larger than --max-record-body ({} bytes) and cannot be judged; raise the limit",
                got.body.len, ctx.base.max_record_body
            ),
        );
    }
    // A performance-fit arm's cut body stays `ok` as a measurement, and is no judgment:
    // judging the part recorded would count a kept contract as broken.
    if got.body.truncated {
        return Verdict {
            usage_tokens: usage_here(got),
            ..Verdict::default()
        };
    }
    let (judged, verdict) = oracle.judge_and_read(
        &got.body.bytes,
        got.stream.is_some(),
        Some(&ctx.plan.decisions_pointer),
    );
    let usage_tokens = match oracle {
        Oracle::Json { .. } => judged
            .usage
            .map(|(prompt, completion, cached)| AnswerUsage {
                tokens: (prompt, completion),
                cached_prompt: cached,
            }),
        _ => usage_here(got),
    };
    match verdict {
        Ok(()) => Verdict {
            decisions: judged.decisions,
            usage_tokens,
            oracle_passed: Some(true),
            ..Verdict::default()
        },
        // A performance-fit arm answering differently is what is measured, not a fault:
        // the difference is recorded (oracle_passed false), the exchange stays `ok`.
        Err(m) if ctx.performance_fit => Verdict {
            oracle_detail: Some(format!("{}: {m}", oracle.kind())),
            oracle_mismatch_pointer: m.pointer,
            usage_tokens,
            oracle_passed: Some(false),
            ..Verdict::default()
        },
        Err(m) => Verdict {
            outcome: Outcome::Correctness,
            error_message: Some(format!("oracle mismatch {m}")),
            oracle_detail: Some(format!("{}: {m}", oracle.kind())),
            oracle_mismatch_pointer: m.pointer,
            usage_tokens,
            oracle_passed: Some(false),
            ..Verdict::default()
        },
    }
}
