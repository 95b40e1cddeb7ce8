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
use http::{HeaderMap, Method, StatusCode, Uri};

use super::client::ClientConn;
use super::down::{BodyUp, Down, DownstreamEnd};
use super::end;
use super::relay::{self, Out};
use super::state::{InFlight, Pending, PendingGuard, Shared};
use crate::clock;
use crate::engine::http1::codec::{Framing, Head};
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

/// The headers sent upstream: hop-by-hop removed, `Expect` answered here (`100 Continue`
/// once the request head is on its way up), forwarding headers added, `Host` kept unless
/// `rewrite_host`.
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

/// The request head as it goes up: the request line with the upstream target, the
/// headers, and `Transfer-Encoding: chunked` for a chunked body (it goes up as it came).
fn request_head(
    method: &Method,
    target: &str,
    headers: &HeaderMap,
    framing: BodyFraming,
) -> Vec<u8> {
    let mut b = Vec::with_capacity(64 + target.len() + 48 * headers.len());
    b.extend_from_slice(method.as_str().as_bytes());
    b.push(b' ');
    b.extend_from_slice(target.as_bytes());
    b.extend_from_slice(b" HTTP/1.1\r\n");
    write_fields(&mut b, all_fields(headers));
    if framing == BodyFraming::Chunked {
        b.extend_from_slice(b"transfer-encoding: chunked\r\n");
    }
    b.extend_from_slice(b"\r\n");
    b
}

fn write_fields<'a>(b: &mut Vec<u8>, fields: impl IntoIterator<Item = (&'a str, &'a [u8])>) {
    for (name, value) in fields {
        b.extend_from_slice(name.as_bytes());
        b.extend_from_slice(b": ");
        b.extend_from_slice(value);
        b.extend_from_slice(b"\r\n");
    }
}

/// A header map's fields, as [`write_fields`] takes them.
fn all_fields(h: &HeaderMap) -> impl Iterator<Item = (&str, &[u8])> {
    h.iter().map(|(n, v)| (n.as_str(), v.as_bytes()))
}

/// A response head for the client: its version, the status, the fields, then the
/// framing and connection fields serve decides.
fn response_head<'a>(
    http10: bool,
    status: StatusCode,
    fields: impl IntoIterator<Item = (&'a str, &'a [u8])>,
    chunked: bool,
    keep: bool,
) -> Vec<u8> {
    let mut b = Vec::with_capacity(512);
    b.extend_from_slice(if http10 { b"HTTP/1.0 " } else { b"HTTP/1.1 " });
    b.extend_from_slice(status.as_str().as_bytes());
    b.push(b' ');
    b.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    b.extend_from_slice(b"\r\n");
    write_fields(&mut b, fields);
    if chunked {
        b.extend_from_slice(b"transfer-encoding: chunked\r\n");
    }
    if !keep {
        b.extend_from_slice(b"connection: close\r\n");
    } else if http10 {
        b.extend_from_slice(b"connection: keep-alive\r\n");
    }
    b.extend_from_slice(b"\r\n");
    b
}

/// How waiting for the upstream head failed.
enum NoHead {
    /// On the worker's side, or by serve's deadline or cut: answered 502 / 503 / 504.
    Upstream(ExchangeError),
    /// The client went away (before the head, or in the middle of its request body):
    /// nobody to answer.
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
    let headers = upstream_headers(headers, &st.client, sh);
    // The record's URL; the upstream target is its tail.
    let url = upstream_url(sh, &uri);
    let wire = request_head(&method, &url[sh.origin_len..], &headers, framing);
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
    let mut body = BodyUp::new(framing);
    let mut copy = BodyCopy::new(sh.opts.max_record_body, Some(sh.budget.clone()));
    let mut cut = sh.cut.clone();
    let sending = send(
        sh,
        down,
        st,
        wire,
        &mut body,
        expect_continue,
        &mut copy,
        &mut p,
    );
    let sent = tokio::select! {
        r = tokio::time::timeout(sh.opts.upstream_timeout, sending) => r.unwrap_or_else(|_| {
            Err(NoHead::Upstream(ExchangeError::deadline(format!(
                "upstream {} sent no response head within --upstream-timeout ({} s)",
                sh.opts.upstream.authority,
                sh.opts.upstream_timeout.as_secs_f64()
            ))))
        }),
        _ = cut.wait_for(|c| *c) => Err(NoHead::Upstream(ExchangeError::shutdown_cut())),
    };
    p.tee = copy.take();
    // The connection can carry another request only if this one was read to its end.
    let keep = keep_alive && body.done() && !stopping;
    match sent {
        Ok((conn, head, head_ns)) => {
            respond(sh, down, st, p, guard, conn, head, head_ns, http10, keep).await
        }
        Err(NoHead::Client(e)) => {
            p.cap.finish(clock::now_ns());
            end::end(sh, p, Some(e), None, guard);
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

/// Write the request up (its body streamed as the client sends it) and wait for the
/// response head, watching for the client's close meanwhile.
#[allow(clippy::too_many_arguments)]
async fn send(
    sh: &Shared,
    down: &mut Down,
    st: &mut ConnState,
    mut wire: Vec<u8>,
    body: &mut BodyUp,
    expect_continue: bool,
    copy: &mut BodyCopy,
    p: &mut InFlight,
) -> Result<(LeanConn, Head, u64), NoHead> {
    let up = |mut e: ExchangeError| {
        e.message = format!("upstream {}: {}", sh.opts.upstream.authority, e.message);
        NoHead::Upstream(e)
    };
    let bad_body = |m: String| NoHead::Client(ExchangeError::client_request_body(&m));
    // Body bytes that came with the head go up with it, in one write.
    let first = body.take(&mut down.buf, copy).map_err(bad_body)?;
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
    while !body.done() {
        match down.read_more().await {
            Ok(0) | Err(_) => {
                return Err(NoHead::Client(ExchangeError::client_request_body(
                    "the client closed its connection",
                )));
            }
            Ok(_) => {}
        }
        let more = body.take(&mut down.buf, copy).map_err(bad_body)?;
        conn.send_more(&more).await.map_err(up)?;
    }
    let (head, at) = tokio::select! {
        r = conn.read_head(&p.method, &mut p.cap) => r.map_err(up)?,
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
    Ok((conn, head, at))
}

/// The upstream answered with a head: relay its response to the client, keep the
/// upstream connection if it may carry another request, and end the exchange.
#[allow(clippy::too_many_arguments)]
async fn respond(
    sh: &Arc<Shared>,
    down: &mut Down,
    st: &mut ConnState,
    mut p: InFlight,
    guard: PendingGuard,
    mut conn: LeanConn,
    head: Head,
    head_ns: u64,
    http10: bool,
    keep: bool,
) -> bool {
    let no_body = http1::has_no_body(&p.method, head.status);
    // How the client gets the body: as it came, or (a body the close ends, to an HTTP/1.1
    // client) in chunks, so that a cut can never look complete; an HTTP/1.0 client gets
    // an unframed body until the close.
    let out = match head.framing {
        _ if no_body => Out::AsIs,
        Framing::Chunked | Framing::Close if http10 => Out::UntilClose,
        Framing::Close => Out::Rechunk,
        _ => Out::AsIs,
    };
    let keep = keep && out != Out::UntilClose;
    let chunked = !http10 && matches!(head.framing, Framing::Chunked | Framing::Close) && !no_body;
    let mut relay_body = BodyRelay::new(
        &head,
        head_ns,
        http10 && head.framing == Framing::Chunked,
        &mut p.cap,
    );
    // The head goes out without the hop-by-hop fields; the record keeps the worker's
    // map as it came (moved, not copied).
    let wire = response_head(
        http10,
        head.status,
        http1::end_to_end(&head.headers),
        chunked,
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
        out,
        st.limit,
    )
    .await;
    if r.failure.is_none()
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

/// Answer a request that got no upstream head (502, 503, 504, with a JSON body saying
/// why); when and whether the answer was handed over whole.
async fn answer_error(
    down: &mut Down,
    e: &ExchangeError,
    http10: bool,
    keep: bool,
) -> DownstreamEnd {
    let (status, kind) = e.status();
    let body = serde_json::to_vec(&serde_json::json!({
        "error": {"type": kind, "message": format!("matrix-proxy: {}", e.message)}
    }))
    .unwrap_or_default();
    let mut fields = HeaderMap::with_capacity(2);
    fields.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    fields.insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
    let mut wire = response_head(http10, status, all_fields(&fields), false, keep);
    wire.extend_from_slice(&body);
    let complete = down.send(&wire).await.is_ok();
    DownstreamEnd {
        at_ns: clock::now_ns(),
        complete,
    }
}
