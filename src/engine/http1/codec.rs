//! The lean client's HTTP/1.1 response codec, without I/O: the response head (httparse),
//! its framing (RFC 9112 section 6.3), a chunked-body decoder that hands out slices of
//! the bytes it is given (no copy), and why a message is refused ([`CodecError`], which
//! the request side shares). The I/O around it is `engine::lean` and `engine::upstream`.

use http::header::{self, HeaderName, HeaderValue};
use http::{HeaderMap, Method, StatusCode};

use super::has_no_body;

/// The most header fields a response head may have (hyper's default).
pub(crate) const MAX_HEADERS: usize = 100;
/// The largest response head read (hyper's default buffer limit).
pub(crate) const MAX_HEAD_BYTES: usize = 8192 + 4096 * 100;

/// Why the codec refused a message: in hyper's words where hyper has them (runs recorded
/// before the lean client used them, and users search for them). The request side
/// (`request`) refuses with the same kinds, and adds its own.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CodecError {
    /// A head over [`MAX_HEAD_BYTES`] or with more than [`MAX_HEADERS`] fields, or a
    /// length past hyper's largest.
    #[error("message head is too large")]
    TooLarge,
    #[error("invalid HTTP version parsed")]
    Version,
    #[error("invalid HTTP status-code parsed")]
    Status,
    #[error("invalid HTTP method parsed")]
    Method,
    #[error("invalid URI")]
    Uri,
    /// A request target past hyper's longest.
    #[error("URI too long")]
    UriTooLong,
    /// A header line that does not parse, or a name or value that is not one.
    #[error("invalid HTTP header parsed")]
    Header,
    /// A `Content-Length` value that is not text.
    #[error("invalid content-length parsed")]
    Length,
    /// A `Content-Length` value that is not a plain run of digits (the value as it came).
    #[error("invalid content-length parsed: {0:?}")]
    LengthValue(String),
    /// Two `Content-Length` values that disagree.
    #[error("invalid content-length parsed: conflicting values {0} and {1}")]
    LengthConflict(u64, u64),
    /// A transfer coding in an HTTP/1.0 message.
    #[error("unexpected transfer-encoding parsed")]
    CodingInHttp10,
    /// A request whose last transfer coding is not `chunked`.
    #[error("invalid transfer-encoding parsed")]
    CodingNotChunked,
    /// A chunk size past a u64.
    #[error("invalid chunk size: overflow")]
    ChunkSizeOverflow,
    /// A chunked body framed wrong.
    #[error("invalid chunk: {0}")]
    Chunk(ChunkFault),
    /// `request::read_request`: the connection closed inside a request head.
    #[error("connection closed before the request head was complete")]
    ClosedInHead,
    /// `request::read_request`: the connection closed inside a request body.
    #[error("connection closed before the request body was complete")]
    ClosedInBody,
    /// `request::read_request`: reading failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// How a chunked body was framed wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ChunkFault {
    #[error("size line without a size digit")]
    NoSizeDigit,
    #[error("invalid size")]
    BadSize,
    #[error("invalid whitespace after the size")]
    BadSizeWhitespace,
    #[error("extension contains a newline")]
    ExtensionNewline,
    #[error("extensions over 16 KiB")]
    ExtensionsTooLong,
    #[error("size line without LF after CR")]
    SizeLineWithoutLf,
    #[error("data longer than its size")]
    DataTooLong,
    #[error("no LF after a chunk's data")]
    DataWithoutLf,
    #[error("more than 100 trailer lines")]
    TooManyTrailerLines,
    #[error("trailer line without LF after CR")]
    TrailerLineWithoutLf,
    #[error("no LF at the end")]
    EndWithoutLf,
    #[error("trailers over 16 KiB")]
    TrailersTooLong,
    #[error("trailer fields do not parse")]
    TrailersDoNotParse,
}

/// An httparse error as the codec's kind (hyper's words).
pub(super) fn parse_error(e: httparse::Error) -> CodecError {
    match e {
        httparse::Error::Version => CodecError::Version,
        httparse::Error::Status => CodecError::Status,
        httparse::Error::TooManyHeaders => CodecError::TooLarge,
        _ => CodecError::Header,
    }
}

/// How a response body ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    /// No body (HEAD, 1xx, 204, 304).
    Empty,
    /// `Content-Length` bytes.
    Length(u64),
    /// `Transfer-Encoding` with `chunked` last.
    Chunked,
    /// Until the connection closes.
    Close,
}

/// A parsed response head.
#[derive(Debug)]
pub(crate) struct Head {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) framing: Framing,
    /// The connection may carry another exchange after this one (HTTP/1.1 without
    /// `Connection: close`, HTTP/1.0 with `keep-alive`, and a framed body).
    pub(crate) keep_alive: bool,
}

/// Parse a response head at the start of `buf`: `Ok(None)` when more bytes are needed,
/// else the head and its length in bytes. `method` is the request's (a HEAD has no body).
pub(crate) fn parse_head(buf: &[u8], method: &Method) -> Result<Option<(Head, usize)>, CodecError> {
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut res = httparse::Response::new(&mut fields);
    let n = match res.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD_BYTES => {
            return Err(CodecError::TooLarge);
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(parse_error(e)),
    };
    let code = res.code.unwrap_or(0);
    let status = StatusCode::from_u16(code).map_err(|_| parse_error(httparse::Error::Status))?;
    let mut headers = HeaderMap::with_capacity(res.headers.len());
    for h in res.headers.iter() {
        let name = HeaderName::from_bytes(h.name.as_bytes()).map_err(|_| CodecError::Header)?;
        let value = HeaderValue::from_bytes(h.value).map_err(|_| CodecError::Header)?;
        headers.append(name, value);
    }
    let http10 = res.version != Some(1);
    let framing = framing(&headers, method, status, http10)?;
    let says = |t: &str| super::has_token(&headers, header::CONNECTION, t);
    // `close` wins over `keep-alive`; HTTP/1.0 needs `keep-alive` to persist.
    let persistent = !says("close") && (!http10 || says("keep-alive"));
    // A body that the close delimits, or a Content-Length overridden by a transfer
    // coding (RFC 9112 section 6.3, rule 3), ends the connection.
    let both = headers.contains_key(header::TRANSFER_ENCODING)
        && headers.contains_key(header::CONTENT_LENGTH);
    // 101 hands the connection to another protocol, never back to this client.
    let keep_alive = persistent
        && framing != Framing::Close
        && !both
        && status != StatusCode::SWITCHING_PROTOCOLS;
    Ok(Some((
        Head {
            status,
            headers,
            framing,
            keep_alive,
        },
        n,
    )))
}

/// The framing of a response (RFC 9112 section 6.3), in hyper's order: no body by
/// definition (101, HEAD, 1xx, 204, 304); a transfer coding (refused in HTTP/1.0), chunked
/// last or else until the close; one Content-Length (repeated values must agree); else
/// until the close.
fn framing(
    headers: &HeaderMap,
    method: &Method,
    status: StatusCode,
    http10: bool,
) -> Result<Framing, CodecError> {
    if has_no_body(method, status) {
        return Ok(Framing::Empty);
    }
    if headers.contains_key(header::TRANSFER_ENCODING) {
        if http10 {
            return Err(CodecError::CodingInHttp10);
        }
        return Ok(if super::is_close_delimited(headers) {
            Framing::Close
        } else {
            Framing::Chunked
        });
    }
    let mut length: Option<u64> = None;
    for v in headers.get_all(header::CONTENT_LENGTH) {
        let s = v.to_str().map_err(|_| CodecError::Length)?;
        for part in s.split(',') {
            let n = digits(part.trim().as_bytes())
                .ok_or_else(|| CodecError::LengthValue(s.to_string()))?;
            match length {
                Some(m) if m != n => return Err(CodecError::LengthConflict(m, n)),
                _ => length = Some(n),
            }
        }
    }
    match length {
        // hyper's largest length (the two values above it mean chunked and close).
        Some(n) if n > u64::MAX - 2 => Err(CodecError::TooLarge),
        Some(n) => Ok(Framing::Length(n)),
        None => Ok(Framing::Close),
    }
}

/// A `Content-Length` value: a plain, non-empty run of ASCII digits (no sign, no
/// spaces) that fits a u64, as hyper reads it.
pub(super) fn digits(b: &[u8]) -> Option<u64> {
    if b.is_empty() || !b.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(b).ok()?.parse().ok()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// The first hex digit of a chunk size.
    Start,
    /// More hex digits, whitespace, `;` or CR.
    Size,
    /// Whitespace after the size: more of it, `;` or CR.
    SizeLws,
    /// A chunk extension, up to CR.
    Extension,
    /// The LF after a size line's CR.
    SizeLf,
    /// Chunk data; this many bytes left.
    Data(u64),
    BodyCr,
    BodyLf,
    /// After the last chunk: CR (the end) or a trailer line.
    EndCr,
    Trailer,
    TrailerLf,
    EndLf,
    Done,
}

/// A chunked-body decoder (RFC 9112 section 7.1) with hyper's rules, so both clients
/// accept and refuse the same bytes (checked by `fuzzing::http1_response`): CRLF line
/// ends, a size of hex digits then optional whitespace, extensions without LF and under
/// 16 KiB in all, CRLF after each chunk's data, trailer fields that parse as header
/// fields.
#[derive(Debug)]
pub(crate) struct Chunked {
    state: State,
    size: u64,
    extension_bytes: usize,
    /// Trailer bytes with their line ends, and how many lines.
    trailers: Vec<u8>,
    trailer_lines: usize,
}

impl Default for Chunked {
    fn default() -> Self {
        Chunked {
            state: State::Start,
            size: 0,
            extension_bytes: 0,
            trailers: Vec::new(),
            trailer_lines: 0,
        }
    }
}

/// hyper's limit on the bytes of chunk extensions in one body.
const MAX_EXTENSION_BYTES: usize = 16 * 1024;
/// hyper's limit on the trailer bytes (line ends included) of one body.
const MAX_TRAILER_BYTES: usize = 16 * 1024;

fn hex(b: u8) -> Option<u64> {
    (b as char).to_digit(16).map(u64::from)
}

impl Chunked {
    /// The last chunk and the trailers have been read.
    pub(crate) fn done(&self) -> bool {
        self.state == State::Done
    }

    /// Trailer fields came after the last chunk.
    pub(crate) fn has_trailers(&self) -> bool {
        !self.trailers.is_empty()
    }

    /// The last chunk as serve writes it on (`reframe`): `0`, then the trailer fields as
    /// hyper reads them, each written again as `name: value` with CRLF, then the empty
    /// line; and whether trailer bytes were left out (what follows the first empty line,
    /// which a lenient reader might take for the end of the body and the start of a
    /// second message). Call it once the body is done.
    pub(crate) fn last_chunk(&self) -> (Vec<u8>, bool) {
        let mut out = b"0\r\n".to_vec();
        let mut left_out = false;
        if !self.trailers.is_empty() {
            let mut fields = vec![httparse::EMPTY_HEADER; self.trailer_lines.max(1)];
            match httparse::parse_headers(&self.trailers, &mut fields) {
                Ok(httparse::Status::Complete((n, fields))) => {
                    for f in fields.iter() {
                        out.extend_from_slice(f.name.as_bytes());
                        out.extend_from_slice(b": ");
                        out.extend_from_slice(f.value);
                        out.extend_from_slice(b"\r\n");
                    }
                    left_out = n < self.trailers.len();
                }
                _ => left_out = true,
            }
        }
        out.extend_from_slice(b"\r\n");
        (out, left_out)
    }

    fn add_digit(&mut self, d: u64) -> Result<(), CodecError> {
        self.size = self
            .size
            .checked_mul(16)
            .and_then(|s| s.checked_add(d))
            .ok_or(CodecError::ChunkSizeOverflow)?;
        Ok(())
    }

    /// Decode from `buf`, handing each piece of body data to `data`. Returns the bytes
    /// consumed (all of `buf` unless the body ended before its end).
    pub(crate) fn decode(
        &mut self,
        buf: &[u8],
        mut data: impl FnMut(&[u8]),
    ) -> Result<usize, CodecError> {
        let mut at = 0;
        while at < buf.len() {
            if let State::Data(left) = self.state {
                let take = (buf.len() - at).min(usize::try_from(left).unwrap_or(usize::MAX));
                data(&buf[at..at + take]);
                at += take;
                let left = left - take as u64;
                self.state = if left == 0 {
                    State::BodyCr
                } else {
                    State::Data(left)
                };
                continue;
            }
            if self.state == State::Done {
                break;
            }
            let b = buf[at];
            at += 1;
            self.state = self.step(b)?;
        }
        Ok(at)
    }

    /// One framing byte.
    fn step(&mut self, b: u8) -> Result<State, CodecError> {
        let bad = |fault| Err(CodecError::Chunk(fault));
        Ok(match (self.state, b) {
            (State::Start, _) => match hex(b) {
                Some(d) => {
                    self.size = 0;
                    self.add_digit(d)?;
                    State::Size
                }
                None => return bad(ChunkFault::NoSizeDigit),
            },
            (State::Size, _) if hex(b).is_some() => {
                self.add_digit(hex(b).unwrap_or(0))?;
                State::Size
            }
            (State::Size | State::SizeLws, b' ' | b'\t') => State::SizeLws,
            (State::Size | State::SizeLws, b';') => State::Extension,
            (State::Size | State::SizeLws | State::Extension, b'\r') => State::SizeLf,
            (State::Size, _) => return bad(ChunkFault::BadSize),
            (State::SizeLws, _) => return bad(ChunkFault::BadSizeWhitespace),
            (State::Extension, b'\n') => return bad(ChunkFault::ExtensionNewline),
            (State::Extension, _) => {
                self.extension_bytes += 1;
                if self.extension_bytes >= MAX_EXTENSION_BYTES {
                    return bad(ChunkFault::ExtensionsTooLong);
                }
                State::Extension
            }
            (State::SizeLf, b'\n') if self.size == 0 => State::EndCr,
            (State::SizeLf, b'\n') => State::Data(self.size),
            (State::SizeLf, _) => return bad(ChunkFault::SizeLineWithoutLf),
            (State::BodyCr, b'\r') => State::BodyLf,
            (State::BodyCr, _) => return bad(ChunkFault::DataTooLong),
            (State::BodyLf, b'\n') => State::Start,
            (State::BodyLf, _) => return bad(ChunkFault::DataWithoutLf),
            (State::EndCr, b'\r') => {
                if !self.trailers.is_empty() {
                    self.trailer_byte(b)?;
                }
                State::EndLf
            }
            (State::EndCr, _) => {
                self.trailer_byte(b)?;
                State::Trailer
            }
            (State::Trailer, _) => {
                self.trailer_byte(b)?;
                if b == b'\r' {
                    State::TrailerLf
                } else {
                    State::Trailer
                }
            }
            (State::TrailerLf, b'\n') => {
                if self.trailer_lines >= MAX_HEADERS {
                    return bad(ChunkFault::TooManyTrailerLines);
                }
                self.trailer_lines += 1;
                self.trailer_byte(b)?;
                State::EndCr
            }
            (State::TrailerLf, _) => return bad(ChunkFault::TrailerLineWithoutLf),
            (State::EndLf, b'\n') => {
                if !self.trailers.is_empty() {
                    self.trailer_byte(b)?;
                }
                self.check_trailers()?;
                State::Done
            }
            (State::EndLf, _) => return bad(ChunkFault::EndWithoutLf),
            (State::Data(_) | State::Done, _) => self.state,
        })
    }

    /// Keep one trailer byte; like hyper, the limit is checked after adding it.
    fn trailer_byte(&mut self, b: u8) -> Result<(), CodecError> {
        self.trailers.push(b);
        if self.trailers.len() >= MAX_TRAILER_BYTES {
            return Err(CodecError::Chunk(ChunkFault::TrailersTooLong));
        }
        Ok(())
    }

    /// Trailer lines must parse as header fields with valid names and values.
    fn check_trailers(&self) -> Result<(), CodecError> {
        if self.trailers.is_empty() {
            return Ok(());
        }
        let mut fields = vec![httparse::EMPTY_HEADER; self.trailer_lines];
        match httparse::parse_headers(&self.trailers, &mut fields) {
            Ok(httparse::Status::Complete((_, fields)))
                if fields.iter().all(|f| {
                    HeaderName::from_bytes(f.name.as_bytes()).is_ok()
                        && HeaderValue::from_bytes(f.value).is_ok()
                }) =>
            {
                Ok(())
            }
            _ => Err(CodecError::Chunk(ChunkFault::TrailersDoNotParse)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(text: &str, method: &Method) -> Result<Option<(Head, usize)>, CodecError> {
        parse_head(text.as_bytes(), method)
    }

    #[test]
    fn heads_and_their_framing() {
        let get = Method::GET;
        let (h, n) = head("HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello", &get)
            .unwrap()
            .unwrap();
        assert_eq!(
            (h.status.as_u16(), h.framing, h.keep_alive, n),
            (200, Framing::Length(5), true, 38)
        );
        assert!(
            head("HTTP/1.1 200 OK\r\ncontent-le", &get)
                .unwrap()
                .is_none()
        );
        let cases: [(&str, Method, Framing, bool); 11] = [
            (
                "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n",
                Method::GET,
                Framing::Chunked,
                true,
            ),
            (
                "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n",
                Method::GET,
                Framing::Close,
                false,
            ),
            (
                "HTTP/1.1 200 OK\r\n\r\n",
                Method::GET,
                Framing::Close,
                false,
            ),
            (
                "HTTP/1.1 204 No Content\r\n\r\n",
                Method::GET,
                Framing::Empty,
                true,
            ),
            (
                "HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\n",
                Method::HEAD,
                Framing::Empty,
                true,
            ),
            (
                "HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 1\r\n\r\n",
                Method::GET,
                Framing::Length(1),
                false,
            ),
            (
                "HTTP/1.0 200 OK\r\ncontent-length: 1\r\n\r\n",
                Method::GET,
                Framing::Length(1),
                false,
            ),
            (
                "HTTP/1.1 200 OK\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n",
                Method::GET,
                Framing::Chunked,
                false,
            ),
            (
                "HTTP/1.1 101 Switching Protocols\r\nupgrade: x\r\n\r\n",
                Method::GET,
                Framing::Empty,
                false,
            ),
            (
                "HTTP/1.0 200 OK\r\nconnection: close, keep-alive\r\ncontent-length: 1\r\n\r\n",
                Method::GET,
                Framing::Length(1),
                false,
            ),
            (
                "HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 1\r\n\r\n",
                Method::GET,
                Framing::Length(1),
                true,
            ),
        ];
        for (text, m, framing, keep) in cases {
            let (h, _) = head(text, &m).unwrap().unwrap();
            assert_eq!((h.framing, h.keep_alive), (framing, keep), "{text:?}");
        }
        // Repeated equal lengths are one length; different ones are refused.
        assert_eq!(
            head(
                "HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 5, 5\r\n\r\n",
                &get
            )
            .unwrap()
            .unwrap()
            .0
            .framing,
            Framing::Length(5)
        );
        for bad in [
            "HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: +5\r\n\r\n",
            "HTTP/1.1 abc OK\r\ncontent-length: 0\r\n\r\n",
            "HTTP/1.1 200 OK\r\nthis line has no colon\r\ncontent-length: 0\r\n\r\n",
            "HTTP/1.1 099 Low\r\n\r\n",
            "HTTP/1.0 200 OK\r\ntransfer-encoding: chunked\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: 18446744073709551614\r\n\r\n",
        ] {
            assert!(head(bad, &get).is_err(), "{bad:?}");
        }
        let huge = format!("HTTP/1.1 200 OK\r\nx: {}", "a".repeat(MAX_HEAD_BYTES + 1));
        assert!(matches!(head(&huge, &get), Err(CodecError::TooLarge)));
    }

    #[test]
    fn errors_keep_their_kind_and_hypers_words() {
        let cases = [
            (CodecError::TooLarge, "message head is too large"),
            (CodecError::Header, "invalid HTTP header parsed"),
            (
                CodecError::LengthValue("+5".into()),
                "invalid content-length parsed: \"+5\"",
            ),
            (
                CodecError::LengthConflict(5, 6),
                "invalid content-length parsed: conflicting values 5 and 6",
            ),
            (
                CodecError::ChunkSizeOverflow,
                "invalid chunk size: overflow",
            ),
            (
                CodecError::Chunk(ChunkFault::BadSize),
                "invalid chunk: invalid size",
            ),
            (
                CodecError::Chunk(ChunkFault::TrailersTooLong),
                "invalid chunk: trailers over 16 KiB",
            ),
        ];
        for (e, text) in cases {
            assert_eq!(e.to_string(), text);
        }
        // More fields than hyper takes is a head too large, by its kind (serve: 431).
        let many = format!(
            "HTTP/1.1 200 OK\r\n{}\r\n",
            "x: 1\r\n".repeat(MAX_HEADERS + 1)
        );
        assert!(matches!(
            head(&many, &Method::GET),
            Err(CodecError::TooLarge)
        ));
        let conflict = "HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\n";
        assert!(matches!(
            head(conflict, &Method::GET),
            Err(CodecError::LengthConflict(5, 6))
        ));
        assert!(matches!(
            chunked(&[b"zz\r\n"]),
            Err(CodecError::Chunk(ChunkFault::NoSizeDigit))
        ));
    }

    fn chunked(parts: &[&[u8]]) -> Result<(Vec<u8>, bool, Vec<u8>), CodecError> {
        let mut d = Chunked::default();
        let mut body = Vec::new();
        let mut pending = Vec::new();
        for p in parts {
            pending.extend_from_slice(p);
            let n = d.decode(&pending, |b| body.extend_from_slice(b))?;
            pending.drain(..n);
        }
        Ok((body, d.done(), pending))
    }

    #[test]
    fn chunked_bodies_in_any_split() {
        let whole: &[u8] = b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nx-trailer: 1\r\n\r\n";
        for split in 0..whole.len() {
            let (body, done, rest) = chunked(&[&whole[..split], &whole[split..]]).unwrap();
            assert_eq!(
                (body.as_slice(), done, rest.len()),
                (&b"hello world"[..], true, 0),
                "split {split}"
            );
        }
        // Bytes one at a time; bare LF line ends are refused (as hyper does).
        let one: Vec<&[u8]> = b"3\r\nabc\r\n0\r\n\r\n".chunks(1).collect();
        assert_eq!(chunked(&one).unwrap(), (b"abc".to_vec(), true, vec![]));
        let bare_lf = chunked(&[b"3\nabc\n0\n\n"]).unwrap_err();
        assert!(matches!(bare_lf, CodecError::Chunk(_)), "{bare_lf:?}");
        // Not done until the blank line after the last chunk.
        assert!(!chunked(&[b"3\r\nabc\r\n0\r\n"]).unwrap().1);
        let long_ext = [&b"1;"[..], &[b'x'; 17 * 1024]].concat();
        for bad in [
            &b"zz\r\n"[..],
            b"5\r\nhelloX\r\n",
            b"\r\n",
            b" 5\r\n",
            b"5 x\r\n",
            b"1;a\nb\r\n",
            b"f0000000000000003\r\n",
            b"0\r\nno colon\r\n\r\n",
            &long_ext,
        ] {
            assert!(
                chunked(&[bad]).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        // The bad-chunk fault: 5 bytes of data, then an invalid size line.
        let mut body = Vec::new();
        let mut d = Chunked::default();
        assert!(
            d.decode(b"5\r\nhello\r\nzz\r\n", |b| body.extend_from_slice(b))
                .is_err()
        );
        assert_eq!(body, b"hello");
    }
}
