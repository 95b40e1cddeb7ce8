//! The run's reports, from the measurements: `summary.json` (with the seed tool's keys at
//! every level), `rounds.parquet` ([`rounds`]), the table on stdout ([`table`]), serve's
//! summary, config.json ([`config_json`]) for both commands, and the rounds rebuilt from
//! recorded rows ([`rebuild`], for `summarize`). Arithmetic lives in `metrics`; this
//! module only arranges and writes it. Never imports a driver: what a serve run did
//! arrives as [`ServeStats`].

pub(crate) mod campaign;
pub(crate) mod compare;
pub(crate) mod config_json;
pub(crate) mod html;
pub(crate) mod rebuild;
pub(crate) mod rounds;
pub(crate) mod routes;
pub(crate) mod table;
pub(crate) mod verdict;

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use crate::config::plan::Plan;
use crate::metrics::{
    self, Aggregate, Percentiles, RoundMetrics, Sample, Spread, THROUGHPUT_SCOPE,
};
use crate::model::{Level, Outcome, Phase};
use crate::record::RecordError;

pub(crate) use rebuild::rounds_from_rows;
pub(crate) use rounds::write_rounds_parquet;
pub(crate) use table::table;

/// What a serve run did.
#[derive(Debug, Clone, Default)]
pub(crate) struct ServeStats {
    pub(crate) requests: u64,
    pub(crate) by_outcome: BTreeMap<Outcome, u64>,
    /// Total latency of successful exchanges (µs).
    pub(crate) ok_total: Percentiles,
    /// By route and status class, from the recorded rows.
    pub(crate) routes: Vec<routes::RouteGroup>,
    pub(crate) dropped_rows: u64,
    /// Most finished exchanges that waited at once for room in the recorder's queue.
    pub(crate) backlog_peak: u64,
    pub(crate) record_error: Option<RecordError>,
}

/// The scope of the generator columns and keys.
const GENERATOR_SCOPE: &str = "matrix-proxy's own process during the round (workers, recorder, and the built-in mock worker when --mock-worker runs it): CPU time from getrusage-equivalent accounting, share = CPU / (wall x cores it may run on); dispatch lag = how late a 10 ms tick on the same runtime fired (1 ms timer granularity)";

/// How a replay ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ending {
    /// Every request of the budget succeeded.
    Passed,
    /// At least one failure was recorded.
    Failed,
    /// Ctrl-C / SIGTERM.
    Interrupted,
}

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

/// The levels of one case in run order, each with the rounds planned at it: the plan's
/// levels with its repetitions; under `--sweep`, the levels its rounds ran at (the
/// synchronous round and the throughput probe one round each, each open rate the plan's
/// repetitions).
pub(crate) fn case_levels(plan: &Plan, rounds: &[RoundMetrics], case: &str) -> Vec<(Level, usize)> {
    if plan.sweep.is_none() {
        return plan_levels(plan);
    }
    let mut out: Vec<(Level, usize)> = Vec::new();
    for r in rounds.iter().filter(|r| r.case_name == case) {
        let l = r.level();
        if !out.iter().any(|(x, _)| *x == l) {
            out.push((l, sweep_rounds(plan, l)));
        }
    }
    out
}

/// The plan's own levels, each with its repetitions (no `--sweep`).
pub(crate) fn plan_levels(plan: &Plan) -> Vec<(Level, usize)> {
    plan.levels()
        .into_iter()
        .map(|l| (l, plan.repetitions))
        .collect()
}

/// Rounds a `--sweep` runs at a level: one synchronous round or throughput probe (a
/// concurrency), the plan's repetitions at an open rate.
pub(crate) fn sweep_rounds(plan: &Plan, l: Level) -> usize {
    match l {
        Level::Concurrency(_) => 1,
        Level::Rate(_) => plan.repetitions,
    }
}

/// Requests the run planned, health GET included: the plan's, or under `--sweep` those
/// of the levels its rounds ran at (an open rate's rounds hold `requests_per_case` each;
/// a rate never placed counts its feasibility wave at its bound, `requests_per_case`).
pub(crate) fn planned_requests(plan: &Plan, rounds: &[RoundMetrics]) -> u64 {
    let Some(sweep) = plan.sweep else {
        return plan.planned_requests();
    };
    let n = plan.requests_per_case as u64;
    let reps = plan.repetitions as u64;
    let mut total = plan.prelude_requests();
    for (ci, case) in plan.cases.iter().enumerate() {
        let max_c = plan.concurrency.iter().copied().max().unwrap_or(1) as u64;
        total += 1 + n + max_c.min(n) + n;
        let rates: Vec<f64> = case_levels(plan, rounds, &case.name)
            .into_iter()
            .filter_map(|(l, _)| match l {
                Level::Rate(r) => Some(r),
                Level::Concurrency(_) => None,
            })
            .collect();
        for (li, r) in rates.iter().enumerate() {
            total += plan.load.schedule(*r, ci, li, None).len() as u64 + reps * n;
        }
        total += sweep.saturating_sub(rates.len()) as u64 * (n + reps * n);
    }
    total
}

/// Rounds the run planned per arm: each case's levels times their rounds; under
/// `--sweep N`, per case 2 closed rounds and N rates' repetitions, placed or not.
fn planned_rounds(plan: &Plan, rounds: &[RoundMetrics]) -> usize {
    match plan.sweep {
        Some(n) => plan.cases.len() * (2 + n * plan.repetitions),
        None => plan
            .cases
            .iter()
            .map(|c| {
                case_levels(plan, rounds, &c.name)
                    .iter()
                    .map(|(_, r)| r)
                    .sum::<usize>()
            })
            .sum(),
    }
}

/// Per (arm, case, level) — one unnamed arm for a plain plan — the spread of each metric
/// over its rounds.
pub(crate) fn aggregates(plan: &Plan, rounds: &[RoundMetrics]) -> Vec<Aggregate> {
    let arms = plan.arm_names();
    let mut out = Vec::new();
    for arm in arms {
        for case in &plan.cases {
            for (level, planned) in case_levels(plan, rounds, &case.name) {
                let rs: Vec<&RoundMetrics> = rounds
                    .iter()
                    .filter(|r| {
                        r.arm.as_deref() == arm && r.case_name == case.name && r.level() == level
                    })
                    .collect();
                let mut a = metrics::aggregate(&case.name, level, planned, &rs);
                a.arm = arm.map(str::to_string);
                out.push(a);
            }
        }
    }
    out
}

fn failures_json(f: &BTreeMap<Outcome, u64>) -> Value {
    Value::Object(
        f.iter()
            .map(|(k, v)| (k.as_str().to_string(), json!(v)))
            .collect::<Map<_, _>>(),
    )
}

fn secs(us: Option<i64>) -> Value {
    us.map_or(Value::Null, |v| json!(v as f64 / 1e6))
}

pub(super) fn pct_json(p: &Percentiles) -> Value {
    json!({"p50": secs(p.p50), "p95": secs(p.p95), "p99": secs(p.p99)})
}

fn spread_json(s: &Option<Spread>) -> Value {
    match s {
        None => Value::Null,
        Some(s) => json!({
            "rounds": s.rounds, "min": s.min, "median": s.median, "max": s.max,
            "relative_spread": s.relative_spread,
        }),
    }
}

fn round_json(r: &RoundMetrics) -> Value {
    let mut v = round_json_keys(r);
    // `arm` only in a campaign: a plain plan's summary keeps its keys.
    if let (Some(arm), Value::Object(m)) = (&r.arm, &mut v) {
        m.insert("arm".into(), json!(arm));
    }
    v
}

/// An open round's own numbers; `null` for a closed round.
fn open_json(r: &RoundMetrics) -> Value {
    let Some(o) = &r.open else {
        return Value::Null;
    };
    json!({
        "target_rate_per_second": o.target_rate_per_second,
        "achieved_rate_per_second": o.achieved_rate_per_second,
        "send_lag_seconds": pct_json(&o.send_lag_us),
        "send_lag_max_seconds": secs(o.send_lag_max_us),
        "latency_from_schedule_seconds": pct_json(&o.latency_from_schedule_us),
        "service_latency_seconds": pct_json(&r.total_us),
        "inter_arrival_cv": o.inter_arrival_cv,
        "scheduled_inter_arrival_cv": o.scheduled_inter_arrival_cv,
        "late_sends": o.late_sends,
        "saturated": o.saturated,
    })
}

/// A round's goodput against the plan's `slo`; `null` without one.
fn goodput_json(r: &RoundMetrics) -> Value {
    let Some(g) = &r.goodput else {
        return Value::Null;
    };
    let share = |missed: Option<u64>| {
        missed.map(|m| {
            if r.successful_requests == 0 {
                Value::Null
            } else {
                json!(m as f64 / r.successful_requests as f64)
            }
        })
    };
    json!({
        "good_requests": g.good_requests,
        "good_requests_per_second": g.good_requests_per_second,
        "missed_share": {
            "ttft": share(g.missed_ttft),
            "tpot": share(g.missed_tpot),
            "e2e": share(g.missed_e2e),
        },
        "missed_requests": {"ttft": g.missed_ttft, "tpot": g.missed_tpot, "e2e": g.missed_e2e},
    })
}

fn round_json_keys(r: &RoundMetrics) -> Value {
    let ss = &r.steady_state;
    // An open round's user latency runs from the intended send time.
    let (latency, latency_from) = match &r.open {
        Some(o) => (&o.latency_from_schedule_us, "intended_send_time"),
        None => (&r.total_us, "actual_send"),
    };
    json!({
        "case": r.case_name,
        "concurrency": r.open.is_none().then_some(r.concurrency),
        "rate_per_second": r.open.as_ref().map(|o| o.target_rate_per_second),
        "repetition": r.repetition,
        "planned_requests": r.planned_requests,
        "attempted_requests": r.attempted_requests,
        "successful_requests": r.successful_requests,
        "elapsed_seconds": r.elapsed_seconds,
        "successful_requests_per_second": r.successful_requests_per_second,
        "successful_latency_seconds": pct_json(latency),
        "latency_from": latency_from,
        "service_latency_seconds": pct_json(&r.total_us),
        "failures": failures_json(&r.failures),
        "failure_latency_seconds": r.failure_latencies_us.iter().map(|&us| us as f64 / 1e6).collect::<Vec<f64>>(),
        "failure_latency_percentiles_seconds": if r.failures.is_empty() { Value::Null } else { pct_json(&r.failure_total_us) },
        "successful_decisions": r.successful_decisions,
        "successful_decisions_per_second": r.successful_decisions_per_second,
        "complete": r.complete,
        "steady_state": {
            "available": ss.available,
            "reason": ss.reason,
            "window_start_seconds": secs(ss.start_us),
            "window_end_seconds": secs(ss.end_us),
            "requests": ss.requests,
            "requests_per_second": ss.requests_per_second,
            "decisions": ss.decisions,
            "decisions_per_second": ss.decisions_per_second,
        },
        "throughput_scope": THROUGHPUT_SCOPE,
        "first_byte_seconds": pct_json(&r.first_byte_us),
        "connect_seconds": pct_json(&r.connect_us),
        "generator": r.generator.as_ref().map(|g| json!({
            "cpu_seconds": g.cpu_seconds,
            "cpu_share": g.cpu_share,
            "cores": g.cores,
            "dispatch_lag_seconds": pct_json(&g.lag_us),
            "dispatch_lag_max_seconds": secs(g.lag_max_us),
            "warning": g.warning,
            "scope": GENERATOR_SCOPE,
        })),
        "stream": r.stream.as_ref().map(|st| json!({
            "requests": st.requests,
            "ttft_seconds": pct_json(&st.ttft_us),
            "tpot_seconds": pct_json(&st.tpot_us),
            "itl_seconds": pct_json(&st.itl_us),
            "itl_scope": "pooled over every inter-token gap of every successful exchange",
            "output_tokens": st.output_tokens,
            "output_tokens_per_second": {
                "per_request_mean": st.output_tokens_per_second_mean,
                "aggregate": st.output_tokens_per_second_aggregate,
            },
            "prefill_tokens_per_second_mean": st.prefill_tokens_per_second_mean,
        })),
        "open_loop": open_json(r),
        "goodput": goodput_json(r),
    })
}

pub(crate) fn summary_json(
    plan: &Plan,
    rounds: &[RoundMetrics],
    aggs: &[Aggregate],
    excluded: &BTreeMap<Phase, PhaseCounts>,
    ending: Ending,
    total_failures: u64,
    notes: &[String],
) -> Value {
    let mut failures: BTreeMap<Outcome, u64> = BTreeMap::new();
    for r in rounds {
        for (k, v) in &r.failures {
            *failures.entry(*k).or_insert(0) += v;
        }
    }
    for c in excluded.values() {
        for (k, v) in &c.failures {
            *failures.entry(*k).or_insert(0) += v;
        }
    }
    let arms = plan.campaign.as_ref().map_or(1, |c| c.arms.len());
    let planned_rounds = arms * planned_rounds(plan, rounds);
    let complete = ending == Ending::Passed
        && total_failures == 0
        && rounds.len() == planned_rounds
        && rounds.iter().all(|r| r.complete);
    let excluded_json: Map<String, Value> = excluded
        .iter()
        .map(|(p, c)| {
            (
                p.as_str().to_string(),
                json!({"attempted_requests": c.attempted, "successful_requests": c.successful, "failures": failures_json(&c.failures)}),
            )
        })
        .collect();
    json!({
        "complete": complete,
        "failures": failures_json(&failures),
        "rounds": rounds.iter().map(round_json).collect::<Vec<_>>(),
        "round_aggregates": aggs.iter().map(|a| {
            let mut v = json!({
            "case": a.case_name,
            "concurrency": a.rate.is_none().then_some(a.concurrency),
            "rate_per_second": a.rate,
            "planned_rounds": a.planned_rounds,
            "attempted_rounds": a.attempted_rounds,
            "complete_rounds": a.complete_rounds,
            "incomplete_rounds": a.incomplete_rounds,
            "metrics": Value::Object(a.metrics.iter().map(|(k, s)| (k.to_string(), spread_json(s))).collect()),
            });
            if let (Some(arm), Value::Object(m)) = (&a.arm, &mut v) {
                m.insert("arm".into(), json!(arm));
            }
            v
        }).collect::<Vec<_>>(),
        "excluded_phases": excluded_json,
        "ending": match ending { Ending::Passed => "passed", Ending::Failed => "failed", Ending::Interrupted => "interrupted" },
        "planned_rounds": planned_rounds,
        "planned_requests": planned_requests(plan, rounds) * arms as u64,
        "load": if notes.is_empty() {
            json!({"mode": plan.load.mode.as_str(), "sweep": plan.sweep})
        } else {
            json!({"mode": plan.load.mode.as_str(), "sweep": plan.sweep, "notes": notes})
        },
        "definitions": {
            "latency": "t0 (worker starts the exchange) to the last response body byte; oracle validation excluded. In an open-loop round successful_latency_seconds runs from the intended send time (latency_from: intended_send_time; the user's latency, queueing included) and service_latency_seconds from the actual send",
            "open_loop": format!("send_lag = actual send - intended send; achieved_rate_per_second = (sends - 1) / (last send - first send); inter_arrival_cv = standard deviation / mean of the gaps between actual sends (scheduled_inter_arrival_cv: between intended ones); a round is saturated when any send fell more than {} ms behind its schedule (late_sends counts them)", metrics::SATURATION_LAG_US / 1000),
            "goodput": "successful requests (oracle passed) that met every bound of the plan's slo, per second of the round's elapsed time; ttft is the first content event of a stream, the first response byte otherwise; a tpot bound does not apply to an exchange without a tpot (not a stream, or one output token); e2e runs from the intended send time in an open loop; missed_share is over successful requests",
            "percentiles": "nearest rank over the round's successful exchanges: sorted[ceil(p*n)-1]; p95 of fewer than 20 samples is the maximum",
            "throughput_scope": "successful requests / (last completion - first dispatch) of the round, ramp and drain included",
            "steady_state": "complete rounds with n > 2c: completions sorted, first and last c dropped; rate over completion c .. completion n-c",
            "round_aggregates": "over complete rounds only (goodput_requests_per_second: over every fully attempted round, since failures are what it counts against); median is the ordinary median; relative_spread = (max - min) / median",
            "ttft": "t0 to the first event carrying generated content (OpenAI: non-empty delta.content or text; other event streams: the first event)",
            "tpot": "(total - ttft) / (output_tokens - 1), per exchange with more than one output token",
            "itl": "gaps between consecutive content events, pooled over every successful exchange of the round",
            "output_tokens_per_second": "per_request_mean: mean of output_tokens / (total - ttft); aggregate: all output tokens of successful exchanges / round elapsed time",
            "prefill_tokens_per_second_mean": "mean of prompt_tokens / ttft",
            "failure_latency_seconds": "each failed exchange's latency in seconds, in completion order ([] when none); failure_latency_percentiles_seconds: nearest rank over the same",
            "decisions": format!("per successful exchange judged by a JSON oracle, the entries (array elements or object members) of the answer's {} member, 0 when absent or not a container; successful_decisions_per_second over the round's elapsed time, steady_state.decisions over the window's members", plan.decisions_pointer.as_str()),
        },
    })
}

/// serve's summary.json.
pub(crate) fn serve_summary_json(
    stats: &ServeStats,
    rows: u64,
    longest_slice_us: Option<u64>,
) -> Value {
    let failures: Map<String, Value> = stats
        .by_outcome
        .iter()
        .filter(|(o, _)| **o != Outcome::Ok)
        .map(|(o, n)| (o.as_str().to_string(), json!(n)))
        .collect();
    json!({
        "ending": "stopped",
        "requests": stats.requests,
        "successful_requests": stats.by_outcome.get(&Outcome::Ok).copied().unwrap_or(0),
        "failures": failures,
        "rows_written": rows,
        "dropped_rows": stats.dropped_rows,
        "recorder_backlog_peak_rows": stats.backlog_peak,
        "recorder_longest_slice_us": longest_slice_us,
        "successful_latency_seconds": pct_json(&stats.ok_total),
        "routes": routes::routes_json(&stats.routes),
        "record_error": stats.record_error.as_ref().map(|e| e.to_string()),
        "definitions": {
            "latency": "client request head parsed to the last upstream body byte (total_us); nearest rank over the successful exchanges recorded in exchanges/ (rows dropped under --on-record-full drop are not in it)",
            "routes": format!("one entry per route (method and path as forwarded, without the query; the first {} distinct routes, later ones grouped as \"{}\") and status class of the worker's answer (\"none\": no head came from the worker and the client got the proxy's 502/503/504); latency and stream numbers are nearest rank over the group's ok exchanges; an answer is ok when it reached the client whole, whatever its status", routes::MAX_ROUTES, routes::OTHER),
            "dropped_rows": "rows dropped because the recorder's queue was full (--on-record-full drop); 0 under block",
            "recorder_backlog_peak_rows": "most finished exchanges waiting at once for room in the recorder's queue (block); each holds its client connection's next request, so it is at most the number of client connections",
            "recorder_longest_slice_us": "the longest run of the recorder's work (encoding rows, freeing them, closing row groups and parts) between two of its rests, in its thread's CPU microseconds: about how long a request sharing its core could wait behind it (the recorder sleeps after every ~40 µs of work); null when the recorder failed, or in a summary rebuilt from exchanges/ of a run that never wrote one",
        },
    })
}
