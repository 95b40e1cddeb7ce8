//! The worker's own metrics (`--worker-metrics URL`): its Prometheus text scraped on the
//! run's clock, off the data path — every `--scrape-interval` from a task of its own, and
//! once just before and once just after each measured round (awaited, bounded by
//! `--scrape-timeout`), each on a fresh connection of its own. A failed scrape (refused,
//! timed out, not 200, or every line unreadable) is counted, never fatal, the first said
//! on stderr; after 3 answers of 404 or 410 in a row the URL is not scraped again (it
//! serves no metrics: a server started without them). Every sample is
//! sent to the run's sink (`worker_metrics.parquet`, written from a thread of its own as
//! the scrapes arrive), and only what the reports read is held in memory, under caps
//! ([`HoldCaps`]): a worker that invents label sets cannot grow the process without bound.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use crate::clock;
use crate::engine::lean::LeanRequest;
use crate::engine::{Capture, Engine, ExchangeError};
use crate::model::{ConnectionPolicy, Endpoint};
use crate::prom::Scrape;
use crate::record::scrapes::{RoundId, ScrapeRow};

/// The most bytes of one scrape that are read (vLLM's text is tens of kilobytes).
const SCRAPE_LIMIT: usize = 16 << 20;

/// Scrapes in a row answered 404 or 410 after which a worker is not scraped again: it
/// serves no metrics at that URL (a server started without them), and a campaign's
/// servers would otherwise be asked hundreds of times.
const GIVE_UP_AFTER: u32 = 3;

/// Why a scraper cannot be built.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ScrapeError {
    /// The TLS configuration for an `https` URL (`--ca-cert`) could not be built.
    #[error("{0}")]
    Tls(#[source] crate::net::tls::TlsError),
}

/// Why one scrape failed (said and kept as `first_failure`).
#[derive(Debug, thiserror::Error)]
enum Failure {
    #[error("no answer within {0:?}")]
    NoAnswer(Duration),
    /// The parse off the runtime's threads did not finish.
    #[error("the answer could not be read: {0}")]
    Unread(#[source] tokio::task::JoinError),
    #[error("no line could be read (line {line}: {why})")]
    NoLine {
        line: usize,
        #[source]
        why: crate::prom::LineError,
    },
    #[error("an answer with no sample")]
    NoSample,
    /// The exchange itself failed (connect, TLS, a cut answer).
    #[error("{}", .0.message)]
    Exchange(ExchangeError),
    #[error("the answer passed {} MiB, the most a scrape reads", SCRAPE_LIMIT >> 20)]
    TooBig { status: Option<u16> },
    #[error("status {0}")]
    Status(i32),
    #[error("no status")]
    NoStatus,
}

impl Failure {
    /// The answer's status, when one came with the failure.
    fn status(&self) -> Option<u16> {
        match self {
            Failure::TooBig { status } => *status,
            Failure::Status(s) => u16::try_from(*s).ok(),
            _ => None,
        }
    }
}

/// Why a scrape was taken (the `cause` column), and at a round's edge, which round.
#[derive(Debug, Clone)]
pub(crate) enum Cause {
    Interval,
    RoundStart(RoundId),
    RoundEnd(RoundId),
    /// serve: the run's one window opens and closes.
    RunStart,
    RunEnd,
}

impl Cause {
    fn split(self) -> (&'static str, Option<RoundId>) {
        match self {
            Cause::Interval => ("interval", None),
            Cause::RoundStart(r) => ("round_start", Some(r)),
            Cause::RoundEnd(r) => ("round_end", Some(r)),
            Cause::RunStart => ("run_start", None),
            Cause::RunEnd => ("run_end", None),
        }
    }
}

/// The most memory the interval scrapes' rows held for the reports may take, per scraped
/// worker (about 450 bytes a row of a vLLM worker's gauges: some 600,000 rows, a day and a
/// half of its five at 1 s). An edge scrape's rows are held past it (at most
/// [`HOLD_SERIES`] each): a window always has its edges. docs/output.md and
/// docs/reliability.md give the bounds.
pub(crate) const HOLD_BYTES: usize = 256 << 20;
/// The most distinct series (metric and labels) held per scraped worker (vLLM exports
/// some 500), and per metric name (a histogram's buckets under every label set).
pub(crate) const HOLD_SERIES: usize = 10_000;
pub(crate) const HOLD_SERIES_PER_METRIC: usize = 1_000;

/// The caps on what one scraper holds for the reports ([`HOLD_BYTES`], [`HOLD_SERIES`],
/// [`HOLD_SERIES_PER_METRIC`]; smaller in tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HoldCaps {
    pub(crate) bytes: usize,
    pub(crate) series: usize,
    pub(crate) per_metric: usize,
}

impl Default for HoldCaps {
    fn default() -> HoldCaps {
        HoldCaps {
            bytes: HOLD_BYTES,
            series: HOLD_SERIES,
            per_metric: HOLD_SERIES_PER_METRIC,
        }
    }
}

/// What a scraper holds for the reports: the series it has taken (a hash of metric and
/// labels each, so the set costs 8 bytes a series), how many per metric, and the bytes
/// its rows take.
#[derive(Debug, Default)]
struct Holding {
    caps: HoldCaps,
    series: HashSet<u64>,
    per_metric: HashMap<String, usize>,
    bytes: usize,
}

/// About the memory one held row takes: the row, what its strings and labels hold, and
/// the allocator's own 16 bytes or so for each of them.
fn row_bytes(r: &ScrapeRow) -> usize {
    std::mem::size_of::<ScrapeRow>()
        + 16 * (3 + 2 * r.labels.len())
        + r.metric.capacity()
        + r.kind.capacity()
        + r.labels.capacity() * std::mem::size_of::<(String, String)>()
        + r.labels
            .iter()
            .map(|(k, v)| k.capacity() + v.capacity())
            .sum::<usize>()
}

fn series_key(r: &ScrapeRow) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    r.metric.hash(&mut h);
    r.labels.hash(&mut h);
    h.finish()
}

/// What the scrapes gathered.
#[derive(Debug, Default)]
pub(crate) struct Gathered {
    /// The rows the reports read (every row of an edge scrape; of an interval scrape only
    /// the series a window's means and the report's lines read,
    /// `report::worker::read_between_edges`), within the caps; every row goes to the sink.
    pub(crate) rows: Vec<ScrapeRow>,
    pub(crate) scrapes: u64,
    pub(crate) failed: u64,
    /// The first failure's reason.
    pub(crate) first_failure: Option<String>,
    /// Lines of answered scrapes that could not be read.
    pub(crate) unreadable_lines: u64,
    /// Samples the reports would read that were not held: beyond a cap (still written).
    pub(crate) not_held: u64,
    /// The first cap reached, in words (said once on stderr when it is reached).
    pub(crate) cap_reached: Option<String>,
    /// Samples not written to worker_metrics.parquet either: its writer fell behind.
    pub(crate) not_written: u64,
    /// How each scraped worker answered (one entry per scraper, filled by `take`).
    pub(crate) health: Vec<crate::report::doc::worker::ScrapeHealth>,
    /// Scrapes in a row that answered 404 or 410.
    missing_in_a_row: u32,
    /// Why scraping this worker stopped early (it serves no metrics there).
    stopped: Option<String>,
    holding: Holding,
}

impl Gathered {
    /// Another scraper's gathering added to this one (a campaign's arms).
    pub(crate) fn merge(&mut self, other: Gathered) {
        self.rows.extend(other.rows);
        self.rows.sort_by_key(|r| r.offset_us);
        self.scrapes += other.scrapes;
        self.failed += other.failed;
        self.unreadable_lines += other.unreadable_lines;
        self.not_held += other.not_held;
        self.not_written += other.not_written;
        self.health.extend(other.health);
        if self.first_failure.is_none() {
            self.first_failure = other.first_failure;
        }
        if self.cap_reached.is_none() {
            self.cap_reached = other.cap_reached;
        }
    }

    /// One scrape's rows the reports read, held while the caps allow: a series already
    /// held always is (an interval scrape's until the bytes run out); a new one only while
    /// there is room for it, overall and under its metric. Returns the first cap reached,
    /// the first time any is (to be said once).
    fn hold(&mut self, rows: Vec<ScrapeRow>) -> Option<String> {
        let before = self.cap_reached.is_some();
        let h = &mut self.holding;
        for r in rows {
            let key = series_key(&r);
            let known = h.series.contains(&key);
            let room = known
                || (h.series.len() < h.caps.series
                    && h.per_metric.get(&r.metric).copied().unwrap_or(0) < h.caps.per_metric);
            let bytes = row_bytes(&r);
            let why = if !room {
                Some(if h.series.len() >= h.caps.series {
                    format!("more than {} series", h.caps.series)
                } else {
                    format!(
                        "more than {} series of one metric ({})",
                        h.caps.per_metric, r.metric
                    )
                })
            } else if r.cause == "interval" && h.bytes + bytes > h.caps.bytes {
                Some(match h.caps.bytes >> 20 {
                    0 => format!("more than {} bytes of rows", h.caps.bytes),
                    mib => format!("more than {mib} MiB of rows"),
                })
            } else {
                None
            };
            if let Some(why) = why {
                self.not_held += 1;
                self.cap_reached.get_or_insert(why);
                continue;
            }
            if !known {
                h.series.insert(key);
                *h.per_metric.entry(r.metric.clone()).or_insert(0) += 1;
            }
            h.bytes += bytes;
            self.rows.push(r);
        }
        match (&self.cap_reached, before) {
            (Some(why), false) => Some(why.clone()),
            _ => None,
        }
    }
}

/// Scrapes that may wait for the writer of worker_metrics.parquet: past them, a scrape's
/// rows are dropped and counted (a worker whose scrapes come faster than they are written
/// never grows the queue without bound).
pub(crate) const SINK_QUEUE: usize = 8;

/// Where a scrape's rows are written (`record::scrapes::Sink`).
pub(crate) type SinkTx = std::sync::mpsc::SyncSender<Vec<ScrapeRow>>;

/// How a campaign's arms scrape their workers (`--scrape-interval`, `--scrape-timeout`,
/// `--ca-cert`, the run's sink).
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) every: Duration,
    pub(crate) timeout: Duration,
    pub(crate) tls: crate::net::tls::TlsOptions,
    pub(crate) sink: SinkTx,
}

/// What a scraper reads: `url` (checked by the caller, `Endpoint::parse`) through
/// `engine` (from [`Scraper::engine_for`]).
pub(crate) struct ScrapeTarget {
    pub(crate) url: Endpoint,
    pub(crate) engine: Engine,
}

/// When a scrape was taken and why: the columns its rows share.
struct Stamp {
    offset_us: i64,
    wall_time_us: i64,
    cause: &'static str,
    round: Option<RoundId>,
}

/// Scrapes one URL on the run's clock.
pub(crate) struct Scraper {
    engine: Engine,
    url: Endpoint,
    run_t0_ns: u64,
    timeout: Duration,
    /// The campaign arm whose worker this is (`None` for a plain plan or serve).
    arm: Option<Arc<str>>,
    gathered: Mutex<Gathered>,
    /// Where every row goes; `None`: every row is held (a DCGM exporter's), within the
    /// same caps.
    sink: Option<SinkTx>,
    /// Whether reaching a cap is said on stderr (not in tests).
    say: bool,
    /// A DCGM exporter's scraper (`--gpu-metrics URL`), not a worker's: its failures are
    /// said as the GPU's and counted in the GPU telemetry line, not in summary.json.
    gpu: bool,
}

impl Scraper {
    /// The engine that scrapes `url`: built before anything of the run exists, so a bad
    /// CA file is a usage error, not a half-made run.
    pub(crate) fn engine_for(
        url: &Endpoint,
        tls: &crate::net::tls::TlsOptions,
    ) -> Result<Engine, ScrapeError> {
        Engine::new(url.scheme == crate::model::Scheme::Https, tls).map_err(ScrapeError::Tls)
    }

    /// Scrape `target`; every row goes to `sink` (without one, every row is held).
    pub(crate) fn new(
        target: ScrapeTarget,
        run_t0_ns: u64,
        timeout: Duration,
        sink: Option<SinkTx>,
    ) -> Scraper {
        let ScrapeTarget { url, engine } = target;
        Scraper {
            engine,
            url,
            run_t0_ns,
            timeout,
            arm: None,
            gathered: Mutex::new(Gathered::default()),
            sink,
            say: true,
            gpu: false,
        }
    }

    /// This scraper holds within `caps` and says nothing on stderr (tests).
    #[cfg(test)]
    pub(crate) fn with_caps(self, caps: HoldCaps) -> Scraper {
        let mut g = Gathered::default();
        g.holding.caps = caps;
        Scraper {
            gathered: Mutex::new(g),
            say: false,
            ..self
        }
    }

    /// This scraper reads a DCGM exporter (`--gpu-metrics URL`), not a worker.
    pub(crate) fn for_gpu(mut self) -> Scraper {
        self.gpu = true;
        self
    }

    /// This scraper's rows name `arm` (a campaign arm's worker).
    pub(crate) fn with_arm(mut self, arm: &str) -> Scraper {
        self.arm = Some(Arc::from(arm));
        self
    }

    /// One scrape, bounded by the timeout; its samples (or its failure) are kept. None
    /// once scraping stopped on a worker that serves no metrics there.
    pub(crate) async fn scrape(&self, cause: Cause) {
        if self.gathered.lock().is_ok_and(|g| g.stopped.is_some()) {
            return;
        }
        let started_ns = clock::now_ns();
        let wall_time_us = clock::wall_now_us();
        let result = tokio::time::timeout(self.timeout, self.get()).await;
        let offset_us = clock::us_between(self.run_t0_ns, started_ns);
        // Read outside the lock: a round-edge scrape never waits behind another's parse.
        let outcome = match result {
            Err(_) => Err(Failure::NoAnswer(self.timeout)),
            Ok(Ok(text)) => read_answer(text).await,
            Ok(Err(why)) => Err(why),
        };
        let (cause, round) = cause.split();
        let stamp = Stamp {
            offset_us,
            wall_time_us,
            cause,
            round,
        };
        let rows = match &outcome {
            Ok(scrape) => self.rows(scrape, stamp),
            Err(_) => Vec::new(),
        };
        let (kept, not_written) = self.send_rows(rows, cause);
        self.count(outcome, kept, not_written);
    }

    /// A scrape's samples as rows.
    fn rows(&self, scrape: &Scrape, stamp: Stamp) -> Vec<ScrapeRow> {
        scrape
            .samples
            .iter()
            .map(|s| ScrapeRow {
                offset_us: stamp.offset_us,
                wall_time_us: stamp.wall_time_us,
                cause: stamp.cause,
                round: stamp.round.clone(),
                arm: self.arm.clone(),
                metric: s.name.clone(),
                labels: s.labels.clone(),
                value: s.value,
                kind: s.kind.clone(),
            })
            .collect()
    }

    /// Every row to the sink (counted when its writer fell behind); the rows the reports
    /// read are returned to be held, and how many were not written.
    fn send_rows(&self, rows: Vec<ScrapeRow>, cause: &str) -> (Vec<ScrapeRow>, u64) {
        let Some(sink) = &self.sink else {
            return (rows, 0);
        };
        let kept = match cause {
            "interval" => rows
                .iter()
                .filter(|r| crate::report::worker::read_between_edges(&r.metric))
                .cloned()
                .collect(),
            _ => rows.clone(),
        };
        let n = rows.len() as u64;
        let not_written = if n > 0 && sink.try_send(rows).is_err() {
            n
        } else {
            0
        };
        (kept, not_written)
    }

    /// A scrape counted: its `kept` rows held within the caps (the first cap reached
    /// said on stderr), or its failure.
    fn count(&self, outcome: Result<Scrape, Failure>, kept: Vec<ScrapeRow>, not_written: u64) {
        let Ok(mut g) = self.gathered.lock() else {
            return;
        };
        g.scrapes += 1;
        g.not_written += not_written;
        match outcome {
            Ok(scrape) => {
                g.missing_in_a_row = 0;
                g.unreadable_lines += scrape.errors.len() as u64;
                if let Some(why) = g.hold(kept)
                    && self.say
                {
                    eprintln!(
                        "matrix-proxy: worker metrics of {}: {why} held for the reports; samples past the cap are still written to worker_metrics.parquet but not held, and counted (summary.json worker_metrics_limits)",
                        self.url.authority
                    );
                }
            }
            Err(why) => self.failed(&mut g, why),
        }
    }

    /// A failed scrape counted; the first said on stderr; after [`GIVE_UP_AFTER`] in a
    /// row answered 404 or 410, this worker is not scraped again (said once).
    fn failed(&self, g: &mut Gathered, why: Failure) {
        let (status, why) = (why.status(), why.to_string());
        g.failed += 1;
        let (whose, server, counted) = match (&self.arm, self.gpu) {
            (_, true) => (
                "GPU metrics (DCGM exporter)".to_string(),
                "the exporter",
                "said with the GPU telemetry at the end",
            ),
            (Some(a), false) => (
                format!("arm {a}'s worker metrics"),
                "the worker",
                "summary.json worker_metrics_scrapes",
            ),
            (None, false) => (
                "worker metrics".to_string(),
                "the worker",
                "summary.json worker_metrics_scrapes",
            ),
        };
        if g.first_failure.is_none() && self.say {
            eprintln!(
                "matrix-proxy: {whose}: the scrape of {} failed: {why}; failed scrapes are counted ({counted})",
                self.url.url()
            );
        }
        g.first_failure.get_or_insert(why);
        g.missing_in_a_row = match status {
            Some(404 | 410) => g.missing_in_a_row + 1,
            _ => 0,
        };
        if g.missing_in_a_row >= GIVE_UP_AFTER && g.stopped.is_none() {
            let stopped = format!(
                "stopped after {} scrapes in a row answered status {}: {server} serves no metrics at {}",
                g.missing_in_a_row,
                status.unwrap_or_default(),
                self.url.url()
            );
            if self.say {
                eprintln!("matrix-proxy: {whose}: {stopped}; not scraped again this run");
            }
            g.stopped = Some(stopped);
        }
    }

    /// GET the URL on a fresh connection: its body as text, or why not (with the
    /// answer's status when there was one).
    async fn get(&self) -> Result<String, Failure> {
        let mut headers = http::HeaderMap::new();
        if let Ok(h) = http::HeaderValue::from_str(&self.url.authority) {
            headers.insert(http::header::HOST, h);
        }
        headers.insert(
            http::header::ACCEPT,
            http::HeaderValue::from_static("text/plain; version=0.0.4"),
        );
        crate::engine::http1::close_after(&mut headers);
        let req = LeanRequest::new(http::Method::GET, &self.url.path_and_query, &headers, &[]);
        let mut cap = Capture::start(SCRAPE_LIMIT, None);
        let mut slot = None;
        self.engine
            .exchange_lean(
                &mut slot,
                &self.url,
                ConnectionPolicy::Fresh,
                &req,
                &mut cap,
            )
            .await
            .map_err(Failure::Exchange)?;
        let c = cap.into_captured();
        let status = c.status.and_then(|s| u16::try_from(s).ok());
        if c.body.truncated {
            return Err(Failure::TooBig { status });
        }
        match c.status {
            Some(200) => Ok(String::from_utf8_lossy(&c.body.bytes).into_owned()),
            Some(s) => Err(Failure::Status(s)),
            None => Err(Failure::NoStatus),
        }
    }

    /// Scrape every `interval` until `stop` fires (the first scrape at once).
    pub(crate) async fn every(
        self: Arc<Self>,
        interval: Duration,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => self.scrape(Cause::Interval).await,
                _ = stop.changed() => return,
            }
        }
    }

    /// What was gathered, taken out (the rows sorted by offset), with this worker's
    /// entry in `health`.
    pub(crate) fn take(&self) -> Gathered {
        let mut g = self
            .gathered
            .lock()
            .map(|mut g| std::mem::take(&mut *g))
            .unwrap_or_default();
        g.rows.sort_by_key(|r| r.offset_us);
        g.health.push(crate::report::doc::worker::ScrapeHealth {
            arm: self.arm.as_deref().map(str::to_string),
            url: self.url.url(),
            scrapes: g.scrapes,
            failed: g.failed,
            first_failure: g.first_failure.clone(),
            stopped: g.stopped.clone(),
        });
        g
    }
}

/// A scrape's answer read (off the runtime's threads: a big answer, up to 16 MiB, takes a
/// while, and exchanges run on them); a failure when no line of it could be.
async fn read_answer(text: String) -> Result<Scrape, Failure> {
    let parsed = tokio::task::spawn_blocking(move || crate::prom::parse(&text)).await;
    let scrape = parsed.map_err(Failure::Unread)?;
    match (scrape.samples.is_empty(), scrape.errors.first()) {
        (true, Some((line, why))) => Err(Failure::NoLine {
            line: *line,
            why: why.clone(),
        }),
        (true, None) => Err(Failure::NoSample),
        (false, _) => Ok(scrape),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(scrape: i64, metric: &str, id: usize) -> ScrapeRow {
        ScrapeRow {
            offset_us: scrape,
            wall_time_us: scrape,
            cause: "interval",
            round: None,
            arm: None,
            metric: metric.into(),
            labels: vec![("id".into(), format!("{id}"))],
            value: 1.0,
            kind: "gauge".into(),
        }
    }

    fn gathered(caps: HoldCaps) -> Gathered {
        let mut g = Gathered::default();
        g.holding.caps = caps;
        g
    }

    #[test]
    fn held_series_stop_at_the_caps_and_what_is_left_out_is_counted() {
        let caps = HoldCaps {
            bytes: usize::MAX,
            series: 30,
            per_metric: 20,
        };
        let mut g = gathered(caps);
        // A worker that invents 100 label sets of one gauge every scrape, beside an honest
        // series it repeats.
        let mut said = Vec::new();
        for scrape in 0..4 {
            let mut rows = vec![row(scrape, "honest", 0)];
            rows.extend((0..100).map(|i| row(scrape, "running", scrape as usize * 100 + i)));
            said.extend(g.hold(rows));
        }
        // The honest series is held at every scrape; the inventive gauge up to its cap.
        assert_eq!(g.rows.iter().filter(|r| r.metric == "honest").count(), 4);
        assert_eq!(g.rows.iter().filter(|r| r.metric == "running").count(), 20);
        assert_eq!(g.not_held, 4 * 101 - 24);
        assert_eq!(
            said,
            ["more than 20 series of one metric (running)".to_string()],
            "said once, when first reached"
        );
        // Other metrics fill the rest of the overall cap, then are counted too.
        let more: Vec<ScrapeRow> = (0..20).map(|i| row(9, &format!("m{i}"), 0)).collect();
        assert!(g.hold(more).is_none(), "a cap is said once");
        assert_eq!(g.holding.series.len(), 30);
        assert_eq!(g.rows.len(), 24 + 9);
        assert_eq!(g.not_held, 4 * 101 - 24 + 11);
    }

    #[test]
    fn held_rows_stop_at_the_byte_cap() {
        let one = row_bytes(&row(0, "honest", 0));
        let mut g = gathered(HoldCaps {
            bytes: one * 10,
            series: 100,
            per_metric: 100,
        });
        for scrape in 0..25 {
            g.hold(vec![row(scrape, "honest", 0)]);
        }
        assert_eq!(g.rows.len(), 10);
        assert_eq!(g.not_held, 15);
        assert!(g.holding.bytes <= one * 10);
        // A window's edge is held past it (the series cap still bounds it).
        let mut edge = row(30, "honest", 0);
        edge.cause = "round_end";
        assert!(g.hold(vec![edge.clone(), edge]).is_none());
        assert_eq!((g.rows.len(), g.not_held), (12, 15));
        assert_eq!(
            g.cap_reached.as_deref(),
            Some(&*format!("more than {} bytes of rows", one * 10))
        );
    }

    /// A worker whose `/metrics` has `per_scrape` new label sets of vLLM's running gauge
    /// at every scrape (as a hostile or broken exporter's may): its address.
    async fn inventive_worker(per_scrape: usize) -> std::net::SocketAddr {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let addr = l.local_addr().unwrap_or_else(|e| panic!("{e}"));
        tokio::spawn(async move {
            for scrape in 0usize.. {
                let Ok((mut c, _)) = l.accept().await else {
                    return;
                };
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match c.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let mut body = String::from("# TYPE vllm:num_requests_running gauge\n");
                for i in 0..per_scrape {
                    body.push_str(&format!(
                        "vllm:num_requests_running{{model_name=\"m\",id=\"{scrape}-{i}\"}} 1\n"
                    ));
                }
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = c.write_all(answer.as_bytes()).await;
            }
        });
        addr
    }

    #[tokio::test]
    async fn a_worker_inventing_series_is_held_within_the_cap_and_written_whole() {
        let addr = inventive_worker(300).await;
        let url =
            Endpoint::parse(&format!("http://{addr}/metrics")).unwrap_or_else(|e| panic!("{e}"));
        let engine = Scraper::engine_for(&url, &crate::net::tls::TlsOptions::default())
            .unwrap_or_else(|e| panic!("{e}"));
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("worker_metrics.parquet");
        let sink = crate::record::scrapes::Sink::start(&path, SINK_QUEUE)
            .unwrap_or_else(|e| panic!("{e}"));
        let caps = HoldCaps {
            bytes: HOLD_BYTES,
            series: 500,
            per_metric: 100,
        };
        let s = Scraper::new(
            ScrapeTarget { url, engine },
            clock::now_ns(),
            Duration::from_secs(5),
            Some(sink.sender()),
        )
        .with_caps(caps);
        for _ in 0..4 {
            s.scrape(Cause::Interval).await;
        }
        let g = s.take();
        assert_eq!((g.scrapes, g.failed), (4, 0), "{:?}", g.first_failure);
        assert_eq!(g.rows.len(), 100, "held rows stop at the cap");
        assert_eq!(g.not_held, 4 * 300 - 100);
        assert!(
            g.cap_reached
                .is_some_and(|w| w.contains("100 series of one metric"))
        );
        assert_eq!(g.not_written, 0);
        let written = tokio::task::spawn_blocking(move || sink.finish())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            written.map_err(|e| e.to_string()),
            Ok(4 * 300),
            "every sample is still written"
        );
        let back =
            crate::record::scrapes::read(&path, |_, _| true).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(back.len(), 1200);
    }
}
