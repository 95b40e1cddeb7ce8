//! serve: the live recording proxy, over real loopback sockets, with the mock worker and
//! purpose-built peers upstream.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use matrix_proxy::cli::Exit;
use matrix_proxy::{MockConfig, MockWorker};
use serde_json::{Value, json};

use crate::support::*;

async fn fast_mock() -> MockWorker {
    start_mock(MockConfig {
        prefill_ms: 1.0,
        per_token_ms: 0.2,
        stall_ms: 5_000,
        ..MockConfig::default()
    })
    .await
}

fn chat(prompt: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({"model": "mock", "messages": [{"role": "user", "content": prompt}], "max_tokens": 4})).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_clients_every_exchange_recorded_byte_for_byte() {
    let mock = fast_mock().await;
    let tmp = tempfile::tempdir().unwrap();
    let serve = Serve::start(serve_args(&mock.url(), &tmp.path().join("live"))).await;
    let addr = serve.addr;
    // 12 keep-alive clients x 4 requests, and 12 clients with a fresh connection each.
    let mut tasks = Vec::new();
    for c in 0..24 {
        tasks.push(tokio::spawn(async move {
            let mut got = Vec::new();
            let mut client = Client::connect(addr).await;
            for r in 0..4 {
                if c >= 12 && r > 0 {
                    client = Client::connect(addr).await;
                }
                let body = chat(&format!("client {c} request {r}"));
                let ans = client
                    .send(request("POST", addr, "/v1/chat/completions", body.clone()))
                    .await
                    .unwrap();
                assert_eq!(ans.0, 200);
                got.push((body, ans.2));
            }
            got
        }));
    }
    let mut sent: Vec<(Vec<u8>, Bytes)> = Vec::new();
    for t in tasks {
        sent.extend(t.await.unwrap());
    }
    let out = serve.out.clone();
    assert_eq!(serve.stop().await.unwrap(), Exit::Interrupted);
    let rows = Rows::read(&out);
    assert_eq!(rows.len(), 96, "one row per request");
    assert!(
        rows.strs("phase")
            .iter()
            .all(|p| p.as_deref() == Some("live"))
    );
    assert!(
        rows.strs("outcome")
            .iter()
            .all(|o| o.as_deref() == Some("ok")),
        "{:?}",
        rows.strs("error_message")
    );
    // Byte for byte: what the client sent is what the worker got and what was recorded;
    // what the worker answered is what the client got and what was recorded.
    let recorded: BTreeMap<Vec<u8>, Vec<u8>> = rows
        .bins("request_body")
        .into_iter()
        .zip(rows.bins("response_body"))
        .collect();
    let seen: Vec<Vec<u8>> = mock.seen().iter().map(|s| s.body.to_vec()).collect();
    assert_eq!(seen.len(), 96);
    for (req, resp) in &sent {
        assert_eq!(
            recorded.get(req).map(Vec::as_slice),
            Some(&resp[..]),
            "request {}",
            String::from_utf8_lossy(req)
        );
        assert!(seen.contains(req));
    }
    // Pinned upstream connections mirror the clients: 12 + 12 * 4 downstream connections.
    let conns: std::collections::BTreeSet<i64> = rows
        .i64s("connection_id")
        .into_iter()
        .map(Option::unwrap)
        .collect();
    assert_eq!(conns.len(), 12 + 48);
    let reused = rows
        .bools("connection_reused")
        .iter()
        .filter(|r| **r == Some(true))
        .count();
    assert_eq!(reused, 12 * 3);
    // Timings are ordered, and the downstream end comes after the upstream end.
    let (fb, total, down) = (
        rows.i64s("first_byte_us"),
        rows.i64s("total_us"),
        rows.i64s("downstream_done_us"),
    );
    for i in 0..rows.len() {
        assert!(
            fb[i].unwrap() <= total[i].unwrap() && total[i].unwrap() <= down[i].unwrap(),
            "row {i}"
        );
    }
    let summary = read_json(&out.join("summary.json"));
    assert_eq!(
        (
            summary["requests"].as_u64(),
            summary["rows_written"].as_u64()
        ),
        (Some(96), Some(96))
    );
    // The run's latency percentiles are the nearest rank of the recorded rows' total_us.
    let mut totals: Vec<i64> = total.iter().map(|t| t.unwrap()).collect();
    totals.sort_unstable();
    let rank = |p: usize| totals[(p * totals.len()).div_ceil(100) - 1] as f64 / 1e6;
    for (key, p) in [("p50", 50), ("p95", 95), ("p99", 99)] {
        assert_eq!(
            summary["successful_latency_seconds"][key].as_f64(),
            Some(rank(p)),
            "{key}"
        );
    }
    mock.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_are_rewritten_per_rfc_9110_and_secrets_never_reach_disk() {
    let peer = Peer::start(Arc::new(|_, _s: &Seen| {
        let mut r = Reply::json(200, &json!({"ok": true}));
        r.headers
            .push(("set-cookie", "sid=SET-COOKIE-SECRET".into()));
        r.headers.push(("x-upstream-canary", "up-canary-31".into()));
        r
    }))
    .await;
    let tmp = tempfile::tempdir().unwrap();
    let mut args = serve_args(&peer.url(""), &tmp.path().join("live"));
    args.redact_header = vec!["x-custom-secret".into()];
    args.redact_query = vec!["sig".into()];
    let serve = Serve::start(args).await;
    let mut c = Client::connect(serve.addr).await;
    let req = hyper::Request::builder()
        .method("POST")
        .uri("/v1/x?api_key=QUERY-SECRET-1&keep=visible&sig=SIG-SECRET&token=TOK-SECRET")
        .header("host", "client.example:9000")
        .header("authorization", "Bearer BEARER-SECRET")
        .header("cookie", "c=COOKIE-SECRET")
        .header("x-api-key", "APIKEY-SECRET")
        .header("x-custom-secret", "CUSTOM-SECRET")
        .header("x-canary", "down-canary-17")
        .header("connection", "x-hop")
        .header("x-hop", "must-not-pass")
        .header("keep-alive", "timeout=5")
        .header("te", "trailers")
        .header("x-forwarded-for", "10.9.8.7")
        .body(http_body_util::Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    let ans = c.send(req).await.unwrap();
    assert_eq!(ans.0, 200);
    assert!(
        ans.1.get("set-cookie").is_some(),
        "the client still gets its cookie"
    );
    let seen = &peer.seen()[0];
    let h: BTreeMap<&str, &str> = seen
        .headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(
        h.get("host"),
        Some(&"client.example:9000"),
        "Host kept as the client sent it"
    );
    assert!(
        !h.contains_key("x-hop") && !h.contains_key("keep-alive") && !h.contains_key("connection")
    );
    assert_eq!(h.get("te"), Some(&"trailers"));
    assert_eq!(h.get("x-forwarded-for"), Some(&"10.9.8.7, 127.0.0.1"));
    assert_eq!(h.get("x-forwarded-proto"), Some(&"http"));
    assert_eq!(
        h.get("forwarded"),
        Some(&"for=127.0.0.1;proto=http;host=\"client.example:9000\"")
    );
    assert_eq!(
        h.get("authorization"),
        Some(&"Bearer BEARER-SECRET"),
        "forwarded untouched"
    );
    assert_eq!(
        seen.path,
        "/v1/x?api_key=QUERY-SECRET-1&keep=visible&sig=SIG-SECRET&token=TOK-SECRET"
    );
    drop(c);
    serve.stop().await.unwrap();

    let out = tmp.path().join("live");
    let mut texts = Vec::new();
    for f in part_files(&out) {
        texts.extend(all_text(&read_parquet(&f)));
    }
    for f in ["config.json", "summary.json"] {
        texts.push(std::fs::read_to_string(out.join(f)).unwrap());
    }
    let all = texts.join("\n");
    for canary in ["down-canary-17", "up-canary-31", "keep=visible"] {
        assert!(
            all.contains(canary),
            "{canary} must be found (the search works)"
        );
    }
    for secret in [
        "BEARER-SECRET",
        "COOKIE-SECRET",
        "APIKEY-SECRET",
        "CUSTOM-SECRET",
        "SET-COOKIE-SECRET",
        "QUERY-SECRET",
        "SIG-SECRET",
        "TOK-SECRET",
    ] {
        assert!(!all.contains(secret), "{secret} reached disk");
    }
    let rows = Rows::read(&out);
    assert_eq!(
        rows.strs("url")[0].as_deref(),
        Some(&*peer.url("/v1/x?api_key=<redacted>&keep=visible&sig=<redacted>&token=<redacted>"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_failures_become_502_504_or_an_aborted_body_and_the_next_request_works() {
    let mock = fast_mock().await;
    let tmp = tempfile::tempdir().unwrap();
    let mut args = serve_args(&mock.url(), &tmp.path().join("live"));
    args.upstream_timeout = 0.3;
    let serve = Serve::start(args).await;
    let addr = serve.addr;
    let fault = |f: &str| {
        let mut r = request("POST", addr, "/v1/chat/completions", chat("x"));
        r.headers_mut().insert("x-mock-fault", f.parse().unwrap());
        r
    };
    let mut c = Client::connect(addr).await;
    // stall: no head within --upstream-timeout -> 504
    let ans = c.send(fault("stall")).await.unwrap();
    assert_eq!(ans.0, 504);
    assert!(String::from_utf8_lossy(&ans.2).contains("--upstream-timeout"));
    // the same client connection keeps working
    assert_eq!(
        c.send(request("POST", addr, "/v1/chat/completions", chat("ok 1")))
            .await
            .unwrap()
            .0,
        200
    );
    // reset mid-body: the head was sent, so the client's body must be cut, not complete
    let err = c.send(fault("reset")).await.unwrap_err();
    assert!(err.starts_with("body:"), "{err}");
    let mut c = Client::connect(addr).await;
    assert_eq!(
        c.send(request("POST", addr, "/v1/chat/completions", chat("ok 2")))
            .await
            .unwrap()
            .0,
        200
    );
    // a 500 from the worker is passed through and recorded as such
    assert_eq!(c.send(fault("http500")).await.unwrap().0, 500);
    serve.stop().await.unwrap();

    // An upstream that refuses connections: 502.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dead = Serve::start(serve_args(
        &format!("http://127.0.0.1:{port}"),
        &tmp.path().join("dead"),
    ))
    .await;
    let mut c = Client::connect(dead.addr).await;
    let ans = c
        .send(request("GET", dead.addr, "/health", ""))
        .await
        .unwrap();
    assert_eq!(ans.0, 502);
    assert!(String::from_utf8_lossy(&ans.2).contains("connect to 127.0.0.1"));
    dead.stop().await.unwrap();

    let rows = Rows::read(&tmp.path().join("live"));
    let outcome: Vec<String> = rows
        .strs("outcome")
        .into_iter()
        .map(Option::unwrap)
        .collect();
    let status = rows.i32s("status");
    let mut by: Vec<(String, Option<i32>)> = outcome.into_iter().zip(status).collect();
    by.sort();
    assert_eq!(
        by,
        vec![
            ("ok".into(), Some(200)),
            ("ok".into(), Some(200)),
            ("ok".into(), Some(500)),
            ("timeout".into(), None),
            ("transport".into(), Some(200)),
        ]
    );
    let dead_rows = Rows::read(&tmp.path().join("dead"));
    assert_eq!(
        dead_rows.strs("outcome"),
        vec![Some("transport".to_string())]
    );
    mock.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_bodies_stream_both_ways_and_the_record_is_truncated_not_the_traffic() {
    const MB8: usize = 8 << 20;
    let big: Bytes = (0..MB8)
        .map(|i| (i % 251) as u8)
        .collect::<Vec<u8>>()
        .into();
    let reply = big.clone();
    let peer = Peer::start(Arc::new(move |_, s: &Seen| {
        assert_eq!(s.body.len(), MB8, "the upload arrived whole");
        Reply::bytes(200, reply.to_vec())
    }))
    .await;
    let tmp = tempfile::tempdir().unwrap();
    let mut args = serve_args(&peer.url(""), &tmp.path().join("live"));
    args.run.max_record_body = 1 << 20;
    let serve = Serve::start(args).await;
    let mut c = Client::connect(serve.addr).await;
    let ans = c
        .send(request("POST", serve.addr, "/upload", big.clone()))
        .await
        .unwrap();
    assert_eq!(ans.2.len(), MB8);
    assert!(ans.2 == big, "the download arrived byte for byte");
    serve.stop().await.unwrap();
    let rows = Rows::read(&tmp.path().join("live"));
    assert_eq!(rows.i64s("request_body_len"), vec![Some(MB8 as i64)]);
    assert_eq!(rows.i64s("response_body_len"), vec![Some(MB8 as i64)]);
    assert_eq!(rows.bools("request_body_truncated"), vec![Some(true)]);
    assert_eq!(rows.bools("response_body_truncated"), vec![Some(true)]);
    assert_eq!(rows.bins("request_body")[0], big[..1 << 20].to_vec());
    assert_eq!(rows.bins("response_body")[0], big[..1 << 20].to_vec());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn head_204_304_and_chunked_uploads_pass_through() {
    let peer = Peer::start(Arc::new(|_, s: &Seen| match s.path.as_str() {
        "/nocontent" => Reply {
            status: 204,
            body: vec![],
            headers: vec![],
            delay: Duration::ZERO,
        },
        "/notmodified" => Reply {
            status: 304,
            body: vec![],
            headers: vec![],
            delay: Duration::ZERO,
        },
        _ => Reply::json(200, &json!({"len": s.body.len(), "method": s.method})),
    }))
    .await;
    let tmp = tempfile::tempdir().unwrap();
    let serve = Serve::start(serve_args(&peer.url(""), &tmp.path().join("live"))).await;
    let addr = serve.addr;
    let mut c = Client::connect(addr).await;
    let head = c.send(request("HEAD", addr, "/thing", "")).await.unwrap();
    assert_eq!((head.0.as_u16(), head.2.len()), (200, 0));
    assert!(head.1.get("content-length").is_some());
    assert_eq!(
        c.send(request("GET", addr, "/nocontent", ""))
            .await
            .unwrap()
            .0,
        204
    );
    assert_eq!(
        c.send(request("GET", addr, "/notmodified", ""))
            .await
            .unwrap()
            .0,
        304
    );
    // A chunked upload (no Content-Length): the worker sees the whole body.
    let chunks = Chunked(vec![Bytes::from_static(b"abc"), Bytes::from_static(b"defg")].into());
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(conn);
    let req = hyper::Request::builder()
        .method("POST")
        .uri("/chunked")
        .header("host", addr.to_string())
        .body(chunks)
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    let body = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .unwrap()
        .to_bytes();
    assert_eq!(
        serde_json::from_slice::<Value>(&body).unwrap(),
        json!({"len": 7, "method": "POST"})
    );
    serve.stop().await.unwrap();
    let rows = Rows::read(&tmp.path().join("live"));
    assert_eq!(rows.len(), 4);
    assert!(
        rows.strs("outcome")
            .iter()
            .all(|o| o.as_deref() == Some("ok")),
        "{:?}",
        rows.strs("error_message")
    );
    // Rows are in the order exchanges ended: serve ends one after the client has its
    // last byte, so the next connection's exchange may end first. Found by its URL.
    let urls = rows.strs("url");
    let i = (0..rows.len())
        .find(|&i| urls[i].as_deref().is_some_and(|u| u.ends_with("/chunked")))
        .expect("the chunked upload's row");
    assert_eq!(rows.bins("request_body")[i], b"abcdefg".to_vec());
    assert_eq!(rows.i64s("request_body_len")[i], Some(7));
}

/// A request body of several frames with no known length (sent chunked).
struct Chunked(std::collections::VecDeque<Bytes>);

impl hyper::body::Body for Chunked {
    type Data = Bytes;
    type Error = std::convert::Infallible;
    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        std::task::Poll::Ready(self.0.pop_front().map(|b| Ok(hyper::body::Frame::data(b))))
    }
}

/// A body of one data frame followed by trailers.
struct WithTrailers(u8);

impl hyper::body::Body for WithTrailers {
    type Data = Bytes;
    type Error = std::convert::Infallible;
    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        self.0 += 1;
        std::task::Poll::Ready(match self.0 {
            1 => Some(Ok(hyper::body::Frame::data(Bytes::from_static(b"hello")))),
            2 => {
                let mut t = hyper::HeaderMap::new();
                t.insert("x-checksum", "abc123".parse().unwrap());
                Some(Ok(hyper::body::Frame::trailers(t)))
            }
            _ => None,
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trailers_pass_when_asked_for_and_expect_100_continue_is_answered() {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    let up = http_server(move |req: hyper::Request<hyper::body::Incoming>| {
        let log = log.clone();
        async move {
            let (parts, body) = req.into_parts();
            let body = http_body_util::BodyExt::collect(body)
                .await
                .unwrap()
                .to_bytes();
            log.lock().unwrap().push((parts.headers.clone(), body));
            let mut r = hyper::Response::new(WithTrailers(0));
            r.headers_mut()
                .insert("trailer", "x-checksum".parse().unwrap());
            r
        }
    })
    .await;
    let tmp = tempfile::tempdir().unwrap();
    let serve = Serve::start(serve_args(
        &format!("http://{up}"),
        &tmp.path().join("live"),
    ))
    .await;
    let tcp = tokio::net::TcpStream::connect(serve.addr).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(conn);
    let req = hyper::Request::builder()
        .method("POST")
        .uri("/t")
        .header("host", serve.addr.to_string())
        .header("te", "trailers")
        .header("expect", "100-continue")
        .body(http_body_util::Full::new(Bytes::from_static(b"payload")))
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let collected = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .unwrap();
    let trailers = collected
        .trailers()
        .cloned()
        .expect("trailers reached the client");
    assert_eq!(trailers.get("x-checksum").unwrap(), "abc123");
    assert_eq!(&collected.to_bytes()[..], b"hello");
    let (headers, body) = seen.lock().unwrap()[0].clone();
    assert_eq!(
        &body[..],
        b"payload",
        "the body went up after the proxy answered Expect"
    );
    assert!(
        headers.get("expect").is_none(),
        "Expect is answered by the proxy, not forwarded"
    );
    assert_eq!(headers.get("te").unwrap(), "trailers");
    let out = serve.out.clone();
    serve.stop().await.unwrap();
    let rows = Rows::read(&out);
    assert_eq!(rows.strs("outcome"), vec![Some("ok".to_string())]);
    assert_eq!(rows.bins("response_body")[0], b"hello".to_vec());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_global_record_memory_budget_truncates_the_record_not_the_traffic() {
    let reply = vec![b'r'; 3000];
    let peer = Peer::start(Arc::new(move |_, _s: &Seen| {
        Reply::bytes(200, reply.clone())
    }))
    .await;
    let tmp = tempfile::tempdir().unwrap();
    let mut args = serve_args(&peer.url(""), &tmp.path().join("live"));
    args.record_memory = 4096;
    let serve = Serve::start(args).await;
    let mut c = Client::connect(serve.addr).await;
    let ans = c
        .send(request("POST", serve.addr, "/x", vec![b'q'; 3000]))
        .await
        .unwrap();
    assert_eq!(ans.2.len(), 3000, "forwarding is never truncated");
    assert_eq!(peer.seen()[0].body.len(), 3000);
    let out = serve.out.clone();
    serve.stop().await.unwrap();
    let rows = Rows::read(&out);
    assert_eq!(
        (
            rows.bins("request_body")[0].len(),
            rows.bools("request_body_truncated")[0]
        ),
        (3000, Some(false))
    );
    assert_eq!(
        (
            rows.bins("response_body")[0].len(),
            rows.bools("response_body_truncated")[0]
        ),
        (1096, Some(true))
    );
    assert_eq!(rows.i64s("response_body_len")[0], Some(3000));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_resets_mid_head_is_a_502_and_a_transport_row() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // A raw peer: reads the request, writes half a status line, closes.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (mut tcp, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = tcp.read(&mut buf).await;
                let _ = tcp.write_all(b"HTTP/1.1 200 O").await;
                drop(tcp);
            });
        }
    });
    let tmp = tempfile::tempdir().unwrap();
    let serve = Serve::start(serve_args(
        &format!("http://{up}"),
        &tmp.path().join("live"),
    ))
    .await;
    let mut c = Client::connect(serve.addr).await;
    let ans = c.send(request("GET", serve.addr, "/x", "")).await.unwrap();
    assert_eq!(ans.0, 502);
    // The proxy keeps serving on the same client connection.
    let ans = c.send(request("GET", serve.addr, "/y", "")).await.unwrap();
    assert_eq!(ans.0, 502);
    let out = serve.out.clone();
    serve.stop().await.unwrap();
    let rows = Rows::read(&out);
    assert_eq!(rows.strs("outcome"), vec![Some("transport".to_string()); 2]);
    assert_eq!(rows.i32s("status"), vec![None, None]);
    let msg = rows.strs("error_message")[0].clone().unwrap();
    assert!(msg.contains("send request"), "{msg}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fresh_upstream_connections_say_close_so_the_worker_closes_first() {
    let peer = Peer::start(Arc::new(|_, _s: &Seen| {
        Reply::json(200, &json!({"ok": true}))
    }))
    .await;
    let tmp = tempfile::tempdir().unwrap();
    let mut args = serve_args(&peer.url(""), &tmp.path().join("live"));
    args.upstream_connection = matrix_proxy::cli::UpstreamConnection::Fresh;
    let serve = Serve::start(args).await;
    let mut c = Client::connect(serve.addr).await;
    for _ in 0..3 {
        assert_eq!(c.send(models_request()).await.unwrap().0, 200);
    }
    assert_eq!(serve.stop().await.unwrap(), Exit::Interrupted);
    let seen = peer.seen();
    assert_eq!(seen.len(), 3);
    for s in &seen {
        assert!(
            s.headers
                .iter()
                .any(|(k, v)| k == "connection" && v == "close"),
            "{:?}",
            s.headers
        );
    }
    assert_eq!(peer.connections(), 3, "one upstream connection per request");
    let rows = Rows::read(&tmp.path().join("live"));
    assert_eq!(rows.bools("connection_reused"), vec![Some(false); 3]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_writer_slows_the_clients_instead_of_growing_memory() {
    let peer = Peer::start(Arc::new(|_, _s: &Seen| {
        Reply::json(200, &json!({"ok": true}))
    }))
    .await;
    let tmp = tempfile::tempdir().unwrap();
    let mut args = serve_args(&peer.url(""), &tmp.path().join("live"));
    // Every row closes and fsyncs a part of its own, behind a queue of four rows: the
    // writer is far slower than 16 clients that send as fast as they are answered.
    args.run.part_rows = 1;
    args.record_queue = 4;
    let serve = Serve::start(args).await;
    let addr = serve.addr;
    let mut tasks = Vec::new();
    for _ in 0..16 {
        tasks.push(tokio::spawn(async move {
            let mut c = Client::connect(addr).await;
            for _ in 0..25 {
                assert_eq!(c.send(models_request()).await.unwrap().0, 200);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let out = serve.out.clone();
    assert_eq!(serve.stop().await.unwrap(), Exit::Interrupted);
    let summary = read_json(&out.join("summary.json"));
    assert_eq!(summary["rows_written"], json!(400), "{summary}");
    assert_eq!(summary["successful_requests"], json!(400), "{summary}");
    assert_eq!(summary["dropped_rows"], json!(0));
    // Rows waited for the writer (the gate was used), but never more than one per client
    // connection: the backlog is bounded by the connections, not by the run's length.
    let peak = summary["recorder_backlog_peak_rows"].as_u64().unwrap();
    assert!((1..=16).contains(&peak), "backlog peak {peak}");
    assert_eq!(Rows::read(&out).len(), 400);
    // serve's recorder encodes in measured slices (an unpaced writer reports 0).
    let slice = summary["recorder_longest_slice_us"].as_u64().unwrap();
    assert!(slice > 0, "{summary}");
}

/// `GET /v1/models` with a client `Host`.
fn models_request() -> hyper::Request<http_body_util::Full<Bytes>> {
    hyper::Request::builder()
        .uri("/v1/models")
        .header("host", "client.example")
        .body(http_body_util::Full::new(Bytes::new()))
        .unwrap()
}

/// Send `req` on a new connection and read until the proxy closes it (at most 5 s).
async fn raw_exchange(addr: std::net::SocketAddr, req: &str) -> Vec<u8> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), tcp.read_to_end(&mut out)).await;
    out
}

fn post(path: &str, body: &Value, close: bool) -> String {
    let body = body.to_string();
    format!(
        "POST {path} HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{}\r\n{body}",
        body.len(),
        if close { "connection: close\r\n" } else { "" }
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn downstream_done_is_null_when_the_client_left_and_never_before_total_when_ok() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mock = start_mock(MockConfig {
        prefill_ms: 1.0,
        per_token_ms: 5.0,
        ..MockConfig::default()
    })
    .await;
    let tmp = tempfile::tempdir().unwrap();
    let serve = Serve::start(serve_args(&mock.url(), &tmp.path().join("live"))).await;
    let addr = serve.addr;
    let whole = json!({"messages": [{"role": "user", "content": "w"}], "max_tokens": 3});
    let stream =
        json!({"messages": [{"role": "user", "content": "s"}], "max_tokens": 30, "stream": true});
    let invalid = json!({"model": "mock"}); // no messages: the mock answers 400
    // Complete exchanges of each kind, read to the end.
    for body in [&whole, &stream, &invalid] {
        for _ in 0..3 {
            let got = raw_exchange(addr, &post("/v1/chat/completions", body, true)).await;
            assert!(
                got.starts_with(b"HTTP/1.1 "),
                "{}",
                String::from_utf8_lossy(&got)
            );
        }
    }
    // As GuideLLM does after a 422: read the error answer, then drop the connection at
    // once (keep-alive, so the proxy does not close first).
    for _ in 0..3 {
        let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        tcp.write_all(post("/v1/chat/completions", &invalid, false).as_bytes())
            .await
            .unwrap();
        let mut buf = [0u8; 4096];
        let n = tcp.read(&mut buf).await.unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 400"));
    }
    // Clients that leave a stream after its first bytes (30 tokens take ~150 ms).
    for _ in 0..3 {
        let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        tcp.write_all(post("/v1/chat/completions", &stream, false).as_bytes())
            .await
            .unwrap();
        let mut buf = [0u8; 64];
        let n = tcp.read(&mut buf).await.unwrap();
        assert!(n > 0);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let out = serve.out.clone();
    serve.stop().await.unwrap();
    let rows = Rows::read(&out);
    assert_eq!(rows.len(), 15, "one row per request");
    let (outcome, total, down) = (
        rows.strs("outcome"),
        rows.i64s("total_us"),
        rows.i64s("downstream_done_us"),
    );
    let mut aborted = 0;
    for i in 0..rows.len() {
        match outcome[i].as_deref() {
            Some("ok") => {
                let (t, d) = (
                    total[i].unwrap(),
                    down[i].expect("ok has downstream_done_us"),
                );
                assert!(d >= t, "row {i}: downstream_done_us {d} < total_us {t}");
            }
            Some("client_aborted") => {
                aborted += 1;
                assert_eq!(
                    down[i], None,
                    "row {i}: the last byte never reached the client"
                );
            }
            other => panic!("row {i}: unexpected outcome {other:?}"),
        }
    }
    assert_eq!(aborted, 3, "the three streams left early; {outcome:?}");
    mock.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_summary_groups_by_route_so_probes_never_blend_into_generation() {
    let mock = start_mock(MockConfig {
        prefill_ms: 20.0,
        per_token_ms: 2.0,
        ..MockConfig::default()
    })
    .await;
    let tmp = tempfile::tempdir().unwrap();
    let serve = Serve::start(serve_args(&mock.url(), &tmp.path().join("live"))).await;
    let addr = serve.addr;
    let stream =
        json!({"messages": [{"role": "user", "content": "g"}], "max_tokens": 8, "stream": true});
    let get = |path: &str, method: &str| {
        format!("{method} {path} HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n")
    };
    // Generation requests, with an AIPerf-style probe between each.
    for _ in 0..5 {
        raw_exchange(addr, &post("/v1/chat/completions", &stream, true)).await;
        raw_exchange(addr, &get("/health", "GET")).await;
    }
    raw_exchange(addr, &get("/metrics", "GET")).await;
    raw_exchange(addr, &get("/metrics?x=1", "GET")).await;
    raw_exchange(addr, &get("/health", "HEAD")).await;
    let out = serve.out.clone();
    serve.stop().await.unwrap();
    let summary = read_json(&out.join("summary.json"));
    let routes = summary["routes"].as_array().unwrap();
    let find = |route: &str, class: &str| {
        routes
            .iter()
            .find(|r| r["route"] == json!(route) && r["status_class"] == json!(class))
            .unwrap_or_else(|| panic!("no {route} {class} in {routes:?}"))
    };
    let gen_ = find("POST /v1/chat/completions", "2xx");
    assert_eq!(gen_["requests"], json!(5));
    let health = find("GET /health", "2xx");
    assert_eq!(health["requests"], json!(5));
    // The mock answers /metrics (vLLM's names): a probe like /health, grouped apart.
    assert_eq!(find("GET /metrics", "2xx")["requests"], json!(2));
    assert_eq!(find("HEAD /health", "4xx")["requests"], json!(1));
    assert_eq!(routes.len(), 4);
    // Generation takes 20 ms + 8 x 2 ms; a probe is answered at once. Apart, neither
    // blends into the other.
    let p50 = |r: &Value| r["successful_latency_seconds"]["p50"].as_f64().unwrap();
    assert!(p50(gen_) >= 0.030, "{}", p50(gen_));
    assert!(p50(health) < 0.010, "{}", p50(health));
    let st = &gen_["stream"];
    assert_eq!(st["requests"], json!(5));
    assert!(st["ttft_seconds"]["p50"].as_f64().unwrap() >= 0.020);
    assert!(st["itl_seconds"]["p50"].as_f64().unwrap() > 0.0);
    assert!(st["output_tokens_per_second_mean"].as_f64().unwrap() > 0.0);
    assert_eq!(health["stream"], Value::Null);
    mock.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_before_the_head_is_recorded_client_aborted() {
    use tokio::io::AsyncWriteExt;
    let mock = start_mock(MockConfig {
        prefill_ms: 1500.0,
        ..MockConfig::default()
    })
    .await;
    let tmp = tempfile::tempdir().unwrap();
    let serve = Serve::start(serve_args(&mock.url(), &tmp.path().join("live"))).await;
    let body = json!({"messages": [{"role": "user", "content": "g"}], "max_tokens": 2});
    let mut tcp = tokio::net::TcpStream::connect(serve.addr).await.unwrap();
    tcp.write_all(post("/v1/chat/completions", &body, false).as_bytes())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    drop(tcp);
    // The worker would answer after 1.5 s; the row is there once serve has stopped.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let out = serve.out.clone();
    assert_eq!(serve.stop().await.unwrap(), Exit::Interrupted);
    let rows = Rows::read(&out);
    assert_eq!(rows.len(), 1, "one row for the request");
    assert_eq!(rows.strs("outcome")[0].as_deref(), Some("client_aborted"));
    assert_eq!(rows.i64s("downstream_done_us")[0], None);
    let message = rows.strs("error_message")[0].clone().unwrap_or_default();
    assert!(
        message.contains("before the worker's response head"),
        "{message}"
    );
    // The request itself is kept.
    assert_eq!(rows.strs("method")[0].as_deref(), Some("POST"));
    let sent: Value = serde_json::from_slice(&rows.bins("request_body")[0]).unwrap();
    assert_eq!(sent, body);
    mock.shutdown().await;
}
