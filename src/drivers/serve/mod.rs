//! The serve driver: a recording reverse proxy in front of one worker, on our own HTTP/1
//! core.
//!
//! One task per client connection (`serve_conn`) reads each request head by hyper's
//! server rules (`engine::http1::request`), forwards the exchange, and goes on while the
//! connection may carry another. By default each client connection is pinned to its own
//! upstream connection (so the client's keep-alive or fresh behaviour is mirrored and
//! `connection_id` means something); `--upstream-connection fresh` opens one per request.
//! Bodies stream in both directions: the request body goes up as the client sends it
//! (copied, up to the record limits, on the side), and the upstream body is read at most
//! 64 pieces ahead of the client, so a slow client neither inflates the worker's
//! timings nor makes the proxy hold unbounded data.
//!
//! A row is submitted after the client's response has ended (or failed), never while it
//! is in flight. This module never imports the replay driver; what both need lives in the
//! engine, the recorder and `drivers` itself (the run context and the one row constructor).
//!
//! Files, each importing only those below it: this one accepts connections, runs each
//! one and stops; `forward` turns a client request into an upstream one and answers;
//! `deliver` moves a response body from the worker to the client; `end` is the one end of
//! every exchange (the outcome decided, the row built and recorded); `state` holds the
//! options and what every connection shares; `down` the client connection (heads, the
//! request body, serve's own short answers), `client` a client connection's forwarding
//! headers and back-pressure gate, and `live` the live line's interval, which import
//! nothing else from serve.
//!
//! # The life of a served exchange
//!
//! 1. `serve_conn` reads the request head within `--header-read-timeout` and
//!    `--max-header-bytes` (`Down::next_head`); a head it refuses is answered 400 or 431
//!    (a `CONNECT` 405) and the connection closed, never forwarded. `forward::exchange`
//!    first waits on the connection's back-pressure gate (`ClientConn::wait_backlog`: set
//!    only while the connection's previous row waits for room in the recorder's queue
//!    under `block`). In `forward::begin`, `Capture::start` stamps t0 (drawing recorded
//!    bytes from the `--record-memory` budget), the wall clock is read once, and the
//!    upstream request is made: hop-by-hop headers removed (`engine::http1`), forwarding
//!    headers added (`upstream_headers`, built once per client connection in `ClientConn`),
//!    the URL and target made once (`upstream_url`), the head written by
//!    `engine::http1::write`.
//! 2. `Engine::lean_send` writes the head (and the body bytes that came with it) on the
//!    connection kept from the previous request, or a new one, under the keep-alive rule;
//!    the rest of the body follows as the client sends it (`100 Continue` first when the
//!    client asked), copied into a `BodyCopy`. Then the response head is read while the
//!    client's side is watched for its close (`Down::until_closed`). All of this runs
//!    under `--upstream-timeout` and the stop's cut. With no head, `answer_error` answers
//!    502, 503 or 504 (`ExchangeError::answer`); a client that left is recorded
//!    `client_aborted` with nothing answered.
//! 3. With a head, `respond` decides the client's framing (as the worker framed it; in
//!    chunks for a body the close ends, so a cut never looks complete; unframed for an
//!    HTTP/1.0 client) and `deliver::deliver` moves the body: one poll loop writes the queued
//!    pieces (vectored, the head with the first bytes), reads on from the worker (each
//!    read stamped by the engine, under `--upstream-idle-timeout`), and watches the
//!    client's close. The upstream connection goes back to the client connection's slot
//!    when the body ended cleanly and both sides allow it.
//! 4. `end::end` is the one place an exchange ends, and its `verdict` the one place an
//!    outcome is decided (the rule is in `end.rs`).
//! 5. `end::build_record` counts the exchange (once, in the run's `Telemetry`, which the live
//!    line, `--metrics-listen` and the end-of-run counts all read), sets `downstream_done_us` (only
//!    when the client's response completed), takes the exchange id, and builds the row with
//!    `RunContext::row`; the two bodies' holds on the memory budget become
//!    the row's (released when the writer has encoded it). `end::queue_row` applies the loss
//!    policy: under `drop`, `try_submit` (dropped and counted when the queue is full); under
//!    `block`, `submit_now`, and when the queue is full the client connection's gate closes
//!    until a task has `submit`ted the row.
//! 6. When serve stops, connections waiting for a new request close, in-flight exchanges
//!    get the grace period (their connections close after them), then are cut. The closed
//!    parts are read back (`record::read::for_each_row`) into `report::routes::RouteTable`:
//!    summary.json's `routes` and the end-of-run lines.

mod client;
mod deliver;
mod down;
mod end;
mod forward;
mod live;
mod state;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::RunContext;
use super::shutdown::Shutdown;
use crate::engine::Engine;
use crate::metrics::Percentiles;
use crate::report::ServeStats;
use client::ClientConn;
use down::{Down, DownIo, NextHead};
use forward::ConnState;
use live::Window;
pub(crate) use state::ServeOptions;
pub use state::{OnRecordFail, OnRecordFull};
use state::{Pending, Shared};

/// Serve until `stop` is requested, then drain (bounded by the grace period) and cut what is
/// left. The caller finishes the recording ([`RunContext::finish_recording`]).
pub(crate) async fn run(
    listener: TcpListener,
    opts: ServeOptions,
    engine: Engine,
    run: Arc<RunContext>,
    stop: Arc<Shutdown>,
) -> ServeStats {
    let (cut_tx, cut_rx) = watch::channel(false);
    let (stopping_tx, stopping_rx) = watch::channel(false);
    let (latencies, window) = match opts.stats_interval {
        Some(every) => {
            let (latencies, window) = live::window();
            (Some(latencies), Some((every, window)))
        }
        None => (None, None),
    };
    let shared = Arc::new(Shared::new(engine, opts, run, cut_rx, latencies));
    count_once(&shared);
    let pending = Arc::new(Pending::default());
    let stats_task = window
        .map(|(every, window)| tokio::spawn(stats_loop(every, window, Arc::downgrade(&shared))));
    let mut conns = JoinSet::new();
    accept_until_stopped(
        &listener,
        &shared,
        &pending,
        &stopping_rx,
        &mut conns,
        &stop,
    )
    .await;
    drop(listener);
    let _ = stopping_tx.send(true);
    drain(&shared, &pending, &mut conns, cut_tx).await;
    drop(stopping_tx);
    if let Some(t) = stats_task {
        t.abort();
    }
    let (requests, by_outcome) = shared.counts();
    ServeStats {
        requests,
        by_outcome,
        backlog_peak: shared.waiting_rows_peak.load(Ordering::Relaxed).max(0) as u64,
        dropped_rows: shared.run.recorder.dropped(),
        refused: shared.refused.lock().map(|r| r.clone()).unwrap_or_default(),
        trailers_dropped: shared.trailers_dropped.load(Ordering::Relaxed),
        unrecorded: shared.run.recorder.unrecorded(),
        stopped_by_record_failure: shared.unrecordable(),
        ..ServeStats::default()
    }
}

/// Every exchange is counted once, in the run's live metrics (`end::build_record`): the
/// ones `--metrics-listen` serves when it was given, else serve's own; their in-flight
/// gauge reads serve's count.
fn count_once(shared: &Arc<Shared>) {
    if shared.run.telemetry().is_none() {
        shared.run.set_telemetry(Arc::default());
    }
    if let Some(t) = shared.run.telemetry() {
        let sh = Arc::downgrade(shared);
        t.in_flight_from(move || {
            sh.upgrade()
                .map_or(0.0, |s| s.in_flight.load(Ordering::Relaxed) as f64)
        });
    }
}

/// The first wait after a failed accept; it doubles on each failure in a row up to
/// [`ACCEPT_BACKOFF_MAX`], and a successful accept resets it.
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(5);
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_millis(500);

/// Accept clients (at most `--max-connections` at once; more wait in the accept queue)
/// until `stop` is requested.
async fn accept_until_stopped(
    listener: &TcpListener,
    shared: &Arc<Shared>,
    pending: &Arc<Pending>,
    stopping: &watch::Receiver<bool>,
    conns: &mut JoinSet<()>,
    stop: &Shutdown,
) {
    let slots = Arc::new(tokio::sync::Semaphore::new(
        shared.opts.max_connections.max(1),
    ));
    // The recorder's health is looked at on one timer for the whole loop: a sleep made
    // anew each turn never fires while accepts and closing connections keep the loop busy.
    // The stop needs no timer: it wakes the loop.
    let mut tick = tokio::time::interval(Duration::from_millis(50));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failure_said = false;
    let mut backoff = ACCEPT_BACKOFF_MIN;
    loop {
        tokio::select! {
            accepted = async {
                let permit = slots.clone().acquire_owned().await;
                (permit, listener.accept().await)
            } => {
                let (Ok(permit), Ok((tcp, peer))) = accepted else {
                    // Out of file descriptors (EMFILE) or memory, accept fails at once
                    // again: wait before the next try instead of spinning a core.
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
                    continue;
                };
                backoff = ACCEPT_BACKOFF_MIN;
                let _ = tcp.set_nodelay(true);
                let sh = shared.clone();
                let pending = pending.clone();
                let stopping = stopping.clone();
                conns.spawn(async move {
                    let _permit = permit;
                    match sh.opts.tls.clone() {
                        None => serve_conn(sh, pending, stopping, Box::new(tcp), peer).await,
                        Some(acceptor) => {
                            let hs = tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await;
                            if let Ok(Ok(tls)) = hs {
                                serve_conn(sh, pending, stopping, Box::new(tls), peer).await;
                            }
                        }
                    }
                });
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            () = stop.requested() => return,
            _ = tick.tick() => {
                if let Some(why) = shared.unrecordable() {
                    // Said at once, whatever --quiet says: traffic stops here.
                    eprintln!(
                        "matrix-proxy: recording failed: {why}; serve forwards nothing more (new requests are answered 503), lets the exchanges in flight finish and stops (--on-record-fail forward keeps forwarding)"
                    );
                    return;
                }
                if !failure_said && let Some(why) = shared.run.recorder.failure() {
                    failure_said = true;
                    eprintln!(
                        "matrix-proxy: recording failed: {why}; serve keeps forwarding (--on-record-fail forward) and counts every unrecorded exchange"
                    );
                }
            }
        }
    }
}

/// Stop (`stopping` is already true): idle keep-alive connections close, in-flight
/// exchanges may finish within the grace period (their connections close after them);
/// then what is left is cut, and every pending row is submitted.
async fn drain(
    shared: &Shared,
    pending: &Pending,
    conns: &mut JoinSet<()>,
    cut_tx: watch::Sender<bool>,
) {
    let all_closed = async { while conns.join_next().await.is_some() {} };
    let drained = tokio::time::timeout(shared.opts.grace, all_closed)
        .await
        .is_ok();
    if !drained {
        let _ = cut_tx.send(true);
    }
    // Every exchange still pending now ends quickly (cut, or already finishing).
    let wait_zero = async {
        loop {
            let notified = pending.zero.notified();
            if pending.n.load(Ordering::SeqCst) == 0 {
                break;
            }
            notified.await;
        }
    };
    if tokio::time::timeout(Duration::from_secs(10), wait_zero)
        .await
        .is_err()
    {
        let _ = cut_tx.send(true);
    }
    conns.abort_all();
    while conns.join_next().await.is_some() {}
}

/// Serve one downstream connection (plain or TLS): one task reads each request head,
/// forwards the exchange, and goes on while the connection may carry another.
async fn serve_conn(
    sh: Arc<Shared>,
    pending: Arc<Pending>,
    mut stopping: watch::Receiver<bool>,
    io: Box<dyn DownIo>,
    peer: SocketAddr,
) {
    let limit = sh.opts.max_header_bytes.max(8192);
    let mut down = Down::new(io);
    let mut st = ConnState {
        slot: None,
        client: Arc::new(ClientConn::new(peer)),
        conn_no: sh.next_conn.fetch_add(1, Ordering::Relaxed),
        next_index: 0,
        limit,
    };
    loop {
        let head = match down
            .next_head(limit, sh.opts.header_read_timeout, &mut stopping)
            .await
        {
            NextHead::Head(head) => *head,
            NextHead::Closed => return,
            NextHead::Refuse(status) => {
                sh.count_refused(status);
                return down.refuse(status).await;
            }
        };
        if let Some(status) = crate::engine::http1::reframe::refusal(&head) {
            sh.count_refused(status);
            return down.refuse(status).await;
        }
        let stop_now = *stopping.borrow();
        if !forward::exchange(&sh, &pending, &mut down, &mut st, head, stop_now).await {
            return down.close().await;
        }
    }
}

/// The live line on stderr every `every`.
async fn stats_loop(every: Duration, mut window: Window, shared: std::sync::Weak<Shared>) {
    let mut tick = tokio::time::interval(every);
    tick.tick().await;
    loop {
        tick.tick().await;
        let Some(sh) = shared.upgrade() else { return };
        let in_flight = sh.in_flight.load(Ordering::Relaxed);
        let (requests, by_outcome) = sh.counts();
        let live::Interval {
            requests,
            ended,
            latencies,
            mut errors,
        } = window.take(requests, &by_outcome);
        if let Some(why) = sh.run.recorder.failure() {
            errors.push(format!(
                "RECORDING FAILED ({why}), {} unrecorded",
                sh.run.recorder.unrecorded()
            ));
        }
        drop(sh);
        let p = Percentiles::of(latencies);
        let ms =
            |v: Option<i64>| v.map_or("-".to_string(), |us| format!("{:.1}", us as f64 / 1000.0));
        eprintln!(
            "live: {requests} requests (+{ended}), {in_flight} in flight, errors: {}; last interval p50 {} ms, p99 {} ms",
            if errors.is_empty() {
                "none".into()
            } else {
                errors.join(" ")
            },
            ms(p.p50),
            ms(p.p99),
        );
    }
}
