//! Campaigns: arms started by the tool (real child processes), measured side by side in
//! rotation, sampled, reported in campaign.json, and always stopped.

use std::path::Path;

use serde_json::{Value, json};

use crate::support::*;

fn recipe(q: &str) -> Value {
    json!({"runtime": "matrix-proxy mock", "weight_format": "none", "weight_quantization": q, "device": "cpu"})
}

/// Processes whose command line holds `marker` (the test's own unique argument).
pub(crate) fn processes_with(marker: &str) -> Vec<String> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            (cmd.contains(marker) && !cmd.contains("cargo")).then_some(cmd)
        })
        .collect()
}

fn plan(arms: Value) -> Value {
    json!({
        "name": "mock-vs-mock",
        "arms": arms,
        "cases": [{"name": "chat", "path": "/v1/chat/completions",
                   "request": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}}],
        "concurrency": [1, 2], "requests_per_case": 4, "repetitions": 2,
        "timeout_seconds": 10, "metadata": metadata(),
    })
}

fn replay(dir: &Path, plan: &Value) -> (Option<i32>, String) {
    let path = write_plan(dir, "campaign.json", plan);
    let out = bin()
        .args(["replay", "--quiet", "--out"])
        .arg(dir.join("run"))
        .arg(&path)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn arms_run_in_rotation_are_sampled_reported_and_stopped() {
    let tmp = tempfile::tempdir().unwrap();
    // The reference is the mock; the fit arm is a shell whose grandchild holds 200 MiB
    // while the mock (exec'd by the shell) serves.
    // The mock starts only once the grandchild holds its 200 MiB (it touches a file).
    let ready = tmp.path().join("grown");
    let grow = "python3 -c 'import sys, time; b = b\"x\" * (200 << 20); open(sys.argv[1], \"w\").close(); time.sleep(120)' \"$2\" marker-41977 & \
                while [ ! -e \"$2\" ]; do sleep 0.05; done; \
                exec \"$0\" mock-worker --listen 127.0.0.1:$1 --stall-ms 41977 --text-seed 5";
    let arms = json!([
        {"name": "ref", "lane": "quality", "reference": true, "recipe": recipe("none"),
         "endpoint": "http://127.0.0.1:{port}/v1/chat/completions",
         "start": {"command": ["{self}", "mock-worker", "--listen", "127.0.0.1:{port}", "--stall-ms", "41977"]}},
        {"name": "fit", "lane": "performance-fit", "recipe": recipe("q4"),
         "endpoint": "http://127.0.0.1:{port}/v1/chat/completions", "artifact": "Cargo.toml",
         "start": {"command": ["sh", "-c", grow, "{self}", "{port}", ready.to_str().unwrap()], "stop_grace_seconds": 2, "health_timeout_seconds": 60}},
        {"name": "twin", "lane": "quality", "recipe": recipe("none"),
         "endpoint": "http://127.0.0.1:{port}/v1/chat/completions",
         "start": {"command": ["{self}", "mock-worker", "--listen", "127.0.0.1:{port}", "--stall-ms", "41977"]}}
    ]);
    // The default mock's answer is the oracle: the twin meets it; the fit arm answers
    // with another text (--text-seed 5), which a performance-fit arm may.
    let mut plan = plan(arms);
    plan["cases"][0]["ignore_paths"] = json!(["/id", "/created"]);
    plan["cases"][0]["expected_response"] = json!({
        "id": "x", "object": "chat.completion", "created": 0, "model": "mock",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": matrix_proxy::generate_text("hi", 4)}, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 4, "total_tokens": 5},
    });
    let (code, stderr) = replay(tmp.path(), &plan);
    assert_eq!(code, Some(0), "{stderr}");
    let run = tmp.path().join("run");
    assert!(
        processes_with("41977").is_empty(),
        "left behind: {:?}",
        processes_with("41977")
    );

    // Every row names its arm; the measured rounds ran in rotation: ref fit twin, then
    // fit twin ref.
    let rows = Rows::read(&run);
    let (arm, phase, conc, rep, start) = (
        rows.strs("arm"),
        rows.strs("phase"),
        rows.i32s("concurrency"),
        rows.i32s("repetition"),
        rows.i64s("start_offset_us"),
    );
    assert!(
        arm.iter()
            .all(|a| matches!(a.as_deref(), Some("ref" | "fit" | "twin")))
    );
    let (outcome, ptr) = (rows.strs("outcome"), rows.strs("oracle_mismatch_pointer"));
    for i in 0..rows.len() {
        assert_eq!(outcome[i].as_deref(), Some("ok"), "row {i}");
        if phase[i].as_deref() != Some("health") {
            let want = (arm[i].as_deref() == Some("fit")).then_some("/choices/0/message/content");
            assert_eq!(ptr[i].as_deref(), want, "row {i} of {:?}", arm[i]);
        }
    }
    for c in [1, 2] {
        let mut firsts: Vec<(i64, String, i32)> = Vec::new();
        for i in 0..rows.len() {
            if phase[i].as_deref() == Some("measured") && conc[i] == Some(c) {
                let key = (arm[i].clone().unwrap(), rep[i].unwrap());
                match firsts.iter_mut().find(|f| (f.1.clone(), f.2) == key) {
                    Some(f) => f.0 = f.0.min(start[i].unwrap()),
                    None => firsts.push((start[i].unwrap(), key.0, key.1)),
                }
            }
        }
        firsts.sort();
        let order: Vec<(String, i32)> = firsts.into_iter().map(|f| (f.1, f.2)).collect();
        assert_eq!(
            order,
            vec![
                ("ref".into(), 0),
                ("fit".into(), 0),
                ("twin".into(), 0),
                ("fit".into(), 1),
                ("twin".into(), 1),
                ("ref".into(), 1)
            ],
            "c = {c}"
        );
    }

    // campaign.json: the reference, both arms available, their load, and the cells.
    let c = read_json(&run.join("campaign.json"));
    assert_eq!(c["schema_version"], json!(1));
    assert_eq!(
        c["evidence_class"],
        json!("measured"),
        "a shell arm is not the built-in mock"
    );
    assert_eq!(c["reference_arm"], json!("ref"));
    let arms = c["arms"].as_array().unwrap();
    for a in arms {
        assert_eq!(a["available"], json!(true), "{a}");
        let ep = a["endpoint"].as_str().unwrap();
        assert!(
            ep.starts_with("http://127.0.0.1:") && !ep.contains("{port}"),
            "{ep}"
        );
        assert!(a["load"]["load_ms"].as_f64().unwrap() > 0.0, "{a}");
        for level in ["1", "2"] {
            let cell = &a["concurrency"][level];
            assert_eq!(cell["attempted_requests"], json!(8), "{a}");
            assert_eq!(cell["failed_requests"], json!(0), "{a}");
            assert!(cell["latency_p50_ms"].as_f64().unwrap() > 0.0);
            assert!(
                cell["aggregate_decode_tokens_per_sec"].as_f64().unwrap() > 0.0,
                "usage counts"
            );
        }
    }
    let fit = &arms[1];
    assert_eq!(
        fit["load"]["artifact_bytes"],
        json!(std::fs::metadata("Cargo.toml").unwrap().len())
    );
    let peak = fit["concurrency"]["1"]["peak_rss_bytes"].as_u64().unwrap();
    assert!(
        peak >= 200 << 20,
        "the grandchild's 200 MiB shows in the peak: {peak}"
    );
    let ref_peak = arms[0]["concurrency"]["1"]["peak_rss_bytes"]
        .as_u64()
        .unwrap();
    assert!(ref_peak > 0 && ref_peak < 200 << 20, "{ref_peak}");
    // The servers' output is kept in the run directory.
    assert!(run.join("servers").join("fit.stderr.log").is_file());
    // Rounds are per arm.
    let summary = read_json(&run.join("summary.json"));
    assert_eq!(summary["rounds"].as_array().unwrap().len(), 3 * 2 * 2);
    assert_eq!(summary["round_aggregates"][0]["arm"], json!("ref"));

    // summarize rebuilds the same rounds per arm (campaign.json is left as written).
    let before_rounds = read_parquet(&run.join("rounds.parquet"));
    let before_campaign = std::fs::read(run.join("campaign.json")).unwrap();
    let (code, stderr) = summarize(&run);
    assert_eq!(code, Some(0), "{stderr}");
    let rebuilt = read_json(&run.join("summary.json"));
    for key in [
        "rounds",
        "round_aggregates",
        "complete",
        "ending",
        "excluded_phases",
        "planned_requests",
    ] {
        assert_eq!(rebuilt[key], summary[key], "{key}");
    }
    assert_eq!(read_parquet(&run.join("rounds.parquet")), before_rounds);
    assert_eq!(
        std::fs::read(run.join("campaign.json")).unwrap(),
        before_campaign
    );
}

#[test]
fn an_arm_that_cannot_start_is_recorded_and_the_others_still_run() {
    let tmp = tempfile::tempdir().unwrap();
    let arms = json!([
        {"name": "ref", "lane": "quality", "reference": true, "recipe": recipe("none"),
         "endpoint": "http://127.0.0.1:{port}/v1/chat/completions",
         "start": {"command": ["{self}", "mock-worker", "--listen", "127.0.0.1:{port}", "--stall-ms", "52113"]}},
        {"name": "broken", "lane": "quality", "recipe": recipe("q8"),
         "endpoint": "http://127.0.0.1:{port}/v1/chat/completions",
         "start": {"command": ["sh", "-c", "echo no model here >&2; exit 3"]}},
        {"name": "missing", "lane": "performance-fit", "recipe": recipe("q2"),
         "endpoint": "http://127.0.0.1:{port}/v1/chat/completions", "artifact": "/nonexistent/model.gguf",
         "start": {"command": ["{self}", "mock-worker", "--listen", "127.0.0.1:{port}", "--stall-ms", "52113"]}}
    ]);
    let (code, stderr) = replay(tmp.path(), &plan(arms));
    assert_eq!(code, Some(1), "an unavailable arm is not a pass: {stderr}");
    assert!(processes_with("52113").is_empty());
    let c = read_json(&tmp.path().join("run").join("campaign.json"));
    let arms = c["arms"].as_array().unwrap();
    assert_eq!(arms[0]["available"], json!(true));
    assert_eq!(arms[0]["concurrency"]["2"]["attempted_requests"], json!(8));
    assert_eq!(arms[1]["available"], json!(false));
    assert!(
        arms[1]["unavailable_reason"]
            .as_str()
            .unwrap()
            .starts_with("the server exited (exit status: 3) before its health endpoint answered"),
        "{}",
        arms[1]
    );
    assert_eq!(arms[2]["available"], json!(false));
    assert!(
        arms[2]["unavailable_reason"]
            .as_str()
            .unwrap()
            .starts_with("artifact /nonexistent/model.gguf: "),
        "{}",
        arms[2]
    );
    assert_eq!(arms[2]["concurrency"], json!({}));
    // Only what was compared has drift: both other arms were unavailable.
    assert_eq!(
        c["drift"],
        json!([]),
        "an unavailable arm has no drift entry"
    );
    // The reference's cells say every planned round ran.
    assert_eq!(arms[0]["concurrency"]["1"]["complete"], json!(true));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_stops_the_started_servers_too() {
    let tmp = tempfile::tempdir().unwrap();
    let arms = json!([
        {"name": "ref", "lane": "quality", "reference": true, "recipe": recipe("none"),
         "endpoint": "http://127.0.0.1:{port}/v1/chat/completions",
         "start": {"command": ["{self}", "mock-worker", "--listen", "127.0.0.1:{port}", "--stall-ms", "63291", "--per-token-ms", "50"]}}
    ]);
    let mut p = plan(arms);
    p["requests_per_case"] = json!(400);
    let path = write_plan(tmp.path(), "campaign.json", &p);
    let run = tmp.path().join("run");
    let mut child = spawn_bin([
        "replay".as_ref(),
        "--quiet".as_ref(),
        "--grace-seconds".as_ref(),
        "0.2".as_ref(),
        "--out".as_ref(),
        run.as_os_str(),
        path.as_os_str(),
    ]);
    for _ in 0..500 {
        if run.join("exchanges").is_dir() && !processes_with("63291").is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert!(!processes_with("63291").is_empty(), "the arm's server runs");
    signal(&child, "-INT");
    assert_eq!(exit_code(&mut child, 30).await, Some(130));
    assert!(
        processes_with("63291").is_empty(),
        "{:?}",
        processes_with("63291")
    );
    assert!(run.join("campaign.json").is_file());
}

#[test]
fn the_demo_campaign_validates_and_campaign_plans_refuse_mock_worker_and_endpoint() {
    let r = bin()
        .args(["validate", "plans/campaign-demo.json"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&r.stderr);
    assert_eq!(r.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains(
            "campaign 'campaign-demo': 3 arm(s), synthetic evidence, interleaved schedule"
        ),
        "{stderr}"
    );
    for flags in [
        &["--mock-worker"][..],
        &["--endpoint", "http://127.0.0.1:9/v1"][..],
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let r = bin()
            .args(["replay", "plans/campaign-demo.json", "--out"])
            .arg(tmp.path().join("run"))
            .args(flags)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&r.stderr);
        assert_eq!(r.status.code(), Some(2), "{flags:?}: {stderr}");
        assert!(
            stderr.contains("does not go with a campaign plan"),
            "{stderr}"
        );
        assert!(!tmp.path().join("run").exists());
    }
}

/// A worker that answers its health check and fails everything else with 500.
const FAILING: &str = r#"
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer
class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def answer(self):
        n = int(self.headers.get("content-length", "0"))
        self.rfile.read(n)
        code = 200 if self.path == "/health" else 500
        self.send_response(code)
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"{}")
    do_GET = do_POST = answer
HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"#;

#[test]
fn a_failing_arm_stops_alone_and_sequential_arms_never_overlap() {
    let tmp = tempfile::tempdir().unwrap();
    let arms = json!([
        {"name": "ref", "lane": "quality", "reference": true, "recipe": recipe("none"),
         "endpoint": "http://127.0.0.1:{port}/v1/chat/completions",
         "start": {"command": ["{self}", "mock-worker", "--listen", "127.0.0.1:{port}", "--stall-ms", "74411"]}},
        {"name": "failing", "lane": "quality", "recipe": recipe("q8"),
         "endpoint": "http://127.0.0.1:{port}/v1/chat/completions",
         "start": {"command": ["python3", "-c", FAILING, "{port}", "marker-74411"], "health_timeout_seconds": 60}}
    ]);
    let mut p = plan(arms);
    p["schedule"] = json!("sequential");
    let (code, stderr) = replay(tmp.path(), &p);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        processes_with("74411").is_empty(),
        "{:?}",
        processes_with("74411")
    );
    let run = tmp.path().join("run");
    let rows = Rows::read(&run);
    let (arm, outcome, start) = (
        rows.strs("arm"),
        rows.strs("outcome"),
        rows.i64s("start_offset_us"),
    );
    // on_failure: stop stopped the failing arm at its first failure (readiness); the
    // reference ran its whole budget.
    let of = |name: &str| {
        (0..rows.len())
            .filter(|&i| arm[i].as_deref() == Some(name))
            .collect::<Vec<_>>()
    };
    let (r, f) = (of("ref"), of("failing"));
    assert_eq!(r.len(), 1 + 1 + 2 + (1 + 8) + (2 + 8));
    assert!(r.iter().all(|&i| outcome[i].as_deref() == Some("ok")));
    assert_eq!(
        f.len(),
        2,
        "health, then the first readiness request failed"
    );
    assert_eq!(outcome[f[1]].as_deref(), Some("http"));
    // Sequential: every exchange of the first arm before any of the second.
    let last_ref = r.iter().map(|&i| start[i].unwrap()).max().unwrap();
    let first_failing = f.iter().map(|&i| start[i].unwrap()).min().unwrap();
    assert!(last_ref < first_failing, "{last_ref} >= {first_failing}");
    let c = read_json(&run.join("campaign.json"));
    assert_eq!(c["schedule"], json!("sequential"));
    assert_eq!(
        c["arms"][1]["available"],
        json!(true),
        "it started; its requests failed"
    );
}

/// A stand-in `nvidia-smi`: it lists the process whose pid is in `pidfile` with 300 MiB
/// and reports 1000 + 24 MiB in use on two GPUs.
fn fake_nvidia_smi(dir: &Path, pidfile: &Path) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let bin = dir.join("fakebin");
    std::fs::create_dir_all(&bin).unwrap();
    let script = format!(
        "#!/bin/sh\ncase \"$*\" in\n  *query-compute-apps*) [ -f {p} ] && echo \"$(cat {p}), 300\" ;;\n  *query-gpu*) echo 1000; echo 24 ;;\n  *) echo 'GPU 0: Fake (UUID: GPU-0)' ;;\nesac\n",
        p = pidfile.display()
    );
    let path = bin.join("nvidia-smi");
    std::fs::write(&path, script).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    bin
}

#[test]
fn gpu_memory_is_the_groups_own_or_device_level_only_when_sequential() {
    for schedule in ["interleaved", "sequential"] {
        let tmp = tempfile::tempdir().unwrap();
        let pidfile = tmp.path().join("gpu-arm.pid");
        let bin_dir = fake_nvidia_smi(tmp.path(), &pidfile);
        // The "gpu" arm writes its pid (its shell execs into the mock); the "cpu" arm is
        // never listed by nvidia-smi.
        let arms = json!([
            {"name": "gpu", "lane": "quality", "reference": true, "recipe": recipe("none"),
             "endpoint": "http://127.0.0.1:{port}/v1/chat/completions",
             "start": {"command": ["sh", "-c", "echo $$ > \"$2\"; exec \"$0\" mock-worker --listen 127.0.0.1:$1 --per-token-ms 20",
                                   "{self}", "{port}", pidfile.to_str().unwrap()]}},
            {"name": "cpu", "lane": "performance-fit", "recipe": recipe("q4"),
             "endpoint": "http://127.0.0.1:{port}/v1/chat/completions", "worker_metrics": false,
             "start": {"command": ["{self}", "mock-worker", "--listen", "127.0.0.1:{port}", "--per-token-ms", "20"]}}
        ]);
        let mut p = plan(arms);
        p["schedule"] = json!(schedule);
        p["concurrency"] = json!([1]);
        p["requests_per_case"] = json!(3);
        let path = write_plan(tmp.path(), "campaign.json", &p);
        let path_env = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap());
        let out = bin()
            .env("PATH", path_env)
            .args(["replay", "--quiet", "--out"])
            .arg(tmp.path().join("run"))
            .arg(&path)
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let c = read_json(&tmp.path().join("run").join("campaign.json"));
        let gpu = &c["arms"][0]["concurrency"]["1"];
        let cpu = &c["arms"][1]["concurrency"]["1"];
        // An arm the tool starts is scraped at its origin's /metrics by default (every
        // measured request of the cell counted by its worker); `worker_metrics: false`
        // is not.
        assert_eq!(gpu["worker"]["server"], "vllm", "{schedule}: {gpu}");
        assert_eq!(
            gpu["worker"]["requests"].as_f64(),
            gpu["attempted_requests"].as_f64(),
            "{schedule}: {gpu}"
        );
        assert!(cpu.get("worker").is_none(), "{schedule}: {cpu}");
        let summary = read_json(&tmp.path().join("run").join("summary.json"));
        for r in summary["rounds"].as_array().unwrap() {
            assert_eq!(
                r.get("worker").is_some(),
                r["arm"] == "gpu",
                "{schedule}: {r}"
            );
        }
        assert_eq!(
            gpu["peak_vram_bytes"],
            json!(300u64 << 20),
            "{schedule}: {gpu}"
        );
        if schedule == "sequential" {
            assert_eq!(cpu["peak_vram_bytes"], json!(1024u64 << 20), "{cpu}");
            assert!(
                cpu["peak_vram_scope"]
                    .as_str()
                    .unwrap()
                    .starts_with("device-level")
            );
        } else {
            assert_eq!(cpu["peak_vram_bytes"], Value::Null, "{cpu}");
            assert!(
                cpu["peak_vram_scope"]
                    .as_str()
                    .unwrap()
                    .contains("under the interleaved schedule device-level memory would mix"),
                "{cpu}"
            );
        }
    }
}

#[test]
fn a_server_started_elsewhere_is_sampled_through_resources_pid() {
    let tmp = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut server = bin()
        .args(["mock-worker", "--listen", &format!("127.0.0.1:{port}")])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    for _ in 0..200 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let arms = json!([
        {"name": "external", "lane": "quality", "reference": true, "recipe": recipe("none"),
         "endpoint": format!("http://127.0.0.1:{port}/v1/chat/completions"),
         "resources": {"pid": server.id()}},
        {"name": "unknown", "lane": "quality", "recipe": recipe("none"),
         "endpoint": format!("http://127.0.0.1:{port}/v1/chat/completions")}
    ]);
    let (code, stderr) = replay(tmp.path(), &plan(arms));
    let _ = server.kill();
    let _ = server.wait();
    assert_eq!(code, Some(0), "{stderr}");
    let c = read_json(&tmp.path().join("run").join("campaign.json"));
    let sampled = &c["arms"][0]["concurrency"]["1"];
    assert!(
        sampled["peak_rss_bytes"].as_u64().unwrap() > 1 << 20,
        "{sampled}"
    );
    assert!(
        sampled["peak_rss_scope"]
            .as_str()
            .unwrap()
            .contains("resources.pid")
    );
    assert_eq!(sampled["rss_sample_interval_ms"], json!(100));
    let unknown = &c["arms"][1]["concurrency"]["1"];
    assert_eq!(unknown["peak_rss_bytes"], Value::Null);
    assert!(
        unknown["peak_rss_scope"]
            .as_str()
            .unwrap()
            .starts_with("not sampled")
    );
    assert_eq!(
        c["arms"][0]["load"]["load_ms"],
        Value::Null,
        "not started by the tool"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exact_bytes_oracle_still_counts_the_answers_usage() {
    // A worker with one fixed answer, judged byte for byte: the campaign's decode rate
    // comes from the answer's usage whatever the oracle.
    const ANSWER: &str = r#"{"choices":[{"message":{"content":"Paris"}}],"usage":{"prompt_tokens":3,"completion_tokens":4}}"#;
    let peer = Peer::start(std::sync::Arc::new(|_, _: &Seen| {
        Reply::json(200, &serde_json::from_str::<Value>(ANSWER).unwrap())
    }))
    .await;
    let tmp = tempfile::tempdir().unwrap();
    let arms = json!([
        {"name": "ref", "lane": "quality", "reference": true, "recipe": recipe("none"),
         "endpoint": peer.url("/v1/chat/completions")}
    ]);
    let mut p = plan(arms);
    p["cases"][0]["expected_response_text"] = json!(ANSWER);
    let dir = tmp.path().to_path_buf();
    let (code, stderr) = tokio::task::spawn_blocking(move || replay(&dir, &p))
        .await
        .unwrap();
    assert_eq!(code, Some(0), "{stderr}");
    let c = read_json(&tmp.path().join("run").join("campaign.json"));
    let cell = &c["arms"][0]["concurrency"]["1"];
    assert_eq!(cell["output_tokens"], json!(8 * 4), "{cell}");
    assert!(
        cell["aggregate_decode_tokens_per_sec"].as_f64().unwrap() > 0.0,
        "{cell}"
    );
}

/// An OpenAI-style JSON answer saying `content`, with its usage.
fn answer(content: &str) -> Value {
    json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}],
           "usage": {"prompt_tokens": 3, "completion_tokens": 6}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_answers_get_decode_intervals_and_mcnemar_counts_a_fit_arms_mismatches() {
    // Two servers answering JSON (no streams): the reference echoes each prompt; the
    // performance-fit arm echoes the first two prompts and answers the other two wrongly.
    // Before: no aggregate decode interval (JSON answers counted 0 tokens) and McNemar
    // counted the fit arm's `ok` mismatches as passes.
    let echo = |wrong_from: usize| -> Handler {
        std::sync::Arc::new(move |_, seen: &Seen| {
            if seen.path == "/metrics" {
                return Reply::bytes(404, b"no metrics here".to_vec());
            }
            let Ok(v) = serde_json::from_slice::<Value>(&seen.body) else {
                return Reply::json(200, &json!({})); // the health check
            };
            let prompt = v["messages"][0]["content"].as_str().unwrap().to_string();
            let n: usize = prompt[1..].parse().unwrap();
            let content = if n >= wrong_from { "wrong" } else { &prompt };
            let mut r = Reply::json(200, &answer(content));
            r.delay = std::time::Duration::from_millis(2);
            r
        })
    };
    let (reference, fit) = (Peer::start(echo(99)).await, Peer::start(echo(2)).await);
    let tmp = tempfile::tempdir().unwrap();
    let arms = json!([
        {"name": "ref", "lane": "quality", "reference": true, "recipe": recipe("none"),
         "endpoint": reference.url("/v1/chat/completions"), "worker_metrics": true},
        {"name": "fit", "lane": "performance-fit", "recipe": recipe("q4"),
         "endpoint": fit.url("/v1/chat/completions"), "worker_metrics": true}
    ]);
    let variants: Vec<Value> = (0..4)
        .map(|n| {
            let p = format!("p{n}");
            json!({"name": p, "request": {"messages": [{"role": "user", "content": p}], "max_tokens": 6},
                   "expected_response": answer(&p)})
        })
        .collect();
    let mut p = plan(arms);
    p["cases"][0]["variants"] = json!(variants);
    p["cases"][0].as_object_mut().unwrap().remove("request");
    p["concurrency"] = json!([1]);
    p["repetitions"] = json!(5);
    let dir = tmp.path().to_path_buf();
    let (code, stderr) = tokio::task::spawn_blocking(move || replay(&dir, &p))
        .await
        .unwrap();
    assert_eq!(code, Some(0), "{stderr}");
    let run = tmp.path().join("run");
    let c = read_json(&run.join("campaign.json"));
    // Servers without /metrics: said at the first failure per arm, kept per arm, and
    // not asked again after 3 answers of 404 (5 rounds would scrape 10 times or more). A
    // 4th is asked only when an interval scrape was on its way beside a round's edge
    // scrape as the third 404 came; it is counted too.
    let asked = |p: &Peer| p.seen().iter().filter(|s| s.path == "/metrics").count();
    for (i, (arm, peer)) in [("ref", &reference), ("fit", &fit)].into_iter().enumerate() {
        let n = asked(peer);
        assert!((3..=4).contains(&n), "{arm}: {n} scrapes of /metrics");
        let h = &c["arms"][i]["worker_metrics_scrapes"];
        assert_eq!(
            (&h["arm"], &h["scrapes"], &h["failed"], &h["first_failure"]),
            (&json!(arm), &json!(n), &json!(n), &json!("status 404")),
            "{h}"
        );
        assert!(
            h["stopped"]
                .as_str()
                .unwrap()
                .contains("3 scrapes in a row answered status 404")
        );
        let said = format!("arm {arm}'s worker metrics: the scrape of http://");
        assert_eq!(stderr.matches(&said).count(), 1, "{stderr}");
    }
    let summary = read_json(&run.join("summary.json"));
    let failed: Vec<&Value> = summary["worker_metrics_scrapes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| &h["failed"])
        .collect();
    assert_eq!(failed, [&json!(asked(&reference)), &json!(asked(&fit))]);
    let entry = c["intervals"]["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["arm"] == "fit" && e["metric"] == "aggregate_decode_tokens_per_sec")
        .unwrap_or_else(|| panic!("no aggregate decode interval: {}", c["intervals"]))
        .clone();
    assert!(entry["interval"].is_object(), "{entry}");
    assert_eq!(entry["rounds_arm"], json!(5), "{entry}");
    let fit_drift = c["drift"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["arm"] == "fit")
        .unwrap()
        .clone();
    let m = &fit_drift["mcnemar"];
    assert_eq!(m["pairs"], json!(4), "{m}");
    assert_eq!(m["both_passed"], json!(2), "{m}");
    assert_eq!(m["only_reference_passed"], json!(2), "{m}");
    // The rows: JSON answers carry their usage and the oracle's judgment.
    let rows = Rows::read(&run);
    let (arm, phase) = (rows.strs("arm"), rows.strs("phase"));
    let (tokens, source) = (
        rows.i64s("output_tokens"),
        rows.strs("output_tokens_source"),
    );
    let passed = rows.bools("oracle_passed");
    let mut fit_rows = (0, 0);
    for i in (0..rows.len()).filter(|&i| phase[i].as_deref() == Some("measured")) {
        assert_eq!((tokens[i], source[i].as_deref()), (Some(6), Some("usage")));
        if arm[i].as_deref() == Some("fit") {
            fit_rows.0 += 1;
            fit_rows.1 += usize::from(passed[i] == Some(false));
        }
    }
    assert_eq!(
        fit_rows,
        (20, 10),
        "fit rows measured, and judged mismatches"
    );
}
