//! A replay's measured rounds and excluded-phase counts rebuilt from its recorded rows
//! (`summarize`, also after a crash): the same arithmetic as the live run, over the rows.

use std::collections::BTreeMap;

use super::doc::summary::{
    Ending, PromptTokensMismatch, Recording, ServeEnding, ServeSummary, ShardsNote, Summary,
};
use super::error::ReportError;
use super::opened::OpenedRun;
use crate::config::plan::Plan;
use crate::config::shape::Shape;
use crate::metrics::PhaseCounts;
use crate::metrics::{self, RoundMetrics, Sample};
use crate::model::{Level, Outcome, Phase};
use crate::record::read::RowFacts;

pub(crate) fn rounds_from_rows(
    plan: &Plan,
    shape: Shape,
    facts: &[RowFacts],
) -> (Vec<RoundMetrics>, BTreeMap<Phase, PhaseCounts>, u64) {
    let mut rounds = Vec::new();
    // The live run's order: for a campaign, interleaved arms in rotation r at repetition r,
    // or each arm's rounds in turn (sequential).
    let arms = plan.arm_names();
    let sequential = plan
        .campaign
        .as_ref()
        .is_some_and(|c| c.schedule == crate::config::campaign::Schedule::Sequential);
    let mut order: Vec<(Option<&str>, usize, Level, usize, usize)> = Vec::new();
    let n = arms.len();
    let groups: Vec<Vec<Option<&str>>> = if sequential {
        arms.iter().map(|a| vec![*a]).collect()
    } else {
        vec![arms.clone()]
    };
    for group in &groups {
        for (ci, case) in plan.cases.iter().enumerate() {
            let mut rate_index = 0;
            for (level, reps) in levels_of_rows(plan, shape, facts, &case.name) {
                // An open level's schedule is the seed's stream for its index among rates.
                let li = rate_index;
                rate_index += usize::from(matches!(level, Level::Rate(_)));
                for rep in 0..reps {
                    for k in 0..group.len() {
                        let arm = if sequential {
                            group[k]
                        } else {
                            group[crate::config::campaign::interleaved_arm(n, rep, k)]
                        };
                        order.push((arm, ci, level, li, rep));
                    }
                }
            }
        }
    }
    for (arm, ci, level, li, rep) in order {
        let case = &plan.cases[ci];
        let samples: Vec<Sample> = facts
            .iter()
            .filter(|f| {
                f.phase == Phase::Measured.as_str()
                    && f.arm.as_deref() == arm
                    && f.case_name.as_deref() == Some(case.name.as_str())
                    && f.level() == Some(level)
                    && f.repetition == Some(rep as i32)
            })
            .map(|f| f.sample.clone())
            .collect();
        if !samples.is_empty() {
            let planned = match (level, &plan.load.trace) {
                (Level::Concurrency(_), _) => case.requests_of(plan.requests_per_case),
                (Level::Rate(_), Some(t)) => t.planned(ci, shape.shard_of()),
                (Level::Rate(r), None) => {
                    case.requests_of(plan.load.schedule(r, ci, li, Some(rep)).len())
                }
            };
            let mut r = metrics::level_round_metrics(&case.name, level, rep, planned, &samples);
            r.goodput = plan
                .slo
                .as_ref()
                .map(|slo| metrics::goodput(&samples, slo, r.elapsed_seconds));
            r.arm = arm.map(str::to_string);
            rounds.push(r);
        }
    }
    let mut excluded: BTreeMap<Phase, PhaseCounts> = BTreeMap::new();
    for f in facts {
        let phase = [
            Phase::Health,
            Phase::Readiness,
            Phase::Warmup,
            Phase::Feasibility,
        ]
        .into_iter()
        .find(|p| p.as_str() == f.phase);
        if let Some(p) = phase {
            excluded.entry(p).or_default().add(&f.sample);
        }
    }
    let failures = facts
        .iter()
        .filter(|f| f.sample.outcome != Outcome::Ok)
        .count() as u64;
    (rounds, excluded, failures)
}

/// The levels of one case in run order, each with its planned rounds: the plan's; under
/// `--sweep` those its measured rows ran at, in the order they started.
fn levels_of_rows(
    plan: &Plan,
    shape: Shape,
    facts: &[RowFacts],
    case: &str,
) -> Vec<(Level, usize)> {
    if !shape.levels_from_rounds() {
        return super::plan_levels(plan);
    }
    let mut seen: Vec<(i64, Level)> = Vec::new();
    for f in facts
        .iter()
        .filter(|f| f.phase == Phase::Measured.as_str() && f.case_name.as_deref() == Some(case))
    {
        let Some(l) = f.level() else { continue };
        match seen.iter_mut().find(|(_, x)| *x == l) {
            Some((at, _)) => *at = (*at).min(f.sample.start_offset_us),
            None => seen.push((f.sample.start_offset_us, l)),
        }
    }
    seen.sort_by_key(|(at, _)| *at);
    seen.into_iter()
        .map(|(_, l)| (l, super::sweep_rounds(plan, l)))
        .collect()
}

/// Carry each original round's generator load and wake-up floor (measured live, not in
/// the rows) into the
/// rebuilt round with the same case, concurrency and repetition (lags are whole
/// microseconds written as seconds, so the round trip is exact).
pub(crate) fn carry_generator(rounds: &mut [RoundMetrics], original: &Summary) {
    for r in rounds.iter_mut() {
        let same = original.rounds.iter().find(|o| {
            o.arm == r.arm
                && o.case == r.case_name
                && match r.level() {
                    Level::Concurrency(c) => o.concurrency == Some(c),
                    Level::Rate(x) => o.rate_per_second == Some(x),
                }
                && o.repetition == r.repetition
        });
        if let Some(g) = same.and_then(|o| o.generator.as_ref()) {
            r.generator = Some(g.load());
        }
        // A trace round's wake-up floor was measured live, not recorded in the rows.
        let floor = same.and_then(|o| o.open_loop.as_ref()?.wake_floor_p99_seconds);
        if let (Some(o), Some(f)) = (r.open.as_mut(), floor) {
            o.wake_floor_p99_us = Some((f * 1e6).round() as i64);
        }
    }
}

/// A replay's summary and rounds rebuilt from its rows.
pub(crate) struct Rebuilt {
    pub(crate) summary: Summary,
    pub(crate) rounds: Vec<RoundMetrics>,
    /// The table the run would have printed.
    pub(crate) table: String,
}

/// The run's own ending when it wrote one; else interrupted (it never finished), failed
/// or passed by its rows.
fn replay_ending(original: Option<&Summary>, finished: bool, failures: u64) -> Ending {
    match original.map(|s| s.ending) {
        Some(e) => e,
        None if !finished => Ending::Interrupted,
        None if failures > 0 => Ending::Failed,
        None => Ending::Passed,
    }
}

/// Whether a summary file is itself a rebuild (`rebuilt_from_exchanges: true`); an
/// unreadable one is not.
pub(crate) fn is_rebuilt(path: &std::path::Path) -> bool {
    /// Only the mark a rebuild leaves.
    #[derive(serde::Deserialize)]
    struct Mark {
        #[serde(default)]
        rebuilt_from_exchanges: Option<bool>,
    }
    super::opened::optional_doc::<Mark>(path)
        .ok()
        .flatten()
        .is_some_and(|m| m.rebuilt_from_exchanges == Some(true))
}

/// What the run itself wrote, if it got that far (a crashed run has none): the kept
/// original when an earlier `summarize` made one, else summary.json unless it is itself a
/// rebuild. An unreadable file counts as none.
pub(crate) fn original_summary<T: serde::de::DeserializeOwned>(dir: &std::path::Path) -> Option<T> {
    use crate::record::rundir::{SUMMARY, SUMMARY_ORIG};
    let read = |name: &str| {
        super::opened::optional_doc::<T>(&dir.join(name))
            .ok()
            .flatten()
    };
    read(SUMMARY_ORIG).or_else(|| {
        let own = dir.join(SUMMARY);
        (!is_rebuilt(&own)).then(|| read(SUMMARY)).flatten()
    })
}

/// A plain or campaign replay rebuilt from its rows (a campaign's campaign.json needs
/// what the rows do not hold, memory samples and load times: it is left as the run
/// wrote it; rounds and the summary are rebuilt per arm). What the rows cannot hold is
/// carried over from the run's own summary: each round's generator load, the sweep's
/// notes, the ending, and the worker's numbers with how its scrapes went.
pub(crate) fn rebuild_replay(
    plan: &Plan,
    shape: Shape,
    facts: &[RowFacts],
    original: Option<&Summary>,
    (finished, prompt_tokens): (bool, Option<PromptTokensMismatch>),
) -> Rebuilt {
    let (mut rounds, excluded, failures) = rounds_from_rows(plan, shape, facts);
    if let Some(o) = original {
        carry_generator(&mut rounds, o);
    }
    let notes: Vec<String> = original.map(|o| o.load.notes.clone()).unwrap_or_default();
    let ending = replay_ending(original, finished, failures);
    let mut r = rebuilt(
        plan,
        shape,
        (rounds, excluded, failures),
        ending,
        &notes,
        (None, prompt_tokens),
        facts.len(),
    );
    // The worker's numbers came from its scrapes, which the rows do not hold; so did how
    // its scrapes went.
    if let Some(o) = original {
        super::worker::carry(&mut r.summary.rounds, &o.rounds);
        r.summary.worker_metrics_scrapes = o.worker_metrics_scrapes.clone();
        r.summary.worker_metrics_limits = o.worker_metrics_limits.clone();
    }
    r
}

/// A sharded run's shards merged onto one timeline: `facts` are every shard's rows, moved
/// to microseconds from `--start-at` ([`OpenedRun::facts`]).
pub(crate) fn merge_shards(run: &OpenedRun, facts: &[RowFacts]) -> Result<Rebuilt, ReportError> {
    let plan = run.replay_plan()?;
    // Every round whole; every shard ran its own health check, readiness and warm-up.
    let shape = run.shape();
    let shards = ShardsNote {
        count: run.shards.len(),
        start_at: run
            .config
            .shard()
            .map(|s| s.start_at.clone())
            .unwrap_or_default(),
        run_ids: run.shards.iter().map(|s| s.config.run_id.clone()).collect(),
        timeline: "start_offset_us and scheduled_offset_us of every shard moved to microseconds from start_at; each shard's own summary (with its generator load) is in shards/I/summary.json".into(),
    };
    let measured = rounds_from_rows(plan, shape, facts);
    let ending = run.shards_ending();
    let dirs: Vec<std::path::PathBuf> = run
        .shards
        .iter()
        .map(|s| crate::record::rundir::shard_exchanges(&run.dir, s.index))
        .collect();
    let wants = super::evidence::Wants {
        prompt_tokens: true,
        ..Default::default()
    };
    let mut evidence = super::evidence::Evidence::read(&dirs, plan, wants);
    let prompt_tokens =
        super::prompt_tokens_mismatch(plan, &mut evidence).map_err(|e| match e {
            super::evidence::EvidenceError::Read(e) => ReportError::Rows(e),
            // Asked for above: never the case, and said as it is if it were.
            not_gathered => ReportError::Refused(not_gathered.to_string()),
        })?;
    Ok(rebuilt(
        plan,
        shape,
        measured,
        ending,
        &[],
        (Some(shards), prompt_tokens),
        facts.len(),
    ))
}

/// The summary and table of rounds rebuilt from `rows` rows.
fn rebuilt(
    plan: &Plan,
    shape: Shape,
    (rounds, excluded, failures): (Vec<RoundMetrics>, BTreeMap<Phase, PhaseCounts>, u64),
    ending: Ending,
    notes: &[String],
    (shards, prompt_tokens_mismatch): (Option<ShardsNote>, Option<PromptTokensMismatch>),
    rows: usize,
) -> Rebuilt {
    let aggregates = super::aggregates(plan, shape, &rounds);
    let m = super::Measured {
        shape,
        rounds: &rounds,
        aggregates: &aggregates,
        excluded: &excluded,
        ending,
        failures,
        notes,
        worker: &[],
        search_unfinished: false,
    };
    let summary = super::summary(
        plan,
        &m,
        Recording {
            rows_written: rows as u64,
            rebuilt_from_exchanges: Some(true),
            shards,
            prompt_tokens_mismatch,
            ..Recording::default()
        },
    );
    let table = super::table(plan, &rounds, &aggregates, &excluded);
    Rebuilt {
        summary,
        rounds,
        table,
    }
}
/// A serve run's summary rebuilt from its rows, with what only the live run knew (rows
/// dropped, the recorder's longest slice, the ending, the worker's numbers and scrapes)
/// carried over from its own summary.
pub(crate) fn rebuild_serve(
    facts: &[RowFacts],
    original: Option<&ServeSummary>,
    finished: bool,
) -> (ServeSummary, bool) {
    let mut stats = super::ServeStats::default();
    let mut table = super::routes::RouteTable::default();
    for f in facts {
        stats.requests += 1;
        *stats.by_outcome.entry(f.sample.outcome).or_insert(0) += 1;
        table.add(&f.method, &f.url, f.status, f.sample.clone());
    }
    (stats.routes, stats.ok_total, stats.ok_ttft) = table.finish();
    stats.dropped_rows = original.map_or(0, |p| p.dropped_rows);
    // Only the live run measured its recorder; a crashed run's is unknown (null).
    let slice = original.and_then(|p| p.recorder_longest_slice_us);
    let ending = match original {
        Some(o) => o.ending,
        None if finished => ServeEnding::Stopped,
        None => ServeEnding::Crashed,
    };
    let all_ok = stats.requests == stats.by_outcome.get(&Outcome::Ok).copied().unwrap_or(0);
    let mut summary = super::serve_summary(&stats, facts.len() as u64, slice, Some(ending));
    // The worker's numbers came from its scrapes; ours minus its from the rebuilt p50s.
    summary.worker = original.and_then(|o| o.worker.clone()).map(|mut w| {
        if w.two_sided.is_some() {
            let ttft = super::doc::secs(stats.ok_ttft.p50);
            let e2e = summary.successful_latency_seconds.p50;
            w.two_sided = Some(super::worker::two_sided(ttft, e2e, &w));
        }
        w
    });
    summary.worker_metrics_scrapes = original.and_then(|o| o.worker_metrics_scrapes.clone());
    summary.worker_metrics_limits = original.and_then(|o| o.worker_metrics_limits.clone());
    (summary, all_ok)
}
