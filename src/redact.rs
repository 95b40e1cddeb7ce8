//! Which secrets never reach disk, and how they are replaced. A leaf: the recorder
//! applies it while converting rows, `config` refuses plans that carry these headers, and
//! config.json lists the names (never the values).

use std::borrow::Cow;

use http::HeaderName;

/// What a secret value is replaced by.
pub(crate) const REDACTED_TEXT: &str = "<redacted>";
/// [`REDACTED_TEXT`] as bytes, as header values hold it.
pub(crate) const REDACTED: &[u8] = REDACTED_TEXT.as_bytes();

/// Headers whose values never reach disk (and that a plan may not carry, since the plan
/// is copied into every run directory).
pub(crate) const DEFAULT_REDACT_HEADERS: &[&str] = &[
    "authorization",
    "proxy-authorization",
    "cookie",
    "set-cookie",
    "x-api-key",
    "api-key",
    "x-goog-api-key",
    "x-auth-token",
];
/// Query parameters whose values never reach disk. A name in a URL is compared after
/// decoding it as web frameworks do (`%XX` as the byte, `+` as a space), ignoring ASCII
/// case: `?api%5Fkey=S` and `?%61pi_key=S` are `api_key` to the server, so to redaction.
pub(crate) const DEFAULT_REDACT_QUERY: &[&str] =
    &["api_key", "apikey", "key", "token", "access_token"];

/// Which secrets are redacted, and how.
#[derive(Debug, Clone)]
pub struct Redaction {
    pub(crate) headers: Vec<HeaderName>,
    /// Lower-case query parameter names.
    pub(crate) query: Vec<String>,
}

impl Default for Redaction {
    fn default() -> Self {
        Redaction {
            headers: DEFAULT_REDACT_HEADERS
                .iter()
                .map(|h| HeaderName::from_static(h))
                .collect(),
            query: DEFAULT_REDACT_QUERY.iter().map(|s| s.to_string()).collect(),
        }
    }
}

impl Redaction {
    /// The URL with the values of secret query parameters replaced by `<redacted>`.
    pub(crate) fn url<'a>(&self, url: &'a str) -> Cow<'a, str> {
        let Some((head, query)) = url.split_once('?') else {
            return std::borrow::Cow::Borrowed(url);
        };
        let mut out = String::with_capacity(url.len());
        out.push_str(head);
        out.push('?');
        for (i, pair) in query.split('&').enumerate() {
            if i > 0 {
                out.push('&');
            }
            let name = pair.split_once('=').map_or(pair, |(n, _)| n);
            if pair.contains('=') && self.is_secret_query(name) {
                out.push_str(name);
                out.push_str("=<redacted>");
            } else {
                out.push_str(pair);
            }
        }
        std::borrow::Cow::Owned(out)
    }

    /// Whether `url` carries a secret query parameter with a value (even one already
    /// `<redacted>`): what a plan may not hold.
    pub(crate) fn has_secret_query(&self, url: &str) -> bool {
        url.split_once('?').is_some_and(|(_, query)| {
            query
                .split('&')
                .filter_map(|pair| pair.split_once('='))
                .any(|(name, _)| self.is_secret_query(name))
        })
    }

    /// Whether the query parameter `name` (as written in a URL) is one whose value is
    /// redacted: compared after decoding, ignoring ASCII case.
    fn is_secret_query(&self, name: &str) -> bool {
        let decoded = decode_query_name(name);
        self.query
            .iter()
            .any(|q| q.as_bytes().eq_ignore_ascii_case(&decoded))
    }

    /// `value`, or `<redacted>` when the header `name` (ASCII case ignored) is a secret
    /// one.
    pub(crate) fn header_value<'a>(&self, name: &str, value: &'a [u8]) -> &'a [u8] {
        if self
            .headers
            .iter()
            .any(|h| h.as_str().eq_ignore_ascii_case(name))
        {
            REDACTED
        } else {
            value
        }
    }
}

/// A query parameter's name as `application/x-www-form-urlencoded` decoding reads it
/// (Starlette, Flask, Go's `net/url`): `+` is a space and `%XX` the byte it names; a `%`
/// not followed by two hex digits stays as written. Bytes, not text: a name that decodes
/// to invalid UTF-8 is compared as it is.
fn decode_query_name(name: &str) -> Cow<'_, [u8]> {
    let raw = name.as_bytes();
    if !raw.iter().any(|&b| b == b'%' || b == b'+') {
        return Cow::Borrowed(raw);
    }
    let hex = |b: u8| (b as char).to_digit(16);
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        let escaped = match raw.get(i..i + 3) {
            Some(&[b'%', h, l]) => hex(h).zip(hex(l)).map(|(h, l)| (h * 16 + l) as u8),
            _ => None,
        };
        match (escaped, raw[i]) {
            (Some(b), _) => {
                out.push(b);
                i += 3;
            }
            (None, b'+') => {
                out.push(b' ');
                i += 1;
            }
            (None, b) => {
                out.push(b);
                i += 1;
            }
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_redaction_keeps_other_parameters() {
        let r = Redaction::default();
        assert_eq!(
            r.url("http://h/x?token=abc&keep=1&API_KEY=z"),
            "http://h/x?token=<redacted>&keep=1&API_KEY=<redacted>"
        );
        assert_eq!(r.url("http://h/x"), "http://h/x");
        assert_eq!(r.url("http://h/x?key"), "http://h/x?key");
    }

    #[test]
    fn query_names_are_compared_as_a_server_decodes_them() {
        let r = Redaction::default();
        // Every spelling a framework decodes to `api_key` (or `token`) is redacted, the
        // name kept as written.
        for name in [
            "api_key",
            "API_KEY",
            "api%5Fkey",
            "api%5fkey",
            "%61pi_key",
            "%41PI%5fKeY",
            "%61%70%69%5f%6b%65%79",
            "t%6Fken",
        ] {
            assert_eq!(
                r.url(&format!("http://h/x?a=1&{name}=S&b=2")),
                format!("http://h/x?a=1&{name}=<redacted>&b=2"),
                "{name}"
            );
        }
        // `+` is a space: a name given with one matches either spelling.
        let mut spaced = Redaction::default();
        spaced.query.push("my key".into());
        assert_eq!(
            spaced.url("http://h/?my+key=S"),
            "http://h/?my+key=<redacted>"
        );
        assert_eq!(
            spaced.url("http://h/?my%20key=S"),
            "http://h/?my%20key=<redacted>"
        );
        // Near misses and broken escapes are other names, kept.
        for kept in [
            "http://h/?api%5Fkeys=S",
            "http://h/?api%5key=S",
            "http://h/?api_key%=S",
            "http://h/?%=S",
            "http://h/?api+key=S",
        ] {
            assert_eq!(r.url(kept), kept);
        }
    }

    #[test]
    fn decoding_leaves_bytes_it_cannot_read_as_written() {
        assert_eq!(&*decode_query_name("a%zz%4"), b"a%zz%4");
        assert_eq!(&*decode_query_name("%ff+%41"), b"\xff A");
        assert_eq!(&*decode_query_name("%"), b"%");
        assert!(matches!(decode_query_name("plain"), Cow::Borrowed(_)));
    }
}
