//! The check that a trace plan's prompts count what its entries say (`plan from-trace`):
//! every ordered pair of the words encoded together (each junction of two words splits and
//! merges nothing: so every distinct block is its words' tokens), distinct blocks'
//! texts re-encoded alone (`n` words, `n` tokens: a seeded sample, or every one), and
//! whole prompts re-encoded (exactly `input_tokens`, special tokens included, each block's own token
//! ids at its place: no merge crosses a block's edge). The work is split over the
//! machine's cores (at most [`MAX_THREADS`]), one batch at a time.

use crate::config::trace_text::{self, BlockCache, SyntheticSpec, WordCountError};

use super::synthetic::{Counter, SyntheticError};

/// The most threads a batch is checked on.
pub(crate) const MAX_THREADS: usize = 16;
/// Bytes of block text each thread caches while it checks prompts.
const PROMPT_CACHE_BYTES: usize = 8 << 20;

/// A distinct block to check, and the line that first used it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BlockCheck {
    pub(crate) id: u64,
    pub(crate) words: usize,
    pub(crate) line: u64,
}

/// A whole prompt to check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PromptCheck {
    pub(crate) line: u64,
    pub(crate) input: u64,
    pub(crate) blocks: Vec<u64>,
}

/// Why the prompts would not count what the trace says, with the tokenizer as the cause.
#[derive(Debug, thiserror::Error)]
pub(crate) enum VerifyError {
    /// A block's text alone encodes to another count than its words.
    #[error(
        "line {line}: block {id} of {words} words encodes to {got} tokens, not {words}: this tokenizer does not give one token per word of its own vocabulary after a space, so prompts of an exact count cannot be made of them"
    )]
    Block {
        line: u64,
        id: u64,
        words: usize,
        got: usize,
    },
    /// A whole prompt encodes to another count than its entry's.
    #[error(
        "line {line}: the prompt of {input} tokens encodes to {got} (special tokens included): this tokenizer merges across words or blocks"
    )]
    Prompt { line: u64, input: u64, got: usize },
    /// Inside a whole prompt, a block's tokens are not its own.
    #[error(
        "line {line}: block {index} (id {id}) encodes to other token ids inside the prompt than alone (a merge crosses its edge), so equal blocks would not share a prefix cache"
    )]
    Seam { line: u64, index: usize, id: u64 },
    #[error("line {line}: {source}")]
    Counts {
        line: u64,
        #[source]
        source: WordCountError,
    },
    /// Two words after a space encode together to other tokens than their own.
    #[error(
        "the words {first:?} and {second:?} encode to {got:?} together (\" {first} {second}\"), not to their own tokens {want:?}: this tokenizer merges or splits across words, so prompts of an exact count cannot be made of its words"
    )]
    Junction {
        first: String,
        second: String,
        got: Vec<u32>,
        want: [u32; 2],
    },
    /// A word after a space is not one token.
    #[error("the word {word:?} after a space encodes to {got:?}, not one token")]
    Word { word: String, got: Vec<u32> },
    #[error("{0}")]
    Tokenizer(#[source] SyntheticError),
}

/// The checks, under one tokenizer and spec.
pub(crate) struct Verifier<'a> {
    pub(crate) counter: &'a Counter,
    pub(crate) spec: &'a SyntheticSpec,
}

impl Verifier<'_> {
    /// Every ordered pair of the spec's words, each after a space (`" a b"`), encodes to
    /// the two words' own tokens: the tokenizer splits at every junction of two words
    /// and merges nothing across it. With each word one token alone, a block of any of
    /// them is then exactly its words' tokens wherever it stands, for a tokenizer whose
    /// pre-tokenizer splits by the characters at each place (byte-level regexes,
    /// Metaspace, Whitespace): every distinct block is checked without being encoded
    /// whole. The number of pairs.
    pub(crate) fn junctions(&self) -> Result<u64, VerifyError> {
        let words = &self.spec.words;
        let mut ids = Vec::with_capacity(words.len());
        for w in words {
            let got = self
                .counter
                .encode(&format!(" {w}"), false)
                .map_err(VerifyError::Tokenizer)?;
            match got[..] {
                [id] => ids.push(id),
                _ => {
                    return Err(VerifyError::Word {
                        word: w.clone(),
                        got,
                    });
                }
            }
        }
        let n = words.len();
        let pairs: Vec<(usize, usize)> = (0..n * n).map(|k| (k / n, k % n)).collect();
        parallel(&pairs, |&(a, b)| {
            let got = self
                .counter
                .encode(&format!(" {} {}", words[a], words[b]), false)
                .map_err(VerifyError::Tokenizer)?;
            if got[..] != [ids[a], ids[b]] {
                return Err(VerifyError::Junction {
                    first: words[a].clone(),
                    second: words[b].clone(),
                    got,
                    want: [ids[a], ids[b]],
                });
            }
            Ok(())
        })?;
        Ok(pairs.len() as u64)
    }

    /// Every block of `items` encodes alone to its word count.
    pub(crate) fn blocks(&self, items: &[BlockCheck]) -> Result<(), VerifyError> {
        parallel(items, |b| {
            let text = trace_text::block_text(self.spec, b.id, b.words);
            let got = self
                .counter
                .encode(&text, false)
                .map_err(VerifyError::Tokenizer)?
                .len();
            if got != b.words {
                return Err(VerifyError::Block {
                    line: b.line,
                    id: b.id,
                    words: b.words,
                    got,
                });
            }
            Ok(())
        })
    }

    /// Every prompt of `items` encodes to exactly its input tokens, each block to its own
    /// token ids at its place.
    pub(crate) fn prompts(&self, items: &[PromptCheck]) -> Result<(), VerifyError> {
        parallel(items, |p| {
            self.prompt(p, &mut BlockCache::new(PROMPT_CACHE_BYTES))
        })
    }

    fn prompt(&self, p: &PromptCheck, cache: &mut BlockCache) -> Result<(), VerifyError> {
        let counts =
            trace_text::word_counts(self.spec, p.input, p.blocks.len()).map_err(|source| {
                VerifyError::Counts {
                    line: p.line,
                    source,
                }
            })?;
        let text = trace_text::prompt_text(self.spec, cache, p.input, &p.blocks);
        let ids = self
            .counter
            .encode(&text, true)
            .map_err(VerifyError::Tokenizer)?;
        if ids.len() as u64 != p.input {
            return Err(VerifyError::Prompt {
                line: p.line,
                input: p.input,
                got: ids.len(),
            });
        }
        let mut at = self.counter.lead;
        for (index, (id, n)) in p.blocks.iter().zip(counts).enumerate() {
            let own = self
                .counter
                .encode(&trace_text::block_text(self.spec, *id, n), false)
                .map_err(VerifyError::Tokenizer)?;
            if ids.get(at..at + n) != Some(&own[..]) {
                return Err(VerifyError::Seam {
                    line: p.line,
                    index,
                    id: *id,
                });
            }
            at += n;
        }
        Ok(())
    }
}

/// `check` on every item, split over the machine's cores; the error of the earliest item
/// that fails (of those checked: a thread stops at its first).
fn parallel<T: Sync>(
    items: &[T],
    check: impl Fn(&T) -> Result<(), VerifyError> + Sync,
) -> Result<(), VerifyError> {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, MAX_THREADS);
    if threads == 1 || items.len() < 2 {
        return items.iter().try_for_each(check);
    }
    let chunk = items.len().div_ceil(threads);
    let check = &check;
    std::thread::scope(|s| {
        let handles: Vec<_> = items
            .chunks(chunk)
            .map(|part| s.spawn(move || part.iter().try_for_each(check)))
            .collect();
        // Joined in order, so the first chunk's error is the one said.
        let mut first = Ok(());
        for h in handles {
            let r = h.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
            if first.is_ok() {
                first = r;
            }
        }
        first
    })
}
