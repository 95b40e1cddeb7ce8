//! The writer thread and its handle. Rows cross a bounded queue (a semaphore of free
//! slots in front of a channel) to the `matrix-recorder` OS thread, which converts them
//! in batches, writes zstd row groups and rolls part files. The thread polls its queue on
//! a short tick instead of blocking in it, so a submit never pays for waking it. A full
//! queue applies back-pressure ([`Recorder::submit`], the one policy replay uses) or hands
//! the row back / drops and counts it ([`Recorder::submit_now`], [`Recorder::try_submit`],
//! serve's choices). Nothing here runs on the async runtime.
//!
//! Encoding can wait: between [`Recorder::hold`] and [`Recorder::release`] (replay's
//! measured rounds) the writer only takes rows off the queue and keeps them, up to
//! [`RecorderOptions::hold_bytes`]; it encodes them after the round, when no request can
//! wait behind it. Past that bound it encodes as it goes, as outside a hold.

use std::collections::VecDeque;
use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use arrow_schema::SchemaRef;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::schema::types::ColumnPath;
use tokio::sync::Semaphore;

use super::columns::exchange_schema;
use super::encode::{PACED_GROUP_BYTES, Pacer, PartEncoder, STEP_BYTES};
use super::ledger::Ledger;
use super::row::{ExchangeRecord, SCHEMA_VERSION};
use crate::clock;
use crate::redact::Redaction;

/// Where and how parts are written.
#[derive(Debug, Clone)]
pub struct RecorderOptions {
    /// The `exchanges/` directory (must exist).
    pub dir: PathBuf,
    /// Roll to a new part after this many rows.
    pub part_rows: usize,
    /// Roll to a new part when the open one is this old (and has rows).
    pub part_seconds: f64,
    /// Rows queued between the drivers and the writer thread.
    pub queue_rows: usize,
    pub redaction: Redaction,
    /// Extra key-value metadata for every part (run id, ...).
    pub metadata: Vec<(String, String)>,
    /// While held ([`Recorder::hold`]), keep up to this many bytes of rows (as
    /// [`ExchangeRecord::approx_bytes`] counts them) unencoded; 0 (the default): never
    /// hold. Replay sets it (`--record-hold`, else [`default_hold_bytes`]).
    pub hold_bytes: usize,
    /// Encode in slices of at most about this much work, giving the core back between
    /// them, so that a request on the same core never waits behind more than one slice
    /// (serve sets [`SERVE_SLICE`]); `None` (the default): encode without pausing.
    pub slice: Option<Duration>,
    /// The ledger file; `None` (the default): beside `dir`, named after it with
    /// `.ledger` (`RUN/exchanges.ledger`).
    pub ledger: Option<PathBuf>,
}

/// The budget of a slice of serve's recorder: it yields once its work since it last
/// rested passes this (checked after each step, so one step may run past it).
pub const SERVE_SLICE: Duration = Duration::from_micros(40);

impl RecorderOptions {
    pub fn new(dir: PathBuf) -> RecorderOptions {
        RecorderOptions {
            dir,
            part_rows: 100_000,
            part_seconds: 60.0,
            queue_rows: 4096,
            redaction: Redaction::default(),
            metadata: Vec::new(),
            hold_bytes: 0,
            slice: None,
            ledger: None,
        }
    }

    /// The queue's size in rows as its semaphore holds it: `queue_rows`, at least 1 and at
    /// most what a semaphore takes.
    fn queue_slots(&self) -> usize {
        self.queue_rows.clamp(1, Semaphore::MAX_PERMITS)
    }
}

/// Default of [`RecorderOptions::hold_bytes`]: an eighth of the memory this process may
/// use (the machine's, or its cgroup's `memory.max` when lower), at most 1 GiB (256 MiB
/// where neither can be read).
pub fn default_hold_bytes() -> usize {
    let machine = std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| {
        m.lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<usize>().ok())
            .map(|kib| kib.saturating_mul(1024))
    });
    // cgroup v2; "max" (no limit) does not parse and leaves the machine's.
    let cgroup = std::fs::read_to_string("/sys/fs/cgroup/memory.max")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok());
    let limit = match (machine, cgroup) {
        (Some(m), Some(c)) => Some(m.min(c)),
        (m, c) => m.or(c),
    };
    limit.map_or(256 << 20, |t| (t / 8).min(1 << 30))
}

/// What the writer did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WriterStats {
    pub rows: u64,
    pub parts: u32,
    /// Rows encoded while held because the held rows passed
    /// [`RecorderOptions::hold_bytes`] (encoding that overlapped a measured round).
    pub encoded_while_held: u64,
    /// The longest run of work (encoding, freeing rows, closing row groups and parts)
    /// between two rests, in the writer thread's CPU microseconds
    /// ([`RecorderOptions::slice`]; 0 when it is not paced).
    pub longest_slice_us: u64,
}

#[derive(Debug, Clone, thiserror::Error)]
#[error("recorder: {0}")]
pub struct RecordError(pub(crate) String);

impl RecordError {
    /// A submit after the writer stopped (on an error, or after [`Recorder::finish`]).
    fn stopped() -> RecordError {
        RecordError("the writer stopped".into())
    }
}

enum Msg {
    /// One row, or rows gathered by one submitter ([`Recorder::submit_many`]).
    Rows(Vec<ExchangeRecord>),
    /// Keep rows unencoded until the matching [`Msg::Release`] (holds nest); the rows
    /// the round plans to send, for the hold queue's reservation.
    Hold(usize),
    /// End one hold; when none is left, encode what was held, then answer.
    Release(tokio::sync::oneshot::Sender<()>),
    /// Finish every part and stop (sent by [`Recorder::finish`]).
    Close,
}

/// Handle to the writer thread. Shared by reference (`&self`) between all tasks.
pub struct Recorder {
    tx: mpsc::Sender<Msg>,
    slots: Arc<Semaphore>,
    /// The queue's size in rows (the semaphore's permits).
    queue_rows: usize,
    dropped: AtomicU64,
    /// Rows refused because the writer had stopped.
    unrecorded: AtomicU64,
    live: Arc<WriterLive>,
    handle: std::sync::Mutex<Option<JoinHandle<Result<WriterStats, RecordError>>>>,
}

/// What the writer has done so far, for live metrics (the final numbers are
/// [`WriterStats`]).
#[derive(Debug, Default)]
struct WriterLive {
    rows: AtomicU64,
    parts_closed: AtomicU64,
    /// Why the writer stopped on an error, set before submitters learn it stopped.
    failure: std::sync::OnceLock<String>,
}

/// How long the writer sleeps when its queue is empty.
const POLL_TICK: Duration = Duration::from_millis(2);

/// Rows are encoded in batches of at most this many rows, and this many bytes when the
/// writer is not paced (a paced writer's batches are a row group's size at most,
/// [`Writer::batch_bytes`]).
const BATCH_ROWS: usize = 1024;
const BATCH_BYTES: usize = 32 << 20;

impl Recorder {
    pub fn start(opts: RecorderOptions) -> io::Result<Recorder> {
        let (tx, rx) = mpsc::channel();
        let queue_rows = opts.queue_slots();
        let slots = Arc::new(Semaphore::new(queue_rows));
        let thread_slots = slots.clone();
        let live = Arc::new(WriterLive::default());
        let thread_live = live.clone();
        let handle = std::thread::Builder::new()
            .name("matrix-recorder".into())
            .spawn(move || {
                let r = writer_loop(opts, rx, &thread_slots, thread_live.clone());
                if let Err(e) = &r {
                    let _ = thread_live.failure.set(e.to_string());
                }
                // Wake and fail every submitter still waiting for a slot.
                thread_slots.close();
                r
            })?;
        Ok(Recorder {
            tx,
            slots,
            queue_rows,
            dropped: AtomicU64::new(0),
            unrecorded: AtomicU64::new(0),
            live,
            handle: std::sync::Mutex::new(Some(handle)),
        })
    }

    /// Queue a finished exchange, waiting for a free slot (back-pressure). Fails only when
    /// the writer has stopped on an error (see [`Recorder::finish`] for the reason).
    pub async fn submit(&self, rec: ExchangeRecord) -> Result<(), RecordError> {
        let permit = self.slots.acquire().await;
        permit.map_err(|_| self.refused())?.forget();
        self.tx
            .send(Msg::Rows(vec![rec]))
            .map_err(|_| self.refused())
    }

    /// Queue several finished exchanges with one hand-over (one wait for `rows.len()`
    /// slots, one message): what a replay worker gathered over its last exchanges. More
    /// rows than the queue holds are handed over in pieces.
    pub async fn submit_many(&self, mut rows: Vec<ExchangeRecord>) -> Result<(), RecordError> {
        // acquire_many takes a u32 and never more permits than the semaphore holds.
        let cap = self.queue_rows.min(u32::MAX as usize);
        while !rows.is_empty() {
            let rest = if rows.len() > cap {
                rows.split_off(cap)
            } else {
                Vec::new()
            };
            let permits = self.slots.acquire_many(rows.len() as u32).await;
            permits.map_err(|_| self.refused())?.forget();
            self.tx.send(Msg::Rows(rows)).map_err(|_| self.refused())?;
            rows = rest;
        }
        Ok(())
    }

    /// Queue a finished exchange if a slot is free, without waiting; a full queue hands
    /// the row back (`Ok(Some(row))`) for the caller to [`Recorder::submit`] later.
    pub fn submit_now(&self, rec: ExchangeRecord) -> Result<Option<ExchangeRecord>, RecordError> {
        match self.slots.try_acquire() {
            Ok(permit) => {
                permit.forget();
                self.tx
                    .send(Msg::Rows(vec![rec]))
                    .map_err(|_| self.refused())?;
                Ok(None)
            }
            Err(tokio::sync::TryAcquireError::NoPermits) => Ok(Some(rec)),
            Err(tokio::sync::TryAcquireError::Closed) => Err(self.refused()),
        }
    }

    /// Queue a finished exchange only if a slot is free (`--on-record-full drop`).
    /// `Ok(false)`: the queue was full and the row was dropped (and counted).
    pub fn try_submit(&self, rec: ExchangeRecord) -> Result<bool, RecordError> {
        match self.submit_now(rec)? {
            None => Ok(true),
            Some(_dropped) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                Ok(false)
            }
        }
    }

    /// From now until [`Recorder::release`], keep rows in memory (up to
    /// [`RecorderOptions::hold_bytes`]) instead of encoding them: replay calls it as a
    /// measured round starts, so that no request waits behind Parquet encoding. Holds
    /// nest (each is ended by one release); rows already taken off the queue and not yet
    /// encoded are held too. `planned_rows`: the rows the round plans to send; the writer
    /// reserves its hold queue for them at once ([`hold_reservation`]), so that a round's
    /// rows never grow the queue by doubling it (each growth a copy of every row held and
    /// fresh pages, on the generator's core, while requests are in flight).
    pub fn hold(&self, planned_rows: usize) {
        let _ = self.tx.send(Msg::Hold(planned_rows));
    }

    /// End a hold. When it was the last, wait until the writer has encoded every row
    /// submitted before this call (they are then in the open part, as the ledger says).
    pub async fn release(&self) -> Result<(), RecordError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.tx
            .send(Msg::Release(tx))
            .map_err(|_| RecordError::stopped())?;
        rx.await.map_err(|_| RecordError::stopped())
    }

    /// A row refused because the writer stopped: counted.
    fn refused(&self) -> RecordError {
        self.unrecorded.fetch_add(1, Ordering::Relaxed);
        RecordError::stopped()
    }

    /// Rows refused because the writer had stopped (serve's exchanges forwarded but not
    /// recorded).
    pub(crate) fn unrecorded(&self) -> u64 {
        self.unrecorded.load(Ordering::Relaxed)
    }

    /// Why the writer stopped, once it has stopped on an error (a write, a rename, an
    /// fsync failed): a relaxed read, cheap enough for every request.
    pub(crate) fn failure(&self) -> Option<&str> {
        self.live.failure.get().map(String::as_str)
    }

    /// Rows dropped by [`Recorder::try_submit`] because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Rows waiting in the queue for the writer now.
    pub(crate) fn queued_rows(&self) -> usize {
        self.queue_rows
            .saturating_sub(self.slots.available_permits())
    }

    /// Rows encoded into parts so far (the open part's included).
    pub(crate) fn rows_written(&self) -> u64 {
        self.live.rows.load(Ordering::Relaxed)
    }

    /// Parts finished and renamed so far.
    pub(crate) fn parts_closed(&self) -> u64 {
        self.live.parts_closed.load(Ordering::Relaxed)
    }

    /// Close the queue (later submits fail), let the writer write every row already
    /// queued and finish every part, and wait for it. Blocking; call it once.
    pub fn finish(&self) -> Result<WriterStats, RecordError> {
        self.slots.close();
        let _ = self.tx.send(Msg::Close);
        let handle = self.handle.lock().ok().and_then(|mut h| h.take());
        match handle.map(|h| h.join()) {
            Some(Ok(r)) => r,
            Some(Err(_)) => Err(RecordError("the writer thread panicked".into())),
            None => Err(RecordError("recorder already finished".into())),
        }
    }
}

struct OpenPart {
    index: u32,
    encoder: PartEncoder,
    tmp: PathBuf,
    final_path: PathBuf,
    rows: usize,
    opened_ns: u64,
}

/// zstd level of the parts: level 1 compresses recorded JSON nearly as well as the default
/// (3) at a fraction of the CPU, and the writer shares a core with the run.
const ZSTD_LEVEL: i32 = 1;

/// Columns whose values come from a small set, dictionary-encoded (Parquet paths).
const DICTIONARY_COLUMNS: [&[&str]; 11] = [
    &["run_id"],
    &["phase"],
    &["arm"],
    &["case_name"],
    &["variant"],
    &["method"],
    &["url"],
    &["request_headers", "list", "item", "name"],
    &["response_headers", "list", "item", "name"],
    &["outcome"],
    &["output_tokens_source"],
];

/// Columns written without min/max statistics (Parquet paths).
const NO_STATISTICS_COLUMNS: [&[&str]; 5] = [
    &["request_body"],
    &["response_body"],
    &["request_headers", "list", "item", "value"],
    &["response_headers", "list", "item", "value"],
    &["error_message"],
];

fn writer_props(opts: &RecorderOptions) -> WriterProperties {
    let mut kv = vec![KeyValue::new(
        "matrix_proxy.schema_version".to_string(),
        SCHEMA_VERSION.to_string(),
    )];
    for (k, v) in &opts.metadata {
        kv.push(KeyValue::new(k.clone(), v.clone()));
    }
    // Dictionary encoding costs a hash and a compare per value; it pays only where values
    // repeat from a small set. Everything else (bodies, header values, timings) is left to
    // zstd, which finds the repetition anyway (measured with `cargo bench --bench writer`).
    let mut b = WriterProperties::builder()
        .set_compression(Compression::ZSTD(
            ZstdLevel::try_new(ZSTD_LEVEL).unwrap_or_default(),
        ))
        .set_dictionary_enabled(false)
        .set_key_value_metadata(Some(kv));
    // Min/max statistics of a body or a header value are of no use to a query and cost a
    // byte comparison per value (measured: the largest single cost of encoding a row).
    for col in NO_STATISTICS_COLUMNS {
        b = b.set_column_statistics_enabled(column_path(col), EnabledStatistics::None);
    }
    for col in DICTIONARY_COLUMNS {
        b = b.set_column_dictionary_enabled(column_path(col), true);
    }
    if opts.slice.is_some() {
        // Compressing a page is one step: a paced part keeps its pages small.
        b = b.set_data_page_size_limit(STEP_BYTES);
    }
    b.build()
}

fn column_path(parts: &[&str]) -> ColumnPath {
    ColumnPath::new(parts.iter().map(|p| p.to_string()).collect())
}

fn open_part(
    opts: &RecorderOptions,
    index: u32,
    schema: &SchemaRef,
) -> Result<OpenPart, RecordError> {
    let tmp = opts
        .dir
        .join(format!(".part-{index:05}.parquet.inprogress"));
    let final_path = opts.dir.join(format!("part-{index:05}.parquet"));
    let file = File::create(&tmp)
        .map_err(|e| RecordError(format!("{}: cannot create: {e}", tmp.display())))?;
    let encoder = PartEncoder::new(file, schema, writer_props(opts), opts.slice.is_some())
        .map_err(|e| RecordError(format!("{}: {e}", tmp.display())))?;
    Ok(OpenPart {
        index,
        encoder,
        tmp,
        final_path,
        rows: 0,
        opened_ns: clock::now_ns(),
    })
}

fn close_part(part: OpenPart, dir: &Path, pace: &mut Pacer) -> Result<(), RecordError> {
    let ctx = |e: &dyn std::fmt::Display| RecordError(format!("{}: {e}", part.tmp.display()));
    let file = part.encoder.finish(pace).map_err(|e| ctx(&e))?;
    file.sync_all().map_err(|e| ctx(&e))?;
    drop(file);
    fs::rename(&part.tmp, &part.final_path).map_err(|e| ctx(&e))?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| RecordError(format!("{}: fsync: {e}", dir.display())))?;
    Ok(())
}

/// The writer thread's state: rows waiting to be converted, the open part, the ledger.
struct Writer {
    opts: RecorderOptions,
    schema: SchemaRef,
    stats: WriterStats,
    /// Rows received and not yet encoded, oldest first, each with its size as
    /// [`ExchangeRecord::approx_bytes`] counted it once.
    pending: VecDeque<(ExchangeRecord, usize)>,
    pending_bytes: usize,
    part: Option<OpenPart>,
    /// A part is closed when it is this old (and has rows).
    part_ns: u64,
    ledger: Ledger,
    /// Holds not yet released ([`Recorder::hold`]).
    holds: u32,
    /// Rows held when the ledger last said so.
    held_noted: usize,
    pacer: Pacer,
    live: Arc<WriterLive>,
}

/// What the queue gave the writer on one poll.
enum Polled {
    /// A message ([`Msg::Close`] also when every sender is gone).
    Msg(Msg),
    /// Nothing came for as long as the writer waits before flushing what it holds.
    Idle,
}

/// How many more rows' room the hold queue reserves for a round planning `planned` rows:
/// all of them, but never more room than the hold's bound (`hold_bytes`) could fill with
/// rows (each held row counts at least its own size), so the reservation is bounded by
/// `--record-hold` as the held rows are; none when nothing is held.
fn hold_reservation(planned: usize, hold_bytes: usize) -> usize {
    planned.min(hold_bytes / std::mem::size_of::<(ExchangeRecord, usize)>())
}

/// Rows freed in one step after their batch is encoded.
const FREE_STEP_ROWS: usize = 64;

/// While rows are held, the ledger is told how many every this many rows (one small
/// write per 64 rows).
const HELD_NOTE_EVERY: usize = 64;

fn writer_loop(
    opts: RecorderOptions,
    rx: mpsc::Receiver<Msg>,
    slots: &Semaphore,
    live: Arc<WriterLive>,
) -> Result<WriterStats, RecordError> {
    let mut w = Writer {
        live,
        schema: exchange_schema(),
        stats: WriterStats::default(),
        pending: VecDeque::with_capacity(BATCH_ROWS),
        pending_bytes: 0,
        part: None,
        part_ns: (opts.part_seconds.max(0.001) * 1e9) as u64,
        ledger: match &opts.ledger {
            Some(path) => Ledger::open_at(path),
            None => Ledger::open(&opts.dir),
        },
        holds: 0,
        held_noted: 0,
        pacer: Pacer::new(opts.slice),
        opts,
    };
    let ran = w.run(&rx, slots);
    w.stats.longest_slice_us = w.pacer.longest.as_micros() as u64;
    match ran {
        Ok(()) => Ok(w.stats),
        Err(e) => {
            // Keep what was written: try to close the open part so its rows survive.
            if let Some(p) = w.part.take() {
                let _ = close_part(p, &w.opts.dir, &mut Pacer::new(None));
            }
            Err(e)
        }
    }
}

impl Writer {
    fn run(&mut self, rx: &mpsc::Receiver<Msg>, slots: &Semaphore) -> Result<(), RecordError> {
        let mut idle = Duration::ZERO;
        loop {
            match self.poll(rx, &mut idle) {
                None => continue,
                Some(Polled::Msg(Msg::Rows(rows))) => {
                    slots.add_permits(rows.len());
                    // Half the queue still waiting: encode unpaced until it drains.
                    let free = slots.available_permits();
                    self.pacer.behind(free < self.opts.queue_slots() / 2);
                    for rec in rows {
                        self.on_row(rec)?;
                    }
                }
                Some(Polled::Msg(Msg::Hold(planned))) => {
                    self.holds += 1;
                    let more = hold_reservation(planned, self.opts.hold_bytes);
                    self.pending.reserve_exact(more);
                }
                Some(Polled::Msg(Msg::Release(done))) => {
                    self.holds = self.holds.saturating_sub(1);
                    if !self.holding() {
                        // Everything the round left, and an old part's close, happen
                        // before the next round may start.
                        self.flush_all()?;
                        self.roll_if_old()?;
                    }
                    let _ = done.send(());
                }
                // Idle: hand pending rows to the part so the age check sees them.
                Some(Polled::Idle) if !self.holding() => self.flush_all()?,
                Some(Polled::Idle) => {}
                Some(Polled::Msg(Msg::Close)) => {
                    self.flush_all()?;
                    if self.stats.parts == 0 {
                        // A run with no exchanges still leaves one valid, empty part, so
                        // a query over exchanges/ works on it.
                        self.part = Some(open_part(&self.opts, 0, &self.schema)?);
                        self.stats.parts = 1;
                    }
                    return self.close_open_part();
                }
            }
            if !self.holding() {
                self.roll_if_old()?;
            }
        }
    }

    /// Rows are being held ([`Recorder::hold`] with a bound above 0): no idle flush, no
    /// part closed for its age.
    fn holding(&self) -> bool {
        self.holds > 0 && self.opts.hold_bytes > 0
    }

    /// Close the open part when it is older than `--part-seconds` and has rows.
    fn roll_if_old(&mut self) -> Result<(), RecordError> {
        if let Some(p) = &self.part
            && p.rows > 0
            && clock::now_ns().saturating_sub(p.opened_ns) >= self.part_ns
        {
            self.flush_all()?;
            self.close_open_part()?;
        }
        Ok(())
    }

    /// One look at the queue. Poll rather than block: a receiver blocked in the channel
    /// turns every send into a futex wake-up and a context switch on the submitting core
    /// (measured: over a quarter of serve's CPU time). Rows wait at most one tick here.
    /// `None`: slept one tick, nothing to do yet.
    fn poll(&mut self, rx: &mpsc::Receiver<Msg>, idle: &mut Duration) -> Option<Polled> {
        match rx.try_recv() {
            Ok(msg) => {
                *idle = Duration::ZERO;
                Some(Polled::Msg(msg))
            }
            Err(mpsc::TryRecvError::Disconnected) => Some(Polled::Msg(Msg::Close)),
            Err(mpsc::TryRecvError::Empty) => {
                self.pacer.rest();
                std::thread::sleep(POLL_TICK);
                *idle += POLL_TICK;
                if *idle < self.idle_wait() {
                    return None;
                }
                *idle = Duration::ZERO;
                Some(Polled::Idle)
            }
        }
    }

    /// How long the queue may stay empty before pending rows are flushed: at most half a
    /// second, less when the open part is due to close sooner.
    fn idle_wait(&self) -> Duration {
        match &self.part {
            Some(p) => {
                let age = clock::now_ns().saturating_sub(p.opened_ns);
                Duration::from_nanos(self.part_ns.saturating_sub(age))
                    .min(Duration::from_millis(500))
            }
            None => Duration::from_millis(500),
        }
    }

    fn on_row(&mut self, mut rec: ExchangeRecord) -> Result<(), RecordError> {
        rec.read_usage_from_body();
        let bytes = rec.approx_bytes();
        self.pending_bytes += bytes;
        self.pending.push_back((rec, bytes));
        if self.holding() {
            // Held: encoded after the round, except the oldest rows past the bound.
            while self.pending_bytes >= self.opts.hold_bytes && !self.pending.is_empty() {
                self.flush()?;
            }
            // The ledger learns, every so often, how many rows a crash now would lose
            // besides the open part.
            if self.pending.len() >= self.held_noted + HELD_NOTE_EVERY
                || self.pending.len() < self.held_noted
            {
                self.held_noted = self.pending.len();
                self.ledger.note_held(self.held_noted);
            }
            return Ok(());
        }
        // Never hold more rows than would complete the open part, so that a crash loses
        // at most that part (plus rows still in the queue).
        let open_rows = self.part.as_ref().map_or(0, |p| p.rows);
        let batch_limit = BATCH_ROWS
            .min(self.opts.part_rows.max(1) - open_rows)
            .max(1);
        while self.pending.len() >= batch_limit || self.pending_bytes >= self.batch_bytes() {
            self.flush()?;
        }
        Ok(())
    }

    /// Bytes of rows encoded as one batch: [`BATCH_BYTES`], or a paced row group's size
    /// (a batch is what may go into an empty row group at once).
    fn batch_bytes(&self) -> usize {
        match self.opts.slice {
            Some(_) => PACED_GROUP_BYTES,
            None => BATCH_BYTES,
        }
    }

    fn flush_all(&mut self) -> Result<(), RecordError> {
        while !self.pending.is_empty() {
            self.flush()?;
        }
        Ok(())
    }

    /// Encode the oldest pending rows (one batch: at most [`BATCH_ROWS`] rows,
    /// [`Writer::batch_bytes`] and what completes the open part) into the open part, free
    /// them, note them in the ledger, and close the part when it is full.
    fn flush(&mut self) -> Result<(), RecordError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        self.pacer.begin();
        if self.part.is_none() {
            self.part = Some(open_part(&self.opts, self.stats.parts, &self.schema)?);
            self.stats.parts += 1;
        }
        let part_rows = self.opts.part_rows.max(1);
        let batch_bytes = self.batch_bytes();
        let p = self
            .part
            .as_mut()
            .ok_or_else(|| RecordError("no open part".into()))?;
        // Never let one part overshoot part_rows: split the batch at the boundary.
        let room = (part_rows - p.rows).min(BATCH_ROWS);
        let (mut take, mut bytes) = (0, 0);
        for (_, b) in self.pending.iter().take(room) {
            if take > 0 && bytes + b > batch_bytes {
                break;
            }
            bytes += b;
            take += 1;
        }
        // Moved out (at most one batch), never by rotating a deque of held rows.
        let rows: Vec<ExchangeRecord> = self.pending.drain(..take).map(|(r, _)| r).collect();
        self.pending_bytes -= bytes;
        let written = p
            .encoder
            .write(&rows, &self.opts.redaction, &mut self.pacer);
        // Freeing a batch of rows is work too (a few allocations each): in steps.
        let mut rows = rows;
        while !rows.is_empty() {
            rows.truncate(rows.len().saturating_sub(FREE_STEP_ROWS));
            self.pacer.step();
        }
        self.pacer.end();
        written.map_err(|e| RecordError(format!("{}: {e}", p.tmp.display())))?;
        p.rows += take;
        self.stats.rows += take as u64;
        self.live.rows.fetch_add(take as u64, Ordering::Relaxed);
        if self.holds > 0 {
            // Encoded while a measured round runs (past the bound, or with no bound).
            self.stats.encoded_while_held += take as u64;
        }
        // The rows move from the held count to the part's in one ledger write: a crash
        // sees both lines or neither, never a row twice or not at all.
        let held = (self.held_noted > 0).then(|| {
            self.held_noted = self.pending.len();
            self.held_noted
        });
        self.ledger.note(p.index, p.rows, held);
        let full = p.rows >= part_rows;
        if full {
            self.close_open_part()?;
        }
        Ok(())
    }

    fn close_open_part(&mut self) -> Result<(), RecordError> {
        match self.part.take() {
            Some(p) => {
                self.pacer.begin();
                let closed = close_part(p, &self.opts.dir, &mut self.pacer);
                self.pacer.end();
                if closed.is_ok() {
                    self.live.parts_closed.fetch_add(1, Ordering::Relaxed);
                }
                closed
            }
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::tests_support::row;

    #[test]
    fn drop_policy_counts_every_row_it_does_not_keep() {
        let dir = tempfile::tempdir().unwrap();
        let mut opts = RecorderOptions::new(dir.path().to_path_buf());
        opts.queue_rows = 1;
        opts.part_rows = 7_000;
        let rec = Recorder::start(opts).unwrap();
        let n = 50_000;
        let mut kept = 0u64;
        for i in 0..n {
            if rec.try_submit(row(i, b"x")).unwrap() {
                kept += 1;
            }
        }
        let stats = rec.finish().unwrap();
        assert_eq!(stats.rows, kept, "every accepted row is written");
        assert_eq!(
            rec.dropped(),
            n as u64 - kept,
            "every other row is counted as dropped"
        );
        assert!(
            rec.dropped() > 0,
            "a one-row queue under a tight loop must overflow"
        );
        assert_eq!(stats.parts as u64, kept.div_ceil(7_000));
        // After finish, submitting is an error, not a silent loss.
        let refused = rec.try_submit(row(0, b"x")).unwrap_err();
        assert_eq!(refused.to_string(), "recorder: the writer stopped");
    }
}

#[cfg(test)]
mod hold {
    use super::*;
    use crate::record::ledger;
    use crate::record::tests_support::row;

    /// A recorder writing into `RUN/exchanges` of a temporary run directory (the ledger
    /// goes beside it), parts of 10,000 rows, and a runtime to submit from.
    struct Setup {
        _run: tempfile::TempDir,
        ex: PathBuf,
        rec: Recorder,
        rt: tokio::runtime::Runtime,
    }

    impl Setup {
        fn new(hold_bytes: usize) -> Setup {
            let (run, ex) = crate::record::tests_support::run_dir();
            let mut opts = RecorderOptions::new(ex.clone());
            opts.part_rows = 10_000;
            opts.hold_bytes = hold_bytes;
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let rec = Recorder::start(opts).unwrap();
            Setup {
                _run: run,
                ex,
                rec,
                rt,
            }
        }

        /// Submit `n` rows (back-pressure as replay's).
        fn submit(&self, n: i64) {
            self.rt.block_on(async {
                for i in 0..n {
                    self.rec.submit(row(i, b"x")).await.unwrap();
                }
            });
        }

        fn release(&self) {
            self.rt.block_on(self.rec.release()).unwrap();
        }
    }

    #[test]
    fn held_rows_wait_unencoded_until_release_and_the_ledger_counts_them() {
        let t = Setup::new(256 << 20);
        t.rec.hold(5_000);
        t.submit(5_000);
        // Longer than the idle wait (0.5 s) after which rows are otherwise encoded.
        std::thread::sleep(Duration::from_millis(800));
        let noted = ledger::read(&t.ex);
        assert!(
            noted.parts.is_empty(),
            "nothing encoded while held: {noted:?}"
        );
        assert_eq!(noted.held, 4_992, "held rows noted every 64");
        t.release();
        // Release answers after every row submitted before it is in the open part.
        let noted = ledger::read(&t.ex);
        assert_eq!(noted.parts.get(&0), Some(&5_000), "{noted:?}");
        assert_eq!(noted.held, 0);
        let stats = t.rec.finish().unwrap();
        assert_eq!((stats.rows, stats.encoded_while_held), (5_000, 0));
    }

    #[test]
    fn past_the_hold_bound_rows_are_encoded_during_the_hold_and_counted() {
        let t = Setup::new(3_000 * row(0, b"x").approx_bytes());
        t.rec.hold(5_000);
        t.submit(8_000);
        t.release();
        let stats = t.rec.finish().unwrap();
        assert_eq!(stats.rows, 8_000);
        // Past the bound the oldest batch is encoded, so what stays held is within one
        // batch below the bound.
        assert!(
            (8_000 - 3_000..8_000 - 3_000 + BATCH_ROWS as u64).contains(&stats.encoded_while_held),
            "{stats:?}"
        );
    }

    #[test]
    fn the_hold_queue_is_reserved_for_the_planned_rows_within_the_bound() {
        let size = std::mem::size_of::<(ExchangeRecord, usize)>();
        assert_eq!(hold_reservation(100_000, 1 << 30), 100_000);
        // The bound caps it: never more room than the bound's bytes of rows.
        assert_eq!(hold_reservation(100_000, 1_000 * size), 1_000);
        assert_eq!(hold_reservation(100_000, 0), 0);
        assert_eq!(hold_reservation(0, 1 << 30), 0);
        // Every held row counts at least its own size, so the reservation is never more
        // rows than the bound lets the queue hold.
        assert!(row(0, b"").approx_bytes() >= size);
    }

    #[test]
    fn holds_nest_and_a_zero_bound_never_holds() {
        let t = Setup::new(256 << 20);
        t.rec.hold(5_000);
        t.rec.hold(5_000);
        t.submit(3_000);
        t.release();
        assert!(
            ledger::read(&t.ex).parts.is_empty(),
            "one hold is still open"
        );
        t.release();
        assert_eq!(ledger::read(&t.ex).parts.get(&0), Some(&3_000));
        t.rec.finish().unwrap();

        let t = Setup::new(0);
        t.rec.hold(5_000);
        t.submit(3_000);
        // Longer than the idle wait (0.5 s): with no bound, the idle flush still runs.
        std::thread::sleep(Duration::from_millis(800));
        assert_eq!(
            ledger::read(&t.ex).parts.get(&0),
            Some(&3_000),
            "encoded as rows arrive, as outside a hold"
        );
        t.release();
        let stats = t.rec.finish().unwrap();
        assert_eq!((stats.rows, stats.parts), (3_000, 1));
        assert_eq!(stats.encoded_while_held, 3_000, "and counted as such");
    }
}

#[cfg(test)]
mod batches {
    use super::*;
    use crate::record::tests_support::row;

    #[test]
    fn a_batch_larger_than_the_queue_is_handed_over_in_pieces_and_every_row_written() {
        let (_run, ex) = crate::record::tests_support::run_dir();
        let mut opts = RecorderOptions::new(ex);
        opts.queue_rows = 10;
        let rec = Recorder::start(opts).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            for b in 0..40 {
                let rows = (0..25).map(|i| row(b * 25 + i, b"x")).collect();
                rec.submit_many(rows).await.unwrap();
            }
        });
        assert_eq!(rec.finish().unwrap().rows, 1_000);
        // After finish, a batch is refused, not lost silently.
        let refused = rt.block_on(rec.submit_many(vec![row(0, b"x")]));
        assert_eq!(
            refused.unwrap_err().to_string(),
            "recorder: the writer stopped"
        );
    }
}

#[cfg(test)]
mod disk_full {
    use super::*;
    use crate::record::tests_support::row;

    #[test]
    fn a_full_disk_is_a_clear_error_not_a_panic_and_submitters_are_told() {
        let dir = tempfile::tempdir().unwrap();
        // /dev/full answers every write with ENOSPC.
        std::os::unix::fs::symlink(
            "/dev/full",
            dir.path().join(".part-00000.parquet.inprogress"),
        )
        .unwrap();
        let mut opts = RecorderOptions::new(dir.path().to_path_buf());
        opts.part_rows = 1_000;
        let rec = Recorder::start(opts).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        // The first part closes at 1,000 rows: its write fails, the writer stops, and
        // submitters are refused from then on instead of queueing forever.
        let refused = rt.block_on(async {
            for i in 0..100_000 {
                if let Err(e) = rec.submit(row(i, b"x")).await {
                    return Some((i, e));
                }
            }
            None
        });
        let (at, _) = refused.expect("submitters learn that the writer stopped");
        assert!(at < 1_000 + 4_096 + 1_024 + 1, "refused only at row {at}");
        let err = rec.finish().unwrap_err();
        assert!(err.0.contains(".part-00000.parquet.inprogress"), "{err}");
        assert!(err.0.contains("No space left on device"), "{err}");
    }
}
