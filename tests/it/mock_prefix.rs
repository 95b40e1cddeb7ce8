//! The mock worker's prefix cache, over real sockets: a second turn that resends the first
//! turn's history finds its full blocks cached (`usage.prompt_tokens_details`), computes
//! only the rest (a shorter time to first token than a cold prompt of the same length),
//! and feeds `/metrics`' prefix-cache counters; with the cache off, usage is as before.

use std::net::SocketAddr;
use std::time::Duration;

use matrix_proxy::MockConfig;
use matrix_proxy::cli::Exit;
use serde_json::{Value, json};

use crate::support::*;

/// `n` distinct words tagged `tag`.
fn words(tag: &str, n: usize) -> String {
    (0..n)
        .map(|i| format!("{tag}{i}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// POST a chat request; the answer's JSON (a stream's usage chunk for a stream) and the
/// time to the whole answer (the mock's decode is 0 here, so about its first token).
async fn chat(addr: SocketAddr, body: &Value) -> (Value, Duration) {
    let mut c = Client::connect(addr).await;
    let t = matrix_proxy::now_ns();
    let (status, _, bytes) = c
        .send(request(
            "POST",
            addr,
            "/v1/chat/completions",
            serde_json::to_vec(body).unwrap(),
        ))
        .await
        .unwrap();
    let took = Duration::from_nanos(matrix_proxy::now_ns() - t);
    assert_eq!(status, 200);
    if body["stream"] != json!(true) {
        return (serde_json::from_slice(&bytes).unwrap(), took);
    }
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    let usage = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find(|v| v.get("usage").is_some())
        .expect("a usage chunk");
    (usage, took)
}

/// A counter's value in the mock's `/metrics`.
async fn counter(addr: SocketAddr, name: &str) -> f64 {
    let mut c = Client::connect(addr).await;
    let (_, _, bytes) = c.send(request("GET", addr, "/metrics", "")).await.unwrap();
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    text.lines()
        .find(|l| l.starts_with(&format!("{name}{{")))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} in {text}"))
}

fn cached(usage: &Value) -> Option<u64> {
    usage["prompt_tokens_details"]["cached_tokens"].as_u64()
}

/// Turn 1 (a system prompt and a user message), then turn 2: its messages, the answer, a
/// new user message. Then a cold conversation as long as turn 2.
fn turns(stream: bool, tag: &str) -> (Value, impl Fn(&str) -> Value + use<>) {
    let mut base = json!({"model": "mock", "max_tokens": 4, "messages": [
        {"role": "system", "content": words(&format!("{tag}sys"), 50)},
        {"role": "user", "content": words(&format!("{tag}u"), 250)},
    ]});
    if stream {
        base["stream"] = json!(true);
        base["stream_options"] = json!({"include_usage": true});
    }
    let first = base.clone();
    let second = move |answer: &str| {
        let mut b = base.clone();
        let msgs = b["messages"].as_array_mut().unwrap();
        msgs.push(json!({"role": "assistant", "content": answer}));
        msgs.push(json!({"role": "user", "content": words("next", 12)}));
        b
    };
    (first, second)
}

#[tokio::test]
async fn mock_prefix_cache_turn_two_hits_and_is_faster() {
    let mock = start_mock(MockConfig {
        prefill_ms: 1.0,
        per_token_ms: 0.0,
        prefill_per_token_ms: 0.5,
        prefix_cache_blocks: 4096,
        log_requests: false,
        ..MockConfig::default()
    })
    .await;
    let addr = mock.addr;
    for stream in [false, true] {
        let tag = if stream { "s" } else { "j" };
        let queries0 = counter(addr, "vllm:prefix_cache_queries_total").await;
        let hits0 = counter(addr, "vllm:prefix_cache_hits_total").await;
        let (first, second) = turns(stream, tag);
        let (one, _) = chat(addr, &first).await;
        let usage1 = &one["usage"];
        assert_eq!(cached(usage1), Some(0), "a cold cache: {usage1}");
        let n1 = usage1["prompt_tokens"].as_u64().unwrap();
        assert_eq!(n1, 300);
        let (two, warm) = chat(addr, &second("the answer it gave")).await;
        let usage2 = &two["usage"];
        let n2 = usage2["prompt_tokens"].as_u64().unwrap();
        assert_eq!(n2, 300 + 4 + 12);
        // Turn 1's full blocks (300 tokens: 18 blocks of 16) are found, not more.
        assert_eq!(cached(usage2), Some(288), "{usage2}");
        // A cold conversation of the same length computes every token.
        let (_, cold_second) = turns(stream, &format!("{tag}cold"));
        let (three, cold) = chat(addr, &cold_second("the answer it gave")).await;
        assert_eq!(three["usage"]["prompt_tokens"].as_u64(), Some(n2));
        assert_eq!(cached(&three["usage"]), Some(0));
        // 316 uncached tokens at 0.5 ms (158 ms) against 28 (14 ms).
        assert!(
            warm < cold,
            "turn 2 took {warm:?}, a cold prompt as long {cold:?}"
        );
        assert!(cold >= Duration::from_millis(150), "cold {cold:?}");
        // /metrics: every prompt token queried, the cached ones hit.
        let queries = counter(addr, "vllm:prefix_cache_queries_total").await - queries0;
        let hits = counter(addr, "vllm:prefix_cache_hits_total").await - hits0;
        assert_eq!(queries, (n1 + 2 * n2) as f64);
        assert_eq!(hits, 288.0);
    }
    mock.shutdown().await;
}

#[tokio::test]
async fn mock_prefix_cache_off_reports_no_details() {
    let mock = start_mock(MockConfig {
        prefill_ms: 0.0,
        per_token_ms: 0.0,
        log_requests: false,
        ..MockConfig::default()
    })
    .await;
    let addr = mock.addr;
    for stream in [false, true] {
        let (first, _) = turns(stream, "off");
        for _ in 0..2 {
            let (v, _) = chat(addr, &first).await;
            assert_eq!(
                v["usage"],
                json!({"prompt_tokens": 300, "completion_tokens": 4, "total_tokens": 304}),
            );
        }
    }
    // Off, the counters keep their stand-in: a prompt served before is all hits (the same
    // words streamed and not: 3 repeats of 300 tokens).
    assert_eq!(
        counter(addr, "vllm:prefix_cache_queries_total").await,
        1200.0
    );
    assert_eq!(counter(addr, "vllm:prefix_cache_hits_total").await, 900.0);
    mock.shutdown().await;
}

/// `mock-worker --prefix-cache-blocks N` turns the cache on (its prefill per token stays
/// 0 unless given); without it, the mock is as before.
#[test]
fn mock_worker_prefix_cache_flags() {
    use clap::Parser;
    use matrix_proxy::cli::{Cli, Command};
    let config = |flags: &[&str]| {
        let cli = Cli::try_parse_from(["matrix-proxy", "mock-worker"].iter().chain(flags))
            .expect("parses");
        match cli.command {
            Command::MockWorker(a) => a.config().expect("valid"),
            _ => panic!("not mock-worker"),
        }
    };
    let off = config(&[]);
    assert_eq!(
        (off.prefix_cache_blocks, off.prefill_per_token_ms),
        (0, 0.0)
    );
    let on = config(&["--prefix-cache-blocks", "4096"]);
    assert_eq!(
        (on.prefix_cache_blocks, on.prefill_per_token_ms),
        (4096, 0.0)
    );
    let given = config(&["--prefix-cache-blocks", "8", "--prefill-per-token-ms", "2"]);
    assert_eq!(
        (given.prefix_cache_blocks, given.prefill_per_token_ms),
        (8, 2.0)
    );
    let cli = Cli::try_parse_from(["matrix-proxy", "mock-worker", "--prefill-per-token-ms=-1"])
        .expect("parses");
    if let Command::MockWorker(a) = cli.command {
        assert!(a.config().is_err(), "a negative time is refused");
    }
}

/// `replay --mock-worker --mock-prefix-cache-blocks N` on a live two-turn session: turn 2
/// resends turn 1 and its answer, so its row records at least turn 1's whole blocks as
/// cached prompt tokens (warm-up ran the session before: its own 64 tokens), every row's
/// count is whole blocks; without the flag the column stays null.
#[tokio::test]
async fn mock_prefix_cache_under_replay_mock_worker() {
    let system = words("rule", 40);
    let case = json!({
        "name": "chat", "history": "live",
        "request": {"model": "mock", "max_tokens": 4,
                    "messages": [{"role": "system", "content": system}]},
        "sessions": [{"id": "s1", "turns": [
            {"messages": [{"role": "user", "content": words("ask", 10)}]},
            {"messages": [{"role": "user", "content": words("more", 10)}]}]}]
    });
    let plan = json!({
        "endpoint": "http://127.0.0.1:9/v1/chat/completions",
        "cases": [case], "concurrency": [1], "requests_per_case": 1, "repetitions": 2,
        "timeout_seconds": 5, "metadata": metadata(),
    });
    let tmp = tempfile::tempdir().unwrap();
    let path = write_plan(tmp.path(), "p.json", &plan);
    for on in [true, false] {
        let out = tmp.path().join(format!("run-{on}"));
        let mut args = replay_args(&path, &out);
        args.mock_worker = true;
        if on {
            args.mock.prefix_cache_blocks = Some(64);
        }
        assert_eq!(replay(args).await.unwrap(), Exit::Ok);
        let rows = Rows::read(&out);
        let (turn, cached, phase) = (
            rows.i32s("turn"),
            rows.i64s("cached_prompt_tokens"),
            rows.strs("phase"),
        );
        let measured: Vec<(i32, Option<i64>)> = (0..rows.len())
            .filter(|&i| phase[i].as_deref() == Some("measured"))
            .map(|i| (turn[i].unwrap(), cached[i]))
            .collect();
        assert!(measured.iter().any(|(t, _)| *t == 2), "{measured:?}");
        for (t, c) in &measured {
            match (on, t) {
                // Turn 2 finds the system prompt and turn 1 (50 tokens: 3 whole blocks).
                (true, 2) => assert!(c.is_some_and(|c| c >= 48 && c % 16 == 0), "{measured:?}"),
                (true, _) => assert!(c.is_some_and(|c| c % 16 == 0), "{measured:?}"),
                (false, _) => assert_eq!(*c, None, "{measured:?}"),
            }
        }
    }
}
