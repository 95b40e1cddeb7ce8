//! `matrix-proxy plan from-jsonl FILE ...` and `matrix-proxy plan synthetic ...`: the
//! flags checked, the prompts (or, with `--turns`, the sessions) made (`crate::dataset`),
//! the capture plan written or printed by `plan_out.rs`, which says on stderr what it
//! will send. Sends nothing. `plan from-trace FILE`: the trace converted
//! (`crate::dataset::trace`) to a trace file beside the plan, both written new.
//! `plan campaign` and `plan lock` are `plan_campaign.rs`'s.

use std::path::{Path, PathBuf};

use serde_json::Map;

use super::args::{
    DatasetFormat, FromJsonlArgs, FromTraceArgs, PlanCommand, PlanConnection, SyntheticArgs,
    TraceFormat, TraceVerify, TurnsArg,
};
use super::freeze::{check_new, read_metadata};
use super::io::{CliError, Exit, tool, usage, write_new};
use super::plan_campaign::{campaign_cmd, lock_cmd};
use super::plan_out::{Said, ask, check_flags, history, prompt_api, write};
use crate::config::flags;
use crate::config::sessions::{History, MAX_TURNS};
use crate::dataset::{self, Api, Ask, Requests, SessionCase, jsonl, synthetic, trace};
use crate::freeze::fill_metadata;

pub fn plan_cmd(cmd: &PlanCommand) -> Result<Exit, CliError> {
    match cmd {
        PlanCommand::FromJsonl(a) => from_jsonl(a),
        PlanCommand::Synthetic(a) => synthetic_cmd(a),
        PlanCommand::FromTrace(a) => from_trace(a),
        PlanCommand::Campaign(a) => campaign_cmd(a),
        PlanCommand::Lock(a) => lock_cmd(a),
    }
}

fn from_jsonl(a: &FromJsonlArgs) -> Result<Exit, CliError> {
    let endpoint = check_flags(&a.out)?;
    if a.limit == Some(0) {
        return Err(usage("--limit must be at least 1"));
    }
    let format = a.format.map(|f| match f {
        DatasetFormat::Chat => jsonl::Format::Chat,
        DatasetFormat::Completion => jsonl::Format::Completion,
        DatasetFormat::Sharegpt => jsonl::Format::ShareGpt,
        DatasetFormat::Request => jsonl::Format::Request,
    });
    let counter = a
        .tokenizer
        .as_deref()
        .map(synthetic::Counter::open)
        .transpose()
        .map_err(|e| usage(e.to_string()))?;
    let opts = jsonl::Options {
        format,
        limit: a.limit,
        seed: a.seed,
        skip_bad: a.skip_bad,
        output_len_from: a.output_len_from.clone(),
        turns: jsonl_turns(a)?,
    };
    let ask = ask(&a.out, false, false);
    let mut read = jsonl::read(&a.file, &opts, &ask).map_err(|e| usage(e.to_string()))?;
    let unit = if read.array { "item" } else { "line" };
    let turns: usize = read.sessions.iter().map(|s| s.turns.len()).sum();
    let mut lines = vec![format!(
        "{} ({} format{}) of {} good {unit}s in {}",
        match a.turns {
            TurnsArg::First => format!("{} prompts", read.prompts.len()),
            TurnsArg::All => format!("{} sessions of {turns} turns", read.sessions.len()),
        },
        read.format.as_str(),
        if a.format.is_none() { ", detected" } else { "" },
        read.good,
        a.file.display()
    )];
    if read.array {
        lines.push(format!(
            "{} starts with '[': read as one JSON array of objects (as ShareGPT_V3 is distributed), not one object a line; its prompts are named item-N",
            a.file.display()
        ));
    }
    if read.skipped > 0 {
        lines.push(format!(
            "skipped {} bad {unit}(s) (--skip-bad): {}",
            read.skipped,
            read.first_skipped.join("; ")
        ));
    }
    if read.format == jsonl::Format::Request {
        lines.push("raw request bodies are sent as they are: --model, --max-tokens, --stream and --temperature do not apply".into());
    } else if a.out.max_tokens.is_none() && a.output_len_from.is_none() {
        lines.push("warning: no --max-tokens: the requests ask for no max_tokens, so each answer runs to the server's own limit and its length varies from run to run; give --max-tokens N (or --output-len-from FIELD) so the answers can be frozen and decode compared".into());
    }
    if let Some(c) = &counter {
        if read.format == jsonl::Format::Request {
            lines.push("--tokenizer: raw request bodies are sent as they are, so their prompts are not counted".into());
        } else if read.format.api() == Api::Completions {
            for p in &mut read.prompts {
                let text = p.body.pointer("/prompt").and_then(|v| v.as_str());
                p.prompt_tokens = match text {
                    Some(t) => Some(c.count(t).map_err(|e| usage(e.to_string()))? as u64),
                    None => None,
                };
            }
        } else {
            lines.push("--tokenizer counts completion prompts only: a chat template adds tokens the tokenizer alone cannot count, so chat prompts get no prompt_tokens".into());
        }
    }
    let description = jsonl_description(a, read.format);
    let api = read.format.api();
    let said = Said { description, lines };
    let requests = match a.turns {
        TurnsArg::First => Requests::Prompts(read.prompts),
        TurnsArg::All => Requests::Sessions(SessionCase {
            template: ask.template(None),
            history: history(a.history),
            cache_bust: false,
            sessions: read.sessions,
        }),
    };
    write(&a.out, &endpoint, api, requests, said)
}

/// The capture plan's description: what `plan from-jsonl` read, from which flags.
fn jsonl_description(a: &FromJsonlArgs, format: jsonl::Format) -> String {
    format!(
        "Capture plan written by matrix-proxy plan from-jsonl from {} ({} format{}{}); answers are recorded, not judged: replay it, then freeze the run.",
        a.file.display(),
        format.as_str(),
        match (a.limit, a.seed) {
            (Some(k), Some(s)) => format!(", a sample of {k} with seed {s}"),
            (Some(k), None) => format!(", the first {k}"),
            _ => String::new(),
        },
        match (a.turns, a.max_turns) {
            (TurnsArg::First, _) => String::new(),
            (TurnsArg::All, None) => ", every turn: each conversation a session".into(),
            (TurnsArg::All, Some(n)) => format!(", each conversation's first {n} turns a session"),
        }
    )
}

/// `--turns` (with `--max-turns`, `--history`) as the dataset reads it; what applies only
/// to `--turns all`, or not to it, refused.
fn jsonl_turns(a: &FromJsonlArgs) -> Result<jsonl::Turns, CliError> {
    match a.turns {
        TurnsArg::First if a.max_turns.is_some() || a.history.is_some() => Err(usage(
            "--max-turns and --history go with --turns all (every turn of each conversation, as a session)",
        )),
        TurnsArg::First => Ok(jsonl::Turns::First),
        TurnsArg::All if a.output_len_from.is_some() => Err(usage(
            "--output-len-from sets one line's max_tokens, but with --turns all every turn of every session is sent in the case's one request template: give --max-tokens",
        )),
        TurnsArg::All if a.max_turns.is_some_and(|n| n == 0 || n > MAX_TURNS) => Err(usage(
            format!("--max-turns must be from 1 to {MAX_TURNS} (the most turns a session holds)"),
        )),
        TurnsArg::All => Ok(jsonl::Turns::All { max: a.max_turns }),
    }
}

fn synthetic_cmd(a: &SyntheticArgs) -> Result<Exit, CliError> {
    let endpoint = check_flags(&a.out)?;
    // One of the two is given (clap): with --turns, the first turn's length.
    let input_tokens = a.input_tokens.or(a.turn_input_tokens).unwrap_or(0);
    check_synthetic_sizes(a, input_tokens)?;
    let counter = synthetic::Counter::open(&a.tokenizer).map_err(|e| usage(e.to_string()))?;
    if a.shared_prefix_tokens > 0 && a.shared_prefix_tokens as usize <= counter.lead {
        return Err(usage(format!(
            "--shared-prefix-tokens {}: this tokenizer starts every prompt with {} special token(s), so a shared prefix must be longer",
            a.shared_prefix_tokens, counter.lead
        )));
    }
    let api = synthetic_api(a, &endpoint)?;
    let opts = synthetic::Options {
        input_tokens,
        input_stddev: a.input_stddev,
        output_tokens: a.output_tokens,
        count: a.count,
        seed: a.seed,
        shared_prefix_tokens: a.shared_prefix_tokens,
        prefix_groups: a.prefix_groups,
        cache_bust: a.cache_bust,
        api,
    };
    let ask = ask(&a.out, a.ignore_eos, a.min_tokens);
    let made = |e: synthetic::SyntheticError| usage(e.to_string());
    let (requests, mut lines) = match a.turns {
        None => {
            let prompts = synthetic::generate(&counter, &opts, &ask).map_err(made)?;
            let n = prompts.len();
            (Requests::Prompts(prompts), vec![format!("{n} prompts")])
        }
        Some(turns) => synthetic_sessions(a, &counter, &opts, &ask, turns)?,
    };
    lines[0].push_str(&format!(
        " of {input_tokens} input tokens{} under {} (exact, special tokens included), {} output tokens",
        if a.input_stddev > 0.0 {
            format!(" (stddev {})", a.input_stddev)
        } else {
            String::new()
        },
        a.tokenizer.display(),
        a.output_tokens
    ));
    if api == Api::Chat {
        lines.push("--api chat: each message's text has the exact count; the server's chat template adds its own tokens, so the plan records no prompt_tokens".into());
    }
    let description = synthetic_description(a, input_tokens);
    let said = Said { description, lines };
    write(&a.out, &endpoint, api, requests, said)
}

/// `plan synthetic --turns N`: the sessions, and the lines that say what they are (the
/// first completed by the caller).
fn synthetic_sessions(
    a: &SyntheticArgs,
    counter: &synthetic::Counter,
    opts: &synthetic::Options,
    ask: &Ask,
    turns: usize,
) -> Result<(Requests, Vec<String>), CliError> {
    let history = history(a.history);
    let ask_turns = synthetic::TurnsAsk {
        turns,
        turn_input_tokens: a.turn_input_tokens.unwrap_or(opts.input_tokens),
        answers: history == History::Frozen,
    };
    let sessions =
        synthetic::sessions(counter, opts, ask_turns).map_err(|e| usage(e.to_string()))?;
    let n = sessions.len();
    let later = format!(
        "each later turn's user text is exactly {} tokens; {}",
        ask_turns.turn_input_tokens,
        match history {
            History::Frozen =>
                "each turn but the last has an answer of exactly --output-tokens tokens in the plan, sent in the later turns (a frozen history)",
            History::Live =>
                "the plan holds no answers: each turn is sent with the server's own (a live history)",
        }
    );
    let case = SessionCase {
        template: ask.template(Some(a.output_tokens)),
        history,
        cache_bust: a.cache_bust,
        sessions,
    };
    let first = format!("{n} sessions of {turns} turns, first turns");
    Ok((Requests::Sessions(case), vec![first, later]))
}

/// The counts and token lengths `plan synthetic` is asked for, checked before the
/// tokenizer is read: each at least 1 and within the limits, the prefix flags together.
fn check_synthetic_sizes(a: &SyntheticArgs, input_tokens: u64) -> Result<(), CliError> {
    if a.count == 0 || input_tokens == 0 || a.output_tokens == 0 {
        return Err(usage(
            "--count, --input-tokens and --output-tokens must be at least 1",
        ));
    }
    if a.count > synthetic::MAX_COUNT
        || input_tokens > synthetic::MAX_TOKENS
        || a.output_tokens > synthetic::MAX_TOKENS
    {
        return Err(usage(format!(
            "--count is at most {} and --input-tokens and --output-tokens at most {} (a plan holds every prompt)",
            synthetic::MAX_COUNT,
            synthetic::MAX_TOKENS
        )));
    }
    if a.out.max_tokens.is_some() {
        return Err(usage(
            "--max-tokens: plan synthetic asks every request for --output-tokens",
        ));
    }
    if a.prefix_groups != 1 && a.shared_prefix_tokens == 0 {
        return Err(usage(
            "--prefix-groups goes with --shared-prefix-tokens P (the tokens each group shares)",
        ));
    }
    check_stddev(a, input_tokens)?;
    if a.shared_prefix_tokens > 0 && a.shared_prefix_tokens >= input_tokens {
        return Err(usage(format!(
            "--shared-prefix-tokens {} must be below --input-tokens {input_tokens}",
            a.shared_prefix_tokens
        )));
    }
    check_turns(a)?;
    if a.prefix_groups == 0 {
        return Err(usage("--prefix-groups must be at least 1"));
    }
    Ok(())
}

/// `--turns N` (with `--turn-input-tokens`): N and M within the limits, every turn of
/// every session within [`synthetic::MAX_COUNT`] texts, every length exact.
fn check_turns(a: &SyntheticArgs) -> Result<(), CliError> {
    let Some(turns) = a.turns else {
        return Ok(());
    };
    if turns == 0 || turns > MAX_TURNS {
        return Err(usage(format!(
            "--turns must be from 1 to {MAX_TURNS} (the most turns a session holds)"
        )));
    }
    if a.turn_input_tokens == Some(0) || a.turn_input_tokens > Some(synthetic::MAX_TOKENS) {
        return Err(usage(format!(
            "--turn-input-tokens must be from 1 to {}",
            synthetic::MAX_TOKENS
        )));
    }
    if a.count.saturating_mul(turns as u64) > synthetic::MAX_COUNT {
        return Err(usage(format!(
            "--count {} sessions of --turns {turns} make more than {} turns (a plan holds every turn's text); ask for fewer",
            a.count,
            synthetic::MAX_COUNT
        )));
    }
    if a.input_stddev > 0.0 {
        return Err(usage(
            "--input-stddev does not apply with --turns: every turn's text has its exact count",
        ));
    }
    Ok(())
}

/// The capture plan's description: what `plan synthetic` made, from which flags.
fn synthetic_description(a: &SyntheticArgs, input_tokens: u64) -> String {
    format!(
        "Capture plan written by matrix-proxy plan synthetic: {} {} of {} tokens (stddev {}) under {}, {} output tokens, seed {}{}{}; answers are recorded, not judged.",
        a.count,
        match (a.turns, a.turn_input_tokens) {
            (None, _) => "prompts".to_string(),
            (Some(t), m) => format!(
                "sessions of {t} turns (later turns' user text {} tokens), first turns",
                m.unwrap_or(input_tokens)
            ),
        },
        input_tokens,
        a.input_stddev,
        a.tokenizer.display(),
        a.output_tokens,
        a.seed,
        if a.shared_prefix_tokens > 0 {
            format!(
                ", {} groups sharing a {}-token prefix",
                a.prefix_groups, a.shared_prefix_tokens
            )
        } else {
            String::new()
        },
        if a.cache_bust {
            ", cache-busting tags"
        } else {
            ""
        }
    )
}

/// `--api`, or the API `--endpoint`'s path names, else completions (chat with `--turns`);
/// an `--api` the path contradicts is refused, and so are sessions of completions.
fn synthetic_api(a: &SyntheticArgs, endpoint: &crate::model::Endpoint) -> Result<Api, CliError> {
    let api = prompt_api(a.api, &a.out.endpoint, endpoint)?;
    match a.turns {
        None => Ok(api),
        Some(_) if a.api.is_none() && Api::of_endpoint(endpoint).is_none() => Ok(Api::Chat),
        Some(_) if api == Api::Chat => Ok(api),
        Some(_) => Err(usage(
            "--turns makes chat sessions (each turn is sent with the conversation so far): give --api chat, or an --endpoint origin or chat path (.../chat/completions)",
        )),
    }
}

/// `--input-stddev` from 0 to `--input-tokens`: a wider spread would only clamp.
fn check_stddev(a: &SyntheticArgs, input_tokens: u64) -> Result<(), CliError> {
    if !a.input_stddev.is_finite() || a.input_stddev < 0.0 || a.input_stddev > input_tokens as f64 {
        // As typed, near enough: 1e300 in full would be 301 digits.
        let given = if a.input_stddev.abs() >= 1e15 {
            format!("{:e}", a.input_stddev)
        } else {
            a.input_stddev.to_string()
        };
        return Err(usage(format!(
            "--input-stddev {given} is out of range: give a number from 0 to --input-tokens ({input_tokens}); a wider spread would clamp most lengths to the shortest or the longest prompt instead of drawing them"
        )));
    }
    Ok(())
}

/// Whole prompts re-encoded under `--verify sample`.
const VERIFY_SAMPLE: usize = 1000;

/// `plan from-trace FILE`: the trace file written beside the plan (through a temporary
/// name, so a refused trace leaves nothing), then the plan; neither replaces a file.
fn from_trace(a: &FromTraceArgs) -> Result<Exit, CliError> {
    let checked = check_trace_flags(a)?;
    let mut lines = Vec::new();
    let mut metadata = match &a.metadata {
        Some(p) => read_metadata(p)?,
        None => Map::new(),
    };
    fill_metadata(&mut metadata, &mut lines);
    let counter = synthetic::Counter::open(&a.tokenizer).map_err(|e| usage(e.to_string()))?;
    let opts = trace::Options {
        format: match a.format {
            TraceFormat::Mooncake => trace::Format::Mooncake,
            TraceFormat::Azure => trace::Format::Azure,
            TraceFormat::Burstgpt => trace::Format::BurstGpt,
        },
        block_tokens: a.block_tokens,
        seed: a.seed,
        window: checked.window,
        limit: a.limit,
        sort: a.sort,
        keep_failed: a.keep_failed,
        verify: match a.verify {
            TraceVerify::Sample => trace::Verify::Sample(VERIFY_SAMPLE),
            TraceVerify::All => trace::Verify::All,
        },
    };
    let (summary, sha256) = write_trace(a, &checked.trace, &counter, &opts)?;
    let ask = Ask {
        model: a.model.clone(),
        max_tokens: None,
        stream: a.stream,
        temperature: Some(a.temperature),
        ignore_eos: a.ignore_eos,
        min_tokens: a.min_tokens,
    };
    let empty = match checked.api {
        Api::Chat => serde_json::json!([]),
        Api::Completions | Api::Raw => serde_json::json!(""),
    };
    let file = checked
        .trace
        .file_name()
        .map(|n| n.to_string_lossy().into_owned());
    let plan = serde_json::json!({
        "description": trace_description(a, &summary),
        "endpoint": checked.url,
        "connection": match a.connection {
            PlanConnection::KeepAlive => "keep-alive",
            PlanConnection::Fresh => "fresh",
        },
        "repetitions": a.repetitions,
        "timeout_seconds": a.timeout_seconds,
        "metadata": metadata,
        "load": {
            "mode": "trace",
            "max_in_flight": a.max_in_flight,
            "speedup": a.speedup,
            "trace": {"file": file, "sha256": sha256, "synthetic": summary.spec.to_json()},
        },
        "cases": [{"name": summary.spec.case, "request": ask.body(checked.api, empty, Some(1))}],
    });
    let written = crate::freeze::plan_bytes(&plan, crate::config::plan::MAX_PLAN_BYTES)
        .map_err(|e| usage(e.to_string()))
        .and_then(|bytes| {
            // The plan is what validate reads (its trace file is read back by replay).
            crate::config::plan::Plan::from_json_bytes(&bytes)
                .map_err(|e| tool(format!("internal: the trace plan does not validate: {e}")))?;
            write_new("--out", &a.out, &bytes)
        });
    if let Err(e) = written {
        // The trace file is this command's own, made a moment ago: no plan, no trace.
        let _ = std::fs::remove_file(&checked.trace);
        return Err(e);
    }
    lines.extend(trace_lines(a, &summary, checked.api));
    lines.push(format!(
        "wrote {} and its trace {} (sha256 {sha256}); replay it with `matrix-proxy replay {0}`",
        a.out.display(),
        checked.trace.display()
    ));
    for line in &lines {
        eprintln!("matrix-proxy: {line}");
    }
    Ok(Exit::Ok)
}

/// `plan from-trace`'s flags as checked before anything is read.
struct TraceFlags {
    url: String,
    api: Api,
    /// The trace file written beside the plan.
    trace: PathBuf,
    window: Option<(u64, Option<u64>)>,
}

fn check_trace_flags(a: &FromTraceArgs) -> Result<TraceFlags, CliError> {
    check_new("--out", Some(&a.out))?;
    let stem = a
        .out
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "plan".into());
    let trace = a.out.with_file_name(format!("{stem}.trace.jsonl"));
    check_new("--out's trace file", Some(&trace))?;
    if !a.temperature.is_finite() || a.temperature < 0.0 {
        return Err(usage("--temperature must be a number >= 0"));
    }
    if !a.speedup.is_finite() || !(0.001..=1e6).contains(&a.speedup) {
        return Err(usage(
            "--speedup must be a number from 0.001 to 1000000 (2: twice as fast), as a plan's load.speedup",
        ));
    }
    flags::seconds("--timeout-seconds", a.timeout_seconds).map_err(usage)?;
    if a.repetitions == 0 || a.max_in_flight == 0 || a.limit == Some(0) {
        return Err(usage(
            "--repetitions, --max-in-flight and --limit must be at least 1",
        ));
    }
    if a.block_tokens < 2 || u64::from(a.block_tokens) > synthetic::MAX_TOKENS {
        return Err(usage(format!(
            "--block-tokens must be from 2 to {}",
            synthetic::MAX_TOKENS
        )));
    }
    let endpoint = flags::endpoint("--endpoint", &a.endpoint).map_err(usage)?;
    let api = prompt_api(a.api, &a.endpoint, &endpoint)?;
    let url = dataset::api_url(&endpoint, api).map_err(|e| usage(e.to_string()))?;
    let window = a.window.as_deref().map(window).transpose()?;
    Ok(TraceFlags {
        url,
        api,
        trace,
        window,
    })
}

/// `--window START:END` (seconds; END may be left out) in nanoseconds.
fn window(text: &str) -> Result<(u64, Option<u64>), CliError> {
    let bad = || {
        usage(format!(
            "--window {text:?}: give START:END in seconds from the trace's first line, START >= 0 and END above it (END left out: to the end), e.g. 60:120"
        ))
    };
    let (start, end) = text.split_once(':').ok_or_else(bad)?;
    let ns = |s: &str| -> Result<u64, CliError> {
        let x: f64 = s.trim().parse().map_err(|_| bad())?;
        if !(0.0..=1e9).contains(&x) {
            return Err(bad());
        }
        Ok((x * 1e9).round() as u64)
    };
    let start = ns(start)?;
    let end = match end.trim() {
        "" => None,
        e => Some(ns(e)?),
    };
    if end.is_some_and(|e| e <= start) {
        return Err(bad());
    }
    Ok((start, end))
}

/// A writer that hashes what passes through it.
struct Hashed<W> {
    inner: W,
    hash: sha2::Sha256,
}

impl<W: std::io::Write> std::io::Write for Hashed<W> {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(b)?;
        sha2::Digest::update(&mut self.hash, &b[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// The trace converted into `path` (new), and its SHA-256.
fn write_trace(
    a: &FromTraceArgs,
    path: &Path,
    counter: &synthetic::Counter,
    opts: &trace::Options,
) -> Result<(trace::Summary, String), CliError> {
    let input = std::fs::File::open(&a.file)
        .map_err(|e| usage(format!("{}: cannot read the trace: {e}", a.file.display())))?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    let out =
        std::fs::File::create_new(&tmp).map_err(|e| tool(format!("{}: {e}", tmp.display())))?;
    let mut hashed = Hashed {
        inner: std::io::BufWriter::with_capacity(1 << 20, out),
        hash: <sha2::Sha256 as sha2::Digest>::new(),
    };
    let file = a.file.display().to_string();
    let reader = std::io::BufReader::with_capacity(1 << 20, input);
    let converted = trace::convert(reader, &file, counter, opts, &mut hashed);
    let summary = converted.map_err(|e| match e {
        trace::TraceError::Write(_) => tool(e.to_string()),
        _ => usage(e.to_string()),
    });
    let done = summary.and_then(|s| {
        let synced = hashed
            .inner
            .into_inner()
            .map_err(|e| e.into_error())
            .and_then(|f| f.sync_all());
        synced
            .and_then(|()| std::fs::hard_link(&tmp, path))
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::AlreadyExists => usage(format!(
                    "{}: exists (made meanwhile); it is never replaced",
                    path.display()
                )),
                _ => tool(format!("{}: {e}", path.display())),
            })?;
        Ok(s)
    });
    let _ = std::fs::remove_file(&tmp);
    let summary = done?;
    let sha256 = crate::record::rundir::hex(&sha2::Digest::finalize(hashed.hash));
    Ok((summary, sha256))
}

/// The trace plan's description.
fn trace_description(a: &FromTraceArgs, s: &trace::Summary) -> String {
    format!(
        "Capture plan written by matrix-proxy plan from-trace from the {} trace {}: {} entries of {} lines read{}{}, prompts under {} in blocks of {} tokens, seed {}; answers are recorded, not judged: replay it, then freeze the run.",
        a.format.name(),
        a.file.display(),
        s.entries,
        s.lines,
        a.window
            .as_deref()
            .map(|w| format!(", window {w} s"))
            .unwrap_or_default(),
        a.limit
            .map(|n| format!(", the first {n}"))
            .unwrap_or_default(),
        a.tokenizer.display(),
        a.block_tokens,
        a.seed
    )
}

/// What `plan from-trace` kept and checked, for stderr.
fn trace_lines(a: &FromTraceArgs, s: &trace::Summary, api: Api) -> Vec<String> {
    let mut lines = vec![format!(
        "kept {} entries of {} lines read from {} ({} format){}",
        s.entries,
        s.lines,
        a.file.display(),
        a.format.name(),
        if s.stopped_early {
            "; reading stopped at the limit or the window's end"
        } else {
            ""
        }
    )];
    let mut skipped = Vec::new();
    if s.failed > 0 && !a.keep_failed {
        skipped.push(format!(
            "{} failed requests (0 output tokens; --keep-failed keeps them)",
            s.failed
        ));
    }
    if s.outside_window > 0 {
        skipped.push(format!("{} outside the window", s.outside_window));
    }
    if s.past_limit > 0 {
        skipped.push(format!("{} past --limit", s.past_limit));
    }
    if !skipped.is_empty() {
        lines.push(format!("skipped {}", skipped.join(", ")));
    }
    if s.failed > 0 && a.keep_failed {
        lines.push(format!(
            "kept {} failed requests (0 output tokens) as entries of 1 output token",
            s.failed
        ));
    }
    let secs = s.length_us as f64 / 1e6;
    let mean = if secs > 0.0 {
        format!("{:.2}", s.entries.saturating_sub(1) as f64 / secs)
    } else {
        "n/a".into()
    };
    lines.push(format!(
        "the trace lasts {secs:.3} s: mean {mean} requests/s ((entries - 1) / length), peak {} in one second (offsets as recorded; the plan's speedup {} divides them)",
        s.peak_per_second, a.speedup
    ));
    let blocks = if s.whole_blocks {
        "each re-encoded alone".to_string()
    } else {
        format!(
            "each exact by its junctions ({} ordered pairs of the {} words encoded together: each its two words' tokens), {} of them re-encoded alone (a seeded sample)",
            s.junctions,
            s.spec.words.len(),
            s.verified_blocks
        )
    };
    lines.push(format!(
        "{} distinct blocks of up to {} tokens ({} of fresh ids, for tokens the trace names no block of), {blocks}: exact; {} whole prompts re-encoded ({}): exact, special tokens included, each block's token ids the same inside the prompt as alone",
        s.distinct_blocks,
        a.block_tokens,
        s.fresh_blocks,
        s.verified_prompts,
        match a.verify {
            TraceVerify::Sample => format!("a sample of at most {VERIFY_SAMPLE}, seed {}", a.seed),
            TraceVerify::All => "all".into(),
        }
    ));
    if api == Api::Chat {
        lines.push("warning: --api chat: the server's chat template adds tokens the tokenizer cannot count, so the prompts the server sees are longer than the trace's input tokens and blocks may not align with its prefix cache's".into());
    }
    lines
}
