//! Stream timing accuracy: how far matrix-proxy's per-event stamps are from the moment the
//! built-in mock wrote each event, on the same monotonic clock in the same process, and the
//! median TTFT / ITL it measures next to the mock's configured pace.
//!
//! Run: `cargo bench --bench stream_timing` (add `-- --requests N` for a longer run).
//! Prints a markdown table; nothing here is a pass/fail test (that is
//! tests/it/streaming.rs, with a 1 ms bound on the median error).

use std::sync::Arc;

use arrow_array::{Array, BinaryArray, Int64Array, ListArray};
use matrix_proxy::cli::{self, ReplayArgs};

/// `matrix-proxy replay --quiet --out OUT PLAN` as clap parses it.
fn replay_args(plan: &std::path::Path, out: &std::path::Path) -> ReplayArgs {
    use clap::Parser;
    let parsed = cli::Cli::try_parse_from([
        "matrix-proxy",
        "replay",
        "--quiet",
        "--out",
        out.to_str().expect("a UTF-8 temporary path"),
        plan.to_str().expect("a UTF-8 temporary path"),
    ])
    .expect("replay's flags");
    match parsed.command {
        cli::Command::Replay(a) => a,
        _ => unreachable!("a replay command line"),
    }
}
use matrix_proxy::{MockConfig, MockWorker, generate_text};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use serde_json::{Value, json};

const PREFILL_MS: f64 = 50.0;
const PER_TOKEN_MS: f64 = 10.0;
const TOKENS: u32 = 16;

fn pct(sorted: &[i64], p: u64) -> i64 {
    let rank = (p * sorted.len() as u64).div_ceil(100).max(1);
    sorted[(rank - 1) as usize]
}

fn main() {
    let mut requests: u64 = 24;
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--requests") {
        requests = args
            .get(i + 1)
            .and_then(|v| v.parse().ok())
            .unwrap_or(requests);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run(requests));
}

async fn run(requests: u64) {
    let mock = MockWorker::start(
        "127.0.0.1:0".parse().unwrap(),
        MockConfig {
            prefill_ms: PREFILL_MS,
            per_token_ms: PER_TOKEN_MS,
            max_batch: 64,
            ..MockConfig::default()
        },
    )
    .await
    .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let prompt = "measure every event";
    let plan = json!({
        "endpoint": format!("{}/v1/chat/completions", mock.url()),
        "connection": "keep-alive",
        "cases": [{"name": "stream",
            "request": {"model": "mock", "messages": [{"role": "user", "content": prompt}], "max_tokens": TOKENS, "stream": true},
            "expected_stream_text": generate_text(prompt, TOKENS)}],
        "concurrency": [1, 4], "requests_per_case": requests, "timeout_seconds": 30,
        "metadata": {"gpu": "N/A", "gpu_ids": "N/A", "driver": "N/A", "cuda": "N/A", "precision": "N/A",
            "model_revision": "mock", "runtime_revision": "mock", "cache_policy": "none",
            "cuda_evidence": "N/A", "reservation": "N/A", "host": "127.0.0.1"},
    });
    let plan_path = tmp.path().join("plan.json");
    std::fs::write(&plan_path, serde_json::to_vec(&plan).unwrap()).unwrap();
    let out = tmp.path().join("run");
    let exit = cli::replay_cmd(
        replay_args(&plan_path, &out),
        Arc::new(matrix_proxy::Shutdown::default()),
    )
    .await;
    assert!(matches!(exit, Ok(cli::Exit::Ok)), "replay failed: {exit:?}");
    let config: Value =
        serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
    let run_t0 = config["monotonic_start_ns"].as_i64().unwrap();

    let mut errors_us: Vec<i64> = Vec::new();
    let mut ttft_us: Vec<i64> = Vec::new();
    let mut itl_us: Vec<i64> = Vec::new();
    let mut rows = 0;
    for entry in std::fs::read_dir(out.join("exchanges")).unwrap() {
        let f = std::fs::File::open(entry.unwrap().path()).unwrap();
        for batch in ParquetRecordBatchReaderBuilder::try_new(f)
            .unwrap()
            .build()
            .unwrap()
        {
            let b = batch.unwrap();
            let col = |n: &str| b.column_by_name(n).unwrap().clone();
            let start = col("start_offset_us");
            let start = start.as_any().downcast_ref::<Int64Array>().unwrap();
            let events = col("event_offsets_us");
            let events = events.as_any().downcast_ref::<ListArray>().unwrap();
            let content = col("content_offsets_us");
            let content = content.as_any().downcast_ref::<ListArray>().unwrap();
            let body = col("response_body");
            let body = body.as_any().downcast_ref::<BinaryArray>().unwrap();
            for i in 0..b.num_rows() {
                if !events.is_valid(i) {
                    continue;
                }
                rows += 1;
                let text = String::from_utf8_lossy(body.value(i));
                let first = text.lines().find(|l| l.starts_with("data: {")).unwrap();
                let id: Value = serde_json::from_str(&first[6..]).unwrap();
                let written = mock.event_log(id["id"].as_str().unwrap()).unwrap();
                let ev = events.value(i);
                let ev = ev.as_any().downcast_ref::<Int64Array>().unwrap();
                let t0 = run_t0 + start.value(i) * 1000;
                for (m, w) in ev.values().iter().zip(&written) {
                    errors_us.push((t0 + m * 1000 - *w as i64) / 1000);
                }
                let c = content.value(i);
                let c = c
                    .as_any()
                    .downcast_ref::<Int64Array>()
                    .unwrap()
                    .values()
                    .to_vec();
                ttft_us.push(c[0]);
                itl_us.extend(c.windows(2).map(|w| w[1] - w[0]));
            }
        }
    }
    errors_us.sort_unstable();
    ttft_us.sort_unstable();
    itl_us.sort_unstable();
    let host = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    println!(
        "## Stream timing accuracy ({} streamed exchanges, {} events; {host}, {} CPUs)\n",
        rows,
        errors_us.len(),
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0)
    );
    println!(
        "Stamp error = matrix-proxy's stamp of an event - the mock's write time (same clock, same process).\n"
    );
    println!("| stamp error | p50 | p90 | p99 | max |");
    println!("|---|---|---|---|---|");
    println!(
        "| µs | {} | {} | {} | {} |",
        pct(&errors_us, 50),
        pct(&errors_us, 90),
        pct(&errors_us, 99),
        errors_us.last().unwrap()
    );
    println!("\n| measured vs configured | configured | median measured |");
    println!("|---|---|---|");
    println!(
        "| TTFT | {PREFILL_MS} ms | {:.2} ms |",
        pct(&ttft_us, 50) as f64 / 1000.0
    );
    println!(
        "| ITL | {PER_TOKEN_MS} ms | {:.2} ms |",
        pct(&itl_us, 50) as f64 / 1000.0
    );
    println!(
        "\nThe measured TTFT and ITL include the mock's own timer slack (tokio's 1 ms timer wheel), which the stamp error above does not: it is measured against the mock's actual write times."
    );
    mock.shutdown().await;
}
