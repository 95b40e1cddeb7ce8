//! Hostile clients against serve: slowloris, huge heads, smuggling attempts, invalid
//! requests and 10,000 idle connections. The proxy stays up, forwards nothing ambiguous,
//! and keeps serving well-behaved clients.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::*;

/// Send raw bytes, then read until the peer closes or 2 s pass; returns what came back.
async fn raw(addr: std::net::SocketAddr, bytes: &[u8]) -> String {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(bytes).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(2), tcp.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_and_ambiguous_requests_are_refused_and_never_forwarded() {
    let peer = Peer::start(echo_handler()).await;
    let tmp = tempfile::tempdir().unwrap();
    let mut args = serve_args(&peer.url(""), &tmp.path().join("live"));
    args.max_header_bytes = 16 << 10;
    let serve = Serve::start(args).await;
    let addr = serve.addr;
    let huge = format!(
        "GET / HTTP/1.1\r\nhost: a\r\nx-big: {}\r\n\r\n",
        "a".repeat(100_000)
    );
    for (what, req, status) in [
        ("huge head", huge.as_str(), "431"),
        (
            "obs-fold",
            "GET / HTTP/1.1\r\nhost: a\r\nx-folded: one\r\n two\r\n\r\n",
            "400",
        ),
        ("bad method", "G@T / HTTP/1.1\r\nhost: a\r\n\r\n", "400"),
        (
            "space in target",
            "GET /a b HTTP/1.1\r\nhost: a\r\n\r\n",
            "400",
        ),
        ("bad version", "GET / HTTP/9.9\r\nhost: a\r\n\r\n", "400"),
        (
            "connect",
            "CONNECT a:443 HTTP/1.1\r\nhost: a:443\r\n\r\n",
            "405",
        ),
        (
            "bad content-length",
            "POST / HTTP/1.1\r\nhost: a\r\ncontent-length: 1x\r\n\r\n",
            "400",
        ),
        (
            "two content-lengths",
            "POST / HTTP/1.1\r\nhost: a\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\nab",
            "400",
        ),
    ] {
        let got = raw(addr, req.as_bytes()).await;
        assert!(
            got.starts_with(&format!("HTTP/1.1 {status}")),
            "{what}: {got:?}"
        );
    }
    // Content-Length together with Transfer-Encoding: the body is framed by the chunking,
    // the connection is not reused, and the worker gets one well-framed request; the
    // bytes after the chunked body can never become a second, smuggled request upstream.
    let smuggle = "POST /first HTTP/1.1\r\nhost: a\r\ncontent-type: application/json\r\ncontent-length: 30\r\ntransfer-encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nhost: a\r\n\r\n";
    let _ = raw(addr, smuggle.as_bytes()).await;
    let seen = peer.seen();
    assert!(
        seen.iter().all(|s| s.path != "/smuggled"),
        "a smuggled request reached the worker: {seen:?}"
    );
    for s in &seen {
        let names: Vec<&str> = s.headers.iter().map(|(k, _)| k.as_str()).collect();
        assert!(
            !(names.contains(&"content-length") && names.contains(&"transfer-encoding")),
            "{names:?}"
        );
    }
    // Pipelined requests are answered in order, the last one's close honoured.
    let got = raw(
        addr,
        b"POST /p1 HTTP/1.1\r\nhost: a\r\ncontent-length: 2\r\n\r\n{}POST /p2 HTTP/1.1\r\nhost: a\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}",
    )
    .await;
    assert_eq!(got.matches("HTTP/1.1 200").count(), 2, "{got:?}");
    let paths: Vec<String> = peer.seen().iter().map(|s| s.path.clone()).collect();
    let p1 = paths.iter().position(|p| p == "/p1");
    let p2 = paths.iter().position(|p| p == "/p2");
    assert!(p1.is_some() && p1 < p2, "{paths:?}");
    // Still serving.
    let mut c = Client::connect(addr).await;
    assert_eq!(
        c.send(request("POST", addr, "/ok", "{}")).await.unwrap().0,
        200
    );
    let out = serve.out.clone();
    serve.stop().await.unwrap();
    // Every request the worker saw has its row.
    assert_eq!(Rows::read(&out).len(), peer.seen().len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slowloris_client_is_cut_off_at_the_header_read_timeout() {
    let peer = Peer::start(echo_handler()).await;
    let tmp = tempfile::tempdir().unwrap();
    let mut args = serve_args(&peer.url(""), &tmp.path().join("live"));
    args.header_read_timeout = 0.5;
    let serve = Serve::start(args).await;
    let addr = serve.addr;
    let slow = tokio::spawn(async move {
        let mut tcp = TcpStream::connect(addr).await.unwrap();
        tcp.write_all(b"GET / HTTP/1.1\r\nhost: a\r\n")
            .await
            .unwrap();
        let started = matrix_proxy::now_ns();
        // One header byte every 100 ms, for up to 5 s.
        for _ in 0..50 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if tcp.write_all(b"x").await.is_err() {
                break;
            }
            let mut buf = [0u8; 256];
            let read = tokio::time::timeout(Duration::from_millis(1), tcp.read(&mut buf)).await;
            if let Ok(Ok(n)) = read
                && (n == 0 || buf.starts_with(b"HTTP/1.1 408"))
            {
                break;
            }
        }
        Duration::from_nanos(matrix_proxy::now_ns() - started)
    });
    // Meanwhile, a well-behaved client is served.
    let mut c = Client::connect(addr).await;
    assert_eq!(
        c.send(request("POST", addr, "/ok", "{}")).await.unwrap().0,
        200
    );
    let held = slow.await.unwrap();
    assert!(
        held < Duration::from_secs(3),
        "the slow client was held for {held:?}"
    );
    serve.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_idle_clients_cost_no_upstream_connections() {
    // serve runs as its own process (it raises its own open-file limit); this process
    // holds the 10,000 client sockets.
    rlimit::increase_nofile_limit(12_000).unwrap();
    let peer = Peer::start(echo_handler()).await;
    let tmp = tempfile::tempdir().unwrap();
    let mut p = crate::serve_lifecycle::spawn_serve(
        &peer.url(""),
        &tmp.path().join("live"),
        // Idle clients that never send a head are cut after --header-read-timeout; this
        // test is about room, not time, so that limit is out of its way.
        &["--max-connections", "10100", "--header-read-timeout", "600"],
    )
    .await;
    let addr = p.addr;
    let mut idle = Vec::with_capacity(10_000);
    for _ in 0..10_000 {
        idle.push(TcpStream::connect(addr).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        peer.connections(),
        0,
        "idle clients open no upstream connections"
    );
    let mut c = Client::connect(addr).await;
    assert_eq!(
        c.send(request("POST", addr, "/ok", "{}")).await.unwrap().0,
        200
    );
    assert_eq!(peer.connections(), 1);
    // The idle connections are still open (none was dropped to make room).
    let mut probe = [0u8; 1];
    let still_open = tokio::time::timeout(Duration::from_millis(50), idle[0].read(&mut probe))
        .await
        .is_err();
    assert!(still_open, "the first idle connection was closed");
    let rss_kb = crate::serve_lifecycle::peak_rss_kb(p.child.id().unwrap());
    eprintln!(
        "serve with 10,000 idle clients: peak RSS {} MiB",
        rss_kb / 1024
    );
    drop(idle);
    drop(c);
    p.signal("-TERM");
    assert_eq!(p.wait().await, Some(130));
    assert_eq!(Rows::read(&p.out).len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_new_connections_waits_in_the_accept_queue_instead_of_being_dropped() {
    // With serve stopped (SIGSTOP), the kernel completes handshakes into the listener's
    // accept queue until it is full, then drops SYNs: the client waits a full second for
    // the retransmit. The 128-deep queue tokio's bind left fails this at the 130th
    // connection; serve's is as deep as --max-connections, capped by net.core.somaxconn.
    let somaxconn: usize = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(128);
    let burst = somaxconn.min(1000);
    let peer = Peer::start(echo_handler()).await;
    let tmp = tempfile::tempdir().unwrap();
    let mut p = crate::serve_lifecycle::spawn_serve(
        &peer.url(""),
        &tmp.path().join("live"),
        &["--max-connections", "2000"],
    )
    .await;
    let addr = p.addr;
    let config = read_json(&p.out.join("config.json"));
    assert_eq!(
        config["limits"]["listen_backlog"].as_u64(),
        Some(somaxconn.min(2000) as u64),
        "{config}"
    );
    p.signal("-STOP");
    let mut held = Vec::with_capacity(burst);
    for i in 0..burst {
        match tokio::time::timeout(Duration::from_millis(500), TcpStream::connect(addr)).await {
            Ok(Ok(tcp)) => held.push(tcp),
            other => {
                p.signal("-CONT");
                panic!("connection {i} of {burst} was not queued: {other:?}");
            }
        }
    }
    p.signal("-CONT");
    // Every queued connection is served once serve runs again.
    for tcp in held.iter_mut().rev().take(3) {
        tcp.write_all(format!("GET /q HTTP/1.1\r\nhost: {addr}\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut head = [0u8; 12];
        tokio::time::timeout(Duration::from_secs(10), tcp.read_exact(&mut head))
            .await
            .expect("an answer")
            .unwrap();
        assert_eq!(&head, b"HTTP/1.1 200");
    }
    drop(held);
    p.signal("-TERM");
    assert_eq!(p.wait().await, Some(130));
    assert_eq!(Rows::read(&p.out).len(), 3);
}
