//! The second hour: campaigns, recover, compare and verdict never report a result they did
//! not measure. Each test is one way a real user got a result that was not measured: an
//! arm measured on another arm's server, `recover` on a live run, `compare` with a crashed
//! run, an unavailable arm said nowhere under `--quiet`, a pre-registered verdict
//! overwritten, and a decision made on missing evidence.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::*;

const DEMO_CONTRACT: &str = "plans/campaign-demo.contract.json";

/// The demo campaign with its twin's start command replaced by `command`, written to `dir`.
fn demo_with_twin(dir: &Path, command: Value) -> PathBuf {
    let mut plan = read_json(Path::new("plans/campaign-demo.json"));
    plan["arms"][1]["start"]["command"] = command;
    write_plan(dir, "campaign.json", &plan)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_arm_whose_server_exits_is_never_measured_on_another_server() {
    let tmp = tempfile::tempdir().unwrap();
    // Another server already holds the port the twin's command asks for: the twin's own
    // server cannot listen and exits, while this one answers its health check.
    let squatter = start_mock(matrix_proxy::MockConfig {
        prefill_ms: 20.0,
        ..Default::default()
    })
    .await;
    let port = squatter.addr.port();
    let mut plan = read_json(Path::new("plans/campaign-demo.json"));
    plan["arms"][1]["endpoint"] = json!(format!("http://127.0.0.1:{port}/v1/chat/completions"));
    plan["arms"][1]["start"]["command"] = json!([
        "{self}",
        "mock-worker",
        "--listen",
        format!("127.0.0.1:{port}")
    ]);
    let path = write_plan(tmp.path(), "campaign.json", &plan);
    let out = tmp.path().join("run");
    let (code, _, stderr) = tokio::task::spawn_blocking({
        let (path, out) = (path.clone(), out.clone());
        move || run(&["replay", "-q", s(&path), "--out", s(&out)])
    })
    .await
    .unwrap();
    assert_eq!(code, Some(1), "an unavailable arm is not a pass: {stderr}");
    let c = read_json(&out.join("campaign.json"));
    let twin = &c["arms"][1];
    assert_eq!(twin["name"], json!("twin"));
    assert_eq!(twin["available"], json!(false), "{twin}");
    // Seen exited at bring-up (right after the health answer) or after its prelude or a
    // round: either way the reason says so.
    let why = twin["unavailable_reason"].as_str().unwrap_or_default();
    assert!(
        why.contains("exited (exit status: ") && why.contains("its port"),
        "{why}"
    );
    assert_eq!(
        twin["concurrency"],
        json!({}),
        "nothing it measured is kept"
    );
    assert!(
        stderr.contains("matrix-proxy: arm twin unavailable: ")
            && stderr.contains("exited (exit status: "),
        "{stderr}"
    );
    let summary = read_json(&out.join("summary.json"));
    let rounds = summary["rounds"].as_array().unwrap();
    assert!(!rounds.is_empty());
    assert!(
        rounds.iter().all(|r| r["arm"] != json!("twin")),
        "none of its rounds is kept either"
    );
    // No drift for it, and the reference's answers were never compared with the squatter's.
    let drift = c["drift"].as_array().unwrap();
    assert!(drift.iter().all(|d| d["arm"] != json!("twin")), "{drift:?}");

    // Two started arms on one literal port are refused before anything runs.
    let mut both = plan.clone();
    both["arms"][0]["endpoint"] = both["arms"][1]["endpoint"].clone();
    both["arms"][0]["start"]["command"] = both["arms"][1]["start"]["command"].clone();
    let path = write_plan(tmp.path(), "both.json", &both);
    let (code, _, stderr) = run(&["validate", s(&path)]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "arms[1].endpoint: arms[0] ('reference') and arms[1] ('twin') both start a server on 127.0.0.1:{port}"
        )),
        "{stderr}"
    );
    // ... but not under the sequential schedule, where one server is up at a time.
    both["schedule"] = json!("sequential");
    let path = write_plan(tmp.path(), "sequential.json", &both);
    let (code, _, stderr) = run(&["validate", s(&path)]);
    assert_eq!(code, Some(0), "{stderr}");
}

/// The demo plan, meant for the built-in mock worker.
fn demo_plan() -> PathBuf {
    PathBuf::from("plans/demo.json")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_being_written_is_refused_by_every_reader_and_still_passes() {
    let tmp = tempfile::tempdir().unwrap();
    let plan = demo_plan();
    let out = tmp.path().join("run");
    // 80 ms a request: the run lasts well over ten seconds.
    let mut child = spawn_bin([
        "replay".as_ref(),
        "--quiet".as_ref(),
        "--mock-worker".as_ref(),
        "--mock-prefill-ms".as_ref(),
        "80".as_ref(),
        "--out".as_ref(),
        out.as_os_str(),
        plan.as_os_str(),
    ]);
    let pid = child.id().unwrap();
    let lock = out.join(".lock");
    let mut seen = false;
    for _ in 0..1000 {
        seen = std::fs::read_to_string(&lock).is_ok_and(|p| p.trim() == pid.to_string());
        if seen {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(seen, "the writer's lock, with its pid, within 10 s");
    let busy = format!("run is still being written (pid {pid})");
    for args in [
        vec!["recover", s(&out)],
        vec!["summarize", s(&out)],
        vec!["report", s(&out), "--out", s(&tmp.path().join("r.html"))],
        vec!["compare", s(&out), s(&out)],
    ] {
        let (code, _, stderr) = tokio::task::spawn_blocking({
            let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
            move || {
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                run(&args)
            }
        })
        .await
        .unwrap();
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(&busy), "{args:?}: {stderr}");
    }
    assert_eq!(
        exit_code(&mut child, 60).await,
        Some(0),
        "the run was not harmed"
    );
    let summary = read_json(&out.join("summary.json"));
    assert_eq!(summary["ending"], json!("passed"));
    assert_eq!(summary["rows_written"], json!(Rows::read(&out).len()));
    assert!(!lock.exists(), "the lock goes with the writer");
    assert!(!out.join("quarantine").exists());
    // Once the writer is gone, the readers read it.
    let (code, _) = summarize(&out);
    assert_eq!(code, Some(0));
}

#[test]
fn compare_refuses_a_run_that_did_not_finish() {
    let tmp = tempfile::tempdir().unwrap();
    let plan = demo_plan();
    let a = tmp.path().join("a");
    let (code, _, stderr) = run(&["replay", "-q", "--mock-worker", s(&plan), "--out", s(&a)]);
    assert_eq!(code, Some(0), "{stderr}");
    // B as a run killed early leaves it: config.json and plan.json, no summary, no rows.
    let b = tmp.path().join("b");
    std::fs::create_dir_all(b.join("exchanges")).unwrap();
    for f in ["config.json", "plan.json"] {
        std::fs::copy(a.join(f), b.join(f)).unwrap();
    }
    for (x, y) in [(&a, &b), (&b, &a)] {
        let (code, _, stderr) = run(&[
            "compare",
            s(x),
            s(y),
            "--out",
            s(&tmp.path().join("c.json")),
        ]);
        assert_eq!(code, Some(3), "{stderr}");
        assert!(
            stderr.contains(&format!(
                "{}: no summary.json: the run did not finish",
                b.display()
            )),
            "{stderr}"
        );
    }
    assert!(!tmp.path().join("c.json").exists());
}

#[test]
fn an_unavailable_arm_is_said_on_stderr_even_under_quiet() {
    let tmp = tempfile::tempdir().unwrap();
    let plan = demo_with_twin(
        tmp.path(),
        json!(["/nonexistent/llama-server", "--port", "{port}"]),
    );
    let out = tmp.path().join("run");
    let (code, stdout, stderr) = run(&["replay", "-q", s(&plan), "--out", s(&out)]);
    assert_eq!(code, Some(1), "{stderr}");
    assert_eq!(stdout, "");
    let line = "matrix-proxy: arm twin unavailable: cannot start \"/nonexistent/llama-server\": No such file or directory";
    assert_eq!(stderr.matches(line).count(), 1, "{stderr}");
}

#[test]
fn verdict_never_writes_over_the_pre_registered_verdict() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    let (code, _, stderr) = run(&[
        "replay",
        "-q",
        "plans/campaign-demo.json",
        "--contract",
        DEMO_CONTRACT,
        "--out",
        s(&out),
    ]);
    assert_eq!(code, Some(0), "{stderr}");
    let registered = std::fs::read(out.join("verdict.json")).unwrap();
    // A campaign's endpoints are its arms': config.json says so instead of a stand-in.
    let config = read_json(&out.join("config.json"));
    assert_eq!(
        config["endpoint"],
        json!("per arm (see campaign.json's arms)")
    );
    // Another contract for the same plan: its verdict is post hoc.
    let mut other = read_json(Path::new(DEMO_CONTRACT));
    other["thresholds"]["max_p95_latency_ratio"] = json!(2.0);
    let other = write_plan(tmp.path(), "other.contract.json", &other);
    let aliases = [
        out.join("verdict.json"),
        out.join(".").join("verdict.json"),
        out.join("exchanges").join("..").join("verdict.json"),
    ];
    for contract in [Path::new(DEMO_CONTRACT), other.as_path()] {
        for alias in &aliases {
            let (code, _, stderr) = run(&[
                "verdict",
                s(&out),
                "--contract",
                s(contract),
                "--out",
                s(alias),
            ]);
            assert_eq!(code, Some(2), "{}: {stderr}", alias.display());
            assert!(
                stderr.contains("that is the run's pre-registered verdict"),
                "{stderr}"
            );
        }
    }
    assert_eq!(std::fs::read(out.join("verdict.json")).unwrap(), registered);
    // The default place of a post-hoc verdict, and any other path, are written.
    let (code, _, stderr) = run(&["verdict", s(&out), "--contract", s(&other)]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(out.join("verdict.post-hoc.json").is_file());
    assert_eq!(std::fs::read(out.join("verdict.json")).unwrap(), registered);
    // compare chooses a side of each run by name: here the run with itself, twin against
    // the reference.
    let c = tmp.path().join("c.json");
    let (code, _, stderr) = run(&[
        "compare",
        s(&out),
        s(&out),
        "--arm-a",
        "reference",
        "--arm-b",
        "twin",
        "--out",
        s(&c),
    ]);
    assert_eq!(code, Some(0), "{stderr}");
    let cmp = read_json(&c);
    assert_eq!(
        cmp["pairs"].as_array().map(Vec::len),
        Some(1),
        "{}",
        cmp["pairs"]
    );
    assert_eq!(cmp["drift"][0]["side_a"], json!("reference"));
    assert_eq!(cmp["drift"][0]["side_b"], json!("twin"));
    let (code, _, stderr) = run(&[
        "compare",
        s(&out),
        s(&out),
        "--arm-a",
        "nosuch",
        "--out",
        s(&c),
    ]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--arm-a nosuch: "), "{stderr}");
    assert!(
        stderr.contains("its available arms: reference, twin, fast-fit"),
        "{stderr}"
    );
    // A run that was interrupted ended before its plan: compare's contract evaluation is
    // inconclusive, as verdict's is.
    let mut summary = read_json(&out.join("summary.json"));
    summary["ending"] = json!("interrupted");
    std::fs::write(out.join("summary.json"), summary.to_string()).unwrap();
    let (code, _, stderr) = run(&[
        "compare",
        s(&out),
        s(&out),
        "--contract",
        DEMO_CONTRACT,
        "--out",
        s(&tmp.path().join("c2.json")),
    ]);
    assert_eq!(code, Some(0), "{stderr}");
    let cmp = read_json(&tmp.path().join("c2.json"));
    assert_eq!(
        cmp["verdict"]["verdict"],
        json!("inconclusive"),
        "{}",
        cmp["verdict"]
    );
}

#[test]
fn a_campaign_missing_an_arms_evidence_is_inconclusive_never_rejected() {
    let tmp = tempfile::tempdir().unwrap();
    let plan = demo_with_twin(tmp.path(), json!(["/nonexistent/llama-server"]));
    let out = tmp.path().join("run");
    let (code, stdout, stderr) = run(&[
        "replay",
        s(&plan),
        "--contract",
        DEMO_CONTRACT,
        "--out",
        s(&out),
    ]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("matrix-proxy: verdict: inconclusive (verdict.json)"),
        "{stderr}"
    );
    assert!(stdout.contains("quality lane n/a"), "{stdout}");
    let v = read_json(&out.join("verdict.json"));
    assert_eq!(
        (&v["verdict"], &v["quality_lane_pass"], &v["post_hoc"]),
        (&json!("inconclusive"), &Value::Null, &json!(false))
    );
    let missing = v["missing_evidence"].as_array().unwrap();
    assert!(
        missing
            .iter()
            .any(|m| m["gate"] == json!("quality_min_exact_match")
                && m["arm"] == json!("twin")
                && m["reason"]
                    .as_str()
                    .is_some_and(|r| r.contains("cannot start"))),
        "{missing:?}"
    );
    let exact = &v["gates"][0];
    assert_eq!(
        (&exact["gate"], &exact["pass"]),
        (&json!("quality_min_exact_match"), &Value::Null)
    );
    // The same evidence read later says the same.
    let (code, _, stderr) = run(&["verdict", s(&out), "--contract", DEMO_CONTRACT]);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(
        read_json(&out.join("verdict.json"))["verdict"],
        json!("inconclusive")
    );
}

#[test]
fn a_start_command_gets_its_env_cwd_and_a_warm_start() {
    let tmp = tempfile::tempdir().unwrap();
    let work = tmp.path().join("work");
    std::fs::create_dir(&work).unwrap();
    // The twin's server writes what it was given into its working directory, then serves.
    let script = "echo \"$GREETING on $SRV_PORT\" >> started; exec \"$0\" mock-worker --listen 127.0.0.1:$1 --prefill-ms 20 --per-token-ms 4";
    let mut plan = read_json(Path::new("plans/campaign-demo.json"));
    plan["arms"][1]["start"] = json!({
        "command": ["sh", "-c", script, "{self}", "{port}"],
        "env": {"GREETING": "hello", "SRV_PORT": "{port}"},
        "cwd": s(&work),
        "warm_start": true,
    });
    let path = write_plan(tmp.path(), "campaign.json", &plan);
    let out = tmp.path().join("run");
    let (code, _, stderr) = run(&["replay", "-q", s(&path), "--out", s(&out)]);
    assert_eq!(code, Some(0), "{stderr}");
    let started = std::fs::read_to_string(work.join("started")).unwrap();
    let lines: Vec<&str> = started.lines().collect();
    assert_eq!(
        lines.len(),
        2,
        "started twice (warm, then measured): {started}"
    );
    assert!(
        lines.iter().all(|l| l.starts_with("hello on ")),
        "{started}"
    );
    assert_ne!(
        lines[0], "hello on {port}",
        "{{port}} is substituted in env"
    );
    assert!(out.join("servers").join("twin.warm.stderr.log").is_file());
    assert!(out.join("servers").join("twin.stderr.log").is_file());
    let c = read_json(&out.join("campaign.json"));
    assert_eq!(c["arms"][1]["available"], json!(true));
    assert!(c["arms"][1]["load"]["load_ms"].as_f64().is_some());
}
