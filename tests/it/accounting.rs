//! Exact accounting under load: every request a client sent has exactly one row, every
//! outcome is counted, and no exchange id repeats.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use matrix_proxy::MockConfig;
use matrix_proxy::cli::Exit;
use serde_json::{Value, json};

use crate::support::*;

const CLIENTS: usize = 16;
const PER_CLIENT: usize = 1_300; // 20,800 requests

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_accounts_for_every_request_under_a_fault_mix() {
    let mock = start_mock(MockConfig {
        prefill_ms: 0.0,
        per_token_ms: 0.0,
        max_batch: 64,
        ..MockConfig::default()
    })
    .await;
    let tmp = tempfile::tempdir().unwrap();
    let mut args = serve_args(&mock.url(), &tmp.path().join("live"));
    args.run.part_rows = 5_000;
    let serve = Serve::start(args).await;
    let addr = serve.addr;
    let started = matrix_proxy::now_ns();
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        tasks.push(tokio::spawn(async move {
            // What this client saw: 200, 500, cut (reset mid-body).
            let mut seen = BTreeMap::<&'static str, u64>::new();
            let mut client = Client::connect(addr).await;
            for i in 0..PER_CLIENT {
                let n = c * PER_CLIENT + i;
                let mut req = request(
                    "POST",
                    addr,
                    "/v1/completions",
                    format!("{{\"prompt\": \"p{n}\", \"max_tokens\": 1}}"),
                );
                let fault = match n % 100 {
                    0..=6 => Some("http500"),
                    7..=9 => Some("reset"),
                    10..=14 => Some("close"),
                    _ => None,
                };
                if let Some(f) = fault {
                    req.headers_mut().insert("x-mock-fault", f.parse().unwrap());
                }
                match client.send(req).await {
                    Ok((s, _, _)) if s == 200 => *seen.entry("200").or_default() += 1,
                    Ok((s, _, _)) if s == 500 => *seen.entry("500").or_default() += 1,
                    Ok(other) => panic!("unexpected answer {:?}", other.0),
                    Err(_) => *seen.entry("cut").or_default() += 1,
                }
                if fault == Some("reset") || fault == Some("close") {
                    client = Client::connect(addr).await;
                }
            }
            seen
        }));
    }
    let mut seen = BTreeMap::<&'static str, u64>::new();
    for t in tasks {
        for (k, v) in t.await.unwrap() {
            *seen.entry(k).or_default() += v;
        }
    }
    let took = (matrix_proxy::now_ns() - started) as f64 / 1e9;
    let out = serve.out.clone();
    assert_eq!(serve.stop().await.unwrap(), Exit::Interrupted);
    let total = (CLIENTS * PER_CLIENT) as u64;
    assert_eq!(seen.values().sum::<u64>(), total);
    let rows = Rows::read(&out);
    eprintln!(
        "accounting: {total} requests through serve in {took:.1} s, {} parts, client saw {seen:?}",
        part_files(&out).len()
    );
    assert_eq!(
        rows.len() as u64,
        total,
        "rows == requests the clients sent"
    );
    let ids: BTreeSet<i64> = rows
        .i64s("exchange_id")
        .into_iter()
        .map(Option::unwrap)
        .collect();
    assert_eq!(ids.len() as u64, total, "no duplicate exchange ids");
    let outcome = rows.strs("outcome");
    let status = rows.i32s("status");
    let ok_200 = (0..rows.len())
        .filter(|&i| outcome[i].as_deref() == Some("ok") && status[i] == Some(200))
        .count() as u64;
    let ok_500 = (0..rows.len())
        .filter(|&i| outcome[i].as_deref() == Some("ok") && status[i] == Some(500))
        .count() as u64;
    let transport = outcome
        .iter()
        .filter(|o| o.as_deref() == Some("transport"))
        .count() as u64;
    assert_eq!(
        (ok_200, ok_500, transport),
        (seen["200"], seen["500"], seen["cut"])
    );
    assert_eq!(transport, total * 3 / 100);
    let summary = read_json(&out.join("summary.json"));
    assert_eq!(summary["requests"], json!(total));
    assert_eq!(summary["rows_written"], json!(total));
    assert_eq!(summary["failures"], json!({"transport": transport}));
    mock.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_accounts_for_every_request_against_a_worker_that_fails_a_known_fraction() {
    let handler: Handler = Arc::new(|i, s: &Seen| {
        if s.method == "GET" {
            return Reply::json(200, &json!({}));
        }
        if i % 50 == 7 {
            return Reply::json(503, &json!({"error": "shed"}));
        }
        let req: Value = serde_json::from_slice(&s.body).unwrap();
        Reply::json(200, &json!({"echo": req}))
    });
    let peer = Peer::start(handler).await;
    let tmp = tempfile::tempdir().unwrap();
    let plan = json!({
        "endpoint": peer.url("/x"),
        "connection": "keep-alive",
        "on_failure": "continue",
        "cases": [{"name": "a", "request": {"q": 1}, "expected_response": {"echo": {"q": 1}}}],
        "concurrency": [16], "requests_per_case": 10_000, "timeout_seconds": 10, "metadata": metadata(),
    });
    let (out, exit) = replay_plan(tmp.path(), &plan).await;
    assert_eq!(exit, Exit::Failure);
    let seen = peer.seen();
    let total = 1 + 1 + 2 + 16 + 2 * 10_000;
    assert_eq!(seen.len(), total, "the whole budget ran");
    let rows = Rows::read(&out);
    assert_eq!(rows.len(), total, "rows == requests the worker received");
    let ids: BTreeSet<i64> = rows
        .i64s("exchange_id")
        .into_iter()
        .map(Option::unwrap)
        .collect();
    assert_eq!(ids.len(), total);
    let failed = (0..total).filter(|i| i % 50 == 7).count();
    let outcome = rows.strs("outcome");
    assert_eq!(
        outcome
            .iter()
            .filter(|o| o.as_deref() == Some("http"))
            .count(),
        failed
    );
    assert_eq!(
        outcome
            .iter()
            .filter(|o| o.as_deref() == Some("ok"))
            .count(),
        total - failed
    );
    let summary = read_json(&out.join("summary.json"));
    assert_eq!(summary["failures"], json!({"http": failed}));
    // Each round's rows (gathered by its workers, held by the writer) were all encoded
    // after the round, and every one of them reached a part.
    assert_eq!(summary["rows_encoded_during_rounds"], json!(0));
    assert_eq!(summary["rows_written"], json!(total));
    let attempted: u64 = summary["rounds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["attempted_requests"].as_u64().unwrap())
        .sum();
    assert_eq!(attempted, 20_000);
}
