//! An arm's validity per oracle kind: how many of its answers kept their oracle, with an
//! exact 95 % interval whose unit is the distinct request (case, variant): repeats of one
//! request are one item, valid when every judged answer to it was, as McNemar counts
//! them. Beside it, paired over the requests both sides had judged, how far the arm falls
//! below the reference: `b` requests only the reference kept, `c` only the arm kept, the
//! drop `(b - c) / n` with a conservative 95 % interval from exact bounds on `b / n` and
//! `c / n` (Bonferroni: each at 97.5 %, 1.25 % in each tail). Campaign.json's drift entries carry it; contract
//! v2's `min_valid_rate` and `valid_rate_floor_delta` read it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::config::plan::Plan;
use crate::drift::Answers;
use crate::stats::clopper_pearson;

/// Each judged request's oracle kind: (case, variant) -> `Oracle::kind`.
pub(crate) type Kinds = BTreeMap<(String, Option<String>), &'static str>;

/// The oracle kinds a contract's validity gates read: the contracts (an exact oracle's
/// validity is its exact-match rate, which McNemar and drift already judge).
pub(crate) const CONTRACT_KINDS: &[&str] = &["schema", "tool_calls", "choice", "pattern"];

/// The confidence of every interval here.
const CONFIDENCE: f64 = 0.95;

/// The plan's judged requests' kinds.
pub(crate) fn kinds(plan: &Plan) -> Kinds {
    plan.cases
        .iter()
        .flat_map(|c| {
            c.variants
                .iter()
                .map(move |v| ((c.name.clone(), v.name.clone()), v.oracle.kind()))
        })
        .collect()
}

/// One oracle kind's validity on one arm.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct Validity {
    pub(crate) kind: String,
    /// Judged answers, and those that kept the oracle.
    pub(crate) answers: u64,
    pub(crate) valid_answers: u64,
    /// Distinct requests judged, and those whose every judged answer kept it.
    pub(crate) requests: u64,
    pub(crate) valid_requests: u64,
    /// `valid_requests / requests`, and its exact (Clopper-Pearson) 95 % interval.
    pub(crate) rate: Option<f64>,
    pub(crate) interval: Option<[f64; 2]>,
    /// The reference's own, over its judged requests of this kind.
    pub(crate) reference_requests: u64,
    pub(crate) reference_valid_requests: u64,
    pub(crate) reference_rate: Option<f64>,
    /// Paired over the requests both sides judged.
    pub(crate) paired: Option<Paired>,
}

/// The arm against the reference, request by request.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct Paired {
    pub(crate) requests: u64,
    pub(crate) only_reference_valid: u64,
    pub(crate) only_arm_valid: u64,
    /// `(only_reference_valid - only_arm_valid) / requests`: how far the arm's rate is
    /// below the reference's on these requests, and its conservative 95 % interval.
    pub(crate) drop: f64,
    pub(crate) drop_interval: [f64; 2],
}

/// Each side's requests of each kind: (kind, request) -> valid (every judged answer).
type ByRequest<'a> = BTreeMap<(&'static str, (&'a str, Option<&'a str>)), (bool, u64, u64)>;

fn by_request<'a>(side: &'a Answers, kinds: &Kinds) -> ByRequest<'a> {
    let mut out: ByRequest<'a> = BTreeMap::new();
    for (k, passed) in &side.judged {
        let kind = kinds
            .get(&(k.case.clone(), k.variant.clone()))
            .copied()
            .unwrap_or("json");
        let e = out
            .entry((kind, (k.case.as_str(), k.variant.as_deref())))
            .or_insert((true, 0, 0));
        e.0 &= *passed;
        e.1 += 1;
        e.2 += u64::from(*passed);
    }
    out
}

/// The arm `a`'s validity per oracle kind it was judged by, beside the reference `r`'s.
pub(crate) fn of(r: &Answers, a: &Answers, kinds: &Kinds) -> Vec<Validity> {
    let (rs, arm) = (by_request(r, kinds), by_request(a, kinds));
    let mut out: BTreeMap<&'static str, Validity> = BTreeMap::new();
    for ((kind, _), (valid, answers, valid_answers)) in &arm {
        let v = out.entry(kind).or_insert_with(|| Validity {
            kind: kind.to_string(),
            ..Validity::default()
        });
        v.answers += answers;
        v.valid_answers += valid_answers;
        v.requests += 1;
        v.valid_requests += u64::from(*valid);
    }
    for ((kind, _), (valid, ..)) in &rs {
        if let Some(v) = out.get_mut(kind) {
            v.reference_requests += 1;
            v.reference_valid_requests += u64::from(*valid);
        }
    }
    for v in out.values_mut() {
        v.rate = rate(v.valid_requests, v.requests);
        v.interval = clopper_pearson(v.valid_requests, v.requests, CONFIDENCE).map(|(l, h)| [l, h]);
        v.reference_rate = rate(v.reference_valid_requests, v.reference_requests);
        v.paired = paired(&rs, &arm, &v.kind);
    }
    out.into_values().collect()
}

fn rate(k: u64, n: u64) -> Option<f64> {
    (n > 0).then(|| k as f64 / n as f64)
}

/// Kind `kind`'s requests both sides judged, paired.
fn paired(r: &ByRequest<'_>, a: &ByRequest<'_>, kind: &str) -> Option<Paired> {
    let (mut n, mut b, mut c) = (0u64, 0u64, 0u64);
    for ((k, req), (arm_valid, ..)) in a {
        if *k != kind {
            continue;
        }
        let Some((ref_valid, ..)) = r.get(&(*k, *req)) else {
            continue;
        };
        n += 1;
        b += u64::from(*ref_valid && !arm_valid);
        c += u64::from(!ref_valid && *arm_valid);
    }
    if n == 0 {
        return None;
    }
    // Each count's interval at 97.5 % (1.25 % in each tail): the drop's ends, each a
    // difference of two ends, hold together with at least 95 %.
    let each = 1.0 - (1.0 - CONFIDENCE) / 2.0;
    let (bl, bh) = clopper_pearson(b, n, each)?;
    let (cl, ch) = clopper_pearson(c, n, each)?;
    Some(Paired {
        requests: n,
        only_reference_valid: b,
        only_arm_valid: c,
        drop: (b as f64 - c as f64) / n as f64,
        drop_interval: [bl - ch, bh - cl],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::drift::Key;

    fn side(results: &[(&str, i64, bool)]) -> Answers {
        let mut a = Answers::default();
        for (i, (variant, idx, passed)) in results.iter().enumerate() {
            let key = Key {
                case: "c".into(),
                variant: Some(variant.to_string()),
                concurrency: 1,
                repetition: i as i32,
                dispatch_index: *idx,
                turn: None,
            };
            a.judged.insert(key, *passed);
        }
        a
    }

    #[test]
    fn a_request_is_valid_when_every_answer_to_it_is_and_the_drop_is_paired() {
        let kinds: Kinds = ["a", "b", "c", "d"]
            .iter()
            .map(|v| (("c".to_string(), Some(v.to_string())), "tool_calls"))
            .collect();
        let reference = side(&[
            ("a", 0, true),
            ("b", 1, true),
            ("c", 2, true),
            ("d", 3, false),
        ]);
        // Request b: one of its two answers broke, so the request is not valid.
        let arm = side(&[
            ("a", 0, true),
            ("b", 1, true),
            ("b", 5, false),
            ("c", 2, false),
            ("d", 3, true),
        ]);
        let v = of(&reference, &arm, &kinds);
        assert_eq!(v.len(), 1);
        let v = &v[0];
        assert_eq!(
            (v.kind.as_str(), v.answers, v.valid_answers),
            ("tool_calls", 5, 3)
        );
        assert_eq!((v.requests, v.valid_requests, v.rate), (4, 2, Some(0.5)));
        assert_eq!((v.reference_requests, v.reference_rate), (4, Some(0.75)));
        let p = v.paired.as_ref().unwrap();
        assert_eq!(
            (p.requests, p.only_reference_valid, p.only_arm_valid),
            (4, 2, 1)
        );
        assert!((p.drop - 0.25).abs() < 1e-12);
        assert!(p.drop_interval[0] < 0.25 && p.drop_interval[1] > 0.25);
        let [lo, hi] = v.interval.unwrap();
        assert!(lo < 0.5 && hi > 0.5);
    }
}
