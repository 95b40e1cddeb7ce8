//! The per (case, level) table printed on stdout, with the scope of its numbers
//! written under it.

use std::collections::BTreeMap;

use crate::config::plan::Plan;
use crate::metrics::PhaseCounts;
use crate::metrics::{Aggregate, RoundMetrics};
use crate::model::{JudgedBy, Level, Outcome, Phase};

fn fmt_ms(v: Option<f64>) -> String {
    v.map_or("-".into(), |s| format!("{:.1}", s * 1000.0))
}

/// The per (case, level) table printed on stdout.
pub(crate) fn table(
    plan: &Plan,
    rounds: &[RoundMetrics],
    aggs: &[Aggregate],
    excluded: &BTreeMap<Phase, PhaseCounts>,
) -> String {
    let cols = Cols {
        open: aggs.iter().any(|a| a.rate.is_some()),
        trace: plan.load.trace.is_some(),
        goodput: plan.slo.is_some(),
        streams: rounds.iter().any(|r| r.stream.is_some()),
        usage: rounds
            .iter()
            .any(|r| r.stream.is_none() && r.usage_output_tokens_per_second.is_some()),
    };
    let closed = aggs.iter().any(|a| a.rate.is_none());
    // Which answers were judged, when not every case was judged by its oracle.
    let judged = plan.judged_cases();
    let show_judged = judged.iter().any(|(_, j)| *j != JudgedBy::Oracle);
    let mut rows: Vec<Vec<String>> = vec![header(cols, closed, show_judged)];
    for a in aggs {
        let mut row = aggregate_row(a, rounds, cols);
        if show_judged {
            let j = judged
                .iter()
                .find(|(name, _)| *name == a.case_name)
                .map_or(JudgedBy::Oracle, |(_, j)| *j);
            row.insert(row.len() - 1, j.label().into());
        }
        rows.push(row);
    }
    let mut out = aligned(&rows);
    let ex: Vec<String> = excluded
        .iter()
        .map(|(p, c)| format!("{} {}/{}", p.as_str(), c.successful, c.attempted))
        .collect();
    out.push_str(&format!(
        "excluded phases (ok/attempted): {}\n",
        if ex.is_empty() {
            "none".into()
        } else {
            ex.join(", ")
        }
    ));
    out.push_str(&format!(
        "req/s and latency: medians over complete rounds; req/s = successful / round wall time (ramp and drain included); latency = start to last body byte, validation excluded; {} connections\n",
        plan.connection.as_str()
    ));
    out.push_str(&turns_block(aggs, rounds));
    out.push_str(&judged_notes(&judged));
    out.push_str(&column_notes(cols));
    out.push_str(&round_warnings(rounds));
    out
}

/// The table's header line: `closed` when some level is a concurrency, `judged` with the
/// `judged` column.
fn header(cols: Cols, closed: bool, judged: bool) -> Vec<String> {
    let level = match (cols.open, closed) {
        (true, true) => "level",
        (true, false) => "rate",
        _ => "c",
    };
    let mut h: Vec<String> = vec![
        "case".into(),
        level.into(),
        "rounds".into(),
        "req/s".into(),
        "spread".into(),
        "p50 ms".into(),
        "p95 ms".into(),
    ];
    if cols.trace {
        h.extend(
            [
                "svc p50 ms",
                "sched/s",
                "sent/s",
                "lag p50 ms",
                "lag p99 ms",
                "floor p99 ms",
                "saturated",
            ]
            .map(String::from),
        );
    } else if cols.open {
        h.extend(["svc p50 ms".into(), "lag p99 ms".into(), "saturated".into()]);
    }
    if cols.goodput {
        h.push("good/s".into());
    }
    if cols.streams {
        h.extend(["TTFT ms".into(), "ITL ms".into(), "tok/s".into()]);
    } else if cols.usage {
        h.push("tok/s".into());
    }
    h.push("ok/attempted".into());
    if judged {
        h.push("judged".into());
    }
    h.push("failures".into());
    h
}

/// The rows as lines, each column as wide as its widest cell (the first two to the left,
/// the numbers to the right).
fn aligned(rows: &[Vec<String>]) -> String {
    let mut widths = vec![0usize; rows[0].len()];
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let mut out = String::new();
    for r in rows {
        let line: Vec<String> = r
            .iter()
            .enumerate()
            .map(|(i, c)| {
                if i < 2 {
                    format!("{c:<w$}", w = widths[i])
                } else {
                    format!("{c:>w$}", w = widths[i])
                }
            })
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// What the optional columns mean, for those the table has.
fn column_notes(cols: Cols) -> String {
    let mut out = String::new();
    if cols.open {
        out.push_str(&format!("open-loop rates: p50/p95 run from each request's intended send time (the user's latency, queueing included); svc p50 from the actual send; lag p99 = how late sends left (median over rounds); saturated = rounds with a send more than {} ms behind its schedule\n", crate::metrics::SATURATION_LAG_US / 1000));
    }
    if cols.trace {
        out.push_str("trace: rate = the trace's recorded rate in its window at load.speedup (the level); each case's rounds are its entries of the trace round; sched/s = the rate of its intended sends (its recorded times / speedup), sent/s = of its actual sends; lag p50 = the median send's lateness (median over rounds); floor p99 = how late a bare thread woke from sleeping to deadlines 500 µs apart just before each round (the machine's own floor for a send's lag; median over rounds)\n");
    }
    if cols.goodput {
        out.push_str("good/s: successful requests that met every bound of the plan's slo, per second of round wall time (median over fully attempted rounds, failed requests included)\n");
    }
    if cols.usage {
        out.push_str("tok/s (usage): output tokens the JSON answers' usage reported / round wall time, median over complete rounds (a non-streaming case has no TTFT or ITL)\n");
    }
    if cols.streams {
        out.push_str("TTFT, ITL (pooled gaps) p50 and tok/s (all output tokens / round wall time): medians over complete rounds of streaming cases of each round's own value (a campaign.json cell's ttft_p50_ms pools every request of the level instead; on noisy rounds the two differ)\n");
    }
    out
}

/// What "not judged" and "drift" in the table's `judged` column mean, when they appear.
fn judged_notes(judged: &[(&str, JudgedBy)]) -> String {
    let mut out = String::new();
    if judged.iter().any(|(_, j)| *j == JudgedBy::No) {
        out.push_str("not judged: a capture plan's answers are recorded, not checked; ok = the exchange completed with the expected status (a stream complete by its framing); `matrix-proxy freeze RUN` turns them into oracles\n");
    }
    if judged.iter().any(|(_, j)| *j == JudgedBy::Drift) {
        out.push_str("drift: a campaign case without an oracle; its answers are compared with the reference's (campaign.json's drift), ok = completed with the expected status\n");
    }
    out
}

/// The rounds' warnings under the table: a generator that may have been the bottleneck,
/// an open round that fell behind its schedule; named by arm in a campaign.
fn round_warnings(rounds: &[RoundMetrics]) -> String {
    let mut out = String::new();
    for r in rounds {
        let at = match r.level() {
            Level::Concurrency(c) => format!("c={c}"),
            l => l.label(),
        };
        let arm = r
            .arm
            .as_deref()
            .map_or(String::new(), |a| format!("[{a}] "));
        if let Some(w) = r.generator.as_ref().and_then(|g| g.warning.as_ref()) {
            out.push_str(&format!(
                "warning: {arm}{} {at} round {}: {w}\n",
                r.case_name,
                r.repetition + 1
            ));
        }
        if let Some(o) = r.open.as_ref().filter(|o| o.saturated) {
            out.push_str(&format!(
                "warning: {arm}{} {at} round {}: saturated: {} send(s) fell more than {} ms behind their schedule (worst {:.1} ms)\n",
                r.case_name,
                r.repetition + 1,
                o.late_sends,
                crate::metrics::SATURATION_LAG_US / 1000,
                o.send_lag_max_us.unwrap_or(0) as f64 / 1000.0
            ));
        }
    }
    out
}

/// Which optional columns the table has.
#[derive(Clone, Copy)]
struct Cols {
    open: bool,
    /// A trace plan: its rounds' scheduled and achieved rates and median lag too.
    trace: bool,
    goodput: bool,
    streams: bool,
    /// Some non-streaming round's answers reported `usage`.
    usage: bool,
}

/// One (case, level) line of the table.
fn aggregate_row(a: &Aggregate, rounds: &[RoundMetrics], cols: Cols) -> Vec<String> {
    let level = match a.rate {
        Some(r) => Level::Rate(r),
        None => Level::Concurrency(a.concurrency),
    };
    let rs: Vec<&RoundMetrics> = rounds
        .iter()
        .filter(|r| r.arm == a.arm && r.case_name == a.case_name && r.level() == level)
        .collect();
    let get = |name: &str| metric(a, name);
    let rps = get("successful_requests_per_second");
    let mut row = vec![
        // In a campaign, `arm/case`.
        match &a.arm {
            Some(arm) => format!("{arm}/{}", a.case_name),
            None => a.case_name.clone(),
        },
        level.label(),
        format!("{}/{}", a.complete_rounds, a.planned_rounds),
        rps.as_ref()
            .map_or("-".into(), |s| format!("{:.1}", s.median)),
        rps.and_then(|s| s.relative_spread)
            .map_or("-".into(), |s| format!("{:.1}%", s * 100.0)),
        fmt_ms(get("latency_p50_seconds").map(|s| s.median)),
        fmt_ms(get("latency_p95_seconds").map(|s| s.median)),
    ];
    if cols.open {
        if a.rate.is_some() {
            row.push(fmt_ms(get("service_latency_p50_seconds").map(|s| s.median)));
            if cols.trace {
                let rate =
                    |name: &str| get(name).map_or("-".into(), |s| format!("{:.1}", s.median));
                row.push(rate("scheduled_rate_per_second"));
                row.push(rate("achieved_rate_per_second"));
                row.push(fmt_ms(get("send_lag_p50_seconds").map(|s| s.median)));
            }
            row.push(fmt_ms(get("send_lag_p99_seconds").map(|s| s.median)));
            if cols.trace {
                let floors: Vec<f64> = rs
                    .iter()
                    .filter_map(|r| r.open.as_ref()?.wake_floor_p99_us)
                    .map(|us| us as f64 / 1e6)
                    .collect();
                row.push(fmt_ms(crate::metrics::median(&floors)));
            }
            let saturated = rs
                .iter()
                .filter(|r| r.open.as_ref().is_some_and(|o| o.saturated))
                .count();
            row.push(format!("{saturated}/{}", rs.len()));
        } else {
            row.extend(["-".into(), "-".into(), "-".into()]);
        }
    }
    if cols.goodput {
        row.push(
            get("goodput_requests_per_second").map_or("-".into(), |s| format!("{:.1}", s.median)),
        );
    }
    if cols.streams {
        row.push(fmt_ms(get("ttft_p50_seconds").map(|s| s.median)));
        row.push(fmt_ms(get("itl_p50_seconds").map(|s| s.median)));
        row.push(
            get("output_tokens_per_second_aggregate")
                .map_or_else(|| usage_tps(&rs), |s| format!("{:.0}", s.median)),
        );
    } else if cols.usage {
        row.push(usage_tps(&rs));
    }
    row.extend(outcome_cells(&rs));
    row
}

/// The spread of metric `name` over the aggregate's rounds.
fn metric(a: &Aggregate, name: &str) -> Option<crate::metrics::Spread> {
    a.metrics
        .iter()
        .find(|(k, _)| *k == name)
        .and_then(|(_, s)| s.clone())
}

/// Non-streaming rounds: the tokens their answers' usage reported, per second.
fn usage_tps(rs: &[&RoundMetrics]) -> String {
    let mut v: Vec<f64> = rs
        .iter()
        .filter(|r| r.complete && r.stream.is_none())
        .filter_map(|r| r.usage_output_tokens_per_second)
        .collect();
    v.sort_by(f64::total_cmp);
    // Nearest rank at 50 %.
    let median = v.get(v.len().div_ceil(2).saturating_sub(1)).copied();
    median.map_or("-".into(), |m| format!("{m:.0} (usage)"))
}

/// The `ok/attempted` and `failures` cells of the rounds `rs`.
fn outcome_cells(rs: &[&RoundMetrics]) -> [String; 2] {
    let ok: u64 = rs.iter().map(|r| r.successful_requests).sum();
    let att: u64 = rs.iter().map(|r| r.attempted_requests).sum();
    let mut fails: BTreeMap<Outcome, u64> = BTreeMap::new();
    for r in rs {
        for (k, v) in &r.failures {
            *fails.entry(*k).or_insert(0) += v;
        }
    }
    [
        format!("{ok}/{att}"),
        if fails.is_empty() {
            "0".into()
        } else {
            fails
                .iter()
                .map(|(k, v)| format!("{}={v}", k.as_str()))
                .collect::<Vec<_>>()
                .join(" ")
        },
    ]
}

/// Per turn index of each case and level with sessions: ok/attempted over its measured
/// rounds, and the median over its complete rounds of each round's p50 first byte, TTFT,
/// latency, prompt tokens and cached prompt tokens (what a prefix cache does to turn 2 on);
/// in a trace, of each round's p50 and p99 session lag too.
fn turns_block(aggs: &[Aggregate], rounds: &[RoundMetrics]) -> String {
    let lagged = rounds
        .iter()
        .flat_map(|r| &r.turns)
        .any(|t| t.session_lag_us.p50.is_some());
    let mut rows: Vec<Vec<String>> = vec![
        [
            "per turn",
            "level",
            "turn",
            "ok/attempted",
            "first byte ms",
            "TTFT ms",
            "p50 ms",
            "prompt tok",
            "cached tok",
        ]
        .map(String::from)
        .to_vec(),
    ];
    if lagged {
        rows[0].extend(["lag p50 ms".to_string(), "lag p99 ms".to_string()]);
    }
    for a in aggs {
        let level = a
            .rate
            .map_or(Level::Concurrency(a.concurrency), Level::Rate);
        let rs: Vec<&RoundMetrics> = rounds
            .iter()
            .filter(|r| r.arm == a.arm && r.case_name == a.case_name && r.level() == level)
            .collect();
        let last = rs.iter().flat_map(|r| &r.turns).map(|t| t.turn).max();
        for k in 1..=last.unwrap_or(0) {
            let of_k: Vec<(&RoundMetrics, &crate::metrics::TurnMetrics)> = rs
                .iter()
                .filter_map(|r| Some((*r, r.turns.iter().find(|t| t.turn == k)?)))
                .collect();
            let median = |f: &dyn Fn(&crate::metrics::TurnMetrics) -> Option<i64>| {
                let v: Vec<f64> = of_k
                    .iter()
                    .filter(|(r, _)| r.complete)
                    .filter_map(|(_, t)| f(t).map(|x| x as f64))
                    .collect();
                crate::metrics::median(&v)
            };
            let ms = |f: &dyn Fn(&crate::metrics::TurnMetrics) -> Option<i64>| {
                fmt_ms(median(f).map(|us| us / 1e6))
            };
            let tokens = |f: &dyn Fn(&crate::metrics::TurnMetrics) -> Option<i64>| {
                median(f).map_or("-".into(), |n| format!("{n:.0}"))
            };
            let mut row = vec![
                match &a.arm {
                    Some(arm) => format!("{arm}/{}", a.case_name),
                    None => a.case_name.clone(),
                },
                level.label(),
                k.to_string(),
                format!(
                    "{}/{}",
                    of_k.iter().map(|(_, t)| t.successful).sum::<u64>(),
                    of_k.iter().map(|(_, t)| t.attempted).sum::<u64>()
                ),
                ms(&|t| t.first_byte_us.p50),
                ms(&|t| t.ttft_us.p50),
                ms(&|t| t.total_us.p50),
                tokens(&|t| t.prompt_tokens.p50),
                tokens(&|t| t.cached_prompt_tokens.p50),
            ];
            if lagged {
                row.push(ms(&|t| t.session_lag_us.p50));
                row.push(ms(&|t| t.session_lag_us.p99));
            }
            rows.push(row);
        }
    }
    if rows.len() == 1 {
        return String::new();
    }
    let mut out = aligned(&rows);
    out.push_str("per turn: ok/attempted over measured rounds; first byte, TTFT (streams), p50 latency, prompt and cached prompt tokens (the server's usage; - where it reported none): medians over complete rounds of each round's p50 over its turns k\n");
    if lagged {
        out.push_str("session lag: how much later than its trace entry's offset a turn was due (the turn before it and its think time ended later); its scheduled_offset_us is when it was due, so the rounds' latency from the schedule counts from then (the per-turn p50 ms above from its send)\n");
    }
    out
}
