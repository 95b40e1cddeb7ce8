//! Drift: how an arm's answers differ from the reference's. Pairs are the measured
//! exchanges both arms answered `ok` at the same (case, variant, concurrency, repetition,
//! dispatch_index). The answer compared is the assembled stream content for streams, the
//! first choice's message content (or `text`) for OpenAI-style JSON, otherwise the
//! response as canonical JSON (keys sorted, the request's ignore paths taken out), and
//! for a body that is not JSON its bytes read as UTF-8 (lossy: invalid sequences become
//! U+FFFD, and the entry counts them). Lengths, edit distances and positions count
//! Unicode scalar values. Pure functions over answers: the CLI reads them back from the
//! recorded bodies, so `replay` (campaign.json) and `compare` use one definition.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::oracle::{Pointer, sort_keys};

/// One answer, as drift compares it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Answer {
    pub(crate) text: String,
    /// The answer as JSON when it is JSON (the canonical response, or a first choice's
    /// content that parses): numeric pointers and decisions are read from it.
    pub(crate) json: Option<Value>,
    /// The body was not valid UTF-8 and was read lossily.
    pub(crate) lossy: bool,
    /// A session turn's: the assistant message it carries into a history (content and
    /// tool calls, [`crate::oracle::answer`]), canonical; what a trajectory compares.
    pub(crate) message: Option<String>,
}

/// Where an answer sits in the plan's dispatch.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Key {
    pub(crate) case: String,
    pub(crate) variant: Option<String>,
    pub(crate) concurrency: i32,
    pub(crate) repetition: i32,
    pub(crate) dispatch_index: i64,
    /// A session's turn (from 1; `None` outside sessions): the same for every answer of
    /// the key's variant, so it changes no pairing.
    pub(crate) turn: Option<i32>,
}

/// One side's measured `ok` answers.
#[derive(Debug, Default)]
pub(crate) struct Answers {
    pub(crate) by_key: BTreeMap<Key, Answer>,
    /// Answers left out because the recording holds only part of the body.
    pub(crate) truncated: std::collections::BTreeSet<Key>,
    /// Answers judged by an oracle: passed (`ok`) or failed (`correctness`).
    pub(crate) judged: BTreeMap<Key, bool>,
}

/// What drift reads from the plan besides the answers.
pub(crate) struct Options<'a> {
    pub(crate) numeric_pointers: &'a [Pointer],
    pub(crate) decisions_pointer: &'a Pointer,
    /// The cases whose sessions carry the server's own answers (`history: live`): past a
    /// session's first divergence its turns answer other prompts on each side.
    pub(crate) live_cases: &'a [&'a str],
}

/// The answer of one recorded body; `ignore` are the request's ignore paths.
pub(crate) fn answer(body: &[u8], is_stream: bool, ignore: &[Pointer]) -> Answer {
    if let Some(a) = with_calls(body, is_stream) {
        return a;
    }
    let lossy = std::str::from_utf8(body).is_err();
    if is_stream && let Ok(events) = crate::sse::parse_all(body) {
        let mut t = crate::sse::StreamTracker::default();
        for e in &events {
            t.on_event(e);
        }
        let text = if t.openai {
            t.text
        } else {
            let data: Vec<&str> = events
                .iter()
                .map(|e| e.data.as_str())
                .filter(|d| *d != "[DONE]")
                .collect();
            data.join("\n")
        };
        return from_text(text, lossy);
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(doc) => {
            let first = doc
                .pointer("/choices/0/message/content")
                .or_else(|| doc.pointer("/choices/0/text"));
            if let Some(Value::String(t)) = first {
                return from_text(t.clone(), false);
            }
            let mut doc = doc;
            for p in ignore {
                p.take(&mut doc);
            }
            let doc = sort_keys(doc);
            Answer {
                text: doc.to_string(),
                json: Some(doc),
                lossy: false,
                message: None,
            }
        }
        Err(_) => Answer {
            text: String::from_utf8_lossy(body).into_owned(),
            json: None,
            lossy,
            message: None,
        },
    }
}

/// An answer that calls tools, compared as its content and its calls, canonical and
/// without the server's ids (`oracle::answer::canonical_calls`); `None` without calls.
fn with_calls(body: &[u8], is_stream: bool) -> Option<Answer> {
    Some(Answer {
        text: crate::oracle::answer::canonical_calls(body, is_stream)?,
        json: None,
        lossy: false,
        message: None,
    })
}

fn from_text(text: String, lossy: bool) -> Answer {
    let t = text.trim_start();
    let json = (t.starts_with('{') || t.starts_with('['))
        .then(|| serde_json::from_str::<Value>(&text).ok().map(sort_keys))
        .flatten();
    Answer {
        text,
        json,
        lossy,
        message: None,
    }
}

/// A session turn's answer as a history carries it (its assistant message, canonical,
/// tool calls' ids left out), when it has one: two sides' trajectories part where these
/// differ, tool calls included.
pub(crate) fn turn_message(body: &[u8], is_stream: bool) -> Option<String> {
    let m = crate::oracle::answer::without_call_ids(body, is_stream).ok()?;
    Some(sort_keys(m).to_string())
}

/// `1 - levenshtein(a, b) / max(len(a), len(b))` in Unicode scalar values; 1.0 for two
/// empty answers.
pub(crate) fn similarity(a: &str, b: &str) -> f64 {
    if a == b {
        return 1.0;
    }
    let longest = a.chars().count().max(b.chars().count());
    let d = rapidfuzz::distance::levenshtein::distance(a.chars(), b.chars());
    1.0 - d as f64 / longest as f64
}

/// The index (in Unicode scalar values) of the first difference; `None` when equal.
pub(crate) fn first_divergence(a: &str, b: &str) -> Option<usize> {
    if a == b {
        return None;
    }
    let mut n = 0;
    let (mut x, mut y) = (a.chars(), b.chars());
    loop {
        match (x.next(), y.next()) {
            (Some(p), Some(q)) if p == q => n += 1,
            _ => return Some(n),
        }
    }
}

/// Entries of the decisions container whose value differs (array elements by position,
/// object members by key; one side's extra entries count). `None` when either side has
/// something other than a container there (an absent container is empty).
pub(crate) fn decision_flips(a: &Value, b: &Value, at: &Pointer) -> Option<u64> {
    let empty = Value::Array(Vec::new());
    let (x, y) = (
        at.resolve(a).unwrap_or(&empty),
        at.resolve(b).unwrap_or(&empty),
    );
    match (x, y) {
        (Value::Array(x), Value::Array(y)) => Some(
            (0..x.len().max(y.len()))
                .filter(|&i| x.get(i) != y.get(i))
                .count() as u64,
        ),
        (Value::Object(x), Value::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            Some(keys.into_iter().filter(|k| x.get(*k) != y.get(*k)).count() as u64)
        }
        // One side answered with an object, the other with an empty (absent) container.
        (Value::Object(m), Value::Array(v)) | (Value::Array(v), Value::Object(m))
            if v.is_empty() =>
        {
            Some(m.len() as u64)
        }
        _ => None,
    }
}

/// Running totals of a set of pairs, and the distinct requests (case, variant) they
/// answer.
#[derive(Default)]
struct Tally<'a> {
    pairs: u64,
    equal: u64,
    similarity: f64,
    requests: std::collections::BTreeSet<(&'a str, Option<&'a str>)>,
}

impl<'a> Tally<'a> {
    fn add(&mut self, key: &'a Key, equal: bool, similarity: f64) {
        self.pairs += 1;
        self.equal += u64::from(equal);
        self.similarity += similarity;
        self.requests
            .insert((key.case.as_str(), key.variant.as_deref()));
    }

    fn level(&self) -> LevelDrift {
        let rate = |x: f64| (self.pairs > 0).then(|| x / self.pairs as f64);
        LevelDrift {
            compared_prompts: self.pairs,
            distinct_requests: self.requests.len() as u64,
            exact_match_rate: rate(self.equal as f64),
            mean_similarity: rate(self.similarity),
        }
    }
}

/// Drift of one arm's answers against the reference's: the totals, per concurrency
/// level, numeric pointers, decision flips, and one entry per pair (`prompts`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct Drift {
    pub(crate) compared_prompts: u64,
    /// The distinct requests (case, variant) the pairs answer: repeats of one request
    /// are not independent evidence, so the gates' minimums count these.
    pub(crate) distinct_requests: u64,
    pub(crate) exact_match_rate: Option<f64>,
    pub(crate) mean_similarity: Option<f64>,
    /// By concurrency level, in numeric order (string keys: a drift entry is flattened
    /// into campaign.json's, and serde reads a flattened map's keys only as strings).
    pub(crate) concurrency: indexmap::IndexMap<String, LevelDrift>,
    pub(crate) numeric: Vec<NumericDrift>,
    pub(crate) decision_flips: Option<u64>,
    pub(crate) decision_pairs: u64,
    pub(crate) unpaired_reference_answers: u64,
    pub(crate) unpaired_arm_answers: u64,
    pub(crate) truncated_answers_left_out: u64,
    pub(crate) lossy_utf8_answers: u64,
    /// By a session's turn index (string keys, as `concurrency`'s): empty outside sessions.
    #[serde(skip_serializing_if = "indexmap::IndexMap::is_empty")]
    pub(crate) turns: indexmap::IndexMap<String, LevelDrift>,
    /// Each session run both sides answered, and the turn where they first differed.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) trajectories: Vec<Trajectory>,
    /// Pairs of a live session's turns after its first divergence: the two sides were
    /// asked different prompts, so these pairs are in no total, level or turn above.
    #[serde(skip_serializing_if = "is_zero")]
    pub(crate) off_trajectory_pairs: u64,
    pub(crate) prompts: Vec<PromptDrift>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// One session run of both sides (case, level, repetition, dispatch index).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Trajectory {
    pub(crate) case: String,
    /// The session's id (its turns' variant names before the last `/`).
    pub(crate) session: Option<String>,
    pub(crate) concurrency: i32,
    pub(crate) repetition: i32,
    pub(crate) dispatch_index: i64,
    /// Turns both sides answered.
    pub(crate) turns_compared: u64,
    /// The first turn whose answers differ (`None`: none did).
    pub(crate) first_divergence_turn: Option<i32>,
}

/// The totals of one concurrency level.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct LevelDrift {
    pub(crate) compared_prompts: u64,
    pub(crate) distinct_requests: u64,
    pub(crate) exact_match_rate: Option<f64>,
    pub(crate) mean_similarity: Option<f64>,
}

/// One of `drift.numeric_pointers`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct NumericDrift {
    pub(crate) pointer: String,
    pub(crate) max_abs_difference: Option<f64>,
    pub(crate) compared_pairs: u64,
    pub(crate) pairs_without_both_numbers: u64,
}

/// One pair of answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct PromptDrift {
    pub(crate) case: String,
    pub(crate) variant: Option<String>,
    pub(crate) concurrency: i32,
    pub(crate) repetition: i32,
    pub(crate) dispatch_index: i64,
    pub(crate) equal: bool,
    pub(crate) similarity: f64,
    pub(crate) first_divergence_char: Option<usize>,
    pub(crate) reference_chars: usize,
    pub(crate) arm_chars: usize,
    pub(crate) decision_flips: Option<u64>,
}

/// Drift of `arm`'s answers against `reference`'s.
/// One numeric pointer's differences over the pairs seen so far.
#[derive(Debug, Clone, Copy, Default)]
struct NumericTally {
    /// The largest absolute difference, once a pair had a number on both sides.
    max: Option<f64>,
    compared: u64,
    /// Pairs where either side has no number at the pointer.
    missing: u64,
}

impl NumericTally {
    fn add(&mut self, p: &crate::oracle::Pointer, x: &Value, y: &Value) {
        match (
            p.resolve(x).and_then(Value::as_f64),
            p.resolve(y).and_then(Value::as_f64),
        ) {
            (Some(u), Some(v)) => {
                let d = (u - v).abs();
                self.max = Some(self.max.map_or(d, |m: f64| m.max(d)));
                self.compared += 1;
            }
            _ => self.missing += 1,
        }
    }
}

/// One pair's line: the reference's answer and the arm's for the same `key`.
fn prompt_drift(
    key: &Key,
    a: &Answer,
    b: &Answer,
    similarity: f64,
    decision_flips: Option<u64>,
) -> PromptDrift {
    PromptDrift {
        case: key.case.clone(),
        variant: key.variant.clone(),
        concurrency: key.concurrency,
        repetition: key.repetition,
        dispatch_index: key.dispatch_index,
        equal: a.text == b.text,
        similarity,
        first_divergence_char: first_divergence(&a.text, &b.text),
        reference_chars: a.text.chars().count(),
        arm_chars: b.text.chars().count(),
        decision_flips,
    }
}

pub(crate) fn drift(reference: &Answers, arm: &Answers, opts: &Options<'_>) -> Drift {
    let trajectories = trajectories(reference, arm);
    let mut all = Tally::default();
    let mut by_level: BTreeMap<i32, Tally> = BTreeMap::new();
    let mut by_turn: BTreeMap<i32, Tally> = BTreeMap::new();
    let mut off_trajectory = 0u64;
    let mut prompts = Vec::new();
    let mut numeric = vec![NumericTally::default(); opts.numeric_pointers.len()];
    let (mut flips, mut flip_pairs, mut lossy) = (0u64, 0u64, 0u64);
    let mut unpaired_arm = 0u64;
    for (key, b) in &arm.by_key {
        let Some(a) = reference.by_key.get(key) else {
            // A partner left out for truncation is counted there, not as unpaired.
            unpaired_arm += u64::from(!reference.truncated.contains(key));
            continue;
        };
        if off_trajectory_pair(key, &trajectories, opts) {
            off_trajectory += 1;
            continue;
        }
        lossy += u64::from(a.lossy) + u64::from(b.lossy);
        let equal = a.text == b.text;
        let sim = similarity(&a.text, &b.text);
        all.add(key, equal, sim);
        if let Some(t) = key.turn {
            by_turn.entry(t).or_default().add(key, equal, sim);
        }
        by_level
            .entry(key.concurrency)
            .or_default()
            .add(key, equal, sim);
        let mut pair_flips = None;
        if let (Some(x), Some(y)) = (&a.json, &b.json) {
            pair_flips = decision_flips(x, y, opts.decisions_pointer);
            if let Some(f) = pair_flips {
                flips += f;
                flip_pairs += 1;
            }
            for (p, slot) in opts.numeric_pointers.iter().zip(numeric.iter_mut()) {
                slot.add(p, x, y);
            }
        }
        prompts.push(prompt_drift(key, a, b, sim, pair_flips));
    }
    let unpaired_reference = reference
        .by_key
        .keys()
        .filter(|k| !arm.by_key.contains_key(*k) && !arm.truncated.contains(*k))
        .count();
    let totals = all.level();
    Drift {
        compared_prompts: totals.compared_prompts,
        distinct_requests: totals.distinct_requests,
        exact_match_rate: totals.exact_match_rate,
        mean_similarity: totals.mean_similarity,
        concurrency: by_level
            .iter()
            .map(|(c, t)| (c.to_string(), t.level()))
            .collect(),
        numeric: opts
            .numeric_pointers
            .iter()
            .zip(&numeric)
            .map(|(p, t)| NumericDrift {
                pointer: p.as_str().to_string(),
                max_abs_difference: t.max,
                compared_pairs: t.compared,
                pairs_without_both_numbers: t.missing,
            })
            .collect(),
        decision_flips: (flip_pairs > 0).then_some(flips),
        decision_pairs: flip_pairs,
        unpaired_reference_answers: unpaired_reference as u64,
        unpaired_arm_answers: unpaired_arm,
        truncated_answers_left_out: (reference.truncated.len() + arm.truncated.len()) as u64,
        lossy_utf8_answers: lossy,
        turns: by_turn
            .iter()
            .map(|(t, tally)| (t.to_string(), tally.level()))
            .collect(),
        trajectories: trajectories.into_values().collect(),
        off_trajectory_pairs: off_trajectory,
        prompts,
    }
}

/// Where a session run sits: case, level, repetition, dispatch index.
type Run = (String, i32, i32, i64);

/// Each session run both sides answered, with the first turn where they differed.
fn trajectories(reference: &Answers, arm: &Answers) -> BTreeMap<Run, Trajectory> {
    let mut out: BTreeMap<Run, Trajectory> = BTreeMap::new();
    for (key, b) in &arm.by_key {
        let (Some(turn), Some(a)) = (key.turn, reference.by_key.get(key)) else {
            continue;
        };
        let run = (
            key.case.clone(),
            key.concurrency,
            key.repetition,
            key.dispatch_index,
        );
        let t = out.entry(run).or_insert_with(|| Trajectory {
            case: key.case.clone(),
            session: key
                .variant
                .as_deref()
                .and_then(|v| v.rsplit_once('/'))
                .map(|(s, _)| s.to_string()),
            concurrency: key.concurrency,
            repetition: key.repetition,
            dispatch_index: key.dispatch_index,
            turns_compared: 0,
            first_divergence_turn: None,
        });
        t.turns_compared += 1;
        let differ = match (&a.message, &b.message) {
            (Some(x), Some(y)) => x != y,
            _ => a.text != b.text,
        };
        if differ {
            t.first_divergence_turn = Some(t.first_divergence_turn.map_or(turn, |f| f.min(turn)));
        }
    }
    out
}

/// A live session's turn after its run's first divergence: the sides answered other
/// prompts.
fn off_trajectory_pair(key: &Key, runs: &BTreeMap<Run, Trajectory>, opts: &Options<'_>) -> bool {
    let Some(turn) = key.turn else {
        return false;
    };
    if !opts.live_cases.contains(&key.case.as_str()) {
        return false;
    }
    let run = (
        key.case.clone(),
        key.concurrency,
        key.repetition,
        key.dispatch_index,
    );
    runs.get(&run)
        .and_then(|t| t.first_divergence_turn)
        .is_some_and(|first| turn > first)
}

/// What each drift key means (for campaign.json and compare.json).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Definitions {
    pub(crate) pairs: String,
    pub(crate) distinct_requests: String,
    pub(crate) answer: String,
    pub(crate) exact_match_rate: String,
    pub(crate) mean_similarity: String,
    pub(crate) first_divergence_char: String,
    pub(crate) numeric: String,
    pub(crate) decision_flips: String,
    pub(crate) advisory: String,
}

/// The drift keys' definitions.
pub(crate) fn definitions() -> Definitions {
    Definitions {
        pairs: "measured exchanges both sides answered ok at the same (case, variant, concurrency, repetition, dispatch_index)".into(),
        distinct_requests: "the distinct requests (case, variant) the pairs answer; repeats of one request are not independent, so a gate's minimum counts these, not pairs".into(),
        answer: "a stream's assembled content; an OpenAI-style JSON answer's first choice message content (or text); else the response as canonical JSON (keys sorted, the request's ignore_paths taken out); a non-JSON body as UTF-8, lossy (counted in lossy_utf8_answers)".into(),
        exact_match_rate: "equal pairs / pairs".into(),
        mean_similarity: "mean over pairs of 1 - levenshtein(a, b) / max(len(a), len(b)), in Unicode scalar values; 1.0 for two empty answers".into(),
        first_divergence_char: "index (Unicode scalar values) of the first difference; null when equal".into(),
        numeric: "per drift.numeric_pointers pointer, the largest absolute difference over pairs where both JSON answers have a number there".into(),
        decision_flips: "entries of the decisions container (decisions_pointer) whose value differs, summed over pairs of JSON answers; null when no pair had one".into(),
        advisory: "true for performance-fit arms: reported, never an equivalence claim".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_calls_take_part_in_drift_and_their_ids_do_not() {
        let stream = |name: &str, args: &str, id: &str| {
            let head = serde_json::json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0,
                "id": id, "type": "function", "function": {"name": name, "arguments": ""}}]}}]});
            let rest = serde_json::json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0,
                "function": {"arguments": args}}]}}]});
            format!("data: {head}\n\ndata: {rest}\n\ndata: [DONE]\n\n").into_bytes()
        };
        let a = answer(&stream("lookup", r#"{"q": "x", "n": 1}"#, "c1"), true, &[]);
        let same = answer(&stream("lookup", r#"{"n":1,"q":"x"}"#, "c2"), true, &[]);
        let other = answer(&stream("search", r#"{"q": "x", "n": 1}"#, "c1"), true, &[]);
        assert_eq!(
            a.text, same.text,
            "other ids and key order are the same call"
        );
        assert_ne!(a.text, other.text, "another tool is another answer");
        let json = serde_json::json!({"choices": [{"index": 0, "message": {"role": "assistant",
            "content": null, "tool_calls": [{"id": "c9", "type": "function",
            "function": {"name": "lookup", "arguments": "{\"q\":\"x\",\"n\":1}"}}]}}]});
        assert_eq!(answer(json.to_string().as_bytes(), false, &[]).text, a.text);
    }
    use serde_json::json;

    /// [`super::drift`] as the JSON campaign.json holds.
    fn drift(reference: &Answers, arm: &Answers, opts: &Options<'_>) -> Value {
        serde_json::to_value(super::drift(reference, arm, opts)).expect("drift serializes")
    }

    fn text(t: &str) -> Answer {
        from_text(t.to_string(), false)
    }

    fn key(i: i64) -> Key {
        Key {
            case: "c".into(),
            variant: None,
            concurrency: 1,
            repetition: 0,
            dispatch_index: i,
            turn: None,
        }
    }

    fn side(answers: &[&str]) -> Answers {
        Answers {
            by_key: answers
                .iter()
                .enumerate()
                .map(|(i, a)| (key(i as i64), text(a)))
                .collect(),
            truncated: Default::default(),
            judged: Default::default(),
        }
    }

    fn decisions() -> Pointer {
        Pointer::parse("/answers").expect("pointer")
    }

    #[test]
    fn pinned_pairs() {
        // (a, b, similarity, first divergence)
        let cases: [(&str, &str, f64, Option<usize>); 8] = [
            ("the capital is Paris", "the capital is Paris", 1.0, None),
            (
                "the capital is Paris",
                "the capital is Lyon",
                0.75,
                Some(15),
            ),
            ("abc", "abXc", 0.75, Some(2)),
            ("hello world", "hello wrld", 1.0 - 1.0 / 11.0, Some(7)),
            ("naïve café", "naive cafe", 0.8, Some(2)),
            ("👍ok", "👎ok", 1.0 - 1.0 / 3.0, Some(0)),
            ("", "", 1.0, None),
            ("", "abc", 0.0, Some(0)),
        ];
        for (a, b, sim, div) in cases {
            assert!(
                (similarity(a, b) - sim).abs() < 1e-12,
                "{a:?} vs {b:?}: {}",
                similarity(a, b)
            );
            assert!((similarity(b, a) - sim).abs() < 1e-12, "symmetric");
            assert_eq!(first_divergence(a, b), div, "{a:?} vs {b:?}");
        }
    }

    /// Two sessions of three turns; `differ`: (session, turn) pairs whose answers differ.
    fn sessions(differ: &[(i64, i32)]) -> (Answers, Answers) {
        let (mut a, mut b) = (Answers::default(), Answers::default());
        for s in 0..2 {
            for t in 1..=3 {
                let key = Key {
                    case: "chat".into(),
                    variant: Some(format!("s{}/{t}", s + 1)),
                    concurrency: 1,
                    repetition: 0,
                    dispatch_index: s,
                    turn: Some(t),
                };
                let other = if differ.contains(&(s, t)) {
                    "other"
                } else {
                    "same"
                };
                a.by_key.insert(key.clone(), text("same"));
                b.by_key.insert(key, text(other));
            }
        }
        (a, b)
    }

    #[test]
    fn a_session_that_diverges_at_turn_2_shows_it_per_turn_and_in_its_trajectory() {
        let (reference, arm) = sessions(&[(0, 2), (0, 3)]);
        let live = ["chat"];
        let mut opts = Options {
            numeric_pointers: &[],
            decisions_pointer: &decisions(),
            live_cases: &live,
        };
        let d = super::drift(&reference, &arm, &opts);
        let first: Vec<Option<i32>> = d
            .trajectories
            .iter()
            .map(|t| t.first_divergence_turn)
            .collect();
        assert_eq!(first, [Some(2), None]);
        assert_eq!(d.trajectories[0].session.as_deref(), Some("s1"));
        // Live: s1's turn 3 answered another prompt on each side, so it is in no total.
        assert_eq!((d.off_trajectory_pairs, d.compared_prompts), (1, 5));
        assert_eq!(d.turns["1"].exact_match_rate, Some(1.0));
        assert_eq!(d.turns["2"].exact_match_rate, Some(0.5));
        assert_eq!(d.turns["3"].compared_prompts, 1);
        // Frozen: every turn asked the same prompt on both sides, so every pair counts.
        opts.live_cases = &[];
        let d = super::drift(&reference, &arm, &opts);
        assert_eq!((d.off_trajectory_pairs, d.compared_prompts), (0, 6));
        assert_eq!(d.turns["3"].exact_match_rate, Some(0.5));
    }

    #[test]
    fn a_turns_message_compares_tool_calls_but_not_their_server_ids() {
        let call = |id: &str, args: &str| {
            serde_json::json!({"choices": [{"message": {"role": "assistant", "content": null,
                "tool_calls": [{"id": id, "type": "function", "function": {"name": "f", "arguments": args}}]}}]})
            .to_string()
        };
        let m = |b: String| super::turn_message(b.as_bytes(), false);
        assert_eq!(m(call("call_a", "{}")), m(call("call_b", "{}")));
        assert_ne!(m(call("call_a", "{}")), m(call("call_a", "{\"x\":1}")));
        assert_eq!(super::turn_message(b"not json", false), None);
    }

    #[test]
    fn answers_without_a_partner_are_counted_not_paired() {
        let opts = Options {
            numeric_pointers: &[],
            decisions_pointer: &decisions(),
            live_cases: &[],
        };
        // Answers without a partner are counted, never paired.
        let d = drift(&side(&["a", "b"]), &side(&["a"]), &opts);
        assert_eq!(
            (&d["compared_prompts"], &d["unpaired_reference_answers"]),
            (&json!(1), &json!(1))
        );
    }

    #[test]
    fn json_answers_numbers_and_decision_flips() {
        let ignore = [Pointer::parse("/id").expect("pointer")];
        let a = answer(
            br#"{"id": 1, "answers": [1, 2, 3], "score": 0.5, "z": 1, "a": 2}"#,
            false,
            &ignore,
        );
        let b = answer(
            br#"{"a": 2, "z": 1, "score": 0.75, "answers": [1, 5], "id": 2}"#,
            false,
            &ignore,
        );
        assert_eq!(a.text, r#"{"a":2,"answers":[1,2,3],"score":0.5,"z":1}"#);
        let opts = Options {
            numeric_pointers: &[
                Pointer::parse("/score").expect("p"),
                Pointer::parse("/none").expect("p"),
            ],
            decisions_pointer: &decisions(),
            live_cases: &[],
        };
        let wrap = |x: Answer| Answers {
            by_key: [(key(0), x)].into_iter().collect(),
            truncated: Default::default(),
            judged: Default::default(),
        };
        let d = drift(&wrap(a), &wrap(b), &opts);
        assert_eq!(
            d["decision_flips"],
            json!(2),
            "position 1 differs, position 2 is missing"
        );
        assert_eq!(d["numeric"][0]["max_abs_difference"], json!(0.25));
        assert_eq!(d["numeric"][1]["pairs_without_both_numbers"], json!(1));
        // Object containers by key; an ignored id does not make answers differ.
        let x = json!({"answers": {"q1": "yes", "q2": "no"}});
        let y = json!({"answers": {"q1": "yes", "q2": "yes", "q3": "no"}});
        assert_eq!(decision_flips(&x, &y, &decisions()), Some(2));
        assert_eq!(
            decision_flips(&x, &json!({"answers": 3}), &decisions()),
            None
        );
        let same_but_id = answer(br#"{"id": 9, "v": 1}"#, false, &ignore);
        assert_eq!(same_but_id, answer(br#"{"v": 1, "id": 8}"#, false, &ignore));
    }

    #[test]
    fn what_is_compared_for_each_kind_of_body() {
        let chat = br#"{"id": "x1", "choices": [{"message": {"content": "Paris"}}]}"#;
        assert_eq!(answer(chat, false, &[]).text, "Paris");
        let completion = br#"{"choices": [{"text": "Lyon"}]}"#;
        assert_eq!(answer(completion, false, &[]).text, "Lyon");
        let stream = b"data: {\"choices\":[{\"delta\":{\"content\":\"Pa\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"ris\"}}]}\n\ndata: [DONE]\n\n";
        assert_eq!(answer(stream, true, &[]).text, "Paris");
        let plain_events = b"data: one\n\ndata: two\n\ndata: [DONE]\n\n";
        assert_eq!(answer(plain_events, true, &[]).text, "one\ntwo");
        let bad = answer(b"caf\xe9", false, &[]);
        assert_eq!((bad.text.as_str(), bad.lossy), ("caf\u{fffd}", true));
        // A first choice whose content is JSON is a JSON answer.
        let j = answer(
            br#"{"choices": [{"message": {"content": "{\"answers\": [1]}"}}]}"#,
            false,
            &[],
        );
        assert_eq!(j.json, Some(json!({"answers": [1]})));
    }
}
