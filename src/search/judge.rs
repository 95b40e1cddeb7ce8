//! One probe judged against the SLOs: per SLO, the distribution-free bound on its
//! percentile from the order statistics at ranks n p ∓ z √(n p (1 − p)) (Bonferroni: each
//! of k statements at confidence 1 − (1 − c) / k), and the good share's exact
//! (Clopper-Pearson) interval. A probe passes when every upper bound meets its SLO (and
//! the good share's lower bound meets `--good-share-min`), fails when any lower bound
//! breaks one (or the good share's upper bound is below the minimum), and straddles
//! otherwise. Imports nothing else from `search/` but the documents it fills.

use super::doc::{GoodShareDoc, SloDoc, Verdict};
use crate::config::search::{Quantity, SearchSpec, SloBound};
use crate::metrics::Sample;
use crate::model::Outcome;

/// What one request of a probe says for the SLOs, latencies from its scheduled send.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct RequestView {
    pub(crate) ok: bool,
    pub(crate) ttft_us: Option<i64>,
    pub(crate) tpot_us: Option<i64>,
    pub(crate) e2e_us: Option<i64>,
}

impl RequestView {
    /// A measured request: time to first token (a non-streamed answer's first byte) and
    /// the end, each plus its send lag (an open loop's lateness counts: MLPerf measures
    /// from the scheduled send); its time per output token as streamed.
    pub(crate) fn of(s: &Sample) -> RequestView {
        let lag = s.send_lag_us().unwrap_or(0);
        let st = s.stream.as_ref();
        let ttft = st.map_or(s.first_byte_us, |st| st.ttft_us.or(s.first_byte_us));
        RequestView {
            ok: s.outcome == Outcome::Ok,
            ttft_us: ttft.map(|t| t.saturating_add(lag)),
            tpot_us: st.and_then(|st| st.tpot_us),
            e2e_us: s.latency_from_schedule_us(),
        }
    }

    /// This request's value of `q`: a failed request's is above every bound (it never
    /// meets an SLO); `None` when it has none (a TPOT of a one-token or unstreamed answer
    /// is not a sample).
    fn value(&self, q: Quantity) -> Option<i64> {
        if !self.ok {
            return Some(i64::MAX);
        }
        match q {
            Quantity::Ttft => Some(self.ttft_us.unwrap_or(i64::MAX)),
            Quantity::Tpot => self.tpot_us,
            Quantity::E2e => Some(self.e2e_us.unwrap_or(i64::MAX)),
        }
    }

    /// Meets every bound at once (and succeeded): a good request.
    pub(crate) fn good(&self, slos: &[SloBound]) -> bool {
        self.ok
            && slos
                .iter()
                .all(|s| self.value(s.quantity).is_none_or(|v| v <= s.bound_us))
    }
}

/// The confidence of each statement under Bonferroni.
pub(crate) fn statement_confidence(spec: &SearchSpec) -> f64 {
    1.0 - (1.0 - spec.confidence) / spec.statements().max(1) as f64
}

/// Requests a probe plans: the most any SLO's percentile needs for its bound to span
/// ±margin in rank at its statement's confidence.
pub(crate) fn planned_requests(spec: &SearchSpec) -> u64 {
    let c = statement_confidence(spec);
    spec.slos
        .iter()
        .map(|s| crate::stats::sample_size(s.percentile, spec.margin, c))
        .max()
        .unwrap_or(1)
        .max(1)
}

/// Each SLO's bound over `views`, the good share, and the verdict they give.
pub(crate) fn judge(
    spec: &SearchSpec,
    views: &[RequestView],
) -> (Vec<SloDoc>, Option<GoodShareDoc>, Verdict) {
    let c = statement_confidence(spec);
    let slos: Vec<SloDoc> = spec.slos.iter().map(|s| slo_bound(s, views, c)).collect();
    let good = spec
        .good_share_min
        .map(|min| good_share(spec, views, min, c));
    let verdicts = slos
        .iter()
        .map(|s| s.verdict)
        .chain(good.iter().map(|g| g.verdict));
    let mut out = Verdict::Pass;
    for v in verdicts {
        out = match (out, v) {
            (_, Verdict::Fail) | (Verdict::Fail, _) => Verdict::Fail,
            (_, Verdict::Straddle) | (Verdict::Straddle, _) => Verdict::Straddle,
            _ => out,
        };
    }
    (slos, good, out)
}

fn ms(us: i64) -> Option<f64> {
    (us != i64::MAX).then_some(us as f64 / 1e3)
}

/// One SLO's bound: the order statistics at the ranks `stats::percentile_ranks` gives.
fn slo_bound(s: &SloBound, views: &[RequestView], c: f64) -> SloDoc {
    let mut v: Vec<i64> = views.iter().filter_map(|r| r.value(s.quantity)).collect();
    v.sort_unstable();
    let n = v.len() as u64;
    let (lo, hi) = crate::stats::percentile_ranks(n, s.percentile, c);
    let at = |rank: u64| v.get(rank as usize - 1).copied();
    let lower = lo.and_then(at).unwrap_or(0);
    let upper = hi.and_then(at);
    let estimate = (n > 0).then(|| {
        let rank = ((s.percentile * n as f64).ceil() as u64).clamp(1, n);
        v[rank as usize - 1]
    });
    let verdict = if n == 0 {
        Verdict::Straddle
    } else if lower > s.bound_us {
        Verdict::Fail
    } else if upper.is_some_and(|u| u <= s.bound_us) {
        Verdict::Pass
    } else {
        Verdict::Straddle
    };
    SloDoc {
        slo: s.text.clone(),
        bound_ms: s.bound_us as f64 / 1e3,
        samples: n,
        estimate_ms: estimate.and_then(ms),
        lower_ms: ms(lower),
        upper_ms: upper.and_then(ms),
        ranks: [lo, hi],
        verdict,
    }
}

/// The share of requests meeting every bound at once, with its exact interval.
fn good_share(spec: &SearchSpec, views: &[RequestView], min: f64, c: f64) -> GoodShareDoc {
    let good = views.iter().filter(|v| v.good(&spec.slos)).count() as u64;
    let n = views.len() as u64;
    let (lower, upper) = crate::stats::clopper_pearson(good, n, c).unwrap_or((0.0, 1.0));
    let verdict = if upper < min {
        Verdict::Fail
    } else if lower >= min {
        Verdict::Pass
    } else {
        Verdict::Straddle
    };
    GoodShareDoc {
        good,
        requests: n,
        share: (n > 0).then(|| good as f64 / n as f64),
        lower,
        upper,
        min,
        verdict,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::search::SearchKind;

    fn spec(slos: &str, margin: f64) -> SearchSpec {
        let mut s = SearchSpec::for_test(SearchKind::Concurrency, slos, margin);
        s.ceiling = 64.0;
        s
    }

    fn views(ttft_ms: impl IntoIterator<Item = i64>) -> Vec<RequestView> {
        ttft_ms
            .into_iter()
            .map(|t| RequestView {
                ok: true,
                ttft_us: Some(t * 1000),
                tpot_us: None,
                e2e_us: Some(t * 1000 + 5000),
            })
            .collect()
    }

    #[test]
    fn a_tail_well_inside_passes_well_outside_fails_and_at_the_bound_straddles() {
        let s = spec("ttft_p90<=100ms", 0.05);
        let n = planned_requests(&s) as i64;
        assert_eq!(n, 139);
        // 1..=n ms: p90 about 125 ms.
        let (_, _, v) = judge(&s, &views(1..=n));
        assert_eq!(v, Verdict::Fail);
        let (_, _, v) = judge(&s, &views((1..=n).map(|t| t / 2)));
        assert_eq!(v, Verdict::Pass);
        // Ranks 118 to 133 of 139: the bound falls between them.
        let (docs, _, v) = judge(&s, &views((1..=n).map(|t| t * 100 / 125)));
        assert_eq!(v, Verdict::Straddle, "{docs:?}");
        assert_eq!(docs[0].ranks, [Some(118), Some(133)]);
    }

    #[test]
    fn a_probe_plans_what_its_most_demanding_slo_needs_under_bonferroni() {
        // docs/load.md's table: p99 and p95 at ±1 point, each at 97.5 %: the p95 needs
        // 2,387 requests; p99 alone at 95 %: 381; a median at ±1 point: 9,604.
        assert_eq!(
            planned_requests(&spec("ttft_p99<=1s,e2e_p95<=8s", 0.01)),
            2387
        );
        assert_eq!(planned_requests(&spec("ttft_p99<=1s", 0.01)), 381);
        assert_eq!(planned_requests(&spec("tpot_p50<=50ms", 0.01)), 9604);
        let mut with_share = spec("ttft_p99<=1s", 0.01);
        with_share.good_share_min = Some(0.9);
        assert_eq!(statement_confidence(&with_share), 0.975);
    }

    #[test]
    fn failures_count_above_every_bound_and_a_missing_tpot_is_not_a_sample() {
        let s = spec("ttft_p50<=100ms,tpot_p50<=10ms", 0.1);
        let mut v = views(std::iter::repeat_n(1, 200));
        for r in v.iter_mut().take(120) {
            r.ok = false;
        }
        let (docs, _, verdict) = judge(&s, &v);
        assert_eq!(verdict, Verdict::Fail);
        assert_eq!(docs[0].estimate_ms, None, "the median is a failure");
        // TPOT: only failed requests are samples (the successes reported none).
        assert_eq!(docs[1].samples, 120);
    }

    #[test]
    fn the_good_share_is_judged_on_its_exact_interval() {
        let mut s = spec("e2e_p50<=1s", 0.1);
        s.good_share_min = Some(0.9);
        let mut v = views(std::iter::repeat_n(1, 400));
        for r in v.iter_mut().take(100) {
            r.e2e_us = Some(2_000_000);
        }
        let (_, good, verdict) = judge(&s, &v);
        let g = good.unwrap();
        assert_eq!((g.good, g.requests), (300, 400));
        assert_eq!(g.verdict, Verdict::Fail);
        assert_eq!(verdict, Verdict::Fail);
    }
}
