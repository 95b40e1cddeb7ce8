//! A (case, concurrency)'s summary over its rounds.

use super::percentiles::*;
use super::round::*;
use crate::model::Level;

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
    let mut metrics = rate_and_latency_spreads(rounds, &complete);
    metrics.extend(stream_spreads(&complete));
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

/// One metric's values over the complete rounds.
fn over(complete: &[&&RoundMetrics], f: &dyn Fn(&RoundMetrics) -> Option<f64>) -> Vec<f64> {
    complete.iter().filter_map(|r| f(r)).collect()
}

/// Microseconds as seconds.
fn secs(v: Option<i64>) -> Option<f64> {
    v.map(|us| us as f64 / 1e6)
}

/// The spreads of the request and decision rates, the latencies and goodput, in the order
/// summary.json lists them.
fn rate_and_latency_spreads(
    rounds: &[&RoundMetrics],
    complete: &[&&RoundMetrics],
) -> Vec<(&'static str, Option<Spread>)> {
    let collect = |f: &dyn Fn(&RoundMetrics) -> Option<f64>| over(complete, f);
    vec![
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
            "send_lag_p50_seconds",
            spread(&collect(&|r| secs(r.open.as_ref()?.send_lag_us.p50))),
        ),
        (
            "send_lag_p99_seconds",
            spread(&collect(&|r| secs(r.open.as_ref()?.send_lag_us.p99))),
        ),
        (
            "achieved_rate_per_second",
            spread(&collect(&|r| r.open.as_ref()?.achieved_rate_per_second)),
        ),
        (
            "scheduled_rate_per_second",
            spread(&collect(&|r| r.open.as_ref()?.scheduled_rate_per_second)),
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
    ]
}

/// The spreads of the streamed answers' metrics (time to first token, inter-token
/// latency, output token rates), after [`rate_and_latency_spreads`].
fn stream_spreads(complete: &[&&RoundMetrics]) -> Vec<(&'static str, Option<Spread>)> {
    let collect = |f: &dyn Fn(&RoundMetrics) -> Option<f64>| over(complete, f);
    vec![
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
    ]
}
