//! Test equipment: a scriptable loopback peer that logs exactly what it received, plan
//! builders, in-process replay, and Parquet read-back.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arrow_array::{
    Array, ArrayRef, BinaryArray, BooleanArray, Int32Array, Int64Array, ListArray, RecordBatch,
    StringArray, StructArray,
};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use matrix_proxy::Shutdown;
use matrix_proxy::cli::{self, CliError, Exit, ReplayArgs};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use serde_json::{Value, json};
use tokio::net::TcpListener;

/// One request as a test peer received it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
}

pub struct Reply {
    pub status: u16,
    pub body: Vec<u8>,
    pub headers: Vec<(&'static str, String)>,
    pub delay: Duration,
}

impl Reply {
    /// `body` as it is, with no headers.
    pub fn bytes(status: u16, body: Vec<u8>) -> Reply {
        Reply {
            status,
            body,
            headers: vec![],
            delay: Duration::ZERO,
        }
    }

    pub fn json(status: u16, v: &Value) -> Reply {
        Reply {
            status,
            body: serde_json::to_vec(v).unwrap(),
            headers: vec![("content-type", "application/json".into())],
            delay: Duration::ZERO,
        }
    }
}

pub type Handler = Arc<dyn Fn(usize, &Seen) -> Reply + Send + Sync>;

/// A loopback HTTP/1.1 peer that logs every request in arrival order and answers with
/// `handler(index, request)`.
pub struct Peer {
    pub addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    seen: Arc<Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Peer {
    pub async fn start(handler: Handler) -> Peer {
        Peer::start_with(handler, None).await
    }

    /// Like [`Peer::start`], speaking TLS with `acceptor` when given.
    pub async fn start_with(handler: Handler, acceptor: Option<tokio_rustls::TlsAcceptor>) -> Peer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let count = Arc::new(AtomicUsize::new(0));
        let log = seen.clone();
        let accepted = Arc::new(AtomicUsize::new(0));
        let accepts = accepted.clone();
        let task = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                accepts.fetch_add(1, Ordering::SeqCst);
                let handler = handler.clone();
                let log = log.clone();
                let count = count.clone();
                let acceptor = acceptor.clone();
                conns.spawn(async move {
                    let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                        let handler = handler.clone();
                        let log = log.clone();
                        let count = count.clone();
                        async move {
                            let (parts, body) = req.into_parts();
                            let body = body
                                .collect()
                                .await
                                .map(|b| b.to_bytes())
                                .unwrap_or_default();
                            let seen = Seen {
                                method: parts.method.to_string(),
                                path: parts.uri.to_string(),
                                headers: parts
                                    .headers
                                    .iter()
                                    .map(|(k, v)| {
                                        (
                                            k.to_string(),
                                            String::from_utf8_lossy(v.as_bytes()).into(),
                                        )
                                    })
                                    .collect(),
                                body,
                            };
                            let i = count.fetch_add(1, Ordering::SeqCst);
                            log.lock().unwrap().push(seen.clone());
                            let reply = handler(i, &seen);
                            if !reply.delay.is_zero() {
                                tokio::time::sleep(reply.delay).await;
                            }
                            let mut resp = hyper::Response::new(Full::new(Bytes::from(reply.body)));
                            *resp.status_mut() = hyper::StatusCode::from_u16(reply.status).unwrap();
                            for (k, v) in reply.headers {
                                resp.headers_mut().append(k, v.parse().unwrap());
                            }
                            Ok::<_, Infallible>(resp)
                        }
                    });
                    match acceptor {
                        None => {
                            let _ = http1::Builder::new()
                                .serve_connection(TokioIo::new(tcp), svc)
                                .await;
                        }
                        Some(acc) => {
                            if let Ok(tls) = acc.accept(tcp).await {
                                let _ = http1::Builder::new()
                                    .serve_connection(TokioIo::new(tls), svc)
                                    .await;
                            }
                        }
                    }
                });
            }
        });
        Peer {
            addr,
            accepted,
            seen,
            task,
        }
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A handler that answers `GET /health` with 200 and every POST with `{"echo": <request>}`.
pub fn echo_handler() -> Handler {
    Arc::new(|_, seen: &Seen| {
        if seen.method == "GET" {
            return Reply::json(200, &json!({"status": "ok"}));
        }
        let req: Value = serde_json::from_slice(&seen.body).unwrap_or(Value::Null);
        Reply::json(200, &json!({"echo": req}))
    })
}

/// [`echo_handler`], each answer `delay` late.
pub fn slow_echo_handler(delay: Duration) -> Handler {
    let echo = echo_handler();
    Arc::new(move |i, seen: &Seen| {
        let mut r = echo(i, seen);
        r.delay = delay;
        r
    })
}

/// A one-case plan against [`echo_handler`] at `url`: `{"q": 1}` answered
/// `{"echo": {"q": 1}}`, at one concurrency, over `connection` (`fresh`, `keep-alive`).
pub fn echo_plan(
    url: String,
    connection: &str,
    concurrency: usize,
    requests_per_case: usize,
) -> Value {
    json!({
        "endpoint": url,
        "connection": connection,
        "cases": [{"name": "a", "request": {"q": 1}, "expected_response": {"echo": {"q": 1}}}],
        "concurrency": [concurrency], "requests_per_case": requests_per_case, "timeout_seconds": 5,
        "metadata": metadata(),
    })
}

/// Write `plan` in `dir` and start `matrix-proxy replay --quiet FLAGS --out DIR/run PLAN`
/// as a child; the child and its run directory.
pub fn spawn_replay(dir: &Path, plan: &Value, flags: &[&str]) -> (tokio::process::Child, PathBuf) {
    let path = write_plan(dir, "p.json", plan);
    let run = dir.join("run");
    let mut args: Vec<std::ffi::OsString> = vec!["replay".into(), "--quiet".into()];
    args.extend(flags.iter().map(Into::into));
    args.extend(["--out".into(), run.clone().into(), path.into()]);
    (spawn_bin(args), run)
}

pub fn metadata() -> Value {
    json!({"gpu": "N/A: test", "gpu_ids": "N/A", "driver": "N/A", "cuda": "N/A", "precision": "N/A",
        "model_revision": "test", "runtime_revision": "test", "cache_policy": "none",
        "cuda_evidence": "N/A", "reservation": "N/A", "host": "127.0.0.1"})
}

/// Write `plan` into `dir/name` and return its path.
pub fn write_plan(dir: &Path, name: &str, plan: &Value) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, serde_json::to_vec_pretty(plan).unwrap()).unwrap();
    p
}

/// `matrix-proxy replay --quiet --out OUT PLAN` as clap parses it (every other flag at
/// its default).
pub fn replay_args(plan: &Path, out: &Path) -> ReplayArgs {
    use clap::Parser;
    let cli = cli::Cli::try_parse_from([
        "matrix-proxy",
        "replay",
        "--quiet",
        "--out",
        out.to_str().unwrap(),
        plan.to_str().unwrap(),
    ])
    .unwrap();
    match cli.command {
        cli::Command::Replay(a) => a,
        _ => unreachable!(),
    }
}

/// Write `plan` as `dir/p.json` and replay it into `dir/run`; the run directory and the
/// exit code (a CLI error is a test failure here).
pub async fn replay_plan(dir: &Path, plan: &Value) -> (PathBuf, Exit) {
    let path = write_plan(dir, "p.json", plan);
    let out = dir.join("run");
    let exit = replay(replay_args(&path, &out)).await.unwrap();
    (out, exit)
}

/// Run `replay` in-process (same code path as the binary, minus argv parsing).
pub async fn replay(args: ReplayArgs) -> Result<Exit, CliError> {
    tokio::time::timeout(
        Duration::from_secs(120),
        cli::replay_cmd(args, Arc::new(Shutdown::default())),
    )
    .await
    .expect("replay finished within 120 s")
}

/// All rows of a run's `exchanges/part-*.parquet`, in exchange_id order.
pub struct Rows {
    pub batches: Vec<RecordBatch>,
}

pub fn read_parquet(path: &Path) -> Vec<RecordBatch> {
    let f = std::fs::File::open(path).unwrap();
    let reader = ParquetRecordBatchReaderBuilder::try_new(f)
        .unwrap()
        .build()
        .unwrap();
    reader.map(|b| b.unwrap()).collect()
}

/// Every file in `run/exchanges` (the writer's ledger sits beside it, not in it).
pub fn part_files(run: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(run.join("exchanges"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    v.sort();
    v
}

impl Rows {
    pub fn read(run: &Path) -> Rows {
        let files: Vec<PathBuf> = part_files(run);
        for f in &files {
            let name = f.file_name().unwrap().to_string_lossy().into_owned();
            assert!(
                name.starts_with("part-") && name.ends_with(".parquet"),
                "unexpected file left in exchanges/: {name}"
            );
        }
        Rows {
            batches: files.iter().flat_map(|f| read_parquet(f)).collect(),
        }
    }

    /// One Parquet file (rounds.parquet, say).
    pub fn read_file(path: &Path) -> Rows {
        Rows {
            batches: read_parquet(path),
        }
    }

    pub fn len(&self) -> usize {
        self.batches.iter().map(|b| b.num_rows()).sum()
    }

    pub fn f64s(&self, name: &str) -> Vec<Option<f64>> {
        self.col(name)
            .flat_map(|a| {
                let a = a
                    .as_any()
                    .downcast_ref::<arrow_array::Float64Array>()
                    .unwrap_or_else(|| panic!("{name} is not Float64"));
                (0..a.len())
                    .map(|i| a.is_valid(i).then(|| a.value(i)))
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    fn col<'a>(&'a self, name: &str) -> impl Iterator<Item = &'a ArrayRef> {
        let name = name.to_string();
        self.batches.iter().map(move |b| {
            b.column_by_name(&name)
                .unwrap_or_else(|| panic!("no column {name}"))
        })
    }

    pub fn strs(&self, name: &str) -> Vec<Option<String>> {
        self.col(name)
            .flat_map(|a| {
                let a = a
                    .as_any()
                    .downcast_ref::<StringArray>()
                    .unwrap_or_else(|| panic!("{name} is not Utf8"));
                (0..a.len())
                    .map(|i| a.is_valid(i).then(|| a.value(i).to_string()))
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    pub fn i64s(&self, name: &str) -> Vec<Option<i64>> {
        self.col(name)
            .flat_map(|a| {
                let a = a
                    .as_any()
                    .downcast_ref::<Int64Array>()
                    .unwrap_or_else(|| panic!("{name} is not Int64"));
                (0..a.len())
                    .map(|i| a.is_valid(i).then(|| a.value(i)))
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    pub fn i32s(&self, name: &str) -> Vec<Option<i32>> {
        self.col(name)
            .flat_map(|a| {
                let a = a
                    .as_any()
                    .downcast_ref::<Int32Array>()
                    .unwrap_or_else(|| panic!("{name} is not Int32"));
                (0..a.len())
                    .map(|i| a.is_valid(i).then(|| a.value(i)))
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    pub fn bools(&self, name: &str) -> Vec<Option<bool>> {
        self.col(name)
            .flat_map(|a| {
                let a = a
                    .as_any()
                    .downcast_ref::<BooleanArray>()
                    .unwrap_or_else(|| panic!("{name} is not Boolean"));
                (0..a.len())
                    .map(|i| a.is_valid(i).then(|| a.value(i)))
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    pub fn bins(&self, name: &str) -> Vec<Vec<u8>> {
        self.col(name)
            .flat_map(|a| {
                let a = a
                    .as_any()
                    .downcast_ref::<BinaryArray>()
                    .unwrap_or_else(|| panic!("{name} is not Binary"));
                (0..a.len())
                    .map(|i| a.value(i).to_vec())
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// A nullable `List<Int64>` column.
    pub fn int_lists(&self, name: &str) -> Vec<Option<Vec<i64>>> {
        self.col(name)
            .flat_map(|a| {
                let l = a
                    .as_any()
                    .downcast_ref::<ListArray>()
                    .unwrap_or_else(|| panic!("{name} is not a list"));
                (0..l.len())
                    .map(|i| {
                        l.is_valid(i).then(|| {
                            let v = l.value(i);
                            let v = v.as_any().downcast_ref::<Int64Array>().unwrap();
                            v.values().to_vec()
                        })
                    })
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// Headers of each row as (name, value) pairs.
    pub fn headers(&self, name: &str) -> Vec<Vec<(String, Vec<u8>)>> {
        self.col(name)
            .flat_map(|a| {
                let l = a.as_any().downcast_ref::<ListArray>().expect("header list");
                (0..l.len())
                    .map(|i| {
                        let v = l.value(i);
                        let s = v.as_any().downcast_ref::<StructArray>().unwrap();
                        let names = s.column(0).as_any().downcast_ref::<StringArray>().unwrap();
                        let vals = s.column(1).as_any().downcast_ref::<BinaryArray>().unwrap();
                        (0..s.len())
                            .map(|j| (names.value(j).to_string(), vals.value(j).to_vec()))
                            .collect()
                    })
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// Rows counted by `case:outcome` (health rows have an empty case).
    pub fn outcomes_by_case(&self) -> HashMap<String, usize> {
        let (case, outcome) = (self.strs("case_name"), self.strs("outcome"));
        self.count_by(|i| {
            format!(
                "{}:{}",
                case[i].clone().unwrap_or_default(),
                outcome[i].clone().unwrap()
            )
        })
    }

    /// Row indices grouped by a key function.
    pub fn count_by(&self, key: impl Fn(usize) -> String) -> HashMap<String, usize> {
        let mut m = HashMap::new();
        for i in 0..self.len() {
            *m.entry(key(i)).or_insert(0) += 1;
        }
        m
    }
}

/// Every string-like value in a record batch (Utf8, Binary as lossy text, and nested
/// lists/structs), so a secret search decodes the file instead of grepping bytes.
pub fn all_text(batches: &[RecordBatch]) -> Vec<String> {
    fn walk(a: &dyn Array, out: &mut Vec<String>) {
        if let Some(s) = a.as_any().downcast_ref::<StringArray>() {
            out.extend(
                (0..s.len())
                    .filter(|&i| s.is_valid(i))
                    .map(|i| s.value(i).to_string()),
            );
        } else if let Some(b) = a.as_any().downcast_ref::<BinaryArray>() {
            out.extend(
                (0..b.len())
                    .filter(|&i| b.is_valid(i))
                    .map(|i| String::from_utf8_lossy(b.value(i)).into_owned()),
            );
        } else if let Some(l) = a.as_any().downcast_ref::<ListArray>() {
            walk(l.values().as_ref(), out);
        } else if let Some(s) = a.as_any().downcast_ref::<StructArray>() {
            for c in s.columns() {
                walk(c.as_ref(), out);
            }
        }
    }
    let mut out = Vec::new();
    for b in batches {
        for c in b.columns() {
            walk(c.as_ref(), &mut out);
        }
    }
    out
}

/// Rewrite the run's first exchanges part with `column` of its row `row` (from 0) made
/// by `edit` (the batch's column and the row's index in it), every other value and the
/// schema kept: a damaged or edited file. Its path.
pub fn set_cell(
    run: &Path,
    column: &str,
    row: usize,
    edit: impl Fn(&ArrayRef, usize) -> ArrayRef,
) -> PathBuf {
    let part = part_files(run).into_iter().next().unwrap();
    let batches = read_parquet(&part);
    let schema = batches[0].schema();
    let at = schema.index_of(column).unwrap();
    let tmp = part.with_extension("rewrite");
    let file = std::fs::File::create(&tmp).unwrap();
    let mut w = parquet::arrow::ArrowWriter::try_new(file, schema.clone(), None).unwrap();
    let mut first = 0;
    for b in batches {
        let mut columns = b.columns().to_vec();
        if (first..first + b.num_rows()).contains(&row) {
            columns[at] = edit(&columns[at], row - first);
        }
        w.write(&RecordBatch::try_new(schema.clone(), columns).unwrap())
            .unwrap();
        first += b.num_rows();
    }
    w.close().unwrap();
    std::fs::rename(&tmp, &part).unwrap();
    part
}

/// [`set_cell`] of an Int64 column.
pub fn set_i64(run: &Path, column: &str, row: usize, value: i64) -> PathBuf {
    set_cell(run, column, row, |old, at| {
        let old = old.as_any().downcast_ref::<Int64Array>().unwrap();
        let new: Int64Array = (0..old.len())
            .map(|i| match i == at {
                true => Some(value),
                false => old.is_valid(i).then(|| old.value(i)),
            })
            .collect();
        Arc::new(new)
    })
}

/// [`set_cell`] of a Utf8 column.
pub fn set_str(run: &Path, column: &str, row: usize, value: &str) -> PathBuf {
    set_cell(run, column, row, |old, at| {
        let old = old.as_any().downcast_ref::<StringArray>().unwrap();
        let new: StringArray = (0..old.len())
            .map(|i| match i == at {
                true => Some(value),
                false => old.is_valid(i).then(|| old.value(i)),
            })
            .collect();
        Arc::new(new)
    })
}

pub fn read_json(path: &Path) -> Value {
    serde_json::from_slice(
        &std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
    )
    .unwrap()
}

/// A throwaway CA and a server certificate for 127.0.0.1 signed by it. Returns the CA's
/// PEM file (for `--ca-cert`) and an acceptor for [`Peer::start_with`]; also writes the
/// server's chain and key as `server.pem` / `server.key` in `dir`.
pub fn tls_setup(dir: &Path) -> (PathBuf, tokio_rustls::TlsAcceptor) {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
        .unwrap()
        .signed_by(&leaf_key, &ca)
        .unwrap();
    let ca_path = dir.join("ca.pem");
    std::fs::write(&ca_path, ca.pem()).unwrap();
    std::fs::write(
        dir.join("server.pem"),
        format!("{}{}", leaf.pem(), ca.pem()),
    )
    .unwrap();
    std::fs::write(dir.join("server.key"), leaf_key.serialize_pem()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone(), ca.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der())),
        )
        .unwrap();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    (ca_path, tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

/// A plain HTTP/1.1 client connection for tests (keep-alive: reuse the same `Client`).
pub struct Client {
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
}

pub type Answer = (hyper::StatusCode, hyper::HeaderMap, Bytes);

impl Client {
    pub async fn connect(addr: SocketAddr) -> Client {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .unwrap();
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Client { sender }
    }

    /// Send a request; `Err` if the response (head or body) did not arrive whole.
    pub async fn send(&mut self, req: hyper::Request<Full<Bytes>>) -> Result<Answer, String> {
        self.sender.ready().await.map_err(|e| e.to_string())?;
        let resp = self
            .sender
            .send_request(req)
            .await
            .map_err(|e| e.to_string())?;
        let (parts, body) = resp.into_parts();
        let body = body
            .collect()
            .await
            .map_err(|e| format!("body: {e}"))?
            .to_bytes();
        Ok((parts.status, parts.headers, body))
    }
}

pub fn request(
    method: &str,
    addr: SocketAddr,
    path: &str,
    body: impl Into<Bytes>,
) -> hyper::Request<Full<Bytes>> {
    hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string())
        .body(Full::new(body.into()))
        .unwrap()
}

/// A `serve` run in-process: its address, run directory, stop flag and task.
pub struct Serve {
    pub addr: SocketAddr,
    pub out: PathBuf,
    pub stop: Arc<Shutdown>,
    pub task: tokio::task::JoinHandle<Result<Exit, CliError>>,
}

pub fn serve_args(upstream: &str, out: &Path) -> cli::ServeArgs {
    use clap::Parser;
    let cli = cli::Cli::try_parse_from([
        "matrix-proxy",
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--upstream",
        upstream,
        "--quiet",
        "--out",
        out.to_str().unwrap(),
    ])
    .unwrap();
    match cli.command {
        cli::Command::Serve(a) => a,
        _ => unreachable!(),
    }
}

/// The address a `serve` run listens on, once its config.json exists (up to 10 s).
pub async fn serve_address(out: &Path) -> SocketAddr {
    let config = out.join("config.json");
    for _ in 0..1000 {
        if config.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    read_json(&config)["listen"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap()
}

/// The built-in mock worker on a free loopback port.
pub async fn start_mock(config: matrix_proxy::MockConfig) -> matrix_proxy::MockWorker {
    matrix_proxy::MockWorker::start("127.0.0.1:0".parse().unwrap(), config)
        .await
        .unwrap()
}

impl Serve {
    pub async fn start(args: cli::ServeArgs) -> Serve {
        let out = args.run.out.clone().unwrap();
        let stop = Arc::new(Shutdown::default());
        let task = tokio::spawn(cli::serve_cmd(args, stop.clone()));
        let addr = serve_address(&out).await;
        Serve {
            addr,
            out,
            stop,
            task,
        }
    }

    /// Stop as Ctrl-C would, and wait for the files to be closed.
    pub async fn stop(self) -> Result<Exit, CliError> {
        self.stop.request();
        tokio::time::timeout(Duration::from_secs(60), self.task)
            .await
            .expect("serve stopped within 60 s")
            .unwrap()
    }
}

/// A loopback HTTP/1.1 server answering every request with `handler(request).await`.
pub async fn http_server<F, Fut, B>(handler: F) -> SocketAddr
where
    F: Fn(hyper::Request<hyper::body::Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = hyper::Response<B>> + Send + 'static,
    B: hyper::body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let handler = handler.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req| {
                    let fut = handler(req);
                    async move { Ok::<_, Infallible>(fut.await) }
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    addr
}

/// A worker that answers every request with `n` generated bytes in 64 KiB frames, and
/// counts (and discards) uploaded bytes, so neither side holds a whole body.
pub async fn bulk_peer(n: u64) -> (SocketAddr, Arc<std::sync::atomic::AtomicU64>) {
    let uploaded = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let up = uploaded.clone();
    let addr = http_server(move |req: hyper::Request<hyper::body::Incoming>| {
        let up = up.clone();
        async move {
            let mut body = req.into_body();
            while let Some(f) = body.frame().await {
                if let Ok(d) = f.unwrap().into_data() {
                    up.fetch_add(d.len() as u64, std::sync::atomic::Ordering::Relaxed);
                }
            }
            let mut r = hyper::Response::new(Generated { left: n });
            r.headers_mut().insert("content-length", n.into());
            r
        }
    })
    .await;
    (addr, uploaded)
}

pub struct Generated {
    pub left: u64,
}

impl hyper::body::Body for Generated {
    type Data = Bytes;
    type Error = std::convert::Infallible;
    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        static CHUNK: [u8; 65536] = [b'z'; 65536];
        if self.left == 0 {
            return std::task::Poll::Ready(None);
        }
        let n = self.left.min(CHUNK.len() as u64);
        self.left -= n;
        std::task::Poll::Ready(Some(Ok(hyper::body::Frame::data(Bytes::from_static(
            &CHUNK[..n as usize],
        )))))
    }
    fn size_hint(&self) -> hyper::body::SizeHint {
        hyper::body::SizeHint::with_exact(self.left)
    }
}

/// Read one HTTP/1.1 request off a raw socket (head, then a Content-Length body); its
/// target, or `None` when the peer closed first.
pub async fn read_raw_request(tcp: &mut tokio::net::TcpStream) -> Option<String> {
    use tokio::io::AsyncReadExt;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if tcp.read(&mut byte).await.ok()? == 0 {
            return None;
        }
        head.push(byte[0]);
    }
    let text = String::from_utf8_lossy(&head).into_owned();
    let len: usize = text
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().parse().unwrap_or(0))
        })
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    tcp.read_exact(&mut body).await.ok()?;
    Some(text.split(' ').nth(1).unwrap_or("/").to_string())
}

/// A loopback worker that answers one request per connection with the raw bytes
/// `answer(target)` gives, then closes: for responses hyper would never write (a body
/// ended only by the close, a chunk cut in half).
pub async fn raw_peer(answer: fn(&str) -> Vec<u8>) -> SocketAddr {
    use tokio::io::AsyncWriteExt;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut tcp, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                if let Some(target) = read_raw_request(&mut tcp).await {
                    let _ = tcp.write_all(&answer(&target)).await;
                    let _ = tcp.shutdown().await;
                }
            });
        }
    });
    addr
}

/// `matrix-proxy ARGS`: exit code, stdout, stderr.
pub fn run(args: &[&str]) -> (Option<i32>, String, String) {
    let out = bin().args(args).output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A path as a command-line argument.
pub fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The matrix-proxy binary under test.
pub fn bin() -> std::process::Command {
    std::process::Command::new(env!("CARGO_BIN_EXE_matrix-proxy"))
}

/// `matrix-proxy ARGS` as a child process (tokio), killed if the test drops it.
pub fn spawn_bin<S: AsRef<std::ffi::OsStr>>(
    args: impl IntoIterator<Item = S>,
) -> tokio::process::Child {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_matrix-proxy"))
        .args(args)
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

/// Send `sig` (`-INT`, `-TERM`, `-KILL`) to a child process.
pub fn signal(child: &tokio::process::Child, sig: &str) {
    let pid = child.id().unwrap().to_string();
    assert!(
        std::process::Command::new("kill")
            .args([sig, &pid])
            .status()
            .unwrap()
            .success()
    );
}

/// A child's exit code, which must come within `secs` seconds.
pub async fn exit_code(child: &mut tokio::process::Child, secs: u64) -> Option<i32> {
    tokio::time::timeout(Duration::from_secs(secs), child.wait())
        .await
        .unwrap_or_else(|_| panic!("no exit within {secs} s"))
        .unwrap()
        .code()
}

/// `matrix-proxy recover RUN`: its exit code and recovery.json's (rows_kept, rows_lost).
pub fn recover(run: &Path) -> (Option<i32>, u64, u64) {
    let out = bin().arg("recover").arg(run).output().unwrap();
    let report = read_json(&run.join("recovery.json"));
    (
        out.status.code(),
        report["rows_kept"].as_u64().unwrap(),
        report["rows_lost"].as_u64().unwrap(),
    )
}

/// `matrix-proxy summarize --quiet RUN`: its exit code and stderr.
pub fn summarize(run: &Path) -> (Option<i32>, String) {
    let out = bin()
        .args(["summarize", "--quiet"])
        .arg(run)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A one-case plan against [`echo_handler`] at `url` with the open `load` given.
pub fn open_plan(url: String, load: Value) -> Value {
    json!({
        "endpoint": url,
        "connection": "keep-alive",
        "cases": [{"name": "a", "request": {"q": 1}, "expected_response": {"echo": {"q": 1}}}],
        "load": load, "timeout_seconds": 5, "metadata": metadata(),
    })
}

/// The measured rows of repetition `rep`: (dispatch index, scheduled, start, lag), by
/// dispatch index.
pub fn measured(rows: &Rows, rep: i32) -> Vec<(i64, i64, i64, i64)> {
    let phase = rows.strs("phase");
    let reps = rows.i32s("repetition");
    let index = rows.i64s("dispatch_index");
    let sched = rows.i64s("scheduled_offset_us");
    let start = rows.i64s("start_offset_us");
    let lag = rows.i64s("send_lag_us");
    let mut v: Vec<(i64, i64, i64, i64)> = (0..rows.len())
        .filter(|&i| phase[i].as_deref() == Some("measured") && reps[i] == Some(rep))
        .map(|i| {
            (
                index[i].unwrap(),
                sched[i].unwrap(),
                start[i].unwrap(),
                lag[i].unwrap(),
            )
        })
        .collect();
    v.sort_unstable();
    v
}

/// A byte-level BPE tokenizer.json (GPT-2's byte alphabet, a few merges, a `<s>` BOS
/// added by its post-processor), written to `dir` as tokenizer.json: the tokenizer the
/// dataset and trace tests count prompts with (no download).
pub fn test_tokenizer(dir: &Path) -> PathBuf {
    // GPT-2's bytes-to-unicode: printable bytes stand for themselves, the others are
    // shifted past 255.
    let mut vocab = serde_json::Map::new();
    let mut shifted = 0u32;
    let mut char_of = Vec::new();
    for b in 0u32..256 {
        let printable =
            (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
        let c = if printable {
            char::from_u32(b).unwrap()
        } else {
            shifted += 1;
            char::from_u32(255 + shifted).unwrap()
        };
        char_of.push(c);
    }
    for (id, c) in char_of.iter().enumerate() {
        vocab.insert(c.to_string(), json!(id));
    }
    let space = char_of[b' ' as usize];
    let merges: Vec<(String, String)> = [
        (format!("{space}"), "t"),
        ("h".into(), "e"),
        (format!("{space}t"), "he"),
        ("i".into(), "n"),
        (format!("{space}"), "a"),
        ("e".into(), "r"),
        ("o".into(), "n"),
        (format!("{space}"), "s"),
        ("r".into(), "e"),
        ("a".into(), "n"),
        ("in".into(), "g"),
        (format!("{space}"), "w"),
    ]
    .into_iter()
    .map(|(a, b)| (a, b.to_string()))
    .collect();
    for (a, b) in &merges {
        let id = vocab.len();
        vocab.insert(format!("{a}{b}"), json!(id));
    }
    let bos = vocab.len();
    let tokenizer = json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [{"id": bos, "content": "<s>", "single_word": false, "lstrip": false,
                          "rstrip": false, "normalized": false, "special": true}],
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [bos], "tokens": ["<s>"]}}},
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                  "ignore_merges": false, "vocab": vocab,
                  "merges": merges.iter().map(|(a, b)| format!("{a} {b}")).collect::<Vec<_>>()}
    });
    let path = dir.join("tokenizer.json");
    std::fs::write(&path, tokenizer.to_string()).unwrap();
    path
}

/// An RFC 3339 instant `secs` from now (the wall clock, as a user's `date -u` gives it).
#[allow(clippy::disallowed_methods)]
pub fn utc_in(secs: u64) -> String {
    let at = std::time::SystemTime::now() + Duration::from_secs(secs);
    chrono::DateTime::<chrono::Utc>::from(at).to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// Shard `i`'s rows of a sharded run's output folder `out`, and the shift that moves its
/// run clock onto the shared timeline (`start_at_offset_us`).
pub fn shard_rows(out: &Path, i: usize) -> (Rows, i64) {
    let config = read_json(&out.join(format!("shards/{i}/config.json")));
    let rows = Rows {
        batches: std::fs::read_dir(out.join(format!("exchanges/shard={i}")))
            .unwrap()
            .flat_map(|e| read_parquet(&e.unwrap().path()))
            .collect(),
    };
    (
        rows,
        config["shard"]["start_at_offset_us"].as_i64().unwrap(),
    )
}

/// `matrix-proxy replay --quiet --shard I/N --start-at (3 s from now) --out OUT PLAN` for
/// every shard at once, each of which must exit 0 within 60 s.
pub async fn replay_shards(plan: &Path, out: &Path, n: usize) {
    let start = utc_in(3);
    let mut children: Vec<_> = (0..n)
        .map(|i| {
            let shard = format!("{i}/{n}");
            spawn_bin([
                "replay",
                "--quiet",
                "--shard",
                &shard,
                "--start-at",
                &start,
                "--out",
                out.to_str().unwrap(),
                plan.to_str().unwrap(),
            ])
        })
        .collect();
    for c in &mut children {
        assert_eq!(exit_code(c, 60).await, Some(0));
    }
}

/// `matrix-proxy plan ARGS`: its exit code, the plan it printed (or null) and stderr.
pub fn plan_cmd(args: &[&str]) -> (Option<i32>, Value, String) {
    let mut all = vec!["plan"];
    all.extend(args);
    let (code, stdout, err) = run(&all);
    (
        code,
        serde_json::from_str(&stdout).unwrap_or(Value::Null),
        err,
    )
}

/// [`plan_cmd`] of `base` then `extra` arguments.
pub fn plan_with(base: &[&str], extra: &[&str]) -> (Option<i32>, Value, String) {
    let mut args = base.to_vec();
    args.extend(extra);
    plan_cmd(&args)
}

/// `lines` written to `dir/name`, one a line (a dataset, a trace).
pub fn write_lines(dir: &Path, name: &str, lines: &[String]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    path
}
