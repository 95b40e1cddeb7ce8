//! `matrix-proxy report RUN [RUN…] --out FILE`: read each run's files and write the
//! self-contained HTML report (`report::html`).

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::{CliError, Exit, tool, usage};
use crate::clock;
use crate::record::rundir::write_bytes_at;
use crate::report::html::{self, RunInput};

/// The `report` command.
pub fn report_cmd(dirs: &[PathBuf], out: Option<&Path>) -> Result<Exit, CliError> {
    let out = match (out, dirs) {
        (Some(o), _) => o.to_path_buf(),
        (None, [one]) => one.join("report.html"),
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

fn optional_json(path: &Path) -> Result<Option<Value>, CliError> {
    if !path.exists() {
        return Ok(None);
    }
    super::read_json(path).map(Some)
}

/// One run directory's files: config.json, summary.json (needed), plan.json,
/// campaign.json and verdict.json (when there), and every recorded row.
fn read_run(dir: &Path) -> Result<RunInput, CliError> {
    let label = dir
        .canonicalize()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| dir.display().to_string());
    let (config, facts, plan_dir) = if super::shards::is_sharded(dir) {
        super::shards::merged_facts(dir)?
    } else {
        let config = super::shards::whole_run_config(dir, "report")?;
        let facts = crate::record::read::read_row_facts(&dir.join("exchanges")).map_err(tool)?;
        (config, facts, dir.to_path_buf())
    };
    let summary = super::read_json(&dir.join("summary.json")).map_err(|e| {
        usage(format!(
            "{}; run `matrix-proxy summarize {}` to rebuild it from exchanges/",
            e.message,
            dir.display()
        ))
    })?;
    let verdict = match optional_json(&dir.join("verdict.json"))? {
        Some(v) => Some(v),
        None => optional_json(&dir.join("verdict.post-hoc.json"))?,
    };
    Ok(RunInput {
        label,
        dir: dir.display().to_string(),
        config,
        summary,
        plan: optional_json(&plan_dir.join("plan.json"))?,
        campaign: optional_json(&dir.join("campaign.json"))?,
        verdict,
        facts,
    })
}
