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

/// A campaign of `arms` over 20 prompts, each sent once a round, 3 rounds.
fn campaign(arms: Value) -> Value {
    let variants: Vec<Value> = (0..20)
        .map(|i| {
            json!({"name": format!("p{i}"),
                   "request": {"messages": [{"role": "user", "content": format!("prompt number {i}")}],
                               "max_tokens": 6}})
        })
        .collect();
    json!({"name": "floor", "arms": arms,
           "cases": [{"name": "chat", "variants": variants}],
           "concurrency": [1], "requests_per_case": 20, "repetitions": 3,
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
    // 20 prompts, 3 repetitions: 3 pairs of repetitions each.
    assert_eq!(floor["compared_prompts"], json!(60));
    assert_eq!(floor["concurrency"]["1"]["compared_prompts"], json!(60));
    let rate = floor["exact_match_rate"].as_f64().unwrap();
    // The prompts answered differently every time are a fixed share (seeded): the
    // floor is the others' share, well below 1 and above 0.
    assert!(rate > 0.3 && rate < 1.0, "{floor}");
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
        text.contains("drift floor (ref vs itself, pairs of repetitions): 60 pairs"),
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
