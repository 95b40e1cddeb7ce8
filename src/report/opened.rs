//! [`OpenedRun`]: the pieces of a finished run that the reports read (config.json, the
//! plan, summary.json, campaign.json, the verdict, each with its document type, the
//! shards of a sharded output folder) and its recorded rows read back. `run::open` opens
//! a folder into one; `rebuild`, `compare` and `freeze` read it.
//!
//! Never writes: what a command makes of a run is the command's.

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;

use super::doc::campaign::CampaignDoc;
use super::doc::config::Config;
use super::doc::summary::{AnySummary, Ending, Summary};
use super::doc::verdict::VerdictDoc;
use super::error::ReportError;
use crate::config::plan::Plan;
use crate::config::shape::Shape;
use crate::record::read::{RowFacts, read_row_facts};
use crate::record::rundir::{self, EXCHANGES, SUMMARY};

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
pub(crate) type Doc<T> = Result<Option<T>, ReportError>;

/// A finished run as opened (`run::open::FinishedRun` opens it): its folder, config.json,
/// its documents each read or why not, and its shards. What it holds is read here; how a
/// folder is opened and checked is `run::open`'s.
#[derive(Debug)]
pub(crate) struct OpenedRun {
    pub(crate) dir: PathBuf,
    /// The run's config.json (a sharded run: shard 0's).
    pub(crate) config: Config,
    /// replay's plan, the one the run was made with (serve: none).
    pub(crate) plan: Doc<Plan>,
    pub(crate) summary: Doc<AnySummary>,
    pub(crate) campaign: Doc<CampaignDoc>,
    /// search.json (`replay --search`).
    pub(crate) search: Doc<crate::search::doc::SearchDoc>,
    /// verdict.json, else verdict.post-hoc.json.
    pub(crate) verdict: Doc<VerdictDoc>,
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

impl OpenedRun {
    /// summary.json (`None`: the run wrote none, or a sharded run was not merged yet).
    pub(crate) fn summary(&self) -> Result<Option<&AnySummary>, ReportError> {
        doc(&self.summary)
    }

    /// search.json (`None`: not a `--search` run).
    pub(crate) fn search(&self) -> Result<Option<&crate::search::doc::SearchDoc>, ReportError> {
        doc(&self.search)
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
        let budget = self.config.replay().map(|r| &r.effective_budget);
        if let Some(kind) = budget
            .and_then(|b| b.search.as_ref())
            .and_then(|s| crate::config::search::SearchKind::parse(&s.kind).ok())
        {
            return Shape::Search(kind);
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
