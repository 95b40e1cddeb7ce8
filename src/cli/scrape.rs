//! `--worker-metrics` and `--gpu-metrics` (replay and serve): the flags checked, the
//! scrapers and the GPU sampler started beside the run and stopped after it, and what they
//! gathered written to `worker_metrics.parquet` and `gpu.parquet` (`drivers::scrape` and
//! `drivers::gpu` gather; `record::scrapes` and `record::gpu` write).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::args::ScrapeArgs;
use super::io::{CliError, usage};
use crate::config::flags;
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
pub(super) enum GpuFlag {
    Auto,
    Off,
    Dcgm(Endpoint),
}

/// The flags, checked: `--worker-metrics` (or the plan's `worker_metrics`),
/// `--scrape-interval`, `--scrape-timeout`, `--gpu-metrics`.
pub(super) struct ScrapeFlags {
    /// The worker scraped by the command itself: `None` none (a campaign's arms scrape
    /// their own); `Some(None)` the worker's origin's `/metrics`; `Some(Some(url))`.
    url: Option<Option<Endpoint>>,
    pub(super) every: Duration,
    pub(super) timeout: Duration,
    gpu: GpuFlag,
}

/// The shortest `--scrape-interval`.
const MIN_INTERVAL: Duration = Duration::from_millis(50);

/// What asks for scraping besides the flag: a plain plan's `worker_metrics`, or whether
/// any arm of a campaign scrapes its worker.
pub(super) enum FromPlan<'a> {
    Plain(Option<&'a Option<Endpoint>>),
    Campaign {
        arms_scrape: bool,
    },
    /// serve: only the flag.
    None,
}

/// `None` when nothing is scraped (then the tuning flags are refused: they would do
/// nothing).
pub(super) fn scrape_flags(
    args: &ScrapeArgs,
    plan: FromPlan<'_>,
) -> Result<Option<ScrapeFlags>, CliError> {
    let flag = match args.worker_metrics.as_deref() {
        None => None,
        Some("") => Some(None),
        Some(u) => Some(Some(flags::endpoint("--worker-metrics", u).map_err(usage)?)),
    };
    let url = match (flag, plan) {
        (Some(_), FromPlan::Campaign { .. }) => {
            return Err(usage(
                "--worker-metrics does not go with a campaign plan: each arm is its own worker; give an arm its own `worker_metrics` in the plan (an arm the tool starts is scraped at its origin's /metrics by default)",
            ));
        }
        (Some(f), _) => Some(f),
        (None, FromPlan::Plain(Some(p))) => Some(p.clone()),
        (None, FromPlan::Campaign { arms_scrape: true }) => None,
        (None, _) => {
            let given = [
                ("--scrape-interval", args.scrape_interval.is_some()),
                ("--scrape-timeout", args.scrape_timeout.is_some()),
                ("--gpu-metrics", args.gpu_metrics.is_some()),
            ];
            if let Some((name, _)) = given.iter().find(|(_, g)| *g) {
                return Err(usage(format!(
                    "{name} goes with --worker-metrics (or a plan's worker_metrics): nothing is scraped in this run"
                )));
            }
            return Ok(None);
        }
    };
    let interval = args.scrape_interval.unwrap_or(1.0);
    let every = flags::seconds("--scrape-interval", interval).map_err(usage)?;
    if every < MIN_INTERVAL {
        return Err(usage(format!(
            "--scrape-interval {interval} is below {} s: every scrape opens a connection on the load generator's runtime; scrape less often",
            MIN_INTERVAL.as_secs_f64()
        )));
    }
    let timeout =
        flags::seconds("--scrape-timeout", args.scrape_timeout.unwrap_or(2.0)).map_err(usage)?;
    let gpu = match args.gpu_metrics.as_deref().unwrap_or("auto") {
        "auto" => GpuFlag::Auto,
        "off" => GpuFlag::Off,
        u => GpuFlag::Dcgm(flags::endpoint("--gpu-metrics", u).map_err(|e| {
            usage(format!(
                "{e} (--gpu-metrics takes auto, off or a DCGM exporter's URL)"
            ))
        })?),
    };
    Ok(Some(ScrapeFlags {
        url,
        every,
        timeout,
        gpu,
    }))
}

/// What scraping needs, checked before anything of the run exists: the worker's URL and
/// its engine (a bad CA file is a usage error now), the interval, the timeout, the GPU's
/// source with its engine, and the TLS options an arm's scraper is built with.
pub(super) struct ScrapeSpec {
    worker: Option<ScrapeTarget>,
    every: Duration,
    timeout: Duration,
    gpu: GpuFlag,
    dcgm_engine: Option<crate::engine::Engine>,
    tls: TlsOptions,
}

/// `origin`: the worker's endpoint (its path is replaced by `/metrics` without a URL).
pub(super) fn spec(
    f: ScrapeFlags,
    origin: &Endpoint,
    ca_file: Option<std::path::PathBuf>,
) -> Result<ScrapeSpec, CliError> {
    let tls = TlsOptions { ca_file };
    let worker = match f.url {
        None => None,
        Some(url) => {
            let url = url.unwrap_or_else(|| origin.with_path("/metrics"));
            let engine = Scraper::engine_for(&url, &tls)
                .map_err(|e| usage(format!("--worker-metrics {}: {e}", url.path_and_query)))?;
            Some(ScrapeTarget { url, engine })
        }
    };
    let dcgm_engine = match &f.gpu {
        GpuFlag::Dcgm(u) => Some(
            Scraper::engine_for(u, &tls)
                .map_err(|e| usage(format!("--gpu-metrics {}: {e}", u.path_and_query)))?,
        ),
        _ => None,
    };
    Ok(ScrapeSpec {
        worker,
        every: f.every,
        timeout: f.timeout,
        gpu: f.gpu,
        dcgm_engine,
        tls,
    })
}

/// The scrapers running beside the run, the file their rows go to, and how to stop their
/// tasks.
pub(super) struct Scraping {
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
    pub(super) async fn edge(&self, cause: Cause) {
        if let Some(w) = &self.worker {
            w.scrape(cause).await;
        }
    }

    /// How a campaign's arms scrape their workers (into the same file).
    pub(super) fn for_arms(&self) -> crate::drivers::scrape::Settings {
        self.arms.clone()
    }
}

/// Scrape the worker's metrics (and sample the GPU) from now on, every interval, into
/// `dir`'s worker_metrics.parquet; with `run` (replay), also at the edges of every
/// measured round.
pub(super) fn start_scraping(
    spec: ScrapeSpec,
    (run, dir): (Option<&Arc<RunContext>>, &RunDir),
    run_t0_ns: u64,
) -> Result<Scraping, CliError> {
    let sink = crate::record::scrapes::Sink::start(
        &dir.path.join(rundir::WORKER_METRICS),
        crate::drivers::scrape::SINK_QUEUE,
    )
    .map_err(|e| super::io::tool(e.to_string()))?;
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
pub(super) struct WorkerScrapes {
    pub(super) rows: Vec<ScrapeRow>,
    pub(super) limits: Option<WorkerLimits>,
    /// How each scraped worker answered; `None` without `--worker-metrics`.
    pub(super) health: Option<Vec<crate::report::doc::worker::ScrapeHealth>>,
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
pub(super) async fn end_scraping(s: Scraping, dir: &RunDir, quiet: bool) -> WorkerScrapes {
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
pub(super) async fn serve_start(
    spec: Option<ScrapeSpec>,
    dir: &RunDir,
    run_t0_ns: u64,
) -> Result<Option<Scraping>, CliError> {
    let Some(spec) = spec else {
        return Ok(None);
    };
    let s = start_scraping(spec, (None, dir), run_t0_ns)?;
    s.edge(Cause::RunStart).await;
    Ok(Some(s))
}

/// serve's window closed and everything written: the rows the summary reads.
pub(super) async fn serve_end(s: Option<Scraping>, dir: &RunDir, quiet: bool) -> WorkerScrapes {
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
