//! `summarize`: rebuild a run's `rounds.parquet` and `summary.json` from its recorded rows
//! (after a crash, or after `recover`), without ever making the run look better than it
//! was: a run that recorded no exchanges is refused, `ending` is never changed, the
//! originals are kept beside the new files (`summary.orig.json`, `rounds.orig.parquet`),
//! and what the rows cannot hold (the generator's load, measured live) is carried over
//! from the originals (`report::rebuild`). The output folder of a sharded run is merged
//! instead: every shard's rows on one timeline.

use std::path::Path;

use super::io::{CliError, Exit, print_json, print_stdout, report_error, run_error, tool, usage};
use crate::record::rundir::{ROUNDS, ROUNDS_ORIG, RunDir, SUMMARY, SUMMARY_ORIG};
use crate::report::doc::config::Command;
use crate::report::doc::summary::{ServeEnding, ServeSummary, Summary};
use crate::report::rebuild::{self, Rebuilt};
use crate::report::{self, Ending};
use crate::run::open::FinishedRun;

/// The originals a rebuild keeps, each beside its replacement.
const ORIGINALS: [(&str, &str); 2] = [(SUMMARY, SUMMARY_ORIG), (ROUNDS, ROUNDS_ORIG)];

/// The `summarize` command.
pub fn summarize_cmd(dir: &Path, quiet: bool, json: bool) -> Result<Exit, CliError> {
    // Its own summary is read apart (an unreadable one is no original, not an error).
    let run = FinishedRun::open(dir).map_err(report_error)?;
    run.refuse_single_shard("summarize").map_err(report_error)?;
    let facts = run.facts().map_err(|e| tool(e.to_string()))?;
    if run.is_sharded() {
        let merged = rebuild::merge_shards(&run, &facts).map_err(report_error)?;
        write_rounds(dir, &merged)?;
        let ending = merged.summary.ending;
        write_and_show(dir, &merged.summary, Show { quiet, json }, || {
            merged.table.clone()
        })?;
        eprintln!(
            "matrix-proxy: merged {} shard(s): {} round(s) from {} rows in {} (ending: {})",
            run.shards.len(),
            merged.rounds.len(),
            facts.len(),
            dir.display(),
            ending.as_str()
        );
        return Ok(exit_of(ending));
    }
    if facts.is_empty() {
        let why = if !run.config.records_exchanges() {
            "the run was made with --no-record"
        } else {
            "no closed part of exchanges/ holds a row"
        };
        return Err(usage(format!(
            "{}: no exchanges were recorded ({why}), so there is nothing to rebuild from; the run's own reports are left as they are",
            dir.display()
        )));
    }
    let finished = run.config.finished_at.is_some();
    match run.config.command {
        Command::Replay => {
            refuse_search(&run, dir)?;
            let original: Option<Summary> = rebuild::original_summary(dir);
            let plan = run.replay_plan().map_err(report_error)?;
            let tokens = crate::run::finish::prompt_tokens_of_run(&run, plan).map_err(run_error)?;
            let r = rebuild::rebuild_replay(
                plan,
                run.shape(),
                &facts,
                original.as_ref(),
                (finished, tokens),
            );
            keep_originals(dir)?;
            write_rounds(dir, &r)?;
            let ending = r.summary.ending;
            write_and_show(dir, &r.summary, Show { quiet, json }, || r.table.clone())?;
            eprintln!(
                "matrix-proxy: rebuilt {} round(s) from {} rows in {} (ending kept: {}){}",
                r.rounds.len(),
                facts.len(),
                dir.display(),
                ending.as_str(),
                if finished {
                    ""
                } else {
                    " (the run did not finish: its rounds may be partial)"
                }
            );
            // The exit says how the run went (0 only for a pass), not how summarize went.
            Ok(exit_of(ending))
        }
        Command::Serve => {
            let original: Option<ServeSummary> = rebuild::original_summary(dir);
            let (s, all_ok) = rebuild::rebuild_serve(&facts, original.as_ref(), finished);
            keep_originals(dir)?;
            // serve has no table: the JSON with --json, else nothing on stdout.
            write_and_show(dir, &s, Show { quiet: true, json }, String::new)?;
            eprintln!(
                "matrix-proxy: rebuilt the summary of {} rows in {} (ending kept: {})",
                facts.len(),
                dir.display(),
                s.ending.as_str()
            );
            Ok(if all_ok && s.ending == ServeEnding::Stopped {
                Exit::Ok
            } else {
                Exit::Failure
            })
        }
    }
}

fn exit_of(ending: Ending) -> Exit {
    if ending == Ending::Passed {
        Exit::Ok
    } else {
        Exit::Failure
    }
}

fn write_rounds(dir: &Path, r: &Rebuilt) -> Result<(), CliError> {
    report::write_rounds_parquet(&dir.join(ROUNDS), &r.rounds).map_err(|e| tool(e.to_string()))
}

/// Copy each original report beside its replacement, once, and only the run's own: a
/// second `summarize` keeps the run's files, never the first rebuild's (after a crash
/// there is no original, and none is made up).
fn keep_originals(dir: &Path) -> Result<(), CliError> {
    if rebuild::is_rebuilt(&dir.join(SUMMARY)) {
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

/// What `summarize` shows on stdout: `--quiet`, `--json`.
#[derive(Debug, Clone, Copy)]
struct Show {
    quiet: bool,
    json: bool,
}

/// Write a rebuilt or merged summary.json, then show it: the same bytes with `--json`,
/// else the table (`table()`) unless `--quiet`.
fn write_and_show<T: serde::Serialize>(
    dir: &Path,
    s: &T,
    show: Show,
    table: impl FnOnce() -> String,
) -> Result<(), CliError> {
    RunDir::existing(dir)
        .write_json(SUMMARY, s)
        .map_err(|e| tool(e.to_string()))?;
    if show.json {
        print_json(s, dir).map_err(tool)?;
    } else if !show.quiet {
        print_stdout(&table(), "the table", dir).map_err(tool)?;
    }
    Ok(())
}

/// A `--search` run's summary is not rebuilt: its probes were planned as it went.
fn refuse_search(run: &crate::run::open::FinishedRun, dir: &Path) -> Result<(), CliError> {
    if run.shape().search_kind().is_none() {
        return Ok(());
    }
    Err(usage(format!(
        "{}: a --search run plans each probe as it goes (search.json holds them), so its summary cannot be rebuilt from the rows alone; its own summary.json, search.json and rounds.parquet are left as they are",
        dir.display()
    )))
}
