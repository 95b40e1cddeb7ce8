//! `summary.json`: a replay's ([`Summary`]: every round, the aggregates per level, the
//! excluded phases and the denominators) and a serve run's ([`ServeSummary`]).
//!
//! Read leniently: every key but `ending` may be absent (a file written before it
//! existed reads as its default), so `summarize` keeps an older run's ending, and `report`
//! and `compare` read older runs.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{Failures, Pct, present, secs};
use crate::metrics::{GeneratorLoad, RoundMetrics, Spread};
use crate::model::{JudgedBy, Phase};

/// How a replay ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Ending {
    /// Every request of the budget succeeded.
    Passed,
    /// At least one failure was recorded.
    Failed,
    /// Ctrl-C / SIGTERM.
    Interrupted,
}

impl Ending {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Ending::Passed => "passed",
            Ending::Failed => "failed",
            Ending::Interrupted => "interrupted",
        }
    }
}

/// A replay's summary.json.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Summary {
    #[serde(default)]
    pub(crate) complete: bool,
    #[serde(default)]
    pub(crate) failures: Failures,
    #[serde(default)]
    pub(crate) rounds: Vec<Round>,
    #[serde(default)]
    pub(crate) round_aggregates: Vec<RoundAggregate>,
    #[serde(default)]
    pub(crate) excluded_phases: BTreeMap<Phase, ExcludedPhase>,
    pub(crate) ending: Ending,
    #[serde(default)]
    pub(crate) planned_rounds: usize,
    #[serde(default)]
    pub(crate) planned_requests: u64,
    #[serde(default)]
    pub(crate) load: LoadNote,
    /// Each case of the plan and how its answers are judged (absent before capture plans).
    #[serde(default)]
    pub(crate) cases: Vec<CaseDoc>,
    /// Only when the plan gives requests `prompt_tokens` and the rows were recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) prompt_tokens_mismatch: Option<PromptTokensMismatch>,
    #[serde(default)]
    pub(crate) definitions: Definitions,
    /// Rows the recorder wrote (or, rebuilt, the rows read back).
    #[serde(default)]
    pub(crate) rows_written: u64,
    /// Absent under `--no-record`; null when the writer failed.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    pub(crate) rows_encoded_during_rounds: Option<Option<u64>>,
    /// Only when the recorder failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) record_error: Option<String>,
    /// Only in a summary `summarize` rebuilt (or merged) from exchanges/.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) rebuilt_from_exchanges: Option<bool>,
    /// Only in a sharded run's merged summary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) shards: Option<ShardsNote>,
    /// Only when the worker's scrapes reached a bound (rows not held or not written).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) worker_metrics_limits: Option<super::worker::WorkerLimits>,
    /// Only with `--worker-metrics`: how each scraped worker answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) worker_metrics_scrapes: Option<Vec<super::worker::ScrapeHealth>>,
}

/// What a replay wrote beside the measurements (`rows_written` and after).
#[derive(Debug, Clone, Default)]
pub(crate) struct Recording {
    pub(crate) rows_written: u64,
    pub(crate) prompt_tokens_mismatch: Option<PromptTokensMismatch>,
    pub(crate) rows_encoded_during_rounds: Option<Option<u64>>,
    pub(crate) record_error: Option<String>,
    pub(crate) rebuilt_from_exchanges: Option<bool>,
    pub(crate) shards: Option<ShardsNote>,
    pub(crate) worker_metrics_limits: Option<super::worker::WorkerLimits>,
    pub(crate) worker_metrics_scrapes: Option<Vec<super::worker::ScrapeHealth>>,
}

/// summary.json's `load`: the mode, `--sweep`, and what the sweep noted (only when it did).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct LoadNote {
    pub(crate) mode: String,
    pub(crate) sweep: Option<usize>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) notes: Vec<String>,
}

/// The plan's input token counts against the server's `usage.prompt_tokens`, over every
/// `ok` exchange (all phases) that has both.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PromptTokensMismatch {
    pub(crate) compared: u64,
    pub(crate) differing: u64,
    /// The largest |planned - served|; 0 when none differ or none were compared.
    pub(crate) max_abs_diff: u64,
}

impl PromptTokensMismatch {
    pub(crate) fn add(&mut self, planned: i64, served: i64) {
        self.compared += 1;
        let d = planned.abs_diff(served);
        if d > 0 {
            self.differing += 1;
            self.max_abs_diff = self.max_abs_diff.max(d);
        }
    }
}

/// One case of summary.json's `cases`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct CaseDoc {
    pub(crate) name: String,
    /// `"oracle"`, `"drift"` (a campaign case without an oracle) or `false` (a capture
    /// plan's: answers recorded, not judged).
    pub(crate) judged: JudgedBy,
}

/// A merged sharded run's `shards`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ShardsNote {
    pub(crate) count: usize,
    pub(crate) start_at: String,
    pub(crate) run_ids: Vec<String>,
    pub(crate) timeline: String,
}

/// An excluded phase's counts.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct ExcludedPhase {
    pub(crate) attempted_requests: u64,
    pub(crate) successful_requests: u64,
    pub(crate) failures: Failures,
}

/// One measured round.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct Round {
    pub(crate) case: String,
    /// `null` for an open-loop round.
    pub(crate) concurrency: Option<usize>,
    /// An open-loop round's target rate; `null` for a closed round.
    pub(crate) rate_per_second: Option<f64>,
    pub(crate) repetition: usize,
    pub(crate) planned_requests: u64,
    pub(crate) attempted_requests: u64,
    pub(crate) successful_requests: u64,
    pub(crate) elapsed_seconds: f64,
    pub(crate) successful_requests_per_second: Option<f64>,
    pub(crate) successful_latency_seconds: Pct,
    pub(crate) latency_from: String,
    pub(crate) service_latency_seconds: Pct,
    pub(crate) failures: Failures,
    pub(crate) failure_latency_seconds: Vec<f64>,
    pub(crate) failure_latency_percentiles_seconds: Option<Pct>,
    pub(crate) successful_decisions: u64,
    pub(crate) successful_decisions_per_second: Option<f64>,
    pub(crate) complete: bool,
    pub(crate) steady_state: SteadyStateDoc,
    pub(crate) throughput_scope: String,
    pub(crate) first_byte_seconds: Pct,
    pub(crate) connect_seconds: Pct,
    pub(crate) generator: Option<Generator>,
    pub(crate) stream: Option<StreamDoc>,
    #[serde(default)]
    pub(crate) open_loop: Option<OpenLoop>,
    #[serde(default)]
    pub(crate) goodput: Option<GoodputDoc>,
    /// Only for a case with sessions: per turn index.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) turns: Vec<TurnDoc>,
    /// Only in a campaign.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) arm: Option<String>,
    /// The worker's own numbers over the round (only with `--worker-metrics`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) worker: Option<super::worker::WorkerDoc>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct SteadyStateDoc {
    pub(crate) available: bool,
    pub(crate) reason: Option<String>,
    pub(crate) window_start_seconds: Option<f64>,
    pub(crate) window_end_seconds: Option<f64>,
    pub(crate) requests: Option<u64>,
    pub(crate) requests_per_second: Option<f64>,
    pub(crate) decisions: Option<u64>,
    pub(crate) decisions_per_second: Option<f64>,
}

/// The generator's own load during the round.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct Generator {
    pub(crate) cpu_seconds: f64,
    pub(crate) cpu_share: f64,
    pub(crate) cores: usize,
    pub(crate) dispatch_lag_seconds: Pct,
    pub(crate) dispatch_lag_max_seconds: Option<f64>,
    pub(crate) warning: Option<String>,
    pub(crate) scope: String,
}

impl Generator {
    /// The load as measured (for a rebuild that carries it over).
    pub(crate) fn load(&self) -> GeneratorLoad {
        GeneratorLoad {
            cpu_seconds: self.cpu_seconds,
            cpu_share: self.cpu_share,
            cores: self.cores,
            lag_us: self.dispatch_lag_seconds.percentiles(),
            lag_max_us: super::us(self.dispatch_lag_max_seconds),
            warning: self.warning.clone(),
            // Read back, the warning's cause is not kept: only a live search reads it.
            bottleneck: false,
        }
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct StreamDoc {
    pub(crate) requests: u64,
    pub(crate) ttft_seconds: Pct,
    pub(crate) tpot_seconds: Pct,
    pub(crate) itl_seconds: Pct,
    pub(crate) itl_scope: String,
    pub(crate) output_tokens: i64,
    pub(crate) output_tokens_per_second: TokensPerSecond,
    pub(crate) prefill_tokens_per_second_mean: Option<f64>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct TokensPerSecond {
    pub(crate) per_request_mean: Option<f64>,
    pub(crate) aggregate: Option<f64>,
    /// Output tokens / decode time over the round's unbundled streams.
    pub(crate) pooled: Option<f64>,
    /// Streams whose tokens after the first arrived in one read (`stream_bundled`): in
    /// the per-request mean, left out of `pooled`.
    pub(crate) bundled_streams: u64,
}

/// An open round's own numbers.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct OpenLoop {
    pub(crate) target_rate_per_second: f64,
    pub(crate) achieved_rate_per_second: Option<f64>,
    pub(crate) scheduled_rate_per_second: Option<f64>,
    pub(crate) send_lag_seconds: Pct,
    pub(crate) send_lag_max_seconds: Option<f64>,
    pub(crate) latency_from_schedule_seconds: Pct,
    pub(crate) service_latency_seconds: Pct,
    pub(crate) inter_arrival_cv: Option<f64>,
    pub(crate) scheduled_inter_arrival_cv: Option<f64>,
    pub(crate) late_sends: u64,
    pub(crate) saturated: bool,
    /// A trace round: the machine's wake-up floor measured before it (p99).
    pub(crate) wake_floor_p99_seconds: Option<f64>,
}

/// A round's goodput against the plan's `slo`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct GoodputDoc {
    pub(crate) good_requests: u64,
    pub(crate) good_requests_per_second: Option<f64>,
    pub(crate) missed_share: Missed<Option<f64>>,
    pub(crate) missed_requests: Missed<u64>,
}

/// Per bound of the `slo`: `None` (null) when the plan has no such bound.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct Missed<T> {
    pub(crate) ttft: Option<T>,
    pub(crate) tpot: Option<T>,
    pub(crate) e2e: Option<T>,
}

/// Per (arm, case, level): each metric's spread over the level's rounds.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct RoundAggregate {
    pub(crate) case: String,
    pub(crate) concurrency: Option<usize>,
    pub(crate) rate_per_second: Option<f64>,
    pub(crate) planned_rounds: usize,
    pub(crate) attempted_rounds: usize,
    pub(crate) complete_rounds: usize,
    pub(crate) incomplete_rounds: usize,
    /// Metric name -> spread, in the order `metrics::aggregate` lists them.
    pub(crate) metrics: indexmap::IndexMap<String, Option<SpreadDoc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) arm: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct SpreadDoc {
    pub(crate) rounds: usize,
    pub(crate) min: f64,
    pub(crate) median: f64,
    pub(crate) max: f64,
    pub(crate) relative_spread: Option<f64>,
    /// Each round's value in round order (absent in summaries written before it existed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) values: Vec<f64>,
}

impl<T> Default for Missed<T> {
    fn default() -> Missed<T> {
        Missed {
            ttft: None,
            tpot: None,
            e2e: None,
        }
    }
}

impl From<&Spread> for SpreadDoc {
    fn from(s: &Spread) -> SpreadDoc {
        SpreadDoc {
            rounds: s.rounds,
            min: s.min,
            median: s.median,
            max: s.max,
            relative_spread: s.relative_spread,
            values: s.values.clone(),
        }
    }
}

/// What summary.json's keys mean.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct Definitions {
    pub(crate) latency: String,
    pub(crate) open_loop: String,
    pub(crate) goodput: String,
    pub(crate) percentiles: String,
    pub(crate) throughput_scope: String,
    pub(crate) steady_state: String,
    pub(crate) round_aggregates: String,
    pub(crate) ttft: String,
    pub(crate) tpot: String,
    pub(crate) itl: String,
    pub(crate) output_tokens_per_second: String,
    pub(crate) prefill_tokens_per_second_mean: String,
    pub(crate) failure_latency_seconds: String,
    pub(crate) decisions: String,
}

/// The scope of the generator columns and keys.
pub(crate) const GENERATOR_SCOPE: &str = "matrix-proxy's own process during the round (workers, recorder, and the built-in mock worker when --mock-worker runs it): CPU time from getrusage-equivalent accounting, share = CPU / (wall x cores it may run on); dispatch lag = how late a 10 ms tick on the same runtime fired (1 ms timer granularity)";

impl Round {
    /// A round's document from its measurements.
    pub(crate) fn of(r: &RoundMetrics) -> Round {
        let ss = &r.steady_state;
        // An open round's user latency runs from the intended send time.
        let (latency, latency_from) = match &r.open {
            Some(o) => (&o.latency_from_schedule_us, "intended_send_time"),
            None => (&r.total_us, "actual_send"),
        };
        Round {
            case: r.case_name.clone(),
            concurrency: r.open.is_none().then_some(r.concurrency),
            rate_per_second: r.open.as_ref().map(|o| o.target_rate_per_second),
            repetition: r.repetition,
            planned_requests: r.planned_requests,
            attempted_requests: r.attempted_requests,
            successful_requests: r.successful_requests,
            elapsed_seconds: r.elapsed_seconds,
            successful_requests_per_second: r.successful_requests_per_second,
            successful_latency_seconds: Pct::of(latency),
            latency_from: latency_from.into(),
            service_latency_seconds: Pct::of(&r.total_us),
            failures: r.failures.clone(),
            failure_latency_seconds: r
                .failure_latencies_us
                .iter()
                .map(|&us| us as f64 / 1e6)
                .collect(),
            failure_latency_percentiles_seconds: (!r.failures.is_empty())
                .then(|| Pct::of(&r.failure_total_us)),
            successful_decisions: r.successful_decisions,
            successful_decisions_per_second: r.successful_decisions_per_second,
            complete: r.complete,
            steady_state: SteadyStateDoc {
                available: ss.available,
                reason: ss.reason.clone(),
                window_start_seconds: secs(ss.start_us),
                window_end_seconds: secs(ss.end_us),
                requests: ss.requests,
                requests_per_second: ss.requests_per_second,
                decisions: ss.decisions,
                decisions_per_second: ss.decisions_per_second,
            },
            throughput_scope: crate::metrics::THROUGHPUT_SCOPE.into(),
            first_byte_seconds: Pct::of(&r.first_byte_us),
            connect_seconds: Pct::of(&r.connect_us),
            generator: r.generator.as_ref().map(|g| Generator {
                cpu_seconds: g.cpu_seconds,
                cpu_share: g.cpu_share,
                cores: g.cores,
                dispatch_lag_seconds: Pct::of(&g.lag_us),
                dispatch_lag_max_seconds: secs(g.lag_max_us),
                warning: g.warning.clone(),
                scope: GENERATOR_SCOPE.into(),
            }),
            stream: stream_doc(r),
            open_loop: open_loop_doc(r),
            goodput: goodput_doc(r),
            turns: r.turns.iter().map(TurnDoc::of).collect(),
            arm: r.arm.clone(),
            worker: None,
        }
    }
}

/// One turn index of a round's sessions (`metrics::TurnMetrics`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct TurnDoc {
    pub(crate) turn: u16,
    pub(crate) attempted: u64,
    pub(crate) successful: u64,
    pub(crate) first_byte_seconds: Pct,
    /// Streamed answers only.
    pub(crate) ttft_seconds: Pct,
    pub(crate) latency_seconds: Pct,
    pub(crate) prompt_tokens: Counts,
    pub(crate) cached_prompt_tokens: Counts,
    /// Successful turns whose answer reported cached tokens.
    pub(crate) cached_reported: u64,
    /// A trace's sessions: how much later than its own entry's offset each attempted
    /// turn was due (null percentiles outside a trace).
    pub(crate) session_lag_seconds: Pct,
}

/// Nearest-rank percentiles of a count (tokens).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Counts {
    pub(crate) p50: Option<i64>,
    pub(crate) p95: Option<i64>,
    pub(crate) p99: Option<i64>,
}

impl TurnDoc {
    fn of(t: &crate::metrics::TurnMetrics) -> TurnDoc {
        let counts = |p: &crate::metrics::Percentiles| Counts {
            p50: p.p50,
            p95: p.p95,
            p99: p.p99,
        };
        TurnDoc {
            turn: t.turn,
            attempted: t.attempted,
            successful: t.successful,
            first_byte_seconds: Pct::of(&t.first_byte_us),
            ttft_seconds: Pct::of(&t.ttft_us),
            latency_seconds: Pct::of(&t.total_us),
            prompt_tokens: counts(&t.prompt_tokens),
            cached_prompt_tokens: counts(&t.cached_prompt_tokens),
            cached_reported: t.cached_reported,
            session_lag_seconds: Pct::of(&t.session_lag_us),
        }
    }
}

/// A round's `stream` (streaming cases only).
fn stream_doc(r: &RoundMetrics) -> Option<StreamDoc> {
    r.stream.as_ref().map(|st| StreamDoc {
        requests: st.requests,
        ttft_seconds: Pct::of(&st.ttft_us),
        tpot_seconds: Pct::of(&st.tpot_us),
        itl_seconds: Pct::of(&st.itl_us),
        itl_scope: "pooled over every inter-token gap of every successful exchange".into(),
        output_tokens: st.output_tokens,
        output_tokens_per_second: TokensPerSecond {
            per_request_mean: st.output_tokens_per_second_mean,
            aggregate: st.output_tokens_per_second_aggregate,
            pooled: st.output_tokens_per_second_pooled,
            bundled_streams: st.bundled_streams,
        },
        prefill_tokens_per_second_mean: st.prefill_tokens_per_second_mean,
    })
}

/// A round's `open_loop` (open-loop rounds only).
fn open_loop_doc(r: &RoundMetrics) -> Option<OpenLoop> {
    r.open.as_ref().map(|o| OpenLoop {
        target_rate_per_second: o.target_rate_per_second,
        achieved_rate_per_second: o.achieved_rate_per_second,
        scheduled_rate_per_second: o.scheduled_rate_per_second,
        send_lag_seconds: Pct::of(&o.send_lag_us),
        send_lag_max_seconds: secs(o.send_lag_max_us),
        latency_from_schedule_seconds: Pct::of(&o.latency_from_schedule_us),
        service_latency_seconds: Pct::of(&r.total_us),
        inter_arrival_cv: o.inter_arrival_cv,
        scheduled_inter_arrival_cv: o.scheduled_inter_arrival_cv,
        late_sends: o.late_sends,
        saturated: o.saturated,
        wake_floor_p99_seconds: secs(o.wake_floor_p99_us),
    })
}

/// A round's `goodput` (with the plan's slo only).
fn goodput_doc(r: &RoundMetrics) -> Option<GoodputDoc> {
    r.goodput.as_ref().map(|g| {
        let share = |missed: Option<u64>| {
            missed.map(|m| {
                (r.successful_requests != 0).then(|| m as f64 / r.successful_requests as f64)
            })
        };
        GoodputDoc {
            good_requests: g.good_requests,
            good_requests_per_second: g.good_requests_per_second,
            missed_share: Missed {
                ttft: share(g.missed_ttft),
                tpot: share(g.missed_tpot),
                e2e: share(g.missed_e2e),
            },
            missed_requests: Missed {
                ttft: g.missed_ttft,
                tpot: g.missed_tpot,
                e2e: g.missed_e2e,
            },
        }
    })
}

/// serve's summary.json.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ServeSummary {
    pub(crate) ending: ServeEnding,
    #[serde(default)]
    pub(crate) requests: u64,
    #[serde(default)]
    pub(crate) successful_requests: u64,
    #[serde(default)]
    pub(crate) failures: Failures,
    #[serde(default)]
    pub(crate) rows_written: u64,
    #[serde(default)]
    pub(crate) dropped_rows: u64,
    #[serde(default)]
    pub(crate) recorder_backlog_peak_rows: u64,
    #[serde(default)]
    pub(crate) recorder_longest_slice_us: Option<u64>,
    #[serde(default)]
    pub(crate) successful_latency_seconds: Pct,
    #[serde(default)]
    pub(crate) routes: Vec<RouteDoc>,
    #[serde(default)]
    pub(crate) record_error: Option<String>,
    /// Exchanges forwarded whose row the stopped recorder refused.
    #[serde(default)]
    pub(crate) unrecorded_exchanges: u64,
    /// Requests serve answered itself without forwarding them, by status.
    #[serde(default)]
    pub(crate) refused_requests: BTreeMap<u16, u64>,
    /// Messages whose trailer fields serve did not forward.
    #[serde(default)]
    pub(crate) trailers_dropped: u64,
    #[serde(default)]
    pub(crate) definitions: ServeDefinitions,
    /// Only in a summary `summarize` rebuilt from exchanges/.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) rebuilt_from_exchanges: Option<bool>,
    /// The worker's own numbers over the whole run (only with `--worker-metrics`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) worker: Option<super::worker::WorkerDoc>,
    /// Only when the worker's scrapes reached a bound (rows not held or not written).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) worker_metrics_limits: Option<super::worker::WorkerLimits>,
    /// Only with `--worker-metrics`: how each scraped worker answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) worker_metrics_scrapes: Option<Vec<super::worker::ScrapeHealth>>,
}

/// How a serve run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ServeEnding {
    /// Stopped by Ctrl-C / SIGTERM, its files closed.
    Stopped,
    /// A rebuild of a run that never stopped (no summary of its own).
    Crashed,
    /// Stopped by itself because the recorder failed (`--on-record-fail stop`).
    RecordFailed,
}

impl ServeEnding {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ServeEnding::Stopped => "stopped",
            ServeEnding::Crashed => "crashed",
            ServeEnding::RecordFailed => "record_failed",
        }
    }
}

/// One route and status class of a serve run.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct RouteDoc {
    pub(crate) route: String,
    pub(crate) status_class: String,
    pub(crate) requests: u64,
    pub(crate) successful_requests: u64,
    pub(crate) failures: Failures,
    pub(crate) successful_latency_seconds: Pct,
    pub(crate) stream: Option<RouteStreamDoc>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct RouteStreamDoc {
    pub(crate) requests: u64,
    pub(crate) ttft_seconds: Pct,
    pub(crate) itl_seconds: Pct,
    pub(crate) output_tokens: i64,
    pub(crate) output_tokens_per_second_mean: Option<f64>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct ServeDefinitions {
    pub(crate) latency: String,
    pub(crate) routes: String,
    pub(crate) dropped_rows: String,
    pub(crate) recorder_backlog_peak_rows: String,
    pub(crate) recorder_longest_slice_us: String,
    pub(crate) unrecorded_exchanges: String,
    pub(crate) refused_requests: String,
    pub(crate) trailers_dropped: String,
}

/// Either summary a run writes, as a reader finds it.
#[derive(Debug, Clone)]
pub(crate) enum AnySummary {
    Replay(Box<Summary>),
    Serve(Box<ServeSummary>),
}

#[cfg(test)]
mod tests {
    use super::PromptTokensMismatch;

    #[test]
    fn token_counts_that_agree_are_compared_not_differing() {
        let mut m = PromptTokensMismatch::default();
        for (planned, served) in [(10, 10), (512, 513), (7, 4), (3, 3)] {
            m.add(planned, served);
        }
        assert_eq!(
            m,
            PromptTokensMismatch {
                compared: 4,
                differing: 2,
                max_abs_diff: 3
            }
        );
    }
}
