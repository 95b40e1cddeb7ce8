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
