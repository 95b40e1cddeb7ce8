//! A round's numbers per turn index of its sessions ([`TurnMetrics`]): how many turns
//! `k` were attempted and succeeded, their first byte, time to first token (streams),
//! latency, prompt tokens and the server's cached prompt tokens, so a prefix cache's
//! effect on turn 2 and later is seen, not guessed; in a trace, the session lag of turns
//! `k` (how much later than their entries' offsets they were due). Nearest rank over the
//! round's successful turns `k` (the session lag: over its attempted ones).

use super::percentiles::Percentiles;
use super::sample::Sample;
use crate::model::Outcome;

/// One turn index of a round's sessions.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TurnMetrics {
    /// From 1.
    pub(crate) turn: u16,
    pub(crate) attempted: u64,
    pub(crate) successful: u64,
    pub(crate) first_byte_us: Percentiles,
    /// Streamed answers only.
    pub(crate) ttft_us: Percentiles,
    pub(crate) total_us: Percentiles,
    /// The server's count (its `usage`), where it reported one.
    pub(crate) prompt_tokens: Percentiles,
    /// `usage.prompt_tokens_details.cached_tokens`, where the server reported it.
    pub(crate) cached_prompt_tokens: Percentiles,
    /// Successful turns whose answer reported cached tokens (the denominator of
    /// `cached_prompt_tokens`).
    pub(crate) cached_reported: u64,
    /// A trace's sessions: how much later than its own entry's offset each attempted
    /// turn `k` was due (empty outside a trace).
    pub(crate) session_lag_us: Percentiles,
}

/// Per turn index, in turn order; empty when no sample is a session's turn.
pub(crate) fn turn_metrics(samples: &[Sample]) -> Vec<TurnMetrics> {
    // One pass: the samples of each turn index that occurs.
    let mut by_turn: std::collections::BTreeMap<u16, Vec<&Sample>> = Default::default();
    for s in samples {
        if let Some(k) = s.turn {
            by_turn.entry(k).or_default().push(s);
        }
    }
    by_turn
        .into_iter()
        .map(|(k, of_k)| one_turn(k, &of_k))
        .collect()
}

fn one_turn(turn: u16, of_k: &[&Sample]) -> TurnMetrics {
    let ok: Vec<&&Sample> = of_k.iter().filter(|s| s.outcome == Outcome::Ok).collect();
    let cached: Vec<i64> = ok.iter().filter_map(|s| s.cached_prompt_tokens).collect();
    TurnMetrics {
        turn,
        attempted: of_k.len() as u64,
        successful: ok.len() as u64,
        first_byte_us: Percentiles::of(ok.iter().filter_map(|s| s.first_byte_us).collect()),
        ttft_us: Percentiles::of(
            ok.iter()
                .filter_map(|s| s.stream.as_ref()?.ttft_us)
                .collect(),
        ),
        total_us: Percentiles::of(ok.iter().filter_map(|s| s.total_us).collect()),
        prompt_tokens: Percentiles::of(ok.iter().filter_map(|s| s.prompt_tokens()).collect()),
        cached_reported: cached.len() as u64,
        cached_prompt_tokens: Percentiles::of(cached),
        session_lag_us: Percentiles::of(of_k.iter().filter_map(|s| s.session_lag_us).collect()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turn(k: u16, total_ms: i64, prompt: i64, cached: Option<i64>) -> Sample {
        Sample {
            turn: Some(k),
            outcome: Outcome::Ok,
            total_us: Some(total_ms * 1000),
            first_byte_us: Some(total_ms * 500),
            usage_tokens: Some((Some(prompt), 4)),
            cached_prompt_tokens: cached,
            ..Sample::default()
        }
    }

    #[test]
    fn each_turn_index_gets_its_own_numbers_and_a_failed_turn_only_counts_as_attempted() {
        let mut failed = turn(2, 900, 70, None);
        failed.outcome = Outcome::Http;
        failed.session_lag_us = Some(3_000);
        let samples = [
            turn(1, 40, 30, Some(0)),
            turn(1, 60, 30, Some(0)),
            turn(2, 20, 70, Some(32)),
            failed,
            turn(3, 25, 110, None),
            Sample::default(), // not a session's turn
        ];
        let t = turn_metrics(&samples);
        assert_eq!(t.iter().map(|t| t.turn).collect::<Vec<_>>(), [1, 2, 3]);
        assert_eq!((t[0].attempted, t[0].successful), (2, 2));
        assert_eq!(t[0].total_us.p50, Some(40_000));
        assert_eq!((t[1].attempted, t[1].successful), (2, 1));
        assert_eq!(
            t[1].total_us.p99,
            Some(20_000),
            "the failure's 900 ms is not a turn-2 latency"
        );
        assert_eq!(
            (t[1].cached_prompt_tokens.p50, t[1].cached_reported),
            (Some(32), 1)
        );
        assert_eq!(t[1].prompt_tokens.p50, Some(70));
        assert_eq!(
            (t[2].cached_prompt_tokens.p50, t[2].cached_reported),
            (None, 0),
            "unknown is not 0"
        );
        assert_eq!(
            (t[1].session_lag_us.p50, t[0].session_lag_us.p50),
            (Some(3_000), None),
            "a failed turn was still due late; no lag outside a trace"
        );
        assert!(turn_metrics(&[Sample::default()]).is_empty());
    }
}
