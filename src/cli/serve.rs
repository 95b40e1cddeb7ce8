//! The `serve` command: flags checked against each other (`check_serve`), the listener
//! bound and the input resolved (`resolve`), the run handed to `run::serve` until Ctrl-C /
//! SIGTERM, and what it returns printed and mapped onto an exit code.

use crate::drivers::shutdown::Shutdown;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use super::args::{SERVE_GRACE_SECONDS, ServeArgs};
use super::io::{
    CliError, Exit, argv, print_json, run_error, runtime_threads, seconds, tool, usage,
};
use crate::clock;
use crate::config::flags;
use crate::drivers::serve::ServeOptions;
use crate::engine::Engine;
use crate::model::{Endpoint, Scheme};
use crate::net::tls::TlsOptions;
use crate::record::rundir;
use crate::redact::Redaction;
use crate::report::doc::config::Fields;
use crate::report::{self, config_json};
use crate::run::serve::{ServeEnd, ServeInput, ServeOutput, ServeRecording};

/// Every flag of `serve` checked, and the TLS and engine set-ups built, before anything
/// is bound or created.
struct Checked {
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
    scrape: Option<crate::run::scrape::ScrapeSpec>,
    /// `--relay-memory`, or its default for this machine; at least one.
    relay_memory: usize,
}

fn check_serve(args: &ServeArgs) -> Result<Checked, CliError> {
    let upstream = flags::upstream(&args.upstream).map_err(usage)?;
    let upstream_timeout = seconds("--upstream-timeout", args.upstream_timeout)?;
    let upstream_idle_timeout = seconds("--upstream-idle-timeout", args.upstream_idle_timeout)?;
    let grace = seconds("--grace-seconds", args.run.grace_or(SERVE_GRACE_SECONDS))?;
    let part_seconds = seconds("--part-seconds", args.run.part_seconds)?;
    flags::at_least_one("--part-rows", args.run.part_rows).map_err(usage)?;
    let redaction = flags::redaction(&args.redact_header, &args.redact_query).map_err(usage)?;
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(c), Some(k)) => {
            Some(crate::net::tls::server_acceptor(c, k).map_err(|e| usage(e.to_string()))?)
        }
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
    .map_err(|e| usage(e.to_string()))?;
    if let Some(n) = args.max_connections {
        flags::at_least_one("--max-connections", n).map_err(usage)?;
    }
    let scrape = match super::scrape::scrape_flags(&args.scrape, super::scrape::FromPlan::None)? {
        Some(f) => Some(super::scrape::spec(f, &upstream, args.upstream_ca.clone())?),
        None => None,
    };
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
    Ok(Checked {
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
        scrape,
        relay_memory: args
            .relay_memory
            .unwrap_or_else(crate::record::default_hold_bytes)
            .max(1),
    })
}

/// serve's connection cap when --max-connections is not given (and the open-file limit
/// holds it).
const DEFAULT_MAX_CONNECTIONS: usize = 16_384;

/// The `serve` command: until Ctrl-C / SIGTERM, then drain, close the parts, summarise.
pub async fn serve_cmd(args: ServeArgs, interrupt: Arc<Shutdown>) -> Result<Exit, CliError> {
    let _ = tokio::task::spawn_blocking(rundir::binary_sha256).await;
    let checked = check_serve(&args)?;
    super::io::without_huge_pages();
    let input = resolve(&args, checked).await?;
    let end = crate::run::serve::run(input, interrupt)
        .await
        .map_err(run_error)?;
    serve_stopped(&args, end)
}

/// The listeners bound and every value the run needs laid out: serve's complete input.
async fn resolve(args: &ServeArgs, input: Checked) -> Result<ServeInput, CliError> {
    // The accept queue is as deep as the connections served at once (the kernel caps it
    // at net.core.somaxconn): a burst of new clients waits there instead of having its
    // SYNs dropped.
    let backlog = u32::try_from(input.max_connections).unwrap_or(u32::MAX);
    let listener = crate::net::listener::bind_listener(args.listen, backlog)
        .map_err(|e| usage(format!("--listen {}: cannot bind: {e}", args.listen)))?;
    let listen_addr = listener.local_addr().map_err(|e| tool(e.to_string()))?;
    let metrics = match args.run.metrics_listen {
        Some(a) => Some(crate::run::metrics_http::bind(a).await.map_err(run_error)?),
        None => None,
    };
    let started_at_us = clock::wall_now_us();
    let out = args.run.out.clone().unwrap_or_else(|| {
        PathBuf::from("runs").join(format!("live-{}", clock::compact_utc(started_at_us)))
    });
    let fields = serve_config_fields(
        args,
        &input,
        listen_addr,
        backlog,
        crate::run::metrics_http::address(metrics.as_ref()),
    );
    Ok(ServeInput {
        listener,
        listen_addr,
        metrics,
        fields,
        argv: argv(&input.redaction),
        started_at_us,
        policy_name: args.upstream_connection.serve_name(),
        output: ServeOutput {
            out,
            default_name: args.run.out.is_none(),
            quiet: args.run.quiet,
        },
        recording: ServeRecording {
            part_rows: args.run.part_rows,
            part_seconds: input.part_seconds.as_secs_f64(),
            queue_rows: args.record_queue.max(1),
            redaction: input.redaction.clone(),
        },
        opts: ServeOptions {
            upstream: input.upstream,
            policy: args.upstream_connection,
            upstream_timeout: input.upstream_timeout,
            upstream_idle_timeout: input.upstream_idle_timeout,
            max_record_body: args.run.max_record_body,
            record_memory: args.record_memory,
            rewrite_host: args.rewrite_host,
            tls: input.tls,
            on_record_full: args.on_record_full,
            on_record_fail: args.on_record_fail,
            grace: input.grace,
            stats_interval: (!args.run.quiet).then_some(input.stats_interval),
            buffer_frames: 64,
            relay_memory: input.relay_memory,
            max_header_bytes: args.max_header_bytes,
            header_read_timeout: input.header_read_timeout,
            max_connections: input.max_connections,
        },
        engine: input.engine,
        scrape: input.scrape,
    })
}

/// What a stopped serve prints, and its exit: 130 (stopped by a signal) unless writing
/// failed.
fn serve_stopped(args: &ServeArgs, end: ServeEnd) -> Result<Exit, CliError> {
    let ServeEnd {
        stats,
        summary,
        rows,
        dir,
        mut problems,
    } = end;
    if args.run.json
        && let Err(e) = print_json(&summary, &dir)
    {
        problems.push(e);
    }
    let unrecorded = stats.unrecorded;
    if !args.run.quiet || stats.dropped_rows > 0 || unrecorded > 0 {
        eprintln!(
            "matrix-proxy: stopped: {} forwarded, {} recorded, {} unrecorded, {} dropped (--on-record-full drop), {} refused unforwarded, in {}",
            stats.requests,
            rows,
            unrecorded,
            stats.dropped_rows,
            stats.refused.values().sum::<u64>(),
            dir.display()
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
        return Err(run_error(crate::run::RunError::Problems { problems, dir }));
    }
    Ok(Exit::Interrupted)
}

/// serve's own keys of config.json.
fn serve_config_fields(
    args: &ServeArgs,
    input: &Checked,
    listen_addr: SocketAddr,
    backlog: u32,
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
            relay_memory_bytes: input.relay_memory,
            on_record_full: args.on_record_full.as_str().into(),
            on_record_fail: args.on_record_fail.as_str().into(),
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
