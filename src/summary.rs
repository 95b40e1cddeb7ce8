//! Turning round metrics into the run's reports: `rounds.parquet`, `summary.json` (with
//! the seed tool's keys at every level) and the table printed on stdout.
//! Arithmetic lives in `metrics`; this module only arranges and writes it.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use arrow_array::{ArrayRef, BooleanArray, Float64Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use parquet::arrow::ArrowWriter;
use serde_json::{Map, Value, json};

use crate::metrics::Sample;
use crate::metrics::{self, Aggregate, Percentiles, RoundMetrics, Spread, THROUGHPUT_SCOPE};
use crate::plan::Plan;
use crate::record::{Outcome, Phase};

/// How a replay ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// Every request of the budget succeeded.
    Passed,
    /// At least one failure was recorded.
    Failed,
    /// Ctrl-C / SIGTERM.
    Interrupted,
}

/// Per-phase counts of the excluded (non-measured) phases.
#[derive(Debug, Clone, Default)]
pub struct PhaseCounts {
    pub attempted: u64,
    pub successful: u64,
    pub failures: BTreeMap<Outcome, u64>,
}

impl PhaseCounts {
    pub fn add(&mut self, s: &Sample) {
        self.attempted += 1;
        if s.outcome == Outcome::Ok {
            self.successful += 1;
        } else {
            *self.failures.entry(s.outcome).or_insert(0) += 1;
        }
    }
}

pub fn aggregates(plan: &Plan, rounds: &[RoundMetrics]) -> Vec<Aggregate> {
    let mut out = Vec::new();
    for case in &plan.cases {
        for &c in &plan.concurrency {
            let rs: Vec<&RoundMetrics> = rounds
                .iter()
                .filter(|r| r.case_name == case.name && r.concurrency == c)
                .collect();
            out.push(metrics::aggregate(&case.name, c, plan.repetitions, &rs));
        }
    }
    out
}

fn failures_json(f: &BTreeMap<Outcome, u64>) -> Value {
    Value::Object(
        f.iter()
            .map(|(k, v)| (k.as_str().to_string(), json!(v)))
            .collect::<Map<_, _>>(),
    )
}

fn secs(us: Option<i64>) -> Value {
    us.map_or(Value::Null, |v| json!(v as f64 / 1e6))
}

fn pct_json(p: &Percentiles) -> Value {
    json!({"p50": secs(p.p50), "p95": secs(p.p95), "p99": secs(p.p99)})
}

fn spread_json(s: &Option<Spread>) -> Value {
    match s {
        None => Value::Null,
        Some(s) => json!({
            "rounds": s.rounds, "min": s.min, "median": s.median, "max": s.max,
            "relative_spread": s.relative_spread,
        }),
    }
}

fn round_json(r: &RoundMetrics) -> Value {
    let ss = &r.steady_state;
    json!({
        "case": r.case_name,
        "concurrency": r.concurrency,
        "repetition": r.repetition,
        "planned_requests": r.planned_requests,
        "attempted_requests": r.attempted_requests,
        "successful_requests": r.successful_requests,
        "elapsed_seconds": r.elapsed_seconds,
        "successful_requests_per_second": r.successful_requests_per_second,
        "successful_latency_seconds": pct_json(&r.total_us),
        "failures": failures_json(&r.failures),
        "failure_latency_seconds": if r.failures.is_empty() { Value::Null } else { pct_json(&r.failure_total_us) },
        "complete": r.complete,
        "steady_state": {
            "available": ss.available,
            "reason": ss.reason,
            "window_start_seconds": secs(ss.start_us),
            "window_end_seconds": secs(ss.end_us),
            "requests": ss.requests,
            "requests_per_second": ss.requests_per_second,
        },
        "throughput_scope": THROUGHPUT_SCOPE,
        "first_byte_seconds": pct_json(&r.first_byte_us),
        "connect_seconds": pct_json(&r.connect_us),
        "generator": r.generator.as_ref().map(|g| json!({
            "cpu_seconds": g.cpu_seconds,
            "cpu_share": g.cpu_share,
            "cores": g.cores,
            "dispatch_lag_seconds": pct_json(&g.lag_us),
            "dispatch_lag_max_seconds": secs(g.lag_max_us),
            "warning": g.warning,
            "scope": GENERATOR_SCOPE,
        })),
        "stream": r.stream.as_ref().map(|st| json!({
            "requests": st.requests,
            "ttft_seconds": pct_json(&st.ttft_us),
            "tpot_seconds": pct_json(&st.tpot_us),
            "itl_seconds": pct_json(&st.itl_us),
            "itl_scope": "pooled over every inter-token gap of every successful exchange",
            "output_tokens": st.output_tokens,
            "output_tokens_per_second": {
                "per_request_mean": st.output_tokens_per_second_mean,
                "aggregate": st.output_tokens_per_second_aggregate,
            },
            "prefill_tokens_per_second_mean": st.prefill_tokens_per_second_mean,
        })),
    })
}

pub fn summary_json(
    plan: &Plan,
    rounds: &[RoundMetrics],
    aggs: &[Aggregate],
    excluded: &BTreeMap<Phase, PhaseCounts>,
    ending: Ending,
    total_failures: u64,
) -> Value {
    let mut failures: BTreeMap<Outcome, u64> = BTreeMap::new();
    for r in rounds {
        for (k, v) in &r.failures {
            *failures.entry(*k).or_insert(0) += v;
        }
    }
    for c in excluded.values() {
        for (k, v) in &c.failures {
            *failures.entry(*k).or_insert(0) += v;
        }
    }
    let planned_rounds = plan.cases.len() * plan.concurrency.len() * plan.repetitions;
    let complete = ending == Ending::Passed
        && total_failures == 0
        && rounds.len() == planned_rounds
        && rounds.iter().all(|r| r.complete);
    let excluded_json: Map<String, Value> = excluded
        .iter()
        .map(|(p, c)| {
            (
                p.as_str().to_string(),
                json!({"attempted_requests": c.attempted, "successful_requests": c.successful, "failures": failures_json(&c.failures)}),
            )
        })
        .collect();
    json!({
        "complete": complete,
        "failures": failures_json(&failures),
        "rounds": rounds.iter().map(round_json).collect::<Vec<_>>(),
        "round_aggregates": aggs.iter().map(|a| json!({
            "case": a.case_name,
            "concurrency": a.concurrency,
            "planned_rounds": a.planned_rounds,
            "attempted_rounds": a.attempted_rounds,
            "complete_rounds": a.complete_rounds,
            "incomplete_rounds": a.incomplete_rounds,
            "metrics": Value::Object(a.metrics.iter().map(|(k, s)| (k.to_string(), spread_json(s))).collect()),
        })).collect::<Vec<_>>(),
        "excluded_phases": excluded_json,
        "ending": match ending { Ending::Passed => "passed", Ending::Failed => "failed", Ending::Interrupted => "interrupted" },
        "planned_rounds": planned_rounds,
        "planned_requests": plan.planned_requests(),
        "definitions": {
            "latency": "t0 (worker starts the exchange) to the last response body byte; oracle validation excluded",
            "percentiles": "nearest rank over the round's successful exchanges: sorted[ceil(p*n)-1]; p95 of fewer than 20 samples is the maximum",
            "throughput_scope": "successful requests / (last completion - first dispatch) of the round, ramp and drain included",
            "steady_state": "complete rounds with n > 2c: completions sorted, first and last c dropped; rate over completion c .. completion n-c",
            "round_aggregates": "over complete rounds only; median is the ordinary median; relative_spread = (max - min) / median",
            "ttft": "t0 to the first event carrying generated content (OpenAI: non-empty delta.content or text; other event streams: the first event)",
            "tpot": "(total - ttft) / (output_tokens - 1), per exchange with more than one output token",
            "itl": "gaps between consecutive content events, pooled over every successful exchange of the round",
            "output_tokens_per_second": "per_request_mean: mean of output_tokens / (total - ttft); aggregate: all output tokens of successful exchanges / round elapsed time",
            "prefill_tokens_per_second_mean": "mean of prompt_tokens / ttft",
        },
    })
}

/// One row per measured round, typed for SQL (documented in docs/output.md).
pub fn write_rounds_parquet(path: &Path, rounds: &[RoundMetrics]) -> Result<(), String> {
    let i64col = |f: &dyn Fn(&RoundMetrics) -> Option<i64>| -> ArrayRef {
        Arc::new(Int64Array::from_iter(rounds.iter().map(f)))
    };
    let f64col = |f: &dyn Fn(&RoundMetrics) -> Option<f64>| -> ArrayRef {
        Arc::new(Float64Array::from_iter(rounds.iter().map(f)))
    };
    let fail = |o: Outcome| move |r: &RoundMetrics| Some(*r.failures.get(&o).unwrap_or(&0) as i64);
    let mut fields: Vec<Field> = Vec::new();
    let mut cols: Vec<ArrayRef> = Vec::new();
    let mut push = |name: &str, dt: DataType, nullable: bool, a: ArrayRef| {
        fields.push(Field::new(name, dt, nullable));
        cols.push(a);
    };
    push(
        "case_name",
        DataType::Utf8,
        false,
        Arc::new(StringArray::from_iter_values(
            rounds.iter().map(|r| r.case_name.as_str()),
        )),
    );
    push(
        "concurrency",
        DataType::Int64,
        false,
        i64col(&|r| Some(r.concurrency as i64)),
    );
    push(
        "repetition",
        DataType::Int64,
        false,
        i64col(&|r| Some(r.repetition as i64)),
    );
    push(
        "planned_requests",
        DataType::Int64,
        false,
        i64col(&|r| Some(r.planned_requests as i64)),
    );
    push(
        "attempted_requests",
        DataType::Int64,
        false,
        i64col(&|r| Some(r.attempted_requests as i64)),
    );
    push(
        "successful_requests",
        DataType::Int64,
        false,
        i64col(&|r| Some(r.successful_requests as i64)),
    );
    for o in &Outcome::ALL[1..] {
        push(
            &format!("failures_{}", o.as_str()),
            DataType::Int64,
            false,
            i64col(&fail(*o)),
        );
    }
    push(
        "elapsed_seconds",
        DataType::Float64,
        false,
        f64col(&|r| Some(r.elapsed_seconds)),
    );
    push(
        "successful_requests_per_second",
        DataType::Float64,
        true,
        f64col(&|r| r.successful_requests_per_second),
    );
    type Pick = fn(&RoundMetrics) -> &Percentiles;
    let groups: [(&str, Pick); 4] = [
        ("total", |r| &r.total_us),
        ("first_byte", |r| &r.first_byte_us),
        ("connect", |r| &r.connect_us),
        ("failure_total", |r| &r.failure_total_us),
    ];
    for (name, pick) in groups {
        push(
            &format!("{name}_p50_us"),
            DataType::Int64,
            true,
            i64col(&|r| pick(r).p50),
        );
        push(
            &format!("{name}_p95_us"),
            DataType::Int64,
            true,
            i64col(&|r| pick(r).p95),
        );
        push(
            &format!("{name}_p99_us"),
            DataType::Int64,
            true,
            i64col(&|r| pick(r).p99),
        );
    }
    type PickS = fn(&metrics::StreamMetrics) -> &Percentiles;
    let sgroups: [(&str, PickS); 3] = [
        ("ttft", |s| &s.ttft_us),
        ("tpot", |s| &s.tpot_us),
        ("itl", |s| &s.itl_us),
    ];
    push(
        "stream_requests",
        DataType::Int64,
        false,
        i64col(&|r| Some(r.stream.as_ref().map_or(0, |s| s.requests as i64))),
    );
    for (name, pick) in sgroups {
        push(
            &format!("{name}_p50_us"),
            DataType::Int64,
            true,
            i64col(&|r| r.stream.as_ref().and_then(|s| pick(s).p50)),
        );
        push(
            &format!("{name}_p95_us"),
            DataType::Int64,
            true,
            i64col(&|r| r.stream.as_ref().and_then(|s| pick(s).p95)),
        );
        push(
            &format!("{name}_p99_us"),
            DataType::Int64,
            true,
            i64col(&|r| r.stream.as_ref().and_then(|s| pick(s).p99)),
        );
    }
    push(
        "output_tokens",
        DataType::Int64,
        true,
        i64col(&|r| r.stream.as_ref().map(|s| s.output_tokens)),
    );
    push(
        "output_tokens_per_second_mean",
        DataType::Float64,
        true,
        f64col(&|r| {
            r.stream
                .as_ref()
                .and_then(|s| s.output_tokens_per_second_mean)
        }),
    );
    push(
        "output_tokens_per_second_aggregate",
        DataType::Float64,
        true,
        f64col(&|r| {
            r.stream
                .as_ref()
                .and_then(|s| s.output_tokens_per_second_aggregate)
        }),
    );
    push(
        "prefill_tokens_per_second_mean",
        DataType::Float64,
        true,
        f64col(&|r| {
            r.stream
                .as_ref()
                .and_then(|s| s.prefill_tokens_per_second_mean)
        }),
    );
    push(
        "complete",
        DataType::Boolean,
        false,
        Arc::new(BooleanArray::from_iter(
            rounds.iter().map(|r| Some(r.complete)),
        )),
    );
    push(
        "steady_state_available",
        DataType::Boolean,
        false,
        Arc::new(BooleanArray::from_iter(
            rounds.iter().map(|r| Some(r.steady_state.available)),
        )),
    );
    push(
        "steady_state_reason",
        DataType::Utf8,
        true,
        Arc::new(StringArray::from_iter(
            rounds.iter().map(|r| r.steady_state.reason.as_deref()),
        )),
    );
    push(
        "steady_state_start_us",
        DataType::Int64,
        true,
        i64col(&|r| r.steady_state.start_us),
    );
    push(
        "steady_state_end_us",
        DataType::Int64,
        true,
        i64col(&|r| r.steady_state.end_us),
    );
    push(
        "steady_state_requests",
        DataType::Int64,
        true,
        i64col(&|r| r.steady_state.requests.map(|v| v as i64)),
    );
    push(
        "steady_state_requests_per_second",
        DataType::Float64,
        true,
        f64col(&|r| r.steady_state.requests_per_second),
    );
    let gen_f64 = |f: &dyn Fn(&crate::metrics::GeneratorLoad) -> f64| -> ArrayRef {
        Arc::new(Float64Array::from_iter(
            rounds.iter().map(|r| r.generator.as_ref().map(f)),
        ))
    };
    let gen_i64 = |f: &dyn Fn(&crate::metrics::GeneratorLoad) -> Option<i64>| -> ArrayRef {
        Arc::new(Int64Array::from_iter(
            rounds.iter().map(|r| r.generator.as_ref().and_then(f)),
        ))
    };
    push(
        "generator_cpu_seconds",
        DataType::Float64,
        true,
        gen_f64(&|g| g.cpu_seconds),
    );
    push(
        "generator_cpu_share",
        DataType::Float64,
        true,
        gen_f64(&|g| g.cpu_share),
    );
    push(
        "dispatch_lag_p50_us",
        DataType::Int64,
        true,
        gen_i64(&|g| g.lag_us.p50),
    );
    push(
        "dispatch_lag_p99_us",
        DataType::Int64,
        true,
        gen_i64(&|g| g.lag_us.p99),
    );
    push(
        "dispatch_lag_max_us",
        DataType::Int64,
        true,
        gen_i64(&|g| g.lag_max_us),
    );
    push(
        "generator_warning",
        DataType::Utf8,
        true,
        Arc::new(StringArray::from_iter(rounds.iter().map(|r| {
            r.generator.as_ref().and_then(|g| g.warning.as_deref())
        }))),
    );
    push(
        "throughput_scope",
        DataType::Utf8,
        false,
        Arc::new(StringArray::from_iter_values(
            rounds.iter().map(|_| THROUGHPUT_SCOPE),
        )),
    );
    let schema = Arc::new(Schema::new(fields));
    let batch = RecordBatch::try_new(schema.clone(), cols).map_err(|e| e.to_string())?;
    let tmp = path.with_extension("parquet.inprogress");
    let file = File::create(&tmp).map_err(|e| format!("{}: {e}", tmp.display()))?;
    let mut w =
        ArrowWriter::try_new(file, schema, None).map_err(|e| format!("{}: {e}", tmp.display()))?;
    w.write(&batch)
        .map_err(|e| format!("{}: {e}", tmp.display()))?;
    let file = w
        .into_inner()
        .map_err(|e| format!("{}: {e}", tmp.display()))?;
    file.sync_all()
        .map_err(|e| format!("{}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path).map_err(|e| format!("{}: {e}", path.display()))
}

const GENERATOR_SCOPE: &str = "matrix-proxy's own process during the round (workers, recorder, and the built-in mock worker when --mock-worker runs it): CPU time from getrusage-equivalent accounting, share = CPU / (wall x cores it may run on); dispatch lag = how late a 10 ms tick on the same runtime fired (1 ms timer granularity)";

fn fmt_ms(v: Option<f64>) -> String {
    v.map_or("-".into(), |s| format!("{:.1}", s * 1000.0))
}

/// The per (case, concurrency) table printed on stdout.
pub fn table(
    plan: &Plan,
    rounds: &[RoundMetrics],
    aggs: &[Aggregate],
    excluded: &BTreeMap<Phase, PhaseCounts>,
) -> String {
    let streams = rounds.iter().any(|r| r.stream.is_some());
    let mut rows: Vec<Vec<String>> = vec![vec![
        "case".into(),
        "c".into(),
        "rounds".into(),
        "req/s".into(),
        "spread".into(),
        "p50 ms".into(),
        "p95 ms".into(),
    ]];
    if streams {
        rows[0].extend(["TTFT ms".into(), "ITL ms".into(), "tok/s".into()]);
    }
    rows[0].extend(["ok/attempted".into(), "failures".into()]);
    for a in aggs {
        let rs: Vec<&RoundMetrics> = rounds
            .iter()
            .filter(|r| r.case_name == a.case_name && r.concurrency == a.concurrency)
            .collect();
        let ok: u64 = rs.iter().map(|r| r.successful_requests).sum();
        let att: u64 = rs.iter().map(|r| r.attempted_requests).sum();
        let mut fails: BTreeMap<Outcome, u64> = BTreeMap::new();
        for r in &rs {
            for (k, v) in &r.failures {
                *fails.entry(*k).or_insert(0) += v;
            }
        }
        let get = |name: &str| {
            a.metrics
                .iter()
                .find(|(k, _)| *k == name)
                .and_then(|(_, s)| *s)
        };
        let rps = get("successful_requests_per_second");
        let mut row = vec![
            a.case_name.clone(),
            a.concurrency.to_string(),
            format!("{}/{}", a.complete_rounds, a.planned_rounds),
            rps.map_or("-".into(), |s| format!("{:.1}", s.median)),
            rps.and_then(|s| s.relative_spread)
                .map_or("-".into(), |s| format!("{:.1}%", s * 100.0)),
            fmt_ms(get("latency_p50_seconds").map(|s| s.median)),
            fmt_ms(get("latency_p95_seconds").map(|s| s.median)),
        ];
        if streams {
            row.push(fmt_ms(get("ttft_p50_seconds").map(|s| s.median)));
            row.push(fmt_ms(get("itl_p50_seconds").map(|s| s.median)));
            row.push(
                get("output_tokens_per_second_aggregate")
                    .map_or("-".into(), |s| format!("{:.0}", s.median)),
            );
        }
        row.extend([
            format!("{ok}/{att}"),
            if fails.is_empty() {
                "0".into()
            } else {
                fails
                    .iter()
                    .map(|(k, v)| format!("{}={v}", k.as_str()))
                    .collect::<Vec<_>>()
                    .join(" ")
            },
        ]);
        rows.push(row);
    }
    let mut widths = vec![0usize; rows[0].len()];
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let mut out = String::new();
    for r in &rows {
        let line: Vec<String> = r
            .iter()
            .enumerate()
            .map(|(i, c)| {
                if i < 2 {
                    format!("{c:<w$}", w = widths[i])
                } else {
                    format!("{c:>w$}", w = widths[i])
                }
            })
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    let ex: Vec<String> = excluded
        .iter()
        .map(|(p, c)| format!("{} {}/{}", p.as_str(), c.successful, c.attempted))
        .collect();
    out.push_str(&format!(
        "excluded phases (ok/attempted): {}\n",
        if ex.is_empty() {
            "none".into()
        } else {
            ex.join(", ")
        }
    ));
    out.push_str(&format!(
        "req/s and latency: medians over complete rounds; req/s = successful / round wall time (ramp and drain included); latency = start to last body byte, validation excluded; {} connections\n",
        plan.connection.as_str()
    ));
    if streams {
        out.push_str("TTFT, ITL (pooled gaps) p50 and tok/s (all output tokens / round wall time): medians over complete rounds of streaming cases\n");
    }
    for r in rounds {
        if let Some(w) = r.generator.as_ref().and_then(|g| g.warning.as_ref()) {
            out.push_str(&format!(
                "warning: {} c={} round {}: {w}\n",
                r.case_name,
                r.concurrency,
                r.repetition + 1
            ));
        }
    }
    out
}

/// Rebuild a replay run's measured rounds and excluded-phase counts from its rows.
/// Returns the rounds in plan order, the excluded phases, and the number of failures.
pub fn rounds_from_rows(
    plan: &Plan,
    facts: &[crate::record::RowFacts],
) -> (Vec<RoundMetrics>, BTreeMap<Phase, PhaseCounts>, u64) {
    let mut rounds = Vec::new();
    for case in &plan.cases {
        for &c in &plan.concurrency {
            for rep in 0..plan.repetitions {
                let samples: Vec<Sample> = facts
                    .iter()
                    .filter(|f| {
                        f.phase == Phase::Measured.as_str()
                            && f.case_name.as_deref() == Some(case.name.as_str())
                            && f.concurrency == Some(c as i32)
                            && f.repetition == Some(rep as i32)
                    })
                    .map(|f| f.sample.clone())
                    .collect();
                if !samples.is_empty() {
                    rounds.push(metrics::round_metrics(
                        &case.name,
                        c,
                        rep,
                        plan.requests_per_case as u64,
                        &samples,
                    ));
                }
            }
        }
    }
    let mut excluded: BTreeMap<Phase, PhaseCounts> = BTreeMap::new();
    for f in facts {
        let phase = [
            Phase::Health,
            Phase::Readiness,
            Phase::Warmup,
            Phase::Feasibility,
        ]
        .into_iter()
        .find(|p| p.as_str() == f.phase);
        if let Some(p) = phase {
            excluded.entry(p).or_default().add(&f.sample);
        }
    }
    let failures = facts
        .iter()
        .filter(|f| f.sample.outcome != Outcome::Ok)
        .count() as u64;
    (rounds, excluded, failures)
}

/// serve's summary.json.
pub fn serve_summary_json(stats: &crate::serve::ServeStats, rows: u64) -> Value {
    let failures: Map<String, Value> = stats
        .by_outcome
        .iter()
        .filter(|(o, _)| **o != Outcome::Ok)
        .map(|(o, n)| (o.as_str().to_string(), json!(n)))
        .collect();
    json!({
        "ending": "stopped",
        "requests": stats.requests,
        "successful_requests": stats.by_outcome.get(&Outcome::Ok).copied().unwrap_or(0),
        "failures": failures,
        "rows_written": rows,
        "dropped_rows": stats.dropped_rows,
        "recorder_backlog_peak_rows": stats.backlog_peak,
        "successful_latency_seconds": pct_json(&stats.ok_total),
        "record_error": stats.record_error.as_ref().map(|e| e.to_string()),
        "definitions": {
            "latency": "client request head parsed to the last upstream body byte (total_us); nearest rank over the successful exchanges recorded in exchanges/ (rows dropped under --on-record-full drop are not in it)",
            "dropped_rows": "rows dropped because the recorder's queue was full (--on-record-full drop); 0 under block",
            "recorder_backlog_peak_rows": "most finished exchanges waiting at once for room in the recorder's queue (block); each holds its client connection's next request, so it is at most the number of client connections",
        },
    })
}
