//! What `plan from-jsonl` and `plan synthetic` share: their common flags checked
//! (`--out`, `--endpoint`, `--temperature`, `--api`, `--history`), what every request
//! asks, and the capture plan (`crate::dataset`) budgeted, written or printed, with what
//! it will send said on stderr.

use serde_json::Map;

use super::args::{HistoryArg, PlanOutArgs, PromptApi};
use super::freeze::{budget, check_out, emit, read_metadata};
use super::io::{CliError, Exit, usage};
use crate::config::flags;
use crate::config::sessions::History;
use crate::config::shape::Shape;
use crate::dataset::{self, Api, Ask, Requests};
use crate::freeze::{Head, fill_metadata};

/// `--history`: frozen unless live is asked for.
pub(super) fn history(h: Option<HistoryArg>) -> History {
    match h {
        Some(HistoryArg::Live) => History::Live,
        Some(HistoryArg::Frozen) | None => History::Frozen,
    }
}

/// `given` (`--api`), or the API `--endpoint`'s path names, else completions; an `--api`
/// the path contradicts is refused.
pub(super) fn prompt_api(
    given: Option<PromptApi>,
    url: &str,
    endpoint: &crate::model::Endpoint,
) -> Result<Api, CliError> {
    let from_path = Api::of_endpoint(endpoint);
    let Some(given) = given else {
        return Ok(from_path.unwrap_or(Api::Completions));
    };
    let given = match given {
        PromptApi::Completions => Api::Completions,
        PromptApi::Chat => Api::Chat,
    };
    if let Some(p) = from_path.filter(|p| *p != given) {
        return Err(usage(format!(
            "--api {} does not match --endpoint {}, a path of the {} API: drop --api (the endpoint's path decides) or give --endpoint an origin or the {} API's path",
            given.name(),
            url,
            p.name(),
            given.name()
        )));
    }
    Ok(given)
}

/// What both commands check before reading or making anything: `--out`, `--endpoint`,
/// `--temperature`.
pub(super) fn check_flags(o: &PlanOutArgs) -> Result<crate::model::Endpoint, CliError> {
    check_out(o.out.as_deref())?;
    if !o.temperature.is_finite() || o.temperature < 0.0 {
        return Err(usage("--temperature must be a number >= 0"));
    }
    flags::endpoint("--endpoint", &o.endpoint).map_err(usage)
}

/// What every request asks besides its prompt.
pub(super) fn ask(o: &PlanOutArgs, ignore_eos: bool, min_tokens: bool) -> Ask {
    Ask {
        model: o.model.clone(),
        max_tokens: o.max_tokens,
        stream: o.stream,
        temperature: Some(o.temperature),
        ignore_eos,
        min_tokens,
    }
}

/// What a written plan says of itself: its description, and the lines for stderr.
pub(super) struct Said {
    pub(super) description: String,
    pub(super) lines: Vec<String>,
}

/// The capture plan, checked, written or printed, with what it will send.
pub(super) fn write(
    o: &PlanOutArgs,
    endpoint: &crate::model::Endpoint,
    api: Api,
    requests: Requests,
    said: Said,
) -> Result<Exit, CliError> {
    let Said {
        description,
        mut lines,
    } = said;
    let (dispatches, n) = (requests.dispatches(), requests.requests());
    if dispatches == 0 {
        return Err(usage("no prompt to write a plan of"));
    }
    let highest = o.concurrency.iter().copied().max().unwrap_or(1);
    let budget = budget(
        &o.concurrency,
        Some(o.requests_per_case.unwrap_or_else(|| {
            crate::config::plan::covering_requests_per_case(&[dispatches], highest)
        })),
        (o.repetitions, o.warmup_per_case),
        o.timeout_seconds,
        o.connection,
    )?;
    let mut metadata = match &o.metadata {
        Some(p) => read_metadata(p)?,
        None => Map::new(),
    };
    fill_metadata(&mut metadata, &mut lines);
    let head = Head {
        name: None,
        description,
        endpoint: String::new(),
        health_endpoint: None,
        bearer_token_env: None,
        metadata,
    };
    let (each, unit) = match &requests {
        Requests::Prompts(_) => ("prompt", "requests"),
        Requests::Sessions(_) => ("session, all its turns", "sessions"),
    };
    let (bytes, plan) = dataset::capture_plan(head, &budget, endpoint, api, requests)
        .map_err(|e| usage(e.to_string()))?;
    lines.push(format!(
        "the plan sends {} requests in all: {n} readiness and {} warm-up (one and --warmup-per-case per {each}) before its measured rounds ({} per level, {} {unit} each)",
        Shape::Plain.planned_requests(&plan),
        n * budget.warmup_per_case,
        budget.repetitions,
        budget.requests_per_case.unwrap_or_default(),
    ));
    for line in &lines {
        eprintln!("matrix-proxy: {line}");
    }
    emit(o.out.as_deref(), &bytes)?;
    Ok(Exit::Ok)
}
