//! The `replay` command, step by step: check every input before any output exists,
//! start the mock worker when asked, create the run directory and config.json, run, and
//! write the reports (each even if an earlier one failed, so nothing is lost).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use super::{
    CliError, Exit, ReplayArgs, create_run_dir, load_plan, read_token, run_id, seconds, tool, usage,
};
use crate::clock;
use crate::config::contract::Contract;
use crate::config::flags;
use crate::config::plan::Plan;
use crate::drivers::replay::{self, ReplayOptions};
use crate::drivers::{RecordingEnd, RunContext};
use crate::engine::Engine;
use crate::mock::{MockConfig, MockWorker};
use crate::model::{Endpoint, Scheme};
use crate::net::tls::TlsOptions;
use crate::record::RecorderOptions;
use crate::record::rundir::{self, RunDir};
use crate::redact::{DEFAULT_REDACT_HEADERS, DEFAULT_REDACT_QUERY};
use crate::report::{self, Ending, config_json};

/// What the checks produced: everything the run needs, before any output exists.
struct Input {
    plan_bytes: Vec<u8>,
    plan: Plan,
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
    /// `--shard` and `--start-at`: (index, count, start instant in wall-clock µs).
    shard: Option<(usize, usize, i64)>,
    /// `--metrics-listen`, bound.
    metrics: Option<tokio::net::TcpListener>,
}

/// The `replay` command. `interrupt` turns true on Ctrl-C / SIGTERM.
pub async fn replay_cmd(args: ReplayArgs, interrupt: Arc<AtomicBool>) -> Result<Exit, CliError> {
    let mut input = check(&args).await?;
    let mock_config = args.mock.config()?;
    let mock = start_mock(&args, &mock_config, &mut input.plan).await?;
    let (dir, rid, run_t0_ns, mut config) = create_run(&args, &input, mock.as_ref(), &mock_config)?;
    let plan = input.plan;
    // What the reports need of a campaign plan after the run (drift, the verdict).
    let campaign = plan
        .campaign
        .is_some()
        .then(|| (plan.clone(), input.contract.take()));

    // Step 4: the run, then the recorder closed.
    let mut rec_opts = RecorderOptions::new(dir.exchanges());
    // A shard's ledger stays with its reports: exchanges/ holds partition folders only.
    let shard_start_ns = config["shard"]["start_at_offset_us"]
        .as_i64()
        .map(|off| run_t0_ns.saturating_add_signed(off.saturating_mul(1000)));
    if shard_start_ns.is_some() {
        rec_opts.ledger = Some(dir.path.join(crate::record::LEDGER));
    }
    rec_opts.part_rows = args.part_rows.max(1);
    rec_opts.part_seconds = args.part_seconds;
    rec_opts.hold_bytes = input.record_hold;
    let run =
        Arc::new(RunContext::start(&rid, run_t0_ns, rec_opts).map_err(|e| tool(e.to_string()))?);
    // Live metrics for the progress line and --metrics-listen; neither: none are counted.
    let metrics = input.metrics.take();
    let metrics_server = (!args.quiet || metrics.is_some()).then(|| {
        let t = Arc::new(crate::telemetry::Telemetry::new());
        super::metrics_http::start(metrics, &t, &run, args.quiet)
    });
    let result = replay::run(
        ReplayOptions {
            plan,
            bearer_token: input.bearer_token,
            max_record_body: args.max_record_body,
            quiet: args.quiet,
            record_exchanges: !args.no_record,
            grace: input.grace,
            shard_start_ns,
        },
        input.engine,
        run.clone(),
        interrupt,
        replay::ArmEnv {
            self_exe: std::env::current_exe().unwrap_or_else(|_| PathBuf::from("matrix-proxy")),
            logs: dir.path.join("servers"),
        },
    )
    .await;
    if let Some(m) = metrics_server.flatten() {
        m.abort();
    }
    let recording = run.finish_recording().await;
    if let Some(m) = mock {
        m.shutdown().await;
    }
    reports(&args, &dir, &mut config, result, recording, campaign)
}

/// `--sweep N`, checked against the plan.
fn sweep_levels(plan: &crate::config::plan::Plan, n: usize) -> Result<usize, CliError> {
    use crate::config::load::Mode;
    if n == 0 {
        return Err(usage(
            "--sweep 0: give the number of open-loop rates to place between the synchronous rate and the throughput probe (1 or more; GuideLLM's default is 10)",
        ));
    }
    if n > 100 {
        return Err(usage(format!(
            "--sweep {n}: at most 100 rates (each runs the plan's repetitions)"
        )));
    }
    if plan.campaign.is_some() {
        return Err(usage(
            "--sweep does not go with a campaign plan: sweep each arm's endpoint with a plain plan",
        ));
    }
    if plan.load.mode == Mode::Open {
        return Err(usage(
            "--sweep goes with a closed-loop plan: it measures the synchronous rate (c = 1) and the throughput at the plan's highest concurrency, then places open-loop rates between them; this plan has load.mode \"open\" and its own rates",
        ));
    }
    if plan.concurrency.iter().all(|&c| c < 2) {
        return Err(usage(
            "--sweep needs a plan whose highest concurrency is 2 or more: the throughput probe runs at it, and the synchronous round at 1",
        ));
    }
    Ok(n)
}

/// Step 1: Everything that can be wrong with the input is checked before any output exists.
async fn check(args: &ReplayArgs) -> Result<Input, CliError> {
    let (plan_bytes, mut plan) = load_plan(&args.plan)?;
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
    if let Some(n) = args.sweep {
        plan.sweep = Some(sweep_levels(&plan, n)?);
    }
    let shard = shard_spec(args, &plan)?;
    plan.shard = shard.map(|(i, n, _)| (i, n));
    // Hash the binary off the runtime's threads (config.json records it).
    let _ = tokio::task::spawn_blocking(rundir::binary_sha256).await;
    let endpoint_override = match &args.endpoint {
        Some(url) => Some(flags::endpoint("--endpoint", url).map_err(usage)?),
        None => None,
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
    if let Some(ep) = &endpoint_override {
        plan.override_endpoint(ep);
    }
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
    flags::at_least_one("--max-record-body", args.max_record_body).map_err(usage)?;
    flags::at_least_one("--part-rows", args.part_rows).map_err(usage)?;
    seconds("--part-seconds", args.part_seconds)?;
    open_files_for(&plan, args.mock_worker)?;
    let grace = flags::seconds_or_zero("--grace-seconds", args.grace_seconds).map_err(usage)?;
    let engine = Engine::new(
        need_tls,
        &TlsOptions {
            ca_file: args.ca_cert.clone(),
        },
    )
    .map_err(usage)?;
    let started_at_us = clock::wall_now_us();
    let contract = match &args.contract {
        None => None,
        Some(path) => {
            let c = super::campaign::load_contract(path)?;
            if plan.campaign.is_none() {
                return Err(usage(format!(
                    "--contract goes with a campaign plan (arms): its gates compare arms with the reference; for two runs benchmarked apart use `matrix-proxy compare RUN_A RUN_B --contract {}`",
                    path.display()
                )));
            }
            super::campaign::check_contract(&c, path, plan.name.as_deref(), started_at_us)?;
            Some(c)
        }
    };
    let out = match &args.out {
        Some(p) => p.clone(),
        None => {
            let stem = args
                .plan
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "plan".into());
            PathBuf::from("runs").join(format!("{stem}-{}", clock::compact_utc(started_at_us)))
        }
    };

    Ok(Input {
        plan_bytes,
        plan,
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
        shard,
        metrics: match args.metrics_listen {
            Some(a) => Some(super::metrics_http::bind(a).await?),
            None => None,
        },
    })
}

/// `--shard I/N --start-at UTC`, checked against the plan and the other flags.
fn shard_spec(args: &ReplayArgs, plan: &Plan) -> Result<Option<(usize, usize, i64)>, CliError> {
    let (Some(s), Some(at)) = (&args.shard, &args.start_at) else {
        return Ok(None);
    };
    let (i, n) = flags::shard(s).map_err(usage)?;
    if plan.load.mode != crate::config::load::Mode::Open {
        return Err(usage(
            "--shard goes with an open-loop plan (load.mode \"open\"): closed-loop workers cannot be split across machines without a barrier per round",
        ));
    }
    if args.out.is_none() {
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
    Ok(Some((i, n, at)))
}

/// Open files a run needs besides its connections: standard streams, the runtime's
/// epoll and wakers, the recorder's part and ledger, the TLS roots, DNS.
const RESERVED_FDS: u64 = 64;

/// Raise the soft open-file limit to what the plan's largest concurrency needs (one
/// socket per worker, two with the in-process mock worker holding the other end), and
/// refuse a concurrency the limit cannot hold, naming the largest it can: running into
/// "Too many open files" halfway through a round would fail it for the tool's reasons.
fn open_files_for(plan: &Plan, mock: bool) -> Result<(), CliError> {
    // An open loop holds at most load.max_in_flight connections.
    let closed = plan.concurrency.iter().copied().max().unwrap_or(1) as u64;
    let open = plan.load.max_in_flight as u64;
    let (what, max_c) = match (plan.load.mode, plan.sweep) {
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

/// Step 2: The mock worker, when asked for, replaces the plan's origin.
async fn start_mock(
    args: &ReplayArgs,
    mock_config: &MockConfig,
    plan: &mut Plan,
) -> Result<Option<MockWorker>, CliError> {
    if !args.mock_worker {
        return Ok(None);
    }
    let m = MockWorker::start(
        "127.0.0.1:0"
            .parse()
            .map_err(|_| tool("bad mock address"))?,
        mock_config.clone(),
    )
    .await
    .map_err(|e| tool(format!("cannot start the mock worker on 127.0.0.1: {e}")))?;
    let origin = Endpoint::parse(&m.url()).map_err(tool)?;
    plan.override_origin(&origin);
    Ok(Some(m))
}

/// Step 3: The run directory, the plan's bytes and config.json. A default name that is
/// taken gets a numeric suffix (so the demo command can be run again and again); an
/// explicit `--out` is never reused.
fn create_run(
    args: &ReplayArgs,
    input: &Input,
    mock: Option<&MockWorker>,
    mock_config: &MockConfig,
) -> Result<(RunDir, String, u64, serde_json::Value), CliError> {
    let Input {
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
    let dir = match input.shard {
        Some((i, _, _)) => RunDir::create_shard(out, i).map_err(|e| {
            usage(format!(
                "--out {} --shard: {e}; each shard's folders are new",
                out.display()
            ))
        })?,
        None => create_run_dir(out, args.out.is_none())?,
    };
    dir.write_file("plan.json", plan_bytes)
        .map_err(|e| tool(e.to_string()))?;
    let rid = run_id(started_at_us);
    let extra = serde_json::json!({
        "endpoint_override": args.endpoint.as_deref().map(config_json::redacted),
        "grace_seconds": args.grace_seconds,
        "mock_worker": mock.map(|m| serde_json::json!({
            "url": m.url(),
            "prefill_ms": mock_config.prefill_ms,
            "per_token_ms": mock_config.per_token_ms,
            "max_batch": mock_config.max_batch,
            "default_max_tokens": mock_config.default_max_tokens,
        })),
        "runtime_threads": super::runtime_threads(args.threads),
        "metrics_listen": super::metrics_http::address(input.metrics.as_ref()),
        "auth": {
            "bearer_token_env": token_env,
            "bearer_token_sent": bearer_token.is_some(),
        },
        "recording": {
            "exchanges": !args.no_record,
            "max_record_body_bytes": args.max_record_body,
            "record_hold_bytes": record_hold,
            "redacted_headers": DEFAULT_REDACT_HEADERS,
            "redacted_query_parameters": DEFAULT_REDACT_QUERY,
        },
    });
    let run_t0_ns = clock::now_ns();
    let fields = config_json::replay_fields(
        plan,
        &args.plan.display().to_string(),
        &rundir::sha256_hex(plan_bytes),
        run_t0_ns,
        extra,
    );
    let mut config = config_json::config_json(
        "replay",
        &super::argv(&crate::redact::Redaction::default()),
        &rid,
        started_at_us,
        fields,
        config_json::replay_timers(),
    );
    config["contract"] = match (&input.contract, &args.contract) {
        (Some(c), Some(path)) => super::campaign::contract_record(c, path),
        _ => serde_json::Value::Null,
    };
    // The shared start on this process's run clock: `summarize OUT` puts every shard's
    // offsets on one timeline from it.
    config["shard"] = match input.shard {
        Some((index, count, at_us)) => serde_json::json!({
            "index": index,
            "count": count,
            "start_at": clock::iso_utc(at_us),
            "start_at_offset_us": (at_us - clock::wall_now_us()) + clock::us_between(run_t0_ns, clock::now_ns()),
        }),
        None => serde_json::Value::Null,
    };
    dir.write_json("config.json", &config)
        .map_err(|e| tool(e.to_string()))?;
    if !args.quiet {
        eprintln!(
            "matrix-proxy: replaying {} -> {} ({} planned requests, {} connections); run directory {}",
            args.plan.display(),
            targets(plan),
            plan.planned_requests(),
            plan.connection.as_str(),
            dir.path.display()
        );
    }

    Ok((dir, rid, run_t0_ns, config))
}

/// `kind count, ...` from summary.json's `failures` object.
fn failures_by_kind(failures: &serde_json::Value) -> String {
    failures
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default()
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
    config: &serde_json::Value,
    c: &mut serde_json::Value,
    (plan, contract): (&Plan, Option<&Contract>),
    run_ending: Option<&str>,
    problems: &mut Vec<String>,
) -> String {
    let mut text = String::new();
    let mut drift_ok = false;
    if args.no_record {
        c["drift"] = serde_json::Value::Null;
        c["drift_unavailable_reason"] =
            serde_json::json!("--no-record: no answers were recorded to compare");
    } else if let Err(e) = super::campaign::add_drift(c, &dir.exchanges(), plan) {
        problems.push(format!("drift: {e}"));
    } else {
        drift_ok = true;
        text = super::campaign::drift_text(c["drift"].as_array().map(Vec::as_slice).unwrap_or(&[]));
    }
    if let Err(e) = dir.write_json("campaign.json", c) {
        problems.push(e.to_string());
    }
    if let (Some(_), false) = (contract, drift_ok) {
        // Without drift every quality gate would fail for want of it: no verdict rather
        // than a wrong one; `matrix-proxy verdict` can evaluate once drift can be read.
        problems.push("verdict.json not written: drift could not be computed".into());
        return text;
    }
    if let (Some(contract), Some(path)) = (contract, &args.contract) {
        let v = report::verdict::verdict_json(
            c,
            &report::verdict::Provenance {
                contract,
                contract_path: &path.display().to_string(),
                run_id: config["run_id"].as_str(),
                run_started_at: config["started_at"].as_str(),
                run_ending,
                post_hoc: None,
            },
        );
        text.push_str(&report::verdict::verdict_text(&v));
        // The verdict is said on stderr too (also under --quiet): it is the run's answer.
        eprintln!(
            "matrix-proxy: verdict: {} (verdict.json)",
            v["verdict"].as_str().unwrap_or("?")
        );
        if let Err(e) = dir.write_json("verdict.json", &v) {
            problems.push(e.to_string());
        }
    }
    text
}

/// Step 5: Reports. Each is written even if an earlier step failed, so nothing is lost.
fn reports(
    args: &ReplayArgs,
    dir: &RunDir,
    config: &mut serde_json::Value,
    result: replay::ReplayResult,
    recording: RecordingEnd,
    campaign: Option<(Plan, Option<Contract>)>,
) -> Result<Exit, CliError> {
    let mut problems = Vec::new();
    if let Err(e) = report::write_rounds_parquet(&dir.path.join("rounds.parquet"), &result.rounds) {
        problems.push(format!("rounds.parquet: {e}"));
    }
    let mut summary_v = result.summary.clone();
    summary_v["rows_written"] = serde_json::json!(recording.stats.rows);
    if !args.no_record {
        // Unknown (null) when the writer failed: its count did not come back.
        summary_v["rows_encoded_during_rounds"] = match recording.problems.is_empty() {
            true => serde_json::json!(recording.stats.encoded_while_held),
            false => serde_json::Value::Null,
        };
    }
    let record_error = recording.problems.first();
    if let Some(e) = record_error {
        summary_v["record_error"] = serde_json::json!(e.to_string());
    }
    if let Err(e) = dir.write_json("summary.json", &summary_v) {
        problems.push(e.to_string());
    }
    let mut campaign_text = String::new();
    if let (Some(mut c), Some((plan, contract))) = (result.campaign.clone(), campaign) {
        campaign_text = campaign_reports(
            args,
            dir,
            config,
            &mut c,
            (&plan, contract.as_ref()),
            summary_v["ending"].as_str(),
            &mut problems,
        );
    }
    config_json::finished(config);
    if let Err(e) = dir.write_json("config.json", config) {
        problems.push(e.to_string());
    }
    if args.json
        && let Err(e) = super::print_json(&summary_v, &dir.path)
    {
        problems.push(e);
    }
    if !args.quiet {
        if !args.json
            && let Err(e) = super::print_stdout(
                &(result.table.clone() + &campaign_text),
                "the table",
                &dir.path,
            )
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
            failures_by_kind(&summary_v["failures"])
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
    Ok(match result.ending {
        Ending::Passed => Exit::Ok,
        Ending::Failed => Exit::Failure,
        Ending::Interrupted => Exit::Interrupted,
    })
}
