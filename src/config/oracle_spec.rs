//! A request's oracle as a plan declares it: exactly one of `expected_response`,
//! `expected_response_text`, `expected_stream_text` or `expected_events`, or a contract
//! (`expected_schema`, `expected_tool_calls`, `expected_choice`, `expected_pattern`:
//! `contract_spec.rs`), with `require_done`, `expected_usage`, `tolerance` and the ignore
//! paths the request inherits (the plan's and its case's), resolved into an [`Oracle`].

use bytes::Bytes;
use serde_json::{Map, Value};

use super::contract_spec::{CONTRACT_FIELDS, asks_stream};
use super::json::{Validator, join};
use crate::oracle::{EventExpect, Oracle, Pointer, StreamOracle, json_kind};

/// The fields that hold a request's oracle (exactly one per request).
const ORACLE_FIELDS: &[&str] = &[
    "expected_response",
    "expected_response_text",
    "expected_stream_text",
    "expected_events",
    "expected_schema",
    "expected_tool_calls",
    "expected_choice",
    "expected_pattern",
];

/// The ignore paths a request inherits: the plan's top-level list and its case's, with
/// the case's name for messages.
#[derive(Clone, Copy)]
pub(super) struct Inherited<'a> {
    pub(super) top: &'a [Pointer],
    pub(super) case: &'a [Pointer],
    pub(super) case_name: &'a str,
}

impl Validator {
    /// The one oracle of a request (`expected_response`, `expected_response_text`, or a
    /// streaming oracle), with the rules that tie it to `expected_usage`, `ignore_paths`
    /// and a streaming request. The flag is false when a rule failed even if an oracle
    /// was built.
    pub(super) fn oracle(
        &mut self,
        m: &Map<String, Value>,
        path: &str,
        inherited: Inherited<'_>,
    ) -> (Option<Oracle>, bool) {
        let mut ok = true;
        let inherited_ignore = inherited.case;
        let primaries: Vec<&str> = ORACLE_FIELDS
            .iter()
            .copied()
            .filter(|k| m.contains_key(*k))
            .collect();
        let has_ignore = !inherited_ignore.is_empty() || m.contains_key("ignore_paths");
        let streaming = primaries
            .iter()
            .any(|k| matches!(*k, "expected_stream_text" | "expected_events"));
        ok &= self.require_done(
            m.get("require_done"),
            &join(path, "require_done"),
            streaming,
        );
        if m.contains_key("expected_usage")
            && !primaries
                .iter()
                .any(|k| matches!(*k, "expected_stream_text" | "expected_events"))
        {
            self.err(
                join(path, "expected_usage"),
                "goes with a streaming oracle: expected_stream_text or expected_events",
            );
            ok = false;
        }
        ok &= self.modifiers_alone(m, path);
        if !primaries.is_empty() {
            self.judged += 1;
        }
        let oracle = match primaries.as_slice() {
            // No oracle: a capture plan's request (its answers are recorded, not judged),
            // or a campaign's (the reference's answers are the baseline). Status and
            // transport are still judged. A plain plan may not mix the two (`walk.rs`).
            [] => {
                self.unjudged.push(path.to_string());
                Some(Oracle::Unjudged)
            }
            [_, second, ..] => {
                self.err(
                    join(path, second),
                    format!(
                        "a request has exactly one oracle: give one of {}, not {}",
                        ORACLE_FIELDS.join(", "),
                        primaries.join(" and ")
                    ),
                );
                None
            }
            ["expected_response"] => self.json_oracle(m, path, inherited_ignore).map(|mut o| {
                ok &= self.tolerance(m, path, &mut o);
                o
            }),
            [contract] if CONTRACT_FIELDS.contains(contract) => {
                if has_ignore {
                    self.err(
                        join(path, "ignore_paths"),
                        format!("ignore_paths only applies to JSON oracles (expected_response, expected_events, expected_usage); {contract} judges a contract, not a recorded answer"),
                    );
                    ok = false;
                }
                self.contract_oracle(m, path, contract)
            }
            ["expected_response_text"] => {
                let (o, rules_held) = self.bytes_oracle(m, path, inherited, has_ignore);
                ok &= rules_held;
                o
            }
            _ => self.stream_oracle(m, path, inherited_ignore),
        };
        let mut oracle = oracle;
        if let Some(o) = oracle.as_mut() {
            ok &= self.top_ignore(o, path, inherited);
        }
        if let Some(Oracle::Stream(so)) = oracle.as_mut() {
            so.require_done = m.get("require_done").and_then(Value::as_bool) == Some(true);
        }
        (oracle, ok)
    }

    /// `expected_response`: a JSON oracle, refused for a request that asks for a stream.
    fn json_oracle(
        &mut self,
        m: &Map<String, Value>,
        path: &str,
        inherited_ignore: &[Pointer],
    ) -> Option<Oracle> {
        if asks_stream(m) {
            self.err(
                join(path, "expected_response"),
                "the request asks for a stream (\"stream\": true), so the answer is an event stream, not one JSON document: use expected_stream_text (with optional expected_usage) or expected_events",
            );
            return None;
        }
        let expected = m.get("expected_response").cloned().unwrap_or(Value::Null);
        match Oracle::json(expected, inherited_ignore.to_vec()) {
            Ok(o) => Some(o),
            Err(msgs) => {
                for msg in msgs {
                    self.err(join(path, "expected_response"), msg);
                }
                None
            }
        }
    }

    /// `expected_response_text`: an exact-bytes oracle, which no ignore path (the
    /// request's, its case's or the top level's) may go with. The flag is false when such
    /// a rule failed.
    fn bytes_oracle(
        &mut self,
        m: &Map<String, Value>,
        path: &str,
        inherited: Inherited<'_>,
        has_ignore: bool,
    ) -> (Option<Oracle>, bool) {
        let mut ok = true;
        let p = join(path, "expected_response_text");
        let t = m
            .get("expected_response_text")
            .and_then(|v| self.string(v, &p));
        if has_ignore {
            self.err(
                join(path, "ignore_paths"),
                "ignore_paths only applies to JSON oracles (expected_response, expected_events, expected_usage); an exact-bytes oracle compares every byte",
            );
            ok = false;
        }
        if !inherited.top.is_empty() {
            self.err(
                "ignore_paths",
                format!(
                    "the top-level ignore_paths applies to every case's JSON oracle, but case '{}' ({path}) has an exact-bytes oracle (expected_response_text), which compares every byte; move the pointers into the cases that need them",
                    inherited.case_name
                ),
            );
            ok = false;
        }
        (
            t.map(|t| Oracle::Bytes(Bytes::copy_from_slice(t.as_bytes()))),
            ok,
        )
    }

    /// `require_done`: a boolean, with a streaming oracle only. False when a rule failed.
    pub(super) fn require_done(&mut self, v: Option<&Value>, p: &str, streaming: bool) -> bool {
        let Some(v) = v else { return true };
        if !v.is_boolean() {
            self.err(p, format!("must be true or false, found {}", json_kind(v)));
            return false;
        }
        if !streaming {
            self.err(
                p,
                "goes with a streaming oracle (expected_stream_text or expected_events): it makes a stream without data: [DONE] a correctness failure",
            );
            return false;
        }
        true
    }

    /// Add the plan's top-level ignore paths to a request's oracle; each problem names the
    /// case. False when one did not apply.
    pub(super) fn top_ignore(
        &mut self,
        o: &mut Oracle,
        path: &str,
        inherited: Inherited<'_>,
    ) -> bool {
        let Err(msgs) = o.add_top_ignore_paths(inherited.top) else {
            return true;
        };
        for msg in msgs {
            self.err(
                "ignore_paths",
                format!(
                    "{msg} of case '{}' ({path}); a top-level pointer must end at a primitive leaf of every JSON oracle (expected_response)",
                    inherited.case_name
                ),
            );
        }
        false
    }

    /// `expected_stream_text` or `expected_events`, with optional `expected_usage`.
    pub(super) fn stream_oracle(
        &mut self,
        m: &Map<String, Value>,
        path: &str,
        inherited_ignore: &[Pointer],
    ) -> Option<Oracle> {
        let mut so = StreamOracle::default();
        let mut ok = true;
        if let Some(v) = m.get("expected_stream_text") {
            so.text = self
                .string(v, &join(path, "expected_stream_text"))
                .map(str::to_string);
            ok &= so.text.is_some();
        }
        if let Some(v) = m.get("expected_events") {
            let p = join(path, "expected_events");
            match v {
                Value::Array(items) if !items.is_empty() => {
                    so.events = Some(
                        items
                            .iter()
                            .map(|e| match e {
                                Value::String(s) => EventExpect::Text(s.clone()),
                                other => EventExpect::Json(other.clone(), Default::default()),
                            })
                            .collect(),
                    );
                }
                other => {
                    self.err(
                        &p,
                        format!(
                            "must be a non-empty list of event payloads (a string is compared as raw data, anything else as JSON), found {}",
                            json_kind(other)
                        ),
                    );
                    ok = false;
                }
            }
        }
        if let Some(v) = m.get("expected_usage") {
            match v {
                Value::Object(_) => so.usage = Some((v.clone(), Default::default())),
                other => {
                    self.err(
                        join(path, "expected_usage"),
                        format!(
                            "must be an object (the stream's final usage), found {}",
                            json_kind(other)
                        ),
                    );
                    ok = false;
                }
            }
        }
        if !ok {
            return None;
        }
        let mut oracle = Oracle::Stream(Box::new(so));
        if !inherited_ignore.is_empty()
            && let Err(msgs) = oracle.add_ignore_paths(inherited_ignore.to_vec())
        {
            for msg in msgs {
                self.err(join(path, "ignore_paths"), msg);
            }
            return None;
        }
        Some(oracle)
    }
}
