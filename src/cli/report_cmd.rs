//! `matrix-proxy report RUN [RUN…] --out FILE`: read each run's files and write the
//! self-contained HTML report (`report::html`).

use std::path::{Path, PathBuf};

use super::io::{CliError, Exit, report_error, tool, usage};
use crate::clock;
use crate::record::rundir::{REPORT, SUMMARY, write_bytes_at};
use crate::report::html::{self, RunInput};
use crate::report::run::FinishedRun;

/// The `report` command.
pub fn report_cmd(dirs: &[PathBuf], out: Option<&Path>) -> Result<Exit, CliError> {
    let out = match (out, dirs) {
        (Some(o), _) => o.to_path_buf(),
        (None, [one]) => one.join(REPORT),
        (None, _) => {
            return Err(usage(
                "several runs need --out FILE (with one run the report goes to RUN/report.html)",
            ));
        }
    };
    let mut runs = Vec::with_capacity(dirs.len());
    for dir in dirs {
        let mut r = read_run(dir)?;
        // Legends name runs by folder; two folders of one name get #2, #3.
        let base = r.label.clone();
        let mut k = 2;
        while runs.iter().any(|o: &RunInput| o.label == r.label) {
            r.label = format!("{base} #{k}");
            k += 1;
        }
        runs.push(r);
    }
    let html = html::render(&runs, &clock::iso_utc(clock::wall_now_us()));
    write_bytes_at(&out, html.as_bytes()).map_err(|e| tool(e.to_string()))?;
    eprintln!(
        "matrix-proxy: report of {} run(s) written to {}",
        runs.len(),
        out.display()
    );
    Ok(Exit::Ok)
}

/// One run directory as the report reads it: its documents (summary.json needed) and
/// every recorded row (a sharded output folder's merged onto one timeline).
fn read_run(dir: &Path) -> Result<RunInput, CliError> {
    let label = dir
        .canonicalize()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| dir.display().to_string());
    let run = FinishedRun::open(dir).map_err(report_error)?;
    run.refuse_single_shard("report").map_err(report_error)?;
    let facts = run.facts().map_err(|e| tool(e.to_string()))?;
    let rebuild = format!(
        "run `matrix-proxy summarize {}` to rebuild it from exchanges/",
        dir.display()
    );
    let summary = match run.summary() {
        Ok(Some(s)) => s.clone(),
        Ok(None) => {
            return Err(usage(format!(
                "{}: none (a run that did not finish, or a sharded run whose shards are not merged yet); {rebuild}",
                dir.join(SUMMARY).display()
            )));
        }
        Err(e) => return Err(usage(format!("{e}; {rebuild}"))),
    };
    Ok(RunInput {
        label,
        dir: dir.display().to_string(),
        config: run.config.clone(),
        summary,
        plan_metadata: run
            .plan_if_sound()
            .map(|p| p.metadata.clone())
            .filter(|m| !m.is_empty()),
        campaign: run.campaign().map_err(report_error)?.cloned(),
        verdict: run.verdict().map_err(report_error)?.cloned(),
        facts,
    })
}
