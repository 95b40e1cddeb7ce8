//! `matrix-proxy freeze RUN [RUN ...] [--out plan.json]`: the flags checked, the freeze
//! made (`crate::freeze`), its lines on stderr and the plan written (refusing to replace
//! a file: a plan is edited by hand after it is frozen).

use std::io::Write;
use std::path::Path;

use serde_json::{Map, Value};

use super::args::{FreezeArgs, FreezeOracle, PlanConnection, PlanOnFailure};
use super::io::{CliError, Exit, report_error, tool, usage, write_new};
use crate::config::flags;
use crate::config::plan::OnFailure;
use crate::freeze::{self, Budget, FreezeError, Options};
use crate::model::ConnectionPolicy;
use crate::run::open::read_bounded;

/// Largest `--metadata` file read.
const MAX_METADATA_BYTES: u64 = 1 << 20;

pub fn freeze_cmd(args: &FreezeArgs) -> Result<Exit, CliError> {
    check_out(args.out.as_deref())?;
    let trace_path = args
        .out
        .as_deref()
        .filter(|_| args.keep_timing)
        .map(trace_beside);
    check_new("--out", trace_path.as_deref())?;
    let mut opts = options(args)?;
    if args.keep_timing {
        opts.keep_timing = Some(
            trace_path
                .as_deref()
                .and_then(|p| p.file_name())
                .map(|n| n.to_string_lossy().into_owned()),
        );
    }
    let frozen = freeze::freeze(&opts).map_err(|e| match e {
        FreezeError::Run(e) => report_error(e),
        refused => usage(refused.to_string()),
    })?;
    for line in &frozen.lines {
        eprintln!("matrix-proxy: {line}");
    }
    if let (Some(t), Some(path)) = (&frozen.trace, &trace_path) {
        write_new("--out", path, &t.bytes)?;
        eprintln!("matrix-proxy: wrote {}", path.display());
        if let Err(e) = emit(args.out.as_deref(), &frozen.plan) {
            // The trace is this command's own, written a moment ago: no plan, no trace.
            let _ = std::fs::remove_file(path);
            return Err(e);
        }
        return Ok(Exit::Ok);
    }
    emit(args.out.as_deref(), &frozen.plan)?;
    Ok(Exit::Ok)
}

/// Where a trace plan's trace file goes: beside the plan, its stem + `.trace.jsonl`
/// (`capture.json` -> `capture.trace.jsonl`).
pub(super) fn trace_beside(plan: &Path) -> std::path::PathBuf {
    let stem = plan
        .file_stem()
        .map_or_else(|| "plan".into(), |s| s.to_string_lossy().into_owned());
    plan.with_file_name(format!("{stem}.trace.jsonl"))
}

/// Refuse an `--out` that exists or whose folder does not, before anything is read.
pub(super) fn check_out(out: Option<&Path>) -> Result<(), CliError> {
    check_new("--out", out)
}

/// Refuse a file to be written (given with `flag`) that exists or whose folder does not.
pub(super) fn check_new(flag: &str, out: Option<&Path>) -> Result<(), CliError> {
    let Some(out) = out else { return Ok(()) };
    if out.exists() {
        return Err(usage(format!(
            "{flag} {}: exists; a written plan is edited by hand, so it is never replaced: remove it or choose another file",
            out.display()
        )));
    }
    if let Some(dir) = out.parent()
        && !dir.as_os_str().is_empty()
        && !dir.is_dir()
    {
        return Err(usage(format!(
            "{flag}: {} is not a directory; create it first",
            dir.display()
        )));
    }
    Ok(())
}

/// The plan to `--out` (whole or not at all), else to stdout.
pub(super) fn emit(out: Option<&Path>, plan: &[u8]) -> Result<(), CliError> {
    match out {
        Some(out) => {
            write_new("--out", out, plan)?;
            eprintln!(
                "matrix-proxy: wrote {}; check it with `matrix-proxy validate {0}`, replay it with `matrix-proxy replay {0}`",
                out.display()
            );
            Ok(())
        }
        None => std::io::stdout()
            .write_all(plan)
            .map_err(|e| tool(format!("stdout: {e}"))),
    }
}

/// A written plan's budget from flags (`freeze`, `plan`), checked as a plan would be: a
/// bad value is exit 2 before anything is read.
pub(super) fn budget(
    concurrency: &[usize],
    requests_per_case: Option<usize>,
    (repetitions, warmup_per_case): (usize, usize),
    timeout_seconds: f64,
    connection: PlanConnection,
) -> Result<Budget, CliError> {
    if concurrency.is_empty() || concurrency.contains(&0) {
        return Err(usage("--concurrency: give levels of at least 1, e.g. 1,4"));
    }
    if let Some(n) = requests_per_case
        && let Some(c) = concurrency.iter().find(|c| **c > n)
    {
        return Err(usage(format!(
            "--concurrency {c} is above --requests-per-case {n}: a round could never fill it"
        )));
    }
    if repetitions < 2 || warmup_per_case < 2 {
        return Err(usage(
            "--repetitions and --warmup-per-case are at least 2 (a plan's rule)",
        ));
    }
    flags::seconds("--timeout-seconds", timeout_seconds).map_err(usage)?;
    Ok(Budget {
        concurrency: concurrency.to_vec(),
        requests_per_case,
        repetitions,
        warmup_per_case,
        timeout_seconds,
        connection: match connection {
            PlanConnection::KeepAlive => ConnectionPolicy::KeepAlive,
            PlanConnection::Fresh => ConnectionPolicy::Fresh,
        },
        on_failure: None,
    })
}

/// The flags as the freeze takes them; a bad value is exit 2 before any run is read.
fn options(args: &FreezeArgs) -> Result<Options, CliError> {
    let endpoint = args
        .endpoint
        .as_deref()
        .map(|u| flags::endpoint("--endpoint", u))
        .transpose()
        .map_err(usage)?;
    // A trace plan replays the whole trace `repetitions` times: once is enough.
    let trace_once = args.keep_timing && args.repetitions == 1;
    let reps = if trace_once { 2 } else { args.repetitions };
    let mut budget = budget(
        &args.concurrency,
        args.requests_per_case,
        (reps, args.warmup_per_case),
        args.timeout_seconds,
        args.connection,
    )?;
    budget.repetitions = args.repetitions;
    budget.on_failure = args.on_failure.map(|p| match p {
        PlanOnFailure::Stop => OnFailure::Stop,
        PlanOnFailure::Continue => OnFailure::Continue,
    });
    if let Some(name) = &args.name
        && name.trim().is_empty()
    {
        return Err(usage(
            "--name: give the plan a non-blank name (the plan id a contract names)",
        ));
    }
    if let Some(name) = &args.bearer_token_env
        && !flags::is_env_name(name)
    {
        return Err(usage(format!(
            "--bearer-token-env {name:?}: not an environment variable name (letters, digits, '_'; the plan records the name, never the token)"
        )));
    }
    let metadata = args.metadata.as_deref().map(read_metadata).transpose()?;
    Ok(Options {
        runs: args.runs.clone(),
        arm: args.arm.clone(),
        endpoint,
        bearer_token_env: args.bearer_token_env.clone(),
        name: args.name.clone(),
        metadata,
        keep_timing: None,
        oracle: match args.oracle {
            FreezeOracle::Exact => freeze::OracleChoice::Exact,
            FreezeOracle::Schema => freeze::OracleChoice::Schema,
            FreezeOracle::Auto => freeze::OracleChoice::Auto,
        },
        budget,
    })
}

/// `--metadata FILE`: a JSON object.
pub(super) fn read_metadata(path: &Path) -> Result<Map<String, Value>, CliError> {
    let bytes = read_bounded(path, MAX_METADATA_BYTES, "metadata file", "provenance")
        .map_err(report_error)?;
    match serde_json::from_slice::<Value>(&bytes) {
        Ok(Value::Object(m)) => {
            let not_text: Vec<&str> = crate::config::REQUIRED_METADATA
                .into_iter()
                .filter(|k| m.get(*k).is_some_and(|v| !v.is_string()))
                .collect();
            if !not_text.is_empty() {
                return Err(usage(format!(
                    "--metadata {}: {} must be strings (a plan's rule; write \"0,1\" for a list of GPU ids)",
                    path.display(),
                    not_text.join(", ")
                )));
            }
            Ok(m)
        }
        Ok(_) => Err(usage(format!(
            "--metadata {}: must be a JSON object of provenance (\"gpu\": ..., \"driver\": ...)",
            path.display()
        ))),
        Err(e) => Err(usage(format!(
            "--metadata {}: not valid JSON: {e}",
            path.display()
        ))),
    }
}
