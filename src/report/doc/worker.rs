//! The worker's own numbers over a window (`worker` in summary.json's rounds, in serve's
//! summary, and in campaign.json's cells), built by `report::worker`.

use serde::{Deserialize, Serialize};

/// What the worker's `/metrics` said over one window.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct WorkerDoc {
    /// Whose names were read (`vllm`, `sglang`, `tgi`; docs/metrics.md has the table).
    pub(crate) server: String,
    /// The scrapes that open and close the window, seconds from the run's t0.
    pub(crate) window_start_seconds: f64,
    pub(crate) window_end_seconds: f64,
    /// Scrapes at or between the two (the gauges' means are over these).
    pub(crate) scrapes_in_window: u64,
    pub(crate) ttft_seconds: Option<Quantiles>,
    pub(crate) itl_seconds: Option<Quantiles>,
    pub(crate) e2e_seconds: Option<Quantiles>,
    /// Counter deltas over the window, summed over label sets.
    pub(crate) requests: Option<f64>,
    pub(crate) preemptions: Option<f64>,
    pub(crate) prompt_tokens: Option<f64>,
    pub(crate) generation_tokens: Option<f64>,
    /// Gauge means over the window's scrapes (running and waiting summed over label
    /// sets, KV-cache use averaged over them).
    pub(crate) running_mean: Option<f64>,
    pub(crate) waiting_mean: Option<f64>,
    pub(crate) kv_cache_usage_mean: Option<f64>,
    /// Prefix-cache hits / queries over the window (or the mean of a hit-rate gauge).
    pub(crate) prefix_cache_hit_rate: Option<f64>,
    /// Ours minus the worker's (replay rounds and serve).
    pub(crate) two_sided: Option<TwoSided>,
}

/// p50 and p95 of a histogram's delta over the window, interpolated inside a bucket.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Quantiles {
    /// The histogram read.
    pub(crate) metric: String,
    /// Observations in the window (the `+Inf` bucket's delta).
    pub(crate) observations: f64,
    pub(crate) p50: Option<f64>,
    /// The bucket the p50 fell in, `[lower, upper]` seconds (`upper` null: `+Inf`).
    pub(crate) p50_bucket: Option<(f64, Option<f64>)>,
    pub(crate) p95: Option<f64>,
    pub(crate) p95_bucket: Option<(f64, Option<f64>)>,
    /// Always `bucket-interpolated`.
    pub(crate) estimate: String,
}

/// Two-sided timing: ours minus the worker's.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct TwoSided {
    pub(crate) ttft: Option<WorkerTiming>,
    pub(crate) e2e: Option<WorkerTiming>,
    /// "difference of p50s, not per request", and how.
    pub(crate) scope: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct WorkerTiming {
    pub(crate) ours_p50_seconds: f64,
    pub(crate) worker_p50_seconds: f64,
    pub(crate) difference_seconds: f64,
    /// The width of the worker's p50 bucket (`null` when it fell in `+Inf`).
    pub(crate) bucket_width_seconds: Option<f64>,
}

/// How one scraped worker answered (summary.json `worker_metrics_scrapes`, one entry per
/// scraped worker; campaign.json's arm `worker_metrics_scrapes`): scrapes taken, failed
/// and the first failure, and why scraping stopped early when it did.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct ScrapeHealth {
    /// The campaign arm whose worker it is (null outside campaigns).
    pub(crate) arm: Option<String>,
    /// The metrics URL.
    pub(crate) url: String,
    pub(crate) scrapes: u64,
    pub(crate) failed: u64,
    pub(crate) first_failure: Option<String>,
    /// Set when scraping gave up on a worker that serves no metrics there (3 scrapes in a
    /// row answered 404 or 410); null otherwise.
    pub(crate) stopped: Option<String>,
}

/// What the worker's scrapes could not keep (summary.json `worker_metrics_limits`, only
/// when a bound was reached): the rows held for the worker's numbers are capped per
/// scraped worker (docs/output.md), and at most a few scrapes wait for the file's writer.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct WorkerLimits {
    /// The first cap reached, in words; null when only the writer fell behind.
    pub(crate) cap_reached: Option<String>,
    /// Samples the worker's numbers would read that were not held (still written to
    /// worker_metrics.parquet): the numbers are over the rest.
    pub(crate) samples_not_held: u64,
    /// Samples not written to worker_metrics.parquet either (its writer fell behind).
    pub(crate) samples_not_written: u64,
}
