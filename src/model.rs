//! The shared vocabulary: what an exchange is called and measured in, whichever driver
//! made it. Phases and outcomes (the only values of their columns), the side that failed,
//! the timing and stream columns, and where a request goes (an [`Endpoint`] and its
//! [`ConnectionPolicy`]), and how a digest is written ([`hex`]). A leaf: it imports
//! nothing from the crate, and owns no I/O.

/// A digest (a SHA-256) as every file and document of the project writes it: lowercase
/// hex.
pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// The only values of the `phase` column.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Health,
    Readiness,
    Warmup,
    Feasibility,
    Measured,
    Live,
}

impl Phase {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Phase::Health => "health",
            Phase::Readiness => "readiness",
            Phase::Warmup => "warmup",
            Phase::Feasibility => "feasibility",
            Phase::Measured => "measured",
            Phase::Live => "live",
        }
    }
}

/// The only values of the `outcome` column (serialized as [`Outcome::as_str`]).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Default,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    #[default]
    Ok,
    /// Status other than the expected one.
    Http,
    /// Oracle mismatch.
    Correctness,
    /// A deadline passed: the plan's `timeout_seconds` (replay), or serve's
    /// `--upstream-timeout` / `--upstream-idle-timeout`.
    Timeout,
    /// Connect, reset, malformed or cut response.
    Transport,
    /// serve: the client went away.
    ClientAborted,
    /// Cut at the end of the stop's grace period (`--grace-seconds`).
    ShutdownCut,
}

impl Outcome {
    pub(crate) const ALL: [Outcome; 7] = [
        Outcome::Ok,
        Outcome::Http,
        Outcome::Correctness,
        Outcome::Timeout,
        Outcome::Transport,
        Outcome::ClientAborted,
        Outcome::ShutdownCut,
    ];
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Http => "http",
            Outcome::Correctness => "correctness",
            Outcome::Timeout => "timeout",
            Outcome::Transport => "transport",
            Outcome::ClientAborted => "client_aborted",
            Outcome::ShutdownCut => "shutdown_cut",
        }
    }
}

/// The timing columns: microseconds from the exchange's t0 on the monotonic clock.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Timings {
    pub connect_us: Option<i64>,
    pub tls_us: Option<i64>,
    pub tls_resumed: Option<bool>,
    pub request_sent_us: Option<i64>,
    pub first_byte_us: Option<i64>,
    pub first_body_us: Option<i64>,
    pub total_us: Option<i64>,
    /// serve only: last response byte handed to the client.
    pub downstream_done_us: Option<i64>,
}

/// Event-stream columns of a row (SSE responses only).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamColumns {
    pub(crate) event_count: i64,
    pub(crate) event_offsets_us: Vec<i64>,
    pub(crate) content_offsets_us: Vec<i64>,
    pub(crate) ttft_us: Option<i64>,
    pub(crate) tpot_us: Option<i64>,
    pub(crate) output_tokens: Option<i64>,
    pub(crate) output_tokens_source: &'static str,
    pub(crate) prompt_tokens: Option<i64>,
    /// The usage chunk's `prompt_tokens_details.cached_tokens`, when reported.
    pub(crate) cached_prompt_tokens: Option<i64>,
    /// An event's data was exactly `[DONE]`.
    pub(crate) done_seen: bool,
}

impl StreamColumns {
    /// See [`bundled`].
    pub(crate) fn bundled(&self) -> bool {
        bundled(&self.content_offsets_us)
    }
}

/// Whether a stream's tokens after its first arrived bundled: at least two content events
/// after the first, and more than half of them arrived in one read (events of one read
/// share its arrival stamp). Its decode time at the boundary is then not the worker's:
/// it is how a buffer flushed (docs/campaigns.md, "Decode speed").
pub(crate) fn bundled(content_offsets_us: &[i64]) -> bool {
    let after = content_offsets_us.get(1..).unwrap_or_default();
    if after.len() < 2 {
        return false;
    }
    let (mut best, mut run) = (1usize, 1usize);
    for w in after.windows(2) {
        run = if w[0] == w[1] { run + 1 } else { 1 };
        best = best.max(run);
    }
    best * 2 > after.len()
}

/// How a case's answers are judged (summary.json's `judged`): by their oracle, by drift
/// from the campaign's reference (a campaign case without an oracle), or not at all (a
/// capture plan: answers are recorded, `ok` means the exchange completed with the
/// expected status). Written `"oracle"`, `"drift"` or `false`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum JudgedBy {
    Oracle,
    Drift,
    No,
}

impl JudgedBy {
    /// As the table and the report say it.
    pub(crate) fn label(self) -> &'static str {
        match self {
            JudgedBy::Oracle => "oracle",
            JudgedBy::Drift => "drift",
            JudgedBy::No => "not judged",
        }
    }
}

impl serde::Serialize for JudgedBy {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            JudgedBy::Oracle => s.serialize_str("oracle"),
            JudgedBy::Drift => s.serialize_str("drift"),
            JudgedBy::No => s.serialize_bool(false),
        }
    }
}

impl<'de> serde::Deserialize<'de> for JudgedBy {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Name(String),
            Flag(bool),
        }
        match Raw::deserialize(d)? {
            Raw::Name(n) if n == "oracle" => Ok(JudgedBy::Oracle),
            Raw::Name(n) if n == "drift" => Ok(JudgedBy::Drift),
            Raw::Flag(false) => Ok(JudgedBy::No),
            _ => Err(serde::de::Error::custom(
                "judged is \"oracle\", \"drift\" or false",
            )),
        }
    }
}

/// The load of a measured round: `c` closed-loop workers, or an open-loop arrival rate
/// (requests per second). Ordered closed levels first, then open ones, each ascending.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
pub(crate) enum Level {
    Concurrency(usize),
    Rate(f64),
}

impl Level {
    /// How the table and messages name it: `4` workers, or `20/s`.
    pub(crate) fn label(self) -> String {
        match self {
            Level::Concurrency(c) => c.to_string(),
            Level::Rate(r) => format!("{r}/s"),
        }
    }

    /// As progress lines and chart legends name it: `c=4`, or `20/s`.
    pub(crate) fn named(self) -> String {
        match self {
            Level::Concurrency(c) => format!("c={c}"),
            Level::Rate(_) => self.label(),
        }
    }
}

/// `x` to four significant digits (a measured or placed rate: a level's label, and the
/// rows' key); `x` itself when it is not a positive finite number.
pub(crate) fn four_digits(x: f64) -> f64 {
    if !(x.is_finite() && x > 0.0) {
        return x;
    }
    let scale = 10f64.powi(3 - x.log10().floor() as i32);
    (x * scale).round() / scale
}

/// A plan's per-request bounds (`slo`), in microseconds, each optional: an exchange is
/// good output when it passed its oracle and met every bound given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Slo {
    pub(crate) ttft_us: Option<i64>,
    pub(crate) tpot_us: Option<i64>,
    pub(crate) e2e_us: Option<i64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scheme {
    Http,
    Https,
}

/// The port text of an authority (`host:port`, `[v6]:port`), if it has a colon after the
/// host: `Some("")` for `host:`.
fn explicit_port(authority: &str) -> Option<&str> {
    let after_host = match authority.strip_prefix('[') {
        Some(rest) => &rest[rest.find(']')? + 1..],
        None => authority,
    };
    after_host.rfind(':').map(|i| &after_host[i + 1..])
}

impl Scheme {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Scheme::Http => "http",
            Scheme::Https => "https",
        }
    }
}

/// A validated http(s) URL: no credentials, no fragment, a host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Endpoint {
    pub(crate) scheme: Scheme,
    /// Host to connect to (IPv6 without brackets).
    pub(crate) host: String,
    pub(crate) port: u16,
    /// `Host` header value: the authority as written in the URL.
    pub(crate) authority: String,
    /// Origin-form request target, `/path?query`.
    pub(crate) path_and_query: String,
}

/// Why a URL is not an endpoint; the words follow the URL as its caller writes it
/// (`--endpoint 'URL' must name a host`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum EndpointError {
    #[error("must not contain a fragment ('#')")]
    Fragment,
    #[error("must not contain whitespace or control characters")]
    Whitespace,
    #[error("is not a valid absolute URL ({0})")]
    Invalid(String),
    #[error("scheme '{0}' is not supported; use http or https")]
    Scheme(String),
    #[error("must be an absolute http:// or https:// URL")]
    NotAbsolute,
    #[error("must name a host")]
    NoHost,
    #[error("must not contain credentials (user:pass@); use auth.bearer_token_env for a token")]
    Credentials,
    /// The port as written, its first 20 characters.
    #[error(
        "has an invalid port '{0}': give a number from 1 to 65535, or no ':' for the scheme's default"
    )]
    Port(String),
}

impl Endpoint {
    pub(crate) fn parse(s: &str) -> Result<Endpoint, EndpointError> {
        if s.contains('#') {
            return Err(EndpointError::Fragment);
        }
        if s.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(EndpointError::Whitespace);
        }
        let uri: http::Uri = s
            .parse()
            .map_err(|e: http::uri::InvalidUri| EndpointError::Invalid(e.to_string()))?;
        let scheme = match uri.scheme_str() {
            Some("http") => Scheme::Http,
            Some("https") => Scheme::Https,
            Some(other) => return Err(EndpointError::Scheme(other.to_string())),
            None => return Err(EndpointError::NotAbsolute),
        };
        let authority = uri
            .authority()
            .ok_or(EndpointError::NoHost)?
            .as_str()
            .to_string();
        if authority.contains('@') {
            return Err(EndpointError::Credentials);
        }
        let host = uri.host().unwrap_or("");
        if host.is_empty() {
            return Err(EndpointError::NoHost);
        }
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        // `http::Uri` accepts any text after the colon and then has no `port_u16()`: an
        // explicit port must be a number from 1 to 65535, never silently the default.
        let port = match explicit_port(&authority) {
            None => match scheme {
                Scheme::Http => 80,
                Scheme::Https => 443,
            },
            Some(p) => p
                .parse::<u16>()
                .ok()
                .filter(|&n| n != 0)
                .ok_or_else(|| EndpointError::Port(p.chars().take(20).collect()))?,
        };
        let path_and_query = uri
            .path_and_query()
            .map(|p| p.as_str().to_string())
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| "/".to_string());
        Ok(Endpoint {
            scheme,
            host,
            port,
            authority,
            path_and_query,
        })
    }

    pub(crate) fn url(&self) -> String {
        format!(
            "{}://{}{}",
            self.scheme.as_str(),
            self.authority,
            self.path_and_query
        )
    }

    /// Whether `url` names only an origin: nothing after its authority, not even `/`
    /// (`http://host:8000`, not `http://host:8000/` nor `http://host:8000?x=1`).
    pub(crate) fn names_only_origin(url: &str) -> bool {
        let rest = url.split_once("://").map_or(url, |(_, r)| r);
        !rest.contains(['/', '?'])
    }

    /// The same origin with another origin-form target.
    pub(crate) fn with_path(&self, path_and_query: &str) -> Endpoint {
        Endpoint {
            path_and_query: path_and_query.to_string(),
            ..self.clone()
        }
    }

    /// This endpoint's path on `origin`'s scheme, host and port.
    pub(crate) fn on_origin_of(&self, origin: &Endpoint) -> Endpoint {
        origin.with_path(&self.path_and_query)
    }
}

/// How requests use connections: one enum for both drivers. A plan and replay's
/// config.json name it `keep-alive` / `fresh`; serve's `--upstream-connection` and its
/// config.json `pinned` / `fresh`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectionPolicy {
    /// Each worker (replay) or client connection (serve) owns one upstream connection and
    /// reopens it only when the peer closed it.
    KeepAlive,
    /// A new connection for every request (connect, and TLS without resumption, in every sample).
    Fresh,
}

impl ConnectionPolicy {
    /// As a plan and replay name it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ConnectionPolicy::Fresh => "fresh",
            ConnectionPolicy::KeepAlive => "keep-alive",
        }
    }

    /// As serve names it.
    pub(crate) fn serve_name(self) -> &'static str {
        match self {
            ConnectionPolicy::Fresh => "fresh",
            ConnectionPolicy::KeepAlive => "pinned",
        }
    }
}

/// Which side of the proxy an exchange failed on (Pingora's `ErrorSource`): the worker
/// (`Upstream`: an error, or too slow for one of our deadlines), the client
/// (`Downstream`, serve only), or the proxy itself (`Internal`: its shutdown).
/// `engine::ExchangeError::outcome` is the one place that turns a side and a cause into
/// an [`Outcome`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    Upstream,
    Downstream,
    Internal,
}

/// The path of a URL as recorded or as sent, without scheme, authority, query or fragment
/// (`/` when it has none): what serve's routes and the live metrics group by.
pub(crate) fn url_path(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let rest = rest.split(['?', '#']).next().unwrap_or("");
    rest.find('/').map_or("/", |i| &rest[i..])
}

/// What an answer's `usage` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AnswerUsage {
    /// (`prompt_tokens` when reported, `completion_tokens`).
    pub(crate) tokens: (Option<i64>, i64),
    /// `prompt_tokens_details.cached_tokens` when reported: the server's prefix cache
    /// served that many of the prompt's tokens (`None` is unknown, never 0).
    pub(crate) cached_prompt: Option<i64>,
}

/// A count an answer's usage may report and be recorded: an integer 0 to 2^40. A
/// negative, absurd or non-integer value from a broken or hostile worker is no count (a
/// row holding one would be refused when read back).
pub(crate) fn usage_count(v: Option<&serde_json::Value>) -> Option<i64> {
    v.and_then(serde_json::Value::as_i64)
        .filter(|n| (0..=MAX_TOKEN_COUNT).contains(n))
}

/// What a JSON answer's `usage` says, read from its bytes without building the document
/// (serde skips every other member): its token counts and cached prompt tokens.
/// `None` when the body is not a JSON object or reports no completion tokens.
pub(crate) fn answer_usage(body: &[u8]) -> Option<AnswerUsage> {
    #[derive(serde::Deserialize)]
    struct Answer {
        usage: Option<Usage>,
    }
    #[derive(serde::Deserialize)]
    struct Usage {
        prompt_tokens: Option<serde_json::Value>,
        completion_tokens: Option<serde_json::Value>,
        prompt_tokens_details: Option<Details>,
    }
    /// Only `cached_tokens` is kept; another member, or a value that is not an object, is
    /// read and dropped (an untagged enum: serde holds the member's value while it tries
    /// the object form, at most the recorded body's size).
    #[derive(serde::Deserialize)]
    #[serde(untagged)]
    enum Details {
        Object {
            cached_tokens: Option<serde_json::Value>,
        },
        Other(serde::de::IgnoredAny),
    }
    if body.trim_ascii_start().first() != Some(&b'{') {
        return None;
    }
    let u = serde_json::from_slice::<Answer>(body).ok()?.usage?;
    Some(AnswerUsage {
        tokens: (
            usage_count(u.prompt_tokens.as_ref()),
            usage_count(u.completion_tokens.as_ref())?,
        ),
        cached_prompt: match &u.prompt_tokens_details {
            Some(Details::Object { cached_tokens }) => usage_count(cached_tokens.as_ref()),
            _ => None,
        },
    })
}

/// The largest token count an answer's usage may report and be recorded (2^40, the
/// largest count a row may hold).
pub(crate) const MAX_TOKEN_COUNT: i64 = 1 << 40;

#[cfg(test)]
mod usage_tests {
    use super::answer_usage;

    #[test]
    fn a_json_answers_usage_is_read_and_impossible_counts_are_none() {
        let u = |b: &str| answer_usage(b.as_bytes()).map(|u| u.tokens);
        assert_eq!(
            u(r#"{"id":"x","usage":{"prompt_tokens":3,"completion_tokens":7}}"#),
            Some((Some(3), 7))
        );
        assert_eq!(u(r#" {"usage":{"completion_tokens":7}}"#), Some((None, 7)));
        // A hostile worker: negative, absurd or non-integer counts are no count.
        assert_eq!(u(r#"{"usage":{"completion_tokens":-1}}"#), None);
        assert_eq!(u(r#"{"usage":{"completion_tokens":1e15}}"#), None);
        assert_eq!(u(r#"{"usage":{"completion_tokens":1099511627777}}"#), None);
        assert_eq!(
            u(r#"{"usage":{"prompt_tokens":-5,"completion_tokens":2}}"#),
            Some((None, 2))
        );
        assert_eq!(u(r#"{"usage":"many"}"#), None);
        assert_eq!(u("[1,2]"), None);
        assert_eq!(u("not json"), None);
    }

    /// `prompt_tokens_details.cached_tokens` is the cached prompt tokens when it is a
    /// count; absent, null, negative, absurd or not an integer, it is unknown (never 0).
    #[test]
    fn cached_prompt_tokens_are_read_from_the_usage_details() {
        let cached = |details: &str| {
            let body = format!(
                r#"{{"usage":{{"prompt_tokens":9,"completion_tokens":2{details}}},"choices":[]}}"#
            );
            answer_usage(body.as_bytes()).unwrap().cached_prompt
        };
        assert_eq!(
            cached(r#","prompt_tokens_details":{"cached_tokens":7}"#),
            Some(7)
        );
        assert_eq!(
            cached(r#","prompt_tokens_details":{"cached_tokens":0}"#),
            Some(0)
        );
        assert_eq!(cached(""), None);
        assert_eq!(cached(r#","prompt_tokens_details":null"#), None);
        assert_eq!(
            cached(r#","prompt_tokens_details":{"audio_tokens":1}"#),
            None
        );
        assert_eq!(
            cached(r#","prompt_tokens_details":{"cached_tokens":-1}"#),
            None
        );
        assert_eq!(
            cached(r#","prompt_tokens_details":{"cached_tokens":2.5}"#),
            None
        );
        assert_eq!(
            cached(r#","prompt_tokens_details":{"cached_tokens":"7"}"#),
            None
        );
        assert_eq!(
            cached(r#","prompt_tokens_details":{"cached_tokens":1099511627777}"#),
            None
        );
        assert_eq!(cached(r#","prompt_tokens_details":[7]"#), None);
    }
}
