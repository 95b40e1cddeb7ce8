//! The command line's shapes (clap): every command, its flags and their defaults, and the
//! mock worker's flags turned into its config. Nothing here reads a file or binds a
//! socket; the commands (`mod.rs`, `replay.rs`, `serve.rs`, ...) act on what was parsed.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use super::io::{CliError, usage};
use crate::config::flags;
use crate::mock::MockConfig;
use crate::model::ConnectionPolicy;

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
        /// Where to write the comparison (refused if it exists). Default: compare.json
        /// in the current folder, or compare-2.json, -3, ... beside the last one: a
        /// comparison is never written over.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
        /// Compare only this arm of run A (a campaign run); with a contract it is the
        /// reference. Default: every available arm, paired with B's by name.
        #[arg(long = "arm-a", value_name = "NAME")]
        arm_a: Option<String>,
        /// Compare only this arm of run B (a campaign run). A plain run is its own side.
        #[arg(long = "arm-b", value_name = "NAME")]
        arm_b: Option<String>,
    },
    /// Turn recorded exchanges (a serve run of live traffic, a replay run of a capture
    /// plan, a campaign arm) into a frozen plan whose oracles are the recorded answers.
    Freeze(FreezeArgs),
    /// Write plans: a capture plan (no oracles) from a prompt dataset or synthetic prompts
    /// of exact token counts (replay it, then `freeze` the run); a campaign plan and its
    /// contract from a frozen plan and the arms' start commands; lock a contract. Sends
    /// nothing.
    #[command(subcommand)]
    Plan(PlanCommand),
}

/// `plan`'s sources of prompts.
#[derive(Subcommand, Debug, Clone)]
pub enum PlanCommand {
    /// One prompt per line of a JSONL file: OpenAI chat (`messages`), completion
    /// (`prompt`), ShareGPT (`conversations`: the first human turn) or raw request bodies
    /// (`request`); with `--turns all`, every turn of each conversation as a session.
    FromJsonl(FromJsonlArgs),
    /// Prompts of an exact token count under a model's tokenizer.json, cut from a corpus
    /// embedded in the binary.
    Synthetic(SyntheticArgs),
    /// A trace plan from a public LLM trace (Mooncake JSONL, Azure or BurstGPT CSV): each
    /// line an entry at its recorded time, its prompt of exactly its input tokens under a
    /// model's tokenizer.json, made of blocks that are equal where the trace's are.
    FromTrace(FromTraceArgs),
    /// A campaign plan from a frozen plan: its cases, budget and metadata, with arms
    /// started by the commands given (`{port}`: a free port the tool chooses; `{self}`:
    /// this binary), and optionally an unlocked version 2 contract for it.
    Campaign(CampaignPlanArgs),
    /// Lock a contract once its thresholds are final: stamp `locked_at` (now, UTC) and
    /// `locked_by` into it (replay and verdict refuse an unlocked contract).
    Lock(LockArgs),
}

/// `plan campaign`'s flags: the frozen plan, the arms, their settings and the files
/// written.
#[derive(Args, Debug, Clone)]
pub struct CampaignPlanArgs {
    /// The frozen plan (`freeze`'s output, or any plain plan): its cases, budget and
    /// metadata become the campaign's.
    #[arg(value_name = "FROZEN")]
    pub plan: PathBuf,
    /// The campaign's name: the plan id its contract names. Default: the frozen plan's
    /// `name`.
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// The reference arm (exactly one, in the quality lane): NAME=COMMAND, the command
    /// split as a shell would, e.g. 'ref=vllm serve ./model --port {port}'.
    #[arg(long, value_name = "NAME=COMMAND", required = true)]
    pub reference: Vec<String>,
    /// An arm compared with the reference (repeatable): NAME=COMMAND in the quality
    /// lane, NAME:fit=COMMAND in the performance-fit lane (NAME:quality=COMMAND too).
    #[arg(long = "arm", value_name = "NAME[:LANE]=COMMAND", required = true)]
    pub arms: Vec<String>,
    /// An environment variable set for every arm's server (KEY=VALUE), or for one arm
    /// (ARM:KEY=VALUE); repeatable. `{port}` is substituted.
    #[arg(long, value_name = "[ARM:]KEY=VALUE")]
    pub env: Vec<String>,
    /// The health check's path on every arm's origin (/v1/models), or on one arm's
    /// (ARM:/v1/models). Default: the frozen plan's health path, else /health.
    #[arg(long, value_name = "[ARM:]PATH")]
    pub health: Vec<String>,
    /// Seconds a started server has to answer its health check, for every arm (300) or
    /// for one (ARM:300). Default: 600.
    #[arg(long, value_name = "[ARM:]SECONDS")]
    pub health_timeout: Vec<String>,
    /// What the numbers are: `measured` (real models; the default) or `synthetic` (mocks
    /// and test servers; the default when every arm is the built-in mock).
    #[arg(long, value_enum)]
    pub evidence_class: Option<EvidenceArg>,
    /// The order arms run in: interleaved (one at a time, in rotation) or sequential (each
    /// arm start to stop, then the next: arms that cannot share one GPU).
    #[arg(long, value_enum, default_value_t = ScheduleArg::Interleaved)]
    pub schedule: ScheduleArg,
    /// Measured rounds per (case, level) and arm; at least 2, and 5 for the intervals a
    /// version 2 contract's ratio gates read.
    #[arg(long, value_name = "N", default_value_t = 5)]
    pub repetitions: usize,
    /// Where to write the campaign plan (refused if it exists). Default: stdout.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Also write a version 2 contract for the plan, every threshold at its default and
    /// unlocked: edit it, then `matrix-proxy plan lock FILE --by NAME` (refused if it
    /// exists).
    #[arg(long, value_name = "FILE")]
    pub contract_out: Option<PathBuf>,
}

/// `plan lock`'s flags.
#[derive(Args, Debug, Clone)]
pub struct LockArgs {
    /// The contract (contract.json), rewritten in place with `locked_at` and `locked_by`.
    #[arg(value_name = "CONTRACT")]
    pub contract: PathBuf,
    /// Who fixes the thresholds (a name or a team), recorded as `locked_by`.
    #[arg(long, value_name = "NAME")]
    pub by: String,
}

/// A campaign's evidence class on the command line.
#[derive(clap::ValueEnum, Debug, Clone, Copy)]
pub enum EvidenceArg {
    Measured,
    Synthetic,
}

/// A campaign's schedule on the command line.
#[derive(clap::ValueEnum, Debug, Clone, Copy)]
pub enum ScheduleArg {
    Interleaved,
    Sequential,
}

#[derive(Args, Debug, Clone)]
pub struct FromJsonlArgs {
    /// The dataset: one JSON object per line.
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// The lines' format. Default: detected from the first good line.
    #[arg(long, value_enum)]
    pub format: Option<DatasetFormat>,
    /// Take this many prompts: the first ones, or a seeded sample with --seed.
    #[arg(long, value_name = "N")]
    pub limit: Option<u64>,
    /// Seed of the sample (ChaCha8: the same prompts on every platform).
    #[arg(long, value_name = "S", requires = "limit")]
    pub seed: Option<u64>,
    /// A top-level integer field of each line that becomes its max_tokens (over
    /// --max-tokens).
    #[arg(long, value_name = "FIELD")]
    pub output_len_from: Option<String>,
    /// Count and skip bad lines instead of refusing the file.
    #[arg(long)]
    pub skip_bad: bool,
    /// A tokenizer.json to count each completion prompt's tokens with (recorded in the
    /// plan as the variant's prompt_tokens).
    #[arg(long, value_name = "FILE")]
    pub tokenizer: Option<PathBuf>,
    /// How much of each chat or ShareGPT conversation is read: `first` (one request a
    /// line) or `all` (every turn: each conversation a session, each user message a turn
    /// and the assistant message after it its answer).
    #[arg(long, value_enum, default_value_t = TurnsArg::First)]
    pub turns: TurnsArg,
    /// With --turns all: keep each conversation's first N turns.
    #[arg(long, value_name = "N")]
    pub max_turns: Option<usize>,
    /// With --turns all: the plan's history mode (default frozen: each turn is sent with
    /// the transcript's answers; live: with the server's own).
    #[arg(long, value_enum)]
    pub history: Option<HistoryArg>,
    #[command(flatten)]
    pub out: PlanOutArgs,
}

/// How much of a conversation `plan from-jsonl` reads.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum TurnsArg {
    First,
    All,
}

/// A session plan's history mode on the command line.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum HistoryArg {
    Frozen,
    Live,
}

#[derive(Args, Debug, Clone)]
pub struct SyntheticArgs {
    /// The model's tokenizer.json (a local file; nothing is downloaded).
    #[arg(long, value_name = "FILE")]
    pub tokenizer: PathBuf,
    /// Input tokens of each prompt, special tokens included (exact); with --turns, of
    /// each session's first turn (default: --turn-input-tokens).
    #[arg(long, value_name = "N", required_unless_present = "turn_input_tokens")]
    pub input_tokens: Option<u64>,
    /// Sessions of N chat turns instead of single prompts (--count sessions).
    #[arg(long, value_name = "N")]
    pub turns: Option<usize>,
    /// With --turns: input tokens of each turn's user text after the first (exact, as
    /// --input-tokens counts them; default: --input-tokens).
    #[arg(long, value_name = "M", requires = "turns")]
    pub turn_input_tokens: Option<u64>,
    /// With --turns: the plan's history mode (default frozen: each turn but the last gets
    /// an answer of --output-tokens tokens, sent in the later turns; live: the server's).
    #[arg(long, value_enum, requires = "turns")]
    pub history: Option<HistoryArg>,
    /// Spread of the input lengths (normal, seeded); 0: every prompt is exactly
    /// --input-tokens.
    #[arg(long, value_name = "TOKENS", default_value_t = 0.0)]
    pub input_stddev: f64,
    /// Output tokens asked for (max_tokens).
    #[arg(long, value_name = "N")]
    pub output_tokens: u64,
    /// How many prompts.
    #[arg(long, value_name = "N")]
    pub count: u64,
    /// Seed of the offsets, lengths and tags (ChaCha8).
    #[arg(long, value_name = "S", default_value_t = 0)]
    pub seed: u64,
    /// Every prompt of a group starts with the same this many tokens (prefix-cache
    /// studies).
    #[arg(long, value_name = "P", default_value_t = 0)]
    pub shared_prefix_tokens: u64,
    /// Groups of prompts sharing a prefix (prompt i is in group i mod G).
    #[arg(
        long,
        value_name = "G",
        default_value_t = 1,
        requires = "shared_prefix_tokens"
    )]
    pub prefix_groups: u64,
    /// Start every prompt with its own seeded tag, so no two share a cached prefix.
    #[arg(long, conflicts_with = "shared_prefix_tokens")]
    pub cache_bust: bool,
    /// Add `"ignore_eos": true` (vLLM, SGLang: generate all --output-tokens).
    #[arg(long)]
    pub ignore_eos: bool,
    /// Add `"min_tokens"` = --output-tokens (vLLM, SGLang).
    #[arg(long)]
    pub min_tokens: bool,
    /// The API the prompts are written for. Default: the one --endpoint's path names
    /// (`.../chat/completions`: chat, `.../completions`: completions), else completions.
    #[arg(long, value_enum)]
    pub api: Option<PromptApi>,
    #[command(flatten)]
    pub out: PlanOutArgs,
}

/// `plan from-trace`'s flags.
#[derive(Args, Debug, Clone)]
pub struct FromTraceArgs {
    /// The trace: Mooncake JSONL, or an Azure or BurstGPT CSV with its header row.
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// The trace's format.
    #[arg(long, value_enum)]
    pub format: TraceFormat,
    /// The model's tokenizer.json (a local file; nothing is downloaded).
    #[arg(long, value_name = "FILE")]
    pub tokenizer: PathBuf,
    /// Tokens per prompt block: equal block ids give equal blocks (Mooncake's hash_ids
    /// are of 512-token blocks).
    #[arg(long, value_name = "N", default_value_t = 512)]
    pub block_tokens: u32,
    /// Keep the entries from START to END seconds after the first line (END left out:
    /// to the end), their offsets rebased to START.
    #[arg(long, value_name = "START:END")]
    pub window: Option<String>,
    /// Keep the first N entries (of the window).
    #[arg(long, value_name = "N")]
    pub limit: Option<u64>,
    /// The plan's load.speedup: 2 sends every entry at half its offset.
    #[arg(long, value_name = "X", default_value_t = 1.0)]
    pub speedup: f64,
    /// Seed of the prompts' words and of the sample of prompts checked (ChaCha8).
    #[arg(long, value_name = "S", default_value_t = 0)]
    pub seed: u64,
    /// Sort the kept window by time (held in memory) instead of refusing a file out of
    /// time order.
    #[arg(long)]
    pub sort: bool,
    /// Keep failed requests (0 output tokens) as entries asking for 1 output token,
    /// instead of skipping them.
    #[arg(long)]
    pub keep_failed: bool,
    /// Whole prompts re-encoded under the tokenizer: a seeded sample of 1,000, or all
    /// (every distinct block is re-encoded either way).
    #[arg(long, value_enum, default_value_t = TraceVerify::Sample)]
    pub verify: TraceVerify,
    /// Add `"ignore_eos": true` (vLLM, SGLang: generate all the entry's output tokens).
    #[arg(long)]
    pub ignore_eos: bool,
    /// Add `"min_tokens"` = the entry's output tokens (vLLM, SGLang).
    #[arg(long)]
    pub min_tokens: bool,
    /// The API the prompts are written for. Default: the one --endpoint's path names,
    /// else completions (a chat template adds tokens the tokenizer cannot count).
    #[arg(long, value_enum)]
    pub api: Option<PromptApi>,
    /// The worker: an origin (the API's path is added) or a full URL.
    #[arg(long, value_name = "URL")]
    pub endpoint: String,
    /// The model every request names.
    #[arg(long, value_name = "NAME")]
    pub model: Option<String>,
    /// Ask for event streams (with stream_options.include_usage).
    #[arg(long)]
    pub stream: bool,
    /// Sampling temperature of every request.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f64,
    /// A JSON object of provenance (the plan's metadata).
    #[arg(long, value_name = "FILE")]
    pub metadata: Option<PathBuf>,
    /// Bound on each whole exchange, in seconds.
    #[arg(long, default_value_t = 600.0)]
    pub timeout_seconds: f64,
    /// Times the whole trace is replayed.
    #[arg(long, default_value_t = 1)]
    pub repetitions: usize,
    /// Requests in flight at most (the next send waits).
    #[arg(long, value_name = "N", default_value_t = 1024)]
    pub max_in_flight: usize,
    /// The plan's connection policy.
    #[arg(long, value_enum, default_value_t = PlanConnection::KeepAlive)]
    pub connection: PlanConnection,
    /// Where to write the plan (refused if it exists); the trace file goes beside it as
    /// `<PLAN stem>.trace.jsonl` (refused if it exists).
    #[arg(long, value_name = "PLAN")]
    pub out: PathBuf,
}

/// A public trace's format on the command line.
#[derive(clap::ValueEnum, Debug, Clone, Copy)]
pub enum TraceFormat {
    Mooncake,
    Azure,
    Burstgpt,
}

impl TraceFormat {
    pub fn name(self) -> &'static str {
        match self {
            TraceFormat::Mooncake => "mooncake",
            TraceFormat::Azure => "azure",
            TraceFormat::Burstgpt => "burstgpt",
        }
    }
}

/// Which whole prompts `plan from-trace` re-encodes.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceVerify {
    Sample,
    All,
}

/// What both `plan` sources share: where the requests go, what they ask, the budget and
/// the file written.
#[derive(Args, Debug, Clone)]
pub struct PlanOutArgs {
    /// The worker: an origin (the API's path is added) or a full URL.
    #[arg(long, value_name = "URL")]
    pub endpoint: String,
    /// The model every request names.
    #[arg(long, value_name = "NAME")]
    pub model: Option<String>,
    /// max_tokens of every request (plan from-jsonl; plan synthetic asks for
    /// --output-tokens instead).
    #[arg(long, value_name = "N")]
    pub max_tokens: Option<u64>,
    /// Ask for event streams (with stream_options.include_usage).
    #[arg(long)]
    pub stream: bool,
    /// Sampling temperature of every request (0: greedy, so answers can be frozen).
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f64,
    /// Where to write the plan (refused if it exists). Default: stdout.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// A JSON object of provenance (the plan's metadata).
    #[arg(long, value_name = "FILE")]
    pub metadata: Option<PathBuf>,
    /// Concurrency levels.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    pub concurrency: Vec<usize>,
    /// Requests per case and level. Default: the number of prompts (each round sends
    /// every prompt once), or its smallest multiple at least the highest concurrency.
    #[arg(long)]
    pub requests_per_case: Option<usize>,
    /// Measured rounds per level; at least 2.
    #[arg(long, default_value_t = 2)]
    pub repetitions: usize,
    /// Warm-up requests per prompt; at least 2.
    #[arg(long, default_value_t = 2)]
    pub warmup_per_case: usize,
    /// Bound on each whole exchange, in seconds.
    #[arg(long, default_value_t = 600.0)]
    pub timeout_seconds: f64,
    /// The plan's connection policy.
    #[arg(long, value_enum, default_value_t = PlanConnection::KeepAlive)]
    pub connection: PlanConnection,
}

/// A dataset's line format on the command line.
#[derive(clap::ValueEnum, Debug, Clone, Copy)]
pub enum DatasetFormat {
    Chat,
    Completion,
    Sharegpt,
    Request,
}

/// The API synthetic prompts are written for.
#[derive(clap::ValueEnum, Debug, Clone, Copy)]
pub enum PromptApi {
    Completions,
    Chat,
}

/// `freeze`'s flags: the runs, what to take from them, and the plan's starting budget.
#[derive(Args, Debug, Clone)]
pub struct FreezeArgs {
    /// Run directories (serve, replay or campaign runs); repeated answers across them are
    /// the evidence for ignore paths.
    #[arg(required = true, value_name = "RUN")]
    pub runs: Vec<PathBuf>,
    /// Where to write the plan (refused if it exists). Default: stdout.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// A campaign run's arm whose answers are frozen. Default: the reference.
    #[arg(long, value_name = "NAME")]
    pub arm: Option<String>,
    /// The plan's endpoint. Default: serve's --upstream, or the replay run's endpoint.
    #[arg(long, value_name = "URL")]
    pub endpoint: Option<String>,
    /// The plan's `name` (the plan id a contract names; `plan campaign` takes it).
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// The plan's `on_failure`: stop dispatch at the first failure (the default when
    /// not given) or record failures and run the whole budget.
    #[arg(long, value_enum, value_name = "POLICY")]
    pub on_failure: Option<PlanOnFailure>,
    /// Environment variable replay reads a bearer token from; required when the captured
    /// requests carried an Authorization header (the plan records only the name).
    #[arg(long, value_name = "NAME")]
    pub bearer_token_env: Option<String>,
    /// A JSON object of provenance (the plan's `metadata`); required keys it lacks are
    /// written as "unknown: not recorded by the capture".
    #[arg(long, value_name = "FILE")]
    pub metadata: Option<PathBuf>,
    /// Concurrency levels of the plan.
    /// Write a trace plan (load.mode "trace"): one entry per frozen exchange at its
    /// recorded start, so a replay sends them at the times they arrived (one RUN; more
    /// than 10,000 entries go to OUT's stem + `.trace.jsonl` beside it).
    #[arg(long, conflicts_with_all = ["concurrency", "requests_per_case", "warmup_per_case"])]
    pub keep_timing: bool,
    /// Each request's oracle: its recorded answer (exact), the contract it declares
    /// (schema: its response_format's JSON Schema, or its tools when it called one), or
    /// (auto) the contract where its repeats differed and the exact answer elsewhere.
    #[arg(long, value_enum, value_name = "KIND", default_value = "auto")]
    pub oracle: FreezeOracle,
    #[arg(long, value_delimiter = ',', default_value = "1,4")]
    pub concurrency: Vec<usize>,
    /// Requests per case and level. Default: the smallest multiple of the variant count
    /// at least the highest concurrency, so every measured round sends every variant.
    #[arg(long)]
    pub requests_per_case: Option<usize>,
    /// Measured rounds per (case, level); at least 2.
    #[arg(long, default_value_t = 2)]
    pub repetitions: usize,
    /// Warm-up requests per variant; at least 2.
    #[arg(long, default_value_t = 2)]
    pub warmup_per_case: usize,
    /// Bound on each whole exchange, in seconds.
    #[arg(long, default_value_t = 60.0)]
    pub timeout_seconds: f64,
    /// The plan's connection policy.
    #[arg(long, value_enum, default_value_t = PlanConnection::KeepAlive)]
    pub connection: PlanConnection,
}

/// A plan's `connection` on the command line.
#[derive(clap::ValueEnum, Debug, Clone, Copy)]
pub enum PlanConnection {
    KeepAlive,
    Fresh,
}

/// `freeze --oracle`.
#[derive(clap::ValueEnum, Debug, Clone, Copy)]
pub enum FreezeOracle {
    Exact,
    Schema,
    Auto,
}

/// A plan's `on_failure` on the command line.
#[derive(clap::ValueEnum, Debug, Clone, Copy)]
pub enum PlanOnFailure {
    Stop,
    Continue,
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
    /// Bytes of response bodies queued for slow clients at once, across all connections,
    /// past 16 KiB each (each connection also holds at most 64 pieces and 1 MiB); past it, relays read
    /// their workers only as their clients take what is queued. Default: an eighth of the
    /// memory this process may use, at most 1 GiB.
    #[arg(long, value_name = "BYTES")]
    pub relay_memory: Option<usize>,
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
    /// When the recorder fails (a full disk, an I/O error): forward nothing more and stop
    /// (`stop`: new requests get 503, exit 3) or keep forwarding, counting every
    /// unrecorded exchange (`forward`).
    #[arg(long, value_enum, default_value_t = OnRecordFail::Stop)]
    pub on_record_fail: OnRecordFail,
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
    pub scrape: ScrapeArgs,
    #[command(flatten)]
    pub run: RunFlags,
}

/// The worker's own metrics and the GPU's, on the run's timeline (replay and serve).
#[derive(Args, Debug, Clone)]
pub struct ScrapeArgs {
    /// Scrape the worker's own Prometheus metrics (vLLM, SGLang, TGI) into
    /// worker_metrics.parquet: every --scrape-interval, and just before and after each
    /// measured round (serve: at its start and its end), on connections of their own.
    /// Without a URL: /metrics on the worker's origin (replay: the plan's endpoint or the
    /// mock's under --mock-worker; serve: --upstream). The URL goes after `=`:
    /// --worker-metrics=http://127.0.0.1:8000/metrics. A failed scrape is counted, never
    /// fatal; after 3 answers of 404 or 410 in a row the worker is not scraped again.
    #[arg(
        long,
        value_name = "URL",
        num_args = 0..=1,
        default_missing_value = "",
        require_equals = true
    )]
    pub worker_metrics: Option<String>,
    /// Seconds between two scrapes of the worker's metrics (at least 0.05; default 1).
    #[arg(long, value_name = "SECONDS")]
    pub scrape_interval: Option<f64>,
    /// Seconds one scrape may take (default 2); a slower one is counted as failed.
    #[arg(long, value_name = "SECONDS")]
    pub scrape_timeout: Option<f64>,
    /// GPU telemetry beside the worker's metrics, into gpu.parquet at the same interval:
    /// `auto` (default) runs `nvidia-smi --query-gpu` when it is on PATH (no GPU: said
    /// once), `off` runs nothing, a URL scrapes a DCGM exporter's /metrics instead.
    #[arg(long, value_name = "auto|off|URL")]
    pub gpu_metrics: Option<String>,
}

pub use crate::drivers::serve::{OnRecordFail, OnRecordFull};

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

impl clap::ValueEnum for OnRecordFail {
    fn value_variants<'a>() -> &'a [Self] {
        &[OnRecordFail::Stop, OnRecordFail::Forward]
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        let help = match self {
            OnRecordFail::Stop => {
                "Forward nothing more: new requests get 503 naming the failure, exchanges in flight finish, serve stops with exit 3"
            }
            OnRecordFail::Forward => {
                "Keep forwarding; every exchange that could not be recorded is counted (summary.json, /metrics)"
            }
        };
        Some(clap::builder::PossibleValue::new(self.as_str()).help(help))
    }
}

#[derive(Args, Debug, Clone)]
pub struct ReplayArgs {
    /// The plan (JSON, schema v1).
    pub plan: PathBuf,
    #[command(flatten)]
    pub scrape: ScrapeArgs,
    /// Replace the plan's endpoint (origin and path) and its health endpoint's origin; a URL
    /// with no path at all (http://host:8000, not even /) replaces only the origin of
    /// every endpoint and keeps the plan's paths.
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
    #[command(flatten)]
    pub search: super::search::SearchArgs,
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
    /// With --mock-worker: the mock's prefix cache, in blocks of 16 prompt tokens (LRU;
    /// 0, the default: none). Its answers then report usage.prompt_tokens_details.cached_tokens.
    #[arg(
        long = "mock-prefix-cache-blocks",
        value_name = "N",
        requires = "mock_worker"
    )]
    pub prefix_cache_blocks: Option<usize>,
    /// With --mock-worker: the mock's prefill time per prompt token its prefix cache does
    /// not hold (ms; default 0: the prefill is --mock-prefill-ms whatever the prompt).
    #[arg(
        long = "mock-prefill-per-token-ms",
        value_name = "MS",
        requires = "mock_worker"
    )]
    pub prefill_per_token_ms: Option<f64>,
    /// With --mock-worker: break the tool calls of this share of the prompts that declare
    /// tools (0 to 1): their arguments leave out a required property.
    #[arg(
        long = "mock-invalid-tool-call-share",
        value_name = "SHARE",
        requires = "mock_worker"
    )]
    pub invalid_tool_call_share: Option<f64>,
}

impl MockLatencyArgs {
    /// The mock's configuration: its defaults, with what these flags set, checked.
    pub(crate) fn config(&self) -> Result<MockConfig, CliError> {
        let mut c = MockConfig {
            log_requests: false,
            ..MockConfig::default()
        };
        if let Some(v) = self.prefill_ms {
            c.prefill_ms = flags::milliseconds("--mock-prefill-ms", v).map_err(usage)?;
        }
        if let Some(v) = self.per_token_ms {
            c.per_token_ms = flags::milliseconds("--mock-per-token-ms", v).map_err(usage)?;
        }
        if let Some(v) = self.max_batch {
            c.max_batch = flags::at_least_one("--mock-max-batch", v).map_err(usage)?;
        }
        if let Some(v) = self.prefix_cache_blocks {
            c.prefix_cache_blocks = v;
        }
        if let Some(v) = self.prefill_per_token_ms {
            c.prefill_per_token_ms =
                flags::milliseconds("--mock-prefill-per-token-ms", v).map_err(usage)?;
        }
        if let Some(v) = self.invalid_tool_call_share {
            c.invalid_tool_call_share = share("--mock-invalid-tool-call-share", v)?;
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
    /// Answer this share of prompts (0 to 1; which ones follows --text-seed) with other
    /// text on every request, as a batched server's greedy answers differ run to run.
    #[arg(long, default_value_t = 0.0)]
    pub nondeterministic_share: f64,
    /// Break the tool calls of this share of the prompts that declare tools (0 to 1;
    /// which ones follows --text-seed): their arguments leave out a required property,
    /// as a server with broken tool-call output answers.
    #[arg(long, value_name = "SHARE", default_value_t = 0.0)]
    pub invalid_tool_call_share: f64,
    /// Stream the first N tokens (at least 1) at the usual pace, then every later token
    /// at once, in one write (a buffered server: its decode time at the boundary is a
    /// flush).
    #[arg(long, value_name = "N")]
    pub burst_after_first: Option<u32>,
    /// Keep a prefix cache of N blocks of 16 prompt tokens (LRU; 0: none): a prompt's
    /// cached tokens are not prefilled again, and answers report
    /// usage.prompt_tokens_details.cached_tokens.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub prefix_cache_blocks: usize,
    /// Prefill time per prompt token the prefix cache does not hold (ms; 0: the prefill
    /// is --prefill-ms whatever the prompt).
    #[arg(long, value_name = "MS", default_value_t = 0.0)]
    pub prefill_per_token_ms: f64,
}

impl MockArgs {
    /// The mock's configuration, checked (exit 2 on a negative or non-finite time, or a
    /// batch of 0).
    pub fn config(&self) -> Result<MockConfig, CliError> {
        Ok(MockConfig {
            prefill_ms: flags::milliseconds("--prefill-ms", self.prefill_ms).map_err(usage)?,
            prefill_per_token_ms: flags::milliseconds(
                "--prefill-per-token-ms",
                self.prefill_per_token_ms,
            )
            .map_err(usage)?,
            prefix_cache_blocks: self.prefix_cache_blocks,
            per_token_ms: flags::milliseconds("--per-token-ms", self.per_token_ms)
                .map_err(usage)?,
            max_batch: flags::at_least_one("--max-batch", self.max_batch).map_err(usage)?,
            default_max_tokens: self.max_tokens,
            stall_ms: self.stall_ms,
            text_seed: self.text_seed,
            nondeterministic_share: share("--nondeterministic-share", self.nondeterministic_share)?,
            invalid_tool_call_share: share(
                "--invalid-tool-call-share",
                self.invalid_tool_call_share,
            )?,
            burst_after_first: self.burst_after_first,
            log_requests: false,
        })
    }
}

/// A share flag's value: from 0 to 1.
fn share(flag: &str, v: f64) -> Result<f64, CliError> {
    if (0.0..=1.0).contains(&v) {
        Ok(v)
    } else {
        Err(usage(format!("{flag} must be from 0 to 1, got {v}")))
    }
}

/// `--listen HOST:PORT`: an address, or a name resolved now (`localhost:9101`); the
/// first address it resolves to is used.
pub(super) fn listen_address(s: &str) -> Result<SocketAddr, String> {
    use std::net::ToSocketAddrs;
    if let Ok(a) = s.parse() {
        return Ok(a);
    }
    s.to_socket_addrs()
        .map_err(|e| format!("'{s}' is not HOST:PORT that resolves ({e})"))?
        .next()
        .ok_or_else(|| format!("'{s}' resolves to no address"))
}
