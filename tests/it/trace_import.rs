//! `plan from-trace`: public LLM traces (Mooncake JSONL, Azure and BurstGPT CSV, written
//! here) to a trace plan and its trace file. The prompts are rebuilt here from the trace
//! file and the plan's synthetic spec by the rules of the trace format (not the crate's
//! code) and encoded under a byte-level BPE tokenizer.json built here: exactly each
//! entry's input tokens, and equal block ids give equal token ids.

use std::path::{Path, PathBuf};

use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{RngCore, SeedableRng};
use serde_json::{Value, json};
use sha2::Digest;

use crate::support::*;

/// What a conversion wrote: the plan, the trace file's entries and bytes, stderr.
struct Converted {
    plan: Value,
    entries: Vec<Value>,
    trace_bytes: Vec<u8>,
    trace_path: PathBuf,
    err: String,
}

/// `plan from-trace FILE --format FORMAT --tokenizer TK ... --out DIR/NAME.json`, which
/// must succeed.
fn convert(dir: &Path, name: &str, file: &Path, format: &str, extra: &[&str]) -> Converted {
    let (code, err, out) = try_convert(dir, name, file, format, extra);
    assert_eq!(code, Some(0), "{err}");
    let plan: Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    let trace_path = dir.join(format!("{name}.trace.jsonl"));
    let trace_bytes = std::fs::read(&trace_path).unwrap();
    let entries = String::from_utf8(trace_bytes.clone())
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    Converted {
        plan,
        entries,
        trace_bytes,
        trace_path,
        err,
    }
}

/// The same, whatever its end: the exit code, stderr and the plan's path.
fn try_convert(
    dir: &Path,
    name: &str,
    file: &Path,
    format: &str,
    extra: &[&str],
) -> (Option<i32>, String, PathBuf) {
    let tk = dir.join("tokenizer.json");
    if !tk.exists() {
        test_tokenizer(dir);
    }
    let out = dir.join(format!("{name}.json"));
    let mut args = vec![
        "plan",
        "from-trace",
        s(file),
        "--format",
        format,
        "--tokenizer",
        s(&tk),
        "--endpoint",
        "http://127.0.0.1:9",
        "--model",
        "m",
        "--out",
        s(&out),
    ];
    args.extend(extra);
    let (code, _, err) = run(&args);
    (code, err, out)
}

/// A block's text by the trace format's rule: for each of its `n` words, the next u64 of
/// ChaCha8 seeded with the seed on the block id's stream picks a word, after a space.
fn block_text(spec: &Value, id: u64, n: usize) -> String {
    let words: Vec<&str> = spec["words"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w.as_str().unwrap())
        .collect();
    let mut rng = ChaCha8Rng::seed_from_u64(spec["seed"].as_u64().unwrap());
    rng.set_stream(id);
    (0..n)
        .map(|_| format!(" {}", words[(rng.next_u64() % words.len() as u64) as usize]))
        .collect()
}

/// An entry's blocks as (id, word count): block j covers tokens [j*B, min((j+1)*B, T)),
/// less the special tokens for the first.
fn blocks(spec: &Value, entry: &Value) -> Vec<(u64, usize)> {
    let b = spec["block_tokens"].as_u64().unwrap();
    let special = spec["special_tokens"].as_u64().unwrap();
    let t = entry["input_tokens"].as_u64().unwrap();
    let ids = entry["blocks"].as_array().unwrap();
    assert_eq!(ids.len() as u64, t.div_ceil(b), "{entry}");
    ids.iter()
        .enumerate()
        .map(|(j, id)| {
            let j = j as u64;
            let len = (t - j * b).min(b) - if j == 0 { special } else { 0 };
            (id.as_u64().unwrap(), len as usize)
        })
        .collect()
}

fn prompt(spec: &Value, entry: &Value) -> String {
    blocks(spec, entry)
        .into_iter()
        .map(|(id, n)| block_text(spec, id, n))
        .collect()
}

fn offsets(c: &Converted) -> Vec<u64> {
    c.entries
        .iter()
        .map(|e| e["offset_us"].as_u64().unwrap())
        .collect()
}

fn field(c: &Converted, name: &str) -> Vec<u64> {
    c.entries
        .iter()
        .map(|e| e[name].as_u64().unwrap())
        .collect()
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn mooncake_prompts_share_exactly_their_blocks_token_ids() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let trace = write(
        dir,
        "t.jsonl",
        concat!(
            r#"{"timestamp": 0, "input_length": 10, "output_length": 3, "hash_ids": [1, 2, 3]}"#,
            "\n",
            r#"{"timestamp": 500, "input_length": 9, "output_length": 2, "hash_ids": [1, 2, 4]}"#,
            "\n\n",
            r#"{"timestamp": 1500, "input_length": 6, "output_length": 1, "hash_ids": [1]}"#,
            "\n",
            r#"{"timestamp": 1500.25, "input_length": 12, "output_length": 5, "hash_ids": [7, 2, 3], "other": 1}"#,
            "\n",
        ),
    );
    let c = convert(
        dir,
        "p",
        &trace,
        "mooncake",
        &["--block-tokens", "4", "--verify", "all", "--ignore-eos"],
    );
    // The plan: a trace plan naming its file beside it, the file's hash pinned.
    let p = &c.plan;
    assert_eq!(p["load"]["mode"], json!("trace"));
    assert_eq!(p["load"]["max_in_flight"], json!(1024));
    assert_eq!(p["load"]["speedup"].as_f64(), Some(1.0));
    assert_eq!(p["load"]["trace"]["file"], json!("p.trace.jsonl"));
    let sha = sha2::Sha256::digest(&c.trace_bytes);
    let hex: String = sha.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(p["load"]["trace"]["sha256"], json!(hex));
    let spec = &p["load"]["trace"]["synthetic"];
    assert_eq!(spec["case"], json!("trace"));
    assert_eq!(spec["block_tokens"], json!(4));
    assert_eq!(spec["special_tokens"], json!(1));
    assert_eq!(spec["seed"], json!(0));
    // The vocabulary's words that are one token after a space, in id order.
    assert_eq!(spec["words"], json!(["a", "s", "t", "w", "the"]));
    assert_eq!(
        p["cases"],
        json!([{"name": "trace", "request": {"model": "m", "prompt": "", "max_tokens": 1,
                "ignore_eos": true, "temperature": 0.0}}])
    );
    assert_eq!(p["endpoint"], json!("http://127.0.0.1:9/v1/completions"));
    assert_eq!(p["repetitions"], json!(1));
    for key in ["concurrency", "requests_per_case", "warmup_per_case"] {
        assert!(p.get(key).is_none(), "{key}");
    }
    // The entries: offsets in µs from the first line, tokens, the trace's ids then
    // fresh ids from 2^40.
    assert_eq!(offsets(&c), [0, 500_000, 1_500_000, 1_500_250]);
    assert_eq!(field(&c, "input_tokens"), [10, 9, 6, 12]);
    assert_eq!(field(&c, "output_tokens"), [3, 2, 1, 5]);
    let fresh = 1u64 << 40;
    assert_eq!(c.entries[2]["blocks"], json!([1, fresh]));
    assert_eq!(c.entries[3]["blocks"], json!([7, 2, 3]));
    // Each prompt, rebuilt by the format's rules, is exactly its input tokens, and a
    // block's token ids are the same wherever its id stands at its place.
    let tk = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    let mut at_place = std::collections::HashMap::new();
    for e in &c.entries {
        let ids = tk.encode(prompt(spec, e), true).unwrap().get_ids().to_vec();
        assert_eq!(ids.len() as u64, e["input_tokens"].as_u64().unwrap(), "{e}");
        let mut at = 1;
        for (j, (id, n)) in blocks(spec, e).into_iter().enumerate() {
            let tokens = ids[at..at + n].to_vec();
            at += n;
            let seen = at_place.entry((j, id)).or_insert_with(|| tokens.clone());
            // A shorter block (the entry's last) is a prefix of a longer one.
            let k = seen.len().min(tokens.len());
            assert_eq!(seen[..k], tokens[..k], "block {id} at {j}");
        }
    }
    // Lines 1 and 2 share blocks 1 and 2: their first 1 + 3 + 4 tokens are equal, and
    // blocks 3 and 4 differ.
    let first = |i: usize| {
        tk.encode(prompt(spec, &c.entries[i]), true)
            .unwrap()
            .get_ids()
            .to_vec()
    };
    assert_eq!(first(0)[..8], first(1)[..8]);
    assert_ne!(first(0)[8..], first(1)[8..]);
    assert!(
        c.err.contains("kept 4 entries of 4 lines read"),
        "{}",
        c.err
    );
    assert!(
        c.err.contains("4 whole prompts re-encoded (all)"),
        "{}",
        c.err
    );
    assert!(c.err.contains("7 distinct blocks"), "{}", c.err);
    assert!(c.err.contains("peak 2 in one second"), "{}", c.err);
    assert!(c.trace_path.exists());

    // The plan validates and replays: each request's prompt is the one its entry makes
    // by the format's rules, sent at the entry's offset, its rows planning its tokens.
    let (code, _, err) = run(&["validate", s(&dir.join("p.json"))]);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("trace of 4 entries over 1.500 s"), "{err}");
    let run_dir = dir.join("run");
    let (code, _, err) = run(&[
        "replay",
        "--quiet",
        "--mock-worker",
        "--out",
        s(&run_dir),
        s(&dir.join("p.json")),
    ]);
    assert_eq!(code, Some(0), "{err}");
    let rows = Rows::read(&run_dir);
    let (phase, index, body, planned, sched) = (
        rows.strs("phase"),
        rows.i64s("dispatch_index"),
        rows.bins("request_body"),
        rows.i64s("prompt_tokens_planned"),
        rows.i64s("scheduled_offset_us"),
    );
    let mut measured: Vec<usize> = (0..rows.len())
        .filter(|&i| phase[i].as_deref() == Some("measured"))
        .collect();
    measured.sort_by_key(|&i| index[i]);
    assert_eq!(measured.len(), 4);
    let first_sched = sched[measured[0]].unwrap();
    for (k, &i) in measured.iter().enumerate() {
        let e = &c.entries[k];
        let sent: Value = serde_json::from_slice(&body[i]).unwrap();
        assert_eq!(sent["prompt"], json!(prompt(spec, e)), "entry {k}");
        assert_eq!(sent["max_tokens"], e["output_tokens"], "entry {k}");
        assert_eq!(planned[i], e["input_tokens"].as_i64(), "entry {k}");
        assert_eq!(
            sched[i].unwrap() - first_sched,
            e["offset_us"].as_i64().unwrap(),
            "entry {k}"
        );
    }

    // Neither file is replaced: the plan, and (the plan gone) its trace file.
    let (code, err, _) = try_convert(dir, "p", &trace, "mooncake", &["--block-tokens", "4"]);
    assert_eq!(code, Some(2), "{err}");
    std::fs::remove_file(dir.join("p.json")).unwrap();
    let (code, err, _) = try_convert(dir, "p", &trace, "mooncake", &["--block-tokens", "4"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("p.trace.jsonl") && err.contains("exists"),
        "{err}"
    );
    assert!(!dir.join("p.json").exists());
}

#[test]
fn azure_and_burstgpt_csvs_give_offsets_tokens_and_failed_rows() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let azure = write(
        dir,
        "azure.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n\
         2023-11-16 18:15:46.6805900,10,3\n\
         2023-11-16 18:15:47.1805905,5,7\n\
         \"2023-11-16 18:15:49.0000000\",20,1\n",
    );
    let c = convert(dir, "az", &azure, "azure", &["--block-tokens", "8"]);
    // By default every distinct block is checked by its junctions (every ordered pair of
    // the words encoded together once), a sample of them re-encoded whole.
    assert!(
        c.err.contains(
            "each exact by its junctions (25 ordered pairs of the 5 words encoded together"
        ),
        "{}",
        c.err
    );
    // 100 ns digits: 0.5000005 s is 500,000 µs (rounded down).
    assert_eq!(offsets(&c), [0, 500_000, 2_319_410]);
    assert_eq!(field(&c, "input_tokens"), [10, 5, 20]);
    assert_eq!(field(&c, "output_tokens"), [3, 7, 1]);
    let fresh = 1u64 << 40;
    assert_eq!(c.entries[0]["blocks"], json!([fresh, fresh + 1]));
    assert_eq!(
        c.entries[2]["blocks"],
        json!([fresh + 3, fresh + 4, fresh + 5])
    );
    let tk = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    let spec = &c.plan["load"]["trace"]["synthetic"];
    for e in &c.entries {
        let n = tk.encode(prompt(spec, e), true).unwrap().get_ids().len() as u64;
        assert_eq!(n, e["input_tokens"].as_u64().unwrap());
    }

    // BurstGPT: columns found by name in any order; 0 response tokens is a failed request.
    let burst = write(
        dir,
        "burst.csv",
        "Model,Timestamp,Request tokens,Response tokens,Total tokens,Log Type\n\
         ChatGPT,5,6,2,8,Conversation log\n\
         GPT-4,6.5,7,0,7,Conversation log\n\
         ChatGPT,8.25,9,4,13,API log\n",
    );
    let c = convert(dir, "bg", &burst, "burstgpt", &[]);
    assert_eq!(offsets(&c), [0, 3_250_000]);
    assert_eq!(field(&c, "output_tokens"), [2, 4]);
    assert!(c.err.contains("skipped 1 failed requests"), "{}", c.err);
    let c = convert(dir, "bg2", &burst, "burstgpt", &["--keep-failed"]);
    assert_eq!(offsets(&c), [0, 1_500_000, 3_250_000]);
    assert_eq!(field(&c, "input_tokens"), [6, 7, 9]);
    assert_eq!(field(&c, "output_tokens"), [2, 1, 4]);
    assert!(c.err.contains("kept 1 failed requests"), "{}", c.err);
}

#[test]
fn a_window_a_limit_and_a_speedup() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let text: String = (0..10)
        .map(|i| {
            format!(
                "{{\"timestamp\": {}, \"input_length\": {}, \"output_length\": 4, \"hash_ids\": [{i}]}}\n",
                1000 + i * 1000,
                2 + i
            )
        })
        .collect();
    let trace = write(dir, "t.jsonl", &text);
    let c = convert(dir, "w", &trace, "mooncake", &["--window", "2:5"]);
    assert_eq!(offsets(&c), [0, 1_000_000, 2_000_000]);
    assert_eq!(field(&c, "input_tokens"), [4, 5, 6]);
    assert!(c.err.contains("skipped 3 outside the window"), "{}", c.err);
    let c = convert(
        dir,
        "l",
        &trace,
        "mooncake",
        &["--window", "2.5:", "--limit", "2"],
    );
    assert_eq!(offsets(&c), [500_000, 1_500_000]);
    assert_eq!(field(&c, "input_tokens"), [5, 6]);
    let c = convert(
        dir,
        "s",
        &trace,
        "mooncake",
        &["--speedup", "2", "--limit", "3"],
    );
    assert_eq!(c.plan["load"]["speedup"].as_f64(), Some(2.0));
    assert_eq!(offsets(&c), [0, 1_000_000, 2_000_000]);
    // Out of time order: refused by line, unless --sort (stable, the window held).
    let unsorted = write(
        dir,
        "u.jsonl",
        "{\"timestamp\": 2000, \"input_length\": 5, \"output_length\": 1}\n\
         {\"timestamp\": 1000, \"input_length\": 6, \"output_length\": 1}\n\
         {\"timestamp\": 3000, \"input_length\": 7, \"output_length\": 1}\n\
         {\"timestamp\": 1000, \"input_length\": 8, \"output_length\": 1}\n",
    );
    let c = convert(dir, "sorted", &unsorted, "mooncake", &["--sort"]);
    assert_eq!(offsets(&c), [0, 0, 1_000_000, 2_000_000]);
    assert_eq!(field(&c, "input_tokens"), [6, 8, 5, 7]);
}

#[test]
fn hostile_traces_are_refused_naming_the_file_and_line() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let good = r#"{"timestamp": 1, "input_length": 5, "output_length": 1}"#;
    let cases: Vec<(&str, &str, String, &str)> = vec![
        (
            "mooncake",
            "unsorted.jsonl",
            format!(
                "{good}\n{}\n",
                r#"{"timestamp": 0, "input_length": 5, "output_length": 1}"#
            ),
            ":2: its time is 0.001s before the line before it",
        ),
        (
            "mooncake",
            "negative.jsonl",
            format!(
                "{good}\n\n{}\n",
                r#"{"timestamp": -5, "input_length": 5, "output_length": 1}"#
            ),
            ":3: timestamp -5 is negative",
        ),
        (
            "mooncake",
            "huge.jsonl",
            format!(
                "{}\n",
                r#"{"timestamp": 9007199254741, "input_length": 5, "output_length": 1}"#
            ),
            ":1: timestamp 9007199254741 is past 2^53 microseconds",
        ),
        (
            "mooncake",
            "json.jsonl",
            format!("{good}\n{{\"timestamp\": 2,\n"),
            ":2: not valid JSON",
        ),
        (
            "mooncake",
            "nan.jsonl",
            format!(
                "{good}\n{}\n",
                r#"{"timestamp": NaN, "input_length": 5, "output_length": 1}"#
            ),
            ":2: not valid JSON",
        ),
        (
            "mooncake",
            "ids.jsonl",
            format!(
                "{}\n",
                r#"{"timestamp": 1, "input_length": 5, "output_length": 1, "hash_ids": [1099511627776]}"#
            ),
            ":1: hash id 1099511627776 (item 0) is not below 2^40",
        ),
        (
            "mooncake",
            "many.jsonl",
            format!(
                "{}\n",
                r#"{"timestamp": 1, "input_length": 5, "output_length": 1, "hash_ids": [1, 2]}"#
            ),
            ":1: 2 hash_ids for 5 input tokens in blocks of 512: at most 1",
        ),
        (
            "mooncake",
            "short.jsonl",
            format!(
                "{}\n",
                r#"{"timestamp": 1, "input_length": 1, "output_length": 1}"#
            ),
            ":1: input_length 1 is out of range: give 2 to 1048576",
        ),
        (
            "burstgpt",
            "nan.csv",
            "Timestamp,Request tokens,Response tokens\n1,5,5\nNaN,5,5\n".into(),
            ":3: Timestamp NaN is not a finite number",
        ),
        (
            "burstgpt",
            "inf.csv",
            "Timestamp,Request tokens,Response tokens\ninf,5,5\n".into(),
            ":2: Timestamp inf is not a finite number",
        ),
        (
            "burstgpt",
            "neg.csv",
            "Timestamp,Request tokens,Response tokens\n1,-5,5\n".into(),
            ":2: Request tokens -5 is negative",
        ),
        (
            "burstgpt",
            "cols.csv",
            "Timestamp,Request tokens\n1,5\n".into(),
            ":1: the header has no column \"Response tokens\": a burstgpt trace's header names Timestamp, Request tokens, Response tokens; this one names Timestamp, Request tokens",
        ),
        (
            "azure",
            "cols.csv",
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,5\n".into(),
            ":2: no field \"GeneratedTokens\" (column 3 of the header; the row has 2 fields)",
        ),
        (
            "azure",
            "date.csv",
            "TIMESTAMP,ContextTokens,GeneratedTokens\n16/11/2023,5,5\n".into(),
            ":2: TIMESTAMP \"16/11/2023\" is not a datetime",
        ),
    ];
    for (format, name, text, want) in cases {
        let file = write(dir, name, &text);
        let stem = format!("plan-{format}-{name}");
        let (code, err, out) = try_convert(dir, &stem, &file, format, &[]);
        assert_eq!(code, Some(2), "{name}: {err}");
        let named = format!("{}{want}", file.display());
        assert!(err.contains(&named), "{name}: wanted {named:?} in {err}");
        assert!(!out.exists(), "{name}: a plan was written");
        assert!(!dir.join(format!("{stem}.trace.jsonl")).exists(), "{name}");
    }
}

/// A tokenizer that merges across words (no pre-tokenizer; " a" + " a" is one token) is
/// refused by the check of every pair of words, naming the pair and the tokens, and
/// writes nothing.
#[test]
fn a_tokenizer_merging_across_words_is_refused_by_the_check() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let mut vocab = serde_json::Map::new();
    for c in (32u8..127).map(char::from) {
        vocab.insert(c.to_string(), json!(vocab.len()));
    }
    let merges = [(" ", "a"), (" ", "s"), (" a", " a")];
    for (a, b) in merges {
        vocab.insert(format!("{a}{b}"), json!(vocab.len()));
    }
    let tokenizer = json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": null, "post_processor": null, "decoder": null,
        "model": {"type": "BPE", "dropout": null, "unk_token": null,
                  "continuing_subword_prefix": null, "end_of_word_suffix": null,
                  "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab,
                  "merges": merges.iter().map(|(a, b)| [a, b]).collect::<Vec<_>>()}
    });
    // try_convert writes no tokenizer where one is.
    std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();
    let text: String = (0..4)
        .map(|i| format!("{{\"timestamp\": {i}, \"input_length\": 64, \"output_length\": 1}}\n"))
        .collect();
    let trace = write(dir, "t.jsonl", &text);
    let (code, err, out) = try_convert(dir, "p", &trace, "mooncake", &["--block-tokens", "16"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("the words \"a\" and \"a\" encode to [")
            && err.contains("together (\" a a\"), not to their own tokens"),
        "{err}"
    );
    assert!(!out.exists() && !dir.join("p.trace.jsonl").exists());
    let leftovers: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}
