//! `compare.json`: two runs of one workload, their sides paired, drift of B's answers
//! against A's, every metric's delta with both runs' spreads, and optionally a verdict.

use serde::{Deserialize, Serialize};

use super::campaign::DriftEntry;
use super::summary::SpreadDoc;
use super::verdict::VerdictDoc;

/// The schema version of compare.json.
pub(crate) const COMPARE_SCHEMA_VERSION: u64 = 1;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct CompareDoc {
    pub(crate) schema_version: u64,
    pub(crate) run_a: RunRef,
    pub(crate) run_b: RunRef,
    pub(crate) workload_sha256: String,
    pub(crate) pairs: Vec<Pair>,
    pub(crate) unmatched_sides: Vec<String>,
    pub(crate) drift: Vec<PairDrift>,
    pub(crate) metrics: Vec<MetricDeltas>,
    pub(crate) definitions: CompareDefinitions,
    /// Only with `--contract`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) verdict: Option<VerdictDoc>,
}

/// One of the two runs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct RunRef {
    pub(crate) dir: String,
    pub(crate) run_id: String,
    pub(crate) plan_id: Option<String>,
}

/// One side of a comparison: a campaign arm, or a plain run (`None`).
pub(crate) type Side = Option<String>;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Pair {
    pub(crate) a: Side,
    pub(crate) b: Side,
}

/// Drift of B's side against A's.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct PairDrift {
    #[serde(flatten)]
    pub(crate) entry: DriftEntry,
    pub(crate) side_a: Side,
    pub(crate) side_b: Side,
}

/// One (pair, case, concurrency) in either run: every metric of summary.json's
/// `round_aggregates`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct MetricDeltas {
    pub(crate) side_a: Side,
    pub(crate) side_b: Side,
    pub(crate) case: String,
    pub(crate) concurrency: Option<usize>,
    pub(crate) in_a: bool,
    pub(crate) in_b: bool,
    pub(crate) metrics: indexmap::IndexMap<String, MetricDelta>,
}

/// One metric in both runs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct MetricDelta {
    pub(crate) a: Option<SpreadDoc>,
    pub(crate) b: Option<SpreadDoc>,
    pub(crate) delta: Option<f64>,
    pub(crate) relative_delta: Option<f64>,
    /// The delta's 95 % bootstrap interval (unpaired), or why there is none.
    #[serde(default)]
    pub(crate) interval: Option<crate::stats::Interval>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) interval_reason: Option<String>,
    /// Whether the interval excludes 0 (`null` without an interval).
    #[serde(default)]
    pub(crate) difference_shown: Option<bool>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct CompareDefinitions {
    pub(crate) drift: crate::drift::Definitions,
    pub(crate) metrics: MetricDefinitions,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct MetricDefinitions {
    pub(crate) a: String,
    pub(crate) b: String,
    pub(crate) delta: String,
    pub(crate) relative_delta: String,
    #[serde(default)]
    pub(crate) interval: String,
    #[serde(default)]
    pub(crate) difference_shown: String,
}
