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
use serde_json::{Value, json};

use crate::record::read::RowFacts;

/// One run as the report reads it.
pub(crate) struct RunInput {
    /// How the run is named in legends (its folder's name, made unique).
    pub(crate) label: String,
    pub(crate) dir: String,
    pub(crate) config: Value,
    pub(crate) summary: Value,
    /// plan.json, when the run has one (replay).
    pub(crate) plan: Option<Value>,
    pub(crate) campaign: Option<Value>,
    pub(crate) verdict: Option<Value>,
    pub(crate) facts: Vec<RowFacts>,
}

impl RunInput {
    fn is_serve(&self) -> bool {
        self.config["command"] == json!("serve")
    }
}

const SCRIPT: &str = include_str!("report.js");
const STYLE: &str = include_str!("report.css");

/// The report's HTML: provenance first, then every chart, then campaign tables.
pub(crate) fn render(runs: &[RunInput], generated_at: &str) -> String {
    let charts = charts::all(runs);
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
    h.push_str("<section id=\"provenance\">\n<h2>Provenance and denominators</h2>\n");
    h.push_str(&provenance_table(runs));
    h.push_str("</section>\n");
    for r in runs.iter().filter(|r| r.campaign.is_some()) {
        h.push_str(&campaign_tables(r));
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

/// HTML text escaping (element content and double-quoted attributes).
pub(crate) fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            _ => o.push(c),
        }
    }
    o
}

/// A JSON value as text, or `—` for null / absent.
fn text(v: &Value) -> String {
    match v {
        Value::Null => "—".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
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

/// One run's provenance: what ran, from which plan and binary, how it ended, and every
/// denominator (planned / attempted / successful, excluded phases).
fn provenance(r: &RunInput) -> Rows {
    let (c, s) = (&r.config, &r.summary);
    let mut h = Rows::new();
    row(&mut h, "run directory", &r.dir);
    row(&mut h, "run id", &text(&c["run_id"]));
    row(&mut h, "command", &text(&c["command"]));
    row(
        &mut h,
        "started / finished",
        &format!("{} / {}", text(&c["started_at"]), text(&c["finished_at"])),
    );
    row(&mut h, "ending", &text(&s["ending"]));
    row(
        &mut h,
        "binary",
        &format!(
            "{} {} (sha256 {})",
            text(&c["tool"]["name"]),
            text(&c["tool"]["version"]),
            text(&c["tool"]["binary_sha256"])
        ),
    );
    row(
        &mut h,
        "host",
        &format!(
            "{} ({} cores, {})",
            text(&c["host"]["hostname"]),
            text(&c["host"]["cpu_count"]),
            text(&c["host"]["os_release"])
        ),
    );
    if r.is_serve() {
        serve_denominators(&mut h, r);
    } else {
        replay_denominators(&mut h, r);
    }
    h
}

fn replay_denominators(h: &mut Rows, r: &RunInput) {
    let (c, s) = (&r.config, &r.summary);
    row(
        h,
        "plan",
        &format!(
            "{} (sha256 {})",
            text(&c["plan_path"]),
            text(&c["plan_sha256"])
        ),
    );
    row(h, "workload sha256", &text(&c["workload_sha256"]));
    if let Some(m) = r
        .plan
        .as_ref()
        .and_then(|p| p.get("metadata"))
        .filter(|m| !m.is_null())
    {
        row(h, "plan metadata", &m.to_string());
    }
    let evidence = r
        .campaign
        .as_ref()
        .map(|k| text(&k["evidence_class"]))
        .unwrap_or_else(|| "— (not a campaign)".into());
    row(h, "evidence class", &evidence);
    row(h, "endpoint", &text(&c["endpoint"]));
    row(h, "load", &c["effective_budget"]["load"].to_string());
    let rounds = s["rounds"].as_array().map(Vec::as_slice).unwrap_or(&[]);
    let sum = |k: &str| rounds.iter().filter_map(|x| x[k].as_u64()).sum::<u64>();
    let complete = rounds
        .iter()
        .filter(|x| x["complete"] == json!(true))
        .count();
    row(
        h,
        "requests, every phase: planned / recorded",
        &format!(
            "{} / {}",
            text(&s["planned_requests"]),
            text(&s["rows_written"])
        ),
    );
    row(
        h,
        "measured requests (rounds run): planned / attempted / successful",
        &format!(
            "{} / {} / {}",
            sum("planned_requests"),
            sum("attempted_requests"),
            sum("successful_requests")
        ),
    );
    row(
        h,
        "measured rounds: planned / run / complete",
        &format!(
            "{} / {} / {complete}",
            text(&s["planned_rounds"]),
            rounds.len()
        ),
    );
    let mut excluded = Vec::new();
    if let Some(m) = s["excluded_phases"].as_object() {
        for (phase, v) in m {
            excluded.push(format!(
                "{phase} {}/{}",
                text(&v["successful_requests"]),
                text(&v["attempted_requests"])
            ));
        }
    }
    row(
        h,
        "excluded phases (successful/attempted)",
        &excluded.join(", "),
    );
    row(
        h,
        "failures by kind (all phases)",
        &failures_text(&s["failures"]),
    );
}

fn serve_denominators(h: &mut Rows, r: &RunInput) {
    let (c, s) = (&r.config, &r.summary);
    row(h, "upstream", &text(&c["upstream"]));
    row(
        h,
        "requests: received / successful / rows written / rows dropped",
        &format!(
            "{} / {} / {} / {}",
            text(&s["requests"]),
            text(&s["successful_requests"]),
            text(&s["rows_written"]),
            text(&s["dropped_rows"])
        ),
    );
    row(h, "failures by kind", &failures_text(&s["failures"]));
}

fn failures_text(v: &Value) -> String {
    match v.as_object() {
        Some(m) if !m.is_empty() => m
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect::<Vec<_>>()
            .join(", "),
        _ => "none".into(),
    }
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
        esc(&text(&k["reference_arm"])),
        esc(&text(&k["evidence_class"])),
        esc(&text(&k["schedule"]))
    ));
    h.push_str("<table class=\"grid\" id=\"campaign-arms\">\n<tr><th>arm</th><th>lane</th><th>available</th><th>c</th><th>latency p50 ms</th><th>latency p95 ms</th><th>TTFT p50 ms</th><th>decode tok/s</th><th>aggregate tok/s</th><th>failed / attempted</th></tr>\n");
    for arm in k["arms"].as_array().map(Vec::as_slice).unwrap_or(&[]) {
        let name = format!(
            "{}{}",
            text(&arm["name"]),
            if arm["reference"] == json!(true) {
                " (reference)"
            } else {
                ""
            }
        );
        let cells = arm["concurrency"].as_object().cloned().unwrap_or_default();
        if cells.is_empty() {
            h.push_str(&format!(
                "<tr><td>{}</td><td>{}</td><td>{}</td><td colspan=\"7\">{}</td></tr>\n",
                esc(&name),
                esc(&text(&arm["lane"])),
                esc(&text(&arm["available"])),
                esc(&text(&arm["unavailable_reason"]))
            ));
        }
        for (c, cell) in cells {
            let f = |key: &str| esc(&fmt_num(&cell[key]));
            h.push_str(&format!(
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{} / {}</td></tr>\n",
                esc(&name),
                esc(&text(&arm["lane"])),
                esc(&text(&arm["available"])),
                esc(&c),
                f("latency_p50_ms"),
                f("latency_p95_ms"),
                f("ttft_p50_ms"),
                f("decode_tokens_per_sec"),
                f("aggregate_decode_tokens_per_sec"),
                f("failed_requests"),
                f("attempted_requests")
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

fn drift_table(k: &Value) -> String {
    let mut h = String::from("<h3>Drift against the reference</h3>\n");
    let drift = k["drift"].as_array().map(Vec::as_slice).unwrap_or(&[]);
    if drift.is_empty() {
        let why = k["drift_unavailable_reason"]
            .as_str()
            .unwrap_or("no arm besides the reference was available");
        h.push_str(&format!("<p>No drift: {}.</p>\n", esc(why)));
        return h;
    }
    h.push_str("<table class=\"grid\" id=\"campaign-drift\">\n<tr><th>arm</th><th>lane</th><th>compared prompts</th><th>exact match rate</th><th>mean similarity</th><th>decision flips / pairs</th><th>unpaired (reference / arm)</th></tr>\n");
    for d in drift {
        h.push_str(&format!(
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{} / {}</td><td>{} / {}</td></tr>\n",
            esc(&text(&d["arm"])),
            esc(&text(&d["lane"])),
            esc(&text(&d["compared_prompts"])),
            esc(&fmt_num(&d["exact_match_rate"])),
            esc(&fmt_num(&d["mean_similarity"])),
            esc(&text(&d["decision_flips"])),
            esc(&text(&d["decision_pairs"])),
            esc(&text(&d["unpaired_reference_answers"])),
            esc(&text(&d["unpaired_arm_answers"]))
        ));
    }
    h.push_str("</table>\n");
    h
}

fn verdict_table(v: &Value) -> String {
    let mut h = format!(
        "<h3>Verdict: <span class=\"verdict\">{}</span>{}</h3>\n<p>{}</p>\n",
        esc(&text(&v["verdict"])),
        if v["post_hoc"] == json!(true) {
            " (post hoc)"
        } else {
            ""
        },
        esc(&text(&v["verdict_reason"]))
    );
    h.push_str("<table class=\"grid\" id=\"campaign-gates\">\n<tr><th>gate</th><th>threshold</th><th>passes when</th><th>pass</th><th>per arm</th></tr>\n");
    for g in v["gates"].as_array().map(Vec::as_slice).unwrap_or(&[]) {
        let arms: Vec<String> = g["arms"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or(&[])
            .iter()
            .map(|a| {
                let note = a["note"]
                    .as_str()
                    .map(|n| format!(" ({n})"))
                    .unwrap_or_default();
                format!("{}: {}{note}", text(&a["arm"]), pass_text(&a["pass"]))
            })
            .collect();
        h.push_str(&format!(
            "<tr><td>{}</td><td>{}</td><td>{}</td><td class=\"{}\">{}</td><td>{}</td></tr>\n",
            esc(&text(&g["gate"])),
            esc(&text(&g["threshold"])),
            esc(&text(&g["passes_when"])),
            if g["pass"] == json!(true) {
                "pass"
            } else {
                "fail"
            },
            pass_text(&g["pass"]),
            esc(&arms.join("; "))
        ));
    }
    h.push_str("</table>\n");
    h
}

fn pass_text(v: &Value) -> &'static str {
    match v.as_bool() {
        Some(true) => "pass",
        Some(false) => "fail",
        None => "—",
    }
}

/// A number with at most 4 decimals, or `—`.
fn fmt_num(v: &Value) -> String {
    match v {
        Value::Number(n) if n.is_f64() => {
            let x = n.as_f64().unwrap_or(0.0);
            let s = format!("{x:.4}");
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        }
        other => text(other),
    }
}

#[cfg(test)]
mod tests {
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
        assert_eq!(fmt_num(&json!(0.5)), "0.5");
        assert_eq!(fmt_num(&json!(12.345678)), "12.3457");
        assert_eq!(fmt_num(&json!(3)), "3");
        assert_eq!(fmt_num(&Value::Null), "—");
    }
}
