//! The events of one streamed answer of the mock: each chunk with its id, object,
//! creation time and model, a piece of text, or a structured answer's pieces (a JSON
//! document's text, a tool call's name and arguments), each as one SSE event. A leaf of
//! `mock`.

use bytes::Bytes;
use serde_json::{Value, json};

use super::structured::Shaped;

/// One SSE event of `v`.
pub(super) fn sse(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

/// The events of one streamed answer: its id, object, creation time and model on each.
pub(super) struct Chunks<'a> {
    pub(super) id: &'a str,
    pub(super) object: &'static str,
    pub(super) created: i64,
    pub(super) model: &'a str,
    pub(super) chat: bool,
}

impl Chunks<'_> {
    pub(super) fn chunk(&self, choice: Value) -> Value {
        json!({"id": self.id, "object": self.object, "created": self.created, "model": self.model, "choices": [choice]})
    }

    /// A structured answer's events: a JSON document's text in pieces of 4 characters, or
    /// a tool call (its id, type and name, then its arguments in pieces of 6), as servers
    /// stream them.
    pub(super) fn shaped_pieces(&self, s: &Shaped) -> Vec<Bytes> {
        let chars = |t: &str, n: usize| -> Vec<String> {
            let c: Vec<char> = t.chars().collect();
            c.chunks(n).map(|p| p.iter().collect()).collect()
        };
        let delta =
            |d: Value| sse(&self.chunk(json!({"index": 0, "delta": d, "finish_reason": null})));
        match s {
            Shaped::Json(doc) => chars(doc, 4)
                .iter()
                .map(|p| delta(json!({"content": p})))
                .collect(),
            Shaped::Call { name, arguments } => {
                let head = json!({"tool_calls": [{"index": 0, "id": format!("call-{}", self.id),
                    "type": "function", "function": {"name": name, "arguments": ""}}]});
                std::iter::once(delta(head))
                    .chain(chars(arguments, 6).iter().map(|p| {
                        delta(json!({"tool_calls": [{"index": 0, "function": {"arguments": p}}]}))
                    }))
                    .collect()
            }
        }
    }

    /// A piece of the answer's text (a chat's delta, a completion's text).
    pub(super) fn piece(&self, text: &str, finish: Value) -> Value {
        if self.chat {
            let delta = if text.is_empty() {
                json!({})
            } else {
                json!({"content": text})
            };
            self.chunk(json!({"index": 0, "delta": delta, "finish_reason": finish}))
        } else {
            self.chunk(json!({"index": 0, "text": text, "finish_reason": finish}))
        }
    }
}
