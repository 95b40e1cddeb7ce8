//! `rounds.parquet`: one row per attempted measured round, typed for SQL (documented in
//! docs/output.md). Like the exchange columns, each column is declared once with the code
//! that fills it, and the schema and the batch are generated from that list.

use std::path::Path;
use std::sync::Arc;

use arrow_array::{
    ArrayRef, BooleanArray, Float64Array, Int32Array, Int64Array, RecordBatch, StringArray,
};
use arrow_schema::{DataType, Field, Schema};

use crate::metrics::{
    GeneratorLoad, Goodput, OpenMetrics, Percentiles, RoundMetrics, StreamMetrics, THROUGHPUT_SCOPE,
};
use crate::model::Outcome;

type Rounds<'a> = &'a [RoundMetrics];

/// One column of rounds.parquet: its name, nullability, and how it is filled.
struct RoundColumn {
    name: String,
    nullable: bool,
    fill: Box<dyn Fn(Rounds) -> ArrayRef>,
    data_type: DataType,
}

fn int(
    name: &str,
    nullable: bool,
    f: impl Fn(&RoundMetrics) -> Option<i64> + 'static,
) -> RoundColumn {
    RoundColumn {
        name: name.to_string(),
        nullable,
        data_type: DataType::Int64,
        fill: Box::new(move |rs: Rounds| Arc::new(Int64Array::from_iter(rs.iter().map(&f)))),
    }
}

/// An Int32 column: the type `concurrency` and `repetition` have in exchanges/ too, so a
/// join between the two files needs no cast.
fn int32(
    name: &str,
    nullable: bool,
    f: impl Fn(&RoundMetrics) -> Option<i32> + 'static,
) -> RoundColumn {
    RoundColumn {
        name: name.to_string(),
        nullable,
        data_type: DataType::Int32,
        fill: Box::new(move |rs: Rounds| Arc::new(Int32Array::from_iter(rs.iter().map(&f)))),
    }
}

fn flag_opt(name: &str, f: fn(&RoundMetrics) -> Option<bool>) -> RoundColumn {
    RoundColumn {
        name: name.to_string(),
        nullable: true,
        data_type: DataType::Boolean,
        fill: Box::new(move |rs: Rounds| Arc::new(BooleanArray::from_iter(rs.iter().map(f)))),
    }
}

fn float(
    name: &str,
    nullable: bool,
    f: impl Fn(&RoundMetrics) -> Option<f64> + 'static,
) -> RoundColumn {
    RoundColumn {
        name: name.to_string(),
        nullable,
        data_type: DataType::Float64,
        fill: Box::new(move |rs: Rounds| Arc::new(Float64Array::from_iter(rs.iter().map(&f)))),
    }
}

fn flag(name: &str, f: fn(&RoundMetrics) -> bool) -> RoundColumn {
    RoundColumn {
        name: name.to_string(),
        nullable: false,
        data_type: DataType::Boolean,
        fill: Box::new(move |rs: Rounds| {
            Arc::new(BooleanArray::from_iter(rs.iter().map(|r| Some(f(r)))))
        }),
    }
}

fn text(
    name: &str,
    nullable: bool,
    f: for<'a> fn(&'a RoundMetrics) -> Option<&'a str>,
) -> RoundColumn {
    RoundColumn {
        name: name.to_string(),
        nullable,
        data_type: DataType::Utf8,
        fill: Box::new(move |rs: Rounds| Arc::new(StringArray::from_iter(rs.iter().map(f)))),
    }
}

/// `NAME_p50_us`, `NAME_p95_us`, `NAME_p99_us` from the percentiles `pick` finds.
fn percentiles(
    name: &str,
    pick: impl Fn(&RoundMetrics) -> Option<&Percentiles> + Copy + 'static,
) -> [RoundColumn; 3] {
    [
        int(&format!("{name}_p50_us"), true, move |r| {
            pick(r).and_then(|p| p.p50)
        }),
        int(&format!("{name}_p95_us"), true, move |r| {
            pick(r).and_then(|p| p.p95)
        }),
        int(&format!("{name}_p99_us"), true, move |r| {
            pick(r).and_then(|p| p.p99)
        }),
    ]
}

fn counts() -> Vec<RoundColumn> {
    let mut v = vec![
        text("arm", false, |r| r.arm.as_deref()),
        text("case_name", false, |r| Some(r.case_name.as_str())),
        // Null in an open-loop round, whose level is its rate.
        int32("concurrency", true, |r| {
            r.open
                .is_none()
                .then(|| i32::try_from(r.concurrency).unwrap_or(i32::MAX))
        }),
        float("target_rate_per_second", true, |r| {
            r.open.as_ref().map(|o| o.target_rate_per_second)
        }),
        int32("repetition", false, |r| {
            Some(i32::try_from(r.repetition).unwrap_or(i32::MAX))
        }),
        int("planned_requests", false, |r| {
            Some(r.planned_requests as i64)
        }),
        int("attempted_requests", false, |r| {
            Some(r.attempted_requests as i64)
        }),
        int("successful_requests", false, |r| {
            Some(r.successful_requests as i64)
        }),
    ];
    for o in Outcome::ALL[1..].iter().copied() {
        v.push(int(&format!("failures_{}", o.as_str()), false, move |r| {
            Some(*r.failures.get(&o).unwrap_or(&0) as i64)
        }));
    }
    v.push(float("elapsed_seconds", false, |r| Some(r.elapsed_seconds)));
    v.push(float("successful_requests_per_second", true, |r| {
        r.successful_requests_per_second
    }));
    v.push(int("successful_decisions", false, |r| {
        Some(r.successful_decisions as i64)
    }));
    v.push(float("successful_decisions_per_second", true, |r| {
        r.successful_decisions_per_second
    }));
    v
}

fn latencies() -> Vec<RoundColumn> {
    let mut v = Vec::new();
    v.extend(percentiles("total", |r| Some(&r.total_us)));
    v.extend(percentiles("first_byte", |r| Some(&r.first_byte_us)));
    v.extend(percentiles("connect", |r| Some(&r.connect_us)));
    v.extend(percentiles("failure_total", |r| Some(&r.failure_total_us)));
    v
}

fn streams() -> Vec<RoundColumn> {
    fn stream(r: &RoundMetrics) -> Option<&StreamMetrics> {
        r.stream.as_ref()
    }
    let mut v = vec![int("stream_requests", false, |r| {
        Some(stream(r).map_or(0, |s| s.requests as i64))
    })];
    v.extend(percentiles("ttft", |r| stream(r).map(|s| &s.ttft_us)));
    v.extend(percentiles("tpot", |r| stream(r).map(|s| &s.tpot_us)));
    v.extend(percentiles("itl", |r| stream(r).map(|s| &s.itl_us)));
    v.push(int("output_tokens", true, |r| {
        stream(r).map(|s| s.output_tokens)
    }));
    v.push(float("output_tokens_per_second_mean", true, |r| {
        stream(r).and_then(|s| s.output_tokens_per_second_mean)
    }));
    v.push(float("output_tokens_per_second_pooled", true, |r| {
        stream(r).and_then(|s| s.output_tokens_per_second_pooled)
    }));
    v.push(float("output_tokens_per_second_aggregate", true, |r| {
        stream(r).and_then(|s| s.output_tokens_per_second_aggregate)
    }));
    v.push(float("prefill_tokens_per_second_mean", true, |r| {
        stream(r).and_then(|s| s.prefill_tokens_per_second_mean)
    }));
    v
}

fn steady_state() -> Vec<RoundColumn> {
    vec![
        flag("complete", |r| r.complete),
        flag("steady_state_available", |r| r.steady_state.available),
        text("steady_state_reason", true, |r| {
            r.steady_state.reason.as_deref()
        }),
        int("steady_state_start_us", true, |r| r.steady_state.start_us),
        int("steady_state_end_us", true, |r| r.steady_state.end_us),
        int("steady_state_requests", true, |r| {
            r.steady_state.requests.map(|v| v as i64)
        }),
        float("steady_state_requests_per_second", true, |r| {
            r.steady_state.requests_per_second
        }),
        int("steady_state_decisions", true, |r| {
            r.steady_state.decisions.map(|v| v as i64)
        }),
        float("steady_state_decisions_per_second", true, |r| {
            r.steady_state.decisions_per_second
        }),
    ]
}

fn generator() -> Vec<RoundColumn> {
    fn g(r: &RoundMetrics) -> Option<&GeneratorLoad> {
        r.generator.as_ref()
    }
    vec![
        float("generator_cpu_seconds", true, |r| {
            g(r).map(|g| g.cpu_seconds)
        }),
        float("generator_cpu_share", true, |r| g(r).map(|g| g.cpu_share)),
        int("dispatch_lag_p50_us", true, |r| {
            g(r).and_then(|g| g.lag_us.p50)
        }),
        int("dispatch_lag_p99_us", true, |r| {
            g(r).and_then(|g| g.lag_us.p99)
        }),
        int("dispatch_lag_max_us", true, |r| {
            g(r).and_then(|g| g.lag_max_us)
        }),
        text("generator_warning", true, |r| {
            g(r).and_then(|g| g.warning.as_deref())
        }),
        text("throughput_scope", false, |_| Some(THROUGHPUT_SCOPE)),
    ]
}

/// An open-loop round's own numbers (null in closed rounds) and goodput (null without a
/// plan `slo`).
fn open_loop() -> Vec<RoundColumn> {
    fn o(r: &RoundMetrics) -> Option<&OpenMetrics> {
        r.open.as_ref()
    }
    fn g(r: &RoundMetrics) -> Option<&Goodput> {
        r.goodput.as_ref()
    }
    let mut v = vec![
        float("achieved_rate_per_second", true, |r| {
            o(r).and_then(|o| o.achieved_rate_per_second)
        }),
        float("scheduled_rate_per_second", true, |r| {
            o(r).and_then(|o| o.scheduled_rate_per_second)
        }),
    ];
    v.extend(percentiles("send_lag", |r| o(r).map(|o| &o.send_lag_us)));
    v.push(int("send_lag_max_us", true, |r| {
        o(r).and_then(|o| o.send_lag_max_us)
    }));
    v.extend(percentiles("latency_from_schedule", |r| {
        o(r).map(|o| &o.latency_from_schedule_us)
    }));
    v.extend([
        float("inter_arrival_cv", true, |r| {
            o(r).and_then(|o| o.inter_arrival_cv)
        }),
        float("scheduled_inter_arrival_cv", true, |r| {
            o(r).and_then(|o| o.scheduled_inter_arrival_cv)
        }),
        int("late_sends", true, |r| o(r).map(|o| o.late_sends as i64)),
        int("wake_floor_p99_us", true, |r| {
            o(r).and_then(|o| o.wake_floor_p99_us)
        }),
        flag_opt("saturated", |r| o(r).map(|o| o.saturated)),
        int("good_requests", true, |r| {
            g(r).map(|g| g.good_requests as i64)
        }),
        float("good_requests_per_second", true, |r| {
            g(r).and_then(|g| g.good_requests_per_second)
        }),
        int("slo_missed_ttft", true, |r| {
            g(r).and_then(|g| g.missed_ttft).map(|v| v as i64)
        }),
        int("slo_missed_tpot", true, |r| {
            g(r).and_then(|g| g.missed_tpot).map(|v| v as i64)
        }),
        int("slo_missed_e2e", true, |r| {
            g(r).and_then(|g| g.missed_e2e).map(|v| v as i64)
        }),
    ]);
    v
}

/// Every column of rounds.parquet, in file order.
fn columns() -> Vec<RoundColumn> {
    let mut v = counts();
    v.extend(latencies());
    v.extend(streams());
    v.extend(steady_state());
    v.extend(generator());
    v.extend(open_loop());
    v
}

/// Why rounds.parquet was not written.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RoundsFileError {
    /// The rounds did not make a batch of the file's schema.
    #[error("{0}")]
    Batch(#[from] arrow_schema::ArrowError),
    /// The file could not be created, written or finished.
    #[error("{0}")]
    File(#[source] crate::record::rundir::RunDirError),
}

/// Write `rounds` to `path` (through a temporary name, fsynced, renamed).
pub(crate) fn write_rounds_parquet(
    path: &Path,
    rounds: &[RoundMetrics],
) -> Result<(), RoundsFileError> {
    // `arm` only in a campaign: a plain plan's file keeps its columns.
    let campaign = rounds.iter().any(|r| r.arm.is_some());
    let cols: Vec<RoundColumn> = columns()
        .into_iter()
        .filter(|c| campaign || c.name != "arm")
        .collect();
    let schema = Arc::new(Schema::new(
        cols.iter()
            .map(|c| Field::new(&c.name, c.data_type.clone(), c.nullable))
            .collect::<Vec<_>>(),
    ));
    let arrays = cols.iter().map(|c| (c.fill)(rounds)).collect();
    let batch = RecordBatch::try_new(schema, arrays)?;
    crate::record::rundir::write_parquet(path, &batch).map_err(RoundsFileError::File)
}
