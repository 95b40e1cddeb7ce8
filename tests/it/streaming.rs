//! Streaming model traffic: per-event stamps checked against the mock's own write times,
//! TTFT / ITL / token counts, streaming oracles, and stream faults, in replay and serve.

use std::sync::Arc;

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_openai_stream_without_done_is_a_transport_failure() {
    let chunk = |c: &str| {
        format!("data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{c}\"}}}}]}}\n\n")
    };
    let body = format!("{}{}", chunk("a"), chunk("b"));
    let peer = Peer::start(Arc::new(move |_, s: &Seen| {
        if s.method == "GET" {
            return Reply::json(200, &json!({}));
        }
        Reply {
            status: 200,
            body: body.clone().into_bytes(),
            headers: vec![("content-type", "text/event-stream".into())],
            delay: std::time::Duration::ZERO,
        }
    }))
    .await;
    let tmp = tempfile::tempdir().unwrap();
    let plan = json!({
        "endpoint": peer.url("/v1/chat/completions"),
        "cases": [{"name": "s", "request": {"stream": true}, "expected_stream_text": "ab"}],
        "concurrency": [1], "requests_per_case": 1, "timeout_seconds": 2, "metadata": metadata(),
    });
    let (out, exit) = replay_plan(tmp.path(), &plan).await;
    assert_eq!(exit, Exit::Failure);
    let rows = Rows::read(&out);
    assert_eq!(rows.strs("outcome")[1].as_deref(), Some("transport"));
    assert_eq!(
        rows.strs("error_message")[1].as_deref(),
        Some("OpenAI-style event stream ended without data: [DONE]")
    );
    assert_eq!(rows.i64s("event_count")[1], Some(2), "what arrived is kept");
    assert_eq!(
        rows.strs("output_tokens_source")[1].as_deref(),
        Some("events")
    );
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
