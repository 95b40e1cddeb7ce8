//! A `--search` run's charts, from search.json: each SLO's percentile against load (every
//! probe's estimate with its bound's interval as a bar, the SLO's bound as a line, the
//! answer as a vertical line), and goodput against load. Kind `search`: per series
//! `points` = `[[load, value, lower, upper], …]` (`lower`/`upper` null where the bound has
//! none), `lines` = `[{label, y}]`, `knee` = the answer (null: none). Imports nothing else
//! from `html/` but the chart type and the run.

use serde_json::{Value, json};

use super::charts::Chart;
use super::input::RunInput;
use crate::config::search::SearchKind;
use crate::search::doc::{SearchDoc, SearchRun};

const SCOPE: &str = "search.json: every probe of the search (bracket, bisect, extension, confirmation) at its load; a percentile's bar is its distribution-free bound (the order statistics at ranks n p ∓ z √(n p (1 − p))), the dashed line its SLO, the vertical line the answer (the highest load that passed); an extension's point pools both runs of its load";

/// Every search chart of `runs`.
pub(super) fn charts(runs: &[RunInput]) -> Vec<Chart> {
    let mut out = Vec::new();
    for (i, r) in runs.iter().enumerate() {
        let Some(doc) = &r.search else { continue };
        for (k, s) in doc.searches.iter().enumerate() {
            let id = format!("search-{i}-{k}");
            out.push(latency_chart(r, doc, s, &id));
            out.push(goodput_chart(r, doc, s, &id));
        }
    }
    out
}

fn x_label(doc: &SearchDoc) -> &'static str {
    match doc.kind {
        SearchKind::Rate => "target rate (requests/s)",
        SearchKind::Concurrency => "concurrency",
    }
}

fn whose(r: &RunInput, s: &SearchRun) -> String {
    let arm = s
        .arm
        .as_deref()
        .map_or(String::new(), |a| format!(" [{a}]"));
    format!("{}{arm} {}", r.label, s.case)
}

fn latency_chart(r: &RunInput, doc: &SearchDoc, s: &SearchRun, id: &str) -> Chart {
    let mut c = Chart::new(
        format!("{id}-latency"),
        "search",
        format!("search: SLO percentiles vs load — {}", whose(r, s)),
        SCOPE,
        (x_label(doc), "ms"),
    );
    let mut lines = Vec::new();
    for (k, slo) in doc.slos.iter().enumerate() {
        let points: Vec<Value> = s
            .probes
            .iter()
            .filter_map(|p| {
                let b = p.slos.get(k)?;
                Some(json!([p.load, b.estimate_ms, b.lower_ms, b.upper_ms]))
            })
            .collect();
        let bound = s
            .probes
            .iter()
            .find_map(|p| p.slos.get(k).map(|b| b.bound_ms));
        if let Some(y) = bound {
            lines.push(json!({"label": slo, "y": y}));
        }
        c.push(
            json!({"name": slo, "run": r.label, "arm": s.arm, "case": s.case, "points": points}),
        );
    }
    c.set("lines", json!(lines));
    c.set("knee", json!(s.answer.as_ref().map(|a| a.load)));
    c
}

fn goodput_chart(r: &RunInput, doc: &SearchDoc, s: &SearchRun, id: &str) -> Chart {
    let mut c = Chart::new(
        format!("{id}-goodput"),
        "search",
        format!("search: goodput vs load — {}", whose(r, s)),
        SCOPE,
        (x_label(doc), "good requests/s"),
    );
    let points: Vec<Value> = s
        .probes
        .iter()
        .filter_map(|p| Some(json!([p.load, p.goodput_per_second?, null, null])))
        .collect();
    c.push(
        json!({"name": "goodput", "run": r.label, "arm": s.arm, "case": s.case, "points": points}),
    );
    c.set("lines", json!([]));
    c.set("knee", json!(s.answer.as_ref().map(|a| a.load)));
    c
}
