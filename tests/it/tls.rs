//! https workers through rustls: a full handshake in every `fresh` sample, reuse under
//! `keep-alive`, and a clear recorded failure for an untrusted certificate.

use matrix_proxy::cli::Exit;
use serde_json::{Value, json};

use crate::support::*;

fn plan(url: &str, connection: &str) -> Value {
    json!({
        "endpoint": url, "connection": connection,
        "cases": [{"name": "a", "request": {"q": 1}, "expected_response": {"echo": {"q": 1}}}],
        "concurrency": [1, 2], "requests_per_case": 4, "timeout_seconds": 5, "metadata": metadata(),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_fresh_pays_a_full_handshake_every_time_and_keep_alive_reuses() {
    let tmp = tempfile::tempdir().unwrap();
    let (ca, acceptor) = tls_setup(tmp.path());
    let peer = Peer::start_with(echo_handler(), Some(acceptor)).await;
    let url = format!("https://127.0.0.1:{}/v1/echo", peer.addr.port());
    for connection in ["fresh", "keep-alive"] {
        let path = write_plan(
            tmp.path(),
            &format!("{connection}.json"),
            &plan(&url, connection),
        );
        let out = tmp.path().join(connection);
        let mut args = replay_args(&path, &out);
        args.ca_cert = Some(ca.clone());
        assert_eq!(replay(args).await.unwrap(), Exit::Ok, "{connection}");
        let rows = Rows::read(&out);
        let (connect, tls, resumed, sent) = (
            rows.i64s("connect_us"),
            rows.i64s("tls_us"),
            rows.bools("tls_resumed"),
            rows.i64s("request_sent_us"),
        );
        let reused = rows.bools("connection_reused");
        let phase = rows.strs("phase");
        for i in 0..rows.len() {
            if connection == "fresh" || reused[i] == Some(false) {
                let (c, t) = (connect[i].unwrap(), tls[i].unwrap());
                assert!(
                    c <= t && t <= sent[i].unwrap(),
                    "row {i}: connect {c} tls {t}"
                );
            }
            if connection == "fresh" {
                assert_eq!(
                    resumed[i],
                    Some(false),
                    "fresh disables resumption (row {i})"
                );
            } else if phase[i].as_deref() == Some("measured") {
                assert_eq!((reused[i], tls[i]), (Some(true), None), "row {i}");
            }
        }
        let urls = rows.strs("url");
        assert!(
            urls.iter()
                .all(|u| u.as_deref().unwrap().starts_with("https://127.0.0.1:"))
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn untrusted_certificate_is_a_recorded_transport_failure() {
    let tmp = tempfile::tempdir().unwrap();
    let (_ca, acceptor) = tls_setup(tmp.path());
    let (other_ca, _) = tls_setup(&{
        let d = tmp.path().join("other");
        std::fs::create_dir(&d).unwrap();
        d
    });
    let peer = Peer::start_with(echo_handler(), Some(acceptor)).await;
    let url = format!("https://127.0.0.1:{}/v1/echo", peer.addr.port());
    let path = write_plan(tmp.path(), "p.json", &plan(&url, "fresh"));
    let out = tmp.path().join("run");
    let mut args = replay_args(&path, &out);
    args.ca_cert = Some(other_ca);
    assert_eq!(replay(args).await.unwrap(), Exit::Failure);
    let rows = Rows::read(&out);
    assert_eq!(rows.len(), 1);
    let msg = rows.strs("error_message")[0].clone().unwrap();
    assert!(
        msg.starts_with("tls handshake: invalid peer certificate"),
        "{msg}"
    );
    assert_eq!(rows.strs("outcome")[0].as_deref(), Some("transport"));

    // A CA file that is not PEM is unusable input, refused before any output exists.
    let bogus = tmp.path().join("bogus.pem");
    std::fs::write(&bogus, "not a certificate").unwrap();
    let mut args = replay_args(&path, &tmp.path().join("never"));
    args.ca_cert = Some(bogus);
    let err = replay(args).await.unwrap_err();
    assert_eq!(err.exit, Exit::Usage);
    assert!(
        err.message
            .contains("bogus.pem: contains no PEM certificate"),
        "{}",
        err.message
    );
    assert!(!tmp.path().join("never").exists());
}
