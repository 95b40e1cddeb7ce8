//! Contract oracles against the mock: a pattern and a choice judged on its answers, whole
//! and streamed; a broken contract is a `correctness` failure with its reason in the row's
//! `oracle_detail`, and `summarize` reads the run back.

use serde_json::json;

use crate::support::*;
use matrix_proxy::cli::Exit;

#[tokio::test]
async fn contracts_judge_the_mocks_answers_and_a_broken_one_says_why_in_its_row() {
    let mock = start_mock(matrix_proxy::MockConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let ask = |stream: bool| {
        json!({"model": "mock", "max_tokens": 4, "stream": stream,
        "messages": [{"role": "user", "content": "Say something."}]})
    };
    let plan = json!({
        "endpoint": format!("{}/v1/chat/completions", mock.url()),
        "health_endpoint": format!("{}/health", mock.url()),
        "on_failure": "continue",
        "cases": [
            {"name": "words", "request": ask(false), "expected_pattern": "^\\S+( \\S+){3}$"},
            {"name": "words-stream", "request": ask(true), "expected_pattern": "^\\S+( \\S+){3}$"},
            {"name": "label", "request": ask(false), "expected_choice": ["positive", "negative"]},
            {"name": "json", "request": ask(true), "expected_schema": {"type": "object"}},
        ],
        "concurrency": [1], "requests_per_case": 2, "repetitions": 2, "warmup_per_case": 2,
        "timeout_seconds": 5, "metadata": metadata(),
    });
    let (run, exit) = replay_plan(dir.path(), &plan).await;
    assert_ne!(exit, Exit::Ok, "two cases break their contracts");
    let rows = Rows::read(&run);
    let (phase, case) = (rows.strs("phase"), rows.strs("case_name"));
    let (outcome, passed, detail) = (
        rows.strs("outcome"),
        rows.bools("oracle_passed"),
        rows.strs("oracle_detail"),
    );
    let measured = |name: &str| -> Vec<usize> {
        (0..rows.len())
            .filter(|&i| {
                phase[i].as_deref() == Some("measured") && case[i].as_deref() == Some(name)
            })
            .collect()
    };
    for name in ["words", "words-stream"] {
        let rs = measured(name);
        assert_eq!(rs.len(), 4, "{name}");
        for i in rs {
            assert_eq!(
                (outcome[i].as_deref(), passed[i], &detail[i]),
                (Some("ok"), Some(true), &None)
            );
        }
    }
    for (name, want) in [
        ("label", "choice: at /content: '"),
        ("json", "schema: at /content: the content is not JSON"),
    ] {
        for i in measured(name) {
            assert_eq!(
                (outcome[i].as_deref(), passed[i]),
                (Some("correctness"), Some(false))
            );
            let d = detail[i].as_deref().unwrap_or_default();
            assert!(d.starts_with(want), "{name}: {d}");
        }
    }
    let (code, stderr) = summarize(&run);
    assert!(code.is_some(), "{stderr}");
    mock.shutdown().await;
}

/// Structured output and tool calls through the mock, whole and streamed: its answers keep
/// their contracts, and with every tool call broken the tool-call cases fail, saying where.
#[tokio::test]
async fn the_mocks_structured_output_and_tool_calls_keep_their_contracts_until_it_breaks_them() {
    let schema = json!({"type": "object", "required": ["city", "days"], "properties": {
        "city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}}});
    let tools =
        json!([{"type": "function", "function": {"name": "weather", "parameters": schema}}]);
    let ask = |stream: bool, extra: (&str, serde_json::Value)| {
        let mut r = json!({"model": "mock", "max_tokens": 8, "stream": stream,
            "messages": [{"role": "user", "content": "Plan a trip."}]});
        r[extra.0] = extra.1;
        r
    };
    let format = json!({"type": "json_schema", "json_schema": {"name": "trip", "schema": schema}});
    let cases = json!([
        {"name": "extract", "request": ask(false, ("response_format", format.clone())), "expected_schema": schema},
        {"name": "extract-stream", "request": ask(true, ("response_format", format)), "expected_schema": schema},
        {"name": "call", "request": ask(false, ("tools", tools.clone())), "expected_tool_calls": {"names": ["weather"]}},
        {"name": "call-stream", "request": ask(true, ("tools", tools)), "expected_tool_calls": {"count": 1}},
    ]);
    for broken in [false, true] {
        let mock = start_mock(matrix_proxy::MockConfig {
            invalid_tool_call_share: if broken { 1.0 } else { 0.0 },
            ..matrix_proxy::MockConfig::default()
        })
        .await;
        let dir = tempfile::tempdir().unwrap();
        let plan = json!({
            "endpoint": format!("{}/v1/chat/completions", mock.url()),
            "health_endpoint": format!("{}/health", mock.url()),
            "on_failure": "continue", "cases": cases,
            "concurrency": [1], "requests_per_case": 2, "repetitions": 2, "warmup_per_case": 2,
            "timeout_seconds": 5, "metadata": metadata(),
        });
        let (run, exit) = replay_plan(dir.path(), &plan).await;
        assert_eq!(exit == Exit::Ok, !broken);
        let rows = Rows::read(&run);
        let (phase, case) = (rows.strs("phase"), rows.strs("case_name"));
        let (outcome, detail) = (rows.strs("outcome"), rows.strs("oracle_detail"));
        let measured: Vec<usize> = (0..rows.len())
            .filter(|&i| phase[i].as_deref() == Some("measured"))
            .collect();
        assert_eq!(measured.len(), 16, "4 cases x 2 requests x 2 repetitions");
        for i in measured {
            let name = case[i].as_deref().unwrap_or_default();
            let calls = name.starts_with("call");
            if broken && calls {
                assert_eq!(outcome[i].as_deref(), Some("correctness"), "{name}");
                let d = detail[i].as_deref().unwrap_or_default();
                assert!(
                    d.starts_with(
                        "tool_calls: at /tool_calls/0/function/arguments: does not fit the schema"
                    ),
                    "{name}: {d}"
                );
            } else {
                assert_eq!(
                    (outcome[i].as_deref(), &detail[i]),
                    (Some("ok"), &None),
                    "{name}"
                );
            }
        }
        mock.shutdown().await;
    }
}
