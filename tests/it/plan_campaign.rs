//! A campaign without hand-written JSON: `plan campaign` turns a frozen plan and the arms'
//! start commands into a campaign plan and an unlocked contract, `plan lock` stamps the
//! contract, and the campaign runs with it; `freeze --name --on-failure` names a plan
//! that `plan campaign` takes the name of.

use std::path::Path;

use serde_json::{Value, json};

use crate::support::*;

const REF: &str = "ref={self} mock-worker --listen 127.0.0.1:{port}";
const TWIN: &str = "twin={self} mock-worker --listen 127.0.0.1:{port}";
/// The fit arm is the mock started through a shell, answering another text: its command
/// says nothing of its recipe.
const FAST: &str =
    r#"fast:fit=sh -c 'exec "$0" mock-worker --listen "127.0.0.1:$1" --text-seed 7' {self} {port}"#;

/// A small frozen plan: one case judged by the mock's own answer, one level, two
/// requests a round.
fn frozen_plan() -> Value {
    json!({
        "name": "frozen-name",
        "endpoint": "http://127.0.0.1:8000/v1/chat/completions",
        "health_endpoint": "http://127.0.0.1:8000/health",
        "connection": "keep-alive",
        "cases": [{
            "name": "chat",
            "ignore_paths": ["/id", "/created"],
            "request": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
            "expected_response": {
                "id": "x", "object": "chat.completion", "created": 0, "model": "mock",
                "choices": [{"index": 0, "message": {"role": "assistant",
                             "content": matrix_proxy::generate_text("hi", 4)},
                             "finish_reason": "length"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 4, "total_tokens": 5},
            },
        }],
        "concurrency": [1], "requests_per_case": 2, "repetitions": 2, "warmup_per_case": 2,
        "timeout_seconds": 10, "metadata": metadata(),
    })
}

fn keys(v: &Value) -> Vec<&str> {
    v.as_object()
        .map(|m| m.keys().map(String::as_str).collect())
        .unwrap_or_default()
}

/// The one stderr line that lists the recipe fields written as unknown, and how many
/// such lines there were.
fn unknown_lines(stderr: &str) -> (usize, String) {
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("written as \"unknown\""))
        .collect();
    (
        lines.len(),
        lines.first().map(|l| l.to_string()).unwrap_or_default(),
    )
}

#[test]
fn plan_campaign_and_plan_lock_make_a_campaign_that_runs_under_its_contract() {
    let tmp = tempfile::tempdir().unwrap();
    let frozen = write_plan(tmp.path(), "frozen.json", &frozen_plan());
    let plan = tmp.path().join("campaign.json");
    let contract = tmp.path().join("campaign.contract.json");
    let (code, stdout, stderr) = run(&[
        "plan",
        "campaign",
        s(&frozen),
        "--name",
        "tiny-chat-recipes",
        "--reference",
        REF,
        "--arm",
        TWIN,
        "--arm",
        FAST,
        "--env",
        "MOCK_NOTE=all arms",
        "--env",
        "ref:MOCK_PORT={port}",
        "--health",
        "/v1/models",
        "--health-timeout",
        "30",
        "--health-timeout",
        "fast:20",
        "--out",
        s(&plan),
        "--contract-out",
        s(&contract),
    ]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.is_empty(), "the plan went to --out: {stdout}");
    // Only the fit arm's command says nothing of its recipe: one line names its fields.
    let (n, line) = unknown_lines(&stderr);
    assert_eq!(n, 1, "{stderr}");
    assert!(
        line.contains("fast (runtime, weight_format, weight_quantization, device)")
            && !line.contains("ref (")
            && !line.contains("twin ("),
        "{line}"
    );

    // The plan: the frozen plan's keys in their order, its endpoint replaced by the arms.
    let p = read_json(&plan);
    assert_eq!(
        keys(&p),
        [
            "name",
            "evidence_class",
            "schedule",
            "arms",
            "connection",
            "cases",
            "concurrency",
            "requests_per_case",
            "repetitions",
            "warmup_per_case",
            "timeout_seconds",
            "metadata"
        ]
    );
    assert_eq!(p["name"], json!("tiny-chat-recipes"));
    assert_eq!(
        p["evidence_class"],
        json!("measured"),
        "a shell arm is not the mock"
    );
    assert_eq!(p["schedule"], json!("interleaved"));
    assert_eq!(p["repetitions"], json!(5), "intervals need 5 rounds a side");
    assert_eq!(p["cases"], frozen_plan()["cases"]);
    assert_eq!(
        p["arms"][0],
        json!({
            "name": "ref", "lane": "quality", "reference": true,
            "endpoint": "http://127.0.0.1:{port}/v1/chat/completions",
            "health_endpoint": "http://127.0.0.1:{port}/v1/models",
            "recipe": {"runtime": "matrix-proxy built-in mock", "weight_format": "none",
                       "weight_quantization": "none", "device": "cpu"},
            "start": {"command": ["{self}", "mock-worker", "--listen", "127.0.0.1:{port}"],
                      "env": {"MOCK_NOTE": "all arms", "MOCK_PORT": "{port}"},
                      "health_timeout_seconds": 30},
        })
    );
    assert_eq!(p["arms"][1]["name"], json!("twin"));
    assert_eq!(p["arms"][1]["lane"], json!("quality"));
    assert_eq!(p["arms"][1].get("reference"), None);
    assert_eq!(
        p["arms"][1]["start"]["env"],
        json!({"MOCK_NOTE": "all arms"})
    );
    let fast = &p["arms"][2];
    assert_eq!(fast["lane"], json!("performance-fit"));
    assert_eq!(
        fast["recipe"],
        json!({"runtime": "unknown", "weight_format": "unknown",
               "weight_quantization": "unknown", "device": "unknown"})
    );
    assert_eq!(
        fast["start"],
        json!({"command": ["sh", "-c",
                           "exec \"$0\" mock-worker --listen \"127.0.0.1:$1\" --text-seed 7",
                           "{self}", "{port}"],
               "env": {"MOCK_NOTE": "all arms"}, "health_timeout_seconds": 20})
    );
    let (code, _, stderr) = run(&["validate", s(&plan)]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains(
            "campaign 'tiny-chat-recipes': 3 arm(s), measured evidence, interleaved schedule"
        ),
        "{stderr}"
    );

    // The contract: version 2, every default threshold written out, not locked.
    let c = read_json(&contract);
    assert_eq!(c["contract_version"], json!(2));
    assert_eq!(c["plan_id"], json!("tiny-chat-recipes"));
    assert_eq!(c.get("locked_at"), None);
    assert_eq!(c.get("locked_by"), None);
    let t = &c["thresholds"];
    for (k, v) in [
        ("quality_min_exact_match", json!(1.0)),
        ("max_failed_requests", json!(0)),
        ("fit_min_memory_reduction", json!(0.25)),
        ("fit_min_decode_speedup", json!(0.1)),
        ("max_p95_latency_ratio", json!(1.1)),
        ("min_decode_ratio", json!(1.0)),
        ("fit_min_mean_similarity", json!(0.5)),
        ("require_interval", json!(true)),
    ] {
        assert_eq!(t[k], v, "{k}: {c}");
    }

    // An unlocked contract is refused before anything exists, with the way to lock it.
    let run_dir = tmp.path().join("run");
    let replay = [
        "replay",
        s(&plan),
        "--contract",
        s(&contract),
        "--quiet",
        "--out",
        s(&run_dir),
    ];
    let (code, _, stderr) = run(&replay);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("locked_at: is required") && stderr.contains("matrix-proxy plan lock"),
        "{stderr}"
    );
    assert!(!run_dir.exists());

    // plan lock stamps it in place, keeping the other keys and their order; once.
    let (code, _, stderr) = run(&["plan", "lock", s(&contract), "--by", "me"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("locked_by 'me'"), "{stderr}");
    let locked = read_json(&contract);
    assert_eq!(
        keys(&locked),
        [
            "contract_version",
            "locked_at",
            "locked_by",
            "plan_id",
            "thresholds",
            "baseline",
            "stop_condition"
        ]
    );
    assert_eq!(locked["locked_by"], json!("me"));
    assert!(
        locked["locked_at"]
            .as_str()
            .is_some_and(|t| t.starts_with("20") && t.ends_with('Z')),
        "{locked}"
    );
    assert_eq!(locked["thresholds"], c["thresholds"]);
    let (code, _, stderr) = run(&["plan", "lock", s(&contract), "--by", "you"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("already locked") && stderr.contains("locked_by 'me'"),
        "{stderr}"
    );
    assert_eq!(
        read_json(&contract),
        locked,
        "a refused lock changes nothing"
    );

    // Locked, the campaign runs under it: the run's exit code says how the run went, the
    // verdict is in verdict.json.
    let (code, _, stderr) = run(&replay);
    assert_eq!(code, Some(0), "{stderr}");
    let config = read_json(&run_dir.join("config.json"));
    assert_eq!(config["contract"]["locked_by"], json!("me"));
    assert_eq!(config["contract"]["plan_id"], json!("tiny-chat-recipes"));
    let campaign = read_json(&run_dir.join("campaign.json"));
    let arms = campaign["arms"].as_array().unwrap();
    assert_eq!(arms.len(), 3);
    assert!(
        arms.iter().all(|a| a["available"] == json!(true)),
        "{arms:?}"
    );
    let verdict = read_json(&run_dir.join("verdict.json"));
    assert!(
        matches!(
            verdict["verdict"].as_str(),
            Some("adopt" | "optimize" | "keep-reference" | "inconclusive" | "reject")
        ),
        "{verdict}"
    );
    assert_eq!(verdict["rules"]["contract_version"], json!(2));
}

#[test]
fn plan_campaign_refuses_bad_arms_and_settings_with_exit_2() {
    let tmp = tempfile::tempdir().unwrap();
    let frozen = write_plan(tmp.path(), "frozen.json", &frozen_plan());
    let out = tmp.path().join("never.json");
    let cases: &[(&[&str], &str)] = &[
        (
            &["--reference", REF, "--arm", "twin"],
            "--arm 'twin': give NAME=COMMAND",
        ),
        (
            &[
                "--reference",
                REF,
                "--arm",
                r#"twin=srv "oops --port {port}"#,
            ],
            "--arm 'twin=srv \"oops --port {port}': the command has an unbalanced quote",
        ),
        (
            &["--reference", REF, "--arm", TWIN, "--env", "x:K=V"],
            "--env 'x:K=V': 'x' is not an arm; the arms are ref, twin",
        ),
        (
            &[
                "--reference",
                REF,
                "--reference",
                "ref2=srv --port {port}",
                "--arm",
                TWIN,
            ],
            "--reference is given 2 times: a campaign has exactly one reference",
        ),
        (
            &["--reference", REF, "--arm", "ref=srv --port {port}"],
            "the arm name 'ref' is used more than once",
        ),
        (
            &["--reference", REF, "--arm", "ref:fast=srv --port {port}"],
            "'fast' is not a lane",
        ),
        (
            &["--reference", REF, "--arm", "twin=srv --port 9"],
            "arm 'twin': neither its command nor its --env names {port}",
        ),
        (
            &[
                "--reference",
                REF,
                "--arm",
                TWIN,
                "--env",
                "MOCK=1",
                "--env",
                "MOCK=2",
            ],
            "--env 'MOCK=2': MOCK is given twice for every arm",
        ),
        (
            &[
                "--reference",
                REF,
                "--arm",
                TWIN,
                "--env",
                "twin:HF_TOKEN=hf_x",
            ],
            "arms[1].start.env.HF_TOKEN: names a secret",
        ),
        (
            &["--reference", REF, "--arm", TWIN, "--health", "v1/models"],
            "--health 'v1/models': give a path on the arms' origin starting with '/'",
        ),
        (
            &[
                "--reference",
                REF,
                "--arm",
                TWIN,
                "--health-timeout",
                "twin:0",
            ],
            "--health-timeout 'twin:0': give seconds > 0",
        ),
        (
            &["--reference", REF, "--arm", TWIN, "--repetitions", "1"],
            "--repetitions 1: at least 2",
        ),
    ];
    for (extra, says) in cases {
        let mut args = vec!["plan", "campaign", s(&frozen), "--name", "n"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--out", s(&out)]);
        let (code, stdout, stderr) = run(&args);
        assert_eq!(code, Some(2), "{extra:?}: {stderr}");
        assert!(
            stderr.contains(says),
            "{extra:?}: want {says:?} in {stderr}"
        );
        assert!(stdout.is_empty() && !out.exists(), "{extra:?}");
    }
    // Neither --out nor --contract-out is ever replaced.
    let taken = write_plan(tmp.path(), "taken.json", &json!({}));
    for flag in ["--out", "--contract-out"] {
        let (code, _, stderr) = run(&[
            "plan",
            "campaign",
            s(&frozen),
            "--reference",
            REF,
            "--arm",
            TWIN,
            flag,
            s(&taken),
        ]);
        assert_eq!(code, Some(2), "{stderr}");
        assert!(
            stderr.contains(&format!("{flag} {}: exists", s(&taken))),
            "{stderr}"
        );
    }
    assert_eq!(read_json(&taken), json!({}));
    // A blank --by is refused before the contract is read.
    let (code, _, stderr) = run(&["plan", "lock", s(&taken), "--by", " "]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--by"), "{stderr}");
}

#[test]
fn freeze_names_the_plan_and_its_failure_policy_and_plan_campaign_keeps_them() {
    let tmp = tempfile::tempdir().unwrap();
    let capture = json!({
        "endpoint": "http://127.0.0.1:9/v1/chat/completions",
        "concurrency": [1], "requests_per_case": 2, "timeout_seconds": 10,
        "metadata": metadata(),
        "cases": [{"name": "chat",
                   "request": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}}],
    });
    let capture = write_plan(tmp.path(), "capture.json", &capture);
    let out = tmp.path().join("capture");
    let (code, _, err) = run(&[
        "replay",
        s(&capture),
        "--mock-worker",
        "--quiet",
        "--out",
        s(&out),
    ]);
    assert_eq!(code, Some(0), "{err}");
    let frozen = tmp.path().join("frozen.json");
    let (code, _, err) = run(&[
        "freeze",
        s(&out),
        "--name",
        "tiny-chat",
        "--on-failure",
        "continue",
        "--concurrency",
        "1",
        "--out",
        s(&frozen),
    ]);
    assert_eq!(code, Some(0), "{err}");
    let p = read_json(&frozen);
    let k = keys(&p);
    assert_eq!(k.first(), Some(&"name"), "{k:?}");
    let at = |key: &str| k.iter().position(|x| *x == key);
    assert_eq!(at("on_failure"), at("connection").map(|i| i + 1), "{k:?}");
    assert_eq!(
        (&p["name"], &p["on_failure"]),
        (&json!("tiny-chat"), &json!("continue"))
    );
    for (args, says) in [
        (["--on-failure", "later"], "--on-failure"),
        (["--name", " "], "--name"),
    ] {
        let (code, _, err) = run(&["freeze", s(&out), args[0], args[1]]);
        assert_eq!(code, Some(2), "{err}");
        assert!(err.contains(says), "{err}");
    }

    // plan campaign takes the frozen plan's name and policy; without --out the plan goes
    // to stdout. Recipes come from what the commands say.
    let (code, stdout, err) = run(&[
        "plan",
        "campaign",
        s(&frozen),
        "--reference",
        "ref=transformers serve ./model --dtype float32 --port {port}",
        "--arm",
        "bf16:fit=transformers serve ./model --dtype=bfloat16 --port {port}",
        "--env",
        "HF_HUB_OFFLINE=1",
        "--health",
        "/v1/models",
        "--health-timeout",
        "300",
    ]);
    assert_eq!(code, Some(0), "{err}");
    let c: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(
        (&c["name"], &c["on_failure"], &c["evidence_class"]),
        (&json!("tiny-chat"), &json!("continue"), &json!("measured"))
    );
    assert_eq!(c.get("endpoint"), None);
    assert_eq!(c["repetitions"], json!(5));
    let bf16 = &c["arms"][1];
    assert_eq!(
        bf16,
        &json!({
            "name": "bf16", "lane": "performance-fit",
            "endpoint": "http://127.0.0.1:{port}/v1/chat/completions",
            "health_endpoint": "http://127.0.0.1:{port}/v1/models",
            "recipe": {"runtime": "transformers", "weight_format": "bfloat16",
                       "weight_quantization": "unknown", "device": "unknown"},
            "start": {"command": ["transformers", "serve", "./model", "--dtype=bfloat16",
                                  "--port", "{port}"],
                      "env": {"HF_HUB_OFFLINE": "1"}, "health_timeout_seconds": 300},
        })
    );
    assert_eq!(c["arms"][0]["recipe"]["weight_format"], json!("float32"));
    let (n, line) = unknown_lines(&err);
    assert_eq!(n, 1, "{err}");
    assert!(
        line.contains("ref (weight_quantization, device); bf16 (weight_quantization, device)"),
        "{line}"
    );
    assert!(
        err.contains("repetitions 5 (the frozen plan had 2)"),
        "{err}"
    );
    let written = write_plan(tmp.path(), "campaign.json", &c);
    let (code, _, err) = run(&["validate", s(&written)]);
    assert_eq!(code, Some(0), "{err}");
    assert!(Path::new(&written).is_file());
}
