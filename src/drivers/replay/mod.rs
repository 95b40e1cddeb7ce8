//! The replay driver: runs a frozen plan's phases through the engine, closed or open loop.
//!
//! Phases, in order: `health` (one GET), `readiness` (one request per variant, sequential),
//! `warmup` (`warmup_per_case` per variant, sequential), then for each case and each
//! concurrency c: `feasibility` (one excluded wave of min(c, n)) and `repetitions` rounds
//! of `measured` (n requests, c workers, closed loop); or, in an open loop, for each rate:
//! `feasibility` (the rate's own arrivals for a second) and `repetitions` rounds of its
//! seeded schedule (`open`). Requests are made once per arm
//! (`ctx::freeze`) and sent by the engine's lean client. Each worker owns its connection; the
//! scheduler hands connections from round to round without locks. With
//! `on_failure: stop`, the first failure stops new dispatch, admitted requests drain and
//! are recorded, and later phases are skipped. The driver decides *what* to send and
//! judges the answer; *how* it is sent and timed belongs to the engine.

mod arms;
mod ctx;
mod exchange;
mod launch;
mod open;
mod phases;
mod search;
mod session;
mod trace;
mod wave;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use http::HeaderValue;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::RunContext;
use super::shutdown::Shutdown;
use crate::config::plan::Plan;
use crate::config::shape::Shape;
use crate::engine::Engine;
use crate::metrics::PhaseCounts;
use crate::metrics::RoundMetrics;
use crate::model::Phase;
use crate::report::Ending;
use crate::report::campaign::ArmMeasures;
pub(crate) use arms::ArmEnv;
use ctx::{Base, Timetable};
pub(crate) use launch::kill_all as kill_started_servers;

/// Everything a replay needs besides the plan and the run.
pub(crate) struct ReplayOptions {
    pub(crate) plan: Plan,
    /// What the command's flags made of the plan (`--sweep`, `--shard`).
    pub(crate) shape: Shape,
    /// Value of `Authorization: Bearer ...`, already read and checked.
    pub(crate) bearer_token: Option<String>,
    pub(crate) max_record_body: usize,
    pub(crate) quiet: bool,
    /// Write a row per exchange to `exchanges/` (off: metrics and the summary only, to
    /// measure what recording costs).
    pub(crate) record_exchanges: bool,
    /// After Ctrl-C / SIGTERM, how long in-flight exchanges may still finish before they
    /// are cut (`shutdown_cut`).
    pub(crate) grace: std::time::Duration,
    /// `--shard`'s `--start-at` on the monotonic clock: the first open wave's start (the
    /// share of each wave this process sends is the shape's shard).
    pub(crate) shard_start_ns: Option<u64>,
    /// `--search`: the question, checked (the shape is `Shape::Search`).
    pub(crate) search: Option<crate::config::search::SearchSpec>,
}

/// What a replay measured: `report` turns it into summary.json, campaign.json and the
/// table.
pub(crate) struct ReplayResult {
    pub(crate) ending: Ending,
    pub(crate) rounds: Vec<RoundMetrics>,
    /// Counts of the phases outside the measured rounds, every arm merged.
    pub(crate) excluded: BTreeMap<Phase, PhaseCounts>,
    /// Failures in every phase.
    pub(crate) failures: u64,
    /// What `--sweep` noted as it placed its rates.
    pub(crate) notes: Vec<String>,
    /// The first failure, as one line: where (phase, case, variant), its outcome, and the
    /// error or the oracle's first difference with its pointer.
    pub(crate) first_failure: Option<String>,
    /// Each campaign arm's measurements (empty for a plain plan).
    pub(crate) arms: Vec<ArmMeasures>,
    /// `--search`: each (arm, case)'s search, in run order.
    pub(crate) searches: Vec<crate::search::doc::SearchRun>,
}

fn progress_bar(quiet: bool, planned: u64) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::with_draw_target(Some(planned), ProgressDrawTarget::stderr_with_hz(10));
    // The second line is the live one ([`live_line`]).
    pb.set_style(
        ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}\n  {prefix}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    pb
}

/// The progress bar, from the live metrics' count of ended exchanges (every phase): its
/// position ten times a second (the count is read, so no exchange touches the bar), and
/// its live line once a second: exchanges ended per second over the last second, the
/// latency p50 and p95 so far as the upper bounds of their histogram buckets (approximate,
/// and labelled so), and failures by kind.
async fn live_line(pb: ProgressBar, t: Arc<crate::telemetry::Telemetry>) {
    const TICKS_PER_LINE: u64 = 10;
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(100));
    // After a stall, one late tick rather than a burst of catch-up ones.
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (mut last_n, mut last_ns) = (0u64, crate::clock::now_ns());
    for k in 1u64.. {
        tick.tick().await;
        let (n, _) = t.totals();
        pb.set_position(n);
        if k % TICKS_PER_LINE != 0 {
            continue;
        }
        let now = crate::clock::now_ns();
        let secs = (now.saturating_sub(last_ns) as f64 / 1e9).max(1e-3);
        let rate = n.saturating_sub(last_n) as f64 / secs;
        (last_n, last_ns) = (n, now);
        pb.set_prefix(t.live_text(rate));
    }
}

/// Run the plan, recording into `run`. `interrupt` is requested on Ctrl-C / SIGTERM.
/// The caller finishes the recording ([`RunContext::finish_recording`]). A campaign plan
/// runs its arms (started in `env` when they have a start command) in the plan's
/// schedule.
pub(crate) async fn run(
    opts: ReplayOptions,
    engine: Engine,
    run: Arc<RunContext>,
    interrupt: Arc<Shutdown>,
    env: arms::ArmEnv,
) -> ReplayResult {
    let plan = opts.plan;
    let token = opts
        .bearer_token
        .as_deref()
        .and_then(|t| HeaderValue::from_str(&format!("Bearer {t}")).ok())
        .map(|mut v| {
            v.set_sensitive(true);
            v
        });
    let (cut_tx, cut) = tokio::sync::watch::channel(false);
    let watcher = tokio::spawn(cut_after_grace(interrupt.clone(), opts.grace, cut_tx));
    let arm_count = plan.campaign.as_ref().map_or(1, |c| c.arms.len()) as u64;
    let base = Arc::new(Base {
        engine,
        run,
        token,
        max_record_body: opts.max_record_body,
        record_exchanges: opts.record_exchanges,
        interrupted: interrupt,
        cut,
        grace: opts.grace,
        failures: AtomicU64::new(0),
        first_failure: std::sync::OnceLock::new(),
        progress: progress_bar(opts.quiet, opts.shape.planned_requests(&plan) * arm_count),
        shape: opts.shape,
        halted: AtomicBool::new(false),
        timetable: opts.shard_start_ns.map(|start_ns| Timetable {
            next_ns: AtomicU64::new(start_ns),
            settle_ns: (plan.timeout + std::time::Duration::from_secs(1)).as_nanos() as u64,
        }),
        notes: std::sync::Mutex::new(Vec::new()),
        sessions_stopped: AtomicU64::new(0),
        turns_not_attempted: AtomicU64::new(0),
        search_spent_ns: AtomicU64::new(0),
        search: opts.search,
        searches: std::sync::Mutex::new(Vec::new()),
    });
    let live = match (base.progress.is_hidden(), base.run.telemetry()) {
        (false, Some(t)) => Some(tokio::spawn(live_line(base.progress.clone(), t.clone()))),
        _ => None,
    };
    let mut runs = arms::ArmRun::for_plan(&plan);
    let mut rounds: Vec<RoundMetrics> = Vec::new();
    arms::run_arms(&base, &plan, &env, &mut runs, &mut rounds).await;
    watcher.abort();
    if let Some(l) = live {
        l.abort();
    }
    base.progress.finish_and_clear();

    let failures = base.failures.load(Ordering::Relaxed);
    let unavailable = runs.iter().any(|a| a.unavailable.is_some());
    let ending = if base.interrupted.is_requested() {
        Ending::Interrupted
    } else if failures > 0 || unavailable {
        Ending::Failed
    } else {
        Ending::Passed
    };
    let mut excluded: BTreeMap<Phase, PhaseCounts> = BTreeMap::new();
    for a in &runs {
        for (p, c) in &a.excluded {
            excluded.entry(*p).or_default().merge(c);
        }
    }
    let mut notes = base.notes.lock().map(|n| n.clone()).unwrap_or_default();
    notes.extend(base.sessions_note());
    ReplayResult {
        ending,
        rounds,
        excluded,
        failures,
        notes,
        first_failure: base.first_failure.get().cloned(),
        arms: arms::measures(runs),
        searches: base.take_searches(),
    }
}

/// Wait for the interrupt, then give in-flight exchanges `grace` to finish before they
/// are cut. (A second Ctrl-C exits the process at once: the CLI's signal watcher.)
async fn cut_after_grace(
    interrupt: Arc<Shutdown>,
    grace: std::time::Duration,
    cut: tokio::sync::watch::Sender<bool>,
) {
    interrupt.requested().await;
    tokio::time::sleep(grace).await;
    let _ = cut.send(true);
}
