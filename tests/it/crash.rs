//! After the fact: `summarize` rebuilds a run's reports from exchanges/ (and refuses a plan
//! changed since), `recover` quarantines what a SIGKILL left unfinished and counts it.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn summarize_rebuilds_the_same_reports_from_the_rows() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("demo");
    let mut args = replay_args(std::path::Path::new("plans/demo.json"), &out);
    args.mock_worker = true;
    replay(args).await.unwrap();
    let original_bytes = std::fs::read(out.join("summary.json")).unwrap();
    let original = read_json(&out.join("summary.json"));
    let original_rounds_bytes = std::fs::read(out.join("rounds.parquet")).unwrap();
    let original_rounds = read_parquet(&out.join("rounds.parquet"));
    let summarize_ok = || {
        let (code, stderr) = summarize(&out);
        assert_eq!(code, Some(0), "{stderr}");
    };
    summarize_ok();
    // The originals are kept beside the rebuilt files, byte for byte.
    assert_eq!(
        std::fs::read(out.join("summary.orig.json")).unwrap(),
        original_bytes
    );
    assert_eq!(
        std::fs::read(out.join("rounds.orig.parquet")).unwrap(),
        original_rounds_bytes
    );
    // Everything is rebuilt identically; the tool's own CPU time and dispatch lag were
    // measured live and are not in the rows, so they are carried over from the originals.
    let rebuilt = read_json(&out.join("summary.json"));
    for key in [
        "complete",
        "failures",
        "rounds",
        "round_aggregates",
        "excluded_phases",
        "ending",
        "planned_requests",
    ] {
        assert_eq!(rebuilt[key], original[key], "{key}");
    }
    assert!(rebuilt["rounds"][0]["generator"]["cpu_share"].is_number());
    assert_eq!(rebuilt["rebuilt_from_exchanges"], json!(true));
    assert_eq!(read_parquet(&out.join("rounds.parquet")), original_rounds);
    // A second summarize keeps the run's own originals, not the first rebuild's.
    summarize_ok();
    assert_eq!(
        std::fs::read(out.join("summary.orig.json")).unwrap(),
        original_bytes
    );

    // Without the originals (a crash before the reports), the generator load is null.
    for f in [
        "summary.json",
        "rounds.parquet",
        "summary.orig.json",
        "rounds.orig.parquet",
    ] {
        std::fs::remove_file(out.join(f)).unwrap();
    }
    summarize_ok();
    let rebuilt = read_json(&out.join("summary.json"));
    assert!(rebuilt["rounds"][0]["generator"].is_null());
    assert_eq!(
        rebuilt["rounds"][0]["successful_requests"],
        original["rounds"][0]["successful_requests"]
    );
    assert!(!out.join("summary.orig.json").exists());

    // A plan edited after the run cannot be summarised against rows it did not produce.
    let mut plan: Value = read_json(&out.join("plan.json"));
    plan["requests_per_case"] = json!(25);
    std::fs::write(out.join("plan.json"), serde_json::to_vec(&plan).unwrap()).unwrap();
    let (code, stderr) = summarize(&out);
    assert_eq!(code, Some(2));
    assert!(
        stderr.contains("the plan was changed after the run"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_sigkill_recover_counts_the_loss_and_summarize_rebuilds_what_was_kept() {
    let peer = Peer::start(slow_echo_handler(Duration::from_millis(3))).await;
    let tmp = tempfile::tempdir().unwrap();
    // Rows encoded as they arrive (the held rows of a round: the next test).
    let (mut child, run) = spawn_replay(
        tmp.path(),
        &echo_plan(peer.url("/x"), "keep-alive", 4, 2_000),
        &["--part-rows", "50", "--record-hold", "0"],
    );
    let closed = || {
        part_files(&run)
            .iter()
            .filter(|p| p.extension().is_some_and(|e| e == "parquet"))
            .count()
    };
    for _ in 0..1000 {
        if run.join("exchanges").is_dir() && closed() >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(closed() >= 3, "three parts closed before the kill");
    let seen = kill(&mut child, &peer).await;
    let (code, kept, lost) = recover(&run);
    assert_eq!(code, Some(if lost > 0 { 1 } else { 0 }));
    assert_eq!(
        kept,
        closed() as u64 * 50,
        "closed parts hold exactly their rows"
    );
    // What the worker answered is in the closed parts, in the counted loss, or was still
    // in memory uncounted: at most the rest of the open part (49), and what each of the 4
    // workers had gathered for the recorder (63) or had in flight (1).
    assert_accounted(seen, kept, lost, 49 + 4 * 64);
    assert!(
        part_files(&run)
            .iter()
            .all(|p| p.extension().is_some_and(|e| e == "parquet")),
        "nothing unfinished left in exchanges/"
    );

    let (code, _) = summarize(&run);
    assert_eq!(code, Some(1), "an unfinished run is not a pass");
    let summary = read_json(&run.join("summary.json"));
    assert_eq!(summary["ending"], json!("interrupted"));
    assert_eq!(summary["rows_written"], json!(kept));
    assert_eq!(summary["complete"], json!(false));
    // The crashed run wrote no summary of its own: a second summarize makes none up.
    assert_eq!(summarize(&run).0, Some(1));
    assert!(!run.join("summary.orig.json").exists());
    assert_eq!(
        read_json(&run.join("summary.json"))["ending"],
        json!("interrupted")
    );
}

/// SIGKILL the replay and wait for it; the requests the worker saw.
async fn kill(child: &mut tokio::process::Child, peer: &Peer) -> u64 {
    signal(child, "-KILL");
    assert_eq!(exit_code(child, 30).await, None, "killed by a signal");
    peer.seen().len() as u64
}

/// Nothing counted twice (kept + lost <= what the worker saw), and at most `uncounted`
/// rows neither kept nor counted as lost.
fn assert_accounted(seen: u64, kept: u64, lost: u64, uncounted: u64) {
    assert!(
        kept + lost <= seen,
        "kept {kept} + lost {lost} > seen {seen}"
    );
    assert!(
        seen - kept - lost <= uncounted,
        "uncounted: {} (seen {seen}, kept {kept}, lost {lost})",
        seen - kept - lost
    );
}

/// The rows the writer's ledger says it holds unencoded (its last `held N` line).
fn ledger_held(run: &std::path::Path) -> u64 {
    std::fs::read_to_string(run.join(matrix_proxy::LEDGER))
        .unwrap_or_default()
        .lines()
        .rev()
        .filter_map(|l| l.strip_prefix("held "))
        .find_map(|n| n.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkill_in_a_measured_round_loses_the_held_rows_and_recover_counts_them() {
    let peer = Peer::start(slow_echo_handler(Duration::from_millis(2))).await;
    let tmp = tempfile::tempdir().unwrap();
    let (mut child, run) = spawn_replay(
        tmp.path(),
        &echo_plan(peer.url("/x"), "keep-alive", 4, 20_000),
        &[],
    );
    // The round's rows are held, not encoded: wait until the ledger says 500 are.
    for _ in 0..2000 {
        if ledger_held(&run) >= 500 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let held = ledger_held(&run);
    assert!(held >= 500, "the ledger counts held rows: {held}");
    let seen = kill(&mut child, &peer).await;
    assert!(seen < 20_000, "killed mid-round ({seen} requests)");
    let (code, kept, lost) = recover(&run);
    assert_eq!(code, Some(1), "rows were lost");
    assert!(lost >= held, "lost {lost} counts the {held} held rows");
    // Nothing counted twice; uncounted: the open part's rows (health, readiness,
    // warm-up, feasibility: 4 + 4 = 8 at most here), held rows not yet noted (63), and
    // what each of the 4 workers had gathered (63) or had in flight (1).
    assert_accounted(seen, kept, lost, 8 + 63 + 4 * 64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn summarize_refuses_a_run_that_recorded_nothing_and_leaves_its_files_alone() {
    // 22 correctness failures, run with --no-record: the reports are the only record.
    let peer = Peer::start(Arc::new(|_, s: &Seen| {
        if s.method == "GET" {
            Reply::json(200, &json!({}))
        } else {
            Reply::json(200, &json!({"wrong": true}))
        }
    }))
    .await;
    let tmp = tempfile::tempdir().unwrap();
    let plan = json!({
        "endpoint": peer.url("/x"), "on_failure": "continue",
        "cases": [{"name": "a", "request": {}, "expected_response": {"right": true}}],
        "concurrency": [1, 2], "requests_per_case": 4, "timeout_seconds": 5, "metadata": metadata(),
    });
    let path = write_plan(tmp.path(), "p.json", &plan);
    let out = tmp.path().join("run");
    let mut args = replay_args(&path, &out);
    args.no_record = true;
    replay(args).await.unwrap();
    let before: Vec<(String, Vec<u8>)> = ["summary.json", "rounds.parquet", "config.json"]
        .iter()
        .map(|f| (f.to_string(), std::fs::read(out.join(f)).unwrap()))
        .collect();
    assert_eq!(
        read_json(&out.join("summary.json"))["failures"]["correctness"],
        json!(22)
    );
    let (code, stderr) = summarize(&out);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("no exchanges were recorded (the run was made with --no-record)"),
        "{stderr}"
    );
    for (f, bytes) in before {
        assert_eq!(std::fs::read(out.join(&f)).unwrap(), bytes, "{f} changed");
    }
    assert!(!out.join("summary.orig.json").exists());
}
