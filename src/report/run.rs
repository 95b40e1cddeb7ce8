//! [`FinishedRun`]: the one reader of a run folder that a command reads after the run
//! (`summarize`, `report`, `compare`, `verdict`): its config.json, plan.json (checked
//! against the hash config.json recorded), summary.json, campaign.json and verdict, each
//! read with its document type, and its recorded rows. A sharded run's output folder
//! (`OUT/shards/I/`, `OUT/exchanges/shard=I/`) opens as one run: every shard checked (one
//! plan, one start, none missing) and its rows moved onto the shared timeline.
//!
//! Never writes: what a command makes of a run is the command's.

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;

use super::doc::campaign::CampaignDoc;
use super::doc::config::{Command, Config};
use super::doc::summary::{AnySummary, Ending, ServeSummary, Summary};
use super::doc::verdict::VerdictDoc;
use crate::config::plan::Plan;
use crate::config::shape::Shape;
use crate::record::read::{RowFacts, read_row_facts};
use crate::record::rundir::{self, CAMPAIGN, CONFIG, EXCHANGES, PLAN, SUMMARY};

pub(crate) use crate::config::plan::MAX_PLAN_BYTES;

/// Why a finished run (or a file of one) cannot be read or used.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum ReportError {
    /// A file that cannot be read or is not what it should be.
    #[error("{}: {cause}", path.display())]
    File { path: PathBuf, cause: String },
    /// The run is not one the command can use, with the reason and the fix.
    #[error("{0}")]
    Refused(String),
    /// The recorded rows cannot be read back.
    #[error("{0}")]
    Rows(String),
    /// The run did not finish (no summary.json): its files cannot be read as a result.
    #[error("{0}")]
    Unfinished(String),
}

impl ReportError {
    fn file(path: &Path, cause: impl std::fmt::Display) -> ReportError {
        ReportError::File {
            path: path.to_path_buf(),
            cause: cause.to_string(),
        }
    }
}

/// A JSON document of a run, read with its type.
pub(crate) fn read_doc<T: DeserializeOwned>(path: &Path) -> Result<T, ReportError> {
    let bytes = std::fs::read(path).map_err(|e| ReportError::file(path, e))?;
    serde_json::from_slice(&bytes).map_err(|e| {
        ReportError::file(
            path,
            format!("not valid JSON for a {}: {e}", file_name(path)),
        )
    })
}

/// A document that may be absent (a crashed run has no summary; a plain run no
/// campaign.json): present but unreadable is an error, not a different kind of run.
pub(crate) fn optional_doc<T: DeserializeOwned>(path: &Path) -> Result<Option<T>, ReportError> {
    if path.exists() {
        read_doc(path).map(Some)
    } else {
        Ok(None)
    }
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map_or_else(|| "file".into(), |n| n.to_string_lossy().into_owned())
}

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
    let plan = Plan::from_json_bytes(&bytes).map_err(|e| ReportError::file(path, e))?;
    Ok((bytes, plan))
}

/// One shard of a sharded run, as its report folder holds it.
#[derive(Debug)]
pub(crate) struct Shard {
    pub(crate) index: usize,
    pub(crate) dir: PathBuf,
    pub(crate) config: Config,
    /// Its microseconds from `--start-at` on its own run clock.
    pub(crate) start_at_offset_us: i64,
}

/// A document of a run as opened: absent (`None`), read, or why it cannot be used. A
/// command meets the error only when it reads that document, so `summarize` rebuilds a
/// run whose summary.json is unreadable, and `verdict` never reads a verdict.
type Doc<T> = Result<Option<T>, ReportError>;

/// A finished run folder as every later command reads it.
#[derive(Debug)]
pub(crate) struct FinishedRun {
    pub(crate) dir: PathBuf,
    /// The run's config.json (a sharded run: shard 0's).
    pub(crate) config: Config,
    /// replay's plan, the one the run was made with (serve: none).
    plan: Doc<Plan>,
    summary: Doc<AnySummary>,
    campaign: Doc<CampaignDoc>,
    /// verdict.json, else verdict.post-hoc.json.
    verdict: Doc<VerdictDoc>,
    /// Every shard of a sharded output folder, by index (empty otherwise).
    pub(crate) shards: Vec<Shard>,
}

/// A document's value, or its error (cloned: the run keeps it for the next reader).
fn doc<T>(d: &Doc<T>) -> Result<Option<&T>, ReportError> {
    match d {
        Ok(v) => Ok(v.as_ref()),
        Err(e) => Err(e.clone()),
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
            return Ok(FinishedRun {
                dir: dir.to_path_buf(),
                config: first.config.clone(),
                plan: run_plan(&first.dir, &first.config).map(Some),
                summary: optional_doc::<Summary>(&dir.join(SUMMARY))
                    .map(|s| s.map(|s| AnySummary::Replay(Box::new(s)))),
                campaign: Ok(None),
                verdict: Ok(None),
                shards,
            });
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
        Ok(FinishedRun {
            dir: dir.to_path_buf(),
            campaign: optional_doc(&dir.join(CAMPAIGN)),
            config,
            plan,
            summary,
            verdict,
            shards: Vec::new(),
        })
    }

    /// summary.json (`None`: the run wrote none, or a sharded run was not merged yet).
    pub(crate) fn summary(&self) -> Result<Option<&AnySummary>, ReportError> {
        doc(&self.summary)
    }

    /// campaign.json (`None`: not a campaign run).
    pub(crate) fn campaign(&self) -> Result<Option<&CampaignDoc>, ReportError> {
        doc(&self.campaign)
    }

    /// The verdict the run has (`None`: none).
    pub(crate) fn verdict(&self) -> Result<Option<&VerdictDoc>, ReportError> {
        doc(&self.verdict)
    }

    /// The plan, when the run has one and it is the one the run was made with (a report
    /// shows its metadata; every other use goes through [`Self::replay_plan`]).
    pub(crate) fn plan_if_sound(&self) -> Option<&Plan> {
        self.plan.as_ref().ok().and_then(Option::as_ref)
    }

    /// What the run's flags made of its plan: `--sweep` (its levels), one shard's share,
    /// or a sharded run's shards merged.
    pub(crate) fn shape(&self) -> Shape {
        if self.is_sharded() {
            return Shape::Merged {
                count: self.shards.len(),
            };
        }
        if let Some(s) = self.config.shard() {
            return Shape::Shard {
                index: s.index,
                count: s.count,
            };
        }
        match self.config.replay().and_then(|r| r.effective_budget.sweep) {
            Some(n) => Shape::Sweep(n),
            None => Shape::Plain,
        }
    }

    /// The worker's scraped metrics the reports read (`worker_metrics.parquet`; none
    /// without the file): every row of the window edges, of the interval scrapes only the
    /// series the report's lines read, as the run itself held them.
    pub(crate) fn worker_metrics(
        &self,
    ) -> Result<Vec<crate::record::scrapes::ScrapeRow>, ReportError> {
        let path = self.dir.join(rundir::WORKER_METRICS);
        if !path.exists() {
            return Ok(Vec::new());
        }
        crate::record::scrapes::read(&path, |cause, metric| {
            cause != "interval" || super::worker::read_between_edges(metric)
        })
        .map_err(ReportError::Rows)
    }

    /// The GPU's telemetry (`gpu.parquet`; none without the file).
    pub(crate) fn gpu(&self) -> Result<Vec<crate::record::gpu::GpuRow>, ReportError> {
        let path = self.dir.join(rundir::GPU);
        if !path.exists() {
            return Ok(Vec::new());
        }
        crate::record::gpu::read(&path).map_err(ReportError::Rows)
    }

    pub(crate) fn is_sharded(&self) -> bool {
        !self.shards.is_empty()
    }

    /// The replay summary (`None` for serve, or when the run wrote none).
    pub(crate) fn replay_summary(&self) -> Result<Option<&Summary>, ReportError> {
        Ok(match self.summary()? {
            Some(AnySummary::Replay(s)) => Some(s),
            _ => None,
        })
    }

    /// The plan of a replay run, refused unless it is the one the run was made with.
    pub(crate) fn replay_plan(&self) -> Result<&Plan, ReportError> {
        doc(&self.plan)?.ok_or_else(|| {
            ReportError::Refused(format!(
                "{}: not a replay run (config.json says command \"serve\")",
                self.dir.display()
            ))
        })
    }

    /// Refuse one shard's report folder (`OUT/shards/I`): its rows and rounds are only its
    /// share, so `what` (a command's name) is sent to the output folder that holds every
    /// shard.
    pub(crate) fn refuse_single_shard(&self, what: &str) -> Result<(), ReportError> {
        if !self.is_sharded() && self.config.shard().is_some() {
            return Err(ReportError::Refused(format!(
                "{}: this is one shard's report folder of a sharded run (its rows and rounds are only its share of each schedule); {what} the output folder that holds shards/ and exchanges/, which merges every shard",
                self.dir.display()
            )));
        }
        Ok(())
    }

    /// Refuse a run made with `--no-record` (`why`: what needs its recorded answers).
    pub(crate) fn refuse_unrecorded(&self, why: &str) -> Result<(), ReportError> {
        if !self.config.records_exchanges() {
            return Err(ReportError::Refused(format!(
                "{}: the run was made with --no-record, so there are no recorded answers to compare ({why})",
                self.dir.display()
            )));
        }
        Ok(())
    }

    /// The run's exchanges/ folder (of a plain run).
    pub(crate) fn exchanges(&self) -> PathBuf {
        self.dir.join(EXCHANGES)
    }

    /// Every recorded row; a sharded run's on the shared timeline (offsets in
    /// microseconds from `--start-at`).
    pub(crate) fn facts(&self) -> Result<Vec<RowFacts>, ReportError> {
        if !self.is_sharded() {
            return read_row_facts(&self.exchanges()).map_err(ReportError::Rows);
        }
        let mut facts = Vec::new();
        for s in &self.shards {
            let mut rows = read_row_facts(&rundir::shard_exchanges(&self.dir, s.index))
                .map_err(ReportError::Rows)?;
            for f in &mut rows {
                f.sample.start_offset_us -= s.start_at_offset_us;
                if let Some(o) = f.sample.scheduled_offset_us.as_mut() {
                    *o -= s.start_at_offset_us;
                }
            }
            facts.extend(rows);
        }
        Ok(facts)
    }

    /// A sharded run's ending: interrupted if any shard was (or never finished), else
    /// failed if any failed, else passed.
    pub(crate) fn shards_ending(&self) -> Ending {
        /// Only the ending of a shard's summary.json.
        #[derive(serde::Deserialize)]
        struct EndingOf {
            ending: Ending,
        }
        let endings: Vec<Option<Ending>> = self
            .shards
            .iter()
            .map(|s| {
                optional_doc::<EndingOf>(&s.dir.join(SUMMARY))
                    .ok()
                    .flatten()
                    .map(|x| x.ending)
            })
            .collect();
        if endings
            .iter()
            .any(|e| !matches!(e, Some(Ending::Passed | Ending::Failed)))
        {
            Ending::Interrupted
        } else if endings.contains(&Some(Ending::Failed)) {
            Ending::Failed
        } else {
            Ending::Passed
        }
    }

    /// When the run started, in wall-clock microseconds.
    pub(crate) fn started_at_us(&self) -> Result<i64, ReportError> {
        let s = &self.config.started_at;
        crate::clock::parse_rfc3339_us(s).map_err(|e| {
            ReportError::Refused(format!(
                "{}: config.json started_at {s:?}: {e}",
                self.dir.display()
            ))
        })
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
