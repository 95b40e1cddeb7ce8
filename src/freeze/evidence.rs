//! What repeated answers to one request say (pure): which JSON leaves differed while the
//! rest agreed (volatile: ids, timestamps, cache counters, they become ignore paths),
//! and whether the *content* differed (the request is nondeterministic: no ignore path
//! can make a replay of it pass reliably). A leaf is content when it sits under
//! [`CONTENT_POINTERS`] or the decisions container; a difference of type, key set or
//! array length anywhere is a difference of content too, since an ignore path only
//! excuses a primitive leaf of the same type.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::oracle::{escape_token, json_kind};

/// Where an OpenAI-compatible answer keeps what was generated: message content, text,
/// finish reason, tool calls, logprobs.
pub(crate) const CONTENT_POINTERS: &[&str] = &["/choices"];

/// Leaves that change on every answer of an OpenAI-compatible server (or with its cache
/// state) whatever was generated: ignored wherever they are primitive leaves of the
/// frozen answer, with or without evidence from repeats.
pub(crate) const VOLATILE_POINTERS: &[&str] = &[
    "/id",
    "/created",
    "/system_fingerprint",
    "/usage/prompt_tokens_details/cached_tokens",
];

/// How a repeated answer differed from the first one.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Difference {
    /// Primitive leaves outside the content that differed (same type, other value).
    pub(crate) volatile: BTreeSet<String>,
    /// The first place where the content differed (`None`: it agreed).
    pub(crate) content: Option<String>,
}

/// How `b` differs from `a` (the first answer), with `content` the pointers (besides
/// [`CONTENT_POINTERS`]) whose subtrees are content.
pub(crate) fn json_difference(a: &Value, b: &Value, content: &[String]) -> Difference {
    let mut d = Difference::default();
    let mut path = String::new();
    walk(a, b, &mut path, content, &mut d);
    d
}

fn is_content(path: &str, content: &[String]) -> bool {
    let under = |p: &str| path == p || path.starts_with(&format!("{p}/"));
    CONTENT_POINTERS.iter().any(|p| under(p)) || content.iter().any(|p| under(p))
}

/// Every volatile leaf is collected, also past a difference of content (a repeat that
/// generated other text still shows which stamps change); the first content difference
/// in document order is kept.
fn walk(a: &Value, b: &Value, path: &mut String, content: &[String], d: &mut Difference) {
    let structural = |d: &mut Difference, path: &str| {
        d.content.get_or_insert_with(|| {
            if path.is_empty() {
                "/".into()
            } else {
                path.into()
            }
        });
    };
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            if x.len() != y.len() || x.keys().any(|k| !y.contains_key(k)) {
                return structural(d, path);
            }
            for (k, va) in x {
                let len = path.len();
                path.push('/');
                escape_token(k, path);
                walk(va, &y[k], path, content, d);
                path.truncate(len);
            }
        }
        (Value::Array(x), Value::Array(y)) => {
            if x.len() != y.len() {
                return structural(d, path);
            }
            for (i, (va, vb)) in x.iter().zip(y).enumerate() {
                let len = path.len();
                path.push('/');
                path.push_str(&i.to_string());
                walk(va, vb, path, content, d);
                path.truncate(len);
            }
        }
        _ if a == b => {}
        _ if same_kind(a, b) && !is_content(path, content) => {
            d.volatile.insert(path.clone());
        }
        _ => structural(d, path),
    }
}

/// The same JSON type as an ignore path requires it (integer and fractional numbers are
/// different types); containers never reach here.
fn same_kind(a: &Value, b: &Value) -> bool {
    json_kind(a) == json_kind(b)
}

/// The documented volatile leaves that are primitive leaves of `answer`.
pub(crate) fn volatile_present(answer: &Value) -> BTreeSet<String> {
    VOLATILE_POINTERS
        .iter()
        .filter(|p| {
            answer
                .pointer(p)
                .is_some_and(|v| !matches!(v, Value::Object(_) | Value::Array(_)))
        })
        .map(|p| p.to_string())
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn diff(a: Value, b: Value) -> Difference {
        json_difference(&a, &b, &["/answers".to_string()])
    }

    #[test]
    fn stamps_outside_the_content_are_volatile() {
        let a = json!({"id": "a1", "created": 1, "model": "m",
                       "choices": [{"message": {"content": "hi"}}],
                       "usage": {"prompt_tokens": 3, "prompt_tokens_details": {"cached_tokens": 0}}});
        let mut b = a.clone();
        for (at, v) in [
            ("/id", json!("a2")),
            ("/created", json!(2)),
            ("/usage/prompt_tokens_details/cached_tokens", json!(3)),
        ] {
            *b.pointer_mut(at).expect("present") = v;
        }
        let d = diff(a.clone(), b);
        assert_eq!(d.content, None);
        assert_eq!(
            d.volatile.into_iter().collect::<Vec<_>>(),
            [
                "/created",
                "/id",
                "/usage/prompt_tokens_details/cached_tokens"
            ]
        );
        assert_eq!(diff(a.clone(), a), Difference::default());
    }

    #[test]
    fn generated_content_and_structure_are_content() {
        let a = json!({"id": "x", "choices": [{"message": {"content": "hi"}}]});
        let b = json!({"id": "y", "choices": [{"message": {"content": "ho"}}]});
        assert_eq!(
            diff(a.clone(), b).content.as_deref(),
            Some("/choices/0/message/content")
        );
        // The decisions container is content too.
        let d = diff(json!({"answers": {"a": 1}}), json!({"answers": {"a": 2}}));
        assert_eq!(d.content.as_deref(), Some("/answers/a"));
        // Stamps are still learnt past a content difference.
        let d = diff(
            json!({"choices": [{"text": "a"}], "id": 1}),
            json!({"choices": [{"text": "b"}], "id": 2}),
        );
        assert_eq!(d.content.as_deref(), Some("/choices/0/text"));
        assert_eq!(d.volatile.into_iter().collect::<Vec<_>>(), ["/id"]);
        // A key set, an array length or a type that changed cannot be ignored.
        for (x, y, at) in [
            (json!({"a": 1}), json!({"a": 1, "b": 2}), "/"),
            (json!({"l": [1]}), json!({"l": [1, 2]}), "/l"),
            (json!({"t": 1}), json!({"t": 1.5}), "/t"),
            (json!({"t": null}), json!({"t": "fp"}), "/t"),
            (json!({"a~b/c": 1}), json!({"a~b/c": "1"}), "/a~0b~1c"),
        ] {
            let d = diff(x, y);
            assert_eq!(d.content.as_deref(), Some(at));
            assert!(d.volatile.is_empty());
        }
    }

    #[test]
    fn the_documented_volatile_leaves_where_present() {
        let a = json!({"id": "x", "created": 5, "system_fingerprint": null,
                       "usage": {"prompt_tokens_details": {"cached_tokens": 4}}});
        assert_eq!(
            volatile_present(&a).into_iter().collect::<Vec<_>>(),
            [
                "/created",
                "/id",
                "/system_fingerprint",
                "/usage/prompt_tokens_details/cached_tokens"
            ]
        );
        assert!(volatile_present(&json!({"id": {"nested": 1}})).is_empty());
        assert!(volatile_present(&json!([1, 2])).is_empty());
    }
}
