//! The assistant message an OpenAI-style chat answer carries, whole (`choices[0].message`)
//! or streamed (`choices[0].delta` pieces joined: `content` appended, `tool_calls` merged
//! by their `index`, each call's `function.arguments` appended), as the next turn of a
//! live session sends it back. Only `role`, `content`, `tool_calls` and `name` are kept:
//! what a chat API accepts in a request's history (a server's extra fields, such as
//! `refusal` or `reasoning_content`, are not sent back).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Why an answer carries no message a history can use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum NoMessage {
    #[error("the answer is not JSON: {0}")]
    NotJson(String),
    #[error("the answer has no choices[0].message")]
    NoChoice,
    #[error("the event stream has no choices[0].delta with content or tool calls")]
    EmptyStream,
    #[error("the event stream cannot be read: {0}")]
    BadStream(String),
    #[error(
        "its message is not one a history can carry: content must be text, null or a list of content parts, and at most {MAX_TOOL_CALLS} tool calls"
    )]
    NotAMessage,
}

/// The assistant message of a whole JSON chat answer.
pub(crate) fn of_json(body: &[u8]) -> Result<Value, NoMessage> {
    let v: Value = serde_json::from_slice(body).map_err(|e| NoMessage::NotJson(e.to_string()))?;
    of_value(&v)
}

/// The assistant message of a whole JSON chat answer already parsed.
pub(crate) fn of_value(v: &Value) -> Result<Value, NoMessage> {
    match v.pointer("/choices/0/message") {
        Some(Value::Object(m)) if carriable(m) => Ok(Value::Object(kept(m))),
        Some(Value::Object(_)) => Err(NoMessage::NotAMessage),
        _ => Err(NoMessage::NoChoice),
    }
}

/// A message a history can carry: text content (a string, null, or content parts that
/// are objects) and a bounded list of tool calls, so a hostile server cannot hand a live
/// history a deep or wide document to hold and resend.
fn carriable(m: &Map<String, Value>) -> bool {
    let content = match m.get("content") {
        None | Some(Value::Null | Value::String(_)) => true,
        Some(Value::Array(parts)) => parts.iter().all(Value::is_object),
        Some(_) => false,
    };
    let calls = match m.get("tool_calls") {
        None | Some(Value::Null) => true,
        Some(Value::Array(c)) => c.len() <= MAX_TOOL_CALLS && c.iter().all(Value::is_object),
        Some(_) => false,
    };
    content && calls
}

/// A message as a history compares it: its `role`, `content`, `tool_calls` (when any)
/// and `name`, so a client that sends an answer back without the server's extra fields
/// (`refusal`, ...) still continues it.
pub(crate) fn comparable(m: &Value) -> Option<Value> {
    m.as_object().map(|m| Value::Object(kept(m)))
}

/// The assistant message of a recorded answer: a stream's ([`of_stream`]) or a whole
/// JSON one's ([`of_json`]).
pub(crate) fn of_body(body: &[u8], is_stream: bool) -> Result<Value, NoMessage> {
    if is_stream {
        of_stream(body)
    } else {
        of_json(body)
    }
}

/// The assistant message of an answer (a stream's or a whole JSON one's) without its
/// tool calls' ids: an id is the server's own (random in vLLM), not what a model answered,
/// so two servers' same calls compare equal.
pub(crate) fn without_call_ids(body: &[u8], is_stream: bool) -> Result<Value, NoMessage> {
    let mut m = of_body(body, is_stream)?;
    if let Some(calls) = m.get_mut("tool_calls").and_then(Value::as_array_mut) {
        for c in calls.iter_mut().filter_map(Value::as_object_mut) {
            c.remove("id");
        }
    }
    Ok(m)
}

/// One tool call of an answer, as contracts and drift read it.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
pub(crate) struct ToolCall {
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub(crate) kind: Option<String>,
    #[serde(default)]
    pub(crate) function: CallFunction,
}

/// A tool call's function: its name and its arguments (OpenAI sends them as a JSON text;
/// a server that sends the object is read as it sent it).
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
pub(crate) struct CallFunction {
    #[serde(default)]
    pub(crate) name: Option<String>,
    #[serde(default)]
    pub(crate) arguments: Option<Value>,
}

/// What contracts and drift read of an assistant message: its text content and its calls.
#[derive(Debug, Default, Deserialize)]
struct Parts {
    #[serde(default)]
    content: Option<Value>,
    #[serde(default)]
    tool_calls: Option<Vec<ToolCall>>,
}

/// The tool calls an answer (a stream's or a whole JSON one's) makes: none when it makes
/// none; `Err` when it carries no message a history could hold.
pub(crate) fn tool_calls(body: &[u8], is_stream: bool) -> Result<Vec<ToolCall>, NoMessage> {
    let m = of_body(body, is_stream)?;
    let parts = Parts::deserialize(&m).map_err(|_| NoMessage::NotAMessage)?;
    Ok(parts.tool_calls.unwrap_or_default())
}

/// Whether an answer calls a tool (cheaply `false` for a body that never names one).
pub(crate) fn calls_tools(body: &[u8], is_stream: bool) -> bool {
    memchr::memmem::find(body, b"tool_calls").is_some()
        && tool_calls(body, is_stream).is_ok_and(|c| !c.is_empty())
}

/// An answer that calls tools, as drift compares it: its text content, then its calls as
/// canonical JSON (each call's type, name and arguments, the arguments parsed and written
/// again with sorted keys when they are JSON text; the server's call `id` left out), so
/// two answers that call other tools differ and two that differ only in the ids a server
/// picks do not. `None` for an answer without calls.
pub(crate) fn canonical_calls(body: &[u8], is_stream: bool) -> Option<String> {
    memchr::memmem::find(body, b"tool_calls")?;
    let m = of_body(body, is_stream).ok()?;
    let parts = Parts::deserialize(&m).ok()?;
    let mut calls = parts.tool_calls.filter(|c| !c.is_empty())?;
    for c in &mut calls {
        if let Some(Value::String(text)) = &c.function.arguments
            && let Ok(parsed) = serde_json::from_str::<Value>(text)
        {
            c.function.arguments =
                Some(Value::String(super::pointer::sort_keys(parsed).to_string()));
        }
    }
    let content = match parts.content {
        Some(Value::String(t)) => t,
        _ => String::new(),
    };
    let calls = serde_json::to_value(&calls).ok()?;
    Some(format!("{content}{}", super::pointer::sort_keys(calls)))
}

/// The text a JSON answer carries: a chat answer's `choices[0].message.content`, or a
/// completion's `choices[0].text` (`None`: neither is text).
pub(crate) fn json_text(answer: &Value) -> Option<String> {
    #[derive(Deserialize)]
    struct Answer {
        choices: Vec<Choice>,
    }
    #[derive(Deserialize)]
    struct Choice {
        #[serde(default)]
        message: Option<Parts>,
        #[serde(default)]
        text: Option<Value>,
    }
    let first = Answer::deserialize(answer)
        .ok()?
        .choices
        .into_iter()
        .next()?;
    match (first.message.and_then(|m| m.content), first.text) {
        (Some(Value::String(t)), _) | (_, Some(Value::String(t))) => Some(t),
        _ => None,
    }
}

/// The assistant message a streamed chat answer's events add up to.
pub(crate) fn of_stream(body: &[u8]) -> Result<Value, NoMessage> {
    let events = crate::sse::parse_all(body).map_err(|e| NoMessage::BadStream(e.to_string()))?;
    let mut content = String::new();
    let mut role: Option<String> = None;
    let mut calls: Vec<Map<String, Value>> = Vec::new();
    let mut any = false;
    for ev in events {
        let Ok(chunk) = serde_json::from_str::<Value>(&ev.data) else {
            continue; // `[DONE]` and anything else that is not a JSON chunk
        };
        let Some(delta) = chunk.pointer("/choices/0/delta").and_then(Value::as_object) else {
            continue;
        };
        if let Some(r) = delta.get("role").and_then(Value::as_str) {
            role = Some(r.to_string());
        }
        if let Some(c) = delta.get("content").and_then(Value::as_str) {
            content.push_str(c);
            any = true;
        }
        for call in delta
            .get("tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            // A call past the bound: refused as a whole JSON message with as many is.
            if !merge_call(&mut calls, call) {
                return Err(NoMessage::NotAMessage);
            }
            any = true;
        }
    }
    if !any {
        return Err(NoMessage::EmptyStream);
    }
    let mut m = Map::new();
    m.insert(
        "role".into(),
        Value::String(role.unwrap_or_else(|| "assistant".into())),
    );
    m.insert(
        "content".into(),
        if content.is_empty() && !calls.is_empty() {
            Value::Null
        } else {
            Value::String(content)
        },
    );
    if !calls.is_empty() {
        m.insert(
            "tool_calls".into(),
            Value::Array(calls.into_iter().map(Value::Object).collect()),
        );
    }
    Ok(Value::Object(m))
}

/// Most tool calls one streamed answer may build (a peer naming ever larger indices
/// must not make the history grow without bound).
const MAX_TOOL_CALLS: usize = 128;

/// One streamed piece of a tool call, merged into the call its `index` names; `false`
/// (nothing merged) for an index past [`MAX_TOOL_CALLS`].
fn merge_call(calls: &mut Vec<Map<String, Value>>, piece: &Value) -> bool {
    let index = piece.get("index").and_then(Value::as_u64).unwrap_or(0);
    let Some(index) = usize::try_from(index).ok().filter(|&i| i < MAX_TOOL_CALLS) else {
        return false;
    };
    while calls.len() <= index {
        calls.push(Map::new());
    }
    let call = &mut calls[index];
    for key in ["id", "type"] {
        if let Some(v) = piece.get(key).filter(|v| v.is_string()) {
            call.insert(key.into(), v.clone());
        }
    }
    let Some(f) = piece.get("function").and_then(Value::as_object) else {
        return true;
    };
    let function = call
        .entry("function")
        .or_insert_with(|| Value::Object(Map::new()));
    let Some(function) = function.as_object_mut() else {
        return true;
    };
    for key in ["name", "arguments"] {
        if let Some(s) = f.get(key).and_then(Value::as_str) {
            let slot = function
                .entry(key)
                .or_insert_with(|| Value::String(String::new()));
            if let Value::String(acc) = slot {
                acc.push_str(s);
            }
        }
    }
    true
}

/// The fields of a message a history sends back.
fn kept(m: &Map<String, Value>) -> Map<String, Value> {
    ["role", "content", "tool_calls", "name"]
        .iter()
        .filter_map(|k| m.get(*k).map(|v| (k.to_string(), v.clone())))
        .filter(|(k, v)| {
            !(k == "tool_calls" && (v.is_null() || v.as_array().is_some_and(Vec::is_empty)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_json_answer_gives_its_message_without_extra_fields() {
        let body = json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": "hi there", "refusal": null, "tool_calls": []}}]});
        let m = of_json(body.to_string().as_bytes()).unwrap();
        assert_eq!(m, json!({"role": "assistant", "content": "hi there"}));
        assert_eq!(of_json(b"{\"choices\": []}"), Err(NoMessage::NoChoice));
        assert!(matches!(of_json(b"nope"), Err(NoMessage::NotJson(_))));
    }

    #[test]
    fn a_stream_adds_up_its_content_and_tool_calls() {
        let chunk = |delta: Value| {
            format!(
                "data: {}\n\n",
                json!({"choices": [{"index": 0, "delta": delta}]})
            )
        };
        let body = [
            chunk(json!({"role": "assistant", "content": ""})),
            chunk(json!({"content": "let me "})),
            chunk(json!({"content": "look"})),
            chunk(json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "get_", "arguments": "{\"ci"}}]})),
            chunk(json!({"tool_calls": [{"index": 0, "function": {"name": "weather", "arguments": "ty\": \"Oslo\"}"}}]})),
            "data: [DONE]\n\n".to_string(),
        ]
        .concat();
        let m = of_stream(body.as_bytes()).unwrap();
        assert_eq!(
            m,
            json!({"role": "assistant", "content": "let me look", "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}
            ]})
        );
        assert_eq!(of_stream(b"data: [DONE]\n\n"), Err(NoMessage::EmptyStream));
    }

    #[test]
    fn a_message_a_history_cannot_carry_is_refused() {
        let with = |m: Value| json!({"choices": [{"message": m}]}).to_string();
        let deep = with(json!({"role": "assistant", "content": [[], [], []]}));
        assert_eq!(of_json(deep.as_bytes()), Err(NoMessage::NotAMessage));
        let calls: Vec<Value> = (0..200).map(|i| json!({"id": i})).collect();
        let wide = with(json!({"role": "assistant", "content": null, "tool_calls": calls}));
        assert_eq!(of_json(wide.as_bytes()), Err(NoMessage::NotAMessage));
        let parts = with(json!({"role": "assistant", "content": [{"type": "text", "text": "hi"}]}));
        assert!(of_json(parts.as_bytes()).is_ok());
    }

    #[test]
    fn a_hostile_stream_cannot_grow_the_tool_calls_past_the_bound() {
        let body = format!(
            "data: {}\n\n",
            json!({"choices": [{"delta": {"tool_calls": [{"index": 1_000_000_000u64, "id": "x"}]}}]})
        );
        // Refused, as a whole JSON message with more calls than the bound is: nothing
        // is held for it, and a contract that counts calls is not judged on a part.
        assert_eq!(of_stream(body.as_bytes()), Err(NoMessage::NotAMessage));
        let last = format!(
            "data: {}\n\n",
            json!({"choices": [{"delta": {"tool_calls": [{"index": 127, "id": "x",
                "function": {"name": "f", "arguments": "{}"}}]}}]})
        );
        let m = of_stream(last.as_bytes()).unwrap();
        assert_eq!(m["tool_calls"].as_array().map(Vec::len), Some(128));
    }
}
