//! Arrival schedules for open-loop load: when each request of a round is due, as offsets
//! from the round's start, computed before the round starts (never by sleeping a gap per
//! request: the sender waits for these absolute instants).
//!
//! The random gaps come from a ChaCha8 stream seeded by the plan's `seed`, one stream per
//! round (`config::load::Load::schedule` numbers them: `case << 40 | level << 20 |
//! repetition`, the feasibility wave `0xFFFFF`), so a schedule is the same on every run
//! and the rounds of a level are not copies of each other. The transforms from uniform numbers to gaps (exponential by
//! inversion; gamma by Marsaglia and Tsang, with Box-Muller normals) are written here
//! rather than taken from a distributions crate, whose samples may change between its
//! versions: a pinned test holds the first offsets of a seeded schedule.

use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{RngCore, SeedableRng};

/// How the gaps between arrivals are drawn; every process has the plan's mean rate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arrival {
    /// Exactly `1 / rate` apart.
    Constant,
    /// Exponential gaps (a Poisson process): coefficient of variation 1.
    Poisson,
    /// Gamma gaps of shape `burstiness` (vLLM's `--burstiness`): 1 is Poisson, below 1
    /// burstier (CV `1 / sqrt(k)` above 1), above 1 more even.
    Gamma { burstiness: f64 },
}

/// How many arrivals a schedule holds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Extent {
    /// Every arrival due before this many microseconds from the round's start.
    DurationUs(u64),
    /// Exactly this many arrivals.
    Requests(u64),
}

/// The most arrivals a schedule holds: a longer one is cut here (a plan's validation keeps
/// rounds far below it; see `config::load`).
pub const MAX_ARRIVALS: usize = 10_000_000;

/// The schedule of one round: offsets in microseconds from the round's start, ascending,
/// the first at 0 (a round starts with a send, as vLLM's and GuideLLM's do), at most
/// [`MAX_ARRIVALS`] of them.
///
/// `stream` tells the rounds of one seed apart (the caller numbers each (rate, round)).
/// `rate_per_s` must be finite and above 0 (the plan's validation sees to it).
pub fn schedule(
    arrival: Arrival,
    rate_per_s: f64,
    seed: u64,
    stream: u64,
    extent: Extent,
) -> Vec<u64> {
    let mut gaps = Gaps::new(arrival, rate_per_s, seed, stream);
    let mut out = Vec::new();
    // Offsets are accumulated in f64 microseconds and rounded once each, so rounding
    // never drifts the schedule away from its rate.
    let mut at_us = 0.0f64;
    loop {
        let offset = at_us.round() as u64;
        match extent {
            _ if out.len() >= MAX_ARRIVALS => break,
            Extent::DurationUs(d) if offset >= d => break,
            Extent::Requests(n) if out.len() as u64 >= n => break,
            _ => {}
        }
        out.push(offset);
        at_us += gaps.next_us();
    }
    out
}

/// The coefficient of variation (standard deviation / mean) of the gaps between
/// consecutive offsets; `None` for fewer than three offsets or a zero mean gap.
pub fn gap_cv(offsets: &[u64]) -> Option<f64> {
    if offsets.len() < 3 {
        return None;
    }
    let gaps: Vec<f64> = offsets
        .windows(2)
        .map(|w| w[1].saturating_sub(w[0]) as f64)
        .collect();
    let n = gaps.len() as f64;
    let mean = gaps.iter().sum::<f64>() / n;
    if mean <= 0.0 {
        return None;
    }
    let var = gaps.iter().map(|g| (g - mean) * (g - mean)).sum::<f64>() / n;
    Some(var.sqrt() / mean)
}

/// The gap generator of one schedule.
struct Gaps {
    arrival: Arrival,
    mean_us: f64,
    rng: ChaCha8Rng,
}

impl Gaps {
    fn new(arrival: Arrival, rate_per_s: f64, seed: u64, stream: u64) -> Gaps {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        rng.set_stream(stream);
        Gaps {
            arrival,
            mean_us: 1e6 / rate_per_s,
            rng,
        }
    }

    fn next_us(&mut self) -> f64 {
        match self.arrival {
            Arrival::Constant => self.mean_us,
            Arrival::Poisson => -self.uniform().ln() * self.mean_us,
            // Shape k, scale mean / k: the mean gap stays 1 / rate.
            Arrival::Gamma { burstiness: k } => self.gamma(k) * self.mean_us / k,
        }
    }

    /// Uniform on (0, 1]: 53 random bits, never 0 (so its logarithm is finite).
    fn uniform(&mut self) -> f64 {
        ((self.rng.next_u64() >> 11) + 1) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// A standard normal (Box-Muller; the second value of each pair is not kept, so one
    /// draw always takes two uniforms).
    fn normal(&mut self) -> f64 {
        let (u1, u2) = (self.uniform(), self.uniform());
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// Gamma of shape `k` and scale 1 (Marsaglia and Tsang, 2000; shape below 1 by
    /// drawing shape `k + 1` and scaling by `u^(1/k)`).
    fn gamma(&mut self, k: f64) -> f64 {
        if k < 1.0 {
            let g = self.gamma(k + 1.0);
            return g * self.uniform().powf(1.0 / k);
        }
        let d = k - 1.0 / 3.0;
        let c = 1.0 / (9.0 * d).sqrt();
        loop {
            let x = self.normal();
            let v = 1.0 + c * x;
            if v <= 0.0 {
                continue;
            }
            let v = v * v * v;
            let u = self.uniform();
            if u < 1.0 - 0.0331 * x.powi(4) || u.ln() < 0.5 * x * x + d * (1.0 - v + v.ln()) {
                return d * v;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_constant_2000_per_second_for_10_seconds_is_20000_arrivals_500_us_apart() {
        let s = schedule(
            Arrival::Constant,
            2000.0,
            7,
            0,
            Extent::DurationUs(10_000_000),
        );
        assert_eq!(s.len(), 20_000);
        assert_eq!(s[0], 0);
        assert_eq!(s[1], 500);
        assert_eq!(*s.last().unwrap(), 9_999_500);
        assert!(s.windows(2).all(|w| w[1] - w[0] == 500));
        assert_eq!(gap_cv(&s), Some(0.0));
        // A rate whose gap is not a whole number of microseconds does not drift.
        let t = schedule(Arrival::Constant, 3.0, 7, 0, Extent::Requests(4));
        assert_eq!(t, vec![0, 333_333, 666_667, 1_000_000]);
    }

    #[test]
    fn a_seeded_schedule_is_the_same_every_time_and_its_first_offsets_are_pinned() {
        let a = schedule(Arrival::Poisson, 10.0, 7, 3, Extent::Requests(1_000));
        let b = schedule(Arrival::Poisson, 10.0, 7, 3, Extent::Requests(1_000));
        assert_eq!(a, b);
        // Another round (stream) or another seed is another schedule.
        assert_ne!(
            a,
            schedule(Arrival::Poisson, 10.0, 7, 4, Extent::Requests(1_000))
        );
        assert_ne!(
            a,
            schedule(Arrival::Poisson, 10.0, 8, 3, Extent::Requests(1_000))
        );
        // Pinned: a change of generator, seeding or transform shows here first.
        assert_eq!(a[..5], PINNED_POISSON);
        let g = schedule(
            Arrival::Gamma { burstiness: 0.5 },
            10.0,
            7,
            3,
            Extent::Requests(5),
        );
        assert_eq!(g, PINNED_GAMMA);
    }

    const PINNED_POISSON: [u64; 5] = [0, 170627, 408288, 410410, 520006];
    const PINNED_GAMMA: [u64; 5] = [0, 76249, 625340, 626068, 631575];

    #[test]
    fn poisson_and_gamma_gaps_have_the_rate_and_the_spread_they_promise() {
        let n = 200_000;
        let p = schedule(Arrival::Poisson, 100.0, 1, 0, Extent::Requests(n));
        let mean_gap = *p.last().unwrap() as f64 / (n - 1) as f64;
        assert!(
            (mean_gap - 10_000.0).abs() < 100.0,
            "mean gap {mean_gap} µs"
        );
        let cv = gap_cv(&p).unwrap();
        assert!((cv - 1.0).abs() < 0.02, "Poisson CV {cv}");
        for k in [0.25, 0.5, 2.0, 4.0] {
            let g = schedule(
                Arrival::Gamma { burstiness: k },
                100.0,
                1,
                0,
                Extent::Requests(n),
            );
            let mean_gap = *g.last().unwrap() as f64 / (n - 1) as f64;
            assert!(
                (mean_gap - 10_000.0).abs() < 200.0,
                "k={k}: mean gap {mean_gap} µs"
            );
            let want = 1.0 / k.sqrt();
            let cv = gap_cv(&g).unwrap();
            assert!(
                (cv - want).abs() < 0.05 * want,
                "k={k}: CV {cv}, want {want}"
            );
        }
        // Gamma of burstiness 1 is a Poisson process: the same spread.
        let g1 = schedule(
            Arrival::Gamma { burstiness: 1.0 },
            100.0,
            1,
            0,
            Extent::Requests(n),
        );
        assert!((gap_cv(&g1).unwrap() - 1.0).abs() < 0.02);
    }

    #[test]
    fn a_duration_bounds_the_schedule_and_every_offset_is_inside_it() {
        let s = schedule(Arrival::Poisson, 50.0, 9, 1, Extent::DurationUs(60_000_000));
        assert!(s.iter().all(|&o| o < 60_000_000));
        assert!(s.windows(2).all(|w| w[0] <= w[1]));
        // 3,000 expected; a Poisson count's standard deviation is ~55.
        assert!((2_750..=3_250).contains(&s.len()), "{}", s.len());
        assert_eq!(gap_cv(&s[..2]), None);
    }
}
