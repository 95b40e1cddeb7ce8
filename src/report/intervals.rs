//! Bootstrap intervals of the ratio gates' values (campaign.json's `intervals`): per arm
//! and concurrency level, the arm's value over the reference's (latency p95 and the decode
//! estimators), with a 95 % interval from resampling rounds within each (case, level),
//! recomputed from the recorded rows (`crate::stats` holds the procedure). Under the
//! interleaved schedule round `r` of an arm ran beside round `r` of the reference and the
//! two are resampled together (paired); under `sequential`, and between two separate runs
//! (`compare`), rounds are resampled on each side alone (unpaired).

use std::collections::BTreeMap;

use super::doc::campaign::{CampaignDoc, Intervals, RatioInterval};
use super::evidence::{Evidence, EvidenceError, add_row};
pub(crate) use super::evidence::{Round, Rounds};
use crate::metrics::{self, Sample};
use crate::record::read::RowFacts;
use crate::stats::{self, Group};

/// Every side's measured closed-loop rounds from a run's rows, keyed by arm (`None`
/// outside campaigns).
pub(crate) fn rounds_by_side(rows: Vec<RowFacts>) -> BTreeMap<Option<String>, Rounds> {
    let mut out: BTreeMap<Option<String>, Rounds> = BTreeMap::new();
    for r in rows {
        add_row(&mut out, r);
    }
    out
}

/// The values an interval is computed for, by their campaign.json cell names.
pub(crate) const METRICS: [&str; 4] = [
    "latency_p95_ms",
    "decode_tokens_per_sec",
    "decode_pooled_tokens_per_sec",
    "aggregate_decode_tokens_per_sec",
];

/// `metric` over the pooled rounds, as a cell computes it (aggregate decode takes each
/// round's span in its rows, first start to last end, as its wall time).
fn value(metric: &str, rounds: &[&Round]) -> Option<f64> {
    let ok: Vec<&Sample> = rounds.iter().flat_map(|r| r.ok.iter()).collect();
    match metric {
        "latency_p95_ms" => {
            let p = metrics::Percentiles::of(ok.iter().filter_map(|s| s.total_us).collect());
            p.p95.map(|us| us as f64 / 1e3)
        }
        "decode_tokens_per_sec" => {
            metrics::stream_metrics(&ok, 0.0).and_then(|s| s.output_tokens_per_second_mean)
        }
        "decode_pooled_tokens_per_sec" => metrics::decode(&ok).pooled_tokens_per_second,
        "aggregate_decode_tokens_per_sec" => {
            let tokens = metrics::answer_tokens(&ok);
            let secs: f64 = rounds.iter().map(|r| r.span_seconds()).sum();
            (secs > 0.0 && tokens > 0).then(|| tokens as f64 / secs)
        }
        _ => None,
    }
}

/// `arm`'s value over `reference`'s for every level both ran and every metric both have,
/// each with its interval (or why there is none).
pub(crate) fn ratio_intervals(
    name: &str,
    arm: &Rounds,
    reference: &Rounds,
    paired: bool,
) -> Vec<RatioInterval> {
    let levels: std::collections::BTreeSet<u64> = arm.keys().map(|(_, c)| *c).collect();
    let mut out = Vec::new();
    for c in levels {
        // Per case at this level: the reference's rounds and the arm's (paired: only
        // repetitions both ran, in order).
        let mut groups: Vec<(Vec<&Round>, Vec<&Round>)> = Vec::new();
        for ((case, lc), a) in arm.iter().filter(|((_, lc), _)| *lc == c) {
            let Some(r) = reference.get(&(case.clone(), *lc)) else {
                continue;
            };
            let (ra, aa): (Vec<&Round>, Vec<&Round>) = if paired {
                a.iter()
                    .filter_map(|(rep, x)| Some((r.get(rep)?, x)))
                    .unzip()
            } else {
                (r.values().collect(), a.values().collect())
            };
            groups.push((ra, aa));
        }
        if groups.is_empty() {
            continue;
        }
        let all = |side: usize| -> Vec<&Round> {
            groups
                .iter()
                .flat_map(|g| if side == 0 { &g.0 } else { &g.1 })
                .copied()
                .collect()
        };
        let (all_ref, all_arm) = (all(0), all(1));
        for metric in METRICS {
            let (Some(va), Some(vr)) = (value(metric, &all_arm), value(metric, &all_ref)) else {
                continue;
            };
            if vr == 0.0 {
                continue;
            }
            let g: Vec<Group<'_, &Round>> =
                groups.iter().map(|(r, a)| Group { a: r, b: a }).collect();
            let ratio = |r: &[&&Round], a: &[&&Round]| {
                let (r, a): (Vec<&Round>, Vec<&Round>) = (
                    r.iter().map(|x| **x).collect(),
                    a.iter().map(|x| **x).collect(),
                );
                let d = value(metric, &r)?;
                (d != 0.0).then_some(value(metric, &a)? / d)
            };
            let (interval, reason) = match stats::bootstrap(&g, paired, stats::SEED, ratio) {
                Ok(i) => (Some(i), None),
                Err(e) => (None, Some(e.to_string())),
            };
            out.push(RatioInterval {
                arm: name.into(),
                concurrency: c,
                metric: metric.into(),
                ratio: va / vr,
                interval,
                reason,
                rounds_arm: all_arm.len(),
                rounds_reference: all_ref.len(),
            });
        }
    }
    out
}

/// campaign.json's `intervals` for the arms `arms` (name, rounds) against `reference`.
pub(crate) fn intervals<'a>(
    reference: &Rounds,
    arms: impl IntoIterator<Item = (&'a str, &'a Rounds)>,
    paired: bool,
) -> Intervals {
    Intervals {
        paired,
        pairing: if paired {
            "paired: round r of an arm is resampled with round r of the reference at the same (case, level), as the interleaved schedule ran them side by side".into()
        } else {
            "unpaired: each side's rounds are resampled on their own within each (case, level) (the sequential schedule, or two separate runs)".into()
        },
        resamples: stats::RESAMPLES,
        seed: stats::SEED,
        min_rounds: stats::MIN_ROUNDS,
        confidence: 0.95,
        entries: arms
            .into_iter()
            .flat_map(|(name, rounds)| ratio_intervals(name, rounds, reference, paired))
            .collect(),
    }
}

/// Add `intervals` to a campaign.json from the rounds gathered in `evidence` (taken from
/// it; they are read only when the reference arm was available): every available
/// non-reference arm against the reference, paired under the interleaved schedule.
pub(crate) fn add_intervals(
    campaign: &mut CampaignDoc,
    evidence: &mut Evidence,
) -> Result<(), EvidenceError> {
    let Some(reference) = campaign.reference_arm.clone() else {
        return Ok(());
    };
    if campaign.arm(&reference).is_none_or(|a| !a.available) {
        return Ok(());
    }
    let mut sides = evidence.take_rounds()?;
    let r = sides.remove(&Some(reference.clone())).unwrap_or_default();
    let names: Vec<String> = campaign
        .arms
        .iter()
        .filter(|a| a.available && a.name != reference)
        .map(|a| a.name.clone())
        .collect();
    let none = Rounds::new();
    let arms = names
        .iter()
        .map(|n| (n.as_str(), sides.get(&Some(n.clone())).unwrap_or(&none)));
    campaign.intervals = Some(intervals(&r, arms, campaign.schedule == "interleaved"));
    Ok(())
}

/// The intervals' lines for the terminal: per arm and level, pooled decode and latency
/// p95 as ratios to the reference with their 95 % intervals (or why there are none).
pub(crate) fn intervals_text(iv: &Intervals) -> String {
    let mut out = String::new();
    let mut keys: Vec<(&str, u64)> = iv
        .entries
        .iter()
        .map(|e| (e.arm.as_str(), e.concurrency))
        .collect();
    keys.dedup();
    for (arm, c) in keys {
        let shown: Vec<(&RatioInterval, &str)> = [
            ("decode_pooled_tokens_per_sec", "pooled decode"),
            ("latency_p95_ms", "latency p95"),
        ]
        .into_iter()
        .filter_map(|(m, label)| Some((iv.find(arm, c, m)?, label)))
        .collect();
        let parts: Vec<String> = shown
            .iter()
            .map(|(e, label)| match &e.interval {
                Some(i) => format!("{label} x{:.3} [{:.3}, {:.3}]", e.ratio, i.low, i.high),
                None => format!("{label} x{:.3}", e.ratio),
            })
            .collect();
        if parts.is_empty() {
            continue;
        }
        let why = shown
            .iter()
            .find_map(|(e, _)| e.reason.as_deref())
            .map(|w| format!(" (no interval: {w})"))
            .unwrap_or_default();
        out.push_str(&format!(
            "{arm} vs reference c={c}, {} rounds, 95 % intervals: {}{why}\n",
            if iv.paired { "paired" } else { "unpaired" },
            parts.join("; ")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::contract::Thresholds;
    use crate::metrics::StreamSample;
    use crate::model::Outcome;
    use crate::report::doc::verdict::Evaluation;
    use serde_json::json;

    /// A round of 4 streams, each 100 tokens decoded in `decode_ms`, paced (unbundled).
    fn round(decode_ms: f64) -> Round {
        let mut r = Round::default();
        for i in 0..4 {
            let us = (decode_ms * 1e3) as i64;
            r.add(Sample {
                outcome: Outcome::Ok,
                start_offset_us: i,
                total_us: Some(1_000 + us),
                stream: Some(StreamSample {
                    ttft_us: Some(1_000),
                    output_tokens: Some(100),
                    ..StreamSample::default()
                }),
                ..Sample::default()
            });
        }
        r
    }

    /// Ten rounds whose decode times spread 10 % around `ms` (in a shuffled order).
    fn rounds(ms: f64, order: usize) -> Rounds {
        let mut reps = BTreeMap::new();
        for i in 0..10 {
            let k = (i * order) % 10;
            reps.insert(i as i32, round(ms * (0.95 + k as f64 / 90.0)));
        }
        [(("c".to_string(), 1u64), reps)].into_iter().collect()
    }

    fn verdict_on(arm_ms: f64) -> (Option<bool>, [f64; 2], f64) {
        let (r, a) = (rounds(1000.0, 7), rounds(arm_ms, 3));
        let iv = intervals(&r, [("q4", &a)], true);
        let pooled = |x: &Rounds| {
            let all: Vec<&Round> = x.values().flat_map(|m| m.values()).collect();
            value("decode_pooled_tokens_per_sec", &all)
        };
        let cell = |x: &Rounds| {
            json!({"decode_pooled_tokens_per_sec": pooled(x),
            "decode_excluded": {}, "latency_p95_ms": 1.0, "failed_requests": 0,
            "peak_rss_bytes": 100})
        };
        let c: CampaignDoc = serde_json::from_value(json!({
            "reference_arm": "ref",
            "arms": [
                {"name": "ref", "lane": "quality", "reference": true, "available": true,
                 "concurrency": {"1": cell(&r)}},
                {"name": "q4", "lane": "performance-fit", "available": true,
                 "concurrency": {"1": cell(&a)}}],
            "drift": [{"arm": "q4", "concurrency": {"1": {"compared_prompts": 4, "mean_similarity": 1.0}}}],
        }))
        .expect("a campaign.json");
        let c = CampaignDoc {
            intervals: Some(iv),
            ..c
        };
        let t = Thresholds {
            fit_min_decode_speedup: 0.02,
            ..Thresholds::v2()
        };
        let Evaluation::Gates(g) = super::super::verdict::evaluate(&c, &t, None) else {
            panic!("evaluated")
        };
        let speed = &g
            .gates
            .iter()
            .find(|x| x.gate == "fit_min_decode_speedup")
            .expect("gate")
            .arms[0];
        let l = &speed.levels[0];
        (
            l.pass,
            l.interval.expect("an interval"),
            l.ratio.expect("a ratio"),
        )
    }

    #[test]
    fn three_percent_inside_a_ten_percent_spread_does_not_pass_a_two_percent_gate() {
        // 3 % faster (decode time / 1.03): the point ratio clears 1.02, its interval does
        // not; 30 % faster passes.
        let (pass, [low, high], point) = verdict_on(1000.0 / 1.03);
        assert!(point > 1.02, "{point}");
        assert!(low < 1.0 && high > 1.02, "[{low}, {high}]");
        assert_eq!(pass, Some(false));
        let (pass, [low, _], _) = verdict_on(1000.0 / 1.30);
        assert!(low > 1.02, "{low}");
        assert_eq!(pass, Some(true));
    }

    #[test]
    fn fewer_than_five_rounds_give_no_interval_and_the_gate_nothing_to_read() {
        let r = rounds(1000.0, 7);
        let mut a = rounds(500.0, 3);
        for reps in a.values_mut() {
            reps.retain(|rep, _| *rep < 4);
        }
        let iv = intervals(&r, [("q4", &a)], true);
        let e = iv
            .find("q4", 1, "decode_pooled_tokens_per_sec")
            .expect("an entry");
        assert!(e.interval.is_none());
        assert!(
            e.reason
                .as_deref()
                .unwrap_or_default()
                .contains("at least 5"),
            "{e:?}"
        );
        // Unpaired (sequential): all ten reference rounds, the arm's four.
        let iv = intervals(&r, [("q4", &a)], false);
        let e = iv
            .find("q4", 1, "decode_pooled_tokens_per_sec")
            .expect("an entry");
        assert_eq!((e.rounds_arm, e.rounds_reference), (4, 10));
        assert!((e.ratio - 2.0).abs() < 0.1, "{}", e.ratio);
    }
}
