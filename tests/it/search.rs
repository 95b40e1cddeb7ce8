//! `replay --search` against the mock, whose knee is known: with `max_batch` B and a
//! prefill time, a closed loop of c <= B never queues and one of B + 1 always does, so
//! the highest concurrency within a TTFT bound between the prefill (20 ms, TTFT ~22 ms)
//! and a queued request's TTFT (~24 ms more: a batch's time) is B. The SLO is a p95 at ±3
//! points (203 requests a probe), bound 31 ms. At c = B + 1 the loop runs near lockstep and
//! a quarter of the requests wait (throughput stays B per batch time, so the mean wait is
//! a quarter of it); the p95's lower rank (~p92) falls two thirds into that quarter, a
//! p90's (~p85) 40 % into it. As the loop drifts out of phase on a busy machine, more
//! requests wait, each less, and the p90's lower bound came within 0.5 ms of a 32 ms bound
//! in a full local run (at 26 ms, c = B's p90 came within 3 ms of it on CI). The search
//! finds the knee over three seeds, says when a budget cannot decide, never answers a load
//! the generator could not hold, and gives a campaign's arms a capacity ratio its gate
//! reads.

use serde_json::{Value, json};

use crate::campaign::processes_with;
use crate::support::*;

/// A plan of one streamed case (no oracle: a capture plan) against `url`.
fn plan(url: &str, seed: u64) -> Value {
    json!({
        "name": "knee",
        "endpoint": format!("{url}/v1/chat/completions"),
        "health_endpoint": format!("{url}/health"),
        "cases": [{"name": "chat", "variants": [
            {"name": "a", "request": {"model": "mock", "max_tokens": 4, "stream": true,
             "messages": [{"role": "user", "content": "hi"}]}},
            {"name": "b", "request": {"model": "mock", "max_tokens": 4, "stream": true,
             "messages": [{"role": "user", "content": "hello there"}]}}]}],
        "load": {"mode": "closed", "seed": seed, "max_in_flight": 1},
        "concurrency": [2], "requests_per_case": 8, "repetitions": 2, "warmup_per_case": 2,
        "timeout_seconds": 10, "metadata": metadata(),
    })
}

/// `matrix-proxy replay --quiet --out OUT PLAN EXTRA...` as a process of its own (its
/// generator's CPU is its own, not every test's of this binary), which must end within
/// `secs`; its exit code.
async fn search(
    plan: &std::path::Path,
    out: &std::path::Path,
    extra: &[&str],
    secs: u64,
) -> Option<i32> {
    let mut argv = vec!["replay", "--quiet", "--out", s(out), s(plan)];
    argv.extend_from_slice(extra);
    let mut child = spawn_bin(argv);
    exit_code(&mut child, secs).await
}

fn mock(max_batch: usize, seed: u64) -> matrix_proxy::MockConfig {
    matrix_proxy::MockConfig {
        prefill_ms: 20.0,
        per_token_ms: 1.0,
        max_batch,
        text_seed: seed,
        log_requests: false,
        ..matrix_proxy::MockConfig::default()
    }
}

const KNEE: &[&str] = &[
    "--search",
    "concurrency",
    "--slo",
    "ttft_p95<=31ms",
    "--margin",
    "0.03",
    "--search-from",
    "3",
];

#[tokio::test]
async fn a_concurrency_search_finds_the_mocks_batch_size_over_three_seeds() {
    for seed in [1, 2, 3] {
        let m = start_mock(mock(4, seed)).await;
        let dir = tempfile::tempdir().unwrap();
        let path = write_plan(dir.path(), "p.json", &plan(&m.url(), seed));
        let out = dir.path().join("run");
        // The search ends within 60 s (exit_code panics past them).
        let exit = search(&path, &out, KNEE, 60).await;
        assert_eq!(exit, Some(0), "seed {seed}");
        let doc = read_json(&out.join("search.json"));
        let s = &doc["searches"][0];
        let a = &s["answer"];
        assert_eq!(
            (&a["load"], &a["first_fail"], &a["confirmed"], &s["stopped"]),
            (&json!(4.0), &json!(5.0), &json!(true), &json!("found")),
            "seed {seed}: {s:#}"
        );
        // p95 at ±3 points and 95 %: (z / 0.03)² 0.95 × 0.05 = 202.7, so 203 requests a
        // probe, each judged on its order statistics at ranks n p ∓ z √(n p (1 − p)): 186
        // and 199 for 203 requests, and for a straddling probe extended once, those of
        // its pooled count.
        let ranks = |n: f64| {
            let spread = 1.959_963_984_540_054 * (n * 0.95 * 0.05).sqrt();
            json!([
                (n * 0.95 - spread).floor() as u64,
                (n * 0.95 + spread - 1e-9).ceil() as u64
            ])
        };
        assert_eq!(ranks(203.0), json!([186, 199]));
        let probes = s["probes"].as_array().unwrap();
        assert!(probes.iter().all(|p| p["planned_requests"] == json!(203)));
        assert!(
            probes.iter().all(|p| {
                let judged = p["judged_requests"].as_f64().unwrap_or(0.0);
                (judged == 203.0 || judged == 406.0) && p["slos"][0]["ranks"] == ranks(judged)
            }),
            "seed {seed}: {s:#}"
        );
        // The confirmation: the best pass and the first fail, interleaved, twice each.
        let confirms: Vec<&Value> = probes
            .iter()
            .filter(|p| p["step"] == json!("confirm"))
            .map(|p| &p["load"])
            .collect();
        assert_eq!(
            confirms,
            [&json!(4.0), &json!(5.0), &json!(4.0), &json!(5.0)]
        );
        // Every probe's requests are measured rows at its concurrency, and its bound is
        // the order statistics of those rows' TTFTs.
        let rows = Rows::read(&out);
        let (phase, conc, rep) = (
            rows.strs("phase"),
            rows.i32s("concurrency"),
            rows.i32s("repetition"),
        );
        let ttft = rows.i64s("ttft_us");
        // An extension is judged on its rows pooled with those of the probe it extends.
        for (k, p) in probes.iter().enumerate() {
            let c = p["load"].as_f64().unwrap() as i32;
            let mut reps = vec![p["repetition"].as_i64().unwrap() as i32];
            if p["step"] == json!("extend") {
                reps.push(probes[k - 1]["repetition"].as_i64().unwrap() as i32);
            }
            let mut v: Vec<i64> = (0..rows.len())
                .filter(|&i| {
                    phase[i].as_deref() == Some("measured")
                        && conc[i] == Some(c)
                        && rep[i].is_some_and(|r| reps.contains(&r))
                })
                .map(|i| ttft[i].unwrap())
                .collect();
            assert_eq!(v.len(), 203 * reps.len(), "probe {p}");
            v.sort_unstable();
            let upper_rank = ranks(v.len() as f64)[1].as_u64().unwrap() as usize;
            let upper = p["slos"][0]["upper_ms"].as_f64().unwrap();
            assert!(
                (v[upper_rank - 1] as f64 / 1e3 - upper).abs() < 1e-9,
                "probe {p}"
            );
        }
        let summary = read_json(&out.join("summary.json"));
        assert_eq!(summary["complete"], json!(true), "{summary:#}");
        let config = read_json(&out.join("config.json"));
        assert_eq!(
            config["effective_budget"]["search"]["kind"],
            json!("concurrency")
        );
        m.shutdown().await;
    }
}

#[tokio::test]
async fn a_p99_slo_with_a_budget_too_small_says_it_cannot_be_decided() {
    let m = start_mock(mock(4, 1)).await;
    let dir = tempfile::tempdir().unwrap();
    let path = write_plan(dir.path(), "p.json", &plan(&m.url(), 1));
    let out = dir.path().join("run");
    let extra = [
        "--search",
        "concurrency",
        "--slo",
        "ttft_p99<=26ms",
        "--search-from",
        "1",
        "--budget-seconds",
        "2",
    ];
    assert_eq!(search(&path, &out, &extra, 60).await, Some(0));
    let s = read_json(&out.join("search.json"))["searches"][0].clone();
    assert_eq!(
        (&s["stopped"], &s["answer"]),
        (&json!("budget"), &Value::Null),
        "{s:#}"
    );
    // p99 at ±1 point and 95 %: 381 requests, about 9 s at c = 1: not started.
    let why = s["stopped_because"].as_str().unwrap();
    assert!(why.contains("needs 381 requests"), "{why}");
    assert!(
        why.contains("the SLOs could not be decided at any load"),
        "{why}"
    );
    assert_eq!(s["probes"], json!([]));
    m.shutdown().await;
}

#[tokio::test]
async fn a_probe_that_saturates_the_generator_is_never_the_answer() {
    // Eight requests in flight against a 50 ms server: 160/s at most, and sends fall
    // behind well before. The SLO is loose, so only the generator's lateness ends the
    // doubling.
    let m = start_mock(matrix_proxy::MockConfig {
        prefill_ms: 50.0,
        per_token_ms: 0.0,
        log_requests: false,
        ..matrix_proxy::MockConfig::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let mut p = plan(&m.url(), 1);
    p["load"]["max_in_flight"] = json!(8);
    let path = write_plan(dir.path(), "p.json", &p);
    let out = dir.path().join("run");
    let extra = [
        "--search",
        "rate",
        "--slo",
        "e2e_p50<=5s",
        "--margin",
        "0.15",
        "--search-from",
        "20",
    ];
    assert_eq!(search(&path, &out, &extra, 60).await, Some(0));
    let s = read_json(&out.join("search.json"))["searches"][0].clone();
    let probes = s["probes"].as_array().unwrap();
    let saturated: Vec<f64> = probes
        .iter()
        .filter(|p| p["verdict"] == json!("saturated") && p["step"] != json!("confirm"))
        .map(|p| p["load"].as_f64().unwrap())
        .collect();
    assert!(!saturated.is_empty(), "{s:#}");
    assert!(
        probes
            .iter()
            .filter(|p| p["verdict"] == json!("saturated"))
            .all(|p| p["saturation"].is_string())
    );
    let a = &s["answer"];
    let answer = a["load"].as_f64().unwrap();
    assert!(saturated.iter().all(|&l| l > answer), "{s:#}");
    assert_eq!(
        (&a["first_fail"], &s["stopped"]),
        (&Value::Null, &json!("generator_saturated"))
    );
    assert!(
        probes
            .iter()
            .any(|p| p["load"].as_f64() == Some(answer) && p["verdict"] == json!("pass"))
    );
    m.shutdown().await;
}

#[test]
fn a_campaign_s_capacity_gate_reads_each_arms_operating_point() {
    let tmp = tempfile::tempdir().unwrap();
    let arm = |name: &str, lane: &str, batch: &str| {
        json!({"name": name, "lane": lane, "reference": lane == "quality",
         "recipe": {"runtime": "matrix-proxy mock", "weight_format": "none", "weight_quantization": "none", "device": "cpu"},
         "endpoint": "http://127.0.0.1:{port}/v1/chat/completions",
         "start": {"command": ["{self}", "mock-worker", "--listen", "127.0.0.1:{port}",
            "--max-batch", batch, "--prefill-ms", "20", "--per-token-ms", "1", "--stall-ms", "85131"]}})
    };
    let mut p = plan("http://127.0.0.1:1", 1);
    for k in ["endpoint", "health_endpoint"] {
        p.as_object_mut().unwrap().remove(k);
    }
    p["cases"][0]["path"] = json!("/v1/chat/completions");
    p["arms"] = json!([
        arm("ref", "quality", "4"),
        arm("half", "performance-fit", "2")
    ]);
    let path = write_plan(tmp.path(), "p.json", &p);
    let contract = |min: f64| {
        json!({"contract_version": 2, "locked_at": "2026-01-01T00:00:00Z", "locked_by": "test",
            "plan_id": "knee", "thresholds": {"min_capacity_ratio": min}})
    };
    let c3 = write_plan(tmp.path(), "c3.json", &contract(0.3));
    let c8 = write_plan(tmp.path(), "c8.json", &contract(0.8));
    let out = tmp.path().join("run");
    let o = bin()
        .args([
            "replay",
            "--quiet",
            "--out",
            s(&out),
            "--contract",
            s(&c3),
            s(&path),
        ])
        .args(KNEE)
        .output()
        .unwrap();
    assert!(
        processes_with("85131").is_empty(),
        "left behind: {:?}",
        processes_with("85131")
    );
    let stderr = String::from_utf8_lossy(&o.stderr);
    let campaign = read_json(&out.join("campaign.json"));
    let points = campaign["operating_points"].as_array().unwrap();
    let point = |arm: &str| {
        points
            .iter()
            .find(|p| p["arm"] == json!(arm))
            .unwrap()
            .clone()
    };
    assert_eq!(
        (&point("ref")["last_pass"], &point("ref")["first_fail"]),
        (&json!(4.0), &json!(5.0)),
        "{stderr}"
    );
    assert_eq!(
        (&point("half")["last_pass"], &point("half")["first_fail"]),
        (&json!(2.0), &json!(3.0)),
        "{stderr}"
    );
    // [2 / 5, 3 / 4]: around one half; the gate passes at 0.3 ...
    let gate = |v: &Value| {
        v["gates"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["gate"] == json!("min_capacity_ratio"))
            .unwrap()["arms"][0]
            .clone()
    };
    let g = gate(&read_json(&out.join("verdict.json")));
    assert_eq!(g["pass"], json!(true), "{g:#}");
    assert_eq!(g["levels"][0]["interval"], json!([0.4, 0.75]), "{g:#}");
    // ... and fails at 0.8, read post hoc from the same run.
    let post = tmp.path().join("post.json");
    let o = bin()
        .args(["verdict", "--contract", s(&c8), "--out", s(&post), s(&out)])
        .output()
        .unwrap();
    assert!(
        o.status.code().is_some(),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let g = gate(&read_json(&post));
    assert_eq!(g["pass"], json!(false), "{g:#}");
}

#[test]
fn a_search_is_refused_where_it_cannot_run_with_the_reason() {
    let tmp = tempfile::tempdir().unwrap();
    let path = write_plan(tmp.path(), "p.json", &plan("http://127.0.0.1:9", 1));
    let out = tmp.path().join("run");
    for (extra, says) in [
        (
            &[
                "--search",
                "concurrency",
                "--slo",
                "ttft_p99<=1s",
                "--sweep",
                "3",
            ][..],
            "--search replaces --sweep",
        ),
        (&["--slo", "ttft_p99<=1s"][..], "--slo needs --search"),
        (&["--search", "concurrency"][..], "--search needs --slo"),
        (
            &["--search", "latency", "--slo", "ttft_p99<=1s"][..],
            "give rate",
        ),
        (
            &[
                "--search",
                "concurrency",
                "--slo",
                "ttft_p99<=1s",
                "--margin",
                "0.05",
            ][..],
            "give --margin at most 0.01",
        ),
        (
            &[
                "--search",
                "concurrency",
                "--slo",
                "ttft_p99<=1s",
                "--budget-seconds",
                "0",
            ][..],
            "--budget-seconds 0",
        ),
    ] {
        let o = bin()
            .args(["replay", "--quiet", "--out", s(&out), s(&path)])
            .args(extra)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{extra:?}: {stderr}");
        assert!(stderr.contains(says), "{extra:?}: {stderr}");
        assert!(
            !out.exists(),
            "{extra:?}: nothing is written before the input is checked"
        );
    }
}
