//! The serve driver: a recording reverse proxy in front of one worker.
//!
//! A hyper HTTP/1.1 server accepts client connections; every request is forwarded through
//! the exchange engine, and the response streams back while the engine stamps each frame.
//! By default each downstream connection is pinned to its own upstream connection (so the
//! client's keep-alive or fresh behaviour is mirrored and `connection_id` means something);
//! `--upstream-connection fresh` opens one per request. Bodies stream in both directions:
//! the request body is teed (copied up to the record limits) on its way up, and the
//! upstream response, unless it is already whole with its head, is read by its own task
//! into a bounded channel, so a slow client neither inflates the worker's timings nor
//! makes the proxy hold unbounded data.
//!
//! A row is submitted after the client's response has ended (or failed), never while it
//! is in flight. This module never imports the replay driver; what both need lives in the
//! engine, the recorder and `drivers` itself (the run context and the one row constructor).
//!
//! Files, each importing only those below it: this one accepts connections and stops;
//! `forward` turns a client request into an upstream one and answers; `pump` reads a
//! streamed upstream body; `end` is the one end of every exchange (the outcome decided,
//! the row built and recorded); `state` holds the options and what every connection
//! shares; `body` the two bodies, `client` a client connection's state and `live` the
//! counters, which import nothing else from serve.
//!
//! # The life of a served exchange
//!
//! 1. `forward::handle` (in `drivers/serve/`) first waits on its client connection's
//!    back-pressure gate (`ClientConn::wait_backlog`: set only while the connection's previous
//!    row waits for room in the recorder's queue under `block`). `Capture::start` stamps t0
//!    (drawing recorded bytes from the `--record-memory` budget), the wall clock is read once,
//!    and the upstream request is made: hop-by-hop headers removed (`engine::http1`),
//!    forwarding headers added (`upstream_headers`, built once per client connection in
//!    `ClientConn`), the URL and target made once (`upstream_url`). The request body streams
//!    up through a `TeeBody`, whose `BodyCopy` is delivered on a oneshot when it ends.
//! 2. `Engine::send` runs on the connection taken from the client connection's slot, under
//!    `--upstream-timeout` and the stop's cut. With no head, `error_response` answers 502,
//!    503 or 504 (`ExchangeError::status`), and a task waits for the client's side
//!    (`pump::wait_downstream`) and hands what it saw to `end::end`.
//! 3. With a head, `respond` polls for the first body frame without waiting. If the body is
//!    already whole (and, for an event stream, complete), the connection goes back to the
//!    slot and the `ProxyBody` carries the body with `OnEnd::Call`: a listener the body does
//!    not know, which calls `end::end` when the client's side ends. Otherwise
//!    `pump::pump_and_record` reads the upstream body frame by frame (`pump::pump`, under
//!    `--upstream-idle-timeout`) into the 64-frame channel the `ProxyBody` drains,
//!    independently of the client, then puts the connection back, waits for the client's
//!    side, and calls `end::end`. A request whose client leaves before the head (hyper drops
//!    its future) is ended by `forward::Unanswered`'s drop, through `end::end` too.
//! 4. `end::end` is the one place an exchange ends, and its `verdict` the one place an
//!    outcome is decided (the rule is in `end.rs`).
//! 5. `end::build_record` counts the exchange in the live counters, sets `downstream_done_us` (only
//!    when the client's response completed), takes the exchange id, and builds the row with
//!    `RunContext::row`; the two bodies' holds on the memory budget become
//!    the row's (released when the writer has encoded it). `end::queue_row` applies the loss
//!    policy: under `drop`, `try_submit` (dropped and counted when the queue is full); under
//!    `block`, `submit_now`, and when the queue is full the client connection's gate closes
//!    until a task has `submit`ted the row.
//! 6. When serve stops, the closed parts are read back (`record::read::for_each_row`) into
//!    `report::routes::RouteTable`: summary.json's `routes` and the end-of-run lines.

mod body;
mod client;
mod end;
mod forward;
mod live;
mod pump;
mod state;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::header::HeaderValue;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::RunContext;
use crate::budget::MemoryBudget;
use crate::engine::Engine;
use crate::metrics::Percentiles;
use crate::report::ServeStats;
use client::ClientConn;
use live::LiveCounters;
pub use state::OnRecordFull;
pub(crate) use state::ServeOptions;
use state::{Pending, PendingGuard, Shared, Slot};

/// Serve until `stop` turns true, then drain (bounded by the grace period) and cut what is
/// left. The caller finishes the recording ([`RunContext::finish_recording`]).
pub(crate) async fn run(
    listener: TcpListener,
    opts: ServeOptions,
    engine: Engine,
    run: Arc<RunContext>,
    stop: Arc<AtomicBool>,
) -> ServeStats {
    let (cut_tx, cut_rx) = watch::channel(false);
    let proto = if opts.tls.is_some() { "https" } else { "http" };
    let shared = Arc::new(Shared {
        engine,
        budget: MemoryBudget::new(opts.record_memory),
        run,
        next_conn: AtomicI64::new(0),
        in_flight: AtomicI64::new(0),
        cut: cut_rx,
        live: LiveCounters::default(),
        waiting_rows: AtomicI64::new(0),
        waiting_rows_peak: AtomicI64::new(0),
        proto,
        origin_prefix: format!(
            "{}://{}{}",
            opts.upstream.scheme.as_str(),
            opts.upstream.authority,
            opts.upstream.path_and_query.trim_end_matches('/')
        ),
        origin_len: opts.upstream.scheme.as_str().len() + 3 + opts.upstream.authority.len(),
        upstream_host: HeaderValue::from_str(&opts.upstream.authority).ok(),
        opts,
    });
    if let Some(t) = shared.run.telemetry() {
        let sh = Arc::downgrade(&shared);
        t.in_flight_from(move || {
            sh.upgrade()
                .map_or(0.0, |s| s.in_flight.load(Ordering::Relaxed) as f64)
        });
    }
    let pending = Arc::new(Pending::default());
    let stats_task = shared
        .opts
        .stats_interval
        .map(|every| tokio::spawn(stats_loop(every, Arc::downgrade(&shared))));
    let graceful = GracefulShutdown::new();
    let mut conns = JoinSet::new();
    accept_until_stopped(&listener, &shared, &pending, &graceful, &mut conns, &stop).await;
    drop(listener);
    drain(&shared, &pending, graceful, &mut conns, cut_tx).await;
    if let Some(t) = stats_task {
        t.abort();
    }
    let (requests, by_outcome) = shared.live.totals();
    ServeStats {
        requests,
        by_outcome,
        backlog_peak: shared.waiting_rows_peak.load(Ordering::Relaxed).max(0) as u64,
        dropped_rows: shared.run.recorder.dropped(),
        ..ServeStats::default()
    }
}

/// Accept clients (at most `--max-connections` at once; more wait in the accept queue)
/// until `stop` turns true.
async fn accept_until_stopped(
    listener: &TcpListener,
    shared: &Arc<Shared>,
    pending: &Arc<Pending>,
    graceful: &GracefulShutdown,
    conns: &mut JoinSet<()>,
    stop: &AtomicBool,
) {
    let slots = Arc::new(tokio::sync::Semaphore::new(
        shared.opts.max_connections.max(1),
    ));
    loop {
        tokio::select! {
            accepted = async {
                let permit = slots.clone().acquire_owned().await;
                (permit, listener.accept().await)
            } => {
                let (Ok(permit), Ok((tcp, peer))) = accepted else { continue };
                let _ = tcp.set_nodelay(true);
                let sh = shared.clone();
                let pending = pending.clone();
                let watcher = graceful.watcher();
                conns.spawn(async move {
                    let _permit = permit;
                    match sh.opts.tls.clone() {
                        None => serve_conn(sh, pending, watcher, tcp, peer).await,
                        Some(acceptor) => {
                            let hs = tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await;
                            if let Ok(Ok(tls)) = hs {
                                serve_conn(sh, pending, watcher, tls, peer).await;
                            }
                        }
                    }
                });
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            _ = tokio::time::sleep(Duration::from_millis(50)) => {
                if stop.load(Ordering::Relaxed) {
                    return;
                }
            }
        }
    }
}

/// Stop: idle keep-alive connections close, in-flight exchanges may finish within the
/// grace period; then what is left is cut, and every pending row is submitted.
async fn drain(
    shared: &Shared,
    pending: &Pending,
    graceful: GracefulShutdown,
    conns: &mut JoinSet<()>,
    cut_tx: watch::Sender<bool>,
) {
    let drained = tokio::time::timeout(shared.opts.grace, graceful.shutdown())
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

/// Serve one downstream connection (plain or TLS).
async fn serve_conn<I>(
    sh: Arc<Shared>,
    pending: Arc<Pending>,
    watcher: hyper_util::server::graceful::Watcher,
    io: I,
    peer: SocketAddr,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let conn_no = sh.next_conn.fetch_add(1, Ordering::Relaxed);
    let sh_limits = (sh.opts.max_header_bytes, sh.opts.header_read_timeout);
    let slot: Slot = Arc::new(Mutex::new(None));
    let requests = Arc::new(AtomicI64::new(0));
    let client = Arc::new(ClientConn::new(peer));
    let svc = service_fn(move |req| {
        let index = requests.fetch_add(1, Ordering::Relaxed);
        forward::handle(
            sh.clone(),
            PendingGuard::new(&pending),
            slot.clone(),
            client.clone(),
            conn_no,
            index,
            req,
        )
    });
    let conn = http1::Builder::new()
        .keep_alive(true)
        .max_buf_size(sh_limits.0.max(8192))
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(sh_limits.1)
        .serve_connection(TokioIo::new(io), svc);
    let _ = watcher.watch(conn).await;
}

/// Live counters on stderr every `every`.
async fn stats_loop(every: Duration, shared: std::sync::Weak<Shared>) {
    let mut tick = tokio::time::interval(every);
    tick.tick().await;
    loop {
        tick.tick().await;
        let Some(sh) = shared.upgrade() else { return };
        let in_flight = sh.in_flight.load(Ordering::Relaxed);
        let Some((requests, window_n, window, errors)) = sh.live.take_interval() else {
            return;
        };
        drop(sh);
        let p = Percentiles::of(window);
        let ms =
            |v: Option<i64>| v.map_or("-".to_string(), |us| format!("{:.1}", us as f64 / 1000.0));
        eprintln!(
            "live: {requests} requests (+{window_n}), {in_flight} in flight, errors: {}; last interval p50 {} ms, p99 {} ms",
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
