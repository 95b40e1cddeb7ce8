//! Campaign plans: `arms` (one endpoint serving one recipe each), their lanes and the one
//! reference, the evidence class and the order arms run in. Validated with the rest of
//! the plan (same [`Validator`], same rule: every problem at once, each with its path);
//! nothing here starts a process or opens a socket. `{port}` (a free loopback port the
//! tool chooses) and `{self}` (the running binary) are kept as written and substituted by
//! the driver that starts the arm.

use std::time::Duration;

use serde_json::{Map, Value};

use super::json::{Validator, join};
use crate::model::Endpoint;

/// An arm's lane (written as [`Lane::as_str`] says).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Lane {
    /// Must answer like the reference.
    Quality,
    /// May answer differently: its drift is advisory, its answers are never `correctness`
    /// failures.
    PerformanceFit,
}

impl Lane {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Lane::Quality => "quality",
            Lane::PerformanceFit => "performance-fit",
        }
    }
}

/// What kind of evidence a campaign's numbers are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EvidenceClass {
    /// Mocks and test servers.
    Synthetic,
    /// Real models.
    Measured,
}

impl EvidenceClass {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            EvidenceClass::Synthetic => "synthetic",
            EvidenceClass::Measured => "measured",
        }
    }
}

/// The order arms run in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Schedule {
    /// One arm at a time, never overlapping; repetition r runs the arms in rotation r.
    Interleaved,
    /// Each arm: start, all its phases, stop; then the next.
    Sequential,
}

impl Schedule {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Schedule::Interleaved => "interleaved",
            Schedule::Sequential => "sequential",
        }
    }
}

/// Under the interleaved schedule, the index of the arm that runs `k`-th in repetition
/// `rep` of `n` arms: rotation `rep` (A B C, then B C A, then C A B). The live run and
/// `summarize` order rounds by it.
pub(crate) fn interleaved_arm(n: usize, rep: usize, k: usize) -> usize {
    (k + rep) % n
}

/// The recipe an arm serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Recipe {
    pub(crate) runtime: String,
    pub(crate) weight_format: String,
    pub(crate) weight_quantization: String,
    pub(crate) device: String,
}

/// How the tool starts an arm's server.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Start {
    /// argv, `{port}` and `{self}` not yet substituted.
    pub(crate) command: Vec<String>,
    /// From launch to the first 200 from the health endpoint, at most.
    pub(crate) health_timeout: Duration,
    /// SIGTERM, then SIGKILL after this.
    pub(crate) stop_grace: Duration,
    /// Set for the server over the environment it inherits (`{port}` substituted).
    pub(crate) env: Vec<(String, String)>,
    /// The server's working directory (default: matrix-proxy's).
    pub(crate) cwd: Option<String>,
    /// Start, stop, then start again before measuring: `load_ms` then compares with a warm
    /// page cache whatever the arm's place in the schedule.
    pub(crate) warm_start: bool,
}

/// One arm of a campaign.
#[derive(Debug, Clone)]
pub(crate) struct Arm {
    pub(crate) name: String,
    pub(crate) lane: Lane,
    pub(crate) reference: bool,
    /// As written; `{port}` substituted when the arm starts.
    pub(crate) endpoint: String,
    /// As written, or `None` for `/health` on the endpoint's origin.
    pub(crate) health_endpoint: Option<String>,
    pub(crate) recipe: Recipe,
    pub(crate) start: Option<Start>,
    /// A file or directory whose bytes are counted (`artifact_bytes`).
    pub(crate) artifact: Option<String>,
    /// `resources.pid`: the server's process, for an arm the tool does not start (its
    /// process tree is sampled).
    pub(crate) resources_pid: Option<u32>,
    /// The plan's metadata with this arm's fields over it (campaign.json).
    pub(crate) metadata: Map<String, Value>,
    /// Scrape this arm's worker's `/metrics`: `None` not; `Some(None)` on the endpoint's
    /// origin (the default for an arm the tool starts); `Some(Some(url))` as written,
    /// `{port}` substituted when the arm starts.
    pub(crate) worker_metrics: Option<Option<String>>,
}

impl Arm {
    /// The arm's endpoints with `{port}` replaced.
    pub(crate) fn endpoints(
        &self,
        port: u16,
    ) -> Result<(Endpoint, Endpoint), crate::model::EndpointError> {
        let sub = |s: &str| s.replace("{port}", &port.to_string());
        let ep = Endpoint::parse(&sub(&self.endpoint))?;
        let health = match &self.health_endpoint {
            Some(h) => Endpoint::parse(&sub(h))?,
            None => ep.with_path("/health"),
        };
        Ok((ep, health))
    }

    /// Where this arm's worker's metrics are scraped (`{port}` replaced), if they are.
    pub(crate) fn worker_metrics_url(
        &self,
        port: u16,
    ) -> Option<Result<Endpoint, crate::model::EndpointError>> {
        let url = self.worker_metrics.as_ref()?;
        Some(match url {
            Some(u) => Endpoint::parse(&u.replace("{port}", &port.to_string())),
            None => self.endpoints(port).map(|(e, _)| e.with_path("/metrics")),
        })
    }

    /// Whether the arm is the built-in mock worker started by the tool itself.
    pub(crate) fn is_builtin_mock(&self) -> bool {
        self.start.as_ref().is_some_and(|s| {
            s.command.first().map(String::as_str) == Some("{self}")
                && s.command.get(1).map(String::as_str) == Some("mock-worker")
        })
    }
}

/// The campaign part of a plan.
#[derive(Debug, Clone)]
pub(crate) struct Campaign {
    /// As declared, or `synthetic` when every arm is the built-in mock.
    pub(crate) evidence_class: EvidenceClass,
    pub(crate) schedule: Schedule,
    pub(crate) arms: Vec<Arm>,
}

impl Campaign {
    pub(crate) fn reference(&self) -> &Arm {
        self.arms
            .iter()
            .find(|a| a.reference)
            .unwrap_or(&self.arms[0])
    }
}

/// What an arm's name must be, as messages say it after the name.
pub(crate) const ARM_NAME_RULE: &str = "must be letters, digits, '.', '_' or '-' (not first '.'): it names the arm's files in the run directory";

/// Whether `s` may name an arm ([`ARM_NAME_RULE`]).
pub(crate) fn is_arm_name(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        && !s.starts_with('.')
}

const ARM_FIELDS: &[&str] = &[
    "name",
    "lane",
    "reference",
    "endpoint",
    "health_endpoint",
    "recipe",
    "start",
    "artifact",
    "metadata",
    "resources",
    "worker_metrics",
];
const RECIPE_KEYS: [&str; 4] = ["runtime", "weight_format", "weight_quantization", "device"];
const START_FIELDS: &[&str] = &[
    "command",
    "env",
    "cwd",
    "warm_start",
    "health_timeout_seconds",
    "stop_grace_seconds",
];

/// Parts of an environment variable's name (split at `_`) that say it holds a secret
/// (`HF_TOKEN`, `OPENAI_API_KEY`; not `TOKENIZERS_PARALLELISM`): the plan is copied
/// into every run directory, so such a value must come from matrix-proxy's own
/// environment (which the server inherits), never from the plan.
const SECRET_ENV_PARTS: &[&str] = &[
    "TOKEN",
    "KEY",
    "SECRET",
    "PASSWORD",
    "PASSWD",
    "CREDENTIAL",
    "CREDENTIALS",
    "AUTH",
];

impl Validator {
    /// The campaign part of a plan whose top level has `arms`. `plan_metadata` is the
    /// plan's own (already checked) for the per-arm overrides.
    pub(super) fn campaign(
        &mut self,
        top: &Map<String, Value>,
        plan_metadata: Option<&Map<String, Value>>,
    ) -> Option<Campaign> {
        for key in ["endpoint", "health_endpoint"] {
            if top.contains_key(key) {
                self.err(
                    key,
                    "a campaign plan has no top-level endpoint: each arm has its own endpoint (and health_endpoint, default /health on its origin)",
                );
            }
        }
        // Its type and blankness are checked with every plan's `name` (`Plan::name`).
        let named = top.contains_key("name");
        if !named {
            self.err(
                "name",
                "is required in a campaign plan: it is the plan id a contract names",
            );
        }
        let declared = match top.get("evidence_class") {
            None => Some(EvidenceClass::Measured),
            Some(v) => match self.string(v, "evidence_class") {
                Some("synthetic") => Some(EvidenceClass::Synthetic),
                Some("measured") => Some(EvidenceClass::Measured),
                Some(other) => {
                    self.err(
                        "evidence_class",
                        format!("'{other}' is not an evidence class; use \"synthetic\" (mocks and test servers) or \"measured\" (real models)"),
                    );
                    None
                }
                None => None,
            },
        };
        let schedule = match top.get("schedule") {
            None => Some(Schedule::Interleaved),
            Some(v) => match self.string(v, "schedule") {
                Some("interleaved") => Some(Schedule::Interleaved),
                Some("sequential") => Some(Schedule::Sequential),
                Some(other) => {
                    self.err(
                        "schedule",
                        format!("'{other}' is not a schedule; use \"interleaved\" (arms in rotation, never overlapping) or \"sequential\" (each arm start to stop, then the next)"),
                    );
                    None
                }
                None => None,
            },
        };
        let arms = self.arms(top.get("arms"), plan_metadata);
        let arms = arms?;
        if schedule == Some(Schedule::Interleaved) {
            self.shared_ports(&arms);
        }
        let evidence_class = if arms.iter().all(Arm::is_builtin_mock) {
            Some(EvidenceClass::Synthetic)
        } else {
            declared
        };
        named.then_some(())?;
        Some(Campaign {
            evidence_class: evidence_class?,
            schedule: schedule?,
            arms,
        })
    }

    /// Under the interleaved schedule every started server is up at once: two that listen
    /// on one literal host:port cannot both run, and the second arm's health check would
    /// be answered by the first's server.
    fn shared_ports(&mut self, arms: &[Arm]) {
        let mut seen: Vec<(String, usize)> = Vec::new();
        for (i, a) in arms.iter().enumerate() {
            if a.start.is_none() || a.endpoint.contains("{port}") {
                continue;
            }
            let Ok(ep) = Endpoint::parse(&a.endpoint) else {
                continue;
            };
            match seen.iter().find(|(at, _)| *at == ep.authority) {
                Some((at, j)) => self.err(
                    format!("arms[{i}].endpoint"),
                    format!(
                        "arms[{j}] ('{}') and arms[{i}] ('{}') both start a server on {at}: under the interleaved schedule both run at once, so the second cannot listen there and the first would answer for it; give each arm its own port, or write {{port}} in the endpoint and the start command (a free port per arm), or use \"schedule\": \"sequential\"",
                        arms[*j].name, a.name
                    ),
                ),
                None => seen.push((ep.authority.clone(), i)),
            }
        }
    }

    fn arms(
        &mut self,
        v: Option<&Value>,
        plan_metadata: Option<&Map<String, Value>>,
    ) -> Option<Vec<Arm>> {
        let Some(Value::Array(items)) = v else {
            self.err("arms", "must be a non-empty list of arms");
            return None;
        };
        if items.is_empty() {
            self.err("arms", "must not be empty");
            return None;
        }
        let mut out = Vec::new();
        let mut ok = true;
        let mut names = std::collections::HashSet::new();
        for (i, item) in items.iter().enumerate() {
            let path = format!("arms[{i}]");
            match self.arm(item, &path, plan_metadata) {
                Some(a) => {
                    if !names.insert(a.name.clone()) {
                        self.err(
                            join(&path, "name"),
                            format!("arm name '{}' is used more than once", a.name),
                        );
                        ok = false;
                    }
                    out.push(a);
                }
                None => ok = false,
            }
        }
        if !ok {
            return None;
        }
        let references: Vec<usize> = (0..out.len()).filter(|&i| out[i].reference).collect();
        match references.as_slice() {
            [i] if out[*i].lane != Lane::Quality => {
                self.err(
                    format!("arms[{i}].reference"),
                    "the reference must be in the quality lane (\"lane\": \"quality\"): the other arms are judged against its answers",
                );
                None
            }
            [_] => Some(out),
            other => {
                self.err(
                    "arms",
                    format!(
                        "exactly one reference is required (one arm with \"reference\": true), found {}",
                        other.len()
                    ),
                );
                None
            }
        }
    }

    fn arm(
        &mut self,
        v: &Value,
        path: &str,
        plan_metadata: Option<&Map<String, Value>>,
    ) -> Option<Arm> {
        let m = self.object(v, path)?;
        self.unknown_fields(m, path, &[ARM_FIELDS]);
        let name = self.arm_name(m, path);
        let lane = self.arm_lane(m, path);
        let reference = match m.get("reference") {
            None => Some(false),
            Some(Value::Bool(b)) => Some(*b),
            Some(_) => {
                self.err(join(path, "reference"), "must be true or false");
                None
            }
        };
        let start = match m.get("start") {
            None => Some(None),
            Some(v) => self.start(v, &join(path, "start")).map(Some),
        };
        let endpoint = self.arm_url(m.get("endpoint"), &join(path, "endpoint"), true);
        let health = self.arm_url(
            m.get("health_endpoint"),
            &join(path, "health_endpoint"),
            false,
        );
        let uses_port = |s: &Option<String>| s.as_deref().is_some_and(|s| s.contains("{port}"));
        if (uses_port(&endpoint) || uses_port(&health)) && matches!(start, Some(None)) {
            self.err(
                join(path, "endpoint"),
                "uses {port}, a port the tool chooses when it starts the server: give the arm a start command",
            );
        }
        let recipe = self.recipe(m.get("recipe"), &join(path, "recipe"));
        let artifact = match m.get("artifact") {
            None => Some(None),
            Some(v) => self
                .nonblank(v, &join(path, "artifact"))
                .map(|s| Some(s.to_string())),
        };
        let worker_metrics = self.arm_worker_metrics(m.get("worker_metrics"), path, start.as_ref());
        let resources_pid = match m.get("resources") {
            None => Some(None),
            Some(v) => self.resources(v, &join(path, "resources"), matches!(start, Some(Some(_)))),
        };
        let metadata = self.arm_metadata(m, path, plan_metadata);
        Some(Arm {
            name: name?,
            lane: lane?,
            reference: reference?,
            endpoint: endpoint?,
            health_endpoint: health,
            recipe: recipe?,
            start: start?,
            artifact: artifact?,
            resources_pid: resources_pid?,
            metadata,
            worker_metrics: worker_metrics?,
        })
    }

    /// An arm's `name`: required, a valid arm name.
    fn arm_name(&mut self, m: &Map<String, Value>, path: &str) -> Option<String> {
        match m.get("name") {
            None => {
                self.err(join(path, "name"), "is required");
                None
            }
            Some(n) => self.nonblank(n, &join(path, "name")).and_then(|s| {
                if is_arm_name(s) {
                    Some(s.to_string())
                } else {
                    self.err(join(path, "name"), format!("'{s}' {ARM_NAME_RULE}"));
                    None
                }
            }),
        }
    }

    /// An arm's `lane`: required, "quality" or "performance-fit".
    fn arm_lane(&mut self, m: &Map<String, Value>, path: &str) -> Option<Lane> {
        match m.get("lane") {
            None => {
                self.err(
                    join(path, "lane"),
                    "is required: \"quality\" or \"performance-fit\"",
                );
                None
            }
            Some(v) => match self.string(v, &join(path, "lane")) {
                Some("quality") => Some(Lane::Quality),
                Some("performance-fit") => Some(Lane::PerformanceFit),
                Some(other) => {
                    self.err(
                        join(path, "lane"),
                        format!("'{other}' is not a lane; use \"quality\" (must answer like the reference) or \"performance-fit\" (may answer differently)"),
                    );
                    None
                }
                None => None,
            },
        }
    }

    /// The plan's metadata with the arm's own `metadata` over it.
    fn arm_metadata(
        &mut self,
        m: &Map<String, Value>,
        path: &str,
        plan_metadata: Option<&Map<String, Value>>,
    ) -> Map<String, Value> {
        let mut metadata = plan_metadata.cloned().unwrap_or_default();
        if let Some(v) = m.get("metadata") {
            let p = join(path, "metadata");
            if let Some(own) = self.object(v, &p) {
                for (k, val) in own {
                    if self.nonblank(val, &join(&p, k)).is_some() {
                        metadata.insert(k.clone(), val.clone());
                    }
                }
            }
        }
        metadata
    }

    /// `resources`: `{"pid": N}`, for an arm the tool does not start.
    fn resources(&mut self, v: &Value, path: &str, started: bool) -> Option<Option<u32>> {
        let m = self.object(v, path)?;
        self.unknown_fields(m, path, &[&["pid"]]);
        let p = join(path, "pid");
        if started {
            self.err(
                &p,
                "goes with an arm the tool does not start: a started server's own process group is sampled",
            );
            return None;
        }
        match m.get("pid").and_then(Value::as_u64) {
            Some(pid) if pid >= 1 && pid <= u64::from(u32::MAX) => Some(Some(pid as u32)),
            _ => {
                self.err(
                    &p,
                    "is required: the server's process id (an integer >= 1); its process and descendants are sampled",
                );
                None
            }
        }
    }

    /// An arm's URL as written (`{port}` allowed), checked with a stand-in port.
    fn arm_url(&mut self, v: Option<&Value>, path: &str, required: bool) -> Option<String> {
        let Some(v) = v else {
            if required {
                self.err(path, "is required: the URL this arm's requests go to");
            }
            return None;
        };
        let s = self.string(v, path)?;
        // The plan's endpoint rules (no secret query parameter, a valid URL), `{port}`
        // checked with a stand-in port.
        self.endpoint_str(s, &s.replace("{port}", "1"), path)
            .map(|_| s.to_string())
    }

    /// `worker_metrics`: the worker's Prometheus URL (`{port}` allowed in an arm), `true`
    /// for `/metrics` on the endpoint's origin, `false` for none. `Some(None)`: not
    /// scraped; `Some(Some(None))`: the origin's; `Some(Some(Some(url)))`.
    pub(super) fn worker_metrics(
        &mut self,
        v: Option<&Value>,
        path: &str,
        default: bool,
    ) -> Option<Option<Option<String>>> {
        match v {
            None => Some(default.then_some(None)),
            Some(Value::Bool(b)) => Some(b.then_some(None)),
            Some(Value::String(s)) => self
                .endpoint_str(s, &s.replace("{port}", "1"), path)
                .map(|_| Some(Some(s.clone()))),
            Some(_) => {
                self.err(
                    path,
                    "must be the worker's Prometheus URL (e.g. \"http://127.0.0.1:8000/metrics\"), true (/metrics on the endpoint's origin) or false",
                );
                None
            }
        }
    }

    /// An arm's `worker_metrics`: on by default for an arm the tool starts (`start`
    /// `Some(Some(_))`), whose port `{port}` names; refused in another arm's URL.
    fn arm_worker_metrics(
        &mut self,
        v: Option<&Value>,
        path: &str,
        start: Option<&Option<Start>>,
    ) -> Option<Option<Option<String>>> {
        let p = join(path, "worker_metrics");
        let w = self.worker_metrics(v, &p, matches!(start, Some(Some(_))));
        if let (Some(Some(Some(u))), Some(None)) = (&w, start)
            && u.contains("{port}")
        {
            self.err(
                p,
                "uses {port}, a port the tool chooses when it starts the server: give the arm a start command, or the worker's own port",
            );
        }
        w
    }

    fn recipe(&mut self, v: Option<&Value>, path: &str) -> Option<Recipe> {
        let Some(v) = v else {
            self.err(
                path,
                format!("is required: {} (non-blank)", RECIPE_KEYS.join(", ")),
            );
            return None;
        };
        let m = self.object(v, path)?;
        self.unknown_fields(m, path, &[&RECIPE_KEYS]);
        let mut vals = Vec::new();
        for key in RECIPE_KEYS {
            let p = join(path, key);
            match m.get(key) {
                None => {
                    self.err(&p, "is required (non-blank)");
                    vals.push(None);
                }
                Some(v) => vals.push(self.nonblank(v, &p).map(str::to_string)),
            }
        }
        let mut it = vals.into_iter();
        let (a, b, c, d) = (it.next()??, it.next()??, it.next()??, it.next()??);
        Some(Recipe {
            runtime: a,
            weight_format: b,
            weight_quantization: c,
            device: d,
        })
    }

    fn start(&mut self, v: &Value, path: &str) -> Option<Start> {
        let m = self.object(v, path)?;
        self.unknown_fields(m, path, &[START_FIELDS]);
        let p = join(path, "command");
        let command = match m.get("command") {
            Some(Value::Array(items)) if !items.is_empty() => {
                let args: Vec<Option<&str>> = items
                    .iter()
                    .enumerate()
                    .map(|(i, a)| self.string(a, &format!("{p}[{i}]")))
                    .collect();
                args.into_iter()
                    .map(|a| a.map(str::to_string))
                    .collect::<Option<Vec<String>>>()
            }
            _ => {
                self.err(
                    &p,
                    "is required: the server's argv as a non-empty list of strings ({port} and {self} are substituted)",
                );
                None
            }
        };
        let secs = |this: &mut Validator, key: &str, default: f64| -> Option<Duration> {
            let p = join(path, key);
            let t = match m.get(key) {
                None => default,
                Some(v) => match v.as_f64() {
                    Some(t) if v.is_number() && t.is_finite() && t > 0.0 && t <= 86_400.0 => t,
                    _ => {
                        this.err(&p, "must be a number of seconds > 0 (at most a day)");
                        return None;
                    }
                },
            };
            Some(Duration::from_secs_f64(t))
        };
        let health_timeout = secs(self, "health_timeout_seconds", 600.0);
        let stop_grace = secs(self, "stop_grace_seconds", 10.0);
        let env = self.start_env(m.get("env"), &join(path, "env"));
        let cwd = match m.get("cwd") {
            None => Some(None),
            Some(v) => self
                .nonblank(v, &join(path, "cwd"))
                .map(|s| Some(s.to_string())),
        };
        let warm_start = match m.get("warm_start") {
            None => Some(false),
            Some(Value::Bool(b)) => Some(*b),
            Some(_) => {
                self.err(join(path, "warm_start"), "must be true or false");
                None
            }
        };
        Some(Start {
            command: command?,
            health_timeout: health_timeout?,
            stop_grace: stop_grace?,
            env: env?,
            cwd: cwd?,
            warm_start: warm_start?,
        })
    }

    /// `start.env`: variable name → string value, names without `=` or NUL, and none that
    /// names a secret ([`SECRET_ENV_PARTS`]).
    fn start_env(&mut self, v: Option<&Value>, path: &str) -> Option<Vec<(String, String)>> {
        let Some(v) = v else {
            return Some(Vec::new());
        };
        let m = self.object(v, path)?;
        let mut out = Vec::new();
        let mut ok = true;
        for (name, value) in m {
            let p = join(path, name);
            let upper = name.to_ascii_uppercase();
            let mut parts = upper.split(['_', '-', '.']);
            if name.is_empty() || name.contains(['=', '\0']) {
                self.err(&p, "is not an environment variable name");
                ok = false;
            } else if parts.any(|p| SECRET_ENV_PARTS.contains(&p)) {
                self.err(&p, "names a secret, and the plan is copied into every run directory: set it in matrix-proxy's own environment instead (the server inherits it)");
                ok = false;
            } else if let Some(s) = self.string(value, &p) {
                out.push((name.clone(), s.to_string()));
            } else {
                ok = false;
            }
        }
        ok.then_some(out)
    }
}

#[cfg(test)]
mod tests {
    use crate::config::plan::Plan;

    const META: &str = r#""metadata": {"gpu": "N/A", "gpu_ids": "N/A", "driver": "N/A", "cuda": "N/A",
        "precision": "bf16", "model_revision": "m", "runtime_revision": "r", "cache_policy": "none",
        "cuda_evidence": "N/A", "reservation": "N/A", "host": "h"}"#;
    const BODY: &str = r#""concurrency": [1], "requests_per_case": 2, "timeout_seconds": 5,
        "cases": [{"name": "c", "request": {"q": 1}}]"#;

    fn recipe(q: &str) -> String {
        format!(
            r#"{{"runtime": "vllm", "weight_format": "safetensors", "weight_quantization": "{q}", "device": "cuda:0"}}"#
        )
    }

    fn problems(top: &str) -> Vec<String> {
        let text = format!("{{ {top}, {BODY}, {META} }}");
        match Plan::from_json_bytes(text.as_bytes()) {
            Ok(_) => vec![],
            Err(e) => e.problems.iter().map(|p| p.to_string()).collect(),
        }
    }

    #[test]
    fn a_campaign_from_the_issue_validates_with_its_defaults() {
        let top = format!(
            r#""name": "q4-vs-bf16", "evidence_class": "measured", "arms": [
              {{"name": "bf16", "lane": "quality", "reference": true,
                "endpoint": "http://127.0.0.1:8000/v1/chat/completions", "recipe": {},
                "metadata": {{"runtime_revision": "vllm 0.33.0", "precision": "bf16"}}}},
              {{"name": "q4", "lane": "performance-fit",
                "endpoint": "http://127.0.0.1:{{port}}/v1/chat/completions", "recipe": {},
                "start": {{"command": ["llama-server", "-m", "model.gguf", "--port", "{{port}}"], "health_timeout_seconds": 600}},
                "artifact": "models/model.gguf"}}]"#,
            recipe("bf16"),
            recipe("q4_k_m")
        );
        let text = format!("{{ {top}, {BODY}, {META} }}");
        let p = Plan::from_json_bytes(text.as_bytes()).expect("valid");
        let c = p.campaign.as_ref().unwrap();
        assert_eq!(p.name.as_deref(), Some("q4-vs-bf16"));
        assert_eq!(c.evidence_class.as_str(), "measured");
        assert_eq!(c.schedule.as_str(), "interleaved");
        assert_eq!(c.reference().name, "bf16");
        assert_eq!(c.arms[0].metadata["runtime_revision"], "vllm 0.33.0");
        assert_eq!(
            c.arms[1].metadata["runtime_revision"], "r",
            "plan metadata otherwise"
        );
        let (ep, health) = c.arms[1].endpoints(4321).unwrap();
        assert_eq!(ep.url(), "http://127.0.0.1:4321/v1/chat/completions");
        assert_eq!(health.url(), "http://127.0.0.1:4321/health");
        // The arm the tool starts is scraped at its origin's /metrics; the other is not.
        assert!(c.arms[0].worker_metrics_url(4321).is_none());
        assert_eq!(
            c.arms[1]
                .worker_metrics_url(4321)
                .map(|u| u.map(|e| e.url())),
            Some(Ok("http://127.0.0.1:4321/metrics".to_string()))
        );
        let start = c.arms[1].start.as_ref().unwrap();
        assert_eq!(start.health_timeout.as_secs(), 600);
        assert_eq!(start.stop_grace.as_secs(), 10);
        // A case may have no oracle in a campaign: drift from the reference judges it.
        assert!(matches!(
            p.cases[0].variants[0].oracle,
            crate::oracle::Oracle::Unjudged
        ));
        assert_eq!(
            p.judged_cases()[0].1,
            crate::model::JudgedBy::Drift,
            "{:?}",
            p.judged_cases()
        );
        assert!(!p.is_capture());
    }

    #[test]
    fn campaign_rules_and_their_messages() {
        let arm_at = |name: &str, lane: &str, reference: bool, port: &str, extra: &str| {
            format!(
                r#"{{"name": "{name}", "lane": "{lane}", "reference": {reference},
                   "endpoint": "http://127.0.0.1:{port}/v1", "recipe": {}{extra}}}"#,
                recipe("bf16")
            )
        };
        let arm = |name: &str, lane: &str, reference: bool, extra: &str| {
            arm_at(name, lane, reference, "8000", extra)
        };
        let errs = problems(&format!(
            r#""endpoint": "http://h/x", "evidence_class": "anecdotal", "schedule": "random", "arms": [{}, {}, {}]"#,
            arm("a", "quality", true, ""),
            arm("a", "fast", false, ""),
            arm_at("b", "performance-fit", true, "{port}", "")
        ));
        let want = [
            "endpoint: a campaign plan has no top-level endpoint",
            "name: is required in a campaign plan: it is the plan id a contract names",
            "evidence_class: 'anecdotal' is not an evidence class; use \"synthetic\"",
            "schedule: 'random' is not a schedule",
            "arms[1].lane: 'fast' is not a lane; use \"quality\"",
        ];
        for w in want {
            assert!(
                errs.iter().any(|e| e.starts_with(w)),
                "missing {w:?} in {errs:?}"
            );
        }
        // An arm's URL follows the plan's endpoint rules: no secret query parameter.
        let errs = problems(&format!(
            r#""name": "n", "arms": [{}]"#,
            arm_at("a", "quality", true, "8000/v1?api_key=s3cret&x=1", "")
        ));
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(
            errs[0].starts_with("arms[0].endpoint: 'http://127.0.0.1:8000/v1?api_key=<redacted>&x=1/v1' carries a secret query parameter"),
            "{errs:?}"
        );
        // Exactly one reference, in the quality lane.
        let errs = problems(&format!(
            r#""name": "n", "arms": [{}, {}]"#,
            arm("a", "quality", true, ""),
            arm("b", "quality", true, "")
        ));
        assert_eq!(
            errs,
            vec![
                "arms: exactly one reference is required (one arm with \"reference\": true), found 2"
            ]
        );
        let errs = problems(&format!(
            r#""name": "n", "arms": [{}, {}]"#,
            arm("a", "quality", false, ""),
            arm("b", "performance-fit", true, "")
        ));
        assert_eq!(
            errs,
            vec![
                "arms[1].reference: the reference must be in the quality lane (\"lane\": \"quality\"): the other arms are judged against its answers"
            ]
        );
        // Unique names, a non-blank recipe, {port} only with a start command.
        let errs = problems(&format!(
            r#""name": "n", "arms": [{}, {}]"#,
            arm("a", "quality", true, ""),
            r#"{"name": "a", "lane": "quality", "endpoint": "http://127.0.0.1:{port}/v1",
               "recipe": {"runtime": " ", "weight_format": "gguf", "weight_quantization": "q4", "device": "cpu"}}"#
        ));
        assert_eq!(
            errs,
            vec![
                "arms[1].endpoint: uses {port}, a port the tool chooses when it starts the server: give the arm a start command",
                "arms[1].recipe.runtime: must not be blank",
            ]
        );
        // resources.pid is for a server the tool does not start.
        let errs = problems(&format!(
            r#""name": "n", "arms": [{}]"#,
            arm_at(
                "a",
                "quality",
                true,
                "{port}",
                r#", "start": {"command": ["x"]}, "resources": {"pid": 7}"#
            )
        ));
        assert_eq!(
            errs,
            vec![
                "arms[0].resources.pid: goes with an arm the tool does not start: a started server's own process group is sampled"
            ]
        );
        // worker_metrics: a URL ({port} allowed), true or false; never at a campaign's
        // top level.
        let errs = problems(&format!(
            r#""name": "n", "worker_metrics": true, "arms": [{}, {}]"#,
            arm(
                "a",
                "quality",
                true,
                r#", "worker_metrics": "http://127.0.0.1:9100/m""#
            ),
            arm("b", "quality", false, r#", "worker_metrics": 9"#)
        ));
        assert_eq!(
            errs,
            vec![
                "arms[1].worker_metrics: must be the worker's Prometheus URL (e.g. \"http://127.0.0.1:8000/metrics\"), true (/metrics on the endpoint's origin) or false",
                "worker_metrics: a campaign plan scrapes each arm's worker: give it in the arms (an arm the tool starts is scraped at its origin's /metrics by default)",
            ]
        );
        let errs = problems(&format!(
            r#""name": "n", "arms": [{}]"#,
            arm(
                "a",
                "quality",
                true,
                r#", "worker_metrics": "http://127.0.0.1:{port}/m""#
            )
        ));
        assert_eq!(
            errs,
            vec![
                "arms[0].worker_metrics: uses {port}, a port the tool chooses when it starts the server: give the arm a start command, or the worker's own port"
            ]
        );
        // A plain plan has no {port}; its URL or `true` is kept.
        let errs = problems(r#""endpoint": "http://h/x", "worker_metrics": "http://h:{port}/m""#);
        assert_eq!(
            errs,
            vec![
                "worker_metrics: uses {port}, which only a campaign arm the tool starts has: give the worker's own port"
            ]
        );
        for (w, want) in [
            ("true", Some(Some(None))),
            ("false", Some(None)),
            (
                r#""http://h:9100/m""#,
                Some(Some(Some("http://h:9100/m".to_string()))),
            ),
        ] {
            let text =
                format!(r#"{{ "endpoint": "http://h/x", "worker_metrics": {w}, {BODY}, {META} }}"#);
            let p = Plan::from_json_bytes(text.as_bytes()).map_err(|e| e.to_string());
            let got = p.map(|p| p.worker_metrics.map(|u| u.map(|e| e.url())));
            assert_eq!(got.ok(), want, "{w}");
        }
        // An arm's name names its files: no path tricks.
        let errs = problems(&format!(
            r#""name": "n", "arms": [{}]"#,
            arm("../x", "quality", true, "")
        ));
        assert_eq!(
            errs,
            vec![
                "arms[0].name: '../x' must be letters, digits, '.', '_' or '-' (not first '.'): it names the arm's files in the run directory"
            ]
        );
        // The built-in mock on every arm forces the synthetic class.
        let mock =
            r#", "start": {"command": ["{self}", "mock-worker", "--listen", "127.0.0.1:{port}"]}"#;
        let text = format!(
            r#"{{ "name": "n", "evidence_class": "measured", "arms": [{}, {}], {BODY}, {META} }}"#,
            arm_at("a", "quality", true, "{port}", mock),
            arm_at("b", "performance-fit", false, "{port}", mock)
        );
        let p = Plan::from_json_bytes(text.as_bytes()).unwrap();
        assert_eq!(p.campaign.unwrap().evidence_class.as_str(), "synthetic");
        // Without arms, the campaign keys are refused; a plain plan whose requests have
        // no oracle is a capture plan, not a mistake.
        let errs = problems(r#""endpoint": "http://h/x", "schedule": "sequential""#);
        assert_eq!(
            errs,
            ["schedule: goes with arms: it describes a campaign plan"],
            "{errs:?}"
        );
        let capture = format!(r#"{{ "endpoint": "http://h/x", {BODY}, {META} }}"#);
        assert!(
            Plan::from_json_bytes(capture.as_bytes())
                .unwrap()
                .is_capture()
        );
    }

    #[test]
    fn a_start_command_takes_env_and_cwd_but_no_secret_from_the_plan() {
        let arm = |name: &str, reference: bool, port: &str, extra: &str| {
            format!(
                r#"{{"name": "{name}", "lane": "quality", "reference": {reference},
                   "endpoint": "http://127.0.0.1:{port}/v1", "recipe": {},
                   "start": {{"command": ["srv", "--port", "{port}"]{extra}}}}}"#,
                recipe("bf16")
            )
        };
        let top = format!(
            r#""name": "n", "arms": [{}]"#,
            arm(
                "a",
                true,
                "{port}",
                r#", "env": {"CUDA_VISIBLE_DEVICES": "0", "SRV_PORT": "{port}"}, "cwd": "/srv""#
            )
        );
        let text = format!("{{ {top}, {BODY}, {META} }}");
        let p = Plan::from_json_bytes(text.as_bytes()).expect("valid");
        let start = p.campaign.unwrap().arms[0].start.clone().unwrap();
        assert_eq!(
            start.env,
            [
                ("CUDA_VISIBLE_DEVICES".to_string(), "0".to_string()),
                ("SRV_PORT".to_string(), "{port}".to_string())
            ]
        );
        assert_eq!(start.cwd.as_deref(), Some("/srv"));
        // Names whose parts only look like a secret's pass.
        let harmless = format!(
            r#""name": "n", "arms": [{}]"#,
            arm(
                "a",
                true,
                "{port}",
                r#", "env": {"TOKENIZERS_PARALLELISM": "false", "MAX_TOTAL_TOKENS": "4096", "KEYBOARD": "x"}"#
            )
        );
        assert_eq!(problems(&harmless), Vec::<String>::new());
        let errs = problems(&format!(
            r#""name": "n", "arms": [{}]"#,
            arm(
                "a",
                true,
                "{port}",
                r#", "env": {"HF_TOKEN": "hf_x", "N": 1}, "cwd": " ""#
            )
        ));
        assert_eq!(errs.len(), 3, "{errs:?}");
        assert!(errs[0].starts_with("arms[0].start.env.HF_TOKEN: names a secret, and the plan is copied into every run directory"), "{errs:?}");
        assert!(errs[1].starts_with("arms[0].start.env.N: "), "{errs:?}");
        assert_eq!(errs[2], "arms[0].start.cwd: must not be blank");
    }

    #[test]
    fn two_started_arms_on_one_literal_port_are_refused_when_interleaved() {
        let arm = |name: &str, reference: bool, port: &str| {
            format!(
                r#"{{"name": "{name}", "lane": "quality", "reference": {reference},
                   "endpoint": "http://127.0.0.1:{port}/v1", "recipe": {},
                   "start": {{"command": ["srv"]}}}}"#,
                recipe("bf16")
            )
        };
        let arms = [
            arm("a", true, "18556"),
            arm("b", false, "18556"),
            arm("c", false, "{port}"),
        ];
        let errs = problems(&format!(r#""name": "n", "arms": [{}]"#, arms.join(", ")));
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(
            errs[0].starts_with("arms[1].endpoint: arms[0] ('a') and arms[1] ('b') both start a server on 127.0.0.1:18556"),
            "{errs:?}"
        );
        let sequential = format!(
            r#""name": "n", "schedule": "sequential", "arms": [{}]"#,
            arms.join(", ")
        );
        assert_eq!(problems(&sequential), Vec::<String>::new());
    }
}
