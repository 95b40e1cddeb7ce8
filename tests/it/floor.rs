//! The reference's own noise floor: a campaign pairs the reference's answers across its
//! repetitions, so an arm that differs from the reference only as much as the reference
//! differs from itself is seen to be at the floor.

use serde_json::{Value, json};

use crate::support::*;

fn arm(name: &str, lane: &str, reference: bool, mock_flags: &[&str]) -> Value {
    let mut command = vec!["{self}", "mock-worker", "--listen", "127.0.0.1:{port}"];
    command.extend(mock_flags);
    json!({"name": name, "lane": lane, "reference": reference,
           "recipe": {"runtime": "matrix-proxy mock", "weight_format": "none",
                      "weight_quantization": name, "device": "cpu"},
           "endpoint": "http://127.0.0.1:{port}/v1/chat/completions",
           "start": {"command": command}})
}

/// A campaign of `arms` over 30 prompts (the floor-relative gates' minimum of distinct
/// requests), each sent once a round, 3 rounds.
fn campaign(arms: Value) -> Value {
    let variants: Vec<Value> = (0..30)
        .map(|i| {
            json!({"name": format!("p{i}"),
                   "request": {"messages": [{"role": "user", "content": format!("prompt number {i}")}],
                               "max_tokens": 6}})
        })
        .collect();
    json!({"name": "floor", "arms": arms,
           "cases": [{"name": "chat", "variants": variants}],
           "concurrency": [1], "requests_per_case": 30, "repetitions": 3,
           "timeout_seconds": 10, "metadata": metadata()})
}

fn run_campaign(dir: &std::path::Path, plan: &Value) -> (Value, String) {
    let path = write_plan(dir, "campaign.json", plan);
    let out = dir.join("run");
    let (code, table, err) = run(&["replay", s(&path), "--out", s(&out)]);
    assert_eq!(code, Some(0), "{err}");
    (read_json(&out.join("campaign.json")), table + &err)
}

#[test]
fn a_twin_of_a_nondeterministic_reference_is_at_its_floor() {
    let tmp = tempfile::tempdir().unwrap();
    let noisy = ["--nondeterministic-share", "0.3"];
    let (c, text) = run_campaign(
        tmp.path(),
        &campaign(json!([
            arm("ref", "quality", true, &noisy),
            arm("twin", "quality", false, &noisy),
            arm("other", "performance-fit", false, &["--text-seed", "5"]),
        ])),
    );
    let floor = &c["drift_floor"];
    assert_eq!(floor["reference_arm"], json!("ref"));
    assert_eq!(floor["reason"], Value::Null);
    // 30 prompts, 3 repetitions: 3 pairs of repetitions each.
    assert_eq!(floor["compared_prompts"], json!(90));
    assert_eq!(floor["concurrency"]["1"]["compared_prompts"], json!(90));
    assert_eq!(floor["distinct_requests"], json!(30));
    let rate = floor["exact_match_rate"].as_f64().unwrap();
    // The prompts answered differently every time are a fixed share (seeded): the
    // floor is the others' share, well below 1 and above 0.
    assert!(rate < 1.0 && (rate - 0.7).abs() <= 0.2, "{floor}");
    let entry = |name: &str| {
        c["drift"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["arm"] == json!(name))
            .unwrap()
            .clone()
    };
    // The twin differs from the reference exactly where the reference differs from
    // itself: at the floor.
    let twin = entry("twin");
    assert_eq!(twin["exact_match_rate"].as_f64(), Some(rate), "{twin}");
    assert_eq!(twin["floor_exact_match_rate"].as_f64(), Some(rate));
    assert_eq!(twin["exact_match_rate_minus_floor"].as_f64(), Some(0.0));
    // An arm with another text is far below it.
    let other = entry("other");
    let below = other["exact_match_rate_minus_floor"].as_f64().unwrap();
    assert!(below < -0.3, "{other}");
    assert!(
        text.contains(
            "drift floor (ref vs itself, pairs of repetitions): 90 pairs of 30 distinct requests"
        ),
        "{text}"
    );
    assert!(
        text.contains("(+0.0 points from the reference's own floor)"),
        "{text}"
    );
}

#[test]
fn a_deterministic_reference_has_a_floor_of_one() {
    let tmp = tempfile::tempdir().unwrap();
    let (c, _) = run_campaign(
        tmp.path(),
        &campaign(json!([
            arm("ref", "quality", true, &[]),
            arm("twin", "quality", false, &[]),
        ])),
    );
    assert_eq!(c["drift_floor"]["exact_match_rate"], json!(1.0));
    assert_eq!(c["drift_floor"]["mean_similarity"], json!(1.0));
    assert_eq!(c["drift"][0]["exact_match_rate_minus_floor"], json!(0.0));
}

/// A contract for the `floor` plan, `version` 1 or 2, with these thresholds.
fn contract(dir: &std::path::Path, name: &str, version: u64, thresholds: Value) -> String {
    let c = json!({"contract_version": version, "locked_at": "2026-12-01T09:00:00Z",
                   "locked_by": "test", "plan_id": "floor", "thresholds": thresholds});
    let path = write_plan(dir, name, &c);
    path.display().to_string()
}

/// `matrix-proxy verdict RUN --contract FILE --out OUT`: verdict.json as written.
fn verdict(run_dir: &std::path::Path, contract: &str, out: &std::path::Path) -> Value {
    let (code, _, err) = run(&[
        "verdict",
        s(run_dir),
        "--contract",
        contract,
        "--out",
        s(out),
    ]);
    assert!(code == Some(0) || code == Some(1), "{err}");
    read_json(out)
}

#[test]
fn a_relative_gate_passes_a_twin_at_the_floor_that_the_absolute_gate_rejects() {
    let tmp = tempfile::tempdir().unwrap();
    let noisy = ["--nondeterministic-share", "0.3"];
    let plan = campaign(json!([
        arm("ref", "quality", true, &noisy),
        arm("twin", "quality", false, &noisy),
    ]));
    let (c, _) = run_campaign(tmp.path(), &plan);
    let rate = c["drift_floor"]["exact_match_rate"].as_f64().unwrap();
    assert!(rate < 1.0, "{}", c["drift_floor"]);
    let run_dir = tmp.path().join("run");
    // v1: the twin matches the reference only as often as the reference matches itself,
    // under 1.0: rejected.
    let v1 = contract(tmp.path(), "v1.json", 1, json!({}));
    let v = verdict(&run_dir, &v1, &tmp.path().join("v1-verdict.json"));
    assert_eq!(v["verdict"], json!("reject"), "{v:#}");
    assert_eq!(v["rules"]["contract_version"], json!(1));
    // v2 relative to the floor: at the floor, passes; the floor and its pairs are said.
    let v2 = contract(
        tmp.path(),
        "v2.json",
        2,
        // Similarity to other random text varies a little: 95 % of the floor's.
        json!({"quality_max_exact_match_drop_vs_floor": 0.0, "quality_min_similarity_vs_floor": 0.95}),
    );
    let v = verdict(&run_dir, &v2, &tmp.path().join("v2-verdict.json"));
    assert_eq!(v["quality_lane_pass"], json!(true), "{v:#}");
    assert_eq!(
        v["contract"]["thresholds"]["quality_min_exact_match"],
        Value::Null
    );
    let level = &v["gates"][0]["arms"][0]["levels"][0];
    assert_eq!(
        v["gates"][0]["gate"],
        json!("quality_max_exact_match_drop_vs_floor")
    );
    assert_eq!(level["floor"].as_f64(), Some(rate));
    assert_eq!(level["floor_pairs"], json!(90));
    assert_eq!(level["floor_distinct_requests"], json!(30));
    assert!(
        v["rules"]["quality"]
            .as_str()
            .unwrap()
            .starts_with("floor-relative")
    );
    // A v2-only field in a v1 contract is refused, with its path.
    let bad = contract(tmp.path(), "bad.json", 1, json!({"require_interval": true}));
    let (code, _, err) = run(&["verdict", s(&run_dir), "--contract", &bad]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("thresholds.require_interval: exists only in contract_version 2"),
        "{err}"
    );
    // Three repetitions a level: the paired intervals say they need five.
    let e = &c["intervals"]["entries"][0];
    assert_eq!(c["intervals"]["paired"], json!(true));
    assert_eq!(e["interval"], Value::Null);
    assert!(e["reason"].as_str().unwrap().contains("at least 5"), "{e}");
}

#[test]
fn a_buffered_arm_does_not_win_a_v2_decode_gate() {
    let tmp = tempfile::tempdir().unwrap();
    // The reference's 16 tokens 25 ms apart: only a stall of 175 ms or more (eight of the
    // fifteen after the first in one read) could make one look bundled, on a machine busy
    // with other tests too.
    let paced = ["--per-token-ms", "25"];
    let burst = ["--per-token-ms", "25", "--burst-after-first", "2"];
    let mut plan = campaign(json!([
        arm("ref", "quality", true, &paced),
        arm("burst", "performance-fit", false, &burst),
    ]));
    plan["requests_per_case"] = json!(8);
    plan["cases"][0]["variants"] = json!([{"name": "p", "request": {
        "messages": [{"role": "user", "content": "count"}], "max_tokens": 16, "stream": true}}]);
    let (c, _) = run_campaign(tmp.path(), &plan);
    let run_dir = tmp.path().join("run");
    // Every stream of the buffered arm is marked bundled, none of the reference's.
    let rows = Rows::read(&run_dir);
    let (arms, bundled) = (rows.strs("arm"), rows.bools("stream_bundled"));
    let phases = rows.strs("phase");
    for ((a, b), p) in arms.iter().zip(&bundled).zip(&phases) {
        if p.as_deref() == Some("measured") {
            assert_eq!(*b, Some(a.as_deref() == Some("burst")), "{a:?}");
        }
    }
    let cell = |arm: usize| c["arms"][arm]["concurrency"]["1"].clone();
    assert_eq!(cell(1)["decode_excluded"]["bundled"], json!(24));
    assert_eq!(cell(1)["decode_pooled_tokens_per_sec"], Value::Null);
    // On failure, the cell says which exclusion (or failed request) took a stream.
    assert_eq!(
        cell(0)["decode_excluded"]["pooled_streams"],
        json!(24),
        "{:#}",
        cell(0)
    );
    // Per request the burst looks several times faster: v1's gate passes it ...
    let per_request = |arm: usize| cell(arm)["decode_tokens_per_sec"].as_f64().unwrap();
    assert!(per_request(1) > 2.0 * per_request(0), "{c:#}");
    let t = json!({"fit_min_memory_reduction": 0.0, "max_p95_latency_ratio": 100.0});
    let v1 = contract(tmp.path(), "v1.json", 1, t.clone());
    let v = verdict(&run_dir, &v1, &tmp.path().join("v1.json.out"));
    assert_eq!(
        v["fit_arms"][0]["fit_min_decode_speedup"],
        json!(true),
        "{v:#}"
    );
    // ... v2's pooled estimator has no unbundled stream to read: no win.
    let mut t2 = t;
    t2["require_interval"] = json!(false);
    t2["fit_min_mean_similarity"] = json!(0.0);
    let v2 = contract(tmp.path(), "v2.json", 2, t2);
    let v = verdict(&run_dir, &v2, &tmp.path().join("v2.json.out"));
    assert_eq!(
        v["fit_arms"][0]["fit_min_decode_speedup"],
        Value::Null,
        "{v:#}"
    );
    assert_ne!(v["verdict"], json!("adopt"));
}
