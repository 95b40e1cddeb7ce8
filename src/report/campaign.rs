//! `campaign.json`: per arm its recipe, lane, availability, load, and per concurrency one
//! cell pooling the arm's measured exchanges of every case at that level — shaped after
//! the recipe benchmark's report, with its arithmetic (nearest rank, mean per-request
//! decode rate, aggregate decode rate over the rounds' wall time).

use std::collections::{BTreeMap, BTreeSet};

use super::doc::campaign::{
    ArmDoc, ArmLoad, CAMPAIGN_SCHEMA_VERSION, CampaignDefinitions, CampaignDoc, Cell,
    DecodeExcluded, RecipeDoc,
};
use crate::config::campaign::{Arm, Campaign};
use crate::metrics::{self, Percentiles, Sample};
use crate::model::Outcome;

/// One concurrency level of one arm: its measured samples (every case), the summed wall
/// time of its rounds, and the peak resident memory of its server while they ran.
#[derive(Debug, Default, Clone)]
pub(crate) struct Level {
    pub(crate) samples: Vec<Sample>,
    pub(crate) elapsed_seconds: f64,
    pub(crate) peak_rss_bytes: Option<u64>,
    pub(crate) peak_vram_bytes: Option<u64>,
    /// What `peak_vram_bytes` measured, or why it is null.
    pub(crate) vram_scope: Option<String>,
    /// Measured rounds the plan has at this level (cases x repetitions), and how many of
    /// them ran and attempted their whole budget.
    pub(crate) planned_rounds: usize,
    pub(crate) attempted_rounds: usize,
}

/// What one arm measured.
pub(crate) struct ArmMeasures {
    pub(crate) arm: Arm,
    pub(crate) unavailable_reason: Option<String>,
    pub(crate) artifact_bytes: Option<u64>,
    pub(crate) load_ms: Option<f64>,
    /// What the arm's memory samples covered (`None`: not sampled).
    pub(crate) rss_scope: Option<&'static str>,
    /// The URL its requests went to (its `{port}` resolved); `None` if never brought up.
    pub(crate) endpoint: Option<String>,
    pub(crate) levels: BTreeMap<usize, Level>,
}

fn ms(us: Option<i64>) -> Option<f64> {
    us.map(|v| v as f64 / 1e3)
}

/// One cell: the arm's measured exchanges at one concurrency, every case pooled.
pub(crate) fn cell(level: &Level, rss_scope: Option<&str>) -> Cell {
    let ok: Vec<&Sample> = level
        .samples
        .iter()
        .filter(|s| s.outcome == Outcome::Ok)
        .collect();
    let latency = Percentiles::of(ok.iter().filter_map(|s| s.total_us).collect());
    // The per-request rates and TTFT, as a round computes them (no aggregate here: a
    // cell's wall time is the sum of its rounds', below).
    let st = metrics::stream_metrics(&ok, 0.0);
    let ttft = st.as_ref().map(|s| s.ttft_us).unwrap_or_default();
    let decode = st.as_ref().and_then(|s| s.output_tokens_per_second_mean);
    let prefill = st.as_ref().and_then(|s| s.prefill_tokens_per_second_mean);
    let tokens = metrics::answer_tokens(&ok);
    let d = metrics::decode(&ok);
    let failed: Vec<&Sample> = level
        .samples
        .iter()
        .filter(|s| s.outcome != Outcome::Ok)
        .collect();
    let reasons: BTreeSet<&str> = failed.iter().filter_map(|s| s.failure.as_deref()).collect();
    Cell {
        ttft_p50_ms: ms(ttft.p50),
        ttft_p95_ms: ms(ttft.p95),
        latency_p50_ms: ms(latency.p50),
        latency_p95_ms: ms(latency.p95),
        prefill_tokens_per_sec: prefill,
        decode_tokens_per_sec: decode,
        decode_pooled_tokens_per_sec: d.pooled_tokens_per_second,
        decode_excluded: st.is_some().then_some(DecodeExcluded {
            no_first_token: d.no_first_token,
            no_tokens: d.no_tokens,
            no_decode_time: d.no_decode_time,
            bundled: d.bundled,
            pooled_streams: d.pooled_streams,
        }),
        aggregate_decode_tokens_per_sec: (level.elapsed_seconds > 0.0)
            .then(|| tokens as f64 / level.elapsed_seconds),
        output_tokens: tokens,
        peak_rss_bytes: level.peak_rss_bytes,
        peak_rss_scope: rss_scope
            .unwrap_or(
                "not sampled: the tool did not start this arm's server (no start command) and the plan names no resources.pid, so it does not know its processes",
            )
            .into(),
        rss_sample_interval_ms: rss_scope.map(|_| 100),
        peak_vram_bytes: level.peak_vram_bytes,
        peak_vram_scope: level
            .vram_scope
            .as_deref()
            .unwrap_or(
                "not sampled: the tool did not start this arm's server (no start command), so it does not know its processes",
            )
            .into(),
        planned_rounds: level.planned_rounds,
        attempted_rounds: level.attempted_rounds,
        complete: Some(level.planned_rounds > 0 && level.attempted_rounds == level.planned_rounds),
        attempted_requests: level.samples.len(),
        failed_requests: Some(failed.len() as u64),
        failure_reasons: reasons.into_iter().map(str::to_string).collect(),
        worker: None,
    }
}

/// campaign.json for `campaign` and what its arms measured (drift is added once the
/// answers have been read back). `plan_id` is the plan's `name` (a campaign plan has one).
pub(crate) fn campaign_doc(
    plan_id: Option<&str>,
    campaign: &Campaign,
    arms: &[ArmMeasures],
) -> CampaignDoc {
    let arms = arms
        .iter()
        .map(|a| {
            let r = &a.arm.recipe;
            ArmDoc {
                name: a.arm.name.clone(),
                recipe: Some(RecipeDoc {
                    runtime: r.runtime.clone(),
                    weight_format: r.weight_format.clone(),
                    weight_quantization: r.weight_quantization.clone(),
                    device: r.device.clone(),
                }),
                lane: a.arm.lane,
                reference: a.arm.reference,
                available: a.unavailable_reason.is_none(),
                unavailable_reason: a.unavailable_reason.clone(),
                endpoint: a.endpoint.clone(),
                load: Some(ArmLoad {
                    artifact_bytes: a.artifact_bytes,
                    load_ms: a.load_ms,
                }),
                metadata: a.arm.metadata.clone(),
                concurrency: a
                    .levels
                    .iter()
                    .map(|(c, level)| (*c as u64, cell(level, a.rss_scope)))
                    .collect(),
                worker_metrics_scrapes: None,
            }
        })
        .collect();
    CampaignDoc {
        schema_version: CAMPAIGN_SCHEMA_VERSION,
        plan_id: plan_id.map(str::to_string),
        evidence_class: Some(campaign.evidence_class.as_str().into()),
        schedule: campaign.schedule.as_str().into(),
        reference_arm: Some(campaign.reference().name.clone()),
        arms,
        definitions: Some(CampaignDefinitions {
            cell: "per arm and concurrency level, every case's measured exchanges pooled".into(),
            latency_ms: "nearest rank of total latency over the cell's ok exchanges".into(),
            ttft_ms: "nearest rank of time to first token over the cell's ok event streams".into(),
            decode_tokens_per_sec: "mean over ok streams of output_tokens / (total - ttft): per request, so streaming only (it needs a first-token time); streams without a first token, a token count or a decode time are left out and counted in decode_excluded".into(),
            decode_pooled_tokens_per_sec: "output tokens / decode time (total - ttft), both summed over the cell's ok streams, leaving out those decode_excluded counts (no first token, no token count, no decode time, and bundled streams: stream_bundled): no one short stream outweighs the tokens it carried; v2 decode gates read it".into(),
            prefill_tokens_per_sec: "mean over ok streams of prompt_tokens / ttft".into(),
            aggregate_decode_tokens_per_sec: "output tokens of every ok answer (a stream's count, else the JSON answer's usage.completion_tokens) / the summed wall time of the cell's rounds".into(),
            peak_vram_bytes: "GPU memory of the arm's process group as nvidia-smi lists it (per process, every 1 s); device-level memory only under the sequential schedule; else null, with the reason in peak_vram_scope".into(),
            complete: "every measured round the plan has at this level (cases x repetitions) ran and attempted its whole budget; the contract's ratio gates compare only levels both arms completed".into(),
            performance_fit: "a performance-fit arm's answers are never correctness failures: answering differently is what is measured".into(),
            drift: None,
        }),
        drift: None,
        drift_floor: None,
        intervals: None,
        drift_unavailable_reason: None,
        operating_points: Vec::new(),
    }
}

/// campaign.json's operating points: each search of a campaign's arms, as found.
pub(crate) fn operating_points(
    doc: &crate::search::doc::SearchDoc,
) -> Vec<super::doc::campaign::OperatingPoint> {
    doc.searches
        .iter()
        .filter_map(|s| {
            Some(super::doc::campaign::OperatingPoint {
                arm: s.arm.clone()?,
                case: s.case.clone(),
                kind: doc.kind,
                last_pass: s.last_pass,
                first_fail: s.first_fail,
                stopped: s.stopped.as_str().to_string(),
                confirmed: s.answer.as_ref().is_some_and(|a| a.confirmed),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::StreamSample;
    use serde_json::{Value, json};

    /// [`super::cell`] as campaign.json holds it.
    fn cell(level: &Level, rss_scope: Option<&str>) -> Value {
        serde_json::to_value(super::cell(level, rss_scope)).expect("a cell serializes")
    }

    fn ok(total_ms: i64) -> Sample {
        Sample {
            outcome: Outcome::Ok,
            total_us: Some(total_ms * 1000),
            ..Sample::default()
        }
    }

    fn stream(ttft_ms: i64, total_ms: i64, tokens: i64) -> Sample {
        Sample {
            stream: Some(StreamSample {
                ttft_us: Some(ttft_ms * 1000),
                output_tokens: Some(tokens),
                prompt_tokens: Some(10),
                ..StreamSample::default()
            }),
            ..ok(total_ms)
        }
    }

    #[test]
    fn the_recipe_benchmarks_arithmetic_holds_in_a_cell() {
        // Latencies 200 and 400 ms: p50 200, p95 400.
        let level = Level {
            samples: vec![ok(200), ok(400)],
            elapsed_seconds: 0.6,
            ..Level::default()
        };
        let c = cell(&level, None);
        assert_eq!(
            (c["latency_p50_ms"].clone(), c["latency_p95_ms"].clone()),
            (json!(200.0), json!(400.0))
        );
        // 10 tokens in 0.1 s and 10 in 0.2 s of decode: 75.0 per request; 20 tokens over a
        // 1 s wall: 20.0 aggregate.
        let level = Level {
            samples: vec![stream(0, 100, 10), stream(0, 200, 10)],
            elapsed_seconds: 1.0,
            peak_rss_bytes: Some(7),
            ..Level::default()
        };
        let c = cell(&level, Some("s"));
        assert_eq!(c["decode_tokens_per_sec"], json!(75.0));
        assert_eq!(c["aggregate_decode_tokens_per_sec"], json!(20.0));
        assert_eq!(c["peak_rss_bytes"], json!(7));
        // Four requests of identical speed (10 tokens in 0.1 s each), serial over a 400 ms
        // wall vs overlapped in 100 ms: the same 100.0 per request, 100.0 vs 400.0 aggregate.
        let four = || (0..4).map(|_| stream(0, 100, 10)).collect::<Vec<_>>();
        let serial = cell(
            &Level {
                samples: four(),
                elapsed_seconds: 0.4,
                ..Level::default()
            },
            None,
        );
        let overlapped = cell(
            &Level {
                samples: four(),
                elapsed_seconds: 0.1,
                ..Level::default()
            },
            None,
        );
        assert_eq!(serial["decode_tokens_per_sec"], json!(100.0));
        assert_eq!(overlapped["decode_tokens_per_sec"], json!(100.0));
        assert_eq!(serial["aggregate_decode_tokens_per_sec"], json!(100.0));
        assert_eq!(overlapped["aggregate_decode_tokens_per_sec"], json!(400.0));
        // A JSON answer's usage counts toward the aggregate, never toward per-request decode.
        let level = Level {
            samples: vec![Sample {
                usage_tokens: Some((Some(3), 30)),
                ..ok(100)
            }],
            elapsed_seconds: 1.0,
            ..Level::default()
        };
        let c = cell(&level, None);
        assert_eq!(c["aggregate_decode_tokens_per_sec"], json!(30.0));
        assert_eq!(c["decode_tokens_per_sec"], Value::Null);
        // Failures are counted with their distinct reasons.
        let level = Level {
            samples: vec![
                ok(1),
                Sample {
                    outcome: Outcome::Http,
                    failure: Some("status 500, expected 200".into()),
                    ..ok(1)
                },
                Sample {
                    outcome: Outcome::Http,
                    failure: Some("status 500, expected 200".into()),
                    ..ok(1)
                },
            ],
            elapsed_seconds: 1.0,
            ..Level::default()
        };
        let c = cell(&level, None);
        assert_eq!(
            (
                c["attempted_requests"].clone(),
                c["failed_requests"].clone(),
                c["failure_reasons"].clone()
            ),
            (json!(3), json!(2), json!(["status 500, expected 200"]))
        );
    }
}
