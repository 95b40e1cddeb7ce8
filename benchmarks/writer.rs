//! The Parquet sink alone: how many exchanges per second the recorder's writer thread
//! turns into finished, fsynced zstd Parquet parts, for 1 KiB and 64 KiB bodies, and how
//! much memory it holds over a million rows.
//!
//! `cargo bench --bench writer` (criterion; add `-- --quick` for a short run). Before the
//! criterion groups it pushes 3,000,000 rows through one recorder and prints the resident
//! memory after every tenth: the writer's memory must not grow with the run's length.
//! Issue 5's target: >= 200,000 small exchanges/s on one core (`taskset -c 0`).
//!
//! Rows look like serve's: six request headers, five response headers, a URL, an empty
//! request body and a response body of the given size, every timing column set. They are
//! built before the clock starts; the timed part is submitting them and `finish()`, which
//! waits until the writer has encoded, compressed, written, fsynced and renamed every part.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use criterion::{BatchSize, Criterion, Throughput, criterion_group};
use http::{HeaderMap, HeaderValue, Method};
use matrix_proxy::{ExchangeRecord, Outcome, Phase, Recorder, RecorderOptions, Timings, WireHead};

/// The binary's allocator, so the bench measures what `matrix-proxy` does.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn row(i: i64, body: &Bytes, run_id: &Arc<str>) -> ExchangeRecord {
    let mut req = HeaderMap::new();
    req.insert("host", HeaderValue::from_static("127.0.0.1:8080"));
    req.insert("user-agent", HeaderValue::from_static("wrk/4.2.0"));
    req.insert("accept", HeaderValue::from_static("*/*"));
    req.insert("x-forwarded-for", HeaderValue::from_static("127.0.0.1"));
    req.insert("x-forwarded-proto", HeaderValue::from_static("http"));
    req.insert(
        "forwarded",
        HeaderValue::from_static("for=127.0.0.1;proto=http;host=\"127.0.0.1:8080\""),
    );
    // The response head as nginx writes it, kept as read; a Date that changes every second.
    let resp = WireHead::new(Bytes::from(format!(
        "HTTP/1.1 200 OK\r\nServer: nginx/1.22.1\r\nDate: Mon, 30 Nov 2026 01:{:02}:{:02} GMT\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: keep-alive\r\n\r\n",
        (i / 60_000) % 60,
        (i / 1000) % 60,
        body.len()
    )));
    ExchangeRecord {
        run_id: run_id.clone(),
        exchange_id: i,
        phase: Phase::Live,
        arm: None,
        case_name: None,
        variant: None,
        concurrency: None,
        target_rate_per_second: None,
        repetition: None,
        dispatch_index: i % 5000,
        worker: (i % 64) as i32,
        connection_id: Some(i % 64),
        connection_reused: true,
        connection_retried: false,
        started_at_us: 1_796_000_000_000_000 + i * 40,
        start_offset_us: i * 40,
        scheduled_offset_us: None,
        method: Method::GET,
        url: "http://127.0.0.1:18080/v1/chat/completions".into(),
        request_headers: Arc::new(req),
        request_body: Bytes::new(),
        request_body_len: 0,
        request_body_truncated: false,
        status: Some(200),
        response_head: resp,
        response_body: body.clone(),
        response_body_len: body.len() as i64,
        response_body_truncated: false,
        timings: Timings {
            connect_us: None,
            tls_us: None,
            tls_resumed: None,
            request_sent_us: Some(3 + i % 7),
            first_byte_us: Some(40 + i % 13),
            first_body_us: Some(41 + i % 13),
            total_us: Some(42 + i % 17),
            downstream_done_us: Some(45 + i % 19),
        },
        stream: None,
        outcome: Outcome::Ok,
        error_message: None,
        oracle_mismatch_pointer: None,
        decisions: None,
        prompt_tokens_planned: None,
        answer_usage: None,
        oracle_passed: None,
        session_id: None,
        turn: None,
        cached_prompt_tokens: None,
        session_lag_us: None,
        oracle_detail: None,
        usage_from_body: false,
        memory: None,
    }
}

/// A body of `n` bytes that compresses like a model's JSON answer would (not all zeros).
fn body(n: usize) -> Bytes {
    let text = "{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion\",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"The quick brown fox jumps over the lazy dog, 0123456789. ";
    let mut v = Vec::with_capacity(n);
    let mut k = 0u32;
    while v.len() < n {
        v.extend_from_slice(text.as_bytes());
        k = k.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        v.extend_from_slice(format!("{k:08x} ").as_bytes());
    }
    v.truncate(n);
    Bytes::from(v)
}

fn recorder(dir: &std::path::Path, queue: usize) -> Recorder {
    let mut opts = RecorderOptions::new(dir.to_path_buf());
    opts.queue_rows = queue;
    Recorder::start(opts).expect("start recorder")
}

fn sink(c: &mut Criterion) {
    let run_id: Arc<str> = Arc::from("bench-run-2026-11-30T01-00-00Z-0123abcd");
    let mut g = c.benchmark_group("writer");
    g.sample_size(10);
    g.measurement_time(Duration::from_secs(10));
    for (label, size, rows) in [("1KiB", 1024usize, 50_000usize), ("64KiB", 64 << 10, 4_000)] {
        let b = body(size);
        // Setup (untimed): a recorder and the rows; timed: submit them all and finish.
        let run = |bench: &mut criterion::Bencher| {
            bench.iter_batched(
                || {
                    let dir = tempfile::tempdir().expect("tempdir");
                    let rec = recorder(dir.path(), rows);
                    let batch: Vec<ExchangeRecord> =
                        (0..rows as i64).map(|i| row(i, &b, &run_id)).collect();
                    (dir, rec, batch)
                },
                |(dir, rec, batch)| {
                    for r in batch {
                        assert!(rec.try_submit(r).expect("writer running"));
                    }
                    black_box(rec.finish().expect("finish"));
                    dir
                },
                BatchSize::PerIteration,
            );
        };
        g.throughput(Throughput::Elements(rows as u64));
        g.bench_function(format!("{label} bodies, exchanges"), run);
        g.throughput(Throughput::Bytes((rows * size) as u64));
        g.bench_function(format!("{label} bodies, body bytes"), run);
    }
    g.finish();
}

fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// Rows generated on the fly and submitted with back-pressure (as serve's `block`
/// policy does), through one recorder; returns (rows written, seconds, resident memory in
/// KiB after every tenth of the run).
fn long_run(rows: u64) -> (u64, f64, Vec<u64>) {
    let run_id: Arc<str> = Arc::from("bench-run-2026-11-30T01-00-00Z-0123abcd");
    let b = body(1024);
    let dir = tempfile::tempdir().expect("tempdir");
    let rec = recorder(dir.path(), 4096);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let t0 = matrix_proxy::now_ns();
    let mut rss = Vec::new();
    rt.block_on(async {
        for i in 0..rows as i64 {
            rec.submit(row(i, &b, &run_id))
                .await
                .expect("writer running");
            if (i as u64 + 1).is_multiple_of((rows / 10).max(1)) {
                rss.push(status_kib("VmRSS:"));
            }
        }
    });
    let stats = rec.finish().expect("finish");
    let secs = (matrix_proxy::now_ns() - t0) as f64 / 1e9;
    (stats.rows, secs, rss)
}

criterion_group!(benches, sink);

fn main() {
    if !std::env::args().any(|a| a == "--list") {
        // First, before criterion allocates its batches: resident memory through one
        // 3M-row run, after every tenth of it. Bounded memory means flat after warm-up.
        let (written, secs, rss) = long_run(3_000_000);
        let mib: Vec<String> = rss
            .iter()
            .map(|k| format!("{:.0}", *k as f64 / 1024.0))
            .collect();
        println!(
            "long run: {written} rows of 1 KiB in {secs:.2} s ({:.0} rows/s, producer and writer together); resident MiB after each tenth: {}; peak {:.0} MiB",
            written as f64 / secs,
            mib.join(" "),
            status_kib("VmHWM:") as f64 / 1024.0
        );
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
