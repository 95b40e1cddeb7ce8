//! Workloads at scale: `plan from-jsonl` (four formats, bad lines, a seeded sample) and
//! `plan synthetic` (exact token counts under a tokenizer.json built here, no download;
//! shared prefixes; cache busting), each a capture plan that validates, and a dataset
//! carried through capture -> freeze -> replay against the mock.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::support::*;

/// Token ids of `text` under the tokenizer at `path`, special tokens included (as the
/// plan counts them).
fn ids(tk: &tokenizers::Tokenizer, text: &str) -> Vec<u32> {
    tk.encode(text, true).unwrap().get_ids().to_vec()
}

/// `matrix-proxy plan ARGS` to stdout, which must succeed: the plan, parsed; stderr.
fn plan(args: &[&str]) -> (Value, String) {
    let (code, p, err) = plan_cmd(args);
    assert_eq!(code, Some(0), "{err}");
    (p, err)
}

fn variants(p: &Value) -> Vec<Value> {
    p["cases"][0]["variants"].as_array().unwrap().clone()
}

#[test]
fn synthetic_prompts_count_exactly_under_the_tokenizer() {
    let tmp = tempfile::tempdir().unwrap();
    let path = test_tokenizer(tmp.path());
    let tk = tokenizers::Tokenizer::from_file(&path).unwrap();
    let base = [
        "synthetic",
        "--tokenizer",
        s(&path),
        "--output-tokens",
        "8",
        "--endpoint",
        "http://127.0.0.1:9",
        "--model",
        "m",
    ];
    let with = |extra: &[&str]| {
        let (code, p, err) = plan_with(&base, extra);
        assert_eq!(code, Some(0), "{err}");
        (p, err)
    };

    let (p, err) = with(&[
        "--input-tokens",
        "64",
        "--count",
        "20",
        "--ignore-eos",
        "--min-tokens",
    ]);
    assert!(err.contains("20 prompts of 64 input tokens"), "{err}");
    assert_eq!(p["endpoint"], json!("http://127.0.0.1:9/v1/completions"));
    let vs = variants(&p);
    assert_eq!(vs.len(), 20);
    let mut texts = HashSet::new();
    for v in &vs {
        let text = v["request"]["prompt"].as_str().unwrap();
        assert_eq!(ids(&tk, text).len(), 64, "{text:?}");
        assert_eq!(v["prompt_tokens"], json!(64));
        assert_eq!(v["request"]["max_tokens"], json!(8));
        assert_eq!(v["request"]["min_tokens"], json!(8));
        assert_eq!(v["request"]["ignore_eos"], json!(true));
        assert_eq!(v["request"]["temperature"], json!(0.0));
        texts.insert(text.to_string());
    }
    assert_eq!(texts.len(), 20, "no two prompts alike");
    // The same seed gives the same plan; another seed another.
    assert_eq!(
        with(&[
            "--input-tokens",
            "64",
            "--count",
            "20",
            "--ignore-eos",
            "--min-tokens"
        ])
        .0,
        p
    );
    let other = with(&["--input-tokens", "64", "--count", "20", "--seed", "9"]).0;
    assert_ne!(
        variants(&other)[0]["request"]["prompt"],
        vs[0]["request"]["prompt"]
    );

    // A spread of lengths: each prompt's recorded count is its exact count.
    let (p, _) = with(&[
        "--input-tokens",
        "80",
        "--input-stddev",
        "20",
        "--count",
        "30",
    ]);
    let lens: HashSet<u64> = variants(&p)
        .iter()
        .map(|v| {
            let n = ids(&tk, v["request"]["prompt"].as_str().unwrap()).len() as u64;
            assert_eq!(v["prompt_tokens"], json!(n));
            n
        })
        .collect();
    assert!(lens.len() > 5, "{lens:?}");

    // Cache busting: every prompt starts with its own first four tokens.
    let (p, _) = with(&["--input-tokens", "48", "--count", "50", "--cache-bust"]);
    let heads: HashSet<Vec<u32>> = variants(&p)
        .iter()
        .map(|v| {
            let ids = ids(&tk, v["request"]["prompt"].as_str().unwrap());
            assert_eq!(ids.len(), 48);
            ids[..4].to_vec()
        })
        .collect();
    assert_eq!(heads.len(), 50, "{heads:?}");

    // Shared prefixes: the prompts of a group share exactly their first P tokens.
    let (p, _) = with(&[
        "--input-tokens",
        "96",
        "--count",
        "9",
        "--shared-prefix-tokens",
        "32",
        "--prefix-groups",
        "3",
        "--api",
        "chat",
        "--stream",
    ]);
    assert_eq!(
        p["endpoint"],
        json!("http://127.0.0.1:9/v1/chat/completions")
    );
    let all: Vec<Vec<u32>> = variants(&p)
        .iter()
        .map(|v| {
            assert_eq!(v["request"]["stream"], json!(true));
            let text = v["request"]["messages"][0]["content"].as_str().unwrap();
            let t = ids(&tk, text);
            assert_eq!(t.len(), 96);
            t
        })
        .collect();
    for (i, a) in all.iter().enumerate() {
        for (j, b) in all.iter().enumerate().skip(i + 1) {
            if i % 3 == j % 3 {
                assert_eq!(a[..32], b[..32], "prompts {i} and {j} share a prefix");
            } else {
                assert_ne!(
                    a[..32],
                    b[..32],
                    "prompts {i} and {j} are in different groups"
                );
            }
        }
    }

    // Refusals say why.
    let (code, _, err) = run(&[
        "plan",
        "synthetic",
        "--tokenizer",
        "no/such/tokenizer.json",
        "--input-tokens",
        "8",
        "--output-tokens",
        "1",
        "--count",
        "1",
        "--endpoint",
        "http://h:1",
    ]);
    assert_eq!(code, Some(2));
    assert!(
        err.contains("no/such/tokenizer.json: cannot read the tokenizer"),
        "{err}"
    );
    let (code, _, err) = run(&[
        "plan",
        "synthetic",
        "--tokenizer",
        s(&path),
        "--input-tokens",
        "8",
        "--output-tokens",
        "1",
        "--count",
        "1",
        "--endpoint",
        "http://h:1",
        "--shared-prefix-tokens",
        "8",
    ]);
    assert_eq!(code, Some(2));
    assert!(
        err.contains("--shared-prefix-tokens 8 must be below --input-tokens 8"),
        "{err}"
    );
}

#[test]
fn every_jsonl_format_becomes_a_capture_plan_and_bad_lines_are_named() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let chat = write_lines(d, "chat.jsonl", &[
        json!({"messages": [{"role": "user", "content": "hi"}], "out": 3}).to_string(),
        json!({"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "why"}], "out": 5}).to_string(),
    ]);
    let (p, err) = plan(&[
        "from-jsonl",
        s(&chat),
        "--endpoint",
        "http://127.0.0.1:9",
        "--model",
        "m",
        "--output-len-from",
        "out",
        "--stream",
    ]);
    assert!(
        err.contains("2 prompts (chat format, detected) of 2 good lines"),
        "{err}"
    );
    assert_eq!(
        p["endpoint"],
        json!("http://127.0.0.1:9/v1/chat/completions")
    );
    let vs = variants(&p);
    assert_eq!(vs[1]["name"], json!("line-2"));
    assert_eq!(
        vs[1]["request"],
        json!({"model": "m", "messages": [{"role": "system", "content": "be brief"},
        {"role": "user", "content": "why"}], "max_tokens": 5, "temperature": 0.0, "stream": true,
        "stream_options": {"include_usage": true}})
    );
    assert_eq!(
        p["requests_per_case"],
        json!(2),
        "one pass over the prompts per round"
    );
    assert!(
        !err.contains("no --max-tokens"),
        "--output-len-from bounds them: {err}"
    );
    let mut written = vec![p.clone()];

    let completion = write_lines(
        d,
        "prompts.jsonl",
        &[json!({"prompt": "once upon"}).to_string()],
    );
    let (p, err) = plan(&[
        "from-jsonl",
        s(&completion),
        "--endpoint",
        "http://127.0.0.1:9",
        "--model",
        "m",
        "--max-tokens",
        "4",
    ]);
    assert!(!err.contains("no --max-tokens"), "{err}");
    assert_eq!(p["endpoint"], json!("http://127.0.0.1:9/v1/completions"));
    assert_eq!(
        variants(&p)[0]["request"],
        json!({"model": "m", "prompt": "once upon", "max_tokens": 4, "temperature": 0.0})
    );
    written.push(p.clone());

    let sharegpt = write_lines(
        d,
        "sharegpt.jsonl",
        &[json!({"id": "x", "conversations": [
        {"from": "system", "value": "sys"}, {"from": "human", "value": "first question"},
        {"from": "gpt", "value": "an answer"}, {"from": "human", "value": "second"}]})
        .to_string()],
    );
    let (p, err) = plan(&[
        "from-jsonl",
        s(&sharegpt),
        "--endpoint",
        "http://127.0.0.1:9",
        "--model",
        "m",
    ]);
    assert!(err.contains("(sharegpt format, detected)"), "{err}");
    assert_eq!(
        variants(&p)[0]["request"]["messages"],
        json!([{"role": "user", "content": "first question"}])
    );
    // No --max-tokens: unbounded answers cannot be frozen or their decode compared.
    assert_eq!(variants(&p)[0]["request"].get("max_tokens"), None);
    assert!(
        err.contains("matrix-proxy: warning: no --max-tokens: the requests ask for no max_tokens"),
        "{err}"
    );
    written.push(p.clone());

    let raw = write_lines(
        d,
        "raw.jsonl",
        &[json!({"request": {"model": "r", "input": "embed me"}}).to_string()],
    );
    let (code, _, err) = run(&[
        "plan",
        "from-jsonl",
        s(&raw),
        "--endpoint",
        "http://127.0.0.1:9",
    ]);
    assert_eq!(code, Some(2), "raw bodies need the endpoint's path");
    assert!(err.contains("give it with its path"), "{err}");
    let (p, _) = plan(&[
        "from-jsonl",
        s(&raw),
        "--endpoint",
        "http://127.0.0.1:9/v1/embeddings",
    ]);
    assert_eq!(
        variants(&p)[0]["request"],
        json!({"model": "r", "input": "embed me"})
    );
    assert_eq!(p["endpoint"], json!("http://127.0.0.1:9/v1/embeddings"));

    // Every plan above validates as written.
    for (i, plan) in written.iter().chain([&p]).enumerate() {
        let path = write_plan(d, &format!("p{i}.json"), plan);
        let (code, _, err) = run(&["validate", s(&path)]);
        assert_eq!(code, Some(0), "{err}");
        assert!(err.contains("capture plan"), "{err}");
    }

    // A bad line is refused with its number and reason; --skip-bad counts it.
    let bad = write_lines(
        d,
        "bad.jsonl",
        &[
            json!({"prompt": "a"}).to_string(),
            "{not json".into(),
            json!({"messages": [{"role": "user", "content": "x"}]}).to_string(),
            json!({"prompt": ""}).to_string(),
            json!({"prompt": "b"}).to_string(),
        ],
    );
    let (code, _, err) = run(&[
        "plan",
        "from-jsonl",
        s(&bad),
        "--endpoint",
        "http://h:1",
        "--model",
        "m",
    ]);
    assert_eq!(code, Some(2));
    assert!(err.contains("bad.jsonl:2: not valid JSON"), "{err}");
    let (p, err) = plan(&[
        "from-jsonl",
        s(&bad),
        "--endpoint",
        "http://h:1",
        "--model",
        "m",
        "--skip-bad",
    ]);
    assert!(err.contains("skipped 3 bad line(s)"), "{err}");
    assert!(
        err.contains(
            "line 3: has no prompt: the file is read as completion (it looks like a chat line)"
        ),
        "{err}"
    );
    assert!(
        err.contains("line 4: prompt must be a non-empty string"),
        "{err}"
    );
    let names: Vec<Value> = variants(&p).iter().map(|v| v["name"].clone()).collect();
    assert_eq!(names, [json!("line-1"), json!("line-5")]);

    // The format is detected from the first good line, not from a bad one skipped.
    let late = write_lines(
        d,
        "late.jsonl",
        &[
            json!({"messages": []}).to_string(),
            json!({"prompt": "a"}).to_string(),
        ],
    );
    let (p, err) = plan(&[
        "from-jsonl",
        s(&late),
        "--endpoint",
        "http://h:1",
        "--model",
        "m",
        "--skip-bad",
    ]);
    assert!(err.contains("(completion format, detected)"), "{err}");
    assert_eq!(variants(&p).len(), 1);
    // Raw request lines are sent as they are: no length from a field.
    let (code, _, err) = run(&[
        "plan",
        "from-jsonl",
        s(&raw),
        "--endpoint",
        "http://h:1/v1/x",
        "--output-len-from",
        "n",
    ]);
    assert_eq!(code, Some(2));
    assert!(
        err.contains("--output-len-from does not apply to raw request lines"),
        "{err}"
    );
}

#[test]
fn a_file_that_is_one_json_array_is_read_item_by_item() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    // As ShareGPT_V3 is distributed: one array, pretty-printed, after a byte order mark;
    // strings hold the array's own punctuation, quotes and backslashes.
    let items = json!([
        {"id": "a", "conversations": [
            {"from": "human", "value": "first, [with] {brackets} and \"quotes\" \\ ,"},
            {"from": "gpt", "value": "x"}]},
        {"id": "b", "conversations": [{"from": "human", "value": "second \\"}]},
        {"id": "c", "conversations": [{"from": "human", "value": "third ]"}]},
    ]);
    let human = |i: usize| items[i]["conversations"][0]["value"].clone();
    let mut bytes = b"\xEF\xBB\xBF  \n".to_vec();
    bytes.extend(serde_json::to_vec_pretty(&items).unwrap());
    bytes.extend(b"\n");
    let path = d.join("sharegpt.json");
    std::fs::write(&path, &bytes).unwrap();
    let base = [
        "from-jsonl",
        s(&path),
        "--endpoint",
        "http://127.0.0.1:9",
        "--model",
        "m",
        "--max-tokens",
        "8",
    ];
    let (p, err) = plan(&base);
    assert!(
        err.contains("3 prompts (sharegpt format, detected) of 3 good items"),
        "{err}"
    );
    assert!(
        err.contains("starts with '[': read as one JSON array of objects"),
        "{err}"
    );
    let vs = variants(&p);
    let names: Vec<&str> = vs.iter().map(|v| v["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["item-1", "item-2", "item-3"]);
    for (i, v) in vs.iter().enumerate() {
        assert_eq!(
            v["request"]["messages"],
            json!([{"role": "user", "content": human(i)}])
        );
    }
    // A seeded sample reads the chosen items again, by their offsets.
    let mut sample = base.to_vec();
    sample.extend(["--limit", "2", "--seed", "1"]);
    let (p, _) = plan(&sample);
    assert_eq!(variants(&p).len(), 2);
    for v in variants(&p) {
        let n: usize = v["name"].as_str().unwrap()["item-".len()..]
            .parse()
            .unwrap();
        assert_eq!(v["request"]["messages"][0]["content"], human(n - 1));
    }

    // A bad item is named by its number; --skip-bad counts and skips it.
    let bad = d.join("bad.json");
    std::fs::write(&bad, r#"[{"prompt": "a"}, 5, {"prompt": "b"}]"#).unwrap();
    let flags = [
        "--endpoint",
        "http://h:1",
        "--model",
        "m",
        "--max-tokens",
        "4",
    ];
    let mut args = vec!["plan", "from-jsonl", s(&bad)];
    args.extend(flags);
    let (code, _, err) = run(&args);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains(
            "bad.json: item 2: not a JSON object (--skip-bad counts and skips bad items instead)"
        ),
        "{err}"
    );
    args.push("--skip-bad");
    let (p, err) = plan(&args[1..]);
    assert!(
        err.contains("skipped 1 bad item(s) (--skip-bad): item 2: not a JSON object"),
        "{err}"
    );
    let names: Vec<Value> = variants(&p).iter().map(|v| v["name"].clone()).collect();
    assert_eq!(names, [json!("item-1"), json!("item-3")]);

    // An array cut short, with a stray comma or with data after it is refused.
    for (text, says) in [
        (
            r#"[{"prompt": "a"}, {"prompt": "#,
            "the file ends before the array's closing ']'",
        ),
        (r#"[{"prompt": "a"},]"#, "item 2 is empty (a stray ',')"),
        (
            r#"[{"prompt": "a"}] x"#,
            "data after the array's closing ']'",
        ),
    ] {
        std::fs::write(&bad, text).unwrap();
        let (code, _, err) = run(&args);
        assert_eq!(code, Some(2), "{text}: {err}");
        assert!(
            err.contains(&format!("bad.json: not a JSON array of objects: {says}")),
            "{text}: {err}"
        );
    }
}

#[test]
fn a_seeded_sample_is_the_same_every_time() {
    let tmp = tempfile::tempdir().unwrap();
    let lines: Vec<String> = (0..500)
        .map(|i| json!({"prompt": format!("p{i}")}).to_string())
        .collect();
    let file = write_lines(tmp.path(), "many.jsonl", &lines);
    let sample = |seed: &str| {
        let (p, _) = plan(&[
            "from-jsonl",
            s(&file),
            "--endpoint",
            "http://h:1",
            "--model",
            "m",
            "--limit",
            "10",
            "--seed",
            seed,
        ]);
        variants(&p)
            .iter()
            .map(|v| v["name"].as_str().unwrap().to_string())
            .collect::<Vec<_>>()
    };
    let a = sample("7");
    assert_eq!(a.len(), 10);
    assert_eq!(a, sample("7"));
    assert_ne!(a, sample("8"));
    // Pinned: ChaCha8 gives these lines on every platform.
    assert_eq!(
        a,
        [
            "line-51", "line-136", "line-218", "line-228", "line-254", "line-429", "line-435",
            "line-449", "line-464", "line-481"
        ]
    );
    let (p, _) = plan(&[
        "from-jsonl",
        s(&file),
        "--endpoint",
        "http://h:1",
        "--model",
        "m",
        "--limit",
        "3",
    ]);
    let first: Vec<Value> = variants(&p).iter().map(|v| v["name"].clone()).collect();
    assert_eq!(first, [json!("line-1"), json!("line-2"), json!("line-3")]);
}

#[test]
fn a_dataset_is_captured_frozen_and_replayed_green() {
    let tmp = tempfile::tempdir().unwrap();
    let path = test_tokenizer(tmp.path());
    let lines: Vec<String> = ["the river", "a small workshop", "weather on the mountain"]
        .iter()
        .map(|p| json!({"prompt": p}).to_string())
        .collect();
    let file = write_lines(tmp.path(), "d.jsonl", &lines);
    let capture = tmp.path().join("capture.json");
    let (code, _, err) = run(&[
        "plan",
        "from-jsonl",
        s(&file),
        "--endpoint",
        "http://127.0.0.1:9",
        "--model",
        "mock",
        "--max-tokens",
        "5",
        "--tokenizer",
        s(&path),
        "--out",
        s(&capture),
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("the plan sends"), "{err}");
    let counted = read_json(&capture);
    let tk = tokenizers::Tokenizer::from_file(&path).unwrap();
    assert_eq!(
        variants(&counted)[0]["prompt_tokens"],
        json!(ids(&tk, "the river").len())
    );
    let run_dir = tmp.path().join("run");
    let (code, _, err) = run(&[
        "replay",
        "-q",
        s(&capture),
        "--mock-worker",
        "--out",
        s(&run_dir),
    ]);
    assert_eq!(code, Some(0), "{err}");
    // The plan's counts (this tokenizer's) against the mock's usage (its own count):
    // every answered request compared, the same again when summarize rebuilds.
    let summary = read_json(&run_dir.join("summary.json"));
    let m = summary["prompt_tokens_mismatch"].clone();
    let rows = summary["rows_written"].as_u64().unwrap();
    assert_eq!(
        m["compared"],
        json!(rows - 1),
        "every row but the health check: {m}"
    );
    assert_eq!(m["differing"], m["compared"], "{m}");
    assert!(m["max_abs_diff"].as_u64().unwrap() > 0, "{m}");
    let (code, _) = summarize(&run_dir);
    assert_eq!(code, Some(0));
    assert_eq!(
        read_json(&run_dir.join("summary.json"))["prompt_tokens_mismatch"],
        m
    );
    let planned = Rows::read(&run_dir).i64s("prompt_tokens_planned");
    assert_eq!(
        planned.iter().filter(|p| p.is_some()).count() as u64,
        rows - 1
    );
    let frozen = tmp.path().join("frozen.json");
    let (code, _, err) = run(&["freeze", s(&run_dir), "--out", s(&frozen)]);
    assert_eq!(code, Some(0), "{err}");
    let again = tmp.path().join("again");
    let (code, _, err) = run(&[
        "replay",
        "-q",
        s(&frozen),
        "--mock-worker",
        "--out",
        s(&again),
    ]);
    assert_eq!(code, Some(0), "{err}");
    let summary = read_json(&again.join("summary.json"));
    assert_eq!(summary["cases"][0]["judged"], json!("oracle"));
    // The counts carried through freeze: the frozen plan compares them too.
    let p = read_json(&frozen);
    let carried: Vec<Value> = p["cases"][0]["variants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["prompt_tokens"].clone())
        .collect();
    let counted: Vec<Value> = variants(&counted)
        .iter()
        .map(|v| v["prompt_tokens"].clone())
        .collect();
    assert_eq!(carried, counted);
    // The variants keep the capture plan's names (the dataset's lines).
    let names: Vec<&Value> = p["cases"][0]["variants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| &v["name"])
        .collect();
    assert_eq!(
        names,
        [&json!("line-1"), &json!("line-2"), &json!("line-3")]
    );
    let again_m = &summary["prompt_tokens_mismatch"];
    assert_eq!(again_m["differing"], again_m["compared"], "{again_m}");
    assert_eq!(again_m["max_abs_diff"], m["max_abs_diff"], "{again_m}");
    // The frozen budget measures every prompt: 3 prompts at levels up to 4 (freeze's
    // default 1,4) need 6 requests a round; the replay measured all 3.
    assert_eq!(p["requests_per_case"], json!(6));
    let measured = Rows::read(&again);
    let mut seen: Vec<String> = (0..measured.len())
        .filter(|&i| measured.strs("phase")[i].as_deref() == Some("measured"))
        .filter_map(|i| measured.strs("variant")[i].clone())
        .collect();
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), 3, "{seen:?}");
    // A budget that cannot reach every prompt is said by freeze and by validate.
    let short = tmp.path().join("short.json");
    let (code, _, err) = run(&[
        "freeze",
        s(&run_dir),
        "--requests-per-case",
        "2",
        "--concurrency",
        "1",
        "--out",
        s(&short),
    ]);
    assert_eq!(code, Some(0), "{err}");
    let warning = "has 3 variants but a measured round sends 2 requests: variants 3 to 3 are sent only in readiness and warm-up, never measured";
    assert!(err.contains(warning), "{err}");
    let (code, _, err) = run(&["validate", s(&short)]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains(warning) && err.contains("set requests_per_case to 3"),
        "{err}"
    );
    // plan from-jsonl: one pass over the prompts, or its smallest multiple that fills
    // the highest level.
    let (code, stdout, err) = run(&[
        "plan",
        "from-jsonl",
        s(&file),
        "--endpoint",
        "http://127.0.0.1:9",
        "--max-tokens",
        "5",
        "--concurrency",
        "1,4",
    ]);
    assert_eq!(code, Some(0), "{err}");
    let p: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(p["requests_per_case"], json!(6));
}

#[test]
fn synthetic_takes_the_api_from_the_endpoint_and_refuses_what_it_cannot_do() {
    let tmp = tempfile::tempdir().unwrap();
    let path = test_tokenizer(tmp.path());
    let base = |endpoint: &str, extra: &[&str]| {
        let mut a = vec![
            "plan",
            "synthetic",
            "--tokenizer",
            s(&path),
            "--input-tokens",
            "16",
            "--output-tokens",
            "2",
            "--count",
            "2",
            "--endpoint",
        ];
        a.push(endpoint);
        a.extend(extra);
        a.iter().map(|x| x.to_string()).collect::<Vec<String>>()
    };
    fn args(v: &[String]) -> Vec<&str> {
        v.iter().map(String::as_str).collect()
    }
    // A chat endpoint without --api: chat messages, not a completion prompt.
    let a = base("http://127.0.0.1:9/v1/chat/completions", &[]);
    let (p, _) = plan(&args(&a)[1..]);
    let v = &variants(&p)[0]["request"];
    assert!(
        v["messages"][0]["content"].is_string() && v["prompt"].is_null(),
        "{v}"
    );
    // A completions endpoint, and an origin, keep completions.
    for e in ["http://127.0.0.1:9/v1/completions", "http://127.0.0.1:9"] {
        let a = base(e, &[]);
        let (p, _) = plan(&args(&a)[1..]);
        assert!(variants(&p)[0]["request"]["prompt"].is_string(), "{e}");
    }
    // --api against the endpoint's path is refused, naming both.
    let a = base(
        "http://127.0.0.1:9/v1/chat/completions",
        &["--api", "completions"],
    );
    let (code, _, err) = run(&args(&a));
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("--api completions does not match --endpoint http://127.0.0.1:9/v1/chat/completions, a path of the chat API"),
        "{err}"
    );
    // A spread wider than the lengths themselves is refused, naming the flag and the range.
    for spread in ["1e300", "17", "-1", "NaN"] {
        let flag = format!("--input-stddev={spread}");
        let a = base("http://127.0.0.1:9", &[&flag]);
        let (code, _, err) = run(&args(&a));
        assert_eq!(code, Some(2), "{spread}: {err}");
        assert!(
            err.contains(&format!("--input-stddev {spread} is out of range"))
                && err.contains("from 0 to --input-tokens (16)"),
            "{spread}: {err}"
        );
    }
}

/// A word-level tokenizer.json over the corpus's words and punctuation, with no digit in
/// its vocabulary (numbers are its unknown token), written to `dir`.
fn word_tokenizer(dir: &Path) -> PathBuf {
    let corpus = include_str!("../../src/dataset/corpus.txt");
    let mut vocab = serde_json::Map::new();
    vocab.insert("[UNK]".into(), json!(0));
    let mut piece = String::new();
    let add = |p: &mut String, vocab: &mut serde_json::Map<String, Value>| {
        if !p.is_empty() && !p.chars().any(|c| c.is_ascii_digit()) && !vocab.contains_key(p) {
            let id = vocab.len();
            vocab.insert(p.clone(), json!(id));
        }
        p.clear();
    };
    let mut word = None;
    for c in corpus.chars() {
        let is_word = c.is_alphanumeric() || c == '_';
        if c.is_whitespace() || word.is_some_and(|w| w != is_word) {
            add(&mut piece, &mut vocab);
        }
        word = (!c.is_whitespace()).then_some(is_word);
        if !c.is_whitespace() {
            piece.push(c);
        }
    }
    add(&mut piece, &mut vocab);
    let tokenizer = json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [{"id": 0, "content": "[UNK]", "single_word": false, "lstrip": false,
                          "rstrip": false, "normalized": false, "special": true}],
        "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null,
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"}
    });
    let path = dir.join("words.json");
    std::fs::write(&path, tokenizer.to_string()).unwrap();
    path
}

/// Cache-bust tags differ as tokens, not only as text: under a vocabulary without hex
/// digits, 40 prompts have 40 distinct first-four-token heads (hex tags once gave 22).
#[test]
fn synthetic_names_a_vocabulary_that_does_not_cover_the_corpus_and_its_help_has_its_own_flags() {
    let tmp = tempfile::tempdir().unwrap();
    // A word-level vocabulary of one English word: the corpus is almost all [UNK].
    let tokenizer = json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [{"id": 0, "content": "[UNK]", "single_word": false, "lstrip": false,
                          "rstrip": false, "normalized": false, "special": true}],
        "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null,
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": {"[UNK]": 0, "the": 1}, "unk_token": "[UNK]"}
    });
    let path = tmp.path().join("unk.json");
    std::fs::write(&path, tokenizer.to_string()).unwrap();
    let (code, _, err) = run(&[
        "plan",
        "synthetic",
        "--tokenizer",
        s(&path),
        "--input-tokens",
        "16",
        "--output-tokens",
        "2",
        "--count",
        "1",
        "--endpoint",
        "http://127.0.0.1:9",
    ]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("cannot make prompt 1 of exactly 16 tokens under this tokenizer"),
        "{err}"
    );
    assert!(
        err.contains(
            "% of the embedded corpus (English prose) encodes to its unknown token \"[UNK]\""
        ),
        "{err}"
    );
    assert!(
        err.contains("the vocabulary does not cover the corpus; give the tokenizer.json of the model the plan is for"),
        "{err}"
    );
    assert!(!err.contains("merges keep changing the count"), "{err}");

    // Each command's help names its own flags: --output-len-from is from-jsonl's.
    let help = |cmd: &str| run(&["plan", cmd, "--help"]);
    let (code, synthetic, _) = help("synthetic");
    assert_eq!(code, Some(0));
    assert!(!synthetic.contains("--output-len-from"), "{synthetic}");
    assert!(synthetic.contains("--output-tokens"), "{synthetic}");
    let (code, from_jsonl, _) = help("from-jsonl");
    assert_eq!(code, Some(0));
    assert!(from_jsonl.contains("--output-len-from"), "{from_jsonl}");
}

#[test]
fn cache_bust_tags_differ_in_their_first_tokens_under_any_vocabulary() {
    let tmp = tempfile::tempdir().unwrap();
    let path = word_tokenizer(tmp.path());
    let tk = tokenizers::Tokenizer::from_file(&path).unwrap();
    let (p, _) = plan(&[
        "synthetic",
        "--tokenizer",
        s(&path),
        "--input-tokens",
        "40",
        "--output-tokens",
        "8",
        "--count",
        "40",
        "--cache-bust",
        "--endpoint",
        "http://127.0.0.1:9/v1/completions",
    ]);
    let heads: HashSet<Vec<u32>> = variants(&p)
        .iter()
        .map(|v| {
            let ids = ids(&tk, v["request"]["prompt"].as_str().unwrap());
            assert!(!ids[..4].contains(&0), "an unknown token in a tag: {ids:?}");
            ids[..4].to_vec()
        })
        .collect();
    assert_eq!(heads.len(), 40, "{heads:?}");
}
