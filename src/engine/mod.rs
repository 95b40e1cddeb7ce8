//! The exchange engine: send one request to the worker and measure it at the boundary.
//!
//! Both drivers send every request through its lean client (`lean.rs`, framed by
//! `http1::codec`, its heads written by `http1::write`): replay with
//! `Engine::exchange_lean` (frozen request bytes), serve with `Engine::lean_send` and
//! then `upstream.rs` (the rest of the request streamed up, the response head, and the
//! body read for forwarding, each read stamped). It owns
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
pub(crate) mod upstream;

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use rustls::pki_types::ServerName;
use tokio::net::TcpStream;

pub(crate) use capture::{BodyCopy, Capture, Captured, CopiedBody};
pub(crate) use error::ExchangeError;

use crate::clock;
use crate::model::{ConnectionPolicy, Endpoint, Scheme};
use crate::net::timed_io::{IoStamps, Stream, TimedIo};
use crate::net::tls::{self, TlsOptions};

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
    pub(crate) fn new(need_tls: bool, tls: &TlsOptions) -> Result<Engine, tls::TlsError> {
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
}
