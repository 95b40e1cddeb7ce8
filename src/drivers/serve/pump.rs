//! The upstream reader of a streamed response: its own task reads the upstream body frame
//! by frame into the bounded channel the client's [`ProxyBody`](super::body::ProxyBody)
//! drains, independently of the client; then it waits for the client's side and hands the
//! exchange to [`end`](super::end::end).

use std::io;
use std::sync::Arc;

use hyper::body::Incoming;
use tokio::sync::{mpsc, oneshot};

use super::body::{Chunk, DownstreamEnd, TeeBody};
use super::end;
use super::state::{InFlight, PendingGuard, Shared, Slot};
use crate::clock;
use crate::engine::{Conn, Engine, ExchangeError};

/// When and how the client's side of a response ended; `None` when serve's stop cut it
/// first.
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
    let downstream = wait_downstream(&sh, up.done_rx).await;
    end::end(&sh, p, failure, downstream, guard);
}
