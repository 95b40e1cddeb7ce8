//! Reading a public LLM trace one line at a time (`plan from-trace`): Mooncake JSONL,
//! the Azure LLM inference trace CSV and BurstGPT CSV, each line to a [`Record`] (its
//! timestamp in nanoseconds, its token counts, its Mooncake hash ids) or a
//! [`LineError`] the caller names `FILE:LINE: reason` with. CSV columns are found by the
//! header row's names; a field may be quoted (`"..."`, `""` inside), but not span lines.

use std::io::BufRead;

use serde::Deserialize;
use serde_json::Value;

/// A trace file's format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    /// JSONL: `timestamp` (ms), `input_length`, `output_length`, `hash_ids`.
    Mooncake,
    /// CSV: `TIMESTAMP` (a datetime), `ContextTokens`, `GeneratedTokens`.
    Azure,
    /// CSV: `Timestamp` (seconds), `Request tokens`, `Response tokens`.
    BurstGpt,
}

impl Format {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Format::Mooncake => "mooncake",
            Format::Azure => "azure",
            Format::BurstGpt => "burstgpt",
        }
    }

    /// The CSV columns read: timestamp, input tokens, output tokens.
    fn columns(self) -> [&'static str; 3] {
        match self {
            Format::Mooncake => ["timestamp", "input_length", "output_length"],
            Format::Azure => ["TIMESTAMP", "ContextTokens", "GeneratedTokens"],
            Format::BurstGpt => ["Timestamp", "Request tokens", "Response tokens"],
        }
    }
}

/// The most bytes of one line (a Mooncake line of 2,049 hash ids is some 30 KB).
pub(crate) const MAX_LINE_BYTES: usize = 1 << 20;
/// The most input or output tokens of one entry (trace format v1).
pub(crate) const MAX_TOKENS: u64 = 1 << 20;
/// Mooncake hash ids are below this; ids the trace does not give start here.
pub(crate) const FRESH_IDS: u64 = 1 << 40;
/// The largest offset or timestamp in microseconds (2^53 - 1: exact in a JSON double).
pub(crate) const MAX_US: u64 = (1 << 53) - 1;

/// One line of a trace.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Record {
    /// Nanoseconds from the format's zero (the Unix epoch for Azure's datetimes).
    pub(crate) ts_ns: u64,
    pub(crate) input: u64,
    /// 0: a failed request (BurstGPT writes these).
    pub(crate) output: u64,
    /// Mooncake's prefix block ids (empty for the CSV formats).
    pub(crate) hash_ids: Vec<u64>,
}

/// Why a line of a trace is refused.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LineError {
    #[error("longer than {MAX_LINE_BYTES} bytes")]
    TooLong,
    #[error("not UTF-8 text")]
    NotUtf8,
    #[error("not valid JSON ({0})")]
    NotJson(#[source] serde_json::Error),
    #[error("not a JSON object")]
    NotObject,
    #[error("no field {0:?}")]
    Missing(&'static str),
    #[error("{field} is not a number ({got})")]
    NotNumber { field: &'static str, got: String },
    #[error("{field} {got} is not a whole number")]
    NotInteger { field: &'static str, got: String },
    #[error("{field} {got} is negative")]
    Negative { field: &'static str, got: String },
    #[error("{field} {got} is not a finite number")]
    NotFinite { field: &'static str, got: String },
    #[error(
        "{field} {got} is past 2^53 microseconds (some 285 years), the largest time a trace holds"
    )]
    Huge { field: &'static str, got: String },
    #[error("{field} {got} is not a datetime like 2023-11-16 18:15:46.6805900 ({source})")]
    NotDatetime {
        field: &'static str,
        got: String,
        #[source]
        source: chrono::ParseError,
    },
    #[error("{field} {value} is out of range: give {min} to {MAX_TOKENS}")]
    Tokens {
        field: &'static str,
        value: u64,
        min: u64,
    },
    #[error("hash_ids is not an array of whole numbers >= 0 (item {0})")]
    HashId(usize),
    #[error("hash id {value} (item {index}) is not below 2^40")]
    HashIdTooLarge { index: usize, value: u64 },
    #[error(
        "{given} hash_ids for {input} input tokens in blocks of {block_tokens}: at most {need}"
    )]
    TooManyHashIds {
        given: usize,
        input: u64,
        block_tokens: u32,
        need: u64,
    },
    #[error("a quoted field is not closed on its line")]
    Quote,
    #[error(
        "the header has no column {column:?}: a {format} trace's header names {}; this one names {header}",
        needed.join(", ")
    )]
    NoColumn {
        format: &'static str,
        column: &'static str,
        needed: [&'static str; 3],
        header: String,
    },
    #[error("no field {column:?} (column {index} of the header; the row has {fields} fields)")]
    ShortRow {
        column: &'static str,
        index: usize,
        fields: usize,
    },
}

/// Lines of a reader, numbered from 1, each at most [`MAX_LINE_BYTES`] (one held at a
/// time), without their line ends.
pub(crate) struct Lines<R> {
    reader: R,
    buf: Vec<u8>,
    number: u64,
}

impl<R: BufRead> Lines<R> {
    pub(crate) fn new(reader: R) -> Lines<R> {
        Lines {
            reader,
            buf: Vec::new(),
            number: 0,
        }
    }

    /// The next line and its number, `None` at the end.
    pub(crate) fn next_line(&mut self) -> std::io::Result<Option<(u64, Result<&str, LineError>)>> {
        self.buf.clear();
        let limit = MAX_LINE_BYTES as u64 + 2;
        let n = std::io::Read::take(&mut self.reader, limit).read_until(b'\n', &mut self.buf)?;
        if n == 0 {
            return Ok(None);
        }
        self.number += 1;
        if self.buf.last() == Some(&b'\n') {
            self.buf.pop();
        } else if n as u64 == limit {
            // Skip the rest of the long line, so the next line's number is right.
            let mut rest = Vec::new();
            loop {
                rest.clear();
                let m =
                    std::io::Read::take(&mut self.reader, 1 << 16).read_until(b'\n', &mut rest)?;
                if m == 0 || rest.last() == Some(&b'\n') {
                    break;
                }
            }
            return Ok(Some((self.number, Err(LineError::TooLong))));
        }
        if self.buf.last() == Some(&b'\r') {
            self.buf.pop();
        }
        if self.number == 1 && self.buf.starts_with(b"\xEF\xBB\xBF") {
            self.buf.drain(..3);
        }
        let line = std::str::from_utf8(&self.buf).map_err(|_| LineError::NotUtf8);
        Ok(Some((self.number, line)))
    }
}

/// What a line's values are checked against.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bounds {
    pub(crate) block_tokens: u32,
    /// An entry's input is above these.
    pub(crate) special_tokens: u32,
}

/// A format's parser: for the CSV formats, the header's column indices once read.
#[derive(Debug)]
pub(crate) struct Parser {
    format: Format,
    bounds: Bounds,
    columns: Option<[usize; 3]>,
}

impl Parser {
    pub(crate) fn new(format: Format, bounds: Bounds) -> Parser {
        Parser {
            format,
            bounds,
            columns: None,
        }
    }

    /// Whether the next non-blank line is a CSV header still to read.
    pub(crate) fn wants_header(&self) -> bool {
        self.format != Format::Mooncake && self.columns.is_none()
    }

    /// Read the CSV header: where each column needed is.
    pub(crate) fn header(&mut self, line: &str) -> Result<(), LineError> {
        let names = split_csv(line)?;
        let needed = self.format.columns();
        let mut at = [0; 3];
        for (slot, column) in at.iter_mut().zip(needed) {
            *slot = names
                .iter()
                .position(|n| n.trim() == column)
                .ok_or_else(|| LineError::NoColumn {
                    format: self.format.name(),
                    column,
                    needed,
                    header: names.join(", "),
                })?;
        }
        self.columns = Some(at);
        Ok(())
    }

    /// One line (not blank, not the header) as a record.
    pub(crate) fn record(&self, line: &str) -> Result<Record, LineError> {
        let [ts, input, output] = self.format.columns();
        let record = match (self.format, self.columns) {
            (Format::Mooncake, _) => mooncake(line)?,
            (format, Some(at)) => {
                let fields = split_csv(line)?;
                let field = |i: usize| -> Result<&str, LineError> {
                    fields
                        .get(at[i])
                        .map(|f| f.trim())
                        .ok_or(LineError::ShortRow {
                            column: format.columns()[i],
                            index: at[i] + 1,
                            fields: fields.len(),
                        })
                };
                let ts_ns = match format {
                    Format::Azure => datetime_ns(ts, field(0)?)?,
                    _ => seconds_ns(ts, field(0)?)?,
                };
                Record {
                    ts_ns,
                    input: csv_count(input, field(1)?)?,
                    output: csv_count(output, field(2)?)?,
                    hash_ids: Vec::new(),
                }
            }
            (_, None) => return Err(LineError::Missing(ts)),
        };
        self.check(record, [input, output])
    }

    /// The record's token counts and hash ids within the format's bounds.
    fn check(&self, r: Record, [input, output]: [&'static str; 2]) -> Result<Record, LineError> {
        let min = u64::from(self.bounds.special_tokens) + 1;
        if r.input < min || r.input > MAX_TOKENS {
            return Err(LineError::Tokens {
                field: input,
                value: r.input,
                min,
            });
        }
        if r.output > MAX_TOKENS {
            return Err(LineError::Tokens {
                field: output,
                value: r.output,
                min: 0,
            });
        }
        let need = r.input.div_ceil(u64::from(self.bounds.block_tokens.max(1)));
        if r.hash_ids.len() as u64 > need {
            return Err(LineError::TooManyHashIds {
                given: r.hash_ids.len(),
                input: r.input,
                block_tokens: self.bounds.block_tokens,
                need,
            });
        }
        Ok(r)
    }
}

/// A Mooncake line's fields, each kept as written so that a wrong one is named with what
/// it holds (other fields ignored).
#[derive(serde::Deserialize)]
struct MooncakeLine {
    timestamp: Option<Value>,
    input_length: Option<Value>,
    output_length: Option<Value>,
    hash_ids: Option<Value>,
}

/// A Mooncake line: `{"timestamp": ms, "input_length": N, "output_length": N,
/// "hash_ids": [...]}` (other fields ignored).
fn mooncake(line: &str) -> Result<Record, LineError> {
    let v: Value = serde_json::from_str(line).map_err(LineError::NotJson)?;
    if !v.is_object() {
        return Err(LineError::NotObject);
    }
    let m = MooncakeLine::deserialize(v).map_err(LineError::NotJson)?;
    let need = |k: &'static str, f: Option<Value>| f.ok_or(LineError::Missing(k));
    let ts = need("timestamp", m.timestamp)?;
    let ts_ns = match ts.as_u64() {
        Some(ms) if ms <= MAX_US / 1000 => ms * 1_000_000,
        Some(ms) => {
            return Err(LineError::Huge {
                field: "timestamp",
                got: ms.to_string(),
            });
        }
        None => scaled_ns("timestamp", json_number("timestamp", &ts)?, 1e6)?,
    };
    let count = |k: &'static str, f: Option<Value>| -> Result<u64, LineError> {
        let v = need(k, f)?;
        match v.as_u64() {
            Some(n) => Ok(n),
            None => integral(k, json_number(k, &v)?),
        }
    };
    let hash_ids = match m.hash_ids {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(ids)) => hash_ids(&ids)?,
        Some(_) => return Err(LineError::HashId(0)),
    };
    Ok(Record {
        ts_ns,
        input: count("input_length", m.input_length)?,
        output: count("output_length", m.output_length)?,
        hash_ids,
    })
}

fn hash_ids(ids: &[Value]) -> Result<Vec<u64>, LineError> {
    ids.iter()
        .enumerate()
        .map(|(index, v)| match v.as_u64() {
            Some(value) if value >= FRESH_IDS => Err(LineError::HashIdTooLarge { index, value }),
            Some(value) => Ok(value),
            None => Err(LineError::HashId(index)),
        })
        .collect()
}

/// A JSON value that must be a number.
fn json_number(field: &'static str, v: &Value) -> Result<f64, LineError> {
    v.as_f64().ok_or_else(|| LineError::NotNumber {
        field,
        got: v.to_string(),
    })
}

/// `x` (a count) as a whole number >= 0.
fn integral(field: &'static str, x: f64) -> Result<u64, LineError> {
    let got = || x.to_string();
    if !x.is_finite() {
        return Err(LineError::NotFinite { field, got: got() });
    }
    if x < 0.0 {
        return Err(LineError::Negative { field, got: got() });
    }
    if x.fract() != 0.0 || x > MAX_US as f64 {
        return Err(LineError::NotInteger { field, got: got() });
    }
    Ok(x as u64)
}

/// A time of `x` units of `ns_per_unit` nanoseconds, checked finite, >= 0 and within
/// [`MAX_US`].
fn scaled_ns(field: &'static str, x: f64, ns_per_unit: f64) -> Result<u64, LineError> {
    let got = || x.to_string();
    if !x.is_finite() {
        return Err(LineError::NotFinite { field, got: got() });
    }
    if x < 0.0 {
        return Err(LineError::Negative { field, got: got() });
    }
    if x * ns_per_unit / 1000.0 > MAX_US as f64 {
        return Err(LineError::Huge { field, got: got() });
    }
    Ok((x * ns_per_unit).round() as u64)
}

/// A CSV field of seconds (BurstGPT's `Timestamp`).
fn seconds_ns(field: &'static str, text: &str) -> Result<u64, LineError> {
    scaled_ns(field, csv_number(field, text)?, 1e9)
}

/// A CSV field that must be a number (`NaN` and `inf` parse, and are refused after).
fn csv_number(field: &'static str, text: &str) -> Result<f64, LineError> {
    text.parse::<f64>().map_err(|_| LineError::NotNumber {
        field,
        got: format!("{text:?}"),
    })
}

/// A CSV field of tokens: a whole number (`12` or `12.0`).
fn csv_count(field: &'static str, text: &str) -> Result<u64, LineError> {
    match text.parse::<u64>() {
        Ok(n) => Ok(n),
        Err(_) => integral(field, csv_number(field, text)?),
    }
}

/// An Azure `TIMESTAMP` (`2023-11-16 18:15:46.6805900`, UTC; a `T` may stand for the
/// space) as nanoseconds since the Unix epoch.
fn datetime_ns(field: &'static str, text: &str) -> Result<u64, LineError> {
    let parsed = chrono::NaiveDateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S%.f")
        .or_else(|_| chrono::NaiveDateTime::parse_from_str(text, "%Y-%m-%dT%H:%M:%S%.f"))
        .map_err(|source| LineError::NotDatetime {
            field,
            got: format!("{text:?}"),
            source,
        })?;
    let t = parsed.and_utc();
    let ns = i128::from(t.timestamp()) * 1_000_000_000 + i128::from(t.timestamp_subsec_nanos());
    let got = || format!("{text:?}");
    if ns < 0 {
        return Err(LineError::Negative { field, got: got() });
    }
    if ns / 1000 > i128::from(MAX_US) {
        return Err(LineError::Huge { field, got: got() });
    }
    Ok(ns as u64)
}

/// The fields of one CSV line: separated by commas, a field in double quotes may hold
/// commas and `""` for a quote.
fn split_csv(line: &str) -> Result<Vec<String>, LineError> {
    let mut fields = Vec::new();
    let mut field = String::new();
    let mut chars = line.chars().peekable();
    let mut quoted = false;
    while let Some(c) = chars.next() {
        match (quoted, c) {
            (true, '"') if chars.peek() == Some(&'"') => {
                chars.next();
                field.push('"');
            }
            (true, '"') => quoted = false,
            (true, c) => field.push(c),
            (false, '"') if field.trim().is_empty() => {
                field.clear();
                quoted = true;
            }
            (false, ',') => fields.push(std::mem::take(&mut field)),
            (false, c) => field.push(c),
        }
    }
    if quoted {
        return Err(LineError::Quote);
    }
    fields.push(field);
    Ok(fields)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOUNDS: Bounds = Bounds {
        block_tokens: 4,
        special_tokens: 1,
    };

    fn err(format: Format, header: &str, line: &str) -> String {
        let mut p = Parser::new(format, BOUNDS);
        if p.wants_header() {
            p.header(header).unwrap_or_else(|e| panic!("{e}"));
        }
        p.record(line)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    }

    #[test]
    fn csv_fields_split_with_quotes() {
        let f = split_csv(r#"a, "b,c" ,"d""e",,"#).unwrap_or_default();
        assert_eq!(f, ["a", "b,c ", "d\"e", "", ""]);
        assert!(matches!(split_csv("\"open"), Err(LineError::Quote)));
    }

    #[test]
    fn each_format_reads_its_fields() {
        let p = Parser::new(Format::Mooncake, BOUNDS);
        let r = p.record(
            r#"{"timestamp": 1500, "input_length": 9, "output_length": 2, "hash_ids": [4, 5]}"#,
        );
        let r = r.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (r.ts_ns, r.input, r.output, r.hash_ids),
            (1_500_000_000, 9, 2, vec![4, 5])
        );
        let mut p = Parser::new(Format::Azure, BOUNDS);
        p.header("TIMESTAMP,ContextTokens,GeneratedTokens")
            .unwrap_or_else(|e| panic!("{e}"));
        let r = p
            .record("1970-01-01 00:00:01.0000015,10,3")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((r.ts_ns, r.input, r.output), (1_000_001_500, 10, 3));
        let mut p = Parser::new(Format::BurstGpt, BOUNDS);
        p.header("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type")
            .unwrap_or_else(|e| panic!("{e}"));
        let r = p
            .record("2.5,ChatGPT,7,0,7,Conversation log")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((r.ts_ns, r.input, r.output), (2_500_000_000, 7, 0));
    }

    #[test]
    fn hostile_values_are_refused_with_the_reason() {
        let m = |l: &str| err(Format::Mooncake, "", l);
        assert!(m("{").contains("not valid JSON"));
        assert!(
            m(r#"{"timestamp": -1, "input_length": 9, "output_length": 1}"#).contains("negative")
        );
        assert!(
            m(r#"{"timestamp": 1e300, "input_length": 9, "output_length": 1}"#)
                .contains("past 2^53")
        );
        assert!(
            m(r#"{"timestamp": 9007199254740992, "input_length": 9, "output_length": 1}"#)
                .contains("past 2^53")
        );
        assert!(
            m(r#"{"timestamp": 1, "input_length": 1, "output_length": 1}"#).contains("give 2 to")
        );
        assert!(m(r#"{"timestamp": 1, "input_length": 9, "output_length": 1, "hash_ids": [1, 2, 3, 4]}"#).contains("at most 3"));
        assert!(m(r#"{"timestamp": 1, "input_length": 9, "output_length": 1, "hash_ids": [1099511627776]}"#).contains("not below 2^40"));
        assert!(
            m(r#"{"timestamp": "x", "input_length": 9, "output_length": 1}"#)
                .contains("not a number")
        );
        assert!(m(r#"{"input_length": 9, "output_length": 1}"#).contains("no field \"timestamp\""));
        let b = |l: &str| {
            err(
                Format::BurstGpt,
                "Timestamp,Request tokens,Response tokens",
                l,
            )
        };
        assert!(b("NaN,5,5").contains("not a finite number"));
        assert!(b("1,5.5,5").contains("not a whole number"));
        assert!(b("1,5").contains("no field \"Response tokens\" (column 3"));
        let a = |l: &str| err(Format::Azure, "TIMESTAMP,ContextTokens,GeneratedTokens", l);
        assert!(a("yesterday,5,5").contains("not a datetime"));
        let mut p = Parser::new(Format::Azure, BOUNDS);
        let e = p
            .header("TIMESTAMP,Context,GeneratedTokens")
            .err()
            .map(|e| e.to_string());
        assert!(
            e.unwrap_or_default()
                .contains("no column \"ContextTokens\"")
        );
    }

    #[test]
    fn a_line_past_the_limit_is_refused_and_the_next_keeps_its_number() {
        let mut text = vec![b'x'; MAX_LINE_BYTES + 10];
        text.extend_from_slice(b"\nok\r\n");
        let mut lines = Lines::new(&text[..]);
        let first = lines
            .next_line()
            .ok()
            .flatten()
            .map(|(n, l)| (n, l.is_err()));
        assert_eq!(first, Some((1, true)));
        let second = lines
            .next_line()
            .ok()
            .flatten()
            .map(|(n, l)| (n, l.ok().map(String::from)));
        assert_eq!(second, Some((2, Some("ok".to_string()))));
    }
}
