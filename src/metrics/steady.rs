//! The steady-state interior window of a closed-loop round.

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SteadyState {
    pub(crate) available: bool,
    pub(crate) reason: Option<String>,
    /// Window bounds on the run's clock (µs), and what it holds.
    pub(crate) start_us: Option<i64>,
    pub(crate) end_us: Option<i64>,
    pub(crate) requests: Option<u64>,
    pub(crate) requests_per_second: Option<f64>,
    /// Decisions of the window's members, and per second over the same window.
    pub(crate) decisions: Option<u64>,
    pub(crate) decisions_per_second: Option<f64>,
}

impl SteadyState {
    pub(super) fn unavailable(reason: impl Into<String>) -> SteadyState {
        SteadyState {
            available: false,
            reason: Some(reason.into()),
            start_us: None,
            end_us: None,
            requests: None,
            requests_per_second: None,
            decisions: None,
            decisions_per_second: None,
        }
    }
}

/// One successful completion, as the steady-state window sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Completion {
    /// Completion time on the run's clock (µs).
    pub(crate) at_us: i64,
    /// Breaks ties between equal times.
    pub(crate) exchange_id: i64,
    pub(crate) decisions: u64,
}

/// The interior window of a round: completions sorted (ties broken by exchange id), the
/// first and last `c` dropped. Its members are sorted positions `c ..= n-c-1`; it runs
/// from completion `c` (position `c-1`) to completion `n-c` (position `n-c-1`).
pub(crate) fn steady_state(
    completions: &[Completion],
    concurrency: usize,
    complete: bool,
) -> SteadyState {
    let n = completions.len();
    let c = concurrency;
    if !complete {
        return SteadyState::unavailable("round incomplete");
    }
    if n <= 2 * c {
        return SteadyState::unavailable(format!(
            "needs more than 2 x concurrency completions (n = {n}, c = {c})"
        ));
    }
    let mut sorted = completions.to_vec();
    sorted.sort_unstable();
    let start = sorted[c - 1].at_us;
    let end = sorted[n - c - 1].at_us;
    let requests = (n - 2 * c) as u64;
    if end <= start {
        return SteadyState::unavailable("window has zero length");
    }
    let decisions: u64 = sorted[c..n - c].iter().map(|x| x.decisions).sum();
    let secs = (end - start) as f64 / 1e6;
    SteadyState {
        available: true,
        reason: None,
        start_us: Some(start),
        end_us: Some(end),
        requests: Some(requests),
        requests_per_second: Some(requests as f64 / secs),
        decisions: Some(decisions),
        decisions_per_second: Some(decisions as f64 / secs),
    }
}
