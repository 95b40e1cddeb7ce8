//! `--metrics-listen ADDR`: a Prometheus text endpoint (`GET /metrics`, exposition format
//! 0.0.4) over the run's live telemetry and its recorder, served on its own listener
//! beside the run until the command ends.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;

use super::RunError;
use crate::drivers::RunContext;
use crate::record::Recorder;
use crate::telemetry::{Kind, Telemetry};

/// A value of the recorder served at each scrape: name, help, type, and how to read it.
type RecorderValue = (&'static str, &'static str, Kind, fn(&Recorder) -> f64);

/// The recorder's values, read at each scrape.
const RECORDER_VALUES: [RecorderValue; 6] = [
    (
        "matrix_proxy_recorder_queue_rows",
        "Finished exchanges waiting in the recorder's queue for the writer thread.",
        Kind::Gauge,
        |r| r.queued_rows() as f64,
    ),
    (
        "matrix_proxy_rows_written_total",
        "Rows encoded into Parquet parts (the open part included).",
        Kind::Counter,
        |r| r.rows_written() as f64,
    ),
    (
        "matrix_proxy_rows_dropped_total",
        "Rows dropped because the recorder's queue was full (serve --on-record-full drop).",
        Kind::Counter,
        |r| r.dropped() as f64,
    ),
    (
        "matrix_proxy_recording_failed",
        "1 once the recorder has stopped on an error (a write, a rename, an fsync failed): serve then forwards nothing more unless --on-record-fail forward.",
        Kind::Gauge,
        |r| f64::from(u8::from(r.failure().is_some())),
    ),
    (
        "matrix_proxy_rows_unrecorded_total",
        "Finished exchanges whose row the recorder refused because it had stopped on an error.",
        Kind::Counter,
        |r| r.unrecorded() as f64,
    ),
    (
        "matrix_proxy_parts_closed_total",
        "Parquet parts finished and renamed into exchanges/.",
        Kind::Counter,
        |r| r.parts_closed() as f64,
    ),
];

/// The exposition format's content type.
const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The bound address as config.json records it (`metrics_listen`).
pub(crate) fn address(listener: Option<&tokio::net::TcpListener>) -> Option<String> {
    listener?.local_addr().ok().map(|a| a.to_string())
}

/// Bind `--metrics-listen` before anything is created, so a taken port is a usage error.
pub(crate) async fn bind(addr: SocketAddr) -> Result<tokio::net::TcpListener, RunError> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| RunError::Usage(format!("--metrics-listen {addr}: cannot bind: {e}")))
}

/// Count `run`'s exchanges in `t` and, with a listener, serve them with the recorder's
/// queue, rows and parts; the server's task (abort it when the command ends).
pub(crate) fn start(
    listener: Option<tokio::net::TcpListener>,
    t: &Arc<Telemetry>,
    run: &RunContext,
    quiet: bool,
) -> Option<tokio::task::JoinHandle<()>> {
    run.set_telemetry(t.clone());
    let listener = listener?;
    if let (Some(a), false) = (address(Some(&listener)), quiet) {
        eprintln!("matrix-proxy: live metrics at http://{a}/metrics");
    }
    for (name, help, kind, read) in RECORDER_VALUES {
        let r = run.recorder.clone();
        t.register(name, help, kind, move || read(&r));
    }
    let t = t.clone();
    Some(tokio::spawn(async move {
        // The connections' tasks end with the server's (aborting it drops the set).
        let mut conns = tokio::task::JoinSet::new();
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                // Out of descriptors, say: try again a little later, never spin.
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            };
            while conns.try_join_next().is_some() {}
            let t = t.clone();
            conns.spawn(async move {
                let svc = service_fn(move |req| answer(req, t.clone()));
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), svc)
                    .await;
            });
        }
    }))
}

async fn answer(
    req: Request<Incoming>,
    t: Arc<Telemetry>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let found = req.uri().path() == "/metrics";
    let method_ok = req.method() == Method::GET || req.method() == Method::HEAD;
    let (status, body) = match (found, method_ok) {
        (true, true) => (StatusCode::OK, t.render()),
        (true, false) => (StatusCode::METHOD_NOT_ALLOWED, "GET /metrics\n".to_string()),
        (false, _) => (
            StatusCode::NOT_FOUND,
            "the metrics are at /metrics\n".to_string(),
        ),
    };
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(CONTENT_TYPE),
    );
    Ok(resp)
}
