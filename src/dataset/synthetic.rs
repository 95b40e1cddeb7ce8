//! Prompts of an exact token count under a model's own tokenizer (a local
//! `tokenizer.json`), made of the embedded corpus's sentences in a seeded order (no two
//! prompts alike). Each
//! prompt is built, encoded, adjusted and checked (as AIPerf does), and refused after a
//! bounded number of tries: a count is never approximate. Counts include the special
//! tokens the tokenizer's post-processor adds (a BOS), as a server counts a completion
//! prompt. Shared prefixes (prefix-cache studies) make every prompt of a group start with
//! the same `P` tokens; `--cache-bust` starts every prompt with its own seeded tag of words
//! from the tokenizer's own vocabulary, checked to differ from every other tag in its
//! first token ids (text that differs can still encode alike: hex digits a vocabulary
//! lacks are all its unknown token), so no two share a cached prefix.

use std::collections::HashSet;
use std::path::Path;

use serde_json::json;
use tokenizers::Tokenizer;

use super::{Api, Ask, PlanSession, PlanTurn, Prompt, Seeded};

/// The text prompts are cut from: plain ASCII prose written for this purpose.
const CORPUS: &str = include_str!("corpus.txt");

/// Source texts tried for one prompt before giving up.
const OFFSETS: usize = 32;
/// Adjustments of one prompt's length on one source text.
const ADJUSTMENTS: usize = 8;
/// The most prompts, and the most tokens in one prompt, a plan may ask for.
pub(crate) const MAX_COUNT: u64 = 1_000_000;
pub(crate) const MAX_TOKENS: u64 = 1 << 20;
/// Vocabulary words a cache-bust tag is drawn from (at most), words in one tag, and draws
/// of one tag before giving up.
const TAG_WORDS: usize = 4096;
const TAG_LEN: usize = 4;
const TAG_TRIES: usize = 1000;

/// Why synthetic prompts cannot be made: the tokenizer, or the ask, with the fix.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SyntheticError {
    /// The tokenizer file cannot be read.
    #[error("{file}: cannot read the tokenizer (a Hugging Face tokenizer.json): {source}")]
    Open {
        file: String,
        #[source]
        source: tokenizers::Error,
    },
    /// The tokenizer cannot encode the embedded corpus.
    #[error("{file}: cannot encode the corpus: {source}")]
    Corpus {
        file: String,
        #[source]
        source: tokenizers::Error,
    },
    /// The corpus encodes to too few tokens: not a text tokenizer.
    #[error(
        "{file}: the corpus encodes to {tokens} tokens under this tokenizer; it is not a text tokenizer"
    )]
    NotText { file: String, tokens: usize },
    /// The tokenizer cannot encode a probe text.
    #[error("{file}: {source}")]
    Probe {
        file: String,
        #[source]
        source: tokenizers::Error,
    },
    /// The tokenizer failed to encode or decode while prompts were made.
    #[error("{0}")]
    Tokenizer(#[source] tokenizers::Error),
    /// The vocabulary has too few plain words for cache-bust tags.
    #[error(
        "--cache-bust: the tokenizer's vocabulary has fewer than 2 plain words (ASCII letters or digits that encode to one token) to draw tags from"
    )]
    FewTagWords,
    /// No new cache-bust tag after [`TAG_TRIES`] draws from `words` words.
    #[error(
        "--cache-bust: no tag with first tokens unlike every earlier prompt's after {TAG_TRIES} draws from {words} words of the vocabulary; ask for fewer prompts"
    )]
    TagDraws { words: usize },
    /// No text of the exact count was found; `why` says what was tried and the fix
    /// ([`Counter::too_hard`]).
    #[error("{why}")]
    TooHard { why: String },
    /// `flag` (`--input-tokens`) leaves no room after the head (`head` tokens of `what`).
    #[error(
        "{flag} {input_tokens} leaves no room for text after {head} tokens ({what}); ask for more"
    )]
    NoRoom {
        flag: &'static str,
        input_tokens: u64,
        head: u64,
        what: &'static str,
    },
}

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

/// How a vocabulary word must encode to be taken ([`Counter::vocab_words`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Alone {
    /// The word alone encodes back to the token it was decoded from (cache-bust tags).
    Bare,
    /// A space and the word encode to one token (trace prompts: `" " + word`).
    Spaced,
}

/// A tokenizer and the corpus's sentences.
pub(crate) struct Counter {
    tk: Tokenizer,
    sentences: Vec<&'static str>,
    /// Corpus tokens per sentence, on average (how many sentences a length needs).
    per_sentence: f64,
    /// Special tokens the post-processor puts before the content (a BOS).
    pub(crate) lead: usize,
    /// Special tokens in an encoding of any text.
    pub(crate) specials: usize,
}

impl Counter {
    pub(crate) fn open(path: &Path) -> Result<Counter, SyntheticError> {
        let file = || path.display().to_string();
        let tk = Tokenizer::from_file(path).map_err(|source| SyntheticError::Open {
            file: file(),
            source,
        })?;
        let corpus = tk
            .encode(CORPUS, false)
            .map_err(|source| SyntheticError::Corpus {
                file: file(),
                source,
            })?
            .get_ids()
            .len();
        if corpus < 64 {
            return Err(SyntheticError::NotText {
                file: file(),
                tokens: corpus,
            });
        }
        let sentences: Vec<&'static str> = CORPUS
            .split_inclusive(". ")
            .flat_map(|s| s.split_inclusive('\n'))
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect();
        let probe = tk
            .encode("probe", true)
            .map_err(|source| SyntheticError::Probe {
                file: file(),
                source,
            })?;
        let mask = probe.get_special_tokens_mask();
        Ok(Counter {
            lead: mask.iter().take_while(|m| **m == 1).count(),
            specials: mask.iter().filter(|m| **m == 1).count(),
            per_sentence: corpus as f64 / sentences.len() as f64,
            sentences,
            tk,
        })
    }

    /// Words of the vocabulary a cache-bust tag is drawn from: in id order, the tokens
    /// that decode to a plain ASCII word (letters or digits) which encodes back to that
    /// one token alone; at most [`TAG_WORDS`].
    fn tag_words(&self) -> Result<Vec<String>, SyntheticError> {
        let words = self.vocab_words(Alone::Bare)?;
        if words.len() < 2 {
            return Err(SyntheticError::FewTagWords);
        }
        Ok(words)
    }

    /// Words of the vocabulary, in id order: the tokens that decode to a plain ASCII word
    /// (letters or digits, at most 16) which encodes to one token as `alone` says (no
    /// special tokens); each word once, at most [`TAG_WORDS`]. Trace prompts
    /// (`plan from-trace`) are made of the [`Alone::Spaced`] ones.
    pub(crate) fn vocab_words(&self, alone: Alone) -> Result<Vec<String>, SyntheticError> {
        self.vocab_words_up_to(alone, TAG_WORDS)
    }

    /// [`Self::vocab_words`], at most `max` of them.
    pub(crate) fn vocab_words_up_to(
        &self,
        alone: Alone,
        max: usize,
    ) -> Result<Vec<String>, SyntheticError> {
        let mut words = Vec::new();
        let mut seen = HashSet::new();
        for id in 0..self.tk.get_vocab_size(true) as u32 {
            let Ok(text) = self.tk.decode(&[id], true) else {
                continue;
            };
            let w = text.trim();
            if w.is_empty() || w.len() > 16 || !w.chars().all(|c| c.is_ascii_alphanumeric()) {
                continue;
            }
            let one = match alone {
                Alone::Bare => self.tk.encode(w, false),
                Alone::Spaced => self.tk.encode(format!(" {w}"), false),
            }
            .map_err(SyntheticError::Tokenizer)?;
            let fits = match alone {
                Alone::Bare => one.get_ids() == [id],
                Alone::Spaced => one.get_ids().len() == 1,
            };
            if fits && seen.insert(w.to_string()) {
                words.push(w.to_string());
                if words.len() >= max {
                    break;
                }
            }
        }
        Ok(words)
    }

    /// The tokenizer splits its input before the model sees it (a pre-tokenizer): a
    /// text's tokens are then decided piece by piece, by the characters at each split.
    pub(crate) fn splits_text(&self) -> bool {
        self.tk.get_pre_tokenizer().is_some()
    }

    /// Token ids of `text`, with the post-processor's special tokens or without.
    pub(crate) fn encode(&self, text: &str, specials: bool) -> Result<Vec<u32>, SyntheticError> {
        Ok(self
            .tk
            .encode(text, specials)
            .map_err(SyntheticError::Tokenizer)?
            .get_ids()
            .to_vec())
    }

    /// A cache-bust tag whose first token ids no earlier tag had (`taken`): words of
    /// `words` drawn by `rng`, redrawn a bounded number of times.
    fn tag(
        &self,
        words: &[String],
        taken: &mut HashSet<Vec<u32>>,
        rng: &mut Seeded,
    ) -> Result<String, SyntheticError> {
        // The first tokens a server's prefix cache would share: the leading specials and
        // the tag's first words.
        let key_len = 4.max(self.lead + 2);
        for _ in 0..TAG_TRIES {
            let drawn: Vec<&str> = (0..TAG_LEN)
                .map(|_| words[rng.below(words.len() as u64) as usize].as_str())
                .collect();
            let tag = format!("{} ", drawn.join(" "));
            let ids = self.ids(&tag)?;
            if taken.insert(ids[..ids.len().min(key_len)].to_vec()) {
                return Ok(tag);
            }
        }
        Err(SyntheticError::TagDraws { words: words.len() })
    }

    /// Tokens of `text` as a server counts a prompt (special tokens included).
    pub(crate) fn count(&self, text: &str) -> Result<usize, SyntheticError> {
        Ok(self.ids(text)?.len())
    }

    fn ids(&self, text: &str) -> Result<Vec<u32>, SyntheticError> {
        self.encode(text, true)
    }

    /// At least `need` tokens of corpus text: seeded sentences in a seeded order, started
    /// a seeded few tokens into the first, so prompts differ from their first token (the
    /// corpus is small; the order of its sentences is not).
    fn source(&self, need: usize, rng: &mut Seeded) -> Result<Vec<u32>, SyntheticError> {
        let skip = rng.below(8) as usize;
        let want = need + skip + 16;
        let mut text = String::new();
        let mut have = 0.0;
        loop {
            while have < want as f64 {
                let pick = self.sentences[rng.below(self.sentences.len() as u64) as usize];
                text.push_str(pick);
                text.push(' ');
                have += self.per_sentence;
            }
            let ids = self
                .tk
                .encode(text.as_str(), false)
                .map_err(SyntheticError::Tokenizer)?
                .get_ids()
                .to_vec();
            if ids.len() >= want {
                return Ok(ids[skip..].to_vec());
            }
            have = ids.len() as f64;
        }
    }

    /// `head` followed by corpus text such that the whole counts exactly `n` tokens;
    /// `None` when no source tried reaches it.
    fn exact(
        &self,
        head: &str,
        n: usize,
        rng: &mut Seeded,
    ) -> Result<Option<String>, SyntheticError> {
        let base = self.count(head)?.max(self.specials);
        if n <= base {
            return Ok(None);
        }
        for _ in 0..OFFSETS {
            let src = self.source(n - base + 16, rng)?;
            let mut k = n - base;
            for _ in 0..ADJUSTMENTS {
                let piece = self
                    .tk
                    .decode(&src[..k.min(src.len())], true)
                    .map_err(SyntheticError::Tokenizer)?;
                let text = format!("{head}{piece}");
                let got = self.count(&text)?;
                if got == n {
                    return Ok(Some(text));
                }
                k = (k + n).saturating_sub(got).max(1);
                if k > src.len() {
                    break;
                }
            }
        }
        Ok(None)
    }

    /// A group's shared prefix: text whose encoding starts with exactly `p` tokens that
    /// stay the same whatever follows it after a space (checked: a merge across the join
    /// would change the group's last prefix token), and those tokens.
    fn prefix(&self, p: usize, rng: &mut Seeded) -> Result<(String, Vec<u32>), SyntheticError> {
        for _ in 0..OFFSETS {
            let Some(text) = self.exact("", p + self.specials - self.lead, rng)? else {
                continue;
            };
            let own = self.ids(&text)?;
            let followed = self.ids(&format!("{text} and then the rest"))?;
            if own.len() >= p && followed.len() >= p && own[..p] == followed[..p] {
                return Ok((format!("{text} "), own[..p].to_vec()));
            }
        }
        Err(self.too_hard(p as u64, "a shared prefix"))
    }
}

/// The prompts.
pub(crate) fn generate(
    counter: &Counter,
    opts: &Options,
    ask: &Ask,
) -> Result<Vec<Prompt>, SyntheticError> {
    let mut maker = Maker::new(counter, opts)?;
    let mut out = Vec::with_capacity(opts.count.min(1 << 16) as usize);
    for i in 0..opts.count {
        let text = maker.prompt(i)?;
        let tokens = counter.count(&text)? as u64;
        out.push(Prompt {
            name: format!("prompt-{}", i + 1),
            body: ask.body(
                opts.api,
                prompt_value(opts.api, text),
                Some(opts.output_tokens),
            ),
            // A chat template adds tokens the tokenizer alone cannot count.
            prompt_tokens: (opts.api != Api::Chat).then_some(tokens),
        });
    }
    Ok(out)
}

/// What `plan synthetic --turns N` asks of each session besides its first prompt.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TurnsAsk {
    /// Turns of each session (at least 1).
    pub(crate) turns: usize,
    /// Tokens of each turn's user text after the first (the first is
    /// [`Options::input_tokens`], with its shared prefix or cache-bust tag).
    pub(crate) turn_input_tokens: u64,
    /// Each turn but the last gets an assistant answer of exactly
    /// [`Options::output_tokens`] tokens (a frozen history's); else none.
    pub(crate) answers: bool,
}

/// `opts.count` sessions (`session-1`, ...) of `turns.turns` chat turns, each a user
/// message of an exact token count (as [`generate`] counts a prompt), no two texts alike.
pub(crate) fn sessions(
    counter: &Counter,
    opts: &Options,
    turns: TurnsAsk,
) -> Result<Vec<PlanSession>, SyntheticError> {
    let mut maker = Maker::new(counter, opts)?;
    let message = |role: &str, text: String| json!({"role": role, "content": text});
    let mut out = Vec::with_capacity(opts.count.min(1 << 16) as usize);
    for i in 0..opts.count {
        let mut list = Vec::with_capacity(turns.turns);
        for k in 0..turns.turns {
            let text = match k {
                0 => maker.prompt(i)?,
                _ => maker.plain(turns.turn_input_tokens, "--turn-input-tokens")?,
            };
            let answer = if turns.answers && k + 1 < turns.turns {
                Some(message(
                    "assistant",
                    maker.plain(opts.output_tokens, "--output-tokens")?,
                ))
            } else {
                None
            };
            list.push(PlanTurn {
                messages: vec![message("user", text)],
                answer,
            });
        }
        out.push(PlanSession {
            id: format!("session-{}", i + 1),
            turns: list,
        });
    }
    Ok(out)
}

/// Texts of exact token counts, one after another from one seeded stream: prompts with
/// their group's shared prefix or a cache-bust tag, and plain texts; no two alike.
struct Maker<'a> {
    counter: &'a Counter,
    opts: &'a Options,
    rng: Seeded,
    /// Each group's prefix text and its first P token ids.
    prefixes: Vec<(String, Vec<u32>)>,
    tag_words: Vec<String>,
    /// First token ids of every cache-bust tag drawn, and every text made: one each per
    /// text asked for (at most [`MAX_COUNT`] prompts, and the plan holds every text).
    tags: HashSet<Vec<u32>>,
    seen: HashSet<String>,
}

impl<'a> Maker<'a> {
    fn new(counter: &'a Counter, opts: &'a Options) -> Result<Maker<'a>, SyntheticError> {
        let mut rng = Seeded::new(opts.seed);
        let p = opts.shared_prefix_tokens as usize;
        // Each group's prefix: exactly P tokens as the prompt starts (its leading special
        // tokens included).
        let groups = if p > 0 { opts.prefix_groups.max(1) } else { 0 };
        let prefixes = (0..groups)
            .map(|_| counter.prefix(p, &mut rng))
            .collect::<Result<_, SyntheticError>>()?;
        let tag_words = if opts.cache_bust && p == 0 {
            counter.tag_words()?
        } else {
            Vec::new()
        };
        Ok(Maker {
            counter,
            opts,
            rng,
            prefixes,
            tag_words,
            tags: HashSet::new(),
            seen: HashSet::new(),
        })
    }

    /// Prompt `i`: its head (its group's shared prefix, a cache-bust tag or nothing),
    /// then corpus text to `--input-tokens` (or a length drawn around it).
    fn prompt(&mut self, i: u64) -> Result<String, SyntheticError> {
        let (counter, opts) = (self.counter, self.opts);
        let p = opts.shared_prefix_tokens as usize;
        let groups = self.prefixes.len().max(1) as u64;
        let group = self.prefixes.get((i % groups) as usize).cloned();
        let head = if let Some((text, _)) = &group {
            text.clone()
        } else if opts.cache_bust {
            counter.tag(&self.tag_words, &mut self.tags, &mut self.rng)?
        } else {
            String::new()
        };
        // Above the head (a shared prefix, a tag, the special tokens), whatever the draw.
        let above = counter.count(&head)?.max(counter.specials) as u64 + 1;
        let n = if opts.input_stddev > 0.0 {
            let x = self
                .rng
                .normal(opts.input_tokens as f64, opts.input_stddev)
                .round();
            (x.max(1.0) as u64).clamp(above, MAX_TOKENS.max(above))
        } else if opts.input_tokens < above {
            return Err(SyntheticError::NoRoom {
                flag: "--input-tokens",
                input_tokens: opts.input_tokens,
                head: above - 1,
                what: if p > 0 {
                    "the shared prefix"
                } else if opts.cache_bust {
                    "the cache-bust tag and the special tokens"
                } else {
                    "the tokenizer's special tokens"
                },
            });
        } else {
            opts.input_tokens
        };
        let start = Start {
            head: &head,
            shared: group.as_ref().map(|(_, ids)| &ids[..]),
        };
        let what = format!("prompt {}", i + 1);
        prompt_text(
            counter,
            start,
            n as usize,
            &what,
            &mut self.seen,
            &mut self.rng,
        )
    }

    /// Corpus text of exactly `n` tokens with no head, unlike every text before it
    /// (`flag` asked for `n`).
    fn plain(&mut self, n: u64, flag: &'static str) -> Result<String, SyntheticError> {
        let specials = self.counter.specials as u64;
        if n <= specials {
            return Err(SyntheticError::NoRoom {
                flag,
                input_tokens: n,
                head: specials,
                what: "the tokenizer's special tokens",
            });
        }
        let start = Start {
            head: "",
            shared: None,
        };
        let what = format!("a text of {flag}");
        prompt_text(
            self.counter,
            start,
            n as usize,
            &what,
            &mut self.seen,
            &mut self.rng,
        )
    }
}

/// How a prompt starts: its head (a shared prefix, a cache-bust tag or nothing) and, with
/// a shared prefix, the group's first P token ids.
#[derive(Clone, Copy)]
struct Start<'a> {
    head: &'a str,
    shared: Option<&'a [u32]>,
}

/// One prompt (`what`, as a refusal names it) of exactly `n` tokens starting with `head`,
/// unlike every prompt `seen` before it; with a shared prefix its first P tokens are
/// checked against its group's.
fn prompt_text(
    counter: &Counter,
    start: Start<'_>,
    n: usize,
    what: &str,
    seen: &mut HashSet<String>,
    rng: &mut Seeded,
) -> Result<String, SyntheticError> {
    let Start { head, shared } = start;
    for _ in 0..OFFSETS {
        let Some(text) = counter.exact(head, n, rng)? else {
            break;
        };
        if let Some(shared) = shared
            && !counter.ids(&text)?.starts_with(shared)
        {
            continue;
        }
        if seen.insert(text.clone()) {
            return Ok(text);
        }
    }
    Err(counter.too_hard(n as u64, what))
}

/// The share of the corpus's tokens above which the tokenizer is said not to cover it.
const UNKNOWN_SHARE: f64 = 0.5;

impl Counter {
    /// Why no prompt of exactly `n` tokens was made, with the fix: the tokenizer does not
    /// cover the corpus (most of it is the unknown token) or does not give back what it
    /// decoded (the corpus's tokens decode to text that encodes to other tokens); else its
    /// merges kept changing the count.
    fn too_hard(&self, n: u64, what: &str) -> SyntheticError {
        let tried = format!(
            "cannot make {what} of exactly {n} tokens under this tokenizer after {OFFSETS} source texts of {ADJUSTMENTS} adjustments each"
        );
        let fix = "give the tokenizer.json of the model the plan is for (one whose vocabulary covers plain English text), or write the prompts yourself and use plan from-jsonl";
        let why = match self.corpus_cover() {
            Ok(Cover::Unknown { share, token }) => format!(
                "{tried}: {:.0}% of the embedded corpus (English prose) encodes to its unknown token {token:?}, which does not decode back to the text it stood for, so text cut from the corpus cannot keep its count: the vocabulary does not cover the corpus; {fix}",
                share * 100.0
            ),
            Ok(Cover::NoRoundTrip { tokens, again }) => format!(
                "{tried}: the corpus's {tokens} tokens decode to text that encodes to {again} tokens (the tokenizer does not give back what it decoded), so text cut from the corpus cannot keep its count; {fix}"
            ),
            Ok(Cover::Covered) | Err(_) => format!(
                "{tried} (its merges keep changing the count); try another --seed or a nearby length"
            ),
        };
        SyntheticError::TooHard { why }
    }

    /// How the tokenizer takes the embedded corpus.
    fn corpus_cover(&self) -> Result<Cover, SyntheticError> {
        let ids = self
            .tk
            .encode(CORPUS, false)
            .map_err(SyntheticError::Tokenizer)?;
        let ids = ids.get_ids();
        if let Some((unk, token)) = unknown_token(&self.tk) {
            let unknown = ids.iter().filter(|&&i| i == unk).count();
            let share = unknown as f64 / ids.len().max(1) as f64;
            if share > UNKNOWN_SHARE {
                return Ok(Cover::Unknown { share, token });
            }
        }
        let text = self
            .tk
            .decode(ids, true)
            .map_err(SyntheticError::Tokenizer)?;
        let again = self
            .tk
            .encode(text, false)
            .map_err(SyntheticError::Tokenizer)?;
        if again.get_ids() != ids {
            return Ok(Cover::NoRoundTrip {
                tokens: ids.len(),
                again: again.get_ids().len(),
            });
        }
        Ok(Cover::Covered)
    }
}

/// How a tokenizer takes the embedded corpus.
#[derive(Debug, PartialEq)]
enum Cover {
    /// Most of it (`share`) encodes to the unknown token.
    Unknown {
        share: f64,
        token: String,
    },
    /// Its tokens decode to text that encodes to `again` tokens, not the same `tokens`.
    NoRoundTrip {
        tokens: usize,
        again: usize,
    },
    Covered,
}

/// The model's unknown token and its id, when it names one (a Unigram model keeps its id
/// private: `<unk>`, as SentencePiece names it, when the vocabulary has it).
fn unknown_token(tk: &Tokenizer) -> Option<(u32, String)> {
    use tokenizers::models::ModelWrapper;
    let token = match tk.get_model() {
        ModelWrapper::BPE(m) => m.unk_token.clone()?,
        ModelWrapper::WordPiece(m) => m.unk_token.clone(),
        ModelWrapper::WordLevel(m) => m.unk_token.clone(),
        ModelWrapper::Unigram(_) => "<unk>".to_string(),
    };
    Some((tk.token_to_id(&token)?, token))
}

fn prompt_value(api: Api, text: String) -> serde_json::Value {
    match api {
        Api::Chat => json!([{"role": "user", "content": text}]),
        Api::Completions | Api::Raw => json!(text),
    }
}
