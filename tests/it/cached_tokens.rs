//! The last three columns of exchanges/*.parquet: `session_id` and `turn` (null outside
//! sessions) and `cached_prompt_tokens`, the answer's
//! `usage.prompt_tokens_details.cached_tokens`, recorded from JSON answers and from a
//! stream's usage chunk, in replay and in serve, and null where the answer reports none.

use std::sync::Arc;

use matrix_proxy::cli::Exit;
use serde_json::{Value, json};

use crate::support::*;

/// A chat answer whose usage reports `details` as `prompt_tokens_details` (none: absent).
fn answer(details: Option<Value>) -> Value {
    let mut usage = json!({"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11});
    if let Some(d) = details {
        usage["prompt_tokens_details"] = d;
    }
    json!({"id": "x", "object": "chat.completion", "model": "m",
           "choices": [{"index": 0, "message": {"role": "assistant", "content": "ab"}, "finish_reason": "stop"}],
           "usage": usage})
}

/// A stream of "ab" whose usage chunk reports `details` as `prompt_tokens_details`.
fn stream(details: Option<Value>) -> Vec<u8> {
    let mut usage = json!({"prompt_tokens": 9, "completion_tokens": 2});
    if let Some(d) = details {
        usage["prompt_tokens_details"] = d;
    }
    let chunk = |c: &str| json!({"choices": [{"index": 0, "delta": {"content": c}}]});
    let usage = json!({"choices": [], "usage": usage});
    [chunk("a"), chunk("b"), usage]
        .iter()
        .map(|v| format!("data: {v}\n\n"))
        .chain(["data: [DONE]\n\n".to_string()])
        .collect::<String>()
        .into_bytes()
}

/// A worker answering by path: `/json-cached` and `/stream-cached` report 7 cached prompt
/// tokens, `/json-plain` and `/stream-plain` no details, `/stream-odd` a count no worker
/// means; any GET is healthy.
fn worker() -> Handler {
    Arc::new(|_, seen: &Seen| {
        let cached = Some(json!({"cached_tokens": 7}));
        let sse = |body: Vec<u8>| {
            let mut r = Reply::bytes(200, body);
            r.headers = vec![("content-type", "text/event-stream".into())];
            r
        };
        match (seen.method.as_str(), seen.path.as_str()) {
            ("GET", _) => Reply::json(200, &json!({"status": "ok"})),
            (_, "/json-cached") => Reply::json(200, &answer(cached)),
            (_, "/json-plain") => Reply::json(200, &answer(None)),
            (_, "/stream-cached") => sse(stream(cached)),
            (_, "/stream-plain") => sse(stream(None)),
            (_, "/stream-odd") => sse(stream(Some(json!({"cached_tokens": -4})))),
            _ => Reply::bytes(404, vec![]),
        }
    })
}

/// `column`'s values by case name, one set per case (every row of a case alike).
fn by_case<T: std::fmt::Debug + Ord>(
    rows: &Rows,
    values: Vec<Option<T>>,
) -> std::collections::BTreeMap<String, std::collections::BTreeSet<Option<T>>> {
    let cases = rows.strs("case_name");
    let mut out = std::collections::BTreeMap::<String, std::collections::BTreeSet<_>>::new();
    for (case, v) in cases.into_iter().zip(values) {
        out.entry(case.unwrap_or_default()).or_default().insert(v);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_records_cached_prompt_tokens_from_json_answers_and_usage_chunks() {
    let peer = Peer::start(worker()).await;
    let tmp = tempfile::tempdir().unwrap();
    let stream_case = |name: &str| {
        json!({"name": name, "path": format!("/{name}"),
               "request": {"stream": true, "stream_options": {"include_usage": true}},
               "expected_stream_text": "ab"})
    };
    let json_case = |name: &str, expected: Value| {
        json!({"name": name, "path": format!("/{name}"), "request": {"q": 1},
               "expected_response": expected})
    };
    let plan = json!({
        "endpoint": peer.url("/"),
        "cases": [
            json_case("json-cached", answer(Some(json!({"cached_tokens": 7})))),
            json_case("json-plain", answer(None)),
            stream_case("stream-cached"),
            stream_case("stream-plain"),
            stream_case("stream-odd"),
        ],
        "concurrency": [1], "requests_per_case": 2, "timeout_seconds": 5, "metadata": metadata(),
    });
    let (out, exit) = replay_plan(tmp.path(), &plan).await;
    assert_eq!(exit, Exit::Ok);
    let rows = Rows::read(&out);
    let cached = by_case(&rows, rows.i64s("cached_prompt_tokens"));
    let want = |v: Option<i64>| std::collections::BTreeSet::from([v]);
    assert_eq!(cached["json-cached"], want(Some(7)));
    assert_eq!(cached["json-plain"], want(None));
    assert_eq!(cached["stream-cached"], want(Some(7)));
    assert_eq!(cached["stream-plain"], want(None));
    assert_eq!(
        cached["stream-odd"],
        want(None),
        "a negative count is unknown"
    );
    // The health row (no case) asked nothing of a model.
    assert_eq!(cached[""], want(None));
    // Outside sessions a row has neither a session nor a turn.
    assert!(rows.strs("session_id").iter().all(Option::is_none));
    assert!(rows.i32s("turn").iter().all(Option::is_none));
    // The three are the file's last columns, in this order and of these types.
    let schema = rows.batches[0].schema();
    let last: Vec<(String, String, bool)> = schema.fields()[schema.fields().len() - 5..]
        .iter()
        .map(|f| (f.name().clone(), f.data_type().to_string(), f.is_nullable()))
        .collect();
    let col = |n: &str, t: &str| (n.to_string(), t.to_string(), true);
    assert_eq!(
        last,
        [
            col("session_id", "Utf8"),
            col("turn", "Int32"),
            col("cached_prompt_tokens", "Int64"),
            col("session_lag_us", "Int64"),
            col("oracle_detail", "Utf8")
        ]
    );
    // summarize reads the run back with the new columns (and refuses nothing).
    let (code, _, stderr) = run(&["summarize", "--quiet", s(&out)]);
    assert_eq!(code, Some(0), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_records_cached_prompt_tokens_from_json_answers_and_usage_chunks() {
    let peer = Peer::start(worker()).await;
    let tmp = tempfile::tempdir().unwrap();
    let serve = Serve::start(serve_args(&peer.url(""), &tmp.path().join("run"))).await;
    let mut client = Client::connect(serve.addr).await;
    for path in [
        "/json-cached",
        "/json-plain",
        "/stream-cached",
        "/stream-plain",
    ] {
        let (status, _, _) = client
            .send(request("POST", serve.addr, path, br#"{"q":1}"#.to_vec()))
            .await
            .unwrap();
        assert_eq!(status, 200, "{path}");
    }
    drop(client);
    assert_eq!(serve.stop().await.unwrap(), Exit::Interrupted);
    let rows = Rows::read(&tmp.path().join("run"));
    let urls = rows.strs("url");
    let cached = rows.i64s("cached_prompt_tokens");
    let got: Vec<(String, Option<i64>)> = urls
        .into_iter()
        .map(|u| u.unwrap().rsplit('/').next().unwrap().to_string())
        .zip(cached)
        .collect();
    assert_eq!(
        got,
        [
            ("json-cached".to_string(), Some(7)),
            ("json-plain".to_string(), None),
            ("stream-cached".to_string(), Some(7)),
            ("stream-plain".to_string(), None),
        ]
    );
    // A JSON answer's usage is its row's token counts in serve too.
    let out_tokens = rows.i64s("output_tokens");
    assert_eq!(out_tokens, [Some(2), Some(2), Some(2), Some(2)]);
    assert!(rows.i32s("turn").iter().all(Option::is_none));
}
