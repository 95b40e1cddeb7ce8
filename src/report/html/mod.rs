//! `matrix-proxy report`: one self-contained HTML file of one or more runs. Every chart
//! is a JSON block of the numbers it draws (`<script type="application/json"
//! class="chart-data">`) and an empty `<figure>` that the inline script (`report.js`, no
//! library, no network) draws as SVG from that block, so what is drawn is exactly what
//! is embedded, and a test can recompute every block from `exchanges/` with DuckDB.
//!
//! The numbers are built here from the run's own files: latency distributions and the
//! timeline from the recorded rows, per-round points from summary.json, the campaign's
//! tables from campaign.json and verdict.json. Nothing is sampled: a CDF is the nearest
//! rank at every whole percent (0 to 100) of every row of its group.

mod charts;
mod input;
mod search;

pub(crate) use input::RunInput;
use input::esc;
use serde_json::Value;

use super::doc::Failures;
use super::doc::campaign::CampaignDoc;
use super::doc::summary::{AnySummary, Round, ServeSummary, Summary};
use super::doc::verdict::VerdictDoc;
use crate::model::JudgedBy;

const SCRIPT: &str = include_str!("report.js");
const STYLE: &str = include_str!("report.css");

/// The report's HTML: provenance first, then every chart, then campaign tables.
pub(crate) fn render(runs: &[RunInput], generated_at: &str) -> String {
    let mut charts = charts::all(runs);
    charts.extend(search::charts(runs));
    let mut h = String::with_capacity(64 << 10);
    let title = match runs {
        [one] => format!("matrix-proxy report: {}", one.label),
        _ => format!("matrix-proxy report: {} runs", runs.len()),
    };
    h.push_str("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n");
    h.push_str("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n");
    h.push_str(&format!(
        "<title>{}</title>\n<style>\n{STYLE}</style>\n</head>\n<body>\n",
        esc(&title)
    ));
    h.push_str(&format!("<h1>{}</h1>\n", esc(&title)));
    h.push_str(&format!(
        "<p class=\"meta\">Generated {} by matrix-proxy {}. Every chart is drawn from the JSON block beside it; nothing is sampled or smoothed.</p>\n",
        esc(generated_at),
        env!("CARGO_PKG_VERSION")
    ));
    for r in runs {
        h.push_str(&verdict_first(r));
    }
    h.push_str("<section id=\"provenance\">\n<h2>Provenance and denominators</h2>\n");
    h.push_str(&provenance_table(runs));
    h.push_str("</section>\n");
    for r in runs.iter().filter(|r| r.campaign.is_some()) {
        h.push_str(&campaign_tables(r));
    }
    for r in runs {
        h.push_str(&turns_table(r));
    }
    h.push_str("<section id=\"charts\">\n<h2>Charts</h2>\n");
    if charts.is_empty() {
        h.push_str(
            "<p>No measured or live exchanges were recorded, so there is nothing to draw.</p>\n",
        );
    }
    for c in &charts {
        h.push_str(&c.html());
    }
    h.push_str("</section>\n");
    h.push_str(&format!("<script>\n{SCRIPT}</script>\n</body>\n</html>\n"));
    h
}

/// A run's measured rounds per session turn (summary.json's `turns`): one row per
/// round and turn index; empty when no case has sessions.
fn turns_table(r: &RunInput) -> String {
    let Some(s) = r.replay_summary() else {
        return String::new();
    };
    let rows: Vec<(&Round, &crate::report::doc::summary::TurnDoc)> = s
        .rounds
        .iter()
        .flat_map(|round| round.turns.iter().map(move |t| (round, t)))
        .collect();
    if rows.is_empty() {
        return String::new();
    }
    let mut h = format!(
        "<section class=\"turns\">\n<h2>Per turn: {}</h2>\n<p>Each measured round's sessions by turn index: p50 over the round's successful turns k (TTFT: streamed answers only; tokens: the server's usage, — where it reported none). From turn 2 on every request resends the conversation, so the server's prefix cache shows in TTFT and cached prompt tokens.</p>\n",
        esc(&r.label)
    );
    let lagged = rows
        .iter()
        .any(|(_, t)| t.session_lag_seconds.p50.is_some());
    h.push_str("<table class=\"grid\">\n<tr><th>case</th><th>level</th><th>repetition</th><th>turn</th><th>ok / attempted</th><th>first byte p50 ms</th><th>TTFT p50 ms</th><th>latency p50 ms</th><th>prompt tokens p50</th><th>cached prompt tokens p50</th>");
    if lagged {
        h.push_str("<th>session lag p50 ms</th><th>session lag p99 ms</th>");
    }
    h.push_str("</tr>\n");
    let ms = |v: Option<f64>| text(v.map(|s| format!("{:.1}", s * 1000.0)));
    for (round, t) in rows {
        let level = match (round.concurrency, round.rate_per_second) {
            (Some(c), _) => format!("c={c}"),
            (None, Some(rate)) => format!("{rate}/s"),
            _ => "—".into(),
        };
        let lag = if lagged {
            format!(
                "<td>{}</td><td>{}</td>",
                ms(t.session_lag_seconds.p50),
                ms(t.session_lag_seconds.p99)
            )
        } else {
            String::new()
        };
        h.push_str(&format!(
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{} / {}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>{lag}</tr>\n",
            esc(&round.case),
            esc(&level),
            round.repetition,
            t.turn,
            t.successful,
            t.attempted,
            ms(t.first_byte_seconds.p50),
            ms(t.ttft_seconds.p50),
            ms(t.latency_seconds.p50),
            text(t.prompt_tokens.p50),
            text(t.cached_prompt_tokens.p50),
        ));
    }
    h.push_str("</table>\n</section>\n");
    h
}

/// An optional value as text, or `—` when there is none.
fn text<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "—".into(), |v| v.to_string())
}

/// A provenance table's rows: (what, value).
type Rows = Vec<(String, String)>;

fn row(h: &mut Rows, key: &str, value: &str) {
    h.push((key.to_string(), value.to_string()));
}

/// Every run's provenance in one table, a column per run (a key a run lacks: `—`).
fn provenance_table(runs: &[RunInput]) -> String {
    let all: Vec<Rows> = runs.iter().map(provenance).collect();
    let mut keys: Vec<&str> = Vec::new();
    for k in all.iter().flatten().map(|(k, _)| k.as_str()) {
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    let mut h = String::from("<table class=\"kv\">\n<tr><th></th>");
    for r in runs {
        h.push_str(&format!(
            "<th class=\"run\" data-run=\"{0}\">{0}</th>",
            esc(&r.label)
        ));
    }
    h.push_str("</tr>\n");
    for k in keys {
        h.push_str(&format!("<tr><th>{}</th>", esc(k)));
        for rows in &all {
            let v = rows
                .iter()
                .find(|(rk, _)| rk == k)
                .map_or("—", |(_, v)| v.as_str());
            h.push_str(&format!("<td>{}</td>", esc(v)));
        }
        h.push_str("</tr>\n");
    }
    h.push_str("</table>\n");
    h
}

/// An open-loop run's rounds on the first screen: how many were saturated (sends fell
/// behind their schedule), the achieved against the target rate, and the worst send lag.
fn open_rounds(rounds: &[Round]) -> Option<String> {
    let open: Vec<_> = rounds.iter().filter_map(|r| r.open_loop.as_ref()).collect();
    if open.is_empty() {
        return None;
    }
    let saturated = open.iter().filter(|o| o.saturated).count();
    let rates: Vec<String> = open
        .iter()
        .map(|o| {
            let achieved = o
                .achieved_rate_per_second
                .map_or("—".to_string(), |a| format!("{a:.1}"));
            format!("{achieved}/{}", o.target_rate_per_second)
        })
        .collect();
    let worst_lag = open
        .iter()
        .filter_map(|o| o.send_lag_max_seconds)
        .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))));
    Some(format!(
        "{saturated} of {} saturated; achieved/target req/s per round: {}; worst send lag {}",
        open.len(),
        rates.join(", "),
        worst_lag.map_or("—".to_string(), |l| format!("{:.1} ms", l * 1000.0))
    ))
}

/// One run's provenance: what ran, from which plan and binary, how it ended, and every
/// denominator (planned / attempted / successful, excluded phases).
fn provenance(r: &RunInput) -> Rows {
    let c = &r.config;
    let mut h = Rows::new();
    row(&mut h, "run directory", &r.dir);
    row(&mut h, "run id", &c.run_id);
    row(&mut h, "command", c.command.as_str());
    row(
        &mut h,
        "started / finished",
        &format!("{} / {}", c.started_at, text(c.finished_at.as_deref())),
    );
    let ending = match &r.summary {
        AnySummary::Replay(s) => s.ending.as_str(),
        AnySummary::Serve(s) => s.ending.as_str(),
    };
    row(&mut h, "ending", ending);
    if let AnySummary::Replay(s) = &r.summary
        && let Some(open) = open_rounds(&s.rounds)
    {
        // "passed" says every request was answered as expected, not that the load was
        // what the plan asked for: an open loop's own verdict on that sits beside it.
        row(&mut h, "open-loop rounds", &open);
    }
    row(
        &mut h,
        "binary",
        &format!(
            "{} {} (sha256 {})",
            c.tool.name,
            c.tool.version,
            text(c.tool.binary_sha256.as_deref())
        ),
    );
    row(
        &mut h,
        "host",
        &format!(
            "{} ({} cores, {})",
            text(c.host.hostname.as_deref()),
            text(c.host.cpu_count),
            text(c.host.os_release.as_deref())
        ),
    );
    match (c.replay(), r.replay_summary(), c.serve(), r.serve_summary()) {
        (Some(_), Some(s), _, _) => replay_denominators(&mut h, r, s),
        (_, _, Some(f), Some(s)) => serve_denominators(&mut h, &f.upstream, s),
        _ => {}
    }
    h
}

fn replay_denominators(h: &mut Rows, r: &RunInput, s: &Summary) {
    let Some(c) = r.config.replay() else {
        return;
    };
    row(
        h,
        "plan",
        &format!("{} (sha256 {})", c.plan_path, c.plan_sha256),
    );
    row(h, "workload sha256", &c.workload_sha256);
    if let Some(m) = &r.plan_metadata {
        row(h, "plan metadata", &Value::Object(m.clone()).to_string());
    }
    let evidence = r
        .campaign
        .as_ref()
        .map(|k| text(k.evidence_class.as_deref()))
        .unwrap_or_else(|| "— (not a campaign)".into());
    row(h, "evidence class", &evidence);
    let endpoint = match &r.campaign {
        Some(k) => {
            let each: Vec<String> = k
                .arms
                .iter()
                .map(|a| format!("{} {}", a.name, a.endpoint.as_deref().unwrap_or("—")))
                .collect();
            format!("per arm: {}", each.join(", "))
        }
        None => c.endpoint.clone(),
    };
    row(h, "endpoint", &endpoint);
    // Only the settings the mode uses: a closed loop has no arrival process, seed or
    // in-flight bound (config.json keeps every key).
    let shown = match s.load.mode.as_str() {
        "closed" => serde_json::json!({"mode": "closed"}).to_string(),
        _ => c.effective_budget.load.to_string(),
    };
    row(h, "load", &shown);
    replay_counts(h, s);
}

/// The replay run's counts: requests, rounds, excluded phases, failures, and how its
/// answers were judged.
fn replay_counts(h: &mut Rows, s: &Summary) {
    let rounds = &s.rounds;
    let sum = |f: fn(&super::doc::summary::Round) -> u64| rounds.iter().map(f).sum::<u64>();
    let complete = rounds.iter().filter(|x| x.complete).count();
    row(
        h,
        "requests, every phase: planned / recorded",
        &format!("{} / {}", s.planned_requests, s.rows_written),
    );
    row(
        h,
        "measured requests (rounds run): planned / attempted / successful",
        &format!(
            "{} / {} / {}",
            sum(|x| x.planned_requests),
            sum(|x| x.attempted_requests),
            sum(|x| x.successful_requests)
        ),
    );
    row(
        h,
        "measured rounds: planned / run / complete",
        &format!("{} / {} / {complete}", s.planned_rounds, rounds.len()),
    );
    let excluded: Vec<String> = s
        .excluded_phases
        .iter()
        .map(|(phase, v)| {
            format!(
                "{} {}/{}",
                phase.as_str(),
                v.successful_requests,
                v.attempted_requests
            )
        })
        .collect();
    row(
        h,
        "excluded phases (successful/attempted)",
        &excluded.join(", "),
    );
    row(
        h,
        "failures by kind (all phases)",
        &failures_text(&s.failures),
    );
    if s.cases.iter().any(|c| c.judged != JudgedBy::Oracle) {
        let each: Vec<String> = s
            .cases
            .iter()
            .map(|c| format!("{} {}", c.name, c.judged.label()))
            .collect();
        let note = if s.cases.iter().any(|c| c.judged == JudgedBy::No) {
            " (not judged: a capture plan's answers are recorded, not checked; ok means the exchange completed with the expected status)"
        } else {
            " (drift: compared with the reference's answers in campaign.json)"
        };
        row(
            h,
            "answers judged by",
            &format!("{}{note}", each.join(", ")),
        );
    }
}

fn serve_denominators(h: &mut Rows, upstream: &str, s: &ServeSummary) {
    row(h, "upstream", upstream);
    row(
        h,
        "requests: received / successful / rows written / rows dropped",
        &format!(
            "{} / {} / {} / {}",
            s.requests, s.successful_requests, s.rows_written, s.dropped_rows
        ),
    );
    row(h, "failures by kind", &failures_text(&s.failures));
}

fn failures_text(f: &Failures) -> String {
    if f.is_empty() {
        return "none".into();
    }
    f.iter()
        .map(|(k, n)| format!("{} {n}", k.as_str()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A campaign run's arms beside the reference, drift per arm, and the verdict with every
/// gate, as tables (the charts carry the same arms as series).
fn campaign_tables(r: &RunInput) -> String {
    let Some(k) = &r.campaign else {
        return String::new();
    };
    let mut h = format!(
        "<section class=\"campaign\">\n<h2>Campaign: {}</h2>\n",
        esc(&r.label)
    );
    h.push_str(&format!(
        "<p>Reference arm <b>{}</b>; evidence class <b>{}</b>; schedule {}.</p>\n",
        esc(&text(k.reference_arm.as_deref())),
        esc(&text(k.evidence_class.as_deref())),
        esc(&k.schedule)
    ));
    h.push_str("<table class=\"grid\" id=\"campaign-arms\">\n<tr><th>arm</th><th>lane</th><th>available</th><th>c</th><th>latency p50 ms</th><th>latency p95 ms</th><th>TTFT p50 ms</th><th>decode tok/s</th><th>aggregate tok/s</th><th>peak RSS MiB</th><th>peak VRAM MiB</th><th>failed / attempted</th></tr>\n");
    for arm in &k.arms {
        let name = format!(
            "{}{}",
            arm.name,
            if arm.reference { " (reference)" } else { "" }
        );
        let lane = arm.lane.as_str();
        if arm.concurrency.is_empty() {
            h.push_str(&format!(
                "<tr><td>{}</td><td>{}</td><td>{}</td><td colspan=\"9\">{}</td></tr>\n",
                esc(&name),
                esc(lane),
                arm.available,
                esc(&text(arm.unavailable_reason.as_deref()))
            ));
        }
        for (c, cell) in &arm.concurrency {
            let f = |v: Option<f64>| esc(&fmt_num(v));
            let mib = |b: Option<u64>| f(b.map(|b| b as f64 / f64::from(1u32 << 20)));
            h.push_str(&format!(
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{} / {}</td></tr>\n",
                esc(&name),
                esc(lane),
                arm.available,
                c,
                f(cell.latency_p50_ms),
                f(cell.latency_p95_ms),
                f(cell.ttft_p50_ms),
                f(cell.decode_tokens_per_sec),
                f(cell.aggregate_decode_tokens_per_sec),
                mib(cell.peak_rss_bytes),
                mib(cell.peak_vram_bytes),
                text(cell.failed_requests),
                cell.attempted_requests
            ));
        }
    }
    h.push_str("</table>\n");
    h.push_str(&drift_table(k));
    if let Some(v) = &r.verdict {
        h.push_str(&verdict_table(v));
    }
    h.push_str("</section>\n");
    h
}

fn drift_table(k: &CampaignDoc) -> String {
    let mut h = String::from("<h3>Drift against the reference</h3>\n");
    let drift = k.drift_entries();
    if drift.is_empty() {
        let why = k
            .drift_unavailable_reason
            .as_deref()
            .unwrap_or("no arm besides the reference was available");
        h.push_str(&format!("<p>No drift: {}.</p>\n", esc(why)));
        return h;
    }
    h.push_str("<table class=\"grid\" id=\"campaign-drift\">\n<tr><th>arm</th><th>lane</th><th>compared prompts</th><th>exact match rate</th><th>mean similarity</th><th>decision flips / pairs</th><th>unpaired (reference / arm)</th></tr>\n");
    for d in drift {
        let x = &d.drift;
        h.push_str(&format!(
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{} / {}</td><td>{} / {}</td></tr>\n",
            esc(&d.arm),
            esc(&text(d.lane.map(|l| l.as_str()))),
            x.compared_prompts,
            esc(&fmt_num(x.exact_match_rate)),
            esc(&fmt_num(x.mean_similarity)),
            text(x.decision_flips),
            x.decision_pairs,
            x.unpaired_reference_answers,
            x.unpaired_arm_answers
        ));
    }
    h.push_str("</table>\n");
    if let Some(f) = &k.drift_floor {
        let said = match &f.reason {
            Some(why) => format!("none ({why})"),
            None => format!(
                "{} pairs, exact match rate {}, mean similarity {}; each arm's exact match rate minus it: {}",
                f.drift.compared_prompts,
                fmt_num(f.drift.exact_match_rate),
                fmt_num(f.drift.mean_similarity),
                drift
                    .iter()
                    .map(|d| format!("{} {}", d.arm, fmt_num(d.exact_match_rate_minus_floor)))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        h.push_str(&format!(
            "<p id=\"campaign-drift-floor\">Floor: the reference ({}) against its own answers in other repetitions: {}.</p>\n",
            esc(&f.reference_arm),
            esc(&said)
        ));
    }
    if let Some(iv) = &k.intervals {
        h.push_str(&format!(
            "<p id=\"campaign-intervals\">Ratios to the reference with their 95 % bootstrap intervals ({}):</p>\n<pre>{}</pre>\n",
            esc(&iv.pairing),
            esc(&crate::report::intervals::intervals_text(iv))
        ));
    }
    h
}

/// A run's verdict first on the page: the word, why, and each gate an arm failed or could
/// not read, with its numbers (the full table comes with the campaign's tables).
fn verdict_first(r: &RunInput) -> String {
    let Some(v) = &r.verdict else {
        return String::new();
    };
    let gates = v.gates();
    let mut h = format!(
        "<section class=\"verdict-first\">\n<h2>Verdict of {}: <span class=\"verdict\">{}</span>{}</h2>\n<p>{}</p>\n",
        esc(&r.label),
        esc(&text(gates.map(|g| &g.verdict))),
        if v.post_hoc { " (post hoc)" } else { "" },
        esc(&text(gates.map(|g| &g.verdict_reason)))
    );
    let short: Vec<String> = gates
        .map_or(&[][..], |g| g.gates.as_slice())
        .iter()
        .flat_map(|g| {
            g.arms
                .iter()
                .filter(|a| a.pass != Some(true))
                .map(move |a| {
                    format!(
                        "<li><b>{}</b> {} <span class=\"{}\">{}</span>: {}</li>",
                        esc(&g.gate),
                        esc(&a.arm),
                        pass_text(a.pass).replace('/', ""),
                        pass_text(a.pass),
                        esc(&crate::report::verdict::arm_detail(a))
                    )
                })
        })
        .collect();
    if !short.is_empty() {
        h.push_str("<p>Gates an arm failed or had nothing to read for, with their numbers:</p>\n<ul class=\"failing-gates\">\n");
        h.push_str(&short.join("\n"));
        h.push_str("\n</ul>\n");
    }
    h.push_str("</section>\n");
    h
}

fn verdict_table(v: &VerdictDoc) -> String {
    let gates = v.gates();
    let mut h = format!(
        "<h3>Verdict: <span class=\"verdict\">{}</span>{}</h3>\n<p>{}</p>\n",
        esc(&text(gates.map(|g| &g.verdict))),
        if v.post_hoc { " (post hoc)" } else { "" },
        esc(&text(gates.map(|g| &g.verdict_reason)))
    );
    h.push_str("<table class=\"grid\" id=\"campaign-gates\">\n<tr><th>gate</th><th>threshold</th><th>passes when</th><th>pass</th><th>per arm</th></tr>\n");
    for g in gates.map_or(&[][..], |g| g.gates.as_slice()) {
        let arms: Vec<String> = g
            .arms
            .iter()
            .map(|a| {
                let note = a
                    .note
                    .as_deref()
                    .map(|n| format!(" ({n})"))
                    .unwrap_or_default();
                format!("{}: {}{note}", a.arm, pass_text(a.pass))
            })
            .collect();
        h.push_str(&format!(
            "<tr><td>{}</td><td>{}</td><td>{}</td><td class=\"{}\">{}</td><td>{}</td></tr>\n",
            esc(&g.gate),
            esc(&g.threshold.to_string()),
            esc(&g.passes_when),
            pass_text(g.pass).replace('/', ""),
            pass_text(g.pass),
            esc(&arms.join("; "))
        ));
    }
    h.push_str("</table>\n");
    h
}

/// A three-valued pass: `n/a` when the gate had nothing to read.
fn pass_text(v: Option<bool>) -> &'static str {
    match v {
        Some(true) => "pass",
        Some(false) => "fail",
        None => "n/a",
    }
}

/// A number with at most 4 decimals, or `—`.
fn fmt_num(v: Option<f64>) -> String {
    match v {
        Some(x) => {
            let s = format!("{x:.4}");
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        }
        None => "—".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::open_rounds;
    use crate::report::doc::summary::{OpenLoop, Round};

    #[test]
    fn an_open_loops_saturation_sits_beside_its_ending() {
        let round = |saturated, achieved, lag| Round {
            open_loop: Some(OpenLoop {
                target_rate_per_second: 50.0,
                achieved_rate_per_second: Some(achieved),
                send_lag_max_seconds: Some(lag),
                saturated,
                ..OpenLoop::default()
            }),
            ..Round::default()
        };
        assert_eq!(
            open_rounds(&[round(true, 31.5, 0.25), round(false, 49.9, 0.002)]).as_deref(),
            Some(
                "1 of 2 saturated; achieved/target req/s per round: 31.5/50, 49.9/50; worst send lag 250.0 ms"
            )
        );
        assert_eq!(
            open_rounds(&[Round::default()]),
            None,
            "a closed loop has none"
        );
    }

    use super::*;

    #[test]
    fn escapes_markup_and_quotes() {
        assert_eq!(
            esc("<a href=\"x\">&'"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"
        );
    }

    #[test]
    fn numbers_are_trimmed() {
        assert_eq!(fmt_num(Some(0.5)), "0.5");
        assert_eq!(fmt_num(Some(12.345678)), "12.3457");
        assert_eq!(fmt_num(Some(3.0)), "3");
        assert_eq!(fmt_num(None), "—");
    }
}
