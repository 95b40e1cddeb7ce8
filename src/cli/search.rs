//! `replay --search` and its flags: read, checked against the plan, and resolved into the
//! run's [`SearchSpec`] before any output exists.

use clap::Args;

use super::io::{CliError, RESERVED_FDS, usage};
use crate::config::plan::Plan;
use crate::config::search::{self, SearchKind, SearchSpec};

/// The highest concurrency a search may probe (with what the open-file limit holds).
const MAX_SEARCH_CONCURRENCY: u64 = 4096;
/// The most requests one probe may plan (MLPerf's p99 at 99 % and ±0.05 % is about
/// 263,000).
const MAX_PROBE_REQUESTS: u64 = 1_000_000;
/// The highest rate a search may probe, per second.
const MAX_SEARCH_RATE: f64 = 1_000_000.0;

/// Find the operating point: the highest load the server holds within `--slo`.
#[derive(Args, Debug, Clone, Default)]
pub struct SearchArgs {
    /// Search the highest load that meets --slo: `rate` (open-loop arrivals, the plan's
    /// arrival process) or `concurrency` (closed loop). Doubles from the first load until
    /// a probe fails (or the generator saturates), bisects, then confirms the knee by
    /// repeating the best pass and the first fail, interleaved, twice each. Writes
    /// search.json. Replaces --sweep (refused together); not with --shard.
    #[arg(long, value_name = "KIND")]
    pub search: Option<String>,
    /// The SLOs a probe must meet, comma-separated bounds on per-request percentiles of
    /// ttft, tpot and e2e (from the scheduled send): "ttft_p99<=500ms,tpot_p50<=50ms,e2e_p95<=8s".
    #[arg(long, value_name = "SLOS")]
    pub slo: Option<String>,
    /// With --search: a passing probe's share of requests meeting every bound at once must
    /// have its lower confidence bound at or above this (0.95 is 95 %).
    #[arg(long, value_name = "SHARE", requires = "search")]
    pub good_share_min: Option<f64>,
    /// With --search: the confidence of a probe's verdict over all its SLOs together
    /// (Bonferroni: each SLO at 1 - (1 - c) / k).
    #[arg(long, value_name = "C", default_value_t = search::DEFAULT_CONFIDENCE, requires = "search")]
    pub confidence: f64,
    /// With --search: δ, the percentile bound's half-width in rank (a probe's requests are
    /// n = (z / δ)² p (1 - p); 0.01 is ±1 percentile point). At most 1 - p for each SLO.
    #[arg(long, value_name = "δ", default_value_t = search::DEFAULT_MARGIN, requires = "search")]
    pub margin: f64,
    /// With --search: cap the whole search at this many seconds; a probe the rest cannot
    /// hold (at the pace measured) is not started, and the search says what it could not
    /// decide.
    #[arg(long, value_name = "S", requires = "search")]
    pub budget_seconds: Option<f64>,
    /// With --search: the first probe's load (default: the plan's first concurrency, or
    /// its first rate; 1/s for a closed plan searched by rate).
    #[arg(long, value_name = "LOAD", requires = "search")]
    pub search_from: Option<f64>,
}

/// `--search` and its flags, checked against `plan`; `None` without `--search`.
pub(super) fn resolve(args: &SearchArgs, plan: &Plan) -> Result<Option<SearchSpec>, CliError> {
    let Some(kind) = &args.search else {
        if args.slo.is_some() {
            return Err(usage(search::SearchError::SloWithoutSearch.to_string()));
        }
        return Ok(None);
    };
    let kind = SearchKind::parse(kind).map_err(|e| usage(e.to_string()))?;
    let slos = search::parse_slos(args.slo.as_deref().unwrap_or_default())
        .map_err(|e| usage(e.to_string()))?;
    let from = args.search_from.unwrap_or_else(|| match kind {
        SearchKind::Concurrency => plan.concurrency.first().copied().unwrap_or(1) as f64,
        SearchKind::Rate => plan.load.rates_per_second.first().copied().unwrap_or(1.0),
    });
    let spec = SearchSpec {
        kind,
        slos,
        good_share_min: args.good_share_min,
        confidence: args.confidence,
        margin: args.margin,
        budget: search::budget(args.budget_seconds).map_err(|e| usage(e.to_string()))?,
        from,
        ceiling: ceiling(kind),
    };
    let spec = spec.check().map_err(|e| usage(e.to_string()))?;
    let n = crate::search::judge::planned_requests(&spec);
    if n > MAX_PROBE_REQUESTS {
        return Err(usage(format!(
            "--margin {} with --slo {} asks for {n} requests a probe (n = (z / δ)² p (1 − p)); at most {MAX_PROBE_REQUESTS}: give a wider --margin or a lower --confidence",
            spec.margin,
            spec.slo_text()
        )));
    }
    Ok(Some(spec))
}

/// What `--search` does not go with, with the fix.
pub(super) fn conflicts(args: &SearchArgs, sweep: bool, shard: bool) -> Result<(), CliError> {
    if args.search.is_none() {
        return Ok(());
    }
    if sweep {
        return Err(usage(
            "--search replaces --sweep: give one (the search chooses its own loads; a sweep places rates between two measured throughputs)",
        ));
    }
    if shard {
        return Err(usage(
            "--search does not go with --shard: each probe's load follows from the last one's verdict, which the shards would have to agree on; search from one generator",
        ));
    }
    Ok(())
}

/// The highest load a probe may ask for: a concurrency the open-file limit holds (one
/// socket per worker, two with the in-process mock: counted as two here), or a rate.
fn ceiling(kind: SearchKind) -> f64 {
    match kind {
        SearchKind::Rate => MAX_SEARCH_RATE,
        SearchKind::Concurrency => {
            let wanted = MAX_SEARCH_CONCURRENCY * 2 + RESERVED_FDS;
            let limit = rlimit::increase_nofile_limit(wanted).unwrap_or(wanted);
            (limit.saturating_sub(RESERVED_FDS) / 2).clamp(1, MAX_SEARCH_CONCURRENCY) as f64
        }
    }
}
