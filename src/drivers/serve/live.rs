//! serve's live counters: running counts by outcome, and the current interval's latencies
//! for the line printed on stderr every `--stats-seconds`.

use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::model::Outcome;

/// Counters updated as each row is built: a short, uncontended lock per request (no task,
/// no channel on the forwarding path), never held across an await.
#[derive(Debug, Default)]
pub(super) struct LiveCounters(Mutex<Live>);

#[derive(Debug, Default)]
struct Live {
    requests: u64,
    by_outcome: BTreeMap<Outcome, u64>,
    window: Vec<i64>,
    window_n: u64,
}

/// Requests so far, requests this interval, the interval's successful latencies, and the
/// failures so far as `outcome=n`.
pub(super) type Interval = (u64, u64, Vec<i64>, Vec<String>);

impl LiveCounters {
    /// Count a finished exchange; `window`: keep its latency for the live line.
    pub(super) fn count(&self, outcome: Outcome, total_us: Option<i64>, window: bool) {
        if let Ok(mut live) = self.0.lock() {
            live.requests += 1;
            *live.by_outcome.entry(outcome).or_insert(0) += 1;
            if window {
                live.window_n += 1;
                if outcome == Outcome::Ok
                    && let Some(t) = total_us
                {
                    live.window.push(t);
                }
            }
        }
    }

    /// Requests so far, and how many of each outcome.
    pub(super) fn totals(&self) -> (u64, BTreeMap<Outcome, u64>) {
        self.0
            .lock()
            .map(|l| (l.requests, l.by_outcome.clone()))
            .unwrap_or_default()
    }

    pub(super) fn take_interval(&self) -> Option<Interval> {
        let mut live = self.0.lock().ok()?;
        let errors: Vec<String> = live
            .by_outcome
            .iter()
            .filter(|(o, _)| **o != Outcome::Ok)
            .map(|(o, n)| format!("{}={n}", o.as_str()))
            .collect();
        let n = std::mem::take(&mut live.window_n);
        Some((live.requests, n, std::mem::take(&mut live.window), errors))
    }
}
