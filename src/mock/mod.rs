//! The built-in mock worker: a small OpenAI-compatible server for demos and tests.
//!
//! Routes: `POST /v1/chat/completions`, `POST /v1/completions`, `GET /health`,
//! `GET /v1/models`. Generated text is a deterministic function of the prompt and
//! `max_tokens`, so oracles can be frozen; `id` and `created` are volatile, as on a real
//! server. Latency follows a simple serving model: a request waits for one of
//! `max_batch` slots, then takes `prefill_ms + uncached prompt tokens *
//! prefill_per_token_ms + tokens * per_token_ms`. With `prefix_cache_blocks` it keeps a
//! prefix cache (`prefix.rs`): a prompt's cached tokens are not prefilled again, and its
//! answer's `usage.prompt_tokens_details.cached_tokens` says how many there were.
//!
//! Faults are chosen per request with the `x-mock-fault` header or a `"mock_fault"`
//! field in the JSON body: `http500`, `wrong-body`, `stall` (no answer for `stall_ms`),
//! `reset` (head and half the body, then the connection is cut), `close` (answer, then
//! close the keep-alive connection), and for `"stream": true` answers `stream-cut` and
//! `stream-stall`. Streamed events are paced by absolute deadlines and their write times
//! are logged (`MockWorker::event_log`) so tests can check the tool's stamps against them.
//! A chat request that asks for JSON of a schema (`response_format`) or declares `tools`
//! gets JSON made from the schema or a tool call (`structured.rs`), a share of the calls
//! broken on purpose with `invalid_tool_call_share`, for contract oracles to judge.
//! The mock is test equipment: it must never be mistaken for a measurement of anything but
//! the tool itself.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::sync::{Semaphore, oneshot};
use tokio::task::JoinSet;

mod answer;
mod chunks;
mod config;
mod prefix;
mod structured;
mod text;
mod vllm;

use answer::Answer;
use chunks::{Chunks, sse};
pub use config::MockConfig;
use structured::Shaped;
pub use text::{generate_text, generate_text_seeded};
use text::{prompt_of, stream_tokens};

use crate::clock;

/// One request as the mock received it (for tests that check what was sent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenRequest {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
}

struct State {
    config: MockConfig,
    batch: Arc<Semaphore>,
    next_id: AtomicU64,
    /// Draws of the nondeterministic prompts' texts, from a start unique to this worker
    /// (two workers never draw in step, as two servers' batches never line up).
    draws: AtomicU64,
    seen: Mutex<Vec<SeenRequest>>,
    /// Response id -> monotonic stamps (`clock::now_ns`) at which each SSE event was
    /// handed to the connection.
    event_log: Mutex<HashMap<String, Vec<u64>>>,
    /// What `/metrics` exports (vLLM's names).
    metrics: Arc<vllm::Metrics>,
    /// With `prefix_cache_blocks`.
    prefix: Option<prefix::PrefixCache>,
}

/// A running mock worker. Dropping it (or [`MockWorker::shutdown`]) stops the server and
/// closes every connection.
pub struct MockWorker {
    pub addr: SocketAddr,
    state: Arc<State>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl MockWorker {
    /// Bind `listen` (use port 0 for any free port) and serve on the current runtime.
    pub async fn start(listen: SocketAddr, config: MockConfig) -> std::io::Result<MockWorker> {
        // A queue deep enough for a fresh-connection replay at high concurrency.
        let listener = crate::net::listener::bind_listener(listen, 4096)?;
        let addr = listener.local_addr()?;
        let state = Arc::new(State {
            batch: Arc::new(Semaphore::new(config.max_batch.max(1))),
            next_id: AtomicU64::new(1),
            draws: AtomicU64::new(
                (clock::wall_now_us() as u64) ^ (u64::from(std::process::id()) << 40),
            ),
            seen: Mutex::new(Vec::new()),
            event_log: Mutex::new(HashMap::new()),
            metrics: Arc::default(),
            prefix: (config.prefix_cache_blocks > 0)
                .then(|| prefix::PrefixCache::new(config.prefix_cache_blocks)),
            config,
        });
        let (stop_tx, mut stop_rx) = oneshot::channel::<()>();
        let st = state.clone();
        let task = tokio::spawn(async move {
            let mut conns = JoinSet::new();
            loop {
                tokio::select! {
                    _ = &mut stop_rx => break,
                    accepted = listener.accept() => {
                        let Ok((tcp, _)) = accepted else { continue };
                        let _ = tcp.set_nodelay(true);
                        let st = st.clone();
                        conns.spawn(async move {
                            let svc = service_fn(move |req| handle(st.clone(), req));
                            let _ = http1::Builder::new()
                                .serve_connection(TokioIo::new(tcp), svc)
                                .await;
                        });
                    }
                    Some(_) = conns.join_next(), if !conns.is_empty() => {}
                }
            }
            conns.abort_all();
        });
        Ok(MockWorker {
            addr,
            state,
            stop: Some(stop_tx),
            task: Some(task),
        })
    }

    /// Base URL, e.g. `http://127.0.0.1:39121`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every request received so far, in arrival order.
    pub fn seen(&self) -> Vec<SeenRequest> {
        self.state
            .seen
            .lock()
            .map(|v| v.clone())
            .unwrap_or_default()
    }

    /// When each event of the streamed response `id` was written (monotonic ns).
    pub fn event_log(&self, id: &str) -> Option<Vec<u64>> {
        self.state.event_log.lock().ok()?.get(id).cloned()
    }

    pub async fn shutdown(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
    }
}

impl Drop for MockWorker {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

/// The mock's response body: whole, cut after half its declared length (the half is
/// flushed first, then the connection is reset a few milliseconds later), or an event
/// stream paced by the latency model.
pub(crate) enum MockBody {
    Full(Option<Bytes>),
    Cut {
        half: Option<Bytes>,
        pause: Pin<Box<tokio::time::Sleep>>,
        failed: bool,
    },
    Stream(Box<MockStream>),
}

/// One step of a streamed answer.
enum Step {
    /// Write this event when the previous one has been written.
    Now(Bytes),
    /// Wait `Duration` after the previous deadline, then write.
    After(Duration, Bytes),
    /// Reset the connection (the `stream-cut` fault), after a pause so that what was
    /// written before is flushed to the client.
    Cut(Duration),
}

/// A paced SSE answer. Deadlines are absolute (each one is the previous plus the step's
/// delay), so timer slack never accumulates; every write is stamped into the event log.
pub(crate) struct MockStream {
    steps: std::collections::VecDeque<Step>,
    sleep: Pin<Box<tokio::time::Sleep>>,
    waited: bool,
    id: String,
    state: Arc<State>,
    _slot: Option<tokio::sync::OwnedSemaphorePermit>,
    /// Counted as running in `/metrics` while the stream holds its batch slot.
    counted: Option<vllm::Slot>,
    /// What `/metrics` observes when the stream ends (`None` under a fault).
    served: Option<StreamServed>,
}

/// A stream's timings for `/metrics`.
struct StreamServed {
    arrived: u64,
    first_token_ns: Option<u64>,
    prompt_tokens: u64,
    output_tokens: u64,
    prompt_key: u64,
    cached_tokens: Option<u64>,
}

impl MockStream {
    fn poll_next(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        loop {
            let delay = match self.steps.front() {
                None => {
                    self._slot = None;
                    self.counted = None;
                    if let Some(s) = self.served.take() {
                        let now = clock::now_ns();
                        self.state.metrics.served(&vllm::Served {
                            ttft_ns: s.first_token_ns.unwrap_or(now).saturating_sub(s.arrived),
                            e2e_ns: now.saturating_sub(s.arrived),
                            prompt_tokens: s.prompt_tokens,
                            output_tokens: s.output_tokens,
                            prompt_key: s.prompt_key,
                            cached_tokens: s.cached_tokens,
                        });
                    }
                    return Poll::Ready(None);
                }
                Some(Step::After(d, _)) | Some(Step::Cut(d)) if !self.waited => Some(*d),
                _ => None,
            };
            if let Some(d) = delay {
                let next = self.sleep.deadline() + d;
                self.sleep.as_mut().reset(next);
                self.waited = true;
            }
            if self.waited {
                if self.sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                self.waited = false;
            }
            let step = self.steps.pop_front();
            // The first paced step is the first token (the role chunk is sent at once).
            if let (Some(Step::After(..)), Some(s)) = (&step, self.served.as_mut()) {
                s.first_token_ns.get_or_insert_with(clock::now_ns);
            }
            match step {
                Some(Step::Now(b)) | Some(Step::After(_, b)) => {
                    if self.state.config.log_requests
                        && let Ok(mut log) = self.state.event_log.lock()
                    {
                        log.entry(self.id.clone())
                            .or_default()
                            .push(clock::now_ns());
                    }
                    return Poll::Ready(Some(Ok(Frame::data(b))));
                }
                Some(Step::Cut(_)) => {
                    self.steps.clear();
                    return Poll::Ready(Some(Err(std::io::Error::new(
                        std::io::ErrorKind::ConnectionReset,
                        "mock fault: stream cut",
                    ))));
                }
                None => continue,
            }
        }
    }
}

impl Body for MockBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        match &mut *self {
            MockBody::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            MockBody::Stream(st) => st.poll_next(cx),
            MockBody::Cut {
                half,
                pause,
                failed,
            } => {
                if let Some(b) = half.take() {
                    Poll::Ready(Some(Ok(Frame::data(b))))
                } else if !*failed {
                    if pause.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    *failed = true;
                    Poll::Ready(Some(Err(std::io::Error::new(
                        std::io::ErrorKind::ConnectionReset,
                        "mock fault: reset mid-body",
                    ))))
                } else {
                    Poll::Ready(None)
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, MockBody::Full(None))
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            MockBody::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            MockBody::Full(None) => SizeHint::with_exact(0),
            MockBody::Cut { .. } | MockBody::Stream(_) => SizeHint::default(),
        }
    }
}

fn json_response(status: StatusCode, v: &Value) -> Response<MockBody> {
    let body = Bytes::from(serde_json::to_vec(v).unwrap_or_default());
    let mut r = Response::new(MockBody::Full(Some(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r
}

fn error(status: StatusCode, message: &str) -> Response<MockBody> {
    json_response(
        status,
        &json!({"error": {"message": message, "type": "invalid_request_error"}}),
    )
}

impl State {
    /// Whether `prompt` falls in `share` of all prompts, chosen by a hash of `salt`, the
    /// prompt and the text seed: the same prompts every run, another set per `salt`.
    fn in_share(&self, salt: &[u8], prompt: &str, share: f64) -> bool {
        if share <= 0.0 {
            return false;
        }
        let mut h = Sha256::new();
        h.update(salt);
        h.update(prompt.as_bytes());
        h.update(self.config.text_seed.to_le_bytes());
        let digest = h.finalize();
        let x = u64::from_le_bytes(digest[..8].try_into().unwrap_or([0; 8]));
        (x as f64) / (u64::MAX as f64) < share
    }

    /// Whether `prompt` is one of the `invalid_tool_call_share` whose tool calls are
    /// broken.
    fn breaks_tool_call(&self, prompt: &str) -> bool {
        self.in_share(b"tool-call\n", prompt, self.config.invalid_tool_call_share)
    }

    /// The text seed of one answer to `prompt`: the configured one, or, for a prompt in
    /// the nondeterministic share, one drawn for this request.
    fn text_seed_for(&self, prompt: &str) -> u64 {
        if self.in_share(b"", prompt, self.config.nondeterministic_share) {
            let d = self.draws.fetch_add(1, Ordering::Relaxed);
            self.config.text_seed ^ d.wrapping_mul(0x2545_F491_4F6C_DD1D)
        } else {
            self.config.text_seed
        }
    }
}

async fn handle(st: Arc<State>, req: Request<Incoming>) -> Result<Response<MockBody>, Infallible> {
    let (parts, body) = req.into_parts();
    let body = match body.collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => {
            return Ok(error(
                StatusCode::BAD_REQUEST,
                "could not read the request body",
            ));
        }
    };
    let path = parts.uri.path().to_string();
    if st.config.log_requests
        && let Ok(mut seen) = st.seen.lock()
    {
        seen.push(SeenRequest {
            method: parts.method.to_string(),
            path: parts
                .uri
                .path_and_query()
                .map(|p| p.to_string())
                .unwrap_or_else(|| path.clone()),
            headers: parts
                .headers
                .iter()
                .map(|(k, v)| {
                    (
                        k.to_string(),
                        String::from_utf8_lossy(v.as_bytes()).into_owned(),
                    )
                })
                .collect(),
            body: body.clone(),
        });
    }
    let parsed: Option<Value> = serde_json::from_slice(&body).ok();
    let fault = parts
        .headers
        .get("x-mock-fault")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .or_else(|| {
            parsed
                .as_ref()
                .and_then(|v| v.get("mock_fault"))
                .and_then(Value::as_str)
                .map(str::to_string)
        });
    let resp = match (&parts.method, path.as_str()) {
        (&Method::GET, "/health") => json_response(StatusCode::OK, &json!({"status": "ok"})),
        (&Method::GET, "/metrics") => {
            let mut r = Response::new(MockBody::Full(Some(Bytes::from(st.metrics.text("mock")))));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                http::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            r
        }
        (&Method::GET, "/v1/models") => json_response(
            StatusCode::OK,
            &json!({"object": "list", "data": [{"id": "mock", "object": "model", "created": 0, "owned_by": "matrix-proxy"}]}),
        ),
        (&Method::POST, "/v1/chat/completions") => {
            complete(&st, true, parsed.as_ref(), fault.as_deref()).await
        }
        (&Method::POST, "/v1/completions") => {
            complete(&st, false, parsed.as_ref(), fault.as_deref()).await
        }
        (_, "/health" | "/metrics" | "/v1/models" | "/v1/chat/completions" | "/v1/completions") => {
            error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed")
        }
        _ => error(StatusCode::NOT_FOUND, &format!("no route for {path}")),
    };
    Ok(resp)
}

async fn complete(
    st: &Arc<State>,
    chat: bool,
    req: Option<&Value>,
    fault: Option<&str>,
) -> Response<MockBody> {
    let arrived = clock::now_ns();
    let Some(req) = req else {
        return error(StatusCode::BAD_REQUEST, "request body is not valid JSON");
    };
    let Some(prompt) = prompt_of(chat, req) else {
        let field = if chat { "messages" } else { "prompt" };
        return error(StatusCode::BAD_REQUEST, &format!("missing '{field}'"));
    };
    // `max_completion_tokens` is OpenAI's current name (AIPerf and GuideLLM send it);
    // `max_tokens` the older one. The current name wins when both are given.
    let tokens = req
        .get("max_completion_tokens")
        .and_then(Value::as_u64)
        .or_else(|| req.get("max_tokens").and_then(Value::as_u64))
        .map(|t| t.min(4096) as u32)
        .unwrap_or(st.config.default_max_tokens);
    let admitted = match &st.prefix {
        Some(p) => {
            let a = p.admit(&prompt);
            (a.prompt_tokens, Some(a.cached_tokens))
        }
        None => (prompt.split_whitespace().count() as u64, None),
    };
    let model = req
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or("mock")
        .to_string();

    // A request the mock answers in full is served (`/metrics`), faults that still answer
    // included; a stalled one waits as a real server's queued request does.
    let served = !matches!(fault, Some("http500" | "reset" | "stream-cut"));
    if fault == Some("stall") {
        let _waiting = vllm::Slot::waiting(st.metrics.clone());
        tokio::time::sleep(Duration::from_millis(st.config.stall_ms)).await;
    }
    let seed = st.text_seed_for(&prompt);
    let shaped = chat
        .then(|| {
            let words = generate_text_seeded(&prompt, tokens.min(8), seed);
            structured::shaped(req, &words, st.breaks_tool_call(&prompt))
        })
        .flatten();
    let answer = Answer {
        chat,
        shaped: shaped.as_ref(),
        seed,
        prompt: &prompt,
        tokens,
        model: &model,
        include_usage: req
            .get("stream_options")
            .and_then(|o| o.get("include_usage"))
            .and_then(Value::as_bool)
            == Some(true),
        arrived,
        prompt_tokens: admitted.0,
        cached_tokens: admitted.1,
    };
    if req.get("stream").and_then(Value::as_bool) == Some(true) {
        return stream_response(st, answer, fault).await;
    }
    generate(st, &answer, served).await;
    if fault == Some("http500") {
        return json_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            &json!({"error": {"message": "mock fault: internal error", "type": "server_error"}}),
        );
    }
    let mut text = generate_text_seeded(&prompt, tokens, seed);
    if fault == Some("wrong-body") {
        text = text.chars().rev().collect();
    }
    let v = completion_body(st, &answer, text);
    with_fault(json_response(StatusCode::OK, &v), fault)
}

/// A whole (not streamed) completion's JSON: `text` as the answer to `a`'s prompt.
fn completion_body(st: &State, a: &Answer<'_>, text: String) -> Value {
    let Answer { chat, model, .. } = *a;
    let n = st.next_id.fetch_add(1, Ordering::Relaxed);
    let created = clock::wall_now_us() / 1_000_000;
    let usage = a.usage();
    if chat {
        let (message, finish) = match a.shaped {
            None => (json!({"role": "assistant", "content": text}), "length"),
            Some(Shaped::Json(doc)) => (json!({"role": "assistant", "content": doc}), "stop"),
            Some(Shaped::Call { name, arguments }) => (
                json!({"role": "assistant", "content": null, "tool_calls": [{
                    "id": format!("call-mock-{n:08x}"), "type": "function",
                    "function": {"name": name, "arguments": arguments}}]}),
                "tool_calls",
            ),
        };
        json!({
            "id": format!("chatcmpl-mock-{n:08x}"),
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": usage,
        })
    } else {
        json!({
            "id": format!("cmpl-mock-{n:08x}"),
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "text": text, "finish_reason": "length"}],
            "usage": usage,
        })
    }
}

/// `resp` as the `reset` fault (half the body, then the connection reset) or the `close`
/// fault (`Connection: close`) sends it; unchanged for any other.
fn with_fault(mut resp: Response<MockBody>, fault: Option<&str>) -> Response<MockBody> {
    match fault {
        Some("reset") => {
            let full = match std::mem::replace(resp.body_mut(), MockBody::Full(None)) {
                MockBody::Full(Some(b)) => b,
                _ => Bytes::new(),
            };
            resp.headers_mut()
                .insert(header::CONTENT_LENGTH, http::HeaderValue::from(full.len()));
            *resp.body_mut() = MockBody::Cut {
                half: Some(full.slice(..full.len() / 2)),
                pause: Box::pin(tokio::time::sleep(Duration::from_millis(20))),
                failed: false,
            };
        }
        Some("close") => {
            resp.headers_mut()
                .insert(header::CONNECTION, http::HeaderValue::from_static("close"));
        }
        _ => {}
    }
    resp
}

/// A JSON answer's generation: wait for a batch slot, then `prefill + tokens x per_token`;
/// `/metrics` counts it (when `served`, i.e. under no fault) with its first token at its
/// queueing plus the prefill.
async fn generate(st: &Arc<State>, a: &Answer<'_>, served: bool) {
    let Answer {
        prompt,
        tokens,
        arrived,
        ..
    } = *a;
    let ttft_ns = {
        let mut counted = vllm::Slot::waiting(st.metrics.clone());
        let _slot = st.batch.acquire().await;
        counted.run();
        let queued = clock::now_ns().saturating_sub(arrived);
        let prefill = a.prefill(&st.config);
        let ms = prefill.as_secs_f64() * 1000.0 + f64::from(tokens) * st.config.per_token_ms;
        if ms > 0.0 {
            tokio::time::sleep(Duration::from_secs_f64(ms / 1000.0)).await;
        }
        queued + prefill.as_nanos() as u64
    };
    if served {
        st.metrics.served(&vllm::Served {
            ttft_ns,
            e2e_ns: clock::now_ns().saturating_sub(arrived),
            prompt_tokens: a.prompt_tokens,
            output_tokens: u64::from(tokens),
            prompt_key: vllm::prompt_key(prompt),
            cached_tokens: a.cached_tokens,
        });
    }
}

/// What a streamed answer writes, and when: the role (a chat's), a piece per token (the
/// first after the prefill, each next after a token's time; `burst_after_first` sends the
/// rest at once; the `stream-cut` and `stream-stall` faults at half), the finish, the usage
/// when asked, `[DONE]`.
fn stream_steps(
    st: &State,
    a: &Answer<'_>,
    fault: Option<&str>,
    c: &Chunks<'_>,
) -> std::collections::VecDeque<Step> {
    let Answer {
        chat,
        prompt,
        tokens,
        include_usage,
        ..
    } = *a;
    let prefill = a.prefill(&st.config);
    let per_token = Duration::from_secs_f64(st.config.per_token_ms / 1000.0);
    let pieces: Vec<Bytes> = match a.shaped {
        None => stream_tokens(prompt, tokens, a.seed)
            .iter()
            .map(|w| sse(&c.piece(w, Value::Null)))
            .collect(),
        Some(s) => c.shaped_pieces(s),
    };
    let mut steps = std::collections::VecDeque::new();
    if chat {
        steps.push_back(Step::Now(sse(&c.chunk(
            json!({"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}),
        ))));
    }
    let half = pieces.len() / 2;
    let burst_from = st.config.burst_after_first.map(|n| n as usize);
    let mut burst: Vec<u8> = Vec::new();
    for (i, piece) in pieces.into_iter().enumerate() {
        if burst_from.is_some_and(|n| i >= n.max(1)) && fault.is_none() {
            burst.extend_from_slice(&piece);
            continue;
        }
        if i == half && fault == Some("stream-cut") {
            steps.push_back(Step::Cut(Duration::from_millis(20)));
            break;
        }
        let mut delay = if i == 0 { prefill } else { per_token };
        if i == half && i > 0 && fault == Some("stream-stall") {
            delay += Duration::from_millis(st.config.stall_ms);
        }
        steps.push_back(Step::After(delay, piece));
    }
    if !burst.is_empty() {
        steps.push_back(Step::Now(Bytes::from(burst)));
    }
    let finish = match a.shaped {
        None => "length",
        Some(Shaped::Json(_)) => "stop",
        Some(Shaped::Call { .. }) => "tool_calls",
    };
    steps.push_back(Step::Now(sse(&c.piece("", json!(finish)))));
    if include_usage {
        steps.push_back(Step::Now(sse(&json!({
            "id": c.id, "object": c.object, "created": c.created, "model": c.model, "choices": [],
            "usage": a.usage(),
        }))));
    }
    steps.push_back(Step::Now(Bytes::from_static(b"data: [DONE]\n\n")));
    steps
}

/// A streamed completion: role chunk at once, the first token after the prefill, one token
/// per `per_token_ms`, the finish chunk, the usage chunk when asked for, `[DONE]`. Holds a
/// batch slot for the whole stream, like a real server's running batch.
async fn stream_response(
    st: &Arc<State>,
    a: Answer<'_>,
    fault: Option<&str>,
) -> Response<MockBody> {
    let Answer {
        chat,
        prompt,
        tokens,
        model,
        arrived,
        ..
    } = a;
    let mut counted = vllm::Slot::waiting(st.metrics.clone());
    let slot = st.batch.clone().acquire_owned().await.ok();
    counted.run();
    let n = st.next_id.fetch_add(1, Ordering::Relaxed);
    let id = if chat {
        format!("chatcmpl-mock-{n:08x}")
    } else {
        format!("cmpl-mock-{n:08x}")
    };
    let chunks = Chunks {
        id: &id,
        object: if chat {
            "chat.completion.chunk"
        } else {
            "text_completion"
        },
        created: clock::wall_now_us() / 1_000_000,
        model,
        chat,
    };
    let steps = stream_steps(st, &a, fault, &chunks);
    let body = MockStream {
        steps,
        sleep: Box::pin(tokio::time::sleep(Duration::ZERO)),
        waited: false,
        id,
        state: st.clone(),
        _slot: slot,
        counted: Some(counted),
        served: (!matches!(fault, Some("stream-cut"))).then_some(StreamServed {
            arrived,
            first_token_ns: None,
            prompt_tokens: a.prompt_tokens,
            output_tokens: u64::from(tokens),
            prompt_key: vllm::prompt_key(prompt),
            cached_tokens: a.cached_tokens,
        }),
    };
    let mut r = Response::new(MockBody::Stream(Box::new(body)));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/event-stream"),
    );
    r.headers_mut().insert(
        header::CACHE_CONTROL,
        http::HeaderValue::from_static("no-cache"),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_deterministic() {
        assert_eq!(generate_text("hello", 4), generate_text("hello", 4));
        assert_ne!(generate_text("hello", 4), generate_text("hellp", 4));
        assert_eq!(generate_text("hello", 5).split(' ').count(), 5);
        assert_eq!(generate_text("x", 0), "");
        assert_eq!(
            generate_text_seeded("hello", 4, 0),
            generate_text("hello", 4)
        );
        assert_ne!(
            generate_text_seeded("hello", 8, 7),
            generate_text("hello", 8)
        );
        assert_eq!(
            generate_text_seeded("hello", 8, 7),
            generate_text_seeded("hello", 8, 7)
        );
    }

    /// `/metrics` after three streamed answers and one JSON answer: the counters, the
    /// histograms' counts, and TTFT observed where the mock's prefill puts it (read back
    /// with the crate's own Prometheus reader).
    #[tokio::test]
    async fn metrics_follow_what_was_served() {
        let config = MockConfig {
            prefill_ms: 30.0,
            per_token_ms: 1.0,
            log_requests: false,
            ..MockConfig::default()
        };
        let w = MockWorker::start("127.0.0.1:0".parse().expect("addr"), config)
            .await
            .expect("mock");
        // One request per connection, read to the close (the mock ends a streamed body
        // and closes under `connection: close`).
        let addr = w.addr;
        let exchange = |method: &'static str, path: &'static str, body: &'static str| async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
            let head = format!(
                "{method} {path} HTTP/1.1\r\nhost: mock\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            );
            tcp.write_all(head.as_bytes()).await.expect("write");
            let mut out = Vec::new();
            tcp.read_to_end(&mut out).await.expect("read");
            let text = String::from_utf8_lossy(&out).into_owned();
            text.split_once("\r\n\r\n")
                .map(|(_, b)| b.to_string())
                .unwrap_or_default()
        };
        let stream = r#"{"messages": [{"role": "user", "content": "a b c"}], "max_tokens": 4, "stream": true}"#;
        for _ in 0..3 {
            exchange("POST", "/v1/chat/completions", stream).await;
        }
        let json = r#"{"messages": [{"role": "user", "content": "a b"}], "max_tokens": 2}"#;
        exchange("POST", "/v1/chat/completions", json).await;
        let text = exchange("GET", "/metrics", "").await;
        let scrape = crate::prom::parse(&text);
        assert_eq!(scrape.errors, Vec::new());
        let value = |name: &str, le: Option<&str>| {
            scrape
                .samples
                .iter()
                .find(|s| s.name == name && s.label("le") == le)
                .map(|s| s.value)
        };
        assert_eq!(value("vllm:request_success_total", None), Some(4.0));
        assert_eq!(value("vllm:generation_tokens_total", None), Some(14.0));
        assert_eq!(value("vllm:prompt_tokens_total", None), Some(11.0));
        assert_eq!(value("vllm:num_requests_running", None), Some(0.0));
        assert_eq!(value("vllm:num_requests_waiting", None), Some(0.0));
        assert_eq!(
            value("vllm:time_to_first_token_seconds_count", None),
            Some(4.0)
        );
        // A 30 ms prefill: every TTFT above 0.02 s, and (on any machine that serves a
        // request in under 50 ms more) at most 0.08 s.
        assert_eq!(
            value("vllm:time_to_first_token_seconds_bucket", Some("0.02")),
            Some(0.0)
        );
        assert_eq!(
            value("vllm:time_to_first_token_seconds_bucket", Some("+Inf")),
            Some(4.0)
        );
        let kind = scrape
            .samples
            .iter()
            .find(|s| s.name == "vllm:e2e_request_latency_seconds_sum")
            .map(|s| s.kind.clone());
        assert_eq!(kind.as_deref(), Some("histogram"));
        w.shutdown().await;
    }
}
