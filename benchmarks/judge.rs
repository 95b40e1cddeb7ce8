//! What judging an answer costs: 10,000 distinct JSON chat answers judged by an exact
//! oracle (`expected_response`, `/id` ignored), a schema of their content
//! (`expected_schema`) and a tool-call contract (`expected_tool_calls`, arguments held to
//! the tool's parameters), interleaved over 5 rounds, in this process's CPU per answer.
//! Judging runs after an answer's last byte is stamped, off the measured path; this says
//! what it costs a generator's core. `cargo bench --bench judge`.

use matrix_proxy::bench::{JudgeKind, judge};

const ANSWERS: usize = 10_000;
const ROUNDS: usize = 5;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let kinds = [
        ("exact (expected_response)", JudgeKind::Exact),
        ("schema (expected_schema)", JudgeKind::Schema),
        ("tool calls (expected_tool_calls)", JudgeKind::ToolCalls),
    ];
    let mut per_answer: Vec<Vec<f64>> = vec![Vec::new(); kinds.len()];
    for _ in 0..ROUNDS {
        for (i, (name, kind)) in kinds.iter().enumerate() {
            let Some(j) = judge(*kind, ANSWERS) else {
                eprintln!("{name}: the oracle could not be built");
                std::process::exit(1);
            };
            if j.passed != ANSWERS {
                eprintln!(
                    "{name}: {} of {ANSWERS} answers passed, expected all",
                    j.passed
                );
                std::process::exit(1);
            }
            per_answer[i].push(j.cpu_ns as f64 / ANSWERS as f64 / 1000.0);
        }
    }
    let exact = median(per_answer[0].clone());
    println!(
        "oracle                              CPU µs/answer (median of {ROUNDS})  range          x exact"
    );
    for ((name, _), v) in kinds.iter().zip(per_answer) {
        let (lo, hi) = (
            v.iter().copied().fold(f64::INFINITY, f64::min),
            v.iter().copied().fold(0.0, f64::max),
        );
        let m = median(v);
        println!(
            "{name:<36}{m:>10.2}                      {lo:>6.2}-{hi:<6.2}   {:>6.2}",
            m / exact
        );
    }
    println!(
        "{ANSWERS} distinct answers a round, judged in one thread; CPU is the process's (user + system)"
    );
}
