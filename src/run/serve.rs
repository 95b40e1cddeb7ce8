//! The serve run, from its complete resolved input ([`ServeInput`], which `cli::serve`
//! builds with the listener bound): the run directory and config.json, the recorder, the
//! live metrics and the scrapers, the driver (`drivers::serve::run`) until Ctrl-C /
//! SIGTERM, then drained, its parts closed and read back, and summary.json and config.json
//! written. Returns what the command prints ([`ServeEnd`]).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use super::{RunError, create_run_dir, metrics_http, run_id, scrape};
use crate::clock;
use crate::drivers::serve::{self, ServeOptions};
use crate::drivers::shutdown::Shutdown;
use crate::drivers::{RecordingEnd, RunContext};
use crate::engine::Engine;
use crate::record::RecorderOptions;
use crate::record::rundir::{self, RunDir};
use crate::redact::Redaction;
use crate::report::doc::config::Fields;
use crate::report::doc::summary::ServeSummary;
use crate::report::{self, ServeStats, config_json};

/// Where serve's files go and what the command shows.
pub(crate) struct ServeOutput {
    /// `--out`, or `runs/live-<UTC time>`.
    pub(crate) out: PathBuf,
    /// The user did not choose `out`: a taken name gets a numeric suffix.
    pub(crate) default_name: bool,
    pub(crate) quiet: bool,
}

/// How serve's rows are recorded (each value checked).
pub(crate) struct ServeRecording {
    pub(crate) part_rows: usize,
    pub(crate) part_seconds: f64,
    /// `--record-queue`, at least one.
    pub(crate) queue_rows: usize,
    pub(crate) redaction: Redaction,
}

/// serve's complete resolved input: every flag checked, the listener and
/// `--metrics-listen` bound, config.json's serve keys laid out; nothing below reads an
/// argument again.
pub(crate) struct ServeInput {
    pub(crate) listener: tokio::net::TcpListener,
    pub(crate) listen_addr: SocketAddr,
    pub(crate) metrics: Option<tokio::net::TcpListener>,
    pub(crate) opts: ServeOptions,
    pub(crate) engine: Engine,
    pub(crate) output: ServeOutput,
    pub(crate) recording: ServeRecording,
    /// serve's keys of config.json.
    pub(crate) fields: Fields,
    /// The command line as config.json records it (redacted).
    pub(crate) argv: Vec<String>,
    pub(crate) started_at_us: i64,
    /// How the upstream connections are used, as the banner says it.
    pub(crate) policy_name: &'static str,
    pub(crate) scrape: Option<scrape::ScrapeSpec>,
}

/// A stopped serve run as the command shows it: its counts and summary, the rows
/// recorded, the folder, and the problems met while closing and writing.
#[derive(Debug)]
pub(crate) struct ServeEnd {
    pub(crate) stats: ServeStats,
    pub(crate) summary: ServeSummary,
    pub(crate) rows: u64,
    pub(crate) dir: PathBuf,
    pub(crate) problems: Vec<String>,
}

/// The run, until Ctrl-C / SIGTERM (`interrupt`); then drain, close the parts, summarise.
pub(crate) async fn run(input: ServeInput, interrupt: Arc<Shutdown>) -> Result<ServeEnd, RunError> {
    let ServeInput {
        listener,
        metrics,
        opts,
        engine,
        output,
        recording,
        fields,
        scrape,
        ..
    } = input;
    let dir = create_run_dir(&output.out, output.default_name)?;
    let rid = run_id(input.started_at_us);
    let mut rec_opts = RecorderOptions::new(dir.exchanges());
    rec_opts.part_rows = recording.part_rows;
    rec_opts.part_seconds = recording.part_seconds;
    rec_opts.queue_rows = recording.queue_rows;
    rec_opts.redaction = recording.redaction.clone();
    rec_opts.slice = Some(crate::record::SERVE_SLICE);
    let mut config = config_json::config(&input.argv, &rid, input.started_at_us, fields);
    dir.write_json(rundir::CONFIG, &config)?;
    let run_t0_ns = clock::now_ns();
    let run = Arc::new(RunContext::start(&rid, run_t0_ns, rec_opts)?);
    let scraping = scrape::serve_start(scrape, &dir, run_t0_ns).await?;
    if !output.quiet {
        eprintln!(
            "matrix-proxy: serving {}://{} -> {} ({} upstream connections); recording to {}; Ctrl-C to stop",
            if opts.tls.is_some() { "https" } else { "http" },
            input.listen_addr,
            recording.redaction.url(&opts.upstream.url()),
            input.policy_name,
            dir.path.display()
        );
    }
    // Live metrics only when asked for: without them serve counts nothing more.
    let metrics_server =
        metrics.and_then(|l| metrics_http::start(Some(l), &Arc::default(), &run, output.quiet));
    let mut stats = serve::run(listener, opts, engine, run.clone(), interrupt).await;
    if let Some(m) = metrics_server {
        m.abort();
    }
    let worker = scrape::serve_end(scraping, &dir, output.quiet).await;
    let recording = run.finish_recording().await;
    stats.record_error = run.record_error();
    let mut end = summarised(&dir, stats, &recording, worker);
    if let Err(e) = dir.write_json(rundir::SUMMARY, &end.summary) {
        end.problems.push(e.to_string());
    }
    config_json::finished(&mut config);
    if let Err(e) = dir.write_json(rundir::CONFIG, &config) {
        end.problems.push(e.to_string());
    }
    Ok(end)
}

/// The stats completed from the rows read back, and the summary built from them, with the
/// rows recorded and the problems met so far.
fn summarised(
    dir: &RunDir,
    mut stats: ServeStats,
    recording: &RecordingEnd,
    worker: scrape::WorkerScrapes,
) -> ServeEnd {
    let mut problems: Vec<String> = recording.problems.iter().map(|e| e.to_string()).collect();
    let rows = read_back(dir, recording, &mut stats, &mut problems);
    // Every exchange forwarded and neither recorded nor dropped went unrecorded, whether
    // the stopped writer refused its row or lost it from its queue or open part.
    stats.unrecorded = stats
        .requests
        .saturating_sub(rows + stats.dropped_rows)
        .max(stats.unrecorded);
    // Unknown (null) when the writer failed: its measurement did not come back.
    let slice = recording
        .problems
        .is_empty()
        .then_some(recording.stats.longest_slice_us);
    let mut summary = report::serve_summary(&stats, rows, slice, None);
    summary.worker_metrics_limits = worker.limits;
    summary.worker_metrics_scrapes = worker.health;
    summary.worker = report::worker::whole_run(&worker.rows).map(|mut w| {
        w.two_sided = Some(report::worker::two_sided(
            report::doc::secs(stats.ok_ttft.p50),
            summary.successful_latency_seconds.p50,
            &w,
        ));
        w
    });
    ServeEnd {
        stats,
        summary,
        rows,
        dir: dir.path.clone(),
        problems,
    }
}

/// The closed parts read back into `stats`' routes and percentiles; the rows recorded (a
/// writer that failed reports nothing: what it kept is what reads back).
fn read_back(
    dir: &RunDir,
    recording: &RecordingEnd,
    stats: &mut ServeStats,
    problems: &mut Vec<String>,
) -> u64 {
    let mut table = report::routes::RouteTable::default();
    let mut rows_read = 0u64;
    let read = crate::record::read::for_each_row(&dir.exchanges(), |r| {
        rows_read += 1;
        table.add(&r.method, &r.url, r.status, r.sample)
    });
    if let Err(e) = read {
        problems.push(format!("reading the recorded rows back: {e}"));
    }
    (stats.routes, stats.ok_total, stats.ok_ttft) = table.finish();
    if recording.problems.is_empty() {
        recording.stats.rows
    } else {
        rows_read
    }
}
