//! [`ReportError`]: why a finished run, or a file of one, cannot be read or used. Its
//! kinds are what the command line maps onto exit codes (a run or file that cannot be
//! used: 2; rows that cannot be read back: 3).

use std::path::{Path, PathBuf};

/// Why a finished run (or a file of one) cannot be read or used.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum ReportError {
    /// A file that cannot be read or is not what it should be.
    #[error("{}: {cause}", path.display())]
    File { path: PathBuf, cause: String },
    /// The run is not one the command can use, with the reason and the fix.
    #[error("{0}")]
    Refused(String),
    /// The recorded rows (or the run's other Parquet files) cannot be read back.
    #[error(transparent)]
    Rows(#[from] crate::record::read::ReadError),
    /// The run did not finish (no summary.json): its files cannot be read as a result.
    #[error("{0}")]
    Unfinished(String),
}

impl ReportError {
    /// A file's problem, with the file named.
    pub(crate) fn file(path: &Path, cause: impl std::fmt::Display) -> ReportError {
        ReportError::File {
            path: path.to_path_buf(),
            cause: cause.to_string(),
        }
    }
}
