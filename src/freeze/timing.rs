//! `freeze --keep-timing`: the frozen plan becomes a trace plan (`load.mode "trace"`),
//! one entry per frozen exchange at its recorded start (the run's clock: serve's for live
//! traffic), naming the variant it froze as (repeats share one). Small traces sit in the
//! plan; larger ones go to a file beside it, pinned by its SHA-256.
//!
//! A case whose chats continue one another is frozen as sessions here too
//! ([`timed_sessions`]) when the capture's order fits a trace of sessions: each exchange's
//! entry names its turn (`<session id>/<k>`), so a run of the session starts at its first
//! request's start and every later turn keeps its recorded start as its offset.

use serde::Serialize;
use serde_json::{Map, Value};

use super::collect::Case;
use super::sessions::Chains;
use super::write::{case_names, session_ids, variant_names};
use crate::record::rundir::sha256_hex;

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

/// One entry of the trace (trace format v1), as the plan or the file holds it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Entry {
    pub(crate) offset_us: i64,
    pub(crate) case: String,
    /// The variant's name, when the case has a `variants` list.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) variant: Option<String>,
}

/// Where the entries are: `load.trace` of the plan.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub(crate) enum Where {
    Inline { entries: Vec<Entry> },
    File { file: String, sha256: String },
}

/// The trace plan's `load`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Load {
    mode: &'static str,
    pub(crate) trace: Where,
}

/// What the plan's `load` becomes, with the trace file when the entries do not sit in the
/// plan, and a line for stderr.
#[derive(Debug)]
pub(crate) struct TraceLoad {
    pub(crate) load: Load,
    pub(crate) file: Option<TraceFile>,
    pub(crate) line: String,
}

/// Entries past [`INLINE_ENTRIES`] and no file to write them to (no `--out`).
#[derive(Debug, thiserror::Error)]
#[error(
    "--keep-timing: {entries} entries are more than a plan holds inline ({INLINE_ENTRIES}); give --out FILE, and the trace is written beside it"
)]
pub(crate) struct NeedsFile {
    pub(crate) entries: usize,
}

/// The entries of `timed` (in start order; the first at offset 0), named as the frozen
/// plan names `cases` and their variants (`write.rs`: a case with one variant has no
/// `variants` list). `file`: the trace file's name when the entries are more than
/// [`INLINE_ENTRIES`].
pub(crate) fn trace_load(
    mut timed: Vec<Timed>,
    cases: &[Case],
    chains: &[Option<Chains>],
    file: Option<&str>,
) -> Result<TraceLoad, NeedsFile> {
    sort(&mut timed);
    let zero = timed.first().map_or(0, |t| t.start_offset_us);
    let names = case_names(cases);
    // A case frozen as sessions names its variants by turn: `<session id>/<k>`.
    let variants: Vec<Option<Vec<String>>> = cases
        .iter()
        .zip(chains)
        .map(|(c, ch)| match ch.as_ref() {
            Some(ch) => turn_names(c, ch),
            None => (c.variants.len() > 1).then(|| variant_names(c)),
        })
        .collect();
    let entries: Vec<Entry> = timed
        .iter()
        .map(|t| Entry {
            offset_us: t.start_offset_us - zero,
            case: names[t.case].clone(),
            variant: variants[t.case].as_ref().map(|v| v[t.variant].clone()),
        })
        .collect();
    let n = entries.len();
    let length = (timed.last().map_or(0, |t| t.start_offset_us) - zero) as f64 / 1e6;
    if n <= INLINE_ENTRIES {
        return Ok(TraceLoad {
            load: Load {
                mode: "trace",
                trace: Where::Inline { entries },
            },
            file: None,
            line: format!(
                "trace: {n} entries over {length:.3} s at their recorded starts, in the plan (load.trace.entries)"
            ),
        });
    }
    let Some(name) = file else {
        return Err(NeedsFile { entries: n });
    };
    let mut bytes = Vec::new();
    for e in &entries {
        // An entry of strings and integers always serializes.
        let _ = serde_json::to_writer(&mut bytes, e);
        bytes.push(b'\n');
    }
    Ok(TraceLoad {
        load: Load {
            mode: "trace",
            trace: Where::File {
                file: name.to_string(),
                sha256: sha256_hex(&bytes),
            },
        },
        line: format!(
            "trace: {n} entries over {length:.3} s at their recorded starts, in {name} (beside the plan, pinned by its SHA-256)"
        ),
        file: Some(TraceFile { bytes }),
    })
}

/// Each variant's name in a case frozen as sessions: its turn, `<session id>/<k>`, the
/// ids as the plan writes them (`write::session_ids`). `None` when a conversation
/// branches ([`turns_of`]).
fn turn_names(c: &Case, ch: &Chains) -> Option<Vec<String>> {
    let ids = session_ids(c, ch);
    let turns = turns_of(c, ch)?;
    Some(
        turns
            .iter()
            .map(|&(s, k)| format!("{}/{}", ids[s], k + 1))
            .collect(),
    )
}

/// The capture's order: by start, ties by exchange id.
fn sort(timed: &mut [Timed]) {
    timed.sort_by_key(|t| (t.start_offset_us, t.exchange_id));
}

/// Where each variant of case `c`, frozen as `ch`, sits: (session, turn from 0), when
/// each variant is one turn of one session. `None` when a conversation branches (one
/// request continued two ways is a turn of two sessions, and its entry could not say
/// which run it starts or joins).
fn turns_of(c: &Case, ch: &Chains) -> Option<Vec<(usize, usize)>> {
    let mut out = vec![None; c.variants.len()];
    for (s, chain) in ch.sessions.iter().enumerate() {
        for (k, &v) in chain.iter().enumerate() {
            if out.get_mut(v)?.replace((s, k)).is_some() {
                return None;
            }
        }
    }
    out.into_iter().collect()
}

/// Whether case `case`'s exchanges in `timed` (in the capture's order) are whole runs of
/// its sessions (`turns`: each variant's session and turn): every turn after a turn 1 of
/// its session and right after the turn before it, every run to its last turn, so the
/// trace sends exactly the captured exchanges.
fn whole_runs(timed: &[Timed], case: usize, turns: &[(usize, usize)], ch: &Chains) -> bool {
    let mut open: std::collections::HashMap<usize, usize> = Default::default();
    for t in timed.iter().filter(|t| t.case == case) {
        let Some(&(s, k)) = turns.get(t.variant) else {
            return false;
        };
        let last = ch.sessions[s].len() - 1;
        match (k, open.get(&s)) {
            (0, Some(_)) => return false,
            (0, None) => {}
            (k, Some(&at)) if at + 1 == k => {}
            _ => return false,
        }
        if k == last {
            open.remove(&s);
        } else {
            open.insert(s, k);
        }
    }
    open.is_empty()
}

/// The cases `--keep-timing` freezes as sessions: those of `chains` whose conversations
/// do not branch and whose captured exchanges are whole runs in order
/// ([`whole_runs`]); any other keeps its requests as single entries, said in `lines`
/// (`names`: the cases' names in the plan).
pub(crate) fn timed_sessions(
    chains: Vec<Option<Chains>>,
    cases: &[Case],
    timed: &mut [Timed],
    names: &[String],
    lines: &mut Vec<String>,
) -> Vec<Option<Chains>> {
    sort(timed);
    let mut out = Vec::with_capacity(chains.len());
    for (ci, ch) in chains.into_iter().enumerate() {
        let Some(ch) = ch else {
            out.push(None);
            continue;
        };
        let why = match turns_of(&cases[ci], &ch) {
            None => Some("a conversation branches (one request continued two ways)"),
            Some(turns) if !whole_runs(timed, ci, &turns, &ch) => Some(
                "its captured requests are not whole conversations in order (a turn sent again, or a conversation left before its last turn)",
            ),
            Some(_) => None,
        };
        match why {
            Some(why) => {
                lines.push(format!(
                    "case '{}': its chats continue one another, but {why}: --keep-timing keeps its requests as single trace entries, not sessions",
                    names.get(ci).map_or("", String::as_str)
                ));
                out.push(None);
            }
            None => out.push(Some(ch)),
        }
    }
    out
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
    use std::collections::BTreeSet;

    use serde_json::json;

    use super::super::collect::{Answer, Body, CaseKey, Variant};
    use super::*;

    fn case(path: &str, variants: usize) -> Case {
        let v = |i: usize| Variant {
            body: Body::Json(json!({"p": i})),
            first: Answer::Json(json!({})),
            answers: 1,
            volatile: BTreeSet::new(),
            differed: 0,
            first_difference: None,
            prompt_tokens: None,
            source_name: None,
            session: None,
            called_tools: false,
            contract: None,
        };
        Case {
            key: CaseKey {
                method: "POST".into(),
                path: path.into(),
                content_type: None,
                headers: Vec::new(),
                status: 200,
            },
            variants: (0..variants).map(v).collect(),
        }
    }

    fn timed(n: usize) -> Vec<Timed> {
        // Recorded out of order (completion order): entries come out in start order.
        (0..n)
            .rev()
            .map(|i| Timed {
                start_offset_us: 1_000 + i as i64 * 10,
                exchange_id: i as i64,
                case: i % 2,
                variant: i % 2,
            })
            .collect()
    }

    #[test]
    fn a_case_of_sessions_is_timed_as_runs_only_when_the_capture_holds_whole_ones() {
        let c = case("/v1/chat", 3);
        let chains = |sessions: Vec<Vec<usize>>| Chains {
            template: Map::new(),
            sessions,
            header: None,
        };
        let at = |order: &[usize]| -> Vec<Timed> {
            order
                .iter()
                .enumerate()
                .map(|(i, &variant)| Timed {
                    start_offset_us: i as i64 * 100,
                    exchange_id: i as i64,
                    case: 0,
                    variant,
                })
                .collect()
        };
        let linear = chains(vec![vec![0, 1], vec![2]]);
        let turns = turns_of(&c, &linear).unwrap();
        assert_eq!(turns, [(0, 0), (0, 1), (1, 0)]);
        assert!(whole_runs(&at(&[0, 2, 1, 0, 1]), 0, &turns, &linear));
        for order in [&[1, 0][..], &[0, 0, 1], &[0, 1, 1], &[0, 2]] {
            assert!(!whole_runs(&at(order), 0, &turns, &linear), "{order:?}");
        }
        // A request continued two ways is a turn of two sessions.
        assert_eq!(turns_of(&c, &chains(vec![vec![0, 1], vec![0, 2]])), None);
        let mut lines = Vec::new();
        let names = ["chat".to_string()];
        let kept = timed_sessions(
            vec![Some(linear.clone())],
            std::slice::from_ref(&c),
            &mut at(&[0, 1, 2]),
            &names,
            &mut lines,
        );
        assert_eq!((kept, lines.len()), (vec![Some(linear.clone())], 0));
        let dropped = timed_sessions(
            vec![Some(linear.clone())],
            std::slice::from_ref(&c),
            &mut at(&[0, 2]),
            &names,
            &mut lines,
        );
        assert_eq!(dropped, vec![None]);
        assert!(lines[0].starts_with("case 'chat': its chats continue one another, but its captured requests are not whole conversations"), "{lines:?}");
        // The entries name each exchange's turn, by the session ids the plan writes.
        let named = |c: &Case| {
            let t = trace_load(
                at(&[0, 2, 1]),
                std::slice::from_ref(c),
                &[Some(linear.clone())],
                None,
            );
            let Where::Inline { entries } = t.unwrap().load.trace else {
                panic!("inline")
            };
            entries
                .into_iter()
                .map(|e| e.variant.unwrap())
                .collect::<Vec<String>>()
        };
        assert_eq!(named(&c), ["s1/1", "s2/1", "s1/2"]);
        // A client that reused its affinity header's value: the plan's second session is
        // `conv-2`, and so are its entries.
        let mut reused = c.clone();
        for v in &mut reused.variants {
            v.session = Some(("x-session-id".into(), "conv".into()));
        }
        assert_eq!(named(&reused), ["conv/1", "conv-2/1", "conv/2"]);
    }

    #[test]
    fn small_traces_sit_in_the_plan_and_large_ones_in_a_file_beside_it() {
        let cases = vec![case("/v1/a", 1), case("/v1/b", 2)];
        let t = trace_load(timed(3), &cases, &[None, None], None).unwrap();
        assert!(t.file.is_none());
        let e = |offset_us, case: &str, variant: Option<&str>| Entry {
            offset_us,
            case: case.into(),
            variant: variant.map(String::from),
        };
        assert_eq!(
            t.load.trace,
            Where::Inline {
                entries: vec![
                    e(0, "v1/a", None),
                    e(10, "v1/b", Some("v2")),
                    e(20, "v1/a", None)
                ]
            }
        );
        // Past INLINE_ENTRIES: a file, pinned by its hash; refused without a name for it.
        let many = INLINE_ENTRIES + 1;
        let err = trace_load(timed(many), &cases, &[None, None], None).unwrap_err();
        assert_eq!(err.entries, many);
        let t = trace_load(timed(many), &cases, &[None, None], Some("x.trace.jsonl")).unwrap();
        let bytes = t.file.unwrap().bytes;
        assert_eq!(bytes.iter().filter(|&&b| b == b'\n').count(), many);
        assert_eq!(
            t.load.trace,
            Where::File {
                file: "x.trace.jsonl".into(),
                sha256: sha256_hex(&bytes)
            }
        );
        let first = bytes.split(|&b| b == b'\n').next().unwrap();
        assert_eq!(first, br#"{"offset_us":0,"case":"v1/a"}"#);
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
