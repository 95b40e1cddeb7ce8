//! The JSON reader and the validation toolkit every config document (a plan, a
//! contract) is read with: [`read_document`] (UTF-8 without a byte-order mark, valid JSON,
//! no key repeated within an object), [`Problem`] and [`PlanError`] (every problem with the
//! JSON path it concerns), and the [`Validator`] that collects them while a walk checks
//! strings, integers, objects, endpoints and pointer lists. The walks themselves live
//! beside it (`walk.rs`, `cases.rs`, `oracle_spec.rs`, `load.rs`, `campaign.rs`,
//! `contract.rs`), each an `impl Validator` block; this file imports none of them.

use std::collections::HashSet;
use std::fmt;

use serde_json::{Map, Value};

use crate::model::Endpoint;
use crate::oracle::{Pointer, json_kind};

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

/// The fields of one request and its oracle: a variant's, or a case's without variants.
pub(super) const REQUEST_FIELDS: &[&str] = &[
    "request",
    "request_text",
    "content_type",
    "expected_response",
    "expected_response_text",
    "expected_stream_text",
    "expected_events",
    "expected_usage",
    "require_done",
    "prompt_tokens",
    "expected_schema",
    "schema_of",
    "expected_tool_calls",
    "expected_choice",
    "case_fold",
    "expected_pattern",
    "tolerance",
];

/// Header names a plan may not set: framing and hop-by-hop headers belong to the engine.
pub(crate) const ENGINE_HEADERS: &[&str] = &[
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
    pub(super) problems: Vec<Problem>,
    /// Where a request declared no oracle (a capture plan's requests, or a campaign's
    /// judged by drift), as paths for the message that refuses a plain plan mixing them
    /// with judged requests.
    pub(super) unjudged: Vec<String>,
    /// Requests that declared an oracle.
    pub(super) judged: usize,
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

    pub(super) fn endpoint(&mut self, v: &Value, path: &str) -> Option<Endpoint> {
        let s = self.string(v, path)?;
        self.endpoint_str(s, s, path)
    }

    /// An endpoint URL as written: no secret query parameter (the plan is copied into
    /// every run directory), and `parse_as` (the same text, or with a stand-in for a
    /// placeholder such as an arm's `{port}`) a valid endpoint. Messages show `s`.
    pub(super) fn endpoint_str(&mut self, s: &str, parse_as: &str, path: &str) -> Option<Endpoint> {
        if crate::redact::Redaction::default().has_secret_query(s) {
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

    pub(super) fn pointers(&mut self, v: &Value, path: &str) -> Option<Vec<Pointer>> {
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
}
