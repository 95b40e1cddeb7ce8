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

/// A client's structured-output and tool-calling traffic through serve, answered
/// differently on repeat (a batched server): `freeze` (its `auto` oracle) judges each by
/// the contract its request declares, and the frozen plan replays green against the same
/// nondeterministic server; `--oracle exact` keeps the recorded answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn captured_structured_and_tool_traffic_freezes_into_contracts_that_replay_green() {
    let tmp = tempfile::tempdir().unwrap();
    let mock = start_mock(matrix_proxy::MockConfig {
        nondeterministic_share: 1.0,
        ..matrix_proxy::MockConfig::default()
    })
    .await;
    let live = tmp.path().join("live");
    let serve = Serve::start(serve_args(&mock.url(), &live)).await;
    let schema = json!({"type": "object", "required": ["answer"], "properties": {
        "answer": {"type": "string"}, "confidence": {"type": "number", "minimum": 0, "maximum": 1}}});
    let tools = json!([{"type": "function", "function": {"name": "lookup", "parameters": {
        "type": "object", "required": ["query"], "properties": {"query": {"type": "string"}}}}}]);
    let bodies = [
        json!({"model": "mock", "max_tokens": 6, "messages": [{"role": "user", "content": "Answer in JSON."}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}}),
        json!({"model": "mock", "max_tokens": 6, "stream": true, "tools": tools,
            "messages": [{"role": "user", "content": "Look it up."}]}),
    ];
    let mut client = Client::connect(serve.addr).await;
    for _ in 0..2 {
        for b in &bodies {
            let mut req = request(
                "POST",
                serve.addr,
                "/v1/chat/completions",
                bytes::Bytes::from(b.to_string()),
            );
            req.headers_mut()
                .insert("content-type", "application/json".parse().unwrap());
            let (status, _, _) = client.send(req).await.unwrap();
            assert_eq!(status, 200);
        }
    }
    drop(client);
    serve.stop().await.unwrap();

    let plan_path = tmp.path().join("frozen.json");
    let (code, _, err) = run(&["freeze", s(&live), "--out", s(&plan_path)]);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("judged by expected_schema"), "{err}");
    let plan = read_json(&plan_path);
    let cases = plan["cases"].as_array().unwrap();
    let oracles: Vec<(serde_json::Value, serde_json::Value)> = cases
        .iter()
        .flat_map(|c| {
            c["variants"]
                .as_array()
                .cloned()
                .unwrap_or_else(|| vec![c.clone()])
        })
        .map(|v| {
            (
                v["expected_schema"].clone(),
                v["expected_tool_calls"].clone(),
            )
        })
        .collect();
    assert!(
        oracles.contains(&(schema.clone(), serde_json::Value::Null)),
        "{plan:#}"
    );
    assert!(
        oracles.contains(&(serde_json::Value::Null, json!({}))),
        "{plan:#}"
    );
    let dir = tmp.path().join("replay");
    std::fs::create_dir(&dir).unwrap();
    let mut plan = plan;
    plan["endpoint"] = json!(format!("{}/v1/chat/completions", mock.url()));
    plan["health_endpoint"] = json!(format!("{}/health", mock.url()));
    let (run_dir, exit) = replay_plan(&dir, &plan).await;
    assert_eq!(
        exit,
        Exit::Ok,
        "the contracts hold whatever words the server picks"
    );
    let rows = Rows::read(&run_dir);
    assert!(rows.bools("oracle_passed").contains(&Some(true)));

    let exact_path = tmp.path().join("exact.json");
    let (code, _, err) = run(&[
        "freeze",
        s(&live),
        "--oracle",
        "exact",
        "--out",
        s(&exact_path),
    ]);
    assert_eq!(code, Some(0), "{err}");
    let text = std::fs::read_to_string(&exact_path).unwrap();
    assert!(!text.contains("expected_schema") && !text.contains("expected_tool_calls"));
    mock.shutdown().await;
}

/// A campaign whose arm breaks 30 % of its tool calls over 40 distinct requests: its
/// validity per kind is in campaign.json beside the reference's, and contract v2's
/// `min_valid_rate` and `valid_rate_floor_delta` fail it (its whole interval is below
/// 0.95; its paired drop's is above 0.02) while the reference's twin passes both.
#[test]
fn an_arm_that_breaks_30_percent_of_tool_calls_fails_the_validity_gates() {
    let tmp = tempfile::tempdir().unwrap();
    let arm = |name: &str, reference: bool, flags: &[&str]| {
        // No modelled latency: the test is about answers, not time.
        let mut command = vec![
            "{self}",
            "mock-worker",
            "--listen",
            "127.0.0.1:{port}",
            "--prefill-ms",
            "0",
            "--per-token-ms",
            "0",
        ];
        command.extend(flags);
        json!({"name": name, "lane": "quality", "reference": reference,
               "recipe": {"runtime": "matrix-proxy mock", "weight_format": "none",
                          "weight_quantization": name, "device": "cpu"},
               "endpoint": "http://127.0.0.1:{port}/v1/chat/completions",
               "start": {"command": command}})
    };
    let tools = json!([{"type": "function", "function": {"name": "lookup", "parameters": {
        "type": "object", "required": ["query", "limit"],
        "properties": {"query": {"type": "string"}, "limit": {"type": "integer", "minimum": 1}}}}}]);
    let variants: Vec<serde_json::Value> = (0..40)
        .map(|i| {
            json!({"name": format!("q{i}"),
                   "request": {"messages": [{"role": "user", "content": format!("Find item {i}.")}],
                               "max_tokens": 6, "tools": tools},
                   "expected_tool_calls": {"names": ["lookup"]}})
        })
        .collect();
    let plan = json!({"name": "tools", "arms": [
            arm("ref", true, &[]), arm("twin", false, &[]),
            arm("broken", false, &["--invalid-tool-call-share", "0.3"])],
        "cases": [{"name": "lookup", "variants": variants}],
        "concurrency": [1], "requests_per_case": 40, "repetitions": 2, "on_failure": "continue",
        "timeout_seconds": 10, "metadata": metadata()});
    let path = write_plan(tmp.path(), "campaign.json", &plan);
    let out = tmp.path().join("run");
    let (code, _, err) = run(&["replay", s(&path), "--out", s(&out)]);
    assert!(code == Some(0) || code == Some(1), "{err}");
    let c = read_json(&out.join("campaign.json"));
    let validity = |name: &str| {
        c["drift"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["arm"] == json!(name))
            .unwrap()["validity"][0]
            .clone()
    };
    let broken = validity("broken");
    assert_eq!(
        (&broken["kind"], &broken["requests"]),
        (&json!("tool_calls"), &json!(40)),
        "{broken}"
    );
    let valid = broken["valid_requests"].as_u64().unwrap();
    assert!((20..=34).contains(&valid), "about 70 % valid: {broken}");
    assert!(broken["interval"][1].as_f64().unwrap() < 0.95, "{broken}");
    assert_eq!(broken["reference_rate"], json!(1.0));
    assert_eq!(broken["paired"]["only_reference_valid"], json!(40 - valid));
    let twin = validity("twin");
    assert_eq!(
        (&twin["valid_requests"], &twin["rate"]),
        (&json!(40), &json!(1.0))
    );

    let contract = json!({"contract_version": 2, "locked_at": "2026-12-01T09:00:00Z",
        "locked_by": "test", "plan_id": "tools",
        "thresholds": {"min_valid_rate": 0.9, "valid_rate_floor_delta": 0.02}});
    let cpath = write_plan(tmp.path(), "contract.json", &contract);
    let vout = tmp.path().join("verdict.json");
    let (code, _, err) = run(&[
        "verdict",
        s(&out),
        "--contract",
        s(&cpath),
        "--out",
        s(&vout),
    ]);
    assert!(code == Some(0) || code == Some(1), "{err}");
    let v = read_json(&vout);
    for gate in ["min_valid_rate", "valid_rate_floor_delta"] {
        let g = v["gates"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["gate"] == json!(gate))
            .unwrap();
        let pass = |arm: &str| {
            g["arms"]
                .as_array()
                .unwrap()
                .iter()
                .find(|a| a["arm"] == json!(arm))
                .unwrap()["pass"]
                .clone()
        };
        assert_eq!(pass("broken"), json!(false), "{gate}: {g:#}");
        // 40 of 40 valid: the interval [0.912, 1] clears 0.9, and no drop at all clears
        // 0.02 only with more requests (the paired bound on 40 is about 0.1).
        if gate == "min_valid_rate" {
            assert_eq!(pass("twin"), json!(true), "{gate}: {g:#}");
        }
    }
    assert_eq!(v["quality_lane_pass"], json!(false), "{v:#}");
}

/// A tool-calling agent's conversation through serve (turn 2 sends back the call and the
/// tool's result): `freeze --oracle schema` groups it into a session, whose chat turns
/// keep their exact answers (a turn's oracle does not see its case's tools), and the plan
/// is written and validates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_calling_conversation_freezes_into_a_session_that_keeps_exact_turns() {
    let tmp = tempfile::tempdir().unwrap();
    let mock = start_mock(matrix_proxy::MockConfig::default()).await;
    let live = tmp.path().join("live");
    let serve = Serve::start(serve_args(&mock.url(), &live)).await;
    let tools = json!([{"type": "function", "function": {"name": "lookup", "parameters": {
        "type": "object", "required": ["query"], "properties": {"query": {"type": "string"}}}}}]);
    let mut client = Client::connect(serve.addr).await;
    let mut messages = vec![json!({"role": "user", "content": "Find the opening hours."})];
    for turn in 0..2 {
        let body = json!({"model": "mock", "max_tokens": 5, "tools": tools, "messages": messages});
        let mut req = request(
            "POST",
            serve.addr,
            "/v1/chat/completions",
            bytes::Bytes::from(body.to_string()),
        );
        req.headers_mut()
            .insert("content-type", "application/json".parse().unwrap());
        let (status, _, answer) = client.send(req).await.unwrap();
        assert_eq!(status, 200);
        let answer: serde_json::Value = serde_json::from_slice(&answer).unwrap();
        let message = answer["choices"][0]["message"].clone();
        let id = message["tool_calls"][0]["id"].clone();
        messages.push(message);
        messages
            .push(json!({"role": "tool", "tool_call_id": id, "content": format!("result {turn}")}));
    }
    drop(client);
    serve.stop().await.unwrap();
    let plan_path = tmp.path().join("frozen.json");
    let (code, _, err) = run(&[
        "freeze",
        s(&live),
        "--oracle",
        "schema",
        "--out",
        s(&plan_path),
    ]);
    assert_eq!(code, Some(0), "{err}");
    let plan = read_json(&plan_path);
    let case = &plan["cases"][0];
    assert!(case["sessions"].is_array(), "{plan:#}");
    let text = plan.to_string();
    assert!(!text.contains("expected_tool_calls"), "{plan:#}");
    let (code, _, err) = run(&["validate", s(&plan_path)]);
    assert_eq!(code, Some(0), "{err}");
    mock.shutdown().await;
}
