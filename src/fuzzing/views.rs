//! What the fuzz views share: the runtime each input runs on, and hyper's server over
//! one connection. A leaf: it imports nothing else from `fuzzing`.

/// The current-thread runtime every view of one fuzz input runs on.
pub(super) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime for the fuzz target")
}

/// Why a view of a fuzz input has no reading of it: whose reader refused the bytes, and
/// its words (only whether both sides refused is compared).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum Refused {
    /// Our reader (the engine's or serve's) refused them.
    #[error("{0}")]
    Ours(String),
    /// hyper refused them, or its connection failed.
    #[error("{0}")]
    Hyper(String),
    #[error("hyper did not finish in 5 s")]
    Timeout,
    /// The connection did not end cleanly and no request reached hyper's service.
    #[error("hyper's server refused the request")]
    NoRequest,
}

/// Every request hyper's HTTP/1 server hands its service (which reads each whole body)
/// from `data` sent on one connection, then the client's close: each request's parts and
/// body, whether the connection ended cleanly, and what the server answered.
pub(super) type ServerRun = (
    Vec<(http::request::Parts, Result<Vec<u8>, Refused>)>,
    bool,
    Vec<u8>,
);

pub(super) fn hyper_server_run(
    rt: &tokio::runtime::Runtime,
    data: &[u8],
) -> Result<ServerRun, Refused> {
    use http_body_util::BodyExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let data = data.to_vec();
    rt.block_on(async move {
        let (mut client, server) = tokio::io::duplex(data.len() + (64 << 10));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let svc = hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
            let tx = tx.clone();
            async move {
                let (parts, body) = req.into_parts();
                let body = body.collect().await.map(|b| b.to_bytes().to_vec());
                let _ = tx.send((parts, body.map_err(|e| Refused::Hyper(e.to_string()))));
                Ok::<_, std::convert::Infallible>(http::Response::new(http_body_util::Empty::<
                    bytes::Bytes,
                >::new()))
            }
        });
        let conn = hyper::server::conn::http1::Builder::new()
            .half_close(true)
            .serve_connection(hyper_util::rt::TokioIo::new(server), svc);
        let serving = tokio::spawn(conn);
        let mut answer = Vec::new();
        let talk = async {
            let _ = client.write_all(&data).await;
            let _ = client.shutdown().await;
            let _ = client.read_to_end(&mut answer).await;
            matches!(serving.await, Ok(Ok(())))
        };
        let clean = tokio::time::timeout(std::time::Duration::from_secs(5), talk)
            .await
            .map_err(|_| Refused::Timeout)?;
        let mut seen = Vec::new();
        while let Ok(one) = rx.try_recv() {
            seen.push(one);
        }
        Ok((seen, clean, answer))
    })
}
