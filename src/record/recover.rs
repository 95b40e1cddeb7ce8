//! After a crash: quarantine the unfinished part (a Parquet file without its footer
//! cannot be read) and count, from the writer's ledger, the rows it held.

use std::fs::{self, File};
use std::path::{Path, PathBuf};

use super::ledger;

/// What `recover` found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Recovery {
    /// Left-over `.inprogress` parts moved to `quarantine/`.
    pub(crate) quarantined: Vec<PathBuf>,
    /// Rows the ledger says were written into those parts, or held unencoded (a replay
    /// round's, to the last 64): lost.
    pub(crate) rows_lost: u64,
    /// Rows in the closed parts.
    pub(crate) rows_kept: u64,
}

/// Why `recover` stopped: a file or folder of the run it could not read or move.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RecoverError {
    #[error("{path}: {err}")]
    Io {
        path: PathBuf,
        #[source]
        err: std::io::Error,
    },
    /// A closed part whose footer could not be read.
    #[error("{path}: {err}")]
    Parquet {
        path: PathBuf,
        #[source]
        err: parquet::errors::ParquetError,
    },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> RecoverError + '_ {
    move |err| RecoverError::Io {
        path: path.to_path_buf(),
        err,
    }
}

/// Quarantine left-over `.inprogress` parts of `run/exchanges` (a Parquet file without
/// its footer cannot be read) and count, from the writer's ledger, the rows they held.
pub(crate) fn recover(run: &Path) -> Result<Recovery, RecoverError> {
    let ex = run.join(super::rundir::EXCHANGES);
    recover_parts(run, &ex, &ledger::path_of(&ex))
}

/// `recover` for parts in `ex` with their ledger at `ledger_path` (a shard's parts are
/// in `OUT/exchanges/shard=I/`, its ledger in `OUT/shards/I/`); unfinished parts go to
/// `run/quarantine/`.
pub(crate) fn recover_parts(
    run: &Path,
    ex: &Path,
    ledger_path: &Path,
) -> Result<Recovery, RecoverError> {
    let mut rec = Recovery::default();
    let noted = ledger::read_at(ledger_path, ex);
    let ledger = noted.parts;
    rec.rows_lost += noted.held;
    let entries: Vec<PathBuf> = fs::read_dir(ex)
        .map_err(io_err(ex))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    for p in entries {
        let name = p
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if let Some(idx) = name
            .strip_prefix(".part-")
            .and_then(|s| s.strip_suffix(".parquet.inprogress"))
            .and_then(|s| s.parse::<u32>().ok())
        {
            let q = run.join(super::rundir::QUARANTINE);
            fs::create_dir_all(&q).map_err(io_err(&q))?;
            let dest = q.join(&name);
            fs::rename(&p, &dest).map_err(io_err(&p))?;
            rec.rows_lost += ledger.get(&idx).copied().unwrap_or(0);
            rec.quarantined.push(dest);
        } else if name.starts_with("part-") && name.ends_with(".parquet") {
            let f = File::open(&p).map_err(io_err(&p))?;
            let reader =
                parquet::file::serialized_reader::SerializedFileReader::new(f).map_err(|err| {
                    RecoverError::Parquet {
                        path: p.clone(),
                        err,
                    }
                })?;
            rec.rows_kept += parquet::file::reader::FileReader::metadata(&reader)
                .file_metadata()
                .num_rows() as u64;
        }
    }
    Ok(rec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_held_for_a_round_count_as_lost_beside_the_unfinished_part() {
        let (run, ex) = crate::record::tests_support::run_dir();
        fs::write(ex.join(".part-00001.parquet.inprogress"), b"PAR1").unwrap();
        fs::write(
            run.path().join(ledger::LEDGER),
            "0 100000\nheld 1024\n1 500\nheld 3072\n",
        )
        .unwrap();
        let r = recover(run.path()).unwrap();
        assert_eq!(r.rows_lost, 500 + 3_072);
        assert_eq!(r.quarantined.len(), 1);
        // Once encoded, the held rows are no longer counted.
        fs::write(run.path().join(ledger::LEDGER), "held 2048\n0 10\nheld 0\n").unwrap();
        assert_eq!(recover(run.path()).unwrap().rows_lost, 0);
    }
}
