//! Our own HTTP/1 core's message rules, which both drivers share: which headers are
//! hop-by-hop (RFC 9110 section 7.6.1), how a request says it is its connection's only
//! one, whether a response is an event stream, which responses have no body; (`codec`)
//! the lean client's response codec without I/O: the head, its framing, chunked bodies;
//! (`request`) its request side by hyper's server rules; (`reframe`) the framing serve
//! writes of what it forwards; and (`write`) the one writer of request and response
//! heads. Both drivers' exchanges go through the codec (`engine::lean`,
//! `engine::upstream`); serve reads client requests with `request`.

pub(crate) mod codec;
pub(crate) mod reframe;
pub(crate) mod request;
pub(crate) mod write;

use http::header::{self, HeaderName, HeaderValue};
use http::{HeaderMap, Method, StatusCode};

const HOP_BY_HOP: [&str; 6] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "upgrade",
    "te",
];

/// Fields a `Connection` token never removes: they say where a message goes and how long
/// it is, and a peer that names them there asks the next hop to read the message
/// differently from us (`Connection: content-length` once made a worker read a request's
/// body as a second request). serve writes the framing fields itself
/// (`engine::http1::reframe`), as nginx's proxy module does.
const NEVER_BY_TOKEN: [&str; 2] = ["host", "content-length"];

/// A field of `h` named `name` (lower case, as a `HeaderName` spells it) is hop-by-hop
/// (RFC 9110 section 7.6.1): `Connection` and every field it names (but `Host` and
/// `Content-Length`), `Keep-Alive`, `Proxy-Connection`, `Transfer-Encoding`, `Upgrade`,
/// `TE`. No allocation: the one rule [`strip_hop_by_hop`] and [`end_to_end`] share.
fn is_hop_by_hop(h: &HeaderMap, name: &str) -> bool {
    HOP_BY_HOP.contains(&name)
        || (!NEVER_BY_TOKEN.contains(&name) && has_token(h, header::CONNECTION, name))
}

/// Remove hop-by-hop headers ([`is_hop_by_hop`]), keeping `TE: trailers` when a `TE`
/// field asked for trailers.
pub(crate) fn strip_hop_by_hop(h: &mut HeaderMap) {
    let gone: Vec<HeaderName> = h
        .keys()
        .filter(|n| is_hop_by_hop(h, n.as_str()))
        .cloned()
        .collect();
    let wants_trailers = has_token(h, header::TE, "trailers");
    for n in gone {
        h.remove(n);
    }
    if wants_trailers {
        h.insert(header::TE, HeaderValue::from_static("trailers"));
    }
}

/// The fields of `h` that [`strip_hop_by_hop`] keeps, in order, without changing `h`
/// (serve writes a response head from them; the record keeps the worker's head as read),
/// then `te: trailers` when a `TE` field asked for trailers.
pub(crate) fn end_to_end(h: &HeaderMap) -> impl Iterator<Item = (&str, &[u8])> {
    let trailers = has_token(h, header::TE, "trailers").then_some(("te", &b"trailers"[..]));
    h.iter()
        .filter(move |(n, _)| !is_hop_by_hop(h, n.as_str()))
        .map(|(n, v)| (n.as_str(), v.as_bytes()))
        .chain(trailers)
}

/// One of the comma-separated tokens of the `name` header fields is `token` (ASCII case
/// ignored), as in `Connection: keep-alive, close` or `TE: gzip, trailers`.
pub(crate) fn has_token(h: &HeaderMap, name: HeaderName, token: &str) -> bool {
    h.get_all(name).iter().any(|v| value_has_token(v, token))
}

/// [`has_token`] for one header line.
pub(crate) fn value_has_token(v: &HeaderValue, token: &str) -> bool {
    v.to_str()
        .is_ok_and(|s| s.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
}

/// A `Transfer-Encoding` line whose last coding is `chunked`.
pub(crate) fn ends_in_chunked(te: &HeaderValue) -> bool {
    te.to_str()
        .ok()
        .and_then(|v| v.rsplit(',').next())
        .is_some_and(|last| last.trim().eq_ignore_ascii_case("chunked"))
}

/// Mark a request as its connection's only one (`Connection: close`). Used on fresh
/// connections: the worker then closes first, so the TIME_WAIT state stays on its side
/// (thousands of them on ours make every connect() search the port table: measured as
/// half of a fresh run's CPU).
pub(crate) fn close_after(headers: &mut HeaderMap) {
    headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
}

/// The response is `text/event-stream` (its events are stamped one by one).
pub(crate) fn is_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| {
            const SSE: &str = "text/event-stream";
            ct.trim_start()
                .get(..SSE.len())
                .is_some_and(|p| p.eq_ignore_ascii_case(SSE))
        })
}

/// A response body delimited by the connection closing (RFC 9112 section 6.3, rule 8):
/// neither `Transfer-Encoding` nor `Content-Length`. Such a body has no framing that could
/// tell a complete end from a cut, so an event stream sent this way must at least end on
/// an event boundary.
pub(crate) fn is_close_delimited(headers: &HeaderMap) -> bool {
    match headers
        .get_all(header::TRANSFER_ENCODING)
        .iter()
        .next_back()
    {
        // A transfer coding other than chunked last: read until the close (rule 7).
        Some(te) => !ends_in_chunked(te),
        None => !headers.contains_key(header::CONTENT_LENGTH),
    }
}

/// A response that has no body by definition (RFC 9110 section 6.4.1): to HEAD, 1xx,
/// 204, 304.
pub(crate) fn has_no_body(method: &Method, status: StatusCode) -> bool {
    method == Method::HEAD
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
}

#[cfg(test)]
mod tests {
    fn h_with(name: header::HeaderName, value: &'static str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(name, http::HeaderValue::from_static(value));
        h
    }

    use super::*;

    #[test]
    fn hop_by_hop_headers_and_the_ones_connection_names_are_removed() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("x-private, keep-alive"),
        );
        h.insert("x-private", HeaderValue::from_static("1"));
        h.insert(header::TE, HeaderValue::from_static("gzip, trailers"));
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        h.insert("x-kept", HeaderValue::from_static("2"));
        strip_hop_by_hop(&mut h);
        let mut names: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        names.sort();
        assert_eq!(names, ["te", "x-kept"]);
        assert_eq!(h[header::TE], "trailers");
    }

    /// serve writes response heads from `end_to_end` and keeps the map whole: the fields it
    /// yields are exactly those `strip_hop_by_hop` leaves, a repeated field's values in order.
    #[test]
    fn end_to_end_yields_what_strip_hop_by_hop_keeps() {
        let mut maps = Vec::new();
        let mut h = HeaderMap::new();
        h.append(header::CONNECTION, HeaderValue::from_static("X-Private"));
        h.append(
            header::CONNECTION,
            HeaderValue::from_static(" keep-alive , ,x-other"),
        );
        h.insert("x-private", HeaderValue::from_static("1"));
        h.insert("x-other", HeaderValue::from_static("2"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert(header::TE, HeaderValue::from_static("gzip, trailers"));
        h.append(header::SET_COOKIE, HeaderValue::from_static("a=1"));
        h.append(header::SET_COOKIE, HeaderValue::from_static("b=2"));
        h.insert("x-kept", HeaderValue::from_static("3"));
        maps.push(h);
        maps.push(h_with(header::UPGRADE, "websocket"));
        maps.push(h_with(header::CONTENT_LENGTH, "12"));
        maps.push(HeaderMap::new());
        for h in maps {
            let got: Vec<(String, Vec<u8>)> = end_to_end(&h)
                .map(|(n, v)| (n.to_string(), v.to_vec()))
                .collect();
            let mut stripped = h.clone();
            strip_hop_by_hop(&mut stripped);
            let want: Vec<(String, Vec<u8>)> = stripped
                .iter()
                .map(|(n, v)| (n.as_str().to_string(), v.as_bytes().to_vec()))
                .collect();
            // Removal reorders a map's names (swap_remove); each name's values keep theirs.
            let (mut got, mut want) = (got, want);
            got.sort_by(|a, b| a.0.cmp(&b.0));
            want.sort_by(|a, b| a.0.cmp(&b.0));
            assert_eq!(got, want, "{h:?}");
        }
    }

    #[test]
    fn event_streams_and_bodiless_responses() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(" Text/Event-Stream; charset=utf-8"),
        );
        assert!(is_event_stream(&h));
        assert!(!is_event_stream(&HeaderMap::new()));
        assert!(is_close_delimited(&HeaderMap::new()));
        assert!(is_close_delimited(&h_with(
            header::TRANSFER_ENCODING,
            "gzip"
        )));
        assert!(!is_close_delimited(&h_with(
            header::TRANSFER_ENCODING,
            "gzip, Chunked"
        )));
        assert!(!is_close_delimited(&h_with(header::CONTENT_LENGTH, "3")));
        assert!(!is_close_delimited(&h_with(
            header::TRANSFER_ENCODING,
            "chunked"
        )));
        assert!(has_no_body(&Method::HEAD, StatusCode::OK));
        assert!(has_no_body(&Method::GET, StatusCode::NOT_MODIFIED));
        assert!(!has_no_body(&Method::GET, StatusCode::OK));
    }
}
