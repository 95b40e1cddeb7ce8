//! Recorded exchanges to distinct requests: each row is kept (the first answer to its
//! request becomes the oracle, later ones are evidence) or counted under the reason it
//! cannot be frozen. Requests are grouped into cases by what a plan's case holds (method,
//! path, content type, headers, expected status) and into variants by the exact bytes a
//! replay would send. Holds one body per distinct request, never the repeats.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde_json::{Value, json};

use super::evidence::{self, Difference};
use crate::config::ENGINE_HEADERS;
use crate::model::Outcome;
use crate::record::read::ExchangeRow;
use crate::redact::{DEFAULT_REDACT_HEADERS, REDACTED, REDACTED_TEXT};

/// Request headers a frozen case does not carry besides the engine's own (framing and
/// hop-by-hop headers and the content type: `config::ENGINE_HEADERS`, which a plan may
/// not set): what serve adds on the way (`X-Forwarded-*`, `Forwarded`, `Via`), what an
/// HTTP client says of itself on every call (user agent, accepted encodings, trace
/// context), and identifiers unique to each request (kept, they would make every
/// request its own case).
pub(crate) const DROPPED_HEADERS: &[&str] = &[
    "expect",
    "x-forwarded-for",
    "x-forwarded-proto",
    "x-forwarded-host",
    "forwarded",
    "via",
    "user-agent",
    "accept",
    "accept-encoding",
    "traceparent",
    "tracestate",
    "x-request-id",
    "x-correlation-id",
    "idempotency-key",
];

/// Session-affinity headers: a session's identity, not a case's key. Dropped from the
/// case (each session would be a case of its own), kept on the request as its session
/// ([`Variant::session`]) and named in a frozen session case's `session_header`.
pub(crate) const SESSION_HEADERS: &[&str] = &[
    "x-session-id",
    "session-id",
    "x-conversation-id",
    "x-session-affinity",
];

/// Header name prefixes dropped likewise: the `openai` SDK's per-call telemetry
/// (`x-stainless-retry-count`, `x-stainless-read-timeout`, ...).
pub(crate) const DROPPED_HEADER_PREFIXES: &[&str] = &["x-stainless-"];

/// What a frozen request sends.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Body {
    /// No body (GET, HEAD, or an empty POST).
    Empty,
    /// A JSON body, sent as `serde_json` writes it (which is its identity).
    Json(Value),
    /// A text body.
    Text(String),
}

/// The oracle a recorded answer becomes.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Answer {
    /// A JSON answer: `expected_response`.
    Json(Value),
    /// An OpenAI-style event stream: `expected_stream_text`, the assembled content.
    StreamText(String),
    /// Another event stream: `expected_events`, each event's data as JSON when it is an
    /// object or an array, else as text.
    Events(Vec<Value>),
    /// Anything else: `expected_response_text`, exact bytes.
    Text(String),
}

/// What a plan's case holds besides its variants.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct CaseKey {
    pub(crate) method: String,
    /// Origin-form target: path and query as the worker received them.
    pub(crate) path: String,
    pub(crate) content_type: Option<String>,
    /// Kept request headers, sorted by name; repeated ones joined with `, `.
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) status: u16,
}

/// One distinct request, its first answer and what its repeats said.
#[derive(Debug, Clone)]
pub(crate) struct Variant {
    pub(crate) body: Body,
    pub(crate) first: Answer,
    /// Answers seen, the first included.
    pub(crate) answers: u64,
    /// Leaves outside the content that differed between answers.
    pub(crate) volatile: BTreeSet<String>,
    /// Repeats whose content differed from the first answer.
    pub(crate) differed: u64,
    /// Where the first such repeat differed.
    pub(crate) first_difference: Option<String>,
    /// The source plan's `prompt_tokens` for this request, carried into the frozen plan.
    pub(crate) prompt_tokens: Option<i64>,
    /// The replayed plan's name for this request (its first row's `variant`; `None` in
    /// serve), which the frozen variant keeps.
    pub(crate) source_name: Option<String>,
    /// The session-affinity header its first row carried: (name, value).
    pub(crate) session: Option<(String, String)>,
    /// Its first recorded answer called a tool (a JSON message's or a stream's merged
    /// `tool_calls`).
    pub(crate) called_tools: bool,
    /// The contract it is judged by instead of its recorded answer (`freeze --oracle`,
    /// `contracts.rs`); `None`: its exact answer.
    pub(crate) contract: Option<Pick>,
}

/// A contract a frozen request is judged by instead of its recorded answer.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Pick {
    /// `expected_schema`: the request's own `response_format` schema.
    Schema(Value),
    /// `expected_tool_calls`: calls of the request's own tools.
    ToolCalls,
}

impl Pick {
    /// The oracle's field and value in the plan.
    pub(crate) fn field(&self) -> (&'static str, Value) {
        match self {
            Pick::Schema(s) => ("expected_schema", s.clone()),
            Pick::ToolCalls => ("expected_tool_calls", json!({})),
        }
    }

    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Pick::Schema(_) => "expected_schema",
            Pick::ToolCalls => "expected_tool_calls",
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Case {
    pub(crate) key: CaseKey,
    pub(crate) variants: Vec<Variant>,
}

/// Every kept request, and what was left out and why.
#[derive(Debug, Default)]
pub(crate) struct Collected {
    pub(crate) cases: Vec<Case>,
    /// (case, the variant's exact request bytes) -> variant index.
    index: HashMap<(usize, Vec<u8>), usize>,
    case_index: HashMap<CaseKey, usize>,
    /// Rows read, every one.
    pub(crate) rows: u64,
    /// Rows frozen (the first answers and their repeats).
    pub(crate) kept: u64,
    /// Rows left out, by reason.
    pub(crate) skipped: BTreeMap<String, u64>,
    /// Some kept request carried an `Authorization` header.
    pub(crate) bearer: bool,
    /// Secret headers other than `Authorization` that kept requests carried (a plan
    /// cannot hold them), with how many requests did.
    pub(crate) secret_headers: BTreeMap<String, u64>,
    /// Headers dropped because their value is not printable ASCII (a plan's rule).
    pub(crate) unprintable_headers: BTreeSet<String>,
    /// Pointers whose subtrees are content besides `/choices` (the decisions container).
    pub(crate) content: Vec<String>,
}

/// What the replayed plan said of a request: its `prompt_tokens` and variant name.
struct Planned {
    prompt_tokens: Option<i64>,
    source_name: Option<String>,
    session: Option<(String, String)>,
    /// Its answer called a tool (`Variant::called_tools`).
    called_tools: bool,
}

/// Why a recorded row is left out of a freeze (counted by this text).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum LeftOut {
    #[error("status {0} (only 2xx answers are frozen)")]
    Status(i32),
    #[error("no response (outcome {outcome})")]
    NoResponse { outcome: String },
    #[error(
        "answered, but failed the source plan's oracle (outcome correctness): freeze the answers you trust, e.g. a capture plan's run"
    )]
    FailedOracle,
    #[error("did not complete (outcome {outcome})")]
    NotCompleted { outcome: String },
    #[error("request body truncated by --max-record-body")]
    RequestTruncated,
    #[error("response body truncated by --max-record-body")]
    ResponseTruncated,
    #[error("a secret query value in the URL (recorded as <redacted>; a plan never holds one)")]
    SecretInUrl,
    #[error("content-encoded response ({0}): the recorded bytes are not the answer")]
    EncodedResponse(String),
    #[error("content-encoded request body ({0})")]
    EncodedRequest(String),
    #[error("a {0} request with a body (a plan's {0} case sends none)")]
    BodyWithoutCase(String),
    #[error("request body is not UTF-8 text (a plan holds JSON or text)")]
    RequestNotText,
    #[error("response is not a readable event stream ({0})")]
    NotEventStream(#[source] crate::sse::LineTooLong),
    #[error("response body is not UTF-8 text (a plan's oracle holds JSON or text)")]
    ResponseNotText,
}

/// A row a freeze would keep whose URL cannot be read: the run's files were damaged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "url {url:?} is not an absolute http(s) URL, so the request's path cannot be read from it (a plan's case is its path); no recorder writes it, so the file was damaged or edited: restore the run's files from a copy"
)]
pub(crate) struct UnreadableUrl {
    pub(crate) url: String,
}

impl Collected {
    pub(crate) fn new(content: Vec<String>) -> Collected {
        Collected {
            content,
            ..Collected::default()
        }
    }

    fn skip(&mut self, reason: LeftOut) {
        *self.skipped.entry(reason.to_string()).or_insert(0) += 1;
    }

    /// Keep `row` (as a new request or as a repeat of one) or count why not; the case
    /// and variant it is kept as. `Err`: the row would be frozen but its URL cannot be
    /// read (every such row would become one path), so the freeze is refused, with the
    /// reason.
    pub(crate) fn take(
        &mut self,
        row: ExchangeRow,
    ) -> Result<Option<(usize, usize)>, UnreadableUrl> {
        self.rows += 1;
        let status = match completed(&row) {
            Ok(s) => s,
            Err(reason) => {
                self.skip(reason);
                return Ok(None);
            }
        };
        let path = origin_form(&row.url).ok_or_else(|| UnreadableUrl {
            url: row.url.clone(),
        })?;
        match self.key_and_answer(&row, status, path) {
            Ok((key, body, answer)) => {
                self.kept += 1;
                let session = SESSION_HEADERS.iter().find_map(|name| {
                    let v = header(&row.request_headers, name)?;
                    Some((name.to_string(), v))
                });
                let called_tools =
                    crate::oracle::answer::calls_tools(&row.response_body, row.is_stream);
                let source = Planned {
                    prompt_tokens: row.prompt_tokens_planned,
                    source_name: row.variant,
                    session,
                    called_tools,
                };
                Ok(Some(self.add(key, body, answer, source)))
            }
            Err(reason) => {
                self.skip(reason);
                Ok(None)
            }
        }
    }

    fn key_and_answer(
        &mut self,
        row: &ExchangeRow,
        status: u16,
        path: String,
    ) -> Result<(CaseKey, Body, Answer), LeftOut> {
        if let Some(enc) = header(&row.response_headers, "content-encoding")
            .filter(|e| !e.eq_ignore_ascii_case("identity"))
        {
            return Err(LeftOut::EncodedResponse(enc));
        }
        if let Some(enc) = header(&row.request_headers, "content-encoding")
            .filter(|e| !e.eq_ignore_ascii_case("identity"))
        {
            return Err(LeftOut::EncodedRequest(enc));
        }
        let content_type = header(&row.request_headers, "content-type");
        let body = body_of(&row.method, &row.request_body, content_type.as_deref())?;
        let answer = answer_of(row)?;
        let headers = self.kept_headers(&row.request_headers);
        let content_type = match (&body, content_type) {
            (Body::Empty, _) if matches!(row.method.as_str(), "GET" | "HEAD") => None,
            (Body::Json(_), Some(ct)) if ct == "application/json" => None,
            (_, ct) => ct,
        };
        Ok((
            CaseKey {
                method: row.method.clone(),
                path,
                content_type,
                headers,
                status,
            },
            body,
            answer,
        ))
    }

    /// The request headers a frozen case sends: secrets noted (never kept), the engine's
    /// and the client's own dropped.
    fn kept_headers(&mut self, headers: &[(String, Vec<u8>)]) -> Vec<(String, String)> {
        let mut kept: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut secrets = BTreeSet::new();
        for (name, value) in headers {
            let name = name.to_ascii_lowercase();
            if name == "authorization" {
                self.bearer = true;
                continue;
            }
            // A header the run redacted (a default secret, or one named with
            // --redact-header) never reaches a plan, not even as `<redacted>`.
            if DEFAULT_REDACT_HEADERS.contains(&name.as_str()) || value == REDACTED {
                secrets.insert(name);
                continue;
            }
            if ENGINE_HEADERS.contains(&name.as_str())
                || DROPPED_HEADERS.contains(&name.as_str())
                || SESSION_HEADERS.contains(&name.as_str())
                || DROPPED_HEADER_PREFIXES.iter().any(|p| name.starts_with(p))
            {
                continue;
            }
            match std::str::from_utf8(value) {
                Ok(v) if v.bytes().all(|b| (0x20..0x7f).contains(&b)) => {
                    kept.entry(name).or_default().push(v.to_string());
                }
                _ => {
                    self.unprintable_headers.insert(name);
                }
            }
        }
        for s in secrets {
            *self.secret_headers.entry(s).or_insert(0) += 1;
        }
        kept.into_iter().map(|(k, v)| (k, v.join(", "))).collect()
    }

    /// Add a kept request: a new variant of its case, or a repeat of one (its case and
    /// variant). `source`: what the replayed plan said of it.
    fn add(&mut self, key: CaseKey, body: Body, answer: Answer, source: Planned) -> (usize, usize) {
        let Planned {
            prompt_tokens,
            source_name,
            session,
            called_tools,
        } = source;
        let case = match self.case_index.get(&key) {
            Some(&c) => c,
            None => {
                self.cases.push(Case {
                    key: key.clone(),
                    variants: Vec::new(),
                });
                self.case_index.insert(key, self.cases.len() - 1);
                self.cases.len() - 1
            }
        };
        let identity = match &body {
            Body::Empty => Vec::new(),
            Body::Json(v) => serde_json::to_vec(v).unwrap_or_default(),
            Body::Text(t) => t.as_bytes().to_vec(),
        };
        let variants = &mut self.cases[case].variants;
        match self.index.get(&(case, identity.clone())) {
            None => {
                variants.push(Variant {
                    body,
                    first: answer,
                    answers: 1,
                    volatile: BTreeSet::new(),
                    differed: 0,
                    first_difference: None,
                    prompt_tokens,
                    source_name,
                    session,
                    called_tools,
                    contract: None,
                });
                self.index.insert((case, identity), variants.len() - 1);
                (case, variants.len() - 1)
            }
            Some(&v) => {
                let var = &mut variants[v];
                var.answers += 1;
                let d = difference(&var.first, &answer, &self.content);
                var.volatile.extend(d.volatile);
                if let Some(at) = d.content {
                    var.differed += 1;
                    var.first_difference.get_or_insert(at);
                }
                (case, v)
            }
        }
    }
}

/// The status of a row a freeze may keep (answered 2xx, completed, recorded whole, no
/// secret in its URL), or why it is left out.
fn completed(row: &ExchangeRow) -> Result<u16, LeftOut> {
    let status = match row.status {
        Some(s @ 200..=299) => s as u16,
        Some(s) => return Err(LeftOut::Status(s)),
        None => {
            return Err(LeftOut::NoResponse {
                outcome: row.outcome.clone(),
            });
        }
    };
    if row.outcome == Outcome::Correctness.as_str() {
        return Err(LeftOut::FailedOracle);
    }
    if row.outcome != Outcome::Ok.as_str() {
        return Err(LeftOut::NotCompleted {
            outcome: row.outcome.clone(),
        });
    }
    if row.request_body_truncated {
        return Err(LeftOut::RequestTruncated);
    }
    if row.response_body_truncated {
        return Err(LeftOut::ResponseTruncated);
    }
    if row.url.contains(REDACTED_TEXT) {
        return Err(LeftOut::SecretInUrl);
    }
    Ok(status)
}

/// How a repeated answer differs from the first.
fn difference(first: &Answer, again: &Answer, content: &[String]) -> Difference {
    let content_at = |at: &str| Difference {
        content: Some(at.into()),
        ..Difference::default()
    };
    match (first, again) {
        (Answer::Json(a), Answer::Json(b)) => evidence::json_difference(a, b, content),
        (Answer::StreamText(a), Answer::StreamText(b)) if a != b => content_at("/text"),
        (Answer::Events(a), Answer::Events(b)) if a.len() != b.len() => content_at("/events"),
        // Each event's payload as a JSON answer of its own (an ignore path of a streaming
        // oracle applies to every event where it resolves).
        (Answer::Events(a), Answer::Events(b)) => {
            let mut d = Difference::default();
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                let e = evidence::json_difference(x, y, content);
                d.volatile.extend(e.volatile);
                if d.content.is_none()
                    && let Some(at) = e.content
                {
                    d.content = Some(format!("/events/{i}{}", at.trim_end_matches('/')));
                }
            }
            d
        }
        (Answer::Text(a), Answer::Text(b)) if a != b => content_at("the response bytes"),
        (Answer::StreamText(_), Answer::StreamText(_)) | (Answer::Text(_), Answer::Text(_)) => {
            Difference::default()
        }
        _ => content_at("the kind of answer (JSON, event stream or text)"),
    }
}

/// The first value of header `name` (lower case), as text.
fn header(headers: &[(String, Vec<u8>)], name: &str) -> Option<String> {
    headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| String::from_utf8_lossy(v).trim().to_string())
}

/// The origin-form target (`/v1/chat/completions?x=1`) of an absolute http(s) URL;
/// `None` when it is not one (no scheme, another scheme, or an authority that does not
/// parse, such as `http://[::1`), so no unreadable URL is taken for `/`.
pub(crate) fn origin_form(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    if !["http", "https"]
        .iter()
        .any(|s| scheme.eq_ignore_ascii_case(s))
    {
        return None;
    }
    let at = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, target) = rest.split_at(at);
    if authority.is_empty() || authority.parse::<http::uri::Authority>().is_err() {
        return None;
    }
    Some(match target.as_bytes().first() {
        None => "/".into(),
        Some(b'?') => format!("/{target}"),
        Some(_) => target.to_string(),
    })
}

/// What the request sent, as a plan holds it.
fn body_of(method: &str, body: &[u8], content_type: Option<&str>) -> Result<Body, LeftOut> {
    if body.is_empty() {
        return Ok(Body::Empty);
    }
    if matches!(method, "GET" | "HEAD") {
        return Err(LeftOut::BodyWithoutCase(method.to_string()));
    }
    let json_type = content_type.is_some_and(is_json_type);
    if json_type && let Ok(v) = serde_json::from_slice::<Value>(body) {
        return Ok(Body::Json(v));
    }
    match std::str::from_utf8(body) {
        Ok(t) => Ok(Body::Text(t.to_string())),
        Err(_) => Err(LeftOut::RequestNotText),
    }
}

fn is_json_type(ct: &str) -> bool {
    let essence = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence == "application/json" || essence.ends_with("+json")
}

/// The oracle the recorded answer becomes.
fn answer_of(row: &ExchangeRow) -> Result<Answer, LeftOut> {
    let body = &row.response_body;
    if row.is_stream {
        let events = crate::sse::parse_all(body).map_err(LeftOut::NotEventStream)?;
        let mut t = crate::sse::StreamTracker::default();
        for e in &events {
            t.on_event(e);
        }
        if t.openai {
            return Ok(Answer::StreamText(t.text));
        }
        if !events.is_empty() {
            let data = events
                .into_iter()
                .map(|e| match serde_json::from_str(&e.data) {
                    Ok(v @ (Value::Object(_) | Value::Array(_))) => v,
                    _ => Value::String(e.data),
                });
            return Ok(Answer::Events(data.collect()));
        }
        // No event at all: only its bytes say what it was.
    }
    let asks_stream = serde_json::from_slice::<Value>(&row.request_body)
        .ok()
        .and_then(|r| r.pointer("/stream").and_then(Value::as_bool))
        == Some(true);
    let json_type = header(&row.response_headers, "content-type").is_some_and(|c| is_json_type(&c));
    // A request asking for a stream cannot take a JSON oracle (validation says so).
    if json_type
        && !asks_stream
        && let Ok(v) = serde_json::from_slice::<Value>(body)
    {
        return Ok(Answer::Json(v));
    }
    match std::str::from_utf8(body) {
        Ok(t) => Ok(Answer::Text(t.to_string())),
        Err(_) => Err(LeftOut::ResponseNotText),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn row(body: &str, answer: &str) -> ExchangeRow {
        ExchangeRow {
            exchange_id: 0,
            start_offset_us: 0,
            phase: "live".into(),
            arm: None,
            outcome: "ok".into(),
            method: "POST".into(),
            url: "http://127.0.0.1:8000/v1/chat/completions".into(),
            request_headers: vec![
                ("host".into(), b"127.0.0.1:9000".to_vec()),
                ("content-type".into(), b"application/json".to_vec()),
                ("authorization".into(), REDACTED.to_vec()),
                ("x-api-key".into(), REDACTED.to_vec()),
                ("x-stainless-retry-count".into(), b"0".to_vec()),
                ("x-tenant".into(), b"blue".to_vec()),
            ],
            request_body: body.as_bytes().to_vec(),
            request_body_truncated: false,
            status: Some(200),
            response_headers: vec![("content-type".into(), b"application/json".to_vec())],
            response_body: answer.as_bytes().to_vec(),
            response_body_truncated: false,
            is_stream: false,
            prompt_tokens_planned: None,
            variant: None,
        }
    }

    #[test]
    fn requests_group_into_cases_and_variants_and_repeats_are_evidence() {
        let mut c = Collected::new(vec!["/answers".into()]);
        let a = |id: u32, text: &str| {
            json!({"id": format!("c{id}"), "choices": [{"message": {"content": text}}]}).to_string()
        };
        // Each kept row says the case and variant it is kept as (a trace's entries).
        assert_eq!(c.take(row(r#"{"p": 1}"#, &a(1, "x"))), Ok(Some((0, 0))));
        // The same JSON written with other spacing is the same request.
        assert_eq!(c.take(row(r#"{ "p" : 1 }"#, &a(2, "x"))), Ok(Some((0, 0))));
        assert_eq!(c.take(row(r#"{"p": 2}"#, &a(3, "y"))), Ok(Some((0, 1))));
        assert_eq!(c.take(row(r#"{"p": 2}"#, &a(4, "z"))), Ok(Some((0, 1))));
        let mut failed = row(r#"{"p": 3}"#, "{}");
        failed.status = Some(500);
        assert_eq!(c.take(failed), Ok(None));
        let mut cut = row(r#"{"p": 3}"#, "{}");
        cut.response_body_truncated = true;
        c.take(cut).unwrap();
        let mut secret = row(r#"{"p": 3}"#, "{}");
        secret.url.push_str("?api_key=<redacted>");
        c.take(secret).unwrap();
        assert_eq!((c.rows, c.kept), (7, 4));
        assert_eq!(c.cases.len(), 1);
        // A URL whose path cannot be read refuses the freeze (every such row would have
        // become the path `/`), unless the row is left out anyway.
        let mut other = Collected::new(Vec::new());
        let mut broken = row("{}", "{}");
        broken.url = "http://[::1".into();
        let mut broken_failed = broken.clone();
        broken_failed.status = Some(502);
        assert_eq!(other.take(broken_failed), Ok(None));
        let err = other.take(broken).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("url \"http://[::1\" is not an absolute http(s) URL"),
            "{err}"
        );
        assert_eq!((other.rows, other.kept, other.cases.len()), (2, 0, 0));
        let case = &c.cases[0];
        assert_eq!(case.key.path, "/v1/chat/completions");
        assert_eq!(case.key.content_type, None);
        assert_eq!(
            case.key.headers,
            [("x-tenant".to_string(), "blue".to_string())]
        );
        assert!(c.bearer);
        assert_eq!(c.secret_headers.get("x-api-key"), Some(&4));
        let [one, two] = &case.variants[..] else {
            panic!("{:?}", case.variants)
        };
        assert_eq!((one.answers, one.differed), (2, 0));
        assert_eq!(one.volatile.iter().collect::<Vec<_>>(), ["/id"]);
        assert_eq!((two.answers, two.differed), (2, 1));
        assert_eq!(
            two.first_difference.as_deref(),
            Some("/choices/0/message/content")
        );
        assert_eq!(c.skipped.len(), 3, "{:?}", c.skipped);
        assert!(
            c.skipped
                .contains_key("status 500 (only 2xx answers are frozen)")
        );
    }

    #[test]
    fn answers_become_the_oracle_their_kind_takes() {
        let mut r = row(r#"{"stream": true}"#, "");
        r.is_stream = true;
        r.response_body =
            b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n\ndata: [DONE]\n\n".to_vec();
        assert_eq!(answer_of(&r), Ok(Answer::StreamText("ab".into())));
        r.response_body = b"data: one\n\ndata: {\"id\": 1}\n\n".to_vec();
        assert_eq!(
            answer_of(&r),
            Ok(Answer::Events(vec![json!("one"), json!({"id": 1})]))
        );
        let mut t = row("hello", "plain answer");
        t.response_headers = vec![("content-type".into(), b"text/plain".to_vec())];
        t.request_headers = vec![("content-type".into(), b"text/plain".to_vec())];
        assert_eq!(answer_of(&t), Ok(Answer::Text("plain answer".into())));
        assert_eq!(
            body_of("POST", b"hello", Some("text/plain")),
            Ok(Body::Text("hello".into()))
        );
        assert_eq!(
            body_of(
                "POST",
                br#"{"a":1}"#,
                Some("application/vnd.x+json; charset=utf-8")
            ),
            Ok(Body::Json(json!({"a": 1})))
        );
        assert_eq!(
            body_of("POST", &[0xff, 0xfe], None),
            Err(LeftOut::RequestNotText)
        );
        assert_eq!(body_of("GET", b"", None), Ok(Body::Empty));
        assert_eq!(
            origin_form("http://h:1/a/b?x=1").as_deref(),
            Some("/a/b?x=1")
        );
        assert_eq!(origin_form("http://h:1?x=1").as_deref(), Some("/?x=1"));
        assert_eq!(origin_form("http://h:1").as_deref(), Some("/"));
        assert_eq!(origin_form("https://[::1]:8/v1").as_deref(), Some("/v1"));
        for unreadable in [
            "http://[::1",
            "http://[::1/v1",
            "",
            "/v1/x",
            "ftp://h/x",
            "http:///x",
            "http://h:1:2/x",
        ] {
            assert_eq!(origin_form(unreadable), None, "{unreadable}");
        }
    }
}
