//! The one writer of HTTP/1 heads: request heads ([`request_head`]: replay's lean client
//! and serve's upstream requests), response heads ([`response_head`]: what serve writes
//! to its clients, relayed, generated or refused) and the `100 Continue` serve answers
//! ([`CONTINUE`]). Each writes the fields it is given and then the framing fields it
//! decides itself, never a peer's.

use std::io::Write as _;

use http::header::{self, HeaderMap};
use http::{Method, StatusCode};

use super::reframe::{Reframe, ResponseFraming};

/// The interim answer to `Expect: 100-continue`: what [`response_head`] writes for 100 to
/// an HTTP/1.1 client with no fields (a test holds them equal), kept as bytes so it costs
/// no allocation.
pub(crate) const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// Header fields as `name: value` lines.
fn write_fields<'a>(b: &mut Vec<u8>, fields: impl IntoIterator<Item = (&'a str, &'a [u8])>) {
    for (name, value) in fields {
        b.extend_from_slice(name.as_bytes());
        b.extend_from_slice(b": ");
        b.extend_from_slice(value);
        b.extend_from_slice(b"\r\n");
    }
}

/// A request head: `METHOD target HTTP/1.1`, the fields of `headers` in their order
/// (names as a `HeaderName` spells them, lower case) but any `Transfer-Encoding`, then
/// `transfer-encoding: chunked` when `chunked` (the writer's own framing), then the
/// empty line. Room for `then` more bytes (a body the caller appends) is reserved with
/// it, so a head and its body are one allocation.
pub(crate) fn request_head(
    method: &Method,
    target: &str,
    headers: &HeaderMap,
    chunked: bool,
    then: usize,
) -> Vec<u8> {
    let mut b = Vec::with_capacity(64 + target.len() + 48 * headers.len() + then);
    b.extend_from_slice(method.as_str().as_bytes());
    b.push(b' ');
    b.extend_from_slice(target.as_bytes());
    b.extend_from_slice(b" HTTP/1.1\r\n");
    write_fields(
        &mut b,
        headers
            .iter()
            .filter(|(n, _)| **n != header::TRANSFER_ENCODING)
            .map(|(n, v)| (n.as_str(), v.as_bytes())),
    );
    if chunked {
        b.extend_from_slice(b"transfer-encoding: chunked\r\n");
    }
    b.extend_from_slice(b"\r\n");
    b
}

/// A response head for the client: its version, the status, the end-to-end `fields`
/// without any framing field of the worker's, then the framing and connection fields
/// serve decides (`keep`: the client's connection stays open after it).
pub(crate) fn response_head<'a>(
    http10: bool,
    status: StatusCode,
    fields: impl IntoIterator<Item = (&'a str, &'a [u8])>,
    framing: &ResponseFraming,
    keep: bool,
) -> Vec<u8> {
    let mut b = Vec::with_capacity(512);
    b.extend_from_slice(if http10 { b"HTTP/1.0 " } else { b"HTTP/1.1 " });
    b.extend_from_slice(status.as_str().as_bytes());
    b.push(b' ');
    b.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    b.extend_from_slice(b"\r\n");
    write_fields(
        &mut b,
        fields
            .into_iter()
            .filter(|(n, _)| *n != "content-length" && *n != "transfer-encoding"),
    );
    if let Some(n) = framing.length {
        let _ = write!(b, "content-length: {n}\r\n");
    }
    if framing.body == Reframe::Chunks {
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

/// The head serve answers a request it refuses with (`status`, no body, and the
/// connection closes after it).
pub(crate) fn refusal_head(status: StatusCode) -> Vec<u8> {
    let framing = ResponseFraming {
        body: Reframe::Raw,
        length: Some(0),
        close: true,
    };
    response_head(false, status, [], &framing, false)
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    #[test]
    fn request_heads_keep_the_fields_and_write_their_own_framing() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("w:8000"));
        h.append("x-a", HeaderValue::from_static("1"));
        h.append("x-a", HeaderValue::from_static("2"));
        let head = request_head(&Method::POST, "/v1/x?q", &h, false, 5);
        assert_eq!(
            String::from_utf8(head.clone()).unwrap(),
            "POST /v1/x?q HTTP/1.1\r\nhost: w:8000\r\nx-a: 1\r\nx-a: 2\r\n\r\n"
        );
        assert!(head.capacity() >= head.len() + 5);
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("gzip, chunked"),
        );
        let head = request_head(&Method::PUT, "/", &h, true, 0);
        assert_eq!(
            String::from_utf8(head).unwrap(),
            "PUT / HTTP/1.1\r\nhost: w:8000\r\nx-a: 1\r\nx-a: 2\r\ntransfer-encoding: chunked\r\n\r\n"
        );
    }

    #[test]
    fn serves_short_answers_are_response_heads() {
        let none = ResponseFraming {
            body: Reframe::Raw,
            length: None,
            close: false,
        };
        assert_eq!(
            response_head(false, StatusCode::CONTINUE, [], &none, true),
            CONTINUE
        );
        for status in [
            StatusCode::BAD_REQUEST,
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            StatusCode::METHOD_NOT_ALLOWED,
            StatusCode::NOT_IMPLEMENTED,
        ] {
            assert_eq!(
                String::from_utf8(refusal_head(status)).unwrap(),
                format!(
                    "HTTP/1.1 {} {}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                    status.as_u16(),
                    status.canonical_reason().unwrap_or("")
                )
            );
        }
    }
}
