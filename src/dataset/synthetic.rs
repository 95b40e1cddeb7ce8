//! Prompts of an exact token count under a model's own tokenizer (a local
//! `tokenizer.json`), cut from the corpus embedded in the binary at seeded offsets. Each
//! prompt is built, encoded, adjusted and checked (as AIPerf does), and refused after a
//! bounded number of tries: a count is never approximate. Counts include the special
//! tokens the tokenizer's post-processor adds (a BOS), as a server counts a completion
//! prompt. Shared prefixes (prefix-cache studies) make every prompt of a group start with
//! the same `P` tokens; `--cache-bust` starts every prompt with its own seeded tag, so no
//! two share a cached prefix.

use std::collections::HashSet;
use std::path::Path;

use serde_json::json;
use tokenizers::Tokenizer;

use super::{Api, Ask, Prompt, Seeded};

/// The text prompts are cut from: plain ASCII prose written for this purpose.
const CORPUS: &str = include_str!("corpus.txt");

/// Start offsets tried for one prompt before giving up.
const OFFSETS: usize = 32;
/// Adjustments of one prompt's length at one offset.
const ADJUSTMENTS: usize = 8;

/// What `plan synthetic` was asked for.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    pub(crate) input_tokens: u64,
    pub(crate) input_stddev: f64,
    pub(crate) output_tokens: u64,
    pub(crate) count: u64,
    pub(crate) seed: u64,
    pub(crate) shared_prefix_tokens: u64,
    pub(crate) prefix_groups: u64,
    pub(crate) cache_bust: bool,
    pub(crate) api: Api,
}

/// A tokenizer and the corpus under it.
pub(crate) struct Counter {
    tk: Tokenizer,
    corpus: Vec<u32>,
    /// Special tokens the post-processor puts before the content (a BOS).
    lead: usize,
    /// Special tokens in an encoding of any text.
    specials: usize,
}

impl Counter {
    pub(crate) fn open(path: &Path) -> Result<Counter, String> {
        let name = path.display();
        let tk = Tokenizer::from_file(path).map_err(|e| {
            format!("{name}: cannot read the tokenizer (a Hugging Face tokenizer.json): {e}")
        })?;
        let corpus = tk
            .encode(CORPUS, false)
            .map_err(|e| format!("{name}: cannot encode the corpus: {e}"))?
            .get_ids()
            .to_vec();
        if corpus.len() < 64 {
            return Err(format!(
                "{name}: the corpus encodes to {} tokens under this tokenizer; it is not a text tokenizer",
                corpus.len()
            ));
        }
        let probe = tk
            .encode("probe", true)
            .map_err(|e| format!("{name}: {e}"))?;
        let mask = probe.get_special_tokens_mask();
        Ok(Counter {
            lead: mask.iter().take_while(|m| **m == 1).count(),
            specials: mask.iter().filter(|m| **m == 1).count(),
            tk,
            corpus,
        })
    }

    /// Tokens of `text` as a server counts a prompt (special tokens included).
    pub(crate) fn count(&self, text: &str) -> Result<usize, String> {
        Ok(self.ids(text)?.len())
    }

    fn ids(&self, text: &str) -> Result<Vec<u32>, String> {
        Ok(self
            .tk
            .encode(text, true)
            .map_err(|e| e.to_string())?
            .get_ids()
            .to_vec())
    }

    /// `k` corpus tokens from `start` (wrapping), decoded.
    fn slice(&self, start: usize, k: usize) -> Result<String, String> {
        let ids: Vec<u32> = (0..k)
            .map(|i| self.corpus[(start + i) % self.corpus.len()])
            .collect();
        self.tk.decode(&ids, true).map_err(|e| e.to_string())
    }

    /// `head` followed by corpus text such that the whole counts exactly `n` tokens;
    /// `None` when no offset tried reaches it.
    fn exact(&self, head: &str, n: usize, rng: &mut Seeded) -> Result<Option<String>, String> {
        let base = self.count(head)?.max(self.specials);
        if n <= base {
            return Ok((n == self.count(head)? && !head.is_empty()).then(|| head.to_string()));
        }
        for _ in 0..OFFSETS {
            let start = rng.below(self.corpus.len() as u64) as usize;
            let mut k = n - base;
            for _ in 0..ADJUSTMENTS {
                let text = format!("{head}{}", self.slice(start, k)?);
                let got = self.count(&text)?;
                if got == n {
                    return Ok(Some(text));
                }
                k = (k + n).saturating_sub(got).max(1);
            }
        }
        Ok(None)
    }
}

/// The prompts.
pub(crate) fn generate(
    counter: &Counter,
    opts: &Options,
    ask: &Ask,
) -> Result<Vec<Prompt>, String> {
    let mut rng = Seeded::new(opts.seed);
    let least = counter.specials as u64 + 1;
    let p = opts.shared_prefix_tokens;
    // Each group's prefix: exactly P tokens as the prompt starts (its leading special
    // tokens included), cut where no merge with what follows can reach back into it.
    let groups = if p > 0 { opts.prefix_groups.max(1) } else { 0 };
    let prefixes: Vec<(String, Vec<u32>)> = (0..groups)
        .map(|_| {
            let text = counter
                .exact("", p as usize + counter.specials - counter.lead, &mut rng)?
                .ok_or_else(|| too_hard(p, "a shared prefix"))?;
            let ids = counter.ids(&text)?;
            Ok((format!("{text}\n\n"), ids[..p as usize].to_vec()))
        })
        .collect::<Result<_, String>>()?;
    let mut tags = HashSet::new();
    let mut out = Vec::with_capacity(opts.count as usize);
    for i in 0..opts.count {
        let head = if let Some((text, _)) = prefixes.get((i % groups.max(1)) as usize) {
            text.clone()
        } else if opts.cache_bust {
            loop {
                let t = format!("[{:016x}] ", rng.next_u64());
                if tags.insert(t.clone()) {
                    break t;
                }
            }
        } else {
            String::new()
        };
        // Above the head (a shared prefix, a tag), whatever the draw.
        let above = counter.count(&head)? as u64 + 1;
        let n = if opts.input_stddev > 0.0 {
            let x = rng
                .normal(opts.input_tokens as f64, opts.input_stddev)
                .round();
            (x.max(1.0) as u64).max(above).max(least)
        } else if opts.input_tokens < above {
            return Err(format!(
                "--input-tokens {} leaves no room after the prompt's head ({} tokens: {}); ask for more",
                opts.input_tokens,
                above - 1,
                if p > 0 {
                    "the shared prefix"
                } else {
                    "the cache-bust tag"
                }
            ));
        } else {
            opts.input_tokens
        };
        let text = prompt_text(counter, &head, n as usize, &prefixes, i, groups, &mut rng)?;
        let tokens = counter.count(&text)? as u64;
        out.push(Prompt {
            name: format!("prompt-{}", i + 1),
            body: ask.body(
                opts.api,
                prompt_value(opts.api, text),
                Some(opts.output_tokens),
            ),
            prompt_tokens: Some(tokens),
        });
    }
    Ok(out)
}

/// One prompt of exactly `n` tokens starting with `head`; with shared prefixes its first
/// P tokens are checked against its group's.
fn prompt_text(
    counter: &Counter,
    head: &str,
    n: usize,
    prefixes: &[(String, Vec<u32>)],
    i: u64,
    groups: u64,
    rng: &mut Seeded,
) -> Result<String, String> {
    for _ in 0..OFFSETS {
        let Some(text) = counter.exact(head, n, rng)? else {
            break;
        };
        let Some((_, shared)) = prefixes.get((i % groups.max(1)) as usize) else {
            return Ok(text);
        };
        if counter.ids(&text)?.starts_with(shared) {
            return Ok(text);
        }
    }
    Err(too_hard(n as u64, &format!("prompt {}", i + 1)))
}

fn too_hard(n: u64, what: &str) -> String {
    format!(
        "cannot make {what} of exactly {n} tokens under this tokenizer after {OFFSETS} offsets of {ADJUSTMENTS} adjustments each (its merges keep changing the count); try another --seed or a nearby length"
    )
}

fn prompt_value(api: Api, text: String) -> serde_json::Value {
    match api {
        Api::Chat => json!([{"role": "user", "content": text}]),
        Api::Completions | Api::Raw => json!(text),
    }
}
