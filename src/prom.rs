//! The Prometheus text exposition format (0.0.4), read: what a worker's `/metrics` says
//! (vLLM, SGLang, TGI, or our own `--metrics-listen`), as samples with their family's
//! type. Pure and total: a line it cannot read is counted with its number and the
//! reason, never fatal, so a worker that answers garbage costs the run nothing.
//!
//! - `# TYPE name kind` gives a family's kind (`counter`, `gauge`, `histogram`,
//!   `summary`, `untyped`); a histogram's `name_bucket`, `name_sum` and `name_count`
//!   samples take their family's kind; a sample of no declared family is `untyped`.
//! - `# HELP` and other comments are skipped.
//! - A sample is `name{label="value",...} value [timestamp]`; label values unescape `\\`,
//!   `\"` and `\n` (any other escape, or a label given twice, makes the line unreadable:
//!   DuckDB refuses a map with a key twice); values include `NaN`, `+Inf` and `-Inf`; the
//!   timestamp is ignored.

use std::collections::HashMap;

/// One sample of a scrape.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Sample {
    pub(crate) name: String,
    /// In the order written.
    pub(crate) labels: Vec<(String, String)>,
    pub(crate) value: f64,
    /// The family's kind, as `# TYPE` wrote it (`untyped` when none did).
    pub(crate) kind: String,
}

impl Sample {
    /// The value of label `name`, if any.
    pub(crate) fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A scrape read: its samples, and each line that could not be read (1-based line
/// number and why).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Scrape {
    pub(crate) samples: Vec<Sample>,
    pub(crate) errors: Vec<(usize, LineError)>,
}

/// Why a line of a scrape could not be read (`name`: the sample's metric, `key`: the
/// label's name, as written).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum LineError {
    #[error("a TYPE line names no known kind: {0}")]
    Type(String),
    #[error("a sample without a value: {0}")]
    NoValue(String),
    #[error("not a metric name: {0:?}")]
    Name(String),
    #[error("{0}: no value")]
    Missing(String),
    #[error("{name}: not a number: {value:?}")]
    Number { name: String, value: String },
    #[error("{name}: not a timestamp: {value:?}")]
    Timestamp { name: String, value: String },
    #[error("{0}: more than a value and a timestamp")]
    Trailing(String),
    #[error("a label without '='")]
    NoEquals,
    #[error("not a label name: {0:?}")]
    LabelName(String),
    #[error("label {0}: its value is not quoted")]
    Unquoted(String),
    #[error("label {0}: unterminated value or an unknown escape")]
    Unterminated(String),
    #[error("label {0} given twice")]
    Twice(String),
    #[error("label {0}: expected ',' or '}}' after its value")]
    NoSeparator(String),
}

/// The kinds `# TYPE` may declare.
const KINDS: [&str; 5] = ["counter", "gauge", "histogram", "summary", "untyped"];

/// Read a scrape's text.
pub(crate) fn parse(text: &str) -> Scrape {
    let mut kinds: HashMap<String, String> = HashMap::new();
    let mut out = Scrape::default();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() {
            continue;
        }
        if let Some(comment) = line.strip_prefix('#') {
            let mut words = comment.split_whitespace();
            if words.next() == Some("TYPE") {
                match (words.next(), words.next()) {
                    (Some(name), Some(kind)) if KINDS.contains(&kind) => {
                        kinds.insert(name.to_string(), kind.to_string());
                    }
                    _ => out.errors.push((i + 1, LineError::Type(line.to_string()))),
                }
            }
            continue;
        }
        match sample(line) {
            Ok((name, labels, value)) => {
                let kind = family_kind(&kinds, &name);
                out.samples.push(Sample {
                    name,
                    labels,
                    value,
                    kind,
                });
            }
            Err(why) => out.errors.push((i + 1, why)),
        }
    }
    out
}

/// A sample's family kind: its own name's, else (for `_bucket`, `_sum`, `_count`,
/// `_total`, `_created`) its base name's when that family is declared.
fn family_kind(kinds: &HashMap<String, String>, name: &str) -> String {
    if let Some(k) = kinds.get(name) {
        return k.clone();
    }
    for suffix in ["_bucket", "_sum", "_count", "_total", "_created"] {
        if let Some(k) = name.strip_suffix(suffix).and_then(|base| kinds.get(base)) {
            return k.clone();
        }
    }
    "untyped".into()
}

fn valid_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// A sample's labels, in the order written.
type Labels = Vec<(String, String)>;

type Parsed = (String, Labels, f64);

fn sample(line: &str) -> Result<Parsed, LineError> {
    let name_end = line
        .find(|c: char| c == '{' || c.is_whitespace())
        .ok_or_else(|| LineError::NoValue(line.to_string()))?;
    let name = &line[..name_end];
    if !valid_name(name) {
        return Err(LineError::Name(name.to_string()));
    }
    // Blanks may stand between a name and its labels (as Prometheus's own parser allows).
    let mut rest = line[name_end..].trim_start();
    let mut labels = Vec::new();
    if let Some(after) = rest.strip_prefix('{') {
        let (parsed, tail) = label_set(after)?;
        labels = parsed;
        rest = tail;
    }
    let mut fields = rest.split_whitespace();
    let value = fields
        .next()
        .ok_or_else(|| LineError::Missing(name.to_string()))
        .and_then(|v| {
            number(v).ok_or_else(|| LineError::Number {
                name: name.to_string(),
                value: v.to_string(),
            })
        })?;
    if let Some(ts) = fields.next()
        && ts.parse::<i64>().is_err()
    {
        return Err(LineError::Timestamp {
            name: name.to_string(),
            value: ts.to_string(),
        });
    }
    if fields.next().is_some() {
        return Err(LineError::Trailing(name.to_string()));
    }
    Ok((name.to_string(), labels, value))
}

fn number(v: &str) -> Option<f64> {
    match v {
        "NaN" => Some(f64::NAN),
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        _ => v.parse::<f64>().ok(),
    }
}

/// `a="x",b="y"}` and what follows the closing brace.
fn label_set(mut s: &str) -> Result<(Labels, &str), LineError> {
    let mut labels = Vec::new();
    loop {
        s = s.trim_start();
        if let Some(tail) = s.strip_prefix('}') {
            return Ok((labels, tail));
        }
        let eq = s.find('=').ok_or(LineError::NoEquals)?;
        let key = s[..eq].trim();
        if !valid_name(key) || key.contains(':') {
            return Err(LineError::LabelName(key.to_string()));
        }
        let after = s[eq + 1..].trim_start();
        let body = after
            .strip_prefix('"')
            .ok_or_else(|| LineError::Unquoted(key.to_string()))?;
        let (value, tail) = quoted(body).ok_or_else(|| LineError::Unterminated(key.to_string()))?;
        if labels.iter().any(|(k, _)| k == key) {
            return Err(LineError::Twice(key.to_string()));
        }
        labels.push((key.to_string(), value));
        s = tail.trim_start();
        if let Some(t) = s.strip_prefix(',') {
            s = t;
        } else if !s.starts_with('}') {
            return Err(LineError::NoSeparator(key.to_string()));
        }
    }
}

/// A quoted label value after its opening quote, unescaped, and what follows its closing
/// quote.
fn quoted(s: &str) -> Option<(String, &str)> {
    let mut out = String::new();
    let mut chars = s.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Some((out, &s[i + 1..])),
            '\\' => match chars.next()?.1 {
                'n' => out.push('\n'),
                c @ ('\\' | '"') => out.push(c),
                _ => return None,
            },
            c => out.push(c),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vllm_scrape_reads_with_kinds_labels_and_special_values() {
        let text = "# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 3.0
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le=\"0.01\",model_name=\"m\"} 2.0
vllm:time_to_first_token_seconds_bucket{le=\"+Inf\",model_name=\"m\"} 5.0
vllm:time_to_first_token_seconds_sum{model_name=\"m\"} 0.25
vllm:time_to_first_token_seconds_count{model_name=\"m\"} 5.0
# TYPE vllm:request_success counter
vllm:request_success_total{finished_reason=\"length\",model_name=\"m\"} 7 1700000000000
odd_label{path=\"a \\\"b\\\" \\\\ c\\nd\"} NaN
no_labels -Inf
";
        let s = parse(text);
        assert_eq!(s.errors, vec![]);
        assert_eq!(s.samples.len(), 8);
        let running = &s.samples[0];
        assert_eq!(
            (running.name.as_str(), running.kind.as_str(), running.value),
            ("vllm:num_requests_running", "gauge", 3.0)
        );
        assert_eq!(running.label("model_name"), Some("m"));
        let inf = &s.samples[2];
        assert_eq!(
            (inf.kind.as_str(), inf.label("le"), inf.value),
            ("histogram", Some("+Inf"), 5.0)
        );
        assert_eq!(
            s.samples[4].kind, "histogram",
            "_count takes its family's kind"
        );
        assert_eq!(
            (s.samples[5].kind.as_str(), s.samples[5].value),
            ("counter", 7.0)
        );
        assert_eq!(s.samples[6].label("path"), Some("a \"b\" \\ c\nd"));
        assert!(s.samples[6].value.is_nan());
        assert_eq!(s.samples[6].kind, "untyped");
        assert_eq!(s.samples[7].value, f64::NEG_INFINITY);
    }

    #[test]
    fn garbage_lines_are_counted_with_their_number_and_never_stop_the_rest() {
        let text = "ok 1\n<html>not metrics</html>\nm{a=\"x\" 2\nm{a=x} 2\n9bad 1\nm 1 2 3\nm abc\n# TYPE m wat\nfine{a=\"1\",} 4\ntwice{a=\"1\",a=\"2\"} 1\ntab{a=\"\\t\"} 1\nspaced {a=\"1\"} 5\n";
        let s = parse(text);
        let lines: Vec<usize> = s.errors.iter().map(|e| e.0).collect();
        assert_eq!(lines, [2, 3, 4, 5, 6, 7, 8, 10, 11], "{:#?}", s.errors);
        let names: Vec<(&str, f64)> = s
            .samples
            .iter()
            .map(|x| (x.name.as_str(), x.value))
            .collect();
        assert_eq!(names, [("ok", 1.0), ("fine", 4.0), ("spaced", 5.0)]);
        assert_eq!(parse(""), Scrape::default());
    }
}
