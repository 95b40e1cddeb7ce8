//! The serve driver: a recording reverse proxy in front of one worker.
//!
//! A hyper HTTP/1.1 server accepts client connections; every request is forwarded through
//! the exchange engine, and the response streams back while the engine stamps each frame.
//! By default each downstream connection is pinned to its own upstream connection (so the
//! client's keep-alive or fresh behaviour is mirrored and `connection_id` means something);
//! `--upstream-connection fresh` opens one per request. Bodies stream in both directions:
//! the request body is teed (copied up to the record limits) on its way up, and the
//! upstream response is read by its own task into a bounded channel, so a slow client
//! neither inflates the worker's timings nor makes the proxy hold unbounded data.
//!
//! A row is submitted after the client's response has ended (or failed), never while it
//! is in flight. This module never imports the replay driver; what both need lives in the
//! engine and the recorder.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderName, HeaderValue};
use http::{HeaderMap, Request, Response, StatusCode, Uri};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::{Notify, mpsc, oneshot, watch};
use tokio::task::JoinSet;

use crate::clock;
use crate::engine::{Capture, Conn, Engine};
use crate::metrics::Percentiles;
use crate::plan::{ConnectionPolicy, Endpoint};
use crate::record::{
    BudgetHold, ExchangeRecord, MemoryBudget, Outcome, Phase, RecordError, Recorder,
};

/// What to do when the recorder's queue is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OnRecordFull {
    /// Wait for the writer (back-pressure on the finished exchange, never on the response).
    Block,
    /// Drop the row and count it (the count is printed and kept in summary.json).
    Drop,
}

#[derive(Clone)]
pub struct ServeOptions {
    pub upstream: Endpoint,
    /// `KeepAlive`: each downstream connection pinned to its own upstream connection.
    pub policy: ConnectionPolicy,
    /// Deadline for the upstream response head (connect and send included) -> 504.
    pub upstream_timeout: Duration,
    /// Longest gap between upstream body frames before the exchange is cut.
    pub upstream_idle_timeout: Duration,
    pub max_record_body: usize,
    pub record_memory: usize,
    pub rewrite_host: bool,
    pub tls: Option<tokio_rustls::TlsAcceptor>,
    pub on_record_full: OnRecordFull,
    /// How long in-flight exchanges may finish after a stop before they are cut.
    pub grace: Duration,
    pub run_id: String,
    /// Live counters on stderr every this often; `None` is quiet.
    pub stats_interval: Option<Duration>,
    /// Frames buffered between the upstream reader and the client.
    pub buffer_frames: usize,
    /// Largest request head accepted from a client (larger: 431).
    pub max_header_bytes: usize,
    /// Time a client has to send a complete request head (then the connection is closed).
    pub header_read_timeout: Duration,
    /// Client connections served at once; more wait in the listen backlog.
    pub max_connections: usize,
}

/// What a serve run did.
#[derive(Debug, Clone, Default)]
pub struct ServeStats {
    pub requests: u64,
    pub by_outcome: BTreeMap<Outcome, u64>,
    /// Total latency of successful exchanges (µs).
    pub ok_total: Percentiles,
    pub dropped_rows: u64,
    /// Most finished exchanges that waited at once for room in the recorder's queue.
    pub backlog_peak: u64,
    pub record_error: Option<RecordError>,
}

/// Running counts, and the current interval's latencies for the live line.
#[derive(Debug, Default)]
struct Live {
    requests: u64,
    by_outcome: BTreeMap<Outcome, u64>,
    window: Vec<i64>,
    window_n: u64,
}

#[derive(Debug)]
struct DownstreamEnd {
    at_ns: u64,
    complete: bool,
}

struct Shared {
    engine: Engine,
    opts: ServeOptions,
    recorder: Arc<Recorder>,
    budget: Arc<MemoryBudget>,
    run_id: Arc<str>,
    run_t0_ns: u64,
    next_exchange: AtomicI64,
    next_conn: AtomicI64,
    in_flight: AtomicI64,
    cut: watch::Receiver<bool>,
    /// Counters updated as each row is submitted (a short, uncontended lock per request:
    /// no task, no channel on the forwarding path).
    live: Mutex<Live>,
    /// Finished exchanges waiting for room in the recorder's queue (at most one per
    /// client connection, by the connection's backlog gate); its peak is reported.
    waiting_rows: AtomicI64,
    waiting_rows_peak: AtomicI64,
    record_failed: OnceLock<RecordError>,
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
struct Pending {
    n: AtomicUsize,
    zero: Notify,
}

struct PendingGuard(Arc<Pending>);

impl PendingGuard {
    fn new(p: &Arc<Pending>) -> PendingGuard {
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

/// The deepest accept queue [`bind_listener`] asks for; the kernel then caps it at
/// `net.core.somaxconn`.
const MAX_LISTEN_BACKLOG: u32 = 65_535;

/// Bind a listening socket whose accept queue holds `backlog` completed connections
/// (the kernel caps it at `net.core.somaxconn`). The queue tokio's `TcpListener::bind`
/// left (128, as `ss -ltn` showed) is too small for a proxy that a campaign opens
/// thousands of connections to at once: a connection that finds the queue full has its
/// SYN dropped, and the client waits a full second for the retransmit. SO_REUSEADDR is
/// set as std does on Unix, so a restarted proxy can take its port back while old
/// connections sit in TIME_WAIT.
pub fn bind_listener(addr: SocketAddr, backlog: u32) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(backlog.clamp(1, MAX_LISTEN_BACKLOG))
}

/// The accept queue [`bind_listener`] gets for `backlog`: what it asks for, capped by
/// `net.core.somaxconn` (read from /proc; `None` where it cannot be read).
pub fn effective_backlog(backlog: u32) -> Option<u32> {
    let cap = std::fs::read_to_string("/proc/sys/net/core/somaxconn").ok()?;
    let cap: u32 = cap.trim().parse().ok()?;
    Some(backlog.clamp(1, MAX_LISTEN_BACKLOG).min(cap))
}

/// Serve until `stop` turns true, then drain (bounded by the grace period), cut what is
/// left, and return the recorder for the caller to finish.
pub async fn run(
    listener: TcpListener,
    opts: ServeOptions,
    engine: Engine,
    recorder: Arc<Recorder>,
    stop: Arc<AtomicBool>,
) -> (ServeStats, Arc<Recorder>) {
    let (cut_tx, cut_rx) = watch::channel(false);
    let proto = if opts.tls.is_some() { "https" } else { "http" };
    let shared = Arc::new(Shared {
        engine,
        budget: MemoryBudget::new(opts.record_memory),
        recorder,
        run_id: Arc::from(opts.run_id.as_str()),
        run_t0_ns: clock::now_ns(),
        next_exchange: AtomicI64::new(0),
        next_conn: AtomicI64::new(0),
        in_flight: AtomicI64::new(0),
        cut: cut_rx,
        live: Mutex::new(Live::default()),
        waiting_rows: AtomicI64::new(0),
        waiting_rows_peak: AtomicI64::new(0),
        record_failed: OnceLock::new(),
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
    let pending = Arc::new(Pending::default());
    let stats_task = shared
        .opts
        .stats_interval
        .map(|every| tokio::spawn(stats_loop(every, Arc::downgrade(&shared))));

    let graceful = GracefulShutdown::new();
    let mut conns = JoinSet::new();
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
                    break;
                }
            }
        }
    }
    drop(listener);

    // Stop: idle keep-alive connections close, in-flight exchanges may finish.
    let grace = shared.opts.grace;
    let drained = tokio::time::timeout(grace, graceful.shutdown())
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
    let recorder = shared.recorder.clone();
    let record_error = shared.record_failed.get().cloned();
    if let Some(t) = stats_task {
        t.abort();
    }
    let mut stats = ServeStats::default();
    if let Ok(live) = shared.live.lock() {
        stats.requests = live.requests;
        stats.by_outcome = live.by_outcome.clone();
    }
    stats.backlog_peak = shared.waiting_rows_peak.load(Ordering::Relaxed).max(0) as u64;
    drop(shared);
    stats.dropped_rows = recorder.dropped();
    stats.record_error = record_error;
    (stats, recorder)
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
        handle(
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

/// The request body on its way up: passed through untouched, copied (up to the record
/// limits) on the side. The copy is delivered when the body ends or is dropped.
pub struct TeeBody {
    inner: Incoming,
    copy: BytesMut,
    len: u64,
    truncated: bool,
    limit: usize,
    budget: Arc<MemoryBudget>,
    held: usize,
    done: Option<oneshot::Sender<TeeResult>>,
}

struct TeeResult {
    body: Bytes,
    len: u64,
    truncated: bool,
    held: usize,
}

impl TeeBody {
    fn deliver(&mut self) {
        if let Some(tx) = self.done.take() {
            let _ = tx.send(TeeResult {
                body: std::mem::take(&mut self.copy).freeze(),
                len: self.len,
                truncated: self.truncated,
                held: std::mem::take(&mut self.held),
            });
        }
    }
}

impl Drop for TeeBody {
    fn drop(&mut self) {
        self.deliver();
        // Bytes still held here were never handed over: give them back.
        self.budget.give_back(self.held);
    }
}

impl Body for TeeBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        let r = Pin::new(&mut this.inner).poll_frame(cx);
        match &r {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.len += data.len() as u64;
                    let room = this.limit.saturating_sub(this.copy.len()).min(data.len());
                    let granted = this.budget.take(room);
                    this.held += granted;
                    if granted < data.len() {
                        this.truncated = true;
                    }
                    this.copy.extend_from_slice(&data[..granted]);
                }
                if this.inner.is_end_stream() {
                    this.deliver();
                }
            }
            Poll::Ready(None) => this.deliver(),
            _ => {}
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The response body handed to the client: frames from the upstream reader through a
/// bounded channel, or a small generated body (502/504). Reports when it ended, and
/// whether completely, to the task that records the exchange.
pub struct ProxyBody {
    rx: Option<mpsc::Receiver<Chunk>>,
    full: Option<Bytes>,
    /// The last frame has been handed to the client connection.
    finished: bool,
    done: Option<OnEnd>,
}

/// What happens when the client's response ends.
enum OnEnd {
    /// Tell the task that reads the upstream body (it records the exchange).
    Notify(oneshot::Sender<DownstreamEnd>),
    /// The upstream body was complete before the head went out: record from here, with
    /// no task of its own (the common case of a small response).
    Record(Box<FastEnd>),
}

/// An exchange whose upstream side is over, waiting only for the client's side.
struct FastEnd {
    sh: Arc<Shared>,
    p: InFlight,
    guard: PendingGuard,
}

impl FastEnd {
    fn finish(self, complete: bool) {
        let FastEnd { sh, p, guard } = self;
        let end = DownstreamEnd {
            at_ns: clock::now_ns(),
            complete,
        };
        let (outcome, message) = if complete {
            (Outcome::Ok, None)
        } else if *sh.cut.borrow() {
            (
                Outcome::ShutdownCut,
                Some("cut at the end of the shutdown grace period".to_string()),
            )
        } else {
            (
                Outcome::ClientAborted,
                Some("the client went away before the response ended".to_string()),
            )
        };
        record_now(&sh, p, outcome, message, Some(end), guard);
    }
}

/// A frame from the upstream reader, and whether it is the body's last.
type Chunk = Result<(Frame<Bytes>, bool), io::Error>;

impl ProxyBody {
    fn report(&mut self, complete: bool) {
        match self.done.take() {
            Some(OnEnd::Notify(tx)) => {
                let _ = tx.send(DownstreamEnd {
                    at_ns: clock::now_ns(),
                    complete,
                });
            }
            Some(OnEnd::Record(f)) => f.finish(complete),
            None => {}
        }
    }
}

impl Drop for ProxyBody {
    fn drop(&mut self) {
        // Dropped before its last frame: the client went away. (A response that has no
        // body by definition, HEAD/204/304, starts out finished.)
        let finished = self.finished;
        self.report(finished);
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        if let Some(b) = self.full.take() {
            self.finished = true;
            self.report(true);
            return Poll::Ready(Some(Ok(Frame::data(b))));
        }
        if self.finished {
            self.report(true);
            return Poll::Ready(None);
        }
        let Some(rx) = self.rx.as_mut() else {
            self.report(true);
            return Poll::Ready(None);
        };
        match rx.poll_recv(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(Ok((frame, last)))) => {
                if last {
                    self.finished = true;
                    self.report(true);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                // The upstream failed after the head: abort the client's response so it
                // cannot look complete.
                self.report(false);
                Poll::Ready(Some(Err(e)))
            }
            Poll::Ready(None) => {
                self.report(true);
                Poll::Ready(None)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.finished || (self.rx.is_none() && self.full.is_none())
    }
}

const HOP_BY_HOP: [&str; 6] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "upgrade",
    "te",
];

/// Remove hop-by-hop headers (RFC 9110 section 7.6.1): `Connection` and every header it
/// names, `Keep-Alive`, `Proxy-Connection`, `Transfer-Encoding`, `Upgrade`, and `TE`
/// except `trailers`.
pub fn strip_hop_by_hop(h: &mut HeaderMap) {
    let named: Vec<HeaderName> = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|s| s.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .collect();
    let wants_trailers = h
        .get_all(header::TE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|s| s.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("trailers"));
    for n in named {
        h.remove(n);
    }
    for n in HOP_BY_HOP {
        h.remove(n);
    }
    if wants_trailers {
        h.insert(header::TE, HeaderValue::from_static("trailers"));
    }
}

fn forwarded_for(ip: std::net::IpAddr) -> String {
    match ip {
        std::net::IpAddr::V4(v4) => v4.to_string(),
        std::net::IpAddr::V6(v6) => format!("\"[{v6}]\""),
    }
}

/// State of one client connection shared by its requests: what it adds to every request
/// it forwards, built once per connection instead of once per request (formatting an
/// address and a `Forwarded` value per request measured as a few percent of serve's CPU),
/// and its recorder back-pressure gate.
struct ClientConn {
    ip: std::net::IpAddr,
    /// `X-Forwarded-For` when the client sent none.
    xff: Option<HeaderValue>,
    /// The last client `Host` seen and the `Forwarded` value made from it.
    last: Mutex<Option<(Option<HeaderValue>, Option<HeaderValue>)>>,
    /// Set while a finished exchange of this connection waits for room in the recorder's
    /// queue: the connection's next request waits for it first. So under `block`, rows
    /// waiting for the writer are bounded by the number of connections, and a slow disk
    /// slows the clients down instead of growing memory (measured before this gate: a
    /// soak whose writer stalled on fsync grew to 24 GB and was OOM-killed).
    backlog: Mutex<Option<oneshot::Receiver<()>>>,
}

impl ClientConn {
    fn new(peer: SocketAddr) -> ClientConn {
        let ip = peer.ip();
        ClientConn {
            ip,
            xff: HeaderValue::from_str(&ip.to_string()).ok(),
            last: Mutex::new(None),
            backlog: Mutex::new(None),
        }
    }

    /// Close the gate until the returned sender is dropped.
    fn hold(&self) -> oneshot::Sender<()> {
        let (tx, rx) = oneshot::channel();
        if let Ok(mut b) = self.backlog.lock() {
            *b = Some(rx);
        }
        tx
    }

    /// Wait until this connection's previous row is in the recorder's queue.
    async fn wait_backlog(&self) {
        let gate = self.backlog.lock().ok().and_then(|mut b| b.take());
        if let Some(rx) = gate {
            let _ = rx.await;
        }
    }

    /// `Forwarded: for=...;proto=...[;host="..."]` for a request whose `Host` is `host`.
    fn forwarded(&self, host: Option<&HeaderValue>, proto: &str) -> Option<HeaderValue> {
        if let Ok(last) = self.last.lock()
            && let Some((h, v)) = last.as_ref()
            && h.as_ref() == host
        {
            return v.clone();
        }
        let mut fwd = format!("for={};proto={proto}", forwarded_for(self.ip));
        if let Some(host) = host.and_then(|v| v.to_str().ok()) {
            fwd.push_str(&format!(";host=\"{}\"", host.replace('"', "")));
        }
        let v = HeaderValue::from_str(&fwd).ok();
        if let Ok(mut last) = self.last.lock() {
            *last = Some((host.cloned(), v.clone()));
        }
        v
    }
}

/// The headers sent upstream: hop-by-hop removed, `Expect` answered here (hyper sends
/// `100 Continue` when the body is first read), forwarding headers added, `Host` kept
/// unless `rewrite_host`.
fn upstream_headers(mut h: HeaderMap, fw: &ClientConn, sh: &Shared) -> HeaderMap {
    strip_hop_by_hop(&mut h);
    h.remove(header::EXPECT);
    if sh.opts.policy == ConnectionPolicy::Fresh {
        // One request per upstream connection: say so, and the worker closes first, so
        // the TIME_WAIT state stays on its side (thousands of them on ours make every
        // connect() search the port table: measured as half of a fresh run's CPU).
        h.insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    let xff = match h.get("x-forwarded-for").and_then(|v| v.to_str().ok()) {
        Some(prev) => HeaderValue::from_str(&format!("{prev}, {}", fw.ip)).ok(),
        None => fw.xff.clone(),
    };
    if let Some(v) = xff {
        h.insert("x-forwarded-for", v);
    }
    h.insert("x-forwarded-proto", HeaderValue::from_static(sh.proto));
    let host = h.get(header::HOST).filter(|v| v.to_str().is_ok()).cloned();
    if let Some(v) = fw.forwarded(host.as_ref(), sh.proto) {
        h.append(header::FORWARDED, v);
    }
    if (sh.opts.rewrite_host || host.is_none())
        && let Some(v) = &sh.upstream_host
    {
        h.insert(header::HOST, v.clone());
    }
    h
}

/// The upstream URL of a request: the upstream origin, its path prefix, then the
/// client's path and query. `&url[sh.origin_len..]` is the request target.
fn upstream_url(sh: &Shared, uri: &Uri) -> String {
    let pq = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    let mut url = String::with_capacity(sh.origin_prefix.len() + pq.len());
    url.push_str(&sh.origin_prefix);
    url.push_str(pq);
    url
}

fn error_response(status: StatusCode, kind: &str, message: &str) -> (Response<ProxyBody>, Bytes) {
    let body = Bytes::from(
        serde_json::to_vec(&serde_json::json!({
            "error": {"type": kind, "message": format!("matrix-proxy: {message}")}
        }))
        .unwrap_or_default(),
    );
    let mut r = Response::new(ProxyBody {
        rx: None,
        full: Some(body.clone()),
        finished: false,
        done: None,
    });
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r.headers_mut()
        .insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
    (r, body)
}

/// Everything known about an exchange except its ending.
struct InFlight {
    cap: Capture,
    started_at_us: i64,
    start_offset_us: i64,
    method: http::Method,
    url: String,
    request_headers: HeaderMap,
    tee: oneshot::Receiver<TeeResult>,
    conn_no: i64,
    index: i64,
    client: Arc<ClientConn>,
}

async fn handle(
    sh: Arc<Shared>,
    guard: PendingGuard,
    slot: Slot,
    client: Arc<ClientConn>,
    conn_no: i64,
    index: i64,
    req: Request<Incoming>,
) -> Result<Response<ProxyBody>, Infallible> {
    client.wait_backlog().await;
    let cap = Capture::start_with_budget(sh.opts.max_record_body, Some(sh.budget.clone()));
    let started_at_us = clock::wall_now_us();
    let start_offset_us = clock::us_between(sh.run_t0_ns, cap.t0_ns);
    sh.in_flight.fetch_add(1, Ordering::Relaxed);
    let (parts, body) = req.into_parts();
    let headers = upstream_headers(parts.headers, &client, &sh);
    // The record's URL; the upstream target is its tail.
    let url = upstream_url(&sh, &parts.uri);
    let target = &url[sh.origin_len..];
    let (tee_tx, tee_rx) = oneshot::channel();
    let tee = TeeBody {
        inner: body,
        copy: BytesMut::new(),
        len: 0,
        truncated: false,
        limit: sh.opts.max_record_body,
        budget: sh.budget.clone(),
        held: 0,
        done: Some(tee_tx),
    };
    let mut up = Request::new(tee);
    *up.method_mut() = parts.method.clone();
    *up.uri_mut() = Uri::try_from(target).unwrap_or_else(|_| Uri::from_static("/"));
    *up.headers_mut() = headers.clone();
    let mut p = InFlight {
        cap,
        started_at_us,
        start_offset_us,
        method: parts.method,
        url,
        request_headers: headers,
        tee: tee_rx,
        conn_no,
        index,
        client,
    };

    let conn = slot.lock().ok().and_then(|mut s| s.take());
    let mut cut = sh.cut.clone();
    let sent = tokio::select! {
        r = tokio::time::timeout(
            sh.opts.upstream_timeout,
            sh.engine.send(conn, &sh.opts.upstream, sh.opts.policy, up, &mut p.cap),
        ) => Some(r),
        _ = cut.wait_for(|c| *c) => None,
    };
    let failure = match sent {
        Some(Ok(Ok((conn, resp)))) => {
            let (mut parts, mut body) = resp.into_parts();
            let no_body = p.method == http::Method::HEAD
                || parts.status.is_informational()
                || parts.status == StatusCode::NO_CONTENT
                || parts.status == StatusCode::NOT_MODIFIED;
            p.cap.response_headers = parts.headers.clone();
            strip_hop_by_hop(&mut parts.headers);
            // If the first body frame is already here, queue it before the head goes out:
            // hyper then writes head and body in one go instead of flushing the head alone
            // (measured: a second write per response, and a second wake-up of the client).
            // Never waits: a stream's head is not held back for its first event.
            let mut first = None;
            let mut initial_failure = None;
            let mut ended = false;
            if !no_body || body.is_end_stream() {
                let polled = {
                    let mut next = std::pin::pin!(Engine::next_frame(&mut body, &mut p.cap));
                    std::future::poll_fn(|cx| Poll::Ready(next.as_mut().poll(cx))).await
                };
                match polled {
                    Poll::Ready(Ok(Some(frame))) => {
                        let last = p.cap.end_ns.is_some() || frame.is_trailers();
                        first = Some(Ok((frame, last)));
                    }
                    Poll::Ready(Err(e)) => {
                        first = Some(Err(io::Error::other(e.message.clone())));
                        initial_failure = Some((Outcome::Transport, e.message));
                    }
                    Poll::Ready(Ok(None)) => ended = true,
                    Poll::Pending => {}
                }
            }
            // The whole upstream body is here (one data frame, or none): no reader task,
            // no channel; the row is written when the client's side ends.
            let whole = match first.take() {
                Some(Ok((frame, true))) if frame.is_data() => Some(frame.into_data().ok()),
                None if ended => Some(None),
                other => {
                    first = other;
                    None
                }
            };
            if let Some(data) = whole
                && p.cap.stream_incomplete().is_none()
            {
                // The body has ended: its end stamp is already there, no clock read.
                let end = p.cap.end_ns.unwrap_or_else(clock::now_ns);
                p.cap.finish(end);
                if let Some(c) = Engine::release(conn, sh.opts.policy)
                    && let Ok(mut s) = slot.lock()
                {
                    *s = Some(c);
                }
                let finished = no_body || data.is_none();
                let end = FastEnd { sh, p, guard };
                return Ok(Response::from_parts(
                    parts,
                    ProxyBody {
                        rx: None,
                        full: data,
                        finished,
                        done: Some(OnEnd::Record(Box::new(end))),
                    },
                ));
            }
            let (tx, rx) = mpsc::channel(sh.opts.buffer_frames.max(1));
            if let Some(chunk) = first {
                let _ = tx.try_send(chunk);
            }
            let (done_tx, done_rx) = oneshot::channel();
            let resp = Response::from_parts(
                parts,
                ProxyBody {
                    rx: Some(rx),
                    full: None,
                    finished: no_body,
                    done: Some(OnEnd::Notify(done_tx)),
                },
            );
            tokio::spawn(pump_and_record(
                sh,
                guard,
                p,
                conn,
                body,
                tx,
                done_rx,
                slot,
                initial_failure,
            ));
            return Ok(resp);
        }
        Some(Ok(Err(e))) => (
            StatusCode::BAD_GATEWAY,
            "bad_gateway",
            Outcome::Transport,
            format!("upstream {}: {}", sh.opts.upstream.authority, e.message),
        ),
        Some(Err(_)) => (
            StatusCode::GATEWAY_TIMEOUT,
            "gateway_timeout",
            Outcome::Timeout,
            format!(
                "upstream {} sent no response head within --upstream-timeout ({} s)",
                sh.opts.upstream.authority,
                sh.opts.upstream_timeout.as_secs_f64()
            ),
        ),
        None => (
            StatusCode::SERVICE_UNAVAILABLE,
            "shutting_down",
            Outcome::ShutdownCut,
            "cut at the end of the shutdown grace period".to_string(),
        ),
    };
    let (status, kind, outcome, message) = failure;
    p.cap.finish(clock::now_ns());
    let (mut resp, _) = error_response(status, kind, &message);
    let (done_tx, done_rx) = oneshot::channel();
    resp.body_mut().done = Some(OnEnd::Notify(done_tx));
    tokio::spawn(async move {
        let end = wait_downstream(&sh, done_rx).await;
        record(&sh, p, outcome, Some(message), end).await;
        drop(guard);
    });
    Ok(resp)
}

async fn wait_downstream(
    sh: &Shared,
    done: oneshot::Receiver<DownstreamEnd>,
) -> Option<DownstreamEnd> {
    let mut cut = sh.cut.clone();
    tokio::select! {
        r = done => r.ok(),
        _ = cut.wait_for(|c| *c) => None,
    }
}

/// Read the upstream body independently of the client, into the bounded channel; then
/// wait for the client's side to end and record the exchange.
#[allow(clippy::too_many_arguments)]
async fn pump_and_record(
    sh: Arc<Shared>,
    guard: PendingGuard,
    mut p: InFlight,
    conn: Conn<TeeBody>,
    mut body: Incoming,
    tx: mpsc::Sender<Chunk>,
    done_rx: oneshot::Receiver<DownstreamEnd>,
    slot: Slot,
    initial_failure: Option<(Outcome, String)>,
) {
    let idle = sh.opts.upstream_idle_timeout;
    let mut cut = sh.cut.clone();
    let failure = match initial_failure {
        Some(f) => Some(f),
        None => {
            let pump = async {
                loop {
                    match tokio::time::timeout(idle, Engine::next_frame(&mut body, &mut p.cap))
                        .await
                    {
                        Err(_) => {
                            let msg = format!(
                                "upstream sent no body bytes for --upstream-idle-timeout ({} s)",
                                idle.as_secs_f64()
                            );
                            let _ = tx.send(Err(io::Error::other(msg.clone()))).await;
                            return Some((Outcome::Timeout, msg));
                        }
                        Ok(Err(e)) => {
                            let _ = tx.send(Err(io::Error::other(e.message.clone()))).await;
                            return Some((Outcome::Transport, e.message));
                        }
                        Ok(Ok(None)) => return None,
                        Ok(Ok(Some(frame))) => {
                            // Trailers always end a body.
                            let last = p.cap.end_ns.is_some() || frame.is_trailers();
                            if tx.send(Ok((frame, last))).await.is_err() {
                                return Some((
                                    Outcome::ClientAborted,
                                    "the client went away before the response ended".into(),
                                ));
                            }
                        }
                    }
                }
            };
            tokio::select! {
                f = pump => f,
                _ = cut.wait_for(|c| *c) => Some((Outcome::ShutdownCut, "cut at the end of the shutdown grace period".into())),
            }
        }
    };
    drop(tx);
    p.cap.finish(clock::now_ns());
    if failure.is_none()
        && let Some(c) = Engine::release(conn, sh.opts.policy)
        && let Ok(mut s) = slot.lock()
    {
        *s = Some(c);
    }
    let failure = failure.or_else(|| p.cap.stream_incomplete().map(|m| (Outcome::Transport, m)));
    let end = wait_downstream(&sh, done_rx).await;
    let (outcome, message) = match (failure, &end) {
        (Some((o, m)), _) => (o, Some(m)),
        (None, Some(e)) if e.complete => (Outcome::Ok, None),
        (None, Some(_)) => (
            Outcome::ClientAborted,
            Some("the client went away before the response ended".into()),
        ),
        (None, None) => (
            Outcome::ShutdownCut,
            Some("cut at the end of the shutdown grace period".into()),
        ),
    };
    record(&sh, p, outcome, message, end).await;
    drop(guard);
}

async fn record(
    sh: &Arc<Shared>,
    mut p: InFlight,
    outcome: Outcome,
    message: Option<String>,
    end: Option<DownstreamEnd>,
) {
    let tee = match tokio::time::timeout(Duration::from_secs(1), &mut p.tee).await {
        Ok(Ok(t)) => t,
        _ => TeeResult {
            body: Bytes::new(),
            len: 0,
            truncated: true,
            held: 0,
        },
    };
    let client = p.client.clone();
    let rec = build_record(sh, p, tee, outcome, message, end);
    if let Some(wait) = queue_row(sh, &client, rec) {
        wait.await;
    }
}

/// Record without waiting when nothing needs waiting for (the request body copy is
/// delivered and the recorder's queue has room); otherwise hand the rest to a task.
fn record_now(
    sh: &Arc<Shared>,
    mut p: InFlight,
    outcome: Outcome,
    message: Option<String>,
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
            record(&sh, p, outcome, message, end).await;
            drop(guard);
        }));
        return;
    };
    let client = p.client.clone();
    let rec = build_record(sh, p, tee, outcome, message, end);
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
    let r = match sh.opts.on_record_full {
        OnRecordFull::Drop => sh.recorder.try_submit(rec).map(|_| ()),
        OnRecordFull::Block => match sh.recorder.submit_now(rec) {
            Ok(None) => Ok(()),
            Ok(Some(rec)) => {
                let gate = client.hold();
                let n = sh.waiting_rows.fetch_add(1, Ordering::Relaxed) + 1;
                sh.waiting_rows_peak.fetch_max(n, Ordering::Relaxed);
                let sh = sh.clone();
                return Some(async move {
                    if let Err(e) = sh.recorder.submit(rec).await {
                        let _ = sh.record_failed.set(e);
                    }
                    sh.waiting_rows.fetch_sub(1, Ordering::Relaxed);
                    drop(gate);
                });
            }
            Err(e) => Err(e),
        },
    };
    if let Err(e) = r {
        let _ = sh.record_failed.set(e);
    }
    None
}

/// The row of a finished exchange; also counts it in the live counters.
fn build_record(
    sh: &Shared,
    mut p: InFlight,
    tee: TeeResult,
    outcome: Outcome,
    message: Option<String>,
    end: Option<DownstreamEnd>,
) -> ExchangeRecord {
    sh.in_flight.fetch_sub(1, Ordering::Relaxed);
    let mut timings = p.cap.timings();
    timings.downstream_done_us = end
        .as_ref()
        .map(|e| clock::us_between(p.cap.t0_ns, e.at_ns));
    let mut memory: Option<BudgetHold> = p.cap.take_budget_hold();
    if let Some(m) = memory.as_mut() {
        m.add(tee.held);
    }
    if let Ok(mut live) = sh.live.lock() {
        live.requests += 1;
        *live.by_outcome.entry(outcome).or_insert(0) += 1;
        if sh.opts.stats_interval.is_some() {
            live.window_n += 1;
            if outcome == Outcome::Ok
                && let Some(t) = timings.total_us
            {
                live.window.push(t);
            }
        }
    }
    ExchangeRecord {
        run_id: sh.run_id.clone(),
        exchange_id: sh.next_exchange.fetch_add(1, Ordering::Relaxed),
        phase: Phase::Live,
        case_name: None,
        variant: None,
        concurrency: None,
        repetition: None,
        dispatch_index: p.index,
        worker: (p.conn_no % i64::from(i32::MAX)) as i32,
        connection_id: p.cap.connection_id,
        connection_reused: p.cap.connection_reused,
        connection_retried: p.cap.connection_retried,
        started_at_us: p.started_at_us,
        start_offset_us: p.start_offset_us,
        method: p.method,
        url: Arc::from(p.url),
        request_headers: p.request_headers,
        request_body_len: tee.len as i64,
        request_body_truncated: tee.truncated,
        request_body: tee.body,
        status: p.cap.status.map(|s| i32::from(s.as_u16())),
        response_headers: std::mem::take(&mut p.cap.response_headers),
        response_body_len: p.cap.body_len as i64,
        response_body_truncated: p.cap.body_truncated,
        response_body: std::mem::take(&mut p.cap.body).freeze(),
        timings,
        stream: p.cap.stream_columns(),
        outcome,
        error_message: message,
        oracle_mismatch_pointer: None,
        memory,
    }
}

/// Live counters on stderr every `every`.
async fn stats_loop(every: Duration, shared: std::sync::Weak<Shared>) {
    let mut tick = tokio::time::interval(every);
    tick.tick().await;
    loop {
        tick.tick().await;
        let Some(sh) = shared.upgrade() else { return };
        let in_flight = sh.in_flight.load(Ordering::Relaxed);
        let (requests, window_n, window, errors) = {
            let Ok(mut live) = sh.live.lock() else { return };
            let errors: Vec<String> = live
                .by_outcome
                .iter()
                .filter(|(o, _)| **o != Outcome::Ok)
                .map(|(o, n)| format!("{}={n}", o.as_str()))
                .collect();
            let n = std::mem::take(&mut live.window_n);
            (live.requests, n, std::mem::take(&mut live.window), errors)
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
