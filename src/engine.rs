//! The exchange engine: send one request to the worker and measure it at the boundary.
//!
//! Both drivers (`replay`, and later `serve`) send every request through [`Engine::exchange`].
//! It owns connecting (TCP, then TLS through rustls), the keep-alive reconnection rule, and
//! the timing hooks. Timing state lives in a [`Capture`] that the caller owns and passes
//! by `&mut`, *outside* the future: when a deadline cancels the exchange, everything that
//! had arrived is still there to be recorded.
//!
//! Socket-level stamps (last request byte written, first response byte read) are taken
//! by [`TimedIo`], a thin wrapper around the connection's stream that stores monotonic
//! nanoseconds into atomics; the forwarding path takes no lock. The engine never reads
//! the wall clock, never retries except under the keep-alive rule, never follows a
//! redirect and never consults proxy environment variables.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, Request, StatusCode};
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming};
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::clock;
use crate::plan::{ConnectionPolicy, Endpoint, Scheme};
use crate::record::{BudgetHold, MemoryBudget, StreamColumns, Timings};
use crate::sse::{Event, LineTooLong, SseParser, StreamTracker};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why an exchange failed, from the engine's point of view (always the upstream side).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineError {
    pub message: String,
}

impl EngineError {
    fn new(context: &str, err: &(dyn std::error::Error + 'static)) -> EngineError {
        EngineError {
            message: format!("{context}: {}", error_chain(err)),
        }
    }
}

/// `err` and its sources joined by ": ", without repeating a source that the message
/// already contains.
pub fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut s = err.to_string();
    let mut cur = err.source();
    while let Some(e) = cur {
        let m = e.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        cur = e.source();
    }
    s
}

/// Lock-free socket stamps shared between a connection's I/O and the exchange using it.
#[derive(Debug, Default)]
pub struct IoStamps {
    last_write_ns: AtomicU64,
    first_read_ns: AtomicU64,
}

impl IoStamps {
    fn reset(&self) {
        self.last_write_ns.store(0, Ordering::Relaxed);
        self.first_read_ns.store(0, Ordering::Relaxed);
    }
    fn get(a: &AtomicU64) -> Option<u64> {
        match a.load(Ordering::Relaxed) {
            0 => None,
            v => Some(v),
        }
    }
}

/// The connection's byte stream: plain TCP or rustls over TCP.
enum Stream {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

/// Stamps the last write and the first read of each exchange on the monotonic clock.
/// It sits above TLS, so handshake and session-ticket records never count as response bytes.
struct TimedIo {
    inner: Stream,
    stamps: Arc<IoStamps>,
}

impl AsyncRead for TimedIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        let r = match &mut this.inner {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        };
        if let Poll::Ready(Ok(())) = r
            && buf.filled().len() > before
            && this.stamps.first_read_ns.load(Ordering::Relaxed) == 0
        {
            this.stamps
                .first_read_ns
                .store(clock::now_ns(), Ordering::Relaxed);
        }
        r
    }
}

impl AsyncWrite for TimedIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let r = match &mut this.inner {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        };
        if let Poll::Ready(Ok(n)) = r
            && n > 0
        {
            this.stamps
                .last_write_ns
                .store(clock::now_ns(), Ordering::Relaxed);
        }
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let r = match &mut this.inner {
            Stream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        };
        if let Poll::Ready(Ok(n)) = r
            && n > 0
        {
            this.stamps
                .last_write_ns
                .store(clock::now_ns(), Ordering::Relaxed);
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        match &self.inner {
            Stream::Plain(s) => s.is_write_vectored(),
            Stream::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.inner {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.inner {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// One open HTTP/1.1 connection to the worker.
pub struct Conn<B> {
    pub id: i64,
    sender: SendRequest<B>,
    stamps: Arc<IoStamps>,
}

/// Everything measured about one exchange. Owned by the caller, filled by the engine's
/// lifecycle hooks (connected, TLS done, head received, each body frame, end).
#[derive(Debug)]
pub struct Capture {
    /// The exchange's t0 on the monotonic clock.
    pub t0_ns: u64,
    pub connection_id: Option<i64>,
    pub connection_reused: bool,
    pub connection_retried: bool,
    pub connect_ns: Option<u64>,
    pub tls_ns: Option<u64>,
    pub tls_resumed: Option<bool>,
    pub request_sent_ns: Option<u64>,
    pub first_byte_ns: Option<u64>,
    pub first_body_ns: Option<u64>,
    pub end_ns: Option<u64>,
    pub status: Option<StatusCode>,
    pub response_headers: HeaderMap,
    /// Body bytes kept (copied out of hyper's buffers), at most `body_limit`.
    pub body: BytesMut,
    /// True length of the response body seen so far.
    pub body_len: u64,
    pub body_truncated: bool,
    body_limit: usize,
    budget: Option<Arc<MemoryBudget>>,
    budget_held: usize,
    stamps: Option<Arc<IoStamps>>,
    sse: Option<Box<SseState>>,
}

/// Event-stream state of one exchange: the parser and what the events said so far.
#[derive(Debug, Default)]
struct SseState {
    parser: SseParser,
    tracker: StreamTracker,
    scratch: Vec<Event>,
    error: Option<LineTooLong>,
}

impl SseState {
    fn feed(&mut self, data: &[u8], now_ns: u64) {
        if self.error.is_some() {
            return;
        }
        if let Err(e) = self.parser.feed(data, now_ns, &mut self.scratch) {
            self.error = Some(e);
        }
        for ev in self.scratch.drain(..) {
            self.tracker.on_event(&ev);
        }
    }
}

impl Capture {
    /// Start an exchange now; keep at most `body_limit` response body bytes.
    pub fn start(body_limit: usize) -> Capture {
        Capture::start_with_budget(body_limit, None)
    }

    /// Like [`Capture::start`], also drawing recorded bytes from a global `budget`.
    pub fn start_with_budget(body_limit: usize, budget: Option<Arc<MemoryBudget>>) -> Capture {
        Capture {
            t0_ns: clock::now_ns(),
            connection_id: None,
            connection_reused: false,
            connection_retried: false,
            connect_ns: None,
            tls_ns: None,
            tls_resumed: None,
            request_sent_ns: None,
            first_byte_ns: None,
            first_body_ns: None,
            end_ns: None,
            status: None,
            response_headers: HeaderMap::new(),
            body: BytesMut::new(),
            body_len: 0,
            body_truncated: false,
            body_limit,
            budget,
            budget_held: 0,
            stamps: None,
            sse: None,
        }
    }

    /// Hook: a response body frame arrived at `now_ns`. Copies what the limits allow.
    pub fn on_body_frame(&mut self, data: &[u8], now_ns: u64) {
        if self.first_body_ns.is_none() && !data.is_empty() {
            self.first_body_ns = Some(now_ns);
        }
        self.body_len += data.len() as u64;
        let room = self
            .body_limit
            .saturating_sub(self.body.len())
            .min(data.len());
        let granted = match &self.budget {
            Some(b) => b.take(room),
            None => room,
        };
        self.budget_held += if self.budget.is_some() { granted } else { 0 };
        if data.len() > granted {
            self.body_truncated = true;
        }
        self.body.extend_from_slice(&data[..granted]);
        if let Some(sse) = self.sse.as_mut() {
            sse.feed(data, now_ns);
        }
    }

    /// Hook: the response head says `text/event-stream`; stamp every event from now on.
    pub fn on_event_stream(&mut self) {
        self.sse = Some(Box::default());
    }

    /// Why a stream that ended cleanly is still incomplete: an OpenAI-style stream must end
    /// with `data: [DONE]`, and no event line may exceed the parser's limit.
    pub fn stream_incomplete(&self) -> Option<String> {
        let sse = self.sse.as_ref()?;
        if let Some(e) = &sse.error {
            return Some(format!("event stream: {e}"));
        }
        (sse.tracker.openai && !sse.tracker.done)
            .then(|| "OpenAI-style event stream ended without data: [DONE]".to_string())
    }

    /// The stream columns of the row (`None` when the response was not an event stream).
    pub fn stream_columns(&self) -> Option<StreamColumns> {
        let sse = self.sse.as_ref()?;
        let t = &sse.tracker;
        let offs = |v: &[u64]| {
            v.iter()
                .map(|&n| clock::us_between(self.t0_ns, n))
                .collect::<Vec<i64>>()
        };
        let event_offsets_us = offs(&t.event_offsets_ns);
        // Content events: those carrying generated text in an OpenAI-style stream; for any
        // other event stream, every event but `[DONE]`.
        let content_offsets_us = if t.openai {
            offs(&t.content_ns)
        } else {
            offs(&t.event_offsets_ns)
        };
        let ttft_us = content_offsets_us.first().copied();
        let (output_tokens, source) = match t.usage_field("completion_tokens") {
            Some(n) => (Some(n), "usage"),
            None => (Some(content_offsets_us.len() as i64), "events"),
        };
        let total_us = self.us(self.end_ns);
        let tpot_us = match (total_us, ttft_us, output_tokens) {
            (Some(total), Some(ttft), Some(n)) if n > 1 => Some((total - ttft) / (n - 1)),
            _ => None,
        };
        Some(StreamColumns {
            event_count: t.events as i64,
            event_offsets_us,
            content_offsets_us,
            ttft_us,
            tpot_us,
            output_tokens,
            output_tokens_source: source,
            prompt_tokens: t.usage_field("prompt_tokens"),
        })
    }

    /// The memory this capture's recorded bytes hold in the global budget; released
    /// when the row has been written.
    pub fn take_budget_hold(&mut self) -> Option<BudgetHold> {
        let budget = self.budget.clone()?;
        let bytes = std::mem::take(&mut self.budget_held);
        Some(BudgetHold::new(budget, bytes))
    }

    /// Timing columns of the row, in microseconds from t0.
    pub fn timings(&self) -> Timings {
        Timings {
            connect_us: self.us(self.connect_ns),
            tls_us: self.us(self.tls_ns),
            tls_resumed: self.tls_resumed,
            request_sent_us: self.us(self.request_sent_ns),
            first_byte_us: self.us(self.first_byte_ns),
            first_body_us: self.us(self.first_body_ns),
            total_us: self.us(self.end_ns),
            downstream_done_us: None,
        }
    }

    /// Pull the socket stamps of the connection in use (also after a cancel), and close
    /// the exchange's clock at `now_ns` if the body did not already end it.
    pub fn finish(&mut self, now_ns: u64) {
        if let Some(st) = self.stamps.take() {
            if self.request_sent_ns.is_none() {
                self.request_sent_ns = IoStamps::get(&st.last_write_ns);
            }
            if self.first_byte_ns.is_none() {
                self.first_byte_ns = IoStamps::get(&st.first_read_ns);
            }
        }
        if self.end_ns.is_none() {
            self.end_ns = Some(now_ns);
        }
    }

    /// `stamp - t0` in microseconds.
    pub fn us(&self, stamp: Option<u64>) -> Option<i64> {
        stamp.map(|t| clock::us_between(self.t0_ns, t))
    }
}

/// TLS settings for https workers.
#[derive(Debug, Clone, Default)]
pub struct TlsOptions {
    /// PEM file of CA certificates to trust instead of the platform's roots.
    pub ca_file: Option<std::path::PathBuf>,
}

/// Opens connections and runs exchanges. Cheap to share (`Arc`).
pub struct Engine {
    /// TLS config for `fresh` connections: resumption disabled, so every sample pays a
    /// full handshake.
    tls_fresh: Option<Arc<rustls::ClientConfig>>,
    /// TLS config for keep-alive reconnections: resumption allowed.
    tls_resume: Option<Arc<rustls::ClientConfig>>,
    next_conn_id: AtomicI64,
}

impl Engine {
    /// `need_tls`: build TLS configs now (so a bad CA file is an input error before any
    /// output exists).
    pub fn new(need_tls: bool, tls: &TlsOptions) -> Result<Engine, String> {
        let (tls_fresh, tls_resume) = if need_tls {
            let base = client_tls_config(tls)?;
            let mut fresh = base.clone();
            fresh.resumption = rustls::client::Resumption::disabled();
            (Some(Arc::new(fresh)), Some(Arc::new(base)))
        } else {
            (None, None)
        };
        Ok(Engine {
            tls_fresh,
            tls_resume,
            next_conn_id: AtomicI64::new(0),
        })
    }

    /// Open a connection to `ep`'s origin, recording connect/TLS stamps in `cap`.
    pub async fn connect<B>(
        &self,
        ep: &Endpoint,
        policy: ConnectionPolicy,
        cap: &mut Capture,
    ) -> Result<Conn<B>, EngineError>
    where
        B: Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<BoxError>,
    {
        let tcp = TcpStream::connect((ep.host.as_str(), ep.port))
            .await
            .map_err(|e| EngineError::new(&format!("connect to {}:{}", ep.host, ep.port), &e))?;
        cap.connect_ns = Some(clock::now_ns());
        let _ = tcp.set_nodelay(true);
        let stream = match ep.scheme {
            Scheme::Http => Stream::Plain(tcp),
            Scheme::Https => {
                let config = match policy {
                    ConnectionPolicy::Fresh => self.tls_fresh.clone(),
                    ConnectionPolicy::KeepAlive => self.tls_resume.clone(),
                }
                .ok_or_else(|| EngineError {
                    message: "internal: https endpoint without a TLS configuration".into(),
                })?;
                let name = ServerName::try_from(ep.host.clone())
                    .map_err(|e| EngineError::new(&format!("tls server name '{}'", ep.host), &e))?;
                let tls = tokio_rustls::TlsConnector::from(config)
                    .connect(name, tcp)
                    .await
                    .map_err(|e| EngineError::new("tls handshake", &e))?;
                cap.tls_ns = Some(clock::now_ns());
                cap.tls_resumed = Some(matches!(
                    tls.get_ref().1.handshake_kind(),
                    Some(rustls::HandshakeKind::Resumed)
                ));
                Stream::Tls(Box::new(tls))
            }
        };
        let stamps = Arc::new(IoStamps::default());
        let io = TimedIo {
            inner: stream,
            stamps: stamps.clone(),
        };
        let (sender, conn) = http1::Builder::new()
            .handshake(TokioIo::new(io))
            .await
            .map_err(|e| EngineError::new("http handshake", &e))?;
        tokio::spawn(async move {
            // Errors surface through the request future; the driver just ends.
            let _ = conn.await;
        });
        let id = self.next_conn_id.fetch_add(1, Ordering::Relaxed);
        cap.connection_id = Some(id);
        Ok(Conn { id, sender, stamps })
    }

    /// Send `req` and wait for the response head. `conn` is the caller's connection to
    /// reuse, if any (taken only under `keep-alive`). Returns the connection that carried
    /// the request (hand it back with [`Engine::release`] once the body has ended) and the
    /// response, whose body the caller reads with [`Engine::next_frame`].
    ///
    /// Keep-alive rule: a reused connection that the worker had already closed (hyper hands
    /// the request back unsent) is replaced and the request is sent once more on the new
    /// connection (`connection_retried`). There are no other retries.
    pub async fn send<B>(
        &self,
        conn: Option<Conn<B>>,
        ep: &Endpoint,
        policy: ConnectionPolicy,
        req: Request<B>,
        cap: &mut Capture,
    ) -> Result<(Conn<B>, http::Response<Incoming>), EngineError>
    where
        B: Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<BoxError>,
    {
        let reusable = match conn {
            Some(c) if policy == ConnectionPolicy::KeepAlive && !c.sender.is_closed() => Some(c),
            _ => None,
        };
        let mut conn = match reusable {
            Some(mut c) => {
                if c.sender.ready().await.is_ok() {
                    cap.connection_reused = true;
                    cap.connection_id = Some(c.id);
                    c
                } else {
                    // Closed while idle: nothing was sent; open a new one.
                    self.connect(ep, policy, cap).await?
                }
            }
            None => self.connect(ep, policy, cap).await?,
        };
        conn.stamps.reset();
        cap.stamps = Some(conn.stamps.clone());
        conn.sender
            .ready()
            .await
            .map_err(|e| EngineError::new("connection not ready", &e))?;
        let resp = match conn.sender.try_send_request(req).await {
            Ok(resp) => resp,
            Err(mut e) => match e.take_message() {
                Some(req) if cap.connection_reused => {
                    // The worker closed the reused connection before it took the request.
                    cap.connection_reused = false;
                    cap.connection_retried = true;
                    conn = self.connect(ep, policy, cap).await?;
                    cap.stamps = Some(conn.stamps.clone());
                    conn.sender
                        .ready()
                        .await
                        .map_err(|e| EngineError::new("connection not ready", &e))?;
                    conn.sender
                        .send_request(req)
                        .await
                        .map_err(|e| EngineError::new("send request", &e))?
                }
                _ => return Err(EngineError::new("send request", &e.into_error())),
            },
        };
        cap.request_sent_ns = IoStamps::get(&conn.stamps.last_write_ns);
        cap.first_byte_ns = IoStamps::get(&conn.stamps.first_read_ns).or(Some(clock::now_ns()));
        cap.status = Some(resp.status());
        let is_sse = resp
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| {
                ct.trim_start()
                    .to_ascii_lowercase()
                    .starts_with("text/event-stream")
            });
        if is_sse {
            cap.on_event_stream();
        }
        Ok((conn, resp))
    }

    /// Read the next response body frame, stamping it into `cap` (and copying data, up to
    /// the capture's limit, out of hyper's buffers). `Ok(None)` is the end of the body.
    pub async fn next_frame(
        body: &mut Incoming,
        cap: &mut Capture,
    ) -> Result<Option<Frame<Bytes>>, EngineError> {
        if body.is_end_stream() {
            cap.end_ns.get_or_insert_with(clock::now_ns);
            return Ok(None);
        }
        match body.frame().await {
            Some(Ok(frame)) => {
                let now = clock::now_ns();
                if let Some(data) = frame.data_ref() {
                    cap.on_body_frame(data, now);
                }
                if body.is_end_stream() {
                    cap.end_ns = Some(now);
                }
                Ok(Some(frame))
            }
            Some(Err(e)) => Err(EngineError::new("read response body", &e)),
            None => {
                cap.end_ns.get_or_insert_with(clock::now_ns);
                Ok(None)
            }
        }
    }

    /// Keep a connection whose exchange ended cleanly for the next request (keep-alive
    /// only, and only if the worker did not close it).
    pub fn release<B>(conn: Conn<B>, policy: ConnectionPolicy) -> Option<Conn<B>> {
        (policy == ConnectionPolicy::KeepAlive && !conn.sender.is_closed()).then_some(conn)
    }

    /// Run one whole exchange: send, read the body into `cap`, and refill `slot` with the
    /// connection when the exchange ended cleanly.
    pub async fn exchange<B>(
        &self,
        slot: &mut Option<Conn<B>>,
        ep: &Endpoint,
        policy: ConnectionPolicy,
        req: Request<B>,
        cap: &mut Capture,
    ) -> Result<(), EngineError>
    where
        B: Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<BoxError>,
    {
        let (conn, resp) = self.send(slot.take(), ep, policy, req, cap).await?;
        let (parts, mut body) = resp.into_parts();
        cap.response_headers = parts.headers;
        while Engine::next_frame(&mut body, cap).await?.is_some() {}
        *slot = Engine::release(conn, policy);
        Ok(())
    }
}

fn client_tls_config(opts: &TlsOptions) -> Result<rustls::ClientConfig, String> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    match &opts.ca_file {
        Some(path) => {
            let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
                .map_err(|e| format!("{}: cannot read CA certificates: {e}", path.display()))?
                .collect::<Result<_, _>>()
                .map_err(|e| format!("{}: not a PEM certificate file: {e}", path.display()))?;
            if certs.is_empty() {
                return Err(format!(
                    "{}: contains no PEM certificate (expected -----BEGIN CERTIFICATE-----)",
                    path.display()
                ));
            }
            for c in certs {
                roots
                    .add(c)
                    .map_err(|e| format!("{}: invalid CA certificate: {e}", path.display()))?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            for c in found.certs {
                let _ = roots.add(c);
            }
            if roots.is_empty() {
                return Err(
                    "no platform CA certificates found; pass --ca-cert FILE to trust a CA".into(),
                );
            }
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("tls configuration: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}
