//! `replay --search` in the driver: one (arm, case)'s [`Search`] run probe by probe. A
//! probe is the level's feasibility wave (excluded; it opens the level's connections and
//! gives the pace the budget is checked at), then one measured round of the probe's
//! planned requests: a closed wave at the concurrency, or the plan's arrival process at
//! the rate (`requests` arrivals on the seeded stream of the probe's index). The rounds go
//! to summary.json and rounds.parquet as any measured round; the search's verdicts to
//! search.json. `arms.rs` interleaves the arms' searches probe by probe.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::ctx::{Base, Ctx};
use super::phases::{At, Measured, Senders, feasibility, label, measured_round};
use crate::clock;
use crate::config::search::SearchKind;
use crate::metrics::{PhaseCounts, Sample};
use crate::model::{Level, Phase};
use crate::search::doc::{SearchRun, StopReason};
use crate::search::judge::RequestView;
use crate::search::{Ask, ProbeFacts, Search, named};

/// One (arm, case)'s search and what the driver keeps beside it: the budget's end, the
/// pace seen so far, the repetitions taken at each level.
pub(super) struct ArmSearch {
    search: Search,
    ci: usize,
    budget_seconds: Option<f64>,
    /// Median exchange time of the latest probe or feasibility wave, in seconds.
    pace_s: Option<f64>,
    /// Probes run so far (a rate probe's schedule stream).
    probes: usize,
    /// Rounds taken at each level (the next probe's repetition there).
    reps: BTreeMap<u64, usize>,
}

impl ArmSearch {
    pub(super) fn new(base: &Base, ctx: &Ctx, ci: usize) -> Option<ArmSearch> {
        let spec = base.search.as_ref()?;
        Some(ArmSearch {
            search: Search::new(spec, ctx.arm.as_deref(), &ctx.plan.cases[ci].name),
            ci,
            budget_seconds: spec.budget.map(|b| b.as_secs_f64()),
            pace_s: None,
            probes: 0,
            reps: BTreeMap::new(),
        })
    }

    /// The next probe, as the driver runs it; `None` once the search has stopped.
    pub(super) fn next(&mut self) -> Option<(Ask, At, usize)> {
        let ask = self.search.next()?;
        let level = crate::search::level(self.search.kind(), ask.load);
        let rep = *self.reps.get(&ask.load.to_bits()).unwrap_or(&0);
        let at = At {
            ci: self.ci,
            level,
            li: self.probes,
            requests: Some(ask.requests as usize),
        };
        Some((ask, at, rep))
    }

    /// The arm stopped: the search ends, saying so.
    pub(super) fn arm_stopped(&mut self) {
        self.search.stop(
            StopReason::Stopped,
            format!(
                "the arm stopped before the search ended (a failure under on_failure: stop, its server's exit, or Ctrl-C); {}",
                self.search.undecided()
            ),
        );
    }

    /// Seconds of `--budget-seconds` left (`None`: no budget): the budget less the time
    /// every search of the run has spent in its probes (their feasibility waves and
    /// measured rounds; never an arm's start-up or prelude).
    fn left_s(&self, base: &Base) -> Option<f64> {
        let budget = self.budget_seconds?;
        let spent = base.search_spent_ns.load(Ordering::Relaxed) as f64 / 1e9;
        Some(budget - spent)
    }

    /// Whether the probe `ask` may start at all: a rate probe of at most a day, and some
    /// budget left; when not, the search stops saying what it could not decide.
    fn may_start(&mut self, base: &Base, ask: Ask) -> bool {
        if self.search.kind() == SearchKind::Rate && ask.requests as f64 / ask.load > DAY_S {
            let why = format!(
                "the probe at {} needs {} requests, more than a day at that rate",
                self.search.named(ask.load),
                ask.requests,
            );
            return self.stop(StopReason::ProbeTooLong, why);
        }
        match self.left_s(base) {
            Some(left) if left <= 0.0 => {
                let why = format!(
                    "--budget-seconds {} was spent before the probe at {}",
                    self.budget_seconds.unwrap_or_default(),
                    self.search.named(ask.load),
                );
                self.stop(StopReason::Budget, why)
            }
            _ => true,
        }
    }

    /// Stop the search for `reason`: `why`, then what it could not decide. Always `false`
    /// (the probe does not start).
    fn stop(&mut self, reason: StopReason, why: String) -> bool {
        let because = format!("{why}: {}", self.search.undecided());
        self.search.stop(reason, because);
        false
    }

    /// Whether `--budget-seconds` holds the probe `ask`'s measured round at the pace
    /// seen; when not, the search stops saying what it could not decide.
    fn fits(&mut self, base: &Base, ask: Ask) -> bool {
        let (Some(left), Some(budget)) = (self.left_s(base), self.budget_seconds) else {
            return true;
        };
        let n = ask.requests as f64;
        let (need, at_pace) = match (self.search.kind(), self.pace_s) {
            (SearchKind::Rate, pace) => (n / ask.load + pace.unwrap_or(0.0), String::new()),
            (SearchKind::Concurrency, Some(p)) => (
                n * p / ask.load,
                format!(" at the median exchange time measured, {:.0} ms", p * 1e3),
            ),
            (SearchKind::Concurrency, None) => return left > 0.0,
        };
        if need <= left {
            return true;
        }
        let why = format!(
            "the probe at {} needs {} requests, about {need:.1} s{at_pace}, and {left:.1} s of --budget-seconds {budget} are left",
            self.search.named(ask.load),
            ask.requests,
        );
        self.stop(StopReason::Budget, why)
    }

    /// What the probe measured, judged.
    fn observe(&mut self, ask: Ask, rep: usize, m: &Measured) {
        let views: Vec<RequestView> = m.samples.iter().map(RequestView::of).collect();
        let r = &m.round;
        // A stray late send (a scheduler hiccup) is in its request's latency from the
        // schedule, which counts against the SLO; more than 1 % of them late means the
        // load offered was not the load asked for.
        let late = r
            .open
            .as_ref()
            .is_some_and(|o| o.late_sends * 100 > r.attempted_requests);
        let saturation = match (&r.open, &r.generator) {
            (Some(o), _) if late => Some(format!(
                "{} of {} sends (more than 1 %) fell more than {} ms behind their schedule",
                o.late_sends,
                r.attempted_requests,
                crate::metrics::SATURATION_LAG_US / 1000
            )),
            // The host's scheduling noise is in the times (against the SLO), not a limit.
            (_, Some(g)) if g.bottleneck => g.warning.clone(),
            _ => None,
        };
        self.pace_s = r.total_us.p50.map(|us| us as f64 / 1e6).or(self.pace_s);
        let facts = ProbeFacts {
            repetition: rep,
            attempted: r.attempted_requests,
            successful: r.successful_requests,
            elapsed_seconds: r.elapsed_seconds,
            wait_in_latency: late,
            saturation,
        };
        self.search.observe(ask, views, facts);
    }

    pub(super) fn finish(self) -> SearchRun {
        self.search.finish()
    }
}

/// The longest rate probe a search runs.
const DAY_S: f64 = 86_400.0;

/// A search's stop, on the progress display.
fn say_stop(ctx: &Ctx, s: &ArmSearch) {
    let line = format!("search: {}", s.search.stopped_because().unwrap_or_default());
    ctx.base.progress.println(label(ctx, &line));
}

/// Time since `t0_ns` spent in a probe, counted against `--budget-seconds`.
fn spent(ctx: &Ctx, t0_ns: u64) {
    let ns = clock::now_ns().saturating_sub(t0_ns);
    ctx.base.search_spent_ns.fetch_add(ns, Ordering::Relaxed);
}

/// The median exchange time of `samples`, in seconds.
fn median_s(samples: &[Sample]) -> Option<f64> {
    let t: Vec<i64> = samples.iter().filter_map(|s| s.total_us).collect();
    crate::metrics::Percentiles::of(t)
        .p50
        .map(|us| us as f64 / 1e6)
}

/// Run the search's next probe on one arm: the feasibility wave, the budget checked at
/// its pace, the measured round, judged. `None` when the probe's round did not run (the
/// budget, or the arm stopped).
pub(super) async fn probe(
    ctx: &Arc<Ctx>,
    senders: Senders<'_>,
    s: &mut ArmSearch,
    (ask, at, rep): (Ask, At, usize),
    excluded: &mut BTreeMap<Phase, PhaseCounts>,
) -> Option<Measured> {
    ctx.base.progress.set_message(label(
        ctx,
        &format!(
            "search {}: probe {}",
            ctx.case_names[at.ci],
            named(s.search.kind(), ask.load)
        ),
    ));
    let warm_planned = match at.level {
        Level::Concurrency(c) => c as u64,
        Level::Rate(r) => ctx.plan.load.schedule(r, at.ci, at.li, None).len() as u64,
    };
    if !s.may_start(&ctx.base, ask) {
        say_stop(ctx, s);
        return None;
    }
    ctx.base.progress.inc_length(warm_planned);
    let Senders { slots, pool } = senders;
    let t0 = clock::now_ns();
    let warm = feasibility(ctx, Senders { slots, pool }, at, excluded).await;
    spent(ctx, t0);
    s.pace_s = median_s(&warm).or(s.pace_s);
    if ctx.stopped() {
        s.arm_stopped();
        return None;
    }
    if !s.fits(&ctx.base, ask) {
        say_stop(ctx, s);
        return None;
    }
    ctx.base.progress.inc_length(ask.requests);
    let t0 = clock::now_ns();
    let m = measured_round(ctx, Senders { slots, pool }, at, rep).await;
    spent(ctx, t0);
    s.probes += 1;
    *s.reps.entry(ask.load.to_bits()).or_insert(0) += 1;
    if ctx.stopped() {
        s.arm_stopped();
        return Some(m);
    }
    s.observe(ask, rep, &m);
    if let Some(line) = s.search.last_line() {
        let case = &ctx.case_names[at.ci];
        ctx.base
            .progress
            .println(label(ctx, &format!("search {case}: {line}")));
    }
    Some(m)
}
