//! `gpu.parquet`: device-wide GPU telemetry on the run's clock (`--gpu-metrics`), one row
//! per GPU, metric and sample, from `nvidia-smi --query-gpu` or a DCGM exporter's
//! `/metrics`. Long, so both sources share one schema.

use std::path::Path;
use std::sync::Arc;

use arrow_array::{
    ArrayRef, Float64Array, Int32Array, Int64Array, RecordBatch, StringArray,
    TimestampMicrosecondArray,
};
use arrow_schema::{DataType, Field, Schema, TimeUnit};

/// One value of one GPU at one instant.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct GpuRow {
    /// When the sample was read, µs from the run's t0 (the exchanges' clock).
    pub(crate) offset_us: i64,
    /// The same instant on the wall clock, µs since the Unix epoch (UTC).
    pub(crate) wall_time_us: i64,
    /// `nvidia-smi` or `dcgm`.
    pub(crate) source: &'static str,
    /// The GPU's index, as the source numbers it.
    pub(crate) gpu: Option<i32>,
    pub(crate) uuid: Option<String>,
    /// nvidia-smi's query field (`utilization.gpu`, `memory.used`, ...) or DCGM's metric.
    pub(crate) metric: String,
    pub(crate) value: f64,
    /// `%`, `MiB`, `W`, `C`, `MHz` for nvidia-smi's fields; `null` for DCGM's.
    pub(crate) unit: Option<&'static str>,
}

/// Why `gpu.parquet` was not written.
#[derive(Debug, thiserror::Error)]
pub(crate) enum GpuWriteError {
    /// The rows did not make a batch of the file's schema.
    #[error("{0}")]
    Batch(#[from] arrow_schema::ArrowError),
    #[error(transparent)]
    File(#[from] super::rundir::RunDirError),
}

/// Write `rows` to `path` (through a temporary name, fsynced, renamed); returns the rows
/// written.
pub(crate) fn write(path: &Path, rows: &[GpuRow]) -> Result<u64, GpuWriteError> {
    let arrays: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from_iter_values(
            rows.iter().map(|r| r.offset_us),
        )),
        Arc::new(
            TimestampMicrosecondArray::from_iter_values(rows.iter().map(|r| r.wall_time_us))
                .with_timezone("UTC"),
        ),
        Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.source))),
        Arc::new(Int32Array::from_iter(rows.iter().map(|r| r.gpu))),
        Arc::new(StringArray::from_iter(
            rows.iter().map(|r| r.uuid.as_deref()),
        )),
        Arc::new(StringArray::from_iter_values(
            rows.iter().map(|r| r.metric.as_str()),
        )),
        Arc::new(Float64Array::from_iter_values(rows.iter().map(|r| r.value))),
        Arc::new(StringArray::from_iter(rows.iter().map(|r| r.unit))),
    ];
    let schema = Arc::new(Schema::new(vec![
        Field::new("offset_us", DataType::Int64, false),
        Field::new(
            "wall_time",
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            false,
        ),
        Field::new("source", DataType::Utf8, false),
        Field::new("gpu", DataType::Int32, true),
        Field::new("uuid", DataType::Utf8, true),
        Field::new("metric", DataType::Utf8, false),
        Field::new("value", DataType::Float64, false),
        Field::new("unit", DataType::Utf8, true),
    ]));
    let batch = RecordBatch::try_new(schema, arrays)?;
    super::rundir::write_parquet(path, &batch)?;
    Ok(rows.len() as u64)
}

/// The units this version writes.
pub(crate) const UNITS: &[&str] = &["%", "MiB", "W", "C", "MHz"];

/// Every row of a `gpu.parquet` read back (the report's charts), in file order.
pub(crate) fn read(path: &Path) -> Result<Vec<GpuRow>, super::read::ReadError> {
    use super::read::column;
    let want = [
        "offset_us",
        "wall_time",
        "source",
        "gpu",
        "uuid",
        "metric",
        "value",
        "unit",
    ];
    let mut out = Vec::new();
    for batch in super::read::read_columns(path, &want)? {
        let b = batch.map_err(|e| super::read::ReadError::Batch {
            part: path.to_path_buf(),
            source: Arc::new(e),
        })?;
        let offset = column::<Int64Array>(&b, "offset_us", path)?;
        let wall = column::<TimestampMicrosecondArray>(&b, "wall_time", path)?;
        let source = column::<StringArray>(&b, "source", path)?;
        let gpu = column::<Int32Array>(&b, "gpu", path)?;
        let uuid = column::<StringArray>(&b, "uuid", path)?;
        let metric = column::<StringArray>(&b, "metric", path)?;
        let value = column::<Float64Array>(&b, "value", path)?;
        let unit = column::<StringArray>(&b, "unit", path)?;
        for i in 0..b.num_rows() {
            use arrow_array::Array;
            out.push(GpuRow {
                offset_us: offset.value(i),
                wall_time_us: wall.value(i),
                source: if source.value(i) == "dcgm" {
                    "dcgm"
                } else {
                    "nvidia-smi"
                },
                gpu: (!gpu.is_null(i)).then(|| gpu.value(i)),
                uuid: (!uuid.is_null(i)).then(|| uuid.value(i).to_string()),
                metric: metric.value(i).to_string(),
                value: value.value(i),
                unit: UNITS
                    .iter()
                    .find(|u| !unit.is_null(i) && unit.value(i) == **u)
                    .copied(),
            });
        }
    }
    Ok(out)
}
