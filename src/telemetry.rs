//! Live metrics: what `--metrics-listen` serves, replay's progress line shows and serve's
//! live line and end-of-run counts read: the one live count of each exchange. Counters
//! and fixed-bucket histograms updated with relaxed atomics as each exchange ends, so
//! the cost per exchange is a few atomic adds, no lock and no state kept per request;
//! route labels are capped ([`MAX_ROUTES`], then `other`) and looked up without a lock.
//! Rendered in Prometheus' text exposition format 0.0.4 with conventional names and base
//! units (seconds).
//!
//! These numbers are approximate by construction (a histogram's quantile is a bucket's
//! upper bound) and cover every phase; the run's reported metrics come from the rows.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use crate::model::Outcome;

/// Distinct `METHOD /path` routes kept apart; later ones are counted as `other`.
pub(crate) const MAX_ROUTES: usize = 32;
const STATUS_CLASSES: [&str; 6] = ["1xx", "2xx", "3xx", "4xx", "5xx", "none"];

/// Upper bounds (seconds) of the request-duration and TTFT buckets.
const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0,
];
/// Upper bounds (seconds) of the inter-token-gap buckets.
const ITL_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

/// Most buckets a histogram has (its bounds and `+Inf`): room for a batch of observations
/// counted on the stack ([`Histogram::observe_all_us`]).
const MAX_BUCKETS: usize = 24;

/// A histogram with fixed buckets: a count per bucket (not cumulative) and the sum.
pub(crate) struct Histogram {
    bounds: &'static [f64],
    /// One per bound, then the `+Inf` bucket.
    counts: Vec<AtomicU64>,
    sum_us: AtomicU64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Histogram {
        assert!(
            bounds.len() < MAX_BUCKETS,
            "a histogram has at most {MAX_BUCKETS} buckets"
        );
        Histogram {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_us: AtomicU64::new(0),
        }
    }

    /// The bucket of `us` (negative counts as 0) and the value added to the sum.
    fn bucket(&self, us: i64) -> (usize, u64) {
        let us = us.max(0);
        let s = us as f64 / 1e6;
        (self.bounds.partition_point(|b| *b < s), us as u64)
    }

    pub(crate) fn observe_us(&self, us: i64) {
        let (i, us) = self.bucket(us);
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(us, Ordering::Relaxed);
    }

    /// Observe every value of `all`, counted on the stack first: one atomic add per bucket
    /// touched and one for the sum, however many values (an event stream's gaps).
    fn observe_all_us(&self, all: impl Iterator<Item = i64>) {
        let mut local = [0u64; MAX_BUCKETS];
        let mut sum = 0u64;
        for us in all {
            let (i, us) = self.bucket(us);
            local[i.min(MAX_BUCKETS - 1)] += 1;
            sum += us;
        }
        for (c, n) in self.counts.iter().zip(local) {
            if n > 0 {
                c.fetch_add(n, Ordering::Relaxed);
            }
        }
        if sum > 0 {
            self.sum_us.fetch_add(sum, Ordering::Relaxed);
        }
    }

    /// Cumulative counts per bound and for `+Inf` (which is also the count), read once
    /// each, so `+Inf` always equals the count rendered with it.
    fn cumulative(&self) -> Vec<u64> {
        let mut acc = 0;
        self.counts
            .iter()
            .map(|c| {
                acc += c.load(Ordering::Relaxed);
                acc
            })
            .collect()
    }

    /// The upper bound (seconds) of the bucket holding the nearest rank of `pct`, or
    /// `None` with no observation (`+Inf`: past the last bound).
    pub(crate) fn quantile_bound(&self, pct: u64) -> Option<f64> {
        let cum = self.cumulative();
        let n = *cum.last()?;
        if n == 0 {
            return None;
        }
        let rank = (pct * n).div_ceil(100).max(1);
        let i = cum.iter().position(|c| *c >= rank)?;
        Some(self.bounds.get(i).copied().unwrap_or(f64::INFINITY))
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let cum = self.cumulative();
        for (b, c) in self.bounds.iter().zip(&cum) {
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {c}");
        }
        let n = cum.last().copied().unwrap_or(0);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {n}");
        let sum = self.sum_us.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {n}");
    }
}

/// Whether an outside value is a counter (only rises) or a gauge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Counter,
    Gauge,
}

/// A value read when the endpoint is scraped (the recorder's queue, rows written, ...).
type Source = Box<dyn Fn() -> f64 + Send + Sync>;

/// The live metrics of one process.
pub(crate) struct Telemetry {
    /// `(method, path)` of each route kept apart, in first-seen order: [`MAX_ROUTES`]
    /// slots, each set once before `routes_len` counts it, so a lookup takes no lock.
    routes: Vec<OnceLock<(String, String)>>,
    routes_len: AtomicUsize,
    /// Held only while a route not yet kept is added: once the table is full, or a route
    /// kept, nothing takes it.
    routes_add: Mutex<()>,
    /// `[route][status class][outcome]`; route index [`MAX_ROUTES`] is `other`.
    requests: Vec<AtomicU64>,
    pub(crate) duration: Histogram,
    ttft: Histogram,
    itl: Histogram,
    /// Exchanges begun and not yet ended, counted by [`Telemetry::begin`] (replay).
    in_flight: AtomicI64,
    /// Where the in-flight gauge is read instead (serve's own count of its exchanges in
    /// flight).
    in_flight_source: std::sync::OnceLock<Source>,
    sources: Mutex<Vec<(&'static str, &'static str, Kind, Source)>>,
}

impl Default for Telemetry {
    fn default() -> Telemetry {
        Telemetry::new()
    }
}

/// One ended exchange, as the metrics see it.
pub(crate) struct Observed<'a> {
    /// From [`Telemetry::route_id`].
    pub(crate) route: usize,
    pub(crate) status: Option<i32>,
    pub(crate) outcome: Outcome,
    pub(crate) total_us: Option<i64>,
    pub(crate) ttft_us: Option<i64>,
    /// Content events' offsets (µs from t0), for the gaps between them.
    pub(crate) content_offsets_us: &'a [i64],
}

impl Telemetry {
    pub(crate) fn new() -> Telemetry {
        let cells = (MAX_ROUTES + 1) * STATUS_CLASSES.len() * Outcome::ALL.len();
        Telemetry {
            routes: (0..MAX_ROUTES).map(|_| OnceLock::new()).collect(),
            routes_len: AtomicUsize::new(0),
            routes_add: Mutex::new(()),
            requests: (0..cells).map(|_| AtomicU64::new(0)).collect(),
            duration: Histogram::new(LATENCY_BUCKETS),
            ttft: Histogram::new(LATENCY_BUCKETS),
            itl: Histogram::new(ITL_BUCKETS),
            in_flight: AtomicI64::new(0),
            in_flight_source: std::sync::OnceLock::new(),
            sources: Mutex::new(Vec::new()),
        }
    }

    /// Serve also `value()` as `name` (with its `# HELP` line) when scraped.
    pub(crate) fn register(
        &self,
        name: &'static str,
        help: &'static str,
        kind: Kind,
        value: impl Fn() -> f64 + Send + Sync + 'static,
    ) {
        if let Ok(mut s) = self.sources.lock() {
            s.push((name, help, kind, Box::new(value)));
        }
    }

    /// Read the in-flight gauge from `value` (a driver that counts its exchanges in
    /// flight already) instead of [`Telemetry::begin`]'s count.
    pub(crate) fn in_flight_from(&self, value: impl Fn() -> f64 + Send + Sync + 'static) {
        let _ = self.in_flight_source.set(Box::new(value));
    }

    /// The route's index for [`Observed::route`]: a kept route, a new one while fewer
    /// than [`MAX_ROUTES`] are kept, else `other`. Replay asks once per request of its
    /// plan; serve once per request, so a route already kept (or a full table) is found
    /// without a lock.
    pub(crate) fn route_id(&self, method: &str, url: &str) -> usize {
        let path = crate::model::url_path(url);
        let find = |n: usize| {
            self.routes[..n]
                .iter()
                .position(|r| r.get().is_some_and(|(m, p)| m == method && p == path))
        };
        let n = self.routes_len.load(Ordering::Acquire);
        if let Some(i) = find(n) {
            return i;
        }
        if n >= MAX_ROUTES {
            return MAX_ROUTES;
        }
        let Ok(_adding) = self.routes_add.lock() else {
            return MAX_ROUTES;
        };
        let n = self.routes_len.load(Ordering::Acquire);
        if let Some(i) = find(n) {
            return i;
        }
        if n >= MAX_ROUTES {
            return MAX_ROUTES;
        }
        let _ = self.routes[n].set((method.to_string(), path.to_string()));
        self.routes_len.store(n + 1, Ordering::Release);
        n
    }

    /// One exchange in flight until the guard is dropped (replay's exchanges; serve
    /// counts its own exchanges in flight).
    pub(crate) fn begin(&self) -> InFlight<'_> {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(&self.in_flight)
    }

    /// Count one ended exchange.
    pub(crate) fn observe(&self, o: &Observed<'_>) {
        let route = o.route.min(MAX_ROUTES);
        let class = match o.status {
            Some(s) => ((s / 100).clamp(1, 5) - 1) as usize,
            None => 5,
        };
        let outcome = Outcome::ALL
            .iter()
            .position(|x| *x == o.outcome)
            .unwrap_or(0);
        let cell = (route * STATUS_CLASSES.len() + class) * Outcome::ALL.len() + outcome;
        self.requests[cell].fetch_add(1, Ordering::Relaxed);
        if let Some(t) = o.total_us {
            self.duration.observe_us(t);
        }
        if let Some(t) = o.ttft_us {
            self.ttft.observe_us(t);
        }
        self.itl
            .observe_all_us(o.content_offsets_us.windows(2).map(|w| w[1] - w[0]));
    }

    /// Exchanges ended so far of each outcome, in [`Outcome::ALL`]'s order.
    fn per_outcome(&self) -> Vec<u64> {
        let mut by = vec![0u64; Outcome::ALL.len()];
        for (i, c) in self.requests.iter().enumerate() {
            by[i % Outcome::ALL.len()] += c.load(Ordering::Relaxed);
        }
        by
    }

    /// Exchanges ended so far, and how many of each outcome that has any (`ok`
    /// included): serve's live line and its end-of-run counts.
    pub(crate) fn by_outcome(&self) -> (u64, BTreeMap<Outcome, u64>) {
        let by = self.per_outcome();
        let total = by.iter().sum();
        let seen = Outcome::ALL
            .iter()
            .zip(by)
            .filter(|(_, n)| *n > 0)
            .map(|(o, n)| (*o, n))
            .collect();
        (total, seen)
    }

    /// Exchanges ended so far, and those of each failure kind (`ok` left out).
    pub(crate) fn totals(&self) -> (u64, Vec<(Outcome, u64)>) {
        let by = self.per_outcome();
        let total = by.iter().sum();
        let failures = Outcome::ALL
            .iter()
            .zip(by)
            .filter(|(o, n)| **o != Outcome::Ok && *n > 0)
            .map(|(o, n)| (*o, n))
            .collect();
        (total, failures)
    }

    /// replay's live progress line, given the exchanges ended per second lately: that
    /// rate, p50 and p95 so far as histogram bucket bounds (labelled approximate), and
    /// the failures so far by kind.
    pub(crate) fn live_text(&self, rate: f64) -> String {
        let bound = |pct| match self.duration.quantile_bound(pct) {
            None => "-".to_string(),
            Some(s) if s.is_infinite() => "> 300 s".to_string(),
            Some(s) => format!("<= {} ms", (s * 1e6).round() / 1e3),
        };
        let (_, failures) = self.totals();
        let failed = if failures.is_empty() {
            "none".to_string()
        } else {
            let kinds: Vec<String> = failures
                .iter()
                .map(|(o, n)| format!("{} {n}", o.as_str()))
                .collect();
            kinds.join(", ")
        };
        format!(
            "{rate:.1} req/s (last second); latency p50 {}, p95 {} (histogram buckets, every phase so far); failures: {failed}",
            bound(50),
            bound(95)
        )
    }

    /// The exposition text (format 0.0.4).
    pub(crate) fn render(&self) -> String {
        let mut out = String::with_capacity(8 << 10);
        out.push_str("# HELP matrix_proxy_requests_total Exchanges ended, by route (method and path without the query; the first 32, later ones as other), the worker's status class (none: no response head) and outcome.\n# TYPE matrix_proxy_requests_total counter\n");
        let n_out = Outcome::ALL.len();
        for (cell, c) in self.requests.iter().enumerate() {
            let v = c.load(Ordering::Relaxed);
            if v == 0 {
                continue;
            }
            let (route, rest) = (
                cell / (STATUS_CLASSES.len() * n_out),
                cell % (STATUS_CLASSES.len() * n_out),
            );
            let label = self
                .routes
                .get(route)
                .and_then(OnceLock::get)
                .map_or_else(|| "other".to_string(), |(m, p)| format!("{m} {p}"));
            let _ = writeln!(
                out,
                "matrix_proxy_requests_total{{route=\"{}\",status_class=\"{}\",outcome=\"{}\"}} {v}",
                escape_label(&label),
                STATUS_CLASSES[rest / n_out],
                Outcome::ALL[rest % n_out].as_str()
            );
        }
        self.duration.render(
            &mut out,
            "matrix_proxy_request_duration_seconds",
            "Start of the exchange to the last body byte (total_us), every exchange with a duration.",
        );
        self.ttft.render(
            &mut out,
            "matrix_proxy_time_to_first_token_seconds",
            "Time to the first content event of event streams (ttft_us).",
        );
        self.itl.render(
            &mut out,
            "matrix_proxy_inter_token_latency_seconds",
            "Gaps between consecutive content events of event streams.",
        );
        let in_flight = match self.in_flight_source.get() {
            Some(read) => read(),
            None => self.in_flight.load(Ordering::Relaxed) as f64,
        };
        let _ = writeln!(
            out,
            "# HELP matrix_proxy_in_flight_requests Exchanges begun and not yet ended.\n# TYPE matrix_proxy_in_flight_requests gauge\nmatrix_proxy_in_flight_requests {in_flight}"
        );
        if let Ok(sources) = self.sources.lock() {
            for (name, help, kind, value) in sources.iter() {
                let kind = match kind {
                    Kind::Counter => "counter",
                    Kind::Gauge => "gauge",
                };
                let _ = writeln!(
                    out,
                    "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {}",
                    value()
                );
            }
        }
        out
    }
}

/// An exchange counted in flight; dropped, it is not.
pub(crate) struct InFlight<'a>(&'a AtomicI64);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A label value as the exposition format writes it: `\`, `"` and newlines escaped.
fn escape_label(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => o.push_str("\\\\"),
            '"' => o.push_str("\\\""),
            '\n' => o.push_str("\\n"),
            _ => o.push(c),
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(t: &Telemetry, method: &str, url: &str, total_us: i64) -> Observed<'static> {
        Observed {
            route: t.route_id(method, url),
            status: Some(200),
            outcome: Outcome::Ok,
            total_us: Some(total_us),
            ttft_us: None,
            content_offsets_us: &[],
        }
    }

    #[test]
    fn histogram_buckets_are_cumulative_and_inf_is_the_count() {
        let t = Telemetry::new();
        for us in [500, 1_000, 1_001, 7_000, 400_000_000] {
            t.observe(&ok(&t, "POST", "/v1/x", us));
        }
        let text = t.render();
        assert!(
            text.contains("matrix_proxy_request_duration_seconds_bucket{le=\"0.001\"} 2\n"),
            "{text}"
        );
        assert!(text.contains("matrix_proxy_request_duration_seconds_bucket{le=\"0.0025\"} 3\n"));
        assert!(text.contains("matrix_proxy_request_duration_seconds_bucket{le=\"0.01\"} 4\n"));
        assert!(text.contains("matrix_proxy_request_duration_seconds_bucket{le=\"300\"} 4\n"));
        assert!(text.contains("matrix_proxy_request_duration_seconds_bucket{le=\"+Inf\"} 5\n"));
        assert!(text.contains("matrix_proxy_request_duration_seconds_count 5\n"));
        assert!(text.contains("matrix_proxy_requests_total{route=\"POST /v1/x\",status_class=\"2xx\",outcome=\"ok\"} 5\n"));
        // Nearest rank 50 of 5 is the 3rd: the 2.5 ms bucket; p95 is past every bound.
        assert_eq!(t.duration.quantile_bound(50), Some(0.0025));
        assert_eq!(t.duration.quantile_bound(95), Some(f64::INFINITY));
    }

    #[test]
    fn the_live_line_says_rate_bounds_and_failures() {
        let t = Telemetry::new();
        assert_eq!(
            t.live_text(0.0),
            "0.0 req/s (last second); latency p50 -, p95 - (histogram buckets, every phase so far); failures: none"
        );
        for us in [2_000, 2_100, 2_200, 40_000] {
            t.observe(&ok(&t, "POST", "/v1/x", us));
        }
        let mut timeout = ok(&t, "POST", "/v1/x", 0);
        timeout.outcome = Outcome::Timeout;
        timeout.total_us = None;
        t.observe(&timeout);
        t.observe(&timeout);
        assert_eq!(
            t.live_text(12.34),
            "12.3 req/s (last second); latency p50 <= 2.5 ms, p95 <= 50 ms (histogram buckets, every phase so far); failures: timeout 2"
        );
    }

    #[test]
    fn a_batch_of_gaps_counts_as_each_gap_alone() {
        let (one, all) = (Histogram::new(ITL_BUCKETS), Histogram::new(ITL_BUCKETS));
        let gaps = [-3, 0, 400, 1_000, 1_001, 60_000, 3_000_000, 700];
        for g in gaps {
            one.observe_us(g);
        }
        all.observe_all_us(gaps.into_iter());
        let (mut a, mut b) = (String::new(), String::new());
        one.render(&mut a, "x", "h");
        all.render(&mut b, "x", "h");
        assert_eq!(a, b);
        assert!(b.contains("x_count 8\n"), "{b}");
    }

    #[test]
    fn routes_are_capped_and_labels_escaped() {
        let t = Telemetry::new();
        for i in 0..40 {
            t.observe(&ok(&t, "GET", &format!("http://h/p{i}?secret=1"), 10));
        }
        t.observe(&ok(&t, "GET", "/a\"b\\c\nd", 10));
        let text = t.render();
        assert_eq!(
            text.matches("matrix_proxy_requests_total{").count(),
            33,
            "{text}"
        );
        assert!(text.contains("route=\"other\",status_class=\"2xx\",outcome=\"ok\"} 9\n"));
        assert!(!text.contains("secret"));
        let t = Telemetry::new();
        t.observe(&ok(&t, "GET", "/a\"b\\c\nd", 10));
        assert!(t.render().contains("route=\"GET /a\\\"b\\\\c\\nd\""));
    }
}
