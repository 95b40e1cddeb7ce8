//! `matrix-proxy report RUN [RUN…] --out FILE`: read each run's files and write the
//! self-contained HTML report (`report::html`).

use std::path::{Path, PathBuf};

use super::io::{CliError, Exit, report_error, tool, usage};
use crate::clock;
use crate::record::rundir::{REPORT, SUMMARY, write_bytes_at};
use crate::report::html::{self, RunInput};
use crate::run::open::FinishedRun;

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
    if dirs.len() > WIDE_REPORT_RUNS {
        eprintln!(
            "matrix-proxy: warning: {} runs in one report: its provenance table has a column per run and gets wide past about {WIDE_REPORT_RUNS}",
            dirs.len()
        );
    }
    let mut runs = Vec::with_capacity(dirs.len());
    for (dir, label) in dirs.iter().zip(folder_labels(dirs)) {
        let mut r = read_run(dir)?;
        r.label = label;
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

/// Runs past which the report's provenance table (a column per run) gets wide.
const WIDE_REPORT_RUNS: usize = 12;

/// Legends name runs by folder: its name, or, where two runs' folders share a name, as many
/// of its parent folders as tell them apart (`a/demo`, `b/demo`); the same folder given
/// twice gets `#2`.
fn folder_labels(dirs: &[PathBuf]) -> Vec<String> {
    let parts: Vec<Vec<String>> = dirs
        .iter()
        .map(|d| {
            let p = d.canonicalize().unwrap_or_else(|_| d.clone());
            let names = p.components().rev().filter_map(|c| match c {
                std::path::Component::Normal(n) => Some(n.to_string_lossy().into_owned()),
                _ => None,
            });
            names.collect()
        })
        .collect();
    let label = |i: usize, depth: usize| {
        let mut v: Vec<&str> = parts[i].iter().take(depth).map(String::as_str).collect();
        v.reverse();
        v.join("/")
    };
    let mut out: Vec<String> = Vec::with_capacity(dirs.len());
    for i in 0..parts.len() {
        let depth = (1..=parts[i].len().max(1))
            .find(|&d| {
                (0..parts.len())
                    .all(|j| j == i || parts[j] == parts[i] || label(j, d) != label(i, d))
            })
            .unwrap_or(parts[i].len().max(1));
        let base = match label(i, depth) {
            l if l.is_empty() => dirs[i].display().to_string(),
            l => l,
        };
        let mut l = base.clone();
        let mut k = 2;
        while out.contains(&l) {
            l = format!("{base} #{k}");
            k += 1;
        }
        out.push(l);
    }
    out
}

/// One run directory as the report reads it: its documents (summary.json needed) and
/// every recorded row (a sharded output folder's merged onto one timeline).
fn read_run(dir: &Path) -> Result<RunInput, CliError> {
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
        label: String::new(),
        dir: dir.display().to_string(),
        config: run.config.clone(),
        summary,
        plan_metadata: run
            .plan_if_sound()
            .map(|p| p.metadata.clone())
            .filter(|m| !m.is_empty()),
        campaign: run.campaign().map_err(report_error)?.cloned(),
        verdict: run.verdict().map_err(report_error)?.cloned(),
        search: run.search().map_err(report_error)?.cloned(),
        worker: run.worker_metrics().map_err(report_error)?,
        gpu: run.gpu().map_err(report_error)?,
        facts,
    })
}

#[cfg(test)]
mod tests {
    use super::folder_labels;

    #[test]
    fn runs_are_labelled_by_folder_and_told_apart_by_their_parents() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = |p: &str| {
            let d = tmp.path().join(p);
            std::fs::create_dir_all(&d).unwrap();
            d
        };
        let (a, b, c) = (dir("x/a/demo"), dir("x/b/demo"), dir("x/c/other"));
        assert_eq!(
            folder_labels(&[a.clone(), b.clone(), c.clone()]),
            ["a/demo", "b/demo", "other"]
        );
        // The same folder twice (one path written two ways).
        let again = tmp.path().join("x/a/../a/demo");
        assert_eq!(folder_labels(&[a, again, c]), ["demo", "demo #2", "other"]);
    }
}
