//! The mock's words: a deterministic text of a prompt and a token budget (so oracles can
//! be frozen), the same text as stream tokens, and the prompt a request carries.

use serde_json::Value;
use sha2::{Digest, Sha256};

const VOCAB: [&str; 32] = [
    "the",
    "model",
    "answers",
    "with",
    "a",
    "steady",
    "stream",
    "of",
    "tokens",
    "that",
    "look",
    "plausible",
    "enough",
    "for",
    "a",
    "benchmark",
    "run",
    "under",
    "load",
    "while",
    "every",
    "byte",
    "is",
    "recorded",
    "and",
    "judged",
    "against",
    "an",
    "oracle",
    "frozen",
    "in",
    "advance",
];

/// Deterministic text of `tokens` words for `prompt`.
pub fn generate_text(prompt: &str, tokens: u32) -> String {
    generate_text_seeded(prompt, tokens, 0)
}

/// [`generate_text`] under another text seed (`mock-worker --text-seed N`): the same
/// prompt gets other words, deterministically, so a campaign arm can drift from the
/// default mock. Seed 0 is the default text.
pub fn generate_text_seeded(prompt: &str, tokens: u32, text_seed: u64) -> String {
    let digest = Sha256::digest(prompt.as_bytes());
    let mut seed = (u64::from_le_bytes(digest[..8].try_into().unwrap_or([7; 8]))
        ^ text_seed.wrapping_mul(0x9E37_79B9_7F4A_7C15))
        | 1;
    let mut words = Vec::with_capacity(tokens as usize);
    for _ in 0..tokens {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        words.push(VOCAB[(seed % VOCAB.len() as u64) as usize]);
    }
    words.join(" ")
}

pub(crate) fn prompt_of(chat: bool, req: &Value) -> Option<String> {
    if chat {
        let msgs = req.get("messages")?.as_array()?;
        let parts: Vec<String> = msgs
            .iter()
            .map(|m| match m.get("content") {
                Some(Value::String(s)) => s.clone(),
                Some(other) => other.to_string(),
                None => String::new(),
            })
            .collect();
        Some(parts.join("\n"))
    } else {
        match req.get("prompt")? {
            Value::String(s) => Some(s.clone()),
            other => Some(other.to_string()),
        }
    }
}

/// The words of [`generate_text`] as stream tokens: joined, they are the same text.
pub(crate) fn stream_tokens(prompt: &str, tokens: u32, text_seed: u64) -> Vec<String> {
    let text = generate_text_seeded(prompt, tokens, text_seed);
    if text.is_empty() {
        return Vec::new();
    }
    text.split(' ')
        .enumerate()
        .map(|(i, w)| {
            if i == 0 {
                w.to_string()
            } else {
                format!(" {w}")
            }
        })
        .collect()
}
