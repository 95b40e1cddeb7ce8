//! One Parquet part, encoded a column at a time in short steps.
//!
//! The writer thread shares a core with the proxy it records. A step here is one column
//! of a batch of rows (or, for bodies, header lists and event times, the rows whose
//! values add up to [`STEP_BYTES`]): converted to Arrow, then encoded into that column's
//! pages. Between steps a [`Pacer`] may give the core back, so that a request never waits
//! behind more than one slice of encoding (serve). A row group closes between batches;
//! its pages are then copied into the file in one step, so a paced part keeps its row
//! groups small ([`PACED_GROUP_BYTES`]). The file is the same Parquet an `ArrowWriter`
//! writes (the Arrow schema in its metadata included): `ArrowWriter` is built first and
//! taken apart into its file writer and column-writer factory.

use std::fs::File;
use std::time::Duration;

use arrow_schema::SchemaRef;
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_writer::{ArrowColumnWriter, ArrowRowGroupWriterFactory, compute_leaves};
use parquet::errors::ParquetError;
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;

use super::ExchangeRecord;
use super::columns::COLUMNS;
use crate::clock;
use crate::redact::Redaction;

/// Rows of one row group, at most.
pub(super) const GROUP_ROWS: usize = 64 * 1024;
/// Encoded bytes of one row group, at most (as the writer estimates them while encoding).
const GROUP_BYTES: usize = 128 << 20;
/// ... when paced: a row group's pages are copied into the file in one step.
pub(super) const PACED_GROUP_BYTES: usize = 1 << 20;
/// Bytes of a wide column's values (bodies, header lists, event times) converted and
/// encoded in one step; a paced part's pages are this size too, so that compressing one
/// is not a long step.
pub(super) const STEP_BYTES: usize = 64 * 1024;

/// Gives the core back between steps once a slice of work has run for `budget`, and
/// measures the longest slice in CPU time.
pub(super) struct Pacer {
    budget: Option<Duration>,
    /// When the slice began ([`clock::now_ns`]).
    since_ns: u64,
    cpu_at: Duration,
    /// The longest slice of work between two pauses, in this thread's CPU time.
    pub(super) longest: Duration,
}

/// How long a paced writer sleeps between slices (the kernel's timer slack adds ~50 µs):
/// long enough for what waited to run.
const PAUSE: Duration = Duration::from_micros(20);

fn thread_cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(
        t.tv_sec.max(0) as u64,
        t.tv_nsec.clamp(0, 999_999_999) as u32,
    )
}

impl Pacer {
    /// `None`: never pause (replay encodes between its rounds).
    pub(super) fn new(budget: Option<Duration>) -> Pacer {
        Pacer {
            budget,
            since_ns: 0,
            cpu_at: Duration::ZERO,
            longest: Duration::ZERO,
        }
    }

    /// Work starts (after the writer waited for rows).
    pub(super) fn begin(&mut self) {
        if self.budget.is_some() {
            self.since_ns = clock::now_ns();
            self.cpu_at = thread_cpu();
        }
    }

    /// A step ended: pause when the slice has used its budget.
    pub(super) fn step(&mut self) {
        let Some(budget) = self.budget else { return };
        if clock::now_ns().saturating_sub(self.since_ns) < budget.as_nanos() as u64 {
            return;
        }
        self.end();
        std::thread::sleep(PAUSE);
        self.begin();
    }

    /// Work ends (the writer goes back to its queue): the slice is measured.
    pub(super) fn end(&mut self) {
        if self.budget.is_some() {
            self.longest = self.longest.max(thread_cpu().saturating_sub(self.cpu_at));
        }
    }
}

/// An open part: the file writer, the open row group's column writers (one per Parquet
/// leaf, in schema order) and where each of [`COLUMNS`] starts among them.
pub(super) struct PartEncoder {
    file: SerializedFileWriter<File>,
    factory: ArrowRowGroupWriterFactory,
    schema: SchemaRef,
    /// The open row group's writers; empty between row groups.
    leaves: Vec<ArrowColumnWriter>,
    group_index: usize,
    group_rows: usize,
    /// A row group closes at this many encoded bytes.
    group_bytes: usize,
    /// A wide column's step ends at this many bytes of values (all rows when unpaced).
    step_bytes: usize,
}

impl PartEncoder {
    pub(super) fn new(
        file: File,
        schema: &SchemaRef,
        props: WriterProperties,
        paced: bool,
    ) -> Result<PartEncoder, ParquetError> {
        let (file, factory) =
            ArrowWriter::try_new(file, schema.clone(), Some(props))?.into_serialized_writer()?;
        Ok(PartEncoder {
            file,
            factory,
            schema: schema.clone(),
            leaves: Vec::new(),
            group_index: 0,
            group_rows: 0,
            group_bytes: if paced {
                PACED_GROUP_BYTES
            } else {
                GROUP_BYTES
            },
            step_bytes: if paced { STEP_BYTES } else { usize::MAX },
        })
    }

    /// Encode `rows` into the part (redacting secrets), closing row groups as they fill.
    pub(super) fn write(
        &mut self,
        mut rows: &[ExchangeRecord],
        redact: &Redaction,
        pace: &mut Pacer,
    ) -> Result<(), ParquetError> {
        while !rows.is_empty() {
            if self.leaves.is_empty() {
                self.leaves = self.factory.create_column_writers(self.group_index)?;
            }
            let (now, rest) = rows.split_at(rows.len().min(GROUP_ROWS - self.group_rows));
            self.write_group(now, redact, pace)?;
            rows = rest;
            let bytes: usize = self
                .leaves
                .iter()
                .map(ArrowColumnWriter::get_estimated_total_bytes)
                .sum();
            if self.group_rows >= GROUP_ROWS || bytes >= self.group_bytes {
                self.close_group(pace)?;
            }
        }
        Ok(())
    }

    /// Every column of `rows` into the open row group, one step per column (or per
    /// [`STEP_BYTES`] of a wide column's values).
    fn write_group(
        &mut self,
        rows: &[ExchangeRecord],
        redact: &Redaction,
        pace: &mut Pacer,
    ) -> Result<(), ParquetError> {
        let mut leaf = 0;
        for (column, field) in COLUMNS.iter().zip(self.schema.fields()) {
            let mut start = 0;
            let mut n_leaves = 0;
            while start < rows.len() {
                let end = column.step_end(rows, start, self.step_bytes);
                let array = column.array(&rows[start..end], redact);
                let leaves = compute_leaves(field, &array)?;
                n_leaves = leaves.len();
                for (writer, values) in self.leaves[leaf..].iter_mut().zip(&leaves) {
                    writer.write(values)?;
                }
                pace.step();
                start = end;
            }
            leaf += n_leaves;
        }
        self.group_rows += rows.len();
        Ok(())
    }

    /// Close the open row group: each column's last page (a step each), then its pages
    /// into the file (one step, bounded by the row group's size).
    fn close_group(&mut self, pace: &mut Pacer) -> Result<(), ParquetError> {
        let mut chunks = Vec::with_capacity(self.leaves.len());
        for writer in self.leaves.drain(..) {
            chunks.push(writer.close()?);
            pace.step();
        }
        let mut group = self.file.next_row_group()?;
        for chunk in chunks {
            chunk.append_to_row_group(&mut group)?;
        }
        group.close()?;
        pace.step();
        self.group_index += 1;
        self.group_rows = 0;
        Ok(())
    }

    /// Close the last row group and write the footer; the file is returned to be synced.
    pub(super) fn finish(mut self, pace: &mut Pacer) -> Result<File, ParquetError> {
        if self.group_rows > 0 {
            self.close_group(pace)?;
        }
        self.file.into_inner()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::columns::exchange_schema;
    use crate::record::tests_support::row;
    use arrow_array::{BinaryArray, Int64Array};
    use bytes::Bytes;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    use parquet::basic::{Compression, ZstdLevel};

    /// `n` rows with distinct, barely compressible 1 KiB response bodies and two headers.
    fn rows(n: usize) -> Vec<ExchangeRecord> {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        (0..n)
            .map(|i| {
                let mut r = row(i as i64, b"{}");
                let body: Vec<u8> = (0..1024)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        b'a' + (x % 26) as u8
                    })
                    .collect();
                r.response_body = Bytes::from(body);
                r.response_body_len = 1024;
                let mut h = http::HeaderMap::new();
                h.insert("content-type", "application/json".parse().unwrap());
                h.insert("x-request-id", format!("req-{i}").parse().unwrap());
                r.response_headers = h;
                r
            })
            .collect()
    }

    struct Read {
        ids: Vec<i64>,
        bodies: Vec<Vec<u8>>,
        row_groups: Vec<i64>,
        arrow_schema_in_metadata: bool,
    }

    /// Encode `rows` (paced with a zero budget, or not) in batches of 1,000 and read the
    /// part back.
    fn encode(rows: &[ExchangeRecord], paced: bool) -> Read {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.parquet");
        let mut props = WriterProperties::builder()
            .set_compression(Compression::ZSTD(ZstdLevel::try_new(1).unwrap()));
        if paced {
            props = props.set_data_page_size_limit(STEP_BYTES);
        }
        let schema = exchange_schema();
        let file = File::create(&path).unwrap();
        let mut enc = PartEncoder::new(file, &schema, props.build(), paced).unwrap();
        let mut pace = Pacer::new(paced.then_some(Duration::ZERO));
        for batch in rows.chunks(1000) {
            enc.write(batch, &Redaction::default(), &mut pace).unwrap();
        }
        enc.finish(&mut pace).unwrap().sync_all().unwrap();
        let builder = ParquetRecordBatchReaderBuilder::try_new(File::open(&path).unwrap()).unwrap();
        let meta = builder.metadata().clone();
        let mut read = Read {
            ids: Vec::new(),
            bodies: Vec::new(),
            row_groups: meta.row_groups().iter().map(|g| g.num_rows()).collect(),
            arrow_schema_in_metadata: meta
                .file_metadata()
                .key_value_metadata()
                .is_some_and(|kv| kv.iter().any(|e| e.key == "ARROW:schema")),
        };
        for batch in builder.build().unwrap() {
            let batch = batch.unwrap();
            let ids = batch.column_by_name("exchange_id").unwrap();
            let ids = ids.as_any().downcast_ref::<Int64Array>().unwrap();
            read.ids.extend(ids.values().iter().copied());
            let bodies = batch.column_by_name("response_body").unwrap();
            let bodies = bodies.as_any().downcast_ref::<BinaryArray>().unwrap();
            read.bodies
                .extend(bodies.iter().map(|b| b.unwrap().to_vec()));
        }
        read
    }

    #[test]
    fn a_paced_part_holds_the_same_rows_in_row_groups_of_about_a_mebibyte() {
        let rows = rows(5_000);
        let plain = encode(&rows, false);
        let paced = encode(&rows, true);
        let want: Vec<i64> = (0..5_000).collect();
        assert_eq!(plain.ids, want);
        assert_eq!(paced.ids, want);
        assert_eq!(plain.bodies, paced.bodies);
        assert_eq!(paced.bodies[4_321], rows[4_321].response_body.to_vec());
        assert!(plain.arrow_schema_in_metadata && paced.arrow_schema_in_metadata);
        // Unpaced: one row group. Paced: ~5 MB of bodies (zstd cannot shrink random
        // letters below ~60 %) in groups closed at 1 MiB, between batches of 1,000 rows.
        assert_eq!(plain.row_groups, vec![5_000]);
        assert!(
            paced.row_groups.len() >= 3 && paced.row_groups.iter().all(|&n| n % 1_000 == 0),
            "{:?}",
            paced.row_groups
        );
        assert_eq!(paced.row_groups.iter().sum::<i64>(), 5_000);
    }

    #[test]
    fn a_row_group_closes_at_65536_rows_even_within_a_batch() {
        let rows: Vec<ExchangeRecord> = (0..70_000).map(|i| row(i, b"")).collect();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.parquet");
        let schema = exchange_schema();
        let file = File::create(&path).unwrap();
        let props = WriterProperties::builder().build();
        let mut enc = PartEncoder::new(file, &schema, props, false).unwrap();
        let mut pace = Pacer::new(None);
        // One call larger than a row group: it is split at the boundary.
        enc.write(&rows, &Redaction::default(), &mut pace).unwrap();
        drop(enc.finish(&mut pace).unwrap());
        let builder = ParquetRecordBatchReaderBuilder::try_new(File::open(&path).unwrap()).unwrap();
        let groups: Vec<i64> = builder
            .metadata()
            .row_groups()
            .iter()
            .map(|g| g.num_rows())
            .collect();
        assert_eq!(groups, vec![65_536, 70_000 - 65_536]);
    }

    #[test]
    fn the_pacer_sleeps_between_slices_only_when_it_has_a_budget() {
        // A zero budget: every step ends a slice and sleeps at least PAUSE.
        let mut paced = Pacer::new(Some(Duration::ZERO));
        let t = clock::now_ns();
        paced.begin();
        for _ in 0..50 {
            paced.step();
        }
        paced.end();
        let took = Duration::from_nanos(clock::now_ns() - t);
        assert!(took >= PAUSE * 50, "{took:?}");
        // A slice of busy work is measured in CPU time.
        let mut measured = Pacer::new(Some(Duration::from_secs(60)));
        measured.begin();
        let spin = clock::now_ns();
        let mut x = 0u64;
        while clock::now_ns() - spin < 3_000_000 {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        measured.step();
        measured.end();
        let wall = Duration::from_nanos(clock::now_ns() - spin);
        assert!(measured.longest > Duration::ZERO && measured.longest <= wall * 2);
        // No budget: never sleeps, measures nothing.
        let mut free = Pacer::new(None);
        free.begin();
        free.step();
        free.end();
        assert_eq!(free.longest, Duration::ZERO);
    }
}
