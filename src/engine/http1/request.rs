//! The request side of our HTTP/1.1 codec (how serve reads client requests): a request head parsed with httparse, its body framing by hyper's
//! server rules (RFC 9112 section 6.3), and a reader of one whole request over any
//! `AsyncRead`. `fuzzing::http1_request` holds it to hyper's server on the same bytes.

use bytes::{Buf, BytesMut};
use http::header::{self, HeaderName, HeaderValue};
use http::{HeaderMap, Method, Uri};
use tokio::io::{AsyncRead, AsyncReadExt};

use super::codec::{Chunked, CodecError, MAX_HEAD_BYTES, MAX_HEADERS, digits, parse_error};
use super::{ends_in_chunked, value_has_token};

/// How a request body ends. A request has no "until the close" body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BodyFraming {
    /// `Content-Length` bytes (none when the header is absent).
    Length(u64),
    /// `Transfer-Encoding` with `chunked` last.
    Chunked,
}

/// A parsed request head.
#[derive(Debug)]
pub(crate) struct RequestHead {
    pub(crate) method: Method,
    pub(crate) uri: Uri,
    /// HTTP/1.0 (else HTTP/1.1).
    pub(crate) http10: bool,
    pub(crate) headers: HeaderMap,
    pub(crate) framing: BodyFraming,
    /// The connection may carry another request after this one.
    pub(crate) keep_alive: bool,
    /// `Expect: 100-continue` (the client waits for a `100 Continue` before the body).
    pub(crate) expect_continue: bool,
    /// `Upgrade` on HTTP/1.1, or `CONNECT`: the connection would change protocol. serve
    /// passes no upgrade through (it refuses `CONNECT` and sends the request up without
    /// its hop-by-hop `Upgrade`), so only this file's tests read it.
    #[allow(dead_code)]
    pub(crate) wants_upgrade: bool,
}

/// hyper's longest request target.
const MAX_URI_LEN: usize = (u16::MAX - 1) as usize;

/// Parse a request head at the start of `buf`: `Ok(None)` when more bytes are needed,
/// else the head and its length in bytes (empty lines before the request line included).
pub(crate) fn parse_request_head(buf: &[u8]) -> Result<Option<(RequestHead, usize)>, CodecError> {
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut fields);
    let n = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) if n > MAX_HEAD_BYTES => {
            return Err(CodecError::TooLarge);
        }
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() >= MAX_HEAD_BYTES => {
            return Err(CodecError::TooLarge);
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(parse_error(e)),
    };
    let target = req.path.unwrap_or_default();
    if target.len() > MAX_URI_LEN {
        return Err(CodecError::UriTooLong);
    }
    let method = Method::from_bytes(req.method.unwrap_or_default().as_bytes())
        .map_err(|_| CodecError::Method)?;
    let uri = Uri::try_from(target).map_err(|_| CodecError::Uri)?;
    let http10 = req.version != Some(1);
    let mut f = Fields::new(http10, method == Method::CONNECT, req.headers.len());
    for h in req.headers.iter() {
        let name = HeaderName::from_bytes(h.name.as_bytes()).map_err(|_| CodecError::Header)?;
        let value = HeaderValue::from_bytes(h.value).map_err(|_| CodecError::Header)?;
        f.add(name, value)?;
    }
    let framing = match (f.transfer_encoding, f.chunked) {
        (true, true) => BodyFraming::Chunked,
        (true, false) => return Err(CodecError::CodingNotChunked),
        _ => BodyFraming::Length(f.length.unwrap_or(0)),
    };
    let head = RequestHead {
        method,
        uri,
        http10,
        // A message framed both ways may have been read differently by another hop:
        // close after it.
        keep_alive: f.keep_alive && !(f.transfer_encoding && f.content_length),
        // Ignored from HTTP/1.0 clients (RFC 9110 section 10.1.1) and for an empty body.
        expect_continue: f.expect_continue && !http10 && framing != BodyFraming::Length(0),
        wants_upgrade: f.wants_upgrade,
        headers: f.headers,
        framing,
    };
    Ok(Some((head, n)))
}

/// A request's header fields read one by one in the order they came, by hyper's server
/// rules (the order matters to them):
/// - a transfer coding is refused in HTTP/1.0, and the last `Transfer-Encoding` line must
///   end in `chunked` (else the request is refused, never read to the close);
/// - a `Transfer-Encoding` line removes the `Content-Length` read before it, and later
///   `Content-Length` lines are left out; those before it must still be valid;
/// - repeated lengths must agree (the repeats are left out), each a plain run of digits;
/// - `close` in any `Connection` line wins; HTTP/1.0 needs `keep-alive` to persist;
/// - the last `Expect` line decides; an `Upgrade` line means an upgrade on HTTP/1.1 only.
struct Fields {
    http10: bool,
    headers: HeaderMap,
    transfer_encoding: bool,
    chunked: bool,
    /// A `Content-Length` line was seen (even one left out).
    content_length: bool,
    length: Option<u64>,
    keep_alive: bool,
    saw_close: bool,
    expect_continue: bool,
    wants_upgrade: bool,
}

impl Fields {
    fn new(http10: bool, connect: bool, n: usize) -> Fields {
        Fields {
            http10,
            headers: HeaderMap::with_capacity(n),
            transfer_encoding: false,
            chunked: false,
            content_length: false,
            length: None,
            keep_alive: !http10,
            saw_close: false,
            expect_continue: false,
            wants_upgrade: connect,
        }
    }

    fn add(&mut self, name: HeaderName, value: HeaderValue) -> Result<(), CodecError> {
        if name == header::TRANSFER_ENCODING {
            if self.http10 {
                return Err(CodecError::CodingInHttp10);
            }
            self.transfer_encoding = true;
            if self.length.take().is_some() {
                self.headers.remove(header::CONTENT_LENGTH);
            }
            self.chunked = ends_in_chunked(&value);
        } else if name == header::CONTENT_LENGTH {
            self.content_length = true;
            if self.transfer_encoding {
                return Ok(());
            }
            let b = value.as_bytes();
            let n = digits(b)
                .ok_or_else(|| CodecError::LengthValue(String::from_utf8_lossy(b).into_owned()))?;
            match self.length {
                Some(m) if m != n => return Err(CodecError::LengthConflict(m, n)),
                Some(_) => return Ok(()),
                // hyper's largest length (the two values above it mean chunked and close).
                None if n > u64::MAX - 2 => return Err(CodecError::TooLarge),
                None => self.length = Some(n),
            }
        } else if name == header::CONNECTION {
            if self.saw_close || value_has_token(&value, "close") {
                self.saw_close = true;
                self.keep_alive = false;
            } else if !self.keep_alive {
                self.keep_alive = value_has_token(&value, "keep-alive");
            }
        } else if name == header::EXPECT {
            self.expect_continue = value.as_bytes().eq_ignore_ascii_case(b"100-continue");
        } else if name == header::UPGRADE {
            self.wants_upgrade = !self.http10;
        }
        self.headers.append(name, value);
        Ok(())
    }
}

/// Read one whole request from `io` (bytes already read are in `buf`; what follows the
/// request stays there): `Ok(None)` when the connection closed before a request began.
/// The body is buffered whole: for the fuzz view and tests (serve reads heads with
/// [`parse_request_head`] and streams each body up as it comes).
pub(crate) async fn read_request<R: AsyncRead + Unpin>(
    io: &mut R,
    buf: &mut BytesMut,
) -> Result<Option<(RequestHead, Vec<u8>)>, CodecError> {
    let head = loop {
        if let Some((head, n)) = parse_request_head(buf)? {
            buf.advance(n);
            break head;
        }
        if io.read_buf(buf).await? == 0 {
            // Bare line ends before a request line are skipped (RFC 9112 section 2.2),
            // so a close after only those is a clean close, as hyper's server has it.
            return if buf.iter().all(|&b| b == b'\r' || b == b'\n') {
                Ok(None)
            } else {
                Err(CodecError::ClosedInHead)
            };
        }
    };
    let mut body = Vec::new();
    match head.framing {
        BodyFraming::Length(n) => {
            let mut left = usize::try_from(n).map_err(|_| CodecError::TooLarge)?;
            loop {
                let take = left.min(buf.len());
                body.extend_from_slice(&buf[..take]);
                buf.advance(take);
                left -= take;
                if left == 0 {
                    break;
                }
                if io.read_buf(buf).await? == 0 {
                    return Err(CodecError::ClosedInBody);
                }
            }
        }
        BodyFraming::Chunked => {
            let mut dec = Chunked::default();
            loop {
                let used = dec.decode(buf, |d| body.extend_from_slice(d))?;
                buf.advance(used);
                if dec.done() {
                    break;
                }
                if io.read_buf(buf).await? == 0 {
                    return Err(CodecError::ClosedInBody);
                }
            }
        }
    }
    Ok(Some((head, body)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(text: &str) -> Result<Option<(RequestHead, usize)>, String> {
        parse_request_head(text.as_bytes()).map_err(|e| e.to_string())
    }

    #[test]
    fn request_heads_and_their_framing() {
        let (h, n) =
            head("POST /v1/chat?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello")
                .unwrap()
                .unwrap();
        assert_eq!(n, 58);
        assert_eq!(
            (h.method, h.uri.to_string()),
            (Method::POST, "/v1/chat?x=1".into())
        );
        assert_eq!(h.framing, BodyFraming::Length(5));
        assert!(h.keep_alive && !h.http10 && !h.expect_continue && !h.wants_upgrade);
        // Partial heads wait for more; no length means no body.
        assert!(head("GET / HTTP/1.1\r\nHost: a\r\n").unwrap().is_none());
        let (h, _) = head("GET / HTTP/1.1\r\n\r\n").unwrap().unwrap();
        assert_eq!(h.framing, BodyFraming::Length(0));
        // Chunked last wins over a length; anything else last is refused.
        let te = |v: &str| {
            head(&format!(
                "POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: {v}\r\n\r\n"
            ))
        };
        assert_eq!(
            te("gzip, chunked").unwrap().unwrap().0.framing,
            BodyFraming::Chunked
        );
        assert!(
            te("chunked, gzip")
                .unwrap_err()
                .contains("transfer-encoding")
        );
        assert!(
            head("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n")
                .unwrap_err()
                .contains("transfer-encoding")
        );
        // Repeated lengths must agree and be plain digits.
        assert!(head("POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\n").is_ok());
        for bad in ["3\r\nContent-Length: 4", "+3", "3, 3", "", "0x3"] {
            let r = head(&format!("POST / HTTP/1.1\r\nContent-Length: {bad}\r\n\r\n"));
            assert!(r.unwrap_err().contains("content-length"), "{bad}");
        }
        // Keep-alive by version and Connection; Expect; upgrades.
        let (h, _) = head("GET / HTTP/1.0\r\n\r\n").unwrap().unwrap();
        assert!(h.http10 && !h.keep_alive);
        let (h, _) = head("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(h.keep_alive);
        let (h, _) = head("GET / HTTP/1.1\r\nConnection: close\r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(!h.keep_alive);
        let (h, _) = head("PUT / HTTP/1.1\r\nExpect: 100-Continue\r\nUpgrade: websocket\r\nContent-Length: 1\r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(h.expect_continue && h.wants_upgrade);
        let (h, _) = head("CONNECT example.com:443 HTTP/1.1\r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(h.wants_upgrade);
        assert_eq!(
            h.uri.authority().map(|a| a.as_str()),
            Some("example.com:443")
        );
        // Both framings: the length is dropped from the fields (read before or after the
        // coding), and the connection closes after the request.
        for text in [
            "POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
        ] {
            let (h, _) = head(text).unwrap().unwrap();
            assert!(!h.headers.contains_key(header::CONTENT_LENGTH), "{text}");
            assert!(!h.keep_alive && h.framing == BodyFraming::Chunked, "{text}");
        }
        let (h, _) = head("PUT / HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(h.headers.get_all(header::CONTENT_LENGTH).iter().count(), 1);
        // close anywhere wins, on either version.
        let (h, _) = head("GET / HTTP/1.0\r\nConnection: keep-alive, close\r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(!h.keep_alive);
        let (h, _) = head("GET / HTTP/1.0\r\nConnection: close\r\nConnection: keep-alive\r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(!h.keep_alive);
        // Expect is ignored from HTTP/1.0 and for an empty body; Upgrade only on HTTP/1.1.
        let (h, _) = head("POST / HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(!h.expect_continue);
        let (h, _) = head("POST / HTTP/1.1\r\nExpect: 100-continue\r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(!h.expect_continue);
        let (h, _) = head("CONNECT a:1 HTTP/1.0\r\nUpgrade: x\r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(!h.wants_upgrade);
        // Refused: a target past hyper's limit.
        let long = format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(MAX_URI_LEN));
        assert!(head(&long).unwrap_err().contains("URI too long"));
        // Refused: a bad version, a bad target, a head past the limit.
        assert!(
            head("GET / HTTP/2.0\r\n\r\n")
                .unwrap_err()
                .contains("version")
        );
        assert!(matches!(
            parse_request_head(b"GET /a b HTTP/1.1\r\n\r\n"),
            Err(CodecError::Version)
        ));
        let big = format!("GET / HTTP/1.1\r\nX: {}", "a".repeat(MAX_HEAD_BYTES));
        assert!(head(&big).unwrap_err().contains("too large"));
    }

    #[test]
    fn heads_past_the_limits_are_too_large_by_kind() {
        let many = format!(
            "GET / HTTP/1.1\r\n{}\r\n",
            "x: 1\r\n".repeat(MAX_HEADERS + 1)
        );
        let big = format!("GET / HTTP/1.1\r\nX: {}", "a".repeat(MAX_HEAD_BYTES));
        for text in [many, big] {
            assert!(matches!(
                parse_request_head(text.as_bytes()),
                Err(CodecError::TooLarge)
            ));
        }
        assert!(matches!(
            parse_request_head(b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n"),
            Err(CodecError::CodingNotChunked)
        ));
    }

    /// A reader that hands out `data` at most `step` bytes per read, then ends.
    struct Pieces(Vec<u8>, usize);

    impl AsyncRead for Pieces {
        fn poll_read(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            let n = self.1.min(self.0.len()).min(buf.remaining());
            let now: Vec<u8> = self.0.drain(..n).collect();
            buf.put_slice(&now);
            std::task::Poll::Ready(Ok(()))
        }
    }

    fn read(data: &str, step: usize) -> Result<Option<(RequestHead, Vec<u8>)>, String> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(read_request(
            &mut Pieces(data.as_bytes().to_vec(), step),
            &mut BytesMut::new(),
        ))
        .map_err(|e| e.to_string())
    }

    #[test]
    fn whole_requests_in_any_split() {
        let chunked = "\r\nPOST /p HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3;x=1\r\nabc\r\n2\r\nde\r\n0\r\nT: 1\r\n\r\n";
        for step in [1, 2, 7, usize::MAX] {
            let (h, body) = read(chunked, step).unwrap().unwrap();
            assert_eq!(
                (h.uri.path(), body.as_slice()),
                ("/p", &b"abcde"[..]),
                "{step}"
            );
            let (_, body) = read("PUT / HTTP/1.1\r\nContent-Length: 4\r\n\r\nwxyz", step)
                .unwrap()
                .unwrap();
            assert_eq!(body, b"wxyz");
        }
        // A close before a request (bare line ends at most) is no request; a close
        // inside one is an error, and so are line ends httparse refuses.
        assert!(read("", 1).unwrap().is_none());
        assert!(read("\r\n\n\r", 1).unwrap().is_none());
        assert!(read("\r\r", 1).unwrap_err().contains("invalid"));
        assert!(read("GET / HTTP/1.1\r\n", 3).unwrap_err().contains("head"));
        assert!(
            read("PUT / HTTP/1.1\r\nContent-Length: 9\r\n\r\nab", 3)
                .unwrap_err()
                .contains("body")
        );
        assert!(
            read(
                "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab",
                3
            )
            .is_err()
        );
        assert!(
            read(
                "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
                3
            )
            .is_err()
        );
    }
}
