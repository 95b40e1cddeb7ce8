//! Captured chat requests grouped into sessions: request B continues request A when B's
//! `messages` are A's, then A's answer (its assistant message, compared on role, content,
//! tool calls and name), then more, and every other field of the two requests is the
//! same. A case whose requests hold such a pair is frozen as a case with sessions, one
//! session per conversation (each chain from a first request to a last one), in a frozen
//! history: every turn keeps its recorded answer as its oracle, and the answer the client
//! sent back as the history of the next turn. A session-affinity header names the
//! session (`collect::SESSION_HEADERS`).

use std::collections::HashMap;
use std::hash::{Hash, Hasher};

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
/// continues another; `None` otherwise (the case stays a list of variants). Linear in the
/// case's messages: each request's message lists are found by hash, not by comparing every
/// pair of requests.
pub(crate) fn chains(c: &Case) -> Option<Chains> {
    let messages: Vec<&[Value]> = c.variants.iter().map(messages_of).collect::<Option<_>>()?;
    let template = template_of(&c.variants[0])?;
    if c.variants[1..]
        .iter()
        .any(|v| template_of(v).as_ref() != Some(&template))
    {
        return None;
    }
    let answers: Vec<Option<Value>> = c.variants.iter().map(answer_of).collect();
    // Each request's prefix hashes: `prefix[i][j]` covers its first `j` messages.
    let prefix: Vec<Vec<u64>> = messages.iter().map(|m| prefix_hashes(m)).collect();
    let mut whole: HashMap<u64, Vec<usize>> = HashMap::new();
    for (i, p) in prefix.iter().enumerate() {
        whole.entry(p[p.len() - 1]).or_default().push(i);
    }
    // Each request's parent: the longest earlier conversation it continues, its answer next.
    let parent: Vec<Option<usize>> = (0..messages.len())
        .map(|b| {
            let mb = messages[b];
            (1..mb.len().saturating_sub(1)).rev().find_map(|j| {
                let sent = answer::comparable(&mb[j])?;
                whole.get(&prefix[b][j])?.iter().copied().find(|&a| {
                    a != b && messages[a] == &mb[..j] && answers[a].as_ref() == Some(&sent)
                })
            })
        })
        .collect();
    if parent.iter().all(Option::is_none) {
        return None;
    }
    let mut is_parent = vec![false; parent.len()];
    for p in parent.iter().flatten() {
        is_parent[*p] = true;
    }
    let sessions: Vec<Vec<usize>> = (0..parent.len())
        .filter(|&i| !is_parent[i])
        .map(|leaf| {
            let mut chain = vec![leaf];
            let mut at = leaf;
            while let Some(p) = parent[at] {
                // A parent has fewer messages, so a chain cannot turn back on itself.
                if chain.len() >= MAX_CHAIN {
                    break;
                }
                chain.push(p);
                at = p;
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

/// Hashes of every prefix of `messages` (`[0]` the empty one, `[len]` the whole list),
/// each chained over the canonical text of the messages before it.
fn prefix_hashes(messages: &[Value]) -> Vec<u64> {
    let mut out = Vec::with_capacity(messages.len() + 1);
    let mut h = 0u64;
    out.push(h);
    for m in messages {
        let mut hasher = std::hash::DefaultHasher::new();
        h.hash(&mut hasher);
        m.to_string().hash(&mut hasher);
        h = hasher.finish();
        out.push(h);
    }
    out
}

/// A chat request's messages (`None`: not a JSON chat request).
fn messages_of(v: &Variant) -> Option<&[Value]> {
    match &v.body {
        Body::Json(r) => crate::config::sessions::chat_messages(r),
        _ => None,
    }
}

/// A chat request's fields besides `messages` (the case's template).
fn template_of(v: &Variant) -> Option<Map<String, Value>> {
    match &v.body {
        Body::Json(r) => crate::config::sessions::chat_parts(r).map(|(t, _)| t),
        _ => None,
    }
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
        let messages = |i: usize| messages_of(&c.variants[i]).unwrap_or_default();
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
