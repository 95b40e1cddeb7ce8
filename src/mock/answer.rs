//! What one answer of the mock is made of ([`Answer`]): its prompt, budget and model,
//! its prefill under the prefix cache, and its `usage` as OpenAI's API writes it.

use std::time::Duration;

use super::config::MockConfig;

/// What an answer is made of (streamed or whole).
pub(super) struct Answer<'a> {
    pub(super) chat: bool,
    /// JSON of a schema, or a tool call, instead of free text (`structured.rs`).
    pub(super) shaped: Option<&'a super::structured::Shaped>,
    /// The seed of its text (`State::text_seed_for`).
    pub(super) seed: u64,
    pub(super) prompt: &'a str,
    pub(super) tokens: u32,
    pub(super) model: &'a str,
    pub(super) include_usage: bool,
    /// When the request arrived (`clock::now_ns`), for `/metrics`.
    pub(super) arrived: u64,
    /// Its prompt's tokens, and those the prefix cache held (`None`: no prefix cache).
    pub(super) prompt_tokens: u64,
    pub(super) cached_tokens: Option<u64>,
}

impl Answer<'_> {
    /// The prefill: `prefill_ms`, and `prefill_per_token_ms` per prompt token the prefix
    /// cache did not hold.
    pub(super) fn prefill(&self, c: &MockConfig) -> Duration {
        let uncached = self.prompt_tokens - self.cached_tokens.unwrap_or(0).min(self.prompt_tokens);
        Duration::from_secs_f64(
            (c.prefill_ms + uncached as f64 * c.prefill_per_token_ms).max(0.0) / 1000.0,
        )
    }

    /// The answer's `usage`, with `prompt_tokens_details.cached_tokens` under a prefix cache.
    pub(super) fn usage(&self) -> Usage {
        let (p, t) = (self.prompt_tokens, u64::from(self.tokens));
        Usage {
            prompt_tokens: p,
            completion_tokens: t,
            total_tokens: p + t,
            prompt_tokens_details: self
                .cached_tokens
                .map(|cached_tokens| PromptTokensDetails { cached_tokens }),
        }
    }
}

/// An answer's `usage`, as OpenAI's API writes it.
#[derive(serde::Serialize)]
pub(super) struct Usage {
    prompt_tokens: u64,
    completion_tokens: u64,
    total_tokens: u64,
    /// Only under a prefix cache.
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt_tokens_details: Option<PromptTokensDetails>,
}

#[derive(serde::Serialize)]
pub(super) struct PromptTokensDetails {
    cached_tokens: u64,
}
