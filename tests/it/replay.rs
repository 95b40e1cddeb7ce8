//! Replay against purpose-built loopback peers: the exact request sequence a plan implies,
//! connection policies, Parquet read-back, and stop/drain on failure.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use matrix_proxy::cli::Exit;
use serde_json::{Value, json};

use crate::support::*;

/// One block of requests the plan implies, derived from BRIEF's phase rules
/// independently of the library's scheduler.
#[derive(Debug, Clone)]
struct Segment {
    phase: &'static str,
    case: String,
    concurrency: i32,
    repetition: Option<i32>,
    /// Expected variant per dispatch index ("" for a case without variants).
    variants: Vec<String>,
}

fn variants_of(case: &Value) -> Vec<(String, Value)> {
    match case.get("variants") {
        Some(vs) => vs
            .as_array()
            .unwrap()
            .iter()
            .map(|v| {
                (
                    v["name"].as_str().unwrap().to_string(),
                    v["request"].clone(),
                )
            })
            .collect(),
        None => vec![(String::new(), case["request"].clone())],
    }
}

fn expected_segments(plan: &Value) -> Vec<Segment> {
    let cases = plan["cases"].as_array().unwrap();
    let n = plan["requests_per_case"].as_u64().unwrap() as usize;
    let reps = plan.get("repetitions").and_then(Value::as_u64).unwrap_or(2) as i32;
    let warm = plan
        .get("warmup_per_case")
        .and_then(Value::as_u64)
        .unwrap_or(2) as usize;
    let conc: Vec<usize> = plan["concurrency"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_u64().unwrap() as usize)
        .collect();
    let mut out = Vec::new();
    for (phase, per) in [("readiness", 1), ("warmup", warm)] {
        for case in cases {
            for (v, _) in variants_of(case) {
                out.push(Segment {
                    phase,
                    case: case["name"].as_str().unwrap().into(),
                    concurrency: 1,
                    repetition: None,
                    variants: vec![v; per],
                });
            }
        }
    }
    for case in cases {
        let vs: Vec<String> = variants_of(case).into_iter().map(|(v, _)| v).collect();
        let by_index = |k: usize| (0..k).map(|i| vs[i % vs.len()].clone()).collect::<Vec<_>>();
        for &c in &conc {
            out.push(Segment {
                phase: "feasibility",
                case: case["name"].as_str().unwrap().into(),
                concurrency: c as i32,
                repetition: None,
                variants: by_index(c.min(n)),
            });
            for r in 0..reps {
                out.push(Segment {
                    phase: "measured",
                    case: case["name"].as_str().unwrap().into(),
                    concurrency: c as i32,
                    repetition: Some(r),
                    variants: by_index(n),
                });
            }
        }
    }
    out
}

/// The peer's log must follow the plan segment by segment (order inside a concurrent
/// wave is free), and the Parquet rows must carry the same (phase, case, variant,
/// dispatch_index) facts.
fn check_sequence(plan: &Value, seen: &[Seen], rows: &Rows) {
    let cases = plan["cases"].as_array().unwrap();
    let identify = |body: &[u8]| -> (String, String) {
        let v: Value = serde_json::from_slice(body).unwrap();
        for case in cases {
            for (name, req) in variants_of(case) {
                if req == v {
                    return (case["name"].as_str().unwrap().into(), name);
                }
            }
        }
        panic!("peer received a request the plan does not contain: {v}");
    };
    assert_eq!(seen[0].method, "GET", "the health GET comes first");
    let posts: Vec<(String, String)> = seen[1..]
        .iter()
        .map(|s| {
            assert_eq!(s.method, "POST");
            identify(&s.body)
        })
        .collect();
    let segments = expected_segments(plan);
    let total: usize = segments.iter().map(|s| s.variants.len()).sum();
    assert_eq!(posts.len(), total, "POSTs the peer received vs the plan");
    let mut at = 0;
    for seg in &segments {
        let mut got: Vec<(String, String)> = posts[at..at + seg.variants.len()].to_vec();
        let mut want: Vec<(String, String)> = seg
            .variants
            .iter()
            .map(|v| (seg.case.clone(), v.clone()))
            .collect();
        got.sort();
        want.sort();
        assert_eq!(got, want, "segment {seg:?} at request {at}");
        at += seg.variants.len();
    }

    // Rows: one per request, keyed like the segments.
    assert_eq!(
        rows.len(),
        seen.len(),
        "one row per request the peer received"
    );
    let phase = rows.strs("phase");
    let case = rows.strs("case_name");
    let variant = rows.strs("variant");
    let conc = rows.i32s("concurrency");
    let rep = rows.i32s("repetition");
    let idx = rows.i64s("dispatch_index");
    assert_eq!(
        phase
            .iter()
            .filter(|p| p.as_deref() == Some("health"))
            .count(),
        1
    );
    for seg in &segments {
        let mut got: Vec<(i64, String)> = (0..rows.len())
            .filter(|&i| {
                phase[i].as_deref() == Some(seg.phase)
                    && case[i].as_deref() == Some(seg.case.as_str())
                    && conc[i] == Some(seg.concurrency)
                    && rep[i] == seg.repetition
                    && (matches!(seg.phase, "feasibility" | "measured")
                        || variant[i].clone().unwrap_or_default() == seg.variants[0])
            })
            .map(|i| (idx[i].unwrap(), variant[i].clone().unwrap_or_default()))
            .collect();
        got.sort();
        let want: Vec<(i64, String)> = seg
            .variants
            .iter()
            .enumerate()
            .map(|(i, v)| (i as i64, v.clone()))
            .collect();
        assert_eq!(got, want, "rows of segment {seg:?}");
    }
}

fn fixture() -> Value {
    serde_json::from_slice(&std::fs::read("tests/fixtures/serving_matrix.example.json").unwrap())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_fixture_runs_unchanged_with_22_posts_and_1_get() {
    let plan = fixture();
    let expected = plan["cases"][0]["expected_response"].clone();
    let peer = Peer::start(Arc::new(move |_, s: &Seen| {
        if s.method == "GET" && s.path == "/health" {
            Reply::json(200, &json!({"status": "ok"}))
        } else if s.method == "POST" && s.path == "/v1/systemone" {
            Reply::json(200, &expected)
        } else {
            Reply::json(404, &json!({"error": "unexpected"}))
        }
    }))
    .await;
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    let mut args = replay_args(
        std::path::Path::new("tests/fixtures/serving_matrix.example.json"),
        &out,
    );
    args.endpoint = Some(peer.url("/v1/systemone"));
    assert_eq!(replay(args).await.unwrap(), Exit::Ok);

    let seen = peer.seen();
    let gets = seen.iter().filter(|s| s.method == "GET").count();
    let posts = seen.iter().filter(|s| s.method == "POST").count();
    assert_eq!((posts, gets), (22, 1));
    let rows = Rows::read(&out);
    check_sequence(&plan, &seen, &rows);
    // Every request carried the plan's body, JSON-typed, to the right path and host.
    for s in &seen[1..] {
        assert_eq!(s.path, "/v1/systemone");
        assert_eq!(&s.body[..], br#"{"model":"test"}"#);
        let h: BTreeMap<_, _> = s.headers.iter().cloned().collect();
        assert_eq!(
            h.get("content-type").map(String::as_str),
            Some("application/json")
        );
        assert_eq!(h.get("host"), Some(&peer.addr.to_string()));
        assert!(
            !h.contains_key("authorization"),
            "no token unless one is named"
        );
    }
    // The plan is kept byte for byte, and the summary has the seed's keys.
    assert_eq!(
        std::fs::read(out.join("plan.json")).unwrap(),
        std::fs::read("tests/fixtures/serving_matrix.example.json").unwrap()
    );
    let summary = read_json(&out.join("summary.json"));
    for key in [
        "complete",
        "failures",
        "rounds",
        "round_aggregates",
        "excluded_phases",
    ] {
        assert!(summary.get(key).is_some(), "summary.json lacks {key}");
    }
    assert_eq!(summary["complete"], json!(true));
    assert_eq!(summary["rounds"].as_array().unwrap().len(), 4);
    let round = &summary["rounds"][0];
    for key in [
        "case",
        "concurrency",
        "repetition",
        "planned_requests",
        "attempted_requests",
        "successful_requests",
        "elapsed_seconds",
        "successful_requests_per_second",
        "successful_latency_seconds",
        "failures",
        "failure_latency_seconds",
        "complete",
        "steady_state",
        "throughput_scope",
    ] {
        assert!(round.get(key).is_some(), "round lacks {key}");
    }
    let agg = &summary["round_aggregates"][0];
    for key in [
        "case",
        "concurrency",
        "planned_rounds",
        "attempted_rounds",
        "complete_rounds",
        "incomplete_rounds",
        "metrics",
    ] {
        assert!(agg.get(key).is_some(), "aggregate lacks {key}");
    }
    let config = read_json(&out.join("config.json"));
    assert_eq!(config["connection_policy"], json!("fresh"));
    assert_eq!(config["effective_budget"]["repetitions"], json!(2));
    assert_eq!(config["effective_budget"]["warmup_per_case"], json!(2));
    assert!(config["finished_at"].as_str().unwrap().ends_with('Z'));
    assert_eq!(
        config["extra"]["endpoint_override"],
        json!(peer.url("/v1/systemone"))
    );
    let sha = matrix_proxy::sha256_hex(
        &std::fs::read("tests/fixtures/serving_matrix.example.json").unwrap(),
    );
    assert_eq!(config["plan_sha256"], json!(sha));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_fixture_with_a_top_level_ignore_path_and_a_volatile_timer_passes_with_its_decisions()
{
    // The fixture as a seed plan that excludes the server's native timer.
    let mut plan = fixture();
    plan["ignore_paths"] = json!(["/metadata/inference_seconds"]);
    plan["cases"][0]["expected_response"]["metadata"] = json!({"inference_seconds": 0.0});
    let answers = plan["cases"][0]["expected_response"]["answers"].clone();
    let peer = Peer::start(Arc::new(move |i, s: &Seen| {
        if s.method == "GET" && s.path == "/health" {
            Reply::json(200, &json!({"status": "ok"}))
        } else {
            // A different timer every time.
            let t = 0.001 * (i as f64 + 1.0) + 0.000_123;
            Reply::json(
                200,
                &json!({"answers": answers, "metadata": {"inference_seconds": t}}),
            )
        }
    }))
    .await;
    let tmp = tempfile::tempdir().unwrap();
    plan["endpoint"] = json!(peer.url("/v1/systemone"));
    plan["health_endpoint"] = json!(peer.url("/health"));
    let (out, exit) = replay_plan(tmp.path(), &plan).await;
    assert_eq!(exit, Exit::Ok);
    let seen = peer.seen();
    let gets = seen.iter().filter(|s| s.method == "GET").count();
    let posts = seen.iter().filter(|s| s.method == "POST").count();
    assert_eq!((posts, gets), (22, 1));

    // Every answer carries two decisions ({"a": ..., "b": ...}); the health check none.
    let rows = Rows::read(&out);
    let phase = rows.strs("phase");
    let decisions = rows.i64s("decisions");
    for i in 0..rows.len() {
        let want = if phase[i].as_deref() == Some("health") {
            None
        } else {
            Some(2)
        };
        assert_eq!(decisions[i], want, "row {i} ({:?})", phase[i]);
    }
    let summary = read_json(&out.join("summary.json"));
    assert_eq!(summary["complete"], json!(true));
    for r in summary["rounds"].as_array().unwrap() {
        // 4 requests x 2 decisions per round, over the same elapsed time as requests/s.
        assert_eq!(r["successful_decisions"], json!(8));
        let rps = r["successful_requests_per_second"].as_f64().unwrap();
        let dps = r["successful_decisions_per_second"].as_f64().unwrap();
        assert!((dps - 2.0 * rps).abs() < 1e-9 * dps, "{dps} vs {rps}");
        assert_eq!(r["failure_latency_seconds"], json!([]));
        assert_eq!(r["failure_latency_percentiles_seconds"], Value::Null);
        let ss = &r["steady_state"];
        if r["concurrency"] == json!(1) {
            // n = 4, c = 1: the window holds completions 2 and 3.
            assert_eq!((&ss["requests"], &ss["decisions"]), (&json!(2), &json!(4)));
            let rate = ss["requests_per_second"].as_f64().unwrap();
            let drate = ss["decisions_per_second"].as_f64().unwrap();
            assert!((drate - 2.0 * rate).abs() < 1e-9 * drate);
        } else {
            assert_eq!(ss["decisions"], Value::Null);
        }
    }
    let rounds = Rows::read_file(&out.join("rounds.parquet"));
    assert_eq!(rounds.i64s("successful_decisions"), vec![Some(8); 4]);
    // One integer type for concurrency and repetition in every file: joins need no cast.
    assert_eq!(
        rounds.i32s("concurrency"),
        vec![Some(1), Some(1), Some(2), Some(2)]
    );
    assert_eq!(
        rounds.i32s("repetition"),
        vec![Some(0), Some(1), Some(0), Some(1)]
    );
    assert_eq!(
        rounds.i64s("steady_state_decisions"),
        vec![Some(4), Some(4), None, None]
    );
    let agg = &summary["round_aggregates"][0]["metrics"];
    assert_eq!(agg["successful_decisions_per_second"]["rounds"], json!(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failure_latencies_are_listed_in_completion_order_as_the_seed_does() {
    // Case "m" always fails (500): its variants alternate, "slow" answered in 80 ms and
    // "fast" in 5 ms, so with two workers completions come in another order than dispatch.
    let peer = Peer::start(Arc::new(|_, s: &Seen| {
        if s.method == "GET" {
            return Reply::json(200, &json!({}));
        }
        let body: Value = serde_json::from_slice(&s.body).unwrap();
        if body.get("m").is_none() {
            return Reply::json(200, &json!({"answers": [1, 2, 3]}));
        }
        let mut r = Reply::json(500, &json!({}));
        let slow = body.get("slow").is_some();
        r.delay = std::time::Duration::from_millis(if slow { 80 } else { 5 });
        r
    }))
    .await;
    let tmp = tempfile::tempdir().unwrap();
    let plan = json!({
        "endpoint": peer.url("/v1/x"),
        "on_failure": "continue",
        "cases": [
            {"name": "ok", "request": {"w": 1}, "expected_response": {"answers": [1, 2, 3]}},
            {"name": "m", "variants": [
                {"name": "slow", "request": {"m": 1, "slow": 1}, "expected_response": {"answers": []}},
                {"name": "fast", "request": {"m": 1}, "expected_response": {"answers": []}}]}
        ],
        "concurrency": [2], "requests_per_case": 6, "timeout_seconds": 2, "metadata": metadata(),
    });
    let (out, exit) = replay_plan(tmp.path(), &plan).await;
    assert_eq!(exit, Exit::Failure);
    let rows = Rows::read(&out);
    let summary = read_json(&out.join("summary.json"));
    let (case, rep, phase) = (
        rows.strs("case_name"),
        rows.i32s("repetition"),
        rows.strs("phase"),
    );
    let (outcome, total, id) = (
        rows.strs("outcome"),
        rows.i64s("total_us"),
        rows.i64s("exchange_id"),
    );
    let (start, index) = (rows.i64s("start_offset_us"), rows.i64s("dispatch_index"));
    let mut reordered = false;
    for r in summary["rounds"].as_array().unwrap() {
        let mut failed: Vec<(i64, i64, i64, f64)> = (0..rows.len())
            .filter(|&i| {
                phase[i].as_deref() == Some("measured")
                    && case[i].as_deref() == r["case"].as_str()
                    && rep[i] == Some(r["repetition"].as_i64().unwrap() as i32)
                    && outcome[i].as_deref() != Some("ok")
            })
            .map(|i| {
                let t = total[i].unwrap();
                (
                    start[i].unwrap() + t,
                    id[i].unwrap(),
                    index[i].unwrap(),
                    t as f64 / 1e6,
                )
            })
            .collect();
        failed.sort_by_key(|f| (f.0, f.1));
        let want: Vec<f64> = failed.iter().map(|f| f.3).collect();
        assert_eq!(r["failure_latency_seconds"], json!(want), "{}", r["case"]);
        if r["case"] == json!("m") {
            assert_eq!(want.len(), 6);
            assert!(r["failure_latency_percentiles_seconds"]["p50"].is_number());
            let by_dispatch: Vec<i64> = failed.iter().map(|f| f.2).collect();
            reordered |= by_dispatch.windows(2).any(|w| w[0] > w[1]);
        }
        // Only the successful answers' decisions count: three each.
        assert_eq!(
            r["successful_decisions"],
            json!(3 * r["successful_requests"].as_u64().unwrap())
        );
    }
    assert!(
        reordered,
        "completions came in dispatch order: the test proves nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn variants_answering_one_and_three_decisions_make_eight_per_round_of_four() {
    // The seed's example, end to end: variants answering 1 and 3 entries alternately.
    let peer = Peer::start(Arc::new(|_, s: &Seen| {
        if s.method == "GET" {
            return Reply::json(200, &json!({}));
        }
        let body: Value = serde_json::from_slice(&s.body).unwrap();
        let n = body["n"].as_u64().unwrap();
        let answers: serde_json::Map<String, Value> =
            (0..n).map(|i| (format!("q{i}"), json!(i))).collect();
        Reply::json(200, &json!({"answers": answers}))
    }))
    .await;
    let v = |n: u64| {
        let answers: serde_json::Map<String, Value> =
            (0..n).map(|i| (format!("q{i}"), json!(i))).collect();
        json!({"name": format!("n{n}"), "request": {"n": n}, "expected_response": {"answers": answers}})
    };
    let tmp = tempfile::tempdir().unwrap();
    let plan = json!({
        "endpoint": peer.url("/v1/x"),
        "cases": [{"name": "alt", "variants": [v(1), v(3)]}],
        "concurrency": [1, 2], "requests_per_case": 4, "timeout_seconds": 2, "metadata": metadata(),
    });
    let (out, exit) = replay_plan(tmp.path(), &plan).await;
    assert_eq!(exit, Exit::Ok);
    let summary = read_json(&out.join("summary.json"));
    for r in summary["rounds"].as_array().unwrap() {
        assert_eq!(r["successful_decisions"], json!(8), "{r}");
    }
}

fn variant_plan(endpoint: &str, connection: &str) -> Value {
    let v = |name: &str| json!({"name": name, "request": {"v": name}, "expected_response": {"echo": {"v": name}}});
    json!({
        "endpoint": endpoint,
        "connection": connection,
        "cases": [
            {"name": "alpha", "variants": [v("a"), v("b"), v("c")]},
            {"name": "beta", "request": {"v": "beta", "n": [1, 2.5, true]}, "expected_response": {"echo": {"v": "beta", "n": [1, 2.5, true]}}}
        ],
        "concurrency": [1, 3],
        "requests_per_case": 5,
        "repetitions": 2,
        "warmup_per_case": 3,
        "timeout_seconds": 5,
        "metadata": metadata(),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn variants_and_budgets_follow_the_plan_with_both_connection_policies() {
    for connection in ["fresh", "keep-alive"] {
        let peer = Peer::start(echo_handler()).await;
        let tmp = tempfile::tempdir().unwrap();
        let plan = variant_plan(&peer.url("/v1/echo"), connection);
        let path = write_plan(tmp.path(), "variants.json", &plan);
        let out = tmp.path().join("run");
        assert_eq!(
            replay(replay_args(&path, &out)).await.unwrap(),
            Exit::Ok,
            "{connection}"
        );
        let seen = peer.seen();
        // 1 GET + readiness 4 + warmup 12 + alpha (1+10 + 3+10) + beta (1+10 + 3+10)
        assert_eq!(seen.len(), 1 + 4 + 12 + 24 + 24, "{connection}");
        let rows = Rows::read(&out);
        check_sequence(&plan, &seen, &rows);

        let phase = rows.strs("phase");
        let conn_id = rows.i64s("connection_id");
        let reused = rows.bools("connection_reused");
        let connect = rows.i64s("connect_us");
        let measured: Vec<usize> = (0..rows.len())
            .filter(|&i| phase[i].as_deref() == Some("measured"))
            .collect();
        let distinct: std::collections::BTreeSet<i64> =
            measured.iter().map(|&i| conn_id[i].unwrap()).collect();
        // A one-shot connection says so (the worker then closes first and keeps the
        // TIME_WAIT state); a kept-alive one does not.
        let says_close = |s: &Seen| {
            s.headers
                .iter()
                .any(|(k, v)| k == "connection" && v == "close")
        };
        assert!(
            seen.iter()
                .skip(1)
                .all(|s| says_close(s) == (connection == "fresh")),
            "{connection}"
        );
        if connection == "fresh" {
            assert_eq!(
                distinct.len(),
                measured.len(),
                "fresh: a new connection per request"
            );
            assert!(
                measured
                    .iter()
                    .all(|&i| reused[i] == Some(false) && connect[i].is_some())
            );
        } else {
            // keep-alive: workers keep their connections across phases and rounds
            assert!(
                distinct.len() <= 3,
                "keep-alive used {} connections",
                distinct.len()
            );
            assert!(
                measured
                    .iter()
                    .all(|&i| reused[i] == Some(true) && connect[i].is_none())
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exchanges_parquet_is_typed_and_holds_the_exact_bytes() {
    let peer = Peer::start(echo_handler()).await;
    let tmp = tempfile::tempdir().unwrap();
    let plan = variant_plan(&peer.url("/v1/echo?x=1"), "keep-alive");
    let (out, exit) = replay_plan(tmp.path(), &plan).await;
    assert_eq!(exit, Exit::Ok);
    let files = part_files(&out);
    let batches = read_parquet(&files[0]);
    let schema = batches[0].schema();
    let ty = |n: &str| schema.field_with_name(n).unwrap().data_type().to_string();
    assert_eq!(ty("started_at"), "Timestamp(µs, \"UTC\")");
    for n in [
        "exchange_id",
        "dispatch_index",
        "start_offset_us",
        "total_us",
        "first_byte_us",
        "connect_us",
        "request_body_len",
    ] {
        assert_eq!(ty(n), "Int64", "{n}");
    }
    for n in ["request_body", "response_body"] {
        assert_eq!(ty(n), "Binary", "{n}");
    }
    assert!(
        ty("request_headers").starts_with("List("),
        "{}",
        ty("request_headers")
    );
    for n in ["phase", "case_name", "outcome", "url", "method"] {
        assert_eq!(ty(n), "Utf8", "{n}");
    }
    let meta = parquet::file::reader::FileReader::metadata(
        &parquet::file::serialized_reader::SerializedFileReader::new(
            std::fs::File::open(&files[0]).unwrap(),
        )
        .unwrap(),
    )
    .file_metadata()
    .key_value_metadata()
    .cloned()
    .unwrap();
    assert!(
        meta.iter()
            .any(|kv| kv.key == "matrix_proxy.schema_version" && kv.value.as_deref() == Some("1"))
    );

    let rows = Rows::read(&out);
    let seen = peer.seen();
    assert_eq!(rows.len(), seen.len());
    // Bodies, byte for byte, in both directions: every request body the peer got is in
    // the rows, and every recorded response is the peer's echo of its request.
    let mut sent: Vec<Vec<u8>> = rows.bins("request_body");
    let mut got: Vec<Vec<u8>> = seen.iter().map(|s| s.body.to_vec()).collect();
    sent.sort();
    got.sort();
    assert_eq!(sent, got);
    let req = rows.bins("request_body");
    let resp = rows.bins("response_body");
    let phase = rows.strs("phase");
    for i in 0..rows.len() {
        if phase[i].as_deref() == Some("health") {
            assert_eq!(resp[i], br#"{"status":"ok"}"#);
            continue;
        }
        let r: Value = serde_json::from_slice(&req[i]).unwrap();
        assert_eq!(resp[i], serde_json::to_vec(&json!({"echo": r})).unwrap());
    }
    let ids = rows.i64s("exchange_id");
    let mut sorted: Vec<i64> = ids.iter().map(|v| v.unwrap()).collect();
    sorted.sort();
    assert_eq!(
        sorted,
        (0..rows.len() as i64).collect::<Vec<_>>(),
        "exchange ids are unique and dense"
    );
    // Timers are ordered as documented.
    let (sent_us, fb, fbody, total) = (
        rows.i64s("request_sent_us"),
        rows.i64s("first_byte_us"),
        rows.i64s("first_body_us"),
        rows.i64s("total_us"),
    );
    for i in 0..rows.len() {
        let s = sent_us[i].unwrap();
        assert!(
            s <= fb[i].unwrap()
                && fb[i].unwrap() <= fbody[i].unwrap()
                && fbody[i].unwrap() <= total[i].unwrap(),
            "row {i}"
        );
    }
    let urls = rows.strs("url");
    assert!(
        urls.iter()
            .skip(1)
            .all(|u| u.as_deref() == Some(&*peer.url("/v1/echo?x=1")))
    );
    let status = rows.i32s("status");
    assert!(status.iter().all(|s| *s == Some(200)));
    // rounds.parquet has one row per measured round.
    let rounds = read_parquet(&out.join("rounds.parquet"));
    assert_eq!(
        rounds.iter().map(|b| b.num_rows()).sum::<usize>(),
        2 * 2 * 2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_failure_stops_dispatch_drains_in_flight_and_skips_later_phases() {
    // Every request takes 30 ms; request 17 (0-based, the health GET is 0) fails with
    // 500. That is the second request of alpha's first measured round at c = 3, while
    // requests 16 and 18 are in flight: they must drain and be recorded.
    const FAIL_AT: usize = 17;
    let handler: Handler = Arc::new(|i, s: &Seen| {
        let mut r = if s.method == "GET" {
            Reply::json(200, &json!({"status": "ok"}))
        } else if i == FAIL_AT {
            Reply::json(500, &json!({"error": "injected"}))
        } else {
            let req: Value = serde_json::from_slice(&s.body).unwrap();
            Reply::json(200, &json!({"echo": req}))
        };
        r.delay = Duration::from_millis(30);
        r
    });
    let peer = Peer::start(handler).await;
    let tmp = tempfile::tempdir().unwrap();
    let mut plan = variant_plan(&peer.url("/v1/echo"), "keep-alive");
    plan["concurrency"] = json!([3]);
    plan["warmup_per_case"] = json!(2);
    let (out, exit) = replay_plan(tmp.path(), &plan).await;
    assert_eq!(exit, Exit::Failure);
    let seen = peer.seen();
    let rows = Rows::read(&out);
    // Nothing lost: every request the peer received has its row.
    assert_eq!(rows.len(), seen.len());
    // 1 + readiness 4 + warmup 8 = 13; alpha feasibility 3 = 16; measured round 0 starts
    // at request 16 with 16, 17, 18 in flight together. The other c - 1 = 2 workers may
    // each have started one more before the failure was seen; nothing after that.
    assert!(
        seen.len() > FAIL_AT && seen.len() <= FAIL_AT + 1 + 2 * 2,
        "peer saw {}",
        seen.len()
    );
    let outcome = rows.strs("outcome");
    assert_eq!(
        outcome
            .iter()
            .filter(|o| o.as_deref() == Some("http"))
            .count(),
        1
    );
    let phase = rows.strs("phase");
    let case = rows.strs("case_name");
    assert!(
        !(0..rows.len())
            .any(|i| case[i].as_deref() == Some("beta") && phase[i].as_deref() == Some("measured"))
    );
    let summary = read_json(&out.join("summary.json"));
    assert_eq!(summary["complete"], json!(false));
    assert_eq!(summary["failures"], json!({"http": 1}));
    let rounds = summary["rounds"].as_array().unwrap();
    assert_eq!(rounds.len(), 1, "only the interrupted round was attempted");
    assert_eq!(rounds[0]["complete"], json!(false));
    assert_eq!(rounds[0]["planned_requests"], json!(5));
    assert_eq!(
        rounds[0]["attempted_requests"].as_u64().unwrap() as usize,
        seen.len() - 16
    );
    assert_eq!(rounds[0]["failures"], json!({"http": 1}));
    assert_eq!(rounds[0]["steady_state"]["available"], json!(false));
    let aggs = summary["round_aggregates"].as_array().unwrap();
    assert_eq!(aggs[0]["attempted_rounds"], json!(1));
    assert_eq!(aggs[0]["complete_rounds"], json!(0));
    assert_eq!(
        aggs[0]["metrics"]["successful_requests_per_second"],
        Value::Null
    );
    assert_eq!(aggs[1]["attempted_rounds"], json!(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_failure_continue_runs_the_whole_budget() {
    let handler: Handler = Arc::new(|i, s: &Seen| {
        if s.method == "GET" {
            Reply::json(200, &json!({"status": "ok"}))
        } else if i % 7 == 3 {
            Reply::json(503, &json!({"error": "busy"}))
        } else {
            let req: Value = serde_json::from_slice(&s.body).unwrap();
            Reply::json(200, &json!({"echo": req}))
        }
    });
    let peer = Peer::start(handler).await;
    let tmp = tempfile::tempdir().unwrap();
    let mut plan = variant_plan(&peer.url("/v1/echo"), "fresh");
    plan["on_failure"] = json!("continue");
    let (out, exit) = replay_plan(tmp.path(), &plan).await;
    assert_eq!(exit, Exit::Failure);
    let seen = peer.seen();
    assert_eq!(seen.len(), 65, "the whole budget ran");
    let rows = Rows::read(&out);
    assert_eq!(rows.len(), 65);
    let failed = (0..65).filter(|i| i % 7 == 3).count();
    let outcome = rows.strs("outcome");
    assert_eq!(
        outcome
            .iter()
            .filter(|o| o.as_deref() == Some("http"))
            .count(),
        failed
    );
    let summary = read_json(&out.join("summary.json"));
    assert_eq!(summary["failures"], json!({"http": failed}));
    let rounds = summary["rounds"].as_array().unwrap();
    assert_eq!(rounds.len(), 8);
    let attempted: u64 = rounds
        .iter()
        .map(|r| r["attempted_requests"].as_u64().unwrap())
        .sum();
    assert_eq!(attempted, 40);
}
