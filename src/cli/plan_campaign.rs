//! `matrix-proxy plan campaign FROZEN --reference NAME=CMD --arm NAME[:fit]=CMD ...`: a
//! campaign plan from a frozen plan (its cases, budget and metadata; its endpoint becomes
//! each arm's on a port the tool chooses), with arms started by the commands given (split
//! as a shell would), their recipes read from those commands where they say them, and an
//! unlocked version 2 contract beside it; and `matrix-proxy plan lock CONTRACT --by NAME`,
//! which stamps `locked_at` and `locked_by` into a contract once its thresholds are final.
//! Both validate what they write with the validators `validate` and `replay` use, and
//! send nothing.

use std::io::Write;
use std::path::Path;

use serde_json::{Map, Value, json};

use super::args::{CampaignPlanArgs, EvidenceArg, LockArgs, ScheduleArg};
use super::campaign::MAX_CONTRACT_BYTES;
use super::freeze::check_new;
use super::io::write_new;
use super::io::{CliError, Exit, load_plan, report_error, tool, usage};
use crate::clock;
use crate::config::campaign::{ARM_NAME_RULE, Lane, is_arm_name};
use crate::config::contract::{self, LockRefusal};
use crate::config::flags;
use crate::config::plan::{MAX_PLAN_BYTES, Plan};
use crate::freeze::plan_bytes;
use crate::record::rundir;
use crate::run::open::read_bounded;

/// The recipe's keys, in the order a plan writes them.
const RECIPE_KEYS: [&str; 4] = ["runtime", "weight_format", "weight_quantization", "device"];

/// What a recipe field the command does not say is written as.
const UNKNOWN: &str = "unknown";

/// Repetitions a campaign plan gets unless `--repetitions` says otherwise: the fewest
/// rounds a side that give a bootstrap interval (`report::intervals`).
const INTERVAL_ROUNDS: usize = 5;

/// One arm as the flags describe it.
struct ArmSpec {
    name: String,
    lane: Lane,
    reference: bool,
    /// argv, `{port}` and `{self}` as written.
    command: Vec<String>,
    /// `start.env`: every arm's `--env`, then this arm's over them.
    env: Map<String, Value>,
    /// The health check's path on the arm's origin.
    health: Option<String>,
    /// `start.health_timeout_seconds`.
    health_timeout: Option<Value>,
}

impl ArmSpec {
    /// The built-in mock worker, started as `{self} mock-worker ...`.
    fn is_builtin_mock(&self) -> bool {
        self.command.first().map(String::as_str) == Some("{self}")
            && self.command.get(1).map(String::as_str) == Some("mock-worker")
    }
}

pub(super) fn campaign_cmd(a: &CampaignPlanArgs) -> Result<Exit, CliError> {
    check_new("--out", a.out.as_deref())?;
    check_new("--contract-out", a.contract_out.as_deref())?;
    if let (Some(o), Some(c)) = (&a.out, &a.contract_out)
        && o == c
    {
        return Err(usage(
            "--out and --contract-out name the same file: the plan and its contract are two files",
        ));
    }
    if a.repetitions < 2 {
        return Err(usage(format!(
            "--repetitions {}: at least 2 (a plan's rule), and {INTERVAL_ROUNDS} for the intervals a version 2 contract reads",
            a.repetitions
        )));
    }
    let mut specs = arm_specs(a)?;
    settings(a, &mut specs)?;
    for s in &specs {
        let names_port = s.command.iter().any(|w| w.contains("{port}"))
            || s.env
                .values()
                .any(|v| v.as_str().is_some_and(|v| v.contains("{port}")));
        if !names_port {
            return Err(usage(format!(
                "arm '{}': neither its command nor its --env names {{port}}, the free port the tool chooses and the arm's endpoint (http://127.0.0.1:{{port}}...) uses: add the server's port flag, e.g. --port {{port}}",
                s.name
            )));
        }
    }
    let (bytes, frozen) = load_plan(&a.plan)?;
    if frozen.campaign.is_some() {
        return Err(usage(format!(
            "{}: is already a campaign plan (it has arms); plan campaign starts from a plain plan, such as freeze's output",
            a.plan.display()
        )));
    }
    let name = match a.name.as_deref().or(frozen.name.as_deref()) {
        Some(n) if !n.trim().is_empty() => n.to_string(),
        Some(_) => return Err(usage("--name: must not be blank")),
        None => {
            return Err(usage(format!(
                "--name is required: {} has no name, and a campaign plan's name is the plan id its contract names",
                a.plan.display()
            )));
        }
    };
    let Ok(Value::Object(top)) = serde_json::from_slice::<Value>(&bytes) else {
        return Err(tool(format!(
            "{}: validated as a plan but cannot be read again as a JSON object",
            a.plan.display()
        )));
    };
    let mut lines = Vec::new();
    let (plan, unknown) = campaign_json(a, &name, &top, &frozen, &specs, &mut lines);
    let written =
        plan_bytes(&Value::Object(plan), MAX_PLAN_BYTES).map_err(|e| usage(e.to_string()))?;
    match Plan::from_json_bytes(&written) {
        Ok(p) => lines.extend(p.unmeasured_variants()),
        Err(e) => {
            return Err(usage(format!(
                "the campaign plan would not be valid, so nothing is written: {e}"
            )));
        }
    }
    if !unknown.is_empty() {
        lines.push(format!(
            "warning: recipe fields the start commands do not say, written as \"{UNKNOWN}\": {}; edit arms[].recipe in {} before the campaign's numbers are cited",
            unknown.join("; "),
            a.out
                .as_deref()
                .map_or("the plan".to_string(), |p| p.display().to_string())
        ));
    }
    for line in &lines {
        eprintln!("matrix-proxy: {line}");
    }
    write_outputs(a, &name, &specs, &written)?;
    Ok(Exit::Ok)
}

/// The plan to `--out` (else stdout) and the contract to `--contract-out`, each said.
fn write_outputs(
    a: &CampaignPlanArgs,
    name: &str,
    specs: &[ArmSpec],
    plan: &[u8],
) -> Result<(), CliError> {
    let plan_name = match &a.out {
        Some(out) => {
            write_new("--out", out, plan)?;
            eprintln!(
                "matrix-proxy: wrote {}; check it with `matrix-proxy validate {0}`",
                out.display()
            );
            out.display().to_string()
        }
        None => {
            std::io::stdout()
                .write_all(plan)
                .map_err(|e| tool(format!("stdout: {e}")))?;
            "PLAN".to_string()
        }
    };
    let Some(path) = &a.contract_out else {
        return Ok(());
    };
    let reference = specs
        .iter()
        .find(|s| s.reference)
        .map_or("", |s| s.name.as_str());
    let doc = contract::unlocked_v2(name, reference);
    let mut bytes = serde_json::to_vec_pretty(&doc)
        .map_err(|e| tool(format!("--contract-out {}: {e}", path.display())))?;
    bytes.push(b'\n');
    write_new("--contract-out", path, &bytes)?;
    eprintln!(
        "matrix-proxy: wrote {0}: a version 2 contract for '{name}' with every threshold at its default, unlocked (replay refuses it so); edit its thresholds, then lock it with `matrix-proxy plan lock {0} --by NAME` and run `matrix-proxy replay {plan_name} --contract {0}`",
        path.display()
    );
    eprintln!(
        "matrix-proxy: not applied unless written into its thresholds: quality_max_exact_match_drop_vs_floor and quality_min_similarity_vs_floor (quality against the reference's own floor: remove quality_min_exact_match too, or it still applies), quality_min_mcnemar_p, fit_min_exact_match"
    );
    Ok(())
}

/// The reference and the arms from `--reference` and `--arm`, in that order.
fn arm_specs(a: &CampaignPlanArgs) -> Result<Vec<ArmSpec>, CliError> {
    if a.reference.len() != 1 {
        return Err(usage(format!(
            "--reference is given {} times: a campaign has exactly one reference; give the other arms with --arm",
            a.reference.len()
        )));
    }
    let mut specs = vec![arm_spec("--reference", &a.reference[0], true)?];
    for raw in &a.arms {
        let s = arm_spec("--arm", raw, false)?;
        if specs.iter().any(|o| o.name == s.name) {
            return Err(usage(format!(
                "--arm '{raw}': the arm name '{}' is used more than once; each arm has its own name",
                s.name
            )));
        }
        specs.push(s);
    }
    Ok(specs)
}

/// One `--reference` or `--arm`: `NAME[:LANE]=COMMAND`.
fn arm_spec(flag: &str, raw: &str, reference: bool) -> Result<ArmSpec, CliError> {
    let Some((head, cmd)) = raw.split_once('=') else {
        return Err(usage(format!(
            "{flag} '{raw}': give NAME=COMMAND, e.g. {flag} 'twin=vllm serve ./model --port {{port}}' (NAME:fit=COMMAND for the performance-fit lane)"
        )));
    };
    let (name, lane) = match head.split_once(':') {
        None => (head, Lane::Quality),
        Some((n, "fit" | "performance-fit")) => (n, Lane::PerformanceFit),
        Some((n, "quality")) => (n, Lane::Quality),
        Some((_, other)) => {
            return Err(usage(format!(
                "{flag} '{raw}': '{other}' is not a lane; write NAME=COMMAND (the quality lane) or NAME:fit=COMMAND (performance-fit)"
            )));
        }
    };
    if !is_arm_name(name) {
        return Err(usage(format!(
            "{flag} '{raw}': '{name}' (before the first '=') is the arm's name and {ARM_NAME_RULE}; give NAME=COMMAND"
        )));
    }
    if reference && lane == Lane::PerformanceFit {
        return Err(usage(format!(
            "{flag} '{raw}': the reference is in the quality lane (the other arms are judged against its answers); drop ':{}'",
            head.split_once(':').map_or("", |(_, l)| l)
        )));
    }
    let command = shlex::split(cmd).ok_or_else(|| {
        usage(format!(
            "{flag} '{raw}': the command has an unbalanced quote (or ends in a lone backslash); quote it as a shell would, e.g. {flag} '{name}=srv --title \"two words\" --port {{port}}'"
        ))
    })?;
    if command.is_empty() {
        return Err(usage(format!(
            "{flag} '{raw}': the command after '=' is empty; give the command that starts the arm's server"
        )));
    }
    Ok(ArmSpec {
        name: name.to_string(),
        lane,
        reference,
        command,
        env: Map::new(),
        health: None,
        health_timeout: None,
    })
}

/// `[ARM:]REST`: the arms a setting applies to (every arm, or the one named) and the rest.
fn scoped<'a>(
    flag: &str,
    raw: &str,
    arm: Option<&str>,
    specs: &'a mut [ArmSpec],
) -> Result<Vec<&'a mut ArmSpec>, CliError> {
    let Some(arm) = arm else {
        return Ok(specs.iter_mut().collect());
    };
    if !specs.iter().any(|s| s.name == arm) {
        let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
        return Err(usage(format!(
            "{flag} '{raw}': '{arm}' is not an arm; the arms are {}",
            names.join(", ")
        )));
    }
    Ok(specs.iter_mut().filter(|s| s.name == arm).collect())
}

/// One `[ARM:]...` setting as given: the flag's text, the arm it names (`None`: every
/// arm), what it sets (said when it is given twice) and its value.
struct Setting<'a, T> {
    raw: &'a str,
    arm: Option<&'a str>,
    what: String,
    value: T,
}

/// Apply `given` to the arms: the settings for every arm first, then each arm's own over
/// them; the same setting given twice for the same arms is refused.
fn apply<T>(
    flag: &str,
    mut given: Vec<Setting<'_, T>>,
    specs: &mut [ArmSpec],
    set: impl Fn(&mut ArmSpec, &T),
) -> Result<(), CliError> {
    given.sort_by_key(|g| g.arm.is_some());
    let mut seen = std::collections::HashSet::new();
    for g in &given {
        if !seen.insert((g.arm, g.what.as_str())) {
            return Err(usage(format!(
                "{flag} '{}': {} is given twice for {}",
                g.raw,
                g.what,
                g.arm
                    .map_or("every arm".to_string(), |a| format!("arm '{a}'"))
            )));
        }
        for s in scoped(flag, g.raw, g.arm, specs)? {
            set(s, &g.value);
        }
    }
    Ok(())
}

/// `--env`, `--health` and `--health-timeout` onto the arms (see [`apply`]).
fn settings(a: &CampaignPlanArgs, specs: &mut [ArmSpec]) -> Result<(), CliError> {
    let mut envs = Vec::new();
    for raw in &a.env {
        let Some((lhs, value)) = raw.split_once('=') else {
            return Err(usage(format!(
                "--env '{raw}': give KEY=VALUE (every arm) or ARM:KEY=VALUE (one arm)"
            )));
        };
        let (arm, key) = match lhs.split_once(':') {
            Some((arm, key)) => (Some(arm), key),
            None => (None, lhs),
        };
        if !flags::is_env_name(key) {
            return Err(usage(format!(
                "--env '{raw}': '{key}' is not an environment variable name (letters, digits and '_', not first a digit)"
            )));
        }
        envs.push(Setting {
            raw,
            arm,
            what: key.to_string(),
            value: (key, value),
        });
    }
    apply("--env", envs, specs, |s, (key, value)| {
        s.env.insert(key.to_string(), Value::from(*value));
    })?;
    apply("--health", health_paths(&a.health)?, specs, |s, path| {
        s.health = Some(path.to_string());
    })?;
    apply(
        "--health-timeout",
        health_timeouts(&a.health_timeout)?,
        specs,
        |s, t| s.health_timeout = Some(t.clone()),
    )
}

/// `--health [ARM:]PATH`.
fn health_paths(given: &[String]) -> Result<Vec<Setting<'_, &str>>, CliError> {
    given
        .iter()
        .map(|raw| {
            let (arm, path) = match raw.split_once(':') {
                _ if raw.starts_with('/') => (None, raw.as_str()),
                Some((arm, path)) if path.starts_with('/') => (Some(arm), path),
                _ => {
                    return Err(usage(format!(
                        "--health '{raw}': give a path on the arms' origin starting with '/' (e.g. /v1/models), or ARM:PATH for one arm"
                    )));
                }
            };
            let what = "a health path".to_string();
            Ok(Setting { raw, arm, what, value: path })
        })
        .collect()
}

/// `--health-timeout [ARM:]SECONDS`.
fn health_timeouts(given: &[String]) -> Result<Vec<Setting<'_, Value>>, CliError> {
    given
        .iter()
        .map(|raw| {
            let (arm, secs) = match raw.split_once(':') {
                Some((arm, secs)) => (Some(arm), secs),
                None => (None, raw.as_str()),
            };
            let value = match secs.trim().parse::<f64>() {
                Ok(t) if t.is_finite() && t > 0.0 && t <= 86_400.0 => {
                    if t.fract() == 0.0 {
                        json!(t as u64)
                    } else {
                        json!(t)
                    }
                }
                _ => {
                    return Err(usage(format!(
                        "--health-timeout '{raw}': give seconds > 0 (at most a day), for every arm (300) or for one (ARM:300)"
                    )));
                }
            };
            let what = "a health timeout".to_string();
            Ok(Setting { raw, arm, what, value })
        })
        .collect()
}

/// The campaign plan: `name`, the frozen plan's `description`, `evidence_class`,
/// `schedule` and `arms`, then the frozen plan's other keys in their order (its endpoint,
/// health endpoint and worker_metrics left out: each arm has its own), `repetitions` set.
/// Also each arm's recipe fields written as unknown (`arm (field, ...)`).
fn campaign_json(
    a: &CampaignPlanArgs,
    name: &str,
    top: &Map<String, Value>,
    frozen: &Plan,
    specs: &[ArmSpec],
    lines: &mut Vec<String>,
) -> (Map<String, Value>, Vec<String>) {
    // The health path the frozen plan named, when it named one.
    let health = top
        .contains_key("health_endpoint")
        .then(|| frozen.health_endpoint.path_and_query.clone());
    let mut unknown = Vec::new();
    let arms: Vec<Value> = specs
        .iter()
        .map(|s| {
            let (arm, missing) = arm_json(s, &frozen.endpoint.path_and_query, health.as_deref());
            if !missing.is_empty() {
                unknown.push(format!("{} ({})", s.name, missing.join(", ")));
            }
            arm
        })
        .collect();
    let evidence = match a.evidence_class {
        Some(EvidenceArg::Measured) => "measured",
        Some(EvidenceArg::Synthetic) => "synthetic",
        None if specs.iter().all(ArmSpec::is_builtin_mock) => "synthetic",
        None => "measured",
    };
    let schedule = match a.schedule {
        ScheduleArg::Interleaved => "interleaved",
        ScheduleArg::Sequential => "sequential",
    };
    let mut plan = Map::new();
    plan.insert("name".into(), json!(name));
    if let Some(d) = top.get("description") {
        plan.insert("description".into(), d.clone());
    }
    plan.insert("evidence_class".into(), json!(evidence));
    plan.insert("schedule".into(), json!(schedule));
    plan.insert("arms".into(), Value::Array(arms));
    let reps = json!(a.repetitions);
    for (k, v) in top {
        match k.as_str() {
            "name" | "description" | "endpoint" | "health_endpoint" | "worker_metrics" => {}
            "repetitions" => {
                plan.insert(k.clone(), reps.clone());
            }
            _ => {
                plan.insert(k.clone(), v.clone());
                if k == "requests_per_case" && !top.contains_key("repetitions") {
                    plan.insert("repetitions".into(), reps.clone());
                }
            }
        }
    }
    if !plan.contains_key("repetitions") {
        plan.insert("repetitions".into(), reps);
    }
    budget_lines(a, name, top, specs, (evidence, schedule), lines);
    (plan, unknown)
}

/// What the campaign is and what changed from the frozen plan, for stderr.
fn budget_lines(
    a: &CampaignPlanArgs,
    name: &str,
    top: &Map<String, Value>,
    specs: &[ArmSpec],
    (evidence, schedule): (&str, &str),
    lines: &mut Vec<String>,
) {
    let arms: Vec<String> = specs
        .iter()
        .map(|s| {
            let role = if s.reference {
                "reference"
            } else {
                s.lane.as_str()
            };
            format!("{} ({role})", s.name)
        })
        .collect();
    lines.push(format!(
        "campaign '{name}': {} arm(s): {}; {evidence} evidence, {schedule} schedule, repetitions {}",
        specs.len(),
        arms.join(", "),
        a.repetitions
    ));
    let was = top.get("repetitions").and_then(Value::as_u64).unwrap_or(2);
    if a.repetitions < INTERVAL_ROUNDS {
        lines.push(format!(
            "warning: --repetitions {}: under {INTERVAL_ROUNDS} rounds a side no interval is computed, so a version 2 contract's ratio gates (require_interval) have nothing to read",
            a.repetitions
        ));
    } else if was != a.repetitions as u64 {
        lines.push(format!(
            "repetitions {} (the frozen plan had {was}): a version 2 contract's ratio gates read bootstrap intervals, which need {INTERVAL_ROUNDS} rounds a side; --repetitions sets another",
            a.repetitions
        ));
    }
    if top.contains_key("worker_metrics") {
        lines.push("the frozen plan's worker_metrics is left out: a campaign scrapes each arm it starts at /metrics on the arm's origin (an arm's own worker_metrics sets another)".into());
    }
}

/// One arm of the plan, and the recipe fields its command does not say.
fn arm_json(
    s: &ArmSpec,
    endpoint_path: &str,
    frozen_health: Option<&str>,
) -> (Value, Vec<&'static str>) {
    let origin = "http://127.0.0.1:{port}";
    let mut arm = Map::new();
    arm.insert("name".into(), json!(s.name));
    arm.insert("lane".into(), json!(s.lane.as_str()));
    if s.reference {
        arm.insert("reference".into(), json!(true));
    }
    arm.insert("endpoint".into(), json!(format!("{origin}{endpoint_path}")));
    if let Some(h) = s.health.as_deref().or(frozen_health) {
        arm.insert("health_endpoint".into(), json!(format!("{origin}{h}")));
    }
    let said = recipe_of(&s.command);
    let mut recipe = Map::new();
    let mut missing = Vec::new();
    for (key, value) in RECIPE_KEYS.into_iter().zip(said) {
        let value = value.unwrap_or_else(|| {
            missing.push(key);
            UNKNOWN.to_string()
        });
        recipe.insert(key.into(), json!(value));
    }
    arm.insert("recipe".into(), Value::Object(recipe));
    let mut start = Map::new();
    start.insert("command".into(), json!(s.command));
    if !s.env.is_empty() {
        start.insert("env".into(), Value::Object(s.env.clone()));
    }
    if let Some(t) = &s.health_timeout {
        start.insert("health_timeout_seconds".into(), t.clone());
    }
    arm.insert("start".into(), Value::Object(start));
    (Value::Object(arm), missing)
}

/// Serving programs and the runtime they are (a program's file name, or the top package
/// of `python -m PACKAGE.module`).
const RUNTIMES: &[(&str, &str)] = &[
    ("vllm", "vllm"),
    ("transformers", "transformers"),
    ("transformers-cli", "transformers"),
    ("llama-server", "llama.cpp"),
    ("llama_cpp", "llama.cpp"),
    ("sglang", "sglang"),
    ("text-generation-launcher", "tgi"),
    ("ollama", "ollama"),
    ("trtllm-serve", "tensorrt-llm"),
    ("lmdeploy", "lmdeploy"),
];

/// Programs that start another program: the runtime is not theirs.
const LAUNCHERS: &[&str] = &[
    "sh",
    "bash",
    "zsh",
    "dash",
    "env",
    "exec",
    "sudo",
    "nohup",
    "nice",
    "time",
    "timeout",
    "taskset",
    "numactl",
    "docker",
    "podman",
    "apptainer",
    "singularity",
    "uv",
    "uvx",
    "poetry",
    "conda",
    "pipx",
    "{self}",
];

/// What a start command says of its recipe, in [`RECIPE_KEYS`] order; `None` where it
/// says nothing. The built-in mock has no weights and runs on the CPU. Otherwise: the
/// runtime from the program ([`RUNTIMES`], else its file name; nothing for a launcher
/// such as `sh`); the weight format from `--dtype` (`--torch-dtype`), else `gguf` for a
/// `.gguf` argument; the quantization from `--quantization` / `-q` only (a checkpoint
/// can be quantized with no flag, so its absence does not say "none"); the device from
/// `--device`.
fn recipe_of(argv: &[String]) -> [Option<String>; 4] {
    // `env K=V ... CMD`: the command is CMD.
    let words: &[String] = match argv.first().map(String::as_str) {
        Some("env") => {
            let at = argv
                .iter()
                .skip(1)
                .position(|w| !w.contains('=') && !w.starts_with('-'))
                .map_or(argv.len(), |i| i + 1);
            &argv[at..]
        }
        _ => argv,
    };
    if words.first().map(String::as_str) == Some("{self}")
        && words.get(1).map(String::as_str) == Some("mock-worker")
    {
        return ["matrix-proxy built-in mock", "none", "none", "cpu"].map(|s| Some(s.to_string()));
    }
    let weight_format =
        flag_value(words, &["--dtype", "--torch-dtype", "--torch_dtype"]).or_else(|| {
            words
                .iter()
                .any(|w| w.to_ascii_lowercase().ends_with(".gguf"))
                .then(|| "gguf".to_string())
        });
    [
        runtime_of(words),
        weight_format,
        flag_value(words, &["--quantization", "-q"]),
        flag_value(words, &["--device"]),
    ]
}

/// The runtime a command runs, when its program says it.
fn runtime_of(words: &[String]) -> Option<String> {
    let first = words.first()?;
    let program = first.rsplit('/').next().unwrap_or(first);
    let known = |name: &str| {
        RUNTIMES
            .iter()
            .find(|(p, _)| *p == name)
            .map(|(_, r)| r.to_string())
    };
    if program.starts_with("python") {
        let at = words.iter().position(|w| w == "-m")?;
        let package = words.get(at + 1)?.split('.').next()?;
        return known(package).or_else(|| Some(package.to_string()));
    }
    if LAUNCHERS.contains(&program) {
        return None;
    }
    known(program).or_else(|| Some(program.to_string()))
}

/// The value of the first of `names` in `words`: `--flag VALUE` or `--flag=VALUE`.
fn flag_value(words: &[String], names: &[&str]) -> Option<String> {
    words.iter().enumerate().find_map(|(i, w)| {
        names.iter().find_map(|n| {
            if w == n {
                words
                    .get(i + 1)
                    .filter(|v| !v.is_empty() && !v.starts_with('-'))
                    .cloned()
            } else {
                w.strip_prefix(n)
                    .and_then(|r| r.strip_prefix('='))
                    .filter(|v| !v.is_empty())
                    .map(str::to_string)
            }
        })
    })
}

pub(super) fn lock_cmd(a: &LockArgs) -> Result<Exit, CliError> {
    let by = a.by.trim();
    if by.is_empty() {
        return Err(usage(
            "--by: name who fixes the thresholds (a person or a team); it is recorded as locked_by",
        ));
    }
    let path = &a.contract;
    let bytes = read_bounded(
        path,
        MAX_CONTRACT_BYTES,
        "contract",
        "a contract holds thresholds, not data",
    )
    .map_err(report_error)?;
    let at = clock::iso_utc(clock::wall_now_us());
    let (stamped, c) = contract::lock(&bytes, &at, by).map_err(|e| match e {
        LockRefusal::Locked(m) => usage(format!("{}: {m}", path.display())),
        LockRefusal::Invalid(e) => usage(format!(
            "{}: not locked, it does not validate: {e}",
            path.display()
        )),
    })?;
    replace_file(path, &stamped)?;
    let thresholds = match serde_json::to_value(c.thresholds) {
        Ok(Value::Object(m)) => m
            .iter()
            .map(|(k, v)| match v {
                Value::Null => format!("{k} not applied"),
                v => format!("{k} {v}"),
            })
            .collect::<Vec<_>>()
            .join(", "),
        _ => String::new(),
    };
    eprintln!(
        "matrix-proxy: locked {}: contract_version {}, plan_id '{}', locked_at {at}, locked_by '{by}'; thresholds in force: {thresholds}",
        path.display(),
        c.version,
        c.plan_id
    );
    eprintln!(
        "matrix-proxy: its sha256 is {}: `replay --contract` records it, and a verdict with a contract edited since is post hoc",
        rundir::sha256_hex(&stamped)
    );
    Ok(Exit::Ok)
}

/// Replace `path` with `bytes` whole or not at all: a temporary file in the same folder,
/// written and synced, then renamed over it.
fn replace_file(path: &Path, bytes: &[u8]) -> Result<(), CliError> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "contract.json".into());
    let tmp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    let written = std::fs::File::create(&tmp).and_then(|mut f| {
        f.write_all(bytes)?;
        f.sync_all()
    });
    let renamed = written.and_then(|()| std::fs::rename(&tmp, path));
    if renamed.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    renamed.map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied => {
            usage(format!("{}: cannot rewrite it: {e}", path.display()))
        }
        _ => tool(format!("{}: cannot rewrite it: {e}", path.display())),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(s: &str) -> Vec<String> {
        shlex::split(s).unwrap_or_default()
    }

    fn said(cmd: &str) -> [Option<String>; 4] {
        recipe_of(&argv(cmd))
    }

    fn some(v: [&str; 4]) -> [Option<String>; 4] {
        v.map(|s| (s != "-").then(|| s.to_string()))
    }

    #[test]
    fn a_recipe_is_read_from_what_the_command_says() {
        assert_eq!(
            said("transformers serve ./model --dtype float32 --port {port}"),
            some(["transformers", "float32", "-", "-"])
        );
        assert_eq!(
            said("/opt/bin/vllm serve m --dtype=bfloat16 -q awq --device cuda --port {port}"),
            some(["vllm", "bfloat16", "awq", "cuda"])
        );
        assert_eq!(
            said("env HF_HUB_OFFLINE=1 llama-server -m model.Q4.gguf --port {port}"),
            some(["llama.cpp", "gguf", "-", "-"])
        );
        assert_eq!(
            said("python3 -m sglang.launch_server --quantization=fp8 --port {port}"),
            some(["sglang", "-", "fp8", "-"])
        );
        assert_eq!(
            said("{self} mock-worker --listen 127.0.0.1:{port}"),
            some(["matrix-proxy built-in mock", "none", "none", "cpu"])
        );
        // A launcher says nothing of the runtime; a flag without its value says nothing.
        assert_eq!(
            said("sh -c 'exec srv --port $1' sh {port}"),
            some(["-", "-", "-", "-"])
        );
        assert_eq!(
            said("my-server --dtype"),
            some(["my-server", "-", "-", "-"])
        );
    }

    #[test]
    fn arm_flags_are_split_as_a_shell_would() {
        let s = arm_spec(
            "--arm",
            r#"bf16:fit=srv --title "two words" --x='a b' c\ d --port {port}"#,
            false,
        )
        .ok()
        .unwrap_or_else(|| panic!("parses"));
        assert_eq!((s.name.as_str(), s.lane), ("bf16", Lane::PerformanceFit));
        assert_eq!(
            s.command,
            [
                "srv",
                "--title",
                "two words",
                "--x=a b",
                "c d",
                "--port",
                "{port}"
            ]
        );
        let err = |raw: &str, reference: bool| {
            arm_spec(
                if reference { "--reference" } else { "--arm" },
                raw,
                reference,
            )
            .err()
            .map(|e| e.message)
            .unwrap_or_default()
        };
        assert!(err("twin", false).contains("give NAME=COMMAND"));
        assert!(err(r#"twin=srv "open"#, false).contains("unbalanced quote"));
        assert!(err("../x=srv", false).contains("must be letters, digits"));
        assert!(err("a:slow=srv", false).contains("'slow' is not a lane"));
        assert!(err("a:fit=srv", true).contains("the reference is in the quality lane"));
        assert!(err("a=  ", false).contains("is empty"));
    }
}
