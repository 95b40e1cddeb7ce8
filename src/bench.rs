//! Entry points the benchmarks in `benchmarks/` call (measurement hooks, not an API): the
//! oracle's judgment of many answers, timed in this process's CPU, so a contract oracle's
//! cost per answer can be set beside the exact oracle's (`benchmarks/judge.rs`).

use serde_json::{Value, json};

use crate::config::plan::Plan;

/// Which oracle judges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JudgeKind {
    /// `expected_response` with its volatile `/id` ignored.
    Exact,
    /// `expected_schema` on the content (structured output).
    Schema,
    /// `expected_tool_calls` against the request's tool and its parameters.
    ToolCalls,
}

/// What a judging run took: process CPU (user + system) and how many answers passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Judged {
    pub cpu_ns: u64,
    pub passed: usize,
}

/// Judge `n` distinct answers that each keep the oracle (JSON chat answers, built before
/// the clock starts) with an oracle of `kind`; `None` if the oracle cannot be built.
pub fn judge(kind: JudgeKind, n: usize) -> Option<Judged> {
    let oracle = oracle(kind)?;
    let bodies: Vec<Vec<u8>> = (0..n)
        .map(|i| answer(kind, i).to_string().into_bytes())
        .collect();
    let t0 = crate::clock::process_cpu_ns();
    let passed = bodies
        .iter()
        .filter(|b| oracle.judge_and_read(b, false, None).1.is_ok())
        .count();
    Some(Judged {
        cpu_ns: crate::clock::process_cpu_ns().saturating_sub(t0),
        passed,
    })
}

/// The parameters both the schema and the tool's arguments are held to.
fn schema() -> Value {
    json!({"type": "object", "required": ["city", "days", "tags"], "additionalProperties": false,
        "properties": {"city": {"type": "string", "pattern": "^[A-Z][a-z]+$"},
            "days": {"type": "integer", "minimum": 1, "maximum": 30},
            "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 8}}})
}

/// The document answer `i` carries.
fn document(i: usize) -> Value {
    json!({"city": "Lyon", "days": 1 + i % 30, "tags": ["rail", "food"]})
}

fn oracle(kind: JudgeKind) -> Option<crate::oracle::Oracle> {
    let request = json!({"model": "m", "messages": []});
    let case = match kind {
        JudgeKind::Exact => json!({"name": "bench", "request": request, "ignore_paths": ["/id"],
            "expected_response": answer(kind, 0)}),
        JudgeKind::Schema => json!({"name": "bench", "request": request,
            "expected_schema": schema()}),
        JudgeKind::ToolCalls => json!({"name": "bench",
            "request": {"model": "m", "messages": [], "tools": [{"type": "function",
                "function": {"name": "plan_trip", "parameters": schema()}}]},
            "expected_tool_calls": {"names": ["plan_trip"]}}),
    };
    let plan = json!({"endpoint": "http://127.0.0.1:1/v1/chat/completions", "timeout_seconds": 1,
        "concurrency": [1], "requests_per_case": 1,
        "metadata": {"gpu": "N/A", "gpu_ids": "N/A", "driver": "N/A", "cuda": "N/A",
            "precision": "N/A", "model_revision": "m", "runtime_revision": "r",
            "cache_policy": "none", "cuda_evidence": "N/A", "reservation": "N/A", "host": "h"},
        "cases": [case]});
    let p = Plan::from_json_bytes(plan.to_string().as_bytes()).ok()?;
    p.cases
        .into_iter()
        .next()?
        .variants
        .into_iter()
        .next()
        .map(|v| v.oracle)
}

/// Answer `i` as a server writes it: the document as content, or as a tool call's
/// arguments; the exact oracle's answers differ only in their `id`.
fn answer(kind: JudgeKind, i: usize) -> Value {
    let message = match kind {
        JudgeKind::Exact => json!({"role": "assistant", "content": document(0).to_string()}),
        JudgeKind::Schema => json!({"role": "assistant", "content": document(i).to_string()}),
        JudgeKind::ToolCalls => json!({"role": "assistant", "content": null, "tool_calls": [{
            "id": format!("call-{i}"), "type": "function",
            "function": {"name": "plan_trip", "arguments": document(i).to_string()}}]}),
    };
    json!({"id": format!("chatcmpl-{i}"), "object": "chat.completion", "created": 1,
        "model": "m", "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 20, "total_tokens": 32}})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_benchmarked_answer_keeps_its_oracle() {
        for kind in [JudgeKind::Exact, JudgeKind::Schema, JudgeKind::ToolCalls] {
            assert_eq!(judge(kind, 50).map(|j| j.passed), Some(50), "{kind:?}");
        }
    }
}
