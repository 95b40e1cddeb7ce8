//! Reading closed parts back: what the reports need of each row ([`RowFacts`], for
//! `summarize`), and serve's end-of-run latencies. Only closed parts (`part-*.parquet`)
//! are read; a left-over `.inprogress` part is `recover`'s business. Each kind of row is
//! read a batch at a time ([`PartRows`], [`answer_rows`], [`prompt_counts`]), so that one
//! pass over a part (`report::evidence`) can feed several readers.

use std::path::Path;

use arrow_array::{Array, BinaryArray, BooleanArray, Int32Array, Int64Array};
use arrow_array::{ListArray, RecordBatch, StringArray};

use super::parts::optional_column;
pub(crate) use super::parts::{ReadError, closed_parts, column, open_part, read_columns};

use crate::metrics::{Sample, StreamSample};
use crate::model::{Level, Outcome};

/// The highest turn a row may say (a session holds at most 1,024 turns, as a plan
/// writes them; `config::sessions::MAX_TURNS`, which `record` does not import).
const MAX_TURN: i32 = 1024;

/// What the reports need of one recorded row (read back by `summarize`, and by serve for
/// its end-of-run summary).
#[derive(Debug, Clone)]
pub(crate) struct RowFacts {
    pub(crate) phase: String,
    /// The campaign arm (`None` outside campaigns, and in runs recorded before arms).
    pub(crate) arm: Option<String>,
    pub(crate) case_name: Option<String>,
    pub(crate) concurrency: Option<i32>,
    /// Open loop: the round's rate (`None` in closed loops and in runs recorded before
    /// open loops existed).
    pub(crate) target_rate: Option<f64>,
    pub(crate) repetition: Option<i32>,
    pub(crate) method: String,
    /// As recorded (secret query values already redacted).
    pub(crate) url: String,
    pub(crate) status: Option<i32>,
    /// serve: when the client's side of the response ended (µs from t0); `None` in
    /// replay and in runs recorded before the column.
    pub(crate) downstream_done_us: Option<i64>,
    /// The session this exchange is a turn of (`None` outside sessions, and in runs
    /// recorded before the column).
    pub(crate) session_id: Option<String>,
    /// The turn's index in its session, from 1 (`None` outside sessions).
    pub(crate) turn: Option<i32>,
    pub(crate) sample: Sample,
}

impl RowFacts {
    /// A measured row's level: its open loop's rate, else its concurrency.
    pub(crate) fn level(&self) -> Option<Level> {
        match (self.target_rate, self.concurrency) {
            (Some(r), _) => Some(Level::Rate(r)),
            (None, Some(c)) => Some(Level::Concurrency(c.max(0) as usize)),
            (None, None) => None,
        }
    }
}

/// The columns [`PartRows`] reads. `decisions`, `session_id`, `turn`,
/// `cached_prompt_tokens` and `session_lag_us` are read when present: runs recorded
/// before them have none.
pub(crate) const ROW_COLUMNS: [&str; 28] = [
    "downstream_done_us",
    "target_rate_per_second",
    "scheduled_offset_us",
    "arm",
    "method",
    "url",
    "status",
    "exchange_id",
    "decisions",
    "phase",
    "case_name",
    "concurrency",
    "repetition",
    "outcome",
    "start_offset_us",
    "total_us",
    "first_byte_us",
    "connect_us",
    "is_stream",
    "ttft_us",
    "tpot_us",
    "output_tokens",
    "prompt_tokens",
    "content_offsets_us",
    "session_id",
    "turn",
    "cached_prompt_tokens",
    "session_lag_us",
];

/// The column a JSON answer's usage is read from when its row holds no count.
pub(crate) const BODY_COLUMN: &str = "response_body";

/// Read every closed part (`part-*.parquet`) of an `exchanges/` directory, in file order.
/// Left-over `.inprogress` parts are not read (see `recover`).
pub(crate) fn read_row_facts(exchanges: &Path) -> Result<Vec<RowFacts>, ReadError> {
    let mut out = Vec::new();
    for_each_row(exchanges, |f| out.push(f))?;
    Ok(out)
}

/// Hand each row of the closed parts to `visit`, in file order, without holding them.
pub(crate) fn for_each_row(
    exchanges: &Path,
    mut visit: impl FnMut(RowFacts),
) -> Result<(), ReadError> {
    let mut opened = 0;
    for part in closed_parts(exchanges)? {
        let mut rows = PartRows::new(false);
        for batch in open_part(&part, &ROW_COLUMNS, &mut opened)? {
            rows.batch(&batch.map_err(|e| ReadError::batch(&part, e))?, &part)?;
        }
        rows.finish(&part, &mut opened)?
            .into_iter()
            .for_each(&mut visit);
    }
    Ok(())
}

/// One part's rows as they are read, batch by batch ([`ROW_COLUMNS`]), held until the
/// part ends: the JSON answers without a recorded count (runs recorded before replay,
/// then serve, wrote a JSON answer's usage; and answers that report none) have theirs
/// read from `response_body`, in the same batches when they hold it, else in one more
/// pass over that column alone.
#[derive(Debug)]
pub(crate) struct PartRows {
    /// The batches hold [`BODY_COLUMN`].
    bodies: bool,
    /// The last row's number in its file (from 1), for a refusal to name it.
    row: u64,
    held: Vec<RowFacts>,
    /// Rows of `held` whose count is still to be read from their body.
    uncounted: Vec<usize>,
    /// Why the batches' bodies could not be read (they were to hold them).
    body_problem: Option<ReadError>,
}

impl PartRows {
    /// A part's rows, read from batches that hold [`BODY_COLUMN`] (`bodies`) or not.
    pub(crate) fn new(bodies: bool) -> PartRows {
        PartRows {
            bodies,
            row: 0,
            held: Vec::new(),
            uncounted: Vec::new(),
            body_problem: None,
        }
    }

    /// Read one batch's rows; a row no recorder writes refuses the part.
    pub(crate) fn batch(&mut self, b: &RecordBatch, part: &Path) -> Result<(), ReadError> {
        let cols = RowColumns::of(b, part)?;
        let (body, mut problem) = match self
            .bodies
            .then(|| column::<BinaryArray>(b, BODY_COLUMN, part))
        {
            Some(Ok(body)) => (Some(body), None),
            Some(Err(e)) => (None, Some(e)),
            None => (None, None),
        };
        for i in 0..b.num_rows() {
            self.row += 1;
            let (mut facts, raw_decisions) = cols.facts(i, part)?;
            if let Some(why) = impossible(&facts, raw_decisions) {
                return Err(ReadError::Impossible {
                    part: part.to_path_buf(),
                    row: self.row,
                    exchange_id: facts.sample.exchange_id,
                    why,
                });
            }
            let s = &mut facts.sample;
            if s.usage_tokens.is_none() && s.stream.is_none() && s.outcome == Outcome::Ok {
                match body {
                    Some(body) if body.is_valid(i) => count_body(s, body.value(i)),
                    Some(_) => {}
                    None => {
                        self.uncounted.push(self.held.len());
                        if self.body_problem.is_none() {
                            self.body_problem = problem.take();
                        }
                    }
                }
            }
            self.held.push(facts);
        }
        Ok(())
    }

    /// The part's rows, their counts read from the bodies they were missing.
    pub(crate) fn finish(
        mut self,
        part: &Path,
        opened: &mut usize,
    ) -> Result<Vec<RowFacts>, ReadError> {
        if !self.uncounted.is_empty() {
            if let Some(e) = self.body_problem {
                return Err(e);
            }
            count_from_bodies(part, &mut self.held, &self.uncounted, opened)?;
        }
        Ok(self.held)
    }
}

/// The columns of one batch that [`RowFacts`] are made of.
struct RowColumns<'a> {
    method: &'a StringArray,
    url: &'a StringArray,
    status: &'a Int32Array,
    exchange_id: &'a Int64Array,
    arm: Option<&'a StringArray>,
    decisions: Option<&'a Int64Array>,
    rate: Option<&'a arrow_array::Float64Array>,
    scheduled: Option<&'a Int64Array>,
    downstream: Option<&'a Int64Array>,
    phase: &'a StringArray,
    case: &'a StringArray,
    conc: &'a Int32Array,
    rep: &'a Int32Array,
    outcome: &'a StringArray,
    start: &'a Int64Array,
    total: &'a Int64Array,
    fb: &'a Int64Array,
    connect: &'a Int64Array,
    is_stream: &'a BooleanArray,
    ttft: &'a Int64Array,
    tpot: &'a Int64Array,
    out_tok: &'a Int64Array,
    prompt: &'a Int64Array,
    content: &'a ListArray,
    session: Option<&'a StringArray>,
    turn: Option<&'a Int32Array>,
    cached: Option<&'a Int64Array>,
    session_lag: Option<&'a Int64Array>,
}

/// Row `i` of an optional-valued column.
fn opt(a: &Int64Array, i: usize) -> Option<i64> {
    a.is_valid(i).then(|| a.value(i))
}

impl<'a> RowColumns<'a> {
    fn of(b: &'a RecordBatch, part: &Path) -> Result<RowColumns<'a>, ReadError> {
        Ok(RowColumns {
            method: column(b, "method", part)?,
            url: column(b, "url", part)?,
            status: column(b, "status", part)?,
            exchange_id: column(b, "exchange_id", part)?,
            arm: optional_column(b, "arm"),
            decisions: optional_column(b, "decisions"),
            rate: optional_column(b, "target_rate_per_second"),
            scheduled: optional_column(b, "scheduled_offset_us"),
            downstream: optional_column(b, "downstream_done_us"),
            phase: column(b, "phase", part)?,
            case: column(b, "case_name", part)?,
            conc: column(b, "concurrency", part)?,
            rep: column(b, "repetition", part)?,
            outcome: column(b, "outcome", part)?,
            start: column(b, "start_offset_us", part)?,
            total: column(b, "total_us", part)?,
            fb: column(b, "first_byte_us", part)?,
            connect: column(b, "connect_us", part)?,
            is_stream: column(b, "is_stream", part)?,
            ttft: column(b, "ttft_us", part)?,
            tpot: column(b, "tpot_us", part)?,
            out_tok: column(b, "output_tokens", part)?,
            prompt: column(b, "prompt_tokens", part)?,
            content: column(b, "content_offsets_us", part)?,
            session: optional_column(b, "session_id"),
            turn: optional_column(b, "turn"),
            cached: optional_column(b, "cached_prompt_tokens"),
            session_lag: optional_column(b, "session_lag_us"),
        })
    }

    /// Row `i`'s facts and its raw `decisions` (checked by [`impossible`]).
    fn facts(&self, i: usize, part: &Path) -> Result<(RowFacts, Option<i64>), ReadError> {
        let outcome = Outcome::ALL
            .into_iter()
            .find(|o| o.as_str() == self.outcome.value(i))
            .ok_or_else(|| ReadError::UnknownOutcome {
                part: part.to_path_buf(),
                outcome: self.outcome.value(i).to_string(),
            })?;
        let raw_decisions = self.decisions.and_then(|d| opt(d, i));
        let facts = RowFacts {
            phase: self.phase.value(i).to_string(),
            arm: self
                .arm
                .filter(|a| a.is_valid(i))
                .map(|a| a.value(i).to_string()),
            case_name: self
                .case
                .is_valid(i)
                .then(|| self.case.value(i).to_string()),
            concurrency: self.conc.is_valid(i).then(|| self.conc.value(i)),
            target_rate: self.rate.filter(|r| r.is_valid(i)).map(|r| r.value(i)),
            repetition: self.rep.is_valid(i).then(|| self.rep.value(i)),
            method: self.method.value(i).to_string(),
            url: self.url.value(i).to_string(),
            status: self.status.is_valid(i).then(|| self.status.value(i)),
            downstream_done_us: self.downstream.and_then(|d| opt(d, i)),
            session_id: self
                .session
                .filter(|a| a.is_valid(i))
                .map(|a| a.value(i).to_string()),
            turn: self.turn.filter(|t| t.is_valid(i)).map(|t| t.value(i)),
            sample: Sample {
                exchange_id: self.exchange_id.value(i),
                decisions: raw_decisions.map(|d| d.max(0) as u64),
                outcome,
                start_offset_us: self.start.value(i),
                total_us: opt(self.total, i),
                first_byte_us: opt(self.fb, i),
                connect_us: opt(self.connect, i),
                stream: self.stream(i),
                usage_tokens: self.usage(i),
                cached_prompt_tokens: self.cached.and_then(|c| opt(c, i)),
                session_lag_us: self.session_lag.and_then(|c| opt(c, i)),
                turn: self
                    .turn
                    .filter(|t| t.is_valid(i))
                    .and_then(|t| u16::try_from(t.value(i)).ok()),
                failure: None,
                scheduled_offset_us: self.scheduled.and_then(|s| opt(s, i)),
            },
        };
        Ok((facts, raw_decisions))
    }

    /// Row `i`'s stream measures (`None` for a JSON answer).
    fn stream(&self, i: usize) -> Option<StreamSample> {
        self.is_stream.value(i).then(|| {
            let offsets = content_offsets(self.content, i);
            StreamSample {
                ttft_us: opt(self.ttft, i),
                tpot_us: opt(self.tpot, i),
                output_tokens: opt(self.out_tok, i),
                prompt_tokens: opt(self.prompt, i),
                gaps_us: offsets
                    .windows(2)
                    .map(|w| w[1].saturating_sub(w[0]))
                    .collect(),
                bundled: crate::model::bundled(&offsets),
            }
        })
    }

    /// A JSON answer's usage, as recorded in the token columns.
    fn usage(&self, i: usize) -> Option<(Option<i64>, i64)> {
        (!self.is_stream.value(i))
            .then(|| opt(self.out_tok, i).map(|n| (opt(self.prompt, i), n)))
            .flatten()
    }
}

/// A JSON answer's usage read from its body into `s` (its cached prompt tokens too,
/// unless its row held them), when its counts are ones a row may hold.
fn count_body(s: &mut Sample, body: &[u8]) {
    let usage = crate::model::answer_usage(body);
    s.usage_tokens = usage.map(|u| u.tokens).filter(|(p, n)| {
        (0..=MAX_COUNT).contains(n) && p.is_none_or(|p| (0..=MAX_COUNT).contains(&p))
    });
    if s.cached_prompt_tokens.is_none() && s.usage_tokens.is_some() {
        s.cached_prompt_tokens = usage.and_then(|u| u.cached_prompt);
    }
}

/// Read the `usage` of the JSON answers at `rows` (indices into the part's rows, in
/// order) from their recorded `response_body`: one more pass over that column alone.
fn count_from_bodies(
    part: &Path,
    held: &mut [RowFacts],
    rows: &[usize],
    opened: &mut usize,
) -> Result<(), ReadError> {
    let mut want = rows.iter().copied().peekable();
    let mut base = 0usize;
    for batch in open_part(part, &[BODY_COLUMN], opened)? {
        let b = batch.map_err(|e| ReadError::batch(part, e))?;
        let body = column::<BinaryArray>(&b, BODY_COLUMN, part)?;
        while let Some(&r) = want.peek() {
            if r >= base + b.num_rows() {
                break;
            }
            want.next();
            if body.is_valid(r - base) {
                count_body(&mut held[r].sample, body.value(r - base));
            }
        }
        base += b.num_rows();
    }
    Ok(())
}

/// The longest duration a row may hold, µs (2^42: about 51 days). Every duration of an
/// exchange (`total_us`, `ttft_us`, a gap between content events, ...) lies in
/// `0..=MAX_DURATION_US`; sums of them over any run's rows stay far inside an `i64`.
pub(crate) const MAX_DURATION_US: i64 = 1 << 42;
/// The latest offset from the run's start a row may hold, µs (2^50: about 35 years).
pub(crate) const MAX_OFFSET_US: i64 = 1 << 50;
/// The largest count a row may hold (tokens, decisions): 2^40.
pub(crate) const MAX_COUNT: i64 = 1 << 40;

/// What makes a row read back impossible (a value no recorder writes: a negative or
/// absurd duration, offset or count), naming the column; `None` when it is sound. The
/// reports size nothing by these values, but they sum, subtract and bin them: a value
/// out of these ranges would overflow or draw nonsense, so the run is refused instead.
fn impossible(f: &RowFacts, decisions: Option<i64>) -> Option<String> {
    let s = &f.sample;
    let st = s.stream.as_ref();
    let durations = [
        ("total_us", s.total_us),
        ("first_byte_us", s.first_byte_us),
        ("connect_us", s.connect_us),
        ("downstream_done_us", f.downstream_done_us),
        ("ttft_us", st.and_then(|t| t.ttft_us)),
        ("tpot_us", st.and_then(|t| t.tpot_us)),
        ("session_lag_us", s.session_lag_us),
    ];
    let counts = [
        (
            "output_tokens",
            st.map_or(s.usage_tokens.map(|u| u.1), |t| t.output_tokens),
        ),
        (
            "prompt_tokens",
            st.map_or(s.usage_tokens.and_then(|u| u.0), |t| t.prompt_tokens),
        ),
        ("decisions", decisions),
        ("cached_prompt_tokens", s.cached_prompt_tokens),
    ];
    let out_of = |v: i64, lo: i64, hi: i64| !(lo..=hi).contains(&v);
    for (column, v) in durations {
        if let Some(v) = v.filter(|&v| out_of(v, 0, MAX_DURATION_US)) {
            return Some(format!(
                "{column} is {v} µs, an impossible duration (0 to {MAX_DURATION_US} µs, about 51 days)"
            ));
        }
    }
    let offsets = [
        ("start_offset_us", Some(s.start_offset_us), 0),
        ("scheduled_offset_us", s.scheduled_offset_us, -MAX_OFFSET_US),
    ];
    for (column, v, lo) in offsets {
        if let Some(v) = v.filter(|&v| out_of(v, lo, MAX_OFFSET_US)) {
            return Some(format!(
                "{column} is {v} µs, an impossible offset from the run's start ({lo} to {MAX_OFFSET_US} µs, about 35 years)"
            ));
        }
    }
    for (column, v) in counts {
        if let Some(v) = v.filter(|&v| out_of(v, 0, MAX_COUNT)) {
            return Some(format!(
                "{column} is {v}, an impossible count (0 to {MAX_COUNT})"
            ));
        }
    }
    match (&f.session_id, f.turn) {
        (Some(_), Some(t)) if !(1..=MAX_TURN).contains(&t) => {
            return Some(format!(
                "turn is {t}, an impossible turn (they count from 1 to {MAX_TURN}, a session's most)"
            ));
        }
        (Some(_), None) | (None, Some(_)) => {
            return Some("session_id and turn are not both null or both set".to_string());
        }
        _ => {}
    }
    let gaps = st.map_or(&[][..], |t| &t.gaps_us[..]);
    if let Some((k, g)) = gaps
        .iter()
        .enumerate()
        .find(|(_, g)| out_of(**g, 0, MAX_DURATION_US))
    {
        return Some(format!(
            "content_offsets_us has event {} stamped {g} µs after event {k}, an impossible gap (event stamps never go back; 0 to {MAX_DURATION_US} µs)",
            k + 1
        ));
    }
    None
}

/// The gaps between consecutive content events of row `i` (inter-token latencies).
fn content_offsets(content: &ListArray, i: usize) -> Vec<i64> {
    if !content.is_valid(i) {
        return Vec::new();
    }
    let v = content.value(i);
    v.as_any()
        .downcast_ref::<Int64Array>()
        .map(|a| a.values().to_vec())
        .unwrap_or_default()
}

/// One measured `ok` row's answer and where it sits in the plan (for drift).
#[derive(Debug, Clone)]
pub(crate) struct AnswerRow {
    pub(crate) arm: Option<String>,
    pub(crate) case_name: String,
    pub(crate) variant: Option<String>,
    pub(crate) concurrency: i32,
    pub(crate) repetition: i32,
    pub(crate) dispatch_index: i64,
    /// A session's turn, from 1 (`None` outside sessions and in runs before the column).
    pub(crate) turn: Option<i32>,
    pub(crate) is_stream: bool,
    /// The recorded response body (at most `--max-record-body` bytes).
    pub(crate) body: Vec<u8>,
    /// The recording holds fewer bytes than the worker sent.
    pub(crate) truncated: bool,
    /// `ok`; else the row failed its oracle (`correctness`).
    pub(crate) ok: bool,
    /// The oracle's judgment, whatever the lane made of it (a performance-fit arm's
    /// mismatch is `ok` but did not pass): `oracle_passed` (`None` where nothing was
    /// judged, e.g. a body cut by `--max-record-body`), or in runs recorded before that
    /// column `ok` without an `oracle_mismatch_pointer`.
    pub(crate) passed: Option<bool>,
}

/// The columns [`answer_rows`] reads.
pub(crate) const ANSWER_COLUMNS: [&str; 14] = [
    "arm",
    "turn",
    "oracle_passed",
    "oracle_mismatch_pointer",
    "phase",
    "outcome",
    "case_name",
    "variant",
    "concurrency",
    "repetition",
    "dispatch_index",
    "is_stream",
    "response_body",
    "response_body_truncated",
];

/// Hand each measured-phase row of the closed parts that was `ok` or failed its oracle
/// (`correctness`) to `visit`, with its response body, in file order.
pub(crate) fn for_each_measured_answer(
    exchanges: &Path,
    mut visit: impl FnMut(AnswerRow),
) -> Result<(), ReadError> {
    let mut opened = 0;
    for part in closed_parts(exchanges)? {
        for batch in open_part(&part, &ANSWER_COLUMNS, &mut opened)? {
            let b = batch.map_err(|e| ReadError::batch(&part, e))?;
            answer_rows(&b, &part, &mut visit)?;
        }
    }
    Ok(())
}

/// [`for_each_measured_answer`]'s rows of one batch ([`ANSWER_COLUMNS`]) read from `part`.
pub(crate) fn answer_rows(
    b: &RecordBatch,
    part: &Path,
    visit: &mut impl FnMut(AnswerRow),
) -> Result<(), ReadError> {
    let arm = optional_column::<StringArray>(b, "arm");
    let phase = column::<StringArray>(b, "phase", part)?;
    let outcome = column::<StringArray>(b, "outcome", part)?;
    let case = column::<StringArray>(b, "case_name", part)?;
    let variant = column::<StringArray>(b, "variant", part)?;
    let conc = column::<Int32Array>(b, "concurrency", part)?;
    let rep = column::<Int32Array>(b, "repetition", part)?;
    let index = column::<Int64Array>(b, "dispatch_index", part)?;
    let is_stream = column::<BooleanArray>(b, "is_stream", part)?;
    let body = column::<BinaryArray>(b, "response_body", part)?;
    let truncated = column::<BooleanArray>(b, "response_body_truncated", part)?;
    let judged = optional_column::<BooleanArray>(b, "oracle_passed");
    let pointer = column::<StringArray>(b, "oracle_mismatch_pointer", part)?;
    let turn = optional_column::<Int32Array>(b, "turn");
    for i in 0..b.num_rows() {
        let ok = outcome.value(i) == "ok";
        let passed = match judged {
            Some(j) => j.is_valid(i).then(|| j.value(i)),
            None => Some(ok && !pointer.is_valid(i)),
        };
        if phase.value(i) != "measured"
            || !(ok || outcome.value(i) == "correctness")
            || !case.is_valid(i)
            || !conc.is_valid(i)
            || !rep.is_valid(i)
        {
            continue;
        }
        visit(AnswerRow {
            arm: arm
                .filter(|a| a.is_valid(i))
                .map(|a| a.value(i).to_string()),
            case_name: case.value(i).to_string(),
            variant: variant.is_valid(i).then(|| variant.value(i).to_string()),
            concurrency: conc.value(i),
            repetition: rep.value(i),
            dispatch_index: index.value(i),
            turn: turn.filter(|t| t.is_valid(i)).map(|t| t.value(i)),
            is_stream: is_stream.value(i),
            body: body.value(i).to_vec(),
            truncated: truncated.value(i),
            ok,
            passed,
        });
    }
    Ok(())
}

/// One recorded exchange as `freeze` reads it: what was sent and what came back, with
/// the flags that say whether the recording holds all of it.
#[derive(Debug, Clone)]
pub(crate) struct ExchangeRow {
    /// Unique within a run's (or a shard's) `exchanges/`.
    pub(crate) exchange_id: i64,
    /// When it started, on the run's clock (µs).
    pub(crate) start_offset_us: i64,
    pub(crate) phase: String,
    pub(crate) arm: Option<String>,
    pub(crate) outcome: String,
    pub(crate) method: String,
    /// As recorded: secret query values are `<redacted>`.
    pub(crate) url: String,
    /// As recorded: secret values are `<redacted>`; names lower-case, duplicates kept.
    pub(crate) request_headers: Vec<(String, Vec<u8>)>,
    pub(crate) request_body: Vec<u8>,
    pub(crate) request_body_truncated: bool,
    pub(crate) status: Option<i32>,
    pub(crate) response_headers: Vec<(String, Vec<u8>)>,
    pub(crate) response_body: Vec<u8>,
    pub(crate) response_body_truncated: bool,
    pub(crate) is_stream: bool,
    /// The replayed plan's `prompt_tokens` for this request (`None` in serve, and in
    /// runs recorded before the column).
    pub(crate) prompt_tokens_planned: Option<i64>,
    /// The replayed plan's variant name (`None` in serve, and for a case without
    /// variants).
    pub(crate) variant: Option<String>,
}

/// Hand every row of the closed parts to `visit` with its request and response and the
/// part it is in, in file order (each part's rows in exchange order), without holding
/// more than one batch.
pub(crate) fn for_each_exchange(
    exchanges: &Path,
    mut visit: impl FnMut(&Path, ExchangeRow),
) -> Result<(), ReadError> {
    const WANT: [&str; 17] = [
        "exchange_id",
        "start_offset_us",
        "prompt_tokens_planned",
        "variant",
        "phase",
        "arm",
        "outcome",
        "method",
        "url",
        "request_headers",
        "request_body",
        "request_body_truncated",
        "status",
        "response_headers",
        "response_body",
        "response_body_truncated",
        "is_stream",
    ];
    for part in closed_parts(exchanges)? {
        let header_list = |list: &ListArray, i: usize| {
            headers(list, i).map_err(|what| ReadError::Headers {
                part: part.clone(),
                what,
            })
        };
        for batch in read_columns(&part, &WANT)? {
            let b = batch.map_err(|e| ReadError::batch(&part, e))?;
            let phase = column::<StringArray>(&b, "phase", &part)?;
            let arm = optional_column::<StringArray>(&b, "arm");
            let outcome = column::<StringArray>(&b, "outcome", &part)?;
            let method = column::<StringArray>(&b, "method", &part)?;
            let url = column::<StringArray>(&b, "url", &part)?;
            let req_h = column::<ListArray>(&b, "request_headers", &part)?;
            let req_b = column::<BinaryArray>(&b, "request_body", &part)?;
            let req_t = column::<BooleanArray>(&b, "request_body_truncated", &part)?;
            let status = column::<Int32Array>(&b, "status", &part)?;
            let resp_h = column::<ListArray>(&b, "response_headers", &part)?;
            let resp_b = column::<BinaryArray>(&b, "response_body", &part)?;
            let resp_t = column::<BooleanArray>(&b, "response_body_truncated", &part)?;
            let is_stream = column::<BooleanArray>(&b, "is_stream", &part)?;
            let planned = optional_column::<Int64Array>(&b, "prompt_tokens_planned");
            let variant = optional_column::<StringArray>(&b, "variant");
            let id = column::<Int64Array>(&b, "exchange_id", &part)?;
            let start = column::<Int64Array>(&b, "start_offset_us", &part)?;
            for i in 0..b.num_rows() {
                visit(
                    &part,
                    ExchangeRow {
                        exchange_id: id.value(i),
                        start_offset_us: start.value(i),
                        prompt_tokens_planned: planned
                            .filter(|p| p.is_valid(i))
                            .map(|p| p.value(i)),
                        variant: variant
                            .filter(|v| v.is_valid(i))
                            .map(|v| v.value(i).to_string()),
                        phase: phase.value(i).to_string(),
                        arm: arm
                            .filter(|a| a.is_valid(i))
                            .map(|a| a.value(i).to_string()),
                        outcome: outcome.value(i).to_string(),
                        method: method.value(i).to_string(),
                        url: url.value(i).to_string(),
                        request_headers: header_list(req_h, i)?,
                        request_body: req_b.value(i).to_vec(),
                        request_body_truncated: req_t.value(i),
                        status: status.is_valid(i).then(|| status.value(i)),
                        response_headers: header_list(resp_h, i)?,
                        response_body: resp_b.value(i).to_vec(),
                        response_body_truncated: resp_t.value(i),
                        is_stream: is_stream.value(i),
                    },
                );
            }
        }
    }
    Ok(())
}

/// Row `i` of a headers column (`list<struct<name: utf8, value: binary>>`).
fn headers(list: &ListArray, i: usize) -> Result<Vec<(String, Vec<u8>)>, &'static str> {
    use arrow_array::StructArray;
    if !list.is_valid(i) {
        return Ok(Vec::new());
    }
    let entries = list.value(i);
    let s = entries
        .as_any()
        .downcast_ref::<StructArray>()
        .ok_or("a headers column is not a list of structs")?;
    let names = s
        .column_by_name("name")
        .and_then(|c| c.as_any().downcast_ref::<StringArray>())
        .ok_or("a headers column has no utf8 `name`")?;
    let values = s
        .column_by_name("value")
        .and_then(|c| c.as_any().downcast_ref::<BinaryArray>())
        .ok_or("a headers column has no binary `value`")?;
    Ok((0..s.len())
        .map(|k| (names.value(k).to_string(), values.value(k).to_vec()))
        .collect())
}

/// The columns [`prompt_counts`] reads.
pub(crate) const PROMPT_COLUMNS: [&str; 5] = [
    "outcome",
    "prompt_tokens_planned",
    "prompt_tokens",
    "is_stream",
    "response_body",
];

/// Hand `visit` the (planned, served) input tokens of every `ok` row of one batch
/// ([`PROMPT_COLUMNS`]) read from `part` that has both: the plan's
/// `prompt_tokens_planned`, and the server's `usage.prompt_tokens` (a stream's
/// `prompt_tokens` column, else the JSON answer's own `usage`).
pub(crate) fn prompt_counts(
    b: &RecordBatch,
    part: &Path,
    visit: &mut impl FnMut(i64, i64),
) -> Result<(), ReadError> {
    // Parts written before the column have no planned counts.
    let Some(planned) = optional_column::<Int64Array>(b, "prompt_tokens_planned") else {
        return Ok(());
    };
    let outcome = column::<StringArray>(b, "outcome", part)?;
    let streamed = column::<Int64Array>(b, "prompt_tokens", part)?;
    let is_stream = column::<BooleanArray>(b, "is_stream", part)?;
    let body = column::<BinaryArray>(b, "response_body", part)?;
    for i in 0..b.num_rows() {
        if !planned.is_valid(i) || outcome.value(i) != Outcome::Ok.as_str() {
            continue;
        }
        let served = if streamed.is_valid(i) {
            Some(streamed.value(i))
        } else if !is_stream.value(i) {
            serde_json::from_slice::<serde_json::Value>(body.value(i))
                .ok()
                .and_then(|v| v.pointer("/usage/prompt_tokens").and_then(|n| n.as_i64()))
        } else {
            None
        };
        if let Some(served) = served {
            visit(planned.value(i), served);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::tests_support::{row, run_dir};
    use crate::record::{ExchangeRecord, Recorder, RecorderOptions};

    /// A JSON answer's usage reaches the reports: from the token columns where the row
    /// holds it, else (serve, runs recorded before) from its response body; a stream's
    /// count stays its own and a failure's body is not read.
    #[test]
    fn a_json_answers_tokens_come_from_its_columns_or_its_body() {
        let (_run, ex) = run_dir();
        let rec = Recorder::start(RecorderOptions::new(ex.clone())).unwrap();
        let answer: &'static [u8] =
            br#"{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":7}}"#;
        let mut recorded = row(0, b"");
        recorded.answer_usage = Some((Some(5), 11));
        let mut from_body = row(1, b"");
        from_body.response_body = bytes::Bytes::from_static(answer);
        let mut failed = row(2, b"");
        failed.response_body = bytes::Bytes::from_static(answer);
        failed.outcome = Outcome::Http;
        let mut not_json = row(3, b"");
        not_json.response_body = bytes::Bytes::from_static(b"usage: 7");
        for r in [recorded, from_body, failed, not_json] {
            assert!(rec.submit_now(r).unwrap().is_none());
        }
        rec.finish().unwrap();
        let usage: Vec<_> = read_row_facts(&ex)
            .unwrap()
            .into_iter()
            .map(|f| f.sample.usage_tokens)
            .collect();
        assert_eq!(usage, [Some((Some(5), 11)), Some((Some(3), 7)), None, None]);
    }

    /// A turn's session and index and the cached prompt tokens are read back as recorded;
    /// a JSON answer read from its body (runs recorded before the column) gives its own
    /// cached count, one whose row holds a count keeps it, and unknown stays `None`.
    #[test]
    fn sessions_turns_and_cached_prompt_tokens_are_read_back() {
        let (_run, ex) = run_dir();
        let rec = Recorder::start(RecorderOptions::new(ex.clone())).unwrap();
        let mut turn = row(0, b"");
        turn.session_id = Some("s1".into());
        turn.turn = Some(2);
        turn.cached_prompt_tokens = Some(7);
        turn.answer_usage = Some((Some(9), 2));
        let mut from_body = row(1, b"");
        from_body.response_body = bytes::Bytes::from_static(
            br#"{"usage":{"prompt_tokens":9,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":4}}}"#,
        );
        let mut unknown = row(2, b"");
        unknown.answer_usage = Some((Some(9), 2));
        for r in [turn, from_body, unknown] {
            assert!(rec.submit_now(r).unwrap().is_none());
        }
        rec.finish().unwrap();
        let got: Vec<_> = read_row_facts(&ex)
            .unwrap()
            .into_iter()
            .map(|f| (f.session_id, f.turn, f.sample.cached_prompt_tokens))
            .collect();
        assert_eq!(
            got,
            [
                (Some("s1".to_string()), Some(2), Some(7)),
                (None, None, Some(4)),
                (None, None, None)
            ]
        );
    }

    /// A turn outside a session, a session without a turn, a turn below 1 and a negative
    /// cached count are values no recorder writes: the part is refused, naming them.
    #[test]
    fn impossible_turns_and_cached_counts_are_refused() {
        type Spoil = fn(&mut ExchangeRecord);
        let cases: [(Spoil, &str); 4] = [
            (|r| r.turn = Some(1), "session_id and turn"),
            (|r| r.session_id = Some("s".into()), "session_id and turn"),
            (
                |r| {
                    r.session_id = Some("s".into());
                    r.turn = Some(0);
                },
                "turn is 0",
            ),
            (
                |r| r.cached_prompt_tokens = Some(-1),
                "cached_prompt_tokens is -1",
            ),
        ];
        for (spoil, says) in cases {
            let (_run, ex) = run_dir();
            let rec = Recorder::start(RecorderOptions::new(ex.clone())).unwrap();
            let mut r = row(0, b"");
            spoil(&mut r);
            assert!(rec.submit_now(r).unwrap().is_none());
            rec.finish().unwrap();
            let e = read_row_facts(&ex).unwrap_err().to_string();
            assert!(e.contains(says), "{e}");
        }
    }
}
