//! One round's metrics (`RoundMetrics`) from its samples, the load generator's own
//! load, and the excluded phases' counts.

use std::collections::BTreeMap;

use super::open_loop::*;
use super::percentiles::*;
use super::sample::*;
use super::steady::*;
use super::tokens::*;
use crate::model::{Level, Outcome};

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
    /// Per turn index of a case with sessions (empty otherwise).
    pub(crate) turns: Vec<super::turns::TurnMetrics>,
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
    /// The warning is the tool's own load (its CPU, or lateness while it was busy), not
    /// the host's scheduling noise: a search does not read such a round as the server's.
    pub(crate) bottleneck: bool,
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
        let own = busy.is_some() || (late.is_some() && cpu_share >= HOST_NOISE_CPU_SHARE);
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
            bottleneck: own,
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
        turns: super::turns::turn_metrics(samples),
    }
}
