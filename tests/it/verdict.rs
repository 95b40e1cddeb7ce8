//! Campaigns II end to end: drift in campaign.json, a contract locked in at the start and
//! its verdict, `verdict` later (post hoc or not), and `compare` of two runs of one
//! workload (refusing two workloads).

use std::path::Path;

use serde_json::{Value, json};

use crate::support::*;

fn sha256_file(p: &Path) -> String {
    matrix_proxy::sha256_hex(&std::fs::read(p).unwrap())
}

#[test]
fn the_demo_campaign_with_its_contract_gives_drift_and_a_pre_registered_verdict() {
    let tmp = tempfile::tempdir().unwrap();
    let run_dir = tmp.path().join("run");
    let contract = Path::new("plans/campaign-demo.contract.json");
    let (code, stdout, stderr) = run(&[
        "replay",
        "plans/campaign-demo.json",
        "--contract",
        s(contract),
        "--out",
        s(&run_dir),
    ]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains("matrix-proxy: verdict: adopt (verdict.json)"),
        "{stderr}"
    );
    assert!(
        stdout.contains("verdict: adopt (quality lane pass, fit benefit yes)"),
        "{stdout}"
    );
    // The report puts the verdict first, each failing gate with its numbers (the mock
    // arms save no memory: the memory gate fails), before any chart; the arms' table has
    // the peak RSS the gate read.
    let html_path = tmp.path().join("report.html");
    let (code, _, stderr) = run(&["report", s(&run_dir), "--out", s(&html_path)]);
    assert_eq!(code, Some(0), "{stderr}");
    let html = std::fs::read_to_string(&html_path).unwrap();
    let first_gate = html
        .find("<b>fit_min_memory_reduction</b> fast-fit")
        .unwrap();
    let charts = html.find("id=\"charts\"").unwrap();
    assert!(first_gate < charts && html.find("Verdict of").unwrap() < first_gate);
    let gate_line = &html[first_gate..first_gate + html[first_gate..].find("</li>").unwrap()];
    assert!(
        gate_line.contains("c=1: ") && gate_line.contains("(limit "),
        "{gate_line}"
    );
    assert!(html.contains("<th>peak RSS MiB</th>"), "peak RSS column");
    // The number the gate read at c=1 (VRAM when both arms sampled it, else RSS) is the
    // arm's cell in campaign.json, and the table shows that cell's peaks in MiB.
    let k = read_json(&run_dir.join("campaign.json"));
    let arm = k["arms"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == "fast-fit")
        .unwrap();
    let cell = &arm["concurrency"]["1"];
    let (rss, vram) = (
        cell["peak_rss_bytes"].as_u64(),
        cell["peak_vram_bytes"].as_u64(),
    );
    assert!(
        [rss, vram]
            .into_iter()
            .flatten()
            .any(|b| gate_line.contains(&format!("c=1: {b} (limit "))),
        "{gate_line} {cell}"
    );
    let mib = |b: Option<u64>| match b {
        Some(b) => {
            let t = format!("{:.4}", b as f64 / 1048576.0);
            t.trim_end_matches('0').trim_end_matches('.').to_string()
        }
        None => "—".to_string(),
    };
    let row = html
        .lines()
        .find(|l| {
            l.starts_with("<tr><td>fast-fit</td><td>performance-fit</td><td>true</td><td>1</td>")
        })
        .unwrap_or_else(|| panic!("no fast-fit row at c=1"));
    assert!(
        row.contains(&format!("<td>{}</td><td>{}</td>", mib(rss), mib(vram))),
        "{row} {cell}"
    );
    let config = read_json(&run_dir.join("config.json"));
    assert_eq!(config["contract"]["sha256"], json!(sha256_file(contract)));
    assert_eq!(config["workload_sha256"].as_str().map(str::len), Some(64));

    // Drift: one entry per non-reference arm; 2 cases x 30 requests x 2 levels x 5
    // repetitions = 600 pairs each, of 32 distinct requests (30 prompts and 2 streamed).
    let c = read_json(&run_dir.join("campaign.json"));
    let drift = c["drift"].as_array().unwrap();
    assert_eq!(drift.len(), 2);
    let twin = &drift[0];
    assert_eq!(
        (
            &twin["arm"],
            &twin["compared_prompts"],
            &twin["exact_match_rate"],
            &twin["mean_similarity"],
            &twin["advisory"]
        ),
        (
            &json!("twin"),
            &json!(600),
            &json!(1.0),
            &json!(1.0),
            &json!(false)
        )
    );
    let fit = &drift[1];
    assert_eq!(
        (&fit["arm"], &fit["advisory"], &fit["exact_match_rate"]),
        (&json!("fast-fit"), &json!(true), &json!(0.0))
    );
    let sim = fit["mean_similarity"].as_f64().unwrap();
    assert!(sim > 0.0 && sim < 1.0, "{sim}");
    let prompts = fit["prompts"].as_array().unwrap();
    assert_eq!(prompts.len(), 600);
    assert_eq!(twin["distinct_requests"], json!(32));
    assert_eq!(fit["concurrency"]["1"]["distinct_requests"], json!(32));
    assert!(
        prompts
            .iter()
            .all(|p| p["first_divergence_char"].is_u64() && p["equal"] == json!(false))
    );
    assert_eq!(fit["concurrency"]["4"]["compared_prompts"], json!(300));
    // Every case weighs the same here (30 requests each): the case mean is the pooled rate.
    assert_eq!(fit["weights"]["by_case"].as_array().map(Vec::len), Some(2));
    assert_eq!(
        twin["weights"]["case_mean_exact_match_rate"],
        twin["exact_match_rate"]
    );
    // The reference against itself: 2 cases x 30 x 2 levels x 10 pairs of repetitions,
    // of the same 32 distinct requests.
    assert_eq!(c["drift_floor"]["compared_prompts"], json!(1200));
    assert_eq!(c["drift_floor"]["distinct_requests"], json!(32));
    // Intervals, paired (interleaved): five rounds a side give one for every value; the
    // fast arm's pooled decode is well clear of the reference's.
    assert_eq!(c["intervals"]["paired"], json!(true));
    let entries = c["intervals"]["entries"].as_array().unwrap();
    let pooled = entries
        .iter()
        .find(|e| {
            e["arm"] == json!("fast-fit")
                && e["concurrency"] == json!(1)
                && e["metric"] == json!("decode_pooled_tokens_per_sec")
        })
        .unwrap();
    let low = pooled["interval"]["low"].as_f64().unwrap();
    assert!(
        low > 1.5 && low <= pooled["ratio"].as_f64().unwrap(),
        "{pooled}"
    );
    assert_eq!(pooled["rounds_arm"], json!(10));
    assert!(
        stdout
            .contains("fast-fit vs reference c=1, paired rounds, 95 % intervals: pooled decode x"),
        "{stdout}"
    );

    // verdict.json: pre-registered, every gate, the verdict.
    let v = read_json(&run_dir.join("verdict.json"));
    assert_eq!(
        (
            &v["verdict"],
            &v["quality_lane_pass"],
            &v["fit_benefit"],
            &v["post_hoc"]
        ),
        (&json!("adopt"), &json!(true), &json!(true), &json!(false))
    );
    assert_eq!(v["contract_sha256"], json!(sha256_file(contract)));
    let gates: Vec<&str> = v["gates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["gate"].as_str().unwrap())
        .collect();
    assert_eq!(
        gates,
        [
            "quality_min_exact_match",
            "max_failed_requests",
            "fit_min_memory_reduction",
            "fit_min_decode_speedup",
            "max_p95_latency_ratio",
            "min_decode_ratio"
        ]
    );
    let speedup = &v["gates"][3]["arms"][0];
    assert_eq!(speedup["arm"], json!("fast-fit"));
    assert_eq!(
        speedup["levels"].as_array().unwrap().len(),
        2,
        "both levels compared"
    );
    // v1 has no gate on a fit arm's answers: it warns that fast-fit's are far off.
    assert_eq!(v["rules"]["contract_version"], json!(1));
    let warning = v["warnings"][0].as_str().unwrap();
    assert!(
        warning.contains("'fast-fit'") && warning.contains("below 0.5"),
        "{warning}"
    );
    // The v2 demo contract on the same run: floor-relative quality, intervals required,
    // and fit_min_mean_similarity fails fast-fit: no benefit, keep the reference.
    let v2_out = tmp.path().join("v2-verdict.json");
    let (code, v2_text, stderr) = run(&[
        "verdict",
        s(&run_dir),
        "--contract",
        "plans/campaign-demo.contract-v2.json",
        "--out",
        s(&v2_out),
    ]);
    assert_eq!(code, Some(0), "{stderr}");
    let v2 = read_json(&v2_out);
    assert_eq!(
        (
            &v2["verdict"],
            &v2["quality_lane_pass"],
            &v2["rules"]["contract_version"]
        ),
        (&json!("keep-reference"), &json!(true), &json!(2))
    );
    assert_eq!(v2["fit_arms"][0]["fit_min_mean_similarity"], json!(false));
    assert_eq!(v2["fit_arms"][0]["fit_min_decode_speedup"], json!(true));
    // A campaign.json written before drift counted distinct requests: its drift is
    // recomputed from the rows, never read as 0 requests (every floor gate n/a).
    let cpath = run_dir.join("campaign.json");
    let saved = std::fs::read(&cpath).unwrap();
    let mut old: Value = serde_json::from_slice(&saved).unwrap();
    for e in old["drift"].as_array_mut().unwrap() {
        e.as_object_mut().unwrap().remove("distinct_requests");
        for l in e["concurrency"].as_object_mut().unwrap().values_mut() {
            l.as_object_mut().unwrap().remove("distinct_requests");
        }
    }
    old["drift_floor"]
        .as_object_mut()
        .unwrap()
        .remove("distinct_requests");
    std::fs::write(&cpath, serde_json::to_vec(&old).unwrap()).unwrap();
    let again_out = tmp.path().join("v2-again.json");
    let args = [
        "verdict",
        s(&run_dir),
        "--contract",
        "plans/campaign-demo.contract-v2.json",
    ];
    let (code, _, stderr) = run(&[&args[..], &["--out", s(&again_out)]].concat());
    assert_eq!(code, Some(0), "{stderr}");
    let again = read_json(&again_out);
    assert_eq!(
        (&again["verdict"], &again["quality_lane_pass"]),
        (&json!("keep-reference"), &json!(true))
    );
    std::fs::write(&cpath, saved).unwrap();
    let speed = v2["gates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["gate"] == json!("fit_min_decode_speedup"))
        .unwrap();
    assert_eq!(
        speed["arms"][0]["levels"][0]["metric"],
        json!("decode_pooled_tokens_per_sec")
    );
    assert!(
        speed["arms"][0]["levels"][0]["interval"][0]
            .as_f64()
            .unwrap()
            > 1.1
    );
    assert!(
        v2_text.contains("rules (contract v2): quality floor-relative; ratio gates interval"),
        "{v2_text}"
    );

    // Later, with the same contract: not post hoc, same verdict, verdict.json again.
    std::thread::sleep(std::time::Duration::from_millis(5));
    let (code, _, stderr) = run(&["verdict", s(&run_dir), "--contract", s(contract)]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(!stderr.contains("post-hoc"), "{stderr}");
    let again = read_json(&run_dir.join("verdict.json"));
    assert_ne!(
        again["evaluated_at"], v["evaluated_at"],
        "the command wrote it anew"
    );
    assert_eq!(
        (&again["post_hoc"], &again["verdict"], &again["gates"]),
        (&json!(false), &v["verdict"], &v["gates"])
    );
    assert_eq!(again["run_ending"], json!("passed"));
    // Another contract (stricter, written after the fact): post hoc, with a warning, in
    // its own file; the pre-registered verdict is left alone.
    let mut strict: Value = read_json(contract);
    strict["thresholds"]["max_p95_latency_ratio"] = json!(0.1);
    let strict_path = write_plan(tmp.path(), "strict.json", &strict);
    let (code, stdout, stderr) = run(&["verdict", s(&run_dir), "--contract", s(&strict_path)]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("warning: post-hoc verdict"), "{stderr}");
    assert!(
        stdout.contains("verdict: optimize") && stdout.contains("POST HOC"),
        "{stdout}"
    );
    let late = read_json(&run_dir.join("verdict.post-hoc.json"));
    assert_eq!(
        (&late["post_hoc"], &late["verdict"]),
        (&json!(true), &json!("optimize"))
    );
    // A second post-hoc verdict gets a name of its own; the first is kept.
    let first = std::fs::read(run_dir.join("verdict.post-hoc.json")).unwrap();
    let (code, _, stderr) = run(&["verdict", s(&run_dir), "--contract", s(&strict_path)]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("verdict.post-hoc-2.json"), "{stderr}");
    assert_eq!(
        std::fs::read(run_dir.join("verdict.post-hoc.json")).unwrap(),
        first
    );
    assert_eq!(
        read_json(&run_dir.join("verdict.json"))["verdict"],
        json!("adopt")
    );
    // A contract locked after the run started, or for another plan, is refused.
    for (key, value, says) in [
        (
            "locked_at",
            json!("2099-01-01T00:00:00Z"),
            "is later than the run's start",
        ),
        ("plan_id", json!("another-plan"), "is not this plan's name"),
    ] {
        let mut bad: Value = read_json(contract);
        bad[key] = value;
        let p = write_plan(tmp.path(), "bad.json", &bad);
        let (code, _, stderr) = run(&["verdict", s(&run_dir), "--contract", s(&p)]);
        assert_eq!(code, Some(2), "{key}: {stderr}");
        assert!(stderr.contains(says), "{stderr}");
    }
}

#[test]
fn replay_refuses_a_contract_it_cannot_honour() {
    let tmp = tempfile::tempdir().unwrap();
    let contract: Value = read_json(Path::new("plans/campaign-demo.contract.json"));
    let cases = [
        // Another plan's contract.
        (
            "plans/campaign-demo.json",
            json!({"plan_id": "x"}),
            &[][..],
            "plan_id 'x' is not this plan's name ('campaign-demo')",
        ),
        // Locked after the start.
        (
            "plans/campaign-demo.json",
            json!({"locked_at": "2099-01-01T00:00:00Z"}),
            &[],
            "is later than the run's start",
        ),
        // A plain plan has no arms to gate.
        (
            "plans/demo.json",
            json!({"plan_id": "demo"}),
            &["--mock-worker"],
            "--contract goes with a campaign plan",
        ),
        // Drift needs the recorded answers.
        (
            "plans/campaign-demo.json",
            json!({}),
            &["--no-record"],
            "cannot be used with",
        ),
        // A malformed contract names its problems.
        (
            "plans/campaign-demo.json",
            json!({"thresholds": {"min_decode_ratio": "1"}}),
            &[],
            "thresholds.min_decode_ratio: must be a finite number",
        ),
    ];
    for (i, (plan, patch, flags, says)) in cases.into_iter().enumerate() {
        let mut c = contract.clone();
        for (k, v) in patch.as_object().unwrap() {
            c[k] = v.clone();
        }
        let p = write_plan(tmp.path(), &format!("c{i}.json"), &c);
        let out = tmp.path().join(format!("run{i}"));
        let mut args = vec!["replay", plan, "--contract", s(&p), "--out", s(&out)];
        args.extend_from_slice(flags);
        let (code, _, stderr) = run(&args);
        assert_eq!(code, Some(2), "{says}: {stderr}");
        assert!(stderr.contains(says), "{says}: {stderr}");
        assert!(
            !out.exists(),
            "nothing is created before the contract is accepted"
        );
    }
}

/// A plan whose oracle takes any answer text (so another text is drift, not a failure).
fn any_text_plan(requests: u64) -> Value {
    json!({
        "name": "any-text",
        "endpoint": "http://127.0.0.1:9/v1/chat/completions",
        "cases": [{"name": "chat",
                   "request": {"model": "mock", "messages": [{"role": "user", "content": "the capital?"}], "max_tokens": 6},
                   "ignore_paths": ["/id", "/created", "/choices/0/message/content"],
                   "expected_response": {"id": "x", "object": "chat.completion", "created": 0, "model": "mock",
                       "choices": [{"index": 0, "message": {"role": "assistant", "content": "x"}, "finish_reason": "length"}],
                       "usage": {"prompt_tokens": 2, "completion_tokens": 6, "total_tokens": 8}}}],
        "concurrency": [1, 2], "requests_per_case": requests, "repetitions": 2, "warmup_per_case": 2,
        "timeout_seconds": 5, "metadata": metadata(),
    })
}

async fn replay_against(
    dir: &Path,
    name: &str,
    plan: &Value,
    text_seed: u64,
    no_record: bool,
) -> std::path::PathBuf {
    let mock = start_mock(matrix_proxy::MockConfig {
        text_seed,
        ..Default::default()
    })
    .await;
    let path = write_plan(dir, &format!("{name}.json"), plan);
    let out = dir.join(name);
    let mut args = replay_args(&path, &out);
    args.endpoint = Some(format!("{}/v1/chat/completions", mock.url()));
    args.no_record = no_record;
    assert_eq!(replay(args).await.unwrap(), matrix_proxy::cli::Exit::Ok);
    mock.shutdown().await;
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compare_puts_two_runs_of_one_workload_side_by_side_and_refuses_two_workloads() {
    let tmp = tempfile::tempdir().unwrap();
    let plan = any_text_plan(4);
    let a = replay_against(tmp.path(), "a", &plan, 0, false).await;
    let same = replay_against(tmp.path(), "same", &plan, 0, false).await;
    let other = replay_against(tmp.path(), "other", &plan, 3, false).await;
    let out = tmp.path().join("compare.json");

    // Same recipe: every pair equal.
    let (code, stdout, stderr) = run(&["compare", s(&a), s(&same), "--out", s(&out)]);
    assert_eq!(code, Some(0), "{stderr}");
    let doc = read_json(&out);
    assert_eq!(
        (
            &doc["drift"][0]["compared_prompts"],
            &doc["drift"][0]["exact_match_rate"]
        ),
        (&json!(16), &json!(1.0)),
        "1 case x 4 x 2 levels x 2 repetitions"
    );
    assert!(stdout.contains("run vs run chat c=1"), "{stdout}");

    // Another text: drift, and every metric's delta with both spreads.
    let contract = json!({"contract_version": 1, "locked_at": "2026-01-01T00:00:00Z",
                          "locked_by": "test", "plan_id": "any-text"});
    let cpath = write_plan(tmp.path(), "contract.json", &contract);
    let args = ["compare", s(&a), s(&other), "--contract", s(&cpath)];
    // A comparison is never written over: an --out that exists is refused, and without
    // --out the next free name beside compare.json is taken.
    let (code, _, stderr) = run(&[&args[..], &["--out", s(&out)]].concat());
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("exists; a comparison is never written over"),
        "{stderr}"
    );
    let before = std::fs::read(&out).unwrap();
    let done = bin().args(args).current_dir(tmp.path()).output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&done.stdout).into_owned(),
        String::from_utf8_lossy(&done.stderr).into_owned(),
    );
    assert_eq!(done.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("written to compare-2.json"), "{stderr}");
    assert_eq!(std::fs::read(&out).unwrap(), before);
    let doc = read_json(&tmp.path().join("compare-2.json"));
    let d = &doc["drift"][0];
    assert_eq!(
        (&d["compared_prompts"], &d["advisory"]),
        (&json!(16), &json!(true))
    );
    assert!(d["exact_match_rate"].as_f64().unwrap() < 1.0, "{d}");
    let metrics = doc["metrics"].as_array().unwrap();
    assert_eq!(metrics.len(), 2, "one entry per (case, concurrency)");
    let rps = &metrics[0]["metrics"]["successful_requests_per_second"];
    for side in ["a", "b"] {
        assert_eq!(rps[side]["rounds"], json!(2), "{rps}");
        assert!(rps[side]["min"].as_f64().unwrap() <= rps[side]["max"].as_f64().unwrap());
    }
    let delta = rps["b"]["median"].as_f64().unwrap() - rps["a"]["median"].as_f64().unwrap();
    assert!((rps["delta"].as_f64().unwrap() - delta).abs() < 1e-9);
    // The contract on two runs is never pre-registered unless both were started with it.
    assert_eq!(doc["verdict"]["post_hoc"], json!(true));
    // Plain runs' levels are complete, so the ratio gates compare both of them.
    let latency = &doc["verdict"]["gates"][4];
    assert_eq!(latency["gate"], json!("max_p95_latency_ratio"));
    assert_eq!(
        latency["arms"][0]["levels"].as_array().unwrap().len(),
        2,
        "{latency}"
    );
    assert!(stderr.contains("warning: post-hoc verdict"), "{stderr}");
    assert!(stdout.contains("verdict: "), "{stdout}");

    // Another workload is refused, naming the first difference.
    let bigger = replay_against(tmp.path(), "bigger", &any_text_plan(5), 0, false).await;
    let out = tmp.path().join("bigger.json");
    let (code, _, stderr) = run(&["compare", s(&a), s(&bigger), "--out", s(&out)]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("ran different workloads")
            && stderr.contains("first differ at /requests_per_case (4 in"),
        "{stderr}"
    );

    // A run without recorded answers has nothing to compare: refused, not a reject.
    let norec = replay_against(tmp.path(), "norec", &plan, 0, true).await;
    let out = tmp.path().join("norec.json");
    let (code, _, stderr) = run(&["compare", s(&a), s(&norec), "--out", s(&out)]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("was made with --no-record"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compare_gives_each_delta_an_interval_and_says_when_it_shows_no_difference() {
    let tmp = tempfile::tempdir().unwrap();
    let mut plan = any_text_plan(4);
    plan["repetitions"] = json!(5);
    plan["concurrency"] = json!([1]);
    let run_with = |name: &'static str, prefill_ms: f64| {
        let dir = tmp.path().to_path_buf();
        let plan = plan.clone();
        async move {
            let mock = start_mock(matrix_proxy::MockConfig {
                prefill_ms,
                ..Default::default()
            })
            .await;
            let path = write_plan(&dir, &format!("{name}.json"), &plan);
            let out = dir.join(name);
            let mut args = replay_args(&path, &out);
            args.endpoint = Some(format!("{}/v1/chat/completions", mock.url()));
            assert_eq!(replay(args).await.unwrap(), matrix_proxy::cli::Exit::Ok);
            mock.shutdown().await;
            out
        }
    };
    let fast = run_with("fast", 5.0).await;
    let slow = run_with("slow", 60.0).await;
    let out = tmp.path().join("compare.json");
    let latency = |doc: &Value| doc["metrics"][0]["metrics"]["latency_p50_seconds"].clone();
    // A run against itself: each side's rounds are resampled on their own, so the
    // interval of the delta straddles 0: no difference shown.
    let (code, stdout, stderr) = run(&["compare", s(&fast), s(&fast), "--out", s(&out)]);
    assert_eq!(code, Some(0), "{stderr}");
    let l = latency(&read_json(&out));
    assert_eq!(l["difference_shown"], json!(false), "{l}");
    assert_eq!(l["interval"]["paired"], json!(false));
    assert_eq!(l["a"]["values"].as_array().map(Vec::len), Some(5));
    assert!(stdout.contains("no difference shown"), "{stdout}");
    // A v2 contract's floor-relative gate reads the floor of A's side (its answers
    // against its own repetitions: 4 slots x 10 pairs of repetitions), all of one request:
    // 40 pairs of 1 distinct request are too few to judge against.
    let contract = json!({"contract_version": 2, "locked_at": "2026-01-01T00:00:00Z",
        "locked_by": "test", "plan_id": "any-text",
        "thresholds": {"quality_max_exact_match_drop_vs_floor": 0.0}});
    let cpath = write_plan(tmp.path(), "v2.json", &contract);
    let args = ["compare", s(&fast), s(&fast), "--lane", "quality"];
    let out = tmp.path().join("compare-v2.json");
    let (code, _, stderr) =
        run(&[&args[..], &["--contract", s(&cpath), "--out", s(&out)]].concat());
    assert_eq!(code, Some(0), "{stderr}");
    let v = read_json(&out)["verdict"].clone();
    let level = &v["gates"][0]["arms"][0]["levels"][0];
    assert_eq!(
        v["gates"][0]["gate"],
        json!("quality_max_exact_match_drop_vs_floor")
    );
    assert_eq!(
        (
            &level["floor_pairs"],
            &level["floor_distinct_requests"],
            &level["pass"]
        ),
        (&json!(40), &json!(1), &Value::Null),
        "{v:#}"
    );
    assert!(
        level["note"]
            .as_str()
            .unwrap()
            .contains("40 pair(s) of the reference's answers from 1 distinct request(s)"),
        "{v:#}"
    );
    // A server 55 ms slower to its first byte: shown, the interval well above 0.
    let out = tmp.path().join("compare-slow.json");
    let (code, stdout, stderr) = run(&["compare", s(&fast), s(&slow), "--out", s(&out)]);
    assert_eq!(code, Some(0), "{stderr}");
    let l = latency(&read_json(&out));
    assert_eq!(l["difference_shown"], json!(true), "{l}");
    assert!(l["interval"]["low"].as_f64().unwrap() > 0.04, "{l}");
    let line = stdout
        .lines()
        .find(|x| x.trim_start().starts_with("p50 ms"))
        .unwrap_or_default();
    assert!(
        line.contains('[') && !line.contains("no difference"),
        "{stdout}"
    );
}
