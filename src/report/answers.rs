//! Drift read back from a run: each side's measured `ok` answers from the closed parts of
//! `exchanges/`, paired with the reference's (`crate::drift`) into campaign.json's
//! `drift` (after a campaign run, or by `verdict` for a run made before drift existed)
//! and compare.json's.

use std::collections::BTreeMap;
use std::path::Path;

use super::doc::campaign::{CampaignDoc, DriftEntry, DriftFloor};
use super::evidence::{Evidence, EvidenceError, Sides, add_answer};
use crate::config::campaign::Lane;
use crate::config::plan::Plan;
use crate::drift::{self, Answers, Options};
use crate::record::read::ReadError;

/// Every side's measured `ok` answers of a run.
pub(crate) fn read_answers(exchanges: &Path, plan: &Plan) -> Result<Sides, ReadError> {
    let mut sides = Sides::new();
    crate::record::read::for_each_measured_answer(exchanges, |row| {
        add_answer(&mut sides, row, plan)
    })?;
    Ok(sides)
}

/// What drift reads from the plan besides the answers.
pub(crate) fn options<'a>(plan: &'a Plan, live_cases: &'a [&'a str]) -> Options<'a> {
    Options {
        numeric_pointers: &plan.drift_numeric_pointers,
        decisions_pointer: &plan.decisions_pointer,
        live_cases,
    }
}

/// The plan's cases whose sessions carry a live history.
pub(crate) fn live_cases(plan: &Plan) -> Vec<&str> {
    plan.cases
        .iter()
        .filter(|c| {
            c.sessions
                .as_ref()
                .is_some_and(|s| s.history == crate::config::sessions::History::Live)
        })
        .map(|c| c.name.as_str())
        .collect()
}

/// Add `drift` (one entry per available non-reference arm) to a campaign.json, from the
/// recorded answers gathered in `evidence` (taken from it; they are read only when the
/// reference arm was available).
pub(crate) fn add_drift(
    campaign: &mut CampaignDoc,
    evidence: &mut Evidence,
    plan: &Plan,
) -> Result<(), EvidenceError> {
    let reference_name = campaign.reference_arm.clone();
    let reference_arm = campaign
        .arms
        .iter()
        .find(|a| Some(&a.name) == reference_name.as_ref());
    if let Some(r) = reference_arm.filter(|r| !r.available) {
        // Nothing to pair any arm's answers with: no entry (a gate that needs one has
        // nothing to read), and the reason.
        campaign.drift_unavailable_reason = Some(format!(
            "the reference arm '{}' was unavailable ({}): there are no reference answers to compare with",
            r.name,
            r.unavailable_reason
                .as_deref()
                .unwrap_or("no reason recorded")
        ));
        campaign.drift = Some(Some(Vec::new()));
        campaign.drift_floor = Some(DriftFloor {
            reference_arm: r.name.clone(),
            reason: Some("the reference arm was unavailable".into()),
            drift: drift::Drift::default(),
        });
        return Ok(());
    }
    let mut sides = evidence.take_answers()?;
    let reference = sides.remove(&reference_name).unwrap_or_default();
    let live = live_cases(plan);
    let opts = options(plan, &live);
    let reference_label = reference_name.as_deref().unwrap_or("?");
    let floor = floor(&reference, reference_label, &opts);
    let floor_rate = floor.drift.exact_match_rate;
    let kinds = super::validity::kinds(plan);
    let mut entries = Vec::new();
    for arm in &campaign.arms {
        if !arm.available || Some(&arm.name) == reference_name.as_ref() {
            continue;
        }
        let answers = sides.remove(&Some(arm.name.clone())).unwrap_or_default();
        let mut e = entry(
            &arm.name,
            arm.lane,
            reference_label,
            &reference,
            &answers,
            &opts,
        );
        e.floor_exact_match_rate = floor_rate;
        let validity = super::validity::of(&reference, &answers, &kinds);
        e.validity = (!validity.is_empty()).then_some(validity);
        e.exact_match_rate_minus_floor =
            e.drift.exact_match_rate.zip(floor_rate).map(|(a, f)| a - f);
        entries.push(e);
    }
    campaign.drift = Some(Some(entries));
    campaign.drift_floor = Some(floor);
    if let Some(d) = campaign.definitions.as_mut() {
        d.drift = Some(drift::definitions());
    }
    Ok(())
}

/// The reference's agreement with itself: for every answer slot (case, variant, level,
/// dispatch index), every pair of its repetitions, compared as an arm's answers are. The
/// pairs' own list is left out (campaign.json would hold every pair twice over).
pub(crate) fn floor(reference: &Answers, name: &str, opts: &Options<'_>) -> DriftFloor {
    type Slot = (String, Option<String>, i32, i64, Option<i32>);
    let mut slots: BTreeMap<Slot, BTreeMap<i32, &drift::Answer>> = BTreeMap::new();
    for (k, a) in &reference.by_key {
        let slot = (
            k.case.clone(),
            k.variant.clone(),
            k.concurrency,
            k.dispatch_index,
            k.turn,
        );
        slots.entry(slot).or_default().insert(k.repetition, a);
    }
    // Each pair of repetitions (r1 < r2) is one "repetition" of the pairing, so the two
    // sides line up key by key.
    let mut pair_no: BTreeMap<(i32, i32), i32> = BTreeMap::new();
    let (mut first, mut second) = (Answers::default(), Answers::default());
    for ((case, variant, concurrency, dispatch_index, turn), reps) in slots {
        let reps: Vec<(i32, &drift::Answer)> = reps.into_iter().collect();
        for (i, (r1, a)) in reps.iter().enumerate() {
            for (r2, b) in &reps[i + 1..] {
                let n = pair_no.len() as i32;
                let repetition = *pair_no.entry((*r1, *r2)).or_insert(n);
                let key = drift::Key {
                    case: case.clone(),
                    variant: variant.clone(),
                    concurrency,
                    repetition,
                    dispatch_index,
                    turn,
                };
                first.by_key.insert(key.clone(), (*a).clone());
                second.by_key.insert(key, (*b).clone());
            }
        }
    }
    if first.by_key.is_empty() {
        return DriftFloor {
            reference_arm: name.into(),
            reason: Some(
                "no answer of the reference was repeated at one level (a floor pairs its answers across repetitions)"
                    .into(),
            ),
            drift: drift::Drift::default(),
        };
    }
    let mut d = drift::drift(&first, &second, opts);
    d.prompts.clear();
    DriftFloor {
        reference_arm: name.into(),
        reason: None,
        drift: d,
    }
}

/// One arm's drift entry: `a`'s answers against the reference's `r`.
pub(crate) fn entry(
    name: &str,
    lane: Lane,
    reference: &str,
    r: &Answers,
    a: &Answers,
    opts: &Options<'_>,
) -> DriftEntry {
    DriftEntry {
        arm: name.into(),
        lane: Some(lane),
        advisory: lane == Lane::PerformanceFit,
        reference_arm: reference.into(),
        floor_exact_match_rate: None,
        exact_match_rate_minus_floor: None,
        mcnemar: mcnemar(r, a),
        validity: None,
        weights: None,
        drift: drift::drift(r, a, opts),
    }
    .with_weights()
}

/// The exact McNemar test over the distinct requests (case, variant) both sides had judged
/// by an oracle at the same keys: a side passed a request when every one of its judged
/// answers to it passed (repeats of one request are one item, not independent pairs);
/// `None` when no key was judged on both sides.
fn mcnemar(r: &Answers, a: &Answers) -> Option<crate::stats::McNemar> {
    let mut items: BTreeMap<(&str, Option<&str>), (bool, bool)> = BTreeMap::new();
    for (k, arm) in &a.judged {
        let Some(reference) = r.judged.get(k) else {
            continue;
        };
        let item = items
            .entry((k.case.as_str(), k.variant.as_deref()))
            .or_insert((true, true));
        item.0 &= *reference;
        item.1 &= *arm;
    }
    (!items.is_empty()).then(|| crate::stats::McNemar::of(items.into_values()))
}

/// The floor's line for the terminal.
pub(crate) fn floor_text(f: &DriftFloor) -> String {
    let d = &f.drift;
    match &f.reason {
        Some(why) => format!("drift floor ({} vs itself): none, {why}\n", f.reference_arm),
        None => format!(
            "drift floor ({} vs itself, pairs of repetitions): {} pairs of {} distinct requests, exact match {}, mean similarity {}\n",
            f.reference_arm,
            d.compared_prompts,
            d.distinct_requests,
            d.exact_match_rate
                .map_or("n/a".into(), |x| format!("{:.1} %", x * 100.0)),
            d.mean_similarity
                .map_or("n/a".into(), |x| format!("{x:.3}")),
        ),
    }
}

/// One line per drift entry, for the terminal.
pub(crate) fn drift_text<'a>(entries: impl IntoIterator<Item = &'a DriftEntry>) -> String {
    let mut out = String::new();
    for e in entries {
        let d = &e.drift;
        out.push_str(&format!(
            "drift {} vs {} ({}{}): {} pairs of {} distinct requests, exact match {}{}, mean similarity {}{}\n",
            e.arm,
            e.reference_arm,
            e.lane.map_or("?", Lane::as_str),
            if e.advisory { ", advisory" } else { "" },
            d.compared_prompts,
            d.distinct_requests,
            d.exact_match_rate
                .map_or("n/a".into(), |x| format!("{:.1} %", x * 100.0)),
            e.exact_match_rate_minus_floor
                .map_or(String::new(), |x| format!(
                    " ({:+.1} points from the reference's own floor)",
                    x * 100.0
                )),
            d.mean_similarity
                .map_or("n/a".into(), |x| format!("{x:.3}")),
            if d.compared_prompts == 0 {
                " (no answer of this arm was paired with one of the reference's: a pair is both ok at the same case, variant, level, repetition and dispatch)"
            } else {
                ""
            },
        ));
        out.push_str(&trajectory_text(d));
    }
    out
}

/// The sessions line of a drift entry: how many session runs diverged, and at which
/// turn first (empty outside sessions).
fn trajectory_text(d: &drift::Drift) -> String {
    if d.trajectories.is_empty() {
        return String::new();
    }
    let mut at: BTreeMap<i32, u64> = BTreeMap::new();
    for t in &d.trajectories {
        if let Some(k) = t.first_divergence_turn {
            *at.entry(k).or_default() += 1;
        }
    }
    let diverged: u64 = at.values().sum();
    let first: Vec<String> = at.iter().map(|(k, n)| format!("turn {k}: {n}")).collect();
    format!(
        "  sessions: {} run(s) compared, {diverged} diverged{}{}\n",
        d.trajectories.len(),
        if first.is_empty() {
            String::new()
        } else {
            format!(" (first at {})", first.join(", "))
        },
        if d.off_trajectory_pairs > 0 {
            format!(
                "; {} later live turn(s) answered other prompts and are in no total",
                d.off_trajectory_pairs
            )
        } else {
            String::new()
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::drift::Key;
    use crate::oracle::Pointer;

    fn answers(texts: &[&str]) -> Answers {
        Answers {
            by_key: texts
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    let key = Key {
                        case: "c".into(),
                        variant: None,
                        concurrency: 1,
                        repetition: 0,
                        dispatch_index: i as i64,
                        turn: None,
                    };
                    (key, drift::answer(t.as_bytes(), false, &[]))
                })
                .collect(),
            truncated: Default::default(),
            judged: Default::default(),
        }
    }

    fn with_opts(f: impl FnOnce(&Options<'_>)) {
        let decisions = Pointer::parse("/answers").expect("pointer");
        f(&Options {
            numeric_pointers: &[],
            decisions_pointer: &decisions,
            live_cases: &[],
        });
    }

    #[test]
    fn the_recipe_benchmarks_drift_cases_with_their_lanes() {
        with_opts(lanes);
    }

    #[test]
    fn a_drift_line_without_a_pair_says_what_a_pair_is() {
        with_opts(|opts| {
            let none = entry(
                "q4",
                Lane::PerformanceFit,
                "ref",
                &answers(&[]),
                &answers(&["x", "y"]),
                opts,
            );
            let one = entry(
                "twin",
                Lane::Quality,
                "ref",
                &answers(&["4", "5"]),
                &answers(&["4", "5"]),
                opts,
            );
            let text = drift_text([&none, &one]);
            let lines: Vec<&str> = text.lines().collect();
            assert!(
                lines[0].starts_with("drift q4 vs ref (performance-fit, advisory): 0 pairs of 0 distinct requests, exact match n/a")
                    && lines[0].contains("(no answer of this arm was paired with one of the reference's: a pair is both ok at the same case, variant, level, repetition and dispatch)"),
                "{text}"
            );
            assert!(!lines[1].contains("no answer"), "{text}");
        });
    }

    fn lanes(opts: &Options<'_>) {
        // An identical runtime in the quality lane.
        let reference = answers(&["the capital is Paris", "4"]);
        let e = entry(
            "twin",
            Lane::Quality,
            "ref",
            &reference,
            &answers(&["the capital is Paris", "4"]),
            opts,
        );
        assert_eq!(
            (
                e.drift.compared_prompts,
                e.drift.exact_match_rate,
                e.drift.mean_similarity,
                e.advisory
            ),
            (2, Some(1.0), Some(1.0), false)
        );
        // Paris vs Lyon in the performance-fit lane.
        let reference = answers(&["the capital is Paris"]);
        let e = entry(
            "q4",
            Lane::PerformanceFit,
            "ref",
            &reference,
            &answers(&["the capital is Lyon"]),
            opts,
        );
        assert_eq!((e.drift.exact_match_rate, e.advisory), (Some(0.0), true));
        let sim = e.drift.mean_similarity.expect("similarity");
        assert!(sim > 0.0 && sim < 1.0, "{sim}");
        let p = &e.drift.prompts[0];
        assert_eq!(p.first_divergence_char, Some(15));
        assert_eq!((p.reference_chars, p.arm_chars), (20, 19));
    }

    #[test]
    fn truncated_answers_are_left_out_not_unpaired() {
        with_opts(truncated);
    }

    fn truncated(opts: &Options<'_>) {
        let reference = answers(&["a", "b"]);
        let mut arm = answers(&["a", "b"]);
        let (key, _) = arm.by_key.pop_last().expect("two answers");
        arm.truncated.insert(key);
        let e = entry("x", Lane::Quality, "ref", &reference, &arm, opts);
        assert_eq!(
            (
                e.drift.compared_prompts,
                e.drift.truncated_answers_left_out,
                e.drift.unpaired_reference_answers
            ),
            (1, 1, 0)
        );
    }
}
