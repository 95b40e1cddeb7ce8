//! The command line: argument shapes (clap), reading files and the environment, binding
//! sockets, each command's arguments resolved into a run's complete input (run by `run`),
//! and the mapping of every ending (`run::RunEnd`, `run::RunError`) onto an exit code. It
//! prints the table (stdout) and what a command answers (stderr); `run` and the drivers
//! print only their progress (replay's banner and bar and failure lines, serve's live
//! counters, the scrapes' and the GPU's notes).

use crate::drivers::shutdown::Shutdown;
use std::ffi::OsString;
use std::path::Path;
use std::sync::Arc;

use clap::Parser;

mod args;
mod campaign;
mod freeze;
mod io;
mod plan_campaign;
mod plan_cmd;
mod plan_out;
mod recover;
mod replay;
mod report_cmd;
mod scrape;
mod search;
mod serve;
mod summarize;

pub use args::{
    Cli, Command, FreezeArgs, LaneArg, MockArgs, MockLatencyArgs, OnRecordFail, OnRecordFull,
    PlanConnection, ReplayArgs, RunFlags, ServeArgs, UpstreamConnection,
};
use campaign::verdict_cmd;
use campaign::{CompareArgs, compare_cmd};
pub use freeze::freeze_cmd;
use io::{ARGV, load_plan, print_stdout, runtime_threads, tool, usage};
pub use io::{CliError, Exit};
pub use plan_cmd::plan_cmd;
pub use recover::recover_cmd;
pub use replay::replay_cmd;
pub use report_cmd::report_cmd;
pub use serve::serve_cmd;
pub use summarize::summarize_cmd;

use crate::config::shape::Shape;
use crate::mock::MockWorker;
use crate::report::config_json;

/// `--worker-metrics URL`, with a space: clap reads the URL as another argument and says
/// only "unexpected argument" (or takes it for the plan). The `=` is on purpose (the flag
/// alone scrapes the worker's own origin, so it never takes the plan for its URL): say
/// where the URL goes. Only a next argument holding `://` is taken for a URL, and nothing
/// after `--`.
fn worker_metrics_spaced(args: &[OsString]) -> Option<String> {
    let args: Vec<_> = args
        .iter()
        .map(|a| a.to_string_lossy())
        .take_while(|a| a != "--")
        .collect();
    args.windows(2).find_map(|w| {
        let url = &w[1];
        (w[0] == "--worker-metrics" && url.contains("://")).then(|| {
            format!(
                "--worker-metrics takes its URL after '=', with no space: --worker-metrics={url} (the flag alone scrapes /metrics on the worker's own origin, so with a space '{url}' is read as another argument)"
            )
        })
    })
}

/// Parse args and run; returns the process exit code.
pub fn main_with_args(args: Vec<OsString>) -> i32 {
    let _ = ARGV.set(
        args.iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect(),
    );
    if let Some(message) = worker_metrics_spaced(&args) {
        eprintln!("matrix-proxy: error: {message}");
        return Exit::Usage as i32;
    }
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
        Command::Freeze(args) => freeze_cmd(&args),
        Command::Plan(cmd) => plan_cmd(&cmd),
        Command::Verdict { dir, contract, out } => verdict_cmd(&dir, &contract, out.as_deref()),
        Command::Compare {
            run_a,
            run_b,
            contract,
            lane,
            out,
            arm_a,
            arm_b,
        } => compare_cmd(&CompareArgs {
            a: &run_a,
            b: &run_b,
            contract: contract.as_deref(),
            lane: match lane {
                LaneArg::Quality => crate::config::campaign::Lane::Quality,
                LaneArg::PerformanceFit => crate::config::campaign::Lane::PerformanceFit,
            },
            out: out.as_deref(),
            arms: (arm_a.as_deref(), arm_b.as_deref()),
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
    F: FnOnce(Arc<Shutdown>) -> Fut,
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
        let interrupt = Arc::new(Shutdown::default());
        spawn_signal_watcher(interrupt.clone(), stopping);
        f(interrupt).await
    })
}

/// Ctrl-C or SIGTERM request `flag`; a second one exits at once with 130.
fn spawn_signal_watcher(flag: Arc<Shutdown>, stopping: &'static str) {
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
            if flag.request() {
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

/// `validate`'s line for a capture plan, so no one mistakes its run for a correctness run.
fn capture_line(plan: &crate::config::plan::Plan) {
    if plan.is_capture() {
        eprintln!(
            "  capture plan: answers are recorded, not judged (no case has an oracle); `matrix-proxy freeze RUN --out plan.json` turns a run of it into a plan with oracles"
        );
        return;
    }
    // How many requests each kind of oracle judges (contracts compiled already).
    let mut kinds: std::collections::BTreeMap<&str, usize> = Default::default();
    for v in plan.cases.iter().flat_map(|c| &c.variants) {
        *kinds.entry(v.oracle.kind()).or_default() += 1;
    }
    kinds.remove("none");
    if kinds
        .keys()
        .any(|k| ["schema", "tool_calls", "choice", "pattern"].contains(k))
    {
        let each: Vec<String> = kinds.iter().map(|(k, n)| format!("{n} {k}")).collect();
        eprintln!("  oracles by kind (requests): {}", each.join(", "));
    }
}

/// `validate`'s words for a trace: its length, entry count, mean and peak rates, and what
/// a round sends of it (the window, the warm-up, the speed-up).
fn trace_line(t: &crate::config::load::TraceLoad) -> String {
    let Some(trace) = &t.entries else {
        return "a trace not read".into();
    };
    let s = trace.stats();
    let mean = s
        .mean_rate_per_second
        .map_or("n/a".into(), |r| format!("{r:.2}/s"));
    let picks = t.picks(None);
    let warm = picks.iter().filter(|p| p.warmup).count();
    let span = t.span_us() as f64 / 1e6;
    let requests: u64 = picks.iter().map(|p| t.requests_of(p.entry)).sum();
    let runs = if trace.runs.is_empty() {
        String::new()
    } else {
        format!("; {requests} requests, every turn of the session runs they start")
    };
    format!(
        "trace of {} entries over {:.3} s (mean {mean}, peak {}/s in one second); a round sends {} of them ({} as warm-up{runs}) over {span:.3} s at speedup {} (level {}/s)",
        s.entries,
        s.length_seconds,
        s.peak_rate_per_second,
        picks.len(),
        warm,
        t.speedup,
        t.rate()
    )
}

/// `validate`'s line per case with sessions: how many, their turns, the history mode.
fn sessions_lines(plan: &crate::config::plan::Plan) {
    for c in &plan.cases {
        let Some(s) = &c.sessions else { continue };
        eprintln!(
            "  case '{}': {} session(s), {} turn(s) (at most {} in one), {} history{}; {}",
            c.name,
            s.list.len(),
            s.turns(),
            s.max_turns(),
            s.history.as_str(),
            s.header
                .as_ref()
                .map(|h| format!(", each session's id in {h}"))
                .unwrap_or_default(),
            if plan.load.mode == crate::config::load::Mode::Open {
                "each arrival starts a session (dispatch i runs session i mod sessions)".to_string()
            } else if plan.load.mode == crate::config::load::Mode::Trace {
                "an entry naming a session's turn 1 starts a run of it; one naming a later turn gives that turn's offset".to_string()
            } else {
                format!(
                    "a round runs {} session(s) ({} requests)",
                    plan.requests_per_case,
                    c.requests_of(plan.requests_per_case)
                )
            },
        );
    }
}

pub fn validate(path: &Path) -> Result<Exit, CliError> {
    let (_, plan) = load_plan(path)?;
    let variants: usize = plan.cases.iter().map(|c| c.variants.len()).sum();
    if let Some(t) = &plan.load.trace {
        eprintln!(
            "{}: valid plan: {} case(s), {} variant(s), {}, {} repetition(s), {} planned requests, {} connections",
            path.display(),
            plan.cases.len(),
            variants,
            trace_line(t),
            plan.repetitions,
            Shape::Plain.planned_requests(&plan),
            plan.connection.as_str()
        );
        capture_line(&plan);
        sessions_lines(&plan);
        return Ok(Exit::Ok);
    }
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
        capture_line(&plan);
        sessions_lines(&plan);
        for w in plan.unmeasured_variants() {
            eprintln!("  {w}");
        }
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
    capture_line(&plan);
    sessions_lines(&plan);
    crate::run::replay::say_unmeasured(&plan, "  ");
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

pub async fn mock_cmd(args: MockArgs, interrupt: Arc<Shutdown>) -> Result<Exit, CliError> {
    let m = MockWorker::start(args.listen, args.config()?)
        .await
        .map_err(|e| usage(format!("--listen {}: cannot bind: {e}", args.listen)))?;
    eprintln!(
        "matrix-proxy: mock worker listening on {} (POST /v1/chat/completions, POST /v1/completions, GET /health, GET /v1/models); Ctrl-C to stop",
        m.url()
    );
    interrupt.requested().await;
    m.shutdown().await;
    Ok(Exit::Interrupted)
}
