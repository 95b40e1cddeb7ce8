//! matrix-proxy: a recording reverse proxy and frozen-plan replayer for model servers.
//!
//! One exchange engine (`engine`) and two drivers: `replay` (frozen plans, closed loop)
//! and, later, `serve` (live traffic). Both hand finished exchanges to the `record`er,
//! which writes Parquet off the async runtime. See docs/architecture.md for the map.
#![forbid(unsafe_code)]

pub mod cli;
pub mod clock;
pub mod engine;
pub mod fuzzing;
pub mod metrics;
pub mod mock;
pub mod oracle;
pub mod plan;
pub mod record;
pub mod replay;
pub mod rundir;
pub mod serve;
pub mod sse;
pub mod summary;
