//! The worker's `/metrics` and the GPU sampled beside a run (`--worker-metrics`,
//! `--gpu-metrics` of replay and serve): the scrapers and the GPU sampler started beside
//! the run and stopped after it, and what they gathered written to
//! `worker_metrics.parquet` and `gpu.parquet` (`drivers::scrape` and `drivers::gpu`
//! gather; `record::scrapes` and `record::gpu` write). `cli::scrape` checks the flags
//! into a [`ScrapeSpec`].

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::RunError;
use crate::drivers::RunContext;
use crate::drivers::gpu::GpuGathered;
use crate::drivers::scrape::{Cause, Gathered, ScrapeTarget, Scraper};
use crate::model::Endpoint;
use crate::net::tls::TlsOptions;
use crate::record::rundir::{self, RunDir};
use crate::record::scrapes::ScrapeRow;
use crate::report::doc::worker::WorkerLimits;

/// `--gpu-metrics`.
#[derive(Debug, Clone)]
pub(crate) enum GpuFlag {
    Auto,
    Off,
    Dcgm(Endpoint),
}

/// What scraping needs, checked before anything of the run exists: the worker's URL and
/// its engine (a bad CA file is a usage error now), the interval, the timeout, the GPU's
/// source with its engine, and the TLS options an arm's scraper is built with.
pub(crate) struct ScrapeSpec {
    pub(crate) worker: Option<ScrapeTarget>,
    pub(crate) every: Duration,
    pub(crate) timeout: Duration,
    pub(crate) gpu: GpuFlag,
    pub(crate) dcgm_engine: Option<crate::engine::Engine>,
    pub(crate) tls: TlsOptions,
}

/// The scrapers running beside the run, the file their rows go to, and how to stop their
/// tasks.
pub(crate) struct Scraping {
    worker: Option<Arc<Scraper>>,
    /// The run whose arms' scrapers are gathered at the end (replay).
    run: Option<Arc<RunContext>>,
    sink: crate::record::scrapes::Sink,
    dcgm: Option<Arc<Scraper>>,
    gpu: Arc<Mutex<GpuGathered>>,
    gpu_off: bool,
    stop: tokio::sync::watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// How a campaign's arms scrape their workers.
    arms: crate::drivers::scrape::Settings,
}

impl Scraping {
    /// One awaited scrape of the worker (serve's `run_start` and `run_end`).
    pub(crate) async fn edge(&self, cause: Cause) {
        if let Some(w) = &self.worker {
            w.scrape(cause).await;
        }
    }

    /// How a campaign's arms scrape their workers (into the same file).
    pub(crate) fn for_arms(&self) -> crate::drivers::scrape::Settings {
        self.arms.clone()
    }
}

/// Scrape the worker's metrics (and sample the GPU) from now on, every interval, into
/// `dir`'s worker_metrics.parquet; with `run` (replay), also at the edges of every
/// measured round.
pub(crate) fn start_scraping(
    spec: ScrapeSpec,
    run: Option<&Arc<RunContext>>,
    dir: &RunDir,
    run_t0_ns: u64,
) -> Result<Scraping, RunError> {
    let sink = crate::record::scrapes::Sink::start(
        &dir.path.join(rundir::WORKER_METRICS),
        crate::drivers::scrape::SINK_QUEUE,
    )
    .map_err(|e| RunError::Tool(e.to_string()))?;
    let (stop, rx) = tokio::sync::watch::channel(false);
    let mut tasks = Vec::new();
    let worker = spec.worker.map(|w| {
        let w = Arc::new(Scraper::new(
            w,
            run_t0_ns,
            spec.timeout,
            Some(sink.sender()),
        ));
        if let Some(run) = run {
            run.set_scraper(w.clone());
        }
        tasks.push(tokio::spawn(w.clone().every(spec.every, rx.clone())));
        w
    });
    let worker_tasks = tasks.len();
    let gpu = Arc::new(Mutex::new(GpuGathered::default()));
    let mut dcgm = None;
    match (spec.gpu, spec.dcgm_engine) {
        (GpuFlag::Dcgm(url), Some(engine)) => {
            let s = Arc::new(
                Scraper::new(ScrapeTarget { url, engine }, run_t0_ns, spec.timeout, None).for_gpu(),
            );
            tasks.push(tokio::spawn(s.clone().every(spec.every, rx)));
            dcgm = Some(s);
        }
        (GpuFlag::Auto, _) => {
            let f = crate::drivers::gpu::nvidia_smi(run_t0_ns, spec.every, rx, gpu.clone());
            tasks.push(tokio::spawn(f));
        }
        _ => {}
    }
    let arms = crate::drivers::scrape::Settings {
        every: spec.every,
        timeout: spec.timeout,
        tls: spec.tls,
        sink: sink.sender(),
    };
    let gpu_off = tasks.len() == worker_tasks;
    Ok(Scraping {
        worker,
        run: run.cloned(),
        sink,
        dcgm,
        gpu,
        gpu_off,
        stop,
        tasks,
        arms,
    })
}

/// What the scrapes leave the reports: the rows they read (every scraper's, within the
/// caps) and, when a bound was reached, what was not held or not written.
#[derive(Debug, Default)]
pub(crate) struct WorkerScrapes {
    pub(crate) rows: Vec<ScrapeRow>,
    pub(crate) limits: Option<WorkerLimits>,
    /// How each scraped worker answered; `None` without `--worker-metrics`.
    pub(crate) health: Option<Vec<crate::report::doc::worker::ScrapeHealth>>,
}

impl WorkerScrapes {
    fn of(g: Gathered) -> WorkerScrapes {
        let limits = (g.not_held > 0 || g.not_written > 0).then_some(WorkerLimits {
            cap_reached: g.cap_reached,
            samples_not_held: g.not_held,
            samples_not_written: g.not_written,
        });
        WorkerScrapes {
            rows: g.rows,
            limits,
            health: (!g.health.is_empty()).then_some(g.health),
        }
    }
}

/// Stop the interval scrapes and the GPU sampler; close `worker_metrics.parquet` and write
/// `gpu.parquet`; say how many scrapes failed and why there is no GPU telemetry (never
/// fatal). Returns the rows the reports read (every scraper's).
pub(crate) async fn end_scraping(s: Scraping, dir: &RunDir, quiet: bool) -> WorkerScrapes {
    let _ = s.stop.send(true);
    for t in s.tasks {
        let _ = t.await;
    }
    write_gpu(s.dcgm.as_deref(), &s.gpu, s.gpu_off, dir, quiet).await;
    let mut g = s.worker.map(|w| w.take()).unwrap_or_default();
    if let Some(run) = &s.run {
        g.merge(run.take_arm_scrapes());
    }
    let sink = s.sink;
    let rows = match tokio::task::spawn_blocking(move || sink.finish()).await {
        Ok(Ok(n)) => n,
        Ok(Err(e)) => {
            eprintln!("matrix-proxy: worker metrics not written whole: {e}");
            return WorkerScrapes::of(g);
        }
        Err(e) => {
            eprintln!("matrix-proxy: worker metrics not written whole: {e}");
            return WorkerScrapes::of(g);
        }
    };
    let mut failed = match &g.first_failure {
        Some(why) => format!(", {} failed (first: {why})", g.failed),
        None => String::new(),
    };
    if g.unreadable_lines > 0 {
        failed.push_str(&format!(
            ", {} unreadable line(s) skipped",
            g.unreadable_lines
        ));
    }
    if g.not_held > 0 {
        failed.push_str(&format!(
            ", {} sample(s) not held for the worker's numbers ({})",
            g.not_held,
            g.cap_reached.as_deref().unwrap_or("a cap")
        ));
    }
    if g.not_written > 0 {
        failed.push_str(&format!(
            ", {} sample(s) dropped: the file's writer fell behind",
            g.not_written
        ));
    }
    if !quiet || g.failed > 0 || g.not_held > 0 || g.not_written > 0 {
        eprintln!(
            "matrix-proxy: worker metrics: {} scrape(s){failed}, {rows} sample(s) in {}",
            g.scrapes,
            rundir::WORKER_METRICS
        );
    }
    WorkerScrapes::of(g)
}

/// serve's scraping: the whole run is one window, opened here (awaited, bounded by
/// `--scrape-timeout`) and closed by [`serve_end`] after the last exchange.
pub(crate) async fn serve_start(
    spec: Option<ScrapeSpec>,
    dir: &RunDir,
    run_t0_ns: u64,
) -> Result<Option<Scraping>, RunError> {
    let Some(spec) = spec else {
        return Ok(None);
    };
    let s = start_scraping(spec, None, dir, run_t0_ns)?;
    s.edge(Cause::RunStart).await;
    Ok(Some(s))
}

/// serve's window closed and everything written: the rows the summary reads.
pub(crate) async fn serve_end(s: Option<Scraping>, dir: &RunDir, quiet: bool) -> WorkerScrapes {
    let Some(s) = s else {
        return WorkerScrapes::default();
    };
    s.edge(Cause::RunEnd).await;
    end_scraping(s, dir, quiet).await
}

/// gpu.parquet, when any GPU sample came; else, once, why not.
async fn write_gpu(
    dcgm: Option<&Scraper>,
    gpu: &Mutex<GpuGathered>,
    off: bool,
    dir: &RunDir,
    quiet: bool,
) {
    if off {
        return;
    }
    let mut g = gpu
        .lock()
        .map(|mut g| std::mem::take(&mut *g))
        .unwrap_or_default();
    if let Some(d) = dcgm {
        let got = d.take();
        g.samples = got.scrapes - got.failed;
        if let Some(why) = got.first_failure {
            g.said = Some(format!(
                "{} of {} DCGM scrape(s) failed (first: {why})",
                got.failed, got.scrapes
            ));
        }
        g.rows = crate::drivers::gpu::from_dcgm(got.rows);
    }
    let said = g.said.take();
    if g.rows.is_empty() {
        // Absent GPUs are said once, not as errors.
        if !quiet {
            let why = said.unwrap_or_else(|| "no sample came".into());
            eprintln!("matrix-proxy: no GPU telemetry: {why}");
        }
        return;
    }
    let path = dir.path.join(rundir::GPU);
    let samples = g.samples;
    let rows = std::mem::take(&mut g.rows);
    let written =
        tokio::task::spawn_blocking(move || crate::record::gpu::write(&path, &rows)).await;
    match written {
        Ok(Ok(n)) if !quiet => {
            let note = said.map(|w| format!(" ({w})")).unwrap_or_default();
            eprintln!(
                "matrix-proxy: GPU telemetry: {samples} sample(s), {n} row(s) in {}{note}",
                rundir::GPU
            );
        }
        Ok(Ok(_)) => {}
        Ok(Err(e)) => eprintln!("matrix-proxy: GPU telemetry not written: {e}"),
        Err(e) => eprintln!("matrix-proxy: GPU telemetry not written: {e}"),
    }
}
