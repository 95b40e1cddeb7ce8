//! `--json` on replay / summarize / serve, `completions`, and `report` run as a user runs
//! them (the binary), against loopback peers.

use serde_json::{Value, json};

use crate::support::*;

/// `cmd` run to completion in a blocking thread: (exit code, stdout, stderr).
async fn run_bin(args: Vec<std::ffi::OsString>) -> (Option<i32>, Vec<u8>, String) {
    let out = tokio::task::spawn_blocking(move || bin().args(args).output().unwrap())
        .await
        .unwrap();
    (
        out.status.code(),
        out.stdout,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn rows_len(run: &std::path::Path) -> usize {
    Rows::read(run).len()
}

/// `matrix-proxy replay FLAGS --out DIR/run DIR/p.json` of `plan`: the run directory and
/// what [`run_bin`] returns.
async fn replay_bin(
    dir: &std::path::Path,
    plan: &Value,
    flags: &[&str],
) -> (std::path::PathBuf, (Option<i32>, Vec<u8>, String)) {
    let path = write_plan(dir, "p.json", plan);
    let run = dir.join("run");
    let mut args: Vec<std::ffi::OsString> = vec!["replay".into()];
    args.extend(flags.iter().map(Into::into));
    args.extend(["--out".into(), run.clone().into(), path.into()]);
    (run, run_bin(args).await)
}

/// The sorted `total_us` of the measured rows that `keep` (a row index) selects.
fn measured_totals(rows: &Rows, keep: impl Fn(usize) -> bool) -> Vec<i64> {
    let (phase, total) = (rows.strs("phase"), rows.i64s("total_us"));
    let mut v: Vec<i64> = (0..rows.len())
        .filter(|&i| phase[i].as_deref() == Some("measured") && keep(i))
        .map(|i| total[i].unwrap())
        .collect();
    v.sort_unstable();
    v
}

/// The exchanges a timeline chart counts over every bin of the series `pick` names.
fn timeline_count(chart: &Value, pick: impl Fn(&str) -> bool) -> u64 {
    chart["series"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| pick(s["name"].as_str().unwrap()))
        .flat_map(|s| s["counts"].as_array().unwrap().iter())
        .map(|c| c.as_u64().unwrap())
        .sum()
}

/// The JSON blocks of a report, by chart id.
fn chart_blocks(html: &str) -> Vec<Value> {
    let tag = "<script type=\"application/json\" class=\"chart-data\"";
    html.split(tag)
        .skip(1)
        .map(|rest| {
            let body = &rest[rest.find('>').unwrap() + 1..rest.find("</script>").unwrap()];
            serde_json::from_str(body).unwrap()
        })
        .collect()
}

#[tokio::test]
async fn replay_and_summarize_json_print_summary_json_byte_for_byte() {
    let peer = Peer::start(echo_handler()).await;
    let dir = tempfile::tempdir().unwrap();
    let plan = echo_plan(peer.url("/x"), "keep-alive", 2, 6);
    let (run, (code, stdout, stderr)) = replay_bin(dir.path(), &plan, &["--json"]).await;
    assert_eq!(code, Some(0), "{stderr}");
    let file = std::fs::read(run.join("summary.json")).unwrap();
    assert_eq!(
        stdout, file,
        "stdout is summary.json's bytes, and nothing else"
    );
    let v: Value = serde_json::from_slice(&stdout).unwrap();
    assert_eq!(v["ending"], json!("passed"));
    assert_eq!(v["rounds"][0]["successful_requests"], json!(6));
    // Progress and messages stay on stderr.
    assert!(stderr.contains("exchanges recorded"), "{stderr}");

    let (code, stdout, _) = run_bin(vec![
        "summarize".into(),
        "--json".into(),
        run.clone().into(),
    ])
    .await;
    assert_eq!(code, Some(0));
    assert_eq!(stdout, std::fs::read(run.join("summary.json")).unwrap());
    let rebuilt: Value = serde_json::from_slice(&stdout).unwrap();
    assert_eq!(rebuilt["rebuilt_from_exchanges"], json!(true));
    assert_eq!(rebuilt["rounds"][0]["successful_requests"], json!(6));
}

#[tokio::test]
async fn completions_are_generated_for_bash_zsh_and_fish() {
    for (shell, marker) in [
        ("bash", "complete -F"),
        ("zsh", "#compdef matrix-proxy"),
        ("fish", "complete -c matrix-proxy"),
    ] {
        let (code, stdout, stderr) = run_bin(vec!["completions".into(), shell.into()]).await;
        assert_eq!(code, Some(0), "{shell}: {stderr}");
        let text = String::from_utf8(stdout).unwrap();
        assert!(text.contains(marker), "{shell}: no {marker:?}");
        // Subcommands and flags are in it.
        assert!(
            text.contains("replay") && text.contains("mock-worker") && text.contains("report"),
            "{shell}"
        );
        assert!(text.contains("json"), "{shell}: --json is not in it");
        assert!(
            text.contains("metrics-listen"),
            "{shell}: --metrics-listen is not in it"
        );
    }
    let (code, _, stderr) = run_bin(vec!["completions".into(), "tcsh".into()]).await;
    assert_eq!(code, Some(2), "{stderr}");
}

#[tokio::test]
async fn report_embeds_the_numbers_it_draws_for_one_and_several_runs() {
    // Two ok rounds at c = 1 and two at c = 2.
    let peer = Peer::start(echo_handler()).await;
    let dir = tempfile::tempdir().unwrap();
    let mut plan = echo_plan(peer.url("/x"), "keep-alive", 1, 8);
    plan["concurrency"] = json!([1, 2]);
    plan["repetitions"] = json!(2);
    let (run, exit) = replay_plan(dir.path(), &plan).await;
    assert_eq!(exit, matrix_proxy::cli::Exit::Ok);
    let (code, _, stderr) = run_bin(vec!["report".into(), run.clone().into()]).await;
    assert_eq!(code, Some(0), "{stderr}");
    let html = std::fs::read_to_string(run.join("report.html")).unwrap();
    // Self-contained: nothing is fetched (no src, no link, no import, no url()).
    for remote in [" src=", "<link", "@import", "url("] {
        assert!(!html.contains(remote), "{remote}");
    }
    // Provenance and denominators on the first screen.
    let summary = read_json(&run.join("summary.json"));
    let config = read_json(&run.join("config.json"));
    assert!(html.contains(config["plan_sha256"].as_str().unwrap()));
    assert!(html.contains(config["tool"]["binary_sha256"].as_str().unwrap()));
    assert!(
        html.contains("<td>32 / 32 / 32</td>"),
        "planned / attempted / successful: {}",
        html.lines()
            .find(|l| l.contains("planned / attempted"))
            .unwrap_or("")
    );
    // Every phase: the health check, readiness, warm-up and feasibility besides the rounds.
    let all = format!(
        "<td>{} / {}</td>",
        summary["planned_requests"], summary["rows_written"]
    );
    assert!(html.contains(&all), "{all}");
    assert!(html.contains("health 1/1, readiness"), "excluded phases");
    assert_eq!(summary["rows_written"], json!(rows_len(&run)));
    let charts = chart_blocks(&html);
    let ids: Vec<&str> = charts.iter().map(|c| c["id"].as_str().unwrap()).collect();
    assert_eq!(
        ids,
        ["latency-cdf-0-a", "throughput-vs-concurrency", "timeline-0"],
        "{ids:?}"
    );
    // The CDF at c = 1: nearest ranks of the 16 measured totals, recomputed from the rows.
    let rows = Rows::read(&run);
    let conc = rows.i32s("concurrency");
    let c1 = measured_totals(&rows, |i| conc[i] == Some(1));
    let s = &charts[0]["series"][0];
    assert_eq!(
        (
            s["concurrency"].clone(),
            s["outcome"].clone(),
            s["n"].clone()
        ),
        (json!(1), json!("ok"), json!(16))
    );
    let points = s["points"].as_array().unwrap();
    assert_eq!(points.len(), 101);
    assert_eq!(points[0], json!([0, c1[0]]));
    assert_eq!(points[50], json!([50, c1[7]]));
    assert_eq!(points[100], json!([100, c1[15]]));
    // Throughput: each round a point, the value summary.json's.
    let t = &charts[1]["series"][0];
    assert_eq!(t["metric"], json!("throughput"));
    let pts = t["points"].as_array().unwrap();
    assert_eq!(pts.len(), 4);
    for (p, r) in pts.iter().zip(summary["rounds"].as_array().unwrap()) {
        assert_eq!(
            p,
            &json!([
                r["concurrency"].as_f64().unwrap(),
                r["repetition"],
                r["successful_requests_per_second"]
            ])
        );
    }
    // Timeline: every recorded row sent once and completed once.
    let tl = &charts[2];
    let sum = |name: &str| timeline_count(tl, |n| n == name);
    assert_eq!(sum("sends") as usize, rows.len());
    assert_eq!(sum("completed ok") as usize, rows.len());
    assert_eq!(tl["rounds"].as_array().unwrap().len(), 4);

    // Several runs: overlaid, labelled by folder; --out is needed.
    let other = dir.path().join("second");
    std::fs::create_dir(&other).unwrap();
    let (run2, _) = replay_plan(&other, &echo_plan(peer.url("/x"), "fresh", 1, 4)).await;
    let (code, _, stderr) = run_bin(vec![
        "report".into(),
        run.clone().into(),
        run2.clone().into(),
    ])
    .await;
    assert_eq!(code, Some(2), "several runs without --out: {stderr}");
    assert!(stderr.contains("--out"), "{stderr}");
    let out = dir.path().join("both.html");
    let (code, _, stderr) = run_bin(vec![
        "report".into(),
        run.clone().into(),
        run2.into(),
        "--out".into(),
        out.clone().into(),
    ])
    .await;
    assert_eq!(code, Some(0), "{stderr}");
    let both = chart_blocks(&std::fs::read_to_string(&out).unwrap());
    let names: Vec<String> = both[0]["series"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap().to_string())
        .collect();
    // Both folders are named `run`: their parents tell them apart.
    assert_eq!(names.len(), 3, "{names:?}");
    assert!(
        names[0].ends_with("/run · c=1 · ok") && names[1].ends_with("/run · c=2 · ok"),
        "{names:?}"
    );
    assert!(!names[0].starts_with("second/"), "{names:?}");
    assert_eq!(names[2], "second/run · c=1 · ok");
    assert_eq!(
        both.iter()
            .filter(|c| c["kind"] == json!("timeline"))
            .count(),
        2
    );

    // Not a run directory: a usage error naming the file.
    let (code, _, stderr) = run_bin(vec!["report".into(), dir.path().into()]).await;
    assert_eq!(code, Some(2));
    assert!(stderr.contains("config.json"), "{stderr}");
}

#[tokio::test]
async fn a_taken_metrics_port_is_refused_before_anything_is_created() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let peer = Peer::start(echo_handler()).await;
    let dir = tempfile::tempdir().unwrap();
    let plan = echo_plan(peer.url("/x"), "keep-alive", 1, 2);
    let (run, (code, _, stderr)) =
        replay_bin(dir.path(), &plan, &["--metrics-listen", &addr]).await;
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!("--metrics-listen {addr}: cannot bind")),
        "{stderr}"
    );
    assert!(!run.exists(), "no run directory for refused input");
    assert!(peer.seen().is_empty(), "nothing was sent");
}

#[tokio::test]
async fn failed_exchanges_get_their_own_cdf_and_timeline_series() {
    // Every other POST answered 500: half the measured exchanges fail (`http`).
    let echo = echo_handler();
    let flaky: Handler = std::sync::Arc::new(move |i, seen: &Seen| {
        if seen.method == "POST" && i % 2 == 1 {
            Reply::json(500, &json!({"error": "flaky"}))
        } else {
            echo(i, seen)
        }
    });
    let peer = Peer::start(flaky).await;
    let dir = tempfile::tempdir().unwrap();
    let mut plan = echo_plan(peer.url("/x"), "keep-alive", 1, 10);
    plan["on_failure"] = json!("continue");
    let (run, exit) = replay_plan(dir.path(), &plan).await;
    assert_eq!(exit, matrix_proxy::cli::Exit::Failure);
    let (code, _, stderr) = run_bin(vec!["report".into(), run.clone().into()]).await;
    assert_eq!(code, Some(0), "{stderr}");
    let charts = chart_blocks(&std::fs::read_to_string(run.join("report.html")).unwrap());
    let rows = Rows::read(&run);
    let outcome = rows.strs("outcome");
    let failed = measured_totals(&rows, |i| outcome[i].as_deref() != Some("ok"));
    assert!(failed.len() >= 4, "{} failed", failed.len());
    let cdf = &charts[0];
    let f = cdf["series"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["outcome"] == json!("failed"))
        .unwrap();
    assert_eq!(f["n"], json!(failed.len()));
    assert_eq!(f["points"][0], json!([0, failed[0]]));
    assert_eq!(f["points"][100], json!([100, failed[failed.len() - 1]]));
    // The timeline counts every failure of every phase by kind.
    let all_failed = outcome
        .iter()
        .filter(|o| o.as_deref() != Some("ok"))
        .count() as u64;
    let tl = charts
        .iter()
        .find(|c| c["kind"] == json!("timeline"))
        .unwrap();
    let counted = timeline_count(tl, |n| n.starts_with("failed: "));
    assert_eq!(counted, all_failed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_json_prints_its_summary_when_stopped() {
    let peer = Peer::start(echo_handler()).await;
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("live");
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_matrix-proxy"))
        .args([
            "serve",
            "--quiet",
            "--json",
            "--listen",
            "127.0.0.1:0",
            "--upstream",
        ])
        .arg(peer.url(""))
        .arg("--out")
        .arg(&out)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let addr = serve_address(&out).await;
    let mut client = Client::connect(addr).await;
    for _ in 0..3 {
        let (status, _, _) = client
            .send(request("POST", addr, "/v1/x", "{\"q\": 1}"))
            .await
            .unwrap();
        assert_eq!(status, 200);
    }
    drop(client);
    signal(&child, "-TERM");
    let done = tokio::time::timeout(std::time::Duration::from_secs(30), child.wait_with_output())
        .await
        .expect("serve stops within 30 s")
        .unwrap();
    assert_eq!(
        done.status.code(),
        Some(130),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    assert_eq!(
        done.stdout,
        std::fs::read(out.join("summary.json")).unwrap()
    );
    let v: Value = serde_json::from_slice(&done.stdout).unwrap();
    assert_eq!(
        (v["requests"].clone(), v["ending"].clone()),
        (json!(3), json!("stopped"))
    );
}

/// Issue 44 item 7: `report` on a run whose rows hold impossible values (a negative or
/// absurd duration or offset) never panics (it did: `capacity overflow`, exit 101, or
/// gigabytes allocated for a timeline): it refuses, naming the file, the row and the
/// column. A long but possible duration is drawn, in a timeline of at most 150 bins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn report_refuses_impossible_values_naming_file_row_and_column() {
    let peer = Peer::start(echo_handler()).await;
    let dir = tempfile::tempdir().unwrap();
    let plan = echo_plan(peer.url("/x"), "keep-alive", 1, 4);
    let (run, exit) = replay_plan(dir.path(), &plan).await;
    assert_eq!(exit, matrix_proxy::cli::Exit::Ok);
    let row = rows_len(&run) - 1;
    let ids = Rows::read(&run).i64s("exchange_id");
    let report = || run_bin(vec!["report".into(), run.clone().into()]);
    for (column, value) in [
        ("total_us", -5_000_000),
        ("total_us", 4_000_000_000_000_000_000),
        ("total_us", i64::MIN),
        ("first_byte_us", -1),
        ("start_offset_us", i64::MAX),
    ] {
        let part = set_i64(&run, column, row, value);
        let (code, _, stderr) = report().await;
        assert_eq!(code, Some(3), "{column} = {value}: {stderr}");
        let name = part.file_name().unwrap().to_string_lossy().into_owned();
        let said = format!(
            "row {} (exchange_id {}): {column} is {value} µs",
            row + 1,
            ids[row].unwrap()
        );
        assert!(
            stderr.contains(&name) && stderr.contains(&said),
            "{said}: {stderr}"
        );
        assert!(!run.join("report.html").exists());
        // A sound value again, for the next case.
        set_i64(
            &run,
            column,
            row,
            if column == "start_offset_us" { 0 } else { 1 },
        );
    }
    // Thirty days is long but possible: drawn, with the timeline's bins bounded.
    set_i64(&run, "total_us", row, 30 * 24 * 3_600_000_000);
    let (code, _, stderr) = report().await;
    assert_eq!(code, Some(0), "{stderr}");
    let charts = chart_blocks(&std::fs::read_to_string(run.join("report.html")).unwrap());
    let tl = charts
        .iter()
        .find(|c| c["kind"] == json!("timeline"))
        .unwrap();
    for s in tl["series"].as_array().unwrap() {
        let bins = s["counts"].as_array().unwrap().len();
        assert!((1..=150).contains(&bins), "{bins} bins");
    }
    assert_eq!(timeline_count(tl, |n| n == "sends"), rows_len(&run) as u64);
}
