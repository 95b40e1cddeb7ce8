//! `worker_metrics.parquet`: every sample of every scrape of the worker's `/metrics`
//! (`--worker-metrics`), one row each, on the run's clock. A histogram's buckets are rows
//! of `metric_bucket` with their `le` label, as the worker wrote them.

use std::path::Path;
use std::sync::Arc;

use arrow_array::builder::{MapBuilder, StringBuilder};
use arrow_array::{
    Array, ArrayRef, Float64Array, Int32Array, Int64Array, RecordBatch, StringArray,
    TimestampMicrosecondArray,
};
use arrow_schema::{DataType, Field, Schema, TimeUnit};

/// The measured round a round-edge scrape belongs to.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RoundId {
    pub(crate) case_name: Arc<str>,
    /// A closed-loop round's concurrency, or an open one's rate.
    pub(crate) concurrency: Option<i32>,
    pub(crate) target_rate_per_second: Option<f64>,
    pub(crate) repetition: i32,
}

/// One sample of one scrape.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ScrapeRow {
    /// When the scrape was sent, µs from the run's t0 (the exchanges' clock).
    pub(crate) offset_us: i64,
    /// The same instant on the wall clock, µs since the Unix epoch (UTC).
    pub(crate) wall_time_us: i64,
    /// `interval`, `round_start` or `round_end` (replay); `run_start` or `run_end` (serve).
    pub(crate) cause: &'static str,
    /// At a round's edge, the round (as summary.json's rounds and rounds.parquet name it).
    pub(crate) round: Option<RoundId>,
    /// The campaign arm whose worker was scraped (`None` for a plain plan or serve).
    pub(crate) arm: Option<Arc<str>>,
    pub(crate) metric: String,
    pub(crate) labels: Vec<(String, String)>,
    pub(crate) value: f64,
    /// The family's kind (`counter`, `gauge`, `histogram`, `summary`, `untyped`).
    pub(crate) kind: String,
}

/// Why `worker_metrics.parquet` was not written whole.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SinkError {
    /// The rows did not make a batch of the file's schema.
    #[error("{0}")]
    Batch(#[from] arrow_schema::ArrowError),
    /// The file could not be created, written or finished.
    #[error(transparent)]
    File(#[from] super::rundir::RunDirError),
    #[error("cannot start the worker metrics writer: {0}")]
    Spawn(#[source] std::io::Error),
    #[error("the worker metrics writer panicked")]
    Panicked,
}

/// Rows gathered before they are written as one row group.
const ROW_GROUP: usize = 16_384;

/// `worker_metrics.parquet` written as the scrapes arrive, from a thread of its own, so a
/// long run holds at most one row group of samples (never every scrape): scrapers send
/// each scrape's rows; [`Sink::finish`] writes the rest and closes the file. The rows are
/// in the order the scrapes ended (sort by `offset_us` to read them in time order).
pub(crate) struct Sink {
    tx: std::sync::mpsc::SyncSender<Vec<ScrapeRow>>,
    thread: std::thread::JoinHandle<Result<u64, SinkError>>,
}

/// What [`Sink::finish`] sends: no rows, the end.
const END: Vec<ScrapeRow> = Vec::new();

impl Sink {
    /// Create the file (under its temporary name) and start the writer thread; at most
    /// `queue` scrapes wait for it (a sender's `try_send` fails past them: the caller drops
    /// and counts the rows rather than hold them).
    pub(crate) fn start(path: &Path, queue: usize) -> Result<Sink, SinkError> {
        let mut file = super::rundir::WholeFile::create(path, batch(&[])?.schema())?;
        let tmp = file.temporary().to_path_buf();
        let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<ScrapeRow>>(queue);
        let thread = std::thread::Builder::new()
            .name("worker-metrics".into())
            .spawn(move || {
                let mut held: Vec<ScrapeRow> = Vec::new();
                let mut written = 0u64;
                let write = || -> Result<u64, SinkError> {
                    // Every scrape's rows until the end (an empty message) or every
                    // sender is gone.
                    for rows in rx {
                        if rows.is_empty() {
                            break;
                        }
                        held.extend(rows);
                        if held.len() >= ROW_GROUP {
                            file.write(&batch(&held)?)?;
                            written += held.len() as u64;
                            held.clear();
                        }
                    }
                    if !held.is_empty() {
                        file.write(&batch(&held)?)?;
                        written += held.len() as u64;
                    }
                    file.finish()?;
                    Ok(written)
                };
                let done = write();
                // A file that could not be finished is unreadable: not left behind.
                if done.is_err() {
                    let _ = std::fs::remove_file(&tmp);
                }
                done
            })
            .map_err(SinkError::Spawn)?;
        Ok(Sink { tx, thread })
    }

    /// Where a scraper sends each scrape's rows.
    pub(crate) fn sender(&self) -> std::sync::mpsc::SyncSender<Vec<ScrapeRow>> {
        self.tx.clone()
    }

    /// Write what is left and close the file (blocking: call it off the runtime, after
    /// every scraper stopped). Returns the rows written.
    pub(crate) fn finish(self) -> Result<u64, SinkError> {
        let _ = self.tx.send(END);
        self.thread.join().map_err(|_| SinkError::Panicked)?
    }
}

/// `rows` as one batch of worker_metrics.parquet's schema.
fn batch(rows: &[ScrapeRow]) -> Result<RecordBatch, arrow_schema::ArrowError> {
    let mut labels = MapBuilder::new(None, StringBuilder::new(), StringBuilder::new());
    for r in rows {
        for (k, v) in &r.labels {
            labels.keys().append_value(k);
            labels.values().append_value(v);
        }
        labels.append(true)?;
    }
    let labels = labels.finish();
    let arrays: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from_iter_values(
            rows.iter().map(|r| r.offset_us),
        )),
        Arc::new(
            TimestampMicrosecondArray::from_iter_values(rows.iter().map(|r| r.wall_time_us))
                .with_timezone("UTC"),
        ),
        Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.cause))),
        Arc::new(StringArray::from_iter(
            rows.iter().map(|r| r.round.as_ref().map(|x| &*x.case_name)),
        )),
        Arc::new(Int32Array::from_iter(
            rows.iter()
                .map(|r| r.round.as_ref().and_then(|x| x.concurrency)),
        )),
        Arc::new(Float64Array::from_iter(rows.iter().map(|r| {
            r.round.as_ref().and_then(|x| x.target_rate_per_second)
        }))),
        Arc::new(Int32Array::from_iter(
            rows.iter().map(|r| r.round.as_ref().map(|x| x.repetition)),
        )),
        Arc::new(StringArray::from_iter(
            rows.iter().map(|r| r.arm.as_deref()),
        )),
        Arc::new(StringArray::from_iter_values(
            rows.iter().map(|r| r.metric.as_str()),
        )),
        Arc::new(labels.clone()),
        Arc::new(Float64Array::from_iter_values(rows.iter().map(|r| r.value))),
        Arc::new(StringArray::from_iter_values(
            rows.iter().map(|r| r.kind.as_str()),
        )),
    ];
    let schema = Arc::new(Schema::new(vec![
        Field::new("offset_us", DataType::Int64, false),
        Field::new(
            "wall_time",
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            false,
        ),
        Field::new("cause", DataType::Utf8, false),
        Field::new("case_name", DataType::Utf8, true),
        Field::new("concurrency", DataType::Int32, true),
        Field::new("target_rate_per_second", DataType::Float64, true),
        Field::new("repetition", DataType::Int32, true),
        Field::new("arm", DataType::Utf8, true),
        Field::new("metric", DataType::Utf8, false),
        Field::new("labels", labels.data_type().clone(), false),
        Field::new("value", DataType::Float64, false),
        Field::new("type", DataType::Utf8, false),
    ]));
    RecordBatch::try_new(schema, arrays)
}

/// A row's cause as one this version writes, or why the file is not one it reads.
fn known_cause(
    cause: &str,
    path: &Path,
    row: usize,
) -> Result<&'static str, super::read::ReadError> {
    match cause {
        "interval" => Ok("interval"),
        "round_start" => Ok("round_start"),
        "round_end" => Ok("round_end"),
        "run_start" => Ok("run_start"),
        "run_end" => Ok("run_end"),
        other => Err(super::read::ReadError::UnknownCause {
            part: path.to_path_buf(),
            row,
            cause: other.to_string(),
        }),
    }
}

fn labels_not_strings(path: &Path, side: &'static str) -> super::read::ReadError {
    super::read::ReadError::LabelsNotStrings {
        part: path.to_path_buf(),
        side,
    }
}

/// The rows of a `worker_metrics.parquet` that `keep(cause, metric)` wants, read back in
/// file order (`report`; a long run's file holds millions of rows, most of them never
/// drawn).
pub(crate) fn read(
    path: &Path,
    keep: impl Fn(&str, &str) -> bool,
) -> Result<Vec<ScrapeRow>, super::read::ReadError> {
    use super::read::column;
    use arrow_array::MapArray;
    let want = [
        "offset_us",
        "wall_time",
        "cause",
        "case_name",
        "concurrency",
        "target_rate_per_second",
        "repetition",
        "arm",
        "metric",
        "labels",
        "value",
        "type",
    ];
    let mut out = Vec::new();
    for batch in super::read::read_columns(path, &want)? {
        let b = batch.map_err(|e| super::read::ReadError::Batch {
            part: path.to_path_buf(),
            source: Arc::new(e),
        })?;
        let offset = column::<Int64Array>(&b, "offset_us", path)?;
        let wall = column::<TimestampMicrosecondArray>(&b, "wall_time", path)?;
        let cause = column::<StringArray>(&b, "cause", path)?;
        let case = column::<StringArray>(&b, "case_name", path)?;
        let conc = column::<Int32Array>(&b, "concurrency", path)?;
        let rate = column::<Float64Array>(&b, "target_rate_per_second", path)?;
        let rep = column::<Int32Array>(&b, "repetition", path)?;
        // Runs written before campaigns were scraped have no arm column.
        let arm = b
            .column_by_name("arm")
            .and_then(|c| c.as_any().downcast_ref::<StringArray>());
        let metric = column::<StringArray>(&b, "metric", path)?;
        let labels = column::<MapArray>(&b, "labels", path)?;
        let value = column::<Float64Array>(&b, "value", path)?;
        let kind = column::<StringArray>(&b, "type", path)?;
        for i in 0..b.num_rows() {
            if !keep(cause.value(i), metric.value(i)) {
                continue;
            }
            let cause = known_cause(cause.value(i), path, i)?;
            let round = (!case.is_null(i)).then(|| RoundId {
                case_name: case.value(i).into(),
                concurrency: (!conc.is_null(i)).then(|| conc.value(i)),
                target_rate_per_second: (!rate.is_null(i)).then(|| rate.value(i)),
                repetition: if rep.is_null(i) { 0 } else { rep.value(i) },
            });
            let entries = labels.value(i);
            let keys = entries
                .column(0)
                .as_any()
                .downcast_ref::<StringArray>()
                .ok_or_else(|| labels_not_strings(path, "keys"))?;
            let values = entries
                .column(1)
                .as_any()
                .downcast_ref::<StringArray>()
                .ok_or_else(|| labels_not_strings(path, "values"))?;
            out.push(ScrapeRow {
                offset_us: offset.value(i),
                wall_time_us: wall.value(i),
                cause,
                round,
                arm: arm.filter(|a| !a.is_null(i)).map(|a| a.value(i).into()),
                metric: metric.value(i).to_string(),
                labels: (0..keys.len())
                    .map(|j| (keys.value(j).to_string(), values.value(j).to_string()))
                    .collect(),
                value: value.value(i),
                kind: kind.value(i).to_string(),
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(i: usize) -> ScrapeRow {
        ScrapeRow {
            offset_us: i as i64,
            wall_time_us: 1_700_000_000_000_000 + i as i64,
            cause: if i.is_multiple_of(2) {
                "interval"
            } else {
                "round_end"
            },
            round: (i % 2 == 1).then(|| RoundId {
                case_name: "c".into(),
                concurrency: Some(4),
                target_rate_per_second: None,
                repetition: 1,
            }),
            arm: i.is_multiple_of(3).then(|| Arc::from("a")),
            metric: format!("m{}", i % 7),
            labels: vec![("le".into(), format!("{i}")), ("model".into(), "x".into())],
            value: i as f64 * 0.5,
            kind: "gauge".into(),
        }
    }

    #[test]
    fn the_sink_writes_row_groups_as_rows_arrive_and_reads_back_whole() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("worker_metrics.parquet");
        let sink = Sink::start(&path, 4).unwrap_or_else(|e| panic!("{e}"));
        let n = 2 * ROW_GROUP + 100;
        let all: Vec<ScrapeRow> = (0..n).map(row).collect();
        let tx = sink.sender();
        for chunk in all.chunks(1000) {
            tx.send(chunk.to_vec()).unwrap_or_else(|e| panic!("{e}"));
        }
        // A sender still alive does not hold the file open: finish ends it.
        assert_eq!(sink.finish().map_err(|e| e.to_string()), Ok(n as u64));
        assert!(!path.with_extension("parquet.inprogress").exists());
        let f = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{e}"));
        let meta = parquet::file::reader::SerializedFileReader::new(f)
            .map(|r| parquet::file::reader::FileReader::metadata(&r).num_row_groups())
            .unwrap_or_else(|e| panic!("{e}"));
        // A group once 17 chunks of 1000 are held (the first past ROW_GROUP); the rest at the end.
        assert_eq!(
            meta, 2,
            "a row group at every {ROW_GROUP} rows, never the whole run"
        );
        assert_eq!(read(&path, |_, _| true).expect("read back"), all.clone());
        let kept =
            read(&path, |cause, metric| cause != "interval" || metric == "m3").unwrap_or_default();
        let want: Vec<ScrapeRow> = all
            .into_iter()
            .filter(|r| r.cause != "interval" || r.metric == "m3")
            .collect();
        assert_eq!(kept, want);
    }
}
