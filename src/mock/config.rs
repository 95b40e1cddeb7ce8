//! The mock's configuration ([`MockConfig`]): its latency model, prefix cache, fault
//! timing, text and what it keeps for tests. A leaf of `mock`.

/// Latency model and defaults of the mock.
#[derive(Debug, Clone)]
pub struct MockConfig {
    pub prefill_ms: f64,
    /// Prefill time per prompt token not found in the prefix cache (every prompt token
    /// without one). 0 by default: the prefill is `prefill_ms` whatever the prompt.
    pub prefill_per_token_ms: f64,
    /// Blocks of 16 prompt tokens (`prefix::BLOCK_TOKENS`) the prefix cache holds (LRU);
    /// 0: no prefix cache, and no `prompt_tokens_details` in `usage`.
    pub prefix_cache_blocks: usize,
    pub per_token_ms: f64,
    /// Requests served at once; more wait in a queue.
    pub max_batch: usize,
    /// Tokens generated when a request gives no `max_tokens`.
    pub default_max_tokens: u32,
    /// How long the `stall` fault withholds its answer.
    pub stall_ms: u64,
    /// Another deterministic text for the same prompts (0: the default text).
    pub text_seed: u64,
    /// This share of prompts (chosen by a hash of the prompt and `text_seed`, so the
    /// same prompts every run) is answered with other text on every request, as a
    /// batched server's arithmetic makes some greedy answers differ run to run; the
    /// others keep their one text. 0: every answer is deterministic.
    pub nondeterministic_share: f64,
    /// This share of prompts that declare `tools` (chosen by a hash of the prompt and
    /// `text_seed`) get a broken tool call: arguments without a required property, or not
    /// JSON. 0: every call is valid.
    pub invalid_tool_call_share: f64,
    /// Stream the first N tokens at the usual pace, then all later tokens in one write,
    /// with no wait (a server that buffered them): `None` paces every token.
    pub burst_after_first: Option<u32>,
    /// Keep every request seen and every stream's event stamps, for tests to read
    /// ([`MockWorker::seen`], [`MockWorker::event_log`]). Off in the `mock-worker` command
    /// and under `replay --mock-worker`, where nobody reads them and a long run would
    /// only grow.
    pub log_requests: bool,
}

impl Default for MockConfig {
    fn default() -> Self {
        MockConfig {
            prefill_ms: 5.0,
            prefill_per_token_ms: 0.0,
            prefix_cache_blocks: 0,
            per_token_ms: 1.0,
            max_batch: 8,
            default_max_tokens: 16,
            stall_ms: 60_000,
            text_seed: 0,
            nondeterministic_share: 0.0,
            invalid_tool_call_share: 0.0,
            burst_after_first: None,
            log_requests: true,
        }
    }
}
