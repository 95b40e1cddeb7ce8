//! `replay --search`: the operating point's question, parsed and checked before a run
//! starts. `--slo "ttft_p99<=500ms,tpot_p50<=50ms,e2e_p95<=8s"` is a list of bounds on
//! per-request percentiles ([`SloBound`]); [`SearchSpec`] adds the kind of load searched,
//! the statistics' confidence and margin, the good share asked for and the budget. Pure:
//! the values come from the command line, the errors name the flag and the fix.

use std::time::Duration;

/// What the search varies (`rate` or `concurrency` in search.json and campaign.json).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum SearchKind {
    /// Open-loop arrival rates (requests per second), the plan's arrival process.
    Rate,
    /// Closed-loop concurrencies (requests in flight).
    Concurrency,
}

impl SearchKind {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            SearchKind::Rate => "rate",
            SearchKind::Concurrency => "concurrency",
        }
    }

    /// `--search`'s value.
    pub(crate) fn parse(s: &str) -> Result<SearchKind, SearchError> {
        match s {
            "rate" => Ok(SearchKind::Rate),
            "concurrency" => Ok(SearchKind::Concurrency),
            other => Err(SearchError::Kind(other.to_string())),
        }
    }
}

/// A per-request quantity an SLO bounds (the ones goodput counts).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Quantity {
    /// Time to first token (a non-streamed answer's first byte), from the scheduled send.
    Ttft,
    /// Time per output token after the first, per streamed request.
    Tpot,
    /// End-to-end latency, from the scheduled send.
    E2e,
}

impl Quantity {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Quantity::Ttft => "ttft",
            Quantity::Tpot => "tpot",
            Quantity::E2e => "e2e",
        }
    }
}

/// One SLO: the `percentile` of `quantity` over a probe's requests is at most `bound_us`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SloBound {
    pub(crate) quantity: Quantity,
    /// The percentile as a share, 0 < p < 1 (`p99` is 0.99).
    pub(crate) percentile: f64,
    pub(crate) bound_us: i64,
    /// As given (`ttft_p99<=500ms`), for what the search prints.
    pub(crate) text: String,
}

impl SloBound {
    /// `ttft_p99`.
    pub(crate) fn metric(&self) -> String {
        self.text
            .split_once("<=")
            .map_or(self.text.clone(), |(m, _)| m.to_string())
    }
}

/// The whole search, checked.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SearchSpec {
    pub(crate) kind: SearchKind,
    pub(crate) slos: Vec<SloBound>,
    /// `--good-share-min`: the share of requests meeting every bound at once that a
    /// passing probe must hold (its lower confidence bound).
    pub(crate) good_share_min: Option<f64>,
    /// `--confidence`, over all the SLOs (and the good share) together.
    pub(crate) confidence: f64,
    /// `--margin` δ: a probe's percentile bound spans ranks n(p − δ) to n(p + δ).
    pub(crate) margin: f64,
    /// `--budget-seconds`.
    pub(crate) budget: Option<Duration>,
    /// The first probe's load (`--search-from`), else the plan's first level.
    pub(crate) from: f64,
    /// The highest load a probe may ask for (concurrency: what the open-file limit holds).
    pub(crate) ceiling: f64,
}

/// The defaults of the flags.
pub(crate) const DEFAULT_CONFIDENCE: f64 = 0.95;
pub(crate) const DEFAULT_MARGIN: f64 = 0.01;
/// At most this many SLOs in one `--slo`.
pub(crate) const MAX_SLOS: usize = 8;
/// The longest bound an SLO may state (an hour).
const MAX_BOUND_US: i64 = 3_600_000_000;

/// Why `--search` and its flags cannot be used as given.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(crate) enum SearchError {
    #[error("--search '{0}': give rate (open-loop arrivals) or concurrency (closed loop)")]
    Kind(String),
    #[error(
        "--search needs --slo: the bounds a probe must meet, e.g. --slo \"ttft_p99<=500ms,e2e_p95<=8s\""
    )]
    NoSlo,
    #[error("--slo needs --search rate|concurrency: an SLO alone has no load to search")]
    SloWithoutSearch,
    #[error(
        "--slo item '{item}': {why}; an item is <ttft|tpot|e2e>_p<percentile><=<number><ms|s|us>, e.g. ttft_p99<=500ms"
    )]
    Item { item: String, why: String },
    #[error("--slo gives {0} bounds; at most {MAX_SLOS}")]
    TooMany(usize),
    #[error("--slo names {0} twice")]
    Twice(String),
    #[error("--confidence {0}: give a share from 0.5 to 0.9999 (0.95 is 95 %)")]
    Confidence(f64),
    #[error("--margin {0}: give a share above 0 and below 0.5 (0.01 is ±1 percentile point)")]
    Margin(f64),
    #[error(
        "--slo {metric} with --margin {margin}: p + margin = {sum} is above 1, so no sample bounds the {metric} from above and no probe could pass; give --margin at most {max}"
    )]
    MarginTooWide {
        metric: String,
        margin: f64,
        sum: f64,
        max: f64,
    },
    #[error("--good-share-min {0}: give a share above 0 and at most 1 (0.95 is 95 %)")]
    GoodShare(f64),
    #[error("--budget-seconds {0}: give a number of seconds above 0")]
    Budget(f64),
    #[error(
        "--search-from {value}: give {what} of at least {min} and at most {max} (the search doubles from it)"
    )]
    From {
        value: f64,
        what: &'static str,
        min: f64,
        max: f64,
    },
}

/// `--slo`'s value: comma-separated bounds, each quantity and percentile at most once.
pub(crate) fn parse_slos(text: &str) -> Result<Vec<SloBound>, SearchError> {
    let mut out: Vec<SloBound> = Vec::new();
    for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let slo = parse_item(item)?;
        if out
            .iter()
            .any(|o| o.quantity == slo.quantity && o.percentile == slo.percentile)
        {
            return Err(SearchError::Twice(slo.metric()));
        }
        out.push(slo);
    }
    if out.is_empty() {
        return Err(SearchError::NoSlo);
    }
    if out.len() > MAX_SLOS {
        return Err(SearchError::TooMany(out.len()));
    }
    Ok(out)
}

fn parse_item(item: &str) -> Result<SloBound, SearchError> {
    let bad = |why: &str| SearchError::Item {
        item: item.to_string(),
        why: why.to_string(),
    };
    let (metric, bound) = item
        .split_once("<=")
        .ok_or_else(|| bad("no '<=' between the metric and its bound"))?;
    let (q, p) = metric
        .trim()
        .split_once("_p")
        .ok_or_else(|| bad("the metric is not <quantity>_p<percentile>"))?;
    let quantity = match q {
        "ttft" => Quantity::Ttft,
        "tpot" => Quantity::Tpot,
        "e2e" => Quantity::E2e,
        _ => return Err(bad("the quantity is not ttft, tpot or e2e")),
    };
    let pct: f64 = p
        .parse()
        .map_err(|_| bad("the percentile is not a number"))?;
    if !(pct > 0.0 && pct < 100.0) {
        return Err(bad("the percentile is not above 0 and below 100"));
    }
    let bound = bound.trim();
    let (num, scale) = if let Some(n) = bound.strip_suffix("ms") {
        (n, 1e3)
    } else if let Some(n) = bound.strip_suffix("us") {
        (n, 1.0)
    } else if let Some(n) = bound.strip_suffix('s') {
        (n, 1e6)
    } else {
        return Err(bad("the bound has no unit (ms, s or us)"));
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| bad("the bound is not a number"))?;
    let us = (v * scale).round();
    if !(us >= 1.0 && us <= MAX_BOUND_US as f64) {
        return Err(bad("the bound is not from 1 us to 1 hour"));
    }
    Ok(SloBound {
        quantity,
        percentile: (pct / 100.0 * 1e9).round() / 1e9,
        bound_us: us as i64,
        text: format!("{}_p{p}<={bound}", quantity.as_str()),
    })
}

impl SearchSpec {
    /// Every flag checked together: each SLO's percentile bounded from above at the
    /// margin, the shares in range.
    pub(crate) fn check(self) -> Result<SearchSpec, SearchError> {
        if !(0.5..=0.9999).contains(&self.confidence) {
            return Err(SearchError::Confidence(self.confidence));
        }
        if !(self.margin > 0.0 && self.margin < 0.5) {
            return Err(SearchError::Margin(self.margin));
        }
        for s in &self.slos {
            // A rounding hair over 1 (0.99 + 0.01) is still the maximum's rank.
            if s.percentile + self.margin > 1.0 + 1e-9 {
                return Err(SearchError::MarginTooWide {
                    metric: s.metric(),
                    margin: self.margin,
                    sum: ((s.percentile + self.margin) * 1e6).round() / 1e6,
                    max: ((1.0 - s.percentile) * 1e6).round() / 1e6,
                });
            }
        }
        if let Some(g) = self.good_share_min
            && !(g > 0.0 && g <= 1.0)
        {
            return Err(SearchError::GoodShare(g));
        }
        let (what, min) = match self.kind {
            SearchKind::Concurrency => ("a concurrency", 1.0),
            SearchKind::Rate => ("a rate per second", 0.001),
        };
        let integral = self.kind == SearchKind::Rate || self.from.fract() == 0.0;
        if !(self.from >= min && self.from <= self.ceiling && integral) {
            return Err(SearchError::From {
                value: self.from,
                what,
                min,
                max: self.ceiling,
            });
        }
        Ok(self)
    }

    /// How many statements a probe's verdict rests on (Bonferroni): each SLO, and the
    /// good share when asked for.
    pub(crate) fn statements(&self) -> usize {
        self.slos.len() + usize::from(self.good_share_min.is_some())
    }

    /// The SLOs as given, comma-separated.
    pub(crate) fn slo_text(&self) -> String {
        self.slos
            .iter()
            .map(|s| s.text.as_str())
            .collect::<Vec<_>>()
            .join(",")
    }
}

#[cfg(test)]
impl SearchSpec {
    /// A search of `kind` for `slos` at 95 % and `margin`, from 1 with a ceiling of 4096.
    pub(crate) fn for_test(kind: SearchKind, slos: &str, margin: f64) -> SearchSpec {
        SearchSpec {
            kind,
            slos: parse_slos(slos).unwrap_or_default(),
            good_share_min: None,
            confidence: 0.95,
            margin,
            budget: None,
            from: 1.0,
            ceiling: 4096.0,
        }
    }
}

/// `--budget-seconds`, checked.
pub(crate) fn budget(seconds: Option<f64>) -> Result<Option<Duration>, SearchError> {
    match seconds {
        None => Ok(None),
        Some(s) if s > 0.0 && s < 1e9 => Ok(Some(Duration::from_secs_f64(s))),
        Some(s) => Err(SearchError::Budget(s)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(slos: &str, margin: f64) -> SearchSpec {
        SearchSpec::for_test(SearchKind::Concurrency, slos, margin)
    }

    #[test]
    fn the_issue_s_slo_list_parses_into_three_bounds() {
        let s = parse_slos("ttft_p99<=500ms,tpot_p50<=50ms,e2e_p95<=8s").unwrap();
        let got: Vec<(Quantity, f64, i64)> = s
            .iter()
            .map(|b| (b.quantity, b.percentile, b.bound_us))
            .collect();
        assert_eq!(
            got,
            vec![
                (Quantity::Ttft, 0.99, 500_000),
                (Quantity::Tpot, 0.50, 50_000),
                (Quantity::E2e, 0.95, 8_000_000)
            ]
        );
        assert_eq!(s[0].metric(), "ttft_p99");
        let fine = parse_slos(" e2e_p99.9 <= 1.5s , ttft_p50<=250us").unwrap();
        assert_eq!((fine[0].percentile, fine[0].bound_us), (0.999, 1_500_000));
        assert_eq!(fine[1].bound_us, 250);
    }

    #[test]
    fn a_bad_slo_item_is_named_with_the_fix() {
        for (text, says) in [
            ("ttft_p99<500ms", "no '<='"),
            ("ttft<=500ms", "<quantity>_p<percentile>"),
            ("itl_p99<=5ms", "not ttft, tpot or e2e"),
            ("ttft_p100<=5ms", "above 0 and below 100"),
            ("ttft_p99<=500", "no unit"),
            ("ttft_p99<=0ms", "from 1 us"),
            ("ttft_p99<=1ms,ttft_p99<=2ms", "twice"),
            ("", "needs --slo"),
        ] {
            let e = parse_slos(text).unwrap_err().to_string();
            assert!(e.contains(says), "{text}: {e}");
        }
    }

    #[test]
    fn a_margin_too_wide_for_a_tail_percentile_is_refused_with_the_widest_that_works() {
        let e = spec("ttft_p99<=500ms", 0.02)
            .check()
            .unwrap_err()
            .to_string();
        assert!(e.contains("give --margin at most 0.01"), "{e}");
        // p99 at ±1 point: the upper rank is the maximum, still a bound.
        assert!(spec("ttft_p99<=500ms", 0.01).check().is_ok());
        let mut s = spec("ttft_p50<=1s", 0.01);
        s.confidence = 0.4;
        assert!(s.check().unwrap_err().to_string().contains("--confidence"));
        let mut s = spec("ttft_p50<=1s", 0.01);
        s.from = 2.5;
        assert!(s.check().unwrap_err().to_string().contains("--search-from"));
    }
}
