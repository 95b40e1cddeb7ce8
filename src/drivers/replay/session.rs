//! One session of a case, run by one worker: its turns in order on the worker's
//! connection slot (one connection for the session under `keep-alive`; a fresh one per
//! turn under `fresh`), each after the end of the previous turn and its think time. In
//! a trace (a run its turn-1 entry started) a later turn given an entry of its own is due
//! at the later of that entry's offset and then: its `scheduled_offset_us` is the due
//! time (its latency counts from it) and `session_lag_us` how much later than its offset
//! that was. A turn's request is made at send time (`Ctx::turn_request`): the history is the plan's
//! recorded answers (`history: frozen`) or the answers this session received
//! (`history: live`, read from each answer as it ends; the bytes sent are what the row
//! records).
//!
//! A failed turn stops its session under `on_failure: stop` (dispatch stops anyway) and
//! in a live history whose answer is missing; its later turns are not attempted, counted
//! in the round's planned requests and said in `load.notes`
//! ([`Base::session_stopped`](super::ctx::Base)).

use std::sync::atomic::Ordering;

use serde_json::Value;

use super::ctx::{Ctx, Dispatch, Slot, TurnAt, wait_until};
use super::exchange::{NoAnswer, Rows, exchange, exchange_as};
use crate::config::plan::OnFailure;
use crate::config::sessions::History;
use crate::metrics::Sample;
use crate::model::{Outcome, Phase};

/// Send dispatch `d` (its samples into `out`): one request, or in a case with sessions
/// one run of a session, every turn: the session a trace's entry names (`d.turn`), else
/// the one its dispatch index names (`i mod sessions`). The closed loop's workers, the
/// open loop's and a trace's senders and a trace's readiness all send this way.
pub(super) async fn send(
    ctx: &Ctx,
    slot: &mut Slot,
    d: Dispatch,
    rows: &mut Rows,
    out: &mut Vec<Sample>,
) {
    let sessions = d
        .case
        .and_then(|ci| ctx.plan.cases[ci].sessions.as_ref())
        .map(|s| s.list.len().max(1));
    match sessions {
        Some(count) => {
            // A trace's arrival names its session; any other dispatch `i` runs session
            // `i` mod the case's sessions.
            let which = d
                .turn
                .map_or(d.dispatch_index as usize % count, |t| t.session as usize);
            out.extend(session(ctx, slot, d, which, rows).await);
        }
        None => out.push(exchange(ctx, slot, d, rows).await),
    }
}

/// The largest request a session's turn sends (the plan's own bound, 64 MiB): a live
/// history holds the server's answers, and each turn resends them all.
const MAX_TURN_BYTES: usize = crate::config::plan::MAX_PLAN_BYTES as usize;

/// Notes a run keeps of stopped sessions (one line each); later ones are counted only.
const NOTED_STOPS: u64 = 10;

/// Run session `session` of `base.case` (every other field of `base` as its turns' rows
/// say it: phase, level, repetition, dispatch index, worker) and return its turns'
/// samples (fewer than its turns when it stopped).
pub(super) async fn session(
    ctx: &Ctx,
    slot: &mut Slot,
    base: Dispatch,
    session: usize,
    rows: &mut Rows,
) -> Vec<Sample> {
    let Some(ci) = base.case else {
        return Vec::new();
    };
    let Some(sessions) = ctx.plan.cases[ci].sessions.clone() else {
        return Vec::new();
    };
    let Some(s) = sessions.list.get(session) else {
        return Vec::new();
    };
    let live = sessions.history == History::Live;
    let frozen = sessions.frozen_answers(session);
    let mut samples = Vec::with_capacity(s.turns.len());
    let tag = sessions.cache_bust.then(|| cache_tag(ctx, &base, &s.id));
    // The conversation so far, each message serialized once as the session goes.
    let mut conversation = sessions.conversation(tag.as_deref());
    // A trace's run: each turn's own offset on the run's clock (empty otherwise).
    let offsets = trace_offsets(ctx, &base);
    // Readiness and a closed loop's warm-up send every session whole without its think
    // times (they would only lengthen them); feasibility and measured rounds, and a
    // trace's warm-up seconds, wait them.
    let thinks = !offsets.is_empty() || matches!(base.phase, Phase::Feasibility | Phase::Measured);
    for (k, turn) in s.turns.iter().enumerate() {
        let Some(due) = due_of(ctx, &base, (k, turn.think), &offsets, thinks).await else {
            break;
        };
        if ctx.stopped() {
            break;
        }
        let at = TurnAt {
            session: session as u32,
            turn: k as u16,
            lag_us: due.lag_us,
        };
        let body = turn
            .messages
            .as_deref()
            .map(|now| conversation.request(now));
        let made = ctx.turn_request(ci, at, body);
        // A live history grows with the server's answers: a session whose next request
        // would pass the bound stops (what a server sends back cannot grow it unbounded).
        if let Some(why) = too_large(made.as_ref()) {
            let left = s.turns.len() - k;
            let stop = (base.phase, ci);
            ctx.base
                .session_stopped(ctx, stop, &s.id, k.saturating_sub(1), left, &why);
            break;
        }
        // An open loop's arrival is the first turn's intended send; a later turn is due
        // when it is sent (the end of the previous one and its think time). A trace's
        // later turn is due at the later of that and its own entry's offset, and its
        // latency counts from then.
        let d = Dispatch {
            variant: s.first_variant + k,
            turn: Some(at),
            scheduled_offset_us: due.scheduled_us,
            ..base
        };
        let last = k + 1 == s.turns.len();
        // A whole-request turn adds nothing to the history: its answer is not read.
        let chat = turn.messages.is_some();
        let (sample, answer) = exchange_as(ctx, slot, d, made, rows, live && chat && !last).await;
        let failed = sample.outcome != Outcome::Ok;
        samples.push(sample);
        match carry(ctx, live, failed, answer) {
            Err(why) if !last => {
                let left = s.turns.len() - k - 1;
                ctx.base
                    .session_stopped(ctx, (base.phase, ci), &s.id, k, left, &why);
                break;
            }
            Err(_) => {}
            Ok(received) => {
                if let Some(now) = &turn.messages {
                    let answer = if live { received.as_ref() } else { frozen[k] };
                    conversation.carry(now, answer);
                }
            }
        }
    }
    samples
}

/// What a turn's end leaves the session: the answer a live history carries (`None`: it
/// was not read, as a whole-request turn's or a frozen history's), or why the session
/// stops here.
fn carry(
    ctx: &Ctx,
    live: bool,
    failed: bool,
    answer: Option<Result<Value, NoAnswer>>,
) -> Result<Option<Value>, Stop> {
    match answer {
        Some(Ok(a)) => Ok(Some(a)),
        Some(Err(why)) => Err(Stop::NoAnswer(why)),
        None if failed && ctx.plan.on_failure == OnFailure::Stop => Err(Stop::Failed),
        None if failed && live => Err(Stop::FailedLive),
        None => Ok(None),
    }
}

/// Why a session stops before its last turn.
#[derive(Debug, thiserror::Error)]
pub(super) enum Stop {
    #[error("its answer cannot continue a live history: {0}")]
    NoAnswer(#[source] NoAnswer),
    #[error("it failed (on_failure: stop)")]
    Failed,
    #[error("it failed, so a live history has no answer to carry")]
    FailedLive,
    #[error(
        "its request would carry {bytes} bytes of conversation, past the {MAX_TURN_BYTES}-byte bound of a turn"
    )]
    TooLarge { bytes: usize },
}

/// Why a turn's request is not sent: it would carry more than [`MAX_TURN_BYTES`].
fn too_large(made: Option<&super::ctx::Frozen>) -> Option<Stop> {
    let bytes = made.map(|f| f.body.len()).filter(|&n| n > MAX_TURN_BYTES)?;
    Some(Stop::TooLarge { bytes })
}

/// A cache-busting session run's tag: the first 8 bytes of SHA-256 over where the run
/// sits (case, session, phase, level, repetition, dispatch index) in hex, so every run of
/// a session in the run has its own, and a campaign's arms send the same requests.
fn cache_tag(ctx: &Ctx, d: &Dispatch, id: &str) -> String {
    use sha2::{Digest, Sha256};
    let at = format!(
        "{}\n{id}\n{}\n{:?}\n{:?}\n{:?}\n{}",
        d.case.map_or("", |c| &ctx.case_names[c]),
        d.phase.as_str(),
        d.concurrency,
        d.rate,
        d.repetition,
        d.dispatch_index
    );
    let digest = Sha256::digest(at.as_bytes());
    format!("[{}] ", crate::model::hex(&digest[..8]))
}

/// When a later turn was due (run clock, µs) and how much later than its own trace
/// offset (µs; `None` without one).
#[derive(Clone, Copy)]
struct Due {
    scheduled_us: Option<i64>,
    lag_us: Option<i64>,
}

/// A trace's session run (its dispatch `base` names a pick whose entry starts one, in
/// the warm-up seconds or the round): each turn's own offset on the run's clock (µs),
/// turn 1's the pick's, `None` for a turn no entry gives. Empty outside a trace's rounds.
fn trace_offsets(ctx: &Ctx, base: &Dispatch) -> Vec<Option<i64>> {
    let (Some(t), Some(first)) = (ctx.plan.load.trace.as_ref(), base.scheduled_offset_us) else {
        return Vec::new();
    };
    let Some((_, offsets)) = u32::try_from(base.dispatch_index)
        .ok()
        .and_then(|e| t.run_at(e))
    else {
        return Vec::new();
    };
    // The round's start on the run's clock: the pick's scheduled send less its offset.
    let start = first - offsets.first().copied().flatten().unwrap_or(0) as i64;
    offsets
        .into_iter()
        .map(|o| o.map(|o| start.saturating_add(o as i64)))
        .collect()
}

/// When turn `k` (from 0, with its `think` time) of the run `base` dispatched is due,
/// waiting for it when it is a later turn that waits (`thinks`): the first turn's is the
/// dispatch's; in a trace (`offsets` not empty) a later turn's is its due time and lag;
/// elsewhere a later turn has none (it is due when sent). `None` when the run stopped.
async fn due_of(
    ctx: &Ctx,
    base: &Dispatch,
    (k, think): (usize, std::time::Duration),
    offsets: &[Option<i64>],
    thinks: bool,
) -> Option<Due> {
    let traced = !offsets.is_empty();
    let first = Due {
        scheduled_us: base.scheduled_offset_us.filter(|_| k == 0),
        lag_us: traced.then_some(0),
    };
    let own = offsets.get(k).copied().flatten();
    // Outside a trace a turn with no think time is due at once: no clock read, no wait.
    if k == 0 || !thinks || (!traced && think.is_zero()) {
        return Some(first);
    }
    let waited = wait_due(ctx, think, own).await?;
    Some(if traced { waited } else { first })
}

/// Wait for a later turn: its think time after the turn before it ended (now), and its
/// own trace offset `own` (run clock, µs) if it has one, whichever is later. `None` when
/// the run stopped first.
async fn wait_due(ctx: &Ctx, think: std::time::Duration, own: Option<i64>) -> Option<Due> {
    let t0 = ctx.base.run.run_t0_ns;
    let now_us = crate::clock::us_between(t0, crate::clock::now_ns());
    let ready_us = now_us.saturating_add(think.as_micros() as i64);
    let due_us = own.map_or(ready_us, |o| o.max(ready_us));
    let until = t0.saturating_add((due_us.max(0) as u64).saturating_mul(1000));
    wait_until(ctx, until).await;
    (!ctx.stopped()).then_some(Due {
        scheduled_us: Some(due_us),
        lag_us: own.map(|o| due_us - o),
    })
}

impl super::ctx::Base {
    /// Session `id` of case `ci` stopped in `phase` after its turn `k` (from 0) for `why`; `left`
    /// turns are not attempted. The first [`NOTED_STOPS`] go to `load.notes` and the
    /// progress output, the rest are counted.
    pub(super) fn session_stopped(
        &self,
        ctx: &Ctx,
        (phase, ci): (Phase, usize),
        id: &str,
        k: usize,
        left: usize,
        why: &Stop,
    ) {
        let n = self.sessions_stopped.fetch_add(1, Ordering::Relaxed) + 1;
        self.turns_not_attempted
            .fetch_add(left as u64, Ordering::Relaxed);
        if n > NOTED_STOPS {
            return;
        }
        let phase = phase.as_str();
        let arm = ctx
            .arm
            .as_deref()
            .map(|a| format!("[{a}] "))
            .unwrap_or_default();
        let line = format!(
            "{arm}{phase} case '{}' session '{id}' stopped at turn {} of {}: {why}; its {left} later turn(s) were not attempted",
            ctx.case_names[ci],
            k + 1,
            k + 1 + left,
        );
        self.progress.println(format!("note: {line}"));
        if let Ok(mut notes) = self.notes.lock() {
            notes.push(line);
        }
    }

    /// The closing note of the sessions stopped past the first [`NOTED_STOPS`].
    pub(super) fn sessions_note(&self) -> Option<String> {
        let n = self.sessions_stopped.load(Ordering::Relaxed);
        (n > NOTED_STOPS).then(|| {
            format!(
                "{n} sessions stopped before their last turn in all ({} turns not attempted); the first {NOTED_STOPS} are noted above",
                self.turns_not_attempted.load(Ordering::Relaxed)
            )
        })
    }
}
