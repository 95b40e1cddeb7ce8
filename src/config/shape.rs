//! [`Shape`]: what a command's flags make of a validated plan for one run, beside the plan
//! (which stays as validated): `--sweep N` of a closed loop, one shard of an open loop
//! (`--shard I/N`), or the shards merged again by `summarize`. A sweep and a shard
//! together cannot be represented; each constructor checks the plan it shapes.

use super::load::shard_share;
use super::plan::Plan;
use super::search::SearchKind;
use crate::model::Level;

/// How one run shapes its plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Shape {
    /// The plan as written.
    #[default]
    Plain,
    /// `replay --sweep N` of a closed-loop plan: per case a closed round at c = 1, one at
    /// the highest concurrency, then N open-loop rates between their throughputs.
    Sweep(usize),
    /// `replay --shard I/N` of an open-loop plan: this process's share of every open
    /// round is the arrivals whose index is I modulo N.
    Shard { index: usize, count: usize },
    /// A sharded run merged by `summarize`: every round whole, and each of `count`
    /// shards sent its own prelude (health GET, readiness, warm-up).
    Merged { count: usize },
    /// `replay --search`: the plan's prelude, then per case the probes the search chooses
    /// as it goes (none of the plan's own levels).
    Search(SearchKind),
}

/// Why `--sweep` or `--shard` does not go with a plan (with the fix).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ShapeError {
    /// `--sweep 0`.
    #[error(
        "--sweep 0: give the number of open-loop rates to place between the synchronous rate and the throughput probe (1 or more; GuideLLM's default is 10)"
    )]
    SweepZero,
    /// `--sweep N` with N over 100.
    #[error("--sweep {0}: at most 100 rates (each runs the plan's repetitions)")]
    SweepTooMany(usize),
    /// `--sweep` with a campaign plan.
    #[error(
        "--sweep does not go with a campaign plan: sweep each arm's endpoint with a plain plan"
    )]
    SweepCampaign,
    /// `--sweep` with an open-loop plan.
    #[error(
        "--sweep goes with a closed-loop plan: it measures the synchronous rate (c = 1) and the throughput at the plan's highest concurrency, then places open-loop rates between them; this plan has load.mode \"{0}\" and its own arrivals"
    )]
    SweepOpenLoop(&'static str),
    /// `--sweep` with a plan whose highest concurrency is 1.
    #[error(
        "--sweep needs a plan whose highest concurrency is 2 or more: the throughput probe runs at it, and the synchronous round at 1"
    )]
    SweepLowConcurrency,
    /// `--sweep` with a plan whose cases hold sessions.
    #[error(
        "--sweep does not go with sessions yet: its feasibility and throughput probes size rates of single requests, not of sessions; run the plan's own levels (concurrency, load.rates_per_second or a trace)"
    )]
    SweepSessions,
    /// `--shard` with a plan whose cases hold sessions.
    #[error(
        "--shard does not go with sessions yet: a shard's share of the arrivals would split no session, but the shards' session runs, planned turns and stop notes are not merged by summarize; run sessions unsharded"
    )]
    ShardSessions,
    /// `--search` with a trace plan.
    #[error(
        "--search does not go with a trace plan: a trace sends its own arrivals at their recorded times; search with a plan of cases (freeze the trace's run without --keep-timing)"
    )]
    SearchTrace,
    /// `--search` with a plan whose cases hold sessions.
    #[error(
        "--search does not go with sessions yet: its probes size loads of single requests, and a session's turns are not independent samples of a percentile; run the plan's own levels"
    )]
    SearchSessions,
    /// `--search rate` with a campaign plan.
    #[error(
        "--search rate does not go with a campaign plan: a campaign's arms run closed loops; use --search concurrency"
    )]
    SearchRateCampaign,
    /// `--shard` with a closed-loop plan.
    #[error(
        "--shard goes with an open-loop plan (load.mode \"open\" or \"trace\"): closed-loop workers cannot be split across machines without a barrier per round"
    )]
    ShardClosedLoop,
}

/// The CLI's usage errors are its message (exit code 2).
impl From<ShapeError> for String {
    fn from(e: ShapeError) -> String {
        e.to_string()
    }
}

impl Shape {
    /// `--sweep N` for `plan`: refused (with the reason and the fix) unless `plan` is a
    /// plain closed-loop plan whose highest concurrency is 2 or more, and N is 1 to 100.
    pub(crate) fn sweep(plan: &Plan, n: usize) -> Result<Shape, ShapeError> {
        if n == 0 {
            return Err(ShapeError::SweepZero);
        }
        if n > 100 {
            return Err(ShapeError::SweepTooMany(n));
        }
        if plan.campaign.is_some() {
            return Err(ShapeError::SweepCampaign);
        }
        if plan.load.mode.is_open() {
            return Err(ShapeError::SweepOpenLoop(plan.load.mode.as_str()));
        }
        if plan.cases.iter().any(|c| c.sessions.is_some()) {
            return Err(ShapeError::SweepSessions);
        }
        if plan.concurrency.iter().all(|&c| c < 2) {
            return Err(ShapeError::SweepLowConcurrency);
        }
        Ok(Shape::Sweep(n))
    }

    /// `--search KIND` for `plan`: refused (with the reason) for a trace plan, sessions,
    /// and a rate search of a campaign.
    pub(crate) fn search(plan: &Plan, kind: SearchKind) -> Result<Shape, ShapeError> {
        if plan.load.trace.is_some() {
            return Err(ShapeError::SearchTrace);
        }
        if plan.cases.iter().any(|c| c.sessions.is_some()) {
            return Err(ShapeError::SearchSessions);
        }
        if plan.campaign.is_some() && kind == SearchKind::Rate {
            return Err(ShapeError::SearchRateCampaign);
        }
        Ok(Shape::Search(kind))
    }

    /// What a search varies, under `--search`.
    pub(crate) fn search_kind(self) -> Option<SearchKind> {
        match self {
            Shape::Search(k) => Some(k),
            _ => None,
        }
    }

    /// Whether the run's levels are the ones its rounds ran at (`--sweep`, `--search`),
    /// not the plan's.
    pub(crate) fn levels_from_rounds(self) -> bool {
        matches!(self, Shape::Sweep(_) | Shape::Search(_))
    }

    /// Shard `index` of `count` for `plan`: refused unless `plan` is an open loop.
    pub(crate) fn shard(plan: &Plan, index: usize, count: usize) -> Result<Shape, ShapeError> {
        if !plan.load.mode.is_open() {
            return Err(ShapeError::ShardClosedLoop);
        }
        if plan.cases.iter().any(|c| c.sessions.is_some()) {
            return Err(ShapeError::ShardSessions);
        }
        Ok(Shape::Shard { index, count })
    }

    /// The sweep's number of rates.
    pub(crate) fn sweep_rates(self) -> Option<usize> {
        match self {
            Shape::Sweep(n) => Some(n),
            _ => None,
        }
    }

    /// This process's shard: (index, count).
    pub(crate) fn shard_of(self) -> Option<(usize, usize)> {
        match self {
            Shape::Shard { index, count } => Some((index, count)),
            _ => None,
        }
    }

    /// Processes that each sent the prelude.
    pub(crate) fn preludes(self) -> u64 {
        match self {
            Shape::Merged { count } => count as u64,
            _ => 1,
        }
    }

    /// The health GET, readiness and warm-up of `plan`, as every process of the run (every shard of
    /// a merged run) sent them first.
    pub(crate) fn prelude_requests(self, plan: &Plan) -> u64 {
        // A trace's readiness is its window's first entry (every turn of the session
        // run it starts), and it has no warm-up per variant (its first seconds are its
        // warm-up, within its rounds).
        if let Some(t) = &plan.load.trace {
            let first = t.first_pick().map_or(1, |p| t.requests_of(p.entry));
            return (1 + first) * self.preludes();
        }
        let once = 1 + plan
            .cases
            .iter()
            .map(|c| c.variants.len() as u64 * (1 + plan.warmup_per_case as u64))
            .sum::<u64>();
        once * self.preludes()
    }

    /// Requests `plan` implies as this shape runs it, health GET included. An open loop's
    /// rounds are counted from their seeded schedules (a shard's: its share of them).
    pub(crate) fn planned_requests(self, plan: &Plan) -> u64 {
        let n = plan.requests_per_case as u64;
        if let Some(rates) = self.sweep_rates() {
            // Before the run the sweep's rates are unknown: at most n a feasibility wave.
            let max_c = plan.concurrency.iter().copied().max().unwrap_or(1) as u64;
            let per_case =
                1 + n + max_c.min(n) + n + rates as u64 * (n + plan.repetitions as u64 * n);
            return self.prelude_requests(plan) + plan.cases.len() as u64 * per_case;
        }
        let mut total = self.prelude_requests(plan);
        if self.search_kind().is_some() {
            // The probes are planned as the search goes (each says its own count).
            return total;
        }
        if let Some(t) = &plan.load.trace {
            // Every round sends the window (its warm-up seconds included).
            let picks = t.picks(self.shard_of());
            let per_round: u64 = picks.iter().map(|p| t.requests_of(p.entry)).sum();
            return total + plan.repetitions as u64 * per_round;
        }
        for (ci, case) in plan.cases.iter().enumerate() {
            for (li, level) in plan.levels().into_iter().enumerate() {
                total += match level {
                    Level::Concurrency(c) => {
                        case.requests_of(c.min(plan.requests_per_case))
                            + plan.repetitions as u64 * case.requests_of(plan.requests_per_case)
                    }
                    Level::Rate(r) => (0..plan.repetitions)
                        .map(Some)
                        .chain([None])
                        .map(|rep| {
                            let n = shard_share(
                                plan.load.schedule(r, ci, li, rep).len(),
                                self.shard_of(),
                            );
                            case.requests_of(n as usize)
                        })
                        .sum(),
                };
            }
        }
        total
    }
}
