//! The `replay` command, step by step: check every input before any output exists,
//! start the mock worker when asked, create the run directory and config.json, run, and
//! write the reports (each even if an earlier one failed, so nothing is lost).

use crate::drivers::shutdown::Shutdown;
use std::path::PathBuf;
use std::sync::Arc;

use super::args::{REPLAY_GRACE_SECONDS, ReplayArgs};
use super::io::{
    CliError, Exit, argv, create_run_dir, load_plan, print_json, print_stdout, read_token, run_id,
    runtime_threads, seconds, tool, usage,
};
use crate::clock;
use crate::config::contract::Contract;
use crate::config::flags;
use crate::config::plan::Plan;
use crate::config::shape::Shape;
use crate::drivers::replay::{self, ReplayOptions};
use crate::drivers::{RecordingEnd, RunContext};
use crate::engine::Engine;
use crate::mock::{MockConfig, MockWorker};
use crate::model::{Endpoint, Scheme};
use crate::net::tls::TlsOptions;
use crate::record::RecorderOptions;
use crate::record::rundir::{self, RunDir};
use crate::redact::{DEFAULT_REDACT_HEADERS, DEFAULT_REDACT_QUERY};
use crate::report::doc::Failures;
use crate::report::doc::campaign::CampaignDoc;
use crate::report::doc::config::{Auth, Config, Extra, MockRecord, ReplayRecording, ShardRecord};
use crate::report::{self, Ending, Recording, config_json};

/// The run's resolved input: the plan and every flag, checked together once
/// ([`ReplayRun::resolve`], which owns every rule between them: the endpoint override,
/// the mock worker, `--sweep`, `--shard` and `--start-at`, the contract), before any
/// output exists. Nothing after it re-checks or changes the plan.
struct ReplayRun {
    plan_bytes: Vec<u8>,
    /// As validated, sent where `--endpoint` or the mock worker says.
    plan: Plan,
    /// What `--sweep` or `--shard` make of the plan.
    shape: Shape,
    /// The built-in mock worker, started, with its settings (`--mock-worker`).
    mock: Option<(MockWorker, MockConfig)>,
    token_env: Option<String>,
    bearer_token: Option<String>,
    engine: Engine,
    out: PathBuf,
    started_at_us: i64,
    grace: std::time::Duration,
    /// `--contract`, checked against the plan and the start.
    contract: Option<Contract>,
    /// `--record-hold`, or its default for this machine.
    record_hold: usize,
    /// `--start-at` of a shard (its index and count are the shape's), in wall-clock µs.
    start_at_us: Option<i64>,
    /// `--metrics-listen`, bound.
    metrics: Option<tokio::net::TcpListener>,
    /// `--worker-metrics`: the URL with its engine, the interval and the timeout.
    scrape: Option<super::scrape::ScrapeSpec>,
}

/// The `replay` command. `interrupt` is requested on Ctrl-C / SIGTERM.
pub async fn replay_cmd(args: ReplayArgs, interrupt: Arc<Shutdown>) -> Result<Exit, CliError> {
    let mut input = ReplayRun::resolve(&args).await?;
    if input.plan.campaign.is_none() {
        super::io::without_huge_pages();
    }
    let created = create_run(&args, &input)?;
    let (dir, rid, run_t0_ns, mut config) =
        (created.dir, created.run_id, created.t0_ns, created.config);
    let shard_start_ns = created.shard_start_ns;
    // The reports read the plan after the run (the summary, drift, the verdict).
    let plan = input.plan.clone();
    let contract = input.contract.take();

    // Step 4: the run, then the recorder closed.
    let mut rec_opts = RecorderOptions::new(dir.exchanges());
    // A shard's ledger stays with its reports: exchanges/ holds partition folders only.
    if shard_start_ns.is_some() {
        rec_opts.ledger = Some(dir.path.join(crate::record::LEDGER));
    }
    rec_opts.part_rows = args.run.part_rows.max(1);
    rec_opts.part_seconds = args.run.part_seconds;
    rec_opts.hold_bytes = input.record_hold;
    let run =
        Arc::new(RunContext::start(&rid, run_t0_ns, rec_opts).map_err(|e| tool(e.to_string()))?);
    // Live metrics for the progress line and --metrics-listen; neither: none are counted.
    let metrics = input.metrics.take();
    let metrics_server = (!args.run.quiet || metrics.is_some()).then(|| {
        let t = Arc::new(crate::telemetry::Telemetry::new());
        super::metrics_http::start(metrics, &t, &run, args.run.quiet)
    });
    let scraping = match input.scrape.take() {
        Some(spec) => Some(super::scrape::start_scraping(
            spec,
            (Some(&run), &dir),
            run_t0_ns,
        )?),
        None => None,
    };
    let arm_scrape = scraping.as_ref().map(|s| s.for_arms());
    let result = replay::run(
        ReplayOptions {
            plan: input.plan,
            shape: input.shape,
            bearer_token: input.bearer_token,
            max_record_body: args.run.max_record_body,
            quiet: args.run.quiet,
            record_exchanges: !args.no_record,
            grace: input.grace,
            shard_start_ns,
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
    let worker = match scraping {
        Some(s) => super::scrape::end_scraping(s, &dir, args.run.quiet).await,
        None => super::scrape::WorkerScrapes::default(),
    };
    let recording = run.finish_recording().await;
    if let Some((m, _)) = input.mock {
        m.shutdown().await;
    }
    let shape = input.shape;
    reports(
        &args,
        &dir,
        &mut config,
        (result, worker),
        recording,
        (&plan, shape, contract.as_ref()),
    )
}

impl ReplayRun {
    /// Step 1: Everything that can be wrong with the input is checked before any output
    /// exists; then the mock worker, when asked for, is started and the plan sent to it.
    async fn resolve(args: &ReplayArgs) -> Result<ReplayRun, CliError> {
        let (plan_bytes, plan) = load_plan(&args.plan)?;
        if plan.campaign.is_some() && args.mock_worker {
            return Err(usage(
                "--mock-worker does not go with a campaign plan: give each arm that should be the mock a start command, [\"{self}\", \"mock-worker\", \"--listen\", \"127.0.0.1:{port}\"]",
            ));
        }
        if plan.campaign.is_some() && args.endpoint.is_some() {
            return Err(usage(
                "--endpoint does not go with a campaign plan: each arm has its own endpoint",
            ));
        }
        let sweep = match args.sweep {
            Some(n) => Some(Shape::sweep(&plan, n).map_err(usage)?),
            None => None,
        };
        let shard = shard_spec(args, &plan)?;
        let (shape, start_at_us) = match (sweep, shard) {
            (Some(s), _) => (s, None),
            (None, Some((s, at))) => (s, Some(at)),
            (None, None) => (Shape::Plain, None),
        };
        // Hash the binary off the runtime's threads (config.json records it).
        let _ = tokio::task::spawn_blocking(rundir::binary_sha256).await;
        let plan = match &args.endpoint {
            Some(url) => plan.sent_to(&flags::endpoint_override(url).map_err(usage)?),
            None => plan,
        };
        let (token_env, token_source) = match (&args.bearer_token_env, &plan.bearer_token_env) {
            (Some(n), _) => (Some(n.clone()), "--bearer-token-env"),
            (None, Some(n)) => (Some(n.clone()), "the plan's auth.bearer_token_env"),
            (None, None) => (None, ""),
        };
        let bearer_token = match &token_env {
            Some(n) => Some(read_token(n, token_source)?),
            None => None,
        };
        // A CA file is checked even for an http endpoint: a wrong path is a mistake now.
        let arms_https = plan.campaign.as_ref().is_some_and(|c| {
            c.arms.iter().any(|a| {
                a.endpoints(1)
                    .is_ok_and(|(e, h)| e.scheme == Scheme::Https || h.scheme == Scheme::Https)
            })
        });
        let need_tls = args.ca_cert.is_some()
            || arms_https
            || (!args.mock_worker
                && (plan.endpoint.scheme == Scheme::Https
                    || plan.health_endpoint.scheme == Scheme::Https));
        flags::at_least_one("--max-record-body", args.run.max_record_body).map_err(usage)?;
        flags::at_least_one("--part-rows", args.run.part_rows).map_err(usage)?;
        seconds("--part-seconds", args.run.part_seconds)?;
        open_files_for(&plan, shape, args.mock_worker)?;
        let grace =
            flags::seconds_or_zero("--grace-seconds", args.run.grace_or(REPLAY_GRACE_SECONDS))
                .map_err(usage)?;
        let engine = Engine::new(
            need_tls,
            &TlsOptions {
                ca_file: args.ca_cert.clone(),
            },
        )
        .map_err(usage)?;
        let started_at_us = clock::wall_now_us();
        let contract = contract_for(args, &plan, started_at_us)?;
        let out = out_dir(args, started_at_us);
        let metrics = match args.run.metrics_listen {
            Some(a) => Some(super::metrics_http::bind(a).await?),
            None => None,
        };
        let from_plan = match &plan.campaign {
            Some(c) => super::scrape::FromPlan::Campaign {
                arms_scrape: c.arms.iter().any(|a| a.worker_metrics.is_some()),
            },
            None => super::scrape::FromPlan::Plain(plan.worker_metrics.as_ref()),
        };
        let scrape_flags = super::scrape::scrape_flags(&args.scrape, from_plan)?;
        // Step 2: the mock worker, when asked for, takes the plan's origin.
        let mock_config = args.mock.config()?;
        let (plan, mock) = match args.mock_worker {
            true => {
                let (m, plan) = start_mock(&mock_config, plan).await?;
                (plan, Some((m, mock_config)))
            }
            false => (plan, None),
        };
        let scrape = match scrape_flags {
            Some(f) => Some(super::scrape::spec(
                f,
                &plan.endpoint,
                args.ca_cert.clone(),
            )?),
            None => None,
        };
        Ok(ReplayRun {
            plan_bytes,
            plan,
            shape,
            mock,
            token_env,
            bearer_token,
            engine,
            out,
            started_at_us,
            grace,
            contract,
            record_hold: args
                .record_hold
                .unwrap_or_else(crate::record::default_hold_bytes),
            start_at_us,
            metrics,
            scrape,
        })
    }
}

/// `--contract`, read and checked against the plan and the run's start.
fn contract_for(
    args: &ReplayArgs,
    plan: &Plan,
    started_at_us: i64,
) -> Result<Option<Contract>, CliError> {
    let Some(path) = &args.contract else {
        return Ok(None);
    };
    if plan.is_capture() {
        return Err(usage(format!(
            "--contract {}: this is a capture plan (no case has an oracle), so its answers are recorded, not judged, and there is nothing for a contract to gate; freeze the run into a plan with oracles (`matrix-proxy freeze RUN --out plan.json`) and replay that",
            path.display()
        )));
    }
    let c = super::campaign::load_contract(path)?;
    if plan.campaign.is_none() {
        return Err(usage(format!(
            "--contract goes with a campaign plan (arms): its gates compare arms with the reference; for two runs benchmarked apart use `matrix-proxy compare RUN_A RUN_B --contract {}`",
            path.display()
        )));
    }
    super::campaign::check_contract(&c, path, plan.name.as_deref(), started_at_us)?;
    Ok(Some(c))
}

/// The plan's input token counts against the server's, read back from the rows (so
/// `summarize` counts the same way); a read error is a problem of the run's reports.
fn prompt_tokens(
    plan: &Plan,
    evidence: &mut report::evidence::Evidence,
    problems: &mut Vec<String>,
) -> Option<report::doc::summary::PromptTokensMismatch> {
    report::prompt_tokens_mismatch(plan, evidence).unwrap_or_else(|e| {
        problems.push(format!("prompt_tokens_mismatch: {e}"));
        None
    })
}

/// `--out`, or `runs/<plan stem>-<UTC time>`.
fn out_dir(args: &ReplayArgs, started_at_us: i64) -> PathBuf {
    match &args.run.out {
        Some(p) => p.clone(),
        None => {
            let stem = args
                .plan
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "plan".into());
            PathBuf::from("runs").join(format!("{stem}-{}", clock::compact_utc(started_at_us)))
        }
    }
}

/// `--shard I/N --start-at UTC`, checked against the plan and the other flags: the
/// shard's shape and its start instant (wall-clock µs).
fn shard_spec(args: &ReplayArgs, plan: &Plan) -> Result<Option<(Shape, i64)>, CliError> {
    let (Some(s), Some(at)) = (&args.shard, &args.start_at) else {
        return Ok(None);
    };
    let (i, n) = flags::shard(s).map_err(usage)?;
    let shape = Shape::shard(plan, i, n).map_err(usage)?;
    if args.run.out.is_none() {
        return Err(usage(
            "--shard needs --out: every shard writes into the same output folder (OUT/exchanges/shard=I/ and OUT/shards/I/), which `matrix-proxy summarize OUT` merges",
        ));
    }
    if args.no_record {
        return Err(usage(
            "--shard needs the rows: `summarize OUT` merges the shards from exchanges/; drop --no-record",
        ));
    }
    let at = flags::start_at(at, clock::wall_now_us()).map_err(usage)?;
    Ok(Some((shape, at)))
}

/// Open files a run needs besides its connections: standard streams, the runtime's
/// epoll and wakers, the recorder's part and ledger, the TLS roots, DNS.
const RESERVED_FDS: u64 = 64;

/// Raise the soft open-file limit to what the plan's largest concurrency needs (one
/// socket per worker, two with the in-process mock worker holding the other end), and
/// refuse a concurrency the limit cannot hold, naming the largest it can: running into
/// "Too many open files" halfway through a round would fail it for the tool's reasons.
fn open_files_for(plan: &Plan, shape: Shape, mock: bool) -> Result<(), CliError> {
    // An open loop holds at most load.max_in_flight connections.
    let closed = plan.concurrency.iter().copied().max().unwrap_or(1) as u64;
    let open = plan.load.max_in_flight as u64;
    let (what, max_c) = match (plan.load.mode, shape.sweep_rates()) {
        (crate::config::load::Mode::Open, _) => ("load.max_in_flight", open),
        // A sweep keeps its closed workers' connections while its open rates run.
        (_, Some(_)) => ("concurrency + load.max_in_flight", closed + open),
        _ => ("concurrency", closed),
    };
    let per_worker = if mock { 2 } else { 1 };
    let wanted = max_c
        .saturating_mul(per_worker)
        .saturating_add(RESERVED_FDS);
    // Where the limit cannot be read or raised (no such API here), there is nothing to
    // check against: the run goes on, and a shortage shows as transport failures.
    let Ok(limit) = rlimit::increase_nofile_limit(wanted) else {
        return Ok(());
    };
    if limit < wanted {
        let can = limit.saturating_sub(RESERVED_FDS) / per_worker;
        return Err(usage(format!(
            "{what} {max_c} needs about {wanted} open files{}, but this process may open at most {limit} (ulimit -n; raise the hard limit with ulimit -Hn or in limits.conf): the largest {what} it can hold is {can}",
            if mock {
                " (two per worker with --mock-worker)"
            } else {
                ""
            }
        )));
    }
    Ok(())
}

/// The mock worker on a free loopback port, and `plan` sent to it (its origin replaced).
async fn start_mock(mock_config: &MockConfig, plan: Plan) -> Result<(MockWorker, Plan), CliError> {
    let m = MockWorker::start(
        "127.0.0.1:0"
            .parse()
            .map_err(|_| tool("bad mock address"))?,
        mock_config.clone(),
    )
    .await
    .map_err(|e| tool(format!("cannot start the mock worker on 127.0.0.1: {e}")))?;
    let origin = Endpoint::parse(&m.url()).map_err(tool)?;
    Ok((m, plan.with_origin(&origin)))
}

/// What step 3 made: the run directory, its id and clock start, config.json as written,
/// and a shard's shared start on the run clock.
struct Created {
    dir: RunDir,
    run_id: String,
    t0_ns: u64,
    config: Config,
    shard_start_ns: Option<u64>,
}

/// Step 3: The run directory, the plan's bytes and config.json. A default name that is
/// taken gets a numeric suffix (so the demo command can be run again and again); an
/// explicit `--out` is never reused.
fn create_run(args: &ReplayArgs, input: &ReplayRun) -> Result<Created, CliError> {
    let ReplayRun {
        plan_bytes,
        plan,
        token_env,
        bearer_token,
        out,
        started_at_us,
        record_hold,
        ..
    } = input;
    let started_at_us = *started_at_us;
    let dir = match input.shape.shard_of() {
        Some((i, _)) => RunDir::create_shard(out, i).map_err(|e| {
            usage(format!(
                "--out {} --shard: {e}; each shard's folders are new",
                out.display()
            ))
        })?,
        None => create_run_dir(out, args.run.out.is_none())?,
    };
    dir.write_file(rundir::PLAN, plan_bytes)
        .map_err(|e| tool(e.to_string()))?;
    let rid = run_id(started_at_us);
    let extra = Extra {
        endpoint_override: args.endpoint.as_deref().map(config_json::redacted),
        grace_seconds: args.run.grace_or(REPLAY_GRACE_SECONDS),
        mock_worker: input.mock.as_ref().map(|(m, mock_config)| MockRecord {
            url: m.url(),
            prefill_ms: mock_config.prefill_ms,
            per_token_ms: mock_config.per_token_ms,
            max_batch: mock_config.max_batch,
            default_max_tokens: mock_config.default_max_tokens,
        }),
        runtime_threads: runtime_threads(args.run.threads),
        metrics_listen: super::metrics_http::address(input.metrics.as_ref()),
        auth: Auth {
            bearer_token_env: token_env.clone(),
            bearer_token_sent: bearer_token.is_some(),
        },
        recording: ReplayRecording {
            exchanges: !args.no_record,
            max_record_body_bytes: args.run.max_record_body,
            record_hold_bytes: *record_hold,
            redacted_headers: DEFAULT_REDACT_HEADERS
                .iter()
                .map(|h| h.to_string())
                .collect(),
            redacted_query_parameters: DEFAULT_REDACT_QUERY.iter().map(|q| q.to_string()).collect(),
        },
    };
    let run_t0_ns = clock::now_ns();
    // The shared start on this process's run clock: `summarize OUT` puts every shard's
    // offsets on one timeline from it.
    let shard = input
        .shape
        .shard_of()
        .zip(input.start_at_us)
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
        plan,
        config_json::ReplayKeys {
            shape: input.shape,
            plan_path: &args.plan.display().to_string(),
            plan_sha256: &rundir::sha256_hex(plan_bytes),
            run_t0_ns,
            extra,
            contract: match (&input.contract, &args.contract) {
                (Some(c), Some(path)) => Some(super::campaign::contract_record(c, path)),
                _ => None,
            },
            shard,
        },
    );
    let config = config_json::config(
        &argv(&crate::redact::Redaction::default()),
        &rid,
        started_at_us,
        fields,
    );
    dir.write_json(rundir::CONFIG, &config)
        .map_err(|e| tool(e.to_string()))?;
    if !args.run.quiet {
        eprintln!(
            "matrix-proxy: replaying {} -> {} ({} planned requests, {} connections); run directory {}",
            args.plan.display(),
            targets(plan),
            input.shape.planned_requests(plan),
            plan.connection.as_str(),
            dir.path.display()
        );
    }
    // Said even under --quiet: a verdict on a fraction of the prompts is a finding.
    super::io::say_unmeasured(plan, "matrix-proxy: ");
    Ok(Created {
        dir,
        run_id: rid,
        t0_ns: run_t0_ns,
        config,
        shard_start_ns,
    })
}

/// `kind count, ...` from summary.json's `failures`.
fn failures_by_kind(failures: &Failures) -> String {
    failures
        .iter()
        .map(|(k, v)| format!("{} {v}", k.as_str()))
        .collect::<Vec<_>>()
        .join(", ")
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

/// A campaign's own reports: drift from the recorded answers into campaign.json, then the
/// verdict of the contract the run was started with. Returns the text for the terminal.
fn campaign_reports(
    args: &ReplayArgs,
    dir: &RunDir,
    config: &Config,
    mut c: CampaignDoc,
    (plan, contract, worker, evidence): (
        &Plan,
        Option<&Contract>,
        &[crate::record::scrapes::ScrapeRow],
        &mut report::evidence::Evidence,
    ),
    run_ending: Ending,
    problems: &mut Vec<String>,
) -> String {
    report::worker::add_cells(&mut c, worker);
    let mut text = String::new();
    let mut drift_ok = false;
    if args.no_record {
        c.drift = Some(None);
        c.drift_unavailable_reason =
            Some("--no-record: no answers were recorded to compare".into());
    } else if let Err(e) = report::answers::add_drift(&mut c, evidence, plan) {
        problems.push(format!("drift: {e}"));
    } else {
        drift_ok = true;
        if let Err(e) = report::intervals::add_intervals(&mut c, evidence) {
            problems.push(format!("intervals: {e}"));
        }
        text = c
            .drift_floor
            .as_ref()
            .map(report::answers::floor_text)
            .unwrap_or_default();
        text.push_str(&report::answers::drift_text(c.drift_entries()));
        if let Some(iv) = &c.intervals {
            text.push_str(&report::intervals::intervals_text(iv));
        }
        if let Some(why) = &c.drift_unavailable_reason {
            text.push_str(&format!("drift: n/a: {why}\n"));
        }
    }
    if let Err(e) = dir.write_json(rundir::CAMPAIGN, &c) {
        problems.push(e.to_string());
    }
    if let (Some(_), false) = (contract, drift_ok) {
        // Without drift every quality gate would fail for want of it: no verdict rather
        // than a wrong one; `matrix-proxy verdict` can evaluate once drift can be read.
        problems.push("verdict.json not written: drift could not be computed".into());
        return text;
    }
    if let (Some(contract), Some(path)) = (contract, &args.contract) {
        let v = report::verdict::verdict_doc(
            &c,
            &report::verdict::Provenance {
                contract,
                contract_path: &path.display().to_string(),
                run_id: Some(&config.run_id),
                run_started_at: Some(&config.started_at),
                run_ending: Some(run_ending.as_str()),
                post_hoc: None,
            },
        );
        text.push_str(&report::verdict::verdict_text(&v));
        // The verdict is said on stderr too (also under --quiet): it is the run's answer.
        eprintln!("matrix-proxy: verdict: {} (verdict.json)", v.verdict());
        if let Err(e) = dir.write_json(rundir::VERDICT, &v) {
            problems.push(e.to_string());
        }
    }
    text
}

/// What summary.json says of the recording.
fn recording_doc(
    args: &ReplayArgs,
    recording: &RecordingEnd,
    prompt_tokens_mismatch: Option<crate::report::doc::summary::PromptTokensMismatch>,
) -> Recording {
    Recording {
        rows_written: recording.stats.rows,
        // Absent under --no-record; unknown (null) when the writer failed: its count did
        // not come back.
        rows_encoded_during_rounds: (!args.no_record).then(|| {
            recording
                .problems
                .is_empty()
                .then_some(recording.stats.encoded_while_held)
        }),
        record_error: recording.problems.first().map(|e| e.to_string()),
        prompt_tokens_mismatch,
        ..Recording::default()
    }
}

/// Step 5: Reports, built by `report` from what the run measured and recorded. Each is
/// written even if an earlier step failed, so nothing is lost.
fn reports(
    args: &ReplayArgs,
    dir: &RunDir,
    config: &mut Config,
    (result, scraped): (replay::ReplayResult, super::scrape::WorkerScrapes),
    recording: RecordingEnd,
    (plan, shape, contract): (&Plan, Shape, Option<&Contract>),
) -> Result<Exit, CliError> {
    let mut problems = Vec::new();
    let worker = &scraped.rows[..];
    if let Err(e) = report::write_rounds_parquet(&dir.path.join(rundir::ROUNDS), &result.rounds) {
        problems.push(format!("rounds.parquet: {e}"));
    }
    let record_error = recording.problems.first();
    // A run whose rows could not all be written did not pass, whatever its exchanges did.
    let ending = match result.ending {
        Ending::Passed if record_error.is_some() => Ending::Failed,
        other => other,
    };
    let recorded = !args.no_record && record_error.is_none();
    // One pass over exchanges/ for every report that reads the rows back.
    let wants = report::evidence::Wants::replay(plan, recorded, !args.no_record);
    let mut evidence = report::evidence::Evidence::read(&[dir.exchanges()], plan, wants);
    let prompt_tokens_mismatch = recorded
        .then(|| prompt_tokens(plan, &mut evidence, &mut problems))
        .flatten();
    let aggregates = report::aggregates(plan, shape, &result.rounds);
    let summary = report::summary(
        plan,
        &report::Measured {
            shape,
            rounds: &result.rounds,
            aggregates: &aggregates,
            excluded: &result.excluded,
            ending,
            failures: result.failures,
            notes: &result.notes,
            worker,
        },
        Recording {
            worker_metrics_limits: scraped.limits.clone(),
            worker_metrics_scrapes: scraped.health.clone(),
            ..recording_doc(args, &recording, prompt_tokens_mismatch)
        },
    );
    if let Err(e) = dir.write_json(rundir::SUMMARY, &summary) {
        problems.push(e.to_string());
    }
    let mut campaign_text = String::new();
    if let Some(c) = &plan.campaign {
        let doc = report::campaign::campaign_doc(plan.name.as_deref(), c, &result.arms)
            .with_scrapes(scraped.health.as_deref());
        campaign_text = campaign_reports(
            args,
            dir,
            config,
            doc,
            (plan, contract, worker, &mut evidence),
            summary.ending,
            &mut problems,
        );
    }
    config_json::finished(config);
    if let Err(e) = dir.write_json(rundir::CONFIG, config) {
        problems.push(e.to_string());
    }
    if args.run.json
        && let Err(e) = print_json(&summary, &dir.path)
    {
        problems.push(e);
    }
    if !args.run.quiet {
        let table = report::table(plan, &result.rounds, &aggregates, &result.excluded);
        if !args.run.json
            && let Err(e) = print_stdout(&(table + &campaign_text), "the table", &dir.path)
        {
            problems.push(e);
        }
        if args.no_record {
            eprintln!(
                "matrix-proxy: recording off (--no-record): no exchanges written; reports in {}",
                dir.path.display()
            );
        } else {
            eprintln!(
                "matrix-proxy: {} exchange{} recorded in {}",
                recording.stats.rows,
                if recording.stats.rows == 1 { "" } else { "s" },
                dir.path.display()
            );
        }
    }
    // Why a run failed is said here, not only in Parquet (also under --quiet: it is the
    // reason for the exit code).
    if let Some(first) = &result.first_failure {
        eprintln!("matrix-proxy: first failure: {first}");
        eprintln!(
            "matrix-proxy: failures by kind (all phases): {}",
            failures_by_kind(&summary.failures)
        );
    }
    if let Some(e) = record_error {
        problems.insert(0, e.to_string());
    }
    if !problems.is_empty() {
        return Err(tool(format!(
            "{} (what was written is kept in {})",
            problems.join("; "),
            dir.path.display()
        )));
    }
    Ok(match ending {
        Ending::Passed => Exit::Ok,
        Ending::Failed => Exit::Failure,
        Ending::Interrupted => Exit::Interrupted,
    })
}
