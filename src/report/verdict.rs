//! The verdict: a pre-registered contract's gates evaluated on what a campaign measured
//! (campaign.json's cells and drift), so `replay --contract` and a later `verdict` read
//! one definition from one file. A gate holds for an arm when it holds at every
//! concurrency level compared (both arms measured the value there); comparisons are
//! inclusive, with a relative tolerance of 1e-9 so binary rounding (1.1 x 100 is
//! 110.00000000000001) cannot fail a value written at the boundary.

use super::capacity::capacity_gate;
use super::doc::campaign::CampaignDoc;
use super::doc::verdict::{
    ArmGate, ContractDoc, Evaluation, FitArm, Gate, Gates, MissingEvidence, Rules, Threshold,
    VERDICT_SCHEMA_VERSION, VerdictDoc,
};
use super::gates::{
    Answered, ArmView, Bound, Pick, RatioRule, ValidityBound, all3, any3, arms, decode,
    decode_pooled, drift_gate, failed_gate, floor_gate, mcnemar_gate, memory, p95, ratio_gate,
    validity_gate,
};
use crate::config::campaign::Lane;
use crate::config::contract::{
    Contract, FIT_SIMILARITY_DEFAULT, MIN_DISTINCT_REQUESTS, Thresholds,
};

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

/// What the verdict is decided from.
#[derive(Clone, Copy)]
struct Decision<'a> {
    /// The quality lane: passed, failed on measured evidence, or a gate had nothing to
    /// read (`None`).
    quality_pass: Option<bool>,
    /// Whether a performance-fit arm has a benefit (`None`: it depends on a gate with
    /// nothing to read).
    fit_benefit: Option<bool>,
    /// The performance-fit arms ready to adopt.
    adopt: &'a [String],
    /// Whether some fit arm's readiness depends on a gate with nothing to read.
    any_unknown_ready: bool,
    /// Why the run ended before its plan, if it did.
    ended_early: Option<&'a str>,
    /// The gates that had nothing to read, for the reason.
    missing: &'a [MissingEvidence],
}

/// The verdict from the lanes' three-valued results: a quality gate that fails on measured
/// evidence rejects; otherwise missing evidence the decision depends on, or a run that
/// ended before its plan, makes it `inconclusive` (never a decision on what was not
/// measured); otherwise keep-reference, adopt or optimize.
fn decide(d: &Decision<'_>) -> (&'static str, String) {
    let Decision {
        quality_pass,
        fit_benefit,
        adopt,
        any_unknown_ready,
        ended_early,
        missing,
    } = *d;
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
            "the quality lane passed and no performance-fit arm has a benefit (max_failed_requests, the fit answer gates a v2 contract has, and either fit_min_memory_reduction or fit_min_decode_speedup)".into(),
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

/// Every gate of `t` for every arm it applies to, by lane.
/// (gate name, threshold, passes when, one result per arm).
type GateRow = (&'static str, Threshold, String, Vec<ArmGate>);

struct Lanes {
    /// In verdict.json's order.
    gates: Vec<GateRow>,
    quality_pass: Option<bool>,
    fit_arms: Vec<FitArm>,
}

/// The quality lane's gates: (name, threshold, passes when, one result per arm).
fn quality_gates(campaign: &CampaignDoc, t: &Thresholds, quality: &[&ArmView<'_>]) -> Vec<GateRow> {
    let drift = |name: &str| campaign.drift_entries().iter().find(|e| e.arm == name);
    let floor = campaign.drift_floor.as_ref();
    let others: Vec<&&ArmView<'_>> = quality.iter().filter(|a| !a.reference).collect();
    let each = |f: &dyn Fn(&ArmView<'_>) -> ArmGate| -> Vec<ArmGate> {
        others.iter().map(|a| f(a)).collect()
    };
    let pooled =
        " (pairs pooled: see each drift entry's weights for per-case and per-variant numbers)";
    let mut out = Vec::new();
    if let Some(min) = t.quality_min_exact_match {
        out.push((
            "quality_min_exact_match",
            Threshold::Ratio(min),
            format!("every non-reference quality-lane arm's exact-match rate >= threshold at every level{pooled}"),
            each(&|a| drift_gate(a, drift(a.name), Answered::ExactMatch, (min, t.version() >= 2))),
        ));
    }
    if let Some(x) = t.quality_max_exact_match_drop_vs_floor {
        out.push((
            "quality_max_exact_match_drop_vs_floor",
            Threshold::Ratio(x),
            format!("at every level, a quality arm's exact-match rate >= the reference's floor (drift_floor, the reference against its own repetitions) - threshold; a floor or an arm's drift on fewer than {MIN_DISTINCT_REQUESTS} distinct requests at a level has nothing to read{pooled}"),
            each(&|a| floor_gate(a, drift(a.name), floor, Answered::ExactMatch, x)),
        ));
    }
    if let Some(x) = t.quality_min_similarity_vs_floor {
        out.push((
            "quality_min_similarity_vs_floor",
            Threshold::Ratio(x),
            format!("at every level, a quality arm's mean similarity >= threshold x the floor's; a floor or an arm's drift on fewer than {MIN_DISTINCT_REQUESTS} distinct requests at a level has nothing to read{pooled}"),
            each(&|a| floor_gate(a, drift(a.name), floor, Answered::Similarity, x)),
        ));
    }
    if let Some(min) = t.quality_min_mcnemar_p {
        out.push((
            "quality_min_mcnemar_p",
            Threshold::Ratio(min),
            format!("the exact McNemar p-value of a quality arm's oracle-judged answers (one item per distinct request) against the reference's >= threshold: fails whenever p < threshold; passes with p >= threshold and at least {} discordant requests, or with none when the one-sided bound 1 - threshold^(1/n) on n distinct requests is below quality_max_exact_match_drop_vs_floor; else nothing to read", crate::stats::MIN_DISCORDANT),
            each(&|a| mcnemar_gate(a, drift(a.name), min, t.quality_max_exact_match_drop_vs_floor)),
        ));
    }
    out
}

/// The performance-fit lane's gates, one result per fit arm each (the answer gates only
/// when the contract has them).
struct FitGates {
    failed: Vec<ArmGate>,
    mem: Vec<ArmGate>,
    speed: Vec<ArmGate>,
    lat: Vec<ArmGate>,
    ratio: Vec<ArmGate>,
    sim: Option<Vec<ArmGate>>,
    exact: Option<Vec<ArmGate>>,
    /// v2's `min_capacity_ratio`, when the contract has it.
    capacity: Option<Vec<ArmGate>>,
}

fn fit_gates(
    campaign: &CampaignDoc,
    t: &Thresholds,
    fit: &[&ArmView<'_>],
    reference: &ArmView<'_>,
) -> FitGates {
    let drift = |name: &str| campaign.drift_entries().iter().find(|e| e.arm == name);
    let rule = RatioRule {
        intervals: campaign.intervals.as_ref(),
        require_interval: t.interval_required(),
    };
    let speed_pick: (&str, Pick) = if t.version() >= 2 {
        ("decode", decode_pooled)
    } else {
        ("decode", decode)
    };
    let ratio_gates = |pick: (&str, Pick), factor: f64, at_most: bool| -> Vec<ArmGate> {
        fit.iter()
            .map(|a| ratio_gate((a, reference), pick, Bound { factor, at_most }, rule))
            .collect()
    };
    let answers = |min: Option<f64>, what: Answered| -> Option<Vec<ArmGate>> {
        min.map(|m| {
            fit.iter()
                .map(|a| drift_gate(a, drift(a.name), what, (m, true)))
                .collect()
        })
    };
    FitGates {
        failed: fit
            .iter()
            .map(|a| failed_gate(a, t.max_failed_requests))
            .collect(),
        mem: ratio_gates(("memory", memory), 1.0 - t.fit_min_memory_reduction, true),
        speed: ratio_gates(speed_pick, 1.0 + t.fit_min_decode_speedup, false),
        lat: ratio_gates(("p95", p95), t.max_p95_latency_ratio, true),
        ratio: ratio_gates(speed_pick, t.min_decode_ratio, false),
        sim: answers(t.fit_min_mean_similarity, Answered::Similarity),
        exact: answers(t.fit_min_exact_match, Answered::ExactMatch),
        capacity: t.min_capacity_ratio.map(|min| {
            fit.iter()
                .map(|a| capacity_gate(a, reference.name, &campaign.operating_points, min))
                .collect()
        }),
    }
}

/// One of v2's validity gates over both lanes' non-reference arms.
struct ValidityRow {
    name: &'static str,
    threshold: f64,
    passes_when: String,
    quality: Vec<ArmGate>,
    fit: Vec<ArmGate>,
}

/// A validity gate as a contract writes it: its name, its threshold if written, the
/// bound it reads, and what it passes on.
type ValidityGate = (
    &'static str,
    Option<f64>,
    fn(f64) -> ValidityBound,
    &'static str,
);

/// v2's `min_valid_rate` and `valid_rate_floor_delta` for every non-reference arm of
/// both lanes (a fit arm's broken contracts are no correctness failure of its answers,
/// but they cost it its benefit).
fn validity_gates(
    campaign: &CampaignDoc,
    t: &Thresholds,
    (quality, fit): (&[&ArmView<'_>], &[&ArmView<'_>]),
) -> Vec<ValidityRow> {
    let drift = |name: &str| campaign.drift_entries().iter().find(|e| e.arm == name);
    let run = |arms: &[&ArmView<'_>], bound: ValidityBound| -> Vec<ArmGate> {
        arms.iter()
            .filter(|a| !a.reference)
            .map(|a| validity_gate(a, drift(a.name), bound))
            .collect()
    };
    let gates: [ValidityGate; 2] = [
        (
            "min_valid_rate",
            t.min_valid_rate,
            ValidityBound::MinRate,
            "each contract oracle kind an arm was judged by (expected_schema, expected_tool_calls, expected_choice, expected_pattern): its valid distinct requests / judged, with an exact 95 % interval (a request is valid when every judged answer to it is): fails when the interval lies below the threshold, passes when it lies at or above it, else nothing to read (both lanes)",
        ),
        (
            "valid_rate_floor_delta",
            t.valid_rate_floor_delta,
            ValidityBound::MaxDrop,
            "each contract oracle kind: how far the arm's validity falls below the reference's, paired over the distinct requests both judged ((reference-only valid - arm-only valid) / requests, with a conservative 95 % interval from exact bounds on each count): fails when the interval lies above the threshold, passes when it lies at or below it, else nothing to read (both lanes)",
        ),
    ];
    gates
        .into_iter()
        .filter_map(|(name, threshold, bound, passes_when)| {
            let threshold = threshold?;
            Some(ValidityRow {
                name,
                threshold,
                passes_when: passes_when.into(),
                quality: run(quality, bound(threshold)),
                fit: run(fit, bound(threshold)),
            })
        })
        .collect()
}

/// Each fit arm's gates at a glance: a benefit needs max_failed_requests, the answer gates
/// the contract has (validity's too), and memory or speed; ready needs latency and decode
/// ratio too.
fn fit_arms(fit: &[&ArmView<'_>], g: &FitGates, valid: &[ValidityRow]) -> Vec<FitArm> {
    let pass_of = |g: &Option<Vec<ArmGate>>, i: usize| g.as_ref().map(|g| g[i].pass);
    let valid_of =
        |name: &str, i: usize| valid.iter().find(|v| v.name == name).map(|v| v.fit[i].pass);
    (0..fit.len())
        .map(|i| {
            let answers = all3(
                [
                    pass_of(&g.sim, i),
                    pass_of(&g.exact, i),
                    valid_of("min_valid_rate", i),
                    valid_of("valid_rate_floor_delta", i),
                ]
                .into_iter()
                .flatten(),
            );
            let benefit = all3([
                g.failed[i].pass,
                answers,
                any3([g.mem[i].pass, g.speed[i].pass]),
            ]);
            FitArm {
                arm: fit[i].name.into(),
                benefit,
                ready: all3(
                    [benefit, g.lat[i].pass, g.ratio[i].pass]
                        .into_iter()
                        .chain(pass_of(&g.capacity, i)),
                ),
                max_failed_requests: g.failed[i].pass,
                fit_min_memory_reduction: g.mem[i].pass,
                fit_min_decode_speedup: g.speed[i].pass,
                max_p95_latency_ratio: g.lat[i].pass,
                min_decode_ratio: g.ratio[i].pass,
                fit_min_mean_similarity: pass_of(&g.sim, i),
                fit_min_exact_match: pass_of(&g.exact, i),
                min_valid_rate: valid_of("min_valid_rate", i),
                valid_rate_floor_delta: valid_of("valid_rate_floor_delta", i),
                min_capacity_ratio: pass_of(&g.capacity, i),
            }
        })
        .collect()
}

/// Append max_failed_requests (both lanes) and the fit lane's gates, with what each reads.
fn push_fit_gates(gates: &mut Vec<GateRow>, t: &Thresholds, failed_q: Vec<ArmGate>, g: FitGates) {
    let interval = if t.interval_required() {
        ": its whole 95 % bootstrap interval (campaign.json's intervals) must be past the bound"
    } else {
        ""
    };
    let decode_value = if t.version() >= 2 {
        "pooled decode tok/s (decode_pooled_tokens_per_sec when both stream, else aggregate)"
    } else {
        "decode tok/s (per request when both stream, else aggregate)"
    };
    let failed_all: Vec<ArmGate> = failed_q.into_iter().chain(g.failed).collect();
    gates.push(("max_failed_requests", Threshold::Count(t.max_failed_requests),
        "an arm's failed measured requests, every level summed, <= threshold (quality lane: all arms; performance-fit: each candidate)".into(), failed_all));
    gates.push(("fit_min_memory_reduction", Threshold::Ratio(t.fit_min_memory_reduction),
        "a fit arm's peak memory (VRAM when both sampled it, else RSS) <= (1 - threshold) x the reference's (one peak per level: the point rule always)".into(), g.mem));
    gates.push((
        "fit_min_decode_speedup",
        Threshold::Ratio(t.fit_min_decode_speedup),
        format!("a fit arm's {decode_value} >= (1 + threshold) x the reference's{interval}"),
        g.speed,
    ));
    gates.push((
        "max_p95_latency_ratio",
        Threshold::Ratio(t.max_p95_latency_ratio),
        format!("a fit arm's latency p95 <= threshold x the reference's{interval}"),
        g.lat,
    ));
    gates.push((
        "min_decode_ratio",
        Threshold::Ratio(t.min_decode_ratio),
        format!("a fit arm's {decode_value} >= threshold x the reference's{interval}"),
        g.ratio,
    ));
    if let (Some(min), Some(results)) = (t.min_capacity_ratio, g.capacity) {
        gates.push((
            "min_capacity_ratio",
            Threshold::Ratio(min),
            "a fit arm's operating point (replay --search) over the reference's, per case: with each knee between its last pass and first fail, the ratio lies in [pass_arm / fail_ref, fail_arm / pass_ref]; passes when that whole range is at or above the threshold, fails when it lies below, else nothing to read".into(),
            results,
        ));
    }
    for (name, what, min, results) in [
        (
            "fit_min_mean_similarity",
            "mean similarity",
            t.fit_min_mean_similarity,
            g.sim,
        ),
        (
            "fit_min_exact_match",
            "exact-match rate",
            t.fit_min_exact_match,
            g.exact,
        ),
    ] {
        if let (Some(min), Some(results)) = (min, results) {
            gates.push((name, Threshold::Ratio(min),
                format!("a fit arm's {what} against the reference's >= threshold at every level: it may answer differently, not arbitrarily"), results));
        }
    }
}

/// Evaluate every gate of `t`, and the lanes' results.
fn lanes(
    campaign: &CampaignDoc,
    t: &Thresholds,
    all: &[ArmView<'_>],
    reference: &ArmView<'_>,
) -> Lanes {
    let quality: Vec<&ArmView<'_>> = all.iter().filter(|a| a.quality).collect();
    let fit: Vec<&ArmView<'_>> = all.iter().filter(|a| !a.quality).collect();
    let mut gates = quality_gates(campaign, t, &quality);
    let failed_q: Vec<ArmGate> = quality
        .iter()
        .map(|a| failed_gate(a, t.max_failed_requests))
        .collect();
    let valid = validity_gates(campaign, t, (&quality, &fit));
    let quality_pass = all3(
        gates
            .iter()
            .flat_map(|g| &g.3)
            .chain(&failed_q)
            .chain(valid.iter().flat_map(|v| &v.quality))
            .map(|g| g.pass),
    );
    let g = fit_gates(campaign, t, &fit, reference);
    let fit_arms = fit_arms(&fit, &g, &valid);
    push_fit_gates(&mut gates, t, failed_q, g);
    for v in valid {
        let results = v.quality.into_iter().chain(v.fit).collect();
        gates.push((
            v.name,
            Threshold::Ratio(v.threshold),
            v.passes_when,
            results,
        ));
    }
    Lanes {
        gates,
        quality_pass,
        fit_arms,
    }
}

/// A rule's label for the terminal: its text up to the first colon outside parentheses
/// (`point (require_interval: false)`, never `point (require_interval`).
fn rule_label(rule: &str) -> &str {
    let mut depth = 0usize;
    for (i, c) in rule.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ':' if depth == 0 => return &rule[..i],
            _ => {}
        }
    }
    rule
}

/// The rules `t`'s version applies, said in verdict.json.
fn rules(t: &Thresholds) -> Rules {
    let floor = [
        t.quality_max_exact_match_drop_vs_floor
            .map(|_| "quality_max_exact_match_drop_vs_floor"),
        t.quality_min_similarity_vs_floor
            .map(|_| "quality_min_similarity_vs_floor"),
    ];
    let floor: Vec<&str> = floor.into_iter().flatten().collect();
    let quality = match (t.quality_min_exact_match.is_some(), floor.is_empty()) {
        (true, true) => "absolute: quality_min_exact_match".to_string(),
        (false, false) => format!(
            "floor-relative: {} (quality_min_exact_match is not applied: a v2 contract that writes a floor-relative gate applies the absolute one only when it writes it too)",
            floor.join(", ")
        ),
        (true, false) => format!(
            "absolute and floor-relative: quality_min_exact_match, {}",
            floor.join(", ")
        ),
        (false, true) => "none on answers".into(),
    };
    Rules {
        contract_version: t.version(),
        quality,
        ratio: if t.interval_required() {
            "interval (require_interval): a speed or latency ratio gate passes at a level only when the whole 95 % bootstrap interval of the ratio is past its bound, fails when it is not, and has nothing to read without an interval".into()
        } else if t.version() >= 2 {
            "point (require_interval: false): a ratio gate compares the point values".into()
        } else {
            "point (contract v1): a ratio gate compares the point values; intervals, where campaign.json has them, are not read".into()
        },
        decode: if t.version() >= 2 {
            "pooled: decode_pooled_tokens_per_sec (output tokens / decode time over the level's unbundled streams), else aggregate".into()
        } else {
            "per request (contract v1): decode_tokens_per_sec, the mean of per-stream rates, else aggregate".into()
        },
        weights: "exact-match and similarity gates read the pooled rates (every pair weighs the same); drift entries' weights give them per case and per variant".into(),
    }
}

/// A v1 contract has no gate on a fit arm's answers: say which fit arms answer far from
/// the reference (mean similarity below v2's default floor).
fn warnings(campaign: &CampaignDoc, t: &Thresholds) -> Vec<String> {
    if t.fit_min_mean_similarity.is_some() {
        return Vec::new();
    }
    campaign
        .drift_entries()
        .iter()
        .filter(|e| e.lane == Some(Lane::PerformanceFit))
        .filter_map(|e| {
            let s = e.drift.mean_similarity.filter(|s| *s < FIT_SIMILARITY_DEFAULT)?;
            Some(format!(
                "performance-fit arm '{}' answers with mean similarity {s:.3} to the reference's, below {FIT_SIMILARITY_DEFAULT}: no v1 gate reads it; a contract_version 2 contract's fit_min_mean_similarity (default {FIT_SIMILARITY_DEFAULT}) would fail it",
                e.arm
            ))
        })
        .collect()
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
    let Some(reference) = arms.iter().find(|a| a.reference) else {
        return Evaluation::Error {
            error: "campaign.json names no reference arm".into(),
        };
    };
    let quality_count = arms.iter().filter(|a| a.quality).count();
    let Lanes {
        gates,
        quality_pass,
        fit_arms,
    } = lanes(campaign, t, &arms, reference);
    let fit_benefit = any3(fit_arms.iter().map(|f| f.benefit));
    let adopt: Vec<String> = fit_arms
        .iter()
        .filter(|f| f.ready == Some(true))
        .map(|f| f.arm.clone())
        .collect();
    let named: Vec<(&str, &Vec<ArmGate>)> = gates.iter().map(|g| (g.0, &g.3)).collect();
    let missing = missing_evidence(&named);
    let any_unknown_ready = fit_arms.iter().any(|f| f.ready.is_none());
    let (verdict, reason) = decide(&Decision {
        quality_pass,
        fit_benefit,
        adopt: &adopt,
        any_unknown_ready,
        ended_early,
        missing: &missing,
    });
    Evaluation::Gates(Box::new(Gates {
        quality_lane_pass: quality_pass,
        quality_lane_note: (quality_count == 1).then(|| {
            "the reference is the only quality-lane arm: no quality arm's answers were compared, so the quality lane rests on max_failed_requests alone".into()
        }),
        fit_benefit,
        verdict: verdict.into(),
        verdict_reason: reason,
        adopt_arms: adopt,
        fit_arms,
        reference_arm: reference.name.into(),
        rules: rules(t),
        warnings: warnings(campaign, t),
        missing_evidence: missing,
        gates: gates
            .into_iter()
            .map(|(name, threshold, when, results)| gate(name, threshold, &when, results))
            .collect(),
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

/// One gate's result for one arm in words: each level's measured value against its
/// limit (a ratio with its interval and bound under `require_interval`), then the note.
pub(crate) fn arm_detail(a: &ArmGate) -> String {
    let levels = a
        .levels
        .iter()
        .filter_map(|l| match (l.concurrency, l.measured, l.limit, l.interval) {
            (Some(c), _, Some(lim), Some([lo, hi])) => Some(format!(
                "c={c}: ratio {} [{lo:.3}, {hi:.3}] (bound {:.3})",
                short(l.ratio.unwrap_or(f64::NAN)),
                lim / l.reference.unwrap_or(f64::NAN)
            )),
            (Some(c), Some(m), Some(lim), None) => {
                Some(format!("c={c}: {} (limit {})", short(m), short(lim)))
            }
            _ => None,
        })
        .collect::<Vec<_>>()
        .join(", ");
    match (levels.is_empty(), a.note.as_deref()) {
        (_, None) => levels,
        (true, Some(n)) => n.to_string(),
        (false, Some(n)) => format!("{levels} ({n})"),
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
    let all = gates.map_or(&[][..], |g| g.gates.as_slice());
    let width = all.iter().map(|g| g.gate.len()).max().unwrap_or(0).max(26);
    for g in all {
        for a in &g.arms {
            let detail = arm_detail(a);
            out.push_str(&format!(
                "  {:<width$} {:<14} {}  {detail}\n",
                g.gate,
                a.arm,
                yes(a.pass),
            ));
        }
    }
    if let Some(g) = gates {
        out.push_str(&format!(
            "  rules (contract v{}): quality {}; ratio gates {}\n",
            g.rules.contract_version,
            rule_label(&g.rules.quality),
            rule_label(&g.rules.ratio),
        ));
        for w in &g.warnings {
            out.push_str(&format!("  warning: {w}\n"));
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
    use crate::report::doc::campaign::DriftEntry;
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
        json!({"arm": name, "concurrency": {"1": {"compared_prompts": 80, "distinct_requests": 40, "exact_match_rate": rate}}})
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
            quality_min_exact_match: Some(0.5),
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

    fn v2(f: impl FnOnce(&mut Thresholds)) -> Thresholds {
        let mut t = Thresholds::v2();
        f(&mut t);
        t
    }

    /// The reference's floor at level 1: `pairs` pairs of `requests` distinct requests,
    /// exact match 0.7, similarity 0.9.
    fn with_floor(c: &Value, (pairs, requests): (u64, u64)) -> CampaignDoc {
        let level = crate::drift::LevelDrift {
            compared_prompts: pairs,
            distinct_requests: requests,
            exact_match_rate: Some(0.7),
            mean_similarity: Some(0.9),
        };
        let mut d = doc(c);
        d.drift_floor = Some(crate::report::doc::campaign::DriftFloor {
            reference_arm: "ref".into(),
            reason: None,
            drift: crate::drift::Drift {
                compared_prompts: pairs,
                distinct_requests: requests,
                exact_match_rate: Some(0.7),
                mean_similarity: Some(0.9),
                concurrency: [("1".to_string(), level)].into_iter().collect(),
                ..Default::default()
            },
        });
        d
    }

    /// Drift entry `i` of a campaign.json, and its totals at level 1.
    fn entry_mut(d: &mut CampaignDoc, i: usize) -> &mut DriftEntry {
        &mut d.drift.as_mut().and_then(|x| x.as_mut()).expect("drift")[i]
    }

    fn level_1(e: &mut DriftEntry) -> &mut crate::drift::LevelDrift {
        e.drift.concurrency.get_mut("1").expect("level 1")
    }

    fn gate_of<'a>(g: &'a Gates, name: &str) -> &'a Gate {
        g.gates
            .iter()
            .find(|x| x.gate == name)
            .unwrap_or_else(|| panic!("no gate {name}"))
    }

    #[test]
    fn a_twin_at_the_floor_passes_the_relative_gate_the_absolute_one_rejects() {
        // The twin matches the reference 70 % of the time, as the reference matches
        // itself: the absolute gate (1.0) rejects it, the floor-relative gate passes it.
        let mut c = with_floor(&campaign(0.7, cell(1000.0, 200.0, 90.0, 0)), (60, 30));
        level_1(entry_mut(&mut c, 0)).mean_similarity = Some(0.9);
        let abs = gates(&c, &Thresholds::v2(), None);
        assert_eq!(abs.verdict, "reject");
        assert!(
            abs.rules.quality.starts_with("absolute"),
            "{}",
            abs.rules.quality
        );
        let t = v2(|t| {
            t.quality_min_exact_match = None;
            t.quality_max_exact_match_drop_vs_floor = Some(0.0);
            t.quality_min_similarity_vs_floor = Some(1.0);
        });
        let g = gates(&c, &t, None);
        assert_eq!(g.quality_lane_pass, Some(true), "{:#?}", g.gates);
        assert!(
            g.rules.quality.starts_with("floor-relative"),
            "{}",
            g.rules.quality
        );
        let drop = &gate_of(&g, "quality_max_exact_match_drop_vs_floor").arms[0].levels[0];
        assert_eq!(
            (drop.floor, drop.floor_pairs, drop.limit, drop.pass),
            (Some(0.7), Some(60), Some(0.7), Some(true))
        );
        // Below the floor by more than the allowed drop: rejected on measured evidence.
        let mut below = c.clone();
        level_1(entry_mut(&mut below, 0)).exact_match_rate = Some(0.6);
        let t2 = v2(|t| {
            t.quality_min_exact_match = None;
            t.quality_max_exact_match_drop_vs_floor = Some(0.05);
        });
        assert_eq!(gates(&below, &t2, None).verdict, "reject");
        // A floor on too few distinct requests: inconclusive, never a pass, however many
        // pairs their repetitions make (3 prompts x 15 pairs of 6 repetitions).
        let few = with_floor(&campaign(0.7, cell(1000.0, 200.0, 90.0, 0)), (45, 3));
        let g = gates(&few, &t2, None);
        assert_eq!(
            (g.quality_lane_pass, g.verdict.as_str()),
            (None, "inconclusive")
        );
        let note = g.missing_evidence[0].reason.clone();
        assert!(
            note.contains("45 pair(s)")
                && note.contains("3 distinct request(s)")
                && note.contains("fewer than 30 distinct requests"),
            "{note}"
        );
        // A floor on enough requests, but the twin's drift on 18 pairs of 3 requests.
        let mut thin = c.clone();
        let l = level_1(entry_mut(&mut thin, 0));
        (l.compared_prompts, l.distinct_requests) = (18, 3);
        let g = gates(&thin, &t2, None);
        assert_eq!(g.quality_lane_pass, None);
        let note = g.missing_evidence[0].reason.clone();
        assert!(
            note.contains("18 pair(s) from 3 distinct request(s)"),
            "{note}"
        );
        // No floor at all (one repetition): nothing to read either.
        let mut none = few.clone();
        if let Some(f) = none.drift_floor.as_mut() {
            f.reason = Some("one repetition".into());
        }
        let g = gates(&none, &t2, None);
        assert_eq!(g.quality_lane_pass, None);
    }

    #[test]
    fn under_v2_three_prompts_never_carry_a_drift_gate() {
        let mut c = doc(&campaign(1.0, cell(1000.0, 200.0, 90.0, 0)));
        let l = level_1(entry_mut(&mut c, 0));
        (l.compared_prompts, l.distinct_requests) = (45, 3);
        let exact = |t: &Thresholds| {
            let g = gates(&c, t, None);
            let a = gate_of(&g, "quality_min_exact_match").arms[0].clone();
            (a.pass, a.levels[0].note.clone().unwrap_or_default())
        };
        let (pass, note) = exact(&v2(|_| {}));
        assert_eq!(pass, None, "{note}");
        assert!(
            note.contains("45 pair(s) from 3 distinct request(s)"),
            "{note}"
        );
        // v1 keeps its rule.
        assert_eq!(exact(&Thresholds::default()).0, Some(true));
    }

    #[test]
    fn a_rules_label_is_never_cut_inside_its_parentheses() {
        let mut t = Thresholds::v2();
        t.require_interval = Some(false);
        let r = rules(&t);
        assert_eq!(rule_label(&r.ratio), "point (require_interval: false)");
        assert_eq!(
            rule_label(&rules(&Thresholds::v2()).ratio),
            "interval (require_interval)"
        );
        assert_eq!(
            rule_label(&rules(&Thresholds::default()).ratio),
            "point (contract v1)"
        );
        assert_eq!(rule_label("none on answers"), "none on answers");
    }

    #[test]
    fn mcnemar_gates_on_discordant_pairs_and_needs_enough_of_them() {
        let gate = |pairs: u64, only_ref: u64, only_arm: u64, drop: Option<f64>| {
            let t = v2(|t| {
                t.quality_min_mcnemar_p = Some(0.05);
                t.quality_max_exact_match_drop_vs_floor = drop;
            });
            let mut d = doc(&campaign(1.0, cell(1000.0, 200.0, 90.0, 0)));
            if let Some(e) = d.drift.as_mut().and_then(|x| x.as_mut()) {
                e[0].mcnemar = Some(crate::stats::McNemar {
                    pairs,
                    both_passed: pairs - only_ref - only_arm,
                    only_reference_passed: only_ref,
                    only_arm_passed: only_arm,
                    both_failed: 0,
                    p_value: crate::stats::mcnemar_p(only_ref, only_arm),
                });
            }
            let g = gates(&d, &t, None);
            let a = &gate_of(&g, "quality_min_mcnemar_p").arms[0];
            (a.pass, a.note.clone().unwrap_or_default())
        };
        let with = |only_ref, only_arm| gate(100, only_ref, only_arm, Some(0.02)).0;
        // 12 answers the reference got right and the twin wrong, 1 the other way:
        // p = 2 x 14/8192 = 0.0034: a difference.
        assert_eq!(with(12, 1), Some(false));
        // 7 vs 5: p = 0.77, no difference shown.
        assert_eq!(with(7, 5), Some(true));
        // 3 discordant requests show no difference and cannot vouch for its absence.
        assert_eq!(with(3, 0), None);
        // A lopsided split fails below the minimum of discordant requests: 0 vs 6 gives
        // p = 2/64 = 0.031 < 0.05.
        assert_eq!(with(6, 0), Some(false));
        assert_eq!(with(0, 6), Some(false));
        // No discordant request: the one-sided bound 1 - 0.05^(1/n) against the allowed
        // drop: 2.0 % at 150 requests passes a 5 % drop, 9.5 % at 30 does not.
        let (pass, note) = gate(150, 0, 0, Some(0.05));
        assert_eq!(pass, Some(true), "{note}");
        assert!(note.contains("below 1.98 %"), "{note}");
        let (pass, note) = gate(30, 0, 0, Some(0.05));
        assert_eq!(pass, None, "{note}");
        assert!(note.contains("only below 9.50 %"), "{note}");
        assert_eq!(gate(30, 0, 0, Some(0.10)).0, Some(true));
        assert_eq!(gate(150, 0, 0, None).0, None);
    }

    #[test]
    fn a_fit_arm_must_answer_like_the_reference_under_v2_and_v1_warns() {
        // q4 is twice as fast but its answers are unrelated (similarity 0.153).
        let mut c = doc(&campaign(1.0, cell(1000.0, 200.0, 90.0, 0)));
        let q4 = entry_mut(&mut c, 1);
        level_1(q4).mean_similarity = Some(0.153);
        q4.drift.mean_similarity = Some(0.153);
        q4.lane = Some(Lane::PerformanceFit);
        let v1 = gates(&c, &Thresholds::default(), None);
        assert_eq!(v1.verdict, "adopt");
        assert_eq!(v1.warnings.len(), 1, "{:?}", v1.warnings);
        assert!(v1.warnings[0].contains("'q4'") && v1.warnings[0].contains("0.153"));
        // v2 (no intervals required here): fit_min_mean_similarity 0.5 fails it, so it has
        // no benefit.
        let t = v2(|t| t.require_interval = Some(false));
        let mut d = c.clone();
        for a in &mut d.arms {
            for cell in a.concurrency.values_mut() {
                cell.decode_pooled_tokens_per_sec = cell.decode_tokens_per_sec;
                cell.decode_excluded = Some(Default::default());
            }
        }
        let g = gates(&d, &t, None);
        assert_eq!(g.fit_arms[0].fit_min_mean_similarity, Some(Some(false)));
        assert_eq!(
            (g.fit_benefit, g.verdict.as_str()),
            (Some(false), "keep-reference")
        );
        assert!(g.warnings.is_empty());
    }

    #[test]
    fn a_burst_arm_does_not_win_a_v2_decode_gate() {
        // Per request, a buffered arm's streams look 100x faster; every one of them was
        // bundled, so the pooled estimator has none to read.
        let mut d = doc(&campaign(1.0, cell(4000.0, 10_000.0, 100.0, 0)));
        for a in &mut d.arms {
            for cell in a.concurrency.values_mut() {
                let burst = a.name == "q4";
                cell.decode_pooled_tokens_per_sec = (!burst).then_some(100.0);
                cell.decode_excluded = Some(crate::report::doc::campaign::DecodeExcluded {
                    bundled: if burst { 10 } else { 0 },
                    pooled_streams: if burst { 0 } else { 10 },
                    ..Default::default()
                });
            }
        }
        let v1 = gates(&d, &Thresholds::default(), None);
        assert_eq!(v1.fit_arms[0].fit_min_decode_speedup, Some(true));
        let t = v2(|t| t.require_interval = Some(false));
        let g = gates(&d, &t, None);
        assert_eq!(g.fit_arms[0].fit_min_decode_speedup, None);
        assert_ne!(g.verdict, "adopt");
        let note = gate_of(&g, "fit_min_decode_speedup").arms[0]
            .note
            .clone()
            .unwrap_or_default();
        assert!(note.contains("decode_excluded"), "{note}");
        assert!(g.rules.decode.starts_with("pooled"));
    }
}
