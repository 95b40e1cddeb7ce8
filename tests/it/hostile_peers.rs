//! Hostile clients and workers against serve's framing (issue 44): what the worker receives
//! is one request per request serve read and recorded, what the client receives is one
//! response per response, refusals are counted, a slow or malformed body is the client's,
//! an early answer is passed on, and a recorder that fails stops unrecorded traffic.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use matrix_proxy::cli::Exit;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::support::*;

/// One line up to LF (a CR before it dropped), from `buf` at `*at`.
fn lenient_line(buf: &[u8], at: &mut usize) -> Option<Vec<u8>> {
    let lf = buf[*at..].iter().position(|&b| b == b'\n')?;
    let mut line = buf[*at..*at + lf].to_vec();
    if line.last() == Some(&b'\r') {
        line.pop();
    }
    *at += lf + 1;
    Some(line)
}

/// A lenient request at the start of `buf` as a worker behind serve might read it
/// (h11's and nginx's rules: a bare LF ends a line, trailers end at the first empty
/// line): its target and how many bytes it took; `None` until it is complete.
fn lenient_request(buf: &[u8]) -> Option<(String, usize)> {
    let mut fields = [httparse::EMPTY_HEADER; 64];
    let mut req = httparse::Request::new(&mut fields);
    let httparse::Status::Complete(mut at) = req.parse(buf).ok()? else {
        return None;
    };
    let target = req.path?.to_string();
    let field = |name: &str| {
        req.headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| String::from_utf8_lossy(h.value).trim().to_ascii_lowercase())
    };
    if field("transfer-encoding").is_some_and(|te| te.ends_with("chunked")) {
        loop {
            let line = lenient_line(buf, &mut at)?;
            let hex: String = line
                .iter()
                .take_while(|b| b.is_ascii_hexdigit())
                .map(|&b| b as char)
                .collect();
            let size = usize::from_str_radix(&hex, 16).ok()?;
            if size == 0 {
                while !lenient_line(buf, &mut at)?.is_empty() {}
                return Some((target, at));
            }
            at += size;
            lenient_line(buf, &mut at)?;
        }
    }
    let n: usize = field("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    (buf.len() >= at + n).then_some((target, at + n))
}

/// A worker that reads requests leniently on each connection and answers each with
/// `{"path": target}`; every target it read, in order.
async fn lenient_worker() -> (std::net::SocketAddr, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            let log = log.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut b = [0u8; 4096];
                loop {
                    while let Some((target, n)) = lenient_request(&buf) {
                        buf.drain(..n);
                        log.lock().unwrap().push(target.clone());
                        // A request the lenient read found inside another one is slow to
                        // answer, so that the honest request after it waits in line.
                        if target.contains("smuggled") {
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                        let body = format!("{{\"path\":\"{target}\"}}");
                        let answer = format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        if tcp.write_all(answer.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                    match tcp.read(&mut b).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&b[..n]),
                    }
                }
            });
        }
    });
    (addr, seen)
}

/// Read one HTTP/1.1 response with a content-length body off `tcp` (2 s at most).
async fn read_response(tcp: &mut TcpStream) -> String {
    let mut got = Vec::new();
    let mut b = [0u8; 4096];
    let read = async {
        loop {
            if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
                let len: usize = head
                    .lines()
                    .find_map(|l| {
                        l.strip_prefix("content-length:")
                            .map(|v| v.trim().parse().unwrap_or(0))
                    })
                    .unwrap_or(0);
                if got.len() >= end + 4 + len {
                    return;
                }
            }
            match tcp.read(&mut b).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&b[..n]),
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(2), read).await;
    String::from_utf8_lossy(&got).into_owned()
}

/// Majors 1 and 2: a request whose body a lenient worker would read as a second request
/// (its length named in `Connection`, or a bare LF in its trailers) reaches the worker as
/// one request, and the honest request after it on the same client connection gets its
/// own answer, recorded as such.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_smuggled_request_never_reaches_the_worker_nor_poisons_the_next_answer() {
    let (up, seen) = lenient_worker().await;
    let tmp = tempfile::tempdir().unwrap();
    let serve = Serve::start(serve_args(
        &format!("http://{up}"),
        &tmp.path().join("live"),
    ))
    .await;
    let smuggled = "GET /delay-smuggled HTTP/1.1\r\nHost: x\r\n\r\n";
    let attacks = [
        format!(
            "POST /first HTTP/1.1\r\nHost: x\r\nConnection: content-length\r\nContent-Length: {}\r\n\r\n{smuggled}",
            smuggled.len()
        ),
        "POST /first HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX: a\n\nGET /smuggled2 HTTP/1.1\r\nHost: x\r\n\r\n".to_string(),
    ];
    for attack in &attacks {
        let mut tcp = TcpStream::connect(serve.addr).await.unwrap();
        tcp.write_all(attack.as_bytes()).await.unwrap();
        let first = read_response(&mut tcp).await;
        assert!(
            first.ends_with("{\"path\":\"/first\"}"),
            "{attack:?}: {first:?}"
        );
        tcp.write_all(b"GET /second HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let second = read_response(&mut tcp).await;
        assert!(
            second.ends_with("{\"path\":\"/second\"}"),
            "{attack:?}: {second:?}"
        );
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        ["/first", "/second", "/first", "/second"],
        "the worker read other requests"
    );
    serve.stop().await.unwrap();
    let rows = Rows::read(&tmp.path().join("live"));
    let urls = rows.strs("url");
    let bodies = rows.bins("response_body");
    for (url, body) in urls.iter().zip(&bodies) {
        let path = url
            .as_deref()
            .unwrap()
            .rsplit_once(&up.to_string())
            .unwrap()
            .1
            .to_string();
        assert_eq!(
            String::from_utf8_lossy(body),
            format!("{{\"path\":\"{path}\"}}")
        );
    }
    // The chunked body's data is what was recorded and forwarded.
    let bodies_up: Vec<Vec<u8>> = rows.bins("request_body");
    assert!(bodies_up.iter().any(|b| b == b"hello"), "{bodies_up:?}");
}

/// A worker answering each request (one per connection) with the bytes `answer` gives,
/// then closing: every answer says `Connection: close`, so serve never sends the next
/// request into a connection the worker is about to close (a race a busy machine loses).
fn framed_answers(target: &str) -> Vec<u8> {
    match target {
        "/conn-length" => b"HTTP/1.1 200 OK\r\nConnection: content-length, close\r\nContent-Length: 5\r\n\r\nhello".to_vec(),
        "/both" => b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n26\r\nhello, this is longer than five bytes!\r\n0\r\n\r\n".to_vec(),
        "/gzip" => b"HTTP/1.1 200 OK\r\nConnection: close\r\nTransfer-Encoding: gzip\r\nContent-Length: 3\r\n\r\nabc".to_vec(),
        _ => b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok".to_vec(),
    }
}

/// Major 3: one framing to the client, whatever the worker wrote: a length named in its
/// `Connection` is still the length, a length beside chunked is dropped (RFC 9112 section
/// 6.3), an HTTP/1.0 client gets the body until the close, and a coding other than
/// chunked is a 502.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answer_reaches_the_client_in_one_framing() {
    let up = raw_peer(framed_answers).await;
    let tmp = tempfile::tempdir().unwrap();
    let serve = Serve::start(serve_args(
        &format!("http://{up}"),
        &tmp.path().join("live"),
    ))
    .await;
    // A keep-alive client gets each answer whole, then the next on the same connection.
    let mut client = Client::connect(serve.addr).await;
    for (path, body) in [
        ("/conn-length", "hello"),
        ("/both", "hello, this is longer than five bytes!"),
        ("/next", "ok"),
    ] {
        let answer = tokio::time::timeout(
            Duration::from_secs(5),
            client.send(request("GET", serve.addr, path, "")),
        )
        .await
        .unwrap_or_else(|_| panic!("{path}: the client hung"))
        .unwrap();
        assert_eq!(
            (answer.0.as_u16(), &answer.2[..]),
            (200, body.as_bytes()),
            "{path}"
        );
        assert_eq!(
            answer.1.get_all("content-length").iter().count()
                + answer.1.get_all("transfer-encoding").iter().count(),
            1,
            "{path}: {:?}",
            answer.1
        );
    }
    let (status, _, body) = client
        .send(request("GET", serve.addr, "/gzip", ""))
        .await
        .unwrap();
    assert_eq!(status, 502, "{}", String::from_utf8_lossy(&body));
    assert!(
        String::from_utf8_lossy(&body).contains("gzip"),
        "{}",
        String::from_utf8_lossy(&body)
    );
    // HTTP/1.0: the length beside chunked never reaches it; the close ends the body.
    let mut tcp = TcpStream::connect(serve.addr).await.unwrap();
    tcp.write_all(b"GET /both HTTP/1.0\r\n\r\n").await.unwrap();
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(2), tcp.read_to_end(&mut got))
        .await
        .unwrap()
        .unwrap();
    let got = String::from_utf8_lossy(&got).to_ascii_lowercase();
    assert!(!got.contains("content-length: 5"), "{got}");
    assert!(
        got.contains("connection: close")
            && got.ends_with("\r\n\r\nhello, this is longer than five bytes!"),
        "{got}"
    );
    serve.stop().await.unwrap();
}

/// Minors: requests serve refuses after its hyper-parity reader are answered and counted
/// by status in summary.json; an absolute-form target's authority is the Host that goes
/// up; `Forwarded` quotes a Host with a backslash.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_are_counted_and_hosts_follow_rfc_9112() {
    let peer = Peer::start(echo_handler()).await;
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("live");
    let serve = Serve::start(serve_args(&peer.url(""), &out)).await;
    for (what, req, status) in [
        (
            "gzip, chunked",
            "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
            "501",
        ),
        (
            "two hosts",
            "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
            "400",
        ),
        ("no host", "GET / HTTP/1.1\r\n\r\n", "400"),
        ("asterisk", "OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n", "400"),
        (
            "connect",
            "CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\n\r\n",
            "405",
        ),
    ] {
        let mut tcp = TcpStream::connect(serve.addr).await.unwrap();
        tcp.write_all(req.as_bytes()).await.unwrap();
        let got = read_response(&mut tcp).await;
        assert!(
            got.starts_with(&format!("HTTP/1.1 {status}")),
            "{what}: {got:?}"
        );
    }
    // One connection each: the reader here takes one response per connection.
    for req in [
        &b"GET http://target.example/abs HTTP/1.1\r\nHost: client.example\r\n\r\n"[..],
        b"GET /q HTTP/1.1\r\nHost: x\\\r\n\r\n",
    ] {
        let mut tcp = TcpStream::connect(serve.addr).await.unwrap();
        tcp.write_all(req).await.unwrap();
        let got = read_response(&mut tcp).await;
        assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    }
    let seen = peer.seen();
    let header = |i: usize, name: &str| {
        seen[i]
            .headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    assert_eq!(
        (seen[0].path.as_str(), header(0, "host").as_str()),
        ("/abs", "target.example")
    );
    assert!(
        header(1, "forwarded").ends_with(";host=\"x\\\\\""),
        "{}",
        header(1, "forwarded")
    );
    serve.stop().await.unwrap();
    let summary = read_json(&out.join("summary.json"));
    assert_eq!(
        summary["refused_requests"],
        serde_json::json!({"400": 3, "405": 1, "501": 1})
    );
    assert_eq!(summary["requests"], 2);
    assert_eq!(seen.len(), 2, "a refused request reached the worker");
}

/// Minors: a client too slow with its body gets 408 and the exchange is the client's
/// (`client_aborted`, `client_body_timeout`), not a 504 blaming the worker; a malformed
/// chunked body gets a 400 before the close.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_or_malformed_request_body_is_the_clients() {
    let peer = Peer::start(echo_handler()).await;
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("live");
    let mut args = serve_args(&peer.url(""), &out);
    args.upstream_timeout = 0.5;
    let serve = Serve::start(args).await;
    let mut tcp = TcpStream::connect(serve.addr).await.unwrap();
    tcp.write_all(b"POST /slow HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\nab")
        .await
        .unwrap();
    let got = read_response(&mut tcp).await;
    assert!(
        got.starts_with("HTTP/1.1 408") && got.contains("client_body_timeout"),
        "{got:?}"
    );
    let mut tcp = TcpStream::connect(serve.addr).await.unwrap();
    tcp.write_all(
        b"POST /bad HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcX\r\n",
    )
    .await
    .unwrap();
    let got = read_response(&mut tcp).await;
    assert!(got.starts_with("HTTP/1.1 400"), "{got:?}");
    serve.stop().await.unwrap();
    let rows = Rows::read(&out);
    let outcomes = rows.strs("outcome");
    let messages = rows.strs("error_message");
    assert_eq!(rows.len(), 2);
    for (o, m) in outcomes.iter().zip(&messages) {
        assert_eq!(o.as_deref(), Some("client_aborted"), "{m:?}");
    }
    assert!(
        messages
            .iter()
            .flatten()
            .any(|m| m.contains("client_body_timeout")),
        "{messages:?}"
    );
    assert!(
        messages.iter().flatten().any(|m| m.contains("malformed")),
        "{messages:?}"
    );
}

/// Minor: a worker that answers 413 before reading the body and closes is passed on, and
/// its status recorded (nginx does the same), instead of a 502 `transport`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_early_answer_from_a_worker_that_stops_reading_is_passed_on() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut b = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if tcp.read(&mut b).await.unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(b[0]);
                }
                let _ = tcp
                    .write_all(b"HTTP/1.1 413 Payload Too Large\r\ncontent-length: 8\r\nconnection: close\r\n\r\ntoo big!")
                    .await;
                // Close with the body unread: the kernel answers serve's writes with a reset.
                drop(tcp);
            });
        }
    });
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("live");
    let serve = Serve::start(serve_args(&format!("http://{up}"), &out)).await;
    let mut client = Client::connect(serve.addr).await;
    let big = vec![b'x'; 8 << 20];
    // serve passes the 413 on and closes; a client still writing the rest of its 8 MiB
    // may then meet the reset of that close before it reads the answer (serve does not
    // linger to drain the body yet), so its write error is tolerated here: what it did
    // read is the 413, and the row below says what serve forwarded.
    match client
        .send(request("POST", serve.addr, "/upload", big))
        .await
    {
        Ok((status, _, body)) => {
            assert_eq!((status.as_u16(), &body[..]), (413, &b"too big!"[..]));
        }
        Err(e) => assert!(e.contains("error writing a body"), "{e}"),
    }
    serve.stop().await.unwrap();
    let rows = Rows::read(&out);
    assert_eq!(rows.i32s("status"), [Some(413)]);
    assert_eq!(rows.strs("outcome"), [Some("ok".to_string())]);
}

/// Major 6: a recorder that fails stops unrecorded traffic by default: new requests get
/// 503 naming the failure, serve stops by itself with exit 3, and summary.json says how
/// many exchanges went unrecorded; `--on-record-fail forward` keeps forwarding and counts
/// them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_recorder_stops_unrecorded_traffic() {
    for forward in [false, true] {
        let peer = Peer::start(echo_handler()).await;
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("live");
        let mut args = serve_args(&peer.url(""), &out);
        args.run.part_rows = 1;
        if forward {
            args.on_record_fail = matrix_proxy::cli::OnRecordFail::Forward;
        }
        let serve = Serve::start(args).await;
        // The first part is written to a full disk.
        std::os::unix::fs::symlink(
            "/dev/full",
            out.join("exchanges/.part-00000.parquet.inprogress"),
        )
        .unwrap();
        let mut statuses = Vec::new();
        for i in 0..20 {
            let Ok(mut tcp) = TcpStream::connect(serve.addr).await else {
                break;
            };
            let req = format!("GET /r{i} HTTP/1.1\r\nHost: a\r\n\r\n");
            if tcp.write_all(req.as_bytes()).await.is_err() {
                break;
            }
            let got = read_response(&mut tcp).await;
            statuses.push(got.get(9..12).unwrap_or("").to_string());
            if got.contains("recording failed") {
                assert!(got.contains("No space left on device"), "{got}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let summary_of = |out: &std::path::Path| read_json(&out.join("summary.json"));
        if forward {
            assert!(statuses.iter().all(|s| s == "200"), "{statuses:?}");
            let err = serve.stop().await.unwrap_err();
            assert_eq!(err.exit, Exit::Tool);
            let s = summary_of(&out);
            assert!(s["unrecorded_exchanges"].as_u64().unwrap() >= 18, "{s}");
            assert_eq!(s["ending"], "stopped");
        } else {
            assert!(
                statuses.iter().any(|s| s == "503") || statuses.len() < 20,
                "{statuses:?}"
            );
            assert!(
                !statuses
                    .iter()
                    .skip_while(|s| *s == "200")
                    .any(|s| s == "200"),
                "traffic passed after the failure: {statuses:?}"
            );
            // serve stopped by itself.
            let ended = tokio::time::timeout(Duration::from_secs(30), serve.task)
                .await
                .expect("serve stopped by itself");
            let err = ended.unwrap().unwrap_err();
            assert_eq!(err.exit, Exit::Tool, "{}", err.message);
            assert!(
                err.message.contains("No space left on device"),
                "{}",
                err.message
            );
            let s = summary_of(&out);
            assert_eq!(s["ending"], "record_failed", "{s}");
            assert!(
                s["refused_requests"]["503"].as_u64().unwrap_or(0)
                    + s["unrecorded_exchanges"].as_u64().unwrap()
                    >= 1,
                "{s}"
            );
        }
    }
}

/// Memory: with `--relay-memory` far below what two slow clients' responses hold, both
/// still get their whole bodies (a relay with nothing queued always reads on), and what
/// serve held for them stayed bounded by back-pressure on the workers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_are_back_pressured_under_the_relay_memory_cap() {
    let (up, _) = bulk_peer(4 << 20).await;
    let tmp = tempfile::tempdir().unwrap();
    let mut args = serve_args(&format!("http://{up}"), &tmp.path().join("live"));
    args.relay_memory = Some(64 << 10);
    let serve = Serve::start(args).await;
    let mut conns = Vec::new();
    for _ in 0..2 {
        let mut tcp = TcpStream::connect(serve.addr).await.unwrap();
        tcp.write_all(b"GET /bulk HTTP/1.1\r\nHost: a\r\n\r\n")
            .await
            .unwrap();
        conns.push(tcp);
    }
    // Both clients take nothing for a while, then read everything.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for mut tcp in conns {
        let mut got = 0usize;
        let mut b = vec![0u8; 64 << 10];
        let head_and_body = async {
            loop {
                match tcp.read(&mut b).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got += n,
                }
                if got >= 4 << 20 {
                    break;
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(20), head_and_body)
            .await
            .unwrap();
        assert!(got >= 4 << 20, "{got}");
    }
    serve.stop().await.unwrap();
    let config = read_json(&tmp.path().join("live/config.json"));
    assert_eq!(
        config["recording"]["relay_memory_bytes"],
        64 << 10,
        "{config}"
    );
}
