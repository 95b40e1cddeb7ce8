//! Secrets never reach disk: a bearer token named by the user is sent on every phase,
//! and no output file holds it or a cookie, while a non-secret canary is found, so the
//! search itself is proven to work. Parquet is decoded, not grepped (zstd hides bytes).

use std::sync::Arc;

use matrix_proxy::cli::Exit;
use serde_json::json;

use crate::support::*;

const TOKEN: &str = "sk-test-SECRET-token-4242";
const COOKIE: &str = "session=COOKIE-SECRET-77";
const CANARY: &str = "canary-visible-9137";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bearer_token_is_sent_but_never_written() {
    let peer = Peer::start(Arc::new(|_, s: &Seen| {
        let mut r = Reply::json(200, &json!({"ok": true}));
        if s.method == "POST" {
            r.headers.push(("set-cookie", COOKIE.into()));
            r.headers.push(("x-response-canary", CANARY.into()));
        }
        r
    }))
    .await;
    let tmp = tempfile::tempdir().unwrap();
    let plan = json!({
        "endpoint": peer.url("/v1/x"),
        "auth": {"bearer_token_env": "MATRIX_TEST_TOKEN_A"},
        "cases": [{"name": "a", "request": {"q": 1}, "expected_response": {"ok": true},
                   "headers": {"x-canary": CANARY}}],
        "concurrency": [1], "requests_per_case": 2, "timeout_seconds": 2, "metadata": metadata(),
    });
    let path = write_plan(tmp.path(), "p.json", &plan);
    let out = tmp.path().join("run");
    // SAFETY of the test: only this test reads or writes this variable.
    unsafe { std::env::set_var("MATRIX_TEST_TOKEN_A", TOKEN) };
    assert_eq!(replay(replay_args(&path, &out)).await.unwrap(), Exit::Ok);

    // Sent on every phase, health included.
    let seen = peer.seen();
    assert_eq!(seen.len(), 1 + 1 + 2 + 1 + 2 * 2);
    for s in &seen {
        let auth: Vec<&str> = s
            .headers
            .iter()
            .filter(|(k, _)| k == "authorization")
            .map(|(_, v)| v.as_str())
            .collect();
        assert_eq!(
            auth,
            vec![format!("Bearer {TOKEN}").as_str()],
            "{} {}",
            s.method,
            s.path
        );
    }
    // Redacted in the rows, and the canary is there.
    let rows = Rows::read(&out);
    let req_h = rows.headers("request_headers");
    let resp_h = rows.headers("response_headers");
    assert_eq!(req_h.len(), rows.len());
    for h in &req_h {
        let auth: Vec<&[u8]> = h
            .iter()
            .filter(|(k, _)| k == "authorization")
            .map(|(_, v)| v.as_slice())
            .collect();
        assert_eq!(auth, vec![b"<redacted>".as_slice()]);
    }
    assert!(
        resp_h
            .iter()
            .flatten()
            .any(|(k, v)| k == "set-cookie" && v == b"<redacted>")
    );

    // Decode every output file and search it.
    let mut texts: Vec<String> = Vec::new();
    let mut files = Vec::new();
    for entry in walk(&out) {
        let name = entry.to_string_lossy().into_owned();
        if name.ends_with(".parquet") {
            texts.extend(all_text(&read_parquet(&entry)));
        } else {
            texts.push(String::from_utf8_lossy(&std::fs::read(&entry).unwrap()).into_owned());
        }
        files.push(name);
    }
    assert!(files.len() >= 5, "{files:?}");
    let all = texts.join("\n");
    assert!(
        all.contains(CANARY),
        "the search must find the non-secret canary"
    );
    assert!(!all.contains(TOKEN), "the token reached disk");
    assert!(!all.contains("COOKIE-SECRET"), "the cookie reached disk");
    let config = read_json(&out.join("config.json"));
    assert_eq!(
        config["extra"]["auth"]["bearer_token_env"],
        json!("MATRIX_TEST_TOKEN_A")
    );
    assert_eq!(config["extra"]["auth"]["bearer_token_sent"], json!(true));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unusable_tokens_are_refused_before_any_output_exists() {
    let tmp = tempfile::tempdir().unwrap();
    let plan = json!({
        "endpoint": "http://127.0.0.1:9/v1/x",
        "cases": [{"name": "a", "request": {}, "expected_response": {}}],
        "concurrency": [1], "requests_per_case": 1, "timeout_seconds": 2, "metadata": metadata(),
    });
    let path = write_plan(tmp.path(), "p.json", &plan);
    unsafe { std::env::set_var("MATRIX_TEST_TOKEN_CTRL", "abc\u{7}def") };
    unsafe { std::env::remove_var("MATRIX_TEST_TOKEN_UNSET") };
    for (var, msg) in [
        ("MATRIX_TEST_TOKEN_CTRL", "must hold printable ASCII"),
        ("MATRIX_TEST_TOKEN_UNSET", "is not set"),
    ] {
        let out = tmp.path().join(var);
        let mut args = replay_args(&path, &out);
        args.bearer_token_env = Some(var.into());
        let err = replay(args).await.unwrap_err();
        assert_eq!(err.exit, Exit::Usage);
        assert!(
            err.message.contains(msg) && err.message.contains("--bearer-token-env"),
            "{}",
            err.message
        );
        assert!(
            !err.message.contains("abc"),
            "the token's value is never echoed"
        );
        assert!(!out.exists(), "no output before validation passed");
    }
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// Issue 44 item 4: a query name a server decodes to a secret name (`api%5Fkey`,
/// `%61pi_key`, mixed case) is redacted like the plain one, as are `x-goog-api-key` and
/// `x-auth-token`; nothing of them is in the run's bytes or its decoded Parquet values,
/// and a freeze of the run carries neither a secret nor `<redacted>`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn encoded_query_names_and_vendor_key_headers_never_reach_disk_or_a_plan() {
    const SECRET: &str = "sk-SECRET-q";
    let tmp = tempfile::tempdir().unwrap();
    let mock = start_mock(matrix_proxy::MockConfig::default()).await;
    let out = tmp.path().join("live");
    let serve = Serve::start(serve_args(&mock.url(), &out)).await;
    let mut client = Client::connect(serve.addr).await;
    let queries = [
        "api_key",
        "API_Key",
        "api%5Fkey",
        "api%5fkey",
        "%61pi_key",
        "%41pi%5FKEY",
        "%61%70%69%5f%6b%65%79",
        "access%5Ftoken",
        "t%6Fken",
    ];
    let body = || {
        json!({"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
            .to_string()
    };
    let send = |path: String, headers: Vec<(&'static str, String)>| {
        let mut req = request("POST", serve.addr, &path, body());
        req.headers_mut()
            .insert("content-type", "application/json".parse().unwrap());
        for (k, v) in headers {
            req.headers_mut().insert(k, v.parse().unwrap());
        }
        req
    };
    for (i, name) in queries.iter().enumerate() {
        let path = format!("/v1/chat/completions?x={CANARY}&{name}={SECRET}{i}-end&y=1");
        let (status, _, _) = client.send(send(path, vec![])).await.unwrap();
        assert_eq!(status, 200, "{name}");
    }
    // Header names are case-insensitive on the wire: the mixed-case spelling is the one sent.
    for (i, name) in ["X-Goog-Api-Key", "x-auth-token", "X-AUTH-TOKEN"]
        .iter()
        .enumerate()
    {
        let h = vec![(*name, format!("{SECRET}h{i}-end"))];
        let (status, _, _) = client
            .send(send("/v1/chat/completions".into(), h))
            .await
            .unwrap();
        assert_eq!(status, 200, "{name}");
    }
    // One clean request, which a freeze keeps.
    let path = format!("/v1/chat/completions?x={CANARY}");
    assert_eq!(client.send(send(path, vec![])).await.unwrap().0, 200);
    drop(client);
    serve.stop().await.unwrap();

    // Every URL kept its parameter name as sent, with the value replaced.
    let rows = Rows::read(&out);
    let urls: Vec<String> = rows.strs("url").into_iter().flatten().collect();
    assert_eq!(urls.len(), queries.len() + 4, "{urls:?}");
    for name in queries {
        let redacted = format!("&{name}=<redacted>&y=1");
        assert!(
            urls.iter().any(|u| u.ends_with(&redacted)),
            "{name}: {urls:?}"
        );
    }
    for h in &rows.headers("request_headers") {
        for (k, v) in h {
            if k == "x-goog-api-key" || k == "x-auth-token" {
                assert_eq!(v, b"<redacted>", "{k}");
            }
        }
    }
    // Raw bytes of every file, and every decoded Parquet value.
    let mut texts = Vec::new();
    for file in walk(&out) {
        let raw = std::fs::read(&file).unwrap();
        let name = file.display().to_string();
        assert!(
            !raw.windows(SECRET.len()).any(|w| w == SECRET.as_bytes()),
            "{name} holds a secret's bytes"
        );
        if name.ends_with(".parquet") {
            texts.extend(all_text(&read_parquet(&file)));
        }
    }
    let all = texts.join("\n");
    assert!(all.contains(CANARY), "the search must find the canary");
    assert!(all.contains("x-goog-api-key"), "the header's name is kept");
    assert!(!all.contains(SECRET), "a secret reached a Parquet value");

    // freeze leaves every request whose URL held a secret out (counted), and the headers.
    let args = ["freeze".to_string(), out.display().to_string()];
    let (code, plan, err) = tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run(&args)
    })
    .await
    .unwrap();
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains(&format!(
            "left out: {} exchange(s): a secret query value in the URL",
            queries.len()
        )),
        "{err}"
    );
    assert!(err.contains("x-auth-token, x-goog-api-key"), "{err}");
    assert!(
        plan.contains(CANARY),
        "the plan holds the clean request: {plan}"
    );
    assert!(!plan.contains(SECRET), "{plan}");
    assert!(!plan.contains("<redacted>"), "{plan}");
    assert!(
        !plan.contains("x-goog-api-key") && !plan.contains("x-auth-token"),
        "{plan}"
    );
}
