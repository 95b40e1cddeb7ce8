//! The replay driver: runs a frozen plan's phases through the engine, closed loop.
//!
//! Phases, in order: `health` (one GET), `readiness` (one request per variant, sequential),
//! `warmup` (`warmup_per_case` per variant, sequential), then for each case and each
//! concurrency c: `feasibility` (one excluded wave of min(c, n)) and `repetitions` rounds
//! of `measured` (n requests, c workers, closed loop). Each worker owns its connection; the
//! scheduler hands connections from round to round without locks. With
//! `on_failure: stop`, the first failure stops new dispatch, admitted requests drain and
//! are recorded, and later phases are skipped. The driver decides *what* to send and
//! judges the answer; *how* it is sent and timed belongs to the engine.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, header};
use http_body_util::Full;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::{Value, json};

use crate::clock;
use crate::engine::{Capture, Conn, Engine};
use crate::metrics::{self, GeneratorLoad, RoundMetrics, Sample, StreamSample};
use crate::plan::{ConnectionPolicy, Endpoint, OnFailure, Plan};
use crate::record::{ExchangeRecord, Outcome, Phase, RecordError, Recorder, RecorderOptions};
use crate::rundir::RunDir;
use crate::summary::{self, Ending, PhaseCounts};

type ReqBody = Full<Bytes>;
type Slot = Option<Conn<ReqBody>>;

/// Everything a replay needs besides the plan.
pub struct ReplayOptions {
    pub plan: Plan,
    /// The run's start on the monotonic clock (`clock::now_ns`); `start_offset_us` counts
    /// from here.
    pub run_t0_ns: u64,
    pub run_id: String,
    /// Value of `Authorization: Bearer ...`, already read and checked.
    pub bearer_token: Option<String>,
    pub max_record_body: usize,
    pub quiet: bool,
    pub part_rows: usize,
    pub part_seconds: f64,
    /// Write a row per exchange to `exchanges/` (off: metrics and the summary only, to
    /// measure what recording costs).
    pub record_exchanges: bool,
}

pub struct ReplayResult {
    pub ending: Ending,
    pub rounds: Vec<RoundMetrics>,
    pub summary: Value,
    pub table: String,
    /// Set when the recorder failed (the run is then a tool error).
    pub record_error: Option<RecordError>,
    pub rows_written: u64,
}

/// One request to dispatch.
#[derive(Clone, Copy)]
struct Dispatch {
    phase: Phase,
    case: Option<usize>,
    variant: usize,
    concurrency: Option<i32>,
    repetition: Option<i32>,
    dispatch_index: i64,
    worker: i32,
}

struct Ctx {
    engine: Engine,
    plan: Plan,
    opts_token: Option<HeaderValue>,
    max_record_body: usize,
    recorder: Recorder,
    record_exchanges: bool,
    /// The health endpoint's URL, then each case's (index `case + 1`).
    urls: Vec<Arc<str>>,
    run_id: Arc<str>,
    run_t0_ns: u64,
    next_exchange: AtomicI64,
    stop: AtomicBool,
    /// Set by the CLI's signal watcher on Ctrl-C / SIGTERM.
    interrupted: Arc<AtomicBool>,
    record_failed: std::sync::OnceLock<RecordError>,
    failures: AtomicU64,
    progress: ProgressBar,
    case_names: Vec<Arc<str>>,
    variant_names: Vec<Vec<Option<Arc<str>>>>,
}

impl Ctx {
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed) || self.interrupted.load(Ordering::Relaxed)
    }
}

/// Run the plan into `dir`. `interrupt` flips to true on Ctrl-C / SIGTERM.
pub async fn run(
    opts: ReplayOptions,
    engine: Engine,
    dir: &RunDir,
    interrupt: Arc<AtomicBool>,
) -> Result<ReplayResult, RecordError> {
    let mut rec_opts = RecorderOptions::new(dir.exchanges());
    rec_opts.part_rows = opts.part_rows.max(1);
    rec_opts.part_seconds = opts.part_seconds;
    rec_opts.metadata = vec![("matrix_proxy.run_id".into(), opts.run_id.clone())];
    let recorder = Recorder::start(rec_opts)
        .map_err(|e| RecordError(format!("cannot start the writer thread: {e}")))?;
    let plan = opts.plan;
    let progress = if opts.quiet {
        ProgressBar::hidden()
    } else {
        let pb = ProgressBar::with_draw_target(
            Some(plan.planned_requests()),
            ProgressDrawTarget::stderr_with_hz(10),
        );
        pb.set_style(
            ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        pb
    };
    let case_names = plan
        .cases
        .iter()
        .map(|c| Arc::from(c.name.as_str()))
        .collect();
    let variant_names = plan
        .cases
        .iter()
        .map(|c| {
            c.variants
                .iter()
                .map(|v| v.name.as_deref().map(Arc::from))
                .collect()
        })
        .collect();
    let token = opts
        .bearer_token
        .as_deref()
        .and_then(|t| HeaderValue::from_str(&format!("Bearer {t}")).ok())
        .map(|mut v| {
            v.set_sensitive(true);
            v
        });
    let urls = std::iter::once(&plan.health_endpoint)
        .chain(plan.cases.iter().map(|c| &c.endpoint))
        .map(|e| Arc::from(e.url()))
        .collect();
    let ctx = Arc::new(Ctx {
        engine,
        plan,
        opts_token: token,
        max_record_body: opts.max_record_body,
        recorder,
        record_exchanges: opts.record_exchanges,
        urls,
        run_id: Arc::from(opts.run_id.as_str()),
        run_t0_ns: opts.run_t0_ns,
        next_exchange: AtomicI64::new(0),
        stop: AtomicBool::new(false),
        interrupted: interrupt,
        record_failed: std::sync::OnceLock::new(),
        failures: AtomicU64::new(0),
        progress,
        case_names,
        variant_names,
    });

    let mut excluded: BTreeMap<Phase, PhaseCounts> = BTreeMap::new();
    let mut rounds: Vec<RoundMetrics> = Vec::new();
    phases(&ctx, &mut excluded, &mut rounds).await;
    ctx.progress.finish_and_clear();

    let ctx = match Arc::try_unwrap(ctx) {
        Ok(c) => c,
        Err(_) => {
            return Err(RecordError(
                "internal: replay tasks outlived the run".into(),
            ));
        }
    };
    let interrupted = ctx.interrupted.load(Ordering::Relaxed);
    let failures = ctx.failures.load(Ordering::Relaxed);
    let submit_error = ctx.record_failed.get().cloned();
    let plan = ctx.plan;
    let recorder = ctx.recorder;
    let writer = tokio::task::spawn_blocking(move || recorder.finish())
        .await
        .map_err(|e| RecordError(format!("writer join: {e}")))?;
    let (rows_written, record_error) = match (writer, submit_error) {
        (Ok(stats), None) => (stats.rows, None),
        (Ok(stats), Some(e)) => (stats.rows, Some(e)),
        (Err(e), _) => (0, Some(e)),
    };
    let ending = if interrupted {
        Ending::Interrupted
    } else if failures > 0 {
        Ending::Failed
    } else {
        Ending::Passed
    };
    let aggregates = summary::aggregates(&plan, &rounds);
    let summary = summary::summary_json(&plan, &rounds, &aggregates, &excluded, ending, failures);
    let table = summary::table(&plan, &rounds, &aggregates, &excluded);
    Ok(ReplayResult {
        ending,
        rounds,
        summary,
        table,
        record_error,
        rows_written,
    })
}

async fn phases(
    ctx: &Arc<Ctx>,
    excluded: &mut BTreeMap<Phase, PhaseCounts>,
    rounds: &mut Vec<RoundMetrics>,
) {
    let plan = &ctx.plan;
    // health: one GET on its own connection.
    ctx.progress.set_message("health");
    let mut health_slot: Slot = None;
    let s = exchange(
        ctx,
        &mut health_slot,
        Dispatch {
            phase: Phase::Health,
            case: None,
            variant: 0,
            concurrency: Some(1),
            repetition: None,
            dispatch_index: 0,
            worker: 0,
        },
    )
    .await;
    excluded.entry(Phase::Health).or_default().add(&s);
    drop(health_slot);

    // Worker connections live across phases: worker w always uses slots[w].
    let max_c = plan.concurrency.iter().copied().max().unwrap_or(1);
    let mut slots: Vec<Slot> = (0..max_c).map(|_| None).collect();

    for phase in [Phase::Readiness, Phase::Warmup] {
        let per_variant = if phase == Phase::Readiness {
            1
        } else {
            plan.warmup_per_case
        };
        for (ci, case) in plan.cases.iter().enumerate() {
            ctx.progress
                .set_message(format!("{} {}", phase.as_str(), case.name));
            for vi in 0..case.variants.len() {
                for i in 0..per_variant {
                    if ctx.stopped() {
                        return;
                    }
                    let s = exchange(
                        ctx,
                        &mut slots[0],
                        Dispatch {
                            phase,
                            case: Some(ci),
                            variant: vi,
                            concurrency: Some(1),
                            repetition: None,
                            dispatch_index: i as i64,
                            worker: 0,
                        },
                    )
                    .await;
                    excluded.entry(phase).or_default().add(&s);
                }
            }
        }
    }

    let n = plan.requests_per_case;
    for (ci, case) in plan.cases.iter().enumerate() {
        for &c in &plan.concurrency {
            if ctx.stopped() {
                return;
            }
            ctx.progress
                .set_message(format!("feasibility {} c={c}", case.name));
            let samples = wave(ctx, &mut slots, ci, Phase::Feasibility, c, None, c.min(n)).await;
            let counts = excluded.entry(Phase::Feasibility).or_default();
            samples.iter().for_each(|s| counts.add(s));
            for rep in 0..plan.repetitions {
                if ctx.stopped() {
                    return;
                }
                ctx.progress.set_message(format!(
                    "measured {} c={c} round {}/{}",
                    case.name,
                    rep + 1,
                    plan.repetitions
                ));
                let probe = LagProbe::start();
                let (cpu0, wall0) = (clock::process_cpu_ns(), clock::now_ns());
                let samples = wave(ctx, &mut slots, ci, Phase::Measured, c, Some(rep), n).await;
                let (cpu1, wall1) = (clock::process_cpu_ns(), clock::now_ns());
                let lags = probe.stop().await;
                let mut round = metrics::round_metrics(&case.name, c, rep, n as u64, &samples);
                let load = GeneratorLoad::new(
                    cpu1.saturating_sub(cpu0),
                    wall1.saturating_sub(wall0),
                    cores(),
                    lags,
                );
                if let Some(w) = &load.warning {
                    ctx.progress.println(format!(
                        "warning: {} c={c} round {}: {w}",
                        case.name,
                        rep + 1
                    ));
                }
                round.generator = Some(load);
                rounds.push(round);
            }
        }
    }
}

/// Cores this process may run on (its CPU affinity, e.g. under `taskset`).
fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The dispatch-lag probe: a task on the same runtime as the workers that asks to wake
/// every 10 ms and notes how late it did. A runtime too busy to poll its tasks on time
/// shows here before it shows anywhere else.
struct LagProbe {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Vec<i64>>,
}

impl LagProbe {
    const EVERY: std::time::Duration = std::time::Duration::from_millis(10);

    fn start() -> LagProbe {
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let mut lags = Vec::new();
            loop {
                let due = clock::now_ns() + LagProbe::EVERY.as_nanos() as u64;
                tokio::select! {
                    _ = tokio::time::sleep(LagProbe::EVERY) => {
                        lags.push(clock::us_between(due, clock::now_ns()));
                    }
                    _ = &mut stopped => return lags,
                }
            }
        });
        LagProbe { stop, task }
    }

    async fn stop(self) -> Vec<i64> {
        let _ = self.stop.send(());
        self.task.await.unwrap_or_default()
    }
}

/// One closed-loop wave: `c` workers share `n` dispatch indices.
async fn wave(
    ctx: &Arc<Ctx>,
    slots: &mut [Slot],
    case: usize,
    phase: Phase,
    c: usize,
    repetition: Option<usize>,
    n: usize,
) -> Vec<Sample> {
    let next = Arc::new(AtomicUsize::new(0));
    let variants = ctx.plan.cases[case].variants.len();
    let mut tasks = Vec::with_capacity(c);
    for (w, slot) in slots.iter_mut().enumerate().take(c) {
        let ctx = ctx.clone();
        let next = next.clone();
        let mut slot = slot.take();
        tasks.push(tokio::spawn(async move {
            // Closed loop: each worker takes about n / c requests (grown if it takes more).
            let mut samples = Vec::with_capacity(n / c.max(1) + 1);
            loop {
                if ctx.stopped() {
                    break;
                }
                // Feasibility is one wave: worker w sends exactly request w, so all c
                // connections are opened and exercised at once. Measured rounds are a
                // closed loop: a worker takes the next index as soon as it is free.
                let i = if phase == Phase::Feasibility {
                    if !samples.is_empty() {
                        break;
                    }
                    w
                } else {
                    next.fetch_add(1, Ordering::Relaxed)
                };
                if i >= n {
                    break;
                }
                let d = Dispatch {
                    phase,
                    case: Some(case),
                    variant: i % variants,
                    concurrency: Some(c as i32),
                    repetition: repetition.map(|r| r as i32),
                    dispatch_index: i as i64,
                    worker: w as i32,
                };
                samples.push(exchange(&ctx, &mut slot, d).await);
            }
            (slot, samples)
        }));
    }
    let mut all = Vec::with_capacity(n);
    for (w, t) in tasks.into_iter().enumerate() {
        match t.await {
            Ok((slot, samples)) => {
                slots[w] = slot;
                all.extend(samples);
            }
            Err(e) => {
                // A panicking worker is a bug; stop the run rather than hide it.
                let _ = ctx
                    .record_failed
                    .set(RecordError(format!("internal: worker {w} failed: {e}")));
                ctx.stop.store(true, Ordering::Relaxed);
            }
        }
    }
    all
}

fn build_request<'a>(ctx: &'a Ctx, d: &Dispatch) -> (Request<ReqBody>, &'a Endpoint, Bytes) {
    let plan = &ctx.plan;
    let (method, ep, body, ctype, extra): (Method, &Endpoint, Bytes, Option<&HeaderValue>, &[_]) =
        match d.case {
            None => (Method::GET, &plan.health_endpoint, Bytes::new(), None, &[]),
            Some(ci) => {
                let case = &plan.cases[ci];
                let v = &case.variants[d.variant];
                (
                    case.method.clone(),
                    &case.endpoint,
                    v.body.clone(),
                    v.content_type.as_ref(),
                    &case.headers[..],
                )
            }
        };
    let mut headers = HeaderMap::with_capacity(4 + extra.len());
    if let Ok(h) = HeaderValue::from_str(&ep.authority) {
        headers.insert(header::HOST, h);
    }
    if let Some(ct) = ctype {
        headers.insert(header::CONTENT_TYPE, ct.clone());
    }
    if !body.is_empty()
        || method == Method::POST
        || method == Method::PUT
        || method == Method::PATCH
    {
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
    }
    for (k, v) in extra {
        headers.append(k.clone(), v.clone());
    }
    if let Some(t) = &ctx.opts_token {
        headers.insert(header::AUTHORIZATION, t.clone());
    }
    if plan.connection == ConnectionPolicy::Fresh {
        // One request per connection: say so, and the worker closes first, so the
        // TIME_WAIT state stays on its side (thousands of them on ours make every
        // connect() search the port table: measured as half of a fresh run's CPU).
        headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    let mut req = Request::new(Full::new(body.clone()));
    *req.method_mut() = method;
    *req.uri_mut() = ep
        .path_and_query
        .parse()
        .unwrap_or_else(|_| http::Uri::from_static("/"));
    *req.headers_mut() = headers;
    (req, ep, body)
}

/// Run, judge and record one exchange. Returns what the metrics need.
async fn exchange(ctx: &Ctx, slot: &mut Slot, d: Dispatch) -> Sample {
    let (req, ep, body) = build_request(ctx, &d);
    let method = req.method().clone();
    let request_headers = req.headers().clone();
    let started_at_us = clock::wall_now_us();
    let mut cap = Capture::start(ctx.max_record_body);
    let start_offset_us = clock::us_between(ctx.run_t0_ns, cap.t0_ns);
    let policy = ctx.plan.connection;
    let result = tokio::time::timeout(
        ctx.plan.timeout,
        ctx.engine.exchange(slot, ep, policy, req, &mut cap),
    )
    .await;
    cap.finish(clock::now_ns());

    let (expected_status, oracle) = match d.case {
        None => (200, None),
        Some(ci) => {
            let case = &ctx.plan.cases[ci];
            (case.expected_status, Some(&case.variants[d.variant].oracle))
        }
    };
    let mut mismatch_pointer = None;
    let (outcome, error_message) = match result {
        Err(_) => {
            *slot = None;
            (
                Outcome::Timeout,
                Some(format!(
                    "deadline of {} s (timeout_seconds) passed before the exchange ended",
                    ctx.plan.timeout_seconds
                )),
            )
        }
        Ok(Err(e)) => (Outcome::Transport, Some(e.message)),
        Ok(Ok(())) => {
            let status = cap.status.map(|s| s.as_u16()).unwrap_or(0);
            if let Some(why) = cap.stream_incomplete() {
                (Outcome::Transport, Some(why))
            } else if status != expected_status {
                (
                    Outcome::Http,
                    Some(format!("status {status}, expected {expected_status}")),
                )
            } else if let Some(oracle) = oracle {
                if cap.body_truncated {
                    (
                        Outcome::Correctness,
                        Some(format!(
                            "response body of {} bytes is larger than --max-record-body ({} bytes) and cannot be judged; raise the limit",
                            cap.body_len, ctx.max_record_body
                        )),
                    )
                } else {
                    match oracle.check(&cap.body) {
                        Ok(()) => (Outcome::Ok, None),
                        Err(m) => {
                            mismatch_pointer = m.pointer.clone();
                            (Outcome::Correctness, Some(format!("oracle mismatch {m}")))
                        }
                    }
                }
            } else {
                (Outcome::Ok, None)
            }
        }
    };

    let total_us = cap.us(cap.end_ns);
    let stream = cap.stream_columns();
    let sample = Sample {
        outcome,
        start_offset_us,
        total_us,
        first_byte_us: cap.us(cap.first_byte_ns),
        connect_us: cap.us(cap.connect_ns),
        stream: stream.as_ref().map(StreamSample::from_columns),
    };
    // A failure stops dispatch before anything else happens (recording may wait).
    if outcome != Outcome::Ok && ctx.plan.on_failure == OnFailure::Stop {
        ctx.stop.store(true, Ordering::Relaxed);
    }
    if ctx.record_exchanges {
        let request_body_len = body.len() as i64;
        let request_body_truncated = body.len() > ctx.max_record_body;
        let request_body = if request_body_truncated {
            body.slice(..ctx.max_record_body)
        } else {
            body
        };
        let (case_name, variant) = match d.case {
            None => (None, None),
            Some(ci) => (
                Some(ctx.case_names[ci].clone()),
                ctx.variant_names[ci][d.variant].clone(),
            ),
        };
        let record = ExchangeRecord {
            run_id: ctx.run_id.clone(),
            exchange_id: ctx.next_exchange.fetch_add(1, Ordering::Relaxed),
            phase: d.phase,
            case_name,
            variant,
            concurrency: d.concurrency,
            repetition: d.repetition,
            dispatch_index: d.dispatch_index,
            worker: d.worker,
            connection_id: cap.connection_id,
            connection_reused: cap.connection_reused,
            connection_retried: cap.connection_retried,
            started_at_us,
            start_offset_us,
            method,
            url: ctx.urls[d.case.map_or(0, |c| c + 1)].clone(),
            request_headers,
            request_body,
            request_body_len,
            request_body_truncated,
            status: cap.status.map(|s| i32::from(s.as_u16())),
            timings: cap.timings(),
            stream,
            response_headers: std::mem::take(&mut cap.response_headers),
            response_body_len: cap.body_len as i64,
            response_body_truncated: cap.body_truncated,
            response_body: cap.body.freeze(),
            outcome,
            error_message,
            oracle_mismatch_pointer: mismatch_pointer,
            memory: None,
        };
        if let Err(e) = ctx.recorder.submit(record).await {
            let _ = ctx.record_failed.set(e);
            ctx.stop.store(true, Ordering::Relaxed);
        }
    }
    ctx.progress.inc(1);
    if outcome != Outcome::Ok {
        let f = ctx.failures.fetch_add(1, Ordering::Relaxed) + 1;
        ctx.progress.set_prefix(format!("failures {f}"));
        ctx.progress.println(format!(
            "failure {f}: {} {} -> {}",
            d.phase.as_str(),
            d.case
                .map(|c| ctx.plan.cases[c].name.as_str())
                .unwrap_or("health"),
            outcome.as_str()
        ));
    }
    sample
}

/// The run's config.json (without `finished_at` until the run ends).
pub fn config_json(
    plan: &Plan,
    run_id: &str,
    plan_path: &str,
    plan_sha256: &str,
    started_at_us: i64,
    run_t0_ns: u64,
    extra: Value,
) -> Value {
    json!({
        "run_id": run_id,
        "command": "replay",
        "tool": {
            "name": "matrix-proxy",
            "version": env!("CARGO_PKG_VERSION"),
            "binary_sha256": crate::rundir::binary_sha256(),
        },
        "plan_path": plan_path,
        "plan_sha256": plan_sha256,
        "started_at": clock::iso_utc(started_at_us),
        "finished_at": Value::Null,
        "host": crate::rundir::host_identity(),
        "endpoint": plan.endpoint.url(),
        "health_endpoint": plan.health_endpoint.url(),
        "effective_budget": {
            "requests_per_case": plan.requests_per_case,
            "concurrency": plan.concurrency,
            "repetitions": plan.repetitions,
            "warmup_per_case": plan.warmup_per_case,
            "timeout_seconds": plan.timeout_seconds,
            "planned_requests": plan.planned_requests(),
        },
        "connection_policy": plan.connection.as_str(),
        "on_failure": plan.on_failure.as_str(),
        "schema_version": crate::record::SCHEMA_VERSION,
        "clock": "durations: one monotonic clock (std::time::Instant); started_at: wall clock, UTC",
        "monotonic_start_ns": run_t0_ns,
        "timers": {
            "t0": "the worker starts the exchange, before it connects or reuses a connection",
            "connect_us": "TCP connected (includes name resolution); null on a reused connection",
            "tls_us": "TLS handshake done; null for plain HTTP or a reused connection",
            "request_sent_us": "last request byte written to the connection",
            "first_byte_us": "first response byte read from the connection",
            "first_body_us": "first response body byte received",
            "total_us": "last response body byte received (for failures: when the failure was detected); oracle validation excluded",
        },
        "extra": extra,
    })
}
