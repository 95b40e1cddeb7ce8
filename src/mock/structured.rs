//! The mock's structured answers, so contract oracles have something to judge. A chat
//! request that asks for JSON of a schema (`response_format: {"type": "json_schema",
//! "json_schema": {"schema": ...}}`) is answered with JSON made from the schema; one that
//! declares `tools` (and no `tool_choice: "none"`) with a call of its first tool (or the
//! one `tool_choice` names), its arguments made from that tool's `parameters`.
//!
//! What a schema makes (a named subset): an object gets every property, an array
//! `minItems` items (at least one) of `items`, a string the first value of its `enum` or
//! the answer's own words, a number or an integer its `minimum` (else 1; `maximum` caps it),
//! a boolean `true`, `const` and `enum` their first value at any level; anything else is
//! `null`. Nesting past 16 levels is `null` too, and so is every value past the 4,096th of
//! one document.
//!
//! A broken server: `invalid_tool_call_share` of the prompts (by their hash, so the same
//! ones every run and every arm that shares the seed) get a call whose arguments leave out
//! the first required property, or are not JSON when none is required.

use serde_json::{Map, Value, json};

/// What a structured answer carries instead of free text.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Shaped {
    /// Content that is a JSON document (its text).
    Json(String),
    /// One tool call.
    Call { name: String, arguments: String },
}

/// The deepest a schema is followed.
const MAX_DEPTH: usize = 16;

/// The most values one made document holds (arrays of arrays would otherwise grow as the
/// power of their nesting): past it, every further value is `null`.
const MAX_VALUES: usize = 4096;

/// The structured answer `req` asks for, if any (`words`: the answer's own text, for
/// strings; `broken`: this prompt gets a broken tool call).
pub(super) fn shaped(req: &Value, words: &str, broken: bool) -> Option<Shaped> {
    let none = req.get("tool_choice").and_then(Value::as_str) == Some("none");
    if let Some(Value::Array(tools)) = req.get("tools")
        && !none
    {
        let named = req
            .pointer("/tool_choice/function/name")
            .and_then(Value::as_str);
        let tool = tools.iter().find(|t| {
            named.is_none_or(|n| t.pointer("/function/name").and_then(Value::as_str) == Some(n))
        })?;
        let name = tool.pointer("/function/name").and_then(Value::as_str)?;
        let params = tool.pointer("/function/parameters").unwrap_or(&Value::Null);
        let mut args = made(params, words, 0, &mut { MAX_VALUES });
        let arguments = match (broken, args.as_object_mut()) {
            (false, _) => args.to_string(),
            (true, Some(m)) => match first_required(params) {
                Some(field) => {
                    m.shift_remove(&field);
                    args.to_string()
                }
                None => "{".to_string(),
            },
            (true, None) => "{".to_string(),
        };
        return Some(Shaped::Call {
            name: name.to_string(),
            arguments,
        });
    }
    let schema = req.pointer("/response_format/json_schema/schema")?;
    if req.pointer("/response_format/type").and_then(Value::as_str) != Some("json_schema") {
        return None;
    }
    Some(Shaped::Json(
        made(schema, words, 0, &mut { MAX_VALUES }).to_string(),
    ))
}

/// A value that fits `schema` (the subset above), of at most `budget` values.
fn made(schema: &Value, words: &str, depth: usize, budget: &mut usize) -> Value {
    if depth > MAX_DEPTH || *budget == 0 {
        return Value::Null;
    }
    *budget -= 1;
    if let Some(c) = schema.get("const") {
        return c.clone();
    }
    if let Some(first) = schema
        .get("enum")
        .and_then(Value::as_array)
        .and_then(|e| e.first())
    {
        return first.clone();
    }
    let ty = match schema.get("type") {
        Some(Value::String(t)) => t.as_str(),
        // A list of types: the first that is not "null".
        Some(Value::Array(ts)) => ts
            .iter()
            .filter_map(Value::as_str)
            .find(|t| *t != "null")
            .unwrap_or("null"),
        _ if schema.get("properties").is_some() => "object",
        _ => "null",
    };
    match ty {
        "object" => {
            let mut m = Map::new();
            let props = schema.get("properties").and_then(Value::as_object);
            for (k, s) in props.into_iter().flatten() {
                m.insert(k.clone(), made(s, words, depth + 1, budget));
            }
            Value::Object(m)
        }
        "array" => {
            let n = schema
                .get("minItems")
                .and_then(Value::as_u64)
                .unwrap_or(1)
                .clamp(1, 16);
            let item = schema.get("items").unwrap_or(&Value::Null);
            Value::Array(
                (0..n)
                    .map(|_| made(item, words, depth + 1, budget))
                    .collect(),
            )
        }
        "string" => {
            let text: String = words
                .split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ");
            Value::String(if text.is_empty() { "mock".into() } else { text })
        }
        "integer" | "number" => {
            let min = schema.get("minimum").and_then(Value::as_f64).unwrap_or(1.0);
            let max = schema
                .get("maximum")
                .and_then(Value::as_f64)
                .unwrap_or(f64::MAX);
            let v = min.max(1.0).min(max).ceil().min(max);
            if ty == "integer" {
                json!(v as i64)
            } else {
                json!(v)
            }
        }
        "boolean" => Value::Bool(true),
        _ => Value::Null,
    }
}

/// The first property `schema` requires.
fn first_required(schema: &Value) -> Option<String> {
    schema
        .get("required")?
        .as_array()?
        .first()?
        .as_str()
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schema_is_answered_with_json_that_fits_it_and_a_tool_with_a_call() {
        let schema = json!({"type": "object", "required": ["city", "days"], "properties": {
            "city": {"type": "string"}, "days": {"type": "integer", "minimum": 2, "maximum": 9},
            "unit": {"enum": ["C", "F"]}, "tags": {"type": "array", "items": {"type": "boolean"}}}});
        let req = json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}});
        let Some(Shaped::Json(text)) = shaped(&req, "the model answers", false) else {
            panic!("json")
        };
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            v,
            json!({"city": "the model answers", "days": 2, "unit": "C", "tags": [true]})
        );
        let validator = crate::oracle::contract::compile_schema(&schema).unwrap();
        assert!(validator.is_valid(&v));
        let tools =
            json!([{"type": "function", "function": {"name": "weather", "parameters": schema}}]);
        let req = json!({"tools": tools});
        let Some(Shaped::Call { name, arguments }) = shaped(&req, "w", false) else {
            panic!("call")
        };
        let args: Value = serde_json::from_str(&arguments).unwrap();
        assert_eq!(name, "weather");
        assert!(validator.is_valid(&args));
        let Some(Shaped::Call { arguments, .. }) = shaped(&req, "w", true) else {
            panic!("call")
        };
        let broken: Value = serde_json::from_str(&arguments).unwrap();
        assert!(broken.get("city").is_none() && !validator.is_valid(&broken));
        assert_eq!(
            shaped(&json!({"tools": tools, "tool_choice": "none"}), "w", false),
            None
        );
        assert_eq!(shaped(&json!({"messages": []}), "w", false), None);
    }

    #[test]
    fn a_schema_of_nested_arrays_makes_a_bounded_document() {
        let mut schema = json!({"type": "string"});
        for _ in 0..16 {
            schema = json!({"type": "array", "minItems": 16, "items": schema});
        }
        let req =
            json!({"response_format": {"type": "json_schema", "json_schema": {"schema": schema}}});
        let Some(Shaped::Json(text)) = shaped(&req, "w", false) else {
            panic!("json")
        };
        assert!(text.len() < 64 * 1024, "{} bytes", text.len());
    }
}
