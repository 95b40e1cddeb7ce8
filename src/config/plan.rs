//! The resolved plan: [`Plan`], its [`Case`]s and their [`Variant`]s, a type that cannot
//! represent an invalid plan. It is made only by [`Plan::from_json_bytes`] (the walk in
//! `walk.rs`, which checks every rule of schema v1 and collects *all* problems); everything
//! after validation takes it and never re-checks. The methods here only re-aim a valid plan
//! (`--endpoint`, `--mock-worker`, an arm) or read it (its arms, its levels).

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method};
use serde_json::{Map, Value};

use super::campaign::Campaign;
use super::load::{Load, Mode};
use crate::model::{ConnectionPolicy, Endpoint, JudgedBy, Level, Slo};
use crate::oracle::{Oracle, Pointer};

/// Largest plan file accepted (`validate`, `replay`, `report`): a plan describes
/// requests; it does not carry bulk data. `freeze` and `plan` refuse to write a larger one.
pub(crate) const MAX_PLAN_BYTES: u64 = 64 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnFailure {
    /// The first failure stops new dispatch; admitted requests drain; later phases are skipped.
    Stop,
    /// Failures are recorded and the whole budget runs.
    Continue,
}

impl OnFailure {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            OnFailure::Stop => "stop",
            OnFailure::Continue => "continue",
        }
    }
}

/// One request shape of a case with its oracle.
#[derive(Debug, Clone)]
pub(crate) struct Variant {
    /// `None` for a case without a `variants` list.
    pub(crate) name: Option<String>,
    pub(crate) body: Bytes,
    pub(crate) content_type: Option<HeaderValue>,
    pub(crate) oracle: Oracle,
    /// The input tokens the plan expects this request to count (`prompt_tokens`: from
    /// the tokenizer that made it); rows record it as `prompt_tokens_planned`.
    pub(crate) prompt_tokens: Option<u64>,
    /// Every ignore path this request inherits and has (top level, case, variant): drift
    /// removes them before comparing answers as canonical JSON.
    pub(crate) ignore_paths: Vec<Pointer>,
}

#[derive(Debug, Clone)]
pub(crate) struct Case {
    pub(crate) name: String,
    pub(crate) method: Method,
    /// The endpoint this case's requests go to (the plan endpoint, or its origin with the
    /// case's `path`).
    pub(crate) endpoint: Endpoint,
    /// The case's own `path`, if it set one (kept so an endpoint override can re-apply it).
    pub(crate) path: Option<String>,
    pub(crate) headers: Vec<(HeaderName, HeaderValue)>,
    pub(crate) expected_status: u16,
    /// Each turn of each session is a variant (`sessions.rs`); `None` for a case of
    /// single requests.
    pub(crate) variants: Vec<Variant>,
    /// The case's multi-turn sessions, when it has them.
    pub(crate) sessions: Option<std::sync::Arc<super::sessions::Sessions>>,
}

impl Case {
    /// What one of its dispatches picks from: its sessions (a case with sessions), else its
    /// variants.
    pub(crate) fn dispatched(&self) -> usize {
        self.sessions
            .as_ref()
            .map_or(self.variants.len(), |s| s.list.len())
    }

    /// What [`Self::dispatched`] counts, in words.
    pub(crate) fn dispatched_what(&self) -> &'static str {
        if self.sessions.is_some() {
            "sessions"
        } else {
            "variants"
        }
    }

    /// Requests `n` dispatches of this case send: `n` single requests, or every turn of
    /// `n` sessions (dispatch `i` runs session `i` mod the case's sessions).
    pub(crate) fn requests_of(&self, n: usize) -> u64 {
        let Some(s) = &self.sessions else {
            return n as u64;
        };
        let count = s.list.len().max(1);
        let whole: u64 = s.list.iter().map(|x| x.turns.len() as u64).sum();
        let part: u64 = s.list[..n % count]
            .iter()
            .map(|x| x.turns.len() as u64)
            .sum();
        (n / count) as u64 * whole + part
    }

    /// How this case's answers are judged: by their oracles when every variant has one;
    /// otherwise by drift in a campaign, not at all in a capture plan.
    pub(crate) fn judged(&self, campaign: bool) -> JudgedBy {
        if self
            .variants
            .iter()
            .all(|v| !matches!(v.oracle, Oracle::Unjudged))
        {
            JudgedBy::Oracle
        } else if campaign {
            JudgedBy::Drift
        } else {
            JudgedBy::No
        }
    }
}

/// A plan that passed validation. Constructed only by [`Plan::from_json_bytes`].
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub(crate) endpoint: Endpoint,
    pub(crate) health_endpoint: Endpoint,
    pub(crate) cases: Vec<Case>,
    pub(crate) concurrency: Vec<usize>,
    pub(crate) requests_per_case: usize,
    pub(crate) repetitions: usize,
    pub(crate) warmup_per_case: usize,
    pub(crate) timeout_seconds: f64,
    pub(crate) timeout: Duration,
    /// Provenance (presence checked, truth not); kept with the plan for the reports.
    #[allow(dead_code)]
    pub(crate) metadata: Map<String, Value>,
    pub(crate) connection: ConnectionPolicy,
    pub(crate) on_failure: OnFailure,
    pub(crate) bearer_token_env: Option<String>,
    /// Where an answer's decisions are (`decisions_pointer`, default `/answers`).
    pub(crate) decisions_pointer: Pointer,
    /// Arms, lanes and the reference, for a campaign plan. Then `endpoint` and
    /// `health_endpoint` are the reference arm's with a stand-in port (`{port}` = 1):
    /// an arm's run replaces them with its own.
    pub(crate) campaign: Option<Campaign>,
    /// The plan's `name` (a contract's `plan_id` names it).
    pub(crate) name: Option<String>,
    /// `drift.numeric_pointers`: numbers whose largest difference drift reports.
    pub(crate) drift_numeric_pointers: Vec<Pointer>,
    /// The canonical workload (see [`super::workload`]).
    pub(crate) workload: Value,
    /// Closed loop (default) or open loop, with the open loop's arrival process.
    pub(crate) load: Load,
    /// Per-request bounds goodput counts against.
    pub(crate) slo: Option<Slo>,
    /// A plain plan's `worker_metrics`: `None` not scraped (unless `--worker-metrics`);
    /// `Some(None)` the endpoint origin's `/metrics`; `Some(Some(url))`.
    pub(crate) worker_metrics: Option<Option<Endpoint>>,
}

/// The seed tool's decisions container.
pub(crate) const DEFAULT_DECISIONS_POINTER: &str = "/answers";

/// The smallest `requests_per_case` at which every measured round sends each variant of
/// every case equally often (a multiple of each case's variant count: round `r` sends
/// dispatch index `i` as variant `i % variants`) and fills the highest concurrency (a
/// plan needs `concurrency <= requests_per_case`). When the counts' least common
/// multiple passes 4 times the largest count, the largest count's multiple is taken:
/// every variant is still reached, some twice as often as others.
pub(crate) fn covering_requests_per_case(variant_counts: &[usize], highest: usize) -> usize {
    fn gcd(a: usize, b: usize) -> usize {
        if b == 0 { a } else { gcd(b, a % b) }
    }
    let largest = variant_counts.iter().copied().max().unwrap_or(1).max(1);
    let lcm = variant_counts
        .iter()
        .filter(|&&n| n > 0)
        .try_fold(1usize, |l, &n| {
            let next = l / gcd(l, n) * n;
            (next <= largest.saturating_mul(4)).then_some(next)
        })
        .unwrap_or(largest);
    lcm * highest.max(1).div_ceil(lcm)
}

impl Plan {
    /// What validate and replay warn of: each case of a closed loop whose measured rounds
    /// cannot send every variant (more variants than `requests_per_case`), so the rest are sent only
    /// in readiness and warm-up and never measured.
    pub(crate) fn unmeasured_variants(&self) -> Vec<String> {
        // An open loop's rounds are its arrivals, not requests_per_case (0 there).
        if self.load.mode == super::load::Mode::Open {
            return self.unmeasured_open();
        }
        // A trace sends the variants its entries name, as often as they name them.
        if self.load.trace.is_some() {
            return Vec::new();
        }
        // A session case's dispatch is a session: its sessions are what a round must cover.
        let count = |c: &Case| {
            c.sessions
                .as_ref()
                .map_or(c.variants.len(), |s| s.list.len())
        };
        let counts: Vec<usize> = self.cases.iter().map(count).collect();
        let highest = self.concurrency.iter().copied().max().unwrap_or(1);
        let fix = covering_requests_per_case(&counts, highest);
        let mut out: Vec<String> = self
            .cases
            .iter()
            .filter(|c| c.sessions.is_some() && count(c) > self.requests_per_case)
            .map(|c| {
                format!(
                    "warning: case '{}' has {} sessions but a measured round runs {} (requests_per_case counts sessions in a case with sessions): sessions {} to {} run only in readiness and warm-up, never measured; set requests_per_case to {fix}",
                    c.name,
                    count(c),
                    self.requests_per_case,
                    self.requests_per_case + 1,
                    count(c),
                )
            })
            .collect();
        out.extend(self.cases
            .iter()
            .filter(|c| c.sessions.is_none() && c.variants.len() > self.requests_per_case)
            .map(|c| {
                format!(
                    "warning: case '{}' has {} variants but a measured round sends {} requests: variants {} to {} are sent only in readiness and warm-up, never measured (not in latency, drift, the floor or McNemar); set requests_per_case to {fix} (the smallest multiple of the variant counts at least the highest concurrency)",
                    c.name,
                    c.variants.len(),
                    self.requests_per_case,
                    self.requests_per_case + 1,
                    c.variants.len(),
                )
            })
        );
        out
    }

    /// [`Self::unmeasured_variants`] of an open loop: arrival `i` of a round is variant
    /// `i mod variants`, so a round of fewer arrivals (`load.requests`, or the lowest
    /// rate x `duration_seconds` on average) never measures the rest.
    fn unmeasured_open(&self) -> Vec<String> {
        use crate::arrival::Extent;
        let lowest = self
            .load
            .rates_per_second
            .iter()
            .copied()
            .fold(f64::INFINITY, f64::min);
        let (arrivals, what) = match self.load.extent {
            Extent::Requests(n) => (n as f64, format!("{n} arrivals (load.requests)")),
            Extent::DurationUs(d) => {
                let n = lowest * d as f64 / 1e6;
                (
                    n,
                    format!(
                        "about {n:.0} arrivals (the lowest rate, {lowest}/s, x load.duration_seconds)"
                    ),
                )
            }
        };
        self.cases
            .iter()
            .filter(|c| (c.dispatched() as f64) > arrivals.floor())
            .map(|c| {
                format!(
                    "warning: case '{}' has {} {} but an open round sends {what}: the {} past them are sent only in readiness and warm-up, never measured (not in latency, drift, the floor or McNemar); give each round at least {} arrivals",
                    c.name,
                    c.dispatched(),
                    c.dispatched_what(),
                    c.dispatched_what(),
                    c.dispatched()
                )
            })
            .collect()
    }

    /// This plan sent to `url` (`--endpoint`): its origin and path replace the
    /// endpoint's; the health endpoint keeps its path on the new origin, and cases with
    /// their own `path` keep it. The plan is otherwise the one validated.
    pub(crate) fn with_endpoint(mut self, url: &Endpoint) -> Plan {
        self.endpoint = url.clone();
        self.health_endpoint = self.health_endpoint.on_origin_of(url);
        for case in &mut self.cases {
            case.endpoint = match &case.path {
                Some(p) => url.with_path(p),
                None => url.clone(),
            };
        }
        self
    }

    /// This plan sent where replay's `--endpoint` says: a URL that names only an origin
    /// (`origin_only`: no path, not even `/`) replaces the origin of every endpoint and
    /// keeps their paths ([`Plan::with_origin`]); any other replaces the endpoint
    /// ([`Plan::with_endpoint`]).
    pub(crate) fn sent_to(self, (url, origin_only): &(Endpoint, bool)) -> Plan {
        if *origin_only {
            self.with_origin(url)
        } else {
            self.with_endpoint(url)
        }
    }

    /// This plan with only the origin (scheme, host, port) of every endpoint replaced
    /// (`--mock-worker`, and `--endpoint` with an origin alone).
    pub(crate) fn with_origin(mut self, origin: &Endpoint) -> Plan {
        self.endpoint = self.endpoint.on_origin_of(origin);
        self.health_endpoint = self.health_endpoint.on_origin_of(origin);
        for case in &mut self.cases {
            case.endpoint = case.endpoint.on_origin_of(origin);
        }
        self
    }

    /// This plan as one arm runs it: every endpoint on the arm's (cases with their own
    /// `path` keep it on the arm's origin), and the arm's health endpoint.
    pub(crate) fn for_arm(&self, endpoint: &Endpoint, health: &Endpoint) -> Plan {
        let mut p = self.clone().with_endpoint(endpoint);
        p.health_endpoint = health.clone();
        p
    }

    /// A capture plan: a plain plan whose requests have no oracle, so its answers are
    /// recorded and not judged (validation refuses a plain plan that mixes the two).
    pub(crate) fn is_capture(&self) -> bool {
        self.campaign.is_none() && self.cases.iter().all(|c| c.judged(false) == JudgedBy::No)
    }

    /// Each case's name and how its answers are judged, in plan order.
    pub(crate) fn judged_cases(&self) -> Vec<(&str, JudgedBy)> {
        let campaign = self.campaign.is_some();
        self.cases
            .iter()
            .map(|c| (c.name.as_str(), c.judged(campaign)))
            .collect()
    }

    /// The arms' names in plan order; one unnamed arm (`None`) for a plain plan.
    pub(crate) fn arm_names(&self) -> Vec<Option<&str>> {
        match &self.campaign {
            None => vec![None],
            Some(c) => c.arms.iter().map(|a| Some(a.name.as_str())).collect(),
        }
    }

    /// The measured levels in plan order: each concurrency of a closed loop, each rate of
    /// an open one.
    pub(crate) fn levels(&self) -> Vec<Level> {
        match self.load.mode {
            Mode::Closed => self
                .concurrency
                .iter()
                .map(|&c| Level::Concurrency(c))
                .collect(),
            Mode::Open => self
                .load
                .rates_per_second
                .iter()
                .map(|&r| Level::Rate(r))
                .collect(),
            // One level: the trace's recorded rate in its window, at its speed-up.
            Mode::Trace => self
                .load
                .trace
                .as_ref()
                .map(|t| Level::Rate(t.rate()))
                .into_iter()
                .collect(),
        }
    }
}

/// A plain closed-loop plan of the one case `case` (tests of a case's fields): every
/// problem validation found, as text, when it is refused.
#[cfg(test)]
pub(crate) fn one_case(case: Value) -> Result<Plan, Vec<String>> {
    let p = serde_json::json!({
        "endpoint": "http://127.0.0.1:8000/v1/chat/completions",
        "concurrency": [1], "requests_per_case": 2, "timeout_seconds": 2,
        "metadata": {"gpu": "N/A", "gpu_ids": "N/A", "driver": "N/A", "cuda": "N/A",
            "precision": "N/A", "model_revision": "m", "runtime_revision": "r",
            "cache_policy": "none", "cuda_evidence": "N/A", "reservation": "N/A", "host": "h"},
        "cases": [case],
    });
    Plan::from_json_bytes(p.to_string().as_bytes())
        .map_err(|e| e.problems.iter().map(|p| p.to_string()).collect())
}

#[cfg(test)]
mod tests {
    use super::covering_requests_per_case as covering;

    #[test]
    fn the_covering_budget_is_the_smallest_multiple_of_the_variants_that_fills_the_levels() {
        // The issue's 40 prompts at levels 1 and 4; 3 prompts at level 4; one request.
        assert_eq!(covering(&[40], 4), 40);
        assert_eq!(covering(&[3], 4), 6);
        assert_eq!(covering(&[1], 4), 4);
        assert_eq!(covering(&[1], 1), 1);
        // Two cases: a multiple of both, while it stays small.
        assert_eq!(covering(&[2, 3], 1), 6);
        assert_eq!(covering(&[40, 3], 4), 120);
        // 7 and 40 would need 280 per case: the larger count's multiple instead.
        assert_eq!(covering(&[7, 40], 4), 40);
        assert_eq!(covering(&[7, 40], 50), 80);
    }
}
