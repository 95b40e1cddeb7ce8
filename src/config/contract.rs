//! Pre-registered contracts (`contract.json`): thresholds written down before anyone saw
//! the numbers, locked at a UTC instant by someone, for one plan. Validated like a plan
//! (every problem at once, each with its path); evaluated by `report::verdict`.

use serde_json::{Map, Value};

use super::json::{PlanError, Validator, join, read_document};

/// The contract versions this build reads.
pub(crate) const CONTRACT_VERSION: u64 = 1;

/// The gates' thresholds (each optional in the file, with these defaults); verdict.json
/// records them with these keys.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub(crate) struct Thresholds {
    /// Every non-reference quality-lane arm's exact-match rate must be at least this.
    pub(crate) quality_min_exact_match: f64,
    /// An arm's failed requests (every level summed) must be at most this.
    pub(crate) max_failed_requests: u64,
    /// A fit arm's peak memory must be at most (1 - this) x the reference's.
    pub(crate) fit_min_memory_reduction: f64,
    /// A fit arm's decode tok/s must be at least (1 + this) x the reference's.
    pub(crate) fit_min_decode_speedup: f64,
    /// A fit arm's latency p95 must be at most this x the reference's.
    pub(crate) max_p95_latency_ratio: f64,
    /// A fit arm's decode tok/s must be at least this x the reference's.
    pub(crate) min_decode_ratio: f64,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            quality_min_exact_match: 1.0,
            max_failed_requests: 0,
            fit_min_memory_reduction: 0.25,
            fit_min_decode_speedup: 0.10,
            max_p95_latency_ratio: 1.10,
            min_decode_ratio: 1.0,
        }
    }
}

/// A validated contract.
#[derive(Debug, Clone)]
pub(crate) struct Contract {
    pub(crate) version: u64,
    /// `locked_at` as written.
    pub(crate) locked_at: String,
    /// `locked_at` in microseconds since the Unix epoch (UTC).
    pub(crate) locked_at_us: i64,
    pub(crate) locked_by: String,
    pub(crate) plan_id: String,
    pub(crate) thresholds: Thresholds,
    /// Free-form, recorded as written (`null` when absent).
    pub(crate) baseline: Value,
    /// Free-form, recorded as written (`null` when absent).
    pub(crate) stop_condition: Value,
    /// SHA-256 of the file's bytes.
    pub(crate) sha256: String,
}

const FIELDS: &[&str] = &[
    "contract_version",
    "locked_at",
    "locked_by",
    "plan_id",
    "thresholds",
    "baseline",
    "stop_condition",
];

/// (name, lowest, lowest allowed?, highest, the field it sets) for each fractional
/// threshold.
type Range = (
    &'static str,
    f64,
    bool,
    f64,
    fn(&mut Thresholds) -> &mut f64,
);
const RANGES: &[Range] = &[
    ("quality_min_exact_match", 0.0, true, 1.0, |t| {
        &mut t.quality_min_exact_match
    }),
    ("fit_min_memory_reduction", 0.0, true, 1.0, |t| {
        &mut t.fit_min_memory_reduction
    }),
    ("fit_min_decode_speedup", 0.0, true, f64::MAX, |t| {
        &mut t.fit_min_decode_speedup
    }),
    ("max_p95_latency_ratio", 0.0, false, f64::MAX, |t| {
        &mut t.max_p95_latency_ratio
    }),
    ("min_decode_ratio", 0.0, true, f64::MAX, |t| {
        &mut t.min_decode_ratio
    }),
];

impl Contract {
    /// Parse and validate a contract's bytes, whose SHA-256 (hex) the caller computed.
    /// `Err` carries every problem found.
    pub(crate) fn from_json_bytes(bytes: &[u8], sha256: String) -> Result<Contract, PlanError> {
        let root = read_document(bytes, "contract")?;
        let mut v = Validator::default();
        let c = contract(&mut v, &root, sha256);
        v.finish(c)
    }
}

fn contract(v: &mut Validator, root: &Value, sha256: String) -> Option<Contract> {
    let top = v.object(root, "")?;
    v.unknown_fields(top, "", &[FIELDS]);
    let required = |v: &mut Validator, key: &str, what: &str| {
        let got = top.get(key);
        if got.is_none() {
            v.err(key, format!("is required: {what}"));
        }
        got
    };
    let version = required(
        v,
        "contract_version",
        "1, the contract format this file follows",
    )
    .and_then(|x| v.integer(x, "contract_version", 1))
    .and_then(|n| {
        if n as u64 == CONTRACT_VERSION {
            Some(n as u64)
        } else {
            v.err(
                "contract_version",
                format!("{n} is not a version this build reads; write {CONTRACT_VERSION}"),
            );
            None
        }
    });
    let locked_at = required(
        v,
        "locked_at",
        "when the thresholds were fixed, in RFC 3339 with a zone, e.g. \"2026-11-30T09:00:00Z\"",
    )
    .and_then(|x| v.nonblank(x, "locked_at"))
    .and_then(|s| match crate::clock::parse_rfc3339_us(s) {
        Ok(us) => Some((s.to_string(), us)),
        Err(e) => {
            v.err(
                "locked_at",
                format!("'{s}' is not an RFC 3339 time with a zone ({e}); write e.g. \"2026-11-30T09:00:00Z\""),
            );
            None
        }
    });
    let locked_by = required(v, "locked_by", "who fixed the thresholds")
        .and_then(|x| v.nonblank(x, "locked_by"))
        .map(str::to_string);
    let plan_id = required(v, "plan_id", "the `name` of the plan the contract is for")
        .and_then(|x| v.nonblank(x, "plan_id"))
        .map(str::to_string);
    let thresholds = match top.get("thresholds") {
        None => Some(Thresholds::default()),
        Some(t) => v.object(t, "thresholds").and_then(|m| thresholds(v, m)),
    };
    let (locked_at, locked_at_us) = locked_at?;
    Some(Contract {
        version: version?,
        locked_at,
        locked_at_us,
        locked_by: locked_by?,
        plan_id: plan_id?,
        thresholds: thresholds?,
        baseline: top.get("baseline").cloned().unwrap_or(Value::Null),
        stop_condition: top.get("stop_condition").cloned().unwrap_or(Value::Null),
        sha256,
    })
}

fn thresholds(v: &mut Validator, m: &Map<String, Value>) -> Option<Thresholds> {
    let known: Vec<&str> = RANGES
        .iter()
        .map(|r| r.0)
        .chain(["max_failed_requests"])
        .collect();
    v.unknown_fields(m, "thresholds", &[&known]);
    let mut t = Thresholds::default();
    let mut ok = true;
    if let Some(x) = m.get("max_failed_requests") {
        match v.integer(x, "thresholds.max_failed_requests", 0) {
            Some(n) => t.max_failed_requests = n as u64,
            None => ok = false,
        }
    }
    for &(name, lo, lo_ok, hi, field) in RANGES {
        let Some(x) = m.get(name) else { continue };
        let path = join("thresholds", name);
        let Some(f) = x.as_f64().filter(|f| x.is_number() && f.is_finite()) else {
            v.err(&path, format!("must be a finite number, found {x}"));
            ok = false;
            continue;
        };
        let above = if lo_ok { f >= lo } else { f > lo };
        if !above || f > hi {
            let range = match (lo_ok, hi == f64::MAX) {
                (true, true) => format!(">= {lo}"),
                (false, true) => format!("> {lo}"),
                (true, false) => format!("between {lo} and {hi}"),
                (false, false) => format!("> {lo} and <= {hi}"),
            };
            v.err(&path, format!("must be {range}, found {f}"));
            ok = false;
            continue;
        }
        *field(&mut t) = f;
    }
    ok.then_some(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problems(text: &str) -> Vec<String> {
        match Contract::from_json_bytes(text.as_bytes(), String::new()) {
            Ok(_) => Vec::new(),
            Err(e) => e.problems.iter().map(ToString::to_string).collect(),
        }
    }

    #[test]
    fn a_minimal_contract_takes_every_default() {
        let c = Contract::from_json_bytes(
            br#"{"contract_version": 1, "locked_at": "2026-11-30T10:00:00+01:00",
                 "locked_by": "ana", "plan_id": "q4-vs-bf16"}"#,
            "h".into(),
        )
        .expect("valid");
        assert_eq!(c.thresholds, Thresholds::default());
        // 10:00 at +01:00 is 09:00 UTC.
        assert_eq!(
            crate::clock::iso_utc(c.locked_at_us),
            "2026-11-30T09:00:00.000000Z"
        );
        assert_eq!((c.baseline, c.stop_condition), (Value::Null, Value::Null));
        assert_eq!(c.sha256, "h");
    }

    #[test]
    fn every_problem_is_named_with_its_path() {
        let got = problems(
            r#"{"contract_version": 2, "locked_at": "yesterday", "plan_id": " ",
                "thresholds": {"quality_min_exact_match": 1.5, "max_failed_requests": -1,
                               "max_p95_latency_ratio": 0, "fit_min_speedup": 0.1},
                "extra": 1}"#,
        );
        let want = [
            "extra: unknown field",
            "contract_version: 2 is not a version this build reads; write 1",
            "locked_at: 'yesterday' is not an RFC 3339 time with a zone",
            "locked_by: is required: who fixed the thresholds",
            "plan_id: must not be blank",
            "thresholds.fit_min_speedup: unknown field",
            "thresholds.max_failed_requests: must be an integer >= 0, found -1",
            "thresholds.quality_min_exact_match: must be between 0 and 1, found 1.5",
            "thresholds.max_p95_latency_ratio: must be > 0, found 0",
        ];
        for w in want {
            assert!(
                got.iter().any(|g| g.starts_with(w)),
                "{w:?} not in {got:#?}"
            );
        }
        assert_eq!(got.len(), want.len(), "{got:#?}");
        assert_eq!(
            problems(r#"{"contract_version": 1, "contract_version": 1}"#).len(),
            1,
            "a repeated key is refused before anything else"
        );
    }
}
