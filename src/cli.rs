//! The command line: argument shapes (clap), the commands' orchestration, and the
//! mapping of every ending onto an exit code. This is the only place that prints for the
//! user (tables to stdout, everything else to stderr).

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use clap::{Args, Parser, Subcommand};

use crate::clock;
use crate::engine::{Engine, TlsOptions};
use crate::mock::{MockConfig, MockWorker};
use crate::plan::{Endpoint, Plan, Scheme};
use crate::replay::{self, Ending, ReplayOptions};
use crate::rundir::{self, RunDir, RunDirError};
use crate::summary;

/// Exit codes, the same for every command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Success: every request passed.
    Ok = 0,
    /// A failure was recorded.
    Failure = 1,
    /// Unusable input: bad plan, bad flags, existing output directory.
    Usage = 2,
    /// The tool itself failed (I/O, disk full) after keeping what it had written.
    Tool = 3,
    /// Interrupted (Ctrl-C / SIGTERM); files closed and readable.
    Interrupted = 130,
}

#[derive(Parser, Debug)]
#[command(
    name = "matrix-proxy",
    version,
    about = "Record and benchmark HTTP traffic to model servers",
    long_about = "Record and benchmark HTTP traffic to model servers.\n\nExit codes: 0 success, 1 a failure was recorded, 2 unusable input, 3 tool error, 130 interrupted."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Validate a plan completely (no network, no output files).
    Validate {
        /// The plan (JSON, schema v1).
        plan: PathBuf,
    },
    /// Replay a frozen plan against a worker and record every exchange.
    Replay(ReplayArgs),
    /// Run the built-in OpenAI-compatible mock worker.
    MockWorker(MockArgs),
}

#[derive(Args, Debug, Clone)]
pub struct ReplayArgs {
    /// The plan (JSON, schema v1).
    pub plan: PathBuf,
    /// Run directory to create (refused if it exists). Default: runs/<plan stem>-<UTC time>.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Replace the plan's endpoint (origin and path) and its health endpoint's origin.
    #[arg(long, value_name = "URL", conflicts_with = "mock_worker")]
    pub endpoint: Option<String>,
    /// Start the built-in mock worker on 127.0.0.1 and send the plan there.
    #[arg(long)]
    pub mock_worker: bool,
    /// Environment variable holding a bearer token to send (never written anywhere).
    #[arg(long, value_name = "NAME")]
    pub bearer_token_env: Option<String>,
    /// PEM file of CA certificates for https workers (default: the platform's roots).
    #[arg(long, value_name = "FILE")]
    pub ca_cert: Option<PathBuf>,
    /// Largest response body kept per exchange (and judged); larger ones are truncated in
    /// the record and fail their oracle.
    #[arg(long, value_name = "BYTES", default_value_t = 16 << 20)]
    pub max_record_body: usize,
    /// No progress bar and no table.
    #[arg(long, short)]
    pub quiet: bool,
}

#[derive(Args, Debug, Clone)]
pub struct MockArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8000")]
    pub listen: SocketAddr,
    /// Time before the first token, per request (ms).
    #[arg(long, default_value_t = MockConfig::default().prefill_ms)]
    pub prefill_ms: f64,
    /// Time per generated token (ms).
    #[arg(long, default_value_t = MockConfig::default().per_token_ms)]
    pub per_token_ms: f64,
    /// Requests served at once; more queue.
    #[arg(long, default_value_t = MockConfig::default().max_batch)]
    pub max_batch: usize,
    /// Tokens generated when a request gives no max_tokens.
    #[arg(long, default_value_t = MockConfig::default().default_max_tokens)]
    pub max_tokens: u32,
    /// How long the `stall` fault withholds its answer (ms).
    #[arg(long, default_value_t = MockConfig::default().stall_ms)]
    pub stall_ms: u64,
}

impl MockArgs {
    pub fn config(&self) -> MockConfig {
        MockConfig {
            prefill_ms: self.prefill_ms.max(0.0),
            per_token_ms: self.per_token_ms.max(0.0),
            max_batch: self.max_batch.max(1),
            default_max_tokens: self.max_tokens,
            stall_ms: self.stall_ms,
        }
    }
}

/// An error and the exit code it maps to.
#[derive(Debug)]
pub struct CliError {
    pub exit: Exit,
    pub message: String,
}

fn usage(message: impl Into<String>) -> CliError {
    CliError {
        exit: Exit::Usage,
        message: message.into(),
    }
}

fn tool(message: impl Into<String>) -> CliError {
    CliError {
        exit: Exit::Tool,
        message: message.into(),
    }
}

/// Parse args and run; returns the process exit code.
pub fn main_with_args(args: Vec<OsString>) -> i32 {
    let cli = match Cli::try_parse_from(args) {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() {
                Exit::Usage as i32
            } else {
                0
            };
            let _ = e.print();
            return code;
        }
    };
    let result = match cli.command {
        Command::Validate { plan } => validate(&plan),
        Command::Replay(args) => {
            with_runtime(|interrupt| async move { replay_cmd(args, interrupt).await })
        }
        Command::MockWorker(args) => {
            with_runtime(|interrupt| async move { mock_cmd(args, interrupt).await })
        }
    };
    match result {
        Ok(exit) => exit as i32,
        Err(e) => {
            eprintln!("matrix-proxy: error: {}", e.message);
            e.exit as i32
        }
    }
}

fn with_runtime<F, Fut>(f: F) -> Result<Exit, CliError>
where
    F: FnOnce(Arc<AtomicBool>) -> Fut,
    Fut: std::future::Future<Output = Result<Exit, CliError>>,
{
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| tool(format!("cannot start the async runtime: {e}")))?;
    rt.block_on(async move {
        let interrupt = Arc::new(AtomicBool::new(false));
        spawn_signal_watcher(interrupt.clone());
        f(interrupt).await
    })
}

/// Ctrl-C or SIGTERM set `flag`; a second one exits at once with 130.
fn spawn_signal_watcher(flag: Arc<AtomicBool>) {
    tokio::spawn(async move {
        #[cfg(unix)]
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        loop {
            #[cfg(unix)]
            let got = match term.as_mut() {
                Some(t) => tokio::select! {
                    r = tokio::signal::ctrl_c() => r.is_ok(),
                    r = t.recv() => r.is_some(),
                },
                None => tokio::signal::ctrl_c().await.is_ok(),
            };
            #[cfg(not(unix))]
            let got = tokio::signal::ctrl_c().await.is_ok();
            if !got {
                return;
            }
            if flag.swap(true, Ordering::SeqCst) {
                eprintln!("matrix-proxy: interrupted twice, exiting now");
                std::process::exit(Exit::Interrupted as i32);
            }
            eprintln!(
                "matrix-proxy: interrupted: no new requests; finishing in-flight exchanges and closing files (again to exit at once)"
            );
        }
    });
}

fn load_plan(path: &Path) -> Result<(Vec<u8>, Plan), CliError> {
    let bytes = std::fs::read(path)
        .map_err(|e| usage(format!("{}: cannot read the plan: {e}", path.display())))?;
    let plan =
        Plan::from_json_bytes(&bytes).map_err(|e| usage(format!("{}: {e}", path.display())))?;
    Ok((bytes, plan))
}

pub fn validate(path: &Path) -> Result<Exit, CliError> {
    let (_, plan) = load_plan(path)?;
    let variants: usize = plan.cases.iter().map(|c| c.variants.len()).sum();
    eprintln!(
        "{}: valid plan: {} case(s), {} variant(s), concurrency {:?}, {} requests per case x {} repetitions, {} planned requests, {} connections",
        path.display(),
        plan.cases.len(),
        variants,
        plan.concurrency,
        plan.requests_per_case,
        plan.repetitions,
        plan.planned_requests(),
        plan.connection.as_str()
    );
    Ok(Exit::Ok)
}

/// Read and check a bearer token from the named environment variable.
fn read_token(name: &str, source: &str) -> Result<String, CliError> {
    let val = std::env::var_os(name).ok_or_else(|| {
        usage(format!(
            "environment variable {name} (named by {source}) is not set; export it, or leave out the bearer token"
        ))
    })?;
    let s = val.to_str().ok_or_else(|| {
        usage(format!(
            "environment variable {name} (named by {source}) is not valid UTF-8"
        ))
    })?;
    if s.is_empty() {
        return Err(usage(format!(
            "environment variable {name} (named by {source}) is empty"
        )));
    }
    if !s.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
        return Err(usage(format!(
            "environment variable {name} (named by {source}) must hold printable ASCII without spaces or control characters"
        )));
    }
    Ok(s.to_string())
}

fn run_id(now_us: i64) -> String {
    let seed = format!("{}-{}-{}", now_us, std::process::id(), clock::now_ns());
    format!(
        "{}-{}",
        clock::compact_utc(now_us),
        &rundir::sha256_hex(seed.as_bytes())[..8]
    )
}

/// The `replay` command. `interrupt` turns true on Ctrl-C / SIGTERM.
pub async fn replay_cmd(args: ReplayArgs, interrupt: Arc<AtomicBool>) -> Result<Exit, CliError> {
    // 1. Everything that can be wrong with the input is checked before any output exists.
    let (plan_bytes, mut plan) = load_plan(&args.plan)?;
    let endpoint_override = match &args.endpoint {
        Some(url) => {
            Some(Endpoint::parse(url).map_err(|m| usage(format!("--endpoint '{url}' {m}")))?)
        }
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
    let need_tls = !args.mock_worker
        && (plan.endpoint.scheme == Scheme::Https || plan.health_endpoint.scheme == Scheme::Https);
    let engine = Engine::new(
        need_tls,
        &TlsOptions {
            ca_file: args.ca_cert.clone(),
        },
    )
    .map_err(usage)?;
    let started_at_us = clock::wall_now_us();
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

    // 2. The mock worker, when asked for, replaces the plan's origin.
    let mock_config = MockConfig::default();
    let mock = if args.mock_worker {
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
        Some(m)
    } else {
        None
    };

    // 3. The run directory.
    let dir = match RunDir::create(&out) {
        Ok(d) => d,
        Err(e @ RunDirError::Exists(_)) => return Err(usage(e.to_string())),
        Err(e) => return Err(tool(e.to_string())),
    };
    dir.write_file("plan.json", &plan_bytes)
        .map_err(|e| tool(e.to_string()))?;
    let rid = run_id(started_at_us);
    let extra = serde_json::json!({
        "endpoint_override": args.endpoint,
        "mock_worker": mock.as_ref().map(|m| serde_json::json!({
            "url": m.url(),
            "prefill_ms": mock_config.prefill_ms,
            "per_token_ms": mock_config.per_token_ms,
            "max_batch": mock_config.max_batch,
            "default_max_tokens": mock_config.default_max_tokens,
        })),
        "auth": {
            "bearer_token_env": token_env,
            "bearer_token_sent": bearer_token.is_some(),
        },
        "recording": {
            "max_record_body_bytes": args.max_record_body,
            "redacted_headers": crate::record::DEFAULT_REDACT_HEADERS,
            "redacted_query_parameters": crate::record::DEFAULT_REDACT_QUERY,
        },
    });
    let mut config = replay::config_json(
        &plan,
        &rid,
        &args.plan.display().to_string(),
        &rundir::sha256_hex(&plan_bytes),
        started_at_us,
        extra,
    );
    dir.write_json("config.json", &config)
        .map_err(|e| tool(e.to_string()))?;
    if !args.quiet {
        eprintln!(
            "matrix-proxy: replaying {} -> {} ({} planned requests, {} connections); run directory {}",
            args.plan.display(),
            plan.endpoint.url(),
            plan.planned_requests(),
            plan.connection.as_str(),
            dir.path.display()
        );
    }

    // 4. The run.
    let result = replay::run(
        ReplayOptions {
            plan: plan.clone(),
            run_id: rid,
            bearer_token,
            max_record_body: args.max_record_body,
            quiet: args.quiet,
        },
        engine,
        &dir,
        interrupt,
    )
    .await
    .map_err(|e| tool(e.to_string()))?;
    if let Some(m) = mock {
        m.shutdown().await;
    }

    // 5. Reports. Each is written even if an earlier step failed, so nothing is lost.
    let mut problems = Vec::new();
    if let Err(e) = summary::write_rounds_parquet(&dir.path.join("rounds.parquet"), &result.rounds)
    {
        problems.push(format!("rounds.parquet: {e}"));
    }
    let mut summary_v = result.summary.clone();
    summary_v["rows_written"] = serde_json::json!(result.rows_written);
    if let Some(e) = &result.record_error {
        summary_v["record_error"] = serde_json::json!(e.to_string());
    }
    if let Err(e) = dir.write_json("summary.json", &summary_v) {
        problems.push(e.to_string());
    }
    config["finished_at"] = serde_json::json!(clock::iso_utc(clock::wall_now_us()));
    if let Err(e) = dir.write_json("config.json", &config) {
        problems.push(e.to_string());
    }
    if !args.quiet {
        print!("{}", result.table);
        eprintln!(
            "matrix-proxy: {} exchanges recorded in {}",
            result.rows_written,
            dir.path.display()
        );
    }
    if let Some(e) = result.record_error {
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

pub async fn mock_cmd(args: MockArgs, interrupt: Arc<AtomicBool>) -> Result<Exit, CliError> {
    let m = MockWorker::start(args.listen, args.config())
        .await
        .map_err(|e| usage(format!("--listen {}: cannot bind: {e}", args.listen)))?;
    eprintln!(
        "matrix-proxy: mock worker listening on {} (POST /v1/chat/completions, POST /v1/completions, GET /health, GET /v1/models); Ctrl-C to stop",
        m.url()
    );
    while !interrupt.load(Ordering::Relaxed) {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    m.shutdown().await;
    Ok(Exit::Ok)
}
