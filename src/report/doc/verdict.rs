//! `verdict.json`: the contract, whether it was pre-registered, the lanes' results, the
//! verdict and every gate per arm and level (see `report::verdict` for the evaluation).

use serde::{Deserialize, Serialize};

/// The schema version of verdict.json.
pub(crate) const VERDICT_SCHEMA_VERSION: u64 = 1;

/// A verdict (verdict.json, or compare.json's `verdict`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct VerdictDoc {
    #[serde(default)]
    pub(crate) schema_version: u64,
    #[serde(default)]
    pub(crate) plan_id: String,
    #[serde(default)]
    pub(crate) run_id: Option<String>,
    #[serde(default)]
    pub(crate) run_started_at: Option<String>,
    #[serde(default)]
    pub(crate) run_ending: Option<String>,
    #[serde(default)]
    pub(crate) run_note: Option<String>,
    #[serde(default)]
    pub(crate) evaluated_at: String,
    #[serde(default)]
    pub(crate) contract_sha256: String,
    #[serde(default)]
    pub(crate) post_hoc: bool,
    #[serde(default)]
    pub(crate) post_hoc_reason: Option<String>,
    #[serde(default)]
    pub(crate) contract: ContractDoc,
    #[serde(default)]
    pub(crate) evidence_class: Option<String>,
    #[serde(flatten)]
    pub(crate) evaluation: Evaluation,
}

/// The contract as the verdict records it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct ContractDoc {
    pub(crate) path: String,
    pub(crate) contract_version: u64,
    pub(crate) locked_at: String,
    pub(crate) locked_by: String,
    pub(crate) plan_id: String,
    /// The contract's own `baseline` and `stop_condition`, echoed.
    pub(crate) baseline: serde_json::Value,
    pub(crate) stop_condition: serde_json::Value,
    pub(crate) thresholds: crate::config::contract::Thresholds,
}

/// What the gates concluded, or why they could not be evaluated.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
pub(crate) enum Evaluation {
    Gates(Box<Gates>),
    Error { error: String },
}

/// The lanes' results, the verdict and every gate.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct Gates {
    /// `null`: a quality gate had nothing to read and none failed (three-valued, as every
    /// pass below: `true`, `false` on measured evidence, `null` with nothing to read).
    pub(crate) quality_lane_pass: Option<bool>,
    pub(crate) quality_lane_note: Option<String>,
    pub(crate) fit_benefit: Option<bool>,
    /// `reject`, `keep-reference`, `adopt`, `optimize`, or `inconclusive` (the evidence
    /// the decision needs is missing, or the run ended before its plan).
    pub(crate) verdict: String,
    pub(crate) verdict_reason: String,
    pub(crate) adopt_arms: Vec<String>,
    pub(crate) fit_arms: Vec<FitArm>,
    pub(crate) reference_arm: String,
    pub(crate) gates: Vec<Gate>,
    /// Which rules the contract's version applied.
    pub(crate) rules: Rules,
    /// What the verdict did not decide on but a reader must know (a v1 contract's fit arm
    /// whose answers are far from the reference's).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) warnings: Vec<String>,
    /// Every gate and arm with nothing to read, and why (absent when there is none).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) missing_evidence: Vec<MissingEvidence>,
}

/// The rules a verdict applied, by the contract's version.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct Rules {
    pub(crate) contract_version: u64,
    /// Absolute, floor-relative, or both.
    pub(crate) quality: String,
    /// The point rule (v1) or the interval rule (`require_interval`).
    pub(crate) ratio: String,
    /// Which decode estimator the decode gates read.
    pub(crate) decode: String,
    /// What exact-match and similarity gates weigh.
    pub(crate) weights: String,
}

/// A gate that had nothing to read for an arm.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct MissingEvidence {
    pub(crate) gate: String,
    pub(crate) arm: String,
    pub(crate) reason: String,
}

/// A performance-fit arm's gates at a glance.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct FitArm {
    pub(crate) arm: String,
    pub(crate) benefit: Option<bool>,
    pub(crate) ready: Option<bool>,
    pub(crate) max_failed_requests: Option<bool>,
    pub(crate) fit_min_memory_reduction: Option<bool>,
    pub(crate) fit_min_decode_speedup: Option<bool>,
    pub(crate) max_p95_latency_ratio: Option<bool>,
    pub(crate) min_decode_ratio: Option<bool>,
    /// v2 only (absent from a v1 verdict): the fit arm's answers against the reference's.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "super::present"
    )]
    pub(crate) fit_min_mean_similarity: Option<Option<bool>>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "super::present"
    )]
    pub(crate) fit_min_exact_match: Option<Option<bool>>,
    /// v2 only, when the contract has them: the fit arm's validity gates.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "super::present"
    )]
    pub(crate) min_valid_rate: Option<Option<bool>>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "super::present"
    )]
    pub(crate) valid_rate_floor_delta: Option<Option<bool>>,
    /// v2 only, when the contract has it: the fit arm's operating point against the
    /// reference's.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "super::present"
    )]
    pub(crate) min_capacity_ratio: Option<Option<bool>>,
}

/// One gate over every arm it applies to.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct Gate {
    pub(crate) gate: String,
    pub(crate) threshold: Threshold,
    pub(crate) passes_when: String,
    pub(crate) pass: Option<bool>,
    pub(crate) arms: Vec<ArmGate>,
}

/// A gate's threshold: a count (`max_failed_requests`) or a fraction / ratio.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub(crate) enum Threshold {
    Count(u64),
    Ratio(f64),
}

impl Default for Threshold {
    fn default() -> Threshold {
        Threshold::Count(0)
    }
}

impl std::fmt::Display for Threshold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // As JSON writes it (a ratio of 1 is `1.0`).
        match self {
            Threshold::Count(n) => write!(f, "{n}"),
            Threshold::Ratio(x) => write!(
                f,
                "{}",
                serde_json::Number::from_f64(*x).map_or_else(|| x.to_string(), |n| n.to_string())
            ),
        }
    }
}

/// One gate's result for one arm.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct ArmGate {
    pub(crate) arm: String,
    /// `null`: nothing to read (the arm unavailable, no measured level, no pair), with the
    /// reason in `note`.
    pub(crate) pass: Option<bool>,
    pub(crate) levels: Vec<GateLevel>,
    pub(crate) note: Option<String>,
}

/// What a gate compared at one level. `max_failed_requests` lists `failed_requests`;
/// `quality_min_exact_match` the exact-match rate (`measured`) and `compared_prompts`;
/// a ratio gate the `metric`, `measured`, the `reference`'s value and their `ratio`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct GateLevel {
    pub(crate) concurrency: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) metric: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) failed_requests: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) measured: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) compared_prompts: Option<u64>,
    /// The distinct requests (case, variant) behind `compared_prompts`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) distinct_requests: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) reference: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) ratio: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) limit: Option<f64>,
    /// v2 floor-relative gates: the floor's value at this level and its pairs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) floor: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) floor_pairs: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) floor_distinct_requests: Option<u64>,
    /// `require_interval`: the ratio's 95 % bootstrap interval `[low, high]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) interval: Option<[f64; 2]>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) pass: Option<bool>,
    /// Why the level has nothing to read (`pass` absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) note: Option<String>,
}

impl VerdictDoc {
    /// The gates, unless the evaluation could not run.
    pub(crate) fn gates(&self) -> Option<&Gates> {
        match &self.evaluation {
            Evaluation::Gates(g) => Some(g),
            Evaluation::Error { .. } => None,
        }
    }

    /// The verdict's word (`reject`, `keep-reference`, `adopt`, `optimize`), or `?`.
    pub(crate) fn verdict(&self) -> &str {
        self.gates().map_or("?", |g| g.verdict.as_str())
    }
}
