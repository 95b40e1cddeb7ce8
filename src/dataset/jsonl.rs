//! Prompts from a JSONL dataset, one JSON object a line, in one of four formats
//! (detected from the first good line, or given): OpenAI chat (`messages`), completion
//! prompts (`prompt`), ShareGPT (`conversations` of `from`/`value`: the first human turn,
//! as vLLM's benchmark takes it) and raw request bodies (`request`). A file whose first
//! byte past white space is `[` is one JSON array of the same objects (ShareGPT_V3's
//! layout): its items are found by following strings and nesting, and each is read as a
//! line is. A bad line or item is refused with its number and reason, or counted and
//! skipped. With `--limit` and `--seed` the prompts are a seeded sample, the same on every
//! platform; the file is read twice (the offsets of good lines or items, then the chosen
//! ones), so memory holds the chosen prompts, one line or item, and 24 bytes per good one.
//!
//! With [`Turns::All`] a chat or ShareGPT line is a whole conversation read as a session
//! ([`turns_of`]): each user message (or run of them) starts a turn and the assistant
//! message after it is that turn's answer; the sample then picks conversations.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::Path;

use serde::Deserialize;
use serde_json::{Value, json};

use super::{Api, Ask, PlanSession, PlanTurn, Prompt, Seeded};
use crate::config::sessions::MAX_TURNS;

/// A dataset's line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    Chat,
    Completion,
    ShareGpt,
    Request,
}

impl Format {
    pub(crate) const ALL: [Format; 4] = [
        Format::Chat,
        Format::Completion,
        Format::ShareGpt,
        Format::Request,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Format::Chat => "chat",
            Format::Completion => "completion",
            Format::ShareGpt => "sharegpt",
            Format::Request => "request",
        }
    }

    /// The key that marks it.
    fn key(self) -> &'static str {
        match self {
            Format::Chat => "messages",
            Format::Completion => "prompt",
            Format::ShareGpt => "conversations",
            Format::Request => "request",
        }
    }

    pub(crate) fn api(self) -> Api {
        match self {
            Format::Chat | Format::ShareGpt => Api::Chat,
            Format::Completion => Api::Completions,
            Format::Request => Api::Raw,
        }
    }

    fn detect(line: &serde_json::Map<String, Value>) -> Option<Format> {
        Format::ALL.into_iter().find(|f| line.contains_key(f.key()))
    }
}

/// What `plan from-jsonl` was asked for.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    pub(crate) format: Option<Format>,
    pub(crate) limit: Option<u64>,
    pub(crate) seed: Option<u64>,
    pub(crate) skip_bad: bool,
    /// A top-level integer field of each line that becomes its `max_tokens`.
    pub(crate) output_len_from: Option<String>,
    /// How much of a conversation is read.
    pub(crate) turns: Turns,
}

/// How much of a chat or ShareGPT conversation `plan from-jsonl` reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Turns {
    /// One request a line: a chat line's `messages` as given, a ShareGPT line's first
    /// human turn.
    First,
    /// Every turn, as a session; at most `max` turns (the first ones) of each.
    All { max: Option<usize> },
}

/// The prompts read, and what was said about them.
#[derive(Debug)]
pub(crate) struct Dataset {
    pub(crate) format: Format,
    /// One a chosen line ([`Turns::First`]; else empty).
    pub(crate) prompts: Vec<Prompt>,
    /// One a chosen conversation ([`Turns::All`]; else empty), named as prompts are.
    pub(crate) sessions: Vec<PlanSession>,
    /// Good lines in the file (before any sample).
    pub(crate) good: u64,
    /// Bad lines skipped (`--skip-bad`), with the first few reasons.
    pub(crate) skipped: u64,
    pub(crate) first_skipped: Vec<String>,
    /// The file was one JSON array, not one object a line.
    pub(crate) array: bool,
}

/// Why a dataset file gives no prompts: which file or entry, and what is wrong with it.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DatasetError {
    /// The file cannot be opened.
    #[error("{file}: cannot read the dataset: {source}")]
    Open {
        file: String,
        #[source]
        source: std::io::Error,
    },
    /// The file cannot be read through.
    #[error("{file}: {source}")]
    Read {
        file: String,
        #[source]
        source: std::io::Error,
    },
    /// The file starts as a JSON array but is not one of objects.
    #[error("{file}: not a JSON array of objects: {why}")]
    NotArray { file: String, why: String },
    /// An entry (at `place`) is wrong and bad entries are not skipped.
    #[error("{place}: {why} (--skip-bad counts and skips bad {unit}s instead)")]
    Entry {
        place: String,
        unit: &'static str,
        #[source]
        why: Box<EntryError>,
    },
    /// No entry holds a prompt.
    #[error(
        "{file}: no prompt in the file (one JSON object a line, or one JSON array of objects, with messages, prompt, conversations or request)"
    )]
    NoPrompt { file: String },
    /// A chosen entry cannot be read again.
    #[error("{place}: {source} (did the file change while it was read?)")]
    Changed {
        place: String,
        #[source]
        source: std::io::Error,
    },
    /// `--turns all` of a file whose lines are not conversations.
    #[error(
        "{file}: --turns all reads conversations (chat or sharegpt lines), but the file is read as {format} lines; drop --turns all"
    )]
    NotConversations { file: String, format: &'static str },
    /// A chosen entry, read again, is no longer good.
    #[error("{place}: {why}")]
    Reread {
        place: String,
        #[source]
        why: Box<EntryError>,
    },
}

/// What is wrong with one entry (a line, or an item of an array).
#[derive(Debug, thiserror::Error)]
pub(crate) enum EntryError {
    #[error("not valid JSON ({0})")]
    Json(#[source] serde_json::Error),
    #[error("not a JSON object")]
    NotObject,
    #[error(
        "no messages, prompt, conversations or request: not a chat, completion, ShareGPT or raw request line"
    )]
    NoFormat,
    /// The entry lacks the field of the file's format; `other` names the format it
    /// looks like (with its leading space), if any.
    #[error(
        "has no {key}: the file is read as {format}{other}; give --format if the first line misled detection"
    )]
    NoField {
        key: &'static str,
        format: &'static str,
        other: String,
    },
    #[error("messages must be a non-empty list of message objects")]
    Messages,
    #[error("prompt must be a non-empty string")]
    Prompt,
    #[error("request must be a JSON object (the body to send)")]
    Request,
    #[error(
        "--output-len-from does not apply to raw request lines (they are sent as they are: put max_tokens in the request)"
    )]
    OutputLenOfRequest,
    #[error("{key} (--output-len-from) must be a positive integer, found {found}")]
    OutputLenNotPositive { key: String, found: Value },
    #[error("has no {key} (--output-len-from)")]
    OutputLenMissing { key: String },
    #[error("conversations must be a list of {{from, value}} turns")]
    Conversations,
    #[error("conversations has no human turn with a non-empty value")]
    NoHumanTurn,
    #[error(
        "message {index} has no role (a string): --turns all cuts turns at user and assistant messages"
    )]
    Role { index: usize },
    #[error(
        "conversations turn {index} is from {found:?}: --turns all reads human or user, gpt, assistant, chatgpt, bard, bing or model, and system turns"
    )]
    From { index: usize, found: String },
    #[error("conversations turn {index} needs from and value, both strings")]
    Turn { index: usize },
    #[error("no user message (human turn): nothing in the conversation asks for an answer")]
    NoUserMessage,
    #[error(
        "has {turns} turns; a session holds at most {MAX_TURNS}: give --max-turns N (the first N turns are kept)"
    )]
    TooManyTurns { turns: usize },
}

/// One line's prompt (or, with [`Turns::All`], its conversation's turns) and its own
/// output length.
struct Line {
    prompt: Value,
    turns: Vec<PlanTurn>,
    max_tokens: Option<u64>,
}

/// UTF-8's byte order mark.
const BOM: &[u8] = b"\xEF\xBB\xBF";

/// How one source entry is named: a line of a JSONL file, or an item of a file that is
/// one JSON array.
fn unit(array: bool) -> &'static str {
    if array { "item" } else { "line" }
}

/// Read `path` into prompts: one JSON object a line, or, when its first byte past a byte
/// order mark and white space is `[`, one JSON array of the same objects (as ShareGPT_V3
/// is distributed), read item by item as lines are: memory holds the chosen prompts, one
/// item and 24 bytes per good item, never the whole file.
pub(crate) fn read(path: &Path, opts: &Options, ask: &Ask) -> Result<Dataset, DatasetError> {
    let name = path.display();
    let file = || name.to_string();
    let open = || {
        File::open(path).map_err(|source| DatasetError::Open {
            file: file(),
            source,
        })
    };
    let mut format = opts.format;
    // Pass 1: every entry checked; the good ones' (number, offset, length) kept.
    let mut good: Vec<(u64, u64, usize)> = Vec::new();
    let (mut skipped, mut first_skipped) = (0u64, Vec::new());
    let mut reader = BufReader::new(open()?);
    let array = array_start(&mut reader).map_err(|source| DatasetError::Read {
        file: file(),
        source,
    })?;
    let place = |number: u64| match array {
        Some(_) => format!("{name}: item {number}"),
        None => format!("{name}:{number}"),
    };
    let mut each = |number: u64, at: u64, entry: &[u8]| match parse(entry, &mut format, opts) {
        Ok(_) => {
            good.push((number, at, entry.len()));
            Ok(())
        }
        Err(why) if opts.skip_bad => {
            skipped += 1;
            if first_skipped.len() < 5 {
                first_skipped.push(format!("{} {number}: {why}", unit(array.is_some())));
            }
            Ok(())
        }
        Err(why) => Err(DatasetError::Entry {
            place: place(number),
            unit: unit(array.is_some()),
            why: Box::new(why),
        }),
    };
    match array {
        Some(at) => scan_array(&mut reader, at, &mut each),
        None => scan_lines(BufReader::new(open()?), &mut each),
    }
    .map_err(|e| match e {
        Scan::Io(source) => DatasetError::Read {
            file: file(),
            source,
        },
        Scan::Array(why) => DatasetError::NotArray { file: file(), why },
        Scan::Entry(e) => e,
    })?;
    let Some(format) = format else {
        return Err(DatasetError::NoPrompt { file: file() });
    };
    if matches!(opts.turns, Turns::All { .. }) && format.api() != Api::Chat {
        return Err(DatasetError::NotConversations {
            file: file(),
            format: format.as_str(),
        });
    }
    let count = good.len() as u64;
    let chosen: Vec<usize> = match (opts.limit, opts.seed) {
        (Some(k), Some(seed)) => Seeded::new(seed)
            .sample(count, k)
            .into_iter()
            .map(|i| i as usize)
            .collect(),
        (Some(k), None) => (0..count.min(k) as usize).collect(),
        (None, _) => (0..good.len()).collect(),
    };
    // Pass 2: the chosen entries, read again.
    let picked = chosen.into_iter().map(|i| good[i]);
    let entries = Entries {
        format,
        array: array.is_some(),
        place: &place,
    };
    let (prompts, sessions) = reread(&mut open()?, picked, &entries, opts, ask)?;
    Ok(Dataset {
        format,
        prompts,
        sessions,
        good: count,
        skipped,
        first_skipped,
        array: array.is_some(),
    })
}

/// How pass 2 takes the chosen entries: the file's format, whether it is one JSON array,
/// and how an entry's place is named (by its number).
struct Entries<'a> {
    format: Format,
    array: bool,
    place: &'a dyn Fn(u64) -> String,
}

/// Pass 2: the `picked` entries (number, offset, length), read again from `file` into
/// prompts, or with [`Turns::All`] into sessions.
fn reread(
    file: &mut File,
    picked: impl ExactSizeIterator<Item = (u64, u64, usize)>,
    entries: &Entries<'_>,
    opts: &Options,
    ask: &Ask,
) -> Result<(Vec<Prompt>, Vec<PlanSession>), DatasetError> {
    let Entries {
        format,
        array,
        place,
    } = *entries;
    let all = matches!(opts.turns, Turns::All { .. });
    let mut prompts = Vec::with_capacity(if all { 0 } else { picked.len() });
    let mut sessions = Vec::with_capacity(if all { picked.len() } else { 0 });
    let mut line = Vec::new();
    for (number, at, len) in picked {
        line.resize(len, 0);
        file.seek(SeekFrom::Start(at))
            .and_then(|_| file.read_exact(&mut line))
            .map_err(|source| DatasetError::Changed {
                place: place(number),
                source,
            })?;
        let mut f = Some(format);
        let l = parse(&line, &mut f, opts).map_err(|why| DatasetError::Reread {
            place: place(number),
            why: Box::new(why),
        })?;
        let name = format!("{}-{number}", unit(array));
        if all {
            sessions.push(PlanSession {
                id: name,
                turns: l.turns,
            });
            continue;
        }
        prompts.push(Prompt {
            name,
            body: match format {
                Format::Request => l.prompt,
                _ => ask.body(format.api(), l.prompt, l.max_tokens),
            },
            prompt_tokens: None,
        });
    }
    Ok((prompts, sessions))
}

/// Why a pass over the file stopped: the file could not be read, the array around the
/// items is not one, or an entry is wrong (said in full).
enum Scan {
    Io(std::io::Error),
    Array(String),
    Entry(DatasetError),
}

impl From<std::io::Error> for Scan {
    fn from(e: std::io::Error) -> Scan {
        Scan::Io(e)
    }
}

/// One entry's number, offset in the file and bytes, handed to the pass.
type Each<'a> = dyn FnMut(u64, u64, &[u8]) -> Result<(), DatasetError> + 'a;

/// Pass 1 over a JSONL file: each line that is not blank, numbered from 1. A UTF-8 byte
/// order mark before the first line (as Windows editors save) is not part of the JSON.
fn scan_lines(mut reader: impl BufRead, each: &mut Each<'_>) -> Result<(), Scan> {
    let (mut offset, mut number, mut buf) = (0u64, 0u64, Vec::new());
    loop {
        buf.clear();
        let n = reader.read_until(b'\n', &mut buf)?;
        if n == 0 {
            return Ok(());
        }
        number += 1;
        let bom = if number == 1 && buf.starts_with(BOM) {
            BOM.len()
        } else {
            0
        };
        let line = &buf[bom..];
        let at = offset + bom as u64;
        offset += n as u64;
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        each(number, at, line).map_err(Scan::Entry)?;
    }
}

/// Whether the file is one JSON array: its first byte past a byte order mark and white
/// space is `[`. Then the reader is left just past that `[`, whose offset + 1 is returned.
fn array_start(reader: &mut impl BufRead) -> std::io::Result<Option<u64>> {
    let mut at = 0u64;
    if reader.fill_buf()?.starts_with(BOM) {
        reader.consume(BOM.len());
        at = BOM.len() as u64;
    }
    loop {
        let buf = reader.fill_buf()?;
        if buf.is_empty() {
            return Ok(None);
        }
        match buf.iter().position(|b| !b.is_ascii_whitespace()) {
            Some(i) if buf[i] == b'[' => {
                reader.consume(i + 1);
                return Ok(Some(at + i as u64 + 1));
            }
            Some(_) => return Ok(None),
            None => {
                let n = buf.len();
                reader.consume(n);
                at += n as u64;
            }
        }
    }
}

/// Pass 1 over a file that is one JSON array, from just past its `[` (at offset `at`):
/// each item's bytes, numbered from 1, found by following strings and nesting (the item
/// itself is parsed as a line is). Nothing but white space may follow the closing `]`.
fn scan_array(reader: &mut impl BufRead, mut at: u64, each: &mut Each<'_>) -> Result<(), Scan> {
    let bad = |why: String| Err(Scan::Array(why));
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    let (mut item, mut start, mut number) = (Vec::new(), None::<u64>, 0u64);
    let (mut after_comma, mut closed) = (false, false);
    loop {
        let buf = reader.fill_buf()?;
        if buf.is_empty() {
            return if closed {
                Ok(())
            } else {
                bad("the file ends before the array's closing ']'".into())
            };
        }
        for (i, &b) in buf.iter().enumerate() {
            let pos = at + i as u64;
            if closed {
                if !b.is_ascii_whitespace() {
                    return bad(format!("data after the array's closing ']' at byte {pos}"));
                }
                continue;
            }
            if in_string {
                item.push(b);
                if escaped {
                    escaped = false;
                } else if b == b'\\' {
                    escaped = true;
                } else if b == b'"' {
                    in_string = false;
                }
                continue;
            }
            match b {
                b',' | b']' if depth == 0 => {
                    match start.take() {
                        Some(s) => {
                            number += 1;
                            each(number, s, &item).map_err(Scan::Entry)?;
                            item.clear();
                        }
                        None if b == b',' || after_comma => {
                            return bad(format!("item {} is empty (a stray ',')", number + 1));
                        }
                        None => {}
                    }
                    after_comma = b == b',';
                    closed = b == b']';
                }
                _ if start.is_none() && b.is_ascii_whitespace() => {}
                _ => {
                    start.get_or_insert(pos);
                    item.push(b);
                    match b {
                        b'"' => in_string = true,
                        b'{' | b'[' => depth += 1,
                        b'}' | b']' => match depth.checked_sub(1) {
                            Some(d) => depth = d,
                            None => {
                                return bad(format!("an unmatched '{}' at byte {pos}", b as char));
                            }
                        },
                        _ => {}
                    }
                }
            }
        }
        let n = buf.len();
        reader.consume(n);
        at += n as u64;
    }
}

/// One line: its prompt in the file's format (detected from the first good line when not
/// given).
fn parse(bytes: &[u8], format: &mut Option<Format>, opts: &Options) -> Result<Line, EntryError> {
    let v: Value = serde_json::from_slice(bytes).map_err(EntryError::Json)?;
    let Value::Object(m) = v else {
        return Err(EntryError::NotObject);
    };
    // The file's format: given, or detected from the first line that turns out good.
    let f = match *format {
        Some(f) => f,
        None => Format::detect(&m).ok_or(EntryError::NoFormat)?,
    };
    let field = m.get(f.key()).ok_or_else(|| {
        let other = Format::detect(&m).map_or(String::new(), |o| {
            format!(" (it looks like a {} line)", o.as_str())
        });
        EntryError::NoField {
            key: f.key(),
            format: f.as_str(),
            other,
        }
    })?;
    if let (Turns::All { max }, Format::Chat | Format::ShareGpt) = (opts.turns, f) {
        let messages = match f {
            Format::ShareGpt => sharegpt_messages(field)?,
            _ => match field {
                Value::Array(a) if !a.is_empty() && a.iter().all(Value::is_object) => a.clone(),
                _ => return Err(EntryError::Messages),
            },
        };
        let turns = turns_of(messages, max)?;
        *format = Some(f);
        return Ok(Line {
            prompt: Value::Null,
            turns,
            max_tokens: None,
        });
    }
    let prompt = match f {
        Format::Chat => match field {
            Value::Array(a) if !a.is_empty() && a.iter().all(Value::is_object) => field.clone(),
            _ => return Err(EntryError::Messages),
        },
        Format::Completion => match field {
            Value::String(s) if !s.is_empty() => field.clone(),
            _ => return Err(EntryError::Prompt),
        },
        Format::ShareGpt => json!([{"role": "user", "content": first_human_turn(field)?}]),
        Format::Request => match field {
            Value::Object(_) => field.clone(),
            _ => return Err(EntryError::Request),
        },
    };
    let max_tokens = match &opts.output_len_from {
        None => None,
        Some(_) if f == Format::Request => {
            return Err(EntryError::OutputLenOfRequest);
        }
        Some(key) => match m.get(key) {
            Some(Value::Number(n)) if n.as_u64().is_some_and(|n| n > 0) => n.as_u64(),
            Some(other) => {
                return Err(EntryError::OutputLenNotPositive {
                    key: key.clone(),
                    found: other.clone(),
                });
            }
            None => return Err(EntryError::OutputLenMissing { key: key.clone() }),
        },
    };
    *format = Some(f);
    Ok(Line {
        prompt,
        turns: Vec::new(),
        max_tokens,
    })
}

/// A conversation's messages cut into turns. A turn is the messages after the previous
/// turn's answer up to an assistant message that follows a user (or tool) message, and
/// that assistant message is its answer: a run of user messages is one turn, and what
/// comes before the first user message (a system prompt, an assistant's greeting) starts
/// the first turn, so the history a turn is sent with is the transcript as written. A
/// user message after the last answer is the last turn, without an answer; messages
/// after the last answer with no user message among them ask for nothing and are
/// dropped. The first `max` turns are kept; more than [`MAX_TURNS`] is refused.
fn turns_of(messages: Vec<Value>, max: Option<usize>) -> Result<Vec<PlanTurn>, EntryError> {
    let mut turns = Vec::new();
    let (mut pending, mut asks) = (Vec::new(), false);
    for (i, m) in messages.into_iter().enumerate() {
        if max.is_some_and(|n| turns.len() >= n) {
            return Ok(turns);
        }
        let role = Role::deserialize(&m)
            .map_err(|_| EntryError::Role { index: i + 1 })?
            .role;
        if role == "assistant" && asks {
            turns.push(PlanTurn {
                messages: std::mem::take(&mut pending),
                answer: Some(m),
            });
            asks = false;
        } else {
            asks |= role == "user" || role == "tool";
            pending.push(m);
        }
    }
    if asks && max.is_none_or(|n| turns.len() < n) {
        turns.push(PlanTurn {
            messages: pending,
            answer: None,
        });
    }
    match turns.len() {
        0 => Err(EntryError::NoUserMessage),
        n if n > MAX_TURNS => Err(EntryError::TooManyTurns { turns: n }),
        _ => Ok(turns),
    }
}

/// A chat message's role, read from its JSON (the rest is kept as written).
#[derive(serde::Deserialize)]
struct Role<'a> {
    role: &'a str,
}

/// One turn of a ShareGPT conversation.
#[derive(serde::Deserialize)]
struct ShareGptTurn<'a> {
    from: &'a str,
    value: &'a str,
}

/// A ShareGPT conversation as chat messages: `from` human or user is a user message;
/// gpt, assistant, chatgpt, bard, bing or model an assistant's; system a system prompt.
fn sharegpt_messages(conversations: &Value) -> Result<Vec<Value>, EntryError> {
    let turns = conversations.as_array().ok_or(EntryError::Conversations)?;
    let mut out = Vec::with_capacity(turns.len());
    for (i, t) in turns.iter().enumerate() {
        let index = i + 1;
        let Ok(ShareGptTurn { from, value }) = ShareGptTurn::deserialize(t) else {
            return Err(EntryError::Turn { index });
        };
        let role = match from {
            "human" | "user" => "user",
            "gpt" | "assistant" | "chatgpt" | "bard" | "bing" | "model" => "assistant",
            "system" => "system",
            other => {
                return Err(EntryError::From {
                    index,
                    found: other.to_string(),
                });
            }
        };
        out.push(json!({"role": role, "content": value}));
    }
    Ok(out)
}

/// ShareGPT: the first turn `from` a human (`human` or `user`).
fn first_human_turn(conversations: &Value) -> Result<String, EntryError> {
    let turns = conversations.as_array().ok_or(EntryError::Conversations)?;
    turns
        .iter()
        .find(|t| {
            t.pointer("/from")
                .and_then(Value::as_str)
                .is_some_and(|f| f == "human" || f == "user")
        })
        .and_then(|t| t.pointer("/value").and_then(Value::as_str))
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .ok_or(EntryError::NoHumanTurn)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_byte_order_mark_before_the_first_line_is_not_json() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("bom.jsonl");
        let mut bytes = BOM.to_vec();
        bytes.extend_from_slice(b"{\"prompt\": \"one\"}\n{\"prompt\": \"two\"}\n");
        std::fs::write(&path, &bytes).unwrap_or_else(|e| panic!("{e}"));
        let opts = Options {
            format: None,
            limit: None,
            seed: None,
            skip_bad: false,
            output_len_from: None,
            turns: Turns::First,
        };
        let ask = Ask {
            model: None,
            max_tokens: None,
            stream: false,
            temperature: None,
            ignore_eos: false,
            min_tokens: false,
        };
        let d = read(&path, &opts, &ask).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(d.format, Format::Completion);
        let bodies: Vec<&Value> = d.prompts.iter().map(|p| &p.body).collect();
        assert_eq!(
            bodies,
            [&json!({"prompt": "one"}), &json!({"prompt": "two"})]
        );
        // Only before the first line: elsewhere it is a bad line, named.
        let path = dir.path().join("mid.jsonl");
        let mut bytes = b"{\"prompt\": \"one\"}\n".to_vec();
        bytes.extend_from_slice(BOM);
        bytes.extend_from_slice(b"{\"prompt\": \"two\"}\n");
        std::fs::write(&path, &bytes).unwrap_or_else(|e| panic!("{e}"));
        let err = read(&path, &opts, &ask).err();
        assert!(
            matches!(&err, Some(DatasetError::Entry { why, .. }) if matches!(**why, EntryError::Json(_))),
            "{err:?}"
        );
        let err = err.map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("mid.jsonl:2: not valid JSON"), "{err}");
    }

    fn m(role: &str, text: &str) -> Value {
        json!({"role": role, "content": text})
    }

    #[test]
    fn a_conversation_is_cut_at_its_answers_and_keeps_its_order() {
        let turns = |ms: &[Value], max| turns_of(ms.to_vec(), max);
        let (sys, hi, a1) = (m("system", "s"), m("assistant", "hi"), m("assistant", "a1"));
        let (u1, u2, u3) = (m("user", "u1"), m("user", "u2"), m("user", "u3"));
        let a2 = m("assistant", "a2");
        // A system prompt and a greeting start turn 1; a run of user messages is one
        // turn; a user message after the last answer is a last turn without one.
        let got = turns(
            &[
                sys.clone(),
                hi.clone(),
                u1.clone(),
                a1.clone(),
                u2.clone(),
                u3.clone(),
                a2.clone(),
                u1.clone(),
            ],
            None,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let want = [
            PlanTurn {
                messages: vec![sys, hi, u1.clone()],
                answer: Some(a1.clone()),
            },
            PlanTurn {
                messages: vec![u2.clone(), u3],
                answer: Some(a2.clone()),
            },
            PlanTurn {
                messages: vec![u1.clone()],
                answer: None,
            },
        ];
        assert_eq!(got, want);
        assert_eq!(
            turns(&[u1.clone(), a1.clone(), u2.clone(), a2.clone()], Some(1)).ok(),
            Some(vec![PlanTurn {
                messages: vec![u1.clone()],
                answer: Some(a1.clone())
            }]),
            "--max-turns keeps the first turns"
        );
        // A second answer in a row starts the next turn's messages; a tail with no user
        // message asks for nothing and is dropped.
        let tool = json!({"role": "tool", "tool_call_id": "c", "content": "42"});
        let got = turns(
            &[
                u1.clone(),
                a1.clone(),
                a2.clone(),
                tool.clone(),
                a1.clone(),
                a2.clone(),
            ],
            None,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(got.len(), 2);
        assert_eq!(
            got[1],
            PlanTurn {
                messages: vec![a2.clone(), tool],
                answer: Some(a1.clone())
            }
        );
        assert!(matches!(
            turns(std::slice::from_ref(&a1), None),
            Err(EntryError::NoUserMessage)
        ));
        assert!(matches!(
            turns(&[u1.clone(), json!({"content": "x"})], None),
            Err(EntryError::Role { index: 2 })
        ));
        let long: Vec<Value> = (0..=MAX_TURNS)
            .flat_map(|_| [u1.clone(), a1.clone()])
            .collect();
        assert!(
            matches!(turns(&long, None), Err(EntryError::TooManyTurns { turns }) if turns == MAX_TURNS + 1)
        );
        assert_eq!(
            turns(&long, Some(MAX_TURNS)).map(|t| t.len()).ok(),
            Some(MAX_TURNS)
        );
        let sharegpt = json!([{"from": "system", "value": "s"}, {"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]);
        assert_eq!(
            sharegpt_messages(&sharegpt).ok(),
            Some(vec![m("system", "s"), m("user", "q"), m("assistant", "a")])
        );
        let odd = json!([{"from": "human", "value": "q"}, {"from": "observation", "value": "a"}]);
        assert!(matches!(
            sharegpt_messages(&odd),
            Err(EntryError::From { index: 2, .. })
        ));
    }
}
