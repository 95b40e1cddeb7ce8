//! Pre-registered contracts (`contract.json`): thresholds written down before anyone saw
//! the numbers, locked at a UTC instant by someone, for one plan. Validated like a plan
//! (every problem at once, each with its path); evaluated by `report::verdict`.

use serde_json::{Map, Value};

use super::json::{PlanError, Problem, Validator, join, read_document};
use crate::oracle::json_kind;

/// The newest contract version this build reads (1 is read too, and means what it always
/// meant).
pub(crate) const CONTRACT_VERSION: u64 = 2;

/// A v2 floor-relative gate reads a floor, and an arm's drift, measured on at least this
/// many distinct requests (case, variant) at the level: repeats of one prompt are not
/// independent evidence, so 3 prompts x 15 pairs of repetitions count 3. Fewer make the
/// gate inconclusive, never a pass.
pub(crate) const MIN_DISTINCT_REQUESTS: u64 = 30;

/// What a fit arm's similarity must reach under v2 unless the contract says otherwise, and
/// what a v1 verdict warns below.
pub(crate) const FIT_SIMILARITY_DEFAULT: f64 = 0.5;

/// The gates' thresholds (each optional in the file, with these defaults); verdict.json
/// records them with these keys. The fields after `min_decode_ratio` exist only in
/// version 2 contracts (absent from a v1 verdict's record).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub(crate) struct Thresholds {
    /// Every non-reference quality-lane arm's exact-match rate must be at least this.
    /// `None`: not applied (v2, when only floor-relative quality gates are written).
    pub(crate) quality_min_exact_match: Option<f64>,
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
    /// v2: a quality arm's exact-match rate must be at least the reference's floor minus
    /// this, at every level.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) quality_max_exact_match_drop_vs_floor: Option<f64>,
    /// v2: a quality arm's mean similarity must be at least this x the floor's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) quality_min_similarity_vs_floor: Option<f64>,
    /// v2: the exact McNemar p-value of a quality arm's judged answers against the
    /// reference's must be at least this (no difference shown).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) quality_min_mcnemar_p: Option<f64>,
    /// v2: a fit arm's mean similarity to the reference must be at least this.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) fit_min_mean_similarity: Option<f64>,
    /// v2: a fit arm's exact-match rate against the reference must be at least this.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) fit_min_exact_match: Option<f64>,
    /// v2: a speed or latency ratio gate passes only when its whole bootstrap interval
    /// is past the threshold (`None`: v1's point rule).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) require_interval: Option<bool>,
    /// v2: every arm's validity per contract oracle kind (valid distinct requests /
    /// judged) must be at least this: fails when its 95 % interval lies below, passes when
    /// it lies at or above.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) min_valid_rate: Option<f64>,
    /// v2: an arm's validity may fall at most this far below the reference's, paired over
    /// the distinct requests both judged.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) valid_rate_floor_delta: Option<f64>,
    /// v2: a fit arm's operating point (`replay --search`) over the reference's, per case:
    /// with each knee bracketed between its last pass and first fail, the ratio lies in
    /// [pass_arm / fail_ref, fail_arm / pass_ref]; passes when that whole range is at or
    /// above this, fails when it lies below.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) min_capacity_ratio: Option<f64>,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            quality_min_exact_match: Some(1.0),
            max_failed_requests: 0,
            fit_min_memory_reduction: 0.25,
            fit_min_decode_speedup: 0.10,
            max_p95_latency_ratio: 1.10,
            min_decode_ratio: 1.0,
            quality_max_exact_match_drop_vs_floor: None,
            quality_min_similarity_vs_floor: None,
            quality_min_mcnemar_p: None,
            fit_min_mean_similarity: None,
            fit_min_exact_match: None,
            require_interval: None,
            min_valid_rate: None,
            valid_rate_floor_delta: None,
            min_capacity_ratio: None,
        }
    }
}

impl Thresholds {
    /// Version 2's defaults: the v1 values, a fit arm's similarity floor, intervals
    /// required.
    pub(crate) fn v2() -> Thresholds {
        Thresholds {
            fit_min_mean_similarity: Some(FIT_SIMILARITY_DEFAULT),
            require_interval: Some(true),
            ..Thresholds::default()
        }
    }

    /// The contract version these thresholds came from: only v2 sets `require_interval`.
    pub(crate) fn version(&self) -> u64 {
        if self.require_interval.is_some() {
            2
        } else {
            1
        }
    }

    /// Whether a ratio gate reads its interval (v2's default) rather than its point.
    pub(crate) fn interval_required(&self) -> bool {
        self.require_interval == Some(true)
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

/// Where a fractional threshold is written: a field of v1 and v2, or of v2 only.
enum Field {
    Both(fn(&mut Thresholds) -> &mut f64),
    V2(fn(&mut Thresholds) -> &mut Option<f64>),
}

/// (name, lowest, lowest allowed?, highest, the field it sets) for each fractional
/// threshold.
type Range = (&'static str, f64, bool, f64, Field);
const RANGES: &[Range] = &[
    (
        "quality_min_exact_match",
        0.0,
        true,
        1.0,
        // Both versions; an Option only because v2 may leave it unapplied.
        Field::V2(|t| &mut t.quality_min_exact_match),
    ),
    (
        "fit_min_memory_reduction",
        0.0,
        true,
        1.0,
        Field::Both(|t| &mut t.fit_min_memory_reduction),
    ),
    (
        "fit_min_decode_speedup",
        0.0,
        true,
        f64::MAX,
        Field::Both(|t| &mut t.fit_min_decode_speedup),
    ),
    (
        "max_p95_latency_ratio",
        0.0,
        false,
        f64::MAX,
        Field::Both(|t| &mut t.max_p95_latency_ratio),
    ),
    (
        "min_decode_ratio",
        0.0,
        true,
        f64::MAX,
        Field::Both(|t| &mut t.min_decode_ratio),
    ),
    (
        "quality_max_exact_match_drop_vs_floor",
        0.0,
        true,
        1.0,
        Field::V2(|t| &mut t.quality_max_exact_match_drop_vs_floor),
    ),
    (
        "quality_min_similarity_vs_floor",
        0.0,
        true,
        1.0,
        Field::V2(|t| &mut t.quality_min_similarity_vs_floor),
    ),
    (
        "quality_min_mcnemar_p",
        0.0,
        true,
        1.0,
        Field::V2(|t| &mut t.quality_min_mcnemar_p),
    ),
    (
        "fit_min_mean_similarity",
        0.0,
        true,
        1.0,
        Field::V2(|t| &mut t.fit_min_mean_similarity),
    ),
    (
        "fit_min_exact_match",
        0.0,
        true,
        1.0,
        Field::V2(|t| &mut t.fit_min_exact_match),
    ),
    (
        "min_valid_rate",
        0.0,
        true,
        1.0,
        Field::V2(|t| &mut t.min_valid_rate),
    ),
    (
        "valid_rate_floor_delta",
        0.0,
        true,
        1.0,
        Field::V2(|t| &mut t.valid_rate_floor_delta),
    ),
    (
        "min_capacity_ratio",
        0.0,
        false,
        f64::MAX,
        Field::V2(|t| &mut t.min_capacity_ratio),
    ),
];

/// Thresholds that only a version 2 contract may write.
const V2_ONLY: &[&str] = &[
    "quality_max_exact_match_drop_vs_floor",
    "quality_min_similarity_vs_floor",
    "quality_min_mcnemar_p",
    "fit_min_mean_similarity",
    "fit_min_exact_match",
    "require_interval",
    "min_valid_rate",
    "valid_rate_floor_delta",
    "min_capacity_ratio",
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

/// A version 2 contract for the plan named `plan_id`, every threshold that has a default
/// written out with it (the ones "not applied" by default are left out: written, they
/// apply), and unlocked: no `locked_at` or `locked_by` until [`lock`] stamps them.
pub(crate) fn unlocked_v2(plan_id: &str, reference: &str) -> Value {
    let thresholds = serde_json::to_value(Thresholds::v2()).unwrap_or(Value::Null);
    serde_json::json!({
        "contract_version": CONTRACT_VERSION,
        "plan_id": plan_id,
        "thresholds": thresholds,
        "baseline": format!("the reference arm '{reference}'"),
        "stop_condition": "the whole plan, once",
    })
}

/// Why a contract cannot be locked.
#[derive(Debug)]
pub(crate) enum LockRefusal {
    /// It already has `locked_at` or `locked_by`: the message says when and by whom.
    Locked(String),
    /// The stamped contract does not validate (every problem with its path).
    Invalid(PlanError),
}

/// The contract `bytes` with `locked_at` and `locked_by` stamped right after
/// `contract_version` (every other key kept, in its order), pretty-printed with a final
/// newline, and the contract it validates as. A contract that has either already is
/// refused; so is one that does not validate once stamped.
pub(crate) fn lock(
    bytes: &[u8],
    locked_at: &str,
    locked_by: &str,
) -> Result<(Vec<u8>, Contract), LockRefusal> {
    let root = read_document(bytes, "contract").map_err(LockRefusal::Invalid)?;
    let top = match root {
        Value::Object(top) => top,
        other => {
            return Err(LockRefusal::Invalid(PlanError {
                problems: vec![Problem {
                    path: String::new(),
                    message: format!(
                        "must be a JSON object (contract_version, plan_id, thresholds, ...), found {}",
                        json_kind(&other)
                    ),
                }],
            }));
        }
    };
    if top.contains_key("locked_at") || top.contains_key("locked_by") {
        let said = |k: &str| match top.get(k) {
            Some(Value::String(s)) => format!("'{s}'"),
            Some(other) => other.to_string(),
            None => "nobody said".to_string(),
        };
        return Err(LockRefusal::Locked(format!(
            "already locked: locked_at {}, locked_by {}; a locked contract is not stamped again (to change its thresholds before any run used it, remove locked_at and locked_by, edit, and lock it again)",
            said("locked_at"),
            said("locked_by")
        )));
    }
    let stamp = |m: &mut Map<String, Value>| {
        m.insert("locked_at".into(), Value::from(locked_at));
        m.insert("locked_by".into(), Value::from(locked_by));
    };
    let mut out = Map::new();
    if !top.contains_key("contract_version") {
        stamp(&mut out);
    }
    for (k, val) in top {
        let version = k == "contract_version";
        out.insert(k, val);
        if version {
            stamp(&mut out);
        }
    }
    let mut bytes = serde_json::to_vec_pretty(&Value::Object(out)).unwrap_or_default();
    bytes.push(b'\n');
    let c = Contract::from_json_bytes(&bytes, String::new()).map_err(LockRefusal::Invalid)?;
    Ok((bytes, c))
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
        "1 or 2, the contract format this file follows",
    )
    .and_then(|x| v.integer(x, "contract_version", 1))
    .and_then(|n| {
        if (1..=CONTRACT_VERSION).contains(&(n as u64)) {
            Some(n as u64)
        } else {
            v.err(
                "contract_version",
                format!("{n} is not a version this build reads; write 1 or {CONTRACT_VERSION}"),
            );
            None
        }
    });
    let locked_at = required(
        v,
        "locked_at",
        "when the thresholds were fixed, in RFC 3339 with a zone, e.g. \"2026-11-30T09:00:00Z\"; an unlocked contract is locked once its thresholds are final with `matrix-proxy plan lock FILE --by NAME`",
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
    let locked_by = required(
        v,
        "locked_by",
        "who fixed the thresholds (`matrix-proxy plan lock FILE --by NAME` stamps it)",
    )
    .and_then(|x| v.nonblank(x, "locked_by"))
    .map(str::to_string);
    let plan_id = required(v, "plan_id", "the `name` of the plan the contract is for")
        .and_then(|x| v.nonblank(x, "plan_id"))
        .map(str::to_string);
    let empty = Map::new();
    let thresholds = match top.get("thresholds") {
        None => Some(&empty),
        Some(t) => v.object(t, "thresholds"),
    }
    .and_then(|m| thresholds(v, m, version.unwrap_or(CONTRACT_VERSION)));
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

fn thresholds(v: &mut Validator, m: &Map<String, Value>, version: u64) -> Option<Thresholds> {
    let known: Vec<&str> = RANGES
        .iter()
        .map(|r| r.0)
        .chain(["max_failed_requests", "require_interval"])
        .collect();
    v.unknown_fields(m, "thresholds", &[&known]);
    let mut ok = true;
    if version < 2 {
        for name in V2_ONLY.iter().filter(|n| m.contains_key(**n)) {
            v.err(
                join("thresholds", name),
                "exists only in contract_version 2: write \"contract_version\": 2 to use it (a version 1 contract keeps v1's rules)",
            );
            ok = false;
        }
    }
    let mut t = if version >= 2 {
        Thresholds::v2()
    } else {
        Thresholds::default()
    };
    if let Some(x) = m.get("max_failed_requests") {
        match v.integer(x, "thresholds.max_failed_requests", 0) {
            Some(n) => t.max_failed_requests = n as u64,
            None => ok = false,
        }
    }
    if let Some(x) = m.get("require_interval") {
        match x.as_bool() {
            Some(b) => t.require_interval = Some(b),
            None => {
                v.err(
                    "thresholds.require_interval",
                    format!("must be true or false, found {x}"),
                );
                ok = false;
            }
        }
    }
    for (name, lo, lo_ok, hi, field) in RANGES {
        let Some(x) = m.get(*name) else { continue };
        let path = join("thresholds", name);
        let Some(f) = x.as_f64().filter(|f| x.is_number() && f.is_finite()) else {
            v.err(&path, format!("must be a finite number, found {x}"));
            ok = false;
            continue;
        };
        let above = if *lo_ok { f >= *lo } else { f > *lo };
        if !above || f > *hi {
            let range = match (*lo_ok, *hi == f64::MAX) {
                (true, true) => format!(">= {lo}"),
                (false, true) => format!("> {lo}"),
                (true, false) => format!("between {lo} and {hi}"),
                (false, false) => format!("> {lo} and <= {hi}"),
            };
            v.err(&path, format!("must be {range}, found {f}"));
            ok = false;
            continue;
        }
        match field {
            Field::Both(set) => *set(&mut t) = f,
            Field::V2(set) => *set(&mut t) = Some(f),
        }
    }
    // Version 2 applies the absolute exact-match gate when it is written, or when no
    // floor-relative quality gate is (then its default, as in v1).
    let relative = [
        "quality_max_exact_match_drop_vs_floor",
        "quality_min_similarity_vs_floor",
    ];
    if version >= 2
        && !m.contains_key("quality_min_exact_match")
        && relative.iter().any(|k| m.contains_key(*k))
    {
        t.quality_min_exact_match = None;
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
            r#"{"contract_version": 3, "locked_at": "yesterday", "plan_id": " ",
                "thresholds": {"quality_min_exact_match": 1.5, "max_failed_requests": -1,
                               "max_p95_latency_ratio": 0, "fit_min_speedup": 0.1},
                "extra": 1}"#,
        );
        let want = [
            "extra: unknown field",
            "contract_version: 3 is not a version this build reads; write 1 or 2",
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

    #[test]
    fn an_unlocked_contract_is_refused_until_lock_stamps_it() {
        let doc = unlocked_v2("p", "ref");
        let bytes = serde_json::to_vec_pretty(&doc).unwrap();
        let got = problems(std::str::from_utf8(&bytes).unwrap());
        assert_eq!(got.len(), 2, "{got:#?}");
        assert!(
            got[0].starts_with("locked_at: is required") && got[0].contains("plan lock"),
            "{got:#?}"
        );
        assert!(got[1].starts_with("locked_by: is required"), "{got:#?}");
        // Every threshold with a default is written out with it.
        let t = doc["thresholds"].as_object().unwrap();
        assert_eq!(t.len(), 8, "{t:?}");
        assert_eq!(t["require_interval"], Value::Bool(true));
        assert_eq!(t["fit_min_mean_similarity"], serde_json::json!(0.5));
        let (stamped, c) = lock(&bytes, "2026-12-01T09:00:00Z", "ana").expect("locks");
        assert_eq!((c.version, c.thresholds), (2, Thresholds::v2()));
        assert_eq!((c.plan_id.as_str(), c.locked_by.as_str()), ("p", "ana"));
        let v: Value = serde_json::from_slice(&stamped).unwrap();
        let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "contract_version",
                "locked_at",
                "locked_by",
                "plan_id",
                "thresholds",
                "baseline",
                "stop_condition"
            ]
        );
        match lock(&stamped, "2026-12-02T09:00:00Z", "bo") {
            Err(LockRefusal::Locked(m)) => assert!(
                m.contains("'2026-12-01T09:00:00Z'") && m.contains("'ana'"),
                "{m}"
            ),
            other => panic!("{other:?}"),
        }
        let mut bad = doc.clone();
        bad["thresholds"]["min_decode_ratio"] = serde_json::json!(-1);
        match lock(
            &serde_json::to_vec(&bad).unwrap(),
            "2026-12-01T09:00:00Z",
            "ana",
        ) {
            Err(LockRefusal::Invalid(e)) => assert!(
                e.to_string()
                    .contains("thresholds.min_decode_ratio: must be >= 0, found -1"),
                "{e}"
            ),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            lock(b"[1]", "2026-12-01T09:00:00Z", "ana"),
            Err(LockRefusal::Invalid(_))
        ));
    }

    fn contract(version: u64, thresholds: &str) -> Result<Contract, Vec<String>> {
        let text = format!(
            r#"{{"contract_version": {version}, "locked_at": "2026-12-01T09:00:00Z",
                 "locked_by": "ana", "plan_id": "p", "thresholds": {thresholds}}}"#
        );
        Contract::from_json_bytes(text.as_bytes(), String::new())
            .map_err(|e| e.problems.iter().map(ToString::to_string).collect())
    }

    #[test]
    fn version_2_fields_are_refused_in_version_1_and_take_their_defaults_in_2() {
        let got = contract(
            1,
            r#"{"quality_max_exact_match_drop_vs_floor": 0.05, "require_interval": true}"#,
        )
        .expect_err("v2 fields in v1");
        assert_eq!(got.len(), 2, "{got:#?}");
        assert!(
            got.iter()
                .all(|g| g.contains("exists only in contract_version 2")),
            "{got:#?}"
        );
        assert!(got[0].starts_with("thresholds.quality_max_exact_match_drop_vs_floor"));
        // v1 keeps its rules: the absolute gate, no interval, no fit similarity.
        let v1 = contract(1, "{}").expect("v1").thresholds;
        assert_eq!(v1, Thresholds::default());
        assert!(!v1.interval_required());
        // v2 with nothing written: v1's values, intervals required, fit similarity 0.5.
        let v2 = contract(2, "{}").expect("v2").thresholds;
        assert_eq!(v2.quality_min_exact_match, Some(1.0));
        assert_eq!(v2.fit_min_mean_similarity, Some(FIT_SIMILARITY_DEFAULT));
        assert!(v2.interval_required());
        // A relative quality gate alone: the absolute one is not applied ...
        let rel = contract(2, r#"{"quality_max_exact_match_drop_vs_floor": 0.02}"#)
            .expect("v2")
            .thresholds;
        assert_eq!(rel.quality_min_exact_match, None);
        assert_eq!(rel.quality_max_exact_match_drop_vs_floor, Some(0.02));
        // ... unless it is written too.
        let both = contract(
            2,
            r#"{"quality_max_exact_match_drop_vs_floor": 0.02, "quality_min_exact_match": 0.5,
                "require_interval": false, "quality_min_mcnemar_p": 0.05}"#,
        )
        .expect("v2")
        .thresholds;
        assert_eq!(both.quality_min_exact_match, Some(0.5));
        assert!(!both.interval_required());
        assert_eq!(both.quality_min_mcnemar_p, Some(0.05));
        let bad = contract(
            2,
            r#"{"require_interval": 1, "fit_min_mean_similarity": 2}"#,
        )
        .expect_err("bad values");
        assert_eq!(bad.len(), 2, "{bad:#?}");
    }
}
