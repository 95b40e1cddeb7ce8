//! The text of a synthetic trace entry (trace format v1): its prompt, made of blocks of
//! words drawn from the tokenizer's own vocabulary (one token each), and its request body.
//! The one place both `plan from-trace` (which checks the counts under the tokenizer) and
//! replay (which builds each body at send time) make them, so the two never differ.
//!
//! With B = `block_tokens`, S = `special_tokens` and T = `input_tokens`, block j of a
//! prompt covers token positions `[j*B, min((j+1)*B, T))`; its word count is that length,
//! minus S for block 0. A block's text is its words, each with one leading space, drawn by
//! ChaCha8 seeded with the spec's seed on the stream of the block's id: equal ids at equal
//! positions give equal texts, and a shorter block is a prefix of a longer one.

use std::collections::HashMap;
use std::sync::Arc;

use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{RngCore, SeedableRng};
use serde_json::{Map, Value, json};

/// How a trace plan's synthetic entries are made (the plan's `load.trace.synthetic`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SyntheticSpec {
    /// The case whose `request` is the body template.
    pub(crate) case: String,
    /// Tokens per block (B).
    pub(crate) block_tokens: u32,
    /// Tokens the tokenizer's post-processor adds to any prompt (S: a BOS).
    pub(crate) special_tokens: u32,
    pub(crate) seed: u64,
    /// Words that each encode to one token after a space (non-empty, printable ASCII).
    pub(crate) words: Vec<String>,
}

impl SyntheticSpec {
    /// The plan's `load.trace.synthetic` object.
    pub(crate) fn to_json(&self) -> Value {
        json!({
            "case": self.case,
            "block_tokens": self.block_tokens,
            "special_tokens": self.special_tokens,
            "seed": self.seed,
            "words": self.words,
        })
    }
}

/// Why an entry's word counts cannot be made from its token counts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum WordCountError {
    /// The input leaves no word after the special tokens.
    #[error(
        "{input_tokens} input tokens leave no room for a word after the tokenizer's {special_tokens} special token(s)"
    )]
    NoRoom {
        input_tokens: u64,
        special_tokens: u32,
    },
    /// The first block leaves no word after the special tokens.
    #[error(
        "blocks of {block_tokens} tokens leave no room for a word after the tokenizer's {special_tokens} special token(s)"
    )]
    SmallBlocks {
        block_tokens: u32,
        special_tokens: u32,
    },
    /// The entry names another number of blocks than its input needs.
    #[error(
        "{input_tokens} input tokens in blocks of {block_tokens} take {need} block ids, not {given}"
    )]
    Blocks {
        input_tokens: u64,
        block_tokens: u32,
        need: u64,
        given: usize,
    },
}

/// Blocks an entry of `input_tokens` takes: ceil(T / B).
pub(crate) fn blocks_for(spec: &SyntheticSpec, input_tokens: u64) -> u64 {
    input_tokens.div_ceil(u64::from(spec.block_tokens.max(1)))
}

/// The word count n_j of each of an entry's `blocks` blocks (their sum is T - S).
pub(crate) fn word_counts(
    spec: &SyntheticSpec,
    input_tokens: u64,
    blocks: usize,
) -> Result<Vec<usize>, WordCountError> {
    let b = u64::from(spec.block_tokens);
    let s = u64::from(spec.special_tokens);
    if b <= s {
        return Err(WordCountError::SmallBlocks {
            block_tokens: spec.block_tokens,
            special_tokens: spec.special_tokens,
        });
    }
    if input_tokens <= s {
        return Err(WordCountError::NoRoom {
            input_tokens,
            special_tokens: spec.special_tokens,
        });
    }
    let need = blocks_for(spec, input_tokens);
    if need != blocks as u64 {
        return Err(WordCountError::Blocks {
            input_tokens,
            block_tokens: spec.block_tokens,
            need,
            given: blocks,
        });
    }
    Ok((0..need)
        .map(|j| {
            let len = (input_tokens - j * b).min(b);
            (if j == 0 { len - s } else { len }) as usize
        })
        .collect())
}

/// Block `id`'s first `n` words, each after one space. Empty when the spec has no words
/// (a validated spec has at least one).
pub(crate) fn block_text(spec: &SyntheticSpec, id: u64, n: usize) -> String {
    let count = spec.words.len() as u64;
    if count == 0 {
        return String::new();
    }
    let mut rng = ChaCha8Rng::seed_from_u64(spec.seed);
    rng.set_stream(id);
    let mut text = String::with_capacity(n * 8);
    for _ in 0..n {
        text.push(' ');
        text.push_str(&spec.words[(rng.next_u64() % count) as usize]);
    }
    text
}

/// Bytes of block text a [`BlockCache`] holds by default.
pub(crate) const BLOCK_CACHE_BYTES: usize = 64 << 20;

/// Block texts already made, per (block id, word count), holding at most `limit` bytes of
/// text: when a new text would pass it, the cache is cleared first (a text longer than
/// the limit is made but not kept).
#[derive(Debug)]
pub(crate) struct BlockCache {
    texts: HashMap<(u64, usize), Arc<str>>,
    bytes: usize,
    limit: usize,
}

impl Default for BlockCache {
    fn default() -> BlockCache {
        BlockCache::new(BLOCK_CACHE_BYTES)
    }
}

impl BlockCache {
    /// A cache of at most `limit` bytes of text.
    pub(crate) fn new(limit: usize) -> BlockCache {
        BlockCache {
            texts: HashMap::new(),
            bytes: 0,
            limit,
        }
    }

    /// Bytes of text held now.
    #[allow(
        dead_code,
        reason = "for replay's trace mode to report; the tests read it"
    )]
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Block `(id, n)`'s text, if it is cached (shared: a caller behind a lock copies it
    /// out after the lock).
    pub(crate) fn get(&self, id: u64, n: usize) -> Option<Arc<str>> {
        self.texts.get(&(id, n)).cloned()
    }

    /// Keep block `(id, n)`'s `text` (made by [`block_text`]) within the bound: when it
    /// would pass it, the cache is cleared first; a text longer than the bound is not kept.
    pub(crate) fn put(&mut self, id: u64, n: usize, text: Arc<str>) {
        if text.len() > self.limit || self.texts.contains_key(&(id, n)) {
            return;
        }
        if self.bytes + text.len() > self.limit {
            self.texts.clear();
            self.bytes = 0;
        }
        self.bytes += text.len();
        self.texts.insert((id, n), text);
    }

    /// Append block `(id, n)`'s text to `out`, made once while it stays cached.
    fn append(&mut self, spec: &SyntheticSpec, id: u64, n: usize, out: &mut String) {
        let text = match self.get(id, n) {
            Some(t) => t,
            None => {
                let t: Arc<str> = block_text(spec, id, n).into();
                self.put(id, n, t.clone());
                t
            }
        };
        out.push_str(&text);
    }
}

/// The prompt of an entry of `input_tokens` tokens in `blocks`: its blocks' texts one
/// after the other. `blocks` must be as many as [`word_counts`] accepts (a validated
/// entry's are); were they not, the prompt is the blocks given, each as long as a full
/// block, and its count is not T.
pub(crate) fn prompt_text(
    spec: &SyntheticSpec,
    cache: &mut BlockCache,
    input_tokens: u64,
    blocks: &[u64],
) -> String {
    let counts = word_counts(spec, input_tokens, blocks.len())
        .unwrap_or_else(|_| vec![spec.block_tokens as usize; blocks.len()]);
    let words: usize = counts.iter().sum();
    let mut text = String::with_capacity(words * 8);
    for (id, n) in blocks.iter().zip(counts) {
        cache.append(spec, *id, n, &mut text);
    }
    text
}

/// The request body of an entry: `template` with `prompt` = the prompt (or, when the
/// template has `messages`, one user message of it), `max_tokens` = `output_tokens`, and
/// `min_tokens` = `output_tokens` when the template has `min_tokens`.
pub(crate) fn body(template: &Map<String, Value>, prompt: String, output_tokens: u64) -> Vec<u8> {
    let mut m = template.clone();
    if m.contains_key("messages") {
        m.insert(
            "messages".into(),
            json!([{"role": "user", "content": prompt}]),
        );
    } else {
        m.insert("prompt".into(), Value::String(prompt));
    }
    m.insert("max_tokens".into(), json!(output_tokens));
    if m.contains_key("min_tokens") {
        m.insert("min_tokens".into(), json!(output_tokens));
    }
    // A map of JSON values with string keys always serializes.
    serde_json::to_vec(&m).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> SyntheticSpec {
        SyntheticSpec {
            case: "trace".into(),
            block_tokens: 4,
            special_tokens: 1,
            seed: 7,
            words: ["alpha", "beta", "gamma", "delta", "eps"]
                .map(String::from)
                .to_vec(),
        }
    }

    #[test]
    fn equal_ids_give_equal_texts_and_a_shorter_block_is_a_prefix() {
        let s = spec();
        let a = block_text(&s, 3, 4);
        assert_eq!(a, block_text(&s, 3, 4));
        assert_eq!(a.split(' ').count(), 5, "{a}");
        assert!(a.starts_with(&block_text(&s, 3, 2)), "{a}");
        assert_ne!(a, block_text(&s, 4, 4));
        let other = SyntheticSpec { seed: 8, ..spec() };
        assert_ne!(a, block_text(&other, 3, 4));
        // Pinned: a change of generator or of the draw shows.
        assert_eq!(a, " eps eps gamma gamma");
        assert_eq!(block_text(&s, 0, 0), "");
        assert!(a.split(' ').skip(1).all(|w| s.words.iter().any(|x| x == w)));
    }

    #[test]
    fn word_counts_sum_to_the_input_less_the_special_tokens() {
        let s = spec();
        for t in 2..=40u64 {
            let n = blocks_for(&s, t) as usize;
            let c = word_counts(&s, t, n).unwrap_or_else(|e| panic!("{t}: {e}"));
            assert_eq!(c.iter().sum::<usize>() as u64, t - 1, "{t}");
            assert!(c.iter().all(|n| *n >= 1), "{t}: {c:?}");
            assert_eq!(c[0], (t.min(4) - 1) as usize);
        }
        assert_eq!(word_counts(&s, 9, 3), Ok(vec![3, 4, 1]));
        assert!(matches!(
            word_counts(&s, 9, 2),
            Err(WordCountError::Blocks { need: 3, .. })
        ));
        assert!(matches!(
            word_counts(&s, 1, 1),
            Err(WordCountError::NoRoom { .. })
        ));
        let tight = SyntheticSpec {
            block_tokens: 1,
            ..spec()
        };
        assert!(matches!(
            word_counts(&tight, 5, 5),
            Err(WordCountError::SmallBlocks { .. })
        ));
    }

    #[test]
    fn a_prompt_is_its_blocks_texts_and_shares_a_prefix_with_equal_ids() {
        let s = spec();
        let mut cache = BlockCache::default();
        let p = prompt_text(&s, &mut cache, 9, &[10, 11, 12]);
        let whole = format!(
            "{}{}{}",
            block_text(&s, 10, 3),
            block_text(&s, 11, 4),
            block_text(&s, 12, 1)
        );
        assert_eq!(p, whole);
        let q = prompt_text(&s, &mut cache, 12, &[10, 11, 99]);
        let shared = format!("{}{}", block_text(&s, 10, 3), block_text(&s, 11, 4));
        assert!(p.starts_with(&shared) && q.starts_with(&shared));
        assert_eq!(q.split(' ').count() - 1, 11);
        // Made again from the cache, the same.
        assert_eq!(prompt_text(&s, &mut cache, 9, &[10, 11, 12]), whole);
    }

    #[test]
    fn the_block_cache_keeps_within_its_bound() {
        let s = spec();
        let mut cache = BlockCache::new(100);
        for id in 0..50 {
            let t = prompt_text(&s, &mut cache, 4, &[id]);
            assert_eq!(t, block_text(&s, id, 3));
            assert!(cache.bytes() <= 100, "{}", cache.bytes());
        }
        let mut tiny = BlockCache::new(2);
        assert_eq!(prompt_text(&s, &mut tiny, 4, &[1]), block_text(&s, 1, 3));
        assert_eq!(tiny.bytes(), 0);
    }

    #[test]
    fn the_body_follows_the_template() {
        let t = json!({"model": "m", "prompt": "", "max_tokens": 1, "temperature": 0});
        let Value::Object(t) = t else { panic!() };
        let b: Value = serde_json::from_slice(&body(&t, " a b".into(), 64)).unwrap_or_default();
        assert_eq!(
            b,
            json!({"model": "m", "prompt": " a b", "max_tokens": 64, "temperature": 0})
        );
        let keys: Vec<&String> = b
            .as_object()
            .map(|m| m.keys().collect())
            .unwrap_or_default();
        assert_eq!(keys, ["model", "prompt", "max_tokens", "temperature"]);
        let Value::Object(chat) =
            json!({"model": "m", "messages": [], "min_tokens": 1, "ignore_eos": true})
        else {
            panic!()
        };
        let b: Value = serde_json::from_slice(&body(&chat, "x".into(), 5)).unwrap_or_default();
        assert_eq!(
            b,
            json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "min_tokens": 5, "ignore_eos": true, "max_tokens": 5})
        );
        assert!(b.get("prompt").is_none());
    }

    #[test]
    fn the_spec_writes_the_plans_synthetic_object() {
        assert_eq!(
            spec().to_json(),
            json!({"case": "trace", "block_tokens": 4, "special_tokens": 1, "seed": 7,
                   "words": ["alpha", "beta", "gamma", "delta", "eps"]})
        );
    }
}
