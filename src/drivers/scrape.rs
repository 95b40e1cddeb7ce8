//! The worker's own metrics (`--worker-metrics URL`): its Prometheus text scraped on the
//! run's clock, off the data path — every `--scrape-interval` from a task of its own, and
//! once just before and once just after each measured round (awaited, bounded by
//! `--scrape-timeout`), each on a fresh connection of its own. A failed scrape (refused,
//! timed out, not 200, or every line unreadable) is counted, never fatal; every sample is
//! sent to the run's sink (`worker_metrics.parquet`, written from a thread of its own as
//! the scrapes arrive), and only what the reports read is held in memory.

use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use crate::clock;
use crate::engine::lean::LeanRequest;
use crate::engine::{Capture, Engine};
use crate::model::{ConnectionPolicy, Endpoint};
use crate::record::scrapes::{RoundId, ScrapeRow};

/// The most bytes of one scrape that are read (vLLM's text is tens of kilobytes).
const SCRAPE_LIMIT: usize = 16 << 20;

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

/// What the scrapes gathered.
#[derive(Debug, Default)]
pub(crate) struct Gathered {
    /// The rows the reports read (every row of an edge scrape; of an interval scrape only
    /// the series a window's means and the report's lines read,
    /// `report::worker::read_between_edges`); every row goes to the sink.
    pub(crate) rows: Vec<ScrapeRow>,
    pub(crate) scrapes: u64,
    pub(crate) failed: u64,
    /// The first failure's reason.
    pub(crate) first_failure: Option<String>,
    /// Lines of answered scrapes that could not be read.
    pub(crate) unreadable_lines: u64,
}

impl Gathered {
    /// Another scraper's gathering added to this one (a campaign's arms).
    pub(crate) fn merge(&mut self, other: Gathered) {
        self.rows.extend(other.rows);
        self.rows.sort_by_key(|r| r.offset_us);
        self.scrapes += other.scrapes;
        self.failed += other.failed;
        self.unreadable_lines += other.unreadable_lines;
        if self.first_failure.is_none() {
            self.first_failure = other.first_failure;
        }
    }
}

/// Where a scrape's rows are written (`record::scrapes::Sink`).
pub(crate) type SinkTx = std::sync::mpsc::Sender<Vec<ScrapeRow>>;

/// How a campaign's arms scrape their workers (`--scrape-interval`, `--scrape-timeout`,
/// `--ca-cert`, the run's sink).
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) every: Duration,
    pub(crate) timeout: Duration,
    pub(crate) tls: crate::net::tls::TlsOptions,
    pub(crate) sink: SinkTx,
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
    /// Where every row goes; `None`: every row is held (a DCGM exporter's, small).
    sink: Option<SinkTx>,
}

impl Scraper {
    /// The engine that scrapes `url`: built before anything of the run exists, so a bad
    /// CA file is a usage error, not a half-made run.
    pub(crate) fn engine_for(
        url: &Endpoint,
        tls: &crate::net::tls::TlsOptions,
    ) -> Result<Engine, String> {
        Engine::new(url.scheme == crate::model::Scheme::Https, tls)
    }

    /// `url` is checked by the caller (`Endpoint::parse`); `engine` from [`Self::engine_for`];
    /// every row goes to `sink` (without one, every row is held).
    pub(crate) fn new(
        (url, engine): (Endpoint, Engine),
        run_t0_ns: u64,
        timeout: Duration,
        sink: Option<SinkTx>,
    ) -> Scraper {
        Scraper {
            engine,
            url,
            run_t0_ns,
            timeout,
            arm: None,
            gathered: Mutex::new(Gathered::default()),
            sink,
        }
    }

    /// This scraper's rows name `arm` (a campaign arm's worker).
    pub(crate) fn with_arm(mut self, arm: &str) -> Scraper {
        self.arm = Some(Arc::from(arm));
        self
    }

    /// One scrape, bounded by the timeout; its samples (or its failure) are kept.
    pub(crate) async fn scrape(&self, cause: Cause) {
        let started_ns = clock::now_ns();
        let wall_us = clock::wall_now_us();
        let result = tokio::time::timeout(self.timeout, self.get()).await;
        let offset_us = clock::us_between(self.run_t0_ns, started_ns);
        // Read outside the lock: a round-edge scrape never waits behind another's parse.
        let outcome = match result {
            Err(_) => Err(format!("no answer within {:?}", self.timeout)),
            Ok(Ok(text)) => {
                // Read off the runtime's threads: a big answer (up to 16 MiB) takes a
                // while, and exchanges run on them.
                let parsed = tokio::task::spawn_blocking(move || crate::prom::parse(&text)).await;
                match parsed {
                    Err(e) => Err(format!("the answer could not be read: {e}")),
                    Ok(scrape) => match (scrape.samples.is_empty(), scrape.errors.first()) {
                        (true, Some((line, why))) => {
                            Err(format!("no line could be read (line {line}: {why})"))
                        }
                        (true, None) => Err("an answer with no sample".into()),
                        (false, _) => Ok(scrape),
                    },
                }
            }
            Ok(Err(why)) => Err(why),
        };
        let (cause, round) = cause.split();
        let rows: Vec<ScrapeRow> = match &outcome {
            Ok(scrape) => scrape
                .samples
                .iter()
                .map(|s| ScrapeRow {
                    offset_us,
                    wall_time_us: wall_us,
                    cause,
                    round: round.clone(),
                    arm: self.arm.clone(),
                    metric: s.name.clone(),
                    labels: s.labels.clone(),
                    value: s.value,
                    kind: s.kind.clone(),
                })
                .collect(),
            Err(_) => Vec::new(),
        };
        // What the reports read stays; everything goes to the file.
        let kept: Vec<ScrapeRow> = match (&self.sink, cause) {
            (None, _) => rows,
            (Some(sink), c) => {
                let kept = match c {
                    "interval" => rows
                        .iter()
                        .filter(|r| crate::report::worker::read_between_edges(&r.metric))
                        .cloned()
                        .collect(),
                    _ => rows.clone(),
                };
                if !rows.is_empty() {
                    let _ = sink.send(rows);
                }
                kept
            }
        };
        let Ok(mut g) = self.gathered.lock() else {
            return;
        };
        g.scrapes += 1;
        match outcome {
            Ok(scrape) => {
                g.unreadable_lines += scrape.errors.len() as u64;
                g.rows.extend(kept);
            }
            Err(why) => {
                g.failed += 1;
                g.first_failure.get_or_insert(why);
            }
        }
    }

    /// GET the URL on a fresh connection: its body as text, or why not.
    async fn get(&self) -> Result<String, String> {
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
            .map_err(|e| e.message)?;
        let c = cap.into_captured();
        if c.body.truncated {
            return Err(format!(
                "the answer passed {} MiB, the most a scrape reads",
                SCRAPE_LIMIT >> 20
            ));
        }
        match c.status {
            Some(200) => Ok(String::from_utf8_lossy(&c.body.bytes).into_owned()),
            Some(s) => Err(format!("status {s}")),
            None => Err("no status".into()),
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

    /// What was gathered, taken out (the rows sorted by offset).
    pub(crate) fn take(&self) -> Gathered {
        let mut g = self
            .gathered
            .lock()
            .map(|mut g| std::mem::take(&mut *g))
            .unwrap_or_default();
        g.rows.sort_by_key(|r| r.offset_us);
        g
    }
}
