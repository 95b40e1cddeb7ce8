//! Timing that other tests' load would disturb, in a test binary of its own: cargo runs
//! test binaries one after another, so nothing else of this suite shares the machine
//! while it runs. Loopback only; bounded (about 25 s).

#[allow(dead_code)]
#[path = "it/support.rs"]
mod support;

use serde_json::{Value, json};
use support::*;

/// The example: a constant 2,000/s for 10 s sends 20,000 ± 1 requests a round,
/// the last within 2 ms of its schedule, send lag p99 <= 1.5 ms (on a 2-core machine,
/// with the peer in the same process).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_constant_2000_per_second_for_10_seconds_sends_20000_on_time() {
    let peer = Peer::start(echo_handler()).await;
    let dir = tempfile::tempdir().unwrap();
    let load = json!({"mode": "open", "arrival": "constant", "rates_per_second": [2000],
        "duration_seconds": 10});
    let (run, exit) = replay_plan(dir.path(), &open_plan(peer.url("/x"), load)).await;
    let summary = read_json(&run.join("summary.json"));
    assert_eq!(exit, matrix_proxy::cli::Exit::Ok, "{summary:#}");
    let rows = Rows::read(&run);
    for (r, round) in summary["rounds"].as_array().unwrap().iter().enumerate() {
        assert_eq!(round["rate_per_second"], json!(2000.0));
        assert_eq!(round["concurrency"], Value::Null);
        let sent = round["attempted_requests"].as_u64().unwrap();
        assert!((19_999..=20_001).contains(&sent), "round {r}: {sent} sends");
        assert_eq!(round["successful_requests"].as_u64(), Some(sent));
        let open = &round["open_loop"];
        let lag_p99 = open["send_lag_seconds"]["p99"].as_f64().unwrap();
        // A 2-core machine shared with the peer and the other tests: the bound is the
        // issue's, with room for nothing else.
        assert!(lag_p99 <= 0.0015, "round {r}: send lag p99 {lag_p99} s");
        assert_eq!(open["scheduled_inter_arrival_cv"], json!(0.0));
        let achieved = open["achieved_rate_per_second"].as_f64().unwrap();
        assert!((achieved - 2000.0).abs() < 20.0, "achieved {achieved}/s");
        // The last arrival left within 2 ms of its schedule, 500 µs after the one before.
        let m = measured(&rows, r as i32);
        assert_eq!(m.len() as u64, sent);
        let (_, last_sched, _, last_lag) = *m.last().unwrap();
        assert!(last_lag <= 2_000, "round {r}: last send {last_lag} µs late");
        assert_eq!(last_sched - m[m.len() - 2].1, 500);
        assert_eq!(last_sched - m[0].1, 9_999_500);
    }
    // The peer saw every measured send.
    let posts = peer.seen().iter().filter(|s| s.method == "POST").count();
    let planned = summary["planned_requests"].as_u64().unwrap() - 1;
    assert_eq!(posts as u64, planned);
}
