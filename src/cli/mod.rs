//! The command line: argument shapes (clap), reading files and the environment, binding
//! sockets, the commands' orchestration, and the mapping of every ending onto an exit
//! code. It prints the table (stdout) and every message (stderr); the drivers print only
//! their progress (replay's bar and failure lines, serve's live counters).

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use clap::{Args, Parser, Subcommand};

mod campaign;
mod metrics_http;
mod replay;
mod report_cmd;
mod summarize;

use campaign::verdict_cmd;
use campaign::{CompareArgs, compare_cmd};
pub use replay::replay_cmd;
pub use report_cmd::report_cmd;
pub use summarize::summarize_cmd;

use crate::clock;
use crate::config::flags;
use crate::config::plan::Plan;
use crate::config::shape::Shape;
use crate::drivers::RunContext;
use crate::engine::Engine;
use crate::mock::{MockConfig, MockWorker};
use crate::model::{ConnectionPolicy, Endpoint, Scheme};
use crate::net::tls::TlsOptions;
use crate::record::RecorderOptions;
use crate::record::rundir::{self, RunDir, RunDirError};
use crate::redact::Redaction;
use crate::report::doc::config::Fields;
use crate::report::{self, ServeStats, config_json};

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
    /// Run the recording reverse proxy in front of a live worker.
    Serve(ServeArgs),
    /// Run the built-in OpenAI-compatible mock worker.
    MockWorker(MockArgs),
    /// Rebuild rounds.parquet and summary.json of a run from its exchanges/ (also after a crash).
    Summarize {
        /// The run directory.
        dir: PathBuf,
        /// No table.
        #[arg(long, short)]
        quiet: bool,
        /// Print the rebuilt summary.json to stdout (one JSON document) instead of the
        /// table.
        #[arg(long)]
        json: bool,
    },
    /// Write one self-contained HTML report (charts with the numbers they draw) of one or
    /// more runs.
    Report {
        /// Run directories (replay, campaign or serve); several are overlaid, labelled by
        /// their folder names.
        #[arg(required = true, value_name = "RUN")]
        runs: Vec<PathBuf>,
        /// Where to write it. Default: RUN/report.html for one run; needed for several.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
    /// Print a shell completion script (e.g. `matrix-proxy completions bash >
    /// /etc/bash_completion.d/matrix-proxy`).
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Quarantine a crashed run's unfinished Parquet part and count the rows it held.
    Recover {
        /// The run directory.
        dir: PathBuf,
    },
    /// Evaluate a contract's gates on a finished campaign run (post hoc unless the run was
    /// started with this contract).
    Verdict {
        /// The campaign run directory.
        dir: PathBuf,
        /// The contract (contract.json).
        #[arg(long, value_name = "FILE")]
        contract: PathBuf,
        /// Where to write it. Default: RUN/verdict.json, or RUN/verdict.post-hoc.json when
        /// the contract is not the one the run was started with.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
    /// Compare two runs of one workload: drift of B's answers against A's and every
    /// metric's delta with both runs' spreads.
    Compare {
        /// The baseline run (its answers are the reference).
        run_a: PathBuf,
        /// The run compared with it.
        run_b: PathBuf,
        /// Also evaluate this contract (A's side as the reference, B's as the candidate).
        #[arg(long, value_name = "FILE")]
        contract: Option<PathBuf>,
        /// The lane of run B when it is not a campaign (a campaign arm keeps its own).
        #[arg(long, value_enum, default_value_t = LaneArg::PerformanceFit)]
        lane: LaneArg,
        /// Where to write compare.json.
        #[arg(long, value_name = "FILE", default_value = "compare.json")]
        out: PathBuf,
    },
}

/// A lane on the command line.
#[derive(clap::ValueEnum, Debug, Clone, Copy)]
pub enum LaneArg {
    Quality,
    PerformanceFit,
}

/// The flags `serve` and `replay` share: where the run goes, what it records, how it
/// stops, and what it prints.
#[derive(Args, Debug, Clone)]
pub struct RunFlags {
    /// Run directory to create (refused if it exists). Default: runs/<plan stem>-<UTC
    /// time> (replay), runs/live-<UTC time> (serve).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Bytes of each body kept in the record (serve: per direction, and forwarding is
    /// never cut; replay: the response, judged as kept, so a larger one is truncated in
    /// the record and fails its oracle).
    #[arg(long, value_name = "BYTES", default_value_t = 16 << 20)]
    pub max_record_body: usize,
    /// Roll to a new Parquet part after this many rows (a crash loses at most one part).
    #[arg(long, default_value_t = 100_000)]
    pub part_rows: usize,
    /// Roll to a new Parquet part after this many seconds.
    #[arg(allow_negative_numbers = true, long, default_value_t = 60.0)]
    pub part_seconds: f64,
    /// After Ctrl-C / SIGTERM, seconds in-flight exchanges may still finish (0: none);
    /// then they are cut and recorded `shutdown_cut`. A second Ctrl-C exits at once.
    /// Default: 5 (replay), 10 (serve).
    #[arg(allow_negative_numbers = true, long, value_name = "SECONDS")]
    pub grace_seconds: Option<f64>,
    /// Threads of the async runtime (default: the cores this process may run on, i.e. its
    /// CPU affinity, as under `taskset`). The Parquet writer has a thread of its own.
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// No progress output (replay: the bar and the table; serve: the live counters).
    #[arg(long, short)]
    pub quiet: bool,
    /// Print the run's summary.json to stdout (one JSON document, the same bytes as the
    /// file: replay instead of the table, serve when stopped); progress and messages stay
    /// on stderr.
    #[arg(long)]
    pub json: bool,
    /// Serve live Prometheus metrics at http://ADDR/metrics while the run lasts
    /// (exposition format 0.0.4; e.g. 127.0.0.1:9464; port 0 picks one, written to
    /// config.json as `metrics_listen`).
    #[arg(long, value_name = "ADDR", value_parser = listen_address)]
    pub metrics_listen: Option<SocketAddr>,
}

impl RunFlags {
    /// `--grace-seconds`, or the command's default.
    pub(crate) fn grace_or(&self, default: f64) -> f64 {
        self.grace_seconds.unwrap_or(default)
    }
}

/// `replay`'s default `--grace-seconds`.
pub(crate) const REPLAY_GRACE_SECONDS: f64 = 5.0;
/// `serve`'s default `--grace-seconds`.
pub(crate) const SERVE_GRACE_SECONDS: f64 = 10.0;

#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    /// Address to accept clients on (loopback by default; another address is your choice).
    #[arg(long, default_value = "127.0.0.1:9000", value_parser = listen_address)]
    pub listen: SocketAddr,
    /// The worker to forward to, e.g. http://127.0.0.1:8000 (a path is a prefix).
    #[arg(long, value_name = "URL")]
    pub upstream: String,
    /// `pinned`: each client connection gets its own upstream connection, kept alive;
    /// `fresh`: a new upstream connection per request.
    #[arg(long, value_enum, default_value_t = ConnectionPolicy::KeepAlive)]
    pub upstream_connection: ConnectionPolicy,
    /// Seconds to wait for the upstream response head (connect included); then 504.
    #[arg(
        allow_negative_numbers = true,
        long,
        value_name = "SECONDS",
        default_value_t = 300.0
    )]
    pub upstream_timeout: f64,
    /// Longest gap between upstream body bytes, in seconds, before the exchange is cut.
    #[arg(
        allow_negative_numbers = true,
        long,
        value_name = "SECONDS",
        default_value_t = 300.0
    )]
    pub upstream_idle_timeout: f64,
    /// Bytes of recorded bodies held in memory at once, across all exchanges.
    #[arg(long, value_name = "BYTES", default_value_t = 512 << 20)]
    pub record_memory: usize,
    /// Also redact this header's value (repeatable).
    #[arg(long, value_name = "NAME")]
    pub redact_header: Vec<String>,
    /// Also redact this query parameter's value in recorded URLs (repeatable).
    #[arg(long, value_name = "NAME")]
    pub redact_query: Vec<String>,
    /// Send the upstream's authority as Host instead of the client's.
    #[arg(long)]
    pub rewrite_host: bool,
    /// PEM certificate chain: serve clients over TLS (with --tls-key).
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key for --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// PEM CA certificates for an https upstream (default: the platform's roots).
    #[arg(long, value_name = "FILE")]
    pub upstream_ca: Option<PathBuf>,
    /// When the recorder's queue is full: wait (`block`) or drop the row and count it.
    #[arg(long, value_enum, default_value_t = OnRecordFull::Block)]
    pub on_record_full: OnRecordFull,
    /// Finished exchanges queued between the proxy and the writer thread. When it is
    /// full, `block` holds each connection's next request until its row is queued.
    #[arg(long, value_name = "ROWS", default_value_t = 4096)]
    pub record_queue: usize,
    /// Largest request head (request line and headers) accepted from a client; larger: 431.
    #[arg(long, value_name = "BYTES", default_value_t = 64 << 10)]
    pub max_header_bytes: usize,
    /// Seconds a client has to send a complete request head before it is disconnected.
    #[arg(
        allow_negative_numbers = true,
        long,
        value_name = "SECONDS",
        default_value_t = 30.0
    )]
    pub header_read_timeout: f64,
    /// Client connections served at once; more wait in the listen backlog, which is as
    /// deep (capped by net.core.somaxconn). The open-file limit is raised to fit, as far as
    /// the hard limit allows. Default: 16384, or what the open-file limit holds if less.
    #[arg(long)]
    pub max_connections: Option<usize>,
    /// Seconds between live counter lines on stderr.
    #[arg(
        allow_negative_numbers = true,
        long,
        value_name = "SECONDS",
        default_value_t = 5.0
    )]
    pub stats_seconds: f64,
    #[command(flatten)]
    pub run: RunFlags,
}

pub use crate::drivers::serve::OnRecordFull;

/// `--upstream-connection`: serve's connection policy, the one replay's plans name
/// (`pinned` on the command line and in serve's config.json is `keep-alive`).
pub type UpstreamConnection = ConnectionPolicy;

// The command line's names of the drivers' enums (the drivers know no clap).
impl clap::ValueEnum for ConnectionPolicy {
    fn value_variants<'a>() -> &'a [Self] {
        &[ConnectionPolicy::KeepAlive, ConnectionPolicy::Fresh]
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        Some(clap::builder::PossibleValue::new(self.serve_name()))
    }
}

impl clap::ValueEnum for OnRecordFull {
    fn value_variants<'a>() -> &'a [Self] {
        &[OnRecordFull::Block, OnRecordFull::Drop]
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        let help = match self {
            OnRecordFull::Block => {
                "Wait for the writer (back-pressure on the finished exchange, never on the response)"
            }
            OnRecordFull::Drop => {
                "Drop the row and count it (the count is printed and kept in summary.json)"
            }
        };
        Some(clap::builder::PossibleValue::new(self.as_str()).help(help))
    }
}

#[derive(Args, Debug, Clone)]
pub struct ReplayArgs {
    /// The plan (JSON, schema v1).
    pub plan: PathBuf,
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
    /// During a measured round, keep up to this many bytes of rows in memory and encode
    /// them to Parquet after the round, so no request waits behind the encoder (0: encode
    /// as rows arrive). Past it, rows are encoded during the round and counted
    /// (`rows_encoded_during_rounds`). A SIGKILL mid-round loses the held rows. Default:
    /// an eighth of the memory the process may use (the machine's, or the cgroup's
    /// memory.max when lower), at most 1 GiB; 256 MiB when neither can be read.
    #[arg(long, value_name = "BYTES")]
    pub record_hold: Option<usize>,
    /// Do not write exchanges/ (rounds.parquet and summary.json are still written, from
    /// the measurements in memory). For measuring what recording costs; such a run cannot
    /// be rebuilt by `summarize`.
    #[arg(long)]
    pub no_record: bool,
    /// A pre-registered contract (contract.json) for a campaign plan: its SHA-256 is
    /// recorded at the start, and verdict.json is written after the run.
    #[arg(long, value_name = "FILE", conflicts_with = "no_record")]
    pub contract: Option<PathBuf>,
    /// GuideLLM-style sweep of a closed-loop plan, per case: one round at c = 1 (the
    /// synchronous rate), one at the plan's highest concurrency (the throughput probe),
    /// then N open-loop rates spaced evenly between their throughputs (the plan's
    /// `load.arrival` and `load.seed`, `requests_per_case` arrivals a round), in one run.
    #[arg(long, value_name = "N")]
    pub sweep: Option<usize>,
    /// Open-loop plans only: be shard I of N generator machines. This process sends the
    /// arrivals whose index is I modulo N of every round's seeded schedule (the shards'
    /// union is the unsharded schedule), writes its rows under `OUT/exchanges/shard=I/`
    /// and its reports under `OUT/shards/I/`; `matrix-proxy summarize OUT` merges the
    /// shards. Needs --start-at and --out.
    #[arg(long, value_name = "I/N", requires = "start_at")]
    pub shard: Option<String>,
    /// With --shard: the shared instant (RFC 3339, `2026-12-01T12:00:00Z`) at which every
    /// shard's first open-loop wave starts; later waves follow on a timetable every shard
    /// computes alike (each wave's schedule, then `timeout_seconds` + 1 s to drain).
    #[arg(long, value_name = "UTC", requires = "shard")]
    pub start_at: Option<String>,
    #[command(flatten)]
    pub run: RunFlags,
    #[command(flatten)]
    pub mock: MockLatencyArgs,
}

/// The built-in mock's model latency for `replay --mock-worker` (defaults: the mock's).
#[derive(Args, Debug, Clone, Default)]
pub struct MockLatencyArgs {
    /// With --mock-worker: the mock's time before the first token, per request (ms).
    #[arg(
        allow_negative_numbers = true,
        long = "mock-prefill-ms",
        value_name = "MS",
        requires = "mock_worker"
    )]
    pub prefill_ms: Option<f64>,
    /// With --mock-worker: the mock's time per generated token (ms).
    #[arg(
        long = "mock-per-token-ms",
        value_name = "MS",
        requires = "mock_worker"
    )]
    pub per_token_ms: Option<f64>,
    /// With --mock-worker: requests the mock serves at once; more queue.
    #[arg(long = "mock-max-batch", value_name = "N", requires = "mock_worker")]
    pub max_batch: Option<usize>,
}

impl MockLatencyArgs {
    /// The mock's configuration: its defaults, with what these flags set, checked.
    pub(crate) fn config(&self) -> Result<MockConfig, CliError> {
        let mut c = MockConfig::default();
        if let Some(v) = self.prefill_ms {
            c.prefill_ms = flags::milliseconds("--mock-prefill-ms", v).map_err(usage)?;
        }
        if let Some(v) = self.per_token_ms {
            c.per_token_ms = flags::milliseconds("--mock-per-token-ms", v).map_err(usage)?;
        }
        if let Some(v) = self.max_batch {
            c.max_batch = flags::at_least_one("--mock-max-batch", v).map_err(usage)?;
        }
        Ok(c)
    }
}

#[derive(Args, Debug, Clone)]
pub struct MockArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8000", value_parser = listen_address)]
    pub listen: SocketAddr,
    /// Time before the first token, per request (ms).
    #[arg(allow_negative_numbers = true, long, default_value_t = MockConfig::default().prefill_ms)]
    pub prefill_ms: f64,
    /// Time per generated token (ms).
    #[arg(allow_negative_numbers = true, long, default_value_t = MockConfig::default().per_token_ms)]
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
    /// Answer with another deterministic text for the same prompts (0: the default), so a
    /// campaign arm can drift from the reference.
    #[arg(long, default_value_t = 0)]
    pub text_seed: u64,
}

impl MockArgs {
    /// The mock's configuration, checked (exit 2 on a negative or non-finite time, or a
    /// batch of 0).
    pub fn config(&self) -> Result<MockConfig, CliError> {
        Ok(MockConfig {
            prefill_ms: flags::milliseconds("--prefill-ms", self.prefill_ms).map_err(usage)?,
            per_token_ms: flags::milliseconds("--per-token-ms", self.per_token_ms)
                .map_err(usage)?,
            max_batch: flags::at_least_one("--max-batch", self.max_batch).map_err(usage)?,
            default_max_tokens: self.max_tokens,
            stall_ms: self.stall_ms,
            text_seed: self.text_seed,
        })
    }
}

/// `--listen HOST:PORT`: an address, or a name resolved now (`localhost:9101`); the
/// first address it resolves to is used.
fn listen_address(s: &str) -> Result<SocketAddr, String> {
    use std::net::ToSocketAddrs;
    if let Ok(a) = s.parse() {
        return Ok(a);
    }
    s.to_socket_addrs()
        .map_err(|e| format!("'{s}' is not HOST:PORT that resolves ({e})"))?
        .next()
        .ok_or_else(|| format!("'{s}' resolves to no address"))
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

/// The command line as given (set by [`main_with_args`]; empty when a command is called
/// as a library function). Only [`argv`] hands it out, redacted.
static ARGV: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();

/// The command line as config.json records it: the values of the query parameters `r`
/// redacts (the defaults, and serve's `--redact-query` names) are `<redacted>` in every
/// URL (`--endpoint URL`, `--upstream=URL`). Credentials in URLs and bearer tokens never
/// appear on a valid command line (refused, or named by variable).
fn argv(r: &Redaction) -> Vec<String> {
    ARGV.get()
        .map(|args| {
            args.iter()
                .map(|arg| match arg.split_once('=') {
                    Some((flag, value)) if flag.starts_with("--") => {
                        format!("{flag}={}", r.url(value))
                    }
                    _ => r.url(arg).into_owned(),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Parse args and run; returns the process exit code.
pub fn main_with_args(args: Vec<OsString>) -> i32 {
    let _ = ARGV.set(
        args.iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect(),
    );
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
            with_runtime(RUN_STOPPING, args.run.threads, |interrupt| async move {
                replay_cmd(args, interrupt).await
            })
        }
        Command::Serve(args) => {
            with_runtime(RUN_STOPPING, args.run.threads, |interrupt| async move {
                serve_cmd(args, interrupt).await
            })
        }
        Command::MockWorker(args) => with_runtime(MOCK_STOPPING, None, |interrupt| async move {
            mock_cmd(args, interrupt).await
        }),
        Command::Summarize { dir, quiet, json } => summarize_cmd(&dir, quiet, json),
        Command::Report { runs, out } => report_cmd(&runs, out.as_deref()),
        Command::Completions { shell } => completions(shell),
        Command::Recover { dir } => recover_cmd(&dir),
        Command::Verdict { dir, contract, out } => verdict_cmd(&dir, &contract, out.as_deref()),
        Command::Compare {
            run_a,
            run_b,
            contract,
            lane,
            out,
        } => compare_cmd(&CompareArgs {
            a: &run_a,
            b: &run_b,
            contract: contract.as_deref(),
            lane: match lane {
                LaneArg::Quality => crate::config::campaign::Lane::Quality,
                LaneArg::PerformanceFit => crate::config::campaign::Lane::PerformanceFit,
            },
            out: &out,
        }),
    };
    match result {
        Ok(exit) => exit as i32,
        Err(e) => {
            eprintln!("matrix-proxy: error: {}", e.message);
            e.exit as i32
        }
    }
}

/// What each command says on the first Ctrl-C / SIGTERM.
/// replay and serve stop alike.
const RUN_STOPPING: &str = "matrix-proxy: interrupted: no new requests; in-flight exchanges get --grace-seconds, then are cut; closing files (again to exit at once)";
const MOCK_STOPPING: &str =
    "matrix-proxy: interrupted: stopping the mock worker (again to exit at once)";

/// Threads of the async runtime: `--threads`, else the cores in the process's affinity.
pub(crate) fn runtime_threads(flag: Option<usize>) -> usize {
    flag.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// One work-stealing runtime of `threads` threads (see [`runtime_threads`]). A
/// `current_thread` runtime per thread was measured against it for replay (issue 15:
/// pinned to one core, c = 1, 16, 64) and was not consistently faster, so the
/// work-stealing one stays: it also balances serve's connections across threads.
fn with_runtime<F, Fut>(
    stopping: &'static str,
    threads: Option<usize>,
    f: F,
) -> Result<Exit, CliError>
where
    F: FnOnce(Arc<AtomicBool>) -> Fut,
    Fut: std::future::Future<Output = Result<Exit, CliError>>,
{
    if threads == Some(0) {
        return Err(usage("--threads must be at least 1"));
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(runtime_threads(threads))
        .enable_all()
        .build()
        .map_err(|e| tool(format!("cannot start the async runtime: {e}")))?;
    rt.block_on(async move {
        let interrupt = Arc::new(AtomicBool::new(false));
        spawn_signal_watcher(interrupt.clone(), stopping);
        f(interrupt).await
    })
}

/// Ctrl-C or SIGTERM set `flag`; a second one exits at once with 130.
fn spawn_signal_watcher(flag: Arc<AtomicBool>, stopping: &'static str) {
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
                // Servers a campaign started run in their own process groups: they would
                // outlive an exit that does not take them along.
                crate::drivers::replay::kill_started_servers();
                eprintln!("matrix-proxy: interrupted twice, exiting now");
                std::process::exit(Exit::Interrupted as i32);
            }
            eprintln!("{stopping}");
        }
    });
}

/// Largest plan file accepted.
pub const MAX_PLAN_BYTES: u64 = report::run::MAX_PLAN_BYTES;

/// A report's error as the command line says it: a run or a file that cannot be used is
/// unusable input (exit 2); rows that cannot be read back are the tool's (exit 3).
fn report_error(e: report::run::ReportError) -> CliError {
    match e {
        report::run::ReportError::Rows(m) => tool(m),
        other => usage(other.to_string()),
    }
}

fn load_plan(path: &Path) -> Result<(Vec<u8>, Plan), CliError> {
    report::run::load_plan(path).map_err(report_error)
}

pub fn validate(path: &Path) -> Result<Exit, CliError> {
    let (_, plan) = load_plan(path)?;
    let variants: usize = plan.cases.iter().map(|c| c.variants.len()).sum();
    if plan.load.mode == crate::config::load::Mode::Open {
        eprintln!(
            "{}: valid plan: {} case(s), {} variant(s), open loop at {:?} requests/s ({}), {} repetitions, {} planned requests, {} connections",
            path.display(),
            plan.cases.len(),
            variants,
            plan.load.rates_per_second,
            plan.load.to_json(),
            plan.repetitions,
            Shape::Plain.planned_requests(&plan),
            plan.connection.as_str()
        );
        return Ok(Exit::Ok);
    }
    eprintln!(
        "{}: valid plan: {} case(s), {} variant(s), concurrency {:?}, {} requests per case x {} repetitions, {} planned requests, {} connections",
        path.display(),
        plan.cases.len(),
        variants,
        plan.concurrency,
        plan.requests_per_case,
        plan.repetitions,
        Shape::Plain.planned_requests(&plan),
        plan.connection.as_str()
    );
    if let Some(c) = &plan.campaign {
        eprintln!(
            "  campaign '{}': {} arm(s), {} evidence, {} schedule",
            plan.name.as_deref().unwrap_or_default(),
            c.arms.len(),
            c.evidence_class.as_str(),
            c.schedule.as_str()
        );
        for a in &c.arms {
            let r = &a.recipe;
            eprintln!(
                "  arm '{}' ({}{}): {} {} {} on {}; {}{}{}",
                a.name,
                a.lane.as_str(),
                if a.reference { ", reference" } else { "" },
                r.runtime,
                r.weight_format,
                r.weight_quantization,
                r.device,
                config_json::redacted(&a.endpoint),
                a.start
                    .as_ref()
                    .map(|s| format!("; started as {}", s.command.join(" ")))
                    .unwrap_or_default(),
                a.artifact
                    .as_ref()
                    .map(|p| format!("; artifact {p}"))
                    .unwrap_or_default()
            );
        }
    }
    Ok(Exit::Ok)
}

/// Read a bearer token from the named environment variable and check it.
fn read_token(name: &str, source: &str) -> Result<String, CliError> {
    flags::bearer_token(name, source, std::env::var_os(name).as_deref()).map_err(usage)
}

/// Create the run directory; `default_name`: the user did not choose it, so a taken name
/// gets a numeric suffix instead of being refused.
fn create_run_dir(out: &Path, default_name: bool) -> Result<RunDir, CliError> {
    let mut candidate = out.to_path_buf();
    for n in 2..1000 {
        match RunDir::create(&candidate) {
            Ok(d) => return Ok(d),
            Err(RunDirError::Exists(_)) if default_name => {
                candidate = PathBuf::from(format!("{}-{n}", out.display()));
            }
            Err(e @ RunDirError::Exists(_)) => return Err(usage(e.to_string())),
            Err(e) => {
                return Err(usage(format!(
                    "--out {}: cannot create the run directory ({e})",
                    candidate.display()
                )));
            }
        }
    }
    Err(usage(format!(
        "{}: too many runs with this name",
        out.display()
    )))
}

/// Write `text` to stdout. A closed or full stdout (`> /dev/full`, a pipe whose reader
/// left) is an error naming where the files are (exit 3), never a panic.
fn print_stdout(text: &str, what: &str, dir: &Path) -> Result<(), String> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(|e| {
            format!(
                "cannot write {what} to stdout: {e}; the files written are complete ({})",
                dir.display()
            )
        })
}

/// `completions SHELL`: the script on stdout (a closed pipe is an error, not a panic).
fn completions(shell: clap_complete::Shell) -> Result<Exit, CliError> {
    use clap::CommandFactory;
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "matrix-proxy", &mut script);
    print_stdout(
        &String::from_utf8_lossy(&script),
        "the completion script",
        Path::new("."),
    )
    .map(|()| Exit::Ok)
    .map_err(tool)
}

/// `--json`: `v` on stdout exactly as `RunDir::write_json` writes it to summary.json.
fn print_json<T: serde::Serialize>(v: &T, dir: &Path) -> Result<(), String> {
    let text = String::from_utf8_lossy(&rundir::json_bytes(v)).into_owned();
    print_stdout(&text, "the summary", dir)
}

fn run_id(now_us: i64) -> String {
    let seed = format!("{}-{}-{}", now_us, std::process::id(), clock::now_ns());
    format!(
        "{}-{}",
        clock::compact_utc(now_us),
        &rundir::sha256_hex(seed.as_bytes())[..8]
    )
}

pub async fn mock_cmd(args: MockArgs, interrupt: Arc<AtomicBool>) -> Result<Exit, CliError> {
    let m = MockWorker::start(args.listen, args.config()?)
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
    Ok(Exit::Interrupted)
}

fn seconds(flag: &str, v: f64) -> Result<std::time::Duration, CliError> {
    flags::seconds(flag, v).map_err(usage)
}

/// Every flag of `serve` checked, and the TLS and engine set-ups built, before anything
/// is bound or created.
struct ServeInput {
    upstream: Endpoint,
    upstream_timeout: std::time::Duration,
    upstream_idle_timeout: std::time::Duration,
    grace: std::time::Duration,
    part_seconds: std::time::Duration,
    redaction: Redaction,
    tls: Option<tokio_rustls::TlsAcceptor>,
    engine: Engine,
    nofile: u64,
    /// Effective: the flag's value, or the default fitted to the open-file limit.
    max_connections: usize,
    stats_interval: std::time::Duration,
    header_read_timeout: std::time::Duration,
}

fn check_serve(args: &ServeArgs) -> Result<ServeInput, CliError> {
    let upstream = flags::upstream(&args.upstream).map_err(usage)?;
    let upstream_timeout = seconds("--upstream-timeout", args.upstream_timeout)?;
    let upstream_idle_timeout = seconds("--upstream-idle-timeout", args.upstream_idle_timeout)?;
    let grace = seconds("--grace-seconds", args.run.grace_or(SERVE_GRACE_SECONDS))?;
    let part_seconds = seconds("--part-seconds", args.run.part_seconds)?;
    flags::at_least_one("--part-rows", args.run.part_rows).map_err(usage)?;
    let redaction = flags::redaction(&args.redact_header, &args.redact_query).map_err(usage)?;
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(c), Some(k)) => Some(crate::net::tls::server_acceptor(c, k).map_err(usage)?),
        _ => None,
    };
    flags::at_least_one("--max-record-body", args.run.max_record_body).map_err(usage)?;
    // Every flag is checked here, before a socket is bound or --out created, whether or
    // not --quiet makes it unused.
    let stats_interval = seconds("--stats-seconds", args.stats_seconds)?;
    let header_read_timeout = seconds("--header-read-timeout", args.header_read_timeout)?;
    // A CA file is checked even when the upstream is plain http: a wrong path is a
    // mistake now, not when the upstream changes.
    let engine = Engine::new(
        upstream.scheme == Scheme::Https || args.upstream_ca.is_some(),
        &TlsOptions {
            ca_file: args.upstream_ca.clone(),
        },
    )
    .map_err(usage)?;
    if let Some(n) = args.max_connections {
        flags::at_least_one("--max-connections", n).map_err(usage)?;
    }
    // Each client connection may hold an upstream connection too.
    let fds = |conns: usize| (conns as u64) * 2 + 256;
    let wanted = args.max_connections.unwrap_or(DEFAULT_MAX_CONNECTIONS);
    // Where the limit cannot be read or raised, the cap is what was asked for.
    let nofile = rlimit::increase_nofile_limit(fds(wanted)).unwrap_or(u64::MAX);
    let max_connections = match args.max_connections {
        // The default fits itself to the limit, silently.
        None if nofile < fds(wanted) => (nofile.saturating_sub(256) / 2).max(1) as usize,
        None => wanted,
        Some(n) => {
            if nofile < fds(n) && !args.run.quiet {
                eprintln!(
                    "matrix-proxy: warning: the open-file limit is {nofile}, below the {} that --max-connections {n} may need; raise the hard limit (ulimit -Hn) or lower --max-connections",
                    fds(n)
                );
            }
            n
        }
    };
    Ok(ServeInput {
        upstream,
        upstream_timeout,
        upstream_idle_timeout,
        grace,
        part_seconds,
        redaction,
        tls,
        engine,
        nofile,
        max_connections,
        stats_interval,
        header_read_timeout,
    })
}

/// serve's connection cap when --max-connections is not given (and the open-file limit
/// holds it).
const DEFAULT_MAX_CONNECTIONS: usize = 16_384;

/// The `serve` command: until Ctrl-C / SIGTERM, then drain, close the parts, summarise.
pub async fn serve_cmd(args: ServeArgs, interrupt: Arc<AtomicBool>) -> Result<Exit, CliError> {
    use crate::drivers::serve::{self, ServeOptions};
    let _ = tokio::task::spawn_blocking(rundir::binary_sha256).await;
    let input = check_serve(&args)?;
    // The accept queue is as deep as the connections served at once (the kernel caps it
    // at net.core.somaxconn): a burst of new clients waits there instead of having its
    // SYNs dropped.
    let backlog = u32::try_from(input.max_connections).unwrap_or(u32::MAX);
    let listener = crate::net::listener::bind_listener(args.listen, backlog)
        .map_err(|e| usage(format!("--listen {}: cannot bind: {e}", args.listen)))?;
    let listen_addr = listener.local_addr().map_err(|e| tool(e.to_string()))?;
    let metrics_listener = match args.run.metrics_listen {
        Some(a) => Some(metrics_http::bind(a).await?),
        None => None,
    };
    let started_at_us = clock::wall_now_us();
    let out = args.run.out.clone().unwrap_or_else(|| {
        PathBuf::from("runs").join(format!("live-{}", clock::compact_utc(started_at_us)))
    });
    let dir = create_run_dir(&out, args.run.out.is_none())?;
    let rid = run_id(started_at_us);
    let mut rec_opts = RecorderOptions::new(dir.exchanges());
    rec_opts.part_rows = args.run.part_rows;
    rec_opts.part_seconds = input.part_seconds.as_secs_f64();
    rec_opts.queue_rows = args.record_queue.max(1);
    rec_opts.redaction = input.redaction.clone();
    rec_opts.slice = Some(crate::record::SERVE_SLICE);
    let policy = args.upstream_connection;
    let fields = serve_config_fields(
        &args,
        &input,
        (listen_addr, backlog),
        metrics_http::address(metrics_listener.as_ref()),
    );
    let mut config = config_json::config(&argv(&input.redaction), &rid, started_at_us, fields);
    dir.write_json(rundir::CONFIG, &config)
        .map_err(|e| tool(e.to_string()))?;
    let run = Arc::new(
        RunContext::start(&rid, clock::now_ns(), rec_opts).map_err(|e| tool(e.to_string()))?,
    );
    if !args.run.quiet {
        eprintln!(
            "matrix-proxy: serving {}://{} -> {} ({} upstream connections); recording to {}; Ctrl-C to stop",
            if input.tls.is_some() { "https" } else { "http" },
            listen_addr,
            input.redaction.url(&input.upstream.url()),
            args.upstream_connection.serve_name(),
            dir.path.display()
        );
    }
    let opts = ServeOptions {
        upstream: input.upstream,
        policy,
        upstream_timeout: input.upstream_timeout,
        upstream_idle_timeout: input.upstream_idle_timeout,
        max_record_body: args.run.max_record_body,
        record_memory: args.record_memory,
        rewrite_host: args.rewrite_host,
        tls: input.tls,
        on_record_full: args.on_record_full,
        grace: input.grace,
        stats_interval: (!args.run.quiet).then_some(input.stats_interval),
        buffer_frames: 64,
        max_header_bytes: args.max_header_bytes,
        header_read_timeout: input.header_read_timeout,
        max_connections: input.max_connections,
    };
    // Live metrics only when asked for: without them serve counts nothing more.
    let metrics_server = metrics_listener
        .and_then(|l| metrics_http::start(Some(l), &Arc::default(), &run, args.run.quiet));
    let mut stats = serve::run(listener, opts, input.engine, run.clone(), interrupt).await;
    if let Some(m) = metrics_server {
        m.abort();
    }
    let recording = run.finish_recording().await;
    let rows = recording.stats.rows;
    let mut problems: Vec<String> = recording.problems.iter().map(|e| e.to_string()).collect();
    stats.record_error = run.record_error();
    let mut table = report::routes::RouteTable::default();
    let read = crate::record::read::for_each_row(&dir.exchanges(), |r| {
        table.add(&r.method, &r.url, r.status, r.sample)
    });
    if let Err(e) = read {
        problems.push(format!("reading the recorded rows back: {e}"));
    }
    (stats.routes, stats.ok_total) = table.finish();
    // Unknown (null) when the writer failed: its measurement did not come back.
    let slice = recording
        .problems
        .is_empty()
        .then_some(recording.stats.longest_slice_us);
    let summary = report::serve_summary(&stats, rows, slice, None);
    if let Err(e) = dir.write_json(rundir::SUMMARY, &summary) {
        problems.push(e.to_string());
    }
    config_json::finished(&mut config);
    if let Err(e) = dir.write_json(rundir::CONFIG, &config) {
        problems.push(e.to_string());
    }
    serve_stopped(&args, (&stats, &summary), rows, &dir, problems)
}

/// What a stopped serve prints, and its exit: 130 (stopped by a signal) unless writing
/// failed.
fn serve_stopped(
    args: &ServeArgs,
    (stats, summary): (&ServeStats, &report::doc::summary::ServeSummary),
    rows: u64,
    dir: &RunDir,
    mut problems: Vec<String>,
) -> Result<Exit, CliError> {
    if args.run.json
        && let Err(e) = print_json(summary, &dir.path)
    {
        problems.push(e);
    }
    if !args.run.quiet || stats.dropped_rows > 0 {
        eprintln!(
            "matrix-proxy: stopped: {} requests, {} rows written, {} dropped, in {}",
            stats.requests,
            rows,
            stats.dropped_rows,
            dir.path.display()
        );
    }
    if !args.run.quiet && !stats.routes.is_empty() {
        eprintln!(
            "matrix-proxy: by route and worker status class (latency: ok exchanges, nearest rank):"
        );
        for line in report::routes::route_lines(&stats.routes) {
            eprintln!("{line}");
        }
    }
    if !problems.is_empty() {
        return Err(tool(format!(
            "{} (what was written is kept in {})",
            problems.join("; "),
            dir.path.display()
        )));
    }
    Ok(Exit::Interrupted)
}

/// serve's own keys of config.json.
fn serve_config_fields(
    args: &ServeArgs,
    input: &ServeInput,
    (listen_addr, backlog): (SocketAddr, u32),
    metrics_listen: Option<String>,
) -> Fields {
    use report::doc::config::{Limits, ServeFields, ServeRecording};
    let (upstream, redaction) = (&input.upstream, &input.redaction);
    Fields::Serve(Box::new(ServeFields {
        listen: listen_addr.to_string(),
        tls: input.tls.is_some(),
        upstream: redaction.url(&upstream.url()).into_owned(),
        connection_policy: args.upstream_connection.serve_name().into(),
        upstream_timeout_seconds: args.upstream_timeout,
        upstream_idle_timeout_seconds: args.upstream_idle_timeout,
        grace_seconds: args.run.grace_or(SERVE_GRACE_SECONDS),
        runtime_threads: runtime_threads(args.run.threads),
        limits: Limits {
            max_header_bytes: args.max_header_bytes,
            header_read_timeout_seconds: args.header_read_timeout,
            max_connections: input.max_connections,
            listen_backlog: crate::net::listener::effective_backlog(backlog),
            open_file_limit: input.nofile,
        },
        rewrite_host: args.rewrite_host,
        recording: ServeRecording {
            max_record_body_bytes: args.run.max_record_body,
            record_memory_bytes: args.record_memory,
            on_record_full: args.on_record_full.as_str().into(),
            part_rows: args.run.part_rows,
            part_seconds: args.run.part_seconds,
            redacted_headers: redaction
                .headers
                .iter()
                .map(|h| h.as_str().to_string())
                .collect(),
            redacted_query_parameters: redaction.query.clone(),
        },
        metrics_listen,
        timers: config_json::serve_timers(),
    }))
}

/// The `recover` command: quarantine unfinished parts and count the rows they held.
pub fn recover_cmd(dir: &Path) -> Result<Exit, CliError> {
    // A shard's report folder (OUT/shards/I) keeps its ledger; its parts are in
    // OUT/exchanges/shard=I.
    let shard = crate::report::run::shard_parts(dir);
    let exchanges = shard.clone().unwrap_or_else(|| dir.join(rundir::EXCHANGES));
    if !exchanges.is_dir() {
        return Err(usage(format!(
            "{}: no exchanges/ directory; is this a run directory?",
            dir.display()
        )));
    }
    let r = match &shard {
        Some(ex) => {
            crate::record::recover::recover_parts(dir, ex, &dir.join(crate::record::LEDGER))
        }
        None => crate::record::recover::recover(dir),
    }
    .map_err(tool)?;
    let report =
        crate::report::doc::recovery::Recovery::new(&r.quarantined, r.rows_lost, r.rows_kept);
    RunDir::existing(dir)
        .write_json(rundir::RECOVERY, &report)
        .map_err(|e| tool(e.to_string()))?;
    eprintln!(
        "matrix-proxy: {} unfinished part(s) moved to quarantine/; {} rows lost, {} rows kept in closed parts (recovery.json); run `matrix-proxy summarize {}` next",
        r.quarantined.len(),
        r.rows_lost,
        r.rows_kept,
        dir.display()
    );
    Ok(if r.rows_lost > 0 {
        Exit::Failure
    } else {
        Exit::Ok
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_taken_default_run_name_gets_a_suffix_but_an_explicit_one_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("demo-20261129T000000Z");
        assert_eq!(create_run_dir(&out, true).unwrap().path, out);
        let second = create_run_dir(&out, true).unwrap();
        assert_eq!(second.path, tmp.path().join("demo-20261129T000000Z-2"));
        let err = create_run_dir(&out, false).err().unwrap();
        assert_eq!(err.exit, Exit::Usage);
        assert!(err.message.contains("already exists"), "{}", err.message);
    }
}
