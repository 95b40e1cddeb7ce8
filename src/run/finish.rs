//! A finished run's documents: summary.json, rounds.parquet, campaign.json and
//! verdict.json built by `report` from what the run measured and recorded, each written
//! even if an earlier one failed, so nothing is lost. The evidence read back from
//! `exchanges/` after the rounds (prompt tokens, drift, intervals) is read in one place
//! ([`read_evidence`]), and a verdict is decided in one place ([`decide`]), for replay,
//! `verdict RUN` and `summarize` alike. Returns what the command prints; prints nothing
//! but the warnings a verdict carries.

use std::path::{Path, PathBuf};

use super::open::FinishedRun;
use super::{RunEnd, RunError};
use crate::config::contract::Contract;
use crate::config::plan::Plan;
use crate::config::shape::Shape;
use crate::drivers::RecordingEnd;
use crate::drivers::replay::ReplayResult;
use crate::record::rundir::{self, RunDir};
use crate::report::doc::campaign::CampaignDoc;
use crate::report::doc::config::Config;
use crate::report::doc::summary::{PromptTokensMismatch, Summary};
use crate::report::doc::verdict::VerdictDoc;
use crate::report::evidence::{EvidenceError, Wants};
use crate::report::verdict::Provenance;
use crate::report::{self, Ending, Recording, config_json};
use crate::search::doc::SearchDoc;

/// What is read back from a run's `exchanges/` after its rounds.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Wanted {
    /// The plan's input token counts against the server's (summary.json).
    pub(crate) prompt_tokens: bool,
    /// Drift from the recorded answers into campaign.json.
    pub(crate) drift: bool,
    /// The ratio gates' intervals into campaign.json (read only when drift, if wanted,
    /// could be read).
    pub(crate) intervals: bool,
}

/// What [`read_evidence`] read: each part that was wanted, or why it could not be read.
#[derive(Debug, Default)]
pub(crate) struct Evidence {
    pub(crate) prompt_tokens: Option<Result<Option<PromptTokensMismatch>, EvidenceError>>,
    pub(crate) drift: Option<Result<(), EvidenceError>>,
    pub(crate) intervals: Option<Result<(), EvidenceError>>,
}

/// Every read of `exchanges/` after a run's rounds, in one place and one pass over its
/// parts ([`report::evidence::Evidence`]): the prompt tokens, then the drift and the
/// intervals into `campaign` (when there is one).
pub(crate) fn read_evidence(
    exchanges: &Path,
    plan: &Plan,
    mut campaign: Option<&mut CampaignDoc>,
    want: Wanted,
) -> Evidence {
    let wants = Wants {
        prompt_tokens: want.prompt_tokens,
        answers: want.drift && campaign.is_some(),
        rounds: want.intervals && campaign.is_some(),
    };
    let mut read = report::evidence::Evidence::read(&[exchanges.to_path_buf()], plan, wants);
    let prompt_tokens = want
        .prompt_tokens
        .then(|| report::prompt_tokens_mismatch(plan, &mut read));
    let drift = match campaign.as_deref_mut() {
        Some(c) if want.drift => Some(report::answers::add_drift(c, &mut read, plan)),
        _ => None,
    };
    let intervals = match campaign {
        Some(c) if want.intervals && drift.as_ref().is_none_or(Result::is_ok) => {
            Some(report::intervals::add_intervals(c, &mut read))
        }
        _ => None,
    };
    Evidence {
        prompt_tokens,
        drift,
        intervals,
    }
}

/// Why no verdict is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NoVerdict {
    /// Without drift every quality gate would fail for want of it: no verdict rather than
    /// a wrong one; `matrix-proxy verdict` can evaluate once drift can be read.
    NoDrift,
}

/// The one place a verdict is decided: the contract's gates on `campaign`, never without
/// drift (`drift_read`: the campaign's drift could be read).
pub(crate) fn decide(
    campaign: &CampaignDoc,
    drift_read: bool,
    provenance: &Provenance<'_>,
) -> Result<VerdictDoc, NoVerdict> {
    if !drift_read {
        return Err(NoVerdict::NoDrift);
    }
    Ok(report::verdict::verdict_doc(campaign, provenance))
}

/// The contract a replay run was started with (`--contract`) and its path.
#[derive(Debug)]
pub(crate) struct ContractInput {
    pub(crate) contract: Contract,
    pub(crate) path: PathBuf,
}

/// What the replay run measured and gathered, handed to [`replay_documents`].
pub(crate) struct Measured {
    pub(crate) result: ReplayResult,
    pub(crate) scraped: super::scrape::WorkerScrapes,
    pub(crate) recording: RecordingEnd,
}

/// What a replay run's documents are built from besides its measurements.
pub(crate) struct RunFacts<'a> {
    pub(crate) dir: &'a RunDir,
    pub(crate) plan: &'a Plan,
    pub(crate) shape: Shape,
    pub(crate) contract: Option<&'a ContractInput>,
    /// `--search`'s question (search.json).
    pub(crate) search: Option<&'a crate::config::search::SearchSpec>,
    /// Rows were recorded (not `--no-record`).
    pub(crate) record_exchanges: bool,
    /// The command prints the table (not `--quiet`, not `--json`).
    pub(crate) table: bool,
}

/// A finished replay run as the command shows it: how it ended, its summary (`--json`),
/// the table and the campaign's text, the verdict, the rows written, the first failure,
/// and the problems met while writing (the recorder's first).
#[derive(Debug)]
pub(crate) struct ReplayEnd {
    pub(crate) end: RunEnd,
    pub(crate) dir: PathBuf,
    pub(crate) summary: Summary,
    /// The table and the campaign's text, when the command prints the table.
    pub(crate) table: Option<String>,
    /// The verdict decided (`accept`, `reject`, ...), when one was.
    pub(crate) verdict: Option<String>,
    pub(crate) rows: u64,
    pub(crate) first_failure: Option<String>,
    pub(crate) problems: Vec<String>,
}

/// A replay run's documents, each written even if an earlier one failed: rounds.parquet,
/// summary.json, campaign.json and the verdict, config.json finished.
pub(crate) fn replay_documents(
    facts: &RunFacts<'_>,
    config: &mut Config,
    measured: Measured,
) -> ReplayEnd {
    let Measured {
        result,
        scraped,
        recording,
    } = measured;
    let (dir, plan, shape) = (facts.dir, facts.plan, facts.shape);
    let mut problems = Vec::new();
    let worker = &scraped.rows[..];
    if let Err(e) = report::write_rounds_parquet(&dir.path.join(rundir::ROUNDS), &result.rounds) {
        problems.push(format!("rounds.parquet: {e}"));
    }
    let record_error = recording.problems.first();
    // A run whose rows could not all be written did not pass, whatever its exchanges did.
    let ending = match result.ending {
        Ending::Passed if record_error.is_some() => Ending::Failed,
        other => other,
    };
    let search = write_search(facts, &result, &mut problems);
    let mut campaign = campaign_doc(plan, &result, &scraped);
    if let (Some(c), Some(doc)) = (campaign.as_mut(), &search) {
        c.operating_points = report::campaign::operating_points(doc);
    }
    let recorded = facts.record_exchanges && record_error.is_none();
    let want = Wanted {
        prompt_tokens: recorded,
        drift: facts.record_exchanges,
        intervals: facts.record_exchanges,
    };
    let mut evidence = read_evidence(&dir.exchanges(), plan, campaign.as_mut(), want);
    let prompt_tokens_mismatch =
        prompt_tokens_or_problem(evidence.prompt_tokens.take(), &mut problems);
    let aggregates = report::aggregates(plan, shape, &result.rounds);
    let summary = report::summary(
        plan,
        &report::Measured {
            shape,
            rounds: &result.rounds,
            aggregates: &aggregates,
            excluded: &result.excluded,
            ending,
            failures: result.failures,
            notes: &result.notes,
            worker,
            search_unfinished: search.as_ref().is_some_and(SearchDoc::unfinished),
        },
        Recording {
            worker_metrics_limits: scraped.limits.clone(),
            worker_metrics_scrapes: scraped.health.clone(),
            ..recording_doc(facts.record_exchanges, &recording, prompt_tokens_mismatch)
        },
    );
    if let Err(e) = dir.write_json(rundir::SUMMARY, &summary) {
        problems.push(e.to_string());
    }
    let mut reported = CampaignReported::default();
    if let Some(c) = campaign {
        let run = CampaignRun {
            facts,
            config,
            ending: summary.ending,
        };
        reported = campaign_reports(&run, c, evidence, &mut problems);
    }
    config_json::finished(config);
    if let Err(e) = dir.write_json(rundir::CONFIG, config) {
        problems.push(e.to_string());
    }
    let table = facts.table.then(|| {
        let rounds = report::table(plan, &result.rounds, &aggregates, &result.excluded);
        rounds + &search_text(search.as_ref()) + &reported.text
    });
    if let Some(e) = record_error {
        problems.insert(0, e.to_string());
    }
    ReplayEnd {
        end: ending.into(),
        dir: dir.path.clone(),
        summary,
        table,
        verdict: reported.verdict,
        rows: recording.stats.rows,
        first_failure: result.first_failure,
        problems,
    }
}

/// search.json of a `--search` run, written (a problem when it cannot be).
fn write_search(
    facts: &RunFacts<'_>,
    result: &ReplayResult,
    problems: &mut Vec<String>,
) -> Option<SearchDoc> {
    let doc = SearchDoc::of(facts.search?, result.searches.clone());
    if let Err(e) = facts.dir.write_json(rundir::SEARCH, &doc) {
        problems.push(e.to_string());
    }
    Some(doc)
}

/// The search's block of the table (empty without a search).
fn search_text(doc: Option<&SearchDoc>) -> String {
    doc.map(report::search::table).unwrap_or_default()
}

/// campaign.json as the arms' measures and the worker's scrapes make it (a campaign plan),
/// before its drift.
fn campaign_doc(
    plan: &Plan,
    result: &ReplayResult,
    scraped: &super::scrape::WorkerScrapes,
) -> Option<CampaignDoc> {
    plan.campaign.as_ref().map(|c| {
        let mut doc = report::campaign::campaign_doc(plan.name.as_deref(), c, &result.arms)
            .with_scrapes(scraped.health.as_deref());
        report::worker::add_cells(&mut doc, &scraped.rows);
        doc
    })
}

/// The prompt tokens read back, or `None` with why not among the run's problems.
fn prompt_tokens_or_problem(
    read: Option<Result<Option<PromptTokensMismatch>, EvidenceError>>,
    problems: &mut Vec<String>,
) -> Option<PromptTokensMismatch> {
    match read {
        Some(Err(e)) => {
            problems.push(format!("prompt_tokens_mismatch: {e}"));
            None
        }
        Some(Ok(m)) => m,
        None => None,
    }
}

/// What summary.json says of the recording.
fn recording_doc(
    record_exchanges: bool,
    recording: &RecordingEnd,
    prompt_tokens_mismatch: Option<PromptTokensMismatch>,
) -> Recording {
    Recording {
        rows_written: recording.stats.rows,
        // Absent under --no-record; unknown (null) when the writer failed: its count did
        // not come back.
        rows_encoded_during_rounds: record_exchanges.then(|| {
            recording
                .problems
                .is_empty()
                .then_some(recording.stats.encoded_while_held)
        }),
        record_error: recording.problems.first().map(|e| e.to_string()),
        prompt_tokens_mismatch,
        ..Recording::default()
    }
}

/// The run a campaign's reports belong to.
struct CampaignRun<'a, 'b> {
    facts: &'a RunFacts<'b>,
    config: &'a Config,
    /// summary.json's ending.
    ending: Ending,
}

/// What a campaign's reports leave the terminal: the drift, floor and intervals text and
/// the verdict's, and the verdict decided.
#[derive(Debug, Default)]
struct CampaignReported {
    text: String,
    verdict: Option<String>,
}

/// A campaign's own reports: the drift read into campaign.json (`evidence`, as
/// [`read_evidence`] returned it; or why not), then the
/// verdict of the contract the run was started with.
fn campaign_reports(
    run: &CampaignRun<'_, '_>,
    mut c: CampaignDoc,
    evidence: Evidence,
    problems: &mut Vec<String>,
) -> CampaignReported {
    let dir = run.facts.dir;
    let mut text = String::new();
    let drift_read = match evidence.drift {
        None => {
            c.drift = Some(None);
            c.drift_unavailable_reason =
                Some("--no-record: no answers were recorded to compare".into());
            false
        }
        Some(Err(e)) => {
            problems.push(format!("drift: {e}"));
            false
        }
        Some(Ok(())) => {
            if let Some(Err(e)) = evidence.intervals {
                problems.push(format!("intervals: {e}"));
            }
            text = drift_text(&c);
            true
        }
    };
    if let Err(e) = dir.write_json(rundir::CAMPAIGN, &c) {
        problems.push(e.to_string());
    }
    let Some(contract) = run.facts.contract else {
        return CampaignReported {
            text,
            verdict: None,
        };
    };
    let provenance = Provenance {
        contract: &contract.contract,
        contract_path: &contract.path.display().to_string(),
        run_id: Some(&run.config.run_id),
        run_started_at: Some(&run.config.started_at),
        run_ending: Some(run.ending.as_str()),
        post_hoc: None,
    };
    match decide(&c, drift_read, &provenance) {
        Err(NoVerdict::NoDrift) => {
            problems.push("verdict.json not written: drift could not be computed".into());
            CampaignReported {
                text,
                verdict: None,
            }
        }
        Ok(v) => {
            text.push_str(&report::verdict::verdict_text(&v));
            if let Err(e) = dir.write_json(rundir::VERDICT, &v) {
                problems.push(e.to_string());
            }
            CampaignReported {
                text,
                verdict: Some(v.verdict().to_string()),
            }
        }
    }
}

/// The drift floor, each arm's drift, the intervals and why drift is not available, as
/// the terminal shows them.
fn drift_text(c: &CampaignDoc) -> String {
    let mut text = c
        .drift_floor
        .as_ref()
        .map(report::answers::floor_text)
        .unwrap_or_default();
    text.push_str(&report::answers::drift_text(c.drift_entries()));
    if let Some(iv) = &c.intervals {
        text.push_str(&report::intervals::intervals_text(iv));
    }
    if let Some(why) = &c.drift_unavailable_reason {
        text.push_str(&format!("drift: n/a: {why}\n"));
    }
    text
}

/// `verdict RUN`'s campaign: campaign.json, with its drift read from the recorded
/// answers when it has none (a run made before drift existed) or counted no distinct
/// requests (written before drift did, which every floor-relative gate would take for too
/// few), and its intervals when it has none. With the warning to say when the intervals
/// could not be read (a v1 verdict never reads them; a gate that does says it has nothing
/// to read).
pub(crate) fn campaign_of_run(
    run: &FinishedRun,
    plan: &Plan,
) -> Result<(CampaignDoc, Option<String>), RunError> {
    let mut campaign = run.campaign()?.cloned().ok_or_else(|| {
        RunError::Usage(format!(
            "{}: no campaign.json; a verdict needs a campaign run (a plan with arms), or two runs with `compare --contract`",
            run.dir.display()
        ))
    })?;
    let before_distinct = campaign
        .drift_entries()
        .iter()
        .map(|e| &e.drift)
        .chain(campaign.drift_floor.as_ref().map(|f| &f.drift))
        .any(|d| d.compared_prompts > 0 && d.distinct_requests == 0);
    let drift = before_distinct || campaign.drift.as_ref().is_none_or(Option::is_none);
    if drift {
        run.refuse_unrecorded("drift, and the gates that read it, need them")?;
    }
    // A run under --no-record has no rows for intervals, and a gate that requires one
    // says so.
    let want = Wanted {
        prompt_tokens: false,
        drift,
        intervals: campaign.intervals.is_none() && run.refuse_unrecorded("").is_ok(),
    };
    let evidence = read_evidence(&run.exchanges(), plan, Some(&mut campaign), want);
    if let Some(Err(e)) = evidence.drift {
        return Err(RunError::Evidence(e));
    }
    let warning = match evidence.intervals {
        Some(Err(e)) => Some(format!("no intervals: {e}")),
        _ => None,
    };
    Ok((campaign, warning))
}

/// Why a verdict of `contract` on `run` is post hoc (`None`: the run was started with it).
pub(crate) fn post_hoc_reason(run: &FinishedRun, contract: &Contract) -> Option<String> {
    let recorded = run.config.replay().and_then(|r| r.contract.as_ref());
    match recorded.map(|c| c.sha256.as_str()) {
        Some(h) if h == contract.sha256 => None,
        Some(h) => Some(format!(
            "the run was started with another contract (SHA-256 {h}); this one ({}) was not locked in before the numbers",
            contract.sha256
        )),
        None => Some("the run was started without --contract; this contract was not locked in before the numbers".to_string()),
    }
}

/// `verdict RUN`'s verdict: [`decide`] on the campaign [`campaign_of_run`] read (its
/// drift read), with the run's provenance.
pub(crate) fn run_verdict(
    run: &FinishedRun,
    campaign: &CampaignDoc,
    contract: &ContractInput,
    post_hoc: Option<String>,
) -> Result<VerdictDoc, RunError> {
    let provenance = Provenance {
        contract: &contract.contract,
        contract_path: &contract.path.display().to_string(),
        run_id: Some(&run.config.run_id),
        run_started_at: Some(&run.config.started_at),
        run_ending: run.replay_summary()?.map(|s| s.ending.as_str()),
        post_hoc,
    };
    decide(campaign, true, &provenance).map_err(|NoVerdict::NoDrift| {
        RunError::Tool("verdict.json not written: drift could not be computed".into())
    })
}

/// `summarize`'s prompt tokens: the plan's input token counts against the server's, read
/// back from the run's rows.
pub(crate) fn prompt_tokens_of_run(
    run: &FinishedRun,
    plan: &Plan,
) -> Result<Option<PromptTokensMismatch>, RunError> {
    let want = Wanted {
        prompt_tokens: true,
        ..Wanted::default()
    };
    match read_evidence(&run.exchanges(), plan, None, want).prompt_tokens {
        Some(r) => r.map_err(RunError::Evidence),
        None => Ok(None),
    }
}
