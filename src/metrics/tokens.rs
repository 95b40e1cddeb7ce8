//! Token counts and rates: the decode estimator, a round's streaming metrics, the usage
//! tokens per second.

use super::percentiles::{Percentiles, mean};
use super::sample::{Sample, StreamSample};

/// Streaming metrics of a round, over its successful event-stream exchanges.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct StreamMetrics {
    pub(crate) requests: u64,
    pub(crate) ttft_us: Percentiles,
    pub(crate) tpot_us: Percentiles,
    /// Pooled over every gap of every successful exchange.
    pub(crate) itl_us: Percentiles,
    pub(crate) output_tokens: i64,
    /// Mean over exchanges of `output_tokens / (total - ttft)`.
    pub(crate) output_tokens_per_second_mean: Option<f64>,
    /// All output tokens / the round's elapsed time (overlap is credited).
    pub(crate) output_tokens_per_second_aggregate: Option<f64>,
    /// Output tokens / decode time summed over the unbundled streams ([`decode`]).
    pub(crate) output_tokens_per_second_pooled: Option<f64>,
    /// Streams whose tokens after the first arrived bundled in one read.
    pub(crate) bundled_streams: u64,
    /// Mean over exchanges of `prompt_tokens / ttft`.
    pub(crate) prefill_tokens_per_second_mean: Option<f64>,
}

/// One exchange's decode rate: `output_tokens / (total - ttft)` per second, when there is
/// a decode time and a token.
pub(crate) fn decode_rate(
    total_us: Option<i64>,
    ttft_us: Option<i64>,
    output_tokens: Option<i64>,
) -> Option<f64> {
    let decode_us = total_us? - ttft_us?;
    let n = output_tokens?;
    (decode_us > 0 && n > 0).then(|| n as f64 / (decode_us as f64 / 1e6))
}

/// Output tokens of every answer in `ok`: a stream's own count, else a JSON answer's
/// `usage.completion_tokens` (what an aggregate decode rate divides).
pub(crate) fn answer_tokens(ok: &[&Sample]) -> i64 {
    ok.iter()
        .map(|s| match &s.stream {
            Some(st) => st.output_tokens.unwrap_or(0),
            None => s.usage_tokens.map_or(0, |(_, out)| out),
        })
        .fold(0i64, i64::saturating_add)
}

/// Decode speed over a set of ok streams, and every stream each estimator leaves out.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Decode {
    /// Output tokens / decode time (total - ttft), both summed over the streams with a
    /// first token, a token count, a decode time and no bundling.
    pub(crate) pooled_tokens_per_second: Option<f64>,
    /// Streams the pooled estimator summed.
    pub(crate) pooled_streams: u64,
    /// Left out of both estimators: no first-token time, no token count, no decode time
    /// (every token arrived with the first: total == ttft).
    pub(crate) no_first_token: u64,
    pub(crate) no_tokens: u64,
    pub(crate) no_decode_time: u64,
    /// Left out of the pooled estimator only: tokens after the first bundled in one read.
    pub(crate) bundled: u64,
}

/// [`Decode`] over the streams among `ok`.
pub(crate) fn decode(ok: &[&Sample]) -> Decode {
    let mut d = Decode::default();
    let (mut tokens, mut decode_us) = (0i64, 0i64);
    for (s, st) in ok
        .iter()
        .filter_map(|s| s.stream.as_ref().map(|st| (*s, st)))
    {
        let Some(ttft) = st.ttft_us else {
            d.no_first_token += 1;
            continue;
        };
        let Some(n) = st.output_tokens.filter(|n| *n > 0) else {
            d.no_tokens += 1;
            continue;
        };
        let Some(us) = s.total_us.map(|t| t - ttft).filter(|us| *us > 0) else {
            d.no_decode_time += 1;
            continue;
        };
        if st.bundled {
            d.bundled += 1;
            continue;
        }
        d.pooled_streams += 1;
        tokens += n;
        decode_us += us;
    }
    d.pooled_tokens_per_second = (decode_us > 0).then(|| tokens as f64 / (decode_us as f64 / 1e6));
    d
}

/// Streaming metrics over successful samples and the round's elapsed seconds.
pub(crate) fn stream_metrics(ok: &[&Sample], elapsed_seconds: f64) -> Option<StreamMetrics> {
    let streams: Vec<(&Sample, &StreamSample)> = ok
        .iter()
        .filter_map(|s| s.stream.as_ref().map(|st| (*s, st)))
        .collect();
    if streams.is_empty() {
        return None;
    }
    let output_tokens: i64 = streams.iter().filter_map(|(_, st)| st.output_tokens).sum();
    let pooled = decode(ok);
    let per_request: Vec<f64> = streams
        .iter()
        .filter_map(|(s, st)| decode_rate(s.total_us, st.ttft_us, st.output_tokens))
        .collect();
    let prefill: Vec<f64> = streams
        .iter()
        .filter_map(|(_, st)| {
            let ttft = st.ttft_us?;
            let n = st.prompt_tokens?;
            (ttft > 0).then(|| n as f64 / (ttft as f64 / 1e6))
        })
        .collect();
    Some(StreamMetrics {
        requests: streams.len() as u64,
        ttft_us: Percentiles::of(streams.iter().filter_map(|(_, st)| st.ttft_us).collect()),
        tpot_us: Percentiles::of(streams.iter().filter_map(|(_, st)| st.tpot_us).collect()),
        itl_us: Percentiles::of(
            streams
                .iter()
                .flat_map(|(_, st)| st.gaps_us.iter().copied())
                .collect(),
        ),
        output_tokens,
        output_tokens_per_second_mean: mean(&per_request),
        output_tokens_per_second_aggregate: (elapsed_seconds > 0.0)
            .then(|| output_tokens as f64 / elapsed_seconds),
        output_tokens_per_second_pooled: pooled.pooled_tokens_per_second,
        bundled_streams: streams.iter().filter(|(_, st)| st.bundled).count() as u64,
        prefill_tokens_per_second_mean: mean(&prefill),
    })
}

/// Output tokens of the `usage` the successful JSON answers reported, per second of
/// `elapsed_seconds`; `None` when none reported one (or no time elapsed).
pub(super) fn usage_tokens_per_second(ok: &[&Sample], elapsed_seconds: f64) -> Option<f64> {
    let reported: Vec<i64> = ok
        .iter()
        .filter_map(|s| s.usage_tokens.map(|(_, out)| out))
        .collect();
    if reported.is_empty() || elapsed_seconds <= 0.0 {
        return None;
    }
    Some(reported.iter().fold(0i64, |a, &b| a.saturating_add(b)) as f64 / elapsed_seconds)
}
