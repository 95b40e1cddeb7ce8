//! The worker's own numbers over a window of the run: a measured round (replay; between
//! its `round_start` and `round_end` scrapes), a campaign cell (its rounds' windows
//! pooled) or the whole run (serve; `run_start` to `run_end`), from the rows of
//! `worker_metrics.parquet` (pure); and the report's lines of the worker's and the GPU's
//! series. Counters and histograms are deltas between a window's two scrapes, summed over
//! the label sets (a histogram's per `le`); gauges are the mean over every scrape inside
//! the window. Quantiles are
//! interpolated inside the histogram bucket that holds the rank, as Prometheus's
//! `histogram_quantile` does, and say so; the bucket's bounds travel with them. The
//! names each server exports are one table, [`SERVERS`] (docs/metrics.md copies it).

use std::collections::BTreeMap;

use super::doc::worker::{Quantiles, TwoSided, WorkerDoc, WorkerTiming};
use crate::record::scrapes::{RoundId, ScrapeRow};

/// What one server calls each number we read. Candidates are tried in order; the first
/// the worker exports is used (a rename keeps the old name after the new).
pub(crate) struct Names {
    pub(crate) server: &'static str,
    /// The prefix every metric of the server starts with (which table applies).
    pub(crate) prefix: &'static str,
    pub(crate) ttft: &'static [&'static str],
    pub(crate) itl: &'static [&'static str],
    pub(crate) e2e: &'static [&'static str],
    pub(crate) running: &'static [&'static str],
    pub(crate) waiting: &'static [&'static str],
    /// KV-cache use, a fraction in 0..1.
    pub(crate) kv_cache: &'static [&'static str],
    /// Prefix-cache (queried, hit) counters; or a hit-rate gauge.
    pub(crate) prefix_counters: &'static [(&'static str, &'static str)],
    pub(crate) prefix_rate: &'static [&'static str],
    pub(crate) preemptions: &'static [&'static str],
    pub(crate) requests: &'static [&'static str],
    pub(crate) prompt_tokens: &'static [&'static str],
    pub(crate) generation_tokens: &'static [&'static str],
}

/// The servers whose names are known (docs/metrics.md copies this table, with the
/// versions): vLLM's V1 engine (0.9.2 and later; the names it had before 0.11 after the
/// new ones), SGLang (`--enable-metrics`; its main branch of 2025-2026) and TGI (1.0 to
/// 3.3). A counter is read as `name_total` or `name`; TGI's token counts are histograms,
/// read through their `_sum`. Unknown metrics are still recorded raw.
pub(crate) const SERVERS: &[Names] = &[
    Names {
        server: "vllm",
        prefix: "vllm:",
        ttft: &["vllm:time_to_first_token_seconds"],
        itl: &[
            "vllm:inter_token_latency_seconds",
            "vllm:time_per_output_token_seconds",
        ],
        e2e: &["vllm:e2e_request_latency_seconds"],
        running: &["vllm:num_requests_running"],
        waiting: &["vllm:num_requests_waiting"],
        kv_cache: &["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"],
        prefix_counters: &[
            ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits"),
            (
                "vllm:gpu_prefix_cache_queries",
                "vllm:gpu_prefix_cache_hits",
            ),
        ],
        prefix_rate: &[],
        preemptions: &["vllm:num_preemptions"],
        requests: &["vllm:request_success"],
        prompt_tokens: &["vllm:prompt_tokens"],
        generation_tokens: &["vllm:generation_tokens"],
    },
    Names {
        server: "sglang",
        prefix: "sglang:",
        ttft: &["sglang:time_to_first_token_seconds"],
        itl: &[
            "sglang:inter_token_latency_seconds",
            "sglang:time_per_output_token_seconds",
        ],
        e2e: &["sglang:e2e_request_latency_seconds"],
        running: &["sglang:num_running_reqs"],
        waiting: &["sglang:num_queue_reqs"],
        kv_cache: &["sglang:token_usage"],
        prefix_counters: &[("sglang:prompt_tokens", "sglang:cached_tokens")],
        prefix_rate: &["sglang:cache_hit_rate"],
        preemptions: &["sglang:num_retracted_requests"],
        requests: &["sglang:num_requests"],
        prompt_tokens: &["sglang:prompt_tokens"],
        generation_tokens: &["sglang:generation_tokens"],
    },
    Names {
        server: "tgi",
        prefix: "tgi_",
        ttft: &[],
        itl: &["tgi_request_mean_time_per_token_duration"],
        e2e: &["tgi_request_duration"],
        running: &["tgi_batch_current_size"],
        waiting: &["tgi_queue_size"],
        kv_cache: &[],
        prefix_counters: &[],
        prefix_rate: &[],
        preemptions: &[],
        requests: &["tgi_request_success"],
        prompt_tokens: &["tgi_request_input_length_sum"],
        generation_tokens: &["tgi_request_generated_tokens_sum"],
    },
];

/// Whether the reports read `metric` from an interval scrape (the gauges a window's means
/// and the report's lines read, the prefix-cache counters the hit-rate line reads): the
/// rest of an interval scrape is only written, never held.
pub(crate) fn read_between_edges(metric: &str) -> bool {
    let base = metric.strip_suffix("_total").unwrap_or(metric);
    SERVERS.iter().any(|n| {
        [n.running, n.waiting, n.kv_cache, n.prefix_rate]
            .iter()
            .any(|c| c.contains(&metric))
            || n.prefix_counters
                .iter()
                .any(|(q, h)| *q == base || *h == base)
    })
}

/// What the numbers are, for the documents.
pub(crate) const TIMING_SCOPE: &str = "difference of p50s, not per request: our p50 over the window's successful exchanges minus the worker's bucket-interpolated p50 from its histogram's delta over the same window; bucket_width_seconds is the width of the bucket the worker's p50 fell in, the resolution of the difference";

/// One scrape's samples: `(metric, labels, value)`.
type Samples<'a> = Vec<&'a ScrapeRow>;

/// The rows grouped by scrape (each scrape's rows are contiguous and share its offset,
/// cause and arm), in time order.
fn scrapes(rows: &[ScrapeRow]) -> Vec<(i64, &'static str, Samples<'_>)> {
    let mut out: Vec<(i64, &'static str, Samples<'_>)> = Vec::new();
    for r in rows {
        match out.last_mut() {
            Some((o, c, v))
                if *o == r.offset_us
                    && *c == r.cause
                    && v.first().map(|x| &x.arm) == Some(&r.arm) =>
            {
                v.push(r)
            }
            _ => out.push((r.offset_us, r.cause, vec![r])),
        }
    }
    out.sort_by_key(|(o, _, _)| *o);
    out
}

/// Which table a worker's names follow: the first server one of its scrape's metric names
/// starts with (each arm's worker has its own).
fn server_of(s: &Samples<'_>) -> Option<&'static Names> {
    s.iter()
        .find_map(|r| SERVERS.iter().find(|n| r.metric.starts_with(n.prefix)))
}

/// The sum over label sets of a counter (`name` or `name_total`) in one scrape.
fn counter(s: &Samples<'_>, name: &str) -> Option<f64> {
    let total = format!("{name}_total");
    let v: Vec<f64> = s
        .iter()
        .filter(|r| (r.metric == name || r.metric == total) && r.value.is_finite())
        .map(|r| r.value)
        .collect();
    (!v.is_empty()).then(|| v.iter().sum())
}

/// The values of a gauge over its label sets in one scrape.
fn gauge(s: &Samples<'_>, name: &str) -> Vec<f64> {
    s.iter()
        .filter(|r| r.metric == name && r.value.is_finite())
        .map(|r| r.value)
        .collect()
}

/// A histogram's cumulative counts by upper bound in one scrape, summed over label sets.
fn buckets(s: &Samples<'_>, name: &str) -> BTreeMap<Bound, f64> {
    let bucket = format!("{name}_bucket");
    let mut out: BTreeMap<Bound, f64> = BTreeMap::new();
    // A count that is not a finite number (a broken exporter) is not one to add.
    for r in s
        .iter()
        .filter(|r| r.metric == bucket && r.value.is_finite())
    {
        let Some((_, le)) = r.labels.iter().find(|(k, _)| k == "le") else {
            continue;
        };
        let Some(b) = Bound::parse(le) else {
            continue;
        };
        *out.entry(b).or_insert(0.0) += r.value;
    }
    out
}

/// A bucket's upper bound, ordered (`+Inf` last).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Bound(f64);

impl Eq for Bound {}
impl PartialOrd for Bound {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bound {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

impl Bound {
    fn parse(s: &str) -> Option<Bound> {
        match s {
            "+Inf" | "Inf" | "inf" | "+inf" => Some(Bound(f64::INFINITY)),
            _ => s.parse::<f64>().ok().filter(|v| !v.is_nan()).map(Bound),
        }
    }
}

/// The quantile `q` of cumulative bucket counts (Prometheus's `histogram_quantile`):
/// `(value, lower bound, upper bound)` of the bucket the rank falls in, linear inside it
/// (`None` as the upper bound: `+Inf`). A rank in the `+Inf` bucket is the highest finite
/// bound; a rank in a lowest bucket whose bound is 0 or less is that bound. `None` without
/// observations, or with only a `+Inf` bucket (no bound to give).
pub(crate) fn quantile(cumulative: &[(f64, f64)], q: f64) -> Option<(f64, f64, Option<f64>)> {
    let total = cumulative.last().map(|(_, c)| *c)?;
    // Also NaN: no observations to rank.
    if total.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater) {
        return None;
    }
    let rank = q * total;
    let mut prev: Option<(f64, f64)> = None;
    for &(upper, count) in cumulative {
        if count >= rank {
            return match (upper.is_infinite(), prev) {
                (true, Some((bound, _))) => Some((bound, bound, None)),
                (true, None) => None,
                (false, None) if upper <= 0.0 => Some((upper, upper, Some(upper))),
                (false, _) => {
                    let (lower, below) = prev.unwrap_or((0.0, 0.0));
                    let inside = count - below;
                    let at = if inside > 0.0 {
                        lower + (upper - lower) * (rank - below) / inside
                    } else {
                        upper
                    };
                    Some((at, lower, Some(upper)))
                }
            };
        }
        prev = Some((upper, count));
    }
    None
}

/// One window: the scrape that opens it, the one that closes it, every scrape in between.
struct Window<'a> {
    start: &'a Samples<'a>,
    end: &'a Samples<'a>,
    inside: Vec<&'a Samples<'a>>,
    start_us: i64,
    end_us: i64,
}

/// The worker's numbers over `windows` (one round's, or a campaign cell's rounds pooled):
/// counter and histogram deltas summed over the windows, gauge means over every scrape
/// inside them.
fn numbers(names: &Names, windows: &[Window<'_>]) -> WorkerDoc {
    // A counter the worker creates on first use (TGI's) is 0 before it appears; one that
    // went down (a restarted worker) has no delta to read.
    let delta = |cands: &[&str]| {
        cands.iter().find_map(|n| {
            let mut sum = 0.0;
            for w in windows {
                let b = counter(w.end, n)?;
                let a = counter(w.start, n).unwrap_or(0.0);
                if b < a {
                    return None;
                }
                sum += b - a;
            }
            Some(sum)
        })
    };
    let mean = |cands: &[&str], sum: bool| {
        cands.iter().find_map(|n| {
            let per_scrape: Vec<f64> = windows
                .iter()
                .flat_map(|w| w.inside.iter())
                .map(|s| gauge(s, n))
                .filter(|v| !v.is_empty())
                .map(|v| {
                    let total: f64 = v.iter().sum();
                    if sum { total } else { total / v.len() as f64 }
                })
                .collect();
            (!per_scrape.is_empty())
                .then(|| per_scrape.iter().sum::<f64>() / per_scrape.len() as f64)
        })
    };
    let prefix_cache_hit_rate = names
        .prefix_counters
        .iter()
        .find_map(|(q, h)| {
            let queries = delta(&[q])?;
            let hits = delta(&[h])?;
            (queries > 0.0).then(|| hits / queries)
        })
        .or_else(|| mean(names.prefix_rate, false));
    WorkerDoc {
        server: names.server.into(),
        window_start_seconds: windows.first().map_or(0.0, |w| w.start_us as f64 / 1e6),
        window_end_seconds: windows.last().map_or(0.0, |w| w.end_us as f64 / 1e6),
        scrapes_in_window: windows.iter().map(|w| w.inside.len() as u64).sum(),
        ttft_seconds: histogram(names.ttft, windows),
        itl_seconds: histogram(names.itl, windows),
        e2e_seconds: histogram(names.e2e, windows),
        requests: delta(names.requests),
        preemptions: delta(names.preemptions),
        prompt_tokens: delta(names.prompt_tokens),
        generation_tokens: delta(names.generation_tokens),
        running_mean: mean(names.running, true),
        waiting_mean: mean(names.waiting, true),
        kv_cache_usage_mean: mean(names.kv_cache, false),
        prefix_cache_hit_rate,
        two_sided: None,
    }
}

/// A histogram's delta over the windows (summed per bucket), as p50 and p95 with their
/// buckets.
fn histogram(cands: &[&str], windows: &[Window<'_>]) -> Option<Quantiles> {
    cands.iter().find_map(|n| {
        let mut total: BTreeMap<Bound, f64> = BTreeMap::new();
        for w in windows {
            let (a, b) = (buckets(w.start, n), buckets(w.end, n));
            if b.is_empty() {
                return None;
            }
            for (le, c) in &b {
                let d = c - a.get(le).copied().unwrap_or(0.0);
                // A count that went down (in any window) is a restarted worker.
                if d < 0.0 {
                    return None;
                }
                *total.entry(*le).or_insert(0.0) += d;
            }
        }
        let cumulative: Vec<(f64, f64)> = total.iter().map(|(le, c)| (le.0, *c)).collect();
        let observations = cumulative.last().map_or(0.0, |(_, c)| *c);
        let p50 = quantile(&cumulative, 0.5);
        let p95 = quantile(&cumulative, 0.95);
        Some(Quantiles {
            metric: (*n).to_string(),
            observations,
            p50: p50.map(|x| x.0),
            p50_bucket: p50.map(|x| (x.1, x.2)),
            p95: p95.map(|x| x.0),
            p95_bucket: p95.map(|x| (x.1, x.2)),
            estimate: "bucket-interpolated".into(),
        })
    })
}

/// Each round's window: its round, its arm, its two edge scrapes and every scrape of its
/// worker in between (a round without both edge scrapes has none).
fn round_windows<'a>(
    all: &'a [(i64, &'static str, Samples<'a>)],
) -> Vec<(&'a RoundId, Option<&'a str>, Window<'a>)> {
    let mut out = Vec::new();
    for (i, (start_us, cause, s)) in all.iter().enumerate() {
        if *cause != "round_start" {
            continue;
        }
        let Some(id) = s.first().and_then(|r| r.round.as_ref()) else {
            continue;
        };
        let arm = s.first().and_then(|r| r.arm.as_deref());
        let end = all[i + 1..].iter().find(|(_, c, e)| {
            *c == "round_end"
                && e.first().and_then(|r| r.round.as_ref()) == Some(id)
                && e.first().and_then(|r| r.arm.as_deref()) == arm
        });
        let Some((end_us, _, e)) = end else {
            continue;
        };
        let w = Window {
            start: s,
            end: e,
            inside: window_scrapes(all, *start_us, *end_us, arm),
            start_us: *start_us,
            end_us: *end_us,
        };
        out.push((id, arm, w));
    }
    out
}

/// A campaign cell's worker numbers: every round of `arm` at concurrency `c` pooled.
pub(crate) fn cell(rows: &[ScrapeRow], arm: &str, c: usize) -> Option<WorkerDoc> {
    let all = scrapes(rows);
    let windows: Vec<Window<'_>> = round_windows(&all)
        .into_iter()
        .filter(|(id, a, _)| *a == Some(arm) && id.concurrency == Some(c as i32))
        .map(|(_, _, w)| w)
        .collect();
    let names = server_of(windows.first()?.start)?;
    Some(numbers(names, &windows))
}

/// The worker's numbers over each round, by round: a round without both edge scrapes (a
/// failed scrape, a shard's timetabled wave) has none.
pub(crate) fn rounds(rows: &[ScrapeRow]) -> Vec<(RoundId, Option<String>, WorkerDoc)> {
    let all = scrapes(rows);
    round_windows(&all)
        .into_iter()
        .filter_map(|(id, arm, w)| {
            let doc = numbers(server_of(w.start)?, std::slice::from_ref(&w));
            Some((id.clone(), arm.map(str::to_string), doc))
        })
        .collect()
}

/// Every scrape of `arm`'s worker at or between two offsets.
fn window_scrapes<'a>(
    all: &'a [(i64, &'static str, Samples<'a>)],
    from: i64,
    to: i64,
    arm: Option<&str>,
) -> Vec<&'a Samples<'a>> {
    all.iter()
        .filter(|(o, _, s)| {
            (from..=to).contains(o) && s.first().and_then(|r| r.arm.as_deref()) == arm
        })
        .map(|(_, _, s)| s)
        .collect()
}

/// serve's one window: its `run_start` scrape to its `run_end` scrape (`None` without
/// both).
pub(crate) fn whole_run(rows: &[ScrapeRow]) -> Option<WorkerDoc> {
    let all = scrapes(rows);
    let first = all.iter().find(|(_, c, _)| *c == "run_start")?;
    let names = server_of(&first.2)?;
    let last = all.iter().rev().find(|(_, c, _)| *c == "run_end")?;
    let w = Window {
        start: &first.2,
        end: &last.2,
        inside: window_scrapes(&all, first.0, last.0, None),
        start_us: first.0,
        end_us: last.0,
    };
    Some(numbers(names, std::slice::from_ref(&w)))
}

/// Ours minus the worker's p50, with the resolution of the worker's bucket.
pub(crate) fn two_sided(ours_ttft: Option<f64>, ours_e2e: Option<f64>, w: &WorkerDoc) -> TwoSided {
    let side = |ours: Option<f64>, worker: &Option<Quantiles>| {
        let q = worker.as_ref()?;
        let (ours, theirs, (lo, hi)) = (ours?, q.p50?, q.p50_bucket?);
        Some(WorkerTiming {
            ours_p50_seconds: ours,
            worker_p50_seconds: theirs,
            difference_seconds: ours - theirs,
            bucket_width_seconds: hi.map(|hi| hi - lo),
        })
    };
    TwoSided {
        ttft: side(ours_ttft, &w.ttft_seconds),
        e2e: side(ours_e2e, &w.e2e_seconds),
        scope: TIMING_SCOPE.into(),
    }
}

/// summary.json's rounds with the worker's numbers over each (`rows` from
/// worker_metrics.parquet; nothing changes without them).
pub(crate) fn with_rounds(
    mut docs: Vec<super::doc::summary::Round>,
    rows: &[ScrapeRow],
) -> Vec<super::doc::summary::Round> {
    for (id, arm, mut w) in rounds(rows) {
        let Some(doc) = docs.iter_mut().find(|d| {
            d.case == *id.case_name
                && d.repetition as i32 == id.repetition
                && d.concurrency.map(|c| c as i32) == id.concurrency
                && d.rate_per_second == id.target_rate_per_second
                && d.arm == arm
        }) else {
            continue;
        };
        let ttft = doc.stream.as_ref().and_then(|s| s.ttft_seconds.p50);
        w.two_sided = Some(two_sided(ttft, doc.service_latency_seconds.p50, &w));
        doc.worker = Some(w);
    }
    docs
}

/// campaign.json's cells with their arm's worker's numbers (every round of the cell
/// pooled), and ours minus the worker's from the cell's own p50s.
pub(crate) fn add_cells(doc: &mut super::doc::campaign::CampaignDoc, rows: &[ScrapeRow]) {
    if rows.is_empty() {
        return;
    }
    for arm in &mut doc.arms {
        for (c, cell) in &mut arm.concurrency {
            let Some(mut w) = self::cell(rows, &arm.name, *c as usize) else {
                continue;
            };
            let ms = |v: Option<f64>| v.map(|x| x / 1e3);
            w.two_sided = Some(two_sided(ms(cell.ttft_p50_ms), ms(cell.latency_p50_ms), &w));
            cell.worker = Some(w);
        }
    }
}

/// One line of the report's worker charts: a value per scrape (or GPU sample) on the run's
/// clock.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Line {
    pub(crate) name: String,
    pub(crate) arm: Option<String>,
    /// The metric read (a series of the table, or nvidia-smi's / DCGM's field).
    pub(crate) metric: String,
    /// `(offset_us, value)`.
    pub(crate) points: Vec<(i64, f64)>,
}

/// Which names of a server's table a line reads.
type Pick = fn(&Names) -> &[&'static str];

/// The worker's queue over the run: per arm, each scrape's running and waiting requests
/// (summed over label sets), by each worker's own names.
pub(crate) fn queue_lines(rows: &[ScrapeRow]) -> Vec<Line> {
    let all = scrapes(rows);
    let mut out: Vec<Line> = Vec::new();
    let picks: [(&str, Pick); 2] = [("running", |n| n.running), ("waiting", |n| n.waiting)];
    for (label, pick) in picks {
        for (offset, _, s) in &all {
            let arm = s.first().and_then(|r| r.arm.as_deref());
            let Some(names) = server_of(s) else { continue };
            if let Some((metric, v)) = pick(names).iter().find_map(|n| {
                let v = gauge(s, n);
                (!v.is_empty()).then(|| (*n, v.iter().sum::<f64>()))
            }) {
                push_point(&mut out, line_name(arm, label), arm, metric, (*offset, v));
            }
        }
    }
    out
}

/// The mean over label sets of the first of `cands` a scrape has, in percent.
fn percent(s: &Samples<'_>, cands: &[&'static str]) -> Option<(&'static str, f64)> {
    cands.iter().find_map(|n| {
        let v = gauge(s, n);
        (!v.is_empty()).then(|| (*n, 100.0 * v.iter().sum::<f64>() / v.len() as f64))
    })
}

/// The worker's caches over the run, in percent: per arm, each scrape's KV-cache use (mean
/// over label sets) and the prefix-cache hit rate since the worker's previous scrape (hits
/// / queries of the interval; a hit-rate gauge as it is), by each worker's own names.
pub(crate) fn cache_lines(rows: &[ScrapeRow]) -> Vec<Line> {
    let all = scrapes(rows);
    let mut out: Vec<Line> = Vec::new();
    let mut prev: BTreeMap<Option<&str>, (f64, f64)> = BTreeMap::new();
    for (offset, _, s) in &all {
        let arm = s.first().and_then(|r| r.arm.as_deref());
        let Some(names) = server_of(s) else { continue };
        if let Some((metric, v)) = percent(s, names.kv_cache) {
            let name = line_name(arm, "KV-cache use");
            push_point(&mut out, name, arm, metric, (*offset, v));
        }
        let hits = line_name(arm, "prefix-cache hits");
        if let Some((metric, v)) = percent(s, names.prefix_rate) {
            push_point(&mut out, hits, arm, metric, (*offset, v));
            continue;
        }
        // Counters: the rate over the interval since the same worker's previous scrape.
        let Some((h, qv, hv)) = names
            .prefix_counters
            .iter()
            .find_map(|(q, h)| Some((*h, counter(s, q)?, counter(s, h)?)))
        else {
            continue;
        };
        if let Some((pq, ph)) = prev.insert(arm, (qv, hv))
            && qv > pq
            && hv >= ph
        {
            push_point(
                &mut out,
                hits,
                arm,
                h,
                (*offset, 100.0 * (hv - ph) / (qv - pq)),
            );
        }
    }
    out
}

fn line_name(arm: Option<&str>, what: &str) -> String {
    match arm {
        Some(a) => format!("{a}: {what}"),
        None => what.to_string(),
    }
}

fn push_point(out: &mut Vec<Line>, name: String, arm: Option<&str>, metric: &str, p: (i64, f64)) {
    // JSON has no NaN or infinity (they would be drawn as 0): such a sample is no point.
    if !p.1.is_finite() {
        return;
    }
    match out.iter_mut().find(|l| l.name == name) {
        Some(l) => l.points.push(p),
        None => out.push(Line {
            name,
            arm: arm.map(str::to_string),
            metric: metric.to_string(),
            points: vec![p],
        }),
    }
}

/// The GPU's utilisation (%) or memory in use (MiB) over the run, a line per GPU:
/// nvidia-smi's `utilization.gpu` / `memory.used`, or DCGM's `DCGM_FI_DEV_GPU_UTIL` /
/// `DCGM_FI_DEV_FB_USED`.
pub(crate) fn gpu_lines(rows: &[crate::record::gpu::GpuRow], memory: bool) -> Vec<Line> {
    let wanted: [&str; 2] = if memory {
        ["memory.used", "DCGM_FI_DEV_FB_USED"]
    } else {
        ["utilization.gpu", "DCGM_FI_DEV_GPU_UTIL"]
    };
    let mut out: Vec<Line> = Vec::new();
    for r in rows.iter().filter(|r| wanted.contains(&r.metric.as_str())) {
        let name = match r.gpu {
            Some(g) => format!("GPU {g}"),
            None => "GPU".to_string(),
        };
        push_point(&mut out, name, None, &r.metric, (r.offset_us, r.value));
    }
    out
}

/// A rebuilt summary's rounds take the worker's numbers the run's own summary had (the
/// rows do not hold the scrapes), the two-sided timing recomputed from the rebuilt
/// round's own p50s.
pub(crate) fn carry(
    rebuilt: &mut [super::doc::summary::Round],
    original: &[super::doc::summary::Round],
) {
    for d in rebuilt {
        let Some(w) = original
            .iter()
            .find(|o| {
                o.case == d.case
                    && o.repetition == d.repetition
                    && o.concurrency == d.concurrency
                    && o.rate_per_second == d.rate_per_second
                    && o.arm == d.arm
            })
            .and_then(|o| o.worker.clone())
        else {
            continue;
        };
        let ttft = d.stream.as_ref().and_then(|s| s.ttft_seconds.p50);
        let two = w
            .two_sided
            .is_some()
            .then(|| two_sided(ttft, d.service_latency_seconds.p50, &w));
        d.worker = Some(WorkerDoc {
            two_sided: two,
            ..w
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantile_interpolates_inside_the_bucket_like_prometheus() {
        // 10 observations: 4 in (0, 0.1], 6 in (0.1, 0.5].
        let c = [(0.1, 4.0), (0.5, 10.0), (f64::INFINITY, 10.0)];
        let (p50, lo, hi) = quantile(&c, 0.5).unwrap_or_default();
        // rank 5: one of the six in the second bucket → 0.1 + 0.4 * 1/6.
        assert!((p50 - (0.1 + 0.4 / 6.0)).abs() < 1e-12, "{p50}");
        assert_eq!((lo, hi), (0.1, Some(0.5)));
        // All in +Inf: the highest finite bound, the bucket open above.
        let c = [(0.1, 0.0), (0.5, 0.0), (f64::INFINITY, 3.0)];
        assert_eq!(quantile(&c, 0.5), Some((0.5, 0.5, None)));
        // Nothing observed, or only a +Inf bucket: no value (Prometheus: NaN).
        assert_eq!(quantile(&[(0.1, 0.0), (f64::INFINITY, 0.0)], 0.5), None);
        assert_eq!(quantile(&[(f64::INFINITY, 4.0)], 0.5), None);
        // A lowest bucket at or below 0: its bound.
        assert_eq!(
            quantile(&[(0.0, 3.0), (1.0, 4.0)], 0.5),
            Some((0.0, 0.0, Some(0.0)))
        );
    }

    fn row(
        offset_us: i64,
        cause: &'static str,
        metric: &str,
        le: Option<&str>,
        value: f64,
    ) -> ScrapeRow {
        ScrapeRow {
            offset_us,
            wall_time_us: 0,
            cause,
            round: (cause != "interval").then(|| RoundId {
                case_name: "c".into(),
                concurrency: Some(1),
                target_rate_per_second: None,
                repetition: 0,
            }),
            arm: None,
            metric: metric.into(),
            labels: le
                .map(|l| vec![("le".to_string(), l.to_string())])
                .unwrap_or_default(),
            value,
            kind: "counter".into(),
        }
    }

    #[test]
    fn a_p95_past_the_last_bucket_and_a_restart_survive_the_round_trip() {
        let e2e = "vllm:e2e_request_latency_seconds_bucket";
        let rows = vec![
            row(0, "round_start", e2e, Some("60.0"), 0.0),
            row(0, "round_start", e2e, Some("+Inf"), 0.0),
            row(0, "round_start", "vllm:request_success_total", None, 10.0),
            row(
                0,
                "round_start",
                "vllm:generation_tokens_total",
                None,
                500.0,
            ),
            row(9, "round_end", e2e, Some("60.0"), 9.0),
            row(9, "round_end", e2e, Some("+Inf"), 10.0),
            row(9, "round_end", "vllm:request_success_total", None, 20.0),
            // A restarted worker: its token counter went down.
            row(9, "round_end", "vllm:generation_tokens_total", None, 40.0),
            // TGI-style counters created on first use: absent at the start.
            row(9, "round_end", "vllm:num_preemptions_total", None, 2.0),
        ];
        let got = rounds(&rows);
        assert_eq!(got.len(), 1);
        let w = &got[0].2;
        let q = w.e2e_seconds.clone().unwrap_or_default();
        assert_eq!(q.p95, Some(60.0), "the highest finite bound");
        assert_eq!(q.p95_bucket, Some((60.0, None)));
        assert_eq!(w.requests, Some(10.0));
        assert_eq!(w.generation_tokens, None, "no delta across a restart");
        assert_eq!(w.preemptions, Some(2.0), "absent at the start is 0");
        // summary.json writes it and reads it back (a +Inf bound is null, not an error).
        let text = serde_json::to_string(w).unwrap_or_default();
        let back: WorkerDoc = serde_json::from_str(&text).unwrap_or_default();
        assert_eq!(&back, w, "{text}");
    }
}
