//! The exchange engine: send one request to the worker and measure it at the boundary.
//!
//! Both drivers send every request through it: replay with `Engine::exchange_lean` (the
//! lean client of `lean.rs`: frozen request bytes, `http1::codec` framing), serve
//! with [`Engine::send`] and then [`Engine::next_frame`] for each body frame. It owns
//! connecting (TCP, then TLS through rustls), the keep-alive reconnection rule, and the
//! timing hooks. Timing state lives in a [`Capture`] that the caller owns and passes by
//! `&mut`, *outside* the future: when a deadline cancels the exchange, everything that
//! had arrived is still there to be recorded.
//!
//! Socket-level stamps (last request byte written, first response byte read) are taken
//! by `net::timed_io::TimedIo`, a thin wrapper around the connection's stream that stores
//! monotonic nanoseconds into atomics; the forwarding path takes no lock. The engine never
//! reads the wall clock, never retries except under the keep-alive rule, never follows a
//! redirect and never consults proxy environment variables. Failures carry their side
//! ([`ExchangeError`]); `http1/` holds the HTTP/1 message rules both drivers share.

pub(crate) mod capture;
pub(crate) mod error;
pub(crate) mod http1;
pub(crate) mod lean;

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use bytes::Bytes;
use http::Request;
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming};
use hyper::client::conn::http1::{self as hyper_http1, SendRequest};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;

pub(crate) use capture::{BodyCopy, Capture, Captured, CopiedBody};
pub(crate) use error::{BoxError, ExchangeError};

use crate::clock;
use crate::model::{ConnectionPolicy, Endpoint, Scheme};
use crate::net::timed_io::{IoStamps, Stream, TimedIo};
use crate::net::tls::{self, TlsOptions};

/// One open HTTP/1.1 connection to the worker.
pub(crate) struct Conn<B> {
    id: i64,
    sender: SendRequest<B>,
    stamps: Arc<IoStamps>,
}

/// Opens connections and runs exchanges. Cheap to share (`Arc`).
pub(crate) struct Engine {
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
    pub(crate) fn new(need_tls: bool, tls: &TlsOptions) -> Result<Engine, String> {
        let (tls_fresh, tls_resume) = if need_tls {
            let base = tls::client_config(tls)?;
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
    pub(crate) async fn connect<B>(
        &self,
        ep: &Endpoint,
        policy: ConnectionPolicy,
        cap: &mut Capture,
    ) -> Result<Conn<B>, ExchangeError>
    where
        B: Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<BoxError>,
    {
        let io = self.open_stream(ep, policy, cap).await?;
        let stamps = io.stamps.clone();
        let (sender, conn) = hyper_http1::Builder::new()
            .handshake(TokioIo::new(io))
            .await
            .map_err(|e| ExchangeError::upstream("http handshake", &e))?;
        tokio::spawn(async move {
            // Errors surface through the request future; the driver just ends.
            let _ = conn.await;
        });
        let id = cap.connection_id.unwrap_or(-1);
        Ok(Conn { id, sender, stamps })
    }

    /// TCP (and TLS for https) to `ep`'s origin, wrapped for socket stamps; connect and TLS
    /// stamps go into `cap`, and the connection gets its id.
    pub(crate) async fn open_stream(
        &self,
        ep: &Endpoint,
        policy: ConnectionPolicy,
        cap: &mut Capture,
    ) -> Result<TimedIo, ExchangeError> {
        let tcp = TcpStream::connect((ep.host.as_str(), ep.port))
            .await
            .map_err(|e| {
                ExchangeError::upstream(&format!("connect to {}:{}", ep.host, ep.port), &e)
            })?;
        cap.connect_ns = Some(clock::now_ns());
        let _ = tcp.set_nodelay(true);
        let stream = match ep.scheme {
            Scheme::Http => Stream::Plain(tcp),
            Scheme::Https => {
                let config = match policy {
                    ConnectionPolicy::Fresh => self.tls_fresh.clone(),
                    ConnectionPolicy::KeepAlive => self.tls_resume.clone(),
                }
                .ok_or_else(|| {
                    ExchangeError::upstream_message(
                        "internal: https endpoint without a TLS configuration".into(),
                    )
                })?;
                let name = ServerName::try_from(ep.host.clone()).map_err(|e| {
                    ExchangeError::upstream(&format!("tls server name '{}'", ep.host), &e)
                })?;
                let tls = tokio_rustls::TlsConnector::from(config)
                    .connect(name, tcp)
                    .await
                    .map_err(|e| ExchangeError::upstream("tls handshake", &e))?;
                cap.tls_ns = Some(clock::now_ns());
                cap.tls_resumed = Some(matches!(
                    tls.get_ref().1.handshake_kind(),
                    Some(rustls::HandshakeKind::Resumed)
                ));
                Stream::Tls(Box::new(tls))
            }
        };
        cap.connection_id = Some(self.next_conn_id.fetch_add(1, Ordering::Relaxed));
        Ok(TimedIo {
            inner: stream,
            stamps: Arc::new(IoStamps::default()),
        })
    }

    /// Send `req` and wait for the response head. `conn` is the caller's connection to
    /// reuse, if any (taken only under `keep-alive`). Returns the connection that carried
    /// the request (hand it back with [`Engine::release`] once the body has ended) and the
    /// response, whose body the caller reads with [`Engine::next_frame`].
    ///
    /// Keep-alive rule: a reused connection that the worker had already closed (hyper hands
    /// the request back unsent) is replaced and the request is sent once more on the new
    /// connection (`connection_retried`). There are no other retries.
    pub(crate) async fn send<B>(
        &self,
        conn: Option<Conn<B>>,
        ep: &Endpoint,
        policy: ConnectionPolicy,
        req: Request<B>,
        cap: &mut Capture,
    ) -> Result<(Conn<B>, http::Response<Incoming>), ExchangeError>
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
                    cap.on_reuse(c.id);
                    c
                } else {
                    // Closed while idle: nothing was sent; open a new one.
                    self.connect(ep, policy, cap).await?
                }
            }
            None => self.connect(ep, policy, cap).await?,
        };
        cap.attach(&conn.stamps);
        conn.sender
            .ready()
            .await
            .map_err(|e| ExchangeError::upstream("connection not ready", &e))?;
        let resp = match conn.sender.try_send_request(req).await {
            Ok(resp) => resp,
            Err(mut e) => match e.take_message() {
                Some(req) if cap.connection_reused => {
                    // The worker closed the reused connection before it took the request.
                    cap.on_retry();
                    conn = self.connect(ep, policy, cap).await?;
                    cap.attach(&conn.stamps);
                    conn.sender
                        .ready()
                        .await
                        .map_err(|e| ExchangeError::upstream("connection not ready", &e))?;
                    conn.sender
                        .send_request(req)
                        .await
                        .map_err(|e| ExchangeError::upstream("send request", &e))?
                }
                _ => return Err(ExchangeError::upstream("send request", &e.into_error())),
            },
        };
        cap.request_sent_ns = conn.stamps.last_write_ns();
        cap.first_byte_ns = conn.stamps.first_read_ns().or(Some(clock::now_ns()));
        cap.status = Some(resp.status());
        if http1::is_event_stream(resp.headers()) {
            cap.on_event_stream(http1::is_close_delimited(resp.headers()));
        }
        Ok((conn, resp))
    }

    /// Read the next response body frame, stamping it into `cap` (and copying data, up to
    /// the capture's limit, out of hyper's buffers). `Ok(None)` is the end of the body.
    pub(crate) async fn next_frame(
        body: &mut Incoming,
        cap: &mut Capture,
    ) -> Result<Option<Frame<Bytes>>, ExchangeError> {
        if body.is_end_stream() {
            cap.on_body_end_now();
            return Ok(None);
        }
        match body.frame().await {
            Some(Ok(frame)) => {
                let now = clock::now_ns();
                if let Some(data) = frame.data_ref() {
                    cap.on_body_frame(data, now);
                }
                if body.is_end_stream() {
                    cap.on_body_end(now);
                }
                Ok(Some(frame))
            }
            Some(Err(e)) => Err(ExchangeError::upstream("read response body", &e)),
            None => {
                cap.on_body_end_now();
                Ok(None)
            }
        }
    }

    /// Keep a connection whose exchange ended cleanly for the next request (keep-alive
    /// only, and only if the worker did not close it).
    pub(crate) fn release<B>(conn: Conn<B>, policy: ConnectionPolicy) -> Option<Conn<B>> {
        (policy == ConnectionPolicy::KeepAlive && !conn.sender.is_closed()).then_some(conn)
    }
}
