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
    args.scrape.worker_metrics = Some(format!("{}/metrics", mock.url()));
    args.scrape.scrape_interval = Some(0.2);
    args.scrape.gpu_metrics = Some("off".into());
    assert_eq!(replay(args).await.unwrap(), matrix_proxy::cli::Exit::Ok);
    mock.shutdown().await;

    let rows = scrape_rows(&out);
    let scrapes = |cause: &str| {
        // The file is in the order the scrapes ended: sorted here.
        let mut at: Vec<i64> = rows.iter().filter(|r| r.1 == cause).map(|r| r.0).collect();
        at.sort_unstable();
        at.dedup();
        at
    };
    // Every measured round has its own window: a scrape just before, one just after.
    let (starts, ends) = (scrapes("round_start"), scrapes("round_end"));
    assert_eq!((starts.len(), ends.len()), (3, 3), "{starts:?} {ends:?}");
    assert!(starts.iter().zip(&ends).all(|(s, e)| s < e));
    // The interval scrapes come at the interval (0.2 s): their median gap, with room for a
    // loaded machine (a late tick delays the next, never bunches them).
    let interval = scrapes("interval");
    assert!(interval.len() >= 3, "{interval:?}");
    let mut gaps: Vec<i64> = interval.windows(2).map(|w| w[1] - w[0]).collect();
    gaps.sort_unstable();
    let median = gaps[gaps.len() / 2];
    assert!(
        (180_000..=500_000).contains(&median),
        "median gap {median} µs: {gaps:?}"
    );
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
    // Every round has its window; its prompt was served in the warm-up already, so every
    // prompt token of a measured round is a prefix-cache hit; the mock never preempts.
    for r in summary["rounds"].as_array().unwrap() {
        let w = &r["worker"];
        assert_eq!(w["ttft_seconds"]["observations"], 6.0, "{r}");
        assert_eq!(w["prefix_cache_hit_rate"], 1.0, "{w}");
        assert_eq!(w["preemptions"], 0.0, "{w}");
        assert_eq!(w["generation_tokens"], 36.0, "six tokens each: {w}");
        assert!(
            w["kv_cache_usage_mean"].as_f64().unwrap() <= 1.0 / 256.0,
            "{w}"
        );
    }
    assert!(!out.join("gpu.parquet").exists(), "--gpu-metrics off");
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

/// Scrapes the inventive worker below answered.
static INVENTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// 1,500 new label sets of vLLM's running gauge at every scrape (past the 1,000 series of
/// one metric held for the reports).
fn inventive_metrics(_: &str) -> Vec<u8> {
    let k = INVENTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut body = String::from("# TYPE vllm:num_requests_running gauge\n");
    for i in 0..1500 {
        body.push_str(&format!(
            "vllm:num_requests_running{{model_name=\"m\",id=\"{k}-{i}\"}} 1\n"
        ));
    }
    format!(
        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_inventing_label_sets_is_held_within_the_cap_said_once_and_written_whole() {
    let tmp = tempfile::tempdir().unwrap();
    let metrics = raw_peer(inventive_metrics).await;
    let out = tmp.path().join("run");
    let plan = tmp.path().join("plan.json");
    let tiny = json!({
        "name": "tiny",
        "endpoint": "http://127.0.0.1:8000/v1/chat/completions",
        "cases": [{"name": "chat",
                   "request": {"model": "mock", "messages": [{"role": "user", "content": "hi"}],
                               "max_tokens": 2}}],
        "concurrency": [1], "requests_per_case": 2, "repetitions": 2, "warmup_per_case": 2,
        "timeout_seconds": 5, "metadata": metadata(),
    });
    std::fs::write(&plan, tiny.to_string()).unwrap();
    let flag = format!("--worker-metrics=http://{metrics}/metrics");
    let (code, _, err) = run(&[
        "replay",
        s(&plan),
        "--mock-worker",
        "--quiet",
        &flag,
        "--out",
        s(&out),
    ]);
    assert_eq!(code, Some(0), "{err}");
    // Said once when reached, and counted at the end.
    assert_eq!(err.matches("held for the reports").count(), 1, "{err}");
    assert!(err.contains("not held for the worker's numbers"), "{err}");
    let summary = read_json(&out.join("summary.json"));
    let limits = &summary["worker_metrics_limits"];
    assert!(
        limits["cap_reached"]
            .as_str()
            .is_some_and(|w| w.contains("1000 series of one metric")),
        "{summary}"
    );
    let not_held = limits["samples_not_held"].as_u64().unwrap();
    // Every sample is still in the file; of every scrape's 1,500 only 1,000 series held.
    let rows = scrape_rows(&out).len();
    assert!(rows >= 2 * 1500 && rows.is_multiple_of(1500), "{rows}");
    assert_eq!(not_held as usize, rows - 1000, "{summary}");
    assert_eq!(limits["samples_not_written"], 0);
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
    // A tuning flag with nothing to scrape would do nothing: refused.
    let (code, _, err) = run(&[
        "replay",
        "plans/demo.json",
        "--mock-worker",
        "--scrape-interval",
        "0.5",
        "--out",
        s(&out),
    ]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("--scrape-interval goes with --worker-metrics"),
        "{err}"
    );
    assert!(!out.exists());
}

/// `plans/demo.json` with `worker_metrics: true` (the endpoint origin's /metrics).
fn demo_scraped(dir: &Path) -> std::path::PathBuf {
    let mut plan: Value =
        serde_json::from_slice(&std::fs::read("plans/demo.json").unwrap()).unwrap();
    plan["worker_metrics"] = json!(true);
    write_plan(dir, "demo-scraped.json", &plan)
}

#[test]
fn a_plans_worker_metrics_field_scrapes_and_nvidia_smi_on_path_yields_gpu_parquet() {
    let tmp = tempfile::tempdir().unwrap();
    let plan = demo_scraped(tmp.path());
    let fake = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fake-gpu");
    let path = format!("{}:{}", fake.display(), std::env::var("PATH").unwrap());
    let out = tmp.path().join("gpu");
    let o = bin()
        .env("PATH", path)
        .args([
            "replay",
            "--mock-worker",
            "--scrape-interval",
            "0.1",
            "--out",
        ])
        .arg(&out)
        .arg(&plan)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(err.contains("GPU telemetry: "), "{err}");
    // The plan's own field scraped the mock (no flag given).
    assert!(
        scrape_rows(&out)
            .iter()
            .any(|r| r.2 == "vllm:num_requests_running")
    );
    let gpu = Rows::read_file(&out.join("gpu.parquet"));
    let (metric, gpu_ix, offset, source) = (
        gpu.strs("metric"),
        gpu.i32s("gpu"),
        gpu.i64s("offset_us"),
        gpu.strs("source"),
    );
    assert!(
        gpu.len() >= 2 * 13,
        "two GPUs, several samples: {}",
        gpu.len()
    );
    assert!(source.iter().all(|s| s.as_deref() == Some("nvidia-smi")));
    let count = |m: &str, g: i32| {
        (0..gpu.len())
            .filter(|i| metric[*i].as_deref() == Some(m) && gpu_ix[*i] == Some(g))
            .count()
    };
    assert!(count("utilization.gpu", 0) >= 2);
    assert_eq!(count("utilization.gpu", 0), count("utilization.gpu", 1));
    assert!(count("power.draw", 0) >= 2);
    assert_eq!(count("power.draw", 1), 0, "[N/A] is left out, not a zero");
    assert!(
        offset.windows(2).all(|w| w[0] <= w[1]),
        "on the run's clock"
    );

    // Without nvidia-smi: said once, not an error, and no gpu.parquet.
    let out = tmp.path().join("no-gpu");
    let o = bin()
        .env("PATH", "/nonexistent")
        .args(["replay", "--mock-worker", "--out"])
        .arg(&out)
        .arg(&plan)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert_eq!(
        err.matches("no GPU telemetry: nvidia-smi is not on PATH")
            .count(),
        1,
        "{err}"
    );
    assert!(!out.join("gpu.parquet").exists());
    assert!(out.join("worker_metrics.parquet").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_scrapes_the_upstreams_metrics_over_the_whole_run_as_one_window() {
    let tmp = tempfile::tempdir().unwrap();
    let mock = start_mock(matrix_proxy::MockConfig {
        prefill_ms: 150.0,
        ..Default::default()
    })
    .await;
    let out = tmp.path().join("live");
    let mut args = serve_args(&mock.url(), &out);
    args.scrape.worker_metrics = Some(String::new());
    args.scrape.scrape_interval = Some(0.1);
    args.scrape.gpu_metrics = Some("off".into());
    let serve = Serve::start(args).await;
    let mut c = Client::connect(serve.addr).await;
    let body = r#"{"model":"mock","messages":[{"role":"user","content":"hi"}],"max_tokens":3,"stream":true}"#;
    for _ in 0..4 {
        let (status, _, _) = c
            .send(request("POST", serve.addr, "/v1/chat/completions", body))
            .await
            .unwrap();
        assert_eq!(status, 200);
    }
    serve.stop().await.unwrap();
    mock.shutdown().await;
    let rows = scrape_rows(&out);
    let causes: std::collections::BTreeSet<&str> = rows.iter().map(|r| r.1.as_str()).collect();
    assert!(
        causes.contains("run_start") && causes.contains("run_end"),
        "{causes:?}"
    );
    let summary = read_json(&out.join("summary.json"));
    let w = &summary["worker"];
    assert_eq!(w["requests"], 4.0, "the whole run is one window: {w}");
    assert_eq!(w["ttft_seconds"]["observations"], 4.0, "{w}");
    assert_eq!(w["ttft_seconds"]["p50_bucket"], json!([0.1, 0.25]), "{w}");
    let two = &w["two_sided"]["ttft"];
    assert!(
        two["difference_seconds"].as_f64().unwrap().abs() <= 0.15,
        "{two}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_without_metrics_is_said_once_counted_and_not_asked_again() {
    // A worker that answers everything but /metrics (404): a server started without its
    // metrics. Six measured rounds would scrape it twelve times at their edges alone.
    let echo = echo_handler();
    let handler: Handler = std::sync::Arc::new(move |i: usize, seen: &Seen| {
        if seen.path == "/metrics" {
            return Reply::bytes(404, b"not found".to_vec());
        }
        echo(i, seen)
    });
    let peer = Peer::start(handler).await;
    let tmp = tempfile::tempdir().unwrap();
    let mut plan = echo_plan(peer.url("/echo"), "keep-alive", 1, 4);
    plan["concurrency"] = json!([1, 2]);
    plan["repetitions"] = json!(3);
    let path = write_plan(tmp.path(), "p.json", &plan);
    let out = tmp.path().join("run");
    let args: Vec<String> = vec![
        "replay".into(),
        s(&path).into(),
        "--quiet".into(),
        "--worker-metrics".into(),
        "--gpu-metrics".into(),
        "off".into(),
        "--out".into(),
        s(&out).into(),
    ];
    // The binary runs off the runtime's threads: the peer answers on them meanwhile.
    let (code, _, err) = tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run(&args)
    })
    .await
    .unwrap();
    assert_eq!(code, Some(0), "{err}");
    // Said at the first failure, and when scraping gave up: once each.
    let url = peer.url("/metrics");
    let first = format!("matrix-proxy: worker metrics: the scrape of {url} failed: status 404");
    assert_eq!(err.matches(&first).count(), 1, "{err}");
    assert_eq!(
        err.matches("not scraped again this run").count(),
        1,
        "{err}"
    );
    // Asked 3 times; a 4th only when an interval scrape was already on its way beside a
    // round's edge scrape as the third 404 came (it is counted too).
    let asked = peer
        .seen()
        .iter()
        .filter(|r| r.method == "GET" && r.path == "/metrics")
        .count();
    assert!((3..=4).contains(&asked), "{asked} scrapes of /metrics");
    let summary = read_json(&out.join("summary.json"));
    let all = summary["worker_metrics_scrapes"].as_array().unwrap();
    assert_eq!(all.len(), 1, "one scraped worker: {summary}");
    let h = &all[0];
    assert_eq!(
        (
            &h["arm"],
            &h["url"],
            &h["scrapes"],
            &h["failed"],
            &h["first_failure"]
        ),
        (
            &Value::Null,
            &json!(url),
            &json!(asked),
            &json!(asked),
            &json!("status 404")
        ),
        "{h}"
    );
    assert!(
        h["stopped"]
            .as_str()
            .is_some_and(|w| w.contains("3 scrapes in a row answered status 404")),
        "{h}"
    );
    // The missing metrics cost the run nothing: every round ran whole.
    let rounds = summary["rounds"].as_array().unwrap();
    assert_eq!(rounds.len(), 6, "{summary}");
    for r in rounds {
        assert_eq!(r["successful_requests"], r["planned_requests"], "{r}");
    }
    assert!(scrape_rows(&out).is_empty());
    // summarize rebuilds summary.json from the rows, which do not hold the scrapes: they
    // are carried over from the run's own summary.
    let (code, err) = summarize(&out);
    assert_eq!(code, Some(0), "{err}");
    let rebuilt = read_json(&out.join("summary.json"));
    assert_eq!(
        rebuilt["worker_metrics_scrapes"], summary["worker_metrics_scrapes"],
        "{rebuilt}"
    );
}
