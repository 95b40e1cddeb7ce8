//! The commands' flag values, checked: durations, counts, URLs, redaction names and a
//! bearer token's value. Pure functions over the values the CLI hands over (it reads the
//! environment, the files and binds the sockets); each error ([`FlagError`]) names the
//! flag and says what a valid value looks like, and the CLI turns it into exit code 2.

use std::time::Duration;

use http::HeaderName;

use crate::model::Endpoint;
use crate::redact::Redaction;

/// Which rule a flag's value broke; its text names the flag and what a valid value
/// looks like.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(crate) enum FlagError {
    /// A duration that must be > 0 seconds is not.
    #[error("{flag} must be a number of seconds > 0, got {value}")]
    NotPositiveSeconds { flag: String, value: f64 },
    /// A duration that must be >= 0 seconds is not.
    #[error("{flag} must be a number of seconds >= 0, got {value}")]
    NegativeSeconds { flag: String, value: f64 },
    /// A number of seconds too large for a [`Duration`].
    #[error("{flag} {value} is too large")]
    TooLarge { flag: String, value: f64 },
    /// A number of milliseconds outside 0 ..= 3600000.
    #[error("{flag} must be a number of milliseconds from 0 to 3600000, got {value}")]
    Milliseconds { flag: String, value: f64 },
    /// A count that must be at least 1 is 0.
    #[error("{flag} must be at least 1")]
    Zero { flag: String },
    /// `--shard` is not I/N with 0 <= I < N and 2 <= N <= 10000.
    #[error(
        "--shard '{0}' must be I/N: this shard's index from 0 and the number of shards (0/3, 1/3, 2/3), N >= 2"
    )]
    Shard(String),
    /// `--start-at` is not an RFC 3339 instant.
    #[error("--start-at '{value}' is not an RFC 3339 instant (2026-12-01T12:00:00Z): {reason}")]
    StartAtSyntax {
        value: String,
        #[source]
        reason: chrono::ParseError,
    },
    /// `--start-at` is not in the future.
    #[error(
        "--start-at {value} is already {late_s:.1} s past: every shard would start late; give an instant far enough ahead for every shard to be up and warmed up"
    )]
    StartAtPast { value: String, late_s: f64 },
    /// `--start-at` is more than a day ahead.
    #[error("--start-at {0} is more than a day ahead")]
    StartAtTooFar(String),
    /// A URL flag's value is not an http(s) URL; `reason` says why.
    #[error("{flag} '{url}' {reason}")]
    Url {
        flag: String,
        url: String,
        #[source]
        reason: crate::model::EndpointError,
    },
    /// `--upstream` has a query.
    #[error("--upstream '{0}' must not have a query")]
    UpstreamQuery(String),
    /// A `--redact-header` value is not a header name.
    #[error("--redact-header '{0}' is not a header name")]
    RedactHeader(String),
    /// A bearer token's environment variable (`what` names it and its source) is unset.
    #[error("{what} is not set; export it, or leave out the bearer token")]
    TokenUnset { what: String },
    /// A bearer token's value is not UTF-8.
    #[error("{what} is not valid UTF-8")]
    TokenNotUtf8 { what: String },
    /// A bearer token's value is empty.
    #[error("{what} is empty")]
    TokenEmpty { what: String },
    /// A bearer token's value has spaces, control or non-ASCII characters.
    #[error("{what} must hold printable ASCII without spaces or control characters")]
    TokenNotPrintable { what: String },
}

/// The CLI's usage errors are its message (exit code 2).
impl From<FlagError> for String {
    fn from(e: FlagError) -> String {
        e.to_string()
    }
}

/// A number of seconds > 0 for `flag`.
pub(crate) fn seconds(flag: &str, v: f64) -> Result<Duration, FlagError> {
    if !v.is_finite() || v <= 0.0 {
        return Err(FlagError::NotPositiveSeconds {
            flag: flag.into(),
            value: v,
        });
    }
    whole_seconds(flag, v)
}

/// A number of seconds >= 0 for `flag` (0: at once).
pub(crate) fn seconds_or_zero(flag: &str, v: f64) -> Result<Duration, FlagError> {
    if !v.is_finite() || v < 0.0 {
        return Err(FlagError::NegativeSeconds {
            flag: flag.into(),
            value: v,
        });
    }
    whole_seconds(flag, v)
}

/// A finite number of seconds >= 0 as a [`Duration`], unless too large for one.
fn whole_seconds(flag: &str, v: f64) -> Result<Duration, FlagError> {
    Duration::try_from_secs_f64(v).map_err(|_| FlagError::TooLarge {
        flag: flag.into(),
        value: v,
    })
}

/// A duration in milliseconds >= 0 (at most an hour) for `flag`.
pub(crate) fn milliseconds(flag: &str, v: f64) -> Result<f64, FlagError> {
    if !v.is_finite() || !(0.0..=3_600_000.0).contains(&v) {
        return Err(FlagError::Milliseconds {
            flag: flag.into(),
            value: v,
        });
    }
    Ok(v)
}

/// A count of at least 1 for `flag`.
pub(crate) fn at_least_one(flag: &str, v: usize) -> Result<usize, FlagError> {
    if v == 0 {
        return Err(FlagError::Zero { flag: flag.into() });
    }
    Ok(v)
}

/// `--shard I/N`: this process is shard I (from 0) of N (at least 2).
pub(crate) fn shard(v: &str) -> Result<(usize, usize), FlagError> {
    let usage = || FlagError::Shard(v.to_string());
    let (i, n) = v.split_once('/').ok_or_else(usage)?;
    let (i, n): (usize, usize) = (
        i.trim().parse().map_err(|_| usage())?,
        n.trim().parse().map_err(|_| usage())?,
    );
    if n < 2 || i >= n || n > 10_000 {
        return Err(usage());
    }
    Ok((i, n))
}

/// `--start-at`: an RFC 3339 instant (`2026-12-01T12:00:00Z`) after `now_us` (wall
/// clock, µs since the epoch), at most a day ahead; microseconds since the epoch.
pub(crate) fn start_at(v: &str, now_us: i64) -> Result<i64, FlagError> {
    let at = crate::clock::parse_rfc3339_us(v).map_err(|reason| FlagError::StartAtSyntax {
        value: v.to_string(),
        reason,
    })?;
    if at <= now_us {
        return Err(FlagError::StartAtPast {
            value: v.to_string(),
            late_s: (now_us - at) as f64 / 1e6,
        });
    }
    if at - now_us > 86_400_000_000 {
        return Err(FlagError::StartAtTooFar(v.to_string()));
    }
    Ok(at)
}

/// `--endpoint`: an http(s) URL replacing the plan's endpoint.
pub(crate) fn endpoint(flag: &str, url: &str) -> Result<Endpoint, FlagError> {
    Endpoint::parse(url).map_err(|reason| FlagError::Url {
        flag: flag.into(),
        url: url.into(),
        reason,
    })
}

/// replay's `--endpoint`: the URL, and whether it names only an origin (no path, not
/// even `/`), which then keeps the plan's paths ([`crate::config::plan::Plan::sent_to`]).
pub(crate) fn endpoint_override(url: &str) -> Result<(Endpoint, bool), FlagError> {
    Ok((
        endpoint("--endpoint", url)?,
        Endpoint::names_only_origin(url),
    ))
}

/// `--upstream`: the worker's origin and an optional path prefix, without a query.
pub(crate) fn upstream(url: &str) -> Result<Endpoint, FlagError> {
    let ep = endpoint("--upstream", url)?;
    if ep.path_and_query.contains('?') {
        return Err(FlagError::UpstreamQuery(url.to_string()));
    }
    Ok(ep)
}

/// The default redaction plus `--redact-header` names and `--redact-query` parameters.
pub(crate) fn redaction(headers: &[String], query: &[String]) -> Result<Redaction, FlagError> {
    let mut r = Redaction::default();
    for h in headers {
        let name =
            HeaderName::from_bytes(h.as_bytes()).map_err(|_| FlagError::RedactHeader(h.clone()))?;
        r.headers.push(name);
    }
    r.query.extend(query.iter().map(|q| q.to_ascii_lowercase()));
    Ok(r)
}

/// The value of the environment variable `name` (named by `source`) as a bearer token:
/// set, UTF-8, non-empty, printable ASCII without spaces.
pub(crate) fn bearer_token(
    name: &str,
    source: &str,
    value: Option<&std::ffi::OsStr>,
) -> Result<String, FlagError> {
    let what = format!("environment variable {name} (named by {source})");
    let Some(value) = value else {
        return Err(FlagError::TokenUnset { what });
    };
    let Some(s) = value.to_str() else {
        return Err(FlagError::TokenNotUtf8 { what });
    };
    if s.is_empty() {
        return Err(FlagError::TokenEmpty { what });
    }
    if !s.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
        return Err(FlagError::TokenNotPrintable { what });
    }
    Ok(s.to_string())
}

/// An environment variable name as a plan's `auth.bearer_token_env` and
/// `--bearer-token-env` take it: letters, digits and `_`, not starting with a digit.
pub(crate) fn is_env_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .enumerate()
            .all(|(i, c)| c == '_' || c.is_ascii_alphabetic() || (i > 0 && c.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_and_start_at_are_checked() {
        assert_eq!(shard("1/3"), Ok((1, 3)));
        assert_eq!(shard("0/2"), Ok((0, 2)));
        for bad in ["3/3", "0/1", "1", "a/3", "-1/3", "1/0"] {
            assert!(
                shard(bad)
                    .unwrap_err()
                    .to_string()
                    .starts_with(&format!("--shard '{bad}' must be I/N"))
            );
        }
        let now = crate::clock::parse_rfc3339_us("2026-12-01T12:00:00Z").unwrap();
        assert_eq!(start_at("2026-12-01T12:00:05Z", now), Ok(now + 5_000_000));
        assert!(matches!(
            start_at("2026-12-01T11:59:00Z", now),
            Err(FlagError::StartAtPast { .. })
        ));
        assert!(
            start_at("2026-12-01T11:59:00Z", now)
                .unwrap_err()
                .to_string()
                .contains("already 60.0 s past")
        );
        assert!(
            start_at("2026-12-03T12:00:00Z", now)
                .unwrap_err()
                .to_string()
                .contains("more than a day")
        );
        assert!(
            start_at("noon", now)
                .unwrap_err()
                .to_string()
                .contains("not an RFC 3339 instant")
        );
    }

    #[test]
    fn flag_errors_name_the_flag_and_the_rule() {
        assert_eq!(
            seconds("--grace-seconds", 0.0).unwrap_err().to_string(),
            "--grace-seconds must be a number of seconds > 0, got 0"
        );
        assert!(matches!(
            seconds("--x", f64::NAN),
            Err(FlagError::NotPositiveSeconds { .. })
        ));
        assert_eq!(seconds("--x", 1.5).unwrap(), Duration::from_millis(1500));
        assert_eq!(
            at_least_one("--part-rows", 0).unwrap_err().to_string(),
            "--part-rows must be at least 1"
        );
        assert_eq!(
            upstream("http://127.0.0.1:8000/v1?x=1")
                .unwrap_err()
                .to_string(),
            "--upstream 'http://127.0.0.1:8000/v1?x=1' must not have a query"
        );
        assert_eq!(
            redaction(&["bad name".into()], &[]).unwrap_err(),
            FlagError::RedactHeader("bad name".into())
        );
        let r = redaction(&["x-secret".into()], &["SIG".into()]).unwrap();
        assert!(r.headers.iter().any(|h| h == "x-secret"));
        assert!(r.query.iter().any(|q| q == "sig"));
    }

    #[test]
    fn an_endpoint_with_no_path_at_all_names_only_an_origin() {
        let origin_only = |u: &str| endpoint_override(u).map(|(_, o)| o);
        assert_eq!(origin_only("http://127.0.0.1:8000"), Ok(true));
        assert_eq!(origin_only("https://example.com"), Ok(true));
        assert_eq!(origin_only("http://[::1]:8000"), Ok(true));
        // A slash is a path: `/` is sent to.
        assert_eq!(origin_only("http://127.0.0.1:8000/"), Ok(false));
        assert_eq!(origin_only("http://127.0.0.1:8000/v1"), Ok(false));
        let (ep, _) = endpoint_override("http://127.0.0.1:8000").unwrap();
        assert_eq!(ep.path_and_query, "/");
        assert!(
            endpoint_override("http://127.0.0.1:abc")
                .unwrap_err()
                .to_string()
                .starts_with("--endpoint 'http://127.0.0.1:abc' has an invalid port")
        );
    }

    #[test]
    fn bearer_tokens_are_printable_ascii() {
        let check = |v: &str| bearer_token("T", "--bearer-token-env", Some(v.as_ref()));
        assert_eq!(check("abc.DEF-123").unwrap(), "abc.DEF-123");
        assert!(matches!(check(""), Err(FlagError::TokenEmpty { .. })));
        assert!(check("").unwrap_err().to_string().ends_with("is empty"));
        assert!(matches!(
            check("a b"),
            Err(FlagError::TokenNotPrintable { .. })
        ));
        assert!(
            bearer_token("T", "--bearer-token-env", None)
                .unwrap_err()
                .to_string()
                .contains("is not set")
        );
    }
}
