//! Opening a run's Parquet files to read them back: the closed parts of an `exchanges/`
//! directory ([`closed_parts`]), the one opener ([`open_part`], which counts what it
//! opens), typed columns of a batch, and [`ReadError`], why a file cannot be read.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::RecordBatch;
use parquet::arrow::arrow_reader::ParquetRecordBatchReader;

/// Why recorded rows (or another Parquet file of a run) cannot be read back. Each kind
/// names the file; the text is the one the commands have always printed.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum ReadError {
    /// The `exchanges/` directory cannot be listed.
    #[error("{}: {source}", dir.display())]
    List {
        dir: PathBuf,
        source: Arc<std::io::Error>,
    },
    /// A part cannot be opened.
    #[error("{}: {source}", part.display())]
    Open {
        part: PathBuf,
        source: Arc<std::io::Error>,
    },
    /// A part is not Parquet the reader can use (footer, schema, projection).
    #[error("{}: {source}", part.display())]
    Parquet {
        part: PathBuf,
        source: Arc<parquet::errors::ParquetError>,
    },
    /// A batch of a part cannot be decoded.
    #[error("{}: {source}", part.display())]
    Batch {
        part: PathBuf,
        source: Arc<arrow_schema::ArrowError>,
    },
    #[error("{}: no column {name}", part.display())]
    NoColumn { part: PathBuf, name: String },
    #[error("{}: column {name} has an unexpected type", part.display())]
    ColumnType { part: PathBuf, name: String },
    #[error("{}: unknown outcome {outcome:?}", part.display())]
    UnknownOutcome { part: PathBuf, outcome: String },
    /// A worker_metrics.parquet labels map whose keys or values are not strings.
    #[error("{}: labels {side} are not strings", part.display())]
    LabelsNotStrings { part: PathBuf, side: &'static str },
    /// A worker_metrics.parquet row's cause that this version does not write.
    #[error("{}: row {row}: cause {cause:?} is none this version writes", part.display())]
    UnknownCause {
        part: PathBuf,
        /// The row's index in its batch, from 0.
        row: usize,
        cause: String,
    },
    /// A value no recorder writes ([`MAX_DURATION_US`], ...): the file was damaged.
    #[error("{}: row {row} (exchange_id {exchange_id}): {why}; no recorder writes it, so the file was damaged or edited after the run: restore the run's files from a copy", part.display())]
    Impossible {
        part: PathBuf,
        /// The row's number in its file, from 1.
        row: u64,
        exchange_id: i64,
        why: String,
    },
    /// A headers column that is not `list<struct<name: utf8, value: binary>>`.
    #[error("{}: {what}", part.display())]
    Headers { part: PathBuf, what: &'static str },
}

impl ReadError {
    /// A batch of `part` that cannot be decoded.
    pub(crate) fn batch(part: &Path, e: arrow_schema::ArrowError) -> ReadError {
        ReadError::Batch {
            part: part.to_path_buf(),
            source: Arc::new(e),
        }
    }
}

/// For callers whose errors are still text (their message is this error's).
/// Column `name` of a batch read from `part`, as Arrow array type `T`.
pub(crate) fn column<'a, T: 'static>(
    b: &'a RecordBatch,
    name: &str,
    part: &Path,
) -> Result<&'a T, ReadError> {
    b.column_by_name(name)
        .ok_or_else(|| ReadError::NoColumn {
            part: part.to_path_buf(),
            name: name.to_string(),
        })?
        .as_any()
        .downcast_ref::<T>()
        .ok_or_else(|| ReadError::ColumnType {
            part: part.to_path_buf(),
            name: name.to_string(),
        })
}

/// A column that runs recorded before it existed lack (`arm`, `decisions`).
pub(crate) fn optional_column<'a, T: 'static>(b: &'a RecordBatch, name: &str) -> Option<&'a T> {
    b.column_by_name(name)
        .and_then(|c| c.as_any().downcast_ref::<T>())
}

/// The batches of one part, read with only the columns named in `want`.
pub(crate) fn read_columns(
    part: &Path,
    want: &[&str],
) -> Result<ParquetRecordBatchReader, ReadError> {
    open_part(part, want, &mut 0)
}

/// [`read_columns`], counting the open in `opened` (the one place a part is opened).
pub(crate) fn open_part(
    part: &Path,
    want: &[&str],
    opened: &mut usize,
) -> Result<ParquetRecordBatchReader, ReadError> {
    use parquet::arrow::ProjectionMask;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    let parquet = |e| ReadError::Parquet {
        part: part.to_path_buf(),
        source: Arc::new(e),
    };
    let f = File::open(part).map_err(|e| ReadError::Open {
        part: part.to_path_buf(),
        source: Arc::new(e),
    })?;
    *opened += 1;
    let builder = ParquetRecordBatchReaderBuilder::try_new(f).map_err(parquet)?;
    // A column the part lacks is left out here; the caller says whether it needed it.
    let roots: Vec<usize> = want
        .iter()
        .filter_map(|n| builder.schema().index_of(n).ok())
        .collect();
    let mask = ProjectionMask::roots(builder.parquet_schema(), roots);
    builder.with_projection(mask).build().map_err(parquet)
}

/// The closed parts (`part-*.parquet`) of an `exchanges/` directory, in file order.
pub(crate) fn closed_parts(exchanges: &Path) -> Result<Vec<PathBuf>, ReadError> {
    let mut parts: Vec<PathBuf> = fs::read_dir(exchanges)
        .map_err(|e| ReadError::List {
            dir: exchanges.to_path_buf(),
            source: Arc::new(e),
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let n = p
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            n.starts_with("part-") && n.ends_with(".parquet")
        })
        .collect();
    parts.sort();
    Ok(parts)
}
