//! The run directory: created fresh, never reused, and written so a reader never sees a
//! half-written file.
//!
//! Layout: `plan.json` (the plan's exact bytes), `config.json`, `exchanges/` (Parquet
//! parts, owned by the recorder), `rounds.parquet`, `summary.json`. JSON files are written
//! to a temporary name, fsynced and renamed into place. This module never deletes or
//! overwrites anything that existed before the run.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;
use sha2::{Digest, Sha256};

// === The names inside a run folder (spelled here and nowhere else) ===

/// The plan's exact bytes (replay).
pub(crate) const PLAN: &str = "plan.json";
pub(crate) const CONFIG: &str = "config.json";
pub(crate) const SUMMARY: &str = "summary.json";
/// The run's own summary, kept by `summarize` beside the rebuilt one.
pub(crate) const SUMMARY_ORIG: &str = "summary.orig.json";
pub(crate) const ROUNDS: &str = "rounds.parquet";
/// The worker's own metrics, scraped (`--worker-metrics`).
pub(crate) const WORKER_METRICS: &str = "worker_metrics.parquet";
/// Device-wide GPU telemetry (`--gpu-metrics`).
pub(crate) const GPU: &str = "gpu.parquet";
pub(crate) const ROUNDS_ORIG: &str = "rounds.orig.parquet";
pub(crate) const CAMPAIGN: &str = "campaign.json";
/// `replay --search`: every probe, the answer and why the search stopped.
pub(crate) const SEARCH: &str = "search.json";
/// The pre-registered verdict (the contract the run was started with).
pub(crate) const VERDICT: &str = "verdict.json";
/// A verdict of a contract the run was not started with.
pub(crate) const VERDICT_POST_HOC: &str = "verdict.post-hoc.json";
pub(crate) const REPORT: &str = "report.html";
pub(crate) const RECOVERY: &str = "recovery.json";
/// Recorded exchanges (Parquet parts); a sharded run's holds one `shard=I` per shard.
pub(crate) const EXCHANGES: &str = "exchanges";
/// The writer's ledger of rows handed to each part, beside `exchanges/`.
pub const LEDGER: &str = "exchanges.ledger";
/// Unfinished parts `recover` moved aside.
pub(crate) const QUARANTINE: &str = "quarantine";
/// Started servers' logs (a campaign's arms).
pub(crate) const SERVERS: &str = "servers";
/// A sharded run's per-shard report folders.
pub(crate) const SHARDS: &str = "shards";

/// Shard `index`'s report folder in a sharded output folder `out`.
pub(crate) fn shard_dir(out: &Path, index: usize) -> PathBuf {
    out.join(SHARDS).join(index.to_string())
}

/// Shard `index`'s parts folder in `out` (a Hive-style partition).
pub(crate) fn shard_exchanges(out: &Path, index: usize) -> PathBuf {
    out.join(EXCHANGES).join(format!("shard={index}"))
}

/// Whether `dir` is the output folder of a sharded run (it has `shards/`, and no
/// `config.json` of its own).
pub(crate) fn is_sharded(dir: &Path) -> bool {
    dir.join(SHARDS).is_dir() && !dir.join(CONFIG).exists()
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum RunDirError {
    #[error(
        "{0}: already exists; choose a new --out directory (runs are never overwritten or merged)"
    )]
    Exists(PathBuf),
    #[error("{path}: {err}")]
    Io {
        path: PathBuf,
        #[source]
        err: io::Error,
    },
    /// A Parquet file could not be written (its temporary name, or its final one).
    #[error("{path}: {err}")]
    Parquet {
        path: PathBuf,
        #[source]
        err: parquet::errors::ParquetError,
    },
    /// A process still holds the run's lock (`pid` as its lock file says, or `unknown`).
    #[error(
        "{run}: run is still being written (pid {pid}); wait for it to end (or stop it), then run this again"
    )]
    Locked { run: PathBuf, pid: String },
}

pub(crate) struct RunDir {
    pub(crate) path: PathBuf,
    /// `path/exchanges`; a shard's is `OUT/exchanges/shard=i`.
    exchanges: PathBuf,
    /// `path/.lock`, locked while this process writes the run (`None`: a run opened to
    /// be read). The kernel releases the lock when the process dies, however it dies.
    lock: Option<File>,
}

/// The lock file of a run being written: a writer holds an exclusive `flock` on it (its
/// pid inside) for as long as it writes; a reader refuses a run whose lock is held.
pub(crate) const LOCK: &str = ".lock";

/// Take the lock of the run in `dir` for this process (its pid written in the file).
fn lock_run(dir: &Path) -> Result<File, RunDirError> {
    let path = dir.join(LOCK);
    let mut f = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(io_err(&path))?;
    match f.try_lock() {
        Ok(()) => {}
        Err(fs::TryLockError::WouldBlock) => {
            let err = io::Error::other("another process holds the new run directory's lock");
            return Err(RunDirError::Io { path, err });
        }
        // A file system without locks (some network mounts): the run is written unlocked,
        // as runs were before locks existed.
        Err(fs::TryLockError::Error(_)) => {}
    }
    f.set_len(0)
        .and_then(|()| writeln!(f, "{}", std::process::id()))
        .map_err(io_err(&path))?;
    Ok(f)
}

/// `Err` with the reason when a process is still writing the run in `dir` (its `.lock`
/// is locked), or any shard of a sharded output folder. A run without a lock file (made
/// before locks existed) or whose lock is free is not being written.
pub(crate) fn refuse_locked(dir: &Path) -> Result<(), RunDirError> {
    let mut locks = vec![dir.join(LOCK)];
    if let Ok(shards) = fs::read_dir(dir.join(SHARDS)) {
        locks.extend(shards.flatten().map(|s| s.path().join(LOCK)));
    }
    for path in locks {
        let Ok(f) = File::open(&path) else {
            continue;
        };
        // A shared lock: readers never refuse each other, only a writer's exclusive lock.
        if let Err(fs::TryLockError::WouldBlock) = f.try_lock_shared() {
            let pid = fs::read_to_string(&path).unwrap_or_default();
            let run = path.parent().unwrap_or(dir);
            return Err(RunDirError::Locked {
                run: run.to_path_buf(),
                pid: match pid.trim() {
                    "" => "unknown",
                    p => p,
                }
                .to_string(),
            });
        }
    }
    Ok(())
}

impl Drop for RunDir {
    fn drop(&mut self) {
        // Done writing: the lock file goes, then the lock itself with the file.
        if self.lock.is_some() {
            let _ = fs::remove_file(self.path.join(LOCK));
        }
    }
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> RunDirError + '_ {
    move |err| RunDirError::Io {
        path: path.to_path_buf(),
        err,
    }
}

impl RunDir {
    /// Create `path` (its parents as needed); refuse it if it exists.
    pub(crate) fn create(path: &Path) -> Result<RunDir, RunDirError> {
        if let Some(parent) = path.parent()
            && !parent.as_os_str().is_empty()
        {
            fs::create_dir_all(parent).map_err(io_err(parent))?;
        }
        match fs::create_dir(path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                return Err(RunDirError::Exists(path.to_path_buf()));
            }
            Err(e) => return Err(io_err(path)(e)),
        }
        let lock = lock_run(path)?;
        let ex = path.join(EXCHANGES);
        fs::create_dir(&ex).map_err(io_err(&ex))?;
        Ok(RunDir {
            path: path.to_path_buf(),
            exchanges: ex,
            lock: Some(lock),
        })
    }

    /// Shard `index` of a sharded run into `out` (which may exist): its reports in
    /// `out/shards/INDEX/`, its parts in `out/exchanges/shard=INDEX/` (Hive-style
    /// partitions); either folder existing already is refused.
    pub(crate) fn create_shard(out: &Path, index: usize) -> Result<RunDir, RunDirError> {
        for dir in [&out.join(SHARDS), &out.join(EXCHANGES)] {
            fs::create_dir_all(dir).map_err(io_err(dir))?;
        }
        let mine = [shard_dir(out, index), shard_exchanges(out, index)];
        for dir in &mine {
            match fs::create_dir(dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    return Err(RunDirError::Exists(dir.clone()));
                }
                Err(e) => return Err(io_err(dir)(e)),
            }
        }
        let [path, exchanges] = mine;
        let lock = Some(lock_run(&path)?);
        Ok(RunDir {
            path,
            exchanges,
            lock,
        })
    }

    /// A run directory that already exists (summarize, recover, verdict).
    pub(crate) fn existing(path: &Path) -> RunDir {
        RunDir {
            path: path.to_path_buf(),
            exchanges: path.join(EXCHANGES),
            lock: None,
        }
    }

    pub(crate) fn exchanges(&self) -> PathBuf {
        self.exchanges.clone()
    }

    /// Write `bytes` to `name` atomically (temporary file, fsync, rename).
    pub(crate) fn write_file(&self, name: &str, bytes: &[u8]) -> Result<(), RunDirError> {
        let dest = self.path.join(name);
        let tmp = self.path.join(format!(".{name}.tmp"));
        let mut f = File::create(&tmp).map_err(io_err(&tmp))?;
        f.write_all(bytes).map_err(io_err(&tmp))?;
        f.sync_all().map_err(io_err(&tmp))?;
        drop(f);
        fs::rename(&tmp, &dest).map_err(io_err(&dest))?;
        File::open(&self.path)
            .and_then(|d| d.sync_all())
            .map_err(io_err(&self.path))
    }

    /// Copy the file at `from` to `rel` (a relative path, folders made as needed) in the
    /// run, through a temporary name and synced; returns the copy's SHA-256 (lowercase
    /// hex), so the caller can check that it copied what it read (a trace plan's trace).
    pub(crate) fn copy_in(&self, rel: &str, from: &Path) -> Result<String, RunDirError> {
        use sha2::{Digest, Sha256};
        use std::io::Read;
        let dest = self.path.join(rel);
        let parent = dest.parent().unwrap_or(&self.path).to_path_buf();
        fs::create_dir_all(&parent).map_err(io_err(&parent))?;
        let name = dest.file_name().map(|n| n.to_string_lossy().into_owned());
        let tmp = parent.join(format!(".{}.tmp", name.unwrap_or_default()));
        let mut src = File::open(from).map_err(io_err(from))?;
        let mut out = File::create(&tmp).map_err(io_err(&tmp))?;
        let (mut hash, mut buf) = (Sha256::new(), vec![0u8; 1 << 20]);
        loop {
            let n = src.read(&mut buf).map_err(io_err(from))?;
            if n == 0 {
                break;
            }
            hash.update(&buf[..n]);
            out.write_all(&buf[..n]).map_err(io_err(&tmp))?;
        }
        out.sync_all().map_err(io_err(&tmp))?;
        drop(out);
        fs::rename(&tmp, &dest).map_err(io_err(&dest))?;
        Ok(hex(&hash.finalize()))
    }

    pub(crate) fn write_json<T: Serialize>(&self, name: &str, v: &T) -> Result<(), RunDirError> {
        self.write_file(name, &json_bytes(v))
    }
}

/// Write `v` as JSON to any `path`, atomically as [`RunDir::write_json`] does in its
/// directory (`compare --out`, `verdict --out`).
pub(crate) fn write_json_at<T: Serialize>(path: &Path, v: &T) -> Result<(), RunDirError> {
    write_bytes_at(path, &json_bytes(v))
}

/// A JSON file's bytes as every JSON file of a run is written (pretty, one trailing
/// newline); `--json` prints the same bytes.
pub(crate) fn json_bytes<T: Serialize>(v: &T) -> Vec<u8> {
    let mut bytes = serde_json::to_vec_pretty(v).unwrap_or_default();
    bytes.push(b'\n');
    bytes
}

/// Write `bytes` to any `path`, atomically as [`RunDir::write_file`] does (`report --out`).
pub(crate) fn write_bytes_at(path: &Path, bytes: &[u8]) -> Result<(), RunDirError> {
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    RunDir::existing(parent).write_file(&name, bytes)
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

pub(crate) use crate::model::hex;

/// SHA-256 of the running binary (streamed, so a large binary costs no memory). Computed
/// once per process; call it first from a blocking context (it reads the whole binary).
pub(crate) fn binary_sha256() -> Option<String> {
    static HASH: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    HASH.get_or_init(hash_current_exe).clone()
}

fn hash_current_exe() -> Option<String> {
    let exe = std::env::current_exe().ok()?;
    let mut f = File::open(exe).ok()?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = io::Read::read(&mut f, &mut buf).ok()?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Some(hex(&h.finalize()))
}

/// Write one batch as a whole Parquet file at `path`: through a temporary name
/// (`.parquet.inprogress`), fsynced, then renamed, so a reader never sees half a file
/// (rounds.parquet and worker_metrics.parquet).
pub(crate) fn write_parquet(
    path: &Path,
    batch: &arrow_array::RecordBatch,
) -> Result<(), RunDirError> {
    let mut f = WholeFile::create(path, batch.schema())?;
    f.write(batch)?;
    f.finish()
}

/// A Parquet file written batch by batch under a temporary name (`.parquet.inprogress`),
/// each batch its own row group (nothing held beyond it), fsynced and renamed when
/// finished: a reader never sees half a file.
pub(crate) struct WholeFile {
    tmp: PathBuf,
    path: PathBuf,
    w: parquet::arrow::ArrowWriter<File>,
}

fn parquet_err(path: &Path) -> impl FnOnce(parquet::errors::ParquetError) -> RunDirError + '_ {
    move |err| RunDirError::Parquet {
        path: path.to_path_buf(),
        err,
    }
}

impl WholeFile {
    pub(crate) fn create(
        path: &Path,
        schema: arrow_schema::SchemaRef,
    ) -> Result<WholeFile, RunDirError> {
        let tmp = path.with_extension("parquet.inprogress");
        let file = File::create(&tmp).map_err(io_err(&tmp))?;
        let w =
            parquet::arrow::ArrowWriter::try_new(file, schema, None).map_err(parquet_err(&tmp))?;
        Ok(WholeFile {
            tmp,
            path: path.to_path_buf(),
            w,
        })
    }

    /// The name it is written under until it is finished.
    pub(crate) fn temporary(&self) -> &Path {
        &self.tmp
    }

    pub(crate) fn write(&mut self, batch: &arrow_array::RecordBatch) -> Result<(), RunDirError> {
        self.w.write(batch).map_err(parquet_err(&self.tmp))?;
        self.w.flush().map_err(parquet_err(&self.tmp))
    }

    pub(crate) fn finish(self) -> Result<(), RunDirError> {
        let file = self.w.into_inner().map_err(parquet_err(&self.tmp))?;
        file.sync_all().map_err(io_err(&self.tmp))?;
        fs::rename(&self.tmp, &self.path).map_err(io_err(&self.path))
    }
}
