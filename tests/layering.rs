//! Layering guard for `src/`: which top-level module may import which.
//!
//! matrix-proxy is built in layers (docs/architecture.md, "the code map"): leaves such as
//! `clock`, `model` and `sse` import nothing of ours, the exchange `engine` sits above
//! them, `record` and `report` above the metrics, the `drivers` above all of those, and
//! `cli` on top. This file reads `src/` as text (it never links the crate) and fails when
//! an import crosses that layering: a `use`, an inline `crate::`/`super::`/`self::` path,
//! or a name reached through a `pub use` re-export. It also keeps `drivers::replay` and
//! `drivers::serve` apart, Arrow and Parquet inside `record` and `report`, files and
//! sockets out of `config`, every function at most 90 lines and every file at most 700
//! code lines. Between files it holds one more rule: no file imports a file that imports
//! it back (directly or around a circle), and the files named in [`LEAF_FILES`] import
//! nothing else from their folder. The table [`ALLOWED`] is the one source of the allowed
//! edges; docs/architecture.md copies it as its code map's layer table, and a test fails
//! when the two disagree.
//!
//! Every rule is a plain function over an in-memory tree; the `synthetic_*` tests feed
//! small made-up trees to prove that each rule fires, and that a clean tree passes.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// `(module, the modules it may import)`.
type Row = (&'static str, &'static [&'static str]);

/// In a row: may import every other module.
const EVERYTHING: &str = "*";

/// Allowed imports between top-level modules. A module may always use itself; anything
/// not listed is forbidden. Every top-level module in `src/` needs a row.
const ALLOWED: &[Row] = &[
    ("clock", &[]),
    ("model", &[]),
    ("redact", &[]),
    ("budget", &[]),
    ("sse", &[]),
    ("oracle", &["sse"]),
    ("drift", &["oracle", "sse"]),
    ("arrival", &[]),
    ("stats", &[]),
    ("prom", &[]),
    ("metrics", &["model", "arrival"]),
    ("search", &["config", "metrics", "model", "stats"]),
    ("telemetry", &["model"]),
    ("net", &["clock"]),
    ("engine", &["clock", "model", "budget", "sse", "net"]),
    ("config", &["clock", "model", "oracle", "redact", "arrival"]),
    ("record", &["clock", "model", "redact", "budget", "metrics"]),
    (
        "report",
        &[
            "clock", "model", "redact", "oracle", "drift", "metrics", "stats", "record", "config",
            "search",
        ],
    ),
    (
        "freeze",
        &[
            "model", "redact", "sse", "oracle", "config", "record", "report", "run",
        ],
    ),
    ("dataset", &["model", "config", "freeze"]),
    (
        "drivers",
        &[
            "clock",
            "model",
            "redact",
            "budget",
            "sse",
            "oracle",
            "metrics",
            "net",
            "engine",
            "arrival",
            "config",
            "record",
            "report",
            "telemetry",
            "prom",
            "search",
        ],
    ),
    ("mock", &["clock", "net"]),
    (
        "run",
        &[
            "clock",
            "model",
            "redact",
            "config",
            "record",
            "report",
            "engine",
            "net",
            "mock",
            "telemetry",
            "drivers",
            "search",
        ],
    ),
    (
        "fuzzing",
        &["config", "oracle", "sse", "engine", "record", "prom"],
    ),
    ("bench", &["clock", "config", "oracle"]),
    ("cli", &[EVERYTHING]),
];

/// The drivers inside `drivers/`: neither may import the other, and the shared files
/// directly in `drivers/` may import neither.
const DRIVERS: &[&str] = &["replay", "serve"];
/// Columnar crates, and the only modules that may name them.
const COLUMNAR: &[&str] = &[
    "arrow_array",
    "arrow_schema",
    "arrow_buffer",
    "arrow",
    "parquet",
];
const COLUMNAR_HOMES: &[&str] = &["record", "report"];
/// What `config` never reaches for: it validates the bytes and values it is handed.
const CONFIG_FORBIDDEN: &[[&str; 2]] = &[
    ["std", "fs"],
    ["std", "net"],
    ["tokio", "fs"],
    ["tokio", "net"],
];
const MAX_FN_LINES: usize = 90;
/// Code lines of one source file, its tests excluded.
const MAX_FILE_CODE_LINES: usize = 700;

const LAYER_HINT: &str = "Move the shared item into a lower layer both modules may import, or \
    pass it in from the caller. If the layering itself must change, edit ALLOWED in \
    tests/layering.rs and the code map in docs/architecture.md together.";
const DRIVER_HINT: &str = "drivers::replay and drivers::serve must not import each other, and \
    the shared files directly in drivers/ must not import either: move the shared item into \
    drivers/ (e.g. drivers/run.rs) or a lower layer.";
const COLUMNAR_HINT: &str = "Arrow and Parquet belong to record/ (writing rows) and report/ \
    (reading them back); hand other modules plain Rust values instead.";
const CONFIG_HINT: &str = "config validates bytes and values it is handed: let the caller \
    (cli, drivers) read the file or bind the socket and pass config the bytes or values.";
/// What to do about a function over [`MAX_FN_LINES`].
fn fn_hint() -> String {
    format!("Split each function into named steps of at most {MAX_FN_LINES} lines.")
}
const FILE_HINT: &str = "Split the file by concern, into files that import each other one \
    way only; tests, comments and blank lines do not count.";

// ---------------------------------------------------------------------------------- lexing

#[derive(Clone, Debug)]
struct Tok {
    text: String,
    line: usize,
}

/// Identifiers (and lifetimes), `::` and single punctuation, each with its line. Comments
/// are dropped, and a string or char literal becomes a lone `"` or `'`: a doc line or a
/// string that mentions `crate::x` is not an import.
fn tokenize(src: &str) -> Vec<Tok> {
    let c: Vec<char> = src.chars().collect();
    let at = |i: usize| c.get(i).copied().unwrap_or('\0');
    let word = |ch: char| ch.is_alphanumeric() || ch == '_';
    let word_end = |i: usize| i + c.iter().skip(i).take_while(|ch| word(**ch)).count();
    // Just past a literal closed by `end`, stepping over backslash escapes.
    let literal = |mut i: usize, end: char| {
        while i < c.len() && c[i] != end {
            i += if c[i] == '\\' { 2 } else { 1 };
        }
        i + 1
    };
    let (mut toks, mut line, mut i) = (Vec::new(), 1, 0);
    while i < c.len() {
        let (ch, next) = (c[i], at(i + 1));
        let (w1, w2) = (word_end(i + 1), word_end(i + 2));
        // Where this piece of text ends, and which part of it is the token's text.
        let (end, token) = match raw_string_end(&c, i) {
            Some(end) => {
                let quote = c[i..].iter().position(|ch| *ch == '"').map_or(i, |k| i + k);
                (end, Some(quote..quote + 1))
            }
            None => match (ch, next) {
                _ if ch.is_whitespace() => (i + 1, None),
                ('/', '/') => (
                    i + c[i..].iter().take_while(|ch| **ch != '\n').count(),
                    None,
                ),
                ('/', '*') => (block_comment_end(&c, i), None),
                ('"', _) => (literal(i + 1, '"'), Some(i..i + 1)),
                // A char literal ('x', '\n', '"'); a lifetime ('a) has no closing quote.
                ('\'', _) if next == '\\' || at(i + 2) == '\'' => {
                    (literal(i + 1, '\''), Some(i..i + 1))
                }
                ('r', '#') if word(at(i + 2)) => (w2, Some(i + 2..w2)), // r#name is name
                _ if word(ch) || ch == '\'' && word(next) => (w1, Some(i..w1)),
                (':', ':') => (i + 2, Some(i..i + 2)),
                _ => (i + 1, Some(i..i + 1)),
            },
        };
        toks.extend(token.map(|t| Tok {
            text: c[t].iter().collect(),
            line,
        }));
        line += c[i..end.min(c.len())]
            .iter()
            .filter(|ch| **ch == '\n')
            .count();
        i = end;
    }
    toks
}

/// Just past the raw string (`r"..."`, `r#"..."#`, `br"..."`) that starts at `i`, if one does.
fn raw_string_end(c: &[char], i: usize) -> Option<usize> {
    let word = |k: usize| {
        c.get(k)
            .is_some_and(|ch| ch.is_alphanumeric() || *ch == '_')
    };
    let r = i + usize::from(matches!(c[i], 'b' | 'c'));
    let hashes = c.iter().skip(r + 1).take_while(|ch| **ch == '#').count();
    let starts = c.get(r) == Some(&'r') && c.get(r + 1 + hashes) == Some(&'"');
    if !starts || i.checked_sub(1).is_some_and(word) {
        return None;
    }
    let close: Vec<char> = std::iter::once('"')
        .chain(std::iter::repeat_n('#', hashes))
        .collect();
    let body = r + hashes + 2;
    let rest = c[body.min(c.len())..]
        .windows(close.len())
        .position(|w| w == close);
    Some(body + rest.unwrap_or(c.len()) + close.len())
}

/// Just past the block comment (nested ones included) that starts at `i`.
fn block_comment_end(c: &[char], mut i: usize) -> usize {
    let mut depth = 0;
    while i < c.len() {
        let pair = (c[i], c.get(i + 1).copied().unwrap_or(' '));
        let (open, close) = (pair == ('/', '*'), pair == ('*', '/'));
        i += if open || close { 2 } else { 1 };
        depth += i32::from(open) - i32::from(close);
        if depth == 0 {
            break;
        }
    }
    i
}

fn text(toks: &[Tok], i: usize) -> &str {
    toks.get(i).map_or("", |t| t.text.as_str())
}

fn is_ident(s: &str) -> bool {
    let first = s.chars().next();
    first.is_some_and(|c| c.is_alphabetic() || c == '_')
}

fn ident_at(toks: &[Tok], i: usize) -> Option<String> {
    Some(text(toks, i).to_string()).filter(|t| is_ident(t))
}

/// Index of the bracket closing the one at `open`.
fn closing(toks: &[Tok], open: usize) -> usize {
    let (o, c) = match text(toks, open) {
        "(" => ("(", ")"),
        "[" => ("[", "]"),
        _ => ("{", "}"),
    };
    let mut depth = 0usize;
    for (k, t) in toks.iter().enumerate().skip(open) {
        depth = (depth + usize::from(t.text == o)).saturating_sub(usize::from(t.text == c));
        if depth == 0 {
            return k;
        }
    }
    toks.len().saturating_sub(1)
}

/// The last token of the item starting at `start` (its body's `}` or its `;`), and
/// whether it has a `{ ... }` body.
fn item_end(toks: &[Tok], start: usize) -> (usize, bool) {
    let mut nesting = 0usize;
    for (k, t) in toks.iter().enumerate().skip(start) {
        match t.text.as_str() {
            "(" | "[" => nesting += 1,
            ")" | "]" => nesting = nesting.saturating_sub(1),
            "{" if nesting == 0 => return (closing(toks, k), true),
            ";" if nesting == 0 => return (k, false),
            _ => {}
        }
    }
    (toks.len().saturating_sub(1), false)
}

/// `toks` without `#[cfg(test)]` items, and the names of out-of-line test modules
/// (`#[cfg(test)] mod tests;`). `None` when the whole file is test code (`#![cfg(test)]`).
fn drop_test_items(toks: &[Tok]) -> Option<(Vec<Tok>, Vec<String>)> {
    let (mut kept, mut test_mods, mut i) = (Vec::new(), Vec::new(), 0);
    while i < toks.len() {
        let inner = text(toks, i + 1) == "!";
        let open = if inner { i + 2 } else { i + 1 };
        if text(toks, i) == "#" && text(toks, open) == "[" {
            let close = closing(toks, open);
            let attr = toks.get(open + 1..close).unwrap_or(&[]);
            let has = |s: &str| attr.iter().any(|t| t.text == s);
            if text(attr, 0) == "cfg" && has("test") && !has("not") {
                if inner {
                    return None;
                }
                let mut item = close + 1;
                while text(toks, item) == "#" && text(toks, item + 1) == "[" {
                    item = closing(toks, item + 1) + 1;
                }
                let (end, body) = item_end(toks, item);
                let head = toks.get(item..end).unwrap_or(&[]);
                if let Some(at) = head.iter().position(|t| t.text == "mod").filter(|_| !body) {
                    test_mods.extend(ident_at(toks, item + at + 1));
                }
                i = end.max(close) + 1;
                continue;
            }
        }
        kept.push(toks[i].clone());
        i += 1;
    }
    Some((kept, test_mods))
}

// --------------------------------------------------------------------------------- parsing

/// A path written in the code: `crate::a::B`, `super::x`, a `use` leaf, `std::fs::File`.
#[derive(Clone, Debug)]
struct Mention {
    line: usize,
    module: Vec<String>,
    path: Vec<String>,
    global: bool,
    shown: String,
}

/// A name a `use` brings into `module`; the name `*` is a glob.
#[derive(Clone, Debug)]
struct Binding {
    module: Vec<String>,
    name: String,
    path: Vec<String>,
    global: bool,
    module_level: bool,
}

/// One `.rs` file under `src/`, reduced to what the rules need.
#[derive(Default)]
struct SourceFile {
    path: String,
    module: Vec<String>,
    test: bool,
    test_mods: Vec<String>,
    defs: Vec<(Vec<String>, String)>,
    inline_mods: Vec<Vec<String>>,
    bindings: Vec<Binding>,
    mentions: Vec<Mention>,
    /// `(first line, last line, name)` of each function with a body.
    fns: Vec<(usize, usize, String)>,
}

/// `src/drivers/replay/wave.rs` is `drivers::replay::wave`; `lib.rs`/`main.rs` are the
/// root. Also says whether the file sits under a `tests` folder.
fn module_of(path: &str) -> (Vec<String>, bool) {
    let mut parts: Vec<String> = path.split('/').skip(1).map(String::from).collect();
    let file = parts.pop().unwrap_or_default();
    let under_tests = parts.iter().any(|p| p == "tests");
    let stem = file.strip_suffix(".rs").unwrap_or(&file);
    if !(stem == "mod" || parts.is_empty() && (stem == "lib" || stem == "main")) {
        parts.push(stem.to_string());
    }
    (parts, under_tests)
}

type Leaf = (Vec<String>, Option<String>);

/// The leaves of the use tree at `*i`: `(path, name)`, the name `*` for a glob, none
/// for `as _`.
fn use_tree(toks: &[Tok], i: &mut usize, mut path: Vec<String>) -> Vec<Leaf> {
    *i += usize::from(matches!(text(toks, *i), "::" | "$")); // ::std, $crate
    loop {
        let t = text(toks, *i).to_string();
        *i += 1;
        if t == "{" {
            let mut leaves = Vec::new();
            while !matches!(text(toks, *i), "}" | ";" | "") {
                let before = *i;
                leaves.extend(use_tree(toks, i, path.clone()));
                *i += usize::from(text(toks, *i) == "," || *i == before);
            }
            *i += usize::from(text(toks, *i) == "}");
            return leaves;
        }
        if t != "*" && !is_ident(&t) {
            return Vec::new();
        }
        if t != "*" && text(toks, *i) == "::" {
            path.push(t);
            *i += 1;
            continue;
        }
        if t != "self" || path.is_empty() {
            path.extend((t != "*").then(|| t.clone()));
        }
        let mut name = if t == "*" {
            Some(t)
        } else {
            path.last().cloned()
        };
        if text(toks, *i) == "as" {
            name = ident_at(toks, *i + 1).filter(|n| n != "_");
            *i += 2;
        }
        return vec![(path, name)];
    }
}

/// `Some(global)` when the identifier at `i` starts a path (is not the middle of one).
fn path_start(toks: &[Tok], i: usize) -> Option<bool> {
    let back = |k: usize| i.checked_sub(k).map_or("", |p| text(toks, p));
    match back(1) {
        "::" => (!is_ident(back(2)) && back(2) != ">").then_some(true),
        "in" if back(2) == "(" && back(3) == "pub" => None, // pub(in crate::x)
        _ => Some(false),
    }
}

impl SourceFile {
    fn mention(
        &mut self,
        line: usize,
        module: &[String],
        path: &[String],
        global: bool,
        shown: String,
    ) {
        let (module, path) = (module.to_vec(), path.to_vec());
        self.mentions.push(Mention {
            line,
            module,
            path,
            global,
            shown,
        });
    }

    /// Records the `use` item at `i`; returns the index of its `;`.
    fn add_use(&mut self, toks: &[Tok], i: usize, module: &[String], module_level: bool) -> usize {
        let (line, global, mut k) = (toks[i].line, text(toks, i + 1) == "::", i + 1);
        for (path, name) in use_tree(toks, &mut k, Vec::new()) {
            let suffix = match name.as_deref() {
                Some("*") => "::*".to_string(),
                Some(n) if path.last().is_some_and(|l| l != n) => format!(" as {n}"),
                Some(_) => String::new(),
                None => " as _".to_string(),
            };
            let lead = if global { "::" } else { "" };
            let shown = format!("use {lead}{}{suffix}", path.join("::"));
            self.mention(line, module, &path, global, shown);
            if let Some(name) = name {
                let module = module.to_vec();
                let binding = Binding {
                    module,
                    name,
                    path,
                    global,
                    module_level,
                };
                self.bindings.push(binding);
            }
        }
        while k < toks.len() && toks[k].text != ";" {
            k += 1;
        }
        k
    }

    /// Records the path starting at `i`, if one starts there; returns its last index.
    fn add_path(&mut self, toks: &[Tok], mut i: usize, module: &[String]) -> usize {
        let Some(global) = path_start(toks, i) else {
            return i;
        };
        let (line, mut path) = (toks[i].line, vec![toks[i].text.clone()]);
        while text(toks, i + 1) == "::" && is_ident(text(toks, i + 2)) {
            path.push(toks[i + 2].text.clone());
            i += 2;
        }
        if path.len() > 1 {
            let shown = format!("{}{}", if global { "::" } else { "" }, path.join("::"));
            self.mention(line, module, &path, global, shown);
        }
        i
    }
}

fn parse_file(path: &str, source: &str) -> SourceFile {
    let (module, test) = module_of(path);
    let path = path.to_string();
    let mut file = SourceFile {
        path,
        module,
        test,
        ..SourceFile::default()
    };
    let Some((toks, test_mods)) = drop_test_items(&tokenize(source)) else {
        file.test = true;
        return file;
    };
    file.test_mods = test_mods;
    // Brace depth, and the inline modules (`mod x { .. }`) we are in, with their depth.
    let (mut depth, mut inline, mut i) = (0usize, Vec::<(String, usize)>::new(), 0);
    while i < toks.len() {
        let names = inline.iter().map(|(name, _)| name.clone());
        let module: Vec<String> = file.module.iter().cloned().chain(names).collect();
        let top = depth == inline.last().map_or(0, |(_, d)| *d);
        let (word, next) = (text(&toks, i), ident_at(&toks, i + 1));
        let after_generic = matches!(text(&toks, i.wrapping_sub(1)), "<" | ",");
        match word {
            "{" => depth += 1,
            "}" => {
                depth = depth.saturating_sub(1);
                inline.retain(|(_, d)| *d <= depth);
            }
            "use" => i = file.add_use(&toks, i, &module, top),
            "mod" | "fn" if next.is_some() => {
                let name = next.unwrap_or_default();
                if word == "fn"
                    && let (end, true) = item_end(&toks, i)
                {
                    file.fns.push((toks[i].line, toks[end].line, name.clone()));
                }
                if word == "mod" && text(&toks, i + 2) == "{" {
                    file.inline_mods
                        .push(joined(&module, std::slice::from_ref(&name)));
                    inline.push((name.clone(), depth + 1));
                }
                if top {
                    file.defs.push((module, name));
                }
            }
            "struct" | "enum" | "union" | "trait" | "type" | "static" | "const" | "macro_rules"
                if top && !after_generic =>
            {
                let k = i + 1 + usize::from(matches!(text(&toks, i + 1), "mut" | "!"));
                let keyword = ["fn", "unsafe", "async", "extern", "_"];
                let name = ident_at(&toks, k).filter(|n| !keyword.contains(&n.as_str()));
                file.defs.extend(name.map(|name| (module, name)));
            }
            _ if is_ident(word) => i = file.add_path(&toks, i, &module),
            _ => {}
        }
        i += 1;
    }
    file
}

// ------------------------------------------------------------------------------- resolving

/// What a module defines and imports (imports are what re-exports are made of).
#[derive(Default)]
struct Scope {
    defs: BTreeSet<String>,
    bindings: Vec<Binding>,
}

/// Where a written path leads: into this crate (absolute, without `crate`), or elsewhere
/// (an extern crate, the prelude, a local item, a generic).
enum Target {
    Internal(Vec<String>),
    Other(Vec<String>),
}

impl Target {
    fn internal(self) -> Option<Vec<String>> {
        match self {
            Target::Internal(path) => Some(path),
            Target::Other(_) => None,
        }
    }
}

/// The parsed tree: every file, every module, and each module's scope.
struct Model {
    files: Vec<SourceFile>,
    modules: BTreeSet<Vec<String>>,
    scopes: BTreeMap<Vec<String>, Scope>,
}

fn joined(a: &[String], b: &[String]) -> Vec<String> {
    a.iter().chain(b).cloned().collect()
}

impl Model {
    /// Builds the model from `(path relative to the crate root, text)` pairs.
    fn build(sources: &[(String, String)]) -> Model {
        let mut files: Vec<SourceFile> = sources.iter().map(|(p, t)| parse_file(p, t)).collect();
        let mut test_roots = Vec::new();
        for f in &files {
            test_roots.extend(
                f.test_mods
                    .iter()
                    .map(|m| joined(&f.module, std::slice::from_ref(m))),
            );
        }
        for f in &mut files {
            f.test |= test_roots.iter().any(|root| f.module.starts_with(root));
        }
        let (mut modules, mut scopes) = (BTreeSet::new(), BTreeMap::<_, Scope>::new());
        for f in files.iter().filter(|f| !f.test) {
            for m in std::iter::once(&f.module).chain(&f.inline_mods) {
                modules.extend((1..=m.len()).map(|n| m[..n].to_vec()));
            }
            for (m, name) in &f.defs {
                let scope = scopes.entry(m.clone()).or_default();
                scope.defs.insert(name.clone());
            }
            for b in &f.bindings {
                let scope = scopes.entry(b.module.clone()).or_default();
                scope.bindings.push(b.clone());
            }
        }
        Model {
            files,
            modules,
            scopes,
        }
    }

    /// Where `path`, written in `module`, leads.
    fn target(&self, module: &[String], path: &[String], global: bool, depth: usize) -> Target {
        let other = || Target::Other(path.to_vec());
        let Some((first, rest)) = path.split_first() else {
            return other();
        };
        if global || depth > 8 {
            return other();
        }
        match first.as_str() {
            "crate" => Target::Internal(rest.to_vec()),
            "self" => Target::Internal(joined(module, rest)),
            "super" => {
                let supers = path.iter().take_while(|s| *s == "super").count();
                let keep = module.len().checked_sub(supers);
                keep.map_or_else(other, |k| {
                    Target::Internal(joined(&module[..k], &path[supers..]))
                })
            }
            _ if self.modules.contains(&joined(module, &path[..1])) => {
                Target::Internal(joined(module, path))
            }
            _ => {
                let bindings = self.scopes.get(module).map_or(&[][..], |s| &s.bindings);
                let Some(b) = bindings.iter().find(|b| &b.name == first) else {
                    return other();
                };
                match self.target(module, &b.path, b.global, depth + 1) {
                    Target::Internal(t) => Target::Internal(joined(&t, rest)),
                    Target::Other(t) => Target::Other(joined(&t, rest)),
                }
            }
        }
    }

    /// The module-level imports of `m` named `name` (`*`: its globs).
    fn bindings<'a>(&'a self, m: &[String], name: &'a str) -> impl Iterator<Item = &'a Binding> {
        let scope = self.scopes.get(m).map_or(&[][..], |s| &s.bindings);
        scope
            .iter()
            .filter(move |b| b.module_level && b.name == name)
    }

    /// Where the module-level imports of `m` named `name` lead, inside this crate.
    fn imports(&self, m: &[String], name: &str) -> Vec<Vec<String>> {
        let targets = self
            .bindings(m, name)
            .map(|b| self.target(m, &b.path, b.global, 0));
        targets.filter_map(Target::internal).collect()
    }

    /// Every module the absolute `path` passes through, following `pub use` re-exports
    /// (renamed, chained, globbed) to where the item really lives.
    fn touched(&self, path: &[String], depth: usize) -> BTreeSet<Vec<String>> {
        let mut touched = BTreeSet::new();
        for k in 1..=path.len() {
            if self.modules.contains(&path[..k]) {
                touched.insert(path[..k].to_vec());
                continue;
            }
            let (cur, seg) = (&path[..k - 1], &path[k - 1]);
            let defined = self.scopes.get(cur).is_some_and(|s| s.defs.contains(seg));
            if defined || depth > 8 {
                break;
            }
            let follow: Vec<Vec<String>> = if self.bindings(cur, seg).next().is_some() {
                let named = self.imports(cur, seg).into_iter();
                named.map(|t| joined(&t, &path[k..])).collect()
            } else {
                // Through a glob: the globs that provide the name, else (a macro's item,
                // say) every glob of the module.
                let globs = self.imports(cur, "*");
                let holders: Vec<_> = globs.iter().filter(|g| self.provides(g, seg, 0)).collect();
                let from = if holders.is_empty() {
                    globs.iter().collect()
                } else {
                    holders
                };
                from.into_iter()
                    .map(|g| joined(g, &path[k - 1..]))
                    .collect()
            };
            for target in follow {
                touched.extend(self.touched(&target, depth + 1));
            }
            break;
        }
        touched
    }

    /// Whether module `m` defines, imports or glob-imports `name`.
    fn provides(&self, m: &[String], name: &str, depth: usize) -> bool {
        let globs = || self.imports(m, "*").into_iter();
        self.modules.contains(&joined(m, &[name.to_string()]))
            || self.scopes.get(m).is_some_and(|s| s.defs.contains(name))
            || self.bindings(m, name).next().is_some()
            || depth < 8 && globs().any(|g| self.provides(&g, name, depth + 1))
    }

    /// Every mention in non-test code, with where it leads.
    fn mentions(&self) -> impl Iterator<Item = (&SourceFile, &Mention, Target)> {
        let files = self.files.iter().filter(|f| !f.test);
        files.flat_map(move |f| {
            let target = move |m: &Mention| self.target(&m.module, &m.path, m.global, 0);
            f.mentions.iter().map(move |m| (f, m, target(m)))
        })
    }
}

// ----------------------------------------------------------------------------------- rules

/// Findings per (file, what), reported at their first line with the later lines listed.
#[derive(Default)]
struct Findings(BTreeMap<(String, String), BTreeMap<usize, String>>);

impl Findings {
    fn add(&mut self, file: &SourceFile, mention: &Mention, what: String, how: String) {
        let lines = self.0.entry((file.path.clone(), what)).or_default();
        lines.entry(mention.line).or_insert(how);
    }

    fn finish(self) -> Vec<String> {
        let mut out: Vec<(&String, usize, String)> = Vec::new();
        for ((path, what), lines) in &self.0 {
            let mut lines = lines.iter();
            let Some((first, how)) = lines.next() else {
                continue;
            };
            let more: Vec<String> = lines.map(|(l, _)| l.to_string()).collect();
            let also = match more.len() {
                0 => String::new(),
                1..=6 => format!(" (also lines {})", more.join(", ")),
                n => format!(" (also lines {}, and {} more)", more[..6].join(", "), n - 6),
            };
            let message = format!("{path}:{first}: {what} ({how}){also}");
            out.push((path, *first, message));
        }
        out.sort();
        out.into_iter().map(|(_, _, message)| message).collect()
    }
}

fn allows(table: &[Row], from: &str, to: &str) -> bool {
    let row = table.iter().find(|(m, _)| *m == from);
    let deps = row.map_or(&[][..], |(_, deps)| deps);
    from == to || deps.iter().any(|d| *d == to || *d == EVERYTHING)
}

/// Rules 1-4: imports between top-level modules must be rows of `table`.
fn layer_violations(model: &Model, table: &[Row]) -> Vec<String> {
    let mut found = Findings::default();
    for (file, mention, target) in model.mentions() {
        let (Some(from), Some(written)) = (mention.module.first(), target.internal()) else {
            continue;
        };
        let touched = model.touched(&written, 0);
        let tops: BTreeSet<&String> = touched.iter().filter_map(|t| t.first()).collect();
        for to in tops.into_iter().filter(|to| !allows(table, from, to)) {
            let how = if written.first() == Some(to) {
                mention.shown.clone()
            } else {
                format!("{}, through a re-export", mention.shown)
            };
            found.add(file, mention, format!("{from} imports {to}"), how);
        }
    }
    found.finish()
}

/// Inside `drivers/`: no driver imports another, and the shared files import neither.
fn driver_violations(model: &Model) -> Vec<String> {
    let driver = |m: &[String]| {
        let name = m
            .get(1)
            .filter(|d| m[0] == "drivers" && DRIVERS.contains(&d.as_str()));
        name.map(|d| format!("drivers::{d}"))
    };
    let mut found = Findings::default();
    for (file, mention, target) in model.mentions() {
        let (Some(written), m) = (target.internal(), &mention.module) else {
            continue;
        };
        if m.first().is_none_or(|top| top != "drivers") {
            continue;
        }
        let from = driver(m);
        let shared = || format!("{} (shared)", m[..m.len().min(2)].join("::"));
        let who = from.clone().unwrap_or_else(shared);
        let touched = model.touched(&written, 0);
        let tos: BTreeSet<String> = touched.iter().filter_map(|t| driver(t)).collect();
        for to in tos.into_iter().filter(|to| from.as_ref() != Some(to)) {
            found.add(
                file,
                mention,
                format!("{who} imports {to}"),
                mention.shown.clone(),
            );
        }
    }
    found.finish()
}

/// Rule 5: Arrow and Parquet only in `record` and `report`.
fn columnar_violations(model: &Model) -> Vec<String> {
    let mut found = Findings::default();
    for (file, mention, target) in model.mentions() {
        let Target::Other(path) = target else {
            continue;
        };
        let home = mention
            .module
            .first()
            .map_or("the crate root", String::as_str);
        let krate = path.first().filter(|k| COLUMNAR.contains(&k.as_str()));
        if let Some(krate) = krate.filter(|_| !COLUMNAR_HOMES.contains(&home)) {
            found.add(
                file,
                mention,
                format!("{home} uses {krate}"),
                mention.shown.clone(),
            );
        }
    }
    found.finish()
}

/// Rule 6: `config` opens no file and no socket.
fn config_violations(model: &Model) -> Vec<String> {
    let mut found = Findings::default();
    for (file, mention, target) in model.mentions() {
        let Target::Other(path) = target else {
            continue;
        };
        let in_config = mention.module.first().is_some_and(|m| m == "config");
        let bad = CONFIG_FORBIDDEN
            .iter()
            .find(|bad| path.len() > 1 && path[..2] == **bad);
        if let Some(bad) = bad.filter(|_| in_config) {
            let what = format!("config uses {}", bad.join("::"));
            found.add(file, mention, what, mention.shown.clone());
        }
    }
    found.finish()
}

/// Rule 7: no function longer than `max` lines outside tests.
fn long_functions(model: &Model, max: usize) -> Vec<String> {
    let mut out = Vec::new();
    for file in model.files.iter().filter(|f| !f.test) {
        for (first, last, name) in &file.fns {
            let n = last - first + 1;
            if n > max {
                out.push(format!("{}:{first} fn {name} ({n} lines)", file.path));
            }
        }
    }
    out
}

/// Code lines of a file: its lines outside every test item ([`test_item_lines`]), less
/// blank lines and lines that hold only a comment.
fn code_lines(text: &str) -> usize {
    let tests = test_item_lines(&tokenize(text));
    let in_test = |n: usize| {
        tests
            .iter()
            .any(|(first, last)| (*first..=*last).contains(&n))
    };
    text.lines()
        .enumerate()
        .filter(|(k, l)| {
            let l = l.trim();
            !l.is_empty() && !l.starts_with("//") && !in_test(k + 1)
        })
        .count()
}

/// The lines `(first, last)` of each test item of a file, wherever it sits: every item
/// under `#[cfg(test)]` (a module, a helper, a `use`), and every `#[test]` function
/// (`#[tokio::test]` too), from its first attribute to its end. The whole file under
/// `#![cfg(test)]`.
fn test_item_lines(toks: &[Tok]) -> Vec<(usize, usize)> {
    let (mut spans, mut i) = (Vec::new(), 0);
    while i < toks.len() {
        let inner = text(toks, i + 1) == "!";
        let open = if inner { i + 2 } else { i + 1 };
        if text(toks, i) == "#" && text(toks, open) == "[" {
            let close = closing(toks, open);
            if is_test_attr(toks.get(open + 1..close).unwrap_or(&[])) {
                if inner {
                    return vec![(1, usize::MAX)];
                }
                let mut item = close + 1;
                while text(toks, item) == "#" && text(toks, item + 1) == "[" {
                    item = closing(toks, item + 1) + 1;
                }
                let (end, _) = item_end(toks, item);
                spans.push((toks[i].line, toks.get(end).map_or(usize::MAX, |t| t.line)));
                i = end.max(close) + 1;
                continue;
            }
        }
        i += 1;
    }
    spans
}

/// `cfg(test)` (not `cfg(not(test))`), `test` or a path ending in `::test`.
fn is_test_attr(attr: &[Tok]) -> bool {
    let has = |s: &str| attr.iter().any(|t| t.text == s);
    let cfg_test = text(attr, 0) == "cfg" && has("test") && !has("not");
    let n = attr.len();
    let test_fn = n > 0 && text(attr, n - 1) == "test" && (n == 1 || text(attr, n - 2) == "::");
    cfg_test || test_fn
}

/// Files over `max` code lines.
fn long_files(sources: &[(String, String)], max: usize) -> Vec<String> {
    let counted = sources.iter().map(|(path, text)| (path, code_lines(text)));
    counted
        .filter(|(_, n)| *n > max)
        .map(|(path, n)| format!("{path}: {n} code lines"))
        .collect()
}

/// Every top-level module in `src/` has a row, and every row a module.
fn coverage_problems(model: &Model, table: &[Row]) -> Vec<String> {
    let mut found: BTreeMap<&str, &str> = BTreeMap::new();
    for f in &model.files {
        if let Some(m) = f.module.first() {
            found.entry(m.as_str()).or_insert(f.path.as_str());
        }
    }
    let rows: BTreeSet<&str> = table.iter().map(|(m, _)| *m).collect();
    let mut out = Vec::new();
    for (m, path) in found.iter().filter(|(m, _)| !rows.contains(*m)) {
        out.push(format!(
            "{path}: module `{m}` has no row in ALLOWED: add one"
        ));
    }
    for r in rows.iter().filter(|r| !found.contains_key(*r)) {
        out.push(format!(
            "ALLOWED row `{r}` matches no src/{r}.rs or src/{r}/"
        ));
    }
    out
}

/// Duplicate rows, and allowed entries that are not rows themselves.
fn table_problems(table: &[Row]) -> Vec<String> {
    let mut out = Vec::new();
    let is_row = |d: &str| d == EVERYTHING || table.iter().any(|(r, _)| *r == d);
    for (k, (m, deps)) in table.iter().enumerate() {
        if table[..k].iter().any(|(r, _)| r == m) {
            out.push(format!("row `{m}` appears twice"));
        }
        for d in deps.iter().filter(|d| !is_row(d)) {
            out.push(format!("row `{m}` allows `{d}`, which has no row"));
        }
    }
    out
}

/// A cycle in the table (`a -> b -> a`), if any.
fn table_cycle(table: &[Row]) -> Option<Vec<&'static str>> {
    type Stack = Vec<&'static str>;
    fn visit(table: &[Row], m: &'static str, done: &mut Stack, stack: &mut Stack) -> Option<Stack> {
        if let Some(start) = stack.iter().position(|s| *s == m) {
            return Some(stack[start..].iter().copied().chain([m]).collect());
        }
        if done.contains(&m) {
            return None;
        }
        done.push(m);
        stack.push(m);
        let deps = table
            .iter()
            .map(|(r, _)| *r)
            .filter(|r| *r != m && allows(table, m, r));
        let cycle = deps
            .collect::<Vec<_>>()
            .into_iter()
            .find_map(|d| visit(table, d, done, stack));
        stack.pop();
        cycle
    }
    let mut done = Vec::new();
    table
        .iter()
        .find_map(|(m, _)| visit(table, m, &mut done, &mut Vec::new()))
}

// ------------------------------------------------------------------------------ file level

/// Files that import nothing else from their own folder (a folder's shared vocabulary or
/// state, so the files beside them can all use it without a circle).
const LEAF_FILES: &[&str] = &[
    "src/cli/io.rs",
    "src/config/json.rs",
    "src/drivers/replay/ctx.rs",
    "src/drivers/serve/client.rs",
    "src/drivers/serve/down.rs",
    "src/drivers/serve/live.rs",
    "src/record/row.rs",
    "src/report/html/input.rs",
];

const FILE_CYCLE_HINT: &str = "Files must import each other one way only: move what both \
    need into a file that imports neither (a folder's leaf, as listed in LEAF_FILES), or pass \
    it in from the caller.";

/// Which file a module lives in: its own, or (an inline module) the file around it.
fn file_of<'a>(files: &'a BTreeMap<Vec<String>, String>, module: &[String]) -> Option<&'a str> {
    (0..=module.len())
        .rev()
        .find_map(|n| files.get(&module[..n]).map(String::as_str))
}

/// The file-level import graph of non-test code: `file -> {(file it imports, first line)}`.
/// An import counts toward the file where the item lives (after re-exports), not the
/// modules its path merely passes through.
fn file_graph(model: &Model) -> BTreeMap<String, BTreeMap<String, (usize, String)>> {
    let files: BTreeMap<Vec<String>, String> = model
        .files
        .iter()
        .filter(|f| !f.test)
        .map(|f| (f.module.clone(), f.path.clone()))
        .collect();
    let mut graph: BTreeMap<String, BTreeMap<String, (usize, String)>> = BTreeMap::new();
    for (file, mention, target) in model.mentions() {
        let Some(written) = target.internal() else {
            continue;
        };
        let touched = model.touched(&written, 0);
        let deepest = touched.iter().filter(|t| {
            !touched
                .iter()
                .any(|u| u.len() > t.len() && u.starts_with(t))
        });
        for to in deepest.filter_map(|t| file_of(&files, t)) {
            if to != file.path {
                let edges = graph.entry(file.path.clone()).or_default();
                let how = (mention.line, mention.shown.clone());
                edges.entry(to.to_string()).or_insert(how);
            }
        }
    }
    graph
}

/// Every group of files that import each other in a circle, each as `a -> b -> a` with
/// the line that makes each step.
fn file_cycles(model: &Model) -> Vec<String> {
    let graph = file_graph(model);
    let reach = |from: &str| {
        let (mut seen, mut todo) = (BTreeSet::new(), vec![from.to_string()]);
        while let Some(f) = todo.pop() {
            for to in graph.get(&f).into_iter().flat_map(|e| e.keys()) {
                if seen.insert(to.clone()) {
                    todo.push(to.clone());
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&String, BTreeSet<String>> =
        graph.keys().map(|f| (f, reach(f))).collect();
    let mut done = BTreeSet::new();
    let mut out = Vec::new();
    for (f, r) in &reaches {
        if done.contains(*f) || !r.contains(*f) {
            continue;
        }
        let group: BTreeSet<&String> = reaches
            .iter()
            .filter(|(g, gr)| gr.contains(*f) && r.contains(**g))
            .map(|(g, _)| *g)
            .collect();
        let mut steps = Vec::new();
        for a in &group {
            for (b, (line, shown)) in graph.get(*a).into_iter().flatten() {
                if group.contains(b) {
                    steps.push(format!("{a}:{line} -> {b} ({shown})"));
                }
            }
        }
        done.extend(group.iter().map(|g| (*g).clone()));
        let names: Vec<&str> = group.iter().map(|g| g.as_str()).collect();
        out.push(format!(
            "{}\n    {}",
            names.join(" <-> "),
            steps.join("\n    ")
        ));
    }
    out
}

/// The folder of a file (`src/a/b.rs` and `src/a/mod.rs` are both in `src/a`).
fn folder(path: &str) -> &str {
    path.rsplit_once('/').map_or("", |(dir, _)| dir)
}

/// Each of `leaves` exists and imports no other file of its folder.
fn leaf_violations(model: &Model, leaves: &[&str]) -> Vec<String> {
    let graph = file_graph(model);
    let mut out = Vec::new();
    for leaf in leaves {
        if !model.files.iter().any(|f| f.path == *leaf) {
            out.push(format!("{leaf}: named in LEAF_FILES but not in src/"));
        }
        for (to, (line, shown)) in graph.get(*leaf).into_iter().flatten() {
            if folder(to) == folder(leaf) {
                out.push(format!("{leaf}:{line}: imports {to} ({shown})"));
            }
        }
    }
    out
}

// ---------------------------------------------------------------------- the documented map

/// The marker in docs/architecture.md above the code map's layer table.
const MAP_MARKER: &str = "<!-- layers:";

/// The code map's layer table in `doc`: each row's module (`` `engine/` `` is `engine`) and
/// the modules its "may import" cell names (`—` none, `everything` all).
fn documented_layers(doc: &str) -> Result<Vec<(String, Vec<String>)>, String> {
    let start = doc
        .find(MAP_MARKER)
        .ok_or("docs/architecture.md has no `<!-- layers: ... -->` marker above its layer table")?;
    let mut rows = Vec::new();
    let table = doc[start..]
        .lines()
        .skip(1)
        .take_while(|l| l.starts_with('|'));
    for line in table.skip(2) {
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        let [module, deps, ..] = cells[..] else {
            return Err(format!(
                "layer table row without a \"may import\" cell: {line}"
            ));
        };
        let name = module.trim_matches('`').trim_end_matches('/').to_string();
        let deps = if deps == "everything" {
            vec![EVERYTHING.to_string()]
        } else {
            let named = deps.split('`').skip(1).step_by(2);
            named.map(|d| d.trim_end_matches('/').to_string()).collect()
        };
        rows.push((name, deps));
    }
    Ok(rows)
}

/// Where the documented table and `table` disagree.
fn map_disagreements(doc: &str, table: &[Row]) -> Vec<String> {
    let documented = match documented_layers(doc) {
        Ok(rows) => rows,
        Err(e) => return vec![e],
    };
    let mut out = Vec::new();
    for (m, deps) in table {
        let want: BTreeSet<&str> = deps.iter().copied().collect();
        match documented.iter().find(|(d, _)| d == m) {
            None => out.push(format!(
                "`{m}` has a row in ALLOWED but none in the code map"
            )),
            Some((_, got)) => {
                let got: BTreeSet<&str> = got.iter().map(String::as_str).collect();
                if got != want {
                    out.push(format!(
                        "`{m}`: the code map says it may import {got:?}, ALLOWED says {want:?}"
                    ));
                }
            }
        }
    }
    for (d, _) in documented
        .iter()
        .filter(|(d, _)| !table.iter().any(|(m, _)| m == d))
    {
        out.push(format!(
            "`{d}` has a row in the code map but none in ALLOWED"
        ));
    }
    out
}

// ------------------------------------------------------------------------------- real tree

/// Every `.rs` file under `root/src`, as (path relative to `root` with `/`, text).
fn load_src(root: &Path) -> Result<Vec<(String, String)>, String> {
    let (mut out, mut dirs) = (Vec::new(), vec![root.join("src")]);
    while let Some(dir) = dirs.pop() {
        let list = std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        for entry in list {
            let path = entry.map_err(|e| format!("{}: {e}", dir.display()))?.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path);
                let text = text.map_err(|e| format!("{}: {e}", path.display()))?;
                let rel = path.strip_prefix(root).unwrap_or(&path).components();
                let rel: Vec<_> = rel.map(|c| c.as_os_str().to_string_lossy()).collect();
                out.push((rel.join("/"), text));
            }
        }
    }
    out.sort();
    Ok(out)
}

fn real_tree() -> Model {
    // Under cargo this is the manifest dir; compiled by hand, run it from the crate root.
    let root = option_env!("CARGO_MANIFEST_DIR").map_or_else(|| PathBuf::from("."), PathBuf::from);
    match load_src(&root) {
        Ok(sources) => Model::build(&sources),
        Err(e) => panic!("cannot read the crate's src/ ({e}); run from the crate root"),
    }
}

fn assert_clean(rule: &str, hint: &str, found: &[String]) {
    let (n, list) = (found.len(), found.join("\n  "));
    assert!(
        found.is_empty(),
        "{rule}: {n} violation(s)\n  {list}\n{hint}"
    );
}

#[test]
fn allowed_table_is_acyclic() {
    let cycle = table_cycle(ALLOWED).map(|c| c.join(" -> "));
    assert_eq!(cycle, None, "ALLOWED must stay a layering, without cycles");
}

#[test]
fn allowed_table_names_only_its_own_rows() {
    let found = table_problems(ALLOWED);
    assert_clean("ALLOWED", "Fix the table in tests/layering.rs.", &found);
}

#[test]
fn every_src_module_has_a_row_and_every_row_a_module() {
    let hint = "ALLOWED lists exactly the top-level modules: give a new module a row (and the \
        code map a line), or remove the row of one that is gone.";
    assert_clean(
        "ALLOWED vs src/",
        hint,
        &coverage_problems(&real_tree(), ALLOWED),
    );
}

#[test]
fn src_imports_follow_the_layering() {
    let found = layer_violations(&real_tree(), ALLOWED);
    assert_clean("layering", LAYER_HINT, &found);
}

#[test]
fn drivers_do_not_import_each_other() {
    assert_clean("drivers", DRIVER_HINT, &driver_violations(&real_tree()));
}

#[test]
fn arrow_and_parquet_stay_in_record_and_report() {
    let found = columnar_violations(&real_tree());
    assert_clean("arrow/parquet", COLUMNAR_HINT, &found);
}

#[test]
fn config_opens_no_files_or_sockets() {
    assert_clean("config", CONFIG_HINT, &config_violations(&real_tree()));
}

#[test]
fn no_function_is_longer_than_max_fn_lines() {
    let found = long_functions(&real_tree(), MAX_FN_LINES);
    assert_clean("function length", &fn_hint(), &found);
}

#[test]
fn files_import_each_other_one_way_only() {
    assert_clean(
        "file-level circles",
        FILE_CYCLE_HINT,
        &file_cycles(&real_tree()),
    );
}

#[test]
fn leaf_files_import_nothing_from_their_folder() {
    let found = leaf_violations(&real_tree(), LEAF_FILES);
    assert_clean("leaf files", FILE_CYCLE_HINT, &found);
}

#[test]
fn no_source_file_is_longer_than_700_code_lines() {
    let root = option_env!("CARGO_MANIFEST_DIR").map_or_else(|| PathBuf::from("."), PathBuf::from);
    let sources = load_src(&root).unwrap_or_else(|e| panic!("cannot read src/: {e}"));
    let found = long_files(&sources, MAX_FILE_CODE_LINES);
    assert_clean("file length", FILE_HINT, &found);
}

#[test]
fn the_code_map_in_architecture_md_matches_allowed() {
    let root = option_env!("CARGO_MANIFEST_DIR").map_or_else(|| PathBuf::from("."), PathBuf::from);
    let path = root.join("docs/architecture.md");
    let doc = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let hint = "The layer table under `<!-- layers: -->` in docs/architecture.md and ALLOWED in \
        tests/layering.rs are one table written twice: change both together.";
    assert_clean(
        "code map vs ALLOWED",
        hint,
        &map_disagreements(&doc, ALLOWED),
    );
}

// -------------------------------------------------------------------------- synthetic trees

/// A synthetic `src/`: an empty file per row of [`ALLOWED`] (drivers as `drivers/mod.rs`,
/// `drivers/replay/mod.rs` and `drivers/serve.rs`), then the files of `spec`, added or
/// replacing. In `spec`, a line `== src/x.rs` starts a file; the lines below it, less the
/// marker's indentation, are its text.
fn tree(spec: &str) -> Model {
    let mut src: BTreeMap<String, String> = BTreeMap::new();
    for (m, _) in ALLOWED.iter().filter(|(m, _)| *m != "drivers") {
        src.insert(format!("src/{m}.rs"), String::new());
    }
    let drivers = "pub mod replay;\npub mod serve;\n";
    for (path, text) in [("lib.rs", ""), ("drivers/mod.rs", drivers)] {
        src.insert(format!("src/{path}"), text.to_string());
    }
    for path in ["src/drivers/replay/mod.rs", "src/drivers/serve.rs"] {
        src.insert(path.to_string(), String::new());
    }
    let (mut current, mut indent) = (None, "");
    for line in spec.lines() {
        if let Some(path) = line.trim_start().strip_prefix("== ") {
            indent = &line[..line.len() - line.trim_start().len()];
            src.insert(path.to_string(), String::new());
            current = Some(path.to_string());
        } else if let Some(text) = current.as_ref().and_then(|p| src.get_mut(p)) {
            text.push_str(line.strip_prefix(indent).unwrap_or(line.trim_start()));
            text.push('\n');
        }
    }
    Model::build(&src.into_iter().collect::<Vec<_>>())
}

/// A function spanning exactly `lines` lines, its signature over three of them.
fn fn_of_lines(name: &str, lines: usize) -> String {
    let body = "    let _ = x;\n".repeat(lines - 5);
    format!("pub fn {name}(\n    x: u32,\n) -> u32 {{\n{body}    x\n}}\n")
}

#[test]
fn synthetic_clean_tree_passes_every_rule() {
    let spec = r#"
        == src/lib.rs
        pub mod engine;
        pub use engine::Engine;
        == src/model.rs
        pub struct Endpoint;
        pub enum Kind { A }
        == src/metrics.rs
        pub use crate::model::*;
        pub struct Sample;
        == src/record/mod.rs
        pub use crate::metrics::Sample;
        use arrow_array::RecordBatch;
        use std::fs::File;
        == src/report.rs
        use crate::record::Sample;
        use parquet::file::reader::SerializedFileReader;
        == src/config/mod.rs
        pub use crate::model::Endpoint;
        use std::{io, str};
        pub fn check(b: &[u8]) -> io::Result<()> { let _ = std::str::from_utf8(b); Ok(()) }
        == src/engine.rs
        use crate::{clock::Clock, model::Endpoint};
        use crate::net::Pool;
        // unlike crate::drivers::serve, the engine knows no driver
        pub struct Engine;
        pub trait Transport {
            fn send(&self);
        }
        pub fn open() {
            let _ = "crate::record::Row";
            crate::budget::check();
        }
        @fits
        #[cfg(test)]
        mod tests {
            use crate::record::Row;
            use arrow_array::RecordBatch;
            @in_test
        }
        == src/drivers/mod.rs
        pub mod replay;
        pub mod run;
        pub mod serve;
        == src/drivers/run.rs
        use crate::engine::Engine;
        == src/drivers/replay/mod.rs
        mod wave;
        use super::run::shared;
        /// Unlike [crate::drivers::serve].
        pub fn go() { let _ = "super::super::serve"; }
        == src/drivers/replay/wave.rs
        use super::super::run::shared;
        use super::go;
        use crate::metrics::Kind;
        use crate::net::serve::Socket;
        == src/net/serve.rs
        pub struct Socket;
        == src/drivers/serve.rs
        use crate::drivers::run::shared;
        use crate::{report, Engine};
        == src/cli.rs
        use crate::drivers::replay::go;
        use crate::fuzzing;
    "#;
    let spec = spec.replace("@fits", &fn_of_lines("fits", MAX_FN_LINES));
    let model = tree(&spec.replace("@in_test", &fn_of_lines("in_test", MAX_FN_LINES * 2)));
    let none = Vec::<String>::new();
    assert_eq!(layer_violations(&model, ALLOWED), none);
    assert_eq!(driver_violations(&model), none);
    assert_eq!(columnar_violations(&model), none);
    assert_eq!(config_violations(&model), none);
    assert_eq!(long_functions(&model, MAX_FN_LINES), none);
    assert_eq!(coverage_problems(&model, ALLOWED), none);
}

#[test]
fn synthetic_upward_import_fires_via_use_and_inline_path() {
    let spec = "
        == src/engine.rs
        pub struct Capture;
        pub fn run() {}
        == src/model.rs
        use crate::engine::Capture;
        == src/clock.rs
        pub fn now() {
            crate::engine::run();
            for _ in crate::engine::all() {}
        }
    ";
    let expected = [
        "src/clock.rs:2: clock imports engine (crate::engine::run) (also lines 3)",
        "src/model.rs:1: model imports engine (use crate::engine::Capture)",
    ];
    assert_eq!(layer_violations(&tree(spec), ALLOWED), expected);
}

#[test]
fn synthetic_grouped_and_multi_line_uses_fire() {
    let spec = "
        == src/net.rs
        use crate::{clock::Clock, engine::{self, Engine}, record::{Row as R, Writer}};
        == src/sse.rs
        use crate::{
            model::Endpoint,
            oracle::{
                Oracle,
            },
        };
    ";
    // net may use clock; the rest is forbidden.
    let expected = [
        "src/net.rs:1: net imports engine (use crate::engine)",
        "src/net.rs:1: net imports record (use crate::record::Row as R)",
        "src/sse.rs:1: sse imports model (use crate::model::Endpoint)",
        "src/sse.rs:1: sse imports oracle (use crate::oracle::Oracle)",
    ];
    assert_eq!(layer_violations(&tree(spec), ALLOWED), expected);
}

#[test]
fn synthetic_reexport_cannot_hide_a_forbidden_edge() {
    let spec = "
        == src/record.rs
        pub use crate::metrics::Sample;
        == src/metrics.rs
        pub struct Sample;
        == src/net.rs
        use crate::record::Sample;
    ";
    // record re-exporting metrics is allowed; net reaching either is not.
    let expected = [
        "src/net.rs:1: net imports metrics (use crate::record::Sample, through a re-export)",
        "src/net.rs:1: net imports record (use crate::record::Sample)",
    ];
    assert_eq!(layer_violations(&tree(spec), ALLOWED), expected);
}

#[test]
fn synthetic_allowed_item_through_a_forbidden_module_fires() {
    let spec = "
        == src/config/mod.rs
        pub use crate::model::Endpoint;
        == src/model.rs
        pub struct Endpoint;
        == src/engine.rs
        use crate::config::Endpoint;
    ";
    // engine may use model, but not config, even when config only re-exports model's item.
    let expected = ["src/engine.rs:1: engine imports config (use crate::config::Endpoint)"];
    assert_eq!(layer_violations(&tree(spec), ALLOWED), expected);
}

#[test]
fn synthetic_reexport_chains_renames_globs_and_the_root_are_followed() {
    let spec = "
        == src/lib.rs
        pub mod engine;
        pub use engine::Engine;
        == src/record/mod.rs
        pub mod sub;
        pub use self::sub::Sample as S;
        pub use sub::*;
        == src/record/sub.rs
        pub use crate::metrics::{Rate, Sample};
        == src/metrics.rs
        pub use crate::model::*;
        pub use crate::sse::*;
        pub struct Sample;
        pub struct Rate;
        pub fn rate() {}
        == src/model.rs
        pub enum Kind { A }
        pub fn f(_: &crate::Engine) {}
        == src/sse.rs
        use crate::record::S;
        == src/budget.rs
        pub fn g() -> crate::record::Rate { todo!() }
        pub fn h() { crate::metrics::rate() }
        == src/mock.rs
        pub fn k() { let _ = crate::metrics::Kind::A; }
    ";
    // Every hop is an edge; of metrics' two globs, only the one providing `Kind` counts.
    let expected = [
        "src/budget.rs:1: budget imports metrics (crate::record::Rate, through a re-export) \
         (also lines 2)",
        "src/budget.rs:1: budget imports record (crate::record::Rate)",
        "src/metrics.rs:2: metrics imports sse (use crate::sse::*)",
        "src/mock.rs:1: mock imports metrics (crate::metrics::Kind::A)",
        "src/mock.rs:1: mock imports model (crate::metrics::Kind::A, through a re-export)",
        "src/model.rs:2: model imports engine (crate::Engine, through a re-export)",
        "src/sse.rs:1: sse imports metrics (use crate::record::S, through a re-export)",
        "src/sse.rs:1: sse imports record (use crate::record::S)",
    ];
    assert_eq!(layer_violations(&tree(spec), ALLOWED), expected);
}

#[test]
fn synthetic_driver_imports_driver_via_use_super_and_inline_path() {
    let spec = "
        == src/drivers/replay/mod.rs
        mod wave;
        use crate::drivers::serve::Listener;
        pub fn run() {}
        mod inner {
            pub use super::super::serve::Listener as L;
        }
        use super::serve::Listener as M;
        == src/drivers/replay/wave.rs
        use super::super::serve::Listener;
        == src/drivers/serve.rs
        pub struct Listener;
        pub fn start() {
            crate::drivers::replay::run();
        }
    ";
    let expected = [
        "src/drivers/replay/mod.rs:2: drivers::replay imports drivers::serve \
         (use crate::drivers::serve::Listener) (also lines 5, 7)",
        "src/drivers/replay/wave.rs:1: drivers::replay imports drivers::serve \
         (use super::super::serve::Listener)",
        "src/drivers/serve.rs:3: drivers::serve imports drivers::replay \
         (crate::drivers::replay::run)",
    ];
    let model = tree(spec);
    assert_eq!(driver_violations(&model), expected);
    assert_eq!(layer_violations(&model, ALLOWED), Vec::<String>::new());
}

#[test]
fn synthetic_shared_driver_files_import_no_driver() {
    let spec = "
        == src/drivers/mod.rs
        pub mod replay;
        pub mod run;
        pub mod serve;
        pub use serve::Listener;
        == src/drivers/run.rs
        pub fn go() {
            super::replay::start();
        }
        == src/drivers/replay/mod.rs
        use crate::drivers::Listener;
        use super::run::go;
        pub fn start() {}
        == src/drivers/serve.rs
        pub struct Listener;
    ";
    // `mod replay;` and `mod serve;` are declarations, not imports.
    let expected = [
        "src/drivers/mod.rs:4: drivers (shared) imports drivers::serve (use serve::Listener)",
        "src/drivers/replay/mod.rs:1: drivers::replay imports drivers::serve \
         (use crate::drivers::Listener)",
        "src/drivers/run.rs:2: drivers::run (shared) imports drivers::replay \
         (super::replay::start)",
    ];
    assert_eq!(driver_violations(&tree(spec)), expected);
}

#[test]
fn synthetic_comments_strings_and_test_modules_do_not_count() {
    let spec = r##"
        == src/drivers/replay/mod.rs
        //! Replay, unlike crate::drivers::serve, runs frozen plans.
        /// See [`crate::drivers::serve::Listener`].
        /* use crate::drivers::serve::Listener; /* nested */ */
        pub fn describe() -> &'static str {
            let (_quote, _brace) = ('"', '{');
            "use crate::drivers::serve::Listener; super::super::serve"
        }
        pub const RAW: &str = r#"crate::drivers::serve::x()"#;
        pub const BYTES: &[u8] = br"\";
        #[cfg(test)]
        mod tests {
            use crate::drivers::serve::Listener;
            #[test]
            fn t() {
                crate::engine::helper();
            }
        }
        pub fn after_tests() {
            crate::drivers::serve::start();
        }
        == src/model.rs
        #[cfg(test)]
        mod tests {
            use crate::engine::Engine;
        }
        == src/clock.rs
        #[cfg(test)]
        use crate::engine::Engine;
        #[cfg(test)]
        mod more;
        == src/clock/more.rs
        use crate::engine::Engine;
        == src/net.rs
        #![cfg(test)]
        use crate::engine::Engine;
        fn helper() { crate::engine::run(); }
    "##;
    // Only the line after the test module counts.
    let expected = [
        "src/drivers/replay/mod.rs:19: drivers::replay imports drivers::serve \
         (crate::drivers::serve::start)",
    ];
    let model = tree(spec);
    assert_eq!(driver_violations(&model), expected);
    assert_eq!(layer_violations(&model, ALLOWED), Vec::<String>::new());
}

#[test]
fn synthetic_arrow_outside_record_and_report_fires() {
    let spec = "
        == src/engine.rs
        use arrow_array::RecordBatch;
        pub fn write() {
            let _ = parquet::file::properties::WriterProperties::builder();
            let _: Option<::arrow_schema::Schema> = None;
        }
        #[cfg(test)]
        mod tests {
            use arrow_buffer::Buffer;
        }
        == src/record/mod.rs
        use arrow_array::RecordBatch;
        use parquet::arrow::ArrowWriter;
        == src/report.rs
        use parquet::file::reader::SerializedFileReader;
    ";
    // record/, report/ and test code may use Arrow.
    let expected = [
        "src/engine.rs:1: engine uses arrow_array (use arrow_array::RecordBatch)",
        "src/engine.rs:3: engine uses parquet \
         (parquet::file::properties::WriterProperties::builder)",
        "src/engine.rs:4: engine uses arrow_schema (::arrow_schema::Schema)",
    ];
    assert_eq!(columnar_violations(&tree(spec)), expected);
}

#[test]
fn synthetic_config_touching_files_or_sockets_fires() {
    let spec = r#"
        == src/config/mod.rs
        use std::{fs, io};
        pub fn check(b: &[u8]) -> io::Result<()> {
            let _ = std::str::from_utf8(b);
            Ok(())
        }
        #[cfg(test)]
        mod tests {
            use std::fs::read;
        }
        == src/config/addr.rs
        use std::{net::SocketAddr};
        == src/config/open.rs
        use std::fs::File;

        pub fn open() {
            let _ = File::open("plan.json");
        }
        == src/config/listen.rs
        pub async fn listen() {
            let _ = tokio::net::TcpListener::bind("0:0").await;
        }
        == src/engine.rs
        use std::fs::File;
        use std::net::TcpStream;
    "#;
    // engine may open files; config's tests may too.
    let expected = [
        "src/config/addr.rs:1: config uses std::net (use std::net::SocketAddr)",
        "src/config/listen.rs:2: config uses tokio::net (tokio::net::TcpListener::bind)",
        "src/config/mod.rs:1: config uses std::fs (use std::fs)",
        "src/config/open.rs:1: config uses std::fs (use std::fs::File) (also lines 4)",
    ];
    assert_eq!(config_violations(&tree(spec)), expected);
}

#[test]
fn synthetic_long_function_fires_one_line_past_the_cap_not_at_it() {
    let spec = "
        == src/engine/mod.rs
        struct S;
        @long
        @fits
        pub trait T {
            fn decl(&self);
        }
        #[cfg(test)]
        mod tests {
            @big
        }
        #[cfg(test)]
        mod more;
        == src/engine/more.rs
        @big
        == src/engine/tests/fixture.rs
        @big
    ";
    let spec = spec.replace("@long", &fn_of_lines("long", MAX_FN_LINES + 1));
    let spec = spec.replace("@fits", &fn_of_lines("fits", MAX_FN_LINES));
    let model = tree(&spec.replace("@big", &fn_of_lines("big", MAX_FN_LINES * 3)));
    let expected = [format!(
        "src/engine/mod.rs:2 fn long ({} lines)",
        MAX_FN_LINES + 1
    )];
    assert_eq!(long_functions(&model, MAX_FN_LINES), expected);
}

#[test]
fn synthetic_table_problems_and_cycles_are_detected() {
    let mut table = ALLOWED.to_vec();
    table[0] = ("clock", &["engine"]);
    let cycle = table_cycle(&table).map(|c| c.join(" -> "));
    assert_eq!(cycle.as_deref(), Some("clock -> engine -> clock"));
    let mut table = ALLOWED.to_vec();
    table[4] = ("sse", &["cli"]);
    assert!(
        table_cycle(&table).is_some(),
        "cli may import everything: sse -> cli cycles"
    );
    table[4] = ("sse", &["ssse"]);
    table.push(("sse", &[]));
    let expected = [
        "row `sse` allows `ssse`, which has no row",
        "row `sse` appears twice",
    ];
    assert_eq!(table_problems(&table), expected);
}

#[test]
fn synthetic_module_without_row_and_row_without_module_fire() {
    assert_eq!(coverage_problems(&tree(""), ALLOWED), Vec::<String>::new());
    let found = coverage_problems(&tree("== src/plan/mod.rs"), ALLOWED);
    assert_eq!(
        found,
        ["src/plan/mod.rs: module `plan` has no row in ALLOWED: add one"]
    );
    let mut table: Vec<Row> = ALLOWED
        .iter()
        .filter(|(m, _)| *m != "mock")
        .copied()
        .collect();
    table.push(("ghost", &[]));
    let expected = [
        "src/mock.rs: module `mock` has no row in ALLOWED: add one",
        "ALLOWED row `ghost` matches no src/ghost.rs or src/ghost/",
    ];
    assert_eq!(coverage_problems(&tree(""), &table), expected);
}

#[test]
fn synthetic_tree_loads_from_disk() {
    struct TempDir(PathBuf);
    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let nanos = std::time::UNIX_EPOCH.elapsed().map_or(0, |d| d.as_nanos());
    let name = format!("layering-{}-{nanos}", std::process::id());
    let dir = TempDir(std::env::temp_dir().join(name));
    let files = [
        ("src/lib.rs", "pub mod engine;\npub mod record;\n"),
        ("src/engine/mod.rs", "pub mod wave;\n"),
        ("src/engine/wave.rs", "use super::super::record::Row;\n"),
        ("src/record.rs", "pub struct Row;\n"),
    ];
    for (path, text) in files {
        let path = dir.0.join(path);
        let parent = path.parent().expect("a file has a parent");
        std::fs::create_dir_all(parent).expect("create the temp tree");
        std::fs::write(&path, text).expect("write the temp tree");
    }
    let sources = load_src(&dir.0).expect("load the temp tree");
    let paths: Vec<&str> = sources.iter().map(|(p, _)| p.as_str()).collect();
    let expected = [
        "src/engine/mod.rs",
        "src/engine/wave.rs",
        "src/lib.rs",
        "src/record.rs",
    ];
    assert_eq!(paths, expected);
    let found = layer_violations(&Model::build(&sources), ALLOWED);
    let expected = ["src/engine/wave.rs:1: engine imports record (use super::super::record::Row)"];
    assert_eq!(found, expected);
}

#[test]
fn synthetic_file_circles_fire_and_one_way_imports_pass() {
    let circle = tree(
        r#"
        == src/engine/mod.rs
        mod a;
        mod b;
        pub struct Shared;
        pub fn run() { a::go(); }
        == src/engine/a.rs
        use super::Shared;
        pub fn go() {}
        == src/engine/b.rs
        pub fn other() { super::a::go(); }
        "#,
    );
    let found = file_cycles(&circle);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].starts_with("src/engine/a.rs <-> src/engine/mod.rs"),
        "{found:?}"
    );
    assert!(
        found[0].contains("src/engine/a.rs:1 -> src/engine/mod.rs (use super::Shared)"),
        "{found:?}"
    );
    // The shared item in a leaf file: the circle is gone, and the leaf rule holds.
    let fixed = tree(
        r#"
        == src/engine/mod.rs
        mod a;
        mod state;
        pub use state::Shared;
        pub fn run() { a::go(); }
        == src/engine/a.rs
        use super::Shared;
        pub fn go() {}
        == src/engine/state.rs
        pub struct Shared;
        "#,
    );
    assert_eq!(file_cycles(&fixed), Vec::<String>::new());
    assert_eq!(
        leaf_violations(&fixed, &["src/engine/state.rs"]),
        Vec::<String>::new()
    );
    let leaf = leaf_violations(&fixed, &["src/engine/a.rs", "src/engine/gone.rs"]);
    assert_eq!(
        leaf,
        [
            "src/engine/a.rs:1: imports src/engine/state.rs (use super::Shared)",
            "src/engine/gone.rs: named in LEAF_FILES but not in src/",
        ]
    );
}

#[test]
fn synthetic_code_map_disagreements_fire() {
    let table: &[Row] = &[
        ("clock", &[]),
        ("engine", &["clock"]),
        ("cli", &[EVERYTHING]),
    ];
    let doc = |rows: &str| {
        format!(
            "# Map\n\n<!-- layers: checked -->\n| module | may import | owns |\n|---|---|---|\n{rows}\nAfter.\n"
        )
    };
    let good = doc(
        "| `clock` | — | time |\n| `engine/` | `clock` | one exchange |\n| `cli/` | everything | commands |",
    );
    assert_eq!(map_disagreements(&good, table), Vec::<String>::new());
    let bad = doc(
        "| `clock` | `model` | time |\n| `cli/` | everything | commands |\n| `mock/` | — | a worker |",
    );
    assert_eq!(
        map_disagreements(&bad, table),
        [
            "`clock`: the code map says it may import {\"model\"}, ALLOWED says {}",
            "`engine` has a row in ALLOWED but none in the code map",
            "`mock` has a row in the code map but none in ALLOWED",
        ]
    );
    assert_eq!(map_disagreements("no table", table).len(), 1);
}

#[test]
fn synthetic_file_over_700_code_lines_fires_and_tests_do_not_count() {
    let code = "let x = 1;\n".repeat(700);
    let comments = "// a comment\n/// a doc line\n\n".repeat(50);
    let tests = format!(
        "#[cfg(test)]\nmod tests {{\n{}}}\n",
        "let y = 2;\n".repeat(300)
    );
    let at_limit = format!("//! doc\n{comments}{code}{tests}");
    let over = format!("{at_limit}\nfn one_more() {{}}\n");
    assert_eq!(code_lines(&at_limit), 700);
    let sources = [
        ("src/a.rs".to_string(), at_limit),
        (
            "src/b.rs".to_string(),
            format!("{code}fn one_more() {{}}\n"),
        ),
        ("src/c.rs".to_string(), over),
    ];
    assert_eq!(
        long_files(&sources, 700),
        ["src/b.rs: 701 code lines", "src/c.rs: 701 code lines"],
        "code after the tests module is code"
    );
}

#[test]
fn synthetic_test_item_in_the_middle_hides_no_code_after_it() {
    let code = "fn a() {}\n".repeat(5);
    let spec = format!(
        "//! doc\n{code}#[cfg(test)]\nfn helper() {{\n    let _ = 1;\n}}\n\
         #[cfg(test)]\nuse std::fmt;\n{code}#[test]\n#[ignore]\nfn loose() {{\n    let _ = 2;\n}}\n\
         #[tokio::test]\nasync fn loose_async() {{}}\nmod inner {{\n    #[cfg(test)]\n    \
         fn nested() {{\n        let _ = 3;\n    }}\n    fn kept() {{}}\n}}\n\
         #[cfg(not(test))]\nfn real() {{}}\n#[cfg(test)]\nmod tests {{\n    #[test]\n    \
         fn t() {{}}\n}}\n"
    );
    // 5 + 5 plain lines, `mod inner {`, `fn kept`, its `}`, `#[cfg(not(test))]`, `fn real`.
    assert_eq!(code_lines(&spec), 15);
    let sources = [("src/a.rs".to_string(), spec)];
    assert_eq!(long_files(&sources, 14), ["src/a.rs: 15 code lines"]);
    assert_eq!(code_lines("#![cfg(test)]\nfn a() {}\n"), 0);
}
