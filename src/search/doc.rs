//! search.json: every probe of every search (per arm and case), the answer and why the
//! search stopped. Typed as every run document is; serialised by the run, read back by
//! the report and the campaign's capacity gate. Imports nothing else from `search/`.

use serde::{Deserialize, Serialize};

/// A probe's, an SLO's or the good share's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Verdict {
    /// Every upper bound meets its SLO.
    Pass,
    /// A lower bound breaks an SLO.
    Fail,
    /// Neither: the bound's interval holds the SLO's value.
    Straddle,
    /// The generator could not hold the load: nothing about the server is read from it.
    Saturated,
}

impl Verdict {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Verdict::Pass => "pass",
            Verdict::Fail => "fail",
            Verdict::Straddle => "straddle",
            Verdict::Saturated => "saturated",
        }
    }
}

/// Why a probe ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Step {
    /// Doubling up from the first load (or halving down when it failed).
    Bracket,
    /// Between the last pass and the first fail.
    Bisect,
    /// The same load again after a straddle, its samples pooled with the first run's.
    Extend,
    /// The best pass or the first fail repeated, interleaved, at the end.
    Confirm,
}

impl Step {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Step::Bracket => "bracket",
            Step::Bisect => "bisect",
            Step::Extend => "extend",
            Step::Confirm => "confirm",
        }
    }
}

/// One SLO's bound in one probe.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct SloDoc {
    /// As given (`ttft_p99<=500ms`).
    pub(crate) slo: String,
    pub(crate) bound_ms: f64,
    /// Requests with a value (every request; for TPOT, those that reported one).
    pub(crate) samples: u64,
    /// The nearest-rank percentile; null when it is a failed request.
    pub(crate) estimate_ms: Option<f64>,
    /// The order statistic at the lower rank (0 without one); null when it is a failure.
    pub(crate) lower_ms: Option<f64>,
    /// The order statistic at the upper rank; null when the rank is past the samples or
    /// it is a failure (no upper bound: the probe cannot pass on this SLO).
    pub(crate) upper_ms: Option<f64>,
    /// The 1-based ranks of the bound's order statistics.
    pub(crate) ranks: [Option<u64>; 2],
    pub(crate) verdict: Verdict,
}

impl SloDoc {
    /// `22.0 [21.9, 22.1]`: the estimate and its bound in ms, `-` where there is none.
    pub(crate) fn bounds_text(&self) -> String {
        let ms = |v: Option<f64>| v.map_or("-".to_string(), |x| format!("{x:.1}"));
        format!(
            "{} [{}, {}]",
            ms(self.estimate_ms),
            ms(self.lower_ms),
            ms(self.upper_ms)
        )
    }
}

/// The share of a probe's requests meeting every bound at once.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct GoodShareDoc {
    pub(crate) good: u64,
    pub(crate) requests: u64,
    pub(crate) share: Option<f64>,
    /// Its exact (Clopper-Pearson) interval at the statement's confidence.
    pub(crate) lower: f64,
    pub(crate) upper: f64,
    /// `--good-share-min`.
    pub(crate) min: f64,
    pub(crate) verdict: Verdict,
}

/// One probe: a load run for its planned requests and judged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct ProbeDoc {
    /// From 1, in run order within its search.
    pub(crate) index: usize,
    pub(crate) step: Step,
    /// The concurrency or the rate per second.
    pub(crate) load: f64,
    /// The probe's measured round (`repetition` in rounds and rows at its level).
    pub(crate) repetition: usize,
    pub(crate) planned_requests: u64,
    pub(crate) attempted_requests: u64,
    pub(crate) successful_requests: u64,
    /// Requests judged: this probe's, plus the first run's after an extension.
    pub(crate) judged_requests: u64,
    pub(crate) elapsed_seconds: f64,
    pub(crate) successful_requests_per_second: Option<f64>,
    /// Good requests (meeting every bound at once) per second of the probe.
    pub(crate) goodput_per_second: Option<f64>,
    /// Why the generator is not trusted at this load (null: it held it).
    pub(crate) saturation: Option<String>,
    pub(crate) slos: Vec<SloDoc>,
    pub(crate) good_share: Option<GoodShareDoc>,
    pub(crate) verdict: Verdict,
    /// What the search made of it when that is not its verdict alone.
    pub(crate) note: Option<String>,
}

/// Why a search stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum StopReason {
    /// The knee is bracketed to its resolution and confirmed (or said not to be).
    Found,
    /// The lowest load probed failed.
    NoPassingLoad,
    /// The generator saturated before any SLO failed: the server's limit was not found.
    GeneratorSaturated,
    /// Every probe up to the highest load the search may ask for passed.
    Ceiling,
    /// `--budget-seconds` cannot hold the next probe.
    Budget,
    /// The next rate probe would last more than a day.
    ProbeTooLong,
    /// The arm stopped (its failure under `on_failure: stop`, its server's exit, Ctrl-C).
    Stopped,
}

impl StopReason {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            StopReason::Found => "found",
            StopReason::NoPassingLoad => "no_passing_load",
            StopReason::GeneratorSaturated => "generator_saturated",
            StopReason::Ceiling => "ceiling",
            StopReason::Budget => "budget",
            StopReason::ProbeTooLong => "probe_too_long",
            StopReason::Stopped => "stopped",
        }
    }
}

/// The operating point: the highest passing load, bracketed below the first fail.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Answer {
    /// The highest load that passed.
    pub(crate) load: f64,
    /// The lowest load that failed above it (null: none did; see `saturated_at`).
    pub(crate) first_fail: Option<f64>,
    /// The lowest load at which the generator saturated, if any (never the answer).
    pub(crate) saturated_at: Option<f64>,
    /// Whether every confirmation repeat agreed (the pass passed, the fail failed).
    pub(crate) confirmed: bool,
    /// The confirmation repeats' verdicts, in run order (`8:pass`, `9:fail`, ...).
    pub(crate) confirmations: Vec<String>,
    /// The repeats the confirmation planned (more than ran: it was cut, by the budget or
    /// the arm's stop).
    pub(crate) confirmations_planned: usize,
}

/// One search: an arm's (a campaign's) case.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct SearchRun {
    pub(crate) arm: Option<String>,
    pub(crate) case: String,
    /// Requests each probe plans for its statistics (the most any SLO needs); a
    /// concurrency probe plans at least 10 per worker (each probe's `planned_requests`).
    pub(crate) planned_requests_per_probe: u64,
    pub(crate) probes: Vec<ProbeDoc>,
    /// The highest passing and lowest failing load seen (whatever the search reached).
    pub(crate) last_pass: Option<f64>,
    pub(crate) first_fail: Option<f64>,
    /// Null when the search did not reach one (`stopped` says why).
    pub(crate) answer: Option<Answer>,
    pub(crate) stopped: StopReason,
    /// The stop in words, with what could not be decided.
    pub(crate) stopped_because: String,
    pub(crate) elapsed_seconds: f64,
}

/// search.json.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct SearchDoc {
    /// `rate` or `concurrency`.
    pub(crate) kind: crate::config::search::SearchKind,
    pub(crate) slos: Vec<String>,
    pub(crate) confidence: f64,
    /// Each SLO's (and the good share's) confidence under Bonferroni.
    pub(crate) statement_confidence: f64,
    pub(crate) margin: f64,
    pub(crate) good_share_min: Option<f64>,
    pub(crate) budget_seconds: Option<f64>,
    pub(crate) searches: Vec<SearchRun>,
}
