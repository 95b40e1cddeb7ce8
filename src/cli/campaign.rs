//! The campaign half of the command line: a contract read and checked before a run
//! (`replay --contract`) or a verdict, and the two commands that read finished runs:
//! `verdict` (a contract's gates on one campaign run) and `compare` (two runs of one
//! workload: drift and every metric's delta, optionally a verdict). What they compute is
//! `report`'s (`report::answers`, `report::compare`, `report::verdict`); this file reads
//! the arguments, writes the files and prints.

use std::path::{Path, PathBuf};

use super::io::{CliError, Exit, print_stdout, report_error, tool, usage, write_new};
use crate::config::campaign::Lane;
use crate::config::contract::Contract;
use crate::record::rundir::{self, VERDICT, VERDICT_POST_HOC};
use crate::report::answers;
use crate::report::compare;
use crate::report::doc::config::ContractRecord;
use crate::report::run::FinishedRun;
use crate::report::verdict::{self, Provenance};

/// Contracts are small; a larger file is not one.
pub(super) const MAX_CONTRACT_BYTES: u64 = 1 << 20;

/// Read and validate a contract file (exit 2 with the file's name on any problem).
pub(crate) fn load_contract(path: &Path) -> Result<Contract, CliError> {
    let bytes = crate::report::run::read_bounded(
        path,
        MAX_CONTRACT_BYTES,
        "contract",
        "a contract holds thresholds, not data",
    )
    .map_err(report_error)?;
    Contract::from_json_bytes(&bytes, rundir::sha256_hex(&bytes))
        .map_err(|e| usage(format!("{}: {e}", path.display())))
}

/// A contract must name the plan (`plan_id` = the plan's `name`) and be locked no later
/// than the run started.
pub(crate) fn check_contract(
    c: &Contract,
    path: &Path,
    plan_name: Option<&str>,
    started_at_us: i64,
) -> Result<(), CliError> {
    if plan_name != Some(c.plan_id.as_str()) {
        return Err(usage(format!(
            "{}: plan_id '{}' is not this plan's name ({}); a contract is written for one plan",
            path.display(),
            c.plan_id,
            plan_name.map_or("the plan has no name".to_string(), |n| format!("'{n}'"))
        )));
    }
    if c.locked_at_us > started_at_us {
        return Err(usage(format!(
            "{}: locked_at {} is later than the run's start ({}); a contract is fixed before the numbers exist",
            path.display(),
            c.locked_at,
            crate::clock::iso_utc(started_at_us)
        )));
    }
    Ok(())
}

/// config.json's record of the contract a run was started with.
pub(crate) fn contract_record(c: &Contract, path: &Path) -> ContractRecord {
    ContractRecord {
        path: path.display().to_string(),
        sha256: c.sha256.clone(),
        plan_id: c.plan_id.clone(),
        locked_at: c.locked_at.clone(),
        locked_by: c.locked_by.clone(),
    }
}

/// The `verdict` command: a contract's gates on a finished campaign run. Written to
/// `RUN/verdict.json` when the contract is the one the run was started with, else to
/// `RUN/verdict.post-hoc.json` (never over the pre-registered verdict), or to `--out`.
pub(crate) fn verdict_cmd(
    dir: &Path,
    contract_path: &Path,
    out: Option<&Path>,
) -> Result<Exit, CliError> {
    if let Some(out) = out.filter(|o| same_file(o, &dir.join(VERDICT))) {
        return Err(usage(format!(
            "--out {}: that is the run's pre-registered verdict ({}): only the contract the run was started with writes it (without --out), so --out never does. Leave --out out (another contract's verdict goes to {}) or name another file",
            out.display(),
            dir.join(VERDICT).display(),
            dir.join(VERDICT_POST_HOC).display()
        )));
    }
    let run = FinishedRun::open(dir).map_err(report_error)?;
    let plan = run.replay_plan().map_err(report_error)?;
    let contract = load_contract(contract_path)?;
    let mut campaign = run.campaign().map_err(report_error)?.cloned().ok_or_else(|| {
        usage(format!(
            "{}: no campaign.json; a verdict needs a campaign run (a plan with arms), or two runs with `compare --contract`",
            dir.display()
        ))
    })?;
    // Runs made before drift existed (or under --no-record, refused): computed from the
    // recorded answers.
    // A campaign.json written before drift counted distinct requests reads them as 0, which
    // every floor-relative gate would take for too few: its drift is recomputed too.
    let before_distinct = campaign
        .drift_entries()
        .iter()
        .map(|e| &e.drift)
        .chain(campaign.drift_floor.as_ref().map(|f| &f.drift))
        .any(|d| d.compared_prompts > 0 && d.distinct_requests == 0);
    let drift = before_distinct || campaign.drift.as_ref().is_none_or(Option::is_none);
    if drift {
        run.refuse_unrecorded("drift, and the gates that read it, need them")
            .map_err(report_error)?;
    }
    // Runs made before intervals existed: computed from the recorded rows (a run under
    // --no-record has none, and a gate that requires one says so).
    let intervals = campaign.intervals.is_none() && run.refuse_unrecorded("").is_ok();
    let wants = crate::report::evidence::Wants {
        prompt_tokens: false,
        answers: drift,
        rounds: intervals,
    };
    let mut evidence = crate::report::evidence::Evidence::read(&[run.exchanges()], plan, wants);
    if drift {
        answers::add_drift(&mut campaign, &mut evidence, plan).map_err(|e| tool(e.to_string()))?;
    }
    if intervals
        && let Err(e) = crate::report::intervals::add_intervals(&mut campaign, &mut evidence)
    {
        // A v1 verdict never reads them; a gate that does says it has nothing to read.
        eprintln!("matrix-proxy: warning: no intervals: {e}");
    }
    let name = campaign.plan_id.as_deref().or(plan.name.as_deref());
    check_contract(
        &contract,
        contract_path,
        name,
        run.started_at_us().map_err(report_error)?,
    )?;
    let recorded = run.config.replay().and_then(|r| r.contract.as_ref());
    let post_hoc = match recorded.map(|c| c.sha256.as_str()) {
        Some(h) if h == contract.sha256 => None,
        Some(h) => Some(format!(
            "the run was started with another contract (SHA-256 {h}); this one ({}) was not locked in before the numbers",
            contract.sha256
        )),
        None => Some("the run was started without --contract; this contract was not locked in before the numbers".to_string()),
    };
    if let Some(why) = &post_hoc {
        eprintln!("matrix-proxy: warning: post-hoc verdict: {why}");
    }
    let v = verdict::verdict_doc(
        &campaign,
        &Provenance {
            contract: &contract,
            contract_path: &contract_path.display().to_string(),
            run_id: Some(&run.config.run_id),
            run_started_at: Some(&run.config.started_at),
            run_ending: run
                .replay_summary()
                .map_err(report_error)?
                .map(|s| s.ending.as_str()),
            post_hoc: post_hoc.clone(),
        },
    );
    // The pre-registered verdict is the run's own and is written anew by its contract; a
    // post-hoc one, or one to --out, is never written over.
    let path = match (out, post_hoc.is_some()) {
        (None, false) => {
            let path = dir.join(VERDICT);
            write_json(&path, &v)?;
            path
        }
        (None, true) => write_never_over(None, &dir.join(VERDICT_POST_HOC), &v, "a verdict")?,
        (Some(out), _) => write_never_over(Some(out), out, &v, "a verdict")?,
    };
    print_stdout(&verdict::verdict_text(&v), "the verdict", dir).map_err(tool)?;
    eprintln!("matrix-proxy: verdict written to {}", path.display());
    Ok(Exit::Ok)
}

/// Whether `a` and `b` name the same file (which may not exist yet): the same name in the
/// same directory, each directory resolved (`./RUN`, `RUN/../RUN`, links).
fn same_file(a: &Path, b: &Path) -> bool {
    let resolved = |p: &Path| {
        let dir = match p.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        (
            dir.canonicalize().ok(),
            p.file_name().map(ToOwned::to_owned),
        )
    };
    match (resolved(a), resolved(b)) {
        ((Some(da), Some(na)), (Some(db), Some(nb))) => da == db && na == nb,
        _ => false,
    }
}

fn write_json<T: serde::Serialize>(path: &Path, v: &T) -> Result<(), CliError> {
    rundir::write_json_at(path, v).map_err(|e| tool(e.to_string()))
}

/// What `compare` was asked.
pub(crate) struct CompareArgs<'a> {
    pub(crate) a: &'a Path,
    pub(crate) b: &'a Path,
    pub(crate) contract: Option<&'a Path>,
    /// The lane of B's side when B is not a campaign (a campaign arm keeps its own).
    pub(crate) lane: Lane,
    /// `--out` (refused if it exists); `None`: the first free of `compare.json`,
    /// `compare-2.json`, ... in the current folder.
    pub(crate) out: Option<&'a Path>,
    /// `--arm-a` / `--arm-b`: the side of each run to compare.
    pub(crate) arms: (Option<&'a str>, Option<&'a str>),
}

/// The `compare` command.
pub(crate) fn compare_cmd(args: &CompareArgs<'_>) -> Result<Exit, CliError> {
    let a = FinishedRun::open(args.a).map_err(report_error)?;
    let b = FinishedRun::open(args.b).map_err(report_error)?;
    let comparison =
        compare::check_comparable(&a, &b, args.lane, args.arms).map_err(report_error)?;
    let contract = match args.contract {
        None => None,
        Some(path) => {
            let c = load_contract(path)?;
            let name = a.replay_plan().map_err(report_error)?.name.as_deref();
            let started = a.started_at_us().map_err(report_error)?;
            check_contract(
                &c,
                path,
                name,
                started.min(b.started_at_us().map_err(report_error)?),
            )?;
            Some((c, path.display().to_string()))
        }
    };
    let (doc, text) = comparison
        .document(
            contract
                .as_ref()
                .map(|(c, path)| compare::CompareContract { contract: c, path }),
        )
        .map_err(report_error)?;
    if let Some(why) = doc
        .verdict
        .as_ref()
        .and_then(|v| v.post_hoc_reason.as_ref())
    {
        eprintln!("matrix-proxy: warning: post-hoc verdict: {why}");
    }
    let out = write_never_over(args.out, Path::new("compare.json"), &doc, "a comparison")?;
    print_stdout(&text, "the comparison", &out).map_err(tool)?;
    eprintln!("matrix-proxy: comparison written to {}", out.display());
    Ok(Exit::Ok)
}

/// Write `v` as a new file: `out` when given (refused if it exists), else `default`, or
/// the first free of `NAME-2.EXT`, `NAME-3.EXT`, ... beside it; whole or not at all. The
/// path written.
fn write_never_over<T: serde::Serialize>(
    out: Option<&Path>,
    default: &Path,
    v: &T,
    what: &str,
) -> Result<PathBuf, CliError> {
    let bytes = rundir::json_bytes(v);
    if let Some(out) = out {
        if out.exists() {
            return Err(usage(format!(
                "--out {}: exists; {what} is never written over: remove it, name another file, or leave --out out for a new name",
                out.display()
            )));
        }
        write_new("--out", out, &bytes)?;
        return Ok(out.to_path_buf());
    }
    let stem = default
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let ext = default
        .extension()
        .map(|e| format!(".{}", e.to_string_lossy()))
        .unwrap_or_default();
    for n in 1..=10_000u32 {
        let path = match n {
            1 => default.to_path_buf(),
            n => default.with_file_name(format!("{stem}-{n}{ext}")),
        };
        if path.exists() {
            continue;
        }
        match write_new("--out", &path, &bytes) {
            // Made meanwhile by another command: the next name.
            Err(_) if path.exists() => continue,
            r => return r.map(|()| path),
        }
    }
    Err(usage(format!(
        "{}: 10,000 earlier files of its name exist; name the file with --out",
        default.display()
    )))
}
