//! Captured chat requests grouped into sessions: request B continues request A when B's
//! `messages` are A's, then A's answer (its assistant message, compared on role, content,
//! tool calls and name), then more, and every other field of the two requests is the
//! same. A case whose requests hold such a pair is frozen as a case with sessions, one
//! session per conversation (each chain from a first request to a last one), in a frozen
//! history: every turn keeps its recorded answer as its oracle, and the answer the client
//! sent back as the history of the next turn. A session-affinity header names the
//! session (`collect::SESSION_HEADERS`).

use serde_json::{Map, Value};

use super::collect::{Answer, Body, Case, Variant};
use crate::oracle::answer;

/// Sessions a case is frozen as.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Chains {
    /// The requests' fields besides `messages` (the same for every request of the case).
    pub(crate) template: Map<String, Value>,
    /// Each session's requests (variant indices), first turn first.
    pub(crate) sessions: Vec<Vec<usize>>,
    /// The session-affinity header the requests carried, if any.
    pub(crate) header: Option<String>,
}

/// Conversations longer than this are not followed further (a bound on the work of a
/// hostile or looping capture: each step looks at every request of the case).
const MAX_CHAIN: usize = crate::config::sessions::MAX_TURNS;

/// The case's sessions, when its requests are chats of one template and at least one
/// continues another; `None` otherwise (the case stays a list of variants).
pub(crate) fn chains(c: &Case) -> Option<Chains> {
    let parts: Vec<(Map<String, Value>, &Vec<Value>)> =
        c.variants.iter().map(split).collect::<Option<_>>()?;
    let template = parts.first()?.0.clone();
    if parts.iter().any(|(t, _)| *t != template) {
        return None;
    }
    let answers: Vec<Option<Value>> = c.variants.iter().map(answer_of).collect();
    // Each request's parent: the longest earlier conversation it continues.
    let parent: Vec<Option<usize>> = parts
        .iter()
        .map(|(_, b)| {
            parts
                .iter()
                .enumerate()
                .filter(|(_, (_, a))| continues(b, a))
                .filter(|(i, (_, a))| {
                    let sent = b.get(a.len()).and_then(answer::comparable);
                    sent.is_some() && sent == answers[*i]
                })
                .max_by_key(|(_, (_, a))| a.len())
                .map(|(i, _)| i)
        })
        .collect();
    if parent.iter().all(Option::is_none) {
        return None;
    }
    let is_parent: Vec<bool> = (0..parts.len())
        .map(|i| parent.contains(&Some(i)))
        .collect();
    let sessions: Vec<Vec<usize>> = (0..parts.len())
        .filter(|&i| !is_parent[i])
        .map(|leaf| {
            let mut chain = vec![leaf];
            while let Some(p) = parent[*chain.last().unwrap_or(&leaf)] {
                if chain.len() >= MAX_CHAIN || chain.contains(&p) {
                    break;
                }
                chain.push(p);
            }
            chain.reverse();
            chain
        })
        .collect();
    let header = c
        .variants
        .iter()
        .find_map(|v| v.session.as_ref().map(|(name, _)| name.clone()));
    Some(Chains {
        template,
        sessions,
        header,
    })
}

/// `b`'s messages start with all of `a`'s and go on past the answer that follows them.
fn continues(b: &[Value], a: &[Value]) -> bool {
    b.len() > a.len() + 1 && b[..a.len()] == *a
}

/// A chat request's fields besides `messages`, and its messages.
fn split(v: &Variant) -> Option<(Map<String, Value>, &Vec<Value>)> {
    let Body::Json(Value::Object(m)) = &v.body else {
        return None;
    };
    let messages = m.get("messages")?.as_array()?;
    let mut rest = m.clone();
    rest.remove("messages");
    Some((rest, messages))
}

/// The assistant message a request's recorded answer carries, as a history compares it.
fn answer_of(v: &Variant) -> Option<Value> {
    match &v.first {
        Answer::Json(a) => answer::of_value(a).ok(),
        Answer::StreamText(t) => Some(serde_json::json!({"role": "assistant", "content": t})),
        Answer::Events(_) | Answer::Text(_) => None,
    }
}

impl Chains {
    /// Turn `k` (from 0) of `session`: the messages it adds, and the answer the next turn
    /// carries as it was sent back (`None` for the last turn).
    pub(crate) fn turn(&self, c: &Case, session: usize, k: usize) -> (Vec<Value>, Option<Value>) {
        let chain = &self.sessions[session];
        let messages = |i: usize| split(&c.variants[i]).map_or(&[][..], |(_, m)| &m[..]);
        let from = match k {
            0 => 0,
            _ => messages(chain[k - 1]).len() + 1,
        };
        let now = messages(chain[k]);
        let added = now.get(from..).unwrap_or_default().to_vec();
        let answer = chain
            .get(k + 1)
            .and_then(|&next| messages(next).get(now.len()).cloned());
        (added, answer)
    }

    /// The session's id: its affinity header's value (its last request's), else `s<N>`.
    pub(crate) fn id(&self, c: &Case, session: usize) -> String {
        self.sessions[session]
            .iter()
            .rev()
            .find_map(|&i| c.variants[i].session.as_ref().map(|(_, v)| v.clone()))
            .unwrap_or_else(|| format!("s{}", session + 1))
    }
}
