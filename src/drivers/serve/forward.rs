//! A client request turned into an upstream one, and the answer: the upstream response
//! streamed back (or, when its body is already whole, handed over with the head), or a
//! generated 502 / 503 / 504 when no head came.

use std::convert::Infallible;
use std::io;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::Poll;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{HeaderMap, Request, Response, Uri};
use hyper::body::{Body, Incoming};
use tokio::sync::{mpsc, oneshot};

use super::body::{OnEnd, ProxyBody, TeeBody};
use super::client::ClientConn;
use super::end;
use super::pump::{self, Pumped};
use super::state::{InFlight, PendingGuard, Shared, Slot};
use crate::clock;
use crate::engine::{BodyCopy, Capture, Conn, Engine, ExchangeError, http1};
use crate::model::ConnectionPolicy;

/// The headers sent upstream: hop-by-hop removed, `Expect` answered here (hyper sends
/// `100 Continue` when the body is first read), forwarding headers added, `Host` kept
/// unless `rewrite_host`.
fn upstream_headers(mut h: HeaderMap, fw: &ClientConn, sh: &Shared) -> HeaderMap {
    http1::strip_hop_by_hop(&mut h);
    h.remove(header::EXPECT);
    if sh.opts.policy == ConnectionPolicy::Fresh {
        http1::close_after(&mut h);
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

/// The response serve generates when no upstream head came (502, 503, 504).
fn error_response(e: &ExchangeError) -> Response<ProxyBody> {
    let (status, kind) = e.status();
    let body = Bytes::from(
        serde_json::to_vec(&serde_json::json!({
            "error": {"type": kind, "message": format!("matrix-proxy: {}", e.message)}
        }))
        .unwrap_or_default(),
    );
    let len = body.len();
    let mut r = Response::new(ProxyBody {
        rx: None,
        full: Some(body),
        finished: false,
        done: None,
    });
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r.headers_mut()
        .insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    r
}

/// One client request: forward it, answer the client, and see that it is recorded.
pub(super) async fn handle(
    sh: Arc<Shared>,
    guard: PendingGuard,
    slot: Slot,
    client: Arc<ClientConn>,
    conn_no: i64,
    index: i64,
    req: Request<Incoming>,
) -> Result<Response<ProxyBody>, Infallible> {
    client.wait_backlog().await;
    let cap = Capture::start(sh.opts.max_record_body, Some(sh.budget.clone()));
    let started_at_us = clock::wall_now_us();
    let start_offset_us = clock::us_between(sh.run.run_t0_ns, cap.t0_ns());
    // Counted down in `end::build_record`: every started exchange reaches `end::end`
    // (through `Unanswered` when its client leaves before the head).
    sh.in_flight.fetch_add(1, Ordering::Relaxed);
    let (parts, body) = req.into_parts();
    let headers = upstream_headers(parts.headers, &client, &sh);
    // The record's URL; the upstream target is its tail.
    let url = upstream_url(&sh, &parts.uri);
    let target = &url[sh.origin_len..];
    let copy = BodyCopy::new(sh.opts.max_record_body, Some(sh.budget.clone()));
    let (tee, tee_rx) = TeeBody::new(body, copy);
    let mut up = Request::new(tee);
    *up.method_mut() = parts.method.clone();
    *up.uri_mut() = Uri::try_from(target).unwrap_or_else(|_| Uri::from_static("/"));
    *up.headers_mut() = headers.clone();
    let p = InFlight {
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
    // Until a response is handed to hyper, a client that leaves makes hyper drop this
    // future: the exchange is then recorded by the guard's drop.
    let mut unanswered = Unanswered {
        sh: &sh,
        armed: Some((p, guard)),
    };
    let (p, _) = unanswered
        .armed
        .as_mut()
        .expect("armed until a response is handed over");
    let sent = tokio::select! {
        r = tokio::time::timeout(
            sh.opts.upstream_timeout,
            sh.engine.send(conn, &sh.opts.upstream, sh.opts.policy, up, &mut p.cap),
        ) => Some(r),
        _ = cut.wait_for(|c| *c) => None,
    };
    let Some((mut p, guard)) = unanswered.armed.take() else {
        unreachable!("armed until a response is handed over")
    };
    drop(unanswered);
    let failure = match sent {
        // `respond` never suspends before the row has an owner (the pump task or the
        // response body's end): the state is disarmed here, so an await added there
        // would lose the row of a client that leaves at it.
        Some(Ok(Ok((conn, resp)))) => return Ok(respond(sh, guard, p, conn, resp, slot).await),
        Some(Ok(Err(mut e))) => {
            e.message = format!("upstream {}: {}", sh.opts.upstream.authority, e.message);
            e
        }
        Some(Err(_)) => ExchangeError::deadline(format!(
            "upstream {} sent no response head within --upstream-timeout ({} s)",
            sh.opts.upstream.authority,
            sh.opts.upstream_timeout.as_secs_f64()
        )),
        None => ExchangeError::shutdown_cut(),
    };
    p.cap.finish(clock::now_ns());
    let mut resp = error_response(&failure);
    let (done_tx, done_rx) = oneshot::channel();
    resp.body_mut().done = Some(OnEnd::Notify(done_tx));
    tokio::spawn(async move {
        let downstream = pump::wait_downstream(&sh, done_rx).await;
        end::end(&sh, p, Some(failure), downstream, guard);
    });
    Ok(resp)
}

/// A request waiting for the worker's response head. Its drop, while still armed (hyper
/// dropped the request's future because the client closed its connection, or serve is
/// cutting it), records the exchange: `client_aborted` (or `shutdown_cut`), the
/// upstream exchange cancelled, nothing handed to the client.
struct Unanswered<'a> {
    sh: &'a Arc<Shared>,
    armed: Option<(InFlight, PendingGuard)>,
}

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        let Some((mut p, guard)) = self.armed.take() else {
            return;
        };
        p.cap.finish(clock::now_ns());
        let failure = if *self.sh.cut.borrow() {
            ExchangeError::shutdown_cut()
        } else {
            ExchangeError::client_gone_before_head()
        };
        end::end(self.sh, p, Some(failure), None, guard);
    }
}

/// The upstream answered with a head: stream its response to the client.
async fn respond(
    sh: Arc<Shared>,
    guard: PendingGuard,
    mut p: InFlight,
    conn: Conn<TeeBody>,
    resp: Response<Incoming>,
    slot: Slot,
) -> Response<ProxyBody> {
    let (mut parts, mut body) = resp.into_parts();
    let no_body = http1::has_no_body(&p.method, parts.status);
    p.cap.keep_response_headers(parts.headers.clone());
    http1::strip_hop_by_hop(&mut parts.headers);
    // If the first body frame is already here, queue it before the head goes out: hyper
    // then writes head and body in one go instead of flushing the head alone (measured: a
    // second write per response, and a second wake-up of the client). Never waits: a
    // stream's head is not held back for its first event.
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
                let last = p.cap.ended() || frame.is_trailers();
                first = Some(Ok((frame, last)));
            }
            Poll::Ready(Err(e)) => {
                first = Some(Err(io::Error::other(e.message.clone())));
                initial_failure = Some(e);
            }
            Poll::Ready(Ok(None)) => ended = true,
            Poll::Pending => {}
        }
    }
    // The whole upstream body is here (one data frame, or none): no reader task, no
    // channel; the row is written when the client's side ends.
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
        p.cap.finish_at_end();
        if let Some(c) = Engine::release(conn, sh.opts.policy)
            && let Ok(mut s) = slot.lock()
        {
            *s = Some(c);
        }
        let finished = no_body || data.is_none();
        let listener = move |downstream| end::end(&sh, p, None, Some(downstream), guard);
        return Response::from_parts(
            parts,
            ProxyBody {
                rx: None,
                full: data,
                finished,
                done: Some(OnEnd::Call(Box::new(listener))),
            },
        );
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
    let up = Pumped {
        conn,
        body,
        tx,
        done_rx,
        slot,
        initial_failure,
    };
    tokio::spawn(pump::pump_and_record(sh, guard, p, up));
    resp
}
