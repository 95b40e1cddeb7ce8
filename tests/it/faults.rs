//! Faults injected by the built-in mock worker: each one becomes the right recorded
//! outcome, partial bytes are kept, and the run goes on (`on_failure: continue`).

use std::time::Duration;

use matrix_proxy::cli::Exit;
use matrix_proxy::{MockConfig, generate_text};
use serde_json::{Value, json};

use crate::support::*;

fn chat_case(name: &str, fault: Option<&str>, prompt: &str) -> Value {
    let mut case = json!({
        "name": name,
        "path": "/v1/chat/completions",
        "request": {"model": "mock", "messages": [{"role": "user", "content": prompt}], "max_tokens": 3},
        "expected_response": {
            "id": "x", "object": "chat.completion", "created": 0, "model": "mock",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": generate_text(prompt, 3)}, "finish_reason": "length"}],
            "usage": {"prompt_tokens": prompt.split_whitespace().count(), "completion_tokens": 3, "total_tokens": prompt.split_whitespace().count() + 3}
        },
        "ignore_paths": ["/id", "/created"],
    });
    if let Some(f) = fault {
        case["headers"] = json!({"x-mock-fault": f});
    }
    case
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_mock_fault_is_recorded_with_its_outcome() {
    let mock = start_mock(MockConfig {
        prefill_ms: 0.0,
        per_token_ms: 0.0,
        stall_ms: 5_000,
        ..MockConfig::default()
    })
    .await;
    let tmp = tempfile::tempdir().unwrap();
    let plan = json!({
        "endpoint": format!("{}/v1/chat/completions", mock.url()),
        "connection": "keep-alive",
        "on_failure": "continue",
        "cases": [
            chat_case("ok", None, "hello there"),
            chat_case("http500", Some("http500"), "hello there"),
            chat_case("wrong", Some("wrong-body"), "hello there"),
            chat_case("reset", Some("reset"), "hello there"),
            chat_case("stall", Some("stall"), "hello there"),
            chat_case("close", Some("close"), "hello there"),
            chat_case("after", None, "still fine"),
        ],
        "concurrency": [1],
        "requests_per_case": 2,
        "repetitions": 2,
        "warmup_per_case": 2,
        "timeout_seconds": 0.25,
        "metadata": metadata(),
    });
    let path = write_plan(tmp.path(), "faults.json", &plan);
    let out = tmp.path().join("run");
    let started_ns = matrix_proxy::now_ns();
    assert_eq!(
        replay(replay_args(&path, &out)).await.unwrap(),
        Exit::Failure
    );
    let took = Duration::from_nanos(matrix_proxy::now_ns() - started_ns);
    assert!(took < Duration::from_secs(30), "took {took:?}");

    let rows = Rows::read(&out);
    // Per case: readiness 1 + warmup 2 + feasibility 1 + 2 rounds x 2 = 8 rows.
    assert_eq!(rows.len(), 1 + 7 * 8);
    let case = rows.strs("case_name");
    let by_case = rows.outcomes_by_case();
    for (c, o) in [
        ("ok", "ok"),
        ("http500", "http"),
        ("wrong", "correctness"),
        ("reset", "transport"),
        ("stall", "timeout"),
        ("close", "ok"),
        ("after", "ok"),
    ] {
        assert_eq!(
            by_case.get(&format!("{c}:{o}")),
            Some(&8),
            "{c} -> {o}: {by_case:?}"
        );
    }
    let err = rows.strs("error_message");
    let ptr = rows.strs("oracle_mismatch_pointer");
    let status = rows.i32s("status");
    let body_len = rows.i64s("response_body_len");
    let body = rows.bins("response_body");
    let total = rows.i64s("total_us");
    let conn = rows.i64s("connection_id");
    let reused = rows.bools("connection_reused");
    for i in 0..rows.len() {
        match case[i].as_deref() {
            Some("http500") => {
                assert_eq!(status[i], Some(500));
                let says = format!(
                    r#"status 500 from {}/v1/chat/completions, expected 200; the answer says "mock fault: internal error""#,
                    mock.url()
                );
                assert_eq!(err[i].as_deref(), Some(says.as_str()));
                assert!(
                    String::from_utf8_lossy(&body[i]).contains("mock fault"),
                    "the error body is kept"
                );
            }
            Some("wrong") => {
                assert_eq!(ptr[i].as_deref(), Some("/choices/0/message/content"));
                assert!(
                    err[i]
                        .as_deref()
                        .unwrap()
                        .starts_with("oracle mismatch at /choices/0/message/content")
                );
            }
            Some("reset") => {
                // Head and half the body arrived and are kept.
                assert_eq!(status[i], Some(200));
                assert!(body_len[i].unwrap() > 0 && body[i].len() as i64 == body_len[i].unwrap());
                assert!(
                    err[i].as_deref().unwrap().starts_with("read response body"),
                    "{:?}",
                    err[i]
                );
            }
            Some("stall") => {
                let t = total[i].unwrap();
                assert!(
                    (250_000..1_500_000).contains(&t),
                    "timeout row total_us = {t}"
                );
                assert_eq!(status[i], None);
                assert!(err[i].as_deref().unwrap().contains("deadline of 0.25 s"));
            }
            _ => {}
        }
    }
    // `Connection: close` answers make the next request on that worker open a new
    // connection (recorded as not reused), and nothing fails.
    let close_rows: Vec<usize> = (0..rows.len())
        .filter(|&i| case[i].as_deref() == Some("close"))
        .collect();
    let ids: std::collections::BTreeSet<i64> =
        close_rows.iter().map(|&i| conn[i].unwrap()).collect();
    assert_eq!(
        ids.len(),
        close_rows.len(),
        "every close answer ends its connection"
    );
    assert!(close_rows.iter().all(|&i| reused[i] == Some(false)));
    // The case after the faults is served normally and reuses its connection again.
    let phase = rows.strs("phase");
    let after: Vec<usize> = (0..rows.len())
        .filter(|&i| case[i].as_deref() == Some("after") && phase[i].as_deref() == Some("measured"))
        .collect();
    assert_eq!(after.len(), 4);
    assert!(after.iter().all(|&i| reused[i] == Some(true)));

    let summary = read_json(&out.join("summary.json"));
    assert_eq!(
        summary["failures"],
        json!({"http": 8, "correctness": 8, "timeout": 8, "transport": 8})
    );
    mock.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_worker_is_a_recorded_transport_failure() {
    // Bind then drop a listener: the port is (almost certainly) closed afterwards.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let tmp = tempfile::tempdir().unwrap();
    let plan = json!({
        "endpoint": format!("http://127.0.0.1:{port}/v1/x"),
        "cases": [{"name": "a", "request": {}, "expected_response": {}}],
        "concurrency": [1], "requests_per_case": 1, "timeout_seconds": 2, "metadata": metadata(),
    });
    let (out, exit) = replay_plan(tmp.path(), &plan).await;
    assert_eq!(exit, Exit::Failure);
    let rows = Rows::read(&out);
    assert_eq!(rows.len(), 1, "the health check fails and stops the run");
    assert_eq!(rows.strs("phase")[0].as_deref(), Some("health"));
    assert_eq!(rows.strs("outcome")[0].as_deref(), Some("transport"));
    let msg = rows.strs("error_message")[0].clone().unwrap();
    assert!(
        msg.starts_with(&format!("connect to 127.0.0.1:{port}")),
        "{msg}"
    );
    let summary = read_json(&out.join("summary.json"));
    assert_eq!(summary["complete"], json!(false));
    assert_eq!(
        summary["excluded_phases"]["health"]["failures"],
        json!({"transport": 1})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_response_is_truncated_in_the_record_and_not_judged_as_passing() {
    let big = "x".repeat(10_000);
    let body = json!({"text": big});
    let b2 = body.clone();
    let peer = Peer::start(std::sync::Arc::new(move |_, s: &Seen| {
        if s.method == "GET" {
            Reply::json(200, &json!({}))
        } else {
            Reply::json(200, &b2)
        }
    }))
    .await;
    let tmp = tempfile::tempdir().unwrap();
    let plan = json!({
        "endpoint": peer.url("/x"),
        "cases": [{"name": "a", "request": {}, "expected_response": body}],
        "concurrency": [1], "requests_per_case": 1, "timeout_seconds": 2, "metadata": metadata(),
    });
    let path = write_plan(tmp.path(), "p.json", &plan);
    let out = tmp.path().join("run");
    let mut args = replay_args(&path, &out);
    args.run.max_record_body = 1000;
    assert_eq!(replay(args).await.unwrap(), Exit::Failure);
    let rows = Rows::read(&out);
    assert_eq!(rows.len(), 2);
    assert_eq!(rows.bools("response_body_truncated")[1], Some(true));
    assert_eq!(rows.i64s("response_body_len")[1], Some(10_011));
    assert_eq!(rows.bins("response_body")[1].len(), 1000);
    assert_eq!(rows.strs("outcome")[1].as_deref(), Some("correctness"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_stops_with_exit_3_and_a_clear_error() {
    let handler: Handler = std::sync::Arc::new(|_, s: &Seen| {
        let mut r = Reply::json(
            200,
            &json!({"echo": serde_json::from_slice::<Value>(&s.body).unwrap_or(Value::Null)}),
        );
        if s.method == "GET" {
            // Give the test time to put /dev/full where the first part will be written.
            r.delay = Duration::from_millis(300);
        }
        r
    });
    let peer = Peer::start(handler).await;
    let tmp = tempfile::tempdir().unwrap();
    let plan = json!({
        "endpoint": peer.url("/x"),
        "cases": [{"name": "a", "request": {"q": 1}, "expected_response": {"echo": {"q": 1}}}],
        "concurrency": [1], "requests_per_case": 3, "timeout_seconds": 5, "metadata": metadata(),
    });
    let path = write_plan(tmp.path(), "p.json", &plan);
    let out = tmp.path().join("run");
    let run = tokio::spawn(replay(replay_args(&path, &out)));
    let part = out.join("exchanges").join(".part-00000.parquet.inprogress");
    for _ in 0..200 {
        if out.join("exchanges").is_dir() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    std::os::unix::fs::symlink("/dev/full", &part).unwrap();
    let err = run.await.unwrap().unwrap_err();
    assert_eq!(err.exit, Exit::Tool);
    assert!(
        err.message.contains("No space left on device"),
        "{}",
        err.message
    );
    assert!(
        err.message.contains(".part-00000.parquet.inprogress"),
        "{}",
        err.message
    );
    assert!(
        err.message.contains("what was written is kept"),
        "{}",
        err.message
    );
    let summary = read_json(&out.join("summary.json"));
    assert!(
        summary["record_error"]
            .as_str()
            .unwrap()
            .contains("No space left on device")
    );
}
