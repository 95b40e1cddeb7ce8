//! Frozen plans: the raw JSON shape, its complete validation, and the resolved [`Plan`].
//!
//! Input is read in two stages. The file is parsed into a `serde_json::Value` and walked by
//! [`Plan::from_json_bytes`], which checks every rule of schema v1 and collects *all*
//! problems, each with the JSON path it concerns (`cases[1].variants[0].request`) and the
//! rule it broke. Only a plan with no problem becomes a [`Plan`], a type that cannot
//! represent an invalid plan: everything after validation takes it and never re-checks.
//! This module never opens a socket and never writes a file.

use std::collections::HashSet;
use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method};
use serde_json::{Map, Value};

use super::campaign::Campaign;
use super::load::{Load, Mode};
use super::shape::Shape;
use crate::model::{ConnectionPolicy, Endpoint, Level, Slo};
use crate::oracle::{EventExpect, Oracle, Pointer, StreamOracle, json_kind};

/// The provenance keys every plan must carry with a non-blank string value.
pub(crate) const REQUIRED_METADATA: [&str; 11] = [
    "gpu",
    "gpu_ids",
    "driver",
    "cuda",
    "precision",
    "model_revision",
    "runtime_revision",
    "cache_policy",
    "cuda_evidence",
    "reservation",
    "host",
];

const TOP_FIELDS: &[&str] = &[
    "endpoint",
    "health_endpoint",
    "cases",
    "concurrency",
    "requests_per_case",
    "repetitions",
    "warmup_per_case",
    "timeout_seconds",
    "metadata",
    "connection",
    "on_failure",
    "auth",
    "name",
    "description",
    "ignore_paths",
    "decisions_pointer",
    "arms",
    "evidence_class",
    "schedule",
    "drift",
    "load",
    "slo",
];
/// The fields of one request and its oracle: a variant's, or a case's without variants.
const REQUEST_FIELDS: &[&str] = &[
    "request",
    "request_text",
    "content_type",
    "expected_response",
    "expected_response_text",
    "expected_stream_text",
    "expected_events",
    "expected_usage",
    "require_done",
];
/// What both a case and a variant have besides their request.
const NAMED_FIELDS: &[&str] = &["name", "ignore_paths"];
/// What only a case has.
const CASE_FIELDS: &[&str] = &["variants", "method", "path", "headers", "expected_status"];

/// The fields that hold a request's oracle (exactly one per request).
const ORACLE_FIELDS: &[&str] = &[
    "expected_response",
    "expected_response_text",
    "expected_stream_text",
    "expected_events",
];

/// Header names a plan may not set: framing and hop-by-hop headers belong to the engine.
const ENGINE_HEADERS: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "upgrade",
    "content-type",
];

/// One validation problem: where in the plan, and what rule it breaks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Problem {
    pub(crate) path: String,
    pub(crate) message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            write!(f, "{}", self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

/// Every problem found in a plan, in document order.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) struct PlanError {
    pub(crate) problems: Vec<Problem>,
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.problems.len();
        write!(f, "{n} problem{}", if n == 1 { "" } else { "s" })?;
        for p in &self.problems {
            write!(f, "\n  - {p}")?;
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnFailure {
    /// The first failure stops new dispatch; admitted requests drain; later phases are skipped.
    Stop,
    /// Failures are recorded and the whole budget runs.
    Continue,
}

impl OnFailure {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            OnFailure::Stop => "stop",
            OnFailure::Continue => "continue",
        }
    }
}

/// One request shape of a case with its oracle.
#[derive(Debug, Clone)]
pub(crate) struct Variant {
    /// `None` for a case without a `variants` list.
    pub(crate) name: Option<String>,
    pub(crate) body: Bytes,
    pub(crate) content_type: Option<HeaderValue>,
    pub(crate) oracle: Oracle,
    /// Every ignore path this request inherits and has (top level, case, variant): drift
    /// removes them before comparing answers as canonical JSON.
    pub(crate) ignore_paths: Vec<Pointer>,
}

#[derive(Debug, Clone)]
pub(crate) struct Case {
    pub(crate) name: String,
    pub(crate) method: Method,
    /// The endpoint this case's requests go to (the plan endpoint, or its origin with the
    /// case's `path`).
    pub(crate) endpoint: Endpoint,
    /// The case's own `path`, if it set one (kept so an endpoint override can re-apply it).
    pub(crate) path: Option<String>,
    pub(crate) headers: Vec<(HeaderName, HeaderValue)>,
    pub(crate) expected_status: u16,
    pub(crate) variants: Vec<Variant>,
}

/// A plan that passed validation. Constructed only by [`Plan::from_json_bytes`].
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub(crate) endpoint: Endpoint,
    pub(crate) health_endpoint: Endpoint,
    pub(crate) cases: Vec<Case>,
    pub(crate) concurrency: Vec<usize>,
    pub(crate) requests_per_case: usize,
    pub(crate) repetitions: usize,
    pub(crate) warmup_per_case: usize,
    pub(crate) timeout_seconds: f64,
    pub(crate) timeout: Duration,
    /// Provenance (presence checked, truth not); kept with the plan for the reports.
    #[allow(dead_code)]
    pub(crate) metadata: Map<String, Value>,
    pub(crate) connection: ConnectionPolicy,
    pub(crate) on_failure: OnFailure,
    pub(crate) bearer_token_env: Option<String>,
    /// Where an answer's decisions are (`decisions_pointer`, default `/answers`).
    pub(crate) decisions_pointer: Pointer,
    /// Arms, lanes and the reference, for a campaign plan. Then `endpoint` and
    /// `health_endpoint` are the reference arm's with a stand-in port (`{port}` = 1):
    /// an arm's run replaces them with its own.
    pub(crate) campaign: Option<Campaign>,
    /// The plan's `name` (a contract's `plan_id` names it).
    pub(crate) name: Option<String>,
    /// `drift.numeric_pointers`: numbers whose largest difference drift reports.
    pub(crate) drift_numeric_pointers: Vec<Pointer>,
    /// The canonical workload (see [`super::workload`]).
    pub(crate) workload: Value,
    /// Closed loop (default) or open loop, with the open loop's arrival process.
    pub(crate) load: Load,
    /// Per-request bounds goodput counts against.
    pub(crate) slo: Option<Slo>,
}

/// The most requests a round may plan: its samples are kept in memory for exact nearest
/// rank (about 100 bytes each, plus 8 per streamed token), so 10 million is about 1 GB.
/// The same bound as an open round's arrivals.
pub(crate) const MAX_REQUESTS_PER_CASE: usize = crate::arrival::MAX_ARRIVALS;

/// The seed tool's decisions container.
pub(crate) const DEFAULT_DECISIONS_POINTER: &str = "/answers";

/// The ignore paths a request inherits: the plan's top-level list and its case's, with
/// the case's name for messages.
#[derive(Clone, Copy)]
struct Inherited<'a> {
    top: &'a [Pointer],
    case: &'a [Pointer],
    case_name: &'a str,
}

impl Plan {
    /// Parse and validate a plan. `Err` carries every problem found.
    pub(crate) fn from_json_bytes(bytes: &[u8]) -> Result<Plan, PlanError> {
        let value = read_document(bytes, "plan")?;
        let mut v = Validator::default();
        let plan = v.plan(&value);
        v.finish(plan)
    }

    /// This plan sent to `url` (`--endpoint`): its origin and path replace the
    /// endpoint's; the health endpoint keeps its path on the new origin, and cases with
    /// their own `path` keep it. The plan is otherwise the one validated.
    pub(crate) fn with_endpoint(mut self, url: &Endpoint) -> Plan {
        self.endpoint = url.clone();
        self.health_endpoint = self.health_endpoint.on_origin_of(url);
        for case in &mut self.cases {
            case.endpoint = match &case.path {
                Some(p) => url.with_path(p),
                None => url.clone(),
            };
        }
        self
    }

    /// This plan with only the origin (scheme, host, port) of every endpoint replaced
    /// (`--mock-worker`).
    pub(crate) fn with_origin(mut self, origin: &Endpoint) -> Plan {
        self.endpoint = self.endpoint.on_origin_of(origin);
        self.health_endpoint = self.health_endpoint.on_origin_of(origin);
        for case in &mut self.cases {
            case.endpoint = case.endpoint.on_origin_of(origin);
        }
        self
    }

    /// This plan as one arm runs it: every endpoint on the arm's (cases with their own
    /// `path` keep it on the arm's origin), and the arm's health endpoint.
    pub(crate) fn for_arm(&self, endpoint: &Endpoint, health: &Endpoint) -> Plan {
        let mut p = self.clone().with_endpoint(endpoint);
        p.health_endpoint = health.clone();
        p
    }

    /// The arms' names in plan order; one unnamed arm (`None`) for a plain plan.
    pub(crate) fn arm_names(&self) -> Vec<Option<&str>> {
        match &self.campaign {
            None => vec![None],
            Some(c) => c.arms.iter().map(|a| Some(a.name.as_str())).collect(),
        }
    }

    /// The measured levels in plan order: each concurrency of a closed loop, each rate of
    /// an open one.
    pub(crate) fn levels(&self) -> Vec<Level> {
        match self.load.mode {
            Mode::Closed => self
                .concurrency
                .iter()
                .map(|&c| Level::Concurrency(c))
                .collect(),
            Mode::Open => self
                .load
                .rates_per_second
                .iter()
                .map(|&r| Level::Rate(r))
                .collect(),
        }
    }

    /// The health GET, readiness and warm-up, as every process of the run (every shard of
    /// a merged run) sent them first.
    pub(crate) fn prelude_requests(&self, shape: Shape) -> u64 {
        let once = 1 + self
            .cases
            .iter()
            .map(|c| c.variants.len() as u64 * (1 + self.warmup_per_case as u64))
            .sum::<u64>();
        once * shape.preludes()
    }

    /// Requests the plan implies as written, health GET included.
    pub(crate) fn planned_requests(&self) -> u64 {
        self.planned_requests_as(Shape::Plain)
    }

    /// Requests the plan implies as `shape` runs it, health GET included. An open loop's
    /// rounds are counted from their seeded schedules (a shard's: its share of them).
    pub(crate) fn planned_requests_as(&self, shape: Shape) -> u64 {
        let n = self.requests_per_case as u64;
        if let Some(rates) = shape.sweep_rates() {
            // Before the run the sweep's rates are unknown: at most n a feasibility wave.
            let max_c = self.concurrency.iter().copied().max().unwrap_or(1) as u64;
            let per_case =
                1 + n + max_c.min(n) + n + rates as u64 * (n + self.repetitions as u64 * n);
            return self.prelude_requests(shape) + self.cases.len() as u64 * per_case;
        }
        let mut total = self.prelude_requests(shape);
        for ci in 0..self.cases.len() {
            for (li, level) in self.levels().into_iter().enumerate() {
                total += match level {
                    Level::Concurrency(c) => {
                        (c.min(self.requests_per_case)) as u64 + self.repetitions as u64 * n
                    }
                    Level::Rate(r) => (0..self.repetitions)
                        .map(Some)
                        .chain([None])
                        .map(|rep| {
                            super::load::shard_share(
                                self.load.schedule(r, ci, li, rep).len(),
                                shape.shard_of(),
                            )
                        })
                        .sum(),
                };
            }
        }
        total
    }
}

/// Read a JSON document (a plan, a contract): UTF-8 without a byte-order mark, valid
/// JSON, no key repeated within an object. `what` names it in messages.
pub(super) fn read_document(bytes: &[u8], what: &str) -> Result<Value, PlanError> {
    let one = |message: String| PlanError {
        problems: vec![Problem {
            path: String::new(),
            message,
        }],
    };
    if bytes.starts_with(b"\xEF\xBB\xBF") {
        return Err(one(format!(
            "{what} starts with a UTF-8 byte-order mark (BOM), which JSON does not allow (RFC 8259); save it as UTF-8 without a BOM"
        )));
    }
    let text = std::str::from_utf8(bytes).map_err(|e| {
        one(format!(
            "{what} is not valid UTF-8 (byte {})",
            e.valid_up_to()
        ))
    })?;
    let (value, duplicates) =
        parse_json(text).map_err(|e| one(format!("{what} is not valid JSON: {e}")))?;
    if !duplicates.is_empty() {
        return Err(PlanError {
            problems: duplicates,
        });
    }
    Ok(value)
}

/// Parse JSON into a `Value` as `serde_json::from_str` does (its depth limit and correctly
/// rounded floats included), noting every key an object repeats: a JSON reader keeps one
/// of them silently, and which one is not something a frozen plan may leave to chance.
fn parse_json(text: &str) -> Result<(Value, Vec<Problem>), serde_json::Error> {
    use serde::de::DeserializeSeed;
    let state = DupState::default();
    let mut de = serde_json::Deserializer::from_str(text);
    let value = DupCheck(&state).deserialize(&mut de)?;
    de.end()?;
    Ok((value, state.found.into_inner()))
}

/// The path being read, as a stack of segments (formatted only when a duplicate is found,
/// so reading stays linear however long the keys), and the duplicates found.
#[derive(Default)]
struct DupState {
    path: std::cell::RefCell<Vec<Segment>>,
    found: std::cell::RefCell<Vec<Problem>>,
}

enum Segment {
    Key(String),
    Index(usize),
}

impl DupState {
    fn path(&self) -> String {
        let mut out = String::new();
        for seg in self.path.borrow().iter() {
            match seg {
                Segment::Key(k) => out = join(&out, k),
                Segment::Index(i) => out.push_str(&format!("[{i}]")),
            }
        }
        out
    }
}

/// A value being read; duplicate keys go to the state.
struct DupCheck<'a>(&'a DupState);

impl<'de> serde::de::DeserializeSeed<'de> for DupCheck<'_> {
    type Value = Value;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for DupCheck<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, b: bool) -> Result<Value, E> {
        Ok(Value::Bool(b))
    }
    fn visit_i64<E>(self, n: i64) -> Result<Value, E> {
        Ok(Value::Number(n.into()))
    }
    fn visit_u64<E>(self, n: u64) -> Result<Value, E> {
        Ok(Value::Number(n.into()))
    }
    fn visit_f64<E: serde::de::Error>(self, n: f64) -> Result<Value, E> {
        serde_json::Number::from_f64(n)
            .map(Value::Number)
            .ok_or_else(|| E::custom(format!("{n} is not a finite number")))
    }
    fn visit_str<E>(self, s: &str) -> Result<Value, E> {
        Ok(Value::String(s.to_string()))
    }
    fn visit_string<E>(self, s: String) -> Result<Value, E> {
        Ok(Value::String(s))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let st = self.0;
        let mut out = Vec::new();
        loop {
            st.path.borrow_mut().push(Segment::Index(out.len()));
            let next = seq.next_element_seed(DupCheck(st));
            st.path.borrow_mut().pop();
            match next? {
                Some(v) => out.push(v),
                None => return Ok(Value::Array(out)),
            }
        }
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let st = self.0;
        let mut out = Map::new();
        let mut first_at: std::collections::HashMap<String, usize> = Default::default();
        let mut member = 0;
        while let Some(key) = map.next_key::<String>()? {
            member += 1;
            st.path.borrow_mut().push(Segment::Key(key.clone()));
            let value = map.next_value_seed(DupCheck(st));
            if let (Ok(_), Some(first)) = (&value, first_at.get(&key)) {
                let path = st.path();
                st.found.borrow_mut().push(Problem {
                    path,
                    message: format!(
                        "is given twice in the same object (members {first} and {member}); a JSON reader keeps one of them silently, so a frozen plan may not repeat a key"
                    ),
                });
            }
            st.path.borrow_mut().pop();
            first_at.entry(key.clone()).or_insert(member);
            out.insert(key, value?);
        }
        Ok(Value::Object(out))
    }
}

/// The largest integer any plan field takes.
const MAX_INTEGER: u64 = 1 << 40;

/// A number as a message shows it: at most 24 characters (`1e30` stays `1e30`).
fn short_number(n: &serde_json::Number) -> String {
    let s = n.to_string();
    if s.len() <= 24 {
        s
    } else {
        format!("{}... ({} digits)", &s[..12], s.len())
    }
}

#[derive(Default)]
pub(super) struct Validator {
    problems: Vec<Problem>,
    /// A campaign plan: a request may have no oracle (the reference's answers are the
    /// baseline; status and transport are still judged).
    oracle_optional: bool,
}

pub(super) fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

impl Validator {
    /// `value` when no problem was found, else every problem.
    pub(super) fn finish<T>(self, value: Option<T>) -> Result<T, PlanError> {
        match value {
            Some(v) if self.problems.is_empty() => Ok(v),
            _ => Err(PlanError {
                problems: self.problems,
            }),
        }
    }

    pub(super) fn err(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.problems.push(Problem {
            path: path.into(),
            message: message.into(),
        });
    }

    /// Every key of `obj` must be in one of the `known` lists.
    pub(super) fn unknown_fields(
        &mut self,
        obj: &Map<String, Value>,
        path: &str,
        known: &[&[&str]],
    ) {
        for key in obj.keys() {
            if !known.iter().any(|k| k.contains(&key.as_str())) {
                self.err(
                    join(path, key),
                    format!(
                        "unknown field; the fields allowed here are: {}",
                        known.concat().join(", ")
                    ),
                );
            }
        }
    }

    pub(super) fn object<'a>(
        &mut self,
        v: &'a Value,
        path: &str,
    ) -> Option<&'a Map<String, Value>> {
        match v {
            Value::Object(m) => Some(m),
            other => {
                self.err(
                    path,
                    format!("must be an object, found {}", json_kind(other)),
                );
                None
            }
        }
    }

    pub(super) fn string<'a>(&mut self, v: &'a Value, path: &str) -> Option<&'a str> {
        match v {
            Value::String(s) => Some(s),
            other => {
                self.err(
                    path,
                    format!("must be a string, found {}", json_kind(other)),
                );
                None
            }
        }
    }

    pub(super) fn nonblank<'a>(&mut self, v: &'a Value, path: &str) -> Option<&'a str> {
        let s = self.string(v, path)?;
        if s.trim().is_empty() {
            self.err(path, "must not be blank");
            return None;
        }
        Some(s)
    }

    /// An integer >= `min`, given as a JSON integer (not `2.0`, not `"2"`).
    pub(super) fn integer(&mut self, v: &Value, path: &str, min: u64) -> Option<usize> {
        let n = match v {
            Value::Number(n) if n.is_u64() => n.as_u64(),
            Value::Number(n) if n.is_i64() => {
                self.err(path, format!("must be an integer >= {min}, found {n}"));
                return None;
            }
            // A whole number written with a fraction or an exponent, or too large for 64
            // bits (`2.0`, `1e7`, `1e30`): say what is wrong with it, not "fractional".
            Value::Number(n) if n.as_f64().is_some_and(|f| f.fract() == 0.0) => {
                let f = n.as_f64().unwrap_or(0.0);
                let shown = short_number(n);
                let message = if f < min as f64 {
                    format!("must be an integer >= {min}, found {shown}")
                } else if f > MAX_INTEGER as f64 {
                    format!("must be an integer <= {MAX_INTEGER}, found {shown}")
                } else {
                    format!(
                        "must be written as a JSON integer ({}, not {shown})",
                        f as u64
                    )
                };
                self.err(path, message);
                return None;
            }
            other => {
                self.err(
                    path,
                    format!("must be an integer >= {min}, found {}", json_kind(other)),
                );
                return None;
            }
        }?;
        if n < min {
            self.err(path, format!("must be an integer >= {min}, found {n}"));
            return None;
        }
        match usize::try_from(n) {
            Ok(n) if n as u64 <= MAX_INTEGER => Some(n),
            _ => {
                self.err(
                    path,
                    format!("must be an integer <= {MAX_INTEGER}, found {n}"),
                );
                None
            }
        }
    }

    fn endpoint(&mut self, v: &Value, path: &str) -> Option<Endpoint> {
        let s = self.string(v, path)?;
        self.endpoint_str(s, s, path)
    }

    /// An endpoint URL as written: no secret query parameter (the plan is copied into
    /// every run directory), and `parse_as` (the same text, or with a stand-in for a
    /// placeholder such as an arm's `{port}`) a valid endpoint. Messages show `s`.
    pub(super) fn endpoint_str(&mut self, s: &str, parse_as: &str, path: &str) -> Option<Endpoint> {
        if crate::redact::Redaction::default().url(s) != s {
            self.err(
                path,
                format!(
                    "'{}' carries a secret query parameter ({}), and the plan is copied into every run directory; use auth.bearer_token_env, or give the URL with --endpoint (recorded redacted)",
                    crate::redact::Redaction::default().url(s),
                    crate::redact::DEFAULT_REDACT_QUERY.join(", ")
                ),
            );
            return None;
        }
        match Endpoint::parse(parse_as) {
            Ok(e) => Some(e),
            Err(m) => {
                self.err(path, format!("'{s}' {m}"));
                None
            }
        }
    }

    fn plan(&mut self, root: &Value) -> Option<Plan> {
        let top = self.object(root, "")?;
        self.unknown_fields(top, "", &[TOP_FIELDS]);
        let is_campaign = top.contains_key("arms");
        self.oracle_optional = is_campaign;
        if !is_campaign {
            for key in ["evidence_class", "schedule"] {
                if top.contains_key(key) {
                    self.err(key, "goes with arms: it describes a campaign plan");
                }
            }
        }
        let metadata = self.metadata(top.get("metadata"));
        let campaign = if is_campaign {
            self.campaign(top, metadata.as_ref()).map(Some)
        } else {
            Some(None)
        };
        let (endpoint, health_endpoint) = match &campaign {
            // A campaign plan: the reference arm's endpoints with a stand-in port; each
            // arm's run replaces them (Plan::for_arm).
            Some(Some(c)) => match c.reference().endpoints(1) {
                Ok((e, h)) => (Some(e), Some(h)),
                Err(_) => (None, None),
            },
            _ if is_campaign => (None, None),
            _ => self.endpoints(top),
        };

        let load = self.load(top.get("load"));
        let slo = self.slo(top.get("slo"));
        // As written, so an open load with a mistake elsewhere is still judged as open.
        let open = top
            .get("load")
            .and_then(|l| l.get("mode"))
            .and_then(Value::as_str)
            == Some("open");
        let (requests_per_case, concurrency) = if open {
            self.open_refusals(top, is_campaign);
            (Some(0), Some(Vec::new()))
        } else {
            let n = self.requests_per_case(top.get("requests_per_case"));
            (n, self.concurrency(top.get("concurrency"), n))
        };
        let repetitions = match top.get("repetitions") {
            None => Some(2),
            Some(v) => self.integer(v, "repetitions", 2),
        };
        let warmup_per_case = match top.get("warmup_per_case") {
            None => Some(2),
            Some(v) => self.integer(v, "warmup_per_case", 2),
        };
        let timeout = self.timeout(top.get("timeout_seconds"));
        let (connection, on_failure) = self.policies(top);
        let bearer_token_env = self.auth(top.get("auth"));
        let name = match top.get("name") {
            None => Some(None),
            Some(v) => self.nonblank(v, "name").map(|s| Some(s.to_string())),
        };
        if let Some(v) = top.get("description") {
            self.string(v, "description");
        }
        let drift_numeric_pointers = self.drift(top.get("drift"));
        let top_ignore = match top.get("ignore_paths") {
            None => Some(Vec::new()),
            Some(v) => self.pointers(v, "ignore_paths"),
        };
        let decisions_pointer = match top.get("decisions_pointer") {
            None => Pointer::parse(DEFAULT_DECISIONS_POINTER).ok(),
            Some(v) => self.string(v, "decisions_pointer").and_then(|s| {
                Pointer::parse(s)
                    .map_err(|m| self.err("decisions_pointer", format!("'{s}': {m}")))
                    .ok()
            }),
        };
        let cases = self.cases(
            top.get("cases"),
            endpoint.as_ref(),
            top_ignore.as_deref().unwrap_or(&[]),
        );

        Some(Plan {
            endpoint: endpoint?,
            health_endpoint: health_endpoint?,
            cases: cases?,
            concurrency: concurrency?,
            requests_per_case: requests_per_case?,
            repetitions: repetitions?,
            warmup_per_case: warmup_per_case?,
            timeout_seconds: timeout?.0,
            timeout: timeout?.1,
            metadata: metadata?,
            connection: connection?,
            on_failure: on_failure?,
            bearer_token_env: bearer_token_env?,
            decisions_pointer: decisions_pointer?,
            campaign: campaign?,
            name: name?,
            drift_numeric_pointers: drift_numeric_pointers?,
            workload: Value::Null,
            load: load.map(|mut l| {
                if l.mode == Mode::Closed {
                    l.extent =
                        crate::arrival::Extent::Requests(requests_per_case.unwrap_or(0) as u64);
                }
                l
            })?,
            slo: slo?,
        })
        .filter(|_| top_ignore.is_some())
        .map(|mut p| {
            p.workload = super::workload::workload(root, &p);
            p
        })
    }

    /// `drift`: `{"numeric_pointers": [...]}`, pointers into JSON answers whose largest
    /// difference from the reference drift reports.
    fn drift(&mut self, v: Option<&Value>) -> Option<Vec<Pointer>> {
        let Some(v) = v else {
            return Some(Vec::new());
        };
        let m = self.object(v, "drift")?;
        self.unknown_fields(m, "drift", &[&["numeric_pointers"]]);
        match m.get("numeric_pointers") {
            None => Some(Vec::new()),
            Some(p) => self.pointers(p, "drift.numeric_pointers"),
        }
    }

    /// `requests_per_case` of a closed loop.
    fn requests_per_case(&mut self, v: Option<&Value>) -> Option<usize> {
        match v {
            None => {
                self.err("requests_per_case", "is required (an integer >= 1)");
                None
            }
            Some(v) => self.integer(v, "requests_per_case", 1).and_then(|n| {
                if n > MAX_REQUESTS_PER_CASE {
                    self.err(
                        "requests_per_case",
                        format!(
                            "{n} is above {MAX_REQUESTS_PER_CASE}: a round's samples are kept in memory for exact nearest-rank percentiles (about 100 bytes each, more for streams); split the load into more repetitions or cases"
                        ),
                    );
                    return None;
                }
                Some(n)
            }),
        }
    }

    /// What an open loop does not use, and where it does not apply yet.
    fn open_refusals(&mut self, top: &Map<String, Value>, is_campaign: bool) {
        if top.contains_key("concurrency") {
            self.err(
                "concurrency",
                "is not used with load.mode \"open\": the arrival rates (load.rates_per_second) set the load, and load.max_in_flight bounds the requests in flight; remove it",
            );
        }
        if top.contains_key("requests_per_case") {
            self.err(
                "requests_per_case",
                "is replaced with load.mode \"open\" by load.duration_seconds or load.requests (per rate and round); remove it",
            );
        }
        if is_campaign {
            self.err(
                "load.mode",
                "an open loop is not supported in a campaign plan (arms) yet; measure the arms in closed loop, or replay each arm's endpoint with its own open-loop plan",
            );
        }
    }

    /// `connection` (default fresh) and `on_failure` (default stop).
    fn policies(
        &mut self,
        top: &Map<String, Value>,
    ) -> (Option<ConnectionPolicy>, Option<OnFailure>) {
        let connection = match top.get("connection") {
            None => Some(ConnectionPolicy::Fresh),
            Some(v) => {
                match self.string(v, "connection") {
                    Some("fresh") => Some(ConnectionPolicy::Fresh),
                    Some("keep-alive") => Some(ConnectionPolicy::KeepAlive),
                    Some(other) => {
                        self.err(
                        "connection",
                        format!("'{other}' is not a connection policy; use \"fresh\" or \"keep-alive\""),
                    );
                        None
                    }
                    None => None,
                }
            }
        };
        let on_failure = match top.get("on_failure") {
            None => Some(OnFailure::Stop),
            Some(v) => match self.string(v, "on_failure") {
                Some("stop") => Some(OnFailure::Stop),
                Some("continue") => Some(OnFailure::Continue),
                Some(other) => {
                    self.err(
                        "on_failure",
                        format!("'{other}' is not allowed; use \"stop\" or \"continue\""),
                    );
                    None
                }
                None => None,
            },
        };
        (connection, on_failure)
    }

    /// A plain plan's `endpoint` and `health_endpoint` (default `/health` on its origin).
    fn endpoints(&mut self, top: &Map<String, Value>) -> (Option<Endpoint>, Option<Endpoint>) {
        let endpoint = match top.get("endpoint") {
            None => {
                self.err("endpoint", "is required: the URL every case is POSTed to");
                None
            }
            Some(v) => self.endpoint(v, "endpoint"),
        };
        let health_endpoint = match top.get("health_endpoint") {
            None => endpoint.as_ref().map(|e| e.with_path("/health")),
            Some(v) => self.endpoint(v, "health_endpoint"),
        };
        (endpoint, health_endpoint)
    }

    fn concurrency(&mut self, v: Option<&Value>, n: Option<usize>) -> Option<Vec<usize>> {
        let Some(v) = v else {
            self.err("concurrency", "is required: a non-empty list of integers");
            return None;
        };
        let Value::Array(items) = v else {
            self.err(
                "concurrency",
                format!(
                    "must be a non-empty list of integers, found {}",
                    json_kind(v)
                ),
            );
            return None;
        };
        if items.is_empty() {
            self.err("concurrency", "must not be empty");
            return None;
        }
        let mut out = Vec::new();
        let mut seen = HashSet::new();
        let mut ok = true;
        for (i, item) in items.iter().enumerate() {
            let path = format!("concurrency[{i}]");
            match self.integer(item, &path, 1) {
                Some(c) => {
                    if !seen.insert(c) {
                        self.err(&path, format!("{c} appears more than once"));
                        ok = false;
                    }
                    if let Some(n) = n
                        && c > n
                    {
                        self.err(
                            &path,
                            format!(
                                "{c} is above requests_per_case ({n}); a round could never fill it"
                            ),
                        );
                        ok = false;
                    }
                    out.push(c);
                }
                None => ok = false,
            }
        }
        ok.then_some(out)
    }

    fn timeout(&mut self, v: Option<&Value>) -> Option<(f64, Duration)> {
        let Some(v) = v else {
            self.err(
                "timeout_seconds",
                "is required: a finite number of seconds > 0",
            );
            return None;
        };
        let Some(t) = v.as_f64().filter(|_| v.is_number()) else {
            self.err(
                "timeout_seconds",
                format!("must be a number of seconds > 0, found {}", json_kind(v)),
            );
            return None;
        };
        if !t.is_finite() || t <= 0.0 {
            self.err(
                "timeout_seconds",
                format!("must be finite and > 0, found {t}"),
            );
            return None;
        }
        match Duration::try_from_secs_f64(t) {
            Ok(d) if t <= 7.0 * 86_400.0 => Some((t, d)),
            _ => {
                self.err(
                    "timeout_seconds",
                    format!("{t} is too large (at most one week)"),
                );
                None
            }
        }
    }

    fn metadata(&mut self, v: Option<&Value>) -> Option<Map<String, Value>> {
        let Some(v) = v else {
            self.err(
                "metadata",
                format!(
                    "is required: provenance with non-blank {} (write \"N/A: reason\" where one does not apply)",
                    REQUIRED_METADATA.join(", ")
                ),
            );
            return None;
        };
        let m = self.object(v, "metadata")?;
        let mut ok = true;
        for key in REQUIRED_METADATA {
            let path = format!("metadata.{key}");
            match m.get(key) {
                None => {
                    self.err(
                        &path,
                        "is required (write \"N/A: reason\" where it does not apply)",
                    );
                    ok = false;
                }
                Some(val) => {
                    if self.nonblank(val, &path).is_none() {
                        ok = false;
                    }
                }
            }
        }
        ok.then(|| m.clone())
    }

    fn auth(&mut self, v: Option<&Value>) -> Option<Option<String>> {
        let Some(v) = v else { return Some(None) };
        let m = self.object(v, "auth")?;
        self.unknown_fields(m, "auth", &[&["bearer_token_env"]]);
        let Some(env) = m.get("bearer_token_env") else {
            return Some(None);
        };
        let name = self.nonblank(env, "auth.bearer_token_env")?;
        let valid = name
            .chars()
            .enumerate()
            .all(|(i, c)| c == '_' || c.is_ascii_alphabetic() || (i > 0 && c.is_ascii_digit()));
        if !valid {
            self.err(
                "auth.bearer_token_env",
                format!("'{name}' is not an environment variable name (letters, digits, '_')"),
            );
            return None;
        }
        Some(Some(name.to_string()))
    }

    fn cases(
        &mut self,
        v: Option<&Value>,
        endpoint: Option<&Endpoint>,
        top_ignore: &[Pointer],
    ) -> Option<Vec<Case>> {
        let Some(v) = v else {
            self.err("cases", "is required: a non-empty list of cases");
            return None;
        };
        let Value::Array(items) = v else {
            self.err(
                "cases",
                format!("must be a non-empty list, found {}", json_kind(v)),
            );
            return None;
        };
        if items.is_empty() {
            self.err("cases", "must not be empty");
            return None;
        }
        let mut names = HashSet::new();
        let mut out = Vec::new();
        let mut ok = true;
        for (i, item) in items.iter().enumerate() {
            let path = format!("cases[{i}]");
            match self.case(item, &path, endpoint, top_ignore) {
                Some(c) => out.push(c),
                None => ok = false,
            }
            if let Some(name) = item.get("name").and_then(Value::as_str)
                && !names.insert(name.to_string())
            {
                self.err(
                    format!("{path}.name"),
                    format!("case name '{name}' is used more than once"),
                );
                ok = false;
            }
        }
        ok.then_some(out)
    }

    fn case(
        &mut self,
        v: &Value,
        path: &str,
        endpoint: Option<&Endpoint>,
        top_ignore: &[Pointer],
    ) -> Option<Case> {
        let m = self.object(v, path)?;
        self.unknown_fields(m, path, &[NAMED_FIELDS, REQUEST_FIELDS, CASE_FIELDS]);
        let name = match m.get("name") {
            None => {
                self.err(join(path, "name"), "is required");
                None
            }
            Some(n) => self.nonblank(n, &join(path, "name")).map(str::to_string),
        };
        let method = self.method(m.get("method"), &join(path, "method"));
        let case_path = self.target(m.get("path"), &join(path, "path"));
        let headers = self.headers(m.get("headers"), &join(path, "headers"));
        let expected_status = match m.get("expected_status") {
            None => Some(200),
            Some(v) => {
                let p = join(path, "expected_status");
                self.integer(v, &p, 100).and_then(|s| {
                    if s <= 599 {
                        Some(s as u16)
                    } else {
                        self.err(&p, format!("{s} is not an HTTP status (100..=599)"));
                        None
                    }
                })
            }
        };
        let no_body = matches!(method, Some(ref m) if m == Method::GET || m == Method::HEAD);
        let case_ignore = match m.get("ignore_paths") {
            None => Some(Vec::new()),
            Some(v) => self.pointers(v, &join(path, "ignore_paths")),
        };

        let inherited = Inherited {
            top: top_ignore,
            case: case_ignore.as_deref().unwrap_or(&[]),
            case_name: name.as_deref().unwrap_or("?"),
        };
        let variants = match m.get("variants") {
            Some(vs) => {
                for &key in REQUEST_FIELDS {
                    if m.contains_key(key) {
                        self.err(
                            join(path, key),
                            "a case with variants takes its requests and oracles from the variants; move this field into each variant",
                        );
                    }
                }
                self.variants(vs, &join(path, "variants"), no_body, inherited)
                    .filter(|_| case_ignore.is_some())
            }
            None => self
                .variant_body(m, path, None, no_body, inherited)
                .map(|v| vec![v]),
        };

        let case_path = case_path?;
        let endpoint = endpoint.map(|e| match &case_path {
            Some(p) => e.with_path(p),
            None => e.clone(),
        });
        Some(Case {
            name: name?,
            method: method?,
            endpoint: endpoint?,
            path: case_path,
            headers: headers?,
            expected_status: expected_status?,
            variants: variants?,
        })
    }

    /// A case's `method`: an upper-case token, POST when absent.
    fn method(&mut self, v: Option<&Value>, p: &str) -> Option<Method> {
        let Some(v) = v else {
            return Some(Method::POST);
        };
        let s = self.string(v, p)?;
        let upper = s.chars().all(|c| c.is_ascii_uppercase());
        match Method::from_bytes(s.as_bytes()) {
            Ok(m) if upper && !s.is_empty() => Some(m),
            _ => {
                self.err(p, format!("'{s}' is not an upper-case HTTP method token"));
                None
            }
        }
    }

    /// A case's `path`: an origin-form target; `Some(None)` when absent.
    fn target(&mut self, v: Option<&Value>, p: &str) -> Option<Option<String>> {
        let Some(v) = v else { return Some(None) };
        let s = self.string(v, p)?;
        let valid =
            s.starts_with('/') && !s.contains('#') && s.parse::<http::uri::PathAndQuery>().is_ok();
        if valid {
            Some(Some(s.to_string()))
        } else {
            self.err(
                p,
                format!("'{s}' must be an origin-form target starting with '/' (no fragment)"),
            );
            None
        }
    }

    fn variants(
        &mut self,
        v: &Value,
        path: &str,
        no_body: bool,
        inherited: Inherited<'_>,
    ) -> Option<Vec<Variant>> {
        let Value::Array(items) = v else {
            self.err(
                path,
                format!("must be a non-empty list, found {}", json_kind(v)),
            );
            return None;
        };
        if items.is_empty() {
            self.err(
                path,
                "must not be empty (leave it out for a case with one request)",
            );
            return None;
        }
        let mut out = Vec::new();
        let mut names = HashSet::new();
        let mut ok = true;
        for (i, item) in items.iter().enumerate() {
            let p = format!("{path}[{i}]");
            let Some(m) = self.object(item, &p) else {
                ok = false;
                continue;
            };
            self.unknown_fields(m, &p, &[NAMED_FIELDS, REQUEST_FIELDS]);
            let name = match m.get("name") {
                None => {
                    self.err(join(&p, "name"), "is required");
                    None
                }
                Some(n) => self.nonblank(n, &join(&p, "name")).map(str::to_string),
            };
            if let Some(n) = &name
                && !names.insert(n.clone())
            {
                self.err(
                    join(&p, "name"),
                    format!("variant name '{n}' is used more than once in this case"),
                );
                ok = false;
            }
            let own_ignore = match m.get("ignore_paths") {
                None => Some(Vec::new()),
                Some(v) => self.pointers(v, &join(&p, "ignore_paths")),
            };
            match (
                name,
                own_ignore,
                self.variant_body(m, &p, None, no_body, inherited),
            ) {
                (Some(n), Some(own), Some(mut var)) => {
                    var.name = Some(n);
                    for p in &own {
                        if !var.ignore_paths.contains(p) {
                            var.ignore_paths.push(p.clone());
                        }
                    }
                    if !own.is_empty()
                        && let Err(msgs) = var.oracle.add_ignore_paths(own)
                    {
                        for msg in msgs {
                            self.err(join(&p, "ignore_paths"), msg);
                        }
                        ok = false;
                    }
                    out.push(var);
                }
                _ => ok = false,
            }
        }
        ok.then_some(out)
    }

    /// The request and oracle fields of a case without variants, or of one variant.
    fn variant_body(
        &mut self,
        m: &Map<String, Value>,
        path: &str,
        name: Option<String>,
        no_body: bool,
        inherited: Inherited<'_>,
    ) -> Option<Variant> {
        let mut ok = true;
        let (body, default_ct) = match (m.get("request"), m.get("request_text")) {
            (Some(_), Some(_)) => {
                self.err(
                    join(path, "request_text"),
                    "give either request (JSON) or request_text (raw text), not both",
                );
                (None, None)
            }
            (Some(req), None) => (
                serde_json::to_vec(req).ok().map(Bytes::from),
                Some("application/json"),
            ),
            (None, Some(t)) => (
                self.string(t, &join(path, "request_text"))
                    .map(|s| Bytes::copy_from_slice(s.as_bytes())),
                Some("text/plain; charset=utf-8"),
            ),
            (None, None) if no_body => (Some(Bytes::new()), None),
            (None, None) => {
                self.err(
                    join(path, "request"),
                    "is required: the JSON body to send (or request_text for a raw body)",
                );
                (None, None)
            }
        };
        if no_body && body.as_ref().is_some_and(|b| !b.is_empty()) {
            self.err(join(path, "request"), "a GET or HEAD case sends no body");
            ok = false;
        }
        let content_type = match m.get("content_type") {
            None => Some(default_ct.map(HeaderValue::from_static)),
            Some(v) => {
                let p = join(path, "content_type");
                self.nonblank(v, &p)
                    .and_then(|s| match HeaderValue::from_str(s) {
                        Ok(h) => Some(Some(h)),
                        Err(_) => {
                            self.err(&p, "is not a valid header value");
                            None
                        }
                    })
            }
        };
        let (oracle, oracle_ok) = self.oracle(m, path, inherited);
        ok &= oracle_ok;
        if !ok {
            return None;
        }
        Some(Variant {
            name,
            body: body?,
            content_type: content_type?,
            oracle: oracle?,
            ignore_paths: inherited
                .top
                .iter()
                .chain(inherited.case)
                .cloned()
                .collect(),
        })
    }

    /// The one oracle of a request (`expected_response`, `expected_response_text`, or a
    /// streaming oracle), with the rules that tie it to `expected_usage`, `ignore_paths`
    /// and a streaming request. The flag is false when a rule failed even if an oracle
    /// was built.
    fn oracle(
        &mut self,
        m: &Map<String, Value>,
        path: &str,
        inherited: Inherited<'_>,
    ) -> (Option<Oracle>, bool) {
        let mut ok = true;
        let inherited_ignore = inherited.case;
        let primaries: Vec<&str> = ORACLE_FIELDS
            .iter()
            .copied()
            .filter(|k| m.contains_key(*k))
            .collect();
        let has_ignore = !inherited_ignore.is_empty() || m.contains_key("ignore_paths");
        let streaming = primaries
            .iter()
            .any(|k| matches!(*k, "expected_stream_text" | "expected_events"));
        ok &= self.require_done(
            m.get("require_done"),
            &join(path, "require_done"),
            streaming,
        );
        if m.contains_key("expected_usage")
            && !primaries
                .iter()
                .any(|k| matches!(*k, "expected_stream_text" | "expected_events"))
        {
            self.err(
                join(path, "expected_usage"),
                "goes with a streaming oracle: expected_stream_text or expected_events",
            );
            ok = false;
        }
        let oracle = match primaries.as_slice() {
            // In a campaign a request may have no oracle: the reference's answers are the
            // baseline, status and transport are still judged.
            [] if self.oracle_optional => Some(Oracle::Unjudged),
            [] => {
                self.err(
                    join(path, "expected_response"),
                    "is required: the oracle (expected_response for type-strict JSON, expected_response_text for exact bytes, expected_stream_text or expected_events for an event stream)",
                );
                None
            }
            [_, second, ..] => {
                self.err(
                    join(path, second),
                    format!(
                        "a request has exactly one oracle: give one of {}, not {}",
                        ORACLE_FIELDS.join(", "),
                        primaries.join(" and ")
                    ),
                );
                None
            }
            ["expected_response"] => {
                let asks_stream = m
                    .get("request")
                    .and_then(|r| r.get("stream"))
                    .and_then(Value::as_bool)
                    == Some(true);
                if asks_stream {
                    self.err(
                        join(path, "expected_response"),
                        "the request asks for a stream (\"stream\": true), so the answer is an event stream, not one JSON document: use expected_stream_text (with optional expected_usage) or expected_events",
                    );
                    None
                } else {
                    let expected = m.get("expected_response").cloned().unwrap_or(Value::Null);
                    match Oracle::json(expected, inherited_ignore.to_vec()) {
                        Ok(o) => Some(o),
                        Err(msgs) => {
                            for msg in msgs {
                                self.err(join(path, "expected_response"), msg);
                            }
                            None
                        }
                    }
                }
            }
            ["expected_response_text"] => {
                let p = join(path, "expected_response_text");
                let t = m
                    .get("expected_response_text")
                    .and_then(|v| self.string(v, &p));
                if has_ignore {
                    self.err(
                        join(path, "ignore_paths"),
                        "ignore_paths only applies to JSON oracles (expected_response, expected_events, expected_usage); an exact-bytes oracle compares every byte",
                    );
                    ok = false;
                }
                if !inherited.top.is_empty() {
                    self.err(
                        "ignore_paths",
                        format!(
                            "the top-level ignore_paths applies to every case's JSON oracle, but case '{}' ({path}) has an exact-bytes oracle (expected_response_text), which compares every byte; move the pointers into the cases that need them",
                            inherited.case_name
                        ),
                    );
                    ok = false;
                }
                t.map(|t| Oracle::Bytes(Bytes::copy_from_slice(t.as_bytes())))
            }
            _ => self.stream_oracle(m, path, inherited_ignore),
        };
        let mut oracle = oracle;
        if let Some(o) = oracle.as_mut() {
            ok &= self.top_ignore(o, path, inherited);
        }
        if let Some(Oracle::Stream(so)) = oracle.as_mut() {
            so.require_done = m.get("require_done").and_then(Value::as_bool) == Some(true);
        }
        (oracle, ok)
    }

    /// `require_done`: a boolean, with a streaming oracle only. False when a rule failed.
    fn require_done(&mut self, v: Option<&Value>, p: &str, streaming: bool) -> bool {
        let Some(v) = v else { return true };
        if !v.is_boolean() {
            self.err(p, format!("must be true or false, found {}", json_kind(v)));
            return false;
        }
        if !streaming {
            self.err(
                p,
                "goes with a streaming oracle (expected_stream_text or expected_events): it makes a stream without data: [DONE] a correctness failure",
            );
            return false;
        }
        true
    }

    /// Add the plan's top-level ignore paths to a request's oracle; each problem names the
    /// case. False when one did not apply.
    fn top_ignore(&mut self, o: &mut Oracle, path: &str, inherited: Inherited<'_>) -> bool {
        let Err(msgs) = o.add_top_ignore_paths(inherited.top) else {
            return true;
        };
        for msg in msgs {
            self.err(
                "ignore_paths",
                format!(
                    "{msg} of case '{}' ({path}); a top-level pointer must end at a primitive leaf of every JSON oracle (expected_response)",
                    inherited.case_name
                ),
            );
        }
        false
    }

    /// `expected_stream_text` or `expected_events`, with optional `expected_usage`.
    fn stream_oracle(
        &mut self,
        m: &Map<String, Value>,
        path: &str,
        inherited_ignore: &[Pointer],
    ) -> Option<Oracle> {
        let mut so = StreamOracle::default();
        let mut ok = true;
        if let Some(v) = m.get("expected_stream_text") {
            so.text = self
                .string(v, &join(path, "expected_stream_text"))
                .map(str::to_string);
            ok &= so.text.is_some();
        }
        if let Some(v) = m.get("expected_events") {
            let p = join(path, "expected_events");
            match v {
                Value::Array(items) if !items.is_empty() => {
                    so.events = Some(
                        items
                            .iter()
                            .map(|e| match e {
                                Value::String(s) => EventExpect::Text(s.clone()),
                                other => EventExpect::Json(other.clone(), Default::default()),
                            })
                            .collect(),
                    );
                }
                other => {
                    self.err(
                        &p,
                        format!(
                            "must be a non-empty list of event payloads (a string is compared as raw data, anything else as JSON), found {}",
                            json_kind(other)
                        ),
                    );
                    ok = false;
                }
            }
        }
        if let Some(v) = m.get("expected_usage") {
            match v {
                Value::Object(_) => so.usage = Some((v.clone(), Default::default())),
                other => {
                    self.err(
                        join(path, "expected_usage"),
                        format!(
                            "must be an object (the stream's final usage), found {}",
                            json_kind(other)
                        ),
                    );
                    ok = false;
                }
            }
        }
        if !ok {
            return None;
        }
        let mut oracle = Oracle::Stream(Box::new(so));
        if !inherited_ignore.is_empty()
            && let Err(msgs) = oracle.add_ignore_paths(inherited_ignore.to_vec())
        {
            for msg in msgs {
                self.err(join(path, "ignore_paths"), msg);
            }
            return None;
        }
        Some(oracle)
    }

    fn pointers(&mut self, v: &Value, path: &str) -> Option<Vec<Pointer>> {
        let Value::Array(items) = v else {
            self.err(
                path,
                format!("must be a list of JSON pointers, found {}", json_kind(v)),
            );
            return None;
        };
        let mut out = Vec::new();
        let mut seen = HashSet::new();
        let mut ok = true;
        for (i, item) in items.iter().enumerate() {
            let p = format!("{path}[{i}]");
            let Some(s) = self.string(item, &p) else {
                ok = false;
                continue;
            };
            match Pointer::parse(s) {
                Ok(ptr) => {
                    if !seen.insert(s.to_string()) {
                        self.err(&p, format!("'{s}' appears more than once"));
                        ok = false;
                    }
                    out.push(ptr);
                }
                Err(msg) => {
                    self.err(&p, format!("'{s}': {msg}"));
                    ok = false;
                }
            }
        }
        ok.then_some(out)
    }

    fn headers(&mut self, v: Option<&Value>, path: &str) -> Option<Vec<(HeaderName, HeaderValue)>> {
        let Some(v) = v else { return Some(Vec::new()) };
        let m = self.object(v, path)?;
        let mut out = Vec::new();
        let mut ok = true;
        for (k, val) in m {
            let p = format!("{path}.{k}");
            let Ok(name) = HeaderName::from_bytes(k.as_bytes()) else {
                self.err(&p, "is not a valid header name");
                ok = false;
                continue;
            };
            if crate::redact::DEFAULT_REDACT_HEADERS.contains(&name.as_str()) {
                self.err(
                    &p,
                    "carries a secret, and the plan is copied into every run directory; use auth.bearer_token_env (or --bearer-token-env) for a bearer token",
                );
                ok = false;
                continue;
            }
            if ENGINE_HEADERS.contains(&name.as_str()) {
                self.err(
                    &p,
                    "is set by the engine (use the case's content_type field for Content-Type)",
                );
                ok = false;
                continue;
            }
            let Some(s) = self.string(val, &p) else {
                ok = false;
                continue;
            };
            match HeaderValue::from_str(s) {
                Ok(hv) if s.bytes().all(|b| (0x20..0x7f).contains(&b)) => out.push((name, hv)),
                _ => {
                    self.err(&p, "must be printable ASCII");
                    ok = false;
                }
            }
        }
        ok.then_some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const META: &str = r#""metadata": {"gpu": "N/A", "gpu_ids": "N/A", "driver": "N/A", "cuda": "N/A",
        "precision": "N/A", "model_revision": "m", "runtime_revision": "r", "cache_policy": "none",
        "cuda_evidence": "N/A", "reservation": "N/A", "host": "h"}"#;

    fn plan(body: &str) -> Result<Plan, PlanError> {
        let text = format!("{{ {body}, {META} }}");
        Plan::from_json_bytes(text.as_bytes())
    }

    fn problems(body: &str) -> Vec<String> {
        match plan(body) {
            Ok(_) => vec![],
            Err(e) => e.problems.iter().map(|p| p.to_string()).collect(),
        }
    }

    const BASE: &str = r#""endpoint": "http://127.0.0.1:8000/v1/x", "concurrency": [1, 2],
        "requests_per_case": 4, "timeout_seconds": 2"#;

    #[test]
    fn minimal_plan_resolves_with_defaults() {
        let p = plan(&format!(
            r#"{BASE}, "cases": [{{"name": "a", "request": {{"z": 1, "a": 2}}, "expected_response": {{"ok": true}}}}]"#
        ))
        .expect("valid");
        assert_eq!(p.repetitions, 2);
        assert_eq!(p.warmup_per_case, 2);
        assert_eq!(p.connection, ConnectionPolicy::Fresh);
        assert_eq!(p.on_failure, OnFailure::Stop);
        assert_eq!(p.health_endpoint.url(), "http://127.0.0.1:8000/health");
        // key order of the request is kept as written in the plan
        assert_eq!(&p.cases[0].variants[0].body[..], br#"{"z":1,"a":2}"#);
        // 1 health + 1 readiness + 2 warmup + (1 + 2*4) + (2 + 2*4)
        assert_eq!(p.planned_requests(), 1 + 1 + 2 + 9 + 10);
    }

    const CASE: &str = r#""cases": [{"name": "a", "request": {}, "expected_response": {}}]"#;
    const OPEN: &str = r#""endpoint": "http://h/x", "timeout_seconds": 2"#;

    #[test]
    fn an_open_load_resolves_with_its_defaults_and_its_planned_requests() {
        let p = plan(&format!(
            r#"{OPEN}, {CASE}, "load": {{"mode": "open", "rates_per_second": [5, 2.5], "duration_seconds": 4}},
            "slo": {{"e2e_ms": 250, "ttft_ms": 0.5}}"#
        ))
        .expect("valid");
        assert_eq!(p.load.mode, super::super::load::Mode::Open);
        assert_eq!(p.load.arrival, crate::arrival::Arrival::Poisson);
        assert_eq!(p.load.seed, 0);
        assert_eq!(
            p.load.max_in_flight,
            super::super::load::DEFAULT_MAX_IN_FLIGHT
        );
        assert_eq!(p.levels(), vec![Level::Rate(5.0), Level::Rate(2.5)]);
        assert!(p.concurrency.is_empty());
        let slo = p.slo.expect("slo");
        assert_eq!(
            (slo.e2e_us, slo.ttft_us, slo.tpot_us),
            (Some(250_000), Some(500), None)
        );
        // Planned: health, readiness, 2 warm-ups, then per rate a feasibility second and
        // two rounds, each counted from its seeded schedule.
        let scheduled: u64 = [(5.0, 0), (2.5, 1)]
            .iter()
            .flat_map(|&(r, li)| {
                [None, Some(0), Some(1)].map(|rep| p.load.schedule(r, 0, li, rep).len() as u64)
            })
            .sum();
        assert_eq!(p.planned_requests(), 1 + 1 + 2 + scheduled);
        // A closed plan with a load keeps its arrival for --sweep; its hash is unchanged
        // by a closed load.
        let closed = plan(&format!(
            r#"{BASE}, {CASE}, "load": {{"arrival": "constant", "seed": 9}}"#
        ))
        .unwrap();
        let bare = plan(&format!(r#"{BASE}, {CASE}"#)).unwrap();
        assert_eq!(closed.load.arrival, crate::arrival::Arrival::Constant);
        assert_eq!(closed.workload, bare.workload);
        assert_eq!(closed.load.extent, crate::arrival::Extent::Requests(4));
    }

    #[test]
    fn open_load_rules() {
        let errs = problems(&format!(
            r#"{BASE}, {CASE}, "load": {{"mode": "open", "rates_per_second": [5, 5, 0, "x"], "duration_seconds": 1, "requests": 3,
              "arrival": {{"gamma": {{"burstiness": -1}}}}, "max_in_flight": 0}}"#
        ));
        assert_eq!(
            errs,
            vec![
                "load.arrival.gamma.burstiness: must be a finite number > 0 and <= 1000000, found -1",
                "load.max_in_flight: must be an integer >= 1, found 0",
                "load.rates_per_second[1]: 5 appears more than once",
                "load.rates_per_second[2]: must be a finite number > 0 and <= 1000000, found 0",
                "load.rates_per_second[3]: must be a number > 0, found a string",
                "load.requests: give either load.duration_seconds or load.requests, not both",
                "concurrency: is not used with load.mode \"open\": the arrival rates (load.rates_per_second) set the load, and load.max_in_flight bounds the requests in flight; remove it",
                "requests_per_case: is replaced with load.mode \"open\" by load.duration_seconds or load.requests (per rate and round); remove it",
            ]
        );
        let errs = problems(&format!(
            r#"{OPEN}, {CASE}, "load": {{"mode": "open", "arrival": "bursty"}}"#
        ));
        assert_eq!(
            errs,
            vec![
                "load.arrival: 'bursty' is not an arrival process; use \"constant\", \"poisson\" or {\"gamma\": {\"burstiness\": k}}",
                "load.rates_per_second: is required with load.mode \"open\": a non-empty list of request rates (requests per second)",
                "load.duration_seconds: is required with load.mode \"open\" (or load.requests): how long each round's schedule runs",
            ]
        );
        let errs = problems(&format!(
            r#"{BASE}, {CASE}, "load": {{"rates_per_second": [1], "mode": "closed"}}, "slo": {{}}"#
        ));
        assert_eq!(
            errs,
            vec![
                "load.rates_per_second: goes with load.mode \"open\"; a closed loop is sized by concurrency and requests_per_case",
                "slo: is empty: give at least one of ttft_ms, tpot_ms, e2e_ms",
            ]
        );
        let errs = problems(&format!(
            r#"{OPEN}, {CASE}, "load": {{"mode": "open", "rates_per_second": [100000], "duration_seconds": 86400}}"#
        ));
        assert!(
            errs[0].starts_with(
                "load.duration_seconds: at 100000/s a round would hold about 8640000000 requests"
            ),
            "{errs:?}"
        );
        // The floors: a rate and a gamma shape too small to mean anything.
        let errs = problems(&format!(
            r#"{OPEN}, {CASE}, "load": {{"mode": "open", "rates_per_second": [0.0005], "duration_seconds": 1,
              "arrival": {{"gamma": {{"burstiness": 0.001}}}}}}"#
        ));
        assert_eq!(
            errs,
            vec![
                "load.arrival.gamma.burstiness: 0.001 is below 0.01: almost every gap would be 0 and the rest enormous (the gaps' CV is 1/sqrt(k))",
                "load.rates_per_second[0]: 0.0005 is below 0.001: the lowest rate, in requests per second (one request every ~17 minutes)",
            ]
        );
    }

    #[test]
    fn duplicate_case_and_variant_names() {
        let errs = problems(&format!(
            r#"{BASE}, "cases": [
              {{"name": "a", "request": {{}}, "expected_response": {{}}}},
              {{"name": "a", "variants": [
                 {{"name": "v", "request": {{}}, "expected_response": {{}}}},
                 {{"name": "v", "request": {{}}, "expected_response": {{}}}}]}}]"#
        ));
        assert_eq!(
            errs,
            vec![
                "cases[1].variants[1].name: variant name 'v' is used more than once in this case",
                "cases[1].name: case name 'a' is used more than once",
            ]
        );
    }

    #[test]
    fn concurrency_rules() {
        let errs = problems(
            r#""endpoint": "http://h/x", "concurrency": [1, 1, 5, 0, 2.0], "requests_per_case": 4,
            "timeout_seconds": 1, "cases": [{"name": "a", "request": {}, "expected_response": {}}]"#,
        );
        assert_eq!(
            errs,
            vec![
                "concurrency[1]: 1 appears more than once",
                "concurrency[2]: 5 is above requests_per_case (4); a round could never fill it",
                "concurrency[3]: must be an integer >= 1, found 0",
                "concurrency[4]: must be written as a JSON integer (2, not 2.0)",
            ]
        );
    }

    #[test]
    fn requests_per_case_is_bounded_by_what_nearest_rank_keeps_in_memory() {
        let errs = problems(
            r#""endpoint": "http://h/x", "concurrency": [1000000000], "requests_per_case": 1000000000,
            "timeout_seconds": 1, "cases": [{"name": "a", "request": {}, "expected_response": {}}]"#,
        );
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(
            errs[0].starts_with("requests_per_case: 1000000000 is above 10000000: a round's samples are kept in memory"),
            "{errs:?}"
        );
        assert!(
            plan(
                r#""endpoint": "http://h/x", "concurrency": [1], "requests_per_case": 10000000,
            "timeout_seconds": 1, "cases": [{"name": "a", "request": {}, "expected_response": {}}]"#
            )
            .is_ok()
        );
    }

    #[test]
    fn size_errors_say_the_bound_and_print_numbers_short() {
        let errs = problems(
            r#""endpoint": "http://h/x", "concurrency": [1], "requests_per_case": 1e30, "repetitions": 123456789012345678901234567890,
            "timeout_seconds": 1, "cases": [{"name": "a", "request": {}, "expected_response": {}}]"#,
        );
        assert_eq!(
            errs,
            vec![
                "requests_per_case: must be an integer <= 1099511627776, found 1e+30",
                "repetitions: must be an integer <= 1099511627776, found 1.2345678901234568e+29",
            ]
        );
        let errs = problems(
            r#""endpoint": "http://h/x", "concurrency": [1], "requests_per_case": 1e7, "warmup_per_case": -1e30,
            "timeout_seconds": 1, "cases": [{"name": "a", "request": {}, "expected_response": {}}]"#,
        );
        assert_eq!(
            errs,
            vec![
                "requests_per_case: must be written as a JSON integer (10000000, not 10000000.0)",
                "warmup_per_case: must be an integer >= 2, found -1e+30",
            ]
        );
        let bom = [b"\xEF\xBB\xBF".as_slice(), b"{}"].concat();
        let e = Plan::from_json_bytes(&bom).unwrap_err();
        assert!(
            e.problems[0]
                .message
                .starts_with("plan starts with a UTF-8 byte-order mark (BOM)"),
            "{e}"
        );
    }

    #[test]
    fn duplicate_keys_are_refused_with_their_paths() {
        let text = format!(
            r#"{{ {BASE}, "cases": [{{"name": "a", "request": {{"x": 1, "x": 2}}, "name": "b",
              "expected_response": {{}}}}], "concurrency": [1], {META} }}"#
        );
        let e = Plan::from_json_bytes(text.as_bytes()).unwrap_err();
        let got: Vec<String> = e.problems.iter().map(|p| p.to_string()).collect();
        assert_eq!(
            got,
            vec![
                "cases[0].request.x: is given twice in the same object (members 1 and 2); a JSON reader keeps one of them silently, so a frozen plan may not repeat a key",
                "cases[0].name: is given twice in the same object (members 1 and 3); a JSON reader keeps one of them silently, so a frozen plan may not repeat a key",
                "concurrency: is given twice in the same object (members 2 and 6); a JSON reader keeps one of them silently, so a frozen plan may not repeat a key",
            ]
        );
        // Floats still round correctly, and order is kept.
        let p = plan(&format!(
            r#"{BASE}, "cases": [{{"name": "a", "request": {{"z": 0.1000000000000000055511151231257827, "a": 1}}, "expected_response": {{}}}}]"#
        ))
        .unwrap();
        assert_eq!(&p.cases[0].variants[0].body[..], br#"{"z":0.1,"a":1}"#);
    }

    #[test]
    fn non_finite_and_bad_timeouts() {
        // serde_json refuses non-finite literals: the error names JSON, line and column.
        let e = Plan::from_json_bytes(br#"{"timeout_seconds": NaN}"#).unwrap_err();
        assert!(
            e.problems[0].message.starts_with("plan is not valid JSON"),
            "{e}"
        );
        let e = Plan::from_json_bytes(br#"{"timeout_seconds": 1e999}"#).unwrap_err();
        assert!(
            e.problems[0].message.starts_with("plan is not valid JSON"),
            "{e}"
        );
        let errs = problems(
            r#""endpoint": "http://h/x", "concurrency": [1], "requests_per_case": 1,
            "timeout_seconds": 0, "cases": [{"name": "a", "request": {}, "expected_response": {}}]"#,
        );
        assert_eq!(
            errs,
            vec!["timeout_seconds: must be finite and > 0, found 0"]
        );
    }

    #[test]
    fn blank_and_missing_metadata() {
        let text = r#"{"endpoint": "http://h/x", "concurrency": [1], "requests_per_case": 1,
            "timeout_seconds": 1, "cases": [{"name": "a", "request": {}, "expected_response": {}}],
            "metadata": {"gpu": "  ", "gpu_ids": "N/A", "driver": "N/A", "cuda": "N/A",
            "precision": "N/A", "model_revision": "m", "runtime_revision": "r", "cache_policy": "none",
            "cuda_evidence": "N/A", "reservation": "N/A"}}"#;
        let e = Plan::from_json_bytes(text.as_bytes()).unwrap_err();
        let msgs: Vec<String> = e.problems.iter().map(|p| p.to_string()).collect();
        assert_eq!(
            msgs,
            vec![
                "metadata.gpu: must not be blank",
                "metadata.host: is required (write \"N/A: reason\" where it does not apply)",
            ]
        );
    }

    #[test]
    fn bad_pointers() {
        let errs = problems(&format!(
            r#"{BASE}, "cases": [{{"name": "a", "request": {{}},
               "expected_response": {{"id": "x", "list": [1, {{"k": 2}}], "obj": {{"a": 1}}}},
               "ignore_paths": ["", "id", "/id", "/id", "/~2", "/list/01", "/obj", "/missing", "/list/1/k"]}}]"#
        ));
        assert_eq!(
            errs,
            vec![
                "cases[0].ignore_paths[0]: '': the root pointer would ignore the whole response; use an exact-bytes oracle or remove the case",
                "cases[0].ignore_paths[1]: 'id': a JSON pointer starts with '/' (RFC 6901)",
                "cases[0].ignore_paths[3]: '/id' appears more than once",
                "cases[0].ignore_paths[4]: '/~2': '~' must be followed by 0 or 1 (RFC 6901)",
            ]
        );
        // Pointers that parse are then resolved against the oracle.
        let errs = problems(&format!(
            r#"{BASE}, "cases": [{{"name": "a", "request": {{}},
               "expected_response": {{"id": "x", "list": [1, {{"k": 2}}], "obj": {{"a": 1}}}},
               "ignore_paths": ["/list/01", "/obj", "/missing", "/list/1/k"]}}]"#
        ));
        assert_eq!(
            errs,
            vec![
                "cases[0].expected_response: ignore path '/list/01': '01' is not a canonical array index",
                "cases[0].expected_response: ignore path '/obj' must end at a primitive leaf, but it reaches an object",
                "cases[0].expected_response: ignore path '/missing' does not exist in the oracle",
            ]
        );
    }

    #[test]
    fn ignore_paths_with_exact_bytes_oracle_is_rejected() {
        let errs = problems(&format!(
            r#"{BASE}, "cases": [{{"name": "a", "request": {{}}, "expected_response_text": "ok",
                "ignore_paths": ["/id"]}}]"#
        ));
        assert_eq!(
            errs,
            vec![
                "cases[0].ignore_paths: ignore_paths only applies to JSON oracles (expected_response, expected_events, expected_usage); an exact-bytes oracle compares every byte"
            ]
        );
    }

    #[test]
    fn endpoint_rules() {
        for (url, msg) in [
            ("ftp://h/x", "scheme 'ftp' is not supported"),
            ("http://u:p@h/x", "must not contain credentials"),
            ("http://h/x#frag", "must not contain a fragment"),
            ("/relative", "must be an absolute"),
            ("http://127.0.0.1:abc/v1", "has an invalid port 'abc'"),
            ("http://127.0.0.1:99999/v1", "has an invalid port '99999'"),
            ("http://127.0.0.1:65536/v1", "has an invalid port '65536'"),
            ("http://127.0.0.1:70000/v1", "has an invalid port '70000'"),
            ("http://127.0.0.1:/v1", "has an invalid port ''"),
            ("http://127.0.0.1:0/v1", "has an invalid port '0'"),
            ("http://[::1]:x/v1", "has an invalid port 'x'"),
            (
                "http://h/v1?api_key=SECRET",
                "'http://h/v1?api_key=<redacted>' carries a secret query parameter",
            ),
        ] {
            let errs = problems(&format!(
                r#""endpoint": "{url}", "concurrency": [1], "requests_per_case": 1, "timeout_seconds": 1,
                "cases": [{{"name": "a", "request": {{}}, "expected_response": {{}}}}]"#
            ));
            assert_eq!(errs.len(), 1, "{url}: {errs:?}");
            assert!(
                errs[0].starts_with("endpoint: ") && errs[0].contains(msg),
                "{url}: {errs:?}"
            );
        }
        let e = Endpoint::parse("https://[::1]:8443/v1?x=1").unwrap();
        assert_eq!(
            (e.host.as_str(), e.port, e.authority.as_str()),
            ("::1", 8443, "[::1]:8443")
        );
        assert_eq!(e.path_and_query, "/v1?x=1");
        for (url, port) in [
            ("http://h/x", 80),
            ("https://h", 443),
            ("http://h:65535/", 65535),
            ("http://[::1]/", 80),
        ] {
            assert_eq!(Endpoint::parse(url).unwrap().port, port, "{url}");
        }
    }

    #[test]
    fn secrets_and_engine_headers_are_refused() {
        let errs = problems(&format!(
            r#"{BASE}, "cases": [{{"name": "a", "request": {{}}, "expected_response": {{}},
               "headers": {{"Authorization": "Bearer x", "Content-Length": "3", "X-Ok": "yes"}}}}]"#
        ));
        assert_eq!(errs.len(), 2, "{errs:?}");
        assert!(errs[0].starts_with("cases[0].headers.Authorization: carries a secret"));
        assert!(errs[1].starts_with("cases[0].headers.Content-Length: is set by the engine"));
    }

    #[test]
    fn unknown_fields_and_types() {
        let errs = problems(&format!(
            r#"{BASE}, "repetition": 3, "cases": [{{"name": 5, "request": {{}}, "expected_response": {{}}, "oracle": 1}}]"#
        ));
        assert_eq!(errs.len(), 3, "{errs:?}");
        assert!(errs[0].starts_with("repetition: unknown field"));
        assert!(errs[1].starts_with("cases[0].oracle: unknown field"));
        assert_eq!(errs[2], "cases[0].name: must be a string, found an integer");
    }

    #[test]
    fn variants_with_case_level_request_are_refused() {
        let errs = problems(&format!(
            r#"{BASE}, "cases": [{{"name": "a", "request": {{}}, "variants": [
                {{"name": "v", "request": {{}}, "expected_response": {{}}}}]}}]"#
        ));
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(errs[0].starts_with("cases[0].request: a case with variants"));
    }

    #[test]
    fn deeply_nested_plan_is_an_error_not_a_crash() {
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        let e = Plan::from_json_bytes(deep.as_bytes()).unwrap_err();
        assert!(e.problems[0].message.contains("recursion limit"), "{e}");
    }

    #[test]
    fn streaming_requests_need_streaming_oracles() {
        let errs = problems(&format!(
            r#"{BASE}, "cases": [{{"name": "a", "request": {{"stream": true}}, "expected_response": {{}}}}]"#
        ));
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(
            errs[0].starts_with("cases[0].expected_response: the request asks for a stream"),
            "{errs:?}"
        );
        assert!(errs[0].contains("expected_stream_text") && errs[0].contains("expected_events"));
        let ok = plan(&format!(
            r#"{BASE}, "cases": [{{"name": "a", "request": {{"stream": true}}, "expected_stream_text": "hi",
                "expected_usage": {{"completion_tokens": 2, "prompt_tokens": 1}}}},
                {{"name": "b", "request": {{"stream": true}}, "ignore_paths": ["/id"],
                "expected_events": [{{"id": "x", "choices": []}}, "[DONE]"]}}]"#
        ));
        assert!(ok.is_ok(), "{:?}", ok.err());
    }

    #[test]
    fn streaming_oracle_combinations() {
        let errs = problems(&format!(
            r#"{BASE}, "cases": [
              {{"name": "a", "request": {{}}, "expected_stream_text": "x", "expected_events": ["[DONE]"]}},
              {{"name": "b", "request": {{}}, "expected_response": {{}}, "expected_usage": {{}}}},
              {{"name": "c", "request": {{}}, "expected_stream_text": "x", "ignore_paths": ["/id"]}},
              {{"name": "d", "request": {{}}, "expected_events": []}}]"#
        ));
        assert_eq!(errs.len(), 4, "{errs:?}");
        assert!(
            errs[0].starts_with("cases[0].expected_events: a request has exactly one oracle"),
            "{}",
            errs[0]
        );
        assert!(
            errs[1].starts_with("cases[1].expected_usage: goes with a streaming oracle"),
            "{}",
            errs[1]
        );
        assert!(
            errs[2].starts_with(
                "cases[2].ignore_paths: ignore path '/id' does not end at a primitive leaf"
            ),
            "{}",
            errs[2]
        );
        assert!(
            errs[3].starts_with("cases[3].expected_events: must be a non-empty list"),
            "{}",
            errs[3]
        );
    }

    /// The one JSON oracle of a plan's first case.
    fn first_oracle(p: &Plan) -> &Oracle {
        &p.cases[0].variants[0].oracle
    }

    #[test]
    fn top_level_ignore_paths_exclude_exactly_the_seed_leaves() {
        // The seed's own example: escaped tokens and array elements.
        let p = plan(&format!(
            r#"{BASE}, "ignore_paths": ["/a~1b/~0timer", "/items/0/timer", "/items/1/timer"],
            "cases": [{{"name": "a", "request": {{}}, "expected_response":
              {{"a/b": {{"~timer": 1.5, "other": 1}}, "items": [{{"timer": 1, "v": "x"}}, {{"timer": 2, "v": "y"}}], "timer": 3}}}}]"#
        ))
        .expect("valid");
        let o = first_oracle(&p);
        let base = r#"{"a/b": {"~timer": 9.25, "other": 1}, "items": [{"timer": 7, "v": "x"}, {"timer": 8, "v": "y"}], "timer": 3}"#;
        assert_eq!(o.check(base.as_bytes()), Ok(()));
        for (body, at) in [
            (
                base.replace(r#""other": 1"#, r#""other": 2"#),
                "/a~1b/other",
            ),
            (base.replace(r#""v": "x""#, r#""v": "z""#), "/items/0/v"),
            (base.replace(r#""timer": 3"#, r#""timer": 4"#), "/timer"),
        ] {
            let m = o.check(body.as_bytes()).unwrap_err();
            assert_eq!(m.pointer.as_deref(), Some(at), "{body}");
        }
    }

    #[test]
    fn an_excluded_native_timer_still_fails_everything_else() {
        let p = plan(&format!(
            r#"{BASE}, "ignore_paths": ["/metadata/inference_seconds"],
            "cases": [{{"name": "a", "request": {{}}, "expected_response":
              {{"answers": {{"a": {{"choice": "yes"}}}}, "metadata": {{"inference_seconds": 0.0}}}}}}]"#
        ))
        .expect("valid");
        let o = first_oracle(&p);
        let ok =
            r#"{"answers": {"a": {"choice": "yes"}}, "metadata": {"inference_seconds": 0.0123}}"#;
        assert_eq!(o.check(ok.as_bytes()), Ok(()));
        let cases = [
            (
                "a changed answer",
                r#"{"answers": {"a": {"choice": "no"}}, "metadata": {"inference_seconds": 0.5}}"#,
                "/answers/a/choice",
            ),
            (
                "a missing field",
                r#"{"answers": {"a": {"choice": "yes"}}, "metadata": {}}"#,
                "/metadata/inference_seconds",
            ),
            (
                "a type change",
                r#"{"answers": {"a": {"choice": "yes"}}, "metadata": {"inference_seconds": "0.5"}}"#,
                "/metadata/inference_seconds",
            ),
            (
                "an extra member",
                r#"{"answers": {"a": {"choice": "yes"}}, "metadata": {"inference_seconds": 0.5, "gpu": 1}}"#,
                "/metadata/gpu",
            ),
            (
                "a non-finite number",
                r#"{"answers": {"a": {"choice": "yes"}}, "metadata": {"inference_seconds": 1e309}}"#,
                "",
            ),
        ];
        for (what, body, at) in cases {
            let m = o.check(body.as_bytes()).expect_err(what);
            assert_eq!(m.pointer.as_deref(), Some(at), "{what}: {m}");
        }
    }

    #[test]
    fn top_level_ignore_paths_follow_the_pointer_rules() {
        // A case's list adds to the top-level one.
        let p = plan(&format!(
            r#"{BASE}, "ignore_paths": ["/t"], "cases": [
              {{"name": "a", "ignore_paths": ["/id"], "request": {{}}, "expected_response": {{"t": 1, "id": "x", "v": 1}}}},
              {{"name": "s", "request": {{"stream": true}}, "expected_stream_text": "x"}},
              {{"name": "e", "request": {{"stream": true}}, "expected_events": [{{"id": 1}}, "[DONE]"]}}]"#
        ))
        .expect("streaming oracles need not hold a top-level pointer");
        assert_eq!(
            first_oracle(&p).check(br#"{"t": 2, "id": "y", "v": 1}"#),
            Ok(())
        );
        // Not a leaf, or not in one case's oracle, or not canonical: each named with its case.
        let errs = problems(&format!(
            r#"{BASE}, "ignore_paths": ["/t", "/t", "/list/01"], "cases": [
              {{"name": "a", "request": {{}}, "expected_response": {{"t": 1, "list": [1, 2]}}}},
              {{"name": "b", "request": {{}}, "expected_response": {{"t": {{"x": 1}}}}}}]"#
        ));
        assert_eq!(
            errs,
            vec!["ignore_paths[1]: '/t' appears more than once"],
            "a duplicate is refused before any oracle is looked at"
        );
        let errs = problems(&format!(
            r#"{BASE}, "ignore_paths": ["/t", "/list/01"], "cases": [
              {{"name": "a", "request": {{}}, "expected_response": {{"t": 1, "list": [1, 2]}}}},
              {{"name": "b", "request": {{}}, "expected_response": {{"t": {{"x": 1}}}}}}]"#
        ));
        assert_eq!(
            errs,
            vec![
                "ignore_paths: ignore path '/list/01': '01' is not a canonical array index of case 'a' (cases[0]); a top-level pointer must end at a primitive leaf of every JSON oracle (expected_response)",
                "ignore_paths: ignore path '/t' must end at a primitive leaf, but it reaches an object of case 'b' (cases[1]); a top-level pointer must end at a primitive leaf of every JSON oracle (expected_response)",
                "ignore_paths: ignore path '/list/01' does not exist in the oracle of case 'b' (cases[1]); a top-level pointer must end at a primitive leaf of every JSON oracle (expected_response)",
            ]
        );
        // Any exact-bytes oracle refuses the top-level list, naming the case.
        let errs = problems(&format!(
            r#"{BASE}, "ignore_paths": ["/t"], "cases": [
              {{"name": "a", "request": {{}}, "expected_response": {{"t": 1}}}},
              {{"name": "raw", "variants": [{{"name": "v", "request": {{}}, "expected_response_text": "ok"}}]}}]"#
        ));
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(
            errs[0].starts_with(
                "ignore_paths: the top-level ignore_paths applies to every case's JSON oracle, but case 'raw' (cases[1].variants[0]) has an exact-bytes oracle"
            ),
            "{}",
            errs[0]
        );
    }

    #[test]
    fn decisions_pointer_and_require_done() {
        let p = plan(&format!(
            r#"{BASE}, "cases": [{{"name": "a", "request": {{}}, "expected_response": {{}}}}]"#
        ))
        .unwrap();
        assert_eq!(p.decisions_pointer.as_str(), "/answers");
        let p = plan(&format!(
            r#"{BASE}, "decisions_pointer": "/out/picks", "cases": [{{"name": "a", "request": {{}}, "expected_response": {{}}}}]"#
        ))
        .unwrap();
        assert_eq!(p.decisions_pointer.as_str(), "/out/picks");
        let errs = problems(&format!(
            r#"{BASE}, "decisions_pointer": "answers", "cases": [
              {{"name": "a", "request": {{}}, "expected_response": {{}}, "require_done": true}},
              {{"name": "b", "request": {{}}, "expected_stream_text": "x", "require_done": "yes"}},
              {{"name": "c", "request": {{}}, "expected_stream_text": "x", "require_done": true}}]"#
        ));
        assert_eq!(
            errs,
            vec![
                "decisions_pointer: 'answers': a JSON pointer starts with '/' (RFC 6901)",
                "cases[0].require_done: goes with a streaming oracle (expected_stream_text or expected_events): it makes a stream without data: [DONE] a correctness failure",
                "cases[1].require_done: must be true or false, found a string",
            ]
        );
    }
}
