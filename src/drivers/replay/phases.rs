//! The phases of one arm at one level, in the order the driver runs them: the prelude
//! (health, readiness, warm-up, sequential), a level's feasibility wave, and its measured
//! rounds (closed-loop waves or open-loop schedules), each turned into a round's metrics.

use crate::drivers::scrape::Cause;
use crate::record::scrapes::RoundId;
use std::collections::BTreeMap;
use std::sync::Arc;

use super::ctx::{Ctx, Dispatch, Slot, TurnAt, wait_until};
use super::exchange::{Rows, exchange};
use super::open::{Arrivals, OpenPool, OpenWave, open_wave};
use super::session::{send, session};
use super::wave::{LagProbe, cores, wave};
use crate::clock;
use crate::metrics::PhaseCounts;
use crate::metrics::{self, GeneratorLoad, RoundMetrics, Sample};
use crate::model::{Level, Phase};

/// Health, readiness and warm-up of one arm (sequential, on worker 0's connection).
/// `false` when the arm stopped (its failure under `on_failure: stop`, or Ctrl-C).
pub(super) async fn prelude(
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
            synthetic: None,
            turn: None,
        },
        &mut Rows::new(1),
    )
    .await;
    excluded.entry(Phase::Health).or_default().add(&s);
    drop(health_slot);
    if plan.load.trace.is_some() {
        return trace_readiness(ctx, slots, excluded).await;
    }

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
            if case.sessions.is_some() {
                if !sequential_sessions(ctx, &mut slots[0], (phase, ci, per_variant), excluded)
                    .await
                {
                    return false;
                }
                continue;
            }
            for vi in 0..case.variants.len() {
                for i in 0..per_variant {
                    if ctx.stopped() {
                        return false;
                    }
                    let s = exchange(
                        ctx,
                        &mut slots[0],
                        Dispatch {
                            variant: vi,
                            ..sequential(phase, ci, i)
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

/// Readiness or warm-up of case `ci`'s sessions: every session whole, `times` times
/// (each of its turns is a variant). `false` when the arm stopped.
async fn sequential_sessions(
    ctx: &Arc<Ctx>,
    slot: &mut Slot,
    (phase, ci, times): (Phase, usize, usize),
    excluded: &mut BTreeMap<Phase, PhaseCounts>,
) -> bool {
    let count = ctx.plan.cases[ci]
        .sessions
        .as_ref()
        .map_or(0, |s| s.list.len());
    for si in 0..count {
        for i in 0..times {
            if ctx.stopped() {
                return false;
            }
            let d = sequential(phase, ci, i);
            for s in session(ctx, slot, d, si, &mut Rows::new(1)).await {
                excluded.entry(phase).or_default().add(&s);
            }
        }
    }
    true
}

/// A sequential phase's dispatch `i` of case `ci` (worker 0, one at a time).
fn sequential(phase: Phase, ci: usize, i: usize) -> Dispatch {
    Dispatch {
        phase,
        case: Some(ci),
        variant: 0,
        concurrency: Some(1),
        repetition: None,
        dispatch_index: i as i64,
        worker: 0,
        rate: None,
        scheduled_offset_us: None,
        synthetic: None,
        turn: None,
    }
}

/// A trace plan's readiness: the window's first entry, once (the server is up and
/// answers it). No warm-up per variant: the window's first `warmup_seconds` are sent
/// within each round, at the trace's own pace.
async fn trace_readiness(
    ctx: &Arc<Ctx>,
    slots: &mut [Slot],
    excluded: &mut BTreeMap<Phase, PhaseCounts>,
) -> bool {
    let first = ctx
        .plan
        .load
        .trace
        .as_ref()
        .and_then(|t| t.first_pick().map(|p| (t, p)));
    let Some((t, pick)) = first else {
        return !ctx.stopped();
    };
    let (case, variant, synthetic) = t.target(pick.entry);
    ctx.base.progress.set_message(label(ctx, "readiness"));
    if ctx.stopped() {
        return false;
    }
    // An entry naming a session's turn 1: readiness runs that session whole.
    let run = t.entries.as_ref().and_then(|e| e.run_of(pick.entry));
    let d = Dispatch {
        phase: Phase::Readiness,
        case: Some(case),
        variant,
        concurrency: Some(1),
        repetition: None,
        dispatch_index: i64::from(pick.entry),
        worker: 0,
        rate: None,
        scheduled_offset_us: None,
        synthetic,
        turn: run.map(|r| TurnAt {
            session: r.session,
            turn: 0,
            lag_us: None,
        }),
    };
    let mut sent = Vec::with_capacity(1);
    send(ctx, &mut slots[0], d, &mut Rows::new(1), &mut sent).await;
    for s in &sent {
        excluded.entry(Phase::Readiness).or_default().add(s);
    }
    !ctx.stopped()
}

/// A progress message, with the arm's name in a campaign.
pub(super) fn label(ctx: &Ctx, what: &str) -> String {
    match &ctx.arm {
        Some(a) => format!("[{a}] {what}"),
        None => what.to_string(),
    }
}

/// Where a level's waves send from: the closed loop's workers' connections, or the open
/// loop's senders' pool.
pub(super) struct Senders<'a> {
    pub(super) slots: &'a mut [Slot],
    pub(super) pool: &'a Arc<OpenPool>,
}

/// A level of case `ci` as the driver runs it: `level` is the `li`-th of its kind
/// (the seeded schedule's stream of an open level depends on it).
#[derive(Clone, Copy)]
pub(super) struct At {
    pub(super) ci: usize,
    pub(super) level: Level,
    pub(super) li: usize,
    /// A search probe's measured requests (`None`: the plan's `requests_per_case`, or an
    /// open level's own extent).
    pub(super) requests: Option<usize>,
}

impl At {
    /// The open wave of repetition `rep` (`None`: the feasibility wave) at this level;
    /// a shard's share of it, at its place in the shared timetable.
    pub(super) fn open_wave(self, ctx: &Ctx, rate: f64, rep: Option<usize>) -> OpenWave {
        let schedule = match (self.requests, rep) {
            (Some(n), Some(r)) => {
                let at = (self.ci, self.li, r);
                ctx.plan.load.schedule_requests(rate, at, n as u64)
            }
            _ => ctx.plan.load.schedule(rate, self.ci, self.li, rep),
        };
        let start_ns = timetable_start(ctx, schedule.last().copied().unwrap_or(0));
        OpenWave {
            phase: if rep.is_some() {
                Phase::Measured
            } else {
                Phase::Feasibility
            },
            rate,
            repetition: rep,
            arrivals: Arrivals::Schedule {
                case: self.ci,
                schedule,
                shard: ctx.base.shape.shard_of(),
            },
            start_ns,
        }
    }
}

/// Under `--shard`, the next wave's start in the shared timetable (a wave whose
/// schedule spans `span_us`), said when this shard reaches it late; `None` otherwise.
pub(super) fn timetable_start(ctx: &Ctx, span_us: u64) -> Option<u64> {
    let t = ctx.base.timetable.as_ref()?;
    let start = t.next_start(span_us);
    let late_ms = clock::now_ns().saturating_sub(start) as f64 / 1e6;
    if let (true, Some((i, n))) = (late_ms > 0.0, ctx.base.shape.shard_of()) {
        ctx.base.progress.println(format!(
            "warning: shard {i}/{n}: a wave starts {late_ms:.0} ms after its place in the timetable (the prelude or the previous wave overran it); its sends are late, and their lag is recorded"
        ));
    }
    Some(start)
}

/// The excluded feasibility wave of a level: one closed wave of min(c, n), or an open
/// level's own arrivals for its first second; its samples (a search's pace).
pub(super) async fn feasibility(
    ctx: &Arc<Ctx>,
    senders: Senders<'_>,
    at: At,
    excluded: &mut BTreeMap<Phase, PhaseCounts>,
) -> Vec<Sample> {
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
            // A search's probe opens every one of its c connections before it is timed.
            let n = match at.requests {
                Some(_) => c,
                None => c.min(ctx.plan.requests_per_case),
            };
            wave(ctx, senders.slots, at.ci, Phase::Feasibility, c, None, n).await
        }
        Level::Rate(r) => open_wave(ctx, senders.pool, at.open_wave(ctx, r, None))
            .await
            .into_iter()
            .map(|s| s.sample)
            .collect(),
    };
    let counts = excluded.entry(Phase::Feasibility).or_default();
    samples.iter().for_each(|s| counts.add(s));
    samples
}

/// What a measured round sends: an open level's wave, or a closed level's concurrency.
enum Work {
    Open(OpenWave),
    Closed(usize),
}

/// What the generator spent over a round: CPU time of the whole process, and the round's
/// time on the monotonic clock (from `from_ns` to `to_ns`).
struct Spent {
    cpu_ns: u64,
    from_ns: u64,
    to_ns: u64,
}

/// One measured round of a level, with the tool's own CPU time and the runtime's
/// dispatch lag over the round, and goodput against the plan's `slo`.
pub(super) async fn measured_round(
    ctx: &Arc<Ctx>,
    senders: Senders<'_>,
    at: At,
    rep: usize,
) -> Measured {
    let recorder = &ctx.base.run.recorder;
    let work = match at.level {
        Level::Rate(r) => Work::Open(at.open_wave(ctx, r, Some(rep))),
        Level::Concurrency(c) => Work::Closed(c),
    };
    // The worker's own view of the round starts here, when the run scrapes it.
    let edges = round_edges(ctx, &work, at, rep);
    if let Some(id) = &edges {
        ctx.scrape(Cause::RoundStart(id.clone())).await;
    }
    // A shard's wave has its place in the timetable: the round's measurements (the
    // generator's CPU and lag, the held rows) start just before it, not at the wait.
    if let Work::Open(OpenWave {
        start_ns: Some(start),
        ..
    }) = &work
    {
        wait_until(ctx, start.saturating_sub(5_000_000)).await;
    }
    let n = at.requests.unwrap_or(ctx.plan.requests_per_case);
    let planned = match &work {
        Work::Open(w) => w.planned(ctx),
        Work::Closed(_) => ctx.plan.cases[at.ci].requests_of(n),
    };
    // The round's rows are encoded after it, not while requests are in flight.
    if ctx.base.record_exchanges {
        recorder.hold(usize::try_from(planned).unwrap_or(usize::MAX));
    }
    let probe = LagProbe::start();
    let (cpu0, wall0) = (clock::process_cpu_ns(), clock::now_ns());
    let samples = match work {
        Work::Open(w) => {
            let sent = open_wave(ctx, senders.pool, w).await;
            sent.into_iter().map(|s| s.sample).collect()
        }
        Work::Closed(c) => wave(ctx, senders.slots, at.ci, Phase::Measured, c, Some(rep), n).await,
    };
    let (cpu1, wall1) = (clock::process_cpu_ns(), clock::now_ns());
    let lags = probe.stop().await;
    if let Some(id) = edges.filter(|_| !ctx.stopped()) {
        ctx.scrape(Cause::RoundEnd(id)).await;
    }
    if ctx.base.record_exchanges
        && let Err(e) = recorder.release().await
    {
        ctx.base.run.record_failed(e);
        ctx.halt();
    }
    let spent = Spent {
        cpu_ns: cpu1.saturating_sub(cpu0),
        from_ns: wall0,
        to_ns: wall1,
    };
    let round = round_metrics(ctx, at, rep, planned, &samples, spent, lags);
    Measured {
        round,
        samples,
        window_ns: (wall0, wall1),
    }
}

/// A measured round's metrics from its `planned` sends and `samples`: goodput, its arm,
/// and the generator's load over it (its warnings said, and a saturated open round's).
fn round_metrics(
    ctx: &Ctx,
    at: At,
    rep: usize,
    planned: u64,
    samples: &[Sample],
    spent: Spent,
    lags: Vec<i64>,
) -> RoundMetrics {
    let case = &ctx.plan.cases[at.ci];
    let mut round = metrics::level_round_metrics(&case.name, at.level, rep, planned, samples);
    round.goodput = ctx
        .plan
        .slo
        .as_ref()
        .map(|slo| metrics::goodput(samples, slo, round.elapsed_seconds));
    round.arm = ctx.arm.as_deref().map(str::to_string);
    let load = GeneratorLoad::new(
        (
            spent.cpu_ns,
            spent.to_ns.saturating_sub(spent.from_ns),
            cores(),
        ),
        lags,
        round.total_us.p50,
    );
    let arm = ctx
        .arm
        .as_deref()
        .map_or(String::new(), |a| format!("[{a}] "));
    if let Some(w) = &load.warning {
        ctx.base.progress.println(format!(
            "warning: {arm}{} {} round {}: {w}",
            case.name,
            crate::model::Level::named(at.level),
            rep + 1
        ));
    }
    let here = format!(
        "{arm}{} {} round {}",
        case.name,
        crate::model::Level::named(at.level),
        rep + 1
    );
    if let Some(line) = saturated_line(&round, &here, "the rate") {
        ctx.base.progress.println(line);
    }
    round.generator = Some(load);
    round
}

/// The warning a saturated open round (`here`: which one) earns: its late sends and the
/// worst, and the fix (`lower`: what to lower besides raising `load.max_in_flight`).
pub(super) fn saturated_line(round: &RoundMetrics, here: &str, lower: &str) -> Option<String> {
    let o = round.open.as_ref().filter(|o| o.saturated)?;
    Some(format!(
        "warning: {here}: saturated: {} of {} sends fell more than {} ms behind their schedule (worst {:.1} ms); raise load.max_in_flight or lower {lower}",
        o.late_sends,
        round.attempted_requests,
        metrics::SATURATION_LAG_US / 1000,
        o.send_lag_max_us.unwrap_or(0) as f64 / 1000.0
    ))
}

/// The round a round-edge scrape of the worker's metrics belongs to, or `None` when no
/// edge scrape is taken: a shard's wave keeps its timetable (its scrapes are the
/// interval's), and a stopping run does not wait for one.
fn round_edges(ctx: &Ctx, work: &Work, at: At, rep: usize) -> Option<RoundId> {
    match work {
        Work::Open(OpenWave {
            start_ns: Some(_), ..
        }) => None,
        _ if ctx.stopped() => None,
        _ => Some(RoundId {
            case_name: ctx.case_names[at.ci].clone(),
            concurrency: match at.level {
                Level::Concurrency(c) => Some(c as i32),
                Level::Rate(_) => None,
            },
            target_rate_per_second: match at.level {
                Level::Rate(r) => Some(r),
                Level::Concurrency(_) => None,
            },
            repetition: rep as i32,
        }),
    }
}

/// A measured round: its metrics, its samples (for a campaign's cells) and when it ran.
pub(super) struct Measured {
    pub(super) round: RoundMetrics,
    pub(super) samples: Vec<Sample>,
    pub(super) window_ns: (u64, u64),
}
