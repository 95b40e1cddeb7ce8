//! What every command shares with the outside world: the error a command ends with and its
//! exit code (and how a run's end and errors map onto it), the command line as typed
//! (redacted), files read with a size bound (the plan, the bearer token), stdout written
//! (the table, `--json`), and the process's runtime size and memory pages. Imports nothing
//! else from `cli/`.

use std::path::Path;

use crate::config::flags;
use crate::config::plan::Plan;
use crate::record::rundir;
use crate::redact::Redaction;
use crate::report::error::ReportError;
use crate::run::{RunEnd, RunError};

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

/// An error and the exit code it maps to.
#[derive(Debug)]
pub struct CliError {
    pub exit: Exit,
    pub message: String,
}

pub(super) fn usage(message: impl Into<String>) -> CliError {
    CliError {
        exit: Exit::Usage,
        message: message.into(),
    }
}

pub(super) fn tool(message: impl Into<String>) -> CliError {
    CliError {
        exit: Exit::Tool,
        message: message.into(),
    }
}

/// The command line as given (set by [`super::main_with_args`]; empty when a command is called
/// as a library function). Only [`argv`] hands it out, redacted.
pub(super) static ARGV: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();

/// The command line as config.json records it: the values of the query parameters `r`
/// redacts (the defaults, and serve's `--redact-query` names) are `<redacted>` in every
/// URL (`--endpoint URL`, `--upstream=URL`). Credentials in URLs and bearer tokens never
/// appear on a valid command line (refused, or named by variable).
pub(super) fn argv(r: &Redaction) -> Vec<String> {
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

/// Threads of the async runtime: `--threads`, else the cores in the process's affinity.
pub(crate) fn runtime_threads(flag: Option<usize>) -> usize {
    flag.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// A report's error as the command line says it: a run or a file that cannot be used is
/// unusable input (exit 2); rows that cannot be read back are the tool's (exit 3).
pub(super) fn report_error(e: ReportError) -> CliError {
    match e {
        ReportError::Rows(e) => tool(e.to_string()),
        ReportError::Unfinished(m) => tool(m),
        other => usage(other.to_string()),
    }
}

/// A run's error as the command line says it, with the same message: unusable input
/// (exit 2) when the input or a finished run cannot be used, else the tool's (exit 3).
pub(super) fn run_error(e: RunError) -> CliError {
    match e {
        RunError::Usage(m) => usage(m),
        RunError::Report(e) => report_error(e),
        e @ (RunError::RunDir(_)
        | RunError::Record(_)
        | RunError::Tool(_)
        | RunError::Evidence(_)
        | RunError::Problems { .. }) => tool(e.to_string()),
    }
}

/// The exit code of how a run ended.
pub(super) fn exit_of(end: RunEnd) -> Exit {
    match end {
        RunEnd::Passed => Exit::Ok,
        RunEnd::Failed => Exit::Failure,
        RunEnd::Interrupted => Exit::Interrupted,
    }
}

pub(super) fn load_plan(path: &Path) -> Result<(Vec<u8>, Plan), CliError> {
    crate::run::open::load_plan(path).map_err(report_error)
}

/// Read a bearer token from the named environment variable and check it.
pub(super) fn read_token(name: &str, source: &str) -> Result<String, CliError> {
    flags::bearer_token(name, source, std::env::var_os(name).as_deref()).map_err(usage)
}

/// Write `text` to stdout. A closed or full stdout (`> /dev/full`, a pipe whose reader
/// left) is an error naming where the files are (exit 3), never a panic.
pub(super) fn print_stdout(text: &str, what: &str, dir: &Path) -> Result<(), String> {
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

/// `--json`: `v` on stdout exactly as `RunDir::write_json` writes it to summary.json.
pub(super) fn print_json<T: serde::Serialize>(v: &T, dir: &Path) -> Result<(), String> {
    let text = String::from_utf8_lossy(&rundir::json_bytes(v)).into_owned();
    print_stdout(&text, "the summary", dir)
}

pub(super) fn seconds(flag: &str, v: f64) -> Result<std::time::Duration, CliError> {
    flags::seconds(flag, v).map_err(usage)
}

/// Transparent huge pages off for this process (serve, and replay of a plan without
/// arms). A round's held rows and serve's steady churn grow the heap a little at a time;
/// with mimalloc's `MADV_HUGEPAGE` arenas each first touch faults in and zeroes a whole
/// 2 MiB page on the runtime thread, mid-round. Measured on the benchmark machine (replay,
/// c = 64, 100,000 held rows a round, six runs each): the first measured round ran at
/// 49-62k req/s with them and 62-98k without (`clear_page_erms` was a quarter of the
/// profile). Redis and other latency-bound servers ask for THP off for the same reason.
/// The flag is the process's and its children inherit it, so a campaign (which starts its
/// arms' servers) keeps the system's setting; `MIMALLOC_ALLOW_THP` in the environment is
/// the user's choice and wins.
pub(crate) fn without_huge_pages() {
    #[cfg(target_os = "linux")]
    if std::env::var_os("MIMALLOC_ALLOW_THP").is_none() {
        // Best effort: a kernel without the prctl keeps its pages as they are.
        let _ = rustix::thread::disable_transparent_huge_pages(true);
    }
}

/// Write `bytes` to `out` (given with `flag`), which must not exist: whole or not at all
/// (a temporary file beside it, linked to its name only once written and synced, so a
/// full disk or a Ctrl-C never leaves half a file, and a file made meanwhile is never
/// replaced).
pub(crate) fn write_new(flag: &str, out: &Path, bytes: &[u8]) -> Result<(), CliError> {
    let name = out
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "plan.json".into());
    let tmp = out.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    let written = std::fs::File::create(&tmp).and_then(|mut f| {
        std::io::Write::write_all(&mut f, bytes)?;
        f.sync_all()
    });
    let linked = written.and_then(|()| std::fs::hard_link(&tmp, out));
    let _ = std::fs::remove_file(&tmp);
    linked.map_err(|e| match e.kind() {
        std::io::ErrorKind::AlreadyExists => usage(format!(
            "{flag} {}: exists (made meanwhile); it is never replaced",
            out.display()
        )),
        std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied => {
            usage(format!("{flag} {}: {e}", out.display()))
        }
        _ => tool(format!("{flag} {}: {e}", out.display())),
    })
}

/// Open files a run needs besides its connections: standard streams, the runtime's
/// epoll and wakers, the recorder's part and ledger, the TLS roots, DNS.
pub(super) const RESERVED_FDS: u64 = 64;
