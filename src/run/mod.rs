//! The run layer: one command's run end to end, below the command line and above the
//! drivers and the reports. `cli` resolves a command's arguments into a complete input and
//! hands it here; what comes back is a typed end ([`RunEnd`]) or a typed error
//! ([`RunError`]), which `cli` prints and maps onto an exit code. Never imports `cli`,
//! never parses an argument and never prints what a command answers (the table, the JSON,
//! the closing lines): it returns them.
//!
//! - [`open`]: a finished run read back (`FinishedRun`), plans and other bounded inputs.
//! - [`replay`]: the replay run (its directory, config.json, the driver, the recorder) and
//!   its documents.
//! - [`serve`]: the serve run, the same way.
//! - [`finish`]: a finished run's documents, campaign reports and verdict: the one place a
//!   verdict is decided (replay, `verdict RUN` and `summarize` call it).
//! - [`scrape`]: the worker's `/metrics` and the GPU sampled during a run, and the live
//!   metrics endpoint (`--metrics-listen`).

pub(crate) mod finish;
pub(crate) mod metrics_http;
pub(crate) mod open;
pub(crate) mod replay;
pub(crate) mod scrape;
pub(crate) mod serve;

use crate::record::RecordError;
use crate::record::rundir::{RunDir, RunDirError};
use crate::report::error::ReportError;

/// How a run ended, for the exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RunEnd {
    /// Every exchange passed (serve: stopped with everything recorded and answered).
    Passed,
    /// A failure was recorded.
    Failed,
    /// Stopped by Ctrl-C / SIGTERM, files closed and readable.
    Interrupted,
}

impl From<crate::report::Ending> for RunEnd {
    fn from(e: crate::report::Ending) -> RunEnd {
        match e {
            crate::report::Ending::Passed => RunEnd::Passed,
            crate::report::Ending::Failed => RunEnd::Failed,
            crate::report::Ending::Interrupted => RunEnd::Interrupted,
        }
    }
}

/// Why a run could not start or finish. Each kind maps onto one exit code in `cli`
/// (`Usage`, `Report`'s refusals: 2; the rest: 3); its text is the message the user sees.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RunError {
    /// Input found unusable while starting (an output folder that exists, a listener that
    /// cannot be bound).
    #[error("{0}")]
    Usage(String),
    /// The run directory or one of its files could not be created or written.
    #[error(transparent)]
    RunDir(#[from] RunDirError),
    /// The recorder could not start.
    #[error(transparent)]
    Record(#[from] RecordError),
    /// A finished run, or a file of one, could not be read or used.
    #[error(transparent)]
    Report(#[from] ReportError),
    /// The tool itself failed (a server, a scraper or a file it could not make), with the
    /// whole message.
    #[error("{0}")]
    Tool(String),
    /// A run's recorded exchanges could not be read back for what its reports need.
    #[error(transparent)]
    Evidence(#[from] crate::report::evidence::EvidenceError),
    /// The run ended and wrote what it could, but some of its documents or outputs
    /// failed: each problem, and where what was written is kept.
    #[error("{} (what was written is kept in {})", problems.join("; "), dir.display())]
    Problems {
        problems: Vec<String>,
        dir: std::path::PathBuf,
    },
}

/// Create the run directory; `default_name`: the user did not choose it, so a taken name
/// gets a numeric suffix instead of being refused.
pub(crate) fn create_run_dir(
    out: &std::path::Path,
    default_name: bool,
) -> Result<RunDir, RunError> {
    let mut candidate = out.to_path_buf();
    for n in 2..1000 {
        match RunDir::create(&candidate) {
            Ok(d) => return Ok(d),
            Err(RunDirError::Exists(_)) if default_name => {
                candidate = std::path::PathBuf::from(format!("{}-{n}", out.display()));
            }
            Err(e @ RunDirError::Exists(_)) => return Err(RunError::Usage(e.to_string())),
            Err(e) => {
                return Err(RunError::Usage(format!(
                    "--out {}: cannot create the run directory ({e})",
                    candidate.display()
                )));
            }
        }
    }
    Err(RunError::Usage(format!(
        "{}: too many runs with this name",
        out.display()
    )))
}

/// A run's id: its start in compact UTC and 8 hex digits of a hash of the start, the
/// process and the clock.
pub(crate) fn run_id(now_us: i64) -> String {
    let seed = format!(
        "{}-{}-{}",
        now_us,
        std::process::id(),
        crate::clock::now_ns()
    );
    format!(
        "{}-{}",
        crate::clock::compact_utc(now_us),
        &crate::record::rundir::sha256_hex(seed.as_bytes())[..8]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_taken_default_run_name_gets_a_suffix_but_an_explicit_one_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("demo-20261129T000000Z");
        assert_eq!(create_run_dir(&out, true).unwrap().path, out);
        let second = create_run_dir(&out, true).unwrap();
        assert_eq!(second.path, tmp.path().join("demo-20261129T000000Z-2"));
        let err = create_run_dir(&out, false).err().unwrap();
        assert!(matches!(err, RunError::Usage(_)), "{err}");
        assert!(err.to_string().contains("already exists"), "{err}");
    }
}
