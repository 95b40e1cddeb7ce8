//! Open-loop load: arrivals at their scheduled instants, latency from the intended time,
//! goodput against a plan's `slo`, and `--sweep`. Real loopback peers, real Parquet.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use matrix_proxy::arrival::{self, Arrival, Extent};
use serde_json::{Value, json};

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poisson_schedule_is_sent_as_seeded_and_its_spread_is_reported() {
    let peer = Peer::start(echo_handler()).await;
    let dir = tempfile::tempdir().unwrap();
    let load = json!({"mode": "open", "arrival": "poisson", "seed": 7,
        "rates_per_second": [150, 300], "requests": 300});
    let (run, exit) = replay_plan(dir.path(), &open_plan(peer.url("/x"), load)).await;
    assert_eq!(exit, matrix_proxy::cli::Exit::Ok);
    let summary = read_json(&run.join("summary.json"));
    let rows = Rows::read(&run);
    let rounds = summary["rounds"].as_array().unwrap();
    assert_eq!(rounds.len(), 4);
    for (i, round) in rounds.iter().enumerate() {
        let (level, rep) = (i / 2, i % 2);
        let rate = [150.0, 300.0][level];
        assert_eq!(round["rate_per_second"], json!(rate));
        // The documented stream of (case 0, level, repetition).
        let stream = ((level as u64) << 20) | rep as u64;
        let want = arrival::schedule(Arrival::Poisson, rate, 7, stream, Extent::Requests(300));
        // The round's rows: their recorded intended times minus the round's start are
        // exactly the seeded offsets.
        let rates = rows.f64s("target_rate_per_second");
        let phase = rows.strs("phase");
        let reps = rows.i32s("repetition");
        let sched = rows.i64s("scheduled_offset_us");
        let mut got: Vec<i64> = (0..rows.len())
            .filter(|&k| {
                phase[k].as_deref() == Some("measured")
                    && reps[k] == Some(rep as i32)
                    && rates[k] == Some(rate)
            })
            .map(|k| sched[k].unwrap())
            .collect();
        got.sort_unstable();
        let start = got[0];
        let got: Vec<u64> = got.iter().map(|s| (s - start) as u64).collect();
        assert_eq!(got, want, "rate {rate} repetition {rep}");
        let cv = round["open_loop"]["scheduled_inter_arrival_cv"]
            .as_f64()
            .unwrap();
        assert_eq!(Some(cv), arrival::gap_cv(&want));
        assert!((cv - 1.0).abs() < 0.2, "Poisson CV {cv}");
        let sent_cv = round["open_loop"]["inter_arrival_cv"].as_f64().unwrap();
        assert!(
            (sent_cv - cv).abs() < 0.15,
            "actual sends' CV {sent_cv} vs {cv}"
        );
    }
}

/// A handler that answers at once, except that from request `at` on it pauses all
/// handling once for `pause`: every request that arrives meanwhile waits for its end.
fn pausing_handler(at: usize, pause: Duration) -> Handler {
    let echo = echo_handler();
    let until: Arc<Mutex<Option<u64>>> = Arc::new(Mutex::new(None));
    Arc::new(move |i, seen: &Seen| {
        let mut r = echo(i, seen);
        let mut until = until.lock().unwrap();
        let now = matrix_proxy::now_ns();
        if i == at && until.is_none() {
            *until = Some(now + pause.as_nanos() as u64);
        }
        if let Some(u) = *until {
            r.delay = Duration::from_nanos(u.saturating_sub(now));
        }
        r
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_second_pause_shows_in_the_open_loop_p99_and_hides_in_the_closed_loop() {
    let pause = Duration::from_secs(1);
    // Open: 100/s for 5 s. Requests 0-3 are health, readiness and warm-up, then a second
    // of feasibility (about 100): the pause starts about 1.5 s into the first round.
    let open_peer = Peer::start(pausing_handler(250, pause)).await;
    let dir = tempfile::tempdir().unwrap();
    let load = json!({"mode": "open", "arrival": "constant", "rates_per_second": [100],
        "duration_seconds": 5});
    let (run, _) = replay_plan(dir.path(), &open_plan(open_peer.url("/x"), load)).await;
    let open = read_json(&run.join("summary.json"));
    let r0 = &open["rounds"][0];
    assert_eq!(r0["latency_from"], json!("intended_send_time"));
    let user_p99 = r0["successful_latency_seconds"]["p99"].as_f64().unwrap();
    assert!(
        user_p99 >= 0.8,
        "open loop p99 from intended times {user_p99} s"
    );
    // The sends went out on schedule and waited at the worker: the stall is the
    // worker's, so the service latency (from the actual send) shows it too.
    let service_p99 = r0["service_latency_seconds"]["p99"].as_f64().unwrap();
    assert!(service_p99 >= 0.7, "service p99 {service_p99} s");
    // The round without a pause has no such tail.
    let r1_p99 = open["rounds"][1]["successful_latency_seconds"]["p99"]
        .as_f64()
        .unwrap();
    assert!(r1_p99 < 0.1, "{r1_p99}");

    // Closed: one worker, 200 requests a round; the pause hits request 100 of the first.
    let closed_peer = Peer::start(pausing_handler(100, pause)).await;
    let dir = tempfile::tempdir().unwrap();
    let plan = echo_plan(closed_peer.url("/x"), "keep-alive", 1, 200);
    let (run, _) = replay_plan(dir.path(), &plan).await;
    let closed = read_json(&run.join("summary.json"));
    let c0 = &closed["rounds"][0];
    assert_eq!(c0["latency_from"], json!("actual_send"));
    let closed_p99 = c0["successful_latency_seconds"]["p99"].as_f64().unwrap();
    assert!(closed_p99 < 0.1, "closed loop p99 {closed_p99} s");
    // Yet the closed loop did meet the pause: in exactly one sample.
    let rows = Rows::read(&run);
    let (phase, total, reps) = (
        rows.strs("phase"),
        rows.i64s("total_us"),
        rows.i32s("repetition"),
    );
    let slow = (0..rows.len())
        .filter(|&i| {
            phase[i].as_deref() == Some("measured")
                && reps[i] == Some(0)
                && total[i].unwrap() >= 900_000
        })
        .count();
    assert_eq!(slow, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn goodput_is_zero_under_an_impossible_bound_and_throughput_under_an_easy_one() {
    let peer = Peer::start(slow_echo_handler(Duration::from_millis(2))).await;
    for (e2e_ms, open) in [
        (0.001, true),
        (60_000.0, true),
        (0.001, false),
        (60_000.0, false),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut plan = if open {
            open_plan(
                peer.url("/x"),
                json!({"mode": "open", "rates_per_second": [200], "requests": 60}),
            )
        } else {
            echo_plan(peer.url("/x"), "keep-alive", 2, 30)
        };
        plan["slo"] = json!({"e2e_ms": e2e_ms, "ttft_ms": 60_000});
        let (run, exit) = replay_plan(dir.path(), &plan).await;
        assert_eq!(exit, matrix_proxy::cli::Exit::Ok);
        let summary = read_json(&run.join("summary.json"));
        for round in summary["rounds"].as_array().unwrap() {
            let g = &round["goodput"];
            let ok = round["successful_requests"].as_u64().unwrap();
            assert!(ok > 0);
            if e2e_ms < 1.0 {
                assert_eq!(g["good_requests"], json!(0), "{g:#}");
                assert_eq!(g["good_requests_per_second"], json!(0.0));
                assert_eq!(g["missed_requests"]["e2e"], json!(ok));
                assert_eq!(g["missed_share"]["e2e"], json!(1.0));
            } else {
                assert_eq!(g["good_requests"], json!(ok), "{g:#}");
                assert_eq!(
                    g["good_requests_per_second"],
                    round["successful_requests_per_second"]
                );
                assert_eq!(g["missed_share"]["e2e"], json!(0.0));
            }
            assert_eq!(g["missed_requests"]["ttft"], json!(0));
            assert_eq!(g["missed_requests"]["tpot"], Value::Null);
        }
        // rounds.parquet carries the same count.
        let rounds = Rows::read_file(&run.join("rounds.parquet"));
        let good = rounds.i64s("good_requests");
        let ok = rounds.i64s("successful_requests");
        for (g, o) in good.iter().zip(&ok) {
            assert_eq!(*g, if e2e_ms < 1.0 { Some(0) } else { *o });
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_places_open_rates_between_the_synchronous_rate_and_the_throughput() {
    // 4 ms an answer: about 250/s at c = 1, about 4 times that at c = 4.
    let peer = Peer::start(slow_echo_handler(Duration::from_millis(4))).await;
    let dir = tempfile::tempdir().unwrap();
    let plan = echo_plan(peer.url("/x"), "keep-alive", 4, 40);
    let path = write_plan(dir.path(), "p.json", &plan);
    let run = dir.path().join("run");
    let mut args = replay_args(&path, &run);
    args.sweep = Some(2);
    let exit = replay(args).await.unwrap();
    assert_eq!(exit, matrix_proxy::cli::Exit::Ok);
    let summary = read_json(&run.join("summary.json"));
    let rounds = summary["rounds"].as_array().unwrap();
    // c=1, c=4, then 2 rates x 2 repetitions.
    assert_eq!(summary["planned_rounds"], json!(6));
    assert_eq!(rounds.len(), 6);
    assert_eq!(rounds[0]["concurrency"], json!(1));
    assert_eq!(rounds[1]["concurrency"], json!(4));
    let sync = rounds[0]["successful_requests_per_second"]
        .as_f64()
        .unwrap();
    let probe = rounds[1]["successful_requests_per_second"]
        .as_f64()
        .unwrap();
    let rates: Vec<f64> = rounds[2..]
        .iter()
        .map(|r| r["rate_per_second"].as_f64().unwrap())
        .collect();
    assert_eq!(rates[0], rates[1]);
    assert_eq!(rates[2], rates[3]);
    // Evenly spaced, to four significant digits.
    let third = (probe - sync) / 3.0;
    assert!(
        (rates[0] - (sync + third)).abs() <= (sync + third) * 5e-4,
        "{rates:?} {sync} {probe}"
    );
    assert!(
        (rates[2] - (sync + 2.0 * third)).abs() <= (sync + 2.0 * third) * 5e-4,
        "{rates:?} {sync} {probe}"
    );
    for r in &rounds[2..] {
        assert_eq!(r["planned_requests"], json!(40));
        assert_eq!(r["successful_requests"], json!(40));
    }
    assert_eq!(summary["load"]["sweep"], json!(2));
    assert_eq!(summary["round_aggregates"].as_array().unwrap().len(), 4);
    // summarize rebuilds the same rounds from the rows.
    let (code, _) = summarize(&run);
    assert_eq!(code, Some(0));
    let rebuilt = read_json(&run.join("summary.json"));
    for (a, b) in rebuilt["rounds"].as_array().unwrap().iter().zip(rounds) {
        for key in [
            "concurrency",
            "rate_per_second",
            "repetition",
            "attempted_requests",
            "successful_requests",
            "successful_latency_seconds",
            "open_loop",
        ] {
            assert_eq!(a[key], b[key], "{key}");
        }
    }
    assert_eq!(rebuilt["planned_requests"], summary["planned_requests"]);
    // The sweep notes what it placed, and summarize keeps the note.
    let notes = summary["load"]["notes"].as_array().unwrap();
    assert_eq!(notes.len(), 1);
    let note = notes[0].as_str().unwrap();
    assert!(
        note.starts_with("case 'a': synchronous") && note.contains("open-loop rates"),
        "{note}"
    );
    assert_eq!(rebuilt["load"]["notes"], summary["load"]["notes"]);
    // compare pairs rounds by concurrency; a sweep's open rounds have none: refused.
    let output = bin()
        .args(["compare", run.to_str().unwrap(), run.to_str().unwrap()])
        .args(["--out", dir.path().join("cmp").to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let err = String::from_utf8_lossy(&output.stderr);
    assert!(err.contains("an open-loop run (--sweep)"), "{err}");
    assert!(!dir.path().join("cmp").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_max_in_flight_sends_wait_and_the_round_is_marked_saturated() {
    // One request in flight at most, 20 ms an answer, 200 arrivals a second: sends fall
    // behind, none is dropped, and the lateness is recorded.
    let peer = Peer::start(slow_echo_handler(Duration::from_millis(20))).await;
    let dir = tempfile::tempdir().unwrap();
    let load = json!({"mode": "open", "arrival": "constant", "rates_per_second": [200],
        "requests": 20, "max_in_flight": 1});
    let (run, exit) = replay_plan(dir.path(), &open_plan(peer.url("/x"), load)).await;
    assert_eq!(exit, matrix_proxy::cli::Exit::Ok);
    let summary = read_json(&run.join("summary.json"));
    let r0 = &summary["rounds"][0];
    assert_eq!(r0["attempted_requests"], json!(20));
    assert_eq!(r0["open_loop"]["saturated"], json!(true));
    assert!(r0["open_loop"]["late_sends"].as_u64().unwrap() >= 15);
    let worst = r0["open_loop"]["send_lag_max_seconds"].as_f64().unwrap();
    // The 20th send waited for 19 answers of 20 ms, scheduled 5 ms apart: ~285 ms late.
    assert!(worst > 0.2, "{worst}");
    // The user's latency includes the wait; the service latency does not.
    let user = r0["successful_latency_seconds"]["p99"].as_f64().unwrap();
    let service = r0["service_latency_seconds"]["p99"].as_f64().unwrap();
    assert!(user > service + 0.2, "{user} vs {service}");
    // Never more than one in flight: each send starts after the previous answer.
    let m = measured(&Rows::read(&run), 0);
    let starts: Vec<i64> = m.iter().map(|x| x.2).collect();
    assert!(
        starts.windows(2).all(|w| w[1] - w[0] >= 19_000),
        "{starts:?}"
    );
}

/// Each round's (rate, repetition) -> its recorded intended offsets from the round's first
/// and the dispatch indices, over the measured rows of `rows`.
type Rounds = std::collections::BTreeMap<(u64, i32), (Vec<i64>, Vec<i64>)>;

fn rounds_of(rows: &[(Rows, i64)]) -> Rounds {
    let mut out = Rounds::new();
    for (r, shift) in rows {
        let (phase, rate, rep) = (
            r.strs("phase"),
            r.f64s("target_rate_per_second"),
            r.i32s("repetition"),
        );
        let (sched, index) = (r.i64s("scheduled_offset_us"), r.i64s("dispatch_index"));
        for i in (0..r.len()).filter(|&i| phase[i].as_deref() == Some("measured")) {
            let e = out
                .entry((rate[i].unwrap().to_bits(), rep[i].unwrap()))
                .or_default();
            e.0.push(sched[i].unwrap() - shift);
            e.1.push(index[i].unwrap());
        }
    }
    for (sched, index) in out.values_mut() {
        sched.sort_unstable();
        let first = sched[0];
        sched.iter_mut().for_each(|s| *s -= first);
        index.sort_unstable();
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_shards_merged_give_the_unsharded_schedule_and_the_same_rounds() {
    let peer = Peer::start(echo_handler()).await;
    let load = json!({"mode": "open", "arrival": "poisson", "seed": 3,
        "rates_per_second": [100], "requests": 60});
    let mut plan = open_plan(peer.url("/x"), load);
    plan["timeout_seconds"] = json!(1);
    // Unsharded.
    let one = tempfile::tempdir().unwrap();
    let (single, exit) = replay_plan(one.path(), &plan).await;
    assert_eq!(exit, matrix_proxy::cli::Exit::Ok);
    // Three shards into one folder, started together.
    let dir = tempfile::tempdir().unwrap();
    let path = write_plan(dir.path(), "p.json", &plan);
    let out = dir.path().join("out");
    replay_shards(&path, &out, 3).await;
    for i in 0..3 {
        assert!(out.join(format!("shards/{i}/summary.json")).is_file());
        assert!(out.join(format!("exchanges/shard={i}")).is_dir());
    }
    // Shard 1 again into the same folder is refused: its folders exist.
    let output = bin()
        .args([
            "replay",
            "--quiet",
            "--shard",
            "1/3",
            "--start-at",
            &utc_in(3),
            "--out",
            out.to_str().unwrap(),
            path.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let err = String::from_utf8_lossy(&output.stderr);
    assert!(
        err.contains("shards/1") && err.contains("each shard's folders are new"),
        "{err}"
    );
    let (code, err) = summarize(&out);
    assert_eq!(code, Some(0), "{err}");
    let merged = read_json(&out.join("summary.json"));
    let unsharded = read_json(&single.join("summary.json"));
    assert_eq!(merged["shards"]["count"], json!(3));
    let keys = [
        "case",
        "rate_per_second",
        "repetition",
        "planned_requests",
        "attempted_requests",
        "successful_requests",
    ];
    let (m, u) = (
        merged["rounds"].as_array().unwrap(),
        unsharded["rounds"].as_array().unwrap(),
    );
    assert_eq!(m.len(), u.len());
    for (a, b) in m.iter().zip(u) {
        for k in keys {
            assert_eq!(a[k], b[k], "{k}");
        }
        assert_eq!(a["planned_requests"], json!(60));
        assert_eq!(
            a["open_loop"]["scheduled_inter_arrival_cv"],
            b["open_loop"]["scheduled_inter_arrival_cv"]
        );
    }
    // Every shard runs its own health check, readiness probe and two warm-ups (4
    // requests) besides its share of the rounds: the merge counts them all.
    let whole = unsharded["planned_requests"].as_u64().unwrap();
    assert_eq!(merged["planned_requests"], json!(whole + 2 * 4));
    let own: u64 = (0..3)
        .map(|i| {
            read_json(&out.join(format!("shards/{i}/summary.json")))["planned_requests"]
                .as_u64()
                .unwrap()
        })
        .sum();
    assert_eq!(merged["planned_requests"], json!(own));
    // The union of the shards' intended times, each on its own run clock moved to the
    // shared start, is the unsharded schedule; every arrival was sent by one shard.
    let shard_rows: Vec<(Rows, i64)> = (0..3).map(|i| shard_rows(&out, i)).collect();
    let (sharded, whole) = (
        rounds_of(&shard_rows),
        rounds_of(&[(Rows::read(&single), 0)]),
    );
    assert_eq!(sharded.len(), 2);
    for (k, (sched, index)) in &whole {
        assert_eq!(sharded[k].1, *index, "{k:?}: dispatch indices");
        assert_eq!(&sharded[k].0, sched, "{k:?}: intended offsets");
        assert_eq!(*index, (0..60).collect::<Vec<i64>>());
    }
    // A shard's own folder is not a run to summarize, but recover finds its parts.
    let (code, err) = summarize(&out.join("shards/0"));
    assert_eq!(code, Some(2));
    assert!(err.contains("one shard's report folder"), "{err}");
    let (code, kept, lost) = recover(&out.join("shards/0"));
    assert_eq!((code, lost), (Some(0), 0));
    assert_eq!(kept as usize, shard_rows[0].0.len());
    // A missing shard is refused.
    std::fs::rename(out.join("shards/2"), dir.path().join("gone")).unwrap();
    let (code, err) = summarize(&out);
    assert_eq!(code, Some(2));
    assert!(err.contains("shard(s) 2 of 3 missing"), "{err}");
}

#[test]
fn validate_warns_of_an_open_round_too_short_to_reach_every_variant() {
    let tmp = tempfile::tempdir().unwrap();
    let mut plan = open_plan(
        "http://127.0.0.1:9/x".into(),
        json!({"mode": "open", "rates_per_second": [5, 10], "requests": 2}),
    );
    plan["cases"][0] = json!({"name": "a", "variants": [
        {"name": "v1", "request": {"q": 1}, "expected_response": {"echo": {"q": 1}}},
        {"name": "v2", "request": {"q": 2}, "expected_response": {"echo": {"q": 2}}},
        {"name": "v3", "request": {"q": 3}, "expected_response": {"echo": {"q": 3}}}]});
    let path = write_plan(tmp.path(), "open.json", &plan);
    let (code, _, err) = run(&["validate", s(&path)]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains("case 'a' has 3 variants but an open round sends 2 arrivals (load.requests)"),
        "{err}"
    );
    // Long enough rounds: every variant is reached, nothing said.
    plan["load"] = json!({"mode": "open", "rates_per_second": [5, 10], "duration_seconds": 1});
    let path = write_plan(tmp.path(), "open2.json", &plan);
    let (code, _, err) = run(&["validate", s(&path)]);
    assert_eq!(code, Some(0), "{err}");
    assert!(!err.contains("never measured"), "{err}");
}
