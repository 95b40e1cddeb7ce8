//! Fuzz entry points: each takes arbitrary bytes and must never panic, overflow the stack or
//! disagree with itself. `fuzz/` drives them with libFuzzer (`fuzz/run.sh`); the corpora it
//! keeps are replayed through the same functions as ordinary tests on stable
//! (`tests/it/fuzz_corpus.rs`), so a finding stays fixed.

use crate::config::plan::Plan;
use crate::oracle::{Oracle, Pointer};
use crate::sse::{Event, SseParser};

/// Plan parsing and validation: an error or a plan, never a panic.
pub fn plan(data: &[u8]) {
    if let Ok(p) = Plan::from_json_bytes(data) {
        // A plan that validates can be described and counted.
        let _ = p.planned_requests();
        for c in &p.cases {
            let _ = c.endpoint.url();
        }
    }
}

/// JSON pointer parsing.
pub fn pointer(data: &[u8]) {
    if let Ok(s) = std::str::from_utf8(data)
        && let Ok(p) = Pointer::parse(s)
    {
        assert_eq!(p.as_str(), s);
    }
}

/// Oracle comparison: the input is `expected \0 response`. Every response is judged
/// without panicking, and an expected document always matches itself.
pub fn oracle(data: &[u8]) {
    let (expected, body) = match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &data[..0]),
    };
    let Ok(expected) = serde_json::from_slice::<serde_json::Value>(expected) else {
        return;
    };
    let Ok(o) = Oracle::json(expected.clone(), Vec::new()) else {
        return;
    };
    let _ = o.check(body);
    let again = serde_json::to_vec(&expected).unwrap_or_default();
    assert_eq!(o.check(&again), Ok(()), "a document must match itself");
}

/// SSE parsing: the events do not depend on how the bytes were split into reads. The
/// first byte picks the read size.
pub fn sse(data: &[u8]) {
    let Some((&k, body)) = data.split_first() else {
        return;
    };
    let size = usize::from(k % 17) + 1;
    let whole = collect(&[body]);
    let chunks: Vec<&[u8]> = body.chunks(size).collect();
    let pieces = collect(&chunks);
    assert_eq!(
        whole, pieces,
        "splitting the bytes into reads of {size} changed the events"
    );
}

fn collect(chunks: &[&[u8]]) -> Vec<(Option<String>, String)> {
    let mut p = SseParser::new();
    let mut out: Vec<Event> = Vec::new();
    for c in chunks {
        if p.feed(c, 0, &mut out).is_err() {
            break;
        }
    }
    out.into_iter().map(|e| (e.event, e.data)).collect()
}
