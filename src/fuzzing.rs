//! Fuzz entry points: each takes arbitrary bytes and must never panic, overflow the stack or
//! disagree with itself. `fuzz/` drives them with libFuzzer (`fuzz/run.sh`); the corpora it
//! keeps are replayed through the same functions as ordinary tests on stable
//! (`tests/it/fuzz_corpus.rs`), so a finding stays fixed.

mod transducer;
mod views;

pub use transducer::{
    serve_request, serve_request_forwarded, serve_response, serve_response_forwarded,
};

use crate::config::plan::Plan;
use crate::config::shape::Shape;
use crate::oracle::{Oracle, Pointer};
use crate::sse::{Event, SseParser};
use views::{Refused, hyper_server_run, runtime};

/// Plan parsing and validation: an error or a plan, never a panic.
pub fn plan(data: &[u8]) {
    if let Ok(p) = Plan::from_json_bytes(data) {
        // A plan that validates can be described and counted.
        let _ = Shape::Plain.planned_requests(&p);
        for c in &p.cases {
            let _ = c.endpoint.url();
        }
    }
}

/// JSON pointer parsing.
pub fn pointer(data: &[u8]) {
    if let Ok(s) = std::str::from_utf8(data)
        && let Ok(p) = Pointer::parse(s)
    {
        assert_eq!(p.as_str(), s);
    }
}

/// Oracle comparison: the input is `expected \0 response`. Every response is judged
/// without panicking, and an expected document always matches itself.
pub fn oracle(data: &[u8]) {
    let (expected, body) = match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &data[..0]),
    };
    let Ok(expected) = serde_json::from_slice::<serde_json::Value>(expected) else {
        return;
    };
    let Ok(o) = Oracle::json(expected.clone(), Vec::new()) else {
        return;
    };
    let _ = o.check(body);
    let again = serde_json::to_vec(&expected).unwrap_or_default();
    assert_eq!(o.check(&again), Ok(()), "a document must match itself");
}

/// SSE parsing: the events do not depend on how the bytes were split into reads. The
/// first byte picks the read size.
pub fn sse(data: &[u8]) {
    let Some((&k, body)) = data.split_first() else {
        return;
    };
    let size = usize::from(k % 17) + 1;
    let whole = collect(&[body]);
    let chunks: Vec<&[u8]> = body.chunks(size).collect();
    let pieces = collect(&chunks);
    assert_eq!(
        whole, pieces,
        "splitting the bytes into reads of {size} changed the events"
    );
}

fn collect(chunks: &[&[u8]]) -> Vec<(Option<String>, String)> {
    let mut p = SseParser::new();
    let mut out: Vec<Event> = Vec::new();
    for c in chunks {
        if p.feed(c, 0, &mut out).is_err() {
            break;
        }
    }
    out.into_iter().map(|e| (e.event, e.data)).collect()
}

/// The lean client's response codec against hyper's client on the same bytes: both
/// accept them with the same status, header fields (ours as the row records them) and
/// body, or both refuse them. The input is what a
/// worker sends to a GET, then closes.
/// Then serve as a transducer of the same answer ([`serve_response`]).
pub fn http1_response(data: &[u8]) {
    let _ = http1_response_relayed(data);
}

/// [`http1_response`], saying whether serve relayed a response (`false`: it would answer
/// 502 itself), so that a test can count how many inputs were relayed.
pub fn http1_response_relayed(data: &[u8]) -> bool {
    // One runtime for every view of this input.
    let rt = runtime();
    let theirs = hyper_view(&rt, data);
    same_as_hyper("the lean client", data, &theirs, |step| {
        lean_view(&rt, data, step)
    });
    serve_response_forwarded(data)
}

/// Our reading of `data` (in one read, and split into reads of 1 and 7 bytes) against
/// hyper's: the same, or both refused.
fn same_as_hyper<T: PartialEq + std::fmt::Debug>(
    who: &str,
    data: &[u8],
    theirs: &Result<T, Refused>,
    ours: impl Fn(usize) -> Result<T, Refused>,
) {
    for step in [usize::MAX, 1, 7] {
        let ours = ours(step);
        match (&ours, theirs) {
            (Ok(a), Ok(b)) => assert_eq!(a, b, "{who} and hyper differ (reads of {step})"),
            (Err(_), Err(_)) => {}
            _ => panic!(
                "{who} says {ours:?}, hyper says {theirs:?} (reads of {step}) for {:?}",
                String::from_utf8_lossy(data)
            ),
        }
    }
}

/// A response as a reader took it: status, header fields (sorted: a `HeaderMap` groups a
/// repeated name, the record keeps wire order) and body.
type ResponseView = (u16, Vec<(String, Vec<u8>)>, Vec<u8>);

/// What the lean client's reader (`engine::lean::read_response`, the code replay runs and
/// serve's upstream side reads heads with) makes of `data` followed by the end of the
/// stream, read `step` bytes at a time: the status, the header fields as the row records
/// them (from the head kept as read) and the body.
fn lean_view(
    rt: &tokio::runtime::Runtime,
    data: &[u8],
    step: usize,
) -> Result<ResponseView, Refused> {
    rt.block_on(async {
        let mut io = Pieces { data, step };
        let mut buf = bytes::BytesMut::new();
        let mut cap = crate::engine::Capture::start(1 << 20, None);
        crate::engine::lean::read_response(&mut io, &mut buf, &http::Method::GET, &mut cap)
            .await
            .map_err(|e| Refused::Ours(e.message))?;
        let got = cap.into_captured();
        let mut recorded = Vec::new();
        crate::record::WireHead::new(got.response_head)
            .for_each_field(|n, v| recorded.push((n.to_string(), v.to_vec())));
        recorded.sort();
        Ok((
            got.status.and_then(|s| u16::try_from(s).ok()).unwrap_or(0),
            recorded,
            got.body.bytes.to_vec(),
        ))
    })
}

/// A stream that hands out `data` at most `step` bytes per read, then ends.
struct Pieces<'a> {
    data: &'a [u8],
    step: usize,
}

impl tokio::io::AsyncRead for Pieces<'_> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let n = self.step.min(self.data.len()).min(buf.remaining());
        let (now, rest) = self.data.split_at(n);
        buf.put_slice(now);
        self.data = rest;
        std::task::Poll::Ready(Ok(()))
    }
}

/// What hyper's HTTP/1 client makes of `data` sent in answer to a GET, then a close.
fn hyper_view(rt: &tokio::runtime::Runtime, data: &[u8]) -> Result<ResponseView, Refused> {
    let hyper = |e: &dyn std::fmt::Display| Refused::Hyper(e.to_string());
    use http_body_util::BodyExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let data = data.to_vec();
    rt.block_on(async move {
        let (client, mut server) = tokio::io::duplex(data.len() + (64 << 10));
        tokio::spawn(async move {
            // Read the request head first: hyper refuses bytes that arrive unasked.
            let mut seen = Vec::new();
            let mut b = [0u8; 1024];
            while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                match server.read(&mut b).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => seen.extend_from_slice(&b[..n]),
                }
            }
            let _ = server.write_all(&data).await;
            let _ = server.shutdown().await;
            while matches!(server.read(&mut b).await, Ok(n) if n > 0) {}
        });
        let run = async {
            let (mut send, conn) =
                hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(client))
                    .await
                    .map_err(|e| hyper(&e))?;
            tokio::spawn(conn);
            let req = http::Request::get("/")
                .header(http::header::HOST, "fuzz")
                .body(http_body_util::Empty::<bytes::Bytes>::new())
                .map_err(|e| hyper(&e))?;
            let resp = send.send_request(req).await.map_err(|e| hyper(&e))?;
            let status = resp.status().as_u16();
            let mut head = fields(resp.headers());
            head.sort();
            let body = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| hyper(&e))?
                .to_bytes();
            Ok((status, head, body.to_vec()))
        };
        tokio::time::timeout(std::time::Duration::from_secs(5), run)
            .await
            .map_err(|_| Refused::Timeout)?
    })
}

/// The request side of our HTTP/1 codec (`engine::http1::request`, the first piece of
/// serve's own forwarding core) against hyper's server on the same bytes: both take the
/// first request with the same method, target, version, header fields, `100 Continue`
/// and body, or both refuse it. The input is what a client sends before closing its side.
/// Then serve as a transducer of the same bytes ([`serve_request`]).
pub fn http1_request(data: &[u8]) {
    let _ = http1_request_accepted(data);
}

/// [`http1_request`], saying whether the two took a request (`false`: both refused, or
/// neither saw one) and how many requests serve forwarded, so that a test can count how
/// many inputs compared whole requests.
pub fn http1_request_accepted(data: &[u8]) -> (bool, usize) {
    let rt = runtime();
    let theirs = hyper_server_view(&rt, data);
    same_as_hyper("our request reader", data, &theirs, |step| {
        request_view(&rt, data, step)
    });
    drop(rt);
    (matches!(theirs, Ok(Some(_))), serve_request_forwarded(data))
}

/// The first request as a server sees it.
#[derive(Debug, PartialEq)]
struct SeenRequest {
    method: String,
    target: String,
    http10: bool,
    /// Every header field kept, in order (hyper leaves out repeated and overridden
    /// `Content-Length` lines).
    fields: Vec<(String, Vec<u8>)>,
    /// The client is sent `100 Continue` before the body is read.
    expect_continue: bool,
    body: Vec<u8>,
}

/// `None`: the client closed before sending a request.
type RequestView = Option<SeenRequest>;

fn fields(h: &http::HeaderMap) -> Vec<(String, Vec<u8>)> {
    h.iter()
        .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
        .collect()
}

/// What our request reader makes of `data`, read `step` bytes at a time.
fn request_view(
    rt: &tokio::runtime::Runtime,
    data: &[u8],
    step: usize,
) -> Result<RequestView, Refused> {
    rt.block_on(async {
        let mut io = Pieces { data, step };
        let mut buf = bytes::BytesMut::new();
        let got = crate::engine::http1::request::read_request(&mut io, &mut buf)
            .await
            .map_err(|e| Refused::Ours(e.to_string()))?;
        Ok(got.map(|(h, body)| SeenRequest {
            method: h.method.to_string(),
            target: h.uri.to_string(),
            http10: h.http10,
            fields: fields(&h.headers),
            expect_continue: h.expect_continue,
            body,
        }))
    })
}

/// What hyper's HTTP/1 server hands its service for the first request in `data` (the
/// service reads the whole body), and whether it sent `100 Continue`.
fn hyper_server_view(rt: &tokio::runtime::Runtime, data: &[u8]) -> Result<RequestView, Refused> {
    let (seen, clean, answer) = hyper_server_run(rt, data)?;
    match seen.into_iter().next() {
        Some((parts, Ok(body))) => Ok(Some(SeenRequest {
            method: parts.method.to_string(),
            target: parts.uri.to_string(),
            http10: parts.version == http::Version::HTTP_10,
            fields: fields(&parts.headers),
            expect_continue: answer.starts_with(b"HTTP/1.1 100 Continue\r\n"),
            body,
        })),
        Some((_, Err(e))) => Err(e),
        // No request reached the service: none was sent (the connection closed cleanly),
        // or hyper refused its head.
        None if clean => Ok(None),
        None => Err(Refused::NoRequest),
    }
}

/// The Prometheus text reader: total (never panics), and a scrape written back from its
/// samples reads back to the same samples.
pub fn prom_text(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let first = crate::prom::parse(&text);
    let mut again = String::new();
    for s in &first.samples {
        let labels: Vec<String> = s
            .labels
            .iter()
            .map(|(k, v)| {
                let v = v
                    .replace('\\', "\\\\")
                    .replace('"', "\\\"")
                    .replace('\n', "\\n");
                format!("{k}=\"{v}\"")
            })
            .collect();
        let value = match s.value {
            v if v.is_nan() => "NaN".to_string(),
            v if v == f64::INFINITY => "+Inf".to_string(),
            v if v == f64::NEG_INFINITY => "-Inf".to_string(),
            v => format!("{v:?}"),
        };
        again.push_str(&format!("{}{{{}}} {value}\n", s.name, labels.join(",")));
    }
    let second = crate::prom::parse(&again);
    assert_eq!(second.errors, Vec::new(), "written back: {again}");
    assert_eq!(second.samples.len(), first.samples.len());
    for (a, b) in first.samples.iter().zip(&second.samples) {
        assert_eq!((&a.name, &a.labels), (&b.name, &b.labels));
        for (k, _) in &a.labels {
            assert_eq!(a.label(k), b.label(k));
        }
        assert!(a.value == b.value || (a.value.is_nan() && b.value.is_nan()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_views_read_a_plain_answer_and_refuse_a_broken_one() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        // An interim head first (skipped by both), names in mixed case, one repeated.
        let ok = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nSet-Cookie: b=2\r\n\
                   Content-Length: 5\r\nset-cookie: a=1\r\n\r\nhello";
        let field = |n: &str, v: &[u8]| (n.to_string(), v.to_vec());
        let fields = vec![
            field("content-length", b"5"),
            field("set-cookie", b"a=1"),
            field("set-cookie", b"b=2"),
        ];
        let want = Ok((200, fields, b"hello".to_vec()));
        assert_eq!(hyper_view(&rt, ok), want);
        assert_eq!(lean_view(&rt, ok, 3), want);
        let chunked =
            b"HTTP/1.1 201 Created\r\ntransfer-encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n";
        let te = vec![field("transfer-encoding", b"chunked")];
        assert_eq!(hyper_view(&rt, chunked), Ok((201, te, b"hi".to_vec())));
        let bad = b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nhello";
        assert!(matches!(hyper_view(&rt, bad), Err(Refused::Hyper(_))));
        assert!(matches!(lean_view(&rt, bad, 1), Err(Refused::Ours(_))));
        http1_response(ok);
        http1_response(bad);
    }
}
