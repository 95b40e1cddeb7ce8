//! The one end of a served exchange ([`end`]), as Pingora's `logging()` is the one place a
//! finished request is seen: every path of `forward` that finishes an exchange (the
//! response delivered to the client, whole or not; no upstream head, and an answer serve
//! wrote itself or a client that had left) reports here what it saw, and only here is the
//! outcome decided ([`verdict`]), the exchange counted (once, in the run's `Telemetry`;
//! its latency kept for the live line), and its row built and handed to the recorder
//! under the loss policy.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::client::ClientConn;
use super::down::DownstreamEnd;
use super::state::{InFlight, OnRecordFull, PendingGuard, Shared};
use crate::clock;
use crate::drivers::{RowIds, SentRequest, Verdict};
use crate::engine::{CopiedBody, ExchangeError};
use crate::model::{Outcome, Phase};
use crate::record::ExchangeRecord;

/// The end of a served exchange, however it ended: its response delivered (after
/// `deliver`, when the client's side ended), or no upstream head came (after serve's own
/// answer, or with none for a client that had left). `failure`: how the upstream side
/// failed (or the proxy's deadline or cut); `downstream`: when and how the client's side
/// ended (`None`: it never did). Decides the outcome ([`verdict`]), counts the exchange
/// and records it without waiting when the recorder's queue has room; otherwise hands the
/// wait to a task. The row is submitted, dropped and counted, or its loss noted, before
/// `guard` is released, so a stop that waits for no pending exchange loses no row.
pub(super) fn end(
    sh: &Arc<Shared>,
    mut p: InFlight,
    failure: Option<ExchangeError>,
    downstream: Option<DownstreamEnd>,
    guard: PendingGuard,
) {
    let verdict = verdict(failure, downstream.as_ref(), || *sh.cut.borrow());
    let spawn = |fut: Pin<Box<dyn std::future::Future<Output = ()> + Send>>| {
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(fut);
        }
    };
    let tee = std::mem::take(&mut p.tee);
    let client = p.client.clone();
    let rec = build_record(sh, p, tee, verdict, downstream);
    match queue_row(sh, &client, rec) {
        Some(wait) => spawn(Box::pin(async move {
            wait.await;
            drop(guard);
        })),
        None => drop(guard),
    }
}

/// The one place serve decides an exchange's outcome: a failure on the upstream side (or
/// the proxy's own deadline or cut) wins; else the client's side: complete is `ok`, ended
/// early is `client_aborted` (or `shutdown_cut` when the stop was cutting connections),
/// never ended is `shutdown_cut`. `cut` is asked only for a response that ended early
/// (reading it takes the watch channel's lock).
fn verdict(
    failure: Option<ExchangeError>,
    end: Option<&DownstreamEnd>,
    cut: impl FnOnce() -> bool,
) -> Verdict {
    let failure = match (failure, end) {
        (Some(f), _) => f,
        (None, Some(e)) if e.complete => return Verdict::default(),
        (None, Some(_)) if !cut() => ExchangeError::client_gone(),
        (None, _) => ExchangeError::shutdown_cut(),
    };
    Verdict {
        outcome: failure.outcome(),
        error_message: Some(failure.message),
        ..Verdict::default()
    }
}

/// Hand a row to the recorder under the loss policy, without waiting. When the queue is
/// full under `block`, returns the wait still to do: the row's client connection is
/// gated (its next request waits) until that wait has queued the row. `None`: the row is
/// queued, dropped and counted (`drop`), or refused by a stopped writer (noted).
fn queue_row(
    sh: &Arc<Shared>,
    client: &ClientConn,
    rec: ExchangeRecord,
) -> Option<impl std::future::Future<Output = ()> + Send + 'static> {
    let recorder = &sh.run.recorder;
    let r = match sh.opts.on_record_full {
        OnRecordFull::Drop => recorder.try_submit(rec).map(|_| ()),
        OnRecordFull::Block => match recorder.submit_now(rec) {
            Ok(None) => Ok(()),
            Ok(Some(rec)) => {
                let gate = client.hold();
                let n = sh.waiting_rows.fetch_add(1, Ordering::Relaxed) + 1;
                sh.waiting_rows_peak.fetch_max(n, Ordering::Relaxed);
                let sh = sh.clone();
                return Some(async move {
                    if let Err(e) = sh.run.recorder.submit(rec).await {
                        sh.run.record_failed(e);
                    }
                    sh.waiting_rows.fetch_sub(1, Ordering::Relaxed);
                    drop(gate);
                });
            }
            Err(e) => Err(e),
        },
    };
    if let Err(e) = r {
        sh.run.record_failed(e);
    }
    None
}

/// The row of a finished exchange; also counts it (the run's `Telemetry`) and keeps its
/// latency for the live line.
fn build_record(
    sh: &Shared,
    p: InFlight,
    tee: CopiedBody,
    verdict: Verdict,
    end: Option<DownstreamEnd>,
) -> ExchangeRecord {
    sh.in_flight.fetch_sub(1, Ordering::Relaxed);
    let t0_ns = p.cap.t0_ns();
    let mut got = p.cap.into_captured();
    // Only a response whose last byte was handed to the client has a downstream end; one
    // the client left early (or never got) has none, so `downstream_done_us - total_us` is
    // the proxy's own hand-over time wherever it is defined.
    got.timings.downstream_done_us = end
        .as_ref()
        .filter(|e| e.complete)
        .map(|e| clock::us_between(t0_ns, e.at_ns));
    if let Some(latencies) = &sh.latencies
        && verdict.outcome == Outcome::Ok
        && let Some(t) = got.timings.total_us
    {
        latencies.keep(t);
    }
    // The exchange's one live count (serve's run always has a `Telemetry`).
    sh.run.observe(
        |t| t.route_id(p.method.as_str(), &p.url),
        &got,
        verdict.outcome,
    );
    let ids = RowIds {
        target_rate_per_second: None,
        exchange_id: sh.run.next_exchange_id(),
        phase: Phase::Live,
        arm: None,
        case_name: None,
        variant: None,
        concurrency: None,
        repetition: None,
        dispatch_index: p.index,
        worker: (p.conn_no % i64::from(i32::MAX)) as i32,
        prompt_tokens_planned: None,
        session_id: None,
        turn: None,
        session_lag_us: None,
    };
    let request = SentRequest {
        scheduled_offset_us: None,
        started_at_us: p.started_at_us,
        start_offset_us: p.start_offset_us,
        method: p.method,
        url: Arc::from(p.url),
        headers: Arc::new(p.request_headers),
        body: tee,
    };
    let mut rec = sh.run.row(ids, request, got, verdict);
    // A whole JSON answer's `usage` (token counts, cached prompt tokens) is read from the
    // recorded copy on the writer thread, off the proxy's path; a stream's came from its
    // usage chunk.
    rec.usage_from_body =
        rec.outcome == Outcome::Ok && rec.stream.is_none() && !rec.response_body_truncated;
    rec
}
