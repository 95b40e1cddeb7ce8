//! serve's state, in one place every other file of serve may import: the run's options
//! ([`ServeOptions`], [`OnRecordFull`]), what every connection shares ([`Shared`]), the
//! count of exchanges whose row is not yet submitted ([`Pending`]), and an exchange in
//! flight ([`InFlight`]: everything known about it but its ending). Imports only serve's
//! leaves (`client`, `live`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::HeaderMap;
use http::header::HeaderValue;
use tokio::sync::{Notify, watch};

use super::client::ClientConn;
use super::live::Latencies;
use crate::budget::MemoryBudget;
use crate::drivers::RunContext;
use crate::engine::{Capture, CopiedBody, Engine};
use crate::model::{ConnectionPolicy, Endpoint, Outcome};

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

/// What to do once the recorder has failed (`serve --on-record-fail`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnRecordFail {
    /// Forward nothing more: new requests are answered 503 naming the failure, exchanges
    /// in flight finish, and serve stops (exit 3). A recording proxy's evidence is its
    /// point, so traffic it cannot record does not pass by default (mitmproxy's rule).
    Stop,
    /// Keep forwarding; every exchange whose row could not be recorded is counted.
    Forward,
}

impl OnRecordFail {
    /// As the command line and config.json name it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            OnRecordFail::Stop => "stop",
            OnRecordFail::Forward => "forward",
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
    pub(crate) on_record_fail: OnRecordFail,
    /// How long in-flight exchanges may finish after a stop before they are cut.
    pub(crate) grace: Duration,
    /// The live line on stderr every this often; `None` is quiet.
    pub(crate) stats_interval: Option<Duration>,
    /// Frames buffered between the upstream reader and the client.
    pub(crate) buffer_frames: usize,
    /// Bytes of response bodies queued for clients in all deliveries at once
    /// (`--relay-memory`).
    pub(crate) relay_memory: usize,
    /// Largest request head accepted from a client (larger: 431).
    pub(crate) max_header_bytes: usize,
    /// Time a client has to send a complete request head (then the connection is closed).
    pub(crate) header_read_timeout: Duration,
    /// Client connections served at once; more wait in the listen backlog.
    pub(crate) max_connections: usize,
}

/// What every connection and exchange of one serve run shares.
pub(super) struct Shared {
    pub(super) engine: Engine,
    pub(super) opts: ServeOptions,
    pub(super) run: Arc<RunContext>,
    pub(super) budget: Arc<MemoryBudget>,
    pub(super) next_conn: AtomicI64,
    pub(super) in_flight: AtomicI64,
    pub(super) cut: watch::Receiver<bool>,
    /// Where each successful exchange's latency goes for the live line (`None`: no line,
    /// `--quiet`). The exchange itself is counted once, in the run's `Telemetry`.
    pub(super) latencies: Option<Latencies>,
    /// Finished exchanges waiting for room in the recorder's queue (at most one per
    /// client connection, by the connection's backlog gate); its peak is reported.
    pub(super) waiting_rows: AtomicI64,
    pub(super) waiting_rows_peak: AtomicI64,
    pub(super) proto: &'static str,
    /// `scheme://authority` of the upstream, then its path prefix (no trailing `/`).
    pub(super) origin_prefix: String,
    /// Length of `scheme://authority` in `origin_prefix`.
    pub(super) origin_len: usize,
    /// `Host` for the upstream (its authority), when a request needs one.
    pub(super) upstream_host: Option<HeaderValue>,
    /// Requests serve answered itself without forwarding (400, 405, 431, 501, 503),
    /// by status: a few statuses, so a short lock per refusal.
    pub(super) refused: Mutex<BTreeMap<u16, u64>>,
    /// Messages whose trailer fields serve dropped (it writes the framing itself).
    pub(super) trailers_dropped: AtomicU64,
    /// Bytes queued for clients in all deliveries now (bounded by `opts.relay_memory`,
    /// past which deliveries read their workers only when their own queue is empty).
    pub(super) relay_bytes: AtomicUsize,
}

impl Shared {
    /// What the connections of a run with `opts` share; `cut` turns true when the stop
    /// cuts what is left, `latencies` is where the live line's go (`None`: no line).
    pub(super) fn new(
        engine: Engine,
        opts: ServeOptions,
        run: Arc<RunContext>,
        cut: watch::Receiver<bool>,
        latencies: Option<Latencies>,
    ) -> Shared {
        let up = &opts.upstream;
        Shared {
            engine,
            budget: MemoryBudget::new(opts.record_memory),
            run,
            next_conn: AtomicI64::new(0),
            in_flight: AtomicI64::new(0),
            cut,
            latencies,
            waiting_rows: AtomicI64::new(0),
            waiting_rows_peak: AtomicI64::new(0),
            proto: if opts.tls.is_some() { "https" } else { "http" },
            origin_prefix: format!(
                "{}://{}{}",
                up.scheme.as_str(),
                up.authority,
                up.path_and_query.trim_end_matches('/')
            ),
            origin_len: up.scheme.as_str().len() + 3 + up.authority.len(),
            upstream_host: HeaderValue::from_str(&up.authority).ok(),
            refused: Mutex::default(),
            trailers_dropped: AtomicU64::new(0),
            relay_bytes: AtomicUsize::new(0),
            opts,
        }
    }

    /// Why nothing more may be forwarded: the recorder failed and `--on-record-fail` is
    /// `stop`.
    pub(super) fn unrecordable(&self) -> Option<String> {
        match self.opts.on_record_fail {
            OnRecordFail::Stop => self.run.recorder.failure().map(str::to_string),
            OnRecordFail::Forward => None,
        }
    }

    /// Exchanges ended so far, and how many of each outcome seen: the run's one live
    /// count of each exchange ([`crate::telemetry::Telemetry`], which serve's run always
    /// has).
    pub(super) fn counts(&self) -> (u64, BTreeMap<Outcome, u64>) {
        self.run
            .telemetry()
            .map(|t| t.by_outcome())
            .unwrap_or_default()
    }

    /// Count a request serve answered with `status` instead of forwarding it.
    pub(super) fn count_refused(&self, status: http::StatusCode) {
        if let Ok(mut r) = self.refused.lock() {
            *r.entry(status.as_u16()).or_insert(0) += 1;
        }
    }
}

/// Counts exchanges whose row is not yet submitted; the stop waits for zero.
#[derive(Default)]
pub(super) struct Pending {
    pub(super) n: AtomicUsize,
    pub(super) zero: Notify,
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

/// Everything known about an exchange except its ending.
pub(super) struct InFlight {
    pub(super) cap: Capture,
    pub(super) started_at_us: i64,
    pub(super) start_offset_us: i64,
    pub(super) method: http::Method,
    pub(super) url: String,
    pub(super) request_headers: HeaderMap,
    /// The request body's copy (complete before the response: the body went up first).
    pub(super) tee: CopiedBody,
    pub(super) conn_no: i64,
    pub(super) index: i64,
    pub(super) client: Arc<ClientConn>,
}
