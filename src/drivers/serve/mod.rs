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
//! Files: this one accepts connections and stops; `forward` turns a client request into an
//! upstream one and answers; `body` holds the two bodies; `finish` decides the outcome and
//! records; `client` is a client connection's state; `live` the counters.

mod body;
mod client;
mod finish;
mod forward;
mod live;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::header::HeaderValue;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::{Notify, watch};
use tokio::task::JoinSet;

use super::RunContext;
use crate::budget::MemoryBudget;
use crate::engine::{Conn, Engine};
use crate::model::{ConnectionPolicy, Endpoint};
use crate::report::ServeStats;
use body::TeeBody;
use client::ClientConn;
use live::{LiveCounters, stats_loop};

/// What to do when the recorder's queue is full (`serve --on-record-full`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnRecordFull {
    /// Wait for the writer (back-pressure on the finished exchange, never on the response).
    Block,
    /// Drop the row and count it (the count is printed and kept in summary.json).
    Drop,
}

impl OnRecordFull {
    /// As the command line and config.json name it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            OnRecordFull::Block => "block",
            OnRecordFull::Drop => "drop",
        }
    }
}

#[derive(Clone)]
pub(crate) struct ServeOptions {
    pub(crate) upstream: Endpoint,
    /// `KeepAlive`: each downstream connection pinned to its own upstream connection.
    pub(crate) policy: ConnectionPolicy,
    /// Deadline for the upstream response head (connect and send included) -> 504.
    pub(crate) upstream_timeout: Duration,
    /// Longest gap between upstream body frames before the exchange is cut.
    pub(crate) upstream_idle_timeout: Duration,
    pub(crate) max_record_body: usize,
    pub(crate) record_memory: usize,
    pub(crate) rewrite_host: bool,
    pub(crate) tls: Option<tokio_rustls::TlsAcceptor>,
    pub(crate) on_record_full: OnRecordFull,
    /// How long in-flight exchanges may finish after a stop before they are cut.
    pub(crate) grace: Duration,
    /// Live counters on stderr every this often; `None` is quiet.
    pub(crate) stats_interval: Option<Duration>,
    /// Frames buffered between the upstream reader and the client.
    pub(crate) buffer_frames: usize,
    /// Largest request head accepted from a client (larger: 431).
    pub(crate) max_header_bytes: usize,
    /// Time a client has to send a complete request head (then the connection is closed).
    pub(crate) header_read_timeout: Duration,
    /// Client connections served at once; more wait in the listen backlog.
    pub(crate) max_connections: usize,
}

struct Shared {
    engine: Engine,
    opts: ServeOptions,
    run: Arc<RunContext>,
    budget: Arc<MemoryBudget>,
    next_conn: AtomicI64,
    in_flight: AtomicI64,
    cut: watch::Receiver<bool>,
    live: LiveCounters,
    /// Finished exchanges waiting for room in the recorder's queue (at most one per
    /// client connection, by the connection's backlog gate); its peak is reported.
    waiting_rows: AtomicI64,
    waiting_rows_peak: AtomicI64,
    proto: &'static str,
    /// `scheme://authority` of the upstream, then its path prefix (no trailing `/`).
    origin_prefix: String,
    /// Length of `scheme://authority` in `origin_prefix`.
    origin_len: usize,
    /// `Host` for the upstream (its authority), when a request needs one.
    upstream_host: Option<HeaderValue>,
}

/// Counts exchanges whose row is not yet submitted; the stop waits for zero.
#[derive(Default)]
pub(super) struct Pending {
    n: AtomicUsize,
    zero: Notify,
}

pub(super) struct PendingGuard(Arc<Pending>);

impl PendingGuard {
    pub(super) fn new(p: &Arc<Pending>) -> PendingGuard {
        p.n.fetch_add(1, Ordering::SeqCst);
        PendingGuard(p.clone())
    }
}

impl Drop for PendingGuard {
    fn drop(&mut self) {
        if self.0.n.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.zero.notify_waiters();
        }
    }
}

type Slot = Arc<Mutex<Option<Conn<TeeBody>>>>;

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
