//! The binary as a user runs it: exit codes, stdout/stderr discipline, refusal of an
//! existing run directory, and the README's demo command.

use std::process::Command;
use std::sync::Arc;

use serde_json::json;

use crate::support::*;

#[test]
fn validate_accepts_good_plans_and_names_the_path_of_bad_ones() {
    for plan in [
        "plans/demo.json",
        "tests/fixtures/serving_matrix.example.json",
    ] {
        let out = bin().args(["validate", plan]).output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{plan}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.stdout.is_empty());
    }
    let tmp = tempfile::tempdir().unwrap();
    let bad = write_plan(
        tmp.path(),
        "bad.json",
        &json!({"endpoint": "http://h/x", "cases": [{"name": "a", "variants": [{"name": "v", "request": {}}]},
                                                    {"name": "b", "request": {}, "expected_response": {}}],
                "concurrency": [1], "requests_per_case": 1, "timeout_seconds": 1, "metadata": metadata()}),
    );
    let out = bin().arg("validate").arg(&bad).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad.json: 1 problem"), "{err}");
    assert!(
        err.contains("cases[0].variants[0].expected_response: is required"),
        "{err}"
    );
    let out = bin()
        .args(["validate", "no/such/plan.json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no/such/plan.json: cannot read the plan")
    );
}

#[test]
fn bad_flags_are_usage_errors_and_help_is_success() {
    assert_eq!(
        bin()
            .args(["replay", "--no-such-flag"])
            .output()
            .unwrap()
            .status
            .code(),
        Some(2)
    );
    assert_eq!(
        bin().args(["--help"]).output().unwrap().status.code(),
        Some(0)
    );
    let out = bin()
        .args([
            "replay",
            "plans/demo.json",
            "--mock-worker",
            "--endpoint",
            "http://127.0.0.1:1/x",
        ])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "--endpoint and --mock-worker conflict"
    );
    // The mock's latency flags go with --mock-worker, and take sane values only.
    for (flags, says) in [
        (&["--mock-prefill-ms", "5"][..], "--mock-worker"),
        (
            &["--mock-worker", "--mock-prefill-ms=-1"][..],
            "--mock-prefill-ms must be a number of milliseconds from 0 to 3600000, got -1",
        ),
        (
            &["--mock-worker", "--mock-per-token-ms", "NaN"][..],
            "--mock-per-token-ms must be a number of milliseconds",
        ),
        (
            &["--mock-worker", "--mock-max-batch", "0"][..],
            "--mock-max-batch must be at least 1",
        ),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let out = bin()
            .args(["replay", "plans/demo.json", "--out"])
            .arg(tmp.path().join("run"))
            .args(flags)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flags:?}: {stderr}");
        assert!(stderr.contains(says), "{flags:?}: {stderr}");
        assert!(!tmp.path().join("run").exists(), "{flags:?} created output");
    }
    // An invalid port is refused, never sent to the default port.
    for args in [
        &[
            "replay",
            "plans/demo.json",
            "--endpoint",
            "http://127.0.0.1:abc/v1",
        ][..],
        &[
            "replay",
            "plans/demo.json",
            "--endpoint",
            "http://127.0.0.1:99999/v1",
        ][..],
        &[
            "serve",
            "--upstream",
            "http://127.0.0.1:/",
            "--listen",
            "127.0.0.1:0",
        ][..],
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let out = bin()
            .args(args)
            .arg("--out")
            .arg(tmp.path().join("run"))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains("has an invalid port"), "{args:?}: {stderr}");
        assert!(!tmp.path().join("run").exists());
    }
    let out = bin()
        .args(["mock-worker", "--listen", "127.0.0.1:0", "--prefill-ms=-3"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn existing_run_directory_is_refused_and_left_untouched() {
    let tmp = tempfile::tempdir().unwrap();
    let out_dir = tmp.path().join("run");
    std::fs::create_dir(&out_dir).unwrap();
    std::fs::write(out_dir.join("keep.txt"), "mine").unwrap();
    let out = bin()
        .args(["replay", "plans/demo.json", "--mock-worker", "--out"])
        .arg(&out_dir)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("already exists"));
    let names: Vec<String> = std::fs::read_dir(&out_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into())
        .collect();
    assert_eq!(names, vec!["keep.txt".to_string()]);
}

#[test]
fn demo_command_runs_end_to_end_on_the_mock_and_prints_only_the_table() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("demo");
    let out = bin()
        .args(["replay", "plans/demo.json", "--mock-worker", "--out"])
        .arg(&run)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    // The banner names where the cases really go (two of them have their own path).
    assert!(
        stderr.contains("(paths /v1/chat/completions, /v1/completions)"),
        "{stderr}"
    );
    assert!(stderr.contains(" exchanges recorded in "), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    // Generator warnings (a busy machine) may follow the table; they are checked below.
    let lines: Vec<&str> = stdout
        .lines()
        .filter(|l| !l.starts_with("warning: "))
        .collect();
    assert!(
        lines[0].starts_with("case") && lines[0].contains("req/s") && lines[0].contains("p95 ms"),
        "{stdout}"
    );
    // 3 cases x 2 concurrency levels, then four footnote lines (one for streams, one for
    // the non-streaming answers' usage).
    assert_eq!(lines.len(), 1 + 6 + 4, "{stdout}");
    assert!(
        lines[0].contains("TTFT ms") && lines[0].contains("tok/s"),
        "{stdout}"
    );
    assert!(lines[5].starts_with("chat-stream"), "{stdout}");
    assert!(
        lines[1].starts_with("chat") && lines[1].contains("2/2") && lines[1].contains("48/48"),
        "{stdout}"
    );
    // A non-streaming case's tok/s comes from its answers' usage, and says so.
    assert!(lines[1].contains(" (usage)"), "{stdout}");
    assert!(
        stdout.contains("tok/s (usage): output tokens the JSON answers' usage reported"),
        "{stdout}"
    );
    for f in ["plan.json", "config.json", "summary.json", "rounds.parquet"] {
        assert!(run.join(f).is_file(), "{f} missing");
    }
    let rows = Rows::read(&run);
    assert_eq!(rows.len(), 316);
    // chat-stream: readiness 1 + warm-up 2 + feasibility 1 + 4 + measured 4 x 24.
    assert_eq!(
        rows.bools("is_stream")
            .iter()
            .filter(|s| **s == Some(true))
            .count(),
        104
    );
    assert!(
        rows.strs("outcome")
            .iter()
            .all(|o| o.as_deref() == Some("ok"))
    );
    let summary = read_json(&run.join("summary.json"));
    assert_eq!(summary["complete"], json!(true));
    // Every measured round says how busy the tool itself was.
    let rounds = summary["rounds"].as_array().unwrap();
    assert_eq!(rounds.len(), 12);
    for r in rounds {
        let g = &r["generator"];
        let share = g["cpu_share"].as_f64().unwrap();
        assert!(share > 0.0 && share < 1.5, "{g}");
        assert!(g["cpu_seconds"].as_f64().unwrap() > 0.0, "{g}");
        assert!(g["cores"].as_u64().unwrap() >= 1, "{g}");
        // Rounds of the demo last long enough for several 10 ms probe ticks.
        assert!(g["dispatch_lag_seconds"]["p50"].as_f64().is_some(), "{g}");
        let warned = stdout.lines().any(|l| {
            l.starts_with("warning: ")
                && l.contains(&format!(
                    "{} c={} round {}",
                    r["case"].as_str().unwrap(),
                    r["concurrency"],
                    r["repetition"].as_u64().unwrap() + 1
                ))
        });
        assert_eq!(warned, !g["warning"].is_null(), "{g}\n{stdout}");
    }
    let rp = Rows::read_file(&run.join("rounds.parquet"));
    assert!(
        rp.f64s("generator_cpu_share").iter().all(|v| v.is_some()),
        "rounds.parquet has the generator's CPU share of every round"
    );
    // --quiet: nothing on stdout at all.
    let q = bin()
        .args([
            "replay",
            "plans/demo.json",
            "--mock-worker",
            "--quiet",
            "--out",
        ])
        .arg(tmp.path().join("quiet"))
        .output()
        .unwrap();
    assert_eq!(q.status.code(), Some(0));
    assert!(q.stdout.is_empty() && q.stderr.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_dispatch_keeps_every_row_and_exits_130() {
    let peer = Peer::start(slow_echo_handler(std::time::Duration::from_millis(40))).await;
    let tmp = tempfile::tempdir().unwrap();
    let (mut child, run) =
        spawn_replay(tmp.path(), &echo_plan(peer.url("/x"), "fresh", 2, 200), &[]);
    // Wait until measured traffic flows, then SIGTERM.
    for _ in 0..400 {
        if peer.seen().len() >= 12 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(peer.seen().len() >= 12, "replay did not start");
    signal(&child, "-TERM");
    assert_eq!(
        exit_code(&mut child, 30).await,
        Some(130),
        "exits after SIGTERM"
    );
    let seen = peer.seen().len();
    assert!(
        seen < 1 + 1 + 2 + 2 + 400,
        "dispatch stopped early ({seen} requests)"
    );
    let rows = Rows::read(&run);
    assert_eq!(
        rows.len(),
        seen,
        "every request that reached the peer has its row"
    );
    let summary = read_json(&run.join("summary.json"));
    assert_eq!(summary["ending"], json!("interrupted"));
    assert_eq!(summary["complete"], json!(false));
    assert!(read_json(&run.join("config.json"))["finished_at"].is_string());

    // summarize never turns an interrupted run into a pass, and keeps the original.
    let original = std::fs::read(run.join("summary.json")).unwrap();
    let (code, stderr) = summarize(&run);
    assert_eq!(code, Some(1), "{stderr}");
    let rebuilt = read_json(&run.join("summary.json"));
    assert_eq!(rebuilt["ending"], json!("interrupted"));
    assert_eq!(rebuilt["complete"], json!(false));
    assert_eq!(
        std::fs::read(run.join("summary.orig.json")).unwrap(),
        original
    );
}

#[test]
fn hostile_plans_get_clear_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "nested.json",
            format!("{}{}", "[".repeat(200_000), "]".repeat(200_000)).into_bytes(),
            "recursion limit",
        ),
        (
            "utf8.json",
            b"{\"endpoint\": \"\xff\"}".to_vec(),
            "not valid UTF-8",
        ),
        (
            "hugenum.json",
            b"{\"requests_per_case\": 1e400}".to_vec(),
            "not valid JSON",
        ),
        ("empty.json", Vec::new(), "not valid JSON"),
    ];
    for (name, bytes, msg) in cases {
        let p = tmp.path().join(name);
        std::fs::write(&p, bytes).unwrap();
        let out = bin().arg("validate").arg(&p).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{name}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(msg) && err.contains(name), "{name}: {err}");
    }
    // A 100 MB plan is refused by its size, before it is read.
    let big = tmp.path().join("big.json");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(100 << 20)
        .unwrap();
    let out = bin().arg("validate").arg(&big).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("plans are limited to 64 MiB"));
}

#[test]
fn no_record_writes_no_exchanges_but_every_report() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("norec");
    let out = bin()
        .args([
            "replay",
            "plans/demo.json",
            "--mock-worker",
            "--no-record",
            "--threads",
            "2",
            "--out",
        ])
        .arg(&run)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("recording off (--no-record)"), "{stderr}");
    // One valid, empty part: queries over exchanges/ work and find no rows.
    assert_eq!(Rows::read(&run).len(), 0);
    assert_eq!(part_files(&run).len(), 1);
    let summary = read_json(&run.join("summary.json"));
    assert_eq!(summary["complete"], json!(true));
    assert_eq!(summary["rows_written"], json!(0));
    assert_eq!(summary["rounds"].as_array().unwrap().len(), 12);
    let config = read_json(&run.join("config.json"));
    assert_eq!(config["extra"]["recording"]["exchanges"], json!(false));
    assert_eq!(config["extra"]["runtime_threads"], json!(2));
    assert!(summary.get("rows_encoded_during_rounds").is_none());
    assert!(run.join("rounds.parquet").is_file());
}

/// Replay `plan` with the binary (quietly) and return its exit code and stderr lines.
async fn replay_stderr(
    dir: &std::path::Path,
    plan: &serde_json::Value,
) -> (Option<i32>, Vec<String>) {
    let path = write_plan(dir, "p.json", plan);
    let out = dir.join("run");
    let output = tokio::task::spawn_blocking(move || {
        bin()
            .args(["replay", "--quiet", "--out"])
            .arg(&out)
            .arg(&path)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    (
        output.status.code(),
        stderr.lines().map(str::to_string).collect(),
    )
}

fn junk_status(_: &str) -> Vec<u8> {
    b"HELLO WORLD\r\n\r\n".to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_run_says_its_first_failure_and_the_failures_by_kind() {
    let plan = |endpoint: String| {
        json!({
            "endpoint": endpoint,
            "cases": [{"name": "c", "request": {"q": 1}, "expected_response": {"a": 1}}],
            "concurrency": [1], "requests_per_case": 1, "timeout_seconds": 2, "metadata": metadata(),
        })
    };
    // Connection refused: a port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    // Health answered 404; an oracle mismatch.
    let not_found = Peer::start(Arc::new(|_, _: &Seen| Reply::json(404, &json!({})))).await;
    let wrong = Peer::start(Arc::new(|_, s: &Seen| {
        if s.method == "GET" {
            Reply::json(200, &json!({}))
        } else {
            Reply::json(200, &json!({"a": 2}))
        }
    }))
    .await;
    // A worker refusing the request says why (transformers serve pinned to another model).
    let pinned = Peer::start(Arc::new(|_, s: &Seen| {
        if s.method == "GET" {
            Reply::json(200, &json!({}))
        } else {
            let why = "Server is pinned to './model'; requested 'model'";
            Reply::json(400, &json!({"detail": why}))
        }
    }))
    .await;
    let junk = raw_peer(junk_status).await;
    let cases = [
        (
            format!("http://127.0.0.1:{port}/v1"),
            format!("matrix-proxy: first failure: health -> transport: connect to 127.0.0.1:{port}: Connection refused (os error 111)"),
            "transport 1",
        ),
        (
            not_found.url("/v1"),
            format!(
                "matrix-proxy: first failure: health -> http: status 404 from http://{}/health, expected 200; the answer says \"{{}}\"",
                not_found.addr
            ),
            "http 1",
        ),
        (
            pinned.url("/v1"),
            format!(
                "matrix-proxy: first failure: readiness case 'c' -> http: status 400 from http://{}/v1, expected 200; the answer says \"Server is pinned to './model'; requested 'model'\"",
                pinned.addr
            ),
            "http 1",
        ),
        (
            format!("http://{junk}/v1"),
            "matrix-proxy: first failure: health -> transport: send request: invalid HTTP version parsed".to_string(),
            "transport 1",
        ),
        (
            wrong.url("/v1"),
            "matrix-proxy: first failure: readiness case 'c' -> correctness: oracle mismatch at /a: expected 1, found 2".to_string(),
            "correctness 1",
        ),
    ];
    for (endpoint, first, kinds) in cases {
        let tmp = tempfile::tempdir().unwrap();
        let (code, lines) = replay_stderr(tmp.path(), &plan(endpoint.clone())).await;
        assert_eq!(code, Some(1), "{endpoint}: {lines:?}");
        assert_eq!(
            lines,
            vec![
                first,
                format!("matrix-proxy: failures by kind (all phases): {kinds}")
            ],
            "{endpoint}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_with_only_an_origin_keeps_the_plans_paths_and_a_slash_is_the_path_slash() {
    // Answers the plan's path; anything else is a 404, as a worker's router answers.
    let peer = Peer::start(Arc::new(|_, s: &Seen| {
        match (s.method.as_str(), s.path.as_str()) {
            ("GET", "/health") => Reply::json(200, &json!({})),
            ("POST", "/v1/echo") => Reply::json(200, &json!({"echo": {"q": 1}})),
            _ => Reply::json(404, &json!({"detail": "Not Found"})),
        }
    }))
    .await;
    // The plan's own origin has nobody listening: only --endpoint's can answer.
    let plan = echo_plan("http://127.0.0.1:9/v1/echo".into(), "keep-alive", 1, 1);
    let tmp = tempfile::tempdir().unwrap();
    let path = write_plan(tmp.path(), "p.json", &plan);
    let replay_to = |endpoint: String, out: &str| {
        let (path, out) = (path.clone(), tmp.path().join(out));
        tokio::task::spawn_blocking(move || {
            let o = bin()
                .args(["replay", "--quiet", "--endpoint", &endpoint, "--out"])
                .arg(&out)
                .arg(&path)
                .output()
                .unwrap();
            (
                o.status.code(),
                String::from_utf8_lossy(&o.stderr).into_owned(),
            )
        })
    };
    let origin = format!("http://{}", peer.addr);
    let (code, stderr) = replay_to(origin.clone(), "origin").await.unwrap();
    assert_eq!(code, Some(0), "{stderr}");
    let seen = peer.seen();
    assert!(!seen.is_empty());
    for s in &seen {
        let want = if s.method == "GET" {
            "/health"
        } else {
            "/v1/echo"
        };
        assert_eq!(s.path, want, "{} went to {}", s.method, s.path);
    }
    // With a slash the path is `/`: the worker's 404 names the URL it came from.
    let (code, stderr) = replay_to(format!("{origin}/"), "slash").await.unwrap();
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "first failure: readiness case 'a' -> http: status 404 from {origin}/, expected 200; the answer says \"Not Found\""
        )),
        "{stderr}"
    );
    assert_eq!(peer.seen().last().map(|s| s.path.clone()), Some("/".into()));
}

/// util-linux's `prlimit` must run here (it is part of every Debian base system, and
/// `.ci/run` installs it): without it the open-file tests would measure nothing, so they
/// fail, saying what to install.
fn require_prlimit() {
    if let Err(e) = Command::new("prlimit").arg("--version").output() {
        panic!(
            "prlimit cannot run ({e}): install util-linux (apt-get install util-linux), which the open-file limit tests need"
        );
    }
}

#[test]
fn a_concurrency_the_open_file_limit_cannot_hold_is_refused_naming_what_it_can() {
    require_prlimit();
    let tmp = tempfile::tempdir().unwrap();
    let plan = |c: u64| {
        json!({
            "endpoint": "http://127.0.0.1:9/v1/models",
            "connection": "keep-alive",
            "cases": [{"name": "models", "method": "GET",
                "expected_response": {"object": "list", "data": [{"id": "mock", "object": "model", "created": 0, "owned_by": "matrix-proxy"}]}}],
            "concurrency": [1, c], "requests_per_case": c, "timeout_seconds": 10, "metadata": metadata(),
        })
    };
    let run = |c: u64, name: &str| {
        let path = write_plan(tmp.path(), &format!("{name}.json"), &plan(c));
        Command::new("prlimit")
            .arg("--nofile=256")
            .arg(env!("CARGO_BIN_EXE_matrix-proxy"))
            .args(["replay", "--quiet", "--mock-worker", "--out"])
            .arg(tmp.path().join(name))
            .arg(path)
            .output()
            .unwrap()
    };
    // 300 workers with the in-process mock need 2 x 300 + 64 files; 256 hold 96.
    let out = run(300, "too-many");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("concurrency 300 needs about 664 open files (two per worker with --mock-worker), but this process may open at most 256")
            && stderr.contains("the largest concurrency it can hold is 96"),
        "{stderr}"
    );
    assert!(!tmp.path().join("too-many").exists());
    // The number it names really runs, every exchange ok, under the same limit.
    let out = run(96, "fits");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary = read_json(&tmp.path().join("fits").join("summary.json"));
    assert_eq!(summary["complete"], json!(true));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_cuts_in_flight_exchanges_after_the_grace_period() {
    // From the 12th request on, the worker answers only after 30 s (the plan allows 60).
    let handler: Handler = Arc::new(|i, s: &Seen| {
        let mut r = if s.method == "GET" {
            Reply::json(200, &json!({}))
        } else {
            Reply::json(200, &json!({"ok": true}))
        };
        if i >= 12 {
            r.delay = std::time::Duration::from_secs(30);
        }
        r
    });
    let peer = Peer::start(handler).await;
    let tmp = tempfile::tempdir().unwrap();
    let plan = json!({
        "endpoint": peer.url("/x"),
        "cases": [{"name": "a", "request": {"q": 1}, "expected_response": {"ok": true}}],
        "concurrency": [4], "requests_per_case": 40, "timeout_seconds": 60, "metadata": metadata(),
    });
    let (mut child, run) = spawn_replay(tmp.path(), &plan, &["--grace-seconds", "0.5"]);
    for _ in 0..500 {
        if peer.seen().len() >= 16 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(
        peer.seen().len(),
        16,
        "four workers stalled in a measured round"
    );
    let sent = matrix_proxy::now_ns();
    signal(&child, "-INT");
    // Within 20 s: after the grace period, not after the plan's 60 s deadline.
    let code = exit_code(&mut child, 20).await;
    let took = std::time::Duration::from_nanos(matrix_proxy::now_ns() - sent);
    assert_eq!(code, Some(130));
    assert!(
        took >= std::time::Duration::from_millis(500) && took < std::time::Duration::from_secs(10),
        "took {took:?}"
    );
    // Every dispatched exchange has its row; the four in flight were cut.
    let rows = Rows::read(&run);
    assert_eq!(rows.len(), 16);
    let cut: Vec<usize> = (0..rows.len())
        .filter(|&i| rows.strs("outcome")[i].as_deref() == Some("shutdown_cut"))
        .collect();
    assert_eq!(cut.len(), 4, "{:?}", rows.strs("outcome"));
    for i in cut {
        assert_eq!(
            rows.strs("error_message")[i].as_deref(),
            Some(
                "cut by Ctrl-C / SIGTERM: the exchange was still in flight 0.5 s after it (--grace-seconds)"
            )
        );
    }
    let summary = read_json(&run.join("summary.json"));
    assert_eq!(summary["ending"], json!("interrupted"));
    assert_eq!(summary["failures"]["shutdown_cut"], json!(4));
}

#[test]
fn first_hour_flag_mistakes_get_an_answer_about_the_flag_and_leave_nothing_behind() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec![
                "replay",
                "plans/demo.json",
                "--mock-worker",
                "--part-seconds",
                "-1",
            ],
            "--part-seconds must be a number of seconds > 0, got -1",
        ),
        (
            vec![
                "replay",
                "plans/demo.json",
                "--mock-worker",
                "--grace-seconds",
                "-2",
            ],
            "--grace-seconds must be a number of seconds >= 0, got -2",
        ),
        (
            vec![
                "replay",
                "plans/demo.json",
                "--mock-worker",
                "--threads",
                "0",
            ],
            "--threads must be at least 1",
        ),
        (
            vec![
                "replay",
                "plans/demo.json",
                "--mock-worker",
                "--max-record-body",
                "0",
            ],
            "--max-record-body must be at least 1",
        ),
        (
            vec![
                "replay",
                "plans/demo.json",
                "--mock-worker",
                "--ca-cert",
                "/nonexistent/ca.pem",
            ],
            "/nonexistent/ca.pem",
        ),
        (
            vec![
                "serve",
                "--upstream",
                "http://127.0.0.1:9",
                "--listen",
                "127.0.0.1:0",
                "--quiet",
                "--stats-seconds",
                "0",
            ],
            "--stats-seconds must be a number of seconds > 0, got 0",
        ),
        (
            vec![
                "serve",
                "--upstream",
                "http://127.0.0.1:9",
                "--listen",
                "127.0.0.1:0",
                "--upstream-ca",
                "Cargo.toml",
            ],
            "Cargo.toml",
        ),
        (
            vec![
                "serve",
                "--upstream",
                "http://127.0.0.1:9",
                "--listen",
                "127.0.0.1:0",
                "--max-record-body",
                "0",
            ],
            "--max-record-body must be at least 1",
        ),
        (vec!["validate", "/dev/zero"], "plans are limited to 64 MiB"),
    ];
    for (args, says) in cases {
        let mut cmd = bin();
        cmd.args(&args);
        if args[0] != "validate" {
            cmd.arg("--out").arg(&out);
        }
        let r = cmd.output().unwrap();
        let stderr = String::from_utf8_lossy(&r.stderr);
        assert_eq!(r.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        assert!(!out.exists(), "{args:?} left {}", out.display());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_takes_a_host_name() {
    let tmp = tempfile::tempdir().unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_matrix-proxy"))
        .args(["mock-worker", "--listen", "localhost:0"])
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut err = tokio::io::BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    tokio::io::AsyncBufReadExt::read_line(&mut err, &mut line)
        .await
        .unwrap();
    assert!(
        line.starts_with("matrix-proxy: mock worker listening on http://127.0.0.1:")
            || line.starts_with("matrix-proxy: mock worker listening on http://[::1]:"),
        "{line}"
    );
    signal(&child, "-INT");
    assert_eq!(
        exit_code(&mut child, 30).await,
        Some(130),
        "mock-worker exits 130 on Ctrl-C"
    );
    drop(tmp);
}

#[test]
fn an_out_that_cannot_be_created_is_a_usage_error_and_a_full_stdout_never_panics() {
    let r = bin()
        .args([
            "replay",
            "plans/demo.json",
            "--mock-worker",
            "--out",
            "Cargo.toml/run",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&r.stderr);
    assert_eq!(r.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--out Cargo.toml/run: cannot create the run directory (Cargo.toml: "),
        "{stderr}"
    );
    // The table cannot be written: exit 3 with a message, and the files are complete.
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let r = bin()
        .args(["replay", "plans/demo.json", "--mock-worker", "--out"])
        .arg(&run)
        .stdout(std::fs::File::create("/dev/full").unwrap())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&r.stderr);
    assert_eq!(r.status.code(), Some(3), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        stderr.contains("cannot write the table to stdout: No space left on device"),
        "{stderr}"
    );
    assert_eq!(
        read_json(&run.join("summary.json"))["ending"],
        json!("passed")
    );
    assert!(read_json(&run.join("config.json"))["finished_at"].is_string());
}

#[test]
fn config_json_records_the_command_line_with_secrets_redacted() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let r = bin()
        .args([
            "replay",
            "plans/demo.json",
            "--quiet",
            "--endpoint=http://127.0.0.1:9/v1/chat/completions?api_key=SECRET-1&x=1",
            "--out",
        ])
        .arg(&run)
        .output()
        .unwrap();
    assert_eq!(
        r.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&r.stderr)
    );
    let config = read_json(&run.join("config.json"));
    let argv: Vec<String> = serde_json::from_value(config["argv"].clone()).unwrap();
    assert_eq!(&argv[1..3], ["replay", "plans/demo.json"]);
    assert_eq!(
        argv[4],
        "--endpoint=http://127.0.0.1:9/v1/chat/completions?api_key=<redacted>&x=1"
    );
    let everything: String = std::fs::read_dir(&run)
        .unwrap()
        .filter_map(|e| std::fs::read(e.unwrap().path()).ok())
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .collect();
    assert!(!everything.contains("SECRET-1"), "a secret reached disk");
}

#[test]
fn one_exchange_is_one_exchange() {
    let tmp = tempfile::tempdir().unwrap();
    let r = bin()
        .args([
            "replay",
            "plans/demo.json",
            "--endpoint",
            "http://127.0.0.1:9/v1",
            "--out",
        ])
        .arg(tmp.path().join("run"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&r.stderr);
    assert_eq!(r.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("matrix-proxy: 1 exchange recorded in "),
        "{stderr}"
    );
}

/// serve's first stderr lines (up to its banner) under an open-file limit of 1024.
async fn serve_banner(extra: &[&str]) -> String {
    require_prlimit();
    let tmp = tempfile::tempdir().unwrap();
    let mut child = tokio::process::Command::new("prlimit")
        .arg("--nofile=1024")
        .arg(env!("CARGO_BIN_EXE_matrix-proxy"))
        .args([
            "serve",
            "--upstream",
            "http://127.0.0.1:9",
            "--listen",
            "127.0.0.1:0",
            "--out",
        ])
        .arg(tmp.path().join("live"))
        .args(extra)
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut err = tokio::io::BufReader::new(child.stderr.take().unwrap());
    let mut text = String::new();
    while !text.contains("Ctrl-C to stop") {
        let mut line = String::new();
        let n = tokio::io::AsyncBufReadExt::read_line(&mut err, &mut line)
            .await
            .unwrap();
        assert!(n > 0, "serve ended early: {text}");
        text.push_str(&line);
    }
    let _ = child.start_kill();
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_open_file_warning_is_for_a_configured_cap_the_limit_cannot_meet() {
    require_prlimit();
    // The default cap fits itself to the limit, silently.
    let quiet = serve_banner(&[]).await;
    assert!(!quiet.contains("warning"), "{quiet}");
    // A cap asked for that the limit cannot hold is worth a warning.
    let warned = serve_banner(&["--max-connections", "5000"]).await;
    assert!(
        warned.contains("matrix-proxy: warning: the open-file limit is 1024, below the 10256 that --max-connections 5000 may need"),
        "{warned}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_records_its_command_line() {
    let tmp = tempfile::tempdir().unwrap();
    let live = tmp.path().join("live");
    let mut serve = crate::serve_lifecycle::spawn_serve(
        "http://127.0.0.1:9/v1",
        &live,
        &["--redact-query", "sig"],
    )
    .await;
    serve.signal("-INT");
    assert_eq!(serve.wait().await, Some(130));
    let config = read_json(&live.join("config.json"));
    let argv: Vec<String> = serde_json::from_value(config["argv"].clone()).unwrap();
    assert_eq!(argv[1], "serve");
    assert!(argv.contains(&"--redact-query".to_string()), "{argv:?}");
    assert_eq!(config["upstream"], json!("http://127.0.0.1:9/v1"));
}

/// Issue 44: `--worker-metrics URL` (a space, as other flags take their value) failed with
/// clap's bare "unexpected argument". The `=` is on purpose, so the error says where the
/// URL goes, for replay and serve alike; with `=`, or with no URL, the flag parses.
#[test]
fn worker_metrics_with_a_space_says_the_url_goes_after_the_equals_sign() {
    let tmp = tempfile::tempdir().unwrap();
    let plan = write_plan(
        tmp.path(),
        "p.json",
        &echo_plan("http://127.0.0.1:9/x".into(), "fresh", 1, 1),
    );
    let url = "http://127.0.0.1:9/metrics";
    let out = tmp.path().join("run");
    for args in [
        vec!["replay", "--worker-metrics", url, s(&plan)],
        vec![
            "replay",
            s(&plan),
            "--worker-metrics",
            url,
            "--out",
            s(&out),
        ],
        vec![
            "serve",
            "--upstream",
            "http://127.0.0.1:9",
            "--worker-metrics",
            url,
        ],
    ] {
        let (code, stdout, stderr) = run(&args);
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert!(stdout.is_empty());
        assert!(
            stderr.contains("--worker-metrics takes its URL after '='")
                && stderr.contains(&format!("--worker-metrics={url}")),
            "{args:?}: {stderr}"
        );
        assert!(!out.exists(), "nothing is created");
    }
    // With `=`, and with no URL before the plan, the flag parses and the plan is read
    // (a missing one here: refused for that, not for the flag).
    let missing = tmp.path().join("missing.json");
    let with_equals = format!("--worker-metrics={url}");
    for args in [
        vec!["replay", with_equals.as_str(), s(&missing)],
        vec!["replay", "--worker-metrics", s(&missing)],
    ] {
        let (code, _, stderr) = run(&args);
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains("missing.json") && !stderr.contains("takes its URL after"),
            "{args:?}: {stderr}"
        );
    }
}
