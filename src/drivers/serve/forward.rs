//! One client request on serve's own HTTP/1 core: turned into the upstream request
//! (hop-by-hop headers removed, forwarding headers added), written on the client
//! connection's upstream connection with its body streamed up as it is read (and copied
//! on the side for the record), and answered: the upstream response delivered to the
//! client (`deliver`), or a generated 400 / 408 / 502 / 503 / 504 when no head came. Every
//! path ends in `end::end`. The steps, in order: [`begin`], [`send_in_time`] ([`send`]),
//! then [`respond`] or [`answer_no_head`].

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{HeaderMap, Method, StatusCode, Uri};

use super::client::ClientConn;
use super::deliver::{self, Upstream};
use super::down::{Down, DownstreamEnd};
use super::end;
use super::state::{InFlight, Pending, PendingGuard, Shared};
use crate::clock;
use crate::engine::error::{Answer, Cause};
use crate::engine::http1::codec::{CodecError, Head};
use crate::engine::http1::reframe::{self, RequestBody, ResponseFraming};
use crate::engine::http1::request::{BodyFraming, RequestHead};
use crate::engine::http1::write;
use crate::engine::lean::LeanConn;
use crate::engine::upstream::ResponseBody;
use crate::engine::{BodyCopy, Capture, CopiedBody, ExchangeError, http1};
use crate::model::{ConnectionPolicy, Outcome};

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

/// The upstream request of a client request, and what its head said of the connection.
struct UpRequest {
    /// The request head as it goes up.
    wire: Vec<u8>,
    framing: BodyFraming,
    http10: bool,
    keep_alive: bool,
    expect_continue: bool,
}

/// The request body on its way up: read from the client in serve's framing and copied for
/// the record.
struct Upload<'a> {
    body: &'a mut RequestBody,
    copy: &'a mut BodyCopy,
    /// The client waits for `100 Continue` before it sends the body.
    expect_continue: bool,
    /// Set while serve waits for the client's next body bytes: a deadline passing then is
    /// the client's, not the worker's.
    on_client: &'a AtomicBool,
}

/// The upstream response head, on the connection it came on.
struct Sent {
    conn: LeanConn,
    head: Head,
    /// When the read that completed the head returned.
    head_ns: u64,
    /// The worker took the whole request body (else its connection cannot carry another).
    sent_whole: bool,
}

/// How serve answers the client: in its HTTP version, and whether its connection stays
/// open after the answer.
#[derive(Debug, Clone, Copy)]
struct Reply {
    http10: bool,
    keep: bool,
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
    let (mut p, req) = begin(sh, st, head);
    let mut body = RequestBody::new(req.framing);
    let mut copy = BodyCopy::new(sh.opts.max_record_body, Some(sh.budget.clone()));
    let on_client = AtomicBool::new(false);
    let up = Upload {
        body: &mut body,
        copy: &mut copy,
        expect_continue: req.expect_continue,
        on_client: &on_client,
    };
    let sent = send_in_time(sh, down, st, req.wire, up, &mut p).await;
    p.tee = copy.take();
    if body.trailers_dropped() {
        sh.trailers_dropped.fetch_add(1, Ordering::Relaxed);
    }
    // The connection can carry another request only if this one was read to its end.
    let reply = Reply {
        http10: req.http10,
        keep: req.keep_alive && body.done() && !stopping,
    };
    match sent {
        Ok(sent) => respond(sh, down, st, p, guard, sent, reply).await,
        Err(no_head) => answer_no_head(sh, down, p, guard, no_head, reply).await,
    }
}

/// Begin an exchange: its capture started (t0, drawing recorded bytes from the budget),
/// the wall clock read once, counted in flight, and the upstream request made (headers,
/// URL, the head as it goes up).
fn begin(sh: &Shared, st: &mut ConnState, head: RequestHead) -> (InFlight, UpRequest) {
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
    let chunked = framing == BodyFraming::Chunked;
    let wire = write::request_head(&method, &url[sh.origin_len..], &headers, chunked, 0);
    let p = InFlight {
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
    let req = UpRequest {
        wire,
        framing,
        http10,
        keep_alive,
        expect_continue,
    };
    (p, req)
}

/// [`send`] within `--upstream-timeout` (the client's fault when it was sending its body
/// then) and until the stop's cut.
async fn send_in_time(
    sh: &Shared,
    down: &mut Down,
    st: &mut ConnState,
    wire: Vec<u8>,
    up: Upload<'_>,
    p: &mut InFlight,
) -> Result<Sent, NoHead> {
    let on_client = up.on_client;
    let mut cut = sh.cut.clone();
    let sending = send(sh, down, st, wire, up, p);
    tokio::select! {
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
    }
}

/// A request that got no upstream head: a client still there (it framed its body wrong,
/// or was too slow with it) is told why, then the connection closes; one that went away
/// gets nothing. A failure upstream (or serve's deadline or cut) is answered 502, 503 or
/// 504. Returns whether the client connection may carry another request.
async fn answer_no_head(
    sh: &Arc<Shared>,
    down: &mut Down,
    mut p: InFlight,
    guard: PendingGuard,
    no_head: NoHead,
    reply: Reply,
) -> bool {
    p.cap.finish(clock::now_ns());
    match no_head {
        NoHead::Client(e) => {
            let answered = if e.cause == Cause::Transport {
                None
            } else {
                let reply = Reply {
                    keep: false,
                    ..reply
                };
                Some(answer_error(down, &e, reply).await)
            };
            end::end(sh, p, Some(e), answered, guard);
            false
        }
        NoHead::Upstream(e) => {
            let reply = Reply {
                keep: reply.keep && e.outcome() != Outcome::ShutdownCut,
                ..reply
            };
            let downstream = answer_error(down, &e, reply).await;
            let complete = downstream.complete;
            end::end(sh, p, Some(e), Some(downstream), guard);
            reply.keep && complete
        }
    }
}

/// A recorder that failed stops unrecorded traffic (`--on-record-fail stop`): the request
/// is answered 503 naming the failure, counted, and its connection closed (`false`).
async fn refuse_unrecorded(sh: &Shared, down: &mut Down, why: &str, http10: bool) -> bool {
    sh.count_refused(StatusCode::SERVICE_UNAVAILABLE);
    let message = format!("recording failed, so serve forwards nothing more: {why}");
    let answer = Answer {
        status: StatusCode::SERVICE_UNAVAILABLE,
        kind: "recording_failed",
    };
    let reply = Reply {
        http10,
        keep: false,
    };
    answer_json(down, answer, &message, reply).await;
    false
}

/// The worker's side failed at a step of the send: named as its upstream's.
fn upstream_failed(sh: &Shared, mut e: ExchangeError) -> NoHead {
    e.message = format!("upstream {}: {}", sh.opts.upstream.authority, e.message);
    NoHead::Upstream(e)
}

/// The client closed its connection while its request body was on its way.
fn client_closed() -> NoHead {
    NoHead::Client(ExchangeError::client_request_body(
        "the client closed its connection",
    ))
}

/// Write the request up (its body streamed as the client sends it, in serve's own
/// framing) and wait for the response head, watching for the client's close meanwhile.
/// A worker that stops taking the body (it answered early, say 413, and closed) still
/// gets its answer read and passed on, as nginx does.
async fn send(
    sh: &Shared,
    down: &mut Down,
    st: &mut ConnState,
    mut wire: Vec<u8>,
    mut up: Upload<'_>,
    p: &mut InFlight,
) -> Result<Sent, NoHead> {
    // Body bytes that came with the head go up with it, in one write.
    let first = up
        .body
        .take(&mut down.buf, |d| up.copy.push(d))
        .map_err(malformed_body)?;
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
        .map_err(|e| upstream_failed(sh, e))?;
    if up.expect_continue && !up.body.done() && down.buf.is_empty() {
        down.send(write::CONTINUE)
            .await
            .map_err(|_| client_closed())?;
    }
    let refused = send_rest(down, &mut conn, &mut up).await?;
    let (head, head_ns) = tokio::select! {
        r = conn.read_head(&p.method, &mut p.cap) => match (r, refused) {
            (Ok(h), _) => h,
            // The worker took neither the body nor wrote an answer: the send's error.
            (Err(_), Some(e)) | (Err(e), None) => return Err(upstream_failed(sh, e)),
        },
        () = down.until_closed(st.limit) => {
            return Err(NoHead::Client(ExchangeError::client_gone_before_head()));
        }
    };
    refuse_head(&p.method, &head).map_err(|e| upstream_failed(sh, e))?;
    Ok(Sent {
        conn,
        head,
        head_ns,
        sent_whole: up.body.done(),
    })
}

/// The client framed its request body wrong.
fn malformed_body(e: CodecError) -> NoHead {
    NoHead::Client(ExchangeError::client_malformed_body(&e.to_string()))
}

/// Send the rest of the request body up as the client sends it. `Ok(Some)`: the worker
/// stopped taking it (why the send failed, should no answer come either).
async fn send_rest(
    down: &mut Down,
    conn: &mut LeanConn,
    up: &mut Upload<'_>,
) -> Result<Option<ExchangeError>, NoHead> {
    while !up.body.done() {
        up.on_client.store(true, Ordering::Relaxed);
        let read = down.read_more().await;
        up.on_client.store(false, Ordering::Relaxed);
        if matches!(read, Ok(0) | Err(_)) {
            return Err(client_closed());
        }
        let more = up
            .body
            .take(&mut down.buf, |d| up.copy.push(d))
            .map_err(malformed_body)?;
        if let Err(e) = conn.send_more(&more).await {
            return Ok(Some(e));
        }
    }
    Ok(None)
}

/// A response head serve does not pass on: a protocol switch, or a transfer coding other
/// than chunked on a body.
fn refuse_head(method: &Method, head: &Head) -> Result<(), ExchangeError> {
    if head.status == StatusCode::SWITCHING_PROTOCOLS {
        return Err(ExchangeError::upstream_message(
            "answered 101 Switching Protocols: serve does not pass protocol upgrades through"
                .into(),
        ));
    }
    if !http1::has_no_body(method, head.status)
        && let Some(coding) = reframe::foreign_coding(&head.headers)
    {
        return Err(ExchangeError::upstream_message(format!(
            "answered with Transfer-Encoding {coding:?}: serve passes only chunked (the client offered no coding in TE)"
        )));
    }
    Ok(())
}

/// The upstream answered with a head: deliver its response to the client, keep the
/// upstream connection if it may carry another request (it took the whole request body,
/// the body ended cleanly and both sides allow it), and end the exchange.
async fn respond(
    sh: &Arc<Shared>,
    down: &mut Down,
    st: &mut ConnState,
    mut p: InFlight,
    guard: PendingGuard,
    sent: Sent,
    reply: Reply,
) -> bool {
    let Sent {
        mut conn,
        head,
        head_ns,
        sent_whole,
    } = sent;
    // serve writes the framing the client gets: the body's length, chunks (a chunked body
    // or one the close ends, to an HTTP/1.1 client, so that a cut can never look
    // complete), or until the close (an HTTP/1.0 client).
    let framing: ResponseFraming = reframe::response_framing(&head, &p.method, reply.http10);
    let keep = reply.keep && !framing.close;
    let mut body = ResponseBody::new(&head, head_ns, framing.body, &mut p.cap);
    // The head goes out without the hop-by-hop fields; the record keeps the worker's
    // head as it came (its bytes, kept when it was read).
    let wire = write::response_head(
        reply.http10,
        head.status,
        http1::end_to_end(&head.headers),
        &framing,
        keep,
    );
    let to = Upstream {
        conn: &mut conn,
        body: &mut body,
        cap: &mut p.cap,
    };
    let r = deliver::deliver(sh, down, to, Bytes::from(wire), st.limit).await;
    if body.trailers_dropped() {
        sh.trailers_dropped.fetch_add(1, Ordering::Relaxed);
    }
    if r.failure.is_none()
        && sent_whole
        && body.clean(&conn)
        && head.keep_alive
        && sh.opts.policy == ConnectionPolicy::KeepAlive
    {
        st.slot = Some(conn);
    }
    if body.done() {
        p.cap.finish_at_end();
    } else {
        p.cap.finish(clock::now_ns());
    }
    let ok = r.failure.is_none() && r.complete;
    let downstream = DownstreamEnd {
        at_ns: r.at_ns,
        complete: r.complete,
    };
    end::end(sh, p, r.failure, Some(downstream), guard);
    keep && ok
}

/// Answer a request that got no upstream head (400, 408, 502, 503, 504, with a JSON body
/// saying why); when and whether the answer was handed over whole.
async fn answer_error(down: &mut Down, e: &ExchangeError, reply: Reply) -> DownstreamEnd {
    answer_json(down, e.answer(), &e.message, reply).await
}

/// Answer with `answer`'s status and a JSON body `{"error": {"type", "message"}}`.
async fn answer_json(
    down: &mut Down,
    answer: Answer,
    message: &str,
    reply: Reply,
) -> DownstreamEnd {
    let body = serde_json::to_vec(&serde_json::json!({
        "error": {"type": answer.kind, "message": format!("matrix-proxy: {message}")}
    }))
    .unwrap_or_default();
    let framing = ResponseFraming {
        body: reframe::Reframe::Raw,
        length: Some(body.len() as u64),
        close: !reply.keep,
    };
    let mut wire = write::response_head(
        reply.http10,
        answer.status,
        [("content-type", &b"application/json"[..])],
        &framing,
        reply.keep,
    );
    wire.extend_from_slice(&body);
    let complete = down.send(&wire).await.is_ok();
    DownstreamEnd {
        at_ns: clock::now_ns(),
        complete,
    }
}
