//! Nearest-rank percentiles, the mean, the ordinary median and the spread across rounds.
//! A leaf of `metrics`.

/// Mean, summed in sorted order so the result does not depend on sample order (a rebuilt
/// summary must equal the original to the last bit).
pub(crate) fn mean(v: &[f64]) -> Option<f64> {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// Nearest-rank percentile `pct`/100 of sorted samples; `None` when empty.
pub(crate) fn nearest_rank(sorted: &[i64], pct: u32) -> Option<i64> {
    if sorted.is_empty() {
        return None;
    }
    let n = sorted.len() as u64;
    let rank = (u64::from(pct) * n).div_ceil(100).max(1);
    sorted.get((rank - 1) as usize).copied()
}

#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(crate) struct Percentiles {
    pub(crate) p50: Option<i64>,
    pub(crate) p95: Option<i64>,
    pub(crate) p99: Option<i64>,
}

impl Percentiles {
    pub(crate) fn of(mut v: Vec<i64>) -> Percentiles {
        v.sort_unstable();
        Percentiles {
            p50: nearest_rank(&v, 50),
            p95: nearest_rank(&v, 95),
            p99: nearest_rank(&v, 99),
        }
    }
}
/// Spread of one metric across complete rounds.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Spread {
    /// Each round's value, in round order (what a bootstrap resamples).
    pub(crate) values: Vec<f64>,
    pub(crate) rounds: usize,
    pub(crate) min: f64,
    pub(crate) median: f64,
    pub(crate) max: f64,
    /// `(max - min) / median`; `None` when the median is 0.
    pub(crate) relative_spread: Option<f64>,
}

/// Ordinary median (mean of the two middle values for an even count).
pub(crate) fn median(values: &[f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

pub(crate) fn spread(values: &[f64]) -> Option<Spread> {
    let med = median(values)?;
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    Some(Spread {
        values: values.to_vec(),
        rounds: values.len(),
        min,
        median: med,
        max,
        relative_spread: (med != 0.0).then(|| (max - min) / med),
    })
}
