//! The worker's own metrics (`--worker-metrics`): scraped from the mock's vLLM-style
//! `/metrics` on the run's clock into worker_metrics.parquet, at the interval and at the
//! edges of every measured round; a worker whose `/metrics` hangs or answers garbage costs
//! the run nothing.

use std::path::Path;

use arrow_array::{Array, Float64Array, Int64Array, MapArray, StringArray};
use serde_json::{Value, json};

use crate::support::*;

/// A streaming capture plan of one case at concurrency 1: 3 measured rounds of 6 requests.
fn stream_plan(url: &str) -> Value {
    json!({
        "name": "scrape",
        "endpoint": url,
        "cases": [{"name": "chat",
                   "request": {"model": "mock", "messages": [{"role": "user", "content": "count to six"}],
                               "max_tokens": 6, "stream": true}}],
        "concurrency": [1], "requests_per_case": 6, "repetitions": 3, "warmup_per_case": 2,
        "timeout_seconds": 5, "metadata": metadata(),
    })
}

/// One scrape row: offset, cause, metric, its `le` label, value.
type Row = (i64, String, String, Option<String>, f64);

fn scrape_rows(run: &Path) -> Vec<Row> {
    let mut out = Vec::new();
    for b in read_parquet(&run.join("worker_metrics.parquet")) {
        let col = |n: &str| b.column_by_name(n).unwrap().clone();
        let offset = col("offset_us");
        let offset = offset.as_any().downcast_ref::<Int64Array>().unwrap();
        let cause = col("cause");
        let cause = cause.as_any().downcast_ref::<StringArray>().unwrap();
        let metric = col("metric");
        let metric = metric.as_any().downcast_ref::<StringArray>().unwrap();
        let value = col("value");
        let value = value.as_any().downcast_ref::<Float64Array>().unwrap();
        let labels = col("labels");
        let labels = labels.as_any().downcast_ref::<MapArray>().unwrap();
        for i in 0..b.num_rows() {
            let m = labels.value(i);
            let keys = m.column(0).as_any().downcast_ref::<StringArray>().unwrap();
            let vals = m.column(1).as_any().downcast_ref::<StringArray>().unwrap();
            let le = (0..keys.len())
                .find(|j| keys.value(*j) == "le")
                .map(|j| vals.value(j).to_string());
            out.push((
                offset.value(i),
                cause.value(i).to_string(),
                metric.value(i).to_string(),
                le,
                value.value(i),
            ));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_workers_metrics_are_scraped_on_the_runs_clock_and_its_ttft_agrees_with_ours() {
    let tmp = tempfile::tempdir().unwrap();
    // A 150 ms prefill: the worker's TTFT and ours fall in vLLM's (0.1, 0.25] bucket, with
    // 100 ms to spare for a loaded machine.
    let mock = start_mock(matrix_proxy::MockConfig {
        prefill_ms: 150.0,
        per_token_ms: 2.0,
        ..Default::default()
    })
    .await;
    let plan = write_plan(
        tmp.path(),
        "p.json",
        &stream_plan(&format!("{}/v1/chat/completions", mock.url())),
    );
    let out = tmp.path().join("run");
    let mut args = replay_args(&plan, &out);
    args.worker_metrics = Some(format!("{}/metrics", mock.url()));
    args.scrape_interval = 0.2;
    assert_eq!(replay(args).await.unwrap(), matrix_proxy::cli::Exit::Ok);
    mock.shutdown().await;

    let rows = scrape_rows(&out);
    let scrapes = |cause: &str| {
        let mut at: Vec<i64> = rows.iter().filter(|r| r.1 == cause).map(|r| r.0).collect();
        at.dedup();
        at
    };
    // Every measured round has its own window: a scrape just before, one just after.
    let (starts, ends) = (scrapes("round_start"), scrapes("round_end"));
    assert_eq!((starts.len(), ends.len()), (3, 3), "{starts:?} {ends:?}");
    assert!(starts.iter().zip(&ends).all(|(s, e)| s < e));
    assert!(!scrapes("interval").is_empty());
    // The series a vLLM worker exports, with their kinds kept as rows.
    for name in [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:request_success_total",
        "vllm:time_to_first_token_seconds_bucket",
    ] {
        assert!(rows.iter().any(|r| r.2 == name), "{name}");
    }
    // Round 1: the worker's TTFT histogram over its window, against our TTFT p50.
    let bucket = |at: i64, le: &str| {
        rows.iter()
            .find(|r| {
                r.0 == at
                    && r.2 == "vllm:time_to_first_token_seconds_bucket"
                    && r.3.as_deref() == Some(le)
            })
            .map(|r| r.4)
            .unwrap()
    };
    let delta = |le: &str| bucket(ends[0], le) - bucket(starts[0], le);
    assert_eq!(delta("+Inf"), 6.0, "six requests in the round");
    // The worker's p50 bucket: the first bound whose cumulative count reaches half.
    let bounds = [
        "0.001", "0.005", "0.01", "0.02", "0.04", "0.06", "0.08", "0.1", "0.25", "0.5",
    ];
    let p50_bucket = bounds.iter().position(|b| delta(b) >= 3.0).unwrap();
    let hi: f64 = bounds[p50_bucket].parse().unwrap();
    let lo: f64 = if p50_bucket == 0 {
        0.0
    } else {
        bounds[p50_bucket - 1].parse().unwrap()
    };
    let summary = read_json(&out.join("summary.json"));
    let ours = summary["rounds"][0]["stream"]["ttft_seconds"]["p50"]
        .as_f64()
        .unwrap();
    assert!(
        lo < ours && ours <= hi,
        "ours {ours} outside the worker's ({lo}, {hi}]"
    );
    assert_eq!((lo, hi), (0.1, 0.25));

    // summary.json says the same per round: the worker's p50 interpolated inside that
    // bucket (recomputed here from the rows), and ours minus it within the bucket's width.
    let w = &summary["rounds"][0]["worker"];
    assert_eq!(w["server"], "vllm", "{w}");
    let ttft = &w["ttft_seconds"];
    assert_eq!(ttft["metric"], "vllm:time_to_first_token_seconds");
    assert_eq!(ttft["estimate"], "bucket-interpolated");
    assert_eq!(ttft["observations"], 6.0);
    assert_eq!(ttft["p50_bucket"], json!([lo, hi]));
    let below = delta(bounds[p50_bucket - 1]);
    let expect = lo + (hi - lo) * (3.0 - below) / (delta(bounds[p50_bucket]) - below);
    let worker_p50 = ttft["p50"].as_f64().unwrap();
    assert!(
        (worker_p50 - expect).abs() < 1e-9,
        "{worker_p50} vs {expect}"
    );
    assert_eq!(w["requests"], 6.0, "the success counter's delta: {w}");
    assert!(w["scrapes_in_window"].as_u64().unwrap() >= 2, "{w}");
    let running = w["running_mean"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&running), "concurrency 1: {running}");
    let two = &w["two_sided"]["ttft"];
    assert!(
        w["two_sided"]["scope"]
            .as_str()
            .unwrap()
            .starts_with("difference of p50s, not per request"),
        "{w}"
    );
    let diff = two["difference_seconds"].as_f64().unwrap();
    assert!((diff - (ours - worker_p50)).abs() < 1e-9, "{two}");
    assert_eq!(two["bucket_width_seconds"].as_f64().unwrap(), hi - lo);
    assert!(diff.abs() <= hi - lo, "{two}");
    assert!(w["two_sided"]["e2e"]["difference_seconds"].is_f64(), "{w}");
    // Every round has its window.
    for r in summary["rounds"].as_array().unwrap() {
        assert_eq!(r["worker"]["ttft_seconds"]["observations"], 6.0, "{r}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_metrics_hang_or_are_garbage_costs_the_run_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    // One /metrics answers HTML, the other accepts and never answers.
    let garbage = raw_peer(|_| {
        b"HTTP/1.1 200 OK\r\ncontent-length: 24\r\n\r\n<html>not metrics</html>"[..].to_vec()
    })
    .await;
    let hang = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hang_addr = hang.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((tcp, _)) = hang.accept().await {
            held.push(tcp);
        }
    });
    for (name, metrics, says) in [
        ("garbage", garbage, "no line could be read (line 1"),
        ("hang", hang_addr, "no answer within 200ms"),
    ] {
        let out = tmp.path().join(name);
        let flag = format!("--worker-metrics=http://{metrics}/metrics");
        let (code, _, err) = run(&[
            "replay",
            "plans/demo.json",
            "--mock-worker",
            "--quiet",
            &flag,
            "--scrape-interval",
            "0.2",
            "--scrape-timeout",
            "0.2",
            "--out",
            s(&out),
        ]);
        assert_eq!(code, Some(0), "{name}: {err}");
        // Every scrape failed, each counted, the first reason said; every exchange ok.
        assert!(
            err.contains("failed (first: ") && err.contains(says),
            "{name}: {err}"
        );
        let summary = read_json(&out.join("summary.json"));
        for r in summary["rounds"].as_array().unwrap() {
            assert_eq!(
                r["successful_requests"], r["planned_requests"],
                "{name}: {r}"
            );
        }
        assert!(scrape_rows(&out).is_empty(), "{name}");
    }
}

#[test]
fn the_scraper_reads_our_own_metrics_listen_and_a_bad_url_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    // A free port for our own --metrics-listen, scraped by the same run.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let out = tmp.path().join("run");
    let listen = format!("127.0.0.1:{port}");
    let flag = format!("--worker-metrics=http://127.0.0.1:{port}/metrics");
    let (code, _, err) = run(&[
        "replay",
        "plans/demo.json",
        "--mock-worker",
        "--quiet",
        "--metrics-listen",
        &listen,
        &flag,
        "--scrape-interval",
        "0.2",
        "--out",
        s(&out),
    ]);
    assert_eq!(code, Some(0), "{err}");
    let rows = scrape_rows(&out);
    assert!(
        rows.iter().any(|r| r.2 == "matrix_proxy_requests_total"),
        "our own series, read by our own reader"
    );
    // Without a URL, the mock's own /metrics (on the endpoint's origin).
    let out = tmp.path().join("bare");
    let (code, _, err) = run(&[
        "replay",
        "plans/demo.json",
        "--mock-worker",
        "--quiet",
        "--worker-metrics",
        "--out",
        s(&out),
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        scrape_rows(&out)
            .iter()
            .any(|r| r.2 == "vllm:num_requests_running")
    );
    // A URL that is not one is a usage error before anything exists.
    let out = tmp.path().join("bad");
    let (code, _, err) = run(&[
        "replay",
        "plans/demo.json",
        "--mock-worker",
        "--worker-metrics=ftp://x/metrics",
        "--out",
        s(&out),
    ]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--worker-metrics"), "{err}");
    assert!(!out.exists());
}
