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
    /// Why there is no drift (only under `--no-record`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) drift_unavailable_reason: Option<String>,
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
    pub(crate) aggregate_decode_tokens_per_sec: Option<f64>,
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
}

impl Cell {
    /// A level the arm completed (cells written before completeness was recorded count
    /// as complete).
    pub(crate) fn completed(&self) -> bool {
        self.complete != Some(false)
    }
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
    #[serde(flatten)]
    pub(crate) drift: crate::drift::Drift,
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

/// What campaign.json's keys mean.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct CampaignDefinitions {
    pub(crate) cell: String,
    pub(crate) latency_ms: String,
    pub(crate) ttft_ms: String,
    pub(crate) decode_tokens_per_sec: String,
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
