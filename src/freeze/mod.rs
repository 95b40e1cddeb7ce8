//! `freeze`: recorded exchanges (a serve run of live traffic, a replay run of a capture
//! plan, a campaign's arm) into a frozen plan that validates and replays as is.
//!
//! The life of a freeze: each run is opened with the one reader of a finished run
//! ([`FinishedRun`]) and its rows read back with their bodies (`collect.rs` keeps the
//! first answer to each distinct request and compares every repeat with it;
//! `evidence.rs` says which leaves were volatile and whether the content differed);
//! `write.rs` lays the plan out, and the plan is validated here before anyone sees it.
//! Nothing is sent and no run is changed.

mod collect;
mod contracts;
mod evidence;
mod sessions;
mod timing;
mod write;

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

pub(crate) use contracts::OracleChoice;
use evidence::VOLATILE_POINTERS;
pub(crate) use timing::TraceFile;
pub(crate) use write::{
    Budget, Head, PlanBytesError, fill_metadata, head_map, plan_bytes, session_json, turn_json,
};

use crate::config::plan::{DEFAULT_DECISIONS_POINTER, Plan};
use crate::model::Endpoint;
use crate::record::{read, rundir};
use crate::report::doc::config::Command;
use crate::report::error::ReportError;
use crate::run::open::FinishedRun;

/// What `freeze` was asked for.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    pub(crate) runs: Vec<PathBuf>,
    /// A campaign run's arm (default: its reference).
    pub(crate) arm: Option<String>,
    /// Replaces the recorded endpoint.
    pub(crate) endpoint: Option<Endpoint>,
    pub(crate) bearer_token_env: Option<String>,
    /// The plan's `name` (`--name`).
    pub(crate) name: Option<String>,
    /// `--metadata FILE`, read.
    pub(crate) metadata: Option<Map<String, Value>>,
    pub(crate) budget: Budget,
    /// `--keep-timing`: a trace plan, its entries in a file of this name beside the plan
    /// when they are too many to sit in it (`Some(None)`: no file can be written).
    pub(crate) keep_timing: Option<Option<String>>,
    /// `--oracle`: each request's recorded answer, or the contract it declares.
    pub(crate) oracle: OracleChoice,
}

/// A frozen plan and what the freeze has to say about it.
#[derive(Debug)]
pub(crate) struct Frozen {
    /// The plan file's bytes (pretty JSON, a final newline).
    pub(crate) plan: Vec<u8>,
    /// Lines for stderr: what was frozen, left out, guessed or found nondeterministic.
    pub(crate) lines: Vec<String>,
    /// `--keep-timing`'s trace file, to be written beside the plan.
    pub(crate) trace: Option<TraceFile>,
}

/// Why a freeze cannot be made.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FreezeError {
    /// The runs or the flags cannot make a plan (exit 2), with the fix.
    #[error("{0}")]
    Refused(String),
    /// A run cannot be read.
    #[error(transparent)]
    Run(#[from] ReportError),
    /// A row that would be frozen has a URL no recorder writes (`part` names the file).
    #[error("{part}: exchange_id {id}: {source}")]
    Damaged {
        part: String,
        id: i64,
        #[source]
        source: collect::UnreadableUrl,
    },
    /// An exchange id is recorded twice (`place` says where): files copied by hand.
    #[error(
        "exchange_id {id} is recorded {place}: a run records each exchange once, so its files were copied or merged by hand and its answers would count twice; remove the copied part (freeze several runs by naming each)"
    )]
    DuplicateId { id: i64, place: String },
    /// `--keep-timing` of more entries than a plan holds, without `--out`.
    #[error(transparent)]
    NeedsFile(#[from] timing::NeedsFile),
    /// The frozen plan would pass the size `validate` and `replay` read.
    #[error(
        "{0}: every distinct request and its recorded answer becomes a variant with its oracle; freeze a run with fewer or smaller answers"
    )]
    TooLarge(#[source] PlanBytesError),
    /// The frozen plan does not validate.
    #[error("the frozen plan does not validate, so it is not written: {0}")]
    Invalid(#[source] crate::config::json::PlanError),
}

/// One source run as the freeze reads it.
struct Source {
    run: FinishedRun,
    /// The arm whose exchanges are frozen (a campaign run).
    arm: Option<String>,
    /// Where its requests went, as recorded (secret query values `<redacted>`).
    endpoint: String,
    /// The health check's path, when it is not `/health`: a replay's own, or serve's
    /// under its upstream's path prefix.
    health_path: Option<String>,
    /// The variable a replayed plan read its bearer token from.
    bearer_env: Option<String>,
    /// A replay's plan metadata (with the arm's over it).
    metadata: Option<Map<String, Value>>,
    /// Content besides `/choices`: the plan's decisions container.
    decisions: String,
}

/// Freeze `opts.runs` into a plan.
pub(crate) fn freeze(opts: &Options) -> Result<Frozen, FreezeError> {
    let sources: Vec<Source> = opts
        .runs
        .iter()
        .map(|d| source(d, opts.arm.as_deref()))
        .collect::<Result<_, _>>()?;
    let endpoint = endpoint(&sources, opts.endpoint.as_ref())?;
    let mut content: Vec<String> = sources.iter().map(|s| s.decisions.clone()).collect();
    content.dedup();
    let mut collected = collect::Collected::new(content);
    if opts.keep_timing.is_some() {
        refuse_timing(&sources)?;
    }
    let mut timed = opts.keep_timing.as_ref().map(|_| Vec::new());
    let passed = collect_rows(&sources, &mut collected, timed.as_mut())?;
    if collected.cases.is_empty() {
        return Err(FreezeError::Refused(format!(
            "no exchange of {} can be frozen ({} read; {}): a plan needs at least one request answered 2xx with its whole body recorded",
            runs_named(&sources),
            collected.rows,
            skipped_text(&collected)
        )));
    }
    let bearer_token_env = bearer_env(opts, &sources, &collected)?;
    let mut lines: Vec<String> = sources.iter().filter_map(newer_schema).collect();
    let metadata = metadata(opts.metadata.as_ref(), &sources, &mut lines);
    let head = write::Head {
        name: opts.name.clone(),
        description: description(&sources),
        endpoint: endpoint.url(),
        health_endpoint: sources
            .iter()
            .find_map(|s| s.health_path.as_deref())
            .map(|p| endpoint.with_path(p).url()),
        bearer_token_env,
        metadata,
    };
    let case_names = write::case_names(&collected.cases);
    let mut chains: Vec<Option<sessions::Chains>> =
        collected.cases.iter().map(sessions::chains).collect();
    // A trace plan's entries name turns of sessions only where the capture's order holds
    // whole runs of them.
    if let Some(timed) = timed.as_mut() {
        chains = timing::timed_sessions(chains, &collected.cases, timed, &case_names, &mut lines);
    }
    let chosen = (&case_names[..], &chains[..]);
    contracts::apply(&mut collected.cases, opts.oracle, chosen, &mut lines);
    say_sessions(&collected, &chains, opts.keep_timing.is_some(), &mut lines);
    let budget = budget(opts, &collected, &chains, &mut lines);
    let mut value = write::plan_json(&head, &budget, &collected.cases, &chains);
    let trace = match (timed, &opts.keep_timing) {
        (Some(timed), Some(file)) => Some(keep_timing(
            &mut value,
            (&collected.cases, &chains),
            timed,
            file.as_deref(),
        )?),
        _ => None,
    };
    let plan = write::plan_bytes(&value, crate::config::plan::MAX_PLAN_BYTES)
        .map_err(FreezeError::TooLarge)?;
    drop(value);
    let trace = match trace {
        Some(t) => {
            check_trace(&plan, t.file.as_ref())?;
            lines.push(t.line);
            t.file
        }
        None => None,
    };
    match Plan::from_json_bytes(&plan) {
        Err(e) => return Err(FreezeError::Invalid(e)),
        Ok(p) => lines.extend(p.unmeasured_variants()),
    }
    report(&collected, &mut lines, passed);
    Ok(Frozen { plan, lines, trace })
}

/// `--keep-timing` reads one run's clock: several runs' clocks do not line up, and a
/// sharded run's shards each have their own.
fn refuse_timing(sources: &[Source]) -> Result<(), FreezeError> {
    if sources.len() > 1 {
        return Err(FreezeError::Refused(
            "--keep-timing takes one RUN: each run has its own clock, so the exchanges of several cannot be put on one timeline; freeze each run with --keep-timing".into(),
        ));
    }
    if sources.iter().any(|s| s.run.is_sharded()) {
        return Err(FreezeError::Refused(
            "--keep-timing does not take a sharded run: freeze the unsharded capture (serve's run) with it".into(),
        ));
    }
    Ok(())
}

/// The frozen plan `value` (of `cases`) made a trace plan of the `timed` exchanges.
fn keep_timing(
    value: &mut Value,
    (cases, chains): (&[collect::Case], &[Option<sessions::Chains>]),
    timed: Vec<timing::Timed>,
    file: Option<&str>,
) -> Result<timing::TraceLoad, FreezeError> {
    let t = timing::trace_load(timed, cases, chains, file)?;
    let load = serde_json::to_value(&t.load).unwrap_or_default();
    if let Value::Object(m) = std::mem::take(value) {
        *value = Value::Object(timing::as_trace_plan(m, load));
    }
    Ok(t)
}

/// A trace plan's file entries, read back against the plan they belong to: every entry
/// names a case and variant the plan has.
fn check_trace(plan: &[u8], file: Option<&TraceFile>) -> Result<(), FreezeError> {
    let (Ok(p), Some(f)) = (Plan::from_json_bytes(plan), file) else {
        return Ok(());
    };
    let Some(t) = &p.load.trace else {
        return Ok(());
    };
    let crate::config::load::TraceSource::File { sha256, .. } = &t.source else {
        return Ok(());
    };
    let names = crate::config::trace_names(&p.cases, t.synthetic_rules);
    crate::config::trace::Trace::read(f.bytes.as_slice(), &names, sha256)
        .map(|_| ())
        .map_err(|e| {
            FreezeError::Refused(format!(
                "internal: the trace freeze wrote does not read back against its plan: {e}"
            ))
        })
}

/// Rows read but passed over as no workload of the frozen arm.
#[derive(Debug, Clone, Copy, Default)]
struct Passed {
    /// Exchanges of another arm of a campaign run.
    other_arms: u64,
    /// Health checks (replay's own, or live probes of the health path).
    health: u64,
}

/// Every row of every source into `collected`, or the refusal a damaged run earns (an
/// exchange id read twice, a URL no recorder writes); the rows passed over, counted.
fn collect_rows(
    sources: &[Source],
    collected: &mut collect::Collected,
    mut timed: Option<&mut Vec<timing::Timed>>,
) -> Result<Passed, FreezeError> {
    let mut passed = Passed::default();
    for s in sources {
        // The health endpoint is replay's own check, not workload: probes of it in live
        // traffic (a load balancer's, `wait_http`'s) are not frozen either.
        let health_path = s.health_path.as_deref().unwrap_or("/health");
        for dir in exchange_dirs(&s.run) {
            let mut ids = UniqueIds::default();
            let mut refused = None;
            read::for_each_exchange(&dir, |part, row| {
                let id = row.exchange_id;
                if refused.is_some() {
                    return;
                }
                if let Err(e) = ids.see(part, id) {
                    refused = Some(e);
                } else if s.arm.is_some() && row.arm != s.arm {
                    passed.other_arms += 1;
                } else if row.phase == "health"
                    || (row.method == "GET"
                        && collect::origin_form(&row.url).as_deref() == Some(health_path))
                {
                    passed.health += 1;
                } else {
                    let start_offset_us = row.start_offset_us;
                    match collected.take(row) {
                        Err(source) => {
                            refused = Some(FreezeError::Damaged {
                                part: part.display().to_string(),
                                id,
                                source,
                            });
                        }
                        Ok(Some((case, variant))) => {
                            if let Some(t) = timed.as_deref_mut() {
                                t.push(timing::Timed {
                                    start_offset_us,
                                    exchange_id: id,
                                    case,
                                    variant,
                                });
                            }
                        }
                        Ok(None) => {}
                    }
                }
            })
            .map_err(ReportError::Rows)?;
            if let Some(e) = refused {
                return Err(e);
            }
        }
    }
    Ok(passed)
}

/// The bearer token's variable: the flag, else the one the replayed plans named (when
/// they agree); refused when the requests carried a token and none is named.
fn bearer_env(
    opts: &Options,
    sources: &[Source],
    collected: &collect::Collected,
) -> Result<Option<String>, FreezeError> {
    let from_plans = sources
        .first()
        .and_then(|f| f.bearer_env.clone())
        .filter(|e| {
            sources
                .iter()
                .all(|s| s.bearer_env.as_deref() == Some(e.as_str()))
        });
    match (
        opts.bearer_token_env.clone().or(from_plans),
        collected.bearer,
    ) {
        (None, true) => Err(FreezeError::Refused(
            "the captured requests carried an Authorization header (recorded as <redacted>, so the token is not in the run): name the environment variable replay reads the token from with --bearer-token-env NAME; the plan records only that name".into(),
        )),
        (env, _) => Ok(env),
    }
}

/// The flags' budget, with a covering `requests_per_case` when none is given (said in
/// `lines`).
fn budget(
    opts: &Options,
    collected: &collect::Collected,
    chains: &[Option<sessions::Chains>],
    lines: &mut Vec<String>,
) -> Budget {
    let mut budget = opts.budget.clone();
    // A trace plan has no closed-loop budget: its entries are its load.
    if budget.requests_per_case.is_none() && opts.keep_timing.is_none() {
        // A case frozen as sessions dispatches sessions.
        let counts: Vec<usize> = collected
            .cases
            .iter()
            .zip(chains)
            .map(|(c, ch)| ch.as_ref().map_or(c.variants.len(), |ch| ch.sessions.len()))
            .collect();
        let highest = budget.concurrency.iter().copied().max().unwrap_or(1);
        let n = crate::config::plan::covering_requests_per_case(&counts, highest);
        budget.requests_per_case = Some(n);
        lines.push(format!(
            "requests_per_case {n}: every measured round sends each of the {} distinct request(s) (a multiple of each case's variant count, or of the largest where their common multiple would be over 4 times it, at least the highest concurrency, {highest}); --requests-per-case sets another",
            counts.iter().sum::<usize>()
        ));
    }
    budget
}

/// A line per case frozen as sessions: its requests, sessions and turns.
fn say_sessions(
    collected: &collect::Collected,
    chains: &[Option<sessions::Chains>],
    timed: bool,
    lines: &mut Vec<String>,
) {
    let dispatched = if timed {
        "each turn a trace entry at its recorded start (a turn 1's starts a run)"
    } else {
        "requests_per_case counts its sessions"
    };
    let names = write::case_names(&collected.cases);
    for ((c, ch), name) in collected.cases.iter().zip(chains).zip(&names) {
        let Some(ch) = ch else {
            // The affinity header is never a case key: say it is gone when no sessions
            // took it.
            if let Some((h, _)) = c.variants.iter().find_map(|v| v.session.as_ref()) {
                lines.push(format!(
                    "case '{name}': its requests' {h} header is left out of the plan (a session's identity, not a case's key), and no request continues another, so they are not frozen as sessions"
                ));
            }
            continue;
        };
        let turns: usize = ch.sessions.iter().map(Vec::len).sum();
        lines.push(format!(
            "case '{name}': {} distinct chat request(s) continue one another (each the last one's messages, its answer, then more): frozen as {} session(s) of {turns} turn(s) in all, history frozen{}; {dispatched}",
            c.variants.len(),
            ch.sessions.len(),
            ch.header
                .as_ref()
                .map(|h| format!(", each named by its {h} header"))
                .unwrap_or_default()
        ));
    }
}

/// A warning when a run's config.json says a newer schema than this build writes: a later
/// version made the run, and what it added (keys, columns) is not read here.
fn newer_schema(s: &Source) -> Option<String> {
    let theirs = s.run.config.schema_version.as_str();
    let ours = crate::record::SCHEMA_VERSION;
    let newer = match (theirs.parse::<u64>(), ours.parse::<u64>()) {
        (Ok(t), Ok(o)) => t > o,
        // Not a number this build knows (a run from before the key has none).
        _ => !theirs.is_empty() && theirs != ours,
    };
    newer.then(|| {
        format!(
            "warning: {}: schema_version {theirs:?} is newer than this matrix-proxy's {ours:?}: a later version wrote the run, and what it added is not read here; check the plan, or freeze with the version that made the run",
            s.run.dir.join(rundir::CONFIG).display()
        )
    })
}

/// The exchange ids of one `exchanges/` folder, as spans of consecutive ids read from one
/// part (a run's ids mostly come in order, so this holds a few spans, never more than a
/// span a row). A run records each exchange once: an id read twice means its files were
/// copied or merged by hand, and its answers would count twice.
#[derive(Default)]
struct UniqueIds {
    parts: Vec<PathBuf>,
    /// First id -> (last id, index in `parts`).
    spans: std::collections::BTreeMap<i64, (i64, usize)>,
}

impl UniqueIds {
    fn see(&mut self, part: &Path, id: i64) -> Result<(), FreezeError> {
        if self.parts.last().map(PathBuf::as_path) != Some(part) {
            self.parts.push(part.to_path_buf());
        }
        let here = self.parts.len() - 1;
        let before = self.spans.range_mut(..=id).next_back();
        match before {
            Some((_, (last, at))) if id <= *last => {
                let first = &self.parts[*at];
                let place = if *at == here {
                    format!("twice in {}", part.display())
                } else {
                    format!("in {} and again in {}", first.display(), part.display())
                };
                Err(FreezeError::DuplicateId { id, place })
            }
            Some((_, (last, at))) if last.checked_add(1) == Some(id) && *at == here => {
                *last = id;
                Ok(())
            }
            _ => {
                self.spans.insert(id, (id, here));
                Ok(())
            }
        }
    }
}

/// Open one run and say what of it is frozen.
fn source(dir: &Path, arm: Option<&str>) -> Result<Source, FreezeError> {
    let run = FinishedRun::open(dir)?;
    run.refuse_single_shard("freeze")?;
    run.refuse_unrecorded("freeze reads the recorded requests and answers")?;
    let name = dir.display();
    match run.config.command {
        Command::Serve => {
            if arm.is_some() {
                return Err(FreezeError::Refused(format!(
                    "--arm: {name} is a serve run, not a campaign run; leave --arm out"
                )));
            }
            let upstream = run.config.serve().map(|s| s.upstream.clone());
            // Behind a path prefix (`--upstream http://h/v2`), the worker's health check
            // is under it too.
            let prefix = upstream
                .as_deref()
                .and_then(|u| Endpoint::parse(u).ok())
                .map(|e| e.path_and_query.trim_end_matches('/').to_string())
                .filter(|p| !p.is_empty());
            Ok(Source {
                endpoint: upstream.unwrap_or_default(),
                arm: None,
                health_path: prefix.map(|p| format!("{p}/health")),
                bearer_env: None,
                metadata: None,
                decisions: DEFAULT_DECISIONS_POINTER.into(),
                run,
            })
        }
        Command::Replay => {
            let plan = run.replay_plan()?;
            let replay = run.config.replay();
            let decisions = plan.decisions_pointer.as_str().to_string();
            let mut metadata = plan.metadata.clone();
            let health_path = replay
                .and_then(|r| Endpoint::parse(&r.health_endpoint).ok())
                .map(|h| h.path_and_query)
                .filter(|p| p != "/health");
            let (arm, endpoint) = match (run.campaign()?, arm) {
                (None, Some(_)) => {
                    return Err(FreezeError::Refused(format!(
                        "--arm: {name} is not a campaign run; leave --arm out"
                    )));
                }
                (None, None) => (None, replay.map(|r| r.endpoint.clone()).unwrap_or_default()),
                (Some(k), wanted) => {
                    let chosen = match wanted {
                        Some(w) => k.arms.iter().find(|a| a.name == w),
                        None => k.arms.iter().find(|a| a.reference),
                    };
                    if let Some(a) = chosen.filter(|a| !a.available) {
                        return Err(FreezeError::Refused(format!(
                            "--arm {}: the arm was unavailable in {name} ({}): none of its answers can be frozen",
                            a.name,
                            a.unavailable_reason
                                .as_deref()
                                .unwrap_or("no reason recorded")
                        )));
                    }
                    let Some(a) = chosen else {
                        let names: Vec<&str> = k.arms.iter().map(|a| a.name.as_str()).collect();
                        return Err(FreezeError::Refused(format!(
                            "--arm {}: {name} has arms {} (default: the reference)",
                            wanted.unwrap_or("(reference)"),
                            names.join(", ")
                        )));
                    };
                    metadata.extend(a.metadata.clone());
                    (Some(a.name.clone()), a.endpoint.clone().unwrap_or_default())
                }
            };
            Ok(Source {
                bearer_env: plan.bearer_token_env.clone(),
                arm,
                endpoint,
                health_path,
                metadata: Some(metadata),
                decisions,
                run,
            })
        }
    }
}

/// A run's exchanges folders: its own, or every shard's.
fn exchange_dirs(run: &FinishedRun) -> Vec<PathBuf> {
    if run.is_sharded() {
        run.shards
            .iter()
            .map(|s| rundir::shard_exchanges(&run.dir, s.index))
            .collect()
    } else {
        vec![run.exchanges()]
    }
}

/// The plan's endpoint: `--endpoint`, else the one every source sent to.
fn endpoint(sources: &[Source], flag: Option<&Endpoint>) -> Result<Endpoint, FreezeError> {
    if let Some(e) = flag {
        return Ok(e.clone());
    }
    let mut found: Option<Endpoint> = None;
    for s in sources {
        let dir = s.run.dir.display();
        if s.endpoint.contains("<redacted>") {
            return Err(FreezeError::Refused(format!(
                "{dir}: its endpoint {} held a secret query value (recorded as <redacted>); give the plan's endpoint with --endpoint URL",
                s.endpoint
            )));
        }
        let e = Endpoint::parse(&s.endpoint).map_err(|e| {
            FreezeError::Refused(format!(
                "{dir}: recorded endpoint {:?}: {e}; give the plan's endpoint with --endpoint URL",
                s.endpoint
            ))
        })?;
        match &found {
            Some(f) if (&f.scheme, &f.host, f.port) != (&e.scheme, &e.host, e.port) => {
                return Err(FreezeError::Refused(format!(
                    "the runs sent to different origins ({} and {}); give the plan's endpoint with --endpoint URL",
                    f.url(),
                    e.url()
                )));
            }
            Some(_) => {}
            None => found = Some(e),
        }
    }
    found.ok_or_else(|| FreezeError::Refused("no run given".into()))
}

/// `--metadata`, else the replayed plans' own when they agree; every required key not
/// given is "unknown: ..." and named in a line.
fn metadata(
    given: Option<&Map<String, Value>>,
    sources: &[Source],
    lines: &mut Vec<String>,
) -> Map<String, Value> {
    let mut m = match given {
        Some(m) => m.clone(),
        None => {
            let first = sources.first().and_then(|s| s.metadata.clone());
            match first {
                Some(f) if sources.iter().all(|s| s.metadata.as_ref() == Some(&f)) => {
                    lines.push(format!(
                        "metadata: taken from the replayed plan of {}; give --metadata FILE to state this setup's",
                        runs_named(sources)
                    ));
                    f
                }
                _ => Map::new(),
            }
        }
    };
    write::fill_metadata(&mut m, lines);
    m
}

fn runs_named(sources: &[Source]) -> String {
    let ids: Vec<&str> = sources
        .iter()
        .map(|s| s.run.config.run_id.as_str())
        .collect();
    format!("run {}", ids.join(", "))
}

/// The plan's description: where it came from, with the runs' plan and binary hashes.
fn description(sources: &[Source]) -> String {
    let each: Vec<String> = sources
        .iter()
        .map(|s| {
            let c = &s.run.config;
            let binary = c.tool.binary_sha256.as_deref().unwrap_or("unknown");
            match (c.replay(), &s.arm) {
                (Some(r), Some(arm)) => format!(
                    "replay run {} (arm {arm}; plan sha256 {}, binary sha256 {binary})",
                    c.run_id, r.plan_sha256
                ),
                (Some(r), None) => format!(
                    "replay run {} (plan sha256 {}, binary sha256 {binary})",
                    c.run_id, r.plan_sha256
                ),
                (None, _) => format!("serve run {} (binary sha256 {binary})", c.run_id),
            }
        })
        .collect();
    format!(
        "Frozen by matrix-proxy freeze from {}. Each oracle is the first recorded answer, or the contract its request declares (freeze --oracle); ignore_paths are the leaves that differed between answers and the documented volatile fields.",
        each.join(" and ")
    )
}

fn skipped_text(c: &collect::Collected) -> String {
    if c.skipped.is_empty() {
        return "none left out".into();
    }
    let each: Vec<String> = c.skipped.iter().map(|(r, n)| format!("{n} {r}")).collect();
    format!("left out: {}", each.join("; "))
}

/// The lines that say what was frozen, left out and found nondeterministic.
fn report(c: &collect::Collected, lines: &mut Vec<String>, passed: Passed) {
    let Passed { other_arms, health } = passed;
    let variants: usize = c.cases.iter().map(|k| k.variants.len()).sum();
    lines.insert(
        0,
        format!(
            "froze {variants} distinct request(s) in {} case(s) from {} of {} recorded exchange(s)",
            c.cases.len(),
            c.kept,
            c.rows + other_arms + health
        ),
    );
    if other_arms > 0 {
        lines.push(format!("{other_arms} exchange(s) of other arms not read"));
    }
    if health > 0 {
        lines.push(format!(
            "{health} health check(s) not frozen (GET of the health endpoint: replay checks it itself)"
        ));
    }
    for (reason, n) in &c.skipped {
        lines.push(format!("left out: {n} exchange(s): {reason}"));
    }
    if !c.secret_headers.is_empty() {
        let names: Vec<&str> = c.secret_headers.keys().map(String::as_str).collect();
        lines.push(format!(
            "warning: requests carried {} (secret; recorded as <redacted>): a plan cannot hold them, so a replay sends none (only auth.bearer_token_env's Authorization)",
            names.join(", ")
        ));
    }
    if !c.unprintable_headers.is_empty() {
        let names: Vec<&str> = c.unprintable_headers.iter().map(String::as_str).collect();
        lines.push(format!(
            "warning: headers {} left out: their values are not printable ASCII (a plan's rule)",
            names.join(", ")
        ));
    }
    report_repeats(c, lines);
}

/// Say which requests were answered more than once and differed, and the ignore paths
/// learnt from the repeats (or, for requests answered once, the defaults).
fn report_repeats(c: &collect::Collected, lines: &mut Vec<String>) {
    let names = write::case_names(&c.cases);
    let mut repeated = 0;
    let mut differed = Vec::new();
    let mut single_defaults = false;
    for (case, name) in c.cases.iter().zip(&names) {
        let variant_names = write::variant_names(case);
        for (v, variant_name) in case.variants.iter().zip(&variant_names) {
            if v.answers > 1 {
                repeated += 1;
            } else if !write::variant_ignore(v).is_empty() {
                single_defaults = true;
            }
            if v.differed > 0 {
                let variant = if case.variants.len() > 1 {
                    format!(" variant '{variant_name}'")
                } else {
                    String::new()
                };
                let judged = match &v.contract {
                    Some(p) => format!(": judged by {} instead", p.field().0),
                    None => String::new(),
                };
                differed.push(format!(
                    "  case '{name}'{variant}: {} of {} answers differed from the first, first at {}{judged}",
                    v.differed,
                    v.answers,
                    v.first_difference.as_deref().unwrap_or("?")
                ));
            }
        }
    }
    let learnt: std::collections::BTreeSet<&str> = c
        .cases
        .iter()
        .flat_map(|k| &k.variants)
        .flat_map(|v| &v.volatile)
        .map(String::as_str)
        .filter(|p| !VOLATILE_POINTERS.contains(p))
        .collect();
    if !learnt.is_empty() {
        lines.push(format!(
            "ignore paths learnt from repeated answers: {}; check that none of them is the answer itself (any leaf outside /choices and the decisions container that changed while the rest agreed counts as a stamp)",
            learnt.into_iter().collect::<Vec<_>>().join(", ")
        ));
    }
    if single_defaults {
        lines.push(format!(
            "requests answered once: the documented volatile fields ({}) are ignored where present; repeat the traffic (or freeze several runs) to learn the others from evidence",
            VOLATILE_POINTERS.join(", ")
        ));
    }
    lines.push(format!(
        "{} of {repeated} requests answered differently on repeat{}",
        differed.len(),
        if differed.is_empty() {
            ""
        } else {
            " (nondeterministic: those not judged by a contract are frozen from the first answer, so a replay of them may fail; give the server greedy, seeded settings, declare a contract in the request (response_format json_schema, tools) or drop them from the plan):"
        }
    ));
    lines.extend(differed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exchange_id_read_twice_is_refused_wherever_it_repeats() {
        let (a, b) = (
            Path::new("x/part-00000.parquet"),
            Path::new("x/part-00001.parquet"),
        );
        let mut ids = UniqueIds::default();
        // In order, out of order, with gaps and at the ends of the range: all distinct.
        for id in [0, 1, 2, 5, 4, 3, 9, i64::MAX, i64::MIN, -1] {
            assert!(ids.see(a, id).is_ok(), "{id}");
        }
        assert!(ids.spans.len() < 10, "consecutive ids share a span");
        for id in [6, 7, 8, 10] {
            assert!(ids.see(b, id).is_ok(), "{id}");
        }
        let again = ids.see(b, 4).unwrap_err();
        assert!(matches!(again, FreezeError::DuplicateId { id: 4, .. }));
        let again = again.to_string();
        assert!(
            again.starts_with(
                "exchange_id 4 is recorded in x/part-00000.parquet and again in x/part-00001.parquet"
            ),
            "{again}"
        );
        let twice = ids.see(b, 7).unwrap_err().to_string();
        assert!(
            twice.starts_with("exchange_id 7 is recorded twice in x/part-00001.parquet"),
            "{twice}"
        );
        assert!(matches!(
            ids.see(b, i64::MAX),
            Err(FreezeError::DuplicateId { id: i64::MAX, .. })
        ));
    }
}
