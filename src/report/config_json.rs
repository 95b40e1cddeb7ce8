//! config.json, built in one place for both commands: the keys every run has (identity of
//! the tool and the host, start and end in UTC, the schema version, the clock), then the
//! command's own keys, and last `timers`, what each timing column measures.

use serde_json::{Map, Value, json};

use crate::clock;
use crate::config::plan::Plan;
use crate::record::SCHEMA_VERSION;
use crate::record::rundir;

/// The clock statement of every run.
const CLOCK: &str =
    "durations: one monotonic clock (std::time::Instant); started_at: wall clock, UTC";

/// A run's config.json (with `finished_at` null until [`finished`] sets it): the common
/// keys, `fields` (an object: the command's own keys) and `timers` (what each timing
/// column measures, which depends on the command).
pub(crate) fn config_json(
    command: &str,
    argv: &[String],
    run_id: &str,
    started_at_us: i64,
    fields: Value,
    timers: Value,
) -> Value {
    let mut m = Map::new();
    m.insert("run_id".into(), json!(run_id));
    m.insert("command".into(), json!(command));
    m.insert("argv".into(), json!(argv));
    m.insert(
        "tool".into(),
        json!({
            "name": "matrix-proxy",
            "version": env!("CARGO_PKG_VERSION"),
            "binary_sha256": rundir::binary_sha256(),
        }),
    );
    m.insert("started_at".into(), json!(clock::iso_utc(started_at_us)));
    m.insert("finished_at".into(), Value::Null);
    m.insert("host".into(), rundir::host_identity());
    m.insert("schema_version".into(), json!(SCHEMA_VERSION));
    m.insert("clock".into(), json!(CLOCK));
    if let Value::Object(f) = fields {
        m.extend(f);
    }
    m.insert("timers".into(), timers);
    Value::Object(m)
}

/// A URL as config.json records it: values of secret query parameters `<redacted>`.
pub(crate) fn redacted(url: &str) -> String {
    crate::redact::Redaction::default().url(url).into_owned()
}

/// Mark the run as finished now.
pub(crate) fn finished(config: &mut Value) {
    config["finished_at"] = json!(clock::iso_utc(clock::wall_now_us()));
}

/// replay's own keys: the plan, its effective budget and policies, and `extra` (overrides,
/// the mock worker, auth and recording settings).
pub(crate) fn replay_fields(
    plan: &Plan,
    plan_path: &str,
    plan_sha256: &str,
    run_t0_ns: u64,
    extra: Value,
) -> Value {
    json!({
        "plan_path": plan_path,
        "plan_sha256": plan_sha256,
        "workload_sha256": workload_sha256(plan),
        "endpoint": redacted(&plan.endpoint.url()),
        "health_endpoint": redacted(&plan.health_endpoint.url()),
        "effective_budget": {
            "requests_per_case": plan.requests_per_case,
            "concurrency": plan.concurrency,
            "repetitions": plan.repetitions,
            "warmup_per_case": plan.warmup_per_case,
            "timeout_seconds": plan.timeout_seconds,
            "planned_requests": plan.planned_requests(),
            "load": plan.load.to_json(),
            "slo": plan.slo.as_ref().map(crate::config::load::slo_json),
            "sweep": plan.sweep,
        },
        "connection_policy": plan.connection.as_str(),
        "on_failure": plan.on_failure.as_str(),
        "monotonic_start_ns": run_t0_ns,
        "extra": extra,
    })
}

/// The plan's workload hash: SHA-256 (hex) of its canonical workload's compact
/// serialisation (see `config::workload`).
pub(crate) fn workload_sha256(plan: &Plan) -> String {
    rundir::sha256_hex(plan.workload.to_string().as_bytes())
}

/// What each timing column of a replay measures.
pub(crate) fn replay_timers() -> Value {
    json!({
        "t0": "the worker starts the exchange, before it connects or reuses a connection",
        "connect_us": "TCP connected (includes name resolution); null on a reused connection",
        "tls_us": "TLS handshake done; null for plain HTTP or a reused connection",
        "request_sent_us": "last request byte written to the connection",
        "first_byte_us": "first response byte read from the connection",
        "first_body_us": "first response body byte received",
        "total_us": "last response body byte received (for failures: when the failure was detected); oracle validation excluded",
    })
}

/// What each timing column of serve measures.
pub(crate) fn serve_timers() -> Value {
    json!({
        "t0": "the client's request head has been parsed",
        "connect_us": "upstream TCP connected; null on a reused upstream connection",
        "tls_us": "upstream TLS handshake done; null for plain HTTP or reuse",
        "request_sent_us": "last request byte written upstream before the response head",
        "first_byte_us": "first response byte read from the upstream",
        "first_body_us": "first response body byte from the upstream",
        "total_us": "last response body byte from the upstream (for failures: when detected)",
        "downstream_done_us": "last response byte handed to the client connection",
    })
}
