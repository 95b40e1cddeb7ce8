//! matrix-proxy: a recording reverse proxy and frozen-plan replayer for model servers.
//!
//! One exchange engine (`engine`) and two drivers (`drivers::replay`, frozen plans in a
//! closed or open loop; `drivers::serve`, live traffic), both handing finished exchanges to the
//! recorder (`record`), which writes Parquet off the async runtime. Folders are layers:
//! docs/architecture.md is the map, and `tests/layering.rs` fails on an import against it.
//!
//! The public surface is what the binary, `tests/`, `benchmarks/` and `fuzz/` use, named
//! below; everything else is crate-private.
#![forbid(unsafe_code)]

mod budget;
mod clock;
mod config;
mod dataset;
mod drift;
mod drivers;
mod engine;
mod freeze;
mod metrics;
mod mock;
mod model;
mod net;
mod oracle;
mod prom;
mod record;
mod redact;
mod report;
mod run;
mod search;
mod sse;
mod stats;
mod telemetry;

/// Seeded open-loop arrival schedules (the offsets a plan's `load` sends at; docs/load.md
/// gives each round's stream, so a schedule can be recomputed outside a run).
pub mod arrival;
/// Measurement hooks the benchmarks call (`benchmarks/judge.rs`): an oracle's judgment of
/// many answers, timed in process CPU.
pub mod bench;
/// The command line: argument shapes, the commands, exit codes (the binary is a call of
/// [`cli::main_with_args`]; tests run commands in-process as a user runs them).
pub mod cli;
/// Fuzz entry points with their properties (driven by `fuzz/`, replayed by the tests).
pub mod fuzzing;

/// The monotonic clock every duration is measured on (nanoseconds; never 0).
pub use clock::now_ns;
/// A run's stop request (what Ctrl-C asks for), for running a command in-process.
pub use drivers::shutdown::Shutdown;
/// The built-in OpenAI-compatible mock worker, its latency model, its deterministic text.
pub use mock::{MockConfig, MockWorker, generate_text};
/// The shared vocabulary of a recorded row: its phase, its outcome, its timing columns.
pub use model::{Outcome, Phase, Timings};
/// SHA-256 as lower-case hex, as config.json records the plan's hash.
pub use record::rundir::sha256_hex;
/// The recorder, for writing exchange rows without a driver (`benchmarks/writer.rs`), and
/// the name of its ledger file in `exchanges/` (which readers skip).
pub use record::{ExchangeRecord, LEDGER, Recorder, RecorderOptions, WireHead};
