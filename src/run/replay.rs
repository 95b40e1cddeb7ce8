//! The replay run, from its complete resolved input ([`ReplayInput`], which
//! `cli::replay::resolve` builds and nothing below re-checks): the run directory, plan.json
//! and config.json ([`create_run`]), the recorder, the live metrics and the scrapers, the
//! driver (`drivers::replay::run`), the recorder closed, then the documents
//! (`run::finish::replay_documents`).

use std::path::PathBuf;
use std::sync::Arc;

use super::finish::{ContractInput, Measured, ReplayEnd, RunFacts};
use super::{RunError, create_run_dir, metrics_http, run_id, scrape};
use crate::clock;
use crate::config::plan::Plan;
use crate::config::shape::Shape;
use crate::drivers::RunContext;
use crate::drivers::replay::{self, ReplayOptions};
use crate::drivers::shutdown::Shutdown;
use crate::engine::Engine;
use crate::mock::{MockConfig, MockWorker};
use crate::record::RecorderOptions;
use crate::record::rundir::{self, RunDir};
use crate::redact::{DEFAULT_REDACT_HEADERS, DEFAULT_REDACT_QUERY};
use crate::report::config_json;
use crate::report::doc::config::{
    Auth, Config, ContractRecord, Extra, MockRecord, ReplayRecording, ShardRecord,
};

/// The plan as the run sends it, and what the flags made of it.
pub(crate) struct PlanInput {
    /// The plan file's bytes (plan.json) and its path as given.
    pub(crate) bytes: Vec<u8>,
    pub(crate) path: PathBuf,
    /// As validated, sent where `--endpoint` or the mock worker says.
    pub(crate) plan: Plan,
    /// What `--sweep` or `--shard` make of the plan.
    pub(crate) shape: Shape,
    /// `--endpoint`, redacted as config.json records it.
    pub(crate) endpoint_override: Option<String>,
    /// `--start-at` of a shard (its index and count are the shape's), in wall-clock µs.
    pub(crate) start_at_us: Option<i64>,
}

/// The built-in mock worker, started, with its settings (`--mock-worker`).
pub(crate) struct MockInput {
    pub(crate) worker: MockWorker,
    pub(crate) config: MockConfig,
}

/// The bearer token and where it came from.
pub(crate) struct AuthInput {
    pub(crate) token_env: Option<String>,
    pub(crate) bearer_token: Option<String>,
}

/// Where the run's files go and what the command shows.
pub(crate) struct OutputInput {
    /// `--out`, or `runs/<plan stem>-<UTC time>`.
    pub(crate) out: PathBuf,
    /// The user did not choose `out`: a taken name gets a numeric suffix.
    pub(crate) default_name: bool,
    pub(crate) quiet: bool,
    pub(crate) json: bool,
}

/// How the rows are recorded (every value checked: each count at least one).
pub(crate) struct RecordingInput {
    /// Rows are recorded (not `--no-record`).
    pub(crate) exchanges: bool,
    pub(crate) max_record_body: usize,
    pub(crate) part_rows: usize,
    pub(crate) part_seconds: f64,
    /// `--record-hold`, or its default for this machine.
    pub(crate) record_hold: usize,
}

/// The run's complete resolved input: the plan and every flag, checked together once by
/// `cli::replay::resolve` (which owns every rule between them: the endpoint override, the
/// mock worker, `--sweep`, `--shard` and `--start-at`, the contract), before any output
/// exists. Nothing after it re-checks or changes the plan, or reads an argument again.
pub(crate) struct ReplayInput {
    pub(crate) plan: PlanInput,
    pub(crate) mock: Option<MockInput>,
    pub(crate) auth: AuthInput,
    pub(crate) engine: Engine,
    pub(crate) output: OutputInput,
    pub(crate) recording: RecordingInput,
    pub(crate) started_at_us: i64,
    pub(crate) grace: std::time::Duration,
    /// `--grace-seconds` as given (config.json).
    pub(crate) grace_seconds: f64,
    /// `--contract`, checked against the plan and the start.
    pub(crate) contract: Option<ContractInput>,
    pub(crate) runtime_threads: usize,
    /// The command line as config.json records it (redacted).
    pub(crate) argv: Vec<String>,
    /// `--metrics-listen`, bound.
    pub(crate) metrics: Option<tokio::net::TcpListener>,
    /// `--worker-metrics`: the URL with its engine, the interval and the timeout.
    pub(crate) scrape: Option<scrape::ScrapeSpec>,
    /// `--search` and its settings, checked (the plan's shape is `Shape::Search`).
    pub(crate) search: Option<crate::config::search::SearchSpec>,
}

/// The run: its directory created, the driver run, the recorder closed, the documents
/// written. `interrupt` is requested on Ctrl-C / SIGTERM.
pub(crate) async fn run(
    mut input: ReplayInput,
    interrupt: Arc<Shutdown>,
) -> Result<ReplayEnd, RunError> {
    let mut created = create_run(&input)?;
    let dir = &created.dir;
    let mut rec_opts = RecorderOptions::new(dir.exchanges());
    // A shard's ledger stays with its reports: exchanges/ holds partition folders only.
    if created.shard_start_ns.is_some() {
        rec_opts.ledger = Some(dir.path.join(crate::record::LEDGER));
    }
    rec_opts.part_rows = input.recording.part_rows;
    rec_opts.part_seconds = input.recording.part_seconds;
    rec_opts.hold_bytes = input.recording.record_hold;
    let run = Arc::new(RunContext::start(&created.run_id, created.t0_ns, rec_opts)?);
    let quiet = input.output.quiet;
    // Live metrics for the progress line and --metrics-listen; neither: none are counted.
    let metrics = input.metrics.take();
    let metrics_server = (!quiet || metrics.is_some()).then(|| {
        let t = Arc::new(crate::telemetry::Telemetry::new());
        metrics_http::start(metrics, &t, &run, quiet)
    });
    let scraping = match input.scrape.take() {
        Some(spec) => Some(scrape::start_scraping(
            spec,
            Some(&run),
            dir,
            created.t0_ns,
        )?),
        None => None,
    };
    let arm_scrape = scraping.as_ref().map(|s| s.for_arms());
    let plan = input.plan.plan.clone();
    let result = replay::run(
        ReplayOptions {
            plan: plan.clone(),
            shape: input.plan.shape,
            bearer_token: input.auth.bearer_token.take(),
            max_record_body: input.recording.max_record_body,
            quiet,
            record_exchanges: input.recording.exchanges,
            grace: input.grace,
            shard_start_ns: created.shard_start_ns,
            search: input.search.clone(),
        },
        input.engine,
        run.clone(),
        interrupt,
        replay::ArmEnv {
            self_exe: std::env::current_exe().unwrap_or_else(|_| PathBuf::from("matrix-proxy")),
            logs: dir.path.join(rundir::SERVERS),
            scrape: arm_scrape,
        },
    )
    .await;
    if let Some(m) = metrics_server.flatten() {
        m.abort();
    }
    let scraped = match scraping {
        Some(s) => scrape::end_scraping(s, dir, quiet).await,
        None => scrape::WorkerScrapes::default(),
    };
    let recording = run.finish_recording().await;
    if let Some(m) = input.mock {
        m.worker.shutdown().await;
    }
    let facts = RunFacts {
        dir: &created.dir,
        plan: &plan,
        shape: input.plan.shape,
        contract: input.contract.as_ref(),
        search: input.search.as_ref(),
        record_exchanges: input.recording.exchanges,
        table: !quiet && !input.output.json,
    };
    let measured = Measured {
        result,
        scraped,
        recording,
    };
    Ok(super::finish::replay_documents(
        &facts,
        &mut created.config,
        measured,
    ))
}

/// What [`create_run`] made: the run directory, its id and clock start, config.json as
/// written, and a shard's shared start on the run clock.
struct Created {
    dir: RunDir,
    run_id: String,
    t0_ns: u64,
    config: Config,
    shard_start_ns: Option<u64>,
}

/// The run directory, the plan's bytes and config.json. A default name that is taken gets
/// a numeric suffix (so the demo command can be run again and again); an explicit `--out`
/// is never reused.
fn create_run(input: &ReplayInput) -> Result<Created, RunError> {
    let (plan, out) = (&input.plan, &input.output.out);
    let dir = match plan.shape.shard_of() {
        Some((i, _)) => RunDir::create_shard(out, i).map_err(|e| {
            RunError::Usage(format!(
                "--out {} --shard: {e}; each shard's folders are new",
                out.display()
            ))
        })?,
        None => create_run_dir(out, input.output.default_name)?,
    };
    dir.write_file(rundir::PLAN, &plan.bytes)?;
    copy_trace(plan, &dir)?;
    let rid = run_id(input.started_at_us);
    let run_t0_ns = clock::now_ns();
    // The shared start on this process's run clock: `summarize OUT` puts every shard's
    // offsets on one timeline from it.
    let shard = plan
        .shape
        .shard_of()
        .zip(plan.start_at_us)
        .map(|((index, count), at_us)| ShardRecord {
            index,
            count,
            start_at: clock::iso_utc(at_us),
            start_at_offset_us: (at_us - clock::wall_now_us())
                + clock::us_between(run_t0_ns, clock::now_ns()),
        });
    let shard_start_ns = shard
        .as_ref()
        .map(|s| run_t0_ns.saturating_add_signed(s.start_at_offset_us.saturating_mul(1000)));
    let fields = config_json::replay_fields(
        &plan.plan,
        config_json::ReplayKeys {
            shape: plan.shape,
            search: input.search.as_ref().map(search_record),
            plan_path: &plan.path.display().to_string(),
            plan_sha256: &rundir::sha256_hex(&plan.bytes),
            run_t0_ns,
            extra: extra(input),
            contract: input
                .contract
                .as_ref()
                .map(|c| contract_record(&c.contract, &c.path)),
            shard,
        },
    );
    let config = config_json::config(&input.argv, &rid, input.started_at_us, fields);
    dir.write_json(rundir::CONFIG, &config)?;
    banner(input, &dir);
    Ok(Created {
        dir,
        run_id: rid,
        t0_ns: run_t0_ns,
        config,
        shard_start_ns,
    })
}

/// A trace plan's trace file, copied into the run at the same place beside its plan.json
/// (as the run keeps plan.json), so the run reads back alone; refused when the copy is not
/// the file the plan pins (it changed since it was read).
fn copy_trace(plan: &PlanInput, dir: &RunDir) -> Result<(), RunError> {
    use crate::config::load::TraceSource;
    let Some(TraceSource::File { path, sha256 }) = plan.plan.load.trace.as_ref().map(|t| &t.source)
    else {
        return Ok(());
    };
    let from = crate::run::open::trace_path(&plan.path, path);
    let got = dir.copy_in(path, &from)?;
    if &got != sha256 {
        return Err(RunError::Usage(format!(
            "{}: changed while the run started (its SHA-256 is now {got}, the plan pins {sha256}); run again with the trace the plan pins",
            from.display()
        )));
    }
    Ok(())
}

/// config.json's keys of a replay run beyond the plan's.
fn extra(input: &ReplayInput) -> Extra {
    let r = &input.recording;
    Extra {
        endpoint_override: input.plan.endpoint_override.clone(),
        grace_seconds: input.grace_seconds,
        mock_worker: input.mock.as_ref().map(|m| MockRecord {
            url: m.worker.url(),
            prefill_ms: m.config.prefill_ms,
            per_token_ms: m.config.per_token_ms,
            max_batch: m.config.max_batch,
            default_max_tokens: m.config.default_max_tokens,
            prefill_per_token_ms: m.config.prefill_per_token_ms,
            prefix_cache_blocks: m.config.prefix_cache_blocks,
            invalid_tool_call_share: m.config.invalid_tool_call_share,
        }),
        runtime_threads: input.runtime_threads,
        metrics_listen: metrics_http::address(input.metrics.as_ref()),
        auth: Auth {
            bearer_token_env: input.auth.token_env.clone(),
            bearer_token_sent: input.auth.bearer_token.is_some(),
        },
        recording: ReplayRecording {
            exchanges: r.exchanges,
            max_record_body_bytes: r.max_record_body,
            record_hold_bytes: r.record_hold,
            redacted_headers: DEFAULT_REDACT_HEADERS
                .iter()
                .map(|h| h.to_string())
                .collect(),
            redacted_query_parameters: DEFAULT_REDACT_QUERY.iter().map(|q| q.to_string()).collect(),
        },
    }
}

/// config.json's record of `--search`.
fn search_record(
    s: &crate::config::search::SearchSpec,
) -> crate::report::doc::config::SearchRecord {
    crate::report::doc::config::SearchRecord {
        kind: s.kind.as_str().into(),
        slo: s.slo_text(),
        confidence: s.confidence,
        margin: s.margin,
        good_share_min: s.good_share_min,
        budget_seconds: s.budget.map(|b| b.as_secs_f64()),
        from: s.from,
        ceiling: s.ceiling,
    }
}

/// config.json's record of the contract a run was started with.
fn contract_record(
    c: &crate::config::contract::Contract,
    path: &std::path::Path,
) -> ContractRecord {
    ContractRecord {
        path: path.display().to_string(),
        sha256: c.sha256.clone(),
        plan_id: c.plan_id.clone(),
        locked_at: c.locked_at.clone(),
        locked_by: c.locked_by.clone(),
    }
}

/// The run's first lines: what is replayed where (unless `--quiet`), and each case whose
/// measured rounds cannot reach every variant (also under `--quiet`: a verdict on a
/// fraction of the prompts is a finding).
fn banner(input: &ReplayInput, dir: &RunDir) {
    let plan = &input.plan.plan;
    let planned = match &input.search {
        Some(s) => format!(
            "searching by {} for {}: {} requests per probe (a concurrency probe at least 10 per worker), probes chosen as it goes",
            s.kind.as_str(),
            s.slo_text(),
            crate::search::judge::planned_requests(s)
        ),
        None => format!(
            "{} planned requests",
            input.plan.shape.planned_requests(plan)
        ),
    };
    if !input.output.quiet {
        eprintln!(
            "matrix-proxy: replaying {} -> {} ({planned}, {} connections); run directory {}",
            input.plan.path.display(),
            targets(plan),
            plan.connection.as_str(),
            dir.path.display()
        );
    }
    say_unmeasured(plan, "matrix-proxy: ");
}

/// Each case whose measured rounds cannot reach every variant, one warning line each
/// after `prefix` (`validate`, `replay`).
pub(crate) fn say_unmeasured(plan: &Plan, prefix: &str) {
    for w in plan.unmeasured_variants() {
        eprintln!("{prefix}{w}");
    }
}

/// Where the cases really go, for the banner: the URL when every case uses the same one,
/// else the origin and each distinct path (a case's `path` replaces the endpoint's).
fn targets(plan: &Plan) -> String {
    if let Some(c) = &plan.campaign {
        let names: Vec<&str> = c.arms.iter().map(|a| a.name.as_str()).collect();
        return format!(
            "campaign '{}', {} arm(s): {} ({} schedule; counts below are per arm)",
            plan.name.as_deref().unwrap_or_default(),
            names.len(),
            names.join(", "),
            c.schedule.as_str()
        );
    }
    let mut urls: Vec<String> = Vec::new();
    for c in &plan.cases {
        let u = config_json::redacted(&c.endpoint.url());
        if !urls.contains(&u) {
            urls.push(u);
        }
    }
    match urls.as_slice() {
        [one] => one.clone(),
        _ => {
            let origin = plan.endpoint.with_path("/").url();
            let paths: Vec<String> = plan
                .cases
                .iter()
                .map(|c| c.endpoint.path_and_query.clone())
                .fold(Vec::new(), |mut v, p| {
                    if !v.contains(&p) {
                        v.push(p);
                    }
                    v
                });
            format!(
                "{} (paths {})",
                origin.trim_end_matches('/'),
                config_json::redacted(&paths.join(", "))
            )
        }
    }
}
