//! `tolerance` on a JSON oracle (`expected_response`): numeric leaves equal within an
//! absolute or relative difference, for the whole answer or below given pointers, so a
//! score or a log-probability that moves in its last digits between batches still passes.
//! Everything else stays type-strict; under a tolerance an integer and a float compare as
//! numbers (`1` and `1.0` are equal).

use std::collections::BTreeMap;

use serde_json::Number;

use super::pointer::Pointer;

/// One bound: `|expected - actual| <= abs`, or `<= rel * max(|expected|, |actual|)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Tol {
    pub(crate) abs: f64,
    pub(crate) rel: f64,
}

impl Tol {
    /// Whether `expected` and `actual` are equal within the bound.
    pub(crate) fn holds(self, expected: f64, actual: f64) -> bool {
        self.holds_difference((expected - actual).abs(), expected.abs().max(actual.abs()))
    }

    /// [`Self::holds`] for two JSON numbers: two integers by their exact difference (past
    /// 2^53 a float would round them together), anything else as floats.
    pub(crate) fn holds_numbers(self, expected: &Number, actual: &Number) -> bool {
        let int = |n: &Number| {
            n.as_i64()
                .map(i128::from)
                .or_else(|| n.as_u64().map(i128::from))
        };
        match (int(expected), int(actual)) {
            (Some(e), Some(a)) => {
                let larger = e.unsigned_abs().max(a.unsigned_abs()) as f64;
                self.holds_difference(e.abs_diff(a) as f64, larger)
            }
            _ => match (expected.as_f64(), actual.as_f64()) {
                (Some(e), Some(a)) => self.holds(e, a),
                _ => false,
            },
        }
    }

    /// `d` (a difference) within the bound, `larger` the larger magnitude of the two.
    fn holds_difference(self, d: f64, larger: f64) -> bool {
        d <= self.abs || d <= self.rel * larger
    }
}

impl std::fmt::Display for Tol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "abs {}, rel {}", self.abs, self.rel)
    }
}

/// A JSON oracle's tolerances as a trie: the root's is the whole answer's; a node's holds
/// for every numeric leaf below its pointer unless a deeper pointer gives its own.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct TolNode {
    pub(crate) tol: Option<Tol>,
    children: BTreeMap<String, TolNode>,
}

impl TolNode {
    /// The whole answer's tolerance (`None`: only the pointers' own).
    pub(crate) fn whole(tol: Option<Tol>) -> TolNode {
        TolNode {
            tol,
            children: BTreeMap::new(),
        }
    }

    /// Give the values below `at` the bound `tol`.
    pub(crate) fn insert(&mut self, at: &Pointer, tol: Tol) {
        let mut node = self;
        for t in &at.tokens {
            node = node.children.entry(t.clone()).or_default();
        }
        node.tol = Some(tol);
    }

    /// The node of the member or element named `key`, if any pointer goes through it.
    pub(crate) fn child(&self, key: &str) -> Option<&TolNode> {
        self.children.get(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bound_is_absolute_or_relative_whichever_is_wider() {
        let t = Tol {
            abs: 0.01,
            rel: 0.0,
        };
        assert!(t.holds(0.5, 0.509) && !t.holds(0.5, 0.52));
        let r = Tol { abs: 0.0, rel: 0.1 };
        assert!(r.holds(100.0, 109.0) && !r.holds(100.0, 112.0));
        assert!(
            r.holds(0.0, 0.0) && !r.holds(0.0, 1e-9),
            "0 is only near itself relatively"
        );
        // Integers by their exact difference: 2^53 and 2^53 + 1 are one apart.
        let exact = Tol { abs: 0.0, rel: 0.0 };
        let n = |x: u64| Number::from(x);
        assert!(!exact.holds_numbers(&n(1 << 53), &n((1 << 53) + 1)));
        assert!(Tol { abs: 1.0, rel: 0.0 }.holds_numbers(&n(1 << 53), &n((1 << 53) + 1)));
        assert!(exact.holds_numbers(&n(3), &Number::from_f64(3.0).unwrap()));
        let mut root = TolNode::whole(None);
        root.insert(&Pointer::parse("/a/0").unwrap(), t);
        assert_eq!(
            root.child("a")
                .and_then(|a| a.child("0"))
                .and_then(|n| n.tol),
            Some(t)
        );
        assert!(root.child("b").is_none());
    }
}
