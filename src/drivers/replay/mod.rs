//! The replay driver: runs a frozen plan's phases through the engine, closed or open loop.
//!
//! Phases, in order: `health` (one GET), `readiness` (one request per variant, sequential),
//! `warmup` (`warmup_per_case` per variant, sequential), then for each case and each
//! concurrency c: `feasibility` (one excluded wave of min(c, n)) and `repetitions` rounds
//! of `measured` (n requests, c workers, closed loop); or, in an open loop, for each rate:
//! `feasibility` (the rate's own arrivals for a second) and `repetitions` rounds of its
//! seeded schedule (`open`). Requests are made once per arm
//! (`exchange::freeze`) and sent by the engine's lean client. Each worker owns its connection; the
//! scheduler hands connections from round to round without locks. With
//! `on_failure: stop`, the first failure stops new dispatch, admitted requests drain and
//! are recorded, and later phases are skipped. The driver decides *what* to send and
//! judges the answer; *how* it is sent and timed belongs to the engine.

mod arms;
mod exchange;
mod launch;
mod open;
mod wave;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use http::HeaderValue;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::RunContext;
use crate::clock;
use crate::config::plan::Plan;
use crate::config::shape::Shape;
use crate::engine::Engine;
use crate::engine::lean::LeanConn;
use crate::metrics::PhaseCounts;
use crate::metrics::{self, GeneratorLoad, RoundMetrics, Sample};
use crate::model::{Level, Phase};
use crate::report::Ending;
use crate::report::campaign::ArmMeasures;
pub(crate) use arms::ArmEnv;
use exchange::{Rows, exchange};
pub(crate) use launch::kill_all as kill_started_servers;
use open::{OpenPool, OpenWave, open_wave};
use wave::{LagProbe, cores, wave};

/// A worker's connection between its exchanges.
type Slot = Option<LeanConn>;

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
}

/// Where a shard's open waves start: every shard runs the same waves in the same order,
/// so each computes the same starts: the first at `--start-at`, each next one after the
/// previous wave's schedule and then `timeout_seconds` + 1 s for its last exchanges to
/// end and its rows to be handed over.
struct Timetable {
    next_ns: AtomicU64,
    settle_ns: u64,
}

impl Timetable {
    /// The start of the next wave, whose schedule spans `span_us`.
    fn next_start(&self, span_us: u64) -> u64 {
        let step = span_us.saturating_mul(1000).saturating_add(self.settle_ns);
        self.next_ns.fetch_add(step, Ordering::Relaxed)
    }
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
}

/// One request to dispatch.
#[derive(Clone, Copy)]
struct Dispatch {
    phase: Phase,
    case: Option<usize>,
    variant: usize,
    concurrency: Option<i32>,
    repetition: Option<i32>,
    dispatch_index: i64,
    worker: i32,
    /// Open loop: the round's rate and this arrival's intended send time (run clock).
    rate: Option<f64>,
    scheduled_offset_us: Option<i64>,
}

/// One arm's context (or a plain plan's): what every arm shares, and this arm's plan,
/// requests, names and stop flag.
struct Ctx {
    base: Arc<Base>,
    plan: Plan,
    /// The health endpoint's URL, then each case's (index `case + 1`).
    urls: Vec<Arc<str>>,
    /// Their routes in the live metrics (empty without them).
    routes: Vec<usize>,
    /// The requests, made once: the health GET (`[0][0]`), then each case's variants
    /// (`[case + 1][variant]`).
    frozen: Vec<Vec<exchange::Frozen>>,
    /// This arm's dispatch stops (its failure under `on_failure: stop`, or a recorder
    /// error); the other arms go on.
    stop: AtomicBool,
    case_names: Vec<Arc<str>>,
    variant_names: Vec<Vec<Option<Arc<str>>>>,
    /// The campaign arm (`None` for a plain plan).
    arm: Option<Arc<str>>,
    /// A performance-fit arm: its answers are never `correctness` failures.
    performance_fit: bool,
}

impl Ctx {
    /// The live metrics' route of `case`'s requests (`None`: the health GET).
    fn route(&self, case: Option<usize>) -> usize {
        let i = case.map_or(0, |c| c + 1);
        self.routes.get(i).copied().unwrap_or(0)
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
            || self.base.interrupted.load(Ordering::Relaxed)
            || self.base.halted.load(Ordering::Relaxed)
    }

    /// Stop every arm: nothing more can be recorded.
    fn halt(&self) {
        self.base.halted.store(true, Ordering::Relaxed);
    }

    /// Stop new dispatch (a failure under `on_failure: stop`, or a recorder error).
    fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// What every arm's context shares.
struct Base {
    engine: Engine,
    run: Arc<RunContext>,
    token: Option<HeaderValue>,
    max_record_body: usize,
    record_exchanges: bool,
    /// Set by the CLI's signal watcher on Ctrl-C / SIGTERM.
    interrupted: Arc<AtomicBool>,
    /// Turns true `grace` after the interrupt: in-flight exchanges are cut.
    cut: tokio::sync::watch::Receiver<bool>,
    grace: std::time::Duration,
    /// Failures of every arm, and the first one's line.
    failures: AtomicU64,
    first_failure: std::sync::OnceLock<String>,
    progress: ProgressBar,
    /// Every arm stops (the recorder failed, or a worker panicked).
    halted: AtomicBool,
    /// What the command's flags made of the plan (`--sweep`, `--shard`).
    shape: Shape,
    /// `--shard`: the shared timetable of open waves.
    timetable: Option<Timetable>,
    /// What a `--sweep` placed per case, or why it placed nothing (summary.json's
    /// `load.notes`).
    notes: std::sync::Mutex<Vec<String>>,
}

impl Base {
    /// The context of one arm (or of a plain plan: `arm` `None`) running `plan`.
    fn ctx(self: &Arc<Self>, plan: Plan, arm: Option<(&str, bool)>) -> Arc<Ctx> {
        let case_names = plan
            .cases
            .iter()
            .map(|c| Arc::from(c.name.as_str()))
            .collect();
        let variant_names = plan
            .cases
            .iter()
            .map(|c| {
                c.variants
                    .iter()
                    .map(|v| v.name.as_deref().map(Arc::from))
                    .collect()
            })
            .collect();
        let token = self.token.as_ref();
        let frozen: Vec<Vec<exchange::Frozen>> =
            std::iter::once(vec![exchange::freeze(&plan, token, None, 0)])
                .chain(plan.cases.iter().enumerate().map(|(ci, c)| {
                    (0..c.variants.len())
                        .map(|v| exchange::freeze(&plan, token, Some(ci), v))
                        .collect()
                }))
                .collect();
        let urls: Vec<Arc<str>> = std::iter::once(&plan.health_endpoint)
            .chain(plan.cases.iter().map(|c| &c.endpoint))
            .map(|e| Arc::from(e.url()))
            .collect();
        // Each request's route in the live metrics, looked up once here, not per exchange.
        let routes = match self.run.telemetry() {
            Some(t) => urls
                .iter()
                .zip(&frozen)
                .map(|(url, f)| {
                    f.first()
                        .map_or(0, |f| t.route_id(f.lean.method.as_str(), url))
                })
                .collect(),
            None => Vec::new(),
        };
        Arc::new(Ctx {
            base: self.clone(),
            plan,
            urls,
            routes,
            frozen,
            stop: AtomicBool::new(false),
            case_names,
            variant_names,
            arm: arm.map(|(name, _)| Arc::from(name)),
            performance_fit: arm.is_some_and(|(_, fit)| fit),
        })
    }
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

/// The progress bar's live line, once a second: exchanges ended per second over the last
/// second, the latency p50 and p95 so far as the upper bounds of their histogram buckets
/// (approximate, and labelled so), and failures by kind; every phase counts.
async fn live_line(pb: ProgressBar, t: Arc<crate::telemetry::Telemetry>) {
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    // After a stall, one late tick rather than a burst of catch-up ones.
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (mut last_n, mut last_ns) = (0u64, crate::clock::now_ns());
    loop {
        tick.tick().await;
        let (n, _) = t.totals();
        let now = crate::clock::now_ns();
        let secs = (now.saturating_sub(last_ns) as f64 / 1e9).max(1e-3);
        let rate = n.saturating_sub(last_n) as f64 / secs;
        (last_n, last_ns) = (n, now);
        pb.set_prefix(t.live_text(rate));
    }
}

/// Run the plan, recording into `run`. `interrupt` flips to true on Ctrl-C / SIGTERM.
/// The caller finishes the recording ([`RunContext::finish_recording`]). A campaign plan
/// runs its arms (started in `env` when they have a start command) in the plan's
/// schedule.
pub(crate) async fn run(
    opts: ReplayOptions,
    engine: Engine,
    run: Arc<RunContext>,
    interrupt: Arc<AtomicBool>,
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
    let ending = if base.interrupted.load(Ordering::Relaxed) {
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
    let notes = base.notes.lock().map(|n| n.clone()).unwrap_or_default();
    ReplayResult {
        ending,
        rounds,
        excluded,
        failures,
        notes,
        first_failure: base.first_failure.get().cloned(),
        arms: arms::measures(runs),
    }
}

/// Wait for the interrupt, then give in-flight exchanges `grace` to finish before they
/// are cut. (A second Ctrl-C exits the process at once: the CLI's signal watcher.)
async fn cut_after_grace(
    interrupt: Arc<AtomicBool>,
    grace: std::time::Duration,
    cut: tokio::sync::watch::Sender<bool>,
) {
    while !interrupt.load(Ordering::Relaxed) {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    tokio::time::sleep(grace).await;
    let _ = cut.send(true);
}

/// Health, readiness and warm-up of one arm (sequential, on worker 0's connection).
/// `false` when the arm stopped (its failure under `on_failure: stop`, or Ctrl-C).
async fn prelude(
    ctx: &Arc<Ctx>,
    slots: &mut [Slot],
    excluded: &mut BTreeMap<Phase, PhaseCounts>,
) -> bool {
    let plan = &ctx.plan;
    // health: one GET on its own connection.
    ctx.base.progress.set_message(label(ctx, "health"));
    let mut health_slot: Slot = None;
    let s = exchange(
        ctx,
        &mut health_slot,
        Dispatch {
            phase: Phase::Health,
            case: None,
            variant: 0,
            concurrency: Some(1),
            repetition: None,
            dispatch_index: 0,
            worker: 0,
            rate: None,
            scheduled_offset_us: None,
        },
        &mut Rows::new(1),
    )
    .await;
    excluded.entry(Phase::Health).or_default().add(&s);
    drop(health_slot);

    for phase in [Phase::Readiness, Phase::Warmup] {
        let per_variant = if phase == Phase::Readiness {
            1
        } else {
            plan.warmup_per_case
        };
        for (ci, case) in plan.cases.iter().enumerate() {
            ctx.base
                .progress
                .set_message(label(ctx, &format!("{} {}", phase.as_str(), case.name)));
            for vi in 0..case.variants.len() {
                for i in 0..per_variant {
                    if ctx.stopped() {
                        return false;
                    }
                    let s = exchange(
                        ctx,
                        &mut slots[0],
                        Dispatch {
                            phase,
                            case: Some(ci),
                            variant: vi,
                            concurrency: Some(1),
                            repetition: None,
                            dispatch_index: i as i64,
                            worker: 0,
                            rate: None,
                            scheduled_offset_us: None,
                        },
                        &mut Rows::new(1),
                    )
                    .await;
                    excluded.entry(phase).or_default().add(&s);
                }
            }
        }
    }
    !ctx.stopped()
}

/// A progress message, with the arm's name in a campaign.
fn label(ctx: &Ctx, what: &str) -> String {
    match &ctx.arm {
        Some(a) => format!("[{a}] {what}"),
        None => what.to_string(),
    }
}

/// Where a level's waves send from: the closed loop's workers' connections, or the open
/// loop's senders' pool.
struct Senders<'a> {
    slots: &'a mut [Slot],
    pool: &'a Arc<OpenPool>,
}

/// A level of case `ci` as the driver runs it: `level` is the `li`-th of its kind
/// (the seeded schedule's stream of an open level depends on it).
#[derive(Clone, Copy)]
struct At {
    ci: usize,
    level: Level,
    li: usize,
}

impl At {
    /// The open wave of repetition `rep` (`None`: the feasibility wave) at this level;
    /// a shard's share of it, at its place in the shared timetable.
    fn open_wave(self, ctx: &Ctx, rate: f64, rep: Option<usize>) -> OpenWave {
        let schedule = ctx.plan.load.schedule(rate, self.ci, self.li, rep);
        let start_ns = match &ctx.base.timetable {
            None => None,
            Some(t) => {
                let start = t.next_start(schedule.last().copied().unwrap_or(0));
                let late_ms = clock::now_ns().saturating_sub(start) as f64 / 1e6;
                if let (true, Some((i, n))) = (late_ms > 0.0, ctx.base.shape.shard_of()) {
                    ctx.base.progress.println(format!(
                        "warning: shard {i}/{n}: a wave starts {late_ms:.0} ms after its place in the timetable (the prelude or the previous wave overran it); its sends are late, and their lag is recorded"
                    ));
                }
                Some(start)
            }
        };
        OpenWave {
            case: self.ci,
            phase: if rep.is_some() {
                Phase::Measured
            } else {
                Phase::Feasibility
            },
            rate,
            repetition: rep,
            schedule,
            shard: ctx.base.shape.shard_of(),
            start_ns,
        }
    }
}

/// The excluded feasibility wave of a level: one closed wave of min(c, n), or an open
/// level's own arrivals for its first second.
async fn feasibility(
    ctx: &Arc<Ctx>,
    senders: Senders<'_>,
    at: At,
    excluded: &mut BTreeMap<Phase, PhaseCounts>,
) {
    let case = &ctx.plan.cases[at.ci];
    ctx.base.progress.set_message(label(
        ctx,
        &format!(
            "feasibility {} {}",
            case.name,
            crate::model::Level::named(at.level)
        ),
    ));
    let samples = match at.level {
        Level::Concurrency(c) => {
            let n = ctx.plan.requests_per_case;
            wave(
                ctx,
                senders.slots,
                at.ci,
                Phase::Feasibility,
                c,
                None,
                c.min(n),
            )
            .await
        }
        Level::Rate(r) => open_wave(ctx, senders.pool, at.open_wave(ctx, r, None)).await,
    };
    let counts = excluded.entry(Phase::Feasibility).or_default();
    samples.iter().for_each(|s| counts.add(s));
}

/// Wait (on the runtime's timer, in slices that see a stop) until `ns` on the monotonic
/// clock.
async fn wait_until(ctx: &Ctx, ns: u64) {
    while !ctx.stopped() {
        let now = clock::now_ns();
        if now >= ns {
            return;
        }
        let left = (ns - now).min(50_000_000);
        tokio::time::sleep(std::time::Duration::from_nanos(left)).await;
    }
}

/// One measured round of a level, with the tool's own CPU time and the runtime's
/// dispatch lag over the round, and goodput against the plan's `slo`.
async fn measured_round(ctx: &Arc<Ctx>, senders: Senders<'_>, at: At, rep: usize) -> Measured {
    let case = &ctx.plan.cases[at.ci];
    let recorder = &ctx.base.run.recorder;
    // An open round's wave (closed: its concurrency).
    let work = match at.level {
        Level::Rate(r) => Ok(at.open_wave(ctx, r, Some(rep))),
        Level::Concurrency(c) => Err(c),
    };
    // A shard's wave has its place in the timetable: the round's measurements (the
    // generator's CPU and lag, the held rows) start just before it, not at the wait.
    if let Ok(OpenWave {
        start_ns: Some(start),
        ..
    }) = &work
    {
        wait_until(ctx, start.saturating_sub(5_000_000)).await;
    }
    // The round's rows are encoded after it, not while requests are in flight.
    if ctx.base.record_exchanges {
        recorder.hold();
    }
    let probe = LagProbe::start();
    let (cpu0, wall0) = (clock::process_cpu_ns(), clock::now_ns());
    let (samples, planned) = match work {
        Ok(w) => {
            let planned = w.planned();
            (open_wave(ctx, senders.pool, w).await, planned)
        }
        Err(c) => {
            let n = ctx.plan.requests_per_case;
            let s = wave(ctx, senders.slots, at.ci, Phase::Measured, c, Some(rep), n).await;
            (s, n as u64)
        }
    };
    let (cpu1, wall1) = (clock::process_cpu_ns(), clock::now_ns());
    let lags = probe.stop().await;
    if ctx.base.record_exchanges
        && let Err(e) = recorder.release().await
    {
        ctx.base.run.record_failed(e);
        ctx.halt();
    }
    let mut round = metrics::level_round_metrics(&case.name, at.level, rep, planned, &samples);
    round.goodput = ctx
        .plan
        .slo
        .as_ref()
        .map(|slo| metrics::goodput(&samples, slo, round.elapsed_seconds));
    round.arm = ctx.arm.as_deref().map(str::to_string);
    let load = GeneratorLoad::new(
        cpu1.saturating_sub(cpu0),
        wall1.saturating_sub(wall0),
        cores(),
        lags,
    );
    if let Some(w) = &load.warning {
        ctx.base.progress.println(format!(
            "warning: {} {} round {}: {w}",
            case.name,
            crate::model::Level::named(at.level),
            rep + 1
        ));
    }
    if let Some(o) = round.open.as_ref().filter(|o| o.saturated) {
        ctx.base.progress.println(format!(
            "warning: {} {} round {}: saturated: {} of {} sends fell more than {} ms behind their schedule (worst {:.1} ms); raise load.max_in_flight or lower the rate",
            case.name,
            crate::model::Level::named(at.level),
            rep + 1,
            o.late_sends,
            round.attempted_requests,
            metrics::SATURATION_LAG_US / 1000,
            o.send_lag_max_us.unwrap_or(0) as f64 / 1000.0
        ));
    }
    round.generator = Some(load);
    Measured {
        round,
        samples,
        window_ns: (wall0, wall1),
    }
}

/// A measured round: its metrics, its samples (for a campaign's cells) and when it ran.
struct Measured {
    round: RoundMetrics,
    samples: Vec<Sample>,
    window_ns: (u64, u64),
}
