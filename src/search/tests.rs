//! The search's moves against made-up servers whose knee is known: each probe's requests
//! are drawn to pass or fail its SLO outright (or to sit on its bound), so every test
//! follows the bracket, the bisection and the confirmation probe by probe.

use super::*;

fn spec(kind: SearchKind, from: f64) -> SearchSpec {
    let mut s = SearchSpec::for_test(kind, "ttft_p90<=100ms", 0.05);
    (s.from, s.ceiling) = (from, 256.0);
    s
}

/// `n` requests whose TTFTs are all `ms`.
fn views(n: u64, ms: i64) -> Vec<RequestView> {
    (0..n)
        .map(|_| RequestView {
            ok: true,
            ttft_us: Some(ms * 1000),
            tpot_us: None,
            e2e_us: Some(ms * 1000),
        })
        .collect()
}

/// Run `s` to its end against a server: `at(load)` is the TTFT in ms every request of a
/// probe at that load sees, or `None` when the generator saturates there.
fn drive(mut s: Search, at: impl Fn(f64, usize) -> Option<i64>) -> (SearchRun, Vec<(f64, Step)>) {
    let mut asked = Vec::new();
    while let Some(ask) = s.next() {
        assert!(asked.len() < 100, "the search does not end: {asked:?}");
        let k = asked.iter().filter(|(l, _)| *l == ask.load).count();
        asked.push((ask.load, ask.step));
        let (v, saturation) = match at(ask.load, k) {
            Some(ms) => (views(ask.requests, ms), None),
            None => (views(ask.requests, 1), Some("late sends".to_string())),
        };
        let facts = ProbeFacts {
            attempted: ask.requests,
            successful: ask.requests,
            elapsed_seconds: 1.0,
            saturation,
            ..ProbeFacts::default()
        };
        s.observe(ask, v, facts);
    }
    (s.finish(), asked)
}

fn knee(k: f64) -> impl Fn(f64, usize) -> Option<i64> {
    move |load, _| Some(if load <= k { 10 } else { 1000 })
}

fn loads(asked: &[(f64, Step)]) -> Vec<f64> {
    asked.iter().map(|(l, _)| *l).collect()
}

#[test]
fn a_concurrency_knee_is_bracketed_bisected_and_confirmed() {
    let s = Search::new(&spec(SearchKind::Concurrency, 1.0), None, "chat");
    let (run, asked) = drive(s, knee(8.0));
    assert_eq!(
        loads(&asked),
        vec![
            1.0, 2.0, 4.0, 8.0, 16.0, 12.0, 10.0, 9.0, 8.0, 9.0, 8.0, 9.0
        ]
    );
    assert_eq!(run.stopped, StopReason::Found);
    let a = run.answer.unwrap();
    assert_eq!((a.load, a.first_fail), (8.0, Some(9.0)));
    assert!(a.confirmed);
    assert_eq!(
        a.confirmations,
        vec!["c=8:pass", "c=9:fail", "c=8:pass", "c=9:fail"]
    );
    assert_eq!(run.probes.len(), 12);
    // The statistics' 139, and at least 10 per worker at c = 16.
    assert!(
        run.probes
            .iter()
            .all(|p| p.planned_requests == 139.max(10 * p.load as u64))
    );
    assert_eq!(run.probes[4].planned_requests, 160);
}

#[test]
fn a_first_load_that_fails_is_halved_until_one_passes() {
    let (run, asked) = drive(
        Search::new(&spec(SearchKind::Concurrency, 16.0), None, "c"),
        knee(3.0),
    );
    assert_eq!(&loads(&asked)[..5], &[16.0, 8.0, 4.0, 2.0, 3.0]);
    let a = run.answer.unwrap();
    assert_eq!((a.load, a.first_fail), (3.0, Some(4.0)));
    // Nothing passes: the search says so and answers nothing.
    let (run, _) = drive(
        Search::new(&spec(SearchKind::Concurrency, 4.0), None, "c"),
        knee(0.0),
    );
    assert_eq!(run.stopped, StopReason::NoPassingLoad);
    assert!(run.answer.is_none());
    assert!(
        run.stopped_because.contains("c=1"),
        "{}",
        run.stopped_because
    );
}

#[test]
fn a_saturated_probe_is_never_the_answer() {
    // The server holds 100, the generator only 31.
    let at = |load: f64, _| (load <= 31.0).then_some(10);
    let (run, asked) = drive(
        Search::new(&spec(SearchKind::Concurrency, 8.0), None, "c"),
        at,
    );
    assert_eq!(&loads(&asked)[..3], &[8.0, 16.0, 32.0]);
    assert_eq!(run.stopped, StopReason::GeneratorSaturated);
    let a = run.answer.unwrap();
    assert_eq!(
        (a.load, a.first_fail, a.saturated_at),
        (31.0, None, Some(32.0))
    );
    // Only the pass is confirmed: there is no fail to repeat.
    assert_eq!(a.confirmations, vec!["c=31:pass", "c=31:pass"]);
    assert!(run.probes.iter().any(|p| p.verdict == Verdict::Saturated));
    assert!(run.stopped_because.contains("limit was not found"));
}

#[test]
fn a_probe_whose_bound_holds_the_slo_runs_again_pooled() {
    let mut s = Search::new(&spec(SearchKind::Concurrency, 4.0), None, "c");
    let ask = s.next().unwrap();
    // Half at 50 ms, half at 150 ms, and 10 % above: p90's interval spans the bound.
    let mut v = views(ask.requests, 50);
    let n = v.len();
    for (i, r) in v.iter_mut().enumerate() {
        if i >= n * 88 / 100 {
            r.ttft_us = Some(150_000);
        }
    }
    s.observe(ask, v.clone(), ProbeFacts::default());
    let again = s.next().unwrap();
    assert_eq!((again.load, again.step), (4.0, Step::Extend));
    s.observe(again, v, ProbeFacts::default());
    let run_so_far = s.next().unwrap();
    // Straddled twice: a fail for bracketing, so the search halves.
    assert_eq!((run_so_far.load, run_so_far.step), (2.0, Step::Bracket));
    let doc = s.finish();
    assert_eq!(
        doc.probes[1].judged_requests,
        2 * doc.probes[0].judged_requests
    );
    assert!(
        doc.probes[1]
            .note
            .as_deref()
            .unwrap()
            .contains("counted as a fail")
    );
    assert_eq!(doc.first_fail, Some(4.0));
}

#[test]
fn a_rate_knee_is_narrowed_to_five_percent() {
    let (run, asked) = drive(
        Search::new(&spec(SearchKind::Rate, 1.0), None, "c"),
        knee(10.0),
    );
    assert_eq!(&loads(&asked)[..5], &[1.0, 2.0, 4.0, 8.0, 16.0]);
    let a = run.answer.unwrap();
    let fail = a.first_fail.unwrap();
    assert!(a.load <= 10.0 && fail > 10.0, "{a:?}");
    assert!(fail / a.load <= 1.0 + RATE_RESOLUTION, "{a:?}");
}

#[test]
fn a_knee_that_moves_on_repetition_is_said_not_confirmed() {
    // The pass at 8 fails on its second repeat.
    let flaky = |load: f64, seen: usize| {
        Some(if load <= 8.0 && !(load == 8.0 && seen == 2) {
            10
        } else {
            1000
        })
    };
    let (run, _) = drive(
        Search::new(&spec(SearchKind::Concurrency, 1.0), None, "c"),
        flaky,
    );
    let a = run.answer.unwrap();
    assert!(!a.confirmed);
    assert_eq!(a.confirmations[2], "c=8:fail");
}

#[test]
fn every_probe_passing_up_to_the_ceiling_stops_there() {
    let mut sp = spec(SearchKind::Concurrency, 64.0);
    sp.ceiling = 100.0;
    let (run, asked) = drive(Search::new(&sp, None, "c"), knee(1e9));
    assert_eq!(&loads(&asked)[..2], &[64.0, 100.0]);
    assert_eq!(run.stopped, StopReason::Ceiling);
    assert_eq!(run.answer.unwrap().load, 100.0);
}

#[test]
fn a_concurrency_is_halved_down_to_one_however_high_it_started() {
    let (run, asked) = drive(
        Search::new(&spec(SearchKind::Concurrency, 128.0), None, "c"),
        knee(1.0),
    );
    assert_eq!(
        &loads(&asked)[..8],
        &[128.0, 64.0, 32.0, 16.0, 8.0, 4.0, 2.0, 1.0]
    );
    assert_eq!(run.answer.unwrap().load, 1.0);
}

#[test]
fn only_saturated_probes_say_the_generator_not_the_server_could_not_hold_the_load() {
    let (run, _) = drive(
        Search::new(&spec(SearchKind::Concurrency, 4.0), None, "c"),
        |_, _| None,
    );
    assert_eq!(run.stopped, StopReason::GeneratorSaturated);
    assert!(
        run.stopped_because
            .contains("nothing about the server was read")
    );
    assert!(run.answer.is_none());
}

#[test]
fn a_probe_that_fails_while_its_generator_fell_behind_still_fails() {
    let mut s = Search::new(&spec(SearchKind::Concurrency, 4.0), None, "c");
    let ask = s.next().unwrap();
    let late = ProbeFacts {
        saturation: Some("late sends".into()),
        wait_in_latency: true,
        ..ProbeFacts::default()
    };
    s.observe(ask, views(ask.requests, 1000), late.clone());
    let ask = s.next().unwrap();
    s.observe(ask, views(ask.requests, 10), late);
    // The tool's own CPU was the limit: its late reads inflate the times, so even a fail
    // is not the server's.
    let busy = ProbeFacts {
        saturation: Some("matrix-proxy used 97% of its cores".into()),
        ..ProbeFacts::default()
    };
    let ask = s.next().unwrap();
    s.observe(ask, views(ask.requests, 1000), busy);
    let run = s.finish();
    assert_eq!(run.probes[0].verdict, Verdict::Fail);
    assert_eq!(run.probes[1].verdict, Verdict::Saturated);
    assert_eq!(run.probes[2].verdict, Verdict::Saturated);
    assert_eq!(run.first_fail, Some(4.0));
}

#[test]
fn a_fail_above_saturated_probes_below_is_no_verdict_on_the_server_below() {
    // 8 fails, then 4, 2 and 1 saturate: nothing below 8 was read.
    let at = |load: f64, _| (load >= 8.0).then_some(1000);
    let (run, asked) = drive(
        Search::new(&spec(SearchKind::Concurrency, 8.0), None, "c"),
        at,
    );
    assert_eq!(loads(&asked), vec![8.0, 4.0, 2.0, 1.0]);
    assert_eq!(run.stopped, StopReason::GeneratorSaturated);
    assert!(
        run.stopped_because
            .contains("c=8 failed, and the generator could not hold c=1"),
        "{}",
        run.stopped_because
    );
}

#[test]
fn a_budget_that_cuts_the_confirmation_keeps_the_knee_unconfirmed() {
    let mut s = Search::new(&spec(SearchKind::Concurrency, 4.0), None, "c");
    // 4 passes, 8 fails, 6 fails, 5 fails: bracketed at 4 and 5; then one repeat runs.
    for ms in [10, 1000, 1000, 1000, 10] {
        let ask = s.next().unwrap();
        s.observe(ask, views(ask.requests, ms), ProbeFacts::default());
    }
    assert_eq!(s.next().unwrap().step, Step::Confirm);
    let why = s.undecided();
    assert!(
        why.contains("3 of its 4 confirmation repeats did not run"),
        "{why}"
    );
    s.stop(StopReason::Budget, why);
    let run = s.finish();
    let a = run.answer.unwrap();
    assert_eq!((a.load, a.first_fail, a.confirmed), (4.0, Some(5.0), false));
    assert_eq!(a.confirmations, vec!["c=4:pass"]);
    assert_eq!(a.confirmations_planned, 4);
    assert_eq!(run.stopped, StopReason::Budget);
}
