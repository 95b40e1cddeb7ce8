//! A plan's `cases`: each case's method, path, headers and expected status, its
//! `variants` (or its one request), each request's body and content type, and its oracle
//! handed to `oracle_spec.rs` with the ignore paths the request inherits.

use std::collections::HashSet;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method};
use serde_json::{Map, Value};

use super::json::{ENGINE_HEADERS, REQUEST_FIELDS, Validator, join};
use super::oracle_spec::Inherited;
use super::plan::{Case, Variant};
use crate::model::Endpoint;
use crate::oracle::{Pointer, json_kind};

/// What both a case and a variant have besides their request.
const NAMED_FIELDS: &[&str] = &["name", "ignore_paths"];
/// What only a case has.
const CASE_FIELDS: &[&str] = &["variants", "method", "path", "headers", "expected_status"];

impl Validator {
    pub(super) fn cases(
        &mut self,
        v: Option<&Value>,
        endpoint: Option<&Endpoint>,
        top_ignore: &[Pointer],
    ) -> Option<Vec<Case>> {
        let Some(v) = v else {
            self.err("cases", "is required: a non-empty list of cases");
            return None;
        };
        let Value::Array(items) = v else {
            self.err(
                "cases",
                format!("must be a non-empty list, found {}", json_kind(v)),
            );
            return None;
        };
        if items.is_empty() {
            self.err("cases", "must not be empty");
            return None;
        }
        let mut names = HashSet::new();
        let mut out = Vec::new();
        let mut ok = true;
        for (i, item) in items.iter().enumerate() {
            let path = format!("cases[{i}]");
            match self.case(item, &path, endpoint, top_ignore) {
                Some(c) => out.push(c),
                None => ok = false,
            }
            if let Some(name) = item.get("name").and_then(Value::as_str)
                && !names.insert(name.to_string())
            {
                self.err(
                    format!("{path}.name"),
                    format!("case name '{name}' is used more than once"),
                );
                ok = false;
            }
        }
        ok.then_some(out)
    }

    pub(super) fn case(
        &mut self,
        v: &Value,
        path: &str,
        endpoint: Option<&Endpoint>,
        top_ignore: &[Pointer],
    ) -> Option<Case> {
        let m = self.object(v, path)?;
        let sessions = Validator::session_case_fields();
        self.unknown_fields(
            m,
            path,
            &[NAMED_FIELDS, REQUEST_FIELDS, CASE_FIELDS, sessions],
        );
        let name = match m.get("name") {
            None => {
                self.err(join(path, "name"), "is required");
                None
            }
            Some(n) => self.nonblank(n, &join(path, "name")).map(str::to_string),
        };
        let method = self.method(m.get("method"), &join(path, "method"));
        let case_path = self.target(m.get("path"), &join(path, "path"));
        let headers = self.headers(m.get("headers"), &join(path, "headers"));
        let expected_status = match m.get("expected_status") {
            None => Some(200),
            Some(v) => {
                let p = join(path, "expected_status");
                self.integer(v, &p, 100).and_then(|s| {
                    if s <= 599 {
                        Some(s as u16)
                    } else {
                        self.err(&p, format!("{s} is not an HTTP status (100..=599)"));
                        None
                    }
                })
            }
        };
        let no_body = matches!(method, Some(ref m) if m == Method::GET || m == Method::HEAD);
        let case_ignore = match m.get("ignore_paths") {
            None => Some(Vec::new()),
            Some(v) => self.pointers(v, &join(path, "ignore_paths")),
        };

        let inherited = Inherited {
            top: top_ignore,
            case: case_ignore.as_deref().unwrap_or(&[]),
            case_name: name.as_deref().unwrap_or("?"),
        };
        let mut sessions = None;
        let variants = match m.get("variants") {
            _ if m.contains_key("sessions") => self
                .session_case(m, path, inherited)
                .map(|(variants, s)| {
                    sessions = Some(std::sync::Arc::new(s));
                    variants
                })
                .filter(|_| case_ignore.is_some()),
            Some(vs) => {
                for &key in REQUEST_FIELDS {
                    if m.contains_key(key) {
                        self.err(
                            join(path, key),
                            "a case with variants takes its requests and oracles from the variants; move this field into each variant",
                        );
                    }
                }
                self.variants(vs, &join(path, "variants"), no_body, inherited)
                    .filter(|_| case_ignore.is_some())
            }
            None => self
                .variant_body(m, path, None, no_body, inherited)
                .map(|v| vec![v]),
        };

        let case_path = case_path?;
        let endpoint = endpoint.map(|e| case_path.as_ref().map_or(e.clone(), |p| e.with_path(p)));
        Some(Case {
            name: name?,
            method: method?,
            endpoint: endpoint?,
            path: case_path,
            headers: headers?,
            expected_status: expected_status?,
            variants: variants?,
            sessions,
        })
    }

    /// A case's `method`: an upper-case token, POST when absent.
    pub(super) fn method(&mut self, v: Option<&Value>, p: &str) -> Option<Method> {
        let Some(v) = v else {
            return Some(Method::POST);
        };
        let s = self.string(v, p)?;
        let upper = s.chars().all(|c| c.is_ascii_uppercase());
        match Method::from_bytes(s.as_bytes()) {
            Ok(m) if upper && !s.is_empty() => Some(m),
            _ => {
                self.err(p, format!("'{s}' is not an upper-case HTTP method token"));
                None
            }
        }
    }

    /// A case's `path`: an origin-form target; `Some(None)` when absent.
    pub(super) fn target(&mut self, v: Option<&Value>, p: &str) -> Option<Option<String>> {
        let Some(v) = v else { return Some(None) };
        let s = self.string(v, p)?;
        let valid =
            s.starts_with('/') && !s.contains('#') && s.parse::<http::uri::PathAndQuery>().is_ok();
        let redaction = crate::redact::Redaction::default();
        if valid && redaction.has_secret_query(s) {
            self.err(
                p,
                format!(
                    "'{}' carries a secret query parameter ({}), and the plan is copied into every run directory; use auth.bearer_token_env for a bearer token",
                    redaction.url(s),
                    crate::redact::DEFAULT_REDACT_QUERY.join(", ")
                ),
            );
            None
        } else if valid {
            Some(Some(s.to_string()))
        } else {
            self.err(
                p,
                format!("'{s}' must be an origin-form target starting with '/' (no fragment)"),
            );
            None
        }
    }

    pub(super) fn variants(
        &mut self,
        v: &Value,
        path: &str,
        no_body: bool,
        inherited: Inherited<'_>,
    ) -> Option<Vec<Variant>> {
        let Value::Array(items) = v else {
            self.err(
                path,
                format!("must be a non-empty list, found {}", json_kind(v)),
            );
            return None;
        };
        if items.is_empty() {
            self.err(
                path,
                "must not be empty (leave it out for a case with one request)",
            );
            return None;
        }
        let mut out = Vec::new();
        let mut names = HashSet::new();
        let mut ok = true;
        for (i, item) in items.iter().enumerate() {
            let p = format!("{path}[{i}]");
            let Some(m) = self.object(item, &p) else {
                ok = false;
                continue;
            };
            self.unknown_fields(m, &p, &[NAMED_FIELDS, REQUEST_FIELDS]);
            let name = match m.get("name") {
                None => {
                    self.err(join(&p, "name"), "is required");
                    None
                }
                Some(n) => self.nonblank(n, &join(&p, "name")).map(str::to_string),
            };
            if let Some(n) = &name
                && !names.insert(n.clone())
            {
                self.err(
                    join(&p, "name"),
                    format!("variant name '{n}' is used more than once in this case"),
                );
                ok = false;
            }
            let own_ignore = match m.get("ignore_paths") {
                None => Some(Vec::new()),
                Some(v) => self.pointers(v, &join(&p, "ignore_paths")),
            };
            match (
                name,
                own_ignore,
                self.variant_body(m, &p, None, no_body, inherited),
            ) {
                (Some(n), Some(own), Some(mut var)) => {
                    var.name = Some(n);
                    for p in &own {
                        if !var.ignore_paths.contains(p) {
                            var.ignore_paths.push(p.clone());
                        }
                    }
                    if !own.is_empty()
                        && let Err(msgs) = var.oracle.add_ignore_paths(own)
                    {
                        for msg in msgs {
                            self.err(join(&p, "ignore_paths"), msg);
                        }
                        ok = false;
                    }
                    out.push(var);
                }
                _ => ok = false,
            }
        }
        ok.then_some(out)
    }

    /// The request and oracle fields of a case without variants, or of one variant.
    pub(super) fn variant_body(
        &mut self,
        m: &Map<String, Value>,
        path: &str,
        name: Option<String>,
        no_body: bool,
        inherited: Inherited<'_>,
    ) -> Option<Variant> {
        let mut ok = true;
        let (body, default_ct) = match (m.get("request"), m.get("request_text")) {
            (Some(_), Some(_)) => {
                self.err(
                    join(path, "request_text"),
                    "give either request (JSON) or request_text (raw text), not both",
                );
                (None, None)
            }
            (Some(req), None) => (
                serde_json::to_vec(req).ok().map(Bytes::from),
                Some("application/json"),
            ),
            (None, Some(t)) => (
                self.string(t, &join(path, "request_text"))
                    .map(|s| Bytes::copy_from_slice(s.as_bytes())),
                Some("text/plain; charset=utf-8"),
            ),
            (None, None) if no_body => (Some(Bytes::new()), None),
            (None, None) => {
                self.err(
                    join(path, "request"),
                    "is required: the JSON body to send (or request_text for a raw body)",
                );
                (None, None)
            }
        };
        if no_body && body.as_ref().is_some_and(|b| !b.is_empty()) {
            self.err(join(path, "request"), "a GET or HEAD case sends no body");
            ok = false;
        }
        let content_type = match m.get("content_type") {
            None => Some(default_ct.map(HeaderValue::from_static)),
            Some(v) => {
                let p = join(path, "content_type");
                self.nonblank(v, &p)
                    .and_then(|s| match HeaderValue::from_str(s) {
                        Ok(h) => Some(Some(h)),
                        Err(_) => {
                            self.err(&p, "is not a valid header value");
                            None
                        }
                    })
            }
        };
        let (oracle, oracle_ok) = self.oracle(m, path, inherited);
        ok &= oracle_ok;
        let prompt_tokens = match m.get("prompt_tokens") {
            None => Some(None),
            Some(v) => self
                .integer(v, &join(path, "prompt_tokens"), 1)
                .map(|n| Some(n as u64)),
        };
        if !ok {
            return None;
        }
        Some(Variant {
            name,
            body: body?,
            content_type: content_type?,
            oracle: oracle?,
            prompt_tokens: prompt_tokens?,
            ignore_paths: inherited
                .top
                .iter()
                .chain(inherited.case)
                .cloned()
                .collect(),
        })
    }

    pub(super) fn headers(
        &mut self,
        v: Option<&Value>,
        path: &str,
    ) -> Option<Vec<(HeaderName, HeaderValue)>> {
        let Some(v) = v else { return Some(Vec::new()) };
        let m = self.object(v, path)?;
        let mut out = Vec::new();
        let mut ok = true;
        for (k, val) in m {
            let p = format!("{path}.{k}");
            let Ok(name) = HeaderName::from_bytes(k.as_bytes()) else {
                self.err(&p, "is not a valid header name");
                ok = false;
                continue;
            };
            if crate::redact::DEFAULT_REDACT_HEADERS.contains(&name.as_str()) {
                self.err(
                    &p,
                    "carries a secret, and the plan is copied into every run directory; use auth.bearer_token_env (or --bearer-token-env) for a bearer token",
                );
                ok = false;
                continue;
            }
            if ENGINE_HEADERS.contains(&name.as_str()) {
                self.err(
                    &p,
                    "is set by the engine (use the case's content_type field for Content-Type)",
                );
                ok = false;
                continue;
            }
            let Some(s) = self.string(val, &p) else {
                ok = false;
                continue;
            };
            match HeaderValue::from_str(s) {
                Ok(hv) if s.bytes().all(|b| (0x20..0x7f).contains(&b)) => out.push((name, hv)),
                _ => {
                    self.err(&p, "must be printable ASCII");
                    ok = false;
                }
            }
        }
        ok.then_some(out)
    }
}
