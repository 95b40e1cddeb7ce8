//! A trace load (`load.mode "trace"`): where its entries are ([`TraceSource`]), its knobs
//! (speed-up, window, warm-up), its entries once read, and what a round of it sends
//! ([`TraceLoad::picks`]): the window's entries at their offsets over the speed-up, a
//! shard's by session or index. Validated here with the rest of `load` (`load.rs`).

use std::sync::Arc;

use serde_json::{Map, Value};

use super::json::Validator;
use super::trace::{Send, Trace};
use crate::oracle::json_kind;

/// Where a trace plan's entries are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TraceSource {
    /// A JSON Lines file named relative to the plan's folder, its SHA-256 pinned.
    File { path: String, sha256: String },
    /// `load.trace.entries` in the plan itself.
    Inline,
}

/// A trace load: its source, its entries once read, and the replay's knobs.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TraceLoad {
    pub(crate) source: TraceSource,
    /// Every gap divided by this (2: twice as fast).
    pub(crate) speedup: f64,
    /// The window of the trace's own clock replayed: `[start_us, end_us)`.
    pub(crate) start_us: u64,
    pub(crate) end_us: Option<u64>,
    /// The window's first microseconds (trace clock) sent as warm-up, excluded.
    pub(crate) warmup_us: u64,
    /// `load.trace.synthetic` as written (the walk checks it with the cases).
    pub(crate) synthetic: Option<Value>,
    /// What synthetic entries are checked against and made from (set by the walk, with
    /// the cases).
    pub(crate) synthetic_rules: Option<super::trace::SyntheticRules>,
    pub(crate) synthetic_spec: Option<Arc<super::trace_text::SyntheticSpec>>,
    /// The entries (`None` until a file trace is read: [`Load::attach_trace`]); set
    /// only through [`TraceLoad::set_entries`], which counts the window once.
    pub(crate) entries: Option<Arc<Trace>>,
    /// The level ([`TraceLoad::rate`]), each case's measured entries in the window and
    /// the window's span, counted once when the entries are set.
    counted: Counted,
}

/// One send of a trace round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pick {
    /// Microseconds from the round's start: `(entry offset - window start) / speedup`,
    /// rounded once.
    pub(crate) offset_us: u64,
    /// The entry's index in the trace.
    pub(crate) entry: u32,
    /// Within the window's first `warmup_seconds`: sent as warm-up, not measured.
    pub(crate) warmup: bool,
}

impl TraceLoad {
    /// A trace load as validated: its source, speed-up, window `(start, end)` and warm-up
    /// (µs on the trace's clock), and its `synthetic` as written; entries come later.
    pub(super) fn new(
        source: TraceSource,
        speedup: f64,
        (start_us, end_us): (u64, Option<u64>),
        warmup_us: u64,
        synthetic: Option<Value>,
    ) -> TraceLoad {
        TraceLoad {
            source,
            speedup,
            start_us,
            end_us,
            warmup_us,
            synthetic,
            synthetic_rules: None,
            synthetic_spec: None,
            entries: None,
            counted: Counted::default(),
        }
    }

    /// Set the entries, and count the window once: the level and each case's measured
    /// entries (`cases`: the plan's case count).
    pub(crate) fn set_entries(&mut self, trace: Trace, cases: usize) {
        self.entries = Some(Arc::new(trace));
        let picks = self.picks(None);
        let mut per_case = vec![0u64; cases];
        for p in picks.iter().filter(|p| !p.warmup) {
            if let Some(n) = per_case.get_mut(self.case_of(p.entry)) {
                *n += self.requests_of(p.entry);
            }
        }
        // A session run's later turns may come after the window's last send.
        let span_us = picks
            .iter()
            .map(|p| self.last_offset_of(p))
            .max()
            .unwrap_or(0);
        self.counted = Counted {
            rate: rate_of(&picks),
            per_case,
            span_us,
        };
    }

    /// Why the window cannot be a round: it holds no measured entry (empty, or all within
    /// the warm-up), or a round of it would last longer than [`MAX_TRACE_ROUND_SECONDS`].
    pub(crate) fn window_problem(&self) -> Option<String> {
        let n = self.entries.as_ref()?.entries.len();
        let measured: u64 = self.counted.per_case.iter().sum();
        let window = format!(
            "the window [{} s, {}) of the trace's {n} entries",
            self.start_us as f64 / 1e6,
            self.end_us
                .map_or("the end".into(), |e| format!("{} s", e as f64 / 1e6))
        );
        if measured == 0 {
            return Some(format!(
                "{window} holds no entry past load.warmup_seconds ({} s): a round would measure nothing; move the window or shorten the warm-up",
                self.warmup_us as f64 / 1e6
            ));
        }
        let secs = self.counted.span_us as f64 / 1e6;
        (secs > MAX_TRACE_ROUND_SECONDS).then(|| {
            format!(
                "{window} would take {secs:.0} s a round at speedup {}, more than {MAX_TRACE_ROUND_SECONDS} s (31 days); replay a window of it or raise load.speedup",
                self.speedup
            )
        })
    }

    /// The last offset in a round of the whole window (every shard's): its last send's,
    /// or a later turn's its session runs give. A shard's waves keep the shared timetable
    /// by it, and a round longer than [`MAX_TRACE_ROUND_SECONDS`] is refused by it.
    pub(crate) fn span_us(&self) -> u64 {
        self.counted.span_us
    }

    /// Where the trace is, as config.json and the workload record it: the file and its
    /// SHA-256, or the inline entries' count and the SHA-256 of their compact JSON.
    pub(super) fn to_json(&self) -> Value {
        let mut m = Map::new();
        match &self.source {
            TraceSource::File { path, sha256 } => {
                m.insert("file".into(), path.clone().into());
                m.insert("sha256".into(), sha256.clone().into());
            }
            TraceSource::Inline => {
                let t = self.entries.as_ref();
                m.insert("entries".into(), t.map_or(0, |t| t.entries.len()).into());
                m.insert(
                    "sha256".into(),
                    t.map_or(String::new(), |t| t.sha256.clone()).into(),
                );
            }
        }
        // As validated: its canonical form.
        if let Some(s) = &self.synthetic_spec {
            m.insert("synthetic".into(), s.to_json());
        }
        Value::Object(m)
    }

    /// The sends of one round: the window's entries in order, as shard `(i, n)` keeps
    /// them (an entry with a session key goes to the shard its key's hash names, so a
    /// session stays on one generator; others by their index in the window modulo `n`).
    pub(crate) fn picks(&self, shard: Option<(usize, usize)>) -> Vec<Pick> {
        self.picks_iter(shard).collect()
    }

    /// The first send of a round (readiness sends it), found without the others.
    pub(crate) fn first_pick(&self) -> Option<Pick> {
        self.picks_iter(None).next()
    }

    /// [`Self::picks`], one at a time.
    fn picks_iter(&self, shard: Option<(usize, usize)>) -> impl Iterator<Item = Pick> + '_ {
        let entries = self.entries.as_deref().map_or(&[][..], |t| &t.entries[..]);
        // A later turn's entry is its run's to send, not a send of its own.
        let window = entries.iter().enumerate().filter(move |(i, e)| {
            e.offset_us >= self.start_us
                && self.end_us.is_none_or(|end| e.offset_us < end)
                && !self
                    .entries
                    .as_ref()
                    .is_some_and(|t| t.is_later_turn(*i as u32))
        });
        window
            .enumerate()
            .filter(move |(k, (_, e))| {
                shard.is_none_or(|(s, n)| e.session.unwrap_or(*k as u64) % n as u64 == s as u64)
            })
            .map(|(_, (i, e))| Pick {
                offset_us: self.round_offset_us(e.offset_us),
                entry: i as u32,
                warmup: e.offset_us - self.start_us < self.warmup_us,
            })
    }

    /// An offset of the trace's clock as a round's: from the window's start, over the
    /// speed-up, rounded once (an offset before the window's start is 0).
    fn round_offset_us(&self, offset_us: u64) -> u64 {
        (offset_us.saturating_sub(self.start_us) as f64 / self.speedup).round() as u64
    }

    /// The last offset in the round of pick `p`: its own, or its session run's last
    /// later turn's.
    fn last_offset_of(&self, p: &Pick) -> u64 {
        let later = self
            .entries
            .as_ref()
            .and_then(|t| t.later_turns(p.entry).last());
        later.map_or(p.offset_us, |(_, off)| {
            p.offset_us.max(self.round_offset_us(off))
        })
    }

    /// The requests a pick of entry `entry` sends: every turn of the session run it
    /// starts, else one.
    pub(crate) fn requests_of(&self, entry: u32) -> u64 {
        let run = self.entries.as_ref().and_then(|t| t.run_of(entry));
        run.map_or(1, |r| u64::from(r.turns))
    }

    /// The session run a pick of entry `entry` starts: its session (place in its case's
    /// `sessions`) and each turn's offset in the round (µs from its start, as a pick's;
    /// turn 1's is the pick's own), by turn from 0 (`None`: no entry gives that turn; it is due when the
    /// turn before it ends and its think time has passed). `None` when the entry names
    /// no turn 1.
    pub(crate) fn run_at(&self, entry: u32) -> Option<(u32, Vec<Option<u64>>)> {
        let t = self.entries.as_ref()?;
        let run = t.run_of(entry)?;
        let mut offsets = vec![None; usize::from(run.turns)];
        if let (Some(first), Some(e)) = (offsets.first_mut(), t.entries.get(entry as usize)) {
            *first = Some(self.round_offset_us(e.offset_us));
        }
        for (turn, off) in t.later_turns(entry) {
            if let Some(o) = offsets.get_mut(usize::from(turn)) {
                *o = Some(self.round_offset_us(off));
            }
        }
        Some((run.session, offsets))
    }

    /// What entry `entry` sends, as a dispatch names it: its case, its variant, and for
    /// a synthetic entry its index (its request is made at send time from the template
    /// case's only variant).
    pub(crate) fn target(&self, entry: u32) -> (usize, usize, Option<u32>) {
        let send = self
            .entries
            .as_ref()
            .and_then(|t| t.entries.get(entry as usize));
        match send.map(|e| e.send) {
            Some(Send::Variant { case, variant }) => (case as usize, variant as usize, None),
            _ => (
                self.synthetic_rules.map_or(0, |r| r.case as usize),
                0,
                Some(entry),
            ),
        }
    }

    /// The case an entry's request belongs to.
    pub(crate) fn case_of(&self, entry: u32) -> usize {
        self.target(entry).0
    }

    /// Measured requests of case `case` in one round, as shard `shard` sends them (a
    /// session run's every turn).
    pub(crate) fn planned(&self, case: usize, shard: Option<(usize, usize)>) -> u64 {
        if shard.is_none() {
            return self.counted.per_case.get(case).copied().unwrap_or(0);
        }
        self.picks(shard)
            .iter()
            .filter(|p| !p.warmup && self.case_of(p.entry) == case)
            .map(|p| self.requests_of(p.entry))
            .sum()
    }

    /// The level a trace round is reported at: the window's measured entries' recorded
    /// mean rate at the speed-up, `(n - 1) / (last - first)` over their intended send
    /// times, to four significant digits (0 for fewer than two entries or one instant).
    /// A session run is one arrival (its turn 1's entry): the rate counts sessions.
    pub(crate) fn rate(&self) -> f64 {
        self.counted.rate
    }
}

/// What [`TraceLoad::set_entries`] counts once.
#[derive(Debug, Clone, PartialEq, Default)]
struct Counted {
    rate: f64,
    per_case: Vec<u64>,
    span_us: u64,
}

/// [`TraceLoad::rate`] of a round's picks.
fn rate_of(picks: &[Pick]) -> f64 {
    let measured: Vec<&Pick> = picks.iter().filter(|p| !p.warmup).collect();
    match (measured.first(), measured.last()) {
        (Some(a), Some(b)) if b.offset_us > a.offset_us => {
            let rate = (measured.len() - 1) as f64 / ((b.offset_us - a.offset_us) as f64 / 1e6);
            crate::model::four_digits(rate)
        }
        _ => 0.0,
    }
}

/// The longest a trace round may last (its window over its speed-up): 31 days.
pub(super) const MAX_TRACE_ROUND_SECONDS: f64 = 31.0 * 86_400.0;

impl Validator {
    /// `load.trace`: `{"file", "sha256"}` or `{"entries": [...]}`, each with an optional
    /// `synthetic` (its fields are checked with the cases).
    pub(super) fn trace_source(
        &mut self,
        v: Option<&Value>,
    ) -> Option<(TraceSource, Option<Value>)> {
        let path = "load.trace";
        let Some(v) = v else {
            self.err(
                path,
                "is required with load.mode \"trace\": {\"file\": \"NAME.trace.jsonl\", \"sha256\": \"...\"} beside the plan, or {\"entries\": [...]} inline",
            );
            return None;
        };
        let t = self.object(v, path)?;
        self.unknown_fields(t, path, &[&["file", "sha256", "entries", "synthetic"]]);
        let synthetic = t.get("synthetic").cloned();
        match (t.get("file"), t.get("entries")) {
            (Some(_), Some(_)) | (None, None) => {
                self.err(
                    path,
                    "give either \"file\" (with \"sha256\") or \"entries\"",
                );
                None
            }
            (None, Some(e)) => match e {
                Value::Array(items) if !items.is_empty() => {
                    if t.contains_key("sha256") {
                        self.err(
                            "load.trace.sha256",
                            "goes with \"file\": inline entries are in the plan's own hash",
                        );
                    }
                    Some((TraceSource::Inline, synthetic))
                }
                other => {
                    self.err(
                        "load.trace.entries",
                        format!(
                            "must be a non-empty list of entries, found {}",
                            json_kind(other)
                        ),
                    );
                    None
                }
            },
            (Some(f), None) => {
                let file = self.trace_file(f);
                let sha = self.sha256(t.get("sha256"));
                Some((
                    TraceSource::File {
                        path: file?,
                        sha256: sha?,
                    },
                    synthetic,
                ))
            }
        }
    }

    /// A trace file's name: a `.jsonl` file in the plan's own folder (a name, no folder),
    /// so that a run directory keeps its copy beside its plan.json, where no name of the
    /// run's own (all `.json`, `.parquet`, `.ledger` or folders) can be taken.
    fn trace_file(&mut self, v: &Value) -> Option<String> {
        let path = "load.trace.file";
        let s = self.nonblank(v, path)?;
        let mut parts = std::path::Path::new(s).components();
        let alone =
            matches!(parts.next(), Some(std::path::Component::Normal(_))) && parts.next().is_none();
        if !alone || s.contains(['/', '\\']) || s.starts_with('.') || !s.ends_with(".jsonl") {
            self.err(
                path,
                format!("'{s}' must name a .jsonl file beside the plan (a file name, no folder): a run keeps its copy beside its plan.json"),
            );
            return None;
        }
        Some(s.to_string())
    }

    /// A SHA-256 in lowercase hex.
    fn sha256(&mut self, v: Option<&Value>) -> Option<String> {
        let path = "load.trace.sha256";
        let Some(v) = v else {
            self.err(path, "is required with load.trace.file: the file's SHA-256 (lowercase hex, `sha256sum FILE`), so an edited trace is refused");
            return None;
        };
        let s = self.string(v, path)?;
        if s.len() != 64
            || !s
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            self.err(
                path,
                format!("'{s}' is not a SHA-256 in lowercase hex (64 characters)"),
            );
            return None;
        }
        Some(s.to_string())
    }
}
