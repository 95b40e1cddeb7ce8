//! Server-Sent Events: an incremental parser, and what a model stream says about itself.
//!
//! [`SseParser`] takes body bytes in whatever pieces the socket delivered (events split
//! across reads, several events in one read, `\r\n`, `\n` or `\r` line ends, comments,
//! multi-line `data:`) and yields complete events with the stamp of the read that completed
//! them. [`StreamTracker`] reads those events as an OpenAI-compatible stream when they look
//! like one (JSON with `choices`): which events carry generated content, the assembled
//! text, the final `usage`, and whether `data: [DONE]` arrived. Nothing here does I/O or
//! reads a clock: stamps come in from the caller.

use std::borrow::Cow;

use serde_json::Value;

/// Longest line kept while waiting for its end; a longer one is an error (a peer that
/// never ends a line must not make the parser hold unbounded memory).
pub(crate) const MAX_LINE_BYTES: usize = 16 << 20;

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Event {
    /// The `event:` field, if any.
    pub(crate) event: Option<String>,
    /// `data:` lines joined with `\n`.
    pub(crate) data: String,
    /// Stamp of the read that completed the event.
    pub(crate) at_ns: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("event stream line longer than {MAX_LINE_BYTES} bytes")]
pub(crate) struct LineTooLong;

/// Incremental SSE parser (WHATWG HTML, "event stream interpretation").
#[derive(Debug, Default)]
pub(crate) struct SseParser {
    line: Vec<u8>,
    /// The previous byte was `\r`: a following `\n` belongs to the same line end.
    after_cr: bool,
    data: String,
    has_data: bool,
    event: Option<String>,
    /// Past the stream's start (a leading BOM is skipped).
    started: bool,
    /// Bytes of a leading BOM seen so far.
    bom_seen: usize,
}

impl SseParser {
    pub(crate) fn new() -> SseParser {
        SseParser::default()
    }

    /// The body has ended: an event whose last line ended but whose blank line never came
    /// (`data: [DONE]\n` then the end) is dispatched, as if the blank line had come; a
    /// partial line stays undispatched. Stamped `at_ns`.
    pub(crate) fn finish(&mut self, at_ns: u64, out: &mut Vec<Event>) -> Result<(), LineTooLong> {
        self.feed(b"\n", at_ns, out)
    }

    /// Bytes of an event have arrived that no blank line has ended yet (a partial line,
    /// or fields waiting for their dispatch).
    pub(crate) fn mid_event(&self) -> bool {
        !self.line.is_empty() || self.has_data || self.event.is_some()
    }

    /// Feed bytes read at `at_ns`; complete events are pushed to `out`.
    pub(crate) fn feed(
        &mut self,
        bytes: &[u8],
        at_ns: u64,
        out: &mut Vec<Event>,
    ) -> Result<(), LineTooLong> {
        let mut bytes = bytes;
        // A leading byte-order mark is skipped, even when it arrives split across reads.
        while !self.started && !bytes.is_empty() {
            const BOM: &[u8; 3] = b"\xEF\xBB\xBF";
            if bytes[0] == BOM[self.bom_seen] {
                self.bom_seen += 1;
                bytes = &bytes[1..];
                if self.bom_seen == BOM.len() {
                    self.started = true;
                }
            } else {
                self.started = true;
                let partial = BOM[..self.bom_seen].to_vec();
                self.feed_bytes(&partial, at_ns, out)?;
            }
        }
        self.feed_bytes(bytes, at_ns, out)
    }

    fn feed_bytes(
        &mut self,
        bytes: &[u8],
        at_ns: u64,
        out: &mut Vec<Event>,
    ) -> Result<(), LineTooLong> {
        let mut bytes = bytes;
        while let Some(&first) = bytes.first() {
            // A `\n` right after a `\r` ends the same line.
            if self.after_cr && first == b'\n' {
                self.after_cr = false;
                bytes = &bytes[1..];
                continue;
            }
            self.after_cr = false;
            let end = memchr::memchr2(b'\n', b'\r', bytes);
            let text = &bytes[..end.unwrap_or(bytes.len())];
            if self.line.len() + text.len() > MAX_LINE_BYTES {
                return Err(LineTooLong);
            }
            self.line.extend_from_slice(text);
            let Some(i) = end else { break };
            self.after_cr = bytes[i] == b'\r';
            self.end_line(at_ns, out);
            bytes = &bytes[i + 1..];
        }
        Ok(())
    }

    fn end_line(&mut self, at_ns: u64, out: &mut Vec<Event>) {
        let line = std::mem::take(&mut self.line);
        if line.is_empty() {
            // Blank line: dispatch.
            if self.has_data {
                out.push(Event {
                    event: self.event.take(),
                    data: std::mem::take(&mut self.data),
                    at_ns,
                });
            }
            self.has_data = false;
            self.data.clear();
            self.event = None;
            return;
        }
        if line[0] == b':' {
            return; // comment
        }
        let (field, value) = match line.iter().position(|&c| c == b':') {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (&line[..], &b""[..]),
        };
        let value = String::from_utf8_lossy(value);
        match field {
            b"data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(&value);
                self.has_data = true;
            }
            b"event" => self.event = Some(value.into_owned()),
            _ => {} // id, retry and unknown fields do not matter here
        }
        self.line = line;
        self.line.clear();
    }
}

/// What an OpenAI-compatible stream's events say.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct StreamTracker {
    pub(crate) event_offsets_ns: Vec<u64>,
    /// Stamps of events that carried generated content.
    pub(crate) content_ns: Vec<u64>,
    /// Generated text, choice 0, in order.
    pub(crate) text: String,
    /// The last non-null `usage` object seen.
    pub(crate) usage: Option<Value>,
    /// An event's data was exactly `[DONE]`.
    pub(crate) done: bool,
    /// At least one event was JSON with a `choices` array (an OpenAI-style stream).
    pub(crate) openai: bool,
    pub(crate) events: u64,
}

/// An OpenAI-style chunk read for the fields the tracker needs, borrowing its strings
/// (an escaped one is the only one copied): no map or string is built per event for the
/// fields it skips. It reads only chunks of the expected shape, objects as objects; any
/// other JSON (a field of another type, an array where an object belongs, a duplicate key)
/// fails here and is read as a [`Value`] instead, so both readings agree wherever this one
/// succeeds (tested against each other below).
#[derive(serde::Deserialize)]
struct Chunk<'a> {
    #[serde(default, borrow)]
    choices: Option<Vec<Obj<ChunkChoice<'a>>>>,
    #[serde(default)]
    usage: Option<Value>,
}

#[derive(serde::Deserialize)]
struct ChunkChoice<'a> {
    #[serde(default)]
    index: Option<u64>,
    #[serde(default, borrow)]
    delta: Option<Obj<ChunkDelta<'a>>>,
    #[serde(default, borrow)]
    text: Option<Text<'a>>,
}

#[derive(serde::Deserialize)]
struct ChunkDelta<'a> {
    /// `None`: no `content` key; `Some(None)`: `"content": null`.
    #[serde(default, borrow, deserialize_with = "present")]
    content: Option<Option<Text<'a>>>,
}

/// A JSON string, borrowed from the event unless it has escapes (serde borrows a
/// `Cow<str>` only when it is the field's whole type, hence the newtype).
#[derive(serde::Deserialize)]
struct Text<'a>(#[serde(borrow)] Cow<'a, str>);

/// `T` read from a JSON object only: serde_json also reads a struct from an array (its
/// fields in order), which the `Value` reading would not.
struct Obj<T>(T);

impl<'de, T: serde::Deserialize<'de>> serde::Deserialize<'de> for Obj<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct ObjectOnly<T>(std::marker::PhantomData<T>);
        impl<'de, T: serde::Deserialize<'de>> serde::de::Visitor<'de> for ObjectOnly<T> {
            type Value = T;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                T::deserialize(serde::de::value::MapAccessDeserializer::new(map))
            }
        }
        d.deserialize_map(ObjectOnly(std::marker::PhantomData))
            .map(Obj)
    }
}

/// A string field's text, `""` when absent or `null`.
fn text<'s>(t: &'s Option<Text<'_>>) -> &'s str {
    t.as_ref().map_or("", |t| &t.0)
}

/// A key that is there, even as `null` (`Some(None)`).
fn present<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::Deserialize<'de>,
{
    T::deserialize(d).map(Some)
}

impl StreamTracker {
    pub(crate) fn on_event(&mut self, ev: &Event) {
        self.events += 1;
        self.event_offsets_ns.push(ev.at_ns);
        if ev.data == "[DONE]" {
            self.done = true;
            return;
        }
        match serde_json::from_str::<Obj<Chunk>>(&ev.data) {
            Ok(Obj(chunk)) => self.on_chunk(chunk, ev.at_ns),
            Err(_) => self.on_value(ev),
        }
    }

    /// [`StreamTracker::on_value`] for a chunk of the expected shape.
    fn on_chunk(&mut self, chunk: Chunk<'_>, at_ns: u64) {
        if let Some(u) = chunk.usage.filter(Value::is_object) {
            self.usage = Some(u);
        }
        let Some(choices) = chunk.choices else {
            return;
        };
        self.openai = true;
        let mut content = false;
        for Obj(c) in &choices {
            let piece = match c.delta.as_ref().and_then(|d| d.0.content.as_ref()) {
                Some(content) => text(content),
                None => text(&c.text),
            };
            if piece.is_empty() {
                continue;
            }
            content = true;
            if c.index.unwrap_or(0) == 0 {
                self.text.push_str(piece);
            }
        }
        if content {
            self.content_ns.push(at_ns);
        }
    }

    /// Any JSON event: read as a [`Value`], leniently (a field of an unexpected type reads
    /// as absent).
    fn on_value(&mut self, ev: &Event) {
        let Ok(v) = serde_json::from_str::<Value>(&ev.data) else {
            return;
        };
        if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
            self.usage = Some(u.clone());
        }
        let Some(choices) = v.get("choices").and_then(Value::as_array) else {
            return;
        };
        self.openai = true;
        let mut content = false;
        for c in choices {
            let piece = c
                .get("delta")
                .and_then(|d| d.get("content"))
                .or_else(|| c.get("text"))
                .and_then(Value::as_str)
                .unwrap_or("");
            if piece.is_empty() {
                continue;
            }
            content = true;
            if c.get("index").and_then(Value::as_u64).unwrap_or(0) == 0 {
                self.text.push_str(piece);
            }
        }
        if content {
            self.content_ns.push(ev.at_ns);
        }
    }

    /// `usage.<field>` as an integer.
    /// A count in the stream's usage object, when it is one a worker could mean: 0 to
    /// 2^40 (a negative or absurd value from a broken or hostile worker is not a count,
    /// and a row holding one would be refused when read back).
    pub(crate) fn usage_field(&self, field: &str) -> Option<i64> {
        count(self.usage.as_ref()?.get(field)?)
    }

    /// The usage object's `prompt_tokens_details.cached_tokens` (the prompt tokens the
    /// server's prefix cache served), when it is a count as [`Self::usage_field`] reads.
    pub(crate) fn usage_cached_tokens(&self) -> Option<i64> {
        count(
            self.usage
                .as_ref()?
                .get("prompt_tokens_details")?
                .get("cached_tokens")?,
        )
    }
}

/// A count a worker could mean: an integer 0 to 2^40.
fn count(v: &Value) -> Option<i64> {
    let n = v.as_i64()?;
    (0..=1i64 << 40).contains(&n).then_some(n)
}

/// Parse a whole recorded body (for oracles): every event, stamps zero.
pub(crate) fn parse_all(body: &[u8]) -> Result<Vec<Event>, LineTooLong> {
    let mut p = SseParser::new();
    let mut out = Vec::new();
    p.feed(body, 0, &mut out)?;
    // A final event without its blank line is not dispatched (spec), but a stream that
    // ends right after `data: [DONE]\n` is common enough to accept; the capture does the
    // same at the end of a body, so the row and the oracle see the same events.
    p.finish(0, &mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(chunks: &[&[u8]]) -> Vec<(String, u64)> {
        let mut p = SseParser::new();
        let mut out = Vec::new();
        for (i, c) in chunks.iter().enumerate() {
            p.feed(c, i as u64 + 1, &mut out).unwrap();
        }
        out.into_iter().map(|e| (e.data, e.at_ns)).collect()
    }

    #[test]
    fn events_split_across_reads_get_the_stamp_of_the_completing_read() {
        assert_eq!(
            events(&[b"da", b"ta: hel", b"lo\n", b"\n"]),
            vec![("hello".to_string(), 4)]
        );
    }

    #[test]
    fn several_events_in_one_read() {
        assert_eq!(
            events(&[b"data: a\n\ndata: b\n\ndata: c"]),
            vec![("a".to_string(), 1), ("b".to_string(), 1)]
        );
    }

    #[test]
    fn crlf_cr_and_lf_line_ends() {
        assert_eq!(
            events(&[b"data: a\r\n\r\ndata: b\r\rdata: c\n\n"]),
            vec![("a".into(), 1), ("b".into(), 1), ("c".into(), 1)]
        );
        // \r at the end of one read and \n at the start of the next are one line end.
        assert_eq!(events(&[b"data: a\r", b"\n\r\n"]), vec![("a".into(), 2)]);
    }

    #[test]
    fn comments_multiline_data_and_fields() {
        let mut p = SseParser::new();
        let mut out = Vec::new();
        p.feed(
            b": keep-alive\n\nevent: delta\nid: 7\ndata: one\ndata:two\ndata\n\n",
            5,
            &mut out,
        )
        .unwrap();
        assert_eq!(
            out,
            vec![Event {
                event: Some("delta".into()),
                data: "one\ntwo\n".into(),
                at_ns: 5
            }]
        );
    }

    #[test]
    fn bom_is_skipped_and_long_lines_are_refused() {
        assert_eq!(events(&[b"\xEF\xBB\xBFdata: x\n\n"]), vec![("x".into(), 1)]);
        assert_eq!(
            events(&[b"\xEF", b"\xBB\xBFdata: x\n\n"]),
            vec![("x".into(), 2)]
        );
        // Not a BOM after all: the bytes stay (here they spoil the field name).
        assert_eq!(events(&[b"\xEF", b"data: x\n\n"]).len(), 0);
        let mut p = SseParser::new();
        let big = vec![b'a'; MAX_LINE_BYTES + 1];
        assert_eq!(p.feed(&big, 1, &mut Vec::new()), Err(LineTooLong));
    }

    #[test]
    fn openai_chat_stream_tracking() {
        let body = concat!(
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\"}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2}}\n\n",
            "data: [DONE]\n\n"
        );
        let mut t = StreamTracker::default();
        for (i, e) in parse_all(body.as_bytes()).unwrap().iter().enumerate() {
            let mut e = e.clone();
            e.at_ns = 10 * (i as u64 + 1);
            t.on_event(&e);
        }
        assert_eq!(t.events, 6);
        assert_eq!(t.content_ns, vec![20, 30]);
        assert_eq!(t.text, "Hello");
        assert!(t.done && t.openai);
        assert_eq!(
            (
                t.usage_field("prompt_tokens"),
                t.usage_field("completion_tokens")
            ),
            (Some(3), Some(2))
        );
    }

    /// A usage chunk's `prompt_tokens_details.cached_tokens` is read when it is a count;
    /// a usage chunk without it, or with a value no worker means, reports none.
    #[test]
    fn a_usage_chunks_cached_tokens_are_read() {
        let cached = |usage: &str| {
            let body = format!("data: {{\"choices\":[],\"usage\":{usage}}}\n\ndata: [DONE]\n\n");
            let mut t = StreamTracker::default();
            parse_all(body.as_bytes())
                .unwrap()
                .iter()
                .for_each(|e| t.on_event(e));
            t.usage_cached_tokens()
        };
        let with = |details: &str| {
            cached(&format!(
                r#"{{"prompt_tokens":9,"completion_tokens":2,"prompt_tokens_details":{details}}}"#
            ))
        };
        assert_eq!(with(r#"{"cached_tokens":7}"#), Some(7));
        assert_eq!(with(r#"{"cached_tokens":0}"#), Some(0));
        assert_eq!(cached(r#"{"prompt_tokens":9,"completion_tokens":2}"#), None);
        assert_eq!(with("null"), None);
        assert_eq!(with(r#"{"cached_tokens":-3}"#), None);
        assert_eq!(with(r#"{"cached_tokens":1.5}"#), None);
    }

    /// The line splitter (memchr over each read) against the rule it implements, byte by
    /// byte, on pseudo-random streams of line ends and field bytes in random reads.
    #[test]
    fn line_ends_found_in_bulk_match_the_byte_rule() {
        fn by_byte(reads: &[&[u8]]) -> Vec<(Option<String>, String, u64)> {
            let mut p = SseParser::new();
            let mut out = Vec::new();
            for (at, r) in reads.iter().enumerate() {
                for &b in *r {
                    match b {
                        b'\n' if p.after_cr => p.after_cr = false,
                        b'\n' | b'\r' => {
                            p.after_cr = b == b'\r';
                            p.end_line(at as u64, &mut out);
                        }
                        _ => {
                            p.after_cr = false;
                            p.line.push(b);
                        }
                    }
                }
            }
            out.into_iter()
                .map(|e| (e.event, e.data, e.at_ns))
                .collect()
        }
        let alphabet = b"\r\n\n\r:: datevnx";
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        for _ in 0..500 {
            let len = next(200) as usize;
            let body: Vec<u8> = (0..len)
                .map(|_| alphabet[next(alphabet.len() as u64) as usize])
                .collect();
            let mut reads: Vec<&[u8]> = Vec::new();
            let mut rest = &body[..];
            while !rest.is_empty() {
                let k = (next(9) as usize + 1).min(rest.len());
                reads.push(&rest[..k]);
                rest = &rest[k..];
            }
            let mut p = SseParser::new();
            let mut out = Vec::new();
            for (at, r) in reads.iter().enumerate() {
                p.feed_bytes(r, at as u64, &mut out).unwrap();
            }
            let bulk: Vec<_> = out
                .into_iter()
                .map(|e| (e.event, e.data, e.at_ns))
                .collect();
            assert_eq!(
                bulk,
                by_byte(&reads),
                "{:?}",
                String::from_utf8_lossy(&body)
            );
        }
    }

    /// The borrowed reading of a chunk and the `Value` one agree on every event, of the
    /// usual shapes and of odd ones (fields of other types, nulls, duplicates, escapes).
    #[test]
    fn the_chunk_reading_agrees_with_the_value_reading() {
        let datas = [
            r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#,
            r#"{"id":"x","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"Hel\u00e9\n"},"finish_reason":null}]}"#,
            r#"{"choices":[{"index":1,"delta":{"content":"other"}},{"index":0,"delta":{"content":"zero"}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"content":null},"text":"t"}]}"#,
            r#"{"choices":[{"index":0,"delta":{},"text":"t"}]}"#,
            r#"{"choices":[{"index":0,"delta":null,"text":"t"}]}"#,
            r#"{"choices":[{"index":0,"text":null}]}"#,
            r#"{"choices":[{"index":"0","delta":{"content":"s"}}]}"#,
            r#"{"choices":[{"index":-1,"delta":{"content":"neg"}}]}"#,
            r#"{"choices":[{"index":0.0,"delta":{"content":"f"}}]}"#,
            r#"{"choices":[{"delta":{"content":5}}]}"#,
            r#"{"choices":[{"delta":"x","text":"t"}]}"#,
            r#"{"choices":[3,"x",null]}"#,
            r#"{"choices":{"0":{"delta":{"content":"obj"}}}}"#,
            r#"{"choices":null,"usage":{"completion_tokens":2}}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}"#,
            r#"{"choices":[],"usage":null}"#,
            r#"{"choices":[],"usage":7}"#,
            r#"{"choices":[{"delta":{"content":"a"}}],"choices":[{"delta":{"content":"b"}}]}"#,
            r#"{"usage":{"total_tokens":1}}"#,
            r#"[1,2]"#,
            r#""text""#,
            r#"{"choices":[{"delta":{"content":"a"}}]"#,
            r#"[[]]"#,
            r#"{"choices":[[0,{"content":"x"}]]}"#,
            r#"{"choices":[{"delta":["x"]}]}"#,
            r#"{"choices":[{"index":0,"delta":{"content":"after"}}]}"#,
        ];
        let mut fast = StreamTracker::default();
        let mut slow = StreamTracker::default();
        for (i, d) in datas.iter().enumerate() {
            let ev = Event {
                event: None,
                data: d.to_string(),
                at_ns: i as u64,
            };
            fast.on_event(&ev);
            slow.events += 1;
            slow.event_offsets_ns.push(ev.at_ns);
            slow.on_value(&ev);
            assert_eq!(fast, slow, "after {d}");
        }
        assert!(fast.openai && fast.text.contains("zero") && !fast.text.contains("other"));
        // The usual shapes take the borrowed reading (the comparison above is not of the
        // fallback against itself).
        for d in &datas[..7] {
            assert!(serde_json::from_str::<Obj<Chunk>>(d).is_ok(), "{d}");
        }
        // An unescaped piece is borrowed from the event, not copied.
        let data = datas[2];
        let Ok(Obj(chunk)) = serde_json::from_str::<Obj<Chunk>>(data) else {
            panic!("{data}");
        };
        let choices = chunk.choices.unwrap_or_default();
        let Some(Some(Some(Text(Cow::Borrowed(piece))))) =
            choices[1].0.delta.as_ref().map(|d| &d.0.content)
        else {
            panic!("not borrowed");
        };
        assert_eq!(*piece, "zero");
    }

    #[test]
    fn completions_stream_text_field() {
        let mut t = StreamTracker::default();
        for e in
            parse_all(b"data: {\"choices\":[{\"index\":0,\"text\":\"a b\"}]}\n\ndata: [DONE]\n")
                .unwrap()
        {
            t.on_event(&e);
        }
        assert_eq!(
            (t.text.as_str(), t.content_ns.len(), t.done),
            ("a b", 1, true)
        );
    }
}
