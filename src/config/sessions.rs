//! A case's `sessions`: multi-turn conversations. Each session is an ordered list of
//! turns; a turn is the messages it adds to the conversation (a chat) or a whole request
//! (any other API). A chat turn's request is made at send time ([`Sessions::body`]): the
//! case's `request` as a template whose `messages` are its own (a system prompt), then
//! every earlier turn's messages and answer, then this turn's. The plan stores each
//! turn's new messages once, never the whole history again (that grows with the square of
//! the turns against the plan's 64 MiB limit).
//!
//! Where the earlier answers come from is the case's `history`:
//! - `frozen`: the answers the plan recorded (a turn's `answer`, else its
//!   `expected_response`'s `/choices/0/message`, else its `expected_stream_text`), so the
//!   run is deterministic and every turn is judged by its oracle;
//! - `live`: the server's own earlier answers in this run, so the requests after the first
//!   depend on the server and carry no oracle (judged by drift in a campaign).
//!
//! Every turn is also a variant of its case named `<session id>/<turn>` (turns count
//! from 1), so its oracle, ignore paths, planned prompt tokens and drift pairing are a
//! variant's. The plan's JSON is walked into these types by `session_walk.rs`.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue};
use serde_json::{Map, Value};

/// Turns a session may hold: a conversation longer than this is an agent loop better cut
/// into sessions, and each turn's history is built again per send.
pub(crate) const MAX_TURNS: usize = 1024;

/// Where a turn's history of earlier answers comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum History {
    /// The answers the plan recorded.
    Frozen,
    /// The server's own answers in this run.
    Live,
}

impl History {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            History::Frozen => "frozen",
            History::Live => "live",
        }
    }
}

/// A case's sessions, validated.
#[derive(Debug, Clone)]
pub(crate) struct Sessions {
    pub(crate) history: History,
    /// The header that carries a session's id to the server (`session_header`), so a
    /// router can pin a session to one worker.
    pub(crate) header: Option<HeaderName>,
    /// The case's `request` without its `messages`: every chat turn's request is this
    /// with the conversation so far as `messages`.
    pub(crate) template: Map<String, Value>,
    /// The template's own `messages` (a system prompt), first in every chat turn.
    pub(crate) prefix: Vec<Value>,
    /// `cache_bust`: each run of a session starts its first message with a tag of its
    /// own, so no run finds another's prompt in the server's prefix cache (its later
    /// turns still find its own earlier turns).
    pub(crate) cache_bust: bool,
    pub(crate) list: Vec<Session>,
}

#[derive(Debug, Clone)]
pub(crate) struct Session {
    /// The session's `id` (default `s<N>`, N its place from 1): rows' `session_id` and
    /// the affinity header's value.
    pub(crate) id: String,
    /// The same, shared by its rows.
    pub(crate) id_arc: std::sync::Arc<str>,
    /// Its affinity header's value, made once.
    pub(crate) header_value: Option<HeaderValue>,
    /// The case's variant of its first turn; turn `k` (from 0) is `first_variant + k`.
    pub(crate) first_variant: usize,
    pub(crate) turns: Vec<Turn>,
}

#[derive(Debug, Clone)]
pub(crate) struct Turn {
    /// The messages this turn adds (`None`: a whole `request`, sent as written, that adds
    /// nothing to the history).
    pub(crate) messages: Option<Vec<Value>>,
    /// The answer a frozen history carries for this turn (the assistant's message).
    pub(crate) answer: Option<Value>,
    /// The wait between the end of the previous turn and this one's send (0 for the first).
    pub(crate) think: Duration,
}

impl Sessions {
    /// Turn `turn` (from 0) of session `session`'s request body, with `answers` (one per
    /// earlier turn, `None` where a turn added nothing) as the history: the template with
    /// `messages` = its own, then each earlier chat turn's messages and answer, then this
    /// turn's. `None` for a whole-request turn (its variant's body is sent).
    /// With `tag` (a cache-busting session's), the first message's text starts with it.
    /// The definition a [`Conversation`] builds incrementally (and is held to in tests).
    #[cfg(test)]
    pub(crate) fn body(
        &self,
        session: usize,
        turn: usize,
        answers: &[Option<&Value>],
        tag: Option<&str>,
    ) -> Option<Bytes> {
        let s = self.list.get(session)?;
        let now = s.turns.get(turn)?.messages.as_ref()?;
        let mut messages = self.prefix.clone();
        for (t, answer) in s.turns[..turn].iter().zip(answers) {
            if let Some(m) = &t.messages {
                messages.extend(m.iter().cloned());
                if let Some(a) = answer {
                    messages.push((*a).clone());
                }
            }
        }
        messages.extend(now.iter().cloned());
        if let Some(tag) = tag {
            match messages.first_mut().and_then(|m| m.get_mut("content")) {
                Some(Value::String(text)) => text.insert_str(0, tag),
                // Content parts: the tag is a text part of its own, first.
                Some(Value::Array(parts)) => {
                    parts.insert(0, serde_json::json!({"type": "text", "text": tag}));
                }
                _ => {}
            }
        }
        let mut request = self.template.clone();
        request.insert("messages".into(), Value::Array(messages));
        serde_json::to_vec(&request).ok().map(Bytes::from)
    }

    /// A run of a session's conversation, from its first turn (`tag`: a cache-busting
    /// session's, put on its first message).
    pub(crate) fn conversation(&self, tag: Option<&str>) -> Conversation {
        let mut head = serde_json::to_string(&self.template).unwrap_or_else(|_| "{}".into());
        head.pop(); // its closing brace: `messages` goes last, as `body` inserts it
        if head.len() > 1 {
            head.push(',');
        }
        head.push_str("\"messages\":[");
        let mut c = Conversation {
            head,
            so_far: String::new(),
            tag: tag.map(str::to_string),
        };
        for m in &self.prefix {
            c.push(m);
        }
        c
    }

    /// The frozen answers of session `session` (one per turn).
    pub(crate) fn frozen_answers(&self, session: usize) -> Vec<Option<&Value>> {
        self.list
            .get(session)
            .map(|s| s.turns.iter().map(|t| t.answer.as_ref()).collect())
            .unwrap_or_default()
    }

    /// Every turn of every session.
    pub(crate) fn turns(&self) -> usize {
        self.list.iter().map(|s| s.turns.len()).sum()
    }

    /// The most turns any session has.
    pub(crate) fn max_turns(&self) -> usize {
        self.list.iter().map(|s| s.turns.len()).max().unwrap_or(0)
    }
}

/// One run of a session's conversation as it goes (what [`Sessions::body`] makes, built
/// incrementally): the template's bytes up to its `messages`, and each message sent so
/// far serialized once, so a turn's request copies the conversation's bytes once and
/// builds no earlier message again.
#[derive(Debug, Clone)]
pub(crate) struct Conversation {
    /// `{"k":v,...,"messages":[`.
    head: String,
    /// The messages so far, serialized, joined with `,`.
    so_far: String,
    /// A cache-busting tag not yet put on the first message.
    tag: Option<String>,
}

impl Conversation {
    /// A chat turn's request: the conversation so far, then `now` (the turn's messages).
    pub(crate) fn request(&self, now: &[Value]) -> Bytes {
        let mut out = String::with_capacity(self.head.len() + self.so_far.len() + 256);
        out.push_str(&self.head);
        out.push_str(&self.so_far);
        let mut first = self.so_far.is_empty();
        for m in now {
            if !first {
                out.push(',');
            }
            match self.tag.as_deref().filter(|_| first) {
                Some(tag) => out.push_str(&tagged(m, tag).to_string()),
                None => out.push_str(&m.to_string()),
            }
            first = false;
        }
        out.push_str("]}");
        Bytes::from(out)
    }

    /// After a chat turn: its messages and the answer carried (none: nothing to carry)
    /// join the conversation.
    pub(crate) fn carry(&mut self, now: &[Value], answer: Option<&Value>) {
        for m in now.iter().chain(answer) {
            self.push(m);
        }
    }

    fn push(&mut self, m: &Value) {
        if !self.so_far.is_empty() {
            self.so_far.push(',');
        }
        match self.tag.take() {
            Some(tag) => self.so_far.push_str(&tagged(m, &tag).to_string()),
            None => self.so_far.push_str(&m.to_string()),
        }
    }
}

/// A chat request's parts as a session case holds them: its fields besides `messages`
/// (the template), and its messages (`None`: not a JSON object with a `messages` list).
pub(crate) fn chat_parts(request: &Value) -> Option<(Map<String, Value>, &[Value])> {
    let m = request.as_object()?;
    let messages = m.get("messages")?.as_array()?;
    let template = m
        .iter()
        .filter(|(k, _)| *k != "messages")
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    Some((template, messages))
}

/// A chat request's messages (see [`chat_parts`]), without copying anything.
pub(crate) fn chat_messages(request: &Value) -> Option<&[Value]> {
    request.get("messages")?.as_array().map(Vec::as_slice)
}

/// `m` with `tag` first in its text (a string content's start, or a text part of its
/// own before content parts); unchanged when its content is neither.
fn tagged(m: &Value, tag: &str) -> Value {
    let mut m = m.clone();
    match m.get_mut("content") {
        Some(Value::String(text)) => text.insert_str(0, tag),
        Some(Value::Array(parts)) => {
            parts.insert(0, serde_json::json!({"type": "text", "text": tag}));
        }
        _ => {}
    }
    m
}
