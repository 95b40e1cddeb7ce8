//! The verdict: a pre-registered contract's gates evaluated on what a campaign measured
//! (campaign.json's cells and drift), so `replay --contract` and a later `verdict` read
//! one definition from one file. A gate holds for an arm when it holds at every
//! concurrency level compared (both arms measured the value there); comparisons are
//! inclusive, with a relative tolerance of 1e-9 so binary rounding (1.1 x 100 is
//! 110.00000000000001) cannot fail a value written at the boundary.

use super::doc::campaign::{ArmDoc, CampaignDoc, Cell, DriftEntry};
use super::doc::verdict::{
    ArmGate, ContractDoc, Evaluation, FitArm, Gate, GateLevel, Gates, MissingEvidence, Threshold,
    VERDICT_SCHEMA_VERSION, VerdictDoc,
};
use crate::config::campaign::Lane;
use crate::config::contract::{Contract, Thresholds};

/// Relative tolerance of the inclusive comparisons.
const TOLERANCE: f64 = 1e-9;

fn le(a: f64, b: f64) -> bool {
    a <= b + TOLERANCE * a.abs().max(b.abs())
}

fn ge(a: f64, b: f64) -> bool {
    le(b, a)
}

/// An arm of campaign.json, as the gates read it.
struct ArmView<'a> {
    name: &'a str,
    quality: bool,
    reference: bool,
    unavailable: Option<String>,
    cells: Vec<(u64, &'a Cell)>,
}

fn arms(campaign: &CampaignDoc) -> Vec<ArmView<'_>> {
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

/// What a gate compared for one arm: the levels, whether it holds, a note.
struct Compared {
    levels: Vec<GateLevel>,
    pass: bool,
    note: Option<String>,
}

impl Compared {
    /// Levels that each carry their own `pass`: the gate holds when every one does.
    fn per_level(levels: Vec<GateLevel>) -> Compared {
        Compared {
            pass: levels.iter().all(|l| l.pass == Some(true)),
            levels,
            note: None,
        }
    }
}

/// Run one gate for `arm`: `body` gives what it compared, or why there was nothing to
/// compare (then, as for an unavailable arm, the gate has nothing to read: `pass` null,
/// the reason in the note; never a pass or a fail).
fn arm_gate(arm: &ArmView<'_>, body: impl FnOnce() -> Result<Compared, String>) -> ArmGate {
    let (pass, levels, note) = match arm.unavailable.clone().map_or_else(body, Err) {
        Ok(c) => (Some(c.pass), c.levels, c.note),
        Err(why) => (None, Vec::new(), Some(why)),
    };
    ArmGate {
        arm: arm.name.into(),
        pass,
        levels,
        note,
    }
}

/// Kleene's "and" over three-valued results (`None`: nothing to read): false when any is
/// false, else unknown when any is unknown, else true.
fn all3(xs: impl IntoIterator<Item = Option<bool>>) -> Option<bool> {
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
fn any3(xs: impl IntoIterator<Item = Option<bool>>) -> Option<bool> {
    all3(xs.into_iter().map(|x| x.map(|b| !b))).map(|b| !b)
}

/// `max_failed_requests` for one arm: its failed measured requests, every level summed
/// (complete or not: a level cut short by failures counts them); each level listed.
fn failed_gate(arm: &ArmView<'_>, max: u64) -> ArmGate {
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
            pass: total <= max,
            note: Some(format!(
                "{total} failed measured request(s) in all, limit {max}"
            )),
        })
    })
}

/// `quality_min_exact_match` for one quality arm, from its drift entry.
fn exact_match_gate(arm: &ArmView<'_>, drift: Option<&DriftEntry>, min: f64) -> ArmGate {
    arm_gate(arm, || {
        let d =
            drift.ok_or("no drift entry: its answers were not compared with the reference's")?;
        let levels: Vec<GateLevel> = d
            .drift
            .concurrency
            .iter()
            .filter_map(|(c, t)| {
                let rate = t.exact_match_rate?;
                Some(GateLevel {
                    concurrency: c.parse::<u64>().ok(),
                    measured: Some(rate),
                    compared_prompts: Some(t.compared_prompts),
                    limit: Some(min),
                    pass: Some(ge(rate, min)),
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

/// Which measured value a ratio gate reads from a cell pair, and its name; `None` when the
/// pair does not have one on both sides.
type Pick = fn(&Cell, &Cell) -> Option<(f64, f64, &'static str)>;

fn both(
    a: &Cell,
    r: &Cell,
    key: &'static str,
    value: impl Fn(&Cell) -> Option<f64>,
) -> Option<(f64, f64, &'static str)> {
    Some((value(a)?, value(r)?, key))
}

/// Peak memory: VRAM when both arms sampled it, else resident memory.
fn memory(a: &Cell, r: &Cell) -> Option<(f64, f64, &'static str)> {
    both(a, r, "peak_vram_bytes", |c| {
        c.peak_vram_bytes.map(|b| b as f64)
    })
    .or_else(|| {
        both(a, r, "peak_rss_bytes", |c| {
            c.peak_rss_bytes.map(|b| b as f64)
        })
    })
}

/// Decode tok/s: per request (streams) when both have it, else the aggregate.
fn decode(a: &Cell, r: &Cell) -> Option<(f64, f64, &'static str)> {
    both(a, r, "decode_tokens_per_sec", |c| c.decode_tokens_per_sec)
        .or_else(|| {
            both(a, r, "aggregate_decode_tokens_per_sec", |c| {
                c.aggregate_decode_tokens_per_sec
            })
        })
        .filter(|(_, r, _)| *r > 0.0)
}

fn p95(a: &Cell, r: &Cell) -> Option<(f64, f64, &'static str)> {
    both(a, r, "latency_p95_ms", |c| c.latency_p95_ms).filter(|(_, r, _)| *r > 0.0)
}

/// A fit arm's value against the reference's at every level both completed and measured;
/// `factor` is the bound's multiple of the reference, `at_most` its direction.
fn ratio_gate(
    arm: &ArmView<'_>,
    reference: &ArmView<'_>,
    (pick_name, pick): (&str, Pick),
    factor: f64,
    at_most: bool,
) -> ArmGate {
    // Memory is the one value a run may not have sampled at all.
    let caveat = if pick_name == "memory" {
        " (memory is sampled only for arms the tool starts or names by resources.pid, while their server runs)"
    } else {
        ""
    };
    arm_gate(arm, || {
        if let Some(why) = &reference.unavailable {
            return Err(format!("the reference is {why}"));
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
            let pass = if at_most { le(a, limit) } else { ge(a, limit) };
            levels.push(GateLevel {
                concurrency: Some(*c),
                metric: Some(metric.into()),
                measured: Some(a),
                reference: Some(r),
                ratio: Some(a / r),
                limit: Some(limit),
                pass: Some(pass),
                ..GateLevel::default()
            });
        }
        if levels.is_empty() {
            return Err(format!(
                "no concurrency level that both this arm and the reference completed with this value measured{caveat}"
            ));
        }
        Ok(Compared::per_level(levels))
    })
}

fn gate(name: &str, threshold: Threshold, passes_when: &str, results: Vec<ArmGate>) -> Gate {
    Gate {
        gate: name.into(),
        threshold,
        passes_when: passes_when.into(),
        pass: all3(results.iter().map(|r| r.pass)),
        arms: results,
    }
}

/// Every gate and arm with nothing to read, and why.
fn missing_evidence(gates: &[(&str, &Vec<ArmGate>)]) -> Vec<MissingEvidence> {
    let mut out = Vec::new();
    for (gate, arms) in gates {
        for a in arms.iter().filter(|a| a.pass.is_none()) {
            out.push(MissingEvidence {
                gate: (*gate).into(),
                arm: a.arm.clone(),
                reason: a.note.clone().unwrap_or_default(),
            });
        }
    }
    out
}

/// The verdict from the lanes' three-valued results: a quality gate that fails on measured
/// evidence rejects; otherwise missing evidence the decision depends on, or a run that
/// ended before its plan, makes it `inconclusive` (never a decision on what was not
/// measured); otherwise keep-reference, adopt or optimize.
fn decide(
    (quality_pass, fit_benefit): (Option<bool>, Option<bool>),
    (adopt, any_unknown_ready): (&[String], bool),
    ended_early: Option<&str>,
    missing: &[MissingEvidence],
) -> (&'static str, String) {
    let nothing_to_read = || {
        let each: Vec<String> = missing
            .iter()
            .map(|m| format!("{} for {}: {}", m.gate, m.arm, m.reason))
            .collect();
        each.join("; ")
    };
    let inconclusive = |what: &str| ("inconclusive", format!("{what}: {}", nothing_to_read()));
    match (quality_pass, fit_benefit) {
        (Some(false), _) => (
            "reject",
            "the quality lane failed a gate on measured evidence".into(),
        ),
        _ if ended_early.is_some() => (
            "inconclusive",
            format!(
                "the run ended before its plan ({}): its arms were not all measured as planned, so only a quality gate failed on measured evidence could decide",
                ended_early.unwrap_or_default()
            ),
        ),
        (None, _) => inconclusive("a quality-lane gate had nothing to read and none failed"),
        (Some(true), Some(false)) => (
            "keep-reference",
            "the quality lane passed and no performance-fit arm has a benefit (max_failed_requests and either fit_min_memory_reduction or fit_min_decode_speedup)".into(),
        ),
        (Some(true), None) => inconclusive(
            "the quality lane passed, and whether a performance-fit arm has a benefit depends on a gate with nothing to read",
        ),
        (Some(true), Some(true)) if !adopt.is_empty() => (
            "adopt",
            "a performance-fit arm with a benefit also passes max_p95_latency_ratio and min_decode_ratio".into(),
        ),
        (Some(true), Some(true)) if any_unknown_ready => inconclusive(
            "a performance-fit arm has a benefit, and whether one is ready (adopt) or not (optimize) depends on a gate with nothing to read",
        ),
        (Some(true), Some(true)) => (
            "optimize",
            "a performance-fit arm has a benefit but fails max_p95_latency_ratio or min_decode_ratio: worth pursuing, not ready".into(),
        ),
    }
}

/// Evaluate `t` on a campaign.json: the lanes' results, the verdict and every gate.
/// `ended_early`: why the run ended before its plan (an interrupt), when it did: then no
/// decision but `reject` on measured evidence is made.
pub(crate) fn evaluate(
    campaign: &CampaignDoc,
    t: &Thresholds,
    ended_early: Option<&str>,
) -> Evaluation {
    let arms = arms(campaign);
    let drift = |name: &str| campaign.drift_entries().iter().find(|e| e.arm == name);
    let Some(reference) = arms.iter().find(|a| a.reference) else {
        return Evaluation::Error {
            error: "campaign.json names no reference arm".into(),
        };
    };
    let quality: Vec<&ArmView<'_>> = arms.iter().filter(|a| a.quality).collect();
    let fit: Vec<&ArmView<'_>> = arms.iter().filter(|a| !a.quality).collect();
    let exact: Vec<ArmGate> = quality
        .iter()
        .filter(|a| !a.reference)
        .map(|a| exact_match_gate(a, drift(a.name), t.quality_min_exact_match))
        .collect();
    let failed_q: Vec<ArmGate> = quality
        .iter()
        .map(|a| failed_gate(a, t.max_failed_requests))
        .collect();
    let failed_f: Vec<ArmGate> = fit
        .iter()
        .map(|a| failed_gate(a, t.max_failed_requests))
        .collect();
    let ratio_gates = |pick: (&str, Pick), factor: f64, at_most: bool| -> Vec<ArmGate> {
        let each = fit
            .iter()
            .map(|a| ratio_gate(a, reference, pick, factor, at_most));
        each.collect()
    };
    let mem = ratio_gates(("memory", memory), 1.0 - t.fit_min_memory_reduction, true);
    let speed = ratio_gates(("decode", decode), 1.0 + t.fit_min_decode_speedup, false);
    let lat = ratio_gates(("p95", p95), t.max_p95_latency_ratio, true);
    let ratio = ratio_gates(("decode", decode), t.min_decode_ratio, false);
    let quality_pass = all3(exact.iter().chain(&failed_q).map(|g| g.pass));
    let fit_arms: Vec<FitArm> = (0..fit.len())
        .map(|i| {
            let benefit = all3([failed_f[i].pass, any3([mem[i].pass, speed[i].pass])]);
            FitArm {
                arm: fit[i].name.into(),
                benefit,
                ready: all3([benefit, lat[i].pass, ratio[i].pass]),
                max_failed_requests: failed_f[i].pass,
                fit_min_memory_reduction: mem[i].pass,
                fit_min_decode_speedup: speed[i].pass,
                max_p95_latency_ratio: lat[i].pass,
                min_decode_ratio: ratio[i].pass,
            }
        })
        .collect();
    let fit_benefit = any3(fit_arms.iter().map(|f| f.benefit));
    let adopt: Vec<String> = fit_arms
        .iter()
        .filter(|f| f.ready == Some(true))
        .map(|f| f.arm.clone())
        .collect();
    let missing = missing_evidence(&[
        ("quality_min_exact_match", &exact),
        ("max_failed_requests", &failed_q),
        ("max_failed_requests", &failed_f),
        ("fit_min_memory_reduction", &mem),
        ("fit_min_decode_speedup", &speed),
        ("max_p95_latency_ratio", &lat),
        ("min_decode_ratio", &ratio),
    ]);
    let any_unknown_ready = fit_arms.iter().any(|f| f.ready.is_none());
    let (verdict, reason) = decide(
        (quality_pass, fit_benefit),
        (&adopt, any_unknown_ready),
        ended_early,
        &missing,
    );
    let failed_all: Vec<ArmGate> = failed_q.into_iter().chain(failed_f).collect();
    let ratio_of = Threshold::Ratio;
    Evaluation::Gates(Box::new(Gates {
        quality_lane_pass: quality_pass,
        quality_lane_note: (quality.len() == 1).then(|| {
            "the reference is the only quality-lane arm: no quality arm's answers were compared, so the quality lane rests on max_failed_requests alone".into()
        }),
        fit_benefit,
        verdict: verdict.into(),
        verdict_reason: reason,
        adopt_arms: adopt,
        fit_arms,
        reference_arm: reference.name.into(),
        missing_evidence: missing,
        gates: vec![
            gate("quality_min_exact_match", ratio_of(t.quality_min_exact_match),
                 "every non-reference quality-lane arm's exact-match rate >= threshold", exact),
            gate("max_failed_requests", Threshold::Count(t.max_failed_requests),
                 "an arm's failed measured requests, every level summed, <= threshold (quality lane: all arms; performance-fit: each candidate)", failed_all),
            gate("fit_min_memory_reduction", ratio_of(t.fit_min_memory_reduction),
                 "a fit arm's peak memory (VRAM when both sampled it, else RSS) <= (1 - threshold) x the reference's", mem),
            gate("fit_min_decode_speedup", ratio_of(t.fit_min_decode_speedup),
                 "a fit arm's decode tok/s (per request when both stream, else aggregate) >= (1 + threshold) x the reference's", speed),
            gate("max_p95_latency_ratio", ratio_of(t.max_p95_latency_ratio),
                 "a fit arm's latency p95 <= threshold x the reference's", lat),
            gate("min_decode_ratio", ratio_of(t.min_decode_ratio),
                 "a fit arm's decode tok/s >= threshold x the reference's", ratio),
        ],
    }))
}

/// Where a verdict comes from besides the campaign: the contract and whether it was the
/// one recorded when the run started.
pub(crate) struct Provenance<'a> {
    pub(crate) contract: &'a Contract,
    pub(crate) contract_path: &'a str,
    pub(crate) run_id: Option<&'a str>,
    pub(crate) run_started_at: Option<&'a str>,
    /// How the run ended (summary.json's `ending`), when known.
    pub(crate) run_ending: Option<&'a str>,
    /// Why the verdict is post hoc (`None`: the contract was locked in at the start).
    pub(crate) post_hoc: Option<String>,
}

/// verdict.json: the contract, whether it was pre-registered, and [`evaluate`]'s result.
pub(crate) fn verdict_doc(campaign: &CampaignDoc, p: &Provenance<'_>) -> VerdictDoc {
    let c = p.contract;
    let t = &c.thresholds;
    VerdictDoc {
        schema_version: VERDICT_SCHEMA_VERSION,
        plan_id: c.plan_id.clone(),
        run_id: p.run_id.map(str::to_string),
        run_started_at: p.run_started_at.map(str::to_string),
        run_ending: p.run_ending.map(str::to_string),
        run_note: (p.run_ending == Some("interrupted")).then(|| {
            "the run was interrupted: levels an arm did not complete are not compared by the ratio gates, and an arm's failure count covers what it ran".into()
        }),
        evaluated_at: crate::clock::iso_utc(crate::clock::wall_now_us()),
        contract_sha256: c.sha256.clone(),
        post_hoc: p.post_hoc.is_some(),
        post_hoc_reason: p.post_hoc.clone(),
        contract: ContractDoc {
            path: p.contract_path.into(),
            contract_version: c.version,
            locked_at: c.locked_at.clone(),
            locked_by: c.locked_by.clone(),
            plan_id: c.plan_id.clone(),
            baseline: c.baseline.clone(),
            stop_condition: c.stop_condition.clone(),
            thresholds: *t,
        },
        evidence_class: campaign.evidence_class.clone(),
        evaluation: evaluate(
            campaign,
            t,
            (p.run_ending == Some("interrupted")).then_some("it was interrupted"),
        ),
    }
}

/// The verdict for a terminal: one line per gate and arm, then the verdict.
pub(crate) fn verdict_text(v: &VerdictDoc) -> String {
    let mut out = String::new();
    let yes = |b: Option<bool>| match b {
        Some(true) => "pass",
        Some(false) => "FAIL",
        None => "n/a",
    };
    let gates = v.gates();
    for g in gates.map_or(&[][..], |g| g.gates.as_slice()) {
        for a in &g.arms {
            let worst = a
                .levels
                .iter()
                .filter_map(|l| match (l.concurrency, l.measured, l.limit) {
                    (Some(c), Some(m), Some(lim)) => {
                        Some(format!("c={c}: {} (limit {})", short(m), short(lim)))
                    }
                    _ => None,
                })
                .collect::<Vec<_>>()
                .join(", ");
            let detail = match (worst.is_empty(), a.note.as_deref()) {
                (_, None) => worst,
                (true, Some(n)) => n.to_string(),
                (false, Some(n)) => format!("{worst} ({n})"),
            };
            out.push_str(&format!(
                "  {:<26} {:<14} {}  {detail}\n",
                g.gate,
                a.arm,
                yes(a.pass),
            ));
        }
    }
    out.push_str(&format!(
        "verdict: {} (quality lane {}, fit benefit {}){}{}\n",
        v.verdict(),
        yes(gates.and_then(|g| g.quality_lane_pass)),
        match gates.and_then(|g| g.fit_benefit) {
            Some(true) => "yes",
            Some(false) => "no",
            None => "unknown",
        },
        if v.run_ending.as_deref() == Some("interrupted") {
            " -- the run was interrupted"
        } else {
            ""
        },
        if v.post_hoc {
            " -- POST HOC: the contract was not the one locked in at the run's start"
        } else {
            ""
        },
    ));
    out
}

fn short(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e15 {
        format!("{x:.0}")
    } else {
        format!("{x:.3}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    /// [`super::evaluate`] on a campaign.json given as JSON, as verdict.json holds it.
    fn evaluate(c: &Value, t: &Thresholds) -> Value {
        evaluate_ended(c, t, None)
    }

    fn evaluate_ended(c: &Value, t: &Thresholds, ended_early: Option<&str>) -> Value {
        serde_json::to_value(super::evaluate(&doc(c), t, ended_early)).expect("serializes")
    }

    /// A campaign.json given as JSON, read with its type (the fixtures above build JSON).
    fn doc(c: &Value) -> CampaignDoc {
        serde_json::from_value(c.clone()).expect("a campaign.json")
    }

    /// [`super::evaluate`]'s gates, typed.
    fn gates(d: &CampaignDoc, t: &Thresholds, ended_early: Option<&str>) -> Gates {
        match super::evaluate(d, t, ended_early) {
            Evaluation::Gates(g) => *g,
            Evaluation::Error { error } => panic!("not evaluated: {error}"),
        }
    }

    fn drift_entry(name: &str, rate: f64) -> DriftEntry {
        serde_json::from_value(drift(name, rate)).expect("a drift entry")
    }

    /// One cell: peak memory (RSS, whole bytes as campaign.json writes them), per-request
    /// decode tok/s, latency p95 (ms), failures.
    fn cell(mem: f64, decode: f64, p95: f64, failed: u64) -> Value {
        json!({"peak_rss_bytes": mem as u64, "peak_vram_bytes": null, "decode_tokens_per_sec": decode,
               "aggregate_decode_tokens_per_sec": decode, "latency_p95_ms": p95,
               "failed_requests": failed, "attempted_requests": 10})
    }

    fn arm(name: &str, lane: &str, cells: &[(u64, Value)]) -> Value {
        let cells: serde_json::Map<String, Value> = cells
            .iter()
            .map(|(c, v)| (c.to_string(), v.clone()))
            .collect();
        json!({"name": name, "lane": lane, "reference": name == "ref", "available": true,
               "unavailable_reason": null, "concurrency": cells})
    }

    fn drift(name: &str, rate: f64) -> Value {
        json!({"arm": name, "concurrency": {"1": {"compared_prompts": 2, "exact_match_rate": rate}}})
    }

    /// The reference (4 GB, 100 tok/s, p95 100 ms), a twin with `twin_rate` exact match,
    /// and one fit arm.
    fn campaign(twin_rate: f64, fit: Value) -> Value {
        json!({"arms": [arm("ref", "quality", &[(1, cell(4000.0, 100.0, 100.0, 0))]),
                        arm("twin", "quality", &[(1, cell(4000.0, 100.0, 100.0, 0))]),
                        arm("q4", "performance-fit", &[(1, fit)])],
               "drift": [drift("twin", twin_rate), drift("q4", 0.0)]})
    }

    fn verdict(c: &Value, t: &Thresholds) -> (bool, bool, String) {
        let v = evaluate(c, t);
        (
            v["quality_lane_pass"] == json!(true),
            v["fit_benefit"] == json!(true),
            v["verdict"].as_str().unwrap_or("?").to_string(),
        )
    }

    fn gate_pass(c: &Value, t: &Thresholds, gate: &str) -> bool {
        let v = evaluate(c, t);
        let g = v["gates"]
            .as_array()
            .and_then(|g| g.iter().find(|g| g["gate"] == json!(gate)))
            .cloned();
        g.map(|g| g["pass"] == json!(true)).unwrap_or(false)
    }

    #[test]
    fn the_recipe_benchmarks_example_is_optimize() {
        // A quality twin with identical answers; q4 answers otherwise, with a quarter of
        // the reference's memory and half its decode speed.
        let c = campaign(1.0, cell(1000.0, 50.0, 100.0, 0));
        let t = Thresholds::default();
        assert_eq!(verdict(&c, &t), (true, true, "optimize".into()));
        let v = evaluate(&c, &t);
        assert_eq!(v["fit_arms"][0]["fit_min_memory_reduction"], json!(true));
        assert_eq!(v["fit_arms"][0]["min_decode_ratio"], json!(false));
    }

    #[test]
    fn every_verdict_is_reached() {
        let t = Thresholds::default();
        // (twin's exact match, the fit arm's memory, decode tok/s, p95 ms, failures)
        let table: [(f64, f64, f64, f64, u64, &str); 5] = [
            // The twin answers otherwise.
            (0.5, 1000.0, 200.0, 90.0, 0, "reject"),
            // 12.5 % less memory and 5 % faster is no benefit.
            (1.0, 3500.0, 105.0, 90.0, 0, "keep-reference"),
            // A quarter of the memory, 20 % faster, p95 within 10 %.
            (1.0, 1000.0, 120.0, 105.0, 0, "adopt"),
            // The benefit is there, the latency is not.
            (1.0, 1000.0, 120.0, 120.0, 0, "optimize"),
            // A benefit needs max_failed_requests too.
            (1.0, 1000.0, 120.0, 105.0, 1, "keep-reference"),
        ];
        for (rate, mem, decode, p95, failed, want) in table {
            let c = campaign(rate, cell(mem, decode, p95, failed));
            assert_eq!(
                verdict(&c, &t).2,
                want,
                "{rate} {mem} {decode} {p95} {failed}"
            );
        }
    }

    #[test]
    fn every_gate_holds_at_its_boundary_and_fails_past_it() {
        let t = Thresholds::default();
        let gates: [(&str, Value, Value); 4] = [
            // 0.75 x 4000 = 3000 bytes.
            (
                "fit_min_memory_reduction",
                cell(3000.0, 1.0, 1.0, 0),
                cell(3001.0, 1.0, 1.0, 0),
            ),
            // 1.1 x 100 = 110 tok/s (110.00000000000001 in binary).
            (
                "fit_min_decode_speedup",
                cell(1.0, 110.0, 1.0, 0),
                cell(1.0, 109.999, 1.0, 0),
            ),
            // 1.1 x 100 = 110 ms.
            (
                "max_p95_latency_ratio",
                cell(1.0, 1.0, 110.0, 0),
                cell(1.0, 1.0, 110.001, 0),
            ),
            // 1.0 x 100 tok/s.
            (
                "min_decode_ratio",
                cell(1.0, 100.0, 1.0, 0),
                cell(1.0, 99.999, 1.0, 0),
            ),
        ];
        for (gate, at, past) in gates {
            assert!(
                gate_pass(&campaign(1.0, at), &t, gate),
                "{gate} at its boundary"
            );
            assert!(
                !gate_pass(&campaign(1.0, past), &t, gate),
                "{gate} past its boundary"
            );
        }
        let t2 = Thresholds {
            max_failed_requests: 2,
            quality_min_exact_match: 0.5,
            ..t
        };
        let fit = cell(1.0, 1.0, 1.0, 2);
        assert!(gate_pass(
            &campaign(0.5, fit.clone()),
            &t2,
            "max_failed_requests"
        ));
        assert!(gate_pass(
            &campaign(0.5, fit),
            &t2,
            "quality_min_exact_match"
        ));
        assert!(!gate_pass(
            &campaign(0.5, cell(1.0, 1.0, 1.0, 3)),
            &t2,
            "max_failed_requests"
        ));
        assert!(!gate_pass(
            &campaign(0.499, cell(1.0, 1.0, 1.0, 0)),
            &t2,
            "quality_min_exact_match"
        ));
    }

    #[test]
    fn a_gate_holds_only_at_every_level_both_arms_measured() {
        let t = Thresholds::default();
        let mut c = campaign(1.0, Value::Null);
        // Level 1 passes; level 8 uses more memory than allowed; level 16 the reference
        // never ran, so it is not compared.
        c["arms"][0]["concurrency"]["8"] = cell(4000.0, 100.0, 100.0, 0);
        c["arms"][2]["concurrency"] = json!({"1": cell(1000.0, 50.0, 1.0, 0),
            "8": cell(3900.0, 50.0, 1.0, 0), "16": cell(1.0, 50.0, 1.0, 0)});
        let v = evaluate(&c, &t);
        let mem = &v["gates"][2]["arms"][0];
        assert_eq!(
            (mem["pass"].clone(), mem["levels"].as_array().map(Vec::len)),
            (json!(false), Some(2))
        );
        // VRAM when both arms sampled it, RSS otherwise.
        c["arms"][2]["concurrency"]["8"]["peak_vram_bytes"] = json!(10);
        c["arms"][0]["concurrency"]["8"]["peak_vram_bytes"] = json!(100);
        let v = evaluate(&c, &t);
        assert_eq!(
            v["gates"][2]["arms"][0]["levels"][1]["metric"],
            json!("peak_vram_bytes")
        );
        assert_eq!(v["gates"][2]["arms"][0]["pass"], json!(true));
    }

    #[test]
    fn failures_are_summed_per_arm_and_incomplete_levels_are_not_compared() {
        let t = Thresholds {
            max_failed_requests: 2,
            ..Thresholds::default()
        };
        // Two failures at each of two levels: 4 in all, over a limit of 2.
        let mut c = campaign(1.0, cell(1000.0, 200.0, 90.0, 2));
        c["arms"][0]["concurrency"]["8"] = cell(4000.0, 100.0, 100.0, 0);
        c["arms"][2]["concurrency"]["8"] = cell(1000.0, 200.0, 90.0, 2);
        assert!(!gate_pass(&c, &t, "max_failed_requests"));
        c["arms"][2]["concurrency"]["8"] = cell(1000.0, 200.0, 90.0, 0);
        assert!(gate_pass(&c, &t, "max_failed_requests"));
        // A level the fit arm did not complete is not compared: its slow latency there
        // does not count, and with no complete level left the gate has nothing to read
        // (null, with a note): neither a pass nor a fail.
        c["arms"][2]["concurrency"]["8"] = cell(1000.0, 200.0, 900.0, 0);
        assert!(!gate_pass(&c, &t, "max_p95_latency_ratio"));
        c["arms"][2]["concurrency"]["8"]["complete"] = json!(false);
        assert!(gate_pass(&c, &t, "max_p95_latency_ratio"));
        let mut d = doc(&c);
        if let Some(cell) = d.arms[2].concurrency.get_mut(&1) {
            cell.complete = Some(false);
        }
        let g = gates(&d, &t, None);
        let lat = &g.gates[4].arms[0];
        assert_eq!(lat.pass, None);
        let note = lat.note.as_deref().unwrap_or_default();
        assert!(note.contains("completed"), "{note}");
    }

    #[test]
    fn unavailable_arms_and_a_lone_reference() {
        let t = Thresholds::default();
        // The twin never came up: nothing shows the quality lane holds, and nothing shows
        // it fails either.
        let mut d = doc(&campaign(1.0, cell(1000.0, 200.0, 90.0, 0)));
        d.arms[1].available = false;
        d.arms[1].unavailable_reason = Some("exited before healthy".into());
        d.drift = Some(Some(vec![drift_entry("q4", 0.0)]));
        let g = gates(&d, &t, None);
        assert_eq!(
            (g.verdict.as_str(), g.quality_lane_pass),
            ("inconclusive", None)
        );
        let m = &g.missing_evidence[0];
        assert_eq!(
            (m.gate.as_str(), m.arm.as_str(), m.reason.as_str()),
            (
                "quality_min_exact_match",
                "twin",
                "unavailable: exited before healthy"
            )
        );
        assert_eq!(g.gates[0].arms[0].pass, None);
        assert!(
            g.verdict_reason
                .contains("quality_min_exact_match for twin: unavailable: exited before healthy"),
            "{}",
            g.verdict_reason
        );
        // A twin that was measured and answers otherwise rejects, whatever else is missing.
        d.arms[1].available = true;
        d.drift = Some(Some(vec![drift_entry("twin", 0.5)]));
        d.arms[2].available = false;
        assert_eq!(gates(&d, &t, None).verdict, "reject");
        // An unavailable fit arm: whether the campaign has a benefit is not known.
        let mut d = doc(&campaign(1.0, cell(1000.0, 200.0, 90.0, 0)));
        d.arms[2].available = false;
        let g = gates(&d, &t, None);
        assert_eq!(
            (g.quality_lane_pass, g.fit_benefit, g.verdict.as_str()),
            (Some(true), None, "inconclusive")
        );
        // ... unless another fit arm shows one on measured evidence.
        let q8 = arm(
            "q8",
            "performance-fit",
            &[(1, cell(1000.0, 200.0, 90.0, 0))],
        );
        d.arms
            .push(serde_json::from_value(q8).expect("an arm of campaign.json"));
        assert_eq!(gates(&d, &t, None).verdict, "adopt");
        // The reference alone in the quality lane: passes, with a note.
        let c = json!({"arms": [arm("ref", "quality", &[(1, cell(4000.0, 100.0, 100.0, 0))]),
                                arm("q4", "performance-fit", &[(1, cell(1000.0, 200.0, 90.0, 0))])]});
        let g = gates(&doc(&c), &t, None);
        assert_eq!(
            (g.quality_lane_pass, g.verdict.as_str()),
            (Some(true), "adopt")
        );
        assert!(g.quality_lane_note.is_some());
    }

    #[test]
    fn a_run_that_ended_before_its_plan_is_inconclusive_unless_quality_failed() {
        let t = Thresholds::default();
        let adopt = doc(&campaign(1.0, cell(1000.0, 120.0, 105.0, 0)));
        assert_eq!(gates(&adopt, &t, None).verdict, "adopt");
        let g = gates(&adopt, &t, Some("it was interrupted"));
        assert_eq!(g.verdict, "inconclusive");
        assert!(
            g.verdict_reason
                .contains("ended before its plan (it was interrupted)"),
            "{}",
            g.verdict_reason
        );
        let reject = doc(&campaign(0.5, cell(1000.0, 120.0, 105.0, 0)));
        assert_eq!(
            gates(&reject, &t, Some("it was interrupted")).verdict,
            "reject"
        );
    }

    #[test]
    fn a_missing_value_decides_only_when_the_decision_depends_on_it() {
        let t = Thresholds::default();
        // Memory not sampled (null, never 0): the memory gate has nothing to read, and
        // only its note carries the sampling caveat.
        let mut d = doc(&campaign(1.0, cell(1.0, 200.0, 90.0, 0)));
        if let Some(c) = d.arms[2].concurrency.get_mut(&1) {
            c.peak_rss_bytes = None;
        }
        let g = gates(&d, &t, None);
        let mem = &g.gates[2].arms[0];
        assert_eq!(mem.pass, None);
        let caveat = |n: &Option<String>| {
            n.as_deref()
                .is_some_and(|n| n.contains("memory is sampled only"))
        };
        assert!(caveat(&mem.note), "{:?}", mem.note);
        assert_eq!(g.gates[3].arms[0].pass, Some(true));
        let with_caveat = g
            .gates
            .iter()
            .flat_map(|g| &g.arms)
            .filter(|a| caveat(&a.note));
        assert_eq!(with_caveat.count(), 1, "only the memory gate's note");
        // Twice the reference's decode speed is a benefit whatever the memory: adopt.
        assert_eq!(g.verdict, "adopt");
        assert_eq!(g.fit_arms[0].fit_min_memory_reduction, None);
        // At the reference's speed the benefit rests on the memory nobody sampled.
        if let Some(c) = d.arms[2].concurrency.get_mut(&1) {
            c.decode_tokens_per_sec = Some(100.0);
            c.aggregate_decode_tokens_per_sec = Some(100.0);
        }
        let g = gates(&d, &t, None);
        assert_eq!((g.verdict.as_str(), g.fit_benefit), ("inconclusive", None));
        let m = &g.missing_evidence[0];
        assert_eq!(
            (m.gate.as_str(), m.arm.as_str()),
            ("fit_min_memory_reduction", "q4")
        );
    }
}
