//! [`FinishedRun`]: the one reader of a run folder that a command reads after the run
//! (`summarize`, `report`, `compare`, `verdict`, `freeze`): its config.json, plan.json
//! (checked against the hash config.json recorded), summary.json, campaign.json and
//! verdict, each read with its document type, into a `report::opened::OpenedRun`. A
//! sharded run's output folder (`OUT/shards/I/`, `OUT/exchanges/shard=I/`) opens as one
//! run: every shard checked (one plan, one start, none missing) and its rows moved onto
//! the shared timeline. Also the reader of input files with a size bound (a plan, a
//! contract): [`read_bounded`], [`load_plan`].
//!
//! Never writes: what a command makes of a run is the command's.

use std::path::{Path, PathBuf};

use crate::config::plan::{MAX_PLAN_BYTES, Plan};
use crate::record::rundir::{self, CAMPAIGN, CONFIG, PLAN, SUMMARY};
use crate::report::doc::config::{Command, Config};
use crate::report::doc::summary::{AnySummary, ServeSummary, Summary};
use crate::report::error::ReportError;
use crate::report::opened::{OpenedRun, Shard, optional_doc, read_doc};

/// The bytes of an input file (`what`: "plan", "contract") of at most `max` bytes; `why`
/// says what the limit is for.
pub(crate) fn read_bounded(
    path: &Path,
    max: u64,
    what: &str,
    why: &str,
) -> Result<Vec<u8>, ReportError> {
    use std::io::Read;
    let too_big = |n: String| {
        ReportError::Refused(format!(
            "{}: the {what} is {n} bytes; {what}s are limited to {} MiB ({why})",
            path.display(),
            max >> 20
        ))
    };
    if let Ok(meta) = std::fs::metadata(path)
        && meta.len() > max
    {
        return Err(too_big(meta.len().to_string()));
    }
    // Read at most the limit + 1 bytes, so a pipe or a device (`/dev/zero`, `<(...)`)
    // that reports no size is bounded too.
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(max + 1).read_to_end(&mut bytes))
        .map_err(|e| ReportError::file(path, format!("cannot read the {what}: {e}")))?;
    if bytes.len() as u64 > max {
        return Err(too_big(format!("more than {max}")));
    }
    Ok(bytes)
}

/// A plan file: its bytes and the validated plan.
pub(crate) fn load_plan(path: &Path) -> Result<(Vec<u8>, Plan), ReportError> {
    let bytes = read_bounded(
        path,
        MAX_PLAN_BYTES,
        "plan",
        "a plan describes requests; it does not carry bulk data",
    )?;
    let mut plan = Plan::from_json_bytes(&bytes).map_err(|e| ReportError::file(path, e))?;
    attach_trace(path, &mut plan)?;
    Ok((bytes, plan))
}

/// A trace plan's trace file (`load.trace.file`, beside the plan at `plan_path`): read
/// line by line, each entry resolved against the plan's cases, its SHA-256 checked
/// against the plan's pin. A bad line is named `FILE:LINE: reason`.
fn attach_trace(plan_path: &Path, plan: &mut Plan) -> Result<(), ReportError> {
    use crate::config::load::TraceSource;
    use crate::config::trace::{Trace, TraceError};
    let Some(t) = &plan.load.trace else {
        return Ok(());
    };
    let TraceSource::File { path, sha256 } = &t.source else {
        return Ok(());
    };
    let file = trace_path(plan_path, path);
    let f = std::fs::File::open(&file).map_err(|e| {
        ReportError::file(
            &file,
            format!("cannot read the plan's trace (load.trace.file): {e}"),
        )
    })?;
    let names = crate::config::trace_names(&plan.cases, t.synthetic_rules);
    let trace = Trace::read(std::io::BufReader::new(f), &names, sha256).map_err(|e| match e {
        TraceError::Line { line, fault } => {
            ReportError::Refused(format!("{}:{line}: {fault}", file.display()))
        }
        other => ReportError::file(&file, other),
    })?;
    let cases = plan.cases.len();
    plan.load.attach_trace(trace, cases);
    let why = plan.load.trace.as_ref().and_then(|t| t.window_problem());
    match why {
        Some(why) => Err(ReportError::Refused(format!(
            "{}: load.trace: {why}",
            plan_path.display()
        ))),
        None => Ok(()),
    }
}

/// Where a plan's `load.trace.file` is: relative to the plan's folder.
pub(crate) fn trace_path(plan_path: &Path, file: &str) -> PathBuf {
    plan_path
        .parent()
        .unwrap_or_else(|| Path::new("."))
        .join(file)
}

/// A finished run folder as every later command reads it: what it holds is an
/// [`OpenedRun`] (read through `Deref`), which the reports take.
#[derive(Debug)]
pub(crate) struct FinishedRun(OpenedRun);

impl std::ops::Deref for FinishedRun {
    type Target = OpenedRun;
    fn deref(&self) -> &OpenedRun {
        &self.0
    }
}

impl FinishedRun {
    /// Open `dir`: a run folder, or a sharded run's output folder. Fails when it is
    /// neither (no readable config.json, or shards that cannot be merged); the plan and
    /// the documents are read now and their problems said when a command reads them.
    pub(crate) fn open(dir: &Path) -> Result<FinishedRun, ReportError> {
        rundir::refuse_locked(dir).map_err(|e| ReportError::Refused(e.to_string()))?;
        if rundir::is_sharded(dir) {
            let shards = shard_runs(dir)?;
            let first = &shards[0];
            return Ok(FinishedRun(OpenedRun {
                dir: dir.to_path_buf(),
                config: first.config.clone(),
                plan: run_plan(&first.dir, &first.config).map(Some),
                summary: optional_doc::<Summary>(&dir.join(SUMMARY))
                    .map(|s| s.map(|s| AnySummary::Replay(Box::new(s)))),
                campaign: Ok(None),
                search: Ok(None),
                verdict: Ok(None),
                shards,
            }));
        }
        let config = run_config(dir)?;
        let (plan, summary) = match config.command {
            Command::Replay => (
                run_plan(dir, &config).map(Some),
                optional_doc::<Summary>(&dir.join(SUMMARY))
                    .map(|s| s.map(|s| AnySummary::Replay(Box::new(s)))),
            ),
            Command::Serve => (
                Ok(None),
                optional_doc::<ServeSummary>(&dir.join(SUMMARY))
                    .map(|s| s.map(|s| AnySummary::Serve(Box::new(s)))),
            ),
        };
        let verdict = match optional_doc(&dir.join(rundir::VERDICT)) {
            Ok(None) => optional_doc(&dir.join(rundir::VERDICT_POST_HOC)),
            other => other,
        };
        Ok(FinishedRun(OpenedRun {
            dir: dir.to_path_buf(),
            campaign: optional_doc(&dir.join(CAMPAIGN)),
            search: optional_doc(&dir.join(crate::record::rundir::SEARCH)),
            config,
            plan,
            summary,
            verdict,
            shards: Vec::new(),
        }))
    }
}

/// A run directory's config.json.
pub(crate) fn run_config(dir: &Path) -> Result<Config, ReportError> {
    read_doc(&dir.join(CONFIG))
        .map_err(|e| ReportError::Refused(format!("{e} (is this a run directory?)")))
}

/// A replay run's plan.json, refused unless it is the plan the run was made with (its
/// SHA-256 is config.json's `plan_sha256`).
fn run_plan(dir: &Path, config: &Config) -> Result<Plan, ReportError> {
    let path = dir.join(PLAN);
    let (bytes, plan) = load_plan(&path)?;
    let sha = rundir::sha256_hex(&bytes);
    let recorded = config.replay().map(|r| r.plan_sha256.as_str());
    if recorded != Some(sha.as_str()) {
        return Err(ReportError::Refused(format!(
            "{}: its SHA-256 ({sha}) is not config.json's plan_sha256 ({}); the plan was changed after the run",
            path.display(),
            recorded.map_or_else(|| "null".into(), |h| format!("\"{h}\""))
        )));
    }
    Ok(plan)
}

/// Every shard's folder under `OUT/shards/`, checked: one plan, one count, none missing.
fn shard_runs(dir: &Path) -> Result<Vec<Shard>, ReportError> {
    let shards = dir.join(rundir::SHARDS);
    let entries = std::fs::read_dir(&shards).map_err(|e| ReportError::file(&shards, e))?;
    let mut runs = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Ok(index) = name.parse::<usize>() else {
            continue;
        };
        let config = run_config(&e.path())?;
        let Some(shard) = config.shard().cloned() else {
            return Err(ReportError::Refused(format!(
                "{}: config.json says shard null, the folder says {index}",
                e.path().display()
            )));
        };
        if shard.index != index {
            return Err(ReportError::Refused(format!(
                "{}: config.json says shard {}, the folder says {index}",
                e.path().display(),
                shard.index
            )));
        }
        runs.push(Shard {
            index,
            dir: e.path(),
            start_at_offset_us: shard.start_at_offset_us,
            config,
        });
    }
    runs.sort_by_key(|r| r.index);
    let Some(first) = runs.first() else {
        return Err(ReportError::Refused(format!(
            "{}: no shard folder (shards/0/, shards/1/, ...) holds a config.json",
            shards.display()
        )));
    };
    let spec = |r: &Shard| {
        let s = r.config.shard();
        (
            s.map(|s| s.count),
            s.map(|s| s.start_at.clone()),
            r.config.replay().map(|x| x.plan_sha256.clone()),
        )
    };
    let (count, start_at, plan) = spec(first);
    for r in &runs {
        let (c, at, p) = spec(r);
        if p != plan {
            let show =
                |h: &Option<String>| h.as_deref().map_or("null".into(), |h| format!("\"{h}\""));
            return Err(ReportError::Refused(format!(
                "shards {} and {} ran different plans (plan_sha256 {} and {}): shards of different plans cannot be merged",
                first.index,
                r.index,
                show(&plan),
                show(&p)
            )));
        }
        if c != count || at != start_at {
            return Err(ReportError::Refused(format!(
                "shards {} and {} were started as parts of different runs (--shard I/N and --start-at differ)",
                first.index, r.index
            )));
        }
    }
    let count = count.unwrap_or(0);
    let missing: Vec<String> = (0..count)
        .filter(|k| !runs.iter().any(|r| r.index == *k))
        .map(|k| k.to_string())
        .collect();
    if !missing.is_empty() || runs.len() != count {
        return Err(ReportError::Refused(format!(
            "{}: shard(s) {} of {count} missing (no shards/I/config.json): the merge needs every shard, or its rounds would count only part of each schedule",
            dir.display(),
            missing.join(", ")
        )));
    }
    Ok(runs)
}

/// For a shard's report folder `OUT/shards/I` (its config.json names the shard): its
/// parts folder `OUT/exchanges/shard=I`; `None` for any other folder.
pub(crate) fn shard_parts(dir: &Path) -> Option<PathBuf> {
    let config = run_config(dir).ok()?;
    let index = config.shard()?.index;
    let out = dir.parent()?.parent()?;
    Some(rundir::shard_exchanges(out, index))
}
