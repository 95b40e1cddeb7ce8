//! One exchange as the metrics see it (`Sample`), its streamed columns, and its times
//! against its schedule. A leaf of `metrics`.

use crate::model::Outcome;

/// What the metrics need of one exchange.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct Sample {
    /// The row's `exchange_id` (order of completion): breaks ties between equal completion
    /// times.
    pub(crate) exchange_id: i64,
    pub(crate) outcome: Outcome,
    pub(crate) start_offset_us: i64,
    pub(crate) total_us: Option<i64>,
    pub(crate) first_byte_us: Option<i64>,
    pub(crate) connect_us: Option<i64>,
    /// Event-stream facts, for SSE responses.
    pub(crate) stream: Option<StreamSample>,
    /// The answer's decisions (the seed's domain unit); `None` when it was not judged as
    /// JSON, which counts as 0.
    pub(crate) decisions: Option<u64>,
    /// `usage` of a JSON answer: (prompt tokens if reported, output tokens), when it
    /// reported them (streams carry theirs in `stream`).
    pub(crate) usage_tokens: Option<(Option<i64>, i64)>,
    /// The answer's `usage.prompt_tokens_details.cached_tokens` (a JSON answer's or a
    /// stream's usage chunk's): prompt tokens the server's prefix cache served; `None`
    /// when it reported none.
    pub(crate) cached_prompt_tokens: Option<i64>,
    /// A session's turn: its index in the session, from 1 (`None` outside sessions).
    pub(crate) turn: Option<u16>,
    /// A trace's session turn: how much later than its own offset it was due, µs (the
    /// row's `session_lag_us`).
    pub(crate) session_lag_us: Option<i64>,
    /// A failure's message (campaign cells list the distinct ones).
    pub(crate) failure: Option<String>,
    /// Open loop: the intended send time on the run's clock (`start_offset_us` is the
    /// actual one).
    pub(crate) scheduled_offset_us: Option<i64>,
}

/// What the streaming metrics need of one exchange.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct StreamSample {
    pub(crate) ttft_us: Option<i64>,
    pub(crate) tpot_us: Option<i64>,
    pub(crate) output_tokens: Option<i64>,
    pub(crate) prompt_tokens: Option<i64>,
    /// Gaps between consecutive content events (inter-token latency samples).
    pub(crate) gaps_us: Vec<i64>,
    /// Its tokens after the first arrived bundled in one read ([`crate::model::bundled`]).
    pub(crate) bundled: bool,
}

impl StreamSample {
    pub(crate) fn from_columns(c: &crate::model::StreamColumns) -> StreamSample {
        StreamSample {
            ttft_us: c.ttft_us,
            tpot_us: c.tpot_us,
            output_tokens: c.output_tokens,
            prompt_tokens: c.prompt_tokens,
            gaps_us: c
                .content_offsets_us
                .windows(2)
                .map(|w| w[1] - w[0])
                .collect(),
            bundled: c.bundled(),
        }
    }
}

impl Sample {
    /// The server's count of the prompt's tokens: a stream's usage chunk's, else a JSON
    /// answer's `usage` (`None` when it reported none).
    pub(crate) fn prompt_tokens(&self) -> Option<i64> {
        match &self.stream {
            Some(s) => s.prompt_tokens,
            None => self.usage_tokens.and_then(|(p, _)| p),
        }
    }

    /// Completion time on the run's clock.
    pub(crate) fn end_offset_us(&self) -> i64 {
        self.start_offset_us
            .saturating_add(self.total_us.unwrap_or(0))
    }

    /// Open loop: how late the send was (actual - intended), µs.
    pub(crate) fn send_lag_us(&self) -> Option<i64> {
        self.scheduled_offset_us
            .map(|s| self.start_offset_us.saturating_sub(s))
    }

    /// The user's latency: from the intended send time (open loop) or the actual one
    /// (closed loop) to the last body byte.
    pub(crate) fn latency_from_schedule_us(&self) -> Option<i64> {
        Some(
            self.total_us?
                .saturating_add(self.send_lag_us().unwrap_or(0)),
        )
    }
}
