//! The `replay` command: its arguments resolved into the run's complete input
//! ([`resolve`]: every input checked before any output exists, the mock worker started
//! when asked), the run handed to `run::replay`, and what it returns printed and mapped
//! onto an exit code.

use crate::drivers::shutdown::Shutdown;
use std::path::PathBuf;
use std::sync::Arc;

use super::args::{REPLAY_GRACE_SECONDS, ReplayArgs};
use super::io::{
    CliError, Exit, RESERVED_FDS, argv, load_plan, print_json, print_stdout, read_token, run_error,
    runtime_threads, seconds, tool, usage,
};
use crate::clock;
use crate::config::flags;
use crate::config::plan::Plan;
use crate::config::shape::Shape;
use crate::engine::Engine;
use crate::mock::{MockConfig, MockWorker};
use crate::model::{Endpoint, Scheme};
use crate::net::tls::TlsOptions;
use crate::record::rundir;
use crate::report::config_json;
use crate::report::doc::Failures;
use crate::run::finish::{ContractInput, ReplayEnd};
use crate::run::replay::{
    AuthInput, MockInput, OutputInput, PlanInput, RecordingInput, ReplayInput,
};

/// The `replay` command. `interrupt` is requested on Ctrl-C / SIGTERM.
pub async fn replay_cmd(args: ReplayArgs, interrupt: Arc<Shutdown>) -> Result<Exit, CliError> {
    let input = resolve(&args).await?;
    if input.plan.plan.campaign.is_none() {
        super::io::without_huge_pages();
    }
    let end = crate::run::replay::run(input, interrupt)
        .await
        .map_err(run_error)?;
    shown(end, &args)
}

/// Everything that can be wrong with the input is checked before any output exists; then
/// the mock worker, when asked for, is started and the plan sent to it.
async fn resolve(args: &ReplayArgs) -> Result<ReplayInput, CliError> {
    let (bytes, plan) = load_plan(&args.plan)?;
    campaign_conflicts(args, &plan)?;
    let (shape, start_at_us) = shape_of(args, &plan)?;
    let search = super::search::resolve(&args.search, &plan)?;
    // Hash the binary off the runtime's threads (config.json records it).
    let _ = tokio::task::spawn_blocking(rundir::binary_sha256).await;
    let plan = match &args.endpoint {
        Some(url) => plan.sent_to(&flags::endpoint_override(url).map_err(usage)?),
        None => plan,
    };
    let auth = auth_of(args, &plan)?;
    let engine = engine_of(args, &plan)?;
    let recording = recording_of(args)?;
    open_files_for(&plan, shape, args.mock_worker)?;
    let grace_seconds = args.run.grace_or(REPLAY_GRACE_SECONDS);
    let grace = flags::seconds_or_zero("--grace-seconds", grace_seconds).map_err(usage)?;
    let started_at_us = clock::wall_now_us();
    let contract = contract_for(args, &plan, started_at_us)?;
    let out = out_dir(args, started_at_us);
    let metrics = match args.run.metrics_listen {
        Some(a) => Some(crate::run::metrics_http::bind(a).await.map_err(run_error)?),
        None => None,
    };
    let from_plan = match &plan.campaign {
        Some(c) => super::scrape::FromPlan::Campaign {
            arms_scrape: c.arms.iter().any(|a| a.worker_metrics.is_some()),
        },
        None => super::scrape::FromPlan::Plain(plan.worker_metrics.as_ref()),
    };
    let scrape_flags = super::scrape::scrape_flags(&args.scrape, from_plan)?;
    // The mock worker, when asked for, takes the plan's origin.
    let mock_config = args.mock.config()?;
    let (plan, mock) = match args.mock_worker {
        true => {
            let (worker, plan) = start_mock(&mock_config, plan).await?;
            let config = mock_config;
            (plan, Some(MockInput { worker, config }))
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
    Ok(ReplayInput {
        plan: PlanInput {
            bytes,
            path: args.plan.clone(),
            plan,
            shape,
            endpoint_override: args.endpoint.as_deref().map(config_json::redacted),
            start_at_us,
        },
        mock,
        auth,
        engine,
        output: OutputInput {
            out,
            default_name: args.run.out.is_none(),
            quiet: args.run.quiet,
            json: args.run.json,
        },
        recording,
        started_at_us,
        grace,
        grace_seconds,
        contract,
        runtime_threads: runtime_threads(args.run.threads),
        argv: argv(&crate::redact::Redaction::default()),
        metrics,
        scrape,
        search,
    })
}

/// What a campaign plan refuses: the mock worker and an endpoint override.
fn campaign_conflicts(args: &ReplayArgs, plan: &Plan) -> Result<(), CliError> {
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
    Ok(())
}

/// What `--sweep` or `--shard` make of the plan, and a shard's start (wall-clock µs).
fn shape_of(args: &ReplayArgs, plan: &Plan) -> Result<(Shape, Option<i64>), CliError> {
    super::search::conflicts(&args.search, args.sweep.is_some(), args.shard.is_some())?;
    if let Some(kind) = args.search.search.as_deref() {
        let kind =
            crate::config::search::SearchKind::parse(kind).map_err(|e| usage(e.to_string()))?;
        return Ok((Shape::search(plan, kind).map_err(usage)?, None));
    }
    let sweep = match args.sweep {
        Some(n) => Some(Shape::sweep(plan, n).map_err(usage)?),
        None => None,
    };
    Ok(match (sweep, shard_spec(args, plan)?) {
        (Some(s), _) => (s, None),
        (None, Some((s, at))) => (s, Some(at)),
        (None, None) => (Shape::Plain, None),
    })
}

/// The bearer token: `--bearer-token-env`, else the plan's `auth.bearer_token_env`.
fn auth_of(args: &ReplayArgs, plan: &Plan) -> Result<AuthInput, CliError> {
    let (token_env, token_source) = match (&args.bearer_token_env, &plan.bearer_token_env) {
        (Some(n), _) => (Some(n.clone()), "--bearer-token-env"),
        (None, Some(n)) => (Some(n.clone()), "the plan's auth.bearer_token_env"),
        (None, None) => (None, ""),
    };
    let bearer_token = match &token_env {
        Some(n) => Some(read_token(n, token_source)?),
        None => None,
    };
    Ok(AuthInput {
        token_env,
        bearer_token,
    })
}

/// The engine, with TLS when any endpoint is https or a CA file is given (a CA file is
/// checked even for an http endpoint: a wrong path is a mistake now).
fn engine_of(args: &ReplayArgs, plan: &Plan) -> Result<Engine, CliError> {
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
    Engine::new(
        need_tls,
        &TlsOptions {
            ca_file: args.ca_cert.clone(),
        },
    )
    .map_err(|e| usage(e.to_string()))
}

/// The recording flags, checked.
fn recording_of(args: &ReplayArgs) -> Result<RecordingInput, CliError> {
    flags::at_least_one("--max-record-body", args.run.max_record_body).map_err(usage)?;
    flags::at_least_one("--part-rows", args.run.part_rows).map_err(usage)?;
    seconds("--part-seconds", args.run.part_seconds)?;
    Ok(RecordingInput {
        exchanges: !args.no_record,
        max_record_body: args.run.max_record_body,
        part_rows: args.run.part_rows,
        part_seconds: args.run.part_seconds,
        record_hold: args
            .record_hold
            .unwrap_or_else(crate::record::default_hold_bytes),
    })
}

/// `--contract`, read and checked against the plan and the run's start.
fn contract_for(
    args: &ReplayArgs,
    plan: &Plan,
    started_at_us: i64,
) -> Result<Option<ContractInput>, CliError> {
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
    Ok(Some(ContractInput {
        contract: c,
        path: path.clone(),
    }))
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

/// Raise the soft open-file limit to what the plan's largest concurrency needs (one
/// socket per worker, two with the in-process mock worker holding the other end), and
/// refuse a concurrency the limit cannot hold, naming the largest it can: running into
/// "Too many open files" halfway through a round would fail it for the tool's reasons.
fn open_files_for(plan: &Plan, shape: Shape, mock: bool) -> Result<(), CliError> {
    // An open loop holds at most load.max_in_flight connections.
    let closed = plan.concurrency.iter().copied().max().unwrap_or(1) as u64;
    let open = plan.load.max_in_flight as u64;
    let (what, max_c) = match (plan.load.mode, shape.sweep_rates()) {
        (m, _) if m.is_open() => ("load.max_in_flight", open),
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
    let origin = Endpoint::parse(&m.url()).map_err(|e| tool(e.to_string()))?;
    Ok((m, plan.with_origin(&origin)))
}

/// What the run returned, shown: the verdict (on stderr, also under --quiet: it is the
/// run's answer), the summary (`--json`) or the table, where the rows are, the first
/// failure; then the exit code, or the problems met.
fn shown(end: ReplayEnd, args: &ReplayArgs) -> Result<Exit, CliError> {
    let ReplayEnd {
        end,
        dir,
        summary,
        table,
        verdict,
        rows,
        first_failure,
        mut problems,
    } = end;
    if let Some(v) = verdict {
        eprintln!("matrix-proxy: verdict: {v} (verdict.json)");
    }
    if args.run.json
        && let Err(e) = print_json(&summary, &dir)
    {
        problems.push(e);
    }
    if let Some(table) = table
        && let Err(e) = print_stdout(&table, "the table", &dir)
    {
        problems.push(e);
    }
    if !args.run.quiet && args.no_record {
        eprintln!(
            "matrix-proxy: recording off (--no-record): no exchanges written; reports in {}",
            dir.display()
        );
    } else if !args.run.quiet {
        eprintln!(
            "matrix-proxy: {rows} exchange{} recorded in {}",
            if rows == 1 { "" } else { "s" },
            dir.display()
        );
    }
    // Why a run failed is said here, not only in Parquet (also under --quiet: it is the
    // reason for the exit code).
    if let Some(first) = &first_failure {
        eprintln!("matrix-proxy: first failure: {first}");
        eprintln!(
            "matrix-proxy: failures by kind (all phases): {}",
            failures_by_kind(&summary.failures)
        );
    }
    if !problems.is_empty() {
        return Err(run_error(crate::run::RunError::Problems { problems, dir }));
    }
    Ok(super::io::exit_of(end))
}

/// `kind count, ...` from summary.json's `failures`.
fn failures_by_kind(failures: &Failures) -> String {
    failures
        .iter()
        .map(|(k, v)| format!("{} {v}", k.as_str()))
        .collect::<Vec<_>>()
        .join(", ")
}
