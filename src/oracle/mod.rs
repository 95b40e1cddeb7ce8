//! Oracles: judging a response body against what the plan predeclared.
//!
//! Two oracles exist: type-strict JSON with RFC 6901 `ignore_paths`, and exact bytes.
//! JSON comparison is strict about types (`true` != `1`, `1` != `1.0`), ignores key order,
//! keeps array order and requires equal key sets. An ignored leaf must still exist in the
//! response with the same JSON type. A mismatch names the first differing JSON pointer.
//! This module never alters the bytes it judges and never does I/O. Nesting depth is
//! bounded by `serde_json`'s parser (128 levels), so comparison cannot overflow the stack.

use std::collections::BTreeMap;

use bytes::Bytes;
use serde_json::{Number, Value};

pub(crate) mod answer;
pub(crate) mod contract;
mod pointer;
mod text;
pub(crate) mod tolerance;

use pointer::is_canonical_index;
pub(crate) use pointer::{Mismatch, Pointer, sort_keys};

pub(crate) use text::answer_reason;
use text::{byte_window, text_difference};

/// Why an ignore path does not name a primitive leaf of the oracle's expected value; the
/// words follow the path (`ignore path '/a' does not exist in the oracle`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum LeafError {
    #[error(" does not exist in the oracle")]
    Missing,
    #[error(": '{0}' is not a canonical array index")]
    NotAnIndex(String),
    /// It reaches an object or an array (the kind named).
    #[error(" must end at a primitive leaf, but it reaches {0}")]
    NotALeaf(&'static str),
}

/// What a judged JSON answer says of itself.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Judged {
    /// Entries of its decisions container (`None`: not a JSON oracle, or not asked).
    pub(crate) decisions: Option<u64>,
    /// Its `usage`: (prompt tokens, completion tokens, cached prompt tokens).
    pub(crate) usage: Option<(Option<i64>, i64, Option<i64>)>,
}

/// `usage` of an OpenAI-style JSON answer: (prompt tokens, completion tokens, its
/// `prompt_tokens_details.cached_tokens`), when it reports completion tokens.
pub(crate) fn usage_tokens(answer: &Value) -> Option<(Option<i64>, i64, Option<i64>)> {
    let u = answer.get("usage")?;
    // 0 to 2^40 (model::MAX_TOKEN_COUNT): a negative or absurd value is no count.
    let count = |v: Option<&Value>| {
        v.and_then(Value::as_i64)
            .filter(|n| (0..=1i64 << 40).contains(n))
    };
    let cached = u
        .get("prompt_tokens_details")
        .and_then(|d| d.get("cached_tokens"));
    Some((
        count(u.get("prompt_tokens")),
        count(u.get("completion_tokens"))?,
        count(cached),
    ))
}

/// The seed's decisions of one answer: the entries of the container at `at` (array
/// elements or object members); 0 when it is absent or not a container.
pub(crate) fn count_decisions(answer: &Value, at: &Pointer) -> u64 {
    match at.resolve(answer) {
        Some(Value::Array(a)) => a.len() as u64,
        Some(Value::Object(m)) => m.len() as u64,
        _ => 0,
    }
}

/// Escape one reference token for a pointer (RFC 6901 section 3).
pub(crate) fn escape_token(tok: &str, out: &mut String) {
    for c in tok.chars() {
        match c {
            '~' => out.push_str("~0"),
            '/' => out.push_str("~1"),
            c => out.push(c),
        }
    }
}

fn pointer_of(path: &[PathTok<'_>]) -> String {
    let mut s = String::new();
    for t in path {
        s.push('/');
        match t {
            PathTok::Key(k) => escape_token(k, &mut s),
            PathTok::Index(i) => s.push_str(&i.to_string()),
        }
    }
    s
}

#[derive(Clone, Copy)]
enum PathTok<'a> {
    Key(&'a str),
    Index(usize),
}

/// JSON type with the integer/fractional distinction the oracle is strict about, as a
/// phrase for messages ("an integer", "a fractional number", ...).
pub(crate) fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(n) if n.is_f64() => "a fractional number",
        Value::Number(_) => "an integer",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn num_eq(a: &Number, b: &Number) -> bool {
    match (a.is_f64(), b.is_f64()) {
        (false, false) => a.as_i64() == b.as_i64() && a.as_u64() == b.as_u64(),
        (true, true) => a.as_f64() == b.as_f64(),
        _ => false,
    }
}

/// Ignore paths as a trie, so comparison walks them alongside the values.
#[derive(Debug, Clone, Default)]
struct IgnoreNode {
    leaf: bool,
    children: BTreeMap<String, IgnoreNode>,
}

impl IgnoreNode {
    fn insert(&mut self, p: &Pointer) {
        let mut node = self;
        for t in &p.tokens {
            node = node.children.entry(t.clone()).or_default();
        }
        node.leaf = true;
    }
}

#[derive(Debug, Clone)]
pub(crate) enum Oracle {
    /// Type-strict JSON equality with ignored primitive leaves.
    Json {
        expected: Value,
        ignore_paths: Vec<Pointer>,
        ignore: IgnoreTrie,
        /// Numeric leaves equal within these bounds (`tolerance`); none: exact.
        tolerance: Option<Box<tolerance::TolNode>>,
    },
    /// Exact bytes.
    Bytes(Bytes),
    /// No oracle (a campaign case): the body is not judged.
    Unjudged,
    /// An event stream judged as the virtual document
    /// `{"text": ..., "usage": ..., "events": [...]}` (pointers in mismatches use it).
    Stream(Box<StreamOracle>),
    /// A contract the answer must keep, whatever its exact text: a JSON Schema, tool
    /// calls, a choice or a pattern ([`contract`]).
    Contract(Box<contract::Contract>),
}

/// What one expected event's `data` must be.
#[derive(Debug, Clone)]
pub(crate) enum EventExpect {
    /// Exactly this text (e.g. `[DONE]`).
    Text(String),
    /// JSON, compared type-strictly, with the ignore paths that resolve in it.
    Json(Value, IgnoreTrie),
}

#[derive(Debug, Clone, Default)]
pub(crate) struct StreamOracle {
    /// The assembled generated text (choice 0) must equal this exactly.
    pub(crate) text: Option<String>,
    /// The stream's final `usage` object, type-strict, with the ignore paths that resolve in it.
    pub(crate) usage: Option<(Value, IgnoreTrie)>,
    /// The exact list of event payloads.
    pub(crate) events: Option<Vec<EventExpect>>,
    pub(crate) ignore_paths: Vec<Pointer>,
    /// The stream must carry `data: [DONE]` (`require_done`); otherwise its absence is
    /// allowed, as with servers that end a stream by HTTP framing alone.
    pub(crate) require_done: bool,
}

/// Opaque trie of ignore paths (built by [`Oracle::json`]).
#[derive(Debug, Clone, Default)]
pub(crate) struct IgnoreTrie(IgnoreNode);

impl Oracle {
    /// A JSON oracle. Every ignore path must resolve to a primitive leaf of `expected`
    /// through canonical array indices; `Err` lists every path that does not.
    pub(crate) fn json(expected: Value, ignore_paths: Vec<Pointer>) -> Result<Oracle, Vec<String>> {
        let mut o = Oracle::Json {
            expected,
            ignore_paths: Vec::new(),
            ignore: IgnoreTrie::default(),
            tolerance: None,
        };
        o.add_ignore_paths(ignore_paths)?;
        Ok(o)
    }

    /// The oracle's kind as documents name it: `json`, `bytes`, `stream`, a contract's
    /// (`schema`, `tool_calls`, `choice`, `pattern`), or `none`.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Oracle::Json { .. } => "json",
            Oracle::Bytes(_) => "bytes",
            Oracle::Stream(_) => "stream",
            Oracle::Contract(c) => c.kind(),
            Oracle::Unjudged => "none",
        }
    }

    /// A JSON oracle's numeric leaves equal within `tolerance` (its pointers already
    /// checked against the expected value); no-op for any other oracle.
    pub(crate) fn set_tolerance(&mut self, t: tolerance::TolNode) {
        if let Oracle::Json { tolerance, .. } = self {
            *tolerance = Some(Box::new(t));
        }
    }

    /// Add ignore paths to a JSON oracle (validated as in [`Oracle::json`]). For an
    /// exact-bytes oracle this is a no-op: validation rejects that combination earlier.
    pub(crate) fn add_ignore_paths(&mut self, paths: Vec<Pointer>) -> Result<(), Vec<String>> {
        if let Oracle::Stream(so) = self {
            return so.add_ignore_paths(paths);
        }
        let Oracle::Json {
            expected,
            ignore_paths,
            ignore,
            ..
        } = self
        else {
            return Ok(());
        };
        let mut errs = Vec::new();
        for p in paths {
            match resolve_leaf(expected, &p) {
                Ok(()) => {
                    if !ignore_paths.contains(&p) {
                        ignore.0.insert(&p);
                        ignore_paths.push(p);
                    }
                }
                Err(e) => errs.push(format!("ignore path '{}'{e}", p.as_str())),
            }
        }
        if errs.is_empty() { Ok(()) } else { Err(errs) }
    }

    /// Add the plan's top-level ignore paths. A JSON oracle takes them as its own (each must
    /// resolve to a primitive leaf); a streaming oracle applies each to the payloads where
    /// it resolves and needs none to; an exact-bytes oracle takes none (validation refuses
    /// top-level paths when any case has one).
    pub(crate) fn add_top_ignore_paths(&mut self, paths: &[Pointer]) -> Result<(), Vec<String>> {
        if matches!(self, Oracle::Contract(_)) {
            return Ok(());
        }
        match self {
            Oracle::Stream(so) => {
                for p in paths {
                    so.apply_where_resolving(p);
                }
                Ok(())
            }
            _ => self.add_ignore_paths(paths.to_vec()),
        }
    }

    /// Judge a response body.
    pub(crate) fn check(&self, body: &[u8]) -> Result<(), Mismatch> {
        self.judge_and_read(body, false, None).1
    }

    /// Judge a response body and, for a JSON oracle, read what the answer says of itself
    /// from the same parse: its `usage` ([`usage_tokens`]) whether it matched or not (a
    /// performance-fit arm's mismatching answers still count their tokens), and when it
    /// matched its decisions under `decisions` ([`count_decisions`]). Other oracles read
    /// nothing (`Judged::default()`). `stream`: the answer is an event stream (a contract
    /// reads its deltas; a streaming oracle reads it as one anyway).
    pub(crate) fn judge_and_read(
        &self,
        body: &[u8],
        stream: bool,
        decisions: Option<&Pointer>,
    ) -> (Judged, Result<(), Mismatch>) {
        match self {
            Oracle::Json {
                expected,
                ignore,
                tolerance,
                ..
            } => {
                let actual: Value = match serde_json::from_slice(body) {
                    Ok(v) => v,
                    Err(e) => {
                        let m = Mismatch {
                            pointer: Some(String::new()),
                            reason: format!("response is not valid JSON ({e})"),
                        };
                        return (Judged::default(), Err(m));
                    }
                };
                let mut path = Vec::new();
                let at = At::new(Some(&ignore.0), tolerance.as_deref());
                let verdict = compare(expected, &actual, at, &mut path);
                let judged = Judged {
                    decisions: verdict
                        .is_ok()
                        .then(|| decisions.map(|at| count_decisions(&actual, at)))
                        .flatten(),
                    usage: usage_tokens(&actual),
                };
                (judged, verdict)
            }
            Oracle::Bytes(expected) => (Judged::default(), same_bytes(expected, body)),
            Oracle::Stream(so) => (Judged::default(), so.check(body)),
            Oracle::Contract(c) => (Judged::default(), c.judge(body, stream)),
            Oracle::Unjudged => (Judged::default(), Ok(())),
        }
    }
}

/// The exact-bytes oracle: where `body` first differs from `expected`.
fn same_bytes(expected: &[u8], body: &[u8]) -> Result<(), Mismatch> {
    if expected == body {
        return Ok(());
    }
    let at = expected
        .iter()
        .zip(body)
        .position(|(a, b)| a != b)
        .unwrap_or(expected.len().min(body.len()));
    let shown = match (std::str::from_utf8(expected), std::str::from_utf8(body)) {
        (Ok(e), Ok(b)) => text_difference(e, b).1,
        _ => format!(
            "expected \"{}\", found \"{}\"",
            byte_window(expected, at),
            byte_window(body, at)
        ),
    };
    Err(Mismatch {
        pointer: None,
        reason: format!(
            "bytes differ at offset {at} (expected {} bytes, got {}): {shown}",
            expected.len(),
            body.len()
        ),
    })
}

impl StreamOracle {
    /// Apply `p` to every JSON payload (expected event or usage) where it resolves to a
    /// primitive leaf; a path that resolves nowhere is not an error here.
    fn apply_where_resolving(&mut self, p: &Pointer) -> bool {
        let mut used = false;
        if let Some((v, trie)) = self.usage.as_mut()
            && resolve_leaf(v, p).is_ok()
        {
            trie.0.insert(p);
            used = true;
        }
        for e in self.events.iter_mut().flatten() {
            if let EventExpect::Json(v, trie) = e
                && resolve_leaf(v, p).is_ok()
            {
                trie.0.insert(p);
                used = true;
            }
        }
        if used && !self.ignore_paths.contains(p) {
            self.ignore_paths.push(p.clone());
        }
        used
    }

    /// Each path must resolve to a primitive leaf in at least one JSON payload (an expected
    /// event or the usage object); it is applied to the payloads where it resolves.
    fn add_ignore_paths(&mut self, paths: Vec<Pointer>) -> Result<(), Vec<String>> {
        let errs: Vec<String> = paths
            .iter()
            .filter(|p| !self.apply_where_resolving(p))
            .map(|p| format!(
                "ignore path '{}' does not end at a primitive leaf of any expected event or of expected_usage",
                p.as_str()
            ))
            .collect();
        if errs.is_empty() { Ok(()) } else { Err(errs) }
    }

    fn check(&self, body: &[u8]) -> Result<(), Mismatch> {
        let events = crate::sse::parse_all(body).map_err(|e| Mismatch {
            pointer: Some(String::new()),
            reason: format!("response is not a readable event stream ({e})"),
        })?;
        let mut tracker = crate::sse::StreamTracker::default();
        for e in &events {
            tracker.on_event(e);
        }
        if let Some(expected) = &self.events {
            for (i, exp) in expected.iter().enumerate() {
                let Some(got) = events.get(i) else {
                    return Err(Mismatch {
                        pointer: Some(format!("/events/{i}")),
                        reason: format!(
                            "event is missing (expected {} events, found {})",
                            expected.len(),
                            events.len()
                        ),
                    });
                };
                match exp {
                    EventExpect::Text(t) if *t == got.data => {}
                    EventExpect::Text(t) => {
                        let (at, shown) = text_difference(t, &got.data);
                        return Err(Mismatch {
                            pointer: Some(format!("/events/{i}")),
                            reason: format!("event data differs at character {at}: {shown}"),
                        });
                    }
                    EventExpect::Json(v, trie) => {
                        let actual: Value =
                            serde_json::from_str(&got.data).map_err(|e| Mismatch {
                                pointer: Some(format!("/events/{i}")),
                                reason: format!("event data is not valid JSON ({e})"),
                            })?;
                        let mut path = vec![PathTok::Key("events"), PathTok::Index(i)];
                        compare(v, &actual, At::new(Some(&trie.0), None), &mut path)?;
                    }
                }
            }
            if events.len() > expected.len() {
                return Err(Mismatch {
                    pointer: Some(format!("/events/{}", expected.len())),
                    reason: format!(
                        "unexpected event (expected {} events, found {})",
                        expected.len(),
                        events.len()
                    ),
                });
            }
        }
        if let Some(t) = &self.text
            && *t != tracker.text
        {
            let (at, shown) = text_difference(t, &tracker.text);
            return Err(Mismatch {
                pointer: Some("/text".into()),
                reason: format!("generated text differs at character {at}: {shown}"),
            });
        }
        if let Some((v, trie)) = &self.usage {
            let Some(actual) = &tracker.usage else {
                return Err(Mismatch {
                    pointer: Some("/usage".into()),
                    reason: "the stream carried no usage object (ask for it with stream_options.include_usage)".into(),
                });
            };
            let mut path = vec![PathTok::Key("usage")];
            compare(v, actual, At::new(Some(&trie.0), None), &mut path)?;
        }
        if self.require_done && !tracker.done {
            return Err(Mismatch {
                pointer: Some(format!("/events/{}", events.len())),
                reason: "the stream ended without data: [DONE] (the oracle sets require_done)"
                    .into(),
            });
        }
        Ok(())
    }
}

fn resolve_leaf(root: &Value, p: &Pointer) -> Result<(), LeafError> {
    let mut cur = root;
    for tok in &p.tokens {
        cur = match cur {
            Value::Object(m) => m.get(tok).ok_or(LeafError::Missing)?,
            Value::Array(a) => {
                if !is_canonical_index(tok) {
                    return Err(LeafError::NotAnIndex(tok.clone()));
                }
                let i: usize = tok.parse().map_err(|_| LeafError::Missing)?;
                a.get(i).ok_or(LeafError::Missing)?
            }
            _ => return Err(LeafError::Missing),
        };
    }
    match cur {
        Value::Object(_) | Value::Array(_) => Err(LeafError::NotALeaf(json_kind(cur))),
        _ => Ok(()),
    }
}

/// A mismatch at `path`.
fn fail(path: &[PathTok<'_>], reason: String) -> Mismatch {
    Mismatch {
        pointer: Some(pointer_of(path)),
        reason,
    }
}

/// Where a comparison stands in its oracle's ignore paths and tolerances.
#[derive(Clone, Copy)]
struct At<'t> {
    ignore: Option<&'t IgnoreNode>,
    tol: Option<&'t tolerance::TolNode>,
    /// The tolerance of the nearest pointer above (or the whole answer's).
    within: Option<tolerance::Tol>,
}

impl<'t> At<'t> {
    fn new(ignore: Option<&'t IgnoreNode>, tol: Option<&'t tolerance::TolNode>) -> At<'t> {
        At {
            ignore,
            tol,
            within: tol.and_then(|t| t.tol),
        }
    }

    /// One step down, into the member or element named `key`.
    fn down(self, key: &str) -> At<'t> {
        let tol = self.tol.and_then(|t| t.child(key));
        At {
            ignore: self.ignore.and_then(|n| n.children.get(key)),
            tol,
            within: tol.and_then(|t| t.tol).or(self.within),
        }
    }

    /// [`Self::down`] into element `i`, naming it only where a trie goes on.
    fn down_index(self, i: usize) -> At<'t> {
        if self.ignore.is_none() && self.tol.is_none() {
            return self;
        }
        self.down(&i.to_string())
    }
}

fn compare<'a>(
    expected: &'a Value,
    actual: &'a Value,
    at: At<'_>,
    path: &mut Vec<PathTok<'a>>,
) -> Result<(), Mismatch> {
    if let Some(node) = at.ignore
        && node.leaf
    {
        return if json_kind(expected) == json_kind(actual) {
            Ok(())
        } else {
            Err(fail(
                path,
                format!(
                    "ignored leaf must keep its type: expected {}, found {}",
                    json_kind(expected),
                    json_kind(actual)
                ),
            ))
        };
    }
    match (expected, actual) {
        (Value::Object(e), Value::Object(a)) => compare_objects(e, a, at, path),
        (Value::Array(e), Value::Array(a)) => compare_arrays(e, a, at, path),
        (Value::Number(e), Value::Number(a)) if at.within.is_some() => {
            let Some(tol) = at.within else {
                return compare_scalars(expected, actual, path);
            };
            if tol.holds_numbers(e, a) {
                Ok(())
            } else {
                Err(fail(path, format!("expected {e} within {tol}, found {a}")))
            }
        }
        _ => compare_scalars(expected, actual, path),
    }
}

/// Two objects: every expected key present and equal (in the expected order), no other.
fn compare_objects<'a>(
    e: &'a serde_json::Map<String, Value>,
    a: &'a serde_json::Map<String, Value>,
    at: At<'_>,
    path: &mut Vec<PathTok<'a>>,
) -> Result<(), Mismatch> {
    for (k, ev) in e {
        path.push(PathTok::Key(k));
        let child = at.down(k);
        match a.get(k) {
            Some(av) => compare(ev, av, child, path)?,
            None => {
                let what = if child.ignore.is_some_and(|c| c.leaf) {
                    "ignored leaf is missing from the response"
                } else {
                    "key is missing from the response"
                };
                return Err(fail(path, what.into()));
            }
        }
        path.pop();
    }
    if let Some(k) = a.keys().find(|k| !e.contains_key(k.as_str())) {
        path.push(PathTok::Key(k));
        return Err(fail(path, "unexpected key in the response".into()));
    }
    Ok(())
}

/// Two arrays: element by element, then their lengths.
fn compare_arrays<'a>(
    e: &'a [Value],
    a: &'a [Value],
    at: At<'_>,
    path: &mut Vec<PathTok<'a>>,
) -> Result<(), Mismatch> {
    for (i, (ev, av)) in e.iter().zip(a).enumerate() {
        path.push(PathTok::Index(i));
        compare(ev, av, at.down_index(i), path)?;
        path.pop();
    }
    if e.len() != a.len() {
        path.push(PathTok::Index(e.len().min(a.len())));
        let reason = if a.len() > e.len() {
            format!(
                "unexpected array element (expected {} elements, found {})",
                e.len(),
                a.len()
            )
        } else {
            format!(
                "array element is missing (expected {} elements, found {})",
                e.len(),
                a.len()
            )
        };
        return Err(fail(path, reason));
    }
    Ok(())
}

/// Two values that are not both objects nor both arrays.
fn compare_scalars(expected: &Value, actual: &Value, path: &[PathTok<'_>]) -> Result<(), Mismatch> {
    match (expected, actual) {
        (Value::Number(e), Value::Number(a)) => {
            if num_eq(e, a) {
                Ok(())
            } else if e.is_f64() != a.is_f64() {
                Err(fail(
                    path,
                    format!(
                        "expected {} {e}, found {} {a}",
                        json_kind(expected),
                        json_kind(actual)
                    ),
                ))
            } else {
                Err(fail(path, format!("expected {e}, found {a}")))
            }
        }
        (Value::String(e), Value::String(a)) if e == a => Ok(()),
        (Value::String(e), Value::String(a)) => {
            let (at, shown) = text_difference(e, a);
            Err(fail(
                path,
                format!("{shown} (first difference at char {at})"),
            ))
        }
        (Value::Bool(e), Value::Bool(a)) if e == a => Ok(()),
        (Value::Null, Value::Null) => Ok(()),
        _ if json_kind(expected) == json_kind(actual) => Err(fail(
            path,
            format!("expected {}, found {}", short(expected), short(actual)),
        )),
        _ => Err(fail(
            path,
            format!(
                "expected {} ({}), found {} ({})",
                json_kind(expected),
                short(expected),
                json_kind(actual),
                short(actual)
            ),
        )),
    }
}

/// A value rendered for an error message, cut to 80 characters.
fn short(v: &Value) -> String {
    text::cut(&v.to_string(), 80)
}

#[cfg(test)]
mod tests {
    use super::pointer::PointerError;
    use super::*;
    use serde_json::json;

    fn oracle(expected: Value, ignore: &[&str]) -> Oracle {
        let ptrs = ignore.iter().map(|p| Pointer::parse(p).unwrap()).collect();
        Oracle::json(expected, ptrs).unwrap()
    }

    fn check(o: &Oracle, body: &str) -> Result<(), (Option<String>, String)> {
        o.check(body.as_bytes()).map_err(|m| (m.pointer, m.reason))
    }

    fn ptr(r: Result<(), (Option<String>, String)>) -> Option<String> {
        r.err().and_then(|e| e.0)
    }

    #[test]
    fn booleans_are_not_integers() {
        let o = oracle(json!({"a": true}), &[]);
        assert_eq!(
            check(&o, r#"{"a": 1}"#),
            Err((
                Some("/a".into()),
                "expected a boolean (true), found an integer (1)".into()
            ))
        );
        assert_eq!(check(&o, r#"{"a": true}"#), Ok(()));
    }

    #[test]
    fn integers_are_not_floats() {
        let o = oracle(json!({"n": 1}), &[]);
        assert_eq!(
            check(&o, r#"{"n": 1.0}"#),
            Err((
                Some("/n".into()),
                "expected an integer 1, found a fractional number 1.0".into()
            ))
        );
        let f = Oracle::json(serde_json::from_str(r#"{"n": 0.75}"#).unwrap(), vec![]).unwrap();
        assert_eq!(check(&f, r#"{"n": 0.750}"#), Ok(()));
        assert_eq!(ptr(check(&f, r#"{"n": 0.76}"#)), Some("/n".into()));
    }

    #[test]
    fn key_order_is_ignored_but_array_order_is_not() {
        let o = oracle(json!({"a": 1, "b": [1, 2]}), &[]);
        assert_eq!(check(&o, r#"{"b": [1, 2], "a": 1}"#), Ok(()));
        assert_eq!(
            ptr(check(&o, r#"{"a": 1, "b": [2, 1]}"#)),
            Some("/b/0".into())
        );
    }

    #[test]
    fn extra_and_missing_keys_and_elements() {
        let o = oracle(json!({"a": 1, "l": [1]}), &[]);
        assert_eq!(
            check(&o, r#"{"a": 1, "l": [1], "z": 0}"#),
            Err((Some("/z".into()), "unexpected key in the response".into()))
        );
        assert_eq!(
            check(&o, r#"{"l": [1]}"#),
            Err((Some("/a".into()), "key is missing from the response".into()))
        );
        assert_eq!(
            ptr(check(&o, r#"{"a": 1, "l": [1, 2]}"#)),
            Some("/l/1".into())
        );
        assert_eq!(ptr(check(&o, r#"{"a": 1, "l": []}"#)), Some("/l/0".into()));
    }

    #[test]
    fn ignored_leaves_must_exist_with_the_same_type() {
        let o = oracle(
            json!({"id": "x", "created": 1, "v": [{"t": 0.5}]}),
            &["/id", "/created", "/v/0/t"],
        );
        assert_eq!(
            check(&o, r#"{"id": "other", "created": 99, "v": [{"t": 0.25}]}"#),
            Ok(())
        );
        assert_eq!(
            check(&o, r#"{"created": 99, "v": [{"t": 0.25}]}"#),
            Err((
                Some("/id".into()),
                "ignored leaf is missing from the response".into()
            ))
        );
        assert_eq!(
            check(&o, r#"{"id": 5, "created": 99, "v": [{"t": 0.25}]}"#),
            Err((
                Some("/id".into()),
                "ignored leaf must keep its type: expected a string, found an integer".into()
            ))
        );
        assert_eq!(
            ptr(check(
                &o,
                r#"{"id": "a", "created": 1.5, "v": [{"t": 0.25}]}"#
            )),
            Some("/created".into())
        );
    }

    #[test]
    fn escaped_pointer_tokens() {
        let o = oracle(json!({"a/b": 1, "m~n": 2}), &["/a~1b"]);
        assert_eq!(check(&o, r#"{"a/b": 7, "m~n": 2}"#), Ok(()));
        assert_eq!(
            ptr(check(&o, r#"{"a/b": 7, "m~n": 3}"#)),
            Some("/m~0n".into())
        );
    }

    #[test]
    fn invalid_json_never_matches_even_null() {
        let o = oracle(Value::Null, &[]);
        assert_eq!(check(&o, "null"), Ok(()));
        let e = check(&o, "").unwrap_err();
        assert_eq!(e.0, Some(String::new()));
        assert!(e.1.starts_with("response is not valid JSON"), "{}", e.1);
        for bad in ["nul", "null garbage"] {
            let e = check(&o, bad).unwrap_err();
            assert!(
                e.1.starts_with("response is not valid JSON"),
                "{bad}: {}",
                e.1
            );
        }
    }

    #[test]
    fn deeply_nested_response_is_a_mismatch_not_a_crash() {
        let o = oracle(json!([]), &[]);
        let deep = format!("{}{}", "[".repeat(50_000), "]".repeat(50_000));
        let e = check(&o, &deep).unwrap_err();
        assert!(e.1.contains("recursion limit"), "{}", e.1);
        // 120 levels parse and compare fine
        let ok = format!("{}{}", "[".repeat(120), "]".repeat(120));
        let o2 = Oracle::json(serde_json::from_str(&ok).unwrap(), vec![]).unwrap();
        assert_eq!(check(&o2, &ok), Ok(()));
    }

    #[test]
    fn exact_bytes() {
        let o = Oracle::Bytes(Bytes::from_static(b"hello"));
        assert_eq!(o.check(b"hello"), Ok(()));
        let m = o.check(b"help").unwrap_err();
        assert_eq!(m.pointer, None);
        assert_eq!(
            m.reason,
            r#"bytes differ at offset 3 (expected 5 bytes, got 4): expected "hello", found "help""#
        );
        assert_eq!(
            o.check(b"hello!").unwrap_err().reason,
            r#"bytes differ at offset 5 (expected 5 bytes, got 6): expected "hello", found "hello!""#
        );
    }

    #[test]
    fn a_long_string_mismatch_shows_both_sides_around_the_first_difference() {
        let a = "a".repeat(1225);
        let content = |s: &str| json!({"choices": [{"message": {"content": format!("{a}{s}")}}]});
        let o = oracle(content("publicly, outside the walls, at noon"), &[]);
        let body = content("publicly, inside the walls, at noon").to_string();
        let m = o.check(body.as_bytes()).unwrap_err();
        let w = "a".repeat(14);
        assert_eq!(
            m.to_string(),
            format!(
                "at /choices/0/message/content: expected \"…{w}publicly, outside the walls, at noon\", \
                 found \"…{w}publicly, inside the walls, at noon\" (first difference at char 1235)"
            )
        );
        // A long tail is cut as well: each side is a window of 24 + 40 characters.
        let o = oracle(json!(format!("{a}x{a}")), &[]);
        let m = o
            .check(json!(format!("{a}y{a}")).to_string().as_bytes())
            .unwrap_err();
        let (before, after) = ("a".repeat(24), "a".repeat(39));
        assert_eq!(
            m.reason,
            format!(
                "expected \"…{before}x{after}…\", found \"…{before}y{after}…\" (first difference at char 1225)"
            )
        );
        // One side a prefix of the other: the difference is where the shorter one ends.
        let o = oracle(json!("abc"), &[]);
        assert_eq!(
            check(&o, r#""abcd""#).unwrap_err().1,
            r#"expected "abc", found "abcd" (first difference at char 3)"#
        );
    }

    #[test]
    fn mismatch_windows_keep_characters_whole_and_escape_control_characters() {
        let e = "é".repeat(24);
        let o = oracle(json!(format!("{}{e}\n\"x\"\u{1}", "é".repeat(6))), &[]);
        let body = json!(format!("{}{e}\t\"x\"\u{1}", "é".repeat(6))).to_string();
        assert_eq!(
            check(&o, &body).unwrap_err().1,
            format!(
                r#"expected "…{e}\n\"x\"\u{{1}}", found "…{e}\t\"x\"\u{{1}}" (first difference at char 30)"#
            )
        );
        // A body that is not UTF-8: its window is widened to whole characters, and what is
        // not UTF-8 shows as U+FFFD.
        let body = |last: &[u8]| {
            let mut b = vec![0xff];
            b.extend_from_slice("é".repeat(40).as_bytes());
            b.extend_from_slice(last);
            b
        };
        let o = Oracle::Bytes(Bytes::from(body(b"ab")));
        let e = "é".repeat(12);
        assert_eq!(
            o.check(&body(b"ac")).unwrap_err().reason,
            format!(
                r#"bytes differ at offset 82 (expected 83 bytes, got 83): expected "…{e}ab", found "…{e}ac""#
            )
        );
        let o = Oracle::Bytes(Bytes::from_static(b"\xff\xfeabc"));
        assert_eq!(
            o.check(b"\xff\xfeabd").unwrap_err().reason,
            "bytes differ at offset 4 (expected 5 bytes, got 5): expected \"\u{fffd}\u{fffd}abc\", \
             found \"\u{fffd}\u{fffd}abd\""
        );
    }

    #[test]
    fn a_refused_answer_says_its_reason_bounded_and_escaped() {
        let pinned = br#"{"detail": "Server is pinned to './model'; requested 'model'"}"#;
        assert_eq!(
            answer_reason(pinned).as_deref(),
            Some(r#""Server is pinned to './model'; requested 'model'""#)
        );
        let openai = br#"{"error": {"message": "no such model", "type": "invalid_request_error"}}"#;
        assert_eq!(answer_reason(openai).as_deref(), Some(r#""no such model""#));
        let tgi = br#"{"error": "Input validation error", "error_type": "validation"}"#;
        assert_eq!(
            answer_reason(tgi).as_deref(),
            Some(r#""Input validation error""#)
        );
        // Not one of those shapes: the body's start, control characters escaped.
        assert_eq!(
            answer_reason(b"Not Found\r\n").as_deref(),
            Some(r#""Not Found""#)
        );
        assert_eq!(
            answer_reason(b"bad\x01 \xffthing").as_deref(),
            Some("\"bad\\u{1} \u{fffd}thing\"")
        );
        assert_eq!(
            answer_reason(br#"{"detail": [{"msg": "field required"}]}"#).as_deref(),
            Some(r#""{\"detail\": [{\"msg\": \"field required\"}]}""#)
        );
        assert_eq!(answer_reason(b"  \n"), None);
        assert_eq!(answer_reason(b""), None);
        // Bounded: 200 characters of a long body, cut on a character boundary.
        let long = "é".repeat(1000);
        assert_eq!(
            answer_reason(long.as_bytes()),
            Some(format!("\"{}…\"", "é".repeat(200)))
        );
        let long = json!({"detail": "x".repeat(1000)}).to_string();
        assert_eq!(
            answer_reason(long.as_bytes()),
            Some(format!("\"{}…\"", "x".repeat(200)))
        );
    }

    #[test]
    fn pointer_parse_rules() {
        assert_eq!(Pointer::parse("").map(|_| ()), Err(PointerError::Root));
        assert_eq!(Pointer::parse("a").map(|_| ()), Err(PointerError::NoSlash));
        assert_eq!(Pointer::parse("/~").map(|_| ()), Err(PointerError::Escape));
        assert_eq!(Pointer::parse("/").unwrap().tokens, vec![String::new()]);
        assert_eq!(
            Pointer::parse("/a~1b/~0").unwrap().tokens,
            vec!["a/b".to_string(), "~".to_string()]
        );
    }

    fn stream_oracle(
        text: Option<&str>,
        usage: Option<Value>,
        events: Option<Vec<Value>>,
        ignore: &[&str],
    ) -> Oracle {
        let so = StreamOracle {
            text: text.map(str::to_string),
            usage: usage.map(|u| (u, IgnoreTrie::default())),
            events: events.map(|es| {
                es.into_iter()
                    .map(|e| match e {
                        Value::String(s) => EventExpect::Text(s),
                        v => EventExpect::Json(v, IgnoreTrie::default()),
                    })
                    .collect()
            }),
            ignore_paths: vec![],
            require_done: false,
        };
        let mut o = Oracle::Stream(Box::new(so));
        o.add_ignore_paths(ignore.iter().map(|p| Pointer::parse(p).unwrap()).collect())
            .unwrap();
        o
    }

    const STREAM: &str = concat!(
        "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"}}]}\n\n",
        "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\"}}]}\n\n",
        "data: {\"id\":\"c1\",\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2}}\n\n",
        "data: [DONE]\n\n"
    );

    #[test]
    fn stream_text_and_usage() {
        let o = stream_oracle(
            Some("Hello"),
            Some(json!({"prompt_tokens": 3, "completion_tokens": 2})),
            None,
            &[],
        );
        assert_eq!(o.check(STREAM.as_bytes()), Ok(()));
        let o = stream_oracle(Some("Help"), None, None, &[]);
        let m = o.check(STREAM.as_bytes()).unwrap_err();
        assert_eq!(m.pointer.as_deref(), Some("/text"));
        assert_eq!(
            m.reason,
            r#"generated text differs at character 3: expected "Help", found "Hello""#
        );
        let o = stream_oracle(
            Some("Hello"),
            Some(json!({"prompt_tokens": 3, "completion_tokens": 2.0})),
            None,
            &[],
        );
        assert_eq!(
            o.check(STREAM.as_bytes()).unwrap_err().pointer.as_deref(),
            Some("/usage/completion_tokens")
        );
        let no_usage = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"}}]}\n\ndata: [DONE]\n\n";
        let o = stream_oracle(Some("Hello"), Some(json!({})), None, &[]);
        assert_eq!(
            o.check(no_usage.as_bytes()).unwrap_err().pointer.as_deref(),
            Some("/usage")
        );
    }

    #[test]
    fn stream_events_exact_with_ignore_paths() {
        let ev =
            |c: &str| json!({"id": "other", "choices": [{"index": 0, "delta": {"content": c}}]});
        let usage = json!({"id": "zzz", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}});
        let o = stream_oracle(
            None,
            None,
            Some(vec![ev("Hel"), ev("lo"), usage.clone(), json!("[DONE]")]),
            &["/id"],
        );
        assert_eq!(o.check(STREAM.as_bytes()), Ok(()));
        let o = stream_oracle(
            None,
            None,
            Some(vec![ev("Hel"), ev("lo!"), usage.clone(), json!("[DONE]")]),
            &["/id"],
        );
        assert_eq!(
            o.check(STREAM.as_bytes()).unwrap_err().pointer.as_deref(),
            Some("/events/1/choices/0/delta/content")
        );
        let o = stream_oracle(None, None, Some(vec![ev("Hel"), ev("lo"), usage]), &["/id"]);
        let m = o.check(STREAM.as_bytes()).unwrap_err();
        assert_eq!(
            (m.pointer.as_deref(), m.reason.as_str()),
            (
                Some("/events/3"),
                "unexpected event (expected 3 events, found 4)"
            )
        );
        // Without the ignore path the volatile id is compared.
        let o = stream_oracle(None, None, Some(vec![ev("Hel")]), &[]);
        assert_eq!(
            o.check(STREAM.as_bytes()).unwrap_err().pointer.as_deref(),
            Some("/events/0/id")
        );
    }

    #[test]
    fn floats_are_compared_as_correctly_rounded_doubles() {
        // Found by fuzzing: without correct rounding, the same number written two ways
        // (or written back out) could parse to two different doubles.
        let o = Oracle::json(
            serde_json::from_str("7.777777777777755555555555555573777775777505e40").unwrap(),
            vec![],
        )
        .unwrap();
        assert_eq!(check(&o, "7.777777777777756e40"), Ok(()));
        let o = oracle(json!({"p": 0.1}), &[]);
        assert_eq!(
            check(&o, r#"{"p": 0.1000000000000000055511151231257827}"#),
            Ok(())
        );
        assert_eq!(
            ptr(check(&o, r#"{"p": 0.10000000000000002}"#)),
            Some("/p".into())
        );
    }
}
