//! Metric arithmetic: nearest-rank percentiles, round throughput, the steady-state
//! interior window, and spread across rounds. Pure functions over samples; no I/O.
//!
//! Definitions (docs/metrics.md states them for users):
//! - nearest rank: `sorted[ceil(p*n) - 1]`, computed in integers so `p*n` never rounds
//!   the wrong way; p95 of fewer than 20 samples is therefore the maximum;
//! - a round's elapsed time runs from its first dispatch to its last completion, and its
//!   throughput is successful requests over that (`complete_wave_including_ramp_and_drain`);
//! - the steady-state window of a complete round with n > 2c drops the first and last c
//!   completions: it runs from completion c to completion n-c and holds n-2c requests;
//! - across rounds, the median is the ordinary median (mean of the two middle values).

use std::collections::BTreeMap;

use crate::model::{Level, Outcome, Slo};

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

/// Mean, summed in sorted order so the result does not depend on sample order (a rebuilt
/// summary must equal the original to the last bit).
pub(crate) fn mean(v: &[f64]) -> Option<f64> {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
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

impl Sample {
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

/// A send this far behind its schedule (µs) fell behind: its round is `saturated`.
pub(crate) const SATURATION_LAG_US: i64 = 5_000;

/// What an open-loop round measures beside the closed loop's numbers.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct OpenMetrics {
    pub(crate) target_rate_per_second: f64,
    /// `(sends - 1) / (last send - first send)`, from the actual send times.
    pub(crate) achieved_rate_per_second: Option<f64>,
    /// Over every attempted send.
    pub(crate) send_lag_us: Percentiles,
    pub(crate) send_lag_max_us: Option<i64>,
    /// Successful exchanges, from the intended send time to the last body byte.
    pub(crate) latency_from_schedule_us: Percentiles,
    /// Coefficient of variation of the gaps between actual sends, and between the
    /// intended ones (1 for Poisson, 0 for constant, `1/sqrt(k)` for gamma).
    pub(crate) inter_arrival_cv: Option<f64>,
    pub(crate) scheduled_inter_arrival_cv: Option<f64>,
    /// Sends more than [`SATURATION_LAG_US`] behind their schedule.
    pub(crate) late_sends: u64,
    pub(crate) saturated: bool,
}

/// Goodput of a round against the plan's `slo`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Goodput {
    /// Passed the oracle and met every bound.
    pub(crate) good_requests: u64,
    /// Over the round's elapsed time, like `successful_requests_per_second`.
    pub(crate) good_requests_per_second: Option<f64>,
    /// Per bound given: successful exchanges that missed it (`None`: no such bound).
    pub(crate) missed_ttft: Option<u64>,
    pub(crate) missed_tpot: Option<u64>,
    pub(crate) missed_e2e: Option<u64>,
}

/// Goodput of `samples` against `slo`. TTFT is the first content event of a stream, the
/// first response byte otherwise; a TPOT bound does not apply to an exchange without a
/// TPOT (not a stream, or one output token); e2e is [`Sample::latency_from_schedule_us`].
pub(crate) fn goodput(samples: &[Sample], slo: &Slo, elapsed_seconds: f64) -> Goodput {
    let (mut good, mut ttft, mut tpot, mut e2e) = (0u64, 0u64, 0u64, 0u64);
    for s in samples.iter().filter(|s| s.outcome == Outcome::Ok) {
        let st = s.stream.as_ref();
        let over = |v: Option<i64>, bound: Option<i64>| match (v, bound) {
            (_, None) => false,
            (Some(v), Some(b)) => v > b,
            (None, Some(_)) => true,
        };
        let miss_ttft = over(st.map_or(s.first_byte_us, |st| st.ttft_us), slo.ttft_us);
        let tpot_us = st.and_then(|st| st.tpot_us);
        let miss_tpot = tpot_us.is_some() && over(tpot_us, slo.tpot_us);
        let miss_e2e = over(s.latency_from_schedule_us(), slo.e2e_us);
        ttft += u64::from(miss_ttft);
        tpot += u64::from(miss_tpot);
        e2e += u64::from(miss_e2e);
        good += u64::from(!(miss_ttft || miss_tpot || miss_e2e));
    }
    Goodput {
        good_requests: good,
        good_requests_per_second: (elapsed_seconds > 0.0).then(|| good as f64 / elapsed_seconds),
        missed_ttft: slo.ttft_us.map(|_| ttft),
        missed_tpot: slo.tpot_us.map(|_| tpot),
        missed_e2e: slo.e2e_us.map(|_| e2e),
    }
}

/// The open-loop numbers of a round at `rate` over its attempted samples.
fn open_metrics(rate: f64, samples: &[Sample]) -> OpenMetrics {
    let mut sends: Vec<i64> = samples.iter().map(|s| s.start_offset_us).collect();
    sends.sort_unstable();
    let mut scheduled: Vec<i64> = samples
        .iter()
        .filter_map(|s| s.scheduled_offset_us)
        .collect();
    scheduled.sort_unstable();
    let lags: Vec<i64> = samples.iter().filter_map(Sample::send_lag_us).collect();
    let late_sends = lags.iter().filter(|&&l| l > SATURATION_LAG_US).count() as u64;
    let achieved_rate_per_second = match (sends.first(), sends.last()) {
        (Some(a), Some(b)) if b > a => Some((sends.len() - 1) as f64 / ((b - a) as f64 / 1e6)),
        _ => None,
    };
    let as_u64 = |v: &[i64]| -> Vec<u64> { v.iter().map(|&x| x.max(0) as u64).collect() };
    OpenMetrics {
        target_rate_per_second: rate,
        achieved_rate_per_second,
        send_lag_max_us: lags.iter().copied().max(),
        send_lag_us: Percentiles::of(lags),
        latency_from_schedule_us: Percentiles::of(
            samples
                .iter()
                .filter(|s| s.outcome == Outcome::Ok)
                .filter_map(Sample::latency_from_schedule_us)
                .collect(),
        ),
        inter_arrival_cv: crate::arrival::gap_cv(&as_u64(&sends)),
        scheduled_inter_arrival_cv: crate::arrival::gap_cv(&as_u64(&scheduled)),
        late_sends,
        saturated: late_sends > 0,
    }
}

/// Nearest-rank percentile `pct`/100 of sorted samples; `None` when empty.
pub(crate) fn nearest_rank(sorted: &[i64], pct: u32) -> Option<i64> {
    if sorted.is_empty() {
        return None;
    }
    let n = sorted.len() as u64;
    let rank = (u64::from(pct) * n).div_ceil(100).max(1);
    sorted.get((rank - 1) as usize).copied()
}

#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(crate) struct Percentiles {
    pub(crate) p50: Option<i64>,
    pub(crate) p95: Option<i64>,
    pub(crate) p99: Option<i64>,
}

impl Percentiles {
    pub(crate) fn of(mut v: Vec<i64>) -> Percentiles {
        v.sort_unstable();
        Percentiles {
            p50: nearest_rank(&v, 50),
            p95: nearest_rank(&v, 95),
            p99: nearest_rank(&v, 99),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SteadyState {
    pub(crate) available: bool,
    pub(crate) reason: Option<String>,
    /// Window bounds on the run's clock (µs), and what it holds.
    pub(crate) start_us: Option<i64>,
    pub(crate) end_us: Option<i64>,
    pub(crate) requests: Option<u64>,
    pub(crate) requests_per_second: Option<f64>,
    /// Decisions of the window's members, and per second over the same window.
    pub(crate) decisions: Option<u64>,
    pub(crate) decisions_per_second: Option<f64>,
}

impl SteadyState {
    fn unavailable(reason: impl Into<String>) -> SteadyState {
        SteadyState {
            available: false,
            reason: Some(reason.into()),
            start_us: None,
            end_us: None,
            requests: None,
            requests_per_second: None,
            decisions: None,
            decisions_per_second: None,
        }
    }
}

/// One successful completion, as the steady-state window sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Completion {
    /// Completion time on the run's clock (µs).
    pub(crate) at_us: i64,
    /// Breaks ties between equal times.
    pub(crate) exchange_id: i64,
    pub(crate) decisions: u64,
}

/// The interior window of a round: completions sorted (ties broken by exchange id), the
/// first and last `c` dropped. Its members are sorted positions `c ..= n-c-1`; it runs
/// from completion `c` (position `c-1`) to completion `n-c` (position `n-c-1`).
pub(crate) fn steady_state(
    completions: &[Completion],
    concurrency: usize,
    complete: bool,
) -> SteadyState {
    let n = completions.len();
    let c = concurrency;
    if !complete {
        return SteadyState::unavailable("round incomplete");
    }
    if n <= 2 * c {
        return SteadyState::unavailable(format!(
            "needs more than 2 x concurrency completions (n = {n}, c = {c})"
        ));
    }
    let mut sorted = completions.to_vec();
    sorted.sort_unstable();
    let start = sorted[c - 1].at_us;
    let end = sorted[n - c - 1].at_us;
    let requests = (n - 2 * c) as u64;
    if end <= start {
        return SteadyState::unavailable("window has zero length");
    }
    let decisions: u64 = sorted[c..n - c].iter().map(|x| x.decisions).sum();
    let secs = (end - start) as f64 / 1e6;
    SteadyState {
        available: true,
        reason: None,
        start_us: Some(start),
        end_us: Some(end),
        requests: Some(requests),
        requests_per_second: Some(requests as f64 / secs),
        decisions: Some(decisions),
        decisions_per_second: Some(decisions as f64 / secs),
    }
}

pub(crate) const THROUGHPUT_SCOPE: &str = "complete_wave_including_ramp_and_drain";

/// Metrics of one measured round.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RoundMetrics {
    pub(crate) case_name: String,
    pub(crate) concurrency: usize,
    pub(crate) repetition: usize,
    pub(crate) planned_requests: u64,
    pub(crate) attempted_requests: u64,
    pub(crate) successful_requests: u64,
    /// Failure kind -> count (only kinds that occurred).
    pub(crate) failures: BTreeMap<Outcome, u64>,
    pub(crate) elapsed_seconds: f64,
    pub(crate) successful_requests_per_second: Option<f64>,
    pub(crate) total_us: Percentiles,
    pub(crate) first_byte_us: Percentiles,
    pub(crate) connect_us: Percentiles,
    pub(crate) failure_total_us: Percentiles,
    /// Each failed exchange's latency, in completion order (the seed's
    /// `failure_latency_seconds`); a failure without a latency is left out.
    pub(crate) failure_latencies_us: Vec<i64>,
    /// Decisions of the successful exchanges, and per second of the round's elapsed time.
    pub(crate) successful_decisions: u64,
    pub(crate) successful_decisions_per_second: Option<f64>,
    /// The whole budget was attempted and every request succeeded.
    pub(crate) complete: bool,
    pub(crate) steady_state: SteadyState,
    /// `None` when no successful exchange of the round was an event stream.
    pub(crate) stream: Option<StreamMetrics>,
    /// Output tokens the successful JSON answers' `usage` reported, per second of the
    /// round's wall time (`None` when none reported any): the non-streaming answer's
    /// throughput, for the table.
    pub(crate) usage_output_tokens_per_second: Option<f64>,
    /// The load generator's own load during the round (`None` when rebuilt from rows).
    pub(crate) generator: Option<GeneratorLoad>,
    /// The campaign arm (`None` for a plain plan).
    pub(crate) arm: Option<String>,
    /// Open loop: the target rate and what only an open loop measures (`concurrency` is
    /// then 0 and not reported).
    pub(crate) open: Option<OpenMetrics>,
    /// Against the plan's `slo` (`None` without one).
    pub(crate) goodput: Option<Goodput>,
}

impl RoundMetrics {
    /// Every planned request was sent (the round ran its whole budget; some may have
    /// failed).
    pub(crate) fn fully_attempted(&self) -> bool {
        self.planned_requests > 0 && self.attempted_requests == self.planned_requests
    }

    /// The user's latency of the successful exchanges: from the intended send time in an
    /// open loop, from the actual send (`total_us`) in a closed one.
    pub(crate) fn user_latency_us(&self) -> &Percentiles {
        self.open
            .as_ref()
            .map_or(&self.total_us, |o| &o.latency_from_schedule_us)
    }

    /// The round's load: its concurrency, or its open loop's rate.
    pub(crate) fn level(&self) -> Level {
        match &self.open {
            Some(o) => Level::Rate(o.target_rate_per_second),
            None => Level::Concurrency(self.concurrency),
        }
    }
}

/// How busy matrix-proxy itself was while it drove a round, so that nobody mistakes the
/// tool's limit for the worker's.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct GeneratorLoad {
    /// CPU time of the whole process (every thread, the recorder included) during the
    /// round: user + system, as getrusage counts it.
    pub(crate) cpu_seconds: f64,
    /// `cpu_seconds / (wall seconds x cores)`: 1.0 means every core the process may run
    /// on was busy with the tool for the whole round.
    pub(crate) cpu_share: f64,
    /// Cores the process may run on (its CPU affinity).
    pub(crate) cores: usize,
    /// Dispatch-lag probe: how late (µs) a tick scheduled every 10 ms on the same runtime
    /// fired. The runtime's timer has 1 ms granularity, so up to ~1 ms is the timer itself.
    pub(crate) lag_us: Percentiles,
    pub(crate) lag_max_us: Option<i64>,
    /// Why the generator may have been the bottleneck (`None`: no sign of it).
    pub(crate) warning: Option<String>,
}

/// CPU share from which a round is flagged as bounded by the generator.
pub(crate) const GENERATOR_CPU_SHARE_WARN: f64 = 0.9;
/// Dispatch lag (p99, µs) from which a round is flagged...
pub(crate) const GENERATOR_LAG_P99_WARN_US: i64 = 5_000;
/// ... when it is also at least a tenth of the round's median exchange time.
const LAG_SHARE_OF_EXCHANGE: i64 = 10;
/// Below this CPU share, late ticks are the host's scheduling, not the tool's load.
const HOST_NOISE_CPU_SHARE: f64 = 0.5;

impl GeneratorLoad {
    /// `exchange_p50_us`: the round's median exchange time, against which the probe's
    /// lateness is judged (a 10 ms late tick distorts a 1 ms exchange, not a 1 s one).
    pub(crate) fn new(
        (cpu_ns, wall_ns, cores): (u64, u64, usize),
        lags_us: Vec<i64>,
        exchange_p50_us: Option<i64>,
    ) -> GeneratorLoad {
        let cores = cores.max(1);
        let cpu_seconds = cpu_ns as f64 / 1e9;
        let wall = (wall_ns as f64 / 1e9).max(1e-9);
        let cpu_share = cpu_seconds / (wall * cores as f64);
        let lag_max_us = lags_us.iter().copied().max();
        let lag_us = Percentiles::of(lags_us);
        let busy = (cpu_share >= GENERATOR_CPU_SHARE_WARN).then(|| {
            format!(
                "matrix-proxy used {:.0}% of the {cores} core(s) it may run on",
                cpu_share * 100.0
            )
        });
        // Lateness counts where it is large against the exchanges it could distort.
        let late = lag_us.p99.filter(|&p99| {
            p99 >= GENERATOR_LAG_P99_WARN_US
                && exchange_p50_us.is_none_or(|e| p99 * LAG_SHARE_OF_EXCHANGE >= e)
        });
        let late_text = |p99: i64| {
            format!(
                "the runtime's probe ticks (every 10 ms) fired up to {:.1} ms late (p99)",
                p99 as f64 / 1000.0
            )
        };
        let bottleneck = "the load generator may be the bottleneck of this round, not the worker";
        let warning = match (busy, late) {
            (None, None) => None,
            (Some(b), None) => Some(format!("{b}: {bottleneck}")),
            (Some(b), Some(p99)) => Some(format!("{b} and {}: {bottleneck}", late_text(p99))),
            (None, Some(p99)) if cpu_share < HOST_NOISE_CPU_SHARE => Some(format!(
                "{} while matrix-proxy used only {:.0}% of its {cores} core(s): host scheduling noise (other processes on this machine), not this tool's load; the round's times may carry up to {:.1} ms of it",
                late_text(p99),
                cpu_share * 100.0,
                p99 as f64 / 1000.0
            )),
            (None, Some(p99)) => Some(format!("{}: {bottleneck}", late_text(p99))),
        };
        GeneratorLoad {
            cpu_seconds,
            cpu_share,
            cores,
            lag_us,
            lag_max_us,
            warning,
        }
    }
}

/// A closed-loop round's metrics.
/// Per-phase counts of the excluded (non-measured) phases.
#[derive(Debug, Clone, Default)]
pub(crate) struct PhaseCounts {
    pub(crate) attempted: u64,
    pub(crate) successful: u64,
    pub(crate) failures: BTreeMap<Outcome, u64>,
}

impl PhaseCounts {
    pub(crate) fn merge(&mut self, other: &PhaseCounts) {
        self.attempted += other.attempted;
        self.successful += other.successful;
        for (k, v) in &other.failures {
            *self.failures.entry(*k).or_insert(0) += v;
        }
    }

    pub(crate) fn add(&mut self, s: &Sample) {
        self.attempted += 1;
        if s.outcome == Outcome::Ok {
            self.successful += 1;
        } else {
            *self.failures.entry(s.outcome).or_insert(0) += 1;
        }
    }
}

/// Output tokens of the `usage` the successful JSON answers reported, per second of
/// `elapsed_seconds`; `None` when none reported one (or no time elapsed).
fn usage_tokens_per_second(ok: &[&Sample], elapsed_seconds: f64) -> Option<f64> {
    let reported: Vec<i64> = ok
        .iter()
        .filter_map(|s| s.usage_tokens.map(|(_, out)| out))
        .collect();
    if reported.is_empty() || elapsed_seconds <= 0.0 {
        return None;
    }
    Some(reported.iter().fold(0i64, |a, &b| a.saturating_add(b)) as f64 / elapsed_seconds)
}

#[cfg(test)]
pub(crate) fn round_metrics(
    case_name: &str,
    concurrency: usize,
    repetition: usize,
    planned: u64,
    samples: &[Sample],
) -> RoundMetrics {
    level_round_metrics(
        case_name,
        Level::Concurrency(concurrency),
        repetition,
        planned,
        samples,
    )
}

/// A round's metrics at its level: an open loop's add [`OpenMetrics`], and its latency
/// percentiles stay those of the actual sends (service latency) beside the ones from the
/// schedule. The steady-state window is a closed-loop notion (it drops the ramp of `c`
/// workers); an open loop has none.
pub(crate) fn level_round_metrics(
    case_name: &str,
    level: Level,
    repetition: usize,
    planned: u64,
    samples: &[Sample],
) -> RoundMetrics {
    let (concurrency, open) = match level {
        Level::Concurrency(c) => (c, None),
        Level::Rate(r) => (0, Some(open_metrics(r, samples))),
    };
    let attempted = samples.len() as u64;
    let ok: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.outcome == Outcome::Ok)
        .collect();
    let successful = ok.len() as u64;
    let mut failures = BTreeMap::new();
    for s in samples.iter().filter(|s| s.outcome != Outcome::Ok) {
        *failures.entry(s.outcome).or_insert(0) += 1;
    }
    let first = samples.iter().map(|s| s.start_offset_us).min();
    let last = samples.iter().map(Sample::end_offset_us).max();
    let elapsed_seconds = match (first, last) {
        (Some(a), Some(b)) if b > a => (b - a) as f64 / 1e6,
        _ => 0.0,
    };
    let successful_requests_per_second =
        (elapsed_seconds > 0.0).then(|| successful as f64 / elapsed_seconds);
    let complete = attempted == planned && successful == planned;
    let completions: Vec<Completion> = ok
        .iter()
        .map(|s| Completion {
            at_us: s.end_offset_us(),
            exchange_id: s.exchange_id,
            decisions: s.decisions.unwrap_or(0),
        })
        .collect();
    let successful_decisions: u64 = completions.iter().map(|c| c.decisions).sum();
    let mut failed: Vec<(i64, i64, i64)> = samples
        .iter()
        .filter(|s| s.outcome != Outcome::Ok)
        .filter_map(|s| Some((s.end_offset_us(), s.exchange_id, s.total_us?)))
        .collect();
    failed.sort_unstable();
    RoundMetrics {
        case_name: case_name.to_string(),
        concurrency,
        repetition,
        planned_requests: planned,
        attempted_requests: attempted,
        successful_requests: successful,
        failures,
        elapsed_seconds,
        successful_requests_per_second,
        total_us: Percentiles::of(ok.iter().filter_map(|s| s.total_us).collect()),
        first_byte_us: Percentiles::of(ok.iter().filter_map(|s| s.first_byte_us).collect()),
        connect_us: Percentiles::of(ok.iter().filter_map(|s| s.connect_us).collect()),
        failure_total_us: Percentiles::of(
            samples
                .iter()
                .filter(|s| s.outcome != Outcome::Ok)
                .filter_map(|s| s.total_us)
                .collect(),
        ),
        failure_latencies_us: failed.into_iter().map(|(_, _, total)| total).collect(),
        successful_decisions,
        successful_decisions_per_second: (elapsed_seconds > 0.0)
            .then(|| successful_decisions as f64 / elapsed_seconds),
        complete,
        steady_state: if open.is_some() {
            SteadyState::unavailable(
                "open loop: the arrival rate is set, not a number of workers; see achieved_rate_per_second",
            )
        } else {
            steady_state(&completions, concurrency, complete)
        },
        stream: stream_metrics(&ok, elapsed_seconds),
        usage_output_tokens_per_second: usage_tokens_per_second(&ok, elapsed_seconds),
        generator: None,
        arm: None,
        open,
        goodput: None,
    }
}

/// Spread of one metric across complete rounds.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Spread {
    /// Each round's value, in round order (what a bootstrap resamples).
    pub(crate) values: Vec<f64>,
    pub(crate) rounds: usize,
    pub(crate) min: f64,
    pub(crate) median: f64,
    pub(crate) max: f64,
    /// `(max - min) / median`; `None` when the median is 0.
    pub(crate) relative_spread: Option<f64>,
}

/// Ordinary median (mean of the two middle values for an even count).
pub(crate) fn median(values: &[f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

pub(crate) fn spread(values: &[f64]) -> Option<Spread> {
    let med = median(values)?;
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    Some(Spread {
        values: values.to_vec(),
        rounds: values.len(),
        min,
        median: med,
        max,
        relative_spread: (med != 0.0).then(|| (max - min) / med),
    })
}

/// Per (case, concurrency) summary over its rounds.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Aggregate {
    /// The campaign arm (`None` for a plain plan).
    pub(crate) arm: Option<String>,
    pub(crate) case_name: String,
    /// 0 for an open-loop level.
    pub(crate) concurrency: usize,
    /// An open-loop level's rate.
    pub(crate) rate: Option<f64>,
    pub(crate) planned_rounds: usize,
    pub(crate) attempted_rounds: usize,
    pub(crate) complete_rounds: usize,
    pub(crate) incomplete_rounds: usize,
    /// Metric name -> spread over complete rounds (goodput: over every fully attempted
    /// round, failures included); `None`: no such round had it.
    pub(crate) metrics: Vec<(&'static str, Option<Spread>)>,
}

pub(crate) fn aggregate(
    case_name: &str,
    level: Level,
    planned_rounds: usize,
    rounds: &[&RoundMetrics],
) -> Aggregate {
    let attempted: Vec<&&RoundMetrics> =
        rounds.iter().filter(|r| r.attempted_requests > 0).collect();
    let complete: Vec<&&RoundMetrics> = rounds.iter().filter(|r| r.complete).collect();
    let secs = |v: Option<i64>| v.map(|us| us as f64 / 1e6);
    let collect = |f: &dyn Fn(&RoundMetrics) -> Option<f64>| -> Vec<f64> {
        complete.iter().filter_map(|r| f(r)).collect()
    };
    let metrics = vec![
        (
            "successful_requests_per_second",
            spread(&collect(&|r| r.successful_requests_per_second)),
        ),
        (
            "steady_state_requests_per_second",
            spread(&collect(&|r| r.steady_state.requests_per_second)),
        ),
        (
            "successful_decisions_per_second",
            spread(&collect(&|r| r.successful_decisions_per_second)),
        ),
        (
            "steady_state_decisions_per_second",
            spread(&collect(&|r| r.steady_state.decisions_per_second)),
        ),
        // The user's latency: from the intended send time in an open loop.
        (
            "latency_p50_seconds",
            spread(&collect(&|r| secs(r.user_latency_us().p50))),
        ),
        (
            "latency_p95_seconds",
            spread(&collect(&|r| secs(r.user_latency_us().p95))),
        ),
        (
            "service_latency_p50_seconds",
            spread(&collect(&|r| secs(r.total_us.p50))),
        ),
        (
            "first_byte_p50_seconds",
            spread(&collect(&|r| secs(r.first_byte_us.p50))),
        ),
        (
            "send_lag_p99_seconds",
            spread(&collect(&|r| secs(r.open.as_ref()?.send_lag_us.p99))),
        ),
        (
            "achieved_rate_per_second",
            spread(&collect(&|r| r.open.as_ref()?.achieved_rate_per_second)),
        ),
        // Failures are what goodput counts against: over every fully attempted round, not
        // only the complete (failure-free) ones.
        (
            "goodput_requests_per_second",
            spread(
                &rounds
                    .iter()
                    .filter(|r| r.fully_attempted())
                    .filter_map(|r| r.goodput.as_ref()?.good_requests_per_second)
                    .collect::<Vec<f64>>(),
            ),
        ),
        (
            "ttft_p50_seconds",
            spread(&collect(&|r| secs(r.stream.as_ref()?.ttft_us.p50))),
        ),
        (
            "itl_p50_seconds",
            spread(&collect(&|r| secs(r.stream.as_ref()?.itl_us.p50))),
        ),
        (
            "output_tokens_per_second_aggregate",
            spread(&collect(&|r| {
                r.stream.as_ref()?.output_tokens_per_second_aggregate
            })),
        ),
        (
            "output_tokens_per_second_mean",
            spread(&collect(&|r| {
                r.stream.as_ref()?.output_tokens_per_second_mean
            })),
        ),
        (
            "output_tokens_per_second_pooled",
            spread(&collect(&|r| {
                r.stream.as_ref()?.output_tokens_per_second_pooled
            })),
        ),
    ];
    Aggregate {
        arm: None,
        case_name: case_name.to_string(),
        concurrency: match level {
            Level::Concurrency(c) => c,
            Level::Rate(_) => 0,
        },
        rate: match level {
            Level::Rate(r) => Some(r),
            Level::Concurrency(_) => None,
        },
        planned_rounds,
        attempted_rounds: attempted.len(),
        complete_rounds: complete.len(),
        incomplete_rounds: attempted.len() - complete.len(),
        metrics,
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn generator_load_flags_a_busy_tool_and_only_then() {
        // 0.95 s of CPU over 1 s on one core: the tool was the bottleneck.
        let g = GeneratorLoad::new((950_000_000, 1_000_000_000, 1), vec![900, 1000, 1100], None);
        assert!((g.cpu_share - 0.95).abs() < 1e-9);
        assert!(
            g.warning
                .as_deref()
                .unwrap()
                .contains("95% of the 1 core(s)")
        );
        // The same CPU over two cores is under half busy; the lag is timer granularity.
        let g = GeneratorLoad::new((950_000_000, 1_000_000_000, 2), vec![900, 1000, 1100], None);
        assert!((g.cpu_share - 0.475).abs() < 1e-9);
        assert_eq!(g.warning, None);
        assert_eq!(g.lag_max_us, Some(1100));
        // Late ticks alone are enough to warn; at 5 % of the cores they are the host's.
        let lags: Vec<i64> = (0..100).map(|i| if i < 95 { 800 } else { 7_000 }).collect();
        let g = GeneratorLoad::new((100_000_000, 1_000_000_000, 2), lags.clone(), Some(2_000));
        assert_eq!(g.lag_us.p99, Some(7_000));
        let w = g.warning.unwrap_or_default();
        assert!(w.contains("7.0 ms late (p99) while matrix-proxy used only 5% of its 2 core(s): host scheduling noise"), "{w}");
        // At 60 % of the cores they may be the tool's.
        let g = GeneratorLoad::new((1_200_000_000, 1_000_000_000, 2), lags.clone(), None);
        let w = g.warning.unwrap_or_default();
        assert!(w.ends_with("7.0 ms late (p99): the load generator may be the bottleneck of this round, not the worker"), "{w}");
        // 7 ms against exchanges of a second is noise: no warning (closed loop, slow server).
        let g = GeneratorLoad::new(
            (100_000_000, 1_000_000_000, 2),
            lags.clone(),
            Some(1_000_000),
        );
        assert_eq!(g.warning, None);
        // ... but 7 ms against 60 ms exchanges is not.
        let g = GeneratorLoad::new((100_000_000, 1_000_000_000, 2), lags, Some(60_000));
        assert!(g.warning.is_some());
        // No wall time or no cores never divides by zero.
        let g = GeneratorLoad::new((0, 0, 0), Vec::new(), None);
        assert_eq!(g.cores, 1);
        assert!(g.cpu_share.is_finite() && g.warning.is_none());
    }

    use super::*;

    fn ok(start_us: i64, total_us: i64) -> Sample {
        Sample {
            outcome: Outcome::Ok,
            start_offset_us: start_us,
            total_us: Some(total_us),
            first_byte_us: Some(total_us / 2),
            ..Sample::default()
        }
    }

    #[test]
    fn the_pooled_decode_estimator_sums_before_it_divides_and_counts_what_it_leaves_out() {
        // 10 tokens in 0.1 s and 10 in 0.2 s of decode: 20 / 0.3 = 66.7 pooled (the
        // per-request mean is 75.0).
        let (a, b) = (
            streamed(0, 0, 100_000, 10, 1),
            streamed(0, 0, 200_000, 10, 1),
        );
        let d = decode(&[&a, &b]);
        assert!((d.pooled_tokens_per_second.unwrap() - 20.0 / 0.3).abs() < 1e-9);
        assert_eq!(d.pooled_streams, 2);
        // A burst: 9 tokens after the first in one read, 185 us later. The per-request
        // mean jumps; the pooled estimator leaves it out and counts it.
        let mut burst = streamed(0, 0, 185, 10, 1);
        if let Some(st) = burst.stream.as_mut() {
            st.gaps_us = [vec![185], vec![0; 8]].concat();
            st.bundled = true;
        }
        let no_decode = Sample {
            total_us: Some(0),
            ..streamed(0, 0, 100, 2, 1)
        };
        let d = decode(&[&a, &b, &burst, &no_decode]);
        assert!((d.pooled_tokens_per_second.unwrap() - 20.0 / 0.3).abs() < 1e-9);
        assert_eq!((d.bundled, d.no_decode_time, d.pooled_streams), (1, 1, 2));
        let mean = stream_metrics(&[&a, &b, &burst], 1.0)
            .and_then(|m| m.output_tokens_per_second_mean)
            .unwrap();
        assert!(mean > 10_000.0, "{mean}");
        // What counts as bundled: more than half of the events after the first in one
        // read, at least two of them.
        use crate::model::bundled;
        assert!(bundled(&[0, 5, 5, 5]));
        assert!(bundled(&[0, 5, 5]));
        assert!(!bundled(&[0, 5]));
        assert!(!bundled(&[0, 1, 2, 3, 3]));
        assert!(bundled(&[0, 1, 3, 3, 3]));
        assert!(!bundled(&[]));
    }

    fn streamed(start_us: i64, ttft_us: i64, total_us: i64, tokens: i64, prompt: i64) -> Sample {
        let step = (total_us - ttft_us) / (tokens - 1);
        let offsets: Vec<i64> = (0..tokens).map(|i| ttft_us + i * step).collect();
        Sample {
            stream: Some(StreamSample {
                ttft_us: Some(ttft_us),
                tpot_us: Some((total_us - ttft_us) / (tokens - 1)),
                output_tokens: Some(tokens),
                prompt_tokens: Some(prompt),
                gaps_us: offsets.windows(2).map(|w| w[1] - w[0]).collect(),
                bundled: crate::model::bundled(&offsets),
            }),
            ..ok(start_us, total_us)
        }
    }

    #[test]
    fn token_rates_from_the_issue() {
        // Two exchanges of 10 tokens with 100 ms and 200 ms of decode: per-request
        // 100 and 50 tok/s, mean 75. Together 20 tokens in a 1 s round: 20 tok/s.
        let a = streamed(0, 100_000, 200_000, 10, 50);
        let b = streamed(0, 800_000, 1_000_000, 10, 40);
        let r = round_metrics("s", 2, 0, 2, &[a, b]);
        let st = r.stream.unwrap();
        assert_eq!(st.requests, 2);
        assert_eq!(st.output_tokens, 20);
        assert_eq!(st.output_tokens_per_second_mean, Some(75.0));
        assert_eq!(r.elapsed_seconds, 1.0);
        assert_eq!(st.output_tokens_per_second_aggregate, Some(20.0));
        // prefill: 50 tokens in 0.1 s = 500/s and 40 in 0.8 s = 50/s, mean 275/s
        assert_eq!(st.prefill_tokens_per_second_mean, Some(275.0));
        assert_eq!(st.ttft_us.p50, Some(100_000));
        assert_eq!(st.ttft_us.p95, Some(800_000));
        // ITL pooled: 9 gaps of 11_111 us and 9 of 22_222 us; p50 is the 9th smallest.
        assert_eq!(st.itl_us.p50, Some(11_111));
        assert_eq!(st.itl_us.p95, Some(22_222));
        assert_eq!(st.tpot_us.p50, Some(11_111));
    }

    #[test]
    fn nearest_rank_definition() {
        let v: Vec<i64> = (1..=10).collect();
        assert_eq!(nearest_rank(&v, 50), Some(5));
        assert_eq!(nearest_rank(&v, 95), Some(10));
        assert_eq!(nearest_rank(&v, 99), Some(10));
        assert_eq!(nearest_rank(&[], 50), None);
        assert_eq!(nearest_rank(&[7], 1), Some(7));
        // p95 of fewer than 20 samples is the maximum; at 20 it is the 19th.
        let v19: Vec<i64> = (1..=19).collect();
        assert_eq!(nearest_rank(&v19, 95), Some(19));
        let v20: Vec<i64> = (1..=20).collect();
        assert_eq!(nearest_rank(&v20, 95), Some(19));
        let v100: Vec<i64> = (1..=100).collect();
        assert_eq!(nearest_rank(&v100, 50), Some(50));
        assert_eq!(nearest_rank(&v100, 99), Some(99));
    }

    fn at(at_us: i64, exchange_id: i64, decisions: u64) -> Completion {
        Completion {
            at_us,
            exchange_id,
            decisions,
        }
    }

    #[test]
    fn steady_state_window_from_issue() {
        // The seed's example: completions at t = 1..8 s carrying 1..8 decisions, c = 2. The
        // window runs from t=2 to t=6 and holds completions 3..=6: 4 requests and 18
        // decisions in 4.0 s, 1.0 req/s and 4.5 decisions/s. Given out of order.
        let completions: Vec<Completion> = (1..=8)
            .rev()
            .map(|s| at(s * 1_000_000, s, s as u64))
            .collect();
        let ss = steady_state(&completions, 2, true);
        assert_eq!(
            ss,
            SteadyState {
                available: true,
                reason: None,
                start_us: Some(2_000_000),
                end_us: Some(6_000_000),
                requests: Some(4),
                requests_per_second: Some(1.0),
                decisions: Some(18),
                decisions_per_second: Some(4.5),
            }
        );
    }

    #[test]
    fn steady_state_ties_are_broken_by_exchange_id() {
        // Six completions, c = 2: the window holds positions 2 and 3. Ids 7 and 5 share a
        // time across the window's edge (positions 3 and 4): id 5 sorts first, so its 10
        // decisions are in the window and id 7's 3 are not.
        let completions = [
            at(1_000_000, 1, 100),
            at(1_500_000, 2, 1),
            at(2_000_000, 3, 1),
            at(2_500_000, 7, 3),
            at(2_500_000, 5, 10),
            at(3_000_000, 6, 100),
        ];
        let ss = steady_state(&completions, 2, true);
        assert_eq!(
            (ss.start_us, ss.end_us, ss.requests, ss.decisions),
            (Some(1_500_000), Some(2_500_000), Some(2), Some(11))
        );
        assert_eq!(ss.decisions_per_second, Some(11.0));
    }

    #[test]
    fn decisions_per_round_from_the_seed() {
        // 4 requests answering two decisions each -> 8 decisions; over 2 s, 4 per second.
        let s: Vec<Sample> = (0..4)
            .map(|i| Sample {
                exchange_id: i,
                decisions: Some(2),
                ..ok(i * 500_000, 500_000)
            })
            .collect();
        let r = round_metrics("a", 1, 0, 4, &s);
        assert_eq!(r.successful_decisions, 8);
        assert_eq!(r.elapsed_seconds, 2.0);
        assert_eq!(r.successful_decisions_per_second, Some(4.0));
        // Variants answering 1 and 3 entries alternately: 1 + 3 + 1 + 3 = 8. A failure's
        // decisions never count, and an exchange not judged as JSON counts 0.
        let mut s: Vec<Sample> = (0..4)
            .map(|i| Sample {
                exchange_id: i,
                decisions: Some(if i % 2 == 0 { 1 } else { 3 }),
                ..ok(i * 500_000, 500_000)
            })
            .collect();
        s.push(Sample {
            outcome: Outcome::Correctness,
            decisions: Some(50),
            ..ok(0, 10)
        });
        s.push(ok(0, 10));
        assert_eq!(round_metrics("a", 1, 0, 6, &s).successful_decisions, 8);
    }

    #[test]
    fn steady_state_unavailable_reasons() {
        let c: Vec<Completion> = (1..=4).map(|i| at(i, i, 0)).collect();
        let ss = steady_state(&c, 2, true);
        assert!(!ss.available);
        assert_eq!(
            ss.reason.as_deref(),
            Some("needs more than 2 x concurrency completions (n = 4, c = 2)")
        );
        assert_eq!(
            steady_state(&c, 1, false).reason.as_deref(),
            Some("round incomplete")
        );
    }

    #[test]
    fn round_throughput_and_failures() {
        // 4 requests: 3 ok, 1 timeout; first dispatch at 1 s, last completion at 3 s.
        let mut s = vec![
            ok(1_000_000, 500_000),
            ok(1_000_000, 1_000_000),
            ok(2_000_000, 1_000_000),
        ];
        s.push(Sample {
            outcome: Outcome::Timeout,
            start_offset_us: 1_500_000,
            total_us: Some(1_000_000),
            ..Sample::default()
        });
        // An earlier failure, recorded later: the list is in completion order.
        s.push(Sample {
            outcome: Outcome::Http,
            exchange_id: 9,
            start_offset_us: 1_000_000,
            total_us: Some(200_000),
            ..Sample::default()
        });
        let r = round_metrics("a", 2, 0, 5, &s);
        assert_eq!(r.attempted_requests, 5);
        assert_eq!(r.successful_requests, 3);
        assert_eq!(
            r.failures,
            BTreeMap::from([(Outcome::Http, 1), (Outcome::Timeout, 1)])
        );
        assert_eq!(r.elapsed_seconds, 2.0);
        assert_eq!(r.successful_requests_per_second, Some(1.5));
        assert_eq!(r.total_us.p50, Some(1_000_000));
        assert_eq!(r.total_us.p95, Some(1_000_000));
        assert_eq!(r.failure_total_us.p50, Some(200_000));
        assert_eq!(r.failure_total_us.p95, Some(1_000_000));
        assert_eq!(r.failure_latencies_us, vec![200_000, 1_000_000]);
        assert!(!r.complete);
        assert!(!r.steady_state.available);
    }

    #[test]
    fn ordinary_median_and_spread() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        let s = spread(&[90.0, 110.0]).unwrap();
        assert_eq!((s.min, s.median, s.max), (90.0, 100.0, 110.0));
        assert_eq!(s.relative_spread, Some(0.2));
        assert_eq!(spread(&[0.0, 0.0]).unwrap().relative_spread, None);
        assert_eq!(spread(&[]), None);
    }

    #[test]
    fn aggregate_counts_rounds() {
        let complete = round_metrics("a", 1, 0, 2, &[ok(0, 1_000_000), ok(1_000_000, 1_000_000)]);
        let partial = round_metrics("a", 1, 1, 2, &[ok(0, 1_000_000)]);
        let a = aggregate("a", Level::Concurrency(1), 3, &[&complete, &partial]);
        assert_eq!(
            (
                a.planned_rounds,
                a.attempted_rounds,
                a.complete_rounds,
                a.incomplete_rounds
            ),
            (3, 2, 1, 1)
        );
        let rps = a.metrics[0].1.clone().unwrap();
        assert_eq!((rps.rounds, rps.median), (1, 1.0));
    }
}
