//! `compare`'s metric deltas: for each pair of sides (a campaign arm, or a plain run) and
//! each (case, concurrency) both runs measured, every metric of summary.json's
//! `round_aggregates` with both runs' spread across rounds (min, median, max) and the
//! delta of the medians, B - A.

use serde_json::{Map, Value, json};

/// The metrics the terminal table shows (compare.json has every one).
const SHOWN: [(&str, &str, f64); 5] = [
    ("successful_requests_per_second", "req/s", 1.0),
    ("latency_p50_seconds", "p50 ms", 1e3),
    ("latency_p95_seconds", "p95 ms", 1e3),
    ("ttft_p50_seconds", "TTFT p50 ms", 1e3),
    ("output_tokens_per_second_mean", "tok/s/req", 1.0),
];

fn aggregates<'a>(summary: Option<&'a Value>, side: &Option<String>) -> Vec<&'a Value> {
    summary
        .and_then(|s| s["round_aggregates"].as_array())
        .map(|a| {
            a.iter()
                .filter(|g| g["arm"].as_str().map(str::to_string) == *side)
                .collect()
        })
        .unwrap_or_default()
}

/// One entry per (pair, case, concurrency) in either run.
pub(crate) fn metric_deltas(
    a: Option<&Value>,
    b: Option<&Value>,
    pairs: &[(Option<String>, Option<String>)],
) -> Vec<Value> {
    let mut out = Vec::new();
    for (sa, sb) in pairs {
        let (ga, gb) = (aggregates(a, sa), aggregates(b, sb));
        let key = |g: &Value| (g["case"].clone(), g["concurrency"].clone());
        // Every (case, concurrency) of either run, once, in A's order then B's.
        let mut keys: Vec<(Value, Value)> = Vec::new();
        for k in ga.iter().chain(&gb).map(|g| key(g)) {
            if !keys.contains(&k) {
                keys.push(k);
            }
        }
        for k in keys {
            let x = ga.iter().find(|g| key(g) == k);
            let y = gb.iter().find(|g| key(g) == k);
            let mut metrics = Map::new();
            let names = x
                .or(y)
                .and_then(|g| g["metrics"].as_object())
                .map(|m| m.keys().cloned().collect::<Vec<_>>())
                .unwrap_or_default();
            for name in names {
                let (ma, mb) = (
                    x.map(|g| &g["metrics"][&name]),
                    y.map(|g| &g["metrics"][&name]),
                );
                let med = |m: Option<&Value>| m.and_then(|m| m["median"].as_f64());
                let delta = med(ma).zip(med(mb)).map(|(p, q)| q - p);
                let relative = med(ma)
                    .zip(delta)
                    .filter(|(p, _)| *p != 0.0)
                    .map(|(p, d)| d / p);
                metrics.insert(
                    name,
                    json!({"a": ma.cloned(), "b": mb.cloned(), "delta": delta, "relative_delta": relative}),
                );
            }
            out.push(json!({
                "side_a": sa, "side_b": sb, "case": k.0, "concurrency": k.1,
                "in_a": x.is_some(), "in_b": y.is_some(),
                "metrics": metrics,
            }));
        }
    }
    out
}

/// What compare.json's metric entries mean.
pub(crate) fn definitions() -> Value {
    json!({
        "a": "run A's aggregate across its rounds (rounds, min, median, max, relative_spread), from its summary.json",
        "b": "run B's, likewise",
        "delta": "median of B - median of A",
        "relative_delta": "delta / median of A (null when A's median is 0 or either is missing)",
    })
}

/// The terminal table: per pair, case and concurrency, the shown metrics' medians with
/// each run's [min-max] and the relative change.
pub(crate) fn table(doc: &Value) -> String {
    let mut out = format!(
        "compare A={} B={} (workload {})\n",
        doc["run_a"]["dir"].as_str().unwrap_or("?"),
        doc["run_b"]["dir"].as_str().unwrap_or("?"),
        &doc["workload_sha256"].as_str().unwrap_or("?")
            [..12.min(doc["workload_sha256"].as_str().unwrap_or("?").len())],
    );
    for e in doc["metrics"].as_array().map(Vec::as_slice).unwrap_or(&[]) {
        let side = |k: &str| e[k].as_str().unwrap_or("run").to_string();
        out.push_str(&format!(
            "{} vs {} {} c={}{}\n",
            side("side_a"),
            side("side_b"),
            e["case"].as_str().unwrap_or("?"),
            e["concurrency"],
            match (e["in_a"].as_bool(), e["in_b"].as_bool()) {
                (Some(false), _) => " (only in B)",
                (_, Some(false)) => " (only in A)",
                _ => "",
            }
        ));
        for (name, label, scale) in SHOWN {
            let m = &e["metrics"][name];
            if m.is_null() || (m["a"].is_null() && m["b"].is_null()) {
                continue;
            }
            let cell =
                |v: &Value| match (v["median"].as_f64(), v["min"].as_f64(), v["max"].as_f64()) {
                    (Some(md), Some(lo), Some(hi)) => {
                        format!("{:.2} [{:.2}-{:.2}]", md * scale, lo * scale, hi * scale)
                    }
                    _ => "-".into(),
                };
            let rel = m["relative_delta"]
                .as_f64()
                .map_or("-".into(), |r| format!("{:+.1} %", r * 100.0));
            out.push_str(&format!(
                "  {label:<12} A {:<26} B {:<26} {rel}\n",
                cell(&m["a"]),
                cell(&m["b"])
            ));
        }
    }
    out
}
