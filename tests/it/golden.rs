//! The JSON files a run writes, against golden copies made by an earlier build
//! (`tests/golden/{demo,campaign-demo,open-sharded,serve,compare}/`): the same key paths in
//! the same order, the same value types, and the same values except those a run cannot
//! repeat (times, identities, paths and ports, measured durations and rates, memory; see
//! [`masked`]). A refactor of how the documents are built must leave all of that as it was.
//!
//! To make the copies again (only when a change of a document is meant, and said in the
//! commit): `MATRIX_PROXY_WRITE_GOLDEN=1 cargo test --test it golden`; with
//! `MATRIX_PROXY_GOLDEN_BIN=PATH` the runs are made by another build of the binary (the
//! copies committed first were made by the release build of a567d24).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use crate::support::*;

/// Keys whose values differ from run to run: compared by type only.
const MASKED_KEYS: &[&str] = &[
    // Identity, time, place.
    "run_id",
    "run_ids",
    "started_at",
    "finished_at",
    "evaluated_at",
    "start_at",
    "run_started_at",
    "binary_sha256",
    "host",
    "argv",
    "plan_path",
    "dir",
    "path",
    "url",
    "endpoint",
    "health_endpoint",
    "endpoint_override",
    "listen",
    "upstream",
    "metrics_listen",
    "runtime_threads",
    // The generator's own load.
    "cpu_seconds",
    "cpu_share",
    "cores",
    "warning",
    // Measured spreads and the verdict's measured values.
    "p50",
    "p95",
    "p99",
    "min",
    "median",
    "max",
    "mean",
    "per_request_mean",
    "aggregate",
    "relative_spread",
    "ratio",
    "measured",
    "limit",
    "delta",
    "relative_delta",
    "mean_similarity",
    // Bootstrap intervals and the round values they resample; how many streams
    // arrived bundled (TCP may coalesce events on a loaded machine).
    "interval",
    "low",
    "high",
    "values",
    "difference_shown",
    "pooled",
    "bundled",
    "bundled_streams",
    "pooled_streams",
    // An open round's timing: how late its sends were, and what met the slo.
    "late_sends",
    "saturated",
    "good_requests",
    "missed_requests",
    "missed_share",
    "ttft",
    "tpot",
    "e2e",
    // The worker's own view: how many scrapes fell in a window, which bucket held a
    // quantile; how many scrapes an arm's worker got (its interval against the run's
    // length).
    "scrapes_in_window",
    "scrapes",
    "p50_bucket",
    "p95_bucket",
];

/// Key suffixes of measured values: durations, rates, memory.
const MASKED_SUFFIXES: &[&str] = &[
    "_us",
    "_ns",
    "_ms",
    "_seconds",
    "_per_second",
    "_per_sec",
    "_bytes",
    "_cv",
    "_mean",
];

/// Keys whose value may be null in one run and a value in another (a warning, a
/// measurement that needs enough samples). `connect_seconds`: a keep-alive round's
/// quantiles are null when every request rode a connection an earlier round opened, and
/// which round of an open-loop run opens them depends on timing (it flipped between the
/// sharded run's two rounds in CI).
const NULLABLE_KEYS: &[&str] = &["warning", "connect_seconds"];

/// Keys masked only where their value is a number (a verdict level's `reference` value;
/// an arm's `reference` flag is compared).
const NUMERIC_MASKED_KEYS: &[&str] = &["reference"];

fn masked(key: &str) -> bool {
    MASKED_KEYS.contains(&key) || MASKED_SUFFIXES.iter().any(|s| key.ends_with(s))
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(n) if n.is_f64() => "float",
        Value::Number(_) => "integer",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Every way `new` differs from `golden` at `at` (a JSON pointer), under `key`'s mask.
fn differences(at: &str, key: &str, golden: &Value, new: &Value, out: &mut Vec<String>) {
    let mask = masked(key) || (NUMERIC_MASKED_KEYS.contains(&key) && golden.is_number());
    let (kg, kn) = (kind(golden), kind(new));
    if kg != kn {
        // A masked float may be written as an integer where it happens to be whole
        // (never here: serde writes an f64 as a float), and a nullable key may be null.
        let nullable = NULLABLE_KEYS.contains(&key) && (kg == "null" || kn == "null");
        let whole = mask && matches!((kg, kn), ("float", "integer") | ("integer", "float"));
        if !nullable && !whole {
            out.push(format!("{at}: type {kg} in the golden copy, {kn} now"));
        }
        return;
    }
    match (golden, new) {
        (Value::Object(g), Value::Object(n)) => {
            let (kg, kn): (Vec<&String>, Vec<&String>) = (g.keys().collect(), n.keys().collect());
            if kg != kn {
                out.push(format!("{at}: keys {kg:?} in the golden copy, {kn:?} now"));
                return;
            }
            // Under a masked key (`host`) every value is masked too: keys and types are
            // still compared.
            for (k, gv) in g {
                let child = if mask { key } else { k.as_str() };
                differences(&format!("{at}/{k}"), child, gv, &n[k], out);
            }
        }
        (Value::Array(g), Value::Array(n)) => {
            if mask {
                return;
            }
            if g.len() != n.len() {
                out.push(format!(
                    "{at}: {} items in the golden copy, {} now",
                    g.len(),
                    n.len()
                ));
                return;
            }
            for (i, (gv, nv)) in g.iter().zip(n).enumerate() {
                differences(&format!("{at}/{i}"), key, gv, nv, out);
            }
        }
        _ if mask => {}
        _ => {
            if golden != new {
                out.push(format!("{at}: {golden} in the golden copy, {new} now"));
            }
        }
    }
}

fn golden_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name)
}

/// Compare each of `files` of `run` with its golden copy (or write the copy, with
/// MATRIX_PROXY_WRITE_GOLDEN=1). Returns every difference, prefixed by the file.
fn check(name: &str, run: &Path, files: &[&str]) -> Vec<String> {
    let dir = golden_dir(name);
    let mut out = Vec::new();
    for f in files {
        let new = read_json(&run.join(f));
        if std::env::var_os("MATRIX_PROXY_WRITE_GOLDEN").is_some() {
            std::fs::create_dir_all(&dir).unwrap();
            let mut bytes = serde_json::to_vec_pretty(&new).unwrap();
            bytes.push(b'\n');
            std::fs::write(dir.join(f), bytes).unwrap();
            continue;
        }
        let golden = read_json(&dir.join(f));
        let mut d = Vec::new();
        differences("", "", &golden, &new, &mut d);
        out.extend(d.into_iter().map(|d| format!("{name}/{f}{d}")));
    }
    out
}

/// The binary whose files are compared: this build's, or MATRIX_PROXY_GOLDEN_BIN (the
/// build that makes the golden copies).
fn golden_bin() -> PathBuf {
    std::env::var_os("MATRIX_PROXY_GOLDEN_BIN")
        .map_or_else(|| env!("CARGO_BIN_EXE_matrix-proxy").into(), PathBuf::from)
}

fn run_bin(args: &[&str]) {
    let out = std::process::Command::new(golden_bin())
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "matrix-proxy {args:?}: {:?}\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The demo (closed loop, keep-alive) and a comparison of it with itself.
fn demo(tmp: &Path) -> Vec<String> {
    let run = tmp.join("demo");
    run_bin(&[
        "replay",
        "plans/demo.json",
        "--mock-worker",
        "--quiet",
        "--out",
        s(&run),
    ]);
    let cmp = tmp.join("compare");
    std::fs::create_dir_all(&cmp).unwrap();
    run_bin(&[
        "compare",
        s(&run),
        s(&run),
        "--out",
        s(&cmp.join("compare.json")),
    ]);
    // The demo's summary rebuilt from its rows (the original kept beside it).
    let rebuilt = tmp.join("demo-summarized");
    copy_dir(&run, &rebuilt);
    run_bin(&["summarize", "--quiet", s(&rebuilt)]);
    let mut d = check("demo", &run, &["config.json", "summary.json"]);
    d.extend(check("compare", &cmp, &["compare.json"]));
    d.extend(check(
        "demo-summarized",
        &rebuilt,
        &["summary.json", "summary.orig.json"],
    ));
    d
}

/// A copy of a run folder (files and folders, recursively).
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let dest = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), dest).unwrap();
        }
    }
}

/// The campaign demo under its contract: config, summary, campaign and verdict.
fn campaign(tmp: &Path) -> Vec<String> {
    let run = tmp.join("campaign-demo");
    run_bin(&[
        "replay",
        "plans/campaign-demo.json",
        "--contract",
        "plans/campaign-demo.contract.json",
        "--quiet",
        "--out",
        s(&run),
    ]);
    // The same contract through `compare` (the run against itself) and `verdict` again.
    let again = tmp.join("campaign-again");
    std::fs::create_dir_all(&again).unwrap();
    let contract = "plans/campaign-demo.contract.json";
    run_bin(&[
        "compare",
        s(&run),
        s(&run),
        "--contract",
        contract,
        "--out",
        s(&again.join("compare.json")),
    ]);
    run_bin(&[
        "verdict",
        s(&run),
        "--contract",
        contract,
        "--out",
        s(&again.join("verdict.json")),
    ]);
    let mut d = check(
        "campaign-demo",
        &run,
        &[
            "config.json",
            "summary.json",
            "campaign.json",
            "verdict.json",
        ],
    );
    d.extend(check(
        "campaign-again",
        &again,
        &["compare.json", "verdict.json"],
    ));
    // Without recording: no drift, and campaign.json says why.
    let bare = tmp.join("campaign-no-record");
    run_bin(&[
        "replay",
        "plans/campaign-demo.json",
        "--no-record",
        "--quiet",
        "--out",
        s(&bare),
    ]);
    d.extend(check(
        "campaign-no-record",
        &bare,
        &["config.json", "summary.json", "campaign.json"],
    ));
    d
}

/// The open demo's first case as two shards started at one instant, merged by summarize.
fn open_sharded(tmp: &Path) -> Vec<String> {
    let mut plan = read_json(&Path::new(env!("CARGO_MANIFEST_DIR")).join("plans/open-demo.json"));
    plan["cases"].as_array_mut().unwrap().truncate(1);
    plan["timeout_seconds"] = 1.into();
    plan["load"]["duration_seconds"] = 1.into();
    let path = write_plan(tmp, "open.json", &plan);
    let out = tmp.join("open-sharded");
    let start = matrix_proxy_start_in(Duration::from_secs(3));
    let shards: Vec<std::process::Child> = (0..2)
        .map(|i| {
            std::process::Command::new(golden_bin())
                .args(["replay", s(&path), "--mock-worker", "--quiet", "--shard"])
                .arg(format!("{i}/2"))
                .args(["--start-at", &start, "--out", s(&out)])
                .spawn()
                .unwrap()
        })
        .collect();
    for mut c in shards {
        assert!(c.wait().unwrap().success(), "a shard failed");
    }
    run_bin(&["summarize", "--quiet", s(&out)]);
    let mut d = check("open-sharded", &out, &["summary.json"]);
    let shard = out.join("shards/0");
    d.extend(check(
        "open-sharded/shards/0",
        &shard,
        &["config.json", "summary.json"],
    ));
    d
}

/// An instant `after` from now, as `--start-at` takes it (RFC 3339, UTC).
fn matrix_proxy_start_in(after: Duration) -> String {
    let out = std::process::Command::new("date")
        .args([
            "-u",
            "-d",
            &format!("+{} seconds", after.as_secs()),
            "+%Y-%m-%dT%H:%M:%SZ",
        ])
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// serve in front of the mock: a few chat requests, then stopped as Ctrl-C stops it.
async fn serve(tmp: &Path) -> Vec<String> {
    let mock = start_mock(matrix_proxy::MockConfig::default()).await;
    let out = tmp.join("serve");
    let mut child = tokio::process::Command::new(golden_bin())
        .args(["serve", "--listen", "127.0.0.1:0", "--quiet", "--upstream"])
        .arg(mock.url())
        .arg("--out")
        .arg(&out)
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let addr = serve_address(&out).await;
    let mut client = Client::connect(addr).await;
    for i in 0..4 {
        let body = serde_json::json!({"model": "mock", "messages": [{"role": "user", "content": format!("hi {i}")}], "max_tokens": 4});
        let (status, _, _) = client
            .send(request(
                "POST",
                addr,
                "/v1/chat/completions",
                body.to_string(),
            ))
            .await
            .unwrap();
        assert_eq!(status, 200);
    }
    drop(client);
    signal(&child, "-INT");
    // serve exits 130 when stopped by a signal.
    assert_eq!(exit_code(&mut child, 60).await, Some(130));
    mock.shutdown().await;
    check("serve", &out, &["config.json", "summary.json"])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_json_files_of_a_run_keep_their_keys_order_types_and_values() {
    let tmp = tempfile::tempdir().unwrap();
    let mut d = demo(tmp.path());
    d.extend(campaign(tmp.path()));
    d.extend(open_sharded(tmp.path()));
    d.extend(serve(tmp.path()).await);
    assert!(
        d.is_empty(),
        "{} difference(s) from tests/golden:\n{}",
        d.len(),
        d.join("\n")
    );
}

/// Remove the keys at `paths` (RFC 6901 pointers to object members) from `v`.
fn remove(v: &mut serde_json::Value, paths: &[&str]) {
    for p in paths {
        let (parent, key) = p.rsplit_once('/').unwrap();
        if let Some(serde_json::Value::Object(m)) = v.pointer_mut(parent) {
            m.shift_remove(key);
        }
    }
}

#[tokio::test]
async fn files_an_older_build_wrote_are_still_read_and_summarize_keeps_their_ending() {
    let peer = Peer::start(echo_handler()).await;
    let tmp = tempfile::tempdir().unwrap();
    let (run, exit) = replay_plan(tmp.path(), &echo_plan(peer.url("/"), "keep-alive", 1, 4)).await;
    assert_eq!(exit, matrix_proxy::cli::Exit::Ok);
    // As a build before open loops and live metrics wrote them: no load, latency_from,
    // service latency, open-loop or goodput keys, no runtime_threads, hold or shard; and
    // the run was interrupted.
    let mut summary = read_json(&run.join("summary.json"));
    remove(
        &mut summary,
        &[
            "/load",
            "/definitions/open_loop",
            "/definitions/goodput",
            "/rows_encoded_during_rounds",
        ],
    );
    for r in summary["rounds"].as_array_mut().unwrap() {
        remove(
            r,
            &[
                "/latency_from",
                "/service_latency_seconds",
                "/open_loop",
                "/goodput",
            ],
        );
    }
    summary["ending"] = "interrupted".into();
    std::fs::write(run.join("summary.json"), summary.to_string()).unwrap();
    let mut config = read_json(&run.join("config.json"));
    remove(
        &mut config,
        &[
            "/extra/runtime_threads",
            "/extra/metrics_listen",
            "/extra/recording/record_hold_bytes",
            "/shard",
            "/contract",
            "/effective_budget/sweep",
        ],
    );
    std::fs::write(run.join("config.json"), config.to_string()).unwrap();
    // The report reads it; summarize rebuilds it and keeps its ending (exit 1: not passed).
    let out = bin().arg("report").arg(&run).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (code, stderr) = summarize(&run);
    assert_eq!(code, Some(1), "{stderr}");
    assert_eq!(
        read_json(&run.join("summary.json"))["ending"],
        serde_json::json!("interrupted"),
        "{stderr}"
    );
    assert_eq!(
        read_json(&run.join("summary.orig.json"))["ending"],
        serde_json::json!("interrupted")
    );
}

#[test]
fn the_comparison_sees_keys_order_types_and_unmasked_values() {
    let g = serde_json::json!({"a": 1, "b": {"p50": 0.5, "n": [1, 2]}, "warning": null});
    let mut d = Vec::new();
    differences("", "", &g, &g.clone(), &mut d);
    assert_eq!(d, Vec::<String>::new());
    let cases = [
        // Another order of the same keys.
        (
            serde_json::json!({"b": {"p50": 0.5, "n": [1, 2]}, "a": 1, "warning": null}),
            "keys",
        ),
        // An integer where a float was.
        (
            serde_json::json!({"a": 1.0, "b": {"p50": 0.5, "n": [1, 2]}, "warning": null}),
            "type integer in the golden copy, float now",
        ),
        // A value that is not masked.
        (
            serde_json::json!({"a": 1, "b": {"p50": 0.5, "n": [1, 3]}, "warning": null}),
            "/b/n/1: 2 in the golden copy, 3 now",
        ),
        // A masked value that became a string.
        (
            serde_json::json!({"a": 1, "b": {"p50": "x", "n": [1, 2]}, "warning": null}),
            "/b/p50: type float",
        ),
    ];
    for (new, want) in cases {
        let mut d = Vec::new();
        differences("", "", &g, &new, &mut d);
        assert!(d.len() == 1 && d[0].contains(want), "{want}: {d:?}");
    }
    // A masked value may differ, and a nullable one may be null.
    let mut d = Vec::new();
    let new = serde_json::json!({"a": 1, "b": {"p50": 0.7, "n": [1, 2]}, "warning": "late"});
    differences("", "", &g, &new, &mut d);
    assert_eq!(d, Vec::<String>::new());
    // A round's connect quantiles may be null (no connection opened in it), but a
    // latency quantile may not.
    let g = serde_json::json!({"connect_seconds": {"p50": 0.001}, "ttft_seconds": {"p50": 0.01}});
    let new = serde_json::json!({"connect_seconds": {"p50": null}, "ttft_seconds": {"p50": 0.02}});
    let mut d = Vec::new();
    differences("", "", &g, &new, &mut d);
    assert_eq!(d, Vec::<String>::new());
    let new = serde_json::json!({"connect_seconds": {"p50": 0.002}, "ttft_seconds": {"p50": null}});
    let mut d = Vec::new();
    differences("", "", &g, &new, &mut d);
    assert!(
        d.len() == 1 && d[0].contains("/ttft_seconds/p50: type float"),
        "{d:?}"
    );
}
