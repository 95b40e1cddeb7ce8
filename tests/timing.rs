//! Timing that other tests' load would disturb, in a test binary of its own: cargo runs
//! test binaries one after another, so nothing else of this suite shares the machine
//! while it runs. Measured on the optimized build (`cargo test --release --test timing`;
//! CI runs it), as users run the tool. Loopback only; bounded (about 20 s a try, at most
//! five tries).

#[allow(dead_code)]
#[path = "it/support.rs"]
mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::{Value, json};
use support::*;

/// How many 10-s runs the timing bounds get. The counts and the schedule are checked on
/// every try and never retried; only the bounds a busy machine can push over (send lag
/// p99, the last send's lag, the achieved rate) must hold in one try.
const TRIES: usize = 5;
/// The bound on the send lag's p99 (µs).
const LAG_P99_US: i64 = 1_500;
/// A try whose machine could not wake a sleeping thread within this (p99, µs) measured
/// the machine, not the tool: it is not counted (see [`noise_floor`]). A quiet 2-core
/// VM here wakes within 140-230 µs (p99) and the tool's send lag p99 is then 0.18-0.23
/// ms; a CI try whose floor was 438 µs (three times quiet, under the 500 µs this was)
/// saw a send lag p99 of 1.58 ms, so a floor over 300 µs now counts as noisy: that try
/// is retried, and if every try is noisy the best must still be within its floor + 1 ms.
const QUIET_FLOOR_US: i64 = 300;

/// The example: a constant 2,000/s for 10 s sends 20,000 ± 1 requests a round,
/// the last within 2 ms of its schedule, send lag p99 <= 1.5 ms. This is a shared 2-core
/// VM whose scheduling noise changes by the minute (the same build measured p99 0.2-0.7
/// ms one hour and 1.6-2.4 ms the next): each try also measures the machine's own floor
/// (how late a bare thread wakes from the same kind of sleep), a try on a noisy machine
/// is retried, and if every try was noisy the best one must stay within its floor + 1 ms.
/// Every try's numbers are printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    debug_assertions,
    ignore = "timing is measured on the optimized build users run: cargo test --release --test timing (CI runs it)"
)]
async fn a_constant_2000_per_second_for_10_seconds_sends_20000_on_time() {
    let mut noisy = Vec::new();
    for attempt in 1..=TRIES {
        let stop = Arc::new(AtomicBool::new(false));
        let floor = noise_floor(stop.clone());
        let (missed, worst_lag_p99_us) = one_try(LAG_P99_US).await;
        stop.store(true, Ordering::Relaxed);
        let floor_p99_us = floor.join().unwrap();
        eprintln!("try {attempt}: the machine's wake-up floor p99 {floor_p99_us} µs");
        if missed.is_empty() {
            eprintln!("try {attempt}: every timing bound held");
            return;
        }
        assert!(
            floor_p99_us > QUIET_FLOOR_US,
            "try {attempt} missed on a quiet machine (floor p99 {floor_p99_us} µs): {missed:?}"
        );
        eprintln!("try {attempt} missed on a noisy machine, not counted: {missed:?}");
        noisy.push((worst_lag_p99_us - floor_p99_us, floor_p99_us, missed));
    }
    // Every try was noisy: the best must still be within 1 ms of what the machine allowed.
    noisy.sort_by_key(|n| n.0);
    let (over_floor_us, floor_p99_us, missed) = &noisy[0];
    assert!(
        *over_floor_us <= 1_000,
        "send lag p99 {over_floor_us} µs over the machine's own floor ({floor_p99_us} µs) in the best of {TRIES} noisy tries: {missed:?}"
    );
    eprintln!(
        "every try was on a noisy machine; the best send lag p99 was {over_floor_us} µs over the floor ({floor_p99_us} µs)"
    );
}

/// The machine's wake-up floor while a try runs: a thread that sleeps to absolute
/// deadlines 500 µs apart (as the open loop's pacer does) and records how late it woke;
/// its lateness p99 (µs) when `stop` is set.
fn noise_floor(stop: Arc<AtomicBool>) -> std::thread::JoinHandle<i64> {
    std::thread::spawn(move || {
        let t0 = matrix_proxy::now_ns();
        let mut lates = Vec::with_capacity(30_000);
        let mut k = 1u64;
        while !stop.load(Ordering::Relaxed) {
            let due = t0 + k * 500_000;
            let now = matrix_proxy::now_ns();
            if now < due {
                std::thread::sleep(std::time::Duration::from_nanos(due - now));
            }
            lates.push(((matrix_proxy::now_ns() - due) / 1000) as i64);
            k += 1;
        }
        lates.sort_unstable();
        lates.get(lates.len() * 99 / 100).copied().unwrap_or(0)
    })
}

/// One run; the timing bounds it missed (empty: all held) and its worst round's send lag
/// p99 (µs). Counts and schedule offsets are asserted outright.
async fn one_try(lag_p99_us: i64) -> (Vec<String>, i64) {
    let peer = Peer::start(echo_handler()).await;
    let dir = tempfile::tempdir().unwrap();
    let load = json!({"mode": "open", "arrival": "constant", "rates_per_second": [2000],
        "duration_seconds": 10});
    let (run, exit) = replay_plan(dir.path(), &open_plan(peer.url("/x"), load)).await;
    let summary = read_json(&run.join("summary.json"));
    assert_eq!(exit, matrix_proxy::cli::Exit::Ok, "{summary:#}");
    let rows = Rows::read(&run);
    let mut missed = Vec::new();
    let mut worst = 0;
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
        let p99_us = (lag_p99 * 1e6).round() as i64;
        worst = worst.max(p99_us);
        if p99_us > lag_p99_us {
            missed.push(format!(
                "round {r}: send lag p99 {p99_us} µs > {lag_p99_us} µs"
            ));
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
    (missed, worst)
}
