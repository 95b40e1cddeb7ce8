//! `replay --worker-metrics`: the flags checked, the scraper started beside the run and
//! stopped after it, and what it gathered written to `worker_metrics.parquet`
//! (`drivers::scrape` scrapes; `record::scrapes` writes).

use std::sync::Arc;

use super::args::ReplayArgs;
use super::io::{CliError, usage};
use crate::config::flags;
use crate::config::plan::Plan;
use crate::drivers::RunContext;
use crate::net::tls::TlsOptions;
use crate::record::rundir::{self, RunDir};

/// `--worker-metrics` (its URL, `None` for the endpoint's origin), `--scrape-interval` and
/// `--scrape-timeout`, checked.
pub(super) type ScrapeFlags = (
    Option<crate::model::Endpoint>,
    std::time::Duration,
    std::time::Duration,
);

pub(super) fn scrape_flags(
    args: &ReplayArgs,
    plan: &Plan,
) -> Result<Option<ScrapeFlags>, CliError> {
    let Some(url) = &args.worker_metrics else {
        return Ok(None);
    };
    if plan.campaign.is_some() {
        return Err(usage(
            "--worker-metrics does not go with a campaign plan yet: each arm is its own worker, and scraping them per arm is not built; replay one arm's workload as a plain plan with --worker-metrics",
        ));
    }
    let every = flags::seconds("--scrape-interval", args.scrape_interval).map_err(usage)?;
    if every < MIN_INTERVAL {
        return Err(usage(format!(
            "--scrape-interval {} is below {} s: every scrape opens a connection on the load generator's runtime; scrape less often",
            args.scrape_interval,
            MIN_INTERVAL.as_secs_f64()
        )));
    }
    let timeout = flags::seconds("--scrape-timeout", args.scrape_timeout).map_err(usage)?;
    let url = match url.as_str() {
        "" => None,
        u => Some(flags::endpoint("--worker-metrics", u).map_err(usage)?),
    };
    Ok(Some((url, every, timeout)))
}

/// The shortest `--scrape-interval`.
const MIN_INTERVAL: std::time::Duration = std::time::Duration::from_millis(50);

/// What scraping needs, checked before anything of the run exists: the URL (the
/// endpoint's origin's `/metrics` without one; the mock's under `--mock-worker`), its
/// engine (a bad CA file is a usage error now), the interval and the timeout.
pub(super) struct ScrapeSpec {
    url: crate::model::Endpoint,
    engine: crate::engine::Engine,
    every: std::time::Duration,
    timeout: std::time::Duration,
}

pub(super) fn spec(
    (url, every, timeout): ScrapeFlags,
    endpoint: &crate::model::Endpoint,
    args: &ReplayArgs,
) -> Result<ScrapeSpec, CliError> {
    let url = url.unwrap_or_else(|| crate::model::Endpoint {
        path_and_query: "/metrics".into(),
        ..endpoint.clone()
    });
    let tls = TlsOptions {
        ca_file: args.ca_cert.clone(),
    };
    let engine = crate::drivers::scrape::Scraper::engine_for(&url, &tls)
        .map_err(|e| usage(format!("--worker-metrics {}: {e}", url.path_and_query)))?;
    Ok(ScrapeSpec {
        url,
        engine,
        every,
        timeout,
    })
}

/// A scraper running beside the run, and how to stop its interval task.
pub(super) type Scraping = (
    Arc<crate::drivers::scrape::Scraper>,
    tokio::sync::watch::Sender<bool>,
    tokio::task::JoinHandle<()>,
);

/// Scrape the worker's metrics from now on: every interval, and at the edges of every
/// measured round (through the run context).
pub(super) fn start_scraping(spec: ScrapeSpec, run: &Arc<RunContext>, run_t0_ns: u64) -> Scraping {
    let s = crate::drivers::scrape::Scraper::new(spec.url, spec.engine, run_t0_ns, spec.timeout);
    let s = Arc::new(s);
    run.set_scraper(s.clone());
    let (stop, rx) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(s.clone().every(spec.every, rx));
    (s, stop, task)
}

/// Stop the interval scrapes and write what every scrape gathered to
/// `worker_metrics.parquet`; say how many scrapes failed (never fatal). Returns the rows
/// for the reports (empty when they could not be written).
pub(super) async fn end_scraping(
    (s, stop, task): Scraping,
    dir: &RunDir,
    quiet: bool,
) -> Vec<crate::record::scrapes::ScrapeRow> {
    let _ = stop.send(true);
    let _ = task.await;
    let g = s.take();
    let path = dir.path.join(rundir::WORKER_METRICS);
    let written = tokio::task::spawn_blocking(move || {
        crate::record::scrapes::write(&path, &g.rows).map(|n| (n, g))
    })
    .await;
    match written {
        Ok(Ok((rows, g))) => {
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
            if !quiet || g.failed > 0 {
                eprintln!(
                    "matrix-proxy: worker metrics: {} scrape(s){failed}, {rows} sample(s) in {}",
                    g.scrapes,
                    rundir::WORKER_METRICS
                );
            }
            g.rows
        }
        Ok(Err(e)) => {
            eprintln!("matrix-proxy: worker metrics not written: {e}");
            Vec::new()
        }
        Err(e) => {
            eprintln!("matrix-proxy: worker metrics not written: {e}");
            Vec::new()
        }
    }
}
