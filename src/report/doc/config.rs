//! `config.json`: the keys every run has (identity of the tool and the host, start and end
//! in UTC, the schema version, the clock), then the command's own ([`ReplayFields`] or
//! [`ServeFields`]), each ending with `timers`, what each timing column measures.

use serde::{Deserialize, Serialize};

/// A run's config.json. Read by its `command`: the rest of the keys are that command's
/// (read leniently: a key a file was written without reads as its default).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(try_from = "RawConfig")]
pub(crate) struct Config {
    pub(crate) run_id: String,
    pub(crate) command: Command,
    pub(crate) argv: Vec<String>,
    pub(crate) tool: Tool,
    pub(crate) started_at: String,
    /// `null` until the run has finished (a crashed run keeps `null`).
    pub(crate) finished_at: Option<String>,
    pub(crate) host: Host,
    pub(crate) schema_version: String,
    pub(crate) clock: String,
    #[serde(flatten)]
    pub(crate) fields: Fields,
}

/// The command that made the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Command {
    Replay,
    Serve,
}

/// The command's own keys.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub(crate) enum Fields {
    Replay(Box<ReplayFields>),
    Serve(Box<ServeFields>),
}

/// config.json as read: the common keys, and the command's as they come.
#[derive(Deserialize)]
struct RawConfig {
    run_id: String,
    command: Command,
    #[serde(default)]
    argv: Vec<String>,
    #[serde(default)]
    tool: Tool,
    started_at: String,
    #[serde(default)]
    finished_at: Option<String>,
    #[serde(default)]
    host: Host,
    #[serde(default)]
    schema_version: String,
    #[serde(default)]
    clock: String,
    #[serde(flatten)]
    rest: serde_json::Map<String, serde_json::Value>,
}

/// Why config.json's command-specific keys are not what that command writes.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConfigKeysError {
    #[error("replay's keys: {0}")]
    Replay(#[source] serde_json::Error),
    #[error("serve's keys: {0}")]
    Serve(#[source] serde_json::Error),
}

impl TryFrom<RawConfig> for Config {
    type Error = ConfigKeysError;

    fn try_from(r: RawConfig) -> Result<Config, ConfigKeysError> {
        let rest = serde_json::Value::Object(r.rest);
        let fields = match r.command {
            Command::Replay => Fields::Replay(Box::new(
                serde_json::from_value(rest).map_err(ConfigKeysError::Replay)?,
            )),
            Command::Serve => Fields::Serve(Box::new(
                serde_json::from_value(rest).map_err(ConfigKeysError::Serve)?,
            )),
        };
        Ok(Config {
            run_id: r.run_id,
            command: r.command,
            argv: r.argv,
            tool: r.tool,
            started_at: r.started_at,
            finished_at: r.finished_at,
            host: r.host,
            schema_version: r.schema_version,
            clock: r.clock,
            fields,
        })
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct Tool {
    pub(crate) name: String,
    pub(crate) version: String,
    pub(crate) binary_sha256: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct Host {
    pub(crate) hostname: Option<String>,
    pub(crate) os: String,
    pub(crate) os_release: Option<String>,
    pub(crate) arch: String,
    pub(crate) cpu_count: Option<usize>,
}

/// replay's keys: the plan, its effective budget and policies, what the flags set, and
/// the contract and shard it was started with.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct ReplayFields {
    pub(crate) plan_path: String,
    pub(crate) plan_sha256: String,
    pub(crate) workload_sha256: String,
    pub(crate) endpoint: String,
    pub(crate) health_endpoint: String,
    pub(crate) effective_budget: Budget,
    pub(crate) connection_policy: String,
    pub(crate) on_failure: String,
    pub(crate) monotonic_start_ns: u64,
    pub(crate) extra: Extra,
    pub(crate) timers: Timers,
    pub(crate) contract: Option<ContractRecord>,
    pub(crate) shard: Option<ShardRecord>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct Budget {
    pub(crate) requests_per_case: usize,
    pub(crate) concurrency: Vec<usize>,
    pub(crate) repetitions: usize,
    pub(crate) warmup_per_case: usize,
    pub(crate) timeout_seconds: f64,
    pub(crate) planned_requests: u64,
    /// The plan's `load` section as validated (the input's own shape, echoed).
    pub(crate) load: serde_json::Value,
    /// The plan's `slo` as validated (the input's own shape, echoed).
    pub(crate) slo: Option<serde_json::Value>,
    pub(crate) sweep: Option<usize>,
    /// `--search` and its settings (search.json holds its probes).
    pub(crate) search: Option<SearchRecord>,
}

/// config.json's record of `replay --search`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct SearchRecord {
    /// `rate` or `concurrency`.
    pub(crate) kind: String,
    pub(crate) slo: String,
    pub(crate) confidence: f64,
    pub(crate) margin: f64,
    pub(crate) good_share_min: Option<f64>,
    pub(crate) budget_seconds: Option<f64>,
    /// The first probe's load and the highest a probe may ask for.
    pub(crate) from: f64,
    pub(crate) ceiling: f64,
}

/// What replay's flags set beside the plan.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct Extra {
    pub(crate) endpoint_override: Option<String>,
    pub(crate) grace_seconds: f64,
    pub(crate) mock_worker: Option<MockRecord>,
    pub(crate) runtime_threads: usize,
    pub(crate) metrics_listen: Option<String>,
    pub(crate) auth: Auth,
    pub(crate) recording: ReplayRecording,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct MockRecord {
    pub(crate) url: String,
    pub(crate) prefill_ms: f64,
    pub(crate) per_token_ms: f64,
    pub(crate) max_batch: usize,
    pub(crate) default_max_tokens: u32,
    /// Only when set (`--mock-prefill-per-token-ms`).
    #[serde(default, skip_serializing_if = "is_zero_f64")]
    pub(crate) prefill_per_token_ms: f64,
    /// Only when the mock kept a prefix cache (`--mock-prefix-cache-blocks`).
    #[serde(default, skip_serializing_if = "is_zero_usize")]
    pub(crate) prefix_cache_blocks: usize,
    /// Only when set (`--mock-invalid-tool-call-share`).
    #[serde(default, skip_serializing_if = "is_zero_f64")]
    pub(crate) invalid_tool_call_share: f64,
}

fn is_zero_f64(v: &f64) -> bool {
    *v == 0.0
}

fn is_zero_usize(v: &usize) -> bool {
    *v == 0
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct Auth {
    pub(crate) bearer_token_env: Option<String>,
    pub(crate) bearer_token_sent: bool,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct ReplayRecording {
    /// false under `--no-record`.
    pub(crate) exchanges: bool,
    pub(crate) max_record_body_bytes: usize,
    pub(crate) record_hold_bytes: usize,
    pub(crate) redacted_headers: Vec<String>,
    pub(crate) redacted_query_parameters: Vec<String>,
}

/// The contract a campaign run was started with.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ContractRecord {
    pub(crate) path: String,
    pub(crate) sha256: String,
    pub(crate) plan_id: String,
    pub(crate) locked_at: String,
    pub(crate) locked_by: String,
}

/// A shard's place in a sharded run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ShardRecord {
    pub(crate) index: usize,
    pub(crate) count: usize,
    pub(crate) start_at: String,
    /// The shared start on this process's run clock (µs from its t0; negative when it
    /// was already past).
    pub(crate) start_at_offset_us: i64,
}

/// serve's keys.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct ServeFields {
    pub(crate) listen: String,
    pub(crate) tls: bool,
    pub(crate) upstream: String,
    pub(crate) connection_policy: String,
    pub(crate) upstream_timeout_seconds: f64,
    pub(crate) upstream_idle_timeout_seconds: f64,
    pub(crate) grace_seconds: f64,
    pub(crate) runtime_threads: usize,
    pub(crate) limits: Limits,
    pub(crate) rewrite_host: bool,
    pub(crate) recording: ServeRecording,
    pub(crate) metrics_listen: Option<String>,
    pub(crate) timers: Timers,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct Limits {
    pub(crate) max_header_bytes: usize,
    pub(crate) header_read_timeout_seconds: f64,
    pub(crate) max_connections: usize,
    pub(crate) listen_backlog: Option<u32>,
    pub(crate) open_file_limit: u64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct ServeRecording {
    pub(crate) max_record_body_bytes: usize,
    pub(crate) record_memory_bytes: usize,
    /// Bytes of response bodies queued for clients at once (`--relay-memory`; 0 in runs
    /// before the flag).
    pub(crate) relay_memory_bytes: usize,
    pub(crate) on_record_full: String,
    /// `stop` or `forward` (runs before the flag have none).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub(crate) on_record_fail: String,
    pub(crate) part_rows: usize,
    pub(crate) part_seconds: f64,
    pub(crate) redacted_headers: Vec<String>,
    pub(crate) redacted_query_parameters: Vec<String>,
}

/// What each timing column measures (serve has `downstream_done_us` too).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct Timers {
    pub(crate) t0: String,
    pub(crate) connect_us: String,
    pub(crate) tls_us: String,
    pub(crate) request_sent_us: String,
    pub(crate) first_byte_us: String,
    pub(crate) first_body_us: String,
    pub(crate) total_us: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) downstream_done_us: Option<String>,
}

impl Command {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Command::Replay => "replay",
            Command::Serve => "serve",
        }
    }
}

impl Config {
    pub(crate) fn replay(&self) -> Option<&ReplayFields> {
        match &self.fields {
            Fields::Replay(r) => Some(r),
            Fields::Serve(_) => None,
        }
    }

    pub(crate) fn serve(&self) -> Option<&ServeFields> {
        match &self.fields {
            Fields::Serve(s) => Some(s),
            Fields::Replay(_) => None,
        }
    }

    /// A shard's record, for one shard's own folder.
    pub(crate) fn shard(&self) -> Option<&ShardRecord> {
        self.replay().and_then(|r| r.shard.as_ref())
    }

    /// Whether the run recorded its exchanges (false under `--no-record`).
    pub(crate) fn records_exchanges(&self) -> bool {
        self.replay().is_none_or(|r| r.extra.recording.exchanges)
    }
}
