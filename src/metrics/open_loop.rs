//! An open round's numbers: the lag of its sends behind their schedule (saturation) and
//! goodput against an SLO.

use super::percentiles::Percentiles;
use super::sample::Sample;
use crate::model::{Outcome, Slo};

/// A send this far behind its schedule (µs) fell behind: its round is `saturated`.
pub(crate) const SATURATION_LAG_US: i64 = 5_000;

/// What an open-loop round measures beside the closed loop's numbers.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct OpenMetrics {
    pub(crate) target_rate_per_second: f64,
    /// `(sends - 1) / (last send - first send)`, from the actual send times.
    pub(crate) achieved_rate_per_second: Option<f64>,
    /// The same of the intended send times: the schedule's own rate (a trace's recorded
    /// rate at its speed-up), beside which the achieved one is read.
    pub(crate) scheduled_rate_per_second: Option<f64>,
    /// Over every attempted send.
    pub(crate) send_lag_us: Percentiles,
    pub(crate) send_lag_max_us: Option<i64>,
    /// Successful exchanges, from the intended send time to the last body byte.
    pub(crate) latency_from_schedule_us: Percentiles,
    /// Coefficient of variation of the gaps between actual sends, and between the
    /// intended ones (1 for Poisson, 0 for constant, `1/sqrt(k)` for gamma).
    pub(crate) inter_arrival_cv: Option<f64>,
    pub(crate) scheduled_inter_arrival_cv: Option<f64>,
    /// Sends more than [`SATURATION_LAG_US`] behind their schedule.
    pub(crate) late_sends: u64,
    pub(crate) saturated: bool,
    /// A trace round: how late (p99, µs) a bare thread woke from sleeping to deadlines
    /// 500 µs apart just before the round, the machine's own floor beside the send lag
    /// (`None` elsewhere; carried over by `summarize`, which cannot measure it).
    pub(crate) wake_floor_p99_us: Option<i64>,
}

/// Goodput of a round against the plan's `slo`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Goodput {
    /// Passed the oracle and met every bound.
    pub(crate) good_requests: u64,
    /// Over the round's elapsed time, like `successful_requests_per_second`.
    pub(crate) good_requests_per_second: Option<f64>,
    /// Per bound given: successful exchanges that missed it (`None`: no such bound).
    pub(crate) missed_ttft: Option<u64>,
    pub(crate) missed_tpot: Option<u64>,
    pub(crate) missed_e2e: Option<u64>,
}

/// Goodput of `samples` against `slo`. TTFT is the first content event of a stream, the
/// first response byte otherwise; a TPOT bound does not apply to an exchange without a
/// TPOT (not a stream, or one output token); e2e is [`Sample::latency_from_schedule_us`].
pub(crate) fn goodput(samples: &[Sample], slo: &Slo, elapsed_seconds: f64) -> Goodput {
    let (mut good, mut ttft, mut tpot, mut e2e) = (0u64, 0u64, 0u64, 0u64);
    for s in samples.iter().filter(|s| s.outcome == Outcome::Ok) {
        let st = s.stream.as_ref();
        let over = |v: Option<i64>, bound: Option<i64>| match (v, bound) {
            (_, None) => false,
            (Some(v), Some(b)) => v > b,
            (None, Some(_)) => true,
        };
        let miss_ttft = over(st.map_or(s.first_byte_us, |st| st.ttft_us), slo.ttft_us);
        let tpot_us = st.and_then(|st| st.tpot_us);
        let miss_tpot = tpot_us.is_some() && over(tpot_us, slo.tpot_us);
        let miss_e2e = over(s.latency_from_schedule_us(), slo.e2e_us);
        ttft += u64::from(miss_ttft);
        tpot += u64::from(miss_tpot);
        e2e += u64::from(miss_e2e);
        good += u64::from(!(miss_ttft || miss_tpot || miss_e2e));
    }
    Goodput {
        good_requests: good,
        good_requests_per_second: (elapsed_seconds > 0.0).then(|| good as f64 / elapsed_seconds),
        missed_ttft: slo.ttft_us.map(|_| ttft),
        missed_tpot: slo.tpot_us.map(|_| tpot),
        missed_e2e: slo.e2e_us.map(|_| e2e),
    }
}

/// The open-loop numbers of a round at `rate`: rates, gaps and send lag over its
/// attempted arrivals (a session's first turn is its arrival; its later turns are due when
/// the turn before them ends, or in a trace at their own offset if later, and are sent on
/// the runtime's timer, not the pacer), latency over every request (from its intended
/// send, a trace's later turn's from when it was due).
pub(super) fn open_metrics(rate: f64, all: &[Sample]) -> OpenMetrics {
    let arrivals: Vec<&Sample> = all
        .iter()
        .filter(|s| s.turn.is_none_or(|t| t == 1))
        .collect();
    let samples = arrivals.iter().copied();
    let mut sends: Vec<i64> = samples.clone().map(|s| s.start_offset_us).collect();
    sends.sort_unstable();
    let mut scheduled: Vec<i64> = samples
        .clone()
        .filter_map(|s| s.scheduled_offset_us)
        .collect();
    scheduled.sort_unstable();
    let lags: Vec<i64> = samples.clone().filter_map(Sample::send_lag_us).collect();
    let late_sends = lags.iter().filter(|&&l| l > SATURATION_LAG_US).count() as u64;
    let rate_of = |v: &[i64]| match (v.first(), v.last()) {
        (Some(a), Some(b)) if b > a => Some((v.len() - 1) as f64 / ((b - a) as f64 / 1e6)),
        _ => None,
    };
    let achieved_rate_per_second = rate_of(&sends);
    let as_u64 = |v: &[i64]| -> Vec<u64> { v.iter().map(|&x| x.max(0) as u64).collect() };
    OpenMetrics {
        target_rate_per_second: rate,
        achieved_rate_per_second,
        scheduled_rate_per_second: rate_of(&scheduled),
        send_lag_max_us: lags.iter().copied().max(),
        send_lag_us: Percentiles::of(lags),
        // Every request's: a later turn's runs from its send, when it was due.
        latency_from_schedule_us: Percentiles::of(
            all.iter()
                .filter(|s| s.outcome == Outcome::Ok)
                .filter_map(Sample::latency_from_schedule_us)
                .collect(),
        ),
        inter_arrival_cv: crate::arrival::gap_cv(&as_u64(&sends)),
        scheduled_inter_arrival_cv: crate::arrival::gap_cv(&as_u64(&scheduled)),
        late_sends,
        saturated: late_sends > 0,
        wake_floor_p99_us: None,
    }
}
