//! One session of a case, run by one worker: its turns in order on the worker's
//! connection slot (one connection for the session under `keep-alive`; a fresh one per
//! turn under `fresh`), each after the end of the previous turn and its think time. A
//! turn's request is made at send time (`Ctx::turn_request`): the history is the plan's
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

use super::ctx::{Ctx, Dispatch, Slot, TurnAt};
use super::exchange::{NoAnswer, Rows, exchange, exchange_as};
use crate::config::plan::OnFailure;
use crate::config::sessions::History;
use crate::metrics::Sample;
use crate::model::{Outcome, Phase};

/// Send dispatch `d` (its samples into `out`): one request, or in a case with sessions
/// the session its dispatch index names (`i mod sessions`), every turn. The closed loop's
/// workers and the open loop's senders both send this way.
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
            let which = d.dispatch_index as usize % count;
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
    for (k, turn) in s.turns.iter().enumerate() {
        // Readiness and warm-up send every session whole without its think times (they
        // would only lengthen them); feasibility and measured rounds wait them.
        let thinks = matches!(base.phase, Phase::Feasibility | Phase::Measured);
        if k > 0 && thinks && !turn.think.is_zero() && !think(ctx, turn.think).await {
            break;
        }
        if ctx.stopped() {
            break;
        }
        let at = TurnAt {
            session: session as u32,
            turn: k as u16,
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
        // when it is sent (the end of the previous one and its think time).
        let d = Dispatch {
            variant: s.first_variant + k,
            turn: Some(at),
            scheduled_offset_us: base.scheduled_offset_us.filter(|_| k == 0),
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

/// Wait `how_long` (a turn's think time) unless the run stops first; `false` when it did.
async fn think(ctx: &Ctx, how_long: std::time::Duration) -> bool {
    let until = crate::clock::now_ns().saturating_add(how_long.as_nanos() as u64);
    while !ctx.stopped() {
        let now = crate::clock::now_ns();
        if now >= until {
            return true;
        }
        let left = (until - now).min(50_000_000);
        tokio::time::sleep(std::time::Duration::from_nanos(left)).await;
    }
    false
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
