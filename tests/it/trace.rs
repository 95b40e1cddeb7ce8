//! Traffic at its recorded time: a serve capture frozen with `--keep-timing` replays at
//! its recorded offsets (and twice as fast at speedup 2); a trace file is pinned by its
//! hash and read line by line; a trace sharded in two and merged is the unsharded one.
//! Real loopback peers (the mock worker, serve, an echo peer), real Parquet.

use bytes::Bytes;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::support::*;

/// The measured rows as (dispatch index = trace entry, scheduled offset, start offset),
/// of repetition `rep`, by entry.
fn sent(rows: &Rows, rep: i32) -> Vec<(i64, i64, i64)> {
    measured(rows, rep)
        .into_iter()
        .map(|(i, sched, start, _)| (i, sched, start))
        .collect()
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bursty_capture_frozen_with_its_timing_replays_at_its_recorded_times_and_twice_as_fast() {
    let tmp = tempfile::tempdir().unwrap();
    let mock = start_mock(matrix_proxy::MockConfig::default()).await;
    let live = tmp.path().join("live");
    let serve = Serve::start(serve_args(&mock.url(), &live)).await;
    // Three bursts a second apart, each four requests at once from four keep-alive
    // clients; three distinct prompts.
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(Client::connect(serve.addr).await);
    }
    for burst in 0..3 {
        if burst > 0 {
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        }
        let sends: Vec<_> = clients
            .drain(..)
            .enumerate()
            .map(|(i, mut client)| {
                let addr = serve.addr;
                tokio::spawn(async move {
                    let body = json!({"model": "m", "max_tokens": 4,
                        "messages": [{"role": "user", "content": format!("prompt {}", i % 3)}]});
                    let mut req = request(
                        "POST",
                        addr,
                        "/v1/chat/completions",
                        Bytes::from(body.to_string()),
                    );
                    req.headers_mut()
                        .insert("content-type", "application/json".parse().unwrap());
                    let (status, _, _) = client.send(req).await.unwrap();
                    assert_eq!(status, 200);
                    client
                })
            })
            .collect();
        for s in sends {
            clients.push(s.await.unwrap());
        }
    }
    drop(clients);
    serve.stop().await.unwrap();

    let plan_path = tmp.path().join("trace.json");
    let (code, _, err) = run(&["freeze", s(&live), "--keep-timing", "--out", s(&plan_path)]);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("trace: 12 entries over"), "{err}");
    let mut plan = read_json(&plan_path);
    assert_eq!(plan["load"]["mode"], json!("trace"));
    assert!(plan.get("concurrency").is_none() && plan.get("warmup_per_case").is_none());
    let entries = plan["load"]["trace"]["entries"].as_array().unwrap().clone();
    assert_eq!(entries.len(), 12);
    let recorded: Vec<i64> = entries
        .iter()
        .map(|e| e["offset_us"].as_i64().unwrap())
        .collect();
    assert_eq!(recorded[0], 0);
    // Repeats share a variant: three prompts, three variants, named by the entries (each
    // burst sends prompt 0 twice).
    assert_eq!(plan["cases"][0]["variants"].as_array().unwrap().len(), 3);
    let names: std::collections::BTreeSet<&str> = entries[..4]
        .iter()
        .map(|e| e["variant"].as_str().unwrap())
        .collect();
    assert_eq!(names.len(), 3, "{entries:?}");
    // The bursts are a second apart in the recording.
    assert!(recorded[4] - recorded[3] > 900_000, "{recorded:?}");
    let (code, _, err) = run(&["validate", s(&plan_path)]);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("trace of 12 entries"), "{err}");

    plan["repetitions"] = json!(1);
    for speedup in [1.0, 2.0] {
        plan["load"]["speedup"] = json!(speedup);
        let dir = tempfile::tempdir().unwrap();
        let path = write_plan(dir.path(), "p.json", &plan);
        let out = dir.path().join("run");
        let (code, _, err) = run(&[
            "replay",
            "--quiet",
            "--mock-worker",
            "--out",
            s(&out),
            s(&path),
        ]);
        assert_eq!(code, Some(0), "{err}");
        let rows = sent(&Rows::read(&out), 0);
        assert_eq!(rows.len(), 12);
        let first = rows[0].1;
        for (k, (entry, sched, _)) in rows.iter().enumerate() {
            assert_eq!(*entry, k as i64);
            // Exactly the recorded offset over the speed-up, to the microsecond.
            let want = (recorded[k] as f64 / speedup).round() as i64;
            assert_eq!(sched - first, want, "entry {k} at speedup {speedup}");
        }
        // The sends keep the bursts' gaps (halved at 2): within 30 ms on a busy machine.
        for k in [4usize, 8] {
            let gap = rows[k].2 - rows[k - 1].2;
            let want = (recorded[k] - recorded[k - 1]) as f64 / speedup;
            assert!(
                (gap as f64 - want).abs() < 30_000.0,
                "gap before entry {k} at {speedup}x: {gap} us, recorded / speedup {want}"
            );
        }
        let summary = read_json(&out.join("summary.json"));
        let round = &summary["rounds"][0];
        assert_eq!(round["planned_requests"], json!(12));
        let sched = round["open_loop"]["scheduled_rate_per_second"]
            .as_f64()
            .unwrap();
        let want = 11.0 / ((recorded[11] as f64 / speedup) / 1e6);
        assert!((sched - want).abs() < 1e-6 * want, "{sched} vs {want}");
        // The machine's wake-up floor, measured before the round, beside its lag.
        let floor = round["open_loop"]["wake_floor_p99_seconds"]
            .as_f64()
            .unwrap();
        assert!(floor > 0.0 && floor < 1.0, "{floor}");
    }
}

/// A trace of `n` entries in bursts: entry `i` at `i / 10` x 0.25 s plus `(i % 10)` ms,
/// with one of three session keys, but every fifth entry, which has none.
fn bursts(n: usize) -> Vec<Value> {
    (0..n)
        .map(|i| {
            let mut e = json!({"offset_us": (i / 10) as u64 * 250_000 + (i % 10) as u64 * 1_000,
                               "case": "a"});
            if i % 5 != 4 {
                e["session"] = json!(format!("s{}", i % 3));
            }
            e
        })
        .collect()
}

fn trace_text(entries: &[Value]) -> String {
    entries.iter().map(|e| format!("{e}\n")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trace_sharded_in_two_and_merged_equals_the_unsharded_one_in_requests_and_offsets() {
    let peer = Peer::start(echo_handler()).await;
    let dir = tempfile::tempdir().unwrap();
    let entries = bursts(40);
    let text = trace_text(&entries);
    std::fs::write(dir.path().join("t.trace.jsonl"), &text).unwrap();
    let mut plan = open_plan(
        peer.url("/x"),
        json!({"mode": "trace", "speedup": 2, "start_offset_seconds": 0.25,
               "end_offset_seconds": 1.0, "warmup_seconds": 0.25,
               "trace": {"file": "t.trace.jsonl", "sha256": sha256_hex(text.as_bytes())}}),
    );
    plan["timeout_seconds"] = json!(1);
    plan["repetitions"] = json!(2);
    let path = write_plan(dir.path(), "p.json", &plan);
    // The window [0.25 s, 1 s) holds entries 10 to 39; its first 0.25 s (10 to 19) are
    // the warm-up, sent in the round and excluded.
    let single = dir.path().join("single");
    let (code, _, err) = run(&["replay", "--quiet", "--out", s(&single), s(&path)]);
    assert_eq!(code, Some(0), "{err}");
    // The run keeps the trace beside its plan.json, and reads back from it alone.
    assert_eq!(
        std::fs::read_to_string(single.join("t.trace.jsonl")).unwrap(),
        text
    );
    std::fs::rename(dir.path().join("t.trace.jsonl"), dir.path().join("gone")).unwrap();
    let (code, err) = summarize(&single);
    assert_eq!(code, Some(0), "{err}");
    std::fs::rename(dir.path().join("gone"), dir.path().join("t.trace.jsonl")).unwrap();
    let rows = Rows::read(&single);
    let whole = sent(&rows, 0);
    assert_eq!(
        whole.iter().map(|r| r.0).collect::<Vec<_>>(),
        (20..40).collect::<Vec<i64>>()
    );
    let warm = rows
        .strs("phase")
        .iter()
        .filter(|p| p.as_deref() == Some("warmup"))
        .count();
    assert_eq!(warm, 20);
    let first = whole[0].1;
    for (entry, sched, _) in &whole {
        // (offset - window start) / speedup, on the same clock as the warm-up's.
        let offset = entries[*entry as usize]["offset_us"].as_i64().unwrap();
        assert_eq!(sched - first, (offset - 500_000) / 2, "entry {entry}");
    }

    // Two shards: an entry with a session key goes where its key's hash says, so a
    // session stays on one generator.
    let out = dir.path().join("out");
    replay_shards(&path, &out, 2).await;
    let shard_rows: Vec<(Rows, i64)> = (0..2).map(|i| shard_rows(&out, i)).collect();
    // Each repetition's sends, on the shared timeline, relative to the round's first
    // measured entry: the shards' union is the unsharded round (the second round too,
    // whose start each shard takes from the timetable of the whole window's span).
    for rep in 0..2 {
        let mut union: Vec<(i64, i64)> = Vec::new();
        let mut sessions: Vec<std::collections::BTreeSet<String>> = Vec::new();
        let mut keyless: Vec<Vec<i64>> = Vec::new();
        for (rows, shift) in &shard_rows {
            let mine = sent(rows, rep);
            sessions.push(
                mine.iter()
                    .filter_map(|r| entries[r.0 as usize]["session"].as_str())
                    .map(String::from)
                    .collect(),
            );
            keyless.push(
                mine.iter()
                    .filter(|r| entries[r.0 as usize].get("session").is_none())
                    .map(|r| r.0)
                    .collect(),
            );
            union.extend(mine.iter().map(|r| (r.0, r.1 - shift)));
        }
        // Each session on one shard, and both shards send some.
        assert!(sessions[0].is_disjoint(&sessions[1]), "{sessions:?}");
        assert!(
            !sessions[0].is_empty() && !sessions[1].is_empty(),
            "{sessions:?}"
        );
        // An entry without a key goes by its index in the window (from entry 10) mod 2.
        for (i, mine) in keyless.iter().enumerate() {
            assert!(!mine.is_empty(), "shard {i}");
            assert!(
                mine.iter().all(|e| (e - 10) % 2 == i as i64),
                "shard {i}: {mine:?}"
            );
        }
        union.sort_unstable();
        let whole = sent(&rows, rep);
        let rel = |v: Vec<(i64, i64)>| -> Vec<(i64, i64)> {
            let first = v[0].1;
            v.into_iter().map(|(e, s)| (e, s - first)).collect()
        };
        let unsharded = rel(whole.iter().map(|(e, s, _)| (*e, *s)).collect());
        assert_eq!(rel(union), unsharded, "repetition {rep}");
    }
    let (code, err) = summarize(&out);
    assert_eq!(code, Some(0), "{err}");
    let (m, u) = (
        read_json(&out.join("summary.json")),
        read_json(&single.join("summary.json")),
    );
    for k in [
        "case",
        "rate_per_second",
        "planned_requests",
        "attempted_requests",
        "successful_requests",
    ] {
        for r in 0..2 {
            assert_eq!(m["rounds"][r][k], u["rounds"][r][k], "{k}");
        }
    }
    assert_eq!(u["rounds"][1]["planned_requests"], json!(20));
}

#[test]
fn a_trace_file_is_pinned_by_its_hash_and_refused_by_line() {
    let dir = tempfile::tempdir().unwrap();
    let entries = bursts(30);
    let text = trace_text(&entries);
    let trace = dir.path().join("t.trace.jsonl");
    std::fs::write(&trace, &text).unwrap();
    let load =
        |sha: &str| json!({"mode": "trace", "trace": {"file": "t.trace.jsonl", "sha256": sha}});
    let good = write_plan(
        dir.path(),
        "p.json",
        &open_plan(
            "http://127.0.0.1:9/x".into(),
            load(&sha256_hex(text.as_bytes())),
        ),
    );
    let (code, _, err) = run(&["validate", s(&good)]);
    assert_eq!(code, Some(0), "{err}");
    // Entries, length, mean and peak rates per second.
    assert!(
        err.contains("trace of 30 entries over 0.509 s (mean 56.97/s, peak 30/s in one second)"),
        "{err}"
    );
    // Edited after the plan was written: refused by its hash, whatever it holds now.
    std::fs::write(&trace, text.replace("\"s1\"", "\"s9\"")).unwrap();
    let (code, _, err) = run(&["validate", s(&good)]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("t.trace.jsonl") && err.contains("the trace was changed after the plan"),
        "{err}"
    );
    // Hostile lines, each refused as FILE:LINE: reason.
    let cases = [
        (
            "{\"offset_us\": 5, \"case\": \"a\"}\n{\"offset_us\": 4, \"case\": \"a\"}\n",
            ":2: offset_us 4 is before the previous entry's 5",
        ),
        (
            "{\"offset_us\": -3, \"case\": \"a\"}\n",
            ":1: not a trace entry",
        ),
        (
            "{\"offset_us\": NaN, \"case\": \"a\"}\n",
            ":1: not a trace entry",
        ),
        (
            "{\"offset_us\": 1e300, \"case\": \"a\"}\n",
            ":1: not a trace entry",
        ),
        (
            "{\"offset_us\": 0, \"case\": \"a\"}\n{\"offset_us\": 9007199254740993, \"case\": \"a\"}\n",
            ":2: offset_us 9007199254740993 is above 2^53 - 1",
        ),
        ("{\"offset_us\": 0}\n", ":1: gives neither \"case\""),
        (
            "{\"offset_us\": 0, \"case\": \"b\"}\n",
            ":1: names case 'b', which the plan does not have",
        ),
    ];
    for (bad, want) in cases {
        std::fs::write(&trace, bad).unwrap();
        let p = write_plan(
            dir.path(),
            "bad.json",
            &open_plan(
                "http://127.0.0.1:9/x".into(),
                load(&sha256_hex(bad.as_bytes())),
            ),
        );
        let (code, _, err) = run(&["validate", s(&p)]);
        assert_eq!(code, Some(2), "{bad:?}: {err}");
        assert!(
            err.contains(&format!("t.trace.jsonl{want}")),
            "{bad:?}: {err}"
        );
    }
    // A trace file outside the plan's folder cannot be kept beside a run's plan.json.
    let mut outside = open_plan("http://127.0.0.1:9/x".into(), load(&"0".repeat(64)));
    outside["load"]["trace"]["file"] = json!("../t.trace.jsonl");
    let p = write_plan(dir.path(), "out.json", &outside);
    let (code, _, err) = run(&["validate", s(&p)]);
    assert_eq!(code, Some(2));
    assert!(
        err.contains("load.trace.file: '../t.trace.jsonl' must name a .jsonl file beside the plan"),
        "{err}"
    );
}

/// The trace demo in plans/ is what its script writes, and validates as shipped.
#[test]
fn the_shipped_trace_demo_is_its_scripts_output_and_validates() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new("python3")
        .args(["scripts/make-trace-demo.py", "--out", s(dir.path())])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for f in ["trace-demo.json", "trace-demo.trace.jsonl"] {
        assert_eq!(
            std::fs::read(dir.path().join(f)).unwrap(),
            std::fs::read(format!("plans/{f}")).unwrap(),
            "plans/{f} differs from what scripts/make-trace-demo.py writes: run it again"
        );
    }
    // And plan from-trace's worked example, plans/mooncake-sample.jsonl, is its script's.
    let check = std::process::Command::new("python3")
        .args(["scripts/make-trace-samples.py", "--check"])
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
    let (code, _, err) = run(&["validate", "plans/trace-demo.json"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("trace of 72 entries"), "{err}");
}

/// Synthetic entries (what `plan from-trace` writes): each request is made at send time
/// from the template case, its prompt the entry's blocks of words (equal block ids give
/// equal text, a shorter block is a prefix of a longer one), `max_tokens` its output
/// tokens, and its rows' `prompt_tokens_planned` its input tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn synthetic_entries_are_made_at_send_time_from_their_blocks() {
    let peer = Peer::start(echo_handler()).await;
    let dir = tempfile::tempdir().unwrap();
    let words = ["alpha", "beta", "gamma", "delta", "eps"];
    let plan = json!({
        "endpoint": peer.url("/v1/completions"), "connection": "keep-alive",
        "timeout_seconds": 5, "metadata": metadata(),
        "cases": [{"name": "trace", "request": {"model": "m", "prompt": "", "max_tokens": 1}}],
        "load": {"mode": "trace", "trace": {
            "entries": [
                {"offset_us": 0, "input_tokens": 9, "output_tokens": 3, "blocks": [1, 2, 3]},
                {"offset_us": 1000, "input_tokens": 8, "output_tokens": 2, "blocks": [1, 2]},
                {"offset_us": 2000, "input_tokens": 7, "output_tokens": 5, "blocks": [4, 2]}],
            "synthetic": {"case": "trace", "block_tokens": 4, "special_tokens": 1, "seed": 3,
                          "words": words}}}
    });
    let (run, exit) = replay_plan(dir.path(), &plan).await;
    assert_eq!(exit, matrix_proxy::cli::Exit::Ok);
    // The health GET, readiness (the first entry), then the round's three.
    let mut seen: Vec<Value> = peer
        .seen()
        .iter()
        .filter(|s| s.method == "POST")
        .map(|s| serde_json::from_slice(&s.body).unwrap())
        .collect();
    assert_eq!(seen.len(), 4);
    // Sends 1 ms apart may arrive out of order: the entries' prompts are 8, 7 and 6
    // words long, so order them by that.
    let words_of = |b: &Value| b["prompt"].as_str().unwrap().split(' ').count();
    seen[1..].sort_by_key(|b| std::cmp::Reverse(words_of(b)));
    assert_eq!(seen[0], seen[1]);
    let prompts: Vec<Vec<&str>> = seen[1..]
        .iter()
        .map(|b| b["prompt"].as_str().unwrap().split(' ').skip(1).collect())
        .collect();
    // input - special words, every one from the list, each after one space.
    assert_eq!(
        prompts.iter().map(Vec::len).collect::<Vec<_>>(),
        vec![8, 7, 6]
    );
    assert!(prompts.iter().flatten().all(|w| words.contains(w)));
    // Blocks 1 and 2 (3 + 4 words) are the same text in the first two prompts; block 2's
    // first 3 words start the third prompt's second block.
    assert_eq!(prompts[0][..7], prompts[1][..]);
    assert_eq!(prompts[2][3..6], prompts[1][3..6]);
    assert_ne!(prompts[2][..3], prompts[1][..3]);
    let max: Vec<u64> = seen[1..]
        .iter()
        .map(|b| b["max_tokens"].as_u64().unwrap())
        .collect();
    assert_eq!(max, vec![3, 2, 5]);
    assert_eq!(seen[1]["model"], json!("m"));
    let rows = Rows::read(&run);
    let phase = rows.strs("phase");
    let planned = rows.i64s("prompt_tokens_planned");
    let index = rows.i64s("dispatch_index");
    let mut got: Vec<(i64, i64)> = (0..rows.len())
        .filter(|&i| phase[i].as_deref() == Some("measured"))
        .map(|i| (index[i].unwrap(), planned[i].unwrap()))
        .collect();
    got.sort_unstable();
    assert_eq!(got, vec![(0, 9), (1, 8), (2, 7)]);
}
