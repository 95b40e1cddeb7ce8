//! Multi-turn sessions against the mock: a live history sends the answers it received
//! (read back from Parquet), a frozen plan made from that capture replays the same
//! requests and judges every turn, the affinity header names the session, and a failing
//! turn stops its session.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Value, json};

use crate::support::run as run_cmd;
use crate::support::*;
use matrix_proxy::cli::Exit;

fn user(text: &str) -> Value {
    json!([{"role": "user", "content": text}])
}

/// A case of two sessions (three turns, then two) under `history`.
fn chat_case(history: &str) -> Value {
    json!({
        "name": "chat", "history": history, "session_header": "x-session-id",
        "request": {"model": "mock", "max_tokens": 6,
                    "messages": [{"role": "system", "content": "You are terse."}]},
        "sessions": [
            {"id": "alpha", "turns": [
                {"messages": user("Plan a trip to the coast.")},
                {"messages": user("Which train?")},
                {"messages": user("And back on Sunday?")}]},
            {"id": "beta", "turns": [
                {"messages": user("Name a prime number.")},
                {"messages": user("A larger one, please.")}]}
        ]
    })
}

fn session_plan(url: &str, case: Value) -> Value {
    json!({
        "endpoint": format!("{url}/v1/chat/completions"),
        "health_endpoint": format!("{url}/health"),
        "connection": "keep-alive",
        "cases": [case],
        "concurrency": [1, 2], "requests_per_case": 2, "repetitions": 2, "warmup_per_case": 2,
        "timeout_seconds": 5, "metadata": metadata(),
    })
}

/// One measured row: where it sits and what was sent and answered.
#[derive(Debug, Clone)]
struct Turn {
    key: (i32, i32, i64),
    session: String,
    turn: i32,
    request: Value,
    response: Value,
    header: Option<String>,
    outcome: String,
}

fn measured_turns(run: &Path) -> Vec<Turn> {
    let rows = Rows::read(run);
    let phase = rows.strs("phase");
    let (conc, rep, idx) = (
        rows.i32s("concurrency"),
        rows.i32s("repetition"),
        rows.i64s("dispatch_index"),
    );
    let (session, turn) = (rows.strs("session_id"), rows.i32s("turn"));
    let (req, resp) = (rows.bins("request_body"), rows.bins("response_body"));
    let headers = rows.headers("request_headers");
    let outcome = rows.strs("outcome");
    (0..rows.len())
        .filter(|&i| phase[i].as_deref() == Some("measured"))
        .map(|i| Turn {
            key: (conc[i].unwrap(), rep[i].unwrap(), idx[i].unwrap()),
            session: session[i]
                .clone()
                .expect("a session turn's row names its session"),
            turn: turn[i].expect("a session turn's row has its turn"),
            request: serde_json::from_slice(&req[i]).unwrap(),
            response: serde_json::from_slice(&resp[i]).unwrap_or(Value::Null),
            header: headers[i]
                .iter()
                .find(|(k, _)| k == "x-session-id")
                .map(|(_, v)| String::from_utf8_lossy(v).into_owned()),
            outcome: outcome[i].clone().unwrap(),
        })
        .collect()
}

/// The turns of each dispatched session, in turn order.
fn by_session(turns: Vec<Turn>) -> BTreeMap<(i32, i32, i64), Vec<Turn>> {
    let mut out: BTreeMap<_, Vec<Turn>> = BTreeMap::new();
    for t in turns {
        out.entry(t.key).or_default().push(t);
    }
    for v in out.values_mut() {
        v.sort_by_key(|t| t.turn);
    }
    out
}

#[tokio::test]
async fn a_live_history_sends_the_answers_received_and_freezes_into_a_judged_plan() {
    let mock = start_mock(matrix_proxy::MockConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("live");
    std::fs::create_dir(&live).unwrap();
    let (run, exit) = replay_plan(&live, &session_plan(&mock.url(), chat_case("live"))).await;
    assert_eq!(exit, Exit::Ok);
    let sessions = by_session(measured_turns(&run));
    // Two levels x two repetitions x two sessions dispatched per round.
    assert_eq!(sessions.len(), 8);
    let mut answers: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for turns in sessions.values() {
        let id = &turns[0].session;
        assert_eq!(turns.len(), if id == "alpha" { 3 } else { 2 });
        for (k, t) in turns.iter().enumerate() {
            assert_eq!(
                (t.turn, &t.session, t.outcome.as_str()),
                (k as i32 + 1, id, "ok")
            );
            assert_eq!(
                t.header.as_deref(),
                Some(id.as_str()),
                "the affinity header names the session"
            );
            let sent = t.request["messages"].as_array().unwrap();
            // system + (user, assistant) per earlier turn + this turn's user message.
            assert_eq!(sent.len(), 2 + 2 * k);
            for (j, earlier) in turns[..k].iter().enumerate() {
                assert_eq!(
                    sent[2 + 2 * j],
                    earlier.response["choices"][0]["message"],
                    "turn {} sends turn {}'s answer",
                    k + 1,
                    j + 1
                );
            }
        }
        answers
            .entry(id.clone())
            .or_insert_with(|| turns.iter().map(|t| t.response.clone()).collect());
    }

    // The capture frozen by hand: each turn's answer and its whole response as the oracle.
    let mut case = chat_case("frozen");
    case["ignore_paths"] = json!(["/id", "/created"]);
    for s in case["sessions"].as_array_mut().unwrap() {
        let id = s["id"].as_str().unwrap().to_string();
        for (k, t) in s["turns"].as_array_mut().unwrap().iter_mut().enumerate() {
            t["expected_response"] = answers[&id][k].clone();
        }
    }
    let frozen_dir = dir.path().join("frozen");
    std::fs::create_dir(&frozen_dir).unwrap();
    let (run, exit) = replay_plan(&frozen_dir, &session_plan(&mock.url(), case)).await;
    assert_eq!(exit, Exit::Ok, "every frozen turn passes its oracle");
    for turns in by_session(measured_turns(&run)).values() {
        for (k, t) in turns.iter().enumerate() {
            let answer = &answers[&t.session][k];
            assert_eq!(t.response["choices"], answer["choices"]);
            let sent = t.request["messages"].as_array().unwrap();
            for j in 0..k {
                assert_eq!(
                    sent[2 + 2 * j],
                    answers[&t.session][j]["choices"][0]["message"]
                );
            }
        }
    }
    let summary = read_json(&run.join("summary.json"));
    for r in summary["rounds"].as_array().unwrap() {
        // Two sessions a round: alpha's 3 turns and beta's 2, all passed.
        assert_eq!(
            (&r["planned_requests"], &r["successful_requests"]),
            (&json!(5), &json!(5)),
            "{r:#}"
        );
        let turns: Vec<(&Value, &Value)> = r["turns"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| (&t["turn"], &t["successful"]))
            .collect();
        assert_eq!(
            turns,
            [
                (&json!(1), &json!(2)),
                (&json!(2), &json!(2)),
                (&json!(3), &json!(1))
            ],
            "{r:#}"
        );
        // The mock counts a prompt's words: each turn's prompt is longer than the last.
        let prompts: Vec<i64> = r["turns"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["prompt_tokens"]["p50"].as_i64().unwrap())
            .collect();
        assert!(prompts.windows(2).all(|w| w[0] < w[1]), "{prompts:?}");
    }
    // The report has the same numbers per turn.
    let (code, _, err) = run_cmd(&["report", s(&run)]);
    assert_eq!(code, Some(0), "{err}");
    let html = std::fs::read_to_string(run.join("report.html")).unwrap();
    assert!(
        html.contains("<h2>Per turn: "),
        "the report has a per-turn table"
    );
    mock.shutdown().await;
}

#[tokio::test]
async fn a_failed_turn_stops_its_session_and_its_later_turns_are_not_attempted() {
    let mock = start_mock(matrix_proxy::MockConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let mut case = chat_case("live");
    // alpha's second turn is a whole request the mock answers 500: a live history has no
    // answer to continue with, so alpha's third turn is never sent.
    case["sessions"][0]["turns"][1] = json!({"request": {"model": "mock", "mock_fault": "http500",
        "messages": [{"role": "user", "content": "fail"}]}});
    let mut plan = session_plan(&mock.url(), case);
    plan["on_failure"] = json!("continue");
    plan["concurrency"] = json!([1]);
    let (run, exit) = replay_plan(dir.path(), &plan).await;
    assert_eq!(exit, Exit::Failure);
    let sessions = by_session(measured_turns(&run));
    for turns in sessions.values() {
        let outcomes: Vec<&str> = turns.iter().map(|t| t.outcome.as_str()).collect();
        match turns[0].session.as_str() {
            "alpha" => assert_eq!(outcomes, ["ok", "http"]),
            _ => assert_eq!(outcomes, ["ok", "ok"]),
        }
    }
    let summary = read_json(&run.join("summary.json"));
    let text = summary.to_string();
    assert!(
        text.contains("case 'chat' session 'alpha' stopped at turn 2 of 3"),
        "{summary:#}"
    );
    // summarize rebuilds the same rounds from exchanges/ alone: denominators and turns.
    let (code, rebuilt, err) = run_cmd(&["summarize", "--json", s(&run)]);
    assert_eq!(code, Some(1), "the run's failed ending is kept: {err}");
    let rebuilt: Value = serde_json::from_str(&rebuilt).unwrap();
    for (a, b) in summary["rounds"]
        .as_array()
        .unwrap()
        .iter()
        .zip(rebuilt["rounds"].as_array().unwrap())
    {
        for key in ["planned_requests", "attempted_requests", "turns"] {
            assert_eq!(a[key], b[key], "{key}");
        }
    }
    // Each round planned alpha's 3 turns and beta's 2, and attempted 4.
    let rounds = summary["rounds"].as_array().unwrap();
    assert_eq!(rounds.len(), 2);
    for r in rounds {
        assert_eq!(
            (&r["planned_requests"], &r["attempted_requests"]),
            (&json!(5), &json!(4)),
            "{r:#}"
        );
    }
    mock.shutdown().await;
}

#[tokio::test]
async fn a_turn_waits_its_think_time_after_the_previous_turn_ends() {
    let mock = start_mock(matrix_proxy::MockConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let mut case = chat_case("live");
    case["sessions"] = json!([{"id": "slow", "turns": [
        {"messages": user("first")},
        {"messages": user("second"), "think_seconds": 0.15}]}]);
    let mut plan = session_plan(&mock.url(), case);
    (plan["concurrency"], plan["requests_per_case"]) = (json!([1]), json!(1));
    let (run, exit) = replay_plan(dir.path(), &plan).await;
    assert_eq!(exit, Exit::Ok);
    let rows = Rows::read(&run);
    let (phase, turn) = (rows.strs("phase"), rows.i32s("turn"));
    let (start, total) = (rows.i64s("start_offset_us"), rows.i64s("total_us"));
    let (rep, measured) = (rows.i32s("repetition"), |i: usize| {
        phase[i].as_deref() == Some("measured")
    });
    for r in [0, 1] {
        let at = |k: i32| {
            (0..rows.len())
                .find(|&i| measured(i) && rep[i] == Some(r) && turn[i] == Some(k))
                .unwrap()
        };
        let (first, second) = (at(1), at(2));
        let gap = start[second].unwrap() - (start[first].unwrap() + total[first].unwrap());
        assert!(
            gap >= 150_000,
            "turn 2 sent {gap} µs after turn 1 ended, before its 0.15 s think time"
        );
    }
    mock.shutdown().await;
}

/// A client's chats through serve: each conversation's turns resend its history (the
/// last answer's message included), with the session in `x-session-id`.
async fn chat_through_serve(
    client: &mut Client,
    addr: std::net::SocketAddr,
    id: &str,
    turns: &[&str],
) {
    let mut messages = vec![json!({"role": "system", "content": "You are terse."})];
    for text in turns {
        messages.push(json!({"role": "user", "content": text}));
        let body = json!({"model": "mock", "max_tokens": 5, "messages": messages});
        let mut req = request(
            "POST",
            addr,
            "/v1/chat/completions",
            bytes::Bytes::from(body.to_string()),
        );
        req.headers_mut()
            .insert("content-type", "application/json".parse().unwrap());
        req.headers_mut()
            .insert("x-session-id", id.parse().unwrap());
        let (status, _, answer) = client.send(req).await.unwrap();
        assert_eq!(status, 200);
        let answer: Value = serde_json::from_slice(&answer).unwrap();
        messages.push(answer["choices"][0]["message"].clone());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_multi_turn_chats_through_serve_freeze_into_sessions_that_replay_green() {
    let tmp = tempfile::tempdir().unwrap();
    let mock = start_mock(matrix_proxy::MockConfig::default()).await;
    let live = tmp.path().join("live");
    let serve = Serve::start(serve_args(&mock.url(), &live)).await;
    let mut client = Client::connect(serve.addr).await;
    chat_through_serve(
        &mut client,
        serve.addr,
        "conv-a",
        &["Plan a trip.", "By train?", "Thanks."],
    )
    .await;
    chat_through_serve(
        &mut client,
        serve.addr,
        "conv-b",
        &["Name a prime.", "A larger one."],
    )
    .await;
    drop(client);
    serve.stop().await.unwrap();

    let plan_path = tmp.path().join("frozen.json");
    let (code, _, err) = run(&["freeze", s(&live), "--out", s(&plan_path)]);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("frozen as 2 session(s) of 5 turn(s) in all, history frozen, each named by its x-session-id header"), "{err}");
    let plan = read_json(&plan_path);
    let cases = plan["cases"].as_array().unwrap();
    assert_eq!(
        cases.len(),
        1,
        "the affinity header is the session's identity, not a case key: {plan:#}"
    );
    let case = &cases[0];
    assert_eq!(
        (&case["history"], &case["session_header"]),
        (&json!("frozen"), &json!("x-session-id"))
    );
    assert_eq!(case["request"], json!({"model": "mock", "max_tokens": 5}));
    let sessions = case["sessions"].as_array().unwrap();
    let ids: Vec<&str> = sessions.iter().map(|s| s["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["conv-a", "conv-b"]);
    let a = sessions[0]["turns"].as_array().unwrap();
    assert_eq!(a.len(), 3);
    // Turn 1 holds the system and user messages; later turns only what they add.
    assert_eq!(a[0]["messages"].as_array().unwrap().len(), 2);
    assert_eq!(
        a[1]["messages"],
        json!([{"role": "user", "content": "By train?"}])
    );
    assert_eq!(
        a[0]["answer"],
        a[0]["expected_response"]["choices"][0]["message"]
    );
    assert!(
        a[2].get("answer").is_none(),
        "the last turn's answer goes to no later turn"
    );

    // The frozen sessions replay the same requests and every turn passes its oracle.
    let dir = tmp.path().join("replay");
    std::fs::create_dir(&dir).unwrap();
    let mut plan = plan.clone();
    plan["endpoint"] = json!(format!("{}/v1/chat/completions", mock.url()));
    plan["health_endpoint"] = json!(format!("{}/health", mock.url()));
    let (run, exit) = replay_plan(&dir, &plan).await;
    assert_eq!(exit, Exit::Ok);
    let turns = measured_turns(&run);
    assert!(turns.iter().all(|t| t.outcome == "ok"));
    let last_of_a = turns
        .iter()
        .find(|t| t.session == "conv-a" && t.turn == 3)
        .unwrap();
    assert_eq!(last_of_a.request["messages"].as_array().unwrap().len(), 6);

    // --keep-timing: the same sessions in a trace, an entry per turn at its recorded
    // start, naming the turn; the trace replays every turn green, each turn due no
    // earlier than its recorded start.
    let timed_path = tmp.path().join("timed.json");
    let (code, _, err) = run_cmd(&["freeze", s(&live), "--keep-timing", "--out", s(&timed_path)]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains("each turn a trace entry at its recorded start"),
        "{err}"
    );
    let mut timed = read_json(&timed_path);
    assert_eq!(timed["cases"][0]["sessions"], case["sessions"]);
    let entries = timed["load"]["trace"]["entries"].as_array().unwrap();
    let named: Vec<&str> = entries
        .iter()
        .map(|e| e["variant"].as_str().unwrap())
        .collect();
    assert_eq!(
        named,
        ["conv-a/1", "conv-a/2", "conv-a/3", "conv-b/1", "conv-b/2"]
    );
    timed["endpoint"] = plan["endpoint"].clone();
    timed["health_endpoint"] = plan["health_endpoint"].clone();
    let dir = tmp.path().join("timed-replay");
    std::fs::create_dir(&dir).unwrap();
    let (timed_run, exit) = replay_plan(&dir, &timed).await;
    assert_eq!(exit, Exit::Ok);
    let rows = Rows::read(&timed_run);
    let (phase, lag) = (rows.strs("phase"), rows.i64s("session_lag_us"));
    let measured: Vec<usize> = (0..rows.len())
        .filter(|&i| phase[i].as_deref() == Some("measured"))
        .collect();
    let reps = timed["repetitions"].as_u64().unwrap_or(1) as usize;
    assert_eq!(measured.len(), 5 * reps, "every turn once a repetition");
    assert!(measured.iter().all(|&i| lag[i].is_some_and(|l| l >= 0)));
    let outcome = rows.strs("outcome");
    assert!(
        measured
            .iter()
            .all(|&i| outcome[i].as_deref() == Some("ok"))
    );
    mock.shutdown().await;
}

/// A chat worker whose answer is `hello` to a conversation's first turn (a system and a
/// user message) and `{tag} N` (N: the messages it was sent) to every later one.
async fn tagged_worker(tag: &'static str) -> std::net::SocketAddr {
    use http_body_util::{BodyExt, Full};
    http_server(move |req: hyper::Request<hyper::body::Incoming>| async move {
        let body = req.into_body().collect().await.unwrap().to_bytes();
        let n = serde_json::from_slice::<Value>(&body)
            .ok()
            .and_then(|v| v["messages"].as_array().map(Vec::len))
            .unwrap_or(0);
        let content = if n <= 2 { "hello".to_string() } else { format!("{tag} {n}") };
        let answer = json!({"id": "x", "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}]});
        hyper::Response::builder()
            .header("content-type", "application/json")
            .body(Full::new(bytes::Bytes::from(answer.to_string())))
            .unwrap()
    })
    .await
}

#[tokio::test]
async fn a_live_campaign_arm_that_diverges_at_turn_2_shows_it_per_turn_and_per_session() {
    let (reference, fit) = (tagged_worker("ref").await, tagged_worker("fit").await);
    let recipe = json!({"runtime": "test", "weight_format": "none", "weight_quantization": "none", "device": "cpu"});
    let arm = |name: &str, lane: &str, addr: std::net::SocketAddr| {
        json!({"name": name, "lane": lane, "recipe": recipe, "reference": name == "ref",
               "endpoint": format!("http://{addr}/v1/chat/completions")})
    };
    let mut case = chat_case("live");
    case["sessions"] = json!([{"id": "a", "turns": [
        {"messages": user("one")}, {"messages": user("two")}, {"messages": user("three")}]}]);
    let plan = json!({
        "name": "live-sessions", "arms": [arm("ref", "quality", reference), arm("fit", "performance-fit", fit)],
        "cases": [case], "concurrency": [1], "requests_per_case": 1, "repetitions": 2,
        "timeout_seconds": 5, "metadata": metadata(),
    });
    let dir = tempfile::tempdir().unwrap();
    let (run, _) = replay_plan(dir.path(), &plan).await;
    let c = read_json(&run.join("campaign.json"));
    let drift = c["drift"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["arm"] == "fit")
        .expect("fit's drift");
    assert_eq!(
        drift["turns"]["1"]["exact_match_rate"],
        json!(1.0),
        "{drift:#}"
    );
    assert_eq!(
        drift["turns"]["2"]["exact_match_rate"],
        json!(0.0),
        "{drift:#}"
    );
    assert!(
        drift["turns"].get("3").is_none(),
        "turn 3 answered other prompts on each side: {drift:#}"
    );
    assert_eq!(drift["off_trajectory_pairs"], json!(2), "{drift:#}");
    let firsts: Vec<&Value> = drift["trajectories"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| &t["first_divergence_turn"])
        .collect();
    assert_eq!(firsts, [&json!(2), &json!(2)], "{drift:#}");
    assert_eq!(
        drift["compared_prompts"],
        json!(4),
        "two repetitions of turns 1 and 2"
    );
}

/// Turn `turn`'s TTFT p50 (s) in each measured round of a run, and its rows' cached
/// prompt tokens.
fn turn_ttft_and_cached(run: &Path, turn: i64) -> (Vec<f64>, Vec<Option<i64>>) {
    let summary = read_json(&run.join("summary.json"));
    let ttft = summary["rounds"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r["turns"].as_array().unwrap().clone())
        .filter(|t| t["turn"] == json!(turn))
        .map(|t| t["ttft_seconds"]["p50"].as_f64().unwrap())
        .collect();
    let rows = Rows::read(run);
    let (phase, turns, cached) = (
        rows.strs("phase"),
        rows.i32s("turn"),
        rows.i64s("cached_prompt_tokens"),
    );
    let cached = (0..rows.len())
        .filter(|&i| phase[i].as_deref() == Some("measured") && turns[i] == Some(turn as i32))
        .map(|i| cached[i])
        .collect();
    (ttft, cached)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mocks_prefix_cache_makes_later_turns_faster_and_says_what_it_held() {
    let system: String = (0..150)
        .map(|i| format!("w{i}"))
        .collect::<Vec<_>>()
        .join(" ");
    let mut case = chat_case("live");
    case["cache_bust"] = json!(true);
    case["request"] = json!({"model": "mock", "max_tokens": 4, "stream": true,
        "stream_options": {"include_usage": true}, "messages": [{"role": "system", "content": system}]});
    case["sessions"] = json!([
        {"id": "a", "turns": [{"messages": user("first question")}, {"messages": user("second one")}]},
        {"id": "b", "turns": [{"messages": user("another start")}, {"messages": user("and more")}]}]);
    let mut runs = Vec::new();
    for blocks in [4096, 0] {
        let mock = start_mock(matrix_proxy::MockConfig {
            prefix_cache_blocks: blocks,
            prefill_per_token_ms: 0.2,
            ..matrix_proxy::MockConfig::default()
        })
        .await;
        let dir = tempfile::tempdir().unwrap();
        let mut plan = session_plan(&mock.url(), case.clone());
        plan["concurrency"] = json!([1]);
        let (run, exit) = replay_plan(dir.path(), &plan).await;
        assert_eq!(exit, Exit::Ok);
        runs.push((turn_ttft_and_cached(&run, 1), turn_ttft_and_cached(&run, 2)));
        mock.shutdown().await;
    }
    let [
        ((_, on_first), (on_ttft, on_cached)),
        ((_, off_first), (off_ttft, off_cached)),
    ] = &runs[..]
    else {
        unreachable!()
    };
    // With the cache, turn 1 (its own tag first) finds nothing and turn 2 finds the
    // conversation so far: 150 system tokens and more, in whole 16-token blocks.
    assert!(on_first.iter().all(|c| *c == Some(0)), "{on_first:?}");
    assert!(
        on_cached
            .iter()
            .all(|c| c.is_some_and(|n| n >= 144 && n % 16 == 0)),
        "{on_cached:?}"
    );
    // Without one, no answer says anything of cached tokens (null, never 0).
    assert!(
        off_cached.iter().chain(off_first).all(Option::is_none),
        "{off_cached:?}"
    );
    let median = |v: &[f64]| matrix_proxy_median(v);
    assert!(
        median(on_ttft) < 0.6 * median(off_ttft),
        "turn 2 TTFT with the prefix cache {on_ttft:?} is not well below without it {off_ttft:?}"
    );
}

fn matrix_proxy_median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_loops_arrival_starts_a_session_and_only_its_first_turn_has_a_schedule() {
    let mock = start_mock(matrix_proxy::MockConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let mut plan = session_plan(&mock.url(), chat_case("live"));
    for key in ["concurrency", "requests_per_case", "warmup_per_case"] {
        plan.as_object_mut().unwrap().remove(key);
    }
    plan["load"] =
        json!({"mode": "open", "arrival": "constant", "rates_per_second": [50], "requests": 4});
    let (run, exit) = replay_plan(dir.path(), &plan).await;
    assert_eq!(exit, Exit::Ok);
    let summary = read_json(&run.join("summary.json"));
    for r in summary["rounds"].as_array().unwrap() {
        // Four arrivals: alpha, beta, alpha, beta = 3 + 2 + 3 + 2 turns.
        assert_eq!(
            (&r["planned_requests"], &r["successful_requests"]),
            (&json!(10), &json!(10)),
            "{r:#}"
        );
    }
    let rows = Rows::read(&run);
    let (phase, turn, sched) = (
        rows.strs("phase"),
        rows.i32s("turn"),
        rows.i64s("scheduled_offset_us"),
    );
    let measured: Vec<usize> = (0..rows.len())
        .filter(|&i| phase[i].as_deref() == Some("measured"))
        .collect();
    assert_eq!(measured.len(), 20);
    for i in measured {
        assert_eq!(
            sched[i].is_some(),
            turn[i] == Some(1),
            "row {i}: turn {:?}, schedule {:?}",
            turn[i],
            sched[i]
        );
    }
    mock.shutdown().await;
}

#[tokio::test]
async fn a_live_session_of_whole_requests_to_another_api_goes_on_turn_after_turn() {
    let mock = start_mock(matrix_proxy::MockConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let completion = |p: &str| json!({"request": {"model": "mock", "prompt": p, "max_tokens": 3}});
    let case = json!({"name": "complete", "path": "/v1/completions", "history": "live",
        "sessions": [{"id": "c", "turns": [completion("once"), completion("upon"), completion("a time")]}]});
    let mut plan = session_plan(&mock.url(), case);
    (plan["concurrency"], plan["requests_per_case"]) = (json!([1]), json!(1));
    let (run, exit) = replay_plan(dir.path(), &plan).await;
    assert_eq!(exit, Exit::Ok);
    let turns = measured_turns(&run);
    assert_eq!(
        turns.len(),
        6,
        "two rounds of three turns: a completion's answer is not a chat message, and none is carried"
    );
    assert!(turns.iter().all(|t| t.outcome == "ok"));
    let summary = read_json(&run.join("summary.json"));
    assert!(
        summary["load"].get("notes").is_none(),
        "no session stopped: {summary:#}"
    );
    mock.shutdown().await;
}

/// A trace of sessions: an entry naming turn 1 starts a run, a later turn's entry gives its
/// offset, and the turn goes out at the later of that offset and the end of the turn
/// before it plus its think time, its session lag the difference.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_traces_session_turn_is_due_at_its_offset_or_after_the_turn_before_it() {
    let mock = start_mock(matrix_proxy::MockConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let mut case = chat_case("live");
    case["sessions"][0]["turns"][1]["think_seconds"] = json!(0.1);
    let mut plan = session_plan(&mock.url(), case);
    for key in ["concurrency", "requests_per_case", "warmup_per_case"] {
        plan.as_object_mut().unwrap().remove(key);
    }
    plan["repetitions"] = json!(1);
    let entry = |off: u64, v: &str| json!({"offset_us": off, "case": "chat", "variant": v});
    // At speedup 2: alpha/2 is given 5 ms but waits turn 1 and 100 ms of thought; alpha/3
    // is given 500 ms, after turn 2 has ended; beta/2 has no entry of its own.
    plan["load"] = json!({"mode": "trace", "speedup": 2, "trace": {"entries": [
        entry(0, "alpha/1"), entry(10_000, "alpha/2"), entry(30_000, "beta/1"),
        entry(1_000_000, "alpha/3")]}});
    let (run, exit) = replay_plan(dir.path(), &plan).await;
    assert_eq!(exit, Exit::Ok);
    let summary = read_json(&run.join("summary.json"));
    let round = &summary["rounds"][0];
    assert_eq!(
        (&round["planned_requests"], &round["successful_requests"]),
        (&json!(5), &json!(5)),
        "two runs, every turn planned: {round:#}"
    );
    let lag2 = round["turns"][1]["session_lag_seconds"]["p50"].as_f64();
    assert!(lag2.is_some_and(|l| l >= 0.09), "turn 2's lag: {lag2:?}");
    let rows = Rows::read(&run);
    let (phase, session, turn) = (
        rows.strs("phase"),
        rows.strs("session_id"),
        rows.i32s("turn"),
    );
    let (sched, lag) = (
        rows.i64s("scheduled_offset_us"),
        rows.i64s("session_lag_us"),
    );
    let (start, total) = (rows.i64s("start_offset_us"), rows.i64s("total_us"));
    let readiness = (0..rows.len()).filter(|&i| phase[i].as_deref() == Some("readiness"));
    assert_eq!(
        readiness.map(|i| turn[i]).collect::<Vec<_>>(),
        [Some(1), Some(2), Some(3)],
        "readiness runs the window's first run whole"
    );
    let at = |s: &str, k: i32| {
        (0..rows.len())
            .find(|&i| {
                phase[i].as_deref() == Some("measured")
                    && session[i].as_deref() == Some(s)
                    && turn[i] == Some(k)
            })
            .unwrap_or_else(|| panic!("no measured row of {s}/{k}"))
    };
    let (a1, a2, a3, b1, b2) = (
        at("alpha", 1),
        at("alpha", 2),
        at("alpha", 3),
        at("beta", 1),
        at("beta", 2),
    );
    let s0 = sched[a1].unwrap();
    let end = |i: usize| start[i].unwrap() + total[i].unwrap();
    assert_eq!(
        (lag[a1], lag[b1]),
        (Some(0), Some(0)),
        "a run's first turn is due at its offset"
    );
    assert_eq!(sched[b1], Some(s0 + 15_000));
    // alpha/2: due after turn 1 and its think time, later than its own 5 ms.
    let due2 = sched[a2].unwrap();
    assert!(
        due2 >= end(a1) + 100_000,
        "turn 2 due {due2}, turn 1 ended {}",
        end(a1)
    );
    assert_eq!(
        lag[a2],
        Some(due2 - (s0 + 5_000)),
        "its lag is due minus its own offset"
    );
    assert!(start[a2].unwrap() >= due2);
    // alpha/3: due at its own 500 ms, turn 2 having ended before.
    assert!(end(a2) < s0 + 500_000, "turn 2 ended at {}", end(a2));
    assert_eq!((sched[a3], lag[a3]), (Some(s0 + 500_000), Some(0)));
    assert!(start[a3].unwrap() >= s0 + 500_000);
    // beta/2: no entry, so due when beta/1 ended; no lag.
    assert_eq!(lag[b2], None);
    assert!(sched[b2].unwrap() >= end(b1) && start[b2].unwrap() >= sched[b2].unwrap());
    // summarize rebuilds the same per-turn numbers and denominators from the rows.
    let (code, stderr) = summarize(&run);
    assert_eq!(code, Some(0), "{stderr}");
    let rebuilt = read_json(&run.join("summary.json"));
    assert_eq!(rebuilt["planned_requests"], summary["planned_requests"]);
    for key in ["turns", "planned_requests", "open_loop"] {
        assert_eq!(rebuilt["rounds"][0][key], round[key], "{key}");
    }
    mock.shutdown().await;
}
