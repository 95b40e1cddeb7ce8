//! Metric arithmetic: nearest-rank percentiles, round throughput, the steady-state
//! interior window, and spread across rounds. Pure functions over samples; no I/O.
//!
//! Definitions (docs/metrics.md states them for users):
//! - nearest rank: `sorted[ceil(p*n) - 1]`, computed in integers so `p*n` never rounds
//!   the wrong way; p95 of fewer than 20 samples is therefore the maximum;
//! - a round's elapsed time runs from its first dispatch to its last completion, and its
//!   throughput is successful requests over that (`complete_wave_including_ramp_and_drain`);
//! - the steady-state window of a complete round with n > 2c drops the first and last c
//!   completions: it runs from completion c to completion n-c and holds n-2c requests;
//! - across rounds, the median is the ordinary median (mean of the two middle values).
//!
//! The files, each importing only those after it: `aggregate.rs` (over rounds) →
//! `round.rs` (a round's metrics, the generator's load, the excluded phases) →
//! `open_loop.rs`, `steady.rs`, `tokens.rs` → `percentiles.rs`, `sample.rs`.

mod aggregate;
mod open_loop;
mod percentiles;
mod round;
mod sample;
mod steady;
mod tokens;
mod turns;

pub(crate) use aggregate::{Aggregate, aggregate};
pub(crate) use open_loop::{Goodput, OpenMetrics, SATURATION_LAG_US, goodput};
pub(crate) use percentiles::{Percentiles, Spread, mean, median, nearest_rank};
pub(crate) use round::{
    GeneratorLoad, PhaseCounts, RoundMetrics, THROUGHPUT_SCOPE, level_round_metrics,
};
pub(crate) use sample::{Sample, StreamSample};
pub(crate) use tokens::{StreamMetrics, answer_tokens, decode, decode_rate, stream_metrics};
pub(crate) use turns::TurnMetrics;

#[cfg(test)]
mod tests {

    #[test]
    fn generator_load_flags_a_busy_tool_and_only_then() {
        // 0.95 s of CPU over 1 s on one core: the tool was the bottleneck.
        let g = GeneratorLoad::new((950_000_000, 1_000_000_000, 1), vec![900, 1000, 1100], None);
        assert!((g.cpu_share - 0.95).abs() < 1e-9);
        assert!(
            g.warning
                .as_deref()
                .unwrap()
                .contains("95% of the 1 core(s)")
        );
        // The same CPU over two cores is under half busy; the lag is timer granularity.
        let g = GeneratorLoad::new((950_000_000, 1_000_000_000, 2), vec![900, 1000, 1100], None);
        assert!((g.cpu_share - 0.475).abs() < 1e-9);
        assert_eq!(g.warning, None);
        assert_eq!(g.lag_max_us, Some(1100));
        // Late ticks alone are enough to warn; at 5 % of the cores they are the host's.
        let lags: Vec<i64> = (0..100).map(|i| if i < 95 { 800 } else { 7_000 }).collect();
        let g = GeneratorLoad::new((100_000_000, 1_000_000_000, 2), lags.clone(), Some(2_000));
        assert_eq!(g.lag_us.p99, Some(7_000));
        let w = g.warning.unwrap_or_default();
        assert!(w.contains("7.0 ms late (p99) while matrix-proxy used only 5% of its 2 core(s): host scheduling noise"), "{w}");
        // At 60 % of the cores they may be the tool's.
        let g = GeneratorLoad::new((1_200_000_000, 1_000_000_000, 2), lags.clone(), None);
        let w = g.warning.unwrap_or_default();
        assert!(w.ends_with("7.0 ms late (p99): the load generator may be the bottleneck of this round, not the worker"), "{w}");
        // 7 ms against exchanges of a second is noise: no warning (closed loop, slow server).
        let g = GeneratorLoad::new(
            (100_000_000, 1_000_000_000, 2),
            lags.clone(),
            Some(1_000_000),
        );
        assert_eq!(g.warning, None);
        // ... but 7 ms against 60 ms exchanges is not.
        let g = GeneratorLoad::new((100_000_000, 1_000_000_000, 2), lags, Some(60_000));
        assert!(g.warning.is_some());
        // No wall time or no cores never divides by zero.
        let g = GeneratorLoad::new((0, 0, 0), Vec::new(), None);
        assert_eq!(g.cores, 1);
        assert!(g.cpu_share.is_finite() && g.warning.is_none());
    }

    use super::percentiles::spread;
    use super::*;
    use super::{round::*, steady::*};
    use crate::model::{Level, Outcome};
    use std::collections::BTreeMap;

    fn ok(start_us: i64, total_us: i64) -> Sample {
        Sample {
            outcome: Outcome::Ok,
            start_offset_us: start_us,
            total_us: Some(total_us),
            first_byte_us: Some(total_us / 2),
            ..Sample::default()
        }
    }

    #[test]
    fn the_pooled_decode_estimator_sums_before_it_divides_and_counts_what_it_leaves_out() {
        // 10 tokens in 0.1 s and 10 in 0.2 s of decode: 20 / 0.3 = 66.7 pooled (the
        // per-request mean is 75.0).
        let (a, b) = (
            streamed(0, 0, 100_000, 10, 1),
            streamed(0, 0, 200_000, 10, 1),
        );
        let d = decode(&[&a, &b]);
        assert!((d.pooled_tokens_per_second.unwrap() - 20.0 / 0.3).abs() < 1e-9);
        assert_eq!(d.pooled_streams, 2);
        // A burst: 9 tokens after the first in one read, 185 us later. The per-request
        // mean jumps; the pooled estimator leaves it out and counts it.
        let mut burst = streamed(0, 0, 185, 10, 1);
        if let Some(st) = burst.stream.as_mut() {
            st.gaps_us = [vec![185], vec![0; 8]].concat();
            st.bundled = true;
        }
        let no_decode = Sample {
            total_us: Some(0),
            ..streamed(0, 0, 100, 2, 1)
        };
        let d = decode(&[&a, &b, &burst, &no_decode]);
        assert!((d.pooled_tokens_per_second.unwrap() - 20.0 / 0.3).abs() < 1e-9);
        assert_eq!((d.bundled, d.no_decode_time, d.pooled_streams), (1, 1, 2));
        let mean = stream_metrics(&[&a, &b, &burst], 1.0)
            .and_then(|m| m.output_tokens_per_second_mean)
            .unwrap();
        assert!(mean > 10_000.0, "{mean}");
        // What counts as bundled: more than half of the events after the first in one
        // read, at least two of them.
        use crate::model::bundled;
        assert!(bundled(&[0, 5, 5, 5]));
        assert!(bundled(&[0, 5, 5]));
        assert!(!bundled(&[0, 5]));
        assert!(!bundled(&[0, 1, 2, 3, 3]));
        assert!(bundled(&[0, 1, 3, 3, 3]));
        assert!(!bundled(&[]));
    }

    fn streamed(start_us: i64, ttft_us: i64, total_us: i64, tokens: i64, prompt: i64) -> Sample {
        let step = (total_us - ttft_us) / (tokens - 1);
        let offsets: Vec<i64> = (0..tokens).map(|i| ttft_us + i * step).collect();
        Sample {
            stream: Some(StreamSample {
                ttft_us: Some(ttft_us),
                tpot_us: Some((total_us - ttft_us) / (tokens - 1)),
                output_tokens: Some(tokens),
                prompt_tokens: Some(prompt),
                gaps_us: offsets.windows(2).map(|w| w[1] - w[0]).collect(),
                bundled: crate::model::bundled(&offsets),
            }),
            ..ok(start_us, total_us)
        }
    }

    #[test]
    fn token_rates_from_the_issue() {
        // Two exchanges of 10 tokens with 100 ms and 200 ms of decode: per-request
        // 100 and 50 tok/s, mean 75. Together 20 tokens in a 1 s round: 20 tok/s.
        let a = streamed(0, 100_000, 200_000, 10, 50);
        let b = streamed(0, 800_000, 1_000_000, 10, 40);
        let r = round_metrics("s", 2, 0, 2, &[a, b]);
        let st = r.stream.unwrap();
        assert_eq!(st.requests, 2);
        assert_eq!(st.output_tokens, 20);
        assert_eq!(st.output_tokens_per_second_mean, Some(75.0));
        assert_eq!(r.elapsed_seconds, 1.0);
        assert_eq!(st.output_tokens_per_second_aggregate, Some(20.0));
        // prefill: 50 tokens in 0.1 s = 500/s and 40 in 0.8 s = 50/s, mean 275/s
        assert_eq!(st.prefill_tokens_per_second_mean, Some(275.0));
        assert_eq!(st.ttft_us.p50, Some(100_000));
        assert_eq!(st.ttft_us.p95, Some(800_000));
        // ITL pooled: 9 gaps of 11_111 us and 9 of 22_222 us; p50 is the 9th smallest.
        assert_eq!(st.itl_us.p50, Some(11_111));
        assert_eq!(st.itl_us.p95, Some(22_222));
        assert_eq!(st.tpot_us.p50, Some(11_111));
    }

    #[test]
    fn nearest_rank_definition() {
        let v: Vec<i64> = (1..=10).collect();
        assert_eq!(nearest_rank(&v, 50), Some(5));
        assert_eq!(nearest_rank(&v, 95), Some(10));
        assert_eq!(nearest_rank(&v, 99), Some(10));
        assert_eq!(nearest_rank(&[], 50), None);
        assert_eq!(nearest_rank(&[7], 1), Some(7));
        // p95 of fewer than 20 samples is the maximum; at 20 it is the 19th.
        let v19: Vec<i64> = (1..=19).collect();
        assert_eq!(nearest_rank(&v19, 95), Some(19));
        let v20: Vec<i64> = (1..=20).collect();
        assert_eq!(nearest_rank(&v20, 95), Some(19));
        let v100: Vec<i64> = (1..=100).collect();
        assert_eq!(nearest_rank(&v100, 50), Some(50));
        assert_eq!(nearest_rank(&v100, 99), Some(99));
    }

    fn at(at_us: i64, exchange_id: i64, decisions: u64) -> Completion {
        Completion {
            at_us,
            exchange_id,
            decisions,
        }
    }

    #[test]
    fn steady_state_window_from_issue() {
        // The seed's example: completions at t = 1..8 s carrying 1..8 decisions, c = 2. The
        // window runs from t=2 to t=6 and holds completions 3..=6: 4 requests and 18
        // decisions in 4.0 s, 1.0 req/s and 4.5 decisions/s. Given out of order.
        let completions: Vec<Completion> = (1..=8)
            .rev()
            .map(|s| at(s * 1_000_000, s, s as u64))
            .collect();
        let ss = steady_state(&completions, 2, true);
        assert_eq!(
            ss,
            SteadyState {
                available: true,
                reason: None,
                start_us: Some(2_000_000),
                end_us: Some(6_000_000),
                requests: Some(4),
                requests_per_second: Some(1.0),
                decisions: Some(18),
                decisions_per_second: Some(4.5),
            }
        );
    }

    #[test]
    fn steady_state_ties_are_broken_by_exchange_id() {
        // Six completions, c = 2: the window holds positions 2 and 3. Ids 7 and 5 share a
        // time across the window's edge (positions 3 and 4): id 5 sorts first, so its 10
        // decisions are in the window and id 7's 3 are not.
        let completions = [
            at(1_000_000, 1, 100),
            at(1_500_000, 2, 1),
            at(2_000_000, 3, 1),
            at(2_500_000, 7, 3),
            at(2_500_000, 5, 10),
            at(3_000_000, 6, 100),
        ];
        let ss = steady_state(&completions, 2, true);
        assert_eq!(
            (ss.start_us, ss.end_us, ss.requests, ss.decisions),
            (Some(1_500_000), Some(2_500_000), Some(2), Some(11))
        );
        assert_eq!(ss.decisions_per_second, Some(11.0));
    }

    #[test]
    fn decisions_per_round_from_the_seed() {
        // 4 requests answering two decisions each -> 8 decisions; over 2 s, 4 per second.
        let s: Vec<Sample> = (0..4)
            .map(|i| Sample {
                exchange_id: i,
                decisions: Some(2),
                ..ok(i * 500_000, 500_000)
            })
            .collect();
        let r = round_metrics("a", 1, 0, 4, &s);
        assert_eq!(r.successful_decisions, 8);
        assert_eq!(r.elapsed_seconds, 2.0);
        assert_eq!(r.successful_decisions_per_second, Some(4.0));
        // Variants answering 1 and 3 entries alternately: 1 + 3 + 1 + 3 = 8. A failure's
        // decisions never count, and an exchange not judged as JSON counts 0.
        let mut s: Vec<Sample> = (0..4)
            .map(|i| Sample {
                exchange_id: i,
                decisions: Some(if i % 2 == 0 { 1 } else { 3 }),
                ..ok(i * 500_000, 500_000)
            })
            .collect();
        s.push(Sample {
            outcome: Outcome::Correctness,
            decisions: Some(50),
            ..ok(0, 10)
        });
        s.push(ok(0, 10));
        assert_eq!(round_metrics("a", 1, 0, 6, &s).successful_decisions, 8);
    }

    #[test]
    fn steady_state_unavailable_reasons() {
        let c: Vec<Completion> = (1..=4).map(|i| at(i, i, 0)).collect();
        let ss = steady_state(&c, 2, true);
        assert!(!ss.available);
        assert_eq!(
            ss.reason.as_deref(),
            Some("needs more than 2 x concurrency completions (n = 4, c = 2)")
        );
        assert_eq!(
            steady_state(&c, 1, false).reason.as_deref(),
            Some("round incomplete")
        );
    }

    #[test]
    fn round_throughput_and_failures() {
        // 4 requests: 3 ok, 1 timeout; first dispatch at 1 s, last completion at 3 s.
        let mut s = vec![
            ok(1_000_000, 500_000),
            ok(1_000_000, 1_000_000),
            ok(2_000_000, 1_000_000),
        ];
        s.push(Sample {
            outcome: Outcome::Timeout,
            start_offset_us: 1_500_000,
            total_us: Some(1_000_000),
            ..Sample::default()
        });
        // An earlier failure, recorded later: the list is in completion order.
        s.push(Sample {
            outcome: Outcome::Http,
            exchange_id: 9,
            start_offset_us: 1_000_000,
            total_us: Some(200_000),
            ..Sample::default()
        });
        let r = round_metrics("a", 2, 0, 5, &s);
        assert_eq!(r.attempted_requests, 5);
        assert_eq!(r.successful_requests, 3);
        assert_eq!(
            r.failures,
            BTreeMap::from([(Outcome::Http, 1), (Outcome::Timeout, 1)])
        );
        assert_eq!(r.elapsed_seconds, 2.0);
        assert_eq!(r.successful_requests_per_second, Some(1.5));
        assert_eq!(r.total_us.p50, Some(1_000_000));
        assert_eq!(r.total_us.p95, Some(1_000_000));
        assert_eq!(r.failure_total_us.p50, Some(200_000));
        assert_eq!(r.failure_total_us.p95, Some(1_000_000));
        assert_eq!(r.failure_latencies_us, vec![200_000, 1_000_000]);
        assert!(!r.complete);
        assert!(!r.steady_state.available);
    }

    #[test]
    fn ordinary_median_and_spread() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        let s = spread(&[90.0, 110.0]).unwrap();
        assert_eq!((s.min, s.median, s.max), (90.0, 100.0, 110.0));
        assert_eq!(s.relative_spread, Some(0.2));
        assert_eq!(spread(&[0.0, 0.0]).unwrap().relative_spread, None);
        assert_eq!(spread(&[]), None);
    }

    #[test]
    fn aggregate_counts_rounds() {
        let complete = round_metrics("a", 1, 0, 2, &[ok(0, 1_000_000), ok(1_000_000, 1_000_000)]);
        let partial = round_metrics("a", 1, 1, 2, &[ok(0, 1_000_000)]);
        let a = aggregate("a", Level::Concurrency(1), 3, &[&complete, &partial]);
        assert_eq!(
            (
                a.planned_rounds,
                a.attempted_rounds,
                a.complete_rounds,
                a.incomplete_rounds
            ),
            (3, 2, 1, 1)
        );
        let rps = a.metrics[0].1.clone().unwrap();
        assert_eq!((rps.rounds, rps.median), (1, 1.0));
    }
}
