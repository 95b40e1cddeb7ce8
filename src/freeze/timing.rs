//! `freeze --keep-timing`: the frozen plan becomes a trace plan (`load.mode "trace"`),
//! one entry per frozen exchange at its recorded start (the run's clock: serve's for live
//! traffic), naming the variant it froze as (repeats share one). Small traces sit in the
//! plan; larger ones go to a file beside it, pinned by its SHA-256.

use serde_json::{Map, Value, json};

use crate::config::trace::hex;

/// Entries a plan holds inline; a trace with more goes to a file beside it.
pub(crate) const INLINE_ENTRIES: usize = 10_000;

/// One frozen exchange's place on the recorded clock.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timed {
    pub(crate) start_offset_us: i64,
    pub(crate) exchange_id: i64,
    pub(crate) case: usize,
    pub(crate) variant: usize,
}

/// The bytes of the trace file a trace plan names.
#[derive(Debug)]
pub(crate) struct TraceFile {
    pub(crate) bytes: Vec<u8>,
}

/// What the plan's `load` becomes, with the trace file when the entries do not sit in the
/// plan, and a line for stderr.
#[derive(Debug)]
pub(crate) struct TraceLoad {
    pub(crate) load: Value,
    pub(crate) file: Option<TraceFile>,
    pub(crate) line: String,
}

/// The entries of `timed` (in start order; the first at offset 0) against the frozen
/// plan's cases (`cases`: its `cases` array, whose names and variant names the entries
/// name). `file`: the trace file's name when the entries are more than
/// [`INLINE_ENTRIES`] (`None`: refused, with the reason).
pub(crate) fn trace_load(
    mut timed: Vec<Timed>,
    cases: &[Value],
    file: Option<&str>,
) -> Result<TraceLoad, String> {
    timed.sort_by_key(|t| (t.start_offset_us, t.exchange_id));
    let zero = timed.first().map_or(0, |t| t.start_offset_us);
    let entries: Vec<Value> = timed
        .iter()
        .map(|t| {
            let case = &cases[t.case];
            let mut e = Map::new();
            e.insert("offset_us".into(), json!(t.start_offset_us - zero));
            e.insert("case".into(), case["name"].clone());
            if let Some(v) = case.get("variants").and_then(|v| v.get(t.variant)) {
                e.insert("variant".into(), v["name"].clone());
            }
            Value::Object(e)
        })
        .collect();
    let length = (timed.last().map_or(0, |t| t.start_offset_us) - zero) as f64 / 1e6;
    let mut load = Map::new();
    load.insert("mode".into(), json!("trace"));
    if entries.len() <= INLINE_ENTRIES {
        let line = format!(
            "trace: {} entries over {length:.3} s at their recorded starts, in the plan (load.trace.entries)",
            entries.len()
        );
        load.insert("trace".into(), json!({ "entries": entries }));
        return Ok(TraceLoad {
            load: Value::Object(load),
            file: None,
            line,
        });
    }
    let Some(name) = file else {
        return Err(format!(
            "--keep-timing: {} entries are more than a plan holds inline ({INLINE_ENTRIES}); give --out FILE, and the trace is written beside it",
            entries.len()
        ));
    };
    let mut bytes = Vec::new();
    for e in &entries {
        bytes.extend_from_slice(e.to_string().as_bytes());
        bytes.push(b'\n');
    }
    let sha = {
        use sha2::{Digest, Sha256};
        hex(&Sha256::digest(&bytes))
    };
    load.insert("trace".into(), json!({ "file": name, "sha256": sha }));
    Ok(TraceLoad {
        load: Value::Object(load),
        line: format!(
            "trace: {} entries over {length:.3} s at their recorded starts, in {name} (beside the plan, pinned by its SHA-256)",
            entries.len()
        ),
        file: Some(TraceFile { bytes }),
    })
}

/// The frozen plan as a trace plan: no closed-loop budget (`concurrency`,
/// `requests_per_case`, `warmup_per_case`), and `load` after `timeout_seconds`.
pub(crate) fn as_trace_plan(plan: Map<String, Value>, load: Value) -> Map<String, Value> {
    let mut out = Map::new();
    for (k, v) in plan {
        if matches!(
            k.as_str(),
            "concurrency" | "requests_per_case" | "warmup_per_case"
        ) {
            continue;
        }
        let after = k == "timeout_seconds";
        out.insert(k, v);
        if after {
            out.insert("load".into(), load.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timed(n: usize) -> Vec<Timed> {
        // Recorded out of order (completion order): entries come out in start order.
        (0..n)
            .rev()
            .map(|i| Timed {
                start_offset_us: 1_000 + i as i64 * 10,
                exchange_id: i as i64,
                case: i % 2,
                variant: 0,
            })
            .collect()
    }

    #[test]
    fn small_traces_sit_in_the_plan_and_large_ones_in_a_file_beside_it() {
        let cases = vec![
            json!({"name": "a"}),
            json!({"name": "b", "variants": [{"name": "v1"}]}),
        ];
        let t = trace_load(timed(3), &cases, None).unwrap();
        assert!(t.file.is_none());
        assert_eq!(
            t.load["trace"]["entries"],
            json!([{"offset_us": 0, "case": "a"},
                   {"offset_us": 10, "case": "b", "variant": "v1"},
                   {"offset_us": 20, "case": "a"}])
        );
        // Past INLINE_ENTRIES: a file, pinned by its hash; refused without a name for it.
        let many = INLINE_ENTRIES + 1;
        let err = trace_load(timed(many), &cases, None).unwrap_err();
        assert!(err.contains("give --out FILE"), "{err}");
        let t = trace_load(timed(many), &cases, Some("x.trace.jsonl")).unwrap();
        let bytes = t.file.unwrap().bytes;
        assert_eq!(bytes.iter().filter(|&&b| b == b'\n').count(), many);
        use sha2::{Digest, Sha256};
        assert_eq!(
            t.load["trace"],
            json!({"file": "x.trace.jsonl", "sha256": hex(&Sha256::digest(&bytes))})
        );
        // The trace plan: no closed-loop budget, `load` after `timeout_seconds`.
        let mut plan = Map::new();
        for k in [
            "endpoint",
            "concurrency",
            "requests_per_case",
            "repetitions",
            "warmup_per_case",
            "timeout_seconds",
            "metadata",
        ] {
            plan.insert(k.into(), json!(1));
        }
        let keys: Vec<String> = as_trace_plan(plan, json!({})).keys().cloned().collect();
        assert_eq!(
            keys,
            [
                "endpoint",
                "repetitions",
                "timeout_seconds",
                "load",
                "metadata"
            ]
        );
    }
}
