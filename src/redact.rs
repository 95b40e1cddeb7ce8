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
];
/// Query parameters whose values never reach disk.
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
            if pair.contains('=') && self.query.iter().any(|q| q.eq_ignore_ascii_case(name)) {
                out.push_str(name);
                out.push_str("=<redacted>");
            } else {
                out.push_str(pair);
            }
        }
        std::borrow::Cow::Owned(out)
    }

    pub(crate) fn header_value<'a>(&self, name: &HeaderName, value: &'a [u8]) -> &'a [u8] {
        if self.headers.contains(name) {
            REDACTED
        } else {
            value
        }
    }
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
}
