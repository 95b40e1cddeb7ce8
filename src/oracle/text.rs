//! The words of a difference: where two texts or byte strings first differ, shown as a
//! window of each side, and what a refused answer says, quoted for a message. Pure; a leaf
//! of `oracle`.

use serde_json::Value;

/// Characters a difference shows of each side before its first differing character, and
/// from it on: a window, so that a long answer's difference is seen and not cut away.
const BEFORE: usize = 24;
const AFTER: usize = 40;

/// Where two texts first differ (in characters) and `expected "…", found "…"`: a window of
/// each around that character, on character boundaries, `…` where a side is cut, control
/// characters, quotes and backslashes escaped.
pub(super) fn text_difference(expected: &str, found: &str) -> (usize, String) {
    let first = (expected.char_indices().zip(found.char_indices()))
        .enumerate()
        .find(|(_, ((_, e), (_, f)))| e != f);
    let (at, e_at, f_at) = match first {
        Some((n, ((ei, _), (fi, _)))) => (n, ei, fi),
        None => {
            // One is a prefix of the other: the difference starts where the shorter ends.
            let common = expected.len().min(found.len());
            (expected[..common].chars().count(), common, common)
        }
    };
    let shown = format!(
        "expected \"{}\", found \"{}\"",
        char_window(expected, e_at),
        char_window(found, f_at)
    );
    (at, shown)
}

/// `s` from [`BEFORE`] characters before byte `at` (a character boundary) to [`AFTER`]
/// characters after it, escaped, with `…` on a cut side.
fn char_window(s: &str, at: usize) -> String {
    let (head, tail) = s.split_at(at);
    let start = head
        .char_indices()
        .rev()
        .nth(BEFORE - 1)
        .map_or(0, |(i, _)| i);
    let end = tail
        .char_indices()
        .nth(AFTER)
        .map_or(s.len(), |(i, _)| at + i);
    windowed(&s[start..end], start > 0, end < s.len())
}

/// The bytes around `at` of a body that is not UTF-8, widened to whole UTF-8 sequences
/// where there are any; what is not UTF-8 shows as U+FFFD.
pub(super) fn byte_window(s: &[u8], at: usize) -> String {
    let continuation = |i: usize| s.get(i).is_some_and(|b| b & 0xC0 == 0x80);
    let mut start = at.saturating_sub(BEFORE);
    let mut end = (at + AFTER).min(s.len());
    for _ in 0..3 {
        if start > 0 && continuation(start) {
            start -= 1;
        }
        if end < s.len() && continuation(end) {
            end += 1;
        }
    }
    windowed(
        &String::from_utf8_lossy(&s[start..end]),
        start > 0,
        end < s.len(),
    )
}

/// Characters of a refused answer an error message shows.
const REASON_CHARS: usize = 200;

/// What an answer with an unexpected status says, quoted for an error message: the
/// `error.message`, `error`, `detail` or `message` string of a JSON object (OpenAI, TGI,
/// FastAPI), else the body's start; at most [`REASON_CHARS`] characters, `…` where cut,
/// control characters escaped. `None` for a body of white space only.
pub(crate) fn answer_reason(body: &[u8]) -> Option<String> {
    let json = (body.trim_ascii_start().first() == Some(&b'{'))
        .then(|| serde_json::from_slice::<Value>(body).ok())
        .flatten();
    let said = json.as_ref().and_then(|v| {
        [
            v.pointer("/error/message"),
            v.get("error"),
            v.get("detail"),
            v.get("message"),
        ]
        .into_iter()
        .flatten()
        .find_map(Value::as_str)
    });
    let start = &body[..body.len().min(4 * REASON_CHARS)];
    let text = match said {
        Some(s) => std::borrow::Cow::Borrowed(s),
        None => String::from_utf8_lossy(start),
    };
    let text = text.trim();
    if text.is_empty() {
        return None;
    }
    let end = (text.char_indices().nth(REASON_CHARS)).map_or(text.len(), |(i, _)| i);
    let cut = end < text.len() || (said.is_none() && start.len() < body.len());
    Some(format!("\"{}\"", windowed(&text[..end], false, cut)))
}

/// `text` escaped for a quoted message, with `…` before and after where it was cut.
fn windowed(text: &str, cut_before: bool, cut_after: bool) -> String {
    let mut out = String::with_capacity(text.len() + 8);
    if cut_before {
        out.push('…');
    }
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    if cut_after {
        out.push('…');
    }
    out
}

/// `s` for a message: at most `max` characters, the last three `...` when it is cut.
pub(super) fn cut(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let head: String = s.chars().take(max.saturating_sub(3)).collect();
    format!("{head}...")
}
