//! Which oracle a frozen request gets (`freeze --oracle`): its recorded answer, exactly
//! (`exact`), or the contract the request itself declares (`schema`): the JSON Schema of
//! its `response_format: {"type": "json_schema", ...}` as `expected_schema`, or, for a
//! request with `tools` whose recorded answer called one (streamed: carried no text), an
//! `expected_tool_calls` against its own tools. `auto` (the default) keeps the exact
//! answer where the request's repeats agreed (or it was seen once) and takes the contract
//! where they differed, so a nondeterministic server's answers are judged by what they
//! must keep rather than by one sample of them; and a streamed tool call always gets its
//! contract (the exact oracle of a stream is its text, which a tool call leaves empty).

use serde::Deserialize;
use serde_json::Value;

use super::sessions::Chains;
use crate::oracle::contract::compile_schema;

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

/// What a request declares of the answer it wants (the fields a contract is taken from).
#[derive(Deserialize)]
struct Declared {
    #[serde(default)]
    tools: Option<Vec<DeclaredTool>>,
    #[serde(default)]
    tool_choice: Option<Value>,
    #[serde(default)]
    response_format: Option<ResponseFormat>,
}

#[derive(Deserialize)]
struct DeclaredTool {
    #[serde(default)]
    function: Option<DeclaredFunction>,
}

#[derive(Deserialize)]
struct DeclaredFunction {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    parameters: Option<Value>,
}

#[derive(Deserialize)]
struct ResponseFormat {
    #[serde(rename = "type", default)]
    kind: Option<String>,
    #[serde(default)]
    json_schema: Option<JsonSchemaFormat>,
}

#[derive(Deserialize)]
struct JsonSchemaFormat {
    #[serde(default)]
    schema: Option<Value>,
}

/// Why a declared contract is not taken: the words for stderr.
type NotTaken = String;

/// The contract variant `v` declares, if any: tool calls where its request has `tools`,
/// its recorded answer called one, and it is not a session's chat turn (whose tools are
/// its case's template's, which a turn's oracle does not see yet); else the schema of its
/// `response_format`. `Err` when the declared contract cannot be judged (a schema or a
/// tool's parameters that do not compile, a tool without a name, a name twice): the
/// request keeps its exact answer.
fn declared(v: &Variant, in_session: bool) -> Result<Option<Pick>, NotTaken> {
    let Body::Json(req) = &v.body else {
        return Ok(None);
    };
    let Ok(d) = Declared::deserialize(req) else {
        return Ok(None);
    };
    let none = d.tool_choice.as_ref().and_then(Value::as_str) == Some("none");
    if let Some(tools) = d.tools.filter(|t| !t.is_empty() && !none)
        && v.called_tools
        && !in_session
    {
        let mut names = Vec::with_capacity(tools.len());
        for t in &tools {
            let f = t.function.as_ref();
            let Some(name) = f.and_then(|f| f.name.as_deref()).filter(|n| !n.is_empty()) else {
                return Err("a tool has no function.name".into());
            };
            if names.contains(&name) {
                return Err(format!("the tool '{name}' is declared twice"));
            }
            names.push(name);
            if let Some(p) = f.and_then(|f| f.parameters.as_ref()) {
                compile_schema(p)
                    .map_err(|e| format!("the tool '{name}''s parameters do not compile: {e}"))?;
            }
        }
        return Ok(Some(Pick::ToolCalls));
    }
    let Some(format) = d
        .response_format
        .filter(|f| f.kind.as_deref() == Some("json_schema"))
    else {
        return Ok(None);
    };
    let Some(schema) = format.json_schema.and_then(|j| j.schema) else {
        return Ok(None);
    };
    compile_schema(&schema)
        .map_err(|e| format!("its response_format schema does not compile: {e}"))?;
    Ok(Some(Pick::Schema(schema)))
}

/// Whether `v`'s exact oracle cannot see what its contract judges: a streamed answer's
/// oracle is its text, and a streamed tool call carries none.
fn blind(v: &Variant, p: &Pick) -> bool {
    matches!(p, Pick::ToolCalls) && matches!(v.first, Answer::StreamText(_))
}

/// Give each variant its contract under `choice` (`Variant::contract`; `None`: its
/// exact answer), and say per case what was chosen and what could not be (`names`: the
/// cases' names; `chains`: the sessions each case is frozen as).
pub(crate) fn apply(
    cases: &mut [Case],
    choice: OracleChoice,
    (names, chains): (&[String], &[Option<Chains>]),
    lines: &mut Vec<String>,
) {
    if choice == OracleChoice::Exact {
        return;
    }
    for (ci, c) in cases.iter_mut().enumerate() {
        let in_session: Vec<bool> = (0..c.variants.len())
            .map(|vi| {
                chains
                    .get(ci)
                    .and_then(Option::as_ref)
                    .is_some_and(|ch| ch.sessions.iter().any(|s| s.contains(&vi)))
            })
            .collect();
        for (vi, v) in c.variants.iter_mut().enumerate() {
            v.contract = match declared(v, in_session[vi]) {
                Ok(pick) => {
                    pick.filter(|p| choice == OracleChoice::Schema || v.differed > 0 || blind(v, p))
                }
                Err(why) => {
                    let name = names.get(ci).map_or("", String::as_str);
                    lines.push(format!(
                        "case '{name}': a request's declared contract cannot be judged ({why}): it keeps its exact answer"
                    ));
                    None
                }
            };
        }
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use serde_json::json;

    use super::super::collect::CaseKey;
    use super::*;

    fn variant(req: Value, called_tools: bool, differed: u64) -> Variant {
        Variant {
            body: Body::Json(req),
            first: Answer::Json(json!({})),
            answers: 1 + differed,
            volatile: BTreeSet::new(),
            differed,
            first_difference: None,
            prompt_tokens: None,
            source_name: None,
            session: None,
            called_tools,
            contract: None,
        }
    }

    #[test]
    fn a_declared_contract_is_taken_only_where_it_can_be_judged() {
        let schema = json!({"type": "object"});
        let format = |s: Value| json!({"response_format": {"type": "json_schema", "json_schema": {"schema": s}}});
        let tools = json!({"tools": [{"type": "function", "function": {"name": "f"}}]});
        let mut cases = vec![Case {
            key: CaseKey {
                method: "POST".into(),
                path: "/v1/chat/completions".into(),
                content_type: None,
                headers: Vec::new(),
                status: 200,
            },
            variants: vec![
                variant(format(schema.clone()), false, 1),
                variant(format(schema.clone()), false, 0),
                variant(format(json!({"type": "nope"})), false, 1),
                variant(tools.clone(), true, 1),
                variant(tools.clone(), false, 1),
            ],
        }];
        let names = ["chat".to_string()];
        let mut lines = Vec::new();
        apply(
            &mut cases,
            OracleChoice::Auto,
            (&names, &[None]),
            &mut lines,
        );
        let picks: Vec<Option<Pick>> = cases[0]
            .variants
            .iter()
            .map(|v| v.contract.clone())
            .collect();
        assert_eq!(
            picks,
            [
                Some(Pick::Schema(schema)),
                None,
                None,
                Some(Pick::ToolCalls),
                None
            ],
            "repeats agreed: exact; a schema that does not compile: exact; an answer that called no tool: no tool-call contract"
        );
        assert!(
            lines
                .iter()
                .any(|l| l.contains("its response_format schema does not compile")),
            "{lines:?}"
        );
        // Where a case is frozen as sessions, its turns take no tool-call contract.
        let chains = Chains {
            template: Default::default(),
            sessions: vec![vec![3]],
            header: None,
        };
        apply(
            &mut cases,
            OracleChoice::Schema,
            (&names, &[Some(chains)]),
            &mut lines,
        );
        assert_eq!(cases[0].variants[3].contract, None);
        assert!(
            cases[0].variants[1].contract.is_some(),
            "--oracle schema takes agreeing repeats too"
        );
    }
}
