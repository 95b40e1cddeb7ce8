//! The commands' flag values, checked: durations, counts, URLs, redaction names and a
//! bearer token's value. Pure functions over the values the CLI hands over (it reads the
//! environment, the files and binds the sockets); each error names the flag and says what
//! a valid value looks like, and the CLI turns it into exit code 2.

use std::time::Duration;

use http::HeaderName;

use crate::model::Endpoint;
use crate::redact::Redaction;

/// A number of seconds > 0 for `flag`.
pub(crate) fn seconds(flag: &str, v: f64) -> Result<Duration, String> {
    if !v.is_finite() || v <= 0.0 {
        return Err(format!("{flag} must be a number of seconds > 0, got {v}"));
    }
    Duration::try_from_secs_f64(v).map_err(|_| format!("{flag} {v} is too large"))
}

/// A number of seconds >= 0 for `flag` (0: at once).
pub(crate) fn seconds_or_zero(flag: &str, v: f64) -> Result<Duration, String> {
    if !v.is_finite() || v < 0.0 {
        return Err(format!("{flag} must be a number of seconds >= 0, got {v}"));
    }
    Duration::try_from_secs_f64(v).map_err(|_| format!("{flag} {v} is too large"))
}

/// A duration in milliseconds >= 0 (at most an hour) for `flag`.
pub(crate) fn milliseconds(flag: &str, v: f64) -> Result<f64, String> {
    if !v.is_finite() || !(0.0..=3_600_000.0).contains(&v) {
        return Err(format!(
            "{flag} must be a number of milliseconds from 0 to 3600000, got {v}"
        ));
    }
    Ok(v)
}

/// A count of at least 1 for `flag`.
pub(crate) fn at_least_one(flag: &str, v: usize) -> Result<usize, String> {
    if v == 0 {
        return Err(format!("{flag} must be at least 1"));
    }
    Ok(v)
}

/// `--shard I/N`: this process is shard I (from 0) of N (at least 2).
pub(crate) fn shard(v: &str) -> Result<(usize, usize), String> {
    let usage = || {
        format!(
            "--shard '{v}' must be I/N: this shard's index from 0 and the number of shards (0/3, 1/3, 2/3), N >= 2"
        )
    };
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
pub(crate) fn start_at(v: &str, now_us: i64) -> Result<i64, String> {
    let at = crate::clock::parse_rfc3339_us(v).map_err(|e| {
        format!("--start-at '{v}' is not an RFC 3339 instant (2026-12-01T12:00:00Z): {e}")
    })?;
    if at <= now_us {
        return Err(format!(
            "--start-at {v} is already {:.1} s past: every shard would start late; give an instant far enough ahead for every shard to be up and warmed up",
            (now_us - at) as f64 / 1e6
        ));
    }
    if at - now_us > 86_400_000_000 {
        return Err(format!("--start-at {v} is more than a day ahead"));
    }
    Ok(at)
}

/// `--endpoint`: an http(s) URL replacing the plan's endpoint.
pub(crate) fn endpoint(flag: &str, url: &str) -> Result<Endpoint, String> {
    Endpoint::parse(url).map_err(|m| format!("{flag} '{url}' {m}"))
}

/// replay's `--endpoint`: the URL, and whether it names only an origin (no path, not
/// even `/`), which then keeps the plan's paths ([`crate::config::plan::Plan::sent_to`]).
pub(crate) fn endpoint_override(url: &str) -> Result<(Endpoint, bool), String> {
    Ok((
        endpoint("--endpoint", url)?,
        Endpoint::names_only_origin(url),
    ))
}

/// `--upstream`: the worker's origin and an optional path prefix, without a query.
pub(crate) fn upstream(url: &str) -> Result<Endpoint, String> {
    let ep = endpoint("--upstream", url)?;
    if ep.path_and_query.contains('?') {
        return Err(format!("--upstream '{url}' must not have a query"));
    }
    Ok(ep)
}

/// The default redaction plus `--redact-header` names and `--redact-query` parameters.
pub(crate) fn redaction(headers: &[String], query: &[String]) -> Result<Redaction, String> {
    let mut r = Redaction::default();
    for h in headers {
        let name = HeaderName::from_bytes(h.as_bytes())
            .map_err(|_| format!("--redact-header '{h}' is not a header name"))?;
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
) -> Result<String, String> {
    let what = format!("environment variable {name} (named by {source})");
    let value = value
        .ok_or_else(|| format!("{what} is not set; export it, or leave out the bearer token"))?;
    let s = value
        .to_str()
        .ok_or_else(|| format!("{what} is not valid UTF-8"))?;
    if s.is_empty() {
        return Err(format!("{what} is empty"));
    }
    if !s.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
        return Err(format!(
            "{what} must hold printable ASCII without spaces or control characters"
        ));
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
                    .starts_with(&format!("--shard '{bad}' must be I/N"))
            );
        }
        let now = crate::clock::parse_rfc3339_us("2026-12-01T12:00:00Z").unwrap();
        assert_eq!(start_at("2026-12-01T12:00:05Z", now), Ok(now + 5_000_000));
        assert!(
            start_at("2026-12-01T11:59:00Z", now)
                .unwrap_err()
                .contains("already 60.0 s past")
        );
        assert!(
            start_at("2026-12-03T12:00:00Z", now)
                .unwrap_err()
                .contains("more than a day")
        );
        assert!(
            start_at("noon", now)
                .unwrap_err()
                .contains("not an RFC 3339 instant")
        );
    }

    #[test]
    fn flag_errors_name_the_flag_and_the_rule() {
        assert_eq!(
            seconds("--grace-seconds", 0.0).unwrap_err(),
            "--grace-seconds must be a number of seconds > 0, got 0"
        );
        assert!(seconds("--x", f64::NAN).is_err());
        assert_eq!(seconds("--x", 1.5).unwrap(), Duration::from_millis(1500));
        assert_eq!(
            at_least_one("--part-rows", 0).unwrap_err(),
            "--part-rows must be at least 1"
        );
        assert_eq!(
            upstream("http://127.0.0.1:8000/v1?x=1").unwrap_err(),
            "--upstream 'http://127.0.0.1:8000/v1?x=1' must not have a query"
        );
        assert!(redaction(&["bad name".into()], &[]).is_err());
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
                .starts_with("--endpoint 'http://127.0.0.1:abc' has an invalid port")
        );
    }

    #[test]
    fn bearer_tokens_are_printable_ascii() {
        let check = |v: &str| bearer_token("T", "--bearer-token-env", Some(v.as_ref()));
        assert_eq!(check("abc.DEF-123").unwrap(), "abc.DEF-123");
        assert!(check("").unwrap_err().ends_with("is empty"));
        assert!(check("a b").is_err());
        assert!(
            bearer_token("T", "--bearer-token-env", None)
                .unwrap_err()
                .contains("is not set")
        );
    }
}
