//! `replay --search`'s text for the terminal: per search, every probe (its load, its
//! requests, each SLO's percentile with its bound's interval, goodput, verdict), the
//! answer and why the search stopped.

use crate::config::search::SearchKind;
use crate::search::doc::{ProbeDoc, SearchDoc, SearchRun};

/// The search's block, printed after the rounds' table.
pub(crate) fn table(doc: &SearchDoc) -> String {
    let mut t = format!(
        "\nsearch by {}: {} at {:.0} % together ({:.2} % each, Bonferroni), margin ±{}\n",
        doc.kind.as_str(),
        doc.slos.join(", "),
        doc.confidence * 100.0,
        doc.statement_confidence * 100.0,
        doc.margin
    );
    for s in &doc.searches {
        t.push_str(&run_block(doc, s));
    }
    t
}

/// `c=8` or `12.5/s`.
fn load(doc: &SearchDoc, l: f64) -> String {
    crate::search::named(doc.kind, l)
}

fn run_block(doc: &SearchDoc, s: &SearchRun) -> String {
    let arm = s
        .arm
        .as_deref()
        .map_or(String::new(), |a| format!("[{a}] "));
    let mut t = format!(
        "  {arm}case {}: {} requests per probe{}\n  {:>3}  {:<8} {:>9} {:>9}  {:<44} {:>9}  verdict\n",
        s.case,
        s.planned_requests_per_probe,
        if doc.kind == SearchKind::Concurrency {
            " (at least 10 per worker)"
        } else {
            ""
        },
        "#",
        "step",
        "load",
        "judged",
        "SLOs: estimate [lower, upper] ms",
        "goodput/s"
    );
    for p in &s.probes {
        t.push_str(&probe_line(doc, p));
    }
    match &s.answer {
        Some(a) => {
            let above = match (a.first_fail, a.saturated_at) {
                (Some(f), Some(x)) if x < f => format!(
                    "the generator saturated at {}, {} fails",
                    load(doc, x),
                    load(doc, f)
                ),
                (Some(f), _) => format!("{} fails", load(doc, f)),
                (None, Some(x)) => format!("the generator saturated at {}", load(doc, x)),
                (None, None) => "nothing above it failed".into(),
            };
            t.push_str(&format!(
                "  answer: {} ({above}); {}: {}\n",
                load(doc, a.load),
                if a.confirmed {
                    "confirmed".to_string()
                } else if a.confirmations.len() < a.confirmations_planned {
                    format!(
                        "NOT confirmed: {} of its {} repeats ran",
                        a.confirmations.len(),
                        a.confirmations_planned
                    )
                } else {
                    "NOT confirmed: a repeat disagreed".to_string()
                },
                a.confirmations.join(", ")
            ));
        }
        None => t.push_str("  answer: none\n"),
    }
    t.push_str(&format!(
        "  stopped ({}): {} ({:.1} s of probes)\n",
        s.stopped.as_str(),
        s.stopped_because,
        s.elapsed_seconds
    ));
    t
}

fn probe_line(doc: &SearchDoc, p: &ProbeDoc) -> String {
    let slos: Vec<String> = p.slos.iter().map(|s| s.bounds_text()).collect();
    let note = p
        .saturation
        .as_deref()
        .map(|s| format!(" (generator: {s})"))
        .or_else(|| p.note.as_deref().map(|n| format!(" ({n})")))
        .unwrap_or_default();
    format!(
        "  {:>3}  {:<8} {:>9} {:>9}  {:<44} {:>9}  {}{note}\n",
        p.index,
        p.step.as_str(),
        load(doc, p.load),
        format!("{}/{}", p.judged_requests, p.attempted_requests),
        slos.join("; "),
        p.goodput_per_second
            .map_or("-".into(), |g| format!("{g:.1}")),
        p.verdict.as_str()
    )
}
