//! The frozen plan as JSON: a normal plan, pretty-printed with a fixed key order so two
//! freezes of the same runs are byte-identical. Ignore paths are lifted as far as they
//! are shared: to the top level when every JSON oracle of the plan has them (and no
//! exact-bytes oracle exists), to the case when every variant of the case has them.

use std::collections::{BTreeSet, HashSet};

use serde_json::{Map, Value, json};

use super::collect::{Answer, Body, Case, Variant};
use super::evidence::volatile_present;
use super::sessions::Chains;
use crate::config::plan::OnFailure;
use crate::model::ConnectionPolicy;

/// The budget a frozen plan starts with (`freeze`'s flags).
#[derive(Debug, Clone)]
pub(crate) struct Budget {
    pub(crate) concurrency: Vec<usize>,
    /// `None` until the variants are known: then the smallest multiple of their count
    /// that fills the highest level (`config::plan::covering_requests_per_case`).
    pub(crate) requests_per_case: Option<usize>,
    pub(crate) repetitions: usize,
    pub(crate) warmup_per_case: usize,
    pub(crate) timeout_seconds: f64,
    pub(crate) connection: ConnectionPolicy,
    /// `on_failure` as given (`None`: left out, the plan's default `stop`).
    pub(crate) on_failure: Option<OnFailure>,
}

/// The plan's own fields besides the budget and the cases.
#[derive(Debug, Clone)]
pub(crate) struct Head {
    /// The plan's `name` (the plan id a contract names), when given.
    pub(crate) name: Option<String>,
    pub(crate) description: String,
    pub(crate) endpoint: String,
    pub(crate) health_endpoint: Option<String>,
    pub(crate) bearer_token_env: Option<String>,
    pub(crate) metadata: Map<String, Value>,
}

/// Why a plan's bytes are not made.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PlanBytesError {
    /// The plan would pass `limit` bytes.
    #[error(
        "the plan would be larger than {}, the most `validate` and `replay` read, so it is not written",
        size_text(*limit)
    )]
    TooBig { limit: u64 },
    /// The plan cannot be serialized.
    #[error("cannot write the plan: {0}")]
    Json(#[source] serde_json::Error),
}

/// A size limit as a refusal says it: whole MiB, or bytes under one.
fn size_text(limit: u64) -> String {
    match limit >> 20 {
        0 => format!("{limit} bytes"),
        mib => format!("{mib} MiB"),
    }
}

/// `plan` pretty-printed with a final newline, refused as soon as it passes `limit` bytes
/// (never a plan `validate` would refuse to read, and never more than `limit` bytes held
/// for it). The refusal names the limit; the caller adds what to do.
pub(crate) fn plan_bytes(plan: &Value, limit: u64) -> Result<Vec<u8>, PlanBytesError> {
    /// A buffer that refuses to grow past its limit.
    struct Bounded {
        bytes: Vec<u8>,
        limit: usize,
    }
    impl std::io::Write for Bounded {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            if self.bytes.len() + b.len() > self.limit {
                return Err(std::io::Error::other(PAST_LIMIT));
            }
            self.bytes.extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    const PAST_LIMIT: &str = "past the limit";
    let mut w = Bounded {
        bytes: Vec::new(),
        limit: usize::try_from(limit).unwrap_or(usize::MAX),
    };
    let too_big = || PlanBytesError::TooBig { limit };
    serde_json::to_writer_pretty(&mut w, plan).map_err(|e| {
        if e.io_error_kind().is_some() {
            too_big()
        } else {
            PlanBytesError::Json(e)
        }
    })?;
    std::io::Write::write_all(&mut w, b"\n").map_err(|_| too_big())?;
    Ok(w.bytes)
}

/// What a written plan says before its cases, in this order: name (when given),
/// description, endpoint, health endpoint and auth (when given), connection, on_failure
/// (when given), the budget, metadata. `freeze` and `plan` (datasets) both lay a plan out
/// this way.
pub(crate) fn head_map(head: &Head, budget: &Budget) -> Map<String, Value> {
    let mut plan = Map::new();
    if let Some(name) = &head.name {
        plan.insert("name".into(), json!(name));
    }
    plan.insert("description".into(), json!(head.description));
    plan.insert("endpoint".into(), json!(head.endpoint));
    if let Some(h) = &head.health_endpoint {
        plan.insert("health_endpoint".into(), json!(h));
    }
    if let Some(env) = &head.bearer_token_env {
        plan.insert("auth".into(), json!({"bearer_token_env": env}));
    }
    plan.insert("connection".into(), json!(budget.connection.as_str()));
    if let Some(on_failure) = budget.on_failure {
        plan.insert("on_failure".into(), json!(on_failure.as_str()));
    }
    plan.insert("concurrency".into(), json!(budget.concurrency));
    plan.insert("requests_per_case".into(), json!(budget.requests_per_case));
    plan.insert("repetitions".into(), json!(budget.repetitions));
    plan.insert("warmup_per_case".into(), json!(budget.warmup_per_case));
    plan.insert("timeout_seconds".into(), json!(budget.timeout_seconds));
    plan.insert("metadata".into(), Value::Object(head.metadata.clone()));
    plan
}

/// What a written plan's metadata says of a required key nobody stated.
pub(crate) const UNKNOWN_METADATA: &str = "unknown: not recorded by the capture";

/// Fill every required provenance key that `m` lacks (or leaves blank or unknown) with
/// [`UNKNOWN_METADATA`], and say which in a warning line.
pub(crate) fn fill_metadata(m: &mut Map<String, Value>, lines: &mut Vec<String>) {
    let mut unknown = Vec::new();
    for key in crate::config::REQUIRED_METADATA {
        let blank = m
            .get(key)
            .and_then(Value::as_str)
            .is_none_or(|s| s.trim().is_empty() || s == UNKNOWN_METADATA);
        if blank {
            m.insert(key.to_string(), Value::from(UNKNOWN_METADATA));
            unknown.push(key);
        }
    }
    if !unknown.is_empty() {
        lines.push(format!(
            "warning: metadata {} written as \"{UNKNOWN_METADATA}\": state them in the plan (or with --metadata FILE) before its numbers are cited",
            unknown.join(", ")
        ));
    }
}

/// Variant names of a case: the replayed plan's own (`line-17`, a capture plan's from
/// `plan from-jsonl`), else `v1`, `v2`, ... by the order first seen (serve records none);
/// unique within the case (`-2`, `-3` after a name already taken).
pub(crate) fn variant_names(c: &Case) -> Vec<String> {
    let mut used = HashSet::new();
    c.variants
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let base = (v.source_name.clone()).unwrap_or_else(|| format!("v{}", i + 1));
            unique(base, &mut used)
        })
        .collect()
}

/// `base`, or `base-2`, `base-3`, ... when it is in `used`; the name is added to it.
fn unique(base: String, used: &mut HashSet<String>) -> String {
    let mut name = base.clone();
    let mut n = 1;
    while !used.insert(name.clone()) {
        n += 1;
        name = format!("{base}-{n}");
    }
    name
}

/// The ignore paths of one variant: what its repeats showed to be volatile, and the
/// documented volatile leaves its answer has. Only a JSON oracle takes any.
pub(crate) fn variant_ignore(v: &Variant) -> BTreeSet<String> {
    if v.contract.is_some() {
        // A contract judges no recorded answer: nothing of one to ignore.
        return BTreeSet::new();
    }
    let mut set = match &v.first {
        Answer::Json(answer) => volatile_present(answer),
        Answer::Events(events) => events.iter().flat_map(volatile_present).collect(),
        Answer::StreamText(_) | Answer::Text(_) => return BTreeSet::new(),
    };
    set.extend(v.volatile.iter().cloned());
    set
}

/// Case names after their paths (`v1/chat/completions`), unique (`-2`, `-3` after the
/// first).
pub(crate) fn case_names(cases: &[Case]) -> Vec<String> {
    let mut used = HashSet::new();
    cases
        .iter()
        .map(|c| {
            let path = c.key.path.split('?').next().unwrap_or("");
            let base = match path.trim_matches('/') {
                "" => "root".to_string(),
                p => p.to_string(),
            };
            unique(base, &mut used)
        })
        .collect()
}

/// The plan.
/// `chains[i]`: the sessions case `i` is frozen as (`None`: its variants).
pub(crate) fn plan_json(
    head: &Head,
    budget: &Budget,
    cases: &[Case],
    chains: &[Option<Chains>],
) -> Value {
    let mut ignore: Vec<Vec<BTreeSet<String>>> = cases
        .iter()
        .map(|c| c.variants.iter().map(variant_ignore).collect())
        .collect();
    // A JSON oracle's: its recorded answer is the oracle (a contract's is not).
    let is_json = |v: &Variant| matches!(v.first, Answer::Json(_)) && v.contract.is_none();
    let any_bytes = cases
        .iter()
        .flat_map(|c| &c.variants)
        .any(|v| matches!(v.first, Answer::Text(_)));
    // Top level: what every JSON oracle shares (a top-level list may not meet an
    // exact-bytes oracle; a streaming one takes it where it resolves).
    let mut json_sets = cases
        .iter()
        .zip(&ignore)
        .flat_map(|(c, sets)| c.variants.iter().zip(sets))
        .filter(|(v, _)| is_json(v))
        .map(|(_, s)| s.clone());
    let top: BTreeSet<String> = match json_sets.next() {
        Some(first) if !any_bytes => json_sets.fold(first, |acc, s| &acc & &s),
        _ => BTreeSet::new(),
    };
    for set in ignore.iter_mut().flatten() {
        set.retain(|p| !top.contains(p));
    }
    // Case level: what every variant of a case shares, when all of them are JSON.
    let case_ignore: Vec<BTreeSet<String>> = cases
        .iter()
        .zip(ignore.iter_mut())
        .map(|(c, sets)| {
            if c.variants.len() < 2 || !c.variants.iter().all(is_json) {
                return BTreeSet::new();
            }
            let shared = sets.iter().skip(1).fold(sets[0].clone(), |acc, s| &acc & s);
            for s in sets.iter_mut() {
                s.retain(|p| !shared.contains(p));
            }
            shared
        })
        .collect();

    let mut plan = head_map(head, budget);
    if !top.is_empty() {
        // Before the metadata, where a hand-written plan keeps it.
        let metadata = plan.shift_remove("metadata");
        plan.insert("ignore_paths".into(), json!(top));
        if let Some(m) = metadata {
            plan.insert("metadata".into(), m);
        }
    }
    let names = case_names(cases);
    let frozen: Vec<Value> = cases
        .iter()
        .enumerate()
        .map(|(i, c)| match chains.get(i).and_then(Option::as_ref) {
            Some(ch) => session_case_json(c, ch, &names[i], (&case_ignore[i], &ignore[i])),
            None => case_json(c, &names[i], &case_ignore[i], &ignore[i]),
        })
        .collect();
    plan.insert("cases".into(), Value::Array(frozen));
    Value::Object(plan)
}

fn case_json(
    c: &Case,
    name: &str,
    case_ignore: &BTreeSet<String>,
    variant_ignore: &[BTreeSet<String>],
) -> Value {
    let mut m = Map::new();
    case_head(&mut m, c, name);
    let has_body = !matches!(c.key.method.as_str(), "GET" | "HEAD");
    if let [only] = &c.variants[..] {
        request_and_oracle(&mut m, only, has_body, c.key.content_type.as_deref());
        if !variant_ignore[0].is_empty() {
            m.insert("ignore_paths".into(), json!(variant_ignore[0]));
        }
        return Value::Object(m);
    }
    if !case_ignore.is_empty() {
        m.insert("ignore_paths".into(), json!(case_ignore));
    }
    let names = variant_names(c);
    let variants: Vec<Value> = c
        .variants
        .iter()
        .zip(variant_ignore)
        .zip(names)
        .map(|((v, ignore), name)| {
            let mut vm = Map::new();
            vm.insert("name".into(), json!(name));
            request_and_oracle(&mut vm, v, has_body, c.key.content_type.as_deref());
            if !ignore.is_empty() {
                vm.insert("ignore_paths".into(), json!(ignore));
            }
            Value::Object(vm)
        })
        .collect();
    m.insert("variants".into(), Value::Array(variants));
    Value::Object(m)
}

/// A frozen case's fields from its key: name, method (when not POST), path, kept headers,
/// expected status (when not 200).
fn case_head(m: &mut Map<String, Value>, c: &Case, name: &str) {
    m.insert("name".into(), json!(name));
    if c.key.method != "POST" {
        m.insert("method".into(), json!(c.key.method));
    }
    m.insert("path".into(), json!(c.key.path));
    if !c.key.headers.is_empty() {
        let h: Map<String, Value> = c
            .key
            .headers
            .iter()
            .map(|(k, v)| (k.clone(), json!(v)))
            .collect();
        m.insert("headers".into(), Value::Object(h));
    }
    if c.key.status != 200 {
        m.insert("expected_status".into(), json!(c.key.status));
    }
}

/// A case frozen as sessions (`sessions.rs`): its key's fields, the requests' template,
/// a frozen history, and per session its turns: the messages each adds, its oracle and
/// ignore paths, and the answer the client sent back (the next turn's history).
fn session_case_json(
    c: &Case,
    chains: &Chains,
    name: &str,
    (case_ignore, variant_ignore): (&BTreeSet<String>, &[BTreeSet<String>]),
) -> Value {
    let mut m = Map::new();
    case_head(&mut m, c, name);
    if !case_ignore.is_empty() {
        m.insert("ignore_paths".into(), json!(case_ignore));
    }
    m.insert("history".into(), json!("frozen"));
    if let Some(h) = &chains.header {
        m.insert("session_header".into(), json!(h));
    }
    m.insert("request".into(), Value::Object(chains.template.clone()));
    let ids = session_ids(c, chains);
    let sessions: Vec<Value> = (0..chains.sessions.len())
        .map(|s| {
            let turns: Vec<Value> = chains.sessions[s]
                .iter()
                .enumerate()
                .map(|(k, &vi)| {
                    let (messages, answer) = chains.turn(c, s, k);
                    let mut t = turn_json(messages, answer);
                    oracle_fields(&mut t, &c.variants[vi]);
                    if !variant_ignore[vi].is_empty() {
                        t.insert("ignore_paths".into(), json!(variant_ignore[vi]));
                    }
                    Value::Object(t)
                })
                .collect();
            session_json(ids[s].clone(), turns)
        })
        .collect();
    m.insert("sessions".into(), Value::Array(sessions));
    Value::Object(m)
}

/// The ids of a case's sessions as the plan names them: each its [`Chains::id`], made
/// unique (`-2`, `-3` when taken: a client may reuse an affinity header's value).
pub(crate) fn session_ids(c: &Case, chains: &Chains) -> Vec<String> {
    let mut used = HashSet::new();
    (0..chains.sessions.len())
        .map(|s| unique(chains.id(c, s), &mut used))
        .collect()
}

/// A plan's turn of a session: the messages it adds, and the answer a frozen history
/// carries for it (`plan from-jsonl --turns all`, `plan synthetic --turns`, `freeze`).
pub(crate) fn turn_json(messages: Vec<Value>, answer: Option<Value>) -> Map<String, Value> {
    let mut t = Map::new();
    t.insert("messages".into(), Value::Array(messages));
    if let Some(a) = answer {
        t.insert("answer".into(), a);
    }
    t
}

/// A plan's session: its id and its turns.
pub(crate) fn session_json(id: String, turns: Vec<Value>) -> Value {
    json!({"id": id, "turns": turns})
}

/// A variant's oracle (its first answer) and planned prompt tokens.
fn oracle_fields(m: &mut Map<String, Value>, v: &Variant) {
    if let Some(pick) = &v.contract {
        let (field, value) = pick.field();
        m.insert(field.into(), value);
        if let Some(n) = v.prompt_tokens {
            m.insert("prompt_tokens".into(), json!(n));
        }
        return;
    }
    match &v.first {
        Answer::Json(a) => m.insert("expected_response".into(), a.clone()),
        Answer::StreamText(t) => m.insert("expected_stream_text".into(), json!(t)),
        Answer::Events(e) => m.insert("expected_events".into(), json!(e)),
        Answer::Text(t) => m.insert("expected_response_text".into(), json!(t)),
    };
    if let Some(n) = v.prompt_tokens {
        m.insert("prompt_tokens".into(), json!(n));
    }
}

/// A variant's request and oracle fields; `has_body`: the method sends one (a POST
/// recorded with an empty body sends an empty text body).
fn request_and_oracle(
    m: &mut Map<String, Value>,
    v: &Variant,
    has_body: bool,
    content_type: Option<&str>,
) {
    match &v.body {
        Body::Empty if has_body => {
            m.insert("request_text".into(), json!(""));
        }
        Body::Empty => {}
        Body::Json(r) => {
            m.insert("request".into(), r.clone());
        }
        Body::Text(t) => {
            m.insert("request_text".into(), json!(t));
        }
    }
    if let (Some(ct), true) = (content_type, has_body) {
        m.insert("content_type".into(), json!(ct));
    }
    oracle_fields(m, v);
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::freeze::collect::CaseKey;

    fn variant(first: Answer, volatile: &[&str]) -> Variant {
        Variant {
            body: Body::Json(json!({"p": volatile.len()})),
            first,
            answers: 2,
            volatile: volatile.iter().map(|s| s.to_string()).collect(),
            differed: 0,
            first_difference: None,
            prompt_tokens: None,
            source_name: None,
            session: None,
            called_tools: false,
            contract: None,
        }
    }

    fn case(path: &str, variants: Vec<Variant>) -> Case {
        Case {
            key: CaseKey {
                method: "POST".into(),
                path: path.into(),
                content_type: None,
                headers: Vec::new(),
                status: 200,
            },
            variants,
        }
    }

    fn plan(cases: &[Case]) -> Value {
        let head = Head {
            name: None,
            description: "d".into(),
            endpoint: "http://127.0.0.1:1/".into(),
            health_endpoint: None,
            bearer_token_env: None,
            metadata: crate::config::REQUIRED_METADATA
                .iter()
                .map(|k| (k.to_string(), json!("N/A")))
                .collect(),
        };
        let budget = Budget {
            concurrency: vec![1],
            requests_per_case: Some(2),
            repetitions: 2,
            warmup_per_case: 2,
            timeout_seconds: 5.0,
            connection: ConnectionPolicy::KeepAlive,
            on_failure: None,
        };
        let v = plan_json(&head, &budget, cases, &[]);
        let bytes = serde_json::to_vec(&v).unwrap();
        if let Err(e) = crate::config::plan::Plan::from_json_bytes(&bytes) {
            panic!("{e}\n{v:#}");
        }
        v
    }

    #[test]
    fn variants_keep_their_source_names_unique_within_the_case() {
        let named = |n: Option<&str>| Variant {
            source_name: n.map(str::to_string),
            ..variant(Answer::Text("a".into()), &[])
        };
        let c = case(
            "/v1/completions",
            vec![
                named(Some("line-3")),
                named(None),
                named(Some("line-3")),
                named(Some("v2")),
                named(None),
            ],
        );
        assert_eq!(
            variant_names(&c),
            ["line-3", "v2", "line-3-2", "v2-2", "v5"]
        );
    }

    #[test]
    fn a_plan_past_the_limit_is_refused_before_it_is_whole() {
        let v = json!({"a": "x".repeat(1000)});
        let whole = plan_bytes(&v, 10_000).unwrap_or_default();
        assert!(whole.ends_with(b"\n") && whole.len() > 1000);
        assert_eq!(plan_bytes(&v, whole.len() as u64).ok(), Some(whole.clone()));
        let err = plan_bytes(&v, whole.len() as u64 - 1)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.contains(&format!("larger than {} bytes", whole.len() - 1)),
            "{err}"
        );
        let err = plan_bytes(&v, 500).err();
        assert!(matches!(err, Some(PlanBytesError::TooBig { limit: 500 })));
        let err = err.map(|e| e.to_string()).unwrap_or_default();
        assert!(
            err.contains("the most `validate` and `replay` read"),
            "{err}"
        );
        assert!(plan_bytes(&json!({}), 64 << 20).is_ok());
        let err = plan_bytes(&json!({"a": "x".repeat(2 << 20)}), 1 << 20)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("larger than 1 MiB"), "{err}");
    }

    fn list(v: Option<&Value>) -> Vec<&str> {
        v.and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default()
    }

    #[test]
    fn ignore_paths_are_lifted_as_far_as_they_are_shared() {
        let answer = json!({"id": "x", "created": 1, "x": 2, "choices": []});
        let cases = [
            case(
                "/v1/chat/completions",
                vec![
                    variant(Answer::Json(answer.clone()), &["/x"]),
                    variant(Answer::Json(answer.clone()), &["/x"]),
                    variant(Answer::Json(answer.clone()), &[]),
                ],
            ),
            case(
                "/v1/completions",
                vec![variant(Answer::Json(answer.clone()), &[])],
            ),
            case(
                "/v1/chat/completions",
                vec![variant(Answer::StreamText("hi".into()), &[])],
            ),
        ];
        let v = plan(&cases);
        // Every JSON oracle has the documented stamps: they go to the top.
        assert_eq!(list(v.pointer("/ignore_paths")), ["/created", "/id"]);
        // Only two variants of the first case learnt /x: it stays with them.
        assert_eq!(list(v.pointer("/cases/0/ignore_paths")), Vec::<&str>::new());
        assert_eq!(list(v.pointer("/cases/0/variants/0/ignore_paths")), ["/x"]);
        assert_eq!(
            list(v.pointer("/cases/0/variants/2/ignore_paths")),
            Vec::<&str>::new()
        );
        // Names follow the paths and stay unique; a lone request needs no variants list.
        assert_eq!(
            v.pointer("/cases/2/name"),
            Some(&json!("v1/chat/completions-2"))
        );
        assert_eq!(v.pointer("/cases/1/variants"), None);
        assert_eq!(
            v.pointer("/cases/2/expected_stream_text"),
            Some(&json!("hi"))
        );

        // A case whose variants all learnt /x takes it; an exact-bytes oracle anywhere
        // keeps everything below the top.
        let cases = [
            case(
                "/a",
                vec![
                    variant(Answer::Json(answer.clone()), &["/x"]),
                    variant(Answer::Json(answer.clone()), &["/x"]),
                ],
            ),
            case("/b", vec![variant(Answer::Text("raw".into()), &[])]),
        ];
        let v = plan(&cases);
        assert_eq!(v.pointer("/ignore_paths"), None);
        assert_eq!(
            list(v.pointer("/cases/0/ignore_paths")),
            ["/created", "/id", "/x"]
        );
        assert_eq!(v.pointer("/cases/0/variants/0/ignore_paths"), None);
        assert_eq!(v.pointer("/cases/1/ignore_paths"), None);
        assert_eq!(
            variant_ignore(&cases[1].variants[0]),
            BTreeSet::<String>::new()
        );
    }

    #[test]
    fn requests_without_a_body_stay_valid() {
        let mut empty = variant(Answer::Text(String::new()), &[]);
        empty.body = Body::Empty;
        let mut post = case("/v1/ping", vec![empty.clone()]);
        post.key.content_type = Some("application/json".into());
        let mut get = case("/v1/models", vec![empty]);
        get.key.method = "GET".into();
        let v = plan(&[post, get]);
        // A POST recorded with no body sends an empty one, with its content type.
        assert_eq!(v.pointer("/cases/0/request_text"), Some(&json!("")));
        assert_eq!(
            v.pointer("/cases/0/content_type"),
            Some(&json!("application/json"))
        );
        // A GET sends none.
        assert_eq!(v.pointer("/cases/1/method"), Some(&json!("GET")));
        assert_eq!(v.pointer("/cases/1/request_text"), None);
        assert_eq!(v.pointer("/cases/1/content_type"), None);
        assert_eq!(
            v.pointer("/cases/1/expected_response_text"),
            Some(&json!(""))
        );
    }
}
