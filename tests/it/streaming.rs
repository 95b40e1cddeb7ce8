//! Streaming model traffic: per-event stamps checked against the mock's own write times,
//! TTFT / ITL / token counts, streaming oracles, and stream faults, in replay and serve.

use matrix_proxy::cli::Exit;
use matrix_proxy::{MockConfig, generate_text};
use serde_json::{Value, json};

use crate::support::*;

fn stream_case(name: &str, prompt: &str, tokens: u32, usage: bool) -> Value {
    let mut req = json!({"model": "mock", "messages": [{"role": "user", "content": prompt}], "max_tokens": tokens, "stream": true});
    let mut case = json!({"name": name, "path": "/v1/chat/completions", "expected_stream_text": generate_text(prompt, tokens)});
    if usage {
        req["stream_options"] = json!({"include_usage": true});
        let p = prompt.split_whitespace().count();
        case["expected_usage"] = json!({"prompt_tokens": p, "completion_tokens": tokens, "total_tokens": p + tokens as usize});
    }
    case["request"] = req;
    case
}

fn id_of(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let first = text.lines().find(|l| l.starts_with("data: {")).unwrap();
    let v: Value = serde_json::from_str(&first[6..]).unwrap();
    v["id"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_stamps_match_the_mocks_write_times_within_a_millisecond() {
    let mock = start_mock(MockConfig {
        prefill_ms: 50.0,
        per_token_ms: 10.0,
        ..MockConfig::default()
    })
    .await;
    let tmp = tempfile::tempdir().unwrap();
    let plan = json!({
        "endpoint": format!("{}/v1/chat/completions", mock.url()),
        "connection": "keep-alive",
        "cases": [stream_case("s", "time every token", 12, true)],
        "concurrency": [1, 2], "requests_per_case": 4, "timeout_seconds": 10, "metadata": metadata(),
    });
    let (out, exit) = replay_plan(tmp.path(), &plan).await;
    assert_eq!(exit, Exit::Ok);
    let config = read_json(&out.join("config.json"));
    let run_t0 = config["monotonic_start_ns"].as_u64().unwrap() as i64;
    let rows = Rows::read(&out);
    let (start, events, content, ttft, tpot, out_tokens, source, prompt) = (
        rows.i64s("start_offset_us"),
        rows.int_lists("event_offsets_us"),
        rows.int_lists("content_offsets_us"),
        rows.i64s("ttft_us"),
        rows.i64s("tpot_us"),
        rows.i64s("output_tokens"),
        rows.strs("output_tokens_source"),
        rows.i64s("prompt_tokens"),
    );
    let bodies = rows.bins("response_body");
    let is_stream = rows.bools("is_stream");
    let mut errors_ns: Vec<i64> = Vec::new();
    let mut ttfts = Vec::new();
    let mut gaps = Vec::new();
    for i in 0..rows.len() {
        if is_stream[i] != Some(true) {
            continue;
        }
        let written = mock
            .event_log(&id_of(&bodies[i]))
            .expect("the mock logged this stream");
        let measured = events[i].clone().unwrap();
        // role chunk + 12 tokens + finish + usage + [DONE]
        assert_eq!((measured.len(), written.len()), (16, 16), "row {i}");
        let t0 = run_t0 + start[i].unwrap() * 1000;
        for (m, w) in measured.iter().zip(&written) {
            // Offsets are floored to whole microseconds twice: allow 2 us below.
            let err = t0 + m * 1000 - *w as i64;
            assert!(
                err > -2_000,
                "row {i}: an event was stamped before it was written ({err} ns)"
            );
            errors_ns.push(err);
        }
        let c = content[i].clone().unwrap();
        assert_eq!(c.len(), 12);
        assert_eq!(ttft[i], Some(c[0]));
        assert_eq!(out_tokens[i], Some(12));
        assert_eq!(source[i].as_deref(), Some("usage"));
        assert_eq!(prompt[i], Some(3));
        let total = rows.i64s("total_us")[i].unwrap();
        assert_eq!(tpot[i], Some((total - c[0]) / 11));
        ttfts.push(c[0]);
        gaps.extend(c.windows(2).map(|w| w[1] - w[0]));
    }
    errors_ns.sort_unstable();
    let median = errors_ns[errors_ns.len() / 2];
    assert!(median < 1_000_000, "median stamp error {median} ns");
    ttfts.sort_unstable();
    gaps.sort_unstable();
    // The configured pace shows through (timer slack only adds): TTFT ~50 ms, ITL ~10 ms.
    let (ttft_med, itl_med) = (ttfts[ttfts.len() / 2], gaps[gaps.len() / 2]);
    assert!(
        (49_000..70_000).contains(&ttft_med),
        "median TTFT {ttft_med} us"
    );
    assert!(
        (9_000..13_000).contains(&itl_med),
        "median ITL {itl_med} us"
    );
    let summary = read_json(&out.join("summary.json"));
    let r = &summary["rounds"][0]["stream"];
    assert_eq!(r["requests"], json!(4));
    assert_eq!(r["output_tokens"], json!(48));
    assert!(r["output_tokens_per_second"]["aggregate"].as_f64().unwrap() > 0.0);
    mock.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_oracles_and_stream_faults_in_replay() {
    let mock = start_mock(MockConfig {
        prefill_ms: 1.0,
        per_token_ms: 1.0,
        stall_ms: 5_000,
        ..MockConfig::default()
    })
    .await;
    let tmp = tempfile::tempdir().unwrap();
    let mut wrong = stream_case("wrong-text", "alpha beta", 6, false);
    wrong["expected_stream_text"] = json!("not what the mock says");
    let mut cut = stream_case("cut", "alpha beta", 6, false);
    cut["headers"] = json!({"x-mock-fault": "stream-cut"});
    let mut stall = stream_case("stall", "alpha beta", 6, false);
    stall["headers"] = json!({"x-mock-fault": "stream-stall"});
    let id = "chatcmpl-mock-00000000";
    let events = json!([
        {"id": id, "object": "chat.completion.chunk", "created": 0, "model": "mock", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}]},
        {"id": id, "object": "chat.completion.chunk", "created": 0, "model": "mock", "choices": [{"index": 0, "delta": {"content": generate_text("x", 1)}, "finish_reason": null}]},
        {"id": id, "object": "chat.completion.chunk", "created": 0, "model": "mock", "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]},
        "[DONE]"
    ]);
    let plan = json!({
        "endpoint": format!("{}/v1/chat/completions", mock.url()),
        "on_failure": "continue",
        "cases": [
            stream_case("ok", "alpha beta", 6, true),
            {"name": "events", "request": {"model": "mock", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1, "stream": true},
             "expected_events": events, "ignore_paths": ["/id", "/created"]},
            wrong, cut, stall,
        ],
        "concurrency": [1], "requests_per_case": 1, "timeout_seconds": 0.5, "metadata": metadata(),
    });
    let (out, exit) = replay_plan(tmp.path(), &plan).await;
    assert_eq!(exit, Exit::Failure);
    let rows = Rows::read(&out);
    let case = rows.strs("case_name");
    let ptr = rows.strs("oracle_mismatch_pointer");
    let err = rows.strs("error_message");
    let events = rows.int_lists("event_offsets_us");
    let by = rows.outcomes_by_case();
    for (c, o) in [
        ("ok", "ok"),
        ("events", "ok"),
        ("wrong-text", "correctness"),
        ("cut", "transport"),
        ("stall", "timeout"),
    ] {
        assert_eq!(by.get(&format!("{c}:{o}")), Some(&6), "{c} -> {o}: {by:?}");
    }
    for i in 0..rows.len() {
        match case[i].as_deref() {
            Some("wrong-text") => assert_eq!(ptr[i].as_deref(), Some("/text")),
            Some("cut") | Some("stall") => {
                // What arrived before the cut or the deadline is kept, stamps and all.
                let n = events[i].as_ref().map_or(0, Vec::len);
                assert!(n >= 3, "row {i} kept {n} events");
                if case[i].as_deref() == Some("cut") {
                    assert!(
                        err[i].as_deref().unwrap().starts_with("read response body"),
                        "{:?}",
                        err[i]
                    );
                }
            }
            _ => {}
        }
    }
    mock.shutdown().await;
}

/// Two content events, as `transformers serve` sends them: no `data: [DONE]`.
const NO_DONE: &str = concat!(
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n",
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"b\"}}]}\n\n",
);

/// The raw answer for each framing of the same stream.
fn framed_stream(target: &str) -> Vec<u8> {
    const SSE: &str = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n";
    let with_done = format!("{NO_DONE}data: [DONE]\n\n");
    let framed = |body: &str| format!("{SSE}content-length: {}\r\n\r\n{body}", body.len());
    let text = match target {
        "/health" => "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}".to_string(),
        "/framed" | "/framed-required" => framed(NO_DONE),
        "/with-done" => framed(&with_done),
        // Framing ends the body right after `data: [DONE]\n`: the last event counts.
        "/framed-no-blank" => framed(&with_done[..with_done.len() - 1]),
        "/chunked" => format!(
            "{SSE}transfer-encoding: chunked\r\n\r\n{:x}\r\n{NO_DONE}\r\n0\r\n\r\n",
            NO_DONE.len()
        ),
        "/chunked-cut" => format!(
            "{SSE}transfer-encoding: chunked\r\n\r\n{:x}\r\n{}",
            NO_DONE.len(),
            &NO_DONE[..20]
        ),
        "/close-clean" => format!("{SSE}\r\n{NO_DONE}"),
        "/close-cut" => format!("{SSE}\r\n{NO_DONE}data: {{\"choi"),
        // A whole data line, but no blank line before the close: cut mid-event.
        "/close-no-blank" => format!("{SSE}\r\n{NO_DONE}data: [DONE]\n"),
        _ => "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n".to_string(),
    };
    text.into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_is_complete_by_its_framing_and_done_is_only_required_when_asked() {
    let addr = raw_peer(framed_stream).await;
    let tmp = tempfile::tempdir().unwrap();
    let case = |name: &str, path: &str, require_done: bool| {
        json!({"name": name, "path": path, "request": {"stream": true},
               "expected_stream_text": "ab", "require_done": require_done})
    };
    let plan = json!({
        "endpoint": format!("http://{addr}/v1/chat/completions"),
        "on_failure": "continue",
        "cases": [
            case("framed", "/framed", false),
            case("framed-required", "/framed-required", true),
            case("with-done", "/with-done", true),
            case("framed-no-blank", "/framed-no-blank", true),
            case("chunked", "/chunked", false),
            case("chunked-cut", "/chunked-cut", false),
            case("close-clean", "/close-clean", false),
            case("close-cut", "/close-cut", false),
            case("close-no-blank", "/close-no-blank", false),
        ],
        "concurrency": [1], "requests_per_case": 1, "timeout_seconds": 2, "metadata": metadata(),
    });
    let (out, exit) = replay_plan(tmp.path(), &plan).await;
    assert_eq!(exit, Exit::Failure);
    let rows = Rows::read(&out);
    let by = rows.outcomes_by_case();
    // readiness 1 + warm-up 2 + feasibility 1 + 2 measured rounds of 1 = 6 rows per case.
    for (c, o) in [
        ("framed", "ok"),
        ("framed-required", "correctness"),
        ("with-done", "ok"),
        ("framed-no-blank", "ok"),
        ("chunked", "ok"),
        ("chunked-cut", "transport"),
        ("close-clean", "ok"),
        ("close-cut", "transport"),
        ("close-no-blank", "transport"),
    ] {
        assert_eq!(by.get(&format!("{c}:{o}")), Some(&6), "{c} -> {o}: {by:?}");
    }
    let case = rows.strs("case_name");
    let done = rows.bools("stream_done_seen");
    let err = rows.strs("error_message");
    let ptr = rows.strs("oracle_mismatch_pointer");
    let events = rows.i64s("event_count");
    for i in 0..rows.len() {
        let Some(c) = case[i].as_deref() else {
            continue;
        };
        let with_done = matches!(c, "with-done" | "framed-no-blank");
        assert_eq!(done[i], Some(with_done), "{c}: stream_done_seen");
        if c == "framed-no-blank" {
            assert_eq!(
                events[i],
                Some(3),
                "the last event counts, as the oracle counts it"
            );
        }
        match c {
            "framed-required" => {
                assert_eq!(ptr[i].as_deref(), Some("/events/2"));
                assert_eq!(
                    err[i].as_deref(),
                    Some(
                        "oracle mismatch at /events/2: the stream ended without data: [DONE] (the oracle sets require_done)"
                    )
                );
            }
            "close-cut" | "close-no-blank" => {
                assert_eq!(
                    err[i].as_deref(),
                    Some(
                        "event stream ended by the connection closing in the middle of an event (no blank line after its last event)"
                    )
                );
                assert_eq!(
                    events[i],
                    Some(2),
                    "what arrived is kept, the cut event is not"
                );
            }
            "chunked-cut" => assert!(
                err[i].as_deref().unwrap().starts_with("read response body"),
                "{:?}",
                err[i]
            ),
            _ => assert_eq!(err[i], None, "{c}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_records_the_same_stream_fields_and_a_late_reader_does_not_delay_them() {
    let mock = start_mock(MockConfig {
        prefill_ms: 20.0,
        per_token_ms: 5.0,
        ..MockConfig::default()
    })
    .await;
    let tmp = tempfile::tempdir().unwrap();
    let serve = Serve::start(serve_args(&mock.url(), &tmp.path().join("live"))).await;
    let addr = serve.addr;
    // A client that reads its response body only after 300 ms.
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(conn);
    let body = serde_json::to_vec(&json!({"messages": [{"role": "user", "content": "slow reader"}], "max_tokens": 8, "stream": true})).unwrap();
    let resp = sender
        .send_request(request("POST", addr, "/v1/chat/completions", body))
        .await
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let got = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .unwrap()
        .to_bytes();
    assert!(String::from_utf8_lossy(&got).ends_with("data: [DONE]\n\n"));
    let out = serve.out.clone();
    serve.stop().await.unwrap();
    let rows = Rows::read(&out);
    assert_eq!(rows.bools("is_stream"), vec![Some(true)]);
    assert_eq!(rows.i64s("output_tokens"), vec![Some(8)]);
    let ttft = rows.i64s("ttft_us")[0].unwrap();
    let total = rows.i64s("total_us")[0].unwrap();
    let down = rows.i64s("downstream_done_us")[0].unwrap();
    // The worker's stream took ~20 + 7 x 5 ms; the client's 300 ms nap does not show in
    // the worker's stamps (the upstream is read independently of the client).
    assert!(
        ttft < 150_000 && total < 250_000,
        "ttft {ttft} total {total}"
    );
    assert!(
        down >= total,
        "downstream_done_us {down} < total_us {total}"
    );
    mock.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mock_takes_max_completion_tokens_and_replay_sets_its_latency() {
    // AIPerf and GuideLLM send OpenAI's current name; it wins over max_tokens.
    let prompt = "how many tokens";
    let mut case = stream_case("s", prompt, 5, true);
    case["request"]
        .as_object_mut()
        .unwrap()
        .remove("max_tokens");
    case["request"]["max_completion_tokens"] = json!(5);
    let plain = json!({"name": "plain", "path": "/v1/completions",
        "ignore_paths": ["/id", "/created"],
        "request": {"model": "mock", "prompt": prompt, "max_tokens": 9, "max_completion_tokens": 3},
        "expected_response": {"id": "x", "object": "text_completion", "created": 0, "model": "mock",
            "choices": [{"index": 0, "text": generate_text(prompt, 3), "finish_reason": "length"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}}});
    let tmp = tempfile::tempdir().unwrap();
    let plan = json!({
        "endpoint": "http://127.0.0.1:9/v1/chat/completions",
        "cases": [case, plain],
        "concurrency": [1], "requests_per_case": 1, "timeout_seconds": 5, "metadata": metadata(),
    });
    let path = write_plan(tmp.path(), "p.json", &plan);
    let out = tmp.path().join("run");
    let mut args = replay_args(&path, &out);
    args.mock_worker = true;
    args.mock.prefill_ms = Some(60.0);
    args.mock.per_token_ms = Some(1.0);
    args.mock.max_batch = Some(4);
    assert_eq!(replay(args).await.unwrap(), Exit::Ok);
    let config = read_json(&out.join("config.json"));
    assert_eq!(config["extra"]["mock_worker"]["prefill_ms"], json!(60.0));
    assert_eq!(config["extra"]["mock_worker"]["per_token_ms"], json!(1.0));
    assert_eq!(config["extra"]["mock_worker"]["max_batch"], json!(4));
    let rows = Rows::read(&out);
    let (case, ttft, tokens) = (
        rows.strs("case_name"),
        rows.i64s("ttft_us"),
        rows.i64s("output_tokens"),
    );
    for i in 0..rows.len() {
        if case[i].as_deref() == Some("s") {
            assert_eq!(tokens[i], Some(5));
            assert!(
                ttft[i].unwrap() >= 60_000,
                "ttft {:?} < the prefill",
                ttft[i]
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_aborts_the_clients_response_when_a_close_delimited_stream_is_cut_mid_event() {
    let addr = raw_peer(framed_stream).await;
    let tmp = tempfile::tempdir().unwrap();
    let serve = Serve::start(serve_args(
        &format!("http://{addr}"),
        &tmp.path().join("live"),
    ))
    .await;
    let client = |path: &'static str| {
        let addr = serve.addr;
        async move {
            let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
            let (mut sender, conn) =
                hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
                    .await
                    .unwrap();
            tokio::spawn(conn);
            let resp = sender
                .send_request(request("POST", addr, path, b"{}".to_vec()))
                .await
                .unwrap();
            http_body_util::BodyExt::collect(resp.into_body())
                .await
                .map(|b| b.to_bytes())
        }
    };
    // A clean close after a whole event: the client gets the stream whole.
    let whole = client("/close-clean").await.expect("a whole stream");
    assert_eq!(&whole[..], NO_DONE.as_bytes());
    // Cut mid-event: the client's response is aborted, never complete-looking.
    let cut = client("/close-cut")
        .await
        .expect_err("the cut must reach the client");
    // The body ended by the connection, not by its framing (hyper's `Body` kind, or
    // `IncompleteMessage` when the connection task ended first).
    assert!(
        cut.is_incomplete_message() || cut.to_string() == "error reading a body from connection",
        "the cut must reach the client as a body cut short: {cut:?}"
    );
    let out = serve.out.clone();
    serve.stop().await.unwrap();
    let rows = Rows::read(&out);
    // Rows are in the order the exchanges ended, which a busy machine may swap.
    let outcomes: Vec<Option<String>> = rows.strs("outcome");
    let mut sorted = outcomes.clone();
    sorted.sort();
    assert_eq!(
        sorted,
        vec![Some("ok".to_string()), Some("transport".to_string())]
    );
    let cut = outcomes
        .iter()
        .position(|o| o.as_deref() == Some("transport"))
        .unwrap();
    assert_eq!(rows.i64s("downstream_done_us")[cut], None);
}
