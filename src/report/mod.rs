//! The run's reports, from the measurements: every document a run writes as a type
//! ([`doc`]), built here once: `summary.json` ([`summary`], with the seed tool's keys at
//! every level; [`serve_summary`]), `rounds.parquet` ([`rounds`]), the table on stdout
//! ([`table`]), config.json ([`config_json`]) for both commands, campaign.json
//! ([`campaign`]), verdict.json ([`verdict`]); and what is read back from a finished run
//! ([`opened::OpenedRun`], opened by `run::open`): rounds rebuilt from recorded rows ([`rebuild`], for
//! `summarize`), drift ([`answers`]), comparisons ([`compare`]) and the HTML report
//! ([`html`]). Arithmetic lives in `metrics`; this module arranges it, and the commands
//! write what it builds. Never imports a driver: what a serve run did arrives as
//! [`ServeStats`], what a replay measured as [`Measured`].
//!
//! # After a run
//!
//! The replay driver returns what it measured (`drivers::replay::ReplayResult`: rounds,
//! excluded phases, failures, notes, each arm's measures); `run::finish::replay_documents` has
//! `report` build summary.json (`report::summary`), rounds.parquet and the table from it,
//! written once; one pass over the closed parts (`report::evidence::Evidence::read`)
//! gathers what the reports read back (the prompt token counts, each side's measured
//! answers and rounds); for a campaign `report::campaign::campaign_doc` builds
//! campaign.json, then `report::answers::add_drift` takes the measured `ok` answers from
//! that evidence, pairs each arm's with the reference's and computes `drift`
//! (`src/drift.rs`) into it, and `report::intervals::add_intervals` the rounds' intervals;
//! with `--contract`,
//! `report::verdict::evaluate` reads only that `CampaignDoc` and the thresholds, so
//! `matrix-proxy verdict RUN` later computes the same gates from the same file, read back
//! by `run::open::FinishedRun::open`. `compare` opens two run directories the same way,
//! `report::compare::check_comparable` refuses two workloads
//! (`config::workload::first_difference`), open loops and unrecorded runs, and
//! `Comparison::document` reuses the same drift and, with a contract, the same evaluation
//! on a `CampaignDoc` built from the two runs' sides. Nothing patches a written document:
//! config.json is written at the start with `finished_at` null and once more at the end.

pub(crate) mod answers;
pub(crate) mod campaign;
pub(crate) mod capacity;
pub(crate) mod compare;
pub(crate) mod config_json;
pub(crate) mod doc;
pub(crate) mod error;
pub(crate) mod evidence;
pub(crate) mod gates;
pub(crate) mod html;
pub(crate) mod intervals;
pub(crate) mod opened;
pub(crate) mod rebuild;
pub(crate) mod rounds;
pub(crate) mod routes;
pub(crate) mod search;
pub(crate) mod table;
pub(crate) mod validity;
pub(crate) mod verdict;
pub(crate) mod worker;

use std::collections::BTreeMap;

use crate::config::plan::Plan;
use crate::config::shape::Shape;
use crate::metrics::{self, Aggregate, Percentiles, PhaseCounts, RoundMetrics};
use crate::model::{Level, Outcome, Phase};
use crate::record::RecordError;
use doc::Pct;
use doc::summary::{
    CaseDoc, Definitions, ExcludedPhase, LoadNote, PromptTokensMismatch, Round, RoundAggregate,
    ServeDefinitions, ServeSummary, SpreadDoc, Summary,
};
pub(crate) use doc::summary::{Ending, Recording, ServeEnding};

pub(crate) use rounds::write_rounds_parquet;
pub(crate) use table::table;

/// What a serve run did.
#[derive(Debug, Clone, Default)]
pub(crate) struct ServeStats {
    pub(crate) requests: u64,
    pub(crate) by_outcome: BTreeMap<Outcome, u64>,
    /// Total latency of successful exchanges (µs).
    pub(crate) ok_total: Percentiles,
    /// TTFT of successful streams (µs).
    pub(crate) ok_ttft: Percentiles,
    /// By route and status class, from the recorded rows.
    pub(crate) routes: Vec<routes::RouteGroup>,
    pub(crate) dropped_rows: u64,
    /// Most finished exchanges that waited at once for room in the recorder's queue.
    pub(crate) backlog_peak: u64,
    pub(crate) record_error: Option<RecordError>,
    /// Requests answered by serve itself, by status.
    pub(crate) refused: BTreeMap<u16, u64>,
    pub(crate) trailers_dropped: u64,
    /// Exchanges forwarded whose row the stopped recorder refused.
    pub(crate) unrecorded: u64,
    /// Why serve stopped by itself: the recorder's failure (`--on-record-fail stop`).
    pub(crate) stopped_by_record_failure: Option<String>,
}

/// The levels of one case in run order, each with the rounds planned at it: the plan's
/// levels with its repetitions (a trace's one level, for the cases its window names);
/// under `--sweep`, the levels its rounds ran at (the
/// synchronous round and the throughput probe one round each, each open rate the plan's
/// repetitions).
pub(crate) fn case_levels(
    plan: &Plan,
    shape: Shape,
    rounds: &[RoundMetrics],
    case: &str,
) -> Vec<(Level, usize)> {
    // A trace sends the cases its window's entries name; a case it never names has no
    // round (its entries or none are the trace's, not the plan's budget).
    if let Some(t) = &plan.load.trace {
        let ci = plan.cases.iter().position(|c| c.name == case);
        if ci.is_none_or(|ci| t.planned(ci, None) == 0) {
            return Vec::new();
        }
    }
    if !shape.levels_from_rounds() {
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
pub(crate) fn planned_requests(plan: &Plan, shape: Shape, rounds: &[RoundMetrics]) -> u64 {
    let Some(sweep) = shape.sweep_rates() else {
        return shape.planned_requests(plan);
    };
    let n = plan.requests_per_case as u64;
    let reps = plan.repetitions as u64;
    let mut total = shape.prelude_requests(plan);
    for (ci, case) in plan.cases.iter().enumerate() {
        let max_c = plan.concurrency.iter().copied().max().unwrap_or(1) as u64;
        total += 1 + n + max_c.min(n) + n;
        let rates: Vec<f64> = case_levels(plan, shape, rounds, &case.name)
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
fn planned_rounds(plan: &Plan, shape: Shape, rounds: &[RoundMetrics]) -> usize {
    match shape.sweep_rates() {
        Some(n) => plan.cases.len() * (2 + n * plan.repetitions),
        None => plan
            .cases
            .iter()
            .map(|c| {
                case_levels(plan, shape, rounds, &c.name)
                    .iter()
                    .map(|(_, r)| r)
                    .sum::<usize>()
            })
            .sum(),
    }
}

/// Per (arm, case, level) — one unnamed arm for a plain plan — the spread of each metric
/// over its rounds.
pub(crate) fn aggregates(plan: &Plan, shape: Shape, rounds: &[RoundMetrics]) -> Vec<Aggregate> {
    let arms = plan.arm_names();
    let mut out = Vec::new();
    for arm in arms {
        for case in &plan.cases {
            for (level, planned) in case_levels(plan, shape, rounds, &case.name) {
                let rs: Vec<&RoundMetrics> = rounds
                    .iter()
                    .filter(|r| {
                        r.arm.as_deref() == arm && r.case_name == case.name && r.level() == level
                    })
                    .collect();
                // A search's probes at a level are this arm's rounds there, planned as it
                // went; a level only another arm probed is none of this arm's.
                let planned = match shape.search_kind() {
                    Some(_) if rs.is_empty() => continue,
                    Some(_) => rs.len(),
                    None => planned,
                };
                let mut a = metrics::aggregate(&case.name, level, planned, &rs);
                a.arm = arm.map(str::to_string);
                out.push(a);
            }
        }
    }
    out
}

/// What a replay measured, as its summary is built from it (by the run, or rebuilt from
/// recorded rows by `summarize`).
pub(crate) struct Measured<'a> {
    /// What the command's flags made of the plan.
    pub(crate) shape: Shape,
    pub(crate) rounds: &'a [RoundMetrics],
    pub(crate) aggregates: &'a [Aggregate],
    pub(crate) excluded: &'a BTreeMap<Phase, PhaseCounts>,
    pub(crate) ending: Ending,
    /// Failures in every phase.
    pub(crate) failures: u64,
    /// What `--sweep` noted as it placed its rates.
    pub(crate) notes: &'a [String],
    /// Every sample of the worker's `/metrics` (`--worker-metrics`; empty without).
    pub(crate) worker: &'a [crate::record::scrapes::ScrapeRow],
    /// `--search`: a search stopped before it finished (its budget, its arm's stop), so
    /// the run did not do what it set out to.
    pub(crate) search_unfinished: bool,
}

/// The plan's input token counts against the server's, as `evidence` read them back from
/// the rows (taken from it); `None` when no request of the plan has `prompt_tokens`.
pub(crate) fn prompt_tokens_mismatch(
    plan: &Plan,
    evidence: &mut evidence::Evidence,
) -> Result<Option<PromptTokensMismatch>, evidence::EvidenceError> {
    if !evidence::plans_prompt_tokens(plan) {
        return Ok(None);
    }
    evidence.take_prompt_tokens().map(Some)
}

/// Requests a search planned, health GET included: each arm's prelude, each probe's
/// feasibility wave as sent, and each probe's requests as planned when it started.
fn searched_requests(plan: &Plan, m: &Measured<'_>, arms: u64) -> u64 {
    let feasibility = m
        .excluded
        .get(&Phase::Feasibility)
        .map_or(0, |c| c.attempted);
    let probes: u64 = m.rounds.iter().map(|r| r.planned_requests).sum();
    m.shape.prelude_requests(plan) * arms + feasibility + probes
}

/// A replay's summary.json from what it measured and what it recorded.
pub(crate) fn summary(plan: &Plan, m: &Measured<'_>, recording: Recording) -> Summary {
    let mut failures: BTreeMap<Outcome, u64> = BTreeMap::new();
    for f in m
        .rounds
        .iter()
        .map(|r| &r.failures)
        .chain(m.excluded.values().map(|c| &c.failures))
    {
        for (k, v) in f {
            *failures.entry(*k).or_insert(0) += v;
        }
    }
    let arms = plan.campaign.as_ref().map_or(1, |c| c.arms.len());
    let planned_rounds = match m.shape.search_kind() {
        // A search plans each probe as it goes: every round that ran was planned.
        Some(_) => m.rounds.len(),
        None => arms * planned_rounds(plan, m.shape, m.rounds),
    };
    let complete = m.ending == Ending::Passed
        && !m.search_unfinished
        && m.failures == 0
        && m.rounds.len() == planned_rounds
        && m.rounds.iter().all(|r| r.complete);
    Summary {
        complete,
        failures,
        rounds: worker::with_rounds(m.rounds.iter().map(Round::of).collect(), m.worker),
        round_aggregates: m.aggregates.iter().map(round_aggregate).collect(),
        excluded_phases: m
            .excluded
            .iter()
            .map(|(p, c)| {
                (
                    *p,
                    ExcludedPhase {
                        attempted_requests: c.attempted,
                        successful_requests: c.successful,
                        failures: c.failures.clone(),
                    },
                )
            })
            .collect(),
        ending: m.ending,
        planned_rounds,
        planned_requests: match m.shape.search_kind() {
            Some(_) => searched_requests(plan, m, arms as u64),
            None => planned_requests(plan, m.shape, m.rounds) * arms as u64,
        },
        load: LoadNote {
            mode: plan.load.mode.as_str().into(),
            sweep: m.shape.sweep_rates(),
            notes: m.notes.to_vec(),
        },
        cases: plan
            .judged_cases()
            .into_iter()
            .map(|(name, judged)| CaseDoc {
                name: name.to_string(),
                judged,
            })
            .collect(),
        prompt_tokens_mismatch: recording.prompt_tokens_mismatch,
        definitions: definitions(plan),
        rows_written: recording.rows_written,
        rows_encoded_during_rounds: recording.rows_encoded_during_rounds,
        record_error: recording.record_error,
        rebuilt_from_exchanges: recording.rebuilt_from_exchanges,
        shards: recording.shards,
        worker_metrics_limits: recording.worker_metrics_limits,
        worker_metrics_scrapes: recording.worker_metrics_scrapes,
    }
}

fn round_aggregate(a: &Aggregate) -> RoundAggregate {
    RoundAggregate {
        case: a.case_name.clone(),
        concurrency: a.rate.is_none().then_some(a.concurrency),
        rate_per_second: a.rate,
        planned_rounds: a.planned_rounds,
        attempted_rounds: a.attempted_rounds,
        complete_rounds: a.complete_rounds,
        incomplete_rounds: a.incomplete_rounds,
        metrics: a
            .metrics
            .iter()
            .map(|(k, s)| (k.to_string(), s.as_ref().map(SpreadDoc::from)))
            .collect(),
        arm: a.arm.clone(),
    }
}

fn definitions(plan: &Plan) -> Definitions {
    Definitions {
        latency: "t0 (worker starts the exchange) to the last response body byte; oracle validation excluded. In an open-loop round successful_latency_seconds runs from the intended send time (latency_from: intended_send_time; the user's latency, queueing included) and service_latency_seconds from the actual send".into(),
        open_loop: format!("send_lag = actual send - intended send; achieved_rate_per_second = (sends - 1) / (last send - first send); inter_arrival_cv = standard deviation / mean of the gaps between actual sends (scheduled_inter_arrival_cv: between intended ones); a round is saturated when any send fell more than {} ms behind its schedule (late_sends counts them)", metrics::SATURATION_LAG_US / 1000),
        goodput: "successful requests (oracle passed) that met every bound of the plan's slo, per second of the round's elapsed time; ttft is the first content event of a stream, the first response byte otherwise; a tpot bound does not apply to an exchange without a tpot (not a stream, or one output token); e2e runs from the intended send time in an open loop; missed_share is over successful requests".into(),
        percentiles: "nearest rank over the round's successful exchanges: sorted[ceil(p*n)-1]; p95 of fewer than 20 samples is the maximum".into(),
        throughput_scope: "successful requests / (last completion - first dispatch) of the round, ramp and drain included".into(),
        steady_state: "complete rounds with n > 2c: completions sorted, first and last c dropped; rate over completion c .. completion n-c".into(),
        round_aggregates: "over complete rounds only (goodput_requests_per_second: over every fully attempted round, since failures are what it counts against); median is the ordinary median; relative_spread = (max - min) / median".into(),
        ttft: "t0 to the first event carrying generated content (OpenAI: non-empty delta.content or text; other event streams: the first event)".into(),
        tpot: "(total - ttft) / (output_tokens - 1), per exchange with more than one output token".into(),
        itl: "gaps between consecutive content events, pooled over every successful exchange of the round".into(),
        output_tokens_per_second: "per_request_mean: mean of output_tokens / (total - ttft), streams without a decode time left out; aggregate: all output tokens of successful exchanges / round elapsed time; pooled: output tokens / decode time, both summed over the streams with a decode time that were not bundled (bundled_streams: tokens after the first arrived in one read)".into(),
        prefill_tokens_per_second_mean: "mean of prompt_tokens / ttft".into(),
        failure_latency_seconds: "each failed exchange's latency in seconds, in completion order ([] when none); failure_latency_percentiles_seconds: nearest rank over the same".into(),
        decisions: format!("per successful exchange judged by a JSON oracle, the entries (array elements or object members) of the answer's {} member, 0 when absent or not a container; successful_decisions_per_second over the round's elapsed time, steady_state.decisions over the window's members", plan.decisions_pointer.as_str()),
    }
}

/// serve's summary.json. `rebuilt`: a summary `summarize` rebuilt from exchanges/ (with
/// the ending it keeps).
pub(crate) fn serve_summary(
    stats: &ServeStats,
    rows: u64,
    longest_slice_us: Option<u64>,
    rebuilt: Option<ServeEnding>,
) -> ServeSummary {
    ServeSummary {
        ending: rebuilt.unwrap_or(if stats.stopped_by_record_failure.is_some() {
            ServeEnding::RecordFailed
        } else {
            ServeEnding::Stopped
        }),
        requests: stats.requests,
        successful_requests: stats.by_outcome.get(&Outcome::Ok).copied().unwrap_or(0),
        failures: stats
            .by_outcome
            .iter()
            .filter(|(o, _)| **o != Outcome::Ok)
            .map(|(o, n)| (*o, *n))
            .collect(),
        rows_written: rows,
        dropped_rows: stats.dropped_rows,
        recorder_backlog_peak_rows: stats.backlog_peak,
        recorder_longest_slice_us: longest_slice_us,
        successful_latency_seconds: Pct::of(&stats.ok_total),
        routes: routes::route_docs(&stats.routes),
        record_error: stats.record_error.as_ref().map(|e| e.to_string()),
        unrecorded_exchanges: stats.unrecorded,
        refused_requests: stats.refused.clone(),
        trailers_dropped: stats.trailers_dropped,
        definitions: ServeDefinitions {
            latency: "client request head parsed to the last upstream body byte (total_us); nearest rank over the successful exchanges recorded in exchanges/ (rows dropped under --on-record-full drop are not in it)".into(),
            routes: format!("one entry per route (method and path as forwarded, without the query; the first {} distinct routes, later ones grouped as \"{}\") and status class of the worker's answer (\"none\": no head came from the worker and the client got the proxy's 502/503/504); latency and stream numbers are nearest rank over the group's ok exchanges; an answer is ok when it reached the client whole, whatever its status", routes::MAX_ROUTES, routes::OTHER),
            dropped_rows: "rows dropped because the recorder's queue was full (--on-record-full drop); 0 under block".into(),
            recorder_backlog_peak_rows: "most finished exchanges waiting at once for room in the recorder's queue (block); each holds its client connection's next request, so it is at most the number of client connections".into(),
            unrecorded_exchanges: "exchanges forwarded that have no row in exchanges/ and were not dropped under --on-record-fail drop: the recorder failed before it kept them (refused after it stopped, or lost from its queue or open part); under --on-record-fail stop, the exchanges in flight when it failed, under forward every one after it".into(),
            refused_requests: "requests serve answered itself without forwarding them and without a row, by status: 400 (malformed head, Host missing or repeated, asterisk form), 405 (CONNECT), 431 (head too large), 501 (a transfer coding other than chunked), 503 (the recorder had failed); a 400 for a malformed body or a 408 for a slow one is an exchange with a row, not counted here".into(),
            trailers_dropped: "requests and responses whose trailer bytes serve did not forward: serve writes trailer fields again from the fields it parsed, leaving out what follows the trailer section's first empty line, and sends none to an HTTP/1.0 client".into(),
            recorder_longest_slice_us: "the longest run of the recorder's work (encoding rows, freeing them, closing row groups and parts) between two of its rests, in its thread's CPU microseconds: about how long a request sharing its core could wait behind it (the recorder gives the core back after every ~40 µs of work while it keeps up with its queue); null when the recorder failed, or in a summary rebuilt from exchanges/ of a run that never wrote one".into(),
        },
        rebuilt_from_exchanges: rebuilt.map(|_| true),
        worker: None,
        worker_metrics_limits: None,
        worker_metrics_scrapes: None,
    }
}
