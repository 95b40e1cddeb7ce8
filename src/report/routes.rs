//! serve's end-of-run view by route: method + path, then the worker's status class, each
//! with counts, latency percentiles and, for event streams, TTFT / ITL / tokens per second.
//! Clients send probes between generation requests (`GET /health`, `HEAD /`, `GET
//! /metrics` answered 404); grouped apart, a probe never blends into generation latency.
//! Built from the recorded rows at the end of a run, so the proxy keeps no per-request
//! state while it serves. Arithmetic is `metrics`'; this module only groups.

use std::collections::{BTreeMap, BTreeSet};

use super::doc::Pct;
use super::doc::summary::{RouteDoc, RouteStreamDoc};
use crate::metrics::{self, Percentiles, Sample};
use crate::model::Outcome;

/// Distinct routes kept apart; the rest are grouped as [`OTHER`] (a client sending a new
/// path every time must not grow the summary without bound).
pub(crate) const MAX_ROUTES: usize = 32;
/// The route of every request past the first [`MAX_ROUTES`] distinct ones.
pub(crate) const OTHER: &str = "other";

/// One group: a route and the worker's status class.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct RouteKey {
    /// `METHOD /path` (the path as forwarded, without the query), or [`OTHER`].
    pub(crate) route: String,
    /// `2xx`, `4xx`, ..., or `none` when no response head came from the worker (the
    /// client then got the proxy's 502 / 503 / 504).
    pub(crate) status_class: String,
}

/// What a group keeps of its rows: only the values its percentiles and means need (every
/// inter-token gap, for pooled ITL, is the largest part).
#[derive(Debug, Default)]
struct Acc {
    requests: u64,
    successful: u64,
    failures: BTreeMap<Outcome, u64>,
    totals_us: Vec<i64>,
    streams: u64,
    ttft_us: Vec<i64>,
    gaps_us: Vec<i64>,
    output_tokens: i64,
    tokens_per_second: Vec<f64>,
}

impl Acc {
    fn add_ok(&mut self, s: Sample) {
        self.successful += 1;
        self.totals_us.extend(s.total_us);
        let Some(st) = s.stream else { return };
        self.streams += 1;
        self.ttft_us.extend(st.ttft_us);
        self.gaps_us.extend(st.gaps_us);
        self.output_tokens += st.output_tokens.unwrap_or(0);
        self.tokens_per_second.extend(metrics::decode_rate(
            s.total_us,
            st.ttft_us,
            st.output_tokens,
        ));
    }
}

/// A group's event-stream numbers, over its `ok` streams.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RouteStream {
    pub(crate) requests: u64,
    pub(crate) ttft_us: Percentiles,
    /// Pooled over every gap of every stream, as in a round.
    pub(crate) itl_us: Percentiles,
    pub(crate) output_tokens: i64,
    /// Mean over streams of `output_tokens / (total - ttft)`.
    pub(crate) output_tokens_per_second_mean: Option<f64>,
}

/// Rows grouped by route and status class, as they are read back.
#[derive(Debug, Default)]
pub(crate) struct RouteTable {
    routes: BTreeSet<String>,
    groups: BTreeMap<RouteKey, Acc>,
}

/// The numbers of one group.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RouteGroup {
    pub(crate) key: RouteKey,
    pub(crate) requests: u64,
    pub(crate) successful: u64,
    pub(crate) failures: BTreeMap<Outcome, u64>,
    /// Nearest rank of `total_us` over the group's `ok` exchanges.
    pub(crate) latency_us: Percentiles,
    /// Over the group's `ok` event streams (`None`: none); no aggregate rate (a group
    /// has no elapsed time of its own).
    pub(crate) stream: Option<RouteStream>,
}

fn status_class(status: Option<i32>) -> String {
    match status {
        Some(s) => format!("{}xx", s / 100),
        None => "none".into(),
    }
}

impl RouteTable {
    /// Count one exchange.
    pub(crate) fn add(&mut self, method: &str, url: &str, status: Option<i32>, sample: Sample) {
        let mut route = format!("{method} {}", crate::model::url_path(url));
        if !self.routes.contains(&route) {
            if self.routes.len() < MAX_ROUTES {
                self.routes.insert(route.clone());
            } else {
                route = OTHER.to_string();
            }
        }
        let key = RouteKey {
            route,
            status_class: status_class(status),
        };
        let acc = self.groups.entry(key).or_default();
        acc.requests += 1;
        if sample.outcome == Outcome::Ok {
            acc.add_ok(sample);
        } else {
            *acc.failures.entry(sample.outcome).or_insert(0) += 1;
        }
    }

    /// Every group, the busiest first (`other` last), and the latency percentiles of all
    /// successful exchanges together.
    /// The groups, and every ok exchange's latency and every ok stream's TTFT pooled.
    pub(crate) fn finish(self) -> (Vec<RouteGroup>, Percentiles, Percentiles) {
        let mut all_ok = Vec::new();
        let mut all_ttft = Vec::new();
        let mut groups: Vec<RouteGroup> = self
            .groups
            .into_iter()
            .map(|(key, acc)| {
                all_ok.extend_from_slice(&acc.totals_us);
                all_ttft.extend_from_slice(&acc.ttft_us);
                let stream = (acc.streams > 0).then(|| RouteStream {
                    requests: acc.streams,
                    ttft_us: Percentiles::of(acc.ttft_us),
                    itl_us: Percentiles::of(acc.gaps_us),
                    output_tokens: acc.output_tokens,
                    output_tokens_per_second_mean: metrics::mean(&acc.tokens_per_second),
                });
                RouteGroup {
                    key,
                    requests: acc.requests,
                    successful: acc.successful,
                    failures: acc.failures,
                    latency_us: Percentiles::of(acc.totals_us),
                    stream,
                }
            })
            .collect();
        groups.sort_by(|a, b| {
            (a.key.route == OTHER)
                .cmp(&(b.key.route == OTHER))
                .then(b.requests.cmp(&a.requests))
                .then(a.key.cmp(&b.key))
        });
        (groups, Percentiles::of(all_ok), Percentiles::of(all_ttft))
    }
}

/// summary.json's `routes`.
pub(crate) fn route_docs(groups: &[RouteGroup]) -> Vec<RouteDoc> {
    groups
        .iter()
        .map(|g| RouteDoc {
            route: g.key.route.clone(),
            status_class: g.key.status_class.clone(),
            requests: g.requests,
            successful_requests: g.successful,
            failures: g.failures.clone(),
            successful_latency_seconds: Pct::of(&g.latency_us),
            stream: g.stream.as_ref().map(|st| RouteStreamDoc {
                requests: st.requests,
                ttft_seconds: Pct::of(&st.ttft_us),
                itl_seconds: Pct::of(&st.itl_us),
                output_tokens: st.output_tokens,
                output_tokens_per_second_mean: st.output_tokens_per_second_mean,
            }),
        })
        .collect()
}

fn ms(us: Option<i64>) -> String {
    us.map_or_else(|| "-".into(), |v| format!("{:.1} ms", v as f64 / 1e3))
}

/// One line per group for the end of a serve run.
pub(crate) fn route_lines(groups: &[RouteGroup]) -> Vec<String> {
    groups
        .iter()
        .map(|g| {
            let mut line = format!(
                "  {} [{}]: {} request{}, {} ok",
                g.key.route,
                g.key.status_class,
                g.requests,
                if g.requests == 1 { "" } else { "s" },
                g.successful
            );
            for (o, n) in &g.failures {
                line.push_str(&format!(", {n} {}", o.as_str()));
            }
            if g.successful > 0 {
                line.push_str(&format!(
                    "; latency p50 {} p99 {}",
                    ms(g.latency_us.p50),
                    ms(g.latency_us.p99)
                ));
            }
            if let Some(st) = &g.stream {
                line.push_str(&format!(
                    "; TTFT p50 {}, ITL p50 {}",
                    ms(st.ttft_us.p50),
                    ms(st.itl_us.p50)
                ));
                if let Some(r) = st.output_tokens_per_second_mean {
                    line.push_str(&format!(", {r:.1} tok/s per request"));
                }
            }
            line
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(outcome: Outcome, total_us: i64) -> Sample {
        Sample {
            outcome,
            total_us: Some(total_us),
            ..Sample::default()
        }
    }

    #[test]
    fn probes_are_grouped_apart_from_generation() {
        let mut t = RouteTable::default();
        for i in 0..10 {
            t.add(
                "POST",
                "http://w:8000/v1/chat/completions?x=1",
                Some(200),
                s(Outcome::Ok, 100_000 + i),
            );
        }
        t.add("GET", "http://w:8000/health", Some(200), s(Outcome::Ok, 50));
        t.add("GET", "http://w:8000/health", Some(200), s(Outcome::Ok, 70));
        t.add(
            "GET",
            "http://w:8000/metrics",
            Some(404),
            s(Outcome::Ok, 40),
        );
        t.add(
            "HEAD",
            "http://w:8000?next=/a/b",
            Some(200),
            s(Outcome::Ok, 30),
        );
        t.add(
            "POST",
            "http://w:8000/v1/chat/completions",
            None,
            s(Outcome::Transport, 5),
        );
        let (groups, all, _) = t.finish();
        let keys: Vec<(String, String, u64)> = groups
            .iter()
            .map(|g| (g.key.route.clone(), g.key.status_class.clone(), g.requests))
            .collect();
        assert_eq!(
            keys,
            vec![
                ("POST /v1/chat/completions".into(), "2xx".into(), 10),
                ("GET /health".into(), "2xx".into(), 2),
                ("GET /metrics".into(), "4xx".into(), 1),
                ("HEAD /".into(), "2xx".into(), 1),
                ("POST /v1/chat/completions".into(), "none".into(), 1),
            ]
        );
        assert_eq!(groups[0].latency_us.p50, Some(100_004));
        assert_eq!(groups[1].latency_us.p99, Some(70));
        assert_eq!(groups[4].successful, 0);
        assert_eq!(
            groups[4].failures,
            BTreeMap::from([(Outcome::Transport, 1)])
        );
        // Overall, the probes pull the median down: that is why they are kept apart.
        assert_eq!(all.p50, Some(100_002));
        let lines = route_lines(&groups);
        assert_eq!(
            lines[0],
            "  POST /v1/chat/completions [2xx]: 10 requests, 10 ok; latency p50 100.0 ms p99 100.0 ms"
        );
        assert_eq!(
            lines[4],
            "  POST /v1/chat/completions [none]: 1 request, 0 ok, 1 transport"
        );
    }

    #[test]
    fn distinct_routes_are_capped_with_an_other_bucket() {
        let mut t = RouteTable::default();
        for i in 0..(MAX_ROUTES + 10) {
            t.add(
                "GET",
                &format!("http://w/p{i}"),
                Some(200),
                s(Outcome::Ok, 1),
            );
        }
        t.add("GET", "http://w/p0", Some(200), s(Outcome::Ok, 1));
        let (groups, _, _) = t.finish();
        assert_eq!(groups.len(), MAX_ROUTES + 1);
        let last = groups.last().unwrap();
        assert_eq!((last.key.route.as_str(), last.requests), (OTHER, 10));
        assert_eq!(groups[0].key.route, "GET /p0");
        assert_eq!(groups[0].requests, 2);
    }
}
