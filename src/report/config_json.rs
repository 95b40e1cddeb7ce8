//! config.json ([`Config`]), built in one place for both commands: the keys every run has
//! (identity of the tool and the host, start and end in UTC, the schema version, the
//! clock), then the command's own keys, which end with `timers`, what each timing column
//! measures.

use super::doc::config::{
    Budget, Command, Config, ContractRecord, Extra, Fields, Host, ReplayFields, ShardRecord,
    Timers, Tool,
};
use crate::clock;
use crate::config::plan::Plan;
use crate::config::shape::Shape;
use crate::record::SCHEMA_VERSION;
use crate::record::rundir;

/// The clock statement of every run.
const CLOCK: &str =
    "durations: one monotonic clock (std::time::Instant); started_at: wall clock, UTC";

/// A run's config.json (with `finished_at` null until [`finished`] sets it): the common
/// keys, then the command's own `fields` (which end with `timers`).
pub(crate) fn config(argv: &[String], run_id: &str, started_at_us: i64, fields: Fields) -> Config {
    Config {
        run_id: run_id.into(),
        command: match fields {
            Fields::Replay(_) => Command::Replay,
            Fields::Serve(_) => Command::Serve,
        },
        argv: argv.to_vec(),
        tool: Tool {
            name: "matrix-proxy".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            binary_sha256: rundir::binary_sha256(),
        },
        started_at: clock::iso_utc(started_at_us),
        finished_at: None,
        host: host_identity(),
        schema_version: SCHEMA_VERSION.into(),
        clock: CLOCK.into(),
        fields,
    }
}

/// A URL as config.json records it: values of secret query parameters `<redacted>`.
pub(crate) fn redacted(url: &str) -> String {
    crate::redact::Redaction::default().url(url).into_owned()
}

/// The host's identity, as config.json records it.
fn host_identity() -> Host {
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .ok()
            .map(|s| s.trim().to_string())
    };
    Host {
        hostname: read("/proc/sys/kernel/hostname").or_else(|| std::env::var("HOSTNAME").ok()),
        os: std::env::consts::OS.into(),
        os_release: read("/proc/sys/kernel/osrelease"),
        arch: std::env::consts::ARCH.into(),
        cpu_count: std::thread::available_parallelism().map(|n| n.get()).ok(),
    }
}

/// Mark the run as finished now.
pub(crate) fn finished(config: &mut Config) {
    config.finished_at = Some(clock::iso_utc(clock::wall_now_us()));
}

/// What replay's flags and checks add to the plan's own keys.
pub(crate) struct ReplayKeys<'a> {
    /// What the flags made of the plan (`--sweep`, `--shard`).
    pub(crate) shape: Shape,
    /// `--search`'s settings.
    pub(crate) search: Option<crate::report::doc::config::SearchRecord>,
    pub(crate) plan_path: &'a str,
    pub(crate) plan_sha256: &'a str,
    pub(crate) run_t0_ns: u64,
    pub(crate) extra: Extra,
    pub(crate) contract: Option<ContractRecord>,
    pub(crate) shard: Option<ShardRecord>,
}

/// config.json's `endpoint` and `health_endpoint` of a campaign run.
pub(crate) const PER_ARM: &str = "per arm (see campaign.json's arms)";

/// replay's own keys: the plan, its effective budget and policies, the flags' `extra`,
/// the contract and the shard.
pub(crate) fn replay_fields(plan: &Plan, k: ReplayKeys<'_>) -> Fields {
    Fields::Replay(Box::new(ReplayFields {
        plan_path: k.plan_path.into(),
        plan_sha256: k.plan_sha256.into(),
        workload_sha256: workload_sha256(plan),
        // A campaign's endpoints are its arms' (campaign.json lists each with its port),
        // not the stand-in the plan carries until an arm starts.
        endpoint: match &plan.campaign {
            Some(_) => PER_ARM.into(),
            None => redacted(&plan.endpoint.url()),
        },
        health_endpoint: match &plan.campaign {
            Some(_) => PER_ARM.into(),
            None => redacted(&plan.health_endpoint.url()),
        },
        effective_budget: Budget {
            requests_per_case: plan.requests_per_case,
            concurrency: plan.concurrency.clone(),
            repetitions: plan.repetitions,
            warmup_per_case: plan.warmup_per_case,
            timeout_seconds: plan.timeout_seconds,
            planned_requests: k.shape.planned_requests(plan),
            load: plan.load.to_json(),
            slo: plan.slo.as_ref().map(crate::config::load::slo_json),
            sweep: k.shape.sweep_rates(),
            search: k.search,
        },
        connection_policy: plan.connection.as_str().into(),
        on_failure: plan.on_failure.as_str().into(),
        monotonic_start_ns: k.run_t0_ns,
        extra: k.extra,
        timers: replay_timers(),
        contract: k.contract,
        shard: k.shard,
    }))
}

/// The plan's workload hash: SHA-256 (hex) of its canonical workload's compact
/// serialisation (see `config::workload`).
pub(crate) fn workload_sha256(plan: &Plan) -> String {
    rundir::sha256_hex(plan.workload.to_string().as_bytes())
}

/// What each timing column of a replay measures.
fn replay_timers() -> Timers {
    Timers {
        t0: "the worker starts the exchange, before it connects or reuses a connection".into(),
        connect_us: "TCP connected (includes name resolution); null on a reused connection".into(),
        tls_us: "TLS handshake done; null for plain HTTP or a reused connection".into(),
        request_sent_us: "last request byte written to the connection".into(),
        first_byte_us: "first response byte read from the connection".into(),
        first_body_us: "first response body byte received".into(),
        total_us: "last response body byte received (for failures: when the failure was detected); oracle validation excluded".into(),
        downstream_done_us: None,
    }
}

/// What each timing column of serve measures.
pub(crate) fn serve_timers() -> Timers {
    Timers {
        t0: "the client's request head has been parsed".into(),
        connect_us: "upstream TCP connected; null on a reused upstream connection".into(),
        tls_us: "upstream TLS handshake done; null for plain HTTP or reuse".into(),
        request_sent_us: "last request byte written upstream before the response head".into(),
        first_byte_us: "first response byte read from the upstream".into(),
        first_body_us: "first response body byte from the upstream".into(),
        total_us: "last response body byte from the upstream (for failures: when detected)".into(),
        downstream_done_us: Some("last response byte handed to the client connection".into()),
    }
}
