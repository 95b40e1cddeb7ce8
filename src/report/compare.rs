//! `compare`: two finished runs of one workload. Their sides paired (a campaign arm by
//! name, or a plain run), drift of B's answers against A's, and for each pair of sides
//! and each (case, concurrency) both runs measured, every metric of summary.json's
//! `round_aggregates` with both runs' spread across rounds (min, median, max) and the
//! delta of the medians, B - A; with a contract, its verdict on the two runs.

use std::collections::BTreeMap;

use super::answers::{drift_text, entry, floor, options, read_answers};
use super::config_json;
use super::doc::campaign::{ArmDoc, CampaignDoc, Cell, DriftEntry, DriftFloor};
use super::doc::compare::{
    COMPARE_SCHEMA_VERSION, CompareDefinitions, CompareDoc, MetricDefinitions, MetricDelta,
    MetricDeltas, Pair, PairDrift, RunRef, Side,
};
use super::doc::summary::{Ending, RoundAggregate, SpreadDoc, Summary};
use super::doc::verdict::VerdictDoc;
use super::error::ReportError;
use super::intervals::{Rounds, intervals, rounds_by_side};
use super::opened::OpenedRun;
use super::verdict::{self, Provenance};
use crate::config::campaign::Lane;
use crate::config::contract::Contract;
use crate::config::plan::Plan;
use crate::config::workload;
use crate::drift::Answers;

/// The metrics the terminal table shows (compare.json has every one).
const SHOWN: [(&str, &str, f64); 6] = [
    ("successful_requests_per_second", "req/s", 1.0),
    ("latency_p50_seconds", "p50 ms", 1e3),
    ("latency_p95_seconds", "p95 ms", 1e3),
    ("ttft_p50_seconds", "TTFT p50 ms", 1e3),
    ("output_tokens_per_second_mean", "tok/s/req", 1.0),
    ("output_tokens_per_second_pooled", "tok/s pooled", 1.0),
];

fn aggregates<'a>(summary: Option<&'a Summary>, side: &Side) -> Vec<&'a RoundAggregate> {
    summary
        .map(|s| {
            s.round_aggregates
                .iter()
                .filter(|g| g.arm == *side)
                .collect()
        })
        .unwrap_or_default()
}

/// One entry per (pair, case, concurrency) in either run.
pub(crate) fn metric_deltas(
    a: Option<&Summary>,
    b: Option<&Summary>,
    pairs: &[Pair],
) -> Vec<MetricDeltas> {
    let mut out = Vec::new();
    for Pair { a: sa, b: sb } in pairs {
        let (ga, gb) = (aggregates(a, sa), aggregates(b, sb));
        let key = |g: &RoundAggregate| (g.case.clone(), g.concurrency);
        // Every (case, concurrency) of either run, once, in A's order then B's.
        let mut keys: Vec<(String, Option<usize>)> = Vec::new();
        for k in ga.iter().chain(&gb).map(|g| key(g)) {
            if !keys.contains(&k) {
                keys.push(k);
            }
        }
        for k in keys {
            let x = ga.iter().find(|g| key(g) == k);
            let y = gb.iter().find(|g| key(g) == k);
            let names: Vec<String> = x
                .or(y)
                .map(|g| g.metrics.keys().cloned().collect())
                .unwrap_or_default();
            let metrics = names
                .into_iter()
                .map(|name| {
                    let spread = |g: Option<&&RoundAggregate>| -> Option<SpreadDoc> {
                        g.and_then(|g| g.metrics.get(&name).cloned().flatten())
                    };
                    let (ma, mb) = (spread(x), spread(y));
                    let (interval, interval_reason) = delta_interval(ma.as_ref(), mb.as_ref());
                    let med = |m: &Option<SpreadDoc>| m.as_ref().map(|m| m.median);
                    let delta = med(&ma).zip(med(&mb)).map(|(p, q)| q - p);
                    let relative = med(&ma)
                        .zip(delta)
                        .filter(|(p, _)| *p != 0.0)
                        .map(|(p, d)| d / p);
                    let d = MetricDelta {
                        a: ma,
                        b: mb,
                        delta,
                        relative_delta: relative,
                        difference_shown: interval.map(|i| !i.spans(0.0)),
                        interval,
                        interval_reason,
                    };
                    (name, d)
                })
                .collect();
            out.push(MetricDeltas {
                side_a: sa.clone(),
                side_b: sb.clone(),
                case: k.0,
                concurrency: k.1,
                in_a: x.is_some(),
                in_b: y.is_some(),
                metrics,
            });
        }
    }
    out
}

/// The unpaired bootstrap interval of median(B) - median(A) over the two runs' rounds
/// (two separate runs: no round of one ran beside a round of the other), or why there is
/// none.
fn delta_interval(
    a: Option<&SpreadDoc>,
    b: Option<&SpreadDoc>,
) -> (Option<crate::stats::Interval>, Option<String>) {
    let (Some(a), Some(b)) = (a, b) else {
        return (None, None);
    };
    if a.values.is_empty() || b.values.is_empty() {
        return (
            None,
            Some("a summary.json written before round values were recorded".into()),
        );
    }
    let g = [crate::stats::Group {
        a: &a.values[..],
        b: &b.values[..],
    }];
    let median = |v: &[&f64]| crate::metrics::median(&v.iter().map(|x| **x).collect::<Vec<f64>>());
    match crate::stats::bootstrap(&g, false, crate::stats::SEED, |x, y| {
        Some(median(y)? - median(x)?)
    }) {
        Ok(i) => (Some(i), None),
        Err(e) => (None, Some(e.to_string())),
    }
}

/// What compare.json's metric entries mean.
pub(crate) fn definitions() -> MetricDefinitions {
    MetricDefinitions {
        a: "run A's aggregate across its rounds (rounds, min, median, max, relative_spread), from its summary.json".into(),
        b: "run B's, likewise".into(),
        delta: "median of B - median of A".into(),
        relative_delta: "delta / median of A (null when A's median is 0 or either is missing)".into(),
        interval: format!("95 % percentile bootstrap interval of the delta: each run's round values (a.values, b.values) resampled on their own (unpaired: two separate runs), {} resamples, ChaCha8 seed {}; null with interval_reason below {} rounds a side", crate::stats::RESAMPLES, crate::stats::SEED, crate::stats::MIN_ROUNDS),
        difference_shown: "false when the interval spans 0: the table prints \"no difference shown\"".into(),
    }
}

/// The terminal table: per pair, case and concurrency, the shown metrics' medians with
/// each run's [min-max] and the relative change with its 95 % interval (both as shares of
/// A's median), or "no difference shown" when the interval spans 0.
pub(crate) fn table(doc: &CompareDoc) -> String {
    let w = &doc.workload_sha256;
    let mut out = format!(
        "compare A={} B={} (workload {})\n",
        doc.run_a.dir,
        doc.run_b.dir,
        &w[..12.min(w.len())],
    );
    for e in &doc.metrics {
        let side = |s: &Side| s.clone().unwrap_or_else(|| "run".into());
        out.push_str(&format!(
            "{} vs {} {} c={}{}\n",
            side(&e.side_a),
            side(&e.side_b),
            e.case,
            e.concurrency
                .map_or_else(|| "null".to_string(), |c| c.to_string()),
            match (e.in_a, e.in_b) {
                (false, _) => " (only in B)",
                (_, false) => " (only in A)",
                _ => "",
            }
        ));
        for (name, label, scale) in SHOWN {
            let Some(m) = e.metrics.get(name) else {
                continue;
            };
            if m.a.is_none() && m.b.is_none() {
                continue;
            }
            let cell = |v: &Option<SpreadDoc>| match v {
                Some(s) => format!(
                    "{:.2} [{:.2}-{:.2}]",
                    s.median * scale,
                    s.min * scale,
                    s.max * scale
                ),
                None => "-".into(),
            };
            let rel = m
                .relative_delta
                .map_or("-".into(), |r| format!("{:+.1} %", r * 100.0));
            // The interval as a share of A's median, as the change is.
            let base = m.a.as_ref().map(|a| a.median).filter(|x| *x != 0.0);
            let rel = match (m.difference_shown, &m.interval, base) {
                (Some(false), _, _) => format!("no difference shown ({rel})"),
                (Some(true), Some(i), Some(b)) => format!(
                    "{rel} [{:+.2}, {:+.2}] %",
                    i.low / b * 100.0,
                    i.high / b * 100.0
                ),
                _ => rel,
            };
            out.push_str(&format!(
                "  {label:<12} A {:<26} B {:<26} {rel}\n",
                cell(&m.a),
                cell(&m.b)
            ));
        }
    }
    out
}

/// The sides of two runs to compare: both plain (or one side each) pair with each other;
/// otherwise arms pair by name, and the rest are listed as unmatched.
pub(crate) fn pair_sides(a: &[Side], b: &[Side]) -> (Vec<Pair>, Vec<String>) {
    if a.len() == 1 && b.len() == 1 {
        return (
            vec![Pair {
                a: a[0].clone(),
                b: b[0].clone(),
            }],
            Vec::new(),
        );
    }
    let pairs: Vec<Pair> = a
        .iter()
        .filter(|s| b.contains(s))
        .map(|s| Pair {
            a: s.clone(),
            b: s.clone(),
        })
        .collect();
    let unmatched = a
        .iter()
        .map(|s| ("A", s))
        .chain(b.iter().map(|s| ("B", s)))
        .filter(|(_, s)| !pairs.iter().any(|p| p.a == **s))
        .map(|(r, s)| format!("{r}:{}", s.as_deref().unwrap_or("run")))
        .collect();
    (pairs, unmatched)
}

/// A run's sides: its available arms, or the plain run itself.
fn sides_of(run: &Opened<'_>) -> Vec<Side> {
    match run.campaign {
        Some(c) => c
            .arms
            .iter()
            .filter(|a| a.available)
            .map(|a| Some(a.name.clone()))
            .collect(),
        None => vec![None],
    }
}

/// One run of a comparison with the documents compare reads.
struct Opened<'a> {
    run: &'a OpenedRun,
    plan: &'a Plan,
    summary: Option<&'a Summary>,
    campaign: Option<&'a CampaignDoc>,
}

impl<'a> Opened<'a> {
    /// A replay run's plan, summary and campaign.json (refused when one is unreadable,
    /// and when the run has no summary: it did not finish, so its sides cannot be known).
    fn of(run: &'a OpenedRun) -> Result<Opened<'a>, ReportError> {
        let summary = run.replay_summary()?;
        if summary.is_none() {
            return Err(ReportError::Unfinished(format!(
                "{}: no summary.json: the run did not finish (killed or crashed?), so what it measured is unknown; run `matrix-proxy recover {}`, then `matrix-proxy summarize {}` to rebuild its summary from the rows it recorded",
                run.dir.display(),
                run.dir.display(),
                run.dir.display()
            )));
        }
        Ok(Opened {
            plan: run.replay_plan()?,
            summary,
            campaign: run.campaign()?,
            run,
        })
    }
}

/// Two runs to compare, checked by [`check_comparable`].
pub(crate) struct Comparison<'a> {
    a: Opened<'a>,
    b: Opened<'a>,
    /// The lane of B's side when B is not a campaign (a campaign arm keeps its own).
    pub(crate) lane: Lane,
    pub(crate) pairs: Vec<Pair>,
    pub(crate) unmatched: Vec<String>,
    /// `--arm-a`: A's side chosen by name (then the reference of a contract's evaluation).
    arm_a: Option<Side>,
}

/// The sides of `run` (`which`: "a" or "b") to compare: every available arm (a plain run's
/// one side), or the one `arm` names (`--arm-a` / `--arm-b`), refused when it has none.
fn chosen_sides(
    run: &Opened<'_>,
    arm: Option<&str>,
    which: &str,
) -> Result<Vec<Side>, ReportError> {
    let sides = sides_of(run);
    let Some(name) = arm else {
        return Ok(sides);
    };
    let dir = run.run.dir.display();
    if run.campaign.is_none() {
        return Err(ReportError::Refused(format!(
            "--arm-{which} {name}: {dir} is a plain run, its own single side; leave --arm-{which} out"
        )));
    }
    let side = Some(name.to_string());
    if sides.contains(&side) {
        return Ok(vec![side]);
    }
    let names: Vec<&str> = sides.iter().filter_map(|s| s.as_deref()).collect();
    Err(ReportError::Refused(format!(
        "--arm-{which} {name}: {dir} has no available arm of that name (its available arms: {})",
        if names.is_empty() {
            "none".to_string()
        } else {
            names.join(", ")
        }
    )))
}

/// Whether two finished runs can be compared: replay runs of one workload, closed loops,
/// with a side in common and their answers recorded.
pub(crate) fn check_comparable<'a>(
    a: &'a OpenedRun,
    b: &'a OpenedRun,
    lane: Lane,
    (arm_a, arm_b): (Option<&str>, Option<&str>),
) -> Result<Comparison<'a>, ReportError> {
    let (a, b) = (Opened::of(a)?, Opened::of(b)?);
    let (pa, pb) = (a.plan, b.plan);
    if let Some((at, x, y)) = workload::first_difference(&pa.workload, &pb.workload) {
        return Err(ReportError::Refused(format!(
            "{} and {} ran different workloads (workload SHA-256 {} vs {}): they first differ at {} ({x} in {}, {y} in {}); compare runs of one workload",
            a.run.dir.display(),
            b.run.dir.display(),
            config_json::workload_sha256(pa),
            config_json::workload_sha256(pb),
            if at.is_empty() {
                "the root"
            } else {
                at.as_str()
            },
            a.run.dir.display(),
            b.run.dir.display(),
        )));
    }
    for (run, plan) in [(a.run, pa), (b.run, pb)] {
        let sweep = run.shape().sweep_rates().is_some();
        if plan.load.mode.is_open() || sweep {
            return Err(ReportError::Refused(format!(
                "{}: an open-loop run{}: compare pairs levels, cells and drift by concurrency, which open-loop rounds do not have; compare the two runs' rounds.parquet by target_rate_per_second instead (latency_from_schedule_*, good_requests_per_second)",
                run.dir.display(),
                if sweep { " (--sweep)" } else { "" }
            )));
        }
    }
    let (side_a, side_b) = (chosen_sides(&a, arm_a, "a")?, chosen_sides(&b, arm_b, "b")?);
    let (pairs, unmatched) = pair_sides(&side_a, &side_b);
    if pairs.is_empty() {
        return Err(ReportError::Refused(format!(
            "{} and {} have no side in common to compare (unmatched: {}); campaign arms pair by name",
            a.run.dir.display(),
            b.run.dir.display(),
            unmatched.join(", ")
        )));
    }
    let why = "drift, and the gates that read it, need them";
    a.run.refuse_unrecorded(why)?;
    b.run.refuse_unrecorded(why)?;
    Ok(Comparison {
        a,
        b,
        lane,
        pairs,
        unmatched,
        arm_a: arm_a.map(|n| Some(n.to_string())),
    })
}

/// How a contract's evaluation reads the answers: pair `i`'s B side against a reference
/// side of A, and that side's floor.
type ReferenceAnswers<'f> = (
    &'f dyn Fn(usize, &Side) -> DriftEntry,
    &'f dyn Fn(&Side) -> DriftFloor,
);

/// A contract to evaluate on a comparison: run A's side is the reference (quality lane),
/// each of B's sides a candidate in its lane. Pre-registered only when both runs were
/// started with it.
pub(crate) struct CompareContract<'a> {
    pub(crate) contract: &'a Contract,
    pub(crate) path: &'a str,
}

impl Comparison<'_> {
    /// B's side's lane: a campaign arm's own, else the one given.
    fn lane_of(&self, s: &Side) -> Lane {
        match (self.b.campaign, s) {
            (Some(c), Some(n)) => c.arm(n).map_or(Lane::Quality, |x| x.lane),
            _ => self.lane,
        }
    }

    /// compare.json and the text for the terminal.
    pub(crate) fn document(
        &self,
        contract: Option<CompareContract<'_>>,
    ) -> Result<(CompareDoc, String), ReportError> {
        let (a, b) = (&self.a, &self.b);
        let (pa, pb) = (a.plan, b.plan);
        let answers = [
            read_answers(&a.run.exchanges(), pa).map_err(ReportError::Rows)?,
            read_answers(&b.run.exchanges(), pb).map_err(ReportError::Rows)?,
        ];
        let none = Answers::default();
        let of = |i: usize, s: &Side| answers[i].get(s).unwrap_or(&none);
        let live = super::answers::live_cases(pa);
        let opts = options(pa, &live);
        let label = |s: &Side| s.clone().unwrap_or_else(|| "run".into());
        // B's side `sb` against A's side `sa`.
        let pair_drift = |sa: &Side, sb: &Side| {
            entry(
                &format!("B:{}", label(sb)),
                self.lane_of(sb),
                &format!("A:{}", label(sa)),
                of(0, sa),
                of(1, sb),
                &opts,
            )
        };
        let drift: Vec<PairDrift> = self
            .pairs
            .iter()
            .map(|p| PairDrift {
                entry: pair_drift(&p.a, &p.b),
                side_a: p.a.clone(),
                side_b: p.b.clone(),
            })
            .collect();
        let metrics = metric_deltas(a.summary, b.summary, &self.pairs);
        let run_ref = |r: &Opened<'_>| RunRef {
            dir: r.run.dir.display().to_string(),
            run_id: r.run.config.run_id.clone(),
            plan_id: r.plan.name.clone(),
        };
        let mut doc = CompareDoc {
            schema_version: COMPARE_SCHEMA_VERSION,
            run_a: run_ref(a),
            run_b: run_ref(b),
            workload_sha256: config_json::workload_sha256(pa),
            pairs: self.pairs.clone(),
            unmatched_sides: self.unmatched.clone(),
            drift,
            metrics,
            definitions: CompareDefinitions {
                drift: crate::drift::definitions(),
                metrics: definitions(),
            },
            verdict: None,
        };
        let mut text = table(&doc);
        text.push_str(&drift_text(doc.drift.iter().map(|d| &d.entry)));
        if let Some(c) = contract {
            // The reference's floor: A's side against its own repetitions.
            let floor_of = |sa: &Side| floor(of(0, sa), &format!("A:{}", label(sa)), &opts);
            let v = self.verdict(
                &c,
                &doc.drift,
                (&|i, sa| pair_drift(sa, &self.pairs[i].b), &floor_of),
            )?;
            text.push_str(&verdict::verdict_text(&v));
            doc.verdict = Some(v);
        }
        Ok((doc, text))
    }

    /// The contract on the two runs: each of B's sides with its drift against A's
    /// reference side (the pair's own drift when its A side is the reference; else
    /// `drift_of(i, reference)`); cells are the runs' campaign.json cells, or for a plain
    /// run the cells its recorded rows give. Always post hoc unless both runs were started
    /// with this contract.
    fn verdict(
        &self,
        c: &CompareContract<'_>,
        computed: &[PairDrift],
        (drift_of, floor_of): ReferenceAnswers<'_>,
    ) -> Result<VerdictDoc, ReportError> {
        let (a, b) = (&self.a, &self.b);
        let recorded = |r: &Opened<'_>| {
            r.run
                .config
                .replay()
                .and_then(|x| x.contract.as_ref())
                .is_some_and(|x| x.sha256 == c.contract.sha256)
        };
        let post_hoc = (!(recorded(a) && recorded(b))).then(|| {
            "compare evaluates a contract on two runs: it is pre-registered only when both runs were started with it".to_string()
        });
        // The reference: the side --arm-a chose, else A's reference arm when A is a
        // campaign, else A's one side.
        let sa: Side = match (&self.arm_a, a.campaign) {
            (Some(chosen), _) => chosen.clone(),
            (None, Some(k)) => k.reference_arm.clone(),
            (None, None) => self.pairs[0].a.clone(),
        };
        let mut arms = vec![arm_view(a, &sa, "A", Lane::Quality, true)?];
        let mut drift = Vec::new();
        for (i, p) in self.pairs.iter().enumerate() {
            arms.push(arm_view(b, &p.b, "B", self.lane_of(&p.b), false)?);
            drift.push(match computed.get(i) {
                Some(e) if p.a == sa => e.entry.clone(),
                _ => drift_of(i, &sa),
            });
        }
        // Two separate runs: no round of one ran beside a round of the other, so the
        // intervals are unpaired.
        let (ra, rb) = (
            rounds_by_side(a.run.facts()?),
            rounds_by_side(b.run.facts()?),
        );
        let none = Rounds::new();
        fn side_rounds<'r>(
            r: &'r BTreeMap<Side, Rounds>,
            s: &Side,
            none: &'r Rounds,
        ) -> &'r Rounds {
            r.get(s).unwrap_or(none)
        }
        let b_sides: Vec<(String, &Rounds)> = self
            .pairs
            .iter()
            .zip(&arms[1..])
            .map(|(p, arm)| (arm.name.clone(), side_rounds(&rb, &p.b, &none)))
            .collect();
        let intervals = intervals(
            side_rounds(&ra, &sa, &none),
            b_sides.iter().map(|(n, r)| (n.as_str(), *r)),
            false,
        );
        let campaign = CampaignDoc {
            plan_id: a.plan.name.clone(),
            evidence_class: a.campaign.and_then(|k| k.evidence_class.clone()),
            reference_arm: Some(arms[0].name.clone()),
            arms,
            drift: Some(Some(drift)),
            drift_floor: Some(floor_of(&sa)),
            intervals: Some(intervals),
            ..CampaignDoc::default()
        };
        Ok(verdict::verdict_doc(
            &campaign,
            &Provenance {
                contract: c.contract,
                contract_path: c.path,
                run_id: None,
                run_started_at: None,
                // An interrupted side ended before its plan: no decision but a measured
                // reject (report::verdict). Otherwise unset, as before.
                run_ending: [a, b]
                    .iter()
                    .any(|r| r.summary.is_some_and(|s| s.ending == Ending::Interrupted))
                    .then_some("interrupted"),
                post_hoc,
            },
        ))
    }
}

/// One side of a run as a campaign.json arm (name `A:<side>` / `B:<side>`).
fn arm_view(
    run: &Opened<'_>,
    side: &Side,
    tag: &str,
    lane: Lane,
    reference: bool,
) -> Result<ArmDoc, ReportError> {
    let name = format!("{tag}:{}", side.as_deref().unwrap_or("run"));
    let from_campaign = run
        .campaign
        .and_then(|c| side.as_deref().and_then(|n| c.arm(n)))
        .cloned();
    let mut arm = match from_campaign {
        Some(a) => a,
        None => ArmDoc {
            name: String::new(),
            recipe: None,
            lane,
            reference,
            available: true,
            unavailable_reason: None,
            endpoint: None,
            load: None,
            metadata: serde_json::Map::new(),
            concurrency: plain_cells(run)?,
            worker_metrics_scrapes: None,
        },
    };
    arm.name = name;
    arm.lane = lane;
    arm.reference = reference;
    Ok(arm)
}

/// A plain run's cells (per concurrency, every case pooled), from its recorded rows and
/// its rounds' wall time; memory is not sampled outside campaigns.
fn plain_cells(run: &Opened<'_>) -> Result<BTreeMap<u64, Cell>, ReportError> {
    use super::campaign::{Level, cell};
    let plan = run.plan;
    let mut levels: BTreeMap<usize, Level> = BTreeMap::new();
    for f in run.run.facts()? {
        if f.phase == "measured"
            && let Some(c) = f.concurrency
        {
            levels
                .entry(c.max(0) as usize)
                .or_default()
                .samples
                .push(f.sample);
        }
    }
    for r in run.summary.map_or(&[][..], |s| s.rounds.as_slice()) {
        if let Some(c) = r.concurrency
            && let Some(l) = levels.get_mut(&c)
        {
            // Completeness as a campaign's cells count it (drivers/replay/arms.rs): every
            // planned round ran its whole budget.
            l.planned_rounds = plan.cases.len() * plan.repetitions;
            l.attempted_rounds += usize::from(r.attempted_requests == r.planned_requests);
            l.elapsed_seconds += r.elapsed_seconds;
        }
    }
    Ok(levels
        .iter()
        .map(|(c, l)| (*c as u64, cell(l, None)))
        .collect())
}
