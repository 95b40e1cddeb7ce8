//! A trace plan's entries (`load.mode "trace"`): each request at its offset from the
//! trace's zero, the variant it sends (or, for a synthetic entry, its input and output
//! token counts and prefix block ids) and an optional session key. Read from a trace file
//! (JSON Lines, its SHA-256 pinned by the plan; the caller opens it and hands the reader
//! over) or from the plan's inline `load.trace.entries`, resolved against the plan's cases
//! once, here. Held compactly (about 48 bytes an entry, plus 8 a block id in one arena,
//! at most 2^26 of them), so a trace of millions of entries fits.
//!
//! In a case with sessions, an entry names a turn (its variant `<session id>/<k>`): one
//! naming turn 1 starts a run of that session (a send of the round, [`Run`]); one naming
//! a later turn gives that turn's offset in the session's latest run, which must already
//! have started and not yet have given it or a later turn (its entry is not a send of its
//! own: the run sends it, when due).

use std::io::BufRead;

use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::json::Validator;
use super::trace_text::SyntheticSpec;
use crate::arrival::MAX_ARRIVALS;
use crate::model::hex;
use serde_json::Value;

/// The most bytes one line of a trace file may hold.
pub(crate) const MAX_LINE_BYTES: usize = 1 << 20;

/// The most input or output tokens a synthetic entry may ask for.
pub(crate) const MAX_ENTRY_TOKENS: u64 = 1 << 20;

/// Offsets and block ids are at most this (JSON numbers stay exact).
const MAX_EXACT: u64 = (1 << 53) - 1;

/// The most block ids a trace holds (512 MiB).
const MAX_BLOCK_IDS: usize = 1 << 26;

/// The longest session key.
const MAX_SESSION_BYTES: usize = 256;

/// What one entry sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Send {
    /// A variant of a case of the plan (indices).
    Variant { case: u32, variant: u32 },
    /// A prompt made at send time (`config::trace_text`): `blocks` indexes the trace's
    /// block arena ([`Trace::blocks_of`]).
    Synthetic {
        input_tokens: u32,
        output_tokens: u32,
        blocks_at: u32,
        blocks_len: u32,
    },
}

/// One entry of a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Entry {
    /// Microseconds from the trace's zero.
    pub(crate) offset_us: u64,
    pub(crate) send: Send,
    /// A hash of the entry's session key (`None`: no key): a shard keeps a session.
    pub(crate) session: Option<u64>,
}

/// A trace, resolved against its plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Trace {
    /// In offset order (non-decreasing).
    pub(crate) entries: Vec<Entry>,
    blocks: Vec<u64>,
    /// The session runs its entries start, in entry order.
    pub(crate) runs: Vec<Run>,
    /// Later turns' entries, by run then turn.
    later: Vec<Later>,
    /// The indices of those entries, ascending: not sends of their own.
    later_entries: Vec<u32>,
    /// SHA-256 of the file's bytes (lowercase hex), or of the inline entries as the plan
    /// wrote them (compact JSON).
    pub(crate) sha256: String,
}

/// What a synthetic entry is checked against: the plan's `load.trace.synthetic`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SyntheticRules {
    /// The case whose request is the template.
    pub(crate) case: u32,
    pub(crate) block_tokens: u32,
    pub(crate) special_tokens: u32,
}

/// The plan's cases as entries name them: each case's name and its variants' names
/// (`None`: a case without a `variants` list).
pub(crate) struct Names<'a> {
    pub(crate) cases: Vec<(&'a str, Vec<Option<&'a str>>)>,
    pub(crate) synthetic: Option<SyntheticRules>,
    /// Per case, where each variant sits in its sessions (empty: a case without them).
    pub(crate) turns: Vec<Vec<Option<TurnOf>>>,
}

/// Where a variant of a case with sessions sits: its session (place in the case's
/// `sessions`), its turn (from 0) and the session's turn count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TurnOf {
    pub(crate) session: u32,
    pub(crate) turn: u16,
    pub(crate) turns: u16,
}

/// A run of a session the trace starts: the entry naming its turn 1, the session, and
/// its turn count (the requests the run sends).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Run {
    pub(crate) start: u32,
    pub(crate) session: u32,
    pub(crate) turns: u16,
}

/// A later turn's entry: its run (index in [`Trace::runs`]), its turn (from 0), the entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Later {
    run: u32,
    turn: u16,
    entry: u32,
}

/// Why an entry is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum EntryFault {
    #[error("not a trace entry: {0}")]
    Json(String),
    #[error(
        "offset_us {got} is before the previous entry's {prev}: a trace is in offset order (sort it)"
    )]
    Unsorted { prev: u64, got: u64 },
    #[error("offset_us {0} is above 2^53 - 1")]
    Huge(u64),
    #[error("names case '{0}', which the plan does not have")]
    UnknownCase(String),
    #[error("names variant '{variant}' of case '{case}', which the case does not have")]
    UnknownVariant { case: String, variant: String },
    #[error(
        "case '{0}' has variants: give the entry's \"variant\" (its name in the case's variants list)"
    )]
    VariantRequired(String),
    #[error("case '{0}' has no variants list: leave \"variant\" out")]
    NoVariants(String),
    #[error(
        "gives neither \"case\" nor the synthetic fields (\"input_tokens\", \"output_tokens\", \"blocks\")"
    )]
    Neither,
    #[error("gives both \"case\" and synthetic fields: an entry is one or the other")]
    Both,
    #[error("is synthetic, but the plan has no load.trace.synthetic to build its prompt from")]
    NoSynthetic,
    #[error("{0}")]
    Tokens(String),
    #[error("session is {0} bytes, above {MAX_SESSION_BYTES}")]
    LongSession(usize),
    #[error(
        "names '{variant}' of case '{case}', a later turn, but no earlier entry names that session's turn 1: an entry naming a later turn gives its offset in the session's latest run, so the run's turn 1 comes first"
    )]
    OrphanTurn { case: String, variant: String },
    #[error(
        "names '{variant}' of case '{case}', but the session's latest run already has an entry for turn {given}: a run's turns come once each, in order (an entry naming turn 1 starts another run)"
    )]
    TurnAgain {
        case: String,
        variant: String,
        given: u16,
    },
}

/// Why a trace cannot be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TraceError {
    #[error("line {line}: {fault}")]
    Line { line: usize, fault: EntryFault },
    #[error("line {0}: longer than {MAX_LINE_BYTES} bytes")]
    LongLine(usize),
    #[error("line {0}: not UTF-8")]
    NotUtf8(usize),
    #[error("holds no entry")]
    Empty,
    #[error("holds more than {MAX_ARRIVALS} entries (a round's samples are kept in memory)")]
    TooMany,
    #[error(
        "its SHA-256 is {got}, not the plan's load.trace.sha256 ({want}): the trace was changed after the plan was written; restore it, or write its new hash into the plan if the change is meant"
    )]
    Hash { got: String, want: String },
    #[error("cannot be read: {0}")]
    Read(#[from] std::io::Error),
}

/// One entry as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    offset_us: u64,
    #[serde(default)]
    case: Option<String>,
    #[serde(default)]
    variant: Option<String>,
    #[serde(default)]
    session: Option<String>,
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    blocks: Option<Vec<u64>>,
}

/// A trace being read: entries so far and each session's latest run.
struct Builder<'a> {
    names: &'a Names<'a>,
    trace: Trace,
    /// (case, session) -> (its latest run's index, the last turn it was given).
    open: std::collections::HashMap<(u32, u32), (u32, u16)>,
}

impl<'a> Builder<'a> {
    fn new(names: &'a Names<'a>) -> Builder<'a> {
        Builder {
            names,
            trace: Trace {
                entries: Vec::new(),
                blocks: Vec::new(),
                runs: Vec::new(),
                later: Vec::new(),
                later_entries: Vec::new(),
                sha256: String::new(),
            },
            open: Default::default(),
        }
    }

    fn finish(mut self) -> Result<Trace, TraceError> {
        if self.trace.entries.is_empty() {
            return Err(TraceError::Empty);
        }
        self.trace.later.sort_unstable_by_key(|l| (l.run, l.turn));
        Ok(self.trace)
    }

    /// Entry `entry` sends `send`: where it sits in a session's run, if its case has
    /// sessions (a turn 1 starts a run; a later turn joins the session's latest one).
    fn turn(&mut self, send: Send, entry: u32) -> Result<(), EntryFault> {
        let Send::Variant { case, variant } = send else {
            return Ok(());
        };
        let of = self.names.turns.get(case as usize);
        let Some(t) = of.and_then(|v| v.get(variant as usize)).copied().flatten() else {
            return Ok(());
        };
        let trace = &mut self.trace;
        if t.turn == 0 {
            let run = trace.runs.len() as u32;
            trace.runs.push(Run {
                start: entry,
                session: t.session,
                turns: t.turns,
            });
            self.open.insert((case, t.session), (run, 0));
            return Ok(());
        }
        let names = || {
            let (c, v) = &self.names.cases[case as usize];
            (c.to_string(), v[variant as usize].unwrap_or("").to_string())
        };
        let Some(&(run, given)) = self.open.get(&(case, t.session)) else {
            let (case, variant) = names();
            return Err(EntryFault::OrphanTurn { case, variant });
        };
        if given >= t.turn {
            let (case, variant) = names();
            return Err(EntryFault::TurnAgain {
                case,
                variant,
                given: given + 1,
            });
        }
        self.open.insert((case, t.session), (run, t.turn));
        trace.later.push(Later {
            run,
            turn: t.turn,
            entry,
        });
        trace.later_entries.push(entry);
        Ok(())
    }

    fn push(&mut self, line: Line) -> Result<(), EntryFault> {
        if line.offset_us > MAX_EXACT {
            return Err(EntryFault::Huge(line.offset_us));
        }
        if let Some(prev) = self.trace.entries.last().map(|e| e.offset_us)
            && line.offset_us < prev
        {
            return Err(EntryFault::Unsorted {
                prev,
                got: line.offset_us,
            });
        }
        let synthetic =
            line.input_tokens.is_some() || line.output_tokens.is_some() || line.blocks.is_some();
        let send = match (&line.case, synthetic) {
            (Some(_), true) => return Err(EntryFault::Both),
            (None, false) => return Err(EntryFault::Neither),
            (Some(case), false) => self.variant(case, line.variant.as_deref())?,
            (None, true) => self.synthetic(&line)?,
        };
        let session = match line.session {
            None => None,
            Some(s) if s.len() > MAX_SESSION_BYTES => {
                return Err(EntryFault::LongSession(s.len()));
            }
            Some(s) => Some(session_hash(&s)),
        };
        self.turn(send, self.trace.entries.len() as u32)?;
        self.trace.entries.push(Entry {
            offset_us: line.offset_us,
            send,
            session,
        });
        Ok(())
    }

    fn variant(&self, case: &str, variant: Option<&str>) -> Result<Send, EntryFault> {
        let Some(ci) = self.names.cases.iter().position(|(n, _)| *n == case) else {
            return Err(EntryFault::UnknownCase(case.to_string()));
        };
        let variants = &self.names.cases[ci].1;
        let unnamed = variants.first().is_some_and(Option::is_none);
        let vi = match (variant, unnamed) {
            (None, true) => 0,
            (Some(_), true) => return Err(EntryFault::NoVariants(case.to_string())),
            (None, false) => return Err(EntryFault::VariantRequired(case.to_string())),
            (Some(v), false) => variants.iter().position(|n| *n == Some(v)).ok_or_else(|| {
                EntryFault::UnknownVariant {
                    case: case.to_string(),
                    variant: v.to_string(),
                }
            })?,
        };
        Ok(Send::Variant {
            case: ci as u32,
            variant: vi as u32,
        })
    }

    fn synthetic(&mut self, line: &Line) -> Result<Send, EntryFault> {
        let rules = self.names.synthetic.ok_or(EntryFault::NoSynthetic)?;
        let tokens = |f: Option<u64>, what: &str, min: u64| match f {
            None => Err(EntryFault::Tokens(format!("{what} is required"))),
            Some(n) if n < min || n > MAX_ENTRY_TOKENS => Err(EntryFault::Tokens(format!(
                "{what} is {n}: from {min} to {MAX_ENTRY_TOKENS}"
            ))),
            Some(n) => Ok(n as u32),
        };
        let input = tokens(
            line.input_tokens,
            "input_tokens",
            u64::from(rules.special_tokens) + 1,
        )?;
        let output = tokens(line.output_tokens, "output_tokens", 1)?;
        let Some(blocks) = &line.blocks else {
            return Err(EntryFault::Tokens("blocks is required".into()));
        };
        let want = input.div_ceil(rules.block_tokens) as usize;
        if blocks.len() != want {
            return Err(EntryFault::Tokens(format!(
                "blocks has {} ids; {input} input tokens in blocks of {} take {want}",
                blocks.len(),
                rules.block_tokens
            )));
        }
        if let Some(b) = blocks.iter().find(|&&b| b > MAX_EXACT) {
            return Err(EntryFault::Tokens(format!(
                "block id {b} is above 2^53 - 1"
            )));
        }
        let at = self.trace.blocks.len();
        if at + blocks.len() > MAX_BLOCK_IDS {
            return Err(EntryFault::Tokens(format!(
                "the trace holds more than {MAX_BLOCK_IDS} block ids (8 bytes each, held while it is replayed): replay a part of it"
            )));
        }
        self.trace.blocks.extend_from_slice(blocks);
        Ok(Send::Synthetic {
            input_tokens: input,
            output_tokens: output,
            blocks_at: at as u32,
            blocks_len: blocks.len() as u32,
        })
    }
}

/// A session key's hash: the first 8 bytes of its SHA-256 (the same on every platform).
fn session_hash(key: &str) -> u64 {
    let d = Sha256::digest(key.as_bytes());
    let mut b = [0u8; 8];
    b.copy_from_slice(&d[..8]);
    u64::from_be_bytes(b)
}

impl Trace {
    /// Read a trace file (JSON Lines) from `reader`, checking its SHA-256 against `want`
    /// (the plan's pin) after the last byte.
    pub(crate) fn read(
        mut reader: impl BufRead,
        names: &Names<'_>,
        want: &str,
    ) -> Result<Trace, TraceError> {
        let mut b = Builder::new(names);
        let mut hash = Sha256::new();
        let mut buf = Vec::new();
        let mut fault = None;
        for n in 1usize.. {
            buf.clear();
            let got = std::io::Read::take(reader.by_ref(), MAX_LINE_BYTES as u64 + 1)
                .read_until(b'\n', &mut buf)?;
            if got == 0 {
                break;
            }
            if buf.len() > MAX_LINE_BYTES {
                return Err(TraceError::LongLine(n));
            }
            hash.update(&buf);
            // The hash is checked first: an edited file is named as edited, not by the
            // first line the edit broke.
            if fault.is_some() {
                continue;
            }
            let text = std::str::from_utf8(&buf).map_err(|_| TraceError::NotUtf8(n))?;
            if text.trim().is_empty() {
                continue;
            }
            if b.trace.entries.len() >= MAX_ARRIVALS {
                return Err(TraceError::TooMany);
            }
            let pushed = serde_json::from_str::<Line>(text)
                .map_err(|e| EntryFault::Json(e.to_string()))
                .and_then(|l| b.push(l));
            if let Err(f) = pushed {
                fault = Some(TraceError::Line { line: n, fault: f });
            }
        }
        let got = hex(&hash.finalize());
        if got != want {
            return Err(TraceError::Hash {
                got,
                want: want.to_string(),
            });
        }
        if let Some(f) = fault {
            return Err(f);
        }
        b.trace.sha256 = got;
        b.finish()
    }

    /// The plan's inline entries (`load.trace.entries`): each problem with its index.
    pub(crate) fn inline(
        items: &[serde_json::Value],
        names: &Names<'_>,
    ) -> Result<Trace, Vec<(usize, EntryFault)>> {
        let mut b = Builder::new(names);
        let mut faults = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let pushed = Line::deserialize(item)
                .map_err(|e| EntryFault::Json(e.to_string()))
                .and_then(|l| b.push(l));
            if let Err(f) = pushed {
                faults.push((i, f));
            }
        }
        if !faults.is_empty() {
            return Err(faults);
        }
        let compact = serde_json::to_vec(items).unwrap_or_default();
        b.trace.sha256 = hex(&Sha256::digest(&compact));
        b.finish().map_err(|_| Vec::new())
    }

    /// A synthetic entry's block ids.
    pub(crate) fn blocks_of(&self, send: Send) -> &[u64] {
        match send {
            Send::Synthetic {
                blocks_at,
                blocks_len,
                ..
            } => {
                let at = blocks_at as usize;
                self.blocks.get(at..at + blocks_len as usize).unwrap_or(&[])
            }
            Send::Variant { .. } => &[],
        }
    }

    /// Whether entry `entry` gives a later turn's offset (not a send of its own).
    pub(crate) fn is_later_turn(&self, entry: u32) -> bool {
        self.later_entries.binary_search(&entry).is_ok()
    }

    /// The session run entry `entry` starts, if it names a turn 1.
    pub(crate) fn run_of(&self, entry: u32) -> Option<Run> {
        let i = self.runs.binary_search_by_key(&entry, |r| r.start).ok()?;
        Some(self.runs[i])
    }

    /// The later turns of the run entry `entry` starts: each turn (from 0) with its
    /// entry's offset (µs on the trace's clock), in turn order.
    pub(crate) fn later_turns(&self, entry: u32) -> impl Iterator<Item = (u16, u64)> + '_ {
        let run = self
            .runs
            .binary_search_by_key(&entry, |r| r.start)
            .map_or(u32::MAX, |i| i as u32);
        let from = self.later.partition_point(|l| l.run < run);
        self.later[from..]
            .iter()
            .take_while(move |l| l.run == run)
            .map(|l| (l.turn, self.entries[l.entry as usize].offset_us))
    }

    /// What `validate` says of the whole trace: its length (first to last offset), its
    /// entry count, and its mean and peak rates per second (the peak: the most entries in
    /// one whole second from the trace's zero).
    pub(crate) fn stats(&self) -> TraceStats {
        let mut pace = Pace::default();
        self.entries.iter().for_each(|e| pace.add(e.offset_us));
        pace.stats()
    }
}

/// A trace's pace, counted entry by entry in offset order (`validate` over a read trace,
/// `plan from-trace` as it writes one): the entries, the first and last offsets, and the
/// most entries within one whole second `[k, k + 1)` of the trace's clock.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Pace {
    entries: u64,
    first_us: Option<u64>,
    last_us: u64,
    second: u64,
    in_second: u64,
    peak: u64,
}

impl Pace {
    pub(crate) fn add(&mut self, offset_us: u64) {
        self.entries += 1;
        self.first_us.get_or_insert(offset_us);
        self.last_us = offset_us;
        let second = offset_us / 1_000_000;
        if second != self.second || self.entries == 1 {
            (self.second, self.in_second) = (second, 0);
        }
        self.in_second += 1;
        self.peak = self.peak.max(self.in_second);
    }

    /// The last offset counted.
    pub(crate) fn last_us(&self) -> u64 {
        self.last_us
    }

    pub(crate) fn stats(&self) -> TraceStats {
        let length_seconds = (self.last_us - self.first_us.unwrap_or(0)) as f64 / 1e6;
        TraceStats {
            entries: self.entries,
            length_seconds,
            mean_rate_per_second: (length_seconds > 0.0)
                .then(|| (self.entries - 1) as f64 / length_seconds),
            peak_rate_per_second: self.peak,
        }
    }
}

/// A trace's size and pace, for `validate`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct TraceStats {
    pub(crate) entries: u64,
    pub(crate) length_seconds: f64,
    /// `(entries - 1) / length` (`None` for a trace of one instant).
    pub(crate) mean_rate_per_second: Option<f64>,
    /// The most entries within one second `[k, k + 1)` of the trace's clock.
    pub(crate) peak_rate_per_second: u64,
}

/// The most words a synthetic spec may hold, and the longest word.
const MAX_WORDS: usize = 65_536;
const MAX_WORD_BYTES: usize = 64;

impl Validator {
    /// `load.trace.synthetic`: the template case (one of `cases`, by name), the block size,
    /// the special tokens a prompt holds, the seed and the words prompts are made of.
    pub(super) fn synthetic(
        &mut self,
        v: &Value,
        cases: &[&str],
    ) -> Option<(SyntheticRules, SyntheticSpec)> {
        let path = "load.trace.synthetic";
        let m = self.object(v, path)?;
        self.unknown_fields(
            m,
            path,
            &[&["case", "block_tokens", "special_tokens", "seed", "words"]],
        );
        let name = m.get("case").and_then(Value::as_str).unwrap_or_default();
        let ci = cases.iter().position(|c| *c == name);
        if ci.is_none() {
            self.err(
                format!("{path}.case"),
                format!("'{name}' is not a case of the plan: name the case whose request is the template"),
            );
        }
        let mut count = |key: &str, min: u64| match m.get(key) {
            None => {
                self.err(format!("{path}.{key}"), "is required");
                None
            }
            Some(x) => self.integer(x, &format!("{path}.{key}"), min),
        };
        let (block, special, seed) = (
            count("block_tokens", 2),
            count("special_tokens", 0),
            count("seed", 0),
        );
        let words = self.words(m.get("words"));
        let (block, special) = (block? as u32, special? as u32);
        if block <= special || block as u64 > MAX_ENTRY_TOKENS {
            self.err(
                format!("{path}.block_tokens"),
                format!("{block} must be above special_tokens ({special}) and at most {MAX_ENTRY_TOKENS}"),
            );
            return None;
        }
        let rules = SyntheticRules {
            case: ci? as u32,
            block_tokens: block,
            special_tokens: special,
        };
        let spec = SyntheticSpec {
            case: name.to_string(),
            block_tokens: block,
            special_tokens: special,
            seed: seed? as u64,
            words: words?,
        };
        Some((rules, spec))
    }

    /// `load.trace.synthetic.words`: 1 to 65,536 words, each 1 to 64 printable ASCII
    /// characters with no white space (each one token after a space, as `plan
    /// from-trace` checked under its tokenizer).
    fn words(&mut self, v: Option<&Value>) -> Option<Vec<String>> {
        let path = "load.trace.synthetic.words";
        let Some(Value::Array(items)) = v else {
            self.err(path, "is required: a list of words");
            return None;
        };
        if items.is_empty() || items.len() > MAX_WORDS {
            self.err(
                path,
                format!("holds {} words: from 1 to {MAX_WORDS}", items.len()),
            );
            return None;
        }
        let mut out = Vec::with_capacity(items.len());
        for (i, w) in items.iter().enumerate() {
            match w.as_str() {
                Some(s)
                    if !s.is_empty()
                        && s.len() <= MAX_WORD_BYTES
                        && s.bytes().all(|b| (0x21..0x7f).contains(&b)) =>
                {
                    out.push(s.to_string());
                }
                _ => {
                    self.err(
                        format!("{path}[{i}]"),
                        format!("{w} is not a word of 1 to {MAX_WORD_BYTES} printable ASCII characters without white space"),
                    );
                    return None;
                }
            }
        }
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Names<'static> {
        Names {
            cases: vec![("chat", vec![Some("a"), Some("b")]), ("health", vec![None])],
            synthetic: None,
            turns: Vec::new(),
        }
    }

    fn read(text: &str) -> Result<Trace, TraceError> {
        let want = hex(&Sha256::digest(text.as_bytes()));
        Trace::read(text.as_bytes(), &names(), &want)
    }

    #[test]
    fn entries_resolve_against_the_cases_and_keep_their_order() {
        let t = read(
            "{\"offset_us\": 0, \"case\": \"chat\", \"variant\": \"b\", \"session\": \"s1\"}\n\n{\"offset_us\": 5, \"case\": \"health\"}\n",
        )
        .unwrap();
        assert_eq!(t.entries.len(), 2);
        assert_eq!(
            t.entries[0].send,
            Send::Variant {
                case: 0,
                variant: 1
            }
        );
        assert_eq!(
            t.entries[1].send,
            Send::Variant {
                case: 1,
                variant: 0
            }
        );
        assert!(t.entries[0].session.is_some() && t.entries[1].session.is_none());
        let s = t.stats();
        assert_eq!((s.entries, s.peak_rate_per_second), (2, 2));
    }

    #[test]
    fn bad_lines_are_named_by_number_and_an_edited_file_by_its_hash() {
        let cases = [
            (
                "{\"offset_us\": 5, \"case\": \"chat\", \"variant\": \"a\"}\n{\"offset_us\": 4, \"case\": \"chat\", \"variant\": \"a\"}\n",
                "line 2: offset_us 4 is before the previous entry's 5",
            ),
            (
                "{\"offset_us\": -1, \"case\": \"chat\"}\n",
                "line 1: not a trace entry",
            ),
            (
                "{\"offset_us\": 1.5e300, \"case\": \"chat\"}\n",
                "line 1: not a trace entry",
            ),
            (
                "{\"offset_us\": 9007199254740993, \"case\": \"health\"}\n",
                "line 1: offset_us 9007199254740993 is above 2^53 - 1",
            ),
            (
                "{\"offset_us\": 0, \"case\": \"nope\"}\n",
                "line 1: names case 'nope'",
            ),
            (
                "{\"offset_us\": 0, \"case\": \"chat\"}\n",
                "line 1: case 'chat' has variants",
            ),
            (
                "{\"offset_us\": 0, \"case\": \"chat\", \"variant\": \"z\"}\n",
                "line 1: names variant 'z' of case 'chat'",
            ),
            ("{\"offset_us\": 0}\n", "line 1: gives neither"),
            (
                "{\"offset_us\": 0, \"input_tokens\": 5, \"output_tokens\": 1, \"blocks\": [1]}\n",
                "line 1: is synthetic, but the plan has no",
            ),
            ("\n", "holds no entry"),
        ];
        for (text, want) in cases {
            let e = read(text).unwrap_err().to_string();
            assert!(e.starts_with(want), "{text:?}: {e}");
        }
        let text = "{\"offset_us\": 0, \"case\": \"health\"}\n";
        let e = Trace::read(text.as_bytes(), &names(), &"0".repeat(64)).unwrap_err();
        assert!(matches!(e, TraceError::Hash { .. }), "{e}");
    }

    #[test]
    fn synthetic_entries_need_exactly_their_blocks() {
        let mut n = names();
        n.synthetic = Some(SyntheticRules {
            case: 1,
            block_tokens: 4,
            special_tokens: 1,
        });
        let ok = "{\"offset_us\": 0, \"input_tokens\": 9, \"output_tokens\": 2, \"blocks\": [1, 2, 3]}\n";
        let want = hex(&Sha256::digest(ok.as_bytes()));
        let t = Trace::read(ok.as_bytes(), &n, &want).unwrap();
        assert_eq!(t.blocks_of(t.entries[0].send), &[1, 2, 3]);
        for (text, why) in [
            (
                "{\"offset_us\": 0, \"input_tokens\": 9, \"output_tokens\": 2, \"blocks\": [1, 2]}\n",
                "blocks has 2 ids; 9 input tokens in blocks of 4 take 3",
            ),
            (
                "{\"offset_us\": 0, \"input_tokens\": 1, \"output_tokens\": 2, \"blocks\": [1]}\n",
                "input_tokens is 1: from 2",
            ),
            (
                "{\"offset_us\": 0, \"input_tokens\": 4, \"output_tokens\": 0, \"blocks\": [1]}\n",
                "output_tokens is 0: from 1",
            ),
            (
                "{\"offset_us\": 0, \"case\": \"health\", \"input_tokens\": 4}\n",
                "gives both",
            ),
        ] {
            let want = hex(&Sha256::digest(text.as_bytes()));
            let e = Trace::read(text.as_bytes(), &n, &want)
                .unwrap_err()
                .to_string();
            assert!(e.contains(why), "{text:?}: {e}");
        }
    }
}
