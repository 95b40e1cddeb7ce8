//! A case's `sessions` as the plan writes them, walked into [`Sessions`]: the case's
//! session fields, each session's id and turns, each turn's messages or request, its
//! frozen answer, think time and oracle (a variant's, named `<session id>/<turn>`).

use std::collections::HashSet;
use std::time::Duration;

use http::{HeaderName, HeaderValue};
use serde_json::{Map, Value};

use super::json::{ENGINE_HEADERS, REQUEST_FIELDS, Validator, join};
use super::oracle_spec::Inherited;
use super::plan::Variant;
use super::sessions::{History, MAX_TURNS, Session, Sessions, Turn};
use crate::oracle::json_kind;

/// Longest think time a turn may ask for.
const MAX_THINK_SECONDS: f64 = 3600.0;

/// What a case's session fields are, besides the request template.
const SESSION_CASE_FIELDS: &[&str] = &[
    "sessions",
    "history",
    "session_header",
    "think_seconds",
    "cache_bust",
];
/// The fields of one turn besides a request's ([`REQUEST_FIELDS`]: a whole-request
/// turn's body, and every turn's oracle).
const TURN_FIELDS: &[&str] = &["messages", "answer", "think_seconds", "ignore_paths"];
/// The answer a frozen history carries for a turn: its `answer` (as written), else its
/// `expected_response`'s first choice's message (its `role`, `content`, `tool_calls` and
/// `name`), else its `expected_stream_text` as an assistant message.
fn frozen_answer(m: &Map<String, Value>) -> Option<Value> {
    if let Some(a) = m.get("answer") {
        return Some(a.clone());
    }
    // The message as a history sends it back: the server's extra fields (`refusal`,
    // `reasoning_content`, ...) left out, as a live history leaves them out.
    if let Some(msg) = m
        .get("expected_response")
        .and_then(|r| r.pointer("/choices/0/message"))
    {
        return crate::oracle::answer::comparable(msg).or_else(|| Some(msg.clone()));
    }
    m.get("expected_stream_text")
        .and_then(Value::as_str)
        .map(|t| serde_json::json!({"role": "assistant", "content": t}))
}

impl Validator {
    /// The session fields a case may have besides its request template.
    pub(super) fn session_case_fields() -> &'static [&'static str] {
        SESSION_CASE_FIELDS
    }

    /// A case with `sessions`: its turns as variants, and the sessions.
    pub(super) fn session_case(
        &mut self,
        m: &Map<String, Value>,
        path: &str,
        inherited: Inherited<'_>,
    ) -> Option<(Vec<Variant>, Sessions)> {
        self.session_case_refusals(m, path);
        let history = self.history(m.get("history"), &join(path, "history"));
        let header = self.session_header(m.get("session_header"), &join(path, "session_header"));
        let think = self.think(
            m.get("think_seconds"),
            &join(path, "think_seconds"),
            Duration::ZERO,
        );
        let (template, prefix) = self.template(m.get("request"), &join(path, "request"))?;
        let p = join(path, "sessions");
        let items = match m.get("sessions") {
            Some(Value::Array(a)) if !a.is_empty() => a,
            Some(v) => {
                self.err(
                    &p,
                    format!(
                        "must be a non-empty list of sessions, found {}",
                        json_kind(v)
                    ),
                );
                return None;
            }
            None => return None,
        };
        let cache_bust = match m.get("cache_bust") {
            None => Some(false),
            Some(Value::Bool(b)) => Some(*b),
            Some(v) => {
                self.err(
                    join(path, "cache_bust"),
                    format!("must be true or false, found {v}"),
                );
                None
            }
        };
        let ctx = TurnCtx {
            cache_bust: cache_bust?,
            history: history?,
            think: think?,
            has_template: template.is_some(),
            header: header.clone()?,
            inherited,
        };
        let mut variants = Vec::new();
        let mut list = Vec::new();
        let mut ids = HashSet::new();
        let mut ok = true;
        for (i, item) in items.iter().enumerate() {
            let sp = format!("{p}[{i}]");
            match self.session(item, &sp, i, &ctx, &mut variants) {
                Some(s) => {
                    if !ids.insert(s.id.clone()) {
                        self.err(
                            join(&sp, "id"),
                            format!("session id '{}' is used more than once in this case", s.id),
                        );
                        ok = false;
                    }
                    list.push(s);
                }
                None => ok = false,
            }
        }
        if !ok {
            return None;
        }
        Some((
            variants,
            Sessions {
                history: ctx.history,
                cache_bust: ctx.cache_bust,
                header: ctx.header,
                template: template.unwrap_or_default(),
                prefix,
                list,
            },
        ))
    }

    /// The fields a case with sessions takes from its turns instead.
    fn session_case_refusals(&mut self, m: &Map<String, Value>, path: &str) {
        let taken = REQUEST_FIELDS.iter().filter(|k| **k != "request");
        for &key in std::iter::once(&"variants").chain(taken) {
            if m.contains_key(key) {
                self.err(
                    join(path, key),
                    "a case with sessions takes its requests and oracles from its turns; move this field into each turn (the case's request is the template every chat turn extends)",
                );
            }
        }
    }

    /// A case's `history`: `frozen` (default) or `live`.
    fn history(&mut self, v: Option<&Value>, p: &str) -> Option<History> {
        match v.map(|v| (v, v.as_str())) {
            None | Some((_, Some("frozen"))) => Some(History::Frozen),
            Some((_, Some("live"))) => Some(History::Live),
            Some((v, _)) => {
                self.err(
                    p,
                    format!("must be \"frozen\" (the plan's recorded answers) or \"live\" (the server's own answers in this run), found {v}"),
                );
                None
            }
        }
    }

    /// `session_header`: a header name the plan may set (not a secret, not framing).
    fn session_header(&mut self, v: Option<&Value>, p: &str) -> Option<Option<HeaderName>> {
        let Some(v) = v else { return Some(None) };
        let s = self.nonblank(v, p)?;
        match HeaderName::from_bytes(s.as_bytes()) {
            Ok(h)
                if ENGINE_HEADERS.contains(&h.as_str())
                    || crate::redact::DEFAULT_REDACT_HEADERS.contains(&h.as_str()) =>
            {
                self.err(p, format!("'{s}' is set by the engine or carries a secret; name a header of your own, e.g. x-session-id"));
                None
            }
            Ok(h) => Some(Some(h)),
            Err(_) => {
                self.err(p, format!("'{s}' is not a valid header name"));
                None
            }
        }
    }

    /// A think time in seconds (0 to an hour), `default` when absent.
    fn think(&mut self, v: Option<&Value>, p: &str, default: Duration) -> Option<Duration> {
        let Some(v) = v else { return Some(default) };
        match v.as_f64() {
            Some(s) if (0.0..=MAX_THINK_SECONDS).contains(&s) => Some(Duration::from_secs_f64(s)),
            _ => {
                self.err(
                    p,
                    format!("must be a number of seconds from 0 to {MAX_THINK_SECONDS}, found {v}"),
                );
                None
            }
        }
    }

    /// The case's `request` as a chat template: an object whose `messages`, if any, is a
    /// list of message objects (the prefix every chat turn starts with).
    #[allow(clippy::type_complexity)]
    fn template(
        &mut self,
        v: Option<&Value>,
        p: &str,
    ) -> Option<(Option<Map<String, Value>>, Vec<Value>)> {
        let Some(v) = v else {
            return Some((None, Vec::new()));
        };
        let mut m = self.object(v, p)?.clone();
        let prefix = match m.remove("messages") {
            None => Vec::new(),
            Some(Value::Array(a)) if a.iter().all(Value::is_object) => a,
            Some(other) => {
                self.err(join(p, "messages"), format!("must be a list of message objects (the prefix every turn starts with), found {}", json_kind(&other)));
                return None;
            }
        };
        Some((Some(m), prefix))
    }
}

/// What every turn of a case's sessions shares.
struct TurnCtx<'a> {
    cache_bust: bool,
    history: History,
    think: Duration,
    has_template: bool,
    header: Option<HeaderName>,
    inherited: Inherited<'a>,
}

impl Validator {
    /// One session: its id and turns (each pushed to `variants`).
    fn session(
        &mut self,
        v: &Value,
        p: &str,
        index: usize,
        ctx: &TurnCtx<'_>,
        variants: &mut Vec<Variant>,
    ) -> Option<Session> {
        let m = self.object(v, p)?;
        self.unknown_fields(m, p, &[&["id", "turns"]]);
        let id = match m.get("id") {
            None => Some(format!("s{}", index + 1)),
            Some(v) => self.nonblank(v, &join(p, "id")).map(str::to_string),
        }?;
        let header_value = match &ctx.header {
            None => None,
            Some(_) => match HeaderValue::from_str(&id) {
                Ok(h) if id.bytes().all(|b| (0x20..0x7f).contains(&b)) => Some(h),
                _ => {
                    self.err(
                        join(p, "id"),
                        "is sent in session_header, so it must be printable ASCII",
                    );
                    return None;
                }
            },
        };
        let tp = join(p, "turns");
        let turns = match m.get("turns") {
            Some(Value::Array(a)) if !a.is_empty() && a.len() <= MAX_TURNS => a,
            Some(Value::Array(a)) if a.len() > MAX_TURNS => {
                self.err(
                    &tp,
                    format!(
                        "has {} turns; a session holds at most {MAX_TURNS}: cut it into sessions",
                        a.len()
                    ),
                );
                return None;
            }
            other => {
                self.err(
                    &tp,
                    format!(
                        "is required: a non-empty list of turns, found {}",
                        other.map_or("nothing", json_kind)
                    ),
                );
                return None;
            }
        };
        let first_variant = variants.len();
        let mut out = Vec::with_capacity(turns.len());
        let mut ok = true;
        for (k, t) in turns.iter().enumerate() {
            let last = k + 1 == turns.len();
            match self.turn(t, &format!("{tp}[{k}]"), (&id, k, last), ctx) {
                Some((turn, var)) => {
                    out.push(turn);
                    variants.push(var);
                }
                None => ok = false,
            }
        }
        ok.then_some(Session {
            id_arc: id.as_str().into(),
            id,
            header_value,
            first_variant,
            turns: out,
        })
    }

    /// One turn (`k` from 0 of session `id`; `last` when no turn follows): what it sends
    /// and its variant.
    fn turn(
        &mut self,
        v: &Value,
        p: &str,
        (id, k, last): (&str, usize, bool),
        ctx: &TurnCtx<'_>,
    ) -> Option<(Turn, Variant)> {
        let m = self.object(v, p)?;
        self.unknown_fields(m, p, &[TURN_FIELDS, REQUEST_FIELDS]);
        if k == 0 && m.contains_key("think_seconds") {
            self.err(
                join(p, "think_seconds"),
                "a session's first turn is sent when the session starts: a think time is the wait after the turn before, and it has none",
            );
        }
        let think = self.think(m.get("think_seconds"), &join(p, "think_seconds"), ctx.think);
        let judged = [
            "expected_response",
            "expected_response_text",
            "expected_stream_text",
            "expected_events",
        ]
        .iter()
        .any(|f| m.contains_key(*f));
        if ctx.cache_bust && judged {
            self.err(p, "with cache_bust every run of a session sends its own tag, so the server's answer is not the recorded one; remove the expected_* field (a capture records, a campaign judges by drift) or cache_bust");
        }
        if ctx.history == History::Live && judged {
            self.err(p, "a live history's turns are recorded (a capture) or judged by drift (a campaign): each request after the first carries the server's own earlier answers, so no recorded answer applies to it; remove the expected_* field or use \"history\": \"frozen\"");
        }
        let whole = m.contains_key("request") || m.contains_key("request_text");
        if m.contains_key("messages") && m.contains_key("content_type") {
            self.err(join(p, "content_type"), "a chat turn's request is the case's JSON template with its messages; content_type goes with a whole request (request or request_text)");
        }
        let messages = match (m.get("messages"), whole) {
            (Some(_), true) | (None, false) => {
                self.err(p, "give exactly one of messages (what this turn adds to the chat) or a whole request (request or request_text, sent as written)");
                None
            }
            (Some(Value::Array(a)), false) if !a.is_empty() && a.iter().all(Value::is_object) => {
                if !ctx.has_template {
                    self.err(p, "a chat turn needs the case's request: the template (model, max_tokens, ...) its messages are sent in");
                }
                Some(Some(a.clone()))
            }
            (Some(other), false) => {
                self.err(
                    join(p, "messages"),
                    format!(
                        "must be a non-empty list of message objects, found {}",
                        json_kind(other)
                    ),
                );
                None
            }
            (None, true) => Some(None),
        };
        let answer = frozen_answer(m);
        if ctx.history == History::Frozen
            && !last
            && answer.is_none()
            && matches!(messages, Some(Some(_)))
        {
            self.err(p, "a frozen history carries this turn's answer in every later turn: give answer (the assistant message, e.g. {\"role\": \"assistant\", \"content\": \"...\"}) or an expected_response with /choices/0/message");
        }
        if answer.as_ref().is_some_and(|a| !a.is_object()) {
            self.err(
                join(p, "answer"),
                "must be a message object, e.g. {\"role\": \"assistant\", \"content\": \"...\"}",
            );
        }
        let var = self.turn_variant(m, p, format!("{id}/{}", k + 1), ctx.inherited);
        Some((
            Turn {
                messages: messages?,
                answer,
                think: think?,
            },
            var?,
        ))
    }

    /// A turn's variant: its oracle, ignore paths and planned prompt tokens; its body is
    /// the turn's `request`, or empty for a chat turn (made at send time).
    fn turn_variant(
        &mut self,
        m: &Map<String, Value>,
        p: &str,
        name: String,
        inherited: Inherited<'_>,
    ) -> Option<Variant> {
        let mut template_fields = m.clone();
        let chat = template_fields.contains_key("messages");
        if chat {
            // A chat turn's body is made at send time; the variant's stays empty.
            template_fields.insert("request_text".into(), Value::String(String::new()));
        }
        template_fields.remove("messages");
        template_fields.remove("answer");
        template_fields.remove("think_seconds");
        let own_ignore = match m.get("ignore_paths") {
            None => Some(Vec::new()),
            Some(v) => self.pointers(v, &join(p, "ignore_paths")),
        };
        template_fields.remove("ignore_paths");
        let mut var = self.variant_body(&template_fields, p, Some(name), false, inherited)?;
        if chat {
            var.content_type = Some(HeaderValue::from_static("application/json"));
        }
        for ptr in own_ignore? {
            if !var.ignore_paths.contains(&ptr) {
                var.ignore_paths.push(ptr.clone());
            }
            if let Err(msgs) = var.oracle.add_ignore_paths(vec![ptr]) {
                for msg in msgs {
                    self.err(join(p, "ignore_paths"), msg);
                }
            }
        }
        Some(var)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::plan::Plan;
    use crate::config::sessions::History;
    use serde_json::json;

    use crate::config::plan::one_case as plan;

    fn user(text: &str) -> Value {
        json!([{"role": "user", "content": text}])
    }

    #[test]
    fn a_frozen_turn_is_sent_with_the_recorded_history_and_each_turn_is_a_variant() {
        let p = plan(json!({
            "name": "chat", "session_header": "x-session-id",
            "request": {"model": "m", "max_tokens": 4, "messages": [{"role": "system", "content": "be brief"}]},
            "sessions": [
                {"id": "a", "turns": [
                    {"messages": user("hi"), "answer": {"role": "assistant", "content": "hello"},
                     "expected_response_text": "{}"},
                    {"messages": user("more"), "think_seconds": 0.5,
                     "expected_response": {"choices": [{"message": {"role": "assistant", "content": "sure"}}]}},
                    {"messages": user("bye"), "expected_response_text": "{}"}]},
                {"turns": [{"messages": user("solo"), "expected_response_text": "{}"}]}
            ]}))
        .unwrap();
        let case = &p.cases[0];
        let names: Vec<_> = case
            .variants
            .iter()
            .map(|v| v.name.clone().unwrap())
            .collect();
        assert_eq!(names, ["a/1", "a/2", "a/3", "s2/1"]);
        let s = case.sessions.as_ref().unwrap();
        assert_eq!((s.history, s.list[1].first_variant), (History::Frozen, 3));
        assert_eq!(s.list[0].turns[1].think, Duration::from_millis(500));
        assert_eq!(s.list[0].header_value.as_ref().unwrap(), "a");
        let body = s.body(0, 2, &s.frozen_answers(0)[..2], None).unwrap();
        let sent: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            sent,
            json!({"model": "m", "max_tokens": 4, "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
                {"role": "user", "content": "more"}, {"role": "assistant", "content": "sure"},
                {"role": "user", "content": "bye"}]})
        );
        let tagged: Value =
            serde_json::from_slice(&s.body(0, 0, &[], Some("[0a1b] ")).unwrap()).unwrap();
        assert_eq!(tagged["messages"][0]["content"], "[0a1b] be brief");
        // Two dispatches of a case of 4 turns in 2 sessions send 3 + 1; three send 3 + 1 + 3.
        assert_eq!((case.requests_of(2), case.requests_of(3)), (4, 7));
        assert!(p.unmeasured_variants().is_empty());
    }

    #[test]
    fn a_conversation_built_turn_by_turn_sends_what_the_whole_history_would() {
        for (prefix, tag) in [
            (true, None),
            (true, Some("[t] ")),
            (false, Some("[t] ")),
            (false, None),
        ] {
            let mut request = json!({"model": "m", "max_tokens": 4});
            if prefix {
                request["messages"] =
                    json!([{"role": "system", "content": [{"type": "text", "text": "sys"}]}]);
            }
            let p = plan(json!({"name": "c", "request": request, "sessions": [{"turns": [
                {"messages": user("a"), "answer": {"role": "assistant", "content": "A"}},
                {"messages": user("b"), "answer": {"role": "assistant", "content": "B"}},
                {"messages": [{"role": "tool", "content": "t"}, {"role": "user", "content": "c"}]}]}]}))
            .unwrap();
            let s = p.cases[0].sessions.as_ref().unwrap();
            let answers = s.frozen_answers(0);
            let mut conv = s.conversation(tag);
            for (k, turn) in s.list[0].turns.iter().enumerate() {
                let now = turn.messages.as_deref().unwrap();
                let want = s.body(0, k, &answers[..k], tag).unwrap();
                assert_eq!(
                    conv.request(now),
                    want,
                    "turn {k}, prefix {prefix}, tag {tag:?}"
                );
                conv.carry(now, answers[k]);
            }
        }
    }

    #[test]
    fn a_frozen_history_needs_every_answer_but_the_last() {
        let problems = plan(json!({
            "name": "chat", "request": {"model": "m"},
            "sessions": [{"turns": [{"messages": user("hi")}, {"messages": user("more")}]}]}))
        .unwrap_err();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].starts_with(
                "cases[0].sessions[0].turns[0]: a frozen history carries this turn's answer"
            ),
            "{problems:?}"
        );
    }

    #[test]
    fn bad_sessions_are_named_with_their_fix() {
        let problems = plan(json!({
            "name": "chat", "history": "replayed", "session_header": "authorization",
            "variants": [], "expected_response": {},
            "request": {"model": "m", "messages": "no"},
            "sessions": [{"id": "a", "turns": []}, {"id": "a", "turns": [{"messages": user("x"), "request": {}}]}]}))
        .unwrap_err();
        let text = problems.join("\n");
        for want in [
            "cases[0].variants: a case with sessions takes its requests and oracles from its turns",
            "cases[0].expected_response: a case with sessions",
            "cases[0].history: must be \"frozen\"",
            "cases[0].session_header: 'authorization' is set by the engine or carries a secret",
            "cases[0].request.messages: must be a list of message objects",
        ] {
            assert!(text.contains(want), "{want} not in\n{text}");
        }
        // A whole raw request is a turn too; a chat turn takes no content type.
        let raw = plan(json!({"name": "raw", "sessions": [{"turns": [
            {"request_text": "ping", "content_type": "text/plain", "expected_response_text": "pong"}]}]}))
        .unwrap();
        let v = &raw.cases[0].variants[0];
        assert_eq!(&v.body[..], b"ping");
        assert_eq!(v.content_type.as_ref().unwrap(), "text/plain");
        let problems = plan(
            json!({"name": "c", "request": {"model": "m"}, "sessions": [{"turns": [
            {"messages": user("x"), "content_type": "text/plain"}]}]}),
        )
        .unwrap_err();
        assert!(
            problems[0]
                .starts_with("cases[0].sessions[0].turns[0].content_type: a chat turn's request"),
            "{problems:?}"
        );
    }

    #[test]
    fn a_live_history_has_no_recorded_oracle_and_sessions_run_in_every_load_mode() {
        let problems = plan(json!({
            "name": "chat", "history": "live", "request": {"model": "m"},
            "sessions": [{"id": "a", "turns": [
                {"messages": user("hi"), "expected_response": {"x": 1}},
                {"messages": user("more")}]},
                {"id": "b", "turns": [{"messages": user("x"), "request": {"model": "m"}}]}]}))
        .unwrap_err()
        .join("\n");
        assert!(text_has(
            &problems,
            "cases[0].sessions[0].turns[0]: a live history's turns are recorded"
        ));
        assert!(text_has(
            &problems,
            "cases[0].sessions[1].turns[0]: give exactly one of messages"
        ));
        let live = json!({"name": "chat", "history": "live", "request": {"model": "m"},
            "sessions": [{"turns": [{"messages": user("hi")}, {"messages": user("more")}]}]});
        let p = plan(live.clone()).unwrap();
        assert_eq!(p.cases[0].sessions.as_ref().unwrap().history, History::Live);
        let mut open = serde_json::from_str::<Value>(&format!(
            r#"{{"endpoint": "http://127.0.0.1:8000/v1/chat/completions", "timeout_seconds": 2,
            "load": {{"mode": "open", "rates_per_second": [1], "requests": 4}}, "cases": [{live}]}}"#
        ))
        .unwrap();
        open["metadata"] = json!({"gpu": "N/A", "gpu_ids": "N/A", "driver": "N/A", "cuda": "N/A",
            "precision": "N/A", "model_revision": "m", "runtime_revision": "r",
            "cache_policy": "none", "cuda_evidence": "N/A", "reservation": "N/A", "host": "h"});
        // An open loop's arrival starts a session; in a trace an entry naming turn 1
        // starts a run and one naming a later turn gives its offset in that run.
        Plan::from_json_bytes(open.to_string().as_bytes()).expect("an open loop of sessions");
        let entry = |off: u64, v: &str| json!({"offset_us": off, "case": "chat", "variant": v});
        let trace = |entries: Vec<Value>| {
            let mut p = open.clone();
            p["load"] = json!({"mode": "trace", "trace": {"entries": entries}});
            Plan::from_json_bytes(p.to_string().as_bytes())
        };
        let p = trace(vec![entry(0, "s1/1"), entry(5, "s1/2"), entry(9, "s1/1")]).unwrap();
        let t = p.load.trace.as_ref().unwrap();
        let picks: Vec<u32> = t.picks(None).iter().map(|p| p.entry).collect();
        assert_eq!(
            picks,
            [0, 2],
            "a later turn's entry is not a send of its own"
        );
        assert_eq!(t.run_at(0), Some((0, vec![Some(0), Some(5)])));
        assert_eq!(t.run_at(2), Some((0, vec![Some(9), None])));
        assert_eq!(t.planned(0, None), 4, "every turn of both runs");
        for (entries, want) in [
            (
                vec![entry(0, "s1/2")],
                "load.trace.entries[0]: names 's1/2' of case 'chat', a later turn, but no earlier entry names that session's turn 1",
            ),
            (
                vec![entry(0, "s1/1"), entry(1, "s1/2"), entry(2, "s1/2")],
                "load.trace.entries[2]: names 's1/2' of case 'chat', but the session's latest run already has an entry for turn 2",
            ),
            // A later turn's offset counts in the round's length (here 285 years).
            (
                vec![entry(0, "s1/1"), entry((1 << 53) - 1, "s1/2")],
                "load.trace: the window [0 s, the end) of the trace's 2 entries would take",
            ),
        ] {
            let e = trace(entries).unwrap_err();
            assert!(
                e.problems.iter().any(|p| p.to_string().starts_with(want)),
                "{e:?}"
            );
        }
    }

    fn text_has(text: &str, want: &str) -> bool {
        text.lines().any(|l| l.starts_with(want))
    }
}
