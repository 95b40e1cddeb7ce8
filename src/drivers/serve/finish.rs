//! The end of a served exchange: reading the upstream body (when it was not already whole),
//! waiting for the client's side, deciding the outcome in one place ([`verdict`]), and
//! handing the row to the recorder under the loss policy without holding up the response.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use hyper::body::Incoming;
use tokio::sync::{mpsc, oneshot};

use super::body::{Chunk, DownstreamEnd};
use super::client::ClientConn;
use super::forward::InFlight;
use super::{OnRecordFull, PendingGuard, Shared, Slot, TeeBody};
use crate::clock;
use crate::drivers::{RowIds, SentRequest, Verdict};
use crate::engine::Conn;
use crate::engine::{CopiedBody, Engine, ExchangeError};
use crate::model::Phase;
use crate::record::ExchangeRecord;

/// The one place serve decides an exchange's outcome: a failure on the upstream side (or
/// the proxy's own deadline or cut) wins; else the client's side: complete is `ok`, ended
/// early is `client_aborted` (or `shutdown_cut` when the stop was cutting connections),
/// never ended is `shutdown_cut`. `cut` is asked only for a response that ended early
/// (reading it takes the watch channel's lock).
pub(super) fn verdict(
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

pub(super) async fn wait_downstream(
    sh: &Shared,
    done: oneshot::Receiver<DownstreamEnd>,
) -> Option<DownstreamEnd> {
    let mut cut = sh.cut.clone();
    tokio::select! {
        r = done => r.ok(),
        _ = cut.wait_for(|c| *c) => None,
    }
}

/// Forward the upstream body frame by frame into the bounded channel, independently of
/// the client. `Some`: how it failed.
async fn pump(
    sh: &Shared,
    p: &mut InFlight,
    body: &mut Incoming,
    tx: &mpsc::Sender<Chunk>,
) -> Option<ExchangeError> {
    let idle = sh.opts.upstream_idle_timeout;
    loop {
        match tokio::time::timeout(idle, Engine::next_frame(body, &mut p.cap)).await {
            Err(_) => {
                let e = ExchangeError::deadline(format!(
                    "upstream sent no body bytes for --upstream-idle-timeout ({} s)",
                    idle.as_secs_f64()
                ));
                let _ = tx.send(Err(io::Error::other(e.message.clone()))).await;
                return Some(e);
            }
            Ok(Err(e)) => {
                let _ = tx.send(Err(io::Error::other(e.message.clone()))).await;
                return Some(e);
            }
            Ok(Ok(None)) => {
                // A close-delimited event stream cut mid-event: hyper saw a clean end of
                // file, but the client's response must not look complete either.
                let cut = p.cap.stream_incomplete()?;
                let e = ExchangeError::upstream_message(cut);
                let _ = tx.send(Err(io::Error::other(e.message.clone()))).await;
                return Some(e);
            }
            Ok(Ok(Some(frame))) => {
                // Trailers always end a body.
                let last = p.cap.ended() || frame.is_trailers();
                if tx.send(Ok((frame, last))).await.is_err() {
                    return Some(ExchangeError::client_gone());
                }
            }
        }
    }
}

/// What the upstream reader task takes over from `forward::respond`.
pub(super) struct Pumped {
    pub(super) conn: Conn<TeeBody>,
    pub(super) body: Incoming,
    pub(super) tx: mpsc::Sender<Chunk>,
    pub(super) done_rx: oneshot::Receiver<DownstreamEnd>,
    pub(super) slot: Slot,
    pub(super) initial_failure: Option<ExchangeError>,
}

/// Read the upstream body independently of the client, into the bounded channel; then
/// wait for the client's side to end and record the exchange.
pub(super) async fn pump_and_record(
    sh: Arc<Shared>,
    guard: PendingGuard,
    mut p: InFlight,
    mut up: Pumped,
) {
    let mut cut = sh.cut.clone();
    let failure = match up.initial_failure.take() {
        Some(f) => Some(f),
        None => tokio::select! {
            f = pump(&sh, &mut p, &mut up.body, &up.tx) => f,
            _ = cut.wait_for(|c| *c) => Some(ExchangeError::shutdown_cut()),
        },
    };
    drop(up.tx);
    p.cap.finish(clock::now_ns());
    if failure.is_none()
        && let Some(c) = Engine::release(up.conn, sh.opts.policy)
        && let Ok(mut s) = up.slot.lock()
    {
        *s = Some(c);
    }
    // An incomplete stream was already turned into `failure` by `pump`.
    let end = wait_downstream(&sh, up.done_rx).await;
    let v = verdict(failure, end.as_ref(), || *sh.cut.borrow());
    record(&sh, p, v, end).await;
    drop(guard);
}

/// Record once the request body's copy has arrived (it may still be in flight when the
/// response has already ended), waiting for room in the recorder's queue if need be.
pub(super) async fn record(
    sh: &Arc<Shared>,
    mut p: InFlight,
    verdict: Verdict,
    end: Option<DownstreamEnd>,
) {
    let tee = match tokio::time::timeout(Duration::from_secs(1), &mut p.tee).await {
        Ok(Ok(t)) => t,
        _ => CopiedBody {
            truncated: true,
            ..CopiedBody::default()
        },
    };
    let client = p.client.clone();
    let rec = build_record(sh, p, tee, verdict, end);
    if let Some(wait) = queue_row(sh, &client, rec) {
        wait.await;
    }
}

/// Record without waiting when nothing needs waiting for (the request body copy is
/// delivered and the recorder's queue has room); otherwise hand the rest to a task.
pub(super) fn record_now(
    sh: &Arc<Shared>,
    mut p: InFlight,
    verdict: Verdict,
    end: Option<DownstreamEnd>,
    guard: PendingGuard,
) {
    let spawn = |fut: Pin<Box<dyn std::future::Future<Output = ()> + Send>>| {
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(fut);
        }
    };
    let Ok(tee) = p.tee.try_recv() else {
        let sh = sh.clone();
        spawn(Box::pin(async move {
            record(&sh, p, verdict, end).await;
            drop(guard);
        }));
        return;
    };
    let client = p.client.clone();
    let rec = build_record(sh, p, tee, verdict, end);
    match queue_row(sh, &client, rec) {
        Some(wait) => spawn(Box::pin(async move {
            wait.await;
            drop(guard);
        })),
        None => drop(guard),
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

/// The row of a finished exchange; also counts it in the live counters.
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
    sh.live.count(
        verdict.outcome,
        got.timings.total_us,
        sh.opts.stats_interval.is_some(),
    );
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
    sh.run.row(ids, request, got, verdict)
}
