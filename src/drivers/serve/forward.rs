//! One client request on serve's own HTTP/1 core: turned into the upstream request
//! (hop-by-hop headers removed, forwarding headers added), written on the client
//! connection's upstream connection with its body streamed up as it is read (and copied
//! on the side for the record), and answered: the upstream response relayed to the
//! client (`relay`), or a generated 502 / 503 / 504 when no head came. Every path ends in
//! `end::end`.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{HeaderMap, StatusCode, Uri};

use super::client::ClientConn;
use super::down::{Down, DownstreamEnd};
use super::end;
use super::relay;
use super::state::{InFlight, Pending, PendingGuard, Shared};
use crate::clock;
use crate::engine::http1::codec::Head;
use crate::engine::http1::reframe::{self, RequestBody, ResponseFraming};
use crate::engine::http1::request::{BodyFraming, RequestHead};
use crate::engine::lean::LeanConn;
use crate::engine::relay::BodyRelay;
use crate::engine::{BodyCopy, Capture, CopiedBody, ExchangeError, http1};
use crate::model::ConnectionPolicy;

/// What a client connection's exchanges share, one at a time.
pub(super) struct ConnState {
    /// The upstream connection kept for the next request (`keep-alive`: each client
    /// connection pinned to its own).
    pub(super) slot: Option<LeanConn>,
    pub(super) client: Arc<ClientConn>,
    pub(super) conn_no: i64,
    pub(super) next_index: i64,
    /// Longest request head, and what a client may send ahead while it waits.
    pub(super) limit: usize,
}

/// The headers sent upstream: serve's own framing and the fields of the request as
/// `reframe::request_fields` keeps them (`Expect` answered here with `100 Continue` once
/// the request head is on its way up), forwarding headers added, `Host` kept unless
/// `rewrite_host`.
fn upstream_headers(
    mut h: HeaderMap,
    uri: &Uri,
    framing: BodyFraming,
    fw: &ClientConn,
    sh: &Shared,
) -> HeaderMap {
    reframe::request_fields(&mut h, uri, framing);
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
    let pq = reframe::origin_form(uri);
    let pq = pq.as_ref();
    let mut url = String::with_capacity(sh.origin_prefix.len() + pq.len());
    url.push_str(&sh.origin_prefix);
    url.push_str(pq);
    url
}

/// How waiting for the upstream head failed.
enum NoHead {
    /// On the worker's side, or by serve's deadline or cut: answered 502 / 503 / 504.
    Upstream(ExchangeError),
    /// On the client's side: it went away (nobody to answer), framed its body wrong
    /// (400) or sent it too slowly (408).
    Client(ExchangeError),
}

/// One client request: forward it, answer the client, and see that it is recorded.
/// Returns whether the client connection may carry another request.
pub(super) async fn exchange(
    sh: &Arc<Shared>,
    pending: &Arc<Pending>,
    down: &mut Down,
    st: &mut ConnState,
    head: RequestHead,
    stopping: bool,
) -> bool {
    st.client.wait_backlog().await;
    if let Some(why) = sh.unrecordable() {
        return refuse_unrecorded(sh, down, &why, head.http10).await;
    }
    let guard = PendingGuard::new(pending);
    let cap = Capture::start(sh.opts.max_record_body, Some(sh.budget.clone()));
    let started_at_us = clock::wall_now_us();
    let start_offset_us = clock::us_between(sh.run.run_t0_ns, cap.t0_ns());
    // Counted down in `end::build_record`: every started exchange reaches `end::end`.
    sh.in_flight.fetch_add(1, Ordering::Relaxed);
    let RequestHead {
        method,
        uri,
        http10,
        headers,
        framing,
        keep_alive,
        expect_continue,
        ..
    } = head;
    let headers = upstream_headers(headers, &uri, framing, &st.client, sh);
    // The record's URL; the upstream target is its tail.
    let url = upstream_url(sh, &uri);
    let wire = reframe::request_head(&method, &url[sh.origin_len..], &headers, framing);
    let mut p = InFlight {
        cap,
        started_at_us,
        start_offset_us,
        method,
        url,
        request_headers: headers,
        tee: CopiedBody::default(),
        conn_no: st.conn_no,
        index: st.next_index,
        client: st.client.clone(),
    };
    st.next_index += 1;
    let mut body = RequestBody::new(framing);
    let mut copy = BodyCopy::new(sh.opts.max_record_body, Some(sh.budget.clone()));
    let mut cut = sh.cut.clone();
    // Set while serve waits for the client's next body bytes: a deadline passing then is
    // the client's, not the worker's.
    let on_client = std::sync::atomic::AtomicBool::new(false);
    let sending = send(
        sh,
        down,
        st,
        wire,
        &mut body,
        (expect_continue, &on_client),
        &mut copy,
        &mut p,
    );
    let sent = tokio::select! {
        r = tokio::time::timeout(sh.opts.upstream_timeout, sending) => r.unwrap_or_else(|_| {
            let secs = sh.opts.upstream_timeout.as_secs_f64();
            if on_client.load(Ordering::Relaxed) {
                return Err(NoHead::Client(ExchangeError::client_body_timeout(secs)));
            }
            Err(NoHead::Upstream(ExchangeError::deadline(format!(
                "upstream {} sent no response head within --upstream-timeout ({secs} s)",
                sh.opts.upstream.authority,
            ))))
        }),
        _ = cut.wait_for(|c| *c) => Err(NoHead::Upstream(ExchangeError::shutdown_cut())),
    };
    p.tee = copy.take();
    if body.trailers_dropped() {
        sh.trailers_dropped.fetch_add(1, Ordering::Relaxed);
    }
    // The connection can carry another request only if this one was read to its end.
    let keep = keep_alive && body.done() && !stopping;
    match sent {
        Ok((conn, head, head_ns)) => {
            let sent_whole = body.done();
            respond(
                sh,
                down,
                st,
                p,
                guard,
                (conn, head, head_ns, sent_whole),
                http10,
                keep,
            )
            .await
        }
        Err(NoHead::Client(e)) => {
            p.cap.finish(clock::now_ns());
            // A client still there (it framed its body wrong, or was too slow with it) is
            // told why, then the connection closes; one that went away gets nothing.
            let answered = if e.status().0 == StatusCode::BAD_GATEWAY {
                None
            } else {
                Some(answer_error(down, &e, http10, false).await)
            };
            end::end(sh, p, Some(e), answered, guard);
            false
        }
        Err(NoHead::Upstream(e)) => {
            p.cap.finish(clock::now_ns());
            let keep = keep && e.outcome() != crate::model::Outcome::ShutdownCut;
            let downstream = answer_error(down, &e, http10, keep).await;
            let complete = downstream.complete;
            end::end(sh, p, Some(e), Some(downstream), guard);
            keep && complete
        }
    }
}

/// A recorder that failed stops unrecorded traffic (`--on-record-fail stop`): the request
/// is answered 503 naming the failure, counted, and its connection closed (`false`).
async fn refuse_unrecorded(sh: &Shared, down: &mut Down, why: &str, http10: bool) -> bool {
    sh.count_refused(StatusCode::SERVICE_UNAVAILABLE);
    let message = format!("recording failed, so serve forwards nothing more: {why}");
    let status = (StatusCode::SERVICE_UNAVAILABLE, "recording_failed");
    answer_json(down, status, &message, http10, false).await;
    false
}

/// Write the request up (its body streamed as the client sends it, in serve's own
/// framing) and wait for the response head, watching for the client's close meanwhile.
/// A worker that stops taking the body (it answered early, say 413, and closed) still
/// gets its answer read and passed on, as nginx does.
#[allow(clippy::too_many_arguments)]
async fn send(
    sh: &Shared,
    down: &mut Down,
    st: &mut ConnState,
    mut wire: Vec<u8>,
    body: &mut RequestBody,
    (expect_continue, on_client): (bool, &std::sync::atomic::AtomicBool),
    copy: &mut BodyCopy,
    p: &mut InFlight,
) -> Result<(LeanConn, Head, u64), NoHead> {
    let up = |mut e: ExchangeError| {
        e.message = format!("upstream {}: {}", sh.opts.upstream.authority, e.message);
        NoHead::Upstream(e)
    };
    let bad_body = |m: String| NoHead::Client(ExchangeError::client_malformed_body(&m));
    // Body bytes that came with the head go up with it, in one write.
    let first = body
        .take(&mut down.buf, |d| copy.push(d))
        .map_err(bad_body)?;
    wire.extend_from_slice(&first);
    let mut conn = sh
        .engine
        .lean_send(
            &mut st.slot,
            &sh.opts.upstream,
            sh.opts.policy,
            &wire,
            &mut p.cap,
        )
        .await
        .map_err(up)?;
    if expect_continue && !body.done() && down.buf.is_empty() {
        down.send(b"HTTP/1.1 100 Continue\r\n\r\n")
            .await
            .map_err(|_| {
                NoHead::Client(ExchangeError::client_request_body(
                    "the client closed its connection",
                ))
            })?;
    }
    let mut refused = None;
    while !body.done() {
        on_client.store(true, Ordering::Relaxed);
        let read = down.read_more().await;
        on_client.store(false, Ordering::Relaxed);
        if matches!(read, Ok(0) | Err(_)) {
            return Err(NoHead::Client(ExchangeError::client_request_body(
                "the client closed its connection",
            )));
        }
        let more = body
            .take(&mut down.buf, |d| copy.push(d))
            .map_err(bad_body)?;
        if let Err(e) = conn.send_more(&more).await {
            refused = Some(e);
            break;
        }
    }
    let (head, at) = tokio::select! {
        r = conn.read_head(&p.method, &mut p.cap) => match (r, refused) {
            (Ok(h), _) => h,
            // The worker took neither the body nor wrote an answer: the send's error.
            (Err(_), Some(e)) | (Err(e), None) => return Err(up(e)),
        },
        () = down.until_closed(st.limit) => {
            return Err(NoHead::Client(ExchangeError::client_gone_before_head()));
        }
    };
    if head.status == StatusCode::SWITCHING_PROTOCOLS {
        return Err(up(ExchangeError::upstream_message(
            "answered 101 Switching Protocols: serve does not pass protocol upgrades through"
                .into(),
        )));
    }
    if !http1::has_no_body(&p.method, head.status)
        && let Some(coding) = reframe::foreign_coding(&head.headers)
    {
        return Err(up(ExchangeError::upstream_message(format!(
            "answered with Transfer-Encoding {coding:?}: serve passes only chunked (the client offered no coding in TE)"
        ))));
    }
    Ok((conn, head, at))
}

/// The upstream answered with a head: relay its response to the client, keep the
/// upstream connection if it may carry another request (`sent_whole`: it took the whole
/// request body), and end the exchange.
#[allow(clippy::too_many_arguments)]
async fn respond(
    sh: &Arc<Shared>,
    down: &mut Down,
    st: &mut ConnState,
    mut p: InFlight,
    guard: PendingGuard,
    (mut conn, head, head_ns, sent_whole): (LeanConn, Head, u64, bool),
    http10: bool,
    keep: bool,
) -> bool {
    // serve writes the framing the client gets: the body's length, chunks (a chunked body
    // or one the close ends, to an HTTP/1.1 client, so that a cut can never look
    // complete), or until the close (an HTTP/1.0 client).
    let framing: ResponseFraming = reframe::response_framing(&head, &p.method, http10);
    let keep = keep && !framing.close;
    let mut relay_body = BodyRelay::new(&head, head_ns, framing.body, &mut p.cap);
    // The head goes out without the hop-by-hop fields; the record keeps the worker's
    // map as it came (moved, not copied).
    let wire = reframe::response_head(
        http10,
        head.status,
        http1::end_to_end(&head.headers),
        &framing,
        keep,
    );
    p.cap.keep_response_headers(head.headers);
    let r = relay::relay(
        sh,
        down,
        &mut conn,
        &mut relay_body,
        &mut p.cap,
        Bytes::from(wire),
        st.limit,
    )
    .await;
    if relay_body.trailers_dropped() {
        sh.trailers_dropped.fetch_add(1, Ordering::Relaxed);
    }
    if r.failure.is_none()
        && sent_whole
        && relay_body.clean(&conn)
        && head.keep_alive
        && sh.opts.policy == ConnectionPolicy::KeepAlive
    {
        st.slot = Some(conn);
    }
    if relay_body.done() {
        p.cap.finish_at_end();
    } else {
        p.cap.finish(clock::now_ns());
    }
    let ok = r.failure.is_none() && r.complete;
    end::end(
        sh,
        p,
        r.failure,
        Some(DownstreamEnd {
            at_ns: r.at_ns,
            complete: r.complete,
        }),
        guard,
    );
    keep && ok
}

/// Answer a request that got no upstream head (400, 408, 502, 503, 504, with a JSON body
/// saying why); when and whether the answer was handed over whole.
async fn answer_error(
    down: &mut Down,
    e: &ExchangeError,
    http10: bool,
    keep: bool,
) -> DownstreamEnd {
    answer_json(down, e.status(), &e.message, http10, keep).await
}

/// Answer with `status` and a JSON body `{"error": {"type", "message"}}`.
async fn answer_json(
    down: &mut Down,
    (status, kind): (StatusCode, &str),
    message: &str,
    http10: bool,
    keep: bool,
) -> DownstreamEnd {
    let body = serde_json::to_vec(&serde_json::json!({
        "error": {"type": kind, "message": format!("matrix-proxy: {message}")}
    }))
    .unwrap_or_default();
    let framing = ResponseFraming {
        body: reframe::Reframe::Raw,
        length: Some(body.len() as u64),
        close: !keep,
    };
    let mut wire = reframe::response_head(
        http10,
        status,
        [("content-type", &b"application/json"[..])],
        &framing,
        keep,
    );
    wire.extend_from_slice(&body);
    let complete = down.send(&wire).await.is_ok();
    DownstreamEnd {
        at_ns: clock::now_ns(),
        complete,
    }
}
