//! Which oracle a frozen request gets (`freeze --oracle`): its recorded answer, exactly
//! (`exact`), or the contract the request itself declares (`schema`): the JSON Schema of
//! its `response_format: {"type": "json_schema", ...}` as `expected_schema`, or, for a
//! request with `tools` whose recorded answer called one (streamed: carried no text), an
//! `expected_tool_calls` against its own tools. `auto` (the default) keeps the exact
//! answer where the request's repeats agreed (or it was seen once) and takes the contract
//! where they differed, so a nondeterministic server's answers are judged by what they
//! must keep rather than by one sample of them; and a streamed tool call always gets its
//! contract (the exact oracle of a stream is its text, which a tool call leaves empty).

use serde_json::Value;

use super::collect::{Answer, Body, Case, Pick, Variant};

/// `freeze --oracle`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum OracleChoice {
    /// The recorded answer, every request.
    Exact,
    /// The declared contract wherever a request declares one.
    Schema,
    /// The declared contract where repeats differed; the exact answer elsewhere.
    #[default]
    Auto,
}

/// The contract variant `v` declares, if any: tool calls where its request has `tools`
/// and its recorded answer called one, else the schema of its `response_format`.
fn declared(v: &Variant) -> Option<Pick> {
    let Body::Json(req) = &v.body else {
        return None;
    };
    let tools = req
        .get("tools")
        .and_then(Value::as_array)
        .is_some_and(|t| !t.is_empty())
        && req.get("tool_choice").and_then(Value::as_str) != Some("none");
    let called = match &v.first {
        Answer::Json(a) => a
            .pointer("/choices/0/message/tool_calls")
            .and_then(Value::as_array)
            .is_some_and(|c| !c.is_empty()),
        Answer::StreamText(t) => t.is_empty(),
        Answer::Events(_) | Answer::Text(_) => false,
    };
    if tools && called {
        return Some(Pick::ToolCalls);
    }
    let format = req.get("response_format")?;
    if format.get("type").and_then(Value::as_str) != Some("json_schema") {
        return None;
    }
    format
        .pointer("/json_schema/schema")
        .cloned()
        .map(Pick::Schema)
}

/// Whether `v`'s exact oracle cannot see what its contract judges: a streamed answer's
/// oracle is its text, and a streamed tool call carries none.
fn blind(v: &Variant, p: &Pick) -> bool {
    matches!(p, Pick::ToolCalls) && matches!(v.first, Answer::StreamText(_))
}

/// Give each variant its contract under `choice` (`Variant::contract`; `None`: its
/// exact answer), and say per case what was chosen (`names`: the cases' names).
pub(crate) fn apply(
    cases: &mut [Case],
    choice: OracleChoice,
    names: &[String],
    lines: &mut Vec<String>,
) {
    for v in cases.iter_mut().flat_map(|c| c.variants.iter_mut()) {
        v.contract = match choice {
            OracleChoice::Exact => None,
            OracleChoice::Schema => declared(v),
            OracleChoice::Auto => declared(v).filter(|p| v.differed > 0 || blind(v, p)),
        };
    }
    say(cases, names, choice, lines);
}

/// A line per case that holds a contract: how many of its requests each oracle judges.
fn say(cases: &[Case], names: &[String], choice: OracleChoice, lines: &mut Vec<String>) {
    for (c, name) in cases.iter().zip(names) {
        let n = |kind: &str| {
            c.variants
                .iter()
                .filter_map(|v| v.contract.as_ref())
                .filter(|p| p.kind() == kind)
                .count()
        };
        let (schema, calls) = (n("expected_schema"), n("expected_tool_calls"));
        if schema + calls == 0 {
            continue;
        }
        let exact = c.variants.len() - schema - calls;
        let why = match choice {
            OracleChoice::Auto => {
                "each declares its contract, and its repeats differed or it is a streamed tool call (whose text an exact oracle would judge)"
            }
            _ => "--oracle schema: each declares its contract",
        };
        lines.push(format!(
            "case '{name}': {schema} request(s) judged by expected_schema (their own response_format schema), {calls} by expected_tool_calls (their own tools), {exact} by their exact answer: {why}"
        ));
    }
}
