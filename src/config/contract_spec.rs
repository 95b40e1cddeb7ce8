//! A request's contract oracle as a plan declares it, resolved into
//! [`crate::oracle::contract`]'s types: `expected_schema` (with `schema_of`),
//! `expected_tool_calls` (against the request's own `tools`), `expected_choice` (with
//! `case_fold`) or `expected_pattern`; and `tolerance` beside an `expected_response`.
//! Every schema and pattern is compiled here, once, at plan load; a schema that does not
//! compile, a remote `$ref` and a pattern over the size bound are refused with their path.

use serde_json::{Map, Value};

use super::json::{Validator, join};
use crate::oracle::contract::{
    Contract, PATTERN_SIZE_LIMIT, SchemaOf, Tool, ToolCalls, compile_schema,
};
use crate::oracle::tolerance::{Tol, TolNode};
use crate::oracle::{Oracle, Pointer, json_kind};

/// The contract oracles' fields (each one request's only oracle, as the exact ones are).
pub(super) const CONTRACT_FIELDS: &[&str] = &[
    "expected_schema",
    "expected_tool_calls",
    "expected_choice",
    "expected_pattern",
];

/// Fields that refine one oracle, each with the oracle it goes with.
const MODIFIERS: &[(&str, &str)] = &[
    ("schema_of", "expected_schema"),
    ("case_fold", "expected_choice"),
    ("tolerance", "expected_response"),
];

/// The most choices `expected_choice` holds.
const MAX_CHOICES: usize = 10_000;

impl Validator {
    /// Each modifier of `m` without its oracle is refused; false when one was.
    pub(super) fn modifiers_alone(&mut self, m: &Map<String, Value>, path: &str) -> bool {
        let mut ok = true;
        for (field, with) in MODIFIERS {
            if m.contains_key(*field) && !m.contains_key(*with) {
                self.err(join(path, field), format!("goes with {with}"));
                ok = false;
            }
        }
        ok
    }

    /// The contract oracle `field` (one of [`CONTRACT_FIELDS`]) of request `m`.
    pub(super) fn contract_oracle(
        &mut self,
        m: &Map<String, Value>,
        path: &str,
        field: &str,
    ) -> Option<Oracle> {
        let p = join(path, field);
        let v = m.get(field)?;
        let contract = match field {
            "expected_schema" => self.schema_contract(m, path, v),
            "expected_tool_calls" => self.tool_calls_contract(m, path, v),
            "expected_choice" => self.choice_contract(m, path, v),
            _ => self.pattern_contract(&p, v),
        };
        contract.map(|c| Oracle::Contract(Box::new(c)))
    }

    /// `expected_schema`: a JSON Schema (an object or a boolean), of the content (the
    /// default) or of the whole body (`schema_of: "body"`, not for a stream).
    fn schema_contract(
        &mut self,
        m: &Map<String, Value>,
        path: &str,
        v: &Value,
    ) -> Option<Contract> {
        let p = join(path, "expected_schema");
        let of = match m.get("schema_of").map(|v| (v, v.as_str())) {
            None | Some((_, Some("content"))) => SchemaOf::Content,
            Some((_, Some("body"))) if asks_stream(m) => {
                self.err(
                    join(path, "schema_of"),
                    "\"body\" judges one JSON document, and the request asks for a stream (\"stream\": true): use \"content\" (the deltas' text parsed as JSON)",
                );
                return None;
            }
            Some((_, Some("body"))) => SchemaOf::Body,
            Some((other, _)) => {
                self.err(
                    join(path, "schema_of"),
                    format!("must be \"content\" (the answer's text parsed as JSON) or \"body\" (the whole response), found {other}"),
                );
                return None;
            }
        };
        let schema = self.schema(v, &p)?;
        Some(Contract::Schema { schema, of })
    }

    /// A JSON Schema at `p`, compiled.
    fn schema(&mut self, v: &Value, p: &str) -> Option<std::sync::Arc<jsonschema::Validator>> {
        if !matches!(v, Value::Object(_) | Value::Bool(_)) {
            self.err(
                p,
                format!(
                    "must be a JSON Schema (an object, or true / false), found {}",
                    json_kind(v)
                ),
            );
            return None;
        }
        match compile_schema(v) {
            Ok(s) => Some(s),
            Err(e) => {
                self.err(p, format!("is not a schema this build can use: {e}; a schema is draft 2020-12 (or draft 7 by its $schema), with no remote $ref"));
                None
            }
        }
    }

    /// `expected_tool_calls`: `{}` (any calls of declared tools with fitting arguments),
    /// with optional `names` (in order) or `names_any_order`, and `count`; the request
    /// must declare its `tools`.
    fn tool_calls_contract(
        &mut self,
        m: &Map<String, Value>,
        path: &str,
        v: &Value,
    ) -> Option<Contract> {
        let p = join(path, "expected_tool_calls");
        let spec = self.object(v, &p)?;
        self.unknown_fields(spec, &p, &[&["names", "names_any_order", "count"]]);
        let tools = self.tools(m, path)?;
        if spec.contains_key("names") && spec.contains_key("names_any_order") {
            self.err(&p, "give names (in order) or names_any_order, not both");
            return None;
        }
        let (names, ordered) = match (spec.get("names"), spec.get("names_any_order")) {
            (Some(n), _) => (Some(self.call_names(n, &join(&p, "names"), &tools)?), true),
            (_, Some(n)) => (
                Some(self.call_names(n, &join(&p, "names_any_order"), &tools)?),
                false,
            ),
            _ => (None, true),
        };
        let count = match spec.get("count") {
            None => None,
            Some(c) => Some(self.integer(c, &join(&p, "count"), 1)?),
        };
        if let (Some(n), Some(c)) = (&names, count)
            && n.len() != c
        {
            self.err(
                join(&p, "count"),
                format!("is {c}, but names lists {} calls", n.len()),
            );
            return None;
        }
        Some(Contract::ToolCalls(ToolCalls {
            tools,
            names,
            ordered,
            count,
        }))
    }

    /// The request's `tools`, each `{"type": "function", "function": {"name", "parameters"}}`,
    /// its parameters compiled.
    fn tools(&mut self, m: &Map<String, Value>, path: &str) -> Option<Vec<Tool>> {
        let p = join(path, "request.tools");
        let Some(Value::Array(list)) = m.get("request").and_then(|r| r.get("tools")) else {
            self.err(
                join(path, "expected_tool_calls"),
                "needs the request's own tools (request.tools, a non-empty list of {\"type\": \"function\", \"function\": {\"name\", \"parameters\"}}): each call is judged against the tool it names",
            );
            return None;
        };
        let mut out = Vec::with_capacity(list.len());
        for (i, t) in list.iter().enumerate() {
            let at = format!("{p}[{i}].function");
            let name = t.pointer("/function/name").and_then(Value::as_str);
            let Some(name) = name.filter(|n| !n.is_empty()) else {
                self.err(
                    &at,
                    "needs a name (function.name): a call names the tool it calls",
                );
                return None;
            };
            let parameters = match t.pointer("/function/parameters") {
                None => None,
                Some(s) => Some(self.schema(s, &join(&at, "parameters"))?),
            };
            if out.iter().any(|o: &Tool| o.name == name) {
                self.err(join(&at, "name"), format!("'{name}' is declared twice"));
                return None;
            }
            out.push(Tool {
                name: name.to_string(),
                parameters,
            });
        }
        if out.is_empty() {
            self.err(&p, "is empty: declare the tools a call may name");
            return None;
        }
        Some(out)
    }

    /// A non-empty list of the request's tools' names.
    fn call_names(&mut self, v: &Value, p: &str, tools: &[Tool]) -> Option<Vec<String>> {
        let names = self.strings(v, p, "tool names")?;
        if let Some(n) = names.iter().find(|n| !tools.iter().any(|t| t.name == **n)) {
            self.err(p, format!("'{n}' is not one of the request's tools"));
            return None;
        }
        Some(names)
    }

    /// `expected_choice`: the answer's trimmed content is one of these (each compared
    /// whole; `case_fold: true` ignores case).
    fn choice_contract(
        &mut self,
        m: &Map<String, Value>,
        path: &str,
        v: &Value,
    ) -> Option<Contract> {
        let p = &join(path, "expected_choice");
        let one_of = self.strings(v, p, "choices")?;
        if one_of.len() > MAX_CHOICES {
            self.err(
                p,
                format!("holds {} choices, more than {MAX_CHOICES}", one_of.len()),
            );
            return None;
        }
        let case_fold = match m.get("case_fold") {
            None => false,
            Some(Value::Bool(b)) => *b,
            Some(other) => {
                self.err(
                    join(path, "case_fold"),
                    format!("must be true or false, found {}", json_kind(other)),
                );
                return None;
            }
        };
        // Folded once here: an answer is folded once, not once per choice.
        let one_of = if case_fold {
            one_of.iter().map(|c| c.to_lowercase()).collect()
        } else {
            one_of
        };
        Some(Contract::Choice { one_of, case_fold })
    }

    /// `expected_pattern`: a regular expression (the `regex` crate's syntax: linear time,
    /// no look-around or back-references) that must match somewhere in the content
    /// (anchor it with `^...$` for the whole).
    fn pattern_contract(&mut self, p: &str, v: &Value) -> Option<Contract> {
        let s = self.nonblank(v, p)?;
        match regex::RegexBuilder::new(s)
            .size_limit(PATTERN_SIZE_LIMIT)
            .build()
        {
            Ok(re) => Some(Contract::Pattern(re)),
            Err(regex::Error::CompiledTooBig(n)) => {
                self.err(p, format!("compiles to more than {n} bytes: a pattern is bounded (the regex crate's size limit), so judging stays cheap under load; simplify it"));
                None
            }
            Err(e) => {
                self.err(p, format!("is not a regular expression: {e}"));
                None
            }
        }
    }

    /// A non-empty list of strings (`what` names them).
    fn strings(&mut self, v: &Value, p: &str, what: &str) -> Option<Vec<String>> {
        match v {
            Value::Array(a) if !a.is_empty() && a.iter().all(Value::is_string) => Some(
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect(),
            ),
            other => {
                self.err(
                    p,
                    format!(
                        "must be a non-empty list of {what} (strings), found {}",
                        json_kind(other)
                    ),
                );
                None
            }
        }
    }

    /// `tolerance` beside `expected_response`: `{"abs", "rel"}` for every numeric leaf,
    /// and `paths` (pointer -> `{"abs", "rel"}`) for the leaves below a pointer; set on
    /// `oracle`. False when it is wrong.
    pub(super) fn tolerance(
        &mut self,
        m: &Map<String, Value>,
        path: &str,
        oracle: &mut Oracle,
    ) -> bool {
        let Some(v) = m.get("tolerance") else {
            return true;
        };
        let p = join(path, "tolerance");
        let Some(t) = self.object(v, &p) else {
            return false;
        };
        self.unknown_fields(t, &p, &[&["abs", "rel", "paths"]]);
        let whole = if t.contains_key("abs") || t.contains_key("rel") {
            match self.tol(t, &p) {
                Some(b) => Some(b),
                None => return false,
            }
        } else {
            None
        };
        let mut node = TolNode::whole(whole);
        let expected = m.get("expected_response").unwrap_or(&Value::Null);
        match t.get("paths") {
            None if whole.is_none() => {
                self.err(&p, "give abs and/or rel (every numeric leaf), or paths (pointer -> {\"abs\", \"rel\"})");
                return false;
            }
            None => {}
            Some(paths) => {
                let pp = join(&p, "paths");
                let Some(paths) = self.object(paths, &pp) else {
                    return false;
                };
                for (ptr, b) in paths {
                    let at = format!("{pp}['{ptr}']");
                    let Ok(pointer) = Pointer::parse(ptr) else {
                        self.err(&at, "is not a JSON pointer to a part of the answer (RFC 6901, e.g. /choices/0/score)");
                        return false;
                    };
                    if pointer.resolve(expected).is_none() {
                        self.err(&at, "does not exist in expected_response");
                        return false;
                    }
                    let Some(o) = self.object(b, &at) else {
                        return false;
                    };
                    self.unknown_fields(o, &at, &[&["abs", "rel"]]);
                    let Some(b) = self.tol(o, &at) else {
                        return false;
                    };
                    node.insert(&pointer, b);
                }
            }
        }
        oracle.set_tolerance(node);
        true
    }

    /// `{"abs": a, "rel": r}`: each a finite number >= 0 (absent: 0), at least one given.
    fn tol(&mut self, o: &Map<String, Value>, p: &str) -> Option<Tol> {
        if !o.contains_key("abs") && !o.contains_key("rel") {
            self.err(p, "give abs and/or rel");
            return None;
        }
        let mut bound = |k: &str| match o.get(k) {
            None => Some(0.0),
            Some(v) => match v.as_f64() {
                Some(x) if x.is_finite() && x >= 0.0 => Some(x),
                _ => {
                    self.err(join(p, k), format!("must be a number >= 0, found {v}"));
                    None
                }
            },
        };
        let (abs, rel) = (bound("abs"), bound("rel"));
        Some(Tol {
            abs: abs?,
            rel: rel?,
        })
    }
}

/// The request asks for an event stream (`"stream": true`).
pub(super) fn asks_stream(m: &Map<String, Value>) -> bool {
    m.get("request")
        .and_then(|r| r.get("stream"))
        .and_then(Value::as_bool)
        == Some(true)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::oracle::Oracle;

    use crate::config::plan::one_case as plan;

    use serde_json::Value;

    fn oracle(case: Value) -> Oracle {
        plan(case).unwrap().cases[0].variants[0].oracle.clone()
    }

    /// A JSON chat answer with `content` and, if given, `tool_calls`.
    fn chat(content: Value, calls: Option<Value>) -> Vec<u8> {
        let mut message = json!({"role": "assistant", "content": content});
        if let Some(c) = calls {
            message["tool_calls"] = c;
        }
        json!({"choices": [{"index": 0, "message": message}]})
            .to_string()
            .into_bytes()
    }

    /// The same answer streamed: its content in pieces, each tool call's arguments split
    /// over many deltas.
    fn streamed(content: &str, calls: &[(&str, &str)]) -> Vec<u8> {
        let mut out = String::new();
        let mut event = |delta: Value| {
            let chunk = json!({"choices": [{"index": 0, "delta": delta}]});
            out.push_str(&format!("data: {chunk}\n\n"));
        };
        event(json!({"role": "assistant"}));
        for piece in content.as_bytes().chunks(3) {
            event(json!({"content": String::from_utf8_lossy(piece)}));
        }
        for (i, (name, args)) in calls.iter().enumerate() {
            event(
                json!({"tool_calls": [{"index": i, "id": format!("c{i}"), "type": "function",
                "function": {"name": name, "arguments": ""}}]}),
            );
            for piece in args.as_bytes().chunks(2) {
                event(json!({"tool_calls": [{"index": i,
                    "function": {"arguments": String::from_utf8_lossy(piece)}}]}));
            }
        }
        out.push_str("data: [DONE]\n\n");
        out.into_bytes()
    }

    fn judge(o: &Oracle, body: &[u8], stream: bool) -> Result<(), String> {
        o.judge_and_read(body, stream, None)
            .1
            .map_err(|m| m.to_string())
    }

    #[test]
    fn a_schema_judges_the_content_as_json_streamed_or_not_or_the_whole_body() {
        let schema = json!({"type": "object", "required": ["city", "days"],
            "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}}});
        let o =
            oracle(json!({"name": "s", "request": {"messages": []}, "expected_schema": schema}));
        assert_eq!(o.kind(), "schema");
        let good = r#"{"city": "Lyon", "days": 3}"#;
        assert_eq!(judge(&o, &chat(json!(good), None), false), Ok(()));
        assert_eq!(judge(&o, &streamed(good, &[]), true), Ok(()));
        let e = judge(
            &o,
            &chat(json!(r#"{"city": "Lyon", "days": 0}"#), None),
            false,
        )
        .unwrap_err();
        assert!(
            e.starts_with("at /content/days: does not fit the schema"),
            "{e}"
        );
        let e = judge(&o, &streamed("Lyon, 3 days", &[]), true).unwrap_err();
        assert!(e.starts_with("at /content: the content is not JSON"), "{e}");
        let body = oracle(json!({"name": "s", "request": {}, "schema_of": "body",
            "expected_schema": {"required": ["choices"]}}));
        assert_eq!(judge(&body, &chat(json!("x"), None), false), Ok(()));
        assert!(
            judge(&body, b"{}", false)
                .unwrap_err()
                .contains("does not fit the schema")
        );
    }

    #[test]
    fn tool_calls_name_a_declared_tool_with_arguments_that_fit_its_parameters() {
        let tools = json!([
            {"type": "function", "function": {"name": "weather", "parameters": {
                "type": "object", "required": ["city"], "properties": {"city": {"type": "string"}},
                "additionalProperties": false}}},
            {"type": "function", "function": {"name": "time"}}]);
        let o = oracle(
            json!({"name": "t", "request": {"messages": [], "tools": tools, "stream": true},
            "expected_tool_calls": {"names_any_order": ["time", "weather"]}}),
        );
        let args = r#"{"city": "Oslo"}"#;
        let both = [("weather", args), ("time", "{}")];
        assert_eq!(judge(&o, &streamed("", &both), true), Ok(()));
        let call = |name: &str, args: &str| json!({"id": "x", "type": "function", "function": {"name": name, "arguments": args}});
        let json_both = chat(
            Value::Null,
            Some(json!([call("time", "{}"), call("weather", args)])),
        );
        assert_eq!(judge(&o, &json_both, false), Ok(()));
        for (body, want) in [
            (
                streamed("It is sunny.", &[]),
                "at /tool_calls: the answer calls no tool",
            ),
            (
                streamed("", &[("weather", r#"{"town": "Oslo"}"#), ("time", "{}")]),
                "at /tool_calls/0/function/arguments: does not fit the schema",
            ),
            (
                streamed("", &[("weather", r#"{"city": "Os"#), ("time", "{}")]),
                "at /tool_calls/0/function/arguments: the arguments are not JSON",
            ),
            (
                streamed("", &[("forecast", args), ("time", "{}")]),
                "at /tool_calls/0/function/name: calls 'forecast', which the request's tools do not declare",
            ),
            (
                streamed("", &[("weather", args)]),
                "at /tool_calls: expected the calls [\"time\", \"weather\"] in any order, found [\"weather\"]",
            ),
        ] {
            let e = judge(&o, &body, true).unwrap_err();
            assert!(e.starts_with(want), "{e}");
        }
        let ordered = oracle(json!({"name": "t", "request": {"tools": tools},
            "expected_tool_calls": {"names": ["time", "weather"], "count": 2}}));
        assert!(judge(&ordered, &json_both, false).is_ok());
        let swapped = chat(
            Value::Null,
            Some(json!([call("weather", args), call("time", "{}")])),
        );
        assert!(
            judge(&ordered, &swapped, false)
                .unwrap_err()
                .contains("in this order")
        );
    }

    #[test]
    fn a_choice_and_a_pattern_judge_the_trimmed_content() {
        let o = oracle(
            json!({"name": "c", "request": {}, "expected_choice": ["Positive", "Negative"],
            "case_fold": true}),
        );
        assert_eq!(judge(&o, &chat(json!("  negative\n"), None), false), Ok(()));
        assert_eq!(judge(&o, &streamed("POSITIVE", &[]), true), Ok(()));
        let e = judge(&o, &chat(json!("neutral"), None), false).unwrap_err();
        assert_eq!(e, "at /content: 'neutral' is not one of the 2 choices");
        let strict = oracle(json!({"name": "c", "request": {}, "expected_choice": ["yes"]}));
        assert!(judge(&strict, &chat(json!("Yes"), None), false).is_err());
        let p =
            oracle(json!({"name": "p", "request": {}, "expected_pattern": r"^\d{4}-\d{2}-\d{2}$"}));
        assert_eq!(judge(&p, &chat(json!("2026-12-05"), None), false), Ok(()));
        let e = judge(&p, &streamed("on 2026-12-05", &[]), true).unwrap_err();
        assert!(
            e.starts_with("at /content: 'on 2026-12-05' does not match"),
            "{e}"
        );
        // A completion's text is its content.
        let text = json!({"choices": [{"index": 0, "text": "1999-01-31"}]}).to_string();
        assert_eq!(judge(&p, text.as_bytes(), false), Ok(()));
    }

    #[test]
    fn a_tolerance_lets_numeric_leaves_differ_within_their_bound() {
        let o = oracle(json!({"name": "n", "request": {},
            "expected_response": {"score": 0.5, "label": "a", "probs": [0.25, 0.75], "n": 3},
            "tolerance": {"abs": 0.01, "paths": {"/probs": {"rel": 0.1}}}}));
        let ok = json!({"score": 0.505, "label": "a", "probs": [0.27, 0.7], "n": 3.0});
        assert_eq!(judge(&o, ok.to_string().as_bytes(), false), Ok(()));
        for (body, want) in [
            (
                json!({"score": 0.52, "label": "a", "probs": [0.25, 0.75], "n": 3}),
                "at /score: expected 0.5 within abs 0.01, rel 0, found 0.52",
            ),
            (
                json!({"score": 0.5, "label": "b", "probs": [0.25, 0.75], "n": 3}),
                "at /label:",
            ),
            (
                json!({"score": 0.5, "label": "a", "probs": [0.2, 0.75], "n": 3}),
                "at /probs/0: expected 0.25 within abs 0, rel 0.1",
            ),
        ] {
            let e = judge(&o, body.to_string().as_bytes(), false).unwrap_err();
            assert!(e.starts_with(want), "{e}");
        }
        // Without a tolerance, 3 and 3.0 still differ.
        let exact = oracle(json!({"name": "n", "request": {}, "expected_response": {"n": 3}}));
        assert!(judge(&exact, br#"{"n": 3.0}"#, false).is_err());
    }

    #[test]
    fn contracts_that_cannot_be_judged_are_refused_with_their_path() {
        let tools =
            json!([{"type": "function", "function": {"name": "f", "parameters": {"type": 5}}}]);
        let cases = [
            (
                json!({"name": "a", "request": {}, "expected_schema": {"type": "nope"}}),
                "cases[0].expected_schema: is not a schema this build can use",
            ),
            (
                json!({"name": "a", "request": {}, "expected_schema": {"$ref": "https://example.com/s.json"}}),
                "cases[0].expected_schema: is not a schema this build can use",
            ),
            (
                json!({"name": "a", "request": {}, "expected_schema": [1]}),
                "cases[0].expected_schema: must be a JSON Schema",
            ),
            (
                json!({"name": "a", "request": {"stream": true}, "schema_of": "body", "expected_schema": {}}),
                "cases[0].schema_of: \"body\" judges one JSON document",
            ),
            (
                json!({"name": "a", "request": {}, "expected_tool_calls": {}}),
                "cases[0].expected_tool_calls: needs the request's own tools",
            ),
            (
                json!({"name": "a", "request": {"tools": tools}, "expected_tool_calls": {}}),
                "cases[0].request.tools[0].function.parameters: is not a schema",
            ),
            (
                json!({"name": "a", "request": {"tools": [{"function": {"name": "f"}}]},
                "expected_tool_calls": {"names": ["g"]}}),
                "cases[0].expected_tool_calls.names: 'g' is not one of the request's tools",
            ),
            (
                json!({"name": "a", "request": {}, "expected_choice": []}),
                "cases[0].expected_choice: must be a non-empty list of choices",
            ),
            (
                json!({"name": "a", "request": {}, "expected_pattern": "(unclosed"}),
                "cases[0].expected_pattern: is not a regular expression",
            ),
            (
                json!({"name": "a", "request": {}, "expected_pattern": "\\w{1000}\\w{1000}\\w{1000}"}),
                "cases[0].expected_pattern: compiles to more than",
            ),
            (
                json!({"name": "a", "request": {}, "expected_pattern": "x", "expected_choice": ["x"]}),
                "cases[0].expected_pattern: a request has exactly one oracle",
            ),
            (
                json!({"name": "a", "request": {}, "case_fold": true, "expected_pattern": "x"}),
                "cases[0].case_fold: goes with expected_choice",
            ),
            (
                json!({"name": "a", "request": {}, "expected_response": {"x": 1},
                "tolerance": {"paths": {"/y": {"abs": 1}}}}),
                "cases[0].tolerance.paths['/y']: does not exist in expected_response",
            ),
            (
                json!({"name": "a", "request": {}, "expected_response": {"x": 1},
                "tolerance": {"abs": -1}}),
                "cases[0].tolerance.abs: must be a number >= 0",
            ),
            (
                json!({"name": "a", "request": {}, "expected_pattern": "x", "ignore_paths": ["/x"]}),
                "cases[0].ignore_paths: ignore_paths only applies to JSON oracles",
            ),
        ];
        for (case, want) in cases {
            let problems = plan(case.clone()).unwrap_err();
            assert!(
                problems.iter().any(|p| p.starts_with(want)),
                "{case}: {problems:?}"
            );
        }
    }
}
