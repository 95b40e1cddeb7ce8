//! `campaign.json`: per arm its recipe, lane, availability, load, and per concurrency one
//! cell pooling the arm's measured exchanges of every case at that level; then drift
//! against the reference, once the recorded answers have been read back.
//!
//! Reading is lenient where the verdict has always been: a cell without `complete`
//! (written before completeness was recorded) counts as complete, and a value a gate
//! needs that is absent is `None`, for the gate to say so.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::present;
use crate::config::campaign::Lane;

/// The schema version of campaign.json.
pub(crate) const CAMPAIGN_SCHEMA_VERSION: u64 = 1;

/// A campaign run's campaign.json.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct CampaignDoc {
    #[serde(default)]
    pub(crate) schema_version: u64,
    #[serde(default)]
    pub(crate) plan_id: Option<String>,
    #[serde(default)]
    pub(crate) evidence_class: Option<String>,
    #[serde(default)]
    pub(crate) schedule: String,
    #[serde(default)]
    pub(crate) reference_arm: Option<String>,
    pub(crate) arms: Vec<ArmDoc>,
    #[serde(default)]
    pub(crate) definitions: Option<CampaignDefinitions>,
    /// Absent until drift is computed (and when it could not be); `null` under
    /// `--no-record`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    pub(crate) drift: Option<Option<Vec<DriftEntry>>>,
    /// The reference's agreement with itself (absent until drift is computed, and in runs
    /// made before the floor existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) drift_floor: Option<DriftFloor>,
    /// The ratio gates' values with their bootstrap intervals (absent until computed from
    /// the recorded rows, and in runs made before intervals existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) intervals: Option<Intervals>,
    /// Why there is no drift (only under `--no-record`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) drift_unavailable_reason: Option<String>,
    /// `replay --search`: each arm's operating point per case, as search.json found it
    /// (absent without a search); v2's `min_capacity_ratio` reads it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) operating_points: Vec<OperatingPoint>,
}

/// One arm's operating point for one case: its knee bracketed between the highest load
/// that passed and the lowest that failed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct OperatingPoint {
    pub(crate) arm: String,
    pub(crate) case: String,
    /// `rate` or `concurrency`.
    pub(crate) kind: crate::config::search::SearchKind,
    /// The highest load that passed (null: none did).
    pub(crate) last_pass: Option<f64>,
    /// The lowest load that failed (null: none did, or the search stopped first).
    pub(crate) first_fail: Option<f64>,
    /// search.json's `stopped` (`found`, `no_passing_load`, `budget`, ...).
    pub(crate) stopped: String,
    /// Whether the answer's confirmation repeats all agreed (false: they did not, or the
    /// search has no answer); the capacity gate reads only confirmed knees.
    #[serde(default)]
    pub(crate) confirmed: bool,
}

/// One arm.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ArmDoc {
    pub(crate) name: String,
    #[serde(default)]
    pub(crate) recipe: Option<RecipeDoc>,
    pub(crate) lane: Lane,
    #[serde(default)]
    pub(crate) reference: bool,
    pub(crate) available: bool,
    #[serde(default)]
    pub(crate) unavailable_reason: Option<String>,
    #[serde(default)]
    pub(crate) endpoint: Option<String>,
    #[serde(default)]
    pub(crate) load: Option<ArmLoad>,
    /// The arm's own `metadata` from the plan, echoed.
    #[serde(default)]
    pub(crate) metadata: serde_json::Map<String, serde_json::Value>,
    /// By concurrency level.
    #[serde(default)]
    pub(crate) concurrency: BTreeMap<u64, Cell>,
    /// How its worker answered `--worker-metrics` scrapes (only when scraped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) worker_metrics_scrapes: Option<super::worker::ScrapeHealth>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct RecipeDoc {
    pub(crate) runtime: String,
    pub(crate) weight_format: String,
    pub(crate) weight_quantization: String,
    pub(crate) device: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct ArmLoad {
    pub(crate) artifact_bytes: Option<u64>,
    pub(crate) load_ms: Option<f64>,
}

/// One arm at one concurrency level, every case pooled.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct Cell {
    pub(crate) ttft_p50_ms: Option<f64>,
    pub(crate) ttft_p95_ms: Option<f64>,
    pub(crate) latency_p50_ms: Option<f64>,
    pub(crate) latency_p95_ms: Option<f64>,
    pub(crate) prefill_tokens_per_sec: Option<f64>,
    pub(crate) decode_tokens_per_sec: Option<f64>,
    /// Output tokens / decode time, summed over the cell's unbundled streams (v2's decode
    /// gates read it); absent in cells written before it existed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) decode_pooled_tokens_per_sec: Option<f64>,
    pub(crate) aggregate_decode_tokens_per_sec: Option<f64>,
    /// Streams each decode estimator left out, by reason (absent in older cells).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) decode_excluded: Option<DecodeExcluded>,
    pub(crate) output_tokens: i64,
    pub(crate) peak_rss_bytes: Option<u64>,
    pub(crate) peak_rss_scope: String,
    pub(crate) rss_sample_interval_ms: Option<u64>,
    pub(crate) peak_vram_bytes: Option<u64>,
    pub(crate) peak_vram_scope: String,
    pub(crate) planned_rounds: usize,
    pub(crate) attempted_rounds: usize,
    /// `None` only in a cell written before completeness was recorded.
    pub(crate) complete: Option<bool>,
    pub(crate) attempted_requests: usize,
    /// `None` only in a file that lacks it (a gate then says so).
    pub(crate) failed_requests: Option<u64>,
    pub(crate) failure_reasons: Vec<String>,
    /// The arm's worker's own numbers over the cell's rounds pooled (only when the arm's
    /// worker was scraped).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) worker: Option<super::worker::WorkerDoc>,
}

impl Cell {
    /// A level the arm completed (cells written before completeness was recorded count
    /// as complete).
    pub(crate) fn completed(&self) -> bool {
        self.complete != Some(false)
    }
}

/// A cell's streams left out of its decode estimators, by reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct DecodeExcluded {
    /// Left out of both (`decode_tokens_per_sec`, the per-request mean, and the pooled
    /// estimator): no first-token time, no token count, no decode time (total == ttft).
    pub(crate) no_first_token: u64,
    pub(crate) no_tokens: u64,
    pub(crate) no_decode_time: u64,
    /// `stream_bundled` streams: counted in the per-request mean (as ever), left out of
    /// the pooled estimator.
    pub(crate) bundled: u64,
    /// Streams the pooled estimator summed.
    pub(crate) pooled_streams: u64,
}

/// One arm's drift against the reference.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct DriftEntry {
    pub(crate) arm: String,
    #[serde(default)]
    pub(crate) lane: Option<Lane>,
    #[serde(default)]
    pub(crate) advisory: bool,
    #[serde(default)]
    pub(crate) reference_arm: String,
    /// The reference's exact-match rate against itself (`drift_floor`), and this arm's
    /// rate minus it (0: at the floor); absent without a floor (and in compare.json).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) floor_exact_match_rate: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) exact_match_rate_minus_floor: Option<f64>,
    /// The exact McNemar test on answers judged by an oracle on both sides (absent when
    /// no case has an oracle).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) mcnemar: Option<crate::stats::McNemar>,
    /// The arm's validity per oracle kind it was judged by, beside the reference's and
    /// paired with it (`report::validity`); absent when nothing was judged (and in
    /// compare.json).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) validity: Option<Vec<crate::report::validity::Validity>>,
    /// The pooled rates weigh every pair alike; these weigh each case, and each variant,
    /// as one (absent in older files).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) weights: Option<Weights>,
    #[serde(flatten)]
    pub(crate) drift: crate::drift::Drift,
}

/// Exact match and similarity per case and per variant, and their unweighted means.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct Weights {
    pub(crate) pooled: String,
    pub(crate) by_case: Vec<GroupRate>,
    pub(crate) by_variant: Vec<GroupRate>,
    /// Mean over cases of each case's rate (every case weighs one).
    pub(crate) case_mean_exact_match_rate: Option<f64>,
    pub(crate) case_mean_similarity: Option<f64>,
    /// Mean over variants of each variant's rate (every variant weighs one).
    pub(crate) variant_mean_exact_match_rate: Option<f64>,
    pub(crate) variant_mean_similarity: Option<f64>,
}

/// One case's (or variant's) pairs.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct GroupRate {
    pub(crate) case: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) variant: Option<String>,
    pub(crate) compared_prompts: u64,
    pub(crate) exact_match_rate: f64,
    pub(crate) mean_similarity: f64,
}

impl DriftEntry {
    /// Fill `weights` from the per-pair list (`prompts`); kept absent without pairs.
    pub(crate) fn with_weights(mut self) -> DriftEntry {
        let mut cases: BTreeMap<&str, (u64, u64, f64)> = BTreeMap::new();
        let mut variants: BTreeMap<(&str, Option<&str>), (u64, u64, f64)> = BTreeMap::new();
        for p in &self.drift.prompts {
            for t in [
                cases.entry(&p.case).or_default(),
                variants.entry((&p.case, p.variant.as_deref())).or_default(),
            ] {
                t.0 += 1;
                t.1 += u64::from(p.equal);
                t.2 += p.similarity;
            }
        }
        if cases.is_empty() {
            return self;
        }
        let rate = |case: &str, variant: Option<&str>, (n, eq, sim): (u64, u64, f64)| GroupRate {
            case: case.into(),
            variant: variant.map(str::to_string),
            compared_prompts: n,
            exact_match_rate: eq as f64 / n as f64,
            mean_similarity: sim / n as f64,
        };
        let by_case: Vec<GroupRate> = cases.iter().map(|(c, t)| rate(c, None, *t)).collect();
        let by_variant: Vec<GroupRate> =
            variants.iter().map(|((c, v), t)| rate(c, *v, *t)).collect();
        let mean = |v: &[GroupRate], f: fn(&GroupRate) -> f64| {
            (!v.is_empty()).then(|| v.iter().map(f).sum::<f64>() / v.len() as f64)
        };
        self.weights = Some(Weights {
            pooled: "exact_match_rate and mean_similarity (and every gate that reads them) pool pairs: a case with more variants, levels or repetitions weighs more".into(),
            case_mean_exact_match_rate: mean(&by_case, |g| g.exact_match_rate),
            case_mean_similarity: mean(&by_case, |g| g.mean_similarity),
            variant_mean_exact_match_rate: mean(&by_variant, |g| g.exact_match_rate),
            variant_mean_similarity: mean(&by_variant, |g| g.mean_similarity),
            by_case,
            by_variant,
        });
        self
    }
}

/// campaign.json's `drift_floor`: the reference's answers against its own repeats (every
/// pair of repetitions at one level, answer by answer), with the statistics of an arm's
/// drift. What a quality arm that answers exactly like the reference still shows.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct DriftFloor {
    pub(crate) reference_arm: String,
    /// Why there is no floor (`null` when there is one).
    #[serde(default)]
    pub(crate) reason: Option<String>,
    #[serde(flatten)]
    pub(crate) drift: crate::drift::Drift,
}

/// campaign.json's `intervals`: how they were resampled, and one entry per arm, level and
/// value.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct Intervals {
    pub(crate) paired: bool,
    pub(crate) pairing: String,
    pub(crate) resamples: usize,
    pub(crate) seed: u64,
    pub(crate) min_rounds: usize,
    pub(crate) confidence: f64,
    pub(crate) entries: Vec<RatioInterval>,
}

/// An arm's value over the reference's at one level, and its interval.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct RatioInterval {
    pub(crate) arm: String,
    pub(crate) concurrency: u64,
    /// The cell's key of the value (`latency_p95_ms`, `decode_pooled_tokens_per_sec`, ...).
    pub(crate) metric: String,
    /// The arm's value / the reference's, every round pooled.
    pub(crate) ratio: f64,
    /// `null` with the reason when there is none (fewer than `min_rounds` rounds a side).
    pub(crate) interval: Option<crate::stats::Interval>,
    pub(crate) reason: Option<String>,
    pub(crate) rounds_arm: usize,
    pub(crate) rounds_reference: usize,
}

impl CampaignDoc {
    /// Each arm with how its worker answered `--worker-metrics` scrapes (`health`: every
    /// scraped worker, by arm).
    pub(crate) fn with_scrapes(mut self, health: Option<&[super::worker::ScrapeHealth]>) -> Self {
        for a in &mut self.arms {
            a.worker_metrics_scrapes = health
                .unwrap_or_default()
                .iter()
                .find(|h| h.arm.as_deref() == Some(a.name.as_str()))
                .cloned();
        }
        self
    }
}

impl Intervals {
    /// The entry for `arm`'s `metric` at level `c`.
    pub(crate) fn find(&self, arm: &str, c: u64, metric: &str) -> Option<&RatioInterval> {
        self.entries
            .iter()
            .find(|e| e.arm == arm && e.concurrency == c && e.metric == metric)
    }
}

/// What campaign.json's keys mean.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct CampaignDefinitions {
    pub(crate) cell: String,
    pub(crate) latency_ms: String,
    pub(crate) ttft_ms: String,
    pub(crate) decode_tokens_per_sec: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) decode_pooled_tokens_per_sec: String,
    pub(crate) prefill_tokens_per_sec: String,
    pub(crate) aggregate_decode_tokens_per_sec: String,
    pub(crate) peak_vram_bytes: String,
    pub(crate) complete: String,
    pub(crate) performance_fit: String,
    /// Only once drift has been computed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) drift: Option<crate::drift::Definitions>,
}

impl CampaignDoc {
    /// The arm named `name`.
    pub(crate) fn arm(&self, name: &str) -> Option<&ArmDoc> {
        self.arms.iter().find(|a| a.name == name)
    }

    /// The drift entries (none when drift was not computed).
    pub(crate) fn drift_entries(&self) -> &[DriftEntry] {
        self.drift
            .as_ref()
            .and_then(Option::as_ref)
            .map_or(&[], Vec::as_slice)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_campaign_json_from_before_completeness_and_drift_reads_with_every_level_complete() {
        // The golden campaign.json as written before cells recorded completeness and
        // before drift existed.
        let mut v: serde_json::Value = serde_json::from_str(include_str!(
            "../../../tests/golden/campaign-demo/campaign.json"
        ))
        .expect("the golden campaign.json");
        let m = v.as_object_mut().expect("an object");
        m.shift_remove("drift");
        if let Some(serde_json::Value::Object(d)) = m.get_mut("definitions") {
            d.shift_remove("complete");
            d.shift_remove("drift");
        }
        for arm in m
            .get_mut("arms")
            .and_then(serde_json::Value::as_array_mut)
            .expect("arms")
        {
            for cell in arm
                .pointer_mut("/concurrency")
                .and_then(serde_json::Value::as_object_mut)
                .expect("cells")
                .values_mut()
            {
                cell.as_object_mut()
                    .expect("a cell")
                    .shift_remove("complete");
            }
        }
        let doc: CampaignDoc = serde_json::from_value(v).expect("an older campaign.json reads");
        assert_eq!(doc.arms.len(), 3);
        assert!(doc.drift.is_none());
        assert!(
            doc.arms
                .iter()
                .flat_map(|a| a.concurrency.values())
                .all(|c| c.complete.is_none() && c.completed()),
        );
    }
}
