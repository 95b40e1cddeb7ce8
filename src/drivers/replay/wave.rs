//! One closed-loop wave of `c` workers, and the dispatch-lag probe that watches the
//! runtime while a measured round runs.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::ctx::{Ctx, Dispatch, Slot};
use super::exchange::{Rows, WAVE_ROW_BATCH};
use super::session::send;
use crate::clock;
use crate::metrics::Sample;
use crate::model::Phase;
use crate::record::RecordError;

/// Cores the run can use: those in the process's CPU affinity (e.g. under `taskset`), at
/// most the runtime's threads (`--threads`) plus the recorder's.
pub(super) fn cores() -> usize {
    let affinity = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads =
        tokio::runtime::Handle::try_current().map_or(affinity, |h| h.metrics().num_workers() + 1);
    affinity.min(threads)
}

/// The dispatch-lag probe: a task on the same runtime as the workers that asks to wake
/// every 10 ms and notes how late it did. A runtime too busy to poll its tasks on time
/// shows here before it shows anywhere else.
pub(super) struct LagProbe {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Vec<i64>>,
}

impl LagProbe {
    const EVERY: std::time::Duration = std::time::Duration::from_millis(10);

    pub(super) fn start() -> LagProbe {
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let mut lags = Vec::new();
            loop {
                let due = clock::now_ns() + LagProbe::EVERY.as_nanos() as u64;
                tokio::select! {
                    _ = tokio::time::sleep(LagProbe::EVERY) => {
                        lags.push(clock::us_between(due, clock::now_ns()));
                    }
                    _ = &mut stopped => return lags,
                }
            }
        });
        LagProbe { stop, task }
    }

    pub(super) async fn stop(self) -> Vec<i64> {
        let _ = self.stop.send(());
        self.task.await.unwrap_or_default()
    }
}

/// One closed-loop wave: `c` workers share `n` dispatch indices.
pub(super) async fn wave(
    ctx: &Arc<Ctx>,
    slots: &mut [Slot],
    case: usize,
    phase: Phase,
    c: usize,
    repetition: Option<usize>,
    n: usize,
) -> Vec<Sample> {
    let next = Arc::new(AtomicUsize::new(0));
    let variants = ctx.plan.cases[case].variants.len();
    let mut tasks = Vec::with_capacity(c);
    for (w, slot) in slots.iter_mut().enumerate().take(c) {
        let ctx = ctx.clone();
        let next = next.clone();
        let mut slot = slot.take();
        tasks.push(tokio::spawn(async move {
            // Closed loop: each worker takes about n / c requests. Nothing is allocated per
            // planned request up front: a round that stops early never pays for the rest.
            let mut samples = Vec::with_capacity((n / c.max(1) + 1).min(1024));
            let mut rows = Rows::new(WAVE_ROW_BATCH);
            let mut sent = false;
            loop {
                if ctx.stopped() {
                    break;
                }
                // Feasibility is one wave: worker w sends exactly request w, so all c
                // connections are opened and exercised at once. Measured rounds are a
                // closed loop: a worker takes the next index as soon as it is free.
                let i = if phase == Phase::Feasibility {
                    // One dispatch (a session may return several samples, or none).
                    if sent {
                        break;
                    }
                    sent = true;
                    w
                } else {
                    next.fetch_add(1, Ordering::Relaxed)
                };
                if i >= n {
                    break;
                }
                let d = Dispatch {
                    phase,
                    case: Some(case),
                    variant: i % variants,
                    concurrency: Some(c as i32),
                    repetition: repetition.map(|r| r as i32),
                    dispatch_index: i as i64,
                    worker: w as i32,
                    rate: None,
                    scheduled_offset_us: None,
                    synthetic: None,
                    turn: None,
                };
                send(&ctx, &mut slot, d, &mut rows, &mut samples).await;
            }
            rows.flush(&ctx).await;
            (slot, samples)
        }));
    }
    let mut per_worker = Vec::with_capacity(c);
    for (w, t) in tasks.into_iter().enumerate() {
        match t.await {
            Ok((slot, samples)) => {
                slots[w] = slot;
                per_worker.push(samples);
            }
            Err(e) => {
                // A panicking worker is a bug; stop the run rather than hide it.
                ctx.base
                    .run
                    .record_failed(RecordError(format!("internal: worker {w} failed: {e}")));
                ctx.halt();
            }
        }
    }
    // One allocation of the round's size: growing it by doubling copied every sample
    // again and faulted in fresh pages (5 % of a large round's CPU, measured with perf).
    let mut all = Vec::with_capacity(per_worker.iter().map(Vec::len).sum());
    for samples in per_worker {
        all.extend(samples);
    }
    all
}
