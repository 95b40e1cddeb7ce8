//! A replay's measured rounds and excluded-phase counts rebuilt from its recorded rows
//! (`summarize`, also after a crash): the same arithmetic as the live run, over the rows.

use std::collections::BTreeMap;

use super::PhaseCounts;
use crate::config::plan::Plan;
use crate::metrics::{self, GeneratorLoad, Percentiles, RoundMetrics, Sample};
use crate::model::{Outcome, Phase};
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
    let mut order: Vec<(Option<&str>, usize, usize, usize)> = Vec::new();
    let n = arms.len();
    let groups: Vec<Vec<Option<&str>>> = if sequential {
        arms.iter().map(|a| vec![*a]).collect()
    } else {
        vec![arms.clone()]
    };
    for group in &groups {
        for ci in 0..plan.cases.len() {
            for &c in &plan.concurrency {
                for rep in 0..plan.repetitions {
                    for k in 0..group.len() {
                        let arm = if sequential {
                            group[k]
                        } else {
                            group[crate::config::campaign::interleaved_arm(n, rep, k)]
                        };
                        order.push((arm, ci, c, rep));
                    }
                }
            }
        }
    }
    for (arm, ci, c, rep) in order {
        let case = &plan.cases[ci];
        let samples: Vec<Sample> = facts
            .iter()
            .filter(|f| {
                f.phase == Phase::Measured.as_str()
                    && f.arm.as_deref() == arm
                    && f.case_name.as_deref() == Some(case.name.as_str())
                    && f.concurrency == Some(c as i32)
                    && f.repetition == Some(rep as i32)
            })
            .map(|f| f.sample.clone())
            .collect();
        if !samples.is_empty() {
            let mut r =
                metrics::round_metrics(&case.name, c, rep, plan.requests_per_case as u64, &samples);
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
                && o["concurrency"].as_u64() == Some(r.concurrency as u64)
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
