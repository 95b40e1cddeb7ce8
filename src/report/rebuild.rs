//! A replay's measured rounds and excluded-phase counts rebuilt from its recorded rows
//! (`summarize`, also after a crash): the same arithmetic as the live run, over the rows.

use std::collections::BTreeMap;

use super::PhaseCounts;
use crate::config::plan::Plan;
use crate::metrics::{self, RoundMetrics, Sample};
use crate::model::{Outcome, Phase};
use crate::record::read::RowFacts;

pub(crate) fn rounds_from_rows(
    plan: &Plan,
    facts: &[RowFacts],
) -> (Vec<RoundMetrics>, BTreeMap<Phase, PhaseCounts>, u64) {
    let mut rounds = Vec::new();
    for case in &plan.cases {
        for &c in &plan.concurrency {
            for rep in 0..plan.repetitions {
                let samples: Vec<Sample> = facts
                    .iter()
                    .filter(|f| {
                        f.phase == Phase::Measured.as_str()
                            && f.case_name.as_deref() == Some(case.name.as_str())
                            && f.concurrency == Some(c as i32)
                            && f.repetition == Some(rep as i32)
                    })
                    .map(|f| f.sample.clone())
                    .collect();
                if !samples.is_empty() {
                    rounds.push(metrics::round_metrics(
                        &case.name,
                        c,
                        rep,
                        plan.requests_per_case as u64,
                        &samples,
                    ));
                }
            }
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
