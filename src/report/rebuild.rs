//! A replay's measured rounds and excluded-phase counts rebuilt from its recorded rows
//! (`summarize`, also after a crash): the same arithmetic as the live run, over the rows.

use std::collections::BTreeMap;

use super::PhaseCounts;
use crate::config::plan::Plan;
use crate::metrics::{self, GeneratorLoad, Percentiles, RoundMetrics, Sample};
use crate::model::{Level, Outcome, Phase};
use crate::record::read::RowFacts;

pub(crate) fn rounds_from_rows(
    plan: &Plan,
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
            for (level, reps) in levels_of_rows(plan, facts, &case.name) {
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
            let planned = match level {
                Level::Concurrency(_) => plan.requests_per_case as u64,
                Level::Rate(r) => plan.load.schedule(r, ci, li, Some(rep)).len() as u64,
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
fn levels_of_rows(plan: &Plan, facts: &[RowFacts], case: &str) -> Vec<(Level, usize)> {
    if plan.sweep.is_none() {
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

/// Carry each original round's generator load (measured live, not in the rows) into the
/// rebuilt round with the same case, concurrency and repetition.
pub(crate) fn carry_generator(rounds: &mut [RoundMetrics], original_summary: &serde_json::Value) {
    let Some(originals) = original_summary["rounds"].as_array() else {
        return;
    };
    for r in rounds.iter_mut() {
        let same = originals.iter().find(|o| {
            o["arm"].as_str() == r.arm.as_deref()
                && o["case"].as_str() == Some(r.case_name.as_str())
                && match r.level() {
                    Level::Concurrency(c) => o["concurrency"].as_u64() == Some(c as u64),
                    Level::Rate(x) => o["rate_per_second"].as_f64() == Some(x),
                }
                && o["repetition"].as_u64() == Some(r.repetition as u64)
        });
        if let Some(g) = same.map(|o| &o["generator"]).filter(|g| g.is_object()) {
            r.generator = generator_of(g);
        }
    }
}

/// A generator block of summary.json back into numbers (lags are whole microseconds
/// written as seconds, so the round trip is exact).
fn generator_of(g: &serde_json::Value) -> Option<GeneratorLoad> {
    let us = |v: &serde_json::Value| v.as_f64().map(|s| (s * 1e6).round() as i64);
    let lag = &g["dispatch_lag_seconds"];
    Some(GeneratorLoad {
        cpu_seconds: g["cpu_seconds"].as_f64()?,
        cpu_share: g["cpu_share"].as_f64()?,
        cores: g["cores"].as_u64()? as usize,
        lag_us: Percentiles {
            p50: us(&lag["p50"]),
            p95: us(&lag["p95"]),
            p99: us(&lag["p99"]),
        },
        lag_max_us: us(&g["dispatch_lag_max_seconds"]),
        warning: g["warning"].as_str().map(str::to_string),
    })
}
