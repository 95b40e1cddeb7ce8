//! `summarize OUT` of a sharded open-loop run (`replay --shard I/N --start-at UTC`): the
//! shards' rows merged into one set of rounds. Every shard must be there and must have
//! run the same plan; each shard's offsets are moved onto one timeline (microseconds
//! from `--start-at`), so a merged round is the round the unsharded schedule describes.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::{CliError, Exit, tool, usage};
use crate::record::read::{RowFacts, read_row_facts};
use crate::report::{self, Ending};

/// Whether `dir` is the output folder of a sharded run (it has `shards/`, and no
/// `config.json` of its own).
pub(crate) fn is_sharded(dir: &Path) -> bool {
    dir.join("shards").is_dir() && !dir.join("config.json").exists()
}

/// A run directory's config.json, refusing one shard's report folder (`OUT/shards/I`):
/// its rows and rounds are only its share, so `what` (a command's name) is sent to the
/// output folder that holds every shard.
pub(crate) fn whole_run_config(dir: &Path, what: &str) -> Result<Value, CliError> {
    let config = super::run_config(dir)?;
    if config["shard"].is_object() {
        return Err(usage(format!(
            "{}: this is one shard's report folder of a sharded run (its rows and rounds are only its share of each schedule); {what} the output folder that holds shards/ and exchanges/, which merges every shard",
            dir.display()
        )));
    }
    Ok(config)
}

/// For a shard's report folder `OUT/shards/I` (its config.json names the shard): its
/// parts folder `OUT/exchanges/shard=I` and its ledger; `None` for any other folder.
pub(crate) fn shard_parts(dir: &Path) -> Option<(PathBuf, PathBuf)> {
    let config = super::run_config(dir).ok()?;
    let index = config["shard"]["index"].as_u64()?;
    let out = dir.parent()?.parent()?;
    Some((
        out.join("exchanges").join(format!("shard={index}")),
        dir.join(crate::record::LEDGER),
    ))
}

/// One shard as its folders hold it.
struct ShardRun {
    index: usize,
    dir: PathBuf,
    config: Value,
}

/// Every shard's folder under `OUT/shards/`, checked: one plan, one count, none missing.
fn shard_runs(dir: &Path) -> Result<Vec<ShardRun>, CliError> {
    let shards = dir.join("shards");
    let entries =
        std::fs::read_dir(&shards).map_err(|e| usage(format!("{}: {e}", shards.display())))?;
    let mut runs = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Ok(index) = name.parse::<usize>() else {
            continue;
        };
        let config = super::run_config(&e.path())?;
        if config["shard"]["index"].as_u64() != Some(index as u64) {
            return Err(usage(format!(
                "{}: config.json says shard {}, the folder says {index}",
                e.path().display(),
                config["shard"]["index"]
            )));
        }
        runs.push(ShardRun {
            index,
            dir: e.path(),
            config,
        });
    }
    runs.sort_by_key(|r| r.index);
    let Some(first) = runs.first() else {
        return Err(usage(format!(
            "{}: no shard folder (shards/0/, shards/1/, ...) holds a config.json",
            shards.display()
        )));
    };
    let count = first.config["shard"]["count"].as_u64().unwrap_or(0) as usize;
    for r in &runs {
        if r.config["plan_sha256"] != first.config["plan_sha256"] {
            return Err(usage(format!(
                "shards {} and {} ran different plans (plan_sha256 {} and {}): shards of different plans cannot be merged",
                first.index, r.index, first.config["plan_sha256"], r.config["plan_sha256"]
            )));
        }
        if r.config["shard"]["count"].as_u64() != Some(count as u64)
            || r.config["shard"]["start_at"] != first.config["shard"]["start_at"]
        {
            return Err(usage(format!(
                "shards {} and {} were started as parts of different runs (--shard I/N and --start-at differ)",
                first.index, r.index
            )));
        }
    }
    let missing: Vec<String> = (0..count)
        .filter(|k| !runs.iter().any(|r| r.index == *k))
        .map(|k| k.to_string())
        .collect();
    if !missing.is_empty() || runs.len() != count {
        return Err(usage(format!(
            "{}: shard(s) {} of {count} missing (no shards/I/config.json): the merge needs every shard, or its rounds would count only part of each schedule",
            dir.display(),
            missing.join(", ")
        )));
    }
    Ok(runs)
}

/// A sharded output folder's rows on one timeline, the first shard's config.json and its
/// folder (which holds plan.json), for `report`.
pub(super) fn merged_facts(dir: &Path) -> Result<(Value, Vec<RowFacts>, PathBuf), CliError> {
    let runs = shard_runs(dir)?;
    let facts = merged_rows(dir, &runs)?;
    let first = runs
        .first()
        .ok_or_else(|| usage(format!("{}: no shard folder under shards/", dir.display())))?;
    Ok((first.config.clone(), facts, first.dir.clone()))
}

/// Each shard's rows, offsets moved to microseconds from `--start-at`.
fn merged_rows(dir: &Path, runs: &[ShardRun]) -> Result<Vec<RowFacts>, CliError> {
    let mut facts = Vec::new();
    for r in runs {
        let off = r.config["shard"]["start_at_offset_us"]
            .as_i64()
            .ok_or_else(|| {
                usage(format!(
                    "{}: config.json has no shard.start_at_offset_us",
                    r.dir.display()
                ))
            })?;
        let part = dir.join("exchanges").join(format!("shard={}", r.index));
        let mut rows = read_row_facts(&part).map_err(tool)?;
        for f in &mut rows {
            f.sample.start_offset_us -= off;
            if let Some(s) = f.sample.scheduled_offset_us.as_mut() {
                *s -= off;
            }
        }
        facts.extend(rows);
    }
    Ok(facts)
}

/// The shards' endings: interrupted if any was (or never finished), else failed if any
/// failed, else passed.
fn merged_ending(runs: &[ShardRun]) -> Ending {
    let endings: Vec<Option<String>> = runs
        .iter()
        .map(|r| {
            std::fs::read(r.dir.join("summary.json"))
                .ok()
                .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
                .and_then(|s| s["ending"].as_str().map(str::to_string))
        })
        .collect();
    if endings
        .iter()
        .any(|e| !matches!(e.as_deref(), Some("passed" | "failed")))
    {
        Ending::Interrupted
    } else if endings.iter().any(|e| e.as_deref() == Some("failed")) {
        Ending::Failed
    } else {
        Ending::Passed
    }
}

/// Merge the shards of `dir` into `dir/summary.json` and `dir/rounds.parquet`.
pub(crate) fn merge(dir: &Path, quiet: bool, json: bool) -> Result<Exit, CliError> {
    let runs = shard_runs(dir)?;
    let mut plan = super::run_plan(&runs[0].dir, &runs[0].config)?;
    // Every shard ran its own health check, readiness and warm-up.
    plan.preludes = runs.len() as u64;
    let facts = merged_rows(dir, &runs)?;
    let (rounds, excluded, failures) = report::rounds_from_rows(&plan, &facts);
    let ending = merged_ending(&runs);
    let aggs = report::aggregates(&plan, &rounds);
    let mut s = report::summary_json(&plan, &rounds, &aggs, &excluded, ending, failures, &[]);
    s["rows_written"] = json!(facts.len());
    s["rebuilt_from_exchanges"] = json!(true);
    s["shards"] = json!({
        "count": runs.len(),
        "start_at": runs[0].config["shard"]["start_at"],
        "run_ids": runs.iter().map(|r| r.config["run_id"].clone()).collect::<Vec<_>>(),
        "timeline": "start_offset_us and scheduled_offset_us of every shard moved to microseconds from start_at; each shard's own summary (with its generator load) is in shards/I/summary.json",
    });
    report::write_rounds_parquet(&dir.join("rounds.parquet"), &rounds).map_err(tool)?;
    super::summarize::write_and_show(dir, &s, (quiet, json), || {
        report::table(&plan, &rounds, &aggs, &excluded)
    })?;
    eprintln!(
        "matrix-proxy: merged {} shard(s): {} round(s) from {} rows in {} (ending: {})",
        runs.len(),
        rounds.len(),
        facts.len(),
        dir.display(),
        s["ending"].as_str().unwrap_or("?")
    );
    Ok(if ending == Ending::Passed {
        Exit::Ok
    } else {
        Exit::Failure
    })
}
