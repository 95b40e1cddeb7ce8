//! One round of a trace plan (`load.mode "trace"`): the window's entries sent at their
//! recorded offsets divided by `speedup`, every case in the trace's order, by the same
//! pacer as an open loop (`open.rs`: absolute instants, `max_in_flight`, latency from the
//! intended send). The window's first `warmup_seconds` go out as `warmup` and are
//! excluded; the rest are the round, reported per case at the trace's level (its
//! recorded rate: `TraceLoad::rate`), in the order `summarize` rebuilds them.
//!
//! An entry naming a session's turn 1 starts a run of that session (`session.rs`): its
//! later turns are sent by the run, each due at the later of its own entry's offset and
//! the end of the turn before it plus its think time, its latency counted from then and
//! the difference kept as its session lag.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::ctx::Ctx;
use super::ctx::wait_until;
use super::open::{Arrivals, OpenPool, OpenWave, open_wave};
use super::phases::{label, saturated_line, timetable_start};
use super::wave::{LagProbe, cores};
use crate::clock;
use crate::metrics::{self, GeneratorLoad, PhaseCounts, RoundMetrics, Sample};
use crate::model::{Level, Phase};

/// A trace round's rounds, one per case it sent, each with its case's index.
pub(super) type CaseRounds = Vec<(usize, RoundMetrics)>;

/// Run repetition `rep` of the plan's trace; its warm-up sends are counted in `excluded`.
pub(super) async fn trace_round(
    ctx: &Arc<Ctx>,
    pool: &Arc<OpenPool>,
    rep: usize,
    excluded: &mut BTreeMap<Phase, PhaseCounts>,
) -> CaseRounds {
    let Some(t) = ctx.plan.load.trace.as_ref() else {
        return Vec::new();
    };
    let shard = ctx.base.shape.shard_of();
    let picks = t.picks(shard);
    let rate = t.rate();
    // Every shard's timetable steps by the whole window's span, not its own share's.
    let start_ns = timetable_start(ctx, t.span_us());
    ctx.base.progress.set_message(label(
        ctx,
        &format!(
            "trace round {} ({} sends at {}x)",
            rep + 1,
            picks.len(),
            t.speedup
        ),
    ));
    // Each case's measured sends, counted once from this process's picks.
    let mut planned: BTreeMap<usize, u64> = BTreeMap::new();
    for p in picks.iter().filter(|p| !p.warmup) {
        *planned.entry(t.case_of(p.entry)).or_default() += t.requests_of(p.entry);
    }
    // The probe takes a quarter of a second: a shard measures it only when its wave's
    // place in the timetable leaves the time.
    let room = start_ns.is_none_or(|s| s.saturating_sub(clock::now_ns()) > FLOOR_ROOM_NS);
    let floor = if room { wake_floor().await } else { None };
    let wave = OpenWave {
        phase: Phase::Measured,
        rate,
        repetition: Some(rep),
        arrivals: Arrivals::Trace(picks),
        start_ns,
    };
    if let Some(start) = start_ns {
        wait_until(ctx, start.saturating_sub(5_000_000)).await;
    }
    let recorder = &ctx.base.run.recorder;
    if ctx.base.record_exchanges {
        recorder.hold(usize::try_from(wave.planned(ctx)).unwrap_or(usize::MAX));
    }
    let probe = LagProbe::start();
    let (cpu0, wall0) = (clock::process_cpu_ns(), clock::now_ns());
    let sent = open_wave(ctx, pool, wave).await;
    let (cpu1, wall1) = (clock::process_cpu_ns(), clock::now_ns());
    let lags = probe.stop().await;
    if ctx.base.record_exchanges
        && let Err(e) = recorder.release().await
    {
        ctx.base.run.record_failed(e);
        ctx.halt();
    }
    let mut by_case: BTreeMap<usize, Vec<Sample>> = BTreeMap::new();
    for s in sent {
        if s.phase == Phase::Warmup {
            excluded.entry(Phase::Warmup).or_default().add(&s.sample);
        } else {
            by_case.entry(s.case).or_default().push(s.sample);
        }
    }
    let spent = (cpu1.saturating_sub(cpu0), wall1.saturating_sub(wall0));
    by_case
        .into_iter()
        .map(|(ci, samples)| {
            let planned = planned.get(&ci).copied().unwrap_or(0);
            let mut round = case_round(ctx, ci, Level::Rate(rate), rep, planned, &samples);
            if let Some(o) = round.open.as_mut() {
                o.wake_floor_p99_us = floor;
            }
            (ci, with_generator(ctx, round, spent, lags.clone(), rep))
        })
        .collect()
}

/// Deadlines the wake-up probe sleeps to, this far apart (as the pacer's sends may be).
const FLOOR_STEP_NS: u64 = 500_000;
/// Deadlines it sleeps to: a quarter of a second.
const FLOOR_WAKES: u64 = 500;
/// The time before a shard's wave the probe needs (its quarter second and a margin).
const FLOOR_ROOM_NS: u64 = 350_000_000;

/// The machine's wake-up floor just before a trace round: how late (p99, µs) a bare
/// thread wakes when it sleeps to absolute deadlines 500 µs apart, as the pacer sleeps
/// (tests/timing.rs measures the same beside its sends). A send lag near it is the
/// machine's, not the tool's. `None` when the probe could not run.
async fn wake_floor() -> Option<i64> {
    let probe = tokio::task::spawn_blocking(|| {
        let t0 = clock::now_ns();
        let mut late: Vec<i64> = Vec::with_capacity(FLOOR_WAKES as usize);
        for k in 1..=FLOOR_WAKES {
            let due = t0 + k * FLOOR_STEP_NS;
            let now = clock::now_ns();
            if now < due {
                std::thread::sleep(std::time::Duration::from_nanos(due - now));
            }
            late.push(clock::us_between(due, clock::now_ns()));
        }
        metrics::Percentiles::of(late).p99
    });
    probe.await.ok().flatten()
}

/// The round of case `ci` within a trace round, as `summarize` rebuilds it from the rows.
fn case_round(
    ctx: &Ctx,
    ci: usize,
    level: Level,
    rep: usize,
    planned: u64,
    samples: &[Sample],
) -> RoundMetrics {
    let name = &ctx.plan.cases[ci].name;
    let mut round = metrics::level_round_metrics(name, level, rep, planned, samples);
    round.goodput = ctx
        .plan
        .slo
        .as_ref()
        .map(|slo| metrics::goodput(samples, slo, round.elapsed_seconds));
    round.arm = ctx.arm.as_deref().map(str::to_string);
    round
}

/// The generator's load over the whole trace round (`spent`: CPU and wall ns), on each
/// case's round; a saturated case says so.
fn with_generator(
    ctx: &Ctx,
    mut round: RoundMetrics,
    (cpu_ns, wall_ns): (u64, u64),
    lags: Vec<i64>,
    rep: usize,
) -> RoundMetrics {
    let load = GeneratorLoad::new((cpu_ns, wall_ns, cores()), lags, round.total_us.p50);
    if let Some(w) = &load.warning {
        ctx.base.progress.println(format!(
            "warning: {} trace round {}: {w}",
            round.case_name,
            rep + 1
        ));
    }
    let here = format!("{} trace round {}", round.case_name, rep + 1);
    if let Some(line) = saturated_line(&round, &here, "load.speedup") {
        ctx.base.progress.println(line);
    }
    round.generator = Some(load);
    round
}
