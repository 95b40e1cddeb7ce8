//! `matrix-proxy plan from-jsonl FILE ...` and `matrix-proxy plan synthetic ...`: the
//! flags checked, the prompts made (`crate::dataset`), the capture plan written or
//! printed, and what it will send said on stderr. Sends nothing. `plan campaign` and
//! `plan lock` are `plan_campaign.rs`'s.

use serde_json::Map;

use super::args::{
    DatasetFormat, FromJsonlArgs, PlanCommand, PlanOutArgs, PromptApi, SyntheticArgs,
};
use super::freeze::{budget, check_out, emit, read_metadata};
use super::io::{CliError, Exit, usage};
use super::plan_campaign::{campaign_cmd, lock_cmd};
use crate::config::flags;
use crate::config::shape::Shape;
use crate::dataset::{self, Api, Ask, Prompt, jsonl, synthetic};
use crate::freeze::{Head, fill_metadata};

pub fn plan_cmd(cmd: &PlanCommand) -> Result<Exit, CliError> {
    match cmd {
        PlanCommand::FromJsonl(a) => from_jsonl(a),
        PlanCommand::Synthetic(a) => synthetic_cmd(a),
        PlanCommand::Campaign(a) => campaign_cmd(a),
        PlanCommand::Lock(a) => lock_cmd(a),
    }
}

fn from_jsonl(a: &FromJsonlArgs) -> Result<Exit, CliError> {
    let endpoint = check_flags(&a.out)?;
    if a.limit == Some(0) {
        return Err(usage("--limit must be at least 1"));
    }
    let format = a.format.map(|f| match f {
        DatasetFormat::Chat => jsonl::Format::Chat,
        DatasetFormat::Completion => jsonl::Format::Completion,
        DatasetFormat::Sharegpt => jsonl::Format::ShareGpt,
        DatasetFormat::Request => jsonl::Format::Request,
    });
    let counter = a
        .tokenizer
        .as_deref()
        .map(synthetic::Counter::open)
        .transpose()
        .map_err(|e| usage(e.to_string()))?;
    let opts = jsonl::Options {
        format,
        limit: a.limit,
        seed: a.seed,
        skip_bad: a.skip_bad,
        output_len_from: a.output_len_from.clone(),
    };
    let ask = ask(&a.out, false, false);
    let mut read = jsonl::read(&a.file, &opts, &ask).map_err(|e| usage(e.to_string()))?;
    let unit = if read.array { "item" } else { "line" };
    let mut lines = vec![format!(
        "{} prompts ({} format{}) of {} good {unit}s in {}",
        read.prompts.len(),
        read.format.as_str(),
        if a.format.is_none() { ", detected" } else { "" },
        read.good,
        a.file.display()
    )];
    if read.array {
        lines.push(format!(
            "{} starts with '[': read as one JSON array of objects (as ShareGPT_V3 is distributed), not one object a line; its prompts are named item-N",
            a.file.display()
        ));
    }
    if read.skipped > 0 {
        lines.push(format!(
            "skipped {} bad {unit}(s) (--skip-bad): {}",
            read.skipped,
            read.first_skipped.join("; ")
        ));
    }
    if read.format == jsonl::Format::Request {
        lines.push("raw request bodies are sent as they are: --model, --max-tokens, --stream and --temperature do not apply".into());
    } else if a.out.max_tokens.is_none() && a.output_len_from.is_none() {
        lines.push("warning: no --max-tokens: the requests ask for no max_tokens, so each answer runs to the server's own limit and its length varies from run to run; give --max-tokens N (or --output-len-from FIELD) so the answers can be frozen and decode compared".into());
    }
    if let Some(c) = &counter {
        if read.format == jsonl::Format::Request {
            lines.push("--tokenizer: raw request bodies are sent as they are, so their prompts are not counted".into());
        } else if read.format.api() == Api::Completions {
            for p in &mut read.prompts {
                let text = p.body.pointer("/prompt").and_then(|v| v.as_str());
                p.prompt_tokens = match text {
                    Some(t) => Some(c.count(t).map_err(|e| usage(e.to_string()))? as u64),
                    None => None,
                };
            }
        } else {
            lines.push("--tokenizer counts completion prompts only: a chat template adds tokens the tokenizer alone cannot count, so chat prompts get no prompt_tokens".into());
        }
    }
    let description = format!(
        "Capture plan written by matrix-proxy plan from-jsonl from {} ({} format{}); answers are recorded, not judged: replay it, then freeze the run.",
        a.file.display(),
        read.format.as_str(),
        match (a.limit, a.seed) {
            (Some(k), Some(s)) => format!(", a sample of {k} with seed {s}"),
            (Some(k), None) => format!(", the first {k}"),
            _ => String::new(),
        }
    );
    let api = read.format.api();
    let said = Said { description, lines };
    write(&a.out, &endpoint, api, read.prompts, said)
}

fn synthetic_cmd(a: &SyntheticArgs) -> Result<Exit, CliError> {
    let endpoint = check_flags(&a.out)?;
    check_synthetic_sizes(a)?;
    let counter = synthetic::Counter::open(&a.tokenizer).map_err(|e| usage(e.to_string()))?;
    if a.shared_prefix_tokens > 0 && a.shared_prefix_tokens as usize <= counter.lead {
        return Err(usage(format!(
            "--shared-prefix-tokens {}: this tokenizer starts every prompt with {} special token(s), so a shared prefix must be longer",
            a.shared_prefix_tokens, counter.lead
        )));
    }
    let api = synthetic_api(a, &endpoint)?;
    let opts = synthetic::Options {
        input_tokens: a.input_tokens,
        input_stddev: a.input_stddev,
        output_tokens: a.output_tokens,
        count: a.count,
        seed: a.seed,
        shared_prefix_tokens: a.shared_prefix_tokens,
        prefix_groups: a.prefix_groups,
        cache_bust: a.cache_bust,
        api,
    };
    let ask = ask(&a.out, a.ignore_eos, a.min_tokens);
    let prompts = synthetic::generate(&counter, &opts, &ask).map_err(|e| usage(e.to_string()))?;
    let mut lines = vec![format!(
        "{} prompts of {} input tokens{} under {} (exact, special tokens included), {} output tokens",
        prompts.len(),
        a.input_tokens,
        if a.input_stddev > 0.0 {
            format!(" (stddev {})", a.input_stddev)
        } else {
            String::new()
        },
        a.tokenizer.display(),
        a.output_tokens
    )];
    if api == Api::Chat {
        lines.push("--api chat: each message's text has the exact count; the server's chat template adds its own tokens, so the plan records no prompt_tokens".into());
    }
    let description = synthetic_description(a);
    let said = Said { description, lines };
    write(&a.out, &endpoint, api, prompts, said)
}

/// The counts and token lengths `plan synthetic` is asked for, checked before the
/// tokenizer is read: each at least 1 and within the limits, the prefix flags together.
fn check_synthetic_sizes(a: &SyntheticArgs) -> Result<(), CliError> {
    if a.count == 0 || a.input_tokens == 0 || a.output_tokens == 0 {
        return Err(usage(
            "--count, --input-tokens and --output-tokens must be at least 1",
        ));
    }
    if a.count > synthetic::MAX_COUNT
        || a.input_tokens > synthetic::MAX_TOKENS
        || a.output_tokens > synthetic::MAX_TOKENS
    {
        return Err(usage(format!(
            "--count is at most {} and --input-tokens and --output-tokens at most {} (a plan holds every prompt)",
            synthetic::MAX_COUNT,
            synthetic::MAX_TOKENS
        )));
    }
    if a.out.max_tokens.is_some() {
        return Err(usage(
            "--max-tokens: plan synthetic asks every request for --output-tokens",
        ));
    }
    if a.prefix_groups != 1 && a.shared_prefix_tokens == 0 {
        return Err(usage(
            "--prefix-groups goes with --shared-prefix-tokens P (the tokens each group shares)",
        ));
    }
    check_stddev(a)?;
    if a.shared_prefix_tokens > 0 && a.shared_prefix_tokens >= a.input_tokens {
        return Err(usage(format!(
            "--shared-prefix-tokens {} must be below --input-tokens {}",
            a.shared_prefix_tokens, a.input_tokens
        )));
    }
    if a.prefix_groups == 0 {
        return Err(usage("--prefix-groups must be at least 1"));
    }
    Ok(())
}

/// The capture plan's description: what `plan synthetic` made, from which flags.
fn synthetic_description(a: &SyntheticArgs) -> String {
    format!(
        "Capture plan written by matrix-proxy plan synthetic: {} prompts of {} tokens (stddev {}) under {}, {} output tokens, seed {}{}{}; answers are recorded, not judged.",
        a.count,
        a.input_tokens,
        a.input_stddev,
        a.tokenizer.display(),
        a.output_tokens,
        a.seed,
        if a.shared_prefix_tokens > 0 {
            format!(
                ", {} groups sharing a {}-token prefix",
                a.prefix_groups, a.shared_prefix_tokens
            )
        } else {
            String::new()
        },
        if a.cache_bust {
            ", cache-busting tags"
        } else {
            ""
        }
    )
}

/// `--api`, or the API `--endpoint`'s path names, else completions; an `--api` the path
/// contradicts is refused.
fn synthetic_api(a: &SyntheticArgs, endpoint: &crate::model::Endpoint) -> Result<Api, CliError> {
    let from_path = Api::of_endpoint(endpoint);
    let Some(given) = a.api else {
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
            a.out.endpoint,
            p.name(),
            given.name()
        )));
    }
    Ok(given)
}

/// `--input-stddev` from 0 to `--input-tokens`: a wider spread would only clamp.
fn check_stddev(a: &SyntheticArgs) -> Result<(), CliError> {
    if !a.input_stddev.is_finite() || a.input_stddev < 0.0 || a.input_stddev > a.input_tokens as f64
    {
        // As typed, near enough: 1e300 in full would be 301 digits.
        let given = if a.input_stddev.abs() >= 1e15 {
            format!("{:e}", a.input_stddev)
        } else {
            a.input_stddev.to_string()
        };
        return Err(usage(format!(
            "--input-stddev {given} is out of range: give a number from 0 to --input-tokens ({}); a wider spread would clamp most lengths to the shortest or the longest prompt instead of drawing them",
            a.input_tokens
        )));
    }
    Ok(())
}

/// What both commands check before reading or making anything: `--out`, `--endpoint`,
/// `--temperature`.
fn check_flags(o: &PlanOutArgs) -> Result<crate::model::Endpoint, CliError> {
    check_out(o.out.as_deref())?;
    if !o.temperature.is_finite() || o.temperature < 0.0 {
        return Err(usage("--temperature must be a number >= 0"));
    }
    flags::endpoint("--endpoint", &o.endpoint).map_err(usage)
}

/// What every request asks besides its prompt.
fn ask(o: &PlanOutArgs, ignore_eos: bool, min_tokens: bool) -> Ask {
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
struct Said {
    description: String,
    lines: Vec<String>,
}

/// The capture plan, checked, written or printed, with what it will send.
fn write(
    o: &PlanOutArgs,
    endpoint: &crate::model::Endpoint,
    api: Api,
    prompts: Vec<Prompt>,
    said: Said,
) -> Result<Exit, CliError> {
    let Said {
        description,
        mut lines,
    } = said;
    if prompts.is_empty() {
        return Err(usage("no prompt to write a plan of"));
    }
    let highest = o.concurrency.iter().copied().max().unwrap_or(1);
    let budget = budget(
        &o.concurrency,
        Some(o.requests_per_case.unwrap_or_else(|| {
            crate::config::plan::covering_requests_per_case(&[prompts.len()], highest)
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
    let n = prompts.len();
    let (bytes, plan) = dataset::capture_plan(head, &budget, endpoint, api, prompts)
        .map_err(|e| usage(e.to_string()))?;
    lines.push(format!(
        "the plan sends {} requests in all: {n} readiness and {} warm-up (one and --warmup-per-case per prompt) before its measured rounds ({} per level, {} requests each)",
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
