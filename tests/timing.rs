//! Timing that other tests' load would disturb, in a test binary of its own: cargo runs
//! test binaries one after another, so nothing else of this suite shares the machine
//! while it runs. Loopback only; bounded (about 25 s a try, at most three tries).

#[allow(dead_code)]
#[path = "it/support.rs"]
mod support;

use serde_json::{Value, json};
use support::*;

/// How many 10-s runs the timing bounds get. The counts and the schedule are checked on
/// every try and never retried; only the three bounds that a busy 2-core machine can
/// push over (send lag p99, the last send's lag, the achieved rate) must hold in one try.
const TRIES: usize = 3;

/// The example: a constant 2,000/s for 10 s sends 20,000 ± 1 requests a round,
/// the last within 2 ms of its schedule, send lag p99 <= 1.5 ms (on a 2-core machine,
/// with the peer and the recorder in the same debug-build process; noisy: on this
/// machine about one run in five has a round with a p99 between 1.5 and 2 ms, so the
/// bounds get up to three tries and every try's numbers are printed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_constant_2000_per_second_for_10_seconds_sends_20000_on_time() {
    let mut misses = Vec::new();
    for attempt in 1..=TRIES {
        let missed = one_try().await;
        if missed.is_empty() {
            eprintln!("try {attempt}: every timing bound held");
            return;
        }
        eprintln!("try {attempt} missed: {missed:?}");
        misses.push(missed);
    }
    panic!("the timing bounds missed in all {TRIES} tries: {misses:#?}");
}

/// One run; the timing bounds it missed (empty: all held). Counts and schedule offsets
/// are asserted outright.
async fn one_try() -> Vec<String> {
    let peer = Peer::start(echo_handler()).await;
    let dir = tempfile::tempdir().unwrap();
    let load = json!({"mode": "open", "arrival": "constant", "rates_per_second": [2000],
        "duration_seconds": 10});
    let (run, exit) = replay_plan(dir.path(), &open_plan(peer.url("/x"), load)).await;
    let summary = read_json(&run.join("summary.json"));
    assert_eq!(exit, matrix_proxy::cli::Exit::Ok, "{summary:#}");
    let rows = Rows::read(&run);
    let mut missed = Vec::new();
    for (r, round) in summary["rounds"].as_array().unwrap().iter().enumerate() {
        assert_eq!(round["rate_per_second"], json!(2000.0));
        assert_eq!(round["concurrency"], Value::Null);
        let sent = round["attempted_requests"].as_u64().unwrap();
        assert!((19_999..=20_001).contains(&sent), "round {r}: {sent} sends");
        assert_eq!(round["successful_requests"].as_u64(), Some(sent));
        let open = &round["open_loop"];
        assert_eq!(open["scheduled_inter_arrival_cv"], json!(0.0));
        // The schedule: the last arrival 500 µs after the one before, 9.9995 s after the
        // first.
        let m = measured(&rows, r as i32);
        assert_eq!(m.len() as u64, sent);
        let (_, last_sched, _, last_lag) = *m.last().unwrap();
        assert_eq!(last_sched - m[m.len() - 2].1, 500);
        assert_eq!(last_sched - m[0].1, 9_999_500);

        let lag_p99 = open["send_lag_seconds"]["p99"].as_f64().unwrap();
        let achieved = open["achieved_rate_per_second"].as_f64().unwrap();
        eprintln!(
            "round {r}: send lag p99 {:.3} ms, last send {:.3} ms late, {achieved:.1}/s",
            lag_p99 * 1e3,
            last_lag as f64 / 1e3
        );
        if lag_p99 > 0.0015 {
            missed.push(format!("round {r}: send lag p99 {lag_p99} s > 1.5 ms"));
        }
        if last_lag > 2_000 {
            missed.push(format!("round {r}: last send {last_lag} µs late > 2 ms"));
        }
        if (achieved - 2000.0).abs() >= 20.0 {
            missed.push(format!("round {r}: achieved {achieved}/s, not 2000 ± 20"));
        }
    }
    // The peer saw every measured send.
    let posts = peer.seen().iter().filter(|s| s.method == "POST").count();
    let planned = summary["planned_requests"].as_u64().unwrap() - 1;
    assert_eq!(posts as u64, planned);
    missed
}
