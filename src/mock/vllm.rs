//! The mock worker's `/metrics`: vLLM-compatible names (the V1 engine's, as vLLM 0.10
//! exports them) from the mock's real state, so scraping a worker is tested without a
//! GPU. Gauges are read at scrape time; histograms observe each request as the mock
//! serves it, timed on the mock's side (arrival to first token, arrival to last byte).
//! Its KV cache holds [`KV_SEQUENCES`] sequences (use = running / that); its prefix cache
//! holds whole prompts (a prompt served before is all hits, counted in tokens); it never
//! preempts (the counter stays 0).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// vLLM's bucket bounds (seconds) for time to first token.
const TTFT_BOUNDS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
/// ... for time per output token.
const TPOT_BOUNDS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
/// ... for end-to-end request latency.
const E2E_BOUNDS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

/// A histogram of seconds: a count per bucket (not cumulative), the sum in nanoseconds.
struct Histogram {
    bounds: &'static [f64],
    counts: Vec<AtomicU64>,
    sum_ns: AtomicU64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_ns: AtomicU64::new(0),
        }
    }

    fn observe_ns(&self, ns: u64) {
        let secs = ns as f64 / 1e9;
        let i = self
            .bounds
            .iter()
            .position(|b| secs <= *b)
            .unwrap_or(self.bounds.len());
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    fn write(&self, out: &mut String, name: &str, help: &str, labels: &str) {
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} histogram\n"));
        let mut cumulative = 0u64;
        for (i, c) in self.counts.iter().enumerate() {
            cumulative += c.load(Ordering::Relaxed);
            let le = self
                .bounds
                .get(i)
                .map_or_else(|| "+Inf".to_string(), |b| format!("{b:?}"));
            out.push_str(&format!(
                "{name}_bucket{{le=\"{le}\",{labels}}} {cumulative}.0\n"
            ));
        }
        let sum = self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        out.push_str(&format!("{name}_sum{{{labels}}} {sum:?}\n"));
        out.push_str(&format!("{name}_count{{{labels}}} {cumulative}.0\n"));
    }
}

/// What the mock exports.
pub(crate) struct Metrics {
    /// Requests holding a batch slot, and requests waiting for one.
    pub(crate) running: AtomicU64,
    pub(crate) waiting: AtomicU64,
    success: AtomicU64,
    prompt_tokens: AtomicU64,
    generation_tokens: AtomicU64,
    ttft: Histogram,
    tpot: Histogram,
    e2e: Histogram,
    /// Prompt tokens looked up in the prefix cache, and those found: the mock caches
    /// whole prompts (a prompt seen before is all hits).
    prefix_queries: AtomicU64,
    prefix_hits: AtomicU64,
    seen: std::sync::Mutex<std::collections::HashSet<u64>>,
}

/// Sequences the mock's KV cache holds: its use is the running requests over this.
pub(crate) const KV_SEQUENCES: u64 = 256;
/// Prompts the mock's prefix cache remembers before it starts over.
const PREFIX_CACHE_PROMPTS: usize = 65_536;

/// The prefix cache's key of a prompt.
pub(crate) fn prompt_key(prompt: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    prompt.hash(&mut h);
    h.finish()
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics {
            running: AtomicU64::new(0),
            waiting: AtomicU64::new(0),
            success: AtomicU64::new(0),
            prompt_tokens: AtomicU64::new(0),
            generation_tokens: AtomicU64::new(0),
            ttft: Histogram::new(TTFT_BOUNDS),
            tpot: Histogram::new(TPOT_BOUNDS),
            e2e: Histogram::new(E2E_BOUNDS),
            prefix_queries: AtomicU64::new(0),
            prefix_hits: AtomicU64::new(0),
            seen: std::sync::Mutex::default(),
        }
    }
}

/// One served request's timings on the mock's side (nanoseconds since it arrived).
pub(crate) struct Served {
    pub(crate) ttft_ns: u64,
    pub(crate) e2e_ns: u64,
    pub(crate) prompt_tokens: u64,
    pub(crate) output_tokens: u64,
    /// [`prompt_key`] of its prompt.
    pub(crate) prompt_key: u64,
    /// The mock's prefix cache's hit, in tokens (`None`: no prefix cache, and the hits
    /// are whole repeated prompts).
    pub(crate) cached_tokens: Option<u64>,
}

impl Metrics {
    /// A request answered in full.
    pub(crate) fn served(&self, s: &Served) {
        self.success.fetch_add(1, Ordering::Relaxed);
        self.prompt_tokens
            .fetch_add(s.prompt_tokens, Ordering::Relaxed);
        self.generation_tokens
            .fetch_add(s.output_tokens, Ordering::Relaxed);
        self.ttft.observe_ns(s.ttft_ns);
        self.e2e.observe_ns(s.e2e_ns);
        self.prefix_queries
            .fetch_add(s.prompt_tokens, Ordering::Relaxed);
        if let Some(hit) = s.cached_tokens {
            self.prefix_hits.fetch_add(hit, Ordering::Relaxed);
        } else if let Ok(mut seen) = self.seen.lock() {
            if seen.len() >= PREFIX_CACHE_PROMPTS {
                seen.clear();
            }
            if !seen.insert(s.prompt_key) {
                self.prefix_hits
                    .fetch_add(s.prompt_tokens, Ordering::Relaxed);
            }
        }
        if s.output_tokens > 1 {
            self.tpot
                .observe_ns(s.e2e_ns.saturating_sub(s.ttft_ns) / (s.output_tokens - 1));
        }
    }

    /// The Prometheus text of everything, labelled with `model`.
    pub(crate) fn text(&self, model: &str) -> String {
        let labels = format!("model_name=\"{model}\"");
        let mut out = String::new();
        let mut gauge = |name: &str, help: &str, kind: &str, v: u64| {
            out.push_str(&format!(
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name}{{{labels}}} {v}.0\n"
            ));
        };
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        gauge(
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            "gauge",
            load(&self.running),
        );
        gauge(
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            "gauge",
            load(&self.waiting),
        );
        gauge(
            "vllm:prompt_tokens_total",
            "Number of prefill tokens processed.",
            "counter",
            load(&self.prompt_tokens),
        );
        gauge(
            "vllm:generation_tokens_total",
            "Number of generation tokens processed.",
            "counter",
            load(&self.generation_tokens),
        );
        gauge(
            "vllm:request_success_total",
            "Count of successfully processed requests.",
            "counter",
            load(&self.success),
        );
        gauge(
            "vllm:num_preemptions_total",
            "Cumulative number of preemption from the engine.",
            "counter",
            0,
        );
        gauge(
            "vllm:prefix_cache_queries_total",
            "Prefix cache queries, in terms of number of queried tokens.",
            "counter",
            load(&self.prefix_queries),
        );
        gauge(
            "vllm:prefix_cache_hits_total",
            "Prefix cache hits, in terms of number of cached tokens.",
            "counter",
            load(&self.prefix_hits),
        );
        let kv = load(&self.running) as f64 / KV_SEQUENCES as f64;
        out.push_str(&format!(
            "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{{{labels}}} {kv:?}\n"
        ));
        self.ttft.write(
            &mut out,
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            &labels,
        );
        self.tpot.write(
            &mut out,
            "vllm:time_per_output_token_seconds",
            "Histogram of time per output token in seconds.",
            &labels,
        );
        self.e2e.write(
            &mut out,
            "vllm:e2e_request_latency_seconds",
            "Histogram of end to end request latency in seconds.",
            &labels,
        );
        out
    }
}

/// Counts a request as waiting while it exists, then (after [`Slot::run`]) as running
/// until dropped.
pub(crate) struct Slot {
    metrics: Arc<Metrics>,
    running: bool,
}

impl Slot {
    pub(crate) fn waiting(metrics: Arc<Metrics>) -> Slot {
        metrics.waiting.fetch_add(1, Ordering::Relaxed);
        Slot {
            metrics,
            running: false,
        }
    }

    pub(crate) fn run(&mut self) {
        if !self.running {
            self.metrics.waiting.fetch_sub(1, Ordering::Relaxed);
            self.metrics.running.fetch_add(1, Ordering::Relaxed);
            self.running = true;
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let gauge = if self.running {
            &self.metrics.running
        } else {
            &self.metrics.waiting
        };
        gauge.fetch_sub(1, Ordering::Relaxed);
    }
}
