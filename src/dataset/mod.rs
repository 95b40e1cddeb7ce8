//! `matrix-proxy plan ...`: prompts at scale into a capture plan (no oracle: replay it to
//! record the server's answers, then `freeze` the run). Prompts come from a JSONL dataset
//! (`jsonl.rs`: OpenAI chat, completion prompts, ShareGPT, raw request bodies; a seeded
//! sample) or are made to an exact token count under a model's own tokenizer
//! (`synthetic.rs`, from the corpus embedded in the binary). Nothing is sent: the plan is
//! laid out as `freeze` lays one out and validated before it is written. A public LLM
//! trace (Mooncake, Azure, BurstGPT) becomes a trace plan's file of synthetic entries
//! (`trace.rs`, reading with `trace_read.rs`, checking the prompts' counts under the
//! tokenizer with `trace_verify.rs`). A plan's one case holds its prompts as variants, or
//! conversations as sessions ([`Requests::Sessions`]: `plan from-jsonl --turns all`,
//! `plan synthetic --turns N`), each turn the messages it adds and its answer.

pub(crate) mod jsonl;
pub(crate) mod synthetic;
pub(crate) mod trace;
mod trace_read;
mod trace_verify;

use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{RngCore, SeedableRng};
use serde_json::{Map, Value, json};

use crate::config::plan::Plan;
use crate::config::sessions::History;
use crate::freeze::{Budget, Head, head_map};
use crate::model::Endpoint;

/// The API a prompt is sent to, and the path it takes when `--endpoint` names only an
/// origin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Api {
    Chat,
    Completions,
    /// Raw request bodies: the endpoint says where.
    Raw,
}

impl Api {
    /// The API an endpoint's path names (`.../chat/completions`, `.../completions`), if
    /// any.
    pub(crate) fn of_endpoint(endpoint: &Endpoint) -> Option<Api> {
        let path = endpoint.path_and_query.split('?').next().unwrap_or("");
        let path = path.trim_end_matches('/');
        if path.ends_with("/chat/completions") {
            Some(Api::Chat)
        } else if path.ends_with("/completions") {
            Some(Api::Completions)
        } else {
            None
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Api::Chat => "chat",
            Api::Completions => "completions",
            Api::Raw => "raw request",
        }
    }

    fn default_path(self) -> Option<&'static str> {
        match self {
            Api::Chat => Some("/v1/chat/completions"),
            Api::Completions => Some("/v1/completions"),
            Api::Raw => None,
        }
    }

    fn case_name(self) -> &'static str {
        match self {
            Api::Chat => "chat",
            Api::Completions => "completions",
            Api::Raw => "requests",
        }
    }
}

/// What every request of a generated plan asks for besides its prompt.
#[derive(Debug, Clone)]
pub(crate) struct Ask {
    pub(crate) model: Option<String>,
    pub(crate) max_tokens: Option<u64>,
    pub(crate) stream: bool,
    pub(crate) temperature: Option<f64>,
    /// `ignore_eos: true` (vLLM, SGLang).
    pub(crate) ignore_eos: bool,
    /// `min_tokens` = the output tokens asked for (vLLM, SGLang).
    pub(crate) min_tokens: bool,
}

impl Ask {
    /// The request body for one prompt (`messages` for chat, `prompt` for completions).
    /// `max_tokens` is the prompt's own when it has one.
    pub(crate) fn body(&self, api: Api, prompt: Value, max_tokens: Option<u64>) -> Value {
        let mut m = Map::new();
        if let Some(model) = &self.model {
            m.insert("model".into(), json!(model));
        }
        match api {
            Api::Chat => m.insert("messages".into(), prompt),
            Api::Completions | Api::Raw => m.insert("prompt".into(), prompt),
        };
        let max = max_tokens.or(self.max_tokens);
        if let Some(n) = max {
            m.insert("max_tokens".into(), json!(n));
            if self.min_tokens {
                m.insert("min_tokens".into(), json!(n));
            }
        }
        if self.ignore_eos {
            m.insert("ignore_eos".into(), json!(true));
        }
        if let Some(t) = self.temperature {
            m.insert("temperature".into(), json!(t));
        }
        if self.stream {
            m.insert("stream".into(), json!(true));
            // The stream's last event carries usage: prompt tokens to compare with the
            // plan's, output tokens from the server's own count.
            m.insert("stream_options".into(), json!({"include_usage": true}));
        }
        Value::Object(m)
    }

    /// The chat request every turn of a case's sessions is sent in: [`Self::body`]
    /// without `messages` (each turn's request gets the conversation so far at send time).
    pub(crate) fn template(&self, max_tokens: Option<u64>) -> Map<String, Value> {
        match self.body(Api::Chat, Value::Array(Vec::new()), max_tokens) {
            Value::Object(mut m) => {
                m.shift_remove("messages");
                m
            }
            _ => Map::new(),
        }
    }
}

/// One request of the plan.
#[derive(Debug, Clone)]
pub(crate) struct Prompt {
    /// The variant's name (`line-17`, `prompt-3`).
    pub(crate) name: String,
    pub(crate) body: Value,
    /// Its input tokens under the tokenizer that made or counted it.
    pub(crate) prompt_tokens: Option<u64>,
}

/// One turn of a session a capture plan holds: the messages it adds to the conversation,
/// and the assistant message a frozen history carries for it in later turns.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PlanTurn {
    pub(crate) messages: Vec<Value>,
    pub(crate) answer: Option<Value>,
}

/// A session of a capture plan: its id (unique in the case) and its turns (at most
/// [`MAX_TURNS`](crate::config::sessions::MAX_TURNS)).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PlanSession {
    pub(crate) id: String,
    pub(crate) turns: Vec<PlanTurn>,
}

/// A capture plan's case of sessions: the chat request every turn is sent in (without
/// `messages`: a conversation's own system prompt is its first turn's), the history mode,
/// `cache_bust`, and the sessions.
#[derive(Debug, Clone)]
pub(crate) struct SessionCase {
    pub(crate) template: Map<String, Value>,
    pub(crate) history: History,
    pub(crate) cache_bust: bool,
    pub(crate) sessions: Vec<PlanSession>,
}

impl SessionCase {
    /// Every turn of every session.
    pub(crate) fn turns(&self) -> usize {
        self.sessions.iter().map(|s| s.turns.len()).sum()
    }
}

/// What a capture plan's one case holds.
#[derive(Debug, Clone)]
pub(crate) enum Requests {
    /// Each prompt a variant.
    Prompts(Vec<Prompt>),
    /// Conversations, each a session.
    Sessions(SessionCase),
}

impl Requests {
    /// What one dispatch of a measured round runs: a prompt, or a whole session.
    pub(crate) fn dispatches(&self) -> usize {
        match self {
            Requests::Prompts(p) => p.len(),
            Requests::Sessions(c) => c.sessions.len(),
        }
    }

    /// The requests readiness sends (every prompt, or every turn, once).
    pub(crate) fn requests(&self) -> usize {
        match self {
            Requests::Prompts(p) => p.len(),
            Requests::Sessions(c) => c.turns(),
        }
    }

    /// What it holds, as a refusal names it (`40 prompts`, `3 sessions of 12 turns`).
    fn said(&self) -> String {
        match self {
            Requests::Prompts(p) => format!("{} prompts", p.len()),
            Requests::Sessions(c) => {
                format!("{} sessions of {} turns", c.sessions.len(), c.turns())
            }
        }
    }

    /// The case: `name`, then its variants, or its template, history and sessions. The
    /// requests move into it (never two copies of every body).
    fn into_case(self, name: &str) -> Value {
        let mut case = Map::new();
        case.insert("name".into(), json!(name));
        match self {
            Requests::Prompts(prompts) => {
                let variants: Vec<Value> = prompts
                    .into_iter()
                    .map(|p| {
                        let mut v = Map::new();
                        v.insert("name".into(), json!(p.name));
                        v.insert("request".into(), p.body);
                        if let Some(n) = p.prompt_tokens {
                            v.insert("prompt_tokens".into(), json!(n));
                        }
                        Value::Object(v)
                    })
                    .collect();
                case.insert("variants".into(), Value::Array(variants));
            }
            Requests::Sessions(c) => {
                case.insert("history".into(), json!(c.history.as_str()));
                if c.cache_bust {
                    case.insert("cache_bust".into(), json!(true));
                }
                case.insert("request".into(), Value::Object(c.template));
                let sessions: Vec<Value> = c.sessions.into_iter().map(session_json).collect();
                case.insert("sessions".into(), Value::Array(sessions));
            }
        }
        Value::Object(case)
    }
}

/// A session as the plan writes it: `{"id", "turns": [{"messages", "answer"?}]}`.
fn session_json(s: PlanSession) -> Value {
    let turns: Vec<Value> = s
        .turns
        .into_iter()
        .map(|t| Value::Object(crate::freeze::turn_json(t.messages, t.answer)))
        .collect();
    crate::freeze::session_json(s.id, turns)
}

/// Why a capture plan is not made (with the fix).
#[derive(Debug, thiserror::Error)]
pub(crate) enum CapturePlanError {
    /// `--endpoint` is a path of another API than the prompts'.
    #[error(
        "--endpoint {url} is a path of the {} API, but the prompts are written for the {} API: give --endpoint an origin or the {} API's path ({})",
        at.name(),
        api.name(),
        api.name(),
        api.default_path().unwrap_or("")
    )]
    OtherApi { url: String, at: Api, api: Api },
    /// Raw request bodies and an `--endpoint` without a path.
    #[error(
        "raw request bodies go where --endpoint says: give it with its path (http://host:8000/v1/chat/completions)"
    )]
    RawWithoutPath,
    /// The plan's bytes are not made (too large) for what it holds (`40 prompts`).
    #[error(
        "{source}: its {what} take more; ask for fewer (--limit, --count, --max-turns) or shorter ones"
    )]
    Bytes {
        what: String,
        #[source]
        source: crate::freeze::PlanBytesError,
    },
    /// The plan made does not validate.
    #[error("the plan does not validate, so it is not written: {0}")]
    Invalid(#[source] crate::config::json::PlanError),
}

/// A capture plan of one case holding every prompt as a variant, or every conversation
/// as a session. The endpoint's path is the API's default when `--endpoint` names only
/// an origin. A plan past [`MAX_PLAN_BYTES`](crate::config::plan::MAX_PLAN_BYTES) is
/// refused before it is whole.
pub(crate) fn capture_plan(
    head: Head,
    budget: &Budget,
    endpoint: &Endpoint,
    api: Api,
    requests: Requests,
) -> Result<(Vec<u8>, Plan), CapturePlanError> {
    let limit = crate::config::plan::MAX_PLAN_BYTES;
    capture_plan_within(head, budget, Target { endpoint, api }, requests, limit)
}

/// The URL a capture plan's prompts for `api` go to: `endpoint` as given, or with the
/// API's default path when it names only an origin; refused when its path is another
/// API's.
pub(crate) fn api_url(endpoint: &Endpoint, api: Api) -> Result<String, CapturePlanError> {
    let origin_only = endpoint.path_and_query == "/";
    if let Some(p) = Api::of_endpoint(endpoint).filter(|p| api != Api::Raw && *p != api) {
        return Err(CapturePlanError::OtherApi {
            url: endpoint.url(),
            at: p,
            api,
        });
    }
    match (origin_only, api.default_path()) {
        (true, Some(p)) => Ok(endpoint.with_path(p).url()),
        (true, None) => Err(CapturePlanError::RawWithoutPath),
        (false, _) => Ok(endpoint.url()),
    }
}

/// Where a capture plan's prompts go and the API they are written for.
#[derive(Clone, Copy)]
struct Target<'a> {
    endpoint: &'a Endpoint,
    api: Api,
}

/// [`capture_plan`] with the plan's size limit given (tests lower it).
fn capture_plan_within(
    mut head: Head,
    budget: &Budget,
    target: Target<'_>,
    requests: Requests,
    limit: u64,
) -> Result<(Vec<u8>, Plan), CapturePlanError> {
    let Target { endpoint, api } = target;
    head.endpoint = api_url(endpoint, api)?;
    let mut plan = head_map(&head, budget);
    let what = requests.said();
    plan.insert("cases".into(), json!([requests.into_case(api.case_name())]));
    let plan = Value::Object(plan);
    let bytes = crate::freeze::plan_bytes(&plan, limit)
        .map_err(|source| CapturePlanError::Bytes { what, source })?;
    drop(plan);
    let plan = Plan::from_json_bytes(&bytes).map_err(CapturePlanError::Invalid)?;
    Ok((bytes, plan))
}

/// A seeded random stream, the same on every platform (ChaCha8, as arrivals use).
pub(crate) struct Seeded(ChaCha8Rng);

impl Seeded {
    pub(crate) fn new(seed: u64) -> Seeded {
        Seeded(ChaCha8Rng::seed_from_u64(seed))
    }

    /// Uniform in `0..n` (`n > 0`), without modulo bias.
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        let zone = u64::MAX - u64::MAX % n;
        loop {
            let x = self.0.next_u64();
            if x < zone {
                return x % n;
            }
        }
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.0.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Normal with `mean` and `stddev` (Box-Muller).
    pub(crate) fn normal(&mut self, mean: f64, stddev: f64) -> f64 {
        let u1 = 1.0 - self.unit();
        let u2 = self.unit();
        mean + stddev * (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// `k` distinct indices of `0..n`, in ascending order (a partial Fisher-Yates over a
    /// sparse map, so memory is O(k)).
    pub(crate) fn sample(&mut self, n: u64, k: u64) -> Vec<u64> {
        let k = k.min(n);
        let mut swapped: std::collections::HashMap<u64, u64> = std::collections::HashMap::new();
        let mut out = Vec::with_capacity(k as usize);
        for i in 0..k {
            let j = i + self.below(n - i);
            let at_j = *swapped.get(&j).unwrap_or(&j);
            let at_i = *swapped.get(&i).unwrap_or(&i);
            swapped.insert(j, at_i);
            out.push(at_j);
        }
        out.sort_unstable();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head() -> Head {
        let mut metadata = Map::new();
        crate::freeze::fill_metadata(&mut metadata, &mut Vec::new());
        Head {
            name: None,
            description: "d".into(),
            endpoint: String::new(),
            health_endpoint: None,
            bearer_token_env: None,
            metadata,
        }
    }

    fn budget() -> Budget {
        Budget {
            concurrency: vec![1],
            requests_per_case: Some(4),
            repetitions: 2,
            warmup_per_case: 2,
            timeout_seconds: 60.0,
            connection: crate::model::ConnectionPolicy::KeepAlive,
            on_failure: None,
        }
    }

    fn prompts(n: usize, api: Api) -> Requests {
        let ask = Ask {
            model: Some("m".into()),
            max_tokens: Some(4),
            stream: false,
            temperature: Some(0.0),
            ignore_eos: false,
            min_tokens: false,
        };
        Requests::Prompts(
            (0..n)
                .map(|i| Prompt {
                    name: format!("p-{i}"),
                    body: ask.body(
                        api,
                        json!(format!("prompt number {i} {}", "x".repeat(200))),
                        None,
                    ),
                    prompt_tokens: None,
                })
                .collect(),
        )
    }

    fn endpoint(url: &str) -> Endpoint {
        Endpoint::parse(url).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn a_plan_past_the_size_limit_is_refused_naming_the_limit() {
        let e = endpoint("http://127.0.0.1:8000");
        let at = Target {
            endpoint: &e,
            api: Api::Completions,
        };
        let (bytes, plan) = capture_plan_within(
            head(),
            &budget(),
            at,
            prompts(40, Api::Completions),
            1 << 20,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(plan.cases.len(), 1);
        let size = bytes.len() as u64;
        assert_eq!(
            capture_plan_within(head(), &budget(), at, prompts(40, Api::Completions), size)
                .map(|(b, _)| b.len() as u64)
                .ok(),
            Some(size),
            "a plan of exactly the limit is written"
        );
        let err = capture_plan_within(
            head(),
            &budget(),
            at,
            prompts(40, Api::Completions),
            size - 1,
        )
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
        assert!(
            err.contains(&format!("larger than {} bytes", size - 1))
                && err.contains("not written")
                && err.contains("its 40 prompts"),
            "{err}"
        );
    }

    #[test]
    fn sessions_are_written_as_one_case_and_refused_past_the_size_limit_by_their_turns() {
        let e = endpoint("http://127.0.0.1:8000");
        let at = Target {
            endpoint: &e,
            api: Api::Chat,
        };
        let turn = |k: usize, answered: bool| PlanTurn {
            messages: vec![
                json!({"role": "user", "content": format!("turn {k} {}", "x".repeat(200))}),
            ],
            answer: answered.then(|| json!({"role": "assistant", "content": "ok"})),
        };
        let case = || {
            Requests::Sessions(SessionCase {
                template: Map::from_iter([("max_tokens".to_string(), json!(4))]),
                history: History::Frozen,
                cache_bust: false,
                sessions: (0..2)
                    .map(|i| PlanSession {
                        id: format!("s-{i}"),
                        turns: (0..4).map(|k| turn(k, k < 3)).collect(),
                    })
                    .collect(),
            })
        };
        assert_eq!((case().dispatches(), case().requests()), (2, 8));
        let (bytes, plan) = capture_plan_within(head(), &budget(), at, case(), 1 << 20)
            .unwrap_or_else(|e| panic!("{e}"));
        let s = plan.cases[0]
            .sessions
            .as_ref()
            .map(|s| (s.list.len(), s.turns()));
        assert_eq!(s, Some((2, 8)));
        let err = capture_plan_within(head(), &budget(), at, case(), bytes.len() as u64 - 1)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("its 2 sessions of 8 turns take more"), "{err}");
    }

    #[test]
    fn prompts_for_one_api_are_refused_at_the_other_apis_path() {
        let chat = endpoint("http://h:1/v1/chat/completions");
        assert_eq!(Api::of_endpoint(&chat), Some(Api::Chat));
        assert_eq!(
            Api::of_endpoint(&endpoint("http://h:1/v1/completions/")),
            Some(Api::Completions)
        );
        assert_eq!(Api::of_endpoint(&endpoint("http://h:1/generate")), None);
        assert_eq!(Api::of_endpoint(&endpoint("http://h:1")), None);
        let err = capture_plan(
            head(),
            &budget(),
            &chat,
            Api::Completions,
            prompts(1, Api::Completions),
        )
        .err();
        assert!(matches!(
            err,
            Some(CapturePlanError::OtherApi {
                at: Api::Chat,
                api: Api::Completions,
                ..
            })
        ));
        let err = err.map(|e| e.to_string()).unwrap_or_default();
        assert!(
            err.contains(
                "is a path of the chat API, but the prompts are written for the completions API"
            ) && err.contains("/v1/completions"),
            "{err}"
        );
        assert!(capture_plan(head(), &budget(), &chat, Api::Chat, prompts(1, Api::Chat)).is_ok());
    }

    #[test]
    fn a_seeded_sample_is_fixed_distinct_and_in_range() {
        let a = Seeded::new(7).sample(1000, 10);
        assert_eq!(a, Seeded::new(7).sample(1000, 10));
        assert_ne!(a, Seeded::new(8).sample(1000, 10));
        assert_eq!(a.len(), 10);
        assert!(a.windows(2).all(|w| w[0] < w[1]) && a[9] < 1000);
        // The stream is ChaCha8's: pinned, so a platform or version change shows.
        assert_eq!(a, [109, 168, 402, 427, 527, 537, 539, 635, 725, 860]);
        assert_eq!(Seeded::new(1).sample(5, 9), [0, 1, 2, 3, 4]);
        let mut r = Seeded::new(3);
        let xs: Vec<f64> = (0..4000).map(|_| r.normal(100.0, 10.0)).collect();
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        assert!((mean - 100.0).abs() < 1.0, "{mean}");
    }
}
