//! `replay --search`: the highest load a server holds within its SLOs, as a pure state
//! machine ([`Search`]) the replay driver asks for its next probe and tells what the probe
//! measured. Per (arm, case):
//!
//! 1. **Bracket**: double from the first load until a probe fails (or the generator
//!    saturates, or the ceiling is reached); when the first load fails, halve down to the
//!    lowest (concurrency 1, or 1/64 of the first rate) until one passes.
//! 2. **Bisect** between the last pass and the first fail until they are adjacent
//!    concurrencies, or rates within [`RATE_RESOLUTION`] of each other.
//! 3. **Confirm**: the best pass and the first fail again, interleaved, twice each.
//!
//! A straddling probe (neither pass nor fail, `judge`) runs once more with its samples
//! pooled; straddling still, it counts as a fail for bracketing and is said. A saturated
//! probe narrows the bracket from above but is never read as the server's limit.
//!
//! - [`judge`]: a probe's bounds and verdict; [`doc`]: search.json.

pub(crate) mod doc;
pub(crate) mod judge;

use crate::config::search::{SearchKind, SearchSpec};
use doc::{Answer, ProbeDoc, SearchRun, Step, StopReason, Verdict};
use judge::RequestView;

/// Rates within this share of each other end the bisection (5 %).
pub(crate) const RATE_RESOLUTION: f64 = 0.05;
/// The first rate is halved at most this many times (down to 1/64 of it).
const MAX_HALVINGS: u32 = 6;
/// A concurrency probe sends at least this many requests per worker.
pub(crate) const PER_WORKER: u64 = 10;
/// Each of the best pass and the first fail is repeated this many times at the end.
const CONFIRM_REPEATS: usize = 2;

/// A probe the search asks for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Ask {
    pub(crate) load: f64,
    pub(crate) requests: u64,
    pub(crate) step: Step,
}

/// What a probe's measured round said besides its requests.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct ProbeFacts {
    pub(crate) repetition: usize,
    pub(crate) attempted: u64,
    pub(crate) successful: u64,
    pub(crate) elapsed_seconds: f64,
    /// Why the generator did not hold the load (`None`: it did).
    pub(crate) saturation: Option<String>,
    /// The saturation is late open-loop sends, whose wait is in each request's latency
    /// from its schedule (a fail still fails); not the tool's CPU, which delays reading
    /// the answers and inflates the times themselves.
    pub(crate) wait_in_latency: bool,
}

enum Phase {
    Up(f64),
    Down(f64, u32),
    Bisect,
    Confirm(Vec<(f64, Verdict)>),
}

/// One search's state, from its first probe to its answer.
pub(crate) struct Search {
    spec: SearchSpec,
    arm: Option<String>,
    case: String,
    requests: u64,
    phase: Phase,
    /// A straddling probe's load and samples, waiting for its extension.
    extending: Option<(f64, Vec<RequestView>)>,
    pass: Option<f64>,
    fail: Option<f64>,
    saturated: Option<f64>,
    probes: Vec<ProbeDoc>,
    confirmations: Vec<(f64, Verdict, Verdict)>,
    stopped: Option<(StopReason, String)>,
    /// Why bracketing ended, kept for after the confirmation.
    ending: Option<(StopReason, String)>,
    elapsed_seconds: f64,
}

impl Search {
    pub(crate) fn new(spec: &SearchSpec, arm: Option<&str>, case: &str) -> Search {
        Search {
            requests: judge::planned_requests(spec),
            phase: Phase::Up(spec.from),
            spec: spec.clone(),
            arm: arm.map(str::to_string),
            case: case.to_string(),
            extending: None,
            pass: None,
            fail: None,
            saturated: None,
            probes: Vec::new(),
            confirmations: Vec::new(),
            stopped: None,
            ending: None,
            elapsed_seconds: 0.0,
        }
    }

    pub(crate) fn kind(&self) -> SearchKind {
        self.spec.kind
    }

    /// The probe to run next; `None` once the search has stopped.
    pub(crate) fn next(&self) -> Option<Ask> {
        if self.stopped.is_some() {
            return None;
        }
        let ask = |load: f64, step| Ask {
            load,
            requests: self.requests_at(load),
            step,
        };
        if let Some((load, _)) = &self.extending {
            return Some(ask(*load, Step::Extend));
        }
        match &self.phase {
            Phase::Up(l) | Phase::Down(l, _) => Some(ask(*l, Step::Bracket)),
            Phase::Bisect => Some(ask(self.midpoint()?, Step::Bisect)),
            Phase::Confirm(queue) => queue.first().map(|(l, _)| ask(*l, Step::Confirm)),
        }
    }

    /// What the search has not decided, in words (for a stop from outside).
    pub(crate) fn undecided(&self) -> String {
        if let (Some(p), Phase::Confirm(queue)) = (self.pass, &self.phase) {
            return format!(
                "the knee was bracketed ({} passed) but {} of its {} confirmation repeats did not run: the answer is unconfirmed",
                self.named(p),
                queue.len(),
                queue.len() + self.confirmations.len()
            );
        }
        match (self.pass, self.fail) {
            (None, None) => "the SLOs could not be decided at any load".to_string(),
            (Some(p), None) => format!(
                "{} passed; no failing load was found above it",
                self.named(p)
            ),
            (None, Some(f)) => format!(
                "{} failed; no passing load was found below it",
                self.named(f)
            ),
            (Some(p), Some(f)) => format!(
                "the knee lies between {} (passed) and {} (failed), not narrowed further",
                self.named(p),
                self.named(f)
            ),
        }
    }

    /// The latest probe's line for the progress display: its load, its SLOs' estimates
    /// with their bounds, and its verdict.
    pub(crate) fn last_line(&self) -> Option<String> {
        let p = self.probes.last()?;
        let slos: Vec<String> = p
            .slos
            .iter()
            .map(|s| format!("{} {} ms", s.slo, s.bounds_text()))
            .collect();
        Some(format!(
            "{} {} ({} requests): {}; {}",
            p.step.as_str(),
            self.named(p.load),
            p.judged_requests,
            slos.join(", "),
            p.verdict.as_str()
        ))
    }

    /// Why the search stopped, once it has.
    pub(crate) fn stopped_because(&self) -> Option<String> {
        self.stopped.as_ref().map(|(_, why)| why.clone())
    }

    /// Requests a probe at `load` plans: the statistics' n, and for a concurrency at
    /// least [`PER_WORKER`] per worker, so that the end of the probe (its last c requests
    /// running as the others finish, at less than c) is at most a tenth of it.
    fn requests_at(&self, load: f64) -> u64 {
        match self.spec.kind {
            SearchKind::Concurrency => self.requests.max(PER_WORKER * load as u64),
            SearchKind::Rate => self.requests,
        }
    }

    /// The search stops from outside (the budget, the arm's stop), with the reason.
    pub(crate) fn stop(&mut self, reason: StopReason, because: String) {
        if self.stopped.is_none() {
            self.stopped = Some((reason, because));
        }
    }

    /// What probe `ask` measured: its requests' views and its round's facts.
    pub(crate) fn observe(&mut self, ask: Ask, views: Vec<RequestView>, facts: ProbeFacts) {
        self.elapsed_seconds += facts.elapsed_seconds;
        let mut judged = views;
        if ask.step == Step::Extend
            && let Some((_, first)) = self.extending.take()
        {
            judged.extend(first);
        }
        let (slos, good_share, mut verdict) = judge::judge(&self.spec, &judged);
        let mut note = None;
        // A probe that fails while the generator held its sends back fails: its latencies
        // from the schedule already count the wait, and a real arrival would have waited
        // at least as long. One that would pass or straddle is not trusted, nor any
        // verdict of a probe whose generator's CPU was the limit (late reads inflate it).
        if facts.saturation.is_some() && !(verdict == Verdict::Fail && facts.wait_in_latency) {
            verdict = Verdict::Saturated;
        }
        let rate = |k: u64| (facts.elapsed_seconds > 0.0).then(|| k as f64 / facts.elapsed_seconds);
        // Over a pooled extension, goodput is the pooled good count over both runs' time.
        let pooled_seconds = match ask.step {
            Step::Extend => self.probes.last().map_or(0.0, |p| p.elapsed_seconds),
            _ => 0.0,
        } + facts.elapsed_seconds;
        let good = judged.iter().filter(|v| v.good(&self.spec.slos)).count();
        let goodput_per_second = (pooled_seconds > 0.0).then(|| good as f64 / pooled_seconds);
        match (ask.step, verdict) {
            (Step::Confirm, _) => self.confirmed(ask.load, verdict),
            (Step::Extend, Verdict::Straddle) => {
                note = Some(
                    "straddled again with its samples pooled: counted as a fail for bracketing"
                        .to_string(),
                );
                self.moved(ask.load, Verdict::Fail);
            }
            (_, Verdict::Straddle) => {
                note = Some("straddled: run once more, its samples pooled".to_string());
                self.extending = Some((ask.load, judged.clone()));
            }
            (_, v) => self.moved(ask.load, v),
        }
        self.probes.push(ProbeDoc {
            index: self.probes.len() + 1,
            step: ask.step,
            load: ask.load,
            repetition: facts.repetition,
            planned_requests: ask.requests,
            attempted_requests: facts.attempted,
            successful_requests: facts.successful,
            judged_requests: judged.len() as u64,
            elapsed_seconds: facts.elapsed_seconds,
            successful_requests_per_second: rate(facts.successful),
            goodput_per_second,
            saturation: facts.saturation,
            slos,
            good_share,
            verdict,
            note,
        });
    }

    /// A bracketing or bisecting probe's verdict moves the bracket.
    fn moved(&mut self, load: f64, v: Verdict) {
        match v {
            Verdict::Pass => self.pass = Some(self.pass.map_or(load, |p| p.max(load))),
            Verdict::Fail => self.fail = Some(self.fail.map_or(load, |f| f.min(load))),
            Verdict::Saturated => {
                self.saturated = Some(self.saturated.map_or(load, |s| s.min(load)));
            }
            Verdict::Straddle => {}
        }
        let passed = v == Verdict::Pass;
        self.phase = match std::mem::replace(&mut self.phase, Phase::Bisect) {
            Phase::Up(l) if passed && l >= self.spec.ceiling => {
                return self.confirm(
                    StopReason::Ceiling,
                    format!(
                        "every probe up to {} passed: the server's limit is above the highest load the search may ask for",
                        self.named(l)
                    ),
                );
            }
            Phase::Up(l) if passed => Phase::Up(self.up(l)),
            Phase::Up(l) if self.pass.is_none() => match self.down(l) {
                Some(next) => Phase::Down(next, 1),
                None => return self.no_pass(l),
            },
            Phase::Down(l, k) if !passed => match self.down(l).filter(|_| self.may_halve(k)) {
                Some(next) => Phase::Down(next, k + 1),
                None => return self.no_pass(l),
            },
            _ => Phase::Bisect,
        };
        if matches!(self.phase, Phase::Bisect) && self.midpoint().is_none() {
            self.bracketed();
        }
    }

    /// The next load up: double, at most the ceiling.
    fn up(&self, l: f64) -> f64 {
        round_load(self.spec.kind, (l * 2.0).min(self.spec.ceiling))
    }

    /// Whether a rate may be halved again after `k` halvings (a concurrency goes down to
    /// 1 whatever it started at).
    fn may_halve(&self, k: u32) -> bool {
        self.spec.kind == SearchKind::Concurrency || k < MAX_HALVINGS
    }

    /// The next load down, `None` at the lowest.
    fn down(&self, l: f64) -> Option<f64> {
        let next = round_load(self.spec.kind, l / 2.0);
        match self.spec.kind {
            SearchKind::Concurrency => (l > 1.0).then_some(next.max(1.0)),
            SearchKind::Rate => (next > 0.0).then_some(next),
        }
    }

    /// The bracket's top: the first fail or the first saturated load, the lower.
    fn top(&self) -> Option<f64> {
        match (self.fail, self.saturated) {
            (Some(f), Some(s)) => Some(f.min(s)),
            (f, s) => f.or(s),
        }
    }

    /// The next load to bisect at; `None` when the bracket is narrow enough.
    fn midpoint(&self) -> Option<f64> {
        let (lo, hi) = (self.pass?, self.top()?);
        match self.spec.kind {
            SearchKind::Concurrency => {
                (hi - lo > 1.0).then(|| round_load(self.spec.kind, ((lo + hi) / 2.0).floor()))
            }
            SearchKind::Rate => (hi / lo > 1.0 + RATE_RESOLUTION)
                .then(|| round_load(self.spec.kind, (lo + hi) / 2.0))
                .filter(|m| *m > lo && *m < hi),
        }
    }

    /// The bracket is as narrow as it gets: confirm it.
    fn bracketed(&mut self) {
        let (Some(pass), Some(top)) = (self.pass, self.top()) else {
            return;
        };
        if self.fail.is_some_and(|f| f <= top) {
            let text = format!("{} passes and {} fails", self.named(pass), self.named(top));
            self.confirm(StopReason::Found, text);
        } else {
            let text = format!(
                "the generator saturated at {} before any SLO failed: the server holds at least {}, and its limit was not found (a second generator, or --search-from lower with fewer cores busy, would find it)",
                self.named(top),
                self.named(pass)
            );
            self.confirm(StopReason::GeneratorSaturated, text);
        }
    }

    /// Confirm the best pass (and a real first fail), interleaved, twice each.
    fn confirm(&mut self, reason: StopReason, text: String) {
        let mut queue = Vec::new();
        let fail = self.fail.filter(|f| self.saturated.is_none_or(|s| *f <= s));
        for _ in 0..CONFIRM_REPEATS {
            if let Some(p) = self.pass {
                queue.push((p, Verdict::Pass));
            }
            if let Some(f) = fail {
                queue.push((f, Verdict::Fail));
            }
        }
        self.ending = Some((reason, text));
        self.phase = Phase::Confirm(queue);
        self.finish_if_confirmed();
    }

    fn confirmed(&mut self, load: f64, got: Verdict) {
        if let Phase::Confirm(queue) = &mut self.phase
            && !queue.is_empty()
        {
            let (_, expected) = queue.remove(0);
            self.confirmations.push((load, expected, got));
        }
        self.finish_if_confirmed();
    }

    fn finish_if_confirmed(&mut self) {
        if let Phase::Confirm(queue) = &self.phase
            && queue.is_empty()
            && let Some(end) = self.ending.take()
        {
            self.stopped = Some(end);
        }
    }

    fn no_pass(&mut self, lowest: f64) {
        let lowest_saturated = self.saturated.is_some_and(|s| s <= lowest);
        self.stopped = Some(match (self.fail, lowest_saturated) {
            (Some(f), true) => (
                StopReason::GeneratorSaturated,
                format!(
                    "{} failed, and the generator could not hold {} below it, so nothing lower about the server was read",
                    self.named(f),
                    self.named(lowest)
                ),
            ),
            (Some(_), false) => (
                StopReason::NoPassingLoad,
                format!(
                    "no load meets the SLOs: the lowest probed, {}, failed",
                    self.named(lowest)
                ),
            ),
            // Only saturated probes: nothing about the server was read.
            (None, _) => (
                StopReason::GeneratorSaturated,
                format!(
                    "the generator could not hold even {}, so nothing about the server was read; a generator with more room (load.max_in_flight, cores) would",
                    self.named(lowest)
                ),
            ),
        });
    }

    /// `c=8` or `12.5/s`.
    pub(crate) fn named(&self, load: f64) -> String {
        named(self.spec.kind, load)
    }

    /// The search as search.json says it.
    pub(crate) fn finish(mut self) -> SearchRun {
        let (stopped, because) = self
            .stopped
            .take()
            .unwrap_or((StopReason::Stopped, "the search did not finish".to_string()));
        // A knee bracketed to its resolution keeps its answer when its confirmation was
        // cut (the budget, the arm's stop): unconfirmed, with the repeats that ran.
        let bracketed = self.ending.is_some()
            || matches!(
                stopped,
                StopReason::Found | StopReason::GeneratorSaturated | StopReason::Ceiling
            );
        let unrun_confirmations = match &self.phase {
            Phase::Confirm(queue) => queue.len(),
            _ => 0,
        };
        let answer = match (bracketed, self.pass) {
            (true, Some(p)) => Some(Answer {
                load: p,
                first_fail: self.fail,
                saturated_at: self.saturated,
                confirmed: unrun_confirmations == 0
                    && self.confirmations.iter().all(|(_, want, got)| want == got),
                confirmations_planned: self.confirmations.len() + unrun_confirmations,
                confirmations: self
                    .confirmations
                    .iter()
                    .map(|(l, _, got)| format!("{}:{}", self.named(*l), got.as_str()))
                    .collect(),
            }),
            _ => None,
        };
        SearchRun {
            arm: self.arm,
            case: self.case,
            planned_requests_per_probe: self.requests,
            probes: self.probes,
            last_pass: self.pass,
            first_fail: self.fail,
            answer,
            stopped,
            stopped_because: because,
            elapsed_seconds: self.elapsed_seconds,
        }
    }
}

impl doc::SearchDoc {
    /// A search stopped before it finished: its budget, or its arm's stop.
    pub(crate) fn unfinished(&self) -> bool {
        self.searches.iter().any(|s| {
            matches!(
                s.stopped,
                StopReason::Budget | StopReason::Stopped | StopReason::ProbeTooLong
            )
        })
    }

    /// search.json: the question and every search of the run.
    pub(crate) fn of(spec: &SearchSpec, searches: Vec<SearchRun>) -> doc::SearchDoc {
        doc::SearchDoc {
            kind: spec.kind,
            slos: spec.slos.iter().map(|s| s.text.clone()).collect(),
            confidence: spec.confidence,
            statement_confidence: judge::statement_confidence(spec),
            margin: spec.margin,
            good_share_min: spec.good_share_min,
            budget_seconds: spec.budget.map(|b| b.as_secs_f64()),
            searches,
        }
    }
}

/// A load as the search probes it: a whole concurrency, or a rate to four significant
/// digits.
fn round_load(kind: SearchKind, l: f64) -> f64 {
    match kind {
        SearchKind::Concurrency => l.round().max(1.0),
        SearchKind::Rate if l > 0.0 => crate::model::four_digits(l),
        SearchKind::Rate => 0.0,
    }
}

/// A probe's load as the driver and the rows name it: a concurrency or a rate.
pub(crate) fn level(kind: SearchKind, load: f64) -> crate::model::Level {
    match kind {
        SearchKind::Concurrency => crate::model::Level::Concurrency(load as usize),
        SearchKind::Rate => crate::model::Level::Rate(load),
    }
}

/// `c=8` or `12.5/s`.
pub(crate) fn named(kind: SearchKind, load: f64) -> String {
    level(kind, load).named()
}

#[cfg(test)]
mod tests;
