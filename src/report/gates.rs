//! Each gate of a contract for one arm (`report::verdict` combines them into lanes and a
//! verdict). A gate's result is three-valued: `Some(true)`, `Some(false)` on measured
//! evidence, `None` with nothing to read (the reason in its note). Comparisons are
//! inclusive, with a relative tolerance of 1e-9 so binary rounding (1.1 x 100 is
//! 110.00000000000001) cannot fail a value written at the boundary.

use super::doc::campaign::{ArmDoc, CampaignDoc, Cell, DriftEntry, DriftFloor, Intervals};
use super::doc::verdict::{ArmGate, GateLevel};
use crate::config::campaign::Lane;
use crate::config::contract::MIN_DISTINCT_REQUESTS;
use crate::stats::MIN_DISCORDANT;

/// Relative tolerance of the inclusive comparisons.
const TOLERANCE: f64 = 1e-9;

pub(super) fn le(a: f64, b: f64) -> bool {
    a <= b + TOLERANCE * a.abs().max(b.abs())
}

pub(super) fn ge(a: f64, b: f64) -> bool {
    le(b, a)
}

/// An arm of campaign.json, as the gates read it.
pub(super) struct ArmView<'a> {
    pub(super) name: &'a str,
    pub(super) quality: bool,
    pub(super) reference: bool,
    pub(super) unavailable: Option<String>,
    pub(super) cells: Vec<(u64, &'a Cell)>,
}

pub(super) fn arms(campaign: &CampaignDoc) -> Vec<ArmView<'_>> {
    campaign
        .arms
        .iter()
        .map(|a: &ArmDoc| ArmView {
            name: &a.name,
            quality: a.lane == Lane::Quality,
            reference: a.reference,
            unavailable: (!a.available).then(|| {
                format!(
                    "unavailable: {}",
                    a.unavailable_reason
                        .as_deref()
                        .unwrap_or("no reason recorded")
                )
            }),
            // By concurrency, in numeric order (the map's).
            cells: a.concurrency.iter().map(|(c, cell)| (*c, cell)).collect(),
        })
        .collect()
}

/// Kleene's "and" over three-valued results (`None`: nothing to read): false when any is
/// false, else unknown when any is unknown, else true.
pub(super) fn all3(xs: impl IntoIterator<Item = Option<bool>>) -> Option<bool> {
    let mut out = Some(true);
    for x in xs {
        match x {
            Some(false) => return Some(false),
            None => out = None,
            Some(true) => {}
        }
    }
    out
}

/// Kleene's "or": true when any is true, else unknown when any is unknown, else false.
pub(super) fn any3(xs: impl IntoIterator<Item = Option<bool>>) -> Option<bool> {
    all3(xs.into_iter().map(|x| x.map(|b| !b))).map(|b| !b)
}

/// What a gate compared for one arm: the levels, whether it holds, a note.
pub(super) struct Compared {
    levels: Vec<GateLevel>,
    pass: Option<bool>,
    note: Option<String>,
}

impl Compared {
    /// Levels, the gate's result over them, and a note.
    pub(super) fn new(
        levels: Vec<GateLevel>,
        pass: Option<bool>,
        note: Option<String>,
    ) -> Compared {
        Compared { levels, pass, note }
    }

    /// Levels that each carry their own `pass`: the gate holds when every one does, and
    /// has nothing to read when one has nothing and none fails (the first such level's
    /// note says why).
    fn per_level(levels: Vec<GateLevel>) -> Compared {
        let pass = all3(levels.iter().map(|l| l.pass));
        let note = if pass.is_none() {
            levels.iter().find(|l| l.pass.is_none()).and_then(|l| {
                l.note
                    .as_ref()
                    .map(|n| format!("c={}: {n}", l.concurrency.unwrap_or_default()))
            })
        } else {
            None
        };
        Compared { levels, pass, note }
    }
}

/// Why a gate had nothing to compare for an arm: the gate's note, word for word.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub(super) struct NothingToRead(pub(super) String);

impl From<String> for NothingToRead {
    fn from(why: String) -> NothingToRead {
        NothingToRead(why)
    }
}

impl From<&str> for NothingToRead {
    fn from(why: &str) -> NothingToRead {
        NothingToRead(why.to_string())
    }
}

/// Run one gate for `arm`: `body` gives what it compared, or why there was nothing to
/// compare (then, as for an unavailable arm, the gate has nothing to read: `pass` null,
/// the reason in the note; never a pass or a fail).
pub(super) fn arm_gate(
    arm: &ArmView<'_>,
    body: impl FnOnce() -> Result<Compared, NothingToRead>,
) -> ArmGate {
    let unavailable = arm.unavailable.clone().map(NothingToRead);
    let (pass, levels, note) = match unavailable.map_or_else(body, Err) {
        Ok(c) => (c.pass, c.levels, c.note),
        Err(why) => (None, Vec::new(), Some(why.0)),
    };
    ArmGate {
        arm: arm.name.into(),
        pass,
        levels,
        note,
    }
}

/// `max_failed_requests` for one arm: its failed measured requests, every level summed
/// (complete or not: a level cut short by failures counts them); each level listed.
pub(super) fn failed_gate(arm: &ArmView<'_>, max: u64) -> ArmGate {
    arm_gate(arm, || {
        if arm.cells.is_empty() {
            return Err("no measured level".into());
        }
        let mut total = 0u64;
        let mut levels = Vec::new();
        for (c, cell) in &arm.cells {
            let failed = cell
                .failed_requests
                .ok_or_else(|| format!("the cell at concurrency {c} has no failed_requests"))?;
            total += failed;
            levels.push(GateLevel {
                concurrency: Some(*c),
                failed_requests: Some(failed),
                ..GateLevel::default()
            });
        }
        Ok(Compared {
            levels,
            pass: Some(total <= max),
            note: Some(format!(
                "{total} failed measured request(s) in all, limit {max}"
            )),
        })
    })
}

/// Which drift value a gate reads at each level.
#[derive(Clone, Copy)]
pub(super) enum Answered {
    ExactMatch,
    Similarity,
}

impl Answered {
    fn of(self, t: &crate::drift::LevelDrift) -> Option<f64> {
        match self {
            Answered::ExactMatch => t.exact_match_rate,
            Answered::Similarity => t.mean_similarity,
        }
    }
}

/// An arm's drift value at every level it was paired with the reference, at least `min`
/// (`quality_min_exact_match`; v2's `fit_min_mean_similarity`, `fit_min_exact_match`).
/// Under v2 (`distinct`), a level whose pairs answer fewer than [`MIN_DISTINCT_REQUESTS`]
/// distinct requests has nothing to read; v1 keeps its rule.
pub(super) fn drift_gate(
    arm: &ArmView<'_>,
    drift: Option<&DriftEntry>,
    what: Answered,
    (min, distinct): (f64, bool),
) -> ArmGate {
    arm_gate(arm, || {
        let d =
            drift.ok_or("no drift entry: its answers were not compared with the reference's")?;
        let levels: Vec<GateLevel> = d
            .drift
            .concurrency
            .iter()
            .filter_map(|(c, t)| {
                let value = what.of(t)?;
                let short = (distinct && t.distinct_requests < MIN_DISTINCT_REQUESTS).then(|| {
                    format!(
                        "compared in {} pair(s) from {} distinct request(s), fewer than {MIN_DISTINCT_REQUESTS} distinct requests (repeats of one request are not independent): too few to judge",
                        t.compared_prompts, t.distinct_requests
                    )
                });
                Some(GateLevel {
                    concurrency: c.parse::<u64>().ok(),
                    measured: Some(value),
                    compared_prompts: Some(t.compared_prompts),
                    distinct_requests: Some(t.distinct_requests),
                    limit: Some(min),
                    pass: short.is_none().then(|| ge(value, min)),
                    note: short,
                    ..GateLevel::default()
                })
            })
            .collect();
        if levels.is_empty() {
            return Err(
                "no answer was paired with the reference's (both ok at the same dispatch)".into(),
            );
        }
        Ok(Compared::per_level(levels))
    })
}

/// v2's floor-relative quality gates at every level: the arm's exact-match rate at least
/// the floor's minus `x` (`Answered::ExactMatch`), or its mean similarity at least `x`
/// times the floor's (`Answered::Similarity`). A level whose floor rests on fewer than
/// [`MIN_DISTINCT_REQUESTS`] distinct requests, or whose arm's drift does, has nothing
/// to read.
pub(super) fn floor_gate(
    arm: &ArmView<'_>,
    drift: Option<&DriftEntry>,
    floor: Option<&DriftFloor>,
    what: Answered,
    x: f64,
) -> ArmGate {
    arm_gate(arm, || {
        let floor = floor.ok_or(
            "no drift_floor to compare with (a campaign run made before the floor existed)",
        )?;
        if let Some(why) = &floor.reason {
            return Err(format!("no floor: {why}").into());
        }
        let d =
            drift.ok_or("no drift entry: its answers were not compared with the reference's")?;
        let mut levels = Vec::new();
        for (c, t) in &d.drift.concurrency {
            let Some(value) = what.of(t) else { continue };
            let f = floor.drift.concurrency.get(c);
            let (pairs, floor_requests) =
                f.map_or((0, 0), |f| (f.compared_prompts, f.distinct_requests));
            let fv = f.and_then(|f| what.of(f));
            let limit = fv.map(|fv| match what {
                Answered::ExactMatch => fv - x,
                Answered::Similarity => x * fv,
            });
            let short = if floor_requests < MIN_DISTINCT_REQUESTS {
                Some(format!(
                    "the floor here rests on {pairs} pair(s) of the reference's answers from {floor_requests} distinct request(s), fewer than {MIN_DISTINCT_REQUESTS} distinct requests (repeats of one request are not independent): too few to judge against"
                ))
            } else if t.distinct_requests < MIN_DISTINCT_REQUESTS {
                Some(format!(
                    "the arm's answers here were compared in {} pair(s) from {} distinct request(s), fewer than {MIN_DISTINCT_REQUESTS} distinct requests (repeats of one request are not independent): too few to judge",
                    t.compared_prompts, t.distinct_requests
                ))
            } else {
                None
            };
            levels.push(GateLevel {
                concurrency: c.parse::<u64>().ok(),
                measured: Some(value),
                compared_prompts: Some(t.compared_prompts),
                distinct_requests: Some(t.distinct_requests),
                floor: fv,
                floor_pairs: Some(pairs),
                floor_distinct_requests: Some(floor_requests),
                limit,
                pass: limit.filter(|_| short.is_none()).map(|l| ge(value, l)),
                note: short,
                ..GateLevel::default()
            });
        }
        if levels.is_empty() {
            return Err(
                "no answer was paired with the reference's (both ok at the same dispatch)".into(),
            );
        }
        Ok(Compared::per_level(levels))
    })
}

/// v2's `quality_min_mcnemar_p`, decided from the evidence: a fail whenever the exact
/// McNemar p-value of the arm's oracle-judged answers against the reference's is below
/// `min` (a lopsided split shows a difference even with few discordant requests: 0 vs 6
/// gives p = 0.031); a pass when p >= `min` on at least [`MIN_DISCORDANT`] discordant
/// requests, or on none at all when the one-sided bound on the arm's disagreement rate,
/// `1 - min^(1/n)` over n distinct requests (about 3/n at 0.05), is below the contract's
/// allowed exact-match drop; otherwise nothing to read.
pub(super) fn mcnemar_gate(
    arm: &ArmView<'_>,
    drift: Option<&DriftEntry>,
    min: f64,
    allowed_drop: Option<f64>,
) -> ArmGate {
    arm_gate(arm, || {
        let d =
            drift.ok_or("no drift entry: its answers were not compared with the reference's")?;
        let m = d.mcnemar.as_ref().ok_or(
            "no answer was judged by an oracle on both sides (cases without an oracle are judged by drift alone)",
        )?;
        let discordant = m.discordant();
        let (pass, why) = mcnemar_decision(m, min, allowed_drop);
        Ok(Compared {
            levels: vec![GateLevel {
                measured: Some(m.p_value),
                compared_prompts: Some(m.pairs),
                distinct_requests: Some(m.pairs),
                limit: Some(min),
                pass,
                ..GateLevel::default()
            }],
            pass,
            note: Some(format!(
                "{} distinct judged requests: the reference alone passed {}, the arm alone {} ({discordant} discordant); p = {:.4}{why}",
                m.pairs, m.only_reference_passed, m.only_arm_passed, m.p_value,
            )),
        })
    })
}

/// The McNemar gate's decision and what the note adds to say why.
fn mcnemar_decision(
    m: &crate::stats::McNemar,
    min: f64,
    allowed_drop: Option<f64>,
) -> (Option<bool>, String) {
    let discordant = m.discordant();
    if m.p_value < min {
        return (Some(false), String::new());
    }
    if discordant >= MIN_DISCORDANT {
        return (Some(true), String::new());
    }
    if discordant > 0 {
        return (
            None,
            format!(
                "; {discordant} discordant request(s), fewer than {MIN_DISCORDANT}: the split shows no difference and too few disagree to vouch for its absence"
            ),
        );
    }
    let bound = 1.0 - min.powf(1.0 / m.pairs.max(1) as f64);
    match allowed_drop {
        Some(drop) if bound < drop => (
            Some(true),
            format!(
                "; no discordant request of {}: the arm's disagreement rate is below {:.2} % (one-sided {:.0} % bound 1 - {min}^(1/{})), within the allowed drop {:.2} %",
                m.pairs,
                bound * 100.0,
                (1.0 - min) * 100.0,
                m.pairs,
                drop * 100.0
            ),
        ),
        Some(drop) => (
            None,
            format!(
                "; no discordant request of {}, but {} requests bound the disagreement rate only below {:.2} % (1 - {min}^(1/{})), not within the allowed drop {:.2} %: judge more distinct requests",
                m.pairs,
                m.pairs,
                bound * 100.0,
                m.pairs,
                drop * 100.0
            ),
        ),
        None => (
            None,
            format!(
                "; no discordant request of {}: agreement is bounded only by the allowed drop, and the contract has no quality_max_exact_match_drop_vs_floor",
                m.pairs
            ),
        ),
    }
}

/// Which measured value a ratio gate reads from a cell pair, and its name; `None` when the
/// pair does not have one on both sides.
pub(super) type Pick = fn(&Cell, &Cell) -> Option<(f64, f64, &'static str)>;

fn both(
    a: &Cell,
    r: &Cell,
    key: &'static str,
    value: impl Fn(&Cell) -> Option<f64>,
) -> Option<(f64, f64, &'static str)> {
    Some((value(a)?, value(r)?, key))
}

/// Peak memory: VRAM when both arms sampled it, else resident memory.
pub(super) fn memory(a: &Cell, r: &Cell) -> Option<(f64, f64, &'static str)> {
    both(a, r, "peak_vram_bytes", |c| {
        c.peak_vram_bytes.map(|b| b as f64)
    })
    .or_else(|| {
        both(a, r, "peak_rss_bytes", |c| {
            c.peak_rss_bytes.map(|b| b as f64)
        })
    })
}

/// Decode tok/s (v1): per request (streams) when both have it, else the aggregate.
pub(super) fn decode(a: &Cell, r: &Cell) -> Option<(f64, f64, &'static str)> {
    both(a, r, "decode_tokens_per_sec", |c| c.decode_tokens_per_sec)
        .or_else(|| aggregate(a, r))
        .filter(|(_, r, _)| *r > 0.0)
}

fn aggregate(a: &Cell, r: &Cell) -> Option<(f64, f64, &'static str)> {
    both(a, r, "aggregate_decode_tokens_per_sec", |c| {
        c.aggregate_decode_tokens_per_sec
    })
}

/// Decode tok/s (v2): the pooled estimator when both arms streamed, else the aggregate.
/// A cell whose streams were all left out (every one bundled) has no pooled value: the
/// gate has nothing to read there rather than reading a flush as speed.
pub(super) fn decode_pooled(a: &Cell, r: &Cell) -> Option<(f64, f64, &'static str)> {
    let streamed = |c: &Cell| c.decode_excluded.is_some();
    if streamed(a) && streamed(r) {
        return Some((
            a.decode_pooled_tokens_per_sec.unwrap_or(f64::NAN),
            r.decode_pooled_tokens_per_sec.unwrap_or(f64::NAN),
            "decode_pooled_tokens_per_sec",
        ))
        .filter(|(_, r, _)| r.is_nan() || *r > 0.0);
    }
    aggregate(a, r).filter(|(_, r, _)| *r > 0.0)
}

pub(super) fn p95(a: &Cell, r: &Cell) -> Option<(f64, f64, &'static str)> {
    both(a, r, "latency_p95_ms", |c| c.latency_p95_ms).filter(|(_, r, _)| *r > 0.0)
}

/// How a ratio gate decides at a level: on the point ratio (v1), or on its interval
/// (`require_interval`), read from campaign.json's `intervals`.
#[derive(Clone, Copy)]
pub(super) struct RatioRule<'a> {
    pub(super) intervals: Option<&'a Intervals>,
    pub(super) require_interval: bool,
}

/// A ratio gate's bound: `factor` times the reference's value, the arm's value at most
/// that (`at_most`) or at least.
#[derive(Debug, Clone, Copy)]
pub(super) struct Bound {
    pub(super) factor: f64,
    pub(super) at_most: bool,
}

/// A fit arm's value against the reference's at every level both completed and measured,
/// within `bound`.
pub(super) fn ratio_gate(
    (arm, reference): (&ArmView<'_>, &ArmView<'_>),
    (pick_name, pick): (&str, Pick),
    bound: Bound,
    rule: RatioRule<'_>,
) -> ArmGate {
    let Bound { factor, at_most } = bound;
    // Memory is the one value a run may not have sampled at all, and one peak per level:
    // it never reads an interval.
    let memory = pick_name == "memory";
    let caveat = if memory {
        " (memory is sampled only for arms the tool starts or names by resources.pid, while their server runs)"
    } else {
        ""
    };
    arm_gate(arm, || {
        if let Some(why) = &reference.unavailable {
            return Err(format!("the reference is {why}").into());
        }
        let mut levels = Vec::new();
        for (c, cell) in &arm.cells {
            let Some((_, rcell)) = reference.cells.iter().find(|(rc, _)| rc == c) else {
                continue;
            };
            if !cell.completed() || !rcell.completed() {
                continue;
            }
            let Some((a, r, metric)) = pick(cell, rcell) else {
                continue;
            };
            let limit = factor * r;
            let both = a.is_finite() && r.is_finite();
            let mut level = GateLevel {
                concurrency: Some(*c),
                metric: Some(metric.into()),
                measured: a.is_finite().then_some(a),
                reference: r.is_finite().then_some(r),
                ratio: both.then_some(a / r),
                limit: r.is_finite().then_some(limit),
                ..GateLevel::default()
            };
            if !both {
                let side = match (a.is_finite(), r.is_finite()) {
                    (false, false) => "either arm",
                    (true, _) => "the reference",
                    (false, true) => "this arm",
                };
                level.note = Some(format!(
                    "no {metric} on {side}: every stream was left out (see the cell's decode_excluded)"
                ));
            } else if rule.require_interval && !memory {
                interval_pass(&mut level, rule.intervals, (arm.name, *c, metric), bound);
            } else {
                level.pass = Some(if at_most { le(a, limit) } else { ge(a, limit) });
            }
            levels.push(level);
        }
        if levels.is_empty() {
            return Err(format!(
                "no concurrency level that both this arm and the reference completed with this value measured{caveat}"
            )
            .into());
        }
        Ok(Compared::per_level(levels))
    })
}

/// `require_interval`: the level passes when the whole interval of the ratio is past
/// `factor`, fails when it is not, and has nothing to read without an interval.
fn interval_pass(
    level: &mut GateLevel,
    intervals: Option<&Intervals>,
    (arm, c, metric): (&str, u64, &str),
    Bound { factor, at_most }: Bound,
) {
    let entry = intervals.and_then(|i| i.find(arm, c, metric));
    match entry.map(|e| (e.interval, e.reason.as_deref())) {
        Some((Some(i), _)) => {
            level.interval = Some([i.low, i.high]);
            level.pass = Some(if at_most {
                le(i.high, factor)
            } else {
                ge(i.low, factor)
            });
        }
        Some((None, why)) => {
            level.note = Some(format!(
                "no interval ({}): require_interval has nothing to read",
                why.unwrap_or("no reason recorded")
            ));
        }
        None => {
            level.note = Some(
                "no interval for this value: none was computed (a run made before intervals, or one whose rows could not be read), or the value was not measured in both sides' rounds; require_interval has nothing to read"
                    .into(),
            );
        }
    }
}

/// Which side of a bound a validity gate reads.
#[derive(Clone, Copy)]
pub(super) enum ValidityBound {
    /// v2's `min_valid_rate`: each contract kind's validity interval against a floor.
    MinRate(f64),
    /// v2's `valid_rate_floor_delta`: each contract kind's paired drop below the
    /// reference against an allowance.
    MaxDrop(f64),
}

/// v2's validity gates, one level per contract kind the arm was judged by (campaign.json's
/// `validity`): `MinRate` fails a kind whose 95 % interval lies wholly below the floor
/// and passes one whose interval lies wholly at or above it; `MaxDrop` fails a kind whose
/// paired drop interval lies wholly above the allowance and passes one whose interval
/// lies wholly at or below it. The gate fails when a kind fails, passes when every kind
/// passes, and otherwise has nothing to read (the interval straddles the bound: more
/// distinct requests would decide it).
pub(super) fn validity_gate(
    arm: &ArmView<'_>,
    drift: Option<&DriftEntry>,
    bound: ValidityBound,
) -> ArmGate {
    arm_gate(arm, || {
        let d =
            drift.ok_or("no drift entry: its answers were not compared with the reference's")?;
        let kinds: Vec<&crate::report::validity::Validity> = d
            .validity
            .iter()
            .flatten()
            .filter(|v| crate::report::validity::CONTRACT_KINDS.contains(&v.kind.as_str()))
            .collect();
        if kinds.is_empty() {
            return Err("no answer was judged by a contract oracle (expected_schema, expected_tool_calls, expected_choice, expected_pattern)".into());
        }
        let mut notes = Vec::new();
        let levels: Vec<GateLevel> = kinds
            .iter()
            .map(|v| {
                let (measured, lo, hi, limit, requests) = match bound {
                    ValidityBound::MinRate(min) => {
                        let [lo, hi] = v.interval.unwrap_or([0.0, 1.0]);
                        (v.rate, lo, hi, min, v.requests)
                    }
                    ValidityBound::MaxDrop(max) => match &v.paired {
                        Some(p) => (
                            Some(p.drop),
                            p.drop_interval[0],
                            p.drop_interval[1],
                            max,
                            p.requests,
                        ),
                        None => (None, f64::NEG_INFINITY, f64::INFINITY, max, 0),
                    },
                };
                let pass = match bound {
                    ValidityBound::MinRate(_) if hi < limit => Some(false),
                    ValidityBound::MinRate(_) if lo >= limit => Some(true),
                    ValidityBound::MaxDrop(_) if lo > limit => Some(false),
                    ValidityBound::MaxDrop(_) if hi <= limit => Some(true),
                    _ => None,
                };
                notes.push(format!(
                    "{}: {} over {requests} distinct requests, 95 % interval [{lo:.3}, {hi:.3}]",
                    v.kind,
                    measured.map_or("n/a".into(), |m| format!("{m:.3}"))
                ));
                GateLevel {
                    metric: Some(v.kind.clone()),
                    measured,
                    distinct_requests: Some(requests),
                    limit: Some(limit),
                    pass,
                    ..GateLevel::default()
                }
            })
            .collect();
        let pass = all3(levels.iter().map(|l| l.pass));
        let straddles = if pass.is_none() {
            "; an interval straddles the bound: more distinct requests would decide it"
        } else {
            ""
        };
        Ok(Compared {
            levels,
            pass,
            note: Some(format!("{}{straddles}", notes.join("; "))),
        })
    })
}
