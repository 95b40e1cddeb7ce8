//! Sessions from what users have: `plan from-jsonl --turns all` reads every turn of
//! ShareGPT conversations and OpenAI chat transcripts as sessions (their answers the
//! frozen history), `plan synthetic --turns N --turn-input-tokens M` makes sessions of
//! exact-token turns; each plan validates and replays against the mock with every turn
//! recorded as its own row, sent with the history the plan holds, and under the mock's
//! prefix cache the later turns of a session find its earlier ones (prefix reuse seen).

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use serde_json::{Value, json};

use crate::support::*;

fn msg(role: &str, text: &str) -> Value {
    json!({"role": role, "content": text})
}

use crate::support::plan_cmd as plan;

/// Each session's id and its turns' (messages, answer).
fn sessions(p: &Value) -> Vec<(String, Vec<(Value, Value)>)> {
    p["cases"][0]["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let turns = s["turns"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| (t["messages"].clone(), t["answer"].clone()))
                .collect();
            (s["id"].as_str().unwrap().to_string(), turns)
        })
        .collect()
}

/// The measured rows of a run: (session id, turn) -> the request bodies sent for it.
fn measured(run: &Path) -> BTreeMap<(String, i32), Vec<Value>> {
    let rows = Rows::read(run);
    let (phase, session, turn) = (
        rows.strs("phase"),
        rows.strs("session_id"),
        rows.i32s("turn"),
    );
    let (bodies, outcome) = (rows.bins("request_body"), rows.strs("outcome"));
    let mut out: BTreeMap<(String, i32), Vec<Value>> = BTreeMap::new();
    for i in (0..rows.len()).filter(|&i| phase[i].as_deref() == Some("measured")) {
        assert_eq!(outcome[i].as_deref(), Some("ok"), "row {i}");
        let key = (session[i].clone().unwrap(), turn[i].unwrap());
        out.entry(key)
            .or_default()
            .push(serde_json::from_slice(&bodies[i]).unwrap());
    }
    out
}

/// The plan written to `dir/NAME`, validated and replayed against the mock worker
/// (with `flags`).
fn replay(dir: &Path, name: &str, p: &Value, flags: &[&str]) -> std::path::PathBuf {
    let file = dir.join(format!("{name}.json"));
    std::fs::write(&file, serde_json::to_vec_pretty(p).unwrap()).unwrap();
    let (code, _, err) = run(&["validate", s(&file)]);
    assert_eq!(code, Some(0), "{err}");
    let out = dir.join(name);
    let mut args = vec!["replay", "-q", s(&file), "--mock-worker", "--out", s(&out)];
    args.extend(flags);
    let (code, _, err) = run(&args);
    assert_eq!(code, Some(0), "{err}");
    out
}

/// The messages turn `k` (from 0) of a session is sent with: the template has none, so
/// every earlier turn's messages and answer, then its own.
fn history(turns: &[(Value, Value)], k: usize) -> Value {
    let mut m = Vec::new();
    for (messages, answer) in &turns[..k] {
        m.extend(messages.as_array().unwrap().iter().cloned());
        m.push(answer.clone());
    }
    m.extend(turns[k].0.as_array().unwrap().iter().cloned());
    Value::Array(m)
}

#[test]
fn every_turn_of_sharegpt_and_chat_conversations_becomes_a_session() {
    let tmp = tempfile::tempdir().unwrap();
    let turn = |from: &str, value: &str| json!({"from": from, "value": value});
    let sharegpt = [
        json!({"id": "x", "conversations": [
            turn("system", "Be brief."),
            turn("human", "Where is Lyon?"), turn("gpt", "In France."),
            turn("human", "Its river?"), turn("gpt", "The Rhone."),
            turn("human", "And the other?"), turn("gpt", "The Saone.")]}),
        json!({"conversations": [
            turn("human", "Name a prime."), turn("gpt", "Seven."),
            turn("human", "A larger one?")]}),
    ];
    let chat = [
        json!({"messages": [
            msg("system", "Be brief."),
            msg("user", "Where is Lyon?"), msg("assistant", "In France."),
            msg("user", "Its river?"), msg("assistant", "The Rhone."),
            msg("user", "And the other?"), msg("assistant", "The Saone.")]}),
        json!({"messages": [
            msg("user", "Name a prime."), msg("assistant", "Seven."),
            msg("user", "A larger one?")]}),
    ];
    let want = vec![
        (
            "line-1".to_string(),
            vec![
                (
                    json!([msg("system", "Be brief."), msg("user", "Where is Lyon?")]),
                    msg("assistant", "In France."),
                ),
                (
                    json!([msg("user", "Its river?")]),
                    msg("assistant", "The Rhone."),
                ),
                (
                    json!([msg("user", "And the other?")]),
                    msg("assistant", "The Saone."),
                ),
            ],
        ),
        (
            "line-2".to_string(),
            vec![
                (
                    json!([msg("user", "Name a prime.")]),
                    msg("assistant", "Seven."),
                ),
                (json!([msg("user", "A larger one?")]), Value::Null),
            ],
        ),
    ];
    for (name, lines) in [("sharegpt", &sharegpt), ("chat", &chat)] {
        let text: Vec<String> = lines.iter().map(Value::to_string).collect();
        let file = write_lines(tmp.path(), &format!("{name}.jsonl"), &text);
        let base = [
            "from-jsonl",
            s(&file),
            "--endpoint",
            "http://127.0.0.1:9",
            "--model",
            "mock",
            "--max-tokens",
            "5",
        ];
        let with = |extra: &[&str]| plan_with(&base, extra);
        let (code, p, err) = with(&["--turns", "all"]);
        assert_eq!(code, Some(0), "{err}");
        assert!(err.contains("2 sessions of 5 turns"), "{err}");
        assert!(err.contains("per session, all its turns"), "{err}");
        assert_eq!(sessions(&p), want, "{name}");
        let case = &p["cases"][0];
        assert_eq!(case["history"], json!("frozen"));
        let template = serde_json::to_string(&case["request"]).unwrap();
        assert_eq!(
            template, r#"{"model":"mock","max_tokens":5,"temperature":0.0}"#,
            "the template is today's request without its messages, in its order"
        );
        assert!(case.get("variants").is_none());
        assert_eq!(
            p["endpoint"],
            json!("http://127.0.0.1:9/v1/chat/completions")
        );
        assert_eq!(
            p["requests_per_case"],
            json!(2),
            "a round runs every session"
        );
        // --max-turns keeps each conversation's first turns.
        let (code, cut, err) = with(&["--turns", "all", "--max-turns", "2"]);
        assert_eq!(code, Some(0), "{err}");
        let lens: Vec<usize> = sessions(&cut).iter().map(|(_, t)| t.len()).collect();
        assert_eq!(lens, [2, 2]);
        assert_eq!(sessions(&cut)[0].1[..], want[0].1[..2]);
        // A seeded sample picks whole conversations.
        let (code, one, err) = with(&["--turns", "all", "--limit", "1", "--seed", "3"]);
        assert_eq!(code, Some(0), "{err}");
        let picked = sessions(&one);
        assert_eq!(picked.len(), 1);
        assert!(want.contains(&picked[0]), "{picked:?}");
        // --history live: the same sessions, sent with the server's own answers.
        let (code, live, err) = with(&["--turns", "all", "--history", "live"]);
        assert_eq!(code, Some(0), "{err}");
        assert_eq!(live["cases"][0]["history"], json!("live"));
        assert_eq!(sessions(&live), want);
        // --turns first (the default) is today's reading: one request a line.
        let (code, first, err) = with(&[]);
        assert_eq!(code, Some(0), "{err}");
        assert_eq!(first, with(&["--turns", "first"]).1);
        let sent = &first["cases"][0]["variants"][1]["request"]["messages"];
        match name {
            "sharegpt" => assert_eq!(sent, &json!([msg("user", "Name a prime.")])),
            _ => assert_eq!(sent, &chat[1]["messages"]),
        }
        assert!(first["cases"][0].get("sessions").is_none());
        // The plan replays: every turn of every session a measured row, sent with the
        // transcript's answers as its history.
        let run_dir = replay(tmp.path(), name, &p, &[]);
        let rows = measured(&run_dir);
        let mut keys: Vec<(String, i32)> = rows.keys().cloned().collect();
        keys.sort();
        let expected: Vec<(String, i32)> = want
            .iter()
            .flat_map(|(id, t)| (1..=t.len() as i32).map(move |k| (id.clone(), k)))
            .collect();
        assert_eq!(keys, expected);
        for (id, turns) in &want {
            for k in 0..turns.len() {
                let bodies = &rows[&(id.clone(), k as i32 + 1)];
                // Two repetitions, each running both sessions once.
                assert_eq!(bodies.len(), 2, "{id}/{}", k + 1);
                for b in bodies {
                    assert_eq!(b["messages"], history(turns, k), "{id}/{}", k + 1);
                    assert_eq!(b["max_tokens"], json!(5));
                }
            }
        }
    }
    // What applies only to --turns all, or not to it, is refused with the fix.
    let file = tmp.path().join("sharegpt.jsonl");
    for (extra, says) in [
        (
            vec!["--max-turns", "2"],
            "--max-turns and --history go with --turns all",
        ),
        (
            vec!["--turns", "all", "--max-turns", "0"],
            "--max-turns must be from 1 to 1024",
        ),
        (
            vec!["--turns", "all", "--output-len-from", "n"],
            "--output-len-from sets one line's max_tokens",
        ),
    ] {
        let mut a = vec!["from-jsonl", s(&file), "--endpoint", "http://127.0.0.1:9"];
        a.extend(extra);
        let (code, _, err) = plan(&a);
        assert_eq!(code, Some(2), "{err}");
        assert!(err.contains(says), "{says} not in {err}");
    }
    let prompts = tmp.path().join("prompts.jsonl");
    std::fs::write(&prompts, json!({"prompt": "hello"}).to_string()).unwrap();
    let (code, _, err) = plan(&[
        "from-jsonl",
        s(&prompts),
        "--endpoint",
        "http://127.0.0.1:9",
        "--turns",
        "all",
    ]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("--turns all reads conversations (chat or sharegpt lines), but the file is read as completion lines"),
        "{err}"
    );
    // A conversation with no user message is a bad line, named (or skipped).
    let bad = tmp.path().join("bad.jsonl");
    let lines = [
        json!({"messages": [msg("user", "hi"), msg("assistant", "hello")]}).to_string(),
        json!({"messages": [msg("assistant", "anyone?")]}).to_string(),
    ];
    std::fs::write(&bad, lines.join("\n")).unwrap();
    let args = [
        "from-jsonl",
        s(&bad),
        "--endpoint",
        "http://127.0.0.1:9",
        "--turns",
        "all",
    ];
    let (code, _, err) = plan(&args);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("bad.jsonl:2: no user message"), "{err}");
    let mut skip = args.to_vec();
    skip.push("--skip-bad");
    let (code, p, err) = plan(&skip);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(sessions(&p).len(), 1);
}

#[test]
fn synthetic_sessions_have_exact_token_turns_and_replay_turn_by_turn() {
    let tmp = tempfile::tempdir().unwrap();
    let path = test_tokenizer(tmp.path());
    let tk = tokenizers::Tokenizer::from_file(&path).unwrap();
    let count = |text: &Value| tk.encode(text.as_str().unwrap(), true).unwrap().len();
    let base = [
        "synthetic",
        "--tokenizer",
        s(&path),
        "--output-tokens",
        "8",
        "--count",
        "3",
        "--endpoint",
        "http://127.0.0.1:9",
        "--model",
        "mock",
        "--turns",
        "3",
    ];
    let with = |extra: &[&str]| plan_with(&base, extra);
    let (code, p, err) = with(&["--turn-input-tokens", "16"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("3 sessions of 3 turns"), "{err}");
    // Sessions are chat: an origin gets the chat path.
    assert_eq!(
        p["endpoint"],
        json!("http://127.0.0.1:9/v1/chat/completions")
    );
    let case = &p["cases"][0];
    assert_eq!(case["history"], json!("frozen"));
    assert_eq!(case["request"]["max_tokens"], json!(8));
    assert!(case["request"].get("messages").is_none());
    let got = sessions(&p);
    let ids: Vec<&str> = got.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(ids, ["session-1", "session-2", "session-3"]);
    let mut texts = HashSet::new();
    for (id, turns) in &got {
        assert_eq!(turns.len(), 3, "{id}");
        for (k, (messages, answer)) in turns.iter().enumerate() {
            let m = messages.as_array().unwrap();
            assert_eq!(m.len(), 1);
            assert_eq!(m[0]["role"], json!("user"));
            assert_eq!(count(&m[0]["content"]), 16, "{id} turn {}", k + 1);
            assert!(texts.insert(m[0]["content"].clone()), "no two texts alike");
            if k < 2 {
                assert_eq!(answer["role"], json!("assistant"));
                assert_eq!(count(&answer["content"]), 8, "{id} answer {}", k + 1);
                assert!(texts.insert(answer["content"].clone()));
            } else {
                assert_eq!(answer, &Value::Null, "the last turn needs no answer");
            }
        }
    }
    // The same seed gives the same plan.
    assert_eq!(with(&["--turn-input-tokens", "16"]).1, p);
    // --input-tokens sets the first turn's length; --history live makes no answers.
    let (code, long_first, err) = with(&[
        "--input-tokens",
        "200",
        "--turn-input-tokens",
        "12",
        "--history",
        "live",
        "--cache-bust",
    ]);
    assert_eq!(code, Some(0), "{err}");
    let case = &long_first["cases"][0];
    assert_eq!(
        (&case["history"], &case["cache_bust"]),
        (&json!("live"), &json!(true))
    );
    for (_, turns) in sessions(&long_first) {
        let lens: Vec<usize> = turns.iter().map(|(m, _)| count(&m[0]["content"])).collect();
        assert_eq!(lens, [200, 12, 12]);
        assert!(turns.iter().all(|(_, a)| a.is_null()));
    }
    // Replayed against the mock's prefix cache: each run's own tag makes turn 1 find
    // nothing, and the later turns find the conversation so far.
    let run_dir = replay(
        tmp.path(),
        "live",
        &long_first,
        &["--mock-prefix-cache-blocks", "4096"],
    );
    let rows = Rows::read(&run_dir);
    let (phase, turn, cached) = (
        rows.strs("phase"),
        rows.i32s("turn"),
        rows.i64s("cached_prompt_tokens"),
    );
    let mut by_turn: BTreeMap<i32, Vec<Option<i64>>> = BTreeMap::new();
    for i in (0..rows.len()).filter(|&i| phase[i].as_deref() == Some("measured")) {
        by_turn.entry(turn[i].unwrap()).or_default().push(cached[i]);
    }
    assert_eq!(by_turn.len(), 3, "{by_turn:?}");
    assert!(by_turn[&1].iter().all(|c| *c == Some(0)), "{by_turn:?}");
    for k in [2, 3] {
        assert!(
            by_turn[&k].iter().all(|c| c.is_some_and(|n| n > 0)),
            "turn {k}: {by_turn:?}"
        );
    }
    // Sessions are chat only; the turn flags go with --turns.
    let (code, _, err) = with(&["--turn-input-tokens", "16", "--api", "completions"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--turns makes chat sessions"), "{err}");
    let (code, _, err) = plan(&[
        "synthetic",
        "--tokenizer",
        s(&path),
        "--output-tokens",
        "8",
        "--count",
        "1",
        "--endpoint",
        "http://127.0.0.1:9",
        "--turn-input-tokens",
        "16",
    ]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--turns"), "{err}");
    let (code, _, err) = with(&["--turn-input-tokens", "1"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("leaves no room"), "{err}");
    // Replayed against the mock: every turn a measured row, sent with the plan's answers.
    let run_dir = replay(tmp.path(), "synthetic", &p, &[]);
    let rows = measured(&run_dir);
    assert_eq!(rows.len(), 9, "3 sessions x 3 turns: {:?}", rows.keys());
    for (id, turns) in &got {
        for k in 0..3 {
            let bodies = &rows[&(id.clone(), k as i32 + 1)];
            assert_eq!(bodies.len(), 2, "two repetitions of {id}/{}", k + 1);
            for b in bodies {
                assert_eq!(b["messages"], history(turns, k));
            }
        }
    }
}
