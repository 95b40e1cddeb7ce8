//! Input, raw to validated: frozen plans (`plan`; two-stage: raw JSON walked by a
//! validator into a [`plan::Plan`] that cannot represent an invalid plan), their
//! canonical `workload`, the `load` (closed or open loop) and `slo`, the run's `shape` (what `--sweep` and `--shard` make of a plan, beside it), campaigns' arms (`campaign`) and pre-registered `contract`s, and the
//! commands' flag values (`flags`). `config` validates the bytes and values it is handed;
//! the CLI reads files and environment variables and binds sockets. Nothing here opens a
//! file or a socket, and nothing after validation re-checks.

pub(crate) mod campaign;
mod cases;
pub(crate) use json::ENGINE_HEADERS;
pub(crate) mod contract;
mod contract_spec;
pub(crate) mod flags;
pub(crate) mod json;
pub(crate) mod load;
mod oracle_spec;
pub(crate) mod plan;
pub(crate) mod search;
mod session_walk;
pub(crate) mod sessions;
pub(crate) mod shape;
pub(crate) mod trace;
mod trace_load;
pub(crate) mod trace_text;
mod walk;
pub(crate) use walk::{REQUIRED_METADATA, trace_names};
pub(crate) mod workload;
