//! [`Evidence`]: what a run's reports read back from its closed parts, gathered in one
//! pass over `exchanges/` after the rounds: the plan's input token counts against the
//! server's (summary.json's `prompt_tokens_mismatch`), each side's measured answers
//! (campaign.json's `drift`, [`super::answers`]) and each side's measured rounds
//! (campaign.json's `intervals`, [`super::intervals`]). Each part is opened once, with
//! the columns of every reader asked for; each reader fails on its own, with the error
//! it met first, as it would have reading the parts alone.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use arrow_array::RecordBatch;

use super::doc::summary::PromptTokensMismatch;
use crate::config::plan::Plan;
use crate::drift::{self, Answers};
use crate::metrics::Sample;
use crate::model::{JudgedBy, Outcome};
use crate::oracle::Pointer;
use crate::record::read::{self, AnswerRow, PartRows, ReadError, RowFacts};

/// Why a reader's part of the evidence is not there.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum EvidenceError {
    /// The rows could not be read back.
    #[error(transparent)]
    Read(#[from] ReadError),
    /// The pass was not asked for it, or it was already taken (a caller's mistake).
    #[error("the run's {0} were not gathered in its pass over exchanges/")]
    NotGathered(&'static str),
}

/// What one pass gathers.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Wants {
    /// The plan's input token counts against the server's (read only when the plan
    /// has `prompt_tokens`).
    pub(crate) prompt_tokens: bool,
    /// Each side's measured answers, for drift.
    pub(crate) answers: bool,
    /// Each side's measured rounds, for intervals.
    pub(crate) rounds: bool,
}

/// Whether any request of the plan has `prompt_tokens`.
pub(crate) fn plans_prompt_tokens(plan: &Plan) -> bool {
    plan.cases
        .iter()
        .flat_map(|c| &c.variants)
        .any(|v| v.prompt_tokens.is_some())
}

/// Each side's answers: keyed by arm (`None` outside campaigns).
pub(crate) type Sides = BTreeMap<Option<String>, Answers>;

/// Add one recorded answer to its side.
pub(crate) fn add_answer(sides: &mut Sides, row: AnswerRow, plan: &Plan) {
    let side = sides.entry(row.arm.clone()).or_default();
    let key = drift::Key {
        case: row.case_name,
        variant: row.variant,
        concurrency: row.concurrency,
        repetition: row.repetition,
        dispatch_index: row.dispatch_index,
        turn: row.turn,
    };
    // Pass / fail of an oracle-judged answer (the McNemar test's pairs): the oracle's
    // judgment, also where a performance-fit arm's mismatch stayed `ok`.
    let case = plan.cases.iter().find(|c| c.name == key.case);
    if case.is_some_and(|c| c.judged(plan.campaign.is_some()) == JudgedBy::Oracle)
        && let Some(passed) = row.passed
    {
        side.judged.insert(key.clone(), passed);
    }
    if !row.ok {
        return;
    }
    if row.truncated {
        side.truncated.insert(key);
        return;
    }
    let no_paths: &[Pointer] = &[];
    let ignore = case
        .and_then(|c| c.variants.iter().find(|v| v.name == key.variant))
        .map_or(no_paths, |v| &v.ignore_paths[..]);
    let mut a = drift::answer(&row.body, row.is_stream, ignore);
    if row.turn.is_some() {
        a.message = drift::turn_message(&row.body, row.is_stream);
    }
    side.by_key.insert(key, a);
}

/// One measured round: its ok samples and the span of all its rows.
#[derive(Debug, Default)]
pub(crate) struct Round {
    pub(super) ok: Vec<Sample>,
    first_start_us: Option<i64>,
    last_end_us: Option<i64>,
}

impl Round {
    pub(crate) fn add(&mut self, s: Sample) {
        let start = s.start_offset_us;
        let end = start + s.total_us.unwrap_or(0);
        self.first_start_us = Some(self.first_start_us.map_or(start, |f| f.min(start)));
        self.last_end_us = Some(self.last_end_us.map_or(end, |l| l.max(end)));
        if s.outcome == Outcome::Ok {
            self.ok.push(s);
        }
    }

    pub(super) fn span_seconds(&self) -> f64 {
        match (self.first_start_us, self.last_end_us) {
            (Some(f), Some(l)) => (l - f).max(0) as f64 / 1e6,
            _ => 0.0,
        }
    }
}

/// One side's measured rounds: (case, concurrency) -> repetition -> round.
pub(crate) type Rounds = BTreeMap<(String, u64), BTreeMap<i32, Round>>;

/// Add one row to its side's rounds (rows of other phases and of open loops are not
/// rounds of an interval).
pub(crate) fn add_row(sides: &mut BTreeMap<Option<String>, Rounds>, r: RowFacts) {
    let (Some(case), Some(c), Some(rep), None) =
        (r.case_name, r.concurrency, r.repetition, r.target_rate)
    else {
        return;
    };
    if r.phase != "measured" {
        return;
    }
    sides
        .entry(r.arm)
        .or_default()
        .entry((case, c.max(0) as u64))
        .or_default()
        .entry(rep)
        .or_default()
        .add(r.sample);
}

/// One reader's part: not asked for, being gathered (then gathered), or why it failed.
#[derive(Debug)]
enum Gathered<T> {
    NotWanted,
    Read(T),
    Failed(ReadError),
}

impl<T> Gathered<T> {
    fn wanted(wanted: bool, start: impl FnOnce() -> T) -> Gathered<T> {
        if wanted {
            Gathered::Read(start())
        } else {
            Gathered::NotWanted
        }
    }

    /// The reader's state while it still reads.
    fn active(&mut self) -> Option<&mut T> {
        match self {
            Gathered::Read(t) => Some(t),
            _ => None,
        }
    }

    fn is_active(&self) -> bool {
        matches!(self, Gathered::Read(_))
    }

    /// The reader stops at its first error.
    fn fail(&mut self, e: ReadError) {
        if self.is_active() {
            *self = Gathered::Failed(e);
        }
    }

    fn take(&mut self, what: &'static str) -> Result<T, EvidenceError> {
        match std::mem::replace(self, Gathered::NotWanted) {
            Gathered::Read(t) => Ok(t),
            Gathered::Failed(e) => Err(e.into()),
            Gathered::NotWanted => Err(EvidenceError::NotGathered(what)),
        }
    }
}

/// The rounds reader: the part being read, and every side's rounds so far.
#[derive(Debug)]
struct RoundsSeen {
    part: Option<PartRows>,
    sides: BTreeMap<Option<String>, Rounds>,
}

/// What a run's reports read back from its closed parts, gathered in one pass.
#[derive(Debug)]
pub(crate) struct Evidence {
    /// Parts opened (each part once, and once more for a part whose JSON answers lack
    /// their counts when neither answers nor prompt tokens were asked for).
    parts_opened: usize,
    prompt_tokens: Gathered<PromptTokensMismatch>,
    answers: Gathered<Sides>,
    rounds: Gathered<RoundsSeen>,
}

impl Evidence {
    /// Read what `wants` asks for from the closed parts of the `exchanges/` folders
    /// `dirs` (in order, each part once). Nothing is read when nothing is asked for;
    /// what cannot be read is said when it is taken.
    pub(crate) fn read(dirs: &[PathBuf], plan: &Plan, wants: Wants) -> Evidence {
        let mut e = Evidence {
            parts_opened: 0,
            prompt_tokens: Gathered::wanted(
                wants.prompt_tokens && plans_prompt_tokens(plan),
                PromptTokensMismatch::default,
            ),
            answers: Gathered::wanted(wants.answers, Sides::new),
            rounds: Gathered::wanted(wants.rounds, || RoundsSeen {
                part: None,
                sides: BTreeMap::new(),
            }),
        };
        let want = e.columns();
        'dirs: for dir in dirs {
            if !e.any_active() {
                break;
            }
            let parts = match read::closed_parts(dir) {
                Ok(parts) => parts,
                Err(err) => {
                    e.fail_all(err);
                    break;
                }
            };
            for part in parts {
                if !e.any_active() {
                    break 'dirs;
                }
                if let Err(err) = e.part(&part, &want, plan) {
                    e.fail_all(err);
                    break 'dirs;
                }
            }
        }
        e
    }

    /// Parts opened in the pass.
    #[cfg(test)]
    pub(crate) fn parts_opened(&self) -> usize {
        self.parts_opened
    }

    /// The prompt token counts (see [`super::prompt_tokens_mismatch`]).
    pub(crate) fn take_prompt_tokens(&mut self) -> Result<PromptTokensMismatch, EvidenceError> {
        self.prompt_tokens.take("prompt token counts")
    }

    /// Each side's measured answers, keyed by arm.
    pub(crate) fn take_answers(&mut self) -> Result<Sides, EvidenceError> {
        self.answers.take("answers")
    }

    /// Each side's measured closed-loop rounds, keyed by arm.
    pub(crate) fn take_rounds(
        &mut self,
    ) -> Result<BTreeMap<Option<String>, Rounds>, EvidenceError> {
        self.rounds.take("rounds").map(|r| r.sides)
    }

    fn any_active(&self) -> bool {
        self.prompt_tokens.is_active() || self.answers.is_active() || self.rounds.is_active()
    }

    /// An error every reader still reading meets (a folder or part that cannot be read).
    fn fail_all(&mut self, e: ReadError) {
        self.prompt_tokens.fail(e.clone());
        self.answers.fail(e.clone());
        self.rounds.fail(e);
    }

    /// The columns the pass reads: every wanted reader's.
    fn columns(&self) -> Vec<&'static str> {
        let mut want: Vec<&'static str> = Vec::new();
        let sets: [(bool, &[&'static str]); 3] = [
            (self.rounds.is_active(), &read::ROW_COLUMNS),
            (self.answers.is_active(), &read::ANSWER_COLUMNS),
            (self.prompt_tokens.is_active(), &read::PROMPT_COLUMNS),
        ];
        for (_, cols) in sets.into_iter().filter(|(on, _)| *on) {
            for c in cols {
                if !want.contains(c) {
                    want.push(c);
                }
            }
        }
        want
    }

    /// One part, opened once: each batch to every reader still reading.
    fn part(&mut self, part: &Path, want: &[&str], plan: &Plan) -> Result<(), ReadError> {
        let bodies = want.contains(&read::BODY_COLUMN);
        if let Some(r) = self.rounds.active() {
            r.part = Some(PartRows::new(bodies));
        }
        for batch in read::open_part(part, want, &mut self.parts_opened)? {
            let b = batch.map_err(|e| ReadError::batch(part, e))?;
            self.batch(&b, part, plan);
        }
        if let Some(r) = self.rounds.active()
            && let Some(rows) = r.part.take()
        {
            match rows.finish(part, &mut self.parts_opened) {
                Ok(rows) => rows.into_iter().for_each(|row| add_row(&mut r.sides, row)),
                Err(e) => self.rounds.fail(e),
            }
        }
        Ok(())
    }

    /// One batch to every reader still reading; a reader's own error stops it alone.
    fn batch(&mut self, b: &RecordBatch, part: &Path, plan: &Plan) {
        if let Some(m) = self.prompt_tokens.active()
            && let Err(e) = read::prompt_counts(b, part, &mut |p, s| m.add(p, s))
        {
            self.prompt_tokens.fail(e);
        }
        if let Some(sides) = self.answers.active()
            && let Err(e) = read::answer_rows(b, part, &mut |row| add_answer(sides, row, plan))
        {
            self.answers.fail(e);
        }
        if let Some(r) = self.rounds.active()
            && let Some(rows) = r.part.as_mut()
            && let Err(e) = rows.batch(b, part)
        {
            self.rounds.fail(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Phase;
    use crate::record::read::read_row_facts;

    /// The separate read of the prompt token counts the pass replaced: every part
    /// opened with the prompt counts' columns alone.
    fn for_each_prompt_count(ex: &Path, mut visit: impl FnMut(i64, i64)) -> Result<(), ReadError> {
        for part in read::closed_parts(ex)? {
            for batch in read::open_part(&part, &read::PROMPT_COLUMNS, &mut 0)? {
                let b = batch.map_err(|e| ReadError::batch(&part, e))?;
                read::prompt_counts(&b, &part, &mut visit)?;
            }
        }
        Ok(())
    }
    use crate::record::tests_support::{row, run_dir};
    use crate::record::{Recorder, RecorderOptions};
    use crate::report::{answers, intervals};
    use std::sync::Arc;

    const META: &str = r#""metadata": {"gpu": "N/A", "gpu_ids": "N/A", "driver": "N/A", "cuda": "N/A",
        "precision": "bf16", "model_revision": "m", "runtime_revision": "r", "cache_policy": "none",
        "cuda_evidence": "N/A", "reservation": "N/A", "host": "h"}"#;

    /// A campaign of two arms over one case whose request plans its input tokens.
    fn campaign_plan() -> Plan {
        let recipe = |q: &str| {
            format!(
                r#"{{"runtime": "vllm", "weight_format": "safetensors", "weight_quantization": "{q}", "device": "cuda:0"}}"#
            )
        };
        let text = format!(
            r#"{{ "name": "q4-vs-bf16", "evidence_class": "measured", "arms": [
              {{"name": "ref", "lane": "quality", "reference": true,
                "endpoint": "http://127.0.0.1:8000/v1/chat/completions", "recipe": {}}},
              {{"name": "q4", "lane": "performance-fit",
                "endpoint": "http://127.0.0.1:8001/v1/chat/completions", "recipe": {}}}],
              "concurrency": [1], "requests_per_case": 2, "timeout_seconds": 5,
              "cases": [{{"name": "c", "request": {{"q": 1}}, "prompt_tokens": 5}}], {META} }}"#,
            recipe("bf16"),
            recipe("q4_k_m")
        );
        Plan::from_json_bytes(text.as_bytes()).expect("a campaign plan")
    }

    /// Measured rows of both arms over several repetitions, in parts of three rows: some
    /// JSON answers count their tokens in their columns, the rest only in their body.
    fn record_campaign(ex: &Path) {
        let mut opts = RecorderOptions::new(ex.to_path_buf());
        opts.part_rows = 3;
        let rec = Recorder::start(opts).expect("a recorder");
        let bodies: [&'static [u8]; 3] = [
            br#"{"choices":[{"message":{"content":"Paris"}}],"usage":{"prompt_tokens":5,"completion_tokens":1}}"#,
            br#"{"choices":[{"message":{"content":"Lyon"}}],"usage":{"prompt_tokens":6,"completion_tokens":2}}"#,
            br#"{"choices":[{"message":{"content":"Paris"}}],"usage":{"prompt_tokens":9,"completion_tokens":3}}"#,
        ];
        let mut id = 0;
        for rep in 0..3 {
            for (arm, body) in [("ref", bodies[0]), ("q4", bodies[1 + rep as usize % 2])] {
                for dispatch in 0..2 {
                    let mut r = row(id, b"");
                    r.phase = Phase::Measured;
                    r.arm = Some(Arc::from(arm));
                    r.case_name = Some(Arc::from("c"));
                    r.concurrency = Some(1);
                    r.repetition = Some(rep);
                    r.dispatch_index = dispatch;
                    r.start_offset_us = id * 1_000;
                    r.timings.total_us = Some(900);
                    r.prompt_tokens_planned = Some(5);
                    r.response_body = bytes::Bytes::from_static(body);
                    r.response_body_len = body.len() as i64;
                    if id % 3 == 0 {
                        r.answer_usage = crate::model::answer_usage(body).map(|u| u.tokens);
                    }
                    if id == 7 {
                        r.outcome = Outcome::Http;
                    }
                    assert!(rec.submit_now(r).expect("queued").is_none());
                    id += 1;
                }
            }
        }
        rec.finish().expect("written");
    }

    fn parts_on_disk(ex: &Path) -> usize {
        std::fs::read_dir(ex)
            .expect("exchanges/")
            .filter_map(|e| e.ok())
            .filter(|e| {
                let n = e.file_name().to_string_lossy().into_owned();
                n.starts_with("part-") && n.ends_with(".parquet")
            })
            .count()
    }

    /// A campaign's post-processing opens each part once, and gathers what the three
    /// separate reads (prompt counts, answers, rows) gathered, each opening every part.
    #[test]
    fn one_pass_opens_each_part_once_and_gathers_what_three_passes_did() {
        let (_run, ex) = run_dir();
        record_campaign(&ex);
        let plan = campaign_plan();
        let all = Wants {
            prompt_tokens: true,
            answers: true,
            rounds: true,
        };
        let mut ev = Evidence::read(std::slice::from_ref(&ex), &plan, all);
        let parts = parts_on_disk(&ex);
        assert!(parts >= 4, "{parts} parts");
        assert_eq!(ev.parts_opened(), parts);

        let mut tokens = PromptTokensMismatch::default();
        for_each_prompt_count(&ex, |p, s| tokens.add(p, s)).expect("prompt counts");
        assert_eq!(tokens.compared, 11, "{tokens:?}");
        assert_eq!(ev.take_prompt_tokens().expect("gathered"), tokens);

        let answers = answers::read_answers(&ex, &plan).expect("answers");
        assert_eq!(answers.len(), 2);
        let gathered = ev.take_answers().expect("gathered");
        assert_eq!(format!("{gathered:?}"), format!("{answers:?}"));

        let rounds = intervals::rounds_by_side(read_row_facts(&ex).expect("rows"));
        assert_eq!(rounds.len(), 2);
        let gathered = ev.take_rounds().expect("gathered");
        assert_eq!(format!("{gathered:?}"), format!("{rounds:?}"));
        // Taken once.
        assert!(matches!(
            ev.take_rounds(),
            Err(EvidenceError::NotGathered("rounds"))
        ));
    }

    /// Nothing asked, nothing opened; a reader not asked for says so when taken.
    #[test]
    fn a_pass_asked_for_nothing_opens_nothing() {
        let (_run, ex) = run_dir();
        record_campaign(&ex);
        let mut ev = Evidence::read(&[ex], &campaign_plan(), Wants::default());
        assert_eq!(ev.parts_opened(), 0);
        assert!(matches!(
            ev.take_answers(),
            Err(EvidenceError::NotGathered("answers"))
        ));
    }

    /// A folder that cannot be listed fails every reader asked for, with the error the
    /// separate reads gave.
    #[test]
    fn a_missing_folder_fails_every_reader_with_its_error() {
        let (run, _ex) = run_dir();
        let gone = run.path().join("nowhere");
        let plan = campaign_plan();
        let all = Wants {
            prompt_tokens: true,
            answers: true,
            rounds: true,
        };
        let mut ev = Evidence::read(std::slice::from_ref(&gone), &plan, all);
        let old = answers::read_answers(&gone, &plan).expect_err("no folder");
        for e in [
            ev.take_answers().map(|_| ()),
            ev.take_rounds().map(|_| ()),
            ev.take_prompt_tokens().map(|_| ()),
        ] {
            let e = e.expect_err("no folder");
            assert!(
                matches!(e, EvidenceError::Read(ReadError::List { .. })),
                "{e:?}"
            );
            assert_eq!(e.to_string(), old.to_string());
        }
    }
}
