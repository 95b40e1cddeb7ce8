//! `--worker-metrics` and `--gpu-metrics` (replay and serve): the flags checked against
//! each other and the plan, into the `run::scrape::ScrapeSpec` the run scrapes by
//! (`run::scrape` starts and stops the scrapers).

use std::time::Duration;

use super::args::ScrapeArgs;
use super::io::{CliError, usage};
use crate::config::flags;
use crate::drivers::scrape::Scraper;
use crate::model::Endpoint;
use crate::net::tls::TlsOptions;
use crate::run::scrape::{GpuFlag, ScrapeSpec};

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
            Some(crate::drivers::scrape::ScrapeTarget { url, engine })
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
