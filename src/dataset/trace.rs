//! `plan from-trace`: a public LLM trace (Mooncake JSONL, Azure or BurstGPT CSV) to a
//! trace file of synthetic entries (trace format v1), streamed: one line of the input held
//! at a time (the kept window under `--sort`), every distinct block's (id, word count)
//! remembered once, and the prompts' counts checked under the tokenizer
//! (`trace_verify.rs`) as the entries are written. Ids the trace does not give are fresh
//! ids from 2^40 up, never reused.
//!
//! Offsets: each line's timestamp less the first line's, in microseconds (rounded down).
//! `--window START:END` keeps the entries with START <= offset < END, rebased to START;
//! `--limit N` the first N kept. Lines must come in time order unless `--sort`, which
//! holds the kept window and sorts it (stably), rebased so its earliest entry is at 0 when
//! no window is given.

use std::collections::HashSet;
use std::io::{BufRead, Write};

use crate::config::trace::Pace;
use crate::config::trace_text::{self, SyntheticSpec};

use super::Seeded;
use super::synthetic::{Alone, Counter, SyntheticError};
use super::trace_read::{Bounds, FRESH_IDS, LineError, Lines, Parser, Record};
use super::trace_verify::{BlockCheck, PromptCheck, Verifier, VerifyError};

pub(crate) use super::trace_read::Format;

/// The most distinct (block id, word count) pairs of the trace's own ids remembered.
pub(crate) const MAX_DISTINCT_BLOCKS: usize = 1 << 23;
/// The most entries `--sort` holds.
pub(crate) const MAX_SORTED: usize = 1 << 22;
/// Words a trace's prompts are made of: few enough that every ordered pair of them is
/// encoded once (65,536 pairs), so every junction of every block is checked without
/// encoding each block whole.
pub(crate) const TRACE_WORDS: usize = 256;

/// Distinct blocks re-encoded whole under `--verify sample` (a seeded sample).
pub(crate) const BLOCK_SAMPLE: usize = 1000;

/// Blocks (or, under `--verify all`, prompts) checked together in one batch.
const BATCH_BLOCKS: usize = 4096;
const BATCH_PROMPTS: usize = 256;

/// Which whole prompts and blocks are re-encoded: a seeded sample (every block's
/// junctions are checked with every pair of words), or every one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verify {
    /// A seeded sample of this many (ChaCha8 with the seed).
    Sample(usize),
    All,
}

/// What `plan from-trace` was asked for.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    pub(crate) format: Format,
    pub(crate) block_tokens: u32,
    pub(crate) seed: u64,
    /// START and END (none: to the end), in nanoseconds on the offsets' axis.
    pub(crate) window: Option<(u64, Option<u64>)>,
    pub(crate) limit: Option<u64>,
    pub(crate) sort: bool,
    /// Keep failed requests (0 output tokens) as entries of 1 output token.
    pub(crate) keep_failed: bool,
    pub(crate) verify: Verify,
}

/// What was kept and checked.
#[derive(Debug, Clone)]
pub(crate) struct Summary {
    pub(crate) spec: SyntheticSpec,
    /// Lines read (not blank, not a CSV header).
    pub(crate) lines: u64,
    /// Whether reading stopped before the end (the limit reached, or past the window on
    /// sorted input).
    pub(crate) stopped_early: bool,
    pub(crate) entries: u64,
    /// Failed requests (0 output tokens) skipped, or under `--keep-failed` kept (those
    /// in the window and the limit).
    pub(crate) failed: u64,
    pub(crate) outside_window: u64,
    /// Past `--limit` (under `--sort`; else reading stops).
    pub(crate) past_limit: u64,
    /// The last entry's offset.
    pub(crate) length_us: u64,
    /// The most entries in one whole second of offsets.
    pub(crate) peak_per_second: u64,
    pub(crate) distinct_blocks: u64,
    /// Blocks of fresh ids (among the distinct ones).
    pub(crate) fresh_blocks: u64,
    pub(crate) verified_prompts: u64,
    /// Distinct blocks re-encoded whole, and whether that was every one of them (else
    /// each was checked by its junctions: [`Verifier::junctions`]).
    pub(crate) verified_blocks: u64,
    pub(crate) whole_blocks: bool,
    /// Ordered pairs of words encoded together (every pair of the spec's words).
    pub(crate) junctions: u64,
}

/// Why a trace is not converted.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TraceError {
    #[error("{file}:{line}: {source}")]
    Line {
        file: String,
        line: u64,
        #[source]
        source: Box<LineError>,
    },
    #[error(
        "{file}:{line}: its time is {}s before the line before it: the file is not in time order (give --sort to sort the kept window)",
        *behind_ns as f64 / 1e9
    )]
    Unsorted {
        file: String,
        line: u64,
        behind_ns: u64,
    },
    #[error("{file}: {source}")]
    Read {
        file: String,
        #[source]
        source: std::io::Error,
    },
    #[error("writing the trace file: {0}")]
    Write(#[source] std::io::Error),
    #[error(
        "the tokenizer's vocabulary has {0} plain word(s) that encode to one token after a space; trace prompts need at least 2"
    )]
    FewWords(usize),
    #[error(
        "--block-tokens {block_tokens} leaves no word after the tokenizer's {special_tokens} special token(s): give more"
    )]
    SmallBlocks {
        block_tokens: u32,
        special_tokens: usize,
    },
    #[error(
        "the kept entries name more than {MAX_DISTINCT_BLOCKS} distinct blocks: convert a part of the trace (--window, --limit)"
    )]
    TooManyBlocks,
    #[error(
        "--sort holds the kept entries, at most {MAX_SORTED}: convert a part of the trace (--window)"
    )]
    TooManySorted,
    #[error("{file}: no entry kept ({why})")]
    Empty { file: String, why: String },
    #[error("{file}: {source}")]
    Verify {
        file: String,
        #[source]
        source: VerifyError,
    },
    #[error("{0}")]
    Tokenizer(#[source] SyntheticError),
}

/// The synthetic spec of a trace plan under `counter`: its vocabulary's one-token words.
pub(crate) fn spec(counter: &Counter, opts: &Options) -> Result<SyntheticSpec, TraceError> {
    let words = counter
        .vocab_words_up_to(Alone::Spaced, TRACE_WORDS)
        .map_err(TraceError::Tokenizer)?;
    if words.len() < 2 {
        return Err(TraceError::FewWords(words.len()));
    }
    if opts.block_tokens as usize <= counter.specials {
        return Err(TraceError::SmallBlocks {
            block_tokens: opts.block_tokens,
            special_tokens: counter.specials,
        });
    }
    Ok(SyntheticSpec {
        case: "trace".into(),
        block_tokens: opts.block_tokens,
        special_tokens: counter.specials as u32,
        seed: opts.seed,
        words,
    })
}

/// One kept entry, before it is written.
#[derive(Debug, Clone)]
struct Entry {
    line: u64,
    /// Nanoseconds on the offsets' axis (negative only before the first line, under
    /// `--sort`).
    offset_ns: i128,
    input: u64,
    /// As the trace says (0: a failed request, kept under `--keep-failed`).
    output: u64,
    blocks: Vec<u64>,
}

/// Convert `input` (named `file` in messages) to trace lines written to `out`.
pub(crate) fn convert(
    input: impl BufRead,
    file: &str,
    counter: &Counter,
    opts: &Options,
    out: impl Write,
) -> Result<Summary, TraceError> {
    let spec = spec(counter, opts)?;
    let verifier = Verifier {
        counter,
        spec: &spec,
    };
    let junctions = verifier.junctions().map_err(|source| TraceError::Verify {
        file: file.to_string(),
        source,
    })?;
    let mut w = Writer::new(out, &verifier, opts, file);
    let mut read = Reading {
        file,
        opts,
        parser: Parser::new(
            opts.format,
            Bounds {
                block_tokens: spec.block_tokens,
                special_tokens: spec.special_tokens,
            },
        ),
        first_ns: None,
        previous_ns: 0,
        fresh: FRESH_IDS,
        held: Vec::new(),
    };
    read.lines(input, &mut w)?;
    if opts.sort {
        let mut held = std::mem::take(&mut read.held);
        held.sort_by_key(|e| e.offset_ns);
        let base = if opts.window.is_none() {
            held.first().map_or(0, |e| e.offset_ns)
        } else {
            0
        };
        let keep = opts
            .limit
            .map_or(held.len(), |n| held.len().min(n as usize));
        w.past_limit = (held.len() - keep) as u64;
        for mut e in held.into_iter().take(keep) {
            e.offset_ns -= base;
            w.emit(e)?;
        }
    }
    w.finish(spec.clone()).map(|s| Summary { junctions, ..s })
}

/// The input's state while it is read.
struct Reading<'a> {
    file: &'a str,
    opts: &'a Options,
    parser: Parser,
    first_ns: Option<u64>,
    previous_ns: u64,
    fresh: u64,
    /// The kept window, under `--sort` (at most [`MAX_SORTED`]).
    held: Vec<Entry>,
}

impl Reading<'_> {
    /// Every line until the end, the limit, or (on sorted input) the window's end.
    fn lines(
        &mut self,
        input: impl BufRead,
        w: &mut Writer<'_, impl Write>,
    ) -> Result<(), TraceError> {
        let mut lines = Lines::new(input);
        let file = self.file;
        let read_err = |source| TraceError::Read {
            file: file.to_string(),
            source,
        };
        let line_err = |line, source| TraceError::Line {
            file: file.to_string(),
            line,
            source: Box::new(source),
        };
        while let Some((n, text)) = lines.next_line().map_err(read_err)? {
            let text = text.map_err(|e| line_err(n, e))?;
            if text.trim().is_empty() {
                continue;
            }
            if self.parser.wants_header() {
                self.parser.header(text).map_err(|e| line_err(n, e))?;
                continue;
            }
            let record = self.parser.record(text).map_err(|e| line_err(n, e))?;
            w.lines += 1;
            if !self.take(n, record, w)? {
                w.stopped_early = true;
                break;
            }
        }
        Ok(())
    }

    /// One record kept, skipped or held; false when reading may stop here.
    fn take(
        &mut self,
        line: u64,
        r: Record,
        w: &mut Writer<'_, impl Write>,
    ) -> Result<bool, TraceError> {
        let first = *self.first_ns.get_or_insert(r.ts_ns);
        if !self.opts.sort && r.ts_ns < self.previous_ns {
            return Err(TraceError::Unsorted {
                file: self.file.to_string(),
                line,
                behind_ns: self.previous_ns - r.ts_ns,
            });
        }
        self.previous_ns = r.ts_ns;
        let axis = i128::from(r.ts_ns) - i128::from(first);
        if r.output == 0 && !self.opts.keep_failed {
            w.failed += 1;
            return Ok(true);
        }
        let mut offset_ns = axis;
        if let Some((start, end)) = self.opts.window {
            if axis < i128::from(start) {
                w.outside_window += 1;
                return Ok(true);
            }
            if end.is_some_and(|end| axis >= i128::from(end)) {
                w.outside_window += 1;
                // Sorted input: every later line is past the window too.
                return Ok(self.opts.sort);
            }
            offset_ns -= i128::from(start);
        }
        let blocks = self.blocks(r.input, r.hash_ids);
        let entry = Entry {
            line,
            offset_ns,
            input: r.input,
            output: r.output,
            blocks,
        };
        if self.opts.sort {
            if self.held.len() >= MAX_SORTED {
                return Err(TraceError::TooManySorted);
            }
            self.held.push(entry);
            return Ok(true);
        }
        w.emit(entry)?;
        Ok(self.opts.limit.is_none_or(|n| w.entries < n))
    }

    /// The entry's block ids: its hash ids, then fresh ids to ceil(T / B).
    fn blocks(&mut self, input: u64, mut ids: Vec<u64>) -> Vec<u64> {
        let need = input.div_ceil(u64::from(self.opts.block_tokens.max(1))) as usize;
        while ids.len() < need {
            ids.push(self.fresh);
            self.fresh += 1;
        }
        ids
    }
}

/// The trace file's writer: entries written in order, their blocks remembered and
/// checked in batches, a sample of prompts kept for the end.
struct Writer<'a, W: Write> {
    out: W,
    verifier: &'a Verifier<'a>,
    opts: &'a Options,
    file: &'a str,
    lines: u64,
    stopped_early: bool,
    entries: u64,
    failed: u64,
    outside_window: u64,
    past_limit: u64,
    /// The entries' pace (length, the most in one second).
    pace: Pace,
    /// Distinct (id, word count) of the trace's own ids (at most [`MAX_DISTINCT_BLOCKS`]).
    seen: HashSet<(u64, usize)>,
    fresh_blocks: u64,
    pending_blocks: Vec<BlockCheck>,
    pending_prompts: Vec<PromptCheck>,
    /// The seeded sample of prompts (at most the sample's size).
    sample: Vec<PromptCheck>,
    /// Every distinct block is re-encoded whole (else a sample of them).
    whole_blocks: bool,
    /// Distinct blocks so far, and the seeded sample of them re-encoded whole.
    distinct: u64,
    block_sample: Vec<BlockCheck>,
    verified_blocks: u64,
    rng: Seeded,
    verified_prompts: u64,
}

/// A trace file's line (trace format v1).
#[derive(serde::Serialize)]
struct Line<'a> {
    offset_us: u64,
    input_tokens: u64,
    output_tokens: u64,
    blocks: &'a [u64],
}

impl<'a, W: Write> Writer<'a, W> {
    fn new(out: W, verifier: &'a Verifier<'a>, opts: &'a Options, file: &'a str) -> Self {
        Writer {
            out,
            verifier,
            opts,
            file,
            lines: 0,
            stopped_early: false,
            entries: 0,
            failed: 0,
            outside_window: 0,
            past_limit: 0,
            pace: Pace::default(),
            seen: HashSet::new(),
            fresh_blocks: 0,
            pending_blocks: Vec::new(),
            pending_prompts: Vec::new(),
            sample: Vec::new(),
            rng: Seeded::new(opts.seed),
            verified_prompts: 0,
            whole_blocks: opts.verify == Verify::All || !verifier.counter.splits_text(),
            distinct: 0,
            block_sample: Vec::new(),
            verified_blocks: 0,
        }
    }

    fn emit(&mut self, e: Entry) -> Result<(), TraceError> {
        let offset_us = (e.offset_ns.max(0) / 1000) as u64;
        let line = Line {
            offset_us,
            input_tokens: e.input,
            // A failed request kept (--keep-failed) asks for one token.
            output_tokens: e.output.max(1),
            blocks: &e.blocks,
        };
        serde_json::to_writer(&mut self.out, &line).map_err(|e| TraceError::Write(e.into()))?;
        self.out.write_all(b"\n").map_err(TraceError::Write)?;
        self.count(offset_us);
        if e.output == 0 {
            self.failed += 1;
        }
        let spec = self.verifier.spec;
        let counts = trace_text::word_counts(spec, e.input, e.blocks.len()).map_err(|source| {
            TraceError::Verify {
                file: self.file.to_string(),
                source: VerifyError::Counts {
                    line: e.line,
                    source,
                },
            }
        })?;
        for (&id, words) in e.blocks.iter().zip(counts) {
            let new = if id >= FRESH_IDS {
                self.fresh_blocks += 1;
                true
            } else if self.seen.len() >= MAX_DISTINCT_BLOCKS && !self.seen.contains(&(id, words)) {
                return Err(TraceError::TooManyBlocks);
            } else {
                self.seen.insert((id, words))
            };
            if new {
                self.new_block(BlockCheck {
                    id,
                    words,
                    line: e.line,
                });
            }
        }
        let prompt = PromptCheck {
            line: e.line,
            input: e.input,
            blocks: e.blocks,
        };
        match self.opts.verify {
            Verify::All => self.pending_prompts.push(prompt),
            Verify::Sample(k) => self.sampled(prompt, k),
        }
        if self.pending_blocks.len() >= BATCH_BLOCKS || self.pending_prompts.len() >= BATCH_PROMPTS
        {
            self.check_pending()?;
        }
        Ok(())
    }

    /// The entry in the trace's count and pace.
    fn count(&mut self, offset_us: u64) {
        self.entries += 1;
        self.pace.add(offset_us);
    }

    /// A distinct block: re-encoded whole (every one under `--verify all`, or when the
    /// tokenizer has no pre-tokenizer to split words), else into the seeded sample of
    /// [`BLOCK_SAMPLE`] (its junctions are checked with every pair of words).
    fn new_block(&mut self, b: BlockCheck) {
        self.distinct += 1;
        if self.whole_blocks {
            self.pending_blocks.push(b);
        } else if self.block_sample.len() < BLOCK_SAMPLE {
            self.block_sample.push(b);
        } else {
            let j = self.rng.below(self.distinct) as usize;
            if j < BLOCK_SAMPLE {
                self.block_sample[j] = b;
            }
        }
    }

    /// Reservoir sampling (algorithm R): each entry is in the sample with equal chance.
    fn sampled(&mut self, prompt: PromptCheck, k: usize) {
        let seen = self.entries;
        if self.sample.len() < k {
            self.sample.push(prompt);
        } else {
            let j = self.rng.below(seen) as usize;
            if j < k {
                self.sample[j] = prompt;
            }
        }
    }

    fn check_pending(&mut self) -> Result<(), TraceError> {
        let err = |source| TraceError::Verify {
            file: self.file.to_string(),
            source,
        };
        self.verifier.blocks(&self.pending_blocks).map_err(err)?;
        self.verified_blocks += self.pending_blocks.len() as u64;
        self.verifier.prompts(&self.pending_prompts).map_err(err)?;
        self.verified_prompts += self.pending_prompts.len() as u64;
        self.pending_blocks.clear();
        self.pending_prompts.clear();
        Ok(())
    }

    fn finish(mut self, spec: SyntheticSpec) -> Result<Summary, TraceError> {
        let lines = self.lines;
        if self.entries == 0 {
            return Err(TraceError::Empty {
                file: self.file.to_string(),
                why: format!(
                    "{lines} lines read, {} failed requests skipped, {} outside the window",
                    if self.opts.keep_failed {
                        0
                    } else {
                        self.failed
                    },
                    self.outside_window
                ),
            });
        }
        self.check_pending()?;
        self.pending_blocks = std::mem::take(&mut self.block_sample);
        self.check_pending()?;
        let sample = std::mem::take(&mut self.sample);
        self.verifier
            .prompts(&sample)
            .map_err(|source| TraceError::Verify {
                file: self.file.to_string(),
                source,
            })?;
        self.verified_prompts += sample.len() as u64;
        self.out.flush().map_err(TraceError::Write)?;
        Ok(Summary {
            spec,
            lines,
            stopped_early: self.stopped_early,
            entries: self.entries,
            failed: self.failed,
            outside_window: self.outside_window,
            past_limit: self.past_limit,
            length_us: self.pace.last_us(),
            peak_per_second: self.pace.stats().peak_rate_per_second,
            distinct_blocks: self.seen.len() as u64 + self.fresh_blocks,
            fresh_blocks: self.fresh_blocks,
            verified_prompts: self.verified_prompts,
            verified_blocks: self.verified_blocks,
            whole_blocks: self.whole_blocks,
            junctions: 0,
        })
    }
}
