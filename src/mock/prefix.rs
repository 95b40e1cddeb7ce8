//! The mock's prefix cache: an LRU of blocks of [`BLOCK_TOKENS`] prompt tokens (the
//! mock's tokens are its prompt's whitespace-separated words), each block keyed by a
//! hash chained over every token before it and its own, as vLLM's automatic prefix
//! caching keys them, so only a true prefix hits. A request's cached tokens are the full
//! blocks of the longest cached prefix of its prompt's tokens before its last one (as in
//! vLLM, the last token is always computed, so a prompt sent again whole reports all but
//! its last block cached when its length is a multiple of the block); its blocks are
//! cached as it is admitted. At most `capacity` blocks are held (the least recently used goes first); the
//! lock is held for one admission, never across an await.

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::Mutex;

/// Prompt tokens in one cached block (vLLM's default block size).
pub const BLOCK_TOKENS: usize = 16;

/// What a request found in the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Admitted {
    pub(crate) prompt_tokens: u64,
    /// Full blocks of the longest cached prefix, in tokens.
    pub(crate) cached_tokens: u64,
}

/// The cache; `capacity` blocks at most.
pub(crate) struct PrefixCache {
    capacity: usize,
    inner: Mutex<Lru>,
}

#[derive(Default)]
struct Lru {
    /// Block key -> its last use.
    last_use: HashMap<u64, u64>,
    /// Last use -> block key (the oldest first).
    by_use: BTreeMap<u64, u64>,
    clock: u64,
}

impl Lru {
    fn touch(&mut self, key: u64) {
        self.clock += 1;
        if let Some(old) = self.last_use.insert(key, self.clock) {
            self.by_use.remove(&old);
        }
        self.by_use.insert(self.clock, key);
    }

    fn evict_to(&mut self, capacity: usize) {
        while self.last_use.len() > capacity {
            let Some((_, key)) = self.by_use.pop_first() else {
                return;
            };
            self.last_use.remove(&key);
        }
    }
}

impl PrefixCache {
    /// A cache of `capacity` blocks (at least 1).
    pub(crate) fn new(capacity: usize) -> PrefixCache {
        PrefixCache {
            capacity: capacity.max(1),
            inner: Mutex::new(Lru::default()),
        }
    }

    /// Look `prompt` up (the cached tokens of its longest cached prefix), then cache its
    /// full blocks.
    pub(crate) fn admit(&self, prompt: &str) -> Admitted {
        let words: Vec<&str> = prompt.split_whitespace().collect();
        let keys = block_keys(&words);
        // As vLLM, the last prompt token is always computed: a hit covers whole blocks
        // of the tokens before it.
        let lookable = words.len().saturating_sub(1) / BLOCK_TOKENS;
        let Ok(mut lru) = self.inner.lock() else {
            return Admitted {
                prompt_tokens: words.len() as u64,
                cached_tokens: 0,
            };
        };
        let hits = keys[..lookable]
            .iter()
            .take_while(|k| lru.last_use.contains_key(k))
            .count();
        for &k in &keys {
            lru.touch(k);
        }
        lru.evict_to(self.capacity);
        Admitted {
            prompt_tokens: words.len() as u64,
            cached_tokens: (hits * BLOCK_TOKENS) as u64,
        }
    }

    /// Blocks held now.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.inner.lock().map_or(0, |l| l.last_use.len())
    }
}

/// The key of each full block of `words`: a hash of the previous block's key and the
/// block's own words.
fn block_keys(words: &[&str]) -> Vec<u64> {
    let mut keys = Vec::with_capacity(words.len() / BLOCK_TOKENS);
    let mut prev = 0u64;
    for block in words.chunks_exact(BLOCK_TOKENS) {
        let mut h = std::hash::DefaultHasher::new();
        prev.hash(&mut h);
        block.hash(&mut h);
        prev = h.finish();
        keys.push(prev);
    }
    keys
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(n: usize, tag: &str) -> String {
        (0..n)
            .map(|i| format!("{tag}{i}"))
            .collect::<Vec<_>>()
            .join(" ")
    }

    #[test]
    fn only_full_blocks_of_a_true_prefix_hit() {
        let cache = PrefixCache::new(100);
        let first = words(40, "w");
        assert_eq!(cache.admit(&first).cached_tokens, 0);
        // The same 40 tokens and 10 more: its first two full blocks (32 tokens) hit.
        let longer = format!("{first} {}", words(10, "x"));
        assert_eq!(
            cache.admit(&longer),
            Admitted {
                prompt_tokens: 50,
                cached_tokens: 32
            }
        );
        // A different first token: no block is a prefix of it.
        let other = format!("z {first}");
        assert_eq!(cache.admit(&other).cached_tokens, 0);
    }

    #[test]
    fn the_least_recently_used_blocks_go_first_and_the_bound_holds() {
        let cache = PrefixCache::new(4);
        let a = words(32, "a"); // 2 blocks
        let b = words(32, "b"); // 2 blocks
        cache.admit(&a);
        cache.admit(&b);
        assert_eq!(cache.len(), 4);
        cache.admit(&a); // a is now the most recent
        cache.admit(&words(32, "c")); // evicts b
        assert_eq!(cache.len(), 4);
        // `a` again whole: its last token is computed, so its second block is not a hit.
        assert_eq!(cache.admit(&a).cached_tokens, 16);
        assert_eq!(cache.admit(&b).cached_tokens, 0);
    }
}
