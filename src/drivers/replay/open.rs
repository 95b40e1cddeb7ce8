//! One open-loop wave: every arrival of a seeded schedule is sent at its instant, whatever
//! the worker does, so a stalled worker shows as latency from the intended time instead
//! of as fewer, later sends (coordinated omission).
//!
//! # The life of an open-loop round
//!
//! 1. `arms::measure_level` takes the plan's levels in order (`Plan::levels`: concurrencies,
//!    or an open loop's rates; under `--sweep`, a round at c = 1, one at the highest
//!    concurrency, then the rates placed between their throughputs).
//! 2. For a rate, `At::open_wave` (in `phases.rs`) computes the round's schedule
//!    before it starts (`config::load::Load::schedule`: the seed's stream for (case, level,
//!    repetition), offsets in µs from the round's start) and, under `--shard`, takes the
//!    wave's start from the shared `Timetable` and keeps the shard's indices.
//! 3. [`open_wave`] fixes the wave's start in whole microseconds on the run's clock and
//!    starts a pacer on a blocking thread: for each arrival it sleeps to the absolute instant
//!    (`std::thread::sleep`, microseconds; never the runtime's 1 ms timer, never a gap per
//!    request), takes a permit of the `max_in_flight` semaphore (waiting, blocking that
//!    thread, when none is free: the send is late, never dropped, and its lateness is the
//!    exchange's `send_lag_us`), and spawns the exchange on
//!    the runtime. A sender takes a connection from the `OpenPool` (its number is the row's
//!    `worker`), runs the same `exchange` as a closed-loop worker with the arrival's
//!    `scheduled_offset_us` in its `Dispatch`, and puts the connection back.
//! 4. The samples carry `scheduled_offset_us`; `metrics::level_round_metrics` adds the send
//!    lag, the latency from intended times, the achieved rate, the arrivals' CV and
//!    saturation, and `metrics::goodput` counts against the plan's `slo` (closed rounds too).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};

use super::ctx::{Ctx, Dispatch, Slot, TurnAt};
use super::exchange::Rows;
use super::session::send;
use crate::clock;
use crate::config::load::Pick;
use crate::metrics::Sample;
use crate::model::Phase;
use crate::record::RecordError;

/// The open loop's senders' connections between exchanges. A sender takes the lowest
/// free one (its number is the row's `worker`), so the same few connections carry a light
/// load; there are never more than `max_in_flight`. The mutex is held for one map insert
/// or removal, never across an await.
#[derive(Default)]
pub(super) struct OpenPool {
    free: Mutex<BTreeMap<i32, Slot>>,
    next: AtomicI32,
}

impl OpenPool {
    fn take(&self) -> (i32, Slot) {
        let got = self.free.lock().ok().and_then(|mut f| f.pop_first());
        got.unwrap_or_else(|| (self.next.fetch_add(1, Ordering::Relaxed), None))
    }

    fn put(&self, worker: i32, slot: Slot) {
        if let Ok(mut f) = self.free.lock() {
            f.insert(worker, slot);
        }
    }

    /// Close every kept connection (between arms, at the end).
    pub(super) fn clear(&self) {
        if let Ok(mut f) = self.free.lock() {
            f.clear();
        }
    }
}

/// What one open wave sends.
pub(super) struct OpenWave {
    pub(super) phase: Phase,
    /// The level the rows record (`target_rate_per_second`).
    pub(super) rate: f64,
    pub(super) repetition: Option<usize>,
    pub(super) arrivals: Arrivals,
    /// The wave's start on the monotonic clock; `None`: 2 ms from now.
    pub(super) start_ns: Option<u64>,
}

/// A wave's arrivals, in the order they are due.
pub(super) enum Arrivals {
    /// A seeded schedule of one case: arrival `i` at `schedule[i]` µs sends variant
    /// `i mod variants`; under `shard` `(k, n)`, only the arrivals whose index is `k`
    /// modulo `n`.
    Schedule {
        case: usize,
        schedule: Vec<u64>,
        shard: Option<(usize, usize)>,
    },
    /// A trace round: each pick its entry, at its offset (a shard's picks already
    /// chosen); picks within the warm-up seconds are sent as `warmup`.
    Trace(Vec<Pick>),
}

impl OpenWave {
    /// How many requests this process sends: an arrival of a case with sessions sends
    /// every turn of its session.
    pub(super) fn planned(&self, ctx: &Ctx) -> u64 {
        match &self.arrivals {
            Arrivals::Schedule {
                case,
                schedule,
                shard,
            } => {
                let n = crate::config::load::shard_share(schedule.len(), *shard);
                ctx.plan.cases[*case].requests_of(n as usize)
            }
            Arrivals::Trace(picks) => match ctx.plan.load.trace.as_ref() {
                Some(t) => picks.iter().map(|p| t.requests_of(p.entry)).sum(),
                None => picks.len() as u64,
            },
        }
    }

    /// Arrival `i` if this process sends it: its offset and what it sends.
    fn arrival(&self, ctx: &Ctx, i: usize) -> Option<(u64, Dispatch)> {
        let mut d = Dispatch {
            phase: self.phase,
            case: None,
            variant: 0,
            concurrency: None,
            repetition: self.repetition.map(|r| r as i32),
            dispatch_index: i as i64,
            worker: 0,
            rate: Some(self.rate),
            scheduled_offset_us: None,
            synthetic: None,
            turn: None,
        };
        match &self.arrivals {
            Arrivals::Schedule {
                case,
                schedule,
                shard,
            } => {
                if shard.is_some_and(|(k, n)| i % n != k) {
                    return None;
                }
                d.case = Some(*case);
                d.variant = i % ctx.plan.cases[*case].variants.len();
                schedule.get(i).map(|&off| (off, d))
            }
            Arrivals::Trace(picks) => {
                let p = picks.get(i)?;
                let t = ctx.plan.load.trace.as_ref()?;
                let (case, variant, synthetic) = t.target(p.entry);
                d.dispatch_index = i64::from(p.entry);
                // An entry naming a session's turn 1 starts a run of that session.
                let run = t.entries.as_ref().and_then(|e| e.run_of(p.entry));
                d.turn = run.map(|r| TurnAt {
                    session: r.session,
                    turn: 0,
                    lag_us: None,
                });
                if p.warmup {
                    d.phase = Phase::Warmup;
                }
                (d.case, d.variant, d.synthetic) = (Some(case), variant, synthetic);
                Some((p.offset_us, d))
            }
        }
    }

    fn len(&self) -> usize {
        match &self.arrivals {
            Arrivals::Schedule { schedule, .. } => schedule.len(),
            Arrivals::Trace(picks) => picks.len(),
        }
    }
}

/// One sent arrival: its case and phase (a trace round's sends span cases and its
/// warm-up), and what the metrics need.
pub(super) struct Sent {
    pub(super) case: usize,
    pub(super) phase: Phase,
    pub(super) sample: Sample,
}

/// Lead time between computing a wave's start and its first arrival, so that the first
/// send is not already late.
const LEAD_NS: u64 = 2_000_000;

/// Run one open wave; its sends in no particular order.
pub(super) async fn open_wave(ctx: &Arc<Ctx>, pool: &Arc<OpenPool>, w: OpenWave) -> Vec<Sent> {
    let run_t0 = ctx.base.run.run_t0_ns;
    let start_ns = w.start_ns.unwrap_or_else(|| clock::now_ns() + LEAD_NS);
    // Whole microseconds on the run's clock, so a recorded `scheduled_offset_us` minus
    // the wave's start is exactly the schedule's offset.
    let start_us = start_ns.saturating_sub(run_t0) / 1000;
    let base_ns = run_t0 + start_us * 1000;
    let handle = tokio::runtime::Handle::current();
    let sem = Arc::new(tokio::sync::Semaphore::new(ctx.plan.load.max_in_flight));
    let (ctx2, pool2) = (ctx.clone(), pool.clone());
    let pacer = tokio::task::spawn_blocking(move || {
        let mut tasks = Vec::with_capacity(w.len());
        for i in 0..w.len() {
            let Some((off, d)) = w.arrival(&ctx2, i) else {
                continue;
            };
            if !sleep_until(base_ns.saturating_add(off.saturating_mul(1000)), &ctx2) {
                break;
            }
            // At max_in_flight: wait for a send to end (its lateness is recorded), looking
            // every 50 ms for a stop.
            let Some(permit) = acquire(&handle, &sem, &ctx2) else {
                break;
            };
            let d = Dispatch {
                scheduled_offset_us: Some(
                    i64::try_from(start_us.saturating_add(off)).unwrap_or(i64::MAX),
                ),
                ..d
            };
            let (ctx, pool) = (ctx2.clone(), pool2.clone());
            tasks.push(handle.spawn(async move {
                let (worker, mut slot) = pool.take();
                let d = Dispatch { worker, ..d };
                // A case with sessions: the arrival's permit is held for every turn (the
                // open loop's max_in_flight counts sessions).
                let mut samples = Vec::with_capacity(1);
                send(&ctx, &mut slot, d, &mut Rows::new(1), &mut samples).await;
                pool.put(worker, slot);
                drop(permit);
                samples
                    .into_iter()
                    .map(|sample| Sent {
                        case: d.case.unwrap_or(0),
                        phase: d.phase,
                        sample,
                    })
                    .collect::<Vec<Sent>>()
            }));
        }
        tasks
    });
    let tasks = match pacer.await {
        Ok(t) => t,
        Err(e) => {
            failed(ctx, format!("internal: the open-loop pacer failed: {e}"));
            return Vec::new();
        }
    };
    let mut samples = Vec::with_capacity(tasks.len());
    for t in tasks {
        match t.await {
            Ok(s) => samples.extend(s),
            Err(e) => failed(ctx, format!("internal: an open-loop sender failed: {e}")),
        }
    }
    samples
}

/// A permit to send, waiting for one while `max_in_flight` are in flight; `None` when the
/// arm stopped meanwhile.
fn acquire(
    handle: &tokio::runtime::Handle,
    sem: &Arc<tokio::sync::Semaphore>,
    ctx: &Ctx,
) -> Option<tokio::sync::OwnedSemaphorePermit> {
    // The pacer has just seen no stop: a free permit is taken at once.
    if let Ok(p) = sem.clone().try_acquire_owned() {
        return Some(p);
    }
    loop {
        if ctx.stopped() {
            return None;
        }
        let wait = async { tokio::time::timeout(STOP_CHECK, sem.clone().acquire_owned()).await };
        if let Ok(Ok(p)) = handle.block_on(wait) {
            return (!ctx.stopped()).then_some(p);
        }
    }
}

/// How often a waiting pacer looks for a stop.
const STOP_CHECK: std::time::Duration = std::time::Duration::from_millis(50);

/// A panicking sender is a bug; stop the run rather than hide it.
fn failed(ctx: &Ctx, why: String) {
    ctx.base.run.record_failed(RecordError(why));
    ctx.halt();
}

/// Sleep on this (blocking) thread until `due_ns` on the monotonic clock, waking at least
/// every 50 ms to see a stop; `false` when the arm stopped.
fn sleep_until(due_ns: u64, ctx: &Ctx) -> bool {
    loop {
        if ctx.stopped() {
            return false;
        }
        let now = clock::now_ns();
        if now >= due_ns {
            return true;
        }
        let left = (due_ns - now).min(STOP_CHECK.as_nanos() as u64);
        std::thread::sleep(std::time::Duration::from_nanos(left));
    }
}
