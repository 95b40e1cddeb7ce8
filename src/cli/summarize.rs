//! `summarize`: rebuild a run's `rounds.parquet` and `summary.json` from its recorded rows
//! (after a crash, or after `recover`), without ever making the run look better than it
//! was: a run that recorded no exchanges is refused, `ending` is never changed, the
//! originals are kept beside the new files (`summary.orig.json`, `rounds.orig.parquet`),
//! and what the rows cannot hold (the generator's load, measured live) is carried over
//! from the originals. The output folder of a sharded run is merged instead
//! ([`super::shards`]).

use std::path::Path;

use serde_json::{Value, json};

use super::{CliError, Exit, tool, usage};
use crate::record::read::RowFacts;
use crate::record::rundir::RunDir;
use crate::report::{self, Ending, ServeStats};

/// The originals a rebuild keeps, each beside its replacement.
const ORIGINALS: [(&str, &str); 2] = [
    ("summary.json", "summary.orig.json"),
    ("rounds.parquet", "rounds.orig.parquet"),
];

/// The `summarize` command.
pub fn summarize_cmd(dir: &Path, quiet: bool, json: bool) -> Result<Exit, CliError> {
    if super::shards::is_sharded(dir) {
        return super::shards::merge(dir, quiet, json);
    }
    let config = super::shards::whole_run_config(dir, "summarize")?;
    let facts = crate::record::read::read_row_facts(&dir.join("exchanges")).map_err(tool)?;
    if facts.is_empty() {
        let why = if config["extra"]["recording"]["exchanges"] == json!(false) {
            "the run was made with --no-record"
        } else {
            "no closed part of exchanges/ holds a row"
        };
        return Err(usage(format!(
            "{}: no exchanges were recorded ({why}), so there is nothing to rebuild from; the run's own reports are left as they are",
            dir.display()
        )));
    }
    // What the run itself wrote, if it got that far (a crashed run has none): the kept
    // original when an earlier summarize made one, else summary.json unless it is itself
    // a rebuild.
    let read = |name: &str| -> Option<Value> {
        std::fs::read(dir.join(name))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
    };
    let original: Option<Value> = read("summary.orig.json")
        .or_else(|| read("summary.json").filter(|s| s["rebuilt_from_exchanges"] != json!(true)));
    let finished = config["finished_at"].is_string();
    match config["command"].as_str() {
        Some("replay") => replay(
            dir,
            &config,
            &facts,
            original.as_ref(),
            finished,
            (quiet, json),
        ),
        Some("serve") => serve(dir, &facts, original.as_ref(), finished, json),
        other => Err(usage(format!(
            "{}: command {other:?} is not replay or serve; is this a matrix-proxy run directory?",
            dir.join("config.json").display()
        ))),
    }
}

/// Copy each original report beside its replacement, once, and only the run's own: a
/// second `summarize` keeps the run's files, never the first rebuild's (after a crash
/// there is no original, and none is made up).
fn keep_originals(dir: &Path) -> Result<(), CliError> {
    let summary_is_rebuilt = std::fs::read(dir.join("summary.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
        .is_some_and(|s| s["rebuilt_from_exchanges"] == json!(true));
    if summary_is_rebuilt {
        return Ok(());
    }
    for (name, orig) in ORIGINALS {
        let (from, to) = (dir.join(name), dir.join(orig));
        if from.is_file() && !to.exists() {
            std::fs::copy(&from, &to).map_err(|e| {
                tool(format!(
                    "cannot keep the original {} as {}: {e}",
                    from.display(),
                    to.display()
                ))
            })?;
        }
    }
    Ok(())
}

/// The run's own ending when it wrote one; else interrupted (it never finished), failed
/// or passed by its rows.
fn replay_ending(original: Option<&Value>, finished: bool, failures: u64) -> Ending {
    match original.and_then(|s| s["ending"].as_str()) {
        Some("passed") => Ending::Passed,
        Some("failed") => Ending::Failed,
        Some("interrupted") => Ending::Interrupted,
        _ if !finished => Ending::Interrupted,
        _ if failures > 0 => Ending::Failed,
        _ => Ending::Passed,
    }
}

fn replay(
    dir: &Path,
    config: &Value,
    facts: &[RowFacts],
    original: Option<&Value>,
    finished: bool,
    (quiet, json): (bool, bool),
) -> Result<Exit, CliError> {
    let plan = super::run_plan(dir, config)?;
    // A campaign's campaign.json needs what the rows do not hold (memory samples, load
    // times): it is left as the run wrote it; rounds and the summary are rebuilt per arm.
    let (mut rounds, excluded, failures) = report::rounds_from_rows(&plan, facts);
    if let Some(o) = original {
        report::rebuild::carry_generator(&mut rounds, o);
    }
    let ending = replay_ending(original, finished, failures);
    let aggs = report::aggregates(&plan, &rounds);
    // What the sweep noted as it placed its rates is not in the rows: kept as written.
    let notes: Vec<String> = original
        .and_then(|o| o["load"]["notes"].as_array())
        .map(|n| {
            n.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let mut s = report::summary_json(&plan, &rounds, &aggs, &excluded, ending, failures, &notes);
    s["rows_written"] = json!(facts.len());
    s["rebuilt_from_exchanges"] = json!(true);
    keep_originals(dir)?;
    report::write_rounds_parquet(&dir.join("rounds.parquet"), &rounds).map_err(tool)?;
    write_and_show(dir, &s, (quiet, json), || {
        report::table(&plan, &rounds, &aggs, &excluded)
    })?;
    eprintln!(
        "matrix-proxy: rebuilt {} round(s) from {} rows in {} (ending kept: {}){}",
        rounds.len(),
        facts.len(),
        dir.display(),
        s["ending"].as_str().unwrap_or("?"),
        if finished {
            ""
        } else {
            " (the run did not finish: its rounds may be partial)"
        }
    );
    // The exit says how the run went (0 only for a pass), not how summarize went.
    Ok(if ending == Ending::Passed {
        Exit::Ok
    } else {
        Exit::Failure
    })
}

/// Write a rebuilt or merged summary.json, then show it: the same bytes with `--json`,
/// else the table (`table()`) unless `--quiet`.
pub(super) fn write_and_show(
    dir: &Path,
    s: &Value,
    (quiet, json): (bool, bool),
    table: impl FnOnce() -> String,
) -> Result<(), CliError> {
    RunDir::existing(dir)
        .write_json("summary.json", s)
        .map_err(|e| tool(e.to_string()))?;
    if json {
        super::print_json(s, dir).map_err(tool)?;
    } else if !quiet {
        super::print_stdout(&table(), "the table", dir).map_err(tool)?;
    }
    Ok(())
}

fn serve(
    dir: &Path,
    facts: &[RowFacts],
    original: Option<&Value>,
    finished: bool,
    json: bool,
) -> Result<Exit, CliError> {
    let mut stats = ServeStats::default();
    let mut table = report::routes::RouteTable::default();
    for f in facts {
        stats.requests += 1;
        *stats.by_outcome.entry(f.sample.outcome).or_insert(0) += 1;
        table.add(&f.method, &f.url, f.status, f.sample.clone());
    }
    (stats.routes, stats.ok_total) = table.finish();
    stats.dropped_rows = original
        .and_then(|p| p["dropped_rows"].as_u64())
        .unwrap_or(0);
    // Only the live run measured its recorder; a crashed run's is unknown (null).
    let slice = original.and_then(|p| p["recorder_longest_slice_us"].as_u64());
    let mut s = report::serve_summary_json(&stats, facts.len() as u64, slice);
    s["rebuilt_from_exchanges"] = json!(true);
    s["ending"] = match original.and_then(|o| o.get("ending")) {
        Some(e) => e.clone(),
        None if finished => json!("stopped"),
        None => json!("crashed"),
    };
    keep_originals(dir)?;
    // serve has no table: the JSON with --json, else nothing on stdout.
    write_and_show(dir, &s, (true, json), String::new)?;
    eprintln!(
        "matrix-proxy: rebuilt the summary of {} rows in {} (ending kept: {})",
        facts.len(),
        dir.display(),
        s["ending"].as_str().unwrap_or("?")
    );
    let all_ok = stats.requests
        == stats
            .by_outcome
            .get(&crate::model::Outcome::Ok)
            .copied()
            .unwrap_or(0);
    Ok(if all_ok && s["ending"] == json!("stopped") {
        Exit::Ok
    } else {
        Exit::Failure
    })
}
