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
