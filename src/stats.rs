//! The statistics a verdict rests on, pure and seeded: percentile bootstrap intervals over
//! rounds (paired or not) and the exact McNemar test. Every number here can be recomputed
//! outside the tool from the documented procedure (docs/campaigns.md, "Intervals"):
//!
//! - The random stream is ChaCha8 keyed by the seed's 8 bytes, little-endian, then 24
//!   zero bytes (stream 0, counter from 0), read as 64-bit words (low 32 bits first).
//! - An index below `n` is `next_u64() % n` (the bias is below 2^-50 for any n a run has).
//! - Resample `k` (0 to [`RESAMPLES`] - 1) walks the groups in their order; in each it
//!   draws side A's indices, then side B's (unpaired), or one set of indices for both
//!   (paired: round `i` of A goes with round `i` of B).
//! - The interval is the nearest-rank 2.5th and 97.5th percentile of the resampled
//!   statistics (ranks 50 and 1,950 of 2,000).

use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{RngCore, SeedableRng};
use serde::{Deserialize, Serialize};

/// Resamples per interval.
pub(crate) const RESAMPLES: usize = 2000;
/// The seed every interval of a run uses unless a caller says otherwise ("matrix" in
/// ASCII): the same rows give the same interval on every machine.
pub(crate) const SEED: u64 = 0x6d61_7472_6978;
/// Fewer rounds than this on a side of a group: no interval.
pub(crate) const MIN_ROUNDS: usize = 5;
/// Fewer discordant pairs than this: the McNemar test is not read (at 5 or fewer it cannot
/// reach p < 0.05 whatever the split).
pub(crate) const MIN_DISCORDANT: u64 = 10;

/// The documented random stream.
pub(crate) struct Stream(ChaCha8Rng);

impl Stream {
    pub(crate) fn new(seed: u64) -> Stream {
        let mut key = [0u8; 32];
        key[..8].copy_from_slice(&seed.to_le_bytes());
        Stream(ChaCha8Rng::from_seed(key))
    }

    /// An index below `n` (`n` > 0).
    pub(crate) fn index(&mut self, n: usize) -> usize {
        (self.0.next_u64() % n as u64) as usize
    }
}

/// A 95 % percentile bootstrap interval of a statistic (a ratio or a delta).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub(crate) struct Interval {
    pub(crate) low: f64,
    pub(crate) high: f64,
    pub(crate) resamples: usize,
    pub(crate) seed: u64,
    /// Round `i` of one side resampled with round `i` of the other.
    pub(crate) paired: bool,
}

impl Interval {
    /// Whether the interval holds `x` (inclusive).
    pub(crate) fn spans(&self, x: f64) -> bool {
        self.low <= x && x <= self.high
    }
}

/// One group of rounds (a case at a level): side A's and side B's, in round order. Paired
/// groups hold the same number of rounds on both sides, round `i` with round `i`.
pub(crate) struct Group<'a, T> {
    pub(crate) a: &'a [T],
    pub(crate) b: &'a [T],
}

/// Why [`bootstrap`] gives no interval.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum NoInterval {
    #[error("no rounds to resample")]
    NoRounds,
    /// A group's rounds on side A and side B.
    #[error("{0} and {1} rounds: an interval needs at least {MIN_ROUNDS} rounds per side")]
    TooFewRounds(usize, usize),
    #[error("{0} vs {1} rounds: paired rounds must match one for one")]
    Unpaired(usize, usize),
    #[error("a resample's statistic was undefined (a zero denominator or no sample)")]
    Undefined,
}

/// The bootstrap interval of `stat(A's drawn rounds, B's drawn rounds)` over `groups`
/// (every group resampled within itself). `Err`: why there is none (a group with fewer
/// than [`MIN_ROUNDS`] rounds on a side, paired sides of unequal length, or a resample
/// whose statistic is undefined).
pub(crate) fn bootstrap<T>(
    groups: &[Group<'_, T>],
    paired: bool,
    seed: u64,
    stat: impl Fn(&[&T], &[&T]) -> Option<f64>,
) -> Result<Interval, NoInterval> {
    if groups.is_empty() {
        return Err(NoInterval::NoRounds);
    }
    for g in groups {
        let fewest = g.a.len().min(g.b.len());
        if fewest < MIN_ROUNDS {
            return Err(NoInterval::TooFewRounds(g.a.len(), g.b.len()));
        }
        if paired && g.a.len() != g.b.len() {
            return Err(NoInterval::Unpaired(g.a.len(), g.b.len()));
        }
    }
    let mut rng = Stream::new(seed);
    let mut stats = Vec::with_capacity(RESAMPLES);
    let (mut xa, mut xb): (Vec<&T>, Vec<&T>) = (Vec::new(), Vec::new());
    for _ in 0..RESAMPLES {
        xa.clear();
        xb.clear();
        for g in groups {
            if paired {
                for _ in 0..g.a.len() {
                    let i = rng.index(g.a.len());
                    xa.push(&g.a[i]);
                    xb.push(&g.b[i]);
                }
            } else {
                for _ in 0..g.a.len() {
                    xa.push(&g.a[rng.index(g.a.len())]);
                }
                for _ in 0..g.b.len() {
                    xb.push(&g.b[rng.index(g.b.len())]);
                }
            }
        }
        match stat(&xa, &xb).filter(|s| s.is_finite()) {
            Some(s) => stats.push(s),
            None => return Err(NoInterval::Undefined),
        }
    }
    stats.sort_by(f64::total_cmp);
    // Nearest rank: ceil(p x n), 1-based.
    let rank = |p: f64| ((p * RESAMPLES as f64).ceil() as usize).clamp(1, RESAMPLES) - 1;
    Ok(Interval {
        low: stats[rank(0.025)],
        high: stats[rank(0.975)],
        resamples: RESAMPLES,
        seed,
        paired,
    })
}

/// The exact McNemar test on paired pass / fail outcomes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct McNemar {
    /// Items judged on both sides (a campaign's: distinct requests).
    pub(crate) pairs: u64,
    /// Passed on both sides, and failed on both.
    pub(crate) both_passed: u64,
    pub(crate) both_failed: u64,
    /// The reference passed and the arm failed.
    pub(crate) only_reference_passed: u64,
    /// The arm passed and the reference failed.
    pub(crate) only_arm_passed: u64,
    /// Two-sided exact p-value: `min(1, 2 x P(X <= min(b, c)))` for X ~ Binomial(b + c,
    /// 1/2); 1.0 with no discordant pair.
    pub(crate) p_value: f64,
}

impl McNemar {
    /// Tally `(reference passed, arm passed)` pairs.
    pub(crate) fn of(pairs: impl IntoIterator<Item = (bool, bool)>) -> McNemar {
        let mut m = McNemar::default();
        for (r, a) in pairs {
            m.pairs += 1;
            match (r, a) {
                (true, true) => m.both_passed += 1,
                (false, false) => m.both_failed += 1,
                (true, false) => m.only_reference_passed += 1,
                (false, true) => m.only_arm_passed += 1,
            }
        }
        m.p_value = mcnemar_p(m.only_reference_passed, m.only_arm_passed);
        m
    }

    pub(crate) fn discordant(&self) -> u64 {
        self.only_reference_passed + self.only_arm_passed
    }
}

/// The exact two-sided McNemar p-value for `b` and `c` discordant pairs, summed in log
/// space (exact for any count a run has; no underflow at large `b + c`).
pub(crate) fn mcnemar_p(b: u64, c: u64) -> f64 {
    let n = b + c;
    if n == 0 {
        return 1.0;
    }
    let k = b.min(c);
    // ln C(n, i) built up from ln C(n, 0) = 0.
    let ln2n = n as f64 * std::f64::consts::LN_2;
    let mut ln_c = 0.0f64;
    let mut terms = Vec::with_capacity(k as usize + 1);
    for i in 0..=k {
        if i > 0 {
            ln_c += ((n - i + 1) as f64).ln() - (i as f64).ln();
        }
        terms.push(ln_c - ln2n);
    }
    let top = terms.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let tail = top.exp() * terms.iter().map(|t| (t - top).exp()).sum::<f64>();
    (2.0 * tail).min(1.0)
}

/// `P(lo <= X <= hi)` for `X ~ Binomial(n, p)`, summed in log space over its terms.
fn binomial_mass(lo: u64, hi: u64, n: u64, p: f64) -> f64 {
    if lo > hi || lo > n {
        return 0.0;
    }
    let hi = hi.min(n);
    if p <= 0.0 {
        return if lo == 0 { 1.0 } else { 0.0 };
    }
    if p >= 1.0 {
        return if hi == n { 1.0 } else { 0.0 };
    }
    let (lp, lq) = (p.ln(), (1.0 - p).ln());
    let ln_choose = |i: u64| -> f64 {
        ln_gamma(n as f64 + 1.0) - ln_gamma(i as f64 + 1.0) - ln_gamma((n - i) as f64 + 1.0)
    };
    let terms: Vec<f64> = (lo..=hi)
        .map(|i| ln_choose(i) + i as f64 * lp + (n - i) as f64 * lq)
        .collect();
    let top = terms.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (top.exp() * terms.iter().map(|t| (t - top).exp()).sum::<f64>()).min(1.0)
}

/// `ln Γ(x)` for `x >= 1` (Lanczos, g = 7, 9 terms: about 15 significant digits).
fn ln_gamma(x: f64) -> f64 {
    const G: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    let x = x - 1.0;
    let mut a = G[0];
    let t = x + 7.5;
    for (i, g) in G.iter().enumerate().skip(1) {
        a += g / (x + i as f64);
    }
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + a.ln()
}

/// The exact (Clopper-Pearson) two-sided interval at `confidence` for a rate of `k`
/// successes in `n` trials: `[lower, upper]` with `P(X >= k; lower) = P(X <= k; upper) =
/// (1 - confidence) / 2`, found by bisection on the binomial tails (each end rounded
/// outwards, so the interval never covers less than it says). `None` for no trial.
pub(crate) fn clopper_pearson(k: u64, n: u64, confidence: f64) -> Option<(f64, f64)> {
    if n == 0 || k > n {
        return None;
    }
    let a = (1.0 - confidence) / 2.0;
    let rate = k as f64 / n as f64;
    let bisect = |mut lo: f64, mut hi: f64, above: &dyn Fn(f64) -> bool| {
        for _ in 0..64 {
            let mid = (lo + hi) / 2.0;
            if above(mid) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        (lo, hi)
    };
    let upper = if k == n {
        1.0
    } else {
        bisect(rate, 1.0, &|p| binomial_mass(0, k, n, p) > a).1
    };
    let lower = if k == 0 {
        0.0
    } else {
        bisect(0.0, rate, &|p| binomial_mass(k, n, n, p) < a).0
    };
    Some((lower, upper))
}

/// The two-sided standard normal quantile at `confidence`: z with P(|Z| <= z) =
/// confidence (1.96 at 0.95, 2.576 at 0.99).
pub(crate) fn z_two_sided(confidence: f64) -> f64 {
    use statrs::distribution::{ContinuousCDF, Normal};
    Normal::standard().inverse_cdf(1.0 - (1.0 - confidence) / 2.0)
}

/// Requests a tail percentile `p` needs for its order-statistic bound to span at most
/// ±`margin` in rank at `confidence`: n = (z / δ)² · p(1 − p), rounded up (MLPerf's rule;
/// MLPerf then rounds up to a multiple of 8,192).
pub(crate) fn sample_size(p: f64, margin: f64, confidence: f64) -> u64 {
    let z = z_two_sided(confidence);
    ((z / margin).powi(2) * p * (1.0 - p)).ceil() as u64
}

/// The distribution-free bound on the `p` percentile of `n` samples at `confidence`: the
/// 1-based ranks of the order statistics between which it lies, `n p ∓ z √(n p (1 − p))`
/// (the normal approximation to the binomial count below the true percentile; with
/// `n` = [`sample_size`] these are the ranks n(p ± δ)). A rank below 1 is `None` (no
/// lower bound: 0), one above `n` is `None` (no upper bound: the samples cannot say).
pub(crate) fn percentile_ranks(n: u64, p: f64, confidence: f64) -> (Option<u64>, Option<u64>) {
    if n == 0 {
        return (None, None);
    }
    let z = z_two_sided(confidence);
    let (nf, spread) = (n as f64, z * (n as f64 * p * (1.0 - p)).sqrt());
    let lo = (nf * p - spread).floor();
    // A hair of float error must not push the maximum's rank past n.
    let hi = (nf * p + spread - 1e-9).ceil();
    let lo = (lo >= 1.0).then_some(lo as u64);
    let hi = (hi <= nf).then_some(hi.max(1.0) as u64);
    (lo, hi)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mlperf_s_sample_size_for_p90_at_99_percent_and_half_a_point() {
        // MLPerf's 24,576 queries: (2.5758 / 0.005)² · 0.9 · 0.1 = 23,886, rounded up to a
        // multiple of 8,192.
        let n = sample_size(0.90, 0.005, 0.99);
        assert_eq!(n, 23_886);
        assert_eq!(n.div_ceil(8192) * 8192, 24_576);
        assert!((z_two_sided(0.95) - 1.959964).abs() < 1e-5);
        // p99 at ±1 point, 95 %: 381 requests.
        assert_eq!(sample_size(0.99, 0.01, 0.95), 381);
    }

    #[test]
    fn percentile_ranks_at_the_planned_size_are_n_times_p_plus_minus_margin() {
        let n = sample_size(0.90, 0.05, 0.95);
        let (lo, hi) = percentile_ranks(n, 0.90, 0.95);
        let (lo, hi) = (lo.unwrap() as f64, hi.unwrap() as f64);
        assert!((lo - n as f64 * 0.85).abs() <= 1.0, "{lo} {n}");
        assert!((hi - n as f64 * 0.95).abs() <= 1.0, "{hi} {n}");
        // p99 at its size: the upper rank is within the samples; with fewer, it is not.
        let n99 = sample_size(0.99, 0.01, 0.95);
        assert!(percentile_ranks(n99, 0.99, 0.95).1.is_some());
        assert_eq!(percentile_ranks(50, 0.99, 0.95).1, None);
        assert_eq!(percentile_ranks(50, 0.01, 0.95).0, None);
        assert_eq!(percentile_ranks(0, 0.5, 0.95), (None, None));
    }

    #[test]
    fn clopper_pearson_matches_the_beta_quantiles() {
        // R: binom.test(28, 40)$conf.int = 0.5347 0.8344; binom.test(0, 10): 0 0.3085.
        let (lo, hi) = clopper_pearson(28, 40, 0.95).unwrap();
        assert!(
            (lo - 0.534_7).abs() < 1e-3 && (hi - 0.834_4).abs() < 1e-3,
            "{lo} {hi}"
        );
        let (lo, hi) = clopper_pearson(0, 10, 0.95).unwrap();
        assert!(lo == 0.0 && (hi - 0.308_5).abs() < 1e-3, "{hi}");
        assert_eq!(clopper_pearson(10, 10, 0.95).map(|i| i.1), Some(1.0));
        assert_eq!(clopper_pearson(1, 0, 0.95), None);
        // 90 % valid over 200 distinct requests: the upper end is below 0.95.
        let (_, hi) = clopper_pearson(180, 200, 0.95).unwrap();
        assert!(hi < 0.95, "{hi}");
        assert!((ln_gamma(11.0) - 3_628_800f64.ln()).abs() < 1e-9);
    }

    #[test]
    fn mcnemar_matches_a_hand_computation() {
        // b = 2, c = 8: P(X <= 2) for Binomial(10, 1/2) = (1 + 10 + 45) / 1024 = 56/1024;
        // two-sided: 112/1024 = 0.109375.
        assert!((mcnemar_p(2, 8) - 112.0 / 1024.0).abs() < 1e-12);
        assert!((mcnemar_p(8, 2) - 112.0 / 1024.0).abs() < 1e-12);
        // b = 0, c = 6: 2 x 1/64 = 0.03125.
        assert!((mcnemar_p(0, 6) - 2.0 / 64.0).abs() < 1e-12);
        // Balanced: capped at 1.
        assert_eq!(mcnemar_p(5, 5), 1.0);
        assert_eq!(mcnemar_p(0, 0), 1.0);
        // Large counts do not underflow: 500 vs 600 is p ~ 0.0028.
        let p = mcnemar_p(500, 600);
        assert!(p > 0.001 && p < 0.005, "{p}");
        let m = McNemar::of([(true, true), (true, false), (false, true), (true, false)]);
        assert_eq!(
            (
                m.pairs,
                m.both_passed,
                m.only_reference_passed,
                m.only_arm_passed
            ),
            (4, 1, 2, 1)
        );
        assert_eq!(m.p_value, 1.0);
    }

    #[test]
    fn the_stream_is_chacha8_from_the_documented_key() {
        // Pinned: the interop check recomputes these words in Python from the ChaCha
        // block function; a change of crate or platform shows here first.
        let mut s = Stream::new(SEED);
        let words: Vec<u64> = (0..40).map(|_| s.0.next_u64()).collect();
        assert_eq!(
            (words[0], words[1], words[2], words[39]),
            (
                0xf7ee_c5c8_8625_af57,
                0x42ba_0d01_1a18_c1e8,
                0x2d2c_91ab_8f8f_19a6,
                // Past the crate's four-block buffer.
                0x3de2_9e86_f886_7995
            ),
            "{words:x?}"
        );
    }

    /// Ratio of the means of B's and A's drawn rounds.
    fn ratio(a: &[&f64], b: &[&f64]) -> Option<f64> {
        let m = |v: &[&f64]| v.iter().copied().sum::<f64>() / v.len() as f64;
        (m(a) > 0.0).then(|| m(b) / m(a))
    }

    #[test]
    fn a_small_win_inside_the_spread_spans_one_and_a_large_one_does_not() {
        // Ten rounds of a reference around 100 tok/s with a 10 % spread (90 to 110), and
        // an arm whose rounds are 3 % faster but independently noisy; then 30 % faster.
        let reference: Vec<f64> = (0..10)
            .map(|i| 90.0 + (i * 7 % 10) as f64 * 20.0 / 9.0)
            .collect();
        let noise: Vec<f64> = (0..10)
            .map(|i| 90.0 + (i * 3 % 10) as f64 * 20.0 / 9.0)
            .collect();
        for (gain, spans) in [(1.03, true), (1.30, false)] {
            let arm: Vec<f64> = noise.iter().map(|x| x * gain).collect();
            for paired in [true, false] {
                let g = [Group {
                    a: &reference[..],
                    b: &arm[..],
                }];
                let i = bootstrap(&g, paired, SEED, ratio).expect("an interval");
                assert_eq!(i.spans(1.0), spans, "{gain} paired={paired}: {i:?}");
                assert!(i.low < gain && gain < i.high + 0.05, "{i:?}");
                // A 1.02 speed gate under require_interval reads the low end.
                assert_eq!(i.low >= 1.02, !spans, "{i:?}");
            }
        }
        // Seeded: the same rows, the same interval.
        let g = [Group {
            a: &reference[..],
            b: &noise[..],
        }];
        assert_eq!(
            bootstrap(&g, true, SEED, ratio),
            bootstrap(&g, true, SEED, ratio)
        );
        // Too few rounds, or unequal paired sides: no interval, with the reason.
        let short = [Group {
            a: &reference[..4],
            b: &noise[..4],
        }];
        let e = bootstrap(&short, false, SEED, ratio).expect_err("4 rounds");
        assert_eq!(e, NoInterval::TooFewRounds(4, 4));
        assert!(e.to_string().contains("at least 5"), "{e}");
        let uneven = [Group {
            a: &reference[..6],
            b: &noise[..7],
        }];
        assert_eq!(
            bootstrap(&uneven, true, SEED, ratio),
            Err(NoInterval::Unpaired(6, 7))
        );
        assert!(bootstrap(&uneven, false, SEED, ratio).is_ok());
    }
}
