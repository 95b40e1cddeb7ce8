//! The campaign half of the command line: a contract checked before a run
//! (`replay --contract`), drift added to campaign.json after it, and the two commands that
//! read finished runs: `verdict` (a contract's gates on one campaign run) and `compare`
//! (two runs of one workload: drift and every metric's delta, optionally a verdict).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::{CliError, Exit, read_json, tool, usage};
use crate::clock;
use crate::config::campaign::Lane;
use crate::config::contract::Contract;
use crate::config::plan::Plan;
use crate::config::workload;
use crate::drift::{self, Answers, Options};
use crate::oracle::Pointer;
use crate::record::rundir;
use crate::report::config_json;
use crate::report::verdict::{self, Provenance};

/// Contracts are small; a larger file is not one.
const MAX_CONTRACT_BYTES: u64 = 1 << 20;

/// Read and validate a contract file (exit 2 with the file's name on any problem).
pub(crate) fn load_contract(path: &Path) -> Result<Contract, CliError> {
    let bytes = super::read_bounded(
        path,
        MAX_CONTRACT_BYTES,
        "contract",
        "a contract holds thresholds, not data",
    )?;
    Contract::from_json_bytes(&bytes, rundir::sha256_hex(&bytes))
        .map_err(|e| usage(format!("{}: {e}", path.display())))
}

/// A contract must name the plan (`plan_id` = the plan's `name`) and be locked no later
/// than the run started.
pub(crate) fn check_contract(
    c: &Contract,
    path: &Path,
    plan_name: Option<&str>,
    started_at_us: i64,
) -> Result<(), CliError> {
    if plan_name != Some(c.plan_id.as_str()) {
        return Err(usage(format!(
            "{}: plan_id '{}' is not this plan's name ({}); a contract is written for one plan",
            path.display(),
            c.plan_id,
            plan_name.map_or("the plan has no name".to_string(), |n| format!("'{n}'"))
        )));
    }
    if c.locked_at_us > started_at_us {
        return Err(usage(format!(
            "{}: locked_at {} is later than the run's start ({}); a contract is fixed before the numbers exist",
            path.display(),
            c.locked_at,
            crate::clock::iso_utc(started_at_us)
        )));
    }
    Ok(())
}

/// config.json's record of the contract a run was started with.
pub(crate) fn contract_record(c: &Contract, path: &Path) -> Value {
    json!({
        "path": path.display().to_string(),
        "sha256": c.sha256,
        "plan_id": c.plan_id,
        "locked_at": c.locked_at,
        "locked_by": c.locked_by,
    })
}

/// Read every side's measured `ok` answers of a run: keyed by arm (`None` outside
/// campaigns).
pub(crate) fn read_answers(
    exchanges: &Path,
    plan: &Plan,
) -> Result<BTreeMap<Option<String>, Answers>, String> {
    let mut sides: BTreeMap<Option<String>, Answers> = BTreeMap::new();
    let no_paths: Vec<Pointer> = Vec::new();
    crate::record::read::for_each_measured_answer(exchanges, |row| {
        let side = sides.entry(row.arm.clone()).or_default();
        let key = drift::Key {
            case: row.case_name,
            variant: row.variant,
            concurrency: row.concurrency,
            repetition: row.repetition,
            dispatch_index: row.dispatch_index,
        };
        if row.truncated {
            side.truncated.insert(key);
            return;
        }
        let ignore = plan
            .cases
            .iter()
            .find(|c| c.name == key.case)
            .and_then(|c| c.variants.iter().find(|v| v.name == key.variant))
            .map_or(&no_paths, |v| &v.ignore_paths);
        let a = drift::answer(&row.body, row.is_stream, ignore);
        side.by_key.insert(key, a);
    })?;
    Ok(sides)
}

fn options(plan: &Plan) -> Options<'_> {
    Options {
        numeric_pointers: &plan.drift_numeric_pointers,
        decisions_pointer: &plan.decisions_pointer,
    }
}

/// Add `drift` (one entry per available non-reference arm) to a campaign.json, from the
/// recorded answers in `exchanges`.
pub(crate) fn add_drift(campaign: &mut Value, exchanges: &Path, plan: &Plan) -> Result<(), String> {
    let mut sides = read_answers(exchanges, plan)?;
    let reference_name = campaign["reference_arm"].as_str().map(str::to_string);
    let reference = sides.remove(&reference_name).unwrap_or_default();
    let opts = options(plan);
    let mut entries = Vec::new();
    for arm in campaign["arms"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or(&[])
    {
        let name = arm["name"].as_str().map(str::to_string);
        if arm["available"] != json!(true) || name == reference_name {
            continue;
        }
        let answers = sides.remove(&name).unwrap_or_default();
        entries.push(entry(
            name.as_deref().unwrap_or("?"),
            arm["lane"].as_str().unwrap_or("quality"),
            reference_name.as_deref().unwrap_or("?"),
            &reference,
            &answers,
            &opts,
        ));
    }
    campaign["drift"] = Value::Array(entries);
    campaign["definitions"]["drift"] = drift::definitions();
    Ok(())
}

fn entry(
    name: &str,
    lane: &str,
    reference: &str,
    r: &Answers,
    a: &Answers,
    opts: &Options<'_>,
) -> Value {
    let mut e = json!({
        "arm": name,
        "lane": lane,
        "advisory": lane == Lane::PerformanceFit.as_str(),
        "reference_arm": reference,
    });
    if let (Value::Object(m), Value::Object(d)) = (&mut e, drift::drift(r, a, opts)) {
        m.extend(d);
    }
    e
}

/// One line per drift entry, for the terminal.
pub(crate) fn drift_text(entries: &[Value]) -> String {
    let mut out = String::new();
    for e in entries {
        let pct = |k: &str| {
            e[k].as_f64()
                .map_or("n/a".into(), |x| format!("{:.1} %", x * 100.0))
        };
        out.push_str(&format!(
            "drift {} vs {} ({}{}): {} pairs, exact match {}, mean similarity {}\n",
            e["arm"].as_str().unwrap_or("?"),
            e["reference_arm"].as_str().unwrap_or("?"),
            e["lane"].as_str().unwrap_or("?"),
            if e["advisory"] == json!(true) {
                ", advisory"
            } else {
                ""
            },
            e["compared_prompts"],
            pct("exact_match_rate"),
            e["mean_similarity"]
                .as_f64()
                .map_or("n/a".into(), |x| format!("{x:.3}")),
        ));
    }
    out
}

/// A finished run directory as `verdict` and `compare` read it.
struct Run {
    dir: PathBuf,
    config: Value,
    plan: Plan,
    summary: Option<Value>,
    campaign: Option<Value>,
}

impl Run {
    fn open(dir: &Path) -> Result<Run, CliError> {
        let config = super::run_config(dir)?;
        if config["command"] != json!("replay") {
            return Err(usage(format!(
                "{}: not a replay run (config.json says command {})",
                dir.display(),
                config["command"]
            )));
        }
        let plan = super::run_plan(dir, &config)?;
        // Absent is fine (a crashed run has no summary; a plain run no campaign.json);
        // present but unreadable is an error, not a different kind of run.
        let optional = |name: &str| -> Result<Option<Value>, CliError> {
            let p = dir.join(name);
            if p.exists() {
                read_json(&p).map(Some)
            } else {
                Ok(None)
            }
        };
        Ok(Run {
            dir: dir.to_path_buf(),
            summary: optional("summary.json")?,
            campaign: optional("campaign.json")?,
            config,
            plan,
        })
    }

    fn started_at_us(&self) -> Result<i64, CliError> {
        let s = self.config["started_at"].as_str().unwrap_or("");
        clock::parse_rfc3339_us(s).map_err(|e| {
            usage(format!(
                "{}: config.json started_at {s:?}: {e}",
                self.dir.display()
            ))
        })
    }

    /// campaign.json with drift (computed from the recorded answers when the run's own
    /// campaign.json has none, as in runs made before drift existed).
    fn campaign_with_drift(&self) -> Result<Value, CliError> {
        let mut c = self.campaign.clone().ok_or_else(|| {
            usage(format!(
                "{}: no campaign.json; a verdict needs a campaign run (a plan with arms), or two runs with `compare --contract`",
                self.dir.display()
            ))
        })?;
        if c.get("drift").is_none_or(Value::is_null) {
            self.recorded()?;
            add_drift(&mut c, &self.dir.join("exchanges"), &self.plan).map_err(tool)?;
        }
        Ok(c)
    }

    /// Refuse a run made with `--no-record`: drift is read from the recorded answers, and
    /// an empty exchanges/ would read as an arm that matched nothing.
    fn recorded(&self) -> Result<(), CliError> {
        if self.config["extra"]["recording"]["exchanges"] == json!(false) {
            return Err(usage(format!(
                "{}: the run was made with --no-record, so there are no recorded answers to compare (drift, and the gates that read it, need them)",
                self.dir.display()
            )));
        }
        Ok(())
    }
}

/// The `verdict` command: a contract's gates on a finished campaign run. Written to
/// `RUN/verdict.json` when the contract is the one the run was started with, else to
/// `RUN/verdict.post-hoc.json` (never over the pre-registered verdict), or to `--out`.
pub(crate) fn verdict_cmd(
    dir: &Path,
    contract_path: &Path,
    out: Option<&Path>,
) -> Result<Exit, CliError> {
    let run = Run::open(dir)?;
    let contract = load_contract(contract_path)?;
    let campaign = run.campaign_with_drift()?;
    let name = campaign["plan_id"].as_str().or(run.plan.name.as_deref());
    check_contract(&contract, contract_path, name, run.started_at_us()?)?;
    let post_hoc = match run.config["contract"]["sha256"].as_str() {
        Some(h) if h == contract.sha256 => None,
        Some(h) => Some(format!(
            "the run was started with another contract (SHA-256 {h}); this one ({}) was not locked in before the numbers",
            contract.sha256
        )),
        None => Some("the run was started without --contract; this contract was not locked in before the numbers".to_string()),
    };
    if let Some(why) = &post_hoc {
        eprintln!("matrix-proxy: warning: post-hoc verdict: {why}");
    }
    let v = verdict::verdict_json(
        &campaign,
        &Provenance {
            contract: &contract,
            contract_path: &contract_path.display().to_string(),
            run_id: run.config["run_id"].as_str(),
            run_started_at: run.config["started_at"].as_str(),
            run_ending: run.summary.as_ref().and_then(|s| s["ending"].as_str()),
            post_hoc: post_hoc.clone(),
        },
    );
    let default = if post_hoc.is_some() {
        "verdict.post-hoc.json"
    } else {
        "verdict.json"
    };
    let path = out.map_or_else(|| dir.join(default), Path::to_path_buf);
    write_json(&path, &v)?;
    super::print_stdout(&verdict::verdict_text(&v), "the verdict", dir).map_err(tool)?;
    eprintln!("matrix-proxy: verdict written to {}", path.display());
    Ok(Exit::Ok)
}

fn write_json(path: &Path, v: &Value) -> Result<(), CliError> {
    rundir::write_json_at(path, v).map_err(|e| tool(e.to_string()))
}

/// One side of a comparison: a campaign arm, or a plain run (`None`).
type Side = Option<String>;

/// The sides of two runs to compare: both plain (or one side each) pair with each other;
/// otherwise arms pair by name, and the rest are listed as unmatched.
fn pair_sides(a: &[Side], b: &[Side]) -> (Vec<(Side, Side)>, Vec<String>) {
    if a.len() == 1 && b.len() == 1 {
        return (vec![(a[0].clone(), b[0].clone())], Vec::new());
    }
    let pairs: Vec<(Side, Side)> = a
        .iter()
        .filter(|s| b.contains(s))
        .map(|s| (s.clone(), s.clone()))
        .collect();
    let unmatched = a
        .iter()
        .map(|s| ("A", s))
        .chain(b.iter().map(|s| ("B", s)))
        .filter(|(_, s)| !pairs.iter().any(|(x, _)| x == *s))
        .map(|(r, s)| format!("{r}:{}", s.as_deref().unwrap_or("run")))
        .collect();
    (pairs, unmatched)
}

fn sides_of(run: &Run) -> Vec<Side> {
    match &run.campaign {
        Some(c) => c["arms"]
            .as_array()
            .map(|arms| {
                arms.iter()
                    .filter(|a| a["available"] == json!(true))
                    .filter_map(|a| a["name"].as_str().map(|n| Some(n.to_string())))
                    .collect()
            })
            .unwrap_or_default(),
        None => vec![None],
    }
}

/// What `compare` was asked.
pub(crate) struct CompareArgs<'a> {
    pub(crate) a: &'a Path,
    pub(crate) b: &'a Path,
    pub(crate) contract: Option<&'a Path>,
    /// The lane of B's side when B is not a campaign (a campaign arm keeps its own).
    pub(crate) lane: Lane,
    pub(crate) out: &'a Path,
}

/// The `compare` command.
pub(crate) fn compare_cmd(args: &CompareArgs<'_>) -> Result<Exit, CliError> {
    let (a, b) = (Run::open(args.a)?, Run::open(args.b)?);
    let (wa, wb) = (&a.plan.workload, &b.plan.workload);
    if let Some((at, x, y)) = workload::first_difference(wa, wb) {
        return Err(usage(format!(
            "{} and {} ran different workloads (workload SHA-256 {} vs {}): they first differ at {} ({x} in {}, {y} in {}); compare runs of one workload",
            args.a.display(),
            args.b.display(),
            config_json::workload_sha256(&a.plan),
            config_json::workload_sha256(&b.plan),
            if at.is_empty() {
                "the root"
            } else {
                at.as_str()
            },
            args.a.display(),
            args.b.display(),
        )));
    }
    for (run, path) in [(&a, args.a), (&b, args.b)] {
        if run.plan.load.mode == crate::config::load::Mode::Open || run.plan.sweep.is_some() {
            return Err(usage(format!(
                "{}: an open-loop run{}: compare pairs levels, cells and drift by concurrency, which open-loop rounds do not have; compare the two runs' rounds.parquet by target_rate_per_second instead (latency_from_schedule_*, good_requests_per_second)",
                path.display(),
                if run.plan.sweep.is_some() {
                    " (--sweep)"
                } else {
                    ""
                }
            )));
        }
    }
    let (pairs, unmatched) = pair_sides(&sides_of(&a), &sides_of(&b));
    if pairs.is_empty() {
        return Err(usage(format!(
            "{} and {} have no side in common to compare (unmatched: {}); campaign arms pair by name",
            args.a.display(),
            args.b.display(),
            unmatched.join(", ")
        )));
    }
    a.recorded()?;
    b.recorded()?;
    let answers = [
        read_answers(&a.dir.join("exchanges"), &a.plan).map_err(tool)?,
        read_answers(&b.dir.join("exchanges"), &b.plan).map_err(tool)?,
    ];
    let none = Answers::default();
    let of = |i: usize, s: &Side| answers[i].get(s).unwrap_or(&none);
    let opts = options(&a.plan);
    let label = |s: &Side| s.clone().unwrap_or_else(|| "run".into());
    let lane_of = |s: &Side| match (&b.campaign, s) {
        (Some(c), Some(n)) => c["arms"]
            .as_array()
            .and_then(|arms| arms.iter().find(|x| x["name"] == json!(n)))
            .and_then(|x| x["lane"].as_str())
            .unwrap_or("quality")
            .to_string(),
        _ => args.lane.as_str().to_string(),
    };
    // B's side `sb` against A's side `sa`.
    let pair_drift = |sa: &Side, sb: &Side| {
        entry(
            &format!("B:{}", label(sb)),
            &lane_of(sb),
            &format!("A:{}", label(sa)),
            of(0, sa),
            of(1, sb),
            &opts,
        )
    };
    let drift_entries: Vec<Value> = pairs
        .iter()
        .map(|(sa, sb)| {
            let mut e = pair_drift(sa, sb);
            e["side_a"] = json!(sa);
            e["side_b"] = json!(sb);
            e
        })
        .collect();
    let metrics =
        crate::report::compare::metric_deltas(a.summary.as_ref(), b.summary.as_ref(), &pairs);
    let mut doc = json!({
        "schema_version": 1,
        "run_a": {"dir": args.a.display().to_string(), "run_id": a.config["run_id"], "plan_id": a.plan.name},
        "run_b": {"dir": args.b.display().to_string(), "run_id": b.config["run_id"], "plan_id": b.plan.name},
        "workload_sha256": config_json::workload_sha256(&a.plan),
        "pairs": pairs.iter().map(|(x, y)| json!({"a": x, "b": y})).collect::<Vec<_>>(),
        "unmatched_sides": unmatched,
        "drift": drift_entries,
        "metrics": metrics,
        "definitions": {"drift": drift::definitions(), "metrics": crate::report::compare::definitions()},
    });
    let mut text = crate::report::compare::table(&doc);
    text.push_str(&drift_text(
        doc["drift"].as_array().map(Vec::as_slice).unwrap_or(&[]),
    ));
    if let Some(path) = args.contract {
        let computed = doc["drift"].as_array().cloned().unwrap_or_default();
        let v = compare_verdict(&a, &b, &pairs, path, &lane_of, &|i, sa| {
            // The pair's own drift when its A side is the reference; else against it.
            match computed.get(i) {
                Some(e) if pairs[i].0 == *sa => e.clone(),
                _ => pair_drift(sa, &pairs[i].1),
            }
        })?;
        text.push_str(&verdict::verdict_text(&v));
        doc["verdict"] = v;
    }
    let out = args.out;
    write_json(out, &doc)?;
    super::print_stdout(&text, "the comparison", out).map_err(tool)?;
    eprintln!("matrix-proxy: comparison written to {}", out.display());
    Ok(Exit::Ok)
}

/// A contract on two runs: run A's side is the reference (quality lane), each of B's
/// sides a candidate in its lane, its drift taken against that reference (`drift_of(i,
/// reference)` for pair i);
/// cells are the runs' campaign.json cells, or for a plain run the cells its recorded
/// rows give. Always post hoc unless both runs were started with this contract.
fn compare_verdict(
    a: &Run,
    b: &Run,
    pairs: &[(Side, Side)],
    path: &Path,
    lane_of: &dyn Fn(&Side) -> String,
    drift_of: &dyn Fn(usize, &Side) -> Value,
) -> Result<Value, CliError> {
    let contract = load_contract(path)?;
    let name = a.plan.name.as_deref();
    check_contract(
        &contract,
        path,
        name,
        a.started_at_us()?.min(b.started_at_us()?),
    )?;
    let recorded =
        |r: &Run| r.config["contract"]["sha256"].as_str() == Some(contract.sha256.as_str());
    let post_hoc = (!(recorded(a) && recorded(b))).then(|| {
        "compare evaluates a contract on two runs: it is pre-registered only when both runs were started with it".to_string()
    });
    if let Some(why) = &post_hoc {
        eprintln!("matrix-proxy: warning: post-hoc verdict: {why}");
    }
    // The reference: A's reference arm when A is a campaign, else A's one side.
    let sa: Side = match &a.campaign {
        Some(c) => c["reference_arm"].as_str().map(str::to_string),
        None => pairs[0].0.clone(),
    };
    let mut arms = vec![arm_view(a, &sa, "A", "quality", true)?];
    let mut drift = Vec::new();
    for (i, (_, sb)) in pairs.iter().enumerate() {
        arms.push(arm_view(b, sb, "B", &lane_of(sb), false)?);
        drift.push(drift_of(i, &sa));
    }
    let campaign = json!({
        "plan_id": a.plan.name,
        "evidence_class": a.campaign.as_ref().map_or(Value::Null, |c| c["evidence_class"].clone()),
        "reference_arm": arms[0]["name"],
        "arms": arms,
        "drift": drift,
    });
    let v = verdict::verdict_json(
        &campaign,
        &Provenance {
            contract: &contract,
            contract_path: &path.display().to_string(),
            run_id: None,
            run_started_at: None,
            run_ending: None,
            post_hoc,
        },
    );
    Ok(v)
}

/// One side of a run as a campaign.json arm (name `A:<side>` / `B:<side>`).
fn arm_view(
    run: &Run,
    side: &Side,
    tag: &str,
    lane: &str,
    reference: bool,
) -> Result<Value, CliError> {
    let name = format!("{tag}:{}", side.as_deref().unwrap_or("run"));
    let from_campaign = run.campaign.as_ref().and_then(|c| {
        c["arms"]
            .as_array()
            .and_then(|arms| {
                arms.iter()
                    .find(|x| side.as_deref().is_some_and(|n| x["name"] == json!(n)))
            })
            .cloned()
    });
    let mut arm = match from_campaign {
        Some(a) => a,
        None => json!({"available": true, "concurrency": plain_cells(run)?}),
    };
    arm["name"] = json!(name);
    arm["lane"] = json!(lane);
    arm["reference"] = json!(reference);
    Ok(arm)
}

/// A plain run's cells (per concurrency, every case pooled), from its recorded rows and
/// its rounds' wall time; memory is not sampled outside campaigns.
fn plain_cells(run: &Run) -> Result<Value, CliError> {
    use crate::report::campaign::{Level, cell};
    let mut levels: BTreeMap<usize, Level> = BTreeMap::new();
    for f in crate::record::read::read_row_facts(&run.dir.join("exchanges")).map_err(tool)? {
        if f.phase == "measured"
            && let Some(c) = f.concurrency
        {
            levels
                .entry(c.max(0) as usize)
                .or_default()
                .samples
                .push(f.sample);
        }
    }
    for r in run
        .summary
        .as_ref()
        .and_then(|s| s["rounds"].as_array())
        .map(Vec::as_slice)
        .unwrap_or(&[])
    {
        if let (Some(c), Some(e)) = (r["concurrency"].as_u64(), r["elapsed_seconds"].as_f64())
            && let Some(l) = levels.get_mut(&(c as usize))
        {
            // Completeness as a campaign's cells count it (drivers/replay/arms.rs): every
            // planned round ran its whole budget.
            l.planned_rounds = run.plan.cases.len() * run.plan.repetitions;
            l.attempted_rounds +=
                usize::from(r["attempted_requests"].as_u64() == r["planned_requests"].as_u64());
            l.elapsed_seconds += e;
        }
    }
    Ok(Value::Object(
        levels
            .iter()
            .map(|(c, l)| (c.to_string(), cell(l, None)))
            .collect(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::drift::Key;

    fn answers(texts: &[&str]) -> Answers {
        Answers {
            by_key: texts
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    let key = Key {
                        case: "c".into(),
                        variant: None,
                        concurrency: 1,
                        repetition: 0,
                        dispatch_index: i as i64,
                    };
                    (key, drift::answer(t.as_bytes(), false, &[]))
                })
                .collect(),
            truncated: Default::default(),
        }
    }

    fn with_opts(f: impl FnOnce(&Options<'_>)) {
        let decisions = Pointer::parse("/answers").expect("pointer");
        f(&Options {
            numeric_pointers: &[],
            decisions_pointer: &decisions,
        });
    }

    #[test]
    fn the_recipe_benchmarks_drift_cases_with_their_lanes() {
        with_opts(lanes);
    }

    fn lanes(opts: &Options<'_>) {
        // An identical runtime in the quality lane.
        let reference = answers(&["the capital is Paris", "4"]);
        let e = entry(
            "twin",
            "quality",
            "ref",
            &reference,
            &answers(&["the capital is Paris", "4"]),
            opts,
        );
        assert_eq!(
            (
                &e["compared_prompts"],
                &e["exact_match_rate"],
                &e["mean_similarity"],
                &e["advisory"]
            ),
            (&json!(2), &json!(1.0), &json!(1.0), &json!(false))
        );
        // Paris vs Lyon in the performance-fit lane.
        let reference = answers(&["the capital is Paris"]);
        let e = entry(
            "q4",
            "performance-fit",
            "ref",
            &reference,
            &answers(&["the capital is Lyon"]),
            opts,
        );
        assert_eq!(
            (&e["exact_match_rate"], &e["advisory"]),
            (&json!(0.0), &json!(true))
        );
        let sim = e["mean_similarity"].as_f64().expect("similarity");
        assert!(sim > 0.0 && sim < 1.0, "{sim}");
        assert_eq!(e["prompts"][0]["first_divergence_char"], json!(15));
        assert_eq!(
            (
                &e["prompts"][0]["reference_chars"],
                &e["prompts"][0]["arm_chars"]
            ),
            (&json!(20), &json!(19))
        );
    }

    #[test]
    fn truncated_answers_are_left_out_not_unpaired() {
        with_opts(truncated);
    }

    fn truncated(opts: &Options<'_>) {
        let reference = answers(&["a", "b"]);
        let mut arm = answers(&["a", "b"]);
        let (key, _) = arm.by_key.pop_last().expect("two answers");
        arm.truncated.insert(key);
        let e = entry("x", "quality", "ref", &reference, &arm, opts);
        assert_eq!(
            (
                &e["compared_prompts"],
                &e["truncated_answers_left_out"],
                &e["unpaired_reference_answers"]
            ),
            (&json!(1), &json!(1), &json!(0))
        );
    }
}
