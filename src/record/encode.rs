//! One Parquet part, encoded a column at a time in short steps.
//!
//! The writer thread shares a core with the proxy it records. A step here is one column
//! of some rows (for a column of variable-size values, the rows whose values first reach
//! [`STEP_BYTES`]): converted to Arrow, then encoded into that column's pages. Between
//! steps a [`Pacer`] may give the core back, so that a request waits behind one slice of
//! encoding and one step rather than a whole batch (serve). A row group's pages are
//! copied into the file in one step, and the footer is written in one, so a paced part
//! keeps its row groups small ([`PACED_GROUP_BYTES`]; the writer's batches are no larger
//! when paced). The file is built as an `ArrowWriter` builds it (the writer is
//! created first and taken apart into its file writer and column-writer factory, so the
//! Arrow schema and key-value metadata are its), and row groups close by its rule: at
//! 65,536 rows, or before the rows would take the estimated encoded bytes past the limit.

use std::fs::File;
use std::time::Duration;

use arrow_schema::SchemaRef;
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_writer::{ArrowColumnWriter, ArrowRowGroupWriterFactory, compute_leaves};
use parquet::errors::ParquetError;
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;

use super::columns::COLUMNS;
use super::row::ExchangeRecord;
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
/// measures the longest slice in the thread's CPU time. A slice runs from the thread's
/// last rest (a yield here, or the writer's sleep on its queue) to its next one, so work
/// split over several calls is still one slice.
pub(super) struct Pacer {
    budget: Option<Duration>,
    /// When the slice began ([`clock::now_ns`]) and the thread's CPU time then.
    since_ns: u64,
    cpu_at_ns: u64,
    /// The thread rested since the slice began: the next work starts a new slice.
    rested: bool,
    /// The longest slice of work between two rests, in this thread's CPU time.
    pub(super) longest: Duration,
    /// Slices that ended by giving the core back ([`Pacer::step`]).
    pub(super) pauses: u64,
    /// The writer is behind (its queue half full, so requests will soon wait for room in
    /// it): work runs unpaced until it catches up ([`Pacer::behind`]).
    behind: bool,
}

impl Pacer {
    /// `None`: never pause, measure nothing (replay encodes between its rounds).
    pub(super) fn new(budget: Option<Duration>) -> Pacer {
        Pacer {
            budget,
            since_ns: 0,
            cpu_at_ns: 0,
            rested: true,
            longest: Duration::ZERO,
            pauses: 0,
            behind: false,
        }
    }

    /// Work starts: a new slice if the thread rested since the last one, else the same.
    pub(super) fn begin(&mut self) {
        if self.budget.is_some() && self.rested {
            self.rested = false;
            self.since_ns = clock::now_ns();
            self.cpu_at_ns = clock::thread_cpu_ns();
        }
    }

    /// Whether the writer is behind: while it is, steps do not give the core back. A
    /// yielding writer gets the core only when the scheduler's turn comes back to it; on a
    /// core that serve keeps busy that is too rarely to keep up (measured: under 1,000
    /// connections its queue filled and held every client), and once rows wait for room
    /// the writer, not a slice of it, is what requests wait behind.
    pub(super) fn behind(&mut self, behind: bool) {
        self.behind = behind;
    }

    /// A step ended: pause when the slice has used its budget (and the writer is not
    /// behind).
    pub(super) fn step(&mut self) {
        let Some(budget) = self.budget else { return };
        self.begin();
        if self.behind || clock::now_ns().saturating_sub(self.since_ns) < budget.as_nanos() as u64 {
            return;
        }
        self.measure();
        // Give the core to whatever waits for it (a request woken while the slice ran,
        // the upstream on the same core), and go on at once when nothing does: a
        // `sched_yield`, not a sleep, so a slice costs no timer and no switch when the
        // core is free (a 20 µs sleep here was 16 % of serve's recorder thread, each one
        // two switches and the kernel's timer slack).
        std::thread::yield_now();
        self.pauses += 1;
        self.rested = true;
        self.begin();
    }

    /// Work stopped for now (the slice may go on if no rest follows): measure it.
    pub(super) fn end(&mut self) {
        if self.budget.is_some() && !self.rested {
            self.measure();
        }
    }

    /// The thread is about to sleep (waiting for rows): the slice ends here, measured,
    /// and the next work starts a new one.
    pub(super) fn rest(&mut self) {
        self.end();
        self.rested = true;
    }

    fn measure(&mut self) {
        let ns = clock::thread_cpu_ns().saturating_sub(self.cpu_at_ns);
        self.longest = self.longest.max(Duration::from_nanos(ns));
    }
}

/// An open part: the file writer and the open row group's column writers (one per
/// Parquet leaf, in schema order; a header list has two).
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
    /// An error left the part unfinishable (some columns hold rows others do not, or a
    /// row group was half written): it stays `.inprogress`, and the ledger counts its rows.
    failed: bool,
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
            failed: false,
        })
    }

    /// Encode `rows` into the part (redacting secrets), closing row groups as they fill.
    /// After an error the part cannot be finished ([`PartEncoder::finish`] refuses): it
    /// stays `.inprogress`, and `recover` counts its rows as lost from the ledger.
    pub(super) fn write(
        &mut self,
        rows: &[ExchangeRecord],
        redact: &Redaction,
        pace: &mut Pacer,
    ) -> Result<(), ParquetError> {
        if self.failed {
            return Err(ParquetError::General(
                "an earlier error left the part unfinished".into(),
            ));
        }
        let written = self.write_rows(rows, redact, pace);
        self.failed = written.is_err();
        written
    }

    fn write_rows(
        &mut self,
        mut rows: &[ExchangeRecord],
        redact: &Redaction,
        pace: &mut Pacer,
    ) -> Result<(), ParquetError> {
        while !rows.is_empty() {
            if self.leaves.is_empty() {
                self.leaves = self.factory.create_column_writers(self.group_index)?;
                pace.step();
            }
            let Some(fit) = self.rows_that_fit() else {
                self.close_group(pace)?;
                continue;
            };
            let (now, rest) = rows.split_at(rows.len().min(fit));
            self.write_group(now, redact, pace)?;
            rows = rest;
            // A group full by rows closes at once; one past its byte limit closes at the
            // next write (rows_that_fit). Closing that one at once too made a row group of
            // every paced batch (the estimate counts the open page uncompressed) and, in a
            // fresh process, serve's p99 at c = 1 went from ~1 ms to ~16 ms.
            if self.group_rows >= GROUP_ROWS {
                self.close_group(pace)?;
            }
        }
        Ok(())
    }

    /// The open row group's encoded bytes, as its column writers estimate them.
    fn group_encoded_bytes(&self) -> usize {
        self.leaves
            .iter()
            .map(ArrowColumnWriter::get_estimated_total_bytes)
            .sum()
    }

    /// How many more rows the open row group takes: up to 65,536 rows, and, once it holds
    /// some, as many as its average encoded row size says fit under the byte limit
    /// (`ArrowWriter`'s rule). `None`: it is full.
    fn rows_that_fit(&self) -> Option<usize> {
        let rows = GROUP_ROWS - self.group_rows;
        if self.group_rows == 0 {
            return Some(rows);
        }
        let bytes = self.group_encoded_bytes();
        let fit = match bytes.checked_div(self.group_rows) {
            Some(0) | None => rows,
            Some(per_row) => self.group_bytes.saturating_sub(bytes) / per_row,
        };
        (bytes < self.group_bytes && fit > 0 && rows > 0).then_some(rows.min(fit))
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
        if self.failed {
            return Err(ParquetError::General(
                "an earlier error left the part unfinished".into(),
            ));
        }
        if self.group_rows > 0 {
            self.close_group(pace)?;
        }
        self.file.into_inner()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::StreamColumns;
    use crate::record::columns::{exchange_schema, to_batch};
    use crate::record::tests_support::row;
    use arrow_array::{Array, RecordBatch};
    use bytes::Bytes;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    use parquet::basic::{Compression, ZstdLevel};

    /// `n` rows with distinct, barely compressible 1 KiB response bodies, a secret and a
    /// plain header, and every third row a stream with its event times.
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
                h.insert("authorization", format!("Bearer sk-{i}").parse().unwrap());
                h.insert("x-request-id", format!("req-{i}").parse().unwrap());
                r.request_headers = std::sync::Arc::new(h);
                if i % 3 == 0 {
                    r.stream = Some(StreamColumns {
                        event_count: (i % 50) as i64,
                        event_offsets_us: (0..(i % 50) as i64).map(|e| e * 10).collect(),
                        content_offsets_us: (0..(i % 7) as i64).collect(),
                        ttft_us: Some(5),
                        tpot_us: None,
                        output_tokens: Some(3),
                        output_tokens_source: "usage",
                        prompt_tokens: None,
                        cached_prompt_tokens: None,
                        done_seen: true,
                    });
                }
                r
            })
            .collect()
    }

    struct Read {
        batches: Vec<RecordBatch>,
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
            pace.begin();
            enc.write(batch, &Redaction::default(), &mut pace).unwrap();
            pace.end();
        }
        enc.finish(&mut pace).unwrap().sync_all().unwrap();
        let builder = ParquetRecordBatchReaderBuilder::try_new(File::open(&path).unwrap()).unwrap();
        let meta = builder.metadata().clone();
        Read {
            batches: builder.build().unwrap().map(|b| b.unwrap()).collect(),
            row_groups: meta.row_groups().iter().map(|g| g.num_rows()).collect(),
            arrow_schema_in_metadata: meta
                .file_metadata()
                .key_value_metadata()
                .is_some_and(|kv| kv.iter().any(|e| e.key == "ARROW:schema")),
        }
    }

    /// Every column of what was read equals what `to_batch` makes of the same rows.
    fn assert_holds(read: &Read, rows: &[ExchangeRecord]) {
        let schema = exchange_schema();
        let mut at = 0;
        for batch in &read.batches {
            let want = to_batch(
                &rows[at..at + batch.num_rows()],
                &Redaction::default(),
                &schema,
            )
            .unwrap();
            for (i, field) in schema.fields().iter().enumerate() {
                assert_eq!(
                    batch.column(i).to_data(),
                    want.column(i).to_data(),
                    "column {} at row {at}",
                    field.name()
                );
            }
            at += batch.num_rows();
        }
        assert_eq!(at, rows.len());
    }

    #[test]
    fn a_part_encoded_a_column_at_a_time_holds_every_column_of_every_row() {
        let rows = rows(5_000);
        let plain = encode(&rows, false);
        let paced = encode(&rows, true);
        assert_holds(&plain, &rows);
        assert_holds(&paced, &rows);
        assert!(plain.arrow_schema_in_metadata && paced.arrow_schema_in_metadata);
        // The secret header went through the redaction (to_batch's, compared above) and
        // its value is nowhere in the file's bodies or header values.
        let values = paced.batches[0].column_by_name("request_headers").unwrap();
        assert!(!format!("{values:?}").contains("sk-1"));
        // Unpaced: one row group. Paced: ~5 MB of bodies (zstd cannot shrink random
        // letters below ~60 %) in groups closed near 1 MiB.
        assert_eq!(plain.row_groups, vec![5_000]);
        assert!(paced.row_groups.len() >= 4, "{:?}", paced.row_groups);
        assert_eq!(paced.row_groups.iter().sum::<i64>(), 5_000);
    }

    #[test]
    fn a_row_group_closes_at_65536_rows_even_within_a_batch() {
        for paced in [false, true] {
            let rows: Vec<ExchangeRecord> = (0..70_000).map(|i| row(i, b"")).collect();
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("p.parquet");
            let schema = exchange_schema();
            let file = File::create(&path).unwrap();
            let props = WriterProperties::builder().build();
            let mut enc = PartEncoder::new(file, &schema, props, paced).unwrap();
            let mut pace = Pacer::new(None);
            if paced {
                // In the writer's batches (a paced writer's are small).
                for batch in rows.chunks(1024) {
                    enc.write(batch, &Redaction::default(), &mut pace).unwrap();
                }
            } else {
                // One call larger than a row group: it is split at the boundary.
                enc.write(&rows, &Redaction::default(), &mut pace).unwrap();
            }
            drop(enc.finish(&mut pace).unwrap());
            let builder =
                ParquetRecordBatchReaderBuilder::try_new(File::open(&path).unwrap()).unwrap();
            let groups: Vec<i64> = builder
                .metadata()
                .row_groups()
                .iter()
                .map(|g| g.num_rows())
                .collect();
            if paced {
                // ~21 encoded bytes a row: the 1 MiB limit closes groups first.
                assert!(
                    groups.len() >= 2 && groups.iter().all(|&n| n < 65_536),
                    "{groups:?}"
                );
                assert_eq!(groups.iter().sum::<i64>(), 70_000);
            } else {
                assert_eq!(groups, vec![65_536, 70_000 - 65_536]);
            }
        }
    }

    #[test]
    fn the_pacer_gives_the_core_back_between_slices_only_when_it_has_a_budget() {
        // A zero budget: every step ends a slice and gives the core back.
        let mut paced = Pacer::new(Some(Duration::ZERO));
        let fifty_steps = |p: &mut Pacer| {
            p.begin();
            (0..50).for_each(|_| p.step());
            p.end();
        };
        fifty_steps(&mut paced);
        assert_eq!(paced.pauses, 50);
        // Behind, it keeps the core: no pause until it has caught up.
        paced.behind(true);
        fifty_steps(&mut paced);
        assert_eq!(paced.pauses, 50);
        paced.behind(false);
        paced.step();
        assert_eq!(paced.pauses, 51);
        // Under its budget it does not pause: a slice of busy work split over two calls
        // without a rest between them is measured as one.
        let mut measured = Pacer::new(Some(Duration::from_secs(60)));
        // Spins for `ms` of this thread's CPU time (wall time would count preemption).
        let spin = |ms: u64| {
            let from = clock::thread_cpu_ns();
            let mut x = 0u64;
            while clock::thread_cpu_ns() - from < ms * 1_000_000 {
                x = std::hint::black_box(x.wrapping_add(1));
            }
        };
        let t = clock::now_ns();
        measured.begin();
        spin(2);
        measured.step();
        measured.end();
        measured.begin();
        spin(2);
        measured.end();
        let wall = Duration::from_nanos(clock::now_ns() - t);
        assert_eq!(measured.pauses, 0);
        assert!(
            measured.longest >= Duration::from_millis(3),
            "{:?}",
            measured.longest
        );
        assert!(
            measured.longest <= wall,
            "{:?} > {wall:?}",
            measured.longest
        );
        // After a rest the next work is a new slice: 3 ms more is not a 7 ms slice.
        measured.rest();
        measured.begin();
        spin(3);
        measured.end();
        assert!(
            measured.longest < Duration::from_millis(6),
            "{:?}",
            measured.longest
        );
        // No budget: never pauses, measures nothing.
        let mut free = Pacer::new(None);
        free.begin();
        free.step();
        free.end();
        assert_eq!((free.longest, free.pauses), (Duration::ZERO, 0));
    }
}
