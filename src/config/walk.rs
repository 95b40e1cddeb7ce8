//! The top-level walk of a plan: [`Plan::from_json_bytes`] reads the document
//! (`json.rs`), checks the top-level fields (endpoints, concurrency, repetitions,
//! timeouts, metadata, auth, policies, drift) and hands the cases (`cases.rs`), the load
//! (`load.rs`) and the campaign (`campaign.rs`) to their own walks. Only a plan with no
//! problem becomes a [`Plan`]; `Err` carries every problem found, each with its path.
//! This module never opens a socket and never writes a file.

use std::collections::HashSet;
use std::time::Duration;

use serde_json::{Map, Value};

use super::json::{PlanError, Validator, join, read_document};
use super::load::{MAX_REQUESTS_PER_CASE, Mode};
use super::plan::{DEFAULT_DECISIONS_POINTER, OnFailure, Plan};
use crate::model::{ConnectionPolicy, Endpoint};
use crate::oracle::{Pointer, json_kind};

/// The provenance keys every plan must carry with a non-blank string value.
pub(crate) const REQUIRED_METADATA: [&str; 11] = [
    "gpu",
    "gpu_ids",
    "driver",
    "cuda",
    "precision",
    "model_revision",
    "runtime_revision",
    "cache_policy",
    "cuda_evidence",
    "reservation",
    "host",
];

const TOP_FIELDS: &[&str] = &[
    "endpoint",
    "health_endpoint",
    "cases",
    "concurrency",
    "requests_per_case",
    "repetitions",
    "warmup_per_case",
    "timeout_seconds",
    "metadata",
    "connection",
    "on_failure",
    "auth",
    "name",
    "description",
    "ignore_paths",
    "decisions_pointer",
    "arms",
    "evidence_class",
    "schedule",
    "drift",
    "load",
    "slo",
    "worker_metrics",
];

impl Plan {
    /// Parse and validate a plan. `Err` carries every problem found.
    pub(crate) fn from_json_bytes(bytes: &[u8]) -> Result<Plan, PlanError> {
        let value = read_document(bytes, "plan")?;
        let mut v = Validator::default();
        let plan = v.plan(&value);
        v.finish(plan)
    }
}

/// `load.mode` as written (so a load with a mistake elsewhere is still judged by its
/// mode).
fn load_mode(top: &Map<String, Value>) -> Option<&str> {
    top.get("load")
        .and_then(|l| l.get("mode"))
        .and_then(Value::as_str)
}

/// The plan's cases as a trace's entries name them.
pub(crate) fn trace_names(
    cases: &[super::plan::Case],
    synthetic: Option<super::trace::SyntheticRules>,
) -> super::trace::Names<'_> {
    super::trace::Names {
        cases: cases
            .iter()
            .map(|c| {
                (
                    c.name.as_str(),
                    c.variants.iter().map(|v| v.name.as_deref()).collect(),
                )
            })
            .collect(),
        synthetic,
        turns: cases.iter().map(turns_of).collect(),
    }
}

/// Where each variant of `case` sits in its sessions (empty without them).
fn turns_of(case: &super::plan::Case) -> Vec<Option<super::trace::TurnOf>> {
    let Some(s) = &case.sessions else {
        return Vec::new();
    };
    let mut out = vec![None; case.variants.len()];
    for (i, session) in s.list.iter().enumerate() {
        let turns = session.turns.len() as u16;
        for turn in 0..turns {
            if let Some(v) = out.get_mut(session.first_variant + usize::from(turn)) {
                *v = Some(super::trace::TurnOf {
                    session: i as u32,
                    turn,
                    turns,
                });
            }
        }
    }
    out
}

impl Validator {
    fn plan(&mut self, root: &Value) -> Option<Plan> {
        let top = self.object(root, "")?;
        self.unknown_fields(top, "", &[TOP_FIELDS]);
        let is_campaign = top.contains_key("arms");
        if !is_campaign {
            for key in ["evidence_class", "schedule"] {
                if top.contains_key(key) {
                    self.err(key, "goes with arms: it describes a campaign plan");
                }
            }
        }
        let metadata = self.metadata(top.get("metadata"));
        let campaign = if is_campaign {
            self.campaign(top, metadata.as_ref()).map(Some)
        } else {
            Some(None)
        };
        let (endpoint, health_endpoint) = self.plan_endpoints(top, campaign.as_ref(), is_campaign);

        let load = self.load(top.get("load"));
        let slo = self.slo(top.get("slo"));
        let worker_metrics = self.plan_worker_metrics(top, is_campaign);
        let (requests_per_case, concurrency) = self.rounds(top, is_campaign);
        let (repetitions, warmup_per_case) = self.counts(top);
        let timeout = self.timeout(top.get("timeout_seconds"));
        let (connection, on_failure) = self.policies(top);
        let bearer_token_env = self.auth(top.get("auth"));
        let name = match top.get("name") {
            None => Some(None),
            Some(v) => self.nonblank(v, "name").map(|s| Some(s.to_string())),
        };
        if let Some(v) = top.get("description") {
            self.string(v, "description");
        }
        let drift_numeric_pointers = self.drift(top.get("drift"));
        let top_ignore = match top.get("ignore_paths") {
            None => Some(Vec::new()),
            Some(v) => self.pointers(v, "ignore_paths"),
        };
        let decisions_pointer = self.decisions_pointer(top);
        let cases = self.cases(
            top.get("cases"),
            endpoint.as_ref(),
            top_ignore.as_deref().unwrap_or(&[]),
        );
        self.judged_or_capture(is_campaign);
        let load = match (load, &cases) {
            (Some(mut l), Some(cases)) if l.trace.is_some() => {
                self.resolve_trace(&mut l, top, cases).map(|()| l)
            }
            (l, _) => l,
        };

        Some(Plan {
            endpoint: endpoint?,
            health_endpoint: health_endpoint?,
            cases: cases?,
            concurrency: concurrency?,
            requests_per_case: requests_per_case?,
            repetitions: repetitions?,
            warmup_per_case: warmup_per_case?,
            timeout_seconds: timeout?.0,
            timeout: timeout?.1,
            metadata: metadata?,
            connection: connection?,
            on_failure: on_failure?,
            bearer_token_env: bearer_token_env?,
            decisions_pointer: decisions_pointer?,
            campaign: campaign?,
            name: name?,
            drift_numeric_pointers: drift_numeric_pointers?,
            workload: Value::Null,
            load: load.map(|mut l| {
                if l.mode == Mode::Closed {
                    l.extent =
                        crate::arrival::Extent::Requests(requests_per_case.unwrap_or(0) as u64);
                }
                l
            })?,
            slo: slo?,
            worker_metrics: worker_metrics?,
        })
        .filter(|_| top_ignore.is_some())
        .map(|mut p| {
            p.workload = super::workload::workload(root, &p);
            p
        })
    }

    /// The plan's endpoint and health endpoint: a plain plan's own; a campaign plan's
    /// reference arm's with a stand-in port (each arm's run replaces them,
    /// [`Plan::for_arm`]); none when the campaign is wrong.
    fn plan_endpoints(
        &mut self,
        top: &Map<String, Value>,
        campaign: Option<&Option<super::campaign::Campaign>>,
        is_campaign: bool,
    ) -> (Option<Endpoint>, Option<Endpoint>) {
        match campaign {
            Some(Some(c)) => match c.reference().endpoints(1) {
                Ok((e, h)) => (Some(e), Some(h)),
                Err(_) => (None, None),
            },
            _ if is_campaign => (None, None),
            _ => self.endpoints(top),
        }
    }

    /// `requests_per_case` and `concurrency`: a closed loop's; an open loop has neither
    /// (refused when given) and gets 0 and none.
    fn rounds(
        &mut self,
        top: &Map<String, Value>,
        is_campaign: bool,
    ) -> (Option<usize>, Option<Vec<usize>>) {
        // As written, so an open load with a mistake elsewhere is still judged as open.
        let mode = load_mode(top);
        if mode == Some("open") {
            self.open_refusals(top, is_campaign);
            (Some(0), Some(Vec::new()))
        } else if mode == Some("trace") {
            self.trace_refusals(top, is_campaign);
            (Some(0), Some(Vec::new()))
        } else {
            let n = self.requests_per_case(top.get("requests_per_case"));
            (n, self.concurrency(top.get("concurrency"), n))
        }
    }

    /// `repetitions` and `warmup_per_case`: at least 2 each, or a trace's.
    fn counts(&mut self, top: &Map<String, Value>) -> (Option<usize>, Option<usize>) {
        if load_mode(top) == Some("trace") {
            return self.trace_counts(top);
        }
        (
            self.at_least_two(top, "repetitions"),
            self.at_least_two(top, "warmup_per_case"),
        )
    }

    /// A trace plan's `repetitions` (the trace replayed whole each time: at least 1, 1
    /// when not given) and no `warmup_per_case` (a per-variant warm-up would double the
    /// load and fill the prefix cache before the round: `load.warmup_seconds` instead).
    fn trace_counts(&mut self, top: &Map<String, Value>) -> (Option<usize>, Option<usize>) {
        if top.contains_key("warmup_per_case") {
            self.err(
                "warmup_per_case",
                "is not used with load.mode \"trace\": the trace's first load.warmup_seconds are its warm-up (a warm-up per variant would double the load and fill the prefix cache before the round); remove it",
            );
        }
        let reps = match top.get("repetitions") {
            None => Some(1),
            Some(v) => self.integer(v, "repetitions", 1),
        };
        (reps, Some(0))
    }

    /// What a trace does not use, and where it does not apply yet.
    fn trace_refusals(&mut self, top: &Map<String, Value>, is_campaign: bool) {
        for key in ["concurrency", "requests_per_case"] {
            if top.contains_key(key) {
                self.err(
                    key,
                    "is not used with load.mode \"trace\": the trace's entries set the load (load.speedup its pace), and load.max_in_flight bounds the requests in flight; remove it",
                );
            }
        }
        if is_campaign {
            self.err(
                "load.mode",
                "a trace is not supported in a campaign plan (arms) yet; replay each arm's endpoint with its own trace plan",
            );
        }
    }

    /// A count `key` of at least 2 (`repetitions`, `warmup_per_case`), 2 when not given.
    fn at_least_two(&mut self, top: &Map<String, Value>, key: &str) -> Option<usize> {
        match top.get(key) {
            None => Some(2),
            Some(v) => self.integer(v, key, 2),
        }
    }

    /// `decisions_pointer`: a JSON pointer, [`DEFAULT_DECISIONS_POINTER`] when not given.
    fn decisions_pointer(&mut self, top: &Map<String, Value>) -> Option<Pointer> {
        match top.get("decisions_pointer") {
            None => Pointer::parse(DEFAULT_DECISIONS_POINTER).ok(),
            Some(v) => self.string(v, "decisions_pointer").and_then(|s| {
                Pointer::parse(s)
                    .map_err(|m| self.err("decisions_pointer", format!("'{s}': {m}")))
                    .ok()
            }),
        }
    }

    /// A plain plan's `worker_metrics` (a campaign's arms have their own).
    fn plan_worker_metrics(
        &mut self,
        top: &Map<String, Value>,
        is_campaign: bool,
    ) -> Option<Option<Option<Endpoint>>> {
        if !is_campaign {
            let w = self.worker_metrics(top.get("worker_metrics"), "worker_metrics", false)?;
            return match w {
                Some(Some(u)) if u.contains("{port}") => {
                    self.err(
                        "worker_metrics",
                        "uses {port}, which only a campaign arm the tool starts has: give the worker's own port",
                    );
                    None
                }
                // Checked as an endpoint already.
                Some(Some(u)) => Endpoint::parse(&u).ok().map(|e| Some(Some(e))),
                Some(None) => Some(Some(None)),
                None => Some(None),
            };
        }
        if top.contains_key("worker_metrics") {
            self.err(
                "worker_metrics",
                "a campaign plan scrapes each arm's worker: give it in the arms (an arm the tool starts is scraped at its origin's /metrics by default)",
            );
        }
        Some(None)
    }

    /// A plain plan judges every request by its oracle, or none (a capture plan): a
    /// request without an oracle beside judged ones is a forgotten oracle, not a capture.
    fn judged_or_capture(&mut self, is_campaign: bool) {
        if is_campaign || self.judged == 0 {
            return;
        }
        for path in std::mem::take(&mut self.unjudged) {
            self.err(
                join(&path, "expected_response"),
                "is required: the oracle (expected_response for type-strict JSON, expected_response_text for exact bytes, expected_stream_text or expected_events for an event stream); other requests of this plan have one, and a plain plan judges every request or none (a capture plan records answers without judging them)",
            );
        }
    }

    /// `drift`: `{"numeric_pointers": [...]}`, pointers into JSON answers whose largest
    /// difference from the reference drift reports.
    fn drift(&mut self, v: Option<&Value>) -> Option<Vec<Pointer>> {
        let Some(v) = v else {
            return Some(Vec::new());
        };
        let m = self.object(v, "drift")?;
        self.unknown_fields(m, "drift", &[&["numeric_pointers"]]);
        match m.get("numeric_pointers") {
            None => Some(Vec::new()),
            Some(p) => self.pointers(p, "drift.numeric_pointers"),
        }
    }

    /// `requests_per_case` of a closed loop.
    fn requests_per_case(&mut self, v: Option<&Value>) -> Option<usize> {
        match v {
            None => {
                self.err("requests_per_case", "is required (an integer >= 1)");
                None
            }
            Some(v) => self.integer(v, "requests_per_case", 1).and_then(|n| {
                if n > MAX_REQUESTS_PER_CASE {
                    self.err(
                        "requests_per_case",
                        format!(
                            "{n} is above {MAX_REQUESTS_PER_CASE}: a round's samples are kept in memory for exact nearest-rank percentiles (about 100 bytes each, more for streams); split the load into more repetitions or cases"
                        ),
                    );
                    return None;
                }
                Some(n)
            }),
        }
    }

    /// A trace load's entries and synthetic template, against the plan's cases: inline
    /// entries are read here (each problem with its index); a file's are read by the
    /// caller ([`super::load::Load::attach_trace`]).
    fn resolve_trace(
        &mut self,
        load: &mut super::load::Load,
        top: &Map<String, Value>,
        cases: &[super::plan::Case],
    ) -> Option<()> {
        let t = load.trace.as_mut()?;
        let synthetic = match &t.synthetic {
            None => None,
            Some(v) => {
                let names: Vec<&str> = cases.iter().map(|c| c.name.as_str()).collect();
                let (rules, spec) = self.synthetic(v, &names)?;
                let case = &cases[rules.case as usize];
                let template = case.variants.first().map(|v| &v.body[..]);
                let object = template.and_then(|b| serde_json::from_slice::<Value>(b).ok());
                let judged = case
                    .variants
                    .iter()
                    .any(|v| !matches!(v.oracle, crate::oracle::Oracle::Unjudged));
                if judged {
                    self.err(
                        "load.trace.synthetic.case",
                        format!("case '{}' is the synthetic entries' template: it takes no oracle (each entry's prompt, and so its answer, is its own); capture the answers, then freeze the run", case.name),
                    );
                    return None;
                }
                if case.sessions.is_some()
                    || case.variants.len() != 1
                    || !object.is_some_and(|o| o.is_object())
                {
                    self.err(
                        "load.trace.synthetic.case",
                        format!("case '{}' is the synthetic entries' template: it needs one JSON object `request` (no variants list, no sessions), whose prompt and max_tokens each entry fills", case.name),
                    );
                    return None;
                }
                t.synthetic_rules = Some(rules);
                t.synthetic_spec = Some(std::sync::Arc::new(spec));
                Some(rules)
            }
        };
        if t.source != super::load::TraceSource::Inline {
            return Some(());
        }
        let names = trace_names(cases, synthetic);
        let items = top
            .get("load")
            .and_then(|l| l.get("trace"))
            .and_then(|t| t.get("entries"))
            .and_then(Value::as_array)?;
        match super::trace::Trace::inline(items, &names) {
            Ok(trace) => {
                t.set_entries(trace, cases.len());
                match t.window_problem() {
                    Some(why) => {
                        self.err("load.trace", why);
                        None
                    }
                    None => Some(()),
                }
            }
            Err(faults) => {
                for (i, f) in faults {
                    self.err(format!("load.trace.entries[{i}]"), f.to_string());
                }
                None
            }
        }
    }

    /// What an open loop does not use, and where it does not apply yet.
    fn open_refusals(&mut self, top: &Map<String, Value>, is_campaign: bool) {
        if top.contains_key("concurrency") {
            self.err(
                "concurrency",
                "is not used with load.mode \"open\": the arrival rates (load.rates_per_second) set the load, and load.max_in_flight bounds the requests in flight; remove it",
            );
        }
        if top.contains_key("requests_per_case") {
            self.err(
                "requests_per_case",
                "is replaced with load.mode \"open\" by load.duration_seconds or load.requests (per rate and round); remove it",
            );
        }
        if is_campaign {
            self.err(
                "load.mode",
                "an open loop is not supported in a campaign plan (arms) yet; measure the arms in closed loop, or replay each arm's endpoint with its own open-loop plan",
            );
        }
    }

    /// `connection` (default fresh) and `on_failure` (default stop).
    fn policies(
        &mut self,
        top: &Map<String, Value>,
    ) -> (Option<ConnectionPolicy>, Option<OnFailure>) {
        let connection = match top.get("connection") {
            None => Some(ConnectionPolicy::Fresh),
            Some(v) => {
                match self.string(v, "connection") {
                    Some("fresh") => Some(ConnectionPolicy::Fresh),
                    Some("keep-alive") => Some(ConnectionPolicy::KeepAlive),
                    Some(other) => {
                        self.err(
                        "connection",
                        format!("'{other}' is not a connection policy; use \"fresh\" or \"keep-alive\""),
                    );
                        None
                    }
                    None => None,
                }
            }
        };
        let on_failure = match top.get("on_failure") {
            None => Some(OnFailure::Stop),
            Some(v) => match self.string(v, "on_failure") {
                Some("stop") => Some(OnFailure::Stop),
                Some("continue") => Some(OnFailure::Continue),
                Some(other) => {
                    self.err(
                        "on_failure",
                        format!("'{other}' is not allowed; use \"stop\" or \"continue\""),
                    );
                    None
                }
                None => None,
            },
        };
        (connection, on_failure)
    }

    /// A plain plan's `endpoint` and `health_endpoint` (default `/health` on its origin).
    fn endpoints(&mut self, top: &Map<String, Value>) -> (Option<Endpoint>, Option<Endpoint>) {
        let endpoint = match top.get("endpoint") {
            None => {
                self.err("endpoint", "is required: the URL every case is POSTed to");
                None
            }
            Some(v) => self.endpoint(v, "endpoint"),
        };
        let health_endpoint = match top.get("health_endpoint") {
            None => endpoint.as_ref().map(|e| e.with_path("/health")),
            Some(v) => self.endpoint(v, "health_endpoint"),
        };
        (endpoint, health_endpoint)
    }

    fn concurrency(&mut self, v: Option<&Value>, n: Option<usize>) -> Option<Vec<usize>> {
        let Some(v) = v else {
            self.err("concurrency", "is required: a non-empty list of integers");
            return None;
        };
        let Value::Array(items) = v else {
            self.err(
                "concurrency",
                format!(
                    "must be a non-empty list of integers, found {}",
                    json_kind(v)
                ),
            );
            return None;
        };
        if items.is_empty() {
            self.err("concurrency", "must not be empty");
            return None;
        }
        let mut out = Vec::new();
        let mut seen = HashSet::new();
        let mut ok = true;
        for (i, item) in items.iter().enumerate() {
            let path = format!("concurrency[{i}]");
            match self.integer(item, &path, 1) {
                Some(c) => {
                    if !seen.insert(c) {
                        self.err(&path, format!("{c} appears more than once"));
                        ok = false;
                    }
                    if let Some(n) = n
                        && c > n
                    {
                        self.err(
                            &path,
                            format!(
                                "{c} is above requests_per_case ({n}); a round could never fill it"
                            ),
                        );
                        ok = false;
                    }
                    out.push(c);
                }
                None => ok = false,
            }
        }
        ok.then_some(out)
    }

    fn timeout(&mut self, v: Option<&Value>) -> Option<(f64, Duration)> {
        let Some(v) = v else {
            self.err(
                "timeout_seconds",
                "is required: a finite number of seconds > 0",
            );
            return None;
        };
        let Some(t) = v.as_f64().filter(|_| v.is_number()) else {
            self.err(
                "timeout_seconds",
                format!("must be a number of seconds > 0, found {}", json_kind(v)),
            );
            return None;
        };
        if !t.is_finite() || t <= 0.0 {
            self.err(
                "timeout_seconds",
                format!("must be finite and > 0, found {t}"),
            );
            return None;
        }
        match Duration::try_from_secs_f64(t) {
            Ok(d) if t <= 7.0 * 86_400.0 => Some((t, d)),
            _ => {
                self.err(
                    "timeout_seconds",
                    format!("{t} is too large (at most one week)"),
                );
                None
            }
        }
    }

    fn metadata(&mut self, v: Option<&Value>) -> Option<Map<String, Value>> {
        let Some(v) = v else {
            self.err(
                "metadata",
                format!(
                    "is required: provenance with non-blank {} (write \"N/A: reason\" where one does not apply)",
                    REQUIRED_METADATA.join(", ")
                ),
            );
            return None;
        };
        let m = self.object(v, "metadata")?;
        let mut ok = true;
        for key in REQUIRED_METADATA {
            let path = format!("metadata.{key}");
            match m.get(key) {
                None => {
                    self.err(
                        &path,
                        "is required (write \"N/A: reason\" where it does not apply)",
                    );
                    ok = false;
                }
                Some(val) => {
                    if self.nonblank(val, &path).is_none() {
                        ok = false;
                    }
                }
            }
        }
        ok.then(|| m.clone())
    }

    fn auth(&mut self, v: Option<&Value>) -> Option<Option<String>> {
        let Some(v) = v else { return Some(None) };
        let m = self.object(v, "auth")?;
        self.unknown_fields(m, "auth", &[&["bearer_token_env"]]);
        let Some(env) = m.get("bearer_token_env") else {
            return Some(None);
        };
        let name = self.nonblank(env, "auth.bearer_token_env")?;
        if !super::flags::is_env_name(name) {
            self.err(
                "auth.bearer_token_env",
                format!("'{name}' is not an environment variable name (letters, digits, '_')"),
            );
            return None;
        }
        Some(Some(name.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::shape::Shape;
    use crate::model::Level;
    use crate::oracle::Oracle;

    const META: &str = r#""metadata": {"gpu": "N/A", "gpu_ids": "N/A", "driver": "N/A", "cuda": "N/A",
        "precision": "N/A", "model_revision": "m", "runtime_revision": "r", "cache_policy": "none",
        "cuda_evidence": "N/A", "reservation": "N/A", "host": "h"}"#;

    fn plan(body: &str) -> Result<Plan, PlanError> {
        let text = format!("{{ {body}, {META} }}");
        Plan::from_json_bytes(text.as_bytes())
    }

    fn problems(body: &str) -> Vec<String> {
        match plan(body) {
            Ok(_) => vec![],
            Err(e) => e.problems.iter().map(|p| p.to_string()).collect(),
        }
    }

    const BASE: &str = r#""endpoint": "http://127.0.0.1:8000/v1/x", "concurrency": [1, 2],
        "requests_per_case": 4, "timeout_seconds": 2"#;

    #[test]
    fn minimal_plan_resolves_with_defaults() {
        let p = plan(&format!(
            r#"{BASE}, "cases": [{{"name": "a", "request": {{"z": 1, "a": 2}}, "expected_response": {{"ok": true}}}}]"#
        ))
        .expect("valid");
        assert_eq!(p.repetitions, 2);
        assert_eq!(p.warmup_per_case, 2);
        assert_eq!(p.connection, ConnectionPolicy::Fresh);
        assert_eq!(p.on_failure, OnFailure::Stop);
        assert_eq!(p.health_endpoint.url(), "http://127.0.0.1:8000/health");
        // key order of the request is kept as written in the plan
        assert_eq!(&p.cases[0].variants[0].body[..], br#"{"z":1,"a":2}"#);
        // 1 health + 1 readiness + 2 warmup + (1 + 2*4) + (2 + 2*4)
        assert_eq!(Shape::Plain.planned_requests(&p), 1 + 1 + 2 + 9 + 10);
    }

    const CASE: &str = r#""cases": [{"name": "a", "request": {}, "expected_response": {}}]"#;
    const OPEN: &str = r#""endpoint": "http://h/x", "timeout_seconds": 2"#;

    #[test]
    fn an_open_load_resolves_with_its_defaults_and_its_planned_requests() {
        let p = plan(&format!(
            r#"{OPEN}, {CASE}, "load": {{"mode": "open", "rates_per_second": [5, 2.5], "duration_seconds": 4}},
            "slo": {{"e2e_ms": 250, "ttft_ms": 0.5}}"#
        ))
        .expect("valid");
        assert_eq!(p.load.mode, super::super::load::Mode::Open);
        assert_eq!(p.load.arrival, crate::arrival::Arrival::Poisson);
        assert_eq!(p.load.seed, 0);
        assert_eq!(
            p.load.max_in_flight,
            super::super::load::DEFAULT_MAX_IN_FLIGHT
        );
        assert_eq!(p.levels(), vec![Level::Rate(5.0), Level::Rate(2.5)]);
        assert!(p.concurrency.is_empty());
        let slo = p.slo.expect("slo");
        assert_eq!(
            (slo.e2e_us, slo.ttft_us, slo.tpot_us),
            (Some(250_000), Some(500), None)
        );
        // Planned: health, readiness, 2 warm-ups, then per rate a feasibility second and
        // two rounds, each counted from its seeded schedule.
        let scheduled: u64 = [(5.0, 0), (2.5, 1)]
            .iter()
            .flat_map(|&(r, li)| {
                [None, Some(0), Some(1)].map(|rep| p.load.schedule(r, 0, li, rep).len() as u64)
            })
            .sum();
        assert_eq!(Shape::Plain.planned_requests(&p), 1 + 1 + 2 + scheduled);
        // A closed plan with a load keeps its arrival for --sweep; its hash is unchanged
        // by a closed load.
        let closed = plan(&format!(
            r#"{BASE}, {CASE}, "load": {{"arrival": "constant", "seed": 9}}"#
        ))
        .unwrap();
        let bare = plan(&format!(r#"{BASE}, {CASE}"#)).unwrap();
        assert_eq!(closed.load.arrival, crate::arrival::Arrival::Constant);
        assert_eq!(closed.workload, bare.workload);
        assert_eq!(closed.load.extent, crate::arrival::Extent::Requests(4));
    }

    #[test]
    fn a_trace_load_resolves_its_inline_entries_and_says_every_problem() {
        let p = plan(&format!(
            r#"{OPEN}, {CASE}, "load": {{"mode": "trace", "speedup": 2, "warmup_seconds": 0.1,
              "start_offset_seconds": 1, "end_offset_seconds": 4,
              "trace": {{"entries": [{{"offset_us": 0, "case": "a"}}, {{"offset_us": 1000000, "case": "a"}},
                {{"offset_us": 1200000, "case": "a", "session": "x"}}, {{"offset_us": 3000000, "case": "a"}},
                {{"offset_us": 4000000, "case": "a"}}]}}}}"#
        ))
        .expect("valid");
        assert_eq!(p.load.mode, Mode::Trace);
        assert_eq!((p.repetitions, p.warmup_per_case), (1, 0));
        let t = p.load.trace.as_ref().unwrap();
        // The window [1 s, 4 s): entries 1 to 3, the first 0.1 s of it as warm-up; offsets
        // from the window's start over the speed-up.
        let picks: Vec<(u64, u32, bool)> = t
            .picks(None)
            .iter()
            .map(|p| (p.offset_us, p.entry, p.warmup))
            .collect();
        assert_eq!(
            picks,
            vec![(0, 1, true), (100_000, 2, false), (1_000_000, 3, false)]
        );
        // The level: the measured entries' recorded rate at the speed-up.
        assert_eq!(t.rate(), 1.111);
        assert_eq!(t.planned(0, None), 2);
        // 1 health + 1 readiness + the window (warm-up included) once.
        assert_eq!(Shape::Plain.planned_requests(&p), 2 + 3);

        let errs = problems(&format!(
            r#"{BASE}, "warmup_per_case": 2, {CASE}, "load": {{"mode": "trace", "arrival": "poisson",
              "speedup": 0, "start_offset_seconds": 5, "end_offset_seconds": 5,
              "trace": {{"entries": [{{"offset_us": 3, "case": "a"}}, {{"offset_us": 2, "case": "b"}}]}}}}"#
        ));
        assert_eq!(
            errs,
            vec![
                "load.arrival: does not go with load.mode \"trace\": a trace's arrivals are its entries",
                "load.speedup: must be a finite number > 0 and <= 1000000, found 0",
                "load.end_offset_seconds: 5 is not after load.start_offset_seconds (5): the window would be empty",
                "concurrency: is not used with load.mode \"trace\": the trace's entries set the load (load.speedup its pace), and load.max_in_flight bounds the requests in flight; remove it",
                "requests_per_case: is not used with load.mode \"trace\": the trace's entries set the load (load.speedup its pace), and load.max_in_flight bounds the requests in flight; remove it",
                "warmup_per_case: is not used with load.mode \"trace\": the trace's first load.warmup_seconds are its warm-up (a warm-up per variant would double the load and fill the prefix cache before the round); remove it",
            ]
        );
        let errs = problems(&format!(
            r#"{OPEN}, {CASE}, "load": {{"mode": "trace",
              "trace": {{"entries": [{{"offset_us": 3, "case": "a"}}, {{"offset_us": 2, "case": "b"}}, {{"offset_us": 4, "case": "a", "variant": "v"}}]}}}}"#
        ));
        assert_eq!(
            errs,
            vec![
                "load.trace.entries[1]: offset_us 2 is before the previous entry's 3: a trace is in offset order (sort it)",
                "load.trace.entries[2]: case 'a' has no variants list: leave \"variant\" out",
            ]
        );
        let errs = problems(&format!(
            r#"{OPEN}, {CASE}, "duration_seconds": 1, "load": {{"mode": "open", "rates_per_second": [1], "duration_seconds": 1, "speedup": 2,
              "trace": {{"file": "../t.jsonl", "sha256": "AB"}}}}"#
        ));
        assert!(
            errs.contains(&"load.speedup: goes with load.mode \"trace\"".to_string()),
            "{errs:?}"
        );
        // A window with nothing to measure: past the last entry, or all warm-up.
        for load in [
            r#""start_offset_seconds": 9"#,
            r#""end_offset_seconds": 1.5, "warmup_seconds": 2"#,
        ] {
            let errs = problems(&format!(
                r#"{OPEN}, {CASE}, "load": {{"mode": "trace", {load},
                  "trace": {{"entries": [{{"offset_us": 0, "case": "a"}}, {{"offset_us": 1000000, "case": "a"}}]}}}}"#
            ));
            assert_eq!(errs.len(), 1, "{errs:?}");
            assert!(
                errs[0].starts_with("load.trace: the window [")
                    && errs[0].contains("holds no entry past load.warmup_seconds"),
                "{errs:?}"
            );
        }
        // A round longer than 31 days (the window over the speed-up).
        let errs = problems(&format!(
            r#"{OPEN}, {CASE}, "load": {{"mode": "trace", "speedup": 0.5,
              "trace": {{"entries": [{{"offset_us": 0, "case": "a"}}, {{"offset_us": 1400000000000, "case": "a"}}]}}}}"#
        ));
        assert!(
            errs[0].contains(
                "would take 2800000 s a round at speedup 0.5, more than 2678400 s (31 days)"
            ),
            "{errs:?}"
        );
        // A synthetic template judged by an oracle: every entry's answer is its own.
        let errs = problems(&format!(
            r#"{OPEN}, {CASE}, "load": {{"mode": "trace", "trace": {{"entries": [
              {{"offset_us": 0, "input_tokens": 4, "output_tokens": 1, "blocks": [1]}}],
              "synthetic": {{"case": "a", "block_tokens": 4, "special_tokens": 1, "seed": 0, "words": ["x"]}}}}}}"#
        ));
        assert!(errs[0].starts_with("load.trace.synthetic.case: case 'a' is the synthetic entries' template: it takes no oracle"), "{errs:?}");
        // A trace file must be a .jsonl beside the plan: never a name the run writes.
        let errs = problems(&format!(
            r#"{OPEN}, {CASE}, "load": {{"mode": "trace", "trace": {{"file": "plan.json", "sha256": "{}"}}}}"#,
            "0".repeat(64)
        ));
        assert!(
            errs[0].starts_with(
                "load.trace.file: 'plan.json' must name a .jsonl file beside the plan"
            ),
            "{errs:?}"
        );
        let errs = problems(&format!(
            r#"{OPEN}, {CASE}, "load": {{"mode": "trace", "trace": {{"file": "/etc/t.jsonl", "sha256": "AB"}}}}"#
        ));
        assert_eq!(
            errs,
            vec![
                "load.trace.file: '/etc/t.jsonl' must name a .jsonl file beside the plan (a file name, no folder): a run keeps its copy beside its plan.json",
                "load.trace.sha256: 'AB' is not a SHA-256 in lowercase hex (64 characters)",
            ]
        );
    }

    #[test]
    fn open_load_rules() {
        let errs = problems(&format!(
            r#"{BASE}, {CASE}, "load": {{"mode": "open", "rates_per_second": [5, 5, 0, "x"], "duration_seconds": 1, "requests": 3,
              "arrival": {{"gamma": {{"burstiness": -1}}}}, "max_in_flight": 0}}"#
        ));
        assert_eq!(
            errs,
            vec![
                "load.arrival.gamma.burstiness: must be a finite number > 0 and <= 1000000, found -1",
                "load.max_in_flight: must be an integer >= 1, found 0",
                "load.rates_per_second[1]: 5 appears more than once",
                "load.rates_per_second[2]: must be a finite number > 0 and <= 1000000, found 0",
                "load.rates_per_second[3]: must be a number > 0, found a string",
                "load.requests: give either load.duration_seconds or load.requests, not both",
                "concurrency: is not used with load.mode \"open\": the arrival rates (load.rates_per_second) set the load, and load.max_in_flight bounds the requests in flight; remove it",
                "requests_per_case: is replaced with load.mode \"open\" by load.duration_seconds or load.requests (per rate and round); remove it",
            ]
        );
        let errs = problems(&format!(
            r#"{OPEN}, {CASE}, "load": {{"mode": "open", "arrival": "bursty"}}"#
        ));
        assert_eq!(
            errs,
            vec![
                "load.arrival: 'bursty' is not an arrival process; use \"constant\", \"poisson\" or {\"gamma\": {\"burstiness\": k}}",
                "load.rates_per_second: is required with load.mode \"open\": a non-empty list of request rates (requests per second)",
                "load.duration_seconds: is required with load.mode \"open\" (or load.requests): how long each round's schedule runs",
            ]
        );
        let errs = problems(&format!(
            r#"{BASE}, {CASE}, "load": {{"rates_per_second": [1], "mode": "closed"}}, "slo": {{}}"#
        ));
        assert_eq!(
            errs,
            vec![
                "load.rates_per_second: goes with load.mode \"open\"; a closed loop is sized by concurrency and requests_per_case",
                "slo: is empty: give at least one of ttft_ms, tpot_ms, e2e_ms",
            ]
        );
        let errs = problems(&format!(
            r#"{OPEN}, {CASE}, "load": {{"mode": "open", "rates_per_second": [100000], "duration_seconds": 86400}}"#
        ));
        assert!(
            errs[0].starts_with(
                "load.duration_seconds: at 100000/s a round would hold about 8640000000 requests"
            ),
            "{errs:?}"
        );
        // The floors: a rate and a gamma shape too small to mean anything.
        let errs = problems(&format!(
            r#"{OPEN}, {CASE}, "load": {{"mode": "open", "rates_per_second": [0.0005], "duration_seconds": 1,
              "arrival": {{"gamma": {{"burstiness": 0.001}}}}}}"#
        ));
        assert_eq!(
            errs,
            vec![
                "load.arrival.gamma.burstiness: 0.001 is below 0.01: almost every gap would be 0 and the rest enormous (the gaps' CV is 1/sqrt(k))",
                "load.rates_per_second[0]: 0.0005 is below 0.001: the lowest rate, in requests per second (one request every ~17 minutes)",
            ]
        );
    }

    #[test]
    fn duplicate_case_and_variant_names() {
        let errs = problems(&format!(
            r#"{BASE}, "cases": [
              {{"name": "a", "request": {{}}, "expected_response": {{}}}},
              {{"name": "a", "variants": [
                 {{"name": "v", "request": {{}}, "expected_response": {{}}}},
                 {{"name": "v", "request": {{}}, "expected_response": {{}}}}]}}]"#
        ));
        assert_eq!(
            errs,
            vec![
                "cases[1].variants[1].name: variant name 'v' is used more than once in this case",
                "cases[1].name: case name 'a' is used more than once",
            ]
        );
    }

    #[test]
    fn concurrency_rules() {
        let errs = problems(
            r#""endpoint": "http://h/x", "concurrency": [1, 1, 5, 0, 2.0], "requests_per_case": 4,
            "timeout_seconds": 1, "cases": [{"name": "a", "request": {}, "expected_response": {}}]"#,
        );
        assert_eq!(
            errs,
            vec![
                "concurrency[1]: 1 appears more than once",
                "concurrency[2]: 5 is above requests_per_case (4); a round could never fill it",
                "concurrency[3]: must be an integer >= 1, found 0",
                "concurrency[4]: must be written as a JSON integer (2, not 2.0)",
            ]
        );
    }

    #[test]
    fn requests_per_case_is_bounded_by_what_nearest_rank_keeps_in_memory() {
        let errs = problems(
            r#""endpoint": "http://h/x", "concurrency": [1000000000], "requests_per_case": 1000000000,
            "timeout_seconds": 1, "cases": [{"name": "a", "request": {}, "expected_response": {}}]"#,
        );
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(
            errs[0].starts_with("requests_per_case: 1000000000 is above 10000000: a round's samples are kept in memory"),
            "{errs:?}"
        );
        assert!(
            plan(
                r#""endpoint": "http://h/x", "concurrency": [1], "requests_per_case": 10000000,
            "timeout_seconds": 1, "cases": [{"name": "a", "request": {}, "expected_response": {}}]"#
            )
            .is_ok()
        );
    }

    #[test]
    fn size_errors_say_the_bound_and_print_numbers_short() {
        let errs = problems(
            r#""endpoint": "http://h/x", "concurrency": [1], "requests_per_case": 1e30, "repetitions": 123456789012345678901234567890,
            "timeout_seconds": 1, "cases": [{"name": "a", "request": {}, "expected_response": {}}]"#,
        );
        assert_eq!(
            errs,
            vec![
                "requests_per_case: must be an integer <= 1099511627776, found 1e+30",
                "repetitions: must be an integer <= 1099511627776, found 1.2345678901234568e+29",
            ]
        );
        let errs = problems(
            r#""endpoint": "http://h/x", "concurrency": [1], "requests_per_case": 1e7, "warmup_per_case": -1e30,
            "timeout_seconds": 1, "cases": [{"name": "a", "request": {}, "expected_response": {}}]"#,
        );
        assert_eq!(
            errs,
            vec![
                "requests_per_case: must be written as a JSON integer (10000000, not 10000000.0)",
                "warmup_per_case: must be an integer >= 2, found -1e+30",
            ]
        );
        let bom = [b"\xEF\xBB\xBF".as_slice(), b"{}"].concat();
        let e = Plan::from_json_bytes(&bom).unwrap_err();
        assert!(
            e.problems[0]
                .message
                .starts_with("plan starts with a UTF-8 byte-order mark (BOM)"),
            "{e}"
        );
    }

    #[test]
    fn duplicate_keys_are_refused_with_their_paths() {
        let text = format!(
            r#"{{ {BASE}, "cases": [{{"name": "a", "request": {{"x": 1, "x": 2}}, "name": "b",
              "expected_response": {{}}}}], "concurrency": [1], {META} }}"#
        );
        let e = Plan::from_json_bytes(text.as_bytes()).unwrap_err();
        let got: Vec<String> = e.problems.iter().map(|p| p.to_string()).collect();
        assert_eq!(
            got,
            vec![
                "cases[0].request.x: is given twice in the same object (members 1 and 2); a JSON reader keeps one of them silently, so a frozen plan may not repeat a key",
                "cases[0].name: is given twice in the same object (members 1 and 3); a JSON reader keeps one of them silently, so a frozen plan may not repeat a key",
                "concurrency: is given twice in the same object (members 2 and 6); a JSON reader keeps one of them silently, so a frozen plan may not repeat a key",
            ]
        );
        // Floats still round correctly, and order is kept.
        let p = plan(&format!(
            r#"{BASE}, "cases": [{{"name": "a", "request": {{"z": 0.1000000000000000055511151231257827, "a": 1}}, "expected_response": {{}}}}]"#
        ))
        .unwrap();
        assert_eq!(&p.cases[0].variants[0].body[..], br#"{"z":0.1,"a":1}"#);
    }

    #[test]
    fn non_finite_and_bad_timeouts() {
        // serde_json refuses non-finite literals: the error names JSON, line and column.
        let e = Plan::from_json_bytes(br#"{"timeout_seconds": NaN}"#).unwrap_err();
        assert!(
            e.problems[0].message.starts_with("plan is not valid JSON"),
            "{e}"
        );
        let e = Plan::from_json_bytes(br#"{"timeout_seconds": 1e999}"#).unwrap_err();
        assert!(
            e.problems[0].message.starts_with("plan is not valid JSON"),
            "{e}"
        );
        let errs = problems(
            r#""endpoint": "http://h/x", "concurrency": [1], "requests_per_case": 1,
            "timeout_seconds": 0, "cases": [{"name": "a", "request": {}, "expected_response": {}}]"#,
        );
        assert_eq!(
            errs,
            vec!["timeout_seconds: must be finite and > 0, found 0"]
        );
    }

    #[test]
    fn blank_and_missing_metadata() {
        let text = r#"{"endpoint": "http://h/x", "concurrency": [1], "requests_per_case": 1,
            "timeout_seconds": 1, "cases": [{"name": "a", "request": {}, "expected_response": {}}],
            "metadata": {"gpu": "  ", "gpu_ids": "N/A", "driver": "N/A", "cuda": "N/A",
            "precision": "N/A", "model_revision": "m", "runtime_revision": "r", "cache_policy": "none",
            "cuda_evidence": "N/A", "reservation": "N/A"}}"#;
        let e = Plan::from_json_bytes(text.as_bytes()).unwrap_err();
        let msgs: Vec<String> = e.problems.iter().map(|p| p.to_string()).collect();
        assert_eq!(
            msgs,
            vec![
                "metadata.gpu: must not be blank",
                "metadata.host: is required (write \"N/A: reason\" where it does not apply)",
            ]
        );
    }

    #[test]
    fn bad_pointers() {
        let errs = problems(&format!(
            r#"{BASE}, "cases": [{{"name": "a", "request": {{}},
               "expected_response": {{"id": "x", "list": [1, {{"k": 2}}], "obj": {{"a": 1}}}},
               "ignore_paths": ["", "id", "/id", "/id", "/~2", "/list/01", "/obj", "/missing", "/list/1/k"]}}]"#
        ));
        assert_eq!(
            errs,
            vec![
                "cases[0].ignore_paths[0]: '': the root pointer would ignore the whole response; use an exact-bytes oracle or remove the case",
                "cases[0].ignore_paths[1]: 'id': a JSON pointer starts with '/' (RFC 6901)",
                "cases[0].ignore_paths[3]: '/id' appears more than once",
                "cases[0].ignore_paths[4]: '/~2': '~' must be followed by 0 or 1 (RFC 6901)",
            ]
        );
        // Pointers that parse are then resolved against the oracle.
        let errs = problems(&format!(
            r#"{BASE}, "cases": [{{"name": "a", "request": {{}},
               "expected_response": {{"id": "x", "list": [1, {{"k": 2}}], "obj": {{"a": 1}}}},
               "ignore_paths": ["/list/01", "/obj", "/missing", "/list/1/k"]}}]"#
        ));
        assert_eq!(
            errs,
            vec![
                "cases[0].expected_response: ignore path '/list/01': '01' is not a canonical array index",
                "cases[0].expected_response: ignore path '/obj' must end at a primitive leaf, but it reaches an object",
                "cases[0].expected_response: ignore path '/missing' does not exist in the oracle",
            ]
        );
    }

    #[test]
    fn ignore_paths_with_exact_bytes_oracle_is_rejected() {
        let errs = problems(&format!(
            r#"{BASE}, "cases": [{{"name": "a", "request": {{}}, "expected_response_text": "ok",
                "ignore_paths": ["/id"]}}]"#
        ));
        assert_eq!(
            errs,
            vec![
                "cases[0].ignore_paths: ignore_paths only applies to JSON oracles (expected_response, expected_events, expected_usage); an exact-bytes oracle compares every byte"
            ]
        );
    }

    #[test]
    fn endpoint_rules() {
        for (url, msg) in [
            ("ftp://h/x", "scheme 'ftp' is not supported"),
            ("http://u:p@h/x", "must not contain credentials"),
            ("http://h/x#frag", "must not contain a fragment"),
            ("/relative", "must be an absolute"),
            ("http://127.0.0.1:abc/v1", "has an invalid port 'abc'"),
            ("http://127.0.0.1:99999/v1", "has an invalid port '99999'"),
            ("http://127.0.0.1:65536/v1", "has an invalid port '65536'"),
            ("http://127.0.0.1:70000/v1", "has an invalid port '70000'"),
            ("http://127.0.0.1:/v1", "has an invalid port ''"),
            ("http://127.0.0.1:0/v1", "has an invalid port '0'"),
            ("http://[::1]:x/v1", "has an invalid port 'x'"),
            (
                "http://h/v1?api_key=SECRET",
                "'http://h/v1?api_key=<redacted>' carries a secret query parameter",
            ),
            // Names as a server decodes them, and a value already redacted (a plan never
            // holds one: a frozen plan is checked by this validation).
            (
                "http://h/v1?%61pi%5Fkey=SECRET",
                "'http://h/v1?%61pi%5Fkey=<redacted>' carries a secret query parameter",
            ),
            (
                "http://h/v1?x=1&Token=<redacted>",
                "'http://h/v1?x=1&Token=<redacted>' carries a secret query parameter",
            ),
        ] {
            let errs = problems(&format!(
                r#""endpoint": "{url}", "concurrency": [1], "requests_per_case": 1, "timeout_seconds": 1,
                "cases": [{{"name": "a", "request": {{}}, "expected_response": {{}}}}]"#
            ));
            assert_eq!(errs.len(), 1, "{url}: {errs:?}");
            assert!(
                errs[0].starts_with("endpoint: ") && errs[0].contains(msg),
                "{url}: {errs:?}"
            );
        }
        let e = Endpoint::parse("https://[::1]:8443/v1?x=1").unwrap();
        assert_eq!(
            (e.host.as_str(), e.port, e.authority.as_str()),
            ("::1", 8443, "[::1]:8443")
        );
        assert_eq!(e.path_and_query, "/v1?x=1");
        for (url, port) in [
            ("http://h/x", 80),
            ("https://h", 443),
            ("http://h:65535/", 65535),
            ("http://[::1]/", 80),
        ] {
            assert_eq!(Endpoint::parse(url).unwrap().port, port, "{url}");
        }
    }

    #[test]
    fn secrets_and_engine_headers_are_refused() {
        let errs = problems(&format!(
            r#"{BASE}, "cases": [{{"name": "a", "request": {{}}, "expected_response": {{}},
               "headers": {{"Authorization": "Bearer x", "Content-Length": "3", "X-Ok": "yes"}}}}]"#
        ));
        assert_eq!(errs.len(), 2, "{errs:?}");
        assert!(errs[0].starts_with("cases[0].headers.Authorization: carries a secret"));
        assert!(errs[1].starts_with("cases[0].headers.Content-Length: is set by the engine"));
        for name in ["X-Goog-Api-Key", "x-auth-token"] {
            let errs = problems(&format!(
                r#"{BASE}, "cases": [{{"name": "a", "request": {{}}, "expected_response": {{}},
                   "headers": {{"{name}": "k"}}}}]"#
            ));
            assert_eq!(errs.len(), 1, "{errs:?}");
            assert!(
                errs[0].starts_with(&format!("cases[0].headers.{name}: carries a secret")),
                "{errs:?}"
            );
        }
        let errs = problems(&format!(
            r#"{BASE}, "cases": [{{"name": "a", "request": {{}}, "expected_response": {{}},
               "path": "/v1/x?api%5Fkey=S"}}]"#
        ));
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(
            errs[0].starts_with(
                "cases[0].path: '/v1/x?api%5Fkey=<redacted>' carries a secret query parameter"
            ),
            "{errs:?}"
        );
    }

    #[test]
    fn unknown_fields_and_types() {
        let errs = problems(&format!(
            r#"{BASE}, "repetition": 3, "cases": [{{"name": 5, "request": {{}}, "expected_response": {{}}, "oracle": 1}}]"#
        ));
        assert_eq!(errs.len(), 3, "{errs:?}");
        assert!(errs[0].starts_with("repetition: unknown field"));
        assert!(errs[1].starts_with("cases[0].oracle: unknown field"));
        assert_eq!(errs[2], "cases[0].name: must be a string, found an integer");
    }

    #[test]
    fn variants_with_case_level_request_are_refused() {
        let errs = problems(&format!(
            r#"{BASE}, "cases": [{{"name": "a", "request": {{}}, "variants": [
                {{"name": "v", "request": {{}}, "expected_response": {{}}}}]}}]"#
        ));
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(errs[0].starts_with("cases[0].request: a case with variants"));
    }

    #[test]
    fn deeply_nested_plan_is_an_error_not_a_crash() {
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        let e = Plan::from_json_bytes(deep.as_bytes()).unwrap_err();
        assert!(e.problems[0].message.contains("recursion limit"), "{e}");
    }

    #[test]
    fn streaming_requests_need_streaming_oracles() {
        let errs = problems(&format!(
            r#"{BASE}, "cases": [{{"name": "a", "request": {{"stream": true}}, "expected_response": {{}}}}]"#
        ));
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(
            errs[0].starts_with("cases[0].expected_response: the request asks for a stream"),
            "{errs:?}"
        );
        assert!(errs[0].contains("expected_stream_text") && errs[0].contains("expected_events"));
        let ok = plan(&format!(
            r#"{BASE}, "cases": [{{"name": "a", "request": {{"stream": true}}, "expected_stream_text": "hi",
                "expected_usage": {{"completion_tokens": 2, "prompt_tokens": 1}}}},
                {{"name": "b", "request": {{"stream": true}}, "ignore_paths": ["/id"],
                "expected_events": [{{"id": "x", "choices": []}}, "[DONE]"]}}]"#
        ));
        assert!(ok.is_ok(), "{:?}", ok.err());
    }

    #[test]
    fn streaming_oracle_combinations() {
        let errs = problems(&format!(
            r#"{BASE}, "cases": [
              {{"name": "a", "request": {{}}, "expected_stream_text": "x", "expected_events": ["[DONE]"]}},
              {{"name": "b", "request": {{}}, "expected_response": {{}}, "expected_usage": {{}}}},
              {{"name": "c", "request": {{}}, "expected_stream_text": "x", "ignore_paths": ["/id"]}},
              {{"name": "d", "request": {{}}, "expected_events": []}}]"#
        ));
        assert_eq!(errs.len(), 4, "{errs:?}");
        assert!(
            errs[0].starts_with("cases[0].expected_events: a request has exactly one oracle"),
            "{}",
            errs[0]
        );
        assert!(
            errs[1].starts_with("cases[1].expected_usage: goes with a streaming oracle"),
            "{}",
            errs[1]
        );
        assert!(
            errs[2].starts_with(
                "cases[2].ignore_paths: ignore path '/id' does not end at a primitive leaf"
            ),
            "{}",
            errs[2]
        );
        assert!(
            errs[3].starts_with("cases[3].expected_events: must be a non-empty list"),
            "{}",
            errs[3]
        );
    }

    /// The one JSON oracle of a plan's first case.
    fn first_oracle(p: &Plan) -> &Oracle {
        &p.cases[0].variants[0].oracle
    }

    #[test]
    fn top_level_ignore_paths_exclude_exactly_the_seed_leaves() {
        // The seed's own example: escaped tokens and array elements.
        let p = plan(&format!(
            r#"{BASE}, "ignore_paths": ["/a~1b/~0timer", "/items/0/timer", "/items/1/timer"],
            "cases": [{{"name": "a", "request": {{}}, "expected_response":
              {{"a/b": {{"~timer": 1.5, "other": 1}}, "items": [{{"timer": 1, "v": "x"}}, {{"timer": 2, "v": "y"}}], "timer": 3}}}}]"#
        ))
        .expect("valid");
        let o = first_oracle(&p);
        let base = r#"{"a/b": {"~timer": 9.25, "other": 1}, "items": [{"timer": 7, "v": "x"}, {"timer": 8, "v": "y"}], "timer": 3}"#;
        assert_eq!(o.check(base.as_bytes()), Ok(()));
        for (body, at) in [
            (
                base.replace(r#""other": 1"#, r#""other": 2"#),
                "/a~1b/other",
            ),
            (base.replace(r#""v": "x""#, r#""v": "z""#), "/items/0/v"),
            (base.replace(r#""timer": 3"#, r#""timer": 4"#), "/timer"),
        ] {
            let m = o.check(body.as_bytes()).unwrap_err();
            assert_eq!(m.pointer.as_deref(), Some(at), "{body}");
        }
    }

    #[test]
    fn an_excluded_native_timer_still_fails_everything_else() {
        let p = plan(&format!(
            r#"{BASE}, "ignore_paths": ["/metadata/inference_seconds"],
            "cases": [{{"name": "a", "request": {{}}, "expected_response":
              {{"answers": {{"a": {{"choice": "yes"}}}}, "metadata": {{"inference_seconds": 0.0}}}}}}]"#
        ))
        .expect("valid");
        let o = first_oracle(&p);
        let ok =
            r#"{"answers": {"a": {"choice": "yes"}}, "metadata": {"inference_seconds": 0.0123}}"#;
        assert_eq!(o.check(ok.as_bytes()), Ok(()));
        let cases = [
            (
                "a changed answer",
                r#"{"answers": {"a": {"choice": "no"}}, "metadata": {"inference_seconds": 0.5}}"#,
                "/answers/a/choice",
            ),
            (
                "a missing field",
                r#"{"answers": {"a": {"choice": "yes"}}, "metadata": {}}"#,
                "/metadata/inference_seconds",
            ),
            (
                "a type change",
                r#"{"answers": {"a": {"choice": "yes"}}, "metadata": {"inference_seconds": "0.5"}}"#,
                "/metadata/inference_seconds",
            ),
            (
                "an extra member",
                r#"{"answers": {"a": {"choice": "yes"}}, "metadata": {"inference_seconds": 0.5, "gpu": 1}}"#,
                "/metadata/gpu",
            ),
            (
                "a non-finite number",
                r#"{"answers": {"a": {"choice": "yes"}}, "metadata": {"inference_seconds": 1e309}}"#,
                "",
            ),
        ];
        for (what, body, at) in cases {
            let m = o.check(body.as_bytes()).expect_err(what);
            assert_eq!(m.pointer.as_deref(), Some(at), "{what}: {m}");
        }
    }

    #[test]
    fn top_level_ignore_paths_follow_the_pointer_rules() {
        // A case's list adds to the top-level one.
        let p = plan(&format!(
            r#"{BASE}, "ignore_paths": ["/t"], "cases": [
              {{"name": "a", "ignore_paths": ["/id"], "request": {{}}, "expected_response": {{"t": 1, "id": "x", "v": 1}}}},
              {{"name": "s", "request": {{"stream": true}}, "expected_stream_text": "x"}},
              {{"name": "e", "request": {{"stream": true}}, "expected_events": [{{"id": 1}}, "[DONE]"]}}]"#
        ))
        .expect("streaming oracles need not hold a top-level pointer");
        assert_eq!(
            first_oracle(&p).check(br#"{"t": 2, "id": "y", "v": 1}"#),
            Ok(())
        );
        // Not a leaf, or not in one case's oracle, or not canonical: each named with its case.
        let errs = problems(&format!(
            r#"{BASE}, "ignore_paths": ["/t", "/t", "/list/01"], "cases": [
              {{"name": "a", "request": {{}}, "expected_response": {{"t": 1, "list": [1, 2]}}}},
              {{"name": "b", "request": {{}}, "expected_response": {{"t": {{"x": 1}}}}}}]"#
        ));
        assert_eq!(
            errs,
            vec!["ignore_paths[1]: '/t' appears more than once"],
            "a duplicate is refused before any oracle is looked at"
        );
        let errs = problems(&format!(
            r#"{BASE}, "ignore_paths": ["/t", "/list/01"], "cases": [
              {{"name": "a", "request": {{}}, "expected_response": {{"t": 1, "list": [1, 2]}}}},
              {{"name": "b", "request": {{}}, "expected_response": {{"t": {{"x": 1}}}}}}]"#
        ));
        assert_eq!(
            errs,
            vec![
                "ignore_paths: ignore path '/list/01': '01' is not a canonical array index of case 'a' (cases[0]); a top-level pointer must end at a primitive leaf of every JSON oracle (expected_response)",
                "ignore_paths: ignore path '/t' must end at a primitive leaf, but it reaches an object of case 'b' (cases[1]); a top-level pointer must end at a primitive leaf of every JSON oracle (expected_response)",
                "ignore_paths: ignore path '/list/01' does not exist in the oracle of case 'b' (cases[1]); a top-level pointer must end at a primitive leaf of every JSON oracle (expected_response)",
            ]
        );
        // Any exact-bytes oracle refuses the top-level list, naming the case.
        let errs = problems(&format!(
            r#"{BASE}, "ignore_paths": ["/t"], "cases": [
              {{"name": "a", "request": {{}}, "expected_response": {{"t": 1}}}},
              {{"name": "raw", "variants": [{{"name": "v", "request": {{}}, "expected_response_text": "ok"}}]}}]"#
        ));
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(
            errs[0].starts_with(
                "ignore_paths: the top-level ignore_paths applies to every case's JSON oracle, but case 'raw' (cases[1].variants[0]) has an exact-bytes oracle"
            ),
            "{}",
            errs[0]
        );
    }

    #[test]
    fn decisions_pointer_and_require_done() {
        let p = plan(&format!(
            r#"{BASE}, "cases": [{{"name": "a", "request": {{}}, "expected_response": {{}}}}]"#
        ))
        .unwrap();
        assert_eq!(p.decisions_pointer.as_str(), "/answers");
        let p = plan(&format!(
            r#"{BASE}, "decisions_pointer": "/out/picks", "cases": [{{"name": "a", "request": {{}}, "expected_response": {{}}}}]"#
        ))
        .unwrap();
        assert_eq!(p.decisions_pointer.as_str(), "/out/picks");
        let errs = problems(&format!(
            r#"{BASE}, "decisions_pointer": "answers", "cases": [
              {{"name": "a", "request": {{}}, "expected_response": {{}}, "require_done": true}},
              {{"name": "b", "request": {{}}, "expected_stream_text": "x", "require_done": "yes"}},
              {{"name": "c", "request": {{}}, "expected_stream_text": "x", "require_done": true}}]"#
        ));
        assert_eq!(
            errs,
            vec![
                "decisions_pointer: 'answers': a JSON pointer starts with '/' (RFC 6901)",
                "cases[0].require_done: goes with a streaming oracle (expected_stream_text or expected_events): it makes a stream without data: [DONE] a correctness failure",
                "cases[1].require_done: must be true or false, found a string",
            ]
        );
    }
}
