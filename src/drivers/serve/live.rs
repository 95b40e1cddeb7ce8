//! serve's live line, printed on stderr every `--stats-seconds`: requests so far and this
//! interval and the failures so far by outcome, read from the run's `Telemetry` (the one
//! live count of each exchange, on relaxed atomics), and the interval's successful
//! latencies, sent here without a lock as each exchange ends ([`Latencies`]) and taken by
//! the line's task ([`Window`]). Imports nothing else from serve.

use std::collections::BTreeMap;

use tokio::sync::mpsc;

use crate::model::Outcome;

/// Where each successful exchange's `total_us` goes while the live line is printed: a
/// lock-free queue (no lock; its blocks of 32 slots are reused once read).
pub(super) struct Latencies(mpsc::UnboundedSender<i64>);

impl Latencies {
    /// Keep one successful exchange's latency for the current interval.
    pub(super) fn keep(&self, total_us: i64) {
        // The line's task has stopped (serve is ending): nobody reads it.
        let _ = self.0.send(total_us);
    }
}

/// The live line's side: the latencies sent since its last interval, and the request
/// count it last saw.
pub(super) struct Window {
    latencies: mpsc::UnboundedReceiver<i64>,
    seen: u64,
}

/// A queue of latencies and the window that takes them.
pub(super) fn window() -> (Latencies, Window) {
    let (tx, rx) = mpsc::unbounded_channel();
    (
        Latencies(tx),
        Window {
            latencies: rx,
            seen: 0,
        },
    )
}

/// One interval of the live line.
pub(super) struct Interval {
    /// Requests so far.
    pub(super) requests: u64,
    /// Requests ended since the last interval.
    pub(super) ended: u64,
    /// The interval's successful latencies (µs).
    pub(super) latencies: Vec<i64>,
    /// The failures so far, as `outcome=n`.
    pub(super) errors: Vec<String>,
}

impl Window {
    /// The interval since the last call, given the counts so far (`requests` and how many
    /// of each outcome).
    pub(super) fn take(&mut self, requests: u64, by_outcome: &BTreeMap<Outcome, u64>) -> Interval {
        let mut latencies = Vec::new();
        while let Ok(us) = self.latencies.try_recv() {
            latencies.push(us);
        }
        let errors = by_outcome
            .iter()
            .filter(|(o, _)| **o != Outcome::Ok)
            .map(|(o, n)| format!("{}={n}", o.as_str()))
            .collect();
        let ended = requests.saturating_sub(self.seen);
        self.seen = requests;
        Interval {
            requests,
            ended,
            latencies,
            errors,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_interval_has_the_latencies_and_requests_since_the_last() {
        let (tx, mut w) = window();
        tx.keep(1_000);
        tx.keep(3_000);
        let by = BTreeMap::from([(Outcome::Ok, 2), (Outcome::Timeout, 1)]);
        let i = w.take(3, &by);
        assert_eq!(
            (i.requests, i.ended, i.latencies, i.errors),
            (3, 3, vec![1_000, 3_000], vec!["timeout=1".to_string()])
        );
        tx.keep(2_000);
        let i = w.take(5, &by);
        assert_eq!((i.requests, i.ended, i.latencies), (5, 2, vec![2_000]));
    }
}
