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

use serde::Deserialize;
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

/// What a chat request asks of its answer's shape.
#[derive(Deserialize, Default)]
#[serde(default)]
struct Asks {
    tools: Option<Vec<AskedTool>>,
    tool_choice: Option<ToolChoice>,
    response_format: Option<Format>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct AskedTool {
    function: Option<AskedFunction>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct AskedFunction {
    name: Option<String>,
    parameters: Option<Value>,
}

/// `tool_choice`: a mode (`"none"`, `"auto"`, `"required"`) or one named function.
#[derive(Deserialize)]
#[serde(untagged)]
enum ToolChoice {
    Mode(String),
    Named { function: AskedFunction },
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Format {
    #[serde(rename = "type")]
    kind: Option<String>,
    json_schema: Option<FormatSchema>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct FormatSchema {
    schema: Option<Value>,
}

/// The parts of a JSON Schema the mock makes values from (any other is left out; a part
/// of an unexpected type reads as absent).
#[derive(Deserialize, Default)]
#[serde(default)]
struct SchemaNode {
    #[serde(rename = "const")]
    constant: Option<Value>,
    #[serde(rename = "enum")]
    choices: Option<Vec<Value>>,
    #[serde(rename = "type")]
    ty: Option<Value>,
    properties: Option<Map<String, Value>>,
    items: Option<Value>,
    #[serde(rename = "minItems")]
    min_items: Option<Value>,
    minimum: Option<Value>,
    maximum: Option<Value>,
    required: Option<Vec<Value>>,
}

impl SchemaNode {
    fn of(schema: &Value) -> SchemaNode {
        SchemaNode::deserialize(schema).unwrap_or_default()
    }
}

/// The structured answer `req` asks for, if any (`words`: the answer's own text, for
/// strings; `broken`: this prompt gets a broken tool call).
pub(super) fn shaped(req: &Value, words: &str, broken: bool) -> Option<Shaped> {
    let asks = Asks::deserialize(req).unwrap_or_default();
    let named = match &asks.tool_choice {
        Some(ToolChoice::Mode(m)) if m == "none" => {
            return json_shaped(asks.response_format, words);
        }
        Some(ToolChoice::Named { function }) => function.name.as_deref(),
        _ => None,
    };
    let Some(tools) = asks.tools.filter(|t| !t.is_empty()) else {
        return json_shaped(asks.response_format, words);
    };
    let function = tools
        .into_iter()
        .filter_map(|t| t.function)
        .find(|f| named.is_none_or(|n| f.name.as_deref() == Some(n)))?;
    let name = function.name?;
    let params = function.parameters.unwrap_or(Value::Null);
    let mut args = made(&params, words, 0, &mut { MAX_VALUES });
    let arguments = match (broken, args.as_object_mut()) {
        (false, _) => args.to_string(),
        (true, Some(m)) => match first_required(&params) {
            Some(field) => {
                m.shift_remove(&field);
                args.to_string()
            }
            None => "{".to_string(),
        },
        (true, None) => "{".to_string(),
    };
    Some(Shaped::Call { name, arguments })
}

/// JSON made from a `response_format` of type `json_schema`, if that is what it asks.
fn json_shaped(format: Option<Format>, words: &str) -> Option<Shaped> {
    let format = format.filter(|f| f.kind.as_deref() == Some("json_schema"))?;
    let schema = format.json_schema?.schema?;
    Some(Shaped::Json(
        made(&schema, words, 0, &mut { MAX_VALUES }).to_string(),
    ))
}

/// A value that fits `schema` (the subset above), of at most `budget` values.
fn made(schema: &Value, words: &str, depth: usize, budget: &mut usize) -> Value {
    if depth > MAX_DEPTH || *budget == 0 {
        return Value::Null;
    }
    *budget -= 1;
    let node = SchemaNode::of(schema);
    if let Some(c) = node.constant {
        return c;
    }
    if let Some(first) = node.choices.and_then(|c| c.into_iter().next()) {
        return first;
    }
    let ty = match &node.ty {
        Some(Value::String(t)) => t.as_str(),
        // A list of types: the first that is not "null".
        Some(Value::Array(ts)) => ts
            .iter()
            .filter_map(Value::as_str)
            .find(|t| *t != "null")
            .unwrap_or("null"),
        _ if node.properties.is_some() => "object",
        _ => "null",
    };
    let number = |v: &Option<Value>| v.as_ref().and_then(Value::as_f64);
    match ty {
        "object" => Value::Object(
            node.properties
                .iter()
                .flatten()
                .map(|(k, s)| (k.clone(), made(s, words, depth + 1, budget)))
                .collect(),
        ),
        "array" => {
            let n = node
                .min_items
                .as_ref()
                .and_then(Value::as_u64)
                .unwrap_or(1)
                .clamp(1, 16);
            let item = node.items.unwrap_or(Value::Null);
            Value::Array(
                (0..n)
                    .map(|_| made(&item, words, depth + 1, budget))
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
            let min = number(&node.minimum).unwrap_or(1.0);
            let max = number(&node.maximum).unwrap_or(f64::MAX);
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
    SchemaNode::of(schema)
        .required?
        .into_iter()
        .next()?
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
        // The first required property left out, the rest as answered.
        assert_eq!(broken, json!({"days": 2, "unit": "C", "tags": [true]}));
        assert!(!validator.is_valid(&broken));
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
