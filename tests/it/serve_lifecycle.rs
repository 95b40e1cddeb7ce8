//! serve as a process: SIGTERM drains, the grace period cuts, SIGKILL loses at most the
//! open part, memory stays bounded for huge bodies, and clients can speak TLS.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use matrix_proxy::MockConfig;
use serde_json::json;

use crate::support::*;

pub struct Proc {
    pub child: tokio::process::Child,
    pub addr: SocketAddr,
    pub out: PathBuf,
}

pub async fn spawn_serve(upstream: &str, out: &Path, extra: &[&str]) -> Proc {
    let fixed = [
        "serve",
        "--quiet",
        "--listen",
        "127.0.0.1:0",
        "--upstream",
        upstream,
        "--out",
    ];
    let mut args: Vec<&std::ffi::OsStr> = fixed.iter().map(std::ffi::OsStr::new).collect();
    args.push(out.as_os_str());
    args.extend(extra.iter().map(std::ffi::OsStr::new));
    let child = spawn_bin(args);
    let config = out.join("config.json");
    for _ in 0..1000 {
        if config.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let addr = read_json(&config)["listen"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    Proc {
        child,
        addr,
        out: out.to_path_buf(),
    }
}

impl Proc {
    pub fn signal(&self, sig: &str) {
        signal(&self.child, sig);
    }
    pub async fn wait(&mut self) -> Option<i32> {
        exit_code(&mut self.child, 30).await
    }
}

fn chat(prompt: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({"messages": [{"role": "user", "content": prompt}], "max_tokens": 2}))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_in_flight_exchanges_finish_and_records_them_all() {
    let mock = start_mock(MockConfig {
        prefill_ms: 400.0,
        per_token_ms: 0.0,
        ..MockConfig::default()
    })
    .await;
    let tmp = tempfile::tempdir().unwrap();
    let mut p = spawn_serve(&mock.url(), &tmp.path().join("live"), &[]).await;
    let addr = p.addr;
    let clients: Vec<_> = (0..6)
        .map(|i| {
            tokio::spawn(async move {
                let mut c = Client::connect(addr).await;
                c.send(request(
                    "POST",
                    addr,
                    "/v1/chat/completions",
                    chat(&format!("p{i}")),
                ))
                .await
            })
        })
        .collect();
    for _ in 0..200 {
        if mock.seen().len() == 6 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(mock.seen().len(), 6, "all six are in flight");
    p.signal("-TERM");
    for c in clients {
        assert_eq!(
            c.await.unwrap().unwrap().0,
            200,
            "in-flight exchanges finish"
        );
    }
    assert_eq!(p.wait().await, Some(130));
    let rows = Rows::read(&p.out);
    assert_eq!(rows.len(), 6);
    assert!(
        rows.strs("outcome")
            .iter()
            .all(|o| o.as_deref() == Some("ok"))
    );
    assert!(read_json(&p.out.join("config.json"))["finished_at"].is_string());
    mock.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exchanges_still_running_at_the_end_of_the_grace_period_are_cut_and_recorded() {
    let mock = start_mock(MockConfig {
        prefill_ms: 0.0,
        per_token_ms: 0.0,
        stall_ms: 20_000,
        ..MockConfig::default()
    })
    .await;
    let tmp = tempfile::tempdir().unwrap();
    let mut p = spawn_serve(
        &mock.url(),
        &tmp.path().join("live"),
        &["--grace-seconds", "0.3"],
    )
    .await;
    let addr = p.addr;
    let client = tokio::spawn(async move {
        let mut c = Client::connect(addr).await;
        let mut r = request("POST", addr, "/v1/chat/completions", chat("stall"));
        r.headers_mut()
            .insert("x-mock-fault", "stall".parse().unwrap());
        c.send(r).await
    });
    for _ in 0..200 {
        if !mock.seen().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    p.signal("-TERM");
    let started = matrix_proxy::now_ns();
    assert_eq!(p.wait().await, Some(130));
    let took = Duration::from_nanos(matrix_proxy::now_ns() - started);
    assert!(
        took < Duration::from_secs(5),
        "the grace period bounds the stop ({took:?})"
    );
    // Cut at the grace's end: answered 503, or the connection closed with no answer
    // (a close, or a reset when the process exits).
    match client.await.unwrap() {
        Ok(answer) => assert_eq!(answer.0, 503, "a cut exchange is answered 503"),
        Err(e) => assert!(
            e == "connection closed before message completed" || e == "connection error",
            "a cut exchange closes its connection without an answer: {e}"
        ),
    }
    let rows = Rows::read(&p.out);
    assert_eq!(rows.strs("outcome"), vec![Some("shutdown_cut".to_string())]);
    mock.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_loses_at_most_the_open_part() {
    let mock = start_mock(MockConfig {
        prefill_ms: 0.0,
        per_token_ms: 0.0,
        ..MockConfig::default()
    })
    .await;
    let tmp = tempfile::tempdir().unwrap();
    let mut p = spawn_serve(&mock.url(), &tmp.path().join("live"), &["--part-rows", "5"]).await;
    let mut c = Client::connect(p.addr).await;
    for i in 0..13 {
        assert_eq!(
            c.send(request(
                "POST",
                p.addr,
                "/v1/chat/completions",
                chat(&format!("{i}"))
            ))
            .await
            .unwrap()
            .0,
            200
        );
    }
    // Wait until two parts have closed (10 rows), then kill without warning.
    let closed = |dir: &Path| {
        std::fs::read_dir(dir.join("exchanges"))
            .unwrap()
            .filter(|e| {
                let n = e
                    .as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .into_owned();
                n.starts_with("part-") && n.ends_with(".parquet")
            })
            .count()
    };
    for _ in 0..500 {
        if closed(&p.out) >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(closed(&p.out), 2);
    p.signal("-KILL");
    assert_eq!(p.wait().await, None, "killed by a signal");
    let mut rows = 0;
    let mut ids = Vec::new();
    for f in part_files(&p.out) {
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        if name.ends_with(".parquet") {
            let b = read_parquet(&f);
            rows += b.iter().map(|b| b.num_rows()).sum::<usize>();
            ids.push(name);
        } else {
            assert!(
                name.starts_with(".part-") && name.ends_with(".inprogress"),
                "{name}"
            );
        }
    }
    assert_eq!(
        rows, 10,
        "the closed parts hold their rows; only the open part is lost"
    );
    assert_eq!(ids, vec!["part-00000.parquet", "part-00001.parquet"]);
    mock.shutdown().await;
}

pub fn peak_rss_kb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_512_mib_upload_and_download_go_through_in_bounded_memory() {
    use http_body_util::BodyExt;
    const N: u64 = 512 << 20;
    let (peer, uploaded) = bulk_peer(N).await;
    let tmp = tempfile::tempdir().unwrap();
    let mut p = spawn_serve(&format!("http://{peer}"), &tmp.path().join("live"), &[]).await;
    let tcp = tokio::net::TcpStream::connect(p.addr).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(conn);
    let req = hyper::Request::builder()
        .method("POST")
        .uri("/bulk")
        .header("host", p.addr.to_string())
        .header("content-length", N)
        .body(Generated { left: N })
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    let mut body = resp.into_body();
    let mut got = 0u64;
    while let Some(f) = body.frame().await {
        got += f.unwrap().into_data().map(|d| d.len() as u64).unwrap_or(0);
    }
    assert_eq!(got, N);
    assert_eq!(uploaded.load(std::sync::atomic::Ordering::Relaxed), N);
    let peak_kb = peak_rss_kb(p.child.id().unwrap());
    eprintln!(
        "serve peak RSS after 512 MiB each way: {} MiB",
        peak_kb / 1024
    );
    p.signal("-TERM");
    assert_eq!(p.wait().await, Some(130));
    // Two 16 MiB record copies plus buffers: far below the 1 GiB that went through.
    assert!(
        peak_kb < 200 * 1024,
        "serve's peak RSS was {} MiB",
        peak_kb / 1024
    );
    let rows = Rows::read(&p.out);
    assert_eq!(rows.i64s("request_body_len"), vec![Some(N as i64)]);
    assert_eq!(rows.i64s("response_body_len"), vec![Some(N as i64)]);
    assert_eq!(rows.bins("response_body")[0].len(), 16 << 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_can_speak_tls_to_serve() {
    let mock = start_mock(MockConfig::default()).await;
    let tmp = tempfile::tempdir().unwrap();
    let (ca, _) = tls_setup(tmp.path());
    let cert = tmp.path().join("server.pem");
    let key = tmp.path().join("server.key");
    let mut p = spawn_serve(
        &mock.url(),
        &tmp.path().join("live"),
        &[
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
        ],
    )
    .await;
    // A rustls client that trusts only the test CA.
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(&ca).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(p.addr).await.unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(
            rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap(),
            tcp,
        )
        .await
        .unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(conn);
    let resp = sender
        .send_request(request("GET", p.addr, "/health", ""))
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    p.signal("-TERM");
    assert_eq!(p.wait().await, Some(130));
    let rows = Rows::read(&p.out);
    assert_eq!(rows.len(), 1);
    let h = &rows.headers("request_headers")[0];
    assert!(
        h.iter()
            .any(|(k, v)| k == "x-forwarded-proto" && v == b"https")
    );
    mock.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_serve_run_with_no_exchanges_leaves_one_valid_empty_part() {
    let tmp = tempfile::tempdir().unwrap();
    let serve = Serve::start(serve_args("http://127.0.0.1:9", &tmp.path().join("live"))).await;
    let out = serve.out.clone();
    serve.stop().await.unwrap();
    let parts = part_files(&out);
    assert_eq!(parts.len(), 1, "{parts:?}");
    let batches = read_parquet(&parts[0]);
    assert_eq!(batches.iter().map(|b| b.num_rows()).sum::<usize>(), 0);
    // The schema is there for queries: the file names every column.
    let f = std::fs::File::open(&parts[0]).unwrap();
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(f).unwrap();
    assert!(reader.schema().field_with_name("outcome").is_ok());
    assert!(
        out.join("exchanges.ledger").is_file(),
        "the ledger sits beside exchanges/"
    );
    assert!(!out.join("exchanges").join(".ledger").exists());
}
