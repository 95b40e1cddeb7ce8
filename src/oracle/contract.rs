//! Contract oracles: what an application relies on in an answer that need not be the same
//! text twice (a server under batching rarely answers byte for byte alike). Each judges
//! the answer as the application reads it: a chat answer's content (`choices[0].message.
//! content`, a completion's `choices[0].text`, a stream's deltas joined) or its tool calls
//! (a stream's pieces merged by index first, `answer.rs`), or the whole JSON body.
//!
//! - [`Contract::Schema`]: the content parsed as JSON (or the body) satisfies a JSON Schema
//!   (draft 2020-12, or draft 7 by its `$schema`), compiled once at plan load;
//! - [`Contract::ToolCalls`]: the answer calls tools, each named among the request's own
//!   `tools` with `arguments` that parse and satisfy that tool's `parameters`; optionally
//!   the names (in order, or in any order) and their count;
//! - [`Contract::Choice`]: the content, trimmed (and case-folded if asked), is one of a list;
//! - [`Contract::Pattern`]: a regular expression (linear time) matches the content.
//!
//! A mismatch's pointer names where in the virtual document `{"content": ...,
//! "tool_calls": [...]}` (or, for a schema of the body, in the body) the contract broke.

use std::sync::Arc;

use serde_json::Value;

use super::answer::ToolCall;
use super::pointer::Mismatch;

/// The most bytes a compiled regular expression may take (`expected_pattern`, and a
/// schema's `pattern`s): a larger one is refused at `validate`.
pub(crate) const PATTERN_SIZE_LIMIT: usize = 1 << 20;

/// A contract an answer must keep.
#[derive(Clone)]
pub(crate) enum Contract {
    Schema {
        schema: Arc<jsonschema::Validator>,
        of: SchemaOf,
    },
    ToolCalls(ToolCalls),
    /// `one_of` case-folded already when `case_fold`.
    Choice {
        one_of: Vec<String>,
        case_fold: bool,
    },
    Pattern(regex::Regex),
}

/// What a schema judges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SchemaOf {
    /// The answer's text content parsed as JSON (structured output).
    Content,
    /// The whole JSON response.
    Body,
}

/// `expected_tool_calls`: the tools the request declares, and what the calls must be.
#[derive(Clone, Debug)]
pub(crate) struct ToolCalls {
    pub(crate) tools: Vec<Tool>,
    /// The calls' names, exactly (in order, or as a multiset when `ordered` is false).
    pub(crate) names: Option<Vec<String>>,
    pub(crate) ordered: bool,
    pub(crate) count: Option<usize>,
}

/// A tool a request declares: its name and its `parameters` schema, compiled (`None`:
/// it declares none, and any JSON arguments do).
#[derive(Clone)]
pub(crate) struct Tool {
    pub(crate) name: String,
    pub(crate) parameters: Option<Arc<jsonschema::Validator>>,
}

impl std::fmt::Debug for Tool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tool").field("name", &self.name).finish()
    }
}

impl std::fmt::Debug for Contract {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Contract::Schema { of, .. } => f.debug_struct("Schema").field("of", of).finish(),
            Contract::ToolCalls(t) => t.fmt(f),
            Contract::Choice { one_of, case_fold } => f
                .debug_struct("Choice")
                .field("one_of", one_of)
                .field("case_fold", case_fold)
                .finish(),
            Contract::Pattern(re) => f.debug_tuple("Pattern").field(re).finish(),
        }
    }
}

/// Why a schema cannot be compiled: the validator's words and where in the schema.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}{at}")]
pub(crate) struct SchemaError {
    message: String,
    /// ` (at /properties/x/type)`, or empty at the schema's root.
    at: String,
}

/// Compile a JSON Schema as contracts use it: its draft from its `$schema` (2020-12
/// when it names none), no reference fetched from anywhere (a remote `$ref` is an
/// error), `pattern`s under the linear-time `regex` engine within [`PATTERN_SIZE_LIMIT`].
pub(crate) fn compile_schema(schema: &Value) -> Result<Arc<jsonschema::Validator>, SchemaError> {
    jsonschema::options()
        .offline()
        .with_pattern_options(jsonschema::PatternOptions::regex().size_limit(PATTERN_SIZE_LIMIT))
        .build(schema)
        .map(Arc::new)
        .map_err(|e| {
            let at = e.schema_path().to_string();
            SchemaError {
                message: e.to_string(),
                at: if at.is_empty() {
                    String::new()
                } else {
                    format!(" (at {})", cut(&at))
                },
            }
        })
}

impl Contract {
    /// The oracle kind, as documents name it.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Contract::Schema { .. } => "schema",
            Contract::ToolCalls(_) => "tool_calls",
            Contract::Choice { .. } => "choice",
            Contract::Pattern(_) => "pattern",
        }
    }

    /// Judge an answer (`stream`: it is an event stream, read as its deltas).
    pub(crate) fn judge(&self, body: &[u8], stream: bool) -> Result<(), Mismatch> {
        match self {
            Contract::Schema {
                schema,
                of: SchemaOf::Body,
            } => {
                let v: Value = serde_json::from_slice(body)
                    .map_err(|e| mismatch("", format!("the answer is not JSON ({e})")))?;
                fits(schema, &v, "")
            }
            Contract::Schema { schema, .. } => {
                let text = content(body, stream)?;
                let v: Value = serde_json::from_str(&text).map_err(|e| {
                    mismatch(
                        "/content",
                        format!("the content is not JSON ({e}): {}", cut(&text)),
                    )
                })?;
                fits(schema, &v, "/content")
            }
            Contract::Choice { one_of, case_fold } => {
                let text = content(body, stream)?;
                let t = text.trim();
                // A case-folded contract's choices were folded once, at plan load.
                let folded = case_fold.then(|| t.to_lowercase());
                let t = folded.as_deref().unwrap_or(t);
                let hit = one_of.iter().any(|c| c == t);
                if hit {
                    return Ok(());
                }
                Err(mismatch(
                    "/content",
                    format!("'{}' is not one of the {} choices", cut(t), one_of.len()),
                ))
            }
            Contract::Pattern(re) => {
                let text = content(body, stream)?;
                if re.is_match(&text) {
                    return Ok(());
                }
                Err(mismatch(
                    "/content",
                    format!("'{}' does not match /{}/", cut(&text), re.as_str()),
                ))
            }
            Contract::ToolCalls(t) => t.judge(&tool_calls(body, stream)?),
        }
    }
}

impl ToolCalls {
    fn judge(&self, calls: &[ToolCall]) -> Result<(), Mismatch> {
        if calls.is_empty() {
            return Err(mismatch(
                "/tool_calls",
                "the answer calls no tool (the oracle expects tool calls)".into(),
            ));
        }
        if let Some(n) = self.count.filter(|&n| n != calls.len()) {
            return Err(mismatch(
                "/tool_calls",
                format!("expected {n} tool call(s), found {}", calls.len()),
            ));
        }
        let mut names = Vec::with_capacity(calls.len());
        for (i, call) in calls.iter().enumerate() {
            names.push(self.one_call(i, call)?);
        }
        let Some(want) = &self.names else {
            return Ok(());
        };
        let same = if self.ordered {
            want.iter().map(String::as_str).eq(names.iter().copied())
        } else {
            let mut a: Vec<&str> = want.iter().map(String::as_str).collect();
            let mut b = names.clone();
            a.sort_unstable();
            b.sort_unstable();
            a == b
        };
        if same {
            return Ok(());
        }
        let order = if self.ordered {
            "in this order"
        } else {
            "in any order"
        };
        Err(mismatch(
            "/tool_calls",
            format!("expected the calls {want:?} {order}, found {names:?}"),
        ))
    }

    /// Call `i`: its name declared by the request, its arguments JSON that fit the tool's
    /// parameters; its name.
    fn one_call<'c>(&self, i: usize, call: &'c ToolCall) -> Result<&'c str, Mismatch> {
        let at = format!("/tool_calls/{i}/function");
        let Some(name) = call.function.name.as_deref() else {
            return Err(mismatch(&at, "the call has no function.name".into()));
        };
        let Some(tool) = self.tools.iter().find(|t| t.name == name) else {
            let declared: Vec<&str> = self.tools.iter().map(|t| t.name.as_str()).collect();
            return Err(mismatch(
                &format!("{at}/name"),
                format!(
                    "calls '{}', which the request's tools do not declare ({declared:?})",
                    cut(name)
                ),
            ));
        };
        let at = format!("{at}/arguments");
        // OpenAI's arguments are a JSON text; a server that sends the object is read as is.
        let args = match &call.function.arguments {
            Some(Value::String(s)) => serde_json::from_str::<Value>(s).map_err(|e| {
                mismatch(&at, format!("the arguments are not JSON ({e}): {}", cut(s)))
            })?,
            Some(v @ Value::Object(_)) => v.clone(),
            _ => return Err(mismatch(&at, "the call has no arguments".into())),
        };
        if let Some(schema) = &tool.parameters {
            fits(schema, &args, &at)?;
        }
        Ok(name)
    }
}

/// The first way `v` breaks `schema`, at `at` + the value's own path.
fn fits(schema: &jsonschema::Validator, v: &Value, at: &str) -> Result<(), Mismatch> {
    match schema.iter_errors(v).next() {
        None => Ok(()),
        Some(e) => Err(mismatch(
            &cut(&format!("{at}{}", e.instance_path())),
            format!("does not fit the schema: {}", cut(&e.to_string())),
        )),
    }
}

/// The answer's text: a stream's content deltas joined (a chat's or a completion's), or a
/// JSON answer's `choices[0].message.content` or `choices[0].text`.
fn content(body: &[u8], stream: bool) -> Result<String, Mismatch> {
    if stream {
        let events = crate::sse::parse_all(body).map_err(|e| {
            mismatch(
                "",
                format!("the answer is not a readable event stream ({e})"),
            )
        })?;
        let mut tracker = crate::sse::StreamTracker::default();
        events.iter().for_each(|e| tracker.on_event(e));
        return Ok(tracker.text);
    }
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| mismatch("", format!("the answer is not JSON ({e})")))?;
    super::answer::json_text(&v).ok_or_else(|| {
        mismatch(
            "/content",
            "the answer has no text content (choices[0].message.content or choices[0].text)".into(),
        )
    })
}

/// The answer's tool calls (a stream's pieces merged), none when it made none.
fn tool_calls(body: &[u8], stream: bool) -> Result<Vec<ToolCall>, Mismatch> {
    super::answer::tool_calls(body, stream).map_err(|e| {
        mismatch(
            "/tool_calls",
            format!("the answer's message cannot be read: {e}"),
        )
    })
}

fn mismatch(pointer: &str, reason: String) -> Mismatch {
    Mismatch {
        pointer: Some(pointer.to_string()),
        reason,
    }
}

/// A peer's text in a message: at most 120 characters.
fn cut(s: &str) -> String {
    super::text::cut(s, 120)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_schema_pattern_matches_in_linear_time_and_a_ref_cycle_compiles() {
        // Long repetitions over a long answer: linear matchers, no backtracking blow-up.
        let long = json!({"type": "string", "pattern": "^(a|b)\\w{1000}(c|d)\\w{1000}x$"});
        let v = compile_schema(&long).unwrap();
        assert!(!v.is_valid(&json!("a".repeat(100_000))));
        let fine = json!({"type": "string", "pattern": "^(a|b)\\w{10}$"});
        assert!(compile_schema(&fine).is_ok_and(|v| v.is_valid(&json!("a0123456789"))));
        // References that lead to each other in a loop: compiled once, judged at once.
        let cycle = json!({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
            "$ref": "#/$defs/a"});
        let v = compile_schema(&cycle).unwrap();
        assert!(v.is_valid(&json!(1)));
    }
}
