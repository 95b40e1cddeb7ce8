//! The workload of a plan and its hash: what is sent and how it is judged and loaded —
//! the cases (requests, headers, paths, oracles, ignore paths), the budget (requests per
//! case, concurrency, repetitions, warm-up, timeout) and the load policies (connection,
//! on_failure; an open loop's `load`; the `slo`) and the decisions pointer — without what only describes or addresses it
//! (`name`, `description`, `metadata`, `endpoint`, `health_endpoint`, `auth`, `arms`,
//! `evidence_class`, `schedule`, `drift`, `worker_metrics`, a request's `prompt_tokens`). Two runs of one workload against two recipes
//! benchmarked apart share the hash, so `compare` can put them side by side.
//!
//! Canonical form: top-level values as the plan resolved them (defaults written out, so
//! leaving `repetitions` out and writing its default hash alike), a case's `method`,
//! `expected_status` and `ignore_paths` (and a variant's `ignore_paths`) likewise, every
//! object's keys sorted, serialised compactly; the
//! hash is SHA-256 of that text (`report::config_json::workload_sha256`).

use serde_json::{Value, json};

use super::plan::Plan;

/// The canonical workload of a plan parsed from `root`.
pub(crate) fn workload(root: &Value, plan: &Plan) -> Value {
    let cases: Vec<Value> = root
        .get("cases")
        .and_then(Value::as_array)
        .map(|cases| {
            cases
                .iter()
                .zip(&plan.cases)
                .map(|(raw, case)| {
                    let mut c = raw.as_object().cloned().unwrap_or_default();
                    c.insert("method".into(), json!(case.method.as_str()));
                    c.insert("expected_status".into(), json!(case.expected_status));
                    c.entry("ignore_paths").or_insert(json!([]));
                    c.shift_remove("prompt_tokens");
                    if let Some(s) = &case.sessions {
                        c.insert("history".into(), json!(s.history.as_str()));
                    }
                    if let Some(Value::Array(vs)) = c.get_mut("variants") {
                        for v in vs.iter_mut().filter_map(Value::as_object_mut) {
                            v.entry("ignore_paths").or_insert(json!([]));
                            v.shift_remove("prompt_tokens");
                        }
                    }
                    Value::Object(c)
                })
                .collect()
        })
        .unwrap_or_default();
    let top_ignore = root.get("ignore_paths").cloned().unwrap_or(json!([]));
    let mut w = json!({
        "cases": cases,
        "ignore_paths": top_ignore,
        "decisions_pointer": plan.decisions_pointer.as_str(),
        "requests_per_case": plan.requests_per_case,
        "concurrency": plan.concurrency,
        "repetitions": plan.repetitions,
        "warmup_per_case": plan.warmup_per_case,
        "timeout_seconds": plan.timeout_seconds,
        "connection": plan.connection.as_str(),
        "on_failure": plan.on_failure.as_str(),
    });
    // An open loop's or a trace's load and a plan's slo are part of the workload; a closed plan
    // without them hashes as it did before they existed.
    if plan.load.mode.is_open() {
        w["load"] = plan.load.to_json();
    }
    if let Some(slo) = &plan.slo {
        w["slo"] = super::load::slo_json(slo);
    }
    crate::oracle::sort_keys(w)
}

/// The first place two canonical workloads differ: a JSON pointer into the workload and
/// each side's value there (shortened), or `None` when they are equal.
pub(crate) fn first_difference(a: &Value, b: &Value) -> Option<(String, String, String)> {
    telling_difference(a, b).or_else(|| any_difference(a, b))
}

/// The differences a reader recognises first, in this order: a case's name (the cases are
/// other cases, not other requests), then the load's mode (closed or open loop).
fn telling_difference(a: &Value, b: &Value) -> Option<(String, String, String)> {
    let names = |w: &Value| -> Vec<Option<Value>> {
        let cases = w.get("cases").and_then(Value::as_array);
        cases.map_or_else(Vec::new, |c| {
            c.iter().map(|c| c.get("name").cloned()).collect()
        })
    };
    let (na, nb) = (names(a), names(b));
    for i in 0..na.len().max(nb.len()) {
        let (x, y) = (na.get(i).cloned().flatten(), nb.get(i).cloned().flatten());
        if x != y {
            return Some((
                format!("/cases/{i}/name"),
                shown(x.as_ref()),
                shown(y.as_ref()),
            ));
        }
    }
    let closed = json!("closed");
    let mode = |w: &Value| {
        w.pointer("/load/mode")
            .cloned()
            .unwrap_or_else(|| closed.clone())
    };
    let (ma, mb) = (mode(a), mode(b));
    (ma != mb).then(|| ("/load/mode".into(), shown(Some(&ma)), shown(Some(&mb))))
}

/// The first difference in key order, anywhere.
fn any_difference(a: &Value, b: &Value) -> Option<(String, String, String)> {
    fn walk(
        a: Option<&Value>,
        b: Option<&Value>,
        at: &mut String,
    ) -> Option<(String, String, String)> {
        match (a, b) {
            (Some(Value::Object(x)), Some(Value::Object(y))) => {
                let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
                keys.sort();
                keys.dedup();
                for k in keys {
                    let len = at.len();
                    at.push('/');
                    crate::oracle::escape_token(k, at);
                    if let Some(d) = walk(x.get(k), y.get(k), at) {
                        return Some(d);
                    }
                    at.truncate(len);
                }
                None
            }
            (Some(Value::Array(x)), Some(Value::Array(y))) => {
                for i in 0..x.len().max(y.len()) {
                    let len = at.len();
                    at.push_str(&format!("/{i}"));
                    if let Some(d) = walk(x.get(i), y.get(i), at) {
                        return Some(d);
                    }
                    at.truncate(len);
                }
                None
            }
            (x, y) if x == y => None,
            (x, y) => Some((at.clone(), shown(x), shown(y))),
        }
    }
    walk(Some(a), Some(b), &mut String::new())
}

fn shown(v: Option<&Value>) -> String {
    match v {
        None => "absent".into(),
        Some(v) => {
            let s = v.to_string();
            if s.chars().count() > 80 {
                format!("{}...", s.chars().take(77).collect::<String>())
            } else {
                s
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const META: &str = r#""gpu_ids": "N/A", "driver": "N/A", "cuda": "N/A",
        "precision": "N/A", "model_revision": "m", "runtime_revision": "r", "cache_policy": "none",
        "cuda_evidence": "N/A", "reservation": "N/A", "host": "h""#;

    const PLAN: &str = r#"{"name": "a", "endpoint": "http://127.0.0.1:1/v1/x",
        "metadata": {"gpu": "x", META}, "timeout_seconds": 2,
        "cases": [{"name": "c", "request": {"b": 1, "a": [1, 2]}, "expected_response": {"ok": true}}],
        "concurrency": [1], "requests_per_case": 4}"#;

    /// The workload and its canonical serialisation (what is hashed).
    fn hash_of(text: &str) -> (Value, String) {
        let text = text.replace("META", META);
        let plan = Plan::from_json_bytes(text.as_bytes()).expect("plan");
        let w = plan.workload.clone();
        let h = w.to_string();
        (w, h)
    }

    #[test]
    fn the_hash_ignores_what_only_describes_or_addresses_the_workload() {
        let (w, h) = hash_of(PLAN);
        // Another name, endpoint, metadata, key order, and defaults written out.
        let same = r#"{"requests_per_case": 4, "concurrency": [1], "name": "b",
            "endpoint": "http://10.0.0.1:8000/v1/x", "metadata": {"gpu": "y", META},
            "timeout_seconds": 2.0,
            "description": "other", "repetitions": 2, "warmup_per_case": 2,
            "drift": {"numeric_pointers": ["/ok"]},
            "cases": [{"expected_response": {"ok": true}, "name": "c", "method": "POST",
                       "request": {"a": [1, 2], "b": 1}, "ignore_paths": []}]}"#;
        let (w2, h2) = hash_of(same);
        assert_eq!((first_difference(&w, &w2), h.clone()), (None, h2));
        // What is sent or how much of it is not.
        let other = PLAN.replace("\"b\": 1", "\"b\": 2");
        let (w3, h3) = hash_of(&other);
        assert_ne!(h, h3);
        assert_eq!(
            first_difference(&w, &w3),
            Some(("/cases/0/request/b".into(), "1".into(), "2".into()))
        );
        let (w4, _) =
            hash_of(&PLAN.replace("\"requests_per_case\": 4", "\"requests_per_case\": 5"));
        assert_eq!(
            first_difference(&w, &w4),
            Some(("/requests_per_case".into(), "4".into(), "5".into()))
        );
        let (w5, _) = hash_of(&PLAN.replace("[1, 2]", "[1, 2, 3]"));
        assert_eq!(
            first_difference(&w, &w5),
            Some(("/cases/0/request/a/2".into(), "absent".into(), "3".into()))
        );
    }

    #[test]
    fn case_names_and_the_load_mode_are_named_before_any_other_difference() {
        let (w, _) = hash_of(PLAN);
        // Another case name (and other expectations, earlier in key order).
        let renamed = PLAN
            .replace("\"name\": \"c\"", "\"name\": \"d\"")
            .replace("{\"ok\": true}", "{\"ok\": false}");
        let (w2, _) = hash_of(&renamed);
        assert_eq!(
            first_difference(&w, &w2),
            Some(("/cases/0/name".into(), "\"c\"".into(), "\"d\"".into()))
        );
        // An open loop of the same cases: its mode, not /concurrency/0.
        let open = PLAN.replace(
            "\"concurrency\": [1], \"requests_per_case\": 4",
            "\"load\": {\"mode\": \"open\", \"rates_per_second\": [5], \"duration_seconds\": 1}",
        );
        let (w3, _) = hash_of(&open);
        assert_eq!(
            first_difference(&w, &w3),
            Some(("/load/mode".into(), "\"closed\"".into(), "\"open\"".into()))
        );
    }
}
