//! The framing serve writes of what it forwards, both ways: never a peer's own framing
//! bytes, as nginx's proxy module does. A request goes up with serve's own
//! `Content-Length`, or chunked with its data decoded and chunked again; a response goes
//! down with its length, chunked again, or until the close with `connection: close`.
//! Trailer fields are written again from the fields hyper's rules read, never as their
//! bytes came: a lenient next hop (nginx's `ngx_http_parse_chunked`, h11) may take a bare
//! LF in them for the end of the body and what follows for a second message, so bytes
//! after the first empty line are left out (and counted by serve).
//!
//! `fuzzing::serve_request` and `fuzzing::serve_response` hold this to that promise: what
//! serve writes parses, under hyper, a lenient and a strict reader, as exactly the
//! messages it recorded, keep-alive sequences included.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, StatusCode, Uri};

use super::codec::{Chunked, CodecError, Framing, Head, digits};
use super::request::{BodyFraming, RequestHead};

/// The last chunk, with no trailer fields (a body the close ended).
pub(crate) const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

/// The first transfer coding of `h` that is not `chunked` (lower case), if any. serve
/// passes only `chunked`, which it writes itself: a request with another coding is
/// answered 501 (as nginx does), a response with one 502 (the client offered no coding in
/// `TE`, and serve would have to drop the marker and keep a length that no longer fits).
pub(crate) fn foreign_coding(h: &HeaderMap) -> Option<String> {
    h.get_all(header::TRANSFER_ENCODING)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .map(|t| {
            let t = t.split(|&b| b == b';').next().unwrap_or_default();
            String::from_utf8_lossy(t).trim().to_ascii_lowercase()
        })
        .find(|t| t != "chunked")
}

/// The status serve answers a request it read but will not forward, by the rules it
/// applies after its hyper-parity reader (hyper's server takes all of these):
/// - `CONNECT`: 405 (no tunnel passes through);
/// - a transfer coding other than `chunked`: 501, as nginx answers (serve writes the
///   framing itself and decodes no other coding);
/// - HTTP/1.1 without `Host`, or more than one `Host`: 400 (RFC 9112 section 3.2);
/// - the asterisk form (`OPTIONS *`): 400 (it asks about serve itself, and no URL can
///   record it).
pub(crate) fn refusal(head: &RequestHead) -> Option<StatusCode> {
    if head.method == Method::CONNECT {
        return Some(StatusCode::METHOD_NOT_ALLOWED);
    }
    if foreign_coding(&head.headers).is_some() {
        return Some(StatusCode::NOT_IMPLEMENTED);
    }
    let hosts = head.headers.get_all(header::HOST).iter().count();
    if hosts > 1 || (hosts == 0 && !head.http10) || head.uri.path() == "*" {
        return Some(StatusCode::BAD_REQUEST);
    }
    None
}

/// The fields of a request as serve forwards them, before the forwarding fields serve
/// adds: hop-by-hop fields removed, `Expect` left out (serve answers `100 Continue`
/// itself, as nginx does), the length serve's own ([`set_request_length`]), and an
/// absolute-form target's authority as `Host` (RFC 9112 section 3.2.2).
pub(crate) fn request_fields(h: &mut HeaderMap, uri: &Uri, framing: BodyFraming) {
    super::strip_hop_by_hop(h);
    h.remove(header::EXPECT);
    set_request_length(h, framing);
    // Host and port only: an authority's userinfo (`user:password@`) is a secret, never a
    // field that goes up or is recorded.
    if let Some(v) = uri.authority().and_then(|a| {
        let hostport = a.as_str().rsplit_once('@').map_or(a.as_str(), |(_, h)| h);
        HeaderValue::from_str(hostport).ok()
    }) {
        h.insert(header::HOST, v);
    }
}

/// A request's target as serve forwards it: its path and query (origin form), the path
/// `/` where an absolute-form target had none (`http://a?q` is `/?q`, RFC 9112 section
/// 3.2.1).
pub(crate) fn origin_form(uri: &Uri) -> std::borrow::Cow<'_, str> {
    match uri.path_and_query().map(|p| p.as_str()) {
        Some(pq) if pq.starts_with('/') => pq.into(),
        Some(pq) => format!("/{pq}").into(),
        None => "/".into(),
    }
}

/// Set the framing fields of a request as serve sends it, in its map (the record keeps
/// what went up): `Content-Length` is the body's length (left out for an empty body the
/// client sent without one) and no `Transfer-Encoding` (the head writer adds `chunked`).
pub(crate) fn set_request_length(h: &mut HeaderMap, framing: BodyFraming) {
    h.remove(header::TRANSFER_ENCODING);
    match framing {
        BodyFraming::Length(n) if n > 0 || h.contains_key(header::CONTENT_LENGTH) => {
            h.insert(header::CONTENT_LENGTH, HeaderValue::from(n));
        }
        _ => {
            h.remove(header::CONTENT_LENGTH);
        }
    }
}

/// `data` as one chunk (nothing for no data).
fn put_chunk(out: &mut BytesMut, data: &[u8]) {
    if data.is_empty() {
        return;
    }
    let size = format!("{:x}\r\n", data.len());
    out.reserve(size.len() + data.len() + 2);
    out.put_slice(size.as_bytes());
    out.put_slice(data);
    out.put_slice(b"\r\n");
}

/// A request body read from the client and forwarded in serve's own framing: a length's
/// bytes as they came (the length is serve's), a chunked body's data chunked again and the
/// last chunk written without trailers.
#[derive(Debug)]
pub(crate) struct RequestBody {
    left: u64,
    chunked: Option<Chunked>,
    trailers_dropped: bool,
}

impl RequestBody {
    pub(crate) fn new(framing: BodyFraming) -> RequestBody {
        match framing {
            BodyFraming::Length(n) => RequestBody {
                left: n,
                chunked: None,
                trailers_dropped: false,
            },
            BodyFraming::Chunked => RequestBody {
                left: 0,
                chunked: Some(Chunked::default()),
                trailers_dropped: false,
            },
        }
    }

    /// The whole body has been read.
    pub(crate) fn done(&self) -> bool {
        match &self.chunked {
            Some(c) => c.done(),
            None => self.left == 0,
        }
    }

    /// The client's trailer section held bytes past its end that were not forwarded.
    pub(crate) fn trailers_dropped(&self) -> bool {
        self.trailers_dropped
    }

    /// Take what `buf` holds of the body: the bytes to forward; its data also go to
    /// `data` (the record's copy). An error is a chunked body the client framed wrong.
    pub(crate) fn take(
        &mut self,
        buf: &mut BytesMut,
        mut data: impl FnMut(&[u8]),
    ) -> Result<Bytes, CodecError> {
        match &mut self.chunked {
            Some(c) => {
                let mut out = BytesMut::new();
                let used = c.decode(buf, |d| {
                    data(d);
                    put_chunk(&mut out, d);
                })?;
                buf.advance(used);
                if c.done() {
                    let (last, left_out) = c.last_chunk();
                    out.put_slice(&last);
                    self.trailers_dropped = left_out;
                }
                Ok(out.freeze())
            }
            None => {
                let n = buf
                    .len()
                    .min(usize::try_from(self.left).unwrap_or(usize::MAX));
                self.left -= n as u64;
                let b = buf.split_to(n).freeze();
                data(&b);
                Ok(b)
            }
        }
    }
}

/// How the client gets a response body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reframe {
    /// The bytes as read: a length's (the length is serve's), none, or to an HTTP/1.0
    /// client a body the close ends.
    Raw,
    /// The data chunked again, then the last chunk: a chunked body, or one the worker
    /// ends by closing (so a cut can never look complete), to an HTTP/1.1 client.
    Chunks,
    /// A chunked body's data alone, to an HTTP/1.0 client (the close ends it).
    Data,
}

/// The framing serve writes of a response to the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ResponseFraming {
    pub(crate) body: Reframe,
    /// The `Content-Length` serve writes (a body's length; for a HEAD or a 304 the
    /// worker's declared length, when it is one valid number).
    pub(crate) length: Option<u64>,
    /// The client's connection must close after this response (its end is the close).
    pub(crate) close: bool,
}

/// How serve frames the response `head` (to a `method` request) for a client speaking
/// HTTP/1.0 (`http10`) or HTTP/1.1.
pub(crate) fn response_framing(head: &Head, method: &Method, http10: bool) -> ResponseFraming {
    let (body, length, close) = match head.framing {
        Framing::Empty if *method == Method::HEAD || head.status == StatusCode::NOT_MODIFIED => {
            (Reframe::Raw, declared_length(&head.headers), false)
        }
        Framing::Empty => (Reframe::Raw, None, false),
        Framing::Length(n) => (Reframe::Raw, Some(n), false),
        Framing::Chunked if http10 => (Reframe::Data, None, true),
        Framing::Close if http10 => (Reframe::Raw, None, true),
        Framing::Chunked | Framing::Close => (Reframe::Chunks, None, false),
    };
    ResponseFraming {
        body,
        length,
        close,
    }
}

/// The one length every `Content-Length` value of `h` states, if they state one.
fn declared_length(h: &HeaderMap) -> Option<u64> {
    let mut length = None;
    for v in h.get_all(header::CONTENT_LENGTH) {
        for part in v.as_bytes().split(|&b| b == b',') {
            let n = digits(part.trim_ascii())?;
            if length.is_some_and(|m| m != n) {
                return None;
            }
            length = Some(n);
        }
    }
    length
}

/// A piece of a response body as the client gets it: `raw` is a close-delimited body's
/// bytes as read, chunked again under [`Reframe::Chunks`].
pub(crate) fn close_delimited_piece(raw: Bytes, body: Reframe) -> Bytes {
    match body {
        Reframe::Chunks if !raw.is_empty() => {
            let mut out = BytesMut::new();
            put_chunk(&mut out, &raw);
            out.freeze()
        }
        _ => raw,
    }
}

/// A chunked body's data as the client gets it: chunked again (`Chunks`) or alone.
pub(crate) fn chunked_data(out: &mut BytesMut, data: &[u8], body: Reframe) {
    match body {
        Reframe::Chunks => put_chunk(out, data),
        _ => out.put_slice(data),
    }
}

/// The end of a chunked body as the client gets it (`decoder` done): its last chunk and
/// trailer fields written again under `Chunks`, nothing otherwise; and whether trailer
/// bytes were left out.
pub(crate) fn chunked_end(out: &mut BytesMut, decoder: &Chunked, body: Reframe) -> bool {
    let (last, left_out) = decoder.last_chunk();
    if body == Reframe::Chunks {
        out.put_slice(&last);
    }
    left_out || (body != Reframe::Chunks && decoder.has_trailers())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(fields: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in fields {
            h.append(*n, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn an_absolute_form_userinfo_never_becomes_host() {
        let mut h = map(&[("host", "client.example")]);
        let uri: Uri = "http://user:s3cret@target.example:8080/p".parse().unwrap();
        request_fields(&mut h, &uri, BodyFraming::Length(0));
        assert_eq!(h[header::HOST], "target.example:8080");
        assert_eq!(origin_form(&uri), "/p");
    }

    #[test]
    fn foreign_codings_are_named() {
        assert_eq!(
            foreign_coding(&map(&[("transfer-encoding", "chunked")])),
            None
        );
        assert_eq!(
            foreign_coding(&map(&[("transfer-encoding", "gzip, Chunked")])),
            Some("gzip".into())
        );
        assert_eq!(
            foreign_coding(&map(&[
                ("transfer-encoding", "chunked"),
                ("transfer-encoding", "x;q=1")
            ])),
            Some("x".into())
        );
        assert_eq!(foreign_coding(&HeaderMap::new()), None);
    }

    #[test]
    fn request_lengths_are_serves_own() {
        let mut h = map(&[("content-length", "007"), ("x", "1")]);
        set_request_length(&mut h, BodyFraming::Length(7));
        assert_eq!(h[header::CONTENT_LENGTH], "7");
        let mut h = map(&[("x", "1")]);
        set_request_length(&mut h, BodyFraming::Length(0));
        assert!(!h.contains_key(header::CONTENT_LENGTH));
        let mut h = map(&[("transfer-encoding", "chunked")]);
        set_request_length(&mut h, BodyFraming::Chunked);
        let head = super::super::write::request_head(&Method::POST, "/p", &h, true, 0);
        assert_eq!(
            String::from_utf8(head).unwrap(),
            "POST /p HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n"
        );
    }

    #[test]
    fn chunked_request_bodies_are_chunked_again_without_trailers() {
        let wire = b"5;ext=1\r\nhello\r\n0\r\nX: a\n\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n";
        for split in 1..wire.len() {
            let mut body = RequestBody::new(BodyFraming::Chunked);
            let mut data = Vec::new();
            let mut out = Vec::new();
            let mut buf = BytesMut::from(&wire[..split]);
            out.extend_from_slice(&body.take(&mut buf, |d| data.extend_from_slice(d)).unwrap());
            buf.extend_from_slice(&wire[split..]);
            out.extend_from_slice(&body.take(&mut buf, |d| data.extend_from_slice(d)).unwrap());
            assert!(body.done() && body.trailers_dropped(), "{split}");
            assert!(
                !String::from_utf8_lossy(&out).contains("smuggled"),
                "{split}"
            );
            assert_eq!(data, b"hello");
            assert!(buf.is_empty());
            // What goes up is one chunked body of the same data, ending in the last chunk
            // with no trailers: nothing after it to be read as a second request.
            let mut again = Chunked::default();
            let mut redata = Vec::new();
            let used = again.decode(&out, |d| redata.extend_from_slice(d)).unwrap();
            assert_eq!((used, again.done()), (out.len(), true), "{split}");
            assert_eq!(redata.as_slice(), &b"hello"[..]);
            assert!(out.ends_with(b"\r\n0\r\nX: a\r\n\r\n"), "{split}");
        }
    }

    fn head(text: &str, method: &Method) -> Head {
        super::super::codec::parse_head(text.as_bytes(), method)
            .unwrap()
            .unwrap()
            .0
    }

    #[test]
    fn response_framing_is_serves_own() {
        let get = Method::GET;
        let cases = [
            (
                "HTTP/1.1 200 OK\r\nconnection: content-length\r\ncontent-length: 5\r\n\r\n",
                false,
                "HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n",
            ),
            (
                "HTTP/1.1 200 OK\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\r\n",
                false,
                "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n",
            ),
            (
                "HTTP/1.1 200 OK\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\r\n",
                true,
                "HTTP/1.0 200 OK\r\nconnection: close\r\n\r\n",
            ),
            (
                "HTTP/1.1 200 OK\r\nx: 1\r\n\r\n",
                false,
                "HTTP/1.1 200 OK\r\nx: 1\r\ntransfer-encoding: chunked\r\n\r\n",
            ),
        ];
        for (worker, http10, client) in cases {
            let h = head(worker, &get);
            let f = response_framing(&h, &get, http10);
            let keep = !f.close;
            let wire = super::super::write::response_head(
                http10,
                h.status,
                super::super::end_to_end(&h.headers),
                &f,
                keep,
            );
            assert_eq!(String::from_utf8(wire).unwrap(), client, "{worker:?}");
        }
        // A HEAD's declared length is passed on when it is one number; a 204's never.
        let h = head(
            "HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\n",
            &Method::HEAD,
        );
        assert_eq!(response_framing(&h, &Method::HEAD, false).length, Some(9));
        let h = head(
            "HTTP/1.1 200 OK\r\ncontent-length: 9, 8\r\n\r\n",
            &Method::HEAD,
        );
        assert_eq!(response_framing(&h, &Method::HEAD, false).length, None);
        let h = head("HTTP/1.1 204 No Content\r\ncontent-length: 9\r\n\r\n", &get);
        assert_eq!(response_framing(&h, &get, false).length, None);
    }
}
