//! From traffic to a frozen plan: capture plans record answers without judging them, and
//! `freeze` turns recorded exchanges (live traffic through serve, a capture run) into a
//! plan whose oracles are the recorded answers and whose ignore paths come from evidence.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};

use crate::support::*;

/// `matrix-proxy ARGS` with `env` set, off the async runtime.
async fn run_env(args: Vec<String>, env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    tokio::task::spawn_blocking(move || {
        let out = bin().args(&args).envs(env).output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    })
    .await
    .unwrap()
}

fn args(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

/// A freeze command line without its `--out FILE`.
fn to_stdout_args(freeze: &[String]) -> Vec<String> {
    let at = freeze.iter().position(|a| a == "--out").unwrap();
    let mut v = freeze.to_vec();
    v.drain(at..at + 2);
    v
}

fn chat(prompt: &str, stream: bool) -> Bytes {
    let mut body = json!({"model": "m", "max_tokens": 6,
                          "messages": [{"role": "user", "content": prompt}]});
    if stream {
        body["stream"] = json!(true);
    }
    Bytes::from(body.to_string())
}

/// POST `body` as JSON with a bearer token, on `client`; the answer must be a 200.
async fn post(client: &mut Client, addr: std::net::SocketAddr, path: &str, body: Bytes) -> Bytes {
    let mut req = request("POST", addr, path, body);
    let h = req.headers_mut();
    h.insert("content-type", "application/json".parse().unwrap());
    h.insert("authorization", "Bearer sk-live-SECRET-31".parse().unwrap());
    h.insert("x-stainless-retry-count", "0".parse().unwrap());
    let (status, _, body) = client.send(req).await.unwrap();
    assert_eq!(status, 200, "{body:?}");
    body
}

/// A plan's ignore paths at `at` (a JSON pointer to a list), as strings.
fn list(plan: &Value, at: &str) -> Vec<String> {
    plan.pointer(at)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_traffic_through_serve_freezes_into_a_plan_that_replays_green() {
    let tmp = tempfile::tempdir().unwrap();
    let mock = start_mock(matrix_proxy::MockConfig::default()).await;
    let live = tmp.path().join("live");
    let serve = Serve::start(serve_args(&mock.url(), &live)).await;
    let mut client = Client::connect(serve.addr).await;
    // Mixed traffic: two routes, streaming and not, prompts asked more than once.
    for _ in 0..2 {
        for prompt in ["colours of the sea", "name a river"] {
            post(
                &mut client,
                serve.addr,
                "/v1/chat/completions",
                chat(prompt, false),
            )
            .await;
        }
        post(
            &mut client,
            serve.addr,
            "/v1/chat/completions",
            chat("count", true),
        )
        .await;
        let completion = json!({"model": "m", "prompt": "once upon", "max_tokens": 4});
        post(
            &mut client,
            serve.addr,
            "/v1/completions",
            Bytes::from(completion.to_string()),
        )
        .await;
    }
    // A failed exchange is counted, never frozen.
    let mut bad = request("POST", serve.addr, "/v1/chat/completions", chat("x", false));
    bad.headers_mut()
        .insert("x-mock-fault", "http500".parse().unwrap());
    let (status, _, _) = client.send(bad).await.unwrap();
    assert_eq!(status, 500);
    drop(client);
    serve.stop().await.unwrap();

    let plan = tmp.path().join("frozen.json");
    let freeze = args(&["freeze", s(&live), "--out", s(&plan)]);
    // The traffic carried a bearer token: the plan must name where replay reads one.
    let (code, _, err) = run_env(freeze.clone(), &[]).await;
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--bearer-token-env NAME"), "{err}");
    assert!(!plan.exists());
    let mut with_env = freeze.clone();
    with_env.extend(args(&["--bearer-token-env", "FREEZE_TOKEN"]));
    let (code, _, err) = run_env(with_env.clone(), &[]).await;
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains("froze 4 distinct request(s) in 2 case(s) from 8 of 9 recorded exchange(s)"),
        "{err}"
    );
    assert!(err.contains("left out: 1 exchange(s): status 500"), "{err}");
    assert!(
        err.contains("0 of 4 requests answered differently on repeat"),
        "{err}"
    );
    assert!(
        err.contains("written as \"unknown: not recorded by the capture\""),
        "{err}"
    );
    // An existing plan is never replaced (it may hold the user's edits); stdout gets
    // the same bytes.
    let frozen_bytes = std::fs::read(&plan).unwrap();
    std::fs::write(&plan, b"{\"edited\": true}").unwrap();
    let (code, _, err) = run_env(with_env.clone(), &[]).await;
    assert_eq!(code, Some(2), "{err}");
    assert_eq!(std::fs::read(&plan).unwrap(), b"{\"edited\": true}");
    std::fs::write(&plan, &frozen_bytes).unwrap();
    let (code, stdout, _) = run_env(to_stdout_args(&with_env), &[]).await;
    assert_eq!(code, Some(0));
    let bytes = std::fs::read(&plan).unwrap();
    assert_eq!(
        stdout.as_bytes(),
        &bytes[..],
        "two freezes of one run are byte-identical"
    );
    let text = String::from_utf8(bytes).unwrap();
    assert!(
        !text.contains("SECRET") && !text.contains("<redacted>"),
        "{text}"
    );

    // --metadata states the setup; --endpoint re-aims the plan (cases keep their paths).
    let meta = tmp.path().join("setup.json");
    std::fs::write(&meta, metadata().to_string()).unwrap();
    let mut restated = to_stdout_args(&with_env);
    restated.extend(args(&[
        "--metadata",
        s(&meta),
        "--endpoint",
        "http://localhost:9/v9",
    ]));
    let (code, stdout, err) = run_env(restated, &[]).await;
    assert_eq!(code, Some(0), "{err}");
    assert!(!err.contains("unknown: not recorded"), "{err}");
    assert!(
        err.contains(
            "requests_per_case 6: every measured round sends each of the 4 distinct request(s)"
        ),
        "{err}"
    );
    let restated: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(restated["metadata"], metadata());
    assert_eq!(restated["endpoint"], json!("http://localhost:9/v9"));
    assert_eq!(restated["cases"][0]["path"], json!("/v1/chat/completions"));
    std::fs::write(&meta, json!({"gpu_ids": [0, 1]}).to_string()).unwrap();
    let mut bad_meta = to_stdout_args(&with_env);
    bad_meta.extend(args(&["--metadata", s(&meta)]));
    let (code, _, err) = run_env(bad_meta, &[]).await;
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("gpu_ids must be strings"), "{err}");

    let p: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(p["endpoint"], json!(mock.url() + "/"));
    assert_eq!(p["auth"], json!({"bearer_token_env": "FREEZE_TOKEN"}));
    assert_eq!(p["concurrency"], json!([1, 4]));
    // Every measured round sends every distinct request: 3 chat variants and 1
    // completion, at levels up to 4, need 6 per round (a multiple of 3 and of 1).
    assert_eq!(p["requests_per_case"], json!(6));
    let names: Vec<&str> = p["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["v1/chat/completions", "v1/completions"]);
    let chat_case = &p["cases"][0];
    assert_eq!(chat_case["path"], json!("/v1/chat/completions"));
    assert_eq!(
        chat_case["headers"],
        Value::Null,
        "client headers are not frozen"
    );
    assert_eq!(chat_case["variants"].as_array().unwrap().len(), 3);
    let stream = &chat_case["variants"][2];
    assert_eq!(stream["request"]["stream"], json!(true));
    assert_eq!(
        stream["expected_stream_text"],
        json!(matrix_proxy::generate_text("count", 6))
    );
    // Each request was answered twice; the answers differed only in the stamps.
    assert_eq!(list(&p, "/ignore_paths"), ["/created", "/id"]);
    assert_eq!(
        p["cases"][0]["variants"][0]["expected_response"]["choices"][0]["message"]["content"],
        json!(matrix_proxy::generate_text("colours of the sea", 6))
    );

    let (code, _, err) = run(&["validate", s(&plan)]);
    assert_eq!(code, Some(0), "{err}");
    let out = tmp.path().join("replay");
    let (code, table, err) = run_env(
        args(&["replay", s(&plan), "--out", s(&out)]),
        &[("FREEZE_TOKEN", "sk-replay-SECRET-32")],
    )
    .await;
    assert_eq!(code, Some(0), "every oracle passes: {err}\n{table}");
    let summary = read_json(&out.join("summary.json"));
    assert_eq!(summary["ending"], json!("passed"));
    assert_eq!(
        summary["cases"],
        json!([{"name": "v1/chat/completions", "judged": "oracle"},
               {"name": "v1/completions", "judged": "oracle"}])
    );
    assert!(!table.contains("judged"), "{table}");
    // The token reached the worker, and never the disk.
    assert!(mock.seen().iter().any(|r| {
        r.headers
            .iter()
            .any(|(k, v)| k == "authorization" && v == "Bearer sk-replay-SECRET-32")
    }));
    mock.shutdown().await;
}

/// serve's arguments in front of `upstream` with `extra` flags.
fn serve_with(
    upstream: &str,
    out: &std::path::Path,
    extra: &[&str],
) -> matrix_proxy::cli::ServeArgs {
    use clap::Parser;
    let mut argv = vec![
        "matrix-proxy",
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--quiet",
    ];
    argv.extend(["--upstream", upstream, "--out", s(out)]);
    argv.extend(extra);
    match matrix_proxy::cli::Cli::try_parse_from(argv)
        .unwrap()
        .command
    {
        matrix_proxy::cli::Command::Serve(a) => a,
        _ => unreachable!(),
    }
}

/// A worker that stamps `id`, `created` and its own queue time on every answer, and
/// answers the prompt "dice" with other text each time.
async fn stamping_worker() -> std::net::SocketAddr {
    let n = Arc::new(AtomicU64::new(0));
    http_server(move |req: hyper::Request<hyper::body::Incoming>| {
        let n = n.clone();
        async move {
            let body = req.into_body().collect().await.unwrap().to_bytes();
            let asked: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let prompt = asked
                .pointer("/messages/0/content")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            let k = n.fetch_add(1, Ordering::SeqCst);
            let text = if prompt == "dice" {
                format!("rolled {k}")
            } else {
                format!("echo {prompt}")
            };
            let answer = json!({
                "id": format!("w-{k}"), "object": "chat.completion", "created": 1_700_000_000 + k,
                "model": "w",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                             "finish_reason": "stop"}],
                "timing": {"queue_s": 0.25 + k as f64},
            });
            hyper::Response::builder()
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from(answer.to_string())))
                .unwrap()
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeats_teach_the_volatile_leaves_and_show_nondeterminism() {
    let tmp = tempfile::tempdir().unwrap();
    let worker = stamping_worker().await;
    let upstream = format!("http://{worker}");
    let mut runs = Vec::new();
    for name in ["one", "two"] {
        let out = tmp.path().join(name);
        let serve = Serve::start(serve_with(
            &upstream,
            &out,
            &["--redact-header", "x-tenant-key"],
        ))
        .await;
        let mut client = Client::connect(serve.addr).await;
        for prompt in ["hello", "dice"] {
            let mut req = request(
                "POST",
                serve.addr,
                "/v1/chat/completions",
                chat(prompt, false),
            );
            req.headers_mut()
                .insert("content-type", "application/json".parse().unwrap());
            req.headers_mut()
                .insert("x-tenant", "blue".parse().unwrap());
            req.headers_mut()
                .insert("x-tenant-key", "tk-SECRET-77".parse().unwrap());
            assert_eq!(client.send(req).await.unwrap().0, 200);
        }
        drop(client);
        serve.stop().await.unwrap();
        runs.push(out);
    }

    // One run: each request answered once, so only the documented stamps are ignored
    // (the worker's queue time is not known to change), and the output says so.
    let (code, stdout, err) = run(&["freeze", s(&runs[0])]);
    assert_eq!(code, Some(0), "{err}");
    let once: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(list(&once, "/ignore_paths"), ["/created", "/id"]);
    assert!(
        err.contains("documented volatile fields (/id, /created"),
        "{err}"
    );
    assert!(
        err.contains("0 of 0 requests answered differently on repeat"),
        "{err}"
    );
    // A bearer variable that is no environment variable name is refused up front.
    let (code, _, bad) = run(&["freeze", s(&runs[0]), "--bearer-token-env", "1BAD"]);
    assert_eq!(code, Some(2));
    assert!(bad.contains("not an environment variable name"), "{bad}");
    // A non-secret header the client sent stays with its case; one the run redacted
    // (--redact-header) never reaches the plan, not even as `<redacted>`.
    assert_eq!(once["cases"][0]["headers"], json!({"x-tenant": "blue"}));
    assert!(
        !stdout.contains("<redacted>") && !stdout.contains("x-tenant-key"),
        "{stdout}"
    );
    assert!(
        err.contains("warning: requests carried x-tenant-key (secret; recorded as <redacted>)"),
        "{err}"
    );

    // Two runs: the stamps that differed are learnt, exactly those; the prompt answered
    // differently is named as nondeterministic and frozen from its first answer.
    let (code, stdout, err) = run(&["freeze", s(&runs[0]), s(&runs[1])]);
    assert_eq!(code, Some(0), "{err}");
    let twice: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(
        list(&twice, "/ignore_paths"),
        ["/created", "/id", "/timing/queue_s"]
    );
    assert_eq!(
        twice["cases"][0]["variants"][0]["ignore_paths"],
        Value::Null
    );
    assert!(
        err.contains("1 of 2 requests answered differently on repeat"),
        "{err}"
    );
    assert!(
        err.contains("ignore paths learnt from repeated answers: /timing/queue_s;"),
        "{err}"
    );
    assert!(
        err.contains(
            "case 'v1/chat/completions' variant 'v2': 1 of 2 answers differed from the first, first at /choices/0/message/content"
        ),
        "{err}"
    );
    assert_eq!(
        twice["cases"][0]["variants"][1]["expected_response"]["choices"][0]["message"]["content"],
        json!("rolled 1")
    );
    let description = twice["description"].as_str().unwrap();
    for run in &runs {
        let id = read_json(&run.join("config.json"))["run_id"].clone();
        assert!(description.contains(id.as_str().unwrap()), "{description}");
    }
    // The frozen plan replays: the deterministic prompt passes, the dice one fails its
    // oracle exactly where freeze said it would.
    let plan = write_plan(tmp.path(), "twice.json", &twice);
    let out = tmp.path().join("replay");
    let (code, _, err) = run(&["replay", "-q", s(&plan), "--out", s(&out)]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("variant 'v2'") && err.contains("/choices/0/message/content"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capture_plan_records_without_judging_and_freezes_into_oracles() {
    let tmp = tempfile::tempdir().unwrap();
    let capture = json!({
        "endpoint": "http://127.0.0.1:9/v1/chat/completions",
        "concurrency": [1, 2], "requests_per_case": 4, "timeout_seconds": 10,
        // A top-level list needs no oracle to resolve in.
        "ignore_paths": ["/id"],
        "metadata": metadata(),
        "cases": [{"name": "chat", "variants": [
            {"name": "plain", "request": {"model": "m", "max_tokens": 5,
                                          "messages": [{"role": "user", "content": "a b"}]}},
            {"name": "streamed", "request": {"model": "m", "max_tokens": 5, "stream": true,
                                             "messages": [{"role": "user", "content": "c"}]}}]}]
    });
    let plan = write_plan(tmp.path(), "capture.json", &capture);
    let (code, _, err) = run(&["validate", s(&plan)]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains("capture plan: answers are recorded, not judged"),
        "{err}"
    );
    // A contract has nothing to gate.
    let (code, _, err) = run(&[
        "replay",
        s(&plan),
        "--mock-worker",
        "--contract",
        "plans/campaign-demo.contract.json",
        "--out",
        s(&tmp.path().join("never")),
    ]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("this is a capture plan"), "{err}");
    assert!(!tmp.path().join("never").exists());

    let out = tmp.path().join("capture");
    let (code, table, err) = run(&["replay", s(&plan), "--mock-worker", "--out", s(&out)]);
    assert_eq!(code, Some(0), "every exchange completed: {err}");
    assert!(table.contains("not judged"), "{table}");
    assert!(
        table.contains("not judged: a capture plan's answers are recorded"),
        "{table}"
    );
    let summary = read_json(&out.join("summary.json"));
    assert_eq!(summary["cases"], json!([{"name": "chat", "judged": false}]));
    let (code, _, err) = run(&["report", s(&out)]);
    assert_eq!(code, Some(0), "{err}");
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(html.contains("chat not judged"), "the report says it too");

    let frozen = tmp.path().join("frozen.json");
    let (code, _, err) = run(&["freeze", s(&out), "--out", s(&frozen)]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains("metadata: taken from the replayed plan"),
        "{err}"
    );
    let p = read_json(&frozen);
    assert_eq!(
        p["metadata"],
        metadata(),
        "the capture's provenance carries over"
    );
    assert_eq!(
        p["cases"][0]["variants"][1]["expected_stream_text"],
        json!(matrix_proxy::generate_text("c", 5))
    );
    let again = tmp.path().join("again");
    let (code, _, err) = run(&[
        "replay",
        "-q",
        s(&frozen),
        "--mock-worker",
        "--out",
        s(&again),
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        read_json(&again.join("summary.json"))["cases"],
        json!([{"name": "v1/chat/completions", "judged": "oracle"}])
    );
}

#[test]
fn a_plain_plan_judges_every_request_or_none() {
    let tmp = tempfile::tempdir().unwrap();
    let mixed = json!({
        "endpoint": "http://127.0.0.1:9/v1", "concurrency": [1], "requests_per_case": 1,
        "timeout_seconds": 1, "metadata": metadata(),
        "cases": [{"name": "judged", "request": {}, "expected_response": {}},
                  {"name": "forgot", "request": {}}]
    });
    let plan = write_plan(tmp.path(), "mixed.json", &mixed);
    let (code, _, err) = run(&["validate", s(&plan)]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("cases[1].expected_response: is required")
            && err.contains("a plain plan judges every request or none"),
        "{err}"
    );
}

#[test]
fn a_campaign_run_freezes_its_reference_or_the_arm_named() {
    let tmp = tempfile::tempdir().unwrap();
    let recipe = |q: &str| {
        json!({"runtime": "matrix-proxy mock", "weight_format": "none",
               "weight_quantization": q, "device": "cpu"})
    };
    let arm = |name: &str, reference: bool, seed: &str| {
        json!({"name": name, "lane": if reference { "quality" } else { "performance-fit" },
               "reference": reference, "recipe": recipe(name),
               "endpoint": "http://127.0.0.1:{port}/v1/chat/completions",
               "start": {"command": ["{self}", "mock-worker", "--listen", "127.0.0.1:{port}",
                                     "--text-seed", seed]}})
    };
    // No oracle: the reference's answers are the baseline (judged by drift).
    let campaign = json!({
        "name": "freeze-arms",
        "arms": [arm("ref", true, "0"), arm("other", false, "5")],
        "cases": [{"name": "chat", "request": {"messages": [{"role": "user", "content": "hi"}],
                                               "max_tokens": 4}}],
        "concurrency": [1], "requests_per_case": 2, "timeout_seconds": 10,
        "metadata": metadata(),
    });
    let plan = write_plan(tmp.path(), "campaign.json", &campaign);
    let out = tmp.path().join("run");
    let (code, _, err) = run(&["replay", "-q", s(&plan), "--out", s(&out)]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        read_json(&out.join("summary.json"))["cases"],
        json!([{"name": "chat", "judged": "drift"}])
    );
    let endpoint_of = |name: &str| {
        let c = read_json(&out.join("campaign.json"));
        let arms = c["arms"].as_array().unwrap().clone();
        let a = arms.into_iter().find(|a| a["name"] == json!(name)).unwrap();
        a["endpoint"].as_str().unwrap().to_string()
    };
    let content = |p: &Value| p["expected_response"]["choices"][0]["message"]["content"].clone();

    let (code, stdout, err) = run(&["freeze", s(&out)]);
    assert_eq!(code, Some(0), "{err}");
    let reference: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(reference["endpoint"], json!(endpoint_of("ref")));
    assert_eq!(
        content(&reference["cases"][0]),
        json!(matrix_proxy::generate_text("hi", 4))
    );
    assert!(err.contains("exchange(s) of other arms not read"), "{err}");
    assert!(
        reference["description"]
            .as_str()
            .unwrap()
            .contains("(arm ref; plan sha256 "),
        "{reference}"
    );

    let (code, stdout, err) = run(&["freeze", s(&out), "--arm", "other"]);
    assert_eq!(code, Some(0), "{err}");
    let other: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(other["endpoint"], json!(endpoint_of("other")));
    assert_ne!(content(&other["cases"][0]), content(&reference["cases"][0]));

    let (code, _, err) = run(&["freeze", s(&out), "--arm", "nope"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("has arms ref, other (default: the reference)"),
        "{err}"
    );
}

/// Issue 44's freeze minors, on one serve run: a config.json of a newer schema version is
/// frozen with a warning naming the file and both versions; an exchange id read twice
/// (a part copied) and a url whose authority does not parse (`http://[::1`, which was
/// taken for the path `/`) refuse the freeze, naming the id, the files and the url.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn freeze_warns_of_a_newer_schema_and_refuses_repeated_ids_and_unreadable_urls() {
    let tmp = tempfile::tempdir().unwrap();
    let mock = start_mock(matrix_proxy::MockConfig::default()).await;
    let live = tmp.path().join("live");
    let serve = Serve::start(serve_args(&mock.url(), &live)).await;
    let mut client = Client::connect(serve.addr).await;
    for prompt in ["one", "two"] {
        let mut req = request(
            "POST",
            serve.addr,
            "/v1/chat/completions",
            chat(prompt, false),
        );
        req.headers_mut()
            .insert("content-type", "application/json".parse().unwrap());
        assert_eq!(client.send(req).await.unwrap().0, 200);
    }
    drop(client);
    serve.stop().await.unwrap();
    let freeze = || run_env(args(&["freeze", s(&live)]), &[]);

    // A newer schema: frozen, and said.
    let config_path = live.join("config.json");
    let config = std::fs::read_to_string(&config_path).unwrap();
    let ours = read_json(&config_path)["schema_version"].clone();
    assert_eq!(ours, json!("1"));
    let newer = config.replace(r#""schema_version": "1""#, r#""schema_version": "7""#);
    assert_ne!(newer, config);
    std::fs::write(&config_path, newer).unwrap();
    let (code, plan, err) = freeze().await;
    assert_eq!(code, Some(0), "{err}");
    assert!(plan.contains("/v1/chat/completions"));
    let warning = format!(
        "warning: {}: schema_version \"7\" is newer than this matrix-proxy's \"1\"",
        config_path.display()
    );
    assert!(err.contains(&warning), "{err}");
    std::fs::write(&config_path, &config).unwrap();
    let (code, _, err) = freeze().await;
    assert_eq!(code, Some(0), "{err}");
    assert!(!err.contains("schema_version"), "{err}");

    // A part copied beside itself: every exchange id twice.
    let parts = part_files(&live);
    assert_eq!(parts.len(), 1, "{parts:?}");
    let copy = live.join("exchanges").join("part-00001.parquet");
    std::fs::copy(&parts[0], &copy).unwrap();
    let ids = Rows::read_file(&parts[0]).i64s("exchange_id");
    let (code, plan, err) = freeze().await;
    assert_eq!(code, Some(2), "{err}");
    assert!(plan.is_empty());
    let said = format!(
        "exchange_id {} is recorded in {} and again in {}",
        ids[0].unwrap(),
        parts[0].display(),
        copy.display()
    );
    assert!(err.contains(&said), "{said}: {err}");
    std::fs::remove_file(&copy).unwrap();

    // A url whose authority does not parse.
    let part = set_str(&live, "url", 1, "http://[::1");
    let (code, plan, err) = freeze().await;
    assert_eq!(code, Some(2), "{err}");
    assert!(plan.is_empty());
    let said = format!(
        "{}: exchange_id {}: url \"http://[::1\" is not an absolute http(s) URL",
        part.display(),
        ids[1].unwrap()
    );
    assert!(err.contains(&said), "{said}: {err}");
}
