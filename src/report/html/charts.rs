//! The report's charts as data: each a JSON object (`id`, `kind`, `title`, `scope`, axis
//! labels, `series`) that `report.js` draws and `tests/interop/check_report.py`
//! recomputes from `exchanges/` with DuckDB. Kinds:
//! - `cdf`: per series `points` = `[[pct, value_us], …]`, the nearest rank at every whole
//!   percent 0..=100 of the series' rows;
//! - `rounds`: per series `points` = `[[level, repetition, value], …]`, one per measured
//!   round (the spread of rounds at a level stays visible), from summary.json;
//! - `timeline`: per run, counts per time bin (`bin_us`, from `first_bin`) of sends, of
//!   intended sends (open loops and traces: the schedule, a trace's own arrivals), ok
//!   completions and failures by kind, with the measured rounds as spans;
//! - `series`: per run, the worker's and the GPU's lines on the same clock, per series
//!   `points` = `[[offset_us, value], …]` (one per scrape or sample, from
//!   worker_metrics.parquet and gpu.parquet), with the measured rounds as spans.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{Map, Value, json};

use super::input::{RunInput, esc};
use crate::drift::LevelDrift;
use crate::metrics::nearest_rank;
use crate::model::{Level, Outcome};
use crate::record::read::RowFacts;
use crate::report::doc::summary::Round;

/// One chart: its data, which is also what is drawn.
#[derive(Serialize)]
pub(crate) struct Chart {
    id: String,
    kind: &'static str,
    title: String,
    scope: &'static str,
    x_label: &'static str,
    y_label: &'static str,
    /// Each series as report.js draws it (its shape is the chart kind's).
    series: Vec<Value>,
    /// The kind's own keys (`x_scale`, `case`, `y_scale`, `level`, a timeline's bins).
    #[serde(flatten)]
    extra: Map<String, Value>,
}

impl Chart {
    pub(super) fn new(
        id: String,
        kind: &'static str,
        title: String,
        scope: &'static str,
        axes: (&'static str, &'static str),
    ) -> Chart {
        Chart {
            id,
            kind,
            title,
            scope,
            x_label: axes.0,
            y_label: axes.1,
            series: Vec::new(),
            extra: Map::new(),
        }
    }

    pub(super) fn set(&mut self, key: &str, v: Value) {
        self.extra.insert(key.into(), v);
    }

    pub(super) fn push(&mut self, series: Value) {
        self.series.push(series);
    }

    fn is_empty(&self) -> bool {
        self.series.is_empty()
    }

    /// The chart's `<figure>`: title, scope, the empty drawing area and its JSON block.
    pub(crate) fn html(&self) -> String {
        let id = &self.id;
        // `<` never appears raw inside the script element, so no `</script>` can end it.
        let json = serde_json::to_string(self)
            .unwrap_or_default()
            .replace('<', "\\u003c");
        format!(
            "<figure class=\"chart\" id=\"{id}\" data-kind=\"{}\">\n<figcaption><b>{}</b><br><span class=\"scope\">{}</span></figcaption>\n<div class=\"plot\"></div>\n<script type=\"application/json\" class=\"chart-data\" data-for=\"{id}\">{json}</script>\n</figure>\n",
            esc(self.kind),
            esc(&self.title),
            esc(self.scope),
        )
    }
}

/// A level as a series' `concurrency` and `rate_per_second` fields (one is null).
fn level_fields(level: Level) -> (Value, Value) {
    match level {
        Level::Concurrency(c) => (json!(c), Value::Null),
        Level::Rate(r) => (Value::Null, json!(r)),
    }
}

/// The nearest rank at every whole percent, 0 (the minimum) to 100 (the maximum).
pub(crate) fn cdf_points(mut v: Vec<i64>) -> Vec<[i64; 2]> {
    v.sort_unstable();
    (0..=100u32)
        .filter_map(|p| Some([i64::from(p), nearest_rank(&v, p)?]))
        .collect()
}

/// Every chart of `runs`, in reading order.
pub(super) fn all(runs: &[RunInput]) -> Vec<Chart> {
    let mut charts = Vec::new();
    charts.extend(latency_cdfs(runs));
    for kind in ["concurrency", "rate"] {
        charts.extend(round_charts(runs, kind));
    }
    charts.extend(drift_charts(runs));
    charts.extend(serve_charts(runs));
    for (i, r) in runs.iter().enumerate() {
        charts.extend(timeline(r, i));
        // The worker's side and the GPU's, under the run's timeline.
        charts.extend(worker_charts(r, i));
    }
    charts.retain(|c| !c.is_empty());
    charts
}

fn slug(s: &str) -> String {
    let s: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    s.trim_matches('-').to_string()
}

/// Measured rows of replay runs by case, then (run, arm, level): first appearance order
/// for cases and runs, levels ascending.
type Groups<'a> = Vec<(
    String,
    Vec<((usize, Option<String>, Level), Vec<&'a RowFacts>)>,
)>;

fn measured_groups(runs: &[RunInput]) -> Groups<'_> {
    let mut out: Groups<'_> = Vec::new();
    for (i, r) in runs.iter().enumerate().filter(|(_, r)| !r.is_serve()) {
        for f in r.facts.iter().filter(|f| f.phase == "measured") {
            let (Some(case), Some(level)) = (f.case_name.clone(), f.level()) else {
                continue;
            };
            let pos = match out.iter().position(|(c, _)| *c == case) {
                Some(p) => p,
                None => {
                    out.push((case, Vec::new()));
                    out.len() - 1
                }
            };
            let key = (i, f.arm.clone(), level);
            let groups = &mut out[pos].1;
            match groups.iter_mut().find(|(k, _)| *k == key) {
                Some((_, rows)) => rows.push(f),
                None => groups.push((key, vec![f])),
            }
        }
    }
    for (_, groups) in &mut out {
        groups.sort_by(|a, b| {
            (a.0.0, &a.0.1).cmp(&(b.0.0, &b.0.1)).then(
                a.0.2
                    .partial_cmp(&b.0.2)
                    .unwrap_or(std::cmp::Ordering::Equal),
            )
        });
    }
    out
}

const CDF_SCOPE: &str = "measured exchanges of every round at the level pooled; latency = start to last body byte (total_us), from the intended send time in an open loop (send_lag_us + total_us); ok and failed apart (failed: those with a measured duration); nearest rank at each whole percent";

fn latency_cdfs(runs: &[RunInput]) -> Vec<Chart> {
    let mut charts = Vec::new();
    for (n, (case, groups)) in measured_groups(runs).into_iter().enumerate() {
        let mut c = Chart::new(
            format!("latency-cdf-{n}-{}", slug(&case)),
            "cdf",
            format!("Latency CDF: case {case}"),
            CDF_SCOPE,
            ("latency (ms)", "share of requests (%)"),
        );
        c.set("x_scale", json!(0.001));
        c.set("case", json!(case));
        for ((run, arm, level), rows) in groups {
            for ok in [true, false] {
                let v: Vec<i64> = rows
                    .iter()
                    .filter(|f| (f.sample.outcome == Outcome::Ok) == ok)
                    .filter_map(|f| f.sample.latency_from_schedule_us())
                    .collect();
                if v.is_empty() {
                    continue;
                }
                let (conc, rate) = level_fields(level);
                let outcome = if ok { "ok" } else { "failed" };
                let name = series_name(
                    &runs[run].label,
                    runs.len(),
                    arm.as_deref(),
                    &level.named(),
                    outcome,
                );
                c.push(json!({"name": name, "run": runs[run].label, "arm": arm, "case": case,
                    "concurrency": conc, "rate_per_second": rate, "outcome": outcome,
                    "latency_from": if matches!(level, Level::Rate(_)) { "intended_send_time" } else { "actual_send" },
                    "n": v.len(), "points": cdf_points(v)}));
            }
        }
        charts.push(c);
    }
    charts
}

fn series_name(run: &str, runs: usize, arm: Option<&str>, rest: &str, what: &str) -> String {
    let mut parts = Vec::new();
    if runs > 1 {
        parts.push(run.to_string());
    }
    if let Some(a) = arm {
        parts.push(a.to_string());
    }
    if !rest.is_empty() {
        parts.push(rest.to_string());
    }
    parts.push(what.to_string());
    parts.join(" · ")
}

/// A round's value of one metric (`None`: the round has none).
type Pick = fn(&Round) -> Option<f64>;

/// What a per-round chart draws: (chart key, title, y label, y scale, metrics as
/// (series label, the value in a round of summary.json)).
type RoundMetric = (
    &'static str,
    &'static str,
    &'static str,
    f64,
    &'static [(&'static str, Pick)],
);

const ROUND_METRICS: [RoundMetric; 4] = [
    (
        "throughput",
        "Throughput and goodput",
        "requests/s",
        1.0,
        &[
            ("throughput", |r| r.successful_requests_per_second),
            ("goodput", |r| {
                r.goodput.as_ref().and_then(|g| g.good_requests_per_second)
            }),
        ],
    ),
    (
        "ttft-itl",
        "TTFT and ITL p50 (streams)",
        "ms",
        1000.0,
        &[
            ("TTFT p50", |r| {
                r.stream.as_ref().and_then(|s| s.ttft_seconds.p50)
            }),
            ("ITL p50", |r| {
                r.stream.as_ref().and_then(|s| s.itl_seconds.p50)
            }),
        ],
    ),
    (
        "two-sided",
        "Two-sided timing: our p50 and the worker's (its histograms, bucket-interpolated; a difference of p50s, not per request)",
        "ms",
        1000.0,
        &[
            ("TTFT p50 (ours)", |r| {
                r.worker.as_ref()?;
                r.stream.as_ref().and_then(|s| s.ttft_seconds.p50)
            }),
            ("TTFT p50 (worker)", |r| {
                r.worker.as_ref()?.ttft_seconds.as_ref()?.p50
            }),
            ("e2e p50 (ours)", |r| {
                r.worker.as_ref()?;
                r.service_latency_seconds.p50
            }),
            ("e2e p50 (worker)", |r| {
                r.worker.as_ref()?.e2e_seconds.as_ref()?.p50
            }),
        ],
    ),
    (
        "tokens",
        "Output tokens per second (streams)",
        "tokens/s",
        1.0,
        &[("output tok/s", |r| {
            r.stream
                .as_ref()
                .and_then(|s| s.output_tokens_per_second.aggregate)
        })],
    ),
];

const ROUNDS_SCOPE: &str = "one point per measured round (summary.json): throughput = successful / round wall time (first send to last completion); goodput = ok and within every slo bound / the same time (only with a plan slo); TTFT and ITL = nearest-rank p50 over the round's ok streams (ITL pools every gap); tok/s = all output tokens / round wall time; two-sided timing = our nearest-rank p50 (TTFT over the round's ok streams; e2e = service latency) beside the worker's p50 from its histogram's delta over the round, interpolated inside a bucket (summary.json rounds[].worker, with the bucket), a difference of p50s, not per request; the line joins each level's median round";

/// A per-round series: (arm, case, metric label).
type SeriesKey<'a> = (Option<String>, String, &'a str);

fn round_charts(runs: &[RunInput], kind: &str) -> Vec<Chart> {
    let level_key = if kind == "concurrency" {
        "concurrency"
    } else {
        "rate_per_second"
    };
    let x_label = if kind == "concurrency" {
        "concurrency"
    } else {
        "target rate (requests/s)"
    };
    let mut charts = Vec::new();
    for (key, title, y_label, y_scale, metrics) in ROUND_METRICS {
        let mut c = Chart::new(
            format!("{key}-vs-{kind}"),
            "rounds",
            format!("{title} vs {x_label}"),
            ROUNDS_SCOPE,
            (x_label, y_label),
        );
        c.set("y_scale", json!(y_scale));
        c.set("level", json!(level_key));
        for r in runs {
            let Some(summary) = r.replay_summary() else {
                continue;
            };
            // Series per (arm, case, metric), in first-appearance order.
            let mut series: Vec<(SeriesKey<'_>, Vec<Value>)> = Vec::new();
            for round in &summary.rounds {
                let x = match kind {
                    "concurrency" => round.concurrency.map(|c| c as f64),
                    _ => round.rate_per_second,
                };
                let Some(x) = x else {
                    continue;
                };
                let arm = round.arm.clone();
                let case = round.case.clone();
                for (label, pick) in metrics {
                    let Some(y) = pick(round) else {
                        continue;
                    };
                    let k = (arm.clone(), case.clone(), *label);
                    let p = json!([x, round.repetition, y]);
                    match series.iter_mut().find(|(sk, _)| *sk == k) {
                        Some((_, pts)) => pts.push(p),
                        None => series.push((k, vec![p])),
                    }
                }
            }
            for ((arm, case, label), points) in series {
                let name = series_name(&r.label, runs.len(), arm.as_deref(), &case, label);
                c.push(
                    json!({"name": name, "run": r.label, "arm": arm, "case": case,
                    "metric": label, "points": points}),
                );
            }
        }
        charts.push(c);
    }
    charts
}

/// A drift level's value of one metric.
type DriftPick = fn(&LevelDrift) -> Option<f64>;

fn drift_charts(runs: &[RunInput]) -> Vec<Chart> {
    let mut charts = Vec::new();
    for (i, r) in runs.iter().enumerate() {
        let Some(k) = &r.campaign else { continue };
        let mut c = Chart::new(
            format!("drift-{i}"),
            "rounds",
            format!(
                "Drift against the reference arm {}",
                k.reference_arm.as_deref().unwrap_or("?")
            ),
            "campaign.json drift per arm and concurrency: exact match rate and mean similarity (Levenshtein, Unicode scalar values) of each arm's answers to the reference's for the same prompts",
            ("concurrency", "share (0..1)"),
        );
        c.set("y_scale", json!(1.0));
        c.set("level", json!("concurrency"));
        for d in k.drift_entries() {
            let arm = d.arm.as_str();
            let metrics: [(&str, DriftPick); 2] = [
                ("exact_match_rate", |l| l.exact_match_rate),
                ("mean_similarity", |l| l.mean_similarity),
            ];
            for (metric, pick) in metrics {
                let points: Vec<Value> = d
                    .drift
                    .concurrency
                    .iter()
                    .filter_map(|(lvl, cell)| {
                        Some(json!([lvl.parse::<f64>().ok()?, Value::Null, pick(cell)?]))
                    })
                    .collect();
                if !points.is_empty() {
                    c.push(
                        json!({"name": series_name(&r.label, runs.len(), Some(arm), "", metric),
                        "run": r.label, "arm": arm, "metric": metric, "points": points}),
                    );
                }
            }
        }
        charts.push(c);
    }
    charts
}

fn serve_charts(runs: &[RunInput]) -> Vec<Chart> {
    let mut by_route = Chart::new(
        "serve-latency-by-route".into(),
        "cdf",
        "serve: latency CDF by route (ok exchanges)".into(),
        "live exchanges that reached the client whole, per route (method and path, no query; the first 8 routes by count, the rest as other); latency = client request head parsed to the last upstream body byte (total_us)",
        ("latency (ms)", "share of requests (%)"),
    );
    by_route.set("x_scale", json!(0.001));
    let mut overhead = Chart::new(
        "serve-overhead".into(),
        "cdf",
        "serve: the proxy's own time after the worker's last byte".into(),
        "per live exchange with both stamps: downstream_done_us − total_us, from the last upstream body byte to the client's side of the response ending (writing to the client and recording hand-off)",
        ("overhead (ms)", "share of requests (%)"),
    );
    overhead.set("x_scale", json!(0.001));
    for r in runs.iter().filter(|r| r.is_serve()) {
        let live: Vec<&RowFacts> = r.facts.iter().filter(|f| f.phase == "live").collect();
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        for f in &live {
            *counts.entry(route_of(f)).or_default() += 1;
        }
        let mut order: Vec<(String, usize)> = counts.into_iter().collect();
        order.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let top: Vec<String> = order
            .iter()
            .take(MAX_ROUTES)
            .map(|(r, _)| r.clone())
            .collect();
        let mut lat: BTreeMap<String, Vec<i64>> = BTreeMap::new();
        for f in live.iter().filter(|f| f.sample.outcome == Outcome::Ok) {
            let route = route_of(f);
            let key = if top.contains(&route) {
                route
            } else {
                "other".into()
            };
            lat.entry(key).or_default().extend(f.sample.total_us);
        }
        for route in top.iter().cloned().chain(["other".to_string()]) {
            let Some(v) = lat.remove(&route) else {
                continue;
            };
            by_route.push(
                json!({"name": series_name(&r.label, runs.len(), None, "", &route),
                "run": r.label, "route": route, "n": v.len(), "points": cdf_points(v)}),
            );
        }
        let o: Vec<i64> = live
            .iter()
            .filter_map(|f| Some(f.downstream_done_us?.saturating_sub(f.sample.total_us?)))
            .collect();
        if !o.is_empty() {
            overhead.push(
                json!({"name": series_name(&r.label, runs.len(), None, "", "overhead"),
                "run": r.label, "n": o.len(), "points": cdf_points(o)}),
            );
        }
    }
    vec![by_route, overhead]
}

/// Routes drawn apart in serve's latency chart; the rest are `other`.
const MAX_ROUTES: usize = 8;

fn route_of(f: &RowFacts) -> String {
    format!("{} {}", f.method, crate::model::url_path(&f.url))
}

/// Bin widths a timeline may use (µs): the first that needs at most [`MAX_BINS`].
const BIN_WIDTHS_US: [i64; 19] = [
    1_000,
    2_000,
    5_000,
    10_000,
    20_000,
    50_000,
    100_000,
    200_000,
    500_000,
    1_000_000,
    2_000_000,
    5_000_000,
    10_000_000,
    30_000_000,
    60_000_000,
    120_000_000,
    300_000_000,
    600_000_000,
    3_600_000_000,
];
const MAX_BINS: i64 = 150;

/// A timeline's bins from `first` to `last` (µs): (width, the first bin's index, count).
/// The count is at most [`MAX_BINS`] whatever the values: past the widest listed width
/// (an hour) the width is whole hours, as many as the span needs.
fn bins(first: i64, last: i64) -> (i64, i64, usize) {
    let last = last.max(first);
    let fits = |b: i64| last.div_euclid(b) - first.div_euclid(b) < MAX_BINS;
    let bin = BIN_WIDTHS_US
        .into_iter()
        .find(|b| fits(*b))
        .unwrap_or_else(|| {
            let hour = BIN_WIDTHS_US[BIN_WIDTHS_US.len() - 1];
            let span = (i128::from(last) - i128::from(first)) as u128;
            let hours = span.div_ceil((MAX_BINS - 1) as u128 * hour as u128);
            i64::try_from(hours * hour as u128).unwrap_or(i64::MAX)
        });
    let first_bin = first.div_euclid(bin);
    let n = (last.div_euclid(bin) - first_bin + 1).clamp(1, MAX_BINS) as usize;
    (bin, first_bin, n)
}

fn timeline(r: &RunInput, i: usize) -> Option<Chart> {
    let starts = r.facts.iter().map(|f| f.sample.start_offset_us);
    let intended = r.facts.iter().filter_map(|f| f.sample.scheduled_offset_us);
    let first = starts.chain(intended).min()?;
    let last = r.facts.iter().map(|f| f.sample.end_offset_us()).max()?;
    let (bin, first_bin, n) = bins(first, last);
    let at = |t: i64| (t.div_euclid(bin) - first_bin).clamp(0, n as i64 - 1) as usize;
    let mut series: Vec<(String, Vec<u64>)> = vec![
        ("sends".into(), vec![0; n]),
        ("completed ok".into(), vec![0; n]),
    ];
    // An open loop's or a trace's own arrivals (the schedule: a trace's recorded times
    // over its speed-up), beside what was sent.
    if r.facts
        .iter()
        .any(|f| f.sample.scheduled_offset_us.is_some())
    {
        series.insert(1, ("scheduled".into(), vec![0; n]));
    }
    for f in &r.facts {
        let (s, e) = (at(f.sample.start_offset_us), at(f.sample.end_offset_us()));
        series[0].1[s] += 1;
        if let Some(t) = f.sample.scheduled_offset_us {
            series[1].1[at(t)] += 1;
        }
        let name = match f.sample.outcome {
            Outcome::Ok => "completed ok".to_string(),
            o => format!("failed: {}", o.as_str()),
        };
        match series.iter_mut().find(|(k, _)| *k == name) {
            Some((_, v)) => v[e] += 1,
            None => {
                let mut v = vec![0; n];
                v[e] += 1;
                series.push((name, v));
            }
        }
    }
    let mut c = Chart::new(
        format!("timeline-{i}"),
        "timeline",
        format!("Timeline: {}", r.label),
        "every recorded exchange of every phase: sends by start_offset_us, the schedule by scheduled_offset_us (open loops and traces: a trace's own arrivals at its speed-up, and a trace's later session turns when they were due), completions (ok, and failures by kind) by start_offset_us + total_us (+ 0 when no duration), counted per bin of bin_us; shaded spans are the measured rounds (first send to last completion)",
        ("time since the run's start (s)", "exchanges per bin"),
    );
    c.set("run", json!(r.label));
    c.set("bin_us", json!(bin));
    c.set("first_bin", json!(first_bin));
    c.set("rounds", json!(round_spans(r)));
    for (name, counts) in series {
        c.push(json!({"name": name, "counts": counts}));
    }
    Some(c)
}

/// What each worker chart draws: (id, title, y label, scope, its lines).
type WorkerChart = (
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    Vec<crate::report::worker::Line>,
);

/// The worker's queue and caches and the GPU's utilisation and memory on the run's
/// clock (kind `series`), each only when the run recorded it.
fn worker_charts(r: &RunInput, i: usize) -> Vec<Chart> {
    use crate::report::worker::{cache_lines, gpu_lines, queue_lines};
    let specs: [WorkerChart; 4] = [
        (
            "worker-queue",
            "Worker: requests running and waiting",
            "requests",
            "each scrape of the worker's /metrics (worker_metrics.parquet): its running and waiting gauges summed over their label sets",
            queue_lines(&r.worker),
        ),
        (
            "worker-cache",
            "Worker: KV-cache use and prefix-cache hit rate",
            "%",
            "each scrape of the worker's /metrics: KV-cache use averaged over its label sets; prefix-cache hits / queries since the worker's previous scrape (counter deltas; a hit-rate gauge as it is)",
            cache_lines(&r.worker),
        ),
        (
            "gpu-util",
            "GPU utilisation",
            "%",
            "each GPU sample (gpu.parquet): nvidia-smi's utilization.gpu or DCGM's DCGM_FI_DEV_GPU_UTIL, device-wide",
            gpu_lines(&r.gpu, false),
        ),
        (
            "gpu-memory",
            "GPU memory in use",
            "MiB",
            "each GPU sample (gpu.parquet): nvidia-smi's memory.used or DCGM's DCGM_FI_DEV_FB_USED, device-wide (every process on the GPU)",
            gpu_lines(&r.gpu, true),
        ),
    ];
    let mut out = Vec::new();
    for (id, title, y_label, scope, lines) in specs {
        let mut c = Chart::new(
            format!("{id}-{i}"),
            "series",
            format!("{title}: {}", r.label),
            scope,
            ("time since the run's start (s)", y_label),
        );
        c.set("run", json!(r.label));
        c.set("rounds", json!(round_spans(r)));
        for l in lines {
            let points: Vec<[Value; 2]> =
                l.points.iter().map(|(t, v)| [json!(t), json!(v)]).collect();
            c.push(json!({"name": l.name, "run": r.label, "arm": l.arm,
                "metric": l.metric, "points": points}));
        }
        out.push(c);
    }
    out
}

/// The measured rounds' spans, in start order.
fn round_spans(r: &RunInput) -> Vec<Value> {
    let mut spans: Vec<(String, i64, i64)> = Vec::new();
    for f in r.facts.iter().filter(|f| f.phase == "measured") {
        let Some(level) = f.level() else { continue };
        let label = series_name(
            "",
            1,
            f.arm.as_deref(),
            &format!(
                "{} {}",
                f.case_name.as_deref().unwrap_or("?"),
                level.named()
            ),
            &format!("#{}", f.repetition.unwrap_or(0)),
        );
        let (s, e) = (f.sample.start_offset_us, f.sample.end_offset_us());
        match spans.iter_mut().find(|(l, _, _)| *l == label) {
            Some(span) => {
                span.1 = span.1.min(s);
                span.2 = span.2.max(e);
            }
            None => spans.push((label, s, e)),
        }
    }
    spans.sort_by_key(|s| s.1);
    spans
        .into_iter()
        .map(|(label, s, e)| json!({"label": label, "start_us": s, "end_us": e}))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cdf_points_are_nearest_ranks_at_every_percent() {
        let p = cdf_points((1..=10).rev().collect());
        assert_eq!(p.len(), 101);
        assert_eq!(p[0], [0, 1]);
        assert_eq!(p[50], [50, 5]);
        assert_eq!(p[51], [51, 6]);
        assert_eq!(p[100], [100, 10]);
        assert!(cdf_points(Vec::new()).is_empty());
    }

    #[test]
    fn timeline_bins_are_bounded_by_the_chart_never_by_the_values() {
        assert_eq!(bins(0, 0), (1_000, 0, 1));
        assert_eq!(bins(0, 149_999), (1_000, 0, 150));
        assert_eq!(bins(0, 150_000), (2_000, 0, 76));
        // A month: whole hours, as many as keep within the bins.
        let month = 30 * 24 * 3_600_000_000i64;
        let (bin, _, n) = bins(0, month);
        assert_eq!(bin % 3_600_000_000, 0);
        assert!(n <= MAX_BINS as usize, "{n}");
        // Values no run holds still give a bounded chart, never an allocation of their size.
        for (first, last) in [
            (0, 4_000_000_000_000_000_000),
            (i64::MIN, i64::MAX),
            (5_000_000, -5_000_000),
            (i64::MAX, i64::MAX),
        ] {
            let (bin, first_bin, n) = bins(first, last);
            assert!(
                bin > 0 && (1..=MAX_BINS as usize).contains(&n),
                "{first} {last}"
            );
            let last_bin = last.max(first).div_euclid(bin) - first_bin;
            assert!(last_bin < n as i64, "{first} {last}: {last_bin} of {n}");
        }
    }

    #[test]
    fn json_blocks_cannot_close_their_script() {
        let mut c = Chart::new("x".into(), "cdf", "</script><b>".into(), "s", ("a", "b"));
        c.push(json!({"name": "</script>"}));
        let h = c.html();
        assert_eq!(h.matches("</script>").count(), 1, "{h}");
        assert!(h.contains("&lt;/script&gt;&lt;b&gt;"));
    }
}
