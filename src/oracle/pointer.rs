//! RFC 6901 JSON pointers as oracles use them (ignore paths, tolerances, mismatches),
//! a mismatch (where and why an answer broke its oracle) and JSON's canonical form (keys
//! sorted). A leaf of `oracle`: its other
//! files read these, never `mod.rs`.

use std::fmt;

use serde_json::Value;

/// A parsed RFC 6901 JSON pointer (never the root).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Pointer {
    text: String,
    pub(super) tokens: Vec<String>,
}

/// Why a string is not a [`Pointer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum PointerError {
    #[error(
        "the root pointer would ignore the whole response; use an exact-bytes oracle or remove the case"
    )]
    Root,
    #[error("a JSON pointer starts with '/' (RFC 6901)")]
    NoSlash,
    #[error("'~' must be followed by 0 or 1 (RFC 6901)")]
    Escape,
}

impl Pointer {
    pub(crate) fn parse(s: &str) -> Result<Pointer, PointerError> {
        if s.is_empty() {
            return Err(PointerError::Root);
        }
        let Some(rest) = s.strip_prefix('/') else {
            return Err(PointerError::NoSlash);
        };
        let mut tokens = Vec::new();
        for raw in rest.split('/') {
            let mut tok = String::with_capacity(raw.len());
            let mut chars = raw.chars();
            while let Some(c) = chars.next() {
                if c == '~' {
                    match chars.next() {
                        Some('0') => tok.push('~'),
                        Some('1') => tok.push('/'),
                        _ => return Err(PointerError::Escape),
                    }
                } else {
                    tok.push(c);
                }
            }
            tokens.push(tok);
        }
        Ok(Pointer {
            text: s.to_string(),
            tokens,
        })
    }

    pub(crate) fn as_str(&self) -> &str {
        &self.text
    }

    /// The value this pointer names in `root`, if any (array indices must be canonical).
    pub(crate) fn resolve<'v>(&self, root: &'v Value) -> Option<&'v Value> {
        let mut cur = root;
        for tok in &self.tokens {
            cur = match cur {
                Value::Object(m) => m.get(tok)?,
                Value::Array(a) if is_canonical_index(tok) => a.get(tok.parse::<usize>().ok()?)?,
                _ => return None,
            };
        }
        Some(cur)
    }

    /// Take the value this pointer names out of `root`: an object member is removed, an
    /// array element becomes `null` (so later positions keep their indices). `None` when
    /// the pointer does not resolve.
    pub(crate) fn take(&self, root: &mut Value) -> Option<Value> {
        let (last, parents) = self.tokens.split_last()?;
        let mut cur = root;
        for tok in parents {
            cur = match cur {
                Value::Object(m) => m.get_mut(tok)?,
                Value::Array(a) if is_canonical_index(tok) => {
                    a.get_mut(tok.parse::<usize>().ok()?)?
                }
                _ => return None,
            };
        }
        match cur {
            Value::Object(m) => m.shift_remove(last),
            Value::Array(a) if is_canonical_index(last) => {
                a.get_mut(last.parse::<usize>().ok()?).map(Value::take)
            }
            _ => None,
        }
    }
}

/// Where and why a response differs from its oracle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Mismatch {
    /// First differing JSON pointer (`""` is the whole document); `None` for exact bytes.
    pub(crate) pointer: Option<String>,
    pub(crate) reason: String,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.pointer {
            Some(p) if p.is_empty() => write!(f, "at the document root: {}", self.reason),
            Some(p) => write!(f, "at {p}: {}", self.reason),
            None => write!(f, "{}", self.reason),
        }
    }
}

/// `v` with every object's keys sorted (serde_json keeps insertion order here): the
/// canonical form drift compares and the workload hash serialises.
pub(crate) fn sort_keys(v: Value) -> Value {
    match v {
        Value::Object(m) => {
            let mut entries: Vec<(String, Value)> = m.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            Value::Object(
                entries
                    .into_iter()
                    .map(|(k, v)| (k, sort_keys(v)))
                    .collect(),
            )
        }
        Value::Array(a) => Value::Array(a.into_iter().map(sort_keys).collect()),
        other => other,
    }
}

/// A canonical array index: `0`, or digits without a leading zero (at most 18).
pub(super) fn is_canonical_index(tok: &str) -> bool {
    tok == "0"
        || (!tok.is_empty()
            && !tok.starts_with('0')
            && tok.len() <= 18
            && tok.bytes().all(|b| b.is_ascii_digit()))
}
