//! serve as a transducer (HTTP Garden's view of a proxy): feed it a client's bytes (or a
//! worker's answer), take what it writes on, and parse that with several servers (or
//! clients) that disagree about the edges of HTTP/1: hyper, a lenient reader (httparse for
//! heads and a chunked decoder after nginx's `ngx_http_parse_chunked`, which takes a bare
//! LF anywhere, trailers included) and a strict one (CRLF only, one framing field, no
//! obs-fold). Each must read exactly the messages serve recorded, followed by one more on
//! the same connection: so nothing serve forwards can be read as a second, unrecorded
//! message, and nothing recorded can be read differently. The steps are the functions
//! serve runs (`engine::http1::reframe`, `engine::http1::write`,
//! `engine::upstream::whole_body`), without sockets.

use bytes::{Buf, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, StatusCode};

use crate::engine::http1::codec::parse_head;
use crate::engine::http1::reframe::{self, RequestBody};
use crate::engine::http1::request::{BodyFraming, parse_request_head};
use crate::engine::http1::write::{request_head, response_head};
use crate::engine::http1::{end_to_end, has_no_body};
use crate::engine::upstream::whole_body;

/// A request as a server hands it on: method, target, fields (without
/// `Transfer-Encoding`, which serve writes and does not record), body data.
type Req = (String, String, Vec<(String, Vec<u8>)>, Vec<u8>);
/// A response as a client reads it: status, end-to-end fields ([`end_to_end_fields`]) and
/// body data.
type Resp = (u16, Vec<(String, Vec<u8>)>, Vec<u8>);

/// The honest request a client sends next on the same connection (the one a smuggled
/// request would answer in its place).
const SECOND: &[u8] = b"GET /second HTTP/1.1\r\nhost: b\r\n\r\n";
/// What serve's connection carries after the input's requests, and after a response.
const NEXT_REQUEST: &[u8] = b"GET /next HTTP/1.1\r\nhost: next\r\n\r\n";
const NEXT_RESPONSE: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nnext";
/// The `Host` serve gives a request that came without one (its upstream's authority).
const UPSTREAM_HOST: &str = "upstream.test";

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A response's fields without those serve writes itself (its framing and `Connection`),
/// sorted (a map groups a repeated name; the record keeps wire order).
fn end_to_end_fields<'a>(h: impl Iterator<Item = (&'a str, &'a [u8])>) -> Vec<(String, Vec<u8>)> {
    let serves = [
        header::CONTENT_LENGTH,
        header::TRANSFER_ENCODING,
        header::CONNECTION,
    ];
    let mut v: Vec<(String, Vec<u8>)> = h
        .filter(|(n, _)| !serves.iter().any(|s| s.as_str().eq_ignore_ascii_case(n)))
        .map(|(n, v)| (n.to_ascii_lowercase(), v.to_vec()))
        .collect();
    v.sort();
    v
}

/// A map's fields as [`end_to_end_fields`] reads them.
fn map_fields(h: &HeaderMap) -> Vec<(String, Vec<u8>)> {
    end_to_end_fields(h.iter().map(|(n, v)| (n.as_str(), v.as_bytes())))
}

fn fields(h: &HeaderMap) -> Vec<(String, Vec<u8>)> {
    h.iter()
        .filter(|(n, _)| **n != header::TRANSFER_ENCODING)
        .map(|(n, v)| (n.to_string(), v.as_bytes().to_vec()))
        .collect()
}

/// serve as a transducer of requests: see [`serve_request_forwarded`].
pub fn serve_request(data: &[u8]) {
    let _ = serve_request_forwarded(data);
}

/// What serve forwards for the client bytes `data` (alone, and followed by an honest
/// second request on the same connection) reads, under hyper's server, the lenient and
/// the strict reader, as exactly the requests serve recorded, then one more. Panics
/// otherwise; returns how many requests serve forwarded.
pub fn serve_request_forwarded(data: &[u8]) -> usize {
    let rt = super::views::runtime();
    let mut most = 0;
    for input in [data.to_vec(), [data, SECOND].concat()] {
        let (wire, recorded) = forward_requests(&input);
        most = most.max(recorded.len());
        if recorded.is_empty() {
            continue;
        }
        let wire = [wire.as_slice(), NEXT_REQUEST].concat();
        let mut want = recorded;
        want.push((
            "GET".into(),
            "/next".into(),
            vec![("host".into(), b"next".to_vec())],
            Vec::new(),
        ));
        let views = [
            ("hyper's server", hyper_requests(&rt, &wire)),
            ("a lenient reader", read_requests(&wire, Reader::Lenient)),
            ("a strict reader", read_requests(&wire, Reader::Strict)),
        ];
        for (who, got) in views {
            assert_eq!(
                got.as_ref(),
                Ok(&want),
                "{who} reads serve's forwarded bytes {:?} (for the client's {:?}) as other requests than serve recorded",
                lossy(&wire),
                lossy(&input)
            );
        }
    }
    most
}

/// The requests serve forwards for a client connection that sent `input`, and what it
/// records of each: as `serve_conn` and `forward::exchange` do, request by request while
/// the connection may carry another (a refused or cut request ends it, and is not part of
/// a complete forwarded message).
fn forward_requests(input: &[u8]) -> (Vec<u8>, Vec<Req>) {
    let mut buf = BytesMut::from(input);
    let (mut wire, mut recorded) = (Vec::new(), Vec::new());
    while let Ok(Some((head, n))) = parse_request_head(&buf) {
        buf.advance(n);
        if reframe::refusal(&head).is_some() {
            break;
        }
        let mut h = head.headers;
        reframe::request_fields(&mut h, &head.uri, head.framing);
        if !h.contains_key(header::HOST) {
            h.insert(header::HOST, HeaderValue::from_static(UPSTREAM_HOST));
        }
        let target = reframe::origin_form(&head.uri).to_string();
        let chunked = head.framing == BodyFraming::Chunked;
        let mut one = request_head(&head.method, &target, &h, chunked, 0);
        let mut body = RequestBody::new(head.framing);
        let mut data = Vec::new();
        let Ok(b) = body.take(&mut buf, |d| data.extend_from_slice(d)) else {
            break;
        };
        if !body.done() {
            break;
        }
        one.extend_from_slice(&b);
        wire.extend_from_slice(&one);
        recorded.push((head.method.to_string(), target, fields(&h), data));
        if !head.keep_alive {
            break;
        }
    }
    (wire, recorded)
}

/// Every request hyper's HTTP/1 server hands its service from `wire` on one connection,
/// or why it stopped.
fn hyper_requests(rt: &tokio::runtime::Runtime, wire: &[u8]) -> Result<Vec<Req>, Unread> {
    let (seen, clean, _) = super::views::hyper_server_run(rt, wire).map_err(Unread::hyper)?;
    let mut out = Vec::new();
    for (parts, body) in seen {
        let target = parts.uri.to_string();
        out.push((
            parts.method.to_string(),
            target,
            fields(&parts.headers),
            body.map_err(Unread::hyper)?,
        ));
    }
    if clean {
        Ok(out)
    } else {
        Err(Unread::HyperStopped(out.len()))
    }
}

/// serve as a transducer of responses: see [`serve_response_forwarded`].
pub fn serve_response(data: &[u8]) {
    let _ = serve_response_forwarded(data);
}

/// What serve writes to an HTTP/1.1 client for the worker's answer `data` to a GET (then
/// the worker's close) reads, under hyper's client, the lenient and the strict reader, as
/// exactly the response serve recorded (its status, body and the end-to-end fields of
/// the head the row keeps), then a second one on the same connection. Panics
/// otherwise; returns whether serve relayed a response (else it answers 502 itself).
pub fn serve_response_forwarded(data: &[u8]) -> bool {
    let Some((client, recorded)) = relay_response(data) else {
        return false;
    };
    let rt = super::views::runtime();
    let wire = [client.as_slice(), NEXT_RESPONSE].concat();
    let want = vec![recorded, (200, Vec::new(), b"next".to_vec())];
    let views = [
        ("hyper's client", hyper_responses(&rt, &client)),
        ("a lenient reader", read_responses(&wire, Reader::Lenient)),
        ("a strict reader", read_responses(&wire, Reader::Strict)),
    ];
    for (who, got) in views {
        assert_eq!(
            got.as_ref(),
            Ok(&want),
            "{who} reads serve's bytes {:?} (for the worker's {:?}) as other responses than serve recorded",
            lossy(&wire),
            lossy(data)
        );
    }
    true
}

/// The bytes serve writes to an HTTP/1.1 client for the worker's answer `data`, and the
/// status, fields and body it records (the fields as the row reads them from the head it
/// keeps, less the hop-by-hop ones by serve's own rule); `None` where serve answers 502
/// itself (no head it takes, a 101, a coding other than chunked, a malformed or cut body).
fn relay_response(data: &[u8]) -> Option<(Vec<u8>, Resp)> {
    let get = Method::GET;
    let mut at = 0;
    let (head, kept) = loop {
        let (head, n) = parse_head(&data[at..], &get).ok()??;
        at += n;
        if !matches!(head.status.as_u16(), 100 | 102..=199) {
            break (head, &data[at - n..at]);
        }
    };
    if head.status == StatusCode::SWITCHING_PROTOCOLS
        || (!has_no_body(&get, head.status) && reframe::foreign_coding(&head.headers).is_some())
    {
        return None;
    }
    let framing = reframe::response_framing(&head, &get, false);
    let mut client = response_head(
        false,
        head.status,
        end_to_end(&head.headers),
        &framing,
        !framing.close,
    );
    let (body, recorded) = whole_body(&head, &data[at..], framing.body).ok()?;
    client.extend_from_slice(&body);
    Some((
        client,
        (head.status.as_u16(), recorded_fields(kept), recorded),
    ))
}

/// The end-to-end fields of the head the row keeps (`kept`, as read), by serve's rule
/// (`http1::end_to_end`) over the fields the row records.
fn recorded_fields(kept: &[u8]) -> Vec<(String, Vec<u8>)> {
    let mut row = HeaderMap::new();
    let head = crate::record::WireHead::new(bytes::Bytes::copy_from_slice(kept));
    let (mut count, mut names, mut values) = (0, 0, 0);
    head.for_each_field(|n, v| {
        (count, names, values) = (count + 1, names + n.len(), values + v.len());
        // A head the codec took has fields a map takes: it built one from them.
        let name = HeaderName::from_bytes(n.as_bytes()).expect("a recorded field name");
        let value = HeaderValue::from_bytes(v).expect("a recorded field value");
        row.append(name, value);
    });
    // The bounds the writer sizes its steps and buffers with, read without parsing, hold
    // for every head the codec takes.
    let (c, k, v) = head.sizes();
    assert!(
        c >= count && k >= names && v >= values,
        "sizes below the fields of {kept:?}"
    );
    end_to_end_fields(end_to_end(&row))
}

/// The two responses hyper's client reads on one connection: `first` in answer to its
/// first GET, [`NEXT_RESPONSE`] to its second.
fn hyper_responses(rt: &tokio::runtime::Runtime, first: &[u8]) -> Result<Vec<Resp>, Unread> {
    use http_body_util::BodyExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let first = first.to_vec();
    rt.block_on(async move {
        let (client, mut server) = tokio::io::duplex(first.len() + (64 << 10));
        tokio::spawn(async move {
            let mut seen = Vec::new();
            let mut b = [0u8; 1024];
            for answer in [first.as_slice(), NEXT_RESPONSE] {
                // Each answer after its request head: hyper refuses bytes that come unasked.
                while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                    match server.read(&mut b).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => seen.extend_from_slice(&b[..n]),
                    }
                }
                seen.clear();
                let _ = server.write_all(answer).await;
            }
            let _ = server.shutdown().await;
        });
        let run = async {
            let (mut send, conn) =
                hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(client))
                    .await
                    .map_err(Unread::hyper)?;
            tokio::spawn(conn);
            let mut out = Vec::new();
            for path in ["/", "/next"] {
                send.ready().await.map_err(Unread::hyper)?;
                let req = http::Request::get(path)
                    .header(header::HOST, "fuzz")
                    .body(http_body_util::Empty::<bytes::Bytes>::new())
                    .map_err(Unread::hyper)?;
                let resp = send.send_request(req).await.map_err(Unread::hyper)?;
                let status = resp.status().as_u16();
                let fields = map_fields(resp.headers());
                let body = resp.into_body().collect().await;
                out.push((
                    status,
                    fields,
                    body.map_err(Unread::hyper)?.to_bytes().to_vec(),
                ));
            }
            Ok(out)
        };
        tokio::time::timeout(std::time::Duration::from_secs(5), run)
            .await
            .map_err(|_| Unread::HyperTimeout)?
    })
}

/// Why a reader (hyper, the lenient or the strict one) did not read the wire as messages.
/// Only whether each reader read the messages serve recorded is compared; the words say
/// which rule stopped it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum Unread {
    /// hyper refused, in its own words (its errors have no kind to compare).
    #[error("{0}")]
    Hyper(String),
    #[error("hyper's server stopped after {0} requests")]
    HyperStopped(usize),
    #[error("hyper did not finish in 5 s")]
    HyperTimeout,
    #[error("invalid HTTP header name")]
    FieldName,
    #[error("failed to parse header value")]
    FieldValue,
    #[error("a bare line end or obs-fold at byte {0}")]
    BareLineEnd(usize),
    #[error("a bad length {0:?}")]
    BadLength(String),
    #[error("more than one framing field")]
    TwoFramings,
    #[error("a coding")]
    Coding,
    #[error("chunked is not the last coding")]
    ChunkedNotLast,
    #[error("{announced} body bytes announced, {there} there")]
    ShortBody { announced: usize, there: usize },
    #[error("a line without its end")]
    NoLineEnd,
    #[error("a bare LF")]
    BareLf,
    #[error("a bare CR")]
    BareCr,
    #[error("a bad chunk size line {0:?}")]
    BadChunkSize(String),
    #[error("{0}")]
    ChunkSize(#[from] std::num::ParseIntError),
    #[error("a trailer line that is no field {0:?}")]
    BadTrailer(String),
    #[error("a short chunk")]
    ShortChunk,
    #[error("data longer than its chunk size")]
    ChunkTooLong,
    #[error("no {what} head at byte {at}: {parsed}")]
    NoHead {
        what: &'static str,
        at: usize,
        parsed: String,
    },
    #[error("not one Host")]
    NotOneHost,
    /// A status code outside 100..=999.
    #[error("invalid status code")]
    Status(u16),
}

impl Unread {
    fn hyper(e: impl std::fmt::Display) -> Unread {
        Unread::Hyper(e.to_string())
    }
}

/// How a reader takes what hyper's rules would refuse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reader {
    /// httparse heads (bare LF line ends allowed), the last coding decides, the first
    /// length counts, chunks as nginx's `ngx_http_parse_chunked` reads them.
    Lenient,
    /// CRLF only, no obs-fold, one `Content-Length` of plain digits or one
    /// `Transfer-Encoding: chunked` and not both, chunks by RFC 9112 to the letter.
    Strict,
}

/// How a message's body ends, as a reader reads its head.
#[derive(Debug, Clone, Copy)]
enum Body {
    Length(usize),
    Chunked,
    Close,
}

/// A head's fields as a map, or why the reader refuses them.
fn to_map(raw: &[httparse::Header<'_>]) -> Result<HeaderMap, Unread> {
    let mut h = HeaderMap::new();
    for f in raw {
        let name = HeaderName::from_bytes(f.name.as_bytes()).map_err(|_| Unread::FieldName)?;
        let value = HeaderValue::from_bytes(f.value).map_err(|_| Unread::FieldValue)?;
        h.append(name, value);
    }
    Ok(h)
}

/// The strict reader's rules for a head's bytes: every line ends in CRLF, no bare CR or
/// LF, no obs-fold.
fn strict_head(head: &[u8]) -> Result<(), Unread> {
    for (i, &b) in head.iter().enumerate() {
        let bare_lf = b == b'\n' && (i == 0 || head[i - 1] != b'\r');
        let bare_cr = b == b'\r' && head.get(i + 1) != Some(&b'\n');
        let fold = b == b'\n' && matches!(head.get(i + 1), Some(b' ' | b'\t'));
        if bare_lf || bare_cr || fold {
            return Err(Unread::BareLineEnd(i));
        }
    }
    Ok(())
}

/// How `r` frames a body from the head's fields (`none`: the message has no body by
/// definition; `close`: what a request or a response without framing fields gets).
fn framing(h: &HeaderMap, r: Reader, none: bool, close: Body) -> Result<Body, Unread> {
    if none {
        return Ok(Body::Length(0));
    }
    let te: Vec<&HeaderValue> = h.get_all(header::TRANSFER_ENCODING).iter().collect();
    let cl: Vec<&HeaderValue> = h.get_all(header::CONTENT_LENGTH).iter().collect();
    let length = |v: &HeaderValue| {
        let v = v.as_bytes();
        (!v.is_empty() && v.iter().all(u8::is_ascii_digit))
            .then(|| String::from_utf8_lossy(v).parse::<usize>().ok())
            .flatten()
            .ok_or_else(|| Unread::BadLength(lossy(v)))
    };
    match r {
        Reader::Strict if te.len() > 1 || (!te.is_empty() && !cl.is_empty()) || cl.len() > 1 => {
            Err(Unread::TwoFramings)
        }
        Reader::Strict if !te.is_empty() && te[0] != "chunked" => Err(Unread::Coding),
        Reader::Lenient
            if te
                .last()
                .is_some_and(|v| !crate::engine::http1::ends_in_chunked(v)) =>
        {
            Err(Unread::ChunkedNotLast)
        }
        _ if !te.is_empty() => Ok(Body::Chunked),
        _ => cl
            .first()
            .map_or(Ok(close), |v| length(v).map(Body::Length)),
    }
}

/// The body at the start of `b` framed as `body`: its data and the bytes it took.
fn read_body(b: &[u8], body: Body, r: Reader) -> Result<(Vec<u8>, usize), Unread> {
    match body {
        Body::Length(n) if n <= b.len() => Ok((b[..n].to_vec(), n)),
        Body::Length(n) => Err(Unread::ShortBody {
            announced: n,
            there: b.len(),
        }),
        Body::Close => Ok((b.to_vec(), b.len())),
        Body::Chunked => chunks(b, r),
    }
}

/// One line at `b[*i..]`: its bytes without the line end; the lenient reader ends lines
/// at LF (a CR before it dropped), the strict one at CRLF only (a bare CR or LF refused).
fn line<'a>(b: &'a [u8], i: &mut usize, r: Reader) -> Result<&'a [u8], Unread> {
    let rest = &b[*i..];
    let lf = rest
        .iter()
        .position(|&c| c == b'\n')
        .ok_or(Unread::NoLineEnd)?;
    let mut l = &rest[..lf];
    match l.last() {
        Some(b'\r') => l = &l[..l.len() - 1],
        _ if r == Reader::Strict => return Err(Unread::BareLf),
        _ => {}
    }
    if r == Reader::Strict && l.contains(&b'\r') {
        return Err(Unread::BareCr);
    }
    *i += lf + 1;
    Ok(l)
}

/// A chunked body: the lenient reader takes nginx's way (hex digits, then anything up to
/// the line end; trailer lines up to the first empty one), the strict one RFC 9112's
/// grammar (extensions after `;` only, trailer lines that are fields).
fn chunks(b: &[u8], r: Reader) -> Result<(Vec<u8>, usize), Unread> {
    let (mut i, mut data) = (0, Vec::new());
    loop {
        let l = line(b, &mut i, r)?;
        let digits = l.iter().take_while(|c| c.is_ascii_hexdigit()).count();
        let rest = &l[digits..];
        if digits == 0
            || digits > 15
            || (r == Reader::Strict && !rest.is_empty() && rest[0] != b';')
        {
            return Err(Unread::BadChunkSize(lossy(l)));
        }
        let size = usize::from_str_radix(&String::from_utf8_lossy(&l[..digits]), 16)?;
        if size == 0 {
            loop {
                let t = line(b, &mut i, r)?;
                if t.is_empty() {
                    return Ok((data, i));
                }
                if r == Reader::Strict && !t.contains(&b':') {
                    return Err(Unread::BadTrailer(lossy(t)));
                }
            }
        }
        let end = i
            .checked_add(size)
            .filter(|&e| e <= b.len())
            .ok_or(Unread::ShortChunk)?;
        data.extend_from_slice(&b[i..end]);
        i = end;
        if !line(b, &mut i, r)?.is_empty() {
            return Err(Unread::ChunkTooLong);
        }
    }
}

/// Every request in `wire`, as `r` reads them.
fn read_requests(wire: &[u8], r: Reader) -> Result<Vec<Req>, Unread> {
    let (mut at, mut out) = (0, Vec::new());
    while at < wire.len() {
        let mut raw = [httparse::EMPTY_HEADER; 128];
        let mut req = httparse::Request::new(&mut raw);
        let n = match req.parse(&wire[at..]) {
            Ok(httparse::Status::Complete(n)) => n,
            other => {
                return Err(Unread::NoHead {
                    what: "request",
                    at,
                    parsed: format!("{other:?}"),
                });
            }
        };
        if r == Reader::Strict {
            strict_head(&wire[at..at + n])?;
        }
        let h = to_map(req.headers)?;
        if r == Reader::Strict && h.get_all(header::HOST).iter().count() != 1 {
            return Err(Unread::NotOneHost);
        }
        let method = req.method.unwrap_or_default().to_string();
        let target = req.path.unwrap_or_default().to_string();
        let body = framing(&h, r, false, Body::Length(0))?;
        at += n;
        let (data, used) = read_body(&wire[at..], body, r)?;
        at += used;
        out.push((method, target, fields(&h), data));
    }
    Ok(out)
}

/// Every response to a GET in `wire`, as `r` reads them (a body without framing runs to
/// the end).
fn read_responses(wire: &[u8], r: Reader) -> Result<Vec<Resp>, Unread> {
    let (mut at, mut out) = (0, Vec::new());
    while at < wire.len() {
        let mut raw = [httparse::EMPTY_HEADER; 128];
        let mut res = httparse::Response::new(&mut raw);
        let n = match res.parse(&wire[at..]) {
            Ok(httparse::Status::Complete(n)) => n,
            other => {
                return Err(Unread::NoHead {
                    what: "response",
                    at,
                    parsed: format!("{other:?}"),
                });
            }
        };
        if r == Reader::Strict {
            strict_head(&wire[at..at + n])?;
        }
        let h = to_map(res.headers)?;
        let code = res.code.unwrap_or(0);
        let status = StatusCode::from_u16(code).map_err(|_| Unread::Status(code))?;
        let body = framing(&h, r, has_no_body(&Method::GET, status), Body::Close)?;
        at += n;
        let (data, used) = read_body(&wire[at..], body, r)?;
        at += used;
        out.push((code, map_fields(&h), data));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The readers disagree where they should: a bare LF in a trailer ends a lenient
    /// reader's body, and the strict reader refuses it.
    #[test]
    fn the_readers_differ_on_the_smuggling_cases() {
        let wire = b"POST /a HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX: a\n\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n";
        let lenient = read_requests(wire, Reader::Lenient).unwrap();
        assert_eq!(lenient.len(), 2);
        assert_eq!(lenient[1].1, "/smuggled");
        // The trailer line ends in a bare LF.
        assert_eq!(read_requests(wire, Reader::Strict), Err(Unread::BareLf));
        // What serve forwards for it is one request with its data (then, with the honest
        // second request after it, that one), as every reader reads it.
        assert_eq!(serve_request_forwarded(wire), 2);
        let (forwarded, recorded) = forward_requests(wire);
        assert_eq!(recorded[0].3, b"hello");
        assert!(!lossy(&forwarded).contains("smuggled"));
    }

    #[test]
    fn answers_serve_reframes_read_as_one_response() {
        for worker in [
            &b"HTTP/1.1 200 OK\r\nconnection: content-length\r\ncontent-length: 5\r\n\r\nhello"[..],
            b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX: a\n\nHTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n\r\n",
            b"HTTP/1.1 200 OK\r\n\r\nuntil the close",
        ] {
            assert!(serve_response_forwarded(worker), "{:?}", lossy(worker));
        }
        assert!(!serve_response_forwarded(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\ncontent-length: 3\r\n\r\nabc"
        ));
    }
}
